//! The registry of this server's runners: capacity slots being admitted,
//! prepared authorities and live runner handles. Plain in-memory state:
//! spawning, stopping and exits are `children::supervisor`'s.

use crate::process::ProcessIdentity;
use kernel::claim::Authority;
use kernel::ids::{Generation, RunId, RunnerEpochId};
use kernel::output::{LaunchCommand, StopReason};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// One supervised runner process.
#[derive(Debug)]
pub struct Runner {
    pub run_id: RunId,
    pub runner_epoch: RunnerEpochId,
    pub generation: Generation,
    /// The host authority the server holds for this runner's claim.
    pub authority: Authority,
    pub command: LaunchCommand,
    pub(crate) outbox: mpsc::UnboundedSender<Vec<u8>>,
    pub(crate) outbox_receiver: Mutex<Option<mpsc::UnboundedReceiver<Vec<u8>>>>,
    pub(crate) identity: Mutex<Option<ProcessIdentity>>,
    pub(crate) stop_reason: Mutex<Option<StopReason>>,
    pub(crate) startup_missed: AtomicBool,
    pub(crate) ready: AtomicBool,
    /// Told that its claim is lost; it must exit.
    pub(crate) fenced: AtomicBool,
    /// The content references sent to this runner (canonical text): the
    /// only content its `content.read` may ask for.
    pub(crate) issued: Mutex<HashSet<String>>,
}

impl Runner {
    /// Remembers content references sent to this runner.
    pub fn issue(&self, references: impl IntoIterator<Item = String>) {
        self.issued.lock().expect("issued lock").extend(references);
    }

    /// Whether `reference` (canonical text) was sent to this runner.
    pub fn was_issued(&self, reference: &str) -> bool {
        self.issued.lock().expect("issued lock").contains(reference)
    }

    /// Sends one frame to the runner's stdin.
    pub fn send(&self, frame: Vec<u8>) {
        let _ = self.outbox.send(frame);
    }

    /// The recorded process identity, once spawned.
    pub fn identity(&self) -> Option<ProcessIdentity> {
        self.identity.lock().expect("identity lock").clone()
    }

    /// Marks the runner ready (its startup deadline no longer applies).
    pub fn mark_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Marks the runner fenced: it lost its claim and must exit.
    pub fn mark_fenced(&self) -> bool {
        !self.fenced.swap(true, Ordering::SeqCst)
    }

    /// Whether the runner was told its claim is lost.
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }
}

/// All runners of this server.
#[derive(Debug, Default)]
pub struct Runners {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Launches being admitted (no authority yet) or committed and about to
    /// spawn (with their run and authority); both count against capacity.
    prepared: HashMap<RunnerEpochId, Option<(RunId, Authority)>>,
    runners: HashMap<RunnerEpochId, Arc<Runner>>,
}

impl Runners {
    /// No runners.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reserves a capacity slot for a runner epoch about to be admitted.
    pub fn reserve_slot(&self, runner_epoch: RunnerEpochId) {
        self.inner
            .lock()
            .expect("supervisor lock")
            .prepared
            .insert(runner_epoch, None);
    }

    /// Records the authority of an admission inside its write transaction
    /// (on the writer thread, before the commit), so that every later job
    /// sees the authority its committed claim names. A batch that does not
    /// commit is followed by `forget`.
    pub fn prepare(&self, runner_epoch: RunnerEpochId, run_id: RunId, authority: Authority) {
        self.inner
            .lock()
            .expect("supervisor lock")
            .prepared
            .insert(runner_epoch, Some((run_id, authority)));
    }

    /// Forgets a prepared authority whose admission did not commit.
    pub fn forget(&self, runner_epoch: &RunnerEpochId) {
        self.inner
            .lock()
            .expect("supervisor lock")
            .prepared
            .remove(runner_epoch);
    }

    /// Live runners plus launches being prepared: what counts against capacity.
    pub fn occupied(&self) -> usize {
        let inner = self.inner.lock().expect("supervisor lock");
        inner.runners.len() + inner.prepared.len()
    }

    /// Live runners.
    pub fn live_count(&self) -> usize {
        self.inner.lock().expect("supervisor lock").runners.len()
    }

    /// The live runner of `run_id`, if any.
    pub fn runner_of(&self, run_id: &RunId) -> Option<Arc<Runner>> {
        let inner = self.inner.lock().expect("supervisor lock");
        inner
            .runners
            .values()
            .find(|runner| &runner.run_id == run_id)
            .cloned()
    }

    /// The host authority this server holds for `run_id`: its live runner's,
    /// or that of an admission committed (or committing) before its launch.
    /// Read it inside the write job that checks it: admissions record
    /// theirs on the writer thread.
    pub fn authority_for(&self, run_id: &RunId) -> Option<Authority> {
        let inner = self.inner.lock().expect("supervisor lock");
        inner
            .prepared
            .values()
            .flatten()
            .find(|(prepared_run, _)| prepared_run == run_id)
            .map(|(_, authority)| authority.clone())
            .or_else(|| {
                inner
                    .runners
                    .values()
                    .find(|runner| &runner.run_id == run_id)
                    .map(|runner| runner.authority.clone())
            })
    }

    /// Every live runner.
    pub fn all(&self) -> Vec<Arc<Runner>> {
        self.inner
            .lock()
            .expect("supervisor lock")
            .runners
            .values()
            .cloned()
            .collect()
    }

    /// Forgets a runner whose process ended.
    pub(crate) fn remove(&self, runner_epoch: &RunnerEpochId) {
        self.inner
            .lock()
            .expect("supervisor lock")
            .runners
            .remove(runner_epoch);
    }
}

impl Runners {
    /// Registers the runner of a committed admission (its prepared
    /// authority becomes the runner's); `None` when the admission is not
    /// this server's.
    pub fn register(
        &self,
        run_id: RunId,
        generation: Generation,
        runner_epoch: RunnerEpochId,
        command: LaunchCommand,
    ) -> Option<Arc<Runner>> {
        let mut inner = self.inner.lock().expect("supervisor lock");
        let Some(Some((_, authority))) = inner.prepared.remove(&runner_epoch) else {
            return None;
        };
        let (outbox, receiver) = mpsc::unbounded_channel();
        let runner = Arc::new(Runner {
            run_id,
            runner_epoch: runner_epoch.clone(),
            generation,
            authority,
            command,
            outbox,
            outbox_receiver: Mutex::new(Some(receiver)),
            identity: Mutex::new(None),
            stop_reason: Mutex::new(None),
            startup_missed: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            issued: Mutex::new(HashSet::new()),
        });
        inner.runners.insert(runner_epoch, runner.clone());
        Some(runner)
    }

    /// The live runner of `run_id` under `runner_epoch`, if any.
    pub fn runner(&self, run_id: &RunId, runner_epoch: &RunnerEpochId) -> Option<Arc<Runner>> {
        let inner = self.inner.lock().expect("supervisor lock");
        inner
            .runners
            .get(runner_epoch)
            .filter(|runner| &runner.run_id == run_id)
            .cloned()
    }
}
