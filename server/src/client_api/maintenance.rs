//! State maintenance through the server: `state.verify`, `state.backup` and
//! `state.prune`. The command line never opens the database; these run on
//! the server's own connections.
//!
//! Invariants:
//! - `state.backup` and `state.prune` are commands with receipts. One runs
//!   at a time (`context::maintenance`); an exact retry of the running one
//!   (a reconnect retry: the same client, key and payload, a new request
//!   id) waits for it and adopts its stored receipt, so the work is never
//!   done twice. The receipt, accepted or rejected, commits before the
//!   response; the work goes on when the client disconnects, and shutdown
//!   waits for it (it is a command in flight).
//! - A backup never replaces a file and counts only once it is written,
//!   synced and verified (`store::backup`); a full disk, or any other
//!   failure, removes what it wrote and stores nothing (a retry may
//!   succeed), and the live state is only read.
//! - A prune selects with the sweep's selector and deletes with the sweep's
//!   exact-tree step (`time::sweep::expire_tree`), one tree per
//!   transaction, each tree rechecked in its own transaction. A dry run
//!   runs the same deletion and rolls it back, so what it lists is what an
//!   apply would delete. Applying first writes and verifies a new backup;
//!   if that fails nothing is deleted.
//! - `state.verify` reads one consistent snapshot on a read-only
//!   connection (the live database, or an inactive file that is not the
//!   live state) and reports counts, never row contents.
//! - Progress (`maintenanceProgress`) is published at most every 100 ms
//!   within a phase and always at a phase's end (every 250 ms while a
//!   backup is written), and the command's `done` step before its answer.

use super::receipts::{Executed, command, identity, precheck};
use super::request::{Request, not_found, refusal, schema_invalid};
use crate::context::Context;
use crate::context::maintenance::{self, Admitted, Slot};
use crate::projection::run_view::{OffSchema, to_wire};
use crate::store::backup::{self, Failure, Verification, Written};
use crate::store::retention::{self, Deleted};
use crate::time::sweep::{Interruptible, TreeMode, TreeOutcome, TreeSummary, expire_tree};
use crate::wire::client::response;
use kernel::ids::RunId;
use kernel::maintenance::{PruneMode, PruneRequest};
use kernel::receipt::CommandOutcome;
use protocol::ErrorCode;
use protocol::generated::constrained::{self as bounded, ByteCount, Count};
use protocol::generated::types::{
    ClientEvent, MaintenancePhase, Operation, PrunedTree, StateBackupPayload, StateBackupReceipt,
    StatePrunePayload, StatePruneReceipt, StateVerifyPayload, StateVerifyReceipt, VerifiedCheck,
};
use serde_json::Value;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How many trees a prune receipt lists.
const LISTED_TREES: usize = 100;

/// How many candidate roots one listing reads.
const ROOTS_PER_LISTING: usize = 256;

// ---- state.verify ------------------------------------------------------------

/// `state.verify`: the live database, or the inactive file at `path`.
pub(super) async fn verify(
    app: &Arc<Context>,
    request: &Request,
    payload: StateVerifyPayload,
) -> Value {
    let _verifying = app.maintenance.verifying();
    let state = app.store.path().to_path_buf();
    let target = payload.path.map(|path| PathBuf::from(path.to_string()));
    if let Some(path) = &target {
        if backup::is_state_file(&state, path) {
            return schema_invalid(
                request,
                "the path names the live state; `pi-workflows state verify` without a path verifies it",
            );
        }
        if !path.is_file() {
            return not_found(request, "there is no database file at the path");
        }
    }
    let quiescent = app.runners.live_count() == 0;
    let inactive = target.is_some();
    let report = tokio::task::spawn_blocking(move || match target {
        None => backup::verify_live(&state, quiescent),
        Some(path) => backup::verify_file(&path),
    })
    .await;
    match report.map(|report| report.map(|report| verify_receipt(&report))) {
        Ok(Ok(Ok(receipt))) => response(
            &request.request_id,
            &request.operation,
            "accepted",
            None,
            Some(crate::wire::client::receipt(&receipt)),
            None,
        ),
        Ok(Ok(Err(_))) | Ok(Err(_)) | Err(_) if inactive => schema_invalid(
            request,
            "the file at the path is not a readable Pi Workflows database",
        ),
        Ok(Ok(Err(_))) | Ok(Err(_)) | Err(_) => refusal(
            request,
            "unavailable",
            ErrorCode::Internal,
            "the state database could not be read for verification; retry",
        ),
    }
}

fn verify_receipt(report: &Verification) -> Result<StateVerifyReceipt, OffSchema> {
    let safe = |text: &str| -> Result<protocol::generated::types::SafeMessage, OffSchema> {
        to_wire("safeMessage", text.chars().take(500).collect::<String>())
    };
    let integrity = report
        .integrity
        .iter()
        .map(|line| safe(line))
        .collect::<Result<Vec<_>, _>>()?;
    let checks = report
        .checks
        .iter()
        .map(|check| {
            Ok(VerifiedCheck {
                check: safe(check.message)?,
                violations: count(check.violations),
                skipped: check.skipped,
            })
        })
        .collect::<Result<Vec<_>, OffSchema>>()?;
    let problems = report.problems();
    Ok(StateVerifyReceipt {
        ok: problems == 0,
        problems: count(problems),
        integrity: bounded::IntegrityLines::new(integrity).map_err(|_| OffSchema("integrity"))?,
        schema_matches: report.identity_matches && report.schema_difference.is_none(),
        schema_difference: report.schema_difference.as_deref().map(safe).transpose()?,
        ddl_digest: to_wire("ddlDigest", &report.ddl_digest)?,
        foreign_key_violations: count(report.foreign_key_violations),
        checks: bounded::VerifiedChecks::new(checks).map_err(|_| OffSchema("checks"))?,
        orphaned_blobs: count(report.orphaned_blobs),
    })
}

fn count(value: u64) -> Count {
    Count::new(value.min(Count::MAX)).unwrap_or_else(|| unreachable!("clamped to the maximum"))
}

fn byte_count(value: u64) -> ByteCount {
    ByteCount::new(value.min(ByteCount::MAX))
        .unwrap_or_else(|| unreachable!("clamped to the maximum"))
}

// ---- admission ----------------------------------------------------------------

/// Runs `work` as the one maintenance command, or answers without it: a
/// stored receipt is adopted; an exact retry of the running command waits
/// for it, then adopts its receipt (or, when it stored none, runs again).
async fn exclusively<F, W>(app: &Arc<Context>, request: &Request, work: F) -> Value
where
    F: Fn(Slot) -> W,
    W: Future<Output = Value>,
{
    let identity = match identity(request) {
        Ok(identity) => identity.incoming.identity,
        Err(refusal) => return refusal,
    };
    loop {
        if let Some(adopted) = precheck(app, request).await {
            return adopted;
        }
        match app.maintenance.admit(&identity) {
            Admitted::Start(slot) => return work(slot).await,
            Admitted::Join(done) => maintenance::ended(done).await,
            Admitted::Conflict => {
                return refusal(
                    request,
                    "conflict",
                    ErrorCode::Conflict,
                    "this idempotency key names the running maintenance command with another payload",
                );
            }
            Admitted::Busy => {
                return refusal(
                    request,
                    "unavailable",
                    ErrorCode::Unavailable,
                    "another state maintenance command is running; retry when it finished",
                );
            }
        }
    }
}

/// Stores `executed` as the command's receipt and answers with it, then
/// ends the maintenance command.
async fn finish(app: &Arc<Context>, request: &Request, slot: Slot, executed: Executed) -> Value {
    let answer = command(app, request.clone(), move |_, _| Ok(executed)).await;
    drop(slot);
    answer
}

// ---- progress -------------------------------------------------------------------

/// Publishes one command's progress: at most every [`PROGRESS_EVERY`]
/// within a phase, and always a phase's first and last step.
struct Progress {
    app: Arc<Context>,
    operation: Operation,
    key: Option<protocol::generated::types::IdempotencyKey>,
    last: std::sync::Mutex<Option<(MaintenancePhase, std::time::Instant)>>,
}

/// The least time between two progress events of one phase.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Whether a progress step must be published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// When due (a new phase, or `PROGRESS_EVERY` since the last one).
    WhenDue,
    /// Always: the last step of a phase.
    Last,
}

impl Progress {
    fn new(app: &Arc<Context>, request: &Request, operation: Operation) -> Self {
        Self {
            app: app.clone(),
            operation,
            key: request
                .idempotency_key
                .as_deref()
                .and_then(|key| to_wire("idempotencyKey", key).ok()),
            last: std::sync::Mutex::new(None),
        }
    }

    fn publish(&self, phase: MaintenancePhase, trees: (u64, u64), bytes: (u64, u64), step: Step) {
        let Some(key) = self.key.clone() else {
            return;
        };
        {
            let mut last = self.last.lock().expect("progress lock");
            let due = match *last {
                Some((last_phase, at)) => last_phase != phase || at.elapsed() >= PROGRESS_EVERY,
                None => true,
            };
            if !due && step == Step::WhenDue {
                return;
            }
            *last = Some((phase, std::time::Instant::now()));
        }
        self.app
            .presentation
            .hub
            .publish_progress(ClientEvent::MaintenanceProgress {
                bytes_done: byte_count(bytes.0),
                bytes_total: byte_count(bytes.1),
                idempotency_key: key,
                operation: self.operation,
                phase,
                trees_done: count(trees.0),
                trees_total: count(trees.1),
            });
    }
}

// ---- state.backup ------------------------------------------------------------

/// `state.backup`: an online, verified backup at a new absolute path.
pub(super) async fn backup(
    app: &Arc<Context>,
    request: &Request,
    payload: StateBackupPayload,
) -> Value {
    let destination = PathBuf::from(payload.destination.to_string());
    exclusively(app, request, |slot| {
        let destination = destination.clone();
        async move {
            let progress = Progress::new(app, request, Operation::StateBackup);
            let executed = match make_backup(app, &progress, &destination).await {
                Ok(receipt) => Executed::done(&receipt),
                Err(refused) => refused,
            };
            progress.publish(MaintenancePhase::Done, (0, 0), (0, 0), Step::Last);
            finish(app, request, slot, executed).await
        }
    })
    .await
}

/// Checks the destination, writes the backup with progress, and returns its
/// receipt, or the refusal to answer with.
async fn make_backup(
    app: &Arc<Context>,
    progress: &Progress,
    destination: &Path,
) -> Result<StateBackupReceipt, Executed> {
    let state = app.store.path().to_path_buf();
    let facts = backup::destination_facts(&state, destination);
    kernel::maintenance::check_destination(&facts)
        .map_err(|refusal| Executed::rejected(&refusal))?;
    let total = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || backup::expected_bytes(&state))
            .await
            .unwrap_or(0)
    };
    let target = destination.to_path_buf();
    let mut writing = tokio::task::spawn_blocking(move || backup::write(&state, &target));
    let written = loop {
        progress.publish(
            MaintenancePhase::Backup,
            (0, 0),
            (
                std::fs::metadata(destination)
                    .map_or(0, |meta| meta.len())
                    .min(total),
                total,
            ),
            Step::WhenDue,
        );
        tokio::select! {
            done = &mut writing => {
                break done.unwrap_or_else(|_| Err(Failure::Failed("the backup stopped".into())));
            }
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    };
    let Written { bytes, digest } = written.map_err(|failure| backup_refusal(&failure))?;
    progress.publish(MaintenancePhase::Backup, (0, 0), (bytes, bytes), Step::Last);
    let receipt = || -> Result<StateBackupReceipt, OffSchema> {
        Ok(StateBackupReceipt {
            destination: to_wire("destination", destination.to_string_lossy())?,
            bytes: byte_count(bytes),
            digest: to_wire("digest", crate::ids::digest_text(&digest))?,
        })
    };
    receipt().map_err(|_| {
        retry_later(
            ErrorCode::Internal,
            "the backup was written but its receipt does not fit its schema; report this server bug",
        )
    })
}

/// A refusal that stores no receipt: the same command may be retried.
fn retry_later(code: ErrorCode, message: impl Into<String>) -> Executed {
    Executed::refused(CommandOutcome::Unavailable, code, message)
}

/// The answer to a backup that was not made. Only an existing destination
/// is a durable refusal (stored); a full disk and other failures store
/// nothing, so the same command can be retried.
fn backup_refusal(failure: &Failure) -> Executed {
    match failure {
        Failure::Exists => {
            Executed::rejected(&kernel::maintenance::BackupRefusal::DestinationExists)
        }
        Failure::NoSuchDirectory => {
            Executed::rejected(&kernel::maintenance::BackupRefusal::NoSuchDirectory)
        }
        Failure::DiskFull => retry_later(
            ErrorCode::Unavailable,
            "the disk holding the backup path is full, so no backup was kept (the state is unchanged); free space there and retry",
        ),
        Failure::Failed(why) => retry_later(
            ErrorCode::Internal,
            format!("the backup failed and was removed: {why}; retry"),
        ),
        Failure::Unverified(why) => retry_later(
            ErrorCode::Internal,
            format!("the backup did not verify and was removed: {why}; retry"),
        ),
    }
}

// ---- state.prune ----------------------------------------------------------------

/// What a pass over the due trees found or deleted.
#[derive(Debug, Default)]
struct Pass {
    trees: u64,
    kept: u64,
    deleted: Deleted,
    listed: Vec<TreeSummary>,
}

impl Pass {
    fn add(&mut self, summary: TreeSummary) {
        self.trees += 1;
        self.deleted.runs += summary.deleted.runs;
        self.deleted.blobs += summary.deleted.blobs;
        self.deleted.definitions += summary.deleted.definitions;
        self.deleted.bytes += summary.deleted.bytes;
        if self.listed.len() < LISTED_TREES {
            self.listed.push(summary);
        }
    }
}

/// `state.prune`: a dry run, or a backup followed by the deletion.
pub(super) async fn prune(
    app: &Arc<Context>,
    request: &Request,
    payload: StatePrunePayload,
) -> Value {
    let asked = PruneRequest {
        apply: payload.apply,
        backup: payload.backup.is_some(),
        older_than_days: payload.older_than_days.map(|days| days.get()),
    };
    let destination = payload.backup.map(|path| PathBuf::from(path.to_string()));
    exclusively(app, request, |slot| {
        let destination = destination.clone();
        async move {
            let progress = Progress::new(app, request, Operation::StatePrune);
            let executed = pruned(app, &progress, asked, destination.as_deref()).await;
            progress.publish(MaintenancePhase::Done, (0, 0), (0, 0), Step::Last);
            finish(app, request, slot, executed).await
        }
    })
    .await
}

async fn pruned(
    app: &Arc<Context>,
    progress: &Progress,
    asked: PruneRequest,
    destination: Option<&Path>,
) -> Executed {
    let plan = match kernel::maintenance::plan_prune(asked, crate::clock::now_ms()) {
        Ok(plan) => plan,
        Err(refusal) => return Executed::rejected(&refusal),
    };
    if let (PruneMode::BackupThenApply, Some(destination)) = (plan.mode, destination) {
        let facts = backup::destination_facts(app.store.path(), destination);
        if let Err(refusal) = kernel::maintenance::check_destination(&facts) {
            return Executed::rejected(&refusal);
        }
    }
    let selected = match pass(app, progress, plan.cutoff_ms, TreeMode::DryRun, None).await {
        Ok(selected) => selected,
        Err(refused) => return refused,
    };
    let (pass, backup) = match (plan.mode, destination) {
        (PruneMode::DryRun, _) => (selected, None),
        (PruneMode::BackupThenApply, Some(destination)) => {
            let backup = match make_backup(app, progress, destination).await {
                Ok(backup) => backup,
                Err(refused) => return refused,
            };
            match pass(
                app,
                progress,
                plan.cutoff_ms,
                TreeMode::Delete,
                Some(&selected),
            )
            .await
            {
                Ok(deleted) => (deleted, Some(backup)),
                Err(refused) => return refused,
            }
        }
        // `plan_prune` refuses an apply without a backup path.
        (PruneMode::BackupThenApply, None) => {
            return Executed::rejected(&kernel::maintenance::PruneRefusal::ApplyWithoutBackup);
        }
    };
    match prune_receipt(&pass, plan.older_than_days, plan.mode, backup) {
        Ok(receipt) => Executed::done(&receipt),
        Err(_) => retry_later(
            ErrorCode::Internal,
            "the prune's receipt does not fit its schema; report this server bug",
        ),
    }
}

/// One pass over every root tree that finished before `cutoff_ms`, each in
/// its own transaction. `selection` (the dry run before an apply) gives the
/// totals progress counts against.
async fn pass(
    app: &Arc<Context>,
    progress: &Progress,
    cutoff_ms: Option<u64>,
    mode: TreeMode,
    selection: Option<&Pass>,
) -> Result<Pass, Executed> {
    let mut pass = Pass::default();
    let Some(cutoff_ms) = cutoff_ms else {
        return Ok(pass);
    };
    let failed = |_| {
        retry_later(
            ErrorCode::Internal,
            "the state database failed during the prune (every tree deleted so far went whole); retry",
        )
    };
    let phase = match mode {
        TreeMode::DryRun => MaintenancePhase::Select,
        TreeMode::Delete => MaintenancePhase::Delete,
    };
    let (trees_total, bytes_total) = match selection {
        Some(selection) => (selection.trees, selection.deleted.bytes),
        None => (
            app.store
                .read(move |connection| retention::count_due_roots(connection, cutoff_ms))
                .await
                .map_err(failed)?,
            0,
        ),
    };
    let mut after: Option<(u64, RunId)> = None;
    let mut looked = 0u64;
    loop {
        let from = after.clone();
        let roots = app
            .store
            .read(move |connection| {
                retention::due_roots(connection, cutoff_ms, from.as_ref(), ROOTS_PER_LISTING)
            })
            .await
            .map_err(failed)?;
        if roots.is_empty() {
            let done = match mode {
                TreeMode::DryRun => looked,
                TreeMode::Delete => pass.trees,
            };
            progress.publish(
                phase,
                (done, done),
                (pass.deleted.bytes, pass.deleted.bytes),
                Step::Last,
            );
            return Ok(pass);
        }
        for (finished_at_ms, root) in roots {
            let outcome = expire_tree(app, root.clone(), Some(cutoff_ms), mode, Interruptible::No)
                .await
                .map_err(failed)?;
            looked += 1;
            match outcome {
                TreeOutcome::Expired(summary) => pass.add(summary),
                TreeOutcome::Kept => pass.kept += 1,
                TreeOutcome::Gone | TreeOutcome::Busy => {}
            }
            let done = match mode {
                TreeMode::DryRun => looked,
                TreeMode::Delete => pass.trees,
            };
            progress.publish(
                phase,
                (done, trees_total.max(done)),
                (pass.deleted.bytes, bytes_total.max(pass.deleted.bytes)),
                Step::WhenDue,
            );
            after = Some((finished_at_ms, root));
            tokio::task::yield_now().await;
        }
    }
}

fn prune_receipt(
    pass: &Pass,
    older_than_days: u64,
    mode: PruneMode,
    backup: Option<StateBackupReceipt>,
) -> Result<StatePruneReceipt, OffSchema> {
    let trees = pass
        .listed
        .iter()
        .map(|tree| {
            Ok(PrunedTree {
                root_run_id: to_wire("rootRunId", tree.root.as_str())?,
                workflow_name: to_wire(
                    "workflowName",
                    tree.workflow_name.chars().take(500).collect::<String>(),
                )?,
                finished_at_ms: bounded::TimestampMs::new(tree.finished_at_ms)
                    .ok_or(OffSchema("finishedAtMs"))?,
                runs: count(tree.deleted.runs),
                bytes: byte_count(tree.deleted.bytes),
            })
        })
        .collect::<Result<Vec<_>, OffSchema>>()?;
    Ok(StatePruneReceipt {
        applied: mode == PruneMode::BackupThenApply,
        backup,
        blobs: count(pass.deleted.blobs),
        bytes: byte_count(pass.deleted.bytes),
        kept: count(pass.kept),
        older_than_days: bounded::OlderThanDays::new(older_than_days)
            .ok_or(OffSchema("olderThanDays"))?,
        root_runs: count(pass.trees),
        runs: count(pass.deleted.runs),
        trees: bounded::PrunedTrees::new(trees).map_err(|_| OffSchema("trees"))?,
    })
}

#[cfg(test)]
mod tests {
    /// The kernel's prune bounds are the schema's.
    #[test]
    fn the_prune_days_are_the_schema_bounds() {
        use protocol::generated::constrained::OlderThanDays;
        assert_eq!(OlderThanDays::MIN, 1);
        assert_eq!(OlderThanDays::MAX, kernel::maintenance::MAX_PRUNE_DAYS);
        assert!(OlderThanDays::new(kernel::maintenance::DEFAULT_PRUNE_DAYS).is_some());
    }
}
