//! Follow-ups (`workflow_follow_up_queues`, `workflow_follow_ups`): the
//! chain a follow-up waits for, the session queue's positions, and writing
//! the kernel's `kernel::follow_up` decisions with their messages.
//!
//! Invariants:
//! - A session queue's position only grows ([`take_position`] raises the
//!   queue row in the same transaction as the follow-up it numbers).
//! - A follow-up's message is written with its content, the follow-up's
//!   prompt, in the same transaction as the follow-up's state
//!   (`messaged`); a changed message is its state only.
//! - Chain reads follow `runs.continuation_of` up and `runs.continued_by`
//!   down, each step an indexed lookup.

use super::Cached as _;
use super::codec::{i64_of, name, parse, u64_of};
use super::runs;
use crate::store::blobs::Blob;
use kernel::follow_up::{FollowUpFacts, FollowUpRecord};
use kernel::ids::{MessageId, RunId, SessionId};
use kernel::run::RunStatus;
use rusqlite::{Connection, OptionalExtension, params};

/// The first run of `run_id`'s continuation chain.
pub(crate) fn chain_root(connection: &Connection, run_id: &RunId) -> rusqlite::Result<RunId> {
    connection.query_row_cached(
        "WITH RECURSIVE up(run_id, parent) AS (
           SELECT run_id, continuation_of FROM runs WHERE run_id = ?1
           UNION ALL
           SELECT r.run_id, r.continuation_of FROM runs r JOIN up ON r.run_id = up.parent)
         SELECT run_id FROM up WHERE parent IS NULL",
        params![run_id.as_str()],
        |row| Ok(RunId::new(row.get::<_, String>(0)?)),
    )
}

/// The final leaf of `run_id`'s continuation chain and its status.
pub(crate) fn chain_leaf(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<(RunId, RunStatus)> {
    connection.query_row_cached(
        "WITH RECURSIVE down(run_id, child, status) AS (
           SELECT run_id, continued_by, status FROM runs WHERE run_id = ?1
           UNION ALL
           SELECT r.run_id, r.continued_by, r.status FROM runs r JOIN down ON r.run_id = down.child)
         SELECT run_id, status FROM down WHERE child IS NULL",
        params![run_id.as_str()],
        |row| {
            Ok((
                RunId::new(row.get::<_, String>(0)?),
                parse(&row.get::<_, String>(1)?)?,
            ))
        },
    )
}

/// Takes the next position of `session_id`'s queue (creating the queue).
pub(crate) fn take_position(
    connection: &Connection,
    session_id: &SessionId,
    now_ms: u64,
) -> rusqlite::Result<u64> {
    let position: i64 = connection.query_row_cached(
        "INSERT INTO workflow_follow_up_queues (session_id, next_position, updated_at_ms)
         VALUES (?1, 2, ?2)
         ON CONFLICT (session_id) DO UPDATE SET next_position = next_position + 1,
           updated_at_ms = excluded.updated_at_ms
         RETURNING next_position - 1",
        params![session_id.as_str(), i64_of(now_ms)],
        |row| row.get(0),
    )?;
    Ok(u64_of(position))
}

fn record_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<FollowUpRecord> {
    Ok(FollowUpRecord {
        follow_up_id: row.get(0)?,
        session_id: SessionId::new(row.get::<_, String>(1)?),
        chain_run_id: RunId::new(row.get::<_, String>(2)?),
        position: u64_of(row.get(3)?),
        state: parse(&row.get::<_, String>(4)?)?,
        message_id: row.get::<_, Option<String>>(5)?.map(MessageId::new),
    })
}

/// The follow-up `follow_up_id`, if it exists.
pub(crate) fn load(
    connection: &Connection,
    follow_up_id: &str,
) -> rusqlite::Result<Option<FollowUpRecord>> {
    connection
        .query_row_cached(
            "SELECT follow_up_id, session_id, chain_run_id, position, state, message_id
             FROM workflow_follow_ups WHERE follow_up_id = ?1",
            params![follow_up_id],
            record_of,
        )
        .optional()
}

/// The queued follow-ups of the chain that starts at `chain_run_id`, in
/// position order.
pub(crate) fn queued_of_chain(
    connection: &Connection,
    chain_run_id: &RunId,
) -> rusqlite::Result<Vec<FollowUpRecord>> {
    let mut statement = connection.prepare_cached(
        "SELECT follow_up_id, session_id, chain_run_id, position, state, message_id
         FROM workflow_follow_ups WHERE chain_run_id = ?1 AND state = 'queued'
         ORDER BY position",
    )?;
    let rows = statement.query_map(params![chain_run_id.as_str()], record_of)?;
    rows.collect()
}

/// Writes a new follow-up with its prompt.
pub(crate) fn insert(
    connection: &Connection,
    follow_up: &FollowUpRecord,
    prompt: &str,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO workflow_follow_ups (follow_up_id, session_id, chain_run_id, position, prompt, state,
             message_id, created_at_ms, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, 'queued', NULL, ?6, ?6)",
        params![
            follow_up.follow_up_id,
            follow_up.session_id.as_str(),
            follow_up.chain_run_id.as_str(),
            i64_of(follow_up.position),
            prompt,
            i64_of(now_ms),
        ],
    )?;
    Ok(())
}

/// Writes a decided follow-up: a new message first (with the follow-up's
/// prompt as its content) or a changed message's state, then the
/// follow-up's state and message. Marks the message's run for the viewer.
pub(crate) fn write(
    connection: &Connection,
    facts: &FollowUpFacts,
    now_ms: u64,
) -> rusqlite::Result<()> {
    let follow_up = &facts.follow_up;
    if let Some(message) = &facts.message {
        let stored = connection
            .query_row_cached(
                "SELECT 1 FROM workflow_messages WHERE message_id = ?1",
                params![message.message_id.as_str()],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        if stored {
            runs::update_message(connection, message, now_ms)?;
        } else {
            let prompt: String = connection.query_row_cached(
                "SELECT prompt FROM workflow_follow_ups WHERE follow_up_id = ?1",
                params![follow_up.follow_up_id],
                |row| row.get(0),
            )?;
            let digest = Blob::text(&prompt).digest;
            super::blobs::put(connection, &Blob::text(&prompt), super::blobs::TEXT, now_ms)?;
            runs::insert_message(connection, message, &digest, now_ms)?;
        }
        super::viewer::mark(&message.run_id);
    }
    connection.execute_cached(
        "UPDATE workflow_follow_ups SET state = ?2, message_id = ?3, updated_at_ms = ?4
         WHERE follow_up_id = ?1",
        params![
            follow_up.follow_up_id,
            name(&follow_up.state),
            follow_up.message_id.as_ref().map(MessageId::as_str),
            i64_of(now_ms),
        ],
    )?;
    Ok(())
}

/// The workflow message `message_id`, if it exists.
pub(crate) fn message(
    connection: &Connection,
    message_id: &MessageId,
) -> rusqlite::Result<Option<kernel::message::MessageRecord>> {
    connection
        .query_row_cached(
            "SELECT message_id, session_id, kind, source_id, step_reason, session_order, state,
                    entry_id, created_at_ms, run_id
             FROM workflow_messages WHERE message_id = ?1",
            params![message_id.as_str()],
            |row| {
                let run_id = RunId::new(row.get::<_, String>(9)?);
                runs::message_from_row(&run_id, row)
            },
        )
        .optional()
}
