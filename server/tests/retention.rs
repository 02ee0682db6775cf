//! State retention (the seed's "State retention" and recovery step 12): the
//! automatic sweep of a real server over a real state file.
//!
//! Runs are made by a real server (scripted runner), then aged by setting
//! their finish time while the server is stopped (or, where a test needs a
//! running server, through a second connection: SQLite serializes the
//! writes). Many old runs are copies of a real run (`support::clone`).
//! After each sweep the state file passes every consistency check, has no
//! dangling foreign key and no orphaned blob.

mod support;

use pi_workflows_client::{ClientOptions, Delivery, Home, RequestSpec, WorkflowClient};
use protocol::generated::types::{ClientEvent, SubscriptionTarget};
use rusqlite::Connection;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use support::*;

const DAY_MS: u64 = 24 * 60 * 60 * 1000;

fn now_ms() -> u64 {
    server::clock::now_ms()
}

fn days_ago(days: u64) -> u64 {
    now_ms() - days * DAY_MS
}

/// The server's log (stderr, appended across restarts).
fn log(server: &TestServer) -> String {
    std::fs::read_to_string(server.scratch().join("server.stderr")).unwrap_or_default()
}

/// How many times the log says a sweep completed.
fn sweeps(server: &TestServer) -> usize {
    log(server).matches("state retention: deleted").count()
}

/// Waits until the log reports `count` completed sweeps (the log keeps
/// the lines of every server process of the test).
async fn wait_sweeps(server: &TestServer, count: usize) {
    wait_for(Duration::from_secs(60), "the retention sweep", || {
        (sweeps(server) >= count).then_some(())
    })
    .await;
}

/// Starts the server and waits for its startup sweep.
async fn spawn_and_sweep(server: &mut TestServer) {
    let before = sweeps(server);
    server.spawn().unwrap();
    wait_sweeps(server, before + 1).await;
}

/// Whether `run` exists.
fn exists(db: &Connection, run: &str) -> bool {
    count(db, "SELECT COUNT(*) FROM runs WHERE run_id = ?1", [run]) == 1
}

fn runs_named(db: &Connection, prefix: &str) -> i64 {
    count(
        db,
        "SELECT COUNT(*) FROM runs WHERE run_id LIKE ?1 || '%'",
        [prefix],
    )
}

/// A linear workflow of three compute nodes, one with a workflow update.
fn linear(dir: &Path) -> std::path::PathBuf {
    write_script(
        dir,
        "linear.json",
        &json!({
            "workflowName": "linear",
            "topology": linear_topology(&["a", "b", "c"]),
            "nodes": {"b": [{"update": {"type": "progress", "key": "k", "data": {"n": 1}}}]},
        }),
    )
}

/// Starts `script` and waits until it settled; returns its id.
async fn settled_run(client: &mut pi_workflows_client::Connection, script: &Path) -> String {
    let run = started(client, script).await;
    wait_settled(client, &run).await;
    run
}

/// Sends a command; it must be accepted. Returns the receipt.
async fn accepted(
    client: &mut pi_workflows_client::Connection,
    operation: &str,
    run: &str,
    payload: Value,
) -> Value {
    let response = client
        .request(&RequestSpec::command(operation, Some(run), payload))
        .await
        .expect(operation);
    assert_eq!(
        response.outcome, "accepted",
        "{operation}: {:?}",
        response.frame
    );
    response.receipt.unwrap_or(Value::Null)
}

/// A completed template run, made by the server, with the server stopped
/// afterwards.
async fn template(server: &mut TestServer) -> String {
    let script = linear(server.scratch());
    let mut client = server.client().await;
    let run = settled_run(&mut client, &script).await;
    drop(client);
    wait_quiescent_at(server).await;
    server.stop();
    run
}

/// The names in the state home (the socket, logs and the WAL's files aside).
fn home_files(server: &TestServer) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(&server.home)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| {
            !(name.ends_with(".sock")
                || name.ends_with("-wal")
                || name.ends_with("-shm")
                || name == "host")
        })
        .collect();
    names.sort();
    names
}

/// A run that waits in node `a` until `release` exists in its directory.
fn held(dir: &Path, name: &str) -> std::path::PathBuf {
    write_script(
        dir,
        &format!("{name}.json"),
        &json!({
            "workflowName": name,
            "topology": linear_topology(&["a", "b"]),
            "nodes": {"a": [{"awaitFile": format!("{name}.release"), "then": {"finish": {"held": true}}}]},
        }),
    )
}

/// Starts a [`held`] run and waits until it runs its node `a`.
async fn start_held(client: &mut pi_workflows_client::Connection, script: &Path) -> String {
    let run = started(client, script).await;
    wait_view(client, &run, Duration::from_secs(20), |view| {
        view["display"]["currentNode"] == "a"
    })
    .await;
    run
}

fn release(dir: &Path, name: &str) {
    std::fs::write(dir.join(format!("{name}.release")), b"go").unwrap();
}

// ---- the selector ------------------------------------------------------------

/// Only complete terminal trees older than 30 days and free of protected
/// work expire; a tree goes whole (its continuation and its restart with
/// it); deleted runs disappear from the run list and direct views; the
/// sweep writes no backup; the state stays consistent and no blob is left
/// without a reference or collected while referenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_complete_old_unprotected_trees_expire_whole() {
    let mut server = TestServer::start();
    let dir = server.scratch().to_path_buf();
    let linear = linear(&dir);
    let failing = write_script(
        &dir,
        "failing.json",
        &json!({"workflowName": "failing", "topology": linear_topology(&["a"]), "nodes": {"a": [{"fail": "boom"}]}}),
    );
    let ambiguous = write_script(
        &dir,
        "ambiguous.json",
        &json!({"workflowName": "ambiguous", "topology": {
            "startAt": "a", "nodes": [{"id": "a", "nodeType": "action", "timeout": {"kind": "default"}, "mountPath": []}],
            "edges": [], "mounts": []},
            "nodes": {"a": [{"effect": {"type": "mail.send", "request": {"to": "x"}}, "crashWhileApplying": true}]}}),
    );
    let mut client = server.client().await;
    // Expire: an old completed run.
    let old = settled_run(&mut client, &linear).await;
    // Keep: a young completed run (it shares the old run's input blob).
    let young = settled_run(&mut client, &linear).await;
    // Keep: a run waiting at its checkpoint (not terminal).
    let waiting = settled_run(&mut client, &script("checkpoint.json")).await;
    // Expire whole: an answered checkpoint and its continuation, both old.
    let parent = settled_run(&mut client, &script("checkpoint.json")).await;
    let receipt = accepted(
        &mut client,
        "checkpoint.answer",
        &parent,
        json!({"answer": {"ok": true}}),
    )
    .await;
    let child = receipt["continuationRunId"].as_str().unwrap().to_owned();
    wait_settled(&mut client, &child).await;
    // Keep whole: an old parent whose continuation is young.
    let young_parent = settled_run(&mut client, &script("checkpoint.json")).await;
    let receipt = accepted(
        &mut client,
        "checkpoint.answer",
        &young_parent,
        json!({"answer": {"ok": true}}),
    )
    .await;
    let young_child = receipt["continuationRunId"].as_str().unwrap().to_owned();
    wait_settled(&mut client, &young_child).await;
    // Expire whole: a failed run and its restart, both old.
    let failed = settled_run(&mut client, &failing).await;
    let receipt = accepted(&mut client, "run.restart", &failed, json!({})).await;
    let restart = receipt["newRunId"].as_str().unwrap().to_owned();
    wait_settled(&mut client, &restart).await;
    // Keep: a cancelled run whose effect is ambiguous (unsettled).
    let unsettled = started(&mut client, &ambiguous).await;
    wait_view(&mut client, &unsettled, Duration::from_secs(20), |view| {
        status(view) == "ambiguous"
    })
    .await;
    accepted(&mut client, "run.cancel", &unsettled, json!({})).await;
    wait_settled(&mut client, &unsettled).await;
    drop(client);
    wait_quiescent_at(&server).await;
    server.stop();

    {
        let db = writable(&server.home.join("state.sqlite"));
        let old_runs = [
            old.as_str(),
            parent.as_str(),
            child.as_str(),
            young_parent.as_str(),
            failed.as_str(),
            restart.as_str(),
            unsettled.as_str(),
        ];
        finish_at(&db, &old_runs, days_ago(31));
        // The waiting run is old too, but it never finished.
        db.execute(
            "UPDATE runs SET created_at_ms = ?1, updated_at_ms = ?1 WHERE run_id = ?2",
            rusqlite::params![days_ago(40) as i64, waiting],
        )
        .unwrap();
        finish_at(&db, &[young.as_str(), young_child.as_str()], days_ago(29));
    }
    let files = home_files(&server);
    spawn_and_sweep(&mut server).await;

    let db = server.db();
    for run in [&old, &parent, &child, &failed, &restart] {
        assert!(!exists(&db, run), "{run} should have expired");
    }
    for run in [&young, &waiting, &young_parent, &young_child, &unsettled] {
        assert!(exists(&db, run), "{run} should be kept");
    }
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM runs", []),
        5,
        "the kept runs and no other"
    );
    for run in [&old, &parent, &child, &failed, &restart] {
        for sql in [
            "SELECT COUNT(*) FROM events WHERE run_id = ?1",
            "SELECT COUNT(*) FROM host_commands WHERE run_id = ?1 OR json_extract(receipt_json, '$.receipt.runId') = ?1",
            "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1",
            "SELECT COUNT(*) FROM viewer_steps WHERE run_id = ?1",
            "SELECT COUNT(*) FROM run_view_content WHERE run_id = ?1",
            "SELECT COUNT(*) FROM worker_messages m WHERE m.runner_epoch LIKE 're-%'
               AND NOT EXISTS (SELECT 1 FROM run_workers w WHERE w.runner_epoch = m.runner_epoch)
               AND ?1 = ?1",
        ] {
            assert_eq!(count(&db, sql, [run]), 0, "{sql} for {run}");
        }
    }
    assert_state_clean(&db);
    assert_eq!(home_files(&server), files, "the sweep wrote no backup");
    assert!(
        log(&server).contains("state retention: deleted 3 run trees (5 runs"),
        "{}",
        log(&server)
    );

    // Deleted runs are gone from the list and from direct views.
    let mut client = server.client().await;
    let list = client
        .request(&RequestSpec::read("runs.list", None, json!({"limit": 100})))
        .await
        .unwrap();
    let listed: Vec<&str> = list.receipt.as_ref().unwrap()["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["runId"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 5, "{listed:?}");
    assert!(!listed.contains(&old.as_str()));
    let view = client
        .request(&RequestSpec::read("run.view", Some(&old), json!({})))
        .await
        .unwrap();
    assert_eq!(view.outcome, "notFound", "{:?}", view.frame);
    let subscribe = client
        .request(&RequestSpec::read(
            "subscribe",
            None,
            json!({"target": {"kind": "run", "runId": old}}),
        ))
        .await
        .unwrap();
    assert_eq!(subscribe.outcome, "notFound", "{:?}", subscribe.frame);
}

/// A blob another tree still uses is never collected, and every blob only
/// the deleted trees used is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_collected_only_when_nothing_refers_to_them() {
    let mut server = TestServer::start();
    let template = template(&mut server).await;
    let (old, shared_with_young) = {
        let db = writable(&server.home.join("state.sqlite"));
        let old = clone_runs(&db, &template, "old", 6, days_ago(40));
        give_own_inputs(&db, &old, 64 * 1024);
        let young = clone_run(&db, &template, "young", days_ago(1));
        // The young run uses the first old run's input.
        db.execute(
            "UPDATE runs SET input_digest = (SELECT input_digest FROM runs WHERE run_id = ?1) WHERE run_id = ?2",
            [&old[0], &young],
        )
        .unwrap();
        let shared: Vec<u8> = db
            .query_row(
                "SELECT input_digest FROM runs WHERE run_id = ?1",
                [&old[0]],
                |row| row.get(0),
            )
            .unwrap();
        (old, shared)
    };
    spawn_and_sweep(&mut server).await;
    let db = server.db();
    assert_eq!(runs_named(&db, "old-"), 0);
    assert_eq!(runs_named(&db, "young-"), 1);
    assert!(exists(&db, &template), "the template is young");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM blobs WHERE digest = ?1",
            [&shared_with_young]
        ),
        1,
        "the blob the young run still uses is kept"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM blobs WHERE length(bytes) = 65536",
            []
        ),
        1,
        "the other {} own inputs are collected",
        old.len() - 1
    );
    assert_state_clean(&db);
    assert!(
        log(&server).contains("state retention: deleted 6 run trees (6 runs, 5 blobs"),
        "{}",
        log(&server)
    );
}

// ---- when the sweep runs -------------------------------------------------------

/// Recovery step 12: the startup sweep waits until recovered work is idle
/// (a drained run that resumes keeps it from starting); the runner's exit
/// starts it. After that completed sweep, a runner exit does not start
/// another in the same process within 24 hours; the next process does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_waits_for_recovered_work_runs_after_a_runner_exit_and_once_a_day() {
    let mut server = TestServer::start();
    let dir = server.scratch().to_path_buf();
    let hold = held(&dir, "hold");
    let linear = linear(&dir);
    let mut client = server.client().await;
    let template = settled_run(&mut client, &linear).await;
    let holding = start_held(&mut client, &hold).await;
    drop(client);
    // A graceful stop parks the held run `drained`: recovery resumes it.
    server.stop();
    {
        let db = writable(&server.home.join("state.sqlite"));
        clone_runs(&db, &template, "first", 3, days_ago(31));
    }
    let base = sweeps(&server);
    server.spawn().unwrap();
    let db = server.db();
    wait_for(Duration::from_secs(20), "the held run to resume", || {
        (count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1 AND status = 'ready'",
            [&holding],
        ) == 1)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs_named(&db, "first-"), 3, "no sweep while work runs");
    assert_eq!(sweeps(&server), base);
    release(&dir, "hold");
    wait_sweeps(&server, base + 1).await;
    assert_eq!(runs_named(&db, "first-"), 0, "the runner's exit started it");
    assert!(exists(&db, &holding));

    // A second old tree appears; a runner exits; no second sweep today.
    {
        let db = writable(&server.home.join("state.sqlite"));
        clone_runs(&db, &template, "second", 2, days_ago(31));
    }
    let mut client = server.client().await;
    settled_run(&mut client, &linear).await;
    drop(client);
    wait_quiescent(&db).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(runs_named(&db, "second-"), 2, "at most one sweep a day");
    assert_eq!(sweeps(&server), base + 1);
    assert_state_clean(&db);

    // The next server process sweeps at startup.
    server.stop();
    spawn_and_sweep(&mut server).await;
    assert_eq!(runs_named(&db, "second-"), 0);
    assert_state_clean(&db);
}

/// New work stops the sweep between trees (every tree is whole or gone
/// meanwhile, and none goes while the work runs); the next idle trigger
/// continues it until every old tree is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_work_stops_the_sweep_between_trees_and_the_next_idle_trigger_continues() {
    let mut server = TestServer::start();
    let dir = server.scratch().to_path_buf();
    let template = template(&mut server).await;
    let trees = 3000;
    {
        let db = writable(&server.home.join("state.sqlite"));
        clone_runs(&db, &template, "old", trees, days_ago(31));
    }
    let hold = held(&dir, "hold");
    let base = sweeps(&server);
    server.spawn().unwrap();
    let mut client = server.client().await;
    let holding = started(&mut client, &hold).await;
    let db = server.db();
    wait_for(
        Duration::from_secs(30),
        "the sweep to stop for the new run",
        || {
            log(&server)
                .contains(
                    "state retention: new work started, so the sweep stopped between run trees",
                )
                .then_some(())
        },
    )
    .await;
    let left = runs_named(&db, "old-");
    assert!(
        left > 0 && left < trees as i64,
        "the sweep started, then stopped: {left} of {trees} trees left"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        runs_named(&db, "old-"),
        left,
        "nothing goes while work runs"
    );
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
    release(&dir, "hold");
    wait_sweeps(&server, base + 1).await;
    assert_eq!(runs_named(&db, "old-"), 0);
    assert!(exists(&db, &holding) && exists(&db, &template));
    wait_quiescent(&db).await;
    assert_state_clean(&db);
    drop(client);
}

/// A failed sweep logs one line, fails no workflow, keeps the server
/// serving, and waits five minutes before the next attempt: a runner exit
/// meanwhile does not start one. The next process's sweep finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sweep_logs_one_line_and_waits_before_it_tries_again() {
    let mut server = TestServer::start();
    let template = template(&mut server).await;
    {
        let db = writable(&server.home.join("state.sqlite"));
        clone_runs(&db, &template, "old", 4, days_ago(31));
    }
    server.set_env("PI_WORKFLOWS_FAULT", "tree_error:3");
    let lines_before = log(&server).matches("state retention:").count();
    server.spawn().unwrap();
    wait_for(Duration::from_secs(20), "the failure line", || {
        log(&server)
            .contains("state retention: the sweep failed")
            .then_some(())
    })
    .await;
    let db = server.db();
    assert_eq!(
        runs_named(&db, "old-"),
        2,
        "two trees went whole before the failure"
    );
    assert_eq!(
        log(&server).matches("state retention:").count(),
        lines_before + 1,
        "one bounded line: {}",
        log(&server)
    );
    // Workflows run on; a runner exit does not start a sweep within five minutes.
    let mut client = server.client().await;
    let run = settled_run(&mut client, &linear(server.scratch())).await;
    assert_eq!(status(&view(&mut client, &run).await), "completed");
    wait_quiescent(&db).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(runs_named(&db, "old-"), 2);
    assert_state_clean(&db);
    drop(client);
    server.stop();
    server.remove_env("PI_WORKFLOWS_FAULT");
    spawn_and_sweep(&mut server).await;
    assert_eq!(runs_named(&db, "old-"), 0);
    assert_state_clean(&db);
}

// ---- crashes -------------------------------------------------------------------

/// Old trees that share blobs with each other and with a young run.
fn seed_shared(server: &TestServer, template: &str, trees: usize) -> Vec<u8> {
    let db = writable(&server.home.join("state.sqlite"));
    let old = clone_runs(&db, template, "old", trees, days_ago(31));
    give_own_inputs(&db, &old, 4096);
    // Pairs of old trees share an input; the last one shares with a young run.
    for pair in old.chunks(2) {
        if let [first, second] = pair {
            db.execute(
                "UPDATE runs SET input_digest = (SELECT input_digest FROM runs WHERE run_id = ?1) WHERE run_id = ?2",
                [first, second],
            )
            .unwrap();
        }
    }
    db.execute(
        "DELETE FROM blobs WHERE length(bytes) = 4096 AND digest NOT IN (SELECT input_digest FROM runs)",
        [],
    )
    .unwrap();
    let young = clone_run(&db, template, "young", days_ago(1));
    db.execute(
        "UPDATE runs SET input_digest = (SELECT input_digest FROM runs WHERE run_id = ?1) WHERE run_id = ?2",
        [old.last().unwrap(), &young],
    )
    .unwrap();
    db.query_row(
        "SELECT input_digest FROM runs WHERE run_id = ?1",
        [&young],
        |row| row.get(0),
    )
    .unwrap()
}

async fn crash_in_a_sweep(fault: &str, gone_at_crash: i64) {
    let mut server = TestServer::start();
    let template = template(&mut server).await;
    let events = count(
        &server.db(),
        "SELECT COUNT(*) FROM events WHERE run_id = ?1",
        [&template],
    );
    let trees = 6;
    let shared = seed_shared(&server, &template, trees);
    server.set_env("PI_WORKFLOWS_FAULT", fault);
    server.spawn().unwrap();
    assert!(
        server.wait_exit(Duration::from_secs(30)),
        "the fault {fault} killed the server"
    );
    {
        let db = server.db();
        assert_eq!(
            runs_named(&db, "old-"),
            trees as i64 - gone_at_crash,
            "{fault}: trees gone at the crash"
        );
        assert_whole_copies(&db, "old", events);
    }
    server.remove_env("PI_WORKFLOWS_FAULT");
    spawn_and_sweep(&mut server).await;
    let db = server.db();
    assert_eq!(runs_named(&db, "old-"), 0);
    assert_eq!(runs_named(&db, "young-"), 1);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM blobs WHERE digest = ?1",
            [&shared]
        ),
        1,
        "the blob a young run shares survives"
    );
    assert_state_clean(&db);
}

/// A SIGKILL inside the third tree's deletion transaction: two trees are
/// gone, the third is whole (its transaction never committed), and the next
/// server finishes the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_inside_a_tree_transaction_leaves_that_tree_whole() {
    crash_in_a_sweep("tree_deleted:3", 2).await;
}

/// A SIGKILL between the third and the fourth tree: three trees are gone
/// whole, with their blobs, and the next server finishes the sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_trees_leaves_whole_trees_and_the_next_server_finishes() {
    crash_in_a_sweep("tree_committed:3", 3).await;
}

// ---- compaction -------------------------------------------------------------

fn file_bytes(server: &TestServer) -> u64 {
    std::fs::metadata(server.home.join("state.sqlite"))
        .unwrap()
        .len()
}

fn free_pages(db: &Connection) -> i64 {
    count(db, "PRAGMA freelist_count", [])
}

/// With less than 64 MiB reclaimable the sweep deletes but does not
/// compact: the file keeps its size, the freed pages stay free, and new
/// runs reuse them instead of growing the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freed_pages_are_reused_when_compaction_is_skipped() {
    let mut server = TestServer::start();
    let template = template(&mut server).await;
    {
        let db = writable(&server.home.join("state.sqlite"));
        let old = clone_runs(&db, &template, "old", 40, days_ago(31));
        give_own_inputs(&db, &old, 64 * 1024);
        db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    }
    let before = file_bytes(&server);
    spawn_and_sweep(&mut server).await;
    assert!(
        log(&server).contains("VACUUM skipped (less than 64 MiB reclaimable)"),
        "{}",
        log(&server)
    );
    let db = server.db();
    assert_eq!(runs_named(&db, "old-"), 0);
    let free = free_pages(&db);
    assert!(free > 500, "the deleted rows' pages are free: {free}");
    assert_eq!(file_bytes(&server), before, "the file is not compacted");
    // New work reuses the free pages (three different 200 KB outputs).
    let mut client = server.client().await;
    for pad in ["x", "y", "z"] {
        let script = write_script(
            server.scratch(),
            &format!("fat-{pad}.json"),
            &json!({"workflowName": "fat", "topology": linear_topology(&["a"]),
                    "nodes": {"a": [{"finish": {"pad": pad.repeat(200_000)}}]}}),
        );
        settled_run(&mut client, &script).await;
    }
    drop(client);
    wait_quiescent(&db).await;
    let checkpoint = writable(&server.home.join("state.sqlite"));
    checkpoint
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    drop(checkpoint);
    assert!(free_pages(&db) < free - 100, "new rows took free pages");
    assert_eq!(file_bytes(&server), before, "and the file did not grow");
    assert_state_clean(&db);
}

/// With at least 64 MiB reclaimable and a fifth of the pages free, the idle
/// server compacts after the sweep: the file shrinks and no page is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sweep_compacts_with_64_mib_reclaimable_and_a_fifth_of_the_pages_free() {
    let mut server = TestServer::start();
    let template = template(&mut server).await;
    {
        let db = writable(&server.home.join("state.sqlite"));
        let old = clone_runs(&db, &template, "old", 70, days_ago(31));
        give_own_inputs(&db, &old, 1024 * 1024);
        db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    }
    let before = file_bytes(&server);
    assert!(before > 70 * 1024 * 1024, "{before}");
    spawn_and_sweep(&mut server).await;
    assert!(log(&server).contains("VACUUM ran"), "{}", log(&server));
    let db = server.db();
    assert_eq!(runs_named(&db, "old-"), 0);
    assert_eq!(free_pages(&db), 0);
    let after = file_bytes(&server);
    assert!(
        after < 8 * 1024 * 1024,
        "compacted to {after} bytes from {before}"
    );
    assert_state_clean(&db);
}

/// A VACUUM that fails on a full disk leaves the committed deletions and
/// the free pages: the server keeps serving, and a new run completes in
/// the freed pages on the full disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_compaction_keeps_the_deletions_and_the_reusable_pages() {
    const NAME: &str = "a_failed_compaction_keeps_the_deletions_and_the_reusable_pages";
    if !in_private_namespace(NAME) {
        return;
    }
    let mut server = TestServer::new(&[]);
    mount_tmpfs(&server.home, "400m");
    server.spawn().unwrap();
    let template = template(&mut server).await;
    {
        let db = writable(&server.home.join("state.sqlite"));
        // 45 MiB that stays (young), 70 MiB that goes.
        let young = clone_runs(&db, &template, "young", 45, days_ago(1));
        give_own_inputs(&db, &young, 1024 * 1024);
        let old = clone_runs(&db, &template, "old", 70, days_ago(31));
        give_own_inputs(&db, &old, 1024 * 1024);
        db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    }
    // Leave about 20 MiB: enough to start, too little for VACUUM to
    // rewrite the 45 MiB that stays.
    let filler = server.home.join("filler");
    let free = nix::sys::statvfs::statvfs(&server.home).unwrap();
    let free_bytes = free.blocks_available() * free.fragment_size();
    std::fs::write(&filler, vec![0u8; (free_bytes - 20 * 1024 * 1024) as usize]).unwrap();
    let before = file_bytes(&server);
    spawn_and_sweep(&mut server).await;
    assert!(log(&server).contains("VACUUM failed"), "{}", log(&server));
    let db = server.db();
    assert_eq!(runs_named(&db, "old-"), 0, "the deletions are committed");
    assert_eq!(runs_named(&db, "young-"), 45);
    assert!(free_pages(&db) > 60 * 256, "the freed pages are free");
    assert_eq!(file_bytes(&server), before);
    let mut client = server.client().await;
    let run = settled_run(&mut client, &linear(server.scratch())).await;
    assert_eq!(status(&view(&mut client, &run).await), "completed");
    drop(client);
    wait_quiescent(&db).await;
    assert!(server.is_running());
    assert_state_clean(&db);
}

// ---- clients -------------------------------------------------------------------

/// Live subscribers see a deletion: a run-list subscriber gets a snapshot
/// without the deleted runs, and a subscriber of a deleted run is told it
/// is gone (`availability: unavailable`, `notFound: …`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_subscribers_see_deleted_runs_go() {
    let mut server = TestServer::start();
    let dir = server.scratch().to_path_buf();
    let hold = held(&dir, "hold");
    let mut client = server.client().await;
    let template = settled_run(&mut client, &linear(&dir)).await;
    start_held(&mut client, &hold).await;
    drop(client);
    server.stop();
    let old = {
        let db = writable(&server.home.join("state.sqlite"));
        clone_runs(&db, &template, "old", 3, days_ago(31))
    };
    let base = sweeps(&server);
    server.spawn().unwrap();
    let mut options = ClientOptions::new(Home::at(&server.home));
    options.answer_limit = Some(Duration::from_secs(10));
    let mut watcher = WorkflowClient::new(options);
    let list = watcher
        .subscribe(&SubscriptionTarget::RunList, None)
        .await
        .unwrap();
    let run = watcher
        .subscribe(
            &SubscriptionTarget::Run {
                run_id: old[0].parse().unwrap(),
            },
            None,
        )
        .await
        .unwrap();
    // The sweep waits for the held run; let it go.
    release(&dir, "hold");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut list_without_old = false;
    let mut run_gone = None;
    while !(list_without_old && run_gone.is_some()) {
        assert!(
            Instant::now() < deadline,
            "no deletion reached the subscribers"
        );
        let delivery = tokio::time::timeout(Duration::from_secs(30), watcher.next_event())
            .await
            .expect("an event")
            .expect("a delivery");
        match delivery {
            Delivery::Event {
                subscription,
                event: ClientEvent::RunListSnapshot { rows, .. },
                ..
            } if subscription == list => {
                let ids: Vec<String> = rows.iter().map(|row| row.run_id.to_string()).collect();
                list_without_old =
                    !ids.iter().any(|id| id.starts_with("old-")) && ids.contains(&template);
            }
            Delivery::Event {
                subscription,
                event: ClientEvent::Availability { state, reason },
                ..
            } if subscription == run => run_gone = Some((state, reason)),
            _ => {}
        }
    }
    let (state, reason) = run_gone.unwrap();
    assert_eq!(state, protocol::generated::types::Availability::Unavailable);
    assert!(
        reason.is_some_and(|reason| reason.starts_with("notFound:")),
        "the reason says the run is gone"
    );
    wait_sweeps(&server, base + 1).await;
}

/// Retained runs keep their behaviour after a sweep deleted others: a
/// paused run resumes and completes, its view and its content references
/// read back verified, and a completed run keeps its terminal result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_runs_keep_resume_viewer_content_and_terminal_results() {
    let mut server = TestServer::start();
    let dir = server.scratch().to_path_buf();
    let hold = held(&dir, "paused");
    let mut client = server.client().await;
    let done = settled_run(&mut client, &linear(&dir)).await;
    let paused = start_held(&mut client, &hold).await;
    accepted(&mut client, "run.pause", &paused, json!({})).await;
    wait_view(&mut client, &paused, Duration::from_secs(20), |view| {
        status(view) == "paused"
    })
    .await;
    let done_view = view(&mut client, &done).await;
    drop(client);
    wait_quiescent_at(&server).await;
    server.stop();
    {
        let db = writable(&server.home.join("state.sqlite"));
        clone_runs(&db, &done, "old", 5, days_ago(31));
        // Both retained runs are old; the paused one is protected (parked),
        // the completed one is younger than 30 days.
        finish_at(&db, &[done.as_str()], days_ago(20));
        db.execute(
            "UPDATE runs SET created_at_ms = ?1 WHERE run_id = ?2",
            rusqlite::params![days_ago(60) as i64, paused],
        )
        .unwrap();
    }
    spawn_and_sweep(&mut server).await;
    let db = server.db();
    assert_eq!(runs_named(&db, "old-"), 0);
    let mut client = server.client().await;
    // Terminal result and viewer: the same view as before the sweep.
    let after = view(&mut client, &done).await;
    assert_eq!(status(&after), "completed");
    assert_eq!(after["status"], done_view["status"]);
    assert_eq!(after["nodes"], done_view["nodes"], "the same node results");
    // Content references still read back verified.
    let reference = after["definition"].clone();
    assert!(reference.is_object(), "a definition reference: {after}");
    let mut reader = WorkflowClient::new(ClientOptions::new(Home::at(&server.home)));
    let bytes = reader
        .read_content(&done, &serde_json::from_value(reference).unwrap())
        .await
        .expect("the referenced definition reads back verified");
    assert!(!bytes.is_empty());
    // Resume.
    release(&dir, "paused");
    accepted(&mut client, "run.resume", &paused, json!({})).await;
    let resumed = wait_settled(&mut client, &paused).await;
    assert_eq!(status(&resumed), "completed", "{resumed}");
    drop(client);
    wait_quiescent(&db).await;
    assert_state_clean(&db);
}

/// A result over one frame that every rerun reads again (an adopted
/// effect's result, sent to each new runner as a content reference) is
/// stored once, not once per reply; the replies refer to it by digest, and
/// it is collected with its tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_read_by_every_rerun_is_stored_once_and_collected_with_its_tree() {
    let mut server = TestServer::start();
    let script = write_script(
        server.scratch(),
        "big-effect.json",
        &json!({
            "workflowName": "big-effect",
            "topology": linear_topology(&["send", "done"]),
            "nodes": { "send": [{
                "effect": { "type": "big.send", "request": { "to": "x" }, "applyLog": "apply.log",
                            "padSettleFrameTo": 1024 * 1024 - 16 },
                "then": { "crashOnce": "first.marker",
                          "then": { "crashOnce": "second.marker", "then": { "finish": { "sent": true } } } },
            }] },
        }),
    );
    let mut client = server.client().await;
    let run = started(&mut client, &script).await;
    // The second crash made no progress (its runner only adopted the
    // result), so the run waits for an explicit resume.
    wait_view(&mut client, &run, Duration::from_secs(60), |view| {
        view["display"]["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("before the run made progress"))
    })
    .await;
    accepted(&mut client, "run.resume", &run, json!({})).await;
    wait_view(&mut client, &run, Duration::from_secs(60), |view| {
        status(view) == "completed"
    })
    .await;
    drop(client);
    wait_quiescent_at(&server).await;
    let db = server.db();
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
            [&run]
        ),
        3,
        "two runners crashed after the effect settled, the third finished"
    );
    let referring = count(
        &db,
        "SELECT COUNT(*) FROM worker_messages m JOIN run_workers w USING (runner_epoch)
         WHERE w.run_id = ?1 AND m.content_digest IS NOT NULL",
        [&run],
    );
    assert_eq!(
        referring, 2,
        "each rerun's reply refers to the stored result"
    );
    let distinct = count(
        &db,
        "SELECT COUNT(DISTINCT m.content_digest) FROM worker_messages m JOIN run_workers w USING (runner_epoch)
         WHERE w.run_id = ?1",
        [&run],
    );
    assert_eq!(distinct, 1, "the same result, once");
    let large = count(
        &db,
        "SELECT COUNT(*) FROM blobs WHERE length(bytes) > 900 * 1024",
        [],
    );
    assert!(
        large <= 2,
        "the result and the reply result, not one per rerun: {large}"
    );
    assert_state_clean(&db);
    server.stop();
    {
        let db = writable(&server.home.join("state.sqlite"));
        finish_at(&db, &[run.as_str()], days_ago(31));
    }
    spawn_and_sweep(&mut server).await;
    let db = server.db();
    assert_eq!(count(&db, "SELECT COUNT(*) FROM runs", []), 0);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM blobs WHERE length(bytes) > 900 * 1024",
            []
        ),
        0,
        "the large values went with their tree"
    );
    assert_state_clean(&db);
}

/// A running sweep keeps an otherwise idle server alive: with a short idle
/// exit and no client, the server exits only after the sweep finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_sweep_keeps_the_server_from_idling_out() {
    let mut server = TestServer::start();
    let template = template(&mut server).await;
    {
        let db = writable(&server.home.join("state.sqlite"));
        clone_runs(&db, &template, "old", 600, days_ago(31));
    }
    server.set_env("PI_WORKFLOWS_IDLE_EXIT_MS", "300");
    let before = sweeps(&server);
    server.spawn().unwrap();
    assert!(
        server.wait_exit(Duration::from_secs(120)),
        "the idle server exits in the end"
    );
    assert_eq!(sweeps(&server), before + 1, "it finished its sweep first");
    let db = server.db();
    assert_eq!(runs_named(&db, "old-"), 0);
    assert_state_clean(&db);
}
