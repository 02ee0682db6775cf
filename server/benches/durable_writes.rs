//! Durable writes per step (issue 12, item 2): the WAL pages and the
//! `fsync`/`fdatasync` calls one durable step costs, counted with strace
//! on a real `pi-workflows server run` with the scripted runner. Counts,
//! not times: they do not depend on the load of the box.
//!
//! Run: `cargo bench -p server --bench durable_writes` (needs `strace`;
//! without it the bench says so and prints nothing else).
//!
//! The server runs under `strace -f -y -e trace=pwrite64,fsync,fdatasync`.
//! Each round runs a 1-node linear run, then a `STEPS`-node one, and reads
//! the trace after each (once every runner exit is recorded). Per step is
//! `(count(STEPS-node run) − count(1-node run)) / (STEPS − 1)`, so what
//! every run costs once (the start, admission, the runner's spawn, ready
//! and exit) cancels out. WAL pages are the bytes written to
//! `state.sqlite-wal` divided by one frame (page size + its 24-byte
//! header); syncs are every `fsync`/`fdatasync` on a file of the state
//! home (the WAL, the database at a checkpoint). Timer commits (lease and
//! claim renewals) that fall inside a round are counted too: they are the
//! fraction above a whole number.
#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{PRODUCTION, median, timed_run};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::*;

const STEPS: usize = 101;
const ROUNDS: usize = 3;

/// What the trace holds so far for the state home.
#[derive(Clone, Copy, Debug, Default)]
struct Writes {
    wal_bytes: u64,
    syncs: u64,
}

/// Sums the complete lines of `trace` (`strace -y` output) that touch a
/// file under `home`.
fn writes_in(trace: &Path, home: &str) -> Writes {
    let text = std::fs::read_to_string(trace).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    let mut writes = Writes::default();
    for line in complete.lines() {
        // `<pid> <syscall>(<fd><<path>>, …) = <result>`
        let Some((call, rest)) = line
            .split_once(' ')
            .and_then(|(_, rest)| rest.trim_start().split_once('('))
        else {
            continue;
        };
        let Some(path) = rest
            .split_once('<')
            .and_then(|(_, rest)| rest.split_once('>'))
            .map(|(path, _)| path)
        else {
            continue;
        };
        if !path.starts_with(home) {
            continue;
        }
        let result = line
            .rsplit_once(" = ")
            .and_then(|(_, result)| result.split(' ').next()?.parse::<u64>().ok());
        match call {
            "pwrite64" if path.ends_with("-wal") => writes.wal_bytes += result.unwrap_or(0),
            "fsync" | "fdatasync" => writes.syncs += 1,
            _ => {}
        }
    }
    writes
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(strace) = ["strace", "/usr/bin/strace"]
        .into_iter()
        .find(|program| Command::new(program).arg("-V").output().is_ok())
    else {
        println!("durable writes per step: strace is not installed; nothing measured");
        return;
    };
    let mut server = TestServer::new(&PRODUCTION);
    let trace = server.scratch().join("strace.log");
    let trace_text = trace.to_string_lossy().into_owned();
    server
        .spawn_under(&[
            strace,
            "-f",
            "-qq",
            "-y",
            "-e",
            "trace=pwrite64,fsync,fdatasync",
            "-o",
            &trace_text,
            "--",
        ])
        .expect("the traced server starts");
    let home = server.home.to_string_lossy().into_owned();
    let page_size: i64 = server
        .db()
        .query_row("PRAGMA page_size", [], |row| row.get(0))
        .unwrap();
    let frame = (page_size + 24) as f64;
    let mut client = server.client().await;
    let one = linear_script(server.scratch(), "one", 1);
    let long = linear_script(server.scratch(), "long", STEPS);
    let settle = || tokio::time::sleep(Duration::from_millis(300));
    let mut pages = Vec::new();
    let mut syncs = Vec::new();
    for _ in 0..ROUNDS {
        settle().await;
        let before = writes_in(&trace, &home);
        timed_run(&server, &mut client, &one).await;
        settle().await;
        let after_one = writes_in(&trace, &home);
        let (_, steps) = timed_run(&server, &mut client, &long).await;
        assert_eq!(steps as usize, STEPS);
        settle().await;
        let after_long = writes_in(&trace, &home);
        let per_step = |of: fn(&Writes) -> u64| {
            let one_run = of(&after_one) as f64 - of(&before) as f64;
            let long_run = of(&after_long) as f64 - of(&after_one) as f64;
            (long_run - one_run) / (STEPS - 1) as f64
        };
        // Hundredths, so the samples have an order.
        pages.push((per_step(|w| w.wal_bytes) / frame * 100.0).round() as i64);
        syncs.push((per_step(|w| w.syncs) * 100.0).round() as i64);
    }
    drop(client);
    let stopped = server
        .command()
        .args(["server", "stop"])
        .output()
        .expect("server stop runs");
    assert!(stopped.status.success(), "server stop: {stopped:?}");
    assert!(
        server.wait_exit(Duration::from_secs(30)),
        "the traced server did not exit"
    );
    let show = |hundredths: i64| format!("{:.2}", hundredths as f64 / 100.0);
    println!();
    println!(
        "pi-workflows durable writes per step ({STEPS}-node linear run against a 1-node run, median of {ROUNDS} rounds; page size {page_size})"
    );
    println!();
    println!("| WAL pages per step | fsyncs per step | rounds (pages / fsyncs) |");
    println!("|---|---|---|");
    println!(
        "| {} | {} | {} |",
        show(median(pages.clone())),
        show(median(syncs.clone())),
        pages
            .iter()
            .zip(&syncs)
            .map(|(pages, syncs)| format!("{} / {}", show(*pages), show(*syncs)))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
