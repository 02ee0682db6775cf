//! Restart lineage through the real socket (`run.restart`): each restart is
//! a new run whose stored lineage names the chain's root, its parent, its
//! number and the parent's terminal fingerprint; a chain allows three
//! restarts after its original run, each of a new failure; an explicitly
//! cancelled run is never restarted; the restarted run never changes.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use serde_json::{Value, json};
use std::path::Path;
use support::*;

async fn restart(client: &mut Client, run_id: &str) -> Response {
    client
        .request(&RequestSpec::command(
            "run.restart",
            Some(run_id),
            json!({}),
        ))
        .await
        .unwrap()
}

/// The stored row of a run as text (every column), to compare before and after.
fn row(server: &TestServer, run_id: &str) -> String {
    let db = server.db();
    let mut statement = db.prepare("SELECT * FROM runs WHERE run_id = ?1").unwrap();
    let columns = statement.column_count();
    statement
        .query_row([run_id], |row| {
            Ok((0..columns)
                .map(|index| format!("{:?}", row.get_ref(index).unwrap()))
                .collect::<Vec<_>>()
                .join("|"))
        })
        .unwrap()
}

fn lineage(server: &TestServer, run_id: &str) -> Value {
    let text: Option<String> = server
        .db()
        .query_row(
            "SELECT restart_json FROM runs WHERE run_id = ?1",
            [run_id],
            |row| row.get(0),
        )
        .unwrap();
    text.map_or(Value::Null, |text| serde_json::from_str(&text).unwrap())
}

/// `a → b → c → d → e`; node n of a..d fails unless the marker `n` exists in
/// `dir`, so each restart (after the test creates the next marker) fails at
/// a later node: a new terminal fingerprint every time.
fn staged_script(dir: &Path) -> std::path::PathBuf {
    let ids = ["a", "b", "c", "d", "e"];
    let nodes: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "nodeType": "compute", "timeout": {"kind": "none"}, "mountPath": []}))
        .collect();
    let edges: Vec<Value> = ids
        .windows(2)
        .map(|pair| json!({"kind": "plain", "from": pair[0], "to": pair[1]}))
        .collect();
    let mut behaviours = serde_json::Map::new();
    for id in &ids[..4] {
        behaviours.insert(
            (*id).to_owned(),
            json!([{"ifFile": dir.join(id).to_string_lossy(), "else": {"fail": format!("{id} broke")}}]),
        );
    }
    write_script(
        dir,
        "staged.json",
        &json!({
            "workflowName": "staged",
            "topology": {"startAt": "a", "nodes": nodes, "edges": edges, "mounts": []},
            "nodes": behaviours,
        }),
    )
}

/// The original fails at `a`; three restarts, each after a new failure (at
/// `b`, `c`, `d`), are accepted, each a new run whose lineage names the
/// root, its parent, its number and a new parent fingerprint; the fourth is
/// refused with the limit's message and creates no run; no restarted run
/// changed. A run cancelled explicitly is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_takes_three_restarts_of_new_failures_never_a_cancelled_run_and_never_changes_the_old_run()
 {
    let server = TestServer::start();
    let script = staged_script(server.scratch());
    let mut client = server.client().await;
    let original = started(&mut client, &script).await;
    assert_eq!(
        status(&wait_settled(&mut client, &original).await),
        "failed"
    );

    let mut chain = vec![original.clone()];
    let mut fingerprints = Vec::new();
    for (number, marker) in ["a", "b", "c"].into_iter().enumerate() {
        std::fs::write(server.scratch().join(marker), b"").unwrap();
        let parent = chain.last().unwrap().clone();
        let before = row(&server, &parent);
        let restarted = restart(&mut client, &parent).await;
        assert_eq!(restarted.outcome, "accepted", "{:?}", restarted.frame);
        let new_run = restarted.receipt.as_ref().unwrap()["newRunId"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(status(&wait_settled(&mut client, &new_run).await), "failed");
        assert_eq!(
            row(&server, &parent),
            before,
            "the restarted run never changes"
        );
        let recorded = lineage(&server, &new_run);
        assert_eq!(recorded["rootRunId"], json!(original), "{recorded}");
        assert_eq!(recorded["parentRunId"], json!(parent), "{recorded}");
        assert_eq!(recorded["number"], json!(number + 1), "{recorded}");
        assert!(!recorded["parentFingerprint"].is_null(), "{recorded}");
        assert!(
            !fingerprints.contains(&recorded["parentFingerprint"]),
            "each restart follows a new failure"
        );
        fingerprints.push(recorded["parentFingerprint"].clone());
        chain.push(new_run);
    }
    assert_eq!(
        lineage(&server, &original),
        Value::Null,
        "the original has none"
    );

    std::fs::write(server.scratch().join("d"), b"").unwrap();
    let last = chain.last().unwrap().clone();
    let before = row(&server, &last);
    let refused = restart(&mut client, &last).await;
    assert_eq!(refused.outcome, "rejected", "{:?}", refused.frame);
    assert_eq!(refused.frame["error"]["code"], "restartRefused");
    assert!(
        refused.frame["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("three restarts"),
        "{:?}",
        refused.frame
    );
    assert_eq!(row(&server, &last), before);
    assert_eq!(
        count(&server.db(), "SELECT COUNT(*) FROM runs", []),
        4,
        "the original and three restarts"
    );

    // An explicitly cancelled run is never restarted.
    let stalls = write_script(
        server.scratch(),
        "stalls.json",
        &json!({
            "workflowName": "stalls",
            "topology": {"startAt": "a", "nodes": [
                {"id": "a", "nodeType": "compute", "timeout": {"kind": "none"}, "mountPath": []}],
                "edges": [], "mounts": []},
            "nodes": {"a": [{"stall": true}]}
        }),
    );
    let stalled = started(&mut client, &stalls).await;
    let cancelled = client
        .request(&RequestSpec::command(
            "run.cancel",
            Some(&stalled),
            json!({}),
        ))
        .await
        .unwrap();
    assert_eq!(cancelled.outcome, "accepted", "{:?}", cancelled.frame);
    assert_eq!(
        status(&wait_settled(&mut client, &stalled).await),
        "cancelled"
    );
    let before = row(&server, &stalled);
    let refused = restart(&mut client, &stalled).await;
    assert_eq!(refused.frame["error"]["code"], "restartRefused");
    assert!(
        refused.frame["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cancelled run cannot be restarted"),
        "{:?}",
        refused.frame
    );
    assert_eq!(row(&server, &stalled), before);
    assert_eq!(count(&server.db(), "SELECT COUNT(*) FROM runs", []), 5);
}
