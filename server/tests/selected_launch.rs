//! Selected launch (DEFERRED_TURNS "Selected launch and restart",
//! `kernel::launch`, `selected_launches`) through the real socket: the model
//! turn a failed run's terminal message opened reserves one launch — here a
//! restart — recorded with the message's intent, the tool call and the
//! request fingerprint, and held (not admitted) until `run.activate`; the
//! same tool call adopts that run (even under another idempotency key, so
//! not by the command receipt); any other launch from the same intent — a
//! second restart, or a start of another workflow — is refused `conflict`
//! and creates no run; a message that opened no decision turn selects
//! nothing. The tests play the Pi extension's coordinator against a real
//! server and the scripted runner.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use serde_json::{Value, json};
use std::time::Duration;
use support::*;

fn fails_script(server: &TestServer) -> std::path::PathBuf {
    write_script(
        server.scratch(),
        "fails.json",
        &json!({
            "workflowName": "fails",
            "topology": {"startAt": "a", "nodes": [
                {"id": "a", "nodeType": "compute", "timeout": {"kind": "none"}, "mountPath": []}],
                "edges": [], "mounts": []},
            "nodes": {"a": [{"fail": "boom"}]}
        }),
    )
}

async fn send(
    client: &mut Client,
    operation: &str,
    run_id: Option<&str>,
    payload: Value,
) -> Response {
    client
        .request(&RequestSpec::command(operation, run_id, payload))
        .await
        .unwrap()
}

fn runs_of_session(server: &TestServer, session: &str) -> i64 {
    count(
        &server.db(),
        "SELECT COUNT(*) FROM run_bindings WHERE origin_session_id = ?1",
        [session],
    )
}

/// (intent, tool call, run) of every stored selected launch.
fn selected_launches(server: &TestServer) -> Vec<(String, String, String)> {
    let db = server.db();
    let mut statement = db
        .prepare(
            "SELECT intent_id, tool_call_id, run_id FROM selected_launches ORDER BY created_at_ms",
        )
        .unwrap();
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A failed run's decision turn restarts it once: held until activated,
/// adopted by the same tool call, and every other launch of the turn is
/// refused; a message not yet sent selects nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_turn_reserves_one_held_launch_adopts_its_tool_call_and_refuses_any_other() {
    const SESSION: &str = "session-selected-launch";
    let server = TestServer::start();
    let mut client = server.client().await;
    let failing = fails_script(&server);
    let failed = started_interactive(&mut client, &failing, SESSION, json!({"n": 1})).await;
    assert_eq!(status(&wait_settled(&mut client, &failed).await), "failed");
    let terminal = wait_terminal_message(&server, &failed).await;
    let intent: String = server
        .db()
        .query_row(
            "SELECT intent_id FROM turn_intents WHERE message_id = ?1",
            [&terminal],
            |row| row.get(0),
        )
        .unwrap();
    let restart = |tool_call: &str| json!({"selectedLaunch": {"messageId": terminal, "toolCallId": tool_call}});

    // Not sent yet: the message opened no turn, so it selects nothing.
    let early = send(
        &mut client,
        "run.restart",
        Some(&failed),
        restart("tc-early"),
    )
    .await;
    assert_eq!(early.outcome, "rejected", "{:?}", early.frame);
    assert_eq!(early.error_code.as_deref(), Some("illegalTransition"));

    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    assert_eq!(
        coordinator.next(&mut client).await.as_deref(),
        Some(terminal.as_str())
    );
    coordinator.branch(&mut client, &[&terminal], false).await;
    coordinator
        .turn(&mut client, &terminal, &failed, "turn-decision", "start")
        .await;

    let first = send(&mut client, "run.restart", Some(&failed), restart("tc-1")).await;
    assert_eq!(first.outcome, "accepted", "{:?}", first.frame);
    let new_run = first.receipt.as_ref().unwrap()["newRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        selected_launches(&server),
        [(intent.clone(), "tc-1".to_owned(), new_run.clone())],
        "the reservation names the intent, the tool call and the run"
    );

    // The same tool call again, under another idempotency key: the kernel
    // adopts the reserved run (no second run).
    let again = send(&mut client, "run.restart", Some(&failed), restart("tc-1")).await;
    assert_eq!(again.outcome, "accepted", "{:?}", again.frame);
    assert_eq!(again.receipt.as_ref().unwrap()["newRunId"], json!(new_run));

    // Another launch of the same turn: a second restart, a start of another
    // workflow, the same tool call with another request — all refused.
    let second = send(&mut client, "run.restart", Some(&failed), restart("tc-2")).await;
    assert_eq!(second.outcome, "rejected", "{:?}", second.frame);
    assert_eq!(second.error_code.as_deref(), Some("conflict"));
    assert!(
        second
            .error_message
            .as_deref()
            .unwrap_or_default()
            .contains("already selected its one launch"),
        "{:?}",
        second.frame
    );
    let other = json!({ "workflow": script("linear.json").to_string_lossy(), "input": {}, "projectPath": "/tmp",
                        "executionMode": "interactive", "originSessionId": SESSION,
                        "selectedLaunch": {"messageId": terminal, "toolCallId": "tc-3"} });
    let start = send(&mut client, "run.start", None, other.clone()).await;
    assert_eq!(start.outcome, "rejected", "{:?}", start.frame);
    assert_eq!(start.error_code.as_deref(), Some("conflict"));
    let mut reused = other;
    reused["selectedLaunch"]["toolCallId"] = json!("tc-1");
    let reused = send(&mut client, "run.start", None, reused).await;
    assert_eq!(reused.outcome, "rejected", "{:?}", reused.frame);
    assert_eq!(reused.error_code.as_deref(), Some("conflict"));
    assert_eq!(
        runs_of_session(&server, SESSION),
        2,
        "one failed run and its one restart"
    );
    assert_eq!(selected_launches(&server).len(), 1);

    // Held: not admitted while the turn is open (and after it, until the
    // extension activates it at settle).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = view(&mut client, &new_run).await;
    assert_eq!(status(&held), "queued", "{held}");
    assert!(
        held["display"]["controls"]
            .as_array()
            .unwrap()
            .contains(&json!("activate")),
        "{held}"
    );
    coordinator
        .turn(&mut client, &terminal, &failed, "turn-decision", "end")
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status(&view(&mut client, &new_run).await), "queued");

    // agent_settled: the extension activates it, once; it runs (and fails
    // the same way, so it cannot restart again).
    let activated = send(&mut client, "run.activate", Some(&new_run), json!({})).await;
    assert_eq!(activated.outcome, "accepted", "{:?}", activated.frame);
    let again = send(&mut client, "run.activate", Some(&new_run), json!({})).await;
    assert_eq!(again.outcome, "rejected", "{:?}", again.frame);
    assert_eq!(status(&wait_settled(&mut client, &new_run).await), "failed");
    let refused = send(&mut client, "run.restart", Some(&new_run), json!({})).await;
    assert_eq!(
        refused.error_code.as_deref(),
        Some("restartRefused"),
        "{:?}",
        refused.frame
    );
    assert!(
        refused
            .error_message
            .as_deref()
            .unwrap_or_default()
            .contains("same failure"),
        "{:?}",
        refused.frame
    );
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}

/// A decision turn may start another workflow instead: the start is held,
/// recorded against the intent, and a restart from the same turn is then
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_turn_may_start_another_workflow_instead_and_then_restart_nothing() {
    const SESSION: &str = "session-selected-start";
    let server = TestServer::start();
    let mut client = server.client().await;
    let failing = fails_script(&server);
    let failed = started_interactive(&mut client, &failing, SESSION, json!({})).await;
    assert_eq!(status(&wait_settled(&mut client, &failed).await), "failed");
    let terminal = wait_terminal_message(&server, &failed).await;
    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    coordinator.branch(&mut client, &[&terminal], false).await;
    coordinator
        .turn(&mut client, &terminal, &failed, "turn-decision", "start")
        .await;
    let payload = json!({ "workflow": script("linear.json").to_string_lossy(), "input": {}, "projectPath": "/tmp",
                          "executionMode": "interactive", "originSessionId": SESSION,
                          "selectedLaunch": {"messageId": terminal, "toolCallId": "tc-start"} });
    let started = send(&mut client, "run.start", None, payload.clone()).await;
    assert_eq!(started.outcome, "accepted", "{:?}", started.frame);
    let run_id = started.receipt.as_ref().unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let adopted = send(&mut client, "run.start", None, payload).await;
    assert_eq!(adopted.outcome, "accepted", "{:?}", adopted.frame);
    assert_eq!(adopted.receipt.as_ref().unwrap()["runId"], json!(run_id));
    let restart = send(
        &mut client,
        "run.restart",
        Some(&failed),
        json!({"selectedLaunch": {"messageId": terminal, "toolCallId": "tc-restart"}}),
    )
    .await;
    assert_eq!(
        restart.error_code.as_deref(),
        Some("conflict"),
        "{:?}",
        restart.frame
    );
    assert_eq!(runs_of_session(&server, SESSION), 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status(&view(&mut client, &run_id).await), "queued", "held");
    coordinator
        .turn(&mut client, &terminal, &failed, "turn-decision", "end")
        .await;
    let activated = send(&mut client, "run.activate", Some(&run_id), json!({})).await;
    assert_eq!(activated.outcome, "accepted", "{:?}", activated.frame);
    assert_eq!(
        status(&wait_settled(&mut client, &run_id).await),
        "completed"
    );
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}

/// A reservation whose answer never reached the tool call (the server died
/// after the restart's receipt committed, before its reply:
/// `after_receipt`), and whose decision turn and coordinator epoch are gone
/// with that server: the reservation survives the restart held — startup
/// recovery admits nothing — and a new session start finds it. The
/// repeated tool call adopts it (no second run); any other launch from the
/// same intent is refused; activation succeeds once (a second activation,
/// e.g. the old Pi's late one, is refused) and the run is admitted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whose_answer_was_lost_survives_the_crash_and_is_adopted_and_activated_once()
{
    const SESSION: &str = "session-selected-lost-answer";
    // The first receipt is run.start's, the second the restart's.
    let mut server = TestServer::new(&[("PI_WORKFLOWS_FAULT", "after_receipt:2")]);
    server.spawn().expect("the server starts");
    let failing = fails_script(&server);
    let (failed, terminal) = {
        let mut client = server.client().await;
        let failed = started_interactive(&mut client, &failing, SESSION, json!({"n": 1})).await;
        assert_eq!(status(&wait_settled(&mut client, &failed).await), "failed");
        let terminal = wait_terminal_message(&server, &failed).await;
        let coordinator = Coordinator::connect(&mut client, SESSION).await;
        assert_eq!(
            coordinator.next(&mut client).await.as_deref(),
            Some(terminal.as_str())
        );
        coordinator.branch(&mut client, &[&terminal], false).await;
        coordinator
            .turn(&mut client, &terminal, &failed, "turn-decision", "start")
            .await;
        let lost = client
            .request(&RequestSpec::command(
                "run.restart",
                Some(&failed),
                json!({"selectedLaunch": {"messageId": terminal, "toolCallId": "tc-1"}}),
            ))
            .await;
        assert!(lost.is_err(), "no reply: the server died after the commit");
        (failed, terminal)
    };
    assert!(
        server.wait_exit(Duration::from_secs(20)),
        "the server did not stop after the restart's receipt"
    );
    let reserved = selected_launches(&server);
    assert_eq!(reserved.len(), 1, "the reservation committed: {reserved:?}");
    let (intent, tool_call, new_run) = reserved[0].clone();
    assert_eq!(tool_call, "tc-1");
    let intent_of_message: String = server
        .db()
        .query_row(
            "SELECT intent_id FROM turn_intents WHERE message_id = ?1",
            [&terminal],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(intent, intent_of_message);

    server.remove_env("PI_WORKFLOWS_FAULT");
    server.spawn().expect("the server restarts");
    let mut client = server.client().await;
    // Queue recovery keeps it held: nothing admits it before activation.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = view(&mut client, &new_run).await;
    assert_eq!(status(&held), "queued", "{held}");
    assert!(
        held["display"]["controls"]
            .as_array()
            .unwrap()
            .contains(&json!("activate")),
        "{held}"
    );
    let admitted = || {
        count(
            &server.db(),
            "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind = 'admitted'",
            [&new_run],
        )
    };
    assert_eq!(admitted(), 0, "held across the restart");

    // The new session start: the repeated tool call adopts the reservation.
    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    let restart = |tool_call: &str| json!({"selectedLaunch": {"messageId": terminal, "toolCallId": tool_call}});
    let again = send(&mut client, "run.restart", Some(&failed), restart("tc-1")).await;
    assert_eq!(again.outcome, "accepted", "{:?}", again.frame);
    assert_eq!(again.receipt.as_ref().unwrap()["newRunId"], json!(new_run));
    let other = send(&mut client, "run.restart", Some(&failed), restart("tc-2")).await;
    assert_eq!(other.outcome, "rejected", "{:?}", other.frame);
    assert_eq!(other.error_code.as_deref(), Some("conflict"));
    let start = send(
        &mut client,
        "run.start",
        None,
        json!({ "workflow": script("linear.json").to_string_lossy(), "input": {}, "projectPath": "/tmp",
                "executionMode": "interactive", "originSessionId": SESSION,
                "selectedLaunch": {"messageId": terminal, "toolCallId": "tc-3"} }),
    )
    .await;
    assert_eq!(start.outcome, "rejected", "{:?}", start.frame);
    assert_eq!(start.error_code.as_deref(), Some("conflict"));
    assert_eq!(
        runs_of_session(&server, SESSION),
        2,
        "one run and its one restart"
    );
    assert_eq!(selected_launches(&server).len(), 1);

    // Activated once: the new session's activation, then a late second one.
    let activated = send(&mut client, "run.activate", Some(&new_run), json!({})).await;
    assert_eq!(activated.outcome, "accepted", "{:?}", activated.frame);
    let late = send(&mut client, "run.activate", Some(&new_run), json!({})).await;
    assert_eq!(late.outcome, "rejected", "{:?}", late.frame);
    assert_eq!(status(&wait_settled(&mut client, &new_run).await), "failed");
    assert_eq!(admitted(), 1, "admitted once");
    drop(coordinator);
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}
