use super::*;

fn ask(input: u8) -> ChildAsk<'static> {
    ChildAsk {
        resource_uid: "uid-1",
        request_key: "review:abc",
        workflow: "review",
        input_fingerprint: Digest::repeat(input),
    }
}

fn started() -> ChildRequest {
    match ensure(None, &ask(1), &RunId::from("run-1")).unwrap() {
        Ensured::Start(request) => request,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_new_request_reserves_its_first_attempt_and_run_id() {
    let request = started();
    assert_eq!(request.attempt, 1);
    assert_eq!(request.run_id, RunId::from("run-1"));
    assert_eq!(request.state, ChildState::Running);
}

#[test]
fn repeated_reconciles_find_the_same_request_in_every_state_but_interrupted() {
    let request = started();
    for end in [
        None,
        Some(ChildRunEnd::Waiting),
        Some(ChildRunEnd::Completed),
        Some(ChildRunEnd::Failed),
    ] {
        let current = match end {
            None => request.clone(),
            Some(end) => on_run_ended(&request, &RunId::from("run-1"), end).unwrap(),
        };
        assert_eq!(
            ensure(Some(&current), &ask(1), &RunId::from("run-2")),
            Ok(Ensured::Existing(current.clone()))
        );
    }
}

#[test]
fn an_interrupted_attempt_is_followed_by_a_new_one_with_a_new_run() {
    let request = started();
    let interrupted =
        on_run_ended(&request, &RunId::from("run-1"), ChildRunEnd::Interrupted).unwrap();
    let Ok(Ensured::Start(next)) = ensure(Some(&interrupted), &ask(1), &RunId::from("run-2"))
    else {
        panic!("a new attempt")
    };
    assert_eq!((next.attempt, next.run_id.as_str()), (2, "run-2"));
    // The old run's late end does not touch the new attempt.
    assert_eq!(
        on_run_ended(&next, &RunId::from("run-1"), ChildRunEnd::Completed),
        Err(ChildRejection::StaleRun)
    );
}

#[test]
fn a_changed_input_or_workflow_under_the_same_key_conflicts() {
    let request = started();
    assert_eq!(
        ensure(Some(&request), &ask(2), &RunId::from("run-2")),
        Err(ChildRejection::RequestConflict)
    );
    let mut other = ask(1);
    other.workflow = "repair";
    assert_eq!(
        ensure(Some(&request), &other, &RunId::from("run-2")),
        Err(ChildRejection::RequestConflict)
    );
    let mut empty = ask(1);
    empty.request_key = "";
    assert_eq!(
        ensure(None, &empty, &RunId::from("run-2")),
        Err(ChildRejection::BadKey)
    );
}
