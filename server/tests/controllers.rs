//! Reconcile supervision through the real server binary, the real socket, a
//! real state file and the scripted controller child
//! (`pi-workflows-scripted-controller` as `PI_WORKFLOWS_CONTROLLER_RUNNER`,
//! its reconcile script in the resource's spec): a pass settles Ready; a
//! child SIGKILLed after its effect applied resumes by observing (the effect
//! is applied once); a non-cooperative pass past its deadline is killed
//! (its group gone) and backs off with an error; a conflicting status write
//! requeues at once without an error; deletion waits for the finalizer;
//! reconciles share the one capacity with workflow runs; reconciliation
//! continues after a server crash with no client connected.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::*;

const CONTROLLER: &str = "repos";
const WAIT: Duration = Duration::from_secs(20);

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

async fn apply(client: &mut Client, project: &Path, key: &str, spec: Value) {
    let response = client
        .request(&RequestSpec::command(
            "resource.apply",
            None,
            json!({ "controller": CONTROLLER, "key": key, "spec": spec, "projectPath": project }),
        ))
        .await
        .unwrap();
    assert_eq!(response.outcome, "accepted", "{:?}", response.frame);
}

fn path(server: &TestServer, name: &str) -> String {
    server.scratch().join(name).to_string_lossy().into_owned()
}

fn ready_patch() -> Value {
    json!({ "conditions": [{ "type": "Ready", "status": "true", "reason": "Converged" }] })
}

/// The stored status document (`None`: no row).
fn status(server: &TestServer, key: &str) -> Option<Value> {
    server
        .db()
        .query_row(
            "SELECT status_json FROM resources WHERE controller = ?1 AND resource_key = ?2",
            [CONTROLLER, key],
            |row| row.get::<_, String>(0),
        )
        .ok()
        .map(|text| serde_json::from_str(&text).unwrap())
}

fn is_ready(status: &Value) -> bool {
    status["conditions"].as_array().is_some_and(|conditions| {
        conditions
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "true")
    })
}

/// (available_at_ms, consecutive_errors, last_error, claimed).
fn queue(server: &TestServer, key: &str) -> Option<(Option<i64>, i64, Option<String>, bool)> {
    server
        .db()
        .query_row(
            "SELECT q.available_at_ms, q.consecutive_errors, q.last_error, q.claim_expires_at_ms IS NOT NULL
             FROM resource_queue q JOIN resources r ON r.uid = q.resource_uid
             WHERE r.controller = ?1 AND r.resource_key = ?2",
            [CONTROLLER, key],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .ok()
}

fn events(server: &TestServer, key: &str) -> Vec<String> {
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

fn lines(file: &str) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn wait_ready(server: &TestServer, key: &str) -> Value {
    wait_for(WAIT, "the resource to be Ready", || {
        status(server, key).filter(is_ready)
    })
    .await
}

/// The queue row is idle (settled, nothing enqueued) and unclaimed.
async fn wait_idle(server: &TestServer, key: &str) {
    wait_for(WAIT, "the queue row to be idle", || {
        queue(server, key).filter(|(at, _, _, claimed)| at.is_none() && !claimed)
    })
    .await;
}

/// A pass applies its effect once and settles Ready: the conditions show in
/// `resource.get`, the status's observed generation is the spec's, the
/// queue row is idle, and the events tell the pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_applies_reconciles_and_settles_ready() {
    let server = start_server(&[]);
    let project = project_with_controller(&server);
    let log = path(&server, "apply.log");
    let mut client = server.client().await;
    let spec = json!({
        "reconcile": [
            { "effect": { "key": "announce", "log": log, "line": "hello" } },
            { "finish": "settled", "patch": ready_patch() },
        ]
    });
    apply(&mut client, &project, "acme#1", spec).await;
    let status = wait_ready(&server, "acme#1").await;
    assert_eq!(status["observedGeneration"], json!(1));
    wait_idle(&server, "acme#1").await;
    assert_eq!(lines(&log), ["hello"]);
    let view = client
        .request(&RequestSpec::read(
            "resource.get",
            None,
            json!({ "controller": CONTROLLER, "key": "acme#1" }),
        ))
        .await
        .unwrap();
    assert_eq!(view.outcome, "accepted", "{:?}", view.frame);
    let view = view.receipt.unwrap();
    assert_eq!(view["status"]["conditions"][0]["type"], json!("Ready"));
    assert_eq!(view["status"]["conditions"][0]["status"], json!("true"));
    assert_eq!(view["effects"][0]["state"], json!("applied"));
    assert_eq!(
        events(&server, "acme#1"),
        [
            "applied",
            "reconcile_started",
            "effect_reserved",
            "effect_settled",
            "reconcile_settled"
        ]
    );
}

/// A child SIGKILLed right after its effect applied (before it could say
/// so) is a failed pass; the next pass finds the pending effect, observes
/// it applied and never applies it again: the apply log has one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_killed_after_its_effect_applied_resumes_without_applying_again() {
    let server = start_server(&[]);
    let project = project_with_controller(&server);
    let log = path(&server, "apply.log");
    let crashed = path(&server, "crashed");
    let mut client = server.client().await;
    let spec = json!({
        "reconcile": [
            { "effect": { "key": "merge", "log": log, "line": "merged", "crashAfterApply": crashed } },
            { "finish": "settled", "patch": ready_patch() },
        ]
    });
    apply(&mut client, &project, "acme#2", spec).await;
    wait_ready(&server, "acme#2").await;
    wait_idle(&server, "acme#2").await;
    assert!(Path::new(&crashed).exists(), "the first pass was killed");
    assert_eq!(lines(&log), ["merged"], "applied exactly once");
    let kinds = events(&server, "acme#2");
    assert!(kinds.contains(&"reconcile_failed".to_owned()), "{kinds:?}");
    assert!(kinds.contains(&"effect_recovered".to_owned()), "{kinds:?}");
    assert_eq!(
        kinds
            .iter()
            .filter(|kind| *kind == "effect_reserved")
            .count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        queue(&server, "acme#2").unwrap().1,
        0,
        "a success resets the errors"
    );
}

/// A pass that ignores its deadline (sleeping, SIGTERM ignored) is killed
/// a grace after `timeoutMs`: its process is gone, the row is finished as an
/// error (one consecutive error, a backoff in the future, the reason
/// stored) and the next pass settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_past_its_deadline_is_killed_and_requeued_with_backoff() {
    let server = start_server(&[("PI_WORKFLOWS_RECONCILE_TIMEOUT_MS", "300")]);
    let project = project_with_controller(&server);
    let pid_file = path(&server, "pid");
    let marker = path(&server, "slept");
    let mut client = server.client().await;
    let spec = json!({
        "reconcile": [
            { "writePid": pid_file },
            { "once": marker, "steps": [{ "sleep": 30000 }] },
            { "finish": "settled", "patch": ready_patch() },
        ]
    });
    apply(&mut client, &project, "acme#3", spec).await;
    let (available_at, errors, last_error) =
        wait_for(WAIT, "the deadline to fail the pass", || {
            queue(&server, "acme#3")
                .and_then(|(at, errors, error, _)| (errors == 1).then_some((at, errors, error)))
        })
        .await;
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().parse().unwrap();
    let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
        || std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| stat.contains(") Z "))
            .unwrap_or(true);
    assert!(gone, "the child's process is gone");
    assert_eq!(errors, 1);
    assert!(last_error.unwrap().contains("deadline"));
    assert!(available_at.is_some(), "backed off, not idle");
    assert!(events(&server, "acme#3").contains(&"reconcile_failed".to_owned()));
    wait_ready(&server, "acme#3").await;
    wait_idle(&server, "acme#3").await;
}

/// The resource is re-applied while a pass runs: the pass's status write
/// loses its compare-and-swap, the row is requeued at once without an
/// error, and the next pass settles the new generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_status_write_requeues_at_once_without_an_error() {
    let server = start_server(&[]);
    let project = project_with_controller(&server);
    let marker = path(&server, "paused");
    let mut client = server.client().await;
    let spec = |revision: u64| {
        json!({
            "revision": revision,
            "reconcile": [
                { "once": marker, "steps": [{ "sleep": 1500 }] },
                { "finish": "settled", "patch": ready_patch() },
            ]
        })
    };
    apply(&mut client, &project, "acme#4", spec(1)).await;
    wait_for(WAIT, "the first pass to pause", || {
        Path::new(&marker).exists().then_some(())
    })
    .await;
    apply(&mut client, &project, "acme#4", spec(2)).await;
    let status = wait_for(WAIT, "generation 2 observed and Ready", || {
        status(&server, "acme#4").filter(|s| is_ready(s) && s["observedGeneration"] == 2)
    })
    .await;
    assert_eq!(status["observedGeneration"], json!(2));
    wait_idle(&server, "acme#4").await;
    let kinds = events(&server, "acme#4");
    assert!(
        kinds.contains(&"reconcile_conflict".to_owned()),
        "{kinds:?}"
    );
    assert!(!kinds.contains(&"reconcile_failed".to_owned()), "{kinds:?}");
    assert_eq!(queue(&server, "acme#4").unwrap().1, 0, "no error counted");
}

/// A resource holding a finalizer stays after `resource.delete`, even when
/// a pass settles, until a pass removes the finalizer; then its row is gone
/// and `resource_deleted` is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_waits_for_the_finalizer_then_deletes_the_row() {
    let server = start_server(&[]);
    let project = project_with_controller(&server);
    let log = path(&server, "cleanup.log");
    let marker = path(&server, "deleting-once");
    let mut client = server.client().await;
    let spec = json!({
        "reconcile": [
            { "finish": "settled", "patch": { "finalizers": ["cleanup"], "conditions": ready_patch()["conditions"] } },
        ],
        "reconcileDeleting": [
            { "once": marker, "steps": [{ "finish": "settled", "patch": {} }] },
            { "effect": { "key": "cleanup", "log": log, "line": "cleaned" } },
            { "finish": "settled", "patch": { "finalizers": [] } },
        ]
    });
    apply(&mut client, &project, "acme#5", spec).await;
    wait_ready(&server, "acme#5").await;
    wait_idle(&server, "acme#5").await;
    let reference = json!({ "controller": CONTROLLER, "key": "acme#5" });
    let deleted = client
        .request(&RequestSpec::command(
            "resource.delete",
            None,
            reference.clone(),
        ))
        .await
        .unwrap();
    assert_eq!(deleted.outcome, "accepted", "{:?}", deleted.frame);
    wait_for(
        WAIT,
        "a deleting pass that settles keeping the finalizer",
        || Path::new(&marker).exists().then_some(()),
    )
    .await;
    wait_idle(&server, "acme#5").await;
    assert!(
        status(&server, "acme#5").is_some(),
        "the row stays while the finalizer is held"
    );
    let reconciled = client
        .request(&RequestSpec::command("resource.reconcile", None, reference))
        .await
        .unwrap();
    assert_eq!(reconciled.outcome, "accepted", "{:?}", reconciled.frame);
    wait_for(WAIT, "the row to be deleted", || {
        status(&server, "acme#5").is_none().then_some(())
    })
    .await;
    assert_eq!(lines(&log), ["cleaned"]);
    let kinds = events(&server, "acme#5");
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("resource_deleted"),
        "{kinds:?}"
    );
}

/// With one worker slot, a workflow run and reconcile passes both progress:
/// they take turns in the one capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_and_workflow_work_share_one_worker() {
    let server = start_server(&[("PI_WORKFLOWS_MAX_WORKERS", "1")]);
    let project = project_with_controller(&server);
    let mut client = server.client().await;
    let spec = json!({
        "reconcile": [
            { "sleep": 200 },
            { "finish": "settled", "patch": ready_patch() },
        ]
    });
    apply(&mut client, &project, "acme#6", spec.clone()).await;
    let script = linear_script(server.scratch(), "shared", 3);
    let run_id = started(&mut client, &script).await;
    apply(&mut client, &project, "acme#7", spec).await;
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status_of(&view), "completed", "{view}");
    wait_ready(&server, "acme#6").await;
    wait_ready(&server, "acme#7").await;
}

fn status_of(view: &Value) -> &str {
    support::status(view)
}

/// The server crashes while a pass runs; a new server with no client
/// connected releases the abandoned claim and reconciles to Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_continues_after_a_server_restart_with_no_client() {
    let mut server = start_server(&[]);
    let project = project_with_controller(&server);
    let marker = path(&server, "in-flight");
    {
        let mut client = server.client().await;
        let spec = json!({
            "reconcile": [
                { "once": marker, "steps": [{ "sleep": 3000 }] },
                { "finish": "settled", "patch": ready_patch() },
            ]
        });
        apply(&mut client, &project, "acme#8", spec).await;
    }
    wait_for(WAIT, "a pass in flight", || {
        Path::new(&marker).exists().then_some(())
    })
    .await;
    server.kill();
    assert!(
        queue(&server, "acme#8").unwrap().3,
        "the crash left the claim"
    );
    server.spawn().expect("the server starts again");
    wait_ready(&server, "acme#8").await;
    wait_idle(&server, "acme#8").await;
    let started = events(&server, "acme#8")
        .iter()
        .filter(|kind| *kind == "reconcile_started")
        .count();
    assert_eq!(started, 2, "the restarted server ran a new pass");
}
