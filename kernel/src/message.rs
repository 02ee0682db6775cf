//! Workflow messages (content Pi must add to an origin conversation) and the
//! model turns they open.
//!
//! Invariants:
//! - A message is `Pending`, `Sent` or `Cancelled`. `Sent` never returns to
//!   `Pending`; branch evidence may turn a `Pending` or `Cancelled` message
//!   into `Sent` (the send happened even if the source cancelled it).
//! - At most one pending step message exists per interactive request, and at
//!   most one pending reminder-reason step exists at all for that request.
//! - Message kind decides turn behaviour: decisions and notifications never
//!   open a turn; a terminal or follow-up message is open until its first
//!   turn ends; the latest sent step is open while its interaction is pending
//!   and its run is not paused.
//! - A terminal run ends its open turns as `Lost` and cancels its pending step
//!   and decision messages; failure, timeout and cancellation also cancel
//!   pending follow-ups. Notifications stay eligible.

use crate::ids::{DecisionId, EntryId, InteractionId, MessageId, RunId, SessionId, TurnId};
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// Why a step message exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepReason {
    Initial,
    Reminder,
    Resumed,
}

/// What the message carries; decides its renderer and eligibility rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum MessageKind {
    Step {
        interaction_id: InteractionId,
        reason: StepReason,
    },
    Decision {
        decision_id: DecisionId,
    },
    Notification,
    Terminal,
    FollowUp {
        follow_up_id: String,
    },
}

/// Delivery state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MessageState {
    Pending,
    Sent,
    Cancelled,
}

/// One `workflow_messages` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MessageRecord {
    pub message_id: MessageId,
    pub session_id: SessionId,
    pub run_id: RunId,
    pub kind: MessageKind,
    /// Acceptance order within the session.
    pub order: u64,
    pub state: MessageState,
    /// The Pi entry that proves the message is on the active branch.
    pub entry_id: Option<EntryId>,
    pub created_at_ms: u64,
}

/// How a reported model turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TurnState {
    Open,
    Completed,
    Aborted,
    Error,
    /// Closed by the server without an end report (idle branch or terminal run).
    Lost,
}

/// One workflow turn: a Pi model turn the server accepted as workflow work.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TurnRecord {
    pub turn_id: TurnId,
    pub message_id: MessageId,
    pub run_id: RunId,
    pub session_id: SessionId,
    pub state: TurnState,
    pub started_at_ms: u64,
    pub ended_at_ms: Option<u64>,
    /// The Pi response entry the end report named (evidence only; may be absent).
    pub response_entry_id: Option<EntryId>,
}

/// How a run became terminal, for message cleanup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TerminalKind {
    Completed,
    Failed,
    TimedOut,
    Cancelled,
}

/// What a durable pause does to one message: pending step messages are cancelled.
pub fn on_pause(message: &MessageRecord) -> MessageRecord {
    let mut next = message.clone();
    if message.state == MessageState::Pending && matches!(message.kind, MessageKind::Step { .. }) {
        next.state = MessageState::Cancelled;
    }
    next
}

/// What a terminal run does to one of its messages.
pub fn on_run_terminal(message: &MessageRecord, terminal: TerminalKind) -> MessageRecord {
    let mut next = message.clone();
    if message.state != MessageState::Pending {
        return next;
    }
    let cancel = match &message.kind {
        MessageKind::Step { .. } | MessageKind::Decision { .. } => true,
        MessageKind::FollowUp { .. } => terminal != TerminalKind::Completed,
        MessageKind::Notification | MessageKind::Terminal => false,
    };
    if cancel {
        next.state = MessageState::Cancelled;
    }
    next
}

/// What a terminal run does to one of its turns: an open turn ends as lost.
pub fn on_run_terminal_turn(turn: &TurnRecord, now_ms: u64) -> TurnRecord {
    let mut next = turn.clone();
    if turn.state == TurnState::Open {
        next.state = TurnState::Lost;
        next.ended_at_ms = Some(now_ms);
    }
    next
}
