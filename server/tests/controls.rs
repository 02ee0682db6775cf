//! Every control a run view advertises is one the server accepts. The test
//! drives fresh runs into every display state the server can reach (queued,
//! running, waiting on a checkpoint, waiting on a protected decision,
//! waiting on an interaction, paused,
//! ambiguous, parked without progress, parked for a changed source,
//! completed, failed, timed out, cancelled), and for each control of each
//! state sends its command to another fresh run in the same state: the
//! command is accepted (never `unavailable`, never a refusal that says the
//! state forbids it).

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use support::*;

/// A display state a run can be brought to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Queued,
    Running,
    WaitingOnCheckpoint,
    WaitingOnDecision,
    WaitingOnInteraction,
    Paused,
    Ambiguous,
    ParkedNoProgress,
    ParkedSourceChanged,
    Completed,
    Failed,
    TimedOut,
    Cancelled,
}

const STATES: [State; 13] = [
    State::Queued,
    State::Running,
    State::WaitingOnCheckpoint,
    State::WaitingOnDecision,
    State::WaitingOnInteraction,
    State::Paused,
    State::Ambiguous,
    State::ParkedNoProgress,
    State::ParkedSourceChanged,
    State::Completed,
    State::Failed,
    State::TimedOut,
    State::Cancelled,
];

impl State {
    /// The display status a run in this state shows.
    fn display_status(self) -> &'static str {
        match self {
            Self::Queued | Self::ParkedNoProgress | Self::ParkedSourceChanged => "queued",
            Self::Running => "running",
            Self::WaitingOnCheckpoint | Self::WaitingOnDecision | Self::WaitingOnInteraction => {
                "waiting"
            }
            Self::Paused => "paused",
            Self::Ambiguous => "ambiguous",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Two servers: `main` has room for every runner; `full` has one worker slot,
/// taken by a run that never ends, so every other run there stays queued.
struct World {
    main: TestServer,
    full: TestServer,
    sessions: u32,
    sources: u32,
}

fn one_node(dir: &std::path::Path, name: &str, node: &str, extra: Value) -> PathBuf {
    let mut script = json!({
        "workflowName": name,
        "topology": {"startAt": "a", "nodes": [{"id": "a", "nodeType": node, "timeout": {"kind": "none"}, "mountPath": []}],
                     "edges": [], "mounts": []},
    });
    for (key, value) in extra.as_object().unwrap() {
        script[key] = value.clone();
    }
    write_script(dir, &format!("{name}.json"), &script)
}

fn stall_script(dir: &std::path::Path) -> PathBuf {
    one_node(
        dir,
        "stall",
        "compute",
        json!({"nodes": {"a": [{"stall": true}]}}),
    )
}

async fn start(client: &mut Client, script: &std::path::Path, session: Option<&str>) -> String {
    let mut payload = json!({ "workflow": script.to_string_lossy(), "input": {}, "projectPath": "/tmp",
                              "executionMode": "headless" });
    if let Some(session) = session {
        payload["executionMode"] = json!("interactive");
        payload["originSessionId"] = json!(session);
    }
    let response = client
        .request(&RequestSpec::command("run.start", None, payload))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// An interactive run of one agent step in `session`, waiting for its step:
/// its id and its waiting view.
async fn waiting_agent_step(
    server: &TestServer,
    client: &mut Client,
    session: &str,
) -> (String, Value) {
    let ask = one_node(
        server.scratch(),
        "ask",
        "agent",
        json!({"nodes": {"a": [{"interact": {"prompt": "Write it."}}]}}),
    );
    let run_id = start(client, &ask, Some(session)).await;
    let waiting = wait_status(client, &run_id, "waiting").await;
    (run_id, waiting)
}

async fn command(client: &mut Client, operation: &str, run_id: &str, payload: Value) -> Response {
    client
        .request(&RequestSpec::command(operation, Some(run_id), payload))
        .await
        .unwrap()
}

async fn wait_status(client: &mut Client, run_id: &str, wanted: &str) -> Value {
    wait_view(client, run_id, Duration::from_secs(20), |view| {
        status(view) == wanted
    })
    .await
}

impl World {
    async fn new() -> Self {
        let main = TestServer::start_with(&[("PI_WORKFLOWS_MAX_WORKERS", "64")]);
        let full = TestServer::start_with(&[("PI_WORKFLOWS_MAX_WORKERS", "1")]);
        let mut client = full.client().await;
        let blocker = start(&mut client, &stall_script(full.scratch()), None).await;
        wait_status(&mut client, &blocker, "running").await;
        Self {
            main,
            full,
            sessions: 0,
            sources: 0,
        }
    }

    /// A fresh run in `state`: its server, id and current view.
    async fn reach(&mut self, state: State) -> (&TestServer, String, Value) {
        let dir = self.main.scratch().to_path_buf();
        let server = if state == State::Queued {
            &self.full
        } else {
            &self.main
        };
        let mut client = server.client().await;
        let run_id = match state {
            State::Queued => start(&mut client, &stall_script(&dir), None).await,
            State::Running | State::Paused | State::Cancelled => {
                let run_id = start(&mut client, &stall_script(&dir), None).await;
                wait_status(&mut client, &run_id, "running").await;
                match state {
                    State::Paused => {
                        let paused = command(&mut client, "run.pause", &run_id, json!({})).await;
                        assert_eq!(paused.outcome, "accepted", "{:?}", paused.frame);
                    }
                    State::Cancelled => {
                        let cancelled =
                            command(&mut client, "run.cancel", &run_id, json!({})).await;
                        assert_eq!(cancelled.outcome, "accepted", "{:?}", cancelled.frame);
                    }
                    _ => {}
                }
                run_id
            }
            State::WaitingOnCheckpoint => {
                start(&mut client, &script("checkpoint.json"), None).await
            }
            State::WaitingOnDecision => {
                let mut gate = one_node(&dir, "gate", "checkpoint", json!({}));
                let mut decision: Value =
                    serde_json::from_slice(&std::fs::read(&gate).unwrap()).unwrap();
                decision["topology"]["nodes"][0]["humanDecision"] = json!(true);
                decision["nodes"] = json!({"a": [{"decide": {"title": "Ship it?", "choices": [{"id": "approve", "label": "Approve"}]}}]});
                gate = write_script(&dir, "gate.json", &decision);
                start(&mut client, &gate, None).await
            }
            State::WaitingOnInteraction => {
                self.sessions += 1;
                let session = format!("session-controls-{}", self.sessions);
                let ask = one_node(
                    &dir,
                    "ask",
                    "agent",
                    json!({"nodes": {"a": [{"interact": {"prompt": "Write it."}}]}}),
                );
                start(&mut client, &ask, Some(&session)).await
            }
            State::Ambiguous => {
                let effect = one_node(
                    &dir,
                    "effect",
                    "action",
                    json!({"nodes": {"a": [{"effect": {"type": "mail.send", "request": {"to": "x"}},
                                            "crashWhileApplying": true}]}}),
                );
                start(&mut client, &effect, None).await
            }
            State::ParkedNoProgress => {
                let crash = one_node(
                    &dir,
                    "crash",
                    "compute",
                    json!({"startup": {"exitAfterReady": 3}}),
                );
                start(&mut client, &crash, None).await
            }
            State::ParkedSourceChanged => {
                // Its own copy of the script: changing it changes only this run.
                self.sources += 1;
                let source = one_node(
                    &dir,
                    &format!("source-{}", self.sources),
                    "compute",
                    json!({"nodes": {"a": [{"stall": true}]}}),
                );
                let run_id = start(&mut client, &source, None).await;
                wait_status(&mut client, &run_id, "running").await;
                let paused = command(&mut client, "run.pause", &run_id, json!({})).await;
                assert_eq!(paused.outcome, "accepted", "{:?}", paused.frame);
                std::fs::write(&source, b"{\"topology\": {}}").unwrap();
                let resumed = command(&mut client, "run.resume", &run_id, json!({})).await;
                assert_eq!(resumed.outcome, "accepted", "{:?}", resumed.frame);
                run_id
            }
            State::Completed => start(&mut client, &script("linear.json"), None).await,
            State::Failed => start(&mut client, &script("loop.json"), None).await,
            State::TimedOut => {
                let slow = one_node(
                    &dir,
                    "slow",
                    "compute",
                    json!({"nodes": {"a": [{"fail": "too slow", "outcome": "timed_out"}]}}),
                );
                start(&mut client, &slow, None).await
            }
        };
        let view = wait_view(&mut client, &run_id, Duration::from_secs(20), |view| {
            status(view) == state.display_status()
                && match state {
                    // A run parked for review says why (a resumed run waiting
                    // for its next runner is `queued` too, without a reason).
                    State::ParkedNoProgress | State::ParkedSourceChanged => {
                        view["status"]["queue"] == "parked" && view["display"]["reason"].is_string()
                    }
                    _ => true,
                }
        })
        .await;
        (server, run_id, view)
    }
}

/// The command a control stands for, with a payload the schema accepts
/// (ids read from the state file where the view does not carry them).
fn control_command(server: &TestServer, run_id: &str, control: &str) -> (&'static str, Value) {
    let db = server.db();
    let interaction = || -> (String, String) {
        db.query_row(
            "SELECT interaction_id, attempt_id FROM interactive_requests WHERE run_id = ?1 AND status = 'pending'",
            [run_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("the run's pending interaction")
    };
    match control {
        "pause" => ("run.pause", json!({})),
        "resume" => ("run.resume", json!({})),
        "cancel" => ("run.cancel", json!({})),
        "restart" => ("run.restart", json!({})),
        "answer" => ("checkpoint.answer", json!({"answer": {"approved": true}})),
        "submit" => {
            let (interaction_id, attempt_id) = interaction();
            // The authority is filled in by `as_coordinator` (the session's epoch).
            (
                "interaction.submit",
                json!({"interactionId": interaction_id, "attemptId": attempt_id, "submissionId": "sub-1", "output": {"done": true}}),
            )
        }
        "update" => {
            let (interaction_id, attempt_id) = interaction();
            (
                "interaction.update",
                // The authority is filled in by `as_coordinator` (the session's epoch).
                json!({"interactionId": interaction_id, "attemptId": attempt_id, "toolCallId": "call-1",
                       "update": {"type": "progress", "key": "k", "data": {"n": 1}}}),
            )
        }
        "recoverEffect" => {
            let effect_id: String = db
                .query_row(
                    "SELECT effect_id FROM effects WHERE run_id = ?1 AND state = 'ambiguous'",
                    [run_id],
                    |row| row.get(0),
                )
                .expect("the run's ambiguous effect");
            (
                "effect.recover",
                json!({"effectId": effect_id, "action": "confirm"}),
            )
        }
        "humanAnswer" => {
            let (decision_id, request_digest): (String, Vec<u8>) = db
                .query_row(
                    "SELECT decision_id, request_digest FROM human_decisions WHERE run_id = ?1 AND state = 'pending'",
                    [run_id],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .expect("the run's pending decision");
            (
                "decision.answer",
                json!({"decisionId": decision_id, "requestDigest": format!("sha256:{}", hex::encode(request_digest)),
                       "choice": "approve", "input": null, "source": {"channel": "cli", "actorId": "tester"}}),
            )
        }
        other => panic!("unknown control {other}"),
    }
}

/// Makes `client` the coordinator of `run_id`'s origin session, as the
/// Pi extension does (`sessionView.get {coordinate: true}`), and returns
/// the coordinator authority an origin-session submission carries.
async fn as_coordinator(server: &TestServer, client: &mut Client, run_id: &str) -> Value {
    let session: String = server
        .db()
        .query_row(
            "SELECT origin_session_id FROM run_bindings WHERE run_id = ?1",
            [run_id],
            |row| row.get(0),
        )
        .expect("an interactive run's origin session");
    let view = client
        .request(&RequestSpec::read(
            "sessionView.get",
            None,
            json!({ "sessionId": session, "coordinate": true }),
        ))
        .await
        .unwrap();
    assert_eq!(view.outcome, "accepted", "{:?}", view.frame);
    let epoch = view.frame["receipt"]["coordinatorEpoch"].clone();
    assert!(
        epoch.is_u64(),
        "the session view grants an epoch: {:?}",
        view.frame
    );
    json!({"kind": "coordinator", "sessionId": session, "coordinatorEpoch": epoch})
}

fn controls_of(view: &Value) -> Vec<String> {
    view["display"]["controls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|control| control.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_advertised_control_of_every_display_state_is_accepted() {
    let mut world = World::new().await;
    let mut refused = Vec::new();
    let mut checked = 0;
    for state in STATES {
        let (_, _, view) = world.reach(state).await;
        let controls = controls_of(&view);
        eprintln!("{state:?}: {controls:?}");
        for control in controls {
            let (server, run_id, fresh) = world.reach(state).await;
            assert!(
                controls_of(&fresh).contains(&control),
                "{state:?}: a second run in the same state offers {control}: {fresh}"
            );
            let (operation, mut payload) = control_command(server, &run_id, &control);
            let mut client = server.client().await;
            if matches!(operation, "interaction.submit" | "interaction.update") {
                payload["authority"] = as_coordinator(server, &mut client, &run_id).await;
            }
            let response = command(&mut client, operation, &run_id, payload).await;
            checked += 1;
            if response.outcome != "accepted" {
                refused.push(format!(
                    "{state:?} offers {control}, but {operation} was answered {} {}",
                    response.outcome, response.frame["error"]
                ));
            }
        }
    }
    assert_eq!(refused, Vec::<String>::new(), "{checked} controls checked");
    assert!(checked >= 15, "every state offers its controls ({checked})");
}

/// An origin-session submission counts only from the session's active
/// coordinator: once a second connection coordinates the session, the
/// first one's epoch is stale and its submission is answered `claimLost`
/// (the kernel's `StaleCoordinator`) and stores nothing; another session's
/// is refused, and the active epoch's is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_submission_needs_the_active_coordinator_epoch() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let (run_id, _) = waiting_agent_step(&server, &mut client, "session-epochs").await;
    let (_, submit) = control_command(&server, &run_id, "submit");

    let mut first = server.client().await;
    let fenced = as_coordinator(&server, &mut first, &run_id).await;
    let mut second = server.client().await;
    let active = as_coordinator(&server, &mut second, &run_id).await;
    assert_ne!(
        fenced["coordinatorEpoch"], active["coordinatorEpoch"],
        "the second connection coordinates at a new epoch"
    );

    let mut stale = submit.clone();
    stale["authority"] = fenced;
    let refused = command(&mut first, "interaction.submit", &run_id, stale).await;
    assert_eq!(refused.outcome, "claimLost", "{:?}", refused.frame);
    assert_eq!(refused.frame["error"]["code"], "claimLost");
    let submissions: i64 = server
        .db()
        .query_row(
            "SELECT COUNT(*) FROM interactive_submissions WHERE interaction_id = ?1",
            [submit["interactionId"].as_str().unwrap()],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(
        submissions, 0,
        "a stale coordinator's submission stores nothing"
    );

    let mut other_session = submit.clone();
    other_session["authority"] = active.clone();
    other_session["authority"]["sessionId"] = json!("another-session");
    let wrong = command(&mut second, "interaction.submit", &run_id, other_session).await;
    assert_eq!(wrong.outcome, "rejected", "{:?}", wrong.frame);
    assert_eq!(wrong.frame["error"]["code"], "illegalTransition");

    // The active epoch's submission is taken: stored, validated (the
    // scripted runner's validation child reports no verdict, so its receipt
    // says rejected) and answered at that durable outcome.
    let mut current = submit.clone();
    current["authority"] = active;
    let accepted = command(&mut second, "interaction.submit", &run_id, current).await;
    assert_eq!(accepted.outcome, "accepted", "{:?}", accepted.frame);
    let submissions: i64 = server
        .db()
        .query_row(
            "SELECT COUNT(*) FROM interactive_submissions WHERE interaction_id = ?1",
            [submit["interactionId"].as_str().unwrap()],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(
        submissions, 1,
        "the active coordinator's submission is stored"
    );
}

/// An origin-session update (the agent tool's `update` action in Pi) is
/// taken only from the session's active coordinator epoch, checked before
/// the receipt is looked up: a fenced epoch is answered `claimLost`, another
/// session is refused, and neither stores anything. The active epoch's
/// update is published in the view; the same tool call again adopts its
/// receipt, and the same key with other data conflicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_update_needs_the_active_coordinator_epoch() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let (run_id, waiting) = waiting_agent_step(&server, &mut client, "session-updates").await;
    assert!(
        controls_of(&waiting).contains(&"update".to_owned()),
        "an origin-session agent step offers update: {}",
        waiting["display"]
    );
    let (_, update) = control_command(&server, &run_id, "update");

    let mut first = server.client().await;
    let fenced = as_coordinator(&server, &mut first, &run_id).await;
    let mut second = server.client().await;
    let active = as_coordinator(&server, &mut second, &run_id).await;
    let stored_updates = || -> i64 {
        server
            .db()
            .query_row(
                "SELECT COUNT(*) FROM update_receipts WHERE run_id = ?1",
                [&run_id],
                |row| row.get(0),
            )
            .unwrap()
    };

    async fn send(client: &mut Client, run_id: &str, payload: Value) -> Response {
        let spec = RequestSpec {
            idempotency_key: Some("tool-call-update-1".to_owned()),
            ..RequestSpec::command("interaction.update", Some(run_id), payload)
        };
        client.request(&spec).await.unwrap()
    }

    let mut stale = update.clone();
    stale["authority"] = fenced;
    let refused = send(&mut first, &run_id, stale).await;
    assert_eq!(refused.outcome, "claimLost", "{:?}", refused.frame);
    let mut other_session = update.clone();
    other_session["authority"] = active.clone();
    other_session["authority"]["sessionId"] = json!("another-session");
    let wrong = send(&mut second, &run_id, other_session).await;
    assert_eq!(wrong.outcome, "rejected", "{:?}", wrong.frame);
    assert_eq!(wrong.frame["error"]["code"], "illegalTransition");
    assert_eq!(stored_updates(), 0, "a refused update stores nothing");

    let mut current = update.clone();
    current["authority"] = active;
    let accepted = send(&mut second, &run_id, current.clone()).await;
    assert_eq!(accepted.outcome, "accepted", "{:?}", accepted.frame);
    let seq = accepted.receipt.as_ref().unwrap()["seq"].clone();
    let again = send(&mut second, &run_id, current.clone()).await;
    assert_eq!(again.outcome, "adopted", "{:?}", again.frame);
    assert_eq!(again.receipt.as_ref().unwrap()["seq"], seq);
    let mut other_data = current;
    other_data["update"]["data"] = json!({"n": 2});
    let conflict = send(&mut second, &run_id, other_data).await;
    assert_eq!(conflict.outcome, "conflict", "{:?}", conflict.frame);
    assert_eq!(stored_updates(), 1);

    let shown = wait_view(&mut client, &run_id, Duration::from_secs(10), |view| {
        view["updates"]["total"] == 1
    })
    .await;
    let item = &shown["updates"]["items"][0];
    assert_eq!(
        (item["type"].as_str(), item["key"].as_str()),
        (Some("progress"), Some("k")),
        "{}",
        shown["updates"]
    );
}

/// Pause is stored once, on the run, and its interaction derives it: while
/// an interactive run waiting for its step is paused, the active
/// coordinator's submission is refused `paused` and stores nothing, the
/// interaction row itself is unchanged, and after `run.resume` the same
/// step's submission is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_refuses_its_interactions_submission_until_resumed() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let (run_id, _) = waiting_agent_step(&server, &mut client, "session-paused").await;
    let (_, submit) = control_command(&server, &run_id, "submit");
    let interaction_id = submit["interactionId"].as_str().unwrap().to_owned();
    let interaction_row = |server: &TestServer| -> String {
        server
            .db()
            .query_row(
                "SELECT status || ' ' || revision FROM interactive_requests WHERE interaction_id = ?1",
                [&interaction_id],
                |row| row.get(0),
            )
            .unwrap()
    };
    let before = interaction_row(&server);

    let paused = command(&mut client, "run.pause", &run_id, json!({})).await;
    assert_eq!(paused.outcome, "accepted", "{:?}", paused.frame);
    let pause_flags: i64 = server
        .db()
        .query_row(
            "SELECT paused FROM runs WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(pause_flags, 1, "the pause is the run's flag");
    assert_eq!(
        interaction_row(&server),
        before,
        "the interaction row is not touched"
    );

    let mut coordinator = server.client().await;
    let authority = as_coordinator(&server, &mut coordinator, &run_id).await;
    let mut during = submit.clone();
    during["authority"] = authority.clone();
    let refused = command(&mut coordinator, "interaction.submit", &run_id, during).await;
    assert_eq!(
        refused.frame["error"]["code"], "paused",
        "{:?}",
        refused.frame
    );
    let stored: i64 = server
        .db()
        .query_row(
            "SELECT COUNT(*) FROM interactive_submissions WHERE interaction_id = ?1",
            [&interaction_id],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(stored, 0, "a submission to a paused run stores nothing");

    let resumed = command(&mut client, "run.resume", &run_id, json!({})).await;
    assert_eq!(resumed.outcome, "accepted", "{:?}", resumed.frame);
    let mut after = submit.clone();
    after["authority"] = authority;
    after["submissionId"] = json!("sub-after-resume");
    let taken = command(&mut coordinator, "interaction.submit", &run_id, after).await;
    assert_eq!(taken.outcome, "accepted", "{:?}", taken.frame);
}

/// A duplicate origin-session submission (the same tool call again, under
/// its idempotency key) adopts the stored outcome and stores nothing new;
/// the same key with another output conflicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_interactive_submission_adopts_and_a_reused_key_conflicts() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let (run_id, _) = waiting_agent_step(&server, &mut client, "session-duplicates").await;
    let (_, mut submit) = control_command(&server, &run_id, "submit");
    let mut coordinator = server.client().await;
    submit["authority"] = as_coordinator(&server, &mut coordinator, &run_id).await;
    let spec = RequestSpec::command("interaction.submit", Some(&run_id), submit.clone());
    let first = request_as(&mut coordinator, &spec, &fresh_request_id()).await;
    assert_eq!(first.outcome, "accepted", "{:?}", first.frame);
    let again = request_as(&mut coordinator, &spec, &fresh_request_id()).await;
    assert_eq!(again.outcome, "adopted", "{:?}", again.frame);
    assert_eq!(again.receipt, first.receipt, "the stored outcome");
    let stored = |server: &TestServer| -> i64 {
        server
            .db()
            .query_row(
                "SELECT COUNT(*) FROM interactive_submissions WHERE interaction_id = ?1",
                [submit["interactionId"].as_str().unwrap()],
                |row| row.get(0),
            )
            .unwrap()
    };
    assert_eq!(stored(&server), 1, "one submission stored");
    let mut other = spec.clone();
    other.payload["output"] = json!({"something": "else"});
    let conflict = request_as(&mut coordinator, &other, &fresh_request_id()).await;
    assert_eq!(
        conflict.frame["error"]["code"], "conflict",
        "{:?}",
        conflict.frame
    );
    assert_eq!(stored(&server), 1, "the conflicting reuse stores nothing");
}
