//! State retention: which terminal root-run trees may expire, and when the
//! server may sweep or compact.
//!
//! A root tree is the root run plus every restart and continuation
//! descendant. It is the unit of deletion: a tree is deleted whole, in one
//! transaction, or not at all.
//!
//! Invariants:
//! - A tree expires only when every run in it is terminal, finished strictly
//!   before the cutoff (`now_ms - RETENTION_MS`), free of protected state and
//!   of references from outside the tree, and has known ownership. Anything
//!   the selector cannot prove keeps the tree (an empty tree, a missing
//!   finish time).
//! - The selector is monotonic in time: a tree that may expire at `t` may
//!   expire at every later `t'` with the same facts.
//! - A [`Verdict::Keep`] names the first blocking cause, checked cause by
//!   cause across the whole tree in a fixed order, so the answer does not
//!   depend on the order the shell lists runs in.
//! - Sweeps: a process completes at most one sweep in [`SWEEP_INTERVAL_MS`];
//!   a sweep starts only while no runner, resource-manager runner,
//!   state-maintenance command or shutdown is active or pending; after a
//!   failure the next attempt waits [`SWEEP_RETRY_MS`]. The sweep schedule is
//!   process-local, never durable.
//! - Compaction (`VACUUM`) runs only while idle with at least
//!   [`VACUUM_MIN_RECLAIMABLE_BYTES`] reclaimable and at least
//!   [`VACUUM_MIN_FREE_PERCENT`] of the pages free.

use crate::ids::RunId;
use crate::run::RunStatus;
use serde::{Deserialize, Serialize};

/// How long a terminal root tree is kept after its runs finished (30 days).
pub const RETENTION_MS: u64 = 30 * 24 * 60 * 60 * 1_000;
/// A server process completes at most one sweep per this period (24 hours).
pub const SWEEP_INTERVAL_MS: u64 = 24 * 60 * 60 * 1_000;
/// The wait after a failed or interrupted sweep (five minutes).
pub const SWEEP_RETRY_MS: u64 = 5 * 60 * 1_000;
/// Automatic `VACUUM` needs at least this much reclaimable space (64 MiB).
pub const VACUUM_MIN_RECLAIMABLE_BYTES: u64 = 64 * 1_024 * 1_024;
/// Automatic `VACUUM` needs at least this share of the pages free.
pub const VACUUM_MIN_FREE_PERCENT: u64 = 20;

/// State that keeps a run (and so its whole tree), in the seed's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Protected {
    WaitingOrParkedRun,
    LiveQueueRow,
    PendingWorkflowMessage,
    OpenWorkflowTurn,
    PendingInteraction,
    PendingHumanDecision,
    RecordingSessionSegment,
    QueuedFollowUp,
    ActiveLease,
    UnsettledEffect,
    ControllerOwnership,
    ActiveRunnerContent,
    ResumableCheckpoint,
    UndeliveredTerminalResult,
}

impl Protected {
    /// Every protection, in the seed's order.
    pub const ALL: [Self; 14] = [
        Self::WaitingOrParkedRun,
        Self::LiveQueueRow,
        Self::PendingWorkflowMessage,
        Self::OpenWorkflowTurn,
        Self::PendingInteraction,
        Self::PendingHumanDecision,
        Self::RecordingSessionSegment,
        Self::QueuedFollowUp,
        Self::ActiveLease,
        Self::UnsettledEffect,
        Self::ControllerOwnership,
        Self::ActiveRunnerContent,
        Self::ResumableCheckpoint,
        Self::UndeliveredTerminalResult,
    ];
}

/// The protection flags of one run, computed by the shell from its rows.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Protections {
    pub waiting_or_parked_run: bool,
    pub live_queue_row: bool,
    pub pending_workflow_message: bool,
    pub open_workflow_turn: bool,
    pub pending_interaction: bool,
    pub pending_human_decision: bool,
    pub recording_session_segment: bool,
    pub queued_follow_up: bool,
    pub active_lease: bool,
    pub unsettled_effect: bool,
    pub controller_ownership: bool,
    pub active_runner_content: bool,
    pub resumable_checkpoint: bool,
    pub undelivered_terminal_result: bool,
}

impl Protections {
    /// Whether `protected` is set.
    pub const fn contains(&self, protected: Protected) -> bool {
        use Protected as P;
        match protected {
            P::WaitingOrParkedRun => self.waiting_or_parked_run,
            P::LiveQueueRow => self.live_queue_row,
            P::PendingWorkflowMessage => self.pending_workflow_message,
            P::OpenWorkflowTurn => self.open_workflow_turn,
            P::PendingInteraction => self.pending_interaction,
            P::PendingHumanDecision => self.pending_human_decision,
            P::RecordingSessionSegment => self.recording_session_segment,
            P::QueuedFollowUp => self.queued_follow_up,
            P::ActiveLease => self.active_lease,
            P::UnsettledEffect => self.unsettled_effect,
            P::ControllerOwnership => self.controller_ownership,
            P::ActiveRunnerContent => self.active_runner_content,
            P::ResumableCheckpoint => self.resumable_checkpoint,
            P::UndeliveredTerminalResult => self.undelivered_terminal_result,
        }
    }

    /// The first protection that is set, in the seed's order.
    pub fn first(&self) -> Option<Protected> {
        Protected::ALL
            .into_iter()
            .find(|protected| self.contains(*protected))
    }
}

/// A reference into the tree from a run outside it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct OutsideReferences {
    /// A run of another tree continues from this run.
    pub continuation: bool,
    /// A run of another tree refers to one of this run's steps.
    pub step: bool,
}

/// One run of a root tree as the selector sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RetainedRun {
    pub run_id: RunId,
    pub status: RunStatus,
    pub finished_at_ms: Option<u64>,
    pub protections: Protections,
    pub outside_references: OutsideReferences,
    /// The shell could attribute every row of this run to a known owner.
    pub ownership_known: bool,
}

/// Why a tree is kept. The order of the variants is the order of the checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "cause")]
pub enum KeepReason {
    /// The shell listed no run; there is nothing to prove expired.
    EmptyTree,
    NotTerminal,
    /// A terminal run has no recorded finish time.
    NoFinishTime,
    /// A run finished at or after the cutoff.
    Young,
    Protected {
        protected: Protected,
    },
    OutsideContinuation,
    OutsideStepReference,
    UnknownOwnership,
}

/// The selector's answer for one root tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "verdict")]
pub enum Verdict {
    Expire,
    Keep(KeepReason),
}

/// The first blocking cause and the run that has it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Blocker {
    /// `None` only for [`KeepReason::EmptyTree`].
    pub run_id: Option<RunId>,
    pub reason: KeepReason,
}

/// The latest finish time that may expire at `now_ms`: runs must finish
/// strictly before it. `None` while less than [`RETENTION_MS`] has passed
/// since time zero.
pub const fn cutoff_ms(now_ms: u64) -> Option<u64> {
    now_ms.checked_sub(RETENTION_MS)
}

/// The selector of the automatic sweep: expire the whole tree, or keep it
/// for the first cause.
pub fn select(tree: &[RetainedRun], now_ms: u64) -> Verdict {
    select_before(tree, cutoff_ms(now_ms))
}

/// The selector with an explicit cutoff (`state prune --older-than`; the
/// sweep's is [`cutoff_ms`]): runs must have finished strictly before
/// `cutoff_ms`, and a `None` cutoff keeps every tree as [`KeepReason::Young`].
pub fn select_before(tree: &[RetainedRun], cutoff_ms: Option<u64>) -> Verdict {
    match first_blocker_before(tree, cutoff_ms) {
        None => Verdict::Expire,
        Some(blocker) => Verdict::Keep(blocker.reason),
    }
}

/// The first cause, in [`KeepReason`] order, that keeps the tree at
/// `now_ms`, with the first run (in the given order) that has it.
pub fn first_blocker(tree: &[RetainedRun], now_ms: u64) -> Option<Blocker> {
    first_blocker_before(tree, cutoff_ms(now_ms))
}

/// [`first_blocker`] with an explicit cutoff (see [`select_before`]).
pub fn first_blocker_before(tree: &[RetainedRun], cutoff_ms: Option<u64>) -> Option<Blocker> {
    if tree.is_empty() {
        return Some(Blocker {
            run_id: None,
            reason: KeepReason::EmptyTree,
        });
    }
    keep_reasons().find_map(|reason| {
        let run = tree.iter().find(|run| has_cause(run, reason, cutoff_ms))?;
        Some(Blocker {
            run_id: Some(run.run_id.clone()),
            reason,
        })
    })
}

/// Every per-run keep reason, in check order.
fn keep_reasons() -> impl Iterator<Item = KeepReason> {
    let protected = Protected::ALL
        .into_iter()
        .map(|protected| KeepReason::Protected { protected });
    [
        KeepReason::NotTerminal,
        KeepReason::NoFinishTime,
        KeepReason::Young,
    ]
    .into_iter()
    .chain(protected)
    .chain([
        KeepReason::OutsideContinuation,
        KeepReason::OutsideStepReference,
        KeepReason::UnknownOwnership,
    ])
}

/// Whether `run` has the keep cause `reason` (with `cutoff_ms` from [`cutoff_ms`]).
fn has_cause(run: &RetainedRun, reason: KeepReason, cutoff_ms: Option<u64>) -> bool {
    match reason {
        KeepReason::EmptyTree => false,
        KeepReason::NotTerminal => !run.status.is_terminal(),
        KeepReason::NoFinishTime => run.finished_at_ms.is_none(),
        KeepReason::Young => !matches!(
            (run.finished_at_ms, cutoff_ms),
            (Some(at), Some(cutoff)) if at < cutoff
        ),
        KeepReason::Protected { protected } => run.protections.contains(protected),
        KeepReason::OutsideContinuation => run.outside_references.continuation,
        KeepReason::OutsideStepReference => run.outside_references.step,
        KeepReason::UnknownOwnership => !run.ownership_known,
    }
}

/// Work that must not overlap a sweep, counted by the shell.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct ServerActivity {
    /// Workflow runners that are active or admitted and pending spawn.
    pub workflow_runners: u32,
    /// Resource-manager runners that are active or pending.
    pub resource_runners: u32,
    pub maintenance_command: bool,
    pub shutting_down: bool,
}

/// Why the server is not idle, in check order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BusyCause {
    ShuttingDown,
    MaintenanceCommand,
    WorkflowRunner,
    ResourceRunner,
}

impl ServerActivity {
    /// The first reason the server is busy, or `None` when idle.
    pub const fn busy(&self) -> Option<BusyCause> {
        if self.shutting_down {
            Some(BusyCause::ShuttingDown)
        } else if self.maintenance_command {
            Some(BusyCause::MaintenanceCommand)
        } else if self.workflow_runners > 0 {
            Some(BusyCause::WorkflowRunner)
        } else if self.resource_runners > 0 {
            Some(BusyCause::ResourceRunner)
        } else {
            None
        }
    }
}

/// The process-local sweep schedule of one server process.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct SweepSchedule {
    /// When this process last completed a sweep.
    pub completed_at_ms: Option<u64>,
    /// No sweep may start before this time (after a failure).
    pub retry_at_ms: Option<u64>,
    /// A sweep is running now (overlapping requests join it).
    pub running: bool,
}

/// Why a sweep may not start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "blocked")]
pub enum SweepBlocked {
    /// A sweep is already running; the request joins it.
    AlreadyRunning,
    Busy {
        cause: BusyCause,
    },
    /// A failed sweep waits before the next attempt.
    RetryWait {
        retry_at_ms: u64,
    },
    /// This process completed a sweep less than 24 hours ago.
    NotDue {
        due_at_ms: u64,
    },
}

/// Whether a sweep may start now; on success the schedule marks it running.
pub fn start_sweep(
    schedule: &SweepSchedule,
    activity: &ServerActivity,
    now_ms: u64,
) -> Result<SweepSchedule, SweepBlocked> {
    if schedule.running {
        return Err(SweepBlocked::AlreadyRunning);
    }
    if let Some(cause) = activity.busy() {
        return Err(SweepBlocked::Busy { cause });
    }
    if let Some(retry_at_ms) = schedule.retry_at_ms.filter(|at| now_ms < *at) {
        return Err(SweepBlocked::RetryWait { retry_at_ms });
    }
    if let Some(due_at_ms) = schedule
        .completed_at_ms
        .map(|at| at.saturating_add(SWEEP_INTERVAL_MS))
        .filter(|due| now_ms < *due)
    {
        return Err(SweepBlocked::NotDue { due_at_ms });
    }
    Ok(SweepSchedule {
        running: true,
        ..*schedule
    })
}

/// Between two root trees: the sweep goes on only while the server stays idle.
pub const fn may_continue_sweep(activity: &ServerActivity) -> Result<(), BusyCause> {
    match activity.busy() {
        Some(cause) => Err(cause),
        None => Ok(()),
    }
}

/// How a running sweep ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SweepEnd {
    /// Every due tree was checked; the next daily check is due in 24 hours.
    Completed,
    /// New work appeared; cleanup stopped between trees and remains due. The
    /// next idle lifecycle trigger continues it, or the idle retry timer.
    Interrupted,
    /// The sweep failed; one bounded diagnostic, then a five-minute wait.
    Failed,
}

/// What the shell does after a sweep ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SweepEnded {
    pub schedule: SweepSchedule,
    /// When to request the next sweep if nothing triggers one earlier.
    pub next_check_at_ms: u64,
}

/// Ends the running sweep.
pub const fn end_sweep(schedule: &SweepSchedule, end: SweepEnd, now_ms: u64) -> SweepEnded {
    let retry_at_ms = now_ms.saturating_add(SWEEP_RETRY_MS);
    match end {
        SweepEnd::Completed => SweepEnded {
            schedule: SweepSchedule {
                completed_at_ms: Some(now_ms),
                retry_at_ms: None,
                running: false,
            },
            next_check_at_ms: now_ms.saturating_add(SWEEP_INTERVAL_MS),
        },
        SweepEnd::Interrupted => SweepEnded {
            schedule: SweepSchedule {
                running: false,
                ..*schedule
            },
            next_check_at_ms: retry_at_ms,
        },
        SweepEnd::Failed => SweepEnded {
            schedule: SweepSchedule {
                retry_at_ms: Some(retry_at_ms),
                running: false,
                ..*schedule
            },
            next_check_at_ms: retry_at_ms,
        },
    }
}

/// SQLite page counts the shell reads after a sweep (`PRAGMA page_size`,
/// `page_count`, `freelist_count`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct PageStats {
    pub page_size_bytes: u64,
    pub page_count: u64,
    pub free_pages: u64,
}

impl PageStats {
    /// Bytes a `VACUUM` could give back.
    pub const fn reclaimable_bytes(&self) -> u64 {
        self.free_pages.saturating_mul(self.page_size_bytes)
    }
}

/// Why automatic compaction is skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "skip")]
pub enum VacuumSkip {
    Busy { cause: BusyCause },
    TooLittleReclaimable,
    TooFewFreePages,
}

/// Whether to run automatic `VACUUM` now. A skip leaves committed deletions
/// and reusable free pages intact.
pub fn should_vacuum(activity: &ServerActivity, pages: &PageStats) -> Result<(), VacuumSkip> {
    if let Some(cause) = activity.busy() {
        return Err(VacuumSkip::Busy { cause });
    }
    if pages.reclaimable_bytes() < VACUUM_MIN_RECLAIMABLE_BYTES {
        return Err(VacuumSkip::TooLittleReclaimable);
    }
    let free = u128::from(pages.free_pages) * 100;
    let needed = u128::from(pages.page_count) * u128::from(VACUUM_MIN_FREE_PERCENT);
    if pages.page_count == 0 || free < needed {
        return Err(VacuumSkip::TooFewFreePages);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
