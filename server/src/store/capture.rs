//! A run's session capture (`kernel::capture`): its facts for one batch, the
//! write of the events and replay checkpoints a batch adds, and the bounded
//! reads viewers page through.
//!
//! Invariants:
//! - Every read is bounded by the batch or the page (at most 256 rows): the
//!   count and replay state come from one `session_captures` row, the
//!   overlap digests from the batch's own numbers.
//! - A batch's events, its capture row and its checkpoints are written in the
//!   caller's one transaction; nothing here touches a run's rows, so captured
//!   events never reach a run's state or a runner.

use super::Cached as _;
use super::blobs::Blob;
use super::codec::{DigestColumn, from_json, i64_of, json, u64_of};
use kernel::capture::{CaptureFacts, ReplayState};
use kernel::ids::{Digest, RunId};
use rusqlite::{Connection, OptionalExtension, params};

/// One event of a batch, measured and hashed before the transaction.
#[derive(Clone, Debug)]
pub(crate) struct PreparedEvent {
    pub seq: u64,
    pub event_type: String,
    /// The canonical JSON of its data.
    pub data_json: String,
    /// SHA-256 of the canonical `{data, type}`.
    pub digest: Digest,
}

/// The capture facts of `run_id` for a batch numbered `first..=last`.
pub(crate) fn facts(
    connection: &Connection,
    run_id: &RunId,
    first: u64,
    last: u64,
) -> rusqlite::Result<CaptureFacts> {
    let row: Option<(i64, String)> = connection
        .query_row_cached(
            "SELECT events, replay_state_json FROM session_captures WHERE run_id = ?1",
            params![run_id.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    let (stored, state) = match row {
        Some((events, state)) => (u64_of(events), from_json::<ReplayState>(&state)?),
        None => (0, ReplayState::default()),
    };
    let mut overlap = Vec::new();
    if first <= stored {
        let mut statement = connection.prepare_cached(
            "SELECT run_seq, digest FROM session_events WHERE run_id = ?1 AND run_seq BETWEEN ?2 AND ?3
             ORDER BY run_seq",
        )?;
        let rows = statement.query_map(
            params![run_id.as_str(), i64_of(first), i64_of(last.min(stored))],
            |row| Ok((u64_of(row.get(0)?), row.get::<_, DigestColumn>(1)?.0)),
        )?;
        for row in rows {
            overlap.push(row?);
        }
    }
    Ok(CaptureFacts {
        stored,
        state,
        overlap,
    })
}

/// Writes what a batch added: the new events, the capture row and a replay
/// checkpoint (its JSON in `blobs`) after each event the kernel named.
pub(crate) fn write(
    connection: &Connection,
    run_id: &RunId,
    recorded: &kernel::capture::Recorded,
    events: &[PreparedEvent],
    now_ms: u64,
) -> rusqlite::Result<()> {
    for event in events
        .iter()
        .filter(|event| recorded.new.contains(&event.seq))
    {
        connection.execute_cached(
            "INSERT INTO session_events (run_id, run_seq, event_type, data_json, digest, recorded_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                run_id.as_str(),
                i64_of(event.seq),
                event.event_type,
                event.data_json,
                event.digest.0.to_vec(),
                i64_of(now_ms),
            ],
        )?;
    }
    connection.execute_cached(
        "INSERT INTO session_captures (run_id, events, replay_state_json, updated_at_ms) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (run_id) DO UPDATE SET events = excluded.events,
           replay_state_json = excluded.replay_state_json, updated_at_ms = excluded.updated_at_ms",
        params![
            run_id.as_str(),
            i64_of(recorded.facts.stored),
            json(&recorded.facts.state),
            i64_of(now_ms),
        ],
    )?;
    for checkpoint in &recorded.checkpoints {
        let value = serde_json::to_value(checkpoint).unwrap_or(serde_json::Value::Null);
        let blob = Blob::json(&value);
        super::blobs::put(connection, &blob, super::blobs::JSON, now_ms)?;
        connection.execute_cached(
            "INSERT INTO viewer_session_checkpoints (run_id, event_seq, checkpoint_digest) VALUES (?1, ?2, ?3)",
            params![
                run_id.as_str(),
                i64_of(checkpoint.through_seq),
                blob.digest.0.to_vec()
            ],
        )?;
    }
    Ok(())
}

/// One captured event as a page shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct PageEvent {
    pub seq: u64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub data: serde_json::Value,
}

/// At most `limit` events of `run_id` after the first `offset`, in order.
pub(crate) fn page(
    connection: &Connection,
    run_id: &RunId,
    offset: usize,
    limit: usize,
) -> rusqlite::Result<Vec<PageEvent>> {
    let mut statement = connection.prepare_cached(
        "SELECT run_seq, event_type, data_json FROM session_events
         WHERE run_id = ?1 AND run_seq > ?2 ORDER BY run_seq LIMIT ?3",
    )?;
    let rows = statement.query_map(
        params![run_id.as_str(), offset as i64, limit as i64],
        |row| {
            Ok(PageEvent {
                seq: u64_of(row.get(0)?),
                event_type: row.get(1)?,
                data: from_json(&row.get::<_, String>(2)?)?,
            })
        },
    )?;
    rows.collect()
}

/// The replay checkpoint a page starting after event `offset` may begin
/// from: the newest one at or before it (its digest and JSON length).
pub(crate) fn checkpoint_before(
    connection: &Connection,
    run_id: &RunId,
    offset: usize,
) -> rusqlite::Result<Option<(Digest, u64)>> {
    connection
        .query_row_cached(
            "SELECT c.checkpoint_digest, length(b.bytes) FROM viewer_session_checkpoints c
               JOIN blobs b ON b.digest = c.checkpoint_digest
             WHERE c.run_id = ?1 AND c.event_seq <= ?2 ORDER BY c.event_seq DESC LIMIT 1",
            params![run_id.as_str(), offset as i64],
            |row| Ok((row.get::<_, DigestColumn>(0)?.0, u64_of(row.get(1)?))),
        )
        .optional()
}

/// The stored JSON of a checkpoint of `run_id` with this digest.
pub(crate) fn checkpoint_bytes(
    connection: &Connection,
    run_id: &RunId,
    digest: &Digest,
) -> rusqlite::Result<Option<Vec<u8>>> {
    connection
        .query_row_cached(
            "SELECT b.bytes FROM viewer_session_checkpoints c JOIN blobs b ON b.digest = c.checkpoint_digest
             WHERE c.run_id = ?1 AND c.checkpoint_digest = ?2 LIMIT 1",
            params![run_id.as_str(), digest.0.to_vec()],
            |row| row.get(0),
        )
        .optional()
}
