//! Turn intents (DEFERRED_TURNS, `kernel::intent`, `turn_intents`) through
//! the real socket: every top-level interactive terminal run — only the
//! final leaf of a continuation chain — owns one intent, created from its
//! policy row and claimed by its terminal message in the transaction that
//! creates the message, before it can be sent; the message carries the
//! intent to the coordinator (`deferredTurn`), is sent once and opens one
//! turn, and a resolved intent never starts another, across a server
//! restart and a crash between the terminal commit and the message. No
//! intent comes from a pause, a headless run or a settled parent. The tests
//! play the Pi extension's coordinator against a real server and the
//! scripted runner.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::{Value, json};
use std::time::Duration;
use support::*;

/// The stored intents of `run_id`: (cause, eligible, stops by default,
/// claiming message).
fn intents(server: &TestServer, run_id: &str) -> Vec<(String, bool, bool, Option<String>)> {
    let db = server.db();
    let mut statement = db
        .prepare(
            "SELECT cause, eligible_at_ms IS NOT NULL, stops_by_default, message_id
             FROM turn_intents WHERE run_id = ?1 ORDER BY created_at_ms",
        )
        .unwrap();
    statement
        .query_map([run_id], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get::<_, i64>(2)? != 0,
                row.get(3)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn intent_id(server: &TestServer, run_id: &str) -> String {
    server
        .db()
        .query_row(
            "SELECT intent_id FROM turn_intents WHERE run_id = ?1",
            [run_id],
            |row| row.get(0),
        )
        .unwrap()
}

/// The session view's record of `message_id`.
async fn message_record(coordinator: &Coordinator, client: &mut Client, message_id: &str) -> Value {
    let view = coordinator.view(client).await;
    view["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|message| message["messageId"] == json!(message_id))
        .cloned()
        .unwrap_or_else(|| panic!("{message_id} is not in the session view: {view}"))
}

async fn command(client: &mut Client, operation: &str, run_id: &str) {
    let response = client
        .request(&RequestSpec::command(operation, Some(run_id), json!({})))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
}

/// A checkpoint chain that completes: the settled parent owns no intent, the
/// final leaf one `terminal` intent, eligible at once and claimed by its
/// terminal message; the coordinator is offered that message with the
/// intent and the card's fields, sends it once and runs its one turn; after
/// that nothing is offered again — not when the branch shows the message
/// absent while Pi is idle, not after a server restart — and the intent
/// stays the one it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_chain_leaf_owns_one_terminal_intent_its_message_claims_and_resolves_with_one_turn()
 {
    const SESSION: &str = "session-intent-completed";
    let mut server = TestServer::start();
    let mut client = server.client().await;
    let parent =
        started_interactive(&mut client, &script("checkpoint.json"), SESSION, json!({})).await;
    assert_eq!(status(&wait_settled(&mut client, &parent).await), "waiting");
    assert_eq!(
        intents(&server, &parent),
        [],
        "a waiting run owns no intent"
    );
    let leaf = answered_checkpoint(&mut client, &parent).await;
    assert_eq!(status(&wait_settled(&mut client, &leaf).await), "completed");
    let terminal = wait_terminal_message(&server, &leaf).await;
    assert_eq!(
        intents(&server, &leaf),
        [("terminal".to_owned(), true, false, Some(terminal.clone()))],
        "one eligible terminal intent, claimed by the terminal message"
    );
    assert_eq!(
        intents(&server, &parent),
        [],
        "the settled parent owns no intent"
    );
    let id = intent_id(&server, &leaf);
    assert!(id.starts_with("deferred-turn:") && id.len() == "deferred-turn:".len() + 64);

    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    assert_eq!(
        coordinator.next(&mut client).await.as_deref(),
        Some(terminal.as_str())
    );
    let record = message_record(&coordinator, &mut client, &terminal).await;
    assert_eq!(
        record["deferredTurn"],
        json!({
            "turnIntentId": id,
            "cause": "terminal",
            "stopsByDefault": false,
            "presentation": {"workflowName": "checkpoint", "state": "completed",
                             "restart": {"count": 0, "limit": 3}}
        }),
        "{record}"
    );
    coordinator.branch(&mut client, &[&terminal], false).await;
    assert_eq!(coordinator.next(&mut client).await, None, "sent once");
    coordinator.run_turn(&mut client, &terminal, &leaf).await;
    assert_eq!(
        count(
            &server.db(),
            "SELECT COUNT(*) FROM workflow_turns WHERE message_id = ?1",
            [&terminal],
        ),
        1,
        "one turn"
    );
    // Pi idle with the message gone from its branch: the resolved intent is
    // not offered again.
    coordinator.branch(&mut client, &[], true).await;
    assert_eq!(coordinator.next(&mut client).await, None);

    drop(client);
    server.stop();
    server.spawn().expect("the server restarts");
    let mut client = server.client().await;
    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    assert_eq!(
        coordinator.next(&mut client).await,
        None,
        "after a restart the resolved intent starts no turn"
    );
    assert_eq!(
        intents(&server, &leaf),
        [("terminal".to_owned(), true, false, Some(terminal.clone()))]
    );
    assert_eq!(
        count(&server.db(), "SELECT COUNT(*) FROM turn_intents", []),
        1
    );
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}

/// A pause creates no intent; a cancellation (`run.cancel`: a person's or
/// the model's — the server is not told which, so the kernel's `cancelled`
/// row applies) creates one `cancelled` intent that stops by default; a
/// failure one `failed` intent whose card names its reason; a headless run
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_creates_none_a_cancellation_stops_by_default_a_failure_names_its_reason_a_headless_run_none()
 {
    const SESSION: &str = "session-intent-ends";
    let server = TestServer::start();
    let gate = server.scratch().join("never");
    let gated = write_script(
        server.scratch(),
        "gated.json",
        &json!({
            "workflowName": "gated",
            "topology": {"startAt": "a", "nodes": [
                {"id": "a", "nodeType": "compute", "timeout": {"kind": "none"}, "mountPath": []}],
                "edges": [], "mounts": []},
            "nodes": {"a": [{"awaitFile": gate.to_string_lossy(), "then": {"finish": {}}}]}
        }),
    );
    let failing = write_script(
        server.scratch(),
        "fails.json",
        &json!({
            "workflowName": "fails",
            "topology": {"startAt": "a", "nodes": [
                {"id": "a", "nodeType": "compute", "timeout": {"kind": "none"}, "mountPath": []}],
                "edges": [], "mounts": []},
            "nodes": {"a": [{"fail": "boom"}]}
        }),
    );
    let mut client = server.client().await;

    let cancelled = started_interactive(&mut client, &gated, SESSION, json!({})).await;
    command(&mut client, "run.pause", &cancelled).await;
    wait_view(&mut client, &cancelled, SETTLE_TIMEOUT, |view| {
        view["display"]["status"] == "paused"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(intents(&server, &cancelled), [], "a pause creates none");
    command(&mut client, "run.cancel", &cancelled).await;
    assert_eq!(
        status(&wait_settled(&mut client, &cancelled).await),
        "cancelled"
    );
    let cancelled_message = wait_terminal_message(&server, &cancelled).await;
    assert_eq!(
        intents(&server, &cancelled),
        [(
            "cancelled".to_owned(),
            true,
            true,
            Some(cancelled_message.clone())
        )]
    );

    let failed = started_interactive(&mut client, &failing, SESSION, json!({})).await;
    assert_eq!(status(&wait_settled(&mut client, &failed).await), "failed");
    let failed_message = wait_terminal_message(&server, &failed).await;
    assert_eq!(
        intents(&server, &failed),
        [(
            "failed".to_owned(),
            true,
            false,
            Some(failed_message.clone())
        )]
    );

    let headless = started(&mut client, &script("linear.json")).await;
    assert_eq!(
        status(&wait_settled(&mut client, &headless).await),
        "completed"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(intents(&server, &headless), [], "a headless run owns none");

    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    let record = message_record(&coordinator, &mut client, &cancelled_message).await;
    assert_eq!(record["deferredTurn"]["cause"], "cancelled", "{record}");
    assert_eq!(record["deferredTurn"]["stopsByDefault"], true, "{record}");
    assert_eq!(record["deferredTurn"]["presentation"]["state"], "cancelled");
    let record = message_record(&coordinator, &mut client, &failed_message).await;
    assert_eq!(
        record["deferredTurn"]["presentation"],
        json!({"workflowName": "fails", "state": "failed", "reasonKind": "nodeFailed",
               "restart": {"count": 0, "limit": 3}}),
        "{record}"
    );
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}

/// The server dies after the terminal commit, before the terminal message
/// (`before_terminal_message`): the next server builds the message and its
/// one claimed intent, a third start neither, and the coordinator is offered
/// the message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_terminal_message_leaves_one_intent_claimed_by_the_message_built_at_startup()
 {
    const SESSION: &str = "session-intent-crash";
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
    assert_eq!(
        intents(&server, &run_id),
        [],
        "no intent before its message"
    );
    server.remove_env("PI_WORKFLOWS_FAULT");
    server.spawn().expect("the server restarts");
    let mut client = server.client().await;
    let terminal = format!("terminal:{run_id}");
    assert_eq!(
        intents(&server, &run_id),
        [("terminal".to_owned(), true, false, Some(terminal.clone()))]
    );
    drop(client);
    server.stop();
    server.spawn().expect("a third start");
    client = server.client().await;
    assert_eq!(
        count(&server.db(), "SELECT COUNT(*) FROM turn_intents", []),
        1
    );
    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    assert_eq!(
        coordinator.next(&mut client).await.as_deref(),
        Some(terminal.as_str())
    );
    coordinator.branch(&mut client, &[&terminal], false).await;
    coordinator.run_turn(&mut client, &terminal, &run_id).await;
    assert_eq!(coordinator.next(&mut client).await, None);
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}
