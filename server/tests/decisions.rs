//! Protected human decisions end to end, through a real server, real SQLite
//! and scripted runners: the verification list of the seed's human-decision
//! design (docs-changes HUMAN_DECISIONS.md) without the Telegram items.
//! Every test ends with the consistency checks.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use rusqlite::Connection;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{
    SETTLE_TIMEOUT, TestServer, apply_lines, count, started, status, view, wait_for,
    wait_quiescent_at, wait_settled, wait_view, write_script,
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
/// `publish` and `rework` each apply one managed effect logged in
/// `apply.log` (each real application is one line: a continuation node
/// that ran twice shows twice). `decide` is the gate's behaviour.
fn decision_script(dir: &Path, decide: Value) -> PathBuf {
    let log = dir.join("apply.log");
    decision_script_with(
        dir,
        decide,
        json!({"effect": {"type": "publish", "request": {"what": "release"}, "applyLog": log}}),
    )
}

/// [`decision_script`] with `publish` behaving as `publish`.
fn decision_script_with(dir: &Path, decide: Value, publish: Value) -> PathBuf {
    let log = dir.join("apply.log");
    write_script(
        dir,
        "decision.json",
        &json!({
            "workflowName": "decision",
            "topology": {
                "startAt": "draft",
                "nodes": [node("draft", "compute"), gate(), node("publish", "action"), node("rework", "action")],
                "edges": [
                    {"kind": "plain", "from": "draft", "to": "gate"},
                    {"kind": "switch", "from": "gate", "on": "$.choice", "cases": {"approve": "publish", "revise": "rework"}},
                ],
                "mounts": [],
            },
            "nodes": {
                "gate": [{"decide": decide}],
                "publish": [publish],
                "rework": [{"effect": {"type": "rework", "request": {"what": "plan"}, "applyLog": log}}],
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

// ---- helpers of the verification tests ---------------------------------------

/// The tables a decision, its run and its continuation live in, row by row
/// (every column, in a stable order): what "changes no row" compares.
/// Command receipts are left out: a refused or adopted command stores its
/// own receipt by design.
const DECISION_TABLES: [&str; 13] = [
    "runs",
    "run_queue",
    "leases",
    "events",
    "human_decisions",
    "node_attempts",
    "workflow_messages",
    "workflow_turns",
    "effects",
    "effect_attempts",
    "run_workers",
    "viewer_runs",
    "viewer_deltas",
];

fn snapshot(db: &Connection) -> Vec<(String, Vec<String>)> {
    DECISION_TABLES
        .iter()
        .map(|table| {
            let mut statement = db
                .prepare(&format!("SELECT * FROM {table} ORDER BY 1, 2"))
                .unwrap();
            let columns = statement.column_count();
            let rows = statement
                .query_map([], |row| {
                    let mut fields = Vec::with_capacity(columns);
                    for index in 0..columns {
                        let value: rusqlite::types::Value = row.get(index)?;
                        fields.push(format!("{value:?}"));
                    }
                    Ok(fields.join("|"))
                })
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            ((*table).to_owned(), rows)
        })
        .collect()
}

/// `table`'s rows that differ between two snapshots.
fn changed(before: &[(String, Vec<String>)], after: &[(String, Vec<String>)]) -> Vec<String> {
    before
        .iter()
        .zip(after)
        .filter(|((_, old), (_, new))| old != new)
        .map(|((table, _), _)| table.clone())
        .collect()
}

/// The lease generation of `run_id`.
fn generation(db: &Connection, run_id: &str) -> i64 {
    count(
        db,
        "SELECT generation FROM leases WHERE run_id = ?1",
        [run_id],
    )
}

/// `(state, provenance)` of the run's decision.
fn decision_row(db: &Connection, run_id: &str) -> (String, Option<String>) {
    db.query_row(
        "SELECT state, provenance FROM human_decisions WHERE run_id = ?1",
        [run_id],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .unwrap()
}

fn events(db: &Connection, run_id: &str, kind: &str) -> i64 {
    count(
        db,
        "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind = ?2",
        [run_id, kind],
    )
}

/// The one continuation of `parent`, once it exists.
async fn child_of(server: &TestServer, parent: &str) -> String {
    wait_for(SETTLE_TIMEOUT, "the continuation", || {
        server
            .db()
            .query_row(
                "SELECT run_id FROM runs WHERE continuation_of = ?1",
                [parent],
                |row| row.get::<_, String>(0),
            )
            .ok()
    })
    .await
}

/// A second connection with the same client id (a retry of the same
/// command after a reconnect).
async fn reconnect(server: &TestServer, client_id: &str) -> Client {
    Client::connect(&server.socket(), client_id)
        .await
        .expect("connect")
}

// ---- validation, retries, adoption -------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_digests_unknown_choices_and_wrong_inputs_are_refused_without_change() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(server.scratch(), plain_decision());
    let (parent, decision) = waiting(&mut client, &script).await;
    // The runner that made the run wait exits on its own; let it.
    wait_quiescent_at(&server).await;
    let db = server.db();
    let before = snapshot(&db);
    let mut stale = decision.clone();
    stale["requestDigest"] = json!(format!("sha256:{}", "0".repeat(64)));
    let mut unknown = decision.clone();
    unknown["decisionId"] = json!("decision-0000000000000000000000000000000000000000");
    let cases = [
        (
            "a stale request digest",
            answer_spec(&parent, &stale, "approve", Value::Null),
            "digestMismatch",
        ),
        (
            "another decision",
            answer_spec(&parent, &unknown, "approve", Value::Null),
            "notFound",
        ),
        (
            "an unknown choice",
            answer_spec(&parent, &decision, "reject", Value::Null),
            "validationFailed",
        ),
        (
            "a choice without its text",
            answer_spec(&parent, &decision, "revise", Value::Null),
            "validationFailed",
        ),
        (
            "text for a choice without input",
            answer_spec(&parent, &decision, "approve", json!({"feedback": "x"})),
            "validationFailed",
        ),
        (
            "text under another name",
            answer_spec(&parent, &decision, "revise", json!({"comment": "x"})),
            "validationFailed",
        ),
        (
            "text shorter than allowed",
            answer_spec(&parent, &decision, "revise", json!({"feedback": ""})),
            "validationFailed",
        ),
        (
            "text longer than allowed",
            answer_spec(
                &parent,
                &decision,
                "revise",
                json!({"feedback": "x".repeat(201)}),
            ),
            "validationFailed",
        ),
    ];
    for (what, spec, code) in cases {
        let refused = request(&mut client, &spec).await;
        assert_ne!(refused.outcome, "accepted", "{what}: {:?}", refused.frame);
        assert_eq!(
            refused.error_code.as_deref(),
            Some(code),
            "{what}: {:?}",
            refused.frame
        );
    }
    assert_eq!(changed(&before, &snapshot(&db)), Vec::<String>::new());
    assert_eq!(decision_row(&db, &parent).0, "pending");

    // The schema has no source outside the human channels (the client
    // refuses to send one).
    let mut model = answer_spec(&parent, &decision, "approve", Value::Null);
    model.payload["source"]["channel"] = json!("model");
    assert!(
        client.request(&model).await.is_err(),
        "a model source is off the schema"
    );

    let accepted = request(
        &mut client,
        &answer_spec(
            &parent,
            &decision,
            "revise",
            json!({"feedback": "tighten the notes"}),
        ),
    )
    .await;
    assert_eq!(accepted.outcome, "accepted", "{:?}", accepted.frame);
    let child = child_of(&server, &parent).await;
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    // The continuation's checkpoint output is the validated response.
    let carried: String = db
        .query_row(
            "SELECT CAST(b.bytes AS TEXT) FROM node_attempts a JOIN blobs b ON b.digest = a.output_digest
             WHERE a.run_id = ?1 AND a.node_id = 'gate'",
            [&child],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(
        carried,
        r#"{"choice":"revise","input":{"feedback":"tighten the notes"}}"#
    );
    assert_eq!(
        apply_lines(&server.scratch().join("apply.log")).len(),
        1,
        "rework ran once"
    );
    assert_consistent(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_retries_adopt_without_change_and_conflicting_answers_are_already_decided() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(server.scratch(), plain_decision());
    let (parent, decision) = waiting(&mut client, &script).await;
    let spec = answer_spec(&parent, &decision, "approve", Value::Null);
    let first = request(&mut client, &spec).await;
    assert_eq!(first.outcome, "accepted", "{:?}", first.frame);
    let child = child_of(&server, &parent).await;
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    wait_quiescent_at(&server).await;
    let db = server.db();
    let settled = snapshot(&db);

    // The same command again (same key, a new connection of the same
    // client): the stored receipt, nothing executed.
    let mut again = reconnect(&server, client.client_id()).await;
    let mut retry = spec.clone();
    retry.idempotency_key.clone_from(&spec.idempotency_key);
    let retried = again
        .request_with_id(&retry, &support::fresh_request_id())
        .await
        .unwrap();
    assert_eq!(retried.outcome, "adopted", "{:?}", retried.frame);
    assert_eq!(retried.receipt, first.receipt);

    // The same answer from another person (a new command): the kernel adopts
    // the winner; no lease, queue, timestamp, event or view changes.
    let mut other = server.client().await;
    let mut same = answer_spec(&parent, &decision, "approve", Value::Null);
    same.payload["source"]["actorId"] = json!("operator-2");
    let adopted = request(&mut other, &same).await;
    assert_eq!(adopted.outcome, "accepted", "{:?}", adopted.frame);
    assert_eq!(adopted.receipt, first.receipt);
    assert_eq!(changed(&settled, &snapshot(&db)), Vec::<String>::new());

    // Another answer after acceptance is refused: already decided.
    let conflicting = request(
        &mut other,
        &answer_spec(&parent, &decision, "revise", json!({"feedback": "no"})),
    )
    .await;
    assert_eq!(conflicting.outcome, "rejected", "{:?}", conflicting.frame);
    assert_eq!(conflicting.error_code.as_deref(), Some("conflict"));
    assert_eq!(changed(&settled, &snapshot(&db)), Vec::<String>::new());

    let who: (String, String) = db
        .query_row(
            "SELECT answer_channel, answer_actor_id FROM human_decisions WHERE run_id = ?1",
            [&parent],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        who,
        ("cli".into(), "operator-1".into()),
        "the winner's provenance"
    );
    assert_eq!(children(&db, &parent), 1);
    assert_eq!(apply_lines(&server.scratch().join("apply.log")).len(), 1);
    assert_consistent(&server).await;
}

/// Prepare-or-adopt refuses a continuation with another identity without
/// changing anything. A protected decision's continuation always has the
/// parent's input, so the input-bearing ordinary checkpoint shows it: a
/// second, different answer is another continuation input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incompatible_continuation_identity_fails_without_changing_any_row() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let parent = started(&mut client, &support::script("checkpoint.json")).await;
    assert_eq!(status(&wait_settled(&mut client, &parent).await), "waiting");
    let first = request(
        &mut client,
        &RequestSpec::command(
            "checkpoint.answer",
            Some(&parent),
            json!({"answer": {"approved": true}}),
        ),
    )
    .await;
    assert_eq!(first.outcome, "accepted", "{:?}", first.frame);
    let child = child_of(&server, &parent).await;
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    wait_quiescent_at(&server).await;
    let db = server.db();
    let settled = snapshot(&db);
    let other = request(
        &mut client,
        &RequestSpec::command(
            "checkpoint.answer",
            Some(&parent),
            json!({"answer": {"approved": false}}),
        ),
    )
    .await;
    assert_eq!(other.outcome, "rejected", "{:?}", other.frame);
    assert_eq!(other.error_code.as_deref(), Some("conflict"));
    assert_eq!(changed(&settled, &snapshot(&db)), Vec::<String>::new());
    assert_consistent(&server).await;
}

// ---- the deadline ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_records_the_default_with_provenance_timeout_and_a_later_answer_loses() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(
        server.scratch(),
        json!({"title": "Publish?", "choices": choices(), "expiresInMs": 1500,
               "defaultResponse": {"choice": "revise", "input": {"feedback": "no answer in time"}}}),
    );
    let (parent, decision) = waiting(&mut client, &script).await;
    assert!(decision["expiresAtMs"].is_u64(), "{decision}");
    assert_eq!(decision["defaultChoice"], "revise");
    let child = child_of(&server, &parent).await;
    let db = server.db();
    assert_eq!(
        decision_row(&db, &parent),
        ("accepted".into(), Some("timeout".into()))
    );
    let who: Option<String> = db
        .query_row(
            "SELECT answer_channel FROM human_decisions WHERE run_id = ?1",
            [&parent],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(who, None, "a timeout has no source");
    let late = request(
        &mut client,
        &answer_spec(&parent, &decision, "approve", Value::Null),
    )
    .await;
    assert_eq!(late.outcome, "rejected", "{:?}", late.frame);
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    let lines = apply_lines(&server.scratch().join("apply.log"));
    assert_eq!(
        lines.len(),
        1,
        "the default routed to rework, once: {lines:?}"
    );
    assert_eq!(children(&db, &parent), 1);
    assert_consistent(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_default_the_decision_expires_and_the_run_times_out() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(
        server.scratch(),
        json!({"title": "Publish?", "choices": choices(), "expiresInMs": 800}),
    );
    let (parent, decision) = waiting(&mut client, &script).await;
    let done = wait_view(&mut client, &parent, SETTLE_TIMEOUT, |view| {
        status(view) == "timed_out"
    })
    .await;
    assert!(
        done["display"]["reason"]
            .as_str()
            .unwrap()
            .contains("human decision at gate expired"),
        "{done}"
    );
    let db = server.db();
    assert_eq!(decision_row(&db, &parent).0, "expired");
    assert_eq!(events(&db, &parent, "decisionExpired"), 1);
    let late = request(
        &mut client,
        &answer_spec(&parent, &decision, "approve", Value::Null),
    )
    .await;
    assert_eq!(late.outcome, "rejected", "{:?}", late.frame);
    assert_eq!(children(&db, &parent), 0);
    assert_consistent(&server).await;
}

/// Several people answer while the deadline comes: whatever wins (one of
/// them, or the default), there is one accepted decision, one control
/// generation on the parent, one continuation, and each continuation node
/// runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_racing_the_deadline_have_one_winner_one_generation_and_one_continuation() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(
        server.scratch(),
        json!({"title": "Publish?", "choices": choices(), "expiresInMs": 1200,
               "defaultResponse": {"choice": "approve"}}),
    );
    let (parent, decision) = waiting(&mut client, &script).await;
    let db = server.db();
    let waiting_generation = generation(&db, &parent);
    let expires_at = decision["expiresAtMs"].as_u64().unwrap();
    let now = server::clock::now_ms();
    tokio::time::sleep(Duration::from_millis(expires_at.saturating_sub(now + 60))).await;
    let mut answers = Vec::new();
    for n in 0..4 {
        let mut person = server.client().await;
        // People answer from Pi and from the command line.
        let mut spec = if n % 2 == 0 {
            answer_spec(&parent, &decision, "approve", Value::Null)
        } else {
            answer_spec(
                &parent,
                &decision,
                "revise",
                json!({"feedback": format!("person {n}")}),
            )
        };
        if n < 2 {
            spec.payload["source"] = json!({"channel": "pi", "actorId": format!("session-{n}")});
        }
        answers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(n * 30)).await;
            person.request(&spec).await.unwrap()
        }));
    }
    let mut outcomes = Vec::new();
    for answer in answers {
        let response = answer.await.unwrap();
        if response.outcome == "accepted" {
            outcomes.push(response.receipt.unwrap()["continuationRunId"].clone());
        } else {
            assert_eq!(response.outcome, "rejected", "{:?}", response.frame);
        }
    }
    let child = child_of(&server, &parent).await;
    assert!(
        outcomes.iter().all(|id| *id == json!(child)),
        "{outcomes:?}"
    );
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    assert_eq!(decision_row(&db, &parent).0, "accepted");
    assert_eq!(events(&db, &parent, "decisionAccepted"), 1);
    assert_eq!(
        generation(&db, &parent),
        waiting_generation + 1,
        "one control claim"
    );
    assert_eq!(children(&db, &parent), 1);
    assert_eq!(apply_lines(&server.scratch().join("apply.log")).len(), 1);
    assert_consistent(&server).await;
}

/// The same race with the server killed while the answers are in flight:
/// after the restart every retry (same client and key) gets the one
/// outcome, and there is still one winner and one continuation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_amid_racing_answers_keeps_one_winner_and_one_continuation() {
    let mut server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(server.scratch(), plain_decision());
    let (parent, decision) = waiting(&mut client, &script).await;
    let waiting_generation = generation(&server.db(), &parent);
    let specs = [
        answer_spec(&parent, &decision, "approve", Value::Null),
        answer_spec(&parent, &decision, "revise", json!({"feedback": "b"})),
        answer_spec(&parent, &decision, "revise", json!({"feedback": "c"})),
    ];
    let mut people = Vec::new();
    for spec in &specs {
        let mut person = server.client().await;
        let id = person.client_id().to_owned();
        let spec = spec.clone();
        let handle = tokio::spawn(async move {
            let _ = person.request(&spec).await;
        });
        people.push((id, handle));
    }
    server.kill();
    for (_, handle) in &people {
        handle.abort();
    }
    server.spawn().expect("the server restarts");
    let mut winners = Vec::new();
    for ((id, _), spec) in people.iter().zip(&specs) {
        let mut person = reconnect(&server, id).await;
        let response = person.request(spec).await.unwrap();
        match response.outcome.as_str() {
            "accepted" | "adopted" => {
                winners.push(response.receipt.unwrap()["continuationRunId"].clone())
            }
            _ => assert_eq!(
                response.error_code.as_deref(),
                Some("conflict"),
                "{:?}",
                response.frame
            ),
        }
    }
    let child = child_of(&server, &parent).await;
    assert!(
        !winners.is_empty() && winners.iter().all(|id| *id == json!(child)),
        "{winners:?}"
    );
    assert_eq!(
        status(&wait_settled(&mut client_after(&server).await, &child).await),
        "completed"
    );
    let db = server.db();
    assert_eq!(events(&db, &parent, "decisionAccepted"), 1);
    assert_eq!(generation(&db, &parent), waiting_generation + 1);
    assert_eq!(children(&db, &parent), 1);
    assert_eq!(apply_lines(&server.scratch().join("apply.log")).len(), 1);
    assert_consistent(&server).await;
}

async fn client_after(server: &TestServer) -> Client {
    server.client().await
}

// ---- crashes -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_answer_commits_leaves_the_decision_pending_and_the_retry_wins_once() {
    let mut server = TestServer::new(&[("PI_WORKFLOWS_FAULT", "decision_before_commit")]);
    server.spawn().unwrap();
    let mut client = server.client().await;
    let script = decision_script(server.scratch(), plain_decision());
    let (parent, decision) = waiting(&mut client, &script).await;
    let spec = answer_spec(&parent, &decision, "approve", Value::Null);
    let lost = client.request(&spec).await;
    assert!(
        lost.is_err(),
        "the server died inside the answer's transaction: {lost:?}"
    );
    assert!(
        server.wait_exit(SETTLE_TIMEOUT),
        "the fault point killed the server"
    );
    {
        let db = server.db();
        assert_eq!(decision_row(&db, &parent), ("pending".into(), None));
        assert_eq!(children(&db, &parent), 0);
        assert_eq!(
            count(
                &db,
                "SELECT COUNT(*) FROM host_commands WHERE operation = 'decision.answer'",
                []
            ),
            0,
            "no receipt without the acceptance"
        );
    }
    server.remove_env("PI_WORKFLOWS_FAULT");
    server.spawn().expect("the server restarts");
    let mut again = reconnect(&server, client.client_id()).await;
    let retried = again.request(&spec).await.unwrap();
    assert_eq!(retried.outcome, "accepted", "{:?}", retried.frame);
    let child = child_of(&server, &parent).await;
    assert_eq!(status(&wait_settled(&mut again, &child).await), "completed");
    let db = server.db();
    assert_eq!(events(&db, &parent, "decisionAccepted"), 1);
    assert_eq!(apply_lines(&server.scratch().join("apply.log")).len(), 1);
    assert_consistent(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_acceptance_adopts_the_stored_answer_on_retry() {
    // The first receipt is run.start's, the second the answer's.
    let mut server = TestServer::new(&[("PI_WORKFLOWS_FAULT", "after_receipt:2")]);
    server.spawn().unwrap();
    let mut client = server.client().await;
    let script = decision_script(server.scratch(), plain_decision());
    let (parent, decision) = waiting(&mut client, &script).await;
    let spec = answer_spec(&parent, &decision, "approve", Value::Null);
    assert!(
        client.request(&spec).await.is_err(),
        "no reply: the server died after the commit"
    );
    assert!(server.wait_exit(SETTLE_TIMEOUT));
    assert_eq!(decision_row(&server.db(), &parent).0, "accepted");
    server.remove_env("PI_WORKFLOWS_FAULT");
    server.spawn().expect("the server restarts");
    let mut again = reconnect(&server, client.client_id()).await;
    let retried = again.request(&spec).await.unwrap();
    assert_eq!(retried.outcome, "adopted", "{:?}", retried.frame);
    let child = retried.receipt.unwrap()["continuationRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(status(&wait_settled(&mut again, &child).await), "completed");
    let db = server.db();
    assert_eq!(children(&db, &parent), 1);
    assert_eq!(events(&db, &parent, "decisionAccepted"), 1);
    assert_eq!(apply_lines(&server.scratch().join("apply.log")).len(), 1);
    assert_consistent(&server).await;
}

/// A decision answered `approve` whose continuation runs its `publish`
/// node, held until the test writes `go`; the node's effect appends to
/// `log`. Returns (parent, continuation, go, log).
async fn continuation_at_publish(
    server: &TestServer,
    client: &mut Client,
) -> (String, String, PathBuf, PathBuf) {
    let go = server.scratch().join("go");
    let log = server.scratch().join("apply.log");
    let script = decision_script_with(
        server.scratch(),
        plain_decision(),
        json!({"awaitFile": go, "then": {"effect": {"type": "publish", "request": {}, "applyLog": log}}}),
    );
    let (parent, decision) = waiting(client, &script).await;
    let answered = request(
        client,
        &answer_spec(&parent, &decision, "approve", Value::Null),
    )
    .await;
    assert_eq!(answered.outcome, "accepted", "{:?}", answered.frame);
    let child = child_of(server, &parent).await;
    wait_view(client, &child, SETTLE_TIMEOUT, |view| {
        view["display"]["currentNode"] == "publish" && status(view) == "running"
    })
    .await;
    (parent, child, go, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_continuation_started_runs_each_continuation_node_once() {
    let mut server = TestServer::start();
    let mut client = server.client().await;
    let (parent, child, go, log) = continuation_at_publish(&server, &mut client).await;
    server.kill();
    server.spawn().expect("the server restarts");
    std::fs::write(&go, b"").unwrap();
    let mut client = server.client().await;
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    let db = server.db();
    assert_eq!(children(&db, &parent), 1);
    assert_eq!(decision_row(&db, &parent).0, "accepted");
    assert_eq!(apply_lines(&log).len(), 1, "publish applied once");
    assert_consistent(&server).await;
}

/// The continuation's first runner (the winner that claimed it) stops while
/// it holds the claim (SIGSTOP: no renewal, no exit): the claim's expiry
/// hands the run to the next generation, which fences the stopped runner
/// and continues the run; nothing runs twice and the decision is not
/// touched again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_whose_first_runner_dies_is_handed_to_the_next_lease() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let (_, child, go, log) = continuation_at_publish(&server, &mut client).await;
    let db = server.db();
    let first = generation(&db, &child);
    let runner = support::runner_identity(&db, &child, first as u64).expect("the winner's runner");
    let decided = snapshot_of(&db, "human_decisions");
    support::signal(&runner, nix::sys::signal::Signal::SIGSTOP);
    wait_for(SETTLE_TIMEOUT, "the next generation", || {
        (generation(&db, &child) > first).then_some(())
    })
    .await;
    std::fs::write(&go, b"").unwrap();
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    assert!(
        generation(&db, &child) > first,
        "the next lease continued the run"
    );
    assert_eq!(snapshot_of(&db, "human_decisions"), decided);
    assert_eq!(apply_lines(&log).len(), 1, "publish applied once");
    assert_consistent(&server).await;
}

fn snapshot_of(db: &Connection, table: &str) -> Vec<String> {
    snapshot(db)
        .into_iter()
        .find(|(name, _)| name == table)
        .map(|(_, rows)| rows)
        .unwrap()
}

/// Direct answer handling and recovery notice the same accepted decision:
/// an accepted decision without its continuation (what a writer older than
/// the one-transaction acceptance could leave) is continued by startup
/// recovery while a person's identical answer arrives. One continuation,
/// one control generation, each node once; the answer gets the same child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_answer_racing_recovery_continues_the_decision_once() {
    let mut server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(server.scratch(), plain_decision());
    let (parent, decision) = waiting(&mut client, &script).await;
    server.stop();
    let waiting_generation = generation(&server.db(), &parent);
    {
        let response = br#"{"choice":"approve"}"#;
        let digest = server::ids::sha256(response).0.to_vec();
        let db = Connection::open(server.home.join("state.sqlite")).unwrap();
        db.execute(
            "INSERT OR IGNORE INTO blobs (digest, media_type, bytes, created_at_ms) VALUES (?1, 'application/json', ?2, 0)",
            rusqlite::params![digest, response.to_vec()],
        )
        .unwrap();
        db.execute(
            "UPDATE human_decisions SET state = 'accepted', provenance = 'human', answer_digest = ?2,
                 answer_channel = 'cli', answer_actor_id = 'operator-1'
             WHERE run_id = ?1",
            rusqlite::params![parent, digest],
        )
        .unwrap();
    }
    let spec = answer_spec(&parent, &decision, "approve", Value::Null);
    let socket = server.socket();
    let person = tokio::spawn(async move {
        let mut person = loop {
            if let Ok(person) = Client::connect(&socket, "person-racing-recovery").await {
                break person;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        person.request(&spec).await.unwrap()
    });
    server.spawn().expect("the server restarts");
    let answered = person.await.unwrap();
    assert!(answered.is_accepted(), "{:?}", answered.frame);
    let child = child_of(&server, &parent).await;
    assert_eq!(answered.receipt.unwrap()["continuationRunId"], json!(child));
    let mut client = server.client().await;
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    let db = server.db();
    assert_eq!(children(&db, &parent), 1);
    assert_eq!(
        generation(&db, &parent),
        waiting_generation + 1,
        "one control generation"
    );
    assert_eq!(apply_lines(&server.scratch().join("apply.log")).len(), 1);
    assert_consistent(&server).await;
}

// ---- cancellation, pause ------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_run_cancels_its_decision_and_blocks_answers() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(
        server.scratch(),
        json!({"title": "Publish?", "choices": choices(), "expiresInMs": 1500, "defaultResponse": {"choice": "approve"}}),
    );
    let (parent, decision) = waiting(&mut client, &script).await;
    let cancelled = request(
        &mut client,
        &RequestSpec::command("run.cancel", Some(&parent), json!({})),
    )
    .await;
    assert_eq!(cancelled.outcome, "accepted", "{:?}", cancelled.frame);
    let db = server.db();
    assert_eq!(decision_row(&db, &parent).0, "cancelled");
    let answer = request(
        &mut client,
        &answer_spec(&parent, &decision, "approve", Value::Null),
    )
    .await;
    assert_eq!(answer.outcome, "rejected", "{:?}", answer.frame);
    assert_eq!(
        answer.error_message.as_deref(),
        Some("the decision was cancelled with its run")
    );
    // The deadline passes: the cancelled decision stays cancelled.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(decision_row(&db, &parent).0, "cancelled");
    assert_eq!(children(&db, &parent), 0);
    assert_eq!(status(&view(&mut client, &parent).await), "cancelled");
    assert_consistent(&server).await;
}

const SESSION: &str = "session-decisions";

/// Starts an interactive run of `script` in [`SESSION`] and waits for its
/// decision.
async fn waiting_interactive(client: &mut Client, script: &Path) -> (String, Value) {
    let response = request(
        client,
        &RequestSpec::command(
            "run.start",
            None,
            json!({"workflow": script.to_string_lossy(), "input": {"task": "ship"}, "projectPath": "/tmp",
                   "executionMode": "interactive", "originSessionId": SESSION}),
        ),
    )
    .await;
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    let run_id = response.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = wait_view(client, &run_id, SETTLE_TIMEOUT, |view| {
        view["decision"].is_object()
    })
    .await;
    (run_id, decision_of(&view))
}

fn decision_messages(db: &Connection, run_id: &str) -> Vec<(String, String)> {
    let mut statement = db
        .prepare("SELECT message_id, state FROM workflow_messages WHERE run_id = ?1 AND kind = 'decision' ORDER BY session_order")
        .unwrap();
    statement
        .query_map([run_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_holds_the_deadline_and_resuming_keeps_the_request_and_its_one_message() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(
        server.scratch(),
        json!({"title": "Publish?", "choices": choices(), "expiresInMs": 1500, "defaultResponse": {"choice": "approve"}}),
    );
    let (parent, decision) = waiting_interactive(&mut client, &script).await;
    let db = server.db();
    let messages = decision_messages(&db, &parent);
    assert_eq!(messages.len(), 1, "one decision message: {messages:?}");
    let digest_before: Vec<u8> = db
        .query_row(
            "SELECT request_digest FROM human_decisions WHERE run_id = ?1",
            [&parent],
            |row| row.get(0),
        )
        .unwrap();
    let paused = request(
        &mut client,
        &RequestSpec::command("run.pause", Some(&parent), json!({})),
    )
    .await;
    assert_eq!(paused.outcome, "accepted", "{:?}", paused.frame);
    let refused = request(
        &mut client,
        &answer_spec(&parent, &decision, "approve", Value::Null),
    )
    .await;
    assert_eq!(
        refused.error_code.as_deref(),
        Some("paused"),
        "{:?}",
        refused.frame
    );
    // Past the deadline, the paused decision is still pending.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(decision_row(&db, &parent).0, "pending");
    assert_eq!(
        decision_messages(&db, &parent),
        messages,
        "pause keeps the one message"
    );
    let resumed = request(
        &mut client,
        &RequestSpec::command("run.resume", Some(&parent), json!({})),
    )
    .await;
    assert_eq!(resumed.outcome, "accepted", "{:?}", resumed.frame);
    // Resume re-arms the passed deadline: the default wins now.
    let child = child_of(&server, &parent).await;
    assert_eq!(
        decision_row(&db, &parent),
        ("accepted".into(), Some("timeout".into()))
    );
    let digest_after: Vec<u8> = db
        .query_row(
            "SELECT request_digest FROM human_decisions WHERE run_id = ?1",
            [&parent],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(digest_before, digest_after, "the same request");
    let after = decision_messages(&db, &parent);
    assert_eq!(after.len(), 1, "no second decision message: {after:?}");
    assert_eq!(after[0].0, messages[0].0);
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    assert_consistent(&server).await;
}

// ---- an included plan approval with a bounded replan loop ---------------------

/// `plan → approval (an included workflow: its gate is a human decision;
/// approve leaves through exit `approved` to `done`, revise through exit
/// `revise` back to `plan`)`. Each round is one continuation (the gate
/// waits); steps carry over, so the root `maxSteps: 5` bounds the whole
/// chain: plan, gate, plan, gate, plan, and the third gate fails the run.
fn plan_approval_script(dir: &Path) -> PathBuf {
    let mut entry = node("approval", "compute");
    entry["mountPath"] = json!(["approval"]);
    entry["includeTransition"] = json!("entry");
    let mut gate = gate();
    gate["id"] = json!("approval/gate");
    gate["mountPath"] = json!(["approval"]);
    let exit = |name: &str| {
        let mut exit = node(&format!("approval/__piw_exit_{name}"), "compute");
        exit["mountPath"] = json!(["approval"]);
        exit["includeTransition"] = json!("exit");
        exit
    };
    write_script(
        dir,
        "plan-approval.json",
        &json!({
            "workflowName": "plan-approval",
            "topology": {
                "startAt": "plan",
                "maxSteps": 5,
                "nodes": [node("plan", "compute"), entry, gate, exit("approved"), exit("revise"), node("done", "compute")],
                "edges": [
                    {"kind": "plain", "from": "plan", "to": "approval"},
                    {"kind": "plain", "from": "approval", "to": "approval/gate"},
                    {"kind": "switch", "from": "approval/gate", "on": "$.choice",
                     "cases": {"approve": "approval/__piw_exit_approved", "revise": "approval/__piw_exit_revise"}},
                    {"kind": "plain", "from": "approval/__piw_exit_approved", "to": "done"},
                    {"kind": "plain", "from": "approval/__piw_exit_revise", "to": "plan"},
                ],
                "mounts": [{"mountPath": ["approval"], "entry": "approval", "maxSteps": 1}],
            },
            "nodes": {"approval/gate": [{"decide": {"title": "Approve the plan?", "choices": choices()}}]},
        }),
    )
}

/// Answers the decision `run_id` waits on; returns the continuation.
async fn answer_round(
    server: &TestServer,
    client: &mut Client,
    run_id: &str,
    choice: &str,
) -> String {
    let view = wait_view(client, run_id, SETTLE_TIMEOUT, |view| {
        view["decision"].is_object()
    })
    .await;
    assert_eq!(view["decision"]["nodeId"], "approval/gate");
    let input = match choice {
        "revise" => json!({"feedback": "smaller steps"}),
        _ => Value::Null,
    };
    let answered = request(
        client,
        &answer_spec(run_id, &decision_of(&view), choice, input),
    )
    .await;
    assert_eq!(answered.outcome, "accepted", "{:?}", answered.frame);
    child_of(server, run_id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_included_plan_approval_loops_on_revise_within_max_steps_and_completes_on_approve() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = plan_approval_script(server.scratch());

    // Revise, then approve: three runs in the chain, the last completes at done.
    let first = started(&mut client, &script).await;
    let second = answer_round(&server, &mut client, &first, "revise").await;
    let third = answer_round(&server, &mut client, &second, "approve").await;
    let done = wait_settled(&mut client, &third).await;
    assert_eq!(status(&done), "completed", "{done}");

    // Revise, revise: the loop is bounded, the third round fails on maxSteps
    // before its gate opens another decision.
    let first = started(&mut client, &script).await;
    let second = answer_round(&server, &mut client, &first, "revise").await;
    let third = answer_round(&server, &mut client, &second, "revise").await;
    let failed = wait_settled(&mut client, &third).await;
    assert_eq!(status(&failed), "failed", "{failed}");
    assert!(
        failed["display"]["reason"]
            .as_str()
            .unwrap()
            .contains("maxSteps"),
        "{failed}"
    );
    let db = server.db();
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM human_decisions WHERE run_id = ?1",
            [&third]
        ),
        0,
        "no decision past the bound"
    );
    assert_consistent(&server).await;
}

// ---- redaction -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_view_list_session_view_status_or_log_shows_the_subject_or_who_answered() {
    const SUBJECT: &str = "SUBJECT-SECRET-7f3a";
    const ACTOR: &str = "ACTOR-SECRET-91bd";
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(
        server.scratch(),
        json!({"title": "Publish?", "choices": choices(), "subject": {"release": SUBJECT},
               "blocks": [{"kind": "paragraph", "text": "Release notes are attached."}]}),
    );
    let (parent, decision) = waiting_interactive(&mut client, &script).await;
    let mut shown = Vec::new();
    let read = |operation: &str, run_id: Option<&str>, payload: Value| {
        RequestSpec::read(operation, run_id, payload)
    };
    let reads = [
        read("run.view", Some(&parent), json!({})),
        read("runs.list", None, json!({})),
        read("sessionView.get", None, json!({"sessionId": SESSION})),
        read("server.status", None, json!({})),
    ];
    for spec in &reads {
        shown.push(request(&mut client, spec).await.frame.to_string());
    }
    let mut spec = answer_spec(&parent, &decision, "approve", Value::Null);
    spec.payload["source"] = json!({"channel": "pi", "actorId": ACTOR});
    let answered = request(&mut client, &spec).await;
    assert_eq!(answered.outcome, "accepted", "{:?}", answered.frame);
    shown.push(answered.frame.to_string());
    let child = child_of(&server, &parent).await;
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    for spec in reads
        .iter()
        .chain([&read("run.view", Some(&child), json!({}))])
    {
        shown.push(request(&mut client, spec).await.frame.to_string());
    }
    // The command line's view and list.
    for args in [
        vec!["view", parent.as_str(), "--once", "--json"],
        vec!["runs", "--json"],
    ] {
        let output = server.command().args(&args).output().unwrap();
        assert!(output.status.success(), "{args:?}: {output:?}");
        shown.push(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    // The decision message's content, as Pi shows it.
    let db = server.db();
    let message: String = db
        .query_row(
            "SELECT CAST(b.bytes AS TEXT) FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest
             WHERE m.run_id = ?1 AND m.kind = 'decision'",
            [&parent],
            |row| row.get(0),
        )
        .unwrap();
    assert!(message.contains("Release notes are attached."), "{message}");
    assert!(message.contains("/workflow answer"), "{message}");
    shown.push(message);
    shown.push(std::fs::read_to_string(server.scratch().join("server.stderr")).unwrap_or_default());
    for text in &shown {
        assert!(!text.contains(SUBJECT), "the subject leaked: {text}");
        assert!(!text.contains(ACTOR), "who answered leaked: {text}");
    }
    // The answer was recorded with its provenance, where no client reads it.
    let who: (String, String) = db
        .query_row(
            "SELECT answer_channel, answer_actor_id FROM human_decisions WHERE run_id = ?1",
            [&parent],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(who, ("pi".into(), ACTOR.into()));
    assert_consistent(&server).await;
}

// ---- the request's checks ------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_a_broken_seal_or_binding_opens_no_decision_and_parks_the_run() {
    let server = TestServer::start();
    let mut client = server.client().await;
    for tamper in ["seal", "binding"] {
        let dir = server.scratch().join(tamper);
        std::fs::create_dir_all(&dir).unwrap();
        let script = decision_script(
            &dir,
            json!({"title": "Publish?", "choices": choices(), "tamper": tamper}),
        );
        let run_id = started(&mut client, &script).await;
        let parked = wait_view(&mut client, &run_id, SETTLE_TIMEOUT, |view| {
            view["status"]["queue"] == "parked" && view["display"]["reason"].is_string()
        })
        .await;
        assert!(
            parked["display"]["reason"]
                .as_str()
                .unwrap()
                .contains("schema check (protocolRejected)"),
            "{tamper}: {parked}"
        );
        assert!(parked.get("decision").is_none(), "{tamper}: {parked}");
        let db = server.db();
        assert_eq!(
            count(
                &db,
                "SELECT COUNT(*) FROM human_decisions WHERE run_id = ?1",
                [&run_id]
            ),
            0,
            "{tamper}: no decision opens"
        );
        assert_eq!(
            count(
                &db,
                "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1 AND node_id = 'gate' AND status = 'finished'",
                [&run_id]
            ),
            0,
            "{tamper}: the checkpoint did not finish"
        );
    }
    assert_consistent(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_from_piw_is_accepted_and_recorded_with_piw_provenance() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(server.scratch(), plain_decision());
    let (parent, decision) = waiting(&mut client, &script).await;
    // What piw's answer dialog sends: its own channel and the local user.
    let mut from_piw = answer_spec(&parent, &decision, "approve", Value::Null);
    from_piw.payload["source"] = json!({"channel": "piw", "actorId": "operator-2"});
    let answered = request(&mut client, &from_piw).await;
    assert_eq!(answered.outcome, "accepted", "{:?}", answered.frame);
    let (channel, actor) = decision_source(&server.db(), &parent);
    assert_eq!(
        (channel.as_deref(), actor.as_deref()),
        (Some("piw"), Some("operator-2"))
    );
    let child = child_of(&server, &parent).await;
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    assert_consistent(&server).await;
}

/// Who answered `run_id`'s decision (channel, actor), as stored.
fn decision_source(db: &Connection, run_id: &str) -> (Option<String>, Option<String>) {
    db.query_row(
        "SELECT answer_channel, answer_actor_id FROM human_decisions WHERE run_id = ?1",
        [run_id],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .unwrap()
}

/// Provenance `telegram` belongs to the server's own channel adapter: a
/// socket client that claims it is refused, and nothing is answered or
/// stored; the decision still takes the client's own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_answer_as_telegram() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let script = decision_script(server.scratch(), plain_decision());
    let (parent, decision) = waiting(&mut client, &script).await;
    let mut forged = answer_spec(&parent, &decision, "approve", Value::Null);
    forged.payload["source"] = json!({"channel": "telegram", "actorId": "12345"});
    let refused = request(&mut client, &forged).await;
    assert_eq!(refused.outcome, "rejected", "{:?}", refused.frame);
    assert_eq!(refused.frame["error"]["code"], "schemaInvalid");
    assert_eq!(decision_source(&server.db(), &parent), (None, None));
    let from_cli = answer_spec(&parent, &decision, "approve", Value::Null);
    let answered = request(&mut client, &from_cli).await;
    assert_eq!(answered.outcome, "accepted", "{:?}", answered.frame);
    assert_consistent(&server).await;
}
