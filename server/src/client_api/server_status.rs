//! `server.status` and the run status read.
//!
//! Invariant (privacy): status output carries counts and the epoch only —
//! never actor or session ids, project paths, prompts, outputs, payloads,
//! claim tokens or their hashes, environment variables or credentials.

use crate::context::Context;
use crate::wire::client::response;
use kernel::ids::RunId;
use protocol::ErrorCode;
use protocol::generated::constrained::{Count, ServerEpoch};
use protocol::generated::types::ServerStatus;
use serde_json::Value;
use std::sync::Arc;

pub use crate::store::counts::{Counts, counts};

/// The `server.status` response.
pub async fn respond(app: &Arc<Context>, request_id: &str) -> Value {
    let counts = app
        .store
        .read(|connection| counts(connection, crate::clock::now_ms()))
        .await;
    let receipt = counts.ok().and_then(|counts| {
        let count = Count::new;
        let status = ServerStatus {
            active_runners: count(app.runners.live_count() as u64)?,
            ambiguous_effects: count(counts.ambiguous_effects)?,
            expired_claims: count(counts.expired_claims)?,
            parked: count(counts.parked)?,
            pending_interactions: count(counts.pending_interactions)?,
            queued: count(counts.queued)?,
            running: count(counts.running)?,
            server_epoch: ServerEpoch::new(app.epoch.0)?,
            socket_available: true,
            waiting: count(counts.waiting)?,
        };
        serde_json::to_value(status).ok()
    });
    match receipt {
        Some(receipt) => response(
            request_id,
            "server.status",
            "accepted",
            None,
            Some(receipt),
            None,
        ),
        None => response(
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
pub async fn run_view(app: &Arc<Context>, request_id: &str, run_id: Option<&RunId>) -> Value {
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
    let view = app
        .store
        .read(move |connection| crate::store::viewer::snapshot(connection, &run_id))
        .await;
    match view {
        Ok(Some(view)) => response(
            request_id,
            "run.view",
            "accepted",
            Some(view.revision.get()),
            serde_json::to_value(&view).ok(),
            None,
        ),
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
