//! Storage faults: a database whose checkpoint a SIGKILL or a full disk
//! interrupted, a disk that fills while the server runs, the WAL's size, a
//! schema changed outside the server, an SQL error inside a write, and state
//! files that are empty, damaged or not databases at all.
//!
//! The full-disk tests mount a small tmpfs as the state home, in a private
//! user and mount namespace (`support::namespace`).

mod support;

use pi_workflows_client::RequestSpec;
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::*;

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn server_stderr(server: &TestServer) -> String {
    std::fs::read_to_string(server.scratch().join("server.stderr")).unwrap_or_default()
}

/// A file's length and digest (`None` when it does not exist).
fn file_bytes(path: &Path) -> Option<(usize, String)> {
    std::fs::read(path).ok().map(|bytes| {
        (
            bytes.len(),
            server::ids::digest_text(&server::ids::sha256(&bytes)),
        )
    })
}

fn wal_path(server: &TestServer) -> PathBuf {
    server.home.join("state.sqlite-wal")
}

fn wal_bytes(server: &TestServer) -> u64 {
    std::fs::metadata(wal_path(server)).map_or(0, |meta| meta.len())
}

/// The names in the state home besides `host/`.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "host")
        .collect();
    names.sort();
    names
}

/// A script of `nodes` compute nodes, each finishing with an output of
/// `output_bytes` bytes (so the database grows by a known amount per run).
fn fat_script(dir: &Path, nodes: usize, output_bytes: usize) -> PathBuf {
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut behaviours = serde_json::Map::new();
    for (index, name) in names.iter().enumerate() {
        let blob: String =
            std::iter::repeat_n(char::from(b'a' + (index % 26) as u8), output_bytes).collect();
        behaviours.insert(name.clone(), json!([{ "finish": { "blob": blob } }]));
    }
    write_script(
        dir,
        "fat.json",
        &json!({ "workflowName": "fat", "topology": linear_topology(&refs), "nodes": behaviours }),
    )
}

/// The run ids the state lists (read-only, through the server socket).
async fn listed_runs(server: &TestServer) -> Vec<String> {
    let mut client = server.client().await;
    let response = client
        .request(&RequestSpec::read(
            "runs.list",
            None,
            json!({ "limit": 1000 }),
        ))
        .await
        .expect("runs.list");
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    let mut ids: Vec<String> = response.receipt.unwrap()["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["runId"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn quick_check(path: &Path) -> String {
    let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open the state read-only");
    connection
        .query_row("PRAGMA quick_check", [], |row| row.get(0))
        .unwrap_or_else(|error| format!("{error}"))
}

// ---- 1. intact databases are not "incompatible" ------------------------------

/// A SIGKILL inside a checkpoint write (strace injects it into the fifth
/// `pwrite64` to `state.sqlite`: after the database exists, the server writes
/// the main file only when it checkpoints) leaves a main file that is not a
/// complete database without its WAL. The next server recovers it the way
/// SQLite does and has every run it acknowledged; none is lost and none is
/// called incompatible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_whose_checkpoint_was_killed_starts_with_every_run() {
    let strace = ["strace", "/usr/bin/strace"]
        .into_iter()
        .find(|program| Command::new(program).arg("-V").output().is_ok())
        .expect("this test needs strace (scripts/test-all.sh installs it)");
    let mut server = TestServer::start();
    server.stop();
    let database = server.home.join("state.sqlite");
    let database_text = database.to_string_lossy().into_owned();
    let trace_log = server.scratch().join("strace.log");
    let trace_log_text = trace_log.to_string_lossy().into_owned();
    server
        .spawn_under(&[
            strace,
            "-f",
            "-qq",
            "-o",
            &trace_log_text,
            "-P",
            &database_text,
            "-e",
            "trace=pwrite64",
            "-e",
            "inject=pwrite64:signal=SIGKILL:when=5",
            "--",
        ])
        .expect("the traced server starts");
    let script = fat_script(server.scratch(), 3, 150_000);
    let mut accepted = Vec::new();
    for attempt in 0..24 {
        let Ok(mut client) = pi_workflows_client::Connection::connect(
            &server.socket(),
            &format!("test-checkpoint-{attempt}"),
        )
        .await
        else {
            break;
        };
        let Ok(response) = client
            .request(&RequestSpec::command(
                "run.start",
                None,
                json!({ "workflow": script.to_string_lossy(), "input": {}, "executionMode": "headless", "projectPath": "/tmp" }),
            ))
            .await
        else {
            break;
        };
        if response.outcome != "accepted" {
            break;
        }
        let run_id = response.receipt.unwrap()["runId"]
            .as_str()
            .unwrap()
            .to_owned();
        accepted.push(run_id.clone());
        // Until it settles, or the server died under it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.is_running() && Instant::now() < deadline {
            if let Ok(mut client) =
                pi_workflows_client::Connection::connect(&server.socket(), "test-watch").await
                && let Ok(response) = client
                    .request(&RequestSpec::read("run.view", Some(&run_id), json!({})))
                    .await
                && status(&response.receipt.unwrap_or(Value::Null)) == "completed"
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !server.is_running() {
            break;
        }
    }
    assert!(
        server.wait_exit(Duration::from_secs(30)),
        "the injected SIGKILL never came: no checkpoint wrote the main file five times"
    );
    assert!(!accepted.is_empty(), "no run was accepted before the kill");

    // The main file alone is not the database: the checkpoint was cut short.
    let copies = tempfile::tempdir().unwrap();
    let alone = copies.path().join("alone.sqlite");
    std::fs::copy(&database, &alone).unwrap();
    let with_wal = copies.path().join("with-wal.sqlite");
    std::fs::copy(&database, &with_wal).unwrap();
    std::fs::copy(wal_path(&server), copies.path().join("with-wal.sqlite-wal")).unwrap();
    let runs_in = |path: &Path| -> Result<i64, String> {
        let connection = Connection::open(path).map_err(|e| e.to_string())?;
        connection
            .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
            .map_err(|e| e.to_string())
    };
    let recovered = runs_in(&with_wal);
    assert_eq!(quick_check(&with_wal), "ok");
    let main_alone = runs_in(&alone).map(Some).unwrap_or(None);
    assert!(
        quick_check(&alone) != "ok" || main_alone != recovered.clone().ok(),
        "the kill left a main file that is complete without its WAL ({main_alone:?} runs): the test did not interrupt a checkpoint"
    );

    server.spawn().expect("the intact database starts");
    let listed = listed_runs(&server).await;
    for run_id in &accepted {
        assert!(listed.contains(run_id), "run {run_id} was lost: {listed:?}");
    }
    let mut client = server.client().await;
    for run_id in &accepted {
        let view = wait_view(&mut client, run_id, Duration::from_secs(60), |view| {
            status(view) == "completed"
        })
        .await;
        assert_eq!(status(&view), "completed");
    }
    assert_eq!(quick_check(&database), "ok");
}

/// A server killed with its work in the WAL, restarted on a full disk: that
/// start says the disk is full (not "incompatible") and changes nothing;
/// once space is free the next start has every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restarted_on_a_full_disk_is_reported_as_such_and_starts_once_space_is_free() {
    if !in_private_namespace(
        "a_database_restarted_on_a_full_disk_is_reported_as_such_and_starts_once_space_is_free",
    ) {
        return;
    }
    let mut server = TestServer::new(&[]);
    mount_tmpfs(&server.home, "24m");
    server.spawn().expect("the server starts");
    let script = fat_script(server.scratch(), 3, 100_000);
    let mut client = server.client().await;
    let mut accepted = Vec::new();
    for _ in 0..3 {
        let run_id = started(&mut client, &script).await;
        let view = wait_settled(&mut client, &run_id).await;
        assert_eq!(status(&view), "completed");
        accepted.push(run_id);
    }
    drop(client);
    server.kill();

    let filler = fill_disk(&server.home);
    let database = server.home.join("state.sqlite");
    let before = (file_bytes(&database), file_bytes(&wal_path(&server)));
    let error = server
        .spawn()
        .expect_err("a server cannot start on a full disk");
    assert!(error.contains("disk"), "{error}");
    assert!(error.contains("full"), "{error}");
    assert!(error.contains("PI_WORKFLOWS_HOME"), "{error}");
    assert!(!error.contains("incompatible"), "{error}");
    assert!(!error.contains('\n'), "{error}");
    assert_eq!(
        file_bytes(&database),
        before.0,
        "the refused start changed state.sqlite"
    );
    assert_eq!(
        file_bytes(&wal_path(&server)),
        before.1,
        "the refused start changed the WAL"
    );

    std::fs::remove_file(filler).unwrap();
    server
        .spawn()
        .unwrap_or_else(|error| panic!("the intact database must start: {error}"));
    let listed = listed_runs(&server).await;
    for run_id in &accepted {
        assert!(listed.contains(run_id), "run {run_id} was lost: {listed:?}");
    }
    assert_eq!(quick_check(&database), "ok");
    server.stop();
    let _ = Command::new("umount").arg("-l").arg(&server.home).status();
}

// ---- 2. a disk that fills while the server runs -------------------------------

/// The disk fills while the server runs: reads go on (status, runs, the
/// view), every write is refused with "disk full" (never acknowledged),
/// the server keeps running past its lease, and writes resume by themselves
/// once space is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_keeps_reads_and_recovers_without_a_restart() {
    if !in_private_namespace(
        "a_full_disk_refuses_writes_keeps_reads_and_recovers_without_a_restart",
    ) {
        return;
    }
    let mut server = TestServer::new(&[]);
    mount_tmpfs(&server.home, "16m");
    let epoch = server.spawn().expect("the server starts");
    let pid = server.pid();
    let linear = script("linear.json");
    let linear_text = linear.to_string_lossy().into_owned();
    let mut client = server.client().await;
    let first = started(&mut client, &linear).await;
    assert_eq!(
        status(&wait_settled(&mut client, &first).await),
        "completed"
    );
    drop(client);

    let filler = fill_disk(&server.home);

    let refused = server.cli(&["start", &linear_text]);
    assert_eq!(refused.status.code(), Some(5), "{}", text(&refused));
    let refusal = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(refusal.contains("disk"), "{refusal}");
    assert!(refusal.contains("full"), "{refusal}");
    assert!(refusal.contains("PI_WORKFLOWS_HOME"), "{refusal}");
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("started run"));

    // Longer than the server lease (3 s in tests): a server that cannot
    // renew because the disk is full is still the server.
    tokio::time::sleep(Duration::from_millis(7_000)).await;
    assert!(server.is_running(), "the server stopped on a full disk");
    for args in [
        vec!["server", "status"],
        vec!["runs", "--json"],
        vec!["view", first.as_str(), "--once"],
    ] {
        let output = server.cli(&args);
        assert!(
            output.status.success(),
            "`{}` on a full disk: {}",
            args.join(" "),
            text(&output)
        );
    }
    assert!(text(&server.cli(&["runs", "--json"])).contains(&first));
    let again = server.cli(&["start", &linear_text]);
    assert_eq!(again.status.code(), Some(5), "{}", text(&again));
    assert_eq!(
        listed_runs(&server).await,
        vec![first.clone()],
        "a refused start left a run"
    );
    let log = server_stderr(&server);
    assert!(log.contains("disk full"), "{log}");
    assert!(!log.contains("lost its epoch lease"), "{log}");

    std::fs::remove_file(filler).unwrap();
    let started_again = server.cli(&["start", &linear_text, "--json"]);
    assert!(started_again.status.success(), "{}", text(&started_again));
    let document: Value = serde_json::from_slice(&started_again.stdout).unwrap();
    let second = document["runId"].as_str().unwrap().to_owned();
    let mut client = server.client().await;
    assert_eq!(
        status(&wait_settled(&mut client, &second).await),
        "completed"
    );
    assert!(server.is_running());
    assert_eq!(server.pid(), pid, "the same server process");
    let status_json: Value =
        serde_json::from_slice(&server.cli(&["server", "status", "--json"]).stdout).unwrap();
    assert_eq!(status_json["serverEpoch"], json!(epoch), "no restart");
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
    server.stop();
    let _ = Command::new("umount").arg("-l").arg(&server.home).status();
}

// ---- 3. the WAL is checkpointed and truncated ---------------------------------

/// After work and an idle moment the WAL is truncated, and it stays small
/// while the idle server renews its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_truncated_when_the_server_is_idle() {
    let server = TestServer::start();
    let mut client = server.client().await;
    for _ in 0..4 {
        let run_id = started(&mut client, &script("linear.json")).await;
        assert_eq!(
            status(&wait_settled(&mut client, &run_id).await),
            "completed"
        );
    }
    wait_quiescent_at(&server).await;
    let after_work = wal_bytes(&server);
    const SMALL: u64 = 64 * 1024;
    let truncated = Instant::now() + Duration::from_secs(15);
    while wal_bytes(&server) >= SMALL {
        assert!(
            Instant::now() < truncated,
            "the WAL was never truncated: {} bytes ({after_work} after the work)",
            wal_bytes(&server)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And it stays small over several lease renewals.
    let mut largest = 0;
    for _ in 0..100 {
        largest = largest.max(wal_bytes(&server));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(largest < 2 * SMALL, "the idle WAL grew to {largest} bytes");
}

// ---- 4. the whole schema, and SQL errors inside writes ------------------------

/// A state file whose schema lost a table, lost an index or gained one is
/// refused as changed outside Pi Workflows (naming the object), never started
/// and never called incompatible; the file is left untouched.
#[test]
fn a_database_whose_schema_was_changed_is_refused_and_left_untouched() {
    for (change, object) in [
        ("DROP TABLE viewer_deltas", "viewer_deltas"),
        ("DROP INDEX events_by_run", "events_by_run"),
        ("CREATE INDEX planted_idx ON runs (title)", "planted_idx"),
    ] {
        let mut server = TestServer::start();
        server.stop();
        let database = server.home.join("state.sqlite");
        {
            let connection = Connection::open(&database).unwrap();
            connection
                .execute_batch(change)
                .unwrap_or_else(|error| panic!("{change}: {error}"));
        }
        let before = file_bytes(&database);
        let files_before = listing(&server.home);
        let error = server
            .spawn()
            .expect_err("a database with a changed schema must be refused");
        assert_ne!(error, server::store::INCOMPATIBLE_STATE, "{change}");
        assert!(error.contains("damaged"), "{change}: {error}");
        assert!(error.contains(object), "{change}: {error}");
        assert!(!error.contains('\n'), "{error}");
        assert_eq!(file_bytes(&database), before, "{change}: the bytes changed");
        assert_eq!(listing(&server.home), files_before, "{change}");
    }
}

/// An SQL error inside a write (here: a table dropped while the server
/// runs) fails the command: `run.start` is never `accepted` for a run that
/// was not stored, and the server logs one bounded line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_sql_fails_is_never_acknowledged() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let first = started(&mut client, &script("linear.json")).await;
    assert_eq!(
        status(&wait_settled(&mut client, &first).await),
        "completed"
    );
    {
        let connection = Connection::open(server.home.join("state.sqlite")).unwrap();
        connection.busy_timeout(Duration::from_secs(10)).unwrap();
        connection
            .execute_batch("DROP TABLE viewer_deltas")
            .unwrap();
    }
    let log_before = server_stderr(&server);
    let response = start_run(&mut client, &script("linear.json")).await;
    assert_ne!(response.outcome, "accepted", "{:?}", response.frame);
    assert_eq!(response.outcome, "unavailable", "{:?}", response.frame);
    let runs: i64 = server
        .db()
        .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(runs, 1, "no run was stored");
    let log = server_stderr(&server);
    let new_lines: Vec<&str> = log[log_before.len()..]
        .lines()
        .filter(|line| line.contains("write failed"))
        .collect();
    assert!(!new_lines.is_empty(), "nothing was logged: {log}");
    for line in new_lines {
        assert!(line.len() <= 300, "{line}");
        assert!(!line.contains("/tmp"), "a path in the log: {line}");
    }
}

/// Startup recovery that cannot read the runner records of the server that
/// crashed refuses to start with the store's one line, instead of going on
/// without orphan detection (which would leave their runs waiting forever).
/// The records are made unreadable by zeroing the root page of
/// `run_workers` after a SIGKILL left one live runner record there; the
/// server opens the file (nothing it verifies at open reads that page).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_recovery_that_cannot_read_the_runner_records_refuses_to_start() {
    let mut server = TestServer::start();
    let script = write_script(
        server.scratch(),
        "stalled.json",
        &json!({
            "workflowName": "stalled",
            "topology": linear_topology(&["a"]),
            "nodes": {"a": [{"stall": true}]}
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let runner = wait_for(Duration::from_secs(10), "the live runner record", || {
        let db = server.db();
        let ready = count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1 AND status = 'ready'",
            [&run_id],
        );
        (ready == 1)
            .then(|| runner_identity(&db, &run_id, 1))
            .flatten()
    })
    .await;
    server.kill();
    server::children::supervisor::kill_exact(&runner);
    let database = server.home.join("state.sqlite");
    let (root, page_size): (i64, i64) = {
        let connection = Connection::open(&database).unwrap();
        connection
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let root = connection
            .query_row(
                "SELECT rootpage FROM sqlite_schema WHERE type = 'table' AND name = 'run_workers'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        let page_size = connection
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .unwrap();
        (root, page_size)
    };
    {
        use std::io::{Seek as _, SeekFrom};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&database)
            .unwrap();
        file.seek(SeekFrom::Start(((root - 1) * page_size) as u64))
            .unwrap();
        file.write_all(&vec![0u8; page_size as usize]).unwrap();
        file.sync_all().unwrap();
    }
    let error = server
        .spawn()
        .expect_err("a server that cannot read the runner records must not start");
    assert!(error.contains("state database"), "{error}");
    assert!(!error.contains('\n'), "{error}");
}

// ---- 5 and 1. empty, damaged and foreign state files ---------------------------

/// Plants `bytes` as `state.sqlite` (or a directory) and returns the
/// refusal of a server start, after checking that nothing changed.
fn refusal_of(plant: impl FnOnce(&Path)) -> String {
    let mut server = TestServer::new(&[]);
    std::fs::create_dir_all(&server.home).unwrap();
    let database = server.home.join("state.sqlite");
    plant(&database);
    let before = file_bytes(&database);
    let files_before = listing(&server.home);
    let error = server.spawn().expect_err("the state file must be refused");
    assert_eq!(file_bytes(&database), before, "the state file changed");
    assert_eq!(listing(&server.home), files_before, "a file appeared");
    assert!(!error.contains('\n'), "{error}");
    error
}

/// A real state database's bytes: a server created it, ran a run and
/// stopped; the WAL is checkpointed into the main file, which is then a
/// complete database by itself.
fn real_database() -> Vec<u8> {
    let mut server = TestServer::start();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut client = server.client().await;
            let run_id = started(&mut client, &script("linear.json")).await;
            wait_settled(&mut client, &run_id).await;
        });
    server.stop();
    let path = server.home.join("state.sqlite");
    let connection = Connection::open(&path).unwrap();
    connection
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(connection);
    std::fs::read(path).unwrap()
}

/// A `state.sqlite-wal` left behind when `state.sqlite` was moved away
/// without it is refused, never replayed over a new database (SQLite cannot
/// tell whose frames they are): no file is created or changed, and the
/// message says where the WAL belongs. Moved beside its database, it is that
/// database's again: the run it held is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_left_without_its_database_is_refused_and_left_untouched() {
    let mut server = TestServer::start();
    let mut client = server.client().await;
    let run_id = started(&mut client, &script("linear.json")).await;
    drop(client);
    // Killed while its runner works: the run's commits are in the WAL.
    server.kill();
    assert!(wal_bytes(&server) > 0, "the crash left frames in the WAL");
    let moved = server.scratch().join("moved");
    std::fs::create_dir_all(&moved).unwrap();
    std::fs::rename(server.home.join("state.sqlite"), moved.join("state.sqlite")).unwrap();
    let wal_before = file_bytes(&wal_path(&server));
    let files_before = listing(&server.home);
    let error = server
        .spawn()
        .expect_err("a WAL without its database must be refused");
    assert_ne!(error, server::store::INCOMPATIBLE_STATE);
    assert!(error.contains("state.sqlite-wal"), "{error}");
    assert!(!error.contains('\n'), "{error}");
    assert_eq!(
        file_bytes(&wal_path(&server)),
        wal_before,
        "the WAL changed"
    );
    assert_eq!(listing(&server.home), files_before, "a file appeared");
    for suffix in ["-wal", "-shm"] {
        let name = format!("state.sqlite{suffix}");
        if server.home.join(&name).exists() {
            std::fs::rename(server.home.join(&name), moved.join(&name)).unwrap();
        }
    }
    let db =
        Connection::open_with_flags(moved.join("state.sqlite"), OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM runs WHERE run_id = ?1",
            [&run_id]
        ),
        1,
        "the moved database with its WAL holds the run"
    );
}

/// Only a missing file starts a new database: a zero-length `state.sqlite`
/// is reported with its own message and left as it is.
#[test]
fn an_empty_state_file_is_reported_and_left_untouched() {
    let error = refusal_of(|path| std::fs::write(path, b"").unwrap());
    assert_ne!(error, server::store::INCOMPATIBLE_STATE);
    assert!(error.contains("empty"), "{error}");
}

/// Damage (SQLite's integrity check fails), a file that is no database, and
/// a directory each get their own message, none of them the
/// back-up-and-move instruction; a schema of another version still does.
#[test]
fn damaged_and_foreign_state_files_are_told_apart_from_incompatible_ones() {
    let real = real_database();
    let half = real[..real.len() / 2].to_vec();
    let error = refusal_of(|path| std::fs::write(path, &half).unwrap());
    assert!(error.contains("damaged"), "truncated: {error}");
    assert_ne!(error, server::store::INCOMPATIBLE_STATE);

    let mut noise = vec![0u8; real.len().max(200_000)];
    let mut state = 0x2545_f491_u32;
    for byte in &mut noise {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        *byte = state as u8;
    }
    let error = refusal_of(|path| std::fs::write(path, &noise).unwrap());
    assert!(error.contains("not an SQLite database"), "noise: {error}");

    let mut header_then_noise = real[..100].to_vec();
    header_then_noise.extend_from_slice(&noise[..real.len() - 100]);
    let error = refusal_of(|path| std::fs::write(path, &header_then_noise).unwrap());
    assert!(
        error.contains("damaged") || error.contains("not an SQLite database"),
        "header then noise: {error}"
    );
    assert_ne!(error, server::store::INCOMPATIBLE_STATE);

    let error = refusal_of(|path| std::fs::create_dir(path).unwrap());
    assert!(error.contains("not a file"), "directory: {error}");

    // Every older version (3: wall-clock interactive deadlines; 4: before
    // session capture or before state retention's deletion indexes; 5:
    // before a decision's answer source; 6: before a Telegram answer
    // source; 7: before a piw answer source and follow-ups; 8: before
    // durable turn intents; 9: before selected launches; 10: before live
    // settings; 11: before resources and the controller queue) gets the
    // back-up-and-move instruction.
    for version in [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] {
        let error = refusal_of(|path| {
            std::fs::write(path, &real).unwrap();
            let connection = Connection::open(path).unwrap();
            connection
                .execute_batch(&format!(
                    "PRAGMA journal_mode=DELETE; PRAGMA ignore_check_constraints=ON;
                     UPDATE schema_meta SET schema_version = {version}"
                ))
                .unwrap();
        });
        assert_eq!(
            error,
            server::store::INCOMPATIBLE_STATE,
            "version {version} (an older schema)"
        );
    }
}
