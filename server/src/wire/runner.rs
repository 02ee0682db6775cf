//! The runner channel's envelope: the five fields every runner message
//! carries (run id, generation, runner epoch, message id, expected
//! revision), read from the typed message of every variant.

use protocol::generated::types::RunnerMessage;

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
