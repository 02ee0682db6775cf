use super::*;
use alloc::vec;
use serde_json::json;

fn input<'a>(spec: &'a Value, digest: u8, initial: &'a Value) -> ApplyInput<'a> {
    ApplyInput {
        new_uid: "uid-1",
        controller: "pull-request",
        key: "org/repo#7",
        spec,
        spec_digest: Digest::repeat(digest),
        spec_bytes: 32,
        initial_status: initial,
        source_digest: Digest::repeat(9),
    }
}

fn created() -> ResourceRecord {
    let spec = json!({"head": "abc"});
    let initial = json!({"phase": "new"});
    match apply(None, &input(&spec, 1, &initial), 100).unwrap() {
        Applied::Created(record) => record,
        other => panic!("{other:?}"),
    }
}

fn condition(kind: &str, status: ConditionStatus) -> ConditionPatch {
    ConditionPatch {
        condition_type: kind.into(),
        status,
        reason: "Because".into(),
        message: None,
    }
}

#[test]
fn a_new_resource_starts_at_version_and_generation_one_with_its_initial_status() {
    let record = created();
    assert_eq!((record.resource_version, record.generation), (1, 1));
    assert_eq!(record.status.controller_status, json!({"phase": "new"}));
    assert_eq!(record.status.observed_generation, 0);
    assert!(record.status.conditions.is_empty());
}

#[test]
fn reapplying_the_same_spec_writes_nothing_and_a_new_spec_advances_the_generation() {
    let record = created();
    let spec = json!({"head": "abc"});
    let initial = json!({});
    assert_eq!(
        apply(Some(&record), &input(&spec, 1, &initial), 200),
        Ok(Applied::Unchanged)
    );
    let changed = json!({"head": "def"});
    let Ok(Applied::Updated(updated)) = apply(Some(&record), &input(&changed, 2, &initial), 200)
    else {
        panic!("expected an update")
    };
    assert_eq!((updated.resource_version, updated.generation), (2, 2));
    assert_eq!(updated.spec, changed);
    // The status is the controller's: a new spec keeps it.
    assert_eq!(updated.status, record.status);
}

#[test]
fn names_keys_and_sizes_are_bounded() {
    let spec = json!({});
    for bad in ["", "Pull", "1pr", "pr_x", "pr x"] {
        let mut apply_input = input(&spec, 1, &spec);
        apply_input.controller = bad;
        assert_eq!(
            apply(None, &apply_input, 1),
            Err(ResourceRejection::BadControllerName),
            "{bad:?}"
        );
    }
    let long_key = "k".repeat(MAX_KEY_BYTES + 1);
    for bad in ["", "a\nb", long_key.as_str()] {
        let mut apply_input = input(&spec, 1, &spec);
        apply_input.key = bad;
        assert_eq!(apply(None, &apply_input, 1), Err(ResourceRejection::BadKey));
    }
    let mut apply_input = input(&spec, 1, &spec);
    apply_input.spec_bytes = MAX_DOCUMENT_BYTES + 1;
    assert_eq!(
        apply(None, &apply_input, 1),
        Err(ResourceRejection::TooLarge)
    );
}

#[test]
fn a_proposal_commits_only_against_the_version_it_read() {
    let record = created();
    let patch = StatusPatch {
        controller_status: Some(json!({"phase": "reviewing"})),
        ..StatusPatch::default()
    };
    assert_eq!(
        propose(&record, record.resource_version + 1, &patch, 10, true, 5),
        Ok(Proposed::Conflict)
    );
    let Ok(Proposed::Written(next)) =
        propose(&record, record.resource_version, &patch, 10, true, 5)
    else {
        panic!("expected a write")
    };
    assert_eq!(next.resource_version, record.resource_version + 1);
    assert_eq!(next.status.observed_generation, record.generation);
    assert_eq!(next.status.controller_status, json!({"phase": "reviewing"}));
    // The stale proposal of a second reconcile that read the old version conflicts.
    assert_eq!(
        propose(&next, record.resource_version, &patch, 10, true, 6),
        Ok(Proposed::Conflict)
    );
}

#[test]
fn conditions_merge_by_type_and_keep_their_transition_time_while_the_status_holds() {
    let record = created();
    let first = StatusPatch {
        conditions: Some(vec![
            condition("Ready", ConditionStatus::False),
            condition("Checks", ConditionStatus::Unknown),
        ]),
        ..StatusPatch::default()
    };
    let Ok(Proposed::Written(one)) = propose(&record, 1, &first, 10, false, 1_000) else {
        panic!()
    };
    let second = StatusPatch {
        conditions: Some(vec![
            condition("Ready", ConditionStatus::False),
            condition("Checks", ConditionStatus::True),
        ]),
        ..StatusPatch::default()
    };
    let Ok(Proposed::Written(two)) = propose(&one, 2, &second, 10, false, 2_000) else {
        panic!()
    };
    let times: Vec<(&str, u64)> = two
        .status
        .conditions
        .iter()
        .map(|c| (c.condition_type.as_str(), c.last_transition_at_ms))
        .collect();
    assert_eq!(times, vec![("Checks", 2_000), ("Ready", 1_000)]);
    // A patch naming one type leaves the others.
    let third = StatusPatch {
        conditions: Some(vec![condition("Ready", ConditionStatus::True)]),
        ..StatusPatch::default()
    };
    let Ok(Proposed::Written(three)) = propose(&two, 3, &third, 10, true, 3_000) else {
        panic!()
    };
    assert_eq!(three.status.conditions.len(), 2);
    assert_eq!(ready(&three), Some(ConditionStatus::True));
}

#[test]
fn deletion_waits_for_the_finalizers_then_a_settled_reconcile_deletes() {
    let record = created();
    let with_finalizer = StatusPatch {
        finalizers: Some(vec!["forge.example/branch".into()]),
        ..StatusPatch::default()
    };
    let Ok(Proposed::Written(owned)) = propose(&record, 1, &with_finalizer, 10, true, 1) else {
        panic!()
    };
    let marked = request_deletion(&owned, 2).expect("marked");
    assert_eq!(
        request_deletion(&marked, 3),
        None,
        "a repeat changes nothing"
    );
    let spec = json!({"head": "zzz"});
    assert_eq!(
        apply(Some(&marked), &input(&spec, 7, &spec), 3),
        Err(ResourceRejection::Deleting)
    );
    // Settled while a finalizer is left: written, not deleted.
    let keep = StatusPatch::default();
    let Ok(Proposed::Written(still)) = propose(&marked, marked.resource_version, &keep, 0, true, 4)
    else {
        panic!("a finalizer keeps the row")
    };
    // The controller cleans up and drops its finalizer: the settle deletes.
    let release = StatusPatch {
        finalizers: Some(Vec::new()),
        ..StatusPatch::default()
    };
    assert_eq!(
        propose(&still, still.resource_version, &release, 0, true, 5),
        Ok(Proposed::Deleted)
    );
    // A requeue (not settled) never deletes.
    assert!(matches!(
        propose(&still, still.resource_version, &release, 0, false, 5),
        Ok(Proposed::Written(_))
    ));
}

#[test]
fn a_patch_clears_the_child_run_only_with_an_explicit_null() {
    let patch: StatusPatch = serde_json::from_value(json!({"workflowRun": null})).unwrap();
    assert_eq!(patch.workflow_run, Some(None));
    let patch: StatusPatch = serde_json::from_value(json!({})).unwrap();
    assert_eq!(patch.workflow_run, None);
    let patch: StatusPatch =
        serde_json::from_value(json!({"workflowRun": {"runId": "r1"}})).unwrap();
    assert_eq!(patch.workflow_run, Some(Some(json!({"runId": "r1"}))));
}

#[test]
fn malformed_conditions_and_finalizers_are_refused() {
    let record = created();
    let bad_condition = StatusPatch {
        conditions: Some(vec![condition("", ConditionStatus::True)]),
        ..StatusPatch::default()
    };
    assert_eq!(
        propose(&record, 1, &bad_condition, 10, true, 1),
        Err(ResourceRejection::BadStatus)
    );
    let too_many = StatusPatch {
        finalizers: Some(
            (0..=MAX_FINALIZERS)
                .map(|i| alloc::format!("f{i}"))
                .collect(),
        ),
        ..StatusPatch::default()
    };
    assert_eq!(
        propose(&record, 1, &too_many, 10, true, 1),
        Err(ResourceRejection::BadStatus)
    );
}
