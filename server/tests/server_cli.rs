//! The server CLI and lifecycle: `server start | stop | status [--json]`,
//! status privacy, draining on stop, and the idle exit.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::process::Output;
use std::time::{Duration, Instant};
use support::*;

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A server started detached by `pi-workflows server start`; `server stop`
/// when dropped.
struct Detached<'a> {
    server: &'a TestServer,
}

impl<'a> Detached<'a> {
    fn start(server: &'a TestServer) -> Self {
        let started = server.cli(&["server", "start"]);
        assert!(started.status.success(), "server start: {}", text(&started));
        assert!(
            text(&started).contains("started (epoch"),
            "{}",
            text(&started)
        );
        Self { server }
    }
}

impl Drop for Detached<'_> {
    fn drop(&mut self) {
        let _ = self.server.cli(&["server", "stop"]);
    }
}

/// The fields `server status --json` documents (the seed's Status and
/// privacy list, and `ServerStatus` in docs/PROTOCOL.md), plus `state`.
const STATUS_FIELDS: [&str; 11] = [
    "state",
    "serverEpoch",
    "socketAvailable",
    "activeRunners",
    "queued",
    "running",
    "parked",
    "waiting",
    "expiredClaims",
    "pendingInteractions",
    "ambiguousEffects",
];

/// Recognizable private values seeded into durable state: a token, a
/// prompt, a session id, a path, inputs, outputs, update data and an error
/// message. None may appear in status output (text, JSON, the socket read)
/// or in the server log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_only_counts_and_leaks_no_private_value() {
    const TOKEN: &str = "tok-PRIVATE-TOKEN-7731";
    const PROMPT: &str = "PRIVATE-PROMPT-4409 write the summary";
    const SESSION: &str = "sess-PRIVATE-SESSION-5521";
    const PATH_PART: &str = "PRIVATE-PATH-8812";
    const INPUT: &str = "PRIVATE-INPUT-1207";
    const OUTPUT: &str = "PRIVATE-OUTPUT-3390";
    const UPDATE: &str = "PRIVATE-UPDATE-6618";
    const ERROR: &str = "PRIVATE-ERROR-9044";
    let markers = [
        TOKEN, PROMPT, SESSION, PATH_PART, INPUT, OUTPUT, UPDATE, ERROR,
    ];

    let server = TestServer::new(&[]);
    let project = server.scratch().join(PATH_PART);
    std::fs::create_dir_all(&project).unwrap();
    let interactive = write_script(
        &project,
        "interactive.json",
        &json!({
            "workflowName": "interactive",
            "topology": linear_topology(&["draft", "ask"]),
            "nodes": {
                "draft": [{"update": {"type": "progress", "key": "k", "data": {"note": UPDATE}},
                           "then": {"finish": {"result": OUTPUT}}}],
                "ask": [{"interact": {"prompt": PROMPT, "contract": {"secret": TOKEN}}}]
            }
        }),
    );
    let failing = write_script(
        &project,
        "failing.json",
        &json!({
            "workflowName": "failing",
            "topology": linear_topology(&["x"]),
            "nodes": {"x": [{"fail": ERROR}]}
        }),
    );
    let _detached = Detached::start(&server);
    let mut client = server.client().await;
    let project_path = project.to_string_lossy().into_owned();
    let start = |workflow: &std::path::Path, mode: Value| {
        let mut payload = json!({
            "workflow": workflow.to_string_lossy(),
            "input": {"apiToken": TOKEN, "note": INPUT},
            "projectPath": project_path,
        });
        payload
            .as_object_mut()
            .unwrap()
            .extend(mode.as_object().unwrap().clone());
        RequestSpec::command("run.start", None, payload)
    };
    let waiting = client
        .request(&start(
            &interactive,
            json!({"executionMode": "interactive", "originSessionId": SESSION}),
        ))
        .await
        .unwrap();
    assert_eq!(waiting.outcome, "accepted", "{:?}", waiting.frame);
    let waiting = waiting.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let failed = client
        .request(&start(&failing, json!({"executionMode": "headless"})))
        .await
        .unwrap();
    assert_eq!(failed.outcome, "accepted", "{:?}", failed.frame);
    let failed = failed.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    let view = wait_settled(&mut client, &waiting).await;
    assert_eq!(status(&view), "waiting", "{view}");
    assert_eq!(status(&wait_settled(&mut client, &failed).await), "failed");

    // The private values really are in durable state.
    let db = server.db();
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM interactive_requests WHERE status = 'pending' AND target_session_id = ?1",
            [SESSION],
        ),
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM blobs WHERE CAST(bytes AS TEXT) LIKE '%' || ?1 || '%'",
            [PROMPT],
        ),
        1,
        "the prompt is stored"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM runs WHERE error_message LIKE '%' || ?1 || '%'",
            [ERROR],
        ),
        1
    );

    let human = server.cli(&["server", "status"]);
    let machine = server.cli(&["server", "status", "--json"]);
    assert!(human.status.success(), "{}", text(&human));
    assert!(machine.status.success(), "{}", text(&machine));
    let socket = client
        .request(&RequestSpec::read("server.status", None, json!({})))
        .await
        .unwrap();
    let log =
        std::fs::read_to_string(server.home.join("host").join("server.log")).unwrap_or_default();
    let home = server.home.to_string_lossy().into_owned();
    for (what, output) in [
        ("server status", text(&human)),
        ("server status --json", text(&machine)),
        ("server.status", socket.frame.to_string()),
        ("host/server.log", log.clone()),
    ] {
        for marker in markers.iter().chain([&home.as_str()]) {
            assert!(
                !output.contains(marker),
                "{what} shows {marker:?}: {output}"
            );
        }
        assert!(
            !output.contains(&waiting) && !output.contains(&failed),
            "{what} shows a run id"
        );
    }

    // Exactly the documented fields, with the counts of this state.
    let status: Value = serde_json::from_slice(&machine.stdout).unwrap();
    let fields: BTreeSet<&str> = status
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        STATUS_FIELDS.into_iter().collect::<BTreeSet<_>>(),
        "{status}"
    );
    assert_eq!(status["state"], "running");
    assert_eq!(status["socketAvailable"], true);
    assert!(status["serverEpoch"].as_u64().unwrap() >= 1);
    assert_eq!(status["waiting"], 1, "{status}");
    assert_eq!(status["pendingInteractions"], 1, "{status}");
    for zero in [
        "queued",
        "running",
        "parked",
        "expiredClaims",
        "ambiguousEffects",
    ] {
        assert_eq!(status[zero], 0, "{zero}: {status}");
    }
    let receipt = socket.receipt.unwrap();
    let socket_fields: BTreeSet<&str> = receipt
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected: BTreeSet<&str> = STATUS_FIELDS.into_iter().collect();
    expected.remove("state");
    assert_eq!(socket_fields, expected, "{receipt}");
    // The human form: one header line and one line per documented count.
    let lines: Vec<String> = String::from_utf8_lossy(&human.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert!(
        lines[0].starts_with("pi-workflows server: running (epoch "),
        "{lines:?}"
    );
    let labels: Vec<String> = lines[1..]
        .iter()
        .map(|line| line.trim().rsplit_once(' ').unwrap().0.trim().to_owned())
        .collect();
    assert_eq!(
        labels,
        [
            "socket",
            "active runners",
            "runs queued",
            "runs running",
            "runs parked",
            "runs waiting",
            "expired claims",
            "pending interactions",
            "ambiguous effects"
        ],
        "{lines:?}"
    );
}

/// `server start` runs a detached server that `server status` sees (and a
/// second `start` finds), and `server stop` stops it: status then reports
/// it stopped (exit 3) and the socket is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_start_runs_a_detached_server_that_status_sees_and_stop_stops() {
    let server = TestServer::new(&[]);
    let stopped = server.cli(&["server", "status", "--json"]);
    assert_eq!(stopped.status.code(), Some(3), "{}", text(&stopped));
    let detached = Detached::start(&server);
    let status = server.cli(&["server", "status", "--json"]);
    assert!(status.status.success(), "{}", text(&status));
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["state"], "running");
    assert_eq!(status["socketAvailable"], true);
    let again = server.cli(&["server", "start"]);
    assert!(again.status.success());
    assert!(text(&again).contains("already running"), "{}", text(&again));
    // A run works through the detached server.
    let mut client = server.client().await;
    let run_id = started(&mut client, &script("linear.json")).await;
    assert_eq!(status_of(&mut client, &run_id).await, "completed");
    drop(client);

    let stop = server.cli(&["server", "stop"]);
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(text(&stop).contains("stopped"), "{}", text(&stop));
    std::mem::forget(detached);
    let after = server.cli(&["server", "status", "--json"]);
    assert_eq!(after.status.code(), Some(3), "{}", text(&after));
    let after: Value = serde_json::from_slice(&after.stdout).unwrap();
    assert_eq!(after, json!({"state": "stopped", "socketAvailable": false}));
    assert!(!server.socket().exists(), "the socket file is removed");
}

/// `server stop` while another client brings a server back at once (the Pi
/// extension starts one when its connection drops): the stop reports that
/// the server it asked stopped, and names the new one, instead of waiting
/// for no server at all and failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stop_succeeds_when_a_client_starts_a_new_server_at_once() {
    let server = TestServer::new(&[]);
    let detached = Detached::start(&server);
    let epoch_of = |server: &TestServer| -> u64 {
        let status = server.cli(&["server", "status", "--json"]);
        assert!(status.status.success(), "{}", text(&status));
        let status: Value = serde_json::from_slice(&status.stdout).unwrap();
        status["serverEpoch"].as_u64().expect("an epoch")
    };
    let first = epoch_of(&server);
    // The restarting client: as soon as the socket is gone, start a server
    // (retrying while the old one still holds the lock).
    let restarter = std::thread::spawn({
        let socket = server.socket();
        let mut start = server.command();
        start.args(["server", "start"]);
        move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while socket.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            while Instant::now() < deadline {
                let started = start.output().unwrap();
                if text(&started).contains("started (epoch") {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("no server started again");
        }
    });
    let stop = server.cli(&["server", "stop"]);
    restarter.join().unwrap();
    assert!(stop.status.success(), "{}", text(&stop));
    let second = epoch_of(&server);
    assert_ne!(first, second, "a new server runs");
    assert!(
        text(&stop).contains("stopped") && text(&stop).contains(&format!("(epoch {first})")),
        "{}",
        text(&stop)
    );
    drop(detached);
}

async fn status_of(client: &mut Client, run_id: &str) -> String {
    status(&wait_settled(client, run_id).await).to_owned()
}

/// `server stop` while a `run.start` is in flight (its workflow resolution
/// takes 1.5 s in the resolver child): the stop waits until the command
/// stored its receipt and answered, so the client gets `accepted` with a
/// receipt, the receipt is durable, and a retry after a restart adopts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stop_waits_for_an_in_flight_run_start_to_store_its_receipt() {
    let mut server = TestServer::new(&[]);
    let slow = write_script(
        server.scratch(),
        "slow-resolve.json",
        &json!({"workflowName": "slow-resolve", "topology": linear_topology(&["a"]), "resolveDelayMs": 1500}),
    );
    server.spawn().expect("the server starts");
    let mut client = server.client().await;
    let client_id = client.client_id().to_owned();
    let spec = RequestSpec::command(
        "run.start",
        None,
        json!({ "workflow": slow.to_string_lossy(), "input": {}, "executionMode": "headless", "projectPath": "/tmp" }),
    );
    let in_flight = {
        let spec = spec.clone();
        tokio::spawn(async move {
            let response = request_as(&mut client, &spec, &fresh_request_id()).await;
            (client, response)
        })
    };
    // The resolver child is running.
    let logs = server.home.join("host").join("logs");
    wait_for(Duration::from_secs(5), "the resolver to start", || {
        std::fs::read_dir(&logs)
            .ok()?
            .filter_map(Result::ok)
            .any(|entry| entry.file_name().to_string_lossy().starts_with("resolve-"))
            .then_some(())
    })
    .await;
    let stop_started = Instant::now();
    let stop = tokio::task::spawn_blocking({
        let mut command = server.command();
        move || command.args(["server", "stop"]).output().unwrap()
    })
    .await
    .unwrap();
    assert!(stop.status.success(), "{}", text(&stop));
    let (_, response) = in_flight.await.unwrap();
    eprintln!("stop took {:?}", stop_started.elapsed());
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    let receipt = response.receipt.expect("a receipt");
    assert!(server.wait_exit(Duration::from_secs(10)));
    let stored = count(
        &server.db(),
        "SELECT COUNT(*) FROM host_commands WHERE client_id = ?1 AND idempotency_key = ?2",
        rusqlite::params![client_id, spec.idempotency_key.as_deref().unwrap()],
    );
    assert_eq!(stored, 1, "the receipt was stored before the server exited");
    server.spawn().expect("the server restarts");
    let mut again = Client::connect(&server.socket(), &client_id).await.unwrap();
    let retry = request_as(&mut again, &spec, &fresh_request_id()).await;
    assert_eq!(retry.outcome, "adopted");
    assert_eq!(retry.receipt, Some(receipt));
}

/// With `PI_WORKFLOWS_IDLE_EXIT_MS` small, a server with no client, runner
/// or work exits by itself (releasing its socket); one with a connected
/// client stays until the client leaves; one with a run in progress stays
/// until the run ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_exits_when_idle_and_stays_while_a_client_or_a_run_needs_it() {
    let idle = [("PI_WORKFLOWS_IDLE_EXIT_MS", "500")];

    // Nothing to do: it exits on its own.
    let mut lonely = TestServer::start_with(&idle);
    assert!(
        lonely.wait_exit(Duration::from_secs(5)),
        "an idle server did not exit"
    );
    assert!(
        !lonely.socket().exists(),
        "the socket is removed on the idle exit"
    );

    // A connected client keeps it alive; it exits after the client leaves.
    let mut watched = TestServer::start_with(&idle);
    let client = watched.client().await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        watched.is_running(),
        "the server exited while a client was connected"
    );
    drop(client);
    assert!(
        watched.wait_exit(Duration::from_secs(5)),
        "it did not exit after the client left"
    );

    // A run in progress keeps it alive after its client left.
    let mut busy = TestServer::start_with(&idle);
    let script = write_script(
        busy.scratch(),
        "two-seconds.json",
        &json!({"workflowName": "two-seconds", "topology": linear_topology(&["a"]),
                "nodes": {"a": [{"sleepMs": 2000}]}}),
    );
    let run_id = {
        let mut client = busy.client().await;
        started(&mut client, &script).await
    };
    let started_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        busy.is_running(),
        "the server exited with a run in progress"
    );
    assert!(
        busy.wait_exit(Duration::from_secs(10)),
        "it did not exit after the run ended"
    );
    assert!(started_at.elapsed() >= Duration::from_millis(2000));
    let status: String = busy
        .db()
        .query_row(
            "SELECT status FROM runs WHERE run_id = ?1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(status, "completed", "the run finished before the idle exit");
}
