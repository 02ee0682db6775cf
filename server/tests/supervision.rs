//! Runner supervision through real process trees: stopping a runner that
//! ignores SIGTERM, a changed workflow source, a runner that exits before
//! progress, and the capacity limit.

mod support;

use nix::sys::signal::killpg;
use nix::unistd::Pid;
use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::{Value, json};
use server::process::ProcessIdentity;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};
use support::*;

/// Whether no live (non-zombie) process is in process group `pgid`. A
/// zombie is dead; it stays visible to `kill(0)` until its new parent reaps
/// it, so `/proc` is scanned instead.
fn group_is_empty(pgid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return killpg(Pid::from_raw(pgid as i32), None).is_err();
    };
    !entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(server::process::stat)
        .any(|stat| stat.process_group == pgid && stat.state != 'Z')
}

/// Cancelling a run whose runner ignores SIGTERM: the server sends SIGTERM
/// to the runner's group, then SIGKILL after the stop grace, and reaps the
/// registered child in its own group; no process of the tree is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_ignores_sigterm_is_killed_with_its_whole_group() {
    const GRACE_MS: u64 = 1000;
    let server = TestServer::start_with(&[("PI_WORKFLOWS_STOP_GRACE_MS", "1000")]);
    let script = write_script(
        server.scratch(),
        "stubborn.json",
        &json!({
            "workflowName": "stubborn",
            "topology": linear_topology(&["a"]),
            "startup": {"ignoreSigterm": true},
            "nodes": {"a": [{
                "spawnChild": {"sleepSeconds": 1000, "newGroup": true},
                "then": {"spawnChild": {"sleepSeconds": 1000, "newGroup": false},
                         "then": {"stall": true}}
            }]}
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();
    let (runner, children) = wait_for(Duration::from_secs(10), "two registered children", || {
        let runner = runner_identity(&db, &run_id, 1)?;
        let children: Vec<ProcessIdentity> = db
            .prepare("SELECT start_identity FROM runner_processes ORDER BY registered_at_ms")
            .unwrap()
            .query_map([], |row| row.get::<_, String>(0))
            .unwrap()
            .filter_map(|text| ProcessIdentity::decode(&text.unwrap()))
            .collect();
        (children.len() == 2).then_some((runner, children))
    })
    .await;
    let groups: Vec<u32> = children
        .iter()
        .map(|child| server::process::stat(child.pid).unwrap().process_group)
        .collect();
    assert_eq!(
        groups[0], children[0].pid,
        "the first child leads its own group"
    );
    assert_eq!(
        groups[1], runner.pid,
        "the second child is in the runner's group"
    );
    for process in children.iter().chain([&runner]) {
        assert!(server::process::is_alive(process));
    }

    let cancelled = Instant::now();
    let watched: Vec<ProcessIdentity> = children.iter().cloned().chain([runner.clone()]).collect();
    let watcher = std::thread::spawn(move || {
        let mut gone = vec![None; watched.len()];
        let start = Instant::now();
        while gone.iter().any(Option::is_none) && start.elapsed() < Duration::from_secs(6) {
            for (index, process) in watched.iter().enumerate() {
                if gone[index].is_none() && !server::process::is_alive(process) {
                    gone[index] = Some(start.elapsed());
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        gone
    });
    let response = client
        .request(&RequestSpec::command(
            "run.cancel",
            Some(&run_id),
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    wait_for(
        Duration::from_millis(GRACE_MS + 2000),
        "every process of the tree to be gone within the stop grace",
        || {
            let all_gone = children
                .iter()
                .chain([&runner])
                .all(|process| !server::process::is_alive(process));
            (all_gone && group_is_empty(runner.pid) && group_is_empty(children[0].pid))
                .then_some(())
        },
    )
    .await;
    let elapsed = cancelled.elapsed();
    eprintln!(
        "the process tree was gone {elapsed:?} after the cancel: {:?}",
        watcher.join().unwrap()
    );
    // SIGTERM really was ignored: the kill needed the SIGKILL escalation.
    let epoch: String = db
        .query_row(
            "SELECT runner_epoch FROM run_workers WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    let log = std::fs::read_to_string(server.home.join("host/logs").join(format!("{epoch}.log")))
        .unwrap();
    assert!(log.contains("SIGTERM received and ignored"), "{log}");
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "cancelled");
    wait_quiescent(&db).await;
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM runner_processes", []),
        0,
        "the registry is empty once the children are reaped"
    );
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// A run paused mid-node whose script file is then edited: on resume the
/// new runner reports `workflowSourceChanged` before running anything; the
/// run is parked for review (its display reason names the source), it is
/// not admitted again on its own, and no node of the edited script ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_workflow_source_parks_the_run_for_review() {
    let server = TestServer::start();
    let original = json!({
        "workflowName": "editable",
        "topology": linear_topology(&["a", "b"]),
        "nodes": {"a": [{"sleepMs": 30000, "then": {"finish": {"a": 1}}}]}
    });
    let script = write_script(server.scratch(), "editable.json", &original);
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();
    wait_for(Duration::from_secs(10), "node a to start", || {
        let started = count(
            &db,
            "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind = 'nodeStarted'",
            [&run_id],
        );
        (started == 1).then_some(())
    })
    .await;
    let pause = client
        .request(&RequestSpec::command("run.pause", Some(&run_id), json!({})))
        .await
        .unwrap();
    assert_eq!(pause.outcome, "accepted", "{:?}", pause.frame);
    wait_view(&mut client, &run_id, Duration::from_secs(10), |view| {
        status(view) == "paused"
    })
    .await;
    wait_quiescent(&db).await;

    // Every node of the edited script would leave a marker.
    let marker = |node: &str| json!([{"effect": {"type": "marker", "request": {"node": node}, "applyLog": "edited.log"}}]);
    let mut edited = original.clone();
    edited["nodes"] = json!({"a": marker("a"), "b": marker("b")});
    write_script(server.scratch(), "editable.json", &edited);
    let attempts_before = count(
        &db,
        "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1",
        [&run_id],
    );

    let resume = client
        .request(&RequestSpec::command(
            "run.resume",
            Some(&run_id),
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(resume.outcome, "accepted", "{:?}", resume.frame);
    let view = wait_view(&mut client, &run_id, Duration::from_secs(10), |view| {
        view["display"]["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("source"))
    })
    .await;
    assert_eq!(view["status"]["run"], "running", "{view}");
    assert_eq!(view["status"]["queue"], "parked", "{view}");
    assert_eq!(view["status"]["paused"], false, "{view}");
    assert_ne!(
        view["display"]["status"], "paused",
        "a parked queue is not paused: {view}"
    );
    assert!(
        view["display"]["controls"]
            .as_array()
            .unwrap()
            .contains(&json!("resume")),
        "{view}"
    );
    let park_reason: String = db
        .query_row(
            "SELECT park_reason FROM runs WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(park_reason, "workflowSourceChanged");
    let workers = count(
        &db,
        "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
        [&run_id],
    );
    assert_eq!(
        workers, 2,
        "one runner before the pause, one after the resume"
    );
    // Not admitted again on its own.
    tokio::time::sleep(Duration::from_millis(CLAIM_TTL_MS + 1000)).await;
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
            [&run_id]
        ),
        workers,
        "a run parked for review was admitted again"
    );
    // No node of the edited script ran.
    assert!(!server.scratch().join("edited.log").exists());
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1",
            [&run_id],
        ),
        attempts_before,
        "no attempt started after the resume"
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM effects", []), 0);
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// A runner that exits right after `runner.ready` parks the run with
/// `runnerNoProgress`; the run is not claimed again on its own (its
/// generation and runner count hold still), and one explicit `run.resume`
/// makes exactly one new attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_exits_before_progress_parks_and_is_not_claimed_again() {
    let server = TestServer::start();
    let script = write_script(
        server.scratch(),
        "quitter.json",
        &json!({
            "workflowName": "quitter",
            "topology": linear_topology(&["a"]),
            "startup": {"exitAfterReady": 0}
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();
    let park_reason = || -> Option<String> {
        db.query_row(
            "SELECT park_reason FROM runs WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .ok()
        .flatten()
    };
    let facts = || {
        (
            count(
                &db,
                "SELECT generation FROM leases WHERE run_id = ?1",
                [&run_id],
            ),
            count(
                &db,
                "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
                [&run_id],
            ),
            count(
                &db,
                "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1",
                [&run_id],
            ),
        )
    };
    wait_for(Duration::from_secs(10), "the runnerNoProgress park", || {
        (park_reason().as_deref() == Some("runnerNoProgress")).then_some(())
    })
    .await;
    wait_quiescent(&db).await;
    let first = facts();
    assert_eq!(first.0, 1, "still generation 1");
    assert_eq!(first.1, 1, "one runner");
    let view = view(&mut client, &run_id).await;
    assert!(
        view["display"]["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("exited before the run made progress")),
        "{view}"
    );
    tokio::time::sleep(Duration::from_millis(CLAIM_TTL_MS + 1500)).await;
    assert_eq!(facts(), first, "the run was claimed again without a resume");

    let resume = client
        .request(&RequestSpec::command(
            "run.resume",
            Some(&run_id),
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(resume.outcome, "accepted", "{:?}", resume.frame);
    wait_for(Duration::from_secs(10), "the second runner's park", || {
        let (_, workers, _) = facts();
        (workers == 2 && park_reason().as_deref() == Some("runnerNoProgress")).then_some(())
    })
    .await;
    wait_quiescent(&db).await;
    let second = facts();
    assert_eq!(second.1, 2, "exactly one new runner");
    assert_eq!(second.2, first.2 + 1, "exactly one new attempt");
    tokio::time::sleep(Duration::from_millis(CLAIM_TTL_MS + 1500)).await;
    assert_eq!(
        facts(),
        second,
        "claimed again after the resumed runner exited"
    );
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// 20 concurrent starts with `PI_WORKFLOWS_MAX_WORKERS=2` and nodes that
/// take ~200 ms: sampled every few milliseconds, never more than 2 runner
/// epochs are live (`launching|ready`) and never more than 2 recorded runner
/// processes are alive; the durable launch/exit intervals never overlap by
/// more than 2; all 20 complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_limit_holds_under_twenty_concurrent_starts() {
    const RUNS: usize = 20;
    const MAX: i64 = 2;
    // The production claim lifetime: this test is about capacity, and a
    // disk stall longer than the tests' 1.5 s claims would expire a live
    // claim and hand its run to a second runner.
    let server = TestServer::start_with(&[
        ("PI_WORKFLOWS_MAX_WORKERS", "2"),
        ("PI_WORKFLOWS_CLAIM_TTL_MS", "30000"),
    ]);
    let script = write_script(
        server.scratch(),
        "sleepy.json",
        &json!({
            "workflowName": "sleepy",
            "topology": linear_topology(&["a"]),
            "nodes": {"a": [{"sleepMs": 200}]}
        }),
    );

    // The sampler: live runner epochs and alive recorded runner processes.
    let done = Arc::new(AtomicBool::new(false));
    let max_rows = Arc::new(AtomicI64::new(0));
    let max_processes = Arc::new(AtomicI64::new(0));
    let samples = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (done, max_rows, max_processes, samples) = (
            done.clone(),
            max_rows.clone(),
            max_processes.clone(),
            samples.clone(),
        );
        let path = server.home.join("state.sqlite");
        std::thread::spawn(move || {
            let db = rusqlite::Connection::open_with_flags(
                &path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .unwrap();
            while !done.load(Ordering::SeqCst) {
                let live = count(
                    &db,
                    "SELECT COUNT(*) FROM run_workers WHERE status IN ('launching', 'ready')",
                    [],
                );
                let alive = db
                    .prepare("SELECT pid_start_identity FROM run_workers WHERE pid_start_identity IS NOT NULL")
                    .unwrap()
                    .query_map([], |row| row.get::<_, String>(0))
                    .unwrap()
                    .filter_map(|text| ProcessIdentity::decode(&text.unwrap()))
                    .filter(server::process::is_alive)
                    .count() as i64;
                max_rows.fetch_max(live, Ordering::SeqCst);
                max_processes.fetch_max(alive, Ordering::SeqCst);
                samples.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };

    let mut starts = Vec::new();
    for index in 0..RUNS {
        let socket = server.socket();
        let script = script.clone();
        starts.push(tokio::spawn(async move {
            let mut client = Client::connect(&socket, &format!("cap-{index}"))
                .await
                .unwrap();
            started(&mut client, &script).await
        }));
    }
    let mut run_ids = Vec::new();
    for start in starts {
        run_ids.push(start.await.unwrap());
    }
    let mut client = server.client().await;
    for run_id in &run_ids {
        let view = wait_view(&mut client, run_id, SETTLE_TIMEOUT, |view| {
            status(view) == "completed"
        })
        .await;
        assert_eq!(status(&view), "completed");
    }
    let db = server.db();
    wait_quiescent(&db).await;
    done.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    let (rows, processes) = (
        max_rows.load(Ordering::SeqCst),
        max_processes.load(Ordering::SeqCst),
    );
    eprintln!(
        "{} samples: at most {rows} live runner epochs and {processes} alive runner processes",
        samples.load(Ordering::SeqCst)
    );
    assert!(samples.load(Ordering::SeqCst) > 100, "the sampler ran");
    assert!(rows <= MAX, "{rows} live runner epochs at once");
    assert!(
        processes <= MAX,
        "{processes} runner processes alive at once"
    );
    assert_eq!(
        rows, MAX,
        "the limit was reached (so the test saw contention)"
    );

    // The durable record agrees: launch/exit intervals overlap at most 2 deep.
    let mut edges: Vec<(i64, i64)> = Vec::new();
    let intervals: Vec<(i64, i64)> = db
        .prepare("SELECT launched_at_ms, finished_at_ms FROM run_workers")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(intervals.len(), RUNS, "one runner per run");
    for (launched, finished) in intervals {
        edges.push((launched, 1));
        edges.push((finished, -1));
    }
    // An exit and a launch in the same millisecond: the exit comes first.
    edges.sort();
    let mut depth = 0;
    for (_, step) in edges {
        depth += step;
        assert!(depth <= MAX, "{depth} runner epochs overlapped");
    }
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// A run parked for review (`runnerNoProgress`, `workflowSourceChanged`)
/// keeps the closed display status `queued`, but its view, its run-list row
/// and the CLI's `runs` table say that it will not start on its own, that it
/// needs an explicit resume or cancel, and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_parked_for_review_says_it_needs_an_explicit_resume_or_cancel_and_why() {
    const NEEDS: &str = "Needs an explicit resume or cancel";
    let server = TestServer::start();
    let quitter = write_script(
        server.scratch(),
        "quitter.json",
        &json!({"workflowName": "quitter", "topology": linear_topology(&["a"]), "startup": {"exitAfterReady": 0}}),
    );
    let source = json!({
        "workflowName": "editable",
        "topology": linear_topology(&["a"]),
        "nodes": {"a": [{"stall": true}]}
    });
    let editable = write_script(server.scratch(), "editable.json", &source);
    let mut client = server.client().await;
    let no_progress = started(&mut client, &quitter).await;
    let changed = started(&mut client, &editable).await;
    wait_view(&mut client, &changed, Duration::from_secs(10), |view| {
        status(view) == "running"
    })
    .await;
    let pause = client
        .request(&RequestSpec::command(
            "run.pause",
            Some(&changed),
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(pause.outcome, "accepted", "{:?}", pause.frame);
    write_script(
        server.scratch(),
        "editable.json",
        &json!({"topology": linear_topology(&["b"])}),
    );
    let resume = client
        .request(&RequestSpec::command(
            "run.resume",
            Some(&changed),
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(resume.outcome, "accepted", "{:?}", resume.frame);

    let parked =
        |view: &Value| view["status"]["queue"] == "parked" && view["display"]["reason"].is_string();
    let mut rows = Vec::new();
    for (run_id, why) in [
        (
            &no_progress,
            "the runner exited before the run made progress",
        ),
        (
            &changed,
            "the workflow source changed since the run started",
        ),
    ] {
        let view = wait_view(&mut client, run_id, Duration::from_secs(10), parked).await;
        assert_eq!(
            status(&view),
            "queued",
            "the closed status set is kept: {view}"
        );
        let reason = view["display"]["reason"].as_str().unwrap();
        assert!(reason.starts_with(NEEDS), "{reason}");
        assert!(
            reason.contains("will not start again on its own"),
            "{reason}"
        );
        assert!(reason.contains(why), "{reason}");
        let controls = &view["display"]["controls"];
        assert!(
            controls.as_array().unwrap().contains(&json!("resume"))
                && controls.as_array().unwrap().contains(&json!("cancel")),
            "{view}"
        );
        rows.push((run_id.clone(), reason.to_owned()));
    }
    let list = client
        .request(&RequestSpec::read("runs.list", None, json!({})))
        .await
        .unwrap()
        .receipt
        .unwrap();
    for (run_id, reason) in &rows {
        let row = list["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["runId"] == run_id.as_str())
            .unwrap();
        assert_eq!(row["display"]["reason"], reason.as_str(), "{row}");
    }
    let table = server.command().arg("runs").output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    for (run_id, _) in &rows {
        let line = table
            .lines()
            .find(|line| line.starts_with(run_id.as_str()))
            .unwrap_or_else(|| panic!("{run_id} in {table}"));
        assert!(line.contains(&format!("queued · {NEEDS}")), "{line}");
    }
}

/// A runner message that fails a protocol check — a frame that is not a
/// runner message (schema), a wrong `expectedRevision` (revision), a result
/// for an attempt the server never dispatched (attempt), a message id reused
/// with another payload (idempotency) — is `protocolRejected`: the message
/// changes nothing, the runner is stopped, and the run is parked for an
/// explicit resume or cancel with a reason that names the failed check. It
/// is not reported as a crash, as no progress, or as a node failure, and it
/// is not admitted again on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_message_that_fails_a_protocol_check_parks_the_run_as_protocol_rejected() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let db = server.db();
    for check in ["schema", "revision", "attempt", "idempotency"] {
        let script = write_script(
            server.scratch(),
            &format!("{check}.json"),
            &json!({
                "workflowName": format!("violates-{check}"),
                "topology": linear_topology(&["a", "b"]),
                "nodes": {"a": [{"protocolViolation": check}]}
            }),
        );
        let run_id = started(&mut client, &script).await;
        let view = wait_view(&mut client, &run_id, Duration::from_secs(10), |view| {
            view["status"]["queue"] == "parked" || status(view) == "completed"
        })
        .await;
        let park_reason: Option<String> = db
            .query_row(
                "SELECT park_reason FROM runs WHERE run_id = ?1",
                [&run_id],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(
            park_reason.as_deref(),
            Some("protocolRejected"),
            "{check}: {view}"
        );
        assert_eq!(status(&view), "queued", "{check}: {view}");
        let reason = view["display"]["reason"].as_str().unwrap_or_default();
        assert!(
            reason.starts_with("Needs an explicit resume or cancel")
                && reason.contains(&format!("failed the protocol's {check} check"))
                && reason.contains("protocolRejected"),
            "{check}: {reason}"
        );
        assert!(
            view["display"]["controls"]
                .as_array()
                .unwrap()
                .contains(&json!("resume")),
            "{check}: {view}"
        );
        let event: String = db
            .query_row(
                "SELECT payload FROM events WHERE run_id = ?1 AND kind = 'protocolRejected'",
                [&run_id],
                |row| row.get(0),
            )
            .unwrap_or_else(|_| panic!("{check}: a protocolRejected event"));
        assert_eq!(
            serde_json::from_str::<Value>(&event).unwrap()["check"],
            check,
            "{check}"
        );
        wait_quiescent(&db).await;
        let outcome: String = db
            .query_row(
                "SELECT outcome FROM run_workers WHERE run_id = ?1",
                [&run_id],
                |row| row.get(0),
            )
            .unwrap();
        assert_ne!(outcome, "crashed", "{check}: not reported as a crash");
        assert_eq!(
            count(
                &db,
                "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind IN ('failed', 'nodeFinished', 'nodeFailed')",
                [&run_id]
            ),
            0,
            "{check}: the rejected message changed nothing"
        );
        assert_eq!(
            count(
                &db,
                "SELECT COUNT(*) FROM workflow_updates WHERE run_id = ?1 AND update_key = 'k' AND json_extract(data_json, '$.n') = 2",
                [&run_id]
            ),
            0,
            "{check}: the conflicting payload was not stored"
        );
        tokio::time::sleep(Duration::from_millis(CLAIM_TTL_MS + 500)).await;
        assert_eq!(
            count(
                &db,
                "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
                [&run_id]
            ),
            1,
            "{check}: not admitted again without a resume"
        );
    }
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// A busy runner that writes nothing for three claim lifetimes (a node that
/// sleeps 3 × the TTL) keeps its claim: the server's timer renews the claim
/// of a live runner that is not stopped, so the run is never recovered or
/// handed to a new generation. It stays at generation 1 with one runner and
/// completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_silent_runner_keeps_its_claim_for_three_ttls_and_completes() {
    let server = TestServer::start();
    let silent_ms = 3 * CLAIM_TTL_MS + 500;
    let script = write_script(
        server.scratch(),
        "silent.json",
        &json!({
            "workflowName": "silent",
            "topology": linear_topology(&["a", "b"]),
            "nodes": {"a": [{"sleepMs": silent_ms, "then": {"finish": {"a": 1}}}]}
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();
    let lease = || -> (i64, Option<i64>) {
        db.query_row(
            "SELECT generation, expires_at_ms FROM leases WHERE run_id = ?1",
            [&run_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap()
    };
    let started_at: i64 = wait_for(Duration::from_secs(10), "node a to start", || {
        db.query_row(
            "SELECT started_at_ms FROM node_attempts WHERE run_id = ?1 AND node_id = 'a'",
            [&run_id],
            |row| row.get(0),
        )
        .ok()
    })
    .await;
    // Sampled while the runner is silent: the claim never lapses, and it is
    // renewed past the lifetime it had when the node started.
    let mut latest_expiry = 0;
    let deadline = Instant::now() + Duration::from_millis(3 * CLAIM_TTL_MS);
    while Instant::now() < deadline {
        let (generation, expires_at) = lease();
        assert_eq!(generation, 1, "the run was handed to a new generation");
        let expires_at = expires_at.expect("the silent runner holds its claim");
        latest_expiry = latest_expiry.max(expires_at);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        latest_expiry > started_at + 2 * CLAIM_TTL_MS as i64,
        "the claim was renewed while the runner wrote nothing ({latest_expiry} vs node start {started_at})"
    );
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{view}");
    assert_eq!(lease().0, 1, "still generation 1");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
            [&run_id]
        ),
        1,
        "one runner"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind IN ('controlClaimed', 'parked')",
            [&run_id]
        ),
        0,
        "never recovered or parked"
    );
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// The runner start-up deadline (`PI_WORKFLOWS_READY_TIMEOUT_MS`) ends when
/// the runner's `runner.ready` frame arrives, not when the server has
/// committed it. A runner says ready 1 s into a 2 s deadline while a test
/// connection holds the state file's write lock (`BEGIN IMMEDIATE`, as a
/// disk stall would hold a commit) for 3.5 s: the ready commit lands after
/// the deadline, the runner is not killed, and the run completes with its
/// one runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_ready_in_time_is_not_killed_while_the_server_commits_it_late() {
    const DEADLINE_MS: i64 = 2000;
    const HELD_MS: u64 = 3500;
    let server = TestServer::start_with(&[
        ("PI_WORKFLOWS_READY_TIMEOUT_MS", "2000"),
        // Claims and the server lease outlive the held lock (this test is
        // about the start-up deadline, not a lost claim).
        ("PI_WORKFLOWS_CLAIM_TTL_MS", "30000"),
        ("PI_WORKFLOWS_SERVER_LEASE_MS", "30000"),
    ]);
    let script = write_script(
        server.scratch(),
        "late.json",
        &json!({
            "workflowName": "late",
            "topology": linear_topology(&["a"]),
            "startup": {"readyDelayMs": 1000},
            "nodes": {"a": [{"finish": {"a": true}}]}
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();
    // The deadline starts once the runner's process is recorded; the runner
    // waits 1 s before it says ready.
    wait_for(
        Duration::from_secs(10),
        "the runner's process record",
        || runner_identity(&db, &run_id, 1),
    )
    .await;
    let path = server.home.join("state.sqlite");
    let holder = std::thread::spawn(move || {
        let writer = rusqlite::Connection::open(&path).unwrap();
        writer.busy_timeout(Duration::from_secs(10)).unwrap();
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        std::thread::sleep(Duration::from_millis(HELD_MS));
        writer.execute_batch("ROLLBACK").unwrap();
    });
    holder.join().unwrap();
    // Completed, or parked (`runnerNoProgress` when the runner was killed).
    let view = wait_view(&mut client, &run_id, Duration::from_secs(60), |view| {
        status(view) == "completed" || view["status"]["queue"] == "parked"
    })
    .await;
    let (launched, ready, outcome): (i64, Option<i64>, Option<String>) = db
        .query_row(
            "SELECT launched_at_ms, ready_at_ms, outcome FROM run_workers WHERE run_id = ?1 AND generation = 1",
            [&run_id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap();
    assert_eq!(status(&view), "completed", "{view}");
    let ready = ready.expect("the runner's ready is recorded");
    assert!(
        ready - launched > DEADLINE_MS,
        "the ready commit was held past the deadline ({} ms after the launch)",
        ready - launched
    );
    assert_ne!(outcome.as_deref(), Some("timedOut"));
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
            [&run_id]
        ),
        1,
        "one runner"
    );
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// A fresh `run.start` runs its first generation in the process that
/// resolved it: the runner recorded for the run is the resolver, its log
/// (renamed to the runner epoch) holds both launches, and no resolver log is
/// left. A runner that does not offer to wait (`resolveOnly`) is ended after
/// its answer and the run gets a fresh process, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_start_runs_in_the_process_that_resolved_it() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let db = server.db();
    let logs_dir = server.home.join("host/logs");
    let runner_of = |run_id: &str| -> (String, u32) {
        db.query_row(
            "SELECT runner_epoch, pid FROM run_workers WHERE run_id = ?1",
            [run_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap()
    };
    let resolver_logs = || {
        std::fs::read_dir(&logs_dir)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("resolve-"))
            .count()
    };

    let handed = write_script(
        server.scratch(),
        "handed.json",
        &json!({ "topology": linear_topology(&["a", "b"]) }),
    );
    let run_id = started(&mut client, &handed).await;
    assert_eq!(
        status(&wait_settled(&mut client, &run_id).await),
        "completed"
    );
    let (epoch, pid) = runner_of(&run_id);
    let log = std::fs::read_to_string(logs_dir.join(format!("{epoch}.log"))).unwrap();
    let resolve_line = format!("scripted-runner[{pid}]: launched: mode resolve");
    let run_line = format!(
        "scripted-runner[{pid}]: launched: mode run, run {run_id}, generation 1, epoch {epoch}"
    );
    assert!(
        log.contains(&resolve_line) && log.contains(&run_line),
        "{log}"
    );
    assert_eq!(resolver_logs(), 0, "the resolver's log became the runner's");

    let separate = write_script(
        server.scratch(),
        "separate.json",
        &json!({ "topology": linear_topology(&["a", "b"]), "resolveOnly": true }),
    );
    let run_id = started(&mut client, &separate).await;
    assert_eq!(
        status(&wait_settled(&mut client, &run_id).await),
        "completed"
    );
    let (epoch, pid) = runner_of(&run_id);
    let log = std::fs::read_to_string(logs_dir.join(format!("{epoch}.log"))).unwrap();
    assert!(!log.contains("launched: mode resolve"), "{log}");
    assert!(
        log.contains(&format!("scripted-runner[{pid}]: launched: mode run")),
        "{log}"
    );
    assert_eq!(
        resolver_logs(),
        1,
        "the resolver that did not wait kept its own log"
    );
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// One durable commit per step (issue 12, item 2). The reply to a node's
/// result carries the next dispatch and, for a static timeout, the deadline
/// committed with the result (`next.deadline: committed {deadlineAtMs?}`:
/// dispatch time + the timeout; none for a node without one), so the runner
/// sends no `node.started` for it. A dynamic timeout is left to the runner
/// (`runnerResolves`), which reports it in `node.started`; so does the
/// generation's first node, which the `command` dispatches. Every message
/// that commits stores its runner-message receipt in its commit, so the
/// receipts count the commits: ready, a's start, five results and e's start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_is_one_commit_whose_reply_carries_the_next_dispatch_and_its_deadline() {
    let server = TestServer::start();
    let node = |id: &str, timeout: Value| json!({"id": id, "nodeType": "compute", "timeout": timeout, "mountPath": []});
    let mut topology = linear_topology(&["a", "b", "c", "d", "e"]);
    topology["nodes"] = json!([
        node("a", json!({"kind": "default"})),
        node("b", json!({"kind": "ms", "ms": 60_000})),
        node("c", json!({"kind": "default"})),
        node("d", json!({"kind": "none"})),
        node("e", json!({"kind": "dynamic"})),
    ]);
    let script = write_script(
        server.scratch(),
        "deadlines.json",
        &json!({
            "workflowName": "deadlines",
            "topology": topology,
            "nodes": {"e": [{"finish": {"e": true}, "timeoutMs": 45_000}]}
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{view}");
    let db = server.db();
    wait_quiescent(&db).await;
    let runner_epoch: String = db
        .query_row(
            "SELECT runner_epoch FROM run_workers WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();

    // The nodes the runner sent `node.started` for (its log names the node
    // it runs before each message of the attempt).
    let log = std::fs::read_to_string(
        server
            .home
            .join("host")
            .join("logs")
            .join(format!("{runner_epoch}.log")),
    )
    .unwrap();
    let mut running = String::new();
    let mut started_nodes = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("running node ").nth(1) {
            running = rest.split(' ').next().unwrap().to_owned();
        } else if line.contains("-> node.started ") {
            started_nodes.push(running.clone());
        }
    }
    assert_eq!(
        started_nodes,
        ["a", "e"],
        "node.started only for the generation's first node and a dynamic timeout:\n{log}"
    );

    // The attempt rows and the replies that dispatched them.
    let attempt = |node_id: &str| -> (i64, Option<i64>) {
        db.query_row(
            "SELECT started_at_ms, deadline_at_ms FROM node_attempts WHERE run_id = ?1 AND node_id = ?2",
            [&run_id, node_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap()
    };
    let replies: Vec<Value> = db
        .prepare("SELECT reply_json FROM worker_messages WHERE runner_epoch = ?1")
        .unwrap()
        .query_map([&runner_epoch], |row| row.get::<_, String>(0))
        .unwrap()
        .map(|json| serde_json::from_str(&json.unwrap()).unwrap())
        .collect();
    let dispatch_of = |node_id: &str| -> Value {
        replies
            .iter()
            .find(|reply| reply["next"]["nodeId"] == json!(node_id))
            .map(|reply| reply["next"].clone())
            .unwrap_or_else(|| panic!("no reply dispatched {node_id}: {replies:?}"))
    };
    let (b_started, b_deadline) = attempt("b");
    assert_eq!(b_deadline, Some(b_started + 60_000), "b: dispatch + 60 s");
    assert_eq!(
        dispatch_of("b")["deadline"],
        json!({"kind": "committed", "deadlineAtMs": b_deadline}),
    );
    let (c_started, c_deadline) = attempt("c");
    assert_eq!(c_deadline, Some(c_started + 15 * 60_000), "c: the default");
    assert_eq!(
        dispatch_of("c")["deadline"],
        json!({"kind": "committed", "deadlineAtMs": c_deadline}),
    );
    assert_eq!(attempt("d").1, None, "d has no deadline");
    assert_eq!(dispatch_of("d")["deadline"], json!({"kind": "committed"}));
    assert_eq!(
        dispatch_of("e")["deadline"],
        json!({"kind": "runnerResolves"})
    );
    let (e_started, e_deadline) = attempt("e");
    assert!(
        e_deadline.is_some_and(|deadline| deadline >= e_started + 45_000),
        "e: the runner's deadline from node.started ({e_deadline:?}, started {e_started})"
    );
    assert_eq!(
        replies.len(),
        8,
        "one commit per step: ready, a's start, five results, e's start: {replies:?}"
    );
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

/// The deadline a fused commit records is enforced without `node.started`:
/// the commit arms the server's deadline wake, which times the stalled node
/// out (and stops its runner) at dispatch time + its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_deadline_times_out_a_node_the_runner_never_reported_started() {
    const TIMEOUT_MS: i64 = 1500;
    let server = TestServer::start();
    let mut topology = linear_topology(&["a", "b"]);
    topology["nodes"][1]["timeout"] = json!({"kind": "ms", "ms": TIMEOUT_MS});
    let script = write_script(
        server.scratch(),
        "stalls.json",
        &json!({
            "workflowName": "stalls",
            "topology": topology,
            "nodes": {"b": [{"stall": true}]}
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "timed_out", "{view}");
    let db = server.db();
    wait_quiescent(&db).await;
    let (started_at, deadline, finished_at, outcome): (i64, Option<i64>, i64, String) = db
        .query_row(
            "SELECT started_at_ms, deadline_at_ms, finished_at_ms, outcome FROM node_attempts
             WHERE run_id = ?1 AND node_id = 'b'",
            [&run_id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .unwrap();
    assert_eq!(outcome, "timed_out");
    assert_eq!(deadline, Some(started_at + TIMEOUT_MS));
    assert!(finished_at >= started_at + TIMEOUT_MS, "{finished_at}");
    let runner_epoch: String = db
        .query_row(
            "SELECT runner_epoch FROM run_workers WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    let log = std::fs::read_to_string(
        server
            .home
            .join("host")
            .join("logs")
            .join(format!("{runner_epoch}.log")),
    )
    .unwrap();
    assert_eq!(
        log.matches("-> node.started ").count(),
        1,
        "only a reported its start:\n{log}"
    );
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}
