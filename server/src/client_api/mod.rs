//! Client requests: each state-changing command is decided against its
//! durable receipt, executed by the kernel, and answered after its commit.
//!
//! Invariants:
//! - The durable fingerprint is every command field except the transport
//!   request id; an exact retry with a new request id adopts the stored
//!   receipt, and another payload under a used key or request id conflicts.
//! - Only durable outcomes (`accepted`, `rejected`, `notFound`) store a
//!   receipt; transient ones (`claimLost`, `unavailable`, `conflict`) do not,
//!   so a later retry can still succeed.
//! - The receipt row commits in the same transaction as the change it
//!   acknowledges; the response is sent only after that commit.

pub mod coordinator;
pub mod server_status;
pub mod socket;
pub mod submissions;

pub use crate::wire::client::response;

use crate::children::resolver;
use crate::context::Context;
use crate::presentation::hub::{MAX_SUBSCRIPTIONS, NotStarted, Subscriptions, Target};
use crate::store::blobs::{self, Blob};
use crate::store::meta::{self, RunMeta};
use crate::store::{Commit, commands, runs};
use crate::wire::client::Outbox;
use kernel::ids::{
    ClientId, Digest, IdempotencyKey, MessageId, RequestId, Revision, RunId, SessionId,
};
use kernel::output::{Output, Step};
use kernel::receipt::{
    self, CommandIdentity, CommandOperation, CommandOutcome, Incoming, ReceiptDecision,
};
use kernel::run::{self, ExecutionMode, Lineage, NewRun, RunAggregate};
use protocol::generated::types::{
    ClientMessage, ExecutionMode as WireExecutionMode, RunStartPayload, RunsListPayload,
    SessionPayload, SubscribePayload, SubscribeReceipt, SubscriptionTarget, ViewContentPayload,
    ViewPagePayload, WorkflowsListPayload,
};
use protocol::{ErrorCode, RequestPayload};
use rusqlite::Connection;
use serde_json::{Value, json};
use std::sync::Arc;

/// One request's envelope fields.
#[derive(Clone, Debug)]
struct Request {
    request_id: String,
    client_id: String,
    operation: String,
    run_id: Option<RunId>,
    expected_revision: Option<u64>,
    idempotency_key: Option<String>,
    payload: Value,
}

/// Handles one request and writes its response. A state-changing command
/// (one with an idempotency key) counts as in flight from its arrival until
/// its response was written, so a stopping server first answers every
/// command it accepted; one that arrives while stopping is refused.
pub async fn handle(
    app: &Arc<Context>,
    message: ClientMessage,
    payload: Option<RequestPayload>,
    outbox: &Outbox,
    subscriptions: &Subscriptions,
) {
    let in_flight = match &message {
        ClientMessage::Request {
            idempotency_key: Some(_),
            ..
        } => match app.begin_command() {
            Some(guard) => Some(guard),
            None => {
                if let ClientMessage::Request {
                    request_id,
                    operation,
                    ..
                } = &message
                {
                    let refusal = response(
                        request_id.as_str(),
                        &operation.to_string(),
                        "unavailable",
                        None,
                        None,
                        Some((
                            ErrorCode::Unavailable,
                            "the server is stopping; retry after it restarts".into(),
                        )),
                    );
                    outbox
                        .send_and_drain(crate::wire::client::frame(&refusal))
                        .await;
                }
                return;
            }
        },
        _ => None,
    };
    if let Some(answer) = dispatch(app, message, payload, outbox, subscriptions).await {
        outbox
            .send_and_drain(crate::wire::client::frame(&answer))
            .await;
    }
    drop(in_flight);
}

/// Decides one request; `None` when the response is sent elsewhere.
async fn dispatch(
    app: &Arc<Context>,
    message: ClientMessage,
    payload: Option<RequestPayload>,
    outbox: &Outbox,
    subscriptions: &Subscriptions,
) -> Option<Value> {
    let ClientMessage::Request {
        request_id,
        client_id,
        operation,
        run_id,
        expected_revision,
        idempotency_key,
        ..
    } = message
    else {
        return None;
    };
    let payload_value = payload
        .as_ref()
        .and_then(|payload| serde_json::to_value(payload).ok())
        .unwrap_or(json!({}));
    let request = Request {
        request_id: request_id.to_string(),
        client_id: client_id.to_string(),
        operation: operation.to_string(),
        run_id: run_id.map(|id| RunId::new(id.to_string())),
        expected_revision: expected_revision.map(|revision| revision.get()),
        idempotency_key: idempotency_key.map(|key| key.to_string()),
        payload: payload_value,
    };
    let Some(payload) = payload else {
        // `decode_client_frame` gives every request its typed payload.
        return Some(schema_invalid(&request, "the request has no payload"));
    };
    // One arm per operation of the schema: a new operation does not compile
    // until it is handled here or answered `unavailable` on purpose.
    Some(match payload {
        RequestPayload::Subscribe(subscribe_to) => {
            return subscribe(app, &request, &subscribe_to, outbox, subscriptions).await;
        }
        RequestPayload::ServerStatus(_) => {
            crate::client_api::server_status::respond(app, &request.request_id).await
        }
        RequestPayload::RunView(_) => {
            crate::client_api::server_status::run_view(
                app,
                &request.request_id,
                request.run_id.as_ref(),
            )
            .await
        }
        RequestPayload::ServerStop(_) => {
            app.request_stop();
            response(
                &request.request_id,
                "server.stop",
                "accepted",
                None,
                Some(json!({ "stopping": true })),
                None,
            )
        }
        RequestPayload::RunStart(start) => run_start(app, request, start).await,
        RequestPayload::RunsList(list) => runs_list(app, &request, &list).await,
        RequestPayload::ViewPage(page) => view_page(app, &request, page).await,
        RequestPayload::ViewContent(content) => view_content(app, &request, content).await,
        RequestPayload::Unsubscribe(unsubscribe) => {
            if subscriptions.stop(unsubscribe.subscription_id.as_str()) {
                response(
                    &request.request_id,
                    "unsubscribe",
                    "accepted",
                    None,
                    Some(json!({})),
                    None,
                )
            } else {
                not_found(&request, "no such subscription on this connection")
            }
        }
        RequestPayload::SessionViewGet(get) => {
            crate::client_api::coordinator::session_view(
                app,
                &request.request_id,
                &get,
                outbox.connection_id(),
            )
            .await
        }
        RequestPayload::SessionViewClearTerminal(clear) => {
            clear_terminal(app, &request, &clear).await
        }
        RequestPayload::WorkflowsList(list) => workflows_list(app, &request, &list),
        RequestPayload::RunPause(_) => run_command(app, request, RunCommand::Pause).await,
        RequestPayload::RunResume(_) => run_command(app, request, RunCommand::Resume).await,
        RequestPayload::RunCancel(_) => run_command(app, request, RunCommand::Cancel).await,
        RequestPayload::RunRestart(_) => run_command(app, request, RunCommand::Restart).await,
        RequestPayload::RunActivate(_) => run_command(app, request, RunCommand::Activate).await,
        RequestPayload::CheckpointAnswer(answer) => {
            let answer = Blob::json(&answer.answer);
            run_command(app, request, RunCommand::AnswerCheckpoint(answer)).await
        }
        RequestPayload::WorkflowMessageReportBranch(report) => {
            let connection = outbox.connection_id();
            crate::client_api::coordinator::report_branch(
                app,
                &request.request_id,
                &report,
                connection,
            )
            .await
        }
        RequestPayload::WorkflowTurnReport(report) => {
            let connection = outbox.connection_id();
            crate::client_api::coordinator::report_turn(
                app,
                &request.request_id,
                &report,
                connection,
            )
            .await
        }
        RequestPayload::InteractionSubmit(submit) => {
            crate::client_api::submissions::submit(
                app,
                &request.request_id,
                request.run_id.as_ref(),
                request.idempotency_key.as_deref(),
                &submit,
            )
            .await
        }
        RequestPayload::InteractionUpdate(update) => {
            crate::runner_api::updates::tool_update(
                app,
                &request.request_id,
                request.run_id.as_ref(),
                request.idempotency_key.as_deref(),
                &update,
            )
            .await
        }
        // Operations of the schema this server version does not implement:
        // answered `unavailable`, and never advertised as a control.
        RequestPayload::DecisionAnswer(_)
        | RequestPayload::EffectRecover(_)
        | RequestPayload::SettingsUpdate(_)
        | RequestPayload::FollowUpAdd(_)
        | RequestPayload::FollowUpCancel(_)
        | RequestPayload::ResourceApply(_)
        | RequestPayload::ResourceReconcile(_)
        | RequestPayload::ResourceDelete(_)
        | RequestPayload::SessionEventsRecord(_)
        | RequestPayload::StateVerify(_)
        | RequestPayload::StateBackup(_)
        | RequestPayload::StatePrune(_)
        | RequestPayload::ChannelStatus(_)
        | RequestPayload::ChannelReload(_)
        | RequestPayload::ChannelRecover(_) => response(
            &request.request_id,
            &request.operation,
            "unavailable",
            None,
            None,
            Some((
                ErrorCode::Unavailable,
                "this operation is not available in this server version".into(),
            )),
        ),
    })
}

/// What a command's execution decided.
#[derive(Debug)]
struct Executed {
    outcome: CommandOutcome,
    revision: Option<Revision>,
    receipt: Option<Value>,
    error: Option<(protocol::ErrorCode, String)>,
    outputs: Vec<Output>,
}

impl Executed {
    fn accepted(revision: Revision, receipt: Value, outputs: Vec<Output>) -> Self {
        Self {
            outcome: CommandOutcome::Accepted,
            revision: Some(revision),
            receipt: Some(receipt),
            error: None,
            outputs,
        }
    }

    fn refused(
        outcome: CommandOutcome,
        code: protocol::ErrorCode,
        message: impl Into<String>,
    ) -> Self {
        Self {
            outcome,
            revision: None,
            receipt: None,
            error: Some((code, message.into())),
            outputs: Vec::new(),
        }
    }

    /// A kernel rejection: its code, message and outcome come from the
    /// kernel (`kernel::reject`), never from a table here.
    fn rejected<R: kernel::reject::Coded>(rejection: &R) -> Self {
        let (code, message, outcome) = crate::wire::rejection(rejection);
        Self::refused(outcome, code, message)
    }
}

/// The durable identity and its fingerprint, computed before any transaction.
struct Identity {
    incoming: Incoming,
    fingerprint: Digest,
}

/// A `rejected` response with `schemaInvalid` and `message`.
fn schema_invalid(request: &Request, message: &str) -> Value {
    response(
        &request.request_id,
        &request.operation,
        "rejected",
        None,
        None,
        Some((ErrorCode::SchemaInvalid, message.into())),
    )
}

fn identity(request: &Request) -> Result<Identity, Value> {
    let operation = CommandOperation::from_wire(&request.operation);
    let (Some(operation), Some(key)) = (operation, request.idempotency_key.clone()) else {
        return Err(schema_invalid(
            request,
            "state-changing requests need an idempotencyKey",
        ));
    };
    let payload_bytes = protocol::canonicalize(&request.payload).unwrap_or_default();
    let identity = CommandIdentity {
        client_id: ClientId::new(request.client_id.clone()),
        operation,
        idempotency_key: IdempotencyKey::new(key),
        run_id: request.run_id.clone(),
        expected_revision: request.expected_revision.map(Revision),
        payload_digest: crate::ids::sha256(&payload_bytes),
    };
    let fingerprint_bytes =
        protocol::canonicalize(&serde_json::to_value(&identity).unwrap_or_default())
            .unwrap_or_default();
    Ok(Identity {
        fingerprint: crate::ids::sha256(&fingerprint_bytes),
        incoming: Incoming {
            request_id: RequestId::new(request.request_id.clone()),
            identity,
        },
    })
}

/// The stored body of a receipt: what a retry's response repeats.
fn receipt_body(executed: &Executed) -> Value {
    json!({ "receipt": executed.receipt, "error": executed.error.as_ref().map(|(code, message)| json!({"code": code.to_string(), "message": message})) })
}

/// Looks up the stored receipt of a command: `Some(response)` when it is
/// adopted or conflicts, `None` when it must execute.
fn lookup(
    connection: &Connection,
    request: &Request,
    identity: &Identity,
) -> rusqlite::Result<Option<Value>> {
    let incoming = &identity.incoming;
    let by_request = commands::by_request_id(
        connection,
        &incoming.identity.client_id,
        &incoming.request_id,
    )?;
    let by_key = commands::by_key(
        connection,
        &incoming.identity.client_id,
        &incoming.identity.idempotency_key,
    )?;
    let decision = receipt::decide(
        by_request.as_ref().map(|(row, _)| row),
        by_key.as_ref().map(|(row, _)| row),
        incoming,
    );
    Ok(match decision {
        ReceiptDecision::Execute => None,
        ReceiptDecision::Conflict(_) => Some(response(
            &request.request_id,
            &request.operation,
            "conflict",
            None,
            None,
            Some((
                ErrorCode::Conflict,
                "this idempotency key or request id was already used for another request".into(),
            )),
        )),
        ReceiptDecision::Adopt(stored) => {
            let json_text = by_request
                .or(by_key)
                .map(|(_, json)| json)
                .unwrap_or_default();
            let body: Value = serde_json::from_str(&json_text).unwrap_or(Value::Null);
            let outcome = crate::wire::codec_name(&stored.adopted_outcome());
            let error = body.get("error").and_then(|error| {
                Some((
                    error.get("code")?.as_str()?.to_owned(),
                    error.get("message")?.as_str()?.to_owned(),
                ))
            });
            let mut value = response(
                &request.request_id,
                &request.operation,
                &outcome,
                stored.revision.map(|revision| revision.0),
                body.get("receipt")
                    .filter(|receipt| !receipt.is_null())
                    .cloned(),
                None,
            );
            if let Some((code, message)) = error {
                value["error"] = json!({ "code": code.to_string(), "message": message });
            }
            Some(value)
        }
    })
}

/// Runs one command job: receipt lookup, execution, receipt storage.
async fn command<F>(app: &Arc<Context>, request: Request, execute: F) -> Value
where
    F: FnOnce(&Connection, u64) -> rusqlite::Result<Executed> + Send + 'static,
{
    let identity = match identity(&request) {
        Ok(identity) => identity,
        Err(response) => return response,
    };
    let request_for_job = request.clone();
    let result = app
        .store
        .write(move |connection| {
            if let Some(response) = lookup(connection, &request_for_job, &identity)? {
                return Ok(Commit::Discard((response, Vec::new(), false)));
            }
            let now_ms = crate::clock::now_ms();
            let executed = execute(connection, now_ms)?;
            let outcome = crate::wire::codec_name(&executed.outcome);
            let body = receipt_body(&executed);
            let mut value = response(
                &request_for_job.request_id,
                &request_for_job.operation,
                &outcome,
                executed.revision.map(|revision| revision.0),
                executed.receipt.clone(),
                None,
            );
            if let Some((code, message)) = &executed.error {
                value["error"] = json!({ "code": code.to_string(), "message": message });
            }
            let body_text = serde_json::to_string(&body).unwrap_or_default();
            let digest = crate::ids::sha256(body_text.as_bytes());
            match receipt::record(
                &identity.incoming,
                executed.outcome,
                executed.revision,
                digest,
                now_ms,
            ) {
                Some(stored) => {
                    commands::insert(connection, &stored, &identity.fingerprint, &body_text)?;
                    Ok(Commit::Keep((value, executed.outputs, true)))
                }
                None => Ok(Commit::Discard((value, Vec::new(), false))),
            }
        })
        .await;
    match result {
        Ok((value, outputs, stored)) => {
            if stored {
                app.faults.hit(crate::fault::FaultPoint::AfterReceipt);
            }
            app.perform(outputs);
            value
        }
        Err(error) => response(
            &request.request_id,
            &request.operation,
            "unavailable",
            None,
            None,
            Some(error.refusal()),
        ),
    }
}

// ---- run.start ---------------------------------------------------------------

async fn run_start(app: &Arc<Context>, request: Request, payload: RunStartPayload) -> Value {
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
    let held = payload.held == Some(true);
    let input = payload.input;
    // The schema checked its fields; stored canonical, handed to every runner launch.
    let agent_model_json = payload
        .agent_model
        .as_ref()
        .and_then(|model| serde_json::to_value(model).ok())
        .and_then(|model| protocol::canonicalize(&model).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok());
    let resolved = resolver::resolve(app, &project_path, &workflow, &input).await;
    let prepared = resolved.map(|resolved| {
        let input_blob = Blob::json(&resolved.input);
        let source_json = serde_json::to_string(&resolved.source).unwrap_or_default();
        (resolved, input_blob, source_json)
    });
    let run_id = RunId::new(crate::ids::run_id(
        workflow_stem(&workflow),
        crate::clock::now_ms(),
    ));
    command(app, request, move |connection, now_ms| {
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
        let receipt = json!({ "runId": run_id.as_str(), "revision": revision.0 });
        Ok(Executed::accepted(revision, receipt, outputs))
    })
    .await
}

/// The name part of a workflow reference (for the run id slug): a file's
/// workflow name, a built-in's id, or the name itself.
fn workflow_stem(workflow: &str) -> &str {
    let file = workflow.rsplit(['/', '\\']).next().unwrap_or(workflow);
    crate::discovery::workflow_name_of(file)
        .unwrap_or(file)
        .trim_start_matches("builtin:")
}

/// Answers from a stored receipt without executing, if one exists.
async fn precheck(app: &Arc<Context>, request: &Request) -> Option<Value> {
    let identity = identity(request).ok()?;
    let request = request.clone();
    app.store
        .read(move |connection| lookup(connection, &request, &identity))
        .await
        .ok()
        .flatten()
}

// ---- commands on one run -----------------------------------------------------

/// A command on one run, from its typed payload.
#[derive(Debug)]
enum RunCommand {
    Pause,
    Resume,
    Cancel,
    Restart,
    Activate,
    AnswerCheckpoint(Blob),
}

async fn run_command(app: &Arc<Context>, request: Request, run_command: RunCommand) -> Value {
    let Some(run_id) = request.run_id.clone() else {
        return response(
            &request.request_id,
            &request.operation,
            "rejected",
            None,
            None,
            Some((
                ErrorCode::SchemaInvalid,
                "this operation needs a runId".into(),
            )),
        );
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
            RunCommand::Cancel => run::cancel(&before, host.as_ref(), control, now_ms, ttl_ms),
            RunCommand::Resume => {
                let order = meta::next_message_order(connection, before.run.mode.origin_session())?;
                let ids = run::ResumeIds {
                    resumed_message_id: MessageId::new(crate::ids::uuid()),
                    message_order: order,
                };
                run::resume(&before, ids, now_ms)
            }
            RunCommand::Restart => return restart(connection, &before, now_ms),
            RunCommand::Activate => run::activate(&before, now_ms),
            RunCommand::AnswerCheckpoint(answer) => {
                return answer_checkpoint(connection, &before, Some(answer), now_ms);
            }
        };
        match decided {
            Ok(transition) => {
                let revision = transition.facts.run.revision;
                let receipt = control_receipt(&transition.facts);
                let outputs = crate::shell::write_step(
                    connection,
                    &before,
                    Step::Apply(transition),
                    &[],
                    now_ms,
                )?;
                Ok(Executed::accepted(revision, receipt, outputs))
            }
            Err(rejection) => Ok(Executed::rejected(&rejection)),
        }
    })
    .await
}

fn control_receipt(agg: &RunAggregate) -> Value {
    json!({
        "runId": agg.run.run_id.as_str(),
        "revision": agg.run.revision.0,
        "status": crate::wire::codec_name(&agg.run.status),
    })
}

/// `run.restart`: the kernel's restart rule over the run's terminal
/// fingerprint and its whole chain, read in this transaction.
fn restart(
    connection: &Connection,
    before: &RunAggregate,
    now_ms: u64,
) -> rusqlite::Result<Executed> {
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
    let transition = match run::restart(source, new_run, &session_runs, now_ms) {
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
    // Whether the chain's other runs may restart changed with this one.
    runs::mark_restart_chain(connection, before.run.restart_root())?;
    let receipt = json!({
        "runId": before.run.run_id.as_str(),
        "revision": before.run.revision.0,
        "status": crate::wire::codec_name(&before.run.status),
        "newRunId": new_run_id.as_str(),
    });
    Ok(Executed::accepted(revision, receipt, outputs))
}

/// `checkpoint.answer`: the answer becomes the continuation's input.
fn answer_checkpoint(
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
    let wanted = continuation_identity(
        &meta,
        &child_run_id,
        &answer.digest,
        &parent.run.run_id,
        parent.run.mode.origin_session(),
    );
    let existing = match &parent.run.lineage.continued_by {
        Some(child) => match meta::load(connection, child)? {
            Some(child_meta) => runs::load(connection, child)?.map(|child_agg| {
                continuation_identity(
                    &child_meta,
                    child,
                    &child_meta.input_digest,
                    &parent.run.run_id,
                    child_agg.run.mode.origin_session(),
                )
            }),
            None => None,
        },
        None => None,
    };
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
            let receipt = json!({ "continuationRunId": child_run_id.as_str() });
            Ok(Executed::accepted(parent.run.revision, receipt, Vec::new()))
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
            let receipt = json!({ "continuationRunId": child_run_id.as_str() });
            Ok(Executed::accepted(revision, receipt, outputs))
        }
        // Every refusal keeps its own code (`kernel::reject`): a protected
        // decision is `decisionRequired`, another answer `conflict`, a run
        // refusal the run's code.
        Err(rejection) => Ok(Executed::rejected(&rejection)),
    }
}

/// The continuation identity of `child_run_id` from the stored metadata
/// (`kernel::decision::ContinuationIdentity::of` hashes it).
fn continuation_identity(
    meta: &RunMeta,
    child_run_id: &RunId,
    input_digest: &Digest,
    parent_run_id: &RunId,
    owning_session: Option<&SessionId>,
) -> kernel::decision::ContinuationIdentity {
    kernel::decision::ContinuationIdentity::of(kernel::decision::ContinuationFacts {
        child_run_id,
        parent_run_id,
        owning_session,
        workflow_source: &meta.source_json,
        definition_digest: &meta.definition_digest,
        input_digest: *input_digest,
    })
}

// ---- reads -------------------------------------------------------------------

fn not_found(request: &Request, message: &str) -> Value {
    response(
        &request.request_id,
        &request.operation,
        "notFound",
        None,
        None,
        Some((ErrorCode::NotFound, message.into())),
    )
}

fn unavailable(request: &Request) -> Value {
    response(
        &request.request_id,
        &request.operation,
        "unavailable",
        None,
        None,
        Some((
            ErrorCode::Internal,
            "the state database could not be read; retry".into(),
        )),
    )
}

async fn runs_list(app: &Arc<Context>, request: &Request, payload: &RunsListPayload) -> Value {
    let cursor = payload.cursor.clone().map(String::from);
    let limit = payload
        .limit
        .map_or(crate::presentation::reads::LIST_PAGE, |limit| {
            limit.get() as usize
        });
    let max_bytes = payload.max_bytes.map(|max| max.get() as usize);
    let page = app
        .store
        .read(move |connection| {
            crate::presentation::reads::run_list(connection, cursor.as_deref(), limit, max_bytes)
        })
        .await;
    match page {
        Ok((rows, next, revision)) => {
            let mut receipt = json!({ "revision": revision, "rows": rows });
            if let Some(next) = next {
                receipt["nextCursor"] = json!(next);
            }
            response(
                &request.request_id,
                "runs.list",
                "accepted",
                Some(revision),
                Some(receipt),
                None,
            )
        }
        Err(_) => unavailable(request),
    }
}

async fn view_page(app: &Arc<Context>, request: &Request, payload: ViewPagePayload) -> Value {
    let Some(run_id) = request.run_id.clone() else {
        return not_found(request, "view.page needs a runId");
    };
    let collection = payload.collection.to_string();
    let cursor = payload.cursor.map(String::from);
    let limit = payload.limit.get() as usize;
    let max_bytes = payload.max_bytes.get() as usize;
    let page = app
        .store
        .read(move |connection| {
            crate::presentation::reads::view_page(
                connection,
                &run_id,
                &collection,
                cursor.as_deref(),
                limit,
                max_bytes,
            )
        })
        .await;
    match page {
        Ok(Some(page)) => {
            let revision = page.get("revision").and_then(Value::as_u64);
            response(
                &request.request_id,
                "view.page",
                "accepted",
                revision,
                Some(page),
                None,
            )
        }
        Ok(None) => not_found(request, "no run with this id; check `pi-workflows runs`"),
        Err(_) => unavailable(request),
    }
}

async fn view_content(app: &Arc<Context>, request: &Request, payload: ViewContentPayload) -> Value {
    let Some(run_id) = request.run_id.clone() else {
        return not_found(request, "view.content needs a runId");
    };
    // `presentation::reads` verifies references in their wire form.
    let reference = serde_json::to_value(&payload.reference).unwrap_or(Value::Null);
    let offset = payload.offset.get() as usize;
    let length = payload.length.get() as usize;
    let chunk = app
        .store
        .read(move |connection| {
            crate::presentation::reads::content_chunk(
                connection, &run_id, &reference, offset, length,
            )
        })
        .await;
    match chunk {
        Ok(Ok(chunk)) => response(
            &request.request_id,
            "view.content",
            "accepted",
            None,
            Some(chunk),
            None,
        ),
        Ok(Err(message)) => response(
            &request.request_id,
            "view.content",
            "unavailable",
            None,
            None,
            Some((ErrorCode::ContentUnavailable, message.into())),
        ),
        Err(_) => unavailable(request),
    }
}

/// `subscribe`: the response (with the subscription id) is written before the
/// subscription's first event; `None` because the subscription task sends it.
async fn subscribe(
    app: &Arc<Context>,
    request: &Request,
    payload: &SubscribePayload,
    outbox: &Outbox,
    subscriptions: &Subscriptions,
) -> Option<Value> {
    let target = match &payload.target {
        SubscriptionTarget::RunList => Target::RunList,
        SubscriptionTarget::Run { run_id } => Target::Run(RunId::new(run_id.to_string())),
        SubscriptionTarget::Session { session_id } => {
            Target::Session(SessionId::new(session_id.to_string()))
        }
    };
    if let Target::Run(run_id) = &target {
        let run_id = run_id.clone();
        let exists = app
            .store
            .read(move |connection| Ok(runs::load(connection, &run_id)?.is_some()))
            .await;
        match exists {
            Ok(true) => {}
            Ok(false) => {
                return Some(not_found(
                    request,
                    "no run with this id; check `pi-workflows runs`",
                ));
            }
            Err(_) => return Some(unavailable(request)),
        }
    }
    let from = payload.from_revision.map(|revision| revision.get());
    let request_id = request.request_id.clone();
    let started = subscriptions.start(
        &app.presentation,
        outbox,
        target,
        from,
        move |subscription_id| {
            response(
                &request_id,
                "subscribe",
                "accepted",
                None,
                subscription_id
                    .parse()
                    .ok()
                    .map(|subscription_id| SubscribeReceipt { subscription_id })
                    .and_then(|receipt| serde_json::to_value(receipt).ok()),
                None,
            )
        },
    );
    match started {
        Ok(_) => None,
        Err(NotStarted::Full) => Some(response(
            &request.request_id,
            "subscribe",
            "rejected",
            None,
            None,
            Some((
                ErrorCode::RateLimited,
                format!(
                    "this connection already holds {MAX_SUBSCRIPTIONS} subscriptions; unsubscribe one first"
                ),
            )),
        )),
        // The connection is gone: nobody reads an answer.
        Err(NotStarted::Closed) => None,
    }
}

async fn clear_terminal(app: &Arc<Context>, request: &Request, payload: &SessionPayload) -> Value {
    let session = SessionId::new(payload.session_id.to_string());
    let cleared = app.store.write(move |connection| {
        crate::presentation::reads::clear_terminal(connection, &session)?;
        Ok(Commit::Keep(()))
    });
    match cleared.await {
        Ok(()) => response(
            &request.request_id,
            "sessionView.clearTerminal",
            "accepted",
            None,
            Some(json!({})),
            None,
        ),
        Err(_) => unavailable(request),
    }
}

fn workflows_list(app: &Arc<Context>, request: &Request, payload: &WorkflowsListPayload) -> Value {
    let project = payload.project_path.as_str();
    let found = crate::discovery::discover(
        std::path::Path::new(project),
        app.config.user_home.as_deref(),
    );
    let offset = payload.offset.map_or(0, |offset| offset.get() as usize);
    let limit = payload.limit.map_or(50, |limit| limit.get() as usize);
    let page: Vec<Value> = found
        .iter()
        .skip(offset)
        .take(limit)
        .map(|found| json!({ "name": found.name, "source": found.origin.as_str() }))
        .collect();
    let mut receipt = json!({ "workflows": page, "total": found.len() });
    if offset + limit < found.len() {
        receipt["nextOffset"] = json!(offset + limit);
    }
    response(
        &request.request_id,
        "workflows.list",
        "accepted",
        None,
        Some(receipt),
        None,
    )
}
