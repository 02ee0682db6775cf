//! `list`, `start`, `runs`, `pause | resume | cancel | restart`, `answer`.

use super::{Exit, Failure, Outcome, connect, refused, render};
use crate::client::RequestSpec;
use crate::config::Config;
use serde_json::{Value, json};
use std::path::Path;

/// `pi-workflows list`: the workflows discovered for this directory.
pub(super) async fn list(config: &Config, json_output: bool) -> Outcome {
    let mut client = connect(config).await?;
    let project = project_path()?;
    let mut workflows = Vec::new();
    let mut offset = 0;
    loop {
        let payload = json!({ "projectPath": project, "offset": offset, "limit": 200 });
        let response = client
            .request(&RequestSpec::read("workflows.list", None, payload))
            .await?;
        let receipt = accepted(&response, None)?;
        workflows.extend(receipt["workflows"].as_array().cloned().unwrap_or_default());
        match receipt.get("nextOffset").and_then(Value::as_u64) {
            Some(next) => offset = next,
            None => break,
        }
    }
    if json_output {
        println!("{}", json!({ "workflows": workflows }));
    } else if workflows.is_empty() {
        println!(
            "No workflows found. Add one under .pi/workflows/ (NAME.workflow.ts) in this project or ~/.pi/agent/workflows/."
        );
    } else {
        print!("{}", render::workflow_table(&workflows));
    }
    Ok(Exit::Ok)
}

/// The arguments of `start`.
pub(super) struct StartArgs {
    pub workflow: String,
    pub task: Vec<String>,
    pub input_json: Option<String>,
    pub watch: bool,
    pub json: bool,
}

/// `pi-workflows start`: a headless run of a named or path workflow.
pub(super) async fn start(config: &Config, args: StartArgs) -> Outcome {
    let input = match &args.input_json {
        Some(text) => serde_json::from_str::<Value>(text).map_err(|_| {
            Failure::new(
                Exit::Usage,
                "--input-json is not valid JSON; pass one JSON value, e.g. '{\"task\": \"…\"}'",
            )
        })?,
        None if args.task.is_empty() => json!({}),
        None => json!({ "task": args.task.join(" ") }),
    };
    let workflow = workflow_reference(&args.workflow)?;
    let mut client = connect(config).await?;
    let payload = json!({
        "workflow": workflow,
        "input": input,
        "executionMode": "headless",
        "projectPath": project_path()?,
    });
    if !args.json {
        eprintln!("pi-workflows: resolving {}…", args.workflow);
    }
    let response = client
        .request(&RequestSpec::command("run.start", None, payload))
        .await?;
    let receipt = accepted(&response, None)?;
    let run_id = receipt["runId"].as_str().unwrap_or_default().to_owned();
    if args.json {
        println!(
            "{}",
            json!({ "runId": run_id, "revision": receipt["revision"] })
        );
        return Ok(Exit::Ok);
    }
    println!("started run {run_id}");
    if !args.watch {
        println!("follow it with `pi-workflows view {run_id}`");
        return Ok(Exit::Ok);
    }
    drop(client);
    super::view::view(config, &run_id, true, false).await
}

/// A path argument (it names an existing file or looks like one) is sent
/// absolute; anything else is a discovered workflow name.
fn workflow_reference(argument: &str) -> Result<String, Failure> {
    let path = Path::new(argument);
    let looks_like_path = argument.contains('/') || argument.ends_with(".ts");
    if !looks_like_path && !path.is_file() {
        return Ok(argument.to_owned());
    }
    std::fs::canonicalize(path)
        .map(|path| path.to_string_lossy().into_owned())
        .map_err(|_| {
            Failure::new(
                Exit::NotFound,
                format!(
                    "no workflow file {argument}; pass a .workflow.ts path or a name from `pi-workflows list`"
                ),
            )
        })
}

/// `pi-workflows runs`: one page of runs, newest first.
pub(super) async fn runs(
    config: &Config,
    limit: usize,
    cursor: Option<String>,
    json_output: bool,
) -> Outcome {
    let mut client = connect(config).await?;
    let mut payload = json!({ "limit": limit.clamp(1, 1000) });
    if let Some(cursor) = cursor {
        payload["cursor"] = json!(cursor);
    }
    let response = client
        .request(&RequestSpec::read("runs.list", None, payload))
        .await?;
    let receipt = accepted(&response, None)?;
    if json_output {
        let mut page = json!({ "revision": receipt["revision"], "runs": receipt["rows"] });
        if let Some(next) = receipt.get("nextCursor") {
            page["nextCursor"] = next.clone();
        }
        println!("{page}");
        return Ok(Exit::Ok);
    }
    let rows = receipt["rows"].as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        println!("No runs yet. Start one with `pi-workflows start <workflow> [task…]`.");
        return Ok(Exit::Ok);
    }
    print!("{}", render::run_table(&rows, crate::clock::now_ms()));
    if let Some(next) = receipt.get("nextCursor").and_then(Value::as_str) {
        println!("more: pi-workflows runs --cursor {next}");
    }
    Ok(Exit::Ok)
}

/// `pause | resume | cancel | restart <runId>`.
pub(super) async fn control(config: &Config, operation: &str, args: super::ControlArgs) -> Outcome {
    let mut client = connect(config).await?;
    let response = client
        .request(&RequestSpec::command(
            operation,
            Some(&args.run_id),
            json!({}),
        ))
        .await?;
    let receipt = accepted(&response, Some(&args.run_id))?;
    if args.json {
        println!("{receipt}");
        return Ok(Exit::Ok);
    }
    match receipt["newRunId"].as_str() {
        Some(new_run_id) => println!("restarted run {} as run {new_run_id}", args.run_id),
        None => println!(
            "{} run {} (now {})",
            past_tense(operation),
            args.run_id,
            receipt["status"].as_str().unwrap_or("changed")
        ),
    }
    Ok(Exit::Ok)
}

fn past_tense(operation: &str) -> &'static str {
    match operation {
        "run.pause" => "paused",
        "run.resume" => "resumed",
        "run.cancel" => "cancelled",
        _ => "changed",
    }
}

/// `answer <runId> <json>`: answers the run's waiting checkpoint.
pub(super) async fn answer(
    config: &Config,
    run_id: &str,
    answer: &str,
    json_output: bool,
) -> Outcome {
    let answer: Value = serde_json::from_str(answer).map_err(|_| {
        Failure::new(
            Exit::Usage,
            "the answer is not valid JSON; quote it, e.g. pi-workflows answer RUN '{\"approved\": true}'",
        )
    })?;
    let mut client = connect(config).await?;
    let response = client
        .request(&RequestSpec::command(
            "checkpoint.answer",
            Some(run_id),
            json!({ "answer": answer }),
        ))
        .await?;
    let receipt = accepted(&response, Some(run_id))?;
    if json_output {
        println!("{receipt}");
    } else {
        println!(
            "answered run {run_id}; it continues as run {}",
            receipt["continuationRunId"].as_str().unwrap_or(run_id)
        );
    }
    Ok(Exit::Ok)
}

/// The receipt of an accepted response, or the failure to report.
fn accepted(response: &crate::client::Response, run_id: Option<&str>) -> Result<Value, Failure> {
    if response.outcome != "accepted" {
        return Err(refused(response, run_id));
    }
    Ok(response.receipt.clone().unwrap_or(json!({})))
}

fn project_path() -> Result<String, Failure> {
    std::env::current_dir()
        .map(|dir| dir.to_string_lossy().into_owned())
        .map_err(|_| {
            Failure::new(
                Exit::Usage,
                "cannot read the current directory; cd into your project and retry",
            )
        })
}
