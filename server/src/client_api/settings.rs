//! `settings.update` and `settings.get`: live settings, one JSON object per
//! scope (the user's, and one per project), decided by `kernel::settings`
//! inside the command's receipt job and stored by `store::settings`.
//!
//! The project scope is the project of the payload's `projectPath` (the
//! same project id `run.start` gives a run of that path). A patch that
//! changed the value commits its change row with its receipt; a repeated
//! request adopts the stored receipt (`receipts`). A run records the
//! revisions in effect when it is created (`store::meta::insert_run`), and
//! its view shows them.

use super::receipts::{Executed, command};
use super::request::{Request, unavailable};
use crate::context::Context;
use crate::store::settings::{self as store, ChangeReceipt};
use crate::store::{meta, settings};
use crate::wire::client::{receipt as receipt_value, response};
use kernel::settings::{self as kernel_settings, Scope, ScopeKey, ScopeSettings, Update};
use protocol::generated::types::{
    JsonObject, SettingsGetPayload, SettingsReceipt, SettingsScope, SettingsScopeView,
    SettingsUpdatePayload, SettingsView,
};

use serde_json::Value;
use std::sync::Arc;

fn revision(
    value: u64,
) -> Result<protocol::generated::constrained::Revision, crate::projection::run_view::OffSchema> {
    crate::projection::run_view::revision(value)
}

pub(super) async fn update(
    app: &Arc<Context>,
    request: Request,
    payload: SettingsUpdatePayload,
) -> Value {
    let scope = match payload.scope {
        SettingsScope::User => Scope::User,
        SettingsScope::Project => Scope::Project,
    };
    let project_path = payload.project_path.map(|path| path.to_string());
    let patch = payload.patch.0;
    let client_id = request.client_id.clone();
    let idempotency_key = request.idempotency_key.clone().unwrap_or_default();
    command(app, request, move |connection, now_ms| {
        let project_id = match &project_path {
            Some(path) => Some(meta::ensure_project(connection, path, now_ms)?),
            None => None,
        };
        let key = match kernel_settings::scope_key(scope, project_id.as_deref()) {
            Ok(key) => key,
            Err(rejection) => return Ok(Executed::rejected(&rejection)),
        };
        let current = store::load(connection, &key)?;
        let settings = match kernel_settings::update(&current, &patch) {
            Ok(Update::Changed(next)) => {
                let receipt = ChangeReceipt {
                    client_id: &client_id,
                    idempotency_key: &idempotency_key,
                };
                store::write_change(
                    connection,
                    &key,
                    project_id.as_deref(),
                    &next,
                    &patch,
                    &receipt,
                    now_ms,
                )?;
                next
            }
            Ok(Update::Unchanged) => current,
            Err(rejection) => return Ok(Executed::rejected(&rejection)),
        };
        let receipt = SettingsReceipt {
            revision: revision(settings.revision)?,
        };
        Ok(Executed::done(&receipt))
    })
    .await
}

fn scope_view(
    settings: ScopeSettings,
) -> Result<SettingsScopeView, crate::projection::run_view::OffSchema> {
    Ok(SettingsScopeView {
        revision: revision(settings.revision)?,
        value: JsonObject(settings.value),
    })
}

pub(super) async fn get(
    app: &Arc<Context>,
    request: &Request,
    payload: &SettingsGetPayload,
) -> Value {
    let project_id = payload
        .project_path
        .as_ref()
        .map(|path| meta::project_id_of(path.as_str()));
    let read = app
        .store
        .read(move |connection| {
            let user = settings::load(connection, &ScopeKey::user())?;
            let project = match &project_id {
                Some(project_id) => {
                    Some(settings::load(connection, &ScopeKey::project(project_id))?)
                }
                None => None,
            };
            Ok((user, project))
        })
        .await;
    let view = read.ok().and_then(|(user, project)| {
        Some(SettingsView {
            user: scope_view(user).ok()?,
            project: match project {
                Some(project) => Some(scope_view(project).ok()?),
                None => None,
            },
        })
    });
    match view {
        Some(view) => response(
            &request.request_id,
            "settings.get",
            "accepted",
            None,
            Some(receipt_value(&view)),
            None,
        ),
        None => unavailable(request),
    }
}
