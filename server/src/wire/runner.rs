//! The runner channel's envelope: the five fields every runner message
//! carries (run id, generation, runner epoch, message id, expected
//! revision), read from the typed message of every variant; and a received
//! runner frame ([`receive`]), decoded and checked once.
//!
//! Invariants:
//! - Every received frame is checked whole before anything reads it:
//!   framing, nesting, canonical form, the schema and the typed round trip
//!   (`protocol::decode_runner_frame`).
//! - The payload digest a runner-message receipt stores is the SHA-256 of
//!   the checked canonical bytes: the frame is canonical and its typed value
//!   serialises back to it, so this is the digest of the canonical form of
//!   the message, without encoding it again.

use protocol::generated::constrained::{Generation, Visit};
use protocol::generated::types::{
    CommandState, NodeTarget, RunState, RunnerCommandKind, RunnerMessage, ServerMessage,
    ValidateSubmission, WorkerSchemaId,
};
use serde_json::Value;

/// A runner frame as received: its message, decoded and checked, and the
/// digest of its checked bytes.
#[derive(Debug)]
pub struct Received {
    pub message: RunnerMessage,
    /// SHA-256 of the frame's canonical JSON (without its newline).
    pub payload_digest: kernel::ids::Digest,
}

/// Decodes and checks one runner frame (canonical JSON plus `\n`), and
/// digests its checked bytes; the error of the first check it fails.
pub fn receive(frame: &[u8]) -> Result<Received, protocol::SafeError> {
    let message = protocol::decode_runner_frame(frame)?;
    let payload_digest = crate::ids::sha256(protocol::frame_content(frame)?);
    Ok(Received {
        message,
        payload_digest,
    })
}

/// The common envelope fields of a runner message.
pub(crate) struct Envelope {
    pub(crate) run_id: String,
    pub(crate) generation: u64,
    pub(crate) runner_epoch: String,
    pub(crate) message_id: String,
    pub(crate) expected_revision: Option<u64>,
}

/// Reads the envelope of every variant (each has the same five fields).
macro_rules! envelope_of {
    ($message:expr; $($variant:ident),+ $(,)?) => {
        match $message {
            $(RunnerMessage::$variant {
                run_id,
                generation,
                runner_epoch,
                message_id,
                expected_revision,
                ..
            } => Envelope {
                run_id: run_id.to_string(),
                generation: generation.get(),
                runner_epoch: runner_epoch.to_string(),
                message_id: message_id.to_string(),
                expected_revision: expected_revision.map(|revision| revision.get()),
            },)+
        }
    };
}

pub(crate) fn envelope(message: &RunnerMessage) -> Envelope {
    envelope_of!(message;
        RunnerReady, NodeStarted, NodeUpdate, NodeFinished, NodeFailed, RunParked,
        RunFinished, InteractionRequested, InteractionAccepted, InteractionRejected,
        NotificationRequested, PresentationRequested, EffectReserve, EffectSettle,
        RunnerProgress, RunnerExiting, ContentRead, ResolveResult, ResolveFailed,
    )
}

/// The one `command` to a runner after `runner.ready`: run `node`
/// (`attempt`, `visit`) of `run_id` from the inline `state`; a continuation
/// names its parent run, a validation carries its provisional submission.
/// `None` when a fact does not fit its schema type (a server bug).
#[expect(clippy::too_many_arguments, reason = "the command's fields")]
pub(crate) fn command(
    run_id: &str,
    generation: u64,
    runner_epoch: &str,
    command: RunnerCommandKind,
    node_target: (&str, &str, u64),
    state: RunState,
    parent_run_id: Option<&str>,
    submission: Option<Value>,
) -> Option<ServerMessage> {
    let (node_id, attempt_id, visit) = node_target;
    Some(ServerMessage::Command {
        command,
        generation: Generation::new(generation)?,
        node: NodeTarget {
            attempt_id: attempt_id.parse().ok()?,
            node_id: node_id.parse().ok()?,
            visit: Visit::new(visit)?,
        },
        parent_run_id: match parent_run_id {
            Some(parent) => Some(parent.parse().ok()?),
            None => None,
        },
        run_id: run_id.parse().ok()?,
        runner_epoch: runner_epoch.parse().ok()?,
        schema: WorkerSchemaId::PiWorkflowsWorkerLaunchV1,
        state: CommandState::Inline { value: state },
        submission: submission.map(|output| ValidateSubmission { output }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The receipt digest taken from the checked bytes is the one the server
    /// took before by encoding the typed message again, for every runner
    /// frame the conformance corpus accepts (so a stored receipt keeps
    /// adopting the same retry).
    #[test]
    fn the_digest_of_a_received_frame_is_the_digest_of_its_message_encoded_again() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../protocol/fixtures/frames/runner");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "canonical") {
                continue;
            }
            let frame = std::fs::read(&path).unwrap();
            let received = receive(&frame).unwrap();
            let encoded_again = protocol::canonicalize_typed(&received.message).unwrap();
            assert_eq!(
                received.payload_digest,
                crate::ids::sha256(&encoded_again),
                "{}",
                path.display()
            );
            checked += 1;
        }
        assert!(checked >= 20, "only {checked} accepted runner frames");
    }

    #[test]
    fn a_frame_that_fails_a_check_is_not_received() {
        assert_eq!(
            receive(b"{\"b\":1,\"a\":2}\n").unwrap_err().code(),
            protocol::ErrorCode::NonCanonical
        );
        assert_eq!(
            receive(b"{\"a\":1}\n").unwrap_err().code(),
            protocol::ErrorCode::SchemaInvalid
        );
    }
}
