//! Turn intents: the one successor model turn a workflow event owes the
//! origin session (DEFERRED_TURNS), which events create one, when it may be
//! presented, and how one message claims it before it is sent.
//!
//! Invariants:
//! - [`policy`] is the event policy table, one arm per row and nothing else;
//!   every other rule of this module reads it.
//! - One eligible source event creates at most one intent: the intent id and
//!   the source-event id are derived from the event ([`ids`]: origin session,
//!   run, source, node, attempt, cause), so the same event always names the
//!   same intent.
//! - A run has at most one unresolved intent. A later event of a run that
//!   still has one reuses it ("create or reuse the abort intent"): its id and
//!   cause stay, only its eligibility may advance. Eligibility never goes
//!   back.
//! - An intent is claimed by exactly one message, in the transaction that
//!   creates that message, before it can be sent ([`claim`]): an intent that
//!   is not eligible, or that a message already claimed, is refused. The
//!   claiming message is sent at most once and opens at most one turn
//!   (`session`), so a claimed intent is resolved by exactly one successor
//!   turn, and a resolved intent never starts another ([`is_resolved`]: its
//!   claiming message was sent).
//! - A lost queue claim under an active workflow turn ([`on_claim_lost`])
//!   creates its intent ineligible: only a later event of the run (its
//!   terminal message, a cancellation), which reuses it, makes it eligible,
//!   so a run a new owner continues to its end owes one turn, not two.
//! - No intent comes from a pause, an Escape or a held run, a closing
//!   session, a waiting result, or a run without an origin session (a
//!   headless, controller-owned or internally owned run: its owner receives
//!   the result).

use crate::ids::{AttemptId, MessageId, NodeId, RunId, SessionId, TurnIntentId, TurnSourceId};
use crate::message::TurnState;
use crate::run::{ParkReason, QueueStatus, RunAggregate, RunRecord, RunStatus};
use alloc::format;
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// Why a successor turn is owed (the closed wire set of
/// `pi-workflows.deferred-turn-message.v1`'s `cause`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Cause {
    AgentCancelled,
    TimedOut,
    Failed,
    LaunchFailed,
    ControllerInterrupted,
    ClaimLost,
    Terminal,
    Cancelled,
}

impl Cause {
    /// The wire name (`agentCancelled`, …).
    pub const fn wire_name(self) -> &'static str {
        match self {
            Self::AgentCancelled => "agentCancelled",
            Self::TimedOut => "timedOut",
            Self::Failed => "failed",
            Self::LaunchFailed => "launchFailed",
            Self::ControllerInterrupted => "controllerInterrupted",
            Self::ClaimLost => "claimLost",
            Self::Terminal => "terminal",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Who cancelled a run.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub enum Canceller {
    /// The model, through the `workflow` tool's `cancel`.
    Agent,
    /// A person (`/workflow cancel`, the CLI, a viewer) or any other client.
    #[default]
    User,
}

/// The events of the policy table, one variant per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "event")]
pub enum SourceEvent {
    /// A top-level interactive run completes.
    Completed,
    /// A top-level interactive run fails (`timed_out: false`) or times out.
    FailedOrTimedOut { timed_out: bool },
    /// The agent or a user cancels a top-level run.
    Cancelled { by: Canceller },
    /// The workflow reported started, then crashed before its first prompt.
    CrashedBeforeFirstPrompt,
    /// A queued launch's activation failed.
    LaunchActivationFailed,
    /// A controller interrupts an active workflow turn.
    ControllerInterrupted,
    /// An active workflow turn loses its queue claim.
    ClaimLost,
    /// A waiting result has a presentation.
    WaitingPresented,
    /// A controller child or an internally owned run ends.
    OwnedRunEnded,
    /// A workflow pause.
    Paused,
    /// A user Escape, or a held workflow.
    EscapeOrHeld,
    /// The session shuts down.
    SessionShutdown,
}

impl SourceEvent {
    /// The stable source name hashed into the source-event id.
    const fn source_name(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::FailedOrTimedOut { timed_out: false } => "failed",
            Self::FailedOrTimedOut { timed_out: true } => "timedOut",
            Self::Cancelled {
                by: Canceller::Agent,
            } => "agentCancelled",
            Self::Cancelled {
                by: Canceller::User,
            } => "cancelled",
            Self::CrashedBeforeFirstPrompt => "crashedBeforeFirstPrompt",
            Self::LaunchActivationFailed => "launchFailed",
            Self::ControllerInterrupted => "controllerInterrupted",
            Self::ClaimLost => "claimLost",
            Self::WaitingPresented => "waitingPresented",
            Self::OwnedRunEnded => "ownedRunEnded",
            Self::Paused => "paused",
            Self::EscapeOrHeld => "escapeOrHeld",
            Self::SessionShutdown => "sessionShutdown",
        }
    }
}

/// When an intent is created, relative to its event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CreateWhen {
    /// With the run's durable terminal state.
    WithTerminalState,
    /// Before the turn abort, when a workflow turn must be aborted (or reuse
    /// the run's unresolved abort intent).
    BeforeTurnAbort,
    /// After the durable failure.
    AfterDurableFailure,
    /// After the queue row is durably failed.
    AfterQueueFailed,
}

/// What an event does about intents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "creates")]
pub enum Creates {
    /// No intent.
    Nothing,
    /// One intent with this cause (or the run's unresolved one, reused).
    Intent { cause: Cause, when: CreateWhen },
}

/// The fallback rule: when the intent may be presented or fall back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Fallback {
    /// Eligible at once: the presentation and the factual fallback compete
    /// for the intent.
    PresentationCompetes,
    /// Eligible once the terminal state is durable.
    AfterTerminalDurable,
    /// Eligible once the cancellation is durable; the decision defaults to
    /// stopping.
    AfterDurableCancellation,
    /// Created eligible.
    CreatedEligible,
    /// The durable terminal or handoff state decides.
    TerminalOrHandoffDecides,
    /// Ineligible while a new owner can continue.
    IneligibleWhileNewOwnerCanContinue,
    /// No terminal intent; a presentation may resolve an earlier
    /// interruption intent.
    ResolvesEarlierIntent,
    /// The run's owner receives the result.
    OwnerReceivesResult,
    /// No automatic model turn.
    NoAutomaticTurn,
    /// A closing session cannot start another turn.
    ClosingSession,
}

/// One row of the event policy table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    pub creates: Creates,
    pub fallback: Fallback,
}

/// The event policy table (DEFERRED_TURNS):
///
/// | Event | Intent | Fallback rule |
/// |---|---|---|
/// | Top-level interactive run completes | Create one terminal intent. | Presentation and factual fallback compete for the intent. |
/// | Top-level interactive run fails or times out | Create or reuse the abort intent. | Make eligible after the terminal state is durable. |
/// | Agent or user cancels a top-level run | Create before turn abort when needed. | Make eligible after durable cancellation; the decision defaults to stopping. |
/// | Workflow reports started, then crashes before its first prompt | Create after durable failure. | Create as eligible. |
/// | Queued launch activation fails | Create after the queue row is durably failed. | Create as eligible. |
/// | Controller interrupts an active workflow turn | Create before the turn abort when possible. | Durable terminal or handoff state decides eligibility. |
/// | Active workflow turn loses its queue claim | Create before the turn abort when possible. | Keep ineligible while a new owner can continue. |
/// | Waiting result has a presentation | Do not create a terminal intent. | It can resolve an earlier interruption intent through presentation. |
/// | Controller child or internally owned run ends | Do not create a terminal intent. | Its owner receives the result. |
/// | Workflow pause | Do not create. | No automatic model turn. |
/// | User Escape or held workflow | Do not create. | No automatic model turn. |
/// | Session shutdown | Do not create. | A closing session cannot start another turn. |
pub const fn policy(event: SourceEvent) -> Policy {
    use Creates::{Intent, Nothing};
    let (creates, fallback) = match event {
        SourceEvent::Completed => (
            Intent {
                cause: Cause::Terminal,
                when: CreateWhen::WithTerminalState,
            },
            Fallback::PresentationCompetes,
        ),
        SourceEvent::FailedOrTimedOut { timed_out } => (
            Intent {
                cause: if timed_out {
                    Cause::TimedOut
                } else {
                    Cause::Failed
                },
                when: CreateWhen::BeforeTurnAbort,
            },
            Fallback::AfterTerminalDurable,
        ),
        SourceEvent::Cancelled { by } => (
            Intent {
                cause: match by {
                    Canceller::Agent => Cause::AgentCancelled,
                    Canceller::User => Cause::Cancelled,
                },
                when: CreateWhen::BeforeTurnAbort,
            },
            Fallback::AfterDurableCancellation,
        ),
        SourceEvent::CrashedBeforeFirstPrompt => (
            Intent {
                cause: Cause::Failed,
                when: CreateWhen::AfterDurableFailure,
            },
            Fallback::CreatedEligible,
        ),
        SourceEvent::LaunchActivationFailed => (
            Intent {
                cause: Cause::LaunchFailed,
                when: CreateWhen::AfterQueueFailed,
            },
            Fallback::CreatedEligible,
        ),
        SourceEvent::ControllerInterrupted => (
            Intent {
                cause: Cause::ControllerInterrupted,
                when: CreateWhen::BeforeTurnAbort,
            },
            Fallback::TerminalOrHandoffDecides,
        ),
        SourceEvent::ClaimLost => (
            Intent {
                cause: Cause::ClaimLost,
                when: CreateWhen::BeforeTurnAbort,
            },
            Fallback::IneligibleWhileNewOwnerCanContinue,
        ),
        SourceEvent::WaitingPresented => (Nothing, Fallback::ResolvesEarlierIntent),
        SourceEvent::OwnedRunEnded => (Nothing, Fallback::OwnerReceivesResult),
        SourceEvent::Paused | SourceEvent::EscapeOrHeld => (Nothing, Fallback::NoAutomaticTurn),
        SourceEvent::SessionShutdown => (Nothing, Fallback::ClosingSession),
    };
    Policy { creates, fallback }
}

impl Fallback {
    /// Whether an intent under this rule is eligible now: `terminal` is
    /// whether the run's terminal state is durable (committed before this
    /// transition).
    pub const fn eligible(self, terminal: bool) -> bool {
        match self {
            Self::PresentationCompetes | Self::CreatedEligible => true,
            Self::AfterTerminalDurable
            | Self::AfterDurableCancellation
            | Self::TerminalOrHandoffDecides => terminal,
            Self::IneligibleWhileNewOwnerCanContinue
            | Self::ResolvesEarlierIntent
            | Self::OwnerReceivesResult
            | Self::NoAutomaticTurn
            | Self::ClosingSession => false,
        }
    }

    /// Whether the successor turn's decision defaults to stopping.
    pub const fn stops_by_default(self) -> bool {
        matches!(self, Self::AfterDurableCancellation)
    }
}

/// One `turn_intents` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IntentRecord {
    pub intent_id: TurnIntentId,
    pub source_id: TurnSourceId,
    pub session_id: SessionId,
    pub run_id: RunId,
    pub cause: Cause,
    /// The node and attempt the event concerns, when it concerns one.
    pub node_id: Option<NodeId>,
    pub attempt_id: Option<AttemptId>,
    /// When the intent became eligible; `None` while it is not.
    pub eligible_at_ms: Option<u64>,
    /// Whether its decision defaults to stopping (a cancellation).
    pub stops_by_default: bool,
    /// The message that claimed it, before that message could be sent.
    pub message_id: Option<MessageId>,
    pub created_at_ms: u64,
}

/// Why an intent transition was refused. Nothing changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum IntentRejection {
    /// The intent is not eligible yet.
    NotEligible,
    /// Another message already claimed the intent.
    AlreadyClaimed { message_id: MessageId },
}

/// The ids of the intent an event creates: `deferred-turn:` and
/// `turn-source:` followed by the SHA-256 (hex) of a JSON array, as the
/// reference derives them.
pub fn ids(
    session_id: &SessionId,
    run_id: &RunId,
    event: SourceEvent,
    node_id: Option<&NodeId>,
    attempt_id: Option<&AttemptId>,
    cause: Cause,
) -> (TurnIntentId, TurnSourceId) {
    let node = node_id.map_or("$run", NodeId::as_str);
    let attempt = attempt_id.map_or("$none", AttemptId::as_str);
    let source = serde_json::to_string(&[
        run_id.as_str(),
        event.source_name(),
        node,
        attempt,
        cause.wire_name(),
    ])
    .unwrap_or_default();
    let source_id = TurnSourceId::new(format!("turn-source:{}", sha256_hex(source.as_bytes())));
    let intent = serde_json::to_string(&[
        session_id.as_str(),
        run_id.as_str(),
        source_id.as_str(),
        node,
        attempt,
        cause.wire_name(),
    ])
    .unwrap_or_default();
    let intent_id = TurnIntentId::new(format!("deferred-turn:{}", sha256_hex(intent.as_bytes())));
    (intent_id, source_id)
}

fn sha256_hex(bytes: &[u8]) -> String {
    use core::fmt::Write as _;
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(bytes);
    let mut text = String::with_capacity(64);
    for byte in digest.iter() {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

/// Where in the run an event happened, when it concerns one node attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventAt<'a> {
    pub node_id: &'a NodeId,
    pub attempt_id: &'a AttemptId,
}

/// The run's intent after `event`: `None` when the policy creates none or the
/// run has no origin session (its owner receives the result). A run with an
/// unresolved intent (`open`) keeps it: its id and cause stay, and it becomes
/// eligible when the rule says so now. Otherwise a new intent, eligible now
/// when the rule says so. `terminal` is whether the run's terminal state is
/// durable.
pub fn on_event(
    run: &RunRecord,
    open: Option<&IntentRecord>,
    event: SourceEvent,
    at: Option<EventAt<'_>>,
    now_ms: u64,
) -> Option<IntentRecord> {
    let session_id = run.mode.origin_session()?;
    let policy = policy(event);
    let Creates::Intent { cause, .. } = policy.creates else {
        return None;
    };
    let terminal = run.status.is_terminal();
    let eligible_now = policy.fallback.eligible(terminal).then_some(now_ms);
    if let Some(open) = open.filter(|open| open.run_id == run.run_id) {
        let mut kept = open.clone();
        kept.eligible_at_ms = open.eligible_at_ms.or(eligible_now);
        kept.stops_by_default = open.stops_by_default || policy.fallback.stops_by_default();
        return Some(kept);
    }
    let node_id = at.map(|at| at.node_id);
    let attempt_id = at.map(|at| at.attempt_id);
    let (intent_id, source_id) = ids(session_id, &run.run_id, event, node_id, attempt_id, cause);
    Some(IntentRecord {
        intent_id,
        source_id,
        session_id: session_id.clone(),
        run_id: run.run_id.clone(),
        cause,
        node_id: node_id.cloned(),
        attempt_id: attempt_id.cloned(),
        eligible_at_ms: eligible_now,
        stops_by_default: policy.fallback.stops_by_default(),
        message_id: None,
        created_at_ms: now_ms,
    })
}

/// The intent a cancellation (`run.cancel`) creates in its own transaction,
/// before the turn it stops is aborted ("create before turn abort when
/// needed"): `run` is the run after the accepted cancellation, `by` who
/// cancelled it. Eligible once the cancellation is durable (at once when the
/// cancellation ended the run, otherwise when its terminal message reuses
/// it), stopping by default. Only this records who cancelled: the terminal
/// message reuses the intent and so keeps its cause (`agentCancelled` for
/// the model's cancel through the `workflow` tool). `None` for a run without
/// an origin session.
pub fn on_cancel(
    run: &RunRecord,
    open: Option<&IntentRecord>,
    by: Canceller,
    now_ms: u64,
) -> Option<IntentRecord> {
    on_event(run, open, SourceEvent::Cancelled { by }, None, now_ms)
}

/// Whether `before → after` handed a lost queue claim to a new owner while a
/// workflow turn of the run was active (row 7, "active workflow turn loses
/// its queue claim"): the run held a claim (`running/starting|running`), the
/// decision parked it `recovered` (the claim-expiry wake fencing a stalled
/// runner, `runner::on_claim_expired`, or the exit of a runner fenced for
/// claim loss or orphaned by a server crash, `runner::decide_exit`), and an
/// open turn of the run was active in its origin session.
pub fn loses_claim_with_active_turn(before: &RunAggregate, after: &RunAggregate) -> bool {
    RunRecord::pair_holds_claim(before.run.status, before.run.queue)
        && after.run.queue == QueueStatus::Parked
        && after.run.park_reason == Some(ParkReason::Recovered)
        && before
            .turns
            .iter()
            .any(|turn| turn.state == TurnState::Open && turn.run_id == before.run.run_id)
}

/// The intent of a lost queue claim ([`loses_claim_with_active_turn`]),
/// created in the transaction that records the loss, before the turn it
/// strands is aborted: cause `claimLost`, naming the abandoned attempt, and
/// ineligible while a new owner can continue the run. A later event of the
/// run (its terminal message, a cancellation) reuses it with its cause, and
/// only that event's rule makes it eligible: a run a new owner continues to
/// its end gets one terminal message and one turn, never two. `None` for any
/// other transition and for a run without an origin session.
pub fn on_claim_lost(
    before: &RunAggregate,
    after: &RunAggregate,
    open: Option<&IntentRecord>,
    now_ms: u64,
) -> Option<IntentRecord> {
    if !loses_claim_with_active_turn(before, after) {
        return None;
    }
    let at = before.attempt.as_ref().map(|attempt| EventAt {
        node_id: &attempt.node_id,
        attempt_id: &attempt.attempt_id,
    });
    on_event(&after.run, open, SourceEvent::ClaimLost, at, now_ms)
}

/// What the store knows about how a run was launched, for [`launch_failed`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LaunchFacts {
    /// The run is a terminal decision turn's selected launch (a queued
    /// launch: held until the turn settled, then activated).
    pub selected_launch: bool,
    /// Any node attempt of the run started.
    pub node_started: bool,
}

/// Whether `run` is a queued launch whose activation failed: a selected
/// launch that failed before any node ran (its runner could not load or
/// start the workflow). Such an end is the "queued launch activation fails"
/// row (`launchFailed`, created eligible), not a plain failure.
pub fn launch_failed(run: &RunRecord, launch: LaunchFacts) -> bool {
    run.status == RunStatus::Failed && launch.selected_launch && !launch.node_started
}

/// The policy row of a terminal run's end: a run without an origin session
/// (headless, owned by a controller or by the server) ends as an owned run;
/// an interactive one by its terminal status. `launch_failed` marks a
/// queued launch whose activation failed before any node ran; `by` is who
/// cancelled a cancelled run. `None` for a run that is not terminal.
pub fn terminal_event(run: &RunRecord, by: Canceller, launch_failed: bool) -> Option<SourceEvent> {
    if run.mode.origin_session().is_none() {
        return run
            .status
            .is_terminal()
            .then_some(SourceEvent::OwnedRunEnded);
    }
    match run.status {
        RunStatus::Completed => Some(SourceEvent::Completed),
        RunStatus::Failed if launch_failed => Some(SourceEvent::LaunchActivationFailed),
        RunStatus::Failed => Some(SourceEvent::FailedOrTimedOut { timed_out: false }),
        RunStatus::TimedOut => Some(SourceEvent::FailedOrTimedOut { timed_out: true }),
        RunStatus::Cancelled => Some(SourceEvent::Cancelled { by }),
        RunStatus::Queued | RunStatus::Running | RunStatus::Waiting => None,
    }
}

/// `message_id` claims `intent` before it can be sent: the intent must be
/// eligible and unclaimed. A repeat by the same message is the same claim.
pub fn claim(
    intent: &IntentRecord,
    message_id: &MessageId,
) -> Result<IntentRecord, IntentRejection> {
    match &intent.message_id {
        Some(claimed) if claimed == message_id => return Ok(intent.clone()),
        Some(claimed) => {
            return Err(IntentRejection::AlreadyClaimed {
                message_id: claimed.clone(),
            });
        }
        None => {}
    }
    if intent.eligible_at_ms.is_none() {
        return Err(IntentRejection::NotEligible);
    }
    let mut claimed = intent.clone();
    claimed.message_id = Some(message_id.clone());
    Ok(claimed)
}

/// The intent `run`'s terminal message presents, claimed by that message in
/// the transaction that creates it (the message is the intent's factual
/// presentation: `pi-workflows-deferred-turn`). The run's end is its policy
/// row ([`terminal_event`], a failed selected launch by [`launch_failed`]); `open` is the run's unresolved intent, if any,
/// which is reused. `Ok(None)` when the row creates none (an owned run).
/// Refused when the intent is not eligible or another message claimed it;
/// the shell then builds no message.
pub fn for_terminal_message(
    run: &RunRecord,
    open: Option<&IntentRecord>,
    by: Canceller,
    launch: LaunchFacts,
    message_id: &MessageId,
    now_ms: u64,
) -> Result<Option<IntentRecord>, IntentRejection> {
    let Some(event) = terminal_event(run, by, launch_failed(run, launch)) else {
        return Ok(None);
    };
    match on_event(run, open, event, None, now_ms) {
        Some(intent) => claim(&intent, message_id).map(Some),
        None => Ok(None),
    }
}

/// Whether the intent is resolved: its claiming message was sent
/// (`message_sent`, the message's state). A resolved intent never starts
/// another turn: nothing claims it again.
pub const fn is_resolved(intent: &IntentRecord, message_sent: bool) -> bool {
    intent.message_id.is_some() && message_sent
}

#[cfg(test)]
mod tests;
