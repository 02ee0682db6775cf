//! Test harness for black-box server tests: a real `pi-workflows server run`
//! process on a temporary `PI_WORKFLOWS_HOME`, the scripted runner, the Rust
//! client (`pi-workflows-client`, whose `Connection` the tests call
//! `Client`), and read-only access to the SQLite file for consistency
//! checks (the product never lets clients read it; tests may).
#![allow(dead_code, unreachable_pub, unused_imports)]

pub mod clone;
pub mod coordinator;
pub mod namespace;
pub mod telegram;
pub use clone::*;
pub use coordinator::*;
pub use namespace::*;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use rusqlite::{Connection, OpenFlags};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The claim lifetime tests use (short so recovery is quick).
pub const CLAIM_TTL_MS: u64 = 1500;

/// How long a test waits for a run to settle, for every runner exit to be
/// recorded, or for a crashed server's work to be recovered. It bounds
/// correctness (the state must be reached), not speed: on a loaded machine
/// a disk stall has held one commit for 20 s. A test that measures speed
/// says so with its own bound.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(90);

/// One server under test.
pub struct TestServer {
    pub home: PathBuf,
    _dir: tempfile::TempDir,
    child: Option<Child>,
    env: Vec<(String, String)>,
    pub epoch: u64,
}

impl TestServer {
    /// Starts a server with the default test settings.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra environment variables.
    pub fn start_with(extra: &[(&str, &str)]) -> Self {
        let mut server = Self::new(extra);
        server.spawn().expect("the server starts");
        server
    }

    /// A server that is not started yet.
    pub fn new(extra: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let home = dir.path().join("state");
        let mut env: Vec<(String, String)> = vec![
            (
                "PI_WORKFLOWS_HOME".into(),
                home.to_string_lossy().into_owned(),
            ),
            (
                "PI_WORKFLOWS_RUNNER".into(),
                env!("CARGO_BIN_EXE_pi-workflows-scripted-runner").into(),
            ),
            ("PI_WORKFLOWS_CLAIM_TTL_MS".into(), CLAIM_TTL_MS.to_string()),
            // Long enough that a server delayed by a loaded machine keeps its
            // lease (renewed every fifth); short enough for restart tests.
            ("PI_WORKFLOWS_SERVER_LEASE_MS".into(), "3000".into()),
            ("PI_WORKFLOWS_STOP_GRACE_MS".into(), "1000".into()),
            ("PI_WORKFLOWS_READY_TIMEOUT_MS".into(), "5000".into()),
            ("PI_WORKFLOWS_IDLE_EXIT_MS".into(), "600000".into()),
        ];
        for (key, value) in extra {
            env.retain(|(k, _)| k != key);
            env.push(((*key).into(), (*value).into()));
        }
        Self {
            home,
            _dir: dir,
            child: None,
            env,
            epoch: 0,
        }
    }

    /// A private scratch directory of this test (scripts, apply logs,
    /// markers); the state home is its `state/` subdirectory.
    pub fn scratch(&self) -> &Path {
        self._dir.path()
    }

    /// Whether the server process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().ok().flatten().is_none())
    }

    /// The environment the server runs with.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Sets or replaces one environment variable for the next spawn.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
    }

    /// Removes one environment variable for the next spawn.
    pub fn remove_env(&mut self, key: &str) {
        self.env.retain(|(k, _)| k != key);
    }

    /// A `pi-workflows` command with this server's environment.
    pub fn command(&self) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_pi-workflows"));
        command.env_clear();
        command.env("PATH", std::env::var("PATH").unwrap_or_default());
        command.env("HOME", self.home.parent().unwrap());
        for (key, value) in &self.env {
            command.env(key, value);
        }
        command
    }

    /// Runs `pi-workflows <args>` with this server's environment and waits
    /// for it.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.command()
            .args(args)
            .output()
            .expect("run the pi-workflows CLI")
    }

    /// Spawns `server run --ready-line` and waits for the ready line.
    /// Returns the server's one-line error if it refused to start.
    pub fn spawn(&mut self) -> Result<u64, String> {
        self.spawn_under(&[])
    }

    /// `spawn` with the server started by `wrapper` (a program and its
    /// arguments, e.g. `strace … --`), which then runs
    /// `pi-workflows server run --ready-line` with this server's
    /// environment. The wrapper is the tracked child process.
    pub fn spawn_under(&mut self, wrapper: &[&str]) -> Result<u64, String> {
        let mut command = self.command();
        if let Some((program, arguments)) = wrapper.split_first() {
            let binary = env!("CARGO_BIN_EXE_pi-workflows");
            let mut wrapped = Command::new(program);
            wrapped.env_clear();
            for (key, value) in command.get_envs() {
                if let Some(value) = value {
                    wrapped.env(key, value);
                }
            }
            wrapped.args(arguments).arg(binary);
            command = wrapped;
        }
        let mut child = command
            .args(["server", "run", "--ready-line"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(self.stderr_file())
            .spawn()
            .expect("spawn the server");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the ready line");
        if let Some(epoch) = line.trim().strip_prefix("ready ") {
            self.epoch = epoch.parse().unwrap();
            self.child = Some(child);
            Ok(self.epoch)
        } else {
            let _ = child.wait();
            Err(line.trim().trim_start_matches("error ").to_owned())
        }
    }

    /// The server's stderr goes to `server.stderr` in the scratch directory
    /// (appended across restarts), shown when a test fails.
    fn stderr_file(&self) -> Stdio {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.scratch().join("server.stderr"))
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null())
    }

    /// Prints the server's stderr, every runner log and the run rows (for a
    /// failing test).
    pub fn dump(&self) {
        let mut out = String::new();
        let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
        out.push_str(&format!(
            "--- server.stderr\n{}",
            read(&self.scratch().join("server.stderr"))
        ));
        if let Ok(entries) = std::fs::read_dir(self.home.join("host").join("logs")) {
            let mut paths: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            for path in paths {
                out.push_str(&format!("--- {}\n{}", path.display(), read(&path)));
            }
        }
        if let Ok(db) = Connection::open_with_flags(
            self.home.join("state.sqlite"),
            OpenFlags::SQLITE_OPEN_READ_ONLY,
        ) {
            for sql in [
                "SELECT r.run_id || ' ' || r.status || '/' || q.status || ' paused=' || r.paused || ' park=' || COALESCE(r.park_reason, '-') || ' rev=' || r.revision FROM runs r JOIN run_queue q USING (run_id)",
                "SELECT runner_epoch || ' ' || run_id || ' g' || generation || ' ' || status || ' ' || COALESCE(outcome, '-') || ' pid=' || COALESCE(pid, 0) || ' code=' || COALESCE(exit_code, '-') || ' signal=' || COALESCE(signal, '-') || ' ready_at=' || COALESCE(ready_at_ms, '-') FROM run_workers",
                "SELECT run_id || ' ' || node_id || ' v' || visit || ' g' || generation || ' ' || status || ' ' || COALESCE(outcome, '-') FROM node_attempts ORDER BY run_id, seq",
                "SELECT effect_id || ' ' || run_id || ' ' || state || ' #' || attempt_number FROM effects",
                "SELECT seq || ' ' || run_id || ' ' || kind || ' ' || payload FROM events ORDER BY seq",
            ] {
                out.push_str(&format!("--- {sql}\n"));
                if let Ok(mut statement) = db.prepare(sql)
                    && let Ok(rows) = statement.query_map([], |row| row.get::<_, String>(0))
                {
                    for row in rows.flatten() {
                        out.push_str(&row);
                        out.push('\n');
                    }
                }
            }
        }
        eprintln!("{out}");
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILLs the server process (a crash). Its runners keep running until
    /// their stdin closes.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the server process to exit on its own (a fault point).
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && child.try_wait().ok().flatten().is_some()
            {
                self.child = None;
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Stops the server gracefully (SIGTERM) and waits.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
    }

    /// The socket path (the client's one rule for it).
    pub fn socket(&self) -> PathBuf {
        pi_workflows_client::Home::at(&self.home).socket_path()
    }

    /// A connected client.
    pub async fn client(&self) -> Client {
        Client::connect(
            &self.socket(),
            &format!("test-{}", server::ids::random_hex::<4>()),
        )
        .await
        .expect("connect")
    }

    /// A read-only connection to the state database.
    pub fn db(&self) -> Connection {
        Connection::open_with_flags(
            self.home.join("state.sqlite"),
            OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .expect("open the state read-only")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump();
        }
        self.stop();
        // No runner (nor a child it registered) may outlive its test.
        let Ok(connection) = Connection::open_with_flags(
            self.home.join("state.sqlite"),
            OpenFlags::SQLITE_OPEN_READ_ONLY,
        ) else {
            return;
        };
        let Ok(mut statement) = connection.prepare(
            "SELECT pid_start_identity FROM run_workers WHERE pid_start_identity IS NOT NULL
             UNION ALL SELECT start_identity FROM runner_processes",
        ) else {
            return;
        };
        let identities: Vec<String> = statement
            .query_map([], |row| row.get(0))
            .map(|rows| rows.filter_map(Result::ok).collect())
            .unwrap_or_default();
        for identity in identities
            .iter()
            .filter_map(|text| server::process::ProcessIdentity::decode(text))
        {
            server::children::supervisor::kill_exact(&identity);
        }
    }
}

/// Polls `probe` every 20 ms until it returns `Some` (panics with `what`
/// after `timeout`).
pub async fn wait_for<T>(timeout: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One integer from a query of the read-only state (panics on SQL errors).
pub fn count(db: &Connection, sql: &str, params: impl rusqlite::Params) -> i64 {
    db.query_row(sql, params, |row| row.get(0))
        .unwrap_or_else(|error| panic!("{sql}: {error}"))
}

/// The recorded process identity of a run's runner of `generation`, once the
/// server recorded it after the spawn.
pub fn runner_identity(
    db: &Connection,
    run_id: &str,
    generation: u64,
) -> Option<server::process::ProcessIdentity> {
    db.query_row(
        "SELECT pid_start_identity FROM run_workers WHERE run_id = ?1 AND generation = ?2 AND pid_start_identity IS NOT NULL",
        rusqlite::params![run_id, generation as i64],
        |row| row.get::<_, String>(0),
    )
    .ok()
    .and_then(|text| server::process::ProcessIdentity::decode(&text))
}

/// Sends `signal` to one exact process.
pub fn signal(identity: &server::process::ProcessIdentity, signal: nix::sys::signal::Signal) {
    assert!(
        server::process::is_alive(identity),
        "process {} is gone",
        identity.pid
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(identity.pid as i32), signal)
        .expect("signal the process");
}

/// The lines of an apply log (empty when the file does not exist).
pub fn apply_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|text| text.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The absolute path of a test script.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("scripts")
        .join(name)
}

/// Writes a script into `dir` and returns its path.
pub fn write_script(dir: &Path, name: &str, script: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(script).unwrap()).unwrap();
    path
}

/// A linear topology of compute nodes.
pub fn linear_topology(nodes: &[&str]) -> Value {
    json!({
        "startAt": nodes[0],
        "nodes": nodes.iter().map(|id| json!({"id": id, "nodeType": "compute", "timeout": {"kind": "default"}, "mountPath": []})).collect::<Vec<_>>(),
        "edges": nodes.windows(2).map(|pair| json!({"kind": "plain", "from": pair[0], "to": pair[1]})).collect::<Vec<_>>(),
        "mounts": [],
    })
}

/// Sends `spec` with an explicit `request_id` and waits for its response.
/// (`Client::request` makes a fresh request id; a test that repeats one, or
/// sends one from another connection, names it.)
pub async fn request_as(client: &mut Client, spec: &RequestSpec, request_id: &str) -> Response {
    client
        .request_with_id(spec, request_id)
        .await
        .expect("a response")
}

/// A request id no other request of any test uses.
pub fn fresh_request_id() -> String {
    format!("req-{}", server::ids::random_hex::<8>())
}

/// `run.start` of a headless run of `script`; returns the response.
pub async fn start_run(client: &mut Client, script: &Path) -> Response {
    let spec = RequestSpec::command(
        "run.start",
        None,
        json!({ "workflow": script.to_string_lossy(), "input": {"task": "test"}, "executionMode": "headless", "projectPath": "/tmp" }),
    );
    client.request(&spec).await.expect("run.start")
}

/// Starts a run and returns its id (panics when refused).
pub async fn started(client: &mut Client, script: &Path) -> String {
    let response = start_run(client, script).await;
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Starts `script` as an interactive run of origin session `session` with
/// `input` and returns its id (panics when refused).
pub async fn started_interactive(
    client: &mut Client,
    script: &Path,
    session: &str,
    input: Value,
) -> String {
    let response = client
        .request(&RequestSpec::command(
            "run.start",
            None,
            json!({ "workflow": script.to_string_lossy(), "input": input, "projectPath": "/tmp",
                    "executionMode": "interactive", "originSessionId": session }),
        ))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The origin-session view of `session` (`sessionView.get`, no coordination).
/// Answers the checkpoint `parent` waits at with `{"approved": true}` and
/// returns its continuation's run id.
pub async fn answered_checkpoint(client: &mut Client, parent: &str) -> String {
    let answered = client
        .request(&RequestSpec::command(
            "checkpoint.answer",
            Some(parent),
            json!({"answer": {"approved": true}}),
        ))
        .await
        .unwrap();
    assert_eq!(answered.outcome, "accepted", "{:?}", answered.frame);
    answered.receipt.as_ref().unwrap()["continuationRunId"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub async fn session_view(client: &mut Client, session: &str) -> Value {
    let response = client
        .request(&RequestSpec::read(
            "sessionView.get",
            None,
            json!({ "sessionId": session }),
        ))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.unwrap()
}

/// A run view's steps as (node id, outcome), in order.
pub fn step_outcomes(view: &Value) -> Vec<(String, String)> {
    view["steps"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|step| {
            (
                step["nodeId"].as_str().unwrap_or_default().to_owned(),
                step["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// A loop run: `start`, then `visits` rounds of `work` → `check`, then
/// `done`: `2 * visits + 2` graph steps. Each `work` visit can publish an
/// update of `update_chars` characters under its own key.
pub fn loop_script(dir: &Path, name: &str, visits: usize, update_chars: Option<usize>) -> PathBuf {
    let mut checks: Vec<Value> = (1..visits)
        .map(|_| json!({ "finish": { "again": true } }))
        .collect();
    checks.push(json!({ "finish": { "again": false } }));
    let mut nodes = json!({ "check": checks });
    if let Some(chars) = update_chars {
        let works: Vec<Value> = (1..=visits)
            .map(|visit| {
                json!({ "update": { "type": "progress", "key": format!("k{visit}"), "data": { "text": "x".repeat(chars) } } })
            })
            .collect();
        nodes["work"] = json!(works);
    }
    let topology_nodes: Vec<Value> = ["start", "work", "check", "done"]
        .iter()
        .map(|id| json!({ "id": id, "nodeType": "compute", "timeout": { "kind": "default" }, "mountPath": [] }))
        .collect();
    write_script(
        dir,
        name,
        &json!({
            "workflowName": "loop",
            "topology": {
                "startAt": "start",
                "maxSteps": 2 * visits + 2,
                "nodes": topology_nodes,
                "edges": [
                    { "kind": "plain", "from": "start", "to": "work" },
                    { "kind": "plain", "from": "work", "to": "check" },
                    { "kind": "switch", "from": "check", "on": "$.again", "cases": { "true": "work", "false": "done" } },
                ],
                "mounts": [],
            },
            "nodes": nodes,
        }),
    )
}

/// A linear workflow of `nodes` compute nodes `n1` … `nN` (maxSteps with room).
pub fn linear_script(dir: &Path, name: &str, nodes: usize) -> PathBuf {
    let ids: Vec<String> = (1..=nodes).map(|n| format!("n{n}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut topology = linear_topology(&refs);
    topology["maxSteps"] = json!(nodes + 10);
    write_script(
        dir,
        &format!("{name}.json"),
        &json!({"workflowName": name, "topology": topology}),
    )
}

/// The run view of `run_id`.
pub async fn view(client: &mut Client, run_id: &str) -> Value {
    let response = client
        .request(&RequestSpec::read("run.view", Some(run_id), json!({})))
        .await
        .expect("run.view");
    response.receipt.unwrap_or(Value::Null)
}

/// Polls the run view until `done` holds (or panics after `timeout`).
pub async fn wait_view(
    client: &mut Client,
    run_id: &str,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let view = view(client, run_id).await;
        if done(&view) {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting; last view: {view}"
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

/// The display status of a view.
pub fn status(view: &Value) -> &str {
    view.pointer("/display/status")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Waits until the run reaches a terminal or waiting display status
/// (within `SETTLE_TIMEOUT`).
pub async fn wait_settled(client: &mut Client, run_id: &str) -> Value {
    wait_view(client, run_id, SETTLE_TIMEOUT, |view| {
        matches!(
            status(view),
            "completed" | "failed" | "timed_out" | "cancelled" | "waiting"
        )
    })
    .await
}

/// Waits until no runner epoch is live (every runner's exit is recorded),
/// so that `consistency_violations` sees a quiescent state (within
/// `SETTLE_TIMEOUT`).
pub async fn wait_quiescent(db: &Connection) {
    wait_for(SETTLE_TIMEOUT, "every runner exit to be recorded", || {
        let live = count(
            db,
            "SELECT COUNT(*) FROM run_workers WHERE status IN ('launching', 'ready')",
            [],
        );
        (live == 0).then_some(())
    })
    .await;
}

/// `wait_quiescent` for futures that must be `Send` (a `&Connection` held
/// across an await is not): reopens the state file on every poll.
pub async fn wait_quiescent_at(server: &TestServer) {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let live = count(
            &server.db(),
            "SELECT COUNT(*) FROM run_workers WHERE status IN ('launching', 'ready')",
            [],
        );
        if live == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for every runner exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The consistency checks live in the server (`state verify` runs the same
/// list): `server::store::consistency`.
pub use server::store::consistency::{CHECKS as CONSISTENCY_CHECKS, Check, violations_of};

/// Checks every cross-table invariant of committed state
/// (`CONSISTENCY_CHECKS`); returns the violations as `<message>: <row>`
/// (empty when consistent). Some checks (a live runner epoch on a terminal
/// run) hold only when no runner is between its last message and its
/// recorded exit: call `wait_quiescent` first.
pub fn consistency_violations(db: &Connection) -> Vec<String> {
    violations_of(db, CONSISTENCY_CHECKS)
}
