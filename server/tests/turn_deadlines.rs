//! Interactive node deadlines are model-turn time (recovery step 8): the
//! node timeout of an origin-session request counts only while a reported
//! model turn of its step runs from the session's connected coordinator.
//! Waiting for delivery, a closed connection and server downtime consume
//! none of it; a spent budget takes one control claim and the timeout path
//! (a `$result.outcome` edge, or the end of the run).
//!
//! The tests play the Pi extension's part over the real socket
//! (`sessionView.get {coordinate: true}`, `workflowMessage.reportBranch`,
//! `workflowTurn.report`) against a real server and the scripted runner.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::*;

/// The node timeout of `ask`, in model-turn time.
const BUDGET_MS: u64 = 1_500;

/// `ask` (an agent step in the origin session, `BUDGET_MS` timeout); with
/// `routed`, a `$result.outcome` switch sends a timeout to `late`.
fn ask_script(server: &TestServer, routed: bool) -> std::path::PathBuf {
    let mut nodes = vec![json!({"id": "ask", "nodeType": "agent",
                                 "timeout": {"kind": "ms", "ms": BUDGET_MS}, "mountPath": []})];
    let mut edges = Vec::new();
    if routed {
        nodes.push(json!({"id": "done", "nodeType": "compute", "timeout": {"kind": "default"}, "mountPath": []}));
        nodes.push(json!({"id": "late", "nodeType": "compute", "timeout": {"kind": "default"}, "mountPath": []}));
        edges.push(
            json!({"kind": "switch", "from": "ask", "on": "$result.outcome",
                          "cases": {"ok": "done", "timed_out": "late"}}),
        );
    }
    write_script(
        server.scratch(),
        if routed {
            "ask-routed.json"
        } else {
            "ask.json"
        },
        &json!({
            "workflowName": "ask",
            "topology": {"startAt": "ask", "nodes": nodes, "edges": edges, "mounts": []},
            "nodes": {"ask": [{"interact": {"prompt": "Write it."}}],
                      "late": [{"finish": {"late": true}}]}
        }),
    )
}

/// The request's turn clock as stored: (budget, consumed, running since).
fn clock(server: &TestServer, run_id: &str) -> (Option<i64>, i64, Option<i64>) {
    server
        .db()
        .query_row(
            "SELECT clock_budget_ms, clock_consumed_ms, clock_running_since_ms
             FROM interactive_requests WHERE run_id = ?1",
            [run_id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .expect("the run's request")
}

fn run_status(server: &TestServer, run_id: &str) -> String {
    server
        .db()
        .query_row(
            "SELECT status FROM runs WHERE run_id = ?1",
            [run_id],
            |row| row.get(0),
        )
        .unwrap()
}

/// Becomes the session's coordinator: its epoch and the pending step message id.
async fn coordinate(client: &mut Client, session: &str) -> (Value, String) {
    let view = client
        .request(&RequestSpec::read(
            "sessionView.get",
            None,
            json!({ "sessionId": session, "coordinate": true }),
        ))
        .await
        .unwrap();
    assert_eq!(view.outcome, "accepted", "{:?}", view.frame);
    let receipt = view.receipt.unwrap();
    let step = receipt["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|message| message["kind"] == "step")
        .unwrap_or_else(|| panic!("a step message: {receipt}"))["messageId"]
        .as_str()
        .unwrap()
        .to_owned();
    (receipt["coordinatorEpoch"].clone(), step)
}

/// Reports Pi's busy branch showing the step message.
async fn report_busy_branch(client: &mut Client, session: &str, epoch: &Value, step: &str) {
    let response = client
        .request(&RequestSpec::read(
            "workflowMessage.reportBranch",
            None,
            json!({ "sessionId": session, "coordinatorEpoch": epoch,
                    "entries": [{"messageId": step, "entryId": "entry-1"}],
                    "isIdle": false, "hasPendingMessages": false }),
        ))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
}

/// Reports the start of Pi's model turn `turn-1` on the step; its ownership.
async fn report_turn_start(
    client: &mut Client,
    session: &str,
    epoch: &Value,
    step: &str,
    run_id: &str,
) -> String {
    let response = client
        .request(&RequestSpec::read(
            "workflowTurn.report",
            None,
            json!({ "sessionId": session, "coordinatorEpoch": epoch, "messageId": step,
                    "runId": run_id, "turnId": "turn-1", "phase": "start" }),
        ))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.unwrap()["ownership"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Waits until the run is terminal.
async fn wait_terminal(client: &mut Client, run_id: &str) -> Value {
    wait_view(client, run_id, Duration::from_secs(30), |view| {
        matches!(
            status(view),
            "completed" | "failed" | "timed_out" | "cancelled"
        )
    })
    .await
}

/// A reconnected coordinator reports the busy branch and the open turn's
/// start again; the run then ends, no sooner than the `left_ms` of turn time
/// its clock kept. The run's final view.
async fn resume_until_terminal(
    client: &mut Client,
    session: &str,
    step: &str,
    run_id: &str,
    left_ms: i64,
) -> Value {
    let (epoch, _) = coordinate(client, session).await;
    report_busy_branch(client, session, &epoch, step).await;
    let resumed = Instant::now();
    assert_eq!(
        report_turn_start(client, session, &epoch, step, run_id).await,
        "active"
    );
    let view = wait_terminal(client, run_id).await;
    let took = resumed.elapsed().as_millis() as i64;
    assert!(
        took >= left_ms,
        "timed out {took} ms after the resume, with {left_ms} ms of turn time left"
    );
    view
}

async fn wait_waiting(client: &mut Client, run_id: &str) {
    let view = wait_settled(client, run_id).await;
    assert_eq!(status(&view), "waiting", "{view}");
}

/// The step is presented and waits far longer than its timeout: nothing is
/// consumed. A reported turn runs the clock; the coordinator's connection
/// closes mid-turn and the clock stops with the time it used; wall-clock
/// time past the original deadline consumes nothing more. A new connection
/// repeats the open turn's start, the clock runs again from what was left,
/// and only then does the step time out: one control claim, and the
/// `$result.outcome` edge routes the run to `late`, which completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_counts_only_reported_turn_time_and_a_disconnect_suspends_it() {
    const SESSION: &str = "session-deadline";
    let server = TestServer::start();
    let script = ask_script(&server, true);
    let mut client = server.client().await;
    let run_id = started_interactive(&mut client, &script, SESSION, json!({})).await;
    wait_waiting(&mut client, &run_id).await;
    let (budget, consumed, running) = clock(&server, &run_id);
    assert!(
        budget.is_some_and(|budget| budget > 0 && budget <= BUDGET_MS as i64),
        "the time left at the request: {budget:?}"
    );
    assert_eq!((consumed, running), (0, None), "no turn, no clock");
    let generation_before: i64 = server
        .db()
        .query_row(
            "SELECT generation FROM leases WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();

    // Delivery and waiting: longer than the whole timeout, nothing consumed.
    tokio::time::sleep(Duration::from_millis(BUDGET_MS + 500)).await;
    assert_eq!(run_status(&server, &run_id), "waiting");
    assert_eq!(clock(&server, &run_id).1, 0);

    // A reported turn runs the clock; the connection closes mid-turn.
    let (epoch, step) = coordinate(&mut client, SESSION).await;
    report_busy_branch(&mut client, SESSION, &epoch, &step).await;
    let started = Instant::now();
    assert_eq!(
        report_turn_start(&mut client, SESSION, &epoch, &step, &run_id).await,
        "active"
    );
    assert!(
        clock(&server, &run_id).2.is_some(),
        "the turn runs the clock"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    drop(client);
    let suspended = wait_for(Duration::from_secs(10), "the clock to stop", || {
        let (_, consumed, running) = clock(&server, &run_id);
        running.is_none().then_some(consumed)
    })
    .await;
    let ran_ms = started.elapsed().as_millis() as i64;
    assert!(
        (350..=ran_ms).contains(&suspended),
        "the segment consumed {suspended} ms of the {ran_ms} ms it could have"
    );

    // A closed session: wall-clock time past the original deadline.
    tokio::time::sleep(Duration::from_millis(BUDGET_MS + 500)).await;
    assert_eq!(run_status(&server, &run_id), "waiting");
    assert_eq!(clock(&server, &run_id), (budget, suspended, None));

    // Pi reconnects, reports its branch and the open turn's start again.
    let mut client = server.client().await;
    let view = resume_until_terminal(
        &mut client,
        SESSION,
        &step,
        &run_id,
        budget.unwrap() - suspended,
    )
    .await;
    assert_eq!(status(&view), "completed", "{view}");
    let steps: Vec<(String, String)> = step_outcomes(&view);
    assert_eq!(
        steps,
        [("ask", "timed_out"), ("late", "ok")].map(|(n, o)| (n.to_owned(), o.to_owned())),
        "the $result.outcome edge routed the timeout: {view}"
    );
    let db = server.db();
    let control_claims = count(
        &db,
        "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind = 'controlClaimed'",
        [&run_id],
    );
    assert_eq!(control_claims, 1, "one control claim took the timeout path");
    let generation_after: i64 = db
        .query_row(
            "SELECT generation FROM leases WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    assert!(generation_after > generation_before);
    support::wait_quiescent(&db).await;
    assert_eq!(support::consistency_violations(&db), Vec::<String>::new());
}

/// The server is killed while a turn runs the clock: the next server stops
/// the clock at the killed server's last lease renewal, so its downtime
/// consumes nothing; the step waits past its wall-clock deadline until a
/// reconnected coordinator reports the turn, then times out, and without a
/// `$result.outcome` edge the run ends `timed_out`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_downtime_does_not_consume_the_deadline() {
    const SESSION: &str = "session-downtime";
    // Renewals every 100 ms: the last sign of life is close to the kill.
    let mut server = TestServer::start_with(&[("PI_WORKFLOWS_SERVER_LEASE_MS", "500")]);
    let script = ask_script(&server, false);
    let run_id;
    let step;
    let started;
    {
        let mut client = server.client().await;
        run_id = started_interactive(&mut client, &script, SESSION, json!({})).await;
        wait_waiting(&mut client, &run_id).await;
        let (epoch, message) = coordinate(&mut client, SESSION).await;
        step = message;
        report_busy_branch(&mut client, SESSION, &epoch, &step).await;
        started = Instant::now();
        assert_eq!(
            report_turn_start(&mut client, SESSION, &epoch, &step, &run_id).await,
            "active"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.kill();
    }
    let ran_ms = started.elapsed().as_millis() as i64;
    let (budget, _, running) = clock(&server, &run_id);
    assert!(
        running.is_some(),
        "the killed server left the clock running"
    );

    // Down for longer than the whole timeout.
    tokio::time::sleep(Duration::from_millis(BUDGET_MS + 500)).await;
    server.spawn().expect("the server restarts");
    let mut client = server.client().await;
    let (_, consumed, running) = clock(&server, &run_id);
    assert_eq!(running, None, "startup stops the clock");
    assert!(
        consumed <= ran_ms,
        "{consumed} ms consumed, more than the {ran_ms} ms the turn ran before the kill"
    );
    tokio::time::sleep(Duration::from_millis(BUDGET_MS + 500)).await;
    assert_eq!(
        run_status(&server, &run_id),
        "waiting",
        "no reported turn since the restart: nothing consumed"
    );

    let view = resume_until_terminal(
        &mut client,
        SESSION,
        &step,
        &run_id,
        budget.unwrap() - consumed,
    )
    .await;
    assert_eq!(status(&view), "timed_out", "{view}");
    let db = server.db();
    support::wait_quiescent(&db).await;
    assert_eq!(support::consistency_violations(&db), Vec::<String>::new());
}
