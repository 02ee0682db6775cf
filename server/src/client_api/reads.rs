//! Reads: `runs.list`, `view.page`, `view.content`, `workflows.list` and
//! `sessionView.clearTerminal`, answered from one store read (no receipts).

use super::request::{Request, not_found, unavailable};
use crate::context::Context;
use crate::store::Commit;
use crate::wire::client::response;
use kernel::ids::SessionId;
use protocol::ErrorCode;
use protocol::generated::types::{
    RunsListPayload, SessionPayload, ViewContentPayload, ViewPagePayload, WorkflowsListPayload,
};
use serde_json::{Value, json};
use std::sync::Arc;

pub(super) async fn runs_list(
    app: &Arc<Context>,
    request: &Request,
    payload: &RunsListPayload,
) -> Value {
    let cursor = payload.cursor.clone().map(String::from);
    let limit = payload
        .limit
        .map_or(crate::presentation::reads::LIST_PAGE, |limit| {
            limit.get() as usize
        });
    let max_bytes = payload.max_bytes.map(|max| max.get() as usize);
    let page = app
        .store
        .read(move |connection| {
            crate::presentation::reads::run_list(connection, cursor.as_deref(), limit, max_bytes)
        })
        .await;
    match page {
        Ok((rows, next, revision)) => {
            let mut receipt = json!({ "revision": revision, "rows": rows });
            if let Some(next) = next {
                receipt["nextCursor"] = json!(next);
            }
            response(
                &request.request_id,
                "runs.list",
                "accepted",
                Some(revision),
                Some(receipt),
                None,
            )
        }
        Err(_) => unavailable(request),
    }
}

pub(super) async fn view_page(
    app: &Arc<Context>,
    request: &Request,
    payload: ViewPagePayload,
) -> Value {
    let Some(run_id) = request.run_id.clone() else {
        return not_found(request, "view.page needs a runId");
    };
    let collection = payload.collection.to_string();
    let cursor = payload.cursor.map(String::from);
    let limit = payload.limit.get() as usize;
    let max_bytes = payload.max_bytes.get() as usize;
    let page = app
        .store
        .read(move |connection| {
            crate::presentation::reads::view_page(
                connection,
                &run_id,
                &collection,
                cursor.as_deref(),
                limit,
                max_bytes,
            )
        })
        .await;
    match page {
        Ok(Some(page)) => {
            let revision = page.get("revision").and_then(Value::as_u64);
            response(
                &request.request_id,
                "view.page",
                "accepted",
                revision,
                Some(page),
                None,
            )
        }
        Ok(None) => not_found(request, "no run with this id; check `pi-workflows runs`"),
        Err(_) => unavailable(request),
    }
}

pub(super) async fn view_content(
    app: &Arc<Context>,
    request: &Request,
    payload: ViewContentPayload,
) -> Value {
    let Some(run_id) = request.run_id.clone() else {
        return not_found(request, "view.content needs a runId");
    };
    // `presentation::reads` verifies references in their wire form.
    let reference = serde_json::to_value(&payload.reference).unwrap_or(Value::Null);
    let offset = payload.offset.get() as usize;
    let length = payload.length.get() as usize;
    let chunk = app
        .store
        .read(move |connection| {
            crate::presentation::reads::content_chunk(
                connection, &run_id, &reference, offset, length,
            )
        })
        .await;
    match chunk {
        Ok(Ok(chunk)) => response(
            &request.request_id,
            "view.content",
            "accepted",
            None,
            Some(chunk),
            None,
        ),
        Ok(Err(message)) => response(
            &request.request_id,
            "view.content",
            "unavailable",
            None,
            None,
            Some((ErrorCode::ContentUnavailable, message.into())),
        ),
        Err(_) => unavailable(request),
    }
}

pub(super) async fn clear_terminal(
    app: &Arc<Context>,
    request: &Request,
    payload: &SessionPayload,
) -> Value {
    let session = SessionId::new(payload.session_id.to_string());
    let cleared = app.store.write(move |connection| {
        crate::presentation::reads::clear_terminal(connection, &session)?;
        Ok(Commit::Keep(()))
    });
    match cleared.await {
        Ok(()) => response(
            &request.request_id,
            "sessionView.clearTerminal",
            "accepted",
            None,
            Some(crate::wire::client::receipt(
                &protocol::generated::types::EmptyReceipt {},
            )),
            None,
        ),
        Err(_) => unavailable(request),
    }
}

pub(super) fn workflows_list(
    app: &Arc<Context>,
    request: &Request,
    payload: &WorkflowsListPayload,
) -> Value {
    let project = payload.project_path.as_str();
    let found = crate::discovery::discover(
        std::path::Path::new(project),
        app.config.user_home.as_deref(),
    );
    let offset = payload.offset.map_or(0, |offset| offset.get() as usize);
    let limit = payload.limit.map_or(50, |limit| limit.get() as usize);
    let page: Vec<Value> = found
        .iter()
        .skip(offset)
        .take(limit)
        .map(|found| json!({ "name": found.name, "source": found.origin.as_str() }))
        .collect();
    let mut receipt = json!({ "workflows": page, "total": found.len() });
    if offset + limit < found.len() {
        receipt["nextOffset"] = json!(offset + limit);
    }
    response(
        &request.request_id,
        "workflows.list",
        "accepted",
        None,
        Some(receipt),
        None,
    )
}
