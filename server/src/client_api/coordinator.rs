//! Origin-session coordination: the one active coordinator epoch per origin
//! session, the active-branch report, exact model-turn reports, and the
//! run-level work they decide. The rules are `kernel::session`'s; this
//! module loads facts, calls it, writes and answers.
//!
//! Invariants:
//! - Coordinator epochs are process-local (never durable): a server restart
//!   and a closed connection end them. `sessionView.get {coordinate: true}`
//!   makes a new reading connection the session's active coordinator
//!   (`session::connect`, fencing the previous one, which stays fenced while
//!   another connection is active); the view then names its
//!   epoch, and `nextEligibleMessageId` only to that epoch after its branch
//!   report (`session::offer`).
//! - Every decision that reads the epochs runs inside the store's one write
//!   transaction and changes the epochs there, so epochs and durable session
//!   facts are decided in one serial order.
//! - A branch or turn report commits the session facts and every run-level
//!   follow-up it decided (an aborted turn's pause, a failed attempt after
//!   too many unproductive turns) in the same transaction, before its
//!   response. An accepted origin-session submission finishes its waiting
//!   attempt in the transaction of its verdict (`crate::attempt_follow_up`).
//! - Branch and turn reports store no `host_commands` receipt: the turn id
//!   and the message ids are their identities, and a repeat adopts the saved
//!   result (`session::report_turn`).

use crate::context::Context;
use crate::store::{Commit, runs, sessions};
use crate::wire::client::response;
use kernel::ids::{ConnectionId, CoordinatorEpoch, EntryId, MessageId, RunId, SessionId, TurnId};
use kernel::message::{MessageState, TurnState};
use kernel::output::Output;
use kernel::reject::Coded;
use kernel::session::{
    self, BranchReport, RunFollowUp, SessionFacts, SessionRejection, StopReason, TurnPhase,
    TurnReport,
};
use protocol::ErrorCode;
use protocol::generated::types::{
    ReportBranchPayload, ReportBranchReceipt, SessionView, SessionViewGetPayload,
    TurnPhase as WirePhase, TurnReportPayload, TurnReportReceipt,
};
use rusqlite::Connection;
use serde_json::Value;
use std::sync::Arc;

/// A connection closed: the epochs it owned end (open turns stay open), and
/// the turn clocks of each session it coordinated stop
/// (`session::suspend_clocks`), under the held coordinator state so that no
/// new coordinator's turn report runs in between.
pub async fn disconnected(app: &Arc<Context>, connection_id: &ConnectionId) {
    let mut coordinators = app.coordinators.hold().await;
    let mut left = Vec::new();
    for facts in coordinators.every_session() {
        let was_active = facts
            .active
            .as_ref()
            .is_some_and(|active| active.connection_id == *connection_id);
        *facts = session::disconnect(facts, connection_id).facts;
        if was_active {
            left.push(facts.clone());
        }
    }
    for coordinator in left {
        if crate::turn_clocks::suspend(app, coordinator, None)
            .await
            .is_err()
        {
            crate::log::line(
                "a closed coordinator's turn clocks could not be stopped; they stop at the next server start",
            );
        }
    }
}

fn refuse(request_id: &str, operation: &str, rejection: &SessionRejection) -> Value {
    let (code, message, outcome) = crate::wire::rejection(rejection);
    let outcome = if rejection.is_claim_loss() {
        "claimLost".to_owned()
    } else if code == ErrorCode::Conflict {
        "conflict".to_owned()
    } else {
        crate::wire::codec_name(&outcome)
    };
    response(
        request_id,
        operation,
        &outcome,
        None,
        None,
        Some((code, message.to_owned())),
    )
}

fn unavailable(request_id: &str, operation: &str, error: &crate::store::StoreError) -> Value {
    response(
        request_id,
        operation,
        "unavailable",
        None,
        None,
        Some(error.refusal()),
    )
}

// ---- sessionView.get -------------------------------------------------------

/// `sessionView.get`: the origin-session view from one consistent read; with
/// `coordinate: true` the asking connection becomes (or stays) the session's
/// coordinator and the view names its epoch and, after its branch report,
/// the next eligible message. Step messages name their request's attempt
/// and node.
pub async fn session_view(
    app: &Arc<Context>,
    request_id: &str,
    payload: &SessionViewGetPayload,
    connection_id: &ConnectionId,
) -> Value {
    let session_id = SessionId::new(payload.session_id.to_string());
    let coordinate = payload.coordinate == Some(true);
    let connection_id = connection_id.clone();
    let mut coordinators = app.coordinators.hold().await;
    let before = coordinate.then(|| coordinators.get(&session_id));
    let view = crate::shell::transact(app, move |connection, _now_ms| {
        let mut view = crate::presentation::reads::session_document(connection, &session_id)?;
        add_step_sources(connection, &mut view)?;
        let Some(before) = before else {
            return Ok(Commit::Keep(((view, None), Vec::new())));
        };
        let mut facts = session::connect(&before, connection_id.clone()).facts;
        // A fenced connection is given no epoch (and so no message).
        let epoch = session::epoch_of(&facts, &connection_id);
        if let Some(epoch) = epoch {
            view.coordinator_epoch = Some(
                protocol::generated::constrained::CoordinatorEpoch::new(epoch.0)
                    .ok_or(crate::projection::run_view::OffSchema("coordinatorEpoch"))?,
            );
            let session_facts = sessions::load(connection, &session_id, None)?;
            if let Ok(offered) = session::offer(&session_facts, &facts, &connection_id, epoch) {
                facts = offered.coordinator;
                if let Some(message_id) = offered.message_id {
                    view.next_eligible_message_id = Some(crate::projection::run_view::to_wire(
                        "messageId",
                        message_id.as_str(),
                    )?);
                }
            }
        }
        Ok(Commit::Keep(((view, Some(facts)), Vec::new())))
    })
    .await
    .map(|(view, next)| {
        if let Some(next) = next {
            coordinators.set(next);
        }
        view
    });
    drop(coordinators);
    match view {
        Ok(view) => response(
            request_id,
            "sessionView.get",
            "accepted",
            Some(view.revision.get()),
            Some(crate::wire::client::receipt(&view)),
            None,
        ),
        Err(error) => unavailable(request_id, "sessionView.get", &error),
    }
}

/// Adds `interactionId`, `attemptId` and `nodeId` to every step message.
fn add_step_sources(connection: &Connection, view: &mut SessionView) -> rusqlite::Result<()> {
    use crate::projection::run_view::to_wire;
    for message in &mut view.messages {
        if message.kind != protocol::generated::types::MessageKind::Step {
            continue;
        }
        let id = MessageId::new(message.message_id.to_string());
        if let Some(source) = sessions::step_source(connection, &id)? {
            message.interaction_id =
                Some(to_wire("interactionId", source.interaction_id.as_str())?);
            message.attempt_id = Some(to_wire("attemptId", source.attempt_id.as_str())?);
            message.node_id = Some(to_wire("nodeId", source.node_id.as_str())?);
        }
    }
    Ok(())
}

// ---- workflowMessage.reportBranch --------------------------------------------

/// `workflowMessage.reportBranch` from the active epoch.
pub async fn report_branch(
    app: &Arc<Context>,
    request_id: &str,
    payload: &ReportBranchPayload,
    connection_id: &ConnectionId,
) -> Value {
    const OPERATION: &str = "workflowMessage.reportBranch";
    let session_id = SessionId::new(payload.session_id.to_string());
    let epoch = CoordinatorEpoch(payload.coordinator_epoch.get());
    let report = BranchReport {
        entries: payload
            .entries
            .iter()
            .map(|entry| {
                (
                    MessageId::new(entry.message_id.to_string()),
                    EntryId::new(entry.entry_id.to_string()),
                )
            })
            .collect(),
        is_idle: payload.is_idle,
        has_pending_messages: payload.has_pending_messages,
        // The payload names no running workflow message: a busy Pi proves no
        // absence, so no open turn is closed while it runs.
        active_message: None,
    };
    let job_app = app.clone();
    let connection_id = connection_id.clone();
    let request_id_owned = request_id.to_owned();
    let mut coordinators = app.coordinators.hold().await;
    let coordinator = coordinators.get(&session_id);
    let decided = crate::shell::transact(app, move |connection, now_ms| {
        let before = sessions::load(connection, &session_id, None)?;
        let new_ids = fresh_ids(before.runs.len() * 2);
        let reported = match session::report_branch(
            &before,
            &coordinator,
            &connection_id,
            epoch,
            &report,
            &new_ids,
            now_ms,
        ) {
            Ok(reported) => reported,
            Err(rejection) => {
                return Ok(Commit::Discard((
                    (refuse(&request_id_owned, OPERATION, &rejection), None),
                    Vec::new(),
                )));
            }
        };
        let mut outputs = Vec::new();
        let after = match reported.session {
            Some(transition) => {
                sessions::write(connection, &before, &transition.facts, now_ms)?;
                outputs.extend(transition.outputs);
                transition.facts
            }
            None => before.clone(),
        };
        outputs.extend(apply_follow_ups(
            &job_app,
            connection,
            &reported.follow_ups,
            now_ms,
        )?);
        let receipt = branch_receipt(&before, &after)?;
        let value = response(
            &request_id_owned,
            OPERATION,
            "accepted",
            None,
            Some(crate::wire::client::receipt(&receipt)),
            None,
        );
        Ok(Commit::Keep(((value, Some(reported.coordinator)), outputs)))
    })
    .await;
    match decided {
        Ok((value, next)) => {
            if let Some(next) = next {
                coordinators.set(next);
            }
            value
        }
        Err(error) => unavailable(request_id, OPERATION, &error),
    }
}

/// `{adopted, created, lostTurns}`: what the report changed.
fn branch_receipt(
    before: &SessionFacts,
    after: &SessionFacts,
) -> Result<ReportBranchReceipt, crate::projection::run_view::OffSchema> {
    let adopted = after
        .messages
        .iter()
        .filter(|message| message.state == MessageState::Sent)
        .filter(|message| {
            before
                .messages
                .iter()
                .any(|old| old.message_id == message.message_id && old.state != MessageState::Sent)
        })
        .count();
    let created = after
        .messages
        .iter()
        .filter(|message| {
            !before
                .messages
                .iter()
                .any(|old| old.message_id == message.message_id)
        })
        .count();
    let lost = after
        .turns
        .iter()
        .filter(|turn| turn.state == TurnState::Lost)
        .filter(|turn| {
            before
                .turns
                .iter()
                .any(|old| old.turn_id == turn.turn_id && old.state == TurnState::Open)
        })
        .count();
    let count = |field, count: usize| {
        protocol::generated::constrained::Count::new(count as u64)
            .ok_or(crate::projection::run_view::OffSchema(field))
    };
    Ok(ReportBranchReceipt {
        adopted: count("adopted", adopted)?,
        created: count("created", created)?,
        lost_turns: count("lostTurns", lost)?,
    })
}

fn fresh_ids(count: usize) -> Vec<MessageId> {
    (0..count.max(1))
        .map(|_| MessageId::new(crate::ids::uuid()))
        .collect()
}

// ---- workflowTurn.report ------------------------------------------------------

/// `workflowTurn.report`: one exact turn start or end from the active epoch.
pub async fn report_turn(
    app: &Arc<Context>,
    request_id: &str,
    payload: &TurnReportPayload,
    connection_id: &ConnectionId,
) -> Value {
    const OPERATION: &str = "workflowTurn.report";
    let phase = match (&payload.phase, &payload.stop_reason) {
        (WirePhase::Start, None) => TurnPhase::Start,
        (WirePhase::End, Some(reason)) => TurnPhase::End {
            stop_reason: match reason {
                protocol::generated::types::StopReason::Completed => StopReason::Completed,
                protocol::generated::types::StopReason::Aborted => StopReason::Aborted,
                protocol::generated::types::StopReason::Error => StopReason::Error,
            },
            entry_id: payload
                .entry_id
                .as_ref()
                .map(|entry| EntryId::new(entry.to_string())),
        },
        _ => {
            return response(
                request_id,
                OPERATION,
                "rejected",
                None,
                None,
                Some((
                    ErrorCode::SchemaInvalid,
                    "a turn end needs its stopReason and a start has none".into(),
                )),
            );
        }
    };
    let session_id = SessionId::new(payload.session_id.to_string());
    let epoch = CoordinatorEpoch(payload.coordinator_epoch.get());
    let report = TurnReport {
        message_id: MessageId::new(payload.message_id.to_string()),
        run_id: RunId::new(payload.run_id.to_string()),
        turn_id: TurnId::new(payload.turn_id.to_string()),
        phase,
    };
    let job_app = app.clone();
    let connection_id = connection_id.clone();
    let request_id_owned = request_id.to_owned();
    // Held across the job: a takeover cannot commit between this read and it.
    let coordinators = app.coordinators.hold().await;
    let coordinator = coordinators.get(&session_id);
    let decided = crate::shell::transact(app, move |connection, now_ms| {
        let before = sessions::load(connection, &session_id, Some(&report.turn_id))?;
        let new_ids = fresh_ids(1);
        let reported = match session::report_turn(
            &before,
            &coordinator,
            &connection_id,
            epoch,
            &report,
            &new_ids,
            now_ms,
        ) {
            Ok(reported) => reported,
            Err(rejection) => {
                return Ok(Commit::Discard((
                    refuse(&request_id_owned, OPERATION, &rejection),
                    Vec::new(),
                )));
            }
        };
        let mut outputs = Vec::new();
        if let Some(transition) = reported.session {
            sessions::write(connection, &before, &transition.facts, now_ms)?;
            outputs.extend(transition.outputs);
        }
        outputs.extend(apply_follow_ups(
            &job_app,
            connection,
            &reported.follow_ups,
            now_ms,
        )?);
        use crate::projection::run_view::to_wire;
        let receipt = TurnReportReceipt {
            ownership: to_wire("ownership", reported.receipt.ownership)?,
            turn: reported
                .receipt
                .turn
                .as_ref()
                .map(|turn| to_wire("turn", turn.turn_id.as_str()))
                .transpose()?,
        };
        let value = response(
            &request_id_owned,
            OPERATION,
            "accepted",
            None,
            Some(crate::wire::client::receipt(&receipt)),
            None,
        );
        Ok(Commit::Keep((value, outputs)))
    })
    .await;
    drop(coordinators);
    match decided {
        Ok(value) => value,
        Err(error) => unavailable(request_id, OPERATION, &error),
    }
}

// ---- run-level follow-ups --------------------------------------------------------

/// Applies session follow-ups to their runs in the caller's transaction
/// (after the session facts were written). A follow-up the run refuses (it
/// became terminal or was paused meanwhile) changes nothing.
fn apply_follow_ups(
    app: &Arc<Context>,
    connection: &Connection,
    follow_ups: &[RunFollowUp],
    now_ms: u64,
) -> rusqlite::Result<Vec<Output>> {
    let mut outputs = Vec::new();
    for follow_up in follow_ups {
        match follow_up {
            RunFollowUp::Pause { run_id } => {
                let Some(before) = runs::load(connection, run_id)? else {
                    continue;
                };
                match kernel::interaction::pause_after_aborted_turn(&before, now_ms) {
                    Ok(transition) => {
                        runs::write(
                            connection,
                            Some(&before),
                            &transition.facts,
                            &transition.outputs,
                            now_ms,
                        )?;
                        outputs.extend(transition.outputs);
                    }
                    Err(rejection) => log_refused("an aborted turn's pause", &rejection),
                }
            }
            RunFollowUp::Attempt { follow_up } => {
                outputs.extend(crate::attempt_follow_up::apply(
                    connection,
                    &app.control,
                    app.config.claim_ttl_ms,
                    follow_up,
                    now_ms,
                )?);
            }
        }
    }
    Ok(outputs)
}

fn log_refused(what: &str, rejection: &kernel::run::Rejection) {
    crate::log::line(&format!(
        "{what} was refused by the run: {}",
        rejection.message()
    ));
}
