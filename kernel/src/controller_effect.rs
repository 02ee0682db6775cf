//! A controller's external effects (`ctx.effects.ensure`): reserved before
//! any provider call, observed before any retry (CONTROLLERS, "Effects").
//!
//! Invariants:
//! - An effect is named by its resource and key. Its kind, request
//!   fingerprint and the resource generation it was first reserved under
//!   never change: the same key with another of them is
//!   [`EffectEnsureRejection::RequestConflict`].
//! - An effect is `pending` (reserved) before its `apply` can run, so a
//!   reconcile that dies inside `apply` leaves a record a later pass finds.
//! - A pending or indeterminate effect is never applied again before its
//!   `observe` says it did not apply ([`ensure`] answers
//!   [`Ensure::Observe`]; only [`Observed::NotApplied`] leads to
//!   [`Ensure::Apply`]). `applied` and `rejected` are final and returned as
//!   they are.
//! - At most one effect per reconcile pass: a second distinct key in the
//!   same pass is refused ([`EffectEnsureRejection::SecondEffectInPass`]).
//! - An exception from `apply` makes the effect `indeterminate`, never
//!   `applied` or retried blindly.

use crate::ids::Digest;
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// Where a controller effect is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ControllerEffectState {
    Pending,
    Applied,
    Rejected,
    Indeterminate,
}

/// One controller `effects` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerEffect {
    pub resource_uid: String,
    pub key: String,
    pub kind: String,
    pub request_fingerprint: Digest,
    pub generation: u64,
    pub state: ControllerEffectState,
    pub started_at_ms: u64,
    pub completed_at_ms: Option<u64>,
}

/// What a reconcile asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnsureRequest<'a> {
    pub resource_uid: &'a str,
    pub key: &'a str,
    pub kind: &'a str,
    /// Digest of the request's canonical JSON.
    pub request_fingerprint: Digest,
    /// The resource generation the reconcile read.
    pub generation: u64,
}

/// Why `ensure` is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EffectEnsureRejection {
    /// The key exists with another kind, request or generation.
    RequestConflict,
    /// This reconcile pass already ensured another effect.
    SecondEffectInPass,
    /// An empty or over-long key or kind.
    BadKey,
}

/// What the reconcile child does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ensure {
    /// Reserve this new pending record (in the same transaction as the
    /// answer), then call `apply`.
    Apply(ControllerEffect),
    /// The record is pending or indeterminate: call `observe` first.
    Observe(ControllerEffect),
    /// Final: return the record as it is.
    Done(ControllerEffect),
}

/// `observe`'s verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Observed {
    Applied,
    NotApplied,
    Indeterminate,
}

/// `apply`'s result; `Threw` is an exception (or a lost child) mid-apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ApplyResult {
    Applied,
    Rejected,
    Indeterminate,
    Threw,
}

/// The longest effect key or kind, in bytes.
pub const MAX_EFFECT_KEY_BYTES: usize = 512;

/// `ctx.effects.ensure`: `existing` is the stored record under the key,
/// `pass_effect` the key this reconcile pass already ensured, if any.
pub fn ensure(
    existing: Option<&ControllerEffect>,
    request: &EnsureRequest<'_>,
    pass_effect: Option<&str>,
    now_ms: u64,
) -> Result<Ensure, EffectEnsureRejection> {
    let bad = |text: &str| text.is_empty() || text.len() > MAX_EFFECT_KEY_BYTES;
    if bad(request.key) || bad(request.kind) {
        return Err(EffectEnsureRejection::BadKey);
    }
    if pass_effect.is_some_and(|key| key != request.key) {
        return Err(EffectEnsureRejection::SecondEffectInPass);
    }
    let Some(existing) = existing else {
        return Ok(Ensure::Apply(ControllerEffect {
            resource_uid: request.resource_uid.into(),
            key: request.key.into(),
            kind: request.kind.into(),
            request_fingerprint: request.request_fingerprint,
            generation: request.generation,
            state: ControllerEffectState::Pending,
            started_at_ms: now_ms,
            completed_at_ms: None,
        }));
    };
    if existing.kind != request.kind
        || existing.request_fingerprint != request.request_fingerprint
        || existing.generation != request.generation
    {
        return Err(EffectEnsureRejection::RequestConflict);
    }
    Ok(match existing.state {
        ControllerEffectState::Applied | ControllerEffectState::Rejected => {
            Ensure::Done(existing.clone())
        }
        ControllerEffectState::Pending | ControllerEffectState::Indeterminate => {
            Ensure::Observe(existing.clone())
        }
    })
}

fn completed(
    effect: &ControllerEffect,
    state: ControllerEffectState,
    now_ms: u64,
) -> ControllerEffect {
    ControllerEffect {
        state,
        completed_at_ms: Some(now_ms),
        ..effect.clone()
    }
}

/// After `observe` of a pending or indeterminate effect: the record to
/// store, and whether to call `apply` now.
pub fn observed(
    effect: &ControllerEffect,
    verdict: Observed,
    now_ms: u64,
) -> (ControllerEffect, bool) {
    match verdict {
        Observed::Applied => (
            completed(effect, ControllerEffectState::Applied, now_ms),
            false,
        ),
        Observed::Indeterminate => (
            completed(effect, ControllerEffectState::Indeterminate, now_ms),
            false,
        ),
        Observed::NotApplied => (
            ControllerEffect {
                state: ControllerEffectState::Pending,
                ..effect.clone()
            },
            true,
        ),
    }
}

/// After `apply`: the record to store.
pub fn applied(effect: &ControllerEffect, result: ApplyResult, now_ms: u64) -> ControllerEffect {
    let state = match result {
        ApplyResult::Applied => ControllerEffectState::Applied,
        ApplyResult::Rejected => ControllerEffectState::Rejected,
        ApplyResult::Indeterminate | ApplyResult::Threw => ControllerEffectState::Indeterminate,
    };
    completed(effect, state, now_ms)
}

#[cfg(test)]
mod tests;
