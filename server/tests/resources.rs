//! Managed resources through the real socket, the real server binary and a
//! real state file, with the scripted controller child
//! (`pi-workflows-scripted-controller` as `PI_WORKFLOWS_CONTROLLER_RUNNER`)
//! resolving each apply: a new resource is version 1 and generation 1 with
//! its initial status and a queue row; the same spec writes nothing; a
//! changed spec advances the generation; a controller file that changed (or
//! that discovery no longer names) between resolve and commit is refused
//! and nothing is written; reconcile enqueues; delete marks the deletion;
//! receipts are idempotent; `resource.get` and `resource.list` show it; no
//! spec reaches a log. The CLI's resource commands too.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec, Response};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use support::*;

const CONTROLLER: &str = "repos";

fn start_server(extra: &[(&str, &str)]) -> TestServer {
    let mut env = vec![(
        "PI_WORKFLOWS_CONTROLLER_RUNNER",
        env!("CARGO_BIN_EXE_pi-workflows-scripted-controller"),
    )];
    env.extend_from_slice(extra);
    TestServer::start_with(&env)
}

/// `<scratch>/project` with `.pi/controllers/repos.controller.ts`.
fn project_with_controller(server: &TestServer) -> PathBuf {
    let project = server.scratch().join("project");
    let file = project.join(".pi/controllers/repos.controller.ts");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "export default {};\n").unwrap();
    project
}

fn apply_spec(project: &Path, key: &str, spec: Value) -> RequestSpec {
    RequestSpec::command(
        "resource.apply",
        None,
        json!({ "controller": CONTROLLER, "key": key, "spec": spec, "projectPath": project }),
    )
}

fn ref_spec(operation: &str, key: &str) -> RequestSpec {
    RequestSpec::command(
        operation,
        None,
        json!({ "controller": CONTROLLER, "key": key }),
    )
}

fn version(response: &Response) -> u64 {
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
    response.receipt.as_ref().unwrap()["resourceVersion"]
        .as_u64()
        .unwrap()
}

async fn get(client: &mut Client, key: &str) -> Response {
    client
        .request(&RequestSpec::read(
            "resource.get",
            None,
            json!({ "controller": CONTROLLER, "key": key }),
        ))
        .await
        .unwrap()
}

/// (resource_version, generation, controller status, deletion requested).
fn resource_row(server: &TestServer, key: &str) -> Option<(i64, i64, Value, bool)> {
    let db = server.db();
    db.query_row(
        "SELECT resource_version, generation, status_json, deletion_requested_at_ms IS NOT NULL
         FROM resources WHERE controller = ?1 AND resource_key = ?2",
        [CONTROLLER, key],
        |row| {
            let status: Value = serde_json::from_str(&row.get::<_, String>(2)?).unwrap();
            Ok((
                row.get(0)?,
                row.get(1)?,
                status["controllerStatus"].clone(),
                row.get(3)?,
            ))
        },
    )
    .ok()
}

/// The queue row's enqueue count (`None`: no row).
fn queue_version(server: &TestServer, key: &str) -> Option<i64> {
    server
        .db()
        .query_row(
            "SELECT q.version FROM resource_queue q JOIN resources r ON r.uid = q.resource_uid
             WHERE r.controller = ?1 AND r.resource_key = ?2 AND q.available_at_ms IS NOT NULL",
            [CONTROLLER, key],
            |row| row.get(0),
        )
        .ok()
}

fn event_kinds(server: &TestServer, key: &str) -> Vec<String> {
    let db = server.db();
    let mut statement = db
        .prepare("SELECT kind FROM resource_events WHERE controller = ?1 AND resource_key = ?2 ORDER BY seq")
        .unwrap();
    statement
        .query_map([CONTROLLER, key], |row| row.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Every file under `dir` but the state database, as text.
fn logs_text(dir: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "project" {
                text.push_str(&logs_text(&path));
            }
        } else if !name.starts_with("state.sqlite") {
            text.push_str(&String::from_utf8_lossy(
                &std::fs::read(&path).unwrap_or_default(),
            ));
        }
    }
    text
}

/// A new resource is version 1, generation 1, with `initialStatus` and an
/// available queue row; the same spec again writes nothing (same version,
/// no event, no enqueue); the same request adopts its receipt; a changed
/// spec is version 2, generation 2, keeps its status and enqueues again;
/// `resource.get` and `resource.list` show it; the spec never reaches a log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_creates_then_advances_the_generation_only_when_the_spec_changes() {
    let server = start_server(&[]);
    let project = project_with_controller(&server);
    let mut client = server.client().await;
    let spec = json!({ "initialStatus": { "phase": "new" }, "repo": "acme/widgets", "token": "spec-secret-41" });

    let first_request = apply_spec(&project, "acme#1", spec.clone());
    let first = client.request(&first_request).await.unwrap();
    assert_eq!(version(&first), 1);
    assert_eq!(
        resource_row(&server, "acme#1"),
        Some((1, 1, json!({ "phase": "new" }), false))
    );
    assert_eq!(
        queue_version(&server, "acme#1"),
        Some(1),
        "an available queue row"
    );
    assert_eq!(event_kinds(&server, "acme#1"), ["applied"]);

    let adopted = client.request(&first_request).await.unwrap();
    assert_eq!(adopted.outcome, "adopted", "{:?}", adopted.frame);
    assert_eq!(adopted.receipt, first.receipt);

    let same = client
        .request(&apply_spec(&project, "acme#1", spec.clone()))
        .await
        .unwrap();
    assert_eq!(version(&same), 1, "the same spec keeps the version");
    assert_eq!(
        queue_version(&server, "acme#1"),
        Some(1),
        "and enqueues nothing"
    );
    assert_eq!(
        event_kinds(&server, "acme#1"),
        ["applied"],
        "and appends no event"
    );

    let mut changed_spec = spec.clone();
    changed_spec["repo"] = json!("acme/gadgets");
    changed_spec["initialStatus"] = json!({ "phase": "other" });
    let changed = client
        .request(&apply_spec(&project, "acme#1", changed_spec.clone()))
        .await
        .unwrap();
    assert_eq!(version(&changed), 2);
    assert_eq!(
        resource_row(&server, "acme#1"),
        Some((2, 2, json!({ "phase": "new" }), false)),
        "generation 2; the status is not reset by a new spec"
    );
    assert_eq!(queue_version(&server, "acme#1"), Some(2));
    assert_eq!(event_kinds(&server, "acme#1"), ["applied", "applied"]);

    let view = get(&mut client, "acme#1").await;
    assert_eq!(view.outcome, "accepted", "{:?}", view.frame);
    let view = view.receipt.unwrap();
    assert_eq!(view["spec"], changed_spec);
    assert_eq!(
        (
            view["resourceVersion"].as_u64(),
            view["generation"].as_u64()
        ),
        (Some(2), Some(2))
    );
    assert_eq!(
        view["status"],
        json!({ "observedGeneration": 0, "conditions": [], "controllerStatus": { "phase": "new" }, "workflowRun": null })
    );
    assert_eq!(view["queue"]["version"], json!(2));
    assert_eq!(view["queue"]["claimed"], json!(false));
    assert!(view["queue"].get("claimGeneration").is_none());
    assert_eq!(
        (view["effects"].clone(), view["childWorkflows"].clone()),
        (json!([]), json!([]))
    );
    let events: Vec<_> = view["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].clone())
        .collect();
    assert_eq!(events, [json!("applied"), json!("applied")]);
    assert_eq!(view["events"][1]["detail"], json!("the spec changed"));

    let list = client
        .request(&RequestSpec::read("resource.list", None, json!({})))
        .await
        .unwrap();
    assert_eq!(
        list.receipt.unwrap(),
        json!({ "resources": [{
            "controller": CONTROLLER, "key": "acme#1", "resourceVersion": 2, "generation": 2,
            "observedGeneration": 0, "deleting": false, "consecutiveErrors": 0,
            "updatedAtMs": view["updatedAtMs"],
        }] })
    );
    let other = client
        .request(&RequestSpec::read(
            "resource.list",
            None,
            json!({ "controller": "other" }),
        ))
        .await
        .unwrap();
    assert_eq!(other.receipt.unwrap(), json!({ "resources": [] }));

    let logs = logs_text(server.scratch());
    assert!(
        logs.contains("scripted-controller: resolved"),
        "the child logged to the runner logs"
    );
    assert!(!logs.contains("spec-secret-41"), "a spec reached a log");
}

/// The receipt transaction re-checks the resolved source: a file that
/// changed after the child hashed it, or a project controller that appeared
/// and now shadows the resolved home one, is `conflict` and writes nothing;
/// the conflict is not stored, so the same request later succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_source_that_changed_between_resolve_and_commit_is_refused() {
    let server = start_server(&[]);
    let project = project_with_controller(&server);
    let mut client = server.client().await;

    let changed = client
        .request(&apply_spec(
            &project,
            "k1",
            json!({ "changeSourceAfterDigest": true }),
        ))
        .await
        .unwrap();
    assert_eq!(changed.outcome, "conflict", "{:?}", changed.frame);
    assert_eq!(changed.error_code.as_deref(), Some("conflict"));
    assert_eq!(
        changed.error_message.as_deref(),
        Some("the controller file changed while it was being resolved; apply again")
    );
    assert_eq!(resource_row(&server, "k1"), None);
    assert!(event_kinds(&server, "k1").is_empty());

    // A home controller, shadowed by a project one the child creates.
    let home_controllers = server.scratch().join(".pi/agent/controllers");
    std::fs::create_dir_all(&home_controllers).unwrap();
    std::fs::write(
        home_controllers.join("repos.controller.js"),
        "export default {};\n",
    )
    .unwrap();
    let other_project = server.scratch().join("other");
    std::fs::create_dir_all(&other_project).unwrap();
    let shadowed_request = apply_spec(&other_project, "k2", json!({ "shadowAfterResolve": true }));
    let shadowed = client.request(&shadowed_request).await.unwrap();
    assert_eq!(shadowed.outcome, "conflict", "{:?}", shadowed.frame);
    assert_eq!(
        shadowed.error_message.as_deref(),
        Some("discovery now finds another file (or none) for this controller; apply again")
    );
    assert_eq!(resource_row(&server, "k2"), None);

    // Not stored: the same request resolves again (now the project's file).
    let retried = client.request(&shadowed_request).await.unwrap();
    assert_eq!(version(&retried), 1);
    let path: String = server
        .db()
        .query_row(
            "SELECT controller_path FROM resources WHERE resource_key = 'k2'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert!(
        path.ends_with("other/.pi/controllers/repos.controller.ts"),
        "{path}"
    );
}

/// `resource.reconcile` enqueues (an event, the queue's count grows);
/// `resource.delete` marks the deletion (version + 1) and enqueues, a
/// second delete changes nothing, an apply to a deleting resource is
/// refused; retries adopt their receipts; a missing resource is notFound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_enqueues_and_delete_marks_the_deletion_with_idempotent_receipts() {
    let server = start_server(&[]);
    let project = project_with_controller(&server);
    let mut client = server.client().await;
    assert_eq!(
        version(
            &client
                .request(&apply_spec(&project, "k", json!({})))
                .await
                .unwrap()
        ),
        1
    );

    let reconcile = ref_spec("resource.reconcile", "k");
    let first = client.request(&reconcile).await.unwrap();
    assert_eq!(version(&first), 1, "reconcile writes no resource version");
    assert_eq!(queue_version(&server, "k"), Some(2));
    let adopted = client.request(&reconcile).await.unwrap();
    assert_eq!(adopted.outcome, "adopted", "{:?}", adopted.frame);
    assert_eq!(
        queue_version(&server, "k"),
        Some(2),
        "a retry enqueues nothing more"
    );

    let delete = ref_spec("resource.delete", "k");
    assert_eq!(version(&client.request(&delete).await.unwrap()), 2);
    let (resource_version, _, _, deleting) = resource_row(&server, "k").unwrap();
    assert_eq!((resource_version, deleting), (2, true));
    assert_eq!(queue_version(&server, "k"), Some(3));
    let again = client
        .request(&ref_spec("resource.delete", "k"))
        .await
        .unwrap();
    assert_eq!(version(&again), 2, "a second delete changes nothing");
    assert_eq!(queue_version(&server, "k"), Some(3));
    assert_eq!(
        event_kinds(&server, "k"),
        ["applied", "reconcile_requested", "deletion_requested"]
    );

    let refused = client
        .request(&apply_spec(&project, "k", json!({ "new": true })))
        .await
        .unwrap();
    assert_eq!(refused.outcome, "rejected", "{:?}", refused.frame);
    assert_eq!(refused.error_code.as_deref(), Some("illegalTransition"));
    let view = get(&mut client, "k").await.receipt.unwrap();
    assert!(view["deletionRequestedAtMs"].as_u64().is_some());
    let list = client
        .request(&RequestSpec::read(
            "resource.list",
            None,
            json!({ "controller": CONTROLLER }),
        ))
        .await
        .unwrap();
    assert_eq!(
        list.receipt.unwrap()["resources"][0]["deleting"],
        json!(true)
    );

    for operation in ["resource.reconcile", "resource.delete"] {
        let missing = client
            .request(&ref_spec(operation, "missing"))
            .await
            .unwrap();
        assert_eq!(
            missing.outcome, "notFound",
            "{operation}: {:?}",
            missing.frame
        );
        assert_eq!(
            missing.error_message.as_deref(),
            Some("no such resource; list them with `pi-workflows resources`")
        );
    }
    assert_eq!(get(&mut client, "missing").await.outcome, "notFound");
}

/// A controller that is not discovered, one the child cannot resolve, one
/// that exits without an answer and one that answers too late are each one
/// line with a closed code, and write nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_failures_are_closed_codes_with_one_line_and_write_nothing() {
    let server = start_server(&[("PI_WORKFLOWS_READY_TIMEOUT_MS", "1500")]);
    let project = project_with_controller(&server);
    let mut client = server.client().await;
    let refused = |response: &Response| {
        (
            response.outcome.clone(),
            response.error_code.clone().unwrap_or_default(),
            response.error_message.clone().unwrap_or_default(),
        )
    };

    let unknown = client
        .request(&RequestSpec::command(
            "resource.apply",
            None,
            json!({ "controller": "deploy", "key": "k", "spec": {}, "projectPath": project }),
        ))
        .await
        .unwrap();
    let (outcome, code, message) = refused(&unknown);
    assert_eq!((outcome.as_str(), code.as_str()), ("notFound", "notFound"));
    assert!(
        message.starts_with("no controller named deploy is discovered; add deploy.controller.ts"),
        "{message}"
    );

    let bad_name = client
        .request(&RequestSpec::command(
            "resource.apply",
            None,
            json!({ "controller": "Repos", "key": "k", "spec": {}, "projectPath": project }),
        ))
        .await
        .unwrap();
    assert_eq!(refused(&bad_name).1, "schemaInvalid");

    for (spec, outcome, code, says) in [
        (
            json!({ "resolveFail": "compileFailed" }),
            "rejected",
            "validationFailed",
            "told to fail",
        ),
        (
            json!({ "resolveExit": true }),
            "rejected",
            "validationFailed",
            "exited without resolving",
        ),
        (
            json!({ "resolveDelayMs": 4000 }),
            "unavailable",
            "timedOut",
            "did not resolve the controller in time",
        ),
    ] {
        let response = client
            .request(&apply_spec(&project, "k", spec.clone()))
            .await
            .unwrap();
        let (found_outcome, found_code, message) = refused(&response);
        assert_eq!(
            (found_outcome.as_str(), found_code.as_str()),
            (outcome, code),
            "{spec}: {message}"
        );
        assert!(
            message.contains(says) && !message.contains('\n'),
            "{spec}: {message}"
        );
    }
    assert_eq!(resource_row(&server, "k"), None);
    assert_eq!(
        count(&server.db(), "SELECT count(*) FROM resource_events", []),
        0
    );
}

/// `apply`, `resources`, `resource`, `reconcile` and `delete` print one
/// result line (or the view), `--json` prints the receipt or view, and
/// every error is one line saying what to do next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_applies_lists_shows_reconciles_and_deletes_resources() {
    let server = start_server(&[]);
    let project = project_with_controller(&server);
    let spec_file = server.scratch().join("spec.json");
    std::fs::write(
        &spec_file,
        r#"{"initialStatus": {"phase": "new"}, "repo": "acme/widgets"}"#,
    )
    .unwrap();
    let spec_path = spec_file.to_str().unwrap();
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

    let (code, stdout, _) = cli(&["resources"]);
    assert_eq!(
        (code, stdout.as_str()),
        (
            Some(0),
            "no resources yet; apply one with `pi-workflows apply <controller> <key> <spec.json>`\n"
        )
    );
    let (code, stdout, stderr) = cli(&["apply", "repos", "acme#1", spec_path]);
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "applied repos/acme#1: resource version 1\n"),
        "{stderr}"
    );
    let (code, stdout, _) = cli(&["apply", "repos", "acme#1", spec_path, "--json"]);
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), "{\"resourceVersion\":1}\n")
    );
    let (code, stdout, _) = cli(&["resources"]);
    assert_eq!(
        (code, stdout.as_str()),
        (
            Some(0),
            "repos/acme#1  ready=none  generation 1 (observed 0)  version 1\n"
        )
    );
    let (code, stdout, _) = cli(&["resources", "--json"]);
    assert_eq!(code, Some(0));
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed["resources"][0]["key"], json!("acme#1"));

    let (code, stdout, _) = cli(&["resource", "repos", "acme#1"]);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("repos/acme#1  uid "), "{stdout}");
    assert!(
        lines[0].ends_with("  version 1  generation 1 (observed 0)"),
        "{stdout}"
    );
    for expected in [
        "spec: {\"initialStatus\":{\"phase\":\"new\"},\"repo\":\"acme/widgets\"}",
        "status: {\"phase\":\"new\"}",
        "effects: none",
        "child runs: none",
        "recent events:",
    ] {
        assert!(lines.contains(&expected), "{expected:?} in\n{stdout}");
    }
    assert!(
        lines
            .last()
            .unwrap()
            .ends_with(" applied (version 1): created"),
        "{stdout}"
    );
    let (code, stdout, _) = cli(&["resource", "repos", "acme#1", "--json"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        serde_json::from_str::<Value>(&stdout).unwrap()["generation"],
        json!(1)
    );

    let (code, stdout, _) = cli(&["reconcile", "repos", "acme#1"]);
    assert_eq!(
        (code, stdout.as_str()),
        (
            Some(0),
            "repos/acme#1 is queued for reconcile (resource version 1)\n"
        )
    );
    let (code, stdout, _) = cli(&["delete", "repos", "acme#1"]);
    assert_eq!(
        (code, stdout.as_str()),
        (
            Some(0),
            "deletion of repos/acme#1 requested (resource version 2); it is gone once its controller settles it\n"
        )
    );
    let (code, stdout, _) = cli(&["resources"]);
    assert_eq!(
        (code, stdout.as_str()),
        (
            Some(0),
            "repos/acme#1  ready=none  generation 1 (observed 0)  version 2  deleting\n"
        )
    );

    let bad_json = server.scratch().join("bad.json");
    std::fs::write(&bad_json, "{ not json").unwrap();
    let missing_file = server.scratch().join("missing.json");
    for (args, exit, says) in [
        (
            vec!["resource", "repos", "missing"],
            4,
            "pi-workflows: no such resource; list them with `pi-workflows resources`",
        ),
        (
            vec!["reconcile", "repos", "missing"],
            4,
            "pi-workflows: no such resource; list them with `pi-workflows resources`",
        ),
        (
            vec!["delete", "repos", "missing"],
            4,
            "pi-workflows: no such resource; list them with `pi-workflows resources`",
        ),
        (
            vec!["apply", "deploy", "k", spec_path],
            4,
            "pi-workflows: no controller named deploy is discovered; add deploy.controller.ts",
        ),
        (
            vec!["apply", "repos", "acme#1", spec_path],
            1,
            "pi-workflows: the resource is being deleted; wait until it is gone, then apply it again",
        ),
        (
            vec!["apply", "repos", "k", missing_file.to_str().unwrap()],
            2,
            "pi-workflows: cannot read the spec file; check its path and permissions",
        ),
        (
            vec!["apply", "repos", "k", bad_json.to_str().unwrap()],
            2,
            "pi-workflows: the spec file is not JSON; fix it and apply again",
        ),
    ] {
        let (code, stdout, stderr) = cli(&args);
        assert_eq!(code, Some(exit), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(says), "{args:?}: {stderr}");
    }
}
