//! The controller work queue: one row per resource key, its claim, and what a
//! finished reconcile does to it (CONTROLLERS, "Manager reconcile loop").
//!
//! Invariants:
//! - One row per resource: enqueueing an existing row keeps the earlier of
//!   the two availability times and bumps its `version`, so work that arrives
//!   during a reconcile is never lost ([`enqueue`]).
//! - At most one live claim per row. A row is claimable when it is available
//!   and unclaimed or its claim expired; a claim carries the shared lease
//!   generation (it only grows), the token hash and the expiry ([`claim`]).
//! - Only the live claim finishes or renews a row: another generation, token
//!   or an expired claim is [`ReconcileRejection::ClaimLost`], and nothing
//!   changes ([`finish`], [`renew`]). A worker that lost its claim cannot
//!   write a failure or start a retry.
//! - A row is never deleted while its resource exists, so its generation
//!   only grows. A settle leaves it idle (nothing to do until the next
//!   enqueue) only when nothing was enqueued during the claim
//!   (`version == claimed_version`); otherwise the row is released and
//!   available at once. An error backs off
//!   `min(max, base·2^(errors−1))·(1±jitter)`; a success resets the count; a
//!   conflicting status write requeues at once without counting an error.
//! - Time and jitter are arguments: the shell draws the jitter.

use crate::ids::Digest;
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// The reference's defaults.
pub mod defaults {
    /// Reconciles running at once (shared with workflow runners: one capacity).
    pub const MAX_CONCURRENT: u32 = 4;
    /// A reconcile's deadline.
    pub const RECONCILE_TIMEOUT_MS: u64 = 60_000;
    /// A claim's lease, renewed every third of it.
    pub const LEASE_MS: u64 = 120_000;
    /// The shortest lease accepted.
    pub const MIN_LEASE_MS: u64 = 300;
    /// The first backoff after an error.
    pub const BACKOFF_BASE_MS: u64 = 1_000;
    /// The longest backoff.
    pub const BACKOFF_MAX_MS: u64 = 60_000;
    /// Jitter bound, in thousandths (±20 %).
    pub const JITTER_PERMILLE: u16 = 200;
}

/// The longest stored error, in bytes.
pub const MAX_ERROR_BYTES: usize = 8192;

/// A live reconcile claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileClaim {
    /// The shared lease generation (grows with every claim of the row).
    pub generation: u64,
    pub token_hash: Digest,
    pub expires_at_ms: u64,
    /// The row's `version` when claimed.
    pub claimed_version: u64,
}

/// One controller queue row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueRow {
    /// When the key may next be reconciled; `None` while idle.
    pub available_at_ms: Option<u64>,
    /// Grows by one per enqueue.
    pub version: u64,
    pub consecutive_errors: u32,
    pub last_error: Option<String>,
    /// The last generation handed out (kept after the claim ends, so a new
    /// claim's generation is always higher).
    pub generation: u64,
    pub claim: Option<ReconcileClaim>,
}

/// Why a queue change is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReconcileRejection {
    /// Not the live claim: another generation or token owns the row, or the
    /// claim expired.
    ClaimLost,
    /// The row is claimed or not yet available.
    NotClaimable,
    /// A lease shorter than [`defaults::MIN_LEASE_MS`], or a requeue delay of 0.
    BadDuration,
}

/// Enqueues a key: a new row available at `at_ms`, or the existing row
/// available at the earlier time, its version bumped.
pub fn enqueue(row: Option<&QueueRow>, at_ms: u64) -> QueueRow {
    match row {
        None => QueueRow {
            available_at_ms: Some(at_ms),
            version: 1,
            consecutive_errors: 0,
            last_error: None,
            generation: 0,
            claim: None,
        },
        Some(row) => QueueRow {
            available_at_ms: Some(
                row.available_at_ms
                    .map_or(at_ms, |earlier| earlier.min(at_ms)),
            ),
            version: row.version + 1,
            ..row.clone()
        },
    }
}

/// Whether a row can be claimed at `now_ms`.
pub fn claimable(row: &QueueRow, now_ms: u64) -> bool {
    row.available_at_ms.is_some_and(|at_ms| at_ms <= now_ms)
        && row.claim.is_none_or(|claim| claim.expires_at_ms <= now_ms)
}

/// Claims a row for one reconcile.
pub fn claim(
    row: &QueueRow,
    token_hash: Digest,
    lease_ms: u64,
    now_ms: u64,
) -> Result<QueueRow, ReconcileRejection> {
    if lease_ms < defaults::MIN_LEASE_MS {
        return Err(ReconcileRejection::BadDuration);
    }
    if !claimable(row, now_ms) {
        return Err(ReconcileRejection::NotClaimable);
    }
    let generation = row.generation + 1;
    Ok(QueueRow {
        generation,
        claim: Some(ReconcileClaim {
            generation,
            token_hash,
            expires_at_ms: now_ms + lease_ms,
            claimed_version: row.version,
        }),
        ..row.clone()
    })
}

fn live_claim(
    row: &QueueRow,
    generation: u64,
    token_hash: &Digest,
    now_ms: u64,
) -> Result<ReconcileClaim, ReconcileRejection> {
    match row.claim {
        Some(claim)
            if claim.generation == generation
                && claim.token_hash == *token_hash
                && now_ms < claim.expires_at_ms =>
        {
            Ok(claim)
        }
        _ => Err(ReconcileRejection::ClaimLost),
    }
}

/// Renews the live claim's lease.
pub fn renew(
    row: &QueueRow,
    generation: u64,
    token_hash: &Digest,
    lease_ms: u64,
    now_ms: u64,
) -> Result<QueueRow, ReconcileRejection> {
    let claim = live_claim(row, generation, token_hash, now_ms)?;
    Ok(QueueRow {
        claim: Some(ReconcileClaim {
            expires_at_ms: now_ms + lease_ms,
            ..claim
        }),
        ..row.clone()
    })
}

/// How a reconcile ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finished {
    /// `settled()`: nothing more to do until the next enqueue.
    Settled,
    /// `requeue()`: again at once.
    Requeue,
    /// `requeueAfter(ms)`.
    RequeueAfter(u64),
    /// The status write lost its compare-and-swap: again at once, no error.
    Conflict,
    /// The server stopped the pass itself (it is shutting down): again at
    /// once, the error count and last error kept. A stopped worker never
    /// fails a pass by itself.
    Interrupted,
    /// It threw, returned a bad result, or passed its deadline:
    /// back off. `jitter_permille` is drawn by the shell in
    /// `[-JITTER_PERMILLE, JITTER_PERMILLE]`.
    Failed { error: String, jitter_permille: i16 },
}

/// The row after a finished reconcile.
pub fn finish(
    row: &QueueRow,
    generation: u64,
    token_hash: &Digest,
    finished: &Finished,
    now_ms: u64,
) -> Result<QueueRow, ReconcileRejection> {
    let claim = live_claim(row, generation, token_hash, now_ms)?;
    let released =
        |available_at_ms: Option<u64>, consecutive_errors: u32, last_error: Option<String>| {
            QueueRow {
                available_at_ms,
                consecutive_errors,
                last_error,
                claim: None,
                ..row.clone()
            }
        };
    Ok(match finished {
        Finished::Settled if row.version == claim.claimed_version => released(None, 0, None),
        Finished::Settled | Finished::Requeue => released(Some(now_ms), 0, None),
        Finished::RequeueAfter(0) => return Err(ReconcileRejection::BadDuration),
        Finished::RequeueAfter(delay_ms) => released(Some(now_ms + delay_ms), 0, None),
        Finished::Conflict | Finished::Interrupted => {
            released(Some(now_ms), row.consecutive_errors, row.last_error.clone())
        }
        Finished::Failed {
            error,
            jitter_permille,
        } => {
            let errors = row.consecutive_errors.saturating_add(1);
            let delay = backoff_ms(
                errors,
                defaults::BACKOFF_BASE_MS,
                defaults::BACKOFF_MAX_MS,
                *jitter_permille,
            );
            released(Some(now_ms + delay), errors, Some(bounded(error)))
        }
    })
}

/// Whether `generation` and `token_hash` are the row's live claim at
/// `now_ms` (every message of a reconcile pass is fenced by it).
pub fn check_claim(
    row: &QueueRow,
    generation: u64,
    token_hash: &Digest,
    now_ms: u64,
) -> Result<(), ReconcileRejection> {
    live_claim(row, generation, token_hash, now_ms).map(|_| ())
}

/// At server start-up: a claim still on a row belongs to a pass of a
/// previous server, whose children are gone. The row is released and
/// available at once (at the earlier of its own time and `now_ms`), its
/// error count kept: an interrupted pass is not a failed one. `None`: the
/// row holds no claim and nothing changes.
pub fn release_abandoned(row: &QueueRow, now_ms: u64) -> Option<QueueRow> {
    row.claim?;
    Some(QueueRow {
        available_at_ms: Some(row.available_at_ms.map_or(now_ms, |at| at.min(now_ms))),
        claim: None,
        ..row.clone()
    })
}

/// `min(max, base·2^(errors−1))·(1 + jitter/1000)`, jitter clamped to
/// ±[`defaults::JITTER_PERMILLE`]; `errors` of 0 counts as 1.
pub fn backoff_ms(errors: u32, base_ms: u64, max_ms: u64, jitter_permille: i16) -> u64 {
    let exponent = errors.max(1) - 1;
    let raw = if exponent >= 63 {
        max_ms
    } else {
        base_ms.saturating_mul(1u64 << exponent).min(max_ms)
    };
    let bound = i64::from(defaults::JITTER_PERMILLE);
    let jitter = i64::from(jitter_permille).clamp(-bound, bound);
    let scaled = i128::from(raw) * i128::from(1000 + jitter) / 1000;
    scaled.clamp(0, i128::from(u64::MAX)) as u64
}

fn bounded(error: &str) -> String {
    if error.len() <= MAX_ERROR_BYTES {
        return error.into();
    }
    let mut end = MAX_ERROR_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    error[..end].into()
}

#[cfg(test)]
mod tests;
