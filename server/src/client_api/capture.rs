//! `sessionEvents.record`: the origin session's coordinator records the Pi
//! events of a run's workflow turns. The rules are `kernel::capture`'s; this
//! module measures and hashes the batch, checks the coordinator epoch under
//! the held coordinator state, and runs load → kernel → write in one job.
//!
//! Invariants:
//! - Events are canonicalised and hashed before the job; a value that is not
//!   JSON the protocol can canonicalise is refused `schemaInvalid` and
//!   nothing is stored.
//! - The authority (the run's origin session, the connection's active
//!   coordinator epoch) is checked inside the job before any stored event is
//!   read; the coordinator state is held across the job, so a takeover cannot
//!   commit between the check and the write.
//! - A refused batch stores nothing; a repeated batch adopts and answers the
//!   same count. No receipt is stored: the run-wide numbers are the batch's
//!   identity.

use crate::context::Context;
use crate::store::Commit;
use crate::store::capture::PreparedEvent;
use crate::wire::client::response;
use kernel::capture::IncomingEvent;
use kernel::ids::{ConnectionId, RunId, SessionId};
use kernel::reject::Coded as _;
use protocol::ErrorCode;
use protocol::generated::types::{RecordEventsReceipt, SessionEventsRecordPayload};
use serde_json::Value;
use std::sync::Arc;

const OPERATION: &str = "sessionEvents.record";

/// What an event's digest covers: its type and data, not its number.
#[derive(serde::Serialize)]
struct Hashed<'a> {
    data: &'a Value,
    #[serde(rename = "type")]
    event_type: &'a str,
}

/// Canonical data and the digest of the canonical `{data, type}` of each event.
fn prepare(payload: &SessionEventsRecordPayload) -> Option<Vec<PreparedEvent>> {
    payload
        .events
        .iter()
        .map(|event| {
            let data = protocol::canonicalize(&event.data).ok()?;
            let whole = protocol::canonicalize_typed(&Hashed {
                data: &event.data,
                event_type: event.type_.as_str(),
            })
            .ok()?;
            Some(PreparedEvent {
                seq: event.seq.get(),
                event_type: event.type_.to_string(),
                data_json: String::from_utf8(data).ok()?,
                digest: crate::ids::sha256(&whole),
            })
        })
        .collect()
}

fn refused(request_id: &str, code: ErrorCode, message: &str, claim_lost: bool) -> Value {
    let outcome = if claim_lost { "claimLost" } else { "rejected" };
    response(
        request_id,
        OPERATION,
        outcome,
        None,
        None,
        Some((code, message.to_owned())),
    )
}

/// `sessionEvents.record {sessionId, runId, events}`.
pub(super) async fn record(
    app: &Arc<Context>,
    request_id: &str,
    payload: &SessionEventsRecordPayload,
    connection_id: &ConnectionId,
) -> Value {
    let Some(events) = prepare(payload) else {
        return refused(
            request_id,
            ErrorCode::SchemaInvalid,
            "an event's data is not canonical JSON",
            false,
        );
    };
    let session_id = SessionId::new(payload.session_id.to_string());
    let run_id = RunId::new(payload.run_id.to_string());
    let request_id_owned = request_id.to_owned();
    // Held across the job: the epoch checked is the one that writes.
    let coordinators = app.coordinators.hold().await;
    let owned = kernel::session::epoch_of(&coordinators.get(&session_id), connection_id).is_some();
    let decided = crate::shell::transact(app, move |connection, now_ms| {
        let Some(agg) = crate::store::runs::load_current(connection, &run_id)? else {
            let value = refused(&request_id_owned, ErrorCode::NotFound, "no such run", false);
            return Ok(Commit::Discard((value, Vec::new())));
        };
        let decided = match kernel::capture::check_authority(&agg.run, &session_id, owned) {
            Ok(()) => {
                let first = events.first().map_or(0, |event| event.seq);
                let last = events.last().map_or(0, |event| event.seq);
                let facts = crate::store::capture::facts(connection, &run_id, first, last)?;
                let batch: Vec<IncomingEvent> = events
                    .iter()
                    .map(|event| IncomingEvent {
                        seq: event.seq,
                        event_type: event.event_type.clone(),
                        digest: event.digest,
                        data_bytes: event.data_json.len(),
                    })
                    .collect();
                kernel::capture::record(&facts, &batch)
            }
            Err(rejection) => Err(rejection),
        };
        let recorded = match decided {
            Ok(recorded) => recorded,
            Err(rejection) => {
                let (code, message, _) = crate::wire::rejection(&rejection);
                let value = refused(&request_id_owned, code, message, rejection.is_claim_loss());
                return Ok(Commit::Discard((value, Vec::new())));
            }
        };
        crate::store::capture::write(connection, &run_id, &recorded, &events, now_ms)?;
        let accepted = protocol::generated::constrained::Count::new(
            (recorded.adopted + recorded.new.len()) as u64,
        )
        .ok_or(crate::projection::run_view::OffSchema("accepted"))?;
        let value = response(
            &request_id_owned,
            OPERATION,
            "accepted",
            None,
            Some(crate::wire::client::receipt(&RecordEventsReceipt {
                accepted,
            })),
            None,
        );
        Ok(Commit::Keep((value, Vec::new())))
    })
    .await;
    drop(coordinators);
    match decided {
        Ok(value) => value,
        Err(error) => response(
            request_id,
            OPERATION,
            "unavailable",
            None,
            None,
            Some(error.refusal()),
        ),
    }
}
