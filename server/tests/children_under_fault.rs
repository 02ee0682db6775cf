//! Children under fault: every kind of child the server supervises — the
//! runner, the validation child (a validate-mode runner), the resolver (a
//! resolve-mode runner), the headless Pi a runner registers (the scripted
//! runner's `spawnChild` stand-in: a process in a group of its own,
//! registered with `process.register`, as `pi.ts` registers `pi --mode
//! rpc`) — killed with SIGKILL at a seeded point, stopped with SIGSTOP past
//! its claim (or deadline) and then continued, and ignoring SIGTERM. Each
//! test asserts that no stale write commits, that no process of the child's
//! recorded process group is left, and that the run resumes exactly once.
//!
//! The points are drawn from `PI_WORKFLOWS_CHILDREN_SEED` (default
//! `DEFAULT_SEED`; hex with `0x` or decimal), mixed with the test's name;
//! each test prints its seed, its points and the command that replays it.

mod support;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use serde_json::{Value, json};
use server::process::ProcessIdentity;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::*;

/// The seed of CI runs (`PI_WORKFLOWS_CHILDREN_SEED` overrides it).
const DEFAULT_SEED: u64 = 20;

/// A splitmix64 stream drawn from the seed and the test's name.
struct Points {
    state: u64,
}

impl Points {
    fn of(test: &str) -> Self {
        let seed = std::env::var("PI_WORKFLOWS_CHILDREN_SEED")
            .ok()
            .map(|text| {
                let text = text.trim();
                text.strip_prefix("0x")
                    .map_or_else(|| text.parse(), |hex| u64::from_str_radix(hex, 16))
                    .expect("PI_WORKFLOWS_CHILDREN_SEED is a number")
            })
            .unwrap_or(DEFAULT_SEED);
        // FNV-1a of the name, so each test draws its own points.
        let name = test.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
        eprintln!(
            "{test}: seed {seed:#x} (replay: PI_WORKFLOWS_CHILDREN_SEED={seed:#x} cargo test -p server --test children_under_fault {test})"
        );
        Self { state: seed ^ name }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low)
    }
}

/// Whether no live (non-zombie) process is in process group `pgid` (a
/// zombie is dead; `/proc` is scanned because `kill(0)` still sees it).
fn group_is_empty(pgid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return killpg(Pid::from_raw(pgid as i32), None).is_err();
    };
    !entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(server::process::stat)
        .any(|stat| stat.process_group == pgid && stat.state != 'Z')
}

/// Waits until every group in `groups` is empty.
async fn wait_groups_empty(groups: &[u32], within: Duration, what: &str) {
    wait_for(within, what, || {
        groups
            .iter()
            .all(|group| group_is_empty(*group))
            .then_some(())
    })
    .await;
}

/// Five compute nodes; node `a` first starts a headless-Pi stand-in (a
/// `sleep` in a group of its own, registered) and a helper in the runner's
/// group; every node then takes `pace_ms`.
const NODES: [&str; 5] = ["a", "b", "c", "d", "e"];

fn paced_script(dir: &Path, name: &str, startup: Value, pace_ms: u64) -> PathBuf {
    let mut nodes = serde_json::Map::new();
    for node in NODES {
        let paced = json!({"sleepMs": pace_ms, "then": {"finish": {"node": node}}});
        let behaviour = if node == "a" {
            json!({"spawnChild": {"sleepSeconds": 1000, "newGroup": true},
                   "then": {"spawnChild": {"sleepSeconds": 1000, "newGroup": false}, "then": paced}})
        } else {
            paced
        };
        nodes.insert(node.to_owned(), json!([behaviour]));
    }
    write_script(
        dir,
        &format!("{name}.json"),
        &json!({"workflowName": name, "topology": linear_topology(&NODES), "startup": startup, "nodes": nodes}),
    )
}

/// The identities the runners registered (the table is emptied as they are reaped).
fn registered(db: &rusqlite::Connection) -> Vec<ProcessIdentity> {
    db.prepare("SELECT start_identity FROM runner_processes")
        .unwrap()
        .query_map([], |row| row.get::<_, String>(0))
        .unwrap()
        .filter_map(|text| ProcessIdentity::decode(&text.unwrap()))
        .collect()
}

fn finished_in_generation(db: &rusqlite::Connection, run_id: &str, generation: i64) -> i64 {
    count(
        db,
        "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1 AND generation = ?2 AND status = 'finished'",
        rusqlite::params![run_id, generation],
    )
}

/// Waits until the first runner of `run_id` finished `finished` nodes and
/// is `into_ms` into the next one; returns its identity and the identities
/// it registered so far (node `a` registers two).
async fn at_point(
    db: &rusqlite::Connection,
    run_id: &str,
    finished: u64,
    into_ms: u64,
) -> (ProcessIdentity, Vec<ProcessIdentity>) {
    let (runner, children) = wait_for(
        Duration::from_secs(30),
        &format!("the first runner to finish {finished} nodes"),
        || {
            let runner = runner_identity(db, run_id, 1)?;
            let children = registered(db);
            let done = finished_in_generation(db, run_id, 1);
            (children.len() >= 2 && done == finished as i64).then_some((runner, children))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(into_ms)).await;
    assert_eq!(
        finished_in_generation(db, run_id, 1),
        finished as i64,
        "the point lies inside node {}",
        NODES[finished as usize]
    );
    (runner, children)
}

/// Each node finished exactly once over the whole run, and the node the
/// fault hit (`hit`) was rerun once, by the second runner; no node that
/// finished before the fault ran again.
fn assert_resumed_once(db: &rusqlite::Connection, run_id: &str, hit: usize) {
    let runners = count(
        db,
        "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
        [run_id],
    );
    assert_eq!(runners, 2, "one runner before the fault, exactly one after");
    for (index, node) in NODES.iter().enumerate() {
        let (attempts, finished): (i64, i64) = db
            .query_row(
                "SELECT COUNT(*), SUM(status = 'finished') FROM node_attempts WHERE run_id = ?1 AND node_id = ?2",
                [run_id, node],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!(finished, 1, "node {node} finished exactly once");
        let expected = if index == hit { 2 } else { 1 };
        assert_eq!(
            attempts, expected,
            "node {node}: attempts (the hit node {} is rerun once, no other)",
            NODES[hit]
        );
    }
}

/// Every `-> node.finished` line of the run's runner logs: the scripted
/// runners' own count of the nodes they finished.
fn finished_in_logs(server: &TestServer, db: &rusqlite::Connection, run_id: &str) -> usize {
    let epochs: Vec<String> = db
        .prepare("SELECT runner_epoch FROM run_workers WHERE run_id = ?1")
        .unwrap()
        .query_map([run_id], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    epochs
        .iter()
        .map(|epoch| {
            std::fs::read_to_string(server.home.join("host/logs").join(format!("{epoch}.log")))
                .unwrap_or_default()
                .matches("-> node.finished")
                .count()
        })
        .sum()
}

/// A runner SIGKILLed at a seeded point (after k finished nodes, t ms into
/// the next): the server notices its exit, kills what is left of its group
/// (the helper in it) and the registered headless-Pi stand-in's group, and
/// a new generation resumes the run exactly once: the hit node reruns, no
/// finished node runs again, the run completes. (k = 0, a crash before the
/// first result, parks `runnerNoProgress` and takes one explicit resume.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_sigkilled_at_a_seeded_point_is_reaped_and_its_run_resumes_once() {
    let mut points =
        Points::of("a_runner_sigkilled_at_a_seeded_point_is_reaped_and_its_run_resumes_once");
    let (finished, into_ms) = (points.between(0, 4), points.between(20, 160));
    eprintln!("point: SIGKILL after {finished} finished nodes, {into_ms} ms into the next");
    let server = TestServer::start();
    let script = paced_script(server.scratch(), "killed", json!({}), 250);
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();
    let (runner, children) = at_point(&db, &run_id, finished, into_ms).await;
    nix::sys::signal::kill(Pid::from_raw(runner.pid as i32), Signal::SIGKILL).unwrap();

    // A runner that crashed before its first result made no progress by the
    // kernel's rule (`runner::decide_exit`: the revision did not move past
    // its `runner.ready`; `node.started` and process registrations do not
    // move it), so its run parks `runnerNoProgress` for one explicit resume
    // instead of resuming on its own; any later crash resumes on its own.
    let parked = wait_for(SETTLE_TIMEOUT, "the killed runner's exit to be decided", || {
        let (queue, park): (String, Option<String>) = db
            .query_row(
                "SELECT q.status, r.park_reason FROM runs r JOIN run_queue q USING (run_id) WHERE run_id = ?1",
                [&run_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .ok()?;
        let exited = count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1 AND generation = 1 AND status = 'exited'",
            [&run_id],
        ) == 1;
        exited.then_some(queue == "parked" && park.as_deref() == Some("runnerNoProgress"))
    })
    .await;
    assert_eq!(
        parked,
        finished == 0,
        "only a crash before the first result parks for review"
    );
    if parked {
        let resumed = client
            .request(&RequestSpec::command(
                "run.resume",
                Some(&run_id),
                json!({}),
            ))
            .await
            .unwrap();
        assert_eq!(resumed.outcome, "accepted", "{:?}", resumed.frame);
    }

    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{view}");
    let mut groups = vec![runner.pid];
    groups.extend(children.iter().map(|child| child.pid));
    wait_groups_empty(
        &groups,
        Duration::from_secs(10),
        "the killed runner's groups to be empty",
    )
    .await;
    let first_outcome: String = db
        .query_row(
            "SELECT outcome FROM run_workers WHERE run_id = ?1 AND generation = 1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    eprintln!("the killed runner's outcome: {first_outcome}");
    assert_resumed_once(&db, &run_id, finished as usize);
    assert_eq!(
        finished_in_logs(&server, &db, &run_id),
        NODES.len(),
        "the runners' logs: one node.finished per node"
    );
    wait_quiescent(&db).await;
    for child in registered(&db).iter().chain(&children) {
        assert!(
            !server::process::is_alive(child),
            "registered child {} left",
            child.pid
        );
    }
    assert_eq!(count(&db, "SELECT COUNT(*) FROM runner_processes", []), 0);
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// A runner SIGSTOPped at a seeded point until its claim expired, then
/// continued: recovery fenced it, so nothing it writes after SIGCONT (the
/// result of the node it was in, then a stream of `fenced` updates)
/// commits; it is reaped with its groups once it exits, and exactly one
/// new runner resumes the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_sigstopped_past_its_claim_then_continued_commits_nothing_and_its_run_resumes_once()
 {
    let mut points = Points::of(
        "a_runner_sigstopped_past_its_claim_then_continued_commits_nothing_and_its_run_resumes_once",
    );
    let (finished, into_ms) = (points.between(0, 4), points.between(20, 200));
    eprintln!("point: SIGSTOP after {finished} finished nodes, {into_ms} ms into the next");
    // The stop grace outlasts the continued runner's writes (it ignores
    // SIGTERM), so it is alive and writing after SIGCONT.
    let server = TestServer::start_with(&[("PI_WORKFLOWS_STOP_GRACE_MS", "10000")]);
    let script = paced_script(
        server.scratch(),
        "stopped",
        json!({"ignoreSigterm": true, "keepWritingAfterClaimLost": true}),
        300,
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();
    let (runner, children) = at_point(&db, &run_id, finished, into_ms).await;
    let old_epoch: String = db
        .query_row(
            "SELECT runner_epoch FROM run_workers WHERE run_id = ?1 AND generation = 1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    signal(&runner, Signal::SIGSTOP);
    let stopped_at = Instant::now();
    wait_for(
        Duration::from_secs(15),
        "recovery of the expired claim",
        || {
            (count(
                &db,
                "SELECT generation FROM leases WHERE run_id = ?1",
                [&run_id],
            ) >= 2)
                .then_some(())
        },
    )
    .await;
    assert!(
        stopped_at.elapsed() >= Duration::from_millis(CLAIM_TTL_MS / 2),
        "recovery waited for the claim to expire"
    );
    let receipts = || {
        count(
            &db,
            "SELECT COUNT(*) FROM worker_messages WHERE runner_epoch = ?1",
            [&old_epoch],
        )
    };
    let receipts_at_recovery = receipts();
    let recovered_at_seq = count(
        &db,
        "SELECT MAX(seq) FROM events WHERE run_id = ?1",
        [&run_id],
    );
    let generation_one = || -> String {
        db.query_row(
            "SELECT group_concat(attempt_id || ':' || status, ',') FROM node_attempts WHERE run_id = ?1 AND generation = 1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap()
    };
    let generation_one_at_recovery = generation_one();

    signal(&runner, Signal::SIGCONT);
    wait_for(
        Duration::from_secs(15),
        "the continued runner to exit",
        || (!server::process::is_alive(&runner)).then_some(()),
    )
    .await;
    let log = std::fs::read_to_string(
        server
            .home
            .join("host/logs")
            .join(format!("{old_epoch}.log")),
    )
    .unwrap();
    assert!(
        log.contains("claimLost") && log.matches("(fenced write").count() >= 10,
        "the continued runner wrote after it was fenced: {log}"
    );
    let mut groups = vec![runner.pid];
    groups.extend(children.iter().map(|child| child.pid));
    wait_groups_empty(
        &groups,
        Duration::from_secs(10),
        "the fenced runner's groups to be empty",
    )
    .await;

    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{view}");
    assert_eq!(
        receipts(),
        receipts_at_recovery,
        "a receipt for a fenced write"
    );
    assert_eq!(
        generation_one(),
        generation_one_at_recovery,
        "a fenced write changed an attempt"
    );
    let outcome: String = db
        .query_row(
            "SELECT outcome FROM run_workers WHERE runner_epoch = ?1",
            [&old_epoch],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(outcome, "claimLost");
    let later_of_old = count(
        &db,
        "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND seq > ?2 AND instr(payload, ?3) > 0 AND kind <> 'runnerExited'",
        rusqlite::params![run_id, recovered_at_seq, old_epoch],
    );
    assert_eq!(
        later_of_old, 0,
        "an event of the fenced runner after recovery"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM workflow_updates WHERE run_id = ?1 AND update_type = 'fenced'",
            [&run_id],
        ),
        0,
        "a fenced update was published"
    );
    assert_resumed_once(&db, &run_id, finished as usize);
    wait_quiescent(&db).await;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM runner_processes", []), 0);
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// A graceful server stop while a runner that ignores SIGTERM (with a
/// registered headless-Pi stand-in) runs: the stop escalates to SIGKILL
/// after the grace period, the server exits within it, and no process of
/// either group is left; the next server resumes the drained run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stop_kills_a_runner_that_ignores_sigterm_and_the_next_server_resumes_it_once() {
    const GRACE_MS: u64 = 1000;
    let mut server = TestServer::start_with(&[("PI_WORKFLOWS_STOP_GRACE_MS", "1000")]);
    let marker = server.scratch().join("go");
    let script = write_script(
        server.scratch(),
        "stubborn.json",
        &json!({
            "workflowName": "stubborn",
            "topology": linear_topology(&["a", "b"]),
            "startup": {"ignoreSigterm": true},
            "nodes": {"a": [{
                "spawnChild": {"sleepSeconds": 1000, "newGroup": true},
                "then": {"ifFile": marker, "then": {"finish": {"a": 1}}, "else": {"stall": true}}
            }]}
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let (runner, children) = {
        let db = server.db();
        wait_for(
            Duration::from_secs(30),
            "the runner and its registered child",
            || {
                let runner = runner_identity(&db, &run_id, 1)?;
                let children = registered(&db);
                (children.len() == 1).then_some((runner, children))
            },
        )
        .await
    };
    drop(client);
    let stopping = Instant::now();
    server.stop();
    let took = stopping.elapsed();
    eprintln!("the server stopped {took:?} after SIGTERM");
    assert!(
        took < Duration::from_millis(GRACE_MS + 4000),
        "the stop is bounded by the grace period: {took:?}"
    );
    let groups = [runner.pid, children[0].pid];
    wait_groups_empty(
        &groups,
        Duration::from_secs(2),
        "no process of the runner's groups after the stop",
    )
    .await;
    let log = {
        let db = server.db();
        let epoch: String = db
            .query_row(
                "SELECT runner_epoch FROM run_workers WHERE run_id = ?1",
                [&run_id],
                |row| row.get(0),
            )
            .unwrap();
        std::fs::read_to_string(server.home.join("host/logs").join(format!("{epoch}.log"))).unwrap()
    };
    assert!(
        log.contains("SIGTERM received and ignored"),
        "SIGTERM was ignored: {log}"
    );

    std::fs::write(&marker, b"go").unwrap();
    server.spawn().expect("the server starts again");
    let mut client = server.client().await;
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{view}");
    let db = server.db();
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
            [&run_id]
        ),
        2,
        "one runner before the stop, exactly one after"
    );
    for node in ["a", "b"] {
        assert_eq!(
            count(
                &db,
                "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1 AND node_id = ?2 AND status = 'finished'",
                [&run_id, node],
            ),
            1,
            "node {node} finished once"
        );
    }
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// The resolver processes of `server`, from the `resolve-*.log` files
/// (the scripted runner logs its pid on every line).
fn resolver_pids(server: &TestServer) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(server.home.join("host").join("logs")) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("resolve-"))
        .filter_map(|entry| {
            let text = std::fs::read_to_string(entry.path()).ok()?;
            text.split("scripted-runner[")
                .nth(1)?
                .split(']')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    pids.sort_unstable();
    pids
}

async fn new_resolver(server: &TestServer, before: &[u32]) -> ProcessIdentity {
    let pid = wait_for(Duration::from_secs(10), "a new resolver", || {
        resolver_pids(server)
            .into_iter()
            .find(|pid| !before.contains(pid))
    })
    .await;
    server::process::identity(pid).expect("the resolver runs")
}

fn start_spec(script: &Path) -> RequestSpec {
    RequestSpec::command(
        "run.start",
        None,
        json!({ "workflow": script.to_string_lossy(), "input": {}, "executionMode": "headless", "projectPath": "/tmp" }),
    )
}

/// A resolver SIGKILLed at a seeded point of its resolution: the start is
/// refused (no run, no process of its group left) and a retry resolves
/// and runs once. A resolver SIGSTOPped past the resolution deadline is
/// killed while stopped: the start times out, no run exists, its group is
/// empty without a SIGCONT, and a SIGCONT finds nothing to continue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolver_sigkilled_or_sigstopped_leaves_no_run_and_no_process() {
    let mut points = Points::of("a_resolver_sigkilled_or_sigstopped_leaves_no_run_and_no_process");
    let kill_after = points.between(0, 700);
    eprintln!("point: SIGKILL the resolver {kill_after} ms into its resolution");
    let server = TestServer::start_with(&[("PI_WORKFLOWS_READY_TIMEOUT_MS", "2000")]);
    let script = write_script(
        server.scratch(),
        "slow.json",
        &json!({"workflowName": "slow", "topology": linear_topology(&["a"]), "resolveDelayMs": 800}),
    );
    let db = server.db();

    // SIGKILL mid-resolution.
    let mut client = server.client().await;
    let spec = start_spec(&script);
    let starting = tokio::spawn(async move { client.request(&spec).await.unwrap() });
    let resolver = new_resolver(&server, &[]).await;
    tokio::time::sleep(Duration::from_millis(kill_after)).await;
    signal(&resolver, Signal::SIGKILL);
    let refused: Response = starting.await.unwrap();
    eprintln!("the start after the killed resolver: {:?}", refused.frame);
    assert_ne!(refused.outcome, "accepted", "{:?}", refused.frame);
    wait_groups_empty(
        &[resolver.pid],
        Duration::from_secs(5),
        "the killed resolver's group",
    )
    .await;
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM runs", []),
        0,
        "a run of a failed resolution"
    );

    // The retry resolves and runs once, in the process that resolved it.
    let mut client = server.client().await;
    let before = resolver_pids(&server);
    let retried = client.request(&start_spec(&script)).await.unwrap();
    assert_eq!(retried.outcome, "accepted", "{:?}", retried.frame);
    let run_id = retried.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{view}");
    assert_eq!(count(&db, "SELECT COUNT(*) FROM runs", []), 1);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
            [&run_id]
        ),
        1
    );
    let _ = before;

    // SIGSTOP past the deadline.
    let before = resolver_pids(&server);
    let spec = start_spec(&script);
    let mut stopper = server.client().await;
    let starting = tokio::spawn(async move { stopper.request(&spec).await.unwrap() });
    let resolver = new_resolver(&server, &before).await;
    signal(&resolver, Signal::SIGSTOP);
    let stopped_at = Instant::now();
    let timed_out: Response = starting.await.unwrap();
    eprintln!(
        "the start after {:?} with a stopped resolver: {:?}",
        stopped_at.elapsed(),
        timed_out.frame
    );
    assert_ne!(timed_out.outcome, "accepted", "{:?}", timed_out.frame);
    assert_eq!(
        timed_out.error_code.as_deref(),
        Some("timedOut"),
        "{:?}",
        timed_out.frame
    );
    wait_groups_empty(
        &[resolver.pid],
        Duration::from_secs(5),
        "the stopped resolver's group, without a SIGCONT",
    )
    .await;
    let _ = nix::sys::signal::kill(Pid::from_raw(resolver.pid as i32), Signal::SIGCONT);
    assert!(!server::process::is_alive(&resolver));
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM runs", []),
        1,
        "no run of a timed-out resolution"
    );
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// An interactive run whose agent step `a` waits in its origin session,
/// then `b`; each validation child records its start and its verdict in
/// `validations.log` and takes `delay_ms`.
fn validated_script(dir: &Path, delay_ms: u64) -> PathBuf {
    write_script(
        dir,
        "validated.json",
        &json!({
            "workflowName": "validated",
            "topology": {"startAt": "a",
                         "nodes": [{"id": "a", "nodeType": "agent", "timeout": {"kind": "none"}, "mountPath": []},
                                   {"id": "b", "nodeType": "compute", "timeout": {"kind": "default"}, "mountPath": []}],
                         "edges": [{"kind": "plain", "from": "a", "to": "b"}], "mounts": []},
            "nodes": {"a": [{"interact": {"prompt": "Write it."}}]},
            "validate": {"delayMs": delay_ms, "record": "validations.log"},
        }),
    )
}

/// The validation children's records: (what, submission, pid).
fn validations(server: &TestServer) -> Vec<(String, String, u32)> {
    apply_lines(&server.scratch().join("validations.log"))
        .iter()
        .map(|line| {
            let mut fields = line.split(' ');
            (
                fields.next().unwrap().to_owned(),
                fields.next().unwrap().to_owned(),
                fields.next().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// An interactive run waiting at `a`, and a coordinator of its session.
async fn waiting_for_submission(
    server: &TestServer,
    client: &mut Client,
    delay_ms: u64,
) -> (String, Coordinator) {
    let script = validated_script(server.scratch(), delay_ms);
    let run_id = started_interactive(client, &script, "session-validate", json!({})).await;
    wait_view(client, &run_id, SETTLE_TIMEOUT, |view| {
        status(view) == "waiting"
    })
    .await;
    let coordinator = Coordinator::connect(client, "session-validate").await;
    (run_id, coordinator)
}

fn submit_spec(
    server: &TestServer,
    run_id: &str,
    coordinator: &Coordinator,
    submission: &str,
) -> RequestSpec {
    let (interaction_id, attempt_id): (String, String) = server
        .db()
        .query_row(
            "SELECT interaction_id, attempt_id FROM interactive_requests WHERE run_id = ?1 AND status = 'pending'",
            [run_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("the run's pending interaction");
    RequestSpec::command(
        "interaction.submit",
        Some(run_id),
        json!({"interactionId": interaction_id, "attemptId": attempt_id, "submissionId": submission,
               "output": {"done": submission},
               "authority": {"kind": "coordinator", "sessionId": coordinator.session, "coordinatorEpoch": coordinator.epoch}}),
    )
}

fn submission_outcome(server: &TestServer, submission: &str) -> (String, Option<String>) {
    server
        .db()
        .query_row(
            "SELECT outcome, error_message FROM interactive_submissions WHERE submission_id = ?1",
            [submission],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap()
}

/// A validation child SIGKILLed at a seeded point of its validation: no
/// verdict of it commits (the submission is rejected as stopped, never
/// accepted), its group is empty, and the run resumes once: the next
/// submission gets one new child, is accepted, and one continuation runs
/// `b` to completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_child_sigkilled_at_a_seeded_point_commits_no_verdict_and_the_run_resumes_once()
 {
    let mut points = Points::of(
        "a_validation_child_sigkilled_at_a_seeded_point_commits_no_verdict_and_the_run_resumes_once",
    );
    let kill_after = points.between(0, 500);
    eprintln!("point: SIGKILL the validation child {kill_after} ms into its validation");
    let server = TestServer::start();
    let mut client = server.client().await;
    let (run_id, coordinator) = waiting_for_submission(&server, &mut client, 700).await;

    let spec = submit_spec(&server, &run_id, &coordinator, "sub-1");
    let submitted = tokio::spawn(async move {
        let response = client.request(&spec).await.unwrap();
        (client, response)
    });
    let (_, _, pid) = wait_for(
        Duration::from_secs(30),
        "the first validation child",
        || validations(&server).into_iter().next(),
    )
    .await;
    let child = server::process::identity(pid).expect("the validation child runs");
    tokio::time::sleep(Duration::from_millis(kill_after)).await;
    signal(&child, Signal::SIGKILL);
    let (mut client, response) = submitted.await.unwrap();
    eprintln!(
        "the submission whose child was killed: {:?}",
        response.frame
    );
    wait_groups_empty(
        &[child.pid],
        Duration::from_secs(5),
        "the killed validation child's group",
    )
    .await;
    let (outcome, error) = submission_outcome(&server, "sub-1");
    assert_eq!(outcome, "rejected", "{error:?}");
    assert!(
        error
            .as_deref()
            .unwrap_or_default()
            .contains("stopped before it reported"),
        "{error:?}"
    );
    assert!(
        validations(&server)
            .iter()
            .all(|(what, _, _)| what == "started"),
        "the killed child never reached its verdict"
    );
    let view = view(&mut client, &run_id).await;
    assert_eq!(status(&view), "waiting", "the run still waits: {view}");

    // The next submission: one new child, accepted, one continuation.
    let again = client
        .request(&submit_spec(&server, &run_id, &coordinator, "sub-2"))
        .await
        .unwrap();
    assert_eq!(again.outcome, "accepted", "{:?}", again.frame);
    assert_eq!(submission_outcome(&server, "sub-2").0, "accepted");
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{view}");
    let records = validations(&server);
    let children: Vec<u32> = records
        .iter()
        .filter(|(what, _, _)| what == "started")
        .map(|(_, _, pid)| *pid)
        .collect();
    assert_eq!(children.len(), 2, "one child per submission: {records:?}");
    wait_groups_empty(
        &children,
        Duration::from_secs(5),
        "every validation child's group",
    )
    .await;
    let db = server.db();
    for node in ["a", "b"] {
        assert_eq!(
            count(
                &db,
                "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1 AND node_id = ?2",
                [&run_id, node],
            ),
            1,
            "node {node} ran once"
        );
    }
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
            [&run_id]
        ),
        2,
        "the runner that asked, and one continuation"
    );
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// A validation child SIGSTOPped while its run is cancelled (its request
/// closes; the child holds no claim of its own, the closed request is what
/// makes its verdict stale): it is killed while stopped, no group member
/// is left without a SIGCONT, the submission is settled as rejected (none
/// stays `validating`), and its verdict never commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_child_sigstopped_while_its_run_is_cancelled_is_killed_and_commits_nothing() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let (run_id, coordinator) = waiting_for_submission(&server, &mut client, 300).await;
    let spec = submit_spec(&server, &run_id, &coordinator, "sub-1");
    let mut submitter = server.client().await;
    let submitted = tokio::spawn(async move { submitter.request(&spec).await.unwrap() });
    let (_, _, pid) = wait_for(Duration::from_secs(30), "the validation child", || {
        validations(&server).into_iter().next()
    })
    .await;
    let child = server::process::identity(pid).expect("the validation child runs");
    signal(&child, Signal::SIGSTOP);
    let cancel = client
        .request(&RequestSpec::command(
            "run.cancel",
            Some(&run_id),
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(cancel.outcome, "accepted", "{:?}", cancel.frame);
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "cancelled", "{view}");
    // Past two claim lifetimes, still without SIGCONT.
    tokio::time::sleep(Duration::from_millis(2 * CLAIM_TTL_MS)).await;
    wait_groups_empty(
        &[child.pid],
        Duration::from_secs(10),
        "the stopped validation child's group, without a SIGCONT",
    )
    .await;
    let response = tokio::time::timeout(Duration::from_secs(10), submitted)
        .await
        .expect("the submission is answered once its child is gone")
        .unwrap();
    eprintln!("the submission of the cancelled run: {:?}", response.frame);
    let _ = nix::sys::signal::kill(Pid::from_raw(child.pid as i32), Signal::SIGCONT);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (outcome, error) = submission_outcome(&server, "sub-1");
    assert_eq!(outcome, "rejected", "{error:?}");
    assert!(
        validations(&server)
            .iter()
            .all(|(what, _, _)| what == "started"),
        "the stopped child never reached its verdict"
    );
    let db = server.db();
    let attempts: Vec<String> = db
        .prepare(
            "SELECT node_id || ':' || COALESCE(outcome, '-') FROM node_attempts WHERE run_id = ?1",
        )
        .unwrap()
        .query_map([&run_id], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(attempts, ["a:cancelled"], "only the cancel ended the step");
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// A graceful server stop while a validation child is SIGSTOPped: the
/// server ends the child (it would otherwise hold the submission's command
/// in flight, and the stop, until its 6-minute bound), exits within its
/// bound, and leaves no member of the child's group; the next server
/// settles the submission (none stays `validating`) and the run goes on
/// waiting for its step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stop_ends_a_sigstopped_validation_child_and_the_next_server_settles_its_submission()
 {
    let mut server = TestServer::start();
    let mut client = server.client().await;
    let (run_id, coordinator) = waiting_for_submission(&server, &mut client, 300).await;
    let spec = submit_spec(&server, &run_id, &coordinator, "sub-1");
    let submitted = tokio::spawn(async move { client.request(&spec).await });
    let (_, _, pid) = wait_for(Duration::from_secs(30), "the validation child", || {
        validations(&server).into_iter().next()
    })
    .await;
    let child = server::process::identity(pid).expect("the validation child runs");
    signal(&child, Signal::SIGSTOP);
    let stopping = Instant::now();
    server.stop();
    let took = stopping.elapsed();
    eprintln!("the server stopped {took:?} after SIGTERM");
    assert!(
        took < Duration::from_secs(6),
        "the stop waited for a stopped child: {took:?}"
    );
    wait_groups_empty(
        &[child.pid],
        Duration::from_secs(2),
        "the stopped validation child's group",
    )
    .await;
    let _ = submitted.await;
    let _ = nix::sys::signal::kill(Pid::from_raw(child.pid as i32), Signal::SIGCONT);

    server.spawn().expect("the server starts again");
    let mut client = server.client().await;
    wait_for(SETTLE_TIMEOUT, "the submission to be settled", || {
        (submission_outcome(&server, "sub-1").0 != "validating").then_some(())
    })
    .await;
    let settled = submission_outcome(&server, "sub-1");
    eprintln!("the submission after the restart: {settled:?}");
    let view = view(&mut client, &run_id).await;
    match settled.0.as_str() {
        // The stop ended the child before a verdict: the step still waits.
        "rejected" => assert_eq!(status(&view), "waiting", "{view}"),
        // The next server's child validated it: the run goes on.
        "accepted" => {
            let view = wait_settled(&mut client, &run_id).await;
            assert_eq!(status(&view), "completed", "{view}");
        }
        other => panic!("submission {other}"),
    }
    assert!(
        validations(&server)
            .iter()
            .filter(|(what, _, _)| what == "verdict")
            .all(|(_, _, pid)| *pid != child.pid),
        "the stopped child never reached its verdict"
    );
    let db = server.db();
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

const TOKEN: &str = "987654:FAKE-telegram-token-never-shown";

/// A server with one Telegram profile (`ops`) whose adapter talks to `telegram`.
fn channel_server(telegram: &support::telegram::FakeTelegram) -> TestServer {
    use std::os::unix::fs::PermissionsExt as _;
    let mut server = TestServer::new(&[
        ("PI_WORKFLOWS_CHANNEL_POLL_MS", "50"),
        (
            "PI_WORKFLOWS_CHANNEL_ADAPTER",
            env!("CARGO_BIN_EXE_pi-workflows-telegram-adapter"),
        ),
    ]);
    let dir = server.home.join("channels");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let token_file = server.scratch().join("ops.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = dir.join("channels.json");
    std::fs::write(
        &config,
        json!({"telegram": {"ops": {
            "tokenFile": token_file, "allowedUserIds": ["4242"], "allowedChatIds": ["4242"],
            "audiences": ["operators"], "apiBase": telegram.base(),
        }}})
        .to_string(),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    server.spawn().expect("the server starts");
    server
}

/// The running adapter child of the server (its command name starts
/// `pi-workflows-te`), once `channel.status` says it runs.
async fn running_adapter(server: &TestServer, client: &mut Client, not: &[u32]) -> ProcessIdentity {
    let server_pid = server.pid();
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let status = client
            .request(&RequestSpec::read("channel.status", None, json!({})))
            .await
            .unwrap();
        let running = status
            .receipt
            .as_ref()
            .is_some_and(|receipt| receipt["channels"][0]["state"] == "running");
        let adapter = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .find_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                let name = stat.split_once('(')?.1.split_once(')')?.0;
                let parent: u32 = stat.split_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
                (parent == server_pid && name.starts_with("pi-workflows-te") && !not.contains(&pid))
                    .then_some(pid)
            });
        if let (true, Some(pid)) = (running, adapter)
            && let Some(identity) = server::process::identity(pid)
        {
            return identity;
        }
        assert!(
            Instant::now() < deadline,
            "no running adapter: {:?}",
            status.frame
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The channel adapter: SIGKILLed at a seeded point it is replaced by one
/// new adapter (a new epoch); SIGSTOPped and then reloaded, it is killed
/// while stopped and replaced; SIGSTOPped at a graceful server stop, it is
/// killed too. None is left (the adapter runs no children; it is checked
/// by its exact identity, pid and start time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_adapter_sigkilled_or_sigstopped_is_replaced_once_and_none_is_left() {
    let mut points =
        Points::of("a_channel_adapter_sigkilled_or_sigstopped_is_replaced_once_and_none_is_left");
    let kill_after = points.between(0, 500);
    eprintln!("point: SIGKILL the running adapter {kill_after} ms after it reports running");
    let telegram = support::telegram::FakeTelegram::start(TOKEN);
    let mut server = channel_server(&telegram);
    let mut client = server.client().await;
    let first = running_adapter(&server, &mut client, &[]).await;
    tokio::time::sleep(Duration::from_millis(kill_after)).await;
    signal(&first, Signal::SIGKILL);
    let second = running_adapter(&server, &mut client, &[first.pid]).await;
    assert!(!server::process::is_alive(&first));

    signal(&second, Signal::SIGSTOP);
    let reloaded = server.cli(&["channel", "reload"]);
    assert!(reloaded.status.success(), "{reloaded:?}");
    let third = running_adapter(&server, &mut client, &[first.pid, second.pid]).await;
    wait_for(
        Duration::from_secs(5),
        "the stopped adapter to be gone without a SIGCONT",
        || (!server::process::is_alive(&second)).then_some(()),
    )
    .await;
    let _ = nix::sys::signal::kill(Pid::from_raw(second.pid as i32), Signal::SIGCONT);
    let adapters = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
                stat.contains("(pi-workflows-te")
                    && stat
                        .split_once(") ")
                        .and_then(|(_, rest)| rest.split(' ').nth(1))
                        == Some(server.pid().to_string().as_str())
            })
        })
        .count();
    assert_eq!(adapters, 1, "one adapter runs after the reload");

    signal(&third, Signal::SIGSTOP);
    drop(client);
    let stopping = Instant::now();
    server.stop();
    eprintln!("the server stopped {:?} after SIGTERM", stopping.elapsed());
    assert!(stopping.elapsed() < Duration::from_secs(6));
    wait_for(
        Duration::from_secs(2),
        "the stopped adapter to be gone after the server's stop",
        || (!server::process::is_alive(&third)).then_some(()),
    )
    .await;
}

/// The pending request of `run_id`: (interaction id, attempt id, the
/// attempt's generation).
fn pending_request(db: &rusqlite::Connection, run_id: &str) -> Option<(String, String, i64)> {
    db.query_row(
        "SELECT i.interaction_id, i.attempt_id, a.generation FROM interactive_requests i JOIN node_attempts a USING (attempt_id) WHERE i.run_id = ?1 AND i.status = 'pending' ORDER BY a.generation DESC LIMIT 1",
        [run_id],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )
    .ok()
}

/// The `interaction.submit` and `interaction.update` a headless step's Pi
/// bridge sends with its runner's authority (`pi-bridge.ts`).
fn bridge_requests(
    run_id: &str,
    request: &(String, String, i64),
    authority: &Value,
    call: &str,
) -> [RequestSpec; 2] {
    let (interaction_id, attempt_id, _) = request;
    [
        RequestSpec::command(
            "interaction.update",
            Some(run_id),
            json!({"interactionId": interaction_id, "attemptId": attempt_id, "toolCallId": format!("tc-{call}"),
                   "authority": authority, "update": {"type": "progress", "key": call, "data": {"call": call}}}),
        ),
        RequestSpec::command(
            "interaction.submit",
            Some(run_id),
            json!({"interactionId": interaction_id, "attemptId": attempt_id, "submissionId": format!("sub-{call}"),
                   "authority": authority, "output": {"by": call}}),
        ),
    ]
}

/// A headless agent step's Pi (the registered stand-in, in a group of its
/// own) and its runner SIGSTOPped together until the runner's claim
/// expired, then the Pi continued: the bridge writes it sends with the old
/// runner's authority (an update and a submission) are refused and store
/// nothing; once the runner is continued it exits and both groups are
/// empty; exactly one new runner asks again, and its Pi's submission is
/// validated, accepted and completes the step once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headless_pi_stopped_with_its_runner_past_the_claim_cannot_write_when_continued() {
    let server = TestServer::start_with(&[("PI_WORKFLOWS_STOP_GRACE_MS", "10000")]);
    let script = write_script(
        server.scratch(),
        "headless.json",
        &json!({
            "workflowName": "headless",
            "topology": {"startAt": "a",
                         "nodes": [{"id": "a", "nodeType": "agent", "timeout": {"kind": "none"}, "mountPath": []}],
                         "edges": [], "mounts": []},
            "nodes": {"a": [{
                "spawnChild": {"sleepSeconds": 1000, "newGroup": true},
                "then": {"interact": {"prompt": "Write it.",
                                      "headless": {"awaitFile": "accepted", "then": {"finish": {"a": "done"}}}}}
            }]},
            "validate": {"record": "validations.log"},
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();
    let (runner, pi, first) = wait_for(
        Duration::from_secs(30),
        "the headless step's request",
        || {
            let runner = runner_identity(&db, &run_id, 1)?;
            let pi = registered(&db).into_iter().next()?;
            Some((runner, pi, pending_request(&db, &run_id)?))
        },
    )
    .await;
    let old_epoch: String = db
        .query_row(
            "SELECT runner_epoch FROM run_workers WHERE run_id = ?1 AND generation = 1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    let old_authority = json!({"kind": "runner", "generation": 1, "runnerEpoch": old_epoch});
    signal(&runner, Signal::SIGSTOP);
    signal(&pi, Signal::SIGSTOP);
    wait_for(
        Duration::from_secs(15),
        "recovery of the expired claim",
        || {
            (count(
                &db,
                "SELECT generation FROM leases WHERE run_id = ?1",
                [&run_id],
            ) >= 2)
                .then_some(())
        },
    )
    .await;

    // The Pi is continued and its bridge writes with the old authority.
    signal(&pi, Signal::SIGCONT);
    for spec in bridge_requests(&run_id, &first, &old_authority, "stale") {
        let refused = client.request(&spec).await.unwrap();
        eprintln!(
            "{} with the fenced runner's authority: {:?}",
            spec.operation, refused.frame
        );
        assert_ne!(refused.outcome, "accepted", "{:?}", refused.frame);
    }
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM interactive_submissions WHERE interaction_id = ?1",
            [&first.0]
        ),
        0,
        "a stale submission was stored"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM workflow_updates WHERE run_id = ?1",
            [&run_id]
        ),
        0,
        "a stale update was published"
    );
    assert!(
        validations(&server).is_empty(),
        "a stale submission was validated"
    );

    // The runner continued takes its pending SIGTERM; both groups empty.
    signal(&runner, Signal::SIGCONT);
    wait_groups_empty(
        &[runner.pid, pi.pid],
        Duration::from_secs(10),
        "the fenced runner's and its Pi's groups",
    )
    .await;

    // Exactly one new runner asks again; its Pi's submission completes the step.
    let (second, new_epoch) = wait_for(SETTLE_TIMEOUT, "the new runner's request", || {
        let request = pending_request(&db, &run_id).filter(|request| request.2 >= 2)?;
        let epoch: String = db
            .query_row(
                "SELECT runner_epoch FROM run_workers WHERE run_id = ?1 AND generation = ?2",
                rusqlite::params![run_id, request.2],
                |row| row.get(0),
            )
            .ok()?;
        Some((request, epoch))
    })
    .await;
    let requests: Vec<String> = db
        .prepare("SELECT i.status || ':' || a.status FROM interactive_requests i JOIN node_attempts a USING (attempt_id) WHERE i.run_id = ?1 ORDER BY a.generation")
        .unwrap()
        .query_map([&run_id], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    eprintln!("the run's requests (request:attempt status): {requests:?}");
    let authority = json!({"kind": "runner", "generation": second.2, "runnerEpoch": new_epoch});
    let [update, submit] = bridge_requests(&run_id, &second, &authority, "fresh");
    let updated = client.request(&update).await.unwrap();
    assert_eq!(updated.outcome, "accepted", "{:?}", updated.frame);
    let submitted = client.request(&submit).await.unwrap();
    assert_eq!(submitted.outcome, "accepted", "{:?}", submitted.frame);
    assert_eq!(
        submitted.receipt.as_ref().unwrap()["outcome"],
        "accepted",
        "{:?}",
        submitted.frame
    );
    std::fs::write(server.scratch().join("accepted"), b"yes").unwrap();
    let view = wait_view(&mut client, &run_id, SETTLE_TIMEOUT, |view| {
        status(view) == "completed"
    })
    .await;
    assert_eq!(status(&view), "completed", "{view}");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
            [&run_id]
        ),
        2,
        "one runner before the stop, exactly one after"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1 AND status = 'finished'",
            [&run_id]
        ),
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM interactive_submissions s JOIN interactive_requests i USING (interaction_id) WHERE i.run_id = ?1",
            [&run_id]
        ),
        1,
        "only the new Pi's submission"
    );
    assert_eq!(
        validations(&server)
            .iter()
            .filter(|(what, _, _)| what == "started")
            .count(),
        1
    );
    let requests: Vec<String> = db
        .prepare("SELECT i.status || ':' || a.status FROM interactive_requests i JOIN node_attempts a USING (attempt_id) WHERE i.run_id = ?1 ORDER BY a.generation")
        .unwrap()
        .query_map([&run_id], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        !requests
            .iter()
            .any(|request| request.starts_with("pending")),
        "a request of the completed run is still pending: {requests:?}"
    );
    wait_quiescent(&db).await;
    assert_eq!(count(&db, "SELECT COUNT(*) FROM runner_processes", []), 0);
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}
