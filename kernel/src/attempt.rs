//! Node attempts: one execution of one node, and the finished steps a run has.
//!
//! Invariants:
//! - A run has at most one unfinished attempt (`Active` or `Waiting`); the
//!   database enforces this with a partial unique index and the kernel never
//!   creates a second one.
//! - An attempt finishes once, with exactly one outcome. A finished attempt
//!   is a step; an `Abandoned` attempt (runner lost mid-node, pause, park) is
//!   not a step and never routes.
//! - `visit` counts this node's steps in the run including carried ones, so
//!   an effect key made from (node, visit) is the same for a rerun of the
//!   same visit and different for the next visit.

use crate::ids::{AttemptId, Generation, NodeId};
use serde::{Deserialize, Serialize};

/// How a node attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeOutcome {
    Ok,
    Failed,
    TimedOut,
    Cancelled,
}

impl NodeOutcome {
    /// The `$result.outcome` value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The state of one attempt row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AttemptStatus {
    /// A runner executes it now.
    Active,
    /// It waits for an interactive request in the origin session (no runner).
    Waiting,
    /// It finished with this outcome.
    Finished(NodeOutcome),
    /// Its runner stopped before it finished; a later attempt reruns the node.
    Abandoned,
}

impl AttemptStatus {
    /// Whether the attempt is the run's one unfinished attempt.
    pub const fn is_unfinished(self) -> bool {
        matches!(self, Self::Active | Self::Waiting)
    }
}

/// One `node_attempts` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempt_id: AttemptId,
    pub node_id: NodeId,
    /// 1 for the node's first step in the run, 2 for the next, …
    pub visit: u32,
    pub generation: Generation,
    pub status: AttemptStatus,
    pub started_at_ms: u64,
    /// The resolved wall-clock deadline, once the runner reports it.
    pub deadline_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    /// How many earlier attempts of this same visit were abandoned by a
    /// crashed runner (bounds crash loops).
    pub crash_retries: u32,
}

/// A finished attempt as routing and step limits see it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepRecord {
    pub attempt_id: AttemptId,
    pub node_id: NodeId,
    pub outcome: NodeOutcome,
    /// Carried from a checkpoint parent by a continuation.
    pub carried: bool,
}
