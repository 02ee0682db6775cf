use super::*;

fn request(fingerprint: u8) -> EnsureRequest<'static> {
    EnsureRequest {
        resource_uid: "uid-1",
        key: "merge:abc",
        kind: "merge",
        request_fingerprint: Digest::repeat(fingerprint),
        generation: 3,
    }
}

fn reserved() -> ControllerEffect {
    match ensure(None, &request(1), None, 10).unwrap() {
        Ensure::Apply(effect) => effect,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_new_effect_is_reserved_pending_before_it_applies() {
    let effect = reserved();
    assert_eq!(effect.state, ControllerEffectState::Pending);
    assert_eq!(effect.completed_at_ms, None);
    assert_eq!(
        applied(&effect, ApplyResult::Applied, 20).state,
        ControllerEffectState::Applied
    );
}

#[test]
fn a_pending_effect_found_again_is_observed_before_any_retry() {
    // The reconcile child died inside `apply`: the record is still pending.
    let effect = reserved();
    let Ok(Ensure::Observe(found)) = ensure(Some(&effect), &request(1), None, 30) else {
        panic!("a pending effect must be observed first")
    };
    // It did apply: recorded applied, not applied again.
    let (recovered, apply_now) = observed(&found, Observed::Applied, 31);
    assert_eq!(
        (recovered.state, apply_now),
        (ControllerEffectState::Applied, false)
    );
    assert!(matches!(
        ensure(Some(&recovered), &request(1), None, 40),
        Ok(Ensure::Done(_))
    ));
    // It did not: only then apply.
    let (retry, apply_now) = observed(&found, Observed::NotApplied, 31);
    assert_eq!(
        (retry.state, apply_now),
        (ControllerEffectState::Pending, true)
    );
    // Unknown: indeterminate, still observed first next time.
    let (unknown, apply_now) = observed(&found, Observed::Indeterminate, 31);
    assert_eq!(
        (unknown.state, apply_now),
        (ControllerEffectState::Indeterminate, false)
    );
    assert!(matches!(
        ensure(Some(&unknown), &request(1), None, 40),
        Ok(Ensure::Observe(_))
    ));
}

#[test]
fn an_exception_from_apply_is_indeterminate() {
    assert_eq!(
        applied(&reserved(), ApplyResult::Threw, 20).state,
        ControllerEffectState::Indeterminate
    );
    assert_eq!(
        applied(&reserved(), ApplyResult::Rejected, 20).state,
        ControllerEffectState::Rejected
    );
}

#[test]
fn the_same_key_with_another_request_kind_or_generation_conflicts() {
    let effect = reserved();
    assert_eq!(
        ensure(Some(&effect), &request(2), None, 1),
        Err(EffectEnsureRejection::RequestConflict)
    );
    let mut other_kind = request(1);
    other_kind.kind = "close";
    assert_eq!(
        ensure(Some(&effect), &other_kind, None, 1),
        Err(EffectEnsureRejection::RequestConflict)
    );
    let mut other_generation = request(1);
    other_generation.generation = 4;
    assert_eq!(
        ensure(Some(&effect), &other_generation, None, 1),
        Err(EffectEnsureRejection::RequestConflict)
    );
}

#[test]
fn one_effect_per_reconcile_pass() {
    assert_eq!(
        ensure(None, &request(1), Some("label:x"), 1),
        Err(EffectEnsureRejection::SecondEffectInPass)
    );
    // The same key again in the same pass is the same effect.
    assert!(ensure(None, &request(1), Some("merge:abc"), 1).is_ok());
    let mut empty = request(1);
    empty.key = "";
    assert_eq!(
        ensure(None, &empty, None, 1),
        Err(EffectEnsureRejection::BadKey)
    );
}
