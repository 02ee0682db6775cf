//! Load with faults (issue 20, item 4): figures and checks, not a timed
//! test. Run: `cargo bench -p server --bench load` (release build).
//!
//! 64 clients (`PIW_LOAD_CLIENTS`), each pausing and resuming its own run
//! that waits at a checkpoint, 10,000 commands each (`PIW_LOAD_COMMANDS`),
//! through the socket of one real `pi-workflows server run` (production
//! claim TTL and lease). About one command in 50 (drawn from
//! `PIW_LOAD_SEED`, printed) is written and its connection then closed
//! before the response arrives: a forced disconnect mid-command. The client
//! connects again under the same client id and retries the same command
//! (same idempotency key and payload) under a new request id.
//!
//! Checks, each a panic when it fails:
//! - every command is answered `accepted` or, for a retry whose first
//!   attempt the server had already taken, `adopted` (a retry that came
//!   first is `accepted`, and the cut-off attempt then adopts it); never
//!   anything else;
//! - no receipt is lost or doubled: each client's stored receipts are
//!   exactly its commands' idempotency keys, one `accepted` receipt each;
//! - each run's paused flag is what its last command asked for, and its
//!   revision moved once per command;
//! - the consistency checks hold afterwards.
//!
//! Figures: command round trips p50 / p99 / max (and of the retries, which
//! include the new connection), throughput, and the server's resident set
//! sampled every 500 ms (after the first tenth of the load, at its peak and
//! at the end: bounded when the end is near the first tenth).
#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::{PRODUCTION, ms, stats, waiting_runs};
use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::*;

/// One in `DISCONNECT_ONE_IN` commands is cut off mid-command (on average).
const DISCONNECT_ONE_IN: u64 = 50;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// xorshift64*: a small seeded generator, so a run can be replayed.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// What one client saw.
#[derive(Default)]
struct Seen {
    round_trips: Vec<Duration>,
    retries: Vec<Duration>,
    adopted_retries: usize,
    accepted_retries: usize,
    keys: Vec<String>,
}

/// Writes `spec` as a request frame and closes the connection without
/// reading the answer.
async fn cut_off(mut client: Client, spec: &RequestSpec) {
    let request_id = client.request_id();
    let frame = json!({
        "schema": "pi-workflows.client.v1",
        "type": "request",
        "requestId": request_id,
        "clientId": client.client_id(),
        "operation": spec.operation,
        "payload": spec.payload,
        "runId": spec.run_id,
        "idempotencyKey": spec.idempotency_key,
    });
    client.send(&frame).await.expect("the request is written");
    drop(client);
}

async fn one_client(
    socket: std::path::PathBuf,
    client_id: String,
    run_id: String,
    commands: u64,
    seed: u64,
    disconnects: Arc<AtomicUsize>,
) -> Seen {
    let mut draw = Draw(seed | 1);
    let mut seen = Seen::default();
    let mut client = Client::connect(&socket, &client_id).await.unwrap();
    for index in 0..commands {
        let operation = if index % 2 == 0 {
            "run.pause"
        } else {
            "run.resume"
        };
        let spec = RequestSpec::command(operation, Some(&run_id), json!({}));
        seen.keys.push(spec.idempotency_key.clone().unwrap());
        if draw.next().is_multiple_of(DISCONNECT_ONE_IN) {
            disconnects.fetch_add(1, Ordering::Relaxed);
            cut_off(client, &spec).await;
            let started = Instant::now();
            client = Client::connect(&socket, &client_id).await.unwrap();
            let response = client.request(&spec).await.expect("the retry is answered");
            seen.retries.push(started.elapsed());
            match response.outcome.as_str() {
                "adopted" => seen.adopted_retries += 1,
                "accepted" => seen.accepted_retries += 1,
                other => panic!("a retry answered {other}: {}", response.frame),
            }
            continue;
        }
        let started = Instant::now();
        let response = client.request(&spec).await.expect("a response");
        seen.round_trips.push(started.elapsed());
        assert_eq!(response.outcome, "accepted", "{}", response.frame);
    }
    seen
}

fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("VmRSS:")
                    .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let clients = setting("PIW_LOAD_CLIENTS", 64) as usize;
    let commands = setting("PIW_LOAD_COMMANDS", 10_000);
    let seed = setting(
        "PIW_LOAD_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    println!(
        "load with faults: {clients} clients x {commands} commands, one in {DISCONNECT_ONE_IN} cut off mid-command; PIW_LOAD_SEED={seed}"
    );
    let server = TestServer::start_with(&PRODUCTION);
    let mut setup = server.client().await;
    let runs = waiting_runs(&server, &mut setup, clients).await;
    let revisions_before: Vec<u64> = {
        let db = server.db();
        runs.iter()
            .map(|run_id| {
                db.query_row(
                    "SELECT revision FROM runs WHERE run_id = ?1",
                    [run_id],
                    |row| row.get::<_, i64>(0),
                )
                .unwrap() as u64
            })
            .collect()
    };

    // The resident set, sampled every 500 ms while the load runs.
    let pid = server.pid();
    let done = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while done.load(Ordering::Relaxed) == 0 {
                samples.push(resident_kib(pid));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            samples.push(resident_kib(pid));
            samples
        })
    };

    let disconnects = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = runs
        .iter()
        .enumerate()
        .map(|(index, run_id)| {
            tokio::spawn(one_client(
                server.socket(),
                format!("load-{index}"),
                run_id.clone(),
                commands,
                seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                disconnects.clone(),
            ))
        })
        .collect();
    let mut seen = Vec::with_capacity(clients);
    for task in tasks {
        seen.push(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    done.store(1, Ordering::Relaxed);
    let resident = sampler.await.unwrap();
    wait_quiescent_at(&server).await;

    // No lost or doubled receipt, and each run where its commands left it.
    let db = server.db();
    for (index, (client, run_id)) in seen.iter().zip(&runs).enumerate() {
        let client_id = format!("load-{index}");
        let mut stored: Vec<(String, String)> = db
            .prepare("SELECT idempotency_key, outcome FROM host_commands WHERE client_id = ?1")
            .unwrap()
            .query_map([&client_id], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        stored.sort();
        let mut keys = client.keys.clone();
        keys.sort();
        let stored_keys: Vec<&String> = stored.iter().map(|(key, _)| key).collect();
        assert_eq!(
            stored_keys,
            keys.iter().collect::<Vec<_>>(),
            "{client_id}: stored receipts differ from its commands"
        );
        assert!(
            stored.iter().all(|(_, outcome)| outcome == "accepted"),
            "{client_id}: a receipt that is not accepted"
        );
        let (paused, revision): (bool, i64) = db
            .query_row(
                "SELECT paused, revision FROM runs WHERE run_id = ?1",
                [run_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!(paused, commands % 2 == 1, "{run_id}: paused flag");
        assert_eq!(
            revision as u64,
            revisions_before[index] + commands,
            "{run_id}: one revision per command"
        );
    }
    let violations = consistency_violations(&db);
    assert!(violations.is_empty(), "{violations:#?}");

    let all: Vec<Duration> = seen
        .iter()
        .flat_map(|client| client.round_trips.iter().copied())
        .collect();
    let retries: Vec<Duration> = seen
        .iter()
        .flat_map(|client| client.retries.iter().copied())
        .collect();
    let adopted: usize = seen.iter().map(|client| client.adopted_retries).sum();
    let accepted: usize = seen.iter().map(|client| client.accepted_retries).sum();
    let total = clients as u64 * commands;
    let max_of = |samples: &[Duration]| samples.iter().max().copied().unwrap_or_default();
    let (round_trip_max, retry_max) = (max_of(&all), max_of(&retries));
    let round_trips = stats(all);
    let retry_stats = stats(retries);
    let tenth = resident[resident.len() / 10];
    let peak = resident.iter().max().copied().unwrap_or(0);
    let last = resident.last().copied().unwrap_or(0);
    println!();
    println!(
        "{total} commands in {:.1} s ({:.0} commands/s); {} cut off mid-command and retried: {adopted} adopted, {accepted} accepted (the first attempt had not been taken when the retry came); 0 lost or doubled receipts; every run where its commands left it; consistency checks hold",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        disconnects.load(Ordering::Relaxed)
    );
    println!(
        "round trip                   p50 {}  p99 {}  max {}",
        ms(round_trips.p50),
        ms(round_trips.p99),
        ms(round_trip_max)
    );
    println!(
        "reconnect + retry            p50 {}  p99 {}  max {}",
        ms(retry_stats.p50),
        ms(retry_stats.p99),
        ms(retry_max)
    );
    println!(
        "server resident set          after a tenth {:.1} MiB  peak {:.1} MiB  end {:.1} MiB  ({} samples)",
        tenth as f64 / 1024.0,
        peak as f64 / 1024.0,
        last as f64 / 1024.0,
        resident.len()
    );
}
