//! State maintenance in this process: the one running backup or prune
//! (`kernel::maintenance::admit` decides who may start), the verifications
//! in progress, and the requests for an automatic retention sweep.
//!
//! Invariants:
//! - At most one backup or prune runs; its [`Slot`] ends it when dropped
//!   (whatever way its handler ends), wakes every exact retry that joined
//!   it, and asks for a retention sweep (the end of a maintenance command
//!   is an idle lifecycle trigger).
//! - Sweep requests coalesce: any number of requests before the sweep task
//!   looks again are one request (overlapping requests join one task).
//! - Process-local: nothing here is durable.

use kernel::maintenance::Admission;
use kernel::receipt::CommandIdentity;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, watch};

/// The maintenance state of one server process.
#[derive(Debug, Default)]
pub struct Maintenance {
    running: Mutex<Option<Running>>,
    /// `state verify` reads in progress.
    verifying: AtomicUsize,
    sweep: Notify,
    /// A retention sweep is running (it keeps the server from idling out).
    sweeping: AtomicBool,
}

#[derive(Debug)]
struct Running {
    identity: CommandIdentity,
    done: watch::Receiver<bool>,
}

/// What an incoming backup or prune gets.
#[derive(Debug)]
pub enum Admitted {
    /// It runs now; the slot ends it when dropped.
    Start(Slot),
    /// The same command runs: wait on this until it ended.
    Join(watch::Receiver<bool>),
    /// Its key names the running command with another payload.
    Conflict,
    /// Another maintenance command runs.
    Busy,
}

/// The running backup or prune; dropping it ends it.
#[derive(Debug)]
pub struct Slot {
    maintenance: Arc<Maintenance>,
    done: watch::Sender<bool>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        *self.maintenance.running.lock().expect("maintenance lock") = None;
        let _ = self.done.send(true);
        self.maintenance.request_sweep();
    }
}

/// A `state verify` in progress; dropping it ends it.
#[derive(Debug)]
pub struct Verifying {
    maintenance: Arc<Maintenance>,
}

impl Drop for Verifying {
    fn drop(&mut self) {
        self.maintenance.verifying.fetch_sub(1, Ordering::SeqCst);
        self.maintenance.request_sweep();
    }
}

impl Maintenance {
    /// Nothing running.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Admits a backup or prune with `identity` (`kernel::maintenance::admit`).
    pub fn admit(self: &Arc<Self>, identity: &CommandIdentity) -> Admitted {
        let mut running = self.running.lock().expect("maintenance lock");
        let current = running.as_ref().map(|running| &running.identity);
        match kernel::maintenance::admit(current, identity) {
            Admission::Start => {
                let (done, waiting) = watch::channel(false);
                *running = Some(Running {
                    identity: identity.clone(),
                    done: waiting,
                });
                Admitted::Start(Slot {
                    maintenance: self.clone(),
                    done,
                })
            }
            Admission::JoinRunning => Admitted::Join(
                running
                    .as_ref()
                    .map(|running| running.done.clone())
                    .expect("a running command to join"),
            ),
            Admission::Conflict => Admitted::Conflict,
            Admission::Busy => Admitted::Busy,
        }
    }

    /// Marks a `state verify` in progress.
    pub fn verifying(self: &Arc<Self>) -> Verifying {
        self.verifying.fetch_add(1, Ordering::SeqCst);
        Verifying {
            maintenance: self.clone(),
        }
    }

    /// Whether a maintenance command (backup, prune or verify) is active.
    pub fn is_active(&self) -> bool {
        self.running.lock().expect("maintenance lock").is_some()
            || self.verifying.load(Ordering::SeqCst) > 0
    }

    /// Asks for an automatic retention sweep (`time::sweep` decides whether
    /// one may start).
    pub fn request_sweep(&self) {
        self.sweep.notify_one();
    }

    /// Waits for the next sweep request (all requests since the last wait
    /// are one).
    pub async fn sweep_requested(&self) {
        self.sweep.notified().await;
    }

    /// Marks whether a retention sweep is running.
    pub fn set_sweeping(&self, sweeping: bool) {
        self.sweeping.store(sweeping, Ordering::SeqCst);
    }

    /// Whether a retention sweep is running.
    pub fn is_sweeping(&self) -> bool {
        self.sweeping.load(Ordering::SeqCst)
    }
}

/// Waits until the joined command ended.
pub async fn ended(mut done: watch::Receiver<bool>) {
    let _ = done.wait_for(|done| *done).await;
}
