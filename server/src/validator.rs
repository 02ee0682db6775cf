//! The validation child: a supervised runner child in validate mode, the
//! only process that loads workflow code to run an agent node's `validate`
//! on a provisional submission (`kernel::interaction::submit` asked for it
//! with `Output::SpawnValidator`).
//!
//! Invariants:
//! - The child runs in its own process group with the run's saved source
//!   identity, and is killed with its group when it exits, reports, or
//!   misses its deadline. It gets the attempt, the run state and the
//!   submitted output in one `validate` command after `runner.ready`.
//! - Exactly one verdict is committed per validating submission: the
//!   child's `interaction.accepted` / `interaction.rejected`, or
//!   `validator_stopped` when it ends without one. The kernel refuses any
//!   later verdict as stale, so a recovered child that reports twice (or a
//!   verdict after a restart already decided) changes nothing.
//! - After a verdict commits, `App::submission_settled` wakes the waiting
//!   `interaction.submit` responses.

use crate::app::App;
use crate::process;
use crate::store::blobs::Blob;
use crate::store::submissions;
use crate::store::{Commit, attempts, meta, runs};
use kernel::ids::{InteractionId, RunId, SubmissionId};
use kernel::interaction::{self, Verdict};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio_stream::StreamExt;
use tokio_util::codec::FramedRead;

/// How long a validation child may take after `runner.ready` (its `validate` is bounded at 5 minutes).
const VALIDATION_BOUND: Duration = Duration::from_secs(6 * 60);

/// What the child reported.
enum Reported {
    Accepted(Value),
    Rejected(String),
    /// It ended (or missed its deadline) without a verdict.
    Stopped,
}

/// Starts the validation child of one validating submission.
pub fn spawn(
    app: &Arc<App>,
    run_id: RunId,
    interaction_id: InteractionId,
    submission_id: SubmissionId,
) {
    let app = app.clone();
    tokio::spawn(async move {
        let reported = run_child(&app, &run_id, &interaction_id, &submission_id).await;
        record(&app, &run_id, &interaction_id, &submission_id, reported).await;
    });
}

/// The launch envelope and the command of the child.
struct Prepared {
    launch: Vec<u8>,
    command: Value,
    project_path: String,
}

fn prepare(
    connection: &rusqlite::Connection,
    run_id: &RunId,
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
    validator_epoch: &str,
) -> rusqlite::Result<Option<Prepared>> {
    let (Some(meta), Some(agg), Some(record), Some(output)) = (
        meta::load(connection, run_id)?,
        runs::load(connection, run_id)?,
        runs::interaction_by_id(connection, interaction_id)?,
        submissions::payload(connection, submission_id)?,
    ) else {
        return Ok(None);
    };
    let Some(topology) = meta::topology(connection, &meta.definition_digest)? else {
        return Ok(None);
    };
    let state = attempts::run_state(connection, run_id, &meta.input_digest, &topology)?;
    let source: Value = serde_json::from_str(&meta.source_json).unwrap_or(Value::Null);
    let generation = agg.run.lease.generation.0;
    let launch = json!({
        "schema": "pi-workflows.worker-launch.v1",
        "mode": "validate",
        "runId": run_id.as_str(),
        "generation": generation,
        "runnerEpoch": validator_epoch,
        "projectPath": meta.project_path,
        "workflowSource": source,
        "definitionDigest": meta.definition_digest,
        "protocolVersion": 1,
        "validate": {
            "nodeId": record.node_id.as_str(),
            "attemptId": record.attempt_id.as_str(),
            "interactionId": interaction_id.as_str(),
            "submissionId": submission_id.as_str(),
        },
    });
    let Some(launch) = crate::wire::frames::launch(&launch) else {
        return Ok(None);
    };
    let command = json!({
        "type": "command",
        "schema": "pi-workflows.worker-launch.v1",
        "runId": run_id.as_str(),
        "generation": generation,
        "runnerEpoch": validator_epoch,
        "command": "validate",
        "node": { "nodeId": record.node_id.as_str(), "attemptId": record.attempt_id.as_str(), "visit": 1 },
        "state": { "kind": "inline", "value": state },
        "submission": { "output": output },
    });
    Ok(Some(Prepared {
        launch,
        command,
        project_path: meta.project_path,
    }))
}

async fn run_child(
    app: &Arc<App>,
    run_id: &RunId,
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
) -> Reported {
    let validator_epoch = format!("val-{}", crate::ids::random_hex::<8>());
    let (run, interaction, submission, epoch) = (
        run_id.clone(),
        interaction_id.clone(),
        submission_id.clone(),
        validator_epoch.clone(),
    );
    let prepared = app
        .store
        .read(move |connection| prepare(connection, &run, &interaction, &submission, &epoch))
        .await;
    let Ok(Some(prepared)) = prepared else {
        crate::log::line(
            "a validation child could not be prepared (its run, request or submission is gone, or its state does not fit one frame)",
        );
        return Reported::Stopped;
    };
    let Some((program, args)) = app.config.runner_command.split_first() else {
        return Reported::Stopped;
    };
    let Ok((stderr, log)) = app.runner_logs.open(&validator_epoch) else {
        return Reported::Stopped;
    };
    let directory = std::path::PathBuf::from(&prepared.project_path);
    let spawned = Command::new(program)
        .args(args)
        .current_dir(if directory.is_dir() {
            directory
        } else {
            app.config.home.clone()
        })
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn();
    let Ok(mut child) = spawned else {
        crate::log::line("cannot start a validation child; check PI_WORKFLOWS_RUNNER");
        return Reported::Stopped;
    };
    log.start();
    let identity = child.id().and_then(process::identity);
    let mut stdin = child.stdin.take();
    let mut reported = Reported::Stopped;
    if let (Some(input), Some(stdout)) = (stdin.as_mut(), child.stdout.take()) {
        let _ = input.write_all(&prepared.launch).await;
        let _ = input.flush().await;
        let mut frames = FramedRead::new(stdout, protocol::FrameCodec::new());
        let ready_deadline = Duration::from_millis(app.config.runner_ready_timeout_ms);
        let mut deadline = tokio::time::Instant::now() + ready_deadline;
        loop {
            let Ok(Some(Ok(bytes))) = tokio::time::timeout_at(deadline, frames.next()).await else {
                break;
            };
            let Ok(message) = protocol::decode_runner_frame(&bytes) else {
                break;
            };
            let value = serde_json::to_value(&message).unwrap_or(Value::Null);
            let message_id = value
                .get("messageId")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let reply = |outcome: &str| {
                json!({
                    "type": "reply",
                    "schema": "pi-workflows.worker-launch.v1",
                    "runId": run_id.as_str(),
                    "generation": prepared.command["generation"],
                    "runnerEpoch": validator_epoch,
                    "inReplyTo": message_id,
                    "outcome": outcome,
                    "result": null,
                })
            };
            let answer = match value.get("type").and_then(Value::as_str) {
                Some("runner.ready") => {
                    deadline = tokio::time::Instant::now() + VALIDATION_BOUND;
                    Some(prepared.command.clone())
                }
                Some("interaction.accepted") if matches!(reported, Reported::Stopped) => {
                    reported =
                        Reported::Accepted(value.get("output").cloned().unwrap_or(Value::Null));
                    Some(reply("accepted"))
                }
                Some("interaction.rejected") if matches!(reported, Reported::Stopped) => {
                    let message = value
                        .pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or("the workflow's validate refused the output");
                    reported = Reported::Rejected(message.to_owned());
                    Some(reply("accepted"))
                }
                Some("runner.exiting") => break,
                // Anything else is not part of a validation child's protocol.
                _ => Some(reply("rejected")),
            };
            if let Some(frame) = answer.as_ref().and_then(crate::wire::frames::runner)
                && (input.write_all(&frame).await.is_err() || input.flush().await.is_err())
            {
                break;
            }
        }
    }
    drop(stdin);
    if let Some(identity) = identity {
        process::signal_group(&identity, Signal::SIGKILL);
    }
    let _ = child.wait().await;
    reported
}

/// Commits the verdict (or the stop) of one validating submission and wakes its waiters.
async fn record(
    app: &Arc<App>,
    run_id: &RunId,
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
    reported: Reported,
) {
    let (run_id, interaction_id, submission_id) = (
        run_id.clone(),
        interaction_id.clone(),
        submission_id.clone(),
    );
    let output_blob = match &reported {
        Reported::Accepted(output) => Some(Blob::json(output)),
        Reported::Rejected(_) | Reported::Stopped => None,
    };
    let control = app.control.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    let written = app
        .store
        .write(move |connection| {
            let now_ms = crate::clock::now_ms();
            let (Some(mut agg), Some(record)) = (
                runs::load(connection, &run_id)?,
                runs::interaction_by_id(connection, &interaction_id)?,
            ) else {
                return Ok(Commit::Discard(Vec::new()));
            };
            agg.interaction = Some(record);
            let stored = submissions::of_interaction(connection, &interaction_id)?;
            let decided: Result<Verdict, _> = match &reported {
                Reported::Accepted(_) => interaction::validation_accepted(&agg, &stored, &interaction_id, &submission_id, now_ms),
                Reported::Rejected(_) => interaction::validation_rejected(&agg, &stored, &interaction_id, &submission_id, now_ms),
                Reported::Stopped => interaction::validator_stopped(&agg, &stored, &interaction_id, &submission_id, now_ms),
            };
            let Ok(verdict) = decided else {
                // A stale verdict (already decided, or the run ended): nothing changes.
                return Ok(Commit::Discard(Vec::new()));
            };
            runs::write(connection, Some(&agg), &verdict.run.facts, &verdict.run.outputs, now_ms)?;
            let error = match &reported {
                Reported::Rejected(message) => Some(message.as_str()),
                Reported::Stopped => Some("the validation child stopped before it reported a verdict; submit the output again"),
                Reported::Accepted(_) => None,
            };
            submissions::settle(connection, &verdict.submission, error, output_blob.as_ref(), now_ms)?;
            let mut outputs = verdict.run.outputs;
            // An accepted origin-session submission finishes its waiting attempt here.
            if let Some(follow_up) = &verdict.follow_up {
                outputs.extend(crate::coordinator::apply_attempt_follow_up(connection, &control, ttl_ms, follow_up, now_ms)?);
            }
            Ok(Commit::Keep(outputs))
        })
        .await;
    if let Ok(outputs) = written {
        app.perform(outputs);
    }
    app.submission_settled.notify_waiters();
}

/// Startup recovery step 9: every submission still `validating` gets a new child.
pub async fn resume_validating(app: &Arc<App>) {
    let Ok(validating) = app.store.read(submissions::validating).await else {
        return;
    };
    for (run_id, interaction_id, submission_id) in validating {
        spawn(app, run_id, interaction_id, submission_id);
    }
}
