//! `pi-workflows server run | start | stop | status`.

use super::{Exit, Failure, connect_bounded};
use crate::client::{ClientError, RequestSpec};
use crate::config::Config;
use crate::fault::Faults;
use crate::serve::{self, Readiness};
use clap::Subcommand;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Subcommand)]
pub(super) enum ServerCommand {
    /// Run the server attached to this terminal.
    Run {
        /// Print `ready <epoch>` on stdout once ready (used by `server start`).
        #[arg(long, hide = true)]
        ready_line: bool,
    },
    /// Start the server in the background and wait until it is ready.
    Start,
    /// Stop the server after in-flight commands stored their receipts.
    Stop,
    /// Show the server state and work counts.
    Status {
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
}

/// Runs one server command.
pub(super) fn main(
    command: ServerCommand,
    config: &Config,
    runtime: &tokio::runtime::Runtime,
) -> ExitCode {
    match command {
        ServerCommand::Run { ready_line } => {
            let readiness = if ready_line {
                Readiness::Line
            } else {
                Readiness::Human
            };
            match runtime.block_on(serve::run(config.clone(), Faults::from_env(), readiness)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    if ready_line {
                        println!("error {error}");
                    }
                    fail(Exit::Refused, &error.to_string())
                }
            }
        }
        ServerCommand::Start => start(config, runtime),
        ServerCommand::Stop => runtime.block_on(stop(config)),
        ServerCommand::Status { json } => runtime.block_on(status(config, json)),
    }
}

fn fail(exit: Exit, message: &str) -> ExitCode {
    eprintln!("pi-workflows: {message}");
    exit.into()
}

/// The one error line and exit code of a client error.
fn client_failure(error: ClientError) -> ExitCode {
    let failure = Failure::from(error);
    fail(failure.exit, &failure.message)
}

/// Starts the server in the background (unless one runs) and waits for its
/// ready line.
fn start(config: &Config, runtime: &tokio::runtime::Runtime) -> ExitCode {
    match runtime.block_on(connect_bounded(config, "cli")) {
        Ok(_) => {
            println!("pi-workflows server is already running");
            return ExitCode::SUCCESS;
        }
        Err(ClientError::Unavailable) => {}
        // Something answers at the socket: starting another server cannot help.
        Err(error) => return client_failure(error),
    }
    match spawn_server(config) {
        Ok(epoch) => {
            println!("pi-workflows server started (epoch {epoch})");
            ExitCode::SUCCESS
        }
        Err(message) => fail(Exit::Refused, &message),
    }
}

/// How long `server start` (and a command that starts the server) waits for
/// the ready line.
const SERVER_READY_DEADLINE: Duration = Duration::from_secs(30);

/// Spawns `pi-workflows server run --ready-line` detached and waits for it.
pub fn spawn_server(config: &Config) -> Result<u64, String> {
    if crate::home::prepare(config).is_err() {
        return Err("cannot create the state directory; check PI_WORKFLOWS_HOME".into());
    }
    let log = crate::home::open_log(&config.host_dir().join("server.log"))
        .map_err(|_| "cannot open the server log; check PI_WORKFLOWS_HOME".to_owned())?;
    let exe = std::env::current_exe()
        .map_err(|_| "cannot find the pi-workflows executable".to_owned())?;
    let mut child = std::process::Command::new(exe)
        .args(["server", "run", "--ready-line"])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|_| "cannot start the pi-workflows server process".to_owned())?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| "cannot read the server's ready line".to_owned())?;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(line);
    });
    // A starting server waits for nothing (not even a crashed server's
    // lease); the bound only covers a slow or overloaded machine.
    match receiver.recv_timeout(SERVER_READY_DEADLINE) {
        Ok(line) if line.starts_with("ready ") => Ok(line.trim()[6..].parse().unwrap_or(0)),
        Ok(line) if line.starts_with("error ") => Err(line.trim()[6..].to_owned()),
        Ok(_) => Err(
            "the server exited during startup; see host/server.log under PI_WORKFLOWS_HOME".into(),
        ),
        Err(_) => Err(
            "the server did not become ready in time; see host/server.log under PI_WORKFLOWS_HOME"
                .into(),
        ),
    }
}

async fn stop(config: &Config) -> ExitCode {
    let mut client = match connect_bounded(config, "cli").await {
        Ok(client) => client,
        Err(ClientError::Unavailable) => {
            println!("pi-workflows server is not running");
            return ExitCode::SUCCESS;
        }
        Err(error) => return client_failure(error),
    };
    match client
        .request(&RequestSpec::read("server.stop", None, json!({})))
        .await
    {
        Ok(response) if response.outcome == "accepted" => {}
        Err(error @ ClientError::TimedOut { .. }) => return client_failure(error),
        Ok(_) | Err(_) => {
            return fail(
                Exit::Refused,
                "the server refused to stop; retry `pi-workflows server stop`",
            );
        }
    }
    // The server closes the socket when it has stored every receipt and parked its runs.
    let deadline = Instant::now() + Duration::from_millis(config.stop_grace_ms + 30_000);
    while Instant::now() < deadline {
        if connect_bounded(config, "cli").await.is_err() && crate::home::lock(config).is_ok() {
            println!("pi-workflows server stopped");
            return ExitCode::SUCCESS;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fail(
        Exit::Refused,
        "the server did not stop in time; check host/server.log under PI_WORKFLOWS_HOME",
    )
}

async fn status(config: &Config, json_output: bool) -> ExitCode {
    let mut client = match connect_bounded(config, "cli").await {
        Ok(client) => client,
        Err(ClientError::Unavailable) => {
            if json_output {
                println!(
                    "{}",
                    json!({ "state": "stopped", "socketAvailable": false })
                );
            } else {
                println!(
                    "pi-workflows server: stopped (start it with `pi-workflows server start`)"
                );
            }
            return Exit::NotRunning.into();
        }
        Err(error) => return client_failure(error),
    };
    let response = match client
        .request(&RequestSpec::read("server.status", None, json!({})))
        .await
    {
        Ok(response) => response,
        Err(error) => return client_failure(error),
    };
    let Some(receipt) = response.receipt else {
        return fail(
            Exit::Refused,
            "the server did not report its status; retry `pi-workflows server status`",
        );
    };
    if json_output {
        let mut value = receipt.clone();
        value["state"] = json!("running");
        println!("{value}");
    } else {
        print_status(&receipt);
    }
    ExitCode::SUCCESS
}

fn print_status(receipt: &Value) {
    let field = |key: &str| receipt.get(key).and_then(Value::as_u64).unwrap_or(0);
    println!(
        "pi-workflows server: running (epoch {})",
        field("serverEpoch")
    );
    println!("  socket               available");
    println!("  active runners       {}", field("activeRunners"));
    println!("  runs queued          {}", field("queued"));
    println!("  runs running         {}", field("running"));
    println!("  runs parked          {}", field("parked"));
    println!("  runs waiting         {}", field("waiting"));
    println!("  expired claims       {}", field("expiredClaims"));
    println!("  pending interactions {}", field("pendingInteractions"));
    println!("  ambiguous effects    {}", field("ambiguousEffects"));
}
