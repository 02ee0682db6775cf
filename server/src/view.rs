//! The live run view (`pi-workflows.run-view.v1`) built from one consistent
//! read of committed facts.
//!
//! Invariants:
//! - One transaction reads every fact of one view, so a view never mixes two
//!   revisions.
//! - `display` comes only from the kernel's reducer; the view adds no status
//!   logic of its own.
//! - Generated content (the complete definition and graph history, long
//!   reasons) is stored under the exact run id, digest and media type in
//!   `run_view_content` before a reference to it is returned.

use crate::app::App;
use crate::store::codec_name;
use crate::store::{Commit, meta, runs};
use kernel::display::{self, DisplayFacts, DisplayReason, OutsideFacts};
use kernel::ids::RunId;
use kernel::run::{ParkReason, RunAggregate};
use rusqlite::{Connection, params};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Reasons longer than this many characters become a notice plus a reference.
pub const INLINE_REASON_CHARS: usize = 16 * 1024;
/// At most this many steps are inline in a view; the rest are paged.
pub const STEP_PAGE_LIMIT: usize = 256;

/// Builds the run view of `run_id`, or `None` when it does not exist.
pub async fn build(
    app: &Arc<App>,
    run_id: RunId,
) -> Result<Option<Value>, crate::store::StoreError> {
    app.store
        .write(move |connection| Ok(Commit::Keep(build_in(connection, &run_id)?)))
        .await
}

/// Builds the view inside the caller's transaction.
pub fn build_in(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Option<Value>> {
    let Some(agg) = runs::load(connection, run_id)? else {
        return Ok(None);
    };
    let Some(meta) = meta::load(connection, run_id)? else {
        return Ok(None);
    };
    let topology_json: String = connection.query_row(
        "SELECT topology_json FROM workflow_definitions WHERE definition_digest = ?1",
        params![meta.definition_digest],
        |row| row.get(0),
    )?;
    let topology: Option<kernel::topology::Topology> = serde_json::from_str(&topology_json).ok();
    let steps = step_records(connection, run_id)?;
    let error_message: Option<String> = connection.query_row(
        "SELECT error_message FROM runs WHERE run_id = ?1",
        params![run_id.as_str()],
        |row| row.get(0),
    )?;
    let revision: i64 = connection.query_row(
        "SELECT presentation_revision FROM viewer_runs WHERE run_id = ?1",
        params![run_id.as_str()],
        |row| row.get(0),
    )?;
    let display = display::display(&DisplayFacts::from_run(
        &agg,
        OutsideFacts {
            submission_validating: false,
            restart_eligible: true,
        },
    ));
    let mut display_value = json!({
        "status": codec_name(&display.status),
        "activity": codec_name(&display.activity),
        "controls": display.controls.iter().map(codec_name).collect::<Vec<_>>(),
    });
    if let Some(node) = &display.current_node {
        display_value["currentNode"] = json!(node.as_str());
    }
    if let Some(node) = &display.waiting_on {
        display_value["waitingOn"] = json!(node.as_str());
    }
    if let Some(reason) = display
        .reason
        .as_ref()
        .map(|reason| reason_text(reason, error_message.as_deref()))
    {
        if reason.chars().count() <= INLINE_REASON_CHARS {
            display_value["reason"] = json!(reason);
        } else {
            let reference = store_content(connection, run_id, reason.as_bytes(), "text/plain")?;
            display_value["reasonNotice"] =
                json!("The reason is longer than 16 KiB; read it through reasonContent.");
            display_value["reasonContent"] = reference;
        }
    }
    let definition = store_content(
        connection,
        run_id,
        topology_json.as_bytes(),
        "application/json",
    )?;
    let history_bytes =
        protocol::canonicalize(&json!(steps.iter().map(|s| &s.value).collect::<Vec<_>>()))
            .unwrap_or_default();
    let graph_history = store_content(connection, run_id, &history_bytes, "application/json")?;
    let mut view = json!({
        "schema": "pi-workflows.run-view.v1",
        "runId": run_id.as_str(),
        "revision": revision.max(agg.run.revision.0 as i64),
        "workflowName": meta.workflow_name,
        "status": {
            "run": codec_name(&agg.run.status),
            "queue": codec_name(&agg.run.queue),
            "paused": agg.run.paused,
            "executionMode": if agg.run.mode.origin_session().is_some() { "interactive" } else { "headless" },
        },
        "display": display_value,
        "createdAtMs": agg.run.created_at_ms,
        "updatedAtMs": agg.run.updated_at_ms,
        "nodes": nodes(topology.as_ref(), &agg, &steps),
        "edges": edges(topology.as_ref()),
        "steps": {
            "items": steps.iter().take(STEP_PAGE_LIMIT).map(|s| s.value.clone()).collect::<Vec<_>>(),
            "total": steps.len(),
        },
        "updates": { "items": [], "total": 0 },
        "definition": definition,
        "graphHistory": graph_history,
    });
    if steps.len() > STEP_PAGE_LIMIT {
        view["steps"]["nextCursor"] = json!(format!("steps:{STEP_PAGE_LIMIT}"));
    }
    if let Some(title) = meta.title.filter(|title| !title.is_empty()) {
        view["title"] = json!(title.chars().take(200).collect::<String>());
    }
    if let Some(finished) = agg.run.finished_at_ms {
        view["finishedAtMs"] = json!(finished);
    }
    if let Some(error) = &agg.run.error {
        let message = error_message
            .clone()
            .unwrap_or_else(|| codec_name(&error.reason));
        view["failure"] = json!({ "class": codec_name(&error.class), "message": message.chars().take(512).collect::<String>() });
    }
    Ok(Some(view))
}

fn reason_text(reason: &DisplayReason, error_message: Option<&str>) -> String {
    match reason {
        DisplayReason::Error { error } => match error_message.filter(|message| !message.is_empty()) {
            Some(message) => format!("{}: {message}", codec_name(&error.reason)),
            None => codec_name(&error.reason),
        },
        DisplayReason::EffectAmbiguous => {
            "An external effect may have applied without a receipt. Check the external system, then confirm or retry it.".into()
        }
        DisplayReason::ParkedForReview { park_reason } => match park_reason {
            ParkReason::RunnerNoProgress => {
                "The runner exited before the run made progress. Fix the cause, then resume or cancel the run.".into()
            }
            ParkReason::WorkflowSourceChanged => {
                "The workflow source changed since the run started. Restore it and resume, or cancel the run.".into()
            }
            ParkReason::WorkerTimedOut => "The runner did not start in time. Resume to try again, or cancel the run.".into(),
            other => format!("Parked: {}.", codec_name(other)),
        },
    }
}

/// Stores generated content for `run_id` and returns its reference.
pub fn store_content(
    connection: &Connection,
    run_id: &RunId,
    bytes: &[u8],
    media_type: &str,
) -> rusqlite::Result<Value> {
    let digest = crate::ids::sha256(bytes);
    connection.execute(
        "INSERT INTO run_view_content (run_id, digest, media_type, bytes, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT DO NOTHING",
        params![run_id.as_str(), digest.0.to_vec(), media_type, bytes, crate::clock::now_ms() as i64],
    )?;
    Ok(
        json!({ "digest": crate::ids::digest_text(&digest), "mediaType": media_type, "bytes": bytes.len() }),
    )
}

/// One graph step with its attempts.
struct Step {
    node_id: String,
    outcome: Option<String>,
    value: Value,
}

fn step_records(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Vec<Step>> {
    let mut statement = connection.prepare_cached(
        "SELECT attempt_id, node_id, visit, status, outcome, started_at_ms, finished_at_ms, seq
         FROM node_attempts WHERE run_id = ?1 ORDER BY seq",
    )?;
    let rows = statement.query_map(params![run_id.as_str()], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, i64>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, Option<String>>(4)?,
            row.get::<_, i64>(5)?,
            row.get::<_, Option<i64>>(6)?,
        ))
    })?;
    let mut steps: Vec<Step> = Vec::new();
    let mut index: BTreeMap<(String, i64), usize> = BTreeMap::new();
    for row in rows {
        let (attempt_id, node_id, visit, status, outcome, started, finished) = row?;
        let mut attempt =
            json!({ "attemptId": attempt_id, "attemptNumber": 1, "startedAtMs": started });
        if let Some(finished) = finished {
            attempt["finishedAtMs"] = json!(finished);
        }
        if let Some(outcome) = &outcome {
            attempt["outcome"] = json!(outcome);
        }
        let key = (node_id.clone(), visit);
        if let Some(&at) = index.get(&key) {
            let step = &mut steps[at];
            let attempts = step.value["attempts"]
                .as_array_mut()
                .expect("attempts array");
            attempt["attemptNumber"] = json!(attempts.len() + 1);
            attempts.push(attempt);
            set_step_end(step, finished, outcome, &status);
            continue;
        }
        let mut step = Step {
            node_id: node_id.clone(),
            outcome: None,
            value: json!({ "seq": steps.len() + 1, "nodeId": node_id, "visit": visit, "attempts": [attempt], "startedAtMs": started }),
        };
        set_step_end(&mut step, finished, outcome, &status);
        index.insert(key, steps.len());
        steps.push(step);
    }
    Ok(steps)
}

fn set_step_end(step: &mut Step, finished: Option<i64>, outcome: Option<String>, status: &str) {
    if status == "finished" {
        step.value["finishedAtMs"] = json!(finished);
        step.value["outcome"] = json!(outcome);
        step.outcome = outcome;
    }
}

fn nodes(
    topology: Option<&kernel::topology::Topology>,
    agg: &RunAggregate,
    steps: &[Step],
) -> Vec<Value> {
    let Some(topology) = topology else {
        return Vec::new();
    };
    topology
        .nodes
        .iter()
        .map(|node| {
            let visits = steps.iter().filter(|step| step.node_id == node.id.as_str()).count();
            let last = steps.iter().rev().find(|step| step.node_id == node.id.as_str());
            let unfinished = agg.attempt.as_ref().filter(|attempt| attempt.status.is_unfinished() && attempt.node_id == node.id);
            let state = match (unfinished.map(|attempt| attempt.status), last.and_then(|step| step.outcome.as_deref())) {
                (Some(kernel::attempt::AttemptStatus::Waiting), _) => "waiting",
                (Some(_), _) => "running",
                (None, Some("ok")) if agg.run.waiting_on.as_ref() == Some(&node.id) => "waiting",
                (None, Some("ok")) => "completed",
                (None, Some("failed")) => "failed",
                (None, Some("timed_out")) => "timed_out",
                (None, Some("cancelled")) => "cancelled",
                _ => "pending",
            };
            json!({ "id": node.id.as_str(), "nodeType": codec_name(&node.node_type), "visits": visits, "state": state })
        })
        .collect()
}

fn edges(topology: Option<&kernel::topology::Topology>) -> Vec<Value> {
    let Some(topology) = topology else {
        return Vec::new();
    };
    let mut edges = Vec::new();
    for edge in &topology.edges {
        match edge {
            kernel::topology::Edge::Plain { from, to } => {
                edges.push(json!({ "from": from.as_str(), "to": to.as_str() }))
            }
            kernel::topology::Edge::Switch { from, cases, .. } => {
                for (case, to) in cases {
                    edges.push(json!({ "from": from.as_str(), "to": to.as_str(), "label": case.chars().take(200).collect::<String>() }));
                }
            }
        }
    }
    edges
}
