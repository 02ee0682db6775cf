//! Commands on runs: `run.start` (resolve, reserve, admit), `run.pause`,
//! `run.resume`, `run.cancel`, `run.restart`, `run.activate` and
//! `checkpoint.answer`, each decided by `kernel::run` inside its receipt job.

use super::receipts::{Executed, command, command_committed, precheck};
use super::request::{Request, required_run_id};
use crate::children::resolver;
use crate::context::Context;
use crate::projection::run_view::{OffSchema, to_wire};
use crate::store::blobs::{self, Blob};
use crate::store::meta::{self, RunMeta};
use crate::store::{intents, launches, runs};
use crate::wire::client::response;
use kernel::claim::{Authority, ClaimRequest};
use kernel::ids::{Digest, MessageId, RunId, SessionId};
use kernel::intent::Canceller;
use kernel::launch::{self, LaunchKind, LaunchRequest, Reservation, Selected};
use kernel::output::Step;
use kernel::receipt::CommandOutcome;
use kernel::run::{self, ExecutionMode, Lineage, NewRun, RunAggregate};
use protocol::ErrorCode;
use protocol::generated::types::{
    CheckpointAnswerReceipt, ExecutionMode as WireExecutionMode, RunControlReceipt,
    RunRestartPayload, RunRestartReceipt, RunStartPayload, RunStartReceipt, SelectedLaunch,
};
use rusqlite::Connection;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub(super) async fn run_start(
    app: &Arc<Context>,
    request: Request,
    payload: RunStartPayload,
) -> Value {
    let workflow = payload.workflow.to_string();
    let project_path = payload.project_path.to_string();
    let origin = payload.origin_session_id.map(String::from);
    let mode = match (payload.execution_mode, origin) {
        (WireExecutionMode::Interactive, Some(session)) => ExecutionMode::Interactive {
            origin_session: SessionId::new(session),
        },
        (WireExecutionMode::Headless, None) => ExecutionMode::Headless,
        _ => {
            return response(
                &request.request_id,
                "run.start",
                "rejected",
                None,
                None,
                Some((
                    ErrorCode::SchemaInvalid,
                    "interactive runs need originSessionId; headless runs take none".into(),
                )),
            );
        }
    };
    // A retry of a start that already committed adopts it without resolving again.
    if let Some(adopted) = precheck(app, &request).await {
        return adopted;
    }
    let selected = payload.selected_launch;
    // A selected launch is always held: it runs after its decision turn settles.
    let held = payload.held == Some(true) || selected.is_some();
    let input = payload.input;
    let launch_fingerprint = launch::request_fingerprint(LaunchKind::Start {
        workflow_ref: &workflow,
        input_digest: Blob::json(&input).digest,
    });
    // Set when the job adopted the decision turn's earlier launch: no new run.
    let adopted = Arc::new(AtomicBool::new(false));
    let job_adopted = adopted.clone();
    // The schema checked its fields; stored canonical, handed to every runner launch.
    let agent_model_json = payload
        .agent_model
        .as_ref()
        .and_then(|model| serde_json::to_value(model).ok())
        .and_then(|model| protocol::canonicalize(&model).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok());
    let resolved = resolver::resolve(app, &project_path, &workflow, &input).await;
    let run_id = RunId::new(crate::ids::run_id(
        workflow_stem(&workflow),
        crate::clock::now_ms(),
    ));
    let prepared = resolved.map(|mut resolved| {
        // The resolver that awaits its run is held before the job, so the
        // run's first admission (which may follow the commit at once) finds it.
        if let Some(waiting) = resolved.waiting.take() {
            app.waiting.hold(run_id.clone(), waiting);
        }
        let input_blob = Blob::json(&resolved.input);
        let source_json = serde_json::to_string(&resolved.source).unwrap_or_default();
        (resolved, input_blob, source_json)
    });
    let job_run_id = run_id.clone();
    let (response, committed) = command_committed(app, request, move |connection, now_ms| {
        let run_id = job_run_id;
        let (resolved, input_blob, source_json) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                return Ok(Executed::refused(
                    CommandOutcome::Rejected,
                    error.code,
                    error.message,
                ));
            }
        };
        let selection = match &selected {
            Some(selected) => {
                let request = launch_request(selected, mode.origin_session(), launch_fingerprint);
                match select_launch(connection, selected, &request)? {
                    Ok(Selected::Adopt { run_id }) => {
                        job_adopted.store(true, Ordering::Relaxed);
                        return adopt_start(connection, &run_id);
                    }
                    Ok(Selected::Reserve { intent_id }) => Some(Reservation {
                        intent_id,
                        tool_call_id: request.tool_call_id,
                        fingerprint: launch_fingerprint,
                        run_id: run_id.clone(),
                    }),
                    Err(refusal) => return Ok(Executed::rejected(&refusal)),
                }
            }
            None => None,
        };
        let project_id = meta::ensure_project(connection, &project_path, now_ms)?;
        meta::put_definition(
            connection,
            &resolved.definition_digest,
            &resolved.workflow_name,
            &resolved.topology_json,
            now_ms,
        )?;
        blobs::put(connection, &input_blob, blobs::JSON, now_ms)?;
        let session_runs = match &mode {
            ExecutionMode::Interactive { origin_session } => {
                meta::session_runs(connection, origin_session)?
            }
            ExecutionMode::Headless => Vec::new(),
        };
        let new_run = NewRun {
            run_id: run_id.clone(),
            mode: mode.clone(),
        };
        let reserve = if held {
            run::reserve_held
        } else {
            run::reserve
        };
        let reserved = match reserve(new_run, Lineage::default(), &session_runs, now_ms) {
            Ok(reserved) => reserved,
            Err(rejection) => return Ok(Executed::rejected(&rejection)),
        };
        let meta = RunMeta {
            run_id: run_id.clone(),
            project_id,
            project_path: project_path.clone(),
            workflow_name: resolved.workflow_name.clone(),
            workflow_ref: workflow.clone(),
            title: resolved.title.clone(),
            definition_digest: resolved.definition_digest.clone(),
            input_digest: input_blob.digest,
            input_hash: crate::ids::digest_text(&input_blob.digest),
            source_json,
            agent_model_json: agent_model_json.clone(),
        };
        meta::insert_run(connection, &meta, &mode, None, now_ms)?;
        let revision = reserved.facts.run.revision;
        let outputs = crate::shell::write_transition(connection, None, reserved, &[], now_ms)?;
        if let Some(reservation) = &selection {
            launches::insert(connection, reservation, now_ms)?;
        }
        let receipt = RunStartReceipt {
            revision: crate::projection::run_view::revision(revision.0)?,
            run_id: to_wire("runId", run_id.as_str())?,
        };
        Ok(Executed::accepted(revision, &receipt, outputs))
    })
    .await;
    match committed {
        // The run exists: the first admission round after this decides
        // whether its resolver runs it or ends.
        Some(CommandOutcome::Accepted) if !adopted.load(Ordering::Relaxed) => {
            app.waiting.committed(&run_id);
            app.scheduler.notify();
        }
        // Refused, adopted, or not stored: no run for the resolver to run.
        Some(
            CommandOutcome::Accepted
            | CommandOutcome::Adopted
            | CommandOutcome::Rejected
            | CommandOutcome::Conflict
            | CommandOutcome::NotFound
            | CommandOutcome::ClaimLost
            | CommandOutcome::Unavailable,
        )
        | None => app.waiting.release(&run_id),
    }
    response
}

/// The name part of a workflow reference (for the run id slug): a file's
/// workflow name, a built-in's id, or the name itself.
pub(super) fn workflow_stem(workflow: &str) -> &str {
    let file = workflow.rsplit(['/', '\\']).next().unwrap_or(workflow);
    crate::discovery::workflow_name_of(file)
        .unwrap_or(file)
        .trim_start_matches("builtin:")
}

/// The kernel's launch request of a selected launch: the requesting
/// session, the model's tool call and the request's fingerprint.
fn launch_request(
    selected: &SelectedLaunch,
    session: Option<&SessionId>,
    fingerprint: Digest,
) -> LaunchRequest {
    LaunchRequest {
        session_id: session.cloned(),
        tool_call_id: selected.tool_call_id.to_string(),
        fingerprint,
    }
}

/// The one-launch rule (`kernel::launch::select`) over the facts of the
/// named decision turn: its message with the intent it claimed, and that
/// intent's reservation.
fn select_launch(
    connection: &Connection,
    selected: &SelectedLaunch,
    request: &LaunchRequest,
) -> rusqlite::Result<Result<Selected, launch::LaunchRefusal>> {
    let message_id = MessageId::new(selected.message_id.to_string());
    let source = launches::source_message(connection, &message_id)?;
    let existing = match source.as_ref().and_then(|source| source.intent_id.as_ref()) {
        Some(intent_id) => launches::of_intent(connection, intent_id)?,
        None => None,
    };
    Ok(launch::select(source.as_ref(), existing.as_ref(), request))
}

/// `run.start`'s receipt for the run a repeated tool call already reserved.
fn adopt_start(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Executed> {
    let Some(run) = runs::load(connection, run_id)? else {
        return Ok(Executed::refused(
            CommandOutcome::NotFound,
            ErrorCode::NotFound,
            "the run this tool call selected no longer exists",
        ));
    };
    let receipt = RunStartReceipt {
        revision: crate::projection::run_view::revision(run.run.revision.0)?,
        run_id: to_wire("runId", run_id.as_str())?,
    };
    Ok(Executed::accepted(run.run.revision, &receipt, Vec::new()))
}

/// A command on one run, from its typed payload.
#[derive(Debug)]
pub(super) enum RunCommand {
    Pause,
    Resume,
    /// Who cancels: the model through the `workflow` tool, or a person.
    Cancel(Canceller),
    Restart(RunRestartPayload),
    Activate,
    AnswerCheckpoint(Blob),
}

pub(super) async fn run_command(
    app: &Arc<Context>,
    request: Request,
    run_command: RunCommand,
) -> Value {
    let run_id = match required_run_id(&request, "this operation needs a runId") {
        Ok(run_id) => run_id,
        Err(refusal) => return refusal,
    };
    let job_app = app.clone();
    let control = app.control.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    let expected_revision = request.expected_revision;
    command(app, request, move |connection, now_ms| {
        // Read on the writer thread, after every earlier admission's job.
        let host = job_app.runners.authority_for(&run_id);
        let Some(before) = runs::load(connection, &run_id)? else {
            return Ok(Executed::refused(
                CommandOutcome::NotFound,
                ErrorCode::NotFound,
                "no run with this id; check `pi-workflows runs`",
            ));
        };
        if let Err(stale) = run::check_revision(&before.run, expected_revision) {
            return Ok(Executed::rejected(&stale));
        }
        let decided = match run_command {
            RunCommand::Pause => run::pause(&before, host.as_ref(), control, now_ms, ttl_ms),
            RunCommand::Cancel(by) => {
                return cancel(
                    connection,
                    &before,
                    by,
                    host.as_ref(),
                    control,
                    now_ms,
                    ttl_ms,
                );
            }
            RunCommand::Resume => {
                let order = meta::next_message_order(connection, before.run.mode.origin_session())?;
                let ids = run::ResumeIds {
                    resumed_message_id: MessageId::new(crate::ids::uuid()),
                    message_order: order,
                };
                run::resume(&before, ids, now_ms)
            }
            RunCommand::Restart(payload) => {
                return restart(connection, &before, &payload, now_ms);
            }
            RunCommand::Activate => run::activate(&before, now_ms),
            RunCommand::AnswerCheckpoint(answer) => {
                return answer_checkpoint(connection, &before, Some(answer), now_ms);
            }
        };
        match decided {
            Ok(transition) => {
                let revision = transition.facts.run.revision;
                let receipt = control_receipt(&transition.facts)?;
                let outputs = crate::shell::write_step(
                    connection,
                    &before,
                    Step::Apply(transition),
                    &[],
                    now_ms,
                )?;
                Ok(Executed::accepted(revision, &receipt, outputs))
            }
            Err(rejection) => Ok(Executed::rejected(&rejection)),
        }
    })
    .await
}

/// `run.cancel`: the kernel's cancellation, and in the same transaction the
/// run's turn intent (`kernel::intent::on_cancel`), created before the
/// stopped turn is aborted so that who cancelled (its cause) is durable
/// before the terminal message reuses it.
fn cancel(
    connection: &Connection,
    before: &RunAggregate,
    by: Canceller,
    host: Option<&Authority>,
    control: ClaimRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> rusqlite::Result<Executed> {
    let transition = match run::cancel(before, host, control, now_ms, ttl_ms) {
        Ok(transition) => transition,
        Err(rejection) => return Ok(Executed::rejected(&rejection)),
    };
    let open = intents::open_of_run(connection, &before.run.run_id)?;
    let intent = kernel::intent::on_cancel(&transition.facts.run, open.as_ref(), by, now_ms);
    let revision = transition.facts.run.revision;
    let receipt = control_receipt(&transition.facts)?;
    let outputs =
        crate::shell::write_step(connection, before, Step::Apply(transition), &[], now_ms)?;
    if let Some(intent) = &intent {
        intents::write(connection, intent, None)?;
    }
    Ok(Executed::accepted(revision, &receipt, outputs))
}

pub(super) fn control_receipt(agg: &RunAggregate) -> Result<RunControlReceipt, OffSchema> {
    Ok(RunControlReceipt {
        revision: crate::projection::run_view::revision(agg.run.revision.0)?,
        run_id: to_wire("runId", agg.run.run_id.as_str())?,
        status: to_wire("status", agg.run.status)?,
    })
}

/// `run.restart`: the kernel's restart rule over the run's terminal
/// fingerprint and its whole chain, read in this transaction.
pub(super) fn restart(
    connection: &Connection,
    before: &RunAggregate,
    payload: &RunRestartPayload,
    now_ms: u64,
) -> rusqlite::Result<Executed> {
    let selection = match &payload.selected_launch {
        Some(selected) => {
            let fingerprint = launch::request_fingerprint(LaunchKind::Restart {
                run_id: &before.run.run_id,
            });
            let request = launch_request(selected, before.run.mode.origin_session(), fingerprint);
            match select_launch(connection, selected, &request)? {
                Ok(Selected::Adopt { run_id }) => {
                    let receipt = RunRestartReceipt {
                        new_run_id: to_wire("newRunId", run_id.as_str())?,
                        revision: crate::projection::run_view::revision(before.run.revision.0)?,
                        run_id: to_wire("runId", before.run.run_id.as_str())?,
                        status: to_wire("status", before.run.status)?,
                    };
                    return Ok(Executed::accepted(
                        before.run.revision,
                        &receipt,
                        Vec::new(),
                    ));
                }
                Ok(Selected::Reserve { intent_id }) => Some((intent_id, request)),
                Err(refusal) => return Ok(Executed::rejected(&refusal)),
            }
        }
        None => None,
    };
    // A selected launch is always held: it runs after its decision turn settles.
    let held = payload.held == Some(true) || selection.is_some();
    let (Some((fingerprint, chain)), Some(meta)) = (
        runs::restart_facts(connection, &before.run)?,
        meta::load(connection, &before.run.run_id)?,
    ) else {
        return Ok(Executed::refused(
            CommandOutcome::NotFound,
            ErrorCode::NotFound,
            "no run with this id; check `pi-workflows runs`",
        ));
    };
    let new_run_id = RunId::new(crate::ids::run_id(&meta.workflow_name, now_ms));
    let session_runs = match before.run.mode.origin_session() {
        Some(session) => meta::session_runs(connection, session)?,
        None => Vec::new(),
    };
    let source = run::RestartSource {
        run: &before.run,
        terminal_fingerprint: fingerprint,
        chain: &chain,
    };
    let new_run = NewRun {
        run_id: new_run_id.clone(),
        mode: before.run.mode.clone(),
    };
    let restart = if held {
        run::restart_held
    } else {
        run::restart
    };
    let transition = match restart(source, new_run, &session_runs, now_ms) {
        Ok(transition) => transition,
        Err(rejection) => return Ok(Executed::rejected(&rejection)),
    };
    let new_meta = RunMeta {
        run_id: new_run_id.clone(),
        ..meta
    };
    meta::insert_run(connection, &new_meta, &before.run.mode, None, now_ms)?;
    let revision = transition.facts.run.revision;
    let outputs = crate::shell::write_transition(connection, None, transition, &[], now_ms)?;
    if let Some((intent_id, request)) = selection {
        let reservation = Reservation {
            intent_id,
            tool_call_id: request.tool_call_id,
            fingerprint: request.fingerprint,
            run_id: new_run_id.clone(),
        };
        launches::insert(connection, &reservation, now_ms)?;
    }
    // Whether the chain's other runs may restart changed with this one.
    runs::mark_restart_chain(connection, before.run.restart_root())?;
    let receipt = RunRestartReceipt {
        new_run_id: to_wire("newRunId", new_run_id.as_str())?,
        revision: crate::projection::run_view::revision(before.run.revision.0)?,
        run_id: to_wire("runId", before.run.run_id.as_str())?,
        status: to_wire("status", before.run.status)?,
    };
    Ok(Executed::accepted(revision, &receipt, outputs))
}

/// `checkpoint.answer`: the answer becomes the continuation's input.
pub(super) fn answer_checkpoint(
    connection: &Connection,
    parent: &RunAggregate,
    answer: Option<Blob>,
    now_ms: u64,
) -> rusqlite::Result<Executed> {
    let (Some(answer), Some(meta)) = (answer, meta::load(connection, &parent.run.run_id)?) else {
        return Ok(Executed::refused(
            CommandOutcome::Rejected,
            ErrorCode::SchemaInvalid,
            "checkpoint.answer needs an answer",
        ));
    };
    let child_run_id = RunId::new(format!(
        "continuation-{}",
        &hex::encode(crate::ids::sha256(parent.run.run_id.as_str().as_bytes()).0)[..24]
    ));
    let wanted = crate::continuation::identity(
        &meta,
        &child_run_id,
        &answer.digest,
        &parent.run.run_id,
        parent.run.mode.origin_session(),
    );
    let existing = crate::continuation::existing_child(connection, parent)?;
    let protected = crate::store::decisions::for_checkpoint(connection, parent)?;
    let prepared = kernel::decision::answer_checkpoint(
        parent,
        protected.as_ref(),
        existing.as_ref(),
        &wanted,
        now_ms,
    );
    match prepared {
        Ok(kernel::decision::PrepareOutcome::Adopted { child_run_id }) => {
            let receipt = CheckpointAnswerReceipt {
                continuation_run_id: to_wire("continuationRunId", child_run_id.as_str())?,
            };
            Ok(Executed::accepted(
                parent.run.revision,
                &receipt,
                Vec::new(),
            ))
        }
        Ok(kernel::decision::PrepareOutcome::Prepared(reserved)) => {
            blobs::put(connection, &answer, blobs::JSON, now_ms)?;
            let child_meta = RunMeta {
                run_id: child_run_id.clone(),
                input_digest: answer.digest,
                input_hash: crate::ids::digest_text(&answer.digest),
                ..meta
            };
            let checkpoint = parent
                .run
                .waiting_on
                .clone()
                .map(|node| node.0)
                .unwrap_or_default();
            meta::insert_run(
                connection,
                &child_meta,
                &parent.run.mode,
                Some((&parent.run.run_id, &checkpoint)),
                now_ms,
            )?;
            let revision = reserved.parent.facts.run.revision;
            let mut outputs = crate::shell::write_transition(
                connection,
                Some(parent),
                reserved.parent,
                &[],
                now_ms,
            )?;
            outputs.extend(crate::shell::write_transition(
                connection,
                None,
                reserved.child,
                &[],
                now_ms,
            )?);
            let receipt = CheckpointAnswerReceipt {
                continuation_run_id: to_wire("continuationRunId", child_run_id.as_str())?,
            };
            Ok(Executed::accepted(revision, &receipt, outputs))
        }
        // Every refusal keeps its own code (`kernel::reject`): a protected
        // decision is `decisionRequired`, another answer `conflict`, a run
        // refusal the run's code.
        Err(rejection) => Ok(Executed::rejected(&rejection)),
    }
}
