//! `list`, `start`, `runs`, `pause | resume | cancel | restart`, `answer`,
//! `recover`.

use super::{Exit, Failure, Outcome, Settings, connect, connect_as, refused, render};
use pi_workflows_client::{
    Accepted, CallOptions, ClientError, ClientOperation, WorkflowClient, ops,
};
use serde_json::{Value, json};
use std::path::Path;

/// The receipt of an accepted command as JSON (the `--json` output).
fn receipt_json<Op: ClientOperation>(accepted: &Accepted<Op>) -> Value {
    serde_json::to_value(&accepted.receipt).unwrap_or_else(|_| json!({}))
}

/// `pi-workflows list`: the workflows discovered for this directory.
pub(super) async fn list(settings: &Settings, json_output: bool) -> Outcome {
    let mut client = connect(settings).await?;
    let project = project_path()?;
    let mut workflows = Vec::new();
    let mut offset = 0;
    loop {
        let payload = json!({ "projectPath": project, "offset": offset, "limit": 200 });
        let page = client
            .call_json::<ops::WorkflowsList>(None, payload, CallOptions::default())
            .await
            .map_err(|error| refused(error, None))?;
        let receipt = receipt_json(&page);
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
pub(super) struct Retry {
    key: Option<String>,
}

impl Retry {
    pub(super) fn new(key: Option<String>) -> Result<Self, Failure> {
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

    pub(super) async fn connect(&self, settings: &Settings) -> Result<WorkflowClient, Failure> {
        match &self.key {
            Some(key) => {
                // `sha256:` and the first 16 hex digits of the key's digest.
                let digest = protocol::content::digest_text(key.as_bytes());
                connect_as(settings, &format!("cli-key-{}", &digest[7..23])).await
            }
            None => connect(settings).await,
        }
    }

    pub(super) fn options(&self) -> CallOptions {
        CallOptions {
            idempotency_key: self.key.clone(),
            expected_revision: None,
        }
    }

    /// The failure of a refused command; a key used for another command
    /// says so.
    pub(super) fn refused(&self, error: ClientError, run_id: Option<&str>) -> Failure {
        match (&self.key, error) {
            (Some(key), ClientError::Conflict { .. }) => Failure::new(
                Exit::Refused,
                format!(
                    "--idempotency-key {key} was already used for another command; use a new key for a new command"
                ),
            ),
            (_, error) => refused(error, run_id),
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
    pub model: Option<String>,
    pub thinking: Option<String>,
}

/// The thinking levels Pi takes (`AgentModel.thinking`).
const THINKING_LEVELS: [&str; 6] = ["off", "minimal", "low", "medium", "high", "xhigh"];

/// `run.start`'s `agentModel` from `--model provider/model` and `--thinking`.
fn agent_model(model: Option<&str>, thinking: Option<&str>) -> Result<Option<Value>, Failure> {
    let mut agent_model = serde_json::Map::new();
    if let Some(model) = model {
        let Some((provider, name)) = model
            .split_once('/')
            .filter(|(provider, name)| !provider.is_empty() && !name.is_empty())
        else {
            return Err(Failure::new(
                Exit::Usage,
                "--model takes provider/model, e.g. --model anthropic/claude-sonnet-4-5",
            ));
        };
        agent_model.insert("provider".into(), json!(provider));
        agent_model.insert("model".into(), json!(name));
    }
    if let Some(level) = thinking {
        if !THINKING_LEVELS.contains(&level) {
            return Err(Failure::new(
                Exit::Usage,
                "--thinking takes one of off, minimal, low, medium, high, xhigh",
            ));
        }
        agent_model.insert("thinking".into(), json!(level));
    }
    Ok((!agent_model.is_empty()).then_some(Value::Object(agent_model)))
}

/// `pi-workflows start`: a headless run of a named or path workflow.
pub(super) async fn start(settings: &Settings, args: StartArgs) -> Outcome {
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
    let model = agent_model(args.model.as_deref(), args.thinking.as_deref())?;
    let workflow = workflow_reference(&args.workflow)?;
    let retry = Retry::new(args.idempotency_key)?;
    let mut client = retry.connect(settings).await?;
    let mut payload = json!({
        "workflow": workflow,
        "input": input,
        "executionMode": "headless",
        "projectPath": project_path()?,
    });
    if let Some(model) = model {
        payload["agentModel"] = model;
    }
    if !args.json {
        eprintln!("pi-workflows: resolving {}…", args.workflow);
    }
    let started = client
        .call_json::<ops::RunStart>(None, payload, retry.options())
        .await
        .map_err(|error| retry.refused(error, None))?;
    let run_id = started.receipt.run_id.as_str().to_owned();
    if args.json {
        println!(
            "{}",
            json!({ "runId": run_id, "revision": started.receipt.revision.get() })
        );
        return Ok(Exit::Ok);
    }
    println!("started run {run_id}");
    if !args.watch {
        println!("follow it with `pi-workflows view {run_id}`");
        return Ok(Exit::Ok);
    }
    drop(client);
    super::view::view(settings, &run_id, true, false).await
}

/// The `workflow` of `run.start`: a path (the one rule of
/// `protocol::workflow_ref`: a `/` or `\`, or a workflow suffix) is sent
/// absolute and must name a file; anything else is a discovered name.
fn workflow_reference(argument: &str) -> Result<String, Failure> {
    if !protocol::workflow_ref::is_path_reference(argument) {
        return Ok(argument.to_owned());
    }
    std::fs::canonicalize(Path::new(argument))
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
    settings: &Settings,
    limit: usize,
    cursor: Option<String>,
    json_output: bool,
) -> Outcome {
    let mut client = connect(settings).await?;
    let mut payload = json!({ "limit": limit.clamp(1, 1000) });
    if let Some(cursor) = cursor {
        payload["cursor"] = json!(cursor);
    }
    let page = client
        .call_json::<ops::RunsList>(None, payload, CallOptions::default())
        .await
        .map_err(|error| refused(error, None))?;
    let receipt = receipt_json(&page);
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
    print!("{}", render::run_table(&rows, super::now_ms()));
    if let Some(next) = receipt.get("nextCursor").and_then(Value::as_str) {
        println!("more: pi-workflows runs --cursor {next}");
    }
    Ok(Exit::Ok)
}

/// The run controls.
#[derive(Clone, Copy, Debug)]
pub(super) enum Control {
    Pause,
    Resume,
    Cancel,
    Restart,
}

/// `pause | resume | cancel | restart <runId>`.
pub(super) async fn control(
    settings: &Settings,
    control: Control,
    args: super::ControlArgs,
) -> Outcome {
    let retry = Retry::new(args.idempotency_key)?;
    let mut client = retry.connect(settings).await?;
    let run_id = Some(args.run_id.as_str());
    let empty = json!({});
    let options = retry.options();
    let receipt = match control {
        Control::Pause => client
            .call_json::<ops::RunPause>(run_id, empty, options)
            .await
            .map(|accepted| receipt_json(&accepted)),
        Control::Resume => client
            .call_json::<ops::RunResume>(run_id, empty, options)
            .await
            .map(|accepted| receipt_json(&accepted)),
        Control::Cancel => client
            .call_json::<ops::RunCancel>(run_id, empty, options)
            .await
            .map(|accepted| receipt_json(&accepted)),
        Control::Restart => client
            .call_json::<ops::RunRestart>(run_id, empty, options)
            .await
            .map(|accepted| receipt_json(&accepted)),
    }
    .map_err(|error| retry.refused(error, run_id))?;
    if args.json {
        println!("{receipt}");
        return Ok(Exit::Ok);
    }
    match receipt["newRunId"].as_str() {
        Some(new_run_id) => println!("restarted run {} as run {new_run_id}", args.run_id),
        None => println!(
            "{} run {} (now {})",
            past_tense(control),
            args.run_id,
            receipt["status"].as_str().unwrap_or("changed")
        ),
    }
    Ok(Exit::Ok)
}

fn past_tense(control: Control) -> &'static str {
    match control {
        Control::Pause => "paused",
        Control::Resume => "resumed",
        Control::Cancel => "cancelled",
        Control::Restart => "restarted",
    }
}

/// `answer <runId> <answer> [text…]`: answers what the run waits on. A
/// protected human decision (the view shows it) takes a choice id and, for
/// a choice with a text input, its text (`decision.answer`, provenance
/// `cli`); an ordinary checkpoint takes a JSON value (`checkpoint.answer`).
pub(super) async fn answer(
    settings: &Settings,
    run_id: &str,
    answer: &str,
    text: &[String],
    json_output: bool,
    idempotency_key: Option<String>,
) -> Outcome {
    let retry = Retry::new(idempotency_key)?;
    let mut client = retry.connect(settings).await?;
    let view = client
        .run_view(run_id)
        .await
        .map_err(|error| refused(error, Some(run_id)))?;
    if let Some(decision) = &view.decision {
        let payload = decision_payload(decision, answer, text)?;
        let answered = client
            .call_json::<ops::DecisionAnswer>(Some(run_id), payload, retry.options())
            .await
            .map_err(|error| retry.refused(error, Some(run_id)))?;
        if json_output {
            println!("{}", receipt_json(&answered));
        } else {
            println!(
                "answered the decision of run {run_id} with {answer}; it continues as run {}",
                answered.receipt.continuation_run_id.as_str()
            );
        }
        return Ok(Exit::Ok);
    }
    if !text.is_empty() {
        return Err(Failure::new(
            Exit::Usage,
            "an ordinary checkpoint takes one JSON answer; quote it, e.g. pi-workflows answer RUN '{\"approved\": true}'",
        ));
    }
    let answer: Value = serde_json::from_str(answer).map_err(|_| {
        Failure::new(
            Exit::Usage,
            "the answer is not valid JSON; quote it, e.g. pi-workflows answer RUN '{\"approved\": true}'",
        )
    })?;
    let answered = client
        .call_json::<ops::CheckpointAnswer>(
            Some(run_id),
            json!({ "answer": answer }),
            retry.options(),
        )
        .await
        .map_err(|error| retry.refused(error, Some(run_id)))?;
    if json_output {
        println!("{}", receipt_json(&answered));
    } else {
        println!(
            "answered run {run_id}; it continues as run {}",
            answered.receipt.continuation_run_id.as_str()
        );
    }
    Ok(Exit::Ok)
}

/// The `decision.answer` payload for `choice` (and `text`) of `decision`.
fn decision_payload(
    decision: &protocol::generated::types::DecisionView,
    choice: &str,
    text: &[String],
) -> Result<Value, Failure> {
    let choices = decision.choices.as_slice();
    let Some(chosen) = choices.iter().find(|known| known.id.as_str() == choice) else {
        let ids: Vec<&str> = choices.iter().map(|known| known.id.as_str()).collect();
        return Err(Failure::new(
            Exit::Usage,
            format!(
                "{choice} is not a choice of this decision; answer with one of: {}",
                ids.join(", ")
            ),
        ));
    };
    let input = match (&chosen.input, text.is_empty()) {
        (None, true) => Value::Null,
        (None, false) => {
            return Err(Failure::new(
                Exit::Usage,
                format!("the choice {choice} takes no text; answer with the choice alone"),
            ));
        }
        (Some(input), true) => {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "the choice {choice} needs its text ({}): pi-workflows answer RUN {choice} 'TEXT'",
                    input.prompt.as_str()
                ),
            ));
        }
        (Some(input), false) => json!({ input.name.as_str(): text.join(" ") }),
    };
    Ok(json!({
        "decisionId": decision.decision_id,
        "requestDigest": decision.request_digest,
        "choice": choice,
        "input": input,
        "source": { "channel": "cli", "actorId": pi_workflows_client::ids::local_actor() },
    }))
}

/// The arguments of `recover`.
pub(super) struct RecoverArgs {
    pub run_id: String,
    pub action: String,
    pub effect: Option<String>,
    pub json: bool,
    pub idempotency_key: Option<String>,
}

/// `recover <runId> confirm|retry [--effect ID]`: an operator's review of
/// an ambiguous managed effect (`effect.recover`). Without `--effect`, the
/// run's one ambiguous effect.
pub(super) async fn recover(settings: &Settings, args: RecoverArgs) -> Outcome {
    let RecoverArgs {
        run_id,
        action,
        effect,
        json: json_output,
        idempotency_key,
    } = args;
    if !matches!(action.as_str(), "confirm" | "retry") {
        return Err(Failure::new(
            Exit::Usage,
            "recover takes confirm (the effect applied) or retry (apply it again): pi-workflows recover RUN confirm|retry",
        ));
    }
    let retry = Retry::new(idempotency_key)?;
    let mut client = retry.connect(settings).await?;
    let view = client
        .run_view(&run_id)
        .await
        .map_err(|error| refused(error, Some(&run_id)))?;
    let ambiguous: Vec<String> = view
        .ambiguous_effects
        .as_ref()
        .map(|effects| {
            effects
                .as_slice()
                .iter()
                .map(|effect| effect.effect_id.to_string())
                .collect()
        })
        .unwrap_or_default();
    let effect_id = match (effect, ambiguous.as_slice()) {
        (Some(effect), _) => effect,
        (None, [one]) => one.clone(),
        (None, []) => {
            return Err(Failure::new(
                Exit::Refused,
                format!(
                    "run {run_id} has no ambiguous effect to recover; see `pi-workflows view {run_id} --once`"
                ),
            ));
        }
        (None, several) => {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "run {run_id} has {} ambiguous effects ({}); name one with --effect ID",
                    several.len(),
                    several.join(", ")
                ),
            ));
        }
    };
    let recovered = client
        .call_json::<ops::EffectRecover>(
            Some(&run_id),
            json!({ "effectId": effect_id, "action": action }),
            retry.options(),
        )
        .await
        .map_err(|error| retry.refused(error, Some(&run_id)))?;
    if let Some(warning) = &recovered.receipt.warning {
        eprintln!("pi-workflows: warning: {}", warning.as_str());
    }
    if json_output {
        println!("{}", receipt_json(&recovered));
    } else if action == "confirm" {
        println!("confirmed effect {effect_id} of run {run_id}: recorded as applied");
    } else {
        println!(
            "effect {effect_id} of run {run_id} will be applied again as attempt {}",
            recovered.receipt.attempt_number.get()
        );
    }
    Ok(Exit::Ok)
}

pub(super) fn project_path() -> Result<String, Failure> {
    std::env::current_dir()
        .map(|dir| dir.to_string_lossy().into_owned())
        .map_err(|_| {
            Failure::new(
                Exit::Usage,
                "cannot read the current directory; cd into your project and retry",
            )
        })
}
