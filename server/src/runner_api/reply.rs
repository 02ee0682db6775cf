//! The reply to one runner message, as the generated `ServerMessage::Reply`.
//!
//! Invariants:
//! - Every answer (a reply or a `content.chunk`) repeats the pipe's runner
//!   (run id, generation, runner epoch) and the id of the message it
//!   answers: one [`Addressee`], converted to its wire types once per
//!   message.
//! - A reply's `result` is a [`ReplyResult`]: null, or the generated type
//!   that `x-replyResult` on the answered message's schema variant names
//!   (`tests::each_result_is_a_type_the_schema_names_for_its_message`).
//! - `error` and `next` are set on the typed reply ([`with_error`],
//!   [`with_next`]), `resultContent` by `transfer::fit`; the stored
//!   runner-message receipt is the reply's JSON and is read back as a
//!   `ServerMessage` ([`stored`]), never field by field.

use crate::context::runners::Runner;
use crate::projection::run_view::{OffSchema, to_wire};
use kernel::execution::{Dispatch, ExitReason, StartDeadline};
use protocol::generated::constrained::{ByteOffset, Generation, Revision, TimestampMs, Visit};
use protocol::generated::types::{
    self as wire, EffectAdoption, EffectReservation, EffectSettlement, InteractionRequestResult,
    NodeUpdateResult, NotificationResult, ReplyOutcome, SafeError, ServerMessage, WorkerSchemaId,
};
use serde_json::Value;

/// Who a reply goes to: the pipe's runner and the message it answers.
#[derive(Clone, Debug)]
pub(crate) struct Addressee {
    generation: Generation,
    in_reply_to: wire::MessageId,
    run_id: wire::RunId,
    runner_epoch: wire::RunnerEpoch,
}

impl Addressee {
    /// The addressee of a reply to message `in_reply_to` of `runner`.
    pub(crate) fn of(runner: &Runner, in_reply_to: &str) -> Result<Self, OffSchema> {
        Ok(Self {
            generation: Generation::new(runner.generation.0).ok_or(OffSchema("generation"))?,
            in_reply_to: to_wire("inReplyTo", in_reply_to)?,
            run_id: to_wire("runId", &runner.run_id)?,
            runner_epoch: to_wire("runnerEpoch", &runner.runner_epoch)?,
        })
    }

    /// A reply with `outcome`, the run's `revision` after the message, and
    /// `result`.
    pub(crate) fn reply(
        &self,
        outcome: ReplyOutcome,
        revision: Option<u64>,
        result: ReplyResult,
    ) -> ServerMessage {
        ServerMessage::Reply {
            error: None,
            generation: self.generation,
            in_reply_to: self.in_reply_to.clone(),
            next: None,
            outcome,
            result: result.into_value(),
            result_content: None,
            revision: revision.and_then(|revision| {
                let wire = Revision::new(revision);
                if wire.is_none() {
                    crate::log::line("a run revision over 2^53-1 was left out of a runner reply");
                }
                wire
            }),
            run_id: self.run_id.clone(),
            runner_epoch: self.runner_epoch.clone(),
            schema: WorkerSchemaId::PiWorkflowsWorkerLaunchV1,
        }
    }

    /// The `content.chunk` answering a `content.read`: `data` (base64) at
    /// `offset` of `reference`, `last` when it is the final part.
    pub(crate) fn content_chunk(
        &self,
        reference: wire::ContentReference,
        offset: ByteOffset,
        data: wire::Base64Chunk,
        last: bool,
    ) -> ServerMessage {
        ServerMessage::ContentChunk {
            data,
            final_: last,
            generation: self.generation,
            in_reply_to: self.in_reply_to.clone(),
            offset,
            reference,
            run_id: self.run_id.clone(),
            runner_epoch: self.runner_epoch.clone(),
            schema: WorkerSchemaId::PiWorkflowsWorkerLaunchV1,
        }
    }

    /// An `accepted` reply.
    pub(crate) fn accepted(&self, revision: Option<u64>, result: ReplyResult) -> ServerMessage {
        self.reply(ReplyOutcome::Accepted, revision, result)
    }

    /// A reply that refuses the message: `outcome` (`rejected` or
    /// `claimLost`) with its error code and message and a null result.
    pub(crate) fn refusal(
        &self,
        outcome: ReplyOutcome,
        code: protocol::ErrorCode,
        message: &str,
    ) -> ServerMessage {
        with_error(
            self.reply(outcome, None, ReplyResult::Nothing),
            code,
            message,
        )
    }
}

/// The `result` of a reply: null, or the generated type the schema's
/// `x-replyResult` names for the message answered.
#[derive(Debug)]
pub(crate) enum ReplyResult {
    /// `null`: the message has no result (or was refused).
    Nothing,
    /// `effect.reserve`: apply the effect now.
    EffectReservation(EffectReservation),
    /// `effect.reserve` or `effect.settle` of an effect that already
    /// settled: use its stored result.
    EffectAdoption(EffectAdoption),
    /// `effect.settle`: the state the effect settled to.
    EffectSettlement(EffectSettlement),
    /// `node.update`: the stored update.
    NodeUpdate(NodeUpdateResult),
    /// `interaction.requested`: the request's id.
    InteractionRequest(InteractionRequestResult),
    /// `notification.requested`: the notify node's receipt (its output).
    Notification(NotificationResult),
}

impl ReplyResult {
    /// The reply's any-JSON `result` field.
    fn into_value(self) -> Value {
        let value = match self {
            Self::Nothing => return Value::Null,
            Self::EffectReservation(result) => serde_json::to_value(result),
            Self::EffectAdoption(result) => serde_json::to_value(result),
            Self::EffectSettlement(result) => serde_json::to_value(result),
            Self::NodeUpdate(result) => serde_json::to_value(result),
            Self::InteractionRequest(result) => serde_json::to_value(result),
            Self::Notification(result) => serde_json::to_value(result),
        };
        // A generated struct of strings, integers and JSON values always
        // serialises; should it not, the runner gets a null result.
        value.unwrap_or_else(|_| {
            crate::log::line("a runner reply result did not serialise");
            Value::Null
        })
    }
}

/// `reply` with its `error` (a `SafeError`, the message cut to 512
/// characters). A command or a content chunk carries no error and is
/// returned unchanged.
fn with_error(mut reply: ServerMessage, code: protocol::ErrorCode, message: &str) -> ServerMessage {
    match &mut reply {
        ServerMessage::Reply { error, .. } => {
            *error = Some(SafeError {
                code,
                message: message
                    .chars()
                    .take(512)
                    .collect::<String>()
                    .parse()
                    .unwrap_or_else(|_| {
                        "the message could not be shown"
                            .parse()
                            .expect("a safe message")
                    }),
            });
        }
        ServerMessage::Command { .. } | ServerMessage::ContentChunk { .. } => {}
    }
    reply
}

/// `reply` with its `next` instruction (what the runner does after it). A
/// command or a content chunk is returned unchanged.
pub(crate) fn with_next(reply: ServerMessage, dispatch: &Dispatch) -> ServerMessage {
    with_dispatch(reply, dispatch, None)
}

/// [`with_next`] for a fused commit: a dispatched node carries the
/// `deadline` the commit recorded for it (`next.deadline`).
pub(crate) fn with_dispatch(
    mut reply: ServerMessage,
    dispatch: &Dispatch,
    deadline: Option<StartDeadline>,
) -> ServerMessage {
    match &mut reply {
        ServerMessage::Reply { next, .. } => *next = next_of(dispatch, deadline),
        ServerMessage::Command { .. } | ServerMessage::ContentChunk { .. } => {}
    }
    reply
}

/// The kernel's dispatch as the reply's `next` (`None`, logged, for an id
/// or a deadline off its schema: a server bug).
fn next_of(dispatch: &Dispatch, deadline: Option<StartDeadline>) -> Option<wire::ReplyNext> {
    let next = match dispatch {
        Dispatch::RunNode {
            node_id,
            attempt_id,
            visit,
        } => (|| {
            Some(wire::ReplyNext::RunNode {
                attempt_id: attempt_id.as_str().parse().ok()?,
                deadline: match deadline {
                    None => None,
                    Some(deadline) => Some(wire_deadline(deadline)?),
                },
                node_id: node_id.as_str().parse().ok()?,
                visit: Visit::new(u64::from(*visit))?,
            })
        })(),
        Dispatch::Exit { reason } => Some(wire::ReplyNext::Exit {
            reason: wire_exit_reason(*reason),
        }),
    };
    if next.is_none() {
        crate::log::line("a runner reply's next node did not fit its schema type");
    }
    next
}

/// The kernel's start deadline as the wire names it (`None` for a deadline
/// over 2^53−1).
fn wire_deadline(deadline: StartDeadline) -> Option<wire::StartDeadline> {
    Some(match deadline {
        StartDeadline::Committed { deadline_at_ms } => wire::StartDeadline::Committed {
            deadline_at_ms: match deadline_at_ms {
                None => None,
                Some(at_ms) => Some(TimestampMs::new(at_ms)?),
            },
        },
        StartDeadline::RunnerResolves => wire::StartDeadline::RunnerResolves,
    })
}

/// The kernel's exit reason as the wire names it (a finished generation
/// exits `finished` whatever its outcome).
fn wire_exit_reason(reason: ExitReason) -> wire::ExitReason {
    match reason {
        ExitReason::Completed | ExitReason::Failed | ExitReason::TimedOut => {
            wire::ExitReason::Finished
        }
        ExitReason::Waiting => wire::ExitReason::Waiting,
        ExitReason::Cancelled => wire::ExitReason::Cancelled,
        ExitReason::Parked => wire::ExitReason::Parked,
    }
}

/// The JSON a runner-message receipt stores for its answer: its canonical
/// text (the frame it was sent as, without the newline).
pub(crate) fn to_stored(answer: &ServerMessage) -> String {
    protocol::canonicalize_typed(answer)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .unwrap_or_default()
}

/// A stored answer, read back as the message it was (`None` when the
/// stored JSON is not a `runner.v1` server message: never written so).
pub(crate) fn stored(json: &str) -> Option<ServerMessage> {
    serde_json::from_str(json).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The result types `x-replyResult` names, by message type.
    fn named_results() -> BTreeMap<String, Vec<String>> {
        let schema: Value =
            serde_json::from_str(include_str!("../../../protocol/runner.v1.schema.json")).unwrap();
        let mut named = BTreeMap::new();
        for variant in schema["$defs"]["RunnerMessage"]["oneOf"]
            .as_array()
            .unwrap()
        {
            if let Some(names) = variant.get("x-replyResult") {
                named.insert(
                    variant["properties"]["type"]["const"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                    names
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|name| name.as_str().unwrap().to_owned())
                        .collect(),
                );
            }
        }
        named
    }

    /// The schema type of a result and the message types that answer with it.
    fn answered_by(result: &ReplyResult) -> (Option<&'static str>, &'static [&'static str]) {
        match result {
            ReplyResult::Nothing => (None, &[]),
            ReplyResult::EffectReservation(_) => (Some("EffectReservation"), &["effect.reserve"]),
            ReplyResult::EffectAdoption(_) => {
                (Some("EffectAdoption"), &["effect.reserve", "effect.settle"])
            }
            ReplyResult::EffectSettlement(_) => (Some("EffectSettlement"), &["effect.settle"]),
            ReplyResult::NodeUpdate(_) => (Some("NodeUpdateResult"), &["node.update"]),
            ReplyResult::InteractionRequest(_) => {
                (Some("InteractionRequestResult"), &["interaction.requested"])
            }
            ReplyResult::Notification(_) => {
                (Some("NotificationResult"), &["notification.requested"])
            }
        }
    }

    fn id<T: std::str::FromStr>(text: &str) -> T
    where
        T::Err: std::fmt::Debug,
    {
        text.parse().unwrap()
    }

    /// One value of every result (the exhaustive match in `answered_by`
    /// makes a new variant name its schema type).
    fn every_result() -> Vec<ReplyResult> {
        use protocol::generated::constrained::{AttemptNumber, Sequence};
        vec![
            ReplyResult::Nothing,
            ReplyResult::EffectReservation(EffectReservation {
                attempt_number: AttemptNumber::new(1).unwrap(),
                effect_id: id("effect-1"),
                state: wire::ApplyingState::Applying,
            }),
            ReplyResult::EffectAdoption(EffectAdoption {
                attempt_number: AttemptNumber::new(2).unwrap(),
                effect_id: id("effect-1"),
                result: serde_json::json!({ "output": 1 }),
                state: wire::SettleState::Applied,
            }),
            ReplyResult::EffectSettlement(EffectSettlement {
                effect_id: id("effect-1"),
                state: wire::SettleState::Rejected,
            }),
            ReplyResult::NodeUpdate(NodeUpdateResult {
                seq: Sequence::new(7).unwrap(),
                update_id: id("upd_1"),
            }),
            ReplyResult::InteractionRequest(InteractionRequestResult {
                interaction_id: id("int-1"),
            }),
            ReplyResult::Notification(NotificationResult {
                notification_id: None,
                target_session_id: None,
                text: Some(id("hello")),
            }),
        ]
    }

    #[test]
    fn each_result_is_a_type_the_schema_names_for_its_message() {
        let named = named_results();
        let mut covered = BTreeMap::<String, Vec<String>>::new();
        for result in every_result() {
            let (name, messages) = answered_by(&result);
            for message in messages {
                let listed = named.get(*message).cloned().unwrap_or_default();
                let name = name.unwrap();
                assert!(
                    listed.iter().any(|listed| listed == name),
                    "{message} answers with {name}, which its x-replyResult does not name ({listed:?})"
                );
                covered
                    .entry((*message).to_owned())
                    .or_default()
                    .push(name.to_owned());
            }
        }
        for (message, names) in &named {
            let mut names = names.clone();
            names.sort();
            let mut built = covered.get(message).cloned().unwrap_or_default();
            built.sort();
            assert_eq!(
                built, names,
                "{message}: the schema names a result the server never builds"
            );
        }
    }

    /// The reply bytes of each result are what the server sent before the
    /// results were typed (the runner reads the same keys).
    #[test]
    fn typed_results_serialise_to_the_documents_replies_carried() {
        let values: Vec<Value> = every_result()
            .into_iter()
            .map(ReplyResult::into_value)
            .collect();
        assert_eq!(
            values,
            vec![
                Value::Null,
                serde_json::json!({ "effectId": "effect-1", "state": "applying", "attemptNumber": 1 }),
                serde_json::json!({ "effectId": "effect-1", "state": "applied", "attemptNumber": 2, "result": { "output": 1 } }),
                serde_json::json!({ "effectId": "effect-1", "state": "rejected" }),
                serde_json::json!({ "updateId": "upd_1", "seq": 7 }),
                serde_json::json!({ "interactionId": "int-1" }),
                serde_json::json!({ "notificationId": null, "targetSessionId": null, "text": "hello" }),
            ]
        );
        let interactive = NotificationResult {
            notification_id: Some(id("message-1")),
            target_session_id: Some(id("session-1")),
            text: None,
        };
        assert_eq!(
            ReplyResult::Notification(interactive).into_value(),
            serde_json::json!({ "notificationId": "message-1", "targetSessionId": "session-1" })
        );
    }

    #[test]
    fn a_stored_reply_reads_back_as_the_message_it_was() {
        let reply = ServerMessage::Reply {
            error: None,
            generation: Generation::new(3).unwrap(),
            in_reply_to: id("epoch-m1"),
            next: Some(wire::ReplyNext::Exit {
                reason: wire::ExitReason::Waiting,
            }),
            outcome: ReplyOutcome::Accepted,
            result: ReplyResult::InteractionRequest(InteractionRequestResult {
                interaction_id: id("int-1"),
            })
            .into_value(),
            result_content: None,
            revision: Revision::new(9),
            run_id: id("run-1"),
            runner_epoch: id("epoch"),
            schema: WorkerSchemaId::PiWorkflowsWorkerLaunchV1,
        };
        assert_eq!(stored(&to_stored(&reply)), Some(reply));
        assert_eq!(stored("{\"type\":\"reply\"}"), None);
    }
}
