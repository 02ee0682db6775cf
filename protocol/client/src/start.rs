//! On-demand start: run `<bin> server run --ready-line` detached, in its
//! own process group, with stderr appended to `host/server.log`, and wait
//! (bounded) for its ready line.
//!
//! Invariants:
//! - The wait is bounded ([`SERVER_READY_DEADLINE`]); a starting server
//!   waits for nothing (not even a crashed server's lease), so the bound
//!   only covers a slow or overloaded machine.
//! - A server that refuses to start says why on its ready line (`error
//!   <one line>`); that line is the error, word for word. Nothing else of
//!   the server's output (paths, system errors) reaches the caller.
//! - The server outlives the client: it is not the client's child in any
//!   way that ties their lifetimes (own process group, stdin closed).

use crate::home::Home;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// How long a start waits for the ready line.
pub const SERVER_READY_DEADLINE: Duration = Duration::from_secs(30);

/// What to start and how.
#[derive(Clone, Debug)]
pub struct StartCommand {
    /// The `pi-workflows` binary.
    pub bin: PathBuf,
    /// Environment variables set for the server on top of the inherited
    /// environment (`PI_WORKFLOWS_HOME` is always set to the home).
    pub env: Vec<(OsString, OsString)>,
}

impl StartCommand {
    /// The binary named by `PI_WORKFLOWS_BIN`, else `pi-workflows` on `PATH`.
    pub fn installed() -> Self {
        Self {
            bin: std::env::var_os("PI_WORKFLOWS_BIN")
                .filter(|bin| !bin.is_empty())
                .map_or_else(|| PathBuf::from("pi-workflows"), PathBuf::from),
            env: Vec::new(),
        }
    }

    /// Starts a server for `home` and returns its epoch once it is ready,
    /// or its one-line reason (or a line of ours) when it is not.
    pub fn spawn(&self, home: &Home) -> Result<u64, String> {
        if home.prepare().is_err() {
            return Err("cannot create the state directory; check PI_WORKFLOWS_HOME".into());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(home.server_log_path())
            .map_err(|_| "cannot open the server log; check PI_WORKFLOWS_HOME".to_owned())?;
        let mut command = std::process::Command::new(&self.bin);
        command
            .args(["server", "run", "--ready-line"])
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .env("PI_WORKFLOWS_HOME", home.root())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        let mut child = command
            .spawn()
            .map_err(|_| "cannot start the pi-workflows server process; check that pi-workflows is installed (PI_WORKFLOWS_BIN names it)".to_owned())?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| "cannot read the server's ready line".to_owned())?;
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = sender.send(line);
            // Reap the server when it exits, so it never stays a zombie of
            // a long-lived client.
            let _ = child.wait();
        });
        match receiver.recv_timeout(SERVER_READY_DEADLINE) {
            Ok(line) if line.starts_with("ready ") => Ok(line.trim()[6..].parse().unwrap_or(0)),
            Ok(line) if line.starts_with("error ") => Err(line.trim()[6..].to_owned()),
            Ok(_) => Err(
                "the server exited during startup; see host/server.log under PI_WORKFLOWS_HOME"
                    .into(),
            ),
            Err(_) => Err(
                "the server did not become ready in time; see host/server.log under PI_WORKFLOWS_HOME"
                    .into(),
            ),
        }
    }
}
