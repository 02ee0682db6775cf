//! The runner channel's envelope: the five fields every runner message
//! carries (run id, generation, runner epoch, message id, expected
//! revision), read from the typed message of every variant.

use protocol::generated::constrained::{Generation, Visit};
use protocol::generated::types::{
    CommandState, NodeTarget, RunState, RunnerCommandKind, RunnerMessage, ServerMessage,
    ValidateSubmission, WorkerSchemaId,
};
use serde_json::Value;

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
