//! Loading and writing one origin session's `kernel::session::SessionFacts`
//! (its workflow messages, turns and the runs they belong to).
//!
//! Invariants:
//! - `load` reads the window the kernel's rules need: every pending message,
//!   every message of a nonterminal run, every message with an open turn,
//!   every terminal or follow-up message whose first turn has not ended, the
//!   terminal message of every run with a pending follow-up (the follow-up
//!   waits for its turn to end), and the message of the turn a report names;
//!   the turns of those messages; and one [`SessionRun`] per run they belong
//!   to and per queued, running or waiting run of the session (its
//!   reservation), each with its pending request with that request's
//!   submissions, and its pending decision.
//! - `write` writes only what changed between the loaded and the decided
//!   facts, inside the caller's transaction: new messages with their content
//!   (derived as every other message's is, `runs::message_content`), changed
//!   message states and entries, new or ended turns, and changed requests
//!   (unproductive-turn count, revision, failure, turn clock). A run's lifecycle is
//!   never written here (that is the follow-ups', through `runs::write`).
//!   Every touched run is marked for the viewer, so session subscribers and
//!   the run views see the change at commit.

use super::Cached as _;
use super::codec::{parse, u64_of};
use super::runs;
use kernel::ids::{AttemptId, EntryId, InteractionId, MessageId, NodeId, RunId, SessionId, TurnId};
use kernel::message::TurnRecord;
use kernel::session::{SessionFacts, SessionRun};
use rusqlite::{Connection, OptionalExtension, params};
use std::collections::BTreeSet;

/// The session facts of `session_id`, with the message of `turn_id` (a
/// reported turn) included when it exists.
pub(crate) fn load(
    connection: &Connection,
    session_id: &SessionId,
    turn_id: Option<&TurnId>,
) -> rusqlite::Result<SessionFacts> {
    let mut statement = connection.prepare_cached(
        "SELECT m.message_id, m.session_id, m.kind, m.source_id, m.step_reason, m.session_order, m.state,
                m.entry_id, m.created_at_ms, m.run_id
         FROM workflow_messages m JOIN runs r ON r.run_id = m.run_id
         WHERE m.session_id = ?1
           AND (m.state = 'pending'
                OR r.status IN ('queued', 'running', 'waiting')
                OR EXISTS (SELECT 1 FROM workflow_turns t WHERE t.message_id = m.message_id AND t.state = 'open')
                OR (m.kind IN ('terminal', 'followUp') AND NOT EXISTS (
                      SELECT 1 FROM workflow_turns t WHERE t.message_id = m.message_id AND t.state <> 'open'))
                OR (m.kind = 'terminal' AND EXISTS (
                      SELECT 1 FROM workflow_messages f
                      WHERE f.run_id = m.run_id AND f.kind = 'followUp' AND f.state = 'pending'))
                OR m.message_id = (SELECT t.message_id FROM workflow_turns t WHERE t.turn_id = ?2))
         ORDER BY m.session_order",
    )?;
    let rows = statement.query_map(
        params![session_id.as_str(), turn_id.map(TurnId::as_str)],
        |row| {
            let run_id = RunId::new(row.get::<_, String>(9)?);
            runs::message_from_row(&run_id, row)
        },
    )?;
    let messages: Vec<_> = rows.collect::<rusqlite::Result<_>>()?;
    let mut turns = Vec::new();
    for message in &messages {
        turns.extend(turns_of(connection, &message.message_id)?);
    }
    let mut run_ids: BTreeSet<RunId> = messages.iter().map(|m| m.run_id.clone()).collect();
    // The session's reservation: a follow-up waits for its release.
    run_ids.extend(super::meta::session_runs(connection, session_id)?);
    let mut session_runs = Vec::new();
    for run_id in run_ids {
        let Some(agg) = runs::load(connection, &run_id)? else {
            continue;
        };
        let submissions = match &agg.interaction {
            Some(record) => super::submissions::of_interaction(connection, &record.interaction_id)?,
            None => Vec::new(),
        };
        session_runs.push(SessionRun {
            run_id,
            status: agg.run.status,
            paused: agg.run.paused,
            interaction: agg.interaction,
            submissions,
            decision: agg.decision,
        });
    }
    Ok(SessionFacts {
        session_id: session_id.clone(),
        messages,
        turns,
        runs: session_runs,
        next_message_order: super::meta::next_message_order(connection, Some(session_id))?,
    })
}

fn turns_of(connection: &Connection, message_id: &MessageId) -> rusqlite::Result<Vec<TurnRecord>> {
    let mut statement = connection.prepare_cached(
        "SELECT turn_id, run_id, session_id, state, started_at_ms, ended_at_ms, response_entry_id
         FROM workflow_turns WHERE message_id = ?1 ORDER BY started_at_ms, turn_id",
    )?;
    let rows = statement.query_map(params![message_id.as_str()], |row| {
        Ok(TurnRecord {
            turn_id: TurnId::new(row.get::<_, String>(0)?),
            message_id: message_id.clone(),
            run_id: RunId::new(row.get::<_, String>(1)?),
            session_id: SessionId::new(row.get::<_, String>(2)?),
            state: parse(&row.get::<_, String>(3)?)?,
            started_at_ms: u64_of(row.get(4)?),
            ended_at_ms: row.get::<_, Option<i64>>(5)?.map(u64_of),
            response_entry_id: row.get::<_, Option<String>>(6)?.map(EntryId::new),
        })
    })?;
    rows.collect()
}

/// Writes what differs between `before` (as loaded) and `after` (decided).
pub(crate) fn write(
    connection: &Connection,
    before: &SessionFacts,
    after: &SessionFacts,
    now_ms: u64,
) -> rusqlite::Result<()> {
    let mut touched = BTreeSet::new();
    for run in &after.runs {
        let old = before.runs.iter().find(|old| old.run_id == run.run_id);
        if let Some(record) = &run.interaction
            && old.is_none_or(|old| old.interaction.as_ref() != Some(record))
        {
            runs::write_interaction(connection, record, now_ms)?;
            touched.insert(run.run_id.clone());
        }
    }
    for message in &after.messages {
        match before
            .messages
            .iter()
            .find(|old| old.message_id == message.message_id)
        {
            Some(old) if old == message => {}
            Some(_) => {
                runs::update_message(connection, message, now_ms)?;
                touched.insert(message.run_id.clone());
            }
            None => {
                let Some(agg) = runs::load(connection, &message.run_id)? else {
                    continue;
                };
                let content = runs::message_content(connection, message, &agg, &[], now_ms)?;
                runs::insert_message(connection, message, &content, now_ms)?;
                touched.insert(message.run_id.clone());
            }
        }
    }
    for turn in &after.turns {
        if !before.turns.contains(turn) {
            runs::write_turn(connection, turn)?;
            touched.insert(turn.run_id.clone());
        }
    }
    for run_id in &touched {
        super::viewer::mark(run_id);
    }
    Ok(())
}

/// What a step message presents: its request's attempt and node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepSource {
    pub interaction_id: InteractionId,
    pub attempt_id: AttemptId,
    pub node_id: NodeId,
}

/// The source of the step message `message_id`, if it is a step.
pub(crate) fn step_source(
    connection: &Connection,
    message_id: &MessageId,
) -> rusqlite::Result<Option<StepSource>> {
    connection
        .query_row_cached(
            "SELECT i.interaction_id, i.attempt_id, i.node_id
             FROM workflow_messages m JOIN interactive_requests i ON i.interaction_id = m.source_id
             WHERE m.message_id = ?1 AND m.kind = 'step'",
            params![message_id.as_str()],
            |row| {
                Ok(StepSource {
                    interaction_id: InteractionId::new(row.get::<_, String>(0)?),
                    attempt_id: AttemptId::new(row.get::<_, String>(1)?),
                    node_id: NodeId::new(row.get::<_, String>(2)?),
                })
            },
        )
        .optional()
}

/// The stored content of a workflow message of `run_id` with this digest and
/// media type (what `view.content` serves for a message reference).
pub(crate) fn message_content_bytes(
    connection: &Connection,
    run_id: &RunId,
    digest: &kernel::ids::Digest,
    media_type: &str,
) -> rusqlite::Result<Option<Vec<u8>>> {
    connection
        .query_row_cached(
            "SELECT b.bytes FROM workflow_messages m JOIN blobs b ON b.digest = m.content_digest
             WHERE m.run_id = ?1 AND m.content_digest = ?2 AND b.media_type = ?3 LIMIT 1",
            params![run_id.as_str(), digest.0.to_vec(), media_type],
            |row| row.get(0),
        )
        .optional()
}

/// The origin sessions with a running turn clock (startup stops them: no
/// coordinator survives a server restart).
pub(crate) fn with_running_clocks(connection: &Connection) -> rusqlite::Result<Vec<SessionId>> {
    let mut statement = connection.prepare_cached(
        "SELECT DISTINCT target_session_id FROM interactive_requests
         WHERE status = 'pending' AND clock_running_since_ms IS NOT NULL AND target_session_id IS NOT NULL",
    )?;
    let rows = statement.query_map([], |row| Ok(SessionId::new(row.get::<_, String>(0)?)))?;
    rows.collect()
}

/// The turn clock of every pending origin-session request with a deadline:
/// its run, attempt and clock.
pub(crate) fn pending_clocks(
    connection: &Connection,
) -> rusqlite::Result<Vec<(RunId, AttemptId, kernel::interaction::TurnClock)>> {
    let mut statement = connection.prepare_cached(
        "SELECT run_id, attempt_id, clock_budget_ms, clock_consumed_ms, clock_running_since_ms
         FROM interactive_requests
         WHERE status = 'pending' AND target_session_id IS NOT NULL AND clock_budget_ms IS NOT NULL",
    )?;
    let rows = statement.query_map([], |row| {
        Ok((
            RunId::new(row.get::<_, String>(0)?),
            AttemptId::new(row.get::<_, String>(1)?),
            kernel::interaction::TurnClock {
                budget_ms: row.get::<_, Option<i64>>(2)?.map(u64_of),
                consumed_ms: u64_of(row.get(3)?),
                running_since_ms: row.get::<_, Option<i64>>(4)?.map(u64_of),
            },
        ))
    })?;
    rows.collect()
}
