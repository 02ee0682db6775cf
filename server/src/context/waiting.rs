//! Resolvers waiting for their run: the runner process that resolved a fresh
//! `run.start` and answered `resolve.result.awaitsRun` stays alive, between
//! that start's commit and the admission round after it, so that the run's
//! first admission can hand it the run launch instead of spawning a second
//! process (`children::supervisor`, docs/ARCHITECTURE.md "One process for
//! resolution and the first run"). Plain in-memory state: resolving,
//! adoption and admission rounds are `children`'s.
//!
//! Invariants:
//! - A waiting resolver is held under the run id its start would create,
//!   before that start's write job, so no admission of the run can miss it.
//! - It is offered to admission only after its start committed
//!   ([`Waiting::committed`]); the first admission round that begins after
//!   that ends it unless the round admitted the run and took it
//!   ([`Waiting::offered`], [`Waiting::end`]). It never waits for capacity:
//!   a later admission spawns a fresh runner.
//! - A start that did not commit a new run (refused, adopted, failed)
//!   releases its resolver at once ([`Waiting::release`]).
//! - Every waiting resolver that is dropped without being handed a launch has
//!   its process group SIGKILLed; a server that dies closes its stdin, and
//!   the resolver exits on that EOF.
//! - A waiting resolver holds no capacity slot: it becomes a runner only
//!   inside the slot of the admission that takes it.

use crate::process::{self, ProcessIdentity};
use crate::runner_logs::LogName;
use kernel::ids::RunId;
use nix::sys::signal::Signal;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio_util::codec::FramedRead;

/// A resolver's process, as its run's runner takes it over.
#[derive(Debug)]
pub struct ResolverProcess {
    pub child: Child,
    pub stdin: ChildStdin,
    /// Its stdout, after the `resolve.result` frame.
    pub frames: FramedRead<ChildStdout, protocol::FrameCodec>,
    pub identity: ProcessIdentity,
    /// Its log, named by the resolve id until the runner epoch renames it.
    pub log: LogName,
}

/// A resolver that said it awaits its run; SIGKILLed when dropped unless
/// handed over.
#[derive(Debug)]
pub struct WaitingResolver(Option<ResolverProcess>);

impl WaitingResolver {
    pub fn new(process: ResolverProcess) -> Self {
        Self(Some(process))
    }

    /// The process, for the runner that takes it over (no longer killed on drop).
    pub fn hand_over(mut self) -> ResolverProcess {
        self.0
            .take()
            .expect("a waiting resolver is handed over once")
    }
}

impl Drop for WaitingResolver {
    fn drop(&mut self) {
        if let Some(process) = self.0.take() {
            process::signal_group(&process.identity, Signal::SIGKILL);
        }
    }
}

#[derive(Debug)]
struct Entry {
    resolver: WaitingResolver,
    /// Its start committed: the next admission round decides.
    committed: bool,
}

/// The waiting resolvers of this server, by the run id of their start.
#[derive(Debug, Default)]
pub struct Waiting {
    inner: Mutex<HashMap<RunId, Entry>>,
}

impl Waiting {
    /// None waiting.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds the resolver of the start that will create `run_id`, before its job.
    pub fn hold(&self, run_id: RunId, resolver: WaitingResolver) {
        let replaced = self.lock().insert(
            run_id,
            Entry {
                resolver,
                committed: false,
            },
        );
        drop(replaced);
    }

    /// The start of `run_id` committed: the next admission round decides.
    pub fn committed(&self, run_id: &RunId) {
        if let Some(entry) = self.lock().get_mut(run_id) {
            entry.committed = true;
        }
    }

    /// Ends the resolver of a start that did not commit a new run.
    pub fn release(&self, run_id: &RunId) {
        let released = self.lock().remove(run_id);
        drop(released);
    }

    /// The resolver of `run_id`, for the admission that launches the run's
    /// first generation.
    pub fn take(&self, run_id: &RunId) -> Option<WaitingResolver> {
        self.lock().remove(run_id).map(|entry| entry.resolver)
    }

    /// The runs whose resolvers an admission round beginning now decides.
    pub fn offered(&self) -> Vec<RunId> {
        self.lock()
            .iter()
            .filter(|(_, entry)| entry.committed)
            .map(|(run_id, _)| run_id.clone())
            .collect()
    }

    /// Ends the resolvers of `offered` that the round did not take.
    pub fn end(&self, offered: &[RunId]) {
        let ended: Vec<Entry> = {
            let mut inner = self.lock();
            offered
                .iter()
                .filter_map(|run_id| inner.remove(run_id))
                .collect()
        };
        drop(ended);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Entry>> {
        self.inner.lock().expect("waiting resolvers lock")
    }
}
