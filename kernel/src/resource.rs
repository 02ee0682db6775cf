//! Managed resources: the desired state a controller converges (CONTROLLERS),
//! and every change to a resource row.
//!
//! A resource is named by its controller and key. Its `spec` is what a
//! person applied, its `status` what the controller last reported, and its
//! `resource_version` the compare-and-swap token of the row.
//!
//! Invariants:
//! - `resource_version` grows by one on every write of the row and on no
//!   read; `generation` grows by one only when the spec's canonical digest
//!   changes. Re-applying the same spec writes nothing ([`Applied::Unchanged`]).
//! - A status change proposed by a reconcile commits only against the
//!   `resource_version` that reconcile read ([`propose`]): anything written
//!   in between makes it a [`Proposed::Conflict`] that changes nothing.
//! - Conditions merge by type; a condition's `last_transition_at_ms` changes
//!   only when its status value changes. `observed_generation` is the
//!   generation the reconcile read.
//! - Deletion is a request ([`request_deletion`]): the row goes only when a
//!   reconcile settles a resource marked for deletion that holds no
//!   finalizer. A resource marked for deletion accepts no new spec.
//! - Names and sizes are bounded ([`check_name`], [`MAX_KEY_BYTES`],
//!   [`MAX_DOCUMENT_BYTES`]); a bad value is a closed rejection that changes
//!   nothing.

use crate::ids::Digest;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The longest resource key, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// The largest spec or status document, in bytes of canonical JSON.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;
/// The most conditions a status holds.
pub const MAX_CONDITIONS: usize = 64;
/// The most finalizers a resource holds.
pub const MAX_FINALIZERS: usize = 32;
/// The longest condition type, reason or finalizer name, in bytes.
pub const MAX_LABEL_BYTES: usize = 256;
/// The longest condition message, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 8192;

/// Why a resource change is refused. Nothing changes on a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResourceRejection {
    /// The controller name is not `^[a-z][a-z0-9-]*$` (at most 64 bytes).
    BadControllerName,
    /// The key is empty, longer than [`MAX_KEY_BYTES`] or has a control character.
    BadKey,
    /// A spec or status document is over [`MAX_DOCUMENT_BYTES`].
    TooLarge,
    /// A condition or finalizer is malformed or there are too many.
    BadStatus,
    /// The resource is marked for deletion and accepts no new spec.
    Deleting,
    /// No resource with this controller and key.
    NotFound,
}

/// A condition's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// One condition of a status (`Ready`, `ChecksPassed`, …).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub condition_type: String,
    pub status: ConditionStatus,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub observed_generation: u64,
    pub last_transition_at_ms: u64,
}

/// A condition as a reconcile proposes it (the kernel stamps the rest).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionPatch {
    #[serde(rename = "type")]
    pub condition_type: String,
    pub status: ConditionStatus,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What a controller reports about a resource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    pub observed_generation: u64,
    pub conditions: Vec<Condition>,
    /// The controller's own document (from `initialStatus(spec)`, then patches).
    pub controller_status: Value,
    /// The child run the controller last pointed at, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_run: Option<Value>,
}

/// One `resources` row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRecord {
    pub uid: String,
    pub controller: String,
    pub key: String,
    pub resource_version: u64,
    pub generation: u64,
    pub spec: Value,
    /// Digest of the spec's canonical JSON (the shell computes it).
    pub spec_digest: Digest,
    pub status: ResourceStatus,
    pub deletion_requested_at_ms: Option<u64>,
    pub finalizers: Vec<String>,
    /// Digest of the controller source the spec was accepted under.
    pub source_digest: Digest,
    pub updated_at_ms: u64,
}

/// `resource.apply` as the shell hands it over, after the source resolver
/// child resolved the controller (its `initialStatus(spec)` and source
/// digest) and the shell checked the digest still matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyInput<'a> {
    /// The uid a new resource gets (an argument: the kernel draws no ids).
    pub new_uid: &'a str,
    pub controller: &'a str,
    pub key: &'a str,
    pub spec: &'a Value,
    pub spec_digest: Digest,
    /// Bytes of the spec's canonical JSON.
    pub spec_bytes: usize,
    /// `initialStatus(spec)`, used only for a new resource.
    pub initial_status: &'a Value,
    pub source_digest: Digest,
}

/// What `resource.apply` decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A new resource, to insert and enqueue.
    Created(ResourceRecord),
    /// A changed spec: the new row (generation and version advanced), to
    /// write and enqueue.
    Updated(ResourceRecord),
    /// The same spec: nothing to write.
    Unchanged,
}

/// Checks a controller name: `^[a-z][a-z0-9-]*$`, at most 64 bytes.
pub fn check_name(name: &str) -> Result<(), ResourceRejection> {
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_lowercase());
    if first_ok
        && name.len() <= 64
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Ok(())
    } else {
        Err(ResourceRejection::BadControllerName)
    }
}

/// Checks a resource key: 1 to [`MAX_KEY_BYTES`] bytes, no control character.
pub fn check_key(key: &str) -> Result<(), ResourceRejection> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
        Err(ResourceRejection::BadKey)
    } else {
        Ok(())
    }
}

fn check_label(label: &str) -> bool {
    !label.is_empty() && label.len() <= MAX_LABEL_BYTES && !label.chars().any(char::is_control)
}

/// Applies a spec: creates the resource, advances its generation when the
/// spec changed, or changes nothing.
pub fn apply(
    existing: Option<&ResourceRecord>,
    input: &ApplyInput<'_>,
    now_ms: u64,
) -> Result<Applied, ResourceRejection> {
    check_name(input.controller)?;
    check_key(input.key)?;
    if input.spec_bytes > MAX_DOCUMENT_BYTES {
        return Err(ResourceRejection::TooLarge);
    }
    let Some(existing) = existing else {
        return Ok(Applied::Created(ResourceRecord {
            uid: input.new_uid.into(),
            controller: input.controller.into(),
            key: input.key.into(),
            resource_version: 1,
            generation: 1,
            spec: input.spec.clone(),
            spec_digest: input.spec_digest,
            status: ResourceStatus {
                observed_generation: 0,
                conditions: Vec::new(),
                controller_status: input.initial_status.clone(),
                workflow_run: None,
            },
            deletion_requested_at_ms: None,
            finalizers: Vec::new(),
            source_digest: input.source_digest,
            updated_at_ms: now_ms,
        }));
    };
    if existing.deletion_requested_at_ms.is_some() {
        return Err(ResourceRejection::Deleting);
    }
    if existing.spec_digest == input.spec_digest {
        return Ok(Applied::Unchanged);
    }
    let mut updated = existing.clone();
    updated.spec = input.spec.clone();
    updated.spec_digest = input.spec_digest;
    updated.source_digest = input.source_digest;
    updated.generation += 1;
    updated.resource_version += 1;
    updated.updated_at_ms = now_ms;
    Ok(Applied::Updated(updated))
}

/// Marks a resource for deletion. Repeating it changes nothing (`None`).
pub fn request_deletion(existing: &ResourceRecord, now_ms: u64) -> Option<ResourceRecord> {
    if existing.deletion_requested_at_ms.is_some() {
        return None;
    }
    let mut marked = existing.clone();
    marked.deletion_requested_at_ms = Some(now_ms);
    marked.resource_version += 1;
    marked.updated_at_ms = now_ms;
    Some(marked)
}

/// The status change a reconcile proposes (`settled(patch)`,
/// `requeue(patch)`, …). An absent field keeps its value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_status: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<ConditionPatch>>,
    /// `Some(None)` clears the child run; `None` keeps it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "serde_with_null"
    )]
    pub workflow_run: Option<Option<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalizers: Option<Vec<String>>,
}

/// `Option<Option<T>>` with an explicit `null` meaning "clear".
mod serde_with_null {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Option<Value>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(inner) => inner.serialize(serializer),
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<Value>>, D::Error> {
        Option::<Value>::deserialize(deserializer).map(Some)
    }
}

/// What a reconcile's proposal decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proposed {
    /// The new row, to write.
    Written(ResourceRecord),
    /// The resource was marked for deletion, the reconcile settled and no
    /// finalizer is left: delete the row.
    Deleted,
    /// Something wrote the row after the reconcile read it: nothing
    /// changes, the key is requeued at once.
    Conflict,
}

/// Proposes a reconcile's status change against the version it read.
/// `settled` is whether the reconcile settled (as opposed to requeued).
pub fn propose(
    current: &ResourceRecord,
    read_version: u64,
    patch: &StatusPatch,
    patch_bytes: usize,
    settled: bool,
    now_ms: u64,
) -> Result<Proposed, ResourceRejection> {
    if current.resource_version != read_version {
        return Ok(Proposed::Conflict);
    }
    if patch_bytes > MAX_DOCUMENT_BYTES {
        return Err(ResourceRejection::TooLarge);
    }
    let mut next = current.clone();
    if let Some(finalizers) = &patch.finalizers {
        if finalizers.len() > MAX_FINALIZERS || !finalizers.iter().all(|name| check_label(name)) {
            return Err(ResourceRejection::BadStatus);
        }
        let mut finalizers = finalizers.clone();
        finalizers.sort();
        finalizers.dedup();
        next.finalizers = finalizers;
    }
    if settled && next.deletion_requested_at_ms.is_some() && next.finalizers.is_empty() {
        return Ok(Proposed::Deleted);
    }
    if let Some(conditions) = &patch.conditions {
        next.status.conditions = merge_conditions(
            &current.status.conditions,
            conditions,
            current.generation,
            now_ms,
        )?;
    }
    if let Some(controller_status) = &patch.controller_status {
        next.status.controller_status = controller_status.clone();
    }
    if let Some(workflow_run) = &patch.workflow_run {
        next.status.workflow_run = workflow_run.clone();
    }
    next.status.observed_generation = current.generation;
    next.resource_version += 1;
    next.updated_at_ms = now_ms;
    Ok(Proposed::Written(next))
}

/// Merges proposed conditions into the current ones by type: a proposed
/// type replaces the current one (keeping its transition time when the
/// status value is the same), an unmentioned type stays, a new type is
/// added. The result is ordered by type.
pub fn merge_conditions(
    current: &[Condition],
    proposed: &[ConditionPatch],
    generation: u64,
    now_ms: u64,
) -> Result<Vec<Condition>, ResourceRejection> {
    let mut merged: Vec<Condition> = current.to_vec();
    for patch in proposed {
        let message_ok = patch
            .message
            .as_ref()
            .is_none_or(|message| message.len() <= MAX_MESSAGE_BYTES);
        if !check_label(&patch.condition_type) || !check_label(&patch.reason) || !message_ok {
            return Err(ResourceRejection::BadStatus);
        }
        let existing = merged
            .iter()
            .position(|condition| condition.condition_type == patch.condition_type);
        let last_transition_at_ms = match existing.map(|index| &merged[index]) {
            Some(old) if old.status == patch.status => old.last_transition_at_ms,
            _ => now_ms,
        };
        let condition = Condition {
            condition_type: patch.condition_type.clone(),
            status: patch.status,
            reason: patch.reason.clone(),
            message: patch.message.clone(),
            observed_generation: generation,
            last_transition_at_ms,
        };
        match existing {
            Some(index) => merged[index] = condition,
            None => merged.push(condition),
        }
    }
    if merged.len() > MAX_CONDITIONS {
        return Err(ResourceRejection::BadStatus);
    }
    merged.sort_by(|a, b| a.condition_type.cmp(&b.condition_type));
    Ok(merged)
}

/// The `Ready` condition's status, as lists show it.
pub fn ready(record: &ResourceRecord) -> Option<ConditionStatus> {
    record
        .status
        .conditions
        .iter()
        .find(|condition| condition.condition_type == "Ready")
        .map(|condition| condition.status)
}

#[cfg(test)]
mod tests;
