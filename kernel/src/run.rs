//! Run and queue lifecycle: the one state table every run follows.
//!
//! | run         | queue       | claim | runner   |
//! |-------------|-------------|-------|----------|
//! | `queued`    | `queued`    | none  | none     |
//! | `running`   | `starting`  | host  | starting |
//! | `running`   | `running`   | host  | live     |
//! | `running`   | `parked`    | none  | none     |
//! | `waiting`   | `parked`    | none  | none     |
//! | `completed` | `done`      | none  | none     |
//! | `failed`    | `failed`    | none  | none     |
//! | `timed_out` | `failed`    | none  | none     |
//! | `cancelled` | `cancelled` | none  | none     |
//!
//! Invariants:
//! - Every committed run is in exactly one row of the table
//!   ([`RunRecord::pair_is_legal`]); a transition that would leave the table
//!   is a typed rejection, never a partial write.
//! - Terminal states are absorbing: no transition leaves them.
//! - Only `running/starting` and `running/running` hold a claim; every other
//!   pair has none (the `Control` claim a stale cancel takes is released in
//!   the same transition).
//! - The runner column is the runner the pair runs. A runner that a
//!   transition stopped (park, pause, recovery, cancel, a node timeout) stays
//!   recorded as live (`Launching`/`Ready`) until `runner::decide_exit`
//!   records its exit, and until then the run is not admitted again
//!   ([`RunRecord::is_admissible`], [`Rejection::RunnerLive`]): one run has
//!   at most one runner epoch that is not `Exited`.
//! - Pause is one durable flag on the run. It is set only by an explicit pause
//!   or an aborted origin-session turn and cleared only by resume.
//! - Every accepted transition increases the run revision exactly once and
//!   publishes it, except a supervision record that is not run progress (a
//!   resolved node deadline, the exit of a runner that no longer drives the
//!   run), which keeps the revision (`Tx::commit_unversioned`).

use crate::attempt::{AttemptRecord, AttemptStatus, NodeOutcome, StepRecord};
use crate::claim::{self, Authority, ClaimLostReason, ClaimRequest, LeaseFacts};
use crate::decision::{self, DecisionRecord};
use crate::effect::{self, EffectRecord, EffectState};
use crate::ids::{Digest, Generation, NodeId, Revision, RunId, RunnerEpochId, SessionId};
use crate::interaction::{self, InteractionRecord};
use crate::message::{self, MessageKind, MessageRecord, MessageState, TerminalKind, TurnRecord};
use crate::output::{LaunchCommand, Output, RunEvent, StopReason, Transition};
use crate::runner::{RunnerRecord, RunnerStatus};
use crate::steps::StepSummary;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// Durable run status (`runs.status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    Waiting,
    Completed,
    Failed,
    TimedOut,
    Cancelled,
}

impl RunStatus {
    /// Whether the status can never change again.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::TimedOut | Self::Cancelled
        )
    }
}

/// Queue projection (`run_queue.status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueStatus {
    Queued,
    Starting,
    Running,
    Parked,
    Done,
    Failed,
    Cancelled,
}

/// Why a `running/parked` run stopped. Only some reasons let the scheduler
/// claim it again without an explicit resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ParkReason {
    /// The server stopped the runner while shutting down.
    Drained,
    /// Startup recovery made settled or pure work claimable again.
    Recovered,
    /// The runner crashed after it saved progress; the run resumes.
    WorkerCrashed,
    /// An interactive request settled; execution continues from it.
    ResumeReady,
    /// A durable pause.
    Paused,
    /// The runner exited before the run revision advanced after `runner.ready`.
    RunnerNoProgress,
    /// The workflow source no longer matches the saved identity.
    WorkflowSourceChanged,
    /// An effect may have applied without a receipt; it needs explicit review.
    EffectAmbiguous,
    /// The runner missed its startup handshake deadline.
    WorkerTimedOut,
    /// A runner message failed a protocol check (schema, revision, attempt
    /// or idempotency); the check is the `ProtocolRejected` event's.
    ProtocolRejected,
    /// A model-started launch is saved `queued/queued` and waits for
    /// [`activate`] (after the initiating Pi turn settles); the scheduler
    /// never admits it before.
    Held,
}

impl ParkReason {
    /// Whether the scheduler may claim a run parked for this reason without an
    /// explicit resume.
    pub const fn resumes_automatically(self) -> bool {
        matches!(
            self,
            Self::Drained | Self::Recovered | Self::WorkerCrashed | Self::ResumeReady
        )
    }
}

/// Failure classes. A failure in one class is never reported as another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FailureClass {
    ClaimLost,
    WorkerCrashed,
    RunnerNoProgress,
    WorkerTimedOut,
    HostUnavailable,
    SourceChanged,
    EffectAmbiguous,
    NodeFailed,
    ProtocolRejected,
}

/// The specific reason behind a terminal or parked state, for display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReasonKind {
    NodeFailed,
    NodeTimedOut,
    MaxSteps,
    Routing,
    UnproductiveTurns,
    DecisionExpired,
    WorkerCrashed,
    RunnerFailed,
}

/// The durable error of a failed or timed-out run (the message text is
/// stored by the shell beside it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunError {
    pub class: FailureClass,
    pub reason: ReasonKind,
    pub node_id: Option<NodeId>,
}

/// Where a run executes its agent steps (`run_bindings`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "mode")]
pub enum ExecutionMode {
    /// In its origin Pi session, which it reserves while nonterminal.
    Interactive { origin_session: SessionId },
    /// Detached; reserves no Pi session.
    Headless,
}

impl ExecutionMode {
    /// The reserved origin session, if any.
    pub fn origin_session(&self) -> Option<&SessionId> {
        match self {
            Self::Interactive { origin_session } => Some(origin_session),
            Self::Headless => None,
        }
    }
}

/// A continuation's waiting parent.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContinuationOf {
    pub parent_run_id: RunId,
    pub checkpoint: NodeId,
}

/// A restart's lineage: the chain it belongs to (named by its root, the
/// original run) and the restarted run with its terminal fingerprint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartLineage {
    pub root_run_id: RunId,
    pub parent_run_id: RunId,
    /// 1 for the first restart in the chain; restarts of siblings count too.
    pub number: u32,
    /// The [`TerminalOutcome::fingerprint`] of the restarted (parent) run.
    pub parent_fingerprint: Digest,
}

/// How a run relates to others.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Lineage {
    pub continuation_of: Option<ContinuationOf>,
    pub continued_by: Option<RunId>,
    pub restart: Option<RestartLineage>,
}

/// One run's own facts: the `runs`, `run_queue`, `run_bindings` and `leases`
/// rows plus the current `run_workers` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: RunId,
    pub status: RunStatus,
    pub queue: QueueStatus,
    pub paused: bool,
    pub park_reason: Option<ParkReason>,
    pub revision: Revision,
    pub lease: LeaseFacts,
    pub mode: ExecutionMode,
    pub lineage: Lineage,
    pub runner: Option<RunnerRecord>,
    pub error: Option<RunError>,
    /// The checkpoint node a `waiting` run waits on (no unfinished attempt).
    pub waiting_on: Option<NodeId>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub finished_at_ms: Option<u64>,
}

impl RunRecord {
    /// The original run of this run's restart chain: its restart root, or the
    /// run itself when it is not a restart.
    pub fn restart_root(&self) -> &RunId {
        self.lineage
            .restart
            .as_ref()
            .map_or(&self.run_id, |restart| &restart.root_run_id)
    }

    /// Whether (status, queue) is a row of the state table.
    pub const fn pair_is_legal(status: RunStatus, queue: QueueStatus) -> bool {
        use QueueStatus as Q;
        use RunStatus as R;
        matches!(
            (status, queue),
            (R::Queued, Q::Queued)
                | (R::Running, Q::Starting | Q::Running | Q::Parked)
                | (R::Waiting, Q::Parked)
                | (R::Completed, Q::Done)
                | (R::Failed | R::TimedOut, Q::Failed)
                | (R::Cancelled, Q::Cancelled)
        )
    }

    /// Whether the table says this pair holds a claim.
    pub const fn pair_holds_claim(status: RunStatus, queue: QueueStatus) -> bool {
        matches!(
            (status, queue),
            (
                RunStatus::Running,
                QueueStatus::Starting | QueueStatus::Running
            )
        )
    }

    /// Whether the scheduler may admit this run now (capacity aside): it is
    /// not paused, it waits for a runner (`queued/queued`, or
    /// `running/parked` for a reason that resumes automatically), and its
    /// previous runner epoch, if any, has exited.
    pub fn is_admissible(&self) -> bool {
        !self.paused && self.live_runner().is_none() && self.awaits_runner()
    }

    /// The recorded runner epoch while it is not `Exited`: a stopped runner
    /// stays live until `runner::decide_exit` records its exit.
    pub fn live_runner(&self) -> Option<&RunnerRecord> {
        self.runner.as_ref().filter(|runner| runner.is_live())
    }

    /// Whether the pair waits for a new runner: `queued/queued`, or
    /// `running/parked` for a reason that resumes automatically.
    fn awaits_runner(&self) -> bool {
        match (self.status, self.queue) {
            (RunStatus::Queued, QueueStatus::Queued) => self.park_reason != Some(ParkReason::Held),
            (RunStatus::Running, QueueStatus::Parked) => self
                .park_reason
                .is_none_or(ParkReason::resumes_automatically),
            _ => false,
        }
    }
}

/// Everything one lifecycle transition may read or change, loaded by the
/// shell in the write transaction. It is bounded: only unfinished and
/// unsettled records are included, plus the bounded summary of the finished
/// steps that routing reads ([`StepSummary`]), never the step list.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunAggregate {
    pub run: RunRecord,
    /// What routing reads of the finished attempts (carried ones first).
    pub steps: StepSummary,
    /// The one unfinished attempt, if any.
    pub attempt: Option<AttemptRecord>,
    /// Effects that are not applied, rejected or cancelled (ambiguous included).
    pub effects: Vec<EffectRecord>,
    /// The pending interactive request, if any.
    pub interaction: Option<InteractionRecord>,
    /// The pending protected decision on the waiting checkpoint, if any.
    pub decision: Option<DecisionRecord>,
    /// Pending messages of this run.
    pub messages: Vec<MessageRecord>,
    /// Open turns of this run.
    pub turns: Vec<TurnRecord>,
}

impl RunAggregate {
    /// A fresh aggregate for a reserved run.
    pub fn new(run: RunRecord) -> Self {
        Self {
            run,
            steps: StepSummary::default(),
            attempt: None,
            effects: Vec::new(),
            interaction: None,
            decision: None,
            messages: Vec::new(),
            turns: Vec::new(),
        }
    }

    /// What the shell loads again after committing this aggregate: the run's
    /// latest attempt when it is unfinished (`Active`, `Waiting`) or
    /// `Abandoned` (it stays until a new attempt supersedes it: it names the
    /// node the next generation reruns), unsettled effects (ambiguous
    /// included), the pending interaction and decision, pending messages and
    /// open turns. A finished attempt is not reloaded: it lives on as a step.
    #[must_use]
    pub fn reload(mut self) -> Self {
        self.attempt = self.attempt.filter(|attempt| {
            attempt.status.is_unfinished() || attempt.status == AttemptStatus::Abandoned
        });
        self.effects.retain(|effect| {
            matches!(
                effect.state,
                EffectState::Reserved | EffectState::Applying | EffectState::Ambiguous
            )
        });
        self.interaction = self
            .interaction
            .filter(|record| record.status == interaction::InteractionStatus::Pending);
        self.decision = self
            .decision
            .filter(|record| record.status == decision::DecisionStatus::Pending);
        self.messages
            .retain(|message| message.state == MessageState::Pending);
        self.turns
            .retain(|turn| turn.state == message::TurnState::Open);
        self
    }

    /// Whether any effect of the run needs explicit review.
    pub fn has_ambiguous_effect(&self) -> bool {
        self.effects
            .iter()
            .any(|effect| effect.state == EffectState::Ambiguous)
    }

    /// The command a new runner for this run receives: `resume` once the run
    /// has an attempt of its own (unfinished, abandoned or finished) or an own
    /// step; otherwise `continue`, `restart` or `start` from its lineage.
    pub fn launch_command(&self) -> LaunchCommand {
        let started = self.attempt.is_some() || self.steps.has_own_steps();
        if started {
            return LaunchCommand::Resume;
        }
        if let Some(parent) = &self.run.lineage.continuation_of {
            return LaunchCommand::Continue {
                parent_run_id: parent.parent_run_id.clone(),
                checkpoint: parent.checkpoint.clone(),
            };
        }
        if let Some(restart) = &self.run.lineage.restart {
            return LaunchCommand::Restart {
                restarted_run_id: restart.parent_run_id.clone(),
            };
        }
        LaunchCommand::Start
    }
}

/// A lifecycle operation, named in rejections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Operation {
    Admit,
    Ready,
    Park,
    Wait,
    Pause,
    Resume,
    Cancel,
    Finish,
    Restart,
    Continue,
    TakeControl,
    /// Finishing or expiring a node attempt.
    FinishAttempt,
    /// Holding a new run, or releasing a held one.
    Activate,
}

/// Why a lifecycle transition was refused. Nothing changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum Rejection {
    /// The run is terminal; terminal states are absorbing.
    Terminal {
        status: RunStatus,
    },
    /// The operation is not legal from the current pair.
    IllegalTransition {
        operation: Operation,
        status: RunStatus,
        queue: QueueStatus,
    },
    /// The writer's claim is not the live claim.
    ClaimLost {
        reason: ClaimLostReason,
    },
    /// A live claim exists that the caller does not hold; a stale-path
    /// operation must wait for it to expire.
    ClaimHeld {
        expires_at_ms: u64,
    },
    AlreadyPaused,
    /// The run is paused; updates, answers and admissions wait for resume.
    Paused,
    /// Nothing to resume: the run is neither paused nor parked for review.
    NotResumable,
    /// An effect is ambiguous and needs `effect.recover` before the run continues.
    EffectAmbiguous,
    /// The origin session already has a nonterminal interactive run.
    SessionBusy {
        run_id: RunId,
    },
    /// The runner epoch does not match the run's current runner.
    StaleRunner,
    /// Restart rules (terminal, not cancelled, under the limit, new failure).
    RestartRefused {
        reason: RestartRefusal,
    },
    /// The waiting parent already has another continuation.
    AlreadyContinued {
        continuation_run_id: RunId,
    },
    /// The attempt is not the run's current attempt in the state the message
    /// needs (active for a runner, waiting for the control path).
    StaleAttempt,
    /// A new generation found an unfinished attempt; it must have been
    /// finished or abandoned before the run was claimed again.
    UnfinishedAttempt,
    /// The result record does not name the attempt, node and outcome it
    /// is reported for.
    ResultMismatch,
    /// The resume point needs the result record of the step it routes from.
    RouteRecordMissing,
    /// The node is not in the run's stored topology.
    UnknownNode {
        node_id: NodeId,
    },
    /// The attempt's resolved deadline is absent or still in the future.
    DeadlineNotReached {
        deadline_at_ms: Option<u64>,
    },
    /// The attempt already has a resolved deadline; a runner cannot move it.
    DeadlineAlreadyRecorded,
    /// This runner epoch already recorded its one terminal outcome.
    RunnerAlreadyExited,
    /// The run's previous runner epoch has not exited yet (it was told to
    /// stop, or its process has not been reaped). Admission waits until
    /// `runner::decide_exit` records its exit.
    RunnerLive {
        runner_epoch: RunnerEpochId,
    },
    /// The writer's `expectedRevision` is not the run's revision.
    StaleRevision {
        revision: Revision,
    },
}

/// Why a restart was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RestartRefusal {
    NotTerminal,
    Cancelled,
    LimitReached,
    RepeatedFailure,
    Completed,
}

/// A chain allows this many restarts after its original run.
pub const MAX_RESTARTS: u32 = 3;

/// The new run a reservation creates.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NewRun {
    pub run_id: RunId,
    pub mode: ExecutionMode,
}

/// Builds one transition: mutations on a copy of the aggregate plus outputs,
/// committed with exactly one revision increase.
#[derive(Debug)]
pub(crate) struct Tx {
    pub(crate) agg: RunAggregate,
    pub(crate) outputs: Vec<Output>,
    now_ms: u64,
}

impl Tx {
    pub(crate) fn begin(agg: &RunAggregate, now_ms: u64) -> Self {
        Self {
            agg: agg.clone(),
            outputs: Vec::new(),
            now_ms,
        }
    }

    pub(crate) const fn now_ms(&self) -> u64 {
        self.now_ms
    }

    pub(crate) fn event(&mut self, event: RunEvent) {
        let run_id = self.agg.run.run_id.clone();
        self.outputs.push(Output::Event { run_id, event });
    }

    pub(crate) fn output(&mut self, output: Output) {
        self.outputs.push(output);
    }

    pub(crate) fn publish_session(&mut self) {
        if let Some(session_id) = self.agg.run.mode.origin_session().cloned() {
            let output = Output::PublishSession { session_id };
            if !self.outputs.contains(&output) {
                self.outputs.push(output);
            }
        }
    }

    /// Finishes the transition: one revision increase and one publish.
    pub(crate) fn commit(mut self) -> Transition<RunAggregate> {
        let run = &mut self.agg.run;
        run.revision = run.revision.next();
        run.updated_at_ms = self.now_ms;
        let revision = run.revision;
        let run_id = run.run_id.clone();
        self.outputs.push(Output::PublishRun { run_id, revision });
        self.finish()
    }

    /// Finishes a transition that records supervision facts which are not run
    /// progress (a resolved node deadline, a claim heartbeat, the exit of a
    /// runner that no longer drives the run): no revision increase and no
    /// publish, so `runnerNoProgress` still sees the revision the runner
    /// became ready at.
    pub(crate) fn commit_unversioned(self) -> Transition<RunAggregate> {
        self.finish()
    }

    fn finish(self) -> Transition<RunAggregate> {
        let run = &self.agg.run;
        debug_assert!(RunRecord::pair_is_legal(run.status, run.queue));
        debug_assert!(
            RunRecord::pair_holds_claim(run.status, run.queue) || run.lease.claim.is_none(),
            "a pair without a claim must not keep one"
        );
        Transition {
            facts: self.agg,
            outputs: self.outputs,
        }
    }
}

pub(crate) fn illegal(operation: Operation, run: &RunRecord) -> Rejection {
    if run.status.is_terminal() {
        return Rejection::Terminal { status: run.status };
    }
    Rejection::IllegalTransition {
        operation,
        status: run.status,
        queue: run.queue,
    }
}

/// Reserves a new run `queued/queued`. An interactive run needs its origin
/// session free of other nonterminal interactive runs (`session_runs`).
pub fn reserve(
    new_run: NewRun,
    lineage: Lineage,
    session_runs: &[RunId],
    now_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    if new_run.mode.origin_session().is_some() {
        let parent = lineage
            .continuation_of
            .as_ref()
            .map(|parent| &parent.parent_run_id);
        if let Some(busy) = session_runs.iter().find(|run_id| Some(*run_id) != parent) {
            return Err(Rejection::SessionBusy {
                run_id: busy.clone(),
            });
        }
    }
    let run = RunRecord {
        run_id: new_run.run_id,
        status: RunStatus::Queued,
        queue: QueueStatus::Queued,
        paused: false,
        park_reason: None,
        revision: Revision(0),
        lease: LeaseFacts::default(),
        mode: new_run.mode,
        lineage,
        runner: None,
        error: None,
        waiting_on: None,
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        finished_at_ms: None,
    };
    let mut tx = Tx::begin(&RunAggregate::new(run), now_ms);
    tx.event(RunEvent::Reserved);
    tx.output(Output::Schedule);
    tx.publish_session();
    Ok(tx.commit())
}

/// [`reserve`] for a held launch: the same run `queued/queued`, parked
/// [`ParkReason::Held`] and not scheduled, until [`activate`] releases it.
/// Only an interactive run (one with an origin session) can be held.
pub fn reserve_held(
    new_run: NewRun,
    lineage: Lineage,
    session_runs: &[RunId],
    now_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    holdable(&new_run)?;
    reserve(new_run, lineage, session_runs, now_ms).map(held)
}

/// Only an interactive run (one with an origin session) can be held: a
/// held run waits for its session's turn to settle.
fn holdable(new_run: &NewRun) -> Result<(), Rejection> {
    match new_run.mode.origin_session() {
        Some(_) => Ok(()),
        None => Err(Rejection::IllegalTransition {
            operation: Operation::Activate,
            status: RunStatus::Queued,
            queue: QueueStatus::Queued,
        }),
    }
}

/// A reservation held: parked [`ParkReason::Held`] and not scheduled.
fn held(mut reserved: Transition<RunAggregate>) -> Transition<RunAggregate> {
    reserved.facts.run.park_reason = Some(ParkReason::Held);
    reserved
        .outputs
        .retain(|output| *output != Output::Schedule);
    reserved
}

/// `run.activate`: a held launch becomes an ordinary queued run and the
/// scheduler may admit it. Anything but a held `queued/queued` run is
/// refused (a repeat after activation is the command receipt's to adopt).
pub fn activate(agg: &RunAggregate, now_ms: u64) -> Result<Transition<RunAggregate>, Rejection> {
    let run = &agg.run;
    if run.status.is_terminal() {
        return Err(Rejection::Terminal { status: run.status });
    }
    let held = (run.status, run.queue) == (RunStatus::Queued, QueueStatus::Queued)
        && run.park_reason == Some(ParkReason::Held);
    if !held {
        return Err(illegal(Operation::Activate, run));
    }
    let mut tx = Tx::begin(agg, now_ms);
    tx.agg.run.park_reason = None;
    tx.output(Output::Schedule);
    tx.publish_session();
    Ok(tx.commit())
}

/// The scheduler admits an eligible run: it takes a new host claim (a new
/// generation) and records the runner epoch before the shell spawns it. A run
/// whose previous runner epoch is still live (stopped by a park, a pause or
/// recovery, but its exit not yet recorded) is refused with
/// [`Rejection::RunnerLive`].
pub fn admit(
    agg: &RunAggregate,
    runner_epoch: RunnerEpochId,
    token_hash: Digest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let run = &agg.run;
    if run.paused && !run.status.is_terminal() {
        return Err(Rejection::Paused);
    }
    if let Some(runner) = run.live_runner().filter(|_| run.awaits_runner()) {
        return Err(Rejection::RunnerLive {
            runner_epoch: runner.runner_epoch.clone(),
        });
    }
    if !run.is_admissible() {
        return Err(illegal(Operation::Admit, run));
    }
    if agg.has_ambiguous_effect() {
        return Err(Rejection::EffectAmbiguous);
    }
    let request = ClaimRequest {
        owner_kind: claim::OwnerKind::Host,
        owner_id: crate::ids::OwnerId::new(runner_epoch.as_str()),
        token_hash,
    };
    let lease = claim::acquire(&run.lease, request, now_ms, ttl_ms).map_err(
        |claim::AcquireRejection::StillHeld { expires_at_ms }| Rejection::ClaimHeld {
            expires_at_ms,
        },
    )?;
    let generation = lease.generation;
    let command = agg.launch_command();
    let mut tx = Tx::begin(agg, now_ms);
    let run = &mut tx.agg.run;
    run.status = RunStatus::Running;
    run.queue = QueueStatus::Starting;
    run.park_reason = None;
    run.lease = lease;
    run.runner = Some(RunnerRecord {
        runner_epoch: runner_epoch.clone(),
        generation,
        status: RunnerStatus::Launching,
        launched_at_ms: now_ms,
        ready_at_ms: None,
        ready_revision: None,
        finished_at_ms: None,
    });
    let run_id = run.run_id.clone();
    tx.event(RunEvent::Admitted { generation });
    tx.output(Output::SpawnRunner {
        run_id,
        generation,
        runner_epoch,
        command,
    });
    Ok(tx.commit())
}

/// Verifies a runner-scoped write: the runner epoch is current and the
/// presented authority is the live claim, which is renewed.
pub(crate) fn authorize_runner(
    tx: &mut Tx,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    ttl_ms: u64,
) -> Result<(), Rejection> {
    let now_ms = tx.now_ms();
    let run = &mut tx.agg.run;
    let lease = claim::check_and_renew(&run.lease, Some(authority), now_ms, ttl_ms)
        .map_err(|reason| Rejection::ClaimLost { reason })?;
    let current = run.runner.as_ref().filter(|runner| runner.is_live());
    if current.is_none_or(|runner| &runner.runner_epoch != runner_epoch) {
        return Err(Rejection::StaleRunner);
    }
    run.lease = lease;
    Ok(())
}

/// `runner.ready`: the runner verified its sources and loaded the workflow.
/// The caller (execution) dispatches the first node in the same transition
/// and then records [`RunnerRecord::ready_revision`].
pub(crate) fn mark_ready(
    tx: &mut Tx,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    ttl_ms: u64,
) -> Result<(), Rejection> {
    let run = &tx.agg.run;
    if (run.status, run.queue) != (RunStatus::Running, QueueStatus::Starting) {
        return Err(illegal(Operation::Ready, run));
    }
    authorize_runner(tx, authority, runner_epoch, ttl_ms)?;
    let now_ms = tx.now_ms();
    let run = &mut tx.agg.run;
    run.queue = QueueStatus::Running;
    if let Some(runner) = run.runner.as_mut() {
        runner.status = RunnerStatus::Ready;
        runner.ready_at_ms = Some(now_ms);
    }
    let runner_epoch = runner_epoch.clone();
    tx.event(RunEvent::RunnerReady { runner_epoch });
    Ok(())
}

/// `running/*` → `running/parked` at a durable boundary: the unfinished
/// attempt is abandoned (not a step), the exact claim is released, applying
/// effects become ambiguous.
pub(crate) fn park_in(
    tx: &mut Tx,
    authority: &Authority,
    reason: ParkReason,
) -> Result<(), Rejection> {
    let now_ms = tx.now_ms();
    let run = &tx.agg.run;
    if !RunRecord::pair_holds_claim(run.status, run.queue) {
        return Err(illegal(Operation::Park, run));
    }
    let lease = claim::release(&run.lease, authority, now_ms)
        .map_err(|reason| Rejection::ClaimLost { reason })?;
    abandon_attempt(tx);
    let mut ambiguous = false;
    for effect in &mut tx.agg.effects {
        let next = effect::on_runner_lost(effect);
        ambiguous |= next.state == EffectState::Ambiguous && effect.state != EffectState::Ambiguous;
        *effect = next;
    }
    let run = &mut tx.agg.run;
    run.queue = QueueStatus::Parked;
    run.lease = lease;
    let reason = if ambiguous || tx.agg.has_ambiguous_effect() {
        ParkReason::EffectAmbiguous
    } else {
        reason
    };
    tx.agg.run.park_reason = Some(reason);
    if let Some(runner) = tx.agg.run.runner.clone().filter(RunnerRecord::is_live) {
        let run_id = tx.agg.run.run_id.clone();
        tx.output(Output::StopRunner {
            run_id,
            runner_epoch: runner.runner_epoch,
            reason: StopReason::Parked,
        });
    }
    tx.event(RunEvent::Parked { reason });
    Ok(())
}

/// Parks a running run (server drain, recovery, runner exit decisions).
pub fn park(
    agg: &RunAggregate,
    authority: &Authority,
    reason: ParkReason,
    now_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    park_in(&mut tx, authority, reason)?;
    Ok(tx.commit())
}

/// An active attempt whose runner stops before it finishes is abandoned: it is
/// not a step, and the next generation reruns the node with a new attempt.
pub(crate) fn abandon_attempt(tx: &mut Tx) {
    let now_ms = tx.now_ms();
    if let Some(attempt) = tx
        .agg
        .attempt
        .as_mut()
        .filter(|a| a.status == AttemptStatus::Active)
    {
        attempt.status = AttemptStatus::Abandoned;
        attempt.finished_at_ms = Some(now_ms);
    }
}

/// `running/running` → `waiting/parked`: a checkpoint finished (`checkpoint`
/// is set) or an interactive request now waits in the origin session. The
/// runner's claim is released; the runner exits on its own after the reply.
pub(crate) fn wait_in(
    tx: &mut Tx,
    authority: &Authority,
    node_id: NodeId,
    is_checkpoint: bool,
) -> Result<(), Rejection> {
    let now_ms = tx.now_ms();
    let run = &tx.agg.run;
    if (run.status, run.queue) != (RunStatus::Running, QueueStatus::Running) {
        return Err(illegal(Operation::Wait, run));
    }
    let lease = claim::release(&run.lease, authority, now_ms)
        .map_err(|reason| Rejection::ClaimLost { reason })?;
    let run = &mut tx.agg.run;
    run.status = RunStatus::Waiting;
    run.queue = QueueStatus::Parked;
    run.park_reason = None;
    run.lease = lease;
    run.waiting_on = is_checkpoint.then(|| node_id.clone());
    tx.event(RunEvent::Waiting { node_id });
    Ok(())
}

/// The authority a server-side control path uses on a run without a live
/// runner: a new `Control` claim that proves the old one is absent or expired.
pub(crate) fn take_control_in(
    tx: &mut Tx,
    control: ClaimRequest,
    ttl_ms: u64,
) -> Result<Authority, Rejection> {
    let now_ms = tx.now_ms();
    let lease = claim::acquire(&tx.agg.run.lease, control, now_ms, ttl_ms).map_err(
        |claim::AcquireRejection::StillHeld { expires_at_ms }| Rejection::ClaimHeld {
            expires_at_ms,
        },
    )?;
    let authority = Authority::of(lease.claim.as_ref().expect("acquire always sets a claim"));
    if let Some(runner) = tx.agg.run.runner.as_ref().filter(|runner| runner.is_live()) {
        // A runner whose claim expired has lost its authority: recovery hands the
        // run to a new generation. This is a handoff, never a failure.
        let run_id = tx.agg.run.run_id.clone();
        let runner_epoch = runner.runner_epoch.clone();
        tx.output(Output::StopRunner {
            run_id,
            runner_epoch,
            reason: StopReason::ClaimLost,
        });
    }
    let generation = lease.generation;
    tx.agg.run.lease = lease;
    tx.event(RunEvent::ControlClaimed { generation });
    Ok(authority)
}

/// How the server presents authority for a client command on a run: its
/// in-memory host authority for the live runner when it has one, otherwise
/// a new control claim (allowed only when the old claim is absent or expired).
pub(crate) fn command_authority(
    tx: &mut Tx,
    host: Option<&Authority>,
    control: ClaimRequest,
    ttl_ms: u64,
) -> Result<Authority, Rejection> {
    let now_ms = tx.now_ms();
    match tx.agg.run.lease.live_claim(now_ms) {
        Some(live) => {
            let live = Authority::of(live);
            match host {
                Some(host) if *host == live => Ok(live),
                Some(host) => {
                    let reason = claim::check(&tx.agg.run.lease, Some(host), now_ms)
                        .err()
                        .unwrap_or(ClaimLostReason::MissingAuthority);
                    Err(Rejection::ClaimLost { reason })
                }
                None => Err(Rejection::ClaimHeld {
                    expires_at_ms: tx
                        .agg
                        .run
                        .lease
                        .claim
                        .as_ref()
                        .map_or(0, |c| c.expires_at_ms),
                }),
            }
        }
        None => take_control_in(tx, control, ttl_ms),
    }
}

/// An explicit pause: one transaction sets the pause, parks the queue,
/// releases the exact claim and cancels pending step messages. The shell
/// then stops the fenced runner.
pub fn pause(
    agg: &RunAggregate,
    host: Option<&Authority>,
    control: ClaimRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let run = &agg.run;
    if run.status.is_terminal() {
        return Err(Rejection::Terminal { status: run.status });
    }
    if run.paused {
        return Err(Rejection::AlreadyPaused);
    }
    let mut tx = Tx::begin(agg, now_ms);
    if RunRecord::pair_holds_claim(run.status, run.queue) {
        let authority = command_authority(&mut tx, host, control, ttl_ms)?;
        if let Some(runner) = tx.agg.run.runner.clone().filter(RunnerRecord::is_live) {
            let run_id = tx.agg.run.run_id.clone();
            tx.output(Output::StopRunner {
                run_id,
                runner_epoch: runner.runner_epoch,
                reason: StopReason::Paused,
            });
        }
        park_in(&mut tx, &authority, ParkReason::Paused)?;
        // park_in already asked to stop the runner for parking; keep one stop.
        dedup_stop(&mut tx.outputs);
    }
    set_pause_in(&mut tx);
    Ok(tx.commit())
}

/// Keeps only the first `StopRunner` output: one process group is stopped once,
/// for the most specific reason.
pub(crate) fn dedup_stop(outputs: &mut Vec<Output>) {
    let mut seen = false;
    outputs.retain(|output| {
        if matches!(output, Output::StopRunner { .. }) {
            let keep = !seen;
            seen = true;
            keep
        } else {
            true
        }
    });
}

/// Sets the durable pause and cancels pending step messages. Shared by the
/// explicit pause and the aborted origin-session turn.
pub(crate) fn set_pause_in(tx: &mut Tx) {
    tx.agg.run.paused = true;
    // Paused time does not consume an interactive node timeout.
    let now_ms = tx.now_ms();
    if let Some(record) = tx.agg.interaction.as_mut() {
        record.clock = record.clock.stopped(now_ms);
    }
    if tx.agg.run.queue == QueueStatus::Parked && tx.agg.run.status == RunStatus::Running {
        tx.agg.run.park_reason.get_or_insert(ParkReason::Paused);
    }
    let mut changed = false;
    for message in &mut tx.agg.messages {
        let next = message::on_pause(message);
        changed |= next != *message;
        *message = next;
    }
    tx.event(RunEvent::Paused);
    if changed || tx.agg.interaction.is_some() {
        tx.publish_session();
    }
}

/// What a resume must also do to the origin session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeIds {
    /// The id for the one `resumed` step message, used only when the run
    /// waits on a submitted-output interaction.
    pub resumed_message_id: crate::ids::MessageId,
    /// The session order for that message.
    pub message_order: u64,
}

/// Explicit resume: clears the durable pause, or releases a run parked for
/// review (`runnerNoProgress`, `workflowSourceChanged`, startup timeout).
/// A paused submitted-output interaction is presented again with exactly one
/// `resumed` step message; a protected decision is unchanged (no new message,
/// no new revision of its request), and its deadline wake is armed again.
pub fn resume(
    agg: &RunAggregate,
    ids: ResumeIds,
    now_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let run = &agg.run;
    if run.status.is_terminal() {
        return Err(Rejection::Terminal { status: run.status });
    }
    let review = run.queue == QueueStatus::Parked
        && run.status == RunStatus::Running
        && run
            .park_reason
            .is_some_and(|reason| !reason.resumes_automatically());
    if !run.paused && !review {
        return Err(Rejection::NotResumable);
    }
    if agg.has_ambiguous_effect() {
        return Err(Rejection::EffectAmbiguous);
    }
    let mut tx = Tx::begin(agg, now_ms);
    let was_paused = tx.agg.run.paused;
    tx.agg.run.paused = false;
    if tx.agg.run.status == RunStatus::Running && tx.agg.run.queue == QueueStatus::Parked {
        tx.agg.run.park_reason = None;
        tx.output(Output::Schedule);
    }
    if was_paused {
        present_again_in(&mut tx, ids);
        rearm_decision_deadline_in(&mut tx);
    }
    tx.event(RunEvent::Resumed);
    Ok(tx.commit())
}

/// A paused decision's deadline wake did nothing; resume arms it again (at
/// once when the deadline passed meanwhile). The decision itself, its
/// message and its request are unchanged.
fn rearm_decision_deadline_in(tx: &mut Tx) {
    let deadline = tx
        .agg
        .decision
        .as_ref()
        .filter(|decision| decision.status == decision::DecisionStatus::Pending)
        .and_then(|decision| decision.deadline_at_ms);
    if let Some(at_ms) = deadline {
        let run_id = tx.agg.run.run_id.clone();
        tx.output(Output::Wake {
            run_id,
            at_ms,
            reason: crate::output::WakeReason::DecisionDeadline,
        });
    }
}

fn present_again_in(tx: &mut Tx, ids: ResumeIds) {
    let Some(interaction) = tx.agg.interaction.as_mut() else {
        return;
    };
    if interaction.status != interaction::InteractionStatus::Pending
        || interaction.kind != interaction::InteractionKind::SubmittedOutput
    {
        return;
    }
    interaction.revision += 1;
    let step = MessageKind::Step {
        interaction_id: interaction.interaction_id.clone(),
        reason: message::StepReason::Resumed,
    };
    // A headless request has no session to present it in.
    let Some(session_id) = interaction.target_session.clone() else {
        return;
    };
    let record = MessageRecord {
        message_id: ids.resumed_message_id,
        session_id,
        run_id: interaction.run_id.clone(),
        kind: step,
        order: ids.message_order,
        state: MessageState::Pending,
        entry_id: None,
        created_at_ms: tx.now_ms(),
    };
    // Pause already cancelled pending step messages; at most one pending step remains.
    debug_assert!(!tx.agg.messages.iter().any(|m| m.state == MessageState::Pending
        && matches!(m.kind, MessageKind::Step { .. })));
    tx.agg.messages.push(record);
    tx.publish_session();
}

/// Cancellation. Against a live claim it needs the server's exact authority;
/// against an expired or absent claim it first takes a new control claim. In
/// one transaction: terminal `cancelled`, the unfinished attempt cancelled,
/// pending effects cancelled and applying ones ambiguous, the interaction and
/// decision cancelled, pending step and decision messages cancelled, open
/// turns lost, claim released.
pub fn cancel(
    agg: &RunAggregate,
    host: Option<&Authority>,
    control: ClaimRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    if agg.run.status.is_terminal() {
        return Err(Rejection::Terminal {
            status: agg.run.status,
        });
    }
    let mut tx = Tx::begin(agg, now_ms);
    let authority = if RunRecord::pair_holds_claim(agg.run.status, agg.run.queue) {
        Some(command_authority(&mut tx, host, control, ttl_ms)?)
    } else {
        None
    };
    if let Some(runner) = tx.agg.run.runner.clone().filter(RunnerRecord::is_live) {
        let run_id = tx.agg.run.run_id.clone();
        tx.output(Output::StopRunner {
            run_id,
            runner_epoch: runner.runner_epoch,
            reason: StopReason::Cancelled,
        });
    }
    dedup_stop(&mut tx.outputs);
    for effect in &mut tx.agg.effects {
        *effect = effect::on_run_cancelled(effect);
    }
    if let Some(decision) = tx.agg.decision.as_mut() {
        *decision = decision::on_run_cancelled(decision);
    }
    finish_in(&mut tx, authority.as_ref(), Terminal::Cancelled)?;
    Ok(tx.commit())
}

/// How a run ends.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "terminal")]
pub enum Terminal {
    Completed,
    Failed { error: RunError },
    TimedOut { error: RunError },
    Cancelled,
}

impl Terminal {
    const fn kind(&self) -> TerminalKind {
        match self {
            Self::Completed => TerminalKind::Completed,
            Self::Failed { .. } => TerminalKind::Failed,
            Self::TimedOut { .. } => TerminalKind::TimedOut,
            Self::Cancelled => TerminalKind::Cancelled,
        }
    }
}

/// Makes the run terminal with the given authority (the runner's claim, a
/// control claim, or none for a run that holds no claim, such as a waiting
/// run settled by the server's control path).
pub(crate) fn finish_in(
    tx: &mut Tx,
    authority: Option<&Authority>,
    terminal: Terminal,
) -> Result<(), Rejection> {
    let now_ms = tx.now_ms();
    let run = &tx.agg.run;
    if run.status.is_terminal() {
        return Err(Rejection::Terminal { status: run.status });
    }
    let lease = match (&run.lease.claim, authority) {
        // An authority is checked against the claim, also when there is none:
        // a runner's authority never ends a run that holds no claim.
        (_, Some(authority)) => claim::release(&run.lease, authority, now_ms)
            .map_err(|reason| Rejection::ClaimLost { reason })?,
        (Some(claim), None) if claim.is_live(now_ms) => {
            return Err(Rejection::ClaimHeld {
                expires_at_ms: claim.expires_at_ms,
            });
        }
        // An expired claim still names its owner: ending the run needs a
        // control claim first, so the handoff is a new generation.
        (Some(_), None) => {
            return Err(Rejection::ClaimLost {
                reason: ClaimLostReason::MissingAuthority,
            });
        }
        _ => LeaseFacts {
            claim: None,
            generation: run.lease.generation,
        },
    };
    let kind = terminal.kind();
    let (status, queue, event) = match terminal {
        Terminal::Completed => (RunStatus::Completed, QueueStatus::Done, RunEvent::Completed),
        Terminal::Failed { error } => {
            let event = RunEvent::Failed { class: error.class };
            tx.agg.run.error = Some(error);
            (RunStatus::Failed, QueueStatus::Failed, event)
        }
        Terminal::TimedOut { error } => {
            tx.agg.run.error = Some(error);
            (RunStatus::TimedOut, QueueStatus::Failed, RunEvent::TimedOut)
        }
        Terminal::Cancelled => (
            RunStatus::Cancelled,
            QueueStatus::Cancelled,
            RunEvent::Cancelled,
        ),
    };
    if let Some(attempt) = tx.agg.attempt.as_mut().filter(|a| a.status.is_unfinished()) {
        let outcome = if kind == TerminalKind::TimedOut {
            NodeOutcome::TimedOut
        } else {
            NodeOutcome::Cancelled
        };
        attempt.status = AttemptStatus::Finished(outcome);
        attempt.finished_at_ms = Some(now_ms);
        let step = StepRecord {
            attempt_id: attempt.attempt_id.clone(),
            node_id: attempt.node_id.clone(),
            outcome,
            carried: false,
        };
        tx.agg.steps.record(step);
    }
    if let Some(interaction) = tx.agg.interaction.as_mut() {
        *interaction = interaction::on_run_terminal(interaction);
    }
    for effect in &mut tx.agg.effects {
        *effect = effect::on_runner_lost(effect);
    }
    for message in &mut tx.agg.messages {
        *message = message::on_run_terminal(message, kind);
    }
    for turn in &mut tx.agg.turns {
        *turn = message::on_run_terminal_turn(turn, now_ms);
    }
    let run = &mut tx.agg.run;
    run.status = status;
    run.queue = queue;
    run.lease = lease;
    run.paused = false;
    run.park_reason = None;
    run.finished_at_ms = Some(now_ms);
    let run_id = run.run_id.clone();
    tx.event(event);
    tx.output(Output::BuildTerminalMessage { run_id });
    tx.output(Output::Schedule);
    tx.output(Output::RequestRetentionSweep);
    tx.publish_session();
    Ok(())
}

/// Ends a run as completed, failed or timed out under `authority`.
pub fn finish(
    agg: &RunAggregate,
    authority: Option<&Authority>,
    terminal: Terminal,
    now_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    finish_in(&mut tx, authority, terminal)?;
    Ok(tx.commit())
}

/// A terminal run's outcome as the repeated-failure rule compares it: the
/// workflow identity and revision, the exact input, the terminal state, the
/// canonical result or error, and the terminal reason. It holds no
/// timestamps and no run ids, so two runs that ended the same way have the
/// same fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TerminalOutcome<'a> {
    /// The workflow reference the run was started with.
    pub workflow_ref: &'a str,
    /// The compiled definition's digest (the workflow's revision).
    pub definition_digest: &'a str,
    /// Digest of the run's exact (normalized) input.
    pub input_digest: Digest,
    pub status: RunStatus,
    /// The terminal error (class, reason and node), if the run failed or
    /// timed out.
    pub error: Option<&'a RunError>,
    /// Digest of the canonical final output, if the run recorded one.
    pub output_digest: Option<Digest>,
}

impl TerminalOutcome<'_> {
    /// SHA-256 over the outcome's fields, each length-prefixed in a fixed
    /// order (enums by their serde names), so equal outcomes and only equal
    /// outcomes share a fingerprint (up to a hash collision).
    pub fn fingerprint(&self) -> Digest {
        use sha2::Digest as _;
        fn name<T: Serialize>(value: &T) -> alloc::string::String {
            serde_json::to_string(value).unwrap_or_default()
        }
        let mut hasher = sha2::Sha256::new();
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        field(b"pi-workflows.terminal-outcome.v1");
        field(self.workflow_ref.as_bytes());
        field(self.definition_digest.as_bytes());
        field(&self.input_digest.0);
        field(name(&self.status).as_bytes());
        match self.error {
            Some(error) => {
                field(name(&error.class).as_bytes());
                field(name(&error.reason).as_bytes());
                field(error.node_id.as_ref().map_or("", NodeId::as_str).as_bytes());
            }
            None => field(b"no error"),
        }
        match &self.output_digest {
            Some(digest) => field(&digest.0),
            None => field(b"no output"),
        }
        Digest(hasher.finalize().into())
    }
}

/// The restart rule, the one both the `run.restart` command and the view's
/// `restart` control use. `chain` is every restart recorded in `run`'s chain
/// (the runs whose restart lineage names [`RunRecord::restart_root`],
/// siblings included; entries of other chains are ignored). A run may be
/// restarted when it failed or timed out (not completed, not explicitly
/// cancelled), its chain has fewer than [`MAX_RESTARTS`] restarts after the
/// original run, and no run of the chain with the same terminal
/// `fingerprint` was restarted before.
pub fn restart_allowed(
    run: &RunRecord,
    fingerprint: &Digest,
    chain: &[RestartLineage],
) -> Result<(), RestartRefusal> {
    restart_state_allows(run)?;
    let root = run.restart_root();
    let mut restarts = chain.iter().filter(|restart| restart.root_run_id == *root);
    if restarts
        .clone()
        .any(|restart| restart.parent_fingerprint == *fingerprint)
    {
        return Err(RestartRefusal::RepeatedFailure);
    }
    if restarts.nth(MAX_RESTARTS as usize - 1).is_some() {
        return Err(RestartRefusal::LimitReached);
    }
    Ok(())
}

/// The part of [`restart_allowed`] that reads only the run's own status: a
/// run that failed or timed out may restart (a reader can skip loading the
/// chain otherwise).
pub const fn restart_state_allows(run: &RunRecord) -> Result<(), RestartRefusal> {
    match run.status {
        RunStatus::Cancelled => Err(RestartRefusal::Cancelled),
        RunStatus::Completed => Err(RestartRefusal::Completed),
        RunStatus::Failed | RunStatus::TimedOut => Ok(()),
        RunStatus::Queued | RunStatus::Running | RunStatus::Waiting => {
            Err(RestartRefusal::NotTerminal)
        }
    }
}

/// Facts about the run being restarted, loaded by the shell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartSource<'a> {
    pub run: &'a RunRecord,
    /// [`TerminalOutcome::fingerprint`] of the source run.
    pub terminal_fingerprint: Digest,
    /// Every restart recorded in the source's chain (see [`restart_allowed`]).
    pub chain: &'a [RestartLineage],
}

/// Restart: a new immutable run from the exact stored reference and input of
/// a terminal run, when [`restart_allowed`] allows it. The source run does
/// not change; the new run is the next restart of the source's chain.
pub fn restart(
    source: RestartSource<'_>,
    new_run: NewRun,
    session_runs: &[RunId],
    now_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let old = source.run;
    restart_allowed(old, &source.terminal_fingerprint, source.chain)
        .map_err(|reason| Rejection::RestartRefused { reason })?;
    let root_run_id = old.restart_root().clone();
    let earlier = source
        .chain
        .iter()
        .filter(|restart| restart.root_run_id == root_run_id)
        .count();
    let lineage = Lineage {
        continuation_of: None,
        continued_by: None,
        restart: Some(RestartLineage {
            root_run_id,
            parent_run_id: old.run_id.clone(),
            number: u32::try_from(earlier).unwrap_or(u32::MAX).saturating_add(1),
            parent_fingerprint: source.terminal_fingerprint,
        }),
    };
    let new_run_id = new_run.run_id.clone();
    let mut transition = reserve(new_run, lineage, session_runs, now_ms)?;
    transition.outputs.insert(
        0,
        Output::Event {
            run_id: old.run_id.clone(),
            event: RunEvent::Restarted { new_run_id },
        },
    );
    Ok(transition)
}

/// [`restart`] held, as a model's selected launch is (`crate::launch`): the
/// same new run, parked [`ParkReason::Held`] until [`activate`] releases it
/// after the decision turn settles. Only an interactive run can be held.
pub fn restart_held(
    source: RestartSource<'_>,
    new_run: NewRun,
    session_runs: &[RunId],
    now_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    holdable(&new_run)?;
    restart(source, new_run, session_runs, now_ms).map(held)
}

/// The result of a continuation reservation: the settled parent and the new
/// child, written in one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContinuationReserved {
    pub parent: Transition<RunAggregate>,
    pub child: Transition<RunAggregate>,
}

/// Reserves the continuation of a waiting checkpoint parent and settles the
/// parent (`completed/done`, continued by the child) in the same transition.
/// The child carries the parent's steps. The parent's session reservation
/// passes to the child. Callers that race for one continuation go through
/// [`crate::decision`]'s prepare-or-adopt first.
pub fn reserve_continuation(
    parent: &RunAggregate,
    child_run_id: RunId,
    now_ms: u64,
) -> Result<ContinuationReserved, Rejection> {
    let run = &parent.run;
    if let Some(existing) = &run.lineage.continued_by {
        return Err(Rejection::AlreadyContinued {
            continuation_run_id: existing.clone(),
        });
    }
    if run.paused && !run.status.is_terminal() {
        return Err(Rejection::Paused);
    }
    let Some(checkpoint) = run
        .waiting_on
        .clone()
        .filter(|_| (run.status, run.queue) == (RunStatus::Waiting, QueueStatus::Parked))
    else {
        return Err(illegal(Operation::Continue, run));
    };
    let lineage = Lineage {
        continuation_of: Some(ContinuationOf {
            parent_run_id: run.run_id.clone(),
            checkpoint,
        }),
        continued_by: None,
        restart: None,
    };
    let new_run = NewRun {
        run_id: child_run_id.clone(),
        mode: run.mode.clone(),
    };
    let mut child = reserve(new_run, lineage, &[], now_ms)?;
    child.facts.steps = parent.steps.carried();

    let mut tx = Tx::begin(parent, now_ms);
    let run = &mut tx.agg.run;
    run.status = RunStatus::Completed;
    run.queue = QueueStatus::Done;
    run.finished_at_ms = Some(now_ms);
    run.lineage.continued_by = Some(child_run_id.clone());
    for message in &mut tx.agg.messages {
        if message.state == MessageState::Pending
            && matches!(message.kind, MessageKind::Decision { .. })
        {
            message.state = MessageState::Cancelled;
        }
    }
    tx.event(RunEvent::Continued {
        continuation_run_id: child_run_id,
    });
    // Settled means completed: the completed event every completed run has.
    tx.event(RunEvent::Completed);
    // A parent settled by its continuation gets no terminal message.
    Ok(ContinuationReserved {
        parent: tx.commit(),
        child,
    })
}

/// The `expectedRevision` precondition of a command or runner message: a
/// writer that names a revision must name the run's current one (`None`
/// expects nothing). Checked before the operation decides anything.
pub fn check_revision(run: &RunRecord, expected: Option<u64>) -> Result<(), Rejection> {
    match expected {
        Some(expected) if expected != run.revision.0 => Err(Rejection::StaleRevision {
            revision: run.revision,
        }),
        Some(_) | None => Ok(()),
    }
}

/// Takes a control claim on a run whose claim is absent or expired and parks
/// it for `reason` (recovery after a crash or server restart).
pub fn recover(
    agg: &RunAggregate,
    control: ClaimRequest,
    reason: ParkReason,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    if agg.run.status.is_terminal() {
        return Err(Rejection::Terminal {
            status: agg.run.status,
        });
    }
    if !RunRecord::pair_holds_claim(agg.run.status, agg.run.queue) {
        return Err(illegal(Operation::TakeControl, &agg.run));
    }
    let mut tx = Tx::begin(agg, now_ms);
    let authority = take_control_in(&mut tx, control, ttl_ms)?;
    park_in(&mut tx, &authority, reason)?;
    dedup_stop(&mut tx.outputs);
    Ok(tx.commit())
}

/// The generation a fresh claim on this run would get.
pub fn next_generation(run: &RunRecord) -> Generation {
    run.lease.generation.next()
}

#[cfg(test)]
mod tests;
