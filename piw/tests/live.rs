//! piw against the real server: the TUI in a real tmux (open, navigate,
//! pause, resume and cancel through keys, resize, clean exit; run under
//! strace, it never opens `state.sqlite`), controls parity with the CLI's
//! `view --json`, the Rust client and the TypeScript client (sdk-ts/dist,
//! through tests/fixtures/ts-view.mjs) after every control piw sends
//! (pause, resume, cancel, restart, activate, a checkpoint answer, a
//! protected decision's answer, an effect review),
//! the remote path through `piw serve` with reconnect, the resources screen
//! through `piw serve` (a resource applied with the CLI and the scripted
//! controller child), and the one-line errors. Needs `cargo build -p server` and tmux.

mod support;

use std::path::Path;
use std::time::Duration;

use pi_workflows_client::{CallOptions, ClientOptions, Home, WorkflowClient, ops};
use piw::model::control_spec;
use protocol::generated::types::Control;
use serde_json::Value;
use support::live::{RelayProcess, Server, Tmux, piw, wait_for};

/// What a document says piw must show: revision, status and controls.
#[derive(Debug, PartialEq, Eq)]
struct Shown {
    revision: u64,
    status: String,
    controls: Vec<String>,
}

fn shown_by_document(view: &Value) -> Shown {
    let controls = view["display"]["controls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|control| {
            let control: Control = serde_json::from_value(control.clone()).unwrap();
            let spec = control_spec(control);
            format!("[{}] {}", spec.key, spec.label)
        })
        .collect();
    Shown {
        revision: view["revision"].as_u64().unwrap(),
        status: view["display"]["status"].as_str().unwrap().to_owned(),
        controls,
    }
}

/// What piw's run screen shows: the header's `rev N` and status word, and
/// the controls row.
fn shown_by_piw(screen: &str) -> Option<Shown> {
    let mut lines = screen.lines();
    let header = lines.next()?;
    let revision = header
        .split("rev ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let status = header
        .trim_start()
        .strip_prefix("piw ")?
        .split_whitespace()
        .nth(1)?
        .to_owned();
    let controls = lines.next()?;
    let controls = controls
        .split("  ")
        .map(str::trim)
        .filter(|label| label.starts_with('['))
        .map(str::to_owned)
        .collect();
    Some(Shown {
        revision,
        status,
        controls,
    })
}

/// The Rust client's `run.view` of the same run.
fn shown_by_client(server: &Server, run_id: &str) -> Shown {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let view = runtime.block_on(async {
        let mut client = WorkflowClient::new(ClientOptions::new(Home::at(server.home())));
        client.run_view(run_id).await.unwrap()
    });
    shown_by_document(&serde_json::to_value(view).unwrap())
}

/// The TypeScript client's `runView` of the same run (a node process on
/// the built SDK).
fn shown_by_ts(server: &Server, run_id: &str) -> Shown {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ts-view.mjs");
    let output = std::process::Command::new("node")
        .envs(server.env())
        .arg(script)
        .arg(run_id)
        .output()
        .expect("node runs (and sdk-ts is built: npm --prefix sdk-ts run build)");
    assert!(
        output.status.success(),
        "the TypeScript client's view: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    shown_by_document(&serde_json::from_slice(&output.stdout).unwrap())
}

/// After a control: piw, the CLI, the Rust client and the TypeScript
/// client settle on the same revision, status and controls (the run is
/// stalled, so it settles).
fn assert_parity(server: &Server, tmux: &Tmux, run_id: &str, status: &str) -> String {
    assert_parity_where(server, tmux, run_id, status, |_| true)
}

/// [`assert_parity`] on a state the CLI's view also satisfies `wanted` in
/// (e.g. a control gone while the status stays).
fn assert_parity_where(
    server: &Server,
    tmux: &Tmux,
    run_id: &str,
    status: &str,
    wanted: impl Fn(&Shown) -> bool,
) -> String {
    let mut last = None;
    let screen = wait_for(
        &format!("piw, the CLI and the client to agree on {status}"),
        Duration::from_secs(30),
        || {
            let screen = tmux.screen();
            let cli = shown_by_document(&server.view(run_id));
            let client = shown_by_client(server, run_id);
            let ts = shown_by_ts(server, run_id);
            let piw = shown_by_piw(&screen);
            let agreed = cli.status == status
                && wanted(&cli)
                && piw.as_ref() == Some(&cli)
                && client == cli
                && ts == cli;
            last = Some((cli, client, ts, piw, screen.clone()));
            agreed.then_some(screen)
        },
    );
    let (cli, ..) = last.unwrap();
    assert!(screen.contains(run_id), "{screen}");
    eprintln!("agreed on {cli:?}");
    screen
}

fn wait_running_at(server: &Server, run_id: &str, node: &str) {
    wait_for(
        &format!("{run_id} at {node}"),
        Duration::from_secs(30),
        || {
            let view = server.view(run_id);
            (view["display"]["status"] == "running" && view["display"]["currentNode"] == node)
                .then_some(())
        },
    );
}

#[test]
fn tmux_open_navigate_pause_resume_and_cancel_through_keys() {
    let server = Server::started();
    let done = server.start("linear");
    server.wait_status(&done, "completed");
    let run = server.start("paused");
    wait_running_at(&server, &run, "long");

    // piw runs under strace: every file it opens is recorded.
    let trace = server.dir.path().join("piw.opens");
    let tmux = Tmux::start(
        server.dir.path(),
        &server.env(),
        &[
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=open,openat,openat2",
            "-o",
            trace.to_str().unwrap(),
            piw().to_str().unwrap(),
        ],
        120,
        32,
    );
    let list = tmux.wait_screen("both runs listed", |s| {
        s.contains(&run) && s.contains(&done) && s.contains("piw runs · 2 of 2")
    });
    // Newest first: the stalled run is on the cursor; go down and back.
    assert!(list.contains("▸ ◐ running     long-job"), "{list}");
    tmux.keys(&["Down"]);
    tmux.wait_screen("the cursor on the completed run", |s| {
        s.lines()
            .any(|line| line.contains('▸') && line.contains(&done))
    });
    tmux.keys(&["Up", "Enter"]);
    let screen = tmux.wait_screen("the run screen", |s| {
        s.contains("[p] pause") && s.lines().next().is_some_and(|h| h.contains(&run))
    });
    assert!(screen.contains("running at long"), "{screen}");
    assert_parity(&server, &tmux, &run, "running");

    tmux.keys(&["p"]);
    tmux.wait_screen("the pause dialog", |s| s.contains("pause · confirm"));
    tmux.keys(&["y"]);
    let paused = assert_parity(&server, &tmux, &run, "paused");
    assert!(paused.contains("[r] resume"), "{paused}");
    assert!(paused.contains("pause: accepted"), "{paused}");
    eprintln!("--- piw, paused ---\n{paused}");

    tmux.keys(&["r"]);
    tmux.wait_screen("the resume dialog", |s| s.contains("resume · confirm"));
    tmux.keys(&["y"]);
    let resumed = assert_parity(&server, &tmux, &run, "running");
    assert!(resumed.contains("resume: accepted"), "{resumed}");
    eprintln!("--- piw, resumed ---\n{resumed}");

    // A resize at any moment is a redraw at the new size.
    tmux.resize(90, 26);
    let small = tmux.wait_screen("the redraw at 90 columns", |s| {
        s.lines()
            .next()
            .is_some_and(|h| h.contains("running") && h.contains("rev "))
            && s.lines().count() <= 26
            && s.contains("resume: accepted")
    });
    assert!(
        small.lines().all(|line| line.chars().count() <= 90),
        "{small}"
    );
    assert!(
        small
            .lines()
            .nth(24)
            .is_some_and(|line| !line.trim().is_empty()),
        "drawn to the new last row: {small}"
    );

    tmux.keys(&["x"]);
    tmux.wait_screen("the cancel dialog", |s| s.contains("cancel · confirm"));
    tmux.keys(&["y"]);
    let cancelled = assert_parity(&server, &tmux, &run, "cancelled");
    assert!(cancelled.contains("cancel: accepted"), "{cancelled}");
    assert!(
        !cancelled.contains("[p] pause") && !cancelled.contains("[x] cancel"),
        "{cancelled}"
    );

    // The run list comes back with Esc; q quits and restores the terminal
    // (the alternate screen is gone, piw's drawing with it).
    tmux.keys(&["Escape"]);
    tmux.wait_screen("the run list", |s| s.contains("piw runs · 2 of 2"));
    // The list is live: a new run appears without a key.
    let third = server.start("linear");
    tmux.wait_screen("the new run listed", |s| {
        s.contains("piw runs · 3 of 3") && s.contains(&third)
    });
    tmux.keys(&["q"]);
    wait_for("piw to exit", Duration::from_secs(10), || {
        tmux.exited().then_some(())
    });
    let after = tmux.screen();
    assert!(
        !after.contains("piw runs"),
        "the alternate screen was left: {after}"
    );

    // No piw code path opened the state database (the server did).
    let opens = std::fs::read_to_string(&trace).unwrap();
    assert!(
        opens.lines().count() > 5,
        "the trace recorded piw's opens: {opens}"
    );
    assert!(server.home().join("state.sqlite").is_file());
    let database: Vec<&str> = opens
        .lines()
        .filter(|line| line.contains("state.sqlite"))
        .collect();
    assert!(database.is_empty(), "piw opened the database: {database:?}");
}

#[test]
fn an_ambiguous_effect_is_reviewed_through_keys_and_every_client_agrees() {
    let server = Server::started();
    let run = server.start("ambiguous");
    let ambiguous = server.wait_status(&run, "ambiguous");
    let effect = &ambiguous["ambiguousEffects"][0];
    assert_eq!(
        (effect["effectType"].as_str(), effect["nodeId"].as_str()),
        (Some("payment"), Some("charge")),
        "{ambiguous}"
    );
    let effect_id = effect["effectId"].as_str().unwrap().to_owned();
    let tmux = Tmux::start(
        server.dir.path(),
        &server.env(),
        &[piw().to_str().unwrap(), &run],
        120,
        32,
    );
    tmux.wait_screen("the ambiguous run", |s| s.contains("[E] recover effect"));
    assert_parity(&server, &tmux, &run, "ambiguous");

    // The review names the effect and asks which way; n sends nothing.
    tmux.keys(&["E"]);
    let dialog = tmux.wait_screen("the review dialog", |s| {
        s.contains("recover effect · confirm")
    });
    assert!(
        dialog.contains("payment") && dialog.contains("charge") && dialog.contains("[c]"),
        "{dialog}"
    );
    tmux.keys(&["n"]);
    tmux.wait_screen("the dialog closed", |s| {
        !s.contains("recover effect · confirm")
    });
    assert_eq!(server.view(&run)["display"]["status"], "ambiguous");

    // c: the effect applied; the server records it and the run completes.
    tmux.keys(&["E"]);
    tmux.wait_screen("the review dialog again", |s| {
        s.contains("recover effect · confirm")
    });
    tmux.keys(&["c"]);
    let done = assert_parity(&server, &tmux, &run, "completed");
    assert!(done.contains("recover effect: accepted"), "{done}");
    // Recorded as applied: the view lists no ambiguous effect any more.
    let view = server.view(&run);
    assert!(
        view.get("ambiguousEffects").is_none() && !view.to_string().contains(&effect_id),
        "{view}"
    );
}

#[test]
fn a_checkpoint_answered_through_keys_and_every_client_agrees() {
    let server = Server::started();
    let run = server.start("checkpoint");
    server.wait_status(&run, "waiting");
    let tmux = Tmux::start(
        server.dir.path(),
        &server.env(),
        &[piw().to_str().unwrap(), &run],
        120,
        32,
    );
    tmux.wait_screen("the waiting run", |s| s.contains("[a] answer"));
    assert_parity(&server, &tmux, &run, "waiting");
    tmux.keys(&["a"]);
    tmux.wait_screen("the answer dialog", |s| s.contains("answer · confirm"));
    tmux.keys(&["-l", r#"{"publish": true}"#]);
    tmux.wait_screen("the typed answer", |s| s.contains(r#"{"publish": true}"#));
    tmux.keys(&["Enter"]);
    // The continuation runs publish and completes the run.
    let done = assert_parity(&server, &tmux, &run, "completed");
    assert!(done.contains("answer: accepted"), "{done}");
}

#[test]
fn a_protected_decision_answered_through_keys_and_every_client_agrees() {
    let server = Server::started();
    let run = server.start("decision");
    let waiting = server.wait_status(&run, "waiting");
    let decision_id = waiting["decision"]["decisionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let tmux = Tmux::start(
        server.dir.path(),
        &server.env(),
        &[piw().to_str().unwrap(), &run],
        120,
        40,
    );
    tmux.wait_screen("the waiting run", |s| s.contains("[A] human answer"));
    assert_parity(&server, &tmux, &run, "waiting");

    // A opens the decision: its title and its typed choices, the first
    // chosen; the choice that takes text gets a text field.
    tmux.keys(&["A"]);
    let dialog = tmux.wait_screen("the decision dialog", |s| {
        s.contains("human answer · confirm")
    });
    for shown in [
        "Publish release 1.4?",
        "▸ Publish it (approve)",
        "Ask for changes (revise) · takes text",
        "Hold the release (hold) · default at expiry",
    ] {
        assert!(dialog.contains(shown), "{shown}: {dialog}");
    }
    tmux.keys(&["Down"]);
    tmux.keys(&["-l", "tighten the notes"]);
    tmux.wait_screen("the chosen choice and its text", |s| {
        s.contains("▸ Ask for changes")
            && s.contains("What should change?")
            && s.contains("> tighten the notes")
    });

    // The run is paused under the open dialog (from the command line):
    // piw sends what it showed, the server refuses it, and the dialog
    // keeps the choice and the text with the server's line.
    server.cli(&["pause", &run]);
    server.wait_status(&run, "paused");
    tmux.keys(&["Enter"]);
    let refused = tmux.wait_screen("the server's refusal in the dialog", |s| {
        s.contains("the server refused it")
    });
    eprintln!("--- piw, the answer refused on a paused run ---\n{refused}");
    assert!(
        refused.contains("the run is paused")
            && refused.contains("▸ Ask for changes")
            && refused.contains("> tighten the notes"),
        "{refused}"
    );
    let paused = server.view(&run);
    assert_eq!(paused["display"]["status"], "paused", "{paused}");
    assert_eq!(paused["decision"]["decisionId"], decision_id.as_str());

    // Resumed, the same dialog sends again (a new key) and is accepted.
    server.cli(&["resume", &run]);
    server.wait_status(&run, "waiting");
    tmux.keys(&["Enter"]);
    let done = assert_parity(&server, &tmux, &run, "completed");
    assert!(
        done.contains("human answer: accepted") && !done.contains("human answer · confirm"),
        "{done}"
    );
    // The continuation routed on the choice: rework ran, and it completed.
    let continuation = format!(
        "continuation-{}",
        decision_id.trim_start_matches("decision-")
    );
    let continued = server.wait_status(&continuation, "completed");
    let steps: Vec<&str> = continued["steps"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|step| step["nodeId"].as_str())
        .collect();
    assert!(
        steps.contains(&"rework") && !steps.contains(&"publish"),
        "{steps:?}"
    );
}

/// Starts a held interactive run of one of piw's scripts (what the Pi
/// extension's model-started launch makes: saved `queued`, not scheduled
/// until `run.activate`); its run id.
fn start_held(server: &Server, name: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = WorkflowClient::new(ClientOptions::new(Home::at(server.home())));
        let payload = serde_json::json!({
            "workflow": support::live::script(name),
            "input": {},
            "executionMode": "interactive",
            "originSessionId": "session-piw-held",
            "projectPath": server.dir.path(),
            "held": true,
        });
        let started = client
            .call_json::<ops::RunStart>(None, payload, CallOptions::default())
            .await
            .unwrap();
        started.receipt.run_id.as_str().to_owned()
    })
}

#[test]
fn restart_and_activate_through_keys_and_every_client_agrees() {
    let server = Server::started();
    let open = |run: &str| {
        let dir = server.dir.path().join(run);
        std::fs::create_dir_all(&dir).unwrap();
        Tmux::start(
            &dir,
            &server.env(),
            &[piw().to_str().unwrap(), run],
            120,
            32,
        )
    };

    // Restart: a failed run offers it; afterwards the failed run no longer
    // does, and the four agree on that.
    let failed = server.start("failed");
    server.wait_status(&failed, "failed");
    let tmux = open(&failed);
    tmux.wait_screen("the failed run", |s| s.contains("[R] restart"));
    assert_parity(&server, &tmux, &failed, "failed");
    tmux.keys(&["R"]);
    tmux.wait_screen("the restart dialog", |s| s.contains("restart · confirm"));
    tmux.keys(&["y"]);
    let restarted = assert_parity_where(&server, &tmux, &failed, "failed", |shown| {
        !shown
            .controls
            .iter()
            .any(|control| control == "[R] restart")
    });
    assert!(restarted.contains("restart: accepted"), "{restarted}");
    let runs: Value = serde_json::from_str(&server.cli(&["runs", "--json"])).unwrap();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 2, "{runs}");
    drop(tmux);

    // Activate: a held run waits queued and offers it; activated, it runs
    // to its stalled node, and the four agree.
    let held = start_held(&server, "paused");
    let queued = server.wait_status(&held, "queued");
    assert!(
        queued["display"]["controls"]
            .as_array()
            .unwrap()
            .contains(&Value::from("activate")),
        "{queued}"
    );
    let tmux = open(&held);
    tmux.wait_screen("the held run", |s| s.contains("[o] activate"));
    assert_parity(&server, &tmux, &held, "queued");
    tmux.keys(&["o"]);
    tmux.wait_screen("the activate dialog", |s| s.contains("activate · confirm"));
    tmux.keys(&["y"]);
    wait_running_at(&server, &held, "long");
    let activated = assert_parity(&server, &tmux, &held, "running");
    assert!(
        activated.contains("activate: accepted") && !activated.contains("[o] activate"),
        "{activated}"
    );
}

/// Writes a captured screen to `$PIW_SCREEN_DIR/<name>.txt` when that is
/// set (the closing note's evidence: `PIW_SCREEN_DIR=/some/dir cargo test
/// -p piw --test live the_screens_of`).
fn keep_screen(name: &str, screen: &str) {
    if let Some(dir) = std::env::var_os("PIW_SCREEN_DIR") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(Path::new(&dir).join(format!("{name}.txt")), screen).unwrap();
    }
}

#[test]
fn the_screens_of_a_live_run_and_of_an_included_workflow() {
    let server = Server::started();
    let pipeline = server.start("pipeline");
    let release = server.start("include");
    // Each screen in its own tmux server (its own socket directory).
    let open = |run: &str| {
        let dir = server.dir.path().join(run);
        std::fs::create_dir_all(&dir).unwrap();
        Tmux::start(
            &dir,
            &server.env(),
            &[piw().to_str().unwrap(), run],
            200,
            60,
        )
    };

    // A live run: running at `test`, its progress on the card, live.
    let tmux = open(&pipeline);
    let live = tmux.wait_screen("the pipeline running at test with its progress", |s| {
        let header = s.lines().next().unwrap_or_default();
        header.contains(&pipeline)
            && header.contains("running at test")
            && header.contains("● live")
            && s.contains("● LIVE")
            && s.contains("[p] pause")
    });
    keep_screen("piw-live-run.200x60", &live);
    drop(tmux);

    // The included workflow: its entry, inner nodes and exit under the
    // mount's hierarchical labels, the running inner node's progress.
    // The entry and exit badges come from the run's definition, which piw
    // reads after the view: wait for them.
    let labels = [
        "↘ include",
        "✓ child ",
        "✓ child/compile",
        "◐ child/work",
        "↗ exit",
        "○ child/exit ready",
        "○ publish",
    ];
    let tmux = open(&release);
    let graph = tmux.wait_screen("the included workflow's graph", |s| {
        s.lines()
            .next()
            .is_some_and(|h| h.contains(&release) && h.contains("running at child/work"))
            && s.contains("37/120 tests")
            && labels.iter().all(|label| s.contains(label))
    });
    keep_screen("piw-included-workflow.200x60", &graph);
}

#[test]
fn piw_with_a_run_id_keeps_that_run_selected_through_a_relay_restart() {
    let server = Server::started();
    let run = server.start("paused");
    wait_running_at(&server, &run, "long");
    let mut relay = RelayProcess::start(&server, "127.0.0.1:0");
    let url = relay.url();
    let tmux = Tmux::start(
        server.dir.path(),
        &server.env(),
        &[piw().to_str().unwrap(), &run, "--connect", &url],
        120,
        32,
    );
    let header = |s: &str| s.lines().next().unwrap_or_default().to_owned();
    tmux.wait_screen("the run over the relay", |s| {
        header(s).contains(&run) && header(s).contains("● live") && s.contains("[p] pause")
    });
    // A newer run does not take the selection.
    let newer = server.start("linear");
    server.wait_status(&newer, "completed");
    std::thread::sleep(Duration::from_millis(500));
    assert!(header(&tmux.screen()).contains(&run));

    relay.kill();
    let lost = tmux.wait_screen("the loss on screen", |s| s.contains("no piw relay answers"));
    assert!(header(&lost).contains(&run), "{lost}");
    let relay = RelayProcess::start(&server, &relay.address);
    assert_eq!(relay.url(), url);
    // Reconnected: the same run, live again, its controls back.
    let back = tmux.wait_screen("the run again after the reconnect", |s| {
        header(s).contains(&run) && header(s).contains("● live") && !s.contains("no piw relay")
    });
    assert!(back.contains("[p] pause"), "{back}");
    // Controls work over the relay too.
    tmux.keys(&["p"]);
    tmux.wait_screen("the pause dialog", |s| s.contains("pause · confirm"));
    tmux.keys(&["y"]);
    let paused = tmux.wait_screen("paused over the relay", |s| s.contains("[r] resume"));
    assert_eq!(
        shown_by_piw(&paused).unwrap(),
        shown_by_document(&server.wait_status(&run, "paused"))
    );
}

fn piw_output(server: &Server, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let output = std::process::Command::new(piw())
        .envs(server.env())
        .envs(env.iter().copied())
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// piw's arguments, extra environment, and what its one line says.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);

#[test]
fn an_unreachable_server_is_one_line_with_what_to_do() {
    let server = Server::started();
    let home = server.dir.path().join("elsewhere");
    let home = home.to_str().unwrap();
    let empty = Server::started();
    let relay = RelayProcess::start(&empty, "127.0.0.1:0");
    drop(empty);
    let cases: [Case<'_>; 3] = [
        // No server, and no pi-workflows to start one: the install line.
        (
            &[],
            &[
                ("PI_WORKFLOWS_HOME", home),
                ("PI_WORKFLOWS_BIN", "/nonexistent/pi-workflows"),
            ],
            "check that pi-workflows is installed",
        ),
        // A relay that is not there: how to start one.
        (
            &["--connect", "ws://127.0.0.1:9/ws"],
            &[],
            "start `piw serve`",
        ),
        // A relay whose server is not running: the start instruction.
        (
            &["--connect", &relay.url()],
            &[],
            "start it with `pi-workflows server start`",
        ),
    ];
    for (args, env, says) in cases {
        let (ok, stderr) = piw_output(&server, args, env);
        assert!(!ok, "{args:?}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !stderr.to_lowercase().contains("sqlite") && !stderr.contains("database"),
            "{stderr}"
        );
    }
}

#[test]
fn another_package_or_protocol_version_is_one_package_version_line() {
    // A fake server on a real socket that says hello as another package
    // version, or as this package speaking another protocol version.
    for (package, protocol, says) in [
        ("9.9.9", 1, "9.9.9"),
        (env!("CARGO_PKG_VERSION"), 2, "protocol version 2"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("state");
        std::fs::create_dir_all(home.join("host")).unwrap();
        let listener =
            std::os::unix::net::UnixListener::bind(home.join("host/server.sock")).unwrap();
        let hello = format!(
            r#"{{"packageVersion":"{package}","protocolVersion":{protocol},"role":"server","schema":"pi-workflows.client.v1","serverEpoch":1,"type":"hello"}}"#
        );
        std::thread::spawn(move || {
            use std::io::{BufRead, Write};
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut line = String::new();
                let _ = std::io::BufReader::new(&stream).read_line(&mut line);
                let _ = stream.write_all(format!("{hello}\n").as_bytes());
            }
        });
        let mut child = std::process::Command::new(piw())
            .env("PI_WORKFLOWS_HOME", &home)
            .env("HOME", dir.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let exited = (0..200).find_map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            child.try_wait().unwrap()
        });
        if exited.is_none() {
            let _ = child.kill();
        }
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(
            exited.is_some_and(|status| !status.success()),
            "piw must end at once with one line ({package}, protocol {protocol}): {exited:?} {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("install matching pi-workflows packages"),
            "{stderr}"
        );
        assert!(!stderr.to_lowercase().contains("sqlite") && !stderr.contains("database"));
    }
}

/// The resources screen (`m`) through `piw serve`: the empty state says how
/// to apply one; a resource applied with the CLI (resolved by the scripted
/// controller child) appears at the next read, with its detail
/// (`resource.get`) and never its spec.
#[test]
fn resources_screen_through_the_relay_shows_a_resource_applied_with_the_cli() {
    let server = Server::started();
    let relay = RelayProcess::start(&server, "127.0.0.1:0");
    let tmux = Tmux::start(
        server.dir.path(),
        &server.env(),
        &[piw().to_str().unwrap(), "--connect", &relay.url()],
        120,
        32,
    );
    tmux.wait_screen("the run list", |s| s.contains("piw runs"));
    tmux.keys(&["m"]);
    tmux.wait_screen("the empty resources screen", |s| {
        s.contains("No resources yet: `pi-workflows apply <controller> <key> <spec.json>`")
    });

    // The CLI applies from the server's directory: its project's controller.
    let controllers = server.dir.path().join(".pi/controllers");
    std::fs::create_dir_all(&controllers).unwrap();
    std::fs::write(
        controllers.join("repos.controller.ts"),
        "export default {};\n",
    )
    .unwrap();
    let spec = server.dir.path().join("spec.json");
    std::fs::write(&spec, r#"{"repo": "SPEC-VALUE-NEVER-SHOWN"}"#).unwrap();
    server.cli(&["apply", "repos", "acme#1", spec.to_str().unwrap()]);

    // The server reconciles it at once (the scripted controller settles with
    // no status change): the view follows the row to its settled pass.
    let screen = tmux.wait_screen("the applied resource, reconciled, and its detail", |s| {
        s.contains("repos/acme#1")
            && s.contains("applied (version 1)")
            && s.contains("reconcile_settled (version 2)")
    });
    assert!(screen.contains("piw resources · 1"), "{screen}");
    assert!(
        screen
            .lines()
            .any(|line| line.contains("▸ ○ no Ready") && line.contains("1/1")),
        "{screen}"
    );
    assert!(
        screen.contains("version 2 · generation 1 (observed 1)"),
        "{screen}"
    );
    assert!(screen.contains("child runs: none"), "{screen}");
    assert!(!screen.contains("SPEC-VALUE-NEVER-SHOWN"), "{screen}");
    tmux.keys(&["q"]);
    wait_for("piw to quit", Duration::from_secs(5), || {
        tmux.exited().then_some(())
    });
}
