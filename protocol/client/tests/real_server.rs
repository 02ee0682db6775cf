//! The client against the real server binary: receipt adoption after the
//! server dies mid-command, subscriptions restored after a restart (patches
//! from a retained revision, a snapshot from a stale one), verified content,
//! the package-version check and on-demand start.

mod support;

use pi_workflows_client::{CallOptions, ClientError, Delivery, LiveView, WorkflowClient, ops};
use protocol::generated::types;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::{Server, script};

fn start_payload(script: &std::path::Path) -> Value {
    json!({ "workflow": script.to_string_lossy(), "input": {}, "executionMode": "headless", "projectPath": "/tmp" })
}

async fn start_run(client: &mut WorkflowClient, name: &str) -> String {
    client
        .call_json::<ops::RunStart>(None, start_payload(&script(name)), CallOptions::default())
        .await
        .expect("run.start")
        .receipt
        .run_id
        .as_str()
        .to_owned()
}

/// Polls the run view until its display status is `status` (bounded).
async fn wait_status(client: &mut WorkflowClient, run_id: &str, status: &str) -> types::RunView {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = client.run_view(run_id).await.expect("run.view");
        if serde_json::to_value(&view.display).unwrap()["status"] == status {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "run {run_id} did not reach {status}"
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

async fn run_ids(client: &mut WorkflowClient) -> Vec<String> {
    let page = client
        .call_json::<ops::RunsList>(None, json!({ "limit": 100 }), CallOptions::default())
        .await
        .expect("runs.list");
    page.receipt
        .rows
        .iter()
        .map(|row| row.run_id.as_str().to_owned())
        .collect()
}

/// Starts `checkpoint.json` on a server armed with `fault`; the client
/// starts a new server when its connection drops and sends the command
/// again (new request id, same client id and key). Returns whether the
/// server was ready and whether the retry adopted the stored receipt, after
/// checking that exactly the run of the receipt exists.
async fn start_under_fault(fault: &str) -> Option<bool> {
    let mut server = Server::new();
    // Err: the fault hit during startup.
    server.spawn(&[("PI_WORKFLOWS_FAULT", fault)]).ok()?;
    let mut client = WorkflowClient::new(server.starting_options());
    let started = client
        .call_json::<ops::RunStart>(
            None,
            start_payload(&script("checkpoint.json")),
            CallOptions::default(),
        )
        .await
        .unwrap_or_else(|error| panic!("{fault}: {error}"));
    let run_id = started.receipt.run_id.as_str().to_owned();
    if started.adopted {
        assert!(
            server.wait_exit(Duration::from_secs(10)),
            "{fault}: an adopted receipt means the first server died"
        );
    }
    // The fault may also fire later (the admission, the runner's messages):
    // the reader starts a server when none is left.
    let mut reader = WorkflowClient::new(server.starting_options());
    assert_eq!(
        run_ids(&mut reader).await,
        vec![run_id],
        "{fault}: exactly the run of the receipt exists"
    );
    server.kill();
    Some(started.adopted)
}

/// The server SIGKILLs itself right after `run.start`'s receipt committed,
/// before the reply: the client's retry adopts that receipt, and exactly
/// that one run exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cut_off_after_its_commit_is_retried_and_adopts_the_stored_receipt() {
    assert_eq!(
        start_under_fault("after_receipt:1").await,
        Some(true),
        "the retry of the cut-off run.start adopted its receipt"
    );
}

/// The server SIGKILLs itself after its n-th commit, for each of the first
/// 40 (startup, reads and timer renewals share the count, so where
/// `run.start` lands varies): every scenario ends with exactly one run, the
/// one the client's receipt names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_after_any_early_commit_leaves_exactly_the_run_of_the_receipt() {
    let mut ready = 0;
    for n in 1..=40 {
        if start_under_fault(&format!("after_commit:{n}"))
            .await
            .is_some()
        {
            ready += 1;
        }
    }
    assert!(ready > 30, "only {ready} of 40 servers became ready");
}

/// Every event after a restart continues the consumer's view: patches on
/// the last revision it accepted while that revision is retained, one
/// snapshot when it is not; the folded view equals the server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_are_restored_after_a_restart_with_patches_or_a_snapshot() {
    let mut server = Server::started();
    let mut follower = server.client();
    let mut driver = server.client();
    let run_id = start_run(&mut driver, "checkpoint.json").await;
    wait_status(&mut driver, &run_id, "waiting").await;
    let target: types::SubscriptionTarget =
        serde_json::from_value(json!({ "kind": "run", "runId": run_id })).unwrap();
    let subscription = follower.subscribe(&target, None).await.unwrap();
    let mut live = LiveView::new();
    let first = follower.next_event().await.unwrap();
    let Delivery::Event { event, .. } = &first else {
        panic!("first delivery: {first:?}");
    };
    live.apply_event(event).unwrap();

    // (1) A retained revision gets patches.
    let held = follower.last_revision(subscription).unwrap();
    server.kill();
    server.spawn(&[]).expect("the server restarts");
    let mut driver = server.client();
    let empty = types::EmptyPayload {};
    driver
        .call::<ops::RunPause>(Some(&run_id), &empty, CallOptions::default())
        .await
        .unwrap();
    driver
        .call::<ops::RunResume>(Some(&run_id), &empty, CallOptions::default())
        .await
        .unwrap();
    assert_eq!(follower.next_event().await.unwrap(), Delivery::Unavailable);
    assert_eq!(follower.next_event().await.unwrap(), Delivery::Available);
    let current = driver.run_view(&run_id).await.unwrap().revision.get();
    let mut first_after_restart = None;
    while live.revision() != Some(current) {
        let Delivery::Event { event, .. } = follower.next_event().await.unwrap() else {
            panic!("a second loss");
        };
        first_after_restart.get_or_insert_with(|| event.clone());
        live.apply_event(&event).unwrap();
    }
    match first_after_restart.unwrap() {
        types::ClientEvent::RunViewPatch { base_revision, .. } => {
            assert_eq!(
                base_revision.get(),
                held,
                "the patch starts at the held revision"
            );
        }
        other => panic!("a retained revision got {other:?}"),
    }
    assert_eq!(
        live.view().unwrap(),
        &serde_json::to_value(driver.run_view(&run_id).await.unwrap()).unwrap()
    );

    // (2) A revision older than the retained ones gets one snapshot.
    server.kill();
    server.spawn(&[]).expect("the server restarts again");
    let mut driver = server.client();
    for _ in 0..140 {
        for pause in [true, false] {
            let call = if pause {
                driver
                    .call::<ops::RunPause>(Some(&run_id), &empty, CallOptions::default())
                    .await
                    .map(|_| ())
            } else {
                driver
                    .call::<ops::RunResume>(Some(&run_id), &empty, CallOptions::default())
                    .await
                    .map(|_| ())
            };
            call.unwrap();
        }
    }
    let current = driver.run_view(&run_id).await.unwrap();
    assert!(current.revision.get() > live.revision().unwrap() + 256);
    assert_eq!(follower.next_event().await.unwrap(), Delivery::Unavailable);
    assert_eq!(follower.next_event().await.unwrap(), Delivery::Available);
    let Delivery::Event {
        event, revision, ..
    } = follower.next_event().await.unwrap()
    else {
        panic!("a second loss");
    };
    assert!(
        matches!(event, types::ClientEvent::RunViewSnapshot { .. }),
        "a stale revision got {event:?}"
    );
    assert_eq!(revision, current.revision.get());
    live.apply_event(&event).unwrap();
    assert_eq!(
        live.view().unwrap(),
        &serde_json::to_value(current).unwrap()
    );
}

/// Referenced content is read in verified parts; a reference the server
/// does not hold is its refusal, never unverified bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn referenced_content_is_read_and_verified() {
    let server = Server::started();
    let mut client = server.client();
    let run_id = start_run(&mut client, "checkpoint.json").await;
    let view = wait_status(&mut client, &run_id, "waiting").await;
    let reference = view.definition.clone();
    let bytes = client.read_content(&run_id, &reference).await.unwrap();
    assert_eq!(bytes.len() as u64, reference.bytes.get());
    assert_eq!(
        protocol::content::digest_text(&bytes),
        reference.digest.as_str()
    );
    let mut unknown = serde_json::to_value(&reference).unwrap();
    unknown["digest"] = json!(format!("sha256:{}", "0".repeat(64)));
    let unknown = serde_json::from_value(unknown).unwrap();
    let refused = client.read_content(&run_id, &unknown).await.unwrap_err();
    assert!(refused.is_server_refusal(), "{refused:?}");
    let complete = client.complete_view(&run_id).await.unwrap();
    assert!(complete.revision.get() >= view.revision.get());
    assert_eq!(
        complete.steps.items.len() as u64,
        complete.steps.total.get()
    );
}

/// A client of another package version gets one `VersionMismatch` that
/// says to install matching packages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_package_version_is_one_version_mismatch() {
    let server = Server::started();
    let mut options = server.options();
    options.package_version = "0.0.0-other".into();
    let mut client = WorkflowClient::new(options);
    let error = client.connect().await.unwrap_err();
    let ClientError::VersionMismatch(message) = &error else {
        panic!("{error:?}");
    };
    assert!(
        message.contains("install matching pi-workflows packages"),
        "{message}"
    );
}

/// Without a server a client that may start one does, waits for its ready
/// line and then talks to it; one that may not says `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_is_started_on_demand() {
    let server = Server::new();
    assert_eq!(
        server.client().connect().await.unwrap_err(),
        ClientError::Unavailable
    );
    let mut client = WorkflowClient::new(server.starting_options());
    let status = client
        .call::<ops::ServerStatus>(None, &types::EmptyPayload {}, CallOptions::default())
        .await
        .unwrap();
    assert!(status.receipt.server_epoch.get() > 0);
    assert!(server.home.server_log_path().is_file());
    client
        .call::<ops::ServerStop>(None, &types::EmptyPayload {}, CallOptions::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !server.home.server_lock_is_free() {
        assert!(Instant::now() < deadline, "the started server did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
