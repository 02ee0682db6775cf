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
//!
//! This module is the dispatch: one exhaustive match over the generated
//! `RequestPayload` that hands each handler its typed payload. One module
//! per concept below it: `receipts` (command identity, lookup and the
//! receipt job), `run_commands`, `decisions` (`decision.answer`,
//! `effect.recover`), `reads`, `subscriptions`, `coordinator`
//! (origin sessions), `submissions` (`interaction.submit`), `follow_ups`
//! (`followUp.add`, `followUp.cancel`), `settings` (`settings.update`,
//! `settings.get`), `resources` (`resource.apply`, `resource.reconcile`,
//! `resource.delete`, `resource.get`, `resource.list`),
//! `maintenance` (`state.verify`, `state.backup`, `state.prune`),
//! `server_status`, `why` (`run.why`), and `socket` (the listener and its connections).

mod capture;
mod channels;
pub mod coordinator;
pub(crate) mod decisions;
pub(crate) mod follow_ups;
mod maintenance;
mod reads;
mod receipts;
mod request;
pub mod resources;
mod run_commands;
pub mod server_status;
mod settings;
pub mod socket;
pub mod submissions;
mod subscriptions;
mod why;

use reads::{clear_terminal, runs_list, view_content, view_page, workflows_list};
use request::{Request, not_found, schema_invalid};
use run_commands::{RunCommand, run_command, run_start};
use subscriptions::subscribe;

use crate::context::Context;
use crate::presentation::hub::Subscriptions;
use crate::store::blobs::Blob;
use crate::wire::client::Outbox;
use crate::wire::client::{receipt, response};
use kernel::ids::RunId;
use kernel::intent::Canceller;
use protocol::generated::types::{ClientMessage, EmptyReceipt, ServerStopReceipt};
use protocol::{ErrorCode, RequestPayload};
use serde_json::Value;
use std::sync::Arc;

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
        .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
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
        RequestPayload::RunWhy(_) => {
            why::respond(app, &request.request_id, request.run_id.as_ref()).await
        }
        RequestPayload::ServerStop(_) => {
            // Answered before the stop is requested: `server.stop` has no
            // receipt, so it holds no command slot the shutdown would wait
            // for, and a server that stopped first could exit before the
            // answer was written (the client then saw the connection lost).
            let answer = response(
                &request.request_id,
                "server.stop",
                "accepted",
                None,
                Some(receipt(&ServerStopReceipt { stopping: true })),
                None,
            );
            outbox
                .send_and_drain(crate::wire::client::frame(&answer))
                .await;
            app.request_stop();
            return None;
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
                    Some(receipt(&EmptyReceipt {})),
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
        RequestPayload::RunCancel(cancel) => {
            let by = match cancel.by {
                Some(protocol::generated::types::Canceller::Agent) => Canceller::Agent,
                Some(protocol::generated::types::Canceller::User) | None => Canceller::User,
            };
            run_command(app, request, RunCommand::Cancel(by)).await
        }
        RequestPayload::RunRestart(restart) => {
            run_command(app, request, RunCommand::Restart(restart)).await
        }
        RequestPayload::RunActivate(_) => run_command(app, request, RunCommand::Activate).await,
        RequestPayload::CheckpointAnswer(answer) => {
            let answer = Blob::json(&answer.answer);
            run_command(app, request, RunCommand::AnswerCheckpoint(answer)).await
        }
        RequestPayload::DecisionAnswer(answer) => decisions::answer(app, request, answer).await,
        RequestPayload::EffectRecover(recover) => {
            decisions::recover_effect(app, request, recover).await
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
        RequestPayload::SessionEventsRecord(batch) => {
            let connection = outbox.connection_id();
            crate::client_api::capture::record(app, &request.request_id, &batch, connection).await
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
        RequestPayload::ChannelStatus(_) => channels::status(app, &request),
        RequestPayload::ChannelReload(_) => channels::reload(app, request).await,
        RequestPayload::ChannelRecover(recover) => channels::recover(app, request, recover).await,
        RequestPayload::StateVerify(verify) => maintenance::verify(app, &request, verify).await,
        RequestPayload::StateBackup(backup) => maintenance::backup(app, &request, backup).await,
        RequestPayload::StatePrune(prune) => maintenance::prune(app, &request, prune).await,
        RequestPayload::FollowUpAdd(add) => follow_ups::add(app, request, add).await,
        RequestPayload::FollowUpCancel(cancel) => follow_ups::cancel(app, request, cancel).await,
        // Operations of the schema this server version does not implement:
        // answered `unavailable`, and never advertised as a control.
        RequestPayload::SettingsUpdate(update) => settings::update(app, request, update).await,
        RequestPayload::SettingsGet(get) => settings::get(app, &request, &get).await,
        RequestPayload::ResourceApply(apply) => resources::apply(app, request, apply).await,
        RequestPayload::ResourceReconcile(reference) => {
            resources::reconcile(app, request, reference).await
        }
        RequestPayload::ResourceDelete(reference) => {
            resources::delete(app, request, reference).await
        }
        RequestPayload::ResourceGet(get) => resources::get(app, &request, &get).await,
        RequestPayload::ResourceList(list) => resources::list(app, &request, &list).await,
    })
}
