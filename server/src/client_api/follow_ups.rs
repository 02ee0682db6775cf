//! `followUp.add` and `followUp.cancel`: ordered per-session follow-up
//! queues, decided by `kernel::follow_up` inside each command's receipt job.
//!
//! `followUp.add` names a run (the envelope's `runId`): the follow-up waits
//! for that run's continuation chain, in the run's origin session. Its
//! message, once the chain's final leaf completed, is offered by the
//! session coordinator (`kernel::session`); building the leaf's terminal
//! message settles every queued follow-up of the chain
//! (`terminal_messages`).

use super::receipts::{Executed, command};
use super::request::{Request, required_run_id};
use crate::context::Context;
use crate::projection::run_view::to_wire;
use crate::store::{follow_ups, meta, runs};
use kernel::follow_up::{self, ChainFacts, FollowUpRecord, FollowUpState, NewFollowUp};
use kernel::receipt::CommandOutcome;
use protocol::ErrorCode;
use protocol::generated::types::{FollowUpAddPayload, FollowUpCancelPayload, FollowUpReceipt};
use serde_json::Value;
use std::sync::Arc;

fn receipt_of(
    follow_up: &FollowUpRecord,
) -> Result<FollowUpReceipt, crate::projection::run_view::OffSchema> {
    Ok(FollowUpReceipt {
        follow_up_id: to_wire("followUpId", follow_up.follow_up_id.as_str())?,
    })
}

pub(super) async fn add(
    app: &Arc<Context>,
    request: Request,
    payload: FollowUpAddPayload,
) -> Value {
    let run_id = match required_run_id(
        &request,
        "followUp.add needs the runId of the workflow it follows",
    ) {
        Ok(run_id) => run_id,
        Err(refusal) => return refusal,
    };
    let prompt = String::from(payload.prompt);
    command(app, request, move |connection, now_ms| {
        let Some(agg) = runs::load(connection, &run_id)? else {
            return Ok(Executed::refused(
                CommandOutcome::NotFound,
                ErrorCode::NotFound,
                "no run with this id; check `pi-workflows runs`",
            ));
        };
        let chain_run_id = follow_ups::chain_root(connection, &run_id)?;
        let (leaf_run_id, leaf_status) = follow_ups::chain_leaf(connection, &run_id)?;
        let session = agg.run.mode.origin_session();
        let position = match session {
            Some(session) => follow_ups::take_position(connection, session, now_ms)?,
            None => 0,
        };
        let follow_up_id = crate::ids::uuid();
        let new = NewFollowUp {
            follow_up_id,
            position,
            message_order: meta::next_message_order(connection, session)?,
        };
        let chain = ChainFacts {
            mode: &agg.run.mode,
            chain_run_id: &chain_run_id,
            leaf_run_id: &leaf_run_id,
            leaf_status,
        };
        let added = match follow_up::add(&chain, new, now_ms) {
            Ok(added) => added,
            Err(rejection) => return Ok(Executed::rejected(&rejection)),
        };
        let queued = FollowUpRecord {
            state: FollowUpState::Queued,
            message_id: None,
            ..added.facts.follow_up.clone()
        };
        follow_ups::insert(connection, &queued, &prompt, now_ms)?;
        follow_ups::write(connection, &added.facts, now_ms)?;
        let receipt = receipt_of(&added.facts.follow_up)?;
        Ok(Executed::done(&receipt).with_outputs(added.outputs))
    })
    .await
}

pub(super) async fn cancel(
    app: &Arc<Context>,
    request: Request,
    payload: FollowUpCancelPayload,
) -> Value {
    let follow_up_id = String::from(payload.follow_up_id);
    command(app, request, move |connection, now_ms| {
        let Some(record) = follow_ups::load(connection, &follow_up_id)? else {
            return Ok(Executed::refused(
                CommandOutcome::NotFound,
                ErrorCode::NotFound,
                "no follow-up with this id",
            ));
        };
        let message = match &record.message_id {
            Some(message_id) => follow_ups::message(connection, message_id)?,
            None => None,
        };
        let cancelled = match follow_up::cancel(&record, message.as_ref()) {
            Ok(cancelled) => cancelled,
            Err(rejection) => return Ok(Executed::rejected(&rejection)),
        };
        follow_ups::write(connection, &cancelled.facts, now_ms)?;
        let receipt = receipt_of(&cancelled.facts.follow_up)?;
        Ok(Executed::done(&receipt).with_outputs(cancelled.outputs))
    })
    .await
}
