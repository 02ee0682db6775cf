//! Protected human decisions (`human_decisions`) beyond the pending one the
//! run aggregate carries.

use super::Cached as _;
use super::runs::decision_from_row;
use kernel::decision::DecisionRecord;
use kernel::run::RunAggregate;
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
