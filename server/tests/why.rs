//! `pi-workflows why <runId>` (`run.why`) for each kind of stuck run, as a
//! user runs it: a real server, the real socket, scripted runners and the
//! real CLI. Each test asserts the text, the `--json` document (the same
//! content: its `lines` are the text), and that the run view's
//! `display.why` says the same state, actor and summary. The privacy test
//! seeds private values and finds none in any output.

mod support;

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;
use support::{
    TestServer, count, linear_topology, script, started, started_interactive, status, wait_for,
    wait_view, write_script,
};

const WAIT: Duration = Duration::from_secs(20);

/// A one-node workflow `a` of `node_type` with `extra` script fields.
fn one_node(dir: &Path, name: &str, node_type: &str, extra: Value) -> PathBuf {
    let mut script = json!({
        "workflowName": name,
        "topology": {"startAt": "a", "nodes": [{"id": "a", "nodeType": node_type, "timeout": {"kind": "none"}, "mountPath": []}],
                     "edges": [], "mounts": []},
    });
    for (key, value) in extra.as_object().unwrap() {
        script[key] = value.clone();
    }
    write_script(dir, &format!("{name}.json"), &script)
}

/// Waits until no runner of `run_id` is launching or ready: a waiting run's
/// runner exits after it parks, and `why` reads its text and its JSON a
/// moment apart, so both must see the same settled state.
async fn runner_gone(server: &TestServer, run_id: &str) {
    let db = server.db();
    wait_for(WAIT, "the run's runner to exit", || {
        (count(
            &db,
            "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1 AND status IN ('launching', 'ready')",
            [run_id],
        ) == 0)
            .then_some(())
    })
    .await;
}

fn text_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `pi-workflows why <run>` and `--json`; asserts both succeed, that the
/// JSON's lines are exactly the text, and prints both (the samples of the
/// closing note). Returns (text, json).
fn why(server: &TestServer, run_id: &str, kind: &str) -> (String, Value) {
    let text = server.cli(&["why", run_id]);
    assert_eq!(
        text.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    let json_output = server.cli(&["why", run_id, "--json"]);
    assert_eq!(json_output.status.code(), Some(0));
    let stdout = text_of(&json_output);
    assert_eq!(stdout.lines().count(), 1, "one JSON document: {stdout}");
    let document: Value = serde_json::from_str(&stdout).expect("JSON");
    let text = text_of(&text);
    let lines: Vec<&str> = document["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|line| line.as_str().unwrap())
        .collect();
    // The same content: the text is the document's lines (read a moment
    // apart, so a relative time may differ; compare them without digits).
    let digitless = |line: &str| line.replace(|c: char| c.is_ascii_digit(), "");
    assert_eq!(
        text.lines().map(digitless).collect::<Vec<_>>(),
        lines.iter().map(|line| digitless(line)).collect::<Vec<_>>(),
        "{text}\n{document}"
    );
    assert_eq!(
        text.lines().nth(1),
        Some(format!("why: {}", document["summary"].as_str().unwrap()).as_str())
    );
    println!(
        "==== why: {kind} ====\n$ pi-workflows why <run>\n{text}$ pi-workflows why <run> --json\n{stdout}"
    );
    (text, document)
}

/// The run view's `display.why` agrees with `run.why`.
fn assert_view_agrees(server: &TestServer, run_id: &str, document: &Value) {
    let output = server.cli(&["view", run_id, "--once", "--json"]);
    let view: Value = serde_json::from_str(text_of(&output).trim()).expect("a view");
    let headline = &view["display"]["why"];
    assert_eq!(headline["state"], document["state"], "{view}");
    assert_eq!(headline["actor"], document["actor"], "{view}");
    assert_eq!(headline["summary"], document["summary"], "{view}");
    let frame = text_of(&server.cli(&["view", run_id, "--once"]));
    assert!(
        frame.contains(&format!(
            "why       {}",
            document["summary"].as_str().unwrap()
        )),
        "{frame}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_claimed_by_a_live_runner_mid_step_is_running_with_its_lease_and_last_commit() {
    let server = TestServer::start();
    let stall = one_node(
        server.scratch(),
        "stall",
        "compute",
        json!({"nodes": {"a": [{"stall": true}]}}),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &stall).await;
    let db = server.db();
    wait_for(WAIT, "node a to start", || {
        (count(
            &db,
            "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind = 'nodeStarted'",
            [&run_id],
        ) == 1)
            .then_some(())
    })
    .await;
    let (text, document) = why(&server, &run_id, "claimed by a live runner mid-step");
    assert_eq!(document["state"], "running");
    assert_eq!(document["actor"], "runner");
    assert!(
        text.contains(&format!(
            "run {run_id}: running, queue running — who acts: the run's runner"
        )),
        "{text}"
    );
    assert!(
        text.contains("why: running at node `a` on its runner; nothing to do"),
        "{text}"
    );
    assert!(
        text.contains("claim: held by the server for its runner (generation 1), expires in "),
        "{text}"
    );
    assert!(text.contains(" UTC)"), "{text}");
    assert!(text.contains("runner: ready since "), "{text}");
    assert!(text.contains("; last message "), "{text}");
    assert!(text.contains("last commit: revision "), "{text}");
    assert_eq!(document["claim"]["owner"], "runner");
    assert_eq!(document["claim"]["live"], true);
    assert_eq!(document["claim"]["generation"], 1);
    assert_eq!(document["runner"]["state"], "ready");
    assert!(document["runner"]["lastMessageAtMs"].is_u64());
    assert!(document["lastCommit"]["revision"].is_u64());
    assert!(document["lastCommit"]["event"].is_string());
    assert!(document.get("queue").is_none() && document.get("pending").is_none());
    assert_view_agrees(&server, &run_id, &document);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_for_a_decision_names_the_person_and_the_answer_command() {
    let server = TestServer::start();
    let mut gate: Value = json!({
        "workflowName": "gate",
        "topology": {"startAt": "a", "nodes": [{"id": "a", "nodeType": "checkpoint", "timeout": {"kind": "none"}, "mountPath": [], "humanDecision": true}],
                     "edges": [], "mounts": []},
    });
    gate["nodes"] = json!({"a": [{"decide": {"title": "Ship it?", "choices": [{"id": "approve", "label": "Approve"}], "expiresInMs": 3_600_000}}]});
    let gate = write_script(server.scratch(), "gate.json", &gate);
    let mut client = server.client().await;
    let run_id = started(&mut client, &gate).await;
    wait_view(&mut client, &run_id, WAIT, |view| {
        view["decision"].is_object()
    })
    .await;
    runner_gone(&server, &run_id).await;
    let (text, document) = why(&server, &run_id, "waiting for a decision");
    assert_eq!(document["state"], "waitingForAnswer");
    assert_eq!(document["actor"], "person");
    assert!(
        text.contains(&format!(
            "why: waiting for a person to decide at node `a`: `pi-workflows answer {run_id} <choice> [text]`"
        )),
        "{text}"
    );
    assert!(
        text.contains("pending: a protected human decision at node `a`, answered by a person"),
        "{text}"
    );
    assert!(
        text.contains("; expires in 59 min (at ") || text.contains("; expires in 60 min (at "),
        "{text}"
    );
    assert!(text.contains("then the run times out"), "{text}");
    assert!(text.contains("claim: none"), "{text}");
    assert_eq!(document["pending"]["kind"], "humanDecision");
    assert_eq!(document["pending"]["answeredBy"], "person");
    assert_eq!(document["pending"]["nodeId"], "a");
    assert!(document["pending"]["expiresAtMs"].is_u64());
    assert_view_agrees(&server, &run_id, &document);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_at_a_checkpoint_or_on_an_interaction_says_who_answers() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let checkpoint = started(&mut client, &script("checkpoint.json")).await;
    wait_view(&mut client, &checkpoint, WAIT, |view| {
        status(view) == "waiting"
    })
    .await;
    runner_gone(&server, &checkpoint).await;
    let (text, document) = why(&server, &checkpoint, "waiting at a checkpoint");
    assert_eq!(
        (&document["state"], &document["actor"]),
        (&json!("waitingForAnswer"), &json!("person"))
    );
    assert!(
        text.contains(&format!(
            "why: waiting for a person to answer the checkpoint at node `review`: `pi-workflows answer {checkpoint} <json>`"
        )),
        "{text}"
    );
    assert_eq!(document["pending"]["kind"], "checkpointAnswer");
    assert_view_agrees(&server, &checkpoint, &document);

    let ask = one_node(
        server.scratch(),
        "ask",
        "agent",
        json!({"nodes": {"a": [{"interact": {"prompt": "Write it."}}]}}),
    );
    let session = "session-why-1";
    let interaction = started_interactive(&mut client, &ask, session, json!({})).await;
    wait_view(&mut client, &interaction, WAIT, |view| {
        status(view) == "waiting"
    })
    .await;
    runner_gone(&server, &interaction).await;
    let (text, document) = why(&server, &interaction, "waiting on an interaction");
    assert_eq!(
        (&document["state"], &document["actor"]),
        (&json!("waitingForAgent"), &json!("originSession"))
    );
    assert!(
        text.contains(
            "why: waiting for the Pi session that started the run to finish its step at node `a`"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "pending: an agent step (submitted output) at node `a`, answered by the Pi session that started the run"
        ),
        "{text}"
    );
    assert!(!text.contains(session) && !document.to_string().contains(session));
    assert_view_agrees(&server, &interaction, &document);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_effect_names_its_recovery_commands() {
    let server = TestServer::start();
    let effect = one_node(
        server.scratch(),
        "effect",
        "action",
        json!({"nodes": {"a": [{"effect": {"type": "mail.send", "request": {"to": "x"}}, "crashWhileApplying": true}]}}),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &effect).await;
    let view = wait_view(&mut client, &run_id, WAIT, |view| {
        status(view) == "ambiguous"
    })
    .await;
    runner_gone(&server, &run_id).await;
    let effect_id = view["ambiguousEffects"][0]["effectId"]
        .as_str()
        .unwrap()
        .to_owned();
    let (text, document) = why(&server, &run_id, "an ambiguous effect");
    assert_eq!(
        (&document["state"], &document["actor"]),
        (&json!("ambiguous"), &json!("operator"))
    );
    let confirm = format!("pi-workflows recover {run_id} confirm --effect {effect_id}");
    let retry = format!("pi-workflows recover {run_id} retry --effect {effect_id}");
    assert!(
        text.contains(&format!(
            "ambiguous effect {effect_id} (attempt 1): check the external system, then `{confirm}` if it applied, or `{retry}` (may apply twice)"
        )),
        "{text}"
    );
    assert!(
        text.contains("then: the run continues on its own once no effect is ambiguous"),
        "{text}"
    );
    assert_eq!(
        document["ambiguousEffects"][0]["effectId"],
        effect_id.as_str()
    );
    assert_eq!(document["ambiguousEffects"][0]["confirm"], confirm.as_str());
    assert_eq!(document["ambiguousEffects"][0]["retry"], retry.as_str());
    assert_eq!(document["park"], "effectAmbiguous");
    assert_view_agrees(&server, &run_id, &document);
    // The command it names works.
    let recovered = server.cli(&["recover", &run_id, "confirm", "--effect", &effect_id]);
    assert_eq!(
        recovered.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&recovered.stderr)
    );
    // It names what happens next: the run continues on its own.
    wait_view(&mut client, &run_id, WAIT, |view| {
        status(view) == "completed"
    })
    .await;
    runner_gone(&server, &run_id).await;
    assert_eq!(why(&server, &run_id, "after confirm").1["state"], "done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_queued_behind_capacity_shows_its_position_and_the_runner_capacity() {
    let server = TestServer::start_with(&[("PI_WORKFLOWS_MAX_WORKERS", "1")]);
    let stall = one_node(
        server.scratch(),
        "stall",
        "compute",
        json!({"nodes": {"a": [{"stall": true}]}}),
    );
    let mut client = server.client().await;
    let first = started(&mut client, &stall).await;
    wait_view(&mut client, &first, WAIT, |view| status(view) == "running").await;
    let second = started(&mut client, &stall).await;
    let third = started(&mut client, &stall).await;
    let (text, document) = why(&server, &third, "queued behind capacity");
    assert_eq!(
        (&document["state"], &document["actor"]),
        (&json!("queued"), &json!("server"))
    );
    assert!(
        text.contains("why: waiting for a runner slot; the server admits it in FIFO order"),
        "{text}"
    );
    assert!(
        text.contains("queue: position 2 for admission (oldest first); runners 1 of 1 busy"),
        "{text}"
    );
    assert!(text.contains("runner: none yet"), "{text}");
    assert_eq!(
        document["queue"],
        json!({"position": 2, "liveRunners": 1, "capacity": 1})
    );
    assert_eq!(
        why(&server, &second, "queued first").1["queue"]["position"],
        1
    );
    assert_view_agrees(&server, &third, &document);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_parked_on_a_source_change_or_no_progress_need_an_operator() {
    let server = TestServer::start();
    let quitter = write_script(
        server.scratch(),
        "quitter.json",
        &json!({"workflowName": "quitter", "topology": linear_topology(&["a"]), "startup": {"exitAfterReady": 0}}),
    );
    let editable = write_script(
        server.scratch(),
        "editable.json",
        &json!({"workflowName": "editable", "topology": linear_topology(&["a"]), "nodes": {"a": [{"stall": true}]}}),
    );
    let mut client = server.client().await;
    let no_progress = started(&mut client, &quitter).await;
    let changed = started(&mut client, &editable).await;
    wait_view(&mut client, &changed, WAIT, |view| {
        status(view) == "running"
    })
    .await;
    let pause = server.cli(&["pause", &changed]);
    assert_eq!(pause.status.code(), Some(0));
    write_script(
        server.scratch(),
        "editable.json",
        &json!({"topology": linear_topology(&["b"])}),
    );
    let resume = server.cli(&["resume", &changed]);
    assert_eq!(resume.status.code(), Some(0));
    let parked =
        |view: &Value| view["status"]["queue"] == "parked" && view["display"]["reason"].is_string();
    for (run_id, park, words, kind) in [
        (
            &changed,
            "workflowSourceChanged",
            "the workflow source changed since the run started",
            "parked on a source change",
        ),
        (
            &no_progress,
            "runnerNoProgress",
            "its runner exited without progress",
            "parked on no progress",
        ),
    ] {
        wait_view(&mut client, run_id, WAIT, parked).await;
        runner_gone(&server, run_id).await;
        let (text, document) = why(&server, run_id, kind);
        assert_eq!(
            (&document["state"], &document["actor"]),
            (&json!("parkedForReview"), &json!("operator"))
        );
        assert_eq!(document["park"], park);
        assert!(text.contains(&format!("why: parked: {words}")), "{text}");
        assert!(
            text.contains(&format!(
                "an operator resumes it: `pi-workflows resume {run_id}` (or `pi-workflows cancel {run_id}`)"
            )),
            "{text}"
        );
        assert!(text.contains(&format!("park: {words}")), "{text}");
        assert_eq!(document["runner"]["state"], "exited", "{document}");
        assert!(document.get("queue").is_none(), "{document}");
        assert_view_agrees(&server, run_id, &document);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_run_says_it_is_done_and_a_missing_run_is_one_line() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let run_id = started(&mut client, &script("linear.json")).await;
    wait_view(&mut client, &run_id, WAIT, |view| {
        status(view) == "completed"
    })
    .await;
    runner_gone(&server, &run_id).await;
    let (text, document) = why(&server, &run_id, "a completed run");
    assert_eq!(
        (&document["state"], &document["actor"]),
        (&json!("done"), &json!("nobody"))
    );
    assert!(
        text.starts_with(&format!(
            "run {run_id}: completed, queue done — who acts: nobody\nwhy: the run completed; nothing is pending\n"
        )),
        "{text}"
    );
    assert!(text.contains(", event "), "{text}");
    assert!(document.get("claim").is_none());
    assert_view_agrees(&server, &run_id, &document);

    let missing = server.cli(&["why", "no-such-run"]);
    assert_eq!(missing.status.code(), Some(4));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(
        stderr.trim_end(),
        "pi-workflows: no run no-such-run; list runs with `pi-workflows runs`"
    );
    assert!(missing.stdout.is_empty());
}

/// Private values seeded into durable state (a token in the input and the
/// contract, a prompt, a session id, a project path, an output, an error
/// message) appear in no `why` output, text or JSON, nor the claim's token
/// hash, the runner's epoch or its process id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn why_shows_no_token_prompt_output_session_id_or_path() {
    const TOKEN: &str = "tok-PRIVATE-TOKEN-7731";
    const PROMPT: &str = "PRIVATE-PROMPT-4409 write the summary";
    const SESSION: &str = "sess-PRIVATE-SESSION-5521";
    const PATH_PART: &str = "PRIVATE-PATH-8812";
    const OUTPUT: &str = "PRIVATE-OUTPUT-3390";
    const ERROR: &str = "PRIVATE-ERROR-9044";
    let server = TestServer::start();
    let project = server.scratch().join(PATH_PART);
    std::fs::create_dir_all(&project).unwrap();
    let interactive = write_script(
        &project,
        "interactive.json",
        &json!({
            "workflowName": "interactive",
            "topology": linear_topology(&["draft", "ask"]),
            "nodes": {
                "draft": [{"finish": {"result": OUTPUT}}],
                "ask": [{"interact": {"prompt": PROMPT, "contract": {"secret": TOKEN}}}]
            }
        }),
    );
    let failing = write_script(
        &project,
        "failing.json",
        &json!({"workflowName": "failing", "topology": linear_topology(&["x"]), "nodes": {"x": [{"fail": ERROR}]}}),
    );
    let stall = write_script(
        &project,
        "stall.json",
        &json!({"workflowName": "stall", "topology": linear_topology(&["s"]), "nodes": {"s": [{"finish": {"out": OUTPUT}}]}}),
    );
    let mut client = server.client().await;
    let waiting = started_interactive(
        &mut client,
        &interactive,
        SESSION,
        json!({"apiToken": TOKEN}),
    )
    .await;
    let failed = started(&mut client, &failing).await;
    let done = started(&mut client, &stall).await;
    wait_view(&mut client, &waiting, WAIT, |view| {
        status(view) == "waiting"
    })
    .await;
    wait_view(&mut client, &failed, WAIT, |view| status(view) == "failed").await;
    wait_view(&mut client, &done, WAIT, |view| status(view) == "completed").await;
    for run_id in [&waiting, &failed, &done] {
        runner_gone(&server, run_id).await;
    }
    let db = server.db();
    let mut secrets: Vec<String> = [TOKEN, PROMPT, SESSION, PATH_PART, OUTPUT, ERROR]
        .into_iter()
        .map(str::to_owned)
        .collect();
    secrets.push(server.scratch().to_string_lossy().into_owned());
    let mut statement = db
        .prepare("SELECT hex(token_hash) FROM leases WHERE token_hash IS NOT NULL")
        .unwrap();
    for hash in statement
        .query_map([], |row| row.get::<_, String>(0))
        .unwrap()
    {
        let hash = hash.unwrap();
        secrets.push(hash.to_lowercase());
        secrets.push(hash);
    }
    let mut statement = db
        .prepare("SELECT runner_epoch, COALESCE(pid, -1) FROM run_workers")
        .unwrap();
    for row in statement
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })
        .unwrap()
    {
        let (epoch, _pid) = row.unwrap();
        secrets.push(epoch);
    }
    for run_id in [&waiting, &failed, &done] {
        for args in [
            &["why", run_id.as_str()][..],
            &["why", run_id.as_str(), "--json"],
        ] {
            let output = server.cli(args);
            assert_eq!(output.status.code(), Some(0));
            let all = format!(
                "{}{}",
                text_of(&output),
                String::from_utf8_lossy(&output.stderr)
            );
            for secret in &secrets {
                assert!(!all.contains(secret.as_str()), "{secret:?} in {all}");
            }
        }
    }
    let (text, _) = why(&server, &failed, "a failed run");
    assert!(text.contains("why: the run failed (node failed)"), "{text}");
}
