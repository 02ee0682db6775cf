//! Live-view benchmarks (issue 7, item 7): figures, not timed tests. Each
//! figure is printed with a baseline measured in the same run.
//!
//! Run: `cargo bench -p server --bench views` (release build). The servers'
//! state and the baseline's file are both in the system temp dir.
//!
//! (e) patch delivery to 100 subscribers: 100 connections subscribe to one
//!     run waiting at a checkpoint; a 101st pauses and resumes it. For each
//!     command, the time from sending it until each subscriber holds the
//!     patch (p50, p99 over all deliveries), beside the command's own round
//!     trip and a raw SQLite commit (WAL, synchronous=FULL) on the same disk.
//! (f) the first run-list page with 100,000 runs in the database (rows
//!     cloned from a real completed run with the server's DDL), p50/p99 of
//!     `runs.list` round trips, beside parsing the same page with serde_json;
//!     target ≤ 20 ms.
//! (g) the view of a 1,000-node run (a 1,000-node linear topology, all
//!     executed): `run.view` round trips, p50/p99, beside parsing the same
//!     view with serde_json.
#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{PRODUCTION, Stats, checkpoint_script, ms, raw_commits, stats};
use pi_workflows_client::{Connection as Client, RequestSpec};
use rusqlite::Connection;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::*;
use tokio::sync::mpsc;

const SUBSCRIBERS: usize = 100;
const COMMANDS: usize = 60;
const LIST_RUNS: usize = 100_000;
const SAMPLES: usize = 200;
const VIEW_NODES: usize = 1000;
const RAW_COMMITS: usize = 1000;

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.1}×", a.as_secs_f64() / b.as_secs_f64())
}

fn server_with(extra: &[(&str, &str)]) -> TestServer {
    let mut server = TestServer::new(&PRODUCTION);
    for (key, value) in extra {
        server.set_env(key, value);
    }
    server.spawn().expect("the server starts");
    server
}

/// serde_json parse time of `bytes` (median of `SAMPLES`).
fn parse_baseline(bytes: &[u8]) -> Duration {
    let samples = (0..SAMPLES)
        .map(|_| {
            let started = Instant::now();
            let value: Value = serde_json::from_slice(bytes).unwrap();
            std::hint::black_box(value);
            started.elapsed()
        })
        .collect();
    stats(samples).p50
}

/// Waits until the run's view settled (no runner left).
async fn settled(client: &mut Client, run_id: &str) -> Value {
    wait_view(client, run_id, Duration::from_secs(120), |view| {
        view["display"]["activity"] == "none"
            && matches!(status(view), "completed" | "failed" | "waiting")
    })
    .await
}

/// (e) Patch delivery to 100 subscribers.
async fn patch_delivery() -> (Stats, Stats) {
    let server = server_with(&[]);
    let dir = tempfile::tempdir().unwrap();
    let mut driver = server.client().await;
    let run_id = started(&mut driver, &checkpoint_script(dir.path())).await;
    settled(&mut driver, &run_id).await;
    let (arrivals, mut arrived) = mpsc::unbounded_channel::<(u64, Instant)>();
    for _ in 0..SUBSCRIBERS {
        let mut subscriber = server.client().await;
        let response = subscriber
            .subscribe(json!({ "kind": "run", "runId": run_id }), None)
            .await
            .unwrap();
        assert_eq!(response.outcome, "accepted");
        subscriber.next_event().await.unwrap(); // the snapshot
        let arrivals = arrivals.clone();
        tokio::spawn(async move {
            while let Ok(frame) = subscriber.next_event().await {
                let revision = frame["revision"].as_u64().unwrap_or(0);
                if arrivals.send((revision, Instant::now())).is_err() {
                    return;
                }
            }
        });
    }
    let mut deliveries = Vec::with_capacity(SUBSCRIBERS * COMMANDS);
    let mut round_trips = Vec::with_capacity(COMMANDS);
    for index in 0..COMMANDS {
        let operation = if index % 2 == 0 {
            "run.pause"
        } else {
            "run.resume"
        };
        let spec = RequestSpec::command(operation, Some(&run_id), json!({}));
        let sent = Instant::now();
        let response = driver.request(&spec).await.unwrap();
        round_trips.push(sent.elapsed());
        assert_eq!(response.outcome, "accepted", "{}", response.frame);
        for _ in 0..SUBSCRIBERS {
            let (_, at) = tokio::time::timeout(Duration::from_secs(30), arrived.recv())
                .await
                .expect("every subscriber gets the patch")
                .unwrap();
            deliveries.push(at.duration_since(sent));
        }
        // Nothing else is in flight before the next command.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Ok(extra) = arrived.try_recv() {
            panic!("an extra event after command {index}: {extra:?}");
        }
    }
    (stats(deliveries), stats(round_trips))
}

/// The columns of `table`.
fn columns(db: &Connection, table: &str) -> Vec<String> {
    db.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Clones `template`'s rows of the run-list tables `count` times with new
/// run ids, one second apart and older than the template.
fn seed_runs(db: &Connection, template: &str, count: usize) {
    db.execute_batch("BEGIN").unwrap();
    for table in [
        "runs",
        "run_queue",
        "run_bindings",
        "leases",
        "run_sources",
        "viewer_runs",
    ] {
        let columns = columns(db, table);
        let select: Vec<String> = columns
            .iter()
            .map(|column| match column.as_str() {
                "run_id" => "printf('seeded-%06d', n.i)".to_owned(),
                "created_at_ms" if table == "runs" => "t.created_at_ms - n.i * 1000".to_owned(),
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
            rusqlite::params![template, count as i64],
        )
        .unwrap_or_else(|error| panic!("seed {table}: {error}"));
    }
    db.execute_batch("COMMIT").unwrap();
}

/// (f) The first run-list page with 100,000 runs (and one from the middle).
async fn run_list() -> (Stats, Stats, Duration, usize) {
    let mut server = server_with(&[]);
    let dir = tempfile::tempdir().unwrap();
    let mut client = server.client().await;
    let template = started(
        &mut client,
        &write_script(
            dir.path(),
            "done.json",
            &json!({"workflowName": "done", "topology": linear_topology(&["a", "b"])}),
        ),
    )
    .await;
    settled(&mut client, &template).await;
    drop(client);
    server.stop();
    {
        let db = Connection::open(server.home.join("state.sqlite")).unwrap();
        seed_runs(&db, &template, LIST_RUNS - 1);
        let runs: i64 = db
            .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
            .unwrap();
        assert_eq!(runs as usize, LIST_RUNS);
    }
    server
        .spawn()
        .expect("the server restarts on the seeded state");
    let mut client = server.client().await;
    let mut first = Vec::with_capacity(SAMPLES);
    let mut bytes = Vec::new();
    let mut rows = 0;
    for _ in 0..SAMPLES {
        let spec = RequestSpec::read("runs.list", None, json!({ "limit": 50 }));
        let started = Instant::now();
        let response = client.request(&spec).await.unwrap();
        first.push(started.elapsed());
        let receipt = response.receipt.unwrap();
        rows = receipt["rows"].as_array().unwrap().len();
        bytes = serde_json::to_vec(&response.frame).unwrap();
    }
    let middle_cursor = {
        let spec = RequestSpec::read("runs.list", None, json!({ "limit": 1000 }));
        let mut cursor = None;
        for _ in 0..50 {
            let mut spec = spec.clone();
            if let Some(cursor) = &cursor {
                spec.payload["cursor"] = json!(cursor);
            }
            let receipt = client.request(&spec).await.unwrap().receipt.unwrap();
            cursor = receipt["nextCursor"].as_str().map(str::to_owned);
        }
        cursor.expect("a cursor 50,000 runs deep")
    };
    let mut middle = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let spec = RequestSpec::read(
            "runs.list",
            None,
            json!({ "limit": 50, "cursor": middle_cursor }),
        );
        let started = Instant::now();
        let response = client.request(&spec).await.unwrap();
        middle.push(started.elapsed());
        assert_eq!(
            response.receipt.unwrap()["rows"].as_array().unwrap().len(),
            50
        );
    }
    server.stop();
    (stats(first), stats(middle), parse_baseline(&bytes), rows)
}

/// (g) The view of a 1,000-node run.
async fn thousand_node_view() -> (Stats, Duration, usize) {
    let server = server_with(&[]);
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<String> = (0..VIEW_NODES)
        .map(|index| format!("n{index:04}"))
        .collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut topology = linear_topology(&refs);
    topology["maxSteps"] = json!(VIEW_NODES);
    let script = write_script(
        dir.path(),
        "thousand.json",
        &json!({"workflowName": "thousand", "topology": topology}),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let view = settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{}", view["display"]);
    assert_eq!(view["steps"]["total"], VIEW_NODES);
    let bytes = serde_json::to_vec(&view).unwrap();
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let spec = RequestSpec::read("run.view", Some(&run_id), json!({}));
        let started = Instant::now();
        let response = client.request(&spec).await.unwrap();
        samples.push(started.elapsed());
        assert_eq!(response.outcome, "accepted");
    }
    (stats(samples), parse_baseline(&bytes), bytes.len())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // The servers' state lives in the system temp dir too (same disk).
    let scratch = tempfile::tempdir().unwrap();
    let raw = raw_commits(scratch.path(), RAW_COMMITS);
    println!(
        "baseline  raw SQLite commit (WAL, FULL)   p50 {}  p99 {}",
        ms(raw.p50),
        ms(raw.p99)
    );

    let (delivery, round_trip) = patch_delivery().await;
    println!(
        "(e) patch delivery to {SUBSCRIBERS} subscribers    p50 {}  p99 {}   (command round trip p50 {}; p50 = {} raw commit)",
        ms(delivery.p50),
        ms(delivery.p99),
        ms(round_trip.p50),
        ratio(delivery.p50, raw.p50),
    );

    let (first, middle, parse, rows) = run_list().await;
    println!(
        "(f) first run-list page ({rows} rows) of {LIST_RUNS}   p50 {}  p99 {}   (a page 50,000 deep p50 {}; serde_json parse of the page {}; p50 = {} parse)",
        ms(first.p50),
        ms(first.p99),
        ms(middle.p50),
        ms(parse),
        ratio(first.p50, parse),
    );

    let (view, parse, size) = thousand_node_view().await;
    println!(
        "(g) view of a {VIEW_NODES}-node run ({} KiB)      p50 {}  p99 {}   (serde_json parse of the view {}; p50 = {} parse)",
        size / 1024,
        ms(view.p50),
        ms(view.p99),
        ms(parse),
        ratio(view.p50, parse),
    );
}
