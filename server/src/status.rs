//! `server.status` and the run status read.
//!
//! Invariant (privacy): status output carries counts and the epoch only —
//! never actor or session ids, project paths, prompts, outputs, payloads,
//! claim tokens or their hashes, environment variables or credentials.

use crate::app::App;
use crate::handlers::response;
use crate::store::Cached as _;
use kernel::ids::RunId;
use protocol::ErrorCode;
use serde_json::{Value, json};
use std::sync::Arc;

/// The status counts.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub queued: u64,
    pub running: u64,
    pub parked: u64,
    pub waiting: u64,
    pub expired_claims: u64,
    pub pending_interactions: u64,
    pub ambiguous_effects: u64,
}

/// Reads the status counts from committed state.
pub fn counts(connection: &rusqlite::Connection, now_ms: u64) -> rusqlite::Result<Counts> {
    let count = |sql: &str| -> rusqlite::Result<u64> {
        connection
            .query_row_cached(sql, [now_ms as i64], |row| row.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
    };
    Ok(Counts {
        queued: count("SELECT COUNT(*) FROM runs WHERE status = 'queued' AND ?1 >= 0")?,
        running: count(
            "SELECT COUNT(*) FROM runs r JOIN run_queue q ON q.run_id = r.run_id
             WHERE r.status = 'running' AND q.status IN ('starting', 'running') AND ?1 >= 0",
        )?,
        parked: count(
            "SELECT COUNT(*) FROM runs r JOIN run_queue q ON q.run_id = r.run_id
             WHERE r.status = 'running' AND q.status = 'parked' AND ?1 >= 0",
        )?,
        waiting: count("SELECT COUNT(*) FROM runs WHERE status = 'waiting' AND ?1 >= 0")?,
        expired_claims: count(
            "SELECT COUNT(*) FROM leases l JOIN run_queue q ON q.run_id = l.run_id
             WHERE q.status IN ('starting', 'running') AND (l.expires_at_ms IS NULL OR l.expires_at_ms <= ?1)",
        )?,
        pending_interactions: count(
            "SELECT (SELECT COUNT(*) FROM interactive_requests WHERE status = 'pending')
                  + (SELECT COUNT(*) FROM human_decisions WHERE state = 'pending') + 0 * ?1",
        )?,
        ambiguous_effects: count("SELECT COUNT(*) FROM effects WHERE state = 'ambiguous' AND ?1 >= 0")?,
    })
}

/// The `server.status` response.
pub async fn respond(app: &Arc<App>, request_id: &str) -> Value {
    let counts = app
        .store
        .read(|connection| counts(connection, crate::clock::now_ms()))
        .await;
    match counts {
        Ok(counts) => {
            let mut receipt = serde_json::to_value(&counts).unwrap_or(json!({}));
            receipt["serverEpoch"] = json!(app.epoch.0);
            receipt["socketAvailable"] = json!(true);
            receipt["activeRunners"] = json!(app.runners.live_count());
            response(
                request_id,
                "server.status",
                "accepted",
                None,
                Some(receipt),
                None,
            )
        }
        Err(_) => response(
            request_id,
            "server.status",
            "unavailable",
            None,
            None,
            Some((
                ErrorCode::Internal,
                "the state database could not be read".into(),
            )),
        ),
    }
}

/// The run status read (`run.view`): the live run view of one run.
pub async fn run_view(app: &Arc<App>, request_id: &str, run_id: Option<&RunId>) -> Value {
    let Some(run_id) = run_id.cloned() else {
        return response(
            request_id,
            "run.view",
            "rejected",
            None,
            None,
            Some((ErrorCode::SchemaInvalid, "run.view needs a runId".into())),
        );
    };
    let view = crate::view::build(app, run_id).await;
    match view {
        Ok(Some(view)) => {
            let revision = view.get("revision").and_then(Value::as_u64);
            response(
                request_id,
                "run.view",
                "accepted",
                revision,
                Some(view),
                None,
            )
        }
        Ok(None) => response(
            request_id,
            "run.view",
            "notFound",
            None,
            None,
            Some((
                ErrorCode::NotFound,
                "no run with this id; check `pi-workflows runs`".into(),
            )),
        ),
        Err(_) => response(
            request_id,
            "run.view",
            "unavailable",
            None,
            None,
            Some((
                ErrorCode::Internal,
                "the state database could not be read".into(),
            )),
        ),
    }
}
