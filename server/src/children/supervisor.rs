//! Runner supervision: one child process per active run generation.
//!
//! Invariants:
//! - The runner epoch is recorded (by the admission transaction) before the
//!   process is spawned or adopted; the process identity (pid + start time)
//!   is recorded right after.
//! - The launch of a new run's first generation (`LaunchCommand::Start`)
//!   adopts the resolver that waits for it (`context::waiting`) instead of
//!   spawning: the same launch envelope goes to its stdin, its identity is
//!   recorded, its log becomes the runner epoch's, and from then on it is
//!   supervised exactly as a spawned runner (ready deadline from the
//!   launch, frames fenced by the launch's epoch, exit decided by the
//!   kernel). A resolver that died while it waited is replaced by a spawn.
//! - Each runner runs in its own process group. Stopping sends SIGTERM to the
//!   group and SIGKILL after the grace period; a group is only signalled
//!   while its leader is the exact process we spawned.
//! - Every frame from a runner is checked against the run id, generation and
//!   runner epoch of the pipe it came from before its payload is read.
//! - A runner's exit is decided by the kernel from committed facts
//!   (`runner::decide_exit`); registered child groups are reaped after it.
//! - The start-up deadline (`PI_WORKFLOWS_READY_TIMEOUT_MS`) bounds the
//!   runner, not the server: it ends when the `runner.ready` frame arrives,
//!   however long its commit then takes.

use crate::context::Context;
use crate::context::runners::Runner;
use crate::context::waiting::WaitingResolver;
use crate::process::{self, ProcessIdentity};
use crate::store::{Commit, meta, processes};
use kernel::ids::{Generation, RunId, RunnerEpochId};
use kernel::output::{LaunchCommand, StopReason};
use kernel::runner::{ExitKind, RunnerExit};
use nix::sys::signal::Signal;
use protocol::generated::constrained::ProtocolVersion;
use protocol::generated::types::{
    ExecutionMode, LaunchMode, RunnerMessage, WorkerLaunch, WorkerSchemaId,
};
use rusqlite::Connection;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio_stream::StreamExt;
use tokio_util::codec::FramedRead;

/// Spawns the runner of a committed admission.
pub fn launch(
    app: &Arc<Context>,
    run_id: RunId,
    generation: Generation,
    runner_epoch: RunnerEpochId,
    command: LaunchCommand,
) {
    // The resolver of a fresh start waits for this launch (taken now, within
    // the admission round that decides it).
    let resolver = match command {
        LaunchCommand::Start => app.waiting.take(&run_id),
        LaunchCommand::Resume | LaunchCommand::Continue { .. } | LaunchCommand::Restart { .. } => {
            None
        }
    };
    let Some(runner) = app
        .runners
        .register(run_id, generation, runner_epoch, command)
    else {
        // Not our admission (cannot happen): nothing to launch.
        return;
    };
    tokio::spawn(supervise(app.clone(), runner, resolver));
}

/// Stops a runner's process group for `reason` (SIGTERM, then SIGKILL).
pub fn stop(app: &Arc<Context>, run_id: &RunId, runner_epoch: &RunnerEpochId, reason: StopReason) {
    if let Some(runner) = app.runners.runner(run_id, runner_epoch) {
        stop_runner(app, &runner, reason);
    }
}

/// SIGTERM now, SIGKILL after the grace period if the leader is still alive.
pub fn stop_runner(app: &Arc<Context>, runner: &Arc<Runner>, reason: StopReason) {
    {
        let mut stop = runner.stop_reason.lock().expect("stop lock");
        if stop.is_none() {
            *stop = Some(reason);
        }
    }
    let Some(identity) = runner.identity() else {
        return;
    };
    process::signal_group(&identity, Signal::SIGTERM);
    let grace = Duration::from_millis(app.config.stop_grace_ms);
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        if process::is_alive(&identity) {
            process::signal_group(&identity, Signal::SIGKILL);
        }
    });
}

async fn supervise(app: Arc<Context>, runner: Arc<Runner>, resolver: Option<WaitingResolver>) {
    app.faults.hit(crate::fault::FaultPoint::BeforeSpawn);
    let started = match resolver {
        Some(resolver) => adopt(&app, &runner, resolver).await,
        None => spawn(&app, &runner).await,
    };
    let exit = match started {
        Ok((child, frames)) => run_child(&app, &runner, child, frames).await,
        Err(()) => ExitReport {
            kind: ExitKind::Abnormal,
            code: None,
            signal: None,
        },
    };
    finish(&app, &runner, exit).await;
}

/// How the process ended, as the kernel and the `run_workers` row see it.
#[derive(Debug)]
struct ExitReport {
    kind: ExitKind,
    code: Option<i32>,
    signal: Option<i32>,
}

/// A runner's stdout, read as frames.
type Frames = FramedRead<ChildStdout, protocol::FrameCodec>;

/// The run-mode launch envelope of `runner`, from committed facts.
async fn read_launch(app: &Arc<Context>, runner: &Runner) -> Result<LaunchFrame, ()> {
    let run_id = runner.run_id.clone();
    let generation = runner.generation;
    let runner_epoch = runner.runner_epoch.clone();
    app.store
        .read(move |connection| launch_envelope(connection, &run_id, generation, &runner_epoch))
        .await
        .ok()
        .flatten()
        .ok_or(())
}

/// Takes over the resolver that waits for this run: its identity, its log,
/// then the launch on its stdin, as a spawned runner gets them.
async fn adopt(
    app: &Arc<Context>,
    runner: &Arc<Runner>,
    resolver: WaitingResolver,
) -> Result<(Child, Frames), ()> {
    let mut process = resolver.hand_over();
    // From here every failure ends its group (`finish`).
    *runner.identity.lock().expect("identity lock") = Some(process.identity.clone());
    if !matches!(process.child.try_wait(), Ok(None)) {
        crate::log::line("a resolver ended while it waited for its run; starting a fresh runner");
        return spawn(app, runner).await;
    }
    let launch = read_launch(app, runner).await?;
    if process.log.rename(runner.runner_epoch.as_str()).is_err() {
        crate::log::line("cannot rename a resolver's log to its runner epoch");
    }
    record_process(app, runner, &process.identity).await;
    app.faults.hit(crate::fault::FaultPoint::AfterSpawn);
    feed(runner, process.stdin, launch.frame);
    Ok((process.child, process.frames))
}

async fn spawn(app: &Arc<Context>, runner: &Arc<Runner>) -> Result<(Child, Frames), ()> {
    let launch = read_launch(app, runner).await?;
    let (stderr, log) = app
        .runner_logs
        .open(runner.runner_epoch.as_str())
        .map_err(|_| ())?;
    let (program, args) = app.config.runner_command.split_first().ok_or(())?;
    let mut command = super::child_command(
        program,
        args,
        std::path::Path::new(&launch.project_path),
        &app.config.home,
        stderr,
    );
    command.kill_on_drop(false);
    let mut child = command.spawn().map_err(|_| ())?;
    // The copy ends when the child (and all that inherited its stderr) closed it.
    drop(command);
    log.start();
    let pid = child.id().ok_or(())?;
    let identity = process::identity(pid).unwrap_or(ProcessIdentity { pid, start_time: 0 });
    *runner.identity.lock().expect("identity lock") = Some(identity.clone());
    record_process(app, runner, &identity).await;
    app.faults.hit(crate::fault::FaultPoint::AfterSpawn);
    let stdin = child.stdin.take().ok_or(())?;
    let stdout = child.stdout.take().ok_or(())?;
    feed(runner, stdin, launch.frame);
    Ok((child, FramedRead::new(stdout, protocol::FrameCodec::new())))
}

/// Writes the launch envelope, then every frame of the runner's outbox, to its stdin.
fn feed(runner: &Runner, mut stdin: ChildStdin, first: Vec<u8>) {
    let receiver = runner.outbox_receiver.lock().expect("outbox lock").take();
    tokio::spawn(async move {
        if stdin.write_all(&first).await.is_err() {
            return;
        }
        let _ = stdin.flush().await;
        let Some(mut receiver) = receiver else { return };
        while let Some(frame) = receiver.recv().await {
            if stdin.write_all(&frame).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
}

async fn record_process(app: &Arc<Context>, runner: &Arc<Runner>, identity: &ProcessIdentity) {
    let runner_epoch = runner.runner_epoch.clone();
    let encoded = identity.encode();
    let pid = identity.pid;
    let _ = app
        .store
        .write(move |connection| {
            crate::store::processes::record_runner_process(
                connection,
                &runner_epoch,
                pid,
                &encoded,
            )?;
            Ok(Commit::Keep(()))
        })
        .await;
}

async fn run_child(
    app: &Arc<Context>,
    runner: &Arc<Runner>,
    mut child: Child,
    mut frames: Frames,
) -> ExitReport {
    let deadline = Duration::from_millis(app.config.runner_ready_timeout_ms);
    let watchdog = {
        let app = app.clone();
        let runner = runner.clone();
        tokio::spawn(async move {
            tokio::time::sleep(deadline).await;
            if !runner.ready.load(Ordering::SeqCst) {
                runner.startup_missed.store(true, Ordering::SeqCst);
                if let Some(identity) = runner.identity() {
                    process::signal_group(&identity, Signal::SIGKILL);
                }
                let _ = app;
            }
        })
    };
    while let Some(frame) = frames.next().await {
        // A frame that is not a runner message fails the protocol's
        // schema check: the run is parked `protocolRejected`, the runner
        // stopped, and the channel ends.
        let decoded = frame
            .ok()
            .and_then(|frame| crate::wire::runner::receive(&frame).ok());
        let Some(received) = decoded else {
            if runner.is_fenced() {
                protocol_violation(app, runner);
            } else {
                (app.ports.runner_frame_rejected)(app.clone(), runner.clone()).await;
            }
            break;
        };
        // The start-up deadline ends when `runner.ready` arrives: its
        // commit may be held up (a disk stall) past the deadline.
        if matches!(received.message, RunnerMessage::RunnerReady { .. }) {
            runner.mark_ready();
        }
        (app.ports.runner_message)(app.clone(), runner.clone(), received).await;
    }
    let status = child.wait().await.ok();
    watchdog.abort();
    use std::os::unix::process::ExitStatusExt;
    let code = status.and_then(|status| status.code());
    let signal = status.and_then(|status| status.signal());
    let stopped = *runner.stop_reason.lock().expect("stop lock");
    let kind = if runner.startup_missed.load(Ordering::SeqCst) {
        ExitKind::StartupDeadlineMissed
    } else if let Some(reason) = stopped {
        ExitKind::Stopped { reason }
    } else if code == Some(0) {
        ExitKind::Clean
    } else {
        ExitKind::Abnormal
    };
    ExitReport { kind, code, signal }
}

fn protocol_violation(app: &Arc<Context>, runner: &Arc<Runner>) {
    if let Some(identity) = runner.identity() {
        process::signal_group(&identity, Signal::SIGKILL);
    }
    let _ = app;
}

async fn finish(app: &Arc<Context>, runner: &Arc<Runner>, exit: ExitReport) {
    // No member of the runner's group may outlive it.
    if let Some(identity) = runner.identity()
        && process::group_has_members(identity.pid)
    {
        process::signal_own_group(identity.pid, Signal::SIGKILL);
    }
    reap_registered(app, &runner.runner_epoch).await;
    record_exit(app, runner, exit.kind, exit.code, exit.signal).await;
    app.runners.remove(&runner.runner_epoch);
    app.scheduler.notify();
    // A runner exit is an idle lifecycle trigger of the retention sweep.
    app.maintenance.request_sweep();
}

/// Builds the runner exit the kernel decides on.
pub fn runner_exit(runner: &Runner, kind: ExitKind) -> RunnerExit {
    RunnerExit {
        runner_epoch: runner.runner_epoch.clone(),
        kind,
    }
}

/// The launch frame of a runner and the directory it runs in.
#[derive(Debug)]
pub struct LaunchFrame {
    pub frame: Vec<u8>,
    pub project_path: String,
}

/// Builds the run-mode launch envelope from committed facts.
pub fn launch_envelope(
    connection: &Connection,
    run_id: &RunId,
    generation: Generation,
    runner_epoch: &RunnerEpochId,
) -> rusqlite::Result<Option<LaunchFrame>> {
    let Some(meta) = meta::load(connection, run_id)? else {
        return Ok(None);
    };
    let interactive = crate::store::runs::load(connection, run_id)?
        .is_some_and(|agg| agg.run.mode.origin_session().is_some());
    let launch = || {
        Some(WorkerLaunch {
            agent_model: meta
                .agent_model_json
                .as_deref()
                .and_then(|text| serde_json::from_str(text).ok()),
            definition_digest: Some(meta.definition_digest.parse().ok()?),
            execution_mode: Some(if interactive {
                ExecutionMode::Interactive
            } else {
                ExecutionMode::Headless
            }),
            generation: protocol::generated::constrained::Generation::new(generation.0)?,
            input_hash: Some(meta.input_hash.parse().ok()?),
            mode: LaunchMode::Run,
            project_path: meta.project_path.parse().ok()?,
            protocol_version: ProtocolVersion::new(1)?,
            resolve: None,
            run_id: run_id.as_str().parse().ok()?,
            runner_epoch: runner_epoch.as_str().parse().ok()?,
            schema: WorkerSchemaId::PiWorkflowsWorkerLaunchV1,
            validate: None,
            workflow_source: Some(serde_json::from_str(&meta.source_json).ok()?),
        })
    };
    Ok(launch()
        .as_ref()
        .and_then(crate::wire::frames::launch)
        .map(|frame| LaunchFrame {
            frame,
            project_path: meta.project_path,
        }))
}

/// Kills the process groups a runner registered and forgets them.
pub async fn reap_registered(app: &Arc<Context>, runner_epoch: &RunnerEpochId) {
    let runner_epoch = runner_epoch.clone();
    let rows = app
        .store
        .write(move |connection| {
            Ok(Commit::Keep(processes::take_registered(
                connection,
                &runner_epoch,
            )?))
        })
        .await
        .unwrap_or_default();
    for identity in rows.iter().filter_map(|text| ProcessIdentity::decode(text)) {
        kill_exact(&identity);
    }
}

/// SIGKILL to the exact process (its group when it leads one) and every
/// descendant of that group, also those in groups of their own (the tools a
/// headless Pi runs detached).
pub fn kill_exact(identity: &ProcessIdentity) {
    let descendants = if process::is_alive(identity) {
        process::group_descendants(identity.pid)
    } else {
        Vec::new()
    };
    process::kill_identity(identity);
    for descendant in &descendants {
        process::kill_identity(descendant);
    }
}

/// Records a runner's exit and lets the kernel decide what happens to the run.
pub async fn record_exit(
    app: &Arc<Context>,
    runner: &Arc<Runner>,
    kind: ExitKind,
    code: Option<i32>,
    signal: Option<i32>,
) {
    let control = app.control.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    let runner_for_job = runner.clone();
    crate::shell::apply(
        app,
        runner.run_id.clone(),
        move |connection, before, now_ms| {
            processes::record_exit_status(connection, &runner_for_job.runner_epoch, code, signal)?;
            let authority = (!runner_for_job.is_fenced()).then_some(&runner_for_job.authority);
            let exit = runner_exit(&runner_for_job, kind);
            Ok(kernel::runner::on_exit(
                before, exit, authority, control, now_ms, ttl_ms,
            ))
        },
    )
    .await;
}
