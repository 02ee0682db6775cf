//! The running server: shared state, startup, the output performer, and
//! shutdown.
//!
//! Invariants:
//! - Startup order: configuration, private directories, the global lock, the
//!   database (refused before any mutation when it is incompatible, damaged,
//!   empty or not a database), the server epoch, recovery, and only then the
//!   socket and the ready line. No command is accepted before the epoch is
//!   taken and the socket is bound.
//! - The epoch is taken at once: holding the global lock proves that every
//!   earlier server process exited (`kernel::epoch::ServerLockHeld`), so a
//!   crashed server's live lease never delays the next one.
//! - Outputs returned by the kernel are performed only after their
//!   transaction committed, in the order the kernel returned them.
//! - `stop` refuses new commands, waits for in-flight commands to store their
//!   receipts, parks live runners at their last durable boundary, releases the
//!   epoch lease and exits.

use crate::children::admission::Scheduler;
use crate::children::supervisor::Supervisor;
use crate::config::Config;
use crate::fault::Faults;
use crate::home;
use crate::ids;
use crate::presentation::hub::Hub;
use crate::runner_logs::RunnerLogs;
use crate::store::{Commit, Store, StoreError};
use crate::time::wakes::Timers;
use kernel::claim::{ClaimRequest, OwnerKind};
use kernel::ids::{OwnerId, ServerEpoch};
use kernel::output::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// The package version every client must match.
pub const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The shared state of one server process.
#[derive(Debug)]
pub struct App {
    pub config: Config,
    pub store: Store,
    pub epoch: ServerEpoch,
    /// This process's identity as the holder of the server epoch.
    pub server_owner: OwnerId,
    /// The control claim this server takes for stale-path operations.
    pub control: ClaimRequest,
    pub faults: Faults,
    pub runners: Supervisor,
    pub scheduler: Scheduler,
    pub timers: Timers,
    pub hub: Hub,
    /// Runner stderr logs in `host/logs/` (bounded and pruned).
    pub runner_logs: RunnerLogs,
    /// Connected clients (keeps the server alive).
    pub clients: AtomicUsize,
    /// Commands between receipt lookup and response (stop waits for them).
    in_flight: AtomicUsize,
    in_flight_done: Notify,
    stopping: AtomicBool,
    /// Notified when the server must stop.
    pub stop_requested: Notify,
    /// Notified after a submission's verdict commits (`submissions` waits on it).
    pub submission_settled: Notify,
    /// The process-local coordinator epochs of origin sessions.
    pub coordinators: crate::client_api::coordinator::Coordinators,
    /// The validation children in flight (`validator`).
    pub validations: crate::children::validator::Validations,
}

/// Why the server could not start.
#[derive(Debug)]
pub enum StartError {
    /// Another live server holds the lock.
    AlreadyRunning,
    /// The state database was refused (incompatible, damaged, empty, not a
    /// database) or cannot be written (a full disk): the store's one line.
    State(StoreError),
    /// Anything else, with a one-line safe description.
    Other(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AlreadyRunning => {
                f.write_str("a pi-workflows server is already running for this state directory; use `pi-workflows server status` or `pi-workflows server stop`")
            }
            Self::State(error @ (StoreError::Sqlite(_) | StoreError::Closed)) => {
                write!(f, "cannot open the state database: {error}")
            }
            Self::State(error @ StoreError::DiskFull { .. }) => write!(
                f,
                "{error}, then start Pi Workflows again (state.sqlite is intact and was not changed)"
            ),
            Self::State(error) => write!(f, "{error}"),
            Self::Other(message) => f.write_str(message),
        }
    }
}

impl App {
    /// Opens the state and takes the server epoch. The returned lock must be
    /// held for the life of the process.
    pub async fn open(
        config: Config,
        faults: Faults,
    ) -> Result<(Arc<Self>, home::ServerLock), StartError> {
        home::prepare(&config).map_err(|_| {
            StartError::Other(
                "cannot create the private state directory; check PI_WORKFLOWS_HOME".into(),
            )
        })?;
        let lock = home::lock(&config).map_err(|error| match error {
            home::LockError::Held => StartError::AlreadyRunning,
            home::LockError::Io(_) => StartError::Other(
                "cannot open the server lock file; check PI_WORKFLOWS_HOME".into(),
            ),
        })?;
        let store =
            Store::open(&config.database_path(), faults.clone()).map_err(StartError::State)?;
        let server_owner = OwnerId::new(format!("server-{}", ids::random_hex::<8>()));
        let epoch = take_epoch(&store, &server_owner, config.server_lease_ms, &lock).await?;
        let control = ClaimRequest {
            owner_kind: OwnerKind::Control,
            owner_id: OwnerId::new(format!("control-{}", epoch.0)),
            token_hash: ids::sha256(&ids::random_bytes::<32>()),
        };
        let app = Arc::new(Self {
            runners: Supervisor::new(),
            scheduler: Scheduler::new(),
            timers: Timers::new(),
            hub: Hub::new(),
            runner_logs: RunnerLogs::new(config.log_dir()),
            config,
            store,
            epoch,
            server_owner,
            control,
            faults,
            clients: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            in_flight_done: Notify::new(),
            stopping: AtomicBool::new(false),
            stop_requested: Notify::new(),
            submission_settled: Notify::new(),
            coordinators: crate::client_api::coordinator::Coordinators::default(),
            validations: crate::children::validator::Validations::default(),
        });
        Ok((app, lock))
    }

    /// Performs the outputs of a committed transition.
    pub fn perform(self: &Arc<Self>, outputs: Vec<Output>) {
        for output in outputs {
            match output {
                Output::Event { .. } => {}
                Output::SpawnRunner {
                    run_id,
                    generation,
                    runner_epoch,
                    command,
                } => {
                    self.runners
                        .launch(self, run_id, generation, runner_epoch, command);
                }
                Output::StopRunner {
                    run_id,
                    runner_epoch,
                    reason,
                } => {
                    self.runners.stop(self, &run_id, &runner_epoch, reason);
                }
                Output::PublishRun { run_id, revision } => {
                    self.hub.publish_run(self, &run_id, revision)
                }
                Output::PublishSession { session_id } => {
                    self.hub.publish_session(self, &session_id)
                }
                Output::Wake {
                    run_id,
                    at_ms,
                    reason,
                } => self.timers.wake(self, run_id, at_ms, reason),
                Output::Schedule => self.scheduler.notify(),
                // The committed `validating` row is the request: the
                // scheduler admits its child.
                Output::SpawnValidator { .. } => self.scheduler.notify(),
                Output::BuildTerminalMessage { .. } | Output::RequestRetentionSweep => {
                    if let Some(name) = unperformed(&output) {
                        crate::log::line(&format!(
                            "the kernel asked for {name}, which this server version does not perform yet"
                        ));
                    }
                }
            }
        }
    }

    /// Whether the server is stopping (new commands are refused).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Marks one command in flight; `None` while stopping.
    pub fn begin_command(self: &Arc<Self>) -> Option<InFlight> {
        if self.is_stopping() {
            return None;
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Some(InFlight { app: self.clone() })
    }

    /// Starts stopping: refuse new commands and wake the main loop.
    pub fn request_stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stop_requested.notify_waiters();
        self.stop_requested.notify_one();
    }

    /// Waits until every in-flight command has stored its receipt.
    pub async fn drain_commands(&self) {
        loop {
            let done = self.in_flight_done.notified();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            done.await;
        }
    }

    /// Releases the epoch lease so the next server can start at once.
    pub async fn release_epoch(&self) {
        let epoch = self.epoch;
        let owner = self.server_owner.clone();
        let _ = self
            .store
            .write(move |connection| {
                let now_ms = crate::clock::now_ms();
                let facts = crate::store::host::load(connection)?;
                match kernel::epoch::release(&facts, epoch, &owner, now_ms) {
                    Ok(next) => {
                        crate::store::host::write(connection, &next, now_ms)?;
                        Ok(Commit::Keep(()))
                    }
                    Err(_) => Ok(Commit::Discard(())),
                }
            })
            .await;
    }
}

/// The transaction path (`shell::apply`) runs its jobs on this server's
/// store and performs their committed outputs here.
impl crate::shell::Shell for Arc<App> {
    fn store(&self) -> &Store {
        &self.store
    }

    fn perform(&self, outputs: Vec<Output>) {
        App::perform(self, outputs);
    }
}

/// The name of a kernel output that nothing performs yet (later issues
/// implement them; `unperformed_outputs_are_listed` pins the list so it
/// only shrinks), or `None` for the outputs [`App::perform`] performs.
pub fn unperformed(output: &Output) -> Option<&'static str> {
    match output {
        Output::BuildTerminalMessage { .. } => Some("BuildTerminalMessage"),
        Output::RequestRetentionSweep => Some("RequestRetentionSweep"),
        Output::Event { .. }
        | Output::SpawnValidator { .. }
        | Output::SpawnRunner { .. }
        | Output::StopRunner { .. }
        | Output::PublishRun { .. }
        | Output::PublishSession { .. }
        | Output::Wake { .. }
        | Output::Schedule => None,
    }
}

/// A command in flight; dropping it lets `stop` proceed.
#[derive(Debug)]
pub struct InFlight {
    app: Arc<App>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.app.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.app.in_flight_done.notify_waiters();
        }
    }
}

/// Takes the next server epoch; `_lock` is the held global lock that proves
/// every earlier server process exited.
async fn take_epoch(
    store: &Store,
    owner: &OwnerId,
    lease_ms: u64,
    _lock: &home::ServerLock,
) -> Result<ServerEpoch, StartError> {
    let owner = owner.clone();
    store
        .write(move |connection| {
            let now_ms = crate::clock::now_ms();
            let facts = crate::store::host::load(connection)?;
            let next = kernel::epoch::take(
                &facts,
                owner,
                now_ms,
                lease_ms,
                kernel::epoch::ServerLockHeld,
            );
            crate::store::host::write(connection, &next, now_ms)?;
            Ok(Commit::Keep(next.epoch))
        })
        .await
        .map_err(|error| match error {
            StoreError::Sqlite(_) | StoreError::Closed => {
                StartError::Other(format!("cannot take the server epoch: {error}"))
            }
            other => StartError::State(other),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel::ids::RunId;

    /// Kernel outputs that nothing performs yet. Each is logged when emitted;
    /// this list only shrinks as later issues implement them.
    #[test]
    fn unperformed_outputs_are_listed() {
        let run_id = RunId::new("r");
        let every_unperformed_kind = [
            Output::BuildTerminalMessage {
                run_id: run_id.clone(),
            },
            Output::RequestRetentionSweep,
            Output::Schedule,
            Output::PublishRun {
                run_id,
                revision: kernel::ids::Revision(1),
            },
        ];
        let names: Vec<&str> = every_unperformed_kind
            .iter()
            .filter_map(unperformed)
            .collect();
        assert_eq!(names, ["BuildTerminalMessage", "RequestRetentionSweep"]);
    }
}
