//! The state file the server creates: it appears whole, in WAL mode, synced
//! once before it is linked into place; and the DDL's partial unique indexes
//! refuse a second live row and allow the settled ones (the last line of
//! defence behind the kernel's rules).

mod support;

use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
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

/// The files of a creation that crashed halfway: the start of a database
/// and a journal and a WAL beside it.
fn plant_a_crashed_creation(home: &Path) {
    std::fs::create_dir_all(home).unwrap();
    let mut half = b"SQLite format 3\0".to_vec();
    half.resize(8192, 0xA5);
    std::fs::write(home.join("state.sqlite.creating"), &half).unwrap();
    for suffix in ["-journal", "-wal"] {
        std::fs::write(
            home.join(format!("state.sqlite.creating{suffix}")),
            [0x5A; 4096],
        )
        .unwrap();
    }
}

/// A new `state.sqlite` is whole on its own: a server that dies at its
/// first commit (after the creation, before anything else is written)
/// leaves a main file that is a complete database in WAL mode (header bytes
/// 18 and 19 are 2) without any WAL, passes SQLite's check, holds its
/// identity row, and starts the next server. The files of an earlier
/// creation that crashed are deleted, never taken for the database.
#[test]
fn a_new_state_file_is_whole_in_wal_mode_and_replaces_a_crashed_creation() {
    let mut server = TestServer::new(&[("PI_WORKFLOWS_FAULT", "before_commit:1")]);
    plant_a_crashed_creation(&server.home);
    assert!(
        server.spawn().is_err(),
        "the server dies at its first commit, before its ready line"
    );
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let leftover = server.home.join(format!("state.sqlite.creating{suffix}"));
        assert!(!leftover.exists(), "{} is left", leftover.display());
    }
    let database = server.home.join("state.sqlite");
    let bytes = std::fs::read(&database).unwrap();
    assert_eq!(&bytes[..16], b"SQLite format 3\0");
    assert_eq!((bytes[18], bytes[19]), (2, 2), "WAL mode is in the header");
    let wal = std::fs::metadata(server.home.join("state.sqlite-wal")).map_or(0, |meta| meta.len());
    assert_eq!(wal, 0, "nothing was committed after the creation");
    // The main file alone (opened immutable: no WAL is read) is the database.
    let alone = Connection::open_with_flags(
        format!("file:{}?mode=ro&immutable=1", database.display()),
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
    )
    .unwrap();
    let check: String = alone
        .query_row("PRAGMA quick_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    let name: String = alone
        .query_row(
            "SELECT schema_name FROM schema_meta WHERE singleton = 1",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(name, "pi-workflows-state", "the identity row is there");
    let pages: i64 = alone
        .query_row("PRAGMA page_count", [], |row| row.get(0))
        .unwrap();
    let page_size: i64 = alone
        .query_row("PRAGMA page_size", [], |row| row.get(0))
        .unwrap();
    assert_eq!(
        bytes.len() as i64,
        pages * page_size,
        "the file holds all its pages"
    );
    drop(alone);
    server.remove_env("PI_WORKFLOWS_FAULT");
    server.spawn().expect("the next server starts on it");
    server.stop();
}

/// Creating the state file costs one sync: the new file is written with no
/// journal and no per-page syncs, synced once whole, and only then linked
/// into place (the directory is synced after the link). It is in WAL mode
/// from its header on, so the writer that opens it has nothing to convert:
/// until the ready line, no file of the database but its WAL is synced
/// again. Traced with strace.
#[test]
fn a_new_state_file_is_synced_once_before_it_is_linked_into_place() {
    let strace = ["strace", "/usr/bin/strace"]
        .into_iter()
        .find(|program| Command::new(program).arg("-V").output().is_ok())
        .expect("this test needs strace (scripts/test-all.sh installs it)");
    let mut server = TestServer::new(&[]);
    let trace = server.scratch().join("strace.log");
    let trace_text = trace.to_string_lossy().into_owned();
    server
        .spawn_under(&[
            strace,
            "-f",
            "-qq",
            "-y",
            "-o",
            &trace_text,
            "-e",
            "trace=fsync,fdatasync,sync_file_range,syncfs,link,linkat,rename,renameat,renameat2,write",
            "--",
        ])
        .expect("the traced server starts");
    // Stopped through its socket (a signal would reach strace, not the server).
    let stopped = server.command().args(["server", "stop"]).output().unwrap();
    assert!(stopped.status.success(), "{stopped:?}");
    assert!(
        server.wait_exit(Duration::from_secs(30)),
        "strace ends with the server"
    );
    let log = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| !line.contains(" write(") || line.contains(" write(1<"))
        .collect();
    let shown = lines.join("\n");
    let position = |what: &str, found: &dyn Fn(&str) -> bool| {
        lines
            .iter()
            .position(|line| found(line))
            .unwrap_or_else(|| panic!("no {what} in the trace:\n{shown}"))
    };
    let linked = position("link of the new file", &|line| {
        line.contains("link") && line.contains("state.sqlite.creating")
    });
    let ready = position("ready line", &|line| line.contains("\"ready "));
    let database_syncs = |range: &[&str]| -> Vec<String> {
        range
            .iter()
            .filter(|line| line.contains("sync") && line.contains("/state.sqlite"))
            .map(|line| line.split_once('<').map_or("", |(_, path)| path).to_owned())
            .collect()
    };
    let before_link = database_syncs(&lines[..linked]);
    assert_eq!(
        before_link.len(),
        1,
        "syncs of the database before its link:\n{shown}"
    );
    assert!(
        before_link[0].contains("/state.sqlite.creating>"),
        "the one sync is the new file's:\n{shown}"
    );
    for synced in database_syncs(&lines[linked..ready]) {
        assert!(
            synced.contains("/state.sqlite-wal>"),
            "after the link only the WAL is synced before the ready line:\n{shown}"
        );
    }
    let syncs = lines[..ready]
        .iter()
        .filter(|line| line.contains("sync"))
        .count();
    eprintln!("{syncs} syncs before the ready line:\n{shown}");
}
