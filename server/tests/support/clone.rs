//! Seeding many runs fast: copies of a real run (made by a real server, so
//! every row is one the server wrote) under new ids, with one `INSERT …
//! SELECT` per table over a generated series; and the checks a state file
//! passes after runs were deleted. Used by the retention and maintenance
//! tests and `benches/retention.rs`.

use rusqlite::{Connection, params};

/// Tables keyed by run id, and (after them) the tables keyed through
/// another id of the run: (table, the condition that picks the template's
/// rows with `?1` the template run id).
const TABLES: &[(&str, &str)] = &[
    ("runs", "t.run_id = ?1"),
    ("run_sources", "t.run_id = ?1"),
    ("run_bindings", "t.run_id = ?1"),
    ("run_queue", "t.run_id = ?1"),
    ("leases", "t.run_id = ?1"),
    ("events", "t.run_id = ?1"),
    ("run_workers", "t.run_id = ?1"),
    (
        "runner_processes",
        "t.runner_epoch IN (SELECT runner_epoch FROM run_workers WHERE run_id = ?1)",
    ),
    (
        "worker_messages",
        "t.runner_epoch IN (SELECT runner_epoch FROM run_workers WHERE run_id = ?1)",
    ),
    ("node_attempts", "t.run_id = ?1"),
    ("effects", "t.run_id = ?1"),
    (
        "effect_attempts",
        "t.effect_id IN (SELECT effect_id FROM effects WHERE run_id = ?1)",
    ),
    ("interactive_requests", "t.run_id = ?1"),
    (
        "interactive_submissions",
        "t.interaction_id IN (SELECT interaction_id FROM interactive_requests WHERE run_id = ?1)",
    ),
    ("human_decisions", "t.run_id = ?1"),
    ("workflow_messages", "t.run_id = ?1"),
    ("workflow_turns", "t.run_id = ?1"),
    ("workflow_updates", "t.run_id = ?1"),
    ("update_receipts", "t.run_id = ?1"),
    ("viewer_runs", "t.run_id = ?1"),
    ("viewer_nodes", "t.run_id = ?1"),
    ("viewer_steps", "t.run_id = ?1"),
    ("viewer_history_refs", "t.run_id = ?1"),
    ("viewer_deltas", "t.run_id = ?1"),
    ("viewer_session_checkpoints", "t.run_id = ?1"),
    ("run_view_content", "t.run_id = ?1"),
    (
        "host_commands",
        "t.run_id = ?1 OR (t.operation = 'run.start' AND json_extract(t.receipt_json, '$.receipt.runId') = ?1)",
    ),
];

/// Ids that are unique across runs: a copy gets the template's with a
/// suffix of its own.
const GLOBAL_IDS: &[&str] = &[
    "runner_epoch",
    "effect_id",
    "interaction_id",
    "submission_id",
    "decision_id",
    "message_id",
    "turn_id",
    "session_id",
    "origin_session_id",
    "source_id",
    "accepted_submission_id",
    "request_id",
    "idempotency_key",
];

fn columns(db: &Connection, table: &str) -> Vec<String> {
    let mut statement = db
        .prepare("SELECT name FROM pragma_table_info(?1)")
        .unwrap();
    statement
        .query_map([table], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The new run id of copy `n.i`.
const NEW_ID: &str = "printf('%s-%06d', ?2, n.i)";
/// The suffix of copy `n.i` for ids unique across runs.
const SUFFIX: &str = "printf('-%s-%06d', ?2, n.i)";

/// Copies the run `template` (a root: no continuation parent, no restart)
/// `copies` times as `<prefix>-000001` … with `finished_at_ms`,
/// `created_at_ms` and `updated_at_ms` set to `at_ms`, in one transaction.
/// The copies share the template's blobs and definition. Returns their ids.
pub fn clone_runs(
    db: &Connection,
    template: &str,
    prefix: &str,
    copies: usize,
    at_ms: u64,
) -> Vec<String> {
    let lineage: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM runs WHERE run_id = ?1
               AND continuation_of IS NULL AND restart_root_run_id IS NULL AND continued_by IS NULL",
            [template],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(
        lineage, 1,
        "the template must be a root run without lineage"
    );
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    for (table, picks) in TABLES {
        let columns = columns(db, table);
        let selected: Vec<String> = columns
            .iter()
            .filter(|column| !(*table == "events" && column.as_str() == "seq"))
            .map(|column| {
                let column = column.as_str();
                match (*table, column) {
                    (_, "run_id") if *table == "host_commands" => {
                        format!("CASE WHEN t.run_id IS NULL THEN NULL ELSE {NEW_ID} END")
                    }
                    (_, "run_id") => NEW_ID.to_owned(),
                    ("host_commands", "receipt_json") => format!(
                        "CASE WHEN t.operation = 'run.start' THEN json_set(t.receipt_json, '$.receipt.runId', {NEW_ID}) ELSE t.receipt_json END"
                    ),
                    ("runs", "finished_at_ms" | "created_at_ms" | "updated_at_ms") => {
                        "?3".to_owned()
                    }
                    ("run_workers", "pid" | "pid_start_identity") => "NULL".to_owned(),
                    (_, id) if GLOBAL_IDS.contains(&id) => format!("t.{id} || {SUFFIX}"),
                    (_, other) => format!("t.{other}"),
                }
            })
            .collect();
        let inserted: Vec<&str> = columns
            .iter()
            .map(String::as_str)
            .filter(|column| !(*table == "events" && *column == "seq"))
            .collect();
        db.execute(
            &format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?4)
                 INSERT INTO {table} ({}) SELECT {} FROM {table} t, n WHERE {picks}",
                inserted.join(", "),
                selected.join(", ")
            ),
            params![template, prefix, at_ms as i64, copies as i64],
        )
        .unwrap_or_else(|error| panic!("clone {table}: {error}"));
    }
    db.execute_batch("COMMIT").unwrap();
    (1..=copies).map(|n| format!("{prefix}-{n:06}")).collect()
}

/// One copy of `template` (see [`clone_runs`]); returns its id.
pub fn clone_run(db: &Connection, template: &str, prefix: &str, at_ms: u64) -> String {
    clone_runs(db, template, prefix, 1, at_ms).remove(0)
}

/// Gives each of `runs` an input blob of its own of `bytes` random bytes
/// (its digest the SHA-256 of its bytes), so collecting them frees space.
pub fn give_own_inputs(db: &Connection, runs: &[String], bytes: usize) {
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    for run in runs {
        let mut value = vec![0u8; bytes];
        getrandom::fill(&mut value).unwrap();
        let digest = server::ids::sha256(&value);
        db.execute(
            "INSERT INTO blobs (digest, media_type, bytes, created_at_ms) VALUES (?1, 'application/octet-stream', ?2, 0)",
            params![digest.0.to_vec(), value],
        )
        .unwrap();
        db.execute(
            "UPDATE runs SET input_digest = ?1 WHERE run_id = ?2",
            params![digest.0.to_vec(), run],
        )
        .unwrap();
    }
    db.execute_batch("COMMIT").unwrap();
}

/// Sets the finish (and update) time of `runs`.
pub fn finish_at(db: &Connection, runs: &[&str], at_ms: u64) {
    for run in runs {
        let changed = db
            .execute(
                "UPDATE runs SET finished_at_ms = ?1, updated_at_ms = ?1 WHERE run_id = ?2",
                params![at_ms as i64, run],
            )
            .unwrap();
        assert_eq!(changed, 1, "no run {run}");
    }
}

/// A read-write connection to a state file (another process may hold it:
/// waits for its locks).
pub fn writable(path: &std::path::Path) -> Connection {
    let db = Connection::open(path).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    db.pragma_update(None, "foreign_keys", "ON").unwrap();
    db
}

/// Every consistency check passes, no foreign key dangles and no blob is
/// orphaned.
pub fn assert_state_clean(db: &Connection) {
    assert_eq!(super::consistency_violations(db), Vec::<String>::new());
    let dangling: i64 = db
        .query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |row| {
            row.get(0)
        })
        .unwrap();
    assert_eq!(dangling, 0, "dangling foreign keys");
    assert_eq!(
        server::store::retention::orphaned_blobs(db).unwrap(),
        0,
        "orphaned blobs"
    );
}

/// Every copy named `<prefix>-…` still has all its events (`events` of
/// them, as its template): a deletion took whole trees or none.
pub fn assert_whole_copies(db: &Connection, prefix: &str, events: i64) {
    let partial: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM runs r WHERE r.run_id LIKE ?1 || '-%' AND
               (SELECT COUNT(*) FROM events e WHERE e.run_id = r.run_id) <> ?2",
            params![prefix, events],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(partial, 0, "a kept tree lost rows");
    assert_state_clean(db);
}
