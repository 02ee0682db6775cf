//! Runner supervision with real dispatch and routing over a small topology.
//!
//! Two headless runs share one workflow:
//!
//! ```text
//! work --$result.outcome--> ok: done | failed: work | timed_out: gate     (maxSteps 2)
//! done (no edge: completes)   gate (checkpoint: waits)
//! ```
//!
//! The scheduler admits runs against a capacity (`scheduler::admit_next`,
//! `run::admit`); each admission spawns one runner process. A runner sends
//! `runner.ready` (`execution::start_generation`), `node.started`
//! (`execution::record_node_started`) and `node.finished`/`node.failed`
//! (`execution::finish_attempt` with `Actor::Runner`) and follows the
//! `Dispatch` it gets back. Every runner message goes through the
//! runner-message receipts (`receipt::decide_runner_message`,
//! `record_runner_message`). The server expires node deadlines
//! (`execution::expire_node`), decides every runner exit
//! (`runner::decide_exit`: clean, abnormal, stopped, startup deadline
//! missed, orphaned after a restart) and recovers expired claims
//! (`runner::on_claim_expired`, here for its own runner: an orphaned record is decided
//! by `decide_exit(Orphaned)`). A run is admitted again only after its
//! previous runner's exit is recorded (`run::admit` refuses `RunnerLive`).
//!
//! The environment adds: lost replies (the runner retries the same message),
//! late duplicates of delivered messages (also after a new generation), a
//! runner that reuses a message id with another payload, runners that exit at
//! any point, the clock, and a server crash that drops the host authorities
//! and the runner processes but keeps the committed facts and receipts.
//!
//! The fault-free configuration (no crash, loss, duplicate or reuse; one
//! half-tick so node deadlines can pass while claims stay live) checks
//! liveness.

use crate::harness::Summarize;
use crate::world::TTL;
use core::fmt;
use kernel::attempt::{AttemptStatus, NodeOutcome};
use kernel::claim::{self, Authority};
use kernel::execution::{self, Actor, Dispatch, NodeResult};
use kernel::fixtures;
use kernel::ids::{AttemptId, Digest, NodeId, RunnerEpochId};
use kernel::output::{Output, Step, StopReason, Transition};
use kernel::receipt::{
    self, CommandOutcome, RunnerMessage, RunnerMessageDecision, RunnerMessageId,
    StoredRunnerMessage,
};
use kernel::run::{
    self, FailureClass, ParkReason, QueueStatus, Rejection, RunAggregate, RunStatus,
};
use kernel::runner::{self, ExitKind, MAX_CRASH_RETRIES, RunnerExit, RunnerOutcome};
use kernel::scheduler::{self, Candidate, Capacity, WorkKind};
use kernel::topology::{NodeTimeout, NodeType, Topology};
use serde_json::Value;
use stateright::{Model, Property};

/// One clock step: half a claim lifetime. A node deadline is one step after
/// `node.started`; a claim that is not renewed expires after two steps.
pub const STEP: u64 = TTL / 2;

/// The root step limit of the workflow.
pub const MAX_STEPS: u32 = 2;

/// The real steps of a run, recounted from the visits per node (a summary
/// the model folds from the run's start holds every node), independent of
/// the summary's own counter that the step limit reads.
fn real_steps(topology: &Topology, agg: &RunAggregate) -> u32 {
    agg.steps
        .visits
        .iter()
        .filter(|(node_id, _)| {
            topology
                .node(node_id)
                .is_none_or(|node| node.counts_as_step())
        })
        .map(|(_, visits)| visits)
        .sum()
}

/// Every runner past `node.started` (or told by a fused commit that its
/// deadline is committed) runs an attempt whose static deadline is durable.
fn deadlines_durable(state: &SupervisionState) -> bool {
    let topology = SupervisionModel::topology();
    state.procs.iter().all(|proc| {
        let Stage::Running {
            attempt,
            node,
            started: true,
        } = &proc.stage
        else {
            return true;
        };
        let static_timeout = topology
            .node(node)
            .is_some_and(|spec| spec.timeout.static_ms().is_some());
        state.runs[proc.run as usize]
            .attempt
            .as_ref()
            .filter(|current| {
                &current.attempt_id == attempt && current.status == AttemptStatus::Active
            })
            .is_none_or(|current| !static_timeout || current.deadline_at_ms.is_some())
    })
}

/// The kernel's rules, or the kernel with one check dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SupervisionRules {
    Kernel,
    /// A runner's write is fenced by owner only: an expired claim whose owner
    /// matches is treated as live (and renewed).
    OwnerOnlyRunnerFencing,
    /// The runner-exit decision parks without abandoning the active attempt.
    ParkKeepsAttempt,
    /// Routing never checks `maxSteps`.
    NoStepLimit,
    /// The scheduler ignores the capacity.
    CapacityIgnored,
    /// `run::admit` does not take a new generation: it reuses the last one.
    AdmitReusesGeneration,
    /// The runner-exit decision ignores the crash-retry budget: every crash
    /// of the current runner after progress fails the run.
    NoCrashRetryBudget,
    /// A run parked `runnerNoProgress` is treated as resumable automatically.
    ReadmitNoProgress,
    /// Admission does not refuse a terminal run.
    AdmitIgnoresTerminal,
    /// The runner-exit decision parks without releasing the claim.
    ExitKeepsClaim,
    /// The shell never looks up runner-message receipts (every delivery executes).
    NoRunnerReceipts,
    /// A runner message's payload digest is not compared with the stored one.
    RunnerFingerprintIgnored,
    /// The scheduler never admits a parked run, only queued ones.
    AdmitOnlyQueued,
    /// Admission ignores the previous runner epoch: a run whose stopped
    /// runner has not exited yet is a candidate and is admitted again (the
    /// kernel before the fix of finding 1).
    AdmitBesideLiveRunner,
    /// `node.started` records no deadline (the runner still proceeds).
    StartedDropsDeadline,
    /// The fused commit does not record the static deadline it reports.
    FusedDropsDeadline,
}

/// The bounded configuration.
#[derive(Clone, Debug)]
pub struct SupervisionModel {
    /// Lost replies, late duplicates, id reuse, crashes, startup deadlines,
    /// recovery. Off: the fault-free liveness configuration.
    pub faults: bool,
    pub runs: u8,
    pub capacity: u32,
    /// Clock steps of [`STEP`].
    pub max_ticks: u8,
    pub max_generation: u64,
    /// Runner crashes (abnormal exits) plus server crashes.
    pub max_crashes: u8,
    /// Lost replies plus late duplicates.
    pub max_losses: u8,
    /// Message ids reused with another payload.
    pub max_reuses: u8,
    /// Crashes and lost replies together (a reuse follows a lost reply).
    pub max_faults: u8,
    pub rules: SupervisionRules,
    /// The runner reports results through the fused commit
    /// (`execution::finish_and_start`): a node it is dispatched there with
    /// a static timeout has its deadline committed already, so it sends no
    /// `node.started`. Off: `finish_attempt`, then `node.started`.
    pub fused: bool,
}

impl SupervisionModel {
    /// The CI configuration with faults.
    pub fn ci(rules: SupervisionRules) -> Self {
        Self {
            faults: true,
            runs: 2,
            capacity: 1,
            max_ticks: 2,
            max_generation: 2,
            max_crashes: 1,
            max_losses: 1,
            max_reuses: 1,
            max_faults: 1,
            rules,
            fused: false,
        }
    }

    /// The CI configuration of the fused commit: one run with every fault.
    pub fn ci_fused(rules: SupervisionRules) -> Self {
        Self {
            runs: 1,
            fused: true,
            ..Self::ci(rules)
        }
    }

    /// The CI configuration with capacity 2 (two runs may run at once).
    /// About 11 M states: not checked exhaustively in CI.
    pub fn ci_capacity_two(rules: SupervisionRules) -> Self {
        Self {
            capacity: 2,
            ..Self::ci(rules)
        }
    }

    /// Capacity 2 with the clock as the only fault (no crash, lost reply,
    /// late duplicate or id reuse): a slot is free while a stopped runner
    /// of the other run is still running, which is what admission beside a
    /// live runner needs. Small enough to check exhaustively.
    pub fn capacity_two_clock_only(rules: SupervisionRules) -> Self {
        Self {
            capacity: 2,
            max_crashes: 0,
            max_losses: 0,
            max_reuses: 0,
            max_faults: 0,
            ..Self::ci(rules)
        }
    }

    /// Larger bounds with faults, for local runs.
    pub fn deep(rules: SupervisionRules) -> Self {
        Self {
            max_faults: 2,
            ..Self::ci(rules)
        }
    }

    /// The fault-free configuration for liveness with larger bounds: three
    /// runs sharing two slots.
    pub fn fault_free_deep(rules: SupervisionRules) -> Self {
        Self {
            runs: 3,
            capacity: 2,
            ..Self::fault_free(rules)
        }
    }

    /// The fault-free configuration for liveness.
    pub fn fault_free(rules: SupervisionRules) -> Self {
        Self {
            faults: false,
            runs: 2,
            capacity: 1,
            max_ticks: 1,
            max_generation: 3,
            max_crashes: 0,
            max_losses: 0,
            max_reuses: 0,
            max_faults: 0,
            rules,
            fused: false,
        }
    }

    /// A one-line description of the bounds.
    pub fn bounds(&self) -> String {
        if self.faults {
            format!(
                "faults on, {} runs, capacity {}, ticks<={} (half ttl), gen<={}, crashes<={}, lost replies<={}, crashes+losses<={}, id reuse<={}, maxSteps {}",
                self.runs,
                self.capacity,
                self.max_ticks,
                self.max_generation,
                self.max_crashes,
                self.max_losses,
                self.max_faults,
                self.max_reuses,
                MAX_STEPS
            )
        } else {
            format!(
                "fault-free (no crash, loss, duplicate or reuse), {} runs, capacity {}, ticks<={} (half ttl), gen<={}, maxSteps {}",
                self.runs, self.capacity, self.max_ticks, self.max_generation, MAX_STEPS
            )
        }
    }

    /// The workflow every run executes.
    pub fn topology() -> Topology {
        let mut work = fixtures::node("work", NodeType::Compute);
        work.timeout = NodeTimeout::Fixed { ms: STEP };
        Topology {
            start_at: NodeId::from("work"),
            max_steps: Some(MAX_STEPS),
            nodes: vec![
                work,
                fixtures::node("done", NodeType::Compute),
                fixtures::node("gate", NodeType::Checkpoint),
            ],
            edges: vec![fixtures::switch(
                "work",
                "$result.outcome",
                &[("ok", "done"), ("failed", "work"), ("timed_out", "gate")],
            )],
            mounts: Vec::new(),
        }
    }

    /// The topology the kernel is given (without `maxSteps` under the planted bug).
    fn kernel_topology(&self) -> Topology {
        let mut topology = Self::topology();
        if self.rules == SupervisionRules::NoStepLimit {
            topology.max_steps = Some(1_000);
        }
        topology
    }
}

/// What a runner message carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Payload {
    Ready,
    Started {
        attempt: AttemptId,
    },
    Finished {
        attempt: AttemptId,
        node: NodeId,
        outcome: NodeOutcome,
    },
}

/// One runner message on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Msg {
    pub run: u8,
    pub generation: u64,
    /// Stable across the runner's retries of this message.
    pub id: String,
    pub payload: Payload,
}

impl Msg {
    fn new(run: u8, generation: u64, payload: Payload) -> Self {
        let id = match &payload {
            Payload::Ready => "ready".to_owned(),
            Payload::Started { attempt } => format!("started:{attempt}"),
            Payload::Finished { attempt, .. } => format!("finished:{attempt}"),
        };
        Self {
            run,
            generation,
            id,
            payload,
        }
    }

    fn digest(&self) -> Digest {
        Digest::repeat(match &self.payload {
            Payload::Ready => 1,
            Payload::Started { .. } => 2,
            Payload::Finished {
                outcome: NodeOutcome::Ok,
                ..
            } => 3,
            Payload::Finished { .. } => 4,
        })
    }

    fn receipt_name(&self) -> RunnerMessage {
        RunnerMessage {
            runner_epoch: epoch(self.run, self.generation),
            message_id: RunnerMessageId::new(self.id.as_str()),
            payload_digest: self.digest(),
        }
    }
}

impl fmt::Display for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match &self.payload {
            Payload::Ready => "runner.ready -> execution::start_generation".to_owned(),
            Payload::Started { attempt } => {
                format!("node.started({attempt}) -> execution::record_node_started")
            }
            Payload::Finished {
                attempt, outcome, ..
            } => format!(
                "node.{}({attempt}) -> execution::finish_attempt(Runner)",
                if *outcome == NodeOutcome::Ok {
                    "finished"
                } else {
                    "failed"
                }
            ),
        };
        write!(
            f,
            "run-{} gen {} [{}] {what}",
            self.run + 1,
            self.generation,
            self.id
        )
    }
}

/// The server's answer to a runner message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// Accepted; `Some` carries the runner's next instruction.
    Accepted(Option<Dispatch>),
    /// A durable refusal (stored).
    Rejected,
    /// The message id names another payload (not stored).
    Conflict,
    /// The claim or the runner epoch is stale (transient, not stored).
    ClaimLost,
}

impl Reply {
    fn outcome(&self) -> CommandOutcome {
        match self {
            Self::Accepted(_) => CommandOutcome::Accepted,
            Self::Rejected => CommandOutcome::Rejected,
            Self::Conflict => CommandOutcome::Conflict,
            Self::ClaimLost => CommandOutcome::ClaimLost,
        }
    }

    fn digest(&self) -> Digest {
        use core::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        self.hash(&mut hasher);
        Digest::repeat(hasher.finish() as u8)
    }
}

/// Where a runner process is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Spawned; `runner.ready` not yet answered.
    Launched { launched_at: u64 },
    /// Runs `attempt` of `node`; `node.started` answered when `started`.
    Running {
        attempt: AttemptId,
        node: NodeId,
        started: bool,
    },
    /// Told to exit (by its dispatch or by a refusal); it exits cleanly.
    Done,
}

/// A live runner process (the server's child).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Proc {
    pub run: u8,
    pub generation: u64,
    pub stage: Stage,
    /// The message awaiting its reply (re-sent until answered).
    pub outstanding: Option<Msg>,
    /// The server asked to stop its process group for this reason.
    pub stop: Option<StopReason>,
}

/// A runner exit the server has not decided yet (refused: retried later).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PendingExit {
    pub run: u8,
    pub generation: u64,
    pub kind: ExitKind,
}

/// Oracle verdicts and witnesses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Oracle {
    pub stale_write: bool,
    pub left_terminal: bool,
    pub projections_disagree: bool,
    pub attempt_misplaced: bool,
    pub too_many_steps: bool,
    pub over_capacity: bool,
    pub two_runners_for_a_run: bool,
    pub two_launches: bool,
    pub claim_loss_failed: bool,
    pub readmitted_without_progress: bool,
    pub reply_changed: bool,
    pub other_payload_adopted: bool,
    /// A run recorded a second runner epoch while its previous one was not
    /// `Exited` ([`crate::world::second_live_epoch`]).
    pub two_live_epochs: bool,
    /// Per run: the last generation launched, and whether a no-progress exit
    /// is waiting for an explicit resume.
    pub launched: Vec<u64>,
    /// Per run: the last generation whose `runner.ready` started the engine.
    pub readied: Vec<u64>,
    pub no_progress: Vec<bool>,
    pub crashed: Vec<bool>,
    pub terminal: Vec<Option<RunStatus>>,
    // Witnesses.
    pub stale_refused: bool,
    pub resumed_after_crash: bool,
    pub parked_no_progress: bool,
    pub conflict_refused: bool,
}

/// The model state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SupervisionState {
    pub ticks: u8,
    pub now: u64,
    /// Committed aggregates.
    pub runs: Vec<RunAggregate>,
    /// Committed `worker_messages` rows, with the reply body the shell keeps beside them.
    pub receipts: Vec<(StoredRunnerMessage, Reply)>,
    pub server_up: bool,
    pub server_restarted: bool,
    /// The generation whose host authority the server holds per run (memory).
    pub host: Vec<Option<u64>>,
    pub last_kind: Option<WorkKind>,
    pub procs: Vec<Proc>,
    /// Late copies of delivered messages that may still arrive.
    pub late: Vec<Msg>,
    pub exits: Vec<PendingExit>,
    pub crashes: u8,
    pub losses: u8,
    pub reuses: u8,
    pub oracle: Oracle,
}

/// How a runner process ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExitChoice {
    /// Exits 0 after it was told to (or after a refusal).
    Clean,
    /// Crashes (any time).
    Abnormal,
    /// The server's stop took effect.
    Stopped,
    /// The server kills it for missing the startup deadline.
    StartupDeadline,
}

/// One environment step.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SupervisionAction {
    Tick,
    Schedule,
    Deliver {
        msg: Msg,
        reply_lost: bool,
    },
    DeliverLate(Msg),
    Finish {
        run: u8,
        generation: u64,
        ok: bool,
    },
    ReuseId {
        run: u8,
        generation: u64,
    },
    Exit {
        run: u8,
        generation: u64,
        how: ExitChoice,
    },
    DecideExit(PendingExit),
    Expire(u8),
    Recover(u8),
    CrashServer,
    StartServer,
}

impl fmt::Display for SupervisionAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tick => write!(f, "clock advances half a claim lifetime"),
            Self::Schedule => write!(f, "server: scheduler::admit_next + run::admit + spawn"),
            Self::Deliver { msg, reply_lost } => write!(
                f,
                "deliver {msg}{}",
                if *reply_lost { " (reply lost)" } else { "" }
            ),
            Self::DeliverLate(msg) => write!(f, "late duplicate: {msg}"),
            Self::Finish {
                run,
                generation,
                ok,
            } => write!(
                f,
                "runner of run-{} gen {generation} finishes its node {}",
                run + 1,
                if *ok { "ok" } else { "failed" }
            ),
            Self::ReuseId { run, generation } => write!(
                f,
                "runner of run-{} gen {generation} re-sends its message id with the other outcome",
                run + 1
            ),
            Self::Exit {
                run,
                generation,
                how,
            } => write!(
                f,
                "runner of run-{} gen {generation} exits ({how:?}) -> runner::decide_exit",
                run + 1
            ),
            Self::DecideExit(exit) => write!(
                f,
                "server: runner::decide_exit(run-{} gen {}, {:?}) again",
                exit.run + 1,
                exit.generation,
                exit.kind
            ),
            Self::Expire(i) => write!(f, "server: execution::expire_node(run-{})", i + 1),
            Self::Recover(i) => write!(f, "server: runner::on_claim_expired(run-{})", i + 1),
            Self::CrashServer => write!(f, "server crashes (memory and runners lost, facts kept)"),
            Self::StartServer => write!(f, "server starts (orphaned runner records reaped)"),
        }
    }
}

/// The runner epoch of run `run`'s runner in `generation` (unique across runs).
pub fn epoch(run: u8, generation: u64) -> RunnerEpochId {
    RunnerEpochId::new(format!("re-{}.{generation}", run + 1))
}

fn stops(outputs: &[Output]) -> Vec<(RunnerEpochId, StopReason)> {
    outputs
        .iter()
        .filter_map(|output| match output {
            Output::StopRunner {
                runner_epoch,
                reason,
                ..
            } => Some((runner_epoch.clone(), *reason)),
            _ => None,
        })
        .collect()
}

fn spawned(outputs: &[Output]) -> Option<u64> {
    outputs.iter().find_map(|output| match output {
        Output::SpawnRunner { generation, .. } => Some(generation.0),
        _ => None,
    })
}

/// The documented state table and its claim, runner and pause columns.
fn projections_agree(agg: &RunAggregate) -> bool {
    use QueueStatus as Q;
    use RunStatus as R;
    let run = &agg.run;
    let pair = (run.status, run.queue);
    let claimed = run::RunRecord::pair_holds_claim(run.status, run.queue);
    let runner_current = run.runner.as_ref().is_some_and(|r| {
        r.generation == run.lease.generation
            && (pair != (R::Running, Q::Running) || r.status == runner::RunnerStatus::Ready)
    });
    run::RunRecord::pair_is_legal(run.status, run.queue)
        && (run.lease.claim.is_some() == claimed)
        && (!claimed || runner_current)
        && !(run.paused && claimed)
        && !(run.status.is_terminal() && (run.paused || run.park_reason.is_some()))
        && (run.status != R::Waiting || run.waiting_on.is_some())
}

/// An unfinished attempt exists only while the current generation runs it.
fn attempt_in_place(agg: &RunAggregate) -> bool {
    let Some(attempt) = agg.attempt.as_ref().filter(|a| a.status.is_unfinished()) else {
        return true;
    };
    (agg.run.status, agg.run.queue) == (RunStatus::Running, QueueStatus::Running)
        && attempt.status == AttemptStatus::Active
        && attempt.generation == agg.run.lease.generation
}

impl SupervisionModel {
    fn authority(run: u8, generation: u64) -> Authority {
        Authority {
            owner_kind: claim::OwnerKind::Host,
            owner_id: kernel::ids::OwnerId::new(epoch(run, generation).as_str()),
            token_hash: fixtures::token(generation),
            generation: kernel::ids::Generation(generation),
        }
    }

    fn host(state: &SupervisionState, run: u8) -> Option<Authority> {
        state.host[run as usize].map(|g| Self::authority(run, g))
    }

    /// Commits a run transition and performs its stop outputs.
    fn commit(next: &mut SupervisionState, run: u8, transition: Transition<RunAggregate>) {
        for (epoch, reason) in stops(&transition.outputs) {
            for proc in next.procs.iter_mut() {
                if proc.run == run && self::epoch(run, proc.generation) == epoch {
                    proc.stop.get_or_insert(reason);
                }
            }
        }
        if crate::world::second_live_epoch(&next.runs[run as usize], &transition.facts) {
            next.oracle.two_live_epochs = true;
        }
        next.runs[run as usize] = transition.facts.reload();
    }

    fn candidates(&self, state: &SupervisionState) -> Vec<Candidate> {
        state
            .runs
            .iter()
            .filter(|agg| {
                let mut run = agg.run.clone();
                match self.rules {
                    SupervisionRules::ReadmitNoProgress
                        if run.park_reason == Some(ParkReason::RunnerNoProgress) =>
                    {
                        run.park_reason = Some(ParkReason::WorkerCrashed);
                    }
                    SupervisionRules::AdmitIgnoresTerminal if run.status.is_terminal() => {
                        return agg.run.lease.generation.0 < self.max_generation;
                    }
                    SupervisionRules::AdmitOnlyQueued if run.status != RunStatus::Queued => {
                        return false;
                    }
                    SupervisionRules::AdmitBesideLiveRunner => {
                        if let Some(runner) = run.runner.as_mut().filter(|r| r.is_live()) {
                            runner.status = runner::RunnerStatus::Exited(RunnerOutcome::Exited);
                        }
                    }
                    _ => {}
                }
                run.is_admissible() && agg.run.lease.generation.0 < self.max_generation
            })
            .map(|agg| Candidate {
                run_id: agg.run.run_id.clone(),
                kind: WorkKind::Workflow,
                queued_at_ms: agg.run.created_at_ms,
            })
            .collect()
    }

    /// `run::admit` under the rules.
    fn admit(&self, run: u8, agg: &RunAggregate, now: u64) -> Option<Transition<RunAggregate>> {
        let mut agg = agg.clone();
        match self.rules {
            SupervisionRules::ReadmitNoProgress
                if agg.run.park_reason == Some(ParkReason::RunnerNoProgress) =>
            {
                agg.run.park_reason = Some(ParkReason::WorkerCrashed);
            }
            SupervisionRules::AdmitIgnoresTerminal if agg.run.status.is_terminal() => {
                agg.run.status = RunStatus::Running;
                agg.run.queue = QueueStatus::Parked;
                agg.run.park_reason = None;
            }
            SupervisionRules::AdmitReusesGeneration if agg.run.lease.generation.0 > 0 => {
                agg.run.lease.generation.0 -= 1;
            }
            SupervisionRules::AdmitBesideLiveRunner => {
                // Planted bug: the previous runner epoch counts as exited.
                if let Some(runner) = agg.run.runner.as_mut().filter(|r| r.is_live()) {
                    runner.status = runner::RunnerStatus::Exited(RunnerOutcome::Exited);
                }
            }
            _ => {}
        }
        let generation = agg.run.lease.generation.next().0;
        run::admit(
            &agg,
            epoch(run, generation),
            fixtures::token(generation),
            now,
            TTL,
        )
        .ok()
    }

    fn schedule(&self, state: &SupervisionState, next: &mut SupervisionState) -> bool {
        let capacity = Capacity {
            max_workers: if self.rules == SupervisionRules::CapacityIgnored {
                u32::MAX
            } else {
                self.capacity
            },
            live_workers: state.procs.len() as u32,
            pending_launches: 0,
        };
        let admission = scheduler::admit_next(capacity, &self.candidates(state), state.last_kind);
        let mut admitted = false;
        for run_id in admission.admitted {
            let Some(i) = state.runs.iter().position(|agg| agg.run.run_id == run_id) else {
                continue;
            };
            let Some(transition) = self.admit(i as u8, &state.runs[i], state.now) else {
                continue;
            };
            let Some(generation) = spawned(&transition.outputs) else {
                continue;
            };
            let run = i as u8;
            if generation <= next.oracle.launched[i] {
                next.oracle.two_launches = true;
            }
            next.oracle.launched[i] = next.oracle.launched[i].max(generation);
            if next.oracle.no_progress[i] {
                next.oracle.readmitted_without_progress = true;
            }
            Self::commit(next, run, transition);
            next.host[i] = Some(generation);
            next.procs.push(Proc {
                run,
                generation,
                stage: Stage::Launched {
                    launched_at: state.now,
                },
                outstanding: Some(Msg::new(run, generation, Payload::Ready)),
                stop: None,
            });
            admitted = true;
        }
        next.last_kind = admission.last_kind.or(state.last_kind);
        admitted
    }

    /// Executes a runner message with the kernel (no receipt logic).
    fn execute(
        &self,
        state: &SupervisionState,
        msg: &Msg,
    ) -> Result<(Transition<RunAggregate>, Reply), Reply> {
        let i = msg.run as usize;
        let mut agg = state.runs[i].clone();
        let authority = Self::authority(msg.run, msg.generation);
        let epoch = epoch(msg.run, msg.generation);
        let now = state.now;
        if self.rules == SupervisionRules::OwnerOnlyRunnerFencing
            && let Some(claim) = agg.run.lease.claim.as_mut()
            && claim.owner_id == authority.owner_id
        {
            // Planted bug: identity and expiry beyond the owner are not compared.
            claim.expires_at_ms = claim.expires_at_ms.max(now + 1);
        }
        let topology = self.kernel_topology();
        let result = match &msg.payload {
            Payload::Ready => {
                let route_from = agg
                    .steps
                    .last()
                    .filter(|_| {
                        agg.attempt
                            .as_ref()
                            .is_none_or(|a| a.status != AttemptStatus::Abandoned)
                    })
                    .map(|last| {
                        fixtures::result_record(
                            last.attempt_id.as_str(),
                            last.node_id.as_str(),
                            last.outcome,
                            Value::Null,
                        )
                    });
                let attempt = AttemptId::new(format!("a{}.{}", msg.generation, agg.steps.count));
                execution::start_generation(
                    &agg,
                    &topology,
                    &authority,
                    &epoch,
                    route_from.as_ref(),
                    None,
                    attempt,
                    now,
                    TTL,
                )
                .map(|(t, d)| (t, Some(d)))
            }
            Payload::Started { attempt } => execution::record_node_started(
                &agg,
                &authority,
                &epoch,
                attempt,
                Some(now + STEP).filter(|_| self.rules != SupervisionRules::StartedDropsDeadline),
                now,
                TTL,
            )
            .map(|t| (t, None)),
            Payload::Finished {
                attempt,
                node,
                outcome,
            } => {
                let result = NodeResult {
                    outcome: *outcome,
                    record: fixtures::result_record(
                        attempt.as_str(),
                        node.as_str(),
                        *outcome,
                        Value::Null,
                    ),
                };
                let next_attempt =
                    AttemptId::new(format!("a{}.{}", msg.generation, agg.steps.count + 1));
                if self.fused {
                    return match execution::finish_and_start(
                        &agg,
                        &topology,
                        &authority,
                        &epoch,
                        attempt,
                        result,
                        next_attempt,
                        now,
                        TTL,
                    ) {
                        Ok((mut transition, dispatch, _)) => {
                            if self.rules == SupervisionRules::FusedDropsDeadline
                                && let Some(attempt) = transition.facts.attempt.as_mut()
                            {
                                // Planted bug: the deadline is reported, not recorded.
                                attempt.deadline_at_ms = None;
                            }
                            Ok((transition, Reply::Accepted(Some(dispatch))))
                        }
                        Err(Rejection::ClaimLost { .. } | Rejection::StaleRunner) => {
                            Err(Reply::ClaimLost)
                        }
                        Err(_) => Err(Reply::Rejected),
                    };
                }
                execution::finish_attempt(
                    &agg,
                    &topology,
                    Actor::Runner {
                        authority: &authority,
                        runner_epoch: &epoch,
                    },
                    attempt,
                    result,
                    next_attempt,
                    now,
                    TTL,
                )
                .map(|(t, d)| (t, Some(d)))
            }
        };
        match result {
            Ok((transition, dispatch)) => Ok((transition, Reply::Accepted(dispatch))),
            Err(Rejection::ClaimLost { .. } | Rejection::StaleRunner) => Err(Reply::ClaimLost),
            Err(_) => Err(Reply::Rejected),
        }
    }

    /// The shell's runner-message handler: receipts, then the kernel.
    fn handle(&self, state: &SupervisionState, next: &mut SupervisionState, msg: &Msg) -> Reply {
        let name = msg.receipt_name();
        let stored = state.receipts.iter().find(|(row, _)| {
            row.message.runner_epoch == name.runner_epoch
                && row.message.message_id == name.message_id
        });
        let mut decision = match self.rules {
            SupervisionRules::NoRunnerReceipts => RunnerMessageDecision::Execute,
            _ => receipt::decide_runner_message(stored.map(|(row, _)| row), &name),
        };
        if self.rules == SupervisionRules::RunnerFingerprintIgnored
            && decision == RunnerMessageDecision::Conflict
            && let Some((row, _)) = stored
        {
            // Planted bug: the payload digest is not compared.
            decision = RunnerMessageDecision::Adopt(row.clone());
        }
        let other_payload =
            stored.is_some_and(|(row, _)| row.message.payload_digest != name.payload_digest);
        match decision {
            RunnerMessageDecision::Adopt(row) => {
                if other_payload {
                    next.oracle.other_payload_adopted = true;
                }
                state
                    .receipts
                    .iter()
                    .find(|(stored, _)| *stored == row)
                    .map(|(_, reply)| reply.clone())
                    .expect("an adopted row is stored")
            }
            RunnerMessageDecision::Conflict => {
                next.oracle.conflict_refused = true;
                Reply::Conflict
            }
            RunnerMessageDecision::Execute => {
                let pre = &state.runs[msg.run as usize];
                let reply = match self.execute(state, msg) {
                    Ok((transition, reply)) => {
                        let authority = Self::authority(msg.run, msg.generation);
                        let exact = claim::check(&pre.run.lease, Some(&authority), state.now)
                            .is_ok()
                            && pre.run.runner.as_ref().is_some_and(|r| {
                                r.is_live() && r.runner_epoch == epoch(msg.run, msg.generation)
                            });
                        if !exact {
                            next.oracle.stale_write = true;
                        }
                        if other_payload {
                            next.oracle.other_payload_adopted = true;
                        }
                        if matches!(msg.payload, Payload::Ready) {
                            let i = msg.run as usize;
                            if msg.generation <= next.oracle.readied[i] {
                                next.oracle.two_launches = true;
                            }
                            next.oracle.readied[i] = msg.generation;
                            if next.oracle.crashed[i] {
                                next.oracle.resumed_after_crash = true;
                            }
                        }
                        Self::commit(next, msg.run, transition);
                        reply
                    }
                    Err(reply) => {
                        if reply == Reply::ClaimLost && msg.generation < pre.run.lease.generation.0
                        {
                            next.oracle.stale_refused = true;
                        }
                        reply
                    }
                };
                if let Some((row, stored_reply)) = stored
                    && row.message.payload_digest == name.payload_digest
                    && reply.outcome().is_durable()
                    && *stored_reply != reply
                {
                    next.oracle.reply_changed = true;
                }
                let revision = Some(next.runs[msg.run as usize].run.revision);
                if let Some(row) = receipt::record_runner_message(
                    &name,
                    reply.outcome(),
                    revision,
                    reply.digest(),
                    state.now,
                ) {
                    next.receipts.retain(|(stored, _)| {
                        !(stored.message.runner_epoch == row.message.runner_epoch
                            && stored.message.message_id == row.message.message_id)
                    });
                    next.receipts.push((row, reply.clone()));
                    next.receipts.sort_by(|a, b| a.0.cmp(&b.0));
                }
                reply
            }
        }
    }

    /// The runner follows a reply.
    fn follow(&self, proc: &mut Proc, reply: &Reply) {
        let answered_result = proc
            .outstanding
            .as_ref()
            .is_some_and(|msg| matches!(msg.payload, Payload::Finished { .. }));
        proc.outstanding = None;
        match reply {
            Reply::Accepted(Some(Dispatch::RunNode {
                node_id,
                attempt_id,
                ..
            })) => {
                // A fused commit made a static deadline durable with the result.
                let committed = self.fused
                    && answered_result
                    && Self::topology()
                        .node(node_id)
                        .is_some_and(|node| node.timeout != NodeTimeout::Dynamic);
                proc.stage = Stage::Running {
                    attempt: attempt_id.clone(),
                    node: node_id.clone(),
                    started: committed,
                };
                if committed {
                    return;
                }
                proc.outstanding = Some(Msg::new(
                    proc.run,
                    proc.generation,
                    Payload::Started {
                        attempt: attempt_id.clone(),
                    },
                ));
            }
            Reply::Accepted(None) => {
                if let Stage::Running { started, .. } = &mut proc.stage {
                    *started = true;
                }
            }
            Reply::Accepted(Some(Dispatch::Exit { .. }))
            | Reply::Rejected
            | Reply::Conflict
            | Reply::ClaimLost => proc.stage = Stage::Done,
        }
    }

    /// `runner::decide_exit` under the rules; `None` when the kernel refuses.
    fn decide_exit(
        &self,
        state: &SupervisionState,
        exit: &PendingExit,
    ) -> Option<Transition<RunAggregate>> {
        let i = exit.run as usize;
        let pre = &state.runs[i];
        let mut agg = pre.clone();
        if self.rules == SupervisionRules::NoCrashRetryBudget
            && let Some(attempt) = agg.attempt.as_mut()
        {
            attempt.crash_retries = attempt.crash_retries.max(MAX_CRASH_RETRIES);
        }
        let host = state.host[i]
            .filter(|g| *g == exit.generation)
            .map(|g| Self::authority(exit.run, g));
        let mut transition = runner::decide_exit(
            &agg,
            RunnerExit {
                runner_epoch: epoch(exit.run, exit.generation),
                kind: exit.kind,
            },
            host.as_ref(),
            fixtures::control_request(),
            state.now,
            TTL,
        )
        .ok()?;
        let parked = transition.facts.run.queue == QueueStatus::Parked
            && pre.run.queue != QueueStatus::Parked;
        if parked && self.rules == SupervisionRules::ParkKeepsAttempt {
            transition.facts.attempt = pre.attempt.clone();
        }
        if parked && self.rules == SupervisionRules::ExitKeepsClaim {
            transition.facts.run.lease.claim = pre.run.lease.claim.clone();
        }
        Some(transition)
    }

    fn apply_exit(&self, state: &SupervisionState, next: &mut SupervisionState, exit: PendingExit) {
        let i = exit.run as usize;
        let pre = &state.runs[i];
        let Some(transition) = self.decide_exit(state, &exit) else {
            if !next.exits.contains(&exit) {
                next.exits.push(exit);
            }
            return;
        };
        let facts = &transition.facts;
        // A runner that lost its claim exits (it was superseded, stopped for
        // claim loss, or exits cleanly after its claim expired): never a failure.
        let expired = pre
            .run
            .lease
            .claim
            .as_ref()
            .is_none_or(|c| !c.is_live(state.now));
        let lost = pre.run.lease.generation.0 > exit.generation
            || exit.kind
                == (ExitKind::Stopped {
                    reason: StopReason::ClaimLost,
                })
            || (expired && exit.kind == ExitKind::Clean);
        if lost && facts.run.status == RunStatus::Failed && pre.run.status != RunStatus::Failed {
            next.oracle.claim_loss_failed = true;
        }
        if facts.run.park_reason == Some(ParkReason::RunnerNoProgress)
            && pre.run.park_reason != Some(ParkReason::RunnerNoProgress)
        {
            next.oracle.no_progress[i] = true;
            next.oracle.parked_no_progress = true;
        }
        Self::commit(next, exit.run, transition);
        next.exits.retain(|pending| *pending != exit);
    }

    fn check_step(&self, state: &SupervisionState, next: &mut SupervisionState) {
        let topology = Self::topology();
        for (i, agg) in next.runs.iter().enumerate() {
            if let Some(status) = state.oracle.terminal[i] {
                if agg.run.status != status {
                    next.oracle.left_terminal = true;
                }
            } else if agg.run.status.is_terminal() {
                next.oracle.terminal[i] = Some(agg.run.status);
            }
            if !projections_agree(agg) {
                next.oracle.projections_disagree = true;
            }
            if !attempt_in_place(agg) {
                next.oracle.attempt_misplaced = true;
            }
            if real_steps(&topology, agg) > MAX_STEPS {
                next.oracle.too_many_steps = true;
            }
            if agg
                .run
                .error
                .as_ref()
                .is_some_and(|e| e.class == FailureClass::ClaimLost)
            {
                next.oracle.claim_loss_failed = true;
            }
            if next.procs.iter().filter(|p| p.run as usize == i).count() > 1 {
                next.oracle.two_runners_for_a_run = true;
            }
        }
        if next.procs.len() > self.capacity as usize {
            next.oracle.over_capacity = true;
        }
    }

    fn proc(state: &SupervisionState, run: u8, generation: u64) -> Option<usize> {
        state
            .procs
            .iter()
            .position(|p| p.run == run && p.generation == generation)
    }
}

impl Model for SupervisionModel {
    type State = SupervisionState;
    type Action = SupervisionAction;

    fn init_states(&self) -> Vec<SupervisionState> {
        let n = self.runs as usize;
        vec![SupervisionState {
            ticks: 0,
            now: 0,
            runs: (1..=u32::from(self.runs))
                .map(|k| fixtures::reserved(k, 0))
                .collect(),
            receipts: Vec::new(),
            server_up: true,
            server_restarted: false,
            host: vec![None; n],
            last_kind: None,
            procs: Vec::new(),
            late: Vec::new(),
            exits: Vec::new(),
            crashes: 0,
            losses: 0,
            reuses: 0,
            oracle: Oracle {
                launched: vec![0; n],
                readied: vec![0; n],
                no_progress: vec![false; n],
                crashed: vec![false; n],
                terminal: vec![None; n],
                ..Oracle::default()
            },
        }]
    }

    fn actions(&self, state: &SupervisionState, out: &mut Vec<SupervisionAction>) {
        use SupervisionAction as A;
        if state.ticks < self.max_ticks {
            out.push(A::Tick);
        }
        if !state.server_up {
            out.push(A::StartServer);
            return;
        }
        out.push(A::Schedule);
        // A reuse rides on the lost reply it follows; it needs no budget of its own.
        let budget = state.losses + state.crashes < self.max_faults;
        let can_lose = budget && state.losses < self.max_losses;
        let can_crash = budget && state.crashes < self.max_crashes;
        for proc in &state.procs {
            let (run, generation) = (proc.run, proc.generation);
            if let Some(msg) = &proc.outstanding {
                out.push(A::Deliver {
                    msg: msg.clone(),
                    reply_lost: false,
                });
                if can_lose {
                    out.push(A::Deliver {
                        msg: msg.clone(),
                        reply_lost: true,
                    });
                }
                if self.faults
                    && state.reuses < self.max_reuses
                    && matches!(msg.payload, Payload::Finished { .. })
                    && state.receipts.iter().any(|(row, _)| {
                        row.message.message_id.as_str() == msg.id
                            && row.message.runner_epoch == epoch(run, generation)
                    })
                {
                    out.push(A::ReuseId { run, generation });
                }
            }
            if let Stage::Running { started: true, .. } = proc.stage
                && proc.outstanding.is_none()
            {
                out.push(A::Finish {
                    run,
                    generation,
                    ok: true,
                });
                out.push(A::Finish {
                    run,
                    generation,
                    ok: false,
                });
            }
            if proc.stage == Stage::Done {
                out.push(A::Exit {
                    run,
                    generation,
                    how: ExitChoice::Clean,
                });
            }
            if proc.stop.is_some() {
                out.push(A::Exit {
                    run,
                    generation,
                    how: ExitChoice::Stopped,
                });
            }
            if can_crash {
                out.push(A::Exit {
                    run,
                    generation,
                    how: ExitChoice::Abnormal,
                });
            }
            if self.faults
                && let Stage::Launched { launched_at } = proc.stage
                && state.now >= launched_at + STEP
            {
                out.push(A::Exit {
                    run,
                    generation,
                    how: ExitChoice::StartupDeadline,
                });
            }
        }
        for msg in &state.late {
            out.push(A::DeliverLate(msg.clone()));
        }
        for exit in &state.exits {
            out.push(A::DecideExit(exit.clone()));
        }
        for (i, agg) in state.runs.iter().enumerate() {
            if agg.run.status.is_terminal() {
                continue;
            }
            let deadline_passed = agg
                .attempt
                .as_ref()
                .filter(|a| a.status.is_unfinished())
                .and_then(|a| a.deadline_at_ms)
                .is_some_and(|at| at <= state.now);
            if deadline_passed {
                out.push(A::Expire(i as u8));
            }
            let expired = agg
                .run
                .lease
                .claim
                .as_ref()
                .is_some_and(|c| !c.is_live(state.now));
            if expired {
                out.push(A::Recover(i as u8));
            }
        }
        if can_crash {
            out.push(A::CrashServer);
        }
    }

    fn next_state(
        &self,
        state: &SupervisionState,
        action: SupervisionAction,
    ) -> Option<SupervisionState> {
        use SupervisionAction as A;
        let mut next = state.clone();
        match action {
            A::Tick => {
                next.ticks += 1;
                next.now += STEP;
            }
            A::StartServer => {
                next.server_up = true;
                next.server_restarted = true;
                // Startup reaps runner records whose process is gone.
                for (i, agg) in state.runs.iter().enumerate() {
                    if let Some(runner) = agg.run.runner.as_ref().filter(|r| r.is_live()) {
                        let exit = PendingExit {
                            run: i as u8,
                            generation: runner.generation.0,
                            kind: ExitKind::Orphaned,
                        };
                        self.apply_exit(state, &mut next, exit);
                    }
                }
            }
            A::CrashServer => {
                next.crashes += 1;
                next.server_up = false;
                next.host.iter_mut().for_each(|h| *h = None);
                next.procs.clear();
                next.late.clear();
                next.exits.clear();
                next.oracle.crashed.iter_mut().for_each(|c| *c = true);
            }
            A::Schedule => {
                if !self.schedule(state, &mut next) {
                    return None;
                }
            }
            A::Deliver { msg, reply_lost } => {
                let p = Self::proc(state, msg.run, msg.generation)?;
                let reply = self.handle(state, &mut next, &msg);
                if reply_lost {
                    next.losses += 1;
                    next.late.push(msg);
                    next.late.sort();
                } else {
                    self.follow(&mut next.procs[p], &reply);
                }
            }
            A::DeliverLate(msg) => {
                let k = next.late.iter().position(|m| *m == msg)?;
                next.late.remove(k);
                self.handle(state, &mut next, &msg);
            }
            A::Finish {
                run,
                generation,
                ok,
            } => {
                let p = Self::proc(state, run, generation)?;
                let proc = &mut next.procs[p];
                let Stage::Running { attempt, node, .. } = &proc.stage else {
                    return None;
                };
                let outcome = if ok {
                    NodeOutcome::Ok
                } else {
                    NodeOutcome::Failed
                };
                proc.outstanding = Some(Msg::new(
                    run,
                    generation,
                    Payload::Finished {
                        attempt: attempt.clone(),
                        node: node.clone(),
                        outcome,
                    },
                ));
            }
            A::ReuseId { run, generation } => {
                let p = Self::proc(state, run, generation)?;
                let msg = next.procs[p].outstanding.as_mut()?;
                if let Payload::Finished { outcome, .. } = &mut msg.payload {
                    *outcome = if *outcome == NodeOutcome::Ok {
                        NodeOutcome::Failed
                    } else {
                        NodeOutcome::Ok
                    };
                }
                next.reuses += 1;
            }
            A::Exit {
                run,
                generation,
                how,
            } => {
                let p = Self::proc(state, run, generation)?;
                let proc = next.procs.remove(p);
                let kind = match how {
                    ExitChoice::Clean => ExitKind::Clean,
                    ExitChoice::Abnormal => {
                        next.crashes += 1;
                        next.oracle.crashed[run as usize] = true;
                        ExitKind::Abnormal
                    }
                    ExitChoice::Stopped => ExitKind::Stopped { reason: proc.stop? },
                    ExitChoice::StartupDeadline => ExitKind::StartupDeadlineMissed,
                };
                let exit = PendingExit {
                    run,
                    generation,
                    kind,
                };
                self.apply_exit(state, &mut next, exit);
            }
            A::DecideExit(exit) => {
                let before = next.exits.len();
                self.apply_exit(state, &mut next, exit);
                if next.exits.len() == before {
                    return None;
                }
            }
            A::Expire(i) => {
                let agg = &state.runs[i as usize];
                let attempt = agg.attempt.as_ref()?;
                let (transition, _) = execution::expire_node(
                    agg,
                    &self.kernel_topology(),
                    Self::host(state, i).as_ref(),
                    fixtures::control_request(),
                    &attempt.attempt_id,
                    state.now,
                    TTL,
                )
                .ok()?;
                Self::commit(&mut next, i, transition);
            }
            A::Recover(i) => {
                // As the server's claim-expiry wake: a runner record that an
                // earlier server left (its exit pending as `Orphaned`) is
                // decided by `decide_exit(Orphaned)` (the pending exit), so
                // here the server supervises the run's runner, if any.
                let orphan = state.runs[i as usize].run.live_runner().is_some_and(|r| {
                    state.exits.iter().any(|e| {
                        e.run == i && e.generation == r.generation.0 && e.kind == ExitKind::Orphaned
                    })
                });
                if orphan {
                    return None;
                }
                let step = runner::on_claim_expired(
                    &state.runs[i as usize],
                    true,
                    fixtures::control_request(),
                    state.now,
                    TTL,
                )
                .ok()?;
                let Step::Apply(transition) = step else {
                    return None;
                };
                Self::commit(&mut next, i, transition);
            }
        }
        self.check_step(state, &mut next);
        Some(next)
    }

    fn within_boundary(&self, state: &SupervisionState) -> bool {
        let topology = Self::topology();
        state
            .runs
            .iter()
            .all(|agg| real_steps(&topology, agg) <= MAX_STEPS + 1)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = Vec::new();
        if self.faults {
            properties.extend([
                Property::always(
                    "no stale runner write commits",
                    |_, s: &SupervisionState| !s.oracle.stale_write,
                ),
                Property::always(
                    "a run has at most one unfinished attempt, run by its current generation",
                    |_, s: &SupervisionState| !s.oracle.attempt_misplaced,
                ),
                Property::always("steps never exceed maxSteps", |_, s: &SupervisionState| {
                    !s.oracle.too_many_steps
                }),
                Property::always(
                    "a runner runs a node with a static timeout only once its deadline is durable",
                    |_, s: &SupervisionState| deadlines_durable(s),
                ),
                Property::always(
                    "at most one live runner per run",
                    |_, s: &SupervisionState| !s.oracle.two_runners_for_a_run,
                ),
                Property::always(
                    "at most one runner epoch per run that is not Exited",
                    |_, s: &SupervisionState| !s.oracle.two_live_epochs,
                ),
                Property::always(
                    "never more live runners than capacity",
                    |_, s: &SupervisionState| !s.oracle.over_capacity,
                ),
                Property::always(
                    "claim loss never produces a failed run",
                    |_, s: &SupervisionState| !s.oracle.claim_loss_failed,
                ),
                Property::always(
                    "a run without progress since ready is never re-admitted automatically",
                    |_, s: &SupervisionState| !s.oracle.readmitted_without_progress,
                ),
                Property::always(
                    "exactly one engine start (launch command) per generation",
                    |_, s: &SupervisionState| !s.oracle.two_launches,
                ),
                Property::always(
                    "terminal run states are absorbing",
                    |_, s: &SupervisionState| !s.oracle.left_terminal,
                ),
                Property::always(
                    "run, queue, runner and claim projections agree after every crash point",
                    |_, s: &SupervisionState| !s.oracle.projections_disagree,
                ),
                Property::always(
                    "every delivery of one runner message gets the same durable reply",
                    |_, s: &SupervisionState| !s.oracle.reply_changed,
                ),
                Property::always(
                    "another payload under a runner message id is a conflict, never a stored reply",
                    |_, s: &SupervisionState| !s.oracle.other_payload_adopted,
                ),
                Property::sometimes("a run completes", |_, s: &SupervisionState| {
                    s.runs.iter().any(|r| r.run.status == RunStatus::Completed)
                }),
                Property::sometimes("a run fails by routing", |_, s: &SupervisionState| {
                    s.runs.iter().any(|r| {
                        r.run.status == RunStatus::Failed
                            && r.run
                                .error
                                .as_ref()
                                .is_some_and(|e| e.class == FailureClass::NodeFailed)
                    })
                }),
                Property::sometimes("a run fails at maxSteps", |_, s: &SupervisionState| {
                    s.runs.iter().any(|r| {
                        r.run
                            .error
                            .as_ref()
                            .is_some_and(|e| e.reason == run::ReasonKind::MaxSteps)
                    })
                }),
                Property::sometimes("a run times out", |_, s: &SupervisionState| {
                    s.runs.iter().any(|r| r.run.status == RunStatus::TimedOut)
                }),
                Property::sometimes(
                    "a run waits at its checkpoint after a timeout route",
                    |_, s: &SupervisionState| {
                        s.runs.iter().any(|r| r.run.status == RunStatus::Waiting)
                    },
                ),
                Property::sometimes(
                    "a run resumes in a new generation after a crash",
                    |_, s: &SupervisionState| s.oracle.resumed_after_crash,
                ),
                Property::sometimes("a run parks runnerNoProgress", |_, s: &SupervisionState| {
                    s.oracle.parked_no_progress
                }),
                Property::sometimes(
                    "a stale runner write is refused",
                    |_, s: &SupervisionState| s.oracle.stale_refused,
                ),
                Property::sometimes(
                    "a reused runner message id is refused as a conflict",
                    |_, s: &SupervisionState| s.oracle.conflict_refused,
                ),
            ]);
        } else {
            properties.extend([
                Property::eventually(
                    "with no faults, every admitted run reaches a terminal or waiting state",
                    |_, s: &SupervisionState| {
                        s.runs.iter().all(|r| {
                            r.run.status.is_terminal() || r.run.status == RunStatus::Waiting
                        })
                    },
                ),
                Property::sometimes("a run completes", |_, s: &SupervisionState| {
                    s.runs.iter().any(|r| r.run.status == RunStatus::Completed)
                }),
                Property::sometimes(
                    "a run waits at its checkpoint after a timeout route",
                    |_, s: &SupervisionState| {
                        s.runs.iter().any(|r| r.run.status == RunStatus::Waiting)
                    },
                ),
            ]);
        }
        properties
    }
}

impl Summarize for SupervisionModel {
    fn summarize(&self, s: &SupervisionState) -> String {
        let runs: Vec<String> = s
            .runs
            .iter()
            .map(|agg| {
                format!(
                    "{} {:?}/{:?} park={:?} gen={} claim={} steps={} attempt={:?} runner={:?}",
                    agg.run.run_id,
                    agg.run.status,
                    agg.run.queue,
                    agg.run.park_reason,
                    agg.run.lease.generation.0,
                    agg.run.lease.claim.is_some(),
                    agg.steps.count,
                    agg.attempt
                        .as_ref()
                        .map(|a| (a.attempt_id.as_str().to_owned(), a.status)),
                    agg.run.runner.as_ref().map(|r| (r.generation.0, r.status)),
                )
            })
            .collect();
        let procs: Vec<String> = s
            .procs
            .iter()
            .map(|p| format!("run-{} gen {}", p.run + 1, p.generation))
            .collect();
        format!(
            "t={} server_up={} {runs:?}; runner processes {procs:?}",
            s.now, s.server_up
        )
    }
}
