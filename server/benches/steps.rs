//! Per-step cost against run length (issue 12, item 1): figures, not timed
//! tests. The baseline is one raw single-row commit (`BEGIN IMMEDIATE;
//! INSERT; COMMIT`, WAL + `synchronous=FULL`) measured in the same run in
//! the directory the server's state lives in.
//!
//! Run: `cargo bench -p server --bench steps` (release build).
//!
//! For each run length N (100, 300, 1,000 steps; the loop also 10,000) the marginal cost per
//! durable step is `(T(N-node linear run) − T(1-node run)) / (N − 1)`, T =
//! `finished_at_ms − created_at_ms` from the server's own timestamps, median
//! of `STEP_RUNS` runs of each, one real `pi-workflows server run` with the
//! scripted runner. A loop workflow (4 nodes, N steps) separates the growth
//! of the history from the growth of the topology (a 10,000-node linear
//! workflow is not run: its topology is larger than one 1 MiB frame, so it
//! cannot be resolved). The completion is
//! watched through a read-only SQLite connection, never through `run.view`
//! (a full view of a long run would load the writer thread being measured).
#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{PRODUCTION, bench_dir, median, ms, raw_commits, timed_run};
use std::time::Duration;
use support::*;

const RAW_COMMITS: usize = 2000;
const STEP_RUNS: usize = 3;
const LENGTHS: [usize; 4] = [100, 300, 1000, 10_000];
/// The longest linear workflow (one node per step) that fits a frame.
const LONGEST_LINEAR: usize = 1000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = bench_dir();
    let raw = raw_commits(dir.path(), RAW_COMMITS);
    let server = TestServer::start_with(&PRODUCTION);
    let mut client = server.client().await;
    let one = linear_script(server.scratch(), "one", 1);
    let mut ones = Vec::new();
    let mut rows = Vec::new();
    for length in LENGTHS {
        let linear = (length <= LONGEST_LINEAR).then(|| {
            (
                "linear",
                linear_script(server.scratch(), &format!("linear-{length}"), length),
            )
        });
        let looping = (
            "loop",
            loop_script(
                server.scratch(),
                &format!("loop-{length}.json"),
                (length - 2) / 2,
                None,
            ),
        );
        for (shape, script) in linear.into_iter().chain([looping]) {
            let mut samples = Vec::new();
            for _ in 0..STEP_RUNS {
                let (duration, steps) = timed_run(&server, &mut client, &script).await;
                assert_eq!(steps as usize, length, "{shape} {length}");
                samples.push(duration);
                ones.push(timed_run(&server, &mut client, &one).await.0);
            }
            rows.push((shape, length, median(samples)));
        }
    }
    drop(server);
    let one = median(ones);
    let ratio = |value: Duration, base: Duration| value.as_secs_f64() / base.as_secs_f64();
    println!();
    println!(
        "pi-workflows per-step cost against run length ({RAW_COMMITS} raw commits, median of {STEP_RUNS} runs per point; 1-node run {})",
        ms(one)
    );
    println!();
    println!(
        "| shape | steps | run | per step | raw commit mean | ratio | per step / per step at 100 |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| raw commit | — | p50 {} / p99 {} / mean {} | — | — | 1.00 | — |",
        ms(raw.p50),
        ms(raw.p99),
        ms(raw.mean)
    );
    for (shape, length, run) in &rows {
        let per_step = run.saturating_sub(one) / (*length as u32 - 1);
        let at_100 = rows
            .iter()
            .find(|(s, l, _)| s == shape && *l == 100)
            .map(|(_, _, r)| r.saturating_sub(one) / 99)
            .unwrap_or(per_step);
        println!(
            "| {shape} | {length} | {} | {} | {} | {:.2} | {:.2} |",
            ms(*run),
            ms(per_step),
            ms(raw.mean),
            ratio(per_step, raw.mean),
            ratio(per_step, at_100)
        );
    }
}
