//! The resource tables on a real SQLite file: every row reads back into the
//! kernel record it was written from, and each guard of the module holds.

use super::*;
use crate::store::open;
use kernel::child_workflow::ChildState;
use kernel::controller_effect::ControllerEffectState;
use kernel::resource::{self as resource_kernel, Applied, ApplyInput};
use serde_json::json;

fn database() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().expect("temp dir");
    let connection = open::open(&dir.path().join("state.sqlite")).expect("open");
    (dir, connection)
}

fn created(uid: &str, key: &str, spec: serde_json::Value) -> StoredResource {
    let input = ApplyInput {
        new_uid: uid,
        controller: "pull-request",
        key,
        spec: &spec,
        spec_digest: Digest::repeat(spec.to_string().len() as u8),
        spec_bytes: spec.to_string().len(),
        initial_status: &json!({"phase": "new"}),
        source_digest: Digest::repeat(9),
    };
    let Ok(Applied::Created(record)) = resource_kernel::apply(None, &input, 1_000) else {
        panic!("a new resource is created");
    };
    StoredResource {
        record,
        controller_path: "/p/.pi/controllers/pull-request.controller.ts".into(),
        project_path: Some("/p".into()),
        created_at_ms: 1_000,
    }
}

fn count(connection: &Connection, table: &str) -> i64 {
    connection
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .expect("count")
}

#[test]
fn a_resource_row_reads_back_into_its_record_and_updates_advance_one_version() {
    let (_dir, connection) = database();
    let stored = created("r-1", "acme/repo#1", json!({"repo": "acme/repo", "n": 1}));
    insert(&connection, &stored).expect("insert");
    assert_eq!(
        load(&connection, "pull-request", "acme/repo#1").expect("load"),
        Some(stored.clone())
    );
    assert_eq!(
        load_by_uid(&connection, "r-1").expect("load"),
        Some(stored.clone())
    );
    assert_eq!(
        load(&connection, "pull-request", "other").expect("load"),
        None
    );

    // A deletion request is the next version: written.
    let marked = resource_kernel::request_deletion(&stored.record, 2_000).expect("marked");
    update(&connection, &marked).expect("update");
    let read = load_by_uid(&connection, "r-1").expect("load").expect("row");
    assert_eq!(read.record, marked);
    assert_eq!(read.record.resource_version, 2);

    // A record that does not follow the stored version is refused whole.
    let mut skipped = marked.clone();
    skipped.resource_version = 4;
    skipped.spec = json!({"changed": true});
    let refused = update(&connection, &skipped).expect_err("a skipped version is refused");
    assert!(matches!(refused, rusqlite::Error::StatementChangedRows(0)));
    let mut stale = marked.clone();
    stale.spec = json!({"stale": true});
    assert!(
        update(&connection, &stale).is_err(),
        "the same version again is refused"
    );
    assert_eq!(
        load_by_uid(&connection, "r-1")
            .expect("load")
            .expect("row")
            .record,
        marked
    );

    set_source(
        &connection,
        "r-1",
        "/home/.pi/agent/controllers/pull-request.controller.js",
        None,
    )
    .expect("set source");
    let read = load_by_uid(&connection, "r-1").expect("load").expect("row");
    assert_eq!(read.project_path, None);
    assert!(read.controller_path.starts_with("/home/"));
}

#[test]
fn deleting_a_resource_deletes_its_queue_effects_and_children_but_keeps_its_events() {
    let (_dir, connection) = database();
    let stored = created("r-1", "k", json!({}));
    insert(&connection, &stored).expect("insert");
    enqueue(&connection, "r-1", 1_000).expect("enqueue");
    insert_effect(&connection, &effect("r-1", "merge")).expect("effect");
    upsert_child(&connection, &child("r-1", "review", "run-1"), 1_000).expect("child");
    append_event(
        &connection,
        &ResourceEvent::of(&stored.record, ResourceEventKind::Applied, 1_000),
    )
    .expect("event");
    delete(&connection, "r-1").expect("delete");
    assert_eq!(load_by_uid(&connection, "r-1").expect("load"), None);
    for table in [
        "resource_queue",
        "controller_effects",
        "controller_child_requests",
    ] {
        assert_eq!(
            count(&connection, table),
            0,
            "{table} kept a deleted resource's row"
        );
    }
    assert_eq!(
        recent_events(&connection, "pull-request", "k", 10)
            .expect("events")
            .len(),
        1
    );
    assert!(
        delete(&connection, "r-1").is_err(),
        "deleting a missing resource is an error"
    );
}

#[test]
fn the_queue_row_follows_the_kernel_and_a_rejection_writes_nothing() {
    let (_dir, connection) = database();
    insert(&connection, &created("r-1", "k", json!({}))).expect("insert");
    assert_eq!(load_queue(&connection, "r-1").expect("load"), None);
    assert_eq!(
        claim(&connection, "r-1", Digest::repeat(1), 1_000, 0).expect("claim"),
        None
    );

    let first = enqueue(&connection, "r-1", 5_000).expect("enqueue");
    assert_eq!(first.version, 1);
    assert_eq!(first.available_at_ms, Some(5_000));
    let again = enqueue(&connection, "r-1", 3_000).expect("enqueue");
    assert_eq!((again.version, again.available_at_ms), (2, Some(3_000)));
    assert_eq!(
        load_queue(&connection, "r-1").expect("load"),
        Some(again.clone())
    );
    assert_eq!(next_due_at(&connection).expect("due"), Some(3_000));

    // Not yet available: refused, nothing written.
    let early = claim(&connection, "r-1", Digest::repeat(1), 1_000, 2_000).expect("claim");
    assert_eq!(early, Some(Err(ReconcileRejection::NotClaimable)));
    assert_eq!(
        load_queue(&connection, "r-1").expect("load"),
        Some(again.clone())
    );
    assert!(
        claimable(&connection, 2_999, 10)
            .expect("claimable")
            .is_empty()
    );
    let candidates = claimable(&connection, 3_000, 10).expect("claimable");
    assert_eq!(candidates.len(), 1);
    assert_eq!(
        (
            candidates[0].controller.as_str(),
            candidates[0].key.as_str()
        ),
        ("pull-request", "k")
    );

    let token = Digest::repeat(7);
    let claimed = claim(&connection, "r-1", token, 1_000, 3_000)
        .expect("claim")
        .expect("row")
        .expect("claimed");
    let stored = load_queue(&connection, "r-1").expect("load").expect("row");
    assert_eq!(stored, claimed);
    let live = stored.claim.expect("a claim");
    assert_eq!(
        (
            live.generation,
            live.token_hash,
            live.expires_at_ms,
            live.claimed_version
        ),
        (1, token, 4_000, 2)
    );
    assert!(
        claimable(&connection, 3_500, 10)
            .expect("claimable")
            .is_empty(),
        "a live claim is not claimable"
    );
    assert_eq!(
        next_due_at(&connection).expect("due"),
        Some(4_000),
        "the claim's expiry is due"
    );

    // Another token cannot renew or finish; nothing changes.
    let other = Digest::repeat(8);
    assert_eq!(
        renew(&connection, "r-1", 1, &other, 1_000, 3_100).expect("renew"),
        Some(Err(ReconcileRejection::ClaimLost))
    );
    assert_eq!(
        finish(&connection, "r-1", 1, &other, &Finished::Settled, 3_100).expect("finish"),
        Some(Err(ReconcileRejection::ClaimLost))
    );
    assert_eq!(load_queue(&connection, "r-1").expect("load"), Some(claimed));

    let renewed = renew(&connection, "r-1", 1, &token, 1_000, 3_500)
        .expect("renew")
        .expect("row")
        .expect("renewed");
    assert_eq!(renewed.claim.expect("claim").expires_at_ms, 4_500);
    let failed = Finished::Failed {
        error: "boom".into(),
        jitter_permille: 0,
    };
    let finished = finish(&connection, "r-1", 1, &token, &failed, 3_600)
        .expect("finish")
        .expect("row")
        .expect("finished");
    assert_eq!(finished.claim, None);
    assert_eq!(finished.consecutive_errors, 1);
    let stored = load_queue(&connection, "r-1").expect("load").expect("row");
    assert_eq!(stored, finished);
    assert_eq!(stored.available_at_ms, Some(4_600));
    assert_eq!(
        stored.generation, 1,
        "the lease generation is kept after the claim ends"
    );

    let view = QueueView::from(&stored);
    assert_eq!(view.last_error.as_deref(), Some("boom"));
    assert_eq!(view.claim_generation, None);
}

#[test]
fn list_shows_each_resource_with_its_queue_error_and_filters_by_controller() {
    let (_dir, connection) = database();
    insert(&connection, &created("r-2", "b", json!({"x": 2}))).expect("insert");
    insert(&connection, &created("r-1", "a", json!({"x": 1}))).expect("insert");
    let mut other = created("r-3", "c", json!({}));
    other.record.controller = "deploy".into();
    insert(&connection, &other).expect("insert");
    let row = QueueRow {
        available_at_ms: Some(9_000),
        version: 3,
        consecutive_errors: 2,
        last_error: Some("the forge answered 500".into()),
        generation: 2,
        claim: None,
    };
    write_queue(&connection, "r-2", &row).expect("queue");
    let all = list(&connection, None).expect("list");
    let names: Vec<_> = all
        .iter()
        .map(|r| (r.controller.as_str(), r.key.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("deploy", "c"),
            ("pull-request", "a"),
            ("pull-request", "b")
        ]
    );
    let b = &all[2];
    assert_eq!(
        (
            b.last_error.as_deref(),
            b.consecutive_errors,
            b.available_at_ms
        ),
        (Some("the forge answered 500"), 2, Some(9_000))
    );
    assert_eq!(b.status.controller_status, json!({"phase": "new"}));
    assert_eq!(list(&connection, Some("deploy")).expect("list").len(), 1);
    assert!(list(&connection, Some("none")).expect("list").is_empty());
}

fn effect(uid: &str, key: &str) -> ControllerEffect {
    ControllerEffect {
        resource_uid: uid.into(),
        key: key.into(),
        kind: "forge.merge".into(),
        request_fingerprint: Digest::repeat(3),
        generation: 1,
        state: ControllerEffectState::Pending,
        started_at_ms: 1_000,
        completed_at_ms: None,
    }
}

#[test]
fn effects_read_back_and_keep_what_apply_reported() {
    let (_dir, connection) = database();
    insert(&connection, &created("r-1", "k", json!({}))).expect("insert");
    let pending = effect("r-1", "merge");
    insert_effect(&connection, &pending).expect("insert");
    assert!(
        insert_effect(&connection, &pending).is_err(),
        "a key is reserved once"
    );
    let read = load_effect(&connection, "r-1", "merge")
        .expect("load")
        .expect("row");
    assert_eq!(
        (read.effect, read.external_ref, read.error),
        (pending.clone(), None, None)
    );

    let applied = kernel::controller_effect::applied(
        &pending,
        kernel::controller_effect::ApplyResult::Applied,
        2_000,
    );
    update_effect(&connection, &applied, Some("merge-commit-1"), None).expect("update");
    let indeterminate = ControllerEffect {
        state: ControllerEffectState::Indeterminate,
        ..applied.clone()
    };
    update_effect(
        &connection,
        &indeterminate,
        None,
        Some("the forge timed out"),
    )
    .expect("update");
    let read = load_effect(&connection, "r-1", "merge")
        .expect("load")
        .expect("row");
    assert_eq!(read.effect, indeterminate);
    assert_eq!(
        read.external_ref.as_deref(),
        Some("merge-commit-1"),
        "None keeps the stored reference"
    );
    assert_eq!(read.error.as_deref(), Some("the forge timed out"));
    assert!(
        update_effect(&connection, &effect("r-1", "other"), None, None).is_err(),
        "a missing effect is an error"
    );
    assert_eq!(
        effects_of(&connection, "r-1", 10).expect("effects").len(),
        1
    );
    assert_eq!(
        load_effect(&connection, "r-1", "other").expect("load"),
        None
    );
}

fn child(uid: &str, key: &str, run_id: &str) -> ChildRequest {
    ChildRequest {
        resource_uid: uid.into(),
        request_key: key.into(),
        workflow: "review".into(),
        input_fingerprint: Digest::repeat(4),
        attempt: 1,
        run_id: RunId::new(run_id),
        state: ChildState::Running,
    }
}

#[test]
fn child_requests_are_found_by_key_and_by_run_and_a_new_attempt_replaces_the_run() {
    let (_dir, connection) = database();
    insert(&connection, &created("r-1", "k", json!({}))).expect("insert");
    let first = child("r-1", "review", "run-1");
    upsert_child(&connection, &first, 1_000).expect("upsert");
    assert_eq!(
        load_child(&connection, "r-1", "review").expect("load"),
        Some(first.clone())
    );
    assert_eq!(
        load_child_by_run(&connection, &RunId::new("run-1")).expect("load"),
        Some(first.clone())
    );
    let interrupted = ChildRequest {
        state: ChildState::Interrupted,
        ..first.clone()
    };
    upsert_child(&connection, &interrupted, 2_000).expect("upsert");
    let second = ChildRequest {
        attempt: 2,
        run_id: RunId::new("run-2"),
        state: ChildState::Running,
        ..first
    };
    upsert_child(&connection, &second, 3_000).expect("upsert");
    assert_eq!(
        load_child(&connection, "r-1", "review").expect("load"),
        Some(second.clone())
    );
    assert_eq!(
        load_child_by_run(&connection, &RunId::new("run-1")).expect("load"),
        None,
        "an old attempt's run is not the request's"
    );
    assert_eq!(
        load_child_by_run(&connection, &RunId::new("run-2")).expect("load"),
        Some(second)
    );
    assert_eq!(
        children_of(&connection, "r-1", 10).expect("children").len(),
        1
    );
}

#[test]
fn recent_events_are_the_last_ones_oldest_first_with_bounded_detail() {
    let (_dir, connection) = database();
    let stored = created("r-1", "k", json!({}));
    for (i, kind) in [
        ResourceEventKind::Applied,
        ResourceEventKind::ReconcileRequested,
        ResourceEventKind::ReconcileStarted,
        ResourceEventKind::ReconcileFailed,
    ]
    .into_iter()
    .enumerate()
    {
        let event =
            ResourceEvent::of(&stored.record, kind, 1_000 + i as u64).with_detail("é".repeat(600));
        append_event(&connection, &event).expect("append");
    }
    let recent = recent_events(&connection, "pull-request", "k", 2).expect("events");
    let kinds: Vec<_> = recent.iter().map(|e| e.event.kind).collect();
    assert_eq!(
        kinds,
        [
            ResourceEventKind::ReconcileStarted,
            ResourceEventKind::ReconcileFailed
        ]
    );
    assert!(recent[0].seq < recent[1].seq);
    let detail = recent[1].event.detail.as_deref().expect("detail");
    assert_eq!(
        detail.len(),
        MAX_EVENT_DETAIL_BYTES,
        "cut on a character boundary"
    );
    assert_eq!(recent[1].event.resource_version, Some(1));
    assert!(
        recent_events(&connection, "pull-request", "other", 10)
            .expect("events")
            .is_empty()
    );
}
