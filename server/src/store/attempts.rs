//! What the kernel's attempt facts leave to the shell: outputs, errors and
//! action receipts of node attempts, the result records routing reads, and
//! the narrow run state a runner's command carries.
//!
//! Invariant: result records are rebuilt from committed rows only, with the
//! kernel's builder (`kernel::attempt::ResultRecord`, the one shape), so a
//! resumed run routes on exactly what was committed.

use super::Cached as _;
use super::blobs::{self, Blob};
use super::codec::{DigestColumn, u64_of};
use kernel::attempt::{NodeOutcome, ResultRecord};
use kernel::ids::{AttemptId, Digest, NodeId, RunId};
use kernel::topology::Topology;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value};

/// The stored payload of a finished attempt.
#[derive(Debug, Default)]
pub struct AttemptResult {
    pub output: Option<Blob>,
    pub error_message: Option<String>,
    pub action_json: Option<String>,
    pub status_detail: Option<String>,
}

/// Writes an attempt's output, error and action receipt (after the kernel's
/// write created or finished the row).
pub(crate) fn record_result(
    connection: &Connection,
    run_id: &RunId,
    attempt_id: &AttemptId,
    result: &AttemptResult,
    now_ms: u64,
) -> rusqlite::Result<()> {
    if let Some(output) = &result.output {
        blobs::put(connection, output, blobs::JSON, now_ms)?;
    }
    connection.execute_cached(
        "UPDATE node_attempts SET output_digest = COALESCE(?3, output_digest), error_message = COALESCE(?4, error_message),
             action_json = COALESCE(?5, action_json)
         WHERE run_id = ?1 AND attempt_id = ?2",
        params![
            run_id.as_str(),
            attempt_id.as_str(),
            result.output.as_ref().map(|blob| blob.digest.0.to_vec()),
            result.error_message,
            result.action_json,
        ],
    )?;
    Ok(())
}

/// Records the runner's status detail for the active attempt.
pub(crate) fn record_status_detail(
    connection: &Connection,
    run_id: &RunId,
    attempt_id: &AttemptId,
    detail: &str,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "UPDATE node_attempts SET status_detail = ?3 WHERE run_id = ?1 AND attempt_id = ?2",
        params![run_id.as_str(), attempt_id.as_str(), detail],
    )?;
    Ok(())
}

/// A finished attempt's columns: attempt id, node id, outcome, start and
/// finish times, output digest, error message.
type FinishedRow = (
    String,
    String,
    String,
    u64,
    Option<u64>,
    Option<DigestColumn>,
    Option<String>,
);

fn finished_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<FinishedRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        u64_of(row.get(3)?),
        row.get::<_, Option<i64>>(4)?.map(u64_of),
        row.get(5)?,
        row.get(6)?,
    ))
}

/// The result record of a finished attempt, rebuilt from its committed row
/// with the kernel's one builder (`kernel::attempt::ResultRecord`).
fn record_of(
    connection: &Connection,
    topology: &Topology,
    row: FinishedRow,
) -> rusqlite::Result<Value> {
    let (attempt_id, node_id, outcome, started, finished, output, error) = row;
    let output = match blobs::digest_of(output) {
        Some(digest) => Some(blobs::get_json(connection, &digest)?),
        None => None,
    };
    let node_id = NodeId::new(node_id);
    let attempt_id = AttemptId::new(attempt_id);
    let record = ResultRecord {
        attempt_id: &attempt_id,
        node_id: &node_id,
        node_type: kernel::attempt::node_type(topology, &node_id),
        outcome: super::codec::parse::<NodeOutcome>(&outcome)?,
        started_at_ms: started,
        finished_at_ms: finished.unwrap_or(started),
        output: output.as_ref(),
        error: error.as_deref(),
    };
    Ok(record.to_value())
}

/// The committed result record of the run's last finished step, if any.
pub(crate) fn last_step_record(
    connection: &Connection,
    run_id: &RunId,
    topology: &Topology,
) -> rusqlite::Result<Option<Value>> {
    let row = connection
        .query_row_cached(
            "SELECT attempt_id, node_id, outcome, started_at_ms, finished_at_ms, output_digest, error_message
             FROM node_attempts WHERE run_id = ?1 AND status = 'finished' ORDER BY seq DESC LIMIT 1",
            params![run_id.as_str()],
            finished_row,
        )
        .optional()?;
    match row {
        Some(row) => record_of(connection, topology, row).map(Some),
        None => Ok(None),
    }
}

/// The narrow run state a runner needs: the input, the latest result record
/// per node, the order of those latest results, and the number of steps.
/// Each output is in its result record only (once): the runner derives the
/// latest `ok` outputs from the records whose outcome is `ok`.
pub(crate) fn run_state(
    connection: &Connection,
    run_id: &RunId,
    input_digest: &Digest,
    topology: &Topology,
) -> rusqlite::Result<protocol::generated::types::RunState> {
    use crate::projection::run_view::{OffSchema, to_wire};
    let input = blobs::get_json(connection, input_digest)?;
    let mut statement = connection.prepare_cached(
        "SELECT attempt_id, node_id, outcome, started_at_ms, finished_at_ms, output_digest, error_message
         FROM node_attempts WHERE run_id = ?1 AND status = 'finished' ORDER BY seq",
    )?;
    let rows = statement
        .query_map(params![run_id.as_str()], finished_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut results = Map::new();
    let mut result_order: Vec<String> = Vec::new();
    let steps = rows.len();
    for row in rows {
        let node_id = row.1.clone();
        let record = record_of(connection, topology, row)?;
        result_order.retain(|id| *id != node_id);
        result_order.push(node_id.clone());
        results.insert(node_id, record);
    }
    Ok(protocol::generated::types::RunState {
        input,
        result_order: result_order
            .iter()
            .map(|id| to_wire("resultOrder", id))
            .collect::<Result<_, _>>()?,
        results: protocol::generated::types::JsonObject(results),
        steps: protocol::generated::constrained::Count::new(steps as u64)
            .ok_or(OffSchema("steps"))?,
    })
}

/// The final output of a completed run: the output of its last `ok` step.
pub(crate) fn final_output(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<Value>> {
    match final_output_digest(connection, run_id)? {
        Some(digest) => Ok(Some(blobs::get_json(connection, &digest)?)),
        None => Ok(None),
    }
}

/// The digest of the run's final output (its latest `ok` attempt's), if any.
pub(crate) fn final_output_digest(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<kernel::ids::Digest>> {
    let digest: Option<DigestColumn> = connection
        .query_row_cached(
            "SELECT output_digest FROM node_attempts WHERE run_id = ?1 AND status = 'finished' AND outcome = 'ok'
             ORDER BY seq DESC LIMIT 1",
            params![run_id.as_str()],
            |row| row.get(0),
        )
        .optional()?
        .flatten();
    Ok(blobs::digest_of(digest))
}
