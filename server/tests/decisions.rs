//! Protected human decisions end to end, through a real server, real SQLite
//! and scripted runners: the verification list of the seed's human-decision
//! design (docs-changes HUMAN_DECISIONS.md) without the Telegram items.
//! Every test ends with the consistency checks.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use rusqlite::Connection;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use support::{
    SETTLE_TIMEOUT, TestServer, apply_lines, count, started, status, view, wait_quiescent_at,
    wait_settled, wait_view, write_script,
};

/// A node of a scripted topology.
fn node(id: &str, node_type: &str) -> Value {
    json!({"id": id, "nodeType": node_type, "timeout": {"kind": "default"}, "mountPath": []})
}

/// The protected checkpoint `gate`.
fn gate() -> Value {
    let mut gate = node("gate", "checkpoint");
    gate["humanDecision"] = json!(true);
    gate
}

/// The choices every test decision offers: approve, or revise with feedback.
fn choices() -> Value {
    json!([
        {"id": "approve", "label": "Approve"},
        {"id": "revise", "label": "Revise", "input": {"kind": "text", "name": "feedback", "prompt": "What should change?", "minLength": 1, "maxLength": 200}},
    ])
}

/// `draft → gate (human decision) → approve: publish | revise: rework`;
/// `publish` applies one managed effect logged in `apply.log` (each real
/// application of a node is one line), `rework` finishes. `decide` is the
/// gate's behaviour.
fn decision_script(dir: &Path, decide: Value) -> PathBuf {
    let log = dir.join("apply.log");
    write_script(
        dir,
        "decision.json",
        &json!({
            "workflowName": "decision",
            "topology": {
                "startAt": "draft",
                "nodes": [node("draft", "compute"), gate(), node("publish", "action"), node("rework", "compute")],
                "edges": [
                    {"kind": "plain", "from": "draft", "to": "gate"},
                    {"kind": "switch", "from": "gate", "on": "$.choice", "cases": {"approve": "publish", "revise": "rework"}},
                ],
                "mounts": [],
            },
            "nodes": {
                "gate": [{"decide": decide}],
                "publish": [{"effect": {"type": "publish", "request": {"what": "release"}, "applyLog": log}}],
            },
        }),
    )
}

/// A plain decision: title, the two choices, no deadline.
fn plain_decision() -> Value {
    json!({"title": "Publish the release?", "choices": choices()})
}

/// The pending decision a waiting run's view shows.
fn decision_of(view: &Value) -> Value {
    view["decision"].clone()
}

/// `decision.answer` as the CLI sends it (provenance `cli`).
fn answer_spec(run_id: &str, decision: &Value, choice: &str, input: Value) -> RequestSpec {
    RequestSpec::command(
        "decision.answer",
        Some(run_id),
        json!({
            "decisionId": decision["decisionId"],
            "requestDigest": decision["requestDigest"],
            "choice": choice,
            "input": input,
            "source": {"channel": "cli", "actorId": "operator-1"},
        }),
    )
}

async fn request(client: &mut Client, spec: &RequestSpec) -> Response {
    client.request(spec).await.expect("a response")
}

/// Starts a run of `script` and waits until it waits on its decision.
async fn waiting(client: &mut Client, script: &Path) -> (String, Value) {
    let run_id = started(client, script).await;
    let view = wait_view(client, &run_id, SETTLE_TIMEOUT, |view| {
        view["decision"].is_object()
    })
    .await;
    assert_eq!(status(&view), "waiting", "{view}");
    (run_id, decision_of(&view))
}

/// The continuation runs of `parent`.
fn children(db: &Connection, parent: &str) -> i64 {
    count(
        db,
        "SELECT COUNT(*) FROM runs WHERE continuation_of = ?1",
        [parent],
    )
}

/// Waits for every runner to exit, then runs every consistency check.
async fn assert_consistent(server: &TestServer) {
    wait_quiescent_at(server).await;
    assert_eq!(
        support::consistency_violations(&server.db()),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_checkpoint_is_settled_only_by_a_human_answer_through_decision_answer() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(server.scratch(), plain_decision());
    let (parent, decision) = waiting(&mut client, &script).await;

    // The view shows what a person needs to answer, and the humanAnswer control.
    let shown = view(&mut client, &parent).await;
    assert_eq!(
        shown["display"]["controls"],
        json!(["humanAnswer", "pause", "cancel"])
    );
    assert_eq!(decision["nodeId"], "gate");
    assert_eq!(decision["title"], "Publish the release?");
    assert_eq!(decision["choices"], choices());
    assert!(
        decision["decisionId"]
            .as_str()
            .unwrap()
            .starts_with("decision-")
    );
    let db = server.db();
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM human_decisions WHERE run_id = ?1 AND state = 'pending'",
            [&parent]
        ),
        1,
        "the decision opened in the commit that made the run wait"
    );

    // The ordinary checkpoint answer never settles it.
    let ordinary = RequestSpec::command(
        "checkpoint.answer",
        Some(&parent),
        json!({"answer": {"choice": "approve"}}),
    );
    let refused = request(&mut client, &ordinary).await;
    assert_eq!(refused.outcome, "rejected", "{:?}", refused.frame);
    assert_eq!(refused.error_code.as_deref(), Some("decisionRequired"));
    assert_eq!(children(&db, &parent), 0);

    let answered = request(
        &mut client,
        &answer_spec(&parent, &decision, "approve", Value::Null),
    )
    .await;
    assert_eq!(answered.outcome, "accepted", "{:?}", answered.frame);
    let child = answered.receipt.as_ref().unwrap()["continuationRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    let hex = decision["decisionId"]
        .as_str()
        .unwrap()
        .trim_start_matches("decision-");
    assert_eq!(
        child,
        format!("continuation-{hex}"),
        "the deterministic continuation id"
    );
    let (state, provenance, channel, actor): (String, String, String, String) = db
        .query_row(
            "SELECT state, provenance, answer_channel, answer_actor_id FROM human_decisions WHERE run_id = ?1",
            [&parent],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .unwrap();
    assert_eq!(
        (
            state.as_str(),
            provenance.as_str(),
            channel.as_str(),
            actor.as_str()
        ),
        ("accepted", "human", "cli", "operator-1")
    );

    // The continuation routes on the choice (`$.choice`): publish, once.
    let done = wait_settled(&mut client, &child).await;
    assert_eq!(status(&done), "completed", "{done}");
    assert_eq!(apply_lines(&server.scratch().join("apply.log")).len(), 1);
    let parent_view = view(&mut client, &parent).await;
    assert_eq!(parent_view["status"]["run"], "completed");
    assert!(
        parent_view.get("decision").is_none(),
        "an answered decision is no longer shown"
    );
    assert_eq!(children(&db, &parent), 1);
    assert_consistent(&server).await;
}
