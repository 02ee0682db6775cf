//! Managed effects on the runner channel: `effect.reserve` and
//! `effect.settle`, decided by `kernel::effect`.
//!
//! Invariant: the key is made by the kernel from the active attempt; the
//! runner supplies only the effect type and the request digest, so two runs,
//! two nodes or two visits never share a key.

use crate::context::runners::Runner;
use crate::projection::run_view::{OffSchema, to_wire};
use crate::runner_api::answer::{Answer, Refusal};
use crate::runner_api::reply::ReplyResult;
use crate::store::blobs::{self, Blob};
use crate::store::runs;
use kernel::effect::{
    self, EffectRecord, EffectRejection, EffectState, ReserveRequest, Reserved, SettleOutcome,
    SettleReport, Settled,
};
use kernel::ids::{AttemptId, EffectId};
use kernel::run::RunAggregate;
use protocol::generated::constrained::AttemptNumber;
use protocol::generated::types::{
    ApplyingState, EffectAdoption, EffectReservation, EffectSettlement, SettleState,
};
use rusqlite::Connection;
use serde_json::Value;

/// Decides one `effect.reserve` of the runner.
#[expect(clippy::too_many_arguments, reason = "one message's facts")]
pub(crate) fn reserve(
    connection: &Connection,
    runner: &Runner,
    attempt_id: AttemptId,
    effect_type: String,
    request_digest: &str,
    before: &RunAggregate,
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Answer> {
    let Some(fingerprint) = crate::ids::parse_digest(Some(request_digest)) else {
        return Ok(Err(Refusal::invalid(
            "requestDigest is not a sha256 digest",
        )));
    };
    let existing = match before
        .attempt
        .as_ref()
        .filter(|attempt| attempt.attempt_id == attempt_id)
    {
        Some(attempt) => {
            let id = effect::effect_key(&before.run.run_id, attempt, &effect_type).effect_id();
            runs::load_effect(connection, &before.run.run_id, &id)?
        }
        None => None,
    };
    let request = ReserveRequest {
        attempt_id,
        effect_type,
        request_fingerprint: fingerprint,
    };
    let reserved = effect::reserve(
        before,
        &runner.authority,
        &runner.runner_epoch,
        request,
        existing.as_ref(),
        now_ms,
        ttl_ms,
    );
    Ok(match reserved {
        Ok(Reserved::Apply {
            transition,
            effect_id,
            attempt_number,
        }) => {
            let reservation = EffectReservation {
                attempt_number: attempt_number_of(attempt_number)?,
                effect_id: to_wire("effectId", effect_id.as_str())?,
                state: ApplyingState::Applying,
            };
            Ok((
                Some(transition),
                ReplyResult::EffectReservation(reservation),
                None,
            ))
        }
        Ok(Reserved::Adopt { effect }) => Ok((None, adopted(connection, &effect)?, None)),
        Err(rejection) => Err(refusal(rejection)),
    })
}

/// Decides one `effect.settle` of the runner.
#[expect(clippy::too_many_arguments, reason = "one message's facts")]
pub(crate) fn settle(
    connection: &Connection,
    runner: &Runner,
    effect_id: EffectId,
    outcome: SettleOutcome,
    before: &RunAggregate,
    result_blob: Option<&Blob>,
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Answer> {
    let result = result_blob
        .cloned()
        .unwrap_or_else(|| Blob::json(&Value::Null));
    let settled = if before
        .effects
        .iter()
        .any(|effect| effect.effect_id == effect_id)
    {
        None
    } else {
        runs::load_effect(connection, &before.run.run_id, &effect_id)?
    };
    let report = SettleReport {
        effect_id: effect_id.clone(),
        outcome,
        result_digest: result.digest,
    };
    let decided = effect::settle(
        before,
        &runner.authority,
        &runner.runner_epoch,
        report,
        settled.as_ref(),
        now_ms,
        ttl_ms,
    );
    Ok(match decided {
        Ok(Settled::Commit(transition)) => {
            blobs::put(connection, &result, blobs::JSON, now_ms)?;
            let settlement = EffectSettlement {
                effect_id: to_wire("effectId", effect_id.as_str())?,
                state: match outcome {
                    SettleOutcome::Applied => SettleState::Applied,
                    SettleOutcome::Rejected => SettleState::Rejected,
                },
            };
            Ok((
                Some(transition),
                ReplyResult::EffectSettlement(settlement),
                None,
            ))
        }
        Ok(Settled::Adopt { effect }) => Ok((None, adopted(connection, &effect)?, None)),
        Err(rejection) => Err(refusal(rejection)),
    })
}

/// The reply result for an effect that already settled: the runner skips
/// execution and uses the stored result. The kernel adopts only an
/// `applied` or `rejected` effect; any other state here is a server bug and
/// fails the message's transaction.
fn adopted(connection: &Connection, effect: &EffectRecord) -> rusqlite::Result<ReplyResult> {
    let state = match effect.state {
        EffectState::Applied => SettleState::Applied,
        EffectState::Rejected => SettleState::Rejected,
        EffectState::Reserved
        | EffectState::Applying
        | EffectState::Cancelled
        | EffectState::Ambiguous => return Err(OffSchema("state").into()),
    };
    let result = match &effect.result_digest {
        Some(digest) => blobs::get_json(connection, digest)?,
        None => Value::Null,
    };
    Ok(ReplyResult::EffectAdoption(EffectAdoption {
        attempt_number: attempt_number_of(effect.attempt_number)?,
        effect_id: to_wire("effectId", effect.effect_id.as_str())?,
        result,
        state,
    }))
}

/// An effect's attempt number as the wire types it (from 1).
fn attempt_number_of(attempt_number: u32) -> Result<AttemptNumber, OffSchema> {
    AttemptNumber::new(u64::from(attempt_number)).ok_or(OffSchema("attemptNumber"))
}

fn refusal(rejection: EffectRejection) -> Refusal {
    Refusal::of(&rejection)
}
