//! Live settings (`workflow_settings`, `workflow_setting_changes`,
//! `workflow_setting_bindings`): each scope's current value and revision,
//! the accepted changes, and the revisions each run saw; the decisions are
//! `kernel::settings`'.
//!
//! Invariants:
//! - A change is written whole in its command's receipt transaction: the
//!   scope's new value and revision and one change row naming the patch
//!   and the receipt (client id, idempotency key) that acknowledged it.
//! - A run's binding is written with the run's first rows
//!   (`meta::insert_run`), and never changes afterwards.
//! - Setting values are read only for `settings.get`; nothing here logs a
//!   value.

use super::Cached as _;
use super::codec::{i64_of, u64_of};
use kernel::ids::RunId;
use kernel::settings::{Binding, ScopeKey, ScopeSettings};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value};

/// The current settings of the scope `key` (revision 0 and `{}` before its
/// first change).
pub(crate) fn load(connection: &Connection, key: &ScopeKey) -> rusqlite::Result<ScopeSettings> {
    let row: Option<(i64, String)> = connection
        .query_row_cached(
            "SELECT revision, value_json FROM workflow_settings WHERE scope_key = ?1",
            params![key.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    Ok(match row {
        Some((revision, value_json)) => ScopeSettings {
            revision: u64_of(revision),
            value: serde_json::from_str::<Map<String, Value>>(&value_json).map_err(|error| {
                rusqlite::Error::FromSqlConversionFailure(
                    1,
                    rusqlite::types::Type::Text,
                    Box::new(error),
                )
            })?,
        },
        None => ScopeSettings::default(),
    })
}

/// The receipt a change was accepted under.
pub(crate) struct ChangeReceipt<'a> {
    pub(crate) client_id: &'a str,
    pub(crate) idempotency_key: &'a str,
}

/// Writes a scope's changed settings and the change row of `patch`; a
/// scope with `project_id` is that project's (`kernel::settings::scope_key`
/// made `key` from the same two).
pub(crate) fn write_change(
    connection: &Connection,
    key: &ScopeKey,
    project_id: Option<&str>,
    settings: &ScopeSettings,
    patch: &Map<String, Value>,
    receipt: &ChangeReceipt<'_>,
    now_ms: u64,
) -> rusqlite::Result<()> {
    let value_json = serde_json::to_string(&settings.value).unwrap_or_else(|_| "{}".into());
    let patch_json = serde_json::to_string(patch).unwrap_or_else(|_| "{}".into());
    let scope = match project_id {
        None => "user",
        Some(_) => "project",
    };
    connection.execute_cached(
        "INSERT INTO workflow_settings (scope_key, scope, project_id, revision, value_json, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (scope_key) DO UPDATE SET revision = excluded.revision,
           value_json = excluded.value_json, updated_at_ms = excluded.updated_at_ms",
        params![
            key.as_str(),
            scope,
            project_id,
            i64_of(settings.revision),
            value_json,
            i64_of(now_ms)
        ],
    )?;
    connection.execute_cached(
        "INSERT INTO workflow_setting_changes (scope_key, revision, patch_json, client_id, idempotency_key, changed_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            key.as_str(),
            i64_of(settings.revision),
            patch_json,
            receipt.client_id,
            receipt.idempotency_key,
            i64_of(now_ms)
        ],
    )?;
    Ok(())
}

fn revision_of(connection: &Connection, key: &ScopeKey) -> rusqlite::Result<u64> {
    let revision: Option<i64> = connection
        .query_row_cached(
            "SELECT revision FROM workflow_settings WHERE scope_key = ?1",
            params![key.as_str()],
            |row| row.get(0),
        )
        .optional()?;
    Ok(revision.map_or(0, u64_of))
}

/// The revisions in effect for a run of the project `project_id`.
pub(crate) fn current_binding(
    connection: &Connection,
    project_id: &str,
) -> rusqlite::Result<Binding> {
    Ok(Binding {
        user: revision_of(connection, &ScopeKey::user())?,
        project: revision_of(connection, &ScopeKey::project(project_id))?,
    })
}

/// The revisions `run_id` saw, if it has a binding.
pub(crate) fn binding(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<Binding>> {
    connection
        .query_row_cached(
            "SELECT user_revision, project_revision FROM workflow_setting_bindings WHERE run_id = ?1",
            params![run_id.as_str()],
            |row| {
                Ok(Binding {
                    user: u64_of(row.get(0)?),
                    project: u64_of(row.get(1)?),
                })
            },
        )
        .optional()
}

/// Writes the binding of a new run.
pub(crate) fn insert_binding(
    connection: &Connection,
    run_id: &RunId,
    binding: Binding,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO workflow_setting_bindings (run_id, user_revision, project_revision) VALUES (?1, ?2, ?3)",
        params![run_id.as_str(), i64_of(binding.user), i64_of(binding.project)],
    )?;
    Ok(())
}
