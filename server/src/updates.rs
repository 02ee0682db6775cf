//! Workflow updates from runners (`node.update`), decided by
//! `kernel::updates` against the run's bucket, pair count and receipts.
//!
//! Invariant: an update replaces the current value of its `(type, key)` in
//! the same transaction as its receipt and the run's new bucket state.

use crate::runner_channel::{Answer, Refusal};
use crate::supervisor::Runner;
use kernel::ids::{AttemptId, Digest, IdempotencyKey};
use kernel::output::Transition;
use kernel::run::RunAggregate;
use kernel::updates::{
    self, JsonKind, UpdateData, UpdateDecision, UpdateId, UpdateInput, UpdateLookup, UpdateReceipt,
    UpdateRejection, UpdateSource,
};
use rusqlite::Connection;
use serde_json::{Value, json};

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
    let input = UpdateInput {
        idempotency_key: IdempotencyKey::new(key),
        update_id: UpdateId::new(format!("upd_{}", crate::ids::random_hex::<8>())),
        attempt_id,
        update_type,
        key: update_key,
        data: UpdateData {
            kind: data.kind,
            encoded_bytes: data.text.len() as u64,
            depth: data.depth,
            digest: data.digest,
        },
    };
    let lookup = UpdateLookup {
        by_idempotency_key: loaded.stored.as_ref(),
        pair_is_current: loaded.pair_is_current,
    };
    Ok(
        match updates::publish(before, &loaded.facts, lookup, &source, input, now_ms) {
            Ok(UpdateDecision::Replayed(receipt)) => Ok((None, receipt_value(&receipt), None)),
            Ok(UpdateDecision::Accepted(transition)) => {
                let updated = &transition.facts;
                crate::store::updates::write_accepted(
                    connection, run_id, key, updated, &data.text,
                )?;
                let result = receipt_value(&updated.receipt);
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

fn receipt_value(receipt: &UpdateReceipt) -> Value {
    json!({ "updateId": receipt.update_id.0, "seq": receipt.seq.0 })
}

fn refusal(rejection: UpdateRejection) -> Refusal {
    Refusal::of(&rejection)
}
