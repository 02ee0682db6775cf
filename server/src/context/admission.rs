//! The admission signal: wakes the admission loop (`children::admission`)
//! and remembers which kind of work it admitted last (the rotation).

use kernel::scheduler::WorkKind;
use std::sync::Mutex;
use tokio::sync::Notify;

/// The scheduler's wake-up signal and rotation state.
#[derive(Debug, Default)]
pub struct Scheduler {
    pub(crate) notify: Notify,
    pub(crate) last_kind: Mutex<Option<WorkKind>>,
}

impl Scheduler {
    /// A scheduler with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for an admission round.
    pub fn notify(&self) {
        self.notify.notify_one();
    }
}
