//! `pi-workflows server start | stop | status` (`server run` is parsed here
//! and run by the binary, which links the server).

use super::{Exit, Failure, Settings};
use pi_workflows_client::{CallOptions, ClientError, StartCommand, WorkflowClient, ops};
use protocol::generated::types::EmptyPayload;
use serde_json::{Value, json};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Subcommand)]
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
    settings: &Settings,
    runtime: &tokio::runtime::Runtime,
) -> ExitCode {
    match command {
        ServerCommand::Run { .. } => fail(
            Exit::Usage,
            "`server run` is run by the pi-workflows binary itself; run `pi-workflows server run`",
        ),
        ServerCommand::Start => start(settings, runtime),
        ServerCommand::Stop => runtime.block_on(stop(settings)),
        ServerCommand::Status { json } => runtime.block_on(status(settings, json)),
    }
}

fn fail(exit: Exit, message: &str) -> ExitCode {
    super::fail_with(exit, message)
}

/// The one error line and exit code of a client error.
fn client_failure(error: ClientError) -> ExitCode {
    let failure = Failure::from(error);
    fail(failure.exit, &failure.message)
}

/// A client that never starts a server (the answer limit applies).
async fn probe(settings: &Settings) -> Result<WorkflowClient, ClientError> {
    Ok(probe_epoch(settings).await?.0)
}

/// [`probe`], with the epoch of the server that answered.
async fn probe_epoch(settings: &Settings) -> Result<(WorkflowClient, u64), ClientError> {
    let mut client = WorkflowClient::new(settings.client_options("cli", false));
    let epoch = client.connect().await?;
    Ok((client, epoch))
}

/// Starts the server in the background (unless one runs) and waits for its
/// ready line.
fn start(settings: &Settings, runtime: &tokio::runtime::Runtime) -> ExitCode {
    match runtime.block_on(probe(settings)) {
        Ok(_) => {
            println!("pi-workflows server is already running");
            return ExitCode::SUCCESS;
        }
        Err(ClientError::Unavailable) => {}
        // Something answers at the socket: starting another server cannot help.
        Err(error) => return client_failure(error),
    }
    let command = StartCommand {
        bin: std::env::current_exe().unwrap_or_else(|_| "pi-workflows".into()),
        env: Vec::new(),
    };
    match command.spawn(&settings.home) {
        Ok(epoch) => {
            println!("pi-workflows server started (epoch {epoch})");
            ExitCode::SUCCESS
        }
        Err(message) => fail(Exit::Refused, &message),
    }
}

async fn stop(settings: &Settings) -> ExitCode {
    let (mut client, epoch) = match probe_epoch(settings).await {
        Ok(answered) => answered,
        Err(ClientError::Unavailable) => {
            println!("pi-workflows server is not running");
            return ExitCode::SUCCESS;
        }
        Err(error) => return client_failure(error),
    };
    match client
        .call::<ops::ServerStop>(None, &EmptyPayload {}, CallOptions::default())
        .await
    {
        Ok(_) => {}
        Err(error @ ClientError::TimedOut { .. }) => return client_failure(error),
        Err(_) => {
            return fail(
                Exit::Refused,
                "the server refused to stop; retry `pi-workflows server stop`",
            );
        }
    }
    drop(client);
    // The server closes the socket when it has stored every receipt and
    // parked its runs, and releases the server lock as it exits. A client
    // may start a new server at once (the Pi extension does when its
    // connection drops): one that answers with another epoch holds the
    // lock the stopped server released.
    let deadline = Instant::now() + settings.stop_grace + Duration::from_secs(30);
    while Instant::now() < deadline {
        match probe_epoch(settings).await {
            Ok((_, now)) if now != epoch => {
                println!(
                    "pi-workflows server stopped (epoch {epoch}); a client started a new server at once (epoch {now})"
                );
                return ExitCode::SUCCESS;
            }
            Ok(_) => {}
            Err(_) if settings.home.server_lock_is_free() => {
                println!("pi-workflows server stopped (epoch {epoch})");
                return ExitCode::SUCCESS;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fail(
        Exit::Refused,
        "the server did not stop in time; check host/server.log under PI_WORKFLOWS_HOME",
    )
}

async fn status(settings: &Settings, json_output: bool) -> ExitCode {
    let mut client = match probe(settings).await {
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
    let receipt = match client
        .call::<ops::ServerStatus>(None, &EmptyPayload {}, CallOptions::default())
        .await
    {
        Ok(accepted) => serde_json::to_value(&accepted.receipt).unwrap_or_default(),
        Err(error @ (ClientError::TimedOut { .. } | ClientError::Lost(_))) => {
            return client_failure(error);
        }
        Err(_) => {
            return fail(
                Exit::Refused,
                "the server did not report its status; retry `pi-workflows server status`",
            );
        }
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
