//! State maintenance commands (`state.backup`, `state.prune`): which one may
//! run now, what a prune request means, and when a backup destination is
//! refused.
//!
//! Invariants:
//! - At most one maintenance command runs in a server process. An exact
//!   retry of the running command (the same [`CommandIdentity`]: client,
//!   key and payload; the transport request id is not part of it) joins it
//!   and answers with its receipt, so a reconnect retry never runs the work
//!   twice. The same client and key with another payload conflicts; any
//!   other command waits its turn (a transient refusal: nothing is stored).
//! - `state.prune` is a dry run unless it applies; applying needs a backup
//!   destination, which the same command writes and verifies before it
//!   deletes anything. A dry run names no destination.
//! - The prune cutoff is `now - days` with `1 <= days <= MAX_PRUNE_DAYS`
//!   (default [`DEFAULT_PRUNE_DAYS`], the automatic retention period); runs
//!   finished before it may go, through the same selector as the sweep
//!   (`retention::select_before`).
//! - A backup never replaces a file: an existing destination, one whose
//!   directory does not exist, or the live state file itself is refused
//!   before anything is written.

use crate::receipt::CommandIdentity;
use crate::retention::RETENTION_MS;
use serde::{Deserialize, Serialize};

/// One day in milliseconds.
pub const DAY_MS: u64 = 24 * 60 * 60 * 1_000;
/// The prune cutoff when none is given: the automatic retention period.
pub const DEFAULT_PRUNE_DAYS: u64 = RETENTION_MS / DAY_MS;
/// The largest `--older-than` a prune accepts (100 years).
pub const MAX_PRUNE_DAYS: u64 = 36_500;

/// What to do with an incoming maintenance command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Admission {
    /// Nothing runs: this command runs now.
    Start,
    /// The same command runs now (a retry after a lost connection): wait for
    /// it and answer with its stored receipt.
    JoinRunning,
    /// The client's key names the running command with another payload.
    Conflict,
    /// Another maintenance command runs; retry after it finished.
    Busy,
}

/// Decides an incoming maintenance command against the one running.
pub fn admit(running: Option<&CommandIdentity>, incoming: &CommandIdentity) -> Admission {
    match running {
        None => Admission::Start,
        Some(running) if running == incoming => Admission::JoinRunning,
        Some(running)
            if running.client_id == incoming.client_id
                && running.idempotency_key == incoming.idempotency_key =>
        {
            Admission::Conflict
        }
        Some(_) => Admission::Busy,
    }
}

/// A `state.prune` request as the client sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PruneRequest {
    pub apply: bool,
    /// The request names a backup destination.
    pub backup: bool,
    pub older_than_days: Option<u64>,
}

/// Whether a prune deletes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PruneMode {
    /// Select and measure, delete nothing.
    DryRun,
    /// Back up, verify the backup, then delete what the selector expires.
    BackupThenApply,
}

/// What a valid prune request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PrunePlan {
    pub mode: PruneMode,
    pub older_than_days: u64,
    /// Runs must have finished strictly before this time (`None`: nothing
    /// is old enough yet, so nothing goes).
    pub cutoff_ms: Option<u64>,
}

/// Why a prune request is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PruneRefusal {
    /// `apply` without a backup destination.
    ApplyWithoutBackup,
    /// A backup destination on a dry run (a dry run writes nothing).
    BackupWithoutApply,
    /// `olderThanDays` is 0 or above [`MAX_PRUNE_DAYS`].
    DaysOutOfRange,
}

/// Plans a prune at `now_ms`.
pub fn plan_prune(request: PruneRequest, now_ms: u64) -> Result<PrunePlan, PruneRefusal> {
    let mode = match (request.apply, request.backup) {
        (true, true) => PruneMode::BackupThenApply,
        (true, false) => return Err(PruneRefusal::ApplyWithoutBackup),
        (false, true) => return Err(PruneRefusal::BackupWithoutApply),
        (false, false) => PruneMode::DryRun,
    };
    let older_than_days = request.older_than_days.unwrap_or(DEFAULT_PRUNE_DAYS);
    if !(1..=MAX_PRUNE_DAYS).contains(&older_than_days) {
        return Err(PruneRefusal::DaysOutOfRange);
    }
    Ok(PrunePlan {
        mode,
        older_than_days,
        cutoff_ms: now_ms.checked_sub(older_than_days * DAY_MS),
    })
}

/// What the shell found at a backup destination before writing.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct DestinationFacts {
    /// Something (a file, a directory, a link) exists at the path.
    pub exists: bool,
    /// The path's parent is an existing directory.
    pub directory_exists: bool,
    /// The path names the live state file or one of its companions.
    pub is_state_file: bool,
}

/// Why a backup destination is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BackupRefusal {
    StateFile,
    DestinationExists,
    NoSuchDirectory,
}

/// Whether a backup may be written to a destination with `facts`.
pub const fn check_destination(facts: &DestinationFacts) -> Result<(), BackupRefusal> {
    if facts.is_state_file {
        Err(BackupRefusal::StateFile)
    } else if facts.exists {
        Err(BackupRefusal::DestinationExists)
    } else if !facts.directory_exists {
        Err(BackupRefusal::NoSuchDirectory)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
