//! `interaction.submit`: a submission of an interactive request, decided by
//! `kernel::interaction` and answered only at its durable outcome.
//!
//! Invariants:
//! - Served for headless runs (the live runner's authority) and interactive
//!   runs (the origin session's active coordinator epoch: the session must
//!   be the run's origin and the epoch its active one). An accepted
//!   interactive submission finishes its waiting attempt in the verdict's
//!   transaction (`crate::attempt_follow_up`).
//! - The request is resolved from the exact interaction id (settled or not);
//!   its run, attempt, authority (`check_authority`) and kind are checked
//!   before any stored submission is looked up or anything changes.
//! - A new submission commits `validating` with its payload; its validation
//!   child (`validator`) starts only after that commit.
//! - The response is built from the stored row once it is no longer
//!   `validating`: a reconnect with the same key and payload waits for the
//!   same outcome and returns it, a repeat after settlement adopts it, and
//!   the same key with another payload is a conflict. The submission row is
//!   the receipt (no `host_commands` row).

use crate::context::Context;
use crate::store::submissions::{self, Stored};
use crate::store::{Commit, runs};
use crate::wire::client::response;
use kernel::ids::{
    Generation, IdempotencyKey, InteractionId, RunnerEpochId, SessionId, SubmissionId,
};
use kernel::interaction::{self, NewSubmission, SubmissionOutcome, SubmitAuthority, Submitted};
use protocol::ErrorCode;
use protocol::generated::types::{
    AcceptedSubmission, InteractionAuthority, InteractionSubmitPayload, InteractionSubmitReceipt,
    SafeError,
};
use serde_json::Value;
use std::sync::Arc;

/// How the job ended: the submission to wait for, or the response now.
enum Decided {
    Wait {
        submission_id: SubmissionId,
        adopted: bool,
    },
    Respond(Value),
}

/// Handles one `interaction.submit` (the caller checked the schema).
pub async fn submit(
    app: &Arc<Context>,
    request_id: &str,
    run_id: Option<&kernel::ids::RunId>,
    idempotency_key: Option<&str>,
    payload: &InteractionSubmitPayload,
) -> Value {
    let refuse = |outcome: &str, code: ErrorCode, message: &str| {
        response(
            request_id,
            "interaction.submit",
            outcome,
            None,
            None,
            Some((code, message.to_owned())),
        )
    };
    let (Some(run_id), Some(key)) = (run_id.cloned(), idempotency_key) else {
        return refuse(
            "rejected",
            ErrorCode::SchemaInvalid,
            "interaction.submit needs a runId and an idempotencyKey",
        );
    };
    let interaction_id = InteractionId::new(payload.interaction_id.to_string());
    let attempt_id = kernel::ids::AttemptId::new(payload.attempt_id.to_string());
    let authority = match &payload.authority {
        InteractionAuthority::Coordinator {
            session_id,
            coordinator_epoch,
        } => SubmitAuthority::Coordinator {
            session_id: SessionId::new(session_id.to_string()),
            coordinator_epoch: kernel::ids::CoordinatorEpoch(coordinator_epoch.get()),
        },
        InteractionAuthority::Runner {
            generation,
            runner_epoch,
        } => SubmitAuthority::Runner {
            generation: Generation(generation.get()),
            runner_epoch: RunnerEpochId::new(runner_epoch.to_string()),
        },
    };
    let new = NewSubmission {
        submission_id: SubmissionId::new(payload.submission_id.to_string()),
        idempotency_key: IdempotencyKey::new(key.to_owned()),
        payload_hash: submissions::payload_hash(&payload.output).0,
    };
    let payload_blob = submissions::payload_hash(&payload.output).1;
    let request_id_owned = request_id.to_owned();
    // The kernel compares the active epoch (`check_authority`).
    let (coordinators, active_coordinator) = app
        .coordinators
        .hold_for(match &authority {
            SubmitAuthority::Coordinator { session_id, .. } => Some(session_id),
            SubmitAuthority::Runner { .. } => None,
        })
        .await;
    let decided = crate::shell::transact(app, move |connection, now_ms| {
            let refuse = |outcome: &str, code: ErrorCode, message: &str| {
                Ok(Commit::Discard((
                    Decided::Respond(response(&request_id_owned, "interaction.submit", outcome, None, None, Some((code, message.to_owned())))),
                    Vec::new(),
                )))
            };
            let Some(mut agg) = runs::load(connection, &run_id)? else {
                return refuse("rejected", ErrorCode::NotFound, "no such run");
            };
            let Some(record) = runs::interaction_by_id(connection, &interaction_id)? else {
                return refuse("rejected", ErrorCode::NotFound, "the run has no interaction with this id");
            };
            if record.run_id != run_id {
                return refuse("rejected", ErrorCode::NotFound, "the run has no interaction with this id");
            }
            if record.attempt_id != attempt_id {
                return refuse("rejected", ErrorCode::StaleAttempt, "the interaction belongs to another attempt; use the attempt id of the latest step contract");
            }
            // The named request, settled or not: a repeat after settlement adopts.
            agg.interaction = Some(record);
            if let Err(rejection) = interaction::check_authority(&agg, &authority, active_coordinator) {
                // A claim-loss code answers `claimLost` (a stale coordinator
                // epoch, a stale runner), any other `rejected`.
                let (code, message, outcome) = crate::wire::rejection(&rejection);
                return refuse(&crate::wire::codec_name(&outcome), code, message);
            }
            let stored = submissions::of_interaction(connection, &interaction_id)?;
            match interaction::submit(&agg, &stored, &interaction_id, new, now_ms) {
                Ok(Submitted::Validating { run, submission }) => {
                    let outputs = crate::shell::write_transition(connection, Some(&agg), run, &[], now_ms)?;
                    submissions::insert(connection, &submission, &payload_blob, now_ms)?;
                    Ok(Commit::Keep((
                        Decided::Wait {
                            submission_id: submission.submission_id,
                            adopted: false,
                        },
                        outputs,
                    )))
                }
                Ok(Submitted::Adopted(stored)) => Ok(Commit::Discard((
                    Decided::Wait {
                        submission_id: stored.submission_id,
                        adopted: true,
                    },
                    Vec::new(),
                ))),
                Err(rejection) => {
                    let (code, message, outcome) = crate::wire::rejection(&rejection);
                    let outcome = if code == ErrorCode::Conflict {
                        "conflict".to_owned()
                    } else {
                        crate::wire::codec_name(&outcome)
                    };
                    refuse(&outcome, code, message)
                }
            }
        })
        .await;
    drop(coordinators);
    let (submission_id, adopted) = match decided {
        Ok(Decided::Respond(value)) => return value,
        Ok(Decided::Wait {
            submission_id,
            adopted,
        }) => (submission_id, adopted),
        Err(error) => return unavailable(request_id, &error),
    };
    // The response waits for the durable outcome.
    loop {
        let settled = app.submission_settled.notified();
        tokio::pin!(settled);
        settled.as_mut().enable();
        let id = submission_id.clone();
        let stored = app
            .store
            .read(move |connection| submissions::stored(connection, &id))
            .await;
        match stored {
            Ok(Some(stored)) if stored.record.outcome != SubmissionOutcome::Validating => {
                return response(
                    request_id,
                    "interaction.submit",
                    if adopted { "adopted" } else { "accepted" },
                    None,
                    Some(receipt(&stored)),
                    None,
                );
            }
            Ok(Some(_)) => settled.await,
            Ok(None) => return refuse("rejected", ErrorCode::NotFound, "the submission is gone"),
            Err(error) => return unavailable(request_id, &error),
        }
    }
}

/// The answer when the store could not serve the submission.
fn unavailable(request_id: &str, error: &crate::store::StoreError) -> Value {
    response(
        request_id,
        "interaction.submit",
        "unavailable",
        None,
        None,
        Some(error.refusal()),
    )
}

/// The receipt of a settled submission (`Value::Null`, which `response`
/// answers as off its schema, should a stored fact not fit its type).
fn receipt(stored: &Stored) -> Value {
    let typed = || -> Option<InteractionSubmitReceipt> {
        Some(InteractionSubmitReceipt {
            accepted: stored
                .accepted_output
                .clone()
                .map(|output| AcceptedSubmission { output }),
            error: match &stored.error_message {
                Some(message) => Some(SafeError {
                    code: ErrorCode::ValidationFailed,
                    message: message.chars().take(512).collect::<String>().parse().ok()?,
                }),
                None => None,
            },
            outcome: crate::projection::run_view::to_wire("outcome", stored.record.outcome).ok()?,
            submission_id: stored.record.submission_id.as_str().parse().ok()?,
        })
    };
    typed().map_or(Value::Null, |typed| crate::wire::client::receipt(&typed))
}
