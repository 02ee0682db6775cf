//! The facts `run.why` reads (`kernel::why`), in one read snapshot.
//!
//! Invariants:
//! - Bounded: the run's current aggregate (`runs::load_current`, no step
//!   list), one indexed lookup each for the runner's last accepted message,
//!   the run's last event and its queue place, and the two header facts the
//!   view reads too (`view_facts`).
//! - Private values are never read: no claim token, payload, reply, prompt,
//!   output, session id or path leaves this module (the runner's last
//!   message is its time only, the last event its kind only).

use super::Cached as _;
use super::{runs, view_facts};
use kernel::ids::RunId;
use kernel::run::{QueueStatus, RunStatus};
use kernel::why::{OutsideFacts, QueueFact, WhyFacts};
use rusqlite::{Connection, OptionalExtension, params};

/// The runner slots the admission round counts (process-local, from the
/// server's registries).
#[derive(Clone, Copy, Debug)]
pub struct Slots {
    pub occupied: u64,
    pub capacity: u64,
}

/// The explainer's facts of `run_id`, or `None` when the run does not exist.
pub fn facts(
    connection: &Connection,
    run_id: &RunId,
    slots: Slots,
) -> rusqlite::Result<Option<WhyFacts>> {
    let Some(agg) = runs::load_current(connection, run_id)? else {
        return Ok(None);
    };
    let last_message_at_ms = match &agg.run.runner {
        Some(runner) => connection
            .query_row_cached(
                "SELECT MAX(created_at_ms) FROM worker_messages WHERE runner_epoch = ?1",
                params![runner.runner_epoch.as_str()],
                |row| row.get::<_, Option<i64>>(0),
            )?
            .map(|ms| ms.max(0) as u64),
        None => None,
    };
    let last_event: Option<String> = connection
        .query_row_cached(
            "SELECT kind FROM events WHERE run_id = ?1 ORDER BY seq DESC LIMIT 1",
            params![run_id.as_str()],
            |row| row.get(0),
        )
        .optional()?;
    let admissible = !agg.run.paused
        && matches!(
            (agg.run.status, agg.run.queue),
            (RunStatus::Queued, QueueStatus::Queued) | (RunStatus::Running, QueueStatus::Parked)
        );
    let queue_position = if admissible {
        // The admission order (`runs::admission_candidates`): oldest first.
        let ahead: i64 = connection.query_row_cached(
            "SELECT COUNT(*) FROM runs r JOIN run_queue q ON q.run_id = r.run_id
             JOIN run_queue mine ON mine.run_id = ?1
             WHERE r.paused = 0 AND ((r.status = 'queued' AND q.status = 'queued') OR (r.status = 'running' AND q.status = 'parked'))
             AND (q.queued_at_ms < mine.queued_at_ms OR (q.queued_at_ms = mine.queued_at_ms AND r.run_id < ?1))",
            params![run_id.as_str()],
            |row| row.get(0),
        )?;
        Some(QueueFact {
            position: ahead.max(0) as u64 + 1,
            live_runners: slots.occupied,
            capacity: slots.capacity,
        })
    } else {
        None
    };
    let outside = OutsideFacts {
        validating: view_facts::submission_validating(connection, &agg)?,
        restart_eligible: view_facts::restart_eligible(connection, &agg)?,
        last_message_at_ms,
        queue_position,
        last_event,
    };
    Ok(Some(WhyFacts::from_run(&agg, outside)))
}
