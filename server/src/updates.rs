//! Workflow updates from runners (`node.update`), decided by
//! `kernel::updates` against the run's bucket, pair count and receipts.
//!
//! Invariant: an update replaces the current value of its `(type, key)` in
//! the same transaction as its receipt and the run's new bucket state.

use crate::runner_channel::{Answer, Refusal};
use crate::store::Cached as _;
use crate::supervisor::Runner;
use kernel::ids::{AttemptId, Digest, IdempotencyKey};
use kernel::output::Transition;
use kernel::run::RunAggregate;
use kernel::updates::{
    self, JsonKind, TokenBucket, UpdateData, UpdateDecision, UpdateFacts, UpdateId, UpdateInput,
    UpdateLookup, UpdateReceipt, UpdateRejection, UpdateSource,
};
use rusqlite::{Connection, OptionalExtension, params};
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
    let stored: Option<UpdateReceipt> = connection
        .query_row_cached(
            "SELECT receipt_json FROM update_receipts WHERE run_id = ?1 AND idempotency_key = ?2",
            params![run_id.as_str(), key],
            |row| row.get::<_, String>(0),
        )
        .optional()?
        .and_then(|text| serde_json::from_str(&text).ok());
    let pair_is_current: bool = connection.query_row_cached(
        "SELECT EXISTS (SELECT 1 FROM workflow_updates WHERE run_id = ?1 AND update_type = ?2 AND update_key = ?3)",
        params![run_id.as_str(), update_type, update_key],
        |row| row.get(0),
    )?;
    let (tokens, refilled_at_ms, current_pairs): (i64, i64, i64) = connection.query_row_cached(
        "SELECT update_tokens, update_refilled_at_ms, (SELECT COUNT(*) FROM workflow_updates WHERE run_id = ?1)
         FROM runs WHERE run_id = ?1",
        params![run_id.as_str()],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )?;
    let facts = UpdateFacts {
        bucket: if refilled_at_ms == 0 {
            TokenBucket::full(now_ms)
        } else {
            TokenBucket {
                tokens: tokens.max(0) as u32,
                refilled_at_ms: refilled_at_ms as u64,
            }
        },
        current_pairs: current_pairs.max(0) as u32,
    };
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
        by_idempotency_key: stored.as_ref(),
        pair_is_current,
    };
    Ok(
        match updates::publish(before, &facts, lookup, &source, input, now_ms) {
            Ok(UpdateDecision::Replayed(receipt)) => Ok((None, receipt_value(&receipt), None)),
            Ok(UpdateDecision::Accepted(transition)) => {
                let updated = &transition.facts;
                let current = &updated.current;
                connection.execute_cached(
                "UPDATE runs SET update_tokens = ?2, update_refilled_at_ms = ?3 WHERE run_id = ?1",
                params![run_id.as_str(), updated.facts.bucket.tokens, updated.facts.bucket.refilled_at_ms as i64],
            )?;
                connection.execute_cached(
                "INSERT INTO workflow_updates (run_id, update_type, update_key, update_id, seq, node_id, attempt_id, data_json, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (run_id, update_type, update_key) DO UPDATE SET update_id = excluded.update_id,
                   seq = excluded.seq, node_id = excluded.node_id, attempt_id = excluded.attempt_id,
                   data_json = excluded.data_json, at_ms = excluded.at_ms",
                params![
                    run_id.as_str(),
                    current.update_type,
                    current.key,
                    current.update_id.0,
                    current.seq.0 as i64,
                    current.node_id.as_str(),
                    current.attempt_id.as_str(),
                    data.text,
                    current.at_ms as i64,
                ],
            )?;
                crate::store::viewer::mark(run_id);
                connection.execute_cached(
                "INSERT INTO update_receipts (run_id, idempotency_key, receipt_json) VALUES (?1, ?2, ?3)",
                params![run_id.as_str(), key, serde_json::to_string(&updated.receipt).unwrap_or_default()],
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
