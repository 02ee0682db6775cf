//! The counts `server.status` reports, read from committed state.
//!
//! Invariant (privacy): counts only — no id, path, payload or token.

use crate::store::Cached as _;

/// The status counts.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    pub queued: u64,
    pub running: u64,
    pub parked: u64,
    pub waiting: u64,
    pub expired_claims: u64,
    pub pending_interactions: u64,
    pub ambiguous_effects: u64,
}

/// Reads the status counts from committed state.
pub fn counts(connection: &rusqlite::Connection, now_ms: u64) -> rusqlite::Result<Counts> {
    let count = |sql: &str| -> rusqlite::Result<u64> {
        connection
            .query_row_cached(sql, [now_ms as i64], |row| row.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
    };
    Ok(Counts {
        queued: count("SELECT COUNT(*) FROM runs WHERE status = 'queued' AND ?1 >= 0")?,
        running: count(
            "SELECT COUNT(*) FROM runs r JOIN run_queue q ON q.run_id = r.run_id
             WHERE r.status = 'running' AND q.status IN ('starting', 'running') AND ?1 >= 0",
        )?,
        parked: count(
            "SELECT COUNT(*) FROM runs r JOIN run_queue q ON q.run_id = r.run_id
             WHERE r.status = 'running' AND q.status = 'parked' AND ?1 >= 0",
        )?,
        waiting: count("SELECT COUNT(*) FROM runs WHERE status = 'waiting' AND ?1 >= 0")?,
        expired_claims: count(
            "SELECT COUNT(*) FROM leases l JOIN run_queue q ON q.run_id = l.run_id
             WHERE q.status IN ('starting', 'running') AND (l.expires_at_ms IS NULL OR l.expires_at_ms <= ?1)",
        )?,
        pending_interactions: count(
            "SELECT (SELECT COUNT(*) FROM interactive_requests WHERE status = 'pending')
                  + (SELECT COUNT(*) FROM human_decisions WHERE state = 'pending') + 0 * ?1",
        )?,
        ambiguous_effects: count("SELECT COUNT(*) FROM effects WHERE state = 'ambiguous' AND ?1 >= 0")?,
    })
}
