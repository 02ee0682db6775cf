//! `resource.apply`, `resource.reconcile`, `resource.delete` (commands
//! through the receipt job) and `resource.get`, `resource.list` (reads):
//! managed resources, decided by `kernel::resource` and
//! `kernel::reconcile`, stored by `store::resources`.
//!
//! Invariants:
//! - `resource.apply` resolves the controller in a controller child
//!   (`children::controller_resolve`) before its job; the job then, in the
//!   one receipt transaction, re-checks that discovery still names the file
//!   the child loaded and that the file's digest still equals the resolved
//!   source digest (anything else is `conflict`, not stored, so the same
//!   request can be retried), and only then applies the kernel's decision,
//!   enqueues the resource and appends an event. (The re-check reads and
//!   hashes one controller file inside the job: the design's "one receipt
//!   transaction", so a spec is never accepted under a file that changed.)
//! - A retry with a used idempotency key adopts its stored receipt before
//!   any child starts (`precheck`).
//! - The same spec applied again writes nothing (`Applied::Unchanged`): its
//!   receipt carries the unchanged `resourceVersion`.
//! - Errors are closed codes with one line saying what to do next; they
//!   never quote a spec, a status or a path.

use super::receipts::{Executed, command, precheck};
use super::request::{Request, not_found, refusal, unavailable};
use crate::children::controller_resolve::{self, ControllerResolved};
use crate::context::Context;
use crate::store::resources::{self as store, ResourceEvent, ResourceEventKind, StoredResource};
use crate::wire::client::{receipt as receipt_value, response};
use kernel::ids::Digest;
use kernel::receipt::CommandOutcome;
use kernel::resource::{self as resource_kernel, Applied, ApplyInput, ResourceRejection};
use protocol::ErrorCode;
use protocol::generated::types::{
    ResourceApplyPayload, ResourceGetPayload, ResourceListPayload, ResourceListView,
    ResourceReceipt, ResourceRefPayload, ResourceView,
};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How many effects and child requests `resource.get` shows.
const VIEW_ITEMS: usize = 50;
/// How many recent events `resource.get` shows.
const VIEW_EVENTS: usize = 20;

fn resource_receipt(version: u64) -> Result<Executed, crate::projection::run_view::OffSchema> {
    Ok(Executed::done(&ResourceReceipt {
        resource_version: crate::projection::run_view::revision(version)?,
    }))
}

/// The outcome a resolve or re-check failure is answered with: a missing
/// controller is `notFound`, a changed source `conflict`, a child that
/// could not run or answer in time `unavailable` (these two are not
/// stored: a retry resolves again), anything else `rejected`.
fn outcome_of(code: ErrorCode) -> CommandOutcome {
    match code {
        ErrorCode::NotFound => CommandOutcome::NotFound,
        ErrorCode::Conflict | ErrorCode::SourceChanged => CommandOutcome::Conflict,
        ErrorCode::Unavailable | ErrorCode::TimedOut => CommandOutcome::Unavailable,
        _ => CommandOutcome::Rejected,
    }
}

/// Why the receipt transaction refuses what the child resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceCheck {
    /// Discovery no longer names the file the child loaded.
    NotDiscovered,
    /// The file's bytes are not the ones the child loaded.
    DigestChanged,
}

/// Discovery still names `path` for `controller`, and its bytes hash to
/// `digest`.
pub fn check_source(
    project: Option<&Path>,
    home: Option<&Path>,
    controller: &str,
    path: &Path,
    digest: &Digest,
) -> Result<(), SourceCheck> {
    if crate::controller_discovery::find(project, home, controller).as_deref() != Some(path) {
        return Err(SourceCheck::NotDiscovered);
    }
    match std::fs::read(path) {
        Ok(bytes) if crate::ids::sha256(&bytes) == *digest => Ok(()),
        _ => Err(SourceCheck::DigestChanged),
    }
}

pub(super) async fn apply(
    app: &Arc<Context>,
    request: Request,
    payload: ResourceApplyPayload,
) -> Value {
    let controller = payload.controller.to_string();
    let key = payload.key.to_string();
    if let Err(rejection) =
        resource_kernel::check_name(&controller).and_then(|()| resource_kernel::check_key(&key))
    {
        let (code, message, _) = crate::wire::rejection(&rejection);
        return refusal(&request, "rejected", code, &message);
    }
    // A retry of an apply that already committed adopts it without resolving again.
    if let Some(adopted) = precheck(app, &request).await {
        return adopted;
    }
    let project = payload
        .project_path
        .as_ref()
        .map(|path| PathBuf::from(path.as_str()));
    let home = app.config.user_home.clone();
    let Some(controller_path) =
        crate::controller_discovery::find(project.as_deref(), home.as_deref(), &controller)
    else {
        return not_found(
            &request,
            &format!(
                "no controller named {controller} is discovered; add {controller}.controller.ts to the project's .pi/controllers/ or to ~/.pi/agent/controllers/, then apply again"
            ),
        );
    };
    let spec = payload.spec;
    let spec_bytes = match protocol::canonicalize(&spec) {
        Ok(bytes) => bytes,
        Err(_) => {
            return refusal(
                &request,
                "rejected",
                ErrorCode::SchemaInvalid,
                "the spec cannot be encoded as canonical JSON; check its numbers",
            );
        }
    };
    let spec_digest = crate::ids::sha256(&spec_bytes);
    let launch_project = project
        .clone()
        .or_else(|| home.clone())
        .unwrap_or_else(|| app.config.home.clone());
    let resolved =
        controller_resolve::resolve(app, &controller, &controller_path, &launch_project, &spec)
            .await;
    let new_uid = crate::ids::uuid();
    command(app, request, move |connection, now_ms| {
        let resolved: ControllerResolved = match resolved {
            Ok(resolved) => resolved,
            Err(error) => {
                return Ok(Executed::refused(
                    outcome_of(error.code),
                    error.code,
                    error.message,
                ));
            }
        };
        if let Err(check) = check_source(
            project.as_deref(),
            home.as_deref(),
            &controller,
            &controller_path,
            &resolved.source_digest,
        ) {
            let message = match check {
                SourceCheck::NotDiscovered => {
                    "discovery now finds another file (or none) for this controller; apply again"
                }
                SourceCheck::DigestChanged => {
                    "the controller file changed while it was being resolved; apply again"
                }
            };
            return Ok(Executed::refused(
                CommandOutcome::Conflict,
                ErrorCode::Conflict,
                message,
            ));
        }
        let existing = store::load(connection, &controller, &key)?;
        let input = ApplyInput {
            new_uid: &new_uid,
            controller: &controller,
            key: &key,
            spec: &spec,
            spec_digest,
            spec_bytes: spec_bytes.len(),
            initial_status: &resolved.initial_status,
            source_digest: resolved.source_digest,
        };
        let applied =
            match resource_kernel::apply(existing.as_ref().map(|r| &r.record), &input, now_ms) {
                Ok(applied) => applied,
                Err(rejection) => return Ok(Executed::rejected(&rejection)),
            };
        let controller_path_text = controller_path.to_string_lossy().into_owned();
        let project_text = project
            .as_ref()
            .map(|path| path.to_string_lossy().into_owned());
        let (record, detail) = match applied {
            Applied::Unchanged => {
                let version = existing.map_or(0, |r| r.record.resource_version);
                return Ok(resource_receipt(version)?);
            }
            Applied::Created(record) => {
                store::insert(
                    connection,
                    &StoredResource {
                        record: record.clone(),
                        controller_path: controller_path_text,
                        project_path: project_text,
                        created_at_ms: now_ms,
                    },
                )?;
                (record, "created")
            }
            Applied::Updated(record) => {
                store::update(connection, &record)?;
                store::set_source(
                    connection,
                    &record.uid,
                    &controller_path_text,
                    project_text.as_deref(),
                )?;
                (record, "the spec changed")
            }
        };
        store::enqueue(connection, &record.uid, now_ms)?;
        store::append_event(
            connection,
            &ResourceEvent::of(&record, ResourceEventKind::Applied, now_ms).with_detail(detail),
        )?;
        Ok(resource_receipt(record.resource_version)?)
    })
    .await
}

/// A missing resource: the kernel's code and message, outcome `notFound`.
fn missing() -> Executed {
    let (code, message, _) = crate::wire::rejection(&ResourceRejection::NotFound);
    Executed::refused(CommandOutcome::NotFound, code, message)
}

pub(super) async fn reconcile(
    app: &Arc<Context>,
    request: Request,
    payload: ResourceRefPayload,
) -> Value {
    let controller = payload.controller.to_string();
    let key = payload.key.to_string();
    command(app, request, move |connection, now_ms| {
        let Some(stored) = store::load(connection, &controller, &key)? else {
            return Ok(missing());
        };
        let record = stored.record;
        store::enqueue(connection, &record.uid, now_ms)?;
        store::append_event(
            connection,
            &ResourceEvent::of(&record, ResourceEventKind::ReconcileRequested, now_ms),
        )?;
        Ok(resource_receipt(record.resource_version)?)
    })
    .await
}

pub(super) async fn delete(
    app: &Arc<Context>,
    request: Request,
    payload: ResourceRefPayload,
) -> Value {
    let controller = payload.controller.to_string();
    let key = payload.key.to_string();
    command(app, request, move |connection, now_ms| {
        let Some(stored) = store::load(connection, &controller, &key)? else {
            return Ok(missing());
        };
        // Asking again changes nothing: the first request's mark stands.
        let Some(marked) = resource_kernel::request_deletion(&stored.record, now_ms) else {
            return Ok(resource_receipt(stored.record.resource_version)?);
        };
        store::update(connection, &marked)?;
        store::enqueue(connection, &marked.uid, now_ms)?;
        store::append_event(
            connection,
            &ResourceEvent::of(&marked, ResourceEventKind::DeletionRequested, now_ms),
        )?;
        Ok(resource_receipt(marked.resource_version)?)
    })
    .await
}

fn condition_status(status: resource_kernel::ConditionStatus) -> &'static str {
    match status {
        resource_kernel::ConditionStatus::True => "true",
        resource_kernel::ConditionStatus::False => "false",
        resource_kernel::ConditionStatus::Unknown => "unknown",
    }
}

fn status_json(status: &resource_kernel::ResourceStatus) -> Value {
    let conditions: Vec<Value> = status
        .conditions
        .iter()
        .map(|condition| {
            let mut value = json!({
                "type": condition.condition_type,
                "status": condition_status(condition.status),
                "reason": condition.reason,
                "observedGeneration": condition.observed_generation,
                "lastTransitionAtMs": condition.last_transition_at_ms,
            });
            if let Some(message) = &condition.message {
                value["message"] = json!(message);
            }
            value
        })
        .collect();
    json!({
        "observedGeneration": status.observed_generation,
        "conditions": conditions,
        "controllerStatus": status.controller_status,
        "workflowRun": status.workflow_run.clone().unwrap_or(Value::Null),
    })
}

/// Sets `key` to `value` when it is `Some`.
fn put<T: serde::Serialize>(object: &mut Value, key: &str, value: Option<T>) {
    if let Some(value) = value {
        object[key] = json!(value);
    }
}

/// The `resource.get` view of one resource, as plain JSON.
fn view_json(
    stored: &StoredResource,
    queue: Option<&kernel::reconcile::QueueRow>,
    effects: &[store::StoredEffect],
    children: &[kernel::child_workflow::ChildRequest],
    events: &[store::StoredEvent],
) -> Value {
    let record = &stored.record;
    let mut view = json!({
        "controller": record.controller,
        "key": record.key,
        "uid": record.uid,
        "resourceVersion": record.resource_version,
        "generation": record.generation,
        "spec": record.spec,
        "status": status_json(&record.status),
        "finalizers": record.finalizers,
        "createdAtMs": stored.created_at_ms,
        "updatedAtMs": record.updated_at_ms,
        "effects": effects.iter().map(|stored| {
            let effect = &stored.effect;
            let mut value = json!({
                "key": effect.key,
                "kind": effect.kind,
                "state": crate::wire::codec_name(&effect.state),
                "generation": effect.generation,
                "startedAtMs": effect.started_at_ms,
            });
            put(&mut value, "completedAtMs", effect.completed_at_ms);
            put(&mut value, "externalRef", stored.external_ref.as_ref());
            put(&mut value, "error", stored.error.as_ref());
            value
        }).collect::<Vec<_>>(),
        "childWorkflows": children.iter().map(|child| json!({
            "requestKey": child.request_key,
            "workflow": child.workflow,
            "attempt": child.attempt,
            "runId": child.run_id.as_str(),
            "state": crate::wire::codec_name(&child.state),
        })).collect::<Vec<_>>(),
        "events": events.iter().map(|stored| {
            let event = &stored.event;
            let mut value = json!({
                "seq": stored.seq,
                "kind": crate::wire::codec_name(&event.kind),
                "atMs": event.at_ms,
            });
            put(&mut value, "resourceVersion", event.resource_version);
            put(&mut value, "generation", event.generation);
            put(&mut value, "detail", event.detail.as_ref());
            value
        }).collect::<Vec<_>>(),
    });
    put(
        &mut view,
        "deletionRequestedAtMs",
        record.deletion_requested_at_ms,
    );
    if let Some(queue) = queue {
        let queue = store::QueueView::from(queue);
        let mut value = json!({
            "version": queue.version,
            "consecutiveErrors": queue.consecutive_errors,
            "claimed": queue.claim_generation.is_some(),
        });
        put(&mut value, "availableAtMs", queue.available_at_ms);
        put(&mut value, "lastError", queue.last_error);
        put(&mut value, "claimGeneration", queue.claim_generation);
        put(&mut value, "claimExpiresAtMs", queue.claim_expires_at_ms);
        view["queue"] = value;
    }
    view
}

pub(super) async fn get(
    app: &Arc<Context>,
    request: &Request,
    payload: &ResourceGetPayload,
) -> Value {
    let controller = payload.controller.to_string();
    let key = payload.key.to_string();
    let read = app
        .store
        .read(move |connection| {
            let Some(stored) = store::load(connection, &controller, &key)? else {
                return Ok(None);
            };
            let uid = stored.record.uid.clone();
            let queue = store::load_queue(connection, &uid)?;
            let effects = store::effects_of(connection, &uid, VIEW_ITEMS)?;
            let children = store::children_of(connection, &uid, VIEW_ITEMS)?;
            let events = store::recent_events(connection, &controller, &key, VIEW_EVENTS)?;
            Ok(Some(view_json(
                &stored,
                queue.as_ref(),
                &effects,
                &children,
                &events,
            )))
        })
        .await;
    match read {
        Ok(Some(view)) => match serde_json::from_value::<ResourceView>(view) {
            Ok(view) => response(
                &request.request_id,
                "resource.get",
                "accepted",
                None,
                Some(receipt_value(&view)),
                None,
            ),
            Err(_) => refusal(
                request,
                "rejected",
                ErrorCode::Internal,
                "this resource cannot be shown; report it with `pi-workflows resources --json`",
            ),
        },
        Ok(None) => not_found(
            request,
            "no such resource; list them with `pi-workflows resources`",
        ),
        Err(_) => unavailable(request),
    }
}

pub(super) async fn list(
    app: &Arc<Context>,
    request: &Request,
    payload: &ResourceListPayload,
) -> Value {
    let controller = payload
        .controller
        .as_ref()
        .map(|name| name.as_str().to_owned());
    let read = app
        .store
        .read(move |connection| store::list(connection, controller.as_deref()))
        .await;
    let Ok(rows) = read else {
        return unavailable(request);
    };
    let rows: Vec<Value> = rows
        .iter()
        .map(|row| {
            let ready = row
                .status
                .conditions
                .iter()
                .find(|condition| condition.condition_type == "Ready")
                .map(|condition| condition_status(condition.status));
            let mut value = json!({
                "controller": row.controller,
                "key": row.key,
                "resourceVersion": row.resource_version,
                "generation": row.generation,
                "observedGeneration": row.status.observed_generation,
                "deleting": row.deletion_requested_at_ms.is_some(),
                "consecutiveErrors": row.consecutive_errors,
                "updatedAtMs": row.updated_at_ms,
            });
            put(&mut value, "ready", ready);
            put(&mut value, "lastError", row.last_error.as_ref());
            value
        })
        .collect();
    match serde_json::from_value::<ResourceListView>(json!({ "resources": rows })) {
        Ok(view) => response(
            &request.request_id,
            "resource.list",
            "accepted",
            None,
            Some(receipt_value(&view)),
            None,
        ),
        Err(_) => refusal(
            request,
            "rejected",
            ErrorCode::Internal,
            "the resource list cannot be shown; report it with `pi-workflows resources --json`",
        ),
    }
}
