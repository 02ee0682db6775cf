//! Admission: which waiting work gets an execution slot next.
//!
//! Invariants:
//! - Capacity includes live workers and pending launches: admission never
//!   lets `live_workers + pending_launches` exceed `max_workers`.
//! - Within one kind of work, candidates are admitted first in, first out
//!   (by `queued_at_ms`, then run id).
//! - Across kinds, admissions rotate (workflow → resource manager →
//!   validation → workflow …), starting after the kind admitted last and
//!   skipping kinds without work: when workflow and resource-manager work
//!   both wait they alternate, and no waiting candidate starves while slots
//!   free up.
//! - A run is admitted at most once per decision, even if listed twice.
//! - Claim renewal, cancellation and cleanup never wait for a slot; they do
//!   not pass through admission.

use crate::ids::RunId;
use alloc::collections::BTreeSet;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// The default number of execution workers (`PI_WORKFLOWS_MAX_WORKERS`).
pub const DEFAULT_MAX_WORKERS: u32 = 4;

/// The server's execution slots right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Capacity {
    pub max_workers: u32,
    /// Runner processes alive now.
    pub live_workers: u32,
    /// Admitted runs whose runner is recorded but not yet alive.
    pub pending_launches: u32,
}

impl Capacity {
    /// The default capacity with nothing running.
    pub const fn idle() -> Self {
        Self {
            max_workers: DEFAULT_MAX_WORKERS,
            live_workers: 0,
            pending_launches: 0,
        }
    }

    /// How many more runs may be admitted now.
    pub const fn free_slots(self) -> u32 {
        self.max_workers
            .saturating_sub(self.live_workers.saturating_add(self.pending_launches))
    }
}

/// What kind of supervised child a candidate needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WorkKind {
    /// A workflow run (start, resume, continuation, restart, resume-ready).
    Workflow,
    /// A resource-manager reconcile.
    ResourceManager,
    /// A validation child for a provisional interactive submission.
    Validation,
}

impl WorkKind {
    const ROTATION: [Self; 3] = [Self::Workflow, Self::ResourceManager, Self::Validation];

    const fn position(self) -> usize {
        match self {
            Self::Workflow => 0,
            Self::ResourceManager => 1,
            Self::Validation => 2,
        }
    }
}

/// One admissible run waiting for a slot.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Candidate {
    pub run_id: RunId,
    pub kind: WorkKind,
    pub queued_at_ms: u64,
}

/// The runs to admit now, in order, and the kind admitted last (the
/// `last_kind` of the next decision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    pub admitted: Vec<RunId>,
    pub last_kind: Option<WorkKind>,
}

/// Picks the runs to admit now from `candidates`, filling the free slots.
/// `last_kind` is the kind admitted last (from the previous decision).
pub fn admit_next(
    capacity: Capacity,
    candidates: &[Candidate],
    last_kind: Option<WorkKind>,
) -> Admission {
    let mut queues = fifo_queues(candidates);
    let mut admitted = Vec::new();
    let mut last_kind = last_kind;
    for _ in 0..capacity.free_slots() {
        let Some(kind) = next_kind(&queues, last_kind) else {
            break;
        };
        let queue = &mut queues[kind.position()];
        admitted.push(queue.remove(0).run_id.clone());
        last_kind = Some(kind);
    }
    Admission {
        admitted,
        last_kind,
    }
}

/// One FIFO queue per kind, each run listed once (its earliest entry wins).
fn fifo_queues(candidates: &[Candidate]) -> [Vec<&Candidate>; 3] {
    let mut ordered: Vec<&Candidate> = candidates.iter().collect();
    ordered.sort_by(|a, b| (a.queued_at_ms, &a.run_id).cmp(&(b.queued_at_ms, &b.run_id)));
    let mut seen = BTreeSet::new();
    let mut queues: [Vec<&Candidate>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for candidate in ordered {
        if seen.insert(&candidate.run_id) {
            queues[candidate.kind.position()].push(candidate);
        }
    }
    queues
}

/// The first kind with work after `last_kind` in the rotation.
fn next_kind(queues: &[Vec<&Candidate>; 3], last_kind: Option<WorkKind>) -> Option<WorkKind> {
    let start = last_kind.map_or(0, |kind| kind.position() + 1);
    (0..WorkKind::ROTATION.len())
        .map(|offset| WorkKind::ROTATION[(start + offset) % WorkKind::ROTATION.len()])
        .find(|kind| !queues[kind.position()].is_empty())
}

#[cfg(test)]
mod tests;
