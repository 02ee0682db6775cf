//! The server's side of a reconcile pass's controller.v1 channel: one
//! handler per `ControllerChildMessage` kind.
//!
//! Invariants:
//! - Every handler runs one job through the one transaction helper
//!   (`shell::transact`): load the facts, fence the message by the pass's
//!   live claim (`kernel::reconcile::check_claim`), call the kernel
//!   (`controller_effect::ensure/observed/applied`, `resource::propose`,
//!   `reconcile::finish`), write, commit, and only then is the reply sent.
//!   A refusal writes nothing of the kernel's and answers `rejected` with a
//!   closed [`Refusal`].
//! - A message from a pass whose claim is lost changes nothing and ends the
//!   pass (`claimLost`).
//! - `finished` and `failed` finish the queue row under the claim in the
//!   same transaction as the status write, so a pass's result and the row's
//!   next availability commit together. A conflicting status write
//!   (`Proposed::Conflict`) requeues at once without counting an error.
//! - At most one effect per pass: the pass remembers the key the kernel
//!   accepted, and observe/settle name only that key.
//! - Matches over the message kinds and refusals are exhaustive. No spec,
//!   status or effect request content reaches an event detail or a log line.

use crate::context::Context;
use crate::context::reconciles::Pass;
use crate::store::resources::{self, ResourceEvent, ResourceEventKind, StoredEffect};
use crate::store::{Commit, StoreError};
use kernel::controller_effect::{
    self, ApplyResult, ControllerEffect, EffectEnsureRejection, Ensure, EnsureRequest, Observed,
};
use kernel::reconcile::{self, Finished, defaults};
use kernel::resource::{ConditionPatch, ConditionStatus, Proposed, ResourceRejection, StatusPatch};
use protocol::ErrorCode;
use protocol::generated::constrained::Sequence;
use protocol::generated::types::{
    ControllerApplyResult, ControllerChildMessage, ControllerEffectAction, ControllerEffectView,
    ControllerFinishOutcome, ControllerObservation, ControllerReconcileResult,
    ControllerServerMessage, ControllerServerMessageOutcome, ResourceStatusPatch,
};
use rusqlite::Connection;
use serde_json::Value;
use std::sync::Arc;

/// How a handled message ends the pass, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `finished` or `failed` finished the row.
    Finished,
    /// The claim is lost: nothing more is written for this pass.
    ClaimLost,
    /// The message cannot be part of a pass: the pass fails.
    Failed(&'static str),
}

/// The reply to send, and whether the pass ends with it.
#[derive(Debug)]
pub struct Handled {
    pub reply: ControllerServerMessage,
    pub end: Option<End>,
}

/// Why a message is refused (each maps to one wire code and sentence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    ClaimLost,
    Effect(EffectEnsureRejection),
    /// Observe or settle of a key this pass did not ensure, or of a missing record.
    UnknownEffect,
    BadFingerprint,
    Status(ResourceRejection),
    /// `requeueAfter` without a positive `afterMs`.
    BadRequeue,
    /// A resolve-mode message in a reconcile pass.
    NotReconcile,
    /// `workflow.ensure`: child workflows are not served yet.
    ChildWorkflowsUnavailable,
    /// The store could not run the job.
    Store,
}

impl Refusal {
    fn wire(self) -> (ErrorCode, &'static str) {
        match self {
            Self::ClaimLost => (
                ErrorCode::ClaimLost,
                "this reconcile pass lost its claim; another pass owns the resource",
            ),
            Self::Effect(EffectEnsureRejection::RequestConflict) => (
                ErrorCode::Conflict,
                "the effect key exists with another kind, request or generation; use a new key",
            ),
            Self::Effect(EffectEnsureRejection::SecondEffectInPass) => (
                ErrorCode::Conflict,
                "a reconcile pass ensures at most one effect; requeue and ensure the next one in the next pass",
            ),
            Self::Effect(EffectEnsureRejection::BadKey) => (
                ErrorCode::SchemaInvalid,
                "an effect key and kind are 1 to 512 bytes",
            ),
            Self::UnknownEffect => (
                ErrorCode::NotFound,
                "this pass did not ensure an effect with this key",
            ),
            Self::BadFingerprint => (
                ErrorCode::SchemaInvalid,
                "the request fingerprint is not sha256:<64 hex>",
            ),
            Self::Status(ResourceRejection::TooLarge) => (
                ErrorCode::FrameTooLarge,
                "the status patch is over 1 MiB; report less",
            ),
            Self::Status(
                ResourceRejection::BadStatus
                | ResourceRejection::BadControllerName
                | ResourceRejection::BadKey
                | ResourceRejection::Deleting,
            ) => (
                ErrorCode::SchemaInvalid,
                "the status patch has a malformed condition or finalizer, or too many",
            ),
            Self::Status(ResourceRejection::NotFound) => {
                (ErrorCode::NotFound, "the resource no longer exists")
            }
            Self::BadRequeue => (
                ErrorCode::SchemaInvalid,
                "requeueAfter needs a positive afterMs",
            ),
            Self::NotReconcile => (
                ErrorCode::SchemaInvalid,
                "a resolve message in a reconcile pass",
            ),
            Self::ChildWorkflowsUnavailable => (
                ErrorCode::Unavailable,
                "child workflows are not available on this server yet",
            ),
            Self::Store => (
                ErrorCode::Internal,
                "the server could not store this; the pass is retried",
            ),
        }
    }
}

/// The `requestId` of a child message.
pub fn request_id(message: &ControllerChildMessage) -> u64 {
    match message {
        ControllerChildMessage::Resolved { request_id, .. }
        | ControllerChildMessage::ResolveFailed { request_id, .. }
        | ControllerChildMessage::EffectEnsure { request_id, .. }
        | ControllerChildMessage::EffectObserved { request_id, .. }
        | ControllerChildMessage::EffectSettled { request_id, .. }
        | ControllerChildMessage::WorkflowEnsure { request_id, .. }
        | ControllerChildMessage::Finished { request_id, .. }
        | ControllerChildMessage::Failed { request_id, .. } => request_id.get(),
    }
}

fn reply(request_id: u64) -> ControllerServerMessage {
    ControllerServerMessage {
        kind: "reply".into(),
        request_id: Sequence::new(request_id).unwrap_or(Sequence::new(0).expect("zero")),
        outcome: ControllerServerMessageOutcome::Accepted,
        code: None,
        message: None,
        effect: None,
        effect_action: None,
        finish_outcome: None,
        workflow_request: None,
    }
}

fn refused(request_id: u64, refusal: Refusal) -> Handled {
    let (code, message) = refusal.wire();
    let mut reply = reply(request_id);
    reply.outcome = ControllerServerMessageOutcome::Rejected;
    reply.code = Some(code);
    reply.message = message.parse().ok();
    let end = match refusal {
        Refusal::ClaimLost => Some(End::ClaimLost),
        Refusal::NotReconcile => Some(End::Failed("a resolve message in a reconcile pass")),
        Refusal::Effect(_)
        | Refusal::UnknownEffect
        | Refusal::BadFingerprint
        | Refusal::Status(_)
        | Refusal::BadRequeue
        | Refusal::ChildWorkflowsUnavailable
        | Refusal::Store => None,
    };
    Handled { reply, end }
}

/// Handles one message of `pass`'s child.
pub async fn handle(
    app: &Arc<Context>,
    pass: &Arc<Pass>,
    message: ControllerChildMessage,
) -> Handled {
    let id = request_id(&message);
    match message {
        ControllerChildMessage::Resolved { .. } | ControllerChildMessage::ResolveFailed { .. } => {
            refused(id, Refusal::NotReconcile)
        }
        ControllerChildMessage::EffectEnsure {
            effect_kind,
            key,
            request_fingerprint,
            ..
        } => {
            effect_ensure(
                app,
                pass,
                id,
                key.to_string(),
                effect_kind.to_string(),
                &request_fingerprint,
            )
            .await
        }
        ControllerChildMessage::EffectObserved {
            key, observation, ..
        } => {
            let verdict = match observation {
                ControllerObservation::Applied => Observed::Applied,
                ControllerObservation::NotApplied => Observed::NotApplied,
                ControllerObservation::Indeterminate => Observed::Indeterminate,
            };
            effect_observed(app, pass, id, key.to_string(), verdict).await
        }
        ControllerChildMessage::EffectSettled {
            apply_result,
            error,
            external_ref,
            key,
            ..
        } => {
            let result = match apply_result {
                ControllerApplyResult::Applied => ApplyResult::Applied,
                ControllerApplyResult::Rejected => ApplyResult::Rejected,
                ControllerApplyResult::Indeterminate => ApplyResult::Indeterminate,
            };
            effect_settled(
                app,
                pass,
                id,
                key.to_string(),
                result,
                external_ref.map(|text| text.to_string()),
                error.map(|text| text.to_string()),
            )
            .await
        }
        ControllerChildMessage::WorkflowEnsure { .. } => {
            refused(id, Refusal::ChildWorkflowsUnavailable)
        }
        ControllerChildMessage::Finished {
            after_ms,
            patch,
            result,
            ..
        } => finished(app, pass, id, result, after_ms.map(|ms| ms.get()), patch).await,
        ControllerChildMessage::Failed { message, .. } => {
            let error = message.to_string();
            finish_row(
                app,
                pass,
                Finished::Failed {
                    error,
                    jitter_permille: jitter(),
                },
                ResourceEventKind::ReconcileFailed,
                Some("the reconcile failed"),
            )
            .await;
            Handled {
                reply: reply(id),
                end: Some(End::Finished),
            }
        }
    }
}

/// Runs `job` after fencing it by the pass's live claim.
async fn fenced<J>(app: &Arc<Context>, pass: &Arc<Pass>, id: u64, job: J) -> Handled
where
    J: FnOnce(&Connection, u64) -> rusqlite::Result<Result<Handled, Refusal>> + Send + 'static,
{
    let uid = pass.uid.clone();
    let generation = pass.generation;
    let token_hash = pass.token_hash;
    let done: Result<Result<Handled, Refusal>, StoreError> =
        crate::shell::transact(app, move |connection, now_ms| {
            let live = resources::load_queue(connection, &uid)?.is_some_and(|row| {
                reconcile::check_claim(&row, generation, &token_hash, now_ms).is_ok()
            });
            if !live {
                return Ok(Commit::Discard((Err(Refusal::ClaimLost), Vec::new())));
            }
            Ok(match job(connection, now_ms)? {
                Ok(handled) => Commit::Keep((Ok(handled), Vec::new())),
                Err(refusal) => Commit::Discard((Err(refusal), Vec::new())),
            })
        })
        .await;
    match done {
        Ok(Ok(handled)) => handled,
        Ok(Err(refusal)) => refused(id, refusal),
        Err(_) => refused(id, Refusal::Store),
    }
}

fn effect_view(stored: &StoredEffect) -> Option<ControllerEffectView> {
    use protocol::generated::types::ControllerEffectState as WireState;
    let effect = &stored.effect;
    Some(ControllerEffectView {
        error: match &stored.error {
            Some(error) => Some(error.parse().ok()?),
            None => None,
        },
        external_ref: match &stored.external_ref {
            Some(external_ref) => Some(external_ref.parse().ok()?),
            None => None,
        },
        key: effect.key.parse().ok()?,
        kind: effect.kind.parse().ok()?,
        state: match effect.state {
            controller_effect::ControllerEffectState::Pending => WireState::Pending,
            controller_effect::ControllerEffectState::Applied => WireState::Applied,
            controller_effect::ControllerEffectState::Rejected => WireState::Rejected,
            controller_effect::ControllerEffectState::Indeterminate => WireState::Indeterminate,
        },
    })
}

fn effect_reply(id: u64, action: ControllerEffectAction, stored: &StoredEffect) -> Handled {
    let mut message = reply(id);
    message.effect_action = Some(action);
    message.effect = effect_view(stored);
    Handled {
        reply: message,
        end: None,
    }
}

fn event(
    connection: &Connection,
    uid: &str,
    kind: ResourceEventKind,
    detail: Option<&str>,
    now_ms: u64,
) -> rusqlite::Result<()> {
    if let Some(resource) = resources::load_by_uid(connection, uid)? {
        let mut event = ResourceEvent::of(&resource.record, kind, now_ms);
        if let Some(detail) = detail {
            event = event.with_detail(detail);
        }
        resources::append_event(connection, &event)?;
    }
    Ok(())
}

fn stored(effect: ControllerEffect, before: Option<&StoredEffect>) -> StoredEffect {
    StoredEffect {
        effect,
        external_ref: before.and_then(|b| b.external_ref.clone()),
        error: before.and_then(|b| b.error.clone()),
    }
}

async fn effect_ensure(
    app: &Arc<Context>,
    pass: &Arc<Pass>,
    id: u64,
    key: String,
    kind: String,
    fingerprint: &str,
) -> Handled {
    let Some(fingerprint) = crate::ids::parse_digest(Some(fingerprint)) else {
        return refused(id, Refusal::BadFingerprint);
    };
    let uid = pass.uid.clone();
    let generation = pass.resource_generation;
    let pass_effect = pass.effect_key.lock().expect("pass lock").clone();
    let job_key = key.clone();
    let handled = fenced(app, pass, id, move |connection, now_ms| {
        let existing = resources::load_effect(connection, &uid, &job_key)?;
        let request = EnsureRequest {
            resource_uid: &uid,
            key: &job_key,
            kind: &kind,
            request_fingerprint: fingerprint,
            generation,
        };
        let decided = controller_effect::ensure(
            existing.as_ref().map(|stored| &stored.effect),
            &request,
            pass_effect.as_deref(),
            now_ms,
        );
        Ok(match decided {
            Err(rejection) => Err(Refusal::Effect(rejection)),
            Ok(Ensure::Apply(effect)) => {
                match &existing {
                    None => resources::insert_effect(connection, &effect)?,
                    Some(_) => resources::update_effect(connection, &effect, None, None)?,
                }
                event(
                    connection,
                    &uid,
                    ResourceEventKind::EffectReserved,
                    Some("effect reserved"),
                    now_ms,
                )?;
                Ok(effect_reply(
                    id,
                    ControllerEffectAction::Apply,
                    &stored(effect, existing.as_ref()),
                ))
            }
            Ok(Ensure::Observe(effect)) => Ok(effect_reply(
                id,
                ControllerEffectAction::Observe,
                &stored(effect, existing.as_ref()),
            )),
            Ok(Ensure::Done(effect)) => Ok(effect_reply(
                id,
                ControllerEffectAction::Done,
                &stored(effect, existing.as_ref()),
            )),
        })
    })
    .await;
    if handled.reply.outcome == ControllerServerMessageOutcome::Accepted {
        *pass.effect_key.lock().expect("pass lock") = Some(key);
    }
    handled
}

/// The effect this pass ensured under `key`, if it is that one.
fn pass_effect(pass: &Pass, key: &str) -> bool {
    pass.effect_key.lock().expect("pass lock").as_deref() == Some(key)
}

async fn effect_observed(
    app: &Arc<Context>,
    pass: &Arc<Pass>,
    id: u64,
    key: String,
    verdict: Observed,
) -> Handled {
    if !pass_effect(pass, &key) {
        return refused(id, Refusal::UnknownEffect);
    }
    let uid = pass.uid.clone();
    fenced(app, pass, id, move |connection, now_ms| {
        let Some(existing) = resources::load_effect(connection, &uid, &key)? else {
            return Ok(Err(Refusal::UnknownEffect));
        };
        let (effect, apply) = controller_effect::observed(&existing.effect, verdict, now_ms);
        resources::update_effect(connection, &effect, None, None)?;
        let detail = match verdict {
            Observed::Applied => "observed applied",
            Observed::NotApplied => "observed not applied",
            Observed::Indeterminate => "observed indeterminate",
        };
        event(
            connection,
            &uid,
            ResourceEventKind::EffectRecovered,
            Some(detail),
            now_ms,
        )?;
        let action = if apply {
            ControllerEffectAction::Apply
        } else {
            ControllerEffectAction::Done
        };
        Ok(Ok(effect_reply(
            id,
            action,
            &stored(effect, Some(&existing)),
        )))
    })
    .await
}

async fn effect_settled(
    app: &Arc<Context>,
    pass: &Arc<Pass>,
    id: u64,
    key: String,
    result: ApplyResult,
    external_ref: Option<String>,
    error: Option<String>,
) -> Handled {
    if !pass_effect(pass, &key) {
        return refused(id, Refusal::UnknownEffect);
    }
    let uid = pass.uid.clone();
    fenced(app, pass, id, move |connection, now_ms| {
        let Some(existing) = resources::load_effect(connection, &uid, &key)? else {
            return Ok(Err(Refusal::UnknownEffect));
        };
        let effect = controller_effect::applied(&existing.effect, result, now_ms);
        resources::update_effect(
            connection,
            &effect,
            external_ref.as_deref(),
            error.as_deref(),
        )?;
        event(
            connection,
            &uid,
            ResourceEventKind::EffectSettled,
            Some("effect settled"),
            now_ms,
        )?;
        let settled = StoredEffect {
            effect,
            external_ref: external_ref.or(existing.external_ref),
            error: error.or(existing.error),
        };
        Ok(Ok(effect_reply(id, ControllerEffectAction::Done, &settled)))
    })
    .await
}

/// The wire patch as the kernel's, and its size in canonical JSON bytes.
fn status_patch(patch: &ResourceStatusPatch) -> (StatusPatch, usize) {
    let bytes = protocol::canonicalize_typed(patch).map_or(usize::MAX, |bytes| bytes.len());
    let conditions = patch.conditions.as_ref().map(|conditions| {
        conditions
            .as_slice()
            .iter()
            .map(|condition| ConditionPatch {
                condition_type: condition.type_.to_string(),
                status: match condition.status {
                    protocol::generated::types::ResourceConditionStatus::True => {
                        ConditionStatus::True
                    }
                    protocol::generated::types::ResourceConditionStatus::False => {
                        ConditionStatus::False
                    }
                    protocol::generated::types::ResourceConditionStatus::Unknown => {
                        ConditionStatus::Unknown
                    }
                },
                reason: condition.reason.to_string(),
                message: condition
                    .message
                    .as_ref()
                    .map(|message| message.to_string()),
            })
            .collect()
    });
    let kernel = StatusPatch {
        controller_status: patch
            .controller_status
            .as_ref()
            .map(|boxed| boxed.value.clone()),
        conditions,
        workflow_run: patch.workflow_run.as_ref().map(|boxed| match &boxed.value {
            Value::Null => None,
            value => Some(value.clone()),
        }),
        finalizers: patch.finalizers.as_ref().map(|names| {
            names
                .as_slice()
                .iter()
                .map(|name| name.to_string())
                .collect()
        }),
    };
    (kernel, bytes)
}

async fn finished(
    app: &Arc<Context>,
    pass: &Arc<Pass>,
    id: u64,
    result: ControllerReconcileResult,
    after_ms: Option<u64>,
    patch: ResourceStatusPatch,
) -> Handled {
    let finish = match (result, after_ms) {
        (ControllerReconcileResult::Settled, _) => Finished::Settled,
        (ControllerReconcileResult::Requeue, _) => Finished::Requeue,
        (ControllerReconcileResult::RequeueAfter, Some(ms)) if ms > 0 => Finished::RequeueAfter(ms),
        (ControllerReconcileResult::RequeueAfter, _) => {
            let handled = refused(id, Refusal::BadRequeue);
            fail_pass(
                app,
                pass,
                "the reconcile returned requeueAfter without a delay",
            )
            .await;
            return Handled {
                end: Some(End::Finished),
                ..handled
            };
        }
    };
    let settled = matches!(finish, Finished::Settled);
    let (patch, patch_bytes) = status_patch(&patch);
    let uid = pass.uid.clone();
    let generation = pass.generation;
    let token_hash = pass.token_hash;
    let read_version = pass.read_version;
    let handled = fenced(app, pass, id, move |connection, now_ms| {
        let Some(current) = resources::load_by_uid(connection, &uid)? else {
            return Ok(Err(Refusal::Status(ResourceRejection::NotFound)));
        };
        let proposed = kernel::resource::propose(
            &current.record,
            read_version,
            &patch,
            patch_bytes,
            settled,
            now_ms,
        );
        let (outcome, finish, kind) = match proposed {
            Err(rejection) => return Ok(Err(Refusal::Status(rejection))),
            Ok(Proposed::Deleted) => {
                let event =
                    ResourceEvent::of(&current.record, ResourceEventKind::ResourceDeleted, now_ms);
                resources::delete(connection, &uid)?;
                resources::append_event(connection, &event)?;
                let mut message = reply(id);
                message.finish_outcome = Some(ControllerFinishOutcome::Committed);
                return Ok(Ok(Handled {
                    reply: message,
                    end: Some(End::Finished),
                }));
            }
            Ok(Proposed::Written(record)) => {
                resources::update(connection, &record)?;
                let kind = if settled {
                    ResourceEventKind::ReconcileSettled
                } else {
                    ResourceEventKind::ReconcileRequeued
                };
                (ControllerFinishOutcome::Committed, finish, kind)
            }
            Ok(Proposed::Conflict) => (
                ControllerFinishOutcome::Conflict,
                Finished::Conflict,
                ResourceEventKind::ReconcileConflict,
            ),
        };
        match resources::finish(connection, &uid, generation, &token_hash, &finish, now_ms)? {
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return Ok(Err(Refusal::ClaimLost)),
        }
        event(connection, &uid, kind, None, now_ms)?;
        let mut message = reply(id);
        message.finish_outcome = Some(outcome);
        Ok(Ok(Handled {
            reply: message,
            end: Some(End::Finished),
        }))
    })
    .await;
    // A refused status write is a failed pass (backoff); a lost claim ends it.
    if handled.end.is_none() {
        fail_pass(app, pass, "the reconcile proposed an invalid status").await;
        return Handled {
            end: Some(End::Finished),
            ..handled
        };
    }
    if handled.end == Some(End::ClaimLost) {
        let mut handled = handled;
        handled.reply.finish_outcome = Some(ControllerFinishOutcome::ClaimLost);
        return handled;
    }
    handled
}

async fn fail_pass(app: &Arc<Context>, pass: &Arc<Pass>, error: &'static str) {
    finish_row(
        app,
        pass,
        Finished::Failed {
            error: error.into(),
            jitter_permille: jitter(),
        },
        ResourceEventKind::ReconcileFailed,
        Some(error),
    )
    .await;
}

/// Finishes the pass's row under its claim (`kernel::reconcile::finish`)
/// with an event; nothing when the claim is lost.
pub async fn finish_row(
    app: &Arc<Context>,
    pass: &Arc<Pass>,
    finished: Finished,
    kind: ResourceEventKind,
    detail: Option<&'static str>,
) {
    let uid = pass.uid.clone();
    let generation = pass.generation;
    let token_hash = pass.token_hash;
    let _ = crate::shell::transact(app, move |connection, now_ms| {
        match resources::finish(connection, &uid, generation, &token_hash, &finished, now_ms)? {
            Some(Ok(_)) => {
                event(connection, &uid, kind, detail, now_ms)?;
                Ok(Commit::Keep(((), Vec::new())))
            }
            Some(Err(_)) | None => Ok(Commit::Discard(((), Vec::new()))),
        }
    })
    .await;
}

/// Jitter for a backoff, in `[-JITTER_PERMILLE, JITTER_PERMILLE]`.
pub fn jitter() -> i16 {
    let [a, b] = crate::ids::random_bytes::<2>();
    let span = 2 * i32::from(defaults::JITTER_PERMILLE) + 1;
    (i32::from(u16::from_le_bytes([a, b])) % span - i32::from(defaults::JITTER_PERMILLE)) as i16
}

/// Renews the pass's claim; `false` when it is lost.
pub async fn renew(app: &Arc<Context>, pass: &Arc<Pass>) -> bool {
    let uid = pass.uid.clone();
    let generation = pass.generation;
    let token_hash = pass.token_hash;
    crate::shell::transact(app, move |connection, now_ms| {
        Ok(
            match resources::renew(
                connection,
                &uid,
                generation,
                &token_hash,
                defaults::LEASE_MS,
                now_ms,
            )? {
                Some(Ok(_)) => Commit::Keep((true, Vec::new())),
                Some(Err(_)) | None => Commit::Discard((false, Vec::new())),
            },
        )
    })
    .await
    .unwrap_or(false)
}
