//! Turn intents (DEFERRED_TURNS, `kernel::intent`, `turn_intents`) through
//! the real socket: every top-level interactive terminal run — only the
//! final leaf of a continuation chain — owns one intent, created from its
//! policy row and claimed by its terminal message in the transaction that
//! creates the message, before it can be sent; the message carries the
//! intent to the coordinator (`deferredTurn`), is sent once and opens one
//! turn, and a resolved intent never starts another, across a server
//! restart and a crash between the terminal commit and the message. A
//! claim lost under an active workflow turn creates its intent ineligible,
//! and the new owner's terminal message reuses it. No
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

/// A pause creates no intent; a person's cancellation (`run.cancel` without
/// `by`) creates one `cancelled` intent that stops by default; a
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

/// A compute node `a` that runs `behaviour` with `timeout`.
fn one_node(
    server: &TestServer,
    name: &str,
    timeout: Value,
    behaviour: Value,
) -> std::path::PathBuf {
    write_script(
        server.scratch(),
        &format!("{name}.json"),
        &json!({
            "workflowName": name,
            "topology": {"startAt": "a", "nodes": [
                {"id": "a", "nodeType": "compute", "timeout": timeout, "mountPath": []}],
                "edges": [], "mounts": []},
            "nodes": {"a": [behaviour]}
        }),
    )
}

/// The model's cancel through the `workflow` tool (`run.cancel {by:
/// "agent"}`) creates the run's intent in the cancel's own transaction,
/// with its cause `agentCancelled`, stopping by default: the server dies
/// after that commit, before the terminal message (`before_terminal_message`),
/// and the intent is already stored, unclaimed; the next server's terminal
/// message reuses and claims it (no second intent), so the card names the
/// agent's cause. A person's cancel (`{}`) is `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_cancel_creates_its_agent_cancelled_intent_before_the_terminal_message_which_reuses_it()
 {
    const SESSION: &str = "session-intent-agent-cancel";
    let mut server = TestServer::new(&[("PI_WORKFLOWS_FAULT", "before_terminal_message:1")]);
    server.spawn().expect("the server starts");
    let gate = server.scratch().join("never");
    let gated = one_node(
        &server,
        "gated",
        json!({"kind": "none"}),
        json!({"awaitFile": gate.to_string_lossy(), "then": {"finish": {}}}),
    );
    let run_id = {
        let mut client = server.client().await;
        let run_id = started_interactive(&mut client, &gated, SESSION, json!({})).await;
        wait_view(&mut client, &run_id, SETTLE_TIMEOUT, |view| {
            view["display"]["status"] == "running"
        })
        .await;
        // The fault stops the server right after the cancel's commit: the
        // response may not arrive.
        let _ = client
            .request(&RequestSpec::command(
                "run.cancel",
                Some(&run_id),
                json!({"by": "agent"}),
            ))
            .await;
        run_id
    };
    assert!(
        server.wait_exit(Duration::from_secs(20)),
        "the server did not stop before the terminal message"
    );
    assert_eq!(
        intents(&server, &run_id),
        [("agentCancelled".to_owned(), true, true, None)],
        "stored with the cancellation, before any message"
    );
    server.remove_env("PI_WORKFLOWS_FAULT");
    server.spawn().expect("the server restarts");
    let mut client = server.client().await;
    let terminal = wait_terminal_message(&server, &run_id).await;
    assert_eq!(
        intents(&server, &run_id),
        [(
            "agentCancelled".to_owned(),
            true,
            true,
            Some(terminal.clone())
        )],
        "the terminal message reused and claimed the cancel's intent"
    );
    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    let record = message_record(&coordinator, &mut client, &terminal).await;
    assert_eq!(
        record["deferredTurn"]["cause"], "agentCancelled",
        "{record}"
    );
    assert_eq!(record["deferredTurn"]["stopsByDefault"], true, "{record}");
    assert_eq!(record["deferredTurn"]["presentation"]["state"], "cancelled");

    // A person's cancel (no `by`): `cancelled`, also stopping by default.
    let by_user = started_interactive(&mut client, &gated, SESSION, json!({})).await;
    wait_view(&mut client, &by_user, SETTLE_TIMEOUT, |view| {
        view["display"]["status"] == "running"
    })
    .await;
    command(&mut client, "run.cancel", &by_user).await;
    let message = wait_terminal_message(&server, &by_user).await;
    assert_eq!(
        intents(&server, &by_user),
        [("cancelled".to_owned(), true, true, Some(message))]
    );
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}

/// A node that outlives its timeout ends the interactive run `timed_out`:
/// one `timedOut` intent, eligible with the durable terminal state and
/// claimed by the terminal message, whose card names the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_run_owns_one_timed_out_intent_its_terminal_message_claims() {
    const SESSION: &str = "session-intent-timeout";
    let server = TestServer::start();
    let slow = one_node(
        &server,
        "slow",
        json!({"kind": "ms", "ms": 300}),
        json!({"stall": true}),
    );
    let mut client = server.client().await;
    let run_id = started_interactive(&mut client, &slow, SESSION, json!({})).await;
    assert_eq!(
        status(&wait_settled(&mut client, &run_id).await),
        "timed_out"
    );
    let terminal = wait_terminal_message(&server, &run_id).await;
    assert_eq!(
        intents(&server, &run_id),
        [("timedOut".to_owned(), true, false, Some(terminal.clone()))]
    );
    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    let record = message_record(&coordinator, &mut client, &terminal).await;
    assert_eq!(record["deferredTurn"]["cause"], "timedOut", "{record}");
    assert_eq!(
        record["deferredTurn"]["presentation"]["reasonKind"], "nodeTimedOut",
        "{record}"
    );
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}

/// A decision turn's selected launch whose activation fails — its runner
/// cannot load the workflow and reports the run failed before any node ran
/// — gets one `launchFailed` intent, created eligible with the failure and
/// claimed by its terminal message (the factual fallback), offered once. The
/// same failure of a run that was not a selected launch is plain `failed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selected_launch_whose_activation_fails_owns_one_launch_failed_intent_offered_once() {
    const SESSION: &str = "session-intent-launch-failed";
    let server = TestServer::start();
    let failing = one_node(
        &server,
        "fails",
        json!({"kind": "none"}),
        json!({"fail": "boom"}),
    );
    let unloadable = write_script(
        server.scratch(),
        "unloadable.json",
        &json!({
            "workflowName": "unloadable",
            "topology": {"startAt": "a", "nodes": [
                {"id": "a", "nodeType": "compute", "timeout": {"kind": "none"}, "mountPath": []}],
                "edges": [], "mounts": []},
            "startup": {"failBeforeReady": "the workflow no longer loads"},
            "nodes": {"a": [{"finish": {}}]}
        }),
    );
    let mut client = server.client().await;
    let failed = started_interactive(&mut client, &failing, SESSION, json!({})).await;
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
    let started = client
        .request(&RequestSpec::command(
            "run.start",
            None,
            json!({ "workflow": unloadable.to_string_lossy(), "input": {}, "projectPath": "/tmp",
                    "executionMode": "interactive", "originSessionId": SESSION,
                    "selectedLaunch": {"messageId": terminal, "toolCallId": "tc-start"} }),
        ))
        .await
        .unwrap();
    assert_eq!(started.outcome, "accepted", "{:?}", started.frame);
    let launched = started.receipt.as_ref().unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    coordinator
        .turn(&mut client, &terminal, &failed, "turn-decision", "end")
        .await;
    command(&mut client, "run.activate", &launched).await;
    assert_eq!(
        status(&wait_settled(&mut client, &launched).await),
        "failed"
    );
    let fallback = wait_terminal_message(&server, &launched).await;
    assert_eq!(
        intents(&server, &launched),
        [(
            "launchFailed".to_owned(),
            true,
            false,
            Some(fallback.clone())
        )],
        "created eligible with the durable failure, claimed by its fallback"
    );
    assert_eq!(
        count(
            &server.db(),
            "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1",
            [&launched],
        ),
        0,
        "no node ran"
    );
    coordinator.branch(&mut client, &[], true).await;
    assert_eq!(
        coordinator.next(&mut client).await.as_deref(),
        Some(fallback.as_str())
    );
    let record = message_record(&coordinator, &mut client, &fallback).await;
    assert_eq!(
        record["deferredTurn"],
        json!({
            "turnIntentId": intent_id(&server, &launched),
            "cause": "launchFailed",
            "stopsByDefault": false,
            "presentation": {"workflowName": "unloadable", "state": "failed",
                             "reasonKind": "runnerFailed", "restart": {"count": 0, "limit": 3}}
        }),
        "{record}"
    );
    coordinator.branch(&mut client, &[&fallback], false).await;
    coordinator
        .run_turn(&mut client, &fallback, &launched)
        .await;
    // Pi idle with the message gone from its branch: not offered again.
    coordinator.branch(&mut client, &[], true).await;
    assert_eq!(coordinator.next(&mut client).await, None, "offered once");

    // The same failure of a run the session started directly: `failed`.
    let direct = started_interactive(&mut client, &unloadable, SESSION, json!({})).await;
    assert_eq!(status(&wait_settled(&mut client, &direct).await), "failed");
    let message = wait_terminal_message(&server, &direct).await;
    assert_eq!(
        intents(&server, &direct),
        [("failed".to_owned(), true, false, Some(message))]
    );
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&server.db()), Vec::<String>::new());
}

/// Event policy row 7, "an active workflow turn loses its queue claim":
/// the agent's turn on step `a` is still open (it submitted, the output was
/// accepted, and the run went on to `b` under a new runner's claim) when
/// that runner stalls past its claim. The claim-expiry decision that fences
/// it and parks the run `recovered` for a new owner creates one `claimLost`
/// intent in its own transaction, ineligible and unclaimed. The new owner
/// continues the run to completion: the terminal message reuses that
/// intent (its cause stays), which becomes eligible only with the durable
/// terminal state; the run has one intent, one terminal message, one
/// successor turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_under_an_active_turn_owns_one_ineligible_intent_the_new_owners_terminal_message_reuses()
 {
    const SESSION: &str = "session-intent-claim-lost";
    let server = TestServer::start();
    let release = server.scratch().join("release");
    let script = write_script(
        server.scratch(),
        "handoff.json",
        &json!({
            "workflowName": "handoff",
            "topology": {"startAt": "a",
                         "nodes": [{"id": "a", "nodeType": "agent", "timeout": {"kind": "none"}, "mountPath": []},
                                   {"id": "b", "nodeType": "compute", "timeout": {"kind": "none"}, "mountPath": []}],
                         "edges": [{"kind": "plain", "from": "a", "to": "b"}], "mounts": []},
            "nodes": {"a": [{"interact": {"prompt": "Write it."}}],
                      "b": [{"ifFile": release.to_string_lossy(), "then": {"finish": {"b": "done"}},
                             "else": {"stall": true}}]},
            "validate": {}
        }),
    );
    let mut client = server.client().await;
    let run_id = started_interactive(&mut client, &script, SESSION, json!({})).await;
    wait_view(&mut client, &run_id, SETTLE_TIMEOUT, |view| {
        status(view) == "waiting"
    })
    .await;
    let coordinator = Coordinator::connect(&mut client, SESSION).await;
    let step = coordinator
        .next(&mut client)
        .await
        .expect("the step message is offered");
    coordinator.branch(&mut client, &[&step], false).await;
    coordinator
        .turn(&mut client, &step, &run_id, "turn-step", "start")
        .await;
    let (interaction_id, attempt_id): (String, String) = server
        .db()
        .query_row(
            "SELECT interaction_id, attempt_id FROM interactive_requests WHERE run_id = ?1 AND status = 'pending'",
            [&run_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("the run's pending interaction");
    let submitted = client
        .request(&RequestSpec::command(
            "interaction.submit",
            Some(&run_id),
            json!({"interactionId": interaction_id, "attemptId": attempt_id, "submissionId": "sub-1",
                   "output": {"a": "written"},
                   "authority": {"kind": "coordinator", "sessionId": SESSION,
                                 "coordinatorEpoch": coordinator.epoch}}),
        ))
        .await
        .unwrap();
    assert_eq!(submitted.outcome, "accepted", "{:?}", submitted.frame);

    // `b` runs under a new runner's claim while the agent's turn is open.
    let db = server.db();
    let (generation, runner) = wait_for(Duration::from_secs(20), "b's runner", || {
        let generation = db
            .query_row(
                "SELECT generation FROM node_attempts WHERE run_id = ?1 AND node_id = 'b'",
                [&run_id],
                |row| row.get::<_, i64>(0),
            )
            .ok()?;
        let identity = runner_identity(&db, &run_id, generation as u64)?;
        Some((generation, identity))
    })
    .await;
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM workflow_turns WHERE run_id = ?1 AND state = 'open'",
            [&run_id],
        ),
        1,
        "the agent's turn is still active"
    );
    assert_eq!(intents(&server, &run_id), [], "no intent while it runs");
    signal(&runner, nix::sys::signal::Signal::SIGSTOP);
    wait_for(
        Duration::from_secs(15),
        "the expired claim's handoff",
        || {
            (count(
                &db,
                "SELECT generation FROM leases WHERE run_id = ?1",
                [&run_id],
            ) > generation)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        intents(&server, &run_id),
        [("claimLost".to_owned(), false, false, None)],
        "created with the claim loss, ineligible while a new owner can continue"
    );
    assert_eq!(
        coordinator.next(&mut client).await,
        None,
        "nothing is offered while the run can continue"
    );

    // The new owner continues the run to its end.
    std::fs::write(&release, b"go").unwrap();
    signal(&runner, nix::sys::signal::Signal::SIGKILL);
    assert_eq!(
        status(&wait_settled(&mut client, &run_id).await),
        "completed"
    );
    let terminal = wait_terminal_message(&server, &run_id).await;
    assert_eq!(
        intents(&server, &run_id),
        [("claimLost".to_owned(), true, false, Some(terminal.clone()))],
        "the terminal message reused the claim loss's intent, eligible now"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM workflow_messages WHERE run_id = ?1 AND kind = 'terminal'",
            [&run_id],
        ),
        1
    );
    coordinator.branch(&mut client, &[], true).await;
    assert_eq!(
        coordinator.next(&mut client).await.as_deref(),
        Some(terminal.as_str())
    );
    let record = message_record(&coordinator, &mut client, &terminal).await;
    assert_eq!(record["deferredTurn"]["cause"], "claimLost", "{record}");
    assert_eq!(record["deferredTurn"]["presentation"]["state"], "completed");
    coordinator.branch(&mut client, &[&terminal], false).await;
    coordinator.run_turn(&mut client, &terminal, &run_id).await;
    coordinator.branch(&mut client, &[], true).await;
    assert_eq!(coordinator.next(&mut client).await, None, "one turn");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM workflow_turns WHERE message_id = ?1",
            [&terminal],
        ),
        1
    );
    wait_quiescent_at(&server).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}
