//! The runner process registry (`runner_processes`) and a runner epoch's
//! exit status (`run_workers`): the rows the supervisor and the runner
//! channel keep about processes, so that a restarted server can reap every
//! registered child.
//!
//! Invariant: a process is named by its pid and its start identity (the
//! encoded `ProcessIdentity`), never by the pid alone, so a reused pid is
//! never signalled.

use crate::store::Cached as _;
use kernel::ids::RunnerEpochId;
use rusqlite::{Connection, params};

/// Registers a direct child of the runner of `runner_epoch` (idempotent).
pub fn register(
    connection: &Connection,
    runner_epoch: &RunnerEpochId,
    pid: u32,
    start_identity: &str,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO runner_processes (pid, start_identity, runner_epoch, registered_at_ms) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT DO NOTHING",
        params![i64::from(pid), start_identity, runner_epoch.as_str(), now_ms as i64],
    )?;
    Ok(())
}

/// Removes one registered child (a no-op when it is not registered).
pub fn unregister(
    connection: &Connection,
    runner_epoch: &RunnerEpochId,
    pid: u32,
    start_identity: &str,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "DELETE FROM runner_processes WHERE runner_epoch = ?1 AND pid = ?2 AND start_identity = ?3",
        params![runner_epoch.as_str(), i64::from(pid), start_identity],
    )?;
    Ok(())
}

/// Removes and returns the start identities registered for `runner_epoch`.
pub fn take_registered(
    connection: &Connection,
    runner_epoch: &RunnerEpochId,
) -> rusqlite::Result<Vec<String>> {
    let mut statement = connection
        .prepare_cached("SELECT start_identity FROM runner_processes WHERE runner_epoch = ?1")?;
    let rows: Vec<String> = statement
        .query_map(params![runner_epoch.as_str()], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    connection.execute_cached(
        "DELETE FROM runner_processes WHERE runner_epoch = ?1",
        params![runner_epoch.as_str()],
    )?;
    Ok(rows)
}

/// Records how the runner process of `runner_epoch` ended.
pub fn record_exit_status(
    connection: &Connection,
    runner_epoch: &RunnerEpochId,
    code: Option<i32>,
    signal: Option<i32>,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "UPDATE run_workers SET exit_code = ?2, signal = ?3 WHERE runner_epoch = ?1",
        params![runner_epoch.as_str(), code, signal],
    )?;
    Ok(())
}
