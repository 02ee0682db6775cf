//! Startup and shutdown, and the wiring of the layers: the only module
//! that names every layer. It opens the state, takes the server epoch,
//! builds the [`Context`] with the [`Ports`] that let lower layers reach
//! higher ones (performing outputs, handling runner frames), and releases
//! the epoch at shutdown.
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

use crate::children::supervisor;
use crate::config::Config;
use crate::context::runners::Runner;
use crate::context::{Context, Handling, Parts, Ports};
use crate::fault::Faults;
use crate::home;
use crate::ids;
use crate::store::{Commit, Store, StoreError};
use crate::wire::runner::Received;
use kernel::claim::{ClaimRequest, OwnerKind};
use kernel::ids::{OwnerId, ServerEpoch};
use kernel::output::Output;
use std::sync::Arc;

/// The package version every client must match.
pub use crate::wire::PACKAGE_VERSION;

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

/// Opens the state and takes the server epoch. The returned lock must be
/// held for the life of the process.
pub async fn open(
    config: Config,
    faults: Faults,
) -> Result<(Arc<Context>, home::ServerLock), StartError> {
    home::prepare(&config).map_err(|_| {
        StartError::Other(
            "cannot create the private state directory; check PI_WORKFLOWS_HOME".into(),
        )
    })?;
    let lock = home::lock(&config).map_err(|error| match error {
        home::LockError::Held => StartError::AlreadyRunning,
        home::LockError::Io(_) => {
            StartError::Other("cannot open the server lock file; check PI_WORKFLOWS_HOME".into())
        }
    })?;
    let store = Store::open(&config.database_path(), faults.clone()).map_err(StartError::State)?;
    let server_owner = OwnerId::new(format!("server-{}", ids::random_hex::<8>()));
    let (epoch, previous_host) =
        take_epoch(&store, &server_owner, config.server_lease_ms, &lock).await?;
    let control = ClaimRequest {
        owner_kind: OwnerKind::Control,
        owner_id: OwnerId::new(format!("control-{}", epoch.0)),
        token_hash: ids::sha256(&ids::random_bytes::<32>()),
    };
    let context = Context::new(Parts {
        config,
        store,
        epoch,
        server_owner,
        control,
        faults,
        ports: PORTS,
        clock: crate::clock::Clock::System,
        previous_host,
    });
    Ok((context, lock))
}

/// The ports the lower layers reach the higher ones through.
const PORTS: Ports = Ports {
    perform,
    runner_message,
    runner_frame_rejected,
};

fn runner_message(context: Arc<Context>, runner: Arc<Runner>, received: Received) -> Handling {
    Box::pin(async move { crate::runner_api::handle(&context, &runner, received).await })
}

fn runner_frame_rejected(context: Arc<Context>, runner: Arc<Runner>) -> Handling {
    Box::pin(async move { crate::runner_api::reject_frame(&context, &runner).await })
}

/// Performs the outputs of a committed transition.
fn perform(context: &Arc<Context>, outputs: Vec<Output>) {
    for output in outputs {
        match output {
            Output::Event { .. } => {}
            Output::SpawnRunner {
                run_id,
                generation,
                runner_epoch,
                command,
            } => {
                supervisor::launch(context, run_id, generation, runner_epoch, command);
            }
            Output::StopRunner {
                run_id,
                runner_epoch,
                reason,
            } => {
                supervisor::stop(context, &run_id, &runner_epoch, reason);
            }
            Output::PublishRun { run_id, revision } => {
                context
                    .presentation
                    .hub
                    .publish_run(&context.presentation, &run_id, revision)
            }
            Output::PublishSession { session_id } => context
                .presentation
                .hub
                .publish_session(&context.presentation, &session_id),
            Output::Wake {
                run_id,
                at_ms,
                reason,
            } => context.timers.wake(run_id, at_ms, reason),
            Output::Schedule => context.scheduler.notify(),
            // The committed `validating` row is the request: the
            // scheduler admits its child.
            Output::SpawnValidator { .. } => context.scheduler.notify(),
            Output::BuildTerminalMessage { run_id } => {
                crate::terminal_messages::spawn(context, run_id);
            }
            Output::RequestRetentionSweep => context.maintenance.request_sweep(),
        }
    }
}

/// Releases the epoch lease so the next server can start at once.
pub async fn release_epoch(context: &Context) {
    let epoch = context.epoch;
    let owner = context.server_owner.clone();
    let _ = context
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

/// Takes the next server epoch; `_lock` is the held global lock that proves
/// every earlier server process exited. Returns it with the host facts the
/// previous server left (recovery reads when it was last alive).
async fn take_epoch(
    store: &Store,
    owner: &OwnerId,
    lease_ms: u64,
    _lock: &home::ServerLock,
) -> Result<(ServerEpoch, kernel::epoch::HostFacts), StartError> {
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
            Ok(Commit::Keep((next.epoch, facts)))
        })
        .await
        .map_err(|error| match error {
            StoreError::Sqlite(_) | StoreError::Closed => {
                StartError::Other(format!("cannot take the server epoch: {error}"))
            }
            other => StartError::State(other),
        })
}
