//! A real `pi-workflows server run` for the client's tests: the binary
//! named by `PI_WORKFLOWS_BIN` (else `target/debug/pi-workflows`) with the
//! scripted runner (`PI_WORKFLOWS_SCRIPTED_RUNNER`, else
//! `target/debug/pi-workflows-scripted-runner`) on a temporary home. Build
//! both first: `cargo build -p server`. The client crate depends on nothing
//! of the server but these two programs.
#![allow(dead_code, unreachable_pub)]

use pi_workflows_client::{ClientOptions, Home, StartCommand, WorkflowClient};
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn program(variable: &str, name: &str) -> PathBuf {
    let path = std::env::var_os(variable)
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../target/debug")
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

/// A test script of the server's black-box tests.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../server/tests/scripts")
        .join(name)
}

/// One server home and (at most) one server process on it.
pub struct Server {
    pub dir: tempfile::TempDir,
    pub home: Home,
    child: Option<Child>,
}

impl Server {
    /// A home with no server yet.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let home = Home::at(dir.path().join("state"));
        Self {
            dir,
            home,
            child: None,
        }
    }

    /// A running server.
    pub fn started() -> Self {
        let mut server = Self::new();
        server.spawn(&[]).expect("the server starts");
        server
    }

    /// The environment every server of the tests gets.
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
            ("PI_WORKFLOWS_HOME", self.home.root().as_os_str().to_owned()),
            ("PI_WORKFLOWS_CLAIM_TTL_MS", "1500".into()),
            ("PI_WORKFLOWS_SERVER_LEASE_MS", "3000".into()),
            ("PI_WORKFLOWS_STOP_GRACE_MS", "1000".into()),
            ("PI_WORKFLOWS_IDLE_EXIT_MS", "600000".into()),
        ]
        .into_iter()
        .map(|(key, value)| (OsString::from(key), value))
        .collect()
    }

    /// Starts `server run --ready-line` with `extra` variables; `Err` with
    /// the server's line when it did not become ready.
    pub fn spawn(&mut self, extra: &[(&str, &str)]) -> Result<u64, String> {
        let mut command = Command::new(bin());
        command
            .envs(self.env())
            .envs(extra.iter().copied())
            .args(["server", "run", "--ready-line"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = command.spawn().expect("spawn the server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read the ready line");
        match line.trim().strip_prefix("ready ") {
            Some(epoch) => {
                self.child = Some(child);
                Ok(epoch.parse().unwrap())
            }
            None => {
                let _ = child.wait();
                Err(line.trim().to_owned())
            }
        }
    }

    /// SIGKILLs the server (a crash).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits (bounded) for a server that kills itself at a fault point.
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
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

    /// Client options for this home (no on-demand start, bounded answers).
    pub fn options(&self) -> ClientOptions {
        let mut options = ClientOptions::new(self.home.clone());
        options.answer_limit = Some(Duration::from_secs(30));
        options.reconnect_deadline = Duration::from_secs(30);
        options
    }

    /// Client options that start this home's server on demand.
    pub fn starting_options(&self) -> ClientOptions {
        let mut options = self.options();
        options.start = Some(StartCommand {
            bin: bin(),
            env: self.env(),
        });
        options
    }

    /// A client of this home.
    pub fn client(&self) -> WorkflowClient {
        WorkflowClient::new(self.options())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        // A server a client started on demand is not our child: stop it
        // through its socket.
        let home = self.home.clone();
        let stop = std::process::Command::new(bin())
            .args(["server", "stop"])
            .env("PI_WORKFLOWS_HOME", home.root())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = stop;
    }
}
