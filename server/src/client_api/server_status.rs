//! `server.status` and the run status read.
//!
//! Invariant (privacy): status output carries counts and the epoch only —
//! never actor or session ids, project paths, prompts, outputs, payloads,
//! claim tokens or their hashes, environment variables or credentials.

use crate::context::Context;
use crate::wire::client::response;
use kernel::ids::RunId;
use protocol::ErrorCode;
use serde_json::{Value, json};
use std::sync::Arc;

pub use crate::store::counts::{Counts, counts};

/// The `server.status` response.
pub async fn respond(app: &Arc<Context>, request_id: &str) -> Value {
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
