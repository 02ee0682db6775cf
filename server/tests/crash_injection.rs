//! Crash injection: the server SIGKILLs itself at a named point around its
//! commits, spawns and replies (`PI_WORKFLOWS_FAULT=<point>:<n>`), then a new
//! server recovers from committed state alone.
//!
//! Each test runs one real run with updates and managed effects (every real
//! application appends a line to an apply log) plus a second small run, and
//! checks after the restart that:
//! - the committed rows are consistent (`consistency_violations`);
//! - the run completes, or, when an effect was applying at the crash, is
//!   parked `ambiguous` with exactly that effect ambiguous and is not
//!   re-admitted on its own;
//! - no effect was applied twice, and no node result was recorded twice
//!   (each node of these linear runs has at most one, of its first visit);
//! - every receipt the client received before the crash is adopted by an
//!   exact retry (same key, new request id), and a command without a receipt
//!   can be retried and executes at most once;
//! - no resolver process of the crashed server outlives it, also one that
//!   was waiting for its run's launch (it reads EOF on its stdin and exits
//!   before the new server starts; nothing recorded it to reap).

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use support::*;

/// The run with effects: a (update, effect, finish) → b (update, effect,
/// update, finish) → c.
fn effect_script(dir: &Path) -> std::path::PathBuf {
    let effect = |name: &str, then: Value| {
        json!({"effect": {"type": name, "request": {"to": name}, "applyLog": "apply.log", "receipt": true},
               "then": then})
    };
    let update = |key: &str, then: Value| json!({"update": {"type": "progress", "key": key, "data": {"at": key}}, "then": then});
    write_script(
        dir,
        "effects.json",
        &json!({
            "workflowName": "effects",
            "topology": linear_topology(&["a", "b", "c"]),
            "nodes": {
                "a": [update("a1", effect("mail", json!({"sleepMs": 40, "then": {"finish": {"a": true}}})))],
                "b": [update("b1", effect("ticket", update("b2", json!({"finish": {"b": true}}))))],
                "c": [{"sleepMs": 40, "then": {"finish": {"c": true}}}],
            }
        }),
    )
}

fn start_spec(script: &Path, input: Value) -> RequestSpec {
    RequestSpec::command(
        "run.start",
        None,
        json!({ "workflow": script.to_string_lossy(), "input": input, "executionMode": "headless", "projectPath": "/tmp" }),
    )
}

/// What the client sent, and the receipt it got (if the reply arrived).
struct Sent {
    spec: RequestSpec,
    outcome: Option<String>,
    receipt: Option<Value>,
}

/// The resolver processes a server started: the process id in each line of
/// every `resolve-*.log` (a resolver handed its run has its log renamed to the
/// runner epoch, and counts as that runner), and whether the log says it
/// was waiting for its run's launch and never got it.
fn resolvers(server: &TestServer) -> Vec<(u32, bool)> {
    let Ok(entries) = std::fs::read_dir(server.home.join("host").join("logs")) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("resolve-"))
        .filter_map(|entry| {
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let pid = text
                .split("scripted-runner[")
                .nth(1)?
                .split(']')
                .next()?
                .parse()
                .ok()?;
            let waiting =
                text.contains("awaiting the run's launch") && !text.contains("launched: mode run");
            Some((pid, waiting))
        })
        .collect()
}

/// Runs one crash scenario at `fault` (`point:n`); returns the restarted
/// server, for checks of its own, and how many resolvers were waiting for
/// their run's launch when the server died.
async fn crash_and_recover(fault: &str) -> (TestServer, usize) {
    let mut server = TestServer::new(&[("PI_WORKFLOWS_FAULT", fault)]);
    server.spawn().expect("the server starts");
    let script = effect_script(server.scratch());
    let simple = script_path_linear(server.scratch());
    let apply_log = server.scratch().join("apply.log");

    // The client sends its commands until the server dies (or the runs end).
    let mut sent: Vec<Sent> = Vec::new();
    let client_id = format!("crash-{}", server::ids::random_hex::<4>());
    let specs = [
        start_spec(&script, json!({"task": "effects"})),
        start_spec(&simple, json!({"task": "simple"})),
    ];
    let mut crashed_before_commands = false;
    match Client::connect(&server.socket(), &client_id).await {
        Ok(mut client) => {
            for spec in specs {
                let response = client.request(&spec).await.ok();
                sent.push(Sent {
                    outcome: response.as_ref().map(|r| r.outcome.clone()),
                    receipt: response.and_then(|r| r.receipt),
                    spec,
                });
            }
        }
        Err(_) => {
            crashed_before_commands = true;
            sent.extend(specs.into_iter().map(|spec| Sent {
                spec,
                outcome: None,
                receipt: None,
            }));
        }
    }
    for command in &sent {
        if let Some(outcome) = &command.outcome {
            assert_eq!(outcome, "accepted", "before the crash: {fault}");
        }
    }

    // The fault fires before the runs end.
    assert!(
        server.wait_exit(SETTLE_TIMEOUT),
        "the server did not crash at {fault}"
    );
    {
        let db = server.db();
        let unfinished = count(
            &db,
            "SELECT COUNT(*) FROM runs WHERE status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')",
            [],
        );
        let runs = count(&db, "SELECT COUNT(*) FROM runs", []);
        assert!(
            crashed_before_commands || runs < 2 || unfinished > 0,
            "the crash at {fault} came after both runs ended; choose an earlier count"
        );
    }

    {
        let db = server.db();
        let states: Vec<String> = db
            .prepare("SELECT r.status || '/' || q.status FROM runs r JOIN run_queue q USING (run_id) ORDER BY r.created_at_ms")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let effects: Vec<String> = db
            .prepare("SELECT state FROM effects ORDER BY created_at_ms")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let receipts = sent.iter().filter(|c| c.receipt.is_some()).count();
        eprintln!(
            "{fault}: crashed with {receipts} receipt(s) received, runs {states:?}, effects {effects:?}"
        );
    }
    // A resolver left by the crash ends by itself: its stdin reached EOF.
    let left = resolvers(&server);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let alive: Vec<u32> = left
            .iter()
            .filter(|(pid, _)| {
                server::process::identity(*pid).is_some_and(|id| server::process::is_alive(&id))
            })
            .map(|(pid, _)| *pid)
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{fault}: resolver processes {alive:?} outlived the crashed server"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let waiting = left.iter().filter(|(_, waiting)| *waiting).count();
    let old_runners: Vec<server::process::ProcessIdentity> = server
        .db()
        .prepare("SELECT pid_start_identity FROM run_workers WHERE pid_start_identity IS NOT NULL")
        .unwrap()
        .query_map([], |row| row.get::<_, String>(0))
        .unwrap()
        .filter_map(|text| server::process::ProcessIdentity::decode(&text.unwrap()))
        .collect();

    // A new server recovers from committed state alone.
    server.remove_env("PI_WORKFLOWS_FAULT");
    server.spawn().expect("the server restarts");

    // Every receipt the client received is adopted by an exact retry from a
    // new connection; a command without a receipt executes at most once.
    let mut retry = Client::connect(&server.socket(), &client_id)
        .await
        .expect("reconnect");
    let mut run_ids = Vec::new();
    for command in &sent {
        let response = request_as(&mut retry, &command.spec, &fresh_request_id()).await;
        match &command.receipt {
            Some(receipt) => {
                assert_eq!(response.outcome, "adopted", "{fault}: {:?}", response.frame);
                assert_eq!(response.receipt.as_ref(), Some(receipt), "{fault}");
            }
            None => assert!(
                matches!(response.outcome.as_str(), "accepted" | "adopted"),
                "{fault}: {:?}",
                response.frame
            ),
        }
        let run_id = response.receipt.unwrap()["runId"]
            .as_str()
            .unwrap()
            .to_owned();
        // A second retry adopts the same receipt.
        let again = request_as(&mut retry, &command.spec, &fresh_request_id()).await;
        assert_eq!(again.outcome, "adopted", "{fault}");
        assert_eq!(again.receipt.unwrap()["runId"], json!(run_id), "{fault}");
        run_ids.push(run_id);
    }
    let db = server.db();
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM runs", []),
        2,
        "{fault}: one run per command"
    );

    // Each run completes, or is parked ambiguous because an effect was
    // applying when the server died.
    let mut client = server.client().await;
    for run_id in &run_ids {
        let view = wait_view(&mut client, run_id, SETTLE_TIMEOUT, |view| {
            matches!(status(view), "completed" | "ambiguous" | "failed")
        })
        .await;
        let ambiguous = count(
            &db,
            "SELECT COUNT(*) FROM effects WHERE run_id = ?1 AND state = 'ambiguous'",
            [run_id],
        );
        match status(&view) {
            "completed" => assert_eq!(ambiguous, 0, "{fault}: {view}"),
            "ambiguous" => {
                assert_eq!(ambiguous, 1, "{fault}: exactly the applying effect: {view}");
                assert_eq!(view["status"]["run"], "running", "{fault}: {view}");
                assert_eq!(view["status"]["queue"], "parked", "{fault}: {view}");
                // `effect.recover` is the way on, and the reason says so.
                assert_eq!(
                    view["display"]["controls"],
                    json!(["pause", "cancel", "recoverEffect"]),
                    "{fault}: {view}"
                );
                assert!(
                    view["display"]["reason"]
                        .as_str()
                        .is_some_and(|reason| reason.contains("effect.recover confirm")),
                    "{fault}: {view}"
                );
                // It stays parked: no runner is admitted on its own.
                let workers = || {
                    count(
                        &db,
                        "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
                        [run_id],
                    )
                };
                let before = workers();
                tokio::time::sleep(Duration::from_millis(CLAIM_TTL_MS + 500)).await;
                assert_eq!(
                    workers(),
                    before,
                    "{fault}: an ambiguous run was re-admitted"
                );
                assert_eq!(status(&view_now(&mut client, run_id).await), "ambiguous");
            }
            other => panic!("{fault}: the run ended {other}: {view}"),
        }
    }

    eprintln!(
        "{fault}: after the restart the runs ended {:?}",
        count_statuses(&db)
    );

    // No effect was applied twice; an applied effect was applied once.
    let mut applications: BTreeMap<String, usize> = BTreeMap::new();
    for line in apply_lines(&apply_log) {
        let effect_id = line.split(' ').next().unwrap().to_owned();
        *applications.entry(effect_id).or_default() += 1;
    }
    for (effect_id, times) in &applications {
        assert!(
            *times <= 1,
            "{fault}: effect {effect_id} applied {times} times"
        );
    }
    let effects: Vec<(String, String)> = db
        .prepare("SELECT effect_id, state FROM effects")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (effect_id, state) in &effects {
        let times = applications.get(effect_id).copied().unwrap_or(0);
        match state.as_str() {
            "applied" => assert_eq!(times, 1, "{fault}: applied effect {effect_id}"),
            "ambiguous" => assert!(times <= 1),
            other => panic!("{fault}: effect {effect_id} left {other}"),
        }
    }
    // A crash reruns only what may rerun: every node of these linear runs
    // has at most one result, of its first visit (an attempt the crash
    // abandoned reruns with the same visit; `consistency_violations` below
    // also refuses a visit with two results), and a completed run has one
    // for each of its nodes.
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM node_attempts WHERE status = 'finished' AND visit <> 1",
            []
        ),
        0,
        "{fault}: a node result of a later visit"
    );
    for run_id in &run_ids {
        let (workflow, run_status): (String, String) = db
            .query_row(
                "SELECT workflow_name, status FROM runs WHERE run_id = ?1",
                [run_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        if run_status == "completed" {
            let nodes = if workflow == "effects" { 3 } else { 2 };
            assert_eq!(
                count(
                    &db,
                    "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1 AND status = 'finished'",
                    [run_id]
                ),
                nodes,
                "{fault}: {workflow} has one result per node"
            );
        }
    }
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new(), "{fault}");
    // No runner process of the crashed server survived the recovery.
    for identity in &old_runners {
        assert!(
            !server::process::is_alive(identity),
            "{fault}: runner {} of the crashed server is still alive",
            identity.pid
        );
    }
    drop(db);
    (server, waiting)
}

fn count_statuses(db: &rusqlite::Connection) -> Vec<String> {
    db.prepare("SELECT r.status || '/' || q.status || ' ' || COALESCE(r.park_reason, '-') FROM runs r JOIN run_queue q USING (run_id) ORDER BY r.created_at_ms")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

async fn view_now(client: &mut Client, run_id: &str) -> Value {
    view(client, run_id).await
}

fn script_path_linear(dir: &Path) -> std::path::PathBuf {
    write_script(
        dir,
        "simple.json",
        &json!({"workflowName": "simple", "topology": linear_topology(&["x", "y"])}),
    )
}

// The counts of `before_commit`/`after_commit` include every write batch
// (timer renewals too; reads run on the reader thread and count none), so
// where exactly they land varies from run to run; two counts per point
// spread them over admission, runner messages and effects.
// `before_spawn`/`after_spawn` count runner spawns, and `after_reply` counts
// frames written to clients (1 is the first server hello, 2 the first
// `run.start` response).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_commit_early_then_restart_recovers() {
    crash_and_recover("before_commit:8").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_commit_mid_run_then_restart_recovers() {
    crash_and_recover("before_commit:16").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_commit_early_then_restart_recovers() {
    crash_and_recover("after_commit:8").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_commit_mid_run_then_restart_recovers() {
    crash_and_recover("after_commit:18").await;
}

// `before_fused_commit`/`after_fused_commit` count fused commits only (a
// node's result with the next attempt and its deadline: `node.finished`,
// `node.failed`, `notification.requested`): 1 is the first node's result
// (the effects run's `a` or the simple run's `x`, whichever finishes
// first), 3 a later one. Inside: the result and the dispatch are lost
// together and the node reruns; after: both are durable, the reply never
// reaches the runner, and the dispatched attempt reruns with its visit.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_inside_the_first_fused_commit_then_restart_recovers() {
    crash_and_recover("before_fused_commit:1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_the_first_fused_commit_then_restart_recovers() {
    let (server, _) = crash_and_recover("after_fused_commit:1").await;
    // The first result's commit dispatched the run's second node with its
    // deadline, and the runner never heard of it: the recovery abandoned
    // that attempt, and the next generation ran the node again with the
    // same visit and a deadline of its own.
    let db = server.db();
    let reruns: Vec<(String, i64, i64, i64)> = db
        .prepare(
            "SELECT lost.node_id, lost.visit, lost.generation, rerun.generation
             FROM node_attempts lost JOIN node_attempts rerun
               ON rerun.run_id = lost.run_id AND rerun.node_id = lost.node_id
              AND rerun.visit = lost.visit AND rerun.status = 'finished'
             WHERE lost.status = 'abandoned' AND lost.deadline_at_ms IS NOT NULL
               AND rerun.deadline_at_ms > lost.deadline_at_ms",
        )
        .unwrap()
        .query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        reruns.iter().any(
            |(node, visit, lost, rerun)| ["b", "y"].contains(&node.as_str())
                && *visit == 1
                && rerun > lost
        ),
        "the dispatched attempt was not rerun: {reruns:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_inside_a_later_fused_commit_then_restart_recovers() {
    crash_and_recover("before_fused_commit:3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_a_later_fused_commit_then_restart_recovers() {
    crash_and_recover("after_fused_commit:3").await;
}

/// The first run's admission takes its waiting resolver and the server dies
/// before handing it the launch: the resolver exits on EOF, and the new
/// server recovers the run with a fresh runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_the_first_runner_spawn_then_restart_recovers() {
    let (_, waiting) = crash_and_recover("before_spawn:1").await;
    assert!(
        waiting >= 1,
        "the first run's resolver waited for its launch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_the_second_runner_spawn_then_restart_recovers() {
    crash_and_recover("before_spawn:2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_a_runner_spawn_then_restart_recovers_and_reaps_it() {
    crash_and_recover("after_spawn:1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_the_first_start_reply_keeps_that_receipt_adoptable() {
    crash_and_recover("after_reply:2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_both_start_replies_keeps_both_receipts_adoptable() {
    crash_and_recover("after_reply:3").await;
}

/// One light scenario of a sweep: a server armed with `fault`, one
/// `run.start`, a crash (the armed point is reached within a second even
/// when idle: the epoch lease renewal commits every 200 ms), a restart, and
/// a retry of the command from a new connection. Returns whether the client
/// had received the receipt before the crash.
async fn sweep_one(fault: String) -> bool {
    let mut server = TestServer::new(&[("PI_WORKFLOWS_FAULT", &fault)]);
    let script = script_path_linear(server.scratch());
    let spec = start_spec(&script, json!({"sweep": fault}));
    let client_id = format!("sweep-{}", server::ids::random_hex::<4>());
    let mut receipt = None;
    if server.spawn().is_ok() {
        if let Ok(mut client) = Client::connect(&server.socket(), &client_id).await {
            receipt = request_as_or_lost(&mut client, &spec).await;
        }
        assert!(
            server.wait_exit(SETTLE_TIMEOUT),
            "{fault}: the server did not crash"
        );
    }
    server.remove_env("PI_WORKFLOWS_FAULT");
    server.spawn().expect("the server restarts");
    let mut retry = Client::connect(&server.socket(), &client_id).await.unwrap();
    let response = request_as(&mut retry, &spec, &fresh_request_id()).await;
    match &receipt {
        Some(receipt) => {
            assert_eq!(
                response.outcome, "adopted",
                "{fault}: a sent receipt was lost: {:?}",
                response.frame
            );
            assert_eq!(response.receipt.as_ref(), Some(receipt), "{fault}");
        }
        None => assert!(
            matches!(response.outcome.as_str(), "accepted" | "adopted"),
            "{fault}: {:?}",
            response.frame
        ),
    }
    assert_eq!(
        count(&server.db(), "SELECT COUNT(*) FROM runs", []),
        1,
        "{fault}: one run"
    );
    let run_id = response.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        status(&wait_settled(&mut retry, &run_id).await),
        "completed",
        "{fault}"
    );
    wait_quiescent_at(&server).await;
    assert_eq!(
        consistency_violations(&server.db()),
        Vec::<String>::new(),
        "{fault}"
    );
    receipt.is_some()
}

/// `run.start` whose response may never arrive: `None` when the connection
/// broke first.
async fn request_as_or_lost(client: &mut Client, spec: &RequestSpec) -> Option<Value> {
    let response = client.request(spec).await.ok()?;
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt
}

/// Sweeps `point` over the first commits (startup, the run.start's receipt
/// lookup and its commit, the admission), in parallel servers, so that one
/// of them dies exactly around the commit of the `run.start` receipt.
async fn sweep(point: &str) {
    let tasks: Vec<_> = (3..=9)
        .map(|n| tokio::spawn(sweep_one(format!("{point}:{n}"))))
        .collect();
    let mut with_receipt = 0;
    for task in tasks {
        with_receipt += usize::from(task.await.unwrap());
    }
    eprintln!("{point}: {with_receipt} of 7 scenarios crashed after the client had its receipt");
}

/// A crash before each of the first commits: a receipt the client received
/// is always adopted after the restart (it was committed before it was
/// sent), and a command without one executes at most once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_each_early_commit_keeps_every_sent_receipt_adoptable() {
    sweep("before_commit").await;
}

/// A crash after each of the first commits (before their replies): a
/// committed `run.start` whose reply never arrived is adopted by the retry,
/// never executed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_each_early_commit_never_executes_a_command_twice() {
    sweep("after_commit").await;
}

/// The deterministic ambiguous case: the server is SIGKILLed while the
/// runner is applying an effect (its reservation committed, its settlement
/// not). After the restart the run is parked `ambiguous` with exactly that
/// effect ambiguous, it is applied exactly once (never again on its own),
/// and the run is not re-admitted until someone recovers the effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_while_an_effect_is_applying_parks_the_run_ambiguous() {
    let mut server = TestServer::start();
    let script = write_script(
        server.scratch(),
        "slow-effect.json",
        &json!({
            "workflowName": "slow-effect",
            "topology": linear_topology(&["a", "b"]),
            "nodes": {"a": [{"effect": {"type": "mail", "request": {"to": "x"}, "applyLog": "apply.log", "applyMs": 1500}}]}
        }),
    );
    let apply_log = server.scratch().join("apply.log");
    let mut client = server.client().await;
    let client_id = client.client_id().to_owned();
    let spec = start_spec(&script, json!({"task": "slow"}));
    let started = client.request(&spec).await.unwrap();
    assert_eq!(started.outcome, "accepted");
    let run_id = started.receipt.clone().unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    {
        let db = server.db();
        wait_for(SETTLE_TIMEOUT, "the effect to be applying", || {
            let applying = count(
                &db,
                "SELECT COUNT(*) FROM effects WHERE run_id = ?1 AND state = 'applying'",
                [&run_id],
            );
            (applying == 1 && apply_lines(&apply_log).len() == 1).then_some(())
        })
        .await;
    }
    drop(client);
    server.kill();
    server.spawn().expect("the server restarts");

    let mut client = Client::connect(&server.socket(), &client_id)
        .await
        .expect("reconnect");
    let view = wait_view(&mut client, &run_id, SETTLE_TIMEOUT, |view| {
        status(view) != "running"
    })
    .await;
    assert_eq!(status(&view), "ambiguous", "{view}");
    assert_eq!(
        view["display"]["controls"],
        json!(["pause", "cancel", "recoverEffect"]),
        "an ambiguous run offers effect.recover: {view}"
    );
    let db = server.db();
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM effects WHERE run_id = ?1 AND state = 'ambiguous'",
            [&run_id],
        ),
        1
    );
    let workers = count(
        &db,
        "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
        [&run_id],
    );
    tokio::time::sleep(Duration::from_millis(CLAIM_TTL_MS + 1000)).await;
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
            [&run_id]
        ),
        workers,
        "an ambiguous run must not be re-admitted on its own"
    );
    assert_eq!(apply_lines(&apply_log).len(), 1, "applied exactly once");
    // The receipt of the start is still adoptable.
    let retry = request_as(&mut client, &spec, &fresh_request_id()).await;
    assert_eq!(retry.outcome, "adopted");
    assert_eq!(retry.receipt, started.receipt);
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}
