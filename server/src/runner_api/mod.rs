//! The private runner channel: every runner message is checked, decided by
//! the kernel inside one write transaction, and answered after the commit.
//!
//! Invariants:
//! - The envelope (run id, generation, runner epoch) is compared with the
//!   pipe's runner before anything else is read. A stale or foreign message
//!   gets one `claimLost` reply and the runner is stopped.
//! - A state-changing message stores its reply in `worker_messages` in the
//!   same transaction as its change, so an exact retry (same message id and
//!   payload) gets the same reply and changes nothing; another payload under
//!   the same message id is rejected.
//! - Routing comes from the kernel: the runner only proposes results.
//! - Every answer is measured before it is stored and sent: a value that
//!   would not fit one frame travels as a content reference
//!   (`crate::runner_api::transfer`), and the runner always gets an answer.

pub mod answer;
pub mod decisions;
pub mod effects;
pub mod interactions;
pub mod reply;
pub mod transfer;
pub mod updates;

use crate::children::supervisor;
use crate::context::Context;
use crate::context::runners::Runner;
use crate::fault::FaultPoint;
use crate::process::{self, ProcessIdentity};
use crate::projection::run_view::{OffSchema, to_wire};
use crate::store::attempts::{self, AttemptResult};
use crate::store::blobs::Blob;
use crate::store::{Commit, commands, meta, processes, runs};
use crate::wire::runner::{Envelope, Received, envelope};
use answer::{Answer, Extra, Refusal};
use kernel::attempt::{NodeOutcome, ResultRecord};
use kernel::execution::{self, Dispatch, ExitReason, NodeResult};
use kernel::ids::{AttemptId, Digest, RunId};
use kernel::output::{LaunchCommand, Output, Step, StopReason, Transition};
use kernel::receipt::{self, CommandOutcome, RunnerMessageDecision, RunnerMessageId};
use kernel::run::{
    self, FailureClass, ParkReason, ReasonKind, Rejection, RunAggregate, RunError, Terminal,
};
use kernel::runner::ProtocolCheck;
use protocol::ErrorCode;
use protocol::generated::types::{
    self as wire, ActionReceipt, Content, ContentReference, NotificationResult, ReplyOutcome,
    RunnerMessage, ServerMessage,
};
use reply::{Addressee, ReplyResult, with_dispatch, with_next};
use rusqlite::Connection;
use serde_json::Value;
use std::sync::Arc;

/// A runner message that the kernel decides inside one write transaction,
/// with its typed fields (moved out of the generated `RunnerMessage` by the
/// one exhaustive match in [`handle`]; nothing is read back out of JSON).
#[derive(Debug)]
enum Decide {
    RunnerReady,
    NodeStarted {
        attempt_id: AttemptId,
        deadline_at_ms: Option<u64>,
        status_detail: Option<String>,
    },
    NodeUpdate {
        attempt_id: AttemptId,
        idempotency_key: String,
        update: protocol::generated::types::NodeUpdate,
    },
    NodeFinished {
        attempt_id: AttemptId,
        output: Value,
        action: Option<ActionReceipt>,
    },
    NodeFailed {
        attempt_id: AttemptId,
        outcome: NodeOutcome,
        error: String,
        action: Option<ActionReceipt>,
    },
    RunParked {
        reason: ParkReason,
    },
    RunFinished {
        class: FailureClass,
        error: String,
    },
    InteractionRequested {
        attempt_id: AttemptId,
        kind: kernel::interaction::InteractionKind,
        deadline_at_ms: Option<u64>,
        prompt: Content,
        contract: Value,
    },
    NotificationRequested {
        attempt_id: AttemptId,
        content: Content,
    },
    EffectReserve {
        attempt_id: AttemptId,
        effect_type: String,
        request_digest: String,
    },
    EffectSettle {
        effect_id: kernel::ids::EffectId,
        outcome: kernel::effect::SettleOutcome,
        result: Value,
    },
}

impl Decide {
    /// Whether an accepted message of this kind is a fused step: it records a
    /// node's result and, in the same commit, starts the next attempt with
    /// its static deadline (`execution::finish_and_start`,
    /// `execution::finish_notification`).
    const fn is_fused_step(&self) -> bool {
        match self {
            Self::NodeFinished { .. }
            | Self::NodeFailed { .. }
            | Self::NotificationRequested { .. } => true,
            Self::RunnerReady
            | Self::NodeStarted { .. }
            | Self::NodeUpdate { .. }
            | Self::RunParked { .. }
            | Self::RunFinished { .. }
            | Self::InteractionRequested { .. }
            | Self::EffectReserve { .. }
            | Self::EffectSettle { .. } => false,
        }
    }

    /// The message's `type` on the wire.
    const fn wire(&self) -> &'static str {
        match self {
            Self::RunnerReady => "runner.ready",
            Self::NodeStarted { .. } => "node.started",
            Self::NodeUpdate { .. } => "node.update",
            Self::NodeFinished { .. } => "node.finished",
            Self::NodeFailed { .. } => "node.failed",
            Self::RunParked { .. } => "run.parked",
            Self::RunFinished { .. } => "run.finished",
            Self::InteractionRequested { .. } => "interaction.requested",
            Self::NotificationRequested { .. } => "notification.requested",
            Self::EffectReserve { .. } => "effect.reserve",
            Self::EffectSettle { .. } => "effect.settle",
        }
    }
}

/// What the server does with one runner message, chosen by the exhaustive
/// match over the generated message enum in [`route`] (a new message kind in
/// the schema does not compile until it has a route there).
enum Route {
    /// Decided by the kernel in one transaction.
    Decide(Decide),
    /// `runner.progress`: the process registry.
    Progress {
        register: bool,
        pid: u64,
        start_identity: String,
    },
    /// `runner.exiting`: acknowledged; the exit itself is decided when the
    /// process ends.
    Exiting,
    /// `content.read`: a chunk of content sent to this runner epoch.
    ContentRead {
        reference: ContentReference,
        offset: u64,
        length: u64,
    },
    /// Not accepted on a run-mode channel of this server.
    NotOnThisChannel,
}

/// The route of one message, with its typed fields.
fn route(message: RunnerMessage) -> Route {
    use protocol::generated::types as wire;
    match message {
        RunnerMessage::RunnerReady { .. } => Route::Decide(Decide::RunnerReady),
        RunnerMessage::NodeStarted {
            attempt_id,
            deadline_at_ms,
            status_detail,
            ..
        } => Route::Decide(Decide::NodeStarted {
            attempt_id: AttemptId::new(attempt_id.to_string()),
            deadline_at_ms: deadline_at_ms.map(|deadline| deadline.get()),
            status_detail: status_detail.map(|detail| detail.to_string()),
        }),
        RunnerMessage::NodeUpdate {
            attempt_id,
            idempotency_key,
            update,
            ..
        } => Route::Decide(Decide::NodeUpdate {
            attempt_id: AttemptId::new(attempt_id.to_string()),
            idempotency_key: idempotency_key.to_string(),
            update,
        }),
        RunnerMessage::NodeFinished {
            attempt_id,
            output,
            action,
            ..
        } => Route::Decide(Decide::NodeFinished {
            attempt_id: AttemptId::new(attempt_id.to_string()),
            output,
            action,
        }),
        RunnerMessage::NodeFailed {
            attempt_id,
            outcome,
            error,
            action,
            ..
        } => Route::Decide(Decide::NodeFailed {
            attempt_id: AttemptId::new(attempt_id.to_string()),
            outcome: match outcome {
                wire::NodeFailureOutcome::Failed => NodeOutcome::Failed,
                wire::NodeFailureOutcome::TimedOut => NodeOutcome::TimedOut,
                wire::NodeFailureOutcome::Cancelled => NodeOutcome::Cancelled,
            },
            error: error.message.to_string(),
            action,
        }),
        RunnerMessage::RunParked { reason, .. } => Route::Decide(Decide::RunParked {
            reason: match reason {
                wire::ParkReason::WorkflowSourceChanged => ParkReason::WorkflowSourceChanged,
                wire::ParkReason::Drained => ParkReason::Drained,
            },
        }),
        RunnerMessage::RunFinished {
            failure_class,
            error,
            ..
        } => Route::Decide(Decide::RunFinished {
            class: failure_class.map_or(FailureClass::NodeFailed, failure_class_of),
            error: error.message.to_string(),
        }),
        RunnerMessage::InteractionRequested {
            attempt_id,
            kind,
            deadline_at_ms,
            prompt,
            contract,
            ..
        } => Route::Decide(Decide::InteractionRequested {
            attempt_id: AttemptId::new(attempt_id.to_string()),
            kind: match kind {
                wire::InteractionKind::VisibleResponse => {
                    kernel::interaction::InteractionKind::AssistantMessage
                }
                // Agent, checkpoint and decision requests all complete
                // through a validated submission.
                wire::InteractionKind::Agent
                | wire::InteractionKind::Checkpoint
                | wire::InteractionKind::Decision => {
                    kernel::interaction::InteractionKind::SubmittedOutput
                }
            },
            deadline_at_ms: deadline_at_ms.map(|deadline| deadline.get()),
            prompt,
            contract,
        }),
        RunnerMessage::NotificationRequested {
            attempt_id,
            content,
            ..
        } => Route::Decide(Decide::NotificationRequested {
            attempt_id: AttemptId::new(attempt_id.to_string()),
            content,
        }),
        RunnerMessage::EffectReserve {
            attempt_id,
            effect_type,
            request_digest,
            ..
        } => Route::Decide(Decide::EffectReserve {
            attempt_id: AttemptId::new(attempt_id.to_string()),
            effect_type: effect_type.to_string(),
            request_digest: request_digest.to_string(),
        }),
        RunnerMessage::EffectSettle {
            effect_id,
            state,
            result,
            ..
        } => Route::Decide(Decide::EffectSettle {
            effect_id: kernel::ids::EffectId::new(effect_id.to_string()),
            outcome: match state {
                wire::SettleState::Applied => kernel::effect::SettleOutcome::Applied,
                wire::SettleState::Rejected => kernel::effect::SettleOutcome::Rejected,
            },
            result,
        }),
        RunnerMessage::RunnerProgress {
            operation,
            pid,
            start_identity,
            ..
        } => Route::Progress {
            register: match operation {
                wire::ProcessOperation::ProcessRegister => true,
                wire::ProcessOperation::ProcessUnregister => false,
            },
            pid: pid.get(),
            start_identity: start_identity.to_string(),
        },
        RunnerMessage::RunnerExiting { .. } => Route::Exiting,
        RunnerMessage::ContentRead {
            reference,
            offset,
            length,
            ..
        } => Route::ContentRead {
            reference,
            offset: offset.get(),
            length: length.get(),
        },
        RunnerMessage::PresentationRequested { .. }
        | RunnerMessage::InteractionAccepted { .. }
        | RunnerMessage::InteractionRejected { .. }
        | RunnerMessage::ResolveResult { .. }
        | RunnerMessage::ResolveFailed { .. } => Route::NotOnThisChannel,
    }
}

/// The kernel's failure class of a runner's `run.finished` (one arm each).
const fn failure_class_of(class: protocol::generated::types::FailureClass) -> FailureClass {
    use protocol::generated::types::FailureClass as Wire;
    match class {
        Wire::ClaimLost => FailureClass::ClaimLost,
        Wire::WorkerCrashed => FailureClass::WorkerCrashed,
        Wire::RunnerNoProgress => FailureClass::RunnerNoProgress,
        Wire::WorkerTimedOut => FailureClass::WorkerTimedOut,
        Wire::HostUnavailable => FailureClass::HostUnavailable,
        Wire::SourceChanged => FailureClass::SourceChanged,
        Wire::EffectAmbiguous => FailureClass::EffectAmbiguous,
        Wire::NodeFailed => FailureClass::NodeFailed,
        Wire::ProtocolRejected => FailureClass::ProtocolRejected,
    }
}

/// Values a message carries that are hashed before its transaction.
#[derive(Debug, Default)]
struct Blobs {
    output: Option<Blob>,
    result: Option<Blob>,
    update: Option<crate::runner_api::updates::EncodedUpdate>,
    request: Option<crate::runner_api::interactions::EncodedRequest>,
    /// A notification: its text and the message id it will get.
    notification: Option<(Blob, kernel::ids::MessageId)>,
}

impl Blobs {
    /// Hashes the values `message` carries (outside the write job).
    fn of(message: &Decide) -> Self {
        match message {
            Decide::NodeFinished { output, .. } => Self {
                output: Some(Blob::json(output)),
                ..Self::default()
            },
            Decide::EffectSettle { result, .. } => Self {
                result: Some(Blob::json(result)),
                ..Self::default()
            },
            Decide::NodeUpdate { update, .. } => Self {
                update: Some(crate::runner_api::updates::EncodedUpdate::of(&update.data)),
                ..Self::default()
            },
            Decide::InteractionRequested {
                prompt, contract, ..
            } => Self {
                request: Some(crate::runner_api::interactions::EncodedRequest::of(
                    prompt, contract,
                )),
                ..Self::default()
            },
            Decide::NotificationRequested { content, .. } => Self {
                // Only inline text is a notification's content; a reference
                // is refused by `notify`.
                notification: match content {
                    Content::Inline { text } => Some((
                        Blob::text(text.as_str()),
                        kernel::ids::MessageId::new(crate::ids::uuid()),
                    )),
                    Content::Reference { .. } => None,
                },
                ..Self::default()
            },
            Decide::RunnerReady
            | Decide::NodeStarted { .. }
            | Decide::NodeFailed { .. }
            | Decide::RunParked { .. }
            | Decide::RunFinished { .. }
            | Decide::EffectReserve { .. } => Self::default(),
        }
    }

    /// The content of the messages this runner message creates: an initial
    /// step's prompt, a notification's text (the store derives the others).
    fn message_contents(&self) -> Vec<(kernel::ids::MessageId, Blob)> {
        let step = self
            .request
            .as_ref()
            .map(|request| (request.message_id.clone(), request.prompt.clone()));
        step.into_iter()
            .chain(self.notification.clone().map(|(blob, id)| (id, blob)))
            .collect()
    }
}

/// What a message job produced: the answer (a reply, or the command after
/// `runner.ready`), the outputs to perform, whether the runner lost its
/// claim, and whether the job committed a fused step (a node's result with
/// the next dispatch: the crash-injection points `before_fused_commit` /
/// `after_fused_commit` count those).
struct Handled {
    reply: ServerMessage,
    outputs: Vec<Output>,
    claim_lost: bool,
    fused_commit: bool,
}

impl Handled {
    fn only(reply: ServerMessage) -> Self {
        Self {
            reply,
            outputs: Vec::new(),
            claim_lost: false,
            fused_commit: false,
        }
    }
}

/// Handles one received runner message.
pub async fn handle(app: &Arc<Context>, runner: &Arc<Runner>, received: Received) {
    let Received {
        message,
        payload_digest,
    } = received;
    let envelope = envelope(&message);
    let to = match Addressee::of(runner, &envelope.message_id) {
        Ok(to) => to,
        Err(error) => {
            // The runner's ids come from this server and the message id
            // from the schema decoder: never expected.
            crate::log::line(&format!(
                "a message of run generation {} cannot be answered: {error}",
                runner.generation
            ));
            return;
        }
    };
    let foreign = envelope.run_id != runner.run_id.as_str()
        || envelope.generation != runner.generation.0
        || envelope.runner_epoch != runner.runner_epoch.as_str();
    if foreign || runner.is_fenced() {
        let answer = to.refusal(
            ReplyOutcome::ClaimLost,
            ErrorCode::ClaimLost,
            "another generation owns the run or the claim expired",
        );
        send(runner, &to, answer);
        fence(app, runner);
        return;
    }
    let handled = match route(message) {
        Route::Exiting => Handled::only(to.accepted(None, ReplyResult::Nothing)),
        Route::Progress {
            register,
            pid,
            start_identity,
        } => progress(app, runner, &to, register, pid, start_identity).await,
        Route::ContentRead {
            reference,
            offset,
            length,
        } => Handled::only(
            crate::runner_api::transfer::read(app, runner, &to, &reference, offset, length).await,
        ),
        Route::NotOnThisChannel => Handled::only(to.refusal(
            ReplyOutcome::Rejected,
            ErrorCode::IllegalTransition,
            "this message kind is not accepted on a run-mode channel of this server",
        )),
        Route::Decide(decide_message) => {
            decide(app, runner, decide_message, &to, envelope, payload_digest).await
        }
    };
    app.perform(handled.outputs);
    send(runner, &to, handled.reply);
    if handled.claim_lost {
        fence(app, runner);
    }
}

/// Sends the answer to the message `to` names. Content it references may
/// be read by this runner from now on. An answer that still does not fit a
/// frame (never expected: `transfer::fit` moved its unbounded value) is
/// replaced by a bounded refusal, so the runner always hears back.
fn send(runner: &Runner, to: &Addressee, answer: ServerMessage) {
    if let Some(frame) = crate::wire::frames::server_message(&answer) {
        runner.issue(crate::runner_api::transfer::references(&answer));
        runner.send(frame);
        return;
    }
    crate::log::line(&format!(
        "an answer to run generation {} did not fit one frame; the runner gets a refusal",
        runner.generation
    ));
    let refusal = to.refusal(
        ReplyOutcome::Rejected,
        ErrorCode::FrameTooLarge,
        "the server's answer did not fit one frame",
    );
    if let Some(frame) = crate::wire::frames::server_message(&refusal) {
        runner.send(frame);
    }
}

/// A runner that lost its claim must exit; it is stopped if it does not.
fn fence(app: &Arc<Context>, runner: &Arc<Runner>) {
    if runner.mark_fenced() {
        supervisor::stop_runner(app, runner, StopReason::ClaimLost);
    }
}

/// A state-changing message decided by the kernel in one transaction.
async fn decide(
    app: &Arc<Context>,
    runner: &Arc<Runner>,
    message: Decide,
    to: &Addressee,
    envelope: Envelope,
    payload_digest: Digest,
) -> Handled {
    let kind = message.wire();
    let blobs = Blobs::of(&message);
    let app_for_job = app.clone();
    let runner_for_job = runner.clone();
    let to_for_job = to.clone();
    let outcome = app
        .store
        .write(move |connection| {
            decide_in(
                connection,
                &app_for_job,
                &runner_for_job,
                message,
                &to_for_job,
                &envelope,
                payload_digest,
                &blobs,
            )
        })
        .await;
    match outcome {
        Ok(handled) => {
            if handled.fused_commit {
                app.faults.hit(FaultPoint::AfterFusedCommit);
            }
            handled
        }
        Err(error) => {
            crate::log::line(&format!(
                "a {} message of run generation {} could not be stored: {error}",
                kind, runner.generation
            ));
            Handled::only(to.refusal(
                ReplyOutcome::Rejected,
                ErrorCode::Internal,
                "the server could not store this message; retry it",
            ))
        }
    }
}

#[expect(clippy::too_many_arguments, reason = "one message's facts")]
fn decide_in(
    connection: &Connection,
    app: &Arc<Context>,
    runner: &Arc<Runner>,
    message: Decide,
    to: &Addressee,
    envelope: &Envelope,
    payload_digest: Digest,
    blobs: &Blobs,
) -> rusqlite::Result<Commit<Handled>> {
    let incoming = receipt::RunnerMessage {
        runner_epoch: runner.runner_epoch.clone(),
        message_id: RunnerMessageId::new(envelope.message_id.clone()),
        payload_digest,
    };
    let stored =
        commands::runner_message(connection, &incoming.runner_epoch, &incoming.message_id)?;
    // An exact retry gets its stored reply whatever happened since; a
    // conflict is decided below, once the claim is checked.
    let conflict =
        match receipt::decide_runner_message(stored.as_ref().map(|(row, _)| row), &incoming) {
            RunnerMessageDecision::Adopt(_) => {
                let reply_json = stored.map(|(_, json)| json).unwrap_or_default();
                let answer = reply::stored(&reply_json).unwrap_or_else(|| {
                    crate::log::line(&format!(
                        "a stored reply of run generation {} is not a runner.v1 message",
                        runner.generation
                    ));
                    to.refusal(
                        ReplyOutcome::Rejected,
                        ErrorCode::Internal,
                        "the stored reply to this message could not be read",
                    )
                });
                return Ok(Commit::Discard(Handled::only(answer)));
            }
            RunnerMessageDecision::Conflict => true,
            RunnerMessageDecision::Execute => false,
        };
    let Some(before) = runs::load(connection, &runner.run_id)? else {
        return Ok(Commit::Discard(Handled::only(to.refusal(
            ReplyOutcome::Rejected,
            ErrorCode::NotFound,
            "the run does not exist",
        ))));
    };
    let now_ms = app.clock.now_ms();
    // The runner's claim is checked before its payload is read: a runner
    // that lost it (replaced or expired) gets `claimLost` for every message
    // and must exit, whatever the kernel would have said about the payload.
    if let Err(reason) = kernel::claim::check(&before.run.lease, Some(&runner.authority), now_ms) {
        let refusal = Refusal::from(Rejection::ClaimLost { reason });
        let answer = to.refusal(ReplyOutcome::ClaimLost, refusal.code, refusal.message);
        return Ok(Commit::Discard(Handled {
            reply: answer,
            outputs: Vec::new(),
            claim_lost: true,
            fused_commit: false,
        }));
    }
    // The protocol's idempotency and revision checks, before the payload.
    if conflict {
        let answer = to.refusal(
            ReplyOutcome::Rejected,
            ErrorCode::Conflict,
            "the message id was already used for another message; the run is parked (protocolRejected)",
        );
        return protocol_rejection(
            connection,
            app,
            runner,
            to,
            &before,
            ProtocolCheck::Idempotency,
            answer,
            now_ms,
        );
    }
    if let Err(stale) = kernel::run::check_revision(&before.run, envelope.expected_revision) {
        let refusal = Refusal::from(stale);
        let answer = to.refusal(ReplyOutcome::Rejected, refusal.code, refusal.message);
        let check = refusal.protocol.unwrap_or(ProtocolCheck::Revision);
        return protocol_rejection(connection, app, runner, to, &before, check, answer, now_ms);
    }
    let fused = message.is_fused_step();
    let decided = apply(connection, app, runner, message, to, &before, blobs, now_ms)?;
    let (transition, answer, extra) = match decided {
        Ok(decided) => decided,
        Err(refusal) => {
            let outcome = if refusal.claim_lost {
                ReplyOutcome::ClaimLost
            } else {
                ReplyOutcome::Rejected
            };
            let answer = to.refusal(outcome, refusal.code, refusal.message);
            if let Some(check) = refusal.protocol.filter(|_| !refusal.claim_lost) {
                return protocol_rejection(
                    connection, app, runner, to, &before, check, answer, now_ms,
                );
            }
            if refusal.claim_lost {
                return Ok(Commit::Discard(Handled {
                    reply: answer,
                    outputs: Vec::new(),
                    claim_lost: true,
                    fused_commit: false,
                }));
            }
            store_reply(
                connection,
                &incoming,
                CommandOutcome::Rejected,
                None,
                &answer,
                now_ms,
            )?;
            return Ok(Commit::Keep(Handled {
                reply: answer,
                outputs: Vec::new(),
                claim_lost: false,
                fused_commit: false,
            }));
        }
    };
    let mut outputs = Vec::new();
    let mut revision = before.run.revision;
    if let Some(transition) = transition {
        revision = transition.facts.run.revision;
        outputs = crate::shell::write_step(
            connection,
            &before,
            Step::Apply(transition),
            &blobs.message_contents(),
            now_ms,
        )?;
    }
    if let Some(extra) = extra {
        extra(connection)?;
    }
    let answer = crate::runner_api::transfer::fit(connection, answer, now_ms)?;
    store_reply(
        connection,
        &incoming,
        CommandOutcome::Accepted,
        Some(revision),
        &answer,
        now_ms,
    )?;
    if fused {
        app.faults.hit(FaultPoint::BeforeFusedCommit);
    }
    Ok(Commit::Keep(Handled {
        reply: answer,
        outputs,
        claim_lost: false,
        fused_commit: fused,
    }))
}

/// A message that failed a protocol `check`: the kernel parks the run
/// `protocolRejected` (`runner::protocol_rejected`) and stops the runner; the
/// message changes nothing else and gets `answer`. Without the live claim the
/// runner gets `claimLost` instead (claim loss is its own failure class).
#[expect(clippy::too_many_arguments, reason = "one message's facts")]
fn protocol_rejection(
    connection: &Connection,
    app: &Arc<Context>,
    runner: &Arc<Runner>,
    to: &Addressee,
    before: &RunAggregate,
    check: ProtocolCheck,
    answer: ServerMessage,
    now_ms: u64,
) -> rusqlite::Result<Commit<Handled>> {
    let decided = kernel::runner::protocol_rejected(
        before,
        &runner.authority,
        &runner.runner_epoch,
        check,
        now_ms,
        app.config.claim_ttl_ms,
    );
    match decided {
        Ok(transition) => {
            let outputs =
                crate::shell::write_step(connection, before, Step::Apply(transition), &[], now_ms)?;
            Ok(Commit::Keep(Handled {
                reply: answer,
                outputs,
                claim_lost: false,
                fused_commit: false,
            }))
        }
        Err(rejection) => {
            let refusal = Refusal::from(rejection);
            let answer = to.refusal(ReplyOutcome::ClaimLost, refusal.code, refusal.message);
            Ok(Commit::Discard(Handled {
                reply: answer,
                outputs: Vec::new(),
                claim_lost: true,
                fused_commit: false,
            }))
        }
    }
}

/// A frame from `runner` that is not a runner message (it failed framing or
/// the schema): the protocol's schema check. The run is parked
/// `protocolRejected` and the runner stopped; a runner that no longer holds
/// the live claim is only stopped. The frame has no trustworthy message id,
/// so nothing is answered.
pub async fn reject_frame(app: &Arc<Context>, runner: &Arc<Runner>) {
    let runner_for_job = runner.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    let parked = crate::shell::apply(app, runner.run_id.clone(), move |_, before, now_ms| {
        Ok(kernel::runner::protocol_rejected(
            before,
            &runner_for_job.authority,
            &runner_for_job.runner_epoch,
            ProtocolCheck::Schema,
            now_ms,
            ttl_ms,
        )
        .map(Step::Apply))
    })
    .await;
    if !parked.changed() {
        fence(app, runner);
    }
}

fn store_reply(
    connection: &Connection,
    incoming: &receipt::RunnerMessage,
    outcome: CommandOutcome,
    revision: Option<kernel::ids::Revision>,
    answer: &ServerMessage,
    now_ms: u64,
) -> rusqlite::Result<()> {
    let reply_json = reply::to_stored(answer);
    let reply_digest = crate::ids::sha256(reply_json.as_bytes());
    if let Some(stored) =
        receipt::record_runner_message(incoming, outcome, revision, reply_digest, now_ms)
    {
        commands::insert_runner_message(connection, &stored, &reply_json)?;
    }
    Ok(())
}

/// A decided message: the transition to write, the whole answer (a reply,
/// or the command after `runner.ready`) and a follow-up write; or why it
/// was refused.
type Decided = Result<
    (
        Option<Transition<RunAggregate>>,
        ServerMessage,
        Option<Extra>,
    ),
    Refusal,
>;

fn decided(
    transition: Transition<RunAggregate>,
    answer: ServerMessage,
    extra: Option<Extra>,
) -> Decided {
    Ok((Some(transition), answer, extra))
}

/// Calls the kernel for one message (one arm per decided message kind).
#[expect(clippy::too_many_arguments, reason = "one message's facts")]
fn apply(
    connection: &Connection,
    app: &Arc<Context>,
    runner: &Arc<Runner>,
    message: Decide,
    to: &Addressee,
    before: &RunAggregate,
    blobs: &Blobs,
    now_ms: u64,
) -> rusqlite::Result<Decided> {
    let ttl_ms = app.config.claim_ttl_ms;
    let authority = &runner.authority;
    let epoch = &runner.runner_epoch;
    Ok(match message {
        Decide::RunnerReady => ready(connection, runner, to, before, now_ms, ttl_ms)?,
        Decide::NodeStarted {
            attempt_id,
            deadline_at_ms,
            status_detail,
        } => {
            match execution::record_node_started(
                before,
                authority,
                epoch,
                &attempt_id,
                deadline_at_ms,
                now_ms,
                ttl_ms,
            ) {
                Ok(transition) => {
                    let revision = transition.facts.run.revision.0;
                    let run_id = runner.run_id.clone();
                    let extra: Option<Extra> = status_detail.map(|detail| -> Extra {
                        Box::new(move |connection: &Connection| {
                            attempts::record_status_detail(
                                connection,
                                &run_id,
                                &attempt_id,
                                &detail,
                            )
                        })
                    });
                    decided(
                        transition,
                        to.accepted(Some(revision), ReplyResult::Nothing),
                        extra,
                    )
                }
                Err(rejection) => Err(rejection.into()),
            }
        }
        Decide::NodeFinished {
            attempt_id,
            output,
            action,
        } => {
            // A headless agent attempt finishes only after its accepted submission.
            if let Err(rejection) = kernel::interaction::finish_allowed(before, &attempt_id) {
                return Ok(Err(Refusal::of(&rejection)));
            }
            finish(
                connection,
                runner,
                to,
                before,
                Finished {
                    attempt_id,
                    outcome: NodeOutcome::Ok,
                    output: Some(output),
                    error: None,
                    action,
                },
                blobs.output.as_ref(),
                now_ms,
                ttl_ms,
            )?
        }
        Decide::NodeFailed {
            attempt_id,
            outcome,
            error,
            action,
        } => finish(
            connection,
            runner,
            to,
            before,
            Finished {
                attempt_id,
                outcome,
                output: None,
                error: Some(bounded_error(&error)),
                action,
            },
            None,
            now_ms,
            ttl_ms,
        )?,
        Decide::RunParked { reason } => match run::park(before, authority, reason, now_ms) {
            Ok(transition) => {
                let revision = transition.facts.run.revision.0;
                let answer = to.accepted(Some(revision), ReplyResult::Nothing);
                decided(
                    transition,
                    with_next(
                        answer,
                        &Dispatch::Exit {
                            reason: ExitReason::Parked,
                        },
                    ),
                    None,
                )
            }
            Err(rejection) => Err(rejection.into()),
        },
        Decide::RunFinished { class, error } => {
            let message = bounded_error(&error);
            let error = RunError {
                class,
                reason: ReasonKind::RunnerFailed,
                node_id: None,
            };
            match run::finish(before, Some(authority), Terminal::Failed { error }, now_ms) {
                Ok(transition) => {
                    let revision = transition.facts.run.revision.0;
                    let run_id = runner.run_id.clone();
                    let extra: Extra = Box::new(move |connection: &Connection| {
                        store_run_error(connection, &run_id, &message)
                    });
                    let answer = to.accepted(Some(revision), ReplyResult::Nothing);
                    decided(
                        transition,
                        with_next(
                            answer,
                            &Dispatch::Exit {
                                reason: ExitReason::Failed,
                            },
                        ),
                        Some(extra),
                    )
                }
                Err(rejection) => Err(rejection.into()),
            }
        }
        Decide::EffectReserve {
            attempt_id,
            effect_type,
            request_digest,
        } => {
            let answer = crate::runner_api::effects::reserve(
                connection,
                runner,
                attempt_id,
                effect_type,
                &request_digest,
                before,
                now_ms,
                ttl_ms,
            )?;
            answered(to, before, answer, None)
        }
        Decide::EffectSettle {
            effect_id,
            outcome,
            result: _,
        } => {
            let answer = crate::runner_api::effects::settle(
                connection,
                runner,
                effect_id,
                outcome,
                before,
                blobs.result.as_ref(),
                now_ms,
                ttl_ms,
            )?;
            answered(to, before, answer, None)
        }
        Decide::NodeUpdate {
            attempt_id,
            idempotency_key,
            update,
        } => {
            let Some(data) = blobs.update.as_ref() else {
                return Ok(Err(Refusal::invalid("update data is missing")));
            };
            let answer = crate::runner_api::updates::runner_update(
                connection,
                runner,
                attempt_id,
                &idempotency_key,
                &update,
                data,
                before,
                now_ms,
                ttl_ms,
            )?;
            answered(to, before, answer, None)
        }
        Decide::InteractionRequested {
            attempt_id,
            kind,
            deadline_at_ms,
            ..
        } => {
            let Some(request) = blobs.request.as_ref() else {
                return Ok(Err(Refusal::invalid("the request is incomplete")));
            };
            let asked = crate::runner_api::interactions::Asked {
                attempt_id,
                kind,
                deadline_at_ms,
            };
            let answer = crate::runner_api::interactions::requested(
                connection, runner, asked, request, before, now_ms, ttl_ms,
            )?;
            // An interactive runner exits; a headless one runs the step in its own Pi child.
            let exit = Dispatch::Exit {
                reason: ExitReason::Waiting,
            };
            let interactive = before.run.mode.origin_session().is_some();
            answered(to, before, answer, interactive.then_some(&exit))
        }
        Decide::NotificationRequested { attempt_id, .. } => {
            let Some(notification) = blobs.notification.clone() else {
                return Ok(Err(Refusal::invalid(
                    "a notification's content must be inline text",
                )));
            };
            notify(
                connection,
                runner,
                to,
                before,
                attempt_id,
                notification,
                now_ms,
                ttl_ms,
            )?
        }
    })
}

/// Wraps a module's answer into the reply (with `next` when the runner must
/// stop after it).
fn answered(
    to: &Addressee,
    before: &RunAggregate,
    answer: Answer,
    next: Option<&Dispatch>,
) -> Decided {
    let (transition, result, extra) = answer?;
    let revision = transition
        .as_ref()
        .map_or(before.run.revision, |t| t.facts.run.revision)
        .0;
    let mut answer = to.accepted(Some(revision), result);
    if let Some(next) = next {
        answer = with_next(answer, next);
    }
    Ok((transition, answer, extra))
}

/// `runner.ready`: the kernel chooses the resume point; the reply is the one
/// `command` (or an exit reply when the run needs no node).
fn ready(
    connection: &Connection,
    runner: &Arc<Runner>,
    to: &Addressee,
    before: &RunAggregate,
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Decided> {
    let Some(meta) = meta::load(connection, &runner.run_id)? else {
        return Ok(Err(Rejection::StaleRunner.into()));
    };
    let Some(topology) = meta::topology(connection, &meta.definition_digest)? else {
        return Ok(Err(Rejection::StaleRunner.into()));
    };
    let route_from = attempts::last_step_record(connection, &runner.run_id, &topology)?;
    // An attempt abandoned after its agent's submission was accepted finishes
    // with that submission's output (`kernel::interaction::adoptable_submission`).
    let adopted = match (
        kernel::interaction::adoptable_submission(before),
        before.attempt.as_ref(),
    ) {
        (Some(submission_id), Some(attempt)) => {
            let stored = crate::store::submissions::stored(connection, submission_id)?;
            let output = match stored.and_then(|stored| stored.accepted_output) {
                Some(output) => Some(output),
                None => crate::store::submissions::payload(connection, submission_id)?,
            };
            let record = ResultRecord::of(attempt, &topology, NodeOutcome::Ok, now_ms)
                .output(output.as_ref())
                .to_value();
            let result = NodeResult {
                outcome: NodeOutcome::Ok,
                record,
            };
            Some((result, attempt.attempt_id.clone(), output))
        }
        _ => None,
    };
    let new_attempt = AttemptId::new(crate::ids::uuid());
    let started = execution::start_generation(
        before,
        &topology,
        &runner.authority,
        &runner.runner_epoch,
        route_from.as_ref(),
        adopted.as_ref().map(|(result, ..)| result.clone()),
        new_attempt,
        now_ms,
        ttl_ms,
    );
    let (transition, dispatch) = match started {
        Ok(started) => started,
        Err(rejection) => return Ok(Err(rejection.into())),
    };
    let revision = transition.facts.run.revision.0;
    let answer = match &dispatch {
        Dispatch::RunNode {
            node_id,
            attempt_id,
            visit,
        } => {
            let state =
                attempts::run_state(connection, &runner.run_id, &meta.input_digest, &topology)?;
            let parent_run_id = match &runner.command {
                LaunchCommand::Continue { parent_run_id, .. } => Some(parent_run_id.as_str()),
                LaunchCommand::Start | LaunchCommand::Resume | LaunchCommand::Restart { .. } => {
                    None
                }
            };
            // A fact off its schema type fails the transaction.
            crate::wire::runner::command(
                runner.run_id.as_str(),
                runner.generation.0,
                runner.runner_epoch.as_str(),
                command_kind(&runner.command),
                (node_id.as_str(), attempt_id.as_str(), u64::from(*visit)),
                state,
                parent_run_id,
                None,
            )
            .ok_or(OffSchema("command"))?
        }
        Dispatch::Exit { .. } => {
            with_next(to.accepted(Some(revision), ReplyResult::Nothing), &dispatch)
        }
    };
    let extra = adopted.map(|(_, attempt_id, output)| -> Extra {
        let run_id = runner.run_id.clone();
        let stored = AttemptResult {
            output: output.as_ref().map(Blob::json),
            ..AttemptResult::default()
        };
        Box::new(move |connection: &Connection| {
            attempts::record_result(connection, &run_id, &attempt_id, &stored, now_ms)
        })
    });
    Ok(decided(transition, answer, extra))
}

fn command_kind(command: &LaunchCommand) -> wire::RunnerCommandKind {
    match command {
        LaunchCommand::Start => wire::RunnerCommandKind::Start,
        LaunchCommand::Resume => wire::RunnerCommandKind::Resume,
        LaunchCommand::Continue { .. } => wire::RunnerCommandKind::Continue,
        LaunchCommand::Restart { .. } => wire::RunnerCommandKind::Restart,
    }
}

/// What a `node.finished` / `node.failed` reports.
struct Finished {
    attempt_id: AttemptId,
    outcome: NodeOutcome,
    output: Option<Value>,
    error: Option<String>,
    action: Option<ActionReceipt>,
}

/// `node.finished` / `node.failed`: the fused commit. The kernel records the
/// step, routes, and starts the next attempt with its static deadline in one
/// transition; the reply carries that dispatch and deadline
/// (`next.deadline`), so the runner sends no `node.started` for it.
#[expect(clippy::too_many_arguments, reason = "one message's facts")]
fn finish(
    connection: &Connection,
    runner: &Arc<Runner>,
    to: &Addressee,
    before: &RunAggregate,
    finished: Finished,
    output_blob: Option<&Blob>,
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Decided> {
    let Finished {
        attempt_id,
        outcome,
        output,
        error,
        action,
    } = finished;
    let Some(attempt) = before
        .attempt
        .as_ref()
        .filter(|attempt| attempt.attempt_id == attempt_id)
    else {
        // Check the claim first: a fenced runner must learn that it lost it.
        let check = kernel::claim::check(&before.run.lease, Some(&runner.authority), now_ms);
        return Ok(Err(match check {
            Err(reason) => Rejection::ClaimLost { reason }.into(),
            Ok(_) => Rejection::StaleAttempt.into(),
        }));
    };
    let Some(meta) = meta::load(connection, &runner.run_id)? else {
        return Ok(Err(Rejection::StaleRunner.into()));
    };
    let Some(topology) = meta::topology(connection, &meta.definition_digest)? else {
        return Ok(Err(Rejection::StaleRunner.into()));
    };
    if decisions::is_protected_ok(&topology, attempt, outcome) {
        let answer = decisions::finish_checkpoint(
            connection, runner, attempt, &topology, before, output, now_ms, ttl_ms,
        )?;
        let waits = Dispatch::Exit {
            reason: ExitReason::Waiting,
        };
        return Ok(answered(to, before, answer, Some(&waits)));
    }
    let record = ResultRecord::of(attempt, &topology, outcome, now_ms)
        .output(output.as_ref())
        .error(error.as_deref())
        .to_value();
    let next_attempt = AttemptId::new(crate::ids::uuid());
    let result = NodeResult { outcome, record };
    let finished = execution::finish_and_start(
        before,
        &topology,
        &runner.authority,
        &runner.runner_epoch,
        &attempt_id,
        result,
        next_attempt,
        now_ms,
        ttl_ms,
    );
    let (transition, dispatch, deadline) = match finished {
        Ok(finished) => finished,
        Err(rejection) => return Ok(Err(rejection.into())),
    };
    let revision = transition.facts.run.revision.0;
    let stored = AttemptResult {
        output: output_blob.cloned(),
        error_message: error.clone(),
        action_json: action.and_then(|action| serde_json::to_string(&action).ok()),
        status_detail: None,
    };
    let run_id = runner.run_id.clone();
    let terminal_error = transition
        .facts
        .run
        .error
        .is_some()
        .then(|| error.clone().unwrap_or_default());
    let extra: Extra = Box::new(move |connection: &Connection| {
        attempts::record_result(connection, &run_id, &attempt_id, &stored, now_ms)?;
        if let Some(message) = terminal_error {
            store_run_error(connection, &run_id, &message)?;
        }
        Ok(())
    });
    let answer = with_dispatch(
        to.accepted(Some(revision), ReplyResult::Nothing),
        &dispatch,
        deadline,
    );
    Ok(decided(transition, answer, Some(extra)))
}

/// `notification.requested`: the notify node finishes with its receipt as
/// output and, for an interactive run, one passive notification message.
#[expect(clippy::too_many_arguments, reason = "one message's facts")]
fn notify(
    connection: &Connection,
    runner: &Arc<Runner>,
    to: &Addressee,
    before: &RunAggregate,
    attempt_id: AttemptId,
    (content, message_id): (Blob, kernel::ids::MessageId),
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Decided> {
    let Some(attempt) = before
        .attempt
        .as_ref()
        .filter(|attempt| attempt.attempt_id == attempt_id)
    else {
        return Ok(Err(Rejection::StaleAttempt.into()));
    };
    let (Some(meta), order) = (
        meta::load(connection, &runner.run_id)?,
        meta::next_message_order(connection, before.run.mode.origin_session())?,
    ) else {
        return Ok(Err(Rejection::StaleRunner.into()));
    };
    let Some(topology) = meta::topology(connection, &meta.definition_digest)? else {
        return Ok(Err(Rejection::StaleRunner.into()));
    };
    // An interactive run's receipt names its notification message; a headless
    // run has no session to notify, so its output keeps the text instead.
    let receipt = match before.run.mode.origin_session() {
        Some(session) => NotificationResult {
            notification_id: Some(to_wire("notificationId", message_id.as_str())?),
            target_session_id: Some(to_wire("targetSessionId", session.as_str())?),
            text: None,
        },
        None => NotificationResult {
            notification_id: None,
            target_session_id: None,
            text: Some(to_wire("text", String::from_utf8_lossy(&content.bytes))?),
        },
    };
    // The receipt is also the node's output.
    let output = serde_json::to_value(&receipt).map_err(|_| OffSchema("output"))?;
    let record = ResultRecord::of(attempt, &topology, NodeOutcome::Ok, now_ms)
        .output(Some(&output))
        .to_value();
    let result = NodeResult {
        outcome: NodeOutcome::Ok,
        record,
    };
    let message = execution::NotificationMessage {
        message_id: message_id.clone(),
        order,
    };
    let next_attempt = AttemptId::new(crate::ids::uuid());
    let finished = execution::finish_notification(
        before,
        &topology,
        &runner.authority,
        &runner.runner_epoch,
        &attempt_id,
        result,
        message,
        next_attempt,
        now_ms,
        ttl_ms,
    );
    let (transition, dispatch, deadline) = match finished {
        Ok(finished) => finished,
        Err(rejection) => return Ok(Err(rejection.into())),
    };
    let stored = AttemptResult {
        output: Some(Blob::json(&output)),
        ..AttemptResult::default()
    };
    let run_id = runner.run_id.clone();
    let extra: Extra = Box::new(move |connection: &Connection| {
        attempts::record_result(connection, &run_id, &attempt_id, &stored, now_ms)
    });
    let revision = transition.facts.run.revision.0;
    let answer = with_dispatch(
        to.accepted(Some(revision), ReplyResult::Notification(receipt)),
        &dispatch,
        deadline,
    );
    Ok(decided(transition, answer, Some(extra)))
}

/// A runner's error message as stored: at most 8192 characters.
fn bounded_error(message: &str) -> String {
    message.chars().take(8192).collect()
}

/// Stores the message text of a run's terminal error beside its class.
fn store_run_error(connection: &Connection, run_id: &RunId, message: &str) -> rusqlite::Result<()> {
    runs::record_error_message(connection, run_id, message)
}

/// `runner.progress`: register or unregister a child process group.
async fn progress(
    app: &Arc<Context>,
    runner: &Arc<Runner>,
    to: &Addressee,
    register: bool,
    pid: u64,
    start: String,
) -> Handled {
    let pid = u32::try_from(pid).unwrap_or(0);
    let identity = ProcessIdentity::decode(&start).filter(|identity| identity.pid == pid);
    let runner_pid = runner.identity().map(|identity| identity.pid);
    let is_child = identity.as_ref().is_some_and(|identity| {
        process::stat(identity.pid).is_some_and(|stat| {
            Some(stat.parent_pid) == runner_pid && stat.start_time == identity.start_time
        })
    });
    let reject = |message: &'static str| {
        Handled::only(to.refusal(
            ReplyOutcome::Rejected,
            ErrorCode::IllegalTransition,
            message,
        ))
    };
    let Some(identity) = identity else {
        return reject("the process identity is malformed");
    };
    let runner_epoch = runner.runner_epoch.clone();
    let run_id = runner.run_id.clone();
    let authority = runner.authority.clone();
    let now_ms = app.clock.now_ms();
    let registered = app
        .store
        .write(move |connection| {
            let encoded = identity.encode();
            if !register {
                processes::unregister(connection, &runner_epoch, identity.pid, &encoded)?;
                return Ok(Commit::Keep(true));
            }
            // Registration requires the live run claim.
            let lease = runs::load(connection, &run_id)?
                .map(|agg| agg.run.lease)
                .unwrap_or_default();
            if !is_child || kernel::claim::check(&lease, Some(&authority), now_ms).is_err() {
                return Ok(Commit::Discard(false));
            }
            processes::register(connection, &runner_epoch, identity.pid, &encoded, now_ms)?;
            Ok(Commit::Keep(true))
        })
        .await;
    match registered {
        Ok(true) => Handled::only(to.accepted(None, ReplyResult::Nothing)),
        _ => reject("registration needs a direct child of the runner and the live run claim"),
    }
}
