//! Server lifecycle, the durable state file, and runs of the example scripts
//! end to end through the socket and real runner processes.

mod support;

use pi_workflows_client::RequestSpec;
use serde_json::json;
use std::time::Duration;
use support::*;

#[test]
fn a_second_live_server_is_refused_with_one_line() {
    let server = TestServer::start();
    let mut second = TestServer::new(&[]);
    for (key, value) in server.env() {
        second.set_env(key, value);
    }
    let error = second.spawn().expect_err("a second server must not start");
    assert!(error.contains("already running"), "{error}");
    assert!(!error.contains('\n'));
}

/// A lock that no answering server holds (a SIGKILLed server's child still
/// between fork and exec shares it for a moment) does not refuse a start:
/// the start waits for it and then runs. Here the test process holds the
/// lock for 500 ms with no server running.
#[test]
fn a_start_waits_for_a_lock_no_answering_server_holds() {
    let mut server = TestServer::new(&[]);
    let host = server.home.join("host");
    std::fs::create_dir_all(&host).unwrap();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(host.join("server.lock"))
        .unwrap();
    lock.try_lock().expect("the test takes the lock");
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(lock);
    });
    server
        .spawn()
        .expect("the start waits for the released lock instead of refusing");
    release.join().unwrap();
    assert!(server.is_running());
}

#[test]
fn an_incompatible_database_is_refused_and_left_untouched() {
    let server = TestServer::new(&[]);
    std::fs::create_dir_all(&server.home).unwrap();
    let path = server.home.join("state.sqlite");
    {
        let connection = rusqlite::Connection::open(&path).unwrap();
        connection
            .execute_batch(
                "CREATE TABLE schema_meta (singleton INTEGER PRIMARY KEY, schema_name TEXT, schema_version INTEGER, ddl_digest TEXT, created_at_ms INTEGER);
                 INSERT INTO schema_meta VALUES (1, 'pi-workflows-state', 1, 'sha256:an-older-alpha', 0);
                 CREATE TABLE runs (run_id TEXT PRIMARY KEY);
                 INSERT INTO runs VALUES ('precious');",
            )
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let listing = |dir: &std::path::Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let files_before = listing(&server.home);
    let mut server = server;
    let error = server
        .spawn()
        .expect_err("an incompatible database must be refused");
    assert_eq!(error, server::store::INCOMPATIBLE_STATE);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the database bytes changed"
    );
    let files_after: Vec<String> = listing(&server.home)
        .into_iter()
        .filter(|name| name != "host")
        .collect();
    assert_eq!(files_after, files_before, "no -wal or -shm file may appear");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_scripts_reach_their_terminal_states() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let linear = started(&mut client, &script("linear.json")).await;
    let view = wait_settled(&mut client, &linear).await;
    assert_eq!(status(&view), "completed");
    assert_eq!(view["steps"]["total"], 3);

    let switch = started(&mut client, &script("switch.json")).await;
    let view = wait_settled(&mut client, &switch).await;
    assert_eq!(
        status(&view),
        "completed",
        "the failure routed through $result.outcome: {view}"
    );
    let outcomes: Vec<_> = view["steps"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["outcome"].clone())
        .collect();
    assert_eq!(outcomes[0], "failed");

    let looping = started(&mut client, &script("loop.json")).await;
    let view = wait_settled(&mut client, &looping).await;
    assert_eq!(status(&view), "failed");
    assert_eq!(
        view["steps"]["total"], 6,
        "maxSteps bounds the loop: {view}"
    );
    assert_eq!(view["failure"]["class"], "nodeFailed");
    support::wait_quiescent(&server.db()).await;
    assert_eq!(
        support::consistency_violations(&server.db()),
        Vec::<String>::new()
    );
}

/// A mount's `maxSteps` bounds each invocation, counted from the mount's
/// latest entry, and every visit number comes from the run's own steps:
/// every runner message reads them from the state file's bounded step
/// summary (`include_loop.json` names the ten steps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_limit_counts_from_the_latest_entry_across_runner_messages() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let run = started(&mut client, &script("include_loop.json")).await;
    let view = wait_settled(&mut client, &run).await;
    assert_eq!(status(&view), "failed", "{view}");
    let steps: Vec<(String, u64)> = view["steps"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| {
            (
                step["nodeId"].as_str().unwrap().to_owned(),
                step["visit"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, u64)> = [
        ("a", 1),
        ("m", 1),
        ("m/work", 1),
        ("m/work", 2),
        ("m/__piw_exit_ok", 1),
        ("b", 1),
        ("a", 2),
        ("m", 2),
        ("m/work", 3),
        ("m/work", 4),
    ]
    .iter()
    .map(|(node, visit)| ((*node).to_owned(), *visit))
    .collect();
    assert_eq!(steps, expected, "{view}");
    assert_eq!(view["failure"]["class"], "nodeFailed");
    let db = server.db();
    let reason: String = db
        .query_row(
            "SELECT error_reason FROM runs WHERE run_id = ?1",
            [&run],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(reason, "maxSteps", "the mount's limit failed the run");
    support::wait_quiescent(&db).await;
    assert_eq!(support::consistency_violations(&db), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_waits_and_its_answer_starts_exactly_one_continuation() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let parent = started(&mut client, &script("checkpoint.json")).await;
    let view = wait_settled(&mut client, &parent).await;
    assert_eq!(status(&view), "waiting");
    assert_eq!(view["display"]["waitingOn"], "review");
    assert!(
        view["display"]["controls"]
            .as_array()
            .unwrap()
            .contains(&json!("answer"))
    );

    let answer = RequestSpec::command(
        "checkpoint.answer",
        Some(&parent),
        json!({ "answer": { "approved": true } }),
    );
    let first = client.request(&answer).await.unwrap();
    assert_eq!(first.outcome, "accepted", "{:?}", first.frame);
    let child = first.receipt.as_ref().unwrap()["continuationRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    // A retry of the same command adopts; another answer conflicts.
    let retry = client.request(&answer).await.unwrap();
    assert_eq!(retry.outcome, "adopted");
    assert_eq!(retry.receipt, first.receipt);
    let other = RequestSpec::command(
        "checkpoint.answer",
        Some(&parent),
        json!({ "answer": { "approved": false } }),
    );
    let refused = client.request(&other).await.unwrap();
    assert_ne!(refused.outcome, "accepted", "{:?}", refused.frame);

    let view = wait_settled(&mut client, &child).await;
    assert_eq!(status(&view), "completed", "{view}");
    let parent_view = view_of(&mut client, &parent).await;
    assert_eq!(parent_view["status"]["run"], "completed");
    let children: i64 = server
        .db()
        .query_row(
            "SELECT COUNT(*) FROM runs WHERE continuation_of = ?1",
            [&parent],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(children, 1);
}

async fn view_of(client: &mut pi_workflows_client::Connection, run_id: &str) -> serde_json::Value {
    support::view(client, run_id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_commands_adopt_and_reused_keys_with_another_payload_conflict() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let spec = RequestSpec::command(
        "run.start",
        None,
        json!({ "workflow": script("linear.json").to_string_lossy(), "input": {"n": 1}, "executionMode": "headless", "projectPath": "/tmp" }),
    );
    let first = client.request(&spec).await.unwrap();
    assert_eq!(first.outcome, "accepted");
    // A retry with a new request id and the same key adopts, from a new connection.
    let mut same_client =
        pi_workflows_client::Connection::connect(&server.socket(), client.client_id())
            .await
            .unwrap();
    // (`Client::request` would number this connection's first request
    // `<clientId>-r1` again, the first connection's id: use a new one.)
    let retry = request_as(&mut same_client, &spec, &fresh_request_id()).await;
    assert_eq!(retry.outcome, "adopted", "{:?}", retry.frame);
    assert_eq!(retry.receipt, first.receipt);
    let mut changed = spec.clone();
    changed.payload["input"] = json!({"n": 2});
    let conflict = request_as(&mut same_client, &changed, &fresh_request_id()).await;
    assert_eq!(conflict.outcome, "conflict");
    let runs: i64 = server
        .db()
        .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(runs, 1, "one command, one run");
    let run_id = first.receipt.unwrap()["runId"].as_str().unwrap().to_owned();
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed");
}

/// After a crash (SIGKILL) the next server is ready at once, with the
/// production server lease (15 s): the global lock it acquired proves that
/// the old server is gone, so nothing waits for the old lease to expire.
/// Both `server run` and a CLI command that starts the server are ready
/// within 3 s (1 s is the goal; the margin is for a loaded machine), and
/// the epoch increases each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_after_a_crash_is_ready_at_once_with_a_higher_epoch() {
    const READY_BOUND: std::time::Duration = std::time::Duration::from_secs(3);
    let mut server = TestServer::new(&[]);
    server.remove_env("PI_WORKFLOWS_SERVER_LEASE_MS");
    let first = server.spawn().expect("the first server starts");
    let mut client = server.client().await;
    let run_id = started(&mut client, &script("linear.json")).await;
    assert_eq!(
        status(&wait_settled(&mut client, &run_id).await),
        "completed"
    );
    drop(client);
    server.kill();

    let restarted_at = std::time::Instant::now();
    let second = server.spawn().expect("a server starts after the crash");
    let mut client = server.client().await;
    let answered = client
        .request(&RequestSpec::read("runs.list", None, json!({})))
        .await
        .expect("the socket answers");
    let ready_after = restarted_at.elapsed();
    assert_eq!(answered.outcome, "accepted");
    assert!(
        ready_after < READY_BOUND,
        "the restarted server answered after {ready_after:?}"
    );
    assert!(second > first, "epoch {second} after {first}");
    drop(client);
    server.kill();

    // A CLI command after a crash starts the server itself, as quickly.
    let started_at = std::time::Instant::now();
    let output = server
        .command()
        .args(["server", "start"])
        .output()
        .expect("run pi-workflows server start");
    let cli_ready_after = started_at.elapsed();
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    let _ = server.command().args(["server", "stop"]).output();
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        cli_ready_after < READY_BOUND,
        "`server start` after a crash took {cli_ready_after:?}"
    );
    let third: u64 = printed
        .trim()
        .strip_prefix("pi-workflows server started (epoch ")
        .and_then(|rest| rest.strip_suffix(')'))
        .and_then(|epoch| epoch.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output: {printed}"));
    assert!(third > second, "epoch {third} after {second}");
}

/// A workflow with a notify node between two compute nodes.
fn notify_script(server: &TestServer) -> std::path::PathBuf {
    let mut topology = support::linear_topology(&["a", "tell", "b"]);
    topology["nodes"][1]["nodeType"] = json!("notify");
    write_script(
        server.scratch(),
        "notify.json",
        &json!({
            "workflowName": "notify",
            "topology": topology,
            "nodes": {"tell": [{"notify": {"text": "The build is green.", "kind": "final"}}]}
        }),
    )
}

/// A notify node finishes with its receipt as output: in a headless run the
/// run completes and no message is made; in an interactive run one passive
/// `notification` message with the notification text lands in the origin
/// session in the same transaction as the node result, before the run's
/// terminal message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_node_completes_and_an_interactive_run_gets_its_notification_message() {
    const SESSION: &str = "session-notify";
    let server = TestServer::start();
    let script = notify_script(&server);
    let mut client = server.client().await;

    let headless = started(&mut client, &script).await;
    let view = wait_settled(&mut client, &headless).await;
    assert_eq!(status(&view), "completed", "{view}");
    let steps: Vec<(String, String)> = step_outcomes(&view);
    assert_eq!(
        steps,
        [("a", "ok"), ("tell", "ok"), ("b", "ok")].map(|(n, o)| (n.to_owned(), o.to_owned())),
        "{view}"
    );

    let response = client
        .request(&RequestSpec::command(
            "run.start",
            None,
            json!({ "workflow": script.to_string_lossy(), "input": {}, "projectPath": "/tmp",
                    "executionMode": "interactive", "originSessionId": SESSION }),
        ))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    let interactive = response.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = wait_settled(&mut client, &interactive).await;
    assert_eq!(status(&view), "completed", "{view}");
    let db = server.db();
    let text: String = db
        .query_row(
            "SELECT CAST(b.bytes AS TEXT) FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest
             WHERE m.run_id = ?1 AND m.kind = 'notification' AND m.state = 'pending' AND m.session_id = ?2",
            rusqlite::params![interactive, SESSION],
            |row| row.get(0),
        )
        .expect("one pending notification message with its content");
    assert_eq!(text, "The build is green.");
    assert_eq!(
        support::count(
            &db,
            "SELECT COUNT(*) FROM workflow_messages WHERE run_id = ?1",
            [&headless]
        ),
        0,
        "a headless run has no session to notify"
    );
    let session = session_view(&mut client, SESSION).await;
    // The notification, then the run's terminal message (built after the
    // terminal commit, so it may still be on its way).
    let session = match session["messageCount"].as_u64() {
        Some(2) => session,
        _ => {
            wait_for(Duration::from_secs(10), "the terminal message", || {
                (support::count(
                    &db,
                    "SELECT COUNT(*) FROM workflow_messages WHERE run_id = ?1 AND kind = 'terminal'",
                    [&interactive],
                ) == 1)
                    .then_some(())
            })
            .await;
            session_view(&mut client, SESSION).await
        }
    };
    assert_eq!(session["messageCount"], 2, "{session}");
    assert_eq!(session["messages"][0]["kind"], "notification", "{session}");
    assert_eq!(session["messages"][1]["kind"], "terminal", "{session}");
    assert_eq!(
        session["messages"][0]["content"]["bytes"],
        "The build is green.".len(),
        "{session}"
    );
    support::wait_quiescent(&db).await;
    assert_eq!(support::consistency_violations(&db), Vec::<String>::new());
}

/// The terminal workflow messages of `session`: (message id, run id, state, content).
fn terminal_messages(
    db: &rusqlite::Connection,
    session: &str,
) -> Vec<(String, String, String, String)> {
    db.prepare(
        "SELECT m.message_id, m.run_id, m.state, CAST(b.bytes AS TEXT)
         FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest
         WHERE m.session_id = ?1 AND m.kind = 'terminal' ORDER BY m.session_order",
    )
    .unwrap()
    .query_map([session], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// The facts block of a terminal message's content.
fn terminal_facts(content: &str) -> serde_json::Value {
    let block = content
        .split("\n\n")
        .nth(1)
        .and_then(|part| part.split_once(":\n"))
        .map(|(_, json)| json)
        .unwrap_or_else(|| panic!("no facts block: {content}"));
    serde_json::from_str(block).unwrap_or_else(|error| panic!("{error}: {block}"))
}

/// An interactive checkpoint run waits, its answer settles it by its
/// continuation, and the continuation completes: only the continuation (the
/// chain's final leaf) gets a terminal message, `terminal:<its run id>`,
/// built after its terminal commit with its identity, exact input and
/// result; the settled parent gets none, and a headless run none. The
/// origin-session view keeps the finished leaf and shows its pending
/// terminal message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_message_reaches_only_the_final_leaf_of_a_continuation_chain() {
    const SESSION: &str = "session-terminal";
    let server = TestServer::start();
    let mut client = server.client().await;
    let parent = started_interactive(
        &mut client,
        &script("checkpoint.json"),
        SESSION,
        json!({"task": "ship it", "n": 1.5}),
    )
    .await;
    let view = wait_settled(&mut client, &parent).await;
    assert_eq!(status(&view), "waiting", "{view}");
    let leaf = answered_checkpoint(&mut client, &parent).await;
    let view = wait_settled(&mut client, &leaf).await;
    assert_eq!(status(&view), "completed", "{view}");
    let headless = started(&mut client, &script("linear.json")).await;
    assert_eq!(
        status(&wait_settled(&mut client, &headless).await),
        "completed"
    );

    let db = server.db();
    let messages = wait_for(Duration::from_secs(10), "the terminal message", || {
        let found = terminal_messages(&db, SESSION);
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(messages.len(), 1, "{messages:?}");
    let (message_id, run_id, state, content) = &messages[0];
    assert_eq!(message_id, &format!("terminal:{leaf}"));
    assert_eq!(run_id, &leaf);
    assert_eq!(state, "pending");
    let facts = terminal_facts(content);
    assert_eq!(facts["runId"], leaf.as_str());
    assert_eq!(facts["state"], "completed");
    assert_eq!(facts["workflowName"], "checkpoint");
    assert_eq!(facts["result"], json!({"published": true}), "{content}");
    assert_eq!(facts["restart"]["allowed"], false);
    let stored_input: String = db
        .query_row(
            "SELECT CAST(b.bytes AS TEXT) FROM runs r JOIN blobs b ON b.digest = r.input_digest WHERE r.run_id = ?1",
            [&leaf],
            |row| row.get(0),
        )
        .unwrap();
    assert!(
        content.contains(&format!("\"input\":{stored_input},")),
        "the exact stored input {stored_input}: {content}"
    );
    assert_eq!(
        support::count(
            &db,
            "SELECT COUNT(*) FROM workflow_messages WHERE kind = 'terminal' AND run_id IN (?1, ?2)",
            [&parent, &headless]
        ),
        0,
        "neither the settled parent nor a headless run gets one"
    );

    let session = session_view(&mut client, SESSION).await;
    assert_eq!(session["activeRun"]["runId"], leaf.as_str(), "{session}");
    let kinds: Vec<&str> = session["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|message| message["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["terminal"], "{session}");
    assert_eq!(
        session["messages"][0]["content"]["bytes"],
        content.len(),
        "{session}"
    );
    support::wait_quiescent(&db).await;
    assert_eq!(support::consistency_violations(&db), Vec::<String>::new());
}

/// The server dies after an interactive run's terminal commit, before its
/// terminal message (`before_terminal_message`): the run stays completed,
/// the next server builds the missing message at startup, and a third start
/// builds no second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_builds_a_terminal_message_a_crash_left_missing() {
    const SESSION: &str = "session-crash";
    let mut server = TestServer::new(&[("PI_WORKFLOWS_FAULT", "before_terminal_message:1")]);
    server.spawn().expect("the server starts");
    let run_id = {
        let mut client = server.client().await;
        started_interactive(&mut client, &script("linear.json"), SESSION, json!({})).await
    };
    assert!(
        server.wait_exit(Duration::from_secs(20)),
        "the server did not stop before the terminal message"
    );
    {
        let db = server.db();
        let status: String = db
            .query_row(
                "SELECT status FROM runs WHERE run_id = ?1",
                [&run_id],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(status, "completed", "the terminal state committed first");
        assert_eq!(terminal_messages(&db, SESSION), Vec::new());
    }
    server.remove_env("PI_WORKFLOWS_FAULT");
    server.spawn().expect("the server restarts");
    let _client = server.client().await;
    let messages = terminal_messages(&server.db(), SESSION);
    assert_eq!(messages.len(), 1, "built at startup: {messages:?}");
    assert_eq!(messages[0].0, format!("terminal:{run_id}"));
    assert_eq!(terminal_facts(&messages[0].3)["state"], "completed");

    server.stop();
    server.spawn().expect("a third start");
    let _client = server.client().await;
    assert_eq!(
        terminal_messages(&server.db(), SESSION),
        messages,
        "no second terminal message"
    );
    support::wait_quiescent(&server.db()).await;
    assert_eq!(
        support::consistency_violations(&server.db()),
        Vec::<String>::new()
    );
}
