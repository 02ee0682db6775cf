//! A controller's child workflow runs (`ctx.workflows.ensure`): one request
//! per resource and stable request key, immutable attempts, each attempt's
//! run id reserved before the scheduler starts it (CONTROLLERS, "Child
//! workflows").
//!
//! Invariants:
//! - A request is named by its resource and request key; its workflow and
//!   input fingerprint never change (another one under the same key is
//!   [`ChildRejection::RequestConflict`]: a changed input needs a new key).
//! - Repeated reconciles find the same request: a running, waiting,
//!   succeeded or failed attempt is returned as it is, never started again.
//! - A new attempt starts only for a new request or an interrupted one; its
//!   attempt number grows by one and its run id is saved with the request
//!   before the run exists ([`Ensured::Start`]), so recovery always finds
//!   the run row of an attempt.
//! - A child run's end is applied only to the attempt that owns that run id
//!   ([`on_run_ended`]); it enqueues the parent resource. A stopped worker
//!   never fails a child by itself: an abandoned running attempt becomes
//!   `interrupted`, and the next reconcile starts a new attempt.

use crate::ids::{Digest, RunId};
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// Where a child request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ChildState {
    /// The attempt's run is reserved or running.
    Running,
    /// The run waits for a person (a checkpoint or a decision).
    Waiting,
    Succeeded,
    Failed,
    /// The attempt's run was abandoned (cancelled by a stop, or lost); the
    /// next reconcile starts a new attempt.
    Interrupted,
}

/// One `workflow_requests` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildRequest {
    pub resource_uid: String,
    pub request_key: String,
    pub workflow: String,
    pub input_fingerprint: Digest,
    /// From 1; grows by one per attempt.
    pub attempt: u32,
    /// The current attempt's run id, saved before the run is started.
    pub run_id: RunId,
    pub state: ChildState,
}

/// What `ctx.workflows.ensure` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildAsk<'a> {
    pub resource_uid: &'a str,
    pub request_key: &'a str,
    pub workflow: &'a str,
    pub input_fingerprint: Digest,
}

/// Why `ensure` is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChildRejection {
    /// The key exists with another workflow or input.
    RequestConflict,
    /// An empty or over-long request key.
    BadKey,
    /// A run end for a run that is not the request's current attempt.
    StaleRun,
}

/// What `ensure` decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ensured {
    /// Save this request (its new attempt and run id) and start the run,
    /// in that order.
    Start(ChildRequest),
    /// Return the request as it is.
    Existing(ChildRequest),
}

/// The longest request key, in bytes.
pub const MAX_REQUEST_KEY_BYTES: usize = 512;

/// `ctx.workflows.ensure`: `new_run_id` is the id the shell drew for a new
/// attempt (used only when one starts).
pub fn ensure(
    existing: Option<&ChildRequest>,
    ask: &ChildAsk<'_>,
    new_run_id: &RunId,
) -> Result<Ensured, ChildRejection> {
    if ask.request_key.is_empty() || ask.request_key.len() > MAX_REQUEST_KEY_BYTES {
        return Err(ChildRejection::BadKey);
    }
    let Some(existing) = existing else {
        return Ok(Ensured::Start(ChildRequest {
            resource_uid: ask.resource_uid.into(),
            request_key: ask.request_key.into(),
            workflow: ask.workflow.into(),
            input_fingerprint: ask.input_fingerprint,
            attempt: 1,
            run_id: new_run_id.clone(),
            state: ChildState::Running,
        }));
    };
    if existing.workflow != ask.workflow || existing.input_fingerprint != ask.input_fingerprint {
        return Err(ChildRejection::RequestConflict);
    }
    Ok(match existing.state {
        ChildState::Interrupted => Ensured::Start(ChildRequest {
            attempt: existing.attempt + 1,
            run_id: new_run_id.clone(),
            state: ChildState::Running,
            ..existing.clone()
        }),
        ChildState::Running | ChildState::Waiting | ChildState::Succeeded | ChildState::Failed => {
            Ensured::Existing(existing.clone())
        }
    })
}

/// How a child's run stands, as the run's record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChildRunEnd {
    Completed,
    Failed,
    Waiting,
    /// Cancelled or abandoned without a result of its own.
    Interrupted,
}

/// Applies a child run's end to its request: the new record (and the shell
/// enqueues the parent resource in the same transaction).
pub fn on_run_ended(
    request: &ChildRequest,
    run_id: &RunId,
    end: ChildRunEnd,
) -> Result<ChildRequest, ChildRejection> {
    if request.run_id != *run_id {
        return Err(ChildRejection::StaleRun);
    }
    let state = match end {
        ChildRunEnd::Completed => ChildState::Succeeded,
        ChildRunEnd::Failed => ChildState::Failed,
        ChildRunEnd::Waiting => ChildState::Waiting,
        ChildRunEnd::Interrupted => ChildState::Interrupted,
    };
    Ok(ChildRequest {
        state,
        ..request.clone()
    })
}

#[cfg(test)]
mod tests;
