//! The Telegram channel adapter end to end: a real server, real SQLite,
//! scripted runners, the real `pi-workflows-telegram-adapter` child, and a
//! fake Bot API on 127.0.0.1 (`support::telegram`). No network, no real
//! credentials.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::telegram::FakeTelegram;
use support::{
    SETTLE_TIMEOUT, TestServer, count, started, status, view, wait_for, wait_view, write_script,
};

const TOKEN: &str = "987654:FAKE-telegram-token-never-shown";
const USER: i64 = 4242;
const CHAT: i64 = 4242;
const STRANGER: i64 = 777;
/// A second allowed chat (a group: negative).
const GROUP: i64 = -100_4242;
const SUBJECT_MARKER: &str = "SUBJECT-MARKER-never-sent";

fn node(id: &str, node_type: &str) -> Value {
    json!({"id": id, "nodeType": node_type, "timeout": {"kind": "default"}, "mountPath": []})
}

/// `draft → gate (human decision) → approve: publish | revise: rework`.
fn decision_script(dir: &Path) -> PathBuf {
    let mut gate = node("gate", "checkpoint");
    gate["humanDecision"] = json!(true);
    write_script(
        dir,
        "decision.json",
        &json!({
            "workflowName": "decision",
            "topology": {
                "startAt": "draft",
                "nodes": [node("draft", "compute"), gate, node("publish", "compute"), node("rework", "compute")],
                "edges": [
                    {"kind": "plain", "from": "draft", "to": "gate"},
                    {"kind": "switch", "from": "gate", "on": "$.choice", "cases": {"approve": "publish", "revise": "rework"}},
                ],
                "mounts": [],
            },
            "nodes": {
                "gate": [{"decide": {
                    "title": "Publish the release?",
                    "summary": "Release 1.2 is ready.",
                    "subject": {"secret": SUBJECT_MARKER},
                    "choices": [
                        {"id": "approve", "label": "Approve"},
                        {"id": "revise", "label": "Revise", "input": {"kind": "text", "name": "feedback", "prompt": "What should change?", "minLength": 1, "maxLength": 200}},
                    ],
                }}],
            },
        }),
    )
}

/// Writes `channels/channels.json` (allowing `chats`) and the token file
/// (`token_mode`).
fn configure(server: &TestServer, telegram: &FakeTelegram, token_mode: u32, chats: &[i64]) {
    let dir = server.home.join("channels");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let token_file = server.scratch().join("ops.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(token_mode)).unwrap();
    let config = dir.join("channels.json");
    std::fs::write(
        &config,
        json!({"telegram": {"ops": {
            "tokenFile": token_file,
            "allowedUserIds": [USER.to_string()],
            "allowedChatIds": chats.iter().map(i64::to_string).collect::<Vec<_>>(),
            "audiences": ["operators"],
            "apiBase": telegram.base(),
        }}})
        .to_string(),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn channel_server(telegram: &FakeTelegram, token_mode: u32, extra: &[(&str, &str)]) -> TestServer {
    channel_server_for(telegram, token_mode, extra, &[CHAT])
}

fn channel_server_for(
    telegram: &FakeTelegram,
    token_mode: u32,
    extra: &[(&str, &str)],
    chats: &[i64],
) -> TestServer {
    let mut env = vec![
        ("PI_WORKFLOWS_CHANNEL_POLL_MS", "50"),
        (
            "PI_WORKFLOWS_CHANNEL_ADAPTER",
            env!("CARGO_BIN_EXE_pi-workflows-telegram-adapter"),
        ),
    ];
    env.extend_from_slice(extra);
    let mut server = TestServer::new(&env);
    configure(&server, telegram, token_mode, chats);
    server.spawn().expect("the server starts");
    server
}

async fn request(client: &mut Client, spec: &RequestSpec) -> Response {
    client.request(spec).await.expect("a response")
}

async fn channel_status(client: &mut Client) -> Value {
    let status = request(
        client,
        &RequestSpec::read("channel.status", None, json!({})),
    )
    .await;
    assert_eq!(status.outcome, "accepted", "{:?}", status.frame);
    status.receipt.unwrap()
}

async fn wait_running(client: &mut Client) -> Value {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let status = channel_status(client).await;
        if status["channels"][0]["state"] == "running" {
            return status;
        }
        assert!(Instant::now() < deadline, "the adapter never ran: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a decision run and waits until it waits and its presentation was
/// sent: the run, the decision as the view shows it, and the press data of
/// each button.
async fn presented(
    client: &mut Client,
    server: &TestServer,
    telegram: &FakeTelegram,
    sends_before: usize,
) -> (String, Value, Vec<String>) {
    let run_id = started(client, &decision_script(server.scratch())).await;
    let shown = wait_view(client, &run_id, SETTLE_TIMEOUT, |view| {
        view["decision"].is_object()
    })
    .await;
    assert_eq!(shown["status"]["run"], "waiting", "{shown}");
    let sends = telegram.wait_calls("sendMessage", sends_before + 1, SETTLE_TIMEOUT);
    let body = &sends[sends_before].body;
    let data = body["reply_markup"]["inline_keyboard"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row[0]["callback_data"].as_str().unwrap().to_owned())
        .collect();
    (run_id, shown["decision"].clone(), data)
}

/// The state, attempt number and id of `run_id`'s effect of `effect_type`.
fn effect_row(
    server: &TestServer,
    run_id: &str,
    effect_type: &str,
) -> Option<(String, i64, String)> {
    server
        .db()
        .query_row(
            "SELECT state, attempt_number, effect_id FROM effects WHERE run_id = ?1 AND effect_type = ?2",
            [run_id, effect_type],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .ok()
}

fn send_state(server: &TestServer, run_id: &str) -> (String, i64) {
    let (state, number, _) = effect_row(server, run_id, "channel.send:ops").expect("a send");
    (state, number)
}

async fn wait_send_state(server: &TestServer, run_id: &str, state: &str) {
    wait_for(SETTLE_TIMEOUT, &format!("the send {state}"), || {
        (send_state(server, run_id).0 == state).then_some(())
    })
    .await;
}

fn decision_row(server: &TestServer, run_id: &str) -> (String, Option<String>, Option<String>) {
    server
        .db()
        .query_row(
            "SELECT state, answer_channel, answer_actor_id FROM human_decisions WHERE run_id = ?1",
            [run_id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap()
}

/// The note the fake Bot API showed for press `id`.
fn note_of(telegram: &FakeTelegram, id: &str) -> String {
    let calls = telegram.calls("answerCallbackQuery");
    let call = calls
        .iter()
        .find(|call| call.body["callback_query_id"] == id)
        .unwrap_or_else(|| panic!("press {id} was never answered: {calls:?}"));
    call.body["text"].as_str().unwrap_or_default().to_owned()
}

async fn wait_note(telegram: &FakeTelegram, id: &str) -> String {
    wait_for(SETTLE_TIMEOUT, "the press's note", || {
        telegram
            .calls("answerCallbackQuery")
            .iter()
            .any(|call| call.body["callback_query_id"] == id)
            .then_some(())
    })
    .await;
    note_of(telegram, id)
}

/// Every file under the state directory and the server's stderr, as text.
fn everything_written(server: &TestServer) -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push_str(&String::from_utf8_lossy(
                    &std::fs::read(&path).unwrap_or_default(),
                ));
            }
        }
    }
    let mut out = String::new();
    walk(&server.home.join("host"), &mut out);
    out.push_str(
        &std::fs::read_to_string(server.scratch().join("server.stderr")).unwrap_or_default(),
    );
    out
}

/// At run time, the adapter is transport-only: it starts with an empty
/// environment (no state directory to find) and, while it presents a
/// decision and forwards a press, holds no file of the state directory open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_adapter_has_an_empty_environment_and_no_state_file_open() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(&telegram, 0o600, &[]);
    let mut client = server.client().await;
    wait_running(&mut client).await;
    let (_run_id, _, data) = presented(&mut client, &server, &telegram, 0).await;
    let pid = adapter_pid(&server).expect("the adapter process");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        environ.is_empty(),
        "the adapter's environment: {}",
        String::from_utf8_lossy(&environ).replace('\0', " ")
    );
    let press = telegram.press(USER, CHAT, &data[0]);
    assert_eq!(wait_note(&telegram, &press).await, "Recorded.");
    let home = server.home.canonicalize().unwrap();
    let open: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .collect();
    assert!(!open.is_empty(), "the adapter's descriptors were read");
    assert!(
        open.iter()
            .all(|target| !target.starts_with(home.to_str().unwrap())
                && !target.contains("state.sqlite")),
        "the adapter holds a state file open: {open:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telegram_press_answers_the_decision_with_telegram_provenance() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(&telegram, 0o600, &[]);
    let mut client = server.client().await;
    let status_before = wait_running(&mut client).await;
    let (run_id, _, data) = presented(&mut client, &server, &telegram, 0).await;

    // Sent once, with the rendered presentation and never the subject.
    let send = &telegram.calls("sendMessage")[0];
    assert_eq!(send.token, TOKEN);
    assert_eq!(send.body["chat_id"], CHAT);
    let text = send.body["text"].as_str().unwrap();
    assert!(
        text.starts_with("Publish the release?\n\nRelease 1.2 is ready."),
        "{text}"
    );
    assert!(!telegram.all_bodies().contains(SUBJECT_MARKER));
    assert_eq!(data.len(), 2);
    wait_send_state(&server, &run_id, "applied").await;
    assert_eq!(send_state(&server, &run_id), ("applied".into(), 1));

    let press = telegram.press(USER, CHAT, &data[0]);
    assert_eq!(wait_note(&telegram, &press).await, "Recorded.");
    assert_eq!(
        decision_row(&server, &run_id),
        (
            "accepted".into(),
            Some("telegram".into()),
            Some(USER.to_string())
        )
    );
    let db = server.db();
    let child: String = db
        .query_row(
            "SELECT run_id FROM runs WHERE continuation_of = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    let settled = support::wait_settled(&mut client, &child).await;
    assert_eq!(status(&settled), "completed", "{settled}");
    assert_eq!(
        support::step_outcomes(&settled).last().unwrap().0,
        "publish"
    );

    // The same person pressing the same button again (a double tap, after
    // the run continued) changes nothing: the note says so, the decision
    // keeps its one answer, and there is still one continuation.
    let again = telegram.press(USER, CHAT, &data[0]);
    assert_eq!(
        wait_note(&telegram, &again).await,
        "the run waits on no pending decision"
    );
    assert_eq!(
        decision_row(&server, &run_id),
        (
            "accepted".into(),
            Some("telegram".into()),
            Some(USER.to_string())
        )
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM runs WHERE continuation_of = ?1",
            [&run_id]
        ),
        1
    );

    // Redaction: the token is in no status, log or state-directory file.
    let after = channel_status(&mut client).await;
    for shown in [
        status_before.to_string(),
        after.to_string(),
        view(&mut client, &run_id).await.to_string(),
    ] {
        assert!(!shown.contains(TOKEN), "{shown}");
    }
    let cli = server.cli(&["channel", "status"]);
    assert!(!String::from_utf8_lossy(&cli.stdout).contains(TOKEN));
    assert!(!String::from_utf8_lossy(&cli.stderr).contains(TOKEN));
    assert!(!everything_written(&server).contains(TOKEN));
    assert!(!everything_written(&server).contains(SUBJECT_MARKER));
    assert_consistent(&server).await;
}

/// Waits for every runner to exit, then runs every consistency check.
async fn assert_consistent(server: &TestServer) {
    support::wait_quiescent_at(server).await;
    assert_eq!(
        support::consistency_violations(&server.db()),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_users_and_chats_are_refused_and_the_decision_waits() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(&telegram, 0o600, &[]);
    let mut client = server.client().await;
    wait_running(&mut client).await;
    let (run_id, _, data) = presented(&mut client, &server, &telegram, 0).await;
    wait_send_state(&server, &run_id, "applied").await;

    let stranger = telegram.press(STRANGER, CHAT, &data[0]);
    let other_chat = telegram.press(USER, STRANGER, &data[0]);
    for press in [stranger, other_chat] {
        assert_eq!(
            wait_note(&telegram, &press).await,
            "You may not answer this decision."
        );
    }
    // A choice that takes text is not answered by its button alone.
    let text_choice = telegram.press(USER, CHAT, &data[1]);
    assert!(
        wait_note(&telegram, &text_choice)
            .await
            .contains("takes text")
    );
    // A forged press naming another attempt changes nothing either.
    let forged = telegram.press(USER, CHAT, &data[0].replacen(".1|", ".2|", 1));
    assert_eq!(
        wait_note(&telegram, &forged).await,
        "not the current attempt of this channel message"
    );
    assert_eq!(
        decision_row(&server, &run_id),
        ("pending".into(), None, None)
    );
    assert_eq!(status(&view(&mut client, &run_id).await), "waiting");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pi_answer_and_a_telegram_press_race_to_one_winner() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(&telegram, 0o600, &[]);
    let mut client = server.client().await;
    wait_running(&mut client).await;
    let (run_id, decision, data) = presented(&mut client, &server, &telegram, 0).await;
    wait_send_state(&server, &run_id, "applied").await;

    let pi_answer = RequestSpec::command(
        "decision.answer",
        Some(&run_id),
        json!({
            "decisionId": decision["decisionId"],
            "requestDigest": decision["requestDigest"],
            "choice": "revise",
            "input": {"feedback": "more tests"},
            "source": {"channel": "pi", "actorId": "session-1"},
        }),
    );
    let press = telegram.press(USER, CHAT, &data[0]);
    let pi = request(&mut client, &pi_answer).await;
    let note = wait_note(&telegram, &press).await;
    // Different answers: the first valid one wins, the other is refused.
    let (state, channel, _) = decision_row(&server, &run_id);
    assert_eq!(state, "accepted");
    let winners = usize::from(pi.outcome == "accepted") + usize::from(note == "Recorded.");
    assert_eq!(winners, 1, "pi {:?}, telegram {note:?}", pi.frame);
    let expected = if pi.outcome == "accepted" {
        "pi"
    } else {
        "telegram"
    };
    assert_eq!(channel.as_deref(), Some(expected));
    assert_eq!(
        count(
            &server.db(),
            "SELECT COUNT(*) FROM runs WHERE continuation_of = ?1",
            [&run_id]
        ),
        1,
        "one continuation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_send_is_never_resent_until_confirmed_or_retried() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(&telegram, 0o600, &[]);
    let mut client = server.client().await;
    wait_running(&mut client).await;

    // The Bot API reads the send, then drops the connection: ambiguous.
    telegram.drop_next_send();
    let (run_id, _, _) = presented(&mut client, &server, &telegram, 0).await;
    wait_send_state(&server, &run_id, "ambiguous").await;
    let shown = view(&mut client, &run_id).await;
    assert!(
        shown["display"]["controls"]
            .as_array()
            .unwrap()
            .contains(&json!("recoverEffect")),
        "{shown}"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        telegram.calls("sendMessage").len(),
        1,
        "never sent again on its own"
    );
    let effect_id: String = server
        .db()
        .query_row(
            "SELECT effect_id FROM effects WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();

    // Retry from the command line: a warning, the next numbered attempt, sent once more.
    let retried = server.cli(&[
        "channel",
        "recover",
        "retry",
        "ops",
        &format!("{effect_id}.1"),
    ]);
    assert!(retried.status.success(), "{retried:?}");
    let said = String::from_utf8_lossy(&retried.stdout).into_owned()
        + &String::from_utf8_lossy(&retried.stderr);
    assert!(said.contains("duplicate"), "{said}");
    telegram.wait_calls("sendMessage", 2, SETTLE_TIMEOUT);
    wait_send_state(&server, &run_id, "applied").await;
    assert_eq!(send_state(&server, &run_id), ("applied".into(), 2));
    assert_eq!(
        attempts_of(&server, &effect_id),
        vec![(1, "ambiguous".into()), (2, "applied".into())]
    );

    // A stale attempt id cannot be recovered.
    let stale = server.cli(&[
        "channel",
        "recover",
        "confirm",
        "ops",
        &format!("{effect_id}.1"),
    ]);
    assert!(!stale.status.success());

    // Confirm: the operator saw it arrive; it is applied and not sent again.
    telegram.drop_next_send();
    let (second, _, _) = presented(&mut client, &server, &telegram, 2).await;
    wait_send_state(&server, &second, "ambiguous").await;
    let second_effect: String = server
        .db()
        .query_row(
            "SELECT effect_id FROM effects WHERE run_id = ?1",
            [&second],
            |row| row.get(0),
        )
        .unwrap();
    let confirmed = server.cli(&[
        "channel",
        "recover",
        "confirm",
        "ops",
        &format!("{second_effect}.1"),
    ]);
    assert!(confirmed.status.success(), "{confirmed:?}");
    assert_eq!(send_state(&server, &second), ("applied".into(), 1));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(telegram.calls("sendMessage").len(), 3);
    assert_consistent(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_adapter_epoch_cannot_answer() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(
        &telegram,
        0o600,
        &[("PI_WORKFLOWS_ADAPTER_FAULT", "stale_epoch")],
    );
    let mut client = server.client().await;
    wait_running(&mut client).await;
    let (run_id, _, data) = presented(&mut client, &server, &telegram, 0).await;
    wait_send_state(&server, &run_id, "applied").await;
    let press = telegram.press(USER, CHAT, &data[0]);
    assert_eq!(
        wait_note(&telegram, &press).await,
        "another channel adapter replaced this one"
    );
    assert_eq!(
        decision_row(&server, &run_id),
        ("pending".into(), None, None)
    );
}

/// The adapter child of the server (`pi-workflows-te…` is its command name).
fn adapter_pid(server: &TestServer) -> Option<i32> {
    let server_pid = server.pid().to_string();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (_, rest) = stat.split_once(") ")?;
            let parent = rest.split(' ').nth(1)?;
            let name = stat.split_once('(')?.1.split_once(')')?.0;
            (parent == server_pid && name.starts_with("pi-workflows-te"))
                .then(|| entry.file_name().to_string_lossy().parse().ok())
                .flatten()
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_adapter_is_restarted_its_send_in_flight_is_ambiguous_and_presses_still_answer() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(&telegram, 0o600, &[]);
    let mut client = server.client().await;
    wait_running(&mut client).await;

    // A send in flight when the adapter dies becomes ambiguous. While the
    // live adapter applies it, it is the adapter's, not a stale runner's:
    // the consistency checks accept it while the run waits on its decision.
    telegram.hold_sends(true);
    let (held, _, _) = presented(&mut client, &server, &telegram, 0).await;
    assert_eq!(send_state(&server, &held).0, "applying");
    assert_eq!(status(&view(&mut client, &held).await), "waiting");
    assert_eq!(
        support::consistency_violations(&server.db()),
        Vec::<String>::new()
    );
    let first = adapter_pid(&server).expect("the adapter runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_send_state(&server, &held, "ambiguous").await;
    telegram.hold_sends(false);

    // Supervision starts it again, with a new epoch.
    let second = wait_for(SETTLE_TIMEOUT, "a new adapter", || {
        adapter_pid(&server).filter(|pid| *pid != first)
    })
    .await;
    assert_ne!(second, first);
    wait_running(&mut client).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        telegram.calls("sendMessage").len(),
        1,
        "the ambiguous send is not resent"
    );

    // A decision presented by the new adapter is answered through it.
    let (run_id, _, data) = presented(&mut client, &server, &telegram, 1).await;
    wait_send_state(&server, &run_id, "applied").await;
    let press = telegram.press(USER, CHAT, &data[0]);
    assert_eq!(wait_note(&telegram, &press).await, "Recorded.");
    assert_eq!(decision_row(&server, &run_id).0, "accepted");
    assert_consistent(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_profile_is_one_diagnostic_and_the_decision_stays_waiting() {
    let telegram = FakeTelegram::start(TOKEN);
    // A token file others can read is refused.
    let server = channel_server(&telegram, 0o644, &[]);
    let mut client = server.client().await;
    let shown = channel_status(&mut client).await;
    assert_eq!(
        shown,
        json!({"channels": [{
            "profile": "ops",
            "state": "failed",
            "diagnostic": "profile ops: the token file must be private to its owner (chmod 600)",
        }]})
    );
    let run_id = started(&mut client, &decision_script(server.scratch())).await;
    wait_view(&mut client, &run_id, SETTLE_TIMEOUT, |view| {
        view["decision"].is_object()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(telegram.calls("sendMessage").is_empty());
    assert_eq!(decision_row(&server, &run_id).0, "pending");

    // Fixed and reloaded: the adapter runs and presents the waiting decision.
    std::fs::set_permissions(
        server.scratch().join("ops.token"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let reloaded = server.cli(&["channel", "reload"]);
    assert!(reloaded.status.success(), "{reloaded:?}");
    wait_running(&mut client).await;
    telegram.wait_calls("sendMessage", 1, SETTLE_TIMEOUT);

    // A channel configuration others can read is one diagnostic for the file.
    std::fs::set_permissions(
        server.home.join("channels").join("channels.json"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let reloaded = server.cli(&["channel", "reload"]);
    assert!(reloaded.status.success(), "{reloaded:?}");
    let shown = wait_for(SETTLE_TIMEOUT, "the file diagnostic", || {
        let out = server.cli(&["channel", "status", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("private to its owner").then_some(text)
    })
    .await;
    assert!(
        !shown.contains(TOKEN) && !shown.contains("ops.token"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_adapter_keeps_the_server_up_while_a_decision_waits_for_it() {
    let telegram = FakeTelegram::start(TOKEN);
    let mut server = channel_server(&telegram, 0o600, &[("PI_WORKFLOWS_IDLE_EXIT_MS", "300")]);
    let data = {
        let mut client = server.client().await;
        wait_running(&mut client).await;
        let (run_id, _, data) = presented(&mut client, &server, &telegram, 0).await;
        wait_send_state(&server, &run_id, "applied").await;
        data
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        server.is_running(),
        "the server waits for the channel's answer"
    );
    let press = telegram.press(USER, CHAT, &data[0]);
    assert_eq!(wait_note(&telegram, &press).await, "Recorded.");
    assert!(
        server.wait_exit(SETTLE_TIMEOUT),
        "with nothing left to answer, the server idles out"
    );
}

/// The state and attempt number of `run_id`'s settlement edit, if any.
fn settle_state(server: &TestServer, run_id: &str) -> Option<(String, i64)> {
    effect_row(server, run_id, "channel.settle:ops").map(|(state, number, _)| (state, number))
}

async fn wait_settle_state(server: &TestServer, run_id: &str, state: &str) {
    wait_for(SETTLE_TIMEOUT, &format!("the settlement {state}"), || {
        (settle_state(server, run_id).is_some_and(|(found, _)| found == state)).then_some(())
    })
    .await;
}

fn settle_effect_id(server: &TestServer, run_id: &str) -> String {
    effect_row(server, run_id, "channel.settle:ops")
        .expect("a settlement")
        .2
}

fn attempts_of(server: &TestServer, effect_id: &str) -> Vec<(i64, String)> {
    let db = server.db();
    let mut statement = db
        .prepare(
            "SELECT attempt_number, state FROM effect_attempts WHERE effect_id = ?1 ORDER BY attempt_number",
        )
        .unwrap();
    statement
        .query_map([effect_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The (chat, message) each `editMessageText` call so far edited.
fn edited(telegram: &FakeTelegram) -> Vec<(i64, i64)> {
    telegram
        .calls("editMessageText")
        .iter()
        .map(|call| {
            (
                call.body["chat_id"].as_i64().unwrap(),
                call.body["message_id"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_answered_from_the_cli_or_cancelled_gets_each_chats_message_edited_once() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server_for(&telegram, 0o600, &[], &[CHAT, GROUP]);
    let mut client = server.client().await;
    wait_running(&mut client).await;

    // Presented to both chats, then answered from the command line.
    let (answered, _, _) = presented(&mut client, &server, &telegram, 0).await;
    wait_send_state(&server, &answered, "applied").await;
    let mut sent = telegram.sent();
    sent.sort_unstable();
    assert_eq!(sent.len(), 2, "one message per chat: {sent:?}");
    let cli = server.cli(&["answer", &answered, "approve"]);
    assert!(cli.status.success(), "{cli:?}");
    telegram.wait_calls("editMessageText", 2, SETTLE_TIMEOUT);
    wait_settle_state(&server, &answered, "applied").await;
    let mut edits = edited(&telegram);
    edits.sort_unstable();
    assert_eq!(edits, sent, "each chat's message, once");
    for call in telegram.calls("editMessageText") {
        let text = call.body["text"].as_str().unwrap();
        assert!(
            text.starts_with(
                "Publish the release?

Release 1.2 is ready."
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "

Decided: Approve (answered from the command line)

Request "
            ),
            "{text}"
        );
        assert_eq!(
            call.body["reply_markup"],
            json!({"inline_keyboard": []}),
            "no buttons"
        );
        assert_eq!(call.token, TOKEN);
    }
    let effect_id = settle_effect_id(&server, &answered);
    assert_eq!(
        attempts_of(&server, &effect_id),
        vec![(1, "applied".into())]
    );

    // Cancelled: the outcome says so (and the answered run is not edited again).
    let (cancelled, _, _) = presented(&mut client, &server, &telegram, 2).await;
    wait_send_state(&server, &cancelled, "applied").await;
    let cli = server.cli(&["cancel", &cancelled]);
    assert!(cli.status.success(), "{cli:?}");
    let calls = telegram.wait_calls("editMessageText", 4, SETTLE_TIMEOUT);
    wait_settle_state(&server, &cancelled, "applied").await;
    for call in &calls[2..] {
        let text = call.body["text"].as_str().unwrap();
        assert!(
            text.contains(
                "

Cancelled: this decision no longer waits for an answer."
            ),
            "{text}"
        );
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        telegram.calls("editMessageText").len(),
        4,
        "each edited once"
    );
    assert!(!telegram.all_bodies().contains(SUBJECT_MARKER));
    assert!(!everything_written(&server).contains(TOKEN));
    assert_consistent(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_interrupted_by_a_killed_adapter_is_ambiguous_and_edited_again_only_after_channel_recover()
 {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(&telegram, 0o600, &[]);
    let mut client = server.client().await;
    wait_running(&mut client).await;
    let (run_id, decision, _) = presented(&mut client, &server, &telegram, 0).await;
    wait_send_state(&server, &run_id, "applied").await;

    // Answered (as Pi would); the edit is in flight when the adapter dies.
    telegram.hold_edits(true);
    let pi = request(
        &mut client,
        &RequestSpec::command(
            "decision.answer",
            Some(&run_id),
            json!({
                "decisionId": decision["decisionId"],
                "requestDigest": decision["requestDigest"],
                "choice": "revise",
                "input": {"feedback": "PRIVATE-FEEDBACK-never-shown"},
                "source": {"channel": "pi", "actorId": "session-1"},
            }),
        ),
    )
    .await;
    assert_eq!(pi.outcome, "accepted", "{:?}", pi.frame);
    telegram.wait_calls("editMessageText", 1, SETTLE_TIMEOUT);
    assert_eq!(settle_state(&server, &run_id), Some(("applying".into(), 1)));
    let first = adapter_pid(&server).expect("the adapter runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_settle_state(&server, &run_id, "ambiguous").await;
    telegram.hold_edits(false);
    wait_for(SETTLE_TIMEOUT, "a new adapter", || {
        adapter_pid(&server).filter(|pid| *pid != first)
    })
    .await;
    wait_running(&mut client).await;
    let shown = view(&mut client, &run_id).await;
    assert!(
        shown["display"]["controls"]
            .as_array()
            .unwrap()
            .contains(&json!("recoverEffect")),
        "{shown}"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        telegram.calls("editMessageText").len(),
        1,
        "an ambiguous edit is not sent again on its own"
    );

    // The operator retries: a warning, the next numbered attempt, edited once more.
    let effect_id = settle_effect_id(&server, &run_id);
    let retried = server.cli(&[
        "channel",
        "recover",
        "retry",
        "ops",
        &format!("{effect_id}.1"),
    ]);
    assert!(retried.status.success(), "{retried:?}");
    let said = String::from_utf8_lossy(&retried.stdout).into_owned()
        + &String::from_utf8_lossy(&retried.stderr);
    assert!(said.contains("duplicate"), "{said}");
    let calls = telegram.wait_calls("editMessageText", 2, SETTLE_TIMEOUT);
    wait_settle_state(&server, &run_id, "applied").await;
    assert_eq!(settle_state(&server, &run_id), Some(("applied".into(), 2)));
    assert_eq!(
        attempts_of(&server, &effect_id),
        vec![(1, "ambiguous".into()), (2, "applied".into())]
    );
    let text = calls[1].body["text"].as_str().unwrap();
    assert!(text.contains("Decided: Revise (answered in Pi)"), "{text}");
    // The answer's text and who gave it are never shown in the channel.
    assert!(!telegram.all_bodies().contains("PRIVATE-FEEDBACK"));
    assert!(!telegram.all_bodies().contains("session-1"));
    // The older attempt cannot be recovered any more.
    let stale = server.cli(&[
        "channel",
        "recover",
        "confirm",
        "ops",
        &format!("{effect_id}.1"),
    ]);
    assert!(!stale.status.success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(telegram.calls("editMessageText").len(), 2);
    assert_consistent(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_adapter_epoch_cannot_settle_an_edit() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(
        &telegram,
        0o600,
        &[("PI_WORKFLOWS_ADAPTER_FAULT", "stale_epoch")],
    );
    let mut client = server.client().await;
    wait_running(&mut client).await;
    let (run_id, _, _) = presented(&mut client, &server, &telegram, 0).await;
    wait_send_state(&server, &run_id, "applied").await;
    let cli = server.cli(&["answer", &run_id, "approve"]);
    assert!(cli.status.success(), "{cli:?}");
    telegram.wait_calls("editMessageText", 1, SETTLE_TIMEOUT);
    let log = wait_for(SETTLE_TIMEOUT, "the refused settlement report", || {
        let log =
            std::fs::read_to_string(server.scratch().join("server.stderr")).unwrap_or_default();
        log.contains("an adapter message was refused: another channel adapter replaced this one")
            .then_some(log)
    })
    .await;
    assert!(!log.contains(TOKEN));
    // The report of an epoch the server does not run settles nothing.
    assert_eq!(settle_state(&server, &run_id), Some(("applying".into(), 1)));
}

const NEEDS_TEXT: &str = "this choice takes text: reply to the decision message with it (or answer in Pi with /workflow answer, or with pi-workflows answer)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_choice_that_takes_text_is_answered_by_replying_to_the_decision_message() {
    let telegram = FakeTelegram::start(TOKEN);
    let server = channel_server(&telegram, 0o600, &[]);
    let mut client = server.client().await;
    wait_running(&mut client).await;
    let (run_id, _, data) = presented(&mut client, &server, &telegram, 0).await;
    wait_send_state(&server, &run_id, "applied").await;
    let (_, message_id) = telegram.sent()[0];

    // A reply before any press, and a stranger's, answer nothing.
    telegram.reply(USER, CHAT, message_id, "too early");
    telegram.reply(STRANGER, CHAT, message_id, "not allowed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(decision_row(&server, &run_id).0, "pending");

    // Pressing the text choice asks for a reply; a text out of the choice's
    // bounds (at most 200 characters) is refused by the decision rules.
    let press = telegram.press(USER, CHAT, &data[1]);
    assert_eq!(wait_note(&telegram, &press).await, NEEDS_TEXT);
    telegram.reply(USER, CHAT, message_id, &"x".repeat(201));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(decision_row(&server, &run_id).0, "pending");

    // Pressed again, then replied: the choice with its text, from Telegram.
    let press = telegram.press(USER, CHAT, &data[1]);
    assert_eq!(wait_note(&telegram, &press).await, NEEDS_TEXT);
    let text = "PRIVATE-REPLY add the migration notes";
    telegram.reply(USER, CHAT, message_id, text);
    wait_for(SETTLE_TIMEOUT, "the answer", || {
        (decision_row(&server, &run_id).0 == "accepted").then_some(())
    })
    .await;
    assert_eq!(
        decision_row(&server, &run_id),
        (
            "accepted".into(),
            Some("telegram".into()),
            Some(USER.to_string())
        )
    );
    let answer: Vec<u8> = server
        .db()
        .query_row(
            "SELECT b.bytes FROM human_decisions d JOIN blobs b ON b.digest = d.answer_digest WHERE d.run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        answer,
        json!({"choice": "revise", "input": {"feedback": text}})
    );
    let child: String = server
        .db()
        .query_row(
            "SELECT run_id FROM runs WHERE continuation_of = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    let settled = support::wait_settled(&mut client, &child).await;
    assert_eq!(support::step_outcomes(&settled).last().unwrap().0, "rework");

    // The settled message names the choice, never the text.
    let edits = telegram.wait_calls("editMessageText", 1, SETTLE_TIMEOUT);
    let edited = edits[0].body["text"].as_str().unwrap();
    assert!(
        edited.contains("Decided: Revise (answered in Telegram)"),
        "{edited}"
    );
    assert!(!edited.contains("PRIVATE-REPLY"));
    // A second reply without a press answers nothing more.
    telegram.reply(USER, CHAT, message_id, "again");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        count(
            &server.db(),
            "SELECT COUNT(*) FROM runs WHERE continuation_of = ?1",
            [&run_id]
        ),
        1
    );
    let log = std::fs::read_to_string(server.scratch().join("server.stderr")).unwrap_or_default();
    assert!(
        !log.contains("PRIVATE-REPLY") && !log.contains(TOKEN),
        "{log}"
    );
    assert!(
        !channel_status(&mut client)
            .await
            .to_string()
            .contains("PRIVATE-REPLY")
    );
    assert_consistent(&server).await;
}

#[test]
fn the_adapter_source_uses_no_state_kernel_or_workflow_code() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin/telegram_adapter");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for forbidden in [
            "rusqlite",
            "server::",
            "kernel::",
            "state.sqlite",
            "PI_WORKFLOWS_HOME",
        ] {
            assert!(
                !text.contains(forbidden),
                "{} names {forbidden}: the adapter is transport-only",
                path.display()
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 2, "main.rs and http.rs");
}
