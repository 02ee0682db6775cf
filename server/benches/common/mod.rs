//! What the benchmarks share: production timing, percentile statistics,
//! the raw-commit baseline every ratio is measured against, and runs that
//! wait at a checkpoint.
#![allow(dead_code, unreachable_pub)]

use crate::support::{TestServer, started, status, wait_quiescent_at, wait_settled, write_script};
use pi_workflows_client::Connection as Client;
use rusqlite::Connection;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Production timing (the test harness shortens these for recovery tests).
pub const PRODUCTION: [(&str, &str); 3] = [
    ("PI_WORKFLOWS_CLAIM_TTL_MS", "30000"),
    ("PI_WORKFLOWS_SERVER_LEASE_MS", "15000"),
    ("PI_WORKFLOWS_STOP_GRACE_MS", "1000"),
];

/// p50, p99 and mean of a set of samples.
pub struct Stats {
    pub p50: Duration,
    pub p99: Duration,
    pub mean: Duration,
}

pub fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let total: Duration = samples.iter().sum();
    Stats {
        p50: at(0.50),
        p99: at(0.99),
        mean: total / samples.len() as u32,
    }
}

pub fn ms(duration: Duration) -> String {
    format!("{:.3} ms", duration.as_secs_f64() * 1000.0)
}

/// The baseline: `commits` raw single-row commits (a 200-byte row), WAL +
/// `synchronous=FULL`, in a scratch file in `dir` (the directory the
/// servers' state lives in), removed afterwards.
pub fn raw_commits(dir: &Path, commits: usize) -> Stats {
    let path = dir.join("raw-baseline.sqlite");
    let connection = Connection::open(&path).unwrap();
    connection
        .pragma_update(None, "journal_mode", "WAL")
        .unwrap();
    connection
        .pragma_update(None, "synchronous", "FULL")
        .unwrap();
    connection
        .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB NOT NULL) STRICT")
        .unwrap();
    let payload = vec![7u8; 200];
    let samples = (0..commits)
        .map(|_| {
            let started = Instant::now();
            connection.execute_batch("BEGIN IMMEDIATE").unwrap();
            connection
                .execute("INSERT INTO t (v) VALUES (?1)", [&payload])
                .unwrap();
            connection.execute_batch("COMMIT").unwrap();
            started.elapsed()
        })
        .collect();
    drop(connection);
    let _ = std::fs::remove_file(&path);
    stats(samples)
}

/// A scratch directory for a bench's raw-commit baseline: under
/// `PIW_BENCH_DIR` when set (the disk the state lives on), else the
/// system's temporary directory.
pub fn bench_dir() -> tempfile::TempDir {
    match std::env::var_os("PIW_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).expect("PIW_BENCH_DIR is writable"),
        None => tempfile::tempdir().expect("a temp dir"),
    }
}

/// Starts `script`, waits (reading the file) until the run finished, and
/// returns its server-side duration and step count.
pub async fn timed_run(
    server: &TestServer,
    client: &mut pi_workflows_client::Connection,
    script: &Path,
) -> (Duration, i64) {
    let run_id = started(client, script).await;
    let deadline = Instant::now() + Duration::from_secs(600);
    let db = server.db();
    loop {
        let row: (String, i64, Option<i64>) = db
            .query_row(
                "SELECT status, created_at_ms, finished_at_ms FROM runs WHERE run_id = ?1",
                [&run_id],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .unwrap();
        if let (status, created, Some(finished)) = row {
            assert_eq!(status, "completed", "run {run_id}");
            let steps: i64 = db
                .query_row(
                    "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1",
                    [&run_id],
                    |row| row.get(0),
                )
                .unwrap();
            drop(db);
            wait_quiescent_at(server).await;
            return (Duration::from_millis((finished - created) as u64), steps);
        }
        assert!(Instant::now() < deadline, "run {run_id} did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The median of `samples`.
pub fn median<T: Ord + Copy>(mut samples: Vec<T>) -> T {
    samples.sort();
    samples[samples.len() / 2]
}

pub fn checkpoint_script(dir: &Path) -> PathBuf {
    write_script(
        dir,
        "waits.json",
        &json!({
            "workflowName": "waits",
            "topology": {
                "startAt": "review",
                "nodes": [
                    {"id": "review", "nodeType": "checkpoint", "timeout": {"kind": "none"}, "mountPath": []},
                    {"id": "after", "nodeType": "compute", "timeout": {"kind": "default"}, "mountPath": []}
                ],
                "edges": [{"kind": "plain", "from": "review", "to": "after"}],
                "mounts": []
            },
            "nodes": {"review": [{"finish": {"question": "go?"}}]}
        }),
    )
}

/// Starts `n` runs that wait at a checkpoint (no runner left afterwards).
pub async fn waiting_runs(server: &TestServer, client: &mut Client, n: usize) -> Vec<String> {
    let script = checkpoint_script(server.scratch());
    let mut runs = Vec::with_capacity(n);
    for _ in 0..n {
        runs.push(started(client, &script).await);
    }
    for run_id in &runs {
        let view = wait_settled(client, run_id).await;
        assert_eq!(status(&view), "waiting");
    }
    wait_quiescent_at(server).await;
    runs
}
