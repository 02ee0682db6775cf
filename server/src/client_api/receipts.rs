//! Command receipts: the durable identity and fingerprint of a
//! state-changing command, the receipt lookup (adopt, conflict, execute),
//! and the one receipt job that executes, records and commits a command
//! before its response.
//!
//! Invariants: see `client_api` (the fingerprint is every command field
//! except the transport request id; only durable outcomes store a receipt;
//! the receipt commits with the change it acknowledges).

use super::request::{Request, schema_invalid};
use crate::context::Context;
use crate::store::{Commit, commands};
use crate::wire::client::response;
use kernel::ids::{ClientId, Digest, IdempotencyKey, RequestId, Revision};
use kernel::output::Output;
use kernel::receipt::{
    self, CommandIdentity, CommandOperation, CommandOutcome, Incoming, ReceiptDecision,
};
use protocol::ErrorCode;
use rusqlite::Connection;
use serde_json::Value;
use std::sync::Arc;

/// What a command's execution decided.
#[derive(Debug)]
pub(super) struct Executed {
    pub(super) outcome: CommandOutcome,
    pub(super) revision: Option<Revision>,
    pub(super) receipt: Option<Value>,
    pub(super) error: Option<(protocol::ErrorCode, String)>,
    pub(super) outputs: Vec<Output>,
}

impl Executed {
    /// An accepted command with its receipt of a generated receipt type.
    pub(super) fn accepted<T: serde::Serialize>(
        revision: Revision,
        receipt: &T,
        outputs: Vec<Output>,
    ) -> Self {
        Self {
            outcome: CommandOutcome::Accepted,
            revision: Some(revision),
            receipt: Some(crate::wire::client::receipt(receipt)),
            error: None,
            outputs,
        }
    }

    /// An accepted command that changed no run (a maintenance command).
    pub(super) fn done<T: serde::Serialize>(receipt: &T) -> Self {
        Self {
            outcome: CommandOutcome::Accepted,
            revision: None,
            receipt: Some(crate::wire::client::receipt(receipt)),
            error: None,
            outputs: Vec::new(),
        }
    }

    /// The same decision with the outputs to perform after its commit.
    pub(super) fn with_outputs(mut self, outputs: Vec<Output>) -> Self {
        self.outputs = outputs;
        self
    }

    pub(super) fn refused(
        outcome: CommandOutcome,
        code: protocol::ErrorCode,
        message: impl Into<String>,
    ) -> Self {
        Self {
            outcome,
            revision: None,
            receipt: None,
            error: Some((code, message.into())),
            outputs: Vec::new(),
        }
    }

    /// A kernel rejection: its code, message and outcome come from the
    /// kernel (`kernel::reject`), never from a table here.
    pub(super) fn rejected<R: kernel::reject::Coded>(rejection: &R) -> Self {
        let (code, message, outcome) = crate::wire::rejection(rejection);
        Self::refused(outcome, code, message)
    }
}

/// The durable identity and its fingerprint, computed before any transaction.
pub(super) struct Identity {
    pub(super) incoming: Incoming,
    pub(super) fingerprint: Digest,
}

pub(super) fn identity(request: &Request) -> Result<Identity, Value> {
    let operation = CommandOperation::from_wire(&request.operation);
    let (Some(operation), Some(key)) = (operation, request.idempotency_key.clone()) else {
        return Err(schema_invalid(
            request,
            "state-changing requests need an idempotencyKey",
        ));
    };
    let payload_bytes = protocol::canonicalize(&request.payload).unwrap_or_default();
    let identity = CommandIdentity {
        client_id: ClientId::new(request.client_id.clone()),
        operation,
        idempotency_key: IdempotencyKey::new(key),
        run_id: request.run_id.clone(),
        expected_revision: request.expected_revision.map(Revision),
        payload_digest: crate::ids::sha256(&payload_bytes),
    };
    let fingerprint_bytes =
        protocol::canonicalize(&serde_json::to_value(&identity).unwrap_or_default())
            .unwrap_or_default();
    Ok(Identity {
        fingerprint: crate::ids::sha256(&fingerprint_bytes),
        incoming: Incoming {
            request_id: RequestId::new(request.request_id.clone()),
            identity,
        },
    })
}

/// The stored body of a receipt: what a retry's response repeats (both
/// fields are always written, `null` when absent).
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct ReceiptBody {
    receipt: Option<Value>,
    error: Option<StoredError>,
}

/// The error of a stored receipt body.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredError {
    code: ErrorCode,
    message: String,
}

/// The stored body of `executed`.
pub(super) fn receipt_body(executed: &Executed) -> ReceiptBody {
    ReceiptBody {
        receipt: executed.receipt.clone(),
        error: executed.error.as_ref().map(|(code, message)| StoredError {
            code: *code,
            message: message.clone(),
        }),
    }
}

/// Looks up the stored receipt of a command: `Some(response)` when it is
/// adopted or conflicts, `None` when it must execute.
pub(super) fn lookup(
    connection: &Connection,
    request: &Request,
    identity: &Identity,
) -> rusqlite::Result<Option<Value>> {
    let incoming = &identity.incoming;
    let by_request = commands::by_request_id(
        connection,
        &incoming.identity.client_id,
        &incoming.request_id,
    )?;
    let by_key = commands::by_key(
        connection,
        &incoming.identity.client_id,
        &incoming.identity.idempotency_key,
    )?;
    let decision = receipt::decide(
        by_request.as_ref().map(|(row, _)| row),
        by_key.as_ref().map(|(row, _)| row),
        incoming,
    );
    Ok(match decision {
        ReceiptDecision::Execute => None,
        ReceiptDecision::Conflict(_) => Some(response(
            &request.request_id,
            &request.operation,
            "conflict",
            None,
            None,
            Some((
                ErrorCode::Conflict,
                "this idempotency key or request id was already used for another request".into(),
            )),
        )),
        ReceiptDecision::Adopt(stored) => {
            let json_text = by_request
                .or(by_key)
                .map(|(_, json)| json)
                .unwrap_or_default();
            let body: Option<ReceiptBody> = serde_json::from_str(&json_text).ok();
            let outcome = crate::wire::codec_name(&stored.adopted_outcome());
            let (receipt, error) = body.map_or((None, None), |body| (body.receipt, body.error));
            Some(response(
                &request.request_id,
                &request.operation,
                &outcome,
                stored.revision.map(|revision| revision.0),
                receipt.filter(|receipt| !receipt.is_null()),
                error.map(|error| (error.code, error.message)),
            ))
        }
    })
}

/// Runs one command job: receipt lookup, execution, receipt storage.
pub(super) async fn command<F>(app: &Arc<Context>, request: Request, execute: F) -> Value
where
    F: FnOnce(&Connection, u64) -> rusqlite::Result<Executed> + Send + 'static,
{
    command_committed(app, request, execute).await.0
}

/// [`command`], and the outcome this request executed and committed with
/// its receipt: `None` when a stored receipt answered it (adopted or a
/// conflict) or nothing was committed.
pub(super) async fn command_committed<F>(
    app: &Arc<Context>,
    request: Request,
    execute: F,
) -> (Value, Option<CommandOutcome>)
where
    F: FnOnce(&Connection, u64) -> rusqlite::Result<Executed> + Send + 'static,
{
    let identity = match identity(&request) {
        Ok(identity) => identity,
        Err(response) => return (response, None),
    };
    let request_for_job = request.clone();
    let clock = app.clock.clone();
    let result = app
        .store
        .write(move |connection| {
            if let Some(response) = lookup(connection, &request_for_job, &identity)? {
                return Ok(Commit::Discard((response, Vec::new(), None)));
            }
            let now_ms = clock.now_ms();
            let executed = execute(connection, now_ms)?;
            let outcome = crate::wire::codec_name(&executed.outcome);
            let body = receipt_body(&executed);
            let value = response(
                &request_for_job.request_id,
                &request_for_job.operation,
                &outcome,
                executed.revision.map(|revision| revision.0),
                executed.receipt.clone(),
                executed.error.clone(),
            );
            let body_text = serde_json::to_string(&body).unwrap_or_default();
            let digest = crate::ids::sha256(body_text.as_bytes());
            match receipt::record(
                &identity.incoming,
                executed.outcome,
                executed.revision,
                digest,
                now_ms,
            ) {
                Some(stored) => {
                    commands::insert(connection, &stored, &identity.fingerprint, &body_text)?;
                    Ok(Commit::Keep((
                        value,
                        executed.outputs,
                        Some(executed.outcome),
                    )))
                }
                None => Ok(Commit::Discard((value, Vec::new(), None))),
            }
        })
        .await;
    match result {
        Ok((value, outputs, stored)) => {
            if stored.is_some() {
                app.faults.hit(crate::fault::FaultPoint::AfterReceipt);
            }
            app.perform(outputs);
            (value, stored)
        }
        Err(error) => (
            response(
                &request.request_id,
                &request.operation,
                "unavailable",
                None,
                None,
                Some(error.refusal()),
            ),
            None,
        ),
    }
}

/// Answers from a stored receipt without executing, if one exists.
pub(super) async fn precheck(app: &Arc<Context>, request: &Request) -> Option<Value> {
    let identity = identity(request).ok()?;
    let request = request.clone();
    app.store
        .read(move |connection| lookup(connection, &request, &identity))
        .await
        .ok()
        .flatten()
}
