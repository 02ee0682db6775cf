//! Runner logs (`host/logs/`): what a runner writes to stderr is kept up to
//! a per-log cap with its newest bytes, and the directory keeps a bounded
//! number of logs, the oldest removed first. Files stay 0600 in the 0700
//! directory.

mod support;

use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use support::{TestServer, linear_topology, started, status, wait_settled, write_script};

fn logs(server: &TestServer) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(server.home.join("host/logs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    paths.sort();
    paths
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The documented default cap of one runner log.
const LOG_CAP_BYTES: u64 = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_writes_far_past_the_cap_leaves_a_bounded_log_that_keeps_its_tail() {
    let server = TestServer::start();
    // 16 MiB of numbered 100-byte lines: the last is line 167771.
    let written: u64 = 16 * 1024 * 1024;
    let script = write_script(
        server.scratch(),
        "noisy.json",
        &json!({
            "topology": linear_topology(&["a"]),
            "nodes": { "a": [{ "stderrBytes": written, "then": { "finish": { "ok": true } } }] },
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed");
    support::wait_quiescent_at(&server).await;
    let epoch: String = server
        .db()
        .query_row(
            "SELECT runner_epoch FROM run_workers WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    let log = server.home.join("host/logs").join(format!("{epoch}.log"));
    let bytes = std::fs::metadata(&log).unwrap().len();
    assert!(
        bytes <= LOG_CAP_BYTES,
        "the runner log holds {bytes} bytes after the runner wrote {written} (cap {LOG_CAP_BYTES})"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let last_line = format!("stderr line {:08} ", written / 100 - 1);
    assert!(text.contains(&last_line), "the newest line is kept");
    assert!(
        !text.contains("stderr line 00000000 "),
        "the oldest line was dropped"
    );
    assert!(
        text.contains("earlier bytes of this log were dropped"),
        "the log says that it was cut"
    );
    assert_eq!(mode(&log), 0o600);
    assert_eq!(mode(&server.home.join("host/logs")), 0o700);
}

/// The documented number of logs `host/logs/` keeps.
const LOGS_KEPT: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_runs_leave_a_bounded_number_of_runner_logs_the_oldest_removed_first() {
    let server = TestServer::start();
    let script = write_script(
        server.scratch(),
        "quick.json",
        // A resolver that exits after answering: its log stays apart from the
        // runner's (a resolver handed its run has one log, the runner epoch's).
        &json!({ "topology": linear_topology(&["a"]), "resolveOnly": true }),
    );
    let mut client = server.client().await;
    let mut runs = Vec::new();
    // Each run leaves a resolver log and a runner log: 120 logs in all.
    for _ in 0..60 {
        let run_id = started(&mut client, &script).await;
        let view = wait_settled(&mut client, &run_id).await;
        assert_eq!(status(&view), "completed");
        runs.push(run_id);
    }
    support::wait_quiescent_at(&server).await;
    let kept = logs(&server);
    assert!(
        kept.len() <= LOGS_KEPT,
        "{} runner logs kept (limit {LOGS_KEPT})",
        kept.len()
    );
    let epoch_of = |run_id: &str| -> String {
        server
            .db()
            .query_row(
                "SELECT runner_epoch FROM run_workers WHERE run_id = ?1",
                [run_id],
                |row| row.get(0),
            )
            .unwrap()
    };
    let has = |epoch: &str| {
        kept.iter()
            .any(|path| path.ends_with(format!("{epoch}.log")))
    };
    // The newest run's log is kept, the first run's was removed.
    assert!(
        has(&epoch_of(runs.last().unwrap())),
        "the newest log is kept"
    );
    assert!(!has(&epoch_of(&runs[0])), "the oldest log was removed");
    for path in &kept {
        assert_eq!(mode(path), 0o600, "{}", path.display());
    }
}
