//! The `pi-workflows` command line: every command but `server run` (which
//! the `pi-workflows` binary in the server package runs itself).
//!
//! Invariants:
//! - Every error is one line on stderr, `pi-workflows: <what happened>; <what
//!   to do next>`, and every exit code is documented in `docs/CLI.md`.
//! - `--json` output is one JSON document per line with the shapes in
//!   `docs/CLI.md`; nothing else is written to stdout in that mode.
//! - The CLI never opens SQLite, by construction: it depends on the client
//!   crate and not on the server crate (`server/tests/crate_graph.rs`).
//!   Everything goes through the server socket; commands that need the
//!   server start it when it is not running.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod channel;
mod herdr;
mod live_settings;
mod render;
mod resources;
mod runs;
mod server;
mod state;
mod view;
mod why;

use clap::{Parser, Subcommand};
use pi_workflows_client::home::{self, Home, SettingError};
use pi_workflows_client::{ClientError, ClientOptions, StartCommand, WorkflowClient};
use std::process::ExitCode;
use std::time::Duration;

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
            ClientError::NotFound { .. } => Exit::NotFound,
            ClientError::Refused { .. } | ClientError::Invalid(_) => Exit::Refused,
            ClientError::Unavailable
            | ClientError::StartFailed(_)
            | ClientError::VersionMismatch(_)
            | ClientError::ConnectionRefused(_)
            | ClientError::Lost(_)
            | ClientError::Conflict { .. }
            | ClientError::ClaimLost { .. }
            | ClientError::ServerUnavailable { .. }
            | ClientError::Content(_)
            | ClientError::KeptChanging
            | ClientError::NothingSubscribed => Exit::Unavailable,
        };
        Self::new(exit, error.to_string())
    }
}

type Outcome = Result<Exit, Failure>;

/// What the CLI reads from the environment (the server checks its own
/// variables when it starts).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) home: Home,
    /// `PI_WORKFLOWS_CLI_TIMEOUT_MS`: each wait for an answer.
    pub(crate) answer_limit: Duration,
    /// `PI_WORKFLOWS_STOP_GRACE_MS`: part of `server stop`'s wait.
    pub(crate) stop_grace: Duration,
}

impl Settings {
    fn from_env() -> Result<Self, SettingError> {
        let lookup = |name: &str| std::env::var(name).ok();
        Ok(Self {
            home: Home::from_lookup(lookup)?,
            answer_limit: home::positive_millis(
                &lookup,
                home::CLI_TIMEOUT_VARIABLE,
                home::DEFAULT_CLI_TIMEOUT,
            )?,
            stop_grace: home::positive_millis(
                &lookup,
                "PI_WORKFLOWS_STOP_GRACE_MS",
                Duration::from_millis(5_000),
            )?,
        })
    }

    /// Client options with the CLI's answer limit, as `client_id`; with
    /// `start` the client starts this very binary's server when none runs.
    pub(crate) fn client_options(&self, client_id: &str, start: bool) -> ClientOptions {
        let mut options = ClientOptions::new(self.home.clone());
        options.client_id = Some(client_id.to_owned());
        options.answer_limit = Some(self.answer_limit);
        options.reconnect_deadline = self.answer_limit;
        if start {
            options.start = Some(StartCommand {
                bin: std::env::current_exe().unwrap_or_else(|_| "pi-workflows".into()),
                env: Vec::new(),
            });
            options.on_start = Some(|| eprintln!("pi-workflows: starting the server…"));
        }
        options
    }
}

/// The client id of one CLI process.
pub(crate) fn cli_client_id() -> String {
    pi_workflows_client::ids::client_id("cli")
}

/// A connected client that starts the server when none runs.
async fn connect(settings: &Settings) -> Result<WorkflowClient, Failure> {
    connect_as(settings, &cli_client_id()).await
}

/// [`connect`] as `client_id` (a stable one when the command carries an
/// idempotency key, see `runs::Retry`).
async fn connect_as(settings: &Settings, client_id: &str) -> Result<WorkflowClient, Failure> {
    let mut client = WorkflowClient::new(settings.client_options(client_id, true));
    client.connect().await?;
    Ok(client)
}

/// The current time in Unix milliseconds (for ages in tables).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}
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
        /// The Pi model of the run's agent steps, as `provider/model` (a
        /// workflow's or node's own model wins).
        #[arg(long, value_name = "PROVIDER/MODEL")]
        model: Option<String>,
        /// The Pi thinking level of the run's agent steps: off, minimal,
        /// low, medium, high or xhigh.
        #[arg(long, value_name = "LEVEL")]
        thinking: Option<String>,
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
    /// Explain why a run is not progressing and who must act: its claim,
    /// runner, pending request, ambiguous effects, queue place, park and
    /// last commit, on one screen.
    Why {
        run_id: String,
        /// Print the explanation as JSON (the `run.why` receipt).
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
    /// Answer what a run waits on: a protected decision with a choice (and
    /// the text a choice takes), an ordinary checkpoint with a JSON value.
    Answer {
        run_id: String,
        /// The choice of a protected decision, or an ordinary checkpoint's
        /// answer as JSON.
        answer: String,
        /// The text of a choice that takes one.
        text: Vec<String>,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
        /// Makes a retry safe: the same answer with the same key adopts the
        /// first attempt's receipt (docs/CLI.md).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// Review an ambiguous managed effect: confirm it applied, or retry it
    /// (a duplicate in the external system is possible).
    Recover {
        run_id: String,
        /// confirm | retry
        action: String,
        /// The ambiguous effect (default: the run's only one).
        #[arg(long, value_name = "ID")]
        effect: Option<String>,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
        /// Makes a retry safe (docs/CLI.md).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// List the managed resources: Ready, generation and observed
    /// generation, deletion and the last reconcile error.
    Resources {
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
    /// Show one resource: its spec, status and conditions, queue, effects,
    /// child runs and recent events.
    Resource {
        controller: String,
        key: String,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
    /// Apply a resource spec (a JSON file) with the controller discovered
    /// from this directory (.pi/controllers/, then ~/.pi/agent/controllers/).
    Apply {
        controller: String,
        key: String,
        /// The spec: a file holding one JSON value.
        spec_file: String,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
        /// Makes a retry safe: the same apply with the same key adopts the
        /// first attempt's receipt (docs/CLI.md).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// Queue a resource for reconcile now.
    Reconcile {
        controller: String,
        key: String,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
        /// Makes a retry safe (docs/CLI.md).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// Request a resource's deletion: it is gone once its controller
    /// settles it with no finalizer left.
    Delete {
        controller: String,
        key: String,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
        /// Makes a retry safe (docs/CLI.md).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
    /// Show the live settings (the user's and this project's), or change
    /// them with `settings set`.
    Settings {
        #[command(subcommand)]
        command: Option<SettingsCommand>,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
    /// The supervised channel adapters (Telegram): status, reload, and the
    /// review of an interrupted send.
    #[command(subcommand)]
    Channel(channel::ChannelCommand),
    /// Manage the user-level server.
    #[command(subcommand)]
    Server(server::ServerCommand),
    /// Verify, back up or prune the state database (through the server).
    #[command(subcommand)]
    State(state::StateCommand),
    /// Herdr integration (piw panes opened from Pi).
    #[command(subcommand)]
    Herdr(HerdrCommand),
}

#[derive(Debug, Subcommand)]
enum HerdrCommand {
    /// Link (or repair) the Herdr plugin that opens piw in a Herdr pane.
    #[command(alias = "setup")]
    Sync {
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum SettingsCommand {
    /// Change settings: each KEY=VALUE sets a key (VALUE as JSON, or as
    /// text when it is not JSON; KEY=null deletes it), or --patch-file
    /// sends a JSON merge patch.
    Set {
        /// Change this directory's project settings (default: the user's).
        #[arg(long)]
        project: bool,
        /// KEY=VALUE pairs.
        pairs: Vec<String>,
        /// A file holding a JSON merge patch (an object; null deletes).
        #[arg(long, value_name = "FILE")]
        patch_file: Option<String>,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
        /// Makes a retry safe: the same change with the same key adopts the
        /// first attempt's receipt (docs/CLI.md).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
    },
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

/// What the command line asks for.
#[derive(Debug)]
pub enum Invocation {
    /// `server run [--ready-line]`: the binary runs the server itself.
    ServerRun { ready_line: bool },
    /// Any other command: [`run`] runs it.
    Command(Cli),
}

/// Parses the arguments (exits with clap's usage error or help).
pub fn parse() -> Invocation {
    let cli = Cli::parse();
    match cli.command {
        Command::Server(server::ServerCommand::Run { ready_line }) => {
            Invocation::ServerRun { ready_line }
        }
        _ => Invocation::Command(cli),
    }
}

/// Prints `pi-workflows: <message>` and returns `exit`.
pub fn fail_with(exit: Exit, message: &str) -> ExitCode {
    eprintln!("pi-workflows: {message}");
    exit.into()
}

/// Runs one parsed command and returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(error) => return fail(Failure::new(Exit::Usage, error.to_string())),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    let settings = &settings;
    let outcome = match cli.command {
        Command::Server(command) => return server::main(command, settings, &runtime),
        Command::Herdr(HerdrCommand::Sync { json }) => herdr::main(settings.home.root(), json),
        Command::Channel(command) => runtime.block_on(channel::run(settings, command)),
        Command::Resources { json } => runtime.block_on(resources::list(settings, json)),
        Command::Resource {
            controller,
            key,
            json,
        } => runtime.block_on(resources::show(settings, &controller, &key, json)),
        Command::Apply {
            controller,
            key,
            spec_file,
            json,
            idempotency_key,
        } => runtime.block_on(resources::apply(
            settings,
            resources::ApplyArgs {
                controller,
                key,
                spec_file,
                json,
                idempotency_key,
            },
        )),
        Command::Reconcile {
            controller,
            key,
            json,
            idempotency_key,
        } => runtime.block_on(resources::reference(
            settings,
            resources::RefCommand::Reconcile,
            &controller,
            &key,
            json,
            idempotency_key,
        )),
        Command::Delete {
            controller,
            key,
            json,
            idempotency_key,
        } => runtime.block_on(resources::reference(
            settings,
            resources::RefCommand::Delete,
            &controller,
            &key,
            json,
            idempotency_key,
        )),
        Command::Settings {
            command: None,
            json,
        } => runtime.block_on(live_settings::show(settings, json)),
        Command::Settings {
            command:
                Some(SettingsCommand::Set {
                    project,
                    pairs,
                    patch_file,
                    json,
                    idempotency_key,
                }),
            json: _,
        } => runtime.block_on(live_settings::set(
            settings,
            live_settings::SetArgs {
                project,
                pairs,
                patch_file,
                json,
                idempotency_key,
            },
        )),
        Command::State(command) => runtime.block_on(state::main(settings, command)),
        Command::List { json } => runtime.block_on(runs::list(settings, json)),
        Command::Start {
            workflow,
            task,
            input_json,
            watch,
            json,
            idempotency_key,
            model,
            thinking,
        } => runtime.block_on(runs::start(
            settings,
            runs::StartArgs {
                workflow,
                task,
                input_json,
                watch,
                json,
                idempotency_key,
                model,
                thinking,
            },
        )),
        Command::Runs {
            limit,
            cursor,
            json,
        } => runtime.block_on(runs::runs(settings, limit, cursor, json)),
        Command::View {
            run_id,
            once,
            watch: _,
            json,
        } => runtime.block_on(view::view(settings, &run_id, !once, json)),
        Command::Why { run_id, json } => runtime.block_on(why::why(settings, &run_id, json)),
        Command::Pause(args) => {
            runtime.block_on(runs::control(settings, runs::Control::Pause, args))
        }
        Command::Resume(args) => {
            runtime.block_on(runs::control(settings, runs::Control::Resume, args))
        }
        Command::Cancel(args) => {
            runtime.block_on(runs::control(settings, runs::Control::Cancel, args))
        }
        Command::Restart(args) => {
            runtime.block_on(runs::control(settings, runs::Control::Restart, args))
        }
        Command::Answer {
            run_id,
            answer,
            text,
            json,
            idempotency_key,
        } => runtime.block_on(runs::answer(
            settings,
            &run_id,
            &answer,
            &text,
            json,
            idempotency_key,
        )),
        Command::Recover {
            run_id,
            action,
            effect,
            json,
            idempotency_key,
        } => runtime.block_on(runs::recover(
            settings,
            runs::RecoverArgs {
                run_id,
                action,
                effect,
                json,
                idempotency_key,
            },
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

/// Turns a client error into a failure; a refusal of the server gets its
/// next action (it names the run when the request had one).
fn refused(error: ClientError, run_id: Option<&str>) -> Failure {
    let (code, message, retry) = match &error {
        ClientError::Refused { code, message } => (*code, message, false),
        ClientError::ServerUnavailable { code, message }
        | ClientError::ClaimLost { code, message }
        | ClientError::Conflict { code, message }
        | ClientError::NotFound { code, message } => (*code, message, true),
        _ => return Failure::from(error),
    };
    if code == protocol::ErrorCode::NotFound {
        return Failure::new(
            Exit::NotFound,
            match run_id {
                Some(run_id) => format!("no run {run_id}; list runs with `pi-workflows runs`"),
                None => format!("{message}; list workflows with `pi-workflows list`"),
            },
        );
    }
    if retry {
        return Failure::new(Exit::Unavailable, format!("{message}; retry the command"));
    }
    Failure::new(
        Exit::Refused,
        match run_id {
            Some(run_id) => format!(
                "{message}; see its allowed controls with `pi-workflows view {run_id} --once`"
            ),
            None => message.clone(),
        },
    )
}
