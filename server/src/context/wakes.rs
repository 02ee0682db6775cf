//! The wake heap: scheduled wakes by due time. Plain in-memory state;
//! firing them is `time::wakes`'s. Wakes are hints: each one re-reads
//! committed facts, so a lost heap (a restart) loses nothing durable.

use kernel::ids::RunId;
use kernel::output::WakeReason;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;
use tokio::sync::Notify;

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Wake {
    pub(crate) at_ms: u64,
    pub(crate) run_id: RunId,
    pub(crate) reason: WakeReason,
}

/// Pending wakes.
#[derive(Debug, Default)]
pub struct Wakes {
    pub(crate) heap: Mutex<BinaryHeap<Reverse<Wake>>>,
    pub(crate) changed: Notify,
}

impl Wakes {
    /// No wakes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Schedules a wake.
    pub fn wake(&self, run_id: RunId, at_ms: u64, reason: WakeReason) {
        self.heap.lock().expect("timer lock").push(Reverse(Wake {
            at_ms,
            run_id,
            reason,
        }));
        self.changed.notify_one();
    }

    /// How many wakes are scheduled.
    pub fn pending(&self) -> usize {
        self.heap.lock().expect("timer lock").len()
    }

    /// The scheduled wakes (run and reason), in no particular order.
    pub(crate) fn scheduled(&self) -> Vec<(RunId, WakeReason)> {
        self.heap
            .lock()
            .expect("timer lock")
            .iter()
            .map(|Reverse(wake)| (wake.run_id.clone(), wake.reason.clone()))
            .collect()
    }

    pub(crate) fn next_due(&self, now_ms: u64) -> Result<Wake, Option<u64>> {
        let mut heap = self.heap.lock().expect("timer lock");
        match heap.peek() {
            Some(Reverse(wake)) if wake.at_ms <= now_ms => Ok(heap.pop().expect("peeked").0),
            Some(Reverse(wake)) => Err(Some(wake.at_ms)),
            None => Err(None),
        }
    }
}
