//! The facts a run view is built from, read inside the caller's
//! transaction: the header's outside facts, attempt rows, the update page,
//! and generated content (`run_view_content`).
//!
//! Invariants:
//! - Every read is bounded by what one document needs (a header, one
//!   step's attempt rows from a given `seq`, one update page), never a whole
//!   run history, except [`attempt_rows`] from `seq` 0, which only the
//!   from-scratch rebuild and a new continuation's first revision use.
//! - Generated content is stored under its exact run id, digest and media
//!   type before a reference to it is returned.

use super::Cached as _;
use super::{meta, runs};
use crate::projection::run_view::{
    self as view, AttemptRow, ContentRole, HeaderFacts, RETAINED_CONTENTS, ReasonDetail,
};
use kernel::display::OutsideFacts;
use kernel::ids::RunId;
use kernel::run::{ParkReason, RunAggregate};
use protocol::generated::types as wire;
use rusqlite::{Connection, OptionalExtension, params};

/// The header of `agg`'s view with `graph_history` as its history reference.
pub(crate) fn header(
    connection: &Connection,
    agg: &RunAggregate,
    meta: &meta::RunMeta,
    graph_history: wire::ContentReference,
) -> rusqlite::Result<view::Header> {
    let run_id = &agg.run.run_id;
    let error_message: Option<String> = connection.query_row_cached(
        "SELECT error_message FROM runs WHERE run_id = ?1",
        params![run_id.as_str()],
        |row| row.get(0),
    )?;
    let outside = OutsideFacts {
        submission_validating: submission_validating(connection, agg)?,
        restart_eligible: restart_eligible(connection, agg)?,
    };
    let detail = ReasonDetail {
        error_message: error_message.as_deref(),
        terminal: agg.run.status.is_terminal(),
        protocol_check: match agg.run.park_reason {
            Some(ParkReason::ProtocolRejected) => runs::latest_protocol_check(connection, run_id)?,
            _ => None,
        },
    };
    let (fields, reason) = view::display_value(agg, outside, &detail)?;
    let reference = match reason
        .as_deref()
        .filter(|reason| view::is_long_reason(reason))
    {
        Some(reason) => Some(store_content(
            connection,
            run_id,
            reason.as_bytes(),
            "text/plain",
            ContentRole::Reason,
        )?),
        None => None,
    };
    let display = view::bound_display(fields, reason, reference)?;
    let definition = definition_content(connection, run_id, &meta.definition_digest)?;
    let decision_request = super::decisions::pending_request(connection, agg)?;
    Ok(view::header(
        agg,
        HeaderFacts {
            workflow_name: &meta.workflow_name,
            title: meta.title.as_deref(),
            error_message: error_message.as_deref(),
            display,
            definition,
            graph_history,
            decision_request: decision_request.as_ref(),
            settings: super::settings::binding(connection, run_id)?,
        },
    )?)
}

/// Whether a submission of the run's pending request is being validated.
pub(crate) fn submission_validating(
    connection: &Connection,
    agg: &RunAggregate,
) -> rusqlite::Result<bool> {
    match &agg.interaction {
        Some(interaction) => connection.query_row_cached(
            "SELECT EXISTS (SELECT 1 FROM interactive_submissions WHERE interaction_id = ?1 AND outcome = 'validating')",
            params![interaction.interaction_id.as_str()],
            |row| row.get(0),
        ),
        None => Ok(false),
    }
}

/// Whether `run.restart` would be accepted: the kernel's one restart rule
/// over the run's terminal fingerprint and its whole chain.
pub(crate) fn restart_eligible(
    connection: &Connection,
    agg: &RunAggregate,
) -> rusqlite::Result<bool> {
    if kernel::run::restart_state_allows(&agg.run).is_err() {
        return Ok(false);
    }
    Ok(
        runs::restart_facts(connection, &agg.run)?.is_some_and(|(fingerprint, chain)| {
            kernel::run::restart_allowed(&agg.run, &fingerprint, &chain).is_ok()
        }),
    )
}

/// The attempt rows of `run_id` from `from_seq` on, in `seq` order.
pub(crate) fn attempt_rows(
    connection: &Connection,
    run_id: &RunId,
    from_seq: u64,
) -> rusqlite::Result<Vec<AttemptRow>> {
    let mut statement = connection.prepare_cached(
        "SELECT seq, attempt_id, node_id, visit, status, outcome, started_at_ms, finished_at_ms
         FROM node_attempts WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq",
    )?;
    let rows = statement.query_map(params![run_id.as_str(), from_seq as i64], |row| {
        Ok(AttemptRow {
            seq: row.get::<_, i64>(0)?.max(0) as u64,
            attempt_id: row.get(1)?,
            node_id: row.get(2)?,
            visit: row.get(3)?,
            status: row.get(4)?,
            outcome: row.get(5)?,
            started_at_ms: row.get(6)?,
            finished_at_ms: row.get(7)?,
        })
    })?;
    rows.collect()
}

/// The newest current updates (inline) and the total number of current pairs.
pub(crate) fn updates(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<(Vec<wire::UpdateRecord>, usize)> {
    let total: i64 = connection.query_row_cached(
        "SELECT COUNT(*) FROM workflow_updates WHERE run_id = ?1",
        params![run_id.as_str()],
        |row| row.get(0),
    )?;
    let mut items = update_page(connection, run_id, 0, view::UPDATE_PAGE_LIMIT)?;
    let shown = view::page_prefix(
        items.iter().map(view::encoded_len),
        view::UPDATE_PAGE_LIMIT,
        view::UPDATE_PAGE_BYTES,
    );
    items.truncate(shown);
    Ok((items, total.max(0) as usize))
}

/// Current updates newest first, from `offset`.
pub(crate) fn update_page(
    connection: &Connection,
    run_id: &RunId,
    offset: usize,
    limit: usize,
) -> rusqlite::Result<Vec<wire::UpdateRecord>> {
    let mut statement = connection.prepare_cached(
        "SELECT update_id, attempt_id, seq, update_type, update_key, data_json FROM workflow_updates
         WHERE run_id = ?1 ORDER BY seq DESC, update_type, update_key LIMIT ?2 OFFSET ?3",
    )?;
    let rows = statement.query_map(
        params![run_id.as_str(), limit as i64, offset as i64],
        |row| {
            let data: String = row.get(5)?;
            let seq = row.get::<_, i64>(2)?;
            Ok(wire::UpdateRecord {
                attempt_id: view::to_wire("attemptId", row.get::<_, String>(1)?)?,
                // The data is stored canonical; the page carries it as is.
                data: serde_json::from_str(&data).map_err(|_| view::OffSchema("data"))?,
                key: view::to_wire("key", row.get::<_, String>(4)?)?,
                seq: u64::try_from(seq)
                    .ok()
                    .and_then(protocol::generated::constrained::Sequence::new)
                    .ok_or(view::OffSchema("seq"))?,
                type_: view::to_wire("type", row.get::<_, String>(3)?)?,
                update_id: view::to_wire("updateId", row.get::<_, String>(0)?)?,
            })
        },
    )?;
    rows.collect()
}

/// Stores generated content for `run_id` and returns its reference. The row
/// is written before the reference exists anywhere else. (Only a reason
/// over 16 KiB and the definition, once per run, are hashed here.)
pub(crate) fn store_content(
    connection: &Connection,
    run_id: &RunId,
    bytes: &[u8],
    media_type: &str,
    role: ContentRole,
) -> rusqlite::Result<wire::ContentReference> {
    let digest = crate::ids::sha256(bytes);
    let inserted = connection.execute_cached(
        "INSERT INTO run_view_content (run_id, digest, media_type, role, bytes, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT DO NOTHING",
        params![run_id.as_str(), digest.0.to_vec(), media_type, role.as_str(), bytes, crate::clock::now_ms() as i64],
    )?;
    if inserted > 0 && role != ContentRole::Definition {
        connection.execute_cached(
            "DELETE FROM run_view_content WHERE run_id = ?1 AND role = ?2 AND rowid NOT IN
               (SELECT rowid FROM run_view_content WHERE run_id = ?1 AND role = ?2 ORDER BY rowid DESC LIMIT ?3)",
            params![run_id.as_str(), role.as_str(), RETAINED_CONTENTS],
        )?;
    }
    Ok(view::content_reference(&digest, media_type, bytes.len())?)
}

/// The reference to the run's complete definition (stored once per run).
fn definition_content(
    connection: &Connection,
    run_id: &RunId,
    definition_digest: &str,
) -> rusqlite::Result<wire::ContentReference> {
    let stored: Option<(Vec<u8>, i64)> = connection
        .query_row_cached(
            "SELECT digest, length(bytes) FROM run_view_content WHERE run_id = ?1 AND role = 'definition'",
            params![run_id.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    if let Some((digest, length)) = stored {
        let digest = kernel::ids::Digest(digest.try_into().unwrap_or([0; 32]));
        return Ok(view::content_reference(
            &digest,
            "application/json",
            length.max(0) as usize,
        )?);
    }
    let topology_json: String = connection.query_row_cached(
        "SELECT topology_json FROM workflow_definitions WHERE definition_digest = ?1",
        params![definition_digest],
        |row| row.get(0),
    )?;
    store_content(
        connection,
        run_id,
        topology_json.as_bytes(),
        "application/json",
        ContentRole::Definition,
    )
}

/// Stored content of `run_id` under `digest` and `media_type`.
pub(crate) fn content_bytes(
    connection: &Connection,
    run_id: &RunId,
    digest: &kernel::ids::Digest,
    media_type: &str,
) -> rusqlite::Result<Option<Vec<u8>>> {
    connection
        .query_row_cached(
            "SELECT bytes FROM run_view_content WHERE run_id = ?1 AND digest = ?2 AND media_type = ?3",
            params![run_id.as_str(), digest.0.to_vec(), media_type],
            |row| row.get(0),
        )
        .optional()
}
