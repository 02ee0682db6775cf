use super::*;

fn schema() -> Connection {
    let connection = Connection::open_in_memory().expect("an in-memory database");
    connection
        .execute_batch(crate::store::schema::DDL)
        .expect("the DDL runs");
    connection
}

/// The schema's tables.
fn tables(connection: &Connection) -> Vec<String> {
    connection
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table'")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The columns with a foreign key to `blobs(digest)`.
fn blob_foreign_keys(connection: &Connection) -> Vec<(String, String)> {
    let tables = tables(connection);
    let mut found = Vec::new();
    for table in tables {
        let mut statement = connection
            .prepare("SELECT \"table\", \"from\" FROM pragma_foreign_key_list(?1)")
            .unwrap();
        let rows = statement
            .query_map([&table], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })
            .unwrap();
        for row in rows {
            let (parent, column) = row.unwrap();
            if parent == "blobs" {
                found.push((table.clone(), column));
            }
        }
    }
    found
}

/// Whether some index of `table` starts with `column`.
fn leads_an_index(connection: &Connection, table: &str, column: &str) -> bool {
    let indexes: Vec<String> = connection
        .prepare("SELECT name FROM pragma_index_list(?1)")
        .unwrap()
        .query_map([table], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    indexes.iter().any(|index| {
        connection
            .query_row(
                "SELECT name FROM pragma_index_info(?1) WHERE seqno = 0",
                [index],
                |row| row.get::<_, Option<String>>(0),
            )
            .ok()
            .flatten()
            .as_deref()
            == Some(column)
    })
}

/// Every foreign key to a blob is a listed reference, every listed
/// reference leads an index (so collecting a blob looks each one up), and
/// the consistency check of missing blobs reads every listed column.
#[test]
fn every_blob_reference_is_listed_indexed_and_checked() {
    let connection = schema();
    let listed: Vec<(String, String)> = BLOB_REFERENCES
        .iter()
        .map(|r| (r.table.to_owned(), r.column.to_owned()))
        .collect();
    for foreign_key in blob_foreign_keys(&connection) {
        assert!(
            listed.contains(&foreign_key),
            "{foreign_key:?} refers to blobs but is not in BLOB_REFERENCES"
        );
    }
    let missing_blob = crate::store::consistency::CHECKS
        .iter()
        .find(|check| check.message == "a reference to a blob that does not exist")
        .expect("the missing-blob check");
    for reference in BLOB_REFERENCES {
        assert!(
            leads_an_index(&connection, reference.table, reference.column),
            "{}.{} has no index",
            reference.table,
            reference.column
        );
        assert!(
            missing_blob
                .sql
                .contains(&format!("'{}.{} ", reference.table, reference.column)),
            "the missing-blob check does not read {}.{}",
            reference.table,
            reference.column
        );
    }
}

/// The query plan of `sql`, one line per step.
fn plan(connection: &Connection, sql: &str, params: impl rusqlite::Params) -> Vec<String> {
    let mut statement = connection
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap();
    statement
        .query_map(params, |row| row.get::<_, String>(3))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A step that reads a whole table (not through an index, not the tiny
/// `json_each` list of the tree's members).
fn full_scans(plan: &[String]) -> Vec<&String> {
    plan.iter()
        .filter(|step| {
            step.starts_with("SCAN ")
                && !step.contains("USING")
                && !step.contains("json_each")
                && !step.contains("CONSTANT ROW")
        })
        .collect()
}

/// A tree's deletion costs what the tree holds: no statement of the
/// candidate listing, the tree walk, the selector's facts, the deletion or
/// the collection reads a whole table.
#[test]
fn the_statements_of_a_deletion_use_indexes() {
    let connection = schema();
    connection
        .execute_batch("PRAGMA foreign_keys = ON")
        .unwrap();
    let tree = r#"["a","b"]"#;
    let statements: Vec<(String, Vec<String>)> = vec![
        (
            "due roots".into(),
            plan(
                &connection,
                "SELECT finished_at_ms, run_id FROM runs
                 WHERE continuation_of IS NULL AND restart_root_run_id IS NULL
                   AND finished_at_ms < ?1 AND (finished_at_ms, run_id) > (?2, ?3)
                 ORDER BY finished_at_ms, run_id LIMIT ?4",
                params![1, -1, "", 10],
            ),
        ),
        (
            "candidate blobs".into(),
            plan(&connection, candidate_blobs_sql(), params![tree]),
        ),
        (
            "collect a blob".into(),
            plan(&connection, collect_blob_sql(), params![vec![0u8; 32]]),
        ),
        (
            "run.start receipts".into(),
            plan(
                &connection,
                "DELETE FROM host_commands WHERE operation = 'run.start'
                   AND json_extract(receipt_json, '$.receipt.runId') IN (SELECT value FROM json_each(?1))",
                params![tree],
            ),
        ),
        (
            "run receipts".into(),
            plan(
                &connection,
                "DELETE FROM host_commands WHERE run_id IN (SELECT value FROM json_each(?1))",
                params![tree],
            ),
        ),
        (
            "runner-message receipts".into(),
            plan(
                &connection,
                "DELETE FROM worker_messages WHERE runner_epoch IN
                   (SELECT runner_epoch FROM run_workers WHERE run_id IN (SELECT value FROM json_each(?1)))",
                params![tree],
            ),
        ),
    ];
    for (what, steps) in &statements {
        assert!(
            full_scans(steps).is_empty(),
            "{what} reads a whole table: {steps:?}"
        );
    }
}

/// Deleting a run cascades to every row keyed by it, and deleting a blob,
/// a run or a definition makes SQLite look for rows that still refer to
/// it: every foreign key's column leads an index, so neither reads a whole
/// table. (Projects are never deleted, so nothing looks their runs up.)
#[test]
fn every_foreign_key_leads_an_index() {
    let connection = schema();
    let tables = tables(&connection);
    let mut unindexed = Vec::new();
    for table in &tables {
        let mut statement = connection
            .prepare(
                "SELECT \"from\" FROM pragma_foreign_key_list(?1) WHERE seq = 0 AND \"table\" <> 'projects'",
            )
            .unwrap();
        let columns: Vec<String> = statement
            .query_map([table], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for column in columns {
            let primary_key_leads = connection
                .query_row(
                    "SELECT name FROM pragma_table_info(?1) WHERE pk = 1",
                    [table],
                    |row| row.get::<_, String>(0),
                )
                .ok()
                .as_deref()
                == Some(column.as_str());
            if !primary_key_leads && !leads_an_index(&connection, table, &column) {
                unindexed.push(format!("{table}.{column}"));
            }
        }
    }
    assert!(
        unindexed.is_empty(),
        "foreign keys without an index: {unindexed:?}"
    );
}
