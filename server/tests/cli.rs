//! The `pi-workflows` CLI as a user runs it: real processes against a real
//! server, checking output, `--json` shapes, one-line errors and exit codes.

mod support;

use serde_json::Value;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{TestServer, script};

/// Runs the CLI with `args`, failing the test if it does not finish in time.
fn run(server: &TestServer, args: &[&str]) -> Output {
    run_in(server.command(), args)
}

fn run_in(mut command: Command, args: &[&str]) -> Output {
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the CLI");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`pi-workflows {}` did not finish in 30 s", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The one error line of a failed command.
fn error_line(output: &Output) -> String {
    let text = stderr(output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one error line, got {text:?}");
    assert!(lines[0].starts_with("pi-workflows: "), "{text:?}");
    lines[0].to_owned()
}

fn json_lines(output: &Output) -> Vec<Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
        .collect()
}

#[test]
fn viewing_a_missing_run_says_not_found_instead_of_waiting() {
    let server = TestServer::start();
    for args in [
        &["view", "no-such-run", "--once"][..],
        &["view", "no-such-run", "--watch"],
        &["view", "no-such-run"],
        &["view", "no-such-run", "--json"],
        &["pause", "no-such-run"],
        &["answer", "no-such-run", "{}"],
    ] {
        let output = run(&server, args);
        assert_eq!(
            output.status.code(),
            Some(4),
            "{args:?}: {}",
            stderr(&output)
        );
        let line = error_line(&output);
        assert!(
            line.contains("no run no-such-run") && line.contains("pi-workflows runs"),
            "{line}"
        );
        assert!(stdout(&output).is_empty());
    }
}

#[test]
fn a_checkpoint_run_is_started_watched_answered_and_followed_into_its_continuation() {
    let server = TestServer::start();
    let checkpoint = script("checkpoint.json");
    let started = run(&server, &["start", checkpoint.to_str().unwrap(), "--json"]);
    assert_eq!(started.status.code(), Some(0), "{}", stderr(&started));
    let started = json_lines(&started);
    let run_id = started[0]["runId"].as_str().unwrap().to_owned();

    // Wait for the checkpoint through `view --once --json`.
    let deadline = Instant::now() + Duration::from_secs(20);
    let waiting = loop {
        let view = json_lines(&run(&server, &["view", &run_id, "--once", "--json"])).remove(0);
        if view["display"]["status"] == "waiting" {
            break view;
        }
        assert!(Instant::now() < deadline, "never waited: {view}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(waiting["display"]["waitingOn"], "review");
    assert!(
        waiting["display"]["controls"]
            .as_array()
            .unwrap()
            .contains(&"answer".into())
    );
    let human = stdout(&run(&server, &["view", &run_id, "--once"]));
    assert!(human.contains("waiting on review"), "{human}");
    assert!(
        human.contains(&format!("pi-workflows answer {run_id} '<json>'")),
        "{human}"
    );

    // Follow it (the Rust client's live view) while another process answers.
    let mut follower = server
        .command()
        .args(["view", &run_id, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let bad = run(&server, &["answer", &run_id, "not json"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(error_line(&bad).contains("not valid JSON"));
    let answered = run(
        &server,
        &["answer", &run_id, r#"{"approved": true}"#, "--json"],
    );
    assert_eq!(answered.status.code(), Some(0), "{}", stderr(&answered));
    let continuation = json_lines(&answered)[0]["continuationRunId"]
        .as_str()
        .unwrap()
        .to_owned();

    let deadline = Instant::now() + Duration::from_secs(30);
    while follower.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "view --watch did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
    let followed = follower.wait_with_output().unwrap();
    assert_eq!(followed.status.code(), Some(0), "{}", stderr(&followed));
    let views = json_lines(&followed);
    let first = &views[0];
    let last = views.last().unwrap();
    assert_eq!(first["runId"], run_id.as_str());
    assert_eq!(
        last["runId"],
        continuation.as_str(),
        "the watch followed the continuation"
    );
    assert_eq!(last["display"]["status"], "completed");
    assert_eq!(last["lineage"]["continuationOf"]["runId"], run_id.as_str());
    let revisions: Vec<u64> = views
        .iter()
        .filter(|view| view["runId"] == run_id.as_str())
        .map(|view| view["revision"].as_u64().unwrap())
        .collect();
    assert!(
        revisions.windows(2).all(|pair| pair[0] < pair[1]),
        "{revisions:?}"
    );

    // `runs` lists both, newest first, in both forms.
    let runs = json_lines(&run(&server, &["runs", "--json"])).remove(0);
    let listed: Vec<&str> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["runId"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [continuation.as_str(), run_id.as_str()]);
    let table = stdout(&run(&server, &["runs"]));
    assert!(table.starts_with("RUN "), "{table}");
    assert!(
        table.contains(&continuation) && table.contains("completed"),
        "{table}"
    );
}

#[test]
fn controls_report_the_new_state_and_refusals_name_the_next_step() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let stall = support::write_script(
        dir.path(),
        "stall.json",
        &serde_json::json!({
            "workflowName": "stall",
            "topology": { "startAt": "a", "nodes": [{ "id": "a", "nodeType": "compute", "timeout": { "kind": "none" }, "mountPath": [] }],
                          "edges": [], "mounts": [] },
            "nodes": { "a": [{ "stall": true }] },
        }),
    );
    let started = run(&server, &["start", stall.to_str().unwrap()]);
    assert_eq!(started.status.code(), Some(0));
    let text = stdout(&started);
    let run_id = text
        .lines()
        .next()
        .unwrap()
        .strip_prefix("started run ")
        .unwrap()
        .to_owned();
    assert!(
        text.contains(&format!("pi-workflows view {run_id}")),
        "{text}"
    );

    let paused = run(&server, &["pause", &run_id]);
    assert_eq!(paused.status.code(), Some(0), "{}", stderr(&paused));
    assert_eq!(
        stdout(&paused).trim(),
        format!("paused run {run_id} (now running)")
    );
    let again = run(&server, &["pause", &run_id]);
    assert_eq!(again.status.code(), Some(1));
    assert!(error_line(&again).contains(&format!("pi-workflows view {run_id} --once")));
    let resumed = run(&server, &["resume", &run_id, "--json"]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(json_lines(&resumed)[0]["runId"], run_id.as_str());
    let cancelled = run(&server, &["cancel", &run_id]);
    assert_eq!(cancelled.status.code(), Some(0), "{}", stderr(&cancelled));
    // A watch of a cancelled run ends at once with the failure exit code.
    let watched = run(&server, &["view", &run_id]);
    assert_eq!(watched.status.code(), Some(1));
    assert!(
        stdout(&watched).contains("cancelled"),
        "{}",
        stdout(&watched)
    );
}

#[test]
fn commands_start_the_server_when_it_is_not_running_and_status_reports_it() {
    let mut server = TestServer::new(&[]);
    let status = run(&server, &["server", "status"]);
    assert_eq!(status.status.code(), Some(3));
    assert!(stdout(&status).contains("pi-workflows server start"));
    let stop = run(&server, &["server", "stop"]);
    assert_eq!(stop.status.code(), Some(0));

    let runs = run(&server, &["runs"]);
    assert_eq!(runs.status.code(), Some(0), "{}", stderr(&runs));
    assert!(stderr(&runs).contains("starting the server"));
    assert!(stdout(&runs).contains("No runs yet"));
    let status = run(&server, &["server", "status", "--json"]);
    assert_eq!(status.status.code(), Some(0));
    assert_eq!(json_lines(&status)[0]["state"], "running");
    let stopped = run(&server, &["server", "stop"]);
    assert_eq!(stopped.status.code(), Some(0), "{}", stderr(&stopped));
    server.stop();
}

#[test]
fn discovered_workflows_are_listed_from_the_project_directory() {
    let server = TestServer::start();
    let project = tempfile::tempdir().unwrap();
    let workflows = project.path().join(".pi").join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(workflows.join("review.workflow.ts"), "export default {}\n").unwrap();
    let mut command = server.command();
    command.current_dir(project.path());
    let listed = run_in(command, &["list", "--json"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert_eq!(json_lines(&listed)[0]["workflows"][0]["name"], "review");
    let mut command = server.command();
    command.current_dir(project.path());
    let table = stdout(&run_in(command, &["list"]));
    assert!(
        table.contains("review") && table.contains("project"),
        "{table}"
    );
}

#[test]
fn a_server_of_another_version_is_one_line_that_says_to_install_matching_packages() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::fs::PermissionsExt;
    let server = TestServer::new(&[]);
    let socket = server.socket();
    let host = socket.parent().unwrap();
    std::fs::create_dir_all(host).unwrap();
    std::fs::set_permissions(host, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A real socket that answers like a server of another package version.
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let other = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .write_all(b"{\"packageVersion\":\"0.0.1-other\",\"protocolVersion\":1,\"role\":\"server\",\"schema\":\"pi-workflows.client.v1\",\"serverEpoch\":1,\"type\":\"hello\"}\n")
            .unwrap();
        let mut hello = String::new();
        BufReader::new(stream).read_line(&mut hello).unwrap();
        hello
    });
    let runs = run(&server, &["runs"]);
    assert_eq!(runs.status.code(), Some(5), "{}", stderr(&runs));
    let line = error_line(&runs);
    assert!(line.contains("0.0.1-other"), "{line}");
    assert!(
        line.contains("install matching pi-workflows packages"),
        "{line}"
    );
    // The CLI greeted the socket it found and started no server of its own.
    assert!(other.join().unwrap().contains("\"role\":\"client\""));
    assert!(!stderr(&runs).contains("starting the server"));
}

/// `view --once --json` of a run once it is terminal.
fn terminal_view(server: &TestServer, run_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = json_lines(&run(server, &["view", run_id, "--once", "--json"])).remove(0);
        if matches!(
            view["display"]["status"].as_str(),
            Some("completed" | "failed" | "timed_out" | "cancelled")
        ) {
            return view;
        }
        assert!(Instant::now() < deadline, "never ended: {view}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn controls(view: &Value) -> Vec<String> {
    view["display"]["controls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|control| control.as_str().unwrap().to_owned())
        .collect()
}

/// The restart rules count the whole chain: a failed run restarts once, and
/// restarting it again (a sibling with the same failure fingerprint) is
/// refused with its own message, as is restarting the restart that failed
/// the same way. `restart` is offered exactly when the command would be
/// accepted, and no refused restart creates a run.
#[test]
fn restarting_the_same_failed_run_again_is_refused_and_only_an_allowed_restart_is_offered() {
    let server = TestServer::start();
    let looping = script("loop.json");
    let started = run(&server, &["start", looping.to_str().unwrap(), "--json"]);
    assert_eq!(started.status.code(), Some(0), "{}", stderr(&started));
    let original = json_lines(&started)[0]["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = terminal_view(&server, &original);
    assert_eq!(view["display"]["status"], "failed");
    assert_eq!(controls(&view), ["restart"]);

    let first = run(&server, &["restart", &original, "--json"]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let restarted = json_lines(&first)[0]["newRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = terminal_view(&server, &restarted);
    assert_eq!(view["display"]["status"], "failed");
    assert_eq!(
        controls(&view),
        Vec::<String>::new(),
        "the restart failed with the fingerprint its parent already restarted once: {view}"
    );
    let original_view = terminal_view(&server, &original);
    assert_eq!(
        controls(&original_view),
        Vec::<String>::new(),
        "the original was restarted already: {original_view}"
    );

    for again in [&original, &original, &restarted] {
        let refused = run(&server, &["restart", again]);
        assert_eq!(refused.status.code(), Some(1), "{}", stdout(&refused));
        let line = error_line(&refused);
        assert!(
            line.contains("already restarted after this same failure"),
            "{line}"
        );
    }
    let runs: i64 = server
        .db()
        .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
        .unwrap();
    assert_eq!(runs, 2, "one original and one restart");
}

/// Whether the server has started resolving a workflow (its resolver child
/// writes a `resolve-*.log` as soon as it is spawned): the `run.start`
/// request reached the server.
fn resolving(server: &TestServer) -> bool {
    std::fs::read_dir(server.home.join("host").join("logs")).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .any(|entry| entry.file_name().to_string_lossy().starts_with("resolve-"))
    })
}

fn run_count(server: &TestServer) -> i64 {
    server
        .db()
        .query_row("SELECT COUNT(*) FROM runs", [], |row| row.get(0))
        .unwrap()
}

/// `start --idempotency-key K` is safe to retry: a CLI killed after it sent
/// the request leaves one run, and running the same command again prints
/// that run instead of starting a second; another command under the same
/// key is refused with one line; scripts with different keys never collide.
#[test]
fn a_start_killed_after_sending_and_retried_with_its_idempotency_key_makes_one_run() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let slow = support::write_script(
        dir.path(),
        "slow-resolve.json",
        &serde_json::json!({
            "workflowName": "slow-resolve",
            "resolveDelayMs": 1500,
            "topology": support::linear_topology(&["a"]),
            "nodes": {"a": [{"sleepMs": 60000}]},
        }),
    );
    let slow = slow.to_str().unwrap();
    let args = [
        "start",
        slow,
        "--idempotency-key",
        "nightly-2026-12-01",
        "--json",
    ];

    let mut killed = server
        .command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !resolving(&server) {
        assert!(
            Instant::now() < deadline,
            "the request never reached the server"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    killed.kill().unwrap();
    let status = killed.wait().unwrap();
    assert!(!status.success(), "the CLI was killed before its answer");
    let deadline = Instant::now() + Duration::from_secs(20);
    while run_count(&server) == 0 {
        assert!(
            Instant::now() < deadline,
            "the started run was never stored"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let retried = run(&server, &args);
    assert_eq!(retried.status.code(), Some(0), "{}", stderr(&retried));
    let run_id = json_lines(&retried)[0]["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let again = run(&server, &args);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(json_lines(&again)[0]["runId"], run_id.as_str());
    assert_eq!(run_count(&server), 1, "one key, one run");

    // Another command under the same key is refused, and changes nothing.
    let other = run(
        &server,
        &[
            "start",
            slow,
            "other",
            "task",
            "--idempotency-key",
            "nightly-2026-12-01",
            "--json",
        ],
    );
    assert_eq!(other.status.code(), Some(1), "{}", stdout(&other));
    let line = error_line(&other);
    assert!(
        line.contains("--idempotency-key nightly-2026-12-01 was already used for another command"),
        "{line}"
    );
    assert_eq!(run_count(&server), 1);

    // Two scripts with their own keys start their own runs.
    let mut ids = Vec::new();
    for key in ["script-a-1", "script-b-1"] {
        let started = run(
            &server,
            &["start", slow, "--idempotency-key", key, "--json"],
        );
        assert_eq!(started.status.code(), Some(0), "{}", stderr(&started));
        ids.push(
            json_lines(&started)[0]["runId"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_ne!(ids[0], ids[1]);
    assert!(!ids.contains(&run_id));
    assert_eq!(run_count(&server), 3);

    // The controls take a key too: a retried cancel repeats its answer.
    let cancel = ["cancel", &ids[0], "--idempotency-key", "cancel-a", "--json"];
    let first = run(&server, &cancel);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let retry = run(&server, &cancel);
    assert_eq!(retry.status.code(), Some(0), "{}", stderr(&retry));
    assert_eq!(json_lines(&retry), json_lines(&first));
}

/// `view --once --json` until `done` holds (within 30 s).
fn view_until(server: &TestServer, run_id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = json_lines(&run(server, &["view", run_id, "--once", "--json"])).remove(0);
        if done(&view) {
            return view;
        }
        assert!(Instant::now() < deadline, "never reached: {view}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_protected_decision_is_answered_with_a_choice_and_its_text_with_provenance_cli() {
    let server = TestServer::start();
    let gate = support::write_script(
        server.scratch(),
        "gate.json",
        &serde_json::json!({
            "workflowName": "gate",
            "topology": {"startAt": "gate", "nodes": [
                {"id": "gate", "nodeType": "checkpoint", "humanDecision": true, "timeout": {"kind": "default"}, "mountPath": []},
                {"id": "after", "nodeType": "compute", "timeout": {"kind": "default"}, "mountPath": []}],
              "edges": [{"kind": "plain", "from": "gate", "to": "after"}], "mounts": []},
            "nodes": {"gate": [{"decide": {"title": "Ship the release?", "choices": [
                {"id": "approve", "label": "Approve"},
                {"id": "revise", "label": "Revise", "input": {"kind": "text", "name": "feedback", "prompt": "What should change?", "minLength": 1, "maxLength": 100}}]}}]}
        }),
    );
    let started = run(&server, &["start", gate.to_str().unwrap(), "--json"]);
    assert_eq!(started.status.code(), Some(0), "{}", stderr(&started));
    let run_id = json_lines(&started)[0]["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let waiting = view_until(&server, &run_id, |view| view["decision"].is_object());
    assert!(
        waiting["display"]["controls"]
            .as_array()
            .unwrap()
            .contains(&"humanAnswer".into()),
        "{waiting}"
    );
    let human = stdout(&run(&server, &["view", &run_id, "--once"]));
    assert!(human.contains("decision  Ship the release?"), "{human}");
    assert!(human.contains("revise  Revise (with text)"), "{human}");
    assert!(
        human.contains(&format!("pi-workflows answer {run_id} CHOICE [TEXT]")),
        "{human}"
    );

    // Wrong choices and missing or extra text are usage errors, nothing sent.
    for (args, says) in [
        (
            vec!["answer", &run_id, "reject"],
            "not a choice of this decision",
        ),
        (vec!["answer", &run_id, "revise"], "needs its text"),
        (
            vec!["answer", &run_id, "approve", "why", "not"],
            "takes no text",
        ),
    ] {
        let refused = run(&server, &args);
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        assert!(
            error_line(&refused).contains(says),
            "{args:?}: {}",
            stderr(&refused)
        );
    }
    let answered = run(
        &server,
        &["answer", &run_id, "revise", "smaller", "steps", "--json"],
    );
    assert_eq!(answered.status.code(), Some(0), "{}", stderr(&answered));
    let continuation = json_lines(&answered)[0]["continuationRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    let done = view_until(&server, &continuation, |view| {
        view["display"]["status"] == "completed"
    });
    assert_eq!(done["status"]["run"], "completed");
    let db = server.db();
    let (channel, output): (String, String) = db
        .query_row(
            "SELECT d.answer_channel, CAST(b.bytes AS TEXT) FROM human_decisions d
             JOIN node_attempts a ON a.run_id = d.continuation_run_id AND a.node_id = 'gate'
             JOIN blobs b ON b.digest = a.output_digest WHERE d.run_id = ?1",
            [&run_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!(channel, "cli");
    assert_eq!(
        output,
        r#"{"choice":"revise","input":{"feedback":"smaller steps"}}"#
    );
}

/// An action that reserves an effect and crashes while applying it.
fn ambiguous_script(server: &TestServer) -> std::path::PathBuf {
    let log = server.scratch().join("apply.log");
    support::write_script(
        server.scratch(),
        "send.json",
        &serde_json::json!({
            "workflowName": "send",
            "topology": {"startAt": "send", "nodes": [
                {"id": "send", "nodeType": "action", "timeout": {"kind": "default"}, "mountPath": []}],
              "edges": [], "mounts": []},
            "nodes": {"send": [
                {"effect": {"type": "mail.send", "request": {"to": "ops"}, "applyLog": log, "crashOnAttempt": 1}}]}
        }),
    )
}

#[test]
fn an_ambiguous_effect_is_confirmed_or_retried_from_the_command_line() {
    let server = TestServer::start();
    let script = ambiguous_script(&server);
    let log = server.scratch().join("apply.log");
    let mut runs = Vec::new();
    for _ in 0..2 {
        let started = run(&server, &["start", script.to_str().unwrap(), "--json"]);
        assert_eq!(started.status.code(), Some(0), "{}", stderr(&started));
        runs.push(
            json_lines(&started)[0]["runId"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let mut effects = Vec::new();
    for run_id in &runs {
        let view = view_until(&server, run_id, |view| {
            view["display"]["status"] == "ambiguous"
        });
        assert!(
            view["display"]["controls"]
                .as_array()
                .unwrap()
                .contains(&"recoverEffect".into()),
            "{view}"
        );
        let effect = &view["ambiguousEffects"][0];
        assert_eq!(effect["effectType"], "mail.send");
        assert_eq!(effect["attemptNumber"], 1);
        effects.push(effect["effectId"].as_str().unwrap().to_owned());
        let human = stdout(&run(&server, &["view", run_id, "--once"]));
        assert!(
            human.contains(&format!("pi-workflows recover {run_id} confirm|retry")),
            "{human}"
        );
    }
    let bad = run(&server, &["recover", &runs[0], "undo"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(error_line(&bad).contains("confirm"));

    // Confirm: recorded as applied; the rerun adopts it and applies nothing.
    let confirmed = run(&server, &["recover", &runs[0], "confirm"]);
    assert_eq!(confirmed.status.code(), Some(0), "{}", stderr(&confirmed));
    assert!(
        stdout(&confirmed).contains("recorded as applied"),
        "{}",
        stdout(&confirmed)
    );
    assert!(
        stderr(&confirmed).is_empty(),
        "no warning: {}",
        stderr(&confirmed)
    );
    view_until(&server, &runs[0], |view| {
        view["display"]["status"] == "completed"
    });
    let applied_for = |effect: &str| {
        support::apply_lines(&log)
            .iter()
            .filter(|line| line.starts_with(effect))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(applied_for(&effects[0]), vec![format!("{} 1", effects[0])]);

    // Retry (naming the effect): attempt 2 applies once, with a warning.
    let retried = run(
        &server,
        &[
            "recover",
            &runs[1],
            "retry",
            "--effect",
            &effects[1],
            "--json",
        ],
    );
    assert_eq!(retried.status.code(), Some(0), "{}", stderr(&retried));
    let receipt = json_lines(&retried).remove(0);
    assert_eq!(
        (receipt["state"].as_str(), receipt["attemptNumber"].as_u64()),
        (Some("reserved"), Some(2))
    );
    assert!(
        stderr(&retried).contains("a duplicate is possible"),
        "{}",
        stderr(&retried)
    );
    view_until(&server, &runs[1], |view| {
        view["display"]["status"] == "completed"
    });
    assert_eq!(
        applied_for(&effects[1]),
        vec![format!("{} 1", effects[1]), format!("{} 2", effects[1])]
    );
    // Nothing is left to recover.
    let nothing = run(&server, &["recover", &runs[1], "confirm"]);
    assert_eq!(nothing.status.code(), Some(1));
    assert!(error_line(&nothing).contains("no ambiguous effect"));
    let deadline = Instant::now() + support::SETTLE_TIMEOUT;
    while support::count(
        &server.db(),
        "SELECT COUNT(*) FROM run_workers WHERE status IN ('launching', 'ready')",
        [],
    ) > 0
    {
        assert!(Instant::now() < deadline, "every runner exits");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        support::consistency_violations(&server.db()),
        Vec::<String>::new()
    );
}
