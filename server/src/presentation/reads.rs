//! Reads: the run list, run-view pages, referenced content and the
//! origin-session view. Reads store no receipts. Their SQL is in
//! `store::view_reads`, `store::view_facts` and `store::viewer`.
//!
//! Invariants:
//! - The run list reads status facts only (the stored header of each run's
//!   last presentation revision); it never loads run histories.
//! - Pages have an item limit and an encoded byte budget (at most
//!   `PAGE_BYTES` whatever the client asks, at least one item) and echo the
//!   cursor and revision they were read at, so a page always fits a frame.
//! - Content is served only under its exact run id, digest and media type; a
//!   reference from another run or another media type is unavailable.

use crate::projection::run_view::{OffSchema, to_wire};
use crate::store::{view_facts, view_reads, viewer};
use base64::Engine as _;
use kernel::ids::{RunId, SessionId};
use protocol::generated::types as wire;
use rusqlite::Connection;
use serde::Serialize;
use serde_json::Value;

/// Rows per run-list page unless the client asks for fewer.
pub const LIST_PAGE: usize = 100;
/// Byte budget of one page: what a client asks for, at most this.
pub const PAGE_BYTES: usize = 512 * 1024;
/// Bytes per content chunk at most.
pub const CHUNK_BYTES: usize = 512 * 1024;
/// How long a terminal run stays in its origin-session view after the first
/// turn of its terminal message ended (or after it finished, without one).
pub const TERMINAL_RETENTION_MS: u64 = 60_000;
/// Rows of a captured-session-event page at most.
pub const SESSION_EVENTS_PAGE: usize = kernel::capture::MAX_BATCH;
/// Byte budget of the origin-session message window.
pub const SESSION_WINDOW_BYTES: usize = 256 * 1024;

/// One page of the run list as typed rows, the next cursor and the list
/// revision.
pub fn run_list_rows(
    connection: &Connection,
    cursor: Option<&str>,
    limit: usize,
    max_bytes: Option<usize>,
) -> rusqlite::Result<(Vec<wire::RunListRow>, Option<String>, u64)> {
    let revision = view_reads::list_revision(connection)?;
    let (after_created, after_id) = cursor
        .and_then(|cursor| cursor.split_once(':'))
        .and_then(|(created, id)| Some((created.parse::<i64>().ok()?, id.to_owned())))
        .unwrap_or((i64::MAX, String::new()));
    let limit = limit.clamp(1, 1000);
    let budget = max_bytes.unwrap_or(PAGE_BYTES).min(PAGE_BYTES);
    let mut rows = Vec::new();
    let mut used = 0;
    let mut next = None;
    let fetched = view_reads::list_rows(connection, after_created, &after_id, limit + 1)?;
    for (index, (run_id, presentation, header)) in fetched.iter().enumerate() {
        let row = list_row(run_id, *presentation, header.as_deref())?;
        let size = crate::projection::run_view::encoded_len(&row);
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
            next = Some(format!(
                "{}:{}",
                last.created_at_ms.get(),
                last.run_id.as_str()
            ));
        }
    }
    Ok((rows, next, revision.max(0) as u64))
}

/// A run-list row: the status facts of the run's stored header (whose
/// reason is already bounded: a long one is a reference).
fn list_row(
    run_id: &str,
    presentation: i64,
    header: Option<&str>,
) -> Result<wire::RunListRow, OffSchema> {
    let header: crate::projection::run_view::Header = header
        .and_then(|text| serde_json::from_str(text).ok())
        .ok_or(OffSchema("header"))?;
    Ok(wire::RunListRow {
        created_at_ms: header.created_at_ms,
        display: header.display,
        finished_at_ms: header.finished_at_ms,
        revision: crate::projection::run_view::revision(presentation.max(0) as u64)?,
        run_id: to_wire("runId", run_id)?,
        status: header.status,
        title: header.title,
        updated_at_ms: header.updated_at_ms,
        workflow_name: header.workflow_name,
    })
}

/// One page of a run-view collection.
pub fn view_page(
    connection: &Connection,
    run_id: &RunId,
    collection: &str,
    cursor: Option<&str>,
    limit: usize,
    max_bytes: usize,
) -> rusqlite::Result<Option<wire::ViewPage>> {
    if crate::store::runs::load_current(connection, run_id)?.is_none() {
        return Ok(None);
    }
    let revision = viewer::presentation_revision(connection, run_id)?;
    let offset: usize = cursor.and_then(|cursor| cursor.parse().ok()).unwrap_or(0);
    let collection: wire::PageCollection = to_wire("collection", collection)?;
    let limit = match collection {
        // Captured session events: at most 256 rows a read.
        wire::PageCollection::SessionEvents => limit.clamp(1, SESSION_EVENTS_PAGE),
        wire::PageCollection::Steps
        | wire::PageCollection::Updates
        | wire::PageCollection::Transitions
        | wire::PageCollection::Messages => limit.clamp(1, 1000),
    };
    // A page's items are any JSON in the schema (each collection has its
    // own item type): the typed items become values here.
    fn values<T: Serialize>(items: Vec<T>) -> rusqlite::Result<Vec<Value>> {
        items
            .iter()
            .map(|item| Ok(serde_json::to_value(item).map_err(|_| OffSchema("item"))?))
            .collect()
    }
    let items: Vec<Value> = match collection {
        wire::PageCollection::Steps => {
            values(viewer::step_items(connection, run_id, offset, limit + 1)?)?
        }
        wire::PageCollection::Updates => values(view_facts::update_page(
            connection,
            run_id,
            offset,
            limit + 1,
        )?)?,
        wire::PageCollection::Transitions => values(view_reads::transitions(
            connection,
            run_id,
            offset,
            limit + 1,
        )?)?,
        wire::PageCollection::Messages => values(view_reads::run_messages(
            connection,
            run_id,
            offset,
            limit + 1,
        )?)?,
        wire::PageCollection::SessionEvents => values(crate::store::capture::page(
            connection,
            run_id,
            offset,
            limit + 1,
        )?)?,
    };
    let fetched = items.len();
    let shown = crate::projection::run_view::page_prefix(
        items.iter().map(crate::projection::run_view::encoded_len),
        limit,
        max_bytes.min(PAGE_BYTES),
    );
    let mut items = items;
    items.truncate(shown);
    // A session-event page names the replay checkpoint it may start from.
    let checkpoint = match collection {
        wire::PageCollection::SessionEvents => {
            crate::store::capture::checkpoint_before(connection, run_id, offset)?
                .map(|(digest, bytes)| checkpoint_reference(&digest, bytes))
                .transpose()?
        }
        wire::PageCollection::Steps
        | wire::PageCollection::Updates
        | wire::PageCollection::Transitions
        | wire::PageCollection::Messages => None,
    };
    let page = wire::ViewPage {
        checkpoint,
        collection,
        cursor: cursor.map(|cursor| to_wire("cursor", cursor)).transpose()?,
        items,
        next_cursor: (shown < fetched)
            .then(|| crate::projection::run_view::cursor(offset + shown))
            .transpose()?,
        revision: crate::projection::run_view::revision(revision)?,
    };
    Ok(Some(page))
}

/// The content reference of a stored replay checkpoint (canonical JSON).
fn checkpoint_reference(
    digest: &kernel::ids::Digest,
    bytes: u64,
) -> Result<wire::ContentReference, OffSchema> {
    Ok(wire::ContentReference {
        bytes: protocol::generated::constrained::ByteCount::new(bytes)
            .ok_or(OffSchema("checkpoint.bytes"))?,
        digest: to_wire(
            "checkpoint.digest",
            format!("sha256:{}", hex::encode(digest.0)),
        )?,
        media_type: to_wire("checkpoint.mediaType", crate::store::blobs::JSON)?,
    })
}

/// One chunk of referenced content of `run_id`.
pub fn content_chunk(
    connection: &Connection,
    run_id: &RunId,
    reference: wire::ContentReference,
    offset: usize,
    length: usize,
) -> rusqlite::Result<Result<wire::ContentChunk, &'static str>> {
    let media_type = reference.media_type.as_str();
    let Some(digest) = crate::ids::parse_digest(Some(reference.digest.as_str())) else {
        return Ok(Err("the reference digest is malformed"));
    };
    // A workflow message's content is stored once, in `blobs`, under the run
    // it belongs to (the coordinator reads it before it sends the message).
    let bytes = match view_facts::content_bytes(connection, run_id, &digest, media_type)? {
        Some(bytes) => Some(bytes),
        None if media_type == "application/json" => {
            viewer::history_bytes(connection, run_id, &digest)?
        }
        None => None,
    };
    let bytes = match bytes {
        Some(bytes) => Some(bytes),
        None => {
            crate::store::sessions::message_content_bytes(connection, run_id, &digest, media_type)?
        }
    };
    let bytes = match bytes {
        Some(bytes) => Some(bytes),
        None if media_type == crate::store::blobs::JSON => {
            crate::store::capture::checkpoint_bytes(connection, run_id, &digest)?
        }
        None => None,
    };
    let Some(bytes) = bytes else {
        return Ok(Err("no such content for this run and media type"));
    };
    let (data, last) = match part_of(&bytes, &reference, offset, length) {
        Ok(part) => part,
        Err(message) => return Ok(Err(message)),
    };
    let chunk = wire::ContentChunk {
        data: to_wire("data", data)?,
        digest: reference.digest.clone(),
        final_: last,
        offset: protocol::generated::constrained::ByteOffset::new(offset as u64)
            .ok_or(OffSchema("offset"))?,
        reference,
    };
    Ok(Ok(chunk))
}

/// One part of stored content: base64 of at most `length` (and at most
/// 512 KiB) bytes from `offset`, and whether it reaches the end. The
/// reference must name the stored length; the offset must be inside it.
pub fn part_of(
    bytes: &[u8],
    reference: &wire::ContentReference,
    offset: usize,
    length: usize,
) -> Result<(String, bool), &'static str> {
    if reference.bytes.get() != bytes.len() as u64 {
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
pub fn session_document(
    connection: &Connection,
    session: &SessionId,
) -> rusqlite::Result<wire::SessionView> {
    let now_ms = crate::clock::now_ms();
    let cleared_at = view_reads::cleared_at(connection, session)?;
    let retained: Option<String> = match view_reads::active_run(connection, session)? {
        Some(run) => Some(run),
        None => view_reads::retained_terminal(
            connection,
            session,
            now_ms,
            cleared_at,
            TERMINAL_RETENTION_MS,
        )?,
    };
    let all = view_reads::session_messages(connection, session)?;
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
    let active_run = match retained {
        Some(run_id) => viewer::snapshot(connection, &RunId::new(run_id))?,
        None => None,
    };
    Ok(wire::SessionView {
        active_run,
        coordinator_epoch: None,
        message_count: crate::projection::run_view::count("messageCount", count)?,
        messages,
        next_eligible_message_id: None,
        revision: crate::projection::run_view::revision(
            view_reads::session_revision(connection, session)?.max(0) as u64,
        )?,
        session_id: to_wire("sessionId", session)?,
    })
}

/// `sessionView.clearTerminal`: hides the retained terminal run.
pub fn clear_terminal(connection: &Connection, session: &SessionId) -> rusqlite::Result<()> {
    view_reads::clear_terminal(connection, session, crate::clock::now_ms())
}
