//! Protected human decisions (`human_decisions`) beyond the pending one the
//! run aggregate carries: the request a decision was opened for, who
//! answered it, the response a continuation carries, and the deadlines a
//! restarted server arms again.
//!
//! Invariants:
//! - A decision's request is its checkpoint's stored output (the sealed
//!   `HumanDecisionRequest` the runner finished the checkpoint with); it is
//!   read back typed, never field by field.
//! - Who answered (channel and actor) is written beside the accepted
//!   decision and read by nothing that a client sees.
//! - A continuation of a protected decision carries the accepted response,
//!   not the request, as its checkpoint's output (the reference's
//!   continuation rule): that is what its route and its runner read.

use super::Cached as _;
use super::blobs::{self, Blob};
use super::codec::{DigestColumn, u64_of};
use super::runs::decision_from_row;
use kernel::decision::DecisionRecord;
use kernel::ids::{DecisionId, NodeId, RunId};
use kernel::run::RunAggregate;
use protocol::generated::types::HumanDecisionRequest;
use rusqlite::{Connection, OptionalExtension, params};

/// The decision on the checkpoint `parent` waits on, in any state.
pub(crate) fn for_checkpoint(
    connection: &Connection,
    parent: &RunAggregate,
) -> rusqlite::Result<Option<DecisionRecord>> {
    let Some(node_id) = parent.run.waiting_on.as_ref() else {
        return Ok(None);
    };
    connection
        .query_row_cached(
            "SELECT decision_id, node_id, request_digest, state, provenance, answer_digest, deadline_at_ms,
                    default_answer_digest, continuation_run_id
             FROM human_decisions WHERE run_id = ?1 AND node_id = ?2 ORDER BY created_at_ms DESC LIMIT 1",
            params![parent.run.run_id.as_str(), node_id.as_str()],
            |row| decision_from_row(&parent.run.run_id, row),
        )
        .optional()
}

/// The latest decision of `run_id` on `node_id`, in any state, and the
/// channel that answered it (`pi`, `cli`, `telegram`; `None` unless a
/// person's answer was accepted). For the outcome a settlement edit states.
pub(crate) fn on_node(
    connection: &Connection,
    run_id: &RunId,
    node_id: &NodeId,
) -> rusqlite::Result<Option<(DecisionRecord, Option<String>)>> {
    connection
        .query_row_cached(
            "SELECT decision_id, node_id, request_digest, state, provenance, answer_digest, deadline_at_ms,
                    default_answer_digest, continuation_run_id, answer_channel
             FROM human_decisions WHERE run_id = ?1 AND node_id = ?2 ORDER BY created_at_ms DESC LIMIT 1",
            params![run_id.as_str(), node_id.as_str()],
            |row| Ok((decision_from_row(run_id, row)?, row.get::<_, Option<String>>(9)?)),
        )
        .optional()
}

/// The sealed request the checkpoint `node_id` of `run_id` finished with:
/// the output of its latest `ok` attempt, read as a `HumanDecisionRequest`.
pub(crate) fn request(
    connection: &Connection,
    run_id: &RunId,
    node_id: &NodeId,
) -> rusqlite::Result<Option<HumanDecisionRequest>> {
    let digest: Option<DigestColumn> = connection
        .query_row_cached(
            "SELECT output_digest FROM node_attempts
             WHERE run_id = ?1 AND node_id = ?2 AND status = 'finished' AND outcome = 'ok'
             ORDER BY seq DESC LIMIT 1",
            params![run_id.as_str(), node_id.as_str()],
            |row| row.get(0),
        )
        .optional()?
        .flatten();
    match blobs::digest_of(digest) {
        Some(digest) => Ok(crate::wire::decision::read(blobs::get_json(
            connection, &digest,
        )?)),
        None => Ok(None),
    }
}

/// The request of `agg`'s pending decision, when it has one.
pub(crate) fn pending_request(
    connection: &Connection,
    agg: &RunAggregate,
) -> rusqlite::Result<Option<HumanDecisionRequest>> {
    match agg
        .decision
        .as_ref()
        .filter(|decision| decision.status == kernel::decision::DecisionStatus::Pending)
    {
        Some(decision) => request(connection, &decision.run_id, &decision.node_id),
        None => Ok(None),
    }
}

/// Records who answered an accepted decision (`channel` is the client.v1
/// `DecisionChannel` name).
pub(crate) fn record_source(
    connection: &Connection,
    decision_id: &DecisionId,
    channel: &str,
    actor_id: &str,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "UPDATE human_decisions SET answer_channel = ?2, answer_actor_id = ?3 WHERE decision_id = ?1",
        params![decision_id.as_str(), channel, actor_id],
    )?;
    Ok(())
}

/// Makes `response` (stored as a blob) the output of the checkpoint step a
/// new continuation `child_run_id` carries from its parent.
pub(crate) fn carry_response(
    connection: &Connection,
    child_run_id: &RunId,
    checkpoint: &NodeId,
    response: &Blob,
    now_ms: u64,
) -> rusqlite::Result<()> {
    blobs::put(connection, response, blobs::JSON, now_ms)?;
    connection.execute_cached(
        "UPDATE node_attempts SET output_digest = ?3
         WHERE run_id = ?1 AND attempt_id = (
           SELECT attempt_id FROM node_attempts
           WHERE run_id = ?1 AND node_id = ?2 AND status = 'finished' AND carried = 1
           ORDER BY seq DESC LIMIT 1)",
        params![
            child_run_id.as_str(),
            checkpoint.as_str(),
            response.digest.0.to_vec()
        ],
    )?;
    Ok(())
}

/// The stored response an accepted decision's answer digest names.
pub(crate) fn response(
    connection: &Connection,
    decision: &DecisionRecord,
) -> rusqlite::Result<Option<serde_json::Value>> {
    match &decision.status {
        kernel::decision::DecisionStatus::Accepted { answer_digest, .. } => {
            Ok(blobs::get(connection, answer_digest)?
                .and_then(|bytes| serde_json::from_slice(&bytes).ok()))
        }
        _ => Ok(None),
    }
}

/// Every pending decision with a deadline: `(run, deadline)`, for the wakes a
/// restarted server arms again.
pub(crate) fn pending_deadlines(connection: &Connection) -> rusqlite::Result<Vec<(RunId, u64)>> {
    let mut statement = connection.prepare_cached(
        "SELECT run_id, deadline_at_ms FROM human_decisions
         WHERE state = 'pending' AND deadline_at_ms IS NOT NULL",
    )?;
    statement
        .query_map([], |row| {
            Ok((RunId::new(row.get::<_, String>(0)?), u64_of(row.get(1)?)))
        })?
        .collect()
}

/// Accepted decisions whose waiting parent was never continued (only a
/// writer older than the one-transaction acceptance could leave one): the
/// runs startup recovery continues.
pub(crate) fn accepted_without_continuation(
    connection: &Connection,
) -> rusqlite::Result<Vec<RunId>> {
    let mut statement = connection.prepare_cached(
        "SELECT d.run_id FROM human_decisions d JOIN runs r USING (run_id)
         WHERE d.state = 'accepted' AND r.status = 'waiting' AND r.continued_by IS NULL",
    )?;
    statement
        .query_map([], |row| Ok(RunId::new(row.get::<_, String>(0)?)))?
        .collect()
}
