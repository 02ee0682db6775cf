//! Managed effects: side effects reserved and settled through one durable record.
//!
//! Invariants:
//! - The key is made by the engine from (run id, effect type, full compiled
//!   node path, node visit); workflow code never supplies it. One key names
//!   one effect, and reusing it with another request fingerprint is a
//!   conflict.
//! - `Applied`, `Rejected` and `Cancelled` are terminal. `Ambiguous` is
//!   terminal for automatic retry: only an explicit operator `confirm`
//!   (→ `Applied`) or `retry` (→ a new numbered attempt) leaves it.
//! - Cancellation turns `Reserved` into `Cancelled` and `Applying` into
//!   `Ambiguous`; losing the runner while `Applying` also gives `Ambiguous`.
//! - An effect is applied at most once per attempt number: `begin` moves a
//!   reservation to `Applying` only from `Reserved`.

use crate::ids::{AttemptId, Digest, EffectId, NodeId, RunId};
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// The engine-made idempotency key of an effect.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EffectKey {
    pub run_id: RunId,
    pub effect_type: String,
    pub node_path: NodeId,
    pub visit: u32,
}

/// The state of one effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EffectState {
    Reserved,
    Applying,
    Applied,
    Rejected,
    Cancelled,
    Ambiguous,
}

impl EffectState {
    /// Whether automatic execution may never touch this effect again.
    pub const fn is_settled(self) -> bool {
        matches!(
            self,
            Self::Applied | Self::Rejected | Self::Cancelled | Self::Ambiguous
        )
    }
}

/// One `effects` row (with its current `effect_attempts` number).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EffectRecord {
    pub effect_id: EffectId,
    pub key: EffectKey,
    /// Digest of the canonical request; another digest under the same key is a conflict.
    pub request_fingerprint: Digest,
    pub state: EffectState,
    /// 1 for the first attempt; an explicit retry creates the next number.
    pub attempt_number: u32,
    /// The node attempt that last began applying it.
    pub node_attempt_id: Option<AttemptId>,
    /// Digest of the stored result once applied or rejected.
    pub result_digest: Option<Digest>,
}

/// What cancellation of the run does to its effects.
pub fn on_run_cancelled(effect: &EffectRecord) -> EffectRecord {
    let mut next = effect.clone();
    next.state = match effect.state {
        EffectState::Reserved => EffectState::Cancelled,
        EffectState::Applying => EffectState::Ambiguous,
        settled => settled,
    };
    next
}

/// What losing the runner (crash, pause, claim loss) does to an effect: an
/// effect that may have reached the external system becomes ambiguous; a
/// reservation that never began stays reusable.
pub fn on_runner_lost(effect: &EffectRecord) -> EffectRecord {
    let mut next = effect.clone();
    if effect.state == EffectState::Applying {
        next.state = EffectState::Ambiguous;
    }
    next
}
