//! Channel sends (`effects` of type `channel.send:<profile>`, see
//! `kernel::channel`): which decisions still need one, which run an effect
//! belongs to, the sends left applying, and an attempt's own end.
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

/// Runs with a channel send still applying, and the send's effect type.
pub(crate) fn applying_sends(connection: &Connection) -> rusqlite::Result<Vec<(RunId, String)>> {
    let mut statement = connection.prepare_cached(
        "SELECT DISTINCT run_id, effect_type FROM effects
         WHERE state = 'applying' AND effect_type LIKE 'channel.send:%'
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

/// Whether any protected decision is pending (a running channel adapter
/// keeps the server up for its answers).
pub(crate) fn any_pending_decision(connection: &Connection) -> rusqlite::Result<bool> {
    connection.query_row_cached(
        "SELECT EXISTS (SELECT 1 FROM human_decisions WHERE state = 'pending')",
        [],
        |row| row.get(0),
    )
}
