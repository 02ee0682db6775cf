//! The one status reducer: durable run facts plus supervised activity in, the
//! `display` object every renderer shows out.
//!
//! Precedence of [`DisplayStatus`] (the seed's order, first match wins):
//! 1. a durable terminal result keeps its terminal label;
//! 2. a nonterminal run with an ambiguous effect is `ambiguous`;
//! 3. a durable pause is `paused`, even while its worker stops — but an exact
//!    origin-session model turn that is still open shows `running` until its
//!    end is reported (`paused` appears only after the durable pause and the
//!    matching turn end);
//! 4. a pending request is `waiting`, except that an exact origin-session
//!    model turn shows `running` for its whole duration;
//! 5. otherwise a live worker (a ready runner that holds the run's claim) or
//!    an exact Pi turn is `running`;
//! 6. parked resumable work or admitted work that has not started is `queued`
//!    (a runner that has not said `runner.ready` shows only as activity
//!    `starting`).
//!
//! Invariants:
//! - The reducer is total and deterministic: every [`DisplayFacts`] value maps
//!   to exactly one [`RunDisplay`], and no renderer combines other facts with it.
//! - `paused` comes only from the durable pause flag (with no exact turn still
//!   open), never from a parked queue, a pending interaction or a missing
//!   activity report.
//! - A terminal label never depends on activity: a worker, a Pi turn or a
//!   validation that is still winding down changes only [`Activity`].
//! - Controls are a closed set in one fixed order without duplicates. Showing
//!   a control grants nothing: every command handler checks its own facts
//!   again. `pause`, `resume`, `cancel` and `restart` are offered exactly when
//!   the lifecycle rules in [`crate::run`] accept them on state alone (claims
//!   aside); answer controls only while the request is answerable (not
//!   paused, not ambiguous, not terminal).
//! - Every control is an operation the server serves: one that answered
//!   `unavailable` would not be a control (an operation joins [`Control`]
//!   when it is served).
//! - The presented node changes nothing durable: an exact model turn shows the
//!   waiting node as the current one for presentation only.

use crate::ids::NodeId;
use crate::interaction::{InteractionKind, InteractionStatus};
use crate::message::TurnState;
use crate::run::{ParkReason, QueueStatus, RunAggregate, RunError, RunStatus};
use crate::runner::RunnerStatus;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// The closed `display.status` set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisplayStatus {
    Queued,
    Running,
    Waiting,
    Paused,
    Completed,
    Failed,
    TimedOut,
    Cancelled,
    Ambiguous,
}

/// What is executing for the run right now, reported beside the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Activity {
    None,
    /// A supervised runner was recorded but has not said `runner.ready`.
    Starting,
    /// A supervised runner is live.
    Runner,
    /// An exact origin-session model turn is open for this run.
    ModelTurn,
    /// A supervised child validates a provisional submission.
    Validating,
}

/// One allowed control. The declaration order is the order renderers show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Control {
    Submit,
    Update,
    Answer,
    HumanAnswer,
    Pause,
    Resume,
    Cancel,
    RecoverEffect,
    Restart,
    /// Release a held model-started launch (`run.activate`).
    Activate,
}

/// The kind of the run's pending request, which decides its response controls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PendingRequest {
    /// A submitted-output agent step (`submit`, `update`).
    AgentSubmit,
    /// An assistant-message step: the visible reply is the output, no tool action.
    VisibleResponse,
    /// An ordinary waiting checkpoint (`answer`).
    CheckpointAnswer,
    /// A protected human decision (`humanAnswer`).
    HumanDecision,
}

/// The supervised runner of the current generation, as the display sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RunnerActivity {
    /// No runner process may be alive.
    None,
    /// Recorded and spawning; `runner.ready` not yet received.
    Starting,
    /// Ready and executing (or stopping).
    Live,
}

impl RunnerActivity {
    /// The display view of a runner row.
    pub const fn of(status: RunnerStatus) -> Self {
        match status {
            RunnerStatus::Launching => Self::Starting,
            RunnerStatus::Ready => Self::Live,
            RunnerStatus::Exited(_) => Self::None,
        }
    }
}

/// Everything the reducer reads, and nothing more.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DisplayFacts {
    pub status: RunStatus,
    pub queue: QueueStatus,
    /// The durable pause flag.
    pub paused: bool,
    pub park_reason: Option<ParkReason>,
    /// Some effect of the run is ambiguous and needs explicit review.
    pub effect_ambiguous: bool,
    pub pending_request: Option<PendingRequest>,
    pub runner: RunnerActivity,
    /// An exact origin-session model turn for this run is open.
    pub model_turn_active: bool,
    /// A provisional submission is being validated.
    pub submission_validating: bool,
    /// The node of the run's one unfinished attempt.
    pub attempt_node: Option<NodeId>,
    /// The completed checkpoint node a waiting run waits on.
    pub checkpoint_node: Option<NodeId>,
    /// The stored error of a failed or timed-out run.
    pub error: Option<RunError>,
    /// The restart chain allows another restart of this run.
    pub restart_eligible: bool,
}

/// Facts the display needs that are not part of a [`RunAggregate`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct OutsideFacts {
    /// A submission of the pending request is `Validating`.
    pub submission_validating: bool,
    /// The restart chain allows another restart (limit and new-failure rules).
    pub restart_eligible: bool,
}

impl DisplayFacts {
    /// Reads the display facts from a run aggregate as the shell loads it.
    pub fn from_run(agg: &RunAggregate, outside: OutsideFacts) -> Self {
        let run = &agg.run;
        Self {
            status: run.status,
            queue: run.queue,
            paused: run.paused,
            park_reason: run.park_reason,
            effect_ambiguous: agg.has_ambiguous_effect(),
            pending_request: pending_request_of(agg),
            runner: run.runner.as_ref().map_or(RunnerActivity::None, |runner| {
                RunnerActivity::of(runner.status)
            }),
            model_turn_active: agg
                .turns
                .iter()
                .any(|turn| turn.run_id == run.run_id && turn.state == TurnState::Open),
            submission_validating: outside.submission_validating,
            attempt_node: agg
                .attempt
                .as_ref()
                .filter(|attempt| attempt.status.is_unfinished())
                .map(|attempt| attempt.node_id.clone()),
            checkpoint_node: run.waiting_on.clone(),
            error: run.error.clone(),
            restart_eligible: outside.restart_eligible,
        }
    }
}

/// The pending request of a run: a protected decision first, then a pending
/// interactive request, then an ordinary waiting checkpoint.
fn pending_request_of(agg: &RunAggregate) -> Option<PendingRequest> {
    use crate::decision::DecisionStatus;
    if agg.run.status.is_terminal() {
        return None;
    }
    if agg
        .decision
        .as_ref()
        .is_some_and(|decision| decision.status == DecisionStatus::Pending)
    {
        return Some(PendingRequest::HumanDecision);
    }
    if let Some(interaction) = agg
        .interaction
        .as_ref()
        .filter(|interaction| interaction.status == InteractionStatus::Pending)
    {
        return Some(match interaction.kind {
            InteractionKind::SubmittedOutput => PendingRequest::AgentSubmit,
            InteractionKind::AssistantMessage => PendingRequest::VisibleResponse,
        });
    }
    let waits_on_checkpoint = agg.run.status == RunStatus::Waiting && agg.run.waiting_on.is_some();
    waits_on_checkpoint.then_some(PendingRequest::CheckpointAnswer)
}

/// Why the run needs action, when it does.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum DisplayReason {
    /// The stored error of a failed or timed-out run.
    Error { error: RunError },
    /// An effect needs explicit review (`recoverEffect`).
    EffectAmbiguous,
    /// The run is parked until an explicit resume.
    ParkedForReview { park_reason: ParkReason },
}

/// The `display` object of the live run view.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunDisplay {
    pub status: DisplayStatus,
    pub activity: Activity,
    /// Unique, in [`Control`] declaration order.
    pub controls: Vec<Control>,
    pub current_node: Option<NodeId>,
    pub waiting_on: Option<NodeId>,
    pub reason: Option<DisplayReason>,
}

/// The reducer: one display for one set of facts.
pub fn display(facts: &DisplayFacts) -> RunDisplay {
    let status = status(facts);
    let (current_node, waiting_on) = nodes(facts, status);
    RunDisplay {
        status,
        activity: activity(facts),
        controls: controls(facts),
        current_node,
        waiting_on,
        reason: reason(facts),
    }
}

/// The effective status by the module's precedence.
pub fn status(facts: &DisplayFacts) -> DisplayStatus {
    if let Some(terminal) = terminal_label(facts.status) {
        return terminal;
    }
    if facts.effect_ambiguous {
        return DisplayStatus::Ambiguous;
    }
    if facts.paused && !facts.model_turn_active {
        return DisplayStatus::Paused;
    }
    if facts.pending_request.is_some() {
        return if facts.model_turn_active {
            DisplayStatus::Running
        } else {
            DisplayStatus::Waiting
        };
    }
    if runner_executes(facts) || facts.model_turn_active {
        return DisplayStatus::Running;
    }
    DisplayStatus::Queued
}

/// A ready runner executes the run only while the queue holds its claim; a
/// runner of a parked run is only stopping (its activity still shows).
const fn runner_executes(facts: &DisplayFacts) -> bool {
    matches!(facts.runner, RunnerActivity::Live)
        && matches!(facts.queue, QueueStatus::Starting | QueueStatus::Running)
}

const fn terminal_label(status: RunStatus) -> Option<DisplayStatus> {
    match status {
        RunStatus::Completed => Some(DisplayStatus::Completed),
        RunStatus::Failed => Some(DisplayStatus::Failed),
        RunStatus::TimedOut => Some(DisplayStatus::TimedOut),
        RunStatus::Cancelled => Some(DisplayStatus::Cancelled),
        RunStatus::Queued | RunStatus::Running | RunStatus::Waiting => None,
    }
}

/// The supervised worker or exact Pi turn, independent of status. A Pi turn
/// is what the user watches, so it wins over a validation child, which wins
/// over a runner.
pub const fn activity(facts: &DisplayFacts) -> Activity {
    if facts.model_turn_active {
        return Activity::ModelTurn;
    }
    if facts.submission_validating {
        return Activity::Validating;
    }
    match facts.runner {
        RunnerActivity::Live => Activity::Runner,
        RunnerActivity::Starting => Activity::Starting,
        RunnerActivity::None => Activity::None,
    }
}

/// Whether a run is parked until an explicit resume (the reasons that neither
/// resume automatically nor wait for effect recovery).
const fn parked_for_review(facts: &DisplayFacts) -> bool {
    let parked =
        matches!(facts.status, RunStatus::Running) && matches!(facts.queue, QueueStatus::Parked);
    parked
        && matches!(
            facts.park_reason,
            Some(
                ParkReason::RunnerNoProgress
                    | ParkReason::WorkflowSourceChanged
                    | ParkReason::WorkerTimedOut
                    | ParkReason::ProtocolRejected
            )
        )
}

/// Whether a run is parked for a reason the scheduler never resumes on its
/// own: exactly the parks [`crate::run::resume`] releases. On consistent facts
/// these are the review reasons (a `paused` park carries the pause flag and an
/// `effectAmbiguous` park carries the ambiguous effect).
const fn parked_until_resume(facts: &DisplayFacts) -> bool {
    let parked =
        matches!(facts.status, RunStatus::Running) && matches!(facts.queue, QueueStatus::Parked);
    match facts.park_reason {
        Some(reason) => parked && !reason.resumes_automatically(),
        None => false,
    }
}

/// The allowed controls, in [`Control`] order: what the view advertises.
pub fn controls(facts: &DisplayFacts) -> Vec<Control> {
    let terminal = facts.status.is_terminal();
    let mut controls = Vec::new();
    if !terminal && !facts.effect_ambiguous && !facts.paused {
        controls.extend_from_slice(request_controls(facts.pending_request));
    }
    if !terminal && !facts.paused {
        controls.push(Control::Pause);
    }
    let resumable = facts.paused || parked_until_resume(facts);
    if !terminal && !facts.effect_ambiguous && resumable {
        controls.push(Control::Resume);
    }
    if !terminal {
        controls.push(Control::Cancel);
    }
    if facts.effect_ambiguous {
        controls.push(Control::RecoverEffect);
    }
    let restartable = matches!(facts.status, RunStatus::Failed | RunStatus::TimedOut);
    if restartable && facts.restart_eligible {
        controls.push(Control::Restart);
    }
    let held = matches!(facts.status, RunStatus::Queued)
        && matches!(facts.park_reason, Some(ParkReason::Held));
    if held {
        controls.push(Control::Activate);
    }
    controls
}

const fn request_controls(request: Option<PendingRequest>) -> &'static [Control] {
    match request {
        Some(PendingRequest::AgentSubmit) => &[Control::Submit, Control::Update],
        Some(PendingRequest::CheckpointAnswer) => &[Control::Answer],
        Some(PendingRequest::HumanDecision) => &[Control::HumanAnswer],
        Some(PendingRequest::VisibleResponse) | None => &[],
    }
}

/// `(current_node, waiting_on)`. A terminal run presents no node. A running
/// run presents its unfinished attempt (or, during an exact model turn, the
/// node it waits on) as current. Otherwise a pending request presents its
/// attempt's node, or the completed checkpoint node, as `waiting_on`.
fn nodes(facts: &DisplayFacts, status: DisplayStatus) -> (Option<NodeId>, Option<NodeId>) {
    if facts.status.is_terminal() {
        return (None, None);
    }
    let waiting_node = || {
        facts
            .attempt_node
            .clone()
            .or_else(|| facts.checkpoint_node.clone())
    };
    if status == DisplayStatus::Running && facts.pending_request.is_some() {
        return (waiting_node(), None);
    }
    if facts.pending_request.is_some() {
        return (None, waiting_node());
    }
    (facts.attempt_node.clone(), None)
}

/// The stored reason when action is required: the terminal error first, then
/// an ambiguous effect, then a park that waits for an explicit resume.
fn reason(facts: &DisplayFacts) -> Option<DisplayReason> {
    let error = facts
        .error
        .clone()
        .filter(|_| matches!(facts.status, RunStatus::Failed | RunStatus::TimedOut));
    if let Some(error) = error {
        return Some(DisplayReason::Error { error });
    }
    if facts.effect_ambiguous {
        return Some(DisplayReason::EffectAmbiguous);
    }
    match facts.park_reason {
        Some(park_reason) if parked_for_review(facts) => {
            Some(DisplayReason::ParkedForReview { park_reason })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
