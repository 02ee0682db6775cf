//! Channel sends and settlements (`effects` of type `channel.send:<profile>`
//! and `channel.settle:<profile>`, see `kernel::channel`): which decisions
//! still need a send, which delivered sends still need their settlement
//! edit, which run an effect belongs to, the channel work left applying,
//! and an attempt's own end.
//!
//! Invariant: a send's state lives only in `effects` and `effect_attempts`
//! (written by `runs::write` from the kernel's facts); these are reads,
//! plus the state of an attempt a known rejection ended, which the effect
//! row no longer names once the next attempt is reserved.

use super::Cached as _;
use super::codec::{i64_of, name};
use kernel::effect::EffectState;
use kernel::ids::{EffectId, RunId};
use rusqlite::{Connection, OptionalExtension, params};

/// Runs waiting on a pending decision that has no send of `effect_type`
/// yet, or one reserved for its next attempt: oldest first, at most 64.
pub(crate) fn awaiting_send(
    connection: &Connection,
    effect_type: &str,
) -> rusqlite::Result<Vec<RunId>> {
    let mut statement = connection.prepare_cached(
        "SELECT d.run_id FROM human_decisions d
         WHERE d.state = 'pending'
           AND NOT EXISTS (SELECT 1 FROM effects e
                           WHERE e.run_id = d.run_id AND e.effect_type = ?1 AND e.state <> 'reserved')
         ORDER BY d.created_at_ms, d.decision_id LIMIT 64",
    )?;
    let rows = statement.query_map(params![effect_type], |row| {
        Ok(RunId::new(row.get::<_, String>(0)?))
    })?;
    rows.collect()
}

/// Delivered sends of `send_type` whose decision is no longer pending and
/// that have no settlement of `settle_type` yet, or one reserved for its
/// next attempt: the run and the send, oldest first, at most 64.
pub(crate) fn awaiting_settle(
    connection: &Connection,
    send_type: &str,
    settle_type: &str,
) -> rusqlite::Result<Vec<(RunId, EffectId)>> {
    let mut statement = connection.prepare_cached(
        "SELECT e.run_id, e.effect_id FROM effects e
         JOIN human_decisions d ON d.run_id = e.run_id AND d.node_id = e.node_path
         WHERE e.effect_type = ?1 AND e.state = 'applied' AND d.state <> 'pending'
           AND NOT EXISTS (SELECT 1 FROM effects s
                           WHERE s.run_id = e.run_id AND s.effect_type = ?2 AND s.node_path = e.node_path
                             AND s.state <> 'reserved')
         ORDER BY e.updated_at_ms, e.effect_id LIMIT 64",
    )?;
    let rows = statement.query_map(params![send_type, settle_type], |row| {
        Ok((
            RunId::new(row.get::<_, String>(0)?),
            EffectId::new(row.get::<_, String>(1)?),
        ))
    })?;
    rows.collect()
}

/// The run of effect `effect_id`.
pub(crate) fn run_of_effect(
    connection: &Connection,
    effect_id: &EffectId,
) -> rusqlite::Result<Option<RunId>> {
    connection
        .query_row_cached(
            "SELECT run_id FROM effects WHERE effect_id = ?1",
            params![effect_id.as_str()],
            |row| Ok(RunId::new(row.get::<_, String>(0)?)),
        )
        .optional()
}

/// Runs with a channel send or settlement still applying, and its effect
/// type.
pub(crate) fn applying_sends(connection: &Connection) -> rusqlite::Result<Vec<(RunId, String)>> {
    let mut statement = connection.prepare_cached(
        "SELECT DISTINCT run_id, effect_type FROM effects
         WHERE state = 'applying' AND (effect_type LIKE 'channel.send:%' OR effect_type LIKE 'channel.settle:%')
         ORDER BY run_id, effect_type",
    )?;
    let rows = statement.query_map([], |row| {
        Ok((
            RunId::new(row.get::<_, String>(0)?),
            row.get::<_, String>(1)?,
        ))
    })?;
    rows.collect()
}

/// Records how attempt `number` of `effect_id` ended.
pub(crate) fn record_attempt(
    connection: &Connection,
    effect_id: &EffectId,
    number: u32,
    state: EffectState,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "UPDATE effect_attempts SET state = ?3, finished_at_ms = ?4
         WHERE effect_id = ?1 AND attempt_number = ?2",
        params![
            effect_id.as_str(),
            i64::from(number),
            name(&state),
            i64_of(now_ms)
        ],
    )?;
    Ok(())
}

/// Whether any protected decision is pending, or any delivered send still
/// needs its settlement edit (a running channel adapter keeps the server
/// up for its answers and its edits).
pub(crate) fn any_channel_work(connection: &Connection) -> rusqlite::Result<bool> {
    connection.query_row_cached(
        "SELECT EXISTS (SELECT 1 FROM human_decisions WHERE state = 'pending')
             OR EXISTS (SELECT 1 FROM effects e
                        JOIN human_decisions d ON d.run_id = e.run_id AND d.node_id = e.node_path
                        WHERE e.effect_type LIKE 'channel.send:%' AND e.state = 'applied' AND d.state <> 'pending'
                          AND NOT EXISTS (SELECT 1 FROM effects s
                                          WHERE s.run_id = e.run_id AND s.node_path = e.node_path
                                            AND s.effect_type = 'channel.settle:' || substr(e.effect_type, 14)
                                            AND s.state IN ('applied', 'rejected', 'cancelled', 'ambiguous')))",
        [],
        |row| row.get(0),
    )
}
