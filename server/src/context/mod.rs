//! The server context every layer above it takes: configuration, the
//! store, the server epoch and control claim, fault injection, the
//! process's lifecycle (connected clients, commands in flight, stopping)
//! and the in-memory registries (runners, wakes, admission signal,
//! coordinator epochs, validations in flight, resolvers waiting for their
//! run, state maintenance).
//!
//! Invariants:
//! - It holds state, not behaviour: nothing here reaches a layer above it.
//!   What the layers below ask of the layers above goes through [`Ports`],
//!   plain function pointers that `app.rs` installs at startup (perform a
//!   committed transition's outputs; handle one runner frame). So the import
//!   graph stays a DAG while the running server stays one object.
//! - The registries are process-local: nothing durable lives here, and a
//!   write job never reads or changes them (it gets what it needs as a fact
//!   loaded before the job, and the registry is updated after the commit).

pub mod admission;
pub mod channels;
pub mod coordinators;
pub mod maintenance;
pub mod reconciles;
pub mod runners;
pub mod validations;
pub mod waiting;
pub mod wakes;

use crate::config::Config;
use crate::fault::Faults;
use crate::presentation::Presentation;
use crate::runner_logs::RunnerLogs;
use crate::store::Store;
use crate::wire::runner::Received;
use kernel::claim::ClaimRequest;
use kernel::ids::{OwnerId, ServerEpoch};
use kernel::output::Output;
use runners::Runner;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// A runner-frame handler's work, spawned on the runner's reader task.
pub type Handling = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the layers below ask of the layers above, installed by `app.rs`.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    /// Performs the outputs of a committed transition, in order.
    pub perform: fn(&Arc<Context>, Vec<Output>),
    /// Handles one received runner message, decoded and checked once
    /// (`runner_api`).
    pub runner_message: fn(Arc<Context>, Arc<Runner>, Received) -> Handling,
    /// Answers a runner frame that is not a runner message (`runner_api`).
    pub runner_frame_rejected: fn(Arc<Context>, Arc<Runner>) -> Handling,
}

/// The shared state of one server process.
#[derive(Debug)]
pub struct Context {
    pub config: Config,
    pub store: Store,
    pub epoch: ServerEpoch,
    /// This process's identity as the holder of the server epoch.
    pub server_owner: OwnerId,
    /// The control claim this server takes for stale-path operations.
    pub control: ClaimRequest,
    pub faults: Faults,
    pub ports: Ports,
    /// Where every handler reads its transaction time (the system clock;
    /// the simulation's own clock in `crate::simulation`).
    pub clock: crate::clock::Clock,
    /// The host facts the previous server left (taken before this epoch):
    /// startup recovery stops work that counts only while a server runs at
    /// the previous server's last sign of life (`kernel::epoch::last_alive_ms`).
    pub previous_host: kernel::epoch::HostFacts,
    pub runners: runners::Runners,
    pub scheduler: admission::Scheduler,
    pub timers: wakes::Wakes,
    /// Subscriptions and reads (their narrow context).
    pub presentation: Arc<Presentation>,
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
    pub coordinators: coordinators::Coordinators,
    /// The validation children in flight (`children::validator`).
    pub validations: validations::Validations,
    /// Resolvers of fresh starts waiting for their run's launch.
    pub waiting: waiting::Waiting,
    /// State maintenance: the running backup or prune, verifications, and
    /// retention sweep requests.
    pub maintenance: Arc<maintenance::Maintenance>,
    /// The channel adapters' states, the reload signal and adapter epochs.
    pub channels: channels::Channels,
    /// The reconcile passes in flight (`children::controller`).
    pub reconciles: reconciles::Reconciles,
}

/// What a server context is made of (`app.rs` opens them).
#[derive(Debug)]
pub struct Parts {
    pub config: Config,
    pub store: Store,
    pub epoch: ServerEpoch,
    pub server_owner: OwnerId,
    pub control: ClaimRequest,
    pub faults: Faults,
    pub ports: Ports,
    pub clock: crate::clock::Clock,
    pub previous_host: kernel::epoch::HostFacts,
}

impl Context {
    /// A context with empty registries.
    pub fn new(parts: Parts) -> Arc<Self> {
        let Parts {
            config,
            store,
            epoch,
            server_owner,
            control,
            faults,
            ports,
            clock,
            previous_host,
        } = parts;
        Arc::new(Self {
            runners: runners::Runners::new(),
            scheduler: admission::Scheduler::new(),
            timers: wakes::Wakes::new(),
            presentation: Arc::new(Presentation {
                store: store.clone(),
                hub: crate::presentation::hub::Hub::new(),
            }),
            runner_logs: RunnerLogs::new(config.log_dir()),
            config,
            store,
            epoch,
            server_owner,
            control,
            faults,
            ports,
            clock,
            previous_host,
            clients: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            in_flight_done: Notify::new(),
            stopping: AtomicBool::new(false),
            stop_requested: Notify::new(),
            submission_settled: Notify::new(),
            coordinators: coordinators::Coordinators::default(),
            validations: validations::Validations::default(),
            waiting: waiting::Waiting::new(),
            maintenance: maintenance::Maintenance::new(),
            channels: channels::Channels::default(),
            reconciles: reconciles::Reconciles::default(),
        })
    }

    /// Performs the outputs of a committed transition (through [`Ports`]).
    pub fn perform(self: &Arc<Self>, outputs: Vec<Output>) {
        (self.ports.perform)(self, outputs);
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
        Some(InFlight {
            context: self.clone(),
        })
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
}

/// The transaction path (`shell::apply`) runs its jobs on this server's
/// store and performs their committed outputs through [`Ports`].
impl crate::shell::Shell for Arc<Context> {
    fn store(&self) -> &Store {
        &self.store
    }

    fn clock(&self) -> crate::clock::Clock {
        self.clock.clone()
    }

    fn perform(&self, outputs: Vec<Output>) {
        Context::perform(self, outputs);
    }
}

/// A command in flight; dropping it lets `stop` proceed.
#[derive(Debug)]
pub struct InFlight {
    context: Arc<Context>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.context.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.context.in_flight_done.notify_waiters();
        }
    }
}
