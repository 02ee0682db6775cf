//! `pi-workflows`: one binary for the server and its command line.
//! `server run` runs the server (this package, the only one that links
//! SQLite); every other command is the command line of `pi-workflows-cli`,
//! which cannot open SQLite.

use pi_workflows_cli::{Exit, Invocation};
use server::config::Config;
use server::fault::Faults;
use server::serve::{self, Readiness};
use std::process::ExitCode;

fn main() -> ExitCode {
    let invocation = pi_workflows_cli::parse();
    // Every PI_WORKFLOWS_* variable is checked before any command runs, so a
    // bad one is a usage error (exit 2) whatever the command.
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(error) => return pi_workflows_cli::fail_with(Exit::Usage, &error.to_string()),
    };
    match invocation {
        Invocation::ServerRun { ready_line } => run_server(config, ready_line),
        Invocation::Command(command) => pi_workflows_cli::run(command),
    }
}

/// `server run [--ready-line]`: the server, attached to this process.
fn run_server(config: Config, ready_line: bool) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    let readiness = if ready_line {
        Readiness::Line
    } else {
        Readiness::Human
    };
    match runtime.block_on(serve::run(config, Faults::from_env(), readiness)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if ready_line {
                #[allow(clippy::print_stdout)]
                {
                    println!("error {error}");
                }
            }
            pi_workflows_cli::fail_with(Exit::Refused, &error.to_string())
        }
    }
}
