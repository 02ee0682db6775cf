//! The `piw` binary: the terminal viewer (`piw [RUN_ID] [--connect URL]`)
//! and the relay (`piw serve [--bind ADDR]`); `piw --herdr-pane` is the
//! Herdr plugin pane's command (see [`piw::herdr`]). Every error is one line on
//! stderr and a non-zero exit.

use std::process::ExitCode;

use pi_workflows_client::{ClientOptions, Home, StartCommand};
use piw::app::App;
use piw::live::LiveSource;
use piw::theme::Theme;

const USAGE: &str = "usage: piw [RUN_ID] [--connect ws://127.0.0.1:9377/ws] [--theme NAME] | piw --herdr-pane | piw --list-themes | piw serve [--bind 127.0.0.1:9377]";

enum Mode {
    View {
        run_id: Option<String>,
        connect: Option<String>,
        theme: Theme,
    },
    Serve {
        bind: String,
    },
    Print(String),
}

fn value(args: &mut impl Iterator<Item = String>, flag: &str) -> Result<String, String> {
    args.next()
        .filter(|value| !value.starts_with("--"))
        .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Mode, String> {
    let mut run_id = None;
    let mut connect = None;
    let mut theme = Theme::default();
    let mut serve = false;
    let mut bind = piw::relay::DEFAULT_BIND.to_owned();
    let mut herdr_pane = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--help" | "-h" => return Ok(Mode::Print(format!("{USAGE}\n"))),
            "--version" => return Ok(Mode::Print(format!("piw {}\n", env!("CARGO_PKG_VERSION")))),
            "--list-themes" => return Ok(Mode::Print(Theme::listing())),
            "--theme" => {
                let name = value(&mut args, "--theme")?;
                theme = Theme::named(&name).ok_or_else(|| {
                    format!("there is no theme `{name}`; piw --list-themes lists them")
                })?;
            }
            "--connect" => {
                connect = Some(piw::connect::check_url(&value(&mut args, "--connect")?)?)
            }
            "--bind" if serve => bind = value(&mut args, "--bind")?,
            "--herdr-pane" => herdr_pane = true,
            "serve" if run_id.is_none() && !serve => serve = true,
            other if other.starts_with('-') => {
                return Err(format!("unknown option `{other}`; {USAGE}"));
            }
            other if run_id.is_none() && !serve => run_id = Some(other.to_owned()),
            other => return Err(format!("unexpected `{other}`; {USAGE}")),
        }
    }
    if serve {
        if connect.is_some() {
            return Err(format!("piw serve takes --bind, not --connect; {USAGE}"));
        }
        return Ok(Mode::Serve { bind });
    }
    if herdr_pane {
        if serve || run_id.is_some() || connect.is_some() {
            return Err(format!(
                "--herdr-pane takes its run from PI_WORKFLOWS_RUN_ID; {USAGE}"
            ));
        }
        run_id = Some(piw::herdr::label_pane(|name| std::env::var(name).ok())?);
    }
    Ok(Mode::View {
        run_id,
        connect,
        theme,
    })
}

fn home() -> Result<Home, String> {
    Home::from_env().map_err(|error| error.to_string())
}

fn serve(bind: &str) -> Result<(), String> {
    let home = home()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|_| "cannot start the relay's runtime; retry".to_owned())?;
    runtime.block_on(async {
        let relay = piw::relay::Relay::bind(bind, home.socket_path()).await?;
        // The one line a script (or a person) waits for.
        println!(
            "piw serve: relaying ws://{}{}",
            relay.local_addr(),
            piw::relay::PATH
        );
        tokio::select! {
            () = relay.serve() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok(())
    })
}

fn view(run_id: Option<String>, connect: Option<String>, theme: Theme) -> Result<(), String> {
    let home = home()?;
    let mut options = ClientOptions::new(home);
    options.client_id = Some(pi_workflows_client::ids::client_id("piw"));
    options.reconnect_deadline = std::time::Duration::from_secs(10);
    let unreachable = match &connect {
        Some(url) => {
            options.dialer = Some(piw::connect::dialer(url.clone()));
            Some(piw::connect::unreachable_line(url))
        }
        None => None,
    };
    // piw stops with one line when no server can be reached (or started
    // through the installed `pi-workflows`) or it runs another version;
    // once it runs, a lost server is a line on screen while it reconnects
    // (never starting one).
    probe(&options, connect.is_none(), unreachable.as_deref())?;
    use std::io::IsTerminal as _;
    if !std::io::stdout().is_terminal() {
        return Err("piw draws on a terminal; run it in one (use `pi-workflows view RUN_ID --json` for scripts)".into());
    }
    let key_prefix = pi_workflows_client::ids::client_id("piw-key");
    let app = App::new(theme, run_id, &key_prefix, piw::terminal::now_ms());
    let mut source = LiveSource::start(options, unreachable, || {});
    match piw::terminal::run(app, &mut source) {
        Ok(piw::terminal::Ended::Quit) => Ok(()),
        // The terminal is restored: end as the signal asked.
        Ok(piw::terminal::Ended::Signal(signal)) => piw::terminal::end_by(signal),
        Err(error) => Err(format!(
            "the terminal failed ({}); run piw in a terminal",
            error.kind()
        )),
    }
}

/// Connects once before the screen opens: the start (for the home's
/// socket) happens here, and a failure is piw's one line.
fn probe(options: &ClientOptions, start: bool, unreachable: Option<&str>) -> Result<(), String> {
    use pi_workflows_client::{ClientError, WorkflowClient};
    let mut options = options.clone();
    if start {
        options.start = Some(StartCommand::installed());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| "cannot start piw's runtime; retry".to_owned())?;
    runtime.block_on(async {
        let mut client = WorkflowClient::new(options);
        match client.connect().await {
            Ok(_) => Ok(()),
            Err(ClientError::Unavailable) => {
                Err(unreachable.map_or_else(|| ClientError::Unavailable.to_string(), str::to_owned))
            }
            Err(error) => Err(error.to_string()),
        }
    })
}

fn main() -> ExitCode {
    let outcome = match parse(std::env::args().skip(1)) {
        Ok(Mode::Print(text)) => {
            print!("{text}");
            Ok(())
        }
        Ok(Mode::Serve { bind }) => serve(&bind),
        Ok(Mode::View {
            run_id,
            connect,
            theme,
        }) => view(run_id, connect, theme),
        Err(line) => Err(line),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(line) => {
            eprintln!("piw: {line}");
            ExitCode::FAILURE
        }
    }
}
