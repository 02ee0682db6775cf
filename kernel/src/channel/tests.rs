use super::*;
use crate::decision::DecisionStatus;
use crate::fixtures::{live_run, pending_decision, waiting_at_checkpoint};
use crate::output::Output;

const PROFILE: &str = "ops";

fn waiting() -> RunAggregate {
    let mut agg = waiting_at_checkpoint(&live_run(1, "work", 10), "gate", 20);
    agg.decision = Some(pending_decision(&agg, None, None));
    agg
}

fn fingerprint() -> Digest {
    Digest::repeat(0x5e)
}

fn sent(agg: &RunAggregate) -> (RunAggregate, EffectId, u32) {
    match present(agg, PROFILE, fingerprint(), None, 30).expect("a send") {
        Presented::Send {
            transition,
            effect_id,
            attempt_number,
        } => (transition.facts, effect_id, attempt_number),
        Presented::Settled { effect } => panic!("settled already: {effect:?}"),
    }
}

fn effect(agg: &RunAggregate, effect_id: &EffectId) -> EffectRecord {
    agg.effects
        .iter()
        .find(|effect| effect.effect_id == *effect_id)
        .cloned()
        .expect("the effect")
}

fn session() -> AdapterSession {
    AdapterSession::launched(PROFILE.into(), 7)
}

fn header(epoch: u64, profile: &str, sequence: u64) -> Header {
    Header {
        epoch,
        profile: profile.into(),
        sequence,
        expected_revision: 1,
        attempt_id: None,
    }
}

#[test]
fn a_header_of_another_epoch_or_profile_is_a_stale_adapter() {
    assert_eq!(
        check_header(&session(), &header(6, PROFILE, 1)),
        Err(ChannelRejection::StaleAdapter)
    );
    assert_eq!(
        check_header(&session(), &header(7, "other", 1)),
        Err(ChannelRejection::StaleAdapter)
    );
    let accepted = check_header(&session(), &header(7, PROFILE, 1)).expect("accepted");
    assert_eq!(accepted.last_sequence, 1);
}

#[test]
fn a_sequence_that_does_not_grow_is_refused() {
    let after = check_header(&session(), &header(7, PROFILE, 3)).expect("accepted");
    assert_eq!(
        check_header(&after, &header(7, PROFILE, 3)),
        Err(ChannelRejection::SequenceReplayed)
    );
    assert_eq!(
        check_header(&after, &header(7, PROFILE, 2)),
        Err(ChannelRejection::SequenceReplayed)
    );
    assert!(check_header(&after, &header(7, PROFILE, 4)).is_ok());
}

#[test]
fn only_allowed_users_in_allowed_chats_answer() {
    assert_eq!(check_identity(&[1], &[10], 1, 10), Ok(()));
    assert_eq!(
        check_identity(&[1], &[10], 2, 10),
        Err(ChannelRejection::NotAllowed)
    );
    assert_eq!(
        check_identity(&[1], &[10], 1, 11),
        Err(ChannelRejection::NotAllowed)
    );
}

#[test]
fn attempt_ids_round_trip() {
    let effect_id = EffectId::new("effect-00ff");
    assert_eq!(
        parse_attempt_id(&attempt_id(&effect_id, 3)),
        Some((effect_id, 3))
    );
    assert_eq!(parse_attempt_id("effect-00ff.0"), None);
    assert_eq!(parse_attempt_id("run-1.2"), None);
    assert_eq!(parse_attempt_id("effect-00ff"), None);
}

#[test]
fn a_channel_effect_type_names_its_profile() {
    assert_eq!(profile_of(&send_type("ops")), Some("ops"));
    assert_eq!(profile_of(&settle_type("ops")), Some("ops"));
    assert_eq!(ChannelWork::Settle.effect_type("ops"), "channel.settle:ops");
    assert_eq!(profile_of("function"), None);
}

#[test]
fn a_present_reserves_the_send_as_applying_attempt_one_before_anything_is_sent() {
    let agg = waiting();
    let (after, effect_id, number) = sent(&agg);
    assert_eq!(number, 1);
    let send = effect(&after, &effect_id);
    assert_eq!(send.state, EffectState::Applying);
    assert_eq!(send.key.effect_type, "channel.send:ops");
    assert_eq!(send.key.node_path.as_str(), "gate");
    // Applying already: a second present could send twice.
    assert_eq!(
        present(&after, PROFILE, fingerprint(), None, 31),
        Err(ChannelRejection::AlreadyApplying)
    );
}

#[test]
fn a_present_without_a_pending_decision_is_refused() {
    let mut agg = waiting();
    agg.decision = None;
    assert_eq!(
        present(&agg, PROFILE, fingerprint(), None, 30),
        Err(ChannelRejection::NoPendingDecision)
    );
}

#[test]
fn a_delivered_send_settles_and_is_adopted_by_the_next_present() {
    let (agg, effect_id, _) = sent(&waiting());
    let reported = report(
        &agg,
        PROFILE,
        ChannelWork::Send,
        &effect_id,
        1,
        SendOutcome::Delivered,
        Digest::repeat(9),
        40,
    )
    .expect("reported");
    let applied = effect(&reported.transition.facts, &effect_id);
    assert_eq!(applied.state, EffectState::Applied);
    assert_eq!(applied.result_digest, Some(Digest::repeat(9)));
    assert_eq!(reported.attempt_state, EffectState::Applied);
    // The store keeps only unsettled effects in the aggregate.
    let mut reloaded = reported.transition.facts.clone();
    reloaded.effects.clear();
    assert_eq!(
        present(&reloaded, PROFILE, fingerprint(), Some(&applied), 50),
        Ok(Presented::Settled { effect: applied })
    );
}

#[test]
fn a_known_rejection_starts_a_bounded_new_attempt() {
    let mut agg = waiting();
    for number in 1..MAX_ATTEMPTS {
        let (applying, effect_id, attempt) = sent(&agg);
        assert_eq!(attempt, number);
        let reported = report(
            &applying,
            PROFILE,
            ChannelWork::Send,
            &effect_id,
            number,
            SendOutcome::Refused { retryable: true },
            Digest::repeat(3),
            40,
        )
        .expect("reported");
        assert_eq!(reported.attempt_state, EffectState::Rejected);
        let next = effect(&reported.transition.facts, &effect_id);
        assert_eq!(
            (next.state, next.attempt_number),
            (EffectState::Reserved, number + 1)
        );
        agg = reported.transition.facts;
    }
    let (applying, effect_id, attempt) = sent(&agg);
    assert_eq!(attempt, MAX_ATTEMPTS);
    let last = report(
        &applying,
        PROFILE,
        ChannelWork::Send,
        &effect_id,
        attempt,
        SendOutcome::Refused { retryable: true },
        Digest::repeat(3),
        40,
    )
    .expect("reported");
    assert_eq!(
        effect(&last.transition.facts, &effect_id).state,
        EffectState::Rejected
    );
}

#[test]
fn a_report_for_another_attempt_is_stale() {
    let (agg, effect_id, _) = sent(&waiting());
    assert_eq!(
        report(
            &agg,
            PROFILE,
            ChannelWork::Send,
            &effect_id,
            2,
            SendOutcome::Delivered,
            Digest::repeat(9),
            40
        ),
        Err(ChannelRejection::StaleAttempt)
    );
    assert_eq!(
        report(
            &agg,
            PROFILE,
            ChannelWork::Send,
            &EffectId::new("effect-other"),
            1,
            SendOutcome::Delivered,
            Digest::repeat(9),
            40
        ),
        Err(ChannelRejection::StaleAttempt)
    );
}

#[test]
fn an_unknown_outcome_is_ambiguous_and_never_sent_again_automatically() {
    let (agg, effect_id, _) = sent(&waiting());
    let reported = report(
        &agg,
        PROFILE,
        ChannelWork::Send,
        &effect_id,
        1,
        SendOutcome::Unknown,
        Digest::repeat(9),
        40,
    )
    .expect("reported");
    let after = reported.transition.facts;
    assert_eq!(effect(&after, &effect_id).state, EffectState::Ambiguous);
    assert!(after.has_ambiguous_effect());
    assert!(
        reported
            .transition
            .outputs
            .iter()
            .any(|output| matches!(output, Output::PublishRun { .. })),
        "the view shows the review"
    );
    assert_eq!(
        present(&after, PROFILE, fingerprint(), None, 50),
        Err(ChannelRejection::Ambiguous)
    );
    // The operator's retry is the next numbered attempt, sent on the next present.
    let retried = crate::effect::recover(
        &after,
        &effect_id,
        crate::effect::RecoveryAction::Retry,
        Digest::repeat(0),
        60,
    )
    .expect("retried");
    let (_, _, number) = sent(&retried.facts);
    assert_eq!(number, 2);
}

#[test]
fn a_lost_adapter_leaves_its_applying_sends_ambiguous_and_only_its_own() {
    let (agg, effect_id, _) = sent(&waiting());
    assert_eq!(on_adapter_lost(&agg, "other", 40), None);
    let lost = on_adapter_lost(&agg, PROFILE, 40).expect("a transition");
    assert_eq!(
        effect(&lost.facts, &effect_id).state,
        EffectState::Ambiguous
    );
    assert_eq!(on_adapter_lost(&lost.facts, PROFILE, 41), None);
}

#[test]
fn an_answer_counts_only_through_the_delivered_current_attempt_of_the_pending_decision() {
    let (agg, effect_id, _) = sent(&waiting());
    let applying = effect(&agg, &effect_id);
    assert_eq!(
        check_answer(&agg, PROFILE, &applying, 1, 1, 1),
        Err(ChannelRejection::NotDelivered {
            state: EffectState::Applying
        })
    );
    let delivered = report(
        &agg,
        PROFILE,
        ChannelWork::Send,
        &effect_id,
        1,
        SendOutcome::Delivered,
        Digest::repeat(9),
        40,
    )
    .expect("reported")
    .transition
    .facts;
    let applied = effect(&delivered, &effect_id);
    assert_eq!(check_answer(&delivered, PROFILE, &applied, 1, 1, 1), Ok(()));
    assert_eq!(
        check_answer(&delivered, PROFILE, &applied, 2, 1, 1),
        Err(ChannelRejection::StaleAttempt)
    );
    assert_eq!(
        check_answer(&delivered, "other", &applied, 1, 1, 1),
        Err(ChannelRejection::StaleAttempt)
    );
    assert_eq!(
        check_answer(&delivered, PROFILE, &applied, 1, 1, 2),
        Err(ChannelRejection::StaleRevision)
    );
    let mut decided = delivered.clone();
    if let Some(decision) = decided.decision.as_mut() {
        decision.status = DecisionStatus::Cancelled;
    }
    assert_eq!(
        check_answer(&decided, PROFILE, &applied, 1, 1, 1),
        Err(ChannelRejection::NoPendingDecision)
    );
}

/// A delivered send of a decision that was then decided (the store loads
/// no decided decision into the aggregate) and whose run ended: the
/// aggregate as reloaded, and the send's row.
fn decided_after_delivery() -> (RunAggregate, EffectRecord) {
    let (agg, send_id, _) = sent(&waiting());
    let delivered = report(
        &agg,
        PROFILE,
        ChannelWork::Send,
        &send_id,
        1,
        SendOutcome::Delivered,
        Digest::repeat(9),
        40,
    )
    .expect("reported")
    .transition
    .facts;
    let send = effect(&delivered, &send_id);
    let mut decided = delivered.reload();
    decided.effects.clear();
    decided.decision = None;
    decided.run.status = crate::run::RunStatus::Cancelled;
    decided.run.queue = crate::run::QueueStatus::Cancelled;
    (decided, send)
}

fn edit(agg: &RunAggregate, send: &EffectRecord) -> (RunAggregate, EffectId, u32) {
    match settle(agg, PROFILE, send, 2, fingerprint(), None, 50).expect("an edit") {
        Settling::Edit {
            transition,
            effect_id,
            attempt_number,
        } => (transition.facts, effect_id, attempt_number),
        other => panic!("not an edit: {other:?}"),
    }
}

#[test]
fn a_decided_decision_settles_its_delivered_send_once_as_a_managed_edit() {
    let (decided, send) = decided_after_delivery();
    let (editing, settle_id, number) = edit(&decided, &send);
    assert_eq!(number, 1);
    let settlement = effect(&editing, &settle_id);
    assert_eq!(settlement.state, EffectState::Applying);
    assert_eq!(settlement.key, settle_key(&send, PROFILE));
    assert_eq!(settlement.key.effect_type, "channel.settle:ops");
    assert_eq!(settlement.key.node_path, send.key.node_path);
    // Applying already: a second settle could edit twice.
    assert_eq!(
        settle(&editing, PROFILE, &send, 2, fingerprint(), None, 51),
        Err(ChannelRejection::AlreadyApplying)
    );
    let reported = report(
        &editing,
        PROFILE,
        ChannelWork::Settle,
        &settle_id,
        1,
        SendOutcome::Delivered,
        Digest::repeat(8),
        60,
    )
    .expect("reported");
    let applied = effect(&reported.transition.facts, &settle_id);
    assert_eq!(applied.state, EffectState::Applied);
    let mut reloaded = reported.transition.facts.clone();
    reloaded.effects.clear();
    assert_eq!(
        settle(
            &reloaded,
            PROFILE,
            &send,
            2,
            fingerprint(),
            Some(&applied),
            70
        ),
        Ok(Settling::Settled { effect: applied })
    );
}

#[test]
fn a_pending_decision_or_an_undelivered_send_is_not_settled() {
    let (agg, send_id, _) = sent(&waiting());
    let applying = effect(&agg, &send_id);
    let mut delivered = applying.clone();
    delivered.state = EffectState::Applied;
    assert_eq!(
        settle(&agg, PROFILE, &delivered, 1, fingerprint(), None, 50),
        Err(ChannelRejection::DecisionPending)
    );
    let (decided, _) = decided_after_delivery();
    assert_eq!(
        settle(&decided, PROFILE, &applying, 1, fingerprint(), None, 50),
        Err(ChannelRejection::NotDelivered {
            state: EffectState::Applying
        })
    );
    assert_eq!(
        settle(&decided, "other", &delivered, 1, fingerprint(), None, 50),
        Err(ChannelRejection::StaleAttempt)
    );
}

#[test]
fn a_send_without_known_messages_is_settled_as_nothing_to_edit() {
    let (decided, send) = decided_after_delivery();
    let Ok(Settling::NothingToEdit { transition }) =
        settle(&decided, PROFILE, &send, 0, fingerprint(), None, 50)
    else {
        panic!("nothing to edit");
    };
    let settlement = effect(&transition.facts, &settle_key(&send, PROFILE).effect_id());
    assert_eq!(settlement.state, EffectState::Cancelled);
}

#[test]
fn a_report_of_other_work_another_profile_or_an_older_attempt_cannot_settle_an_edit() {
    let (decided, send) = decided_after_delivery();
    let (editing, settle_id, _) = edit(&decided, &send);
    for (profile, work, number) in [
        (PROFILE, ChannelWork::Send, 1),
        ("other", ChannelWork::Settle, 1),
        (PROFILE, ChannelWork::Settle, 2),
    ] {
        assert_eq!(
            report(
                &editing,
                profile,
                work,
                &settle_id,
                number,
                SendOutcome::Delivered,
                Digest::repeat(8),
                60,
            ),
            Err(ChannelRejection::StaleAttempt),
            "{profile} {work:?} {number}"
        );
    }
    // Nor can an edit's report settle a send.
    let (applying, send_id, _) = sent(&waiting());
    assert_eq!(
        report(
            &applying,
            PROFILE,
            ChannelWork::Settle,
            &send_id,
            1,
            SendOutcome::Delivered,
            Digest::repeat(8),
            60,
        ),
        Err(ChannelRejection::StaleAttempt)
    );
    // After an operator's retry, the older attempt settles nothing.
    let lost = on_adapter_lost(&editing, PROFILE, 61).expect("ambiguous");
    let retried = recover(
        &lost.facts,
        &settle_id,
        RecoveryAction::Retry,
        Digest::repeat(0),
        62,
    )
    .expect("retried");
    let (again, _, number) = edit(&retried.facts, &send);
    assert_eq!(number, 2);
    assert_eq!(
        report(
            &again,
            PROFILE,
            ChannelWork::Settle,
            &settle_id,
            1,
            SendOutcome::Delivered,
            Digest::repeat(8),
            63,
        ),
        Err(ChannelRejection::StaleAttempt)
    );
}

#[test]
fn an_interrupted_edit_is_ambiguous_and_only_an_operator_retries_it_even_after_the_run_ended() {
    let (decided, send) = decided_after_delivery();
    let (editing, settle_id, _) = edit(&decided, &send);
    let lost = on_adapter_lost(&editing, PROFILE, 60).expect("ambiguous");
    assert_eq!(
        effect(&lost.facts, &settle_id).state,
        EffectState::Ambiguous
    );
    assert_eq!(
        settle(&lost.facts, PROFILE, &send, 2, fingerprint(), None, 61),
        Err(ChannelRejection::Ambiguous)
    );
    // A workflow effect is never retried after its run ended; an edit is.
    assert!(matches!(
        crate::effect::recover(
            &lost.facts,
            &settle_id,
            RecoveryAction::Retry,
            Digest::repeat(0),
            62
        ),
        Err(EffectRejection::RetryAfterTerminal { .. })
    ));
    let retried = recover(
        &lost.facts,
        &settle_id,
        RecoveryAction::Retry,
        Digest::repeat(0),
        62,
    )
    .expect("retried");
    let next = effect(&retried.facts, &settle_id);
    assert_eq!(
        (next.state, next.attempt_number),
        (EffectState::Reserved, 2)
    );
    // Confirm records observed success.
    let confirmed = recover(
        &lost.facts,
        &settle_id,
        RecoveryAction::Confirm,
        Digest::repeat(0),
        63,
    )
    .expect("confirmed");
    assert_eq!(
        effect(&confirmed.facts, &settle_id).state,
        EffectState::Applied
    );
}

#[test]
fn a_send_is_never_retried_after_its_run_ended() {
    let (agg, send_id, _) = sent(&waiting());
    let mut lost = on_adapter_lost(&agg, PROFILE, 41).expect("ambiguous").facts;
    lost.decision = None;
    lost.run.status = crate::run::RunStatus::Cancelled;
    lost.run.queue = crate::run::QueueStatus::Cancelled;
    assert!(matches!(
        recover(
            &lost,
            &send_id,
            RecoveryAction::Retry,
            Digest::repeat(0),
            42
        ),
        Err(EffectRejection::RetryAfterTerminal { .. })
    ));
}
