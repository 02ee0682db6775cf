//! Server benchmarks (issue 5, item 12): figures, not timed tests. Each
//! figure is compared with a baseline measured in the same run on the same
//! disk: one raw single-row commit (`BEGIN IMMEDIATE; INSERT; COMMIT`) in a
//! scratch SQLite file with WAL and `synchronous=FULL`, in the directory the
//! server's state lives in.
//!
//! Run: `cargo bench -p server --bench server` (release build). Set
//! `PIW_BENCH_DIR` to measure on another disk (default: the system temp dir).
//! `PIW_BENCH_SECTIONS=cold` runs only (d)'s cold start, and
//! `PIW_BENCH_COLD_STARTS` sets its number of starts (default 5): to compare
//! two server binaries in alternating runs.
//!
//! (a) command round trip through the socket with its durable receipt:
//!     `run.pause` / `run.resume` pairs on a run that waits at a checkpoint
//!     (no runner is involved), p50/p99, as a ratio to the raw commit.
//! (b) throughput of 64 concurrent clients (each pausing and resuming its
//!     own waiting run), as a ratio to the raw single-commit rate.
//! (c) marginal cost per durable step with the scripted runner: (duration
//!     of a 100-node linear run − duration of a 1-node run) / 99, from the
//!     server's own timestamps, as a ratio to the raw commit.
//! (d) cold start to ready on an empty state directory, and recovery with
//!     100,000 runs in the database of which 1,000 were running when their
//!     server died (start to ready, which includes recording the 1,000
//!     orphaned runner epochs and parking their runs for re-admission).
//! (g) the server's resident set right after that recovery, with those
//!     runs parked (four re-admitted) and 100 clients each subscribed to
//!     one of them.
#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{PRODUCTION, Stats, bench_dir, ms, raw_commits, stats, waiting_runs};
use pi_workflows_client::{Connection as Client, RequestSpec};
use rusqlite::Connection;
use serde_json::json;

use std::time::{Duration, Instant};
use support::*;

const RAW_COMMITS: usize = 2000;
const ROUND_TRIP_PAIRS: usize = 1000;
const CLIENTS: usize = 64;
const PAIRS_PER_CLIENT: usize = 25;
const STEP_RUNS: usize = 3;
const COLD_STARTS: usize = 5;
const SEEDED_RUNS: usize = 100_000;
const SEEDED_RUNNING: usize = 1_000;
const SUBSCRIBERS: usize = 100;

/// With `PIW_BENCH_MARKS` set, prints `bench mark <name> <CLOCK_MONOTONIC
/// seconds>` to stderr at the start and end of each measured phase, so a
/// `perf record -k mono` profile of a server can be cut by phase.
fn mark(name: &str) {
    if std::env::var_os("PIW_BENCH_MARKS").is_some() {
        // `Instant` is CLOCK_MONOTONIC on Linux; its Debug form shows the timespec.
        eprintln!("bench mark {name} {:?}", Instant::now());
    }
}

async fn command(client: &mut Client, operation: &str, run_id: &str) -> Duration {
    let spec = RequestSpec::command(operation, Some(run_id), json!({}));
    let started = Instant::now();
    let response = client.request(&spec).await.expect("a response");
    let elapsed = started.elapsed();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    assert!(response.receipt.is_some());
    elapsed
}

/// (a) One client, pause/resume pairs on one waiting run.
async fn round_trips(server: &TestServer) -> Stats {
    let mut client = server.client().await;
    let run_id = waiting_runs(server, &mut client, 1).await.remove(0);
    for _ in 0..50 {
        command(&mut client, "run.pause", &run_id).await;
        command(&mut client, "run.resume", &run_id).await;
    }
    let mut samples = Vec::with_capacity(ROUND_TRIP_PAIRS * 2);
    mark("a-start");
    for _ in 0..ROUND_TRIP_PAIRS {
        samples.push(command(&mut client, "run.pause", &run_id).await);
        samples.push(command(&mut client, "run.resume", &run_id).await);
    }
    mark("a-end");
    stats(samples)
}

/// A read through the socket that commits nothing (`server.status`): the
/// transport, framing and validation share of a round trip.
async fn status_reads(server: &TestServer) -> Stats {
    let mut client = server.client().await;
    let spec = RequestSpec::read("server.status", None, json!({}));
    let mut samples = Vec::with_capacity(ROUND_TRIP_PAIRS * 2);
    for index in 0..ROUND_TRIP_PAIRS * 2 + 100 {
        let started = Instant::now();
        let response = client.request(&spec).await.expect("a response");
        let elapsed = started.elapsed();
        assert_eq!(response.outcome, "accepted");
        if index >= 100 {
            samples.push(elapsed);
        }
    }
    stats(samples)
}

/// (b) 64 clients, each pausing and resuming its own waiting run.
async fn throughput(server: &TestServer) -> (f64, usize) {
    let mut setup = server.client().await;
    let runs = waiting_runs(server, &mut setup, CLIENTS).await;
    let mut clients = Vec::new();
    for index in 0..CLIENTS {
        clients.push(
            Client::connect(&server.socket(), &format!("tp-{index}"))
                .await
                .unwrap(),
        );
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(CLIENTS + 1));
    let mut tasks = Vec::new();
    for (mut client, run_id) in clients.into_iter().zip(runs) {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            for _ in 0..PAIRS_PER_CLIENT {
                command(&mut client, "run.pause", &run_id).await;
                command(&mut client, "run.resume", &run_id).await;
            }
        }));
    }
    barrier.wait().await;
    mark("b-start");
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    mark("b-end");
    let commands = CLIENTS * PAIRS_PER_CLIENT * 2;
    (commands as f64 / elapsed.as_secs_f64(), commands)
}

/// The server-side duration of a completed run (created → finished).
fn run_duration(server: &TestServer, run_id: &str) -> Duration {
    let (created, finished): (i64, i64) = server
        .db()
        .query_row(
            "SELECT created_at_ms, finished_at_ms FROM runs WHERE run_id = ?1",
            [run_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    Duration::from_millis((finished - created) as u64)
}

/// (c) Median durations of a 100-node and a 1-node run.
async fn steps(server: &TestServer) -> (Duration, Duration) {
    let mut client = server.client().await;
    let long = linear_script(server.scratch(), "hundred", 100);
    let short = linear_script(server.scratch(), "one", 1);
    let mut longs = Vec::new();
    let mut shorts = Vec::new();
    mark("c-start");
    for _ in 0..STEP_RUNS {
        for (script, into) in [(&long, &mut longs), (&short, &mut shorts)] {
            let run_id = started(&mut client, script).await;
            let view = wait_view(&mut client, &run_id, Duration::from_secs(120), |view| {
                status(view) == "completed"
            })
            .await;
            assert_eq!(status(&view), "completed");
            into.push(run_duration(server, &run_id));
            wait_quiescent_at(server).await;
        }
    }
    mark("c-end");
    longs.sort();
    shorts.sort();
    (longs[STEP_RUNS / 2], shorts[STEP_RUNS / 2])
}

/// How many cold starts (d) makes.
fn cold_start_count() -> usize {
    std::env::var("PIW_BENCH_COLD_STARTS")
        .ok()
        .and_then(|count| count.parse().ok())
        .filter(|count| *count > 0)
        .unwrap_or(COLD_STARTS)
}

/// (d) Spawn → ready line on an empty state directory.
fn cold_starts() -> Stats {
    let mut samples = Vec::new();
    for _ in 0..cold_start_count() {
        let mut server = TestServer::new(&PRODUCTION);
        let started = Instant::now();
        server.spawn().expect("the server starts");
        samples.push(started.elapsed());
        server.stop();
    }
    stats(samples)
}

/// Copies every row of `template` in each table with a `run_id` column
/// `count` times, under run ids `<prefix>-000001`… (runner epochs get the
/// new run id as a suffix; autoincrement keys are left to SQLite): one
/// `INSERT … SELECT` per table.
fn clone_runs(
    db: &Connection,
    template: &str,
    prefix: &str,
    count: usize,
    tables: &[(String, Vec<String>)],
) {
    let new_run = "printf('%s-%06d', ?3, n.i)";
    for (table, columns) in tables {
        let select: Vec<String> = columns
            .iter()
            .map(|column| match column.as_str() {
                "run_id" => new_run.to_owned(),
                "runner_epoch" => format!("t.runner_epoch || '-' || {new_run}"),
                other => format!("t.{other}"),
            })
            .collect();
        db.execute(
            &format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?2)
                 INSERT INTO {table} ({}) SELECT {} FROM {table} t, n WHERE t.run_id = ?1",
                columns.join(", "),
                select.join(", ")
            ),
            rusqlite::params![template, count as i64, prefix],
        )
        .unwrap_or_else(|error| panic!("clone {table}: {error}"));
    }
}

/// The server's resident set and its peak, from `/proc/<pid>/status`.
fn resident_set(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{key} in /proc/{pid}/status"))
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

/// What the recovery section measured.
struct Recovery {
    ready: Duration,
    settled: Duration,
    parked: i64,
    resident_kib: u64,
    peak_kib: u64,
}

/// (d) A state file with 100,000 runs of which 1,000 were running when
/// their server was SIGKILLed; measures spawn → ready of the recovering
/// server and checks that recovery recorded every orphaned runner epoch.
/// Then (g): with those runs parked for re-admission, 100 clients each
/// subscribe to one of them, and the server's resident set is read.
async fn recovery() -> Recovery {
    // Templates, made by a real server: a completed run and a running one
    // (its runner stalls), then the server dies.
    let mut server = TestServer::new(&[("PI_WORKFLOWS_SERVER_LEASE_MS", "500")]);
    server.spawn().expect("the seeding server starts");
    let stall = write_script(
        server.scratch(),
        "stall.json",
        &json!({"workflowName": "stall", "topology": linear_topology(&["a"]), "nodes": {"a": [{"stall": true}]}}),
    );
    let done = write_script(
        server.scratch(),
        "done.json",
        &json!({"workflowName": "done", "topology": linear_topology(&["a", "b"])}),
    );
    let mut client = server.client().await;
    let completed = started(&mut client, &done).await;
    assert_eq!(
        status(&wait_settled(&mut client, &completed).await),
        "completed"
    );
    let running = started(&mut client, &stall).await;
    wait_view(&mut client, &running, Duration::from_secs(10), |view| {
        view["display"]["currentNode"] == "a"
    })
    .await;
    drop(client);
    server.kill();
    // The stalled runner would live forever: end it (the dead server cannot).
    if let Some(identity) = runner_identity(&server.db(), &running, 1) {
        server::children::supervisor::kill_exact(&identity);
    }

    // Clone the templates to 9,900 completed and 100 running runs.
    {
        let db = Connection::open(server.home.join("state.sqlite")).unwrap();
        let tables: Vec<(String, Vec<String>)> = {
            let names: Vec<String> = db
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN ('host_commands', 'worker_messages', 'update_receipts', 'runner_processes', 'sqlite_sequence')")
                .unwrap()
                .query_map([], |row| row.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            names
                .into_iter()
                .filter_map(|name| {
                    let columns: Vec<String> = db
                        .prepare(&format!("SELECT name FROM pragma_table_info('{name}')"))
                        .unwrap()
                        .query_map([], |row| row.get(0))
                        .unwrap()
                        .map(Result::unwrap)
                        .filter(|column: &String| !(name == "events" && column == "seq"))
                        .collect();
                    columns
                        .contains(&"run_id".to_owned())
                        .then_some((name, columns))
                })
                .collect()
        };
        // `runs` first (the other tables reference it).
        let mut ordered = tables.clone();
        ordered.sort_by_key(|(name, _)| name != "runs");
        db.execute_batch("BEGIN").unwrap();
        clone_runs(&db, &running, "running", SEEDED_RUNNING - 1, &ordered);
        clone_runs(
            &db,
            &completed,
            "completed",
            SEEDED_RUNS - SEEDED_RUNNING - 1,
            &ordered,
        );
        db.execute_batch("COMMIT").unwrap();
        let runs: i64 = db
            .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
            .unwrap();
        let live: i64 = db
            .query_row(
                "SELECT COUNT(*) FROM run_workers WHERE status IN ('launching', 'ready')",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(runs as usize, SEEDED_RUNS);
        assert_eq!(live as usize, SEEDED_RUNNING);
    }
    // Let the dead server's epoch lease (500 ms) and the runs' claims
    // (1.5 s, the harness's) expire, then recover.
    std::thread::sleep(Duration::from_millis(CLAIM_TTL_MS + 300));
    for (key, value) in PRODUCTION {
        server.set_env(key, value);
    }
    server.set_env("PI_WORKFLOWS_MAX_WORKERS", "4");
    let started = Instant::now();
    server.spawn().expect("the server recovers");
    let ready = started.elapsed();
    // Every orphaned runner epoch was recorded and every running row parked
    // for re-admission (the scheduler then re-admits them four at a time).
    let db = server.db();
    let deadline = Instant::now() + Duration::from_secs(60);
    let settled = loop {
        let orphaned = count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE outcome = 'orphaned'",
            [],
        );
        if orphaned as usize == SEEDED_RUNNING {
            break started.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "only {orphaned} orphaned epochs recorded"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    // (g) 100 subscribers, each on its own parked run.
    let parked = count(
        &db,
        "SELECT COUNT(*) FROM runs r JOIN run_queue q USING (run_id) WHERE r.status = 'running' AND q.status NOT IN ('starting', 'running')",
        [],
    );
    let mut subscribers = Vec::with_capacity(SUBSCRIBERS);
    for index in 1..=SUBSCRIBERS {
        let mut subscriber = server.client().await;
        let run_id = format!("running-{index:06}");
        let response = subscriber
            .subscribe(json!({ "kind": "run", "runId": run_id }), None)
            .await
            .unwrap();
        assert_eq!(response.outcome, "accepted", "{}", response.frame);
        subscriber.next_event().await.unwrap(); // the snapshot
        subscribers.push(subscriber);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (resident_kib, peak_kib) = resident_set(server.pid());
    drop(subscribers);
    server.stop();
    Recovery {
        ready,
        settled,
        parked,
        resident_kib,
        peak_kib,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::var("PIW_BENCH_SECTIONS").as_deref() == Ok("cold") {
        let cold = cold_starts();
        println!(
            "(d) cold start to ready (empty state, {} starts): p50 {} / p99 {} / mean {}",
            cold_start_count(),
            ms(cold.p50),
            ms(cold.p99),
            ms(cold.mean)
        );
        return;
    }
    let dir = bench_dir();
    // Same disk as the servers' state: the servers' temp dirs live beside it.
    let raw = raw_commits(dir.path(), RAW_COMMITS);
    let raw_rate = 1.0 / raw.mean.as_secs_f64();

    let server = TestServer::start_with(&PRODUCTION);
    let trips = round_trips(&server).await;
    let reads = status_reads(&server).await;
    let (rate, commands) = throughput(&server).await;
    let (hundred, one) = steps(&server).await;
    drop(server);
    let per_step = hundred.saturating_sub(one) / 99;
    let cold = cold_starts();
    let recovery = recovery().await;

    let ratio = |value: Duration, base: Duration| value.as_secs_f64() / base.as_secs_f64();
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    println!();
    println!(
        "pi-workflows server benchmarks ({} raw commits, {ROUND_TRIP_PAIRS} pause/resume pairs, {CLIENTS} clients x {} commands, {STEP_RUNS} runs per step figure)",
        RAW_COMMITS,
        PAIRS_PER_CLIENT * 2
    );
    println!();
    println!(
        "| figure | measured | baseline (raw WAL+FULL single-row commit) | ratio | target | |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| raw commit | p50 {} / p99 {} / mean {} | — | 1.00 | — | |",
        ms(raw.p50),
        ms(raw.p99),
        ms(raw.mean)
    );
    let p50_ratio = ratio(trips.p50, raw.p50);
    let p99_ratio = ratio(trips.p99, raw.p99);
    println!(
        "| (a) command round trip, p50 | {} | {} | {p50_ratio:.2} | ≤ 1.5 | {} |",
        ms(trips.p50),
        ms(raw.p50),
        verdict(p50_ratio <= 1.5)
    );
    println!(
        "| (a) command round trip, p99 | {} | {} | {p99_ratio:.2} | ≤ 1.5 | {} |",
        ms(trips.p99),
        ms(raw.p99),
        verdict(p99_ratio <= 1.5)
    );
    println!(
        "| (a') for reference: a read through the socket that commits nothing (`server.status`), p50 / p99 | {} / {} | {} / {} | {:.2} / {:.2} | — | |",
        ms(reads.p50),
        ms(reads.p99),
        ms(raw.p50),
        ms(raw.p99),
        ratio(reads.p50, raw.p50),
        ratio(reads.p99, raw.p99)
    );
    let throughput_ratio = rate / raw_rate;
    println!(
        "| (b) throughput, {CLIENTS} clients ({commands} commands) | {rate:.0} commands/s | {raw_rate:.0} commits/s | {throughput_ratio:.2} | ≥ 3 | {} |",
        verdict(throughput_ratio >= 3.0)
    );
    let step_ratio = ratio(per_step, raw.mean);
    println!(
        "| (c) marginal cost per durable step (100-node run {} − 1-node run {}) / 99 | {} | {} (mean) | {step_ratio:.2} | ≤ 1.5 | {} |",
        ms(hundred),
        ms(one),
        ms(per_step),
        ms(raw.mean),
        verdict(step_ratio <= 1.5)
    );
    println!(
        "| (d) cold start to ready (empty state, {} starts) | p50 {} / max {} | — | — | — | |",
        cold_start_count(),
        ms(cold.p50),
        ms(cold.p99)
    );
    println!(
        "| (d) recovery: {SEEDED_RUNS} runs, {SEEDED_RUNNING} running, start to ready | {} | — | — | ≤ 1 s | {} |",
        ms(recovery.ready),
        verdict(recovery.ready <= Duration::from_secs(1))
    );
    println!(
        "| (d) recovery: start until all {SEEDED_RUNNING} orphaned epochs recorded | {} | — | — | — | |",
        ms(recovery.settled)
    );
    let resident_mib = recovery.resident_kib as f64 / 1024.0;
    println!(
        "| (g) server resident set: {} parked runs (of {SEEDED_RUNS}), {SUBSCRIBERS} subscribers (peak {:.1} MiB) | {resident_mib:.1} MiB | — | — | ≤ 64 MiB | {} |",
        recovery.parked,
        recovery.peak_kib as f64 / 1024.0,
        verdict(resident_mib <= 64.0)
    );
}
