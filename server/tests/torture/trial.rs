//! One torture trial: the workload until the crash, the restart, the
//! workload until everything finished, and the checks (module doc of
//! `main.rs`).

use super::pi;
use super::rng::Rng;
use super::support::*;
use super::workload::{self, KEYED_LOG, Kind, Lane, PLAIN_LOG, SHELL_LOG};
use pi_workflows_client::{Connection as Client, RequestSpec};
use rusqlite::Connection;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The crash points of `PI_WORKFLOWS_FAULT` a trial cycles through, with
/// the range its count is drawn from (every count in the range is reached
/// by the workload's commits, spawns, commands, replies, terminal commits,
/// decisions or fused steps). The retention points (`tree_*`) need a
/// retention sweep and are covered by `retention.rs`.
const POINTS: [(&str, u64, u64); 10] = [
    ("before_commit", 3, 160),
    ("after_commit", 3, 160),
    ("before_spawn", 1, 28),
    ("after_spawn", 1, 28),
    ("after_receipt", 1, 29),
    ("after_reply", 1, 30),
    ("before_terminal_message", 1, 22),
    ("decision_before_commit", 1, 3),
    ("before_fused_commit", 1, 70),
    ("after_fused_commit", 1, 70),
];

/// The crash points of the Pi lane and their ranges (its six workflows
/// make fewer commits, spawns and commands; no decisions).
const PI_POINTS: [(&str, u64, u64); 9] = [
    ("before_commit", 3, 120),
    ("after_commit", 3, 120),
    ("before_spawn", 1, 8),
    ("after_spawn", 1, 8),
    ("after_receipt", 1, 6),
    ("after_reply", 1, 7),
    ("before_terminal_message", 1, 6),
    ("before_fused_commit", 1, 16),
    ("after_fused_commit", 1, 16),
];

/// The latest random kill moment after the server is ready.
const LATEST_KILL_MS: u64 = 3000;
/// The same for the Pi lane, whose runners and Pi start slower.
const PI_LATEST_KILL_MS: u64 = 8000;

/// How long every workflow has to finish after the restart.
const STUCK_AFTER: Duration = Duration::from_secs(60);

/// Where and when a trial's server dies.
#[derive(Clone, Debug)]
pub(crate) enum Crash {
    /// `PI_WORKFLOWS_FAULT=<point>:<count>`.
    Fault(&'static str, u64),
    /// SIGKILL from outside this many milliseconds after the ready line.
    At(u64),
}

impl Crash {
    /// The crash of trial `trial`: the lane's named points in turn, after
    /// them (every eleventh, every tenth in the Pi lane) a random moment.
    pub(crate) fn of(lane: Lane, seed: u64, trial: u64) -> Self {
        let mut rng = Rng::for_trial(seed, trial);
        let (points, latest): (&[(&'static str, u64, u64)], u64) = match lane {
            Lane::Scripted => (&POINTS, LATEST_KILL_MS),
            Lane::Pi => (&PI_POINTS, PI_LATEST_KILL_MS),
        };
        match points.get((trial % (points.len() as u64 + 1)) as usize) {
            Some((point, low, high)) => Crash::Fault(point, rng.between(*low, *high)),
            None => Crash::At(rng.below(latest + 1)),
        }
    }
}

impl fmt::Display for Crash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Crash::Fault(point, count) => write!(f, "PI_WORKFLOWS_FAULT={point}:{count}"),
            Crash::At(ms) => write!(f, "SIGKILL at {ms} ms"),
        }
    }
}

/// What a sent command was for.
#[derive(Clone, Copy, Debug)]
enum Purpose {
    Start(usize),
    Answer(usize),
    Restart(usize),
    Recover,
}

/// A command the client sent, and the receipt it got (if the reply came).
struct Sent {
    purpose: Purpose,
    spec: RequestSpec,
    receipt: Option<Value>,
}

struct Workflow {
    kind: Kind,
    script: PathBuf,
    started: bool,
    /// The first run (from the `run.start` receipt).
    root: Option<String>,
    /// Whether the answer or restart that makes the follow-on was sent.
    followed: bool,
    /// The continuation or the restarted run.
    follow_on: Option<String>,
}

impl Workflow {
    /// The run whose completion ends the workflow.
    fn last(&self) -> Option<&String> {
        if self.kind.has_follow_on() {
            self.follow_on.as_ref()
        } else {
            self.root.as_ref()
        }
    }
}

struct Driver {
    lane: Lane,
    dir: PathBuf,
    client_id: String,
    client: Option<Client>,
    workflows: Vec<Workflow>,
    sent: Vec<Sent>,
    /// The (effect, attempt) pairs an `effect.recover` was sent for.
    recovered: BTreeSet<(String, i64)>,
}

/// The connection broke (the server died).
struct Lost;

fn run_status(db: &Connection, run_id: &str) -> String {
    db.query_row(
        "SELECT status FROM runs WHERE run_id = ?1",
        [run_id],
        |row| row.get(0),
    )
    .unwrap_or_default()
}

impl Driver {
    fn new(lane: Lane, dir: &Path, rng: &mut Rng) -> Self {
        let workflows = (0..lane.workflows())
            .map(|index| Workflow {
                kind: lane.kind(index),
                script: workload::write_script(dir, lane, index, rng),
                started: false,
                root: None,
                followed: false,
                follow_on: None,
            })
            .collect();
        Self {
            lane,
            dir: dir.to_path_buf(),
            client_id: format!("torture-{}", server::ids::random_hex::<4>()),
            client: None,
            workflows,
            sent: Vec::new(),
            recovered: BTreeSet::new(),
        }
    }

    async fn connect(&mut self, server: &TestServer) -> Result<(), Lost> {
        self.client = Some(
            Client::connect(&server.socket(), &self.client_id)
                .await
                .map_err(|_| Lost)?,
        );
        Ok(())
    }

    fn take_receipt(&mut self, purpose: Purpose, receipt: &Value) {
        let field = |name: &str| {
            receipt[name]
                .as_str()
                .unwrap_or_else(|| panic!("{purpose:?}: no {name} in {receipt}"))
                .to_owned()
        };
        match purpose {
            Purpose::Start(index) => self.workflows[index].root = Some(field("runId")),
            Purpose::Answer(index) => {
                self.workflows[index].follow_on = Some(field("continuationRunId"))
            }
            Purpose::Restart(index) => self.workflows[index].follow_on = Some(field("newRunId")),
            Purpose::Recover => {}
        }
    }

    /// Sends one command; every command of the workload is accepted.
    async fn send(&mut self, purpose: Purpose, spec: RequestSpec) -> Result<(), Lost> {
        let client = self.client.as_mut().ok_or(Lost)?;
        let response = client.request(&spec).await;
        let receipt = match &response {
            Ok(response) => {
                assert_eq!(
                    response.outcome, "accepted",
                    "{purpose:?} {}: {}",
                    spec.operation, response.frame
                );
                response.receipt.clone()
            }
            Err(_) => None,
        };
        if let Some(receipt) = &receipt {
            self.take_receipt(purpose, receipt);
        }
        self.sent.push(Sent {
            purpose,
            spec,
            receipt,
        });
        if response.is_err() {
            self.client = None;
            return Err(Lost);
        }
        Ok(())
    }

    /// One pass over the workflows: start the unstarted, answer waiting
    /// checkpoints and decisions, restart failed runs, and (`recover`)
    /// recover ambiguous effects as an operator would.
    async fn pass(&mut self, db: &Connection, recover: bool) -> Result<(), Lost> {
        for index in 0..self.workflows.len() {
            let workflow = &self.workflows[index];
            if !workflow.started {
                let project = match self.lane {
                    Lane::Scripted => PathBuf::from("/tmp"),
                    Lane::Pi => workload::project_dir(&self.dir),
                };
                let spec = RequestSpec::command(
                    "run.start",
                    None,
                    json!({"workflow": workflow.script.to_string_lossy(), "input": {"workflow": index},
                           "executionMode": "headless", "projectPath": project.to_string_lossy()}),
                );
                self.workflows[index].started = true;
                self.send(Purpose::Start(index), spec).await?;
                continue;
            }
            let Some(root) = workflow.root.clone() else {
                continue;
            };
            if !workflow.followed {
                let spec = match workflow.kind {
                    Kind::Checkpoint if run_status(db, &root) == "waiting" => {
                        Some(RequestSpec::command(
                            "checkpoint.answer",
                            Some(&root),
                            json!({"answer": {"approved": true}}),
                        ))
                    }
                    Kind::Decision => db
                        .query_row(
                            "SELECT decision_id, request_digest FROM human_decisions WHERE run_id = ?1 AND state = 'pending'",
                            [&root],
                            |row| Ok((row.get::<_, String>(0)?, row.get::<_, Vec<u8>>(1)?)),
                        )
                        .ok()
                        .map(|(decision_id, digest)| {
                            RequestSpec::command(
                                "decision.answer",
                                Some(&root),
                                json!({"decisionId": decision_id, "requestDigest": format!("sha256:{}", hex::encode(digest)),
                                       "choice": "approve", "input": null,
                                       "source": {"channel": "cli", "actorId": "torture"}}),
                            )
                        }),
                    Kind::Restart if run_status(db, &root) == "failed" => {
                        std::fs::write(workload::restart_marker(&self.dir, index), b"go").unwrap();
                        Some(RequestSpec::command("run.restart", Some(&root), json!({})))
                    }
                    _ => None,
                };
                if let Some(spec) = spec {
                    let purpose = if workflow.kind == Kind::Restart {
                        Purpose::Restart(index)
                    } else {
                        Purpose::Answer(index)
                    };
                    self.workflows[index].followed = true;
                    self.send(purpose, spec).await?;
                }
            }
        }
        if recover {
            let plain = applications(&self.dir.join(PLAIN_LOG));
            let shell = shell_runs(&self.dir.join(SHELL_LOG));
            let ambiguous: Vec<(String, String, String, i64)> = db
                .prepare("SELECT effect_id, run_id, effect_type, attempt_number FROM effects WHERE state = 'ambiguous'")
                .unwrap()
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            for (effect_id, run_id, effect_type, attempt) in ambiguous {
                if !self.recovered.insert((effect_id.clone(), attempt)) {
                    continue;
                }
                // An idempotent external system takes the same key again;
                // for the other one the operator looks first.
                let action = match effect_type.as_str() {
                    "plain" if plain.contains_key(&(effect_id.clone(), attempt)) => "confirm",
                    "shell" if shell.contains_key(&run_id) => "confirm",
                    _ => "retry",
                };
                let spec = RequestSpec::command(
                    "effect.recover",
                    Some(&run_id),
                    json!({"effectId": effect_id, "action": action}),
                );
                self.send(Purpose::Recover, spec).await?;
            }
        }
        Ok(())
    }

    fn all_done(&self, db: &Connection) -> bool {
        self.workflows.iter().all(|workflow| {
            workflow
                .last()
                .is_some_and(|run| run_status(db, run) == "completed")
        })
    }

    /// Retries every sent command with a new request id on this
    /// connection: a command whose receipt arrived is adopted with that
    /// receipt; one whose reply was lost is adopted or executes now (its
    /// receipt is taken).
    async fn retry_all(&mut self, label: &str) {
        let client = self.client.as_mut().expect("connected");
        let mut taken = Vec::new();
        for (index, sent) in self.sent.iter().enumerate() {
            let response = request_as(client, &sent.spec, &fresh_request_id()).await;
            match &sent.receipt {
                Some(receipt) => {
                    assert_eq!(
                        response.outcome, "adopted",
                        "{label}: a sent receipt was not adopted: {:?} {}: {}",
                        sent.purpose, sent.spec.operation, response.frame
                    );
                    assert_eq!(
                        response.receipt.as_ref(),
                        Some(receipt),
                        "{label}: the adopted receipt differs from the sent one: {:?} {}",
                        sent.purpose,
                        sent.spec.operation
                    );
                }
                None => {
                    assert!(
                        matches!(response.outcome.as_str(), "accepted" | "adopted"),
                        "{label}: the retry of a command whose reply was lost: {:?} {}: {}",
                        sent.purpose,
                        sent.spec.operation,
                        response.frame
                    );
                    taken.push((index, response.receipt.expect("a receipt")));
                }
            }
        }
        for (index, receipt) in taken {
            self.take_receipt(self.sent[index].purpose, &receipt);
            self.sent[index].receipt = Some(receipt);
        }
    }
}

/// The applications an apply log records: (effect id, attempt) → times.
fn applications(path: &Path) -> BTreeMap<(String, i64), usize> {
    let mut seen = BTreeMap::new();
    for line in apply_lines(path) {
        let (effect_id, attempt) = line.split_once(' ').expect("<effectId> <attempt>");
        *seen
            .entry((effect_id.to_owned(), attempt.parse().unwrap()))
            .or_default() += 1;
    }
    seen
}

/// The shell actions' apply log: run id → its lines (`<runId>
/// <attemptId>`, one per application).
fn shell_runs(path: &Path) -> BTreeMap<String, Vec<String>> {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in apply_lines(path) {
        let (run_id, attempt_id) = line.split_once(' ').expect("<runId> <attemptId>");
        seen.entry(run_id.to_owned())
            .or_default()
            .push(attempt_id.to_owned());
    }
    seen
}

/// The state the crash left, read before the restart.
struct AtCrash {
    applying: Vec<String>,
    runners: Vec<server::process::ProcessIdentity>,
    receipts: usize,
    /// Agent steps whose submission was accepted: (run, interaction,
    /// accepted submission).
    accepted: Vec<(String, String, String)>,
}

fn at_crash(db: &Connection, driver: &Driver) -> AtCrash {
    let strings = |sql: &str| -> Vec<String> {
        db.prepare(sql)
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    AtCrash {
        applying: strings("SELECT effect_id FROM effects WHERE state = 'applying'"),
        runners: strings(
            "SELECT pid_start_identity FROM run_workers WHERE pid_start_identity IS NOT NULL",
        )
        .iter()
        .filter_map(|text| server::process::ProcessIdentity::decode(text))
        .collect(),
        receipts: driver.sent.iter().filter(|s| s.receipt.is_some()).count(),
        accepted: accepted_interactions(db),
    }
}

/// Every accepted agent-step interaction: (run, interaction, submission).
fn accepted_interactions(db: &Connection) -> Vec<(String, String, String)> {
    db.prepare("SELECT run_id, interaction_id, accepted_submission_id FROM interactive_requests WHERE status = 'accepted' ORDER BY run_id")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Runs trial `trial` of `seed` in `lane` (the Pi lane needs its parts);
/// panics on a failed check. Returns a one-line summary.
pub(crate) async fn run(lane: Lane, parts: Option<&pi::Parts>, seed: u64, trial: u64) -> String {
    let crash = Crash::of(lane, seed, trial);
    let mut rng = Rng::for_trial(seed ^ 0x746f_7274_7572_6521, trial);
    let mut server = match &crash {
        Crash::Fault(point, count) => {
            TestServer::new(&[("PI_WORKFLOWS_FAULT", &format!("{point}:{count}"))])
        }
        Crash::At(_) => TestServer::new(&[]),
    };
    let dir = server.scratch().to_path_buf();
    let rig = match lane {
        Lane::Scripted => None,
        Lane::Pi => {
            let parts = parts.expect("the Pi lane's parts");
            let rig = pi::Rig::start(parts, &dir);
            server.set_env("PI_WORKFLOWS_RUNNER", &parts.runner_command());
            server.set_env("PI_WORKFLOWS_PI", &rig.pi.to_string_lossy());
            // A loaded two-core box starts a node runner in seconds.
            server.set_env("PI_WORKFLOWS_CLAIM_TTL_MS", "3000");
            server.set_env("PI_WORKFLOWS_READY_TIMEOUT_MS", "30000");
            Some(rig)
        }
    };
    let mut driver = Driver::new(lane, &dir, &mut rng);
    let label = format!("{lane:?} lane seed {seed:#x} trial {trial} ({crash})");

    // Until the crash.
    let mut reached = true;
    if server.spawn().is_ok() {
        let killer = match crash {
            Crash::At(ms) => {
                let pid = nix::unistd::Pid::from_raw(server.pid() as i32);
                Some(std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(ms));
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                }))
            }
            Crash::Fault(..) => None,
        };
        let began = Instant::now();
        let mut done_at: Option<Instant> = None;
        let _ = driver.connect(&server).await;
        let db = server.db();
        while server.is_running() {
            if driver.client.is_some() && driver.pass(&db, false).await.is_err() {
                // The server is dying.
                assert!(
                    server.wait_exit(SETTLE_TIMEOUT),
                    "{label}: the connection broke and the server lives on"
                );
                break;
            }
            if killer.is_none() {
                // An armed count the workload never reaches: kill it once
                // every workflow finished (or after a generous bound).
                if done_at.is_none() && driver.all_done(&db) {
                    done_at = Some(Instant::now());
                }
                if done_at.is_some_and(|at| at.elapsed() > Duration::from_secs(1))
                    || began.elapsed() > SETTLE_TIMEOUT
                {
                    reached = false;
                    server.kill();
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(killer) = killer {
            killer.join().unwrap();
        }
        server.kill();
    }
    let crashed = at_crash(&server.db(), &driver);

    // A new server recovers from committed state alone.
    server.remove_env("PI_WORKFLOWS_FAULT");
    if let Err(error) = server.spawn() {
        let holders = lock_holders(&server.home.join("host").join("server.lock"));
        panic!("{label}: the server restarts: {error}; the lock file is open in {holders:?}");
    }
    driver
        .connect(&server)
        .await
        .unwrap_or_else(|_| panic!("{label}: reconnect"));
    driver
        .retry_all(&format!("{label}, after the restart"))
        .await;
    let db = server.db();

    // Every effect that was applying when the server died becomes
    // ambiguous: its application may or may not have happened.
    for effect_id in &crashed.applying {
        let state = wait_for(SETTLE_TIMEOUT, "the applying effect's recovery", || {
            let state: String = db
                .query_row(
                    "SELECT state FROM effects WHERE effect_id = ?1",
                    [effect_id],
                    |row| row.get(0),
                )
                .unwrap();
            (state != "applying").then_some(state)
        })
        .await;
        assert_eq!(
            state, "ambiguous",
            "{label}: effect {effect_id} was applying at the crash"
        );
    }

    // Until everything finished.
    let restarted = Instant::now();
    while !driver.all_done(&db) {
        if restarted.elapsed() > STUCK_AFTER {
            stuck(&mut driver, &db, &label).await;
        }
        let _ = driver.pass(&db, true).await;
        assert!(
            driver.client.is_some(),
            "{label}: the restarted server died"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let finished_in = restarted.elapsed();
    wait_quiescent(&db).await;
    driver.retry_all(&format!("{label}, at the end")).await;
    check(&driver, &db, &label);
    if let Some(rig) = &rig {
        check_agent_steps(&driver, &db, &crashed, &label);
        // No runner, shell command or Pi of this trial outlives its work.
        let leftovers: Vec<String> = [
            format!("PI_WORKFLOWS_HOME={}", server.home.display()),
            format!("PI_CODING_AGENT_DIR={}", rig.agent_dir.display()),
        ]
        .iter()
        .flat_map(|needle| pi::processes_with_env(needle, server.pid()))
        .collect();
        assert_eq!(
            leftovers,
            Vec::<String>::new(),
            "{label}: processes left once every runner exit is recorded"
        );
    }
    assert_eq!(consistency_violations(&db), Vec::<String>::new(), "{label}");
    for identity in &crashed.runners {
        assert!(
            !server::process::is_alive(identity),
            "{label}: runner {} of the crashed server is still alive",
            identity.pid
        );
    }
    let ambiguous = driver
        .sent
        .iter()
        .filter(|s| matches!(s.purpose, Purpose::Recover))
        .count();
    format!(
        "{crash}{}: {} of {} receipt(s) before the crash, {} applying, {ambiguous} ambiguous recovered, finished {:.1} s after the restart",
        if reached { "" } else { " unreached" },
        crashed.receipts,
        driver.sent.len(),
        crashed.applying.len(),
        finished_in.as_secs_f64()
    )
}

/// The processes that have `lock` open (pid, state and command line from
/// `/proc`): who holds the server lock when a restart is refused.
fn lock_holders(lock: &Path) -> Vec<String> {
    let mut holders = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == lock))
        {
            let read = |name: &str| {
                std::fs::read_to_string(entry.path().join(name))
                    .unwrap_or_default()
                    .replace('\0', " ")
            };
            let state = read("stat")
                .rsplit(')')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
            holders.push(format!(
                "{} {state} {}",
                entry.file_name().to_string_lossy(),
                read("cmdline").trim()
            ));
        }
    }
    holders
}

/// Fails the trial: a workflow did not finish within `STUCK_AFTER` of the
/// restart. Each unfinished run is named with the reason its view states.
async fn stuck(driver: &mut Driver, db: &Connection, label: &str) {
    let mut lines = Vec::new();
    let client = driver.client.as_mut().expect("connected");
    for (index, workflow) in driver.workflows.iter().enumerate() {
        if workflow
            .last()
            .is_some_and(|run| run_status(db, run) == "completed")
        {
            continue;
        }
        for run in [&workflow.root, &workflow.follow_on].into_iter().flatten() {
            if run_status(db, run) == "completed" {
                continue;
            }
            let view = view(client, run).await;
            let reason = view["display"]["reason"].as_str().unwrap_or_default();
            lines.push(format!(
                "workflow {index} ({:?}) run {run}: {} {}",
                workflow.kind,
                status(&view),
                if reason.is_empty() {
                    "STUCK WITHOUT A STATED REASON".to_owned()
                } else {
                    format!("(stated: {reason})")
                }
            ));
        }
        if workflow.root.is_none() {
            lines.push(format!("workflow {index}: never started"));
        }
    }
    panic!(
        "{label}: not every workflow finished within {} s of the restart:\n{}",
        STUCK_AFTER.as_secs(),
        lines.join("\n")
    );
}

/// The checks on the finished state (module doc of `main.rs`).
fn check(driver: &Driver, db: &Connection, label: &str) {
    // One run per workflow and follow-on, each with exactly its nodes.
    let follow_ons = driver
        .workflows
        .iter()
        .filter(|w| w.kind.has_follow_on())
        .count();
    assert_eq!(
        count(db, "SELECT COUNT(*) FROM runs", []) as usize,
        driver.lane.workflows() + follow_ons,
        "{label}: one run per workflow and follow-on"
    );
    for (index, workflow) in driver.workflows.iter().enumerate() {
        let (first, second) = workflow.kind.results();
        let runs = [
            (workflow.root.as_ref(), first),
            (workflow.follow_on.as_ref(), second),
        ];
        for (run, expected) in runs {
            let Some(run) = run else {
                assert!(expected.is_empty(), "{label}: workflow {index} lost a run");
                continue;
            };
            let mut finished: Vec<String> = db
                .prepare("SELECT node_id || ':' || outcome FROM node_attempts WHERE run_id = ?1 AND status = 'finished'")
                .unwrap()
                .query_map([run], |row| row.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            finished.sort();
            let mut expected: Vec<String> = expected.iter().map(|s| (*s).to_owned()).collect();
            expected.sort();
            assert_eq!(
                finished, expected,
                "{label}: workflow {index} ({:?}) run {run}: the step results",
                workflow.kind
            );
        }
    }

    // Effects: every one applied, its final attempt in its log, no attempt
    // applied twice, no non-idempotent effect applied twice.
    let keyed = applications(&driver.dir.join(KEYED_LOG));
    let plain = applications(&driver.dir.join(PLAIN_LOG));
    let shell = shell_runs(&driver.dir.join(SHELL_LOG));
    // A shell action has no external key: applied exactly once per run.
    for (run_id, attempts) in &shell {
        assert_eq!(
            attempts.len(),
            1,
            "{label}: the shell action of run {run_id} was applied {} times (visits {attempts:?})",
            attempts.len()
        );
    }
    for (log, applied) in [("keyed", &keyed), ("plain", &plain)] {
        for ((effect_id, attempt), times) in applied {
            assert_eq!(
                *times, 1,
                "{label}: {log} effect {effect_id} attempt {attempt} applied {times} times"
            );
        }
    }
    let mut plain_effects: BTreeMap<&str, usize> = BTreeMap::new();
    for (effect_id, _) in plain.keys() {
        *plain_effects.entry(effect_id).or_default() += 1;
    }
    for (effect_id, times) in &plain_effects {
        assert_eq!(
            *times,
            1,
            "{label}: the non-idempotent effect {effect_id} was applied {times} times (attempts {:?})",
            plain
                .keys()
                .filter(|(id, _)| id == effect_id)
                .collect::<Vec<_>>()
        );
    }
    let effects: Vec<(String, String, String, i64, String)> = db
        .prepare("SELECT effect_id, effect_type, state, attempt_number, run_id FROM effects")
        .unwrap()
        .query_map([], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let effect_runs = driver
        .workflows
        .iter()
        .map(|w| match w.kind {
            Kind::KeyedEffect
            | Kind::PlainEffect
            | Kind::Checkpoint
            | Kind::Decision
            | Kind::ShellAgent
            | Kind::Shell => 1,
            Kind::Compute | Kind::Restart => 0,
        })
        .sum::<usize>();
    assert_eq!(
        effects.len(),
        effect_runs,
        "{label}: one effect per effect step"
    );
    for (effect_id, effect_type, state, attempt, run_id) in &effects {
        assert_eq!(state, "applied", "{label}: effect {effect_id}");
        if effect_type == "shell" {
            assert!(
                shell.contains_key(run_id),
                "{label}: the shell action of run {run_id} is applied but not in its apply log"
            );
            continue;
        }
        let log = if effect_type == "keyed" {
            &keyed
        } else {
            &plain
        };
        assert!(
            log.contains_key(&(effect_id.clone(), *attempt)),
            "{label}: applied effect {effect_id} attempt {attempt} is not in its apply log"
        );
    }
    // Every application the logs record belongs to a stored effect.
    let stored: BTreeSet<&str> = effects.iter().map(|(id, ..)| id.as_str()).collect();
    for (effect_id, _) in keyed.keys().chain(plain.keys()) {
        assert!(
            stored.contains(effect_id.as_str()),
            "{label}: effect {effect_id} was applied but is not stored"
        );
    }
    let shell_effect_runs: BTreeSet<&str> = effects
        .iter()
        .filter(|(_, effect_type, ..)| effect_type == "shell")
        .map(|(.., run_id)| run_id.as_str())
        .collect();
    for run_id in shell.keys() {
        assert!(
            shell_effect_runs.contains(run_id.as_str()),
            "{label}: run {run_id} applied a shell action that is not stored"
        );
    }
}

/// The agent steps (Pi lane): each `ShellAgent` run has exactly one
/// accepted interaction with exactly one accepted submission, the agent
/// node finished once with the model's output, and an interaction accepted
/// before the crash is the one that counts (not lost, not asked again).
fn check_agent_steps(driver: &Driver, db: &Connection, crashed: &AtCrash, label: &str) {
    let accepted = accepted_interactions(db);
    for (index, workflow) in driver.workflows.iter().enumerate() {
        if workflow.kind != Kind::ShellAgent {
            continue;
        }
        let run = workflow.root.as_ref().expect("started");
        let of_run: Vec<&(String, String, String)> =
            accepted.iter().filter(|(r, ..)| r == run).collect();
        assert_eq!(
            of_run.len(),
            1,
            "{label}: workflow {index} run {run}: accepted agent interactions {of_run:?}"
        );
        let submissions = count(
            db,
            "SELECT COUNT(*) FROM interactive_submissions s JOIN interactive_requests r USING (interaction_id) WHERE r.run_id = ?1 AND s.outcome = 'accepted'",
            [run],
        );
        assert_eq!(
            submissions, 1,
            "{label}: workflow {index} run {run}: accepted submissions of its agent step"
        );
        let output: String = db
            .query_row(
                "SELECT CAST(b.bytes AS TEXT) FROM node_attempts a JOIN blobs b ON b.digest = a.output_digest WHERE a.run_id = ?1 AND a.node_id = 'review' AND a.status = 'finished'",
                [run],
                |row| row.get(0),
            )
            .unwrap_or_else(|error| panic!("{label}: run {run}: the review's output: {error}"));
        assert_eq!(
            serde_json::from_str::<Value>(&output).unwrap(),
            json!({"verdict": workload::VERDICT}),
            "{label}: run {run}: the agent step's output is the accepted submission"
        );
    }
    for before in &crashed.accepted {
        assert!(
            accepted.contains(before),
            "{label}: the agent interaction accepted before the crash {before:?} is not the one that counts: {accepted:?}"
        );
    }
}
