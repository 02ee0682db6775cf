//! Selected launch (DEFERRED_TURNS, "Selected launch and restart"): a
//! terminal decision turn — the model turn a run's terminal message opened,
//! identified by the turn intent that message claimed — may reserve at most
//! one workflow launch: a restart of the terminal run, or a start of another
//! workflow.
//!
//! Invariants:
//! - One launch per intent: [`select`] reserves a launch only for an intent
//!   that has none. The reservation ([`Reservation`], `selected_launches`)
//!   records the source intent, the model's tool call and the request
//!   fingerprint ([`request_fingerprint`]), and names the run it reserved.
//! - Repeating the same tool call with the same request adopts the existing
//!   reservation and its run; any other launch from the same intent (another
//!   tool call, or the same tool call with another request) is refused, and
//!   nothing changes.
//! - Only a sent terminal message of the requesting session that claimed an
//!   intent can select a launch: a step, decision, notification or
//!   follow-up message, a message of another session, a message not yet
//!   sent, or an unknown message is refused.
//! - A selected launch is always held: the reserved run activates only after
//!   the decision turn settles (`run::reserve_held`, `run::activate`), and a
//!   surviving reservation is activated once by session-start or queue
//!   recovery (a held run accepts one `activate`).

use crate::ids::{Digest, MessageId, RunId, SessionId, TurnIntentId};
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// What a launch asks for, fingerprinted by [`request_fingerprint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchKind<'a> {
    /// `run.restart` of the terminal run `run_id`.
    Restart { run_id: &'a RunId },
    /// `run.start` of `workflow_ref` with the input whose canonical JSON has
    /// this digest.
    Start {
        workflow_ref: &'a str,
        input_digest: Digest,
    },
}

/// SHA-256 over the launch's kind and fields, each length-prefixed in a fixed
/// order, so equal requests and only equal requests share a fingerprint (up
/// to a hash collision).
pub fn request_fingerprint(kind: LaunchKind<'_>) -> Digest {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    };
    field(b"pi-workflows.selected-launch.v1");
    match kind {
        LaunchKind::Restart { run_id } => {
            field(b"restart");
            field(run_id.as_str().as_bytes());
        }
        LaunchKind::Start {
            workflow_ref,
            input_digest,
        } => {
            field(b"start");
            field(workflow_ref.as_bytes());
            field(&input_digest.0);
        }
    }
    Digest(hasher.finalize().into())
}

/// The workflow message a launch request names as its decision turn's
/// source, loaded by the shell with the intent that message claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceMessage {
    pub message_id: MessageId,
    pub session_id: SessionId,
    /// The message is a terminal message (the only kind that opens a
    /// terminal decision turn).
    pub terminal: bool,
    /// The message was sent (its turn can exist).
    pub sent: bool,
    /// The turn intent the message claimed, if any.
    pub intent_id: Option<TurnIntentId>,
}

/// One `selected_launches` row: the one launch an intent reserved.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Reservation {
    pub intent_id: TurnIntentId,
    /// The model's tool call (its idempotency key).
    pub tool_call_id: String,
    pub fingerprint: Digest,
    pub run_id: RunId,
}

/// One launch request from a decision turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchRequest {
    /// The origin session the launched run would reserve (the requester's;
    /// none for a headless run, which no decision turn can launch).
    pub session_id: Option<SessionId>,
    pub tool_call_id: String,
    pub fingerprint: Digest,
}

/// What to do with an accepted launch request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selected {
    /// Reserve the launch (held) and record it against this intent.
    Reserve { intent_id: TurnIntentId },
    /// The same tool call again: answer with the run it already reserved.
    Adopt { run_id: RunId },
}

/// Why a launch from a decision turn was refused. Nothing changes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum LaunchRefusal {
    /// The named message is unknown, not a sent terminal message of this
    /// session, or claimed no intent: it opened no terminal decision turn.
    NotADecisionTurn,
    /// The decision turn already selected its one launch (another launch).
    AlreadySelected { run_id: RunId },
    /// The same tool call was repeated with another request.
    ToolCallReused { run_id: RunId },
}

/// The one-launch rule: whether `request`, from the decision turn `source`
/// opened, reserves a launch, adopts the one it reserved, or is refused
/// (`existing` is the intent's reservation, loaded by the shell; the shell
/// loads it for `source`'s intent).
pub fn select(
    source: Option<&SourceMessage>,
    existing: Option<&Reservation>,
    request: &LaunchRequest,
) -> Result<Selected, LaunchRefusal> {
    let Some(source) = source else {
        return Err(LaunchRefusal::NotADecisionTurn);
    };
    let intent_id = match &source.intent_id {
        Some(intent_id) if source.terminal && source.sent => intent_id,
        _ => return Err(LaunchRefusal::NotADecisionTurn),
    };
    if request.session_id.as_ref() != Some(&source.session_id) {
        return Err(LaunchRefusal::NotADecisionTurn);
    }
    match existing {
        None => Ok(Selected::Reserve {
            intent_id: intent_id.clone(),
        }),
        Some(reservation) if reservation.intent_id != *intent_id => {
            // A reservation of another intent is not this turn's: the shell
            // loads by intent, so this is a broken fact, refused as unknown.
            Err(LaunchRefusal::NotADecisionTurn)
        }
        Some(reservation) if reservation.tool_call_id != request.tool_call_id => {
            Err(LaunchRefusal::AlreadySelected {
                run_id: reservation.run_id.clone(),
            })
        }
        Some(reservation) if reservation.fingerprint != request.fingerprint => {
            Err(LaunchRefusal::ToolCallReused {
                run_id: reservation.run_id.clone(),
            })
        }
        Some(reservation) => Ok(Selected::Adopt {
            run_id: reservation.run_id.clone(),
        }),
    }
}

#[cfg(test)]
mod tests;
