//! Live run views, revisions and subscriptions against a real server: views
//! never mix revisions, stale cursors get snapshots, slow subscribers are
//! coalesced with bounded memory, every subscription kind unsubscribes,
//! generated content is digest-verified and recovers more than 256 steps.

mod support;

use pi_workflows_client::LiveView;
use pi_workflows_client::{ClientError, Connection as Client, ContentFailure, RequestSpec};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{
    TestServer, count, loop_script, session_view, started, status, wait_for, wait_settled,
    write_script,
};

/// Why a view is not one coherent revision of `run_id` (empty when it is).
/// Every fact it compares is written in one transaction, so a view built
/// from two reads (or a patch applied to the wrong base) shows up here.
fn incoherence(view: &Value, run_id: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let bytes = protocol::canonicalize(view).unwrap_or_default();
    if let Err(error) = protocol::decode_run_view(&bytes) {
        problems.push(format!("not a valid run view: {error}"));
    }
    problems.extend(mixed_revisions(view, run_id));
    problems
}

/// The structural half of [`incoherence`].
fn mixed_revisions(view: &Value, run_id: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if view["runId"] != run_id {
        problems.push(format!("names run {} instead of {run_id}", view["runId"]));
    }
    let steps = view["steps"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let total = view["steps"]["total"].as_u64().unwrap_or(0) as usize;
    if total <= 256 && steps.len() != total {
        problems.push(format!("{} inline steps but total {total}", steps.len()));
    }
    for node in view["nodes"].as_array().into_iter().flatten() {
        let id = node["id"].as_str().unwrap_or_default();
        let visits = steps.iter().filter(|step| step["nodeId"] == id).count();
        if total <= 256 && node["visits"].as_u64() != Some(visits as u64) {
            problems.push(format!(
                "node {id} shows {} visits, steps show {visits}",
                node["visits"]
            ));
        }
        let open = steps
            .iter()
            .rev()
            .find(|step| step["nodeId"] == id)
            .is_some_and(|step| step.get("finishedAtMs").is_none());
        let running = node["state"] == "running";
        if total <= 256 && running != open {
            problems.push(format!(
                "node {id} is {} but its last step open={open}",
                node["state"]
            ));
        }
    }
    if let Some(current) = view["display"]["currentNode"].as_str() {
        let state = view["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|node| node["id"] == current))
            .map(|node| node["state"].clone());
        if !matches!(
            state.as_ref().and_then(Value::as_str),
            Some("running" | "waiting")
        ) {
            problems.push(format!("display runs {current} but the node is {state:?}"));
        }
    }
    let terminal = matches!(
        view["status"]["run"].as_str(),
        Some("completed" | "failed" | "cancelled")
    );
    if terminal
        != matches!(
            status(view),
            "completed" | "failed" | "timed_out" | "cancelled"
        )
    {
        problems.push(format!(
            "run status {} but display {}",
            view["status"]["run"],
            status(view)
        ));
    }
    problems
}

/// The JSON pointers where two documents differ (at most a few), so a
/// failure names the difference instead of printing two whole views.
fn differences(left: &Value, right: &Value) -> Vec<String> {
    fn walk(path: String, left: &Value, right: &Value, out: &mut Vec<String>) {
        if out.len() >= 8 || left == right {
            return;
        }
        match (left, right) {
            (Value::Object(a), Value::Object(b)) => {
                for key in a.keys().chain(b.keys().filter(|key| !a.contains_key(*key))) {
                    walk(
                        format!("{path}/{key}"),
                        a.get(key).unwrap_or(&Value::Null),
                        b.get(key).unwrap_or(&Value::Null),
                        out,
                    );
                }
            }
            (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
                for (index, (x, y)) in a.iter().zip(b).enumerate() {
                    walk(format!("{path}/{index}"), x, y, out);
                }
            }
            _ => out.push(format!("{path}: {} vs {}", short(left), short(right))),
        }
    }
    fn short(value: &Value) -> String {
        value.to_string().chars().take(120).collect()
    }
    let mut out = Vec::new();
    walk(String::new(), left, right, &mut out);
    out
}

/// Follows `run_id` until terminal, returning the view at every revision.
async fn record_revisions(client: &mut Client, run_id: &str) -> BTreeMap<u64, Value> {
    let response = client
        .subscribe(json!({ "kind": "run", "runId": run_id }), None)
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{}", response.frame);
    let subscription = response.receipt.unwrap()["subscriptionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut live = LiveView::new();
    let mut seen = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let frame = tokio::time::timeout_at(deadline.into(), client.next_event())
            .await
            .expect("events in time")
            .unwrap();
        if frame["subscriptionId"] != subscription.as_str() {
            continue;
        }
        live.apply(&frame["event"])
            .unwrap_or_else(|error| panic!("{error:?} applying {}", frame["event"]));
        let view = live.view().unwrap().clone();
        let revision = live.revision().unwrap();
        assert_eq!(
            frame["revision"], revision,
            "the frame's revision is the view's"
        );
        if let Some((&last, _)) = seen.last_key_value() {
            assert!(
                revision > last,
                "revisions only grow: {last} then {revision}"
            );
        }
        let settled = settled(&view);
        seen.insert(revision, view);
        if settled {
            return seen;
        }
    }
}

/// Terminal, and its runner is gone (the last revision the run makes).
fn settled(view: &Value) -> bool {
    matches!(status(view), "completed" | "failed" | "cancelled")
        && view["display"]["activity"] == "none"
}

/// Takes fresh snapshots of `run_id` until it is terminal.
async fn record_snapshots(client: &mut Client, run_id: &str) -> BTreeMap<u64, Value> {
    let mut seen = BTreeMap::new();
    loop {
        let response = client
            .request(&RequestSpec::read("run.view", Some(run_id), json!({})))
            .await
            .unwrap();
        let view = response.receipt.unwrap();
        let revision = view["revision"].as_u64().unwrap();
        let settled = settled(&view);
        seen.insert(revision, view);
        if settled {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_runs_never_yield_a_view_that_mixes_revisions_or_names_another_run() {
    let server = TestServer::start_with(&[("PI_WORKFLOWS_MAX_WORKERS", "4")]);
    let dir = tempfile::tempdir().unwrap();
    let script = loop_script(dir.path(), "loop.json", 25, Some(64));
    let mut starter = server.client().await;
    let mut run_ids = Vec::new();
    for _ in 0..4 {
        run_ids.push(started(&mut starter, &script).await);
    }
    let mut tasks = Vec::new();
    for run_id in &run_ids {
        let (mut follower, mut snapshotter) = (server.client().await, server.client().await);
        let (a, b) = (run_id.clone(), run_id.clone());
        tasks.push(tokio::spawn(async move {
            (a.clone(), record_revisions(&mut follower, &a).await)
        }));
        tasks.push(tokio::spawn(async move {
            (b.clone(), record_snapshots(&mut snapshotter, &b).await)
        }));
    }
    let mut by_run: BTreeMap<String, Vec<BTreeMap<u64, Value>>> = BTreeMap::new();
    for task in tasks {
        let (run_id, views) = task.await.unwrap();
        by_run.entry(run_id).or_default().push(views);
    }
    for (run_id, recordings) in &by_run {
        let (patched, snapshots) = (&recordings[0], &recordings[1]);
        assert!(
            patched.len() > 20,
            "{run_id}: the follower saw {} revisions",
            patched.len()
        );
        for (revision, view) in patched.iter().chain(snapshots.iter()) {
            let problems = incoherence(view, run_id);
            assert!(
                problems.is_empty(),
                "{run_id} revision {revision}: {problems:?}"
            );
        }
        // A snapshot taken at revision N while the run moved equals the
        // follower's snapshot-plus-patches view at N.
        let mut compared = 0;
        for (revision, snapshot) in snapshots {
            if let Some(view) = patched.get(revision) {
                let differ = differences(view, snapshot);
                assert!(
                    differ.is_empty(),
                    "{run_id}: patched and snapshot views differ at revision {revision}: {differ:?}"
                );
                compared += 1;
            }
        }
        assert!(
            compared >= 2,
            "{run_id}: only {compared} revisions compared"
        );
    }
}

#[test]
fn the_coherence_check_catches_a_view_assembled_from_two_revisions() {
    // A coherent view, then the same view with parts of the next revision
    // (what a view built from two reads, or a patch on the wrong base, shows).
    let before = json!({
        "runId": "r", "status": { "run": "running" }, "display": { "status": "running", "currentNode": "work" },
        "nodes": [{ "id": "start", "state": "completed", "visits": 1 }, { "id": "work", "state": "running", "visits": 1 }],
        "steps": { "items": [{ "nodeId": "start", "finishedAtMs": 2 }, { "nodeId": "work" }], "total": 2 },
    });
    assert!(
        mixed_revisions(&before, "r").is_empty(),
        "{:?}",
        mixed_revisions(&before, "r")
    );
    let mut mixed = before.clone();
    mixed["steps"] = json!({ "items": [{ "nodeId": "start", "finishedAtMs": 2 }, { "nodeId": "work", "finishedAtMs": 3 }], "total": 2 });
    assert!(!mixed_revisions(&mixed, "r").is_empty());
    let mut mixed = before.clone();
    mixed["steps"]["total"] = json!(3);
    assert!(!mixed_revisions(&mixed, "r").is_empty());
    let mut mixed = before.clone();
    mixed["status"]["run"] = json!("completed");
    assert!(!mixed_revisions(&mixed, "r").is_empty());
    assert!(!mixed_revisions(&before, "other").is_empty());
}

/// Subscribes from `from`, returns the first event and unsubscribes.
async fn first_event(client: &mut Client, run_id: &str, from: Option<u64>) -> Value {
    let response = client
        .subscribe(json!({ "kind": "run", "runId": run_id }), from)
        .await
        .unwrap();
    let id = response.receipt.unwrap()["subscriptionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let frame = client.next_event().await.unwrap();
    assert_eq!(frame["subscriptionId"], id.as_str());
    let unsubscribe = RequestSpec::read("unsubscribe", None, json!({ "subscriptionId": id }));
    assert_eq!(
        client.request(&unsubscribe).await.unwrap().outcome,
        "accepted"
    );
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_cursor_gets_a_snapshot_and_a_retained_one_gets_the_missing_patches() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut client = server.client().await;
    let run_id = started(
        &mut client,
        &loop_script(dir.path(), "loop.json", 150, None),
    )
    .await;
    let mut follower = server.client().await;
    let views = record_revisions(&mut follower, &run_id).await;
    let (&last, final_view) = views.last_key_value().unwrap();
    assert!(
        last > 300,
        "the run made {last} revisions, more than the 256 retained"
    );

    // Older than the retained floor: one bounded snapshot.
    let stale = first_event(&mut client, &run_id, Some(1)).await;
    assert_eq!(stale["event"]["kind"], "runViewSnapshot");
    assert!(
        differences(&stale["event"]["view"], final_view).is_empty(),
        "{:?}",
        differences(&stale["event"]["view"], final_view)
    );
    // Ahead of the server (a cursor from another database): a snapshot too.
    let ahead = first_event(&mut client, &run_id, Some(last + 10)).await;
    assert_eq!(ahead["event"]["kind"], "runViewSnapshot");
    // Retained: the patches after the cursor, which rebuild the final view.
    let base = *views.range(..=last - 40).next_back().unwrap().0;
    let resumed = first_event(&mut client, &run_id, Some(base)).await;
    assert_eq!(resumed["event"]["kind"], "runViewPatch");
    assert_eq!(resumed["event"]["baseRevision"], base);
    let mut live = LiveView::new();
    live.apply(&json!({ "kind": "runViewSnapshot", "view": views[&base] }))
        .unwrap();
    live.apply(&resumed["event"]).unwrap();
    assert!(
        differences(live.view().unwrap(), final_view).is_empty(),
        "{:?}",
        differences(live.view().unwrap(), final_view)
    );
    // Current: nothing to send until the next change; the subscription is live.
    let response = client
        .subscribe(json!({ "kind": "run", "runId": run_id }), Some(last))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), client.next_event())
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_256_graph_steps_are_recovered_through_content_references_and_pages() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut client = server.client().await;
    let run_id = started(
        &mut client,
        &loop_script(dir.path(), "loop.json", 150, None),
    )
    .await;
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{view}");
    let steps = &view["steps"];
    assert_eq!(steps["total"], 302);
    assert_eq!(steps["items"].as_array().unwrap().len(), 256);
    assert_eq!(steps["nextCursor"], "256");

    let history = client
        .read_content(&run_id, &view["graphHistory"])
        .await
        .unwrap();
    let history: Vec<Value> = serde_json::from_slice(&history).unwrap();
    assert_eq!(history.len(), 302);
    assert!(
        history[..256] == *steps["items"].as_array().unwrap().as_slice(),
        "the first 256 steps are the inline ones"
    );
    let visits = |node: &str| history.iter().filter(|step| step["nodeId"] == node).count();
    assert_eq!(
        (
            visits("start"),
            visits("work"),
            visits("check"),
            visits("done")
        ),
        (1, 150, 150, 1)
    );
    assert_eq!(history.last().unwrap()["nodeId"], "done");

    // The same steps through pages (an item limit and a byte budget).
    let mut paged: Vec<Value> = steps["items"].as_array().unwrap().clone();
    let mut cursor = steps["nextCursor"].as_str().map(str::to_owned);
    while let Some(next) = cursor {
        let response = client
            .request(&RequestSpec::read(
                "view.page",
                Some(&run_id),
                json!({ "collection": "steps", "cursor": next, "limit": 20, "maxBytes": 4096, "revision": view["revision"] }),
            ))
            .await
            .unwrap();
        assert_eq!(response.outcome, "accepted", "{}", response.frame);
        let page = response.receipt.unwrap();
        assert_eq!(page["cursor"], next.as_str(), "the page echoes its cursor");
        let items = page["items"].as_array().unwrap();
        assert!(!items.is_empty() && items.len() <= 20);
        paged.extend(items.iter().cloned());
        cursor = page["nextCursor"].as_str().map(str::to_owned);
    }
    assert!(
        paged == history,
        "the pages hold the same {} steps",
        history.len()
    );

    let definition = client
        .read_content(&run_id, &view["definition"])
        .await
        .unwrap();
    let definition: Value = serde_json::from_slice(&definition).unwrap();
    assert_eq!(definition["startAt"], "start");
    assert_eq!(definition["nodes"].as_array().unwrap().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_is_verified_and_scoped_to_its_run_and_media_type() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut client = server.client().await;
    let script = loop_script(dir.path(), "loop.json", 2, None);
    let run_id = started(&mut client, &script).await;
    let other_script = loop_script(dir.path(), "other.json", 3, None);
    let other_run = started(&mut client, &other_script).await;
    let view = wait_settled(&mut client, &run_id).await;
    wait_settled(&mut client, &other_run).await;
    let reference = view["definition"].clone();
    let read = client.read_content(&run_id, &reference).await;
    assert!(read.is_ok(), "{read:?} for {reference}");

    let unavailable = |result: Result<Vec<u8>, ClientError>| matches!(result, Err(error) if error.is_server_refusal());
    assert!(
        unavailable(client.read_content(&other_run, &reference).await),
        "another run's reference"
    );
    let mut other_type = reference.clone();
    other_type["mediaType"] = json!("text/plain");
    assert!(
        unavailable(client.read_content(&run_id, &other_type).await),
        "another media type"
    );
    let mut wrong_digest = reference.clone();
    wrong_digest["digest"] = json!(format!("sha256:{}", "0".repeat(64)));
    assert!(
        unavailable(client.read_content(&run_id, &wrong_digest).await),
        "an unknown digest"
    );
    let mut wrong_length = reference.clone();
    wrong_length["bytes"] = json!(reference["bytes"].as_u64().unwrap() + 1);
    assert!(
        unavailable(client.read_content(&run_id, &wrong_length).await),
        "a wrong length"
    );

    // Stored bytes that no longer match their digest are refused by the client.
    let db = rusqlite::Connection::open(server.home.join("state.sqlite")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    let changed = db
        .execute(
            "UPDATE run_view_content SET bytes = CAST(replace(CAST(bytes AS TEXT), 'start', 'START') AS BLOB)
             WHERE run_id = ?1 AND role = 'definition'",
            [&run_id],
        )
        .unwrap();
    assert_eq!(changed, 1);
    assert_eq!(
        client.read_content(&run_id, &reference).await,
        Err(ClientError::Content(ContentFailure::DigestMismatch))
    );
}

/// Server memory in KiB (VmRSS).
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_is_coalesced_and_the_server_memory_stays_bounded() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut client = server.client().await;
    // 120 rounds, each publishing a 4 KiB update: every patch carries the
    // newest 64 updates (about 256 KiB), so an unread socket fills at once.
    let script = loop_script(dir.path(), "loop.json", 120, Some(4096));
    let mut slow = server.client().await;
    let baseline_kib = resident_kib(server.pid());
    let run_id = started(&mut client, &script).await;
    let response = slow
        .subscribe(json!({ "kind": "run", "runId": run_id }), None)
        .await
        .unwrap();
    let subscription = response.receipt.unwrap()["subscriptionId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The slow subscriber reads nothing while the run makes its revisions.
    let mut peak_kib = baseline_kib;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        peak_kib = peak_kib.max(resident_kib(server.pid()));
        let view = support::view(&mut client, &run_id).await;
        if status(&view) == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "the run did not finish: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The runner's exit is recorded after completion and is one more
    // presentation revision (the activity); wait for it so the final
    // revision is final.
    support::wait_quiescent(&server.db()).await;
    let final_revision = support::view(&mut client, &run_id).await["revision"]
        .as_u64()
        .unwrap();
    assert!(final_revision > 240, "{final_revision} revisions");
    // Unread events would take final_revision × ~256 KiB ≈ 60 MiB; the server
    // holds at most one event for this subscriber.
    let growth_kib = peak_kib.saturating_sub(baseline_kib);
    assert!(
        growth_kib < 24 * 1024,
        "the server grew by {growth_kib} KiB with one stuck subscriber"
    );

    // Reading now yields a few coalesced events ending at the final revision.
    let mut live = LiveView::new();
    let mut events = 0;
    while live.revision() != Some(final_revision) {
        let frame = tokio::time::timeout(Duration::from_secs(20), slow.next_event())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(frame["subscriptionId"], subscription.as_str());
        live.apply(&frame["event"]).unwrap();
        events += 1;
    }
    assert!(
        events * 4 < final_revision,
        "{events} events for {final_revision} revisions: not coalesced"
    );
    let current = support::view(&mut client, &run_id).await;
    assert!(
        differences(live.view().unwrap(), &current).is_empty(),
        "{:?}",
        differences(live.view().unwrap(), &current)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsubscribe_removes_every_kind_of_subscription() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let script = loop_script(dir.path(), "loop.json", 3, None);
    let mut client = server.client().await;
    let first = started(&mut client, &script).await;
    wait_settled(&mut client, &first).await;

    let mut subscriber = server.client().await;
    let mut ids = BTreeMap::new();
    for (kind, target) in [
        ("run", json!({ "kind": "run", "runId": first })),
        ("runList", json!({ "kind": "runList" })),
        (
            "session",
            json!({ "kind": "session", "sessionId": "session-1" }),
        ),
        ("control", json!({ "kind": "runList" })),
    ] {
        let response = subscriber.subscribe(target, None).await.unwrap();
        assert_eq!(response.outcome, "accepted", "{kind}: {}", response.frame);
        ids.insert(
            kind,
            response.receipt.unwrap()["subscriptionId"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // Each delivers its first event.
    let mut first_events = BTreeMap::new();
    while first_events.len() < 4 {
        let frame = subscriber.next_event().await.unwrap();
        first_events.insert(frame["subscriptionId"].as_str().unwrap().to_owned(), frame);
    }
    for kind in ["run", "runList", "session"] {
        let unsubscribe =
            RequestSpec::read("unsubscribe", None, json!({ "subscriptionId": ids[kind] }));
        assert_eq!(
            subscriber.request(&unsubscribe).await.unwrap().outcome,
            "accepted",
            "{kind}"
        );
        assert_eq!(
            subscriber.request(&unsubscribe).await.unwrap().outcome,
            "notFound",
            "{kind} twice"
        );
    }
    // Changes keep flowing to the control subscription and to nothing else.
    let second = started(&mut client, &script).await;
    wait_settled(&mut client, &second).await;
    client
        .request(&RequestSpec::command(
            "run.restart",
            Some(&first),
            json!({}),
        ))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_millis(800);
    let mut control_events = 0;
    while let Ok(frame) = tokio::time::timeout_at(deadline.into(), subscriber.next_event()).await {
        let frame = frame.unwrap();
        assert_eq!(
            frame["subscriptionId"],
            ids["control"].as_str(),
            "an event after unsubscribe: {frame}"
        );
        control_events += 1;
    }
    assert!(
        control_events > 0,
        "the control subscription saw the changes"
    );
}

/// A writable connection beside the running server, to plant the workflow
/// messages and turns the Pi extension reports (the server has no producer
/// for terminal messages yet).
fn planter(server: &TestServer) -> rusqlite::Connection {
    let db = rusqlite::Connection::open(server.home.join("state.sqlite")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db
}

async fn session_run(client: &mut Client, session: &str) -> Option<String> {
    let response = client
        .request(&RequestSpec::read(
            "sessionView.get",
            None,
            json!({ "sessionId": session }),
        ))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{}", response.frame);
    response.receipt.unwrap()["activeRun"]["runId"]
        .as_str()
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_run_stays_in_its_origin_session_until_its_terminal_turn_ended_60_seconds_ago() {
    const SESSION: &str = "session-retained";
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let script = loop_script(dir.path(), "loop.json", 1, None);
    let mut client = server.client().await;
    let start = |script: &Path| {
        RequestSpec::command(
            "run.start",
            None,
            json!({ "workflow": script.to_string_lossy(), "input": {}, "projectPath": "/tmp",
                    "executionMode": "interactive", "originSessionId": SESSION }),
        )
    };
    let response = client.request(&start(&script)).await.unwrap();
    let first = response.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        status(&wait_settled(&mut client, &first).await),
        "completed"
    );
    let db = planter(&server);
    let now_ms = |db: &rusqlite::Connection| -> i64 {
        db.query_row(
            "SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
            [],
            |row| row.get(0),
        )
        .unwrap()
    };

    // The server builds the run's terminal message after the terminal
    // commit; this test plants its own states of it, so it removes that one
    // (the state between the terminal commit and the message).
    wait_for(
        Duration::from_secs(10),
        "the built terminal message",
        || {
            (count(
                &db,
                "SELECT COUNT(*) FROM workflow_messages WHERE run_id = ?1 AND kind = 'terminal'",
                [&first],
            ) == 1)
                .then_some(())
        },
    )
    .await;
    db.execute("DELETE FROM workflow_messages WHERE run_id = ?1", [&first])
        .unwrap();

    // Without a terminal message: visible for 60 seconds after it finished.
    assert_eq!(session_run(&mut client, SESSION).await, Some(first.clone()));
    db.execute(
        "UPDATE runs SET finished_at_ms = ?1 WHERE run_id = ?2",
        rusqlite::params![now_ms(&db) - 120_000, first],
    )
    .unwrap();
    assert_eq!(session_run(&mut client, SESSION).await, None);

    // A pending terminal message keeps it, however old.
    db.execute_batch(&format!(
        "INSERT INTO blobs (digest, media_type, bytes, created_at_ms)
         VALUES (zeroblob(32), 'text/markdown', CAST('The run completed.' AS BLOB), 0);
         INSERT INTO workflow_messages (message_id, session_id, run_id, kind, content_digest, session_order, state, created_at_ms, updated_at_ms)
         VALUES ('m-terminal', '{SESSION}', '{first}', 'terminal', zeroblob(32), 1, 'pending', 0, 0);"
    ))
    .unwrap();
    assert_eq!(session_run(&mut client, SESSION).await, Some(first.clone()));
    let window = session_view(&mut client, SESSION).await;
    assert_eq!(window["messageCount"], 1);
    assert_eq!(window["messages"][0]["messageId"], "m-terminal");
    assert_eq!(
        window["messages"][0]["content"]["mediaType"],
        "text/markdown"
    );
    assert_eq!(window["messages"][0]["content"]["bytes"], 18);

    // Sent, before its first turn: kept, and still in the window (the turn
    // it opens is reported against it).
    db.execute(
        "UPDATE workflow_messages SET state = 'sent' WHERE message_id = 'm-terminal'",
        [],
    )
    .unwrap();
    assert_eq!(session_run(&mut client, SESSION).await, Some(first.clone()));
    let window = session_view(&mut client, SESSION).await;
    assert_eq!(window["messages"][0]["messageId"], "m-terminal", "{window}");
    assert_eq!(window["messages"][0]["state"], "sent", "{window}");

    // Its first turn open: kept.
    db.execute_batch(&format!(
        "INSERT INTO workflow_turns (turn_id, message_id, run_id, session_id, state, started_at_ms)
         VALUES ('t-1', 'm-terminal', '{first}', '{SESSION}', 'open', 1);"
    ))
    .unwrap();
    assert_eq!(session_run(&mut client, SESSION).await, Some(first.clone()));
    // The turn ended 10 seconds ago: kept; 70 seconds ago: gone.
    for (ended_ago_ms, expected) in [(10_000, Some(first.clone())), (70_000, None)] {
        db.execute(
            "UPDATE workflow_turns SET state = 'completed', ended_at_ms = ?1 WHERE turn_id = 't-1'",
            [now_ms(&db) - ended_ago_ms],
        )
        .unwrap();
        assert_eq!(
            session_run(&mut client, SESSION).await,
            expected,
            "turn ended {ended_ago_ms} ms ago"
        );
    }
    // Only the first turn counts: a later turn does not extend it.
    db.execute(
        "INSERT INTO workflow_turns (turn_id, message_id, run_id, session_id, state, started_at_ms)
         VALUES ('t-2', 'm-terminal', ?1, ?2, 'open', 2)",
        rusqlite::params![first, SESSION],
    )
    .unwrap();
    assert_eq!(session_run(&mut client, SESSION).await, None);

    // While its turn is open again, a newer run replaces it; once that one
    // finished, it is the retained one, and clearTerminal hides it.
    db.execute(
        "UPDATE workflow_turns SET state = 'open', ended_at_ms = NULL WHERE turn_id = 't-1'",
        [],
    )
    .unwrap();
    assert_eq!(session_run(&mut client, SESSION).await, Some(first.clone()));
    let second = client
        .request(&start(&script))
        .await
        .unwrap()
        .receipt
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        status(&wait_settled(&mut client, &second).await),
        "completed"
    );
    assert_eq!(
        session_run(&mut client, SESSION).await,
        Some(second.clone())
    );
    let cleared = client
        .request(&RequestSpec::command(
            "sessionView.clearTerminal",
            None,
            json!({ "sessionId": SESSION }),
        ))
        .await
        .unwrap();
    assert_eq!(cleared.outcome, "accepted", "{}", cleared.frame);
    assert_eq!(session_run(&mut client, SESSION).await, None);
}

/// The origin-session view lists every message the server creates, each with
/// its content: after a waiting interactive run is paused and resumed, its
/// one pending message is the `resumed` step, whose content is the step's
/// prompt again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_step_message_is_in_the_origin_session_view_with_its_content() {
    const SESSION: &str = "session-resumed";
    const PROMPT: &str = "Write the release summary.";
    let server = TestServer::start();
    let script = write_script(
        server.scratch(),
        "ask.json",
        &json!({
            "workflowName": "ask",
            "topology": support::linear_topology(&["ask"]),
            "nodes": {"ask": [{"interact": {"prompt": PROMPT}}]}
        }),
    );
    let mut client = server.client().await;
    let started = client
        .request(&RequestSpec::command(
            "run.start",
            None,
            json!({ "workflow": script.to_string_lossy(), "input": {}, "projectPath": "/tmp",
                    "executionMode": "interactive", "originSessionId": SESSION }),
        ))
        .await
        .unwrap();
    assert_eq!(started.outcome, "accepted", "{:?}", started.frame);
    let run_id = started.receipt.unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(status(&wait_settled(&mut client, &run_id).await), "waiting");
    let reasons = |view: &Value| -> Vec<String> {
        view["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|message| {
                format!(
                    "{}/{}",
                    message["kind"].as_str().unwrap(),
                    message["stepReason"].as_str().unwrap_or("-")
                )
            })
            .collect()
    };
    let waiting = session_view(&mut client, SESSION).await;
    assert_eq!(waiting["messageCount"], 1, "{waiting}");
    assert_eq!(reasons(&waiting), ["step/initial"], "{waiting}");

    for operation in ["run.pause", "run.resume"] {
        let response = client
            .request(&RequestSpec::command(operation, Some(&run_id), json!({})))
            .await
            .unwrap();
        assert_eq!(
            response.outcome, "accepted",
            "{operation}: {:?}",
            response.frame
        );
    }
    let resumed = session_view(&mut client, SESSION).await;
    // The pause cancelled the initial message; it stays in the window while
    // the run is not terminal (branch evidence can still adopt it).
    assert_eq!(resumed["messageCount"], 2, "{resumed}");
    assert_eq!(
        reasons(&resumed),
        ["step/initial", "step/resumed"],
        "{resumed}"
    );
    assert_eq!(resumed["messages"][0]["state"], "cancelled", "{resumed}");
    let message = &resumed["messages"][1];
    assert_eq!(message["runId"], run_id.as_str());
    assert_eq!(message["state"], "pending");
    assert_eq!(message["content"]["mediaType"], "text/plain");
    assert_eq!(message["content"]["bytes"], PROMPT.len(), "{message}");
    assert_eq!(
        message["content"]["digest"], waiting["messages"][0]["content"]["digest"],
        "a resumed step presents the same prompt"
    );
    // Every stored message has its content.
    assert_eq!(
        support::count(
            &server.db(),
            "SELECT COUNT(*) FROM workflow_messages WHERE content_digest IS NULL",
            []
        ),
        0
    );
}

/// The live view is maintained incrementally at every commit (small rows,
/// patches from the change). After 1,000 steps it is byte-identical, in
/// canonical JSON, to the view rebuilt from scratch from the run's facts
/// (every attempt row, the aggregate, the updates), and so are the view a
/// subscriber assembled from one snapshot plus every patch, and the graph
/// history behind the reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_1000_steps_the_incremental_view_equals_the_view_rebuilt_from_scratch() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let mut client = server.client().await;
    // 499 rounds: 1,000 steps, an update per `work` visit.
    let run_id = started(
        &mut client,
        &loop_script(dir.path(), "loop.json", 499, Some(16)),
    )
    .await;
    let mut follower = server.client().await;
    let revisions = tokio::time::timeout(
        Duration::from_secs(600),
        record_revisions(&mut follower, &run_id),
    )
    .await
    .expect("the run settles");
    let (_, patched) = revisions.last_key_value().unwrap();
    let snapshot = support::view(&mut client, &run_id).await;
    assert_eq!(snapshot["steps"]["total"], 1000, "{}", snapshot["steps"]);
    assert_eq!(status(&snapshot), "completed");
    let (rebuilt, history) =
        server::store::viewer::rebuilt(&server.db(), &kernel::ids::RunId::new(run_id.clone()))
            .unwrap()
            .expect("the run exists");
    let canonical =
        |view: &Value| String::from_utf8(protocol::canonicalize(view).unwrap()).unwrap();
    assert!(
        canonical(&snapshot) == canonical(&rebuilt),
        "snapshot and rebuilt view differ: {:?}",
        differences(&snapshot, &rebuilt)
    );
    assert!(
        canonical(patched) == canonical(&rebuilt),
        "snapshot-plus-patches and rebuilt view differ: {:?}",
        differences(patched, &rebuilt)
    );
    let served = client
        .read_content(&run_id, &snapshot["graphHistory"])
        .await
        .unwrap();
    assert!(
        served == history,
        "the referenced graph history is the rebuilt one"
    );
    let steps: Vec<Value> = serde_json::from_slice(&served).unwrap();
    assert_eq!(steps.len(), 1000);
}
