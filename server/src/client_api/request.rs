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

/// A `rejected` response with `schemaInvalid` and `message`.
pub(super) fn schema_invalid(request: &Request, message: &str) -> Value {
    response(
        &request.request_id,
        &request.operation,
        "rejected",
        None,
        None,
        Some((ErrorCode::SchemaInvalid, message.into())),
    )
}

pub(super) fn not_found(request: &Request, message: &str) -> Value {
    response(
        &request.request_id,
        &request.operation,
        "notFound",
        None,
        None,
        Some((ErrorCode::NotFound, message.into())),
    )
}

pub(super) fn unavailable(request: &Request) -> Value {
    response(
        &request.request_id,
        &request.operation,
        "unavailable",
        None,
        None,
        Some((
            ErrorCode::Internal,
            "the state database could not be read; retry".into(),
        )),
    )
}
