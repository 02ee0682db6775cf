//! `turn_intents` rows (`kernel::intent`): a run's unresolved intent, and
//! writing the intent the kernel decided with its card fields.
//!
//! Invariants:
//! - A row is written whole from the kernel's record: an upsert on the
//!   intent id that may add eligibility and a claiming message, never take
//!   them away (the kernel's record never does, and the SQL keeps a stored
//!   claim and eligibility).
//! - Reads are bounded: one run's intents (at most one unresolved).

use super::Cached as _;
use super::codec::{i64_of, json, name, parse, u64_of};
use kernel::ids::{AttemptId, MessageId, NodeId, RunId, SessionId, TurnIntentId, TurnSourceId};
use kernel::intent::IntentRecord;
use kernel::terminal::Presentation;
use rusqlite::{Connection, OptionalExtension, params};

/// The run's intent that no message claimed yet, if any.
pub(crate) fn open_of_run(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<IntentRecord>> {
    connection
        .query_row_cached(
            "SELECT intent_id, source_id, session_id, cause, node_id, attempt_id, eligible_at_ms,
                    stops_by_default, message_id, created_at_ms
             FROM turn_intents WHERE run_id = ?1 AND message_id IS NULL
             ORDER BY created_at_ms, intent_id LIMIT 1",
            params![run_id.as_str()],
            |row| {
                Ok(IntentRecord {
                    intent_id: TurnIntentId::new(row.get::<_, String>(0)?),
                    source_id: TurnSourceId::new(row.get::<_, String>(1)?),
                    session_id: SessionId::new(row.get::<_, String>(2)?),
                    run_id: run_id.clone(),
                    cause: parse(&row.get::<_, String>(3)?)?,
                    node_id: row.get::<_, Option<String>>(4)?.map(NodeId::new),
                    attempt_id: row.get::<_, Option<String>>(5)?.map(AttemptId::new),
                    eligible_at_ms: row.get::<_, Option<i64>>(6)?.map(u64_of),
                    stops_by_default: row.get::<_, i64>(7)? != 0,
                    message_id: row.get::<_, Option<String>>(8)?.map(MessageId::new),
                    created_at_ms: u64_of(row.get(9)?),
                })
            },
        )
        .optional()
}

/// Writes the kernel's `intent` (new, or a stored one advanced), with the
/// card fields of the message that claims it, when it has one.
pub(crate) fn write(
    connection: &Connection,
    intent: &IntentRecord,
    presentation: Option<&Presentation>,
) -> rusqlite::Result<()> {
    let presentation_json = presentation.map(json);
    connection.execute_cached(
        "INSERT INTO turn_intents (intent_id, source_id, session_id, run_id, cause, node_id,
             attempt_id, eligible_at_ms, stops_by_default, message_id, presentation_json, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT (intent_id) DO UPDATE SET
             eligible_at_ms = COALESCE(turn_intents.eligible_at_ms, excluded.eligible_at_ms),
             stops_by_default = MAX(turn_intents.stops_by_default, excluded.stops_by_default),
             message_id = COALESCE(turn_intents.message_id, excluded.message_id),
             presentation_json = COALESCE(excluded.presentation_json, turn_intents.presentation_json)",
        params![
            intent.intent_id.as_str(),
            intent.source_id.as_str(),
            intent.session_id.as_str(),
            intent.run_id.as_str(),
            name(&intent.cause),
            intent.node_id.as_ref().map(NodeId::as_str),
            intent.attempt_id.as_ref().map(AttemptId::as_str),
            intent.eligible_at_ms.map(i64_of),
            i64::from(intent.stops_by_default),
            intent.message_id.as_ref().map(MessageId::as_str),
            presentation_json,
            i64_of(intent.created_at_ms),
        ],
    )?;
    Ok(())
}
