//! The SQL of the client reads (`reads`): run-list rows, transitions,
//! workflow messages and the origin-session facts. Reads store nothing,
//! except `clear_terminal`'s one row.
//!
//! Invariant: the run list reads status facts only (the stored header of
//! each run's last presentation revision); it never loads run histories.

use super::Cached as _;
use crate::projection::run_view::{OffSchema, to_wire};
use kernel::ids::SessionId;
use protocol::generated::types as wire;
use rusqlite::{Connection, OptionalExtension, params};

/// One stored run-list row: run id, presentation revision, header text.
pub type ListRow = (String, i64, Option<String>);

/// The run list's revision.
pub(crate) fn list_revision(connection: &Connection) -> rusqlite::Result<i64> {
    connection.query_row_cached(
        "SELECT revision FROM viewer_list WHERE singleton = 1",
        [],
        |row| row.get(0),
    )
}

/// At most `limit` runs newest first after the keyset cursor
/// (`after_id` empty: from the newest).
pub(crate) fn list_rows(
    connection: &Connection,
    after_created: i64,
    after_id: &str,
    limit: usize,
) -> rusqlite::Result<Vec<ListRow>> {
    let mut statement = connection.prepare_cached(
        "SELECT r.run_id, v.presentation_revision, v.header_json
         FROM runs r JOIN viewer_runs v ON v.run_id = r.run_id
         WHERE (?2 = '' OR r.created_at_ms < ?1 OR (r.created_at_ms = ?1 AND r.run_id < ?2))
         ORDER BY r.created_at_ms DESC, r.run_id DESC LIMIT ?3",
    )?;
    let rows = statement.query_map(params![after_created, after_id, limit as i64], |row| {
        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
    })?;
    rows.collect()
}

/// Lifecycle events of a run, oldest first, from `offset`.
pub(crate) fn transitions(
    connection: &Connection,
    run_id: &kernel::ids::RunId,
    offset: usize,
    limit: usize,
) -> rusqlite::Result<Vec<wire::TransitionRecord>> {
    let mut statement = connection.prepare_cached(
        "SELECT seq, recorded_at_ms, kind, payload FROM events WHERE run_id = ?1 ORDER BY seq LIMIT ?2 OFFSET ?3",
    )?;
    let rows = statement.query_map(
        params![run_id.as_str(), limit as i64, offset as i64],
        |row| {
            let payload: String = row.get(3)?;
            Ok(wire::TransitionRecord {
                at_ms: crate::projection::run_view::timestamp("atMs", row.get(1)?)?,
                kind: to_wire("kind", row.get::<_, String>(2)?)?,
                // The payload is the kernel event, stored as JSON.
                payload: serde_json::from_str(&payload).map_err(|_| OffSchema("payload"))?,
                seq: u64::try_from(row.get::<_, i64>(0)?)
                    .ok()
                    .and_then(protocol::generated::constrained::Sequence::new)
                    .ok_or(OffSchema("seq"))?,
            })
        },
    )?;
    rows.collect()
}

/// Workflow messages of a run in session order, from `offset`.
pub(crate) fn run_messages(
    connection: &Connection,
    run_id: &kernel::ids::RunId,
    offset: usize,
    limit: usize,
) -> rusqlite::Result<Vec<wire::WorkflowMessage>> {
    let mut statement = connection.prepare_cached(
        "SELECT m.message_id, m.run_id, m.kind, m.state, m.session_order, m.content_digest, m.step_reason, m.entry_id,
                b.media_type, length(b.bytes), i.intent_id, i.cause, i.stops_by_default, i.presentation_json
         FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest
              LEFT JOIN turn_intents i ON i.message_id = m.message_id
         WHERE m.run_id = ?1 ORDER BY m.session_order LIMIT ?2 OFFSET ?3",
    )?;
    let rows = statement.query_map(
        params![run_id.as_str(), limit as i64, offset as i64],
        message_value,
    )?;
    rows.collect()
}

/// A workflow message record with the reference to its stored content (a
/// message is created with its content, so the join never drops one).
fn message_value(row: &rusqlite::Row<'_>) -> rusqlite::Result<wire::WorkflowMessage> {
    let digest: Vec<u8> = row.get(5)?;
    let order = row.get::<_, i64>(4)?;
    Ok(wire::WorkflowMessage {
        attempt_id: None,
        deferred_turn: deferred_turn(row)?,
        content: wire::ContentReference {
            bytes: u64::try_from(row.get::<_, i64>(9)?)
                .ok()
                .and_then(protocol::generated::constrained::ByteCount::new)
                .ok_or(OffSchema("content.bytes"))?,
            digest: to_wire("content.digest", format!("sha256:{}", hex::encode(digest)))?,
            media_type: to_wire("content.mediaType", row.get::<_, String>(8)?)?,
        },
        entry_id: row
            .get::<_, Option<String>>(7)?
            .map(|entry| to_wire("entryId", entry))
            .transpose()?,
        interaction_id: None,
        kind: to_wire("kind", row.get::<_, String>(2)?)?,
        message_id: to_wire("messageId", row.get::<_, String>(0)?)?,
        node_id: None,
        order: u64::try_from(order)
            .ok()
            .and_then(protocol::generated::constrained::Sequence::new)
            .ok_or(OffSchema("order"))?,
        run_id: to_wire("runId", row.get::<_, String>(1)?)?,
        state: to_wire("state", row.get::<_, String>(3)?)?,
        step_reason: row
            .get::<_, Option<String>>(6)?
            .map(|reason| to_wire("stepReason", reason))
            .transpose()?,
    })
}

/// The turn intent the message claimed (columns 10–13), with its card
/// fields.
fn deferred_turn(row: &rusqlite::Row<'_>) -> rusqlite::Result<Option<wire::DeferredTurn>> {
    let Some(intent_id) = row.get::<_, Option<String>>(10)? else {
        return Ok(None);
    };
    let presentation: String = row
        .get::<_, Option<String>>(13)?
        .ok_or(OffSchema("deferredTurn.presentation"))?;
    Ok(Some(wire::DeferredTurn {
        cause: to_wire("deferredTurn.cause", row.get::<_, String>(11)?)?,
        presentation: serde_json::from_str(&presentation)
            .map_err(|_| OffSchema("deferredTurn.presentation"))?,
        stops_by_default: row.get::<_, i64>(12)? != 0,
        turn_intent_id: to_wire("deferredTurn.turnIntentId", intent_id)?,
    }))
}

/// When `session`'s retained terminal view was last cleared (0: never).
pub(crate) fn cleared_at(connection: &Connection, session: &SessionId) -> rusqlite::Result<i64> {
    Ok(connection
        .query_row_cached(
            "SELECT cleared_at_ms FROM session_views WHERE session_id = ?1",
            params![session.as_str()],
            |row| row.get(0),
        )
        .optional()?
        .unwrap_or(0))
}

/// The session's newest nonterminal run.
pub(crate) fn active_run(
    connection: &Connection,
    session: &SessionId,
) -> rusqlite::Result<Option<String>> {
    connection
        .query_row_cached(
            "SELECT r.run_id FROM runs r JOIN run_bindings b ON b.run_id = r.run_id
             WHERE b.origin_session_id = ?1 AND r.status IN ('queued', 'running', 'waiting')
             ORDER BY r.created_at_ms DESC, r.run_id DESC LIMIT 1",
            params![session.as_str()],
            |row| row.get(0),
        )
        .optional()
}

/// Every pending workflow message of the session, every message of a
/// nonterminal run whatever its state (a cancelled one too: branch evidence
/// turns it into `sent`, and a branch report may name only ids of this
/// window), and every sent terminal or follow-up message whose first turn has
/// not ended (the turn it opens is reported against it), in session order:
/// the window `store::sessions::load` gives the kernel.
pub(crate) fn session_messages(
    connection: &Connection,
    session: &SessionId,
) -> rusqlite::Result<Vec<wire::WorkflowMessage>> {
    let mut statement = connection.prepare_cached(
        "SELECT m.message_id, m.run_id, m.kind, m.state, m.session_order, m.content_digest, m.step_reason, m.entry_id,
                b.media_type, length(b.bytes), i.intent_id, i.cause, i.stops_by_default, i.presentation_json
         FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest
              LEFT JOIN turn_intents i ON i.message_id = m.message_id
         WHERE m.session_id = ?1
           AND (m.state = 'pending'
                OR m.run_id IN (SELECT r.run_id FROM runs r WHERE r.status IN ('queued', 'running', 'waiting'))
                OR (m.state = 'sent' AND m.kind IN ('terminal', 'followUp') AND NOT EXISTS (
                    SELECT 1 FROM workflow_turns t WHERE t.message_id = m.message_id AND t.state <> 'open')))
         ORDER BY m.session_order",
    )?;
    let rows = statement.query_map(params![session.as_str()], message_value)?;
    rows.collect()
}

/// The session revision: the presentation revisions of its runs plus the
/// versions of its messages.
pub(crate) fn session_revision(
    connection: &Connection,
    session: &SessionId,
) -> rusqlite::Result<i64> {
    let runs_revision: i64 = connection.query_row_cached(
        "SELECT COALESCE(SUM(v.presentation_revision), 0) FROM viewer_runs v JOIN run_bindings b ON b.run_id = v.run_id
         WHERE b.origin_session_id = ?1",
        params![session.as_str()],
        |row| row.get(0),
    )?;
    let message_changes: i64 = connection.query_row_cached(
        "SELECT COALESCE(SUM(version), 0) FROM workflow_messages WHERE session_id = ?1",
        params![session.as_str()],
        |row| row.get(0),
    )?;
    Ok(runs_revision + message_changes)
}

/// The most recent terminal run of the session while it stays visible: its
/// terminal message is pending, sent before its first turn, or in its first
/// turn, and for `retention_ms` after that turn ended (without a terminal
/// message: for `retention_ms` after the run finished). See
/// `reads::session_document`.
pub(crate) fn retained_terminal(
    connection: &Connection,
    session: &SessionId,
    now_ms: u64,
    cleared_at_ms: i64,
    retention_ms: u64,
) -> rusqlite::Result<Option<String>> {
    connection
        .query_row_cached(
            "WITH latest AS (
               SELECT r.run_id, r.finished_at_ms FROM runs r JOIN run_bindings b ON b.run_id = r.run_id
               WHERE b.origin_session_id = ?1 AND r.finished_at_ms IS NOT NULL AND r.finished_at_ms > ?4
               ORDER BY r.finished_at_ms DESC, r.run_id DESC LIMIT 1),
             terminal AS (
               SELECT m.message_id, m.state FROM workflow_messages m JOIN latest USING (run_id)
               WHERE m.kind = 'terminal'),
             first_turn AS (
               SELECT t.state, t.ended_at_ms FROM workflow_turns t JOIN terminal USING (message_id)
               ORDER BY t.started_at_ms, t.turn_id LIMIT 1)
             SELECT run_id FROM latest
             WHERE EXISTS (SELECT 1 FROM terminal WHERE state = 'pending')
                OR (EXISTS (SELECT 1 FROM terminal WHERE state = 'sent') AND NOT EXISTS (SELECT 1 FROM first_turn))
                OR EXISTS (SELECT 1 FROM first_turn WHERE state = 'open' OR ended_at_ms + ?2 > ?3)
                OR (NOT EXISTS (SELECT 1 FROM terminal) AND latest.finished_at_ms + ?2 > ?3)",
            params![
                session.as_str(),
                retention_ms as i64,
                now_ms as i64,
                cleared_at_ms
            ],
            |row| row.get(0),
        )
        .optional()
}

/// `sessionView.clearTerminal`: hides the retained terminal run.
pub(crate) fn clear_terminal(
    connection: &Connection,
    session: &SessionId,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO session_views (session_id, cleared_at_ms) VALUES (?1, ?2)
         ON CONFLICT (session_id) DO UPDATE SET cleared_at_ms = excluded.cleared_at_ms",
        params![session.as_str(), now_ms as i64],
    )?;
    Ok(())
}
