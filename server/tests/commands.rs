//! client.v1 commands and frames through the socket: durable receipts
//! (exact retries adopt, reused keys or request ids with another payload
//! conflict) and bad frames (one bounded error frame, only that connection
//! closes).

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::{Value, json};
use std::time::Duration;
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// A run whose first node takes long enough to pause, resume and cancel it.
fn slow_script(server: &TestServer) -> std::path::PathBuf {
    write_script(
        server.scratch(),
        "slow.json",
        &json!({
            "workflowName": "slow",
            "topology": linear_topology(&["a", "b"]),
            "nodes": {"a": [{"sleepMs": 30000, "then": {"finish": {"a": 1}}}]}
        }),
    )
}

fn revision_of(db: &rusqlite::Connection, run_id: &str) -> i64 {
    count(db, "SELECT revision FROM runs WHERE run_id = ?1", [run_id])
}

/// One command family: the first request is accepted; an exact retry with
/// a new request id (from another connection of the same client) adopts
/// the same receipt; the same key with another run id or another expected
/// revision conflicts; the same request id with another key conflicts; a
/// conflict changes nothing and stores nothing.
async fn receipts_of(
    server: &TestServer,
    client_id: &str,
    operation: &str,
    run_id: &str,
    other_run: &str,
) -> Value {
    let db = server.db();
    let mut first_connection = Client::connect(&server.socket(), client_id).await.unwrap();
    let spec = RequestSpec::command(operation, Some(run_id), json!({}));
    let first_id = fresh_request_id();
    let first = request_as(&mut first_connection, &spec, &first_id).await;
    assert_eq!(first.outcome, "accepted", "{operation}: {:?}", first.frame);
    let receipt = first.receipt.clone().expect("a receipt");
    assert_eq!(receipt["runId"], json!(run_id));
    drop(first_connection);

    let mut second_connection = Client::connect(&server.socket(), client_id).await.unwrap();
    let retry = request_as(&mut second_connection, &spec, &fresh_request_id()).await;
    assert_eq!(retry.outcome, "adopted", "{operation}: {:?}", retry.frame);
    assert_eq!(retry.receipt.as_ref(), Some(&receipt), "{operation}");
    assert_eq!(retry.revision, first.revision, "{operation}");
    // The original request id, resent with the same command, adopts too.
    let resent = request_as(&mut second_connection, &spec, &first_id).await;
    assert_eq!(resent.outcome, "adopted", "{operation}");
    assert_eq!(resent.receipt.as_ref(), Some(&receipt), "{operation}");

    // The command's own consequences (a resumed run is admitted again and
    // its new runner becomes ready) move the revision; wait for them so that
    // only the conflicting requests below could.
    wait_for(Duration::from_secs(10), "the run to hold still", || {
        let still = count(
            &db,
            "SELECT COUNT(*) FROM runs r JOIN run_queue q USING (run_id) WHERE r.run_id = ?1 AND (
               (q.status = 'running'
                AND EXISTS (SELECT 1 FROM run_workers w WHERE w.run_id = r.run_id AND w.status = 'ready')
                AND NOT EXISTS (SELECT 1 FROM run_workers w WHERE w.run_id = r.run_id AND w.status = 'launching'))
               OR (q.status = 'parked' AND r.paused = 1)
               OR q.status IN ('done', 'failed', 'cancelled'))",
            [run_id],
        );
        (still == 1).then_some(())
    })
    .await;
    let revision_before = (revision_of(&db, run_id), revision_of(&db, other_run));
    let stored_before = count(&db, "SELECT COUNT(*) FROM host_commands", []);
    let mut other_run_spec = spec.clone();
    other_run_spec.run_id = Some(other_run.to_owned());
    let mut other_revision = spec.clone();
    other_revision.expected_revision = Some(1);
    let mut other_key = spec.clone();
    other_key.idempotency_key = Some(format!("k-{}", server::ids::random_hex::<12>()));
    let mut other_key_other_run = other_run_spec.clone();
    other_key_other_run.idempotency_key = other_key.idempotency_key.clone();
    for (what, reused, request_id) in [
        ("same key, another run", &other_run_spec, fresh_request_id()),
        (
            "same key, another expected revision",
            &other_revision,
            fresh_request_id(),
        ),
        ("same request id, another key", &other_key, first_id.clone()),
        (
            "same request id, another key and run",
            &other_key_other_run,
            first_id.clone(),
        ),
    ] {
        let response = request_as(&mut second_connection, reused, &request_id).await;
        assert_eq!(
            response.outcome, "conflict",
            "{operation}, {what}: {:?}",
            response.frame
        );
        assert_eq!(
            response.error_code.as_deref(),
            Some("conflict"),
            "{operation}, {what}"
        );
        assert!(response.receipt.is_none(), "{operation}, {what}");
    }
    assert_eq!(
        (revision_of(&db, run_id), revision_of(&db, other_run)),
        revision_before,
        "{operation}: a conflicting request changed a run"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM host_commands", []),
        stored_before,
        "{operation}: a conflicting request stored a receipt"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM host_commands WHERE client_id = ?1 AND idempotency_key = ?2",
            rusqlite::params![client_id, spec.idempotency_key.as_deref().unwrap()],
        ),
        1,
        "{operation}: one receipt per key"
    );
    receipt
}

/// `run.start`, `run.pause`, `run.resume` and `run.cancel`: duplicates adopt
/// the stored receipt, conflicting reuse conflicts, and each command took
/// effect exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_control_commands_adopt_and_conflicting_reuse_conflicts() {
    let server = TestServer::start();
    let script = slow_script(&server);
    let client_id = format!("dup-{}", server::ids::random_hex::<4>());
    let db = server.db();

    // run.start: an exact retry from a new connection adopts; the same key
    // with another input conflicts; one run exists for the key.
    let mut client = Client::connect(&server.socket(), &client_id).await.unwrap();
    let start = RequestSpec::command(
        "run.start",
        None,
        json!({ "workflow": script.to_string_lossy(), "input": {"n": 1}, "executionMode": "headless", "projectPath": "/tmp" }),
    );
    let first = request_as(&mut client, &start, &fresh_request_id()).await;
    assert_eq!(first.outcome, "accepted", "{:?}", first.frame);
    let mut again = Client::connect(&server.socket(), &client_id).await.unwrap();
    let retry = request_as(&mut again, &start, &fresh_request_id()).await;
    assert_eq!(retry.outcome, "adopted", "{:?}", retry.frame);
    assert_eq!(retry.receipt, first.receipt);
    let mut changed = start.clone();
    changed.payload["input"] = json!({"n": 2});
    let conflict = request_as(&mut again, &changed, &fresh_request_id()).await;
    assert_eq!(conflict.outcome, "conflict");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM runs", []), 1);
    let run_id = first.receipt.unwrap()["runId"].as_str().unwrap().to_owned();
    let other_run = started(&mut client, &script).await;

    // Both runs are running their slow first node (their revisions hold
    // still until something is done to them).
    for run in [&run_id, &other_run] {
        wait_view(&mut client, run, Duration::from_secs(10), |view| {
            view["display"]["currentNode"] == "a" && view["status"]["queue"] == "running"
        })
        .await;
    }
    wait_for(
        Duration::from_secs(10),
        "node a to start in both runs",
        || {
            let started = count(
                &db,
                "SELECT COUNT(*) FROM events WHERE kind = 'nodeStarted'",
                [],
            );
            (started == 2).then_some(())
        },
    )
    .await;

    let paused = receipts_of(&server, &client_id, "run.pause", &run_id, &other_run).await;
    assert_eq!(paused["status"], "running");
    let view = wait_view(&mut client, &run_id, Duration::from_secs(10), |view| {
        status(view) == "paused"
    })
    .await;
    assert_eq!(view["status"]["paused"], true);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind = 'paused'",
            [&run_id]
        ),
        1,
        "paused once"
    );

    receipts_of(&server, &client_id, "run.resume", &run_id, &other_run).await;
    wait_view(&mut client, &run_id, Duration::from_secs(10), |view| {
        view["status"]["paused"] == false && view["status"]["queue"] == "running"
    })
    .await;
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind = 'resumed'",
            [&run_id]
        ),
        1,
        "resumed once"
    );

    let cancelled = receipts_of(&server, &client_id, "run.cancel", &run_id, &other_run).await;
    assert_eq!(cancelled["status"], "cancelled");
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "cancelled");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind = 'cancelled'",
            [&run_id]
        ),
        1,
        "cancelled once"
    );
    // The other run was never touched by the conflicting requests.
    assert_eq!(
        count(
            &db,
            "SELECT paused FROM runs WHERE run_id = ?1",
            [&other_run]
        ),
        0
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind IN ('paused', 'resumed', 'cancelled')",
            [&other_run]
        ),
        0
    );
}

/// A client that reconnects (same client id) and sends a *new* command must
/// not collide with the request ids of its earlier connection: request ids
/// name one transport attempt. Were they numbered `<clientId>-r1`, `-r2`, …
/// per connection, the second connection's first command would reuse
/// `<clientId>-r1` with another payload and get `conflict`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnected_client_gets_fresh_request_ids_for_new_commands() {
    let server = TestServer::start();
    let script = slow_script(&server);
    let mut first = Client::connect(&server.socket(), "cli").await.unwrap();
    let one = start_run(&mut first, &script).await;
    assert_eq!(one.outcome, "accepted", "{:?}", one.frame);
    drop(first);
    let mut second = Client::connect(&server.socket(), "cli").await.unwrap();
    let two = start_run(&mut second, &script).await;
    assert_eq!(
        two.outcome, "accepted",
        "a new command was refused: {:?}",
        two.frame
    );
}

/// A command that names an `expectedRevision` other than the run's is
/// refused `staleRevision` (the kernel's `run::check_revision`) and changes
/// nothing; naming the current revision executes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_with_a_stale_expected_revision_is_refused_and_changes_nothing() {
    let server = TestServer::start();
    let script = slow_script(&server);
    let db = server.db();
    let mut client = Client::connect(&server.socket(), "stale").await.unwrap();
    let run_id = started(&mut client, &script).await;
    wait_view(&mut client, &run_id, Duration::from_secs(10), |view| {
        view["display"]["currentNode"] == "a" && view["status"]["queue"] == "running"
    })
    .await;
    wait_for(Duration::from_secs(10), "node a to start", || {
        let started = count(
            &db,
            "SELECT COUNT(*) FROM events WHERE kind = 'nodeStarted'",
            [],
        );
        (started == 1).then_some(())
    })
    .await;
    let revision = revision_of(&db, &run_id);
    let mut stale = RequestSpec::command("run.pause", Some(&run_id), json!({}));
    stale.expected_revision = Some(revision as u64 + 7);
    let refused = request_as(&mut client, &stale, &fresh_request_id()).await;
    assert_eq!(refused.outcome, "rejected", "{:?}", refused.frame);
    assert_eq!(
        refused.error_code.as_deref(),
        Some("staleRevision"),
        "{:?}",
        refused.frame
    );
    assert_eq!(
        revision_of(&db, &run_id),
        revision,
        "a refusal changes nothing"
    );
    assert_eq!(
        count(&db, "SELECT paused FROM runs WHERE run_id = ?1", [&run_id]),
        0
    );
    let mut current = RequestSpec::command("run.pause", Some(&run_id), json!({}));
    current.expected_revision = Some(revision as u64);
    let paused = request_as(&mut client, &current, &fresh_request_id()).await;
    assert_eq!(paused.outcome, "accepted", "{:?}", paused.frame);
}

/// Request ids are scoped by client: two clients that both number their
/// requests `r1`, `r2`, … (as PROTOCOL.md's example does) each get their own
/// commands executed; within one client, a request id reused for another
/// command still conflicts, and an exact resend still adopts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_that_number_their_requests_alike_do_not_conflict() {
    let server = TestServer::start();
    let script = slow_script(&server);
    let start = |input: u32| {
        RequestSpec::command(
            "run.start",
            None,
            json!({ "workflow": script.to_string_lossy(), "input": {"n": input}, "executionMode": "headless", "projectPath": "/tmp" }),
        )
    };
    let mut alice = Client::connect(&server.socket(), "alice").await.unwrap();
    let mut bob = Client::connect(&server.socket(), "bob").await.unwrap();
    let mut sent = Vec::new();
    for (request_id, input) in [("r1", 1), ("r2", 2)] {
        for client in [&mut alice, &mut bob] {
            let spec = start(input);
            let response = request_as(client, &spec, request_id).await;
            assert_eq!(
                response.outcome,
                "accepted",
                "{} {request_id}: {:?}",
                client.client_id(),
                response.frame
            );
            sent.push((spec, response.receipt.unwrap()["runId"].clone()));
        }
    }
    let mut runs: Vec<String> = sent.iter().map(|(_, run)| run.to_string()).collect();
    runs.sort();
    runs.dedup();
    assert_eq!(runs.len(), 4, "four commands, four runs");
    assert_eq!(count(&server.db(), "SELECT COUNT(*) FROM runs", []), 4);

    // Within one client a request id still names one command.
    let (bob_first, bob_run) = &sent[1];
    let resent = request_as(&mut bob, bob_first, "r1").await;
    assert_eq!(resent.outcome, "adopted", "{:?}", resent.frame);
    assert_eq!(resent.receipt.unwrap()["runId"], *bob_run);
    let reused = request_as(&mut bob, &start(1), "r1").await;
    assert_eq!(
        reused.outcome, "conflict",
        "another command under a used request id: {:?}",
        reused.frame
    );
    assert_eq!(count(&server.db(), "SELECT COUNT(*) FROM runs", []), 4);
}

// ---- frames ----------------------------------------------------------------

/// A raw connection that said hello.
async fn raw_connection(server: &TestServer) -> UnixStream {
    let mut stream = UnixStream::connect(server.socket()).await.unwrap();
    let hello = json!({
        "schema": "pi-workflows.client.v1", "type": "hello", "role": "client",
        "clientId": "raw", "protocolVersion": 1, "packageVersion": server::wire::PACKAGE_VERSION,
    });
    let mut bytes = protocol::canonicalize(&hello).unwrap();
    bytes.push(b'\n');
    stream.write_all(&bytes).await.unwrap();
    stream
}

/// Writes `bytes` (concurrently: the server may stop reading) and returns
/// every line the server sends until it closes the connection.
async fn send_and_collect(stream: UnixStream, bytes: Vec<u8>) -> Vec<Vec<u8>> {
    let (read, mut write) = stream.into_split();
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&bytes).await;
        // Keep the write half open until the server closes.
        write
    });
    let mut reader = BufReader::new(read);
    let mut lines = Vec::new();
    let collected = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let mut line = Vec::new();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => lines.push(line),
            }
        }
    })
    .await;
    assert!(collected.is_ok(), "the server did not close the connection");
    drop(writer);
    lines
}

fn canonical_line(value: &Value) -> Vec<u8> {
    let mut bytes = protocol::canonicalize(value).unwrap();
    bytes.push(b'\n');
    bytes
}

fn status_request(request_id: &str) -> Value {
    json!({
        "schema": "pi-workflows.client.v1", "type": "request", "requestId": request_id,
        "clientId": "raw", "operation": "server.status", "payload": {},
    })
}

/// Every bad frame gets exactly one bounded error frame naming the first
/// failing stage, then only that connection closes; a second client keeps
/// working throughout (its status reads and a run succeed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_frame_gets_one_bounded_error_and_closes_only_its_connection() {
    let server = TestServer::start();
    let mut bystander = server.client().await;
    let script = script("linear.json");
    let run_id = started(&mut bystander, &script).await;

    let mut oversized = br#"{"a":""#.to_vec();
    oversized.resize(protocol::MAX_FRAME_BYTES, b'x');
    oversized.extend_from_slice(b"\"}\n");
    assert!(oversized.len() > protocol::MAX_FRAME_BYTES);
    let mut crlf = canonical_line(&status_request("crlf"));
    crlf.pop();
    crlf.extend_from_slice(b"\r\n");
    let mut bom = "\u{feff}".as_bytes().to_vec();
    bom.extend(canonical_line(&status_request("bom")));
    let mut unknown = status_request("unknown");
    unknown["colour"] = json!("blue");
    let unknown = canonical_line(&unknown);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("whitespace JSON", b"{\"a\": 1}\n".to_vec(), "nonCanonical"),
        ("1 MiB + 1 line", oversized, "frameTooLarge"),
        ("CR LF", crlf, "malformedFrame"),
        ("byte-order mark", bom, "nonCanonical"),
        ("unknown field", unknown, "schemaInvalid"),
    ];
    for (what, bytes, code) in cases {
        let stream = raw_connection(&server).await;
        // A valid request before the bad frame is still answered.
        let mut valid = canonical_line(&status_request("before"));
        valid.extend(bytes);
        let lines = send_and_collect(stream, valid).await;
        let frames: Vec<Value> = lines
            .iter()
            .map(|line| {
                assert!(
                    line.len() <= 2048,
                    "{what}: an unbounded frame ({} bytes)",
                    line.len()
                );
                let decoded = protocol::decode_client_frame(line).unwrap_or_else(|error| {
                    panic!("{what}: the server sent an invalid frame: {error}")
                });
                serde_json::to_value(&decoded.message).unwrap()
            })
            .collect();
        let errors: Vec<&Value> = frames
            .iter()
            .filter(|frame| frame["type"] == "event")
            .collect();
        assert_eq!(
            errors.len(),
            1,
            "{what}: exactly one error frame: {frames:?}"
        );
        let event = &errors[0]["event"];
        assert_eq!(event["kind"], "availability", "{what}");
        assert_eq!(event["state"], "unavailable", "{what}");
        let reason = event["reason"].as_str().unwrap();
        assert!(reason.starts_with(code), "{what}: {reason}");
        assert!(reason.chars().count() <= 512, "{what}");
        assert!(
            frames
                .iter()
                .any(|frame| frame["type"] == "response" && frame["requestId"] == "before"),
            "{what}: the valid request before the bad frame was answered: {frames:?}"
        );
        // The other client is unaffected.
        let status = bystander
            .request(&RequestSpec::read("server.status", None, json!({})))
            .await
            .expect("the other connection still works");
        assert_eq!(status.outcome, "accepted", "{what}");
    }
    // A bad first frame (before any hello) is refused the same way.
    let stream = UnixStream::connect(server.socket()).await.unwrap();
    let lines = send_and_collect(stream, b"\x00\x01garbage\n".to_vec()).await;
    let last: Value = serde_json::from_slice(lines.last().unwrap()).unwrap();
    assert_eq!(last["event"]["state"], "unavailable");
    // The bystander's run completed while all of this happened.
    let view = wait_settled(&mut bystander, &run_id).await;
    assert_eq!(status(&view), "completed");
}
