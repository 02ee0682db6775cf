//! Live settings (`settings.update`, `settings.get`) through the real
//! socket and a real state file: each accepted patch is a durable change
//! with its receipt (a repeat adopts it, another patch under the same key
//! conflicts), revisions count changes, values survive a server restart, a
//! bad patch is refused with a clear error and changes nothing, and a run's
//! view shows the settings revisions it started with (a checkpoint
//! continuation keeps its parent's). The CLI's `settings` commands too.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use serde_json::{Value, json};
use support::*;

const PROJECT: &str = "/tmp";

fn update_spec(scope: &str, patch: Value) -> RequestSpec {
    let payload = match scope {
        "project" => json!({ "scope": "project", "projectPath": PROJECT, "patch": patch }),
        _ => json!({ "scope": scope, "patch": patch }),
    };
    RequestSpec::command("settings.update", None, payload)
}

async fn update(client: &mut Client, scope: &str, patch: Value) -> Response {
    client.request(&update_spec(scope, patch)).await.unwrap()
}

fn revision(response: &Response) -> u64 {
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.as_ref().unwrap()["revision"]
        .as_u64()
        .unwrap()
}

async fn current(client: &mut Client) -> Value {
    let response = client
        .request(&RequestSpec::read(
            "settings.get",
            None,
            json!({ "projectPath": PROJECT }),
        ))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.unwrap()
}

/// The stored change rows: (scope key, revision, patch), in order.
fn changes(server: &TestServer) -> Vec<(String, i64, Value)> {
    let db = server.db();
    let mut statement = db
        .prepare(
            "SELECT scope_key, revision, patch_json FROM workflow_setting_changes
             ORDER BY scope_key, revision",
        )
        .unwrap();
    statement
        .query_map([], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                serde_json::from_str(&row.get::<_, String>(2)?).unwrap(),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Updates of both scopes: one revision per change, a repeat adopts its
/// receipt and stores nothing more, another patch under a used key
/// conflicts, a patch that changes nothing keeps the revision; each change
/// row names the receipt that acknowledged it; after a server restart the
/// values and revisions are the same and the next change continues them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_are_receipted_changes_whose_revisions_count_and_survive_a_restart() {
    let mut server = TestServer::start();
    let mut client = Client::connect(&server.socket(), "settings-test")
        .await
        .unwrap();
    assert_eq!(
        current(&mut client).await,
        json!({ "user": { "revision": 0, "value": {} }, "project": { "revision": 0, "value": {} } }),
        "no settings before the first change"
    );

    let spec = update_spec("user", json!({ "theme": "dark", "editor": { "tabs": 2 } }));
    let first = client.request(&spec).await.unwrap();
    assert_eq!(revision(&first), 1);
    let repeated = client.request(&spec).await.unwrap();
    assert_eq!(repeated.outcome, "adopted", "{:?}", repeated.frame);
    assert_eq!(
        repeated.receipt, first.receipt,
        "a repeat adopts the receipt"
    );
    let mut reused = update_spec("user", json!({ "theme": "light" }));
    reused.idempotency_key = spec.idempotency_key.clone();
    let conflicting = client.request(&reused).await.unwrap();
    assert_eq!(conflicting.outcome, "conflict", "{:?}", conflicting.frame);
    assert_eq!(changes(&server).len(), 1, "neither stored another change");

    let second = update(
        &mut client,
        "user",
        json!({ "theme": null, "editor": { "wrap": true } }),
    )
    .await;
    assert_eq!(revision(&second), 2);
    let unchanged = update(&mut client, "user", json!({ "editor": { "wrap": true } })).await;
    assert_eq!(
        revision(&unchanged),
        2,
        "a patch that changes nothing keeps the revision"
    );
    let project = update(&mut client, "project", json!({ "model": "fast" })).await;
    assert_eq!(revision(&project), 1, "each scope counts its own changes");
    let settings = current(&mut client).await;
    assert_eq!(
        settings["user"],
        json!({ "revision": 2, "value": { "editor": { "tabs": 2, "wrap": true } } })
    );
    assert_eq!(
        settings["project"],
        json!({ "revision": 1, "value": { "model": "fast" } })
    );

    let stored = changes(&server);
    let project_key = stored[0].0.clone();
    assert!(project_key.starts_with("project:"), "{project_key}");
    assert_eq!(
        stored,
        [
            (project_key, 1, json!({ "model": "fast" })),
            (
                "user".to_owned(),
                1,
                json!({ "theme": "dark", "editor": { "tabs": 2 } })
            ),
            (
                "user".to_owned(),
                2,
                json!({ "theme": null, "editor": { "wrap": true } })
            ),
        ],
        "one change row per patch that changed a scope"
    );
    let receipt_of_first: i64 = server
        .db()
        .query_row(
            "SELECT count(*) FROM workflow_setting_changes c JOIN host_commands h
           ON h.client_id = c.client_id AND h.idempotency_key = c.idempotency_key
         WHERE c.scope_key = 'user' AND c.revision = 1 AND h.operation = 'settings.update'
           AND json_extract(h.receipt_json, '$.receipt.revision') = 1",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(receipt_of_first, 1, "the change names its stored receipt");

    drop(client);
    server.stop();
    server.spawn().expect("the server restarts");
    let mut client = Client::connect(&server.socket(), "settings-test")
        .await
        .unwrap();
    assert_eq!(
        current(&mut client).await,
        settings,
        "the settings survive a restart"
    );
    let after = client.request(&spec).await.unwrap();
    assert_eq!(
        after.outcome, "adopted",
        "the receipt survives a restart too"
    );
    assert_eq!(
        revision(&update(&mut client, "user", json!({ "x": 1 })).await),
        3
    );
}

/// A patch over the bounds, or a scope that names the wrong project, is
/// refused with `schemaInvalid` and a message saying what to do; nothing
/// changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_patch_gets_a_clear_error_and_changes_nothing() {
    let server = TestServer::start();
    let mut client = server.client().await;
    assert_eq!(
        revision(&update(&mut client, "user", json!({ "theme": "dark" })).await),
        1
    );
    let before = current(&mut client).await;

    let large = update(&mut client, "user", json!({ "note": "x".repeat(70_000) })).await;
    let mut keys = serde_json::Map::new();
    for index in 0..600 {
        keys.insert(format!("k{index}"), json!(index));
    }
    let many = update(&mut client, "user", Value::Object(keys)).await;
    let no_project = client
        .request(&RequestSpec::command(
            "settings.update",
            None,
            json!({ "scope": "project", "patch": { "a": 1 } }),
        ))
        .await
        .unwrap();
    let user_with_project = client
        .request(&RequestSpec::command(
            "settings.update",
            None,
            json!({ "scope": "user", "projectPath": PROJECT, "patch": { "a": 1 } }),
        ))
        .await
        .unwrap();
    for (refused, says) in [
        (&large, "64 KiB"),
        (&many, "512 keys"),
        (&no_project, "projectPath"),
        (&user_with_project, "drop projectPath"),
    ] {
        assert_eq!(refused.outcome, "rejected", "{:?}", refused.frame);
        assert_eq!(refused.frame["error"]["code"], "schemaInvalid");
        let message = refused.frame["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
    assert_eq!(
        current(&mut client).await,
        before,
        "a refused patch changes nothing"
    );
    assert_eq!(changes(&server).len(), 1);
}

/// A run's view shows the settings revisions in effect when it started; a
/// later change does not move them; its checkpoint continuation keeps the
/// parent's; a run started after the change shows the new revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_view_shows_the_revisions_it_started_with_and_its_continuation_keeps_them() {
    let server = TestServer::start();
    let mut client = server.client().await;
    assert_eq!(
        revision(&update(&mut client, "user", json!({ "a": 1 })).await),
        1
    );
    assert_eq!(
        revision(&update(&mut client, "user", json!({ "a": 2 })).await),
        2
    );
    assert_eq!(
        revision(&update(&mut client, "project", json!({ "b": 1 })).await),
        1
    );

    let parent = started_interactive(
        &mut client,
        &script("checkpoint.json"),
        "session-settings",
        json!({}),
    )
    .await;
    let view = wait_settled(&mut client, &parent).await;
    assert_eq!(status(&view), "waiting");
    assert_eq!(view["settings"], json!({ "user": 2, "project": 1 }));

    assert_eq!(
        revision(&update(&mut client, "user", json!({ "a": 3 })).await),
        3
    );
    assert_eq!(
        view_of(&mut client, &parent).await["settings"],
        json!({ "user": 2, "project": 1 }),
        "a later change does not move a run's binding"
    );
    let continuation = answered_checkpoint(&mut client, &parent).await;
    let continued = wait_settled(&mut client, &continuation).await;
    assert_eq!(
        continued["settings"],
        json!({ "user": 2, "project": 1 }),
        "the continuation keeps its parent's"
    );

    let fresh = started(&mut client, &script("linear.json")).await;
    let fresh = wait_settled(&mut client, &fresh).await;
    assert_eq!(fresh["settings"], json!({ "user": 3, "project": 1 }));
}

async fn view_of(client: &mut Client, run_id: &str) -> Value {
    view(client, run_id).await
}

/// `pi-workflows settings set KEY=VALUE…` (VALUE as JSON or text, null
/// deletes), `--project` (this directory's project), `settings` and
/// `--json`; a malformed pair is one usage line saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_shows_and_sets_settings() {
    let server = TestServer::start();
    let project = server.scratch().join("project");
    std::fs::create_dir_all(&project).unwrap();
    let cli = |args: &[&str]| {
        let output = server
            .command()
            .current_dir(&project)
            .args(args)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stdout, _) = cli(&["settings", "set", "theme=dark", "tabs=4", "gone=null"]);
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "user settings at revision 1\n")
    );
    let (code, stdout, _) = cli(&["settings", "set", "--project", "model=fast"]);
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "project settings at revision 1\n")
    );
    let (code, stdout, _) = cli(&["settings", "--json"]);
    assert_eq!(code, Some(0));
    let shown: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        shown,
        json!({ "user": { "revision": 1, "value": { "theme": "dark", "tabs": 4 } },
                "project": { "revision": 1, "value": { "model": "fast" } } })
    );
    let (code, stdout, _) = cli(&["settings"]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("user settings, revision 1:"), "{stdout}");
    assert!(stdout.contains("\"theme\": \"dark\""), "{stdout}");

    let (code, stdout, stderr) = cli(&["settings", "set", "theme"]);
    assert_eq!(code, Some(2));
    assert!(stdout.is_empty());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("KEY=VALUE") && stderr.contains("e.g."),
        "{stderr}"
    );
    let (code, _, stderr) = cli(&["settings", "set", &format!("note={}", "x".repeat(70_000))]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("delete or shorten"), "{stderr}");
}
