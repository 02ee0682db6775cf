//! Live settings (`settings.update`): a JSON object per scope (the user's,
//! and one per project), changed only by JSON merge patches (RFC 7396: an
//! object merges key by key, `null` deletes a key, any other value replaces
//! it), and the settings revisions a run saw when it started.
//!
//! Invariants:
//! - A scope's revision is its public change number: 0 before its first
//!   change, one more for each accepted patch that changed its value. A
//!   patch that leaves the value as it was is accepted with the current
//!   revision and records no change.
//! - A scope's value stays bounded: at most [`MAX_KEYS`] object keys
//!   (counted at every depth) and [`MAX_VALUE_BYTES`] bytes of JSON. A patch
//!   whose result would break a bound is refused and changes nothing.
//! - The project scope is keyed by the caller's project (its project id);
//!   the user scope names no project. A request that names the wrong one is
//!   refused.
//! - A run is bound to the revisions in effect when it was created; a
//!   checkpoint continuation keeps its parent's binding ([`bind`]).

use alloc::format;
use alloc::string::String;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The most object keys a scope's value holds, counted at every depth.
pub const MAX_KEYS: usize = 512;
/// The most bytes of a scope's value as compact JSON.
pub const MAX_VALUE_BYTES: usize = 65_536;
/// The highest revision (the wire's 2^53-1 cap).
pub const MAX_REVISION: u64 = 9_007_199_254_740_991;

/// A settings scope, as the wire names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Scope {
    User,
    Project,
}

/// The stored key of one scope: `user`, or `project:<projectId>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeKey(String);

impl ScopeKey {
    /// The user scope's key.
    pub fn user() -> Self {
        Self(String::from("user"))
    }

    /// The key of the project `project_id`'s scope.
    pub fn project(project_id: &str) -> Self {
        Self(format!("project:{project_id}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The key of the scope a request names: the user scope without a
/// project, the project scope with the caller's project.
pub fn scope_key(scope: Scope, project_id: Option<&str>) -> Result<ScopeKey, SettingsRejection> {
    match (scope, project_id) {
        (Scope::User, None) => Ok(ScopeKey::user()),
        (Scope::User, Some(_)) => Err(SettingsRejection::ProjectForUserScope),
        (Scope::Project, Some(project_id)) => Ok(ScopeKey::project(project_id)),
        (Scope::Project, None) => Err(SettingsRejection::ProjectRequired),
    }
}

/// One scope's current settings (`workflow_settings`); a scope never
/// changed is revision 0 with an empty value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeSettings {
    pub revision: u64,
    pub value: Map<String, Value>,
}

/// What an accepted patch did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    /// The value changed: the scope's new settings, one revision higher
    /// (one `workflow_setting_changes` row records the patch).
    Changed(ScopeSettings),
    /// The patch left the value as it was: the revision stays, and no
    /// change is recorded.
    Unchanged,
}

/// Why a patch was refused. Nothing changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum SettingsRejection {
    /// The project scope needs the caller's project (`projectPath`).
    ProjectRequired,
    /// The user scope names no project.
    ProjectForUserScope,
    /// The patched value would hold more than [`MAX_KEYS`] keys.
    TooManyKeys { keys: usize },
    /// The patched value would exceed [`MAX_VALUE_BYTES`].
    TooLarge { bytes: usize },
    /// The scope reached the highest revision.
    RevisionExhausted,
}

/// `settings.update`: applies `patch` to the scope's `current` settings.
pub fn update(
    current: &ScopeSettings,
    patch: &Map<String, Value>,
) -> Result<Update, SettingsRejection> {
    let mut value = current.value.clone();
    merge_object(&mut value, patch);
    if value == current.value {
        return Ok(Update::Unchanged);
    }
    let keys = key_count(&value);
    if keys > MAX_KEYS {
        return Err(SettingsRejection::TooManyKeys { keys });
    }
    let bytes = serde_json::to_vec(&value).map_or(usize::MAX, |bytes| bytes.len());
    if bytes > MAX_VALUE_BYTES {
        return Err(SettingsRejection::TooLarge { bytes });
    }
    let revision = current
        .revision
        .checked_add(1)
        .filter(|revision| *revision <= MAX_REVISION)
        .ok_or(SettingsRejection::RevisionExhausted)?;
    Ok(Update::Changed(ScopeSettings { revision, value }))
}

/// RFC 7396 on an object target: each patch key set to `null` is removed,
/// an object merges into the target's value (an object, or `{}` when the
/// target's value is not one), and any other value replaces it.
fn merge_object(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (key, patch_value) in patch {
        match patch_value {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(inner) => {
                let entry = target
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !entry.is_object() {
                    *entry = Value::Object(Map::new());
                }
                if let Value::Object(entry) = entry {
                    merge_object(entry, inner);
                }
            }
            other => {
                target.insert(key.clone(), other.clone());
            }
        }
    }
}

/// The object keys of `value`, at every depth (inside arrays too).
fn key_count(value: &Map<String, Value>) -> usize {
    fn of(value: &Value) -> usize {
        match value {
            Value::Object(map) => key_count(map),
            Value::Array(items) => items.iter().map(of).sum(),
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => 0,
        }
    }
    value.len() + value.values().map(of).sum::<usize>()
}

/// The settings revisions a run saw (`workflow_setting_bindings`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Binding {
    /// The user scope's revision.
    pub user: u64,
    /// The revision of the run's project's scope.
    pub project: u64,
}

/// The binding of a new run: a checkpoint continuation keeps its parent's
/// (`parent`), any other run takes the revisions in effect (`current`).
pub fn bind(parent: Option<Binding>, current: Binding) -> Binding {
    parent.unwrap_or(current)
}

#[cfg(test)]
mod tests;
