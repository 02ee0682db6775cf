//! `selected_launches` rows (`kernel::launch`): the one launch a terminal
//! decision turn's intent reserved, and the facts the one-launch rule reads.
//!
//! Invariants:
//! - One row per intent (the primary key) and per run: a second reservation
//!   of an intent cannot be written even if a caller skipped the kernel.
//! - Reads are bounded: one message with its intent, one intent's row, one
//!   run's launch facts.

use super::Cached as _;
use super::codec::{DigestColumn, i64_of};
use kernel::ids::{MessageId, RunId, SessionId, TurnIntentId};
use kernel::launch::{Reservation, SourceMessage};
use rusqlite::{Connection, OptionalExtension, params};

/// The workflow message `message_id` with the intent it claimed, if the
/// message exists.
pub(crate) fn source_message(
    connection: &Connection,
    message_id: &MessageId,
) -> rusqlite::Result<Option<SourceMessage>> {
    connection
        .query_row_cached(
            "SELECT m.session_id, m.kind, m.state, i.intent_id
             FROM workflow_messages m LEFT JOIN turn_intents i ON i.message_id = m.message_id
             WHERE m.message_id = ?1",
            params![message_id.as_str()],
            |row| {
                Ok(SourceMessage {
                    message_id: message_id.clone(),
                    session_id: SessionId::new(row.get::<_, String>(0)?),
                    terminal: row.get::<_, String>(1)? == "terminal",
                    sent: row.get::<_, String>(2)? == "sent",
                    intent_id: row.get::<_, Option<String>>(3)?.map(TurnIntentId::new),
                })
            },
        )
        .optional()
}

/// The launch the intent reserved, if any.
pub(crate) fn of_intent(
    connection: &Connection,
    intent_id: &TurnIntentId,
) -> rusqlite::Result<Option<Reservation>> {
    connection
        .query_row_cached(
            "SELECT tool_call_id, request_fingerprint, run_id FROM selected_launches
             WHERE intent_id = ?1",
            params![intent_id.as_str()],
            |row| {
                Ok(Reservation {
                    intent_id: intent_id.clone(),
                    tool_call_id: row.get(0)?,
                    fingerprint: row.get::<_, DigestColumn>(1)?.0,
                    run_id: RunId::new(row.get::<_, String>(2)?),
                })
            },
        )
        .optional()
}

/// Records the reservation the kernel decided, with its run (written in the
/// transaction that reserves the run).
pub(crate) fn insert(
    connection: &Connection,
    reservation: &Reservation,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO selected_launches (intent_id, run_id, tool_call_id, request_fingerprint, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            reservation.intent_id.as_str(),
            reservation.run_id.as_str(),
            reservation.tool_call_id,
            reservation.fingerprint.0.to_vec(),
            i64_of(now_ms),
        ],
    )?;
    Ok(())
}

/// The launch facts of `run_id` `kernel::intent::launch_failed` reads:
/// whether it is a selected launch, and whether any node attempt started.
pub(crate) fn launch_facts(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<kernel::intent::LaunchFacts> {
    connection.query_row_cached(
        "SELECT EXISTS (SELECT 1 FROM selected_launches WHERE run_id = ?1),
                EXISTS (SELECT 1 FROM node_attempts WHERE run_id = ?1)",
        params![run_id.as_str()],
        |row| {
            Ok(kernel::intent::LaunchFacts {
                selected_launch: row.get::<_, i64>(0)? != 0,
                node_started: row.get::<_, i64>(1)? != 0,
            })
        },
    )
}
