//! The `pi-workflows` command line.
//!
//! Invariants:
//! - Every error is one line on stderr, `pi-workflows: <what happened>; <what
//!   to do next>`, and every exit code is documented in `docs/CLI.md`.
//! - `--json` output is one JSON document per line with the shapes in
//!   `docs/CLI.md`; nothing else is written to stdout in that mode.
//! - The CLI never opens SQLite: everything goes through the server socket.
//!   Commands that need the server start it when it is not running.

mod render;
mod runs;
mod server;
mod view;

use crate::client::{Client, ClientError, Response};
use crate::config::Config;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub use server::spawn_server;

/// The documented exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Success; a watched run completed.
    Ok = 0,
    /// The server refused or failed the command; a watched run failed,
    /// timed out or was cancelled.
    Refused = 1,
    /// Usage or configuration error.
    Usage = 2,
    /// `server status`: the server is not running.
    NotRunning = 3,
    /// The run (or workflow) does not exist.
    NotFound = 4,
    /// The server is unavailable or speaks another package version.
    Unavailable = 5,
    /// The server did not answer within `PI_WORKFLOWS_CLI_TIMEOUT_MS`.
    TimedOut = 6,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// A command's failure: its exit code and one line for stderr.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Self {
        let exit = match &error {
            ClientError::TimedOut { .. } => Exit::TimedOut,
            ClientError::Unavailable
            | ClientError::VersionMismatch(_)
            | ClientError::Refused(_)
            | ClientError::Protocol(_) => Exit::Unavailable,
        };
        Self::new(exit, error.to_string())
    }
}

type Outcome = Result<Exit, Failure>;

/// Command-line interface of pi-workflows.
#[derive(Debug, Parser)]
#[command(
    name = "pi-workflows",
    version,
    about = "Durable agent workflows for the Pi coding agent"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the workflows discovered for this directory and the user.
    List {
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
    /// Start a headless run of a workflow (by name or `.workflow.ts` path).
    Start {
        /// A discovered workflow name or a path to a `.workflow.ts` file.
        workflow: String,
        /// The task, as words (becomes `{"task": "<words>"}`).
        task: Vec<String>,
        /// The complete input as JSON (instead of a task).
        #[arg(long, value_name = "JSON", conflicts_with = "task")]
        input_json: Option<String>,
        /// Follow the run live until it ends.
        #[arg(long, conflicts_with = "json")]
        watch: bool,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
        /// Makes a retry safe: the same command with the same key adopts
        /// the run the first attempt started (docs/CLI.md).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// List runs, newest first.
    Runs {
        /// How many runs to show.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Continue after this cursor (from a previous `--json` page).
        #[arg(long)]
        cursor: Option<String>,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
    /// Show a run's live view (follows it until it ends by default).
    View {
        run_id: String,
        /// Print the current view once and exit.
        #[arg(long, conflicts_with = "watch")]
        once: bool,
        /// Follow the run until it ends (the default).
        #[arg(long)]
        watch: bool,
        /// Print the view as JSON (one document per revision when following).
        #[arg(long)]
        json: bool,
    },
    /// Pause a run at its next safe point.
    Pause(ControlArgs),
    /// Resume a paused or parked run.
    Resume(ControlArgs),
    /// Cancel a run.
    Cancel(ControlArgs),
    /// Start a new run with the same workflow and input as a finished one.
    Restart(ControlArgs),
    /// Answer a run's waiting checkpoint with a JSON value.
    Answer {
        run_id: String,
        /// The answer as JSON.
        answer: String,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
        /// Makes a retry safe: the same answer with the same key adopts the
        /// first attempt's receipt (docs/CLI.md).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// Manage the user-level server.
    #[command(subcommand)]
    Server(server::ServerCommand),
}

#[derive(Debug, clap::Args)]
struct ControlArgs {
    run_id: String,
    /// Print JSON (schema in docs/CLI.md).
    #[arg(long)]
    json: bool,
    /// Makes a retry safe: the same command with the same key adopts the
    /// first attempt's receipt (docs/CLI.md).
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
}

/// Runs the CLI and returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(error) => return fail(Failure::new(Exit::Usage, error.to_string())),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    let outcome = match cli.command {
        Command::Server(command) => return server::main(command, &config, &runtime),
        Command::List { json } => runtime.block_on(runs::list(&config, json)),
        Command::Start {
            workflow,
            task,
            input_json,
            watch,
            json,
            idempotency_key,
        } => runtime.block_on(runs::start(
            &config,
            runs::StartArgs {
                workflow,
                task,
                input_json,
                watch,
                json,
                idempotency_key,
            },
        )),
        Command::Runs {
            limit,
            cursor,
            json,
        } => runtime.block_on(runs::runs(&config, limit, cursor, json)),
        Command::View {
            run_id,
            once,
            watch: _,
            json,
        } => runtime.block_on(view::view(&config, &run_id, !once, json)),
        Command::Pause(args) => runtime.block_on(runs::control(&config, "run.pause", args)),
        Command::Resume(args) => runtime.block_on(runs::control(&config, "run.resume", args)),
        Command::Cancel(args) => runtime.block_on(runs::control(&config, "run.cancel", args)),
        Command::Restart(args) => runtime.block_on(runs::control(&config, "run.restart", args)),
        Command::Answer {
            run_id,
            answer,
            json,
            idempotency_key,
        } => runtime.block_on(runs::answer(
            &config,
            &run_id,
            &answer,
            json,
            idempotency_key,
        )),
    };
    match outcome {
        Ok(exit) => exit.into(),
        Err(failure) => fail(failure),
    }
}

fn fail(failure: Failure) -> ExitCode {
    eprintln!("pi-workflows: {}", failure.message);
    failure.exit.into()
}

/// Connects to the server with the CLI's answer limit
/// (`PI_WORKFLOWS_CLI_TIMEOUT_MS` for the hello and each response).
async fn connect_bounded(config: &Config, client_id: &str) -> Result<Client, ClientError> {
    Client::connect_within(
        &config.socket_path(),
        client_id,
        std::time::Duration::from_millis(config.cli_timeout_ms),
    )
    .await
}

/// Connects to the server, starting it in the background when none runs.
async fn connect(config: &Config) -> Result<Client, Failure> {
    connect_as(config, &crate::client::cli_client_id()).await
}

/// [`connect`] as `client_id` (a stable one when the command carries an
/// idempotency key, see `runs::Retry`).
async fn connect_as(config: &Config, client_id: &str) -> Result<Client, Failure> {
    let client_id = client_id.to_owned();
    match connect_bounded(config, &client_id).await {
        Err(ClientError::Unavailable) => {}
        other => return other.map_err(Failure::from),
    }
    eprintln!("pi-workflows: starting the server…");
    let spawn_config = config.clone();
    tokio::task::spawn_blocking(move || spawn_server(&spawn_config))
        .await
        .map_err(|_| Failure::new(Exit::Unavailable, "could not start the server; retry"))?
        .map_err(|message| Failure::new(Exit::Unavailable, message))?;
    Ok(connect_bounded(config, &client_id).await?)
}

/// Turns a refused response into a failure with its next action.
fn refused(response: &Response, run_id: Option<&str>) -> Failure {
    let message = response
        .error_message
        .clone()
        .unwrap_or_else(|| format!("the server answered {}", response.outcome));
    let not_found = response.error_code.as_deref() == Some("notFound");
    match response.outcome.as_str() {
        _ if not_found => Failure::new(
            Exit::NotFound,
            match run_id {
                Some(run_id) => {
                    format!("no run {run_id}; list runs with `pi-workflows runs`")
                }
                None => format!("{message}; list workflows with `pi-workflows list`"),
            },
        ),
        "unavailable" | "claimLost" | "conflict" => {
            Failure::new(Exit::Unavailable, format!("{message}; retry the command"))
        }
        _ => Failure::new(
            Exit::Refused,
            match run_id {
                Some(run_id) => format!(
                    "{message}; see its allowed controls with `pi-workflows view {run_id} --once`"
                ),
                None => message,
            },
        ),
    }
}
