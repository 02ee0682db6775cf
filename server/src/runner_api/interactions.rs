//! Interactive requests proposed by runners (`interaction.requested`),
//! decided by `kernel::interaction::request`.
//!
//! Invariant: the request, the waiting attempt, the parked run, the released
//! claim and the initial step message (with its prompt content) commit in one
//! transaction; the runner then exits and the origin session does the work.

use crate::context::runners::Runner;
use crate::projection::run_view::{OffSchema, to_wire};
use crate::runner_api::answer::{Answer, Refusal};
use crate::runner_api::reply::ReplyResult;
use crate::store::blobs::Blob;
use crate::store::meta;
use kernel::ids::{AttemptId, InteractionId, MessageId};
use kernel::interaction::{self, InteractionKind, RequestProposal, Requested};
use kernel::run::RunAggregate;
use protocol::generated::types::{Content, InteractionRequestResult};
use rusqlite::Connection;
use serde_json::Value;

/// The prompt and contract of a request, encoded before the transaction,
/// and the id its initial step message gets.
#[derive(Debug, Clone)]
pub struct EncodedRequest {
    pub prompt: Blob,
    pub contract_hash: kernel::ids::Digest,
    pub message_id: MessageId,
}

impl EncodedRequest {
    /// Encodes the prompt text and hashes the contract. A prompt that is a
    /// content reference has no inline text (the step shows an empty one).
    pub fn of(prompt: &Content, contract: &Value) -> Self {
        let prompt_text = match prompt {
            Content::Inline { text } => text.as_str(),
            Content::Reference { .. } => "",
        };
        Self {
            prompt: Blob::text(prompt_text),
            contract_hash: Blob::json(contract).digest,
            message_id: MessageId::new(crate::ids::uuid()),
        }
    }
}

/// What an `interaction.requested` asks for.
#[derive(Debug)]
pub(crate) struct Asked {
    pub attempt_id: AttemptId,
    pub kind: InteractionKind,
    pub deadline_at_ms: Option<u64>,
}

/// Decides one `interaction.requested` of the runner.
pub(crate) fn requested(
    connection: &Connection,
    runner: &Runner,
    asked: Asked,
    encoded: &EncodedRequest,
    before: &RunAggregate,
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Answer> {
    let order = meta::next_message_order(connection, before.run.mode.origin_session())?;
    let message_id = encoded.message_id.clone();
    let proposal = RequestProposal {
        interaction_id: InteractionId::new(format!("int-{}", crate::ids::random_hex::<8>())),
        attempt_id: asked.attempt_id,
        kind: asked.kind,
        contract_hash: encoded.contract_hash,
        deadline_at_ms: asked.deadline_at_ms,
        message_id: message_id.clone(),
        message_order: order,
    };
    let decided = interaction::request(
        before,
        &runner.authority,
        &runner.runner_epoch,
        proposal,
        now_ms,
        ttl_ms,
    );
    Ok(match decided {
        Ok(Requested::Created(transition)) => {
            // The new request is in the transition's facts (a transition
            // without it would be a kernel bug: the message's transaction
            // fails). The initial step message is written with the prompt
            // as its content (`EncodedRequest::message_id`).
            let Some(record) = transition.facts.interaction.as_ref() else {
                return Err(OffSchema("interactionId").into());
            };
            let result = result_of(&record.interaction_id)?;
            Ok((Some(transition), result, None))
        }
        Ok(Requested::Adopted(record)) => Ok((None, result_of(&record.interaction_id)?, None)),
        Err(rejection) => Err(Refusal::of(&rejection)),
    })
}

/// The reply result naming a request.
fn result_of(interaction_id: &InteractionId) -> rusqlite::Result<ReplyResult> {
    Ok(ReplyResult::InteractionRequest(InteractionRequestResult {
        interaction_id: to_wire("interactionId", interaction_id.as_str())?,
    }))
}
