//! One client request's envelope fields and the refusals every handler
//! shares (schema-invalid, not found, store unavailable).

use crate::wire::client::response;
use kernel::ids::RunId;
use protocol::ErrorCode;
use serde_json::Value;

/// One request's envelope fields.
#[derive(Clone, Debug)]
pub(super) struct Request {
    pub(super) request_id: String,
    pub(super) client_id: String,
    pub(super) operation: String,
    pub(super) run_id: Option<RunId>,
    pub(super) expected_revision: Option<u64>,
    pub(super) idempotency_key: Option<String>,
    pub(super) payload: Value,
}

/// A response to `request` with `outcome`, no receipt, and `code` with
/// `message` as its error.
pub(super) fn refusal(request: &Request, outcome: &str, code: ErrorCode, message: &str) -> Value {
    response(
        &request.request_id,
        &request.operation,
        outcome,
        None,
        None,
        Some((code, message.into())),
    )
}

/// The request's `runId`, or the `schemaInvalid` refusal with `message`
/// (what the operation needs it for).
pub(super) fn required_run_id(request: &Request, message: &str) -> Result<RunId, Value> {
    request
        .run_id
        .clone()
        .ok_or_else(|| schema_invalid(request, message))
}

/// A `rejected` response with `schemaInvalid` and `message`.
pub(super) fn schema_invalid(request: &Request, message: &str) -> Value {
    refusal(request, "rejected", ErrorCode::SchemaInvalid, message)
}

pub(super) fn not_found(request: &Request, message: &str) -> Value {
    refusal(request, "notFound", ErrorCode::NotFound, message)
}

pub(super) fn unavailable(request: &Request) -> Value {
    refusal(
        request,
        "unavailable",
        ErrorCode::Internal,
        "the state database could not be read; retry",
    )
}
