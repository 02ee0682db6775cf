//! Resolve mode: find the script, hash it, "compile" it, answer once; after
//! a `resolve.result` (which says `awaitsRun` unless the script sets
//! `"resolveOnly": true`) wait for the run's launch and run it (run mode,
//! which verifies the script's hash again), or exit 0 on EOF.

use std::path::{Path, PathBuf};

use protocol::WorkerLaunch;
use protocol::canonicalize_typed;
use protocol::generated::types::{LaunchMode, ResolveFailureCode, Title, Topology, WorkflowName};
use serde_json::{Value, json};

use crate::channel::{Channel, Stdin};
use crate::script::Script;
use crate::{EXIT_PROTOCOL, launched, log, sha256_digest};

/// Why resolution failed: the code and a static message (never payload
/// text; the details go to the log).
type Failure = (ResolveFailureCode, &'static str);

pub(crate) fn resolve(launch: &WorkerLaunch, mut stdin: Stdin) -> ! {
    let Some(target) = &launch.resolve else {
        log!("resolve mode without `resolve`");
        std::process::exit(EXIT_PROTOCOL);
    };
    let mut channel = Channel::open(launch, None);
    let path = script_path(launch.project_path.as_str(), target.workflow.as_str());
    match compile(&path, &target.input) {
        Ok((fields, false)) => {
            channel.send("resolve.result", fields);
        }
        Ok((mut fields, true)) => {
            fields["awaitsRun"] = json!(true);
            channel.send("resolve.result", fields);
            log!("awaiting the run's launch");
            match stdin.launch() {
                Ok(Some(run)) if run.mode == LaunchMode::Run => {
                    launched(&run);
                    crate::run::run(&run, Channel::open(&run, Some(stdin)));
                }
                Ok(Some(other)) => {
                    log!(
                        "a resolver runs only its run's launch, not mode {}",
                        other.mode
                    );
                    std::process::exit(EXIT_PROTOCOL);
                }
                Ok(None) => log!("no run launch followed the resolution (stdin closed): exiting"),
                Err(e) => {
                    log!("{e}");
                    std::process::exit(EXIT_PROTOCOL);
                }
            }
        }
        Err((code, message)) => {
            log!("resolve failed: {code}");
            channel.send("resolve.failed", json!({"code": code, "message": message}));
        }
    }
    std::process::exit(0);
}

/// The script file a workflow reference names: absolute, or relative to
/// the project.
pub(crate) fn script_path(project: &str, workflow: &str) -> PathBuf {
    Path::new(project).join(workflow)
}

/// The `resolve.result` fields (without the common ones), and whether the
/// resolver awaits its run.
fn compile(path: &Path, input: &Value) -> Result<(Value, bool), Failure> {
    let not_found = (
        ResolveFailureCode::SourceNotFound,
        "the workflow script was not found",
    );
    let text_path = path.to_str().ok_or(not_found)?;
    let bytes = std::fs::read(path).map_err(|e| {
        log!("reading {}: {e}", path.display());
        not_found
    })?;
    let script = Script::parse(&bytes).map_err(|e| {
        log!("script {}: {e}", path.display());
        (
            ResolveFailureCode::CompileFailed,
            "the workflow script does not parse",
        )
    })?;
    let topology: Topology = serde_json::from_value(script.topology.clone()).map_err(|e| {
        log!("topology: {e}");
        (
            ResolveFailureCode::InvalidDefinition,
            "the script's topology is not a topology",
        )
    })?;
    if script.resolve_delay_ms > 0 {
        log!("resolving takes {} ms", script.resolve_delay_ms);
        std::thread::sleep(std::time::Duration::from_millis(script.resolve_delay_ms));
    }
    if script.reject_input {
        return Err((
            ResolveFailureCode::InvalidInput,
            "the script rejects every input",
        ));
    }
    let bad_field = (
        ResolveFailureCode::CompileFailed,
        "the script's workflowName or title is invalid",
    );
    let name = script
        .workflow_name
        .clone()
        .unwrap_or_else(|| file_stem(path));
    let name = WorkflowName::try_from(name).map_err(|_| bad_field)?;
    let title = script
        .title
        .clone()
        .map(Title::try_from)
        .transpose()
        .map_err(|_| bad_field)?;
    let canonical = canonicalize_typed(&topology).map_err(|_| {
        (
            ResolveFailureCode::InvalidDefinition,
            "the script's topology cannot be canonicalized",
        )
    })?;
    let mut fields = json!({
        "workflowName": name,
        "workflowSource": {
            "root": {"kind": "file", "path": text_path, "hash": sha256_digest(&bytes)},
            "mounted": [],
        },
        "definitionDigest": sha256_digest(&canonical),
        "topology": topology,
        "input": input,
    });
    if let Some(title) = title {
        fields["title"] = json!(title);
    }
    log!("resolved {}", path.display());
    Ok((fields, !script.resolve_only))
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .and_then(|stem| stem.to_str())
        .unwrap_or("workflow")
        .to_string()
}
