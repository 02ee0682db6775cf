//! The channel adapters' process-local registry: each configured profile's
//! state and diagnostic as `channel.status` shows them, the file-level
//! diagnostic of a broken channel configuration, the reload signal, and the
//! adapter epochs.
//!
//! Invariants:
//! - Nothing durable lives here; a restarted server rebuilds it from the
//!   configuration. A diagnostic is a safe line: it names the profile and
//!   the problem, never a token or a path.
//! - Adapter epochs only grow within a process and start above every epoch
//!   of an earlier process (they start at the wall clock in milliseconds).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Notify;

/// The state of one profile's adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterState {
    Running,
    Stopped,
    Failed,
}

/// One profile as status shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileStatus {
    pub state: AdapterState,
    pub diagnostic: Option<String>,
    /// The send attempt the adapter is applying, if any.
    pub attempt_id: Option<String>,
}

/// The registry.
#[derive(Debug, Default)]
pub struct Channels {
    profiles: Mutex<BTreeMap<String, ProfileStatus>>,
    config_diagnostic: Mutex<Option<String>>,
    epoch: AtomicU64,
    /// Notified by `channel.reload`.
    pub reload: Notify,
}

impl Channels {
    /// Replaces the configured profiles and the file-level diagnostic.
    pub fn configure(&self, profiles: BTreeMap<String, ProfileStatus>, diagnostic: Option<String>) {
        *lock(&self.profiles) = profiles;
        *lock(&self.config_diagnostic) = diagnostic;
    }

    /// Updates one profile's row (a profile no longer configured is left out).
    pub fn set(&self, profile: &str, status: ProfileStatus) {
        if let Some(row) = lock(&self.profiles).get_mut(profile) {
            *row = status;
        }
    }

    /// Every profile, in name order, and the file-level diagnostic.
    pub fn snapshot(&self) -> (Vec<(String, ProfileStatus)>, Option<String>) {
        let rows = lock(&self.profiles)
            .iter()
            .map(|(name, row)| (name.clone(), row.clone()))
            .collect();
        (rows, lock(&self.config_diagnostic).clone())
    }

    /// Whether any profile's adapter is running.
    pub fn any_running(&self) -> bool {
        lock(&self.profiles)
            .values()
            .any(|row| row.state == AdapterState::Running)
    }

    /// The epoch of the next adapter launch.
    pub fn next_epoch(&self, now_ms: u64) -> u64 {
        let mut current = self.epoch.load(Ordering::SeqCst);
        loop {
            let next = now_ms.max(current + 1);
            match self
                .epoch
                .compare_exchange(current, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return next,
                Err(seen) => current = seen,
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
