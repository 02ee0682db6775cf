//! Durable command receipts (`host_commands`) and runner-message receipts
//! (`worker_messages`): how a retried command finds the outcome it already got.
//!
//! Invariants:
//! - A client command's durable fingerprint is its whole [`CommandIdentity`]:
//!   client, operation, idempotency key, run id, expected revision and
//!   payload digest. The transport request id is never part of it.
//! - Request ids are scoped by client: one (client, request id) names at
//!   most one fingerprint, and one (client, idempotency key) names at most
//!   one fingerprint. Reusing either with another fingerprint is a conflict,
//!   and a conflict changes nothing. Two clients may use the same request id.
//! - A command whose identity matches a stored receipt adopts that receipt,
//!   whatever its request id: two commands that share a key and a
//!   fingerprint always get the same receipt. The request id decides
//!   nothing except that its reuse with another fingerprint conflicts.
//! - Only durable outcomes (`accepted`, `rejected`, `notFound`) are stored.
//!   Transient outcomes (`conflict`, `claimLost`, `unavailable`) leave no
//!   receipt, so a later retry can still succeed; `adopted` is the reply to a
//!   stored receipt and is never stored itself.
//! - A runner message is named by (runner epoch, message id): an exact retry
//!   (same payload digest) gets the stored reply; another payload under the
//!   same name is a conflict.

use crate::ids::{ClientId, Digest, IdempotencyKey, RequestId, Revision, RunId, RunnerEpochId};
use alloc::string::String;
use core::fmt;
use serde::{Deserialize, Serialize};

/// A state-changing client operation: the ones that store a receipt,
/// generated from `client.v1`'s `x-stateChanging` list (never written by
/// hand; `Operation::is_state_changing` and the SDK's
/// `STATE_CHANGING_OPERATIONS` come from the same list).
pub use crate::generated::CommandOperation;

/// The durable identity of one client command: everything except the
/// transport request id. Two commands with equal identities are one command.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CommandIdentity {
    pub client_id: ClientId,
    pub operation: CommandOperation,
    pub idempotency_key: IdempotencyKey,
    /// The run named in the envelope (absent for `run.start` and server commands).
    pub run_id: Option<RunId>,
    pub expected_revision: Option<Revision>,
    /// Digest of the canonical payload.
    pub payload_digest: Digest,
}

/// One transport attempt of a command.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Incoming {
    pub request_id: RequestId,
    pub identity: CommandIdentity,
}

/// A command outcome on the wire. Exactly these seven exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CommandOutcome {
    Accepted,
    /// The reply to a retry that found a stored receipt.
    Adopted,
    Rejected,
    Conflict,
    NotFound,
    ClaimLost,
    Unavailable,
}

impl CommandOutcome {
    /// Whether a receipt with this outcome is stored (and adopted by retries).
    /// Transient outcomes are not stored, so a later retry can succeed.
    pub const fn is_durable(self) -> bool {
        matches!(self, Self::Accepted | Self::Rejected | Self::NotFound)
    }
}

/// One `host_commands` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StoredCommand {
    /// The transport attempt that executed the command (the primary key,
    /// with the identity's client id).
    pub request_id: RequestId,
    pub identity: CommandIdentity,
    /// Always durable.
    pub outcome: CommandOutcome,
    /// The run revision the command committed, if it changed a run.
    pub revision: Option<Revision>,
    /// Digest of the stored receipt or error body.
    pub receipt_digest: Digest,
    pub recorded_at_ms: u64,
}

impl StoredCommand {
    /// The outcome a retry that adopts this receipt replies with: an accepted
    /// command is `adopted`; a stored rejection or `notFound` repeats itself.
    pub const fn adopted_outcome(&self) -> CommandOutcome {
        match self.outcome {
            CommandOutcome::Accepted => CommandOutcome::Adopted,
            other => other,
        }
    }
}

/// Why a command conflicts with a stored receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ConflictReason {
    /// The client's request id already names a command with another fingerprint.
    RequestIdReused,
    /// The client's idempotency key already names a command with another fingerprint.
    IdempotencyKeyReused,
}

/// What the shell does with an incoming command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReceiptDecision {
    /// No receipt exists: execute the command, then [`record`] its outcome.
    Execute,
    /// The same command committed before: reply with this receipt
    /// ([`StoredCommand::adopted_outcome`]) and change nothing.
    Adopt(StoredCommand),
    /// Reply `conflict` and change nothing.
    Conflict(ConflictReason),
}

/// Decides an incoming command against the receipts the shell found under its
/// client and request id (`by_request_id`) and under its client and
/// idempotency key (`by_key`).
///
/// # Panics
/// If `by_request_id` or `by_key` was loaded under another client, request
/// id or key (a broken shell invariant).
pub fn decide(
    by_request_id: Option<&StoredCommand>,
    by_key: Option<&StoredCommand>,
    incoming: &Incoming,
) -> ReceiptDecision {
    if let Some(stored) = by_request_id {
        let same_request = stored.request_id == incoming.request_id
            && stored.identity.client_id == incoming.identity.client_id;
        assert!(same_request, "loaded by client and request id");
        if stored.identity != incoming.identity {
            return ReceiptDecision::Conflict(ConflictReason::RequestIdReused);
        }
        return ReceiptDecision::Adopt(stored.clone());
    }
    if let Some(stored) = by_key {
        let same_key = stored.identity.client_id == incoming.identity.client_id
            && stored.identity.idempotency_key == incoming.identity.idempotency_key;
        assert!(same_key, "loaded by client and idempotency key");
        if stored.identity != incoming.identity {
            return ReceiptDecision::Conflict(ConflictReason::IdempotencyKeyReused);
        }
        return ReceiptDecision::Adopt(stored.clone());
    }
    ReceiptDecision::Execute
}

/// The receipt row to store for an executed command, or `None` when the
/// outcome is transient (or `adopted`) and nothing may be stored.
pub fn record(
    incoming: &Incoming,
    outcome: CommandOutcome,
    revision: Option<Revision>,
    receipt_digest: Digest,
    now_ms: u64,
) -> Option<StoredCommand> {
    outcome.is_durable().then(|| StoredCommand {
        request_id: incoming.request_id.clone(),
        identity: incoming.identity.clone(),
        outcome,
        revision,
        receipt_digest,
        recorded_at_ms: now_ms,
    })
}

/// A runner's message id: stable across the runner's retries of one message.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunnerMessageId(pub String);

impl RunnerMessageId {
    /// Wraps an id chosen by the runner.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The identifier as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunnerMessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for RunnerMessageId {
    fn from(value: &str) -> Self {
        Self(String::from(value))
    }
}

/// One runner message as the receipt table sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunnerMessage {
    pub runner_epoch: RunnerEpochId,
    pub message_id: RunnerMessageId,
    /// Digest of the canonical message payload.
    pub payload_digest: Digest,
}

/// One `worker_messages` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StoredRunnerMessage {
    pub message: RunnerMessage,
    /// Always durable.
    pub outcome: CommandOutcome,
    pub revision: Option<Revision>,
    /// Digest of the stored reply (including its next instruction).
    pub reply_digest: Digest,
    pub recorded_at_ms: u64,
}

/// What the shell does with an incoming runner message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunnerMessageDecision {
    /// New message: execute it, then [`record_runner_message`].
    Execute,
    /// An exact retry: send the stored reply again; nothing changes.
    Adopt(StoredRunnerMessage),
    /// The message id was used with another payload; nothing changes.
    Conflict,
}

/// Decides a runner message against the row stored under its (runner epoch,
/// message id).
///
/// # Panics
/// If `stored` was loaded under another runner epoch or message id.
pub fn decide_runner_message(
    stored: Option<&StoredRunnerMessage>,
    incoming: &RunnerMessage,
) -> RunnerMessageDecision {
    let Some(stored) = stored else {
        return RunnerMessageDecision::Execute;
    };
    let same_name = stored.message.runner_epoch == incoming.runner_epoch
        && stored.message.message_id == incoming.message_id;
    assert!(same_name, "loaded by runner epoch and message id");
    if stored.message.payload_digest == incoming.payload_digest {
        RunnerMessageDecision::Adopt(stored.clone())
    } else {
        RunnerMessageDecision::Conflict
    }
}

/// The row to store for an executed runner message, or `None` for a
/// transient outcome.
pub fn record_runner_message(
    incoming: &RunnerMessage,
    outcome: CommandOutcome,
    revision: Option<Revision>,
    reply_digest: Digest,
    now_ms: u64,
) -> Option<StoredRunnerMessage> {
    outcome.is_durable().then(|| StoredRunnerMessage {
        message: incoming.clone(),
        outcome,
        revision,
        reply_digest,
        recorded_at_ms: now_ms,
    })
}

#[cfg(test)]
mod tests;
