//! Workflow updates from runners (`node.update`) and from the agent tool
//! (`interaction.update`), decided by `kernel::updates` against the run's
//! bucket, pair count and receipts.
//!
//! Invariants:
//! - An update replaces the current value of its `(type, key)` in the same
//!   transaction as its receipt and the run's new bucket state.
//! - `interaction.update` takes the exact request (interaction) id, the
//!   tool call's idempotency key and the authority of the request's run, one
//!   branch per execution mode: the live runner's (generation and epoch) for
//!   a headless run; the origin session's active coordinator epoch for an
//!   interactive one (held across the job, as for a submission). The
//!   authority and the request's kind are checked before the receipt
//!   lookup; the update receipt (`update_receipts`) is the command's
//!   receipt.

use crate::context::Context;
use crate::context::runners::Runner;
use crate::projection::run_view::{OffSchema, to_wire};
use crate::runner_api::answer::{Answer, Refusal};
use crate::runner_api::reply::ReplyResult;
use crate::store::{Commit, runs};
use crate::wire::client::response;
use kernel::ids::{
    AttemptId, CoordinatorEpoch, Digest, Generation, IdempotencyKey, InteractionId, RunId,
    RunnerEpochId, SessionId,
};
use kernel::interaction::{self, SubmitAuthority};
use kernel::output::Transition;
use kernel::run::RunAggregate;
use kernel::updates::{
    self, JsonKind, UpdateData, UpdateDecision, UpdateId, UpdateInput, UpdateLookup, UpdateReceipt,
    UpdateRejection, UpdateSource,
};
use protocol::ErrorCode;
use protocol::generated::constrained::Sequence;
use protocol::generated::types::{
    InteractionAuthority, InteractionUpdatePayload, InteractionUpdateReceipt, NodeUpdateResult,
};
use rusqlite::Connection;
use serde_json::Value;
use std::sync::Arc;

/// The update data, encoded and hashed before the transaction.
#[derive(Debug, Clone)]
pub struct EncodedUpdate {
    pub kind: JsonKind,
    /// How deep the data nests (the data object is level 1).
    pub depth: u32,
    pub text: String,
    pub digest: Digest,
}

impl EncodedUpdate {
    /// Encodes `data` canonically.
    pub fn of(data: &Value) -> Self {
        let kind = match data {
            Value::Null => JsonKind::Null,
            Value::Bool(_) => JsonKind::Bool,
            Value::Number(_) => JsonKind::Number,
            Value::String(_) => JsonKind::String,
            Value::Array(_) => JsonKind::Array,
            Value::Object(_) => JsonKind::Object,
        };
        let bytes = protocol::canonicalize(data).unwrap_or_default();
        Self {
            kind,
            depth: depth_of(data),
            digest: crate::ids::sha256(&bytes),
            text: String::from_utf8(bytes).unwrap_or_default(),
        }
    }

    /// The kernel's input for publishing this data under `key` (a fresh
    /// update id), the same for a runner's `node.update` and the tool's
    /// `interaction.update`.
    fn input(
        &self,
        key: &str,
        attempt_id: AttemptId,
        update_type: String,
        update_key: String,
    ) -> UpdateInput {
        UpdateInput {
            idempotency_key: IdempotencyKey::new(key),
            update_id: UpdateId::new(format!("upd_{}", crate::ids::random_hex::<8>())),
            attempt_id,
            update_type,
            key: update_key,
            data: UpdateData {
                kind: self.kind,
                encoded_bytes: self.text.len() as u64,
                depth: self.depth,
                digest: self.digest,
            },
        }
    }
}

/// The nesting depth of a JSON value: arrays and objects count one level
/// each (a scalar is 0).
fn depth_of(value: &Value) -> u32 {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth_of).max().unwrap_or(0),
        Value::Object(fields) => 1 + fields.values().map(depth_of).max().unwrap_or(0),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => 0,
    }
}

/// Decides one `node.update` of the runner.
#[expect(clippy::too_many_arguments, reason = "one message's facts")]
pub(crate) fn runner_update(
    connection: &Connection,
    runner: &Runner,
    attempt_id: AttemptId,
    key: &str,
    update: &protocol::generated::types::NodeUpdate,
    data: &EncodedUpdate,
    before: &RunAggregate,
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Answer> {
    let run_id = &before.run.run_id;
    let update_type = update.type_.to_string();
    let update_key = update.key.to_string();
    let loaded =
        crate::store::updates::load(connection, run_id, key, &update_type, &update_key, now_ms)?;
    let source = UpdateSource::Runner {
        authority: runner.authority.clone(),
        runner_epoch: runner.runner_epoch.clone(),
        ttl_ms,
    };
    let input = data.input(key, attempt_id, update_type, update_key);
    let lookup = UpdateLookup {
        by_idempotency_key: loaded.stored.as_ref(),
        pair_is_current: loaded.pair_is_current,
    };
    Ok(
        match updates::publish(before, &loaded.facts, lookup, &source, input, now_ms) {
            Ok(UpdateDecision::Replayed(receipt)) => {
                Ok((None, node_update_result(&receipt)?, None))
            }
            Ok(UpdateDecision::Accepted(transition)) => {
                let updated = &transition.facts;
                crate::store::updates::write_accepted(
                    connection, run_id, key, updated, &data.text,
                )?;
                let result = node_update_result(&updated.receipt)?;
                let run = Transition {
                    facts: updated.run.clone(),
                    outputs: transition.outputs,
                };
                Ok((Some(run), result, None))
            }
            Err(rejection) => Err(refusal(rejection)),
        },
    )
}

/// A stored update as the result of the runner's `node.update` reply.
fn node_update_result(receipt: &UpdateReceipt) -> Result<ReplyResult, OffSchema> {
    Ok(ReplyResult::NodeUpdate(NodeUpdateResult {
        seq: Sequence::new(receipt.seq.0).ok_or(OffSchema("seq"))?,
        update_id: to_wire("updateId", &receipt.update_id.0)?,
    }))
}

/// A stored update as the receipt of the tool's `interaction.update`.
fn tool_update_receipt(receipt: &UpdateReceipt) -> Result<Value, OffSchema> {
    let typed = InteractionUpdateReceipt {
        seq: Sequence::new(receipt.seq.0).ok_or(OffSchema("seq"))?,
        update_id: to_wire("updateId", &receipt.update_id.0)?,
    };
    serde_json::to_value(typed).map_err(|_| OffSchema("receipt"))
}

fn refusal(rejection: UpdateRejection) -> Refusal {
    Refusal::of(&rejection)
}

/// Handles one `interaction.update` (the caller checked the schema).
pub async fn tool_update(
    app: &Arc<Context>,
    request_id: &str,
    run_id: Option<&RunId>,
    idempotency_key: Option<&str>,
    payload: &InteractionUpdatePayload,
) -> Value {
    let answer = |outcome: &str, receipt: Option<Value>, error: Option<(ErrorCode, String)>| {
        response(
            request_id,
            "interaction.update",
            outcome,
            None,
            receipt,
            error,
        )
    };
    let (Some(run_id), Some(key)) = (run_id.cloned(), idempotency_key) else {
        return answer(
            "rejected",
            None,
            Some((
                ErrorCode::SchemaInvalid,
                "interaction.update needs a runId and an idempotencyKey".into(),
            )),
        );
    };
    let interaction_id = InteractionId::new(payload.interaction_id.to_string());
    let source = match &payload.authority {
        InteractionAuthority::Runner {
            generation,
            runner_epoch,
        } => UpdateSource::HeadlessTool {
            generation: Generation(generation.get()),
            runner_epoch: RunnerEpochId::new(runner_epoch.to_string()),
            interaction_id: interaction_id.clone(),
        },
        InteractionAuthority::Coordinator { session_id, .. } => UpdateSource::AgentTool {
            session_id: SessionId::new(session_id.to_string()),
            interaction_id: interaction_id.clone(),
        },
    };
    // An origin-session update, held as a submission is.
    let coordinator = match &payload.authority {
        InteractionAuthority::Coordinator {
            session_id,
            coordinator_epoch,
        } => Some(SubmitAuthority::Coordinator {
            session_id: SessionId::new(session_id.to_string()),
            coordinator_epoch: CoordinatorEpoch(coordinator_epoch.get()),
        }),
        InteractionAuthority::Runner { .. } => None,
    };
    let (coordinators, active_coordinator) = app
        .coordinators
        .hold_for(match &coordinator {
            Some(SubmitAuthority::Coordinator { session_id, .. }) => Some(session_id),
            Some(SubmitAuthority::Runner { .. }) | None => None,
        })
        .await;
    let update = payload.update.clone();
    let data = EncodedUpdate::of(&update.data);
    let attempt_id = AttemptId::new(payload.attempt_id.to_string());
    let key = key.to_owned();
    let clock = app.clock.clone();
    let decided = app
        .store
        .write(move |connection| {
            let now_ms = clock.now_ms();
            let refuse = |code: ErrorCode, message: &str| {
                Ok(Commit::Discard((
                    Err(("rejected".to_owned(), code, message.to_owned())),
                    Vec::new(),
                )))
            };
            let Some(mut before) = runs::load(connection, &run_id)? else {
                return refuse(ErrorCode::NotFound, "no such run");
            };
            match runs::interaction_by_id(connection, &interaction_id)? {
                // The named request, settled or not: a repeat after settlement adopts.
                Some(record) if record.run_id == run_id => before.interaction = Some(record),
                _ => {
                    return refuse(
                        ErrorCode::NotFound,
                        "the run has no interaction with this id",
                    );
                }
            }
            if let Some(authority) = &coordinator {
                // The origin session at its active epoch, before any lookup.
                if let Err(rejection) =
                    interaction::check_authority(&before, authority, active_coordinator)
                {
                    let (code, message, outcome) = crate::wire::rejection(&rejection);
                    return Ok(Commit::Discard((
                        Err((crate::wire::codec_name(&outcome), code, message.to_owned())),
                        Vec::new(),
                    )));
                }
            }
            let update_type = update.type_.to_string();
            let update_key = update.key.to_string();
            let loaded = crate::store::updates::load(
                connection,
                &run_id,
                &key,
                &update_type,
                &update_key,
                now_ms,
            )?;
            let input = data.input(&key, attempt_id, update_type, update_key);
            let lookup = UpdateLookup {
                by_idempotency_key: loaded.stored.as_ref(),
                pair_is_current: loaded.pair_is_current,
            };
            match updates::publish(&before, &loaded.facts, lookup, &source, input, now_ms) {
                Ok(UpdateDecision::Replayed(receipt)) => Ok(Commit::Discard((
                    Ok(("adopted", tool_update_receipt(&receipt)?)),
                    Vec::new(),
                ))),
                Ok(UpdateDecision::Accepted(transition)) => {
                    let updated = &transition.facts;
                    crate::store::updates::write_accepted(
                        connection, &run_id, &key, updated, &data.text,
                    )?;
                    runs::write(
                        connection,
                        Some(&before),
                        &updated.run,
                        &transition.outputs,
                        now_ms,
                    )?;
                    let receipt = tool_update_receipt(&updated.receipt)?;
                    Ok(Commit::Keep((
                        Ok(("accepted", receipt)),
                        transition.outputs,
                    )))
                }
                Err(rejection) => {
                    let (code, message, outcome) = crate::wire::rejection(&rejection);
                    let outcome = if code == ErrorCode::Conflict {
                        "conflict".to_owned()
                    } else {
                        crate::wire::codec_name(&outcome)
                    };
                    Ok(Commit::Discard((
                        Err((outcome, code, message.to_owned())),
                        Vec::new(),
                    )))
                }
            }
        })
        .await;
    drop(coordinators);
    match decided {
        Ok((Ok((outcome, receipt)), outputs)) => {
            app.perform(outputs);
            answer(outcome, Some(receipt), None)
        }
        Ok((Err((outcome, code, message)), _)) => answer(&outcome, None, Some((code, message))),
        Err(error) => answer("unavailable", None, Some(error.refusal())),
    }
}
