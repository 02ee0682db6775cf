//! State retention's SQL: run trees, the facts the kernel's selector reads
//! about them, exact-tree deletion with blob collection, and the page
//! statistics and compaction of the database file. The automatic sweep
//! (`time::sweep`) and `state prune` (`client_api::maintenance`) both use
//! these, so they share the selector's facts and the deletion.
//!
//! Invariants:
//! - A tree is a root run (no continuation parent, no restart root) and
//!   every run whose restart root or continuation parent is in it, closed
//!   under both ([`tree`]).
//! - [`delete_tree`] deletes exactly the given runs inside the caller's
//!   transaction: the runs (and, by cascade, every row keyed by them), their
//!   events, their runner-message receipts and their command receipts; then
//!   the blobs and definitions the tree referenced that nothing references
//!   any more. A blob any row still references is never deleted: every blob
//!   reference column is in [`BLOB_REFERENCES`] (with an index), and the
//!   collection checks them all.
//! - Every lookup a deletion makes is indexed (schema version 5), so a
//!   tree's deletion costs what the tree holds, not what the database holds.
//! - The deleted runs are announced after the commit
//!   (`store::Published::Deleted`) and the run list's revision advances.

use super::Cached as _;
use super::codec::{i64_of, parse, u64_of};
use kernel::ids::RunId;
use kernel::retention::{OutsideReferences, PageStats, Protections, RetainedRun};
use rusqlite::{Connection, params};
use std::sync::OnceLock;

/// One column that holds a blob digest: its table, its column, and the
/// condition (on the table's own rows, `?1` the tree as a JSON array of run
/// ids) that makes a row part of a tree.
#[derive(Clone, Copy, Debug)]
pub struct BlobReference {
    pub table: &'static str,
    pub column: &'static str,
    owned_by_tree: &'static str,
}

const IN_TREE: &str = "run_id IN (SELECT value FROM json_each(?1))";
const EPOCH_IN_TREE: &str = "runner_epoch IN (SELECT runner_epoch FROM run_workers WHERE run_id IN (SELECT value FROM json_each(?1)))";
const INTERACTION_IN_TREE: &str = "interaction_id IN (SELECT interaction_id FROM interactive_requests WHERE run_id IN (SELECT value FROM json_each(?1)))";

/// Every column that refers to a blob (`blobs.digest`).
pub const BLOB_REFERENCES: [BlobReference; 12] = [
    reference("runs", "input_digest", IN_TREE),
    reference("node_attempts", "output_digest", IN_TREE),
    reference("interactive_requests", "prompt_digest", IN_TREE),
    reference(
        "interactive_submissions",
        "payload_digest",
        INTERACTION_IN_TREE,
    ),
    reference(
        "interactive_submissions",
        "receipt_digest",
        INTERACTION_IN_TREE,
    ),
    reference("workflow_messages", "content_digest", IN_TREE),
    reference("effects", "result_digest", IN_TREE),
    reference("human_decisions", "answer_digest", IN_TREE),
    reference("human_decisions", "default_answer_digest", IN_TREE),
    reference("run_workers", "diagnostic_digest", IN_TREE),
    reference("worker_messages", "content_digest", EPOCH_IN_TREE),
    reference("viewer_session_checkpoints", "checkpoint_digest", IN_TREE),
];

const fn reference(
    table: &'static str,
    column: &'static str,
    owned_by_tree: &'static str,
) -> BlobReference {
    BlobReference {
        table,
        column,
        owned_by_tree,
    }
}

/// `?1` as the tree's members: a JSON array of run ids.
fn members(tree: &[RunId]) -> String {
    serde_json::to_string(&tree.iter().map(RunId::as_str).collect::<Vec<_>>()).unwrap_or_default()
}

// ---- candidates and trees ----------------------------------------------------

/// Root runs that finished before `cutoff_ms`, in (finish time, run id)
/// order after `after`, at most `limit` of them: the trees a sweep or a
/// prune looks at (the selector decides each one).
pub fn due_roots(
    connection: &Connection,
    cutoff_ms: u64,
    after: Option<&(u64, RunId)>,
    limit: usize,
) -> rusqlite::Result<Vec<(u64, RunId)>> {
    let (after_ms, after_run) = after.map_or((-1, ""), |(at, run)| (i64_of(*at), run.as_str()));
    let mut statement = connection.prepare_cached(
        "SELECT finished_at_ms, run_id FROM runs
         WHERE continuation_of IS NULL AND restart_root_run_id IS NULL
           AND finished_at_ms < ?1 AND (finished_at_ms, run_id) > (?2, ?3)
         ORDER BY finished_at_ms, run_id LIMIT ?4",
    )?;
    let rows = statement.query_map(
        params![
            i64_of(cutoff_ms),
            after_ms,
            after_run,
            i64::try_from(limit).unwrap_or(i64::MAX)
        ],
        |row| Ok((u64_of(row.get(0)?), RunId::new(row.get::<_, String>(1)?))),
    )?;
    rows.collect()
}

/// How many root runs finished before `cutoff_ms` (a progress total).
pub fn count_due_roots(connection: &Connection, cutoff_ms: u64) -> rusqlite::Result<u64> {
    connection.query_row_cached(
        "SELECT COUNT(*) FROM runs
         WHERE continuation_of IS NULL AND restart_root_run_id IS NULL AND finished_at_ms < ?1",
        params![i64_of(cutoff_ms)],
        |row| Ok(u64_of(row.get(0)?)),
    )
}

/// The runs of the tree rooted at `root` (the root first), or none when the
/// root does not exist.
pub fn tree(connection: &Connection, root: &RunId) -> rusqlite::Result<Vec<RunId>> {
    let mut statement = connection.prepare_cached(
        "WITH RECURSIVE tree(run_id) AS (
           SELECT run_id FROM runs WHERE run_id = ?1
           UNION
           SELECT r.run_id FROM runs r JOIN tree t ON r.restart_root_run_id = t.run_id
           UNION
           SELECT r.run_id FROM runs r JOIN tree t ON r.continuation_of = t.run_id
         )
         SELECT run_id FROM tree ORDER BY run_id = ?1 DESC, run_id",
    )?;
    let rows = statement.query_map(params![root.as_str()], |row| {
        Ok(RunId::new(row.get::<_, String>(0)?))
    })?;
    rows.collect()
}

/// A root run's workflow name and finish time (`None` when it is gone).
pub fn root_summary(
    connection: &Connection,
    root: &RunId,
) -> rusqlite::Result<Option<(String, Option<u64>)>> {
    use rusqlite::OptionalExtension as _;
    connection
        .query_row_cached(
            "SELECT workflow_name, finished_at_ms FROM runs WHERE run_id = ?1",
            params![root.as_str()],
            |row| Ok((row.get(0)?, row.get::<_, Option<i64>>(1)?.map(u64_of))),
        )
        .optional()
}

/// The selector's facts of every run of `tree`, from its rows.
///
/// Protections (each an indexed lookup by run): a waiting, parked or paused
/// run; a queue row that is not settled; a pending workflow message (a
/// queued follow-up and an undelivered terminal result are named as such);
/// an open workflow turn; a pending interaction or a submission still
/// validating; a pending human decision; a held claim; an effect that is
/// reserved, applying or ambiguous (its outcome is not settled); a live
/// runner epoch (its content may still be read); a waiting checkpoint not
/// yet continued. This version records no session segments and no
/// controller ownership, so those are never set.
///
/// Outside references: a continuation (a queue row, a decision's
/// continuation, a restart or a continuation run) of a run outside the tree
/// that names a run in it; a workflow turn that joins a run of the tree
/// with a message of another tree. Ownership is known when the run has its
/// binding and queue rows.
pub fn retained_runs(
    connection: &Connection,
    tree: &[RunId],
) -> rusqlite::Result<Vec<RetainedRun>> {
    let members = members(tree);
    let mut statement = connection.prepare_cached(
        "SELECT r.status, r.finished_at_ms,
           r.status = 'waiting' OR q.status = 'parked' OR r.paused = 1,
           COALESCE(q.status IN ('queued', 'starting', 'running', 'parked'), 0),
           EXISTS (SELECT 1 FROM workflow_messages m WHERE m.run_id = r.run_id AND m.state = 'pending'
                   AND m.kind NOT IN ('followUp', 'terminal')),
           EXISTS (SELECT 1 FROM workflow_turns t WHERE t.run_id = r.run_id AND t.state = 'open'),
           EXISTS (SELECT 1 FROM interactive_requests i WHERE i.run_id = r.run_id AND i.status = 'pending')
             OR EXISTS (SELECT 1 FROM interactive_requests i JOIN interactive_submissions s USING (interaction_id)
                        WHERE i.run_id = r.run_id AND s.outcome = 'validating'),
           EXISTS (SELECT 1 FROM human_decisions d WHERE d.run_id = r.run_id AND d.state = 'pending'),
           EXISTS (SELECT 1 FROM workflow_messages m WHERE m.run_id = r.run_id AND m.state = 'pending'
                   AND m.kind = 'followUp'),
           COALESCE(l.owner_kind IS NOT NULL, 0),
           EXISTS (SELECT 1 FROM effects e WHERE e.run_id = r.run_id
                   AND e.state IN ('reserved', 'applying', 'ambiguous')),
           EXISTS (SELECT 1 FROM run_workers w WHERE w.run_id = r.run_id AND w.status IN ('launching', 'ready')),
           r.status = 'waiting' AND r.waiting_on IS NOT NULL AND r.continued_by IS NULL,
           EXISTS (SELECT 1 FROM workflow_messages m WHERE m.run_id = r.run_id AND m.state = 'pending'
                   AND m.kind = 'terminal'),
           EXISTS (SELECT 1 FROM run_queue o WHERE o.parent_run_id = r.run_id
                   AND o.run_id NOT IN (SELECT value FROM json_each(?2)))
             OR EXISTS (SELECT 1 FROM human_decisions o WHERE o.continuation_run_id = r.run_id
                   AND o.run_id NOT IN (SELECT value FROM json_each(?2)))
             OR EXISTS (SELECT 1 FROM runs o WHERE o.continuation_of = r.run_id
                   AND o.run_id NOT IN (SELECT value FROM json_each(?2)))
             OR EXISTS (SELECT 1 FROM runs o WHERE o.restart_root_run_id = r.run_id
                   AND o.run_id NOT IN (SELECT value FROM json_each(?2))),
           EXISTS (SELECT 1 FROM workflow_turns t JOIN workflow_messages m ON m.message_id = t.message_id
                   WHERE t.run_id = r.run_id AND m.run_id NOT IN (SELECT value FROM json_each(?2)))
             OR EXISTS (SELECT 1 FROM workflow_messages m JOIN workflow_turns t ON t.message_id = m.message_id
                   WHERE m.run_id = r.run_id AND t.run_id NOT IN (SELECT value FROM json_each(?2))),
           b.run_id IS NOT NULL AND q.run_id IS NOT NULL
         FROM runs r
         LEFT JOIN run_queue q ON q.run_id = r.run_id
         LEFT JOIN leases l ON l.run_id = r.run_id
         LEFT JOIN run_bindings b ON b.run_id = r.run_id
         WHERE r.run_id = ?1",
    )?;
    let mut runs = Vec::with_capacity(tree.len());
    for run_id in tree {
        let run = statement.query_row(params![run_id.as_str(), members], |row| {
            let flag = |index: usize| row.get::<_, bool>(index);
            Ok(RetainedRun {
                run_id: run_id.clone(),
                status: parse(&row.get::<_, String>(0)?)?,
                finished_at_ms: row.get::<_, Option<i64>>(1)?.map(u64_of),
                protections: Protections {
                    waiting_or_parked_run: flag(2)?,
                    live_queue_row: flag(3)?,
                    pending_workflow_message: flag(4)?,
                    open_workflow_turn: flag(5)?,
                    pending_interaction: flag(6)?,
                    pending_human_decision: flag(7)?,
                    recording_session_segment: false,
                    queued_follow_up: flag(8)?,
                    active_lease: flag(9)?,
                    unsettled_effect: flag(10)?,
                    controller_ownership: false,
                    active_runner_content: flag(11)?,
                    resumable_checkpoint: flag(12)?,
                    undelivered_terminal_result: flag(13)?,
                },
                outside_references: OutsideReferences {
                    continuation: flag(14)?,
                    step: flag(15)?,
                },
                ownership_known: flag(16)?,
            })
        })?;
        runs.push(run);
    }
    Ok(runs)
}

// ---- deletion ----------------------------------------------------------------

/// What one tree's deletion removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    pub runs: u64,
    pub blobs: u64,
    pub definitions: u64,
    /// The bytes of the tree's stored values: its documents, events,
    /// receipts, sources and updates, and the blobs and definitions only it
    /// used (page overhead is not counted).
    pub bytes: u64,
}

/// The SQL that lists the blob digests a tree's rows reference.
fn candidate_blobs_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        BLOB_REFERENCES
            .iter()
            .map(|reference| {
                format!(
                    "SELECT {column} FROM {table} WHERE {column} IS NOT NULL AND {owner}",
                    column = reference.column,
                    table = reference.table,
                    owner = reference.owned_by_tree,
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ")
    })
}

/// `NOT EXISTS` over every blob reference of the digest `?1`.
fn unreferenced_sql(digest: &str) -> String {
    BLOB_REFERENCES
        .iter()
        .map(|reference| {
            format!(
                "NOT EXISTS (SELECT 1 FROM {table} WHERE {column} = {digest})",
                table = reference.table,
                column = reference.column,
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// Deletes a blob when nothing references it; returns its bytes.
fn collect_blob_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "DELETE FROM blobs WHERE digest = ?1 AND {} RETURNING octet_length(bytes)",
            unreferenced_sql("?1")
        )
    })
}

/// Deletes `tree` (the runs [`tree`] returned, rechecked by the caller's
/// selector in the same transaction) and the blobs and definitions only it
/// referenced. Marks every run as deleted for the commit's announcement.
pub fn delete_tree(connection: &Connection, tree: &[RunId]) -> rusqlite::Result<Deleted> {
    let members = members(tree);
    let candidates: Vec<Vec<u8>> = {
        let mut statement = connection.prepare_cached(candidate_blobs_sql())?;
        let rows = statement.query_map(params![members], |row| row.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let definitions: Vec<String> = {
        let mut statement = connection.prepare_cached(
            "SELECT DISTINCT definition_digest FROM runs WHERE run_id IN (SELECT value FROM json_each(?1))",
        )?;
        let rows = statement.query_map(params![members], |row| row.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    // `octet_length` takes each size from its record header: the values
    // themselves are not read.
    let row_bytes: i64 = connection.query_row_cached(
        "SELECT
           (SELECT COALESCE(SUM(octet_length(payload)), 0) FROM events WHERE run_id IN (SELECT value FROM json_each(?1)))
         + (SELECT COALESCE(SUM(octet_length(document) + octet_length(shown)), 0) FROM viewer_steps WHERE run_id IN (SELECT value FROM json_each(?1)))
         + (SELECT COALESCE(SUM(octet_length(document)), 0) FROM viewer_nodes WHERE run_id IN (SELECT value FROM json_each(?1)))
         + (SELECT COALESCE(SUM(COALESCE(octet_length(header_json), 0) + COALESCE(octet_length(updates_json), 0)), 0)
              FROM viewer_runs WHERE run_id IN (SELECT value FROM json_each(?1)))
         + (SELECT COALESCE(SUM(octet_length(patch_json)), 0) FROM viewer_deltas WHERE run_id IN (SELECT value FROM json_each(?1)))
         + (SELECT COALESCE(SUM(octet_length(bytes)), 0) FROM run_view_content WHERE run_id IN (SELECT value FROM json_each(?1)))
         + (SELECT COALESCE(SUM(octet_length(source_json)), 0) FROM run_sources WHERE run_id IN (SELECT value FROM json_each(?1)))
         + (SELECT COALESCE(SUM(octet_length(data_json)), 0) FROM workflow_updates WHERE run_id IN (SELECT value FROM json_each(?1)))
         + (SELECT COALESCE(SUM(COALESCE(octet_length(action_json), 0) + COALESCE(octet_length(error_message), 0)
                                + COALESCE(octet_length(status_detail), 0)), 0)
              FROM node_attempts WHERE run_id IN (SELECT value FROM json_each(?1)))
         + (SELECT COALESCE(SUM(octet_length(reply_json)), 0) FROM worker_messages
              WHERE runner_epoch IN (SELECT runner_epoch FROM run_workers WHERE run_id IN (SELECT value FROM json_each(?1))))
         + (SELECT COALESCE(SUM(octet_length(receipt_json)), 0) FROM host_commands
              WHERE run_id IN (SELECT value FROM json_each(?1))
                 OR (operation = 'run.start'
                     AND json_extract(receipt_json, '$.receipt.runId') IN (SELECT value FROM json_each(?1))))",
        params![members],
        |row| row.get(0),
    )?;
    connection.execute_cached(
        "DELETE FROM events WHERE run_id IN (SELECT value FROM json_each(?1))",
        params![members],
    )?;
    connection.execute_cached(
        "DELETE FROM worker_messages WHERE runner_epoch IN
           (SELECT runner_epoch FROM run_workers WHERE run_id IN (SELECT value FROM json_each(?1)))",
        params![members],
    )?;
    connection.execute_cached(
        "DELETE FROM host_commands WHERE run_id IN (SELECT value FROM json_each(?1))",
        params![members],
    )?;
    connection.execute_cached(
        "DELETE FROM host_commands WHERE operation = 'run.start'
           AND json_extract(receipt_json, '$.receipt.runId') IN (SELECT value FROM json_each(?1))",
        params![members],
    )?;
    // Every other row of a run is keyed by it and goes by cascade.
    let runs = connection.execute_cached(
        "DELETE FROM runs WHERE run_id IN (SELECT value FROM json_each(?1))",
        params![members],
    )?;
    let mut deleted = Deleted {
        runs: runs as u64,
        bytes: u64_of(row_bytes),
        ..Deleted::default()
    };
    for digest in candidates {
        let mut statement = connection.prepare_cached(collect_blob_sql())?;
        let mut rows = statement.query(params![digest])?;
        if let Some(row) = rows.next()? {
            deleted.blobs += 1;
            deleted.bytes += u64_of(row.get(0)?);
        }
    }
    for definition in definitions {
        let mut statement = connection.prepare_cached(
            "DELETE FROM workflow_definitions WHERE definition_digest = ?1
               AND NOT EXISTS (SELECT 1 FROM runs WHERE definition_digest = ?1)
             RETURNING octet_length(topology_json)",
        )?;
        let mut rows = statement.query(params![definition])?;
        if let Some(row) = rows.next()? {
            deleted.definitions += 1;
            deleted.bytes += u64_of(row.get(0)?);
        }
    }
    for run_id in tree {
        super::viewer::mark_deleted(run_id);
    }
    Ok(deleted)
}

/// Blobs no column references (`state verify` reports their count).
pub fn orphaned_blobs(connection: &Connection) -> rusqlite::Result<u64> {
    static SQL: OnceLock<String> = OnceLock::new();
    let sql = SQL.get_or_init(|| {
        format!(
            "SELECT COUNT(*) FROM blobs b WHERE {}",
            unreferenced_sql("b.digest")
        )
    });
    connection.query_row(sql, [], |row| Ok(u64_of(row.get(0)?)))
}

// ---- pages and compaction ----------------------------------------------------

/// The database's page size, page count and free pages.
pub fn page_stats(connection: &Connection) -> rusqlite::Result<PageStats> {
    let pragma = |name: &str| -> rusqlite::Result<u64> {
        connection
            .query_row(&format!("PRAGMA {name}"), [], |row| row.get::<_, i64>(0))
            .map(u64_of)
    };
    Ok(PageStats {
        page_size_bytes: pragma("page_size")?,
        page_count: pragma("page_count")?,
        free_pages: pragma("freelist_count")?,
    })
}

/// Moves every WAL frame into the database file and empties the WAL
/// (outside any transaction; `Store::without_transaction`). `false` when a
/// reader kept it from completing.
pub fn truncate_wal(connection: &Connection) -> rusqlite::Result<bool> {
    connection
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
            row.get::<_, i64>(0)
        })
        .map(|busy| busy == 0)
}

/// `VACUUM`, then a WAL truncation so the file shrinks now (outside any
/// transaction). SQLite rolls a failed `VACUUM` back whole: the database
/// keeps its committed rows and its free pages. The copy `VACUUM` builds
/// goes to a temporary file, not to memory (where the writer keeps its
/// other temporary data): a large database must not be held in RAM.
pub fn vacuum(connection: &Connection) -> rusqlite::Result<()> {
    connection.pragma_update(None, "temp_store", "FILE")?;
    let vacuumed = connection.execute_batch("VACUUM");
    let restored = connection.pragma_update(None, "temp_store", "MEMORY");
    vacuumed?;
    restored?;
    truncate_wal(connection).map(|_| ())
}

#[cfg(test)]
mod tests;
