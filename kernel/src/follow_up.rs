//! Follow-ups: prompts a person queues in an origin session while a workflow
//! runs, delivered in order as normal Pi turns after the workflow completes.
//!
//! A follow-up is queued against a run's continuation chain (the chain is
//! named by its first run; a checkpoint's continuation carries on the same
//! chain) and lives in two records: its feature record
//! ([`FollowUpRecord`], `workflow_follow_ups`, with its session queue's
//! position) and, once the chain's final leaf completed, one workflow
//! message of kind `followUp` on that leaf, which the session coordinator
//! offers like every other message (`crate::session`).
//!
//! Invariants:
//! - Positions of a session's queue only grow: a follow-up accepted later
//!   has a higher position, and its message a higher session order.
//! - A follow-up gets a message only when its chain's final leaf completed
//!   (not a parent settled by its continuation): [`settle`] gives every
//!   queued follow-up of the chain its message, in position order, and a
//!   chain that failed, timed out or was cancelled cancels them instead.
//!   A follow-up added after its chain completed gets its message at once;
//!   one added after its chain ended otherwise is refused.
//! - A follow-up has at most one message; a cancelled follow-up never gets
//!   one, and cancelling it cancels its pending message. A follow-up whose
//!   message was sent cannot be cancelled.
//! - Delivery order and waiting are the session's rules
//!   (`SessionFacts::is_eligible`): a follow-up message waits for its run's
//!   terminal message to be sent and its first turn to end, for every
//!   earlier follow-up of the session, and for the release of the session's
//!   reservation (no queued, running or waiting run of the session).

use crate::ids::{MessageId, RunId, SessionId};
use crate::message::{MessageKind, MessageRecord, MessageState};
use crate::output::{Output, Transition};
use crate::run::{ExecutionMode, RunStatus};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// Where a follow-up is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FollowUpState {
    /// Waiting for its chain to end.
    Queued,
    /// Its message exists; the message's state is its delivery state.
    Messaged,
    /// Cancelled before delivery (by `followUp.cancel` or by its chain's
    /// failure, timeout or cancellation).
    Cancelled,
}

/// One `workflow_follow_ups` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FollowUpRecord {
    pub follow_up_id: String,
    pub session_id: SessionId,
    /// The first run of the continuation chain the follow-up waits for.
    pub chain_run_id: RunId,
    /// Acceptance position in the session's queue (from 1, only grows).
    pub position: u64,
    pub state: FollowUpState,
    /// Its message, once it has one.
    pub message_id: Option<MessageId>,
}

/// The chain a follow-up is added to, loaded by the shell: the run the
/// request names, the chain's first run, and its current final leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainFacts<'a> {
    /// The named run's mode (its origin session).
    pub mode: &'a ExecutionMode,
    /// The first run of the named run's continuation chain.
    pub chain_run_id: &'a RunId,
    /// The chain's final leaf (the named run itself when not continued).
    pub leaf_run_id: &'a RunId,
    pub leaf_status: RunStatus,
}

/// The id of the one message of the follow-up `follow_up_id`.
pub fn message_id(follow_up_id: &str) -> MessageId {
    MessageId::new(format!("follow-up:{follow_up_id}"))
}

/// The id and numbers a new follow-up takes, chosen by the shell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewFollowUp {
    pub follow_up_id: String,
    /// The session queue's next position.
    pub position: u64,
    /// The session's next message order.
    pub message_order: u64,
}

/// A follow-up with its message, when it has one (new or changed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowUpFacts {
    pub follow_up: FollowUpRecord,
    pub message: Option<MessageRecord>,
}

/// Why a follow-up command was refused. Nothing changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum FollowUpRejection {
    /// A headless run has no session to follow up in.
    Headless,
    /// The chain failed, timed out or was cancelled: nothing follows it.
    ChainEnded { status: RunStatus },
    /// The follow-up's message was sent; it cannot be cancelled.
    AlreadyDelivered,
}

fn message_of(
    follow_up_id: &str,
    session_id: &SessionId,
    leaf_run_id: &RunId,
    order: u64,
    now_ms: u64,
) -> MessageRecord {
    MessageRecord {
        message_id: message_id(follow_up_id),
        session_id: session_id.clone(),
        run_id: leaf_run_id.clone(),
        kind: MessageKind::FollowUp {
            follow_up_id: String::from(follow_up_id),
        },
        order,
        state: MessageState::Pending,
        entry_id: None,
        created_at_ms: now_ms,
    }
}

/// `followUp.add`: queues a follow-up of the named run's chain in its origin
/// session, or gives it its message at once when the chain completed.
pub fn add(
    chain: &ChainFacts<'_>,
    new: NewFollowUp,
    now_ms: u64,
) -> Result<Transition<FollowUpFacts>, FollowUpRejection> {
    let Some(session_id) = chain.mode.origin_session() else {
        return Err(FollowUpRejection::Headless);
    };
    let mut follow_up = FollowUpRecord {
        follow_up_id: new.follow_up_id,
        session_id: session_id.clone(),
        chain_run_id: chain.chain_run_id.clone(),
        position: new.position,
        state: FollowUpState::Queued,
        message_id: None,
    };
    let message = match chain.leaf_status {
        RunStatus::Queued | RunStatus::Running | RunStatus::Waiting => None,
        RunStatus::Completed => {
            follow_up.state = FollowUpState::Messaged;
            follow_up.message_id = Some(message_id(&follow_up.follow_up_id));
            Some(message_of(
                &follow_up.follow_up_id,
                session_id,
                chain.leaf_run_id,
                new.message_order,
                now_ms,
            ))
        }
        status @ (RunStatus::Failed | RunStatus::TimedOut | RunStatus::Cancelled) => {
            return Err(FollowUpRejection::ChainEnded { status });
        }
    };
    let session_id = session_id.clone();
    Ok(Transition::new(FollowUpFacts { follow_up, message })
        .with(Output::PublishSession { session_id }))
}

/// `followUp.cancel`: a queued follow-up is cancelled, and a messaged one
/// whose message is still pending is cancelled with its message. Cancelling
/// a cancelled follow-up changes nothing.
pub fn cancel(
    follow_up: &FollowUpRecord,
    message: Option<&MessageRecord>,
) -> Result<Transition<FollowUpFacts>, FollowUpRejection> {
    let mut next = follow_up.clone();
    let message = match (follow_up.state, message) {
        (FollowUpState::Cancelled, message) => message.cloned(),
        (FollowUpState::Queued, message) => {
            next.state = FollowUpState::Cancelled;
            message.cloned()
        }
        (FollowUpState::Messaged, Some(message)) if message.state == MessageState::Sent => {
            return Err(FollowUpRejection::AlreadyDelivered);
        }
        (FollowUpState::Messaged, message) => {
            next.state = FollowUpState::Cancelled;
            message.map(|message| {
                let mut cancelled = message.clone();
                cancelled.state = MessageState::Cancelled;
                cancelled
            })
        }
    };
    let session_id = next.session_id.clone();
    Ok(Transition::new(FollowUpFacts {
        follow_up: next,
        message,
    })
    .with(Output::PublishSession { session_id }))
}

/// A chain's final leaf ended (its terminal message is built in the same
/// transaction): every queued follow-up of the chain, in position order,
/// gets its message on the leaf (session orders from `first_order`) when
/// the leaf completed, and is cancelled when it failed, timed out or was
/// cancelled. Follow-ups that are not queued are left as they are; a leaf
/// that has not ended changes nothing.
pub fn settle(
    queued: &[FollowUpRecord],
    leaf_run_id: &RunId,
    leaf_status: RunStatus,
    first_order: u64,
    now_ms: u64,
) -> Vec<FollowUpFacts> {
    let mut waiting: Vec<&FollowUpRecord> = queued
        .iter()
        .filter(|follow_up| follow_up.state == FollowUpState::Queued)
        .collect();
    waiting.sort_by_key(|follow_up| follow_up.position);
    let completed = match leaf_status {
        RunStatus::Queued | RunStatus::Running | RunStatus::Waiting => return Vec::new(),
        RunStatus::Completed => true,
        RunStatus::Failed | RunStatus::TimedOut | RunStatus::Cancelled => false,
    };
    let mut order = first_order;
    let mut settled = Vec::new();
    for follow_up in waiting {
        let mut next = follow_up.clone();
        let message = if completed {
            next.state = FollowUpState::Messaged;
            next.message_id = Some(message_id(&next.follow_up_id));
            let message = message_of(
                &next.follow_up_id,
                &next.session_id,
                leaf_run_id,
                order,
                now_ms,
            );
            order += 1;
            Some(message)
        } else {
            next.state = FollowUpState::Cancelled;
            None
        };
        settled.push(FollowUpFacts {
            follow_up: next,
            message,
        });
    }
    settled
}

#[cfg(test)]
mod tests;
