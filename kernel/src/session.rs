//! One origin session: its workflow messages, its process-local coordinator
//! epoch, and the Pi model turns its messages open.
//!
//! Invariants:
//! - At most one coordinator epoch is active per session. Epochs only grow;
//!   a new connection fences the previous one, and a fenced connection stays
//!   fenced while another connection is active (its later reads are not new
//!   connections and take no epoch back). Only the active epoch is
//!   offered a message or may report, and it must report the active branch
//!   before it is offered a message or reports a turn.
//! - One message is offered at a time: while the offered message is still
//!   pending and eligible, no other message is offered. Eligibility comes
//!   from the message kind and its source's state; an ineligible or
//!   cancelled message never blocks later eligible work.
//! - `Sent` never returns to `Pending`. Branch evidence turns a `Pending` or
//!   `Cancelled` message into `Sent` with its entry id; a `Sent` message is
//!   never offered again.
//! - Active-branch absence is used only when Pi is idle and has no pending
//!   messages: only then does a report end open turns as `Lost` or present a
//!   pending source again (at most one message of the source's own kind, and
//!   only when the source has no pending message and no entry on the branch).
//! - At most one pending step message exists per interaction, hence at most
//!   one pending reminder.
//! - A turn starts only against an open message. Pi runs one turn at a time,
//!   so a new turn ends every older open turn of the session as `Lost`; an
//!   open turn is therefore always the newest turn of its message, and a
//!   report about an older turn can never end a newer one.
//! - `unproductive_turn_ends` counts only completed, errored or lost turns of
//!   a pending, unpaused submitted-output step with no accepted or validating
//!   submission. 1 and 2 create a reminder; 3 fails the attempt, so it never
//!   exceeds 3. An aborted turn pauses the run and is not counted.
//! - A request's [`interaction::TurnClock`] runs exactly while one of its
//!   step's turns is open and reported by the session's active coordinator:
//!   a turn start (or its repeat from a new epoch) starts it, and the turn's
//!   end or loss stops it, as do the coordinator's disconnect
//!   ([`suspend_clocks`]) and a pause (`run`). A started clock asks for one
//!   wake at its deadline.
//! - Run-level consequences (pause, attempt failure) are returned as
//!   [`RunFollowUp`]s for the shell to apply in the same transaction; this
//!   module never changes a run's lifecycle. Terminal cleanup of messages and
//!   turns is [`crate::run`]'s and [`crate::message`]'s.

use crate::decision::{DecisionRecord, DecisionStatus};
use crate::ids::{
    ConnectionId, CoordinatorEpoch, EntryId, InteractionId, MessageId, RunId, SessionId, TurnId,
};
use crate::interaction::{
    self, AttemptFollowUp, InteractionKind, InteractionRecord, InteractionStatus,
    SubmissionOutcome, SubmissionRecord,
};
use crate::message::{MessageKind, MessageRecord, MessageState, StepReason, TurnRecord, TurnState};
use crate::output::{Output, Transition, WakeReason};
use crate::run::{ReasonKind, RunStatus};
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// An unproductive-turn count above this fails the attempt.
pub const MAX_REMINDERS: u32 = 2;

/// The session's view of one of its runs: what message eligibility and turn
/// rules read.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SessionRun {
    pub run_id: RunId,
    pub status: RunStatus,
    /// The run's durable pause (written only by run transitions).
    pub paused: bool,
    /// The run's pending interactive request, if any.
    pub interaction: Option<InteractionRecord>,
    /// The submissions of that request.
    pub submissions: Vec<SubmissionRecord>,
    /// The run's pending protected decision, if any.
    pub decision: Option<DecisionRecord>,
}

impl SessionRun {
    fn pending_interaction(&self, interaction_id: &InteractionId) -> Option<&InteractionRecord> {
        self.interaction.as_ref().filter(|record| {
            record.interaction_id == *interaction_id && record.status == InteractionStatus::Pending
        })
    }

    /// Whether a turn end of this run's step counts as unproductive.
    fn counts_unproductive(&self, interaction_id: &InteractionId) -> bool {
        let Some(record) = self.pending_interaction(interaction_id) else {
            return false;
        };
        let settling = self.submissions.iter().any(|submission| {
            matches!(
                submission.outcome,
                SubmissionOutcome::Accepted | SubmissionOutcome::Validating
            )
        });
        !self.status.is_terminal()
            && !self.paused
            && record.kind == InteractionKind::SubmittedOutput
            && record.accepted_submission.is_none()
            && !settling
    }
}

/// The durable facts of one origin session, loaded by the shell in the write
/// transaction. They are bounded to what the rules read.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SessionFacts {
    pub session_id: SessionId,
    /// The session window: every pending message, the latest sent step of
    /// each pending interaction, the message of every open turn, and the
    /// terminal message and sent follow-ups of each run that still has a
    /// pending follow-up or an open terminal or follow-up message.
    pub messages: Vec<MessageRecord>,
    /// Every open turn, the latest turn of each window message, and the turn
    /// a turn report names (when it exists).
    pub turns: Vec<TurnRecord>,
    /// Every run that a window message or turn belongs to, and every
    /// queued, running or waiting run of the session (its reservation).
    pub runs: Vec<SessionRun>,
    /// The order the next created message receives: [`next_message_order`]
    /// over the session's highest stored order (the shell's one source,
    /// also for run transitions that create messages).
    pub next_message_order: u64,
}

/// The order a session's next message receives, after its highest stored
/// order `max_order` (`None`: the session has no message yet). Orders
/// start at 1 and only grow.
pub const fn next_message_order(max_order: Option<u64>) -> u64 {
    match max_order {
        Some(max_order) => max_order + 1,
        None => 1,
    }
}

impl SessionFacts {
    /// An empty session.
    pub fn new(session_id: SessionId) -> Self {
        Self {
            session_id,
            messages: Vec::new(),
            turns: Vec::new(),
            runs: Vec::new(),
            next_message_order: 1,
        }
    }

    /// The run `run_id`, if the session knows it.
    pub fn run(&self, run_id: &RunId) -> Option<&SessionRun> {
        self.runs.iter().find(|run| run.run_id == *run_id)
    }

    fn run_mut(&mut self, run_id: &RunId) -> Option<&mut SessionRun> {
        self.runs.iter_mut().find(|run| run.run_id == *run_id)
    }

    /// The window message `message_id`.
    pub fn message(&self, message_id: &MessageId) -> Option<&MessageRecord> {
        self.messages
            .iter()
            .find(|message| message.message_id == *message_id)
    }

    fn turn(&self, turn_id: &TurnId) -> Option<&TurnRecord> {
        self.turns.iter().find(|turn| turn.turn_id == *turn_id)
    }

    fn steps_of(&self, interaction_id: &InteractionId) -> impl Iterator<Item = &MessageRecord> {
        let wanted = interaction_id.clone();
        self.messages.iter().filter(move |message| {
            matches!(&message.kind, MessageKind::Step { interaction_id, .. } if *interaction_id == wanted)
        })
    }

    fn pending_steps(&self, interaction_id: &InteractionId) -> usize {
        self.steps_of(interaction_id)
            .filter(|message| message.state == MessageState::Pending)
            .count()
    }

    /// The latest sent step message of a request, in acceptance order.
    pub fn latest_sent_step(&self, interaction_id: &InteractionId) -> Option<&MessageRecord> {
        self.steps_of(interaction_id)
            .filter(|message| message.state == MessageState::Sent)
            .max_by_key(|message| message.order)
    }

    /// Whether some turn of `message_id` has ended.
    fn has_ended_turn(&self, message_id: &MessageId) -> bool {
        self.turns
            .iter()
            .any(|turn| turn.message_id == *message_id && turn.state != TurnState::Open)
    }

    /// Whether a new turn may start against `message` (the message is open).
    pub fn is_open(&self, message: &MessageRecord) -> bool {
        if message.state != MessageState::Sent {
            return false;
        }
        let Some(run) = self.run(&message.run_id) else {
            return false;
        };
        match &message.kind {
            MessageKind::Step { interaction_id, .. } => {
                !run.paused
                    && run.pending_interaction(interaction_id).is_some()
                    && self
                        .latest_sent_step(interaction_id)
                        .is_some_and(|latest| latest.message_id == message.message_id)
            }
            MessageKind::Terminal | MessageKind::FollowUp { .. } => !self
                .turns
                .iter()
                .any(|turn| turn.message_id == message.message_id),
            MessageKind::Decision { .. } | MessageKind::Notification => false,
        }
    }

    /// Whether a pending message may be sent now, by its kind's rule.
    pub fn is_eligible(&self, message: &MessageRecord) -> bool {
        if message.state != MessageState::Pending {
            return false;
        }
        let Some(run) = self.run(&message.run_id) else {
            return false;
        };
        match &message.kind {
            MessageKind::Step { interaction_id, .. } => {
                !run.paused
                    && run.pending_interaction(interaction_id).is_some()
                    && self.pending_steps(interaction_id) == 1
            }
            MessageKind::Decision { decision_id } => run.decision.as_ref().is_some_and(|d| {
                d.decision_id == *decision_id && d.status == DecisionStatus::Pending
            }),
            MessageKind::Notification => true,
            MessageKind::Terminal => run.status.is_terminal(),
            MessageKind::FollowUp { .. } => {
                run.status.is_terminal() && self.follow_up_may_follow(message)
            }
        }
    }

    /// A follow-up waits for its run's terminal message to be sent and its
    /// first turn to end, for every earlier follow-up of the session (its
    /// queue is per session) likewise, and for the release of the session's
    /// reservation: no run of the session is queued, running or waiting.
    fn follow_up_may_follow(&self, follow_up: &MessageRecord) -> bool {
        let delivered = |message: &MessageRecord| {
            message.state == MessageState::Sent && self.has_ended_turn(&message.message_id)
        };
        let terminal_done = self
            .messages
            .iter()
            .filter(|message| message.run_id == follow_up.run_id)
            .any(|message| message.kind == MessageKind::Terminal && delivered(message));
        let earlier_done = self
            .messages
            .iter()
            .filter(|message| {
                matches!(message.kind, MessageKind::FollowUp { .. })
                    && message.order < follow_up.order
            })
            .all(|message| message.state == MessageState::Cancelled || delivered(message));
        let released = self.runs.iter().all(|run| run.status.is_terminal());
        terminal_done && earlier_done && released
    }

    /// The message kind that would present each pending source again: a
    /// `resumed` step for each unpaused pending interaction, a decision
    /// message for each pending protected decision.
    fn pending_sources(&self) -> Vec<(RunId, MessageKind)> {
        let mut sources = Vec::new();
        for run in self.runs.iter().filter(|run| !run.status.is_terminal()) {
            let interaction = run
                .interaction
                .as_ref()
                .filter(|record| record.status == InteractionStatus::Pending && !run.paused);
            if let Some(record) = interaction {
                let kind = MessageKind::Step {
                    interaction_id: record.interaction_id.clone(),
                    reason: StepReason::Resumed,
                };
                sources.push((run.run_id.clone(), kind));
            }
            let decision = run
                .decision
                .as_ref()
                .filter(|record| record.status == DecisionStatus::Pending);
            if let Some(record) = decision {
                let kind = MessageKind::Decision {
                    decision_id: record.decision_id.clone(),
                };
                sources.push((run.run_id.clone(), kind));
            }
        }
        sources
    }

    /// Whether the source of `kind` has a pending message or an entry on the branch.
    fn shows_or_holds(&self, kind: &MessageKind, report: &BranchReport) -> bool {
        self.messages
            .iter()
            .filter(|message| same_source(&message.kind, kind))
            .any(|message| {
                message.state == MessageState::Pending || report.shows(&message.message_id)
            })
    }

    fn first_eligible(&self) -> Option<&MessageRecord> {
        self.messages
            .iter()
            .filter(|message| self.is_eligible(message))
            .min_by_key(|message| message.order)
    }
}

/// The one active coordinator connection of a session.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ActiveCoordinator {
    pub connection_id: ConnectionId,
    pub epoch: CoordinatorEpoch,
    /// Whether this epoch reported the active branch since it connected.
    pub branch_reported: bool,
    /// The message last offered to this epoch, until branch evidence adopts
    /// it or proves it absent (it may have been sent).
    pub offered: Option<MessageId>,
}

/// The process-local coordinator state of one session (never durable).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CoordinatorFacts {
    pub session_id: SessionId,
    pub active: Option<ActiveCoordinator>,
    /// The last epoch issued; the next connection gets the one after it.
    pub last_epoch: CoordinatorEpoch,
    /// Open connections a newer connection replaced: none of them becomes
    /// the coordinator again while another connection is active.
    pub fenced: Vec<ConnectionId>,
}

impl CoordinatorFacts {
    /// A session with no coordinator yet.
    pub fn new(session_id: SessionId) -> Self {
        Self {
            session_id,
            active: None,
            last_epoch: CoordinatorEpoch(0),
            fenced: Vec::new(),
        }
    }
}

/// Why a session transition was refused. Nothing changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum SessionRejection {
    /// The connection does not own the session's active coordinator epoch.
    StaleCoordinator,
    /// The epoch has not reported the active branch yet.
    BranchNotReported,
    /// A branch report named a message outside the session window.
    UnknownMessage { message_id: MessageId },
    /// The shell passed too few new message ids.
    MissingNewId,
    /// The turn id is already saved with another message, run or result.
    TurnConflict { turn_id: TurnId },
    /// The report names another run than the message's.
    RunMismatch { message_id: MessageId },
}

/// A new connection becomes the session's one active coordinator with the
/// next epoch; the previous connection, if any, is fenced. A repeat from the
/// active connection keeps its epoch. A fenced connection gets no epoch
/// while another connection is active (nothing changes): only a new
/// connection replaces the active one, so two open Pi processes cannot take
/// the epoch from each other by reading the session view in turn. When no
/// connection is active, any connection may become the coordinator.
pub fn connect(
    coordinator: &CoordinatorFacts,
    connection_id: ConnectionId,
) -> Transition<CoordinatorFacts> {
    let active = coordinator.active.as_ref();
    let already = active.is_some_and(|active| active.connection_id == connection_id);
    let fenced = active.is_some() && coordinator.fenced.contains(&connection_id);
    if already || fenced {
        return Transition::new(coordinator.clone());
    }
    let epoch = coordinator.last_epoch.next();
    debug_assert!(epoch > coordinator.last_epoch, "epochs only grow");
    let mut fenced: Vec<ConnectionId> = coordinator
        .fenced
        .iter()
        .filter(|fenced| **fenced != connection_id)
        .cloned()
        .collect();
    if let Some(previous) = active {
        fenced.push(previous.connection_id.clone());
    }
    let next = CoordinatorFacts {
        session_id: coordinator.session_id.clone(),
        active: Some(ActiveCoordinator {
            connection_id,
            epoch,
            branch_reported: false,
            offered: None,
        }),
        last_epoch: epoch,
        fenced,
    };
    let session_id = next.session_id.clone();
    Transition::new(next).with(Output::PublishSession { session_id })
}

/// The epoch `connection_id` owns, when it is the active coordinator.
pub fn epoch_of(
    coordinator: &CoordinatorFacts,
    connection_id: &ConnectionId,
) -> Option<CoordinatorEpoch> {
    coordinator
        .active
        .as_ref()
        .filter(|active| active.connection_id == *connection_id)
        .map(|active| active.epoch)
}

/// A connection closed: its epoch ends if it was the active one, and it is
/// no longer remembered as fenced. Open turns stay open; the next
/// coordinator's branch report decides about them.
pub fn disconnect(
    coordinator: &CoordinatorFacts,
    connection_id: &ConnectionId,
) -> Transition<CoordinatorFacts> {
    let is_active = coordinator
        .active
        .as_ref()
        .is_some_and(|active| active.connection_id == *connection_id);
    let fenced: Vec<ConnectionId> = coordinator
        .fenced
        .iter()
        .filter(|fenced| *fenced != connection_id)
        .cloned()
        .collect();
    if !is_active {
        return Transition::new(CoordinatorFacts {
            fenced,
            ..coordinator.clone()
        });
    }
    let next = CoordinatorFacts {
        active: None,
        fenced,
        ..coordinator.clone()
    };
    let session_id = next.session_id.clone();
    Transition::new(next).with(Output::PublishSession { session_id })
}

/// The active coordinator, when `connection_id` owns `epoch` and it is active.
pub fn check<'a>(
    coordinator: &'a CoordinatorFacts,
    connection_id: &ConnectionId,
    epoch: CoordinatorEpoch,
) -> Result<&'a ActiveCoordinator, SessionRejection> {
    coordinator
        .active
        .as_ref()
        .filter(|active| active.connection_id == *connection_id && active.epoch == epoch)
        .ok_or(SessionRejection::StaleCoordinator)
}

/// The message the active epoch may send next, if any: only after it
/// reported the branch; the offered message while it is still pending and
/// eligible; otherwise the first eligible pending message in acceptance order.
pub fn next_eligible(
    session: &SessionFacts,
    coordinator: &CoordinatorFacts,
    connection_id: &ConnectionId,
    epoch: CoordinatorEpoch,
) -> Option<MessageId> {
    let active = check(coordinator, connection_id, epoch).ok()?;
    if !active.branch_reported {
        return None;
    }
    let offered = active
        .offered
        .as_ref()
        .and_then(|offered| session.message(offered))
        .filter(|message| session.is_eligible(message));
    offered
        .or_else(|| session.first_eligible())
        .map(|message| message.message_id.clone())
}

/// The coordinator state after an offer, and the offered message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offered {
    pub coordinator: CoordinatorFacts,
    pub message_id: Option<MessageId>,
}

/// Names [`next_eligible`] to the active epoch and remembers it as offered,
/// so that no other message is offered until branch evidence settles it.
pub fn offer(
    session: &SessionFacts,
    coordinator: &CoordinatorFacts,
    connection_id: &ConnectionId,
    epoch: CoordinatorEpoch,
) -> Result<Offered, SessionRejection> {
    let active = check(coordinator, connection_id, epoch)?;
    if !active.branch_reported {
        return Err(SessionRejection::BranchNotReported);
    }
    let message_id = next_eligible(session, coordinator, connection_id, epoch);
    let mut next = coordinator.clone();
    if let (Some(active), Some(id)) = (next.active.as_mut(), message_id.as_ref()) {
        active.offered = Some(id.clone());
    }
    Ok(Offered {
        coordinator: next,
        message_id,
    })
}

/// What the coordinator saw on Pi's active branch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BranchReport {
    /// Window messages found on the active branch, with their Pi entries.
    pub entries: Vec<(MessageId, EntryId)>,
    /// Pi is idle (no model turn running).
    pub is_idle: bool,
    /// Pi has queued input or messages not yet on the branch.
    pub has_pending_messages: bool,
    /// The workflow message whose turn Pi is running now, if any.
    pub active_message: Option<MessageId>,
}

impl BranchReport {
    /// Whether absence from the branch proves anything.
    pub const fn proves_absence(&self) -> bool {
        self.is_idle && !self.has_pending_messages
    }

    fn shows(&self, message_id: &MessageId) -> bool {
        self.entries.iter().any(|(id, _)| id == message_id)
    }
}

/// Run-level work a session transition decided and the shell applies in the
/// same transaction, after writing the session facts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "runFollowUp")]
pub enum RunFollowUp {
    /// An aborted step turn: apply [`interaction::pause_after_aborted_turn`].
    Pause { run_id: RunId },
    /// An attempt change the execution module routes.
    Attempt { follow_up: AttemptFollowUp },
}

/// The result of a branch report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchReported {
    /// The session facts to commit; `None` when nothing durable changed.
    pub session: Option<Transition<SessionFacts>>,
    /// The coordinator state (branch reported, offer settled).
    pub coordinator: CoordinatorFacts,
    pub follow_ups: Vec<RunFollowUp>,
}

/// `workflowMessage.reportBranch`: adopts branch entries, and when absence is
/// provable ends unreported open turns as `Lost` (a lost step follows the
/// unproductive-turn rule) and presents pending sources again that have no
/// entry on the branch. `new_ids` must hold at least one id per pending
/// interaction and decision of the session.
pub fn report_branch(
    session: &SessionFacts,
    coordinator: &CoordinatorFacts,
    connection_id: &ConnectionId,
    epoch: CoordinatorEpoch,
    report: &BranchReport,
    new_ids: &[MessageId],
    now_ms: u64,
) -> Result<BranchReported, SessionRejection> {
    check(coordinator, connection_id, epoch)?;
    if let Some((unknown, _)) = report
        .entries
        .iter()
        .find(|(id, _)| session.message(id).is_none())
    {
        return Err(SessionRejection::UnknownMessage {
            message_id: unknown.clone(),
        });
    }
    let mut tx = SessionTx::begin(session, new_ids, now_ms);
    tx.adopt_entries(&report.entries);
    if report.proves_absence() {
        tx.lose_open_turns(report.active_message.as_ref(), None)?;
        tx.present_again(report)?;
    }
    let coordinator = reported(coordinator, report);
    let (session, follow_ups) = tx.finish();
    Ok(BranchReported {
        session,
        coordinator,
        follow_ups,
    })
}

fn reported(coordinator: &CoordinatorFacts, report: &BranchReport) -> CoordinatorFacts {
    let mut next = coordinator.clone();
    if let Some(active) = next.active.as_mut() {
        active.branch_reported = true;
        let settled = active
            .offered
            .as_ref()
            .is_some_and(|offered| report.proves_absence() || report.shows(offered));
        if settled {
            active.offered = None;
        }
    }
    next
}

/// How a reported turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StopReason {
    Completed,
    Aborted,
    Error,
}

impl StopReason {
    const fn state(self) -> TurnState {
        match self {
            Self::Completed => TurnState::Completed,
            Self::Aborted => TurnState::Aborted,
            Self::Error => TurnState::Error,
        }
    }
}

/// Which half of a Pi model turn is reported.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "phase")]
pub enum TurnPhase {
    Start,
    End {
        stop_reason: StopReason,
        /// The response entry on the branch, when Pi shows one.
        entry_id: Option<EntryId>,
    },
}

/// `workflowTurn.report`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TurnReport {
    pub message_id: MessageId,
    pub run_id: RunId,
    pub turn_id: TurnId,
    pub phase: TurnPhase,
}

/// Whether a reported turn is workflow work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TurnOwnership {
    /// The turn is open workflow work.
    Active,
    /// The turn has ended (reported, lost or cleaned up by a terminal run).
    Settled,
    /// The turn is not workflow work (its message is closed or it is unknown).
    Absent,
}

/// The version-1 turn receipt: the ownership and the exact saved turn.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TurnReceipt {
    pub ownership: TurnOwnership,
    pub turn: Option<TurnRecord>,
}

/// The result of a turn report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnReported {
    pub receipt: TurnReceipt,
    /// The session facts to commit; `None` when the report changed nothing
    /// (a matching repeat, or an absent turn).
    pub session: Option<Transition<SessionFacts>>,
    pub follow_ups: Vec<RunFollowUp>,
}

/// `workflowTurn.report` from the active epoch after its branch report. A
/// start opens a turn against an open message; an end settles the named
/// turn and applies the pause or unproductive-turn rule. `new_ids` must hold
/// at least one id (for a reminder).
pub fn report_turn(
    session: &SessionFacts,
    coordinator: &CoordinatorFacts,
    connection_id: &ConnectionId,
    epoch: CoordinatorEpoch,
    report: &TurnReport,
    new_ids: &[MessageId],
    now_ms: u64,
) -> Result<TurnReported, SessionRejection> {
    let active = check(coordinator, connection_id, epoch)?;
    if !active.branch_reported {
        return Err(SessionRejection::BranchNotReported);
    }
    let saved = session.turn(&report.turn_id);
    if saved
        .is_some_and(|saved| saved.message_id != report.message_id || saved.run_id != report.run_id)
    {
        return Err(SessionRejection::TurnConflict {
            turn_id: report.turn_id.clone(),
        });
    }
    match &report.phase {
        TurnPhase::Start => start_turn(session, report, new_ids, now_ms),
        TurnPhase::End {
            stop_reason,
            entry_id,
        } => end_turn(session, report, *stop_reason, entry_id, new_ids, now_ms),
    }
}

fn unchanged(ownership: TurnOwnership, turn: Option<&TurnRecord>) -> TurnReported {
    TurnReported {
        receipt: TurnReceipt {
            ownership,
            turn: turn.cloned(),
        },
        session: None,
        follow_ups: Vec::new(),
    }
}

fn start_turn(
    session: &SessionFacts,
    report: &TurnReport,
    new_ids: &[MessageId],
    now_ms: u64,
) -> Result<TurnReported, SessionRejection> {
    if let Some(saved) = session.turn(&report.turn_id) {
        if saved.state != TurnState::Open {
            return Ok(unchanged(TurnOwnership::Settled, Some(saved)));
        }
        // The repeat of an open turn's start (a new epoch after a
        // reconnect): its step's clock runs again.
        let mut tx = SessionTx::begin(session, new_ids, now_ms);
        tx.start_clock(saved);
        let (session, follow_ups) = tx.finish();
        return Ok(TurnReported {
            receipt: TurnReceipt {
                ownership: TurnOwnership::Active,
                turn: Some(saved.clone()),
            },
            session,
            follow_ups,
        });
    }
    let Some(message) = session.message(&report.message_id) else {
        return Ok(unchanged(TurnOwnership::Absent, None));
    };
    if message.run_id != report.run_id {
        return Err(SessionRejection::RunMismatch {
            message_id: report.message_id.clone(),
        });
    }
    if !session.is_open(message) {
        return Ok(unchanged(TurnOwnership::Absent, None));
    }
    let turn = TurnRecord {
        turn_id: report.turn_id.clone(),
        message_id: report.message_id.clone(),
        run_id: report.run_id.clone(),
        session_id: session.session_id.clone(),
        state: TurnState::Open,
        started_at_ms: now_ms,
        ended_at_ms: None,
        response_entry_id: None,
    };
    let mut tx = SessionTx::begin(session, new_ids, now_ms);
    // Pi runs one turn at a time: a new turn proves every older one ended.
    tx.lose_open_turns(None, None)?;
    let still_open = tx
        .facts
        .message(&report.message_id)
        .is_some_and(|message| tx.facts.is_open(message));
    let receipt = if still_open {
        tx.facts.turns.push(turn.clone());
        tx.changed = true;
        tx.start_clock(&turn);
        TurnReceipt {
            ownership: TurnOwnership::Active,
            turn: Some(turn),
        }
    } else {
        // The older turn's end closed the step (its attempt now fails).
        TurnReceipt {
            ownership: TurnOwnership::Absent,
            turn: None,
        }
    };
    let (session, follow_ups) = tx.finish();
    Ok(TurnReported {
        receipt,
        session,
        follow_ups,
    })
}

fn end_turn(
    session: &SessionFacts,
    report: &TurnReport,
    stop_reason: StopReason,
    entry_id: &Option<EntryId>,
    new_ids: &[MessageId],
    now_ms: u64,
) -> Result<TurnReported, SessionRejection> {
    let Some(saved) = session.turn(&report.turn_id) else {
        return Ok(unchanged(TurnOwnership::Absent, None));
    };
    match saved.state {
        TurnState::Open => {}
        // A late end adopts the server's own closure (idle branch, terminal run).
        TurnState::Lost => return Ok(unchanged(TurnOwnership::Settled, Some(saved))),
        state if state == stop_reason.state() && saved.response_entry_id == *entry_id => {
            return Ok(unchanged(TurnOwnership::Settled, Some(saved)));
        }
        _ => {
            return Err(SessionRejection::TurnConflict {
                turn_id: report.turn_id.clone(),
            });
        }
    }
    let mut tx = SessionTx::begin(session, new_ids, now_ms);
    let ended = tx.end(&report.turn_id, stop_reason.state(), entry_id.clone());
    if stop_reason == StopReason::Aborted {
        tx.pause_for(&ended);
    } else {
        tx.count_unproductive(&ended)?;
    }
    let (session, follow_ups) = tx.finish();
    Ok(TurnReported {
        receipt: TurnReceipt {
            ownership: TurnOwnership::Settled,
            turn: Some(ended),
        },
        session,
        follow_ups,
    })
}

/// The coordinator's connection closed (or the server stopped, at
/// `stopped_at_ms`): every running [`interaction::TurnClock`] of the session
/// stops there, keeping what it consumed. Nothing changes while another
/// connection is the active coordinator (its reports decide about the open
/// turns) or when no clock runs. Open turns stay open.
pub fn suspend_clocks(
    session: &SessionFacts,
    coordinator: &CoordinatorFacts,
    stopped_at_ms: u64,
) -> Option<Transition<SessionFacts>> {
    if coordinator.active.is_some() {
        return None;
    }
    let mut facts = session.clone();
    let mut changed = false;
    for record in facts
        .runs
        .iter_mut()
        .filter_map(|run| run.interaction.as_mut())
    {
        if record.clock.is_running() {
            record.clock = record.clock.stopped(stopped_at_ms);
            changed = true;
        }
    }
    let session_id = facts.session_id.clone();
    changed.then(|| Transition::new(facts).with(Output::PublishSession { session_id }))
}

/// Builds one session transition: mutations on a copy of the facts, the
/// run-level follow-ups, the wakes of started clocks, and one
/// `PublishSession` when anything changed.
struct SessionTx<'ids> {
    facts: SessionFacts,
    new_ids: core::slice::Iter<'ids, MessageId>,
    follow_ups: Vec<RunFollowUp>,
    wakes: Vec<Output>,
    changed: bool,
    now_ms: u64,
}

impl<'ids> SessionTx<'ids> {
    fn begin(facts: &SessionFacts, new_ids: &'ids [MessageId], now_ms: u64) -> Self {
        Self {
            facts: facts.clone(),
            new_ids: new_ids.iter(),
            follow_ups: Vec::new(),
            wakes: Vec::new(),
            changed: false,
            now_ms,
        }
    }

    fn finish(self) -> (Option<Transition<SessionFacts>>, Vec<RunFollowUp>) {
        if !self.changed {
            return (None, self.follow_ups);
        }
        let session_id = self.facts.session_id.clone();
        let mut transition = Transition::new(self.facts);
        transition.outputs = self.wakes;
        let transition = transition.with(Output::PublishSession { session_id });
        (Some(transition), self.follow_ups)
    }

    /// The pending, unpaused request whose step message `turn` runs.
    fn turn_request(&mut self, turn: &TurnRecord) -> Option<&mut InteractionRecord> {
        let interaction_id = self.step_source(turn)?;
        let run = self.facts.run_mut(&turn.run_id)?;
        if run.paused || run.status.is_terminal() {
            return None;
        }
        run.interaction.as_mut().filter(|record| {
            record.interaction_id == interaction_id && record.status == InteractionStatus::Pending
        })
    }

    /// An open step turn runs its request's clock, with one wake at its deadline.
    fn start_clock(&mut self, turn: &TurnRecord) {
        let now_ms = self.now_ms;
        let Some(record) = self.turn_request(turn) else {
            return;
        };
        if record.clock.is_running() {
            return;
        }
        record.clock = record.clock.started(now_ms);
        let wake = record
            .clock
            .deadline_at_ms(now_ms)
            .map(|at_ms| Output::Wake {
                run_id: record.run_id.clone(),
                at_ms,
                reason: WakeReason::NodeDeadline {
                    attempt_id: record.attempt_id.clone(),
                },
            });
        self.wakes.extend(wake);
        self.changed = true;
    }

    /// An ended step turn stops its request's clock.
    fn stop_clock(&mut self, turn: &TurnRecord) {
        let now_ms = self.now_ms;
        let Some(interaction_id) = self.step_source(turn) else {
            return;
        };
        let record = self
            .facts
            .run_mut(&turn.run_id)
            .and_then(|run| run.interaction.as_mut())
            .filter(|record| record.interaction_id == interaction_id);
        if let Some(record) = record.filter(|record| record.clock.is_running()) {
            record.clock = record.clock.stopped(now_ms);
            self.changed = true;
        }
    }

    /// A matching `Pending` or `Cancelled` message becomes `Sent`; a `Sent`
    /// message keeps its first entry.
    fn adopt_entries(&mut self, entries: &[(MessageId, EntryId)]) {
        for (message_id, entry_id) in entries {
            let message = self
                .facts
                .messages
                .iter_mut()
                .find(|message| message.message_id == *message_id);
            if let Some(message) = message.filter(|m| m.state != MessageState::Sent) {
                message.state = MessageState::Sent;
                message.entry_id = Some(entry_id.clone());
                self.changed = true;
            }
        }
    }

    /// Ends open turns as `Lost`, except the turn of `active_message` and the
    /// turn `keep`; lost step turns follow the unproductive-turn rule.
    fn lose_open_turns(
        &mut self,
        active_message: Option<&MessageId>,
        keep: Option<&TurnId>,
    ) -> Result<(), SessionRejection> {
        let lost: Vec<TurnId> = self
            .facts
            .turns
            .iter()
            .filter(|turn| turn.state == TurnState::Open)
            .filter(|turn| Some(&turn.message_id) != active_message && Some(&turn.turn_id) != keep)
            .map(|turn| turn.turn_id.clone())
            .collect();
        for turn_id in lost {
            let ended = self.end(&turn_id, TurnState::Lost, None);
            self.count_unproductive(&ended)?;
        }
        Ok(())
    }

    fn end(&mut self, turn_id: &TurnId, state: TurnState, entry_id: Option<EntryId>) -> TurnRecord {
        let turn = self
            .facts
            .turns
            .iter_mut()
            .find(|turn| turn.turn_id == *turn_id)
            .expect("the caller found the turn");
        turn.state = state;
        turn.ended_at_ms = Some(self.now_ms);
        turn.response_entry_id = entry_id;
        self.changed = true;
        let ended = turn.clone();
        self.stop_clock(&ended);
        ended
    }

    fn step_source(&self, turn: &TurnRecord) -> Option<InteractionId> {
        match &self.facts.message(&turn.message_id)?.kind {
            MessageKind::Step { interaction_id, .. } => Some(interaction_id.clone()),
            _ => None,
        }
    }

    /// An aborted step turn pauses its run while the step is still pending:
    /// the session mirrors the pause and cancels the pending step messages;
    /// the durable pause is the returned follow-up.
    fn pause_for(&mut self, turn: &TurnRecord) {
        let Some(interaction_id) = self.step_source(turn) else {
            return;
        };
        let Some(run) = self.facts.run_mut(&turn.run_id) else {
            return;
        };
        if run.paused
            || run.status.is_terminal()
            || run.pending_interaction(&interaction_id).is_none()
        {
            return;
        }
        run.paused = true;
        interaction::cancel_pending_steps(&mut self.facts.messages, &interaction_id);
        self.follow_ups.push(RunFollowUp::Pause {
            run_id: turn.run_id.clone(),
        });
    }

    /// The unproductive-turn rule for a completed, errored or lost turn.
    fn count_unproductive(&mut self, turn: &TurnRecord) -> Result<(), SessionRejection> {
        let Some(interaction_id) = self.step_source(turn) else {
            return Ok(());
        };
        let counts = self
            .facts
            .run(&turn.run_id)
            .is_some_and(|run| run.counts_unproductive(&interaction_id));
        if !counts {
            return Ok(());
        }
        let record = self
            .facts
            .run_mut(&turn.run_id)
            .and_then(|run| run.interaction.as_mut())
            .expect("counts_unproductive found the request");
        record.unproductive_turn_ends += 1;
        let ends = record.unproductive_turn_ends;
        if ends > MAX_REMINDERS {
            record.status = InteractionStatus::Failed;
            let follow_up = AttemptFollowUp::Fail {
                run_id: record.run_id.clone(),
                attempt_id: record.attempt_id.clone(),
                reason: ReasonKind::UnproductiveTurns,
            };
            interaction::cancel_pending_steps(&mut self.facts.messages, &interaction_id);
            self.follow_ups.push(RunFollowUp::Attempt { follow_up });
            return Ok(());
        }
        if self.facts.pending_steps(&interaction_id) == 0 {
            // The pending step, if any, already presents the step again.
            let kind = MessageKind::Step {
                interaction_id,
                reason: StepReason::Reminder,
            };
            self.create_message(&turn.run_id, kind)?;
        }
        Ok(())
    }

    /// Presents each pending source again that has no pending message and no
    /// entry on the branch: a `resumed` step for an unpaused interaction, a
    /// decision message for a protected decision.
    fn present_again(&mut self, report: &BranchReport) -> Result<(), SessionRejection> {
        let absent: Vec<(RunId, MessageKind)> = self
            .facts
            .pending_sources()
            .into_iter()
            .filter(|(_, kind)| !self.facts.shows_or_holds(kind, report))
            .collect();
        for (run_id, kind) in absent {
            if let MessageKind::Step { interaction_id, .. } = &kind {
                self.bump_revision(&run_id, interaction_id);
            }
            self.create_message(&run_id, kind)?;
        }
        Ok(())
    }

    fn bump_revision(&mut self, run_id: &RunId, interaction_id: &InteractionId) {
        let record = self
            .facts
            .run_mut(run_id)
            .and_then(|run| run.interaction.as_mut())
            .filter(|record| record.interaction_id == *interaction_id);
        if let Some(record) = record {
            record.revision += 1;
        }
    }

    fn create_message(
        &mut self,
        run_id: &RunId,
        kind: MessageKind,
    ) -> Result<(), SessionRejection> {
        let message_id = self
            .new_ids
            .next()
            .cloned()
            .ok_or(SessionRejection::MissingNewId)?;
        let order = self.facts.next_message_order;
        self.facts.next_message_order += 1;
        self.facts.messages.push(MessageRecord {
            message_id,
            session_id: self.facts.session_id.clone(),
            run_id: run_id.clone(),
            kind,
            order,
            state: MessageState::Pending,
            entry_id: None,
            created_at_ms: self.now_ms,
        });
        self.changed = true;
        Ok(())
    }
}

/// Whether two messages present the same source (one request or one decision).
fn same_source(a: &MessageKind, b: &MessageKind) -> bool {
    match (a, b) {
        (
            MessageKind::Step { interaction_id, .. },
            MessageKind::Step {
                interaction_id: other,
                ..
            },
        ) => interaction_id == other,
        (MessageKind::Decision { decision_id }, MessageKind::Decision { decision_id: other }) => {
            decision_id == other
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
