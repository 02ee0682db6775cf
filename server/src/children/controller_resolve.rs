//! The controller child in resolve mode (`resource.apply`): a supervised
//! child that loads the controller module, finds its definition and
//! computes `initialStatus(spec)` and the source digest. The server never
//! loads controller code.
//!
//! The channel is the private controller.v1 NDJSON channel
//! (`protocol/runner.v1.schema.json` `$defs`: `ControllerLaunch`,
//! `ControllerChildMessage`, `ControllerServerMessage`): the server writes
//! the launch, reads one message, replies to it, and the child exits.
//!
//! Invariants:
//! - The child runs the `PI_WORKFLOWS_CONTROLLER_RUNNER` command in its own
//!   process group with its stderr in the runner logs; its group is killed
//!   once the answer was read (after a short grace for its own exit), on any
//!   failure, and at the deadline (`PI_WORKFLOWS_READY_TIMEOUT_MS`).
//! - Only `resolved` and `resolveFailed` are answers; anything else, an
//!   over-long or invalid line or an exit without an answer is a failure
//!   with a closed code and a one-line message. No spec or status content
//!   reaches an error or a log line (the child's own failure message is its
//!   controller's, cut to one bounded line).

use super::resolver::ResolveError;
use crate::context::Context;
use crate::process;
use kernel::ids::Digest;
use nix::sys::signal::Signal;
use protocol::ErrorCode;
use protocol::generated::constrained::Sequence;
use protocol::generated::types::{
    ControllerChildMessage, ControllerLaunch, ControllerServerMessage,
    ControllerServerMessageOutcome, ResolveFailureCode,
};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;
use tokio_util::codec::{FramedRead, LinesCodec};

/// The longest channel line, in bytes.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// How long a child that answered may take to exit before its group is killed.
const EXIT_GRACE: Duration = Duration::from_millis(2_000);

/// What the child resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerResolved {
    pub export_name: String,
    pub initial_status: Value,
    /// The digest of the exact source bytes the child loaded.
    pub source_digest: Digest,
    pub timeout_ms: Option<u64>,
}

fn error(code: ErrorCode, message: impl Into<String>) -> ResolveError {
    ResolveError {
        code,
        message: message.into(),
    }
}

/// `sha256:<64 hex>` as a kernel digest.
pub fn parse_digest(text: &str) -> Option<Digest> {
    let hex_text = text.strip_prefix("sha256:")?;
    let bytes = hex::decode(hex_text).ok()?;
    Some(Digest(bytes.try_into().ok()?))
}

/// Resolves the controller `controller` at `controller_path` for `spec`.
pub async fn resolve(
    app: &Arc<Context>,
    controller: &str,
    controller_path: &Path,
    project_path: &Path,
    spec: &Value,
) -> Result<ControllerResolved, ResolveError> {
    let launch = (|| {
        Some(ControllerLaunch::ControllerResolve {
            controller: controller.parse().ok()?,
            controller_path: controller_path.to_str()?.parse().ok()?,
            project_path: project_path.to_str()?.parse().ok()?,
            spec: spec.clone(),
        })
    })()
    .ok_or_else(|| {
        error(
            ErrorCode::SchemaInvalid,
            "the controller name or a path is not valid for a controller child",
        )
    })?;
    let mut line = protocol::canonicalize_typed(&launch).map_err(|_| {
        error(
            ErrorCode::SchemaInvalid,
            "the spec cannot be encoded as JSON",
        )
    })?;
    if line.len() >= MAX_LINE_BYTES {
        return Err(error(
            ErrorCode::FrameTooLarge,
            "the spec does not fit one 1 MiB controller line; make it smaller",
        ));
    }
    line.push(b'\n');
    let (program, args) = app.config.controller_command.split_first().ok_or_else(|| {
        error(
            ErrorCode::Unavailable,
            "no controller program is configured; set PI_WORKFLOWS_CONTROLLER_RUNNER",
        )
    })?;
    let log_name = format!("controller-resolve-{}", crate::ids::random_hex::<8>());
    let (stderr, log) = app.runner_logs.open(&log_name).map_err(|_| {
        error(
            ErrorCode::Unavailable,
            "cannot open the controller log; check the disk holding PI_WORKFLOWS_HOME",
        )
    })?;
    let mut child = super::child_command(program, args, project_path, &app.config.home, stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|_| {
            error(
                ErrorCode::Unavailable,
                "cannot start the controller child; check PI_WORKFLOWS_CONTROLLER_RUNNER or reinstall pi-workflows",
            )
        })?;
    let _log = log.start();
    let identity = child.id().and_then(process::identity);
    let mut stdin = child.stdin.take();
    if let Some(stdin) = stdin.as_mut() {
        let _ = stdin.write_all(&line).await;
        let _ = stdin.flush().await;
    }
    let deadline = Duration::from_millis(app.config.runner_ready_timeout_ms);
    let answer = match child.stdout.take() {
        Some(stdout) => {
            let mut lines =
                FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_LINE_BYTES));
            match tokio::time::timeout(deadline, lines.next()).await {
                Ok(Some(Ok(text))) => decode(&text),
                Ok(Some(Err(_))) => Err(error(
                    ErrorCode::FrameTooLarge,
                    "the controller child sent an invalid or over-long line (see the runner log)",
                )),
                Ok(None) => Err(error(
                    ErrorCode::ValidationFailed,
                    "the controller child exited without resolving the controller (see the runner log)",
                )),
                Err(_) => Err(error(
                    ErrorCode::TimedOut,
                    "the controller child did not resolve the controller in time; check the controller module, then apply again",
                )),
            }
        }
        None => Err(error(
            ErrorCode::Unavailable,
            "cannot read from the controller child",
        )),
    };
    // Each answer gets its reply (the child waits for it before it exits).
    if let (Ok((request_id, _)), Some(stdin)) = (&answer, stdin.as_mut()) {
        let reply = ControllerServerMessage {
            kind: "reply".into(),
            request_id: *request_id,
            outcome: ControllerServerMessageOutcome::Accepted,
            code: None,
            message: None,
            effect: None,
            effect_action: None,
            finish_outcome: None,
            workflow_request: None,
        };
        if let Ok(mut bytes) = protocol::canonicalize_typed(&reply) {
            bytes.push(b'\n');
            let _ = stdin.write_all(&bytes).await;
            let _ = stdin.flush().await;
        }
    }
    drop(stdin);
    if answer.is_ok() {
        let _ = tokio::time::timeout(EXIT_GRACE, child.wait()).await;
    }
    if let Some(identity) = identity {
        process::signal_group(&identity, Signal::SIGKILL);
    }
    let _ = child.wait().await;
    answer.and_then(|(_, resolved)| resolved)
}

/// The answer's request id and what it says.
type Answer = (Sequence, Result<ControllerResolved, ResolveError>);

fn decode(text: &str) -> Result<Answer, ResolveError> {
    let message: ControllerChildMessage = serde_json::from_str(text).map_err(|_| {
        error(
            ErrorCode::Internal,
            "the controller child sent an invalid message (see the runner log)",
        )
    })?;
    match message {
        ControllerChildMessage::Resolved {
            export_name,
            initial_status,
            request_id,
            source_digest,
            timeout_ms,
        } => {
            let digest = parse_digest(&source_digest).ok_or_else(|| {
                error(
                    ErrorCode::Internal,
                    "the controller child sent an invalid source digest",
                )
            })?;
            Ok((
                request_id,
                Ok(ControllerResolved {
                    export_name: export_name.to_string(),
                    initial_status,
                    source_digest: digest,
                    timeout_ms: timeout_ms.map(|ms| ms.get()),
                }),
            ))
        }
        ControllerChildMessage::ResolveFailed {
            code,
            message,
            request_id,
        } => {
            let code = match code {
                ResolveFailureCode::SourceNotFound => ErrorCode::NotFound,
                ResolveFailureCode::SourceChanged => ErrorCode::SourceChanged,
                ResolveFailureCode::InvalidInput
                | ResolveFailureCode::CompileFailed
                | ResolveFailureCode::InvalidDefinition => ErrorCode::ValidationFailed,
            };
            Ok((request_id, Err(error(code, bounded(&message)))))
        }
        // A resolve-mode child sends only its result or its failure.
        ControllerChildMessage::EffectEnsure { .. }
        | ControllerChildMessage::EffectObserved { .. }
        | ControllerChildMessage::EffectSettled { .. }
        | ControllerChildMessage::WorkflowEnsure { .. }
        | ControllerChildMessage::Finished { .. }
        | ControllerChildMessage::Failed { .. } => Err(error(
            ErrorCode::Internal,
            "the controller child answered resolve with a reconcile message",
        )),
    }
}

/// A controller's failure message: one bounded line.
fn bounded(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_sha256_and_64_hex_digits() {
        let text = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(parse_digest(&text), Some(Digest::repeat(0xab)));
        assert_eq!(parse_digest(&"ab".repeat(32)), None);
        assert_eq!(parse_digest("sha256:abcd"), None);
    }
}
