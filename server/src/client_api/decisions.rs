//! `decision.answer`: a person's answer to a protected human decision, and
//! `effect.recover`: an operator's review of an ambiguous managed effect.
//! Each is decided by the kernel inside its receipt job.
//!
//! Invariants:
//! - An answer is checked against the request the decision was opened for
//!   (the digest the person saw) and its typed choices before the kernel
//!   decides it (`kernel::decision::check_answer`, then `answer`).
//! - Acceptance, the control claim, the settled parent and the one
//!   continuation commit together with the receipt; who answered is
//!   recorded beside the accepted decision and never answered back.
//! - An identical answer after acceptance adopts the winner without
//!   changing anything; an accepted decision without a continuation (an
//!   older writer's crash) is continued by `kernel::decision::recover`.
//! - A retry of an ambiguous effect says, in its receipt, that a duplicate
//!   in the external system is possible.

use super::receipts::{Executed, command, command_committed};
use super::request::{Request, required_run_id};
use crate::context::Context;
use crate::projection::run_view::{OffSchema, to_wire};
use crate::store::blobs::{self, Blob};
use crate::store::{decisions, runs};
use crate::wire::client::response;
use kernel::channel::ChannelRejection;
use kernel::decision::{Answered, DecisionRecord, Recovered};
use kernel::effect::{EffectRecord, EffectState, RecoveryAction};
use kernel::ids::{EffectId, Revision, RunId};
use kernel::output::{Output, Step};
use kernel::receipt::CommandOutcome;
use kernel::run::{self, RunAggregate};
use protocol::ErrorCode;
use protocol::generated::constrained::AttemptNumber;
use protocol::generated::types::{
    DecisionAnswerPayload, DecisionAnswerReceipt, DecisionChannel, EffectRecoverPayload,
    EffectRecoverReceipt, HumanDecisionRequest, RecoverAction,
};
use rusqlite::Connection;
use serde_json::Value;
use std::sync::Arc;

/// What a retry tells the operator.
const DUPLICATE_WARNING: &str = "the effect will be applied again as a new attempt: if its earlier attempt reached the external system, a duplicate is possible";

/// The run a command names, or the refusal that it names none.
fn no_run() -> Executed {
    Executed::refused(
        CommandOutcome::NotFound,
        ErrorCode::NotFound,
        "no run with this id; check `pi-workflows runs`",
    )
}

/// What a channel's answer must also pass, decided inside the answer's own
/// job over the loaded parent and its stored request
/// (`kernel::channel::check_answer`).
pub(crate) type ChannelCheck = Box<
    dyn FnOnce(
            &Connection,
            &RunAggregate,
            &HumanDecisionRequest,
        ) -> rusqlite::Result<Result<(), ChannelRejection>>
        + Send,
>;

/// A channel adapter's answer: `decision.answer` under the channel's own
/// client id and idempotency key (`telegram:<profile>:<event id>`, so a
/// repeated press adopts its receipt), with `check` decided in the same
/// job. Whether this request's answer was accepted and committed.
pub(crate) async fn answer_from_channel(
    app: &Arc<Context>,
    client_id: String,
    idempotency_key: String,
    run_id: RunId,
    payload: DecisionAnswerPayload,
    check: ChannelCheck,
) -> bool {
    let request = Request {
        request_id: idempotency_key.clone(),
        client_id,
        operation: "decision.answer".into(),
        run_id: Some(run_id),
        expected_revision: None,
        idempotency_key: Some(idempotency_key),
        payload: serde_json::to_value(&payload).unwrap_or_default(),
    };
    let (_, outcome) = answer_checked(app, request, payload, Some(check)).await;
    outcome == Some(CommandOutcome::Accepted)
}

/// `decision.answer` from a socket client. Provenance `telegram` is the
/// server's own channel-adapter path ([`answer_from_channel`]); a client
/// that claims it is refused before anything is looked up or stored.
pub(super) async fn answer(
    app: &Arc<Context>,
    request: Request,
    payload: DecisionAnswerPayload,
) -> Value {
    match payload.source.channel {
        DecisionChannel::Pi | DecisionChannel::Cli | DecisionChannel::Piw => {
            answer_checked(app, request, payload, None).await.0
        }
        DecisionChannel::Telegram => response(
            &request.request_id,
            "decision.answer",
            "rejected",
            None,
            None,
            Some((
                ErrorCode::SchemaInvalid,
                "a client answers as pi, cli or piw; telegram answers come only from the server's Telegram channel".into(),
            )),
        ),
    }
}

async fn answer_checked(
    app: &Arc<Context>,
    request: Request,
    payload: DecisionAnswerPayload,
    channel_check: Option<ChannelCheck>,
) -> (Value, Option<CommandOutcome>) {
    let run_id = match required_run_id(&request, "this operation needs a runId") {
        Ok(run_id) => run_id,
        Err(refusal) => return (refusal, None),
    };
    let control = app.control.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    let faults = app.faults.clone();
    let expected_revision = request.expected_revision;
    let given = crate::wire::decision::response_of(payload.choice.clone(), payload.input.clone());
    let blob = Blob::json(&crate::wire::decision::response_value(&given));
    command_committed(app, request, move |connection, now_ms| {
        let Some(parent) = runs::load(connection, &run_id)? else {
            return Ok(no_run());
        };
        if let Err(stale) = run::check_revision(&parent.run, expected_revision) {
            return Ok(Executed::rejected(&stale));
        }
        let decision = decisions::for_checkpoint(connection, &parent)?
            .filter(|decision| decision.decision_id.as_str() == payload.decision_id.as_str());
        let Some(decision) = decision else {
            return Ok(Executed::refused(
                CommandOutcome::NotFound,
                ErrorCode::NotFound,
                "the run waits on no protected decision with this id; read its view for the decision to answer",
            ));
        };
        let request = decisions::request(connection, &run_id, &decision.node_id)?;
        let choices = request.as_ref().and_then(crate::wire::decision::choices);
        let (Some(choices), Some(seen)) = (
            choices,
            crate::wire::decision::request_digest(&payload.request_digest),
        ) else {
            return Ok(Executed::refused(
                CommandOutcome::Rejected,
                ErrorCode::Internal,
                "the decision's stored request could not be read",
            ));
        };
        if let (Some(check), Some(stored)) = (channel_check, request.as_ref())
            && let Err(rejection) = check(connection, &parent, stored)?
        {
            return Ok(Executed::rejected(&rejection));
        }
        let answer = crate::wire::decision::response(&given);
        if let Err(rejection) = kernel::decision::check_answer(&decision, &seen, &choices, &answer)
        {
            return Ok(Executed::rejected(&rejection));
        }
        let Some(continuation) =
            crate::continuation::for_decision(connection, &parent, &decision, control)?
        else {
            return Ok(no_run());
        };
        let decided = kernel::decision::answer(
            &parent,
            &decision,
            blob.digest,
            &continuation,
            now_ms,
            ttl_ms,
        );
        match decided {
            Ok(Answered::Accepted(continued)) => {
                let receipt = receipt(&continued.decision)?;
                let revision = continued.parent.facts.run.revision;
                let accepted = continued.decision.decision_id.clone();
                let outputs = crate::continuation::write_continued(
                    connection, &parent, continued, &blob, now_ms,
                )?;
                decisions::record_source(
                    connection,
                    &accepted,
                    &payload.source.channel.to_string(),
                    payload.source.actor_id.as_str(),
                )?;
                faults.hit(crate::fault::FaultPoint::DecisionBeforeCommit);
                Ok(Executed::accepted(revision, &receipt, outputs))
            }
            Ok(Answered::Adopted(winner)) if winner.continuation_run_id.is_some() => {
                Ok(Executed::accepted(parent.run.revision, &receipt(&winner)?, Vec::new()))
            }
            Ok(Answered::Adopted(winner)) => {
                continue_accepted(connection, &parent, &winner, &continuation, now_ms, ttl_ms)
            }
            Err(rejection) => Ok(Executed::rejected(&rejection)),
        }
    })
    .await
}

/// Continues an accepted decision that has no continuation yet
/// (`kernel::decision::recover`: prepare, or adopt the existing child).
fn continue_accepted(
    connection: &Connection,
    parent: &RunAggregate,
    decision: &DecisionRecord,
    continuation: &kernel::decision::ContinuationRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Executed> {
    let existing = crate::continuation::existing_child(connection, parent)?;
    let recovered = kernel::decision::recover(
        parent,
        decision,
        existing.as_ref(),
        continuation,
        now_ms,
        ttl_ms,
    );
    match recovered {
        Ok(Recovered::Prepared(continued)) => {
            let Some(response) = decisions::response(connection, decision)? else {
                return Ok(Executed::refused(
                    CommandOutcome::Rejected,
                    ErrorCode::Internal,
                    "the accepted response could not be read",
                ));
            };
            let receipt = receipt(&continued.decision)?;
            let revision = continued.parent.facts.run.revision;
            let outputs = crate::continuation::write_continued(
                connection,
                parent,
                continued,
                &Blob::json(&response),
                now_ms,
            )?;
            Ok(Executed::accepted(revision, &receipt, outputs))
        }
        Ok(Recovered::Adopted { child_run_id }) => {
            let receipt = DecisionAnswerReceipt {
                continuation_run_id: to_wire("continuationRunId", child_run_id.as_str())?,
                decision_id: to_wire("decisionId", decision.decision_id.as_str())?,
            };
            Ok(Executed::accepted(
                parent.run.revision,
                &receipt,
                Vec::new(),
            ))
        }
        Err(rejection) => Ok(Executed::rejected(&rejection)),
    }
}

fn receipt(decision: &DecisionRecord) -> Result<DecisionAnswerReceipt, OffSchema> {
    let continuation = decision
        .continuation_run_id
        .as_ref()
        .ok_or(OffSchema("continuationRunId"))?;
    Ok(DecisionAnswerReceipt {
        continuation_run_id: to_wire("continuationRunId", continuation.as_str())?,
        decision_id: to_wire("decisionId", decision.decision_id.as_str())?,
    })
}

/// `effect.recover`.
pub(super) async fn recover_effect(
    app: &Arc<Context>,
    request: Request,
    payload: EffectRecoverPayload,
) -> Value {
    let run_id = match required_run_id(&request, "this operation needs a runId") {
        Ok(run_id) => run_id,
        Err(refusal) => return refusal,
    };
    let expected_revision = request.expected_revision;
    let effect_id = EffectId::new(payload.effect_id.as_str());
    command(app, request, move |connection, now_ms| {
        let Some(before) = runs::load(connection, &run_id)? else {
            return Ok(no_run());
        };
        if let Err(stale) = run::check_revision(&before.run, expected_revision) {
            return Ok(Executed::rejected(&stale));
        }
        let recovered = match recover_in(connection, &before, &effect_id, payload.action, now_ms)? {
            Ok(recovered) => recovered,
            Err(refused) => return Ok(refused),
        };
        let effect = &recovered.effect;
        let receipt = EffectRecoverReceipt {
            attempt_number: AttemptNumber::new(u64::from(effect.attempt_number))
                .ok_or(OffSchema("attemptNumber"))?,
            effect_id: to_wire("effectId", effect_id.as_str())?,
            state: to_wire("state", effect.state)?,
            warning: (effect.state == EffectState::Reserved)
                .then(|| to_wire("warning", DUPLICATE_WARNING))
                .transpose()?,
        };
        Ok(Executed::accepted(
            recovered.revision,
            &receipt,
            recovered.outputs,
        ))
    })
    .await
}

/// An ambiguous effect recovered and written: the effect as it is now, the
/// run's revision and the outputs to perform after the commit.
pub(super) struct EffectRecovered {
    pub(super) effect: EffectRecord,
    pub(super) revision: Revision,
    pub(super) outputs: Vec<Output>,
}

/// `kernel::channel::recover` (`kernel::effect::recover`, which also lets an
/// ambiguous settlement edit be retried after its run ended) of `effect_id`
/// on `before`, written inside the caller's job (`effect.recover`,
/// `channel.recover`), or the refusal.
pub(super) fn recover_in(
    connection: &Connection,
    before: &RunAggregate,
    effect_id: &EffectId,
    action: RecoverAction,
    now_ms: u64,
) -> rusqlite::Result<Result<EffectRecovered, Executed>> {
    let action = match action {
        RecoverAction::Confirm => RecoveryAction::Confirm,
        RecoverAction::Retry => RecoveryAction::Retry,
    };
    // A confirmation records that the effect applied; the operator holds no
    // receipt of it, so its result is `null`.
    let observed = Blob::json(&Value::Null);
    let transition =
        match kernel::channel::recover(before, effect_id, action, observed.digest, now_ms) {
            Ok(transition) => transition,
            Err(rejection) => return Ok(Err(Executed::rejected(&rejection))),
        };
    let Some(effect) = transition
        .facts
        .effects
        .iter()
        .find(|effect| effect.effect_id == *effect_id)
        .cloned()
    else {
        return Ok(Err(Executed::refused(
            CommandOutcome::Rejected,
            ErrorCode::Internal,
            "the recovered effect is missing",
        )));
    };
    blobs::put(connection, &observed, blobs::JSON, now_ms)?;
    let revision = transition.facts.run.revision;
    let outputs =
        crate::shell::write_step(connection, before, Step::Apply(transition), &[], now_ms)?;
    Ok(Ok(EffectRecovered {
        effect,
        revision,
        outputs,
    }))
}
