//! Runner epochs: one runner process lifetime within one run generation, its
//! terminal outcome, and what the server decides after it exits.
//!
//! Invariants:
//! - The server records a runner epoch (`Launching`) before it spawns the
//!   process; one run has at most one runner epoch that is not `Exited`.
//! - Each runner epoch records exactly one terminal outcome.
//! - A runner exit is not a run failure by itself. The decision comes from
//!   the last committed attempt and effect state; claim loss never fails a run.

use crate::ids::{Generation, Revision, RunnerEpochId};
use serde::{Deserialize, Serialize};

/// The terminal outcome of one runner epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RunnerOutcome {
    /// Exited on its own after the server told it to (or after its last reply).
    Exited,
    /// Stopped by the server for pause or cancellation.
    Cancelled,
    /// Killed for exceeding the startup or a node deadline.
    TimedOut,
    /// Exited without a terminal protocol message, or was killed by a signal.
    Crashed,
    /// Exited after the server told it that its claim was lost.
    ClaimLost,
    /// Found after a server restart with no supervising server.
    Orphaned,
}

/// The lifecycle of one runner epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RunnerStatus {
    /// Recorded; the process is being spawned or has not said `runner.ready`.
    Launching,
    /// Said `runner.ready` and received its command.
    Ready,
    /// Gone, with this outcome.
    Exited(RunnerOutcome),
}

/// One `run_workers` row as the kernel sees it (process identity stays in the shell).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunnerRecord {
    pub runner_epoch: RunnerEpochId,
    pub generation: Generation,
    pub status: RunnerStatus,
    pub launched_at_ms: u64,
    pub ready_at_ms: Option<u64>,
    /// The run revision right after the runner became ready and received its
    /// command. Progress means the revision moved past this value.
    pub ready_revision: Option<Revision>,
    pub finished_at_ms: Option<u64>,
}

impl RunnerRecord {
    /// Whether the process may still be alive.
    pub const fn is_live(&self) -> bool {
        !matches!(self.status, RunnerStatus::Exited(_))
    }
}
