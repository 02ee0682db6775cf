//! Workflow updates (`workflow_updates`), their receipts (`update_receipts`)
//! and the run's update token bucket (columns of `runs`).
//!
//! Invariant: an accepted update replaces the current value of its
//! `(type, key)`, stores its receipt and the run's new bucket state in the
//! caller's one transaction, and marks the run's presentation dirty.

use crate::store::Cached as _;
use kernel::ids::RunId;
use kernel::updates::{TokenBucket, UpdateFacts, UpdateReceipt, Updated};
use rusqlite::{Connection, OptionalExtension, params};

/// What the kernel needs to decide one update of `(update_type, update_key)`
/// with `idempotency_key`: its stored receipt, whether the pair has a
/// current value, and the run's bucket and pair count.
#[derive(Debug)]
pub struct Loaded {
    pub stored: Option<UpdateReceipt>,
    pub pair_is_current: bool,
    pub facts: UpdateFacts,
}

/// Loads the facts of one update of `run_id`.
pub fn load(
    connection: &Connection,
    run_id: &RunId,
    idempotency_key: &str,
    update_type: &str,
    update_key: &str,
    now_ms: u64,
) -> rusqlite::Result<Loaded> {
    let stored: Option<UpdateReceipt> = connection
        .query_row_cached(
            "SELECT receipt_json FROM update_receipts WHERE run_id = ?1 AND idempotency_key = ?2",
            params![run_id.as_str(), idempotency_key],
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
    Ok(Loaded {
        stored,
        pair_is_current,
        facts,
    })
}

/// Writes an accepted update: the bucket, the pair's current value
/// (`data_json`, the encoded data) and the receipt under `idempotency_key`.
pub fn write_accepted(
    connection: &Connection,
    run_id: &RunId,
    idempotency_key: &str,
    updated: &Updated,
    data_json: &str,
) -> rusqlite::Result<()> {
    let current = &updated.current;
    connection.execute_cached(
        "UPDATE runs SET update_tokens = ?2, update_refilled_at_ms = ?3 WHERE run_id = ?1",
        params![
            run_id.as_str(),
            updated.facts.bucket.tokens,
            updated.facts.bucket.refilled_at_ms as i64
        ],
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
            data_json,
            current.at_ms as i64,
        ],
    )?;
    super::viewer::mark_updates(run_id);
    connection.execute_cached(
        "INSERT INTO update_receipts (run_id, idempotency_key, receipt_json) VALUES (?1, ?2, ?3)",
        params![
            run_id.as_str(),
            idempotency_key,
            serde_json::to_string(&updated.receipt).unwrap_or_default()
        ],
    )?;
    Ok(())
}
