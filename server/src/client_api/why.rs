//! `run.why`: why a run is not progressing and who must act.
//!
//! The shell's shape for a read: one read snapshot of the run's facts
//! (`store::why`), the kernel's decision (`kernel::why::explain` at the
//! current time), the wire document (`projection::why`).
//!
//! Invariant (privacy, the rules of `server.status`): the answer carries no
//! token, prompt, output, payload, session id or path; the kernel's facts
//! hold none (`kernel::why`).

use crate::context::Context;
use crate::store::why::Slots;
use crate::wire::client::response;
use kernel::ids::RunId;
use protocol::ErrorCode;
use serde_json::Value;
use std::sync::Arc;

/// The `run.why` response.
pub(super) async fn respond(app: &Arc<Context>, request_id: &str, run_id: Option<&RunId>) -> Value {
    let Some(run_id) = run_id.cloned() else {
        return response(
            request_id,
            "run.why",
            "rejected",
            None,
            None,
            Some((
                ErrorCode::SchemaInvalid,
                "run.why needs a runId; list runs with `pi-workflows runs`".into(),
            )),
        );
    };
    let slots = Slots {
        occupied: (app.runners.occupied() + app.validations.slots_taken()) as u64,
        capacity: u64::from(app.config.max_workers),
    };
    let read_id = run_id.clone();
    let facts = app
        .store
        .read(move |connection| crate::store::why::facts(connection, &read_id, slots))
        .await;
    let unavailable = || {
        response(
            request_id,
            "run.why",
            "unavailable",
            None,
            None,
            Some((
                ErrorCode::Internal,
                "the state database could not be read".into(),
            )),
        )
    };
    match facts {
        Ok(Some(facts)) => {
            let why = kernel::why::explain(&facts, crate::clock::now_ms());
            match crate::projection::why::run_why(&run_id, &why)
                .ok()
                .and_then(|document| serde_json::to_value(document).ok())
            {
                Some(receipt) => response(
                    request_id,
                    "run.why",
                    "accepted",
                    Some(facts.last_commit.revision),
                    Some(receipt),
                    None,
                ),
                None => unavailable(),
            }
        }
        Ok(None) => response(
            request_id,
            "run.why",
            "notFound",
            None,
            None,
            Some((
                ErrorCode::NotFound,
                "no run with this id; check `pi-workflows runs`".into(),
            )),
        ),
        Err(_) => unavailable(),
    }
}
