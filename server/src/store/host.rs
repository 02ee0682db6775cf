//! The one `workflow_host_state` row: the server epoch and its lease.

use super::Cached as _;
use super::codec::{i64_of, u64_of};
use kernel::epoch::HostFacts;
use kernel::ids::{OwnerId, ServerEpoch};
use rusqlite::{Connection, OptionalExtension, params};

/// Loads the host facts (default for a new database).
pub(crate) fn load(connection: &Connection) -> rusqlite::Result<HostFacts> {
    let facts = connection
        .query_row_cached(
            "SELECT epoch, owner_id, lease_expires_at_ms FROM workflow_host_state WHERE singleton = 1",
            [],
            |row| {
                Ok(HostFacts {
                    epoch: ServerEpoch(u64_of(row.get(0)?)),
                    owner_id: row.get::<_, Option<String>>(1)?.map(OwnerId::new),
                    lease_expires_at_ms: u64_of(row.get(2)?),
                })
            },
        )
        .optional()?;
    Ok(facts.unwrap_or_default())
}

/// Writes the host facts.
pub(crate) fn write(
    connection: &Connection,
    facts: &HostFacts,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO workflow_host_state (singleton, epoch, owner_id, lease_expires_at_ms, started_at_ms)
         VALUES (1, ?1, ?2, ?3, ?4)
         ON CONFLICT (singleton) DO UPDATE SET epoch = excluded.epoch, owner_id = excluded.owner_id,
           lease_expires_at_ms = excluded.lease_expires_at_ms,
           started_at_ms = CASE WHEN workflow_host_state.epoch = excluded.epoch
                                THEN workflow_host_state.started_at_ms ELSE excluded.started_at_ms END",
        params![
            i64_of(facts.epoch.0),
            facts.owner_id.as_ref().map(OwnerId::as_str),
            i64_of(facts.lease_expires_at_ms),
            i64_of(now_ms)
        ],
    )?;
    Ok(())
}
