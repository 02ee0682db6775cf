//! Checkpoint answers and protected human decisions, and the one continuation
//! each waiting checkpoint may start.
//!
//! Invariants:
//! - A decision is accepted at most once. The first valid human answer
//!   before the deadline, or the `onTimeout` default at the deadline, wins;
//!   an answer at or after the deadline loses.
//! - An identical retry of the winning answer adopts it; another answer
//!   after acceptance is a conflict ("already decided").
//! - A waiting parent has at most one continuation. The first caller
//!   prepares it; a compatible later caller adopts it without changing any
//!   fact; an incompatible reuse fails without change.

use crate::ids::{DecisionId, Digest, NodeId, RunId};
use serde::{Deserialize, Serialize};

/// Who decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Provenance {
    Human,
    Timeout,
}

/// The state of one protected decision.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum DecisionStatus {
    Pending,
    Accepted {
        provenance: Provenance,
        answer_digest: Digest,
    },
    Cancelled,
    /// The deadline passed with no default response.
    Expired,
}

/// One protected human decision on a waiting checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub decision_id: DecisionId,
    pub run_id: RunId,
    pub node_id: NodeId,
    pub request_digest: Digest,
    pub status: DecisionStatus,
    pub deadline_at_ms: Option<u64>,
    /// Digest of the validated default response, when `onTimeout` has one.
    pub default_answer_digest: Option<Digest>,
    pub continuation_run_id: Option<RunId>,
}

/// What cancelling the waiting run does to its pending decision.
pub fn on_run_cancelled(record: &DecisionRecord) -> DecisionRecord {
    let mut next = record.clone();
    if record.status == DecisionStatus::Pending {
        next.status = DecisionStatus::Cancelled;
    }
    next
}
