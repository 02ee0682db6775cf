//! What both benchmarks share: production timing, percentile statistics
//! and the raw-commit baseline every ratio is measured against.
#![allow(dead_code, unreachable_pub)]

use rusqlite::Connection;
use std::path::Path;
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
