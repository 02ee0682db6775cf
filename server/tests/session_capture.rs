//! Session capture (`sessionEvents.record`) through the real socket: the
//! origin session's coordinator records a run's Pi events, numbered run-wide
//! from 1 without gaps; a repeat adopts, other content under a number
//! conflicts; bounds and authority refuse a batch whole; viewers page the
//! events (at most 256 rows a read) with the replay checkpoint after every
//! 256th event; and no captured event ever reaches a runner.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use serde_json::{Value, json};
use support::*;

const SESSION: &str = "session-capture";

/// Makes `client` the session's coordinator.
async fn coordinate(client: &mut Client) {
    let view = client
        .request(&RequestSpec::read(
            "sessionView.get",
            None,
            json!({ "sessionId": SESSION, "coordinate": true }),
        ))
        .await
        .unwrap();
    assert!(
        view.receipt.as_ref().unwrap()["coordinatorEpoch"].is_u64(),
        "{:?}",
        view.frame
    );
}

/// Events `from..=to`: a turn, a message, a tool, and assistant deltas.
fn events(from: u64, to: u64, marker: &str) -> Vec<Value> {
    (from..=to)
        .map(|seq| {
            let event_type = match seq {
                1 => "turn_started",
                2 => "message_started",
                3 => "tool_execution_started",
                _ => "assistant_event",
            };
            json!({"seq": seq, "type": event_type, "data": {"delta": format!("{marker} {seq}")}})
        })
        .collect()
}

async fn record(client: &mut Client, run_id: &str, session: &str, events: Vec<Value>) -> Response {
    client
        .request(&RequestSpec::read(
            "sessionEvents.record",
            None,
            json!({ "sessionId": session, "runId": run_id, "events": events }),
        ))
        .await
        .unwrap()
}

fn accepted(response: &Response) -> u64 {
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.as_ref().unwrap()["accepted"]
        .as_u64()
        .unwrap()
}

fn code(response: &Response) -> String {
    response.frame["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn stored(server: &TestServer, run_id: &str) -> i64 {
    count(
        &server.db(),
        "SELECT COUNT(*) FROM session_events WHERE run_id = ?1",
        [run_id],
    )
}

async fn page(client: &mut Client, run_id: &str, cursor: Option<&str>, limit: u64) -> Value {
    let view = support::view(client, run_id).await;
    let mut payload = json!({ "collection": "sessionEvents", "limit": limit, "maxBytes": 524288,
                              "revision": view["revision"] });
    if let Some(cursor) = cursor {
        payload["cursor"] = json!(cursor);
    }
    let response = client
        .request(&RequestSpec::read("view.page", Some(run_id), payload))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{}", response.frame);
    response.receipt.unwrap()
}

/// Numbers from 1 without gaps; a repeated batch adopts with the same count
/// and stores nothing twice; other content under a stored number conflicts
/// and a gap is refused, both storing nothing; viewers page at most 256 rows
/// a read, and the page after event 256 names the replay checkpoint written
/// there (the open tool execution, the open turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_numbered_adopted_on_repeat_and_paged_with_replay_checkpoints() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let run_id =
        started_interactive(&mut client, &script("checkpoint.json"), SESSION, json!({})).await;
    assert_eq!(status(&wait_settled(&mut client, &run_id).await), "waiting");
    coordinate(&mut client).await;

    let first = events(1, 256, "delta");
    assert_eq!(
        accepted(&record(&mut client, &run_id, SESSION, first.clone()).await),
        256
    );
    assert_eq!(
        accepted(&record(&mut client, &run_id, SESSION, first.clone()).await),
        256,
        "a repeat adopts"
    );
    assert_eq!(stored(&server, &run_id), 256, "nothing twice");

    let mut changed = events(250, 260, "delta");
    changed[0]["data"] = json!({"delta": "something else"});
    let conflict = record(&mut client, &run_id, SESSION, changed).await;
    assert_eq!(
        (conflict.outcome.as_str(), code(&conflict).as_str()),
        ("rejected", "conflict")
    );
    let gap = record(&mut client, &run_id, SESSION, events(300, 301, "delta")).await;
    assert_eq!(code(&gap), "illegalTransition", "{:?}", gap.frame);
    assert_eq!(
        stored(&server, &run_id),
        256,
        "a refused batch stores nothing"
    );

    // A retry that overlaps and goes on adopts its stored part.
    assert_eq!(
        accepted(&record(&mut client, &run_id, SESSION, events(250, 300, "delta")).await),
        51
    );
    assert_eq!(stored(&server, &run_id), 300);

    let head = page(&mut client, &run_id, None, 1000).await;
    let items = head["items"].as_array().unwrap();
    assert_eq!(items.len(), 256, "at most 256 rows a read");
    assert_eq!(
        items[0],
        json!({"seq": 1, "type": "turn_started", "data": {"delta": "delta 1"}})
    );
    assert_eq!(items[255]["seq"], 256);
    assert_eq!(head["nextCursor"], "256");
    assert!(
        head.get("checkpoint").is_none(),
        "no checkpoint before event 256"
    );
    let tail = page(&mut client, &run_id, Some("256"), 1000).await;
    let items = tail["items"].as_array().unwrap();
    assert_eq!(
        items
            .iter()
            .map(|item| item["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        (257..=300).collect::<Vec<_>>()
    );
    assert!(tail.get("nextCursor").is_none());
    let checkpoint = client
        .read_content(&run_id, &tail["checkpoint"])
        .await
        .expect("the checkpoint content");
    let checkpoint: Value = serde_json::from_slice(&checkpoint).unwrap();
    assert_eq!(
        checkpoint,
        json!({"throughSeq": 256, "turnOpen": true, "openMessages": [2], "openTools": [3], "truncated": false})
    );
    support::wait_quiescent(&server.db()).await;
    assert_eq!(
        support::consistency_violations(&server.db()),
        Vec::<String>::new()
    );
}

/// Only the connection that owns the origin session's active coordinator
/// epoch records; a batch outside the bounds is refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_origin_sessions_coordinator_records_within_the_bounds() {
    let server = TestServer::start();
    let mut client = server.client().await;
    let run_id =
        started_interactive(&mut client, &script("checkpoint.json"), SESSION, json!({})).await;
    assert_eq!(status(&wait_settled(&mut client, &run_id).await), "waiting");

    let uncoordinated = record(&mut client, &run_id, SESSION, events(1, 1, "x")).await;
    assert_eq!(
        (
            uncoordinated.outcome.as_str(),
            code(&uncoordinated).as_str()
        ),
        ("claimLost", "claimLost")
    );
    coordinate(&mut client).await;
    let elsewhere = record(&mut client, &run_id, "another-session", events(1, 1, "x")).await;
    assert_eq!(code(&elsewhere), "noOriginSession");
    let mut other = server.client().await;
    let fenced_out = record(&mut other, &run_id, SESSION, events(1, 1, "x")).await;
    assert_eq!(
        code(&fenced_out),
        "claimLost",
        "not the coordinator's connection"
    );

    let too_many = record(&mut client, &run_id, SESSION, events(1, 257, "x")).await;
    assert_eq!(code(&too_many), "schemaInvalid");
    let mut large = events(1, 2, "x");
    large[1]["data"] = json!({"delta": "y".repeat(64 * 1024)});
    let too_large = record(&mut client, &run_id, SESSION, large).await;
    assert_eq!(code(&too_large), "schemaInvalid");
    assert_eq!(stored(&server, &run_id), 0, "nothing was stored");

    // A new coordinator connection takes over; the old one is refused.
    coordinate(&mut other).await;
    let replaced = record(&mut client, &run_id, SESSION, events(1, 1, "x")).await;
    assert_eq!(code(&replaced), "claimLost");
    assert_eq!(
        accepted(&record(&mut other, &run_id, SESSION, events(1, 2, "x")).await),
        2
    );
}

/// Events captured while a checkpoint run waits never reach a runner: the
/// continuation's runner receives its command state without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_events_never_reach_a_runner() {
    const MARKER: &str = "captured-marker-7f3a";
    let server = TestServer::start();
    let mut script: Value =
        serde_json::from_str(&std::fs::read_to_string(script("checkpoint.json")).unwrap()).unwrap();
    script["startup"] = json!({"recordState": "state.json"});
    let path = write_script(server.scratch(), "recorded.json", &script);
    let mut client = server.client().await;
    let parent = started_interactive(&mut client, &path, SESSION, json!({})).await;
    assert_eq!(status(&wait_settled(&mut client, &parent).await), "waiting");
    coordinate(&mut client).await;
    assert_eq!(
        accepted(&record(&mut client, &parent, SESSION, events(1, 40, MARKER)).await),
        40
    );

    let state_file = server.scratch().join("state.json");
    let _ = std::fs::remove_file(&state_file);
    let answered = client
        .request(&RequestSpec::command(
            "checkpoint.answer",
            Some(&parent),
            json!({ "answer": { "approved": true } }),
        ))
        .await
        .unwrap();
    assert_eq!(answered.outcome, "accepted", "{:?}", answered.frame);
    let child = answered.receipt.unwrap()["continuationRunId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        status(&wait_settled(&mut client, &child).await),
        "completed"
    );
    let recorded = std::fs::read_to_string(&state_file).expect("the continuation's command state");
    let state: Value = serde_json::from_str(&recorded).unwrap();
    assert_eq!(
        state["resultOrder"],
        json!(["draft", "review"]),
        "the continuation's state carries its parent's results: {recorded}"
    );
    assert!(
        !recorded.contains(MARKER),
        "a captured event reached the runner: {recorded}"
    );
    let blobs = count(
        &server.db(),
        "SELECT COUNT(*) FROM blobs WHERE CAST(bytes AS TEXT) LIKE '%' || ?1 || '%'",
        [MARKER],
    );
    assert_eq!(
        blobs, 0,
        "no blob (result, state or message) holds a captured event"
    );
}
