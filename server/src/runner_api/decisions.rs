//! `node.finished` of a `humanDecision` checkpoint: the sealed request is
//! checked (`wire::decision::check`: schema, binding to the finishing
//! attempt, seals, choices, default and expiry) and the kernel opens the
//! decision in the transition that makes the run wait
//! (`kernel::execution::finish_protected_checkpoint`).
//!
//! Invariants:
//! - A request that fails a check is a protocol violation of the runner: the
//!   message is refused with the schema check and the run parks
//!   `protocolRejected`; no decision opens.
//! - The request is stored as the checkpoint's output in the same
//!   transaction, before the decision message is written, so the message
//!   renders the request it belongs to; the request's default response
//!   (`onTimeout`), which the decision names, is stored with it.

use crate::context::runners::Runner;
use crate::runner_api::answer::{Answer, Refusal};
use crate::runner_api::reply::ReplyResult;
use crate::store::attempts::{self, AttemptResult};
use crate::store::blobs::{self, Blob};
use crate::store::meta;
use kernel::attempt::{AttemptRecord, NodeOutcome, ResultRecord};
use kernel::execution::{self, DecisionMessage, NodeResult};
use kernel::ids::MessageId;
use kernel::run::RunAggregate;
use kernel::runner::ProtocolCheck;
use kernel::topology::Topology;
use rusqlite::Connection;
use serde_json::Value;

/// Whether `attempt` runs a protected checkpoint that finishes `ok`: the
/// only finish [`finish_checkpoint`] decides.
pub(crate) fn is_protected_ok(
    topology: &Topology,
    attempt: &AttemptRecord,
    outcome: NodeOutcome,
) -> bool {
    outcome == NodeOutcome::Ok
        && topology
            .node(&attempt.node_id)
            .is_some_and(|node| node.human_decision)
}

/// Decides the `ok` finish of a protected checkpoint with `output` (its
/// sealed request).
#[expect(clippy::too_many_arguments, reason = "one message's facts")]
pub(crate) fn finish_checkpoint(
    connection: &Connection,
    runner: &Runner,
    attempt: &AttemptRecord,
    topology: &Topology,
    before: &RunAggregate,
    output: Option<Value>,
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Answer> {
    let Some(output) = output else {
        return Ok(Err(refused(
            "a human decision checkpoint finishes with its request as its output",
        )));
    };
    let checked = match crate::wire::decision::check(
        output.clone(),
        runner.run_id.as_str(),
        attempt.node_id.as_str(),
        attempt.attempt_id.as_str(),
    ) {
        Ok(checked) => checked,
        Err(problem) => return Ok(Err(refused(problem.message()))),
    };
    let order = meta::next_message_order(connection, before.run.mode.origin_session())?;
    let message = DecisionMessage {
        message_id: MessageId::new(crate::ids::uuid()),
        order,
    };
    let record = ResultRecord::of(attempt, topology, NodeOutcome::Ok, now_ms)
        .output(Some(&output))
        .to_value();
    let result = NodeResult {
        outcome: NodeOutcome::Ok,
        record,
    };
    let finished = execution::finish_protected_checkpoint(
        before,
        topology,
        &runner.authority,
        &runner.runner_epoch,
        &attempt.attempt_id,
        result,
        checked.opening,
        message,
        now_ms,
        ttl_ms,
    );
    let (transition, _waits) = match finished {
        Ok(finished) => finished,
        Err(rejection) => return Ok(Err(rejection.into())),
    };
    // The request is the checkpoint's output, stored before the decision
    // message that renders it (same transaction).
    let stored = AttemptResult {
        output: Some(Blob::json(&output)),
        ..AttemptResult::default()
    };
    attempts::record_result(
        connection,
        &runner.run_id,
        &attempt.attempt_id,
        &stored,
        now_ms,
    )?;
    // The default response the decision names (`default_answer_digest`) is
    // stored with it, so the reference holds whether the deadline, an
    // answer or a cancellation settles the decision.
    if let Some(default) = &checked.request.default_response {
        let default = Blob::json(&crate::wire::decision::response_value(default));
        blobs::put(connection, &default, blobs::JSON, now_ms)?;
    }
    Ok(Ok((Some(transition), ReplyResult::Nothing, None)))
}

/// A request the server cannot open a decision for: the runner broke the
/// protocol (the run parks `protocolRejected`).
fn refused(message: &'static str) -> Refusal {
    Refusal {
        code: protocol::ErrorCode::SchemaInvalid,
        message,
        claim_lost: false,
        protocol: Some(ProtocolCheck::Schema),
    }
}
