//! Black-box tests of `pi-workflows-scripted-runner`: each test plays a
//! minimal fake server over the runner's stdin/stdout, using the `protocol`
//! crate to encode what it sends and to decode (and so validate) every frame
//! the runner writes. Everything runs in temp dirs, with no network.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kernel::attempt::NodeOutcome;
use kernel::ids::NodeId;
use kernel::routing::{self, Route};
use kernel::topology::Topology;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use protocol::{
    ServerMessage, WorkerLaunch, canonicalize, decode_runner_frame, encode_launch, encode_server,
};
use serde_json::{Value, json};
use server::process::{self, ProcessIdentity};
use sha2::{Digest as _, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_pi-workflows-scripted-runner");
/// The longest a test waits for one frame or an exit.
const WAIT: Duration = Duration::from_secs(10);
const RUN: &str = "run-1";
const EPOCH: &str = "re-7";
const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts");

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn canonical_digest(value: &Value) -> String {
    sha256(&canonicalize(value).unwrap())
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A temp project directory holding scripts.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }

    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.file(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn script(&self, name: &str, script: &Value) -> PathBuf {
        self.write(name, serde_json::to_vec_pretty(script).unwrap().as_slice())
    }

    /// Copies an example script from `tests/scripts`.
    fn example(&self, name: &str) -> PathBuf {
        let bytes = std::fs::read(Path::new(EXAMPLES).join(name)).unwrap();
        self.write(name, &bytes)
    }

    fn launch(&self, mode: &str, generation: u64, extra: Value) -> Value {
        let mut launch = json!({
            "schema": "pi-workflows.worker-launch.v1",
            "protocolVersion": 1,
            "mode": mode,
            "runId": RUN,
            "generation": generation,
            "runnerEpoch": EPOCH,
            "projectPath": self.path().to_str().unwrap(),
        });
        for (key, value) in extra.as_object().unwrap() {
            launch[key] = value.clone();
        }
        launch
    }

    fn resolve_launch(&self, workflow: &str, input: Value) -> Value {
        self.launch(
            "resolve",
            1,
            json!({"resolve": {"workflow": workflow, "input": input}}),
        )
    }

    /// A run launch whose saved identity is the script's current bytes.
    fn run_launch(&self, script: &Path, generation: u64) -> Value {
        let bytes = std::fs::read(script).unwrap();
        let topology = serde_json::from_slice::<Value>(&bytes).unwrap()["topology"].clone();
        self.launch(
            "run",
            generation,
            json!({
                "workflowSource": {
                    "root": {"kind": "file", "path": script.to_str().unwrap(), "hash": sha256(&bytes)},
                    "mounted": [],
                },
                "definitionDigest": canonical_digest(&topology),
                "inputHash": canonical_digest(&json!({})),
            }),
        )
    }

    fn spawn(&self, launch: &Value) -> Runner {
        static SPAWNED: AtomicU64 = AtomicU64::new(0);
        let n = SPAWNED.fetch_add(1, Ordering::Relaxed);
        let log = self.path().join(format!("runner-{n}.log"));
        let mut child = Command::new(BIN)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, frames) = mpsc::channel();
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        let decoded = decode_runner_frame(&line)
                            .map(|message| serde_json::to_value(message).unwrap())
                            .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&line)));
                        if tx.send(decoded).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let typed: WorkerLaunch = serde_json::from_value(launch.clone()).unwrap();
        let mut bytes = encode_launch(&typed).unwrap();
        bytes.push(b'\n');
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&bytes).unwrap();
        Runner {
            child,
            stdin: Some(stdin),
            frames,
            log,
            envelope: Envelope::of(launch),
        }
    }
}

/// The run id, generation and runner epoch of the launch a runner runs.
#[derive(Debug)]
struct Envelope {
    run_id: Value,
    generation: Value,
    runner_epoch: Value,
}

impl Envelope {
    fn of(launch: &Value) -> Self {
        Self {
            run_id: launch["runId"].clone(),
            generation: launch["generation"].clone(),
            runner_epoch: launch["runnerEpoch"].clone(),
        }
    }
}

/// A running scripted runner and the fake server's end of its channel.
struct Runner {
    child: Child,
    stdin: Option<ChildStdin>,
    frames: Receiver<Result<Value, String>>,
    log: PathBuf,
    /// What every frame must carry (the last launch it was given).
    envelope: Envelope,
}

impl Runner {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    /// The next frame the runner writes, decoded and checked against the
    /// launch's run id, generation and epoch.
    fn recv(&mut self) -> Value {
        match self.frames.recv_timeout(WAIT) {
            Ok(Ok(message)) => {
                assert_eq!(message["schema"], "pi-workflows.worker-launch.v1");
                assert_eq!(message["runId"], self.envelope.run_id);
                assert_eq!(message["generation"], self.envelope.generation);
                assert_eq!(message["runnerEpoch"], self.envelope.runner_epoch);
                message
            }
            Ok(Err(e)) => panic!("invalid runner frame {e}\nlog:\n{}", self.log_text()),
            Err(RecvTimeoutError::Timeout) => {
                panic!("no frame within {WAIT:?}\nlog:\n{}", self.log_text())
            }
            Err(RecvTimeoutError::Disconnected) => {
                panic!("the runner closed stdout\nlog:\n{}", self.log_text())
            }
        }
    }

    fn expect(&mut self, kind: &str) -> Value {
        let message = self.recv();
        assert_eq!(
            message["type"],
            kind,
            "{message}\nlog:\n{}",
            self.log_text()
        );
        message
    }

    /// Asserts the runner writes nothing for `quiet`.
    fn expect_silence(&mut self, quiet: Duration) {
        match self.frames.recv_timeout(quiet) {
            Err(RecvTimeoutError::Timeout) => {}
            other => panic!("expected silence, got {other:?}"),
        }
    }

    /// Asserts the runner's stdout ends without another frame.
    fn expect_closed(&mut self) {
        match self.frames.recv_timeout(WAIT) {
            Err(RecvTimeoutError::Disconnected) => {}
            other => panic!(
                "expected the end of stdout, got {other:?}\nlog:\n{}",
                self.log_text()
            ),
        }
    }

    fn send(&mut self, mut message: Value) {
        message["schema"] = json!("pi-workflows.worker-launch.v1");
        message["runId"] = self.envelope.run_id.clone();
        message["generation"] = self.envelope.generation.clone();
        message["runnerEpoch"] = self.envelope.runner_epoch.clone();
        let typed: ServerMessage = serde_json::from_value(message).unwrap();
        let bytes = encode_server(&typed).unwrap();
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(&bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// Hands a resolver that awaits its run the run launch `launch`: from
    /// now on its frames carry that launch's envelope.
    fn hand(&mut self, launch: &Value) {
        let typed: WorkerLaunch = serde_json::from_value(launch.clone()).unwrap();
        let mut bytes = encode_launch(&typed).unwrap();
        bytes.push(b'\n');
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(&bytes).unwrap();
        stdin.flush().unwrap();
        self.envelope = Envelope::of(launch);
    }

    /// Closes the runner's stdin (EOF).
    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    fn command(&mut self, command: &str, node: &str, attempt: &str, visit: u64) {
        self.send(json!({
            "type": "command",
            "command": command,
            "node": {"nodeId": node, "attemptId": attempt, "visit": visit},
            "state": {"kind": "inline", "value": {"input": {}, "results": {}, "resultOrder": [], "steps": 0}},
        }));
    }

    fn reply(&mut self, to: &Value, outcome: &str, result: Value, next: Option<Value>) {
        let mut reply = json!({
            "type": "reply",
            "inReplyTo": to["messageId"],
            "outcome": outcome,
            "result": result,
        });
        if let Some(next) = next {
            reply["next"] = next;
        }
        self.send(reply);
    }

    fn reply_run(&mut self, to: &Value, node: &str, attempt: &str, visit: u64) {
        self.reply(
            to,
            "accepted",
            Value::Null,
            Some(json!({"kind": "runNode", "nodeId": node, "attemptId": attempt, "visit": visit})),
        );
    }

    fn reply_exit(&mut self, to: &Value, reason: &str) {
        self.reply(
            to,
            "accepted",
            Value::Null,
            Some(json!({"kind": "exit", "reason": reason})),
        );
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the runner did not exit\nlog:\n{}",
                self.log_text()
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn expect_exit(&mut self, code: i32) {
        let status = self.wait();
        assert_eq!(
            status.code(),
            Some(code),
            "{status}\nlog:\n{}",
            self.log_text()
        );
    }

    /// `runner.exiting` with `reason`, then exit 0.
    fn expect_exiting(&mut self, reason: &str) {
        let exiting = self.expect("runner.exiting");
        assert_eq!(exiting["reason"], reason);
        self.expect_exit(0);
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn topology(nodes: &[(&str, Value)], edges: &[(&str, &str)]) -> Value {
    json!({
        "startAt": nodes[0].0,
        "nodes": nodes
            .iter()
            .map(|(id, timeout)| json!({"id": id, "nodeType": "compute", "timeout": timeout, "mountPath": []}))
            .collect::<Vec<_>>(),
        "edges": edges
            .iter()
            .map(|(from, to)| json!({"kind": "plain", "from": from, "to": to}))
            .collect::<Vec<_>>(),
        "mounts": [],
    })
}

/// A one-node script (`a`, default timeout) with these behaviours.
fn one_node(behaviours: Value, startup: Value) -> Value {
    json!({
        "topology": topology(&[("a", json!({"kind": "default"}))], &[]),
        "startup": startup,
        "nodes": {"a": behaviours},
    })
}

/// Starts a run of `script` and sends `command start a` after `runner.ready`.
fn start_a(project: &Project, script: &Value) -> Runner {
    let path = project.script("script.json", script);
    let mut runner = project.spawn(&project.run_launch(&path, 1));
    runner.expect("runner.ready");
    runner.command("start", "a", "att-1", 1);
    runner
}

// ---------------------------------------------------------------- resolve

#[test]
fn resolve_sends_the_script_identity_topology_and_input() {
    let project = Project::new();
    let path = project.example("linear.json");
    let bytes = std::fs::read(&path).unwrap();
    let script: Value = serde_json::from_slice(&bytes).unwrap();
    let input = json!({"topic": "résumé", "n": [1, 2.5]});
    // Relative to the project.
    let mut runner = project.spawn(&project.resolve_launch("linear.json", input.clone()));
    let result = runner.expect("resolve.result");
    assert_eq!(result["messageId"], format!("{EPOCH}-m1"));
    assert_eq!(result["workflowName"], "linear");
    assert_eq!(result["title"], "A linear three-node run");
    assert_eq!(
        result["workflowSource"],
        json!({"root": {"kind": "file", "path": path.to_str().unwrap(), "hash": sha256(&bytes)}, "mounted": []})
    );
    assert_eq!(result["topology"], script["topology"]);
    assert_eq!(
        result["definitionDigest"],
        canonical_digest(&script["topology"])
    );
    assert_eq!(result["input"], input);
    assert_eq!(result["awaitsRun"], true);
    // It waits for its run's launch; EOF instead ends it.
    runner.expect_silence(Duration::from_millis(200));
    assert!(runner.child.try_wait().unwrap().is_none(), "it waits");
    runner.close_stdin();
    runner.expect_exit(0);
    runner.expect_closed();
    assert!(
        runner
            .log_text()
            .contains("no run launch followed the resolution")
    );

    // Absolute, without a name or title: the file stem names it.
    let unnamed = project.script(
        "unnamed.json",
        &json!({"topology": topology(&[("a", json!({"kind": "none"}))], &[])}),
    );
    let mut runner = project.spawn(&project.resolve_launch(unnamed.to_str().unwrap(), json!(null)));
    let result = runner.expect("resolve.result");
    assert_eq!(result["workflowName"], "unnamed");
    assert!(result.get("title").is_none());
    assert_eq!(result["input"], Value::Null);
    runner.close_stdin();
    runner.expect_exit(0);
}

#[test]
fn resolve_failures_carry_their_codes() {
    let project = Project::new();
    project.write("garbage.json", b"{not json");
    project.script(
        "typo.json",
        &json!({"topology": topology(&[("a", json!({"kind": "none"}))], &[]), "nodes": {"a": [{"finsh": 1}]}}),
    );
    project.script(
        "bad-topology.json",
        &json!({"topology": {"startAt": "a", "nodes": "no"}}),
    );
    project.script(
        "reject.json",
        &json!({"topology": topology(&[("a", json!({"kind": "none"}))], &[]), "rejectInput": true}),
    );
    for (workflow, code) in [
        ("missing.json", "sourceNotFound"),
        ("garbage.json", "compileFailed"),
        ("typo.json", "compileFailed"),
        ("bad-topology.json", "invalidDefinition"),
        ("reject.json", "invalidInput"),
    ] {
        let mut runner = project.spawn(&project.resolve_launch(workflow, json!({})));
        let failed = runner.expect("resolve.failed");
        assert_eq!(failed["code"], code, "{workflow}");
        assert!(!failed["message"].as_str().unwrap().is_empty());
        runner.expect_exit(0);
    }
}

#[test]
fn a_resolver_handed_its_run_launch_runs_it() {
    let project = Project::new();
    let path = project.script(
        "one.json",
        &one_node(json!([{"finish": {"done": 1}}]), json!({})),
    );
    let mut runner = project.spawn(&project.resolve_launch("one.json", json!({})));
    let result = runner.expect("resolve.result");
    assert_eq!(result["awaitsRun"], true);
    // The server's run launch: another run id and epoch, generation 1.
    let mut launch = project.run_launch(&path, 1);
    launch["runId"] = json!("run-handed");
    launch["runnerEpoch"] = json!("re-handed");
    assert_eq!(launch["workflowSource"], result["workflowSource"]);
    assert_eq!(launch["definitionDigest"], result["definitionDigest"]);
    runner.hand(&launch);
    let ready = runner.expect("runner.ready");
    assert_eq!(
        ready["messageId"], "re-handed-m1",
        "message ids restart with the run's epoch"
    );
    runner.command("start", "a", "att-1", 1);
    runner.expect("node.started");
    let finished = runner.expect("node.finished");
    assert_eq!(finished["output"], json!({"done": 1}));
    runner.reply_exit(&finished, "finished");
    runner.expect_exiting("finished");
    let log = runner.log_text();
    assert!(
        log.contains("launched: mode run, run run-handed, generation 1, epoch re-handed"),
        "{log}"
    );
}

#[test]
fn a_resolver_handed_its_run_after_the_script_changed_parks_it() {
    let project = Project::new();
    let script = one_node(json!([{"finish": {"done": 1}}]), json!({}));
    let path = project.script("one.json", &script);
    let mut runner = project.spawn(&project.resolve_launch("one.json", json!({})));
    let result = runner.expect("resolve.result");
    // The launch names the resolved hash; the file changes before it arrives.
    let mut launch = project.run_launch(&path, 1);
    launch["workflowSource"] = result["workflowSource"].clone();
    let mut edited = script;
    edited["title"] = json!("edited");
    project.script("one.json", &edited);
    runner.hand(&launch);
    let parked = runner.expect("run.parked");
    assert_eq!(parked["reason"], "workflowSourceChanged");
    runner.expect_exit(0);
}

#[test]
fn a_resolve_only_script_answers_without_awaiting_its_run() {
    let project = Project::new();
    let mut script = one_node(json!([]), json!({}));
    script["resolveOnly"] = json!(true);
    project.script("once.json", &script);
    let mut runner = project.spawn(&project.resolve_launch("once.json", json!({})));
    let result = runner.expect("resolve.result");
    assert!(result.get("awaitsRun").is_none(), "{result}");
    runner.expect_exit(0);
}

// ---------------------------------------------------- the example scripts

/// How a drive ended, by the kernel's routing.
#[derive(Debug, PartialEq, Eq)]
enum Ending {
    Complete,
    Wait(String),
    Fail(String),
}

/// Plays a server that routes with the kernel: starts one runner
/// generation at `first`, runs nodes until the route leaves the runner,
/// and records `(node, outcome)` in `history` (which carries visits and
/// step counts across generations).
fn drive(
    project: &Project,
    script: &Path,
    topology: &Topology,
    generation: u64,
    command: &str,
    first: &str,
    history: &mut Vec<(String, String)>,
) -> Ending {
    let visit = |history: &[(String, String)], node: &str| {
        history.iter().filter(|(seen, _)| seen == node).count() as u64 + 1
    };
    let mut runner = project.spawn(&project.run_launch(script, generation));
    runner.expect("runner.ready");
    let mut node = first.to_string();
    runner.command(
        command,
        &node,
        &format!("att-{}", history.len() + 1),
        visit(history, &node),
    );
    loop {
        let started = runner.expect("node.started");
        let attempt = started["attemptId"].as_str().unwrap().to_string();
        let end = runner.recv();
        assert_eq!(end["attemptId"], attempt.as_str());
        let (outcome, record) = match end["type"].as_str().unwrap() {
            "node.finished" => (
                NodeOutcome::Ok,
                json!({"attemptId": attempt, "nodeId": node, "outcome": "ok", "output": end["output"]}),
            ),
            "node.failed" => (
                NodeOutcome::Failed,
                json!({"attemptId": attempt, "nodeId": node, "outcome": end["outcome"], "error": end["error"]}),
            ),
            other => panic!("{other}: {end}"),
        };
        history.push((node.clone(), outcome.as_str().to_string()));
        let ending = match routing::route(topology, &NodeId::new(node.as_str()), outcome, &record) {
            Route::Next(next) if history.len() < topology.root_max_steps() as usize => {
                node = next.to_string();
                let visit = visit(history, &node);
                runner.reply_run(&end, &node, &format!("att-{}", history.len() + 1), visit);
                continue;
            }
            Route::Next(_) => Ending::Fail("maxSteps".to_string()),
            Route::Complete => Ending::Complete,
            Route::Wait { checkpoint } => Ending::Wait(checkpoint.to_string()),
            other => Ending::Fail(format!("{other:?}")),
        };
        let reason = if matches!(ending, Ending::Wait(_)) {
            "waiting"
        } else {
            "finished"
        };
        runner.reply_exit(&end, reason);
        runner.expect_exiting(reason);
        return ending;
    }
}

fn resolved_topology(project: &Project, name: &str) -> (PathBuf, Topology) {
    let path = project.example(name);
    let mut runner = project.spawn(&project.resolve_launch(name, json!({})));
    let result = runner.expect("resolve.result");
    runner.close_stdin();
    runner.expect_exit(0);
    let topology: Topology = serde_json::from_value(result["topology"].clone()).unwrap();
    topology.validate().unwrap();
    (path, topology)
}

fn steps(history: &[(String, String)]) -> Vec<String> {
    history
        .iter()
        .map(|(node, outcome)| format!("{node}:{outcome}"))
        .collect()
}

#[test]
fn the_example_scripts_route_as_documented() {
    let project = Project::new();

    let (path, topology) = resolved_topology(&project, "linear.json");
    let mut history = Vec::new();
    let ending = drive(&project, &path, &topology, 1, "start", "a", &mut history);
    assert_eq!(ending, Ending::Complete);
    assert_eq!(steps(&history), ["a:ok", "b:ok", "c:ok"]);

    let (path, topology) = resolved_topology(&project, "switch.json");
    let mut history = Vec::new();
    let ending = drive(
        &project,
        &path,
        &topology,
        1,
        "start",
        "fetch",
        &mut history,
    );
    assert_eq!(ending, Ending::Complete);
    assert_eq!(steps(&history), ["fetch:failed", "recover:ok"]);

    let (path, topology) = resolved_topology(&project, "checkpoint.json");
    let mut history = Vec::new();
    let ending = drive(
        &project,
        &path,
        &topology,
        1,
        "start",
        "draft",
        &mut history,
    );
    assert_eq!(ending, Ending::Wait("review".to_string()));
    let record = json!({"nodeId": "review", "outcome": "ok", "output": {"approved": true}});
    let Route::Next(next) =
        routing::route_from_checkpoint(&topology, &NodeId::new("review"), &record)
    else {
        panic!("the checkpoint has an onward edge")
    };
    let ending = drive(
        &project,
        &path,
        &topology,
        2,
        "continue",
        next.as_str(),
        &mut history,
    );
    assert_eq!(ending, Ending::Complete);
    assert_eq!(steps(&history), ["draft:ok", "review:ok", "publish:ok"]);

    let (path, topology) = resolved_topology(&project, "loop.json");
    let mut history = Vec::new();
    let ending = drive(
        &project,
        &path,
        &topology,
        1,
        "start",
        "start",
        &mut history,
    );
    assert_eq!(ending, Ending::Fail("maxSteps".to_string()));
    assert_eq!(
        steps(&history),
        [
            "start:ok", "work:ok", "check:ok", "work:ok", "check:ok", "work:ok"
        ]
    );
}

// ------------------------------------------------------------- run mode

#[test]
fn a_linear_two_node_run() {
    let project = Project::new();
    let script = json!({
        "topology": topology(
            &[("a", json!({"kind": "ms", "ms": 5000})), ("b", json!({"kind": "none"}))],
            &[("a", "b")],
        ),
        "nodes": {"a": [{"finish": {"x": 1}}]},
    });
    let path = project.script("two.json", &script);
    let mut runner = project.spawn(&project.run_launch(&path, 3));
    let ready = runner.expect("runner.ready");
    assert_eq!(ready["sourceVerified"], true);
    assert_eq!(ready["messageId"], format!("{EPOCH}-m1"));
    assert!(ready.get("expectedRevision").is_none());

    runner.command("start", "a", "att-a", 1);
    let before = now_ms();
    let started = runner.expect("node.started");
    assert_eq!(started["attemptId"], "att-a");
    assert_eq!(started["messageId"], format!("{EPOCH}-m2"));
    let deadline = started["deadlineAtMs"].as_u64().unwrap();
    assert!(
        (before + 4_000..=now_ms() + 5_000).contains(&deadline),
        "{deadline}"
    );
    let finished = runner.expect("node.finished");
    assert_eq!(finished["attemptId"], "att-a");
    assert_eq!(finished["output"], json!({"x": 1}));
    assert_eq!(finished["messageId"], format!("{EPOCH}-m3"));

    runner.reply_run(&finished, "b", "att-b", 1);
    let started = runner.expect("node.started");
    assert_eq!(started["attemptId"], "att-b");
    assert!(started.get("deadlineAtMs").is_none(), "timeout none");
    let finished = runner.expect("node.finished");
    assert_eq!(finished["output"], json!({"node": "b", "visit": 1}));

    runner.reply_exit(&finished, "finished");
    runner.expect_exiting("finished");
    runner.expect_closed();
}

/// A dispatch that carries a committed deadline starts at once: no
/// `node.started` (the server recorded the deadline with the result); one
/// left to the runner (`runnerResolves`) reports its dynamic deadline first.
#[test]
fn a_dispatch_with_a_committed_deadline_runs_without_node_started() {
    let project = Project::new();
    let script = json!({
        "topology": topology(
            &[
                ("a", json!({"kind": "ms", "ms": 5000})),
                ("b", json!({"kind": "ms", "ms": 5000})),
                ("c", json!({"kind": "dynamic"})),
            ],
            &[("a", "b"), ("b", "c")],
        ),
        "nodes": {"c": [{"finish": {"c": 1}, "timeoutMs": 7000}]},
    });
    let path = project.script("three.json", &script);
    let mut runner = project.spawn(&project.run_launch(&path, 1));
    runner.expect("runner.ready");
    runner.command("start", "a", "att-a", 1);
    runner.expect("node.started");
    let finished = runner.expect("node.finished");

    let committed = json!({"kind": "committed", "deadlineAtMs": now_ms() + 5_000});
    runner.reply(
        &finished,
        "accepted",
        Value::Null,
        Some(json!({"kind": "runNode", "nodeId": "b", "attemptId": "att-b", "visit": 1, "deadline": committed})),
    );
    let finished = runner.expect("node.finished");
    assert_eq!(finished["attemptId"], "att-b", "no node.started for b");

    runner.reply(
        &finished,
        "accepted",
        Value::Null,
        Some(json!({"kind": "runNode", "nodeId": "c", "attemptId": "att-c", "visit": 1, "deadline": {"kind": "runnerResolves"}})),
    );
    let before = now_ms();
    let started = runner.expect("node.started");
    assert_eq!(started["attemptId"], "att-c");
    let deadline = started["deadlineAtMs"].as_u64().unwrap();
    assert!(
        (before + 6_000..=now_ms() + 7_000).contains(&deadline),
        "{deadline}"
    );
    let finished = runner.expect("node.finished");
    runner.reply_exit(&finished, "finished");
    runner.expect_exiting("finished");
    runner.expect_closed();
}

#[test]
fn a_ready_answered_with_exit_runs_no_node() {
    let project = Project::new();
    let path = project.script("s.json", &one_node(json!([]), json!({})));
    let mut runner = project.spawn(&project.run_launch(&path, 1));
    let ready = runner.expect("runner.ready");
    runner.reply_exit(&ready, "parked");
    runner.expect_exiting("parked");
    runner.expect_closed();
}

#[test]
fn a_changed_or_missing_source_parks_before_any_node() {
    let project = Project::new();
    let path = project.script("s.json", &one_node(json!([]), json!({})));
    let launch = project.run_launch(&path, 1);
    std::fs::write(&path, b"{}").unwrap();
    let mut runner = project.spawn(&launch);
    let parked = runner.expect("run.parked");
    assert_eq!(parked["reason"], "workflowSourceChanged");
    runner.expect_exit(0);
    runner.expect_closed();

    std::fs::remove_file(&path).unwrap();
    let mut runner = project.spawn(&launch);
    assert_eq!(
        runner.expect("run.parked")["reason"],
        "workflowSourceChanged"
    );
    runner.expect_exit(0);
    runner.expect_closed();
}

#[test]
fn a_failing_node_reports_its_error() {
    let project = Project::new();
    let script = one_node(
        json!([{"fail": "boom"}, {"fail": "too slow", "outcome": "timed_out"}]),
        json!({}),
    );
    let mut runner = start_a(&project, &script);
    runner.expect("node.started");
    let failed = runner.expect("node.failed");
    assert_eq!(failed["attemptId"], "att-1");
    assert_eq!(failed["outcome"], "failed");
    assert_eq!(
        failed["error"],
        json!({"code": "nodeFailed", "message": "boom"})
    );
    runner.reply_run(&failed, "a", "att-2", 2);
    runner.expect("node.started");
    let failed = runner.expect("node.failed");
    assert_eq!(failed["outcome"], "timed_out");
    assert_eq!(
        failed["error"],
        json!({"code": "timedOut", "message": "too slow"})
    );
    runner.reply_exit(&failed, "finished");
    runner.expect_exiting("finished");
}

#[test]
fn an_update_waits_for_its_reply() {
    let project = Project::new();
    let script = one_node(
        json!([{"update": {"type": "progress", "key": "p", "data": {"done": 1}}, "then": {"finish": 7}}]),
        json!({}),
    );
    let mut runner = start_a(&project, &script);
    runner.expect("node.started");
    let update = runner.expect("node.update");
    assert_eq!(update["attemptId"], "att-1");
    assert_eq!(
        update["update"],
        json!({"type": "progress", "key": "p", "data": {"done": 1}})
    );
    assert!(update["idempotencyKey"].as_str().unwrap().starts_with("u-"));
    runner.expect_silence(Duration::from_millis(200));
    runner.reply(&update, "accepted", Value::Null, None);
    let finished = runner.expect("node.finished");
    assert_eq!(finished["output"], 7);
    runner.reply_exit(&finished, "finished");
    runner.expect_exiting("finished");
}

// ---------------------------------------------------------------- effects

fn effect_script(project: &Project, crash: bool) -> Value {
    one_node(
        json!([{
            "effect": {
                "type": "email.send",
                "request": {"to": "a@example.invalid", "n": 1},
                "applyLog": project.file("applied.log"),
                "result": {"sent": true},
                "receipt": true,
            },
            "crashWhileApplying": crash,
            "then": {"finish": {"ok": true}},
        }]),
        json!({}),
    )
}

fn applied_lines(project: &Project) -> Vec<String> {
    std::fs::read_to_string(project.file("applied.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn an_effect_is_applied_once_and_adopted_when_already_applied() {
    let project = Project::new();
    let script = effect_script(&project, false);

    let mut runner = start_a(&project, &script);
    runner.expect("node.started");
    let reserve = runner.expect("effect.reserve");
    assert_eq!(reserve["attemptId"], "att-1");
    assert_eq!(reserve["effectType"], "email.send");
    assert_eq!(
        reserve["requestDigest"],
        canonical_digest(&json!({"n": 1, "to": "a@example.invalid"}))
    );
    runner.reply(
        &reserve,
        "accepted",
        json!({"effectId": "effect-1", "state": "applying", "attemptNumber": 1}),
        None,
    );
    let settle = runner.expect("effect.settle");
    assert_eq!(settle["effectId"], "effect-1");
    assert_eq!(settle["state"], "applied");
    assert_eq!(settle["result"], json!({"sent": true}));
    assert_eq!(applied_lines(&project), ["effect-1 1"]);
    runner.reply(&settle, "accepted", Value::Null, None);
    let finished = runner.expect("node.finished");
    assert_eq!(finished["output"], json!({"ok": true}));
    assert_eq!(
        finished["action"],
        json!({"effectId": "effect-1", "state": "applied", "result": {"sent": true}})
    );
    runner.reply_exit(&finished, "finished");
    runner.expect_exiting("finished");

    // A rerun whose reservation is already applied applies nothing.
    let mut runner = start_a(&project, &script);
    runner.expect("node.started");
    let reserve = runner.expect("effect.reserve");
    runner.reply(
        &reserve,
        "adopted",
        json!({"effectId": "effect-1", "state": "applied", "attemptNumber": 1, "result": {"sent": true}}),
        None,
    );
    let finished = runner.expect("node.finished");
    assert_eq!(finished["action"]["result"], json!({"sent": true}));
    assert_eq!(applied_lines(&project), ["effect-1 1"]);
    runner.reply_exit(&finished, "finished");
    runner.expect_exiting("finished");
}

#[test]
fn a_crash_while_applying_leaves_the_effect_unsettled() {
    let project = Project::new();
    let mut runner = start_a(&project, &effect_script(&project, true));
    runner.expect("node.started");
    let reserve = runner.expect("effect.reserve");
    runner.reply(
        &reserve,
        "accepted",
        // An operator retry: the effect's second attempt applies now.
        json!({"effectId": "effect-1", "state": "applying", "attemptNumber": 2}),
        None,
    );
    runner.expect_exit(3);
    runner.expect_closed();
    assert_eq!(applied_lines(&project), ["effect-1 2"]);
}

#[test]
fn a_refused_reservation_fails_the_node() {
    let project = Project::new();
    let mut runner = start_a(&project, &effect_script(&project, false));
    runner.expect("node.started");
    let reserve = runner.expect("effect.reserve");
    let refusal = json!({
        "type": "reply",
        "inReplyTo": reserve["messageId"],
        "outcome": "rejected",
        "result": null,
        "error": {"code": "conflict", "message": "another request under this key"},
    });
    runner.send(refusal);
    let failed = runner.expect("node.failed");
    assert_eq!(failed["outcome"], "failed");
    assert_eq!(
        failed["error"],
        json!({"code": "conflict", "message": "another request under this key"})
    );
    assert!(applied_lines(&project).is_empty());
    runner.reply_exit(&failed, "finished");
    runner.expect_exiting("finished");
}

// ------------------------------------------------------ signals and crashes

#[test]
fn ignore_sigterm_survives_sigterm_and_dies_on_sigkill() {
    let project = Project::new();
    let mut runner = start_a(
        &project,
        &one_node(json!([{"stall": true}]), json!({"ignoreSigterm": true})),
    );
    runner.expect("node.started");
    kill(runner.pid(), Signal::SIGTERM).unwrap();
    thread::sleep(Duration::from_millis(300));
    assert!(
        runner.child.try_wait().unwrap().is_none(),
        "SIGTERM killed it"
    );
    assert!(runner.log_text().contains("SIGTERM received and ignored"));
    kill(runner.pid(), Signal::SIGKILL).unwrap();
    assert_eq!(runner.wait().signal(), Some(Signal::SIGKILL as i32));

    // Without the option SIGTERM kills a stalled runner.
    let mut runner = start_a(&project, &one_node(json!([{"stall": true}]), json!({})));
    runner.expect("node.started");
    kill(runner.pid(), Signal::SIGTERM).unwrap();
    assert_eq!(runner.wait().signal(), Some(Signal::SIGTERM as i32));
}

#[test]
fn exit_mid_node_and_crash_once() {
    let project = Project::new();
    let mut runner = start_a(&project, &one_node(json!([{"exit": 42}]), json!({})));
    runner.expect("node.started");
    runner.expect_exit(42);
    runner.expect_closed();

    let script = one_node(
        json!([{"crashOnce": "crashed.marker", "then": {"finish": "second time"}}]),
        json!({}),
    );
    let mut runner = start_a(&project, &script);
    runner.expect("node.started");
    runner.expect_exit(3);
    runner.expect_closed();
    assert!(project.file("crashed.marker").exists());

    let mut runner = start_a(&project, &script);
    runner.expect("node.started");
    let finished = runner.expect("node.finished");
    assert_eq!(finished["output"], "second time");
    runner.reply_exit(&finished, "finished");
    runner.expect_exiting("finished");
}

#[test]
fn startup_exits_and_delays() {
    let project = Project::new();
    let path = project.script(
        "before.json",
        &one_node(json!([]), json!({"exitBeforeReady": 5})),
    );
    let mut runner = project.spawn(&project.run_launch(&path, 1));
    runner.expect_exit(5);
    runner.expect_closed();

    let path = project.script(
        "after.json",
        &one_node(json!([]), json!({"exitAfterReady": 6})),
    );
    let mut runner = project.spawn(&project.run_launch(&path, 1));
    runner.expect("runner.ready");
    runner.expect_exit(6);
    runner.expect_closed();

    let path = project.script(
        "delay.json",
        &one_node(json!([]), json!({"readyDelayMs": 400})),
    );
    let spawned = Instant::now();
    let mut runner = project.spawn(&project.run_launch(&path, 1));
    let ready = runner.expect("runner.ready");
    assert!(spawned.elapsed() >= Duration::from_millis(400));
    runner.reply_exit(&ready, "finished");
    runner.expect_exiting("finished");
}

#[test]
fn a_closed_stdin_ends_a_waiting_runner() {
    let project = Project::new();
    let path = project.script("s.json", &one_node(json!([]), json!({})));
    let mut runner = project.spawn(&project.run_launch(&path, 1));
    runner.expect("runner.ready");
    drop(runner.stdin.take());
    runner.expect_exit(4);
}

// ------------------------------------------------- duplicates and fencing

#[test]
fn duplicate_sends_one_message_id_twice() {
    let project = Project::new();
    let mut runner = start_a(
        &project,
        &one_node(
            json!([{"duplicate": true, "then": {"finish": {"x": 1}}}]),
            json!({}),
        ),
    );
    runner.expect("node.started");
    let first = runner.expect("node.finished");
    let second = runner.expect("node.finished");
    assert_eq!(first, second);
    runner.reply_exit(&first, "finished");
    // The runner waits for the second reply before it goes on.
    runner.expect_silence(Duration::from_millis(200));
    runner.reply(
        &second,
        "adopted",
        Value::Null,
        Some(json!({"kind": "exit", "reason": "finished"})),
    );
    runner.expect_exiting("finished");
    let id = first["messageId"].as_str().unwrap();
    assert_eq!(
        runner.log_text().matches(&format!("reply to {id}")).count(),
        2
    );
}

#[test]
fn a_lost_claim_exits_3() {
    let project = Project::new();
    let mut runner = start_a(&project, &one_node(json!([]), json!({})));
    runner.expect("node.started");
    let finished = runner.expect("node.finished");
    runner.reply(&finished, "claimLost", Value::Null, None);
    runner.expect_exit(3);
    runner.expect_closed();
}

#[test]
fn keep_writing_after_claim_lost_sends_fenced_updates_then_exits_3() {
    let project = Project::new();
    let mut runner = start_a(
        &project,
        &one_node(json!([]), json!({"keepWritingAfterClaimLost": true})),
    );
    runner.expect("node.started");
    let finished = runner.expect("node.finished");
    runner.reply(&finished, "claimLost", Value::Null, None);
    let mut ids = Vec::new();
    for write in 1..=20 {
        let update = runner.expect("node.update");
        assert_eq!(update["attemptId"], "att-1");
        assert_eq!(update["update"]["type"], "fenced");
        assert_eq!(update["update"]["data"]["write"], write);
        ids.push(update["messageId"].as_str().unwrap().to_string());
        runner.reply(&update, "claimLost", Value::Null, None);
    }
    ids.dedup();
    assert_eq!(ids.len(), 20, "fresh message ids");
    runner.expect_exit(3);
    runner.expect_closed();
}

// --------------------------------------------------------- child processes

#[test]
fn spawned_children_are_registered_with_their_process_identity() {
    let project = Project::new();
    let mut runner = start_a(
        &project,
        &one_node(
            json!([{
                "spawnChild": {"sleepSeconds": 30, "newGroup": true},
                "then": {"spawnChild": {"sleepSeconds": 30, "newGroup": false}},
            }]),
            json!({}),
        ),
    );
    runner.expect("node.started");
    let mut children = BTreeMap::new();
    for new_group in [true, false] {
        let progress = runner.expect("runner.progress");
        assert_eq!(progress["operation"], "process.register");
        let pid = u32::try_from(progress["pid"].as_u64().unwrap()).unwrap();
        let identity =
            ProcessIdentity::decode(progress["startIdentity"].as_str().unwrap()).unwrap();
        assert_eq!(Some(identity.clone()), process::identity(pid));
        assert!(process::is_alive(&identity));
        let stat = process::stat(pid).unwrap();
        let runner_group = process::stat(runner.child.id()).unwrap().process_group;
        if new_group {
            assert_eq!(stat.process_group, pid);
        } else {
            assert_eq!(stat.process_group, runner_group);
        }
        children.insert(pid, identity);
        runner.reply(&progress, "accepted", Value::Null, None);
    }
    let finished = runner.expect("node.finished");
    runner.reply_exit(&finished, "finished");
    runner.expect_exiting("finished");
    // The runner does not reap or kill its children: that is the server's job.
    for (pid, identity) in &children {
        assert!(
            process::is_alive(identity),
            "child {pid} outlives the runner"
        );
        kill(Pid::from_raw(i32::try_from(*pid).unwrap()), Signal::SIGKILL).unwrap();
    }
}
