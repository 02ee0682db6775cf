//! The simulated world of one seed: the server (a real `Context` over a
//! real SQLite file, with a simulated clock and performer), its runner
//! actors and one client, every choice drawn from one PRNG. See the module
//! comment of `simulation` for what is real and what is simulated.
//!
//! Invariants checked after every step (a violation ends the seed with a
//! `Failure`):
//! - the store's consistency checks (`store::consistency::CHECKS`) hold;
//! - claims are fenced: a fresh runner message whose runner does not hold
//!   the run's live claim (generation, token, expiry, as loaded before the
//!   message) changes nothing of the run and is never answered `accepted`;
//! - runner-message receipts: an exact retry of an answered message is
//!   answered with the same reply;
//! - never twice: no managed effect is applied a second time by a runner
//!   (the operator retries only an effect the apply log shows unapplied);
//! - command receipts: a retry of a command under its request id or its
//!   idempotency key adopts the first durable response (same outcome, or
//!   `adopted` for `accepted`, same revision, same receipt), also across
//!   crashes; a command whose response was lost to a crash is retried;
//! - no lost answer: an accepted `checkpoint.answer` leaves its run
//!   continued by the run its receipt names, after every crash;
//! - at the end, once every actor cooperates and the client answers, resumes
//!   and recovers: every run is terminal.

use crate::children::supervisor;
use crate::clock::Clock;
use crate::config::Config;
use crate::context::runners::Runner;
use crate::context::{Context, Handling, Parts, Ports};
use crate::fault::Faults;
use crate::presentation::hub::Subscriptions;
use crate::store::blobs::{self, Blob};
use crate::store::{Commit, Store, consistency, meta, runs};
use crate::wire::client::{Outbox, Outgoing};
use crate::wire::runner::Received;
use kernel::claim::{ClaimRequest, OwnerKind};
use kernel::effect::EffectState;
use kernel::ids::{OwnerId, RunId};
use kernel::output::{LaunchCommand, Output, StopReason};
use kernel::run::{ExecutionMode, Lineage, NewRun, RunAggregate, RunStatus};
use kernel::runner::ExitKind;
use protocol::generated::types::{
    ClientMessage, EffectAdoption, EffectReservation, ReplyNext, ReplyOutcome, ServerMessage,
};
use serde_json::{Value, json};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The claim lifetime of the simulated server.
const TTL_MS: u64 = 10_000;
/// The first instant of every seed (2026-01-01).
const EPOCH_MS: u64 = 1_767_225_600_000;
/// Settling steps at the end before a run counts as stuck.
const SETTLE_ROUNDS: usize = 400;
const MAX_RUNS: usize = 8;

/// A seed of the seed sequence: `first` mixed with `index` (SplitMix64).
pub(super) fn mix(first: u64, index: u64) -> u64 {
    let mut state = first ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    splitmix(&mut state)
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The one source of every choice of a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        splitmix(&mut self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// What to run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    steps: usize,
}

impl Plan {
    pub(super) fn new(steps: usize) -> Self {
        Self { steps }
    }
}

/// A seed that held every invariant.
#[derive(Debug, Default)]
pub(super) struct Report {
    pub trace: Vec<String>,
    pub digest: String,
    counts: Counts,
}

#[derive(Clone, Debug, Default)]
struct Counts {
    steps: u64,
    crashes: u64,
    reply_lost_crashes: u64,
    runs: u64,
    runner_messages: u64,
    stale_refused: u64,
    commands: u64,
    adopted_retries: u64,
    effects_applied: u64,
    ambiguous_recovered: u64,
    runner_crashes: u64,
    expiries: u64,
    completed: u64,
    failed_or_cancelled: u64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} digest {}", self.counts, &self.digest[..16])
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} steps, {} runs ({} completed, {} failed/timed out/cancelled), {} server crashes ({} between a commit and its reply), {} runner crashes, {} claim expiries recovered, {} runner messages ({} stale refused), {} commands ({} retries adopted), {} effects applied, {} ambiguous recovered",
            self.steps,
            self.runs,
            self.completed,
            self.failed_or_cancelled,
            self.crashes,
            self.reply_lost_crashes,
            self.runner_crashes,
            self.expiries,
            self.runner_messages,
            self.stale_refused,
            self.commands,
            self.adopted_retries,
            self.effects_applied,
            self.ambiguous_recovered
        )
    }
}

/// The sum over many seeds.
#[derive(Debug, Default)]
pub(super) struct Totals {
    seeds: u64,
    counts: Counts,
}

impl Totals {
    pub(super) fn add(&mut self, report: &Report) {
        self.seeds += 1;
        let (t, c) = (&mut self.counts, &report.counts);
        t.steps += c.steps;
        t.crashes += c.crashes;
        t.reply_lost_crashes += c.reply_lost_crashes;
        t.runs += c.runs;
        t.runner_messages += c.runner_messages;
        t.stale_refused += c.stale_refused;
        t.commands += c.commands;
        t.adopted_retries += c.adopted_retries;
        t.effects_applied += c.effects_applied;
        t.ambiguous_recovered += c.ambiguous_recovered;
        t.runner_crashes += c.runner_crashes;
        t.expiries += c.expiries;
        t.completed += c.completed;
        t.failed_or_cancelled += c.failed_or_cancelled;
    }
}

impl fmt::Display for Totals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} seeds; {}", self.seeds, self.counts)
    }
}

/// A seed that broke an invariant.
#[derive(Debug)]
pub(super) struct Failure {
    pub step: usize,
    pub message: String,
    pub tail: Vec<String>,
}

type Checked<T = ()> = Result<T, String>;

/// Runs one seed.
pub(super) fn run(seed: u64, plan: Plan) -> Result<Report, Failure> {
    let mut world = World::new(seed, plan);
    let result = world.play();
    let tail_from = world.trace.len().saturating_sub(40);
    match result {
        Ok(()) => {
            let digest = hex::encode(crate::ids::sha256(world.trace.join("\n").as_bytes()).0);
            world.counts.steps = world.step as u64;
            world.counts.runs = world.runs.len() as u64;
            Ok(Report {
                trace: std::mem::take(&mut world.trace),
                digest,
                counts: world.counts.clone(),
            })
        }
        Err(message) => Err(Failure {
            step: world.step,
            message,
            tail: world.trace[tail_from..].to_vec(),
        }),
    }
}

// ---------------------------------------------------------------------------
// The performer: what the context's `Ports::perform` does here.

thread_local! {
    /// Outputs the handlers performed, in order, until the world takes them.
    static PERFORMED: RefCell<Vec<Output>> = const { RefCell::new(Vec::new()) };
}

fn perform(_: &Arc<Context>, outputs: Vec<Output>) {
    PERFORMED.with(|performed| performed.borrow_mut().extend(outputs));
}

fn runner_message(context: Arc<Context>, runner: Arc<Runner>, received: Received) -> Handling {
    Box::pin(async move { crate::runner_api::handle(&context, &runner, received).await })
}

fn runner_frame_rejected(context: Arc<Context>, runner: Arc<Runner>) -> Handling {
    Box::pin(async move { crate::runner_api::reject_frame(&context, &runner).await })
}

const PORTS: Ports = Ports {
    perform,
    runner_message,
    runner_frame_rejected,
};

// ---------------------------------------------------------------------------
// The world.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `a → b → c`; `b` applies a managed effect.
    Chain,
    /// `draft → review (checkpoint) → publish`; `publish` applies an effect.
    Checkpoint,
}

struct SimRun {
    run_id: RunId,
    name: String,
}

/// One server process: its context and the client's connection.
struct Server {
    context: Arc<Context>,
    outbox: Outbox,
    frames: Arc<Mutex<Vec<Vec<u8>>>>,
    subscriptions: Subscriptions,
}

#[derive(Debug)]
enum Work {
    /// Waits for its command after `runner.ready`.
    Launched,
    Running {
        attempt: String,
        node: String,
        started: bool,
        effect: EffectWork,
    },
    /// Told to exit (or gave up): its process ends at its next turn.
    Exiting { clean: bool },
}

#[derive(Debug, Clone)]
enum EffectWork {
    None,
    Reserved {
        effect_id: String,
        attempt_number: u64,
        applied: bool,
    },
    Settled,
}

/// A simulated runner process.
struct Actor {
    name: String,
    run: usize,
    runner: Arc<Runner>,
    replies: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    counter: u64,
    work: Work,
    /// Stopped (as by SIGSTOP): sends nothing until continued.
    silent: bool,
    /// The last message sent and the reply it got.
    last: Option<(Vec<u8>, Option<Vec<u8>>)>,
    /// Told to stop (SIGTERM): each turn it exits, or writes once more.
    stopping: bool,
}

/// A command the client sent.
#[derive(Clone, Debug)]
struct Sent {
    name: String,
    run: usize,
    operation: &'static str,
    request_id: String,
    key: String,
    payload: Value,
    expected_revision: Option<u64>,
    /// The first durable response (outcome, revision, receipt, error code).
    durable: Option<Response>,
    /// Its response was lost to a crash: retry it.
    lost: bool,
}

#[derive(Clone, Debug, PartialEq)]
struct Response {
    outcome: String,
    revision: Option<u64>,
    receipt: Option<Value>,
    error: Option<String>,
}

impl Response {
    fn durable(&self) -> bool {
        matches!(
            self.outcome.as_str(),
            "accepted" | "adopted" | "rejected" | "notFound"
        )
    }
}

struct World {
    seed: u64,
    rng: Rng,
    plan: Plan,
    _dir: tempfile::TempDir,
    home: std::path::PathBuf,
    now: Arc<AtomicU64>,
    runtime: tokio::runtime::Runtime,
    server: Option<Server>,
    boots: u64,
    runs: Vec<SimRun>,
    actors: Vec<Actor>,
    actor_count: u64,
    sent: Vec<Sent>,
    /// The external apply log: effect id → the attempt numbers applied.
    applied: BTreeMap<String, Vec<u64>>,
    /// Runs whose checkpoint answer was accepted → the continuation named.
    answered: BTreeMap<usize, String>,
    trace: Vec<String>,
    step: usize,
    counts: Counts,
}

impl World {
    fn new(seed: u64, plan: Plan) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("pi-workflows-sim-")
            .tempdir_in(
                std::env::var_os("PI_WORKFLOWS_SIM_DIR").unwrap_or_else(|| "/dev/shm".into()),
            )
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory");
        let home = dir.path().join("home");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime");
        PERFORMED.with(|performed| performed.borrow_mut().clear());
        Self {
            seed,
            rng: Rng(seed),
            plan,
            _dir: dir,
            home,
            now: Arc::new(AtomicU64::new(EPOCH_MS)),
            runtime,
            server: None,
            boots: 0,
            runs: Vec::new(),
            actors: Vec::new(),
            actor_count: 0,
            sent: Vec::new(),
            applied: BTreeMap::new(),
            answered: BTreeMap::new(),
            trace: Vec::new(),
            step: 0,
            counts: Counts::default(),
        }
    }

    fn log(&mut self, line: String) {
        let at = self.now.load(Ordering::SeqCst) - EPOCH_MS;
        self.trace.push(format!("{:>4} +{at:>7} {line}", self.step));
    }

    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn advance(&mut self, ms: u64) {
        self.now.fetch_add(ms.max(1), Ordering::SeqCst);
    }

    fn context(&self) -> Arc<Context> {
        self.server.as_ref().expect("a server").context.clone()
    }

    fn play(&mut self) -> Checked {
        self.boot()?;
        let first_runs = 2 + self.rng.below(3);
        for _ in 0..first_runs {
            self.start_run()?;
        }
        while self.step < self.plan.steps {
            self.step += 1;
            self.advance(1);
            self.act()?;
            self.after_step()?;
        }
        self.settle()?;
        // One more crash: every receipt and answer must survive it.
        self.crash("final")?;
        self.boot()?;
        self.after_step()?;
        self.check_receipts_at_end()?;
        self.check_answers()?;
        for index in 0..self.runs.len() {
            match self.load(index)? {
                Some(agg) if agg.run.status == RunStatus::Completed => self.counts.completed += 1,
                Some(agg) if agg.run.status.is_terminal() => {
                    self.counts.failed_or_cancelled += 1;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// One drawn step.
    fn act(&mut self) -> Checked {
        let roll = self.rng.below(100);
        match roll {
            0..=39 => self.actor_turn(false),
            40..=49 => {
                let ms = 1 + self.rng.below(2_000);
                self.tick(ms)
            }
            50..=51 => {
                let ms = TTL_MS + self.rng.below(2 * TTL_MS);
                self.tick(ms)
            }
            52..=58 => self.admit(),
            59..=66 => self.client_command(false),
            67 => self.client_command(true),
            68..=70 => self.client_retry(),
            71..=74 => self.actor_retry(),
            75..=77 => self.toggle_silence(),
            78 => self.actor_crash(),
            79 => {
                self.crash("crash")?;
                self.boot()
            }
            80..=81 => self.actor_turn(true),
            82..=83 => self.start_run(),
            _ => {
                let ms = 1 + self.rng.below(300);
                self.tick(ms)
            }
        }
    }

    /// After every step: perform outputs, fire due wakes, check.
    fn after_step(&mut self) -> Checked {
        self.take_outputs()?;
        self.fire_wakes()?;
        self.check_consistency()?;
        self.check_answers()
    }

    // -- the server --------------------------------------------------------

    fn boot(&mut self) -> Checked {
        self.boots += 1;
        let home = self.home.to_string_lossy().into_owned();
        let config = Config::from_lookup(|name| match name {
            "PI_WORKFLOWS_HOME" | "HOME" => Some(home.clone()),
            "PI_WORKFLOWS_CLAIM_TTL_MS" => Some(TTL_MS.to_string()),
            "PI_WORKFLOWS_MAX_WORKERS" => Some("3".into()),
            "PI_WORKFLOWS_RUNNER" => Some("/nonexistent/simulated-runner".into()),
            _ => None,
        })
        .map_err(|error| format!("config: {}", error.0))?;
        crate::home::prepare(&config).map_err(|error| format!("home: {error}"))?;
        let store = Store::open(&config.database_path(), Faults::default())
            .map_err(|error| format!("open: {error}"))?;
        let owner = OwnerId::new(format!("server-sim-{}", self.boots));
        let lease_ms = config.server_lease_ms;
        let clock = Clock::Simulated(self.now.clone());
        let job_clock = clock.clone();
        let job_owner = owner.clone();
        let (epoch, previous_host) = self
            .runtime
            .block_on(store.write(move |connection| {
                let now_ms = job_clock.now_ms();
                let facts = crate::store::host::load(connection)?;
                let next = kernel::epoch::take(
                    &facts,
                    job_owner,
                    now_ms,
                    lease_ms,
                    kernel::epoch::ServerLockHeld,
                );
                crate::store::host::write(connection, &next, now_ms)?;
                Ok(Commit::Keep((next.epoch, facts)))
            }))
            .map_err(|error| format!("epoch: {error}"))?;
        let control = ClaimRequest {
            owner_kind: OwnerKind::Control,
            owner_id: OwnerId::new(format!("control-{}", epoch.0)),
            token_hash: crate::ids::sha256(format!("{}-{}", self.seed, self.boots).as_bytes()),
        };
        let context = Context::new(Parts {
            config,
            store,
            epoch,
            server_owner: owner,
            control,
            faults: Faults::default(),
            ports: PORTS,
            clock,
            previous_host,
        });
        let (sender, mut receiver) = tokio::sync::mpsc::channel::<Outgoing>(64);
        let frames = Arc::new(Mutex::new(Vec::new()));
        let sink = frames.clone();
        let _enter = self.runtime.enter();
        tokio::spawn(async move {
            while let Some(outgoing) = receiver.recv().await {
                sink.lock().expect("frames").push(outgoing.frame);
                if let Some(written) = outgoing.written {
                    let _ = written.send(());
                }
            }
        });
        drop(_enter);
        let outbox = Outbox {
            sender,
            connection: kernel::ids::ConnectionId::new(format!("sim-{}", self.boots)),
        };
        self.server = Some(Server {
            context: context.clone(),
            outbox,
            frames,
            subscriptions: Subscriptions::default(),
        });
        self.log(format!("boot {}", self.boots));
        self.runtime
            .block_on(crate::time::recovery::startup(&context))
            .map_err(|error| format!("recovery: {error}"))?;
        self.take_outputs()
    }

    /// The server process dies: its context, its store, every queued reply
    /// and unperformed output go; its runners lose their pipes and exit.
    fn crash(&mut self, why: &str) -> Checked {
        self.counts.crashes += 1;
        PERFORMED.with(|performed| performed.borrow_mut().clear());
        self.actors.clear();
        for sent in &mut self.sent {
            if sent.durable.is_none() {
                sent.lost = true;
            }
        }
        if let Some(server) = self.server.take() {
            let Server { context, .. } = server;
            drop(context);
        }
        self.log(format!("{why}: server killed"));
        Ok(())
    }

    /// Performs the outputs the handlers queued.
    fn take_outputs(&mut self) -> Checked {
        loop {
            let outputs = PERFORMED.with(|performed| std::mem::take(&mut *performed.borrow_mut()));
            if outputs.is_empty() {
                return Ok(());
            }
            let context = self.context();
            for output in outputs {
                match output {
                    Output::SpawnRunner {
                        run_id,
                        generation,
                        runner_epoch,
                        command,
                    } => {
                        let Some(runner) = context.runners.register(
                            run_id.clone(),
                            generation,
                            runner_epoch,
                            command.clone(),
                        ) else {
                            return Err("a launch of an admission this server did not make".into());
                        };
                        let replies = runner
                            .outbox_receiver
                            .lock()
                            .expect("outbox")
                            .take()
                            .ok_or("a runner without its pipe")?;
                        let run = self.run_index(&run_id);
                        self.actor_count += 1;
                        let name = format!("w{}", self.actor_count);
                        let kind = match command {
                            LaunchCommand::Start => "start",
                            LaunchCommand::Resume => "resume",
                            LaunchCommand::Continue { .. } => "continue",
                            LaunchCommand::Restart { .. } => "restart",
                        };
                        self.log(format!(
                            "spawn {name} for {} generation {} ({kind})",
                            self.runs[run].name, generation.0
                        ));
                        self.actors.push(Actor {
                            name,
                            run,
                            runner,
                            replies,
                            counter: 0,
                            work: Work::Launched,
                            silent: false,
                            last: None,
                            stopping: false,
                        });
                    }
                    Output::StopRunner {
                        run_id,
                        runner_epoch,
                        reason,
                    } => {
                        supervisor::stop(&context, &run_id, &runner_epoch, reason);
                        if let Some(actor) = self
                            .actors
                            .iter_mut()
                            .find(|actor| actor.runner.runner_epoch == runner_epoch)
                        {
                            // SIGTERM: the process ends soon; a stopped one
                            // (or one that ignores it) may write first.
                            actor.stopping = true;
                        }
                    }
                    Output::Wake {
                        run_id,
                        at_ms,
                        reason,
                    } => context.timers.wake(run_id, at_ms, reason),
                    Output::BuildTerminalMessage { run_id } => {
                        let _ = self
                            .runtime
                            .block_on(crate::terminal_messages::build(&context, run_id));
                    }
                    Output::Event { .. }
                    | Output::PublishRun { .. }
                    | Output::PublishSession { .. }
                    | Output::Schedule
                    | Output::SpawnValidator { .. }
                    | Output::RequestRetentionSweep => {}
                }
            }
        }
    }

    fn run_index(&mut self, run_id: &RunId) -> usize {
        if let Some(index) = self.runs.iter().position(|run| &run.run_id == run_id) {
            return index;
        }
        let name = format!("run{}", self.runs.len());
        self.log(format!("{name} made by the server"));
        self.runs.push(SimRun {
            run_id: run_id.clone(),
            name,
        });
        self.runs.len() - 1
    }

    fn load(&self, index: usize) -> Checked<Option<RunAggregate>> {
        let run_id = self.runs[index].run_id.clone();
        self.runtime
            .block_on(
                self.context()
                    .store
                    .read(move |connection| runs::load(connection, &run_id)),
            )
            .map_err(|error| format!("load: {error}"))
    }

    /// A new run, written by the start job's own store calls (the
    /// resolver's answer is the simulation's topology).
    fn start_run(&mut self) -> Checked {
        if self.runs.len() >= MAX_RUNS {
            return self.tick(1);
        }
        let kind = if self.rng.percent(50) {
            Kind::Chain
        } else {
            Kind::Checkpoint
        };
        let index = self.runs.len();
        let run_id = RunId::new(format!("sim-{:016x}-{index}", self.seed));
        let (workflow, topology) = topology(kind);
        let digest = hex::encode(crate::ids::sha256(topology.as_bytes()).0);
        let input = json!({"run": index});
        let job_run = run_id.clone();
        let context = self.context();
        let written = self.runtime.block_on(crate::shell::transact(
            &context,
            move |connection, now_ms| {
                let project_id = meta::ensure_project(connection, "/sim/project", now_ms)?;
                meta::put_definition(connection, &digest, workflow, &topology, now_ms)?;
                let input_blob = Blob::json(&input);
                blobs::put(connection, &input_blob, blobs::JSON, now_ms)?;
                let reserved = match kernel::run::reserve(
                    NewRun {
                        run_id: job_run.clone(),
                        mode: ExecutionMode::Headless,
                    },
                    Lineage::default(),
                    &[],
                    now_ms,
                ) {
                    Ok(reserved) => reserved,
                    Err(_) => return Ok(Commit::Discard((false, Vec::new()))),
                };
                let meta = meta::RunMeta {
                    run_id: job_run,
                    project_id,
                    project_path: "/sim/project".into(),
                    workflow_name: workflow.into(),
                    workflow_ref: format!("{workflow}.workflow.ts"),
                    title: None,
                    definition_digest: digest,
                    input_digest: input_blob.digest,
                    input_hash: crate::ids::digest_text(&input_blob.digest),
                    source_json: "{\"kind\":\"file\"}".into(),
                    agent_model_json: None,
                };
                meta::insert_run(connection, &meta, &ExecutionMode::Headless, None, now_ms)?;
                let outputs =
                    crate::shell::write_transition(connection, None, reserved, &[], now_ms)?;
                Ok(Commit::Keep((true, outputs)))
            },
        ));
        let name = format!("run{index}");
        match written {
            Ok(true) => {
                self.log(format!("start {name} ({kind:?})"));
                self.runs.push(SimRun { run_id, name });
                Ok(())
            }
            other => Err(format!("the start of {name} was not written: {other:?}")),
        }
    }

    fn admit(&mut self) -> Checked {
        let context = self.context();
        self.runtime
            .block_on(crate::children::admission::admit_round(&context));
        self.log("admission round".into());
        Ok(())
    }

    fn tick(&mut self, ms: u64) -> Checked {
        self.advance(ms);
        let context = self.context();
        self.runtime
            .block_on(crate::time::wakes::schedule_expired(&context));
        self.log(format!("tick {ms} ms"));
        Ok(())
    }

    /// Fires every wake due now through the real wake handlers.
    fn fire_wakes(&mut self) -> Checked {
        let context = self.context();
        loop {
            let Ok(wake) = context.timers.next_due(self.now()) else {
                return Ok(());
            };
            let run = self.run_index(&wake.run_id);
            let reason = match &wake.reason {
                kernel::output::WakeReason::NodeDeadline { .. } => "node deadline",
                kernel::output::WakeReason::ClaimExpiry => "claim expiry",
                kernel::output::WakeReason::DecisionDeadline => "decision deadline",
            };
            let before = self.load(run)?;
            self.runtime
                .block_on(crate::time::wakes::fire(&context, wake));
            let after = self.load(run)?;
            if reason == "claim expiry" && before != after {
                self.counts.expiries += 1;
            }
            self.log(format!(
                "wake {reason} of {}: {}",
                self.runs[run].name,
                status_of(after.as_ref())
            ));
            self.take_outputs()?;
        }
    }

    // -- runners -----------------------------------------------------------

    /// A runner's next protocol step; with `crash_after`, the server is
    /// killed right after the handler committed, before the reply is read.
    fn actor_turn(&mut self, crash_after: bool) -> Checked {
        let ready: Vec<usize> = (0..self.actors.len())
            .filter(|&i| !self.actors[i].silent)
            .collect();
        if ready.is_empty() {
            let ms = 1 + self.rng.below(500);
            return self.tick(ms);
        }
        let at = ready[self.rng.index(ready.len())];
        self.actor_step(at, crash_after)
    }

    fn actor_step(&mut self, at: usize, crash_after: bool) -> Checked {
        let run = self.actors[at].run;
        let name = self.actors[at].name.clone();
        if self.actors[at].stopping && self.rng.percent(60) {
            return self.actor_exit(at, false);
        }
        let work = std::mem::replace(&mut self.actors[at].work, Work::Launched);
        let message = match &work {
            Work::Launched => Some(("runner.ready", json!({"sourceVerified": true}))),
            Work::Exiting { clean } => {
                let clean = *clean;
                self.actors[at].work = work;
                return self.actor_exit(at, clean);
            }
            Work::Running {
                attempt,
                node,
                started,
                effect,
            } => {
                let effect_node = node == "b" || node == "publish";
                if !started && self.rng.percent(50) {
                    Some(("node.started", json!({"attemptId": attempt})))
                } else if effect_node && matches!(effect, EffectWork::None) {
                    Some((
                        "effect.reserve",
                        json!({
                            "attemptId": attempt,
                            "effectType": "deploy",
                            "requestDigest": format!("sha256:{}", "ab".repeat(32)),
                        }),
                    ))
                } else if let EffectWork::Reserved {
                    effect_id,
                    attempt_number,
                    applied,
                } = effect
                {
                    if *applied {
                        Some((
                            "effect.settle",
                            json!({"effectId": effect_id, "state": "applied", "result": {"n": attempt_number}}),
                        ))
                    } else {
                        // The runner applies the effect to the external
                        // system (a stopped runner may do so after it lost
                        // its claim: the effect is then ambiguous, and only
                        // an operator's retry makes a new attempt).
                        let retries = self.retries_sent(effect_id);
                        let log = self.applied.entry(effect_id.clone()).or_default();
                        if log.contains(attempt_number) || *attempt_number > 1 + retries {
                            return Err(format!(
                                "never twice: effect {effect_id} applying as attempt {attempt_number} (applied: {log:?}, operator retries: {retries})"
                            ));
                        }
                        log.push(*attempt_number);
                        self.counts.effects_applied += 1;
                        let effect_id = effect_id.clone();
                        let attempt_number = *attempt_number;
                        self.log(format!(
                            "{name} applies the effect of {}",
                            self.runs[run].name
                        ));
                        self.actors[at].work = Work::Running {
                            attempt: attempt.clone(),
                            node: node.clone(),
                            started: *started,
                            effect: EffectWork::Reserved {
                                effect_id,
                                attempt_number,
                                applied: true,
                            },
                        };
                        return Ok(());
                    }
                } else if self.rng.percent(12) {
                    Some((
                        "node.failed",
                        json!({"attemptId": attempt, "outcome": "failed", "error": {"code": "internal", "message": "simulated failure"}}),
                    ))
                } else {
                    Some((
                        "node.finished",
                        json!({"attemptId": attempt, "output": {"node": node}}),
                    ))
                }
            }
        };
        let Some((kind, fields)) = message else {
            return Ok(());
        };
        self.actors[at].work = work;
        let frame = self.frame(at, kind, fields)?;
        let reply = self.send(at, &frame, false, crash_after)?;
        if crash_after {
            self.counts.reply_lost_crashes += 1;
            self.crash("crash after the commit of a runner message")?;
            return self.boot();
        }
        self.actors[at].last = Some((frame, reply.clone()));
        self.react(at, kind, reply)
    }

    /// Builds a runner.v1 frame of actor `at` with a fresh message id.
    fn frame(&mut self, at: usize, kind: &str, fields: Value) -> Checked<Vec<u8>> {
        let actor = &mut self.actors[at];
        actor.counter += 1;
        let mut object = match fields {
            Value::Object(object) => object,
            _ => serde_json::Map::new(),
        };
        object.insert("type".into(), json!(kind));
        object.insert("schema".into(), json!("pi-workflows.worker-launch.v1"));
        object.insert("runId".into(), json!(actor.runner.run_id.as_str()));
        object.insert("generation".into(), json!(actor.runner.generation.0));
        object.insert(
            "runnerEpoch".into(),
            json!(actor.runner.runner_epoch.as_str()),
        );
        object.insert(
            "messageId".into(),
            json!(format!("{}-m{}", actor.name, actor.counter)),
        );
        let mut frame = protocol::canonicalize(&Value::Object(object))
            .map_err(|error| format!("canonical: {error:?}"))?;
        frame.push(b'\n');
        Ok(frame)
    }

    /// Hands one frame to the real runner handler and returns the reply
    /// queued for the runner's pipe. Checks claim fencing for a fresh
    /// message.
    fn send(
        &mut self,
        at: usize,
        frame: &[u8],
        retry: bool,
        _crash_after: bool,
    ) -> Checked<Option<Vec<u8>>> {
        self.counts.runner_messages += 1;
        let run = self.actors[at].run;
        let runner = self.actors[at].runner.clone();
        let received = crate::wire::runner::receive(frame)
            .map_err(|error| format!("the simulation built an invalid frame: {error:?}"))?;
        if matches!(
            received.message,
            protocol::generated::types::RunnerMessage::RunnerReady { .. }
        ) {
            runner.mark_ready();
        }
        let before = self.load(run)?;
        let now = self.now();
        let holds = before
            .as_ref()
            .is_some_and(|agg| holds_claim(agg, &runner, now));
        let context = self.context();
        self.runtime
            .block_on(crate::runner_api::handle(&context, &runner, received));
        let after = self.load(run)?;
        let mut replies = Vec::new();
        while let Ok(reply) = self.actors[at].replies.try_recv() {
            replies.push(reply);
        }
        let reply = replies.pop();
        let outcome = reply
            .as_deref()
            .map(reply_outcome)
            .unwrap_or_else(|| "none".into());
        if !retry && !holds {
            if before != after {
                return Err(format!(
                    "claims fenced: a message of {} (generation {}) without the live claim changed {}",
                    self.actors[at].name, runner.generation.0, self.runs[run].name
                ));
            }
            if outcome == "accepted" || outcome == "command" {
                return Err(format!(
                    "claims fenced: a message of {} without the live claim was answered {outcome}",
                    self.actors[at].name
                ));
            }
            self.counts.stale_refused += 1;
        }
        let kind = frame_kind(frame);
        self.log(format!(
            "{} {}{kind} -> {outcome}; {} {}",
            self.actors[at].name,
            if retry { "retries " } else { "" },
            self.runs[run].name,
            status_of(after.as_ref())
        ));
        Ok(reply)
    }

    /// What a runner does with its reply.
    fn react(&mut self, at: usize, kind: &str, reply: Option<Vec<u8>>) -> Checked {
        let Some(reply) = reply else {
            self.actors[at].work = Work::Exiting { clean: false };
            return Ok(());
        };
        let message: ServerMessage = serde_json::from_slice(&reply)
            .map_err(|error| format!("a reply that is not a runner.v1 server message: {error}"))?;
        let (outcome, next, result) = match message {
            ServerMessage::Command { node, .. } => {
                self.actors[at].work = Work::Running {
                    attempt: node.attempt_id.to_string(),
                    node: node.node_id.to_string(),
                    started: false,
                    effect: EffectWork::None,
                };
                return Ok(());
            }
            ServerMessage::Reply {
                outcome,
                next,
                result,
                ..
            } => (outcome, next, result),
            ServerMessage::ContentChunk { .. } => {
                return Err("a content chunk answered a runner message".into());
            }
        };
        if outcome != ReplyOutcome::Accepted && outcome != ReplyOutcome::Adopted {
            // Refused (claim lost, stale attempt, conflict): the runner exits.
            self.actors[at].work = Work::Exiting {
                clean: outcome == ReplyOutcome::ClaimLost,
            };
            return Ok(());
        }
        let Work::Running {
            attempt,
            node,
            started,
            effect,
        } = std::mem::replace(&mut self.actors[at].work, Work::Launched)
        else {
            self.actors[at].work = Work::Exiting { clean: true };
            return Ok(());
        };
        match kind {
            "node.started" => {
                self.actors[at].work = Work::Running {
                    attempt,
                    node,
                    started: true,
                    effect,
                };
            }
            "effect.reserve" => {
                let effect = if let Ok(reservation) =
                    serde_json::from_value::<EffectReservation>(result.clone())
                {
                    EffectWork::Reserved {
                        effect_id: reservation.effect_id.to_string(),
                        attempt_number: reservation.attempt_number.get(),
                        applied: false,
                    }
                } else if serde_json::from_value::<EffectAdoption>(result).is_ok() {
                    EffectWork::Settled
                } else {
                    return Err("an accepted effect.reserve without a reservation".into());
                };
                self.actors[at].work = Work::Running {
                    attempt,
                    node,
                    started: true,
                    effect,
                };
            }
            "effect.settle" => {
                self.actors[at].work = Work::Running {
                    attempt,
                    node,
                    started: true,
                    effect: EffectWork::Settled,
                };
            }
            _ => {
                self.actors[at].work = match next {
                    Some(ReplyNext::RunNode {
                        attempt_id,
                        node_id,
                        ..
                    }) => Work::Running {
                        attempt: attempt_id.to_string(),
                        node: node_id.to_string(),
                        started: true,
                        effect: EffectWork::None,
                    },
                    Some(ReplyNext::Exit { .. }) | None => Work::Exiting { clean: true },
                };
                let _ = (started, attempt, node, effect);
            }
        }
        Ok(())
    }

    /// The runner's process ends; the supervisor records its exit.
    fn actor_exit(&mut self, at: usize, clean: bool) -> Checked {
        let actor = self.actors.remove(at);
        let stopped = *actor.runner.stop_reason.lock().expect("stop lock");
        let kind = match (stopped, clean) {
            (Some(reason), _) => ExitKind::Stopped { reason },
            (None, true) => ExitKind::Clean,
            (None, false) => ExitKind::Abnormal,
        };
        let code = if clean { 0 } else { 3 };
        let context = self.context();
        self.runtime.block_on(supervisor::record_exit(
            &context,
            &actor.runner,
            kind,
            Some(code),
            None,
        ));
        context.runners.remove(&actor.runner.runner_epoch);
        let after = self.load(actor.run)?;
        self.log(format!(
            "{} exits ({}); {} {}",
            actor.name,
            match kind {
                ExitKind::Stopped { reason } => stop_name(reason),
                ExitKind::Clean => "clean",
                _ => "abnormal",
            },
            self.runs[actor.run].name,
            status_of(after.as_ref())
        ));
        Ok(())
    }

    /// A runner retries its last message (same id, same payload): an
    /// answered one gets the same reply.
    fn actor_retry(&mut self) -> Checked {
        let candidates: Vec<usize> = (0..self.actors.len())
            .filter(|&i| !self.actors[i].silent && self.actors[i].last.is_some())
            .collect();
        if candidates.is_empty() {
            return self.tick(1);
        }
        let at = candidates[self.rng.index(candidates.len())];
        let (frame, first) = self.actors[at].last.clone().expect("a last message");
        let fenced = self.actors[at].runner.is_fenced();
        let again = self.send(at, &frame, true, false)?;
        if let (Some(first), false) = (&first, fenced) {
            let stored = matches!(
                reply_outcome(first).as_str(),
                "accepted" | "rejected" | "command"
            );
            if stored && again.as_ref() != Some(first) {
                return Err(format!(
                    "runner-message receipts: a retry of {}'s {} got another reply",
                    self.actors[at].name,
                    frame_kind(&frame)
                ));
            }
        }
        Ok(())
    }

    fn toggle_silence(&mut self) -> Checked {
        if self.actors.is_empty() {
            return self.tick(1);
        }
        let at = self.rng.index(self.actors.len());
        let actor = &mut self.actors[at];
        actor.silent = !actor.silent;
        let line = format!(
            "{} {}",
            actor.name,
            if actor.silent {
                "stops (silent)"
            } else {
                "continues"
            }
        );
        self.log(line);
        Ok(())
    }

    fn actor_crash(&mut self) -> Checked {
        if self.actors.is_empty() {
            return self.tick(1);
        }
        let at = self.rng.index(self.actors.len());
        self.counts.runner_crashes += 1;
        self.actor_exit(at, false)
    }

    // -- the client --------------------------------------------------------

    /// A new command on a drawn run (with `crash_after`, the server dies
    /// after the command's commit, before its response is read).
    fn client_command(&mut self, crash_after: bool) -> Checked {
        if self.runs.is_empty() {
            return self.tick(1);
        }
        let run = self.rng.index(self.runs.len());
        let Some(agg) = self.load(run)? else {
            return Err(format!("{} is gone", self.runs[run].name));
        };
        let (operation, payload) = self.choose_command(&agg);
        let expected_revision = if self.rng.percent(20) {
            Some(agg.run.revision.0.saturating_sub(self.rng.below(2)))
        } else {
            None
        };
        let n = self.sent.len();
        let sent = Sent {
            name: format!("c{n}"),
            run,
            operation,
            request_id: format!("q{n}"),
            key: format!("k{n}"),
            payload,
            expected_revision,
            durable: None,
            lost: false,
        };
        self.sent.push(sent);
        self.issue(n, None, crash_after)
    }

    fn choose_command(&mut self, agg: &RunAggregate) -> (&'static str, Value) {
        if let Some(effect) = agg
            .effects
            .iter()
            .find(|effect| effect.state == EffectState::Ambiguous)
        {
            let id = effect.effect_id.as_str().to_owned();
            // The operator looks at the external system first.
            let action = if self.applied.get(&id).is_some_and(|log| !log.is_empty()) {
                "confirm"
            } else {
                "retry"
            };
            return ("effect.recover", json!({"effectId": id, "action": action}));
        }
        if agg.run.status == RunStatus::Waiting && self.rng.percent(80) {
            return ("checkpoint.answer", json!({"answer": {"approve": true}}));
        }
        if matches!(agg.run.status, RunStatus::Failed | RunStatus::TimedOut) && self.rng.percent(50)
        {
            return ("run.restart", json!({}));
        }
        match self.rng.below(10) {
            0..=3 => ("run.pause", json!({})),
            4..=8 => ("run.resume", json!({})),
            _ => ("run.cancel", json!({})),
        }
    }

    /// Sends command `n` (under a new request id when `request_id` is
    /// given) and records or checks its response.
    fn issue(&mut self, n: usize, request_id: Option<String>, crash_after: bool) -> Checked {
        self.counts.commands += 1;
        let sent = self.sent[n].clone();
        let run_id = self.runs[sent.run].run_id.as_str().to_owned();
        let mut request = json!({
            "clientId": "sim-client",
            "idempotencyKey": sent.key,
            "operation": sent.operation,
            "payload": sent.payload,
            "requestId": request_id.clone().unwrap_or_else(|| sent.request_id.clone()),
            "runId": run_id,
            "schema": "pi-workflows.client.v1",
            "type": "request",
        });
        if let (Some(revision), Value::Object(object)) = (sent.expected_revision, &mut request) {
            object.insert("expectedRevision".into(), json!(revision));
        }
        let mut frame = protocol::canonicalize(&request).map_err(|e| format!("{e:?}"))?;
        frame.push(b'\n');
        let decoded = protocol::decode_client_frame(&frame)
            .map_err(|error| format!("the simulation built an invalid request: {error:?}"))?;
        let server = self.server.as_ref().expect("a server");
        let (context, outbox, subscriptions, frames) = (
            server.context.clone(),
            server.outbox.clone(),
            server.subscriptions.clone(),
            server.frames.clone(),
        );
        self.runtime.block_on(crate::client_api::handle(
            &context,
            decoded.message,
            decoded.payload,
            &outbox,
            &subscriptions,
        ));
        let written: Vec<Vec<u8>> = std::mem::take(&mut *frames.lock().expect("frames"));
        if crash_after {
            self.counts.reply_lost_crashes += 1;
            self.log(format!(
                "{} {} sent; its response is lost",
                sent.name, sent.operation
            ));
            self.crash("crash after the commit of a command")?;
            return self.boot();
        }
        let response = written
            .iter()
            .rev()
            .find_map(|frame| response_of(frame))
            .ok_or_else(|| format!("no response to {}", sent.name))?;
        let retry = request_id.is_some() || sent.durable.is_some() || sent.lost;
        self.log(format!(
            "{} {}{} on {} -> {}{}",
            sent.name,
            if retry { "retry of " } else { "" },
            sent.operation,
            self.runs[sent.run].name,
            response.outcome,
            response
                .error
                .as_ref()
                .map_or(String::new(), |code| format!(" ({code})"))
        ));
        match &sent.durable {
            Some(first) => {
                let expected_outcome = match first.outcome.as_str() {
                    "accepted" | "adopted" => "adopted",
                    other => other,
                };
                if response.outcome != expected_outcome
                    || response.revision != first.revision
                    || response.receipt != first.receipt
                {
                    return Err(format!(
                        "command receipts: a retry of {} ({}) answered {response:?}, the first {first:?}",
                        sent.name, sent.operation
                    ));
                }
                self.counts.adopted_retries += 1;
            }
            None => {
                if response.durable() {
                    self.sent[n].durable = Some(response.clone());
                    self.sent[n].lost = false;
                    self.note_accepted(n, &response)?;
                }
            }
        }
        self.take_outputs()
    }

    /// How many `effect.recover retry` commands the operator sent for
    /// `effect_id` (each may make one new attempt).
    fn retries_sent(&self, effect_id: &str) -> u64 {
        self.sent
            .iter()
            .filter(|sent| sent.operation == "effect.recover")
            .filter_map(|sent| {
                serde_json::from_value::<protocol::generated::types::EffectRecoverPayload>(
                    sent.payload.clone(),
                )
                .ok()
            })
            .filter(|payload| {
                payload.effect_id.as_str() == effect_id
                    && payload.action == protocol::generated::types::RecoverAction::Retry
            })
            .count() as u64
    }

    /// Remembers what an accepted command promised.
    fn note_accepted(&mut self, n: usize, response: &Response) -> Checked {
        let sent = &self.sent[n];
        if !matches!(response.outcome.as_str(), "accepted" | "adopted") {
            return Ok(());
        }
        if sent.operation == "checkpoint.answer" {
            let continuation = response
                .receipt
                .as_ref()
                .and_then(|receipt| {
                    serde_json::from_value::<protocol::generated::types::CheckpointAnswerReceipt>(
                        receipt.clone(),
                    )
                    .ok()
                })
                .map(|receipt| receipt.continuation_run_id.to_string())
                .ok_or("an accepted checkpoint.answer without its continuation")?;
            self.answered.insert(sent.run, continuation);
        }
        if sent.operation == "effect.recover" {
            self.counts.ambiguous_recovered += 1;
        }
        Ok(())
    }

    /// Retries an earlier command: a lost one under its request id, or a
    /// durable one under its request id or a new request id (its key).
    fn client_retry(&mut self) -> Checked {
        if self.sent.is_empty() {
            return self.tick(1);
        }
        let lost: Vec<usize> = (0..self.sent.len())
            .filter(|&n| self.sent[n].lost)
            .collect();
        let n = if !lost.is_empty() && self.rng.percent(70) {
            lost[self.rng.index(lost.len())]
        } else {
            self.rng.index(self.sent.len())
        };
        let request_id = self
            .rng
            .percent(40)
            .then(|| format!("q{n}-retry{}", self.step));
        self.issue(n, request_id, false)
    }

    // -- the end -----------------------------------------------------------

    /// Every actor cooperates and the client answers, resumes and
    /// recovers, until every run is terminal.
    fn settle(&mut self) -> Checked {
        self.log("settle".into());
        for actor in &mut self.actors {
            actor.silent = false;
        }
        for round in 0..SETTLE_ROUNDS {
            self.step += 1;
            let mut open = Vec::new();
            for index in 0..self.runs.len() {
                let Some(agg) = self.load(index)? else {
                    return Err(format!("{} is gone", self.runs[index].name));
                };
                if !agg.run.status.is_terminal() {
                    open.push((index, agg));
                }
            }
            if open.is_empty() {
                return Ok(());
            }
            // The client acts on every run that waits for someone.
            if round % 4 == 3 {
                for (index, agg) in &open {
                    let needs = agg.run.paused
                        || agg.run.status == RunStatus::Waiting
                        || agg.run.park_reason.is_some()
                        || agg.has_ambiguous_effect();
                    if needs && self.actors.iter().all(|actor| actor.run != *index) {
                        let (operation, payload) = self.settling_command(agg);
                        let n = self.sent.len();
                        self.sent.push(Sent {
                            name: format!("c{n}"),
                            run: *index,
                            operation,
                            request_id: format!("q{n}"),
                            key: format!("k{n}"),
                            payload,
                            expected_revision: None,
                            durable: None,
                            lost: false,
                        });
                        self.issue(n, None, false)?;
                    }
                }
            }
            let lost: Vec<usize> = (0..self.sent.len())
                .filter(|&n| self.sent[n].lost)
                .collect();
            for n in lost {
                self.issue(n, None, false)?;
            }
            self.admit()?;
            let mut at = 0;
            while at < self.actors.len() {
                let count = self.actors.len();
                self.actor_step(at, false)?;
                self.take_outputs()?;
                if self.actors.len() >= count {
                    at += 1;
                }
            }
            self.tick(if round % 10 == 9 { TTL_MS } else { 200 })?;
            self.after_step()?;
        }
        let mut stuck = Vec::new();
        for index in 0..self.runs.len() {
            let agg = self.load(index)?;
            if !agg.as_ref().is_some_and(|agg| agg.run.status.is_terminal()) {
                stuck.push(format!(
                    "{} {}",
                    self.runs[index].name,
                    status_of(agg.as_ref())
                ));
            }
        }
        Err(format!("stuck after settling: {}", stuck.join("; ")))
    }

    fn settling_command(&mut self, agg: &RunAggregate) -> (&'static str, Value) {
        if agg.has_ambiguous_effect() || agg.run.status == RunStatus::Waiting {
            let (operation, payload) = self.choose_command_settling(agg);
            return (operation, payload);
        }
        if agg.run.paused || agg.run.park_reason.is_some() {
            return ("run.resume", json!({}));
        }
        ("run.resume", json!({}))
    }

    fn choose_command_settling(&mut self, agg: &RunAggregate) -> (&'static str, Value) {
        if let Some(effect) = agg
            .effects
            .iter()
            .find(|effect| effect.state == EffectState::Ambiguous)
        {
            let id = effect.effect_id.as_str().to_owned();
            let action = if self.applied.get(&id).is_some_and(|log| !log.is_empty()) {
                "confirm"
            } else {
                "retry"
            };
            return ("effect.recover", json!({"effectId": id, "action": action}));
        }
        if agg.run.paused {
            return ("run.resume", json!({}));
        }
        ("checkpoint.answer", json!({"answer": {"approve": true}}))
    }

    // -- invariants ----------------------------------------------------------

    /// The consistency checks; the quiescent-only ones only while no
    /// runner is live (as `state verify` runs them).
    fn check_consistency(&mut self) -> Checked {
        let context = self.context();
        let quiescent = self.actors.is_empty();
        let checks: Vec<consistency::Check> = consistency::CHECKS
            .iter()
            .filter(|check| quiescent || !check.quiescent_only)
            .copied()
            .collect();
        let violations = self
            .runtime
            .block_on(
                context
                    .store
                    .read(move |connection| Ok(consistency::violations_of(connection, &checks))),
            )
            .map_err(|error| format!("consistency read: {error}"))?;
        if violations.is_empty() {
            Ok(())
        } else {
            Err(format!("consistency checks: {violations:?}"))
        }
    }

    /// Every accepted checkpoint answer left its run continued by the run
    /// its receipt named.
    fn check_answers(&mut self) -> Checked {
        let answered: Vec<(usize, String)> = self
            .answered
            .iter()
            .map(|(run, continuation)| (*run, continuation.clone()))
            .collect();
        for (run, continuation) in answered {
            let agg = self.load(run)?;
            let continued = agg
                .as_ref()
                .and_then(|agg| agg.run.lineage.continued_by.as_ref())
                .map(|run_id| run_id.as_str().to_owned());
            if continued.as_deref() != Some(continuation.as_str()) {
                return Err(format!(
                    "lost answer: {}'s accepted checkpoint answer named {continuation}, the run is continued by {continued:?}",
                    self.runs[run].name
                ));
            }
        }
        Ok(())
    }

    /// After the final crash: every command retried under its request id
    /// adopts its first durable response.
    fn check_receipts_at_end(&mut self) -> Checked {
        for n in 0..self.sent.len() {
            if self.sent[n].durable.is_some() {
                self.issue(n, None, false)?;
                let other = format!("q{n}-final");
                self.issue(n, Some(other), false)?;
            }
        }
        let unanswered: BTreeSet<String> = self
            .sent
            .iter()
            .filter(|sent| sent.lost)
            .map(|sent| sent.name.clone())
            .collect();
        for name in unanswered {
            let n = self
                .sent
                .iter()
                .position(|sent| sent.name == name)
                .expect("named");
            self.issue(n, None, false)?;
        }
        Ok(())
    }
}

/// Whether `runner` holds the live claim of the run, by the loaded facts.
fn holds_claim(agg: &RunAggregate, runner: &Runner, now_ms: u64) -> bool {
    agg.run.lease.claim.as_ref().is_some_and(|claim| {
        claim.generation == runner.generation
            && claim.token_hash == runner.authority.token_hash
            && claim.owner_id == runner.authority.owner_id
            && now_ms < claim.expires_at_ms
    })
}

fn status_of(agg: Option<&RunAggregate>) -> String {
    let Some(agg) = agg else {
        return "missing".into();
    };
    let run = &agg.run;
    let mut text = format!(
        "{}/{} rev {} gen {}",
        crate::wire::codec_name(&run.status),
        crate::wire::codec_name(&run.queue),
        run.revision.0,
        run.lease.generation.0
    );
    if run.paused {
        text.push_str(" paused");
    }
    if let Some(reason) = &run.park_reason {
        text.push_str(&format!(" parked {}", crate::wire::codec_name(reason)));
    }
    for effect in &agg.effects {
        text.push_str(&format!(
            " effect {} #{}",
            crate::wire::codec_name(&effect.state),
            effect.attempt_number
        ));
    }
    text
}

fn stop_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::ClaimLost => "stopped: claim lost",
        _ => "stopped",
    }
}

fn topology(kind: Kind) -> (&'static str, String) {
    let text = match kind {
        Kind::Chain => {
            r#"{"startAt":"a","nodes":[{"id":"a","nodeType":"action","timeout":{"kind":"default"},"mountPath":[]},{"id":"b","nodeType":"action","timeout":{"kind":"ms","ms":30000},"mountPath":[]},{"id":"c","nodeType":"action","timeout":{"kind":"default"},"mountPath":[]}],"edges":[{"kind":"plain","from":"a","to":"b"},{"kind":"plain","from":"b","to":"c"}],"mounts":[]}"#
        }
        Kind::Checkpoint => {
            r#"{"startAt":"draft","nodes":[{"id":"draft","nodeType":"action","timeout":{"kind":"default"},"mountPath":[]},{"id":"review","nodeType":"checkpoint","timeout":{"kind":"default"},"mountPath":[]},{"id":"publish","nodeType":"action","timeout":{"kind":"ms","ms":30000},"mountPath":[]}],"edges":[{"kind":"plain","from":"draft","to":"review"},{"kind":"plain","from":"review","to":"publish"}],"mounts":[]}"#
        }
    };
    let name = match kind {
        Kind::Checkpoint => "checkpoint",
        Kind::Chain => "chain",
    };
    (name, text.to_owned())
}

fn frame_kind(frame: &[u8]) -> String {
    crate::wire::runner::receive(frame)
        .map(|received| runner_kind(&received.message).to_owned())
        .unwrap_or_else(|_| "invalid".into())
}

fn runner_kind(message: &protocol::generated::types::RunnerMessage) -> &'static str {
    use protocol::generated::types::RunnerMessage as M;
    match message {
        M::RunnerReady { .. } => "runner.ready",
        M::NodeStarted { .. } => "node.started",
        M::NodeFinished { .. } => "node.finished",
        M::NodeFailed { .. } => "node.failed",
        M::EffectReserve { .. } => "effect.reserve",
        M::EffectSettle { .. } => "effect.settle",
        _ => "other",
    }
}

/// The outcome of a reply frame (`command` for the command after ready).
fn reply_outcome(frame: &[u8]) -> String {
    match serde_json::from_slice::<ServerMessage>(frame) {
        Ok(ServerMessage::Command { .. }) => "command".into(),
        Ok(ServerMessage::Reply { outcome, .. }) => crate::wire::codec_name(&outcome),
        Ok(ServerMessage::ContentChunk { .. }) => "chunk".into(),
        Err(_) => "unreadable".into(),
    }
}

/// The response of a client frame, if it is one.
fn response_of(frame: &[u8]) -> Option<Response> {
    let decoded = protocol::decode_client_frame(frame).ok()?;
    let ClientMessage::Response {
        outcome,
        revision,
        receipt,
        error,
        ..
    } = decoded.message
    else {
        return None;
    };
    Some(Response {
        outcome: crate::wire::codec_name(&outcome),
        revision: revision.map(|revision| revision.get()),
        receipt: receipt.map(|receipt| serde_json::to_value(receipt).unwrap_or(Value::Null)),
        error: error.map(|error| crate::wire::codec_name(&error.code)),
    })
}
