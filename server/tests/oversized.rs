//! Values that outgrow one 1 MiB frame, against a real server and the
//! scripted runner: a run state of several MiB crosses a pause and resume
//! as a digest-bound content reference, an adopted effect result over the
//! frame limit reaches the rerun, a runner cannot read content the server
//! did not issue to it, and a run with 10 MiB of updates is still viewed
//! (once, live and through pages).

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::{Value, json};
use std::io::Read as _;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use support::{
    TestServer, apply_lines, count, linear_topology, started, wait_for, wait_quiescent,
    write_script,
};

/// The largest frame, its `\n` included.
const FRAME: usize = 1024 * 1024;

/// One request, bounded in time: a server that never answers fails the
/// test instead of hanging it.
async fn bounded(
    client: &mut Client,
    spec: &RequestSpec,
    what: &str,
) -> pi_workflows_client::Response {
    match tokio::time::timeout(Duration::from_secs(60), client.request(spec)).await {
        Ok(response) => response.expect(what),
        Err(_) => panic!("{what}: no response within 60 s"),
    }
}

/// Waits (reading the state file, never the socket) until the run's durable
/// status is `status`.
async fn wait_run_status(server: &TestServer, run_id: &str, status: &str, timeout: Duration) {
    let db = server.db();
    let deadline = Instant::now() + timeout;
    loop {
        let (current, queue): (String, String) = db
            .query_row(
                "SELECT r.status, q.status FROM runs r JOIN run_queue q USING (run_id) WHERE r.run_id = ?1",
                [run_id],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        if current == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "run {run_id} is {current} ({queue}), not {status}, after {timeout:?}; runner logs:\n{}",
            runner_logs(server)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every runner log of this server, whole.
fn all_runner_logs(server: &TestServer) -> String {
    let mut text = String::new();
    if let Ok(entries) = std::fs::read_dir(server.home.join("host").join("logs")) {
        for entry in entries.flatten() {
            text.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    text
}

/// The tail of every runner log of this server.
fn runner_logs(server: &TestServer) -> String {
    let mut text = String::new();
    if let Ok(entries) = std::fs::read_dir(server.home.join("host").join("logs")) {
        for entry in entries.flatten() {
            let log = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(12).collect();
            text.push_str(&format!("--- {}\n", entry.file_name().to_string_lossy()));
            for line in tail.into_iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    text
}

/// The output of big node `index`: about 512 KB.
fn big_output(index: usize) -> Value {
    json!({ "node": index, "pad": format!("{index:02}-{}", "x".repeat(512_000)) })
}

/// `n1 … n10` (each finishing with about 512 KB), `hold` (waits for its
/// release file), `last`: the run state after `hold` starts holds 5 MiB of
/// outputs.
fn five_mib_script(dir: &Path) -> std::path::PathBuf {
    let names: Vec<String> = (1..=10).map(|i| format!("n{i}")).collect();
    let mut ids: Vec<&str> = names.iter().map(String::as_str).collect();
    ids.extend(["hold", "last"]);
    let mut nodes = serde_json::Map::new();
    for (index, name) in names.iter().enumerate() {
        nodes.insert(name.clone(), json!([{ "finish": big_output(index + 1) }]));
    }
    nodes.insert(
        "hold".into(),
        json!([{ "awaitFile": "release", "then": { "finish": { "held": true } } }]),
    );
    write_script(
        dir,
        "five-mib.json",
        &json!({
            "workflowName": "five-mib",
            "topology": linear_topology(&ids),
            "startup": { "recordState": "state.json" },
            "nodes": nodes,
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_5_mib_of_outputs_survives_pause_and_resume_and_completes() {
    let server = TestServer::start();
    let script = five_mib_script(server.scratch());
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();
    wait_for(Duration::from_secs(60), "node hold to start", || {
        let started = count(
            &db,
            "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1 AND node_id = 'hold'",
            [&run_id],
        );
        (started > 0).then_some(())
    })
    .await;
    let pause = bounded(
        &mut client,
        &RequestSpec::command("run.pause", Some(&run_id), json!({})),
        "run.pause",
    )
    .await;
    assert_eq!(pause.outcome, "accepted", "{}", pause.frame);
    wait_quiescent(&db).await;
    std::fs::write(server.scratch().join("release"), b"go").unwrap();
    let resume = bounded(
        &mut client,
        &RequestSpec::command("run.resume", Some(&run_id), json!({})),
        "run.resume",
    )
    .await;
    assert_eq!(resume.outcome, "accepted", "{}", resume.frame);
    wait_run_status(&server, &run_id, "completed", Duration::from_secs(60)).await;

    // The resumed runner got the complete state, each output exactly once.
    let recorded = std::fs::read(server.scratch().join("state.json")).unwrap();
    assert!(
        recorded.len() > 5 * 512_000,
        "the resumed state holds the outputs ({} bytes)",
        recorded.len()
    );
    let state: Value = serde_json::from_slice(&recorded).unwrap();
    for index in 1..=10 {
        let node = format!("n{index}");
        assert_eq!(
            state["results"][&node]["output"],
            big_output(index),
            "{node}"
        );
        assert_eq!(state["results"][&node]["outcome"], "ok", "{node}");
        let marker = format!("\"{index:02}-xxxx");
        let copies = String::from_utf8_lossy(&recorded).matches(&marker).count();
        assert_eq!(
            copies, 1,
            "the output of {node} is sent once, not {copies} times"
        );
    }
    assert_eq!(
        state["resultOrder"],
        json!(["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"])
    );
    assert_eq!(state["steps"], 10);
    assert!(
        state.get("outputs").is_none(),
        "outputs derive from results"
    );
    assert!(
        all_runner_logs(&server).contains("read the referenced run state"),
        "the resume command carried its state as a content reference"
    );
    wait_quiescent(&db).await;
    assert_eq!(support::consistency_violations(&db), Vec::<String>::new());
}

/// An effect whose settled result fills a frame: after a crash before the
/// node finished, the rerun's `effect.reserve` reply (the stored result plus
/// the reply envelope) is over 1 MiB, so it carries the result as a content
/// reference; the runner reads it and does not apply the effect again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_effect_result_over_one_frame_reaches_the_rerun() {
    let server = TestServer::start();
    let script = write_script(
        server.scratch(),
        "big-effect.json",
        &json!({
            "workflowName": "big-effect",
            "topology": linear_topology(&["send", "done"]),
            "nodes": { "send": [{
                "effect": { "type": "big.send", "request": { "to": "x" }, "applyLog": "apply.log", "padSettleFrameTo": FRAME - 16 },
                "then": { "crashOnce": "crash.marker", "then": { "finish": { "sent": true } } },
            }] },
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    wait_run_status(&server, &run_id, "completed", Duration::from_secs(60)).await;
    assert_eq!(
        apply_lines(&server.scratch().join("apply.log")).len(),
        1,
        "the effect was applied once"
    );
    let generations = count(
        &server.db(),
        "SELECT COUNT(*) FROM run_workers WHERE run_id = ?1",
        [&run_id],
    );
    assert_eq!(generations, 2, "one runner crashed, the second finished");
    assert!(
        all_runner_logs(&server).contains("read the referenced reply result"),
        "the reply carried the result as a content reference:\n{}",
        runner_logs(&server)
    );
    assert!(
        all_runner_logs(&server).contains("already applied"),
        "the rerun read the stored result:\n{}",
        runner_logs(&server)
    );
}

/// A runner asks for content by a digest it was never given (here: the
/// run's own input): the server refuses with `contentUnavailable`, and the
/// runner goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_read_of_content_not_issued_to_the_runner_is_refused_and_the_run_goes_on() {
    let server = TestServer::start();
    let input = protocol::canonicalize(&json!({ "task": "test" })).unwrap();
    let reference = json!({
        "digest": server::ids::digest_text(&server::ids::sha256(&input)),
        "mediaType": "application/json",
        "bytes": input.len(),
    });
    let script = write_script(
        server.scratch(),
        "reader.json",
        &json!({
            "workflowName": "reader",
            "topology": linear_topology(&["a"]),
            "nodes": { "a": [{
                "contentRead": { "reference": reference, "record": "reads.ndjson" },
                "then": { "finish": { "ok": 1 } },
            }] },
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    wait_run_status(&server, &run_id, "completed", Duration::from_secs(30)).await;
    let reads = apply_lines(&server.scratch().join("reads.ndjson"));
    assert_eq!(reads.len(), 1, "{reads:?}");
    let answer: Value = serde_json::from_str(&reads[0]).unwrap();
    assert_eq!(answer["type"], "reply", "{answer}");
    assert_eq!(answer["outcome"], "rejected", "{answer}");
    assert_eq!(answer["error"]["code"], "contentUnavailable", "{answer}");
}

/// 17 nodes that publish 10 updates of 60 KB each: 170 current updates,
/// about 10 MiB, each inside the 64 KiB update limit, paced under the
/// update rate limit (a burst of 100, then 20 per second).
fn updates_script(dir: &Path) -> std::path::PathBuf {
    let names: Vec<String> = (1..=17).map(|i| format!("u{i}")).collect();
    let ids: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut nodes = serde_json::Map::new();
    for (node_index, name) in names.iter().enumerate() {
        let mut behaviour = json!({ "finish": { "node": name } });
        for update in (0..10).rev() {
            let key = format!("k{:03}", node_index * 10 + update);
            behaviour = json!({
                "update": { "type": "log", "key": key, "data": { "key": key, "pad": "y".repeat(60_000) } },
                "then": { "sleepMs": 60, "then": behaviour },
            });
        }
        nodes.insert(name.clone(), json!([behaviour]));
    }
    write_script(
        dir,
        "updates.json",
        &json!({ "workflowName": "updates", "topology": linear_topology(&ids), "nodes": nodes }),
    )
}

/// A CLI process whose stdout and stderr go to files (a pipe nobody reads
/// would block a large output).
struct CliRun {
    child: Child,
    out: std::path::PathBuf,
    err: std::path::PathBuf,
}

fn spawn_cli(server: &TestServer, name: &str, args: &[&str]) -> CliRun {
    let out = server.scratch().join(format!("{name}.out"));
    let err = server.scratch().join(format!("{name}.err"));
    let child = server
        .command()
        .args(args)
        .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
        .spawn()
        .unwrap();
    CliRun { child, out, err }
}

/// Waits for a CLI process with a deadline; kills it when it is late.
fn wait_cli(
    mut run: CliRun,
    timeout: Duration,
    what: &str,
) -> (std::process::ExitStatus, String, String) {
    let deadline = Instant::now() + timeout;
    let read = |path: &Path| {
        let mut text = String::new();
        std::fs::File::open(path)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    };
    loop {
        if let Some(status) = run.child.try_wait().unwrap() {
            return (status, read(&run.out), read(&run.err));
        }
        if Instant::now() > deadline {
            let _ = run.child.kill();
            let _ = run.child.wait();
            let out = read(&run.out);
            panic!(
                "{what} did not finish within {timeout:?} ({} bytes of output; stderr: {:?})",
                out.len(),
                read(&run.err)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The 170 expected update keys.
fn expected_keys() -> Vec<String> {
    (0..170).map(|index| format!("k{index:03}")).collect()
}

/// The keys of update items, sorted, after checking each one's data.
fn update_keys(items: &[Value]) -> Vec<String> {
    let mut keys: Vec<String> = items
        .iter()
        .map(|item| {
            let key = item["key"].as_str().unwrap().to_owned();
            assert_eq!(item["data"]["key"], key.as_str(), "{key}");
            assert_eq!(
                item["data"]["pad"].as_str().map(str::len),
                Some(60_000),
                "{key}"
            );
            key
        })
        .collect();
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_10_mib_of_updates_is_viewed_once_followed_live_and_paged() {
    let server = TestServer::start();
    let script = updates_script(server.scratch());
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    // Follow it live from the start (`--json`: one view document per line).
    let follower = spawn_cli(&server, "follow", &["view", &run_id, "--json"]);
    wait_run_status(&server, &run_id, "completed", Duration::from_secs(120)).await;
    assert_eq!(
        count(
            &server.db(),
            "SELECT COUNT(*) FROM workflow_updates WHERE run_id = ?1",
            [&run_id]
        ),
        170,
        "every update was stored (none rate-limited)"
    );

    // The live view followed the run to its end.
    let (status, out, err) = wait_cli(follower, Duration::from_secs(60), "view --json (follow)");
    assert!(status.success(), "the live view failed: {err}");
    let last: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["display"]["status"], "completed");
    assert_eq!(last["updates"]["total"], 170);

    // `view --once --json` answers with the complete document.
    let once = spawn_cli(&server, "once", &["view", &run_id, "--once", "--json"]);
    let (status, out, err) = wait_cli(once, Duration::from_secs(60), "view --once --json");
    assert!(status.success(), "view --once failed: {err}");
    let document: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(document["display"]["status"], "completed", "{err}");
    assert_eq!(document["updates"]["total"], 170);
    assert!(document["updates"].get("nextCursor").is_none());
    assert_eq!(
        update_keys(document["updates"]["items"].as_array().unwrap()),
        expected_keys()
    );
    assert_eq!(document["steps"]["total"], 17);
    assert_eq!(document["steps"]["items"].as_array().unwrap().len(), 17);
    protocol::decode_run_view(&protocol::canonicalize(&document).unwrap())
        .map(|_| ())
        .or_else(|error| {
            // The complete document is bigger than a frame; only its size may fail.
            (error.code().to_string() == "frameTooLarge")
                .then_some(())
                .ok_or(error)
        })
        .unwrap();

    // The bounded inline view, and every update through `view.page`.
    let view = bounded(
        &mut client,
        &RequestSpec::read("run.view", Some(&run_id), json!({})),
        "run.view",
    )
    .await;
    assert_eq!(view.outcome, "accepted", "{:?}", view.error_message);
    assert!(view.frame.to_string().len() < FRAME);
    let view = view.receipt.unwrap();
    let inline = view["updates"]["items"].as_array().unwrap();
    assert!(
        !inline.is_empty() && inline.len() < 170,
        "{} inline",
        inline.len()
    );
    assert_eq!(view["updates"]["nextCursor"], inline.len().to_string());
    let mut items: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut payload = json!({ "collection": "updates", "limit": 1000, "maxBytes": FRAME, "revision": view["revision"] });
        if let Some(cursor) = &cursor {
            payload["cursor"] = json!(cursor);
        }
        let page = bounded(
            &mut client,
            &RequestSpec::read("view.page", Some(&run_id), payload),
            "view.page",
        )
        .await;
        assert_eq!(page.outcome, "accepted", "{:?}", page.error_message);
        assert!(page.frame.to_string().len() < FRAME);
        let page = page.receipt.unwrap();
        assert_eq!(page["revision"], view["revision"]);
        items.extend(page["items"].as_array().unwrap().iter().cloned());
        pages += 1;
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert!(
        pages > 1,
        "a page is bounded by bytes, whatever maxBytes asks"
    );
    assert_eq!(update_keys(&items), expected_keys());
    assert_eq!(
        items[..inline.len()],
        inline[..],
        "the pages start with the inline ones"
    );
}

/// A switch with 5,000 cases from a node with a long id: its resolve
/// frame is small (about 60 KB), but a run view lists one edge per case
/// with the source id repeated, about 1.4 MB: more than a frame. The start
/// is refused with a clear reason instead of creating a run that can never
/// be viewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_whose_graph_cannot_be_shown_in_a_view_is_refused_when_it_starts() {
    let server = TestServer::start();
    let from = format!("s{}", "w".repeat(250));
    let cases: serde_json::Map<String, Value> = (0..5000)
        .map(|case| (format!("c{case}"), json!("t")))
        .collect();
    let node = |id: &str| json!({ "id": id, "nodeType": "compute", "timeout": { "kind": "default" }, "mountPath": [] });
    let script = write_script(
        server.scratch(),
        "wide.json",
        &json!({
            "workflowName": "wide",
            "topology": {
                "startAt": from,
                "nodes": [node(&from), node("t")],
                "edges": [{ "kind": "switch", "from": from, "on": "$.route", "cases": cases }],
                "mounts": [],
            },
        }),
    );
    let mut client = server.client().await;
    let response = support::start_run(&mut client, &script).await;
    assert_eq!(response.outcome, "rejected", "{}", response.frame);
    assert_eq!(response.error_code.as_deref(), Some("validationFailed"));
    assert!(
        response
            .error_message
            .as_deref()
            .is_some_and(|message| message.contains("too large to show")),
        "{:?}",
        response.error_message
    );
}
