//! What the kernel's attempt facts leave to the shell: outputs, errors and
//! action receipts of node attempts, the result records routing reads, and
//! the narrow run state a runner's command carries.
//!
//! Invariant: result records are rebuilt from committed rows only, so a
//! resumed run routes on exactly what was committed.

use super::Cached as _;
use super::blobs::{self, Blob};
use super::codec::{DigestColumn, u64_of};
use kernel::ids::{AttemptId, Digest, NodeId, RunId};
use kernel::topology::Topology;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value, json};

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

/// The node type name of `node_id` in `topology` (`compute` when unknown).
pub fn node_type_name(topology: &Topology, node_id: &NodeId) -> String {
    topology.node(node_id).map_or_else(
        || "compute".to_owned(),
        |node| super::codec::name(&node.node_type),
    )
}

/// The result record routing reads (`$result.…`): `{attemptId, nodeId,
/// nodeType, outcome, startedAt, finishedAt, durationMs, output?, error?}`.
#[derive(Debug)]
pub struct ResultRecord<'a> {
    pub attempt_id: &'a AttemptId,
    pub node_id: &'a NodeId,
    pub node_type: &'a str,
    pub outcome: &'a str,
    pub started_at_ms: u64,
    pub finished_at_ms: u64,
    pub output: Option<&'a Value>,
    pub error: Option<&'a str>,
}

impl ResultRecord<'_> {
    /// The JSON record.
    pub fn to_value(&self) -> Value {
        let mut record = json!({
            "attemptId": self.attempt_id.as_str(),
            "nodeId": self.node_id.as_str(),
            "nodeType": self.node_type,
            "outcome": self.outcome,
            "startedAt": crate::clock::rfc3339(self.started_at_ms),
            "finishedAt": crate::clock::rfc3339(self.finished_at_ms),
            "durationMs": self.finished_at_ms.saturating_sub(self.started_at_ms),
        });
        if let Some(output) = self.output {
            record["output"] = output.clone();
        }
        if let Some(error) = self.error {
            record["error"] = json!({ "message": error });
        }
        record
    }
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
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    u64_of(row.get(3)?),
                    row.get::<_, Option<i64>>(4)?.map(u64_of),
                    row.get::<_, Option<DigestColumn>>(5)?,
                    row.get::<_, Option<String>>(6)?,
                ))
            },
        )
        .optional()?;
    let Some((attempt_id, node_id, outcome, started, finished, output, error)) = row else {
        return Ok(None);
    };
    let output = match blobs::digest_of(output) {
        Some(digest) => Some(blobs::get_json(connection, &digest)?),
        None => None,
    };
    let node_id = NodeId::new(node_id);
    let node_type = node_type_name(topology, &node_id);
    let attempt_id = AttemptId::new(attempt_id);
    let record = ResultRecord {
        attempt_id: &attempt_id,
        node_id: &node_id,
        node_type: &node_type,
        outcome: &outcome,
        started_at_ms: started,
        finished_at_ms: finished.unwrap_or(started),
        output: output.as_ref(),
        error: error.as_deref(),
    };
    Ok(Some(record.to_value()))
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
) -> rusqlite::Result<Value> {
    let input = blobs::get_json(connection, input_digest)?;
    let mut statement = connection.prepare_cached(
        "SELECT attempt_id, node_id, outcome, started_at_ms, finished_at_ms, output_digest, error_message
         FROM node_attempts WHERE run_id = ?1 AND status = 'finished' ORDER BY seq",
    )?;
    let rows = statement
        .query_map(params![run_id.as_str()], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                u64_of(row.get(3)?),
                row.get::<_, Option<i64>>(4)?.map(u64_of),
                row.get::<_, Option<DigestColumn>>(5)?,
                row.get::<_, Option<String>>(6)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut results = Map::new();
    let mut result_order: Vec<String> = Vec::new();
    let steps = rows.len();
    for (attempt_id, node_id, outcome, started, finished, output, error) in rows {
        let output = match blobs::digest_of(output) {
            Some(digest) => Some(blobs::get_json(connection, &digest)?),
            None => None,
        };
        let node = NodeId::new(node_id.clone());
        let node_type = node_type_name(topology, &node);
        let attempt_id = AttemptId::new(attempt_id);
        let record = ResultRecord {
            attempt_id: &attempt_id,
            node_id: &node,
            node_type: &node_type,
            outcome: &outcome,
            started_at_ms: started,
            finished_at_ms: finished.unwrap_or(started),
            output: output.as_ref(),
            error: error.as_deref(),
        }
        .to_value();
        result_order.retain(|id| *id != node_id);
        result_order.push(node_id.clone());
        results.insert(node_id, record);
    }
    Ok(json!({
        "input": input,
        "results": results,
        "resultOrder": result_order,
        "steps": steps,
    }))
}

/// The final output of a completed run: the output of its last `ok` step.
pub(crate) fn final_output(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<Value>> {
    let digest: Option<DigestColumn> = connection
        .query_row_cached(
            "SELECT output_digest FROM node_attempts WHERE run_id = ?1 AND status = 'finished' AND outcome = 'ok'
             ORDER BY seq DESC LIMIT 1",
            params![run_id.as_str()],
            |row| row.get(0),
        )
        .optional()?
        .flatten();
    match blobs::digest_of(digest) {
        Some(digest) => Ok(Some(blobs::get_json(connection, &digest)?)),
        None => Ok(None),
    }
}
