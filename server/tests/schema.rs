//! The version-1 DDL the server creates: its partial unique indexes refuse a
//! second live row and allow the settled ones (the last line of defence
//! behind the kernel's rules).

mod support;

use rusqlite::Connection;
use support::*;

/// A state file created by a real server, opened for writing with foreign
/// keys off (the rows below need no parents to exercise the indexes).
fn created_state() -> (TestServer, Connection) {
    let mut server = TestServer::start();
    server.stop();
    let db = Connection::open(server.home.join("state.sqlite")).unwrap();
    db.pragma_update(None, "foreign_keys", "OFF").unwrap();
    (server, db)
}

fn refused(db: &Connection, sql: &str) -> bool {
    match db.execute_batch(sql) {
        Err(rusqlite::Error::SqliteFailure(error, _)) => {
            error.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || error.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
        }
        Err(other) => panic!("{sql}: {other}"),
        Ok(()) => false,
    }
}

fn ok(db: &Connection, sql: &str) {
    db.execute_batch(sql)
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

/// One unfinished attempt per run; one queued-or-running reservation per
/// Pi session; one continuation per parent; one live runner epoch per run;
/// one pending step message per interactive request (and none without its
/// content); one deterministic effect key.
#[test]
fn the_partial_unique_indexes_allow_one_live_row_and_any_settled_ones() {
    let (_server, db) = created_state();

    // One active (unfinished) attempt per run.
    let attempt = |id: &str, seq: i64, status: &str, outcome: &str| {
        format!(
            "INSERT INTO node_attempts (run_id, attempt_id, seq, node_id, visit, generation, status, outcome, carried, started_at_ms)
             VALUES ('r1', '{id}', {seq}, 'a', 1, 1, '{status}', {outcome}, 0, 0)"
        )
    };
    ok(&db, &attempt("a1", 1, "finished", "'ok'"));
    ok(&db, &attempt("a2", 2, "abandoned", "NULL"));
    ok(&db, &attempt("a3", 3, "active", "NULL"));
    assert!(refused(&db, &attempt("a4", 4, "active", "NULL")));
    assert!(refused(&db, &attempt("a4", 4, "waiting", "NULL")));

    // One queued or running reservation per Pi session.
    let queue = |run: &str, status: &str, session: &str, parent: &str| {
        format!(
            "INSERT INTO run_queue (run_id, status, origin_session_id, parent_run_id, queued_at_ms, updated_at_ms)
             VALUES ('{run}', '{status}', {session}, {parent}, 0, 0)"
        )
    };
    ok(&db, &queue("q1", "done", "'s1'", "NULL"));
    ok(&db, &queue("q2", "parked", "'s1'", "NULL"));
    ok(&db, &queue("q3", "running", "'s1'", "NULL"));
    assert!(refused(&db, &queue("q4", "queued", "'s1'", "NULL")));
    assert!(refused(&db, &queue("q4", "starting", "'s1'", "NULL")));
    ok(&db, &queue("q4", "queued", "'s2'", "NULL"));
    ok(&db, &queue("q5", "queued", "NULL", "NULL"));
    ok(&db, &queue("q6", "queued", "NULL", "NULL"));
    // One continuation per parent.
    ok(&db, &queue("c1", "queued", "NULL", "'p1'"));
    assert!(refused(&db, &queue("c2", "queued", "NULL", "'p1'")));

    // One live runner epoch per run.
    let worker = |epoch: &str, status: &str, outcome: &str| {
        format!(
            "INSERT INTO run_workers (runner_epoch, run_id, generation, server_epoch, status, outcome, launched_at_ms)
             VALUES ('{epoch}', 'r1', 1, 1, '{status}', {outcome}, 0)"
        )
    };
    ok(&db, &worker("e1", "exited", "'crashed'"));
    ok(&db, &worker("e2", "launching", "NULL"));
    assert!(refused(&db, &worker("e3", "ready", "NULL")));

    // One pending step message per interactive request.
    let message = |id: &str, order: i64, kind: &str, state: &str| {
        format!(
            "INSERT INTO workflow_messages (message_id, session_id, run_id, kind, source_id, step_reason, session_order, state, content_digest, created_at_ms, updated_at_ms)
             VALUES ('{id}', 's1', 'r1', '{kind}', 'int-1', {reason}, {order}, '{state}', zeroblob(32), 0, 0)",
            reason = if kind == "step" { "'initial'" } else { "NULL" }
        )
    };
    ok(&db, &message("m1", 1, "step", "sent"));
    ok(&db, &message("m2", 2, "step", "cancelled"));
    ok(&db, &message("m3", 3, "step", "pending"));
    assert!(refused(&db, &message("m4", 4, "step", "pending")));
    ok(&db, &message("m4", 4, "decision", "pending"));
    // A message is never stored without its content.
    let without_content = db.execute_batch(
        "INSERT INTO workflow_messages (message_id, session_id, run_id, kind, session_order, state, created_at_ms, updated_at_ms)
         VALUES ('m5', 's1', 'r1', 'notification', 5, 'pending', 0, 0)",
    );
    assert!(
        matches!(&without_content, Err(rusqlite::Error::SqliteFailure(error, _))
            if error.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_NOTNULL),
        "{without_content:?}"
    );

    // One deterministic effect key.
    let effect = |id: &str, visit: i64| {
        format!(
            "INSERT INTO effects (effect_id, run_id, effect_type, node_path, visit, request_fingerprint, state, attempt_number, created_at_ms, updated_at_ms)
             VALUES ('{id}', 'r1', 'mail', 'a', {visit}, zeroblob(32), 'applied', 1, 0, 0)"
        )
    };
    ok(&db, &effect("f1", 1));
    assert!(refused(&db, &effect("f2", 1)));
    ok(&db, &effect("f2", 2));
}
