//! `list`, `start`, `runs`, `pause | resume | cancel | restart`, `answer`.

use super::{Exit, Failure, Outcome, connect, connect_as, refused, render};
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

/// How a state-changing command names itself to the server.
///
/// Without `--idempotency-key`, a CLI process is a client of its own (a
/// fresh client id and key), so no other process ever adopts what it sent.
/// With a key, the client id is derived from the key (`cli-key-` and 16 hex
/// digits of its SHA-256), so the same command run again — from any process,
/// after a kill or a timeout — is the same durable command (client id +
/// idempotency key) and adopts the receipt the first attempt stored, while
/// two different keys are two different clients and never collide.
struct Retry {
    key: Option<String>,
}

impl Retry {
    fn new(key: Option<String>) -> Result<Self, Failure> {
        let valid = |key: &str| {
            let mut chars = key.chars();
            key.len() <= 128
                && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
                && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
        };
        match key {
            Some(key) if !valid(&key) => Err(Failure::new(
                Exit::Usage,
                "--idempotency-key takes 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit; pick another key",
            )),
            key => Ok(Self { key }),
        }
    }

    async fn connect(&self, config: &Config) -> Result<crate::client::Client, Failure> {
        match &self.key {
            Some(key) => {
                let digest = crate::ids::sha256(key.as_bytes());
                let hex: String = digest.0[..8].iter().map(|b| format!("{b:02x}")).collect();
                connect_as(config, &format!("cli-key-{hex}")).await
            }
            None => connect(config).await,
        }
    }

    fn spec(&self, operation: &str, run_id: Option<&str>, payload: Value) -> RequestSpec {
        let mut spec = RequestSpec::command(operation, run_id, payload);
        if let Some(key) = &self.key {
            spec.idempotency_key = Some(key.clone());
        }
        spec
    }

    /// The receipt of an accepted (or, for a retry, adopted) response, or the
    /// failure to report; a key used for another command says so.
    fn accepted(
        &self,
        response: &crate::client::Response,
        run_id: Option<&str>,
    ) -> Result<Value, Failure> {
        match (&self.key, response.outcome.as_str()) {
            (Some(key), "conflict") => Err(Failure::new(
                Exit::Refused,
                format!(
                    "--idempotency-key {key} was already used for another command; use a new key for a new command"
                ),
            )),
            _ => accepted(response, run_id),
        }
    }
}

/// The arguments of `start`.
pub(super) struct StartArgs {
    pub workflow: String,
    pub task: Vec<String>,
    pub input_json: Option<String>,
    pub watch: bool,
    pub json: bool,
    pub idempotency_key: Option<String>,
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
    let retry = Retry::new(args.idempotency_key)?;
    let mut client = retry.connect(config).await?;
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
        .request(&retry.spec("run.start", None, payload))
        .await?;
    let receipt = retry.accepted(&response, None)?;
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
    let retry = Retry::new(args.idempotency_key)?;
    let mut client = retry.connect(config).await?;
    let response = client
        .request(&retry.spec(operation, Some(&args.run_id), json!({})))
        .await?;
    let receipt = retry.accepted(&response, Some(&args.run_id))?;
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
    idempotency_key: Option<String>,
) -> Outcome {
    let retry = Retry::new(idempotency_key)?;
    let answer: Value = serde_json::from_str(answer).map_err(|_| {
        Failure::new(
            Exit::Usage,
            "the answer is not valid JSON; quote it, e.g. pi-workflows answer RUN '{\"approved\": true}'",
        )
    })?;
    let mut client = retry.connect(config).await?;
    let response = client
        .request(&retry.spec(
            "checkpoint.answer",
            Some(run_id),
            json!({ "answer": answer }),
        ))
        .await?;
    let receipt = retry.accepted(&response, Some(run_id))?;
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

/// The receipt of an accepted response (or of an `adopted` one: a retry of a
/// command that was already executed), or the failure to report.
fn accepted(response: &crate::client::Response, run_id: Option<&str>) -> Result<Value, Failure> {
    if !matches!(response.outcome.as_str(), "accepted" | "adopted") {
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
