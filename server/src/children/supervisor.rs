//! Runner supervision: one child process per active run generation.
//!
//! Invariants:
//! - The runner epoch is recorded (by the admission transaction) before the
//!   process is spawned; the process identity (pid + start time) is recorded
//!   right after.
//! - Each runner runs in its own process group. Stopping sends SIGTERM to the
//!   group and SIGKILL after the grace period; a group is only signalled
//!   while its leader is the exact process we spawned.
//! - Every frame from a runner is checked against the run id, generation and
//!   runner epoch of the pipe it came from before its payload is read.
//! - A runner's exit is decided by the kernel from committed facts
//!   (`runner::decide_exit`); registered child groups are reaped after it.

use crate::app::App;
use crate::process::{self, ProcessIdentity};
use crate::runner_api;
use crate::store::Commit;
use kernel::claim::Authority;
use kernel::ids::{Generation, RunId, RunnerEpochId};
use kernel::output::{LaunchCommand, StopReason};
use kernel::runner::{ExitKind, RunnerExit};
use nix::sys::signal::Signal;
use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_util::codec::FramedRead;

/// One supervised runner process.
#[derive(Debug)]
pub struct Runner {
    pub run_id: RunId,
    pub runner_epoch: RunnerEpochId,
    pub generation: Generation,
    /// The host authority the server holds for this runner's claim.
    pub authority: Authority,
    pub command: LaunchCommand,
    outbox: mpsc::UnboundedSender<Vec<u8>>,
    outbox_receiver: Mutex<Option<mpsc::UnboundedReceiver<Vec<u8>>>>,
    identity: Mutex<Option<ProcessIdentity>>,
    stop_reason: Mutex<Option<StopReason>>,
    startup_missed: AtomicBool,
    ready: AtomicBool,
    /// Told that its claim is lost; it must exit.
    fenced: AtomicBool,
    /// The content references sent to this runner (canonical text): the
    /// only content its `content.read` may ask for.
    issued: Mutex<HashSet<String>>,
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
pub struct Supervisor {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Launches being admitted (no authority yet) or committed and about to
    /// spawn (with their run and authority); both count against capacity.
    prepared: HashMap<RunnerEpochId, Option<(RunId, Authority)>>,
    runners: HashMap<RunnerEpochId, Arc<Runner>>,
}

impl Supervisor {
    /// An empty supervisor.
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

    /// Spawns the runner of a committed admission.
    pub fn launch(
        &self,
        app: &Arc<App>,
        run_id: RunId,
        generation: Generation,
        runner_epoch: RunnerEpochId,
        command: LaunchCommand,
    ) {
        let mut inner = self.inner.lock().expect("supervisor lock");
        let Some(Some((_, authority))) = inner.prepared.remove(&runner_epoch) else {
            // Not our admission (cannot happen): nothing to launch.
            return;
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
        drop(inner);
        tokio::spawn(supervise(app.clone(), runner));
    }

    /// Stops a runner's process group for `reason` (SIGTERM, then SIGKILL).
    pub fn stop(
        &self,
        app: &Arc<App>,
        run_id: &RunId,
        runner_epoch: &RunnerEpochId,
        reason: StopReason,
    ) {
        let runner = {
            let inner = self.inner.lock().expect("supervisor lock");
            inner
                .runners
                .get(runner_epoch)
                .filter(|runner| &runner.run_id == run_id)
                .cloned()
        };
        if let Some(runner) = runner {
            stop_runner(app, &runner, reason);
        }
    }

    fn remove(&self, runner_epoch: &RunnerEpochId) {
        self.inner
            .lock()
            .expect("supervisor lock")
            .runners
            .remove(runner_epoch);
    }
}

/// SIGTERM now, SIGKILL after the grace period if the leader is still alive.
pub fn stop_runner(app: &Arc<App>, runner: &Arc<Runner>, reason: StopReason) {
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

async fn supervise(app: Arc<App>, runner: Arc<Runner>) {
    app.faults.hit(crate::fault::FaultPoint::BeforeSpawn);
    let exit = match spawn(&app, &runner).await {
        Ok(child) => run_child(&app, &runner, child).await,
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

async fn spawn(app: &Arc<App>, runner: &Arc<Runner>) -> Result<Child, ()> {
    let run_id = runner.run_id.clone();
    let generation = runner.generation;
    let runner_epoch = runner.runner_epoch.clone();
    let launch = app
        .store
        .read(move |connection| {
            runner_api::launch_envelope(connection, &run_id, generation, &runner_epoch)
        })
        .await
        .ok()
        .flatten()
        .ok_or(())?;
    let (stderr, log) = app
        .runner_logs
        .open(runner.runner_epoch.as_str())
        .map_err(|_| ())?;
    let (program, args) = app.config.runner_command.split_first().ok_or(())?;
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(existing_dir(&launch.project_path, &app.config.home))
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(false);
    let mut child = command.spawn().map_err(|_| ())?;
    // The copy ends when the child (and all that inherited its stderr) closed it.
    drop(command);
    log.start();
    let pid = child.id().ok_or(())?;
    let identity = process::identity(pid).unwrap_or(ProcessIdentity { pid, start_time: 0 });
    *runner.identity.lock().expect("identity lock") = Some(identity.clone());
    record_process(app, runner, &identity).await;
    app.faults.hit(crate::fault::FaultPoint::AfterSpawn);
    let mut stdin = child.stdin.take().ok_or(())?;
    let receiver = runner.outbox_receiver.lock().expect("outbox lock").take();
    let first = launch.frame;
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
    Ok(child)
}

fn existing_dir(project_path: &str, fallback: &std::path::Path) -> std::path::PathBuf {
    let path = std::path::PathBuf::from(project_path);
    if path.is_dir() {
        path
    } else {
        fallback.to_path_buf()
    }
}

async fn record_process(app: &Arc<App>, runner: &Arc<Runner>, identity: &ProcessIdentity) {
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

async fn run_child(app: &Arc<App>, runner: &Arc<Runner>, mut child: Child) -> ExitReport {
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
    if let Some(stdout) = child.stdout.take() {
        let mut frames = FramedRead::new(stdout, protocol::FrameCodec::new());
        while let Some(frame) = frames.next().await {
            // A frame that is not a runner message fails the protocol's
            // schema check: the run is parked `protocolRejected`, the runner
            // stopped, and the channel ends.
            let decoded = frame
                .ok()
                .and_then(|frame| protocol::decode_runner_frame(&frame).ok());
            let Some(message) = decoded else {
                if runner.is_fenced() {
                    protocol_violation(app, runner);
                } else {
                    runner_api::reject_frame(app, runner).await;
                }
                break;
            };
            runner_api::handle(app, runner, message).await;
        }
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

fn protocol_violation(app: &Arc<App>, runner: &Arc<Runner>) {
    if let Some(identity) = runner.identity() {
        process::signal_group(&identity, Signal::SIGKILL);
    }
    let _ = app;
}

async fn finish(app: &Arc<App>, runner: &Arc<Runner>, exit: ExitReport) {
    // No member of the runner's group may outlive it.
    if let Some(identity) = runner.identity()
        && process::group_has_members(identity.pid)
    {
        process::signal_own_group(identity.pid, Signal::SIGKILL);
    }
    runner_api::reap_registered(app, &runner.runner_epoch).await;
    runner_api::record_exit(app, runner, exit.kind, exit.code, exit.signal).await;
    app.runners.remove(&runner.runner_epoch);
    app.scheduler.notify();
}

/// Builds the runner exit the kernel decides on.
pub fn runner_exit(runner: &Runner, kind: ExitKind) -> RunnerExit {
    RunnerExit {
        runner_epoch: runner.runner_epoch.clone(),
        kind,
    }
}
