//! The validation child: a supervised runner child in validate mode, the
//! only process that loads workflow code to run an agent node's `validate`
//! on a provisional submission (`kernel::interaction::submit` asked for it
//! with `Output::SpawnValidator`).
//!
//! Invariants:
//! - The child runs in its own process group with the run's saved source
//!   identity, and is killed with its group when it exits, reports, or
//!   misses its deadline, and (checked every claim renewal period, a
//!   SIGSTOPped child too) as soon as its verdict can no longer count
//!   (`interaction::validation_abandoned` no longer refuses: its run ended
//!   or its request closed) or the server is stopping. It gets the attempt, the run state and the
//!   submitted output in one `validate` command after `runner.ready`.
//! - Exactly one verdict is committed per validating submission: the
//!   child's `interaction.accepted` / `interaction.rejected`, or
//!   `validator_stopped` when it ends without one. The kernel refuses any
//!   later verdict as stale, so a recovered child that reports twice (or a
//!   verdict after a restart already decided) changes nothing.
//! - After a verdict commits, `Context::submission_settled` wakes the waiting
//!   `interaction.submit` responses.
//! - Children are admitted by the scheduler (`scheduler.rs`) from the
//!   durable `validating` rows, never started directly: at most one child
//!   per submission is in flight ([`Validations`]). A child takes an
//!   execution slot, except the child of a run whose live runner waits for
//!   the submission's outcome (a headless run): it works in that runner's
//!   slot, because the runner cannot finish before it reports, and a
//!   capacity full of such runners would otherwise never validate.
//! - A submission that no verdict can settle any more (its request closed
//!   or its run ended while it validated) is abandoned as rejected
//!   (`interaction::validation_abandoned`), so none stays `validating`.

use crate::context::Context;
use crate::process;
use crate::store::blobs::Blob;
use crate::store::submissions;
use crate::store::{Commit, attempts, meta, runs};
use kernel::ids::{InteractionId, RunId, SubmissionId};
use kernel::interaction::{self, Verdict};
use nix::sys::signal::Signal;
use protocol::generated::constrained::{Generation, ProtocolVersion};
use protocol::generated::types::{
    LaunchMode, ReplyOutcome, RunnerCommandKind, RunnerMessage, ServerMessage, ValidateTarget,
    WorkerLaunch, WorkerSchemaId,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
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

/// One validating submission the scheduler may admit.
#[derive(Clone, Debug)]
pub struct Job {
    pub run_id: RunId,
    pub interaction_id: InteractionId,
    pub submission_id: SubmissionId,
    pub submitted_at_ms: u64,
    /// Its run has a live runner of this server, whose slot the child works in.
    pub runner_is_live: bool,
}

/// The validating submissions without a child in flight (the scheduler's
/// candidates); `in_flight` is the set of children in flight taken before
/// this read's snapshot.
pub fn waiting(
    app: &Context,
    in_flight: &BTreeSet<SubmissionId>,
    connection: &rusqlite::Connection,
) -> rusqlite::Result<Vec<Job>> {
    let mut jobs = Vec::new();
    for (run_id, interaction_id, submission_id, submitted_at_ms) in
        submissions::validating(connection)?
    {
        if in_flight.contains(&submission_id) {
            continue;
        }
        // A runner of this server (the durable record of a previous
        // server's runner stays live until it expires).
        let runner_is_live = app.runners.runner_of(&run_id).is_some();
        jobs.push(Job {
            run_id,
            interaction_id,
            submission_id,
            submitted_at_ms,
            runner_is_live,
        });
    }
    Ok(jobs)
}

/// Starts the validation child of one admitted job (the scheduler's call);
/// `takes_slot` says whether it counts against capacity while in flight.
pub fn start(app: &Arc<Context>, job: Job, takes_slot: bool) {
    {
        let mut in_flight = app.validations.in_flight.lock().expect("validations lock");
        if in_flight.contains_key(&job.submission_id) {
            return;
        }
        in_flight.insert(job.submission_id.clone(), takes_slot);
    }
    let app = app.clone();
    tokio::spawn(async move {
        let Job {
            run_id,
            interaction_id,
            submission_id,
            ..
        } = job;
        let reported = run_child(&app, &run_id, &interaction_id, &submission_id).await;
        record(&app, &run_id, &interaction_id, &submission_id, reported).await;
        // After the commit: the row is no longer `validating` (or a failed
        // commit leaves it for the next admission round).
        let mut in_flight = app.validations.in_flight.lock().expect("validations lock");
        in_flight.remove(&submission_id);
        drop(in_flight);
        app.scheduler.notify();
    });
}

/// The launch envelope and the command of the child.
struct Prepared {
    launch: Vec<u8>,
    command: ServerMessage,
    generation: Generation,
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
    let generation = agg.run.lease.generation.0;
    let launch = || {
        Some(WorkerLaunch {
            agent_model: None,
            definition_digest: Some(meta.definition_digest.parse().ok()?),
            execution_mode: None,
            generation: Generation::new(generation)?,
            input_hash: None,
            mode: LaunchMode::Validate,
            project_path: meta.project_path.parse().ok()?,
            protocol_version: ProtocolVersion::new(1)?,
            resolve: None,
            run_id: run_id.as_str().parse().ok()?,
            runner_epoch: validator_epoch.parse().ok()?,
            schema: WorkerSchemaId::PiWorkflowsWorkerLaunchV1,
            validate: Some(ValidateTarget {
                attempt_id: record.attempt_id.as_str().parse().ok()?,
                interaction_id: interaction_id.as_str().parse().ok()?,
                node_id: record.node_id.as_str().parse().ok()?,
                submission_id: submission_id.as_str().parse().ok()?,
            }),
            workflow_source: Some(serde_json::from_str(&meta.source_json).ok()?),
        })
    };
    let Some(launch) = launch().as_ref().and_then(crate::wire::frames::launch) else {
        return Ok(None);
    };
    let (Some(command), Some(generation)) = (
        crate::wire::runner::command(
            run_id.as_str(),
            generation,
            validator_epoch,
            RunnerCommandKind::Validate,
            (record.node_id.as_str(), record.attempt_id.as_str(), 1),
            state,
            None,
            Some(output),
        ),
        Generation::new(generation),
    ) else {
        return Ok(None);
    };
    Ok(Some(Prepared {
        launch,
        command,
        generation,
        project_path: meta.project_path,
    }))
}

async fn run_child(
    app: &Arc<Context>,
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
    let spawned = super::child_command(
        program,
        args,
        std::path::Path::new(&prepared.project_path),
        &app.config.home,
        stderr,
    )
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
        // While the child works, the kernel is asked whether its verdict can
        // still count (a cancelled run, a closed request) and the server
        // whether it is stopping; either ends the child now, a stopped
        // (SIGSTOP) or hung one too, instead of at its bound.
        let mut check = tokio::time::interval(app.config.claim_renew_interval());
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout_at(deadline, frames.next()) => next,
                _ = check.tick() => {
                    if app.is_stopping() || !verdict_counts(app, run_id, interaction_id, submission_id).await {
                        crate::log::line("a validation child was ended: its verdict can no longer count, or the server is stopping");
                        break;
                    }
                    continue;
                }
            };
            let Ok(Some(Ok(bytes))) = next else {
                break;
            };
            let Ok(message) = protocol::decode_runner_frame(&bytes) else {
                break;
            };
            let message_id = crate::wire::runner::envelope(&message).message_id;
            let reply = |outcome: ReplyOutcome| {
                Some(ServerMessage::Reply {
                    error: None,
                    generation: prepared.generation,
                    in_reply_to: message_id.parse().ok()?,
                    next: None,
                    outcome,
                    result: Value::Null,
                    result_content: None,
                    revision: None,
                    run_id: run_id.as_str().parse().ok()?,
                    runner_epoch: validator_epoch.parse().ok()?,
                    schema: WorkerSchemaId::PiWorkflowsWorkerLaunchV1,
                })
            };
            let answer = match message {
                RunnerMessage::RunnerReady { .. } => {
                    deadline = tokio::time::Instant::now() + VALIDATION_BOUND;
                    Some(prepared.command.clone())
                }
                RunnerMessage::InteractionAccepted { output, .. }
                    if matches!(reported, Reported::Stopped) =>
                {
                    reported = Reported::Accepted(output);
                    reply(ReplyOutcome::Accepted)
                }
                RunnerMessage::InteractionRejected { error, .. }
                    if matches!(reported, Reported::Stopped) =>
                {
                    reported = Reported::Rejected(error.message.to_string());
                    reply(ReplyOutcome::Accepted)
                }
                RunnerMessage::RunnerExiting { .. } => break,
                // Not part of a validation child's protocol (or a second verdict).
                RunnerMessage::InteractionAccepted { .. }
                | RunnerMessage::InteractionRejected { .. }
                | RunnerMessage::NodeStarted { .. }
                | RunnerMessage::NodeUpdate { .. }
                | RunnerMessage::NodeFinished { .. }
                | RunnerMessage::NodeFailed { .. }
                | RunnerMessage::RunParked { .. }
                | RunnerMessage::RunFinished { .. }
                | RunnerMessage::InteractionRequested { .. }
                | RunnerMessage::NotificationRequested { .. }
                | RunnerMessage::PresentationRequested { .. }
                | RunnerMessage::EffectReserve { .. }
                | RunnerMessage::EffectSettle { .. }
                | RunnerMessage::RunnerProgress { .. }
                | RunnerMessage::ContentRead { .. }
                | RunnerMessage::ResolveResult { .. }
                | RunnerMessage::ResolveFailed { .. } => reply(ReplyOutcome::Rejected),
            };
            if let Some(frame) = answer
                .as_ref()
                .and_then(crate::wire::frames::server_message)
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

/// Whether a verdict on `submission_id` can still count: the kernel
/// (`interaction::validation_abandoned`) refuses to abandon it because its
/// request is pending in a live run. A read that fails keeps the child.
async fn verdict_counts(
    app: &Arc<Context>,
    run_id: &RunId,
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
) -> bool {
    let (run_id, interaction_id, submission_id) = (
        run_id.clone(),
        interaction_id.clone(),
        submission_id.clone(),
    );
    app.store
        .read(move |connection| {
            let (Some(mut agg), Some(record)) = (
                runs::load(connection, &run_id)?,
                runs::interaction_by_id(connection, &interaction_id)?,
            ) else {
                return Ok(false);
            };
            agg.interaction = Some(record);
            let stored = submissions::of_interaction(connection, &interaction_id)?;
            Ok(matches!(
                interaction::validation_abandoned(&agg, &stored, &interaction_id, &submission_id),
                Err(interaction::InteractionRejection::ValidationInProgress { .. })
            ))
        })
        .await
        .unwrap_or(true)
}

/// Commits the verdict (or the stop) of one validating submission and wakes its waiters.
async fn record(
    app: &Arc<Context>,
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
    let _ = crate::shell::transact(app, move |connection, now_ms| {
            let (Some(mut agg), Some(record)) = (
                runs::load(connection, &run_id)?,
                runs::interaction_by_id(connection, &interaction_id)?,
            ) else {
                return Ok(Commit::Discard(((), Vec::new())));
            };
            agg.interaction = Some(record);
            let stored = submissions::of_interaction(connection, &interaction_id)?;
            let decided: Result<Verdict, _> = match &reported {
                Reported::Accepted(_) => interaction::validation_accepted(&agg, &stored, &interaction_id, &submission_id, now_ms),
                Reported::Rejected(_) => interaction::validation_rejected(&agg, &stored, &interaction_id, &submission_id, now_ms),
                Reported::Stopped => interaction::validator_stopped(&agg, &stored, &interaction_id, &submission_id, now_ms),
            };
            let verdict = match decided {
                Ok(verdict) => verdict,
                Err(_) => {
                    // No verdict counts any more: an already settled submission
                    // changes nothing; one whose request closed is abandoned.
                    return match interaction::validation_abandoned(&agg, &stored, &interaction_id, &submission_id) {
                        Ok(abandoned) => {
                            submissions::settle(connection, &abandoned, Some("the step's request closed before its validation finished"), None, now_ms)?;
                            Ok(Commit::Keep(((), Vec::new())))
                        }
                        Err(_) => Ok(Commit::Discard(((), Vec::new()))),
                    };
                }
            };
            let mut outputs = crate::shell::write_transition(connection, Some(&agg), verdict.run, &[], now_ms)?;
            let error = match &reported {
                Reported::Rejected(message) => Some(message.as_str()),
                Reported::Stopped => Some("the validation child stopped before it reported a verdict; submit the output again"),
                Reported::Accepted(_) => None,
            };
            submissions::settle(connection, &verdict.submission, error, output_blob.as_ref(), now_ms)?;
            // An accepted origin-session submission finishes its waiting attempt here.
            if let Some(follow_up) = &verdict.follow_up {
                outputs.extend(crate::attempt_follow_up::apply(connection, &control, ttl_ms, follow_up, now_ms)?);
            }
            Ok(Commit::Keep(((), outputs)))
        })
        .await;
    app.submission_settled.notify_waiters();
}

/// Startup recovery step 9: every submission still `validating` gets a new
/// child, admitted by the scheduler (no child of the previous server is in
/// flight, so each is a candidate of the next admission round).
pub async fn resume_validating(app: &Arc<Context>) {
    app.scheduler.notify();
}
