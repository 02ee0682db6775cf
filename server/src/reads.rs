//! Reads: the run list, run-view pages, referenced content and the
//! origin-session view. Reads store no receipts.
//!
//! Invariants:
//! - The run list reads status facts only (the stored header of each run's
//!   last presentation revision); it never loads run histories.
//! - Pages have an item limit and an encoded byte budget (at most
//!   `PAGE_BYTES` whatever the client asks, at least one item) and echo the
//!   cursor and revision they were read at, so a page always fits a frame.
//! - Content is served only under its exact run id, digest and media type; a
//!   reference from another run or another media type is unavailable.

use crate::store::Cached as _;
use base64::Engine as _;
use kernel::ids::{RunId, SessionId};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Value, json};

/// Rows per run-list page unless the client asks for fewer.
pub const LIST_PAGE: usize = 100;
/// Byte budget of one page: what a client asks for, at most this.
pub const PAGE_BYTES: usize = 512 * 1024;
/// Bytes per content chunk at most.
pub const CHUNK_BYTES: usize = 512 * 1024;
/// How long a terminal run stays in its origin-session view after the first
/// turn of its terminal message ended (or after it finished, without one).
pub const TERMINAL_RETENTION_MS: u64 = 60_000;
/// Byte budget of the origin-session message window.
pub const SESSION_WINDOW_BYTES: usize = 256 * 1024;

/// One page of the run list: rows, the next cursor and the list revision.
pub fn run_list(
    connection: &Connection,
    cursor: Option<&str>,
    limit: usize,
    max_bytes: Option<usize>,
) -> rusqlite::Result<(Vec<Value>, Option<String>, u64)> {
    let revision: i64 = connection.query_row_cached(
        "SELECT revision FROM viewer_list WHERE singleton = 1",
        [],
        |row| row.get(0),
    )?;
    let (after_created, after_id) = cursor
        .and_then(|cursor| cursor.split_once(':'))
        .and_then(|(created, id)| Some((created.parse::<i64>().ok()?, id.to_owned())))
        .unwrap_or((i64::MAX, String::new()));
    let limit = limit.clamp(1, 1000);
    let mut statement = connection.prepare_cached(
        "SELECT r.run_id, r.created_at_ms, v.presentation_revision, v.header_json
         FROM runs r JOIN viewer_runs v ON v.run_id = r.run_id
         WHERE (?2 = '' OR r.created_at_ms < ?1 OR (r.created_at_ms = ?1 AND r.run_id < ?2))
         ORDER BY r.created_at_ms DESC, r.run_id DESC LIMIT ?3",
    )?;
    let budget = max_bytes.unwrap_or(PAGE_BYTES).min(PAGE_BYTES);
    let mut rows = Vec::new();
    let mut used = 0;
    let mut next = None;
    let fetched: Vec<(String, i64, i64, Option<String>)> = statement
        .query_map(
            params![after_created, after_id, (limit + 1) as i64],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )?
        .collect::<rusqlite::Result<_>>()?;
    for (index, (run_id, _, presentation, header)) in fetched.iter().enumerate() {
        let row = list_row(run_id, *presentation, header.as_deref());
        let size = crate::view::encoded_len(&row);
        if index == limit || (!rows.is_empty() && used + size > budget) {
            next = Some(String::new());
            break;
        }
        used += size;
        rows.push(row);
    }
    if next.is_some() {
        // The cursor names the last row included.
        if let Some(last) = rows.last() {
            let created = last["createdAtMs"].as_u64().unwrap_or(0);
            let id = last["runId"].as_str().unwrap_or_default();
            next = Some(format!("{created}:{id}"));
        }
    }
    Ok((rows, next, revision.max(0) as u64))
}

fn list_row(run_id: &str, presentation: i64, header: Option<&str>) -> Value {
    let header: Value = header
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or(json!({}));
    let mut row = json!({
        "runId": run_id,
        "revision": presentation.max(0),
        "workflowName": header["workflowName"],
        "status": header["status"],
        "display": header["display"],
        "createdAtMs": header["createdAtMs"],
        "updatedAtMs": header["updatedAtMs"],
    });
    for key in ["title", "finishedAtMs"] {
        if let Some(value) = header.get(key) {
            row[key] = value.clone();
        }
    }
    if let Some(reason) = row.pointer("/display/reason").and_then(Value::as_str)
        && reason.chars().count() > crate::view::INLINE_REASON_CHARS
    {
        // The list row carries a bounded reason; the full one is in the run view.
        row["display"]["reason"] = json!(
            reason
                .chars()
                .take(crate::view::INLINE_REASON_CHARS)
                .collect::<String>()
        );
    }
    row
}

/// One page of a run-view collection.
pub fn view_page(
    connection: &Connection,
    run_id: &RunId,
    collection: &str,
    cursor: Option<&str>,
    limit: usize,
    max_bytes: usize,
) -> rusqlite::Result<Option<Value>> {
    if crate::store::runs::load(connection, run_id)?.is_none() {
        return Ok(None);
    }
    let revision = crate::view::presentation_revision(connection, run_id)?;
    let offset: usize = cursor.and_then(|cursor| cursor.parse().ok()).unwrap_or(0);
    let limit = limit.clamp(1, 1000);
    let items: Vec<Value> = match collection {
        "steps" => crate::view::steps(connection, run_id)?
            .into_iter()
            .skip(offset)
            .take(limit + 1)
            .collect(),
        "updates" => crate::view::update_page(connection, run_id, offset, limit + 1)?,
        "transitions" => transitions(connection, run_id, offset, limit + 1)?,
        "messages" => run_messages(connection, run_id, offset, limit + 1)?,
        _ => Vec::new(),
    };
    let fetched = items.len();
    let shown = crate::view::page_prefix(
        items.iter().map(crate::view::encoded_len),
        limit,
        max_bytes.min(PAGE_BYTES),
    );
    let more = shown < fetched;
    let mut page = items;
    page.truncate(shown);
    let mut value = json!({ "collection": collection, "revision": revision, "items": page });
    if let Some(cursor) = cursor {
        value["cursor"] = json!(cursor);
    }
    if more {
        value["nextCursor"] =
            json!((offset + value["items"].as_array().map_or(0, Vec::len)).to_string());
    }
    Ok(Some(value))
}

fn transitions(
    connection: &Connection,
    run_id: &RunId,
    offset: usize,
    limit: usize,
) -> rusqlite::Result<Vec<Value>> {
    let mut statement = connection.prepare_cached(
        "SELECT seq, recorded_at_ms, kind, payload FROM events WHERE run_id = ?1 ORDER BY seq LIMIT ?2 OFFSET ?3",
    )?;
    let rows = statement.query_map(
        params![run_id.as_str(), limit as i64, offset as i64],
        |row| {
            let payload: String = row.get(3)?;
            Ok(json!({
                "seq": row.get::<_, i64>(0)?,
                "atMs": row.get::<_, i64>(1)?,
                "kind": row.get::<_, String>(2)?,
                "payload": serde_json::from_str::<Value>(&payload).unwrap_or(Value::Null),
            }))
        },
    )?;
    rows.collect()
}

fn run_messages(
    connection: &Connection,
    run_id: &RunId,
    offset: usize,
    limit: usize,
) -> rusqlite::Result<Vec<Value>> {
    let mut statement = connection.prepare_cached(
        "SELECT m.message_id, m.run_id, m.kind, m.state, m.session_order, m.content_digest, m.step_reason, m.entry_id,
                b.media_type, length(b.bytes)
         FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest
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
fn message_value(row: &rusqlite::Row<'_>) -> rusqlite::Result<Value> {
    let digest: Vec<u8> = row.get(5)?;
    let mut message = json!({
        "messageId": row.get::<_, String>(0)?,
        "runId": row.get::<_, String>(1)?,
        "kind": row.get::<_, String>(2)?,
        "state": row.get::<_, String>(3)?,
        "order": row.get::<_, i64>(4)?,
        "content": {
            "digest": format!("sha256:{}", hex::encode(digest)),
            "mediaType": row.get::<_, String>(8)?,
            "bytes": row.get::<_, i64>(9)?,
        },
    });
    if let Some(reason) = row.get::<_, Option<String>>(6)? {
        message["stepReason"] = json!(reason);
    }
    if let Some(entry) = row.get::<_, Option<String>>(7)? {
        message["entryId"] = json!(entry);
    }
    Ok(message)
}

/// One chunk of referenced content of `run_id`.
pub fn content_chunk(
    connection: &Connection,
    run_id: &RunId,
    reference: &Value,
    offset: usize,
    length: usize,
) -> rusqlite::Result<Result<Value, &'static str>> {
    let digest = reference
        .get("digest")
        .and_then(Value::as_str)
        .and_then(|text| crate::effects::parse_digest(Some(text)));
    let media_type = reference
        .get("mediaType")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Some(digest) = digest else {
        return Ok(Err("the reference digest is malformed"));
    };
    let bytes: Option<Vec<u8>> = connection
        .query_row_cached(
            "SELECT bytes FROM run_view_content WHERE run_id = ?1 AND digest = ?2 AND media_type = ?3",
            params![run_id.as_str(), digest.0.to_vec(), media_type],
            |row| row.get(0),
        )
        .optional()?;
    // A workflow message's content is stored once, in `blobs`, under the run
    // it belongs to (the coordinator reads it before it sends the message).
    let bytes = match bytes {
        Some(bytes) => Some(bytes),
        None => {
            crate::store::sessions::message_content_bytes(connection, run_id, &digest, media_type)?
        }
    };
    let Some(bytes) = bytes else {
        return Ok(Err("no such content for this run and media type"));
    };
    let (data, last) = match part_of(&bytes, reference, offset, length) {
        Ok(part) => part,
        Err(message) => return Ok(Err(message)),
    };
    Ok(Ok(json!({
        "reference": reference,
        "digest": crate::ids::digest_text(&digest),
        "offset": offset,
        "data": data,
        "final": last,
    })))
}

/// One part of stored content: base64 of at most `length` (and at most
/// 512 KiB) bytes from `offset`, and whether it reaches the end. The
/// reference must name the stored length; the offset must be inside it.
pub fn part_of(
    bytes: &[u8],
    reference: &Value,
    offset: usize,
    length: usize,
) -> Result<(String, bool), &'static str> {
    if reference.get("bytes").and_then(Value::as_u64) != Some(bytes.len() as u64) {
        return Err("the reference length does not match the content");
    }
    if offset > bytes.len() {
        return Err("the offset is past the end of the content");
    }
    let end = offset
        .saturating_add(length.min(CHUNK_BYTES))
        .min(bytes.len());
    let data = base64::engine::general_purpose::STANDARD.encode(&bytes[offset..end]);
    Ok((data, end == bytes.len()))
}

/// The origin-session view from one consistent read: the active run view
/// (or the most recent terminal run while it is retained), the window of
/// workflow messages with their complete count, and the session revision.
pub fn session_view(connection: &Connection, session: &SessionId) -> rusqlite::Result<Value> {
    let now_ms = crate::clock::now_ms();
    let cleared_at: i64 = connection
        .query_row_cached(
            "SELECT cleared_at_ms FROM session_views WHERE session_id = ?1",
            params![session.as_str()],
            |row| row.get(0),
        )
        .optional()?
        .unwrap_or(0);
    let active: Option<String> = connection
        .query_row_cached(
            "SELECT r.run_id FROM runs r JOIN run_bindings b ON b.run_id = r.run_id
             WHERE b.origin_session_id = ?1 AND r.status IN ('queued', 'running', 'waiting')
             ORDER BY r.created_at_ms DESC, r.run_id DESC LIMIT 1",
            params![session.as_str()],
            |row| row.get(0),
        )
        .optional()?;
    let retained: Option<String> = match active {
        Some(run) => Some(run),
        None => retained_terminal(connection, session, now_ms, cleared_at)?,
    };
    let mut statement = connection.prepare_cached(
        "SELECT m.message_id, m.run_id, m.kind, m.state, m.session_order, m.content_digest, m.step_reason, m.entry_id,
                b.media_type, length(b.bytes)
         FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest
         WHERE m.session_id = ?1
           AND (m.state = 'pending' OR (m.state = 'sent' AND m.run_id IN (
                SELECT r.run_id FROM runs r WHERE r.status IN ('queued', 'running', 'waiting'))))
         ORDER BY m.session_order",
    )?;
    let all: Vec<Value> = statement
        .query_map(params![session.as_str()], message_value)?
        .collect::<rusqlite::Result<_>>()?;
    let count = all.len();
    let mut messages = Vec::new();
    let mut used = 0;
    for message in all {
        let size = serde_json::to_string(&message).map_or(0, |text| text.len());
        if !messages.is_empty() && used + size > SESSION_WINDOW_BYTES {
            break;
        }
        used += size;
        messages.push(message);
    }
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
    let mut view = json!({
        "sessionId": session.as_str(),
        "revision": (runs_revision + message_changes).max(0),
        "messages": messages,
        "messageCount": count,
    });
    if let Some(run_id) = retained
        && let Some(run_view) = crate::view::build_in(connection, &RunId::new(run_id))?
    {
        view["activeRun"] = run_view;
    }
    Ok(view)
}

/// The most recent terminal run of the session while it stays visible: its
/// terminal workflow message is pending, or the first model turn of that
/// message is open or ended less than 60 seconds ago (a run without a
/// terminal message: less than 60 seconds after it finished). A newer
/// terminal run or `sessionView.clearTerminal` hides it.
fn retained_terminal(
    connection: &Connection,
    session: &SessionId,
    now_ms: u64,
    cleared_at_ms: i64,
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
                OR EXISTS (SELECT 1 FROM first_turn WHERE state = 'open' OR ended_at_ms + ?2 > ?3)
                OR (NOT EXISTS (SELECT 1 FROM terminal) AND latest.finished_at_ms + ?2 > ?3)",
            params![
                session.as_str(),
                TERMINAL_RETENTION_MS as i64,
                now_ms as i64,
                cleared_at_ms
            ],
            |row| row.get(0),
        )
        .optional()
}

/// `sessionView.clearTerminal`: hides the retained terminal run.
pub fn clear_terminal(connection: &Connection, session: &SessionId) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO session_views (session_id, cleared_at_ms) VALUES (?1, ?2)
         ON CONFLICT (session_id) DO UPDATE SET cleared_at_ms = excluded.cleared_at_ms",
        params![session.as_str(), crate::clock::now_ms() as i64],
    )?;
    Ok(())
}
