//! Finishing an interactive attempt from its settled interaction (the
//! kernel's `AttemptFollowUp`): one write step, run inside the transaction
//! that settled the submission (a verdict, a coordinator's turn report).
//! Loads the run and its topology, lets the kernel finish the attempt and
//! writes the result; a kernel refusal is logged and writes nothing.

use crate::store::attempts::{self, AttemptResult};
use crate::store::blobs::Blob;
use crate::store::{meta, runs, submissions};
use kernel::attempt::{NodeOutcome, ResultRecord};
use kernel::claim::ClaimRequest;
use kernel::ids::AttemptId;
use kernel::interaction::AttemptFollowUp;
use kernel::output::Output;
use kernel::reject::Coded as _;
use rusqlite::Connection;

/// Finishes the waiting attempt of an interactive request on the server's
/// control path (`Actor::Control`), in the caller's transaction: `ok` with
/// the accepted submission's output, or `failed` after too many unproductive
/// turns. The route parks the run `resumeReady` (the next generation runs
/// the next node) or ends it.
pub(crate) fn apply(
    connection: &Connection,
    control: &ClaimRequest,
    ttl_ms: u64,
    follow_up: &AttemptFollowUp,
    now_ms: u64,
) -> rusqlite::Result<Vec<Output>> {
    let (run_id, attempt_id) = match follow_up {
        AttemptFollowUp::FinishOk {
            run_id, attempt_id, ..
        }
        | AttemptFollowUp::Fail {
            run_id, attempt_id, ..
        } => (run_id, attempt_id),
    };
    let (Some(before), Some(meta)) = (
        runs::load(connection, run_id)?,
        meta::load(connection, run_id)?,
    ) else {
        return Ok(Vec::new());
    };
    let Some(topology) = meta::topology(connection, &meta.definition_digest)? else {
        return Ok(Vec::new());
    };
    let Some(attempt) = before
        .attempt
        .clone()
        .filter(|attempt| attempt.attempt_id == *attempt_id)
    else {
        return Ok(Vec::new());
    };
    let (outcome, output, error, failure) = match follow_up {
        AttemptFollowUp::FinishOk { submission_id, .. } => {
            let stored = submissions::stored(connection, submission_id)?;
            let output = match stored.and_then(|stored| stored.accepted_output) {
                Some(output) => Some(output),
                None => submissions::payload(connection, submission_id)?,
            };
            (NodeOutcome::Ok, output, None, None)
        }
        AttemptFollowUp::Fail { reason, .. } => (
            NodeOutcome::Failed,
            None,
            Some("the agent ended its turn without submitting the step's output three times"),
            Some(*reason),
        ),
    };
    let record = ResultRecord::of(&attempt, &topology, outcome, now_ms)
        .output(output.as_ref())
        .error(error)
        .to_value();
    let finished = kernel::execution::finish_attempt(
        &before,
        &topology,
        kernel::execution::Actor::Control {
            request: control.clone(),
            failure,
        },
        attempt_id,
        kernel::execution::NodeResult { outcome, record },
        AttemptId::new(format!("att-{}", crate::ids::random_hex::<8>())),
        now_ms,
        ttl_ms,
    );
    match finished {
        Ok((transition, _dispatch)) => {
            let run_failed = transition.facts.run.error.is_some();
            let outputs =
                crate::shell::write_transition(connection, Some(&before), transition, &[], now_ms)?;
            let stored = AttemptResult {
                output: output.as_ref().map(Blob::json),
                error_message: error.map(str::to_owned),
                ..AttemptResult::default()
            };
            attempts::record_result(connection, run_id, attempt_id, &stored, now_ms)?;
            if let (Some(message), Some(_)) = (error, run_failed.then_some(())) {
                runs::record_error_message(connection, run_id, message)?;
            }
            Ok(outputs)
        }
        Err(rejection) => {
            log_refused("finishing an interactive attempt", &rejection);
            Ok(Vec::new())
        }
    }
}

fn log_refused(what: &str, rejection: &kernel::run::Rejection) {
    crate::log::line(&format!(
        "{what} was refused by the run: {}",
        rejection.message()
    ));
}
