//! Follow-ups (`followUp.add`, `followUp.cancel`) through the real socket:
//! ordered per-session queues stored with receipts; a follow-up waits for
//! the final continuation outcome, its terminal turn, earlier follow-ups and
//! the release of the origin-session reservation; failure cancels pending
//! follow-ups. The tests play the Pi extension's coordinator
//! (`sessionView.get {coordinate: true}`, `workflowMessage.reportBranch`,
//! `workflowTurn.report`) against a real server and the scripted runner.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use serde_json::json;
use support::*;

async fn add(client: &mut Client, run_id: &str, prompt: &str) -> Response {
    client
        .request(&RequestSpec::command(
            "followUp.add",
            Some(run_id),
            json!({ "prompt": prompt }),
        ))
        .await
        .unwrap()
}

fn follow_up_id(response: &Response) -> String {
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.as_ref().unwrap()["followUpId"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn cancel(client: &mut Client, follow_up_id: &str) -> Response {
    client
        .request(&RequestSpec::command(
            "followUp.cancel",
            None,
            json!({ "followUpId": follow_up_id }),
        ))
        .await
        .unwrap()
}

fn code(response: &Response) -> String {
    response.frame["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The stored follow-ups: (id, state, the run of its message), by position.
fn follow_ups(server: &TestServer, session: &str) -> Vec<(String, String, Option<String>)> {
    let db = server.db();
    let mut statement = db
        .prepare(
            "SELECT f.follow_up_id, f.state, m.run_id FROM workflow_follow_ups f
             LEFT JOIN workflow_messages m ON m.message_id = f.message_id
             WHERE f.session_id = ?1 ORDER BY f.position",
        )
        .unwrap();
    statement
        .query_map([session], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The message id of `follow_up_id`'s message.
fn message_of(server: &TestServer, follow_up_id: &str) -> String {
    server
        .db()
        .query_row(
            "SELECT message_id FROM workflow_follow_ups WHERE follow_up_id = ?1",
            [follow_up_id],
            |row| row.get(0),
        )
        .unwrap()
}

/// Follow-ups queued while a checkpoint waits stay queued (no message) until
/// the chain's final leaf — the continuation — completes; then they get
/// their messages on that leaf (none on the settled parent, a cancelled one
/// none at all). The coordinator is offered the leaf's terminal message
/// first, then the first follow-up only once the terminal turn ended, the
/// second only once the first one's turn ended; while another run of the
/// session holds its reservation, no follow-up is offered. A retried add
/// adopts its receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_wait_for_the_final_continuation_its_terminal_turn_earlier_follow_ups_and_the_reservation()
 {
    const SESSION: &str = "session-follow-ups";
    let server = TestServer::start();
    let mut client = server.client().await;
    let parent =
        started_interactive(&mut client, &script("checkpoint.json"), SESSION, json!({})).await;
    assert_eq!(status(&wait_settled(&mut client, &parent).await), "waiting");

    let spec = RequestSpec::command("followUp.add", Some(&parent), json!({"prompt": "first"}));
    let first = client.request(&spec).await.unwrap();
    let first = follow_up_id(&first);
    let retried = client.request(&spec).await.unwrap();
    assert_eq!(retried.outcome, "adopted", "{:?}", retried.frame);
    assert_eq!(
        retried.receipt.as_ref().unwrap()["followUpId"],
        json!(first),
        "a retry adopts its receipt"
    );
    let second = follow_up_id(&add(&mut client, &parent, "second").await);
    let dropped = follow_up_id(&add(&mut client, &parent, "dropped").await);
    assert_eq!(cancel(&mut client, &dropped).await.outcome, "accepted");
    assert_eq!(
        follow_ups(&server, SESSION),
        [
            (first.clone(), "queued".to_owned(), None),
            (second.clone(), "queued".to_owned(), None),
            (dropped.clone(), "cancelled".to_owned(), None),
        ],
        "no message while the chain runs"
    );

    let leaf = answered_checkpoint(&mut client, &parent).await;
    assert_eq!(status(&wait_settled(&mut client, &leaf).await), "completed");
    let terminal = wait_terminal_message(&server, &leaf).await;
    assert_eq!(
        follow_ups(&server, SESSION),
        [
            (first.clone(), "messaged".to_owned(), Some(leaf.clone())),
            (second.clone(), "messaged".to_owned(), Some(leaf.clone())),
            (dropped.clone(), "cancelled".to_owned(), None),
        ],
        "the continuation (the final leaf) carries the follow-ups"
    );
    assert_eq!(
        count(
            &server.db(),
            "SELECT COUNT(*) FROM workflow_messages WHERE run_id = ?1",
            [&parent],
        ),
        0,
        "the settled parent gets no terminal message and no follow-up"
    );
    let first_message = message_of(&server, &first);
    let second_message = message_of(&server, &second);

    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    assert_eq!(
        coordinator.next(&mut client).await.as_deref(),
        Some(terminal.as_str()),
        "the terminal message comes first"
    );
    coordinator.branch(&mut client, &[&terminal], false).await;
    assert_eq!(
        coordinator.next(&mut client).await,
        None,
        "the terminal message is sent and its first turn has not ended: no follow-up yet"
    );
    coordinator.run_turn(&mut client, &terminal, &leaf).await;

    // Another run of the session holds the reservation: nothing follows yet.
    let other =
        started_interactive(&mut client, &script("checkpoint.json"), SESSION, json!({})).await;
    assert_eq!(status(&wait_settled(&mut client, &other).await), "waiting");
    let offered = coordinator.next(&mut client).await;
    assert!(
        offered.as_ref() != Some(&first_message) && offered.as_ref() != Some(&second_message),
        "no follow-up while the session's reservation is held: {offered:?}"
    );
    let cancelled = client
        .request(&RequestSpec::command("run.cancel", Some(&other), json!({})))
        .await
        .unwrap();
    assert_eq!(cancelled.outcome, "accepted", "{:?}", cancelled.frame);
    assert_eq!(
        status(&wait_settled(&mut client, &other).await),
        "cancelled"
    );

    assert_eq!(
        coordinator.next(&mut client).await.as_deref(),
        Some(first_message.as_str()),
        "released: the first follow-up, before the later terminal message of the cancelled run"
    );
    coordinator
        .branch(&mut client, &[&terminal, &first_message], false)
        .await;
    coordinator
        .run_turn(&mut client, &first_message, &leaf)
        .await;
    assert_eq!(
        coordinator.next(&mut client).await.as_deref(),
        Some(second_message.as_str())
    );
    // Delivered follow-ups cannot be cancelled; the pending one can.
    let refused = cancel(&mut client, &first).await;
    assert_eq!(
        (refused.outcome.as_str(), code(&refused).as_str()),
        ("rejected", "illegalTransition"),
        "{:?}",
        refused.frame
    );
    assert_eq!(cancel(&mut client, &second).await.outcome, "accepted");
    let offered = coordinator.next(&mut client).await;
    assert_ne!(offered.as_deref(), Some(second_message.as_str()));
    assert_eq!(
        count(
            &server.db(),
            "SELECT COUNT(*) FROM workflow_messages WHERE message_id = ?1 AND state = 'cancelled'",
            [&second_message],
        ),
        1
    );
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}

/// A chain that fails cancels its queued follow-ups (no message), and a
/// follow-up of an ended chain, of a headless run, of an unknown run, and
/// the cancel of an unknown follow-up are refused with their codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_chain_cancels_its_follow_ups_and_nothing_follows_it() {
    const SESSION: &str = "session-follow-ups-failed";
    let server = TestServer::start();
    let gate = server.scratch().join("fail-now");
    let failing = write_script(
        server.scratch(),
        "fails.json",
        &json!({
            "workflowName": "fails",
            "topology": {"startAt": "a", "nodes": [
                {"id": "a", "nodeType": "compute", "timeout": {"kind": "none"}, "mountPath": []}],
                "edges": [], "mounts": []},
            "nodes": {"a": [{"awaitFile": gate.to_string_lossy(), "then": {"fail": "boom"}}]}
        }),
    );
    let mut client = server.client().await;
    let run_id = started_interactive(&mut client, &failing, SESSION, json!({})).await;
    let queued = follow_up_id(&add(&mut client, &run_id, "after it").await);
    std::fs::write(&gate, b"").unwrap();
    assert_eq!(status(&wait_settled(&mut client, &run_id).await), "failed");
    wait_terminal_message(&server, &run_id).await;
    assert_eq!(
        follow_ups(&server, SESSION),
        [(queued.clone(), "cancelled".to_owned(), None)]
    );
    assert_eq!(
        count(
            &server.db(),
            "SELECT COUNT(*) FROM workflow_messages WHERE kind = 'followUp'",
            [],
        ),
        0
    );

    let late = add(&mut client, &run_id, "too late").await;
    assert_eq!(
        (late.outcome.as_str(), code(&late).as_str()),
        ("rejected", "terminal"),
        "{:?}",
        late.frame
    );
    let headless = started(&mut client, &script("linear.json")).await;
    let refused = add(&mut client, &headless, "no session").await;
    assert_eq!(code(&refused), "noOriginSession", "{:?}", refused.frame);
    let unknown = add(&mut client, "no-such-run", "x").await;
    assert_eq!(unknown.outcome, "notFound", "{:?}", unknown.frame);
    let unknown = cancel(&mut client, "no-such-follow-up").await;
    assert_eq!(unknown.outcome, "notFound", "{:?}", unknown.frame);
    // Cancelling the cancelled follow-up again changes nothing.
    assert_eq!(cancel(&mut client, &queued).await.outcome, "accepted");
    assert_eq!(
        follow_ups(&server, SESSION),
        [(queued, "cancelled".to_owned(), None)]
    );
}
