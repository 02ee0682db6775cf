//! Real parts for piw's live tests: the real `pi-workflows` server (the
//! binary named by `PI_WORKFLOWS_BIN`, else `target/debug/pi-workflows`)
//! with the scripted runner (`PI_WORKFLOWS_SCRIPTED_RUNNER`, else
//! `target/debug/pi-workflows-scripted-runner`) and the scripted controller
//! child (`PI_WORKFLOWS_SCRIPTED_CONTROLLER`, else
//! `target/debug/pi-workflows-scripted-controller`) on a temporary home, its
//! CLI, the `piw` binary of this build, `piw serve`, and a private tmux
//! server for the TUI. Build the server first: `cargo build -p server`.
#![allow(dead_code, unreachable_pub)]

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn program(variable: &str, name: &str) -> PathBuf {
    let path = std::env::var_os(variable)
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/debug")
                .join(name)
        });
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build -p server` (or set {variable})",
        path.display()
    );
    path
}

/// The `pi-workflows` binary.
pub fn bin() -> PathBuf {
    program("PI_WORKFLOWS_BIN", "pi-workflows")
}

/// This build's `piw` binary.
pub fn piw() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_piw"))
}

/// A scripted-runner script of piw's fixtures.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/scripts")
        .join(format!("{name}.json"))
}

/// Waits (bounded) until `check` returns `Some`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One server home and its server process.
pub struct Server {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Server {
    /// A running server on a fresh home.
    pub fn started() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let mut server = Self { dir, child: None };
        let mut child = Command::new(bin())
            .envs(server.env())
            .args(["server", "run", "--ready-line"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read the ready line");
        assert!(
            line.starts_with("ready "),
            "the server is not ready: {line}"
        );
        server.child = Some(child);
        server
    }

    /// The state directory (`PI_WORKFLOWS_HOME`).
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The server socket.
    pub fn socket(&self) -> PathBuf {
        self.home().join("host/server.sock")
    }

    /// The environment of the server, the CLI and piw.
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        [
            (
                "PI_WORKFLOWS_RUNNER",
                program(
                    "PI_WORKFLOWS_SCRIPTED_RUNNER",
                    "pi-workflows-scripted-runner",
                )
                .into_os_string(),
            ),
            (
                "PI_WORKFLOWS_CONTROLLER_RUNNER",
                program(
                    "PI_WORKFLOWS_SCRIPTED_CONTROLLER",
                    "pi-workflows-scripted-controller",
                )
                .into_os_string(),
            ),
            ("PI_WORKFLOWS_HOME", self.home().into_os_string()),
            ("PI_WORKFLOWS_BIN", bin().into_os_string()),
            ("HOME", self.dir.path().as_os_str().to_owned()),
            ("PI_WORKFLOWS_IDLE_EXIT_MS", "600000".into()),
        ]
        .into_iter()
        .map(|(key, value)| (OsString::from(key), value))
        .collect()
    }

    /// Runs the CLI; its stdout (the command must succeed).
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new(bin())
            .envs(self.env())
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run the CLI");
        assert!(
            output.status.success(),
            "pi-workflows {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// Starts a headless run of one of piw's scripts; its run id.
    pub fn start(&self, name: &str) -> String {
        let out = self.cli(&["start", script(name).to_str().unwrap(), "--json"]);
        let receipt: Value = serde_json::from_str(&out).unwrap();
        receipt["runId"].as_str().unwrap().to_owned()
    }

    /// `pi-workflows view RUN --once --json`.
    pub fn view(&self, run_id: &str) -> Value {
        serde_json::from_str(&self.cli(&["view", run_id, "--once", "--json"])).unwrap()
    }

    /// Waits until the run's display status is `status`.
    pub fn wait_status(&self, run_id: &str, status: &str) -> Value {
        wait_for(
            &format!("{run_id} {status}"),
            Duration::from_secs(30),
            || {
                let view = self.view(run_id);
                (view["display"]["status"] == status).then_some(view)
            },
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new(bin())
                .envs(self.env())
                .args(["server", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A running `piw serve` for a server.
pub struct RelayProcess {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub address: String,
}

impl RelayProcess {
    /// Starts `piw serve --bind <bind>` (port 0 picks one) and reads its
    /// address line.
    pub fn start(server: &Server, bind: &str) -> Self {
        let mut child = Command::new(piw())
            .envs(server.env())
            .args(["serve", "--bind", bind])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn piw serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read the relay line");
        let address = line
            .trim()
            .strip_prefix("piw serve: relaying ws://")
            .and_then(|rest| rest.strip_suffix("/ws"))
            .unwrap_or_else(|| panic!("not the relay line: {line:?}"))
            .to_owned();
        Self { child, address }
    }

    /// `ws://ADDRESS/ws`.
    pub fn url(&self) -> String {
        format!("ws://{}/ws", self.address)
    }

    /// How many sockets the relay process holds open (its listener, and a
    /// TCP and a server-socket connection per WebSocket).
    pub fn sockets(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .expect("the relay's fds")
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("socket:"))
            .count()
    }

    /// Stops it (SIGKILL, so its connections drop at once).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private tmux server with one window running one command.
pub struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// Starts `command` (argv) with `env` in a `cols`×`rows` window; the
    /// pane stays after the command exits so its last screen can be read.
    pub fn start(
        dir: &Path,
        env: &[(OsString, OsString)],
        command: &[&str],
        cols: u16,
        rows: u16,
    ) -> Self {
        let socket = dir.join("tmux.sock");
        let tmux = Self { socket };
        let mut args: Vec<OsString> = vec![
            "new-session".into(),
            "-d".into(),
            "-s".into(),
            "main".into(),
            "-x".into(),
            cols.to_string().into(),
            "-y".into(),
            rows.to_string().into(),
        ];
        args.push("env".into());
        for (key, value) in env {
            let mut pair = key.clone();
            pair.push("=");
            pair.push(value);
            args.push(pair);
        }
        args.push("TERM=xterm-256color".into());
        args.extend(command.iter().map(OsString::from));
        args.extend([";", "set-option", "-g", "remain-on-exit", "on"].map(OsString::from));
        tmux.run(&args, true);
        tmux
    }

    fn run(&self, args: &[OsString], check: bool) -> String {
        let output = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("-f")
            .arg("/dev/null")
            .args(args)
            .output()
            .expect("tmux is installed");
        if check {
            assert!(
                output.status.success(),
                "tmux {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Sends keys (tmux key names: `Down`, `Enter`, `p`, …).
    pub fn keys(&self, keys: &[&str]) {
        let mut args: Vec<OsString> = vec!["send-keys".into(), "-t".into(), "main".into()];
        args.extend(keys.iter().map(OsString::from));
        self.run(&args, true);
    }

    /// The visible screen.
    pub fn screen(&self) -> String {
        self.run(
            &["capture-pane", "-p", "-t", "main"].map(OsString::from),
            true,
        )
    }

    /// Resizes the window.
    pub fn resize(&self, cols: u16, rows: u16) {
        let (cols, rows) = (cols.to_string(), rows.to_string());
        self.run(
            &["resize-window", "-t", "main", "-x", &cols, "-y", &rows].map(OsString::from),
            true,
        );
    }

    /// A tmux format of the pane (`#{alternate_on}`, `#{pane_pid}`, …).
    pub fn format(&self, format: &str) -> String {
        self.run(
            &["display-message", "-p", "-t", "main", format].map(OsString::from),
            true,
        )
        .trim()
        .to_owned()
    }

    /// Kills the tmux server: the pane's terminal goes away under its
    /// command (as when a terminal window is closed).
    pub fn kill_server(&self) {
        self.run(&["kill-server".into()], false);
    }

    /// Whether the pane's command has exited.
    pub fn exited(&self) -> bool {
        self.run(
            &["display-message", "-p", "-t", "main", "#{pane_dead}"].map(OsString::from),
            true,
        )
        .trim()
            == "1"
    }

    /// Waits (bounded) until the screen satisfies `check`; the screen.
    pub fn wait_screen(&self, what: &str, mut check: impl FnMut(&str) -> bool) -> String {
        let mut last = String::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            last = self.screen();
            if check(&last) {
                return last;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("timed out waiting for {what}; the screen:\n{last}");
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
