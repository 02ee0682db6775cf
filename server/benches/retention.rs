//! State retention benchmark (issue 18, item 5): figures, not a timed test.
//!
//! Run: `cargo bench -p server --bench retention` (release build). The
//! servers' state lives in the system temp dir.
//!
//! A state file of 50,000 runs is made with the server's own DDL: a real
//! server runs one linear workflow (three compute nodes, one workflow
//! update), and 49,999 copies of that run are made with one `INSERT …
//! SELECT` per table over a generated series (`support::clone`). The same
//! file is then used twice, each time with a fresh server:
//!
//! - idle: every run finished a day ago, so the startup sweep deletes
//!   nothing; `runs.list` (the first page, 50 rows) round trips are timed
//!   back to back;
//! - purge: every run finished 40 days ago; the startup sweep deletes every
//!   tree (one tree per transaction, yielding between trees) and compacts
//!   the file; meanwhile the same `runs.list` round trips are timed.
//!
//! Printed: the seeding time; the purge time (from the sweep's log line:
//! its deletion time and its `VACUUM` time); the file size before, after
//! the deletions (its pages, with the free ones) and after `VACUUM`; the
//! `runs.list` p50/p99 during the purge and idle, and the p99 ratio (target
//! at most 3×); a raw SQLite commit on the same disk for scale.
#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{PRODUCTION, Stats, ms, raw_commits, stats};
use pi_workflows_client::RequestSpec;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};
use support::*;

const RUNS: usize = 50_000;
const IDLE_SAMPLES: usize = 2_000;
const DAY_MS: u64 = 24 * 60 * 60 * 1000;

fn days_ago(days: u64) -> u64 {
    server::clock::now_ms() - days * DAY_MS
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn file_bytes(home: &Path) -> u64 {
    ["state.sqlite", "state.sqlite-wal"]
        .iter()
        .map(|name| std::fs::metadata(home.join(name)).map_or(0, |meta| meta.len()))
        .sum()
}

fn log(server: &TestServer) -> String {
    std::fs::read_to_string(server.scratch().join("server.stderr")).unwrap_or_default()
}

/// The sweep's log line (the last one).
fn sweep_line(server: &TestServer) -> Option<String> {
    log(server)
        .lines()
        .rev()
        .find(|line| line.contains("state retention: deleted"))
        .map(str::to_owned)
}

/// The number after `prefix` in `line`.
fn number_after(line: &str, prefix: &str) -> Option<u64> {
    let rest = &line[line.find(prefix)? + prefix.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Makes the 50,000-run state file; returns the home holding it.
async fn seeded() -> (TestServer, Duration) {
    let mut server = TestServer::new(&PRODUCTION);
    server.spawn().expect("the server starts");
    let script = write_script(
        server.scratch(),
        "linear.json",
        &json!({
            "workflowName": "linear",
            "topology": linear_topology(&["a", "b", "c"]),
            "nodes": {"b": [{"update": {"type": "progress", "key": "k", "data": {"n": 1}}}]},
        }),
    );
    let mut client = server.client().await;
    let template = started(&mut client, &script).await;
    wait_view(&mut client, &template, Duration::from_secs(60), |view| {
        view["display"]["activity"] == "none" && status(view) == "completed"
    })
    .await;
    drop(client);
    wait_quiescent_at(&server).await;
    server.stop();
    let started = Instant::now();
    let db = writable(&server.home.join("state.sqlite"));
    clone_runs(&db, &template, "seeded", RUNS - 1, days_ago(40));
    finish_at(&db, &[template.as_str()], days_ago(40));
    db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    let runs: i64 = db
        .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(runs as usize, RUNS);
    (server, started.elapsed())
}

/// A server on a copy of the seeded file, with every run finished at
/// `finished_at_ms`.
fn copy_of(seed: &TestServer, finished_at_ms: u64) -> TestServer {
    let server = TestServer::new(&PRODUCTION);
    std::fs::create_dir_all(&server.home).unwrap();
    std::fs::copy(
        seed.home.join("state.sqlite"),
        server.home.join("state.sqlite"),
    )
    .unwrap();
    let db = writable(&server.home.join("state.sqlite"));
    db.execute(
        "UPDATE runs SET finished_at_ms = ?1, updated_at_ms = ?1",
        [finished_at_ms as i64],
    )
    .unwrap();
    db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    server
}

/// One `runs.list` round trip (the first page of 50).
async fn list_once(client: &mut pi_workflows_client::Connection) -> Duration {
    let spec = RequestSpec::read("runs.list", None, json!({ "limit": 50 }));
    let started = Instant::now();
    let response = client.request(&spec).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(response.outcome, "accepted", "{}", response.frame);
    elapsed
}

/// `runs.list` on a server whose sweep has nothing to delete.
async fn idle(seed: &TestServer) -> Stats {
    let mut server = copy_of(seed, days_ago(1));
    server.spawn().expect("the idle server starts");
    // Its startup sweep finds nothing old: wait for it, then measure.
    let deadline = Instant::now() + Duration::from_secs(120);
    while sweep_line(&server).is_none() {
        assert!(Instant::now() < deadline, "no sweep line: {}", log(&server));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut client = server.client().await;
    for _ in 0..50 {
        list_once(&mut client).await;
    }
    let mut samples = Vec::with_capacity(IDLE_SAMPLES);
    for _ in 0..IDLE_SAMPLES {
        samples.push(list_once(&mut client).await);
    }
    drop(client);
    server.stop();
    stats(samples)
}

/// What the purge measured.
struct Purge {
    list: Stats,
    samples: usize,
    wall: Duration,
    line: String,
    before: u64,
    after_vacuum: u64,
}

/// The startup sweep over 50,000 old runs, with `runs.list` timed
/// meanwhile.
async fn purge(seed: &TestServer) -> Purge {
    let mut server = copy_of(seed, days_ago(40));
    let before = file_bytes(&server.home);
    let started = Instant::now();
    server.spawn().expect("the purging server starts");
    let mut client = server.client().await;
    let mut samples = Vec::new();
    loop {
        samples.push(list_once(&mut client).await);
        if samples.len() % 64 == 0 && sweep_line(&server).is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "the purge took over an hour"
        );
    }
    let wall = started.elapsed();
    let line = sweep_line(&server).unwrap();
    // Every measured request ran during the purge but the last few (the
    // log is polled every 64 requests): drop up to 64 after the line.
    let during = samples.len().saturating_sub(64).max(1);
    samples.truncate(during);
    drop(client);
    server.stop();
    let after_vacuum = file_bytes(&server.home);
    let remaining: i64 = server
        .db()
        .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(remaining, 0, "every tree was purged");
    Purge {
        samples: samples.len(),
        list: stats(samples),
        wall,
        line,
        before,
        after_vacuum,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let (seed, seeding) = seeded().await;
    println!(
        "seeded {RUNS} runs ({}) in {:.1} s",
        mib(file_bytes(&seed.home)),
        seeding.as_secs_f64()
    );
    let idle = idle(&seed).await;
    let purge = purge(&seed).await;
    let raw = raw_commits(seed.scratch(), 200);
    let deleted_ms = number_after(&purge.line, "KiB of values) in ").unwrap_or(0);
    let vacuum_ms = number_after(&purge.line, "VACUUM ran in ");
    let file_mib = number_after(&purge.line, "file ").unwrap_or(0);
    let free_mib = number_after(&purge.line, "MiB with ").unwrap_or(0);
    println!("sweep: {}", purge.line.trim_start_matches("pi-workflows: "));
    println!(
        "(r) purge of {RUNS} runs: deletions {:.1} s ({:.2} ms per tree), VACUUM {}; wall {:.1} s from spawn",
        deleted_ms as f64 / 1000.0,
        deleted_ms as f64 / RUNS as f64,
        vacuum_ms.map_or("skipped".to_owned(), |ms| format!(
            "{:.1} s",
            ms as f64 / 1000.0
        )),
        purge.wall.as_secs_f64(),
    );
    println!(
        "    file: before {}, after the deletions {file_mib} MiB with {free_mib} MiB free, after VACUUM {}",
        mib(purge.before),
        mib(purge.after_vacuum),
    );
    println!(
        "    runs.list during the purge ({} samples): p50 {} p99 {}; idle ({IDLE_SAMPLES}): p50 {} p99 {}; p99 ratio {:.2}× (target ≤ 3×)",
        purge.samples,
        ms(purge.list.p50),
        ms(purge.list.p99),
        ms(idle.p50),
        ms(idle.p99),
        purge.list.p99.as_secs_f64() / idle.p99.as_secs_f64(),
    );
    println!(
        "    raw SQLite commit on this disk: p50 {} p99 {}",
        ms(raw.p50),
        ms(raw.p99)
    );
}
