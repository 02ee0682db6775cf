//! State maintenance through the server: `pi-workflows state verify`,
//! `state backup` and `state prune`, with the real CLI binary against a
//! real server (the CLI never opens the database), and the protocol
//! behaviour under them: durable receipts, a reconnect retry that keeps its
//! key, an exact retry while the work runs, disconnects, shutdown, crashes
//! and a full disk.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec};
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};
use support::*;

const DAY_MS: u64 = 24 * 60 * 60 * 1000;

fn days_ago(days: u64) -> u64 {
    server::clock::now_ms() - days * DAY_MS
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn exit(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

/// `state prune --older-than 2 --apply --backup <backup>`.
fn prune_apply(server: &TestServer, backup: &Path) -> Output {
    server.cli(&[
        "state",
        "prune",
        "--older-than",
        "2",
        "--apply",
        "--backup",
        path_text(backup),
    ])
}

fn path_text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A read-only connection to an inactive database file (a backup).
fn open_backup(path: &Path) -> Connection {
    Connection::open_with_flags(
        format!("file:{}?mode=ro&immutable=1", path.display()),
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap()
}

fn sha256_file(path: &Path) -> String {
    server::ids::digest_text(&server::ids::sha256(&std::fs::read(path).unwrap()))
}

fn runs_named(db: &Connection, prefix: &str) -> i64 {
    count(
        db,
        "SELECT COUNT(*) FROM runs WHERE run_id LIKE ?1 || '%'",
        [prefix],
    )
}

/// A completed linear run, made by the server; the server keeps running.
async fn completed_run(server: &TestServer) -> String {
    let script = write_script(
        server.scratch(),
        "linear.json",
        &json!({"workflowName": "linear", "topology": linear_topology(&["a", "b", "c"])}),
    );
    let mut client = server.client().await;
    let run = started(&mut client, &script).await;
    wait_settled(&mut client, &run).await;
    wait_quiescent_at(server).await;
    run
}

/// A state with a completed template run and `old` copies of it that
/// finished `days` days ago (younger than the sweep's 30 days, so only a
/// prune with `--older-than` below `days` selects them). Leaves the server
/// running.
async fn seeded(old: usize, days: u64, own_input_bytes: usize) -> (TestServer, String) {
    let mut server = TestServer::start();
    let template = completed_run(&server).await;
    server.stop();
    {
        let db = writable(&server.home.join("state.sqlite"));
        let runs = clone_runs(&db, &template, "old", old, days_ago(days));
        if own_input_bytes > 0 {
            give_own_inputs(&db, &runs, own_input_bytes);
        }
    }
    server.spawn().unwrap();
    (server, template)
}

fn host_commands(db: &Connection, operation: &str) -> Vec<(String, String, String)> {
    let mut statement = db
        .prepare(
            "SELECT client_id, idempotency_key, outcome FROM host_commands WHERE operation = ?1 ORDER BY created_at_ms",
        )
        .unwrap();
    statement
        .query_map([operation], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

// ---- state verify --------------------------------------------------------------

/// `state verify` runs SQLite's integrity check, the schema identity, the
/// foreign keys, every consistency check of the server's tests and the
/// orphaned-blob count; a planted problem is named; a backup verifies by
/// path, the live state never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_verify_reports_the_checks_and_names_a_planted_problem() {
    let server = TestServer::start();
    let run = completed_run(&server).await;
    let verified = server.cli(&["state", "verify"]);
    assert_eq!(
        exit(&verified),
        0,
        "{}{}",
        stdout(&verified),
        stderr(&verified)
    );
    let text = stdout(&verified);
    assert!(text.starts_with("the state: ok\n"), "{text}");
    assert!(text.contains("  integrity check: ok\n"), "{text}");
    assert!(text.contains("schema: matches this version"), "{text}");
    assert!(text.contains("orphaned blobs: 0"), "{text}");
    let json_output = server.cli(&["state", "verify", "--json"]);
    let report: Value = serde_json::from_slice(&json_output.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["problems"], 0);
    assert_eq!(report["ddlDigest"], server::store::ddl_digest());
    assert_eq!(report["schemaMatches"], true);
    let checks = report["checks"].as_array().unwrap();
    assert_eq!(checks.len(), CONSISTENCY_CHECKS.len(), "the tests' list");
    for (check, expected) in checks.iter().zip(CONSISTENCY_CHECKS) {
        assert_eq!(check["check"], expected.message);
        assert_eq!(check["violations"], 0);
    }

    // A backup verifies by path; the live state's path is refused.
    let backup = server.scratch().join("verified.sqlite");
    let backed_up = server.cli(&["state", "backup", path_text(&backup)]);
    assert_eq!(exit(&backed_up), 0, "{}", stderr(&backed_up));
    let by_path = server.cli(&["state", "verify", path_text(&backup)]);
    assert_eq!(
        exit(&by_path),
        0,
        "{}{}",
        stdout(&by_path),
        stderr(&by_path)
    );
    assert!(stdout(&by_path).starts_with("the backup: ok"));
    let live = server.home.join("state.sqlite");
    let refused = server.cli(&["state", "verify", path_text(&live)]);
    assert_eq!(exit(&refused), 1, "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("names the live state"),
        "{}",
        stderr(&refused)
    );
    let missing = server.cli(&["state", "verify", "/no/such/backup.sqlite"]);
    assert_eq!(exit(&missing), 4, "{}", stderr(&missing));
    let relative = server.cli(&["state", "verify", "backup.sqlite"]);
    assert_eq!(exit(&relative), 2, "{}", stderr(&relative));

    // Plant two problems in the live state: a completed run without its
    // event, and a blob nothing refers to.
    {
        let db = writable(&server.home.join("state.sqlite"));
        db.execute(
            "DELETE FROM events WHERE run_id = ?1 AND kind = 'completed'",
            [&run],
        )
        .unwrap();
        db.execute(
            "INSERT INTO blobs (digest, media_type, bytes, created_at_ms) VALUES (randomblob(32), 'text/plain', X'78', 0)",
            [],
        )
        .unwrap();
    }
    let failed = server.cli(&["state", "verify"]);
    assert_eq!(exit(&failed), 1);
    let text = stdout(&failed);
    assert!(text.starts_with("the state: 2 problems\n"), "{text}");
    assert!(
        text.contains("    completed run without its completed event: 1 row\n"),
        "{text}"
    );
    assert!(text.contains("orphaned blobs: 1"), "{text}");
    // The backup made before the damage still verifies.
    assert_eq!(
        exit(&server.cli(&["state", "verify", path_text(&backup)])),
        0
    );
}

// ---- state backup --------------------------------------------------------------

/// A backup is an online, verified copy at a new absolute path: it has
/// every run, passes the integrity check, and its digest is the file's. A
/// second backup to the same path is refused and the file is unchanged;
/// relative paths, missing directories and the live state are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_backup_writes_a_verified_copy_and_never_replaces_a_file() {
    let server = TestServer::start();
    let run = completed_run(&server).await;
    let backup = server.scratch().join("backup.sqlite");
    let made = server.cli(&["state", "backup", path_text(&backup), "--json"]);
    assert_eq!(exit(&made), 0, "{}", stderr(&made));
    let receipt: Value = serde_json::from_slice(&made.stdout).unwrap();
    assert_eq!(receipt["destination"], path_text(&backup));
    assert_eq!(receipt["digest"], sha256_file(&backup));
    assert_eq!(
        receipt["bytes"].as_u64().unwrap(),
        std::fs::metadata(&backup).unwrap().len()
    );
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&backup).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the backup is private");
    }
    let copy = open_backup(&backup);
    assert_eq!(
        copy.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0))
            .unwrap(),
        "ok"
    );
    assert_eq!(
        count(&copy, "SELECT COUNT(*) FROM runs WHERE run_id = ?1", [&run]),
        1
    );
    assert_state_clean(&copy);

    let before = std::fs::read(&backup).unwrap();
    let again = server.cli(&["state", "backup", path_text(&backup)]);
    assert_eq!(exit(&again), 1);
    assert!(
        stderr(&again).contains("a backup never replaces a file"),
        "{}",
        stderr(&again)
    );
    assert_eq!(
        std::fs::read(&backup).unwrap(),
        before,
        "the file is unchanged"
    );

    let relative = server.cli(&["state", "backup", "backup.sqlite"]);
    assert_eq!(exit(&relative), 2);
    assert!(
        stderr(&relative).contains("absolute path"),
        "{}",
        stderr(&relative)
    );
    let nowhere = server.cli(&["state", "backup", "/no/such/dir/backup.sqlite"]);
    assert_eq!(exit(&nowhere), 1);
    assert!(
        stderr(&nowhere).contains("directory does not exist"),
        "{}",
        stderr(&nowhere)
    );
    let live = server.home.join("state.sqlite");
    let over_live = server.cli(&["state", "backup", path_text(&live)]);
    assert_eq!(exit(&over_live), 1);
    assert!(
        stderr(&over_live).contains("live state"),
        "{}",
        stderr(&over_live)
    );
    let human = server.cli(&[
        "state",
        "backup",
        path_text(&server.scratch().join("second.sqlite")),
    ]);
    assert_eq!(exit(&human), 0);
    assert!(
        stdout(&human).starts_with(&format!(
            "backed up the state to {}",
            path_text(&server.scratch().join("second.sqlite"))
        )),
        "{}",
        stdout(&human)
    );
}

/// Each invocation sends one fresh idempotency key (and the receipt of
/// each is stored): two backups are two commands, never one adopted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_invocation_sends_one_fresh_key() {
    let server = TestServer::start();
    for name in ["one.sqlite", "two.sqlite"] {
        let made = server.cli(&["state", "backup", path_text(&server.scratch().join(name))]);
        assert_eq!(exit(&made), 0, "{}", stderr(&made));
    }
    let dry = server.cli(&["state", "prune"]);
    assert_eq!(exit(&dry), 0, "{}", stderr(&dry));
    let dry = server.cli(&["state", "prune"]);
    assert_eq!(exit(&dry), 0, "{}", stderr(&dry));
    let db = server.db();
    for operation in ["state.backup", "state.prune"] {
        let rows = host_commands(&db, operation);
        assert_eq!(rows.len(), 2, "{operation}: {rows:?}");
        assert_ne!(rows[0].1, rows[1].1, "{operation}: one key per invocation");
        assert!(rows.iter().all(|(_, _, outcome)| outcome == "accepted"));
    }
}

/// The server dies right after it stored a backup's receipt: the CLI's
/// automatic retry (same key, new request id) starts a new server and
/// adopts that receipt; the backup is made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_retry_keeps_the_key_and_adopts_the_stored_receipt() {
    let mut server = TestServer::new(&[("PI_WORKFLOWS_FAULT", "after_receipt:1")]);
    server.spawn().unwrap();
    let backup = server.scratch().join("retried.sqlite");
    let made = server.cli(&["state", "backup", path_text(&backup), "--json"]);
    assert!(
        server.wait_exit(Duration::from_secs(10)),
        "the fault killed the first server"
    );
    // The CLI started the next server itself: stop it at the end.
    let stop = || {
        let stopped = server.cli(&["server", "stop"]);
        assert_eq!(exit(&stopped), 0, "{}", stderr(&stopped));
    };
    if exit(&made) != 0 {
        stop();
        panic!(
            "the retried backup failed: {}{}",
            stdout(&made),
            stderr(&made)
        );
    }
    let receipt: Value = serde_json::from_slice(&made.stdout).unwrap();
    assert_eq!(receipt["digest"], sha256_file(&backup));
    let rows = host_commands(&server.db(), "state.backup");
    stop();
    assert_eq!(rows.len(), 1, "one stored receipt: {rows:?}");
    assert!(
        stderr(&made).contains("starting the server"),
        "{}",
        stderr(&made)
    );
}

/// A backup big enough to take a while: the first attempt's connection
/// drops at once (the work goes on), and an exact retry on a new connection
/// (same client and key, a new request id) joins it and adopts its
/// receipt; the backup is made once. Shutdown then waits for a backup in
/// flight whose client is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_retry_joins_the_running_backup_and_shutdown_waits_for_one() {
    let (mut server, _) = seeded(150, 1, 1024 * 1024).await;
    let backup = server.scratch().join("joined.sqlite");
    let key = "k-joined-backup";
    let frame = |request_id: &str, destination: &Path| {
        json!({
            "schema": "pi-workflows.client.v1", "type": "request", "requestId": request_id,
            "clientId": "maintenance-test", "operation": "state.backup", "idempotencyKey": key,
            "payload": {"destination": path_text(destination)},
        })
    };
    {
        let mut first = Client::connect(&server.socket(), "maintenance-test")
            .await
            .unwrap();
        first.send(&frame("r-first", &backup)).await.unwrap();
        wait_for(Duration::from_secs(10), "the backup to start", || {
            backup.exists().then_some(())
        })
        .await;
    }
    let db = server.db();
    assert!(
        host_commands(&db, "state.backup").is_empty(),
        "the first attempt is still running when the retry arrives"
    );
    let mut second = Client::connect(&server.socket(), "maintenance-test")
        .await
        .unwrap();
    second.send(&frame("r-second", &backup)).await.unwrap();
    let response = loop {
        let frame = second.receive().await.unwrap();
        if frame["type"] == "response" {
            break frame;
        }
    };
    assert_eq!(response["requestId"], "r-second");
    assert_eq!(response["outcome"], "adopted", "{response}");
    assert_eq!(response["receipt"]["digest"], sha256_file(&backup));
    assert_eq!(host_commands(&db, "state.backup").len(), 1);
    drop(second);

    // Shutdown waits for a backup in flight whose client is gone.
    let late = server.scratch().join("during-shutdown.sqlite");
    {
        let mut client = Client::connect(&server.socket(), "maintenance-test-2")
            .await
            .unwrap();
        let mut request = frame("r-late", &late);
        request["clientId"] = json!("maintenance-test-2");
        client.send(&request).await.unwrap();
        wait_for(
            Duration::from_secs(10),
            "the second backup to start",
            || late.exists().then_some(()),
        )
        .await;
    }
    let started = Instant::now();
    server.stop();
    let rows = host_commands(&server.db(), "state.backup");
    assert_eq!(
        rows.len(),
        2,
        "the receipt was stored before the server exited: {rows:?}"
    );
    assert_eq!(rows[1].2, "accepted");
    let copy = open_backup(&late);
    assert_eq!(
        copy.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0))
            .unwrap(),
        "ok",
        "the backup is complete (stop took {:?})",
        started.elapsed()
    );
}

// ---- state prune ---------------------------------------------------------------

/// A dry run lists what would go and its size and deletes nothing; apply
/// needs a new backup, writes and verifies it first (it holds the deleted
/// trees), then deletes exactly what the dry run listed; repeating it has
/// no further effect. Progress goes to stderr as plain lines off a terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_dry_run_lists_and_apply_backs_up_then_deletes_the_same_trees() {
    let (server, template) = seeded(5, 3, 8 * 1024).await;
    let db = server.db();
    let dry = server.cli(&["state", "prune", "--older-than", "2", "--json"]);
    assert_eq!(exit(&dry), 0, "{}", stderr(&dry));
    let listed: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(listed["applied"], false);
    assert_eq!(listed["rootRuns"], 5, "{listed}");
    assert_eq!(listed["runs"], 5);
    assert_eq!(listed["blobs"], 5, "each tree's own input");
    assert!(listed["bytes"].as_u64().unwrap() > 5 * 8 * 1024);
    let mut dry_ids: Vec<String> = listed["trees"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tree| tree["rootRunId"].as_str().unwrap().to_owned())
        .collect();
    dry_ids.sort();
    assert_eq!(
        dry_ids,
        (1..=5).map(|n| format!("old-{n:06}")).collect::<Vec<_>>()
    );
    assert_eq!(runs_named(&db, "old-"), 5, "a dry run deletes nothing");
    let human = server.cli(&["state", "prune", "--older-than", "2"]);
    let text = stdout(&human);
    assert!(
        text.starts_with("would delete 5 run trees (5 runs, 5 blobs, "),
        "{text}"
    );
    assert!(
        text.contains("ROOT RUN") && text.contains("old-000001"),
        "{text}"
    );
    assert!(
        text.contains("--older-than 2 --apply --backup"),
        "it says how to apply: {text}"
    );

    // Apply needs a backup: the CLI refuses the usage, the server the request.
    let usage = server.cli(&["state", "prune", "--apply"]);
    assert_eq!(exit(&usage), 2, "{}", stderr(&usage));
    let mut client = server.client().await;
    let refused = client
        .request(&RequestSpec::command(
            "state.prune",
            None,
            json!({"apply": true, "olderThanDays": 2}),
        ))
        .await
        .unwrap();
    assert_eq!(refused.outcome, "rejected", "{:?}", refused.frame);
    assert_eq!(refused.frame["error"]["code"], "schemaInvalid");
    // An existing backup path is refused before anything is deleted.
    let taken = server.scratch().join("taken.sqlite");
    std::fs::write(&taken, b"not yours").unwrap();
    let refused = prune_apply(&server, &taken);
    assert_eq!(exit(&refused), 1, "{}", stderr(&refused));
    assert_eq!(std::fs::read(&taken).unwrap(), b"not yours");
    assert_eq!(runs_named(&db, "old-"), 5);

    let backup = server.scratch().join("before-prune.sqlite");
    let applied = prune_apply(&server, &backup);
    assert_eq!(exit(&applied), 0, "{}", stderr(&applied));
    let text = stdout(&applied);
    assert!(
        text.starts_with(&format!("backed up the state to {}", path_text(&backup))),
        "{text}"
    );
    assert!(
        text.contains("deleted 5 run trees (5 runs, 5 blobs, "),
        "{text}"
    );
    let progress = stderr(&applied);
    for phase in ["selecting:", "backing up:", "deleting: 5 of 5 run trees"] {
        assert!(
            progress.contains(&format!("pi-workflows: state prune: {phase}")),
            "a plain progress line for {phase}: {progress}"
        );
    }
    assert_eq!(runs_named(&db, "old-"), 0);
    assert!(
        db.query_row(
            "SELECT COUNT(*) FROM runs WHERE run_id = ?1",
            [&template],
            |row| row.get::<_, i64>(0)
        )
        .unwrap()
            == 1
    );
    let copy = open_backup(&backup);
    assert_eq!(
        runs_named(&copy, "old-"),
        5,
        "the backup holds what was deleted"
    );
    assert_state_clean(&db);

    // The same prune again finds nothing more.
    let again = prune_apply(&server, &server.scratch().join("again.sqlite"));
    assert_eq!(exit(&again), 0, "{}", stderr(&again));
    assert!(
        stdout(&again).contains("deleted 0 run trees"),
        "{}",
        stdout(&again)
    );
    assert_state_clean(&db);
}

/// On a terminal the progress is a bar redrawn in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_a_bar_on_a_terminal() {
    let (server, _) = seeded(40, 3, 0).await;
    let backup = server.scratch().join("bar.sqlite");
    let binary = env!("CARGO_BIN_EXE_pi-workflows");
    let command = format!(
        "{binary} state prune --older-than 2 --apply --backup {} >/dev/null",
        path_text(&backup)
    );
    let mut script = std::process::Command::new("script");
    script.args(["-qec", &command, "/dev/null"]);
    script.env_clear();
    script.env("PATH", std::env::var("PATH").unwrap_or_default());
    script.env("HOME", server.home.parent().unwrap());
    for (key, value) in server.env() {
        script.env(key, value);
    }
    let output = script.output().expect("run script(1)");
    let drawn = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{drawn}");
    assert!(drawn.contains("\r\u{1b}[2Kstate prune: ["), "{drawn:?}");
    assert!(drawn.contains("deleting: 40 of 40 run trees"), "{drawn:?}");
    assert!(
        !drawn.contains("pi-workflows: state prune:"),
        "no plain lines: {drawn:?}"
    );
}

/// A SIGKILL during a prune, inside a tree's transaction or between two
/// trees, never leaves part of a tree or a dangling blob reference; the
/// backup it wrote first is complete, and a new prune finishes the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_prune_leaves_whole_trees() {
    for (fault, gone) in [("tree_deleted:3", 2), ("tree_committed:3", 3)] {
        let (mut server, template) = seeded(6, 3, 4096).await;
        let events = count(
            &server.db(),
            "SELECT COUNT(*) FROM events WHERE run_id = ?1",
            [&template],
        );
        server.stop();
        server.set_env("PI_WORKFLOWS_FAULT", fault);
        server.spawn().unwrap();
        let backup = server.scratch().join("first.sqlite");
        let mut client = server.client().await;
        let lost = client
            .request(&RequestSpec::command(
                "state.prune",
                None,
                json!({"apply": true, "olderThanDays": 2, "backup": path_text(&backup)}),
            ))
            .await;
        assert!(lost.is_err(), "{fault}: the server died before it answered");
        assert!(server.wait_exit(Duration::from_secs(10)), "{fault}");
        {
            let db = server.db();
            assert_eq!(runs_named(&db, "old-"), 6 - gone, "{fault}");
            assert_whole_copies(&db, "old", events);
        }
        assert_eq!(
            runs_named(&open_backup(&backup), "old-"),
            6,
            "the backup came first"
        );
        server.remove_env("PI_WORKFLOWS_FAULT");
        server.spawn().unwrap();
        let finished = prune_apply(&server, &server.scratch().join("second.sqlite"));
        assert_eq!(exit(&finished), 0, "{}", stderr(&finished));
        let db = server.db();
        assert_eq!(runs_named(&db, "old-"), 0);
        assert_state_clean(&db);
    }
}

/// A dry run of `state prune` (the default 30 days) lists exactly the trees
/// the automatic sweep then deletes: one selector, one deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_deletes_what_a_default_prune_lists() {
    let mut server = TestServer::start();
    let dir = server.scratch().to_path_buf();
    let template = completed_run(&server).await;
    let hold = write_script(
        &dir,
        "hold.json",
        &json!({"workflowName": "hold", "topology": linear_topology(&["a"]),
                "nodes": {"a": [{"awaitFile": "hold.release", "then": {"finish": {}}}]}}),
    );
    let mut client = server.client().await;
    let holding = started(&mut client, &hold).await;
    wait_view(&mut client, &holding, Duration::from_secs(20), |view| {
        view["display"]["currentNode"] == "a"
    })
    .await;
    drop(client);
    server.stop();
    {
        let db = writable(&server.home.join("state.sqlite"));
        clone_runs(&db, &template, "old", 4, days_ago(31));
        let kept = clone_runs(&db, &template, "kept", 2, days_ago(31));
        // Protected: an effect whose outcome is unknown (ambiguous).
        db.execute_batch(&format!(
            "INSERT INTO effects (effect_id, run_id, effect_type, node_path, visit, request_fingerprint, state,
                                  attempt_number, created_at_ms, updated_at_ms)
               VALUES ('effect-kept', '{run}', 'mail', 'a', 1, zeroblob(32), 'ambiguous', 1, 0, 0);
             INSERT INTO effect_attempts (effect_id, attempt_number, state, started_at_ms)
               VALUES ('effect-kept', 1, 'ambiguous', 0);",
            run = kept[0]
        ))
        .unwrap();
        // Young: finished inside the 30 days.
        finish_at(&db, &[kept[1].as_str()], days_ago(29));
    }
    server.spawn().unwrap();
    // The held run keeps the sweep from starting.
    let listed = server.cli(&["state", "prune", "--json"]);
    assert_eq!(exit(&listed), 0, "{}", stderr(&listed));
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let mut would: Vec<String> = listed["trees"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tree| tree["rootRunId"].as_str().unwrap().to_owned())
        .collect();
    would.sort();
    assert_eq!(
        would,
        (1..=4).map(|n| format!("old-{n:06}")).collect::<Vec<_>>()
    );
    let db = server.db();
    let before: Vec<String> = ids(&db);
    std::fs::write(dir.join("hold.release"), b"go").unwrap();
    wait_for(Duration::from_secs(30), "the sweep", || {
        (runs_named(&db, "old-") == 0).then_some(())
    })
    .await;
    let deleted: Vec<String> = before
        .into_iter()
        .filter(|id| !ids(&db).contains(id))
        .collect();
    assert_eq!(deleted, would, "the sweep deleted exactly the listed trees");
    assert_eq!(runs_named(&db, "kept-"), 2);
    assert_state_clean(&db);
}

fn ids(db: &Connection) -> Vec<String> {
    let mut statement = db
        .prepare("SELECT run_id FROM runs ORDER BY run_id")
        .unwrap();
    statement
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

// ---- a full disk -----------------------------------------------------------------

/// A backup that fills the disk (the state and the backup share a small
/// tmpfs) fails with the full-disk message, keeps no partial file and no
/// receipt, and loses nothing: the state verifies, a new run completes, and
/// the same command succeeds once there is room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_during_a_backup_loses_nothing() {
    const NAME: &str = "a_full_disk_during_a_backup_loses_nothing";
    if !in_private_namespace(NAME) {
        return;
    }
    let mut server = TestServer::new(&[]);
    mount_tmpfs(&server.home, "96m");
    server.spawn().unwrap();
    let template = completed_run(&server).await;
    server.stop();
    {
        let db = writable(&server.home.join("state.sqlite"));
        let runs = clone_runs(&db, &template, "young", 40, days_ago(1));
        give_own_inputs(&db, &runs, 1024 * 1024);
        db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    }
    // Leave about 20 MiB: less than a backup of the 40 MiB state needs.
    let free = nix::sys::statvfs::statvfs(&server.home).unwrap();
    let free_bytes = free.blocks_available() * free.fragment_size();
    std::fs::write(
        server.home.join("filler"),
        vec![0u8; (free_bytes - 20 * 1024 * 1024) as usize],
    )
    .unwrap();
    server.spawn().unwrap();
    let state_bytes = std::fs::metadata(server.home.join("state.sqlite"))
        .unwrap()
        .len();
    let free = nix::sys::statvfs::statvfs(&server.home).unwrap();
    let free_bytes = free.blocks_available() * free.fragment_size();
    assert!(
        free_bytes < state_bytes && free_bytes > 8 * 1024 * 1024,
        "the backup cannot fit: {free_bytes} free for {state_bytes}"
    );
    let backup = server.home.join("backup.sqlite");
    let failed = server.cli(&["state", "backup", path_text(&backup)]);
    assert_eq!(exit(&failed), 5, "{}{}", stdout(&failed), stderr(&failed));
    assert!(
        stderr(&failed).contains("the disk holding the backup path is full"),
        "{}",
        stderr(&failed)
    );
    assert!(!backup.exists(), "no partial backup is kept");
    assert!(
        host_commands(&server.db(), "state.backup").is_empty(),
        "no receipt"
    );
    let verified = server.cli(&["state", "verify"]);
    assert_eq!(exit(&verified), 0, "{}", stdout(&verified));
    let run = completed_run(&server).await;
    assert!(!run.is_empty());
    assert_eq!(runs_named(&server.db(), "young-"), 40);
    // With room (another disk), the same command succeeds.
    let roomy = PathBuf::from("/tmp").join(format!("backup-{}.sqlite", std::process::id()));
    let made = server.cli(&["state", "backup", path_text(&roomy)]);
    assert_eq!(exit(&made), 0, "{}", stderr(&made));
    assert_eq!(runs_named(&open_backup(&roomy), "young-"), 40);
    let _ = std::fs::remove_file(&roomy);
    assert_state_clean(&server.db());
}
