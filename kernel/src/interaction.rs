//! Interactive requests and their submissions.
//!
//! Invariants:
//! - One node attempt has at most one interactive request.
//! - Pause is stored once, on the run; an interaction is paused exactly when
//!   its run is paused and is never paused on its own.
//! - A request settles only through an accepted submission, cancellation or
//!   timeout; a rejected submission leaves it pending.

use crate::ids::{
    AttemptId, Digest, IdempotencyKey, InteractionId, NodeId, RunId, SessionId, SubmissionId,
};
use serde::{Deserialize, Serialize};

/// What kind of work the origin session must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InteractionKind {
    /// An agent step that completes through `submit` (and may `update`).
    SubmittedOutput,
    /// An agent step whose visible assistant reply is the output.
    AssistantMessage,
}

/// The state of one interactive request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InteractionStatus {
    Pending,
    /// Settled by the accepted submission.
    Accepted,
    Cancelled,
    TimedOut,
    /// The attempt failed (for example after too many unproductive turns).
    Failed,
}

/// One `interactive_requests` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InteractionRecord {
    pub interaction_id: InteractionId,
    pub run_id: RunId,
    pub attempt_id: AttemptId,
    pub node_id: NodeId,
    pub target_session: SessionId,
    pub kind: InteractionKind,
    pub contract_hash: Digest,
    pub status: InteractionStatus,
    pub accepted_submission: Option<SubmissionId>,
    /// Completed, recoverably failed or lost turns that ended without a submission.
    pub unproductive_turn_ends: u32,
    /// Increases when the request is presented again (resume after an aborted turn).
    pub revision: u32,
    pub created_at_ms: u64,
}

/// The validation state of one submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SubmissionOutcome {
    /// A supervised child is running the node's `validate`.
    Validating,
    Accepted,
    Rejected,
}

/// One `interactive_submissions` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SubmissionRecord {
    pub interaction_id: InteractionId,
    pub submission_id: SubmissionId,
    pub idempotency_key: IdempotencyKey,
    pub payload_hash: Digest,
    pub outcome: SubmissionOutcome,
    pub submitted_at_ms: u64,
}

/// What a terminal run (cancelled, failed, timed out) does to its pending request.
pub fn on_run_terminal(record: &InteractionRecord) -> InteractionRecord {
    let mut next = record.clone();
    if record.status == InteractionStatus::Pending {
        next.status = InteractionStatus::Cancelled;
    }
    next
}
