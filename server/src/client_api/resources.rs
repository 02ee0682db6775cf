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
use kernel::child_workflow::{ChildRequest, ChildState};
use kernel::controller_effect::ControllerEffectState;
use kernel::ids::Digest;
use kernel::receipt::CommandOutcome;
use kernel::reconcile::QueueRow;
use kernel::resource::{self as resource_kernel, Applied, ApplyInput, ResourceRejection};
use kernel::resource::{ConditionStatus, ResourceStatus};
use protocol::ErrorCode;
use protocol::generated::constrained::{
    Count, ResourceChildWorkflowViews, ResourceConditionViews, ResourceEffectViews,
    ResourceEventViews, ResourceFinalizerNames, ResourceListRows, Revision, TimestampMs,
};
use protocol::generated::types::{
    ResourceApplyPayload, ResourceChildWorkflowView, ResourceChildWorkflowViewState,
    ResourceConditionView, ResourceConditionViewStatus, ResourceEffectView,
    ResourceEffectViewState, ResourceEventView, ResourceEventViewKind, ResourceGetPayload,
    ResourceListPayload, ResourceListRow, ResourceListRowReady, ResourceListView,
    ResourceQueueView, ResourceReceipt, ResourceRefPayload, ResourceStatusView, ResourceView,
};
use serde_json::Value;
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
        return refusal(&request, "rejected", code, message);
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

fn count(value: u64) -> Option<Count> {
    Count::new(value)
}

fn at(value: u64) -> Option<TimestampMs> {
    TimestampMs::new(value)
}

fn text<T: std::str::FromStr>(value: &str) -> Option<T> {
    value.parse().ok()
}

fn view_status(status: ConditionStatus) -> ResourceConditionViewStatus {
    match status {
        ConditionStatus::True => ResourceConditionViewStatus::True,
        ConditionStatus::False => ResourceConditionViewStatus::False,
        ConditionStatus::Unknown => ResourceConditionViewStatus::Unknown,
    }
}

fn list_ready(status: ConditionStatus) -> ResourceListRowReady {
    match status {
        ConditionStatus::True => ResourceListRowReady::True,
        ConditionStatus::False => ResourceListRowReady::False,
        ConditionStatus::Unknown => ResourceListRowReady::Unknown,
    }
}

fn status_view(status: &ResourceStatus) -> Option<ResourceStatusView> {
    let conditions = status
        .conditions
        .iter()
        .map(|condition| {
            Some(ResourceConditionView {
                type_: text(&condition.condition_type)?,
                status: view_status(condition.status),
                reason: text(&condition.reason)?,
                message: match &condition.message {
                    Some(message) => Some(text(message)?),
                    None => None,
                },
                observed_generation: count(condition.observed_generation)?,
                last_transition_at_ms: at(condition.last_transition_at_ms)?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(ResourceStatusView {
        observed_generation: count(status.observed_generation)?,
        conditions: ResourceConditionViews::new(conditions).ok()?,
        controller_status: status.controller_status.clone(),
        workflow_run: status.workflow_run.clone().unwrap_or(Value::Null),
    })
}

fn effect_view(stored: &store::StoredEffect) -> Option<ResourceEffectView> {
    let effect = &stored.effect;
    Some(ResourceEffectView {
        key: text(&effect.key)?,
        kind: text(&effect.kind)?,
        state: match effect.state {
            ControllerEffectState::Pending => ResourceEffectViewState::Pending,
            ControllerEffectState::Applied => ResourceEffectViewState::Applied,
            ControllerEffectState::Rejected => ResourceEffectViewState::Rejected,
            ControllerEffectState::Indeterminate => ResourceEffectViewState::Indeterminate,
        },
        generation: count(effect.generation)?,
        started_at_ms: at(effect.started_at_ms)?,
        completed_at_ms: match effect.completed_at_ms {
            Some(ms) => Some(at(ms)?),
            None => None,
        },
        external_ref: match &stored.external_ref {
            Some(reference) => Some(text(reference)?),
            None => None,
        },
        error: match &stored.error {
            Some(error) => Some(text(error)?),
            None => None,
        },
    })
}

fn child_view(child: &ChildRequest) -> Option<ResourceChildWorkflowView> {
    Some(ResourceChildWorkflowView {
        request_key: text(&child.request_key)?,
        workflow: text(&child.workflow)?,
        attempt: count(u64::from(child.attempt))?,
        run_id: text(child.run_id.as_str())?,
        state: match child.state {
            ChildState::Running => ResourceChildWorkflowViewState::Running,
            ChildState::Waiting => ResourceChildWorkflowViewState::Waiting,
            ChildState::Succeeded => ResourceChildWorkflowViewState::Succeeded,
            ChildState::Failed => ResourceChildWorkflowViewState::Failed,
            ChildState::Interrupted => ResourceChildWorkflowViewState::Interrupted,
        },
    })
}

fn event_kind(kind: ResourceEventKind) -> ResourceEventViewKind {
    match kind {
        ResourceEventKind::Applied => ResourceEventViewKind::Applied,
        ResourceEventKind::ReconcileRequested => ResourceEventViewKind::ReconcileRequested,
        ResourceEventKind::DeletionRequested => ResourceEventViewKind::DeletionRequested,
        ResourceEventKind::ReconcileStarted => ResourceEventViewKind::ReconcileStarted,
        ResourceEventKind::ReconcileSettled => ResourceEventViewKind::ReconcileSettled,
        ResourceEventKind::ReconcileRequeued => ResourceEventViewKind::ReconcileRequeued,
        ResourceEventKind::ReconcileConflict => ResourceEventViewKind::ReconcileConflict,
        ResourceEventKind::ReconcileFailed => ResourceEventViewKind::ReconcileFailed,
        ResourceEventKind::ClaimLost => ResourceEventViewKind::ClaimLost,
        ResourceEventKind::EffectReserved => ResourceEventViewKind::EffectReserved,
        ResourceEventKind::EffectSettled => ResourceEventViewKind::EffectSettled,
        ResourceEventKind::EffectRecovered => ResourceEventViewKind::EffectRecovered,
        ResourceEventKind::WorkflowStarted => ResourceEventViewKind::WorkflowStarted,
        ResourceEventKind::WorkflowEnded => ResourceEventViewKind::WorkflowEnded,
        ResourceEventKind::ResourceDeleted => ResourceEventViewKind::ResourceDeleted,
    }
}

fn event_view(stored: &store::StoredEvent) -> Option<ResourceEventView> {
    let event = &stored.event;
    Some(ResourceEventView {
        seq: count(stored.seq)?,
        kind: event_kind(event.kind),
        at_ms: at(event.at_ms)?,
        resource_version: match event.resource_version {
            Some(version) => Some(count(version)?),
            None => None,
        },
        generation: match event.generation {
            Some(generation) => Some(count(generation)?),
            None => None,
        },
        detail: match &event.detail {
            Some(detail) => Some(text(detail)?),
            None => None,
        },
    })
}

fn queue_view(row: &QueueRow) -> Option<ResourceQueueView> {
    let queue = store::QueueView::from(row);
    Some(ResourceQueueView {
        available_at_ms: match queue.available_at_ms {
            Some(ms) => Some(at(ms)?),
            None => None,
        },
        version: count(queue.version)?,
        consecutive_errors: count(u64::from(queue.consecutive_errors))?,
        last_error: match &queue.last_error {
            Some(error) => Some(text(error)?),
            None => None,
        },
        claimed: queue.claim_generation.is_some(),
        claim_generation: match queue.claim_generation {
            Some(generation) => Some(count(generation)?),
            None => None,
        },
        claim_expires_at_ms: match queue.claim_expires_at_ms {
            Some(ms) => Some(at(ms)?),
            None => None,
        },
    })
}

/// The `resource.get` view of one resource (`None`: a stored value does
/// not fit the view's schema).
fn resource_view(
    stored: &StoredResource,
    queue: Option<&QueueRow>,
    effects: &[store::StoredEffect],
    children: &[ChildRequest],
    events: &[store::StoredEvent],
) -> Option<ResourceView> {
    let record = &stored.record;
    Some(ResourceView {
        controller: text(&record.controller)?,
        key: text(&record.key)?,
        uid: text(&record.uid)?,
        resource_version: Revision::new(record.resource_version)?,
        generation: Revision::new(record.generation)?,
        spec: record.spec.clone(),
        status: status_view(&record.status)?,
        deletion_requested_at_ms: match record.deletion_requested_at_ms {
            Some(ms) => Some(at(ms)?),
            None => None,
        },
        finalizers: ResourceFinalizerNames::new(
            record
                .finalizers
                .iter()
                .map(|name| text(name))
                .collect::<Option<Vec<_>>>()?,
        )
        .ok()?,
        created_at_ms: at(stored.created_at_ms)?,
        updated_at_ms: at(record.updated_at_ms)?,
        queue: match queue {
            Some(row) => Some(queue_view(row)?),
            None => None,
        },
        effects: ResourceEffectViews::new(effects.iter().map(effect_view).collect::<Option<_>>()?)
            .ok()?,
        child_workflows: ResourceChildWorkflowViews::new(
            children.iter().map(child_view).collect::<Option<_>>()?,
        )
        .ok()?,
        events: ResourceEventViews::new(events.iter().map(event_view).collect::<Option<_>>()?)
            .ok()?,
    })
}

fn list_row(row: &store::ListedResource) -> Option<ResourceListRow> {
    Some(ResourceListRow {
        controller: text(&row.controller)?,
        key: text(&row.key)?,
        resource_version: Revision::new(row.resource_version)?,
        generation: Revision::new(row.generation)?,
        observed_generation: count(row.status.observed_generation)?,
        ready: row
            .status
            .conditions
            .iter()
            .find(|condition| condition.condition_type == "Ready")
            .map(|condition| list_ready(condition.status)),
        deleting: row.deletion_requested_at_ms.is_some(),
        last_error: match &row.last_error {
            Some(error) => Some(text(error)?),
            None => None,
        },
        consecutive_errors: count(u64::from(row.consecutive_errors))?,
        updated_at_ms: at(row.updated_at_ms)?,
    })
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
            Ok(Some(resource_view(
                &stored,
                queue.as_ref(),
                &effects,
                &children,
                &events,
            )))
        })
        .await;
    match read {
        Ok(Some(view)) => match view {
            Some(view) => response(
                &request.request_id,
                "resource.get",
                "accepted",
                None,
                Some(receipt_value(&view)),
                None,
            ),
            None => refusal(
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
    let view = rows
        .iter()
        .map(list_row)
        .collect::<Option<Vec<_>>>()
        .and_then(|rows| ResourceListRows::new(rows).ok())
        .map(|resources| ResourceListView { resources });
    match view {
        Some(view) => response(
            &request.request_id,
            "resource.list",
            "accepted",
            None,
            Some(receipt_value(&view)),
            None,
        ),
        None => refusal(
            request,
            "rejected",
            ErrorCode::Internal,
            "the resource list cannot be shown; report it with `pi-workflows resources --json`",
        ),
    }
}
