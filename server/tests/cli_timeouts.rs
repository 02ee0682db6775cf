//! Every CLI command's wait is bounded: against a socket that accepts and
//! never answers, or answers the hello and never a request, each command
//! exits within its bound (`PI_WORKFLOWS_CLI_TIMEOUT_MS`) with one line that
//! says what it waited for, and the documented exit code 6.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{TestServer, script};

/// How the fake server behaves.
#[derive(Clone, Copy, Debug)]
enum Silence {
    /// Accepts connections and never writes a byte.
    BeforeHello,
    /// Answers the hello, then never answers a request.
    AfterHello,
}

/// A listener at the server's socket path that accepts every connection and
/// keeps it open without answering (as `silence` says). Connections stay
/// open until the test ends.
fn fake_server(server: &TestServer, silence: Silence) -> Arc<Mutex<Vec<UnixStream>>> {
    let socket = server.socket();
    let host = socket.parent().unwrap();
    std::fs::create_dir_all(host).unwrap();
    std::fs::set_permissions(host, std::fs::Permissions::from_mode(0o700)).unwrap();
    let listener = UnixListener::bind(&socket).unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            keep.lock().unwrap().push(stream.try_clone().unwrap());
            if let Silence::AfterHello = silence {
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut hello = String::new();
                    if reader.read_line(&mut hello).is_err() {
                        return;
                    }
                    let mut writer = stream;
                    let _ = writer.write_all(
                        format!(
                            "{{\"packageVersion\":\"{}\",\"protocolVersion\":1,\"role\":\"server\",\"schema\":\"pi-workflows.client.v1\",\"serverEpoch\":1,\"type\":\"hello\"}}\n",
                            env!("CARGO_PKG_VERSION")
                        )
                        .as_bytes(),
                    );
                    // Read (and ignore) requests until the client goes away.
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                        line.clear();
                    }
                });
            }
        }
    });
    held
}

/// Runs the CLI; `None` when it did not finish within `limit` (it is killed).
fn run_bounded(server: &TestServer, args: &[&str], limit: Duration) -> Option<Output> {
    let mut child = server
        .command()
        .env("PI_WORKFLOWS_CLI_TIMEOUT_MS", "1000")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the CLI");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every command that talks to the server.
fn commands(linear: &str) -> Vec<Vec<String>> {
    let run = "20260101T000000Z-linear-00000000";
    [
        vec!["list"],
        vec!["start", linear],
        vec!["runs"],
        vec!["view", run, "--once"],
        vec!["view", run],
        vec!["pause", run],
        vec!["resume", run],
        vec!["cancel", run],
        vec!["restart", run],
        vec!["answer", run, "{}"],
        vec!["server", "status"],
        vec!["server", "stop"],
        vec!["server", "start"],
        vec!["state", "verify"],
        vec!["state", "backup", "/tmp/pi-workflows-timeout-backup.sqlite"],
        vec!["state", "prune"],
    ]
    .into_iter()
    .map(|args| args.into_iter().map(str::to_owned).collect())
    .collect()
}

fn every_command_ends_within_its_bound(silence: Silence, waited_for: &str) {
    let server = TestServer::new(&[]);
    let _held = fake_server(&server, silence);
    let linear = script("linear.json");
    let mut problems = Vec::new();
    for args in commands(&linear.to_string_lossy()) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if matches!(silence, Silence::AfterHello) && args == ["server", "start"] {
            // A server that answers its hello is running: `server start` has
            // nothing to wait for (it says "already running").
            continue;
        }
        let started = Instant::now();
        let Some(output) = run_bounded(&server, &args, Duration::from_secs(10)) else {
            problems.push(format!("`{}` still waited after 10 s", args.join(" ")));
            continue;
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Progress notes ("pi-workflows: resolving …") may come first; the
        // error is the one last line.
        let lines: Vec<&str> = stderr.lines().collect();
        let (error, notes) = lines.split_last().unwrap_or((&"", &[]));
        let ok = output.status.code() == Some(6)
            && notes.iter().all(|note| note.ends_with('…'))
            && error.starts_with("pi-workflows: ")
            && error.contains(waited_for)
            && error.contains("PI_WORKFLOWS_CLI_TIMEOUT_MS");
        if !ok {
            problems.push(format!(
                "`{}` after {:?}: exit {:?}, stderr {stderr:?}",
                args.join(" "),
                started.elapsed(),
                output.status.code()
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn every_command_gives_up_on_a_server_that_never_says_hello() {
    every_command_ends_within_its_bound(Silence::BeforeHello, "did not answer the hello");
}

#[test]
fn every_command_gives_up_on_a_server_that_never_answers_its_request() {
    every_command_ends_within_its_bound(Silence::AfterHello, "did not answer `");
}
