//! `pi-workflows resources`, `resource <controller> <key>`, `apply
//! <controller> <key> <spec.json>`, `reconcile <controller> <key>` and
//! `delete <controller> <key>`: managed resources (`resource.list`,
//! `resource.get`, `resource.apply`, `resource.reconcile`,
//! `resource.delete`).
//!
//! `apply` sends this directory as the project whose `.pi/controllers/` is
//! searched first. Every failure is one line saying what to do next; the
//! server's messages already do, so they are printed as they are. Specs and
//! statuses are printed only by `resource`, never in an error.

use super::runs::{Retry, project_path};
use super::{Exit, Failure, Outcome, Settings, connect};
use pi_workflows_client::{CallOptions, ClientError, ops};
use serde_json::{Value, json};

/// The failure of a refused resource request.
fn refused(error: ClientError) -> Failure {
    let (exit, message) = match &error {
        ClientError::NotFound { message, .. } => (Exit::NotFound, message),
        ClientError::Refused { message, .. } => (Exit::Refused, message),
        ClientError::Conflict { message, .. } | ClientError::ClaimLost { message, .. } => {
            (Exit::Refused, message)
        }
        ClientError::ServerUnavailable { message, .. } => (Exit::Unavailable, message),
        _ => return Failure::from(error),
    };
    Failure::new(exit, message.clone())
}

fn retry_refused(retry: &Retry, error: ClientError) -> Failure {
    match error {
        ClientError::Conflict { .. } if retry.options().idempotency_key.is_some() => {
            retry.refused(error, None)
        }
        error => refused(error),
    }
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or("")
}

fn number(value: &Value, key: &str) -> u64 {
    value[key].as_u64().unwrap_or(0)
}

/// `resources`: one line per resource.
pub(super) async fn list(settings: &Settings, json_output: bool) -> Outcome {
    let mut client = connect(settings).await?;
    let accepted = client
        .call_json::<ops::ResourceList>(None, json!({}), CallOptions::default())
        .await
        .map_err(refused)?;
    let view = serde_json::to_value(&accepted.receipt).unwrap_or_else(|_| json!({}));
    if json_output {
        println!("{view}");
        return Ok(Exit::Ok);
    }
    let rows = view["resources"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        println!(
            "no resources yet; apply one with `pi-workflows apply <controller> <key> <spec.json>`"
        );
        return Ok(Exit::Ok);
    }
    for row in &rows {
        let mut line = format!(
            "{}/{}  ready={}  generation {} (observed {})  version {}",
            text(row, "controller"),
            text(row, "key"),
            row["ready"].as_str().unwrap_or("none"),
            number(row, "generation"),
            number(row, "observedGeneration"),
            number(row, "resourceVersion"),
        );
        if row["deleting"] == json!(true) {
            line.push_str("  deleting");
        }
        if let Some(error) = row["lastError"].as_str() {
            line.push_str(&format!(
                "  last error ({} in a row): {}",
                number(row, "consecutiveErrors"),
                one_line(error)
            ));
        }
        println!("{line}");
    }
    Ok(Exit::Ok)
}

/// A stored message on one line, at most 200 characters.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect()
}

/// `resource <controller> <key>`: the resource, its queue, effects, child
/// runs and recent events.
pub(super) async fn show(
    settings: &Settings,
    controller: &str,
    key: &str,
    json_output: bool,
) -> Outcome {
    let mut client = connect(settings).await?;
    let accepted = client
        .call_json::<ops::ResourceGet>(
            None,
            json!({ "controller": controller, "key": key }),
            CallOptions::default(),
        )
        .await
        .map_err(refused)?;
    let view = serde_json::to_value(&accepted.receipt).unwrap_or_else(|_| json!({}));
    if json_output {
        println!("{view}");
        return Ok(Exit::Ok);
    }
    let status = &view["status"];
    println!(
        "{controller}/{key}  uid {}  version {}  generation {} (observed {})",
        text(&view, "uid"),
        number(&view, "resourceVersion"),
        number(&view, "generation"),
        number(status, "observedGeneration"),
    );
    if view.get("deletionRequestedAtMs").is_some() {
        let finalizers = view["finalizers"].as_array().map_or(0, Vec::len);
        println!("deletion requested; {finalizers} finalizer(s) left");
    }
    println!(
        "spec: {}",
        serde_json::to_string(&view["spec"]).unwrap_or_default()
    );
    println!(
        "status: {}",
        serde_json::to_string(&status["controllerStatus"]).unwrap_or_default()
    );
    for condition in status["conditions"].as_array().into_iter().flatten() {
        let mut line = format!(
            "condition {}={} ({})",
            text(condition, "type"),
            text(condition, "status"),
            text(condition, "reason")
        );
        if let Some(message) = condition["message"].as_str() {
            line.push_str(&format!(": {}", one_line(message)));
        }
        println!("{line}");
    }
    if !status["workflowRun"].is_null() {
        println!(
            "workflow run: {}",
            serde_json::to_string(&status["workflowRun"]).unwrap_or_default()
        );
    }
    if let Some(queue) = view.get("queue") {
        let due = match queue.get("availableAtMs") {
            Some(at) => format!("due at {}", at),
            None => "idle".into(),
        };
        let mut line = format!("queue: {due}");
        if queue["claimed"] == json!(true) {
            line.push_str(", reconciling");
        }
        if let Some(error) = queue["lastError"].as_str() {
            line.push_str(&format!(
                ", last error ({} in a row): {}",
                number(queue, "consecutiveErrors"),
                one_line(error)
            ));
        }
        println!("{line}");
    }
    let effects = view["effects"].as_array().cloned().unwrap_or_default();
    println!(
        "{}",
        if effects.is_empty() {
            "effects: none"
        } else {
            "effects:"
        }
    );
    for effect in &effects {
        println!(
            "  {} {} {}",
            text(effect, "key"),
            text(effect, "kind"),
            text(effect, "state")
        );
    }
    let children = view["childWorkflows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    println!(
        "{}",
        if children.is_empty() {
            "child runs: none"
        } else {
            "child runs:"
        }
    );
    for child in &children {
        println!(
            "  {} {} attempt {} run {} {}",
            text(child, "requestKey"),
            text(child, "workflow"),
            number(child, "attempt"),
            text(child, "runId"),
            text(child, "state")
        );
    }
    println!("recent events:");
    for event in view["events"].as_array().into_iter().flatten() {
        let mut line = format!("  {} {}", number(event, "atMs"), text(event, "kind"));
        if let Some(version) = event["resourceVersion"].as_u64() {
            line.push_str(&format!(" (version {version})"));
        }
        if let Some(detail) = event["detail"].as_str() {
            line.push_str(&format!(": {}", one_line(detail)));
        }
        println!("{line}");
    }
    Ok(Exit::Ok)
}

/// The arguments of `apply`.
pub(super) struct ApplyArgs {
    pub controller: String,
    pub key: String,
    pub spec_file: String,
    pub json: bool,
    pub idempotency_key: Option<String>,
}

/// `apply`: the spec file's JSON for this directory's project.
pub(super) async fn apply(settings: &Settings, args: ApplyArgs) -> Outcome {
    let text = std::fs::read_to_string(&args.spec_file).map_err(|_| {
        Failure::new(
            Exit::Usage,
            "cannot read the spec file; check its path and permissions",
        )
    })?;
    let spec: Value = serde_json::from_str(&text).map_err(|_| {
        Failure::new(
            Exit::Usage,
            "the spec file is not JSON; fix it and apply again",
        )
    })?;
    let project = project_path()?;
    let retry = Retry::new(args.idempotency_key)?;
    let mut client = retry.connect(settings).await?;
    let accepted = client
        .call_json::<ops::ResourceApply>(
            None,
            json!({ "controller": args.controller, "key": args.key, "spec": spec, "projectPath": project }),
            retry.options(),
        )
        .await
        .map_err(|error| retry_refused(&retry, error))?;
    let receipt = serde_json::to_value(&accepted.receipt).unwrap_or_else(|_| json!({}));
    if args.json {
        println!("{receipt}");
    } else {
        println!(
            "applied {}/{}: resource version {}",
            args.controller,
            args.key,
            number(&receipt, "resourceVersion")
        );
    }
    Ok(Exit::Ok)
}

/// What `reconcile` and `delete` ask for.
#[derive(Clone, Copy)]
pub(super) enum RefCommand {
    Reconcile,
    Delete,
}

/// `reconcile` or `delete` of one resource.
pub(super) async fn reference(
    settings: &Settings,
    command: RefCommand,
    controller: &str,
    key: &str,
    json_output: bool,
    idempotency_key: Option<String>,
) -> Outcome {
    let retry = Retry::new(idempotency_key)?;
    let mut client = retry.connect(settings).await?;
    let payload = json!({ "controller": controller, "key": key });
    let result = match command {
        RefCommand::Reconcile => client
            .call_json::<ops::ResourceReconcile>(None, payload, retry.options())
            .await
            .map(|accepted| serde_json::to_value(&accepted.receipt)),
        RefCommand::Delete => client
            .call_json::<ops::ResourceDelete>(None, payload, retry.options())
            .await
            .map(|accepted| serde_json::to_value(&accepted.receipt)),
    };
    let receipt = result
        .map_err(|error| retry_refused(&retry, error))?
        .unwrap_or_else(|_| json!({}));
    if json_output {
        println!("{receipt}");
        return Ok(Exit::Ok);
    }
    let version = number(&receipt, "resourceVersion");
    match command {
        RefCommand::Reconcile => {
            println!("{controller}/{key} is queued for reconcile (resource version {version})");
        }
        RefCommand::Delete => {
            println!(
                "deletion of {controller}/{key} requested (resource version {version}); it is gone once its controller settles it"
            );
        }
    }
    Ok(Exit::Ok)
}
