//! The automatic state-retention sweep, and the one run-tree step it shares
//! with `state prune` ([`expire_tree`]).
//!
//! Invariants (the seed's "State retention"; every decision is
//! `kernel::retention`'s):
//! - One sweep task per server process ([`run`]). Requests only wake it:
//!   after startup recovery, after a workflow runner exits, when a run ends
//!   (the kernel's `RequestRetentionSweep`), when a maintenance command
//!   ends. Overlapping requests join the one task.
//! - A sweep starts only when `start_sweep` allows it: nothing is active or
//!   pending (workflow runners, validation children, admissible or running
//!   runs, a maintenance command, shutdown), no failure in the last five
//!   minutes, and no completed sweep of this process in the last 24 hours.
//!   The schedule is process-local.
//! - One root tree per transaction: [`expire_tree`] reads the tree, the
//!   kernel's selector rechecks it, and it is deleted whole (with the blobs
//!   only it used) or not at all, in one write job; the task then yields so
//!   other jobs run between trees. Before each tree `may_continue_sweep`
//!   is asked (the durable part inside the tree's job); when new work
//!   appeared the sweep stops between trees and stays due: the next idle
//!   trigger, or the five-minute retry, continues it.
//! - After the last tree the WAL is truncated, and `VACUUM` runs only if
//!   `should_vacuum` allows it (still idle, at least 64 MiB reclaimable, at
//!   least 20% of the pages free). A skipped or failed `VACUUM` leaves the
//!   committed deletions and the free pages, which SQLite reuses.
//! - A failure logs one bounded line and ends the sweep `Failed` (the next
//!   attempt waits five minutes); it never fails a workflow or stops the
//!   server. The automatic sweep makes no backup.

use crate::context::Context;
use crate::fault::FaultPoint;
use crate::store::retention::{self, Deleted};
use crate::store::{Commit, StoreError, runs};
use kernel::ids::RunId;
use kernel::retention::{
    SWEEP_RETRY_MS, ServerActivity, SweepBlocked, SweepEnd, SweepSchedule, VacuumSkip, Verdict,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many candidate roots one listing reads.
const ROOTS_PER_LISTING: usize = 256;

/// Runs the sweep task until the process ends.
pub async fn run(app: Arc<Context>) {
    let mut schedule = SweepSchedule::default();
    let mut next_check: Option<tokio::time::Instant> = None;
    loop {
        match next_check {
            Some(at) => tokio::select! {
                () = app.maintenance.sweep_requested() => {}
                () = tokio::time::sleep_until(at) => next_check = None,
            },
            None => app.maintenance.sweep_requested().await,
        }
        if app.is_stopping() {
            return;
        }
        let now_ms = crate::clock::now_ms();
        let activity = activity(&app).await;
        match kernel::retention::start_sweep(&schedule, &activity, now_ms) {
            Ok(running) => {
                app.maintenance.set_sweeping(true);
                let end = sweep(&app).await;
                app.maintenance.set_sweeping(false);
                let ended = kernel::retention::end_sweep(&running, end, crate::clock::now_ms());
                schedule = ended.schedule;
                next_check = Some(instant_at(ended.next_check_at_ms));
            }
            // The next idle trigger starts it; the retry is the safety net.
            Err(SweepBlocked::Busy { .. }) => {
                let retry = instant_at(now_ms.saturating_add(SWEEP_RETRY_MS));
                next_check = Some(next_check.map_or(retry, |at| at.min(retry)));
            }
            Err(SweepBlocked::RetryWait { retry_at_ms }) => {
                next_check = Some(instant_at(retry_at_ms));
            }
            Err(SweepBlocked::NotDue { due_at_ms }) => next_check = Some(instant_at(due_at_ms)),
            // This task is the only one that runs a sweep.
            Err(SweepBlocked::AlreadyRunning) => {}
        }
    }
}

/// The instant of the wall-clock time `at_ms`.
fn instant_at(at_ms: u64) -> tokio::time::Instant {
    let now_ms = crate::clock::now_ms();
    tokio::time::Instant::now() + Duration::from_millis(at_ms.saturating_sub(now_ms))
}

/// The work that must not overlap a sweep, with `pending` durable runs
/// (admissible or running) counted as pending runners.
fn activity_with(app: &Context, pending: u64) -> ServerActivity {
    let runners = app.runners.occupied() as u64 + app.validations.in_flight() as u64 + pending;
    ServerActivity {
        workflow_runners: u32::try_from(runners).unwrap_or(u32::MAX),
        // This version runs no resource managers.
        resource_runners: 0,
        maintenance_command: app.maintenance.is_active(),
        shutting_down: app.is_stopping(),
    }
}

/// [`activity_with`] the durable pending runs (an unreadable count is busy).
async fn activity(app: &Arc<Context>) -> ServerActivity {
    let pending = app
        .store
        .read(runs::unsettled_run_count)
        .await
        .map_or(1, |count| u64::try_from(count).unwrap_or(0));
    activity_with(app, pending)
}

/// What the sweep did, for its one log line.
#[derive(Debug, Default)]
struct Totals {
    trees: u64,
    kept: u64,
    deleted: Deleted,
}

impl Totals {
    fn add(&mut self, deleted: &Deleted) {
        self.trees += 1;
        self.deleted.runs += deleted.runs;
        self.deleted.blobs += deleted.blobs;
        self.deleted.definitions += deleted.definitions;
        self.deleted.bytes += deleted.bytes;
    }
}

/// One sweep: every due tree, then the compaction.
async fn sweep(app: &Arc<Context>) -> SweepEnd {
    let started = Instant::now();
    let mut totals = Totals::default();
    if let Some(cutoff_ms) = kernel::retention::cutoff_ms(crate::clock::now_ms()) {
        let mut after: Option<(u64, RunId)> = None;
        loop {
            let from = after.clone();
            let listed = app
                .store
                .read(move |connection| {
                    retention::due_roots(connection, cutoff_ms, from.as_ref(), ROOTS_PER_LISTING)
                })
                .await;
            let roots = match listed {
                Ok(roots) if roots.is_empty() => break,
                Ok(roots) => roots,
                Err(error) => return failed(&totals, &error),
            };
            for (finished_at_ms, root) in roots {
                if kernel::retention::may_continue_sweep(&activity_with(app, 0)).is_err() {
                    return interrupted(&totals);
                }
                let expired = expire_tree(
                    app,
                    root.clone(),
                    Some(cutoff_ms),
                    TreeMode::Delete,
                    Interruptible::Yes,
                )
                .await;
                match expired {
                    Ok(TreeOutcome::Expired(summary)) => totals.add(&summary.deleted),
                    Ok(TreeOutcome::Kept) => totals.kept += 1,
                    Ok(TreeOutcome::Gone) => {}
                    Ok(TreeOutcome::Busy) => return interrupted(&totals),
                    Err(error) => return failed(&totals, &error),
                }
                after = Some((finished_at_ms, root));
                tokio::task::yield_now().await;
            }
        }
    }
    let deleted_in = started.elapsed();
    let compaction = compact(app).await;
    crate::log::line(&format!(
        "state retention: deleted {} run trees ({} runs, {} blobs, {} KiB of values) in {} ms; kept {}; {compaction}",
        totals.trees,
        totals.deleted.runs,
        totals.deleted.blobs,
        totals.deleted.bytes / 1024,
        deleted_in.as_millis(),
        totals.kept,
    ));
    SweepEnd::Completed
}

fn interrupted(totals: &Totals) -> SweepEnd {
    crate::log::line(&format!(
        "state retention: new work started, so the sweep stopped between run trees after deleting {}; it continues when the server is idle again",
        totals.trees
    ));
    SweepEnd::Interrupted
}

/// The one bounded diagnostic of a failed sweep.
fn failed(totals: &Totals, error: &StoreError) -> SweepEnd {
    crate::log::line(&format!(
        "state retention: the sweep failed after deleting {} run trees ({error}); every deleted tree went whole, and the next attempt is in five minutes",
        totals.trees
    ));
    SweepEnd::Failed
}

/// The WAL truncation and, when the kernel allows it, `VACUUM`; the phrase
/// says what happened and the file's pages.
async fn compact(app: &Arc<Context>) -> String {
    let _ = app.store.without_transaction(retention::truncate_wal).await;
    let pages = match app.store.read(retention::page_stats).await {
        Ok(pages) => pages,
        Err(error) => {
            return format!("compaction skipped: the page counts could not be read ({error})");
        }
    };
    let mib = |pages_count: u64| pages_count.saturating_mul(pages.page_size_bytes) / (1024 * 1024);
    let before = format!(
        "file {} MiB with {} MiB free",
        mib(pages.page_count),
        mib(pages.free_pages)
    );
    let activity = activity(app).await;
    match kernel::retention::should_vacuum(&activity, &pages) {
        Err(skip) => format!("{before}; VACUUM skipped ({})", skip_phrase(skip)),
        Ok(()) => match timed(app.store.without_transaction(retention::vacuum)).await {
            (Ok(()), took) => {
                let after = app
                    .store
                    .read(retention::page_stats)
                    .await
                    .map_or(0, |after| {
                        after.page_count.saturating_mul(after.page_size_bytes)
                    })
                    / (1024 * 1024);
                format!(
                    "{before}; VACUUM ran in {} ms: now {after} MiB",
                    took.as_millis()
                )
            }
            (Err(error), _) => {
                let _ = app.store.without_transaction(retention::truncate_wal).await;
                format!(
                    "{before}; VACUUM failed ({error}): the deletions stay and SQLite reuses the free pages"
                )
            }
        },
    }
}

/// `work`'s result and how long it took.
async fn timed<T>(work: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let result = work.await;
    (result, started.elapsed())
}

fn skip_phrase(skip: VacuumSkip) -> &'static str {
    match skip {
        VacuumSkip::Busy { .. } => "new work started",
        VacuumSkip::TooLittleReclaimable => "less than 64 MiB reclaimable",
        VacuumSkip::TooFewFreePages => "less than 20% of the pages free",
    }
}

// ---- one tree ------------------------------------------------------------------

/// Whether a tree's step deletes or only measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TreeMode {
    /// Delete the tree when the selector expires it.
    Delete,
    /// Run the same deletion and roll it back: what it would remove.
    DryRun,
}

/// Whether a tree's step gives way to new work (the sweep) or not (a
/// prune the user asked for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Interruptible {
    Yes,
    No,
}

/// An expired tree: its root, what the root ran, and what went.
#[derive(Clone, Debug)]
pub(crate) struct TreeSummary {
    pub(crate) root: RunId,
    pub(crate) workflow_name: String,
    pub(crate) finished_at_ms: u64,
    pub(crate) deleted: Deleted,
}

/// What one tree's step found.
#[derive(Clone, Debug)]
pub(crate) enum TreeOutcome {
    /// The selector expired it: deleted (or, in a dry run, what would go).
    Expired(TreeSummary),
    /// The selector keeps it (protected, referenced, young or incomplete).
    Kept,
    /// The root no longer exists.
    Gone,
    /// New work appeared (an interruptible step only); nothing was read.
    Busy,
}

/// One root tree in one transaction: read it, let the kernel's selector
/// recheck it against `cutoff_ms`, and delete it whole when it expires.
pub(crate) async fn expire_tree(
    app: &Arc<Context>,
    root: RunId,
    cutoff_ms: Option<u64>,
    mode: TreeMode,
    interruptible: Interruptible,
) -> Result<TreeOutcome, StoreError> {
    let in_memory = activity_with(app, 0);
    let faults = app.faults.clone();
    let outcome = crate::shell::transact(app, move |connection, _now_ms| {
        let nothing = |outcome| Ok(Commit::Discard((outcome, Vec::new())));
        if interruptible == Interruptible::Yes {
            let pending = u64::try_from(runs::unsettled_run_count(connection)?).unwrap_or(0);
            let activity = ServerActivity {
                workflow_runners: in_memory
                    .workflow_runners
                    .saturating_add(u32::try_from(pending).unwrap_or(u32::MAX)),
                ..in_memory
            };
            if kernel::retention::may_continue_sweep(&activity).is_err() {
                return nothing(TreeOutcome::Busy);
            }
        }
        if mode == TreeMode::Delete && faults.fails(FaultPoint::TreeError) {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                Some("an injected fault (PI_WORKFLOWS_FAULT=tree_error)".into()),
            ));
        }
        let Some((workflow_name, finished_at_ms)) = retention::root_summary(connection, &root)?
        else {
            return nothing(TreeOutcome::Gone);
        };
        let tree = retention::tree(connection, &root)?;
        let facts = retention::retained_runs(connection, &tree)?;
        match kernel::retention::select_before(&facts, cutoff_ms) {
            Verdict::Keep(_) => nothing(TreeOutcome::Kept),
            Verdict::Expire => {
                let deleted = retention::delete_tree(connection, &tree)?;
                let summary = TreeSummary {
                    root,
                    workflow_name,
                    finished_at_ms: finished_at_ms.unwrap_or(0),
                    deleted,
                };
                match mode {
                    TreeMode::DryRun => nothing(TreeOutcome::Expired(summary)),
                    TreeMode::Delete => {
                        faults.hit(FaultPoint::TreeDeleted);
                        Ok(Commit::Keep((TreeOutcome::Expired(summary), Vec::new())))
                    }
                }
            }
        }
    })
    .await?;
    if mode == TreeMode::Delete && matches!(outcome, TreeOutcome::Expired(_)) {
        app.faults.hit(FaultPoint::TreeCommitted);
    }
    Ok(outcome)
}
