//! Reads: `runs.list`, `view.page`, `view.content`, `workflows.list` and
//! `sessionView.clearTerminal`, answered from one store read (no receipts).

use super::request::{Request, not_found, unavailable};
use crate::context::Context;
use crate::projection::run_view::to_wire;
use crate::store::Commit;
use crate::wire::client::{receipt as receipt_value, response};
use kernel::ids::SessionId;
use protocol::ErrorCode;
use protocol::generated::constrained::Count;
use protocol::generated::types::{
    RunListReceipt, RunsListPayload, SessionPayload, ViewContentPayload, ViewPagePayload,
    WorkflowListReceipt, WorkflowSummary, WorkflowsListPayload,
};
use serde_json::Value;
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
            let (rows, next, revision) = crate::presentation::reads::run_list_rows(
                connection,
                cursor.as_deref(),
                limit,
                max_bytes,
            )?;
            let receipt = RunListReceipt {
                next_cursor: next.map(|next| to_wire("nextCursor", next)).transpose()?,
                revision: crate::projection::run_view::revision(revision)?,
                rows,
            };
            Ok((receipt, revision))
        })
        .await;
    match page {
        Ok((receipt, revision)) => response(
            &request.request_id,
            "runs.list",
            "accepted",
            Some(revision),
            Some(receipt_value(&receipt)),
            None,
        ),
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
        Ok(Some(page)) => response(
            &request.request_id,
            "view.page",
            "accepted",
            Some(page.revision.get()),
            Some(receipt_value(&page)),
            None,
        ),
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
    let reference = payload.reference;
    let offset = payload.offset.get() as usize;
    let length = payload.length.get() as usize;
    let chunk = app
        .store
        .read(move |connection| {
            crate::presentation::reads::content_chunk(
                connection, &run_id, reference, offset, length,
            )
        })
        .await;
    match chunk {
        Ok(Ok(chunk)) => response(
            &request.request_id,
            "view.content",
            "accepted",
            None,
            Some(receipt_value(&chunk)),
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
            Some(receipt_value(&protocol::generated::types::EmptyReceipt {})),
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
    let typed = || -> Option<WorkflowListReceipt> {
        let workflows = found
            .iter()
            .skip(offset)
            .take(limit)
            .map(|found| {
                Some(WorkflowSummary {
                    name: found.name.parse().ok()?,
                    source: found.origin.as_str().parse().ok()?,
                    title: None,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(WorkflowListReceipt {
            next_offset: if offset + limit < found.len() {
                Some(Count::new((offset + limit) as u64)?)
            } else {
                None
            },
            total: Count::new(found.len() as u64)?,
            workflows,
        })
    };
    match typed() {
        Some(receipt) => response(
            &request.request_id,
            "workflows.list",
            "accepted",
            None,
            Some(receipt_value(&receipt)),
            None,
        ),
        None => unavailable(request),
    }
}
