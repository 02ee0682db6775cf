//! The source resolver: a supervised runner child in resolve mode that
//! discovers a workflow, hashes its sources, compiles it and returns the
//! topology the kernel routes on. The server never loads workflow code.
//!
//! Invariants:
//! - The child runs in its own process group and is killed (with its group)
//!   when it fails, misses its deadline, or answers without `awaitsRun`.
//! - A child that answered `resolve.result` with `awaitsRun` is returned as a
//!   [`WaitingResolver`] (its stdout after that one frame unread, its stdin
//!   open): the caller holds it for its run's first launch, and dropping it
//!   kills its group (`context::waiting`).

use crate::context::Context;
use crate::context::waiting::{ResolverProcess, WaitingResolver};
use crate::process;
use kernel::topology::Topology;
use nix::sys::signal::Signal;
use protocol::ErrorCode;
use protocol::generated::constrained::{Generation, ProtocolVersion};
use protocol::generated::types::{
    LaunchMode, ResolveFailureCode, ResolveTarget, RunnerMessage, WorkerLaunch, WorkerSchemaId,
};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;
use tokio_util::codec::FramedRead;

/// A resolved workflow.
#[derive(Debug)]
pub struct Resolved {
    pub workflow_name: String,
    pub title: Option<String>,
    /// `{root, mounted}` as the runner reported it.
    pub source: Value,
    pub definition_digest: String,
    pub topology: Topology,
    pub topology_json: String,
    /// The normalized input.
    pub input: Value,
    /// The resolving process, when it said it awaits its run's launch.
    pub waiting: Option<WaitingResolver>,
}

/// Why resolution failed: a closed code and a one-line safe message.
#[derive(Clone, Debug)]
pub struct ResolveError {
    pub code: ErrorCode,
    pub message: String,
}

impl ResolveError {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Resolves `workflow` for `project_path` with `input` in a child process.
pub async fn resolve(
    app: &Arc<Context>,
    project_path: &str,
    workflow: &str,
    input: &Value,
) -> Result<Resolved, ResolveError> {
    let run_id = format!("resolve-{}", crate::ids::random_hex::<8>());
    let launch = || {
        Some(WorkerLaunch {
            agent_model: None,
            definition_digest: None,
            execution_mode: None,
            generation: Generation::new(0)?,
            input_hash: None,
            mode: LaunchMode::Resolve,
            project_path: project_path.parse().ok()?,
            protocol_version: ProtocolVersion::new(1)?,
            resolve: Some(ResolveTarget {
                input: input.clone(),
                workflow: workflow.parse().ok()?,
            }),
            run_id: run_id.parse().ok()?,
            runner_epoch: format!("{run_id}-0").parse().ok()?,
            schema: WorkerSchemaId::PiWorkflowsWorkerLaunchV1,
            validate: None,
            workflow_source: None,
        })
    };
    let frame = launch()
        .as_ref()
        .and_then(crate::wire::frames::launch)
        .ok_or_else(|| {
            ResolveError::new(
                ErrorCode::FrameTooLarge,
                "the workflow input does not fit one 1 MiB frame",
            )
        })?;
    let (program, args) = app.config.runner_command.split_first().ok_or_else(|| {
        ResolveError::new(
            ErrorCode::Unavailable,
            "no runner program is configured; set PI_WORKFLOWS_RUNNER",
        )
    })?;
    let (stderr, log) = app
        .runner_logs
        .open(&run_id)
        .map_err(|_| ResolveError::new(ErrorCode::Unavailable, "cannot open the resolver log"))?;
    let mut child = super::child_command(
        program,
        args,
        std::path::Path::new(project_path),
        &app.config.home,
        stderr,
    )
    .spawn()
    .map_err(|_| {
        ResolveError::new(
            ErrorCode::Unavailable,
            "cannot start the workflow runner; check PI_WORKFLOWS_RUNNER or reinstall pi-workflows",
        )
    })?;
    let log = log.start();
    let identity = child.id().and_then(process::identity);
    let mut stdin = child.stdin.take();
    if let Some(stdin) = stdin.as_mut() {
        let _ = stdin.write_all(&frame).await;
        let _ = stdin.flush().await;
    }
    let deadline = Duration::from_millis(app.config.runner_ready_timeout_ms);
    let (answer, frames) = match child.stdout.take() {
        Some(stdout) => {
            let mut frames = FramedRead::new(stdout, protocol::FrameCodec::new());
            let answer = match tokio::time::timeout(deadline, frames.next()).await {
                Ok(Some(Ok(bytes))) => decode(&bytes),
                Ok(_) => Err(ResolveError::new(
                    ErrorCode::ValidationFailed,
                    "the workflow runner exited without resolving the workflow (see the runner log)",
                )),
                Err(_) => Err(ResolveError::new(
                    ErrorCode::TimedOut,
                    "the workflow runner did not resolve the workflow in time",
                )),
            };
            (answer, Some(frames))
        }
        None => (
            Err(ResolveError::new(
                ErrorCode::Unavailable,
                "cannot read from the workflow runner",
            )),
            None,
        ),
    };
    match (answer, identity.clone(), stdin.take(), frames) {
        // It awaits its run: the caller holds it (dropping it kills the group).
        (Ok((mut resolved, true)), Some(identity), Some(stdin), Some(frames)) => {
            resolved.waiting = Some(WaitingResolver::new(ResolverProcess {
                child,
                stdin,
                frames,
                identity,
                log,
            }));
            Ok(resolved)
        }
        (answer, _, stdin, _) => {
            drop(stdin);
            if let Some(identity) = identity {
                process::signal_group(&identity, Signal::SIGKILL);
            }
            let _ = child.wait().await;
            answer.map(|(resolved, _)| resolved)
        }
    }
}

/// The resolved workflow, and whether its resolver awaits the run.
fn decode(bytes: &[u8]) -> Result<(Resolved, bool), ResolveError> {
    let message = protocol::decode_runner_frame(bytes).map_err(|_| {
        ResolveError::new(
            ErrorCode::Internal,
            "the workflow runner sent an invalid frame",
        )
    })?;
    match message {
        RunnerMessage::ResolveResult {
            awaits_run,
            definition_digest,
            input,
            title,
            topology,
            workflow_name,
            workflow_source,
            ..
        } => {
            // The wire topology is the kernel's, checked again by the kernel.
            let topology_value = serde_json::to_value(&topology).unwrap_or(Value::Null);
            let topology: Topology =
                serde_json::from_value(topology_value.clone()).map_err(|_| {
                    ResolveError::new(
                        ErrorCode::ValidationFailed,
                        "the workflow graph could not be read",
                    )
                })?;
            topology.validate().map_err(|_| {
                ResolveError::new(
                    ErrorCode::ValidationFailed,
                    "the workflow graph is invalid (check startAt, edges and reachability)",
                )
            })?;
            if crate::projection::run_view::graph_projection_bytes(&topology)
                > crate::projection::run_view::GRAPH_PROJECTION_BYTES
            {
                return Err(ResolveError::new(
                    ErrorCode::ValidationFailed,
                    "the workflow graph is too large to show: its nodes and edges take more than 256 KiB in a run view; use fewer nodes or switch cases",
                ));
            }
            let resolved = Resolved {
                workflow_name: workflow_name.to_string(),
                title: title.map(String::from),
                source: serde_json::to_value(&workflow_source).unwrap_or(Value::Null),
                definition_digest: definition_digest.to_string(),
                topology_json: serde_json::to_string(&topology_value).unwrap_or_default(),
                topology,
                input,
                waiting: None,
            };
            Ok((resolved, awaits_run.is_some()))
        }
        RunnerMessage::ResolveFailed { code, message, .. } => {
            let code = match code {
                ResolveFailureCode::SourceNotFound => ErrorCode::NotFound,
                ResolveFailureCode::SourceChanged => ErrorCode::SourceChanged,
                ResolveFailureCode::InvalidInput
                | ResolveFailureCode::CompileFailed
                | ResolveFailureCode::InvalidDefinition => ErrorCode::ValidationFailed,
            };
            Err(ResolveError::new(code, bounded(&message)))
        }
        // A resolve-mode child sends only its result or its failure.
        RunnerMessage::RunnerReady { .. }
        | RunnerMessage::NodeStarted { .. }
        | RunnerMessage::NodeUpdate { .. }
        | RunnerMessage::NodeFinished { .. }
        | RunnerMessage::NodeFailed { .. }
        | RunnerMessage::RunParked { .. }
        | RunnerMessage::RunFinished { .. }
        | RunnerMessage::InteractionRequested { .. }
        | RunnerMessage::InteractionAccepted { .. }
        | RunnerMessage::InteractionRejected { .. }
        | RunnerMessage::NotificationRequested { .. }
        | RunnerMessage::PresentationRequested { .. }
        | RunnerMessage::EffectReserve { .. }
        | RunnerMessage::EffectSettle { .. }
        | RunnerMessage::RunnerProgress { .. }
        | RunnerMessage::RunnerExiting { .. }
        | RunnerMessage::ContentRead { .. } => Err(ResolveError::new(
            ErrorCode::Internal,
            "the workflow runner answered with an unexpected message",
        )),
    }
}

/// Resolver messages describe the user's own workflow; keep them one bounded line.
fn bounded(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(300).collect()
}
