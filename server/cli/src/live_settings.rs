//! `pi-workflows settings [--json]` and `pi-workflows settings set
//! [--project] KEY=VALUE… | --patch-file FILE`: the live settings
//! (`settings.get`, `settings.update`).
//!
//! The project scope is this directory's project (the path `start` gives a
//! run). `set` sends one JSON merge patch: each `KEY=VALUE` sets a
//! top-level key (VALUE is read as JSON, and as text when it is not JSON;
//! `KEY=null` deletes the key), or the patch file's object is sent as it
//! is. Values are printed only by this command, never logged.

use super::runs::{Retry, project_path};
use super::{Exit, Failure, Outcome, Settings, connect, refused};
use pi_workflows_client::{CallOptions, ops};
use serde_json::{Map, Value, json};

/// The arguments of `settings set`.
pub(super) struct SetArgs {
    pub project: bool,
    pub pairs: Vec<String>,
    pub patch_file: Option<String>,
    pub json: bool,
    pub idempotency_key: Option<String>,
}

/// `settings`: each scope's revision and value.
pub(super) async fn show(settings: &Settings, json_output: bool) -> Outcome {
    let project = project_path()?;
    let mut client = connect(settings).await?;
    let accepted = client
        .call_json::<ops::SettingsGet>(
            None,
            json!({ "projectPath": project }),
            CallOptions::default(),
        )
        .await
        .map_err(|error| refused(error, None))?;
    let view = serde_json::to_value(&accepted.receipt).unwrap_or_else(|_| json!({}));
    if json_output {
        println!("{view}");
        return Ok(Exit::Ok);
    }
    for (scope, title) in [
        ("user", "user settings".to_owned()),
        ("project", format!("project settings ({project})")),
    ] {
        let revision = view[scope]["revision"].as_u64().unwrap_or(0);
        let value = &view[scope]["value"];
        if revision == 0 {
            println!("{title}: none yet (revision 0)");
        } else {
            println!(
                "{title}, revision {revision}:\n{}",
                serde_json::to_string_pretty(value).unwrap_or_default()
            );
        }
    }
    Ok(Exit::Ok)
}

fn usage(message: &str) -> Failure {
    Failure::new(Exit::Usage, message)
}

/// The merge patch of `KEY=VALUE` pairs or of a patch file.
fn patch_of(pairs: &[String], patch_file: Option<&str>) -> Result<Map<String, Value>, Failure> {
    match (pairs.is_empty(), patch_file) {
        (true, None) => Err(usage(
            "settings set needs KEY=VALUE pairs or --patch-file FILE; e.g. `pi-workflows settings set theme=dark`",
        )),
        (false, Some(_)) => Err(usage(
            "settings set takes KEY=VALUE pairs or --patch-file, not both; pick one",
        )),
        (true, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|_| usage("cannot read the patch file; check its path and permissions"))?;
            match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(patch)) => Ok(patch),
                _ => Err(usage(
                    "the patch file must hold one JSON object (a merge patch: null deletes a key); fix it and retry",
                )),
            }
        }
        (false, None) => {
            let mut patch = Map::new();
            for pair in pairs {
                let Some((key, value)) = pair.split_once('=').filter(|(key, _)| !key.is_empty())
                else {
                    return Err(usage(
                        "settings set takes KEY=VALUE pairs (VALUE as JSON or text, null deletes); e.g. `pi-workflows settings set theme=dark`",
                    ));
                };
                let value = serde_json::from_str::<Value>(value)
                    .unwrap_or_else(|_| Value::String(value.to_owned()));
                patch.insert(key.to_owned(), value);
            }
            Ok(patch)
        }
    }
}

/// `settings set`: one patch of the user scope, or of this project's.
pub(super) async fn set(settings: &Settings, args: SetArgs) -> Outcome {
    let patch = patch_of(&args.pairs, args.patch_file.as_deref())?;
    let retry = Retry::new(args.idempotency_key)?;
    let (scope, payload) = if args.project {
        let project = project_path()?;
        (
            "project",
            json!({ "scope": "project", "projectPath": project, "patch": patch }),
        )
    } else {
        ("user", json!({ "scope": "user", "patch": patch }))
    };
    let mut client = retry.connect(settings).await?;
    let accepted = client
        .call_json::<ops::SettingsUpdate>(None, payload, retry.options())
        .await
        .map_err(|error| retry.refused(error, None))?;
    let receipt = serde_json::to_value(&accepted.receipt).unwrap_or_else(|_| json!({}));
    if args.json {
        println!("{receipt}");
    } else {
        println!(
            "{scope} settings at revision {}",
            receipt["revision"].as_u64().unwrap_or(0)
        );
    }
    Ok(Exit::Ok)
}
