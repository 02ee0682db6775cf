use super::*;
use crate::attempt::AttemptStatus;
use crate::claim::ClaimLostReason;
use crate::fixtures::{
    self, TTL_MS, control_request, host_authority, interactive_running, request_proposal,
    runner_epoch, waiting_on_request,
};
use crate::ids::{Generation, MessageId};
use crate::reject::Coded as _;
use crate::run::{QueueStatus, ResumeIds, RunStatus};
use alloc::vec::Vec;
use proptest::prelude::*;

fn created(result: Result<Requested, InteractionRejection>) -> Transition<RunAggregate> {
    match result.expect("accepted") {
        Requested::Created(transition) => transition,
        Requested::Adopted(record) => panic!("adopted {record:?}"),
    }
}

fn request_now(
    agg: &RunAggregate,
    proposal: RequestProposal,
) -> Result<Requested, InteractionRejection> {
    request(
        agg,
        &host_authority(1),
        &runner_epoch(1),
        proposal,
        20,
        TTL_MS,
    )
}

fn new_submission(key: &str, payload: u8) -> NewSubmission {
    NewSubmission {
        submission_id: SubmissionId::new(alloc::format!("sub-{key}-{payload}")),
        idempotency_key: IdempotencyKey::from(key),
        payload_hash: Digest::repeat(payload),
    }
}

fn i1() -> InteractionId {
    InteractionId::from("i-1")
}

/// Submits and returns the new run facts and the whole submission list.
fn validating_on(
    agg: &RunAggregate,
    submissions: &[SubmissionRecord],
    key: &str,
    payload: u8,
) -> (RunAggregate, Vec<SubmissionRecord>) {
    match submit(agg, submissions, &i1(), new_submission(key, payload), 30).unwrap() {
        Submitted::Validating { run, submission } => {
            let mut all = submissions.to_vec();
            all.push(submission);
            (run.facts, all)
        }
        Submitted::Adopted(stored) => panic!("adopted {stored:?}"),
    }
}

fn replace(submissions: &[SubmissionRecord], row: SubmissionRecord) -> Vec<SubmissionRecord> {
    submissions
        .iter()
        .map(|s| {
            if s.submission_id == row.submission_id {
                row.clone()
            } else {
                s.clone()
            }
        })
        .collect()
}

fn pending_steps(agg: &RunAggregate) -> usize {
    agg.messages
        .iter()
        .filter(|m| m.state == MessageState::Pending && matches!(m.kind, MessageKind::Step { .. }))
        .count()
}

// ---- request ---------------------------------------------------------------

#[test]
fn request_waits_in_the_origin_session_and_releases_the_claim() {
    let agg = interactive_running(1);
    let mut proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
    proposal.deadline_at_ms = Some(500);
    let transition = created(request_now(&agg, proposal));
    let done = &transition.facts;
    assert_eq!(
        (done.run.status, done.run.queue),
        (RunStatus::Waiting, QueueStatus::Parked)
    );
    assert_eq!(done.run.lease.claim, None);
    assert_eq!(
        done.run.waiting_on, None,
        "an interaction is not a checkpoint wait"
    );
    let attempt = done.attempt.as_ref().unwrap();
    assert_eq!(attempt.status, AttemptStatus::Waiting);
    assert_eq!(attempt.deadline_at_ms, Some(500));
    let record = done.interaction.as_ref().unwrap();
    assert_eq!(record.status, InteractionStatus::Pending);
    assert_eq!(record.revision, 1);
    assert_eq!(record.unproductive_turn_ends, 0);
    assert_eq!(record.node_id, NodeId::from("ask"));
    assert_eq!(record.target_session, Some(SessionId::from("s-1")));
    assert_eq!(done.messages.len(), 1);
    let message = &done.messages[0];
    assert_eq!(message.message_id, MessageId::from("m-1"));
    assert_eq!(message.state, MessageState::Pending);
    assert_eq!(
        message.kind,
        MessageKind::Step {
            interaction_id: i1(),
            reason: StepReason::Initial
        }
    );
    // The deadline becomes model-turn time: the time left at the request
    // (500 − 20), on a stopped clock that no wake watches yet.
    assert_eq!(record.clock, TurnClock::new(Some(480)));
    let outputs = &transition.outputs;
    assert!(
        !outputs.iter().any(|o| matches!(o, Output::Wake { .. })),
        "the clock starts with the step's first turn: {outputs:?}"
    );
    assert!(outputs.contains(&Output::PublishSession {
        session_id: SessionId::from("s-1")
    }));
    assert!(outputs.iter().any(|o| matches!(
        o,
        Output::Event {
            event: RunEvent::InteractionRequested { .. },
            ..
        }
    )));
    assert_eq!(
        outputs
            .iter()
            .filter(|o| matches!(o, Output::PublishRun { .. }))
            .count(),
        1
    );
}

#[test]
fn a_request_lets_the_runner_exit_on_its_own() {
    let agg = interactive_running(1);
    let proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
    let transition = created(request_now(&agg, proposal));
    assert!(
        !transition
            .outputs
            .iter()
            .any(|o| matches!(o, Output::StopRunner { .. }))
    );
    assert!(transition.facts.run.runner.as_ref().unwrap().is_live());
}

#[test]
fn request_keeps_a_committed_deadline_and_wakes_only_when_no_time_is_left() {
    let mut agg = interactive_running(1);
    agg.attempt.as_mut().unwrap().deadline_at_ms = Some(300);
    let mut proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
    proposal.deadline_at_ms = Some(900);
    let transition = created(request_now(&agg, proposal));
    assert_eq!(
        transition.facts.interaction.as_ref().unwrap().clock,
        TurnClock::new(Some(280)),
        "the committed deadline wins: 300 − 20 left"
    );
    assert_eq!(transition.facts.attempt.unwrap().deadline_at_ms, Some(300));
    assert!(
        !transition
            .outputs
            .iter()
            .any(|o| matches!(o, Output::Wake { .. }))
    );

    // A deadline that passed before the request: no time is left, so the
    // timeout path is woken at once.
    let mut agg = interactive_running(1);
    agg.attempt.as_mut().unwrap().deadline_at_ms = Some(15);
    let transition = created(request_now(
        &agg,
        request_proposal(&agg, InteractionKind::SubmittedOutput),
    ));
    assert_eq!(
        transition.facts.interaction.as_ref().unwrap().clock,
        TurnClock::new(Some(0))
    );
    assert!(
        transition
            .outputs
            .iter()
            .any(|o| matches!(o, Output::Wake { at_ms: 20, .. }))
    );

    let agg = interactive_running(1);
    let transition = created(request_now(
        &agg,
        request_proposal(&agg, InteractionKind::AssistantMessage),
    ));
    assert!(
        !transition
            .outputs
            .iter()
            .any(|o| matches!(o, Output::Wake { .. }))
    );
    assert_eq!(
        transition.facts.messages.len(),
        1,
        "an assistant-message step is presented too"
    );
}

#[test]
fn a_repeated_request_adopts_without_change() {
    let agg = interactive_running(1);
    let proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
    let waiting = created(request_now(&agg, proposal.clone())).facts;
    let repeat = request_now(&waiting, proposal).unwrap();
    assert_eq!(
        repeat,
        Requested::Adopted(waiting.interaction.clone().unwrap())
    );
}

#[test]
fn another_request_for_the_same_attempt_conflicts() {
    let agg = interactive_running(1);
    let proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
    let waiting = created(request_now(&agg, proposal.clone())).facts;
    let other = RequestProposal {
        interaction_id: InteractionId::from("i-other"),
        ..proposal.clone()
    };
    assert_eq!(
        request_now(&waiting, other),
        Err(InteractionRejection::RequestConflict { existing: i1() })
    );
    let changed = RequestProposal {
        contract_hash: Digest::repeat(1),
        ..proposal
    };
    assert_eq!(
        request_now(&waiting, changed),
        Err(InteractionRejection::RequestConflict { existing: i1() })
    );
}

#[test]
fn a_repeat_from_another_runner_is_stale() {
    let agg = interactive_running(1);
    let proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
    let waiting = created(request_now(&agg, proposal.clone())).facts;
    assert_eq!(
        request(
            &waiting,
            &host_authority(1),
            &runner_epoch(7),
            proposal.clone(),
            21,
            TTL_MS
        ),
        Err(Rejection::StaleRunner.into())
    );
    assert_eq!(
        request(
            &waiting,
            &host_authority(2),
            &runner_epoch(1),
            proposal,
            21,
            TTL_MS
        ),
        Err(Rejection::StaleRunner.into())
    );
}

fn headless_running() -> RunAggregate {
    let agg = fixtures::admitted(&fixtures::reserved(1, 0), 5).facts;
    fixtures::running(&agg, "ask", 10).facts
}

#[test]
fn a_headless_request_keeps_the_attempt_active_under_the_claim_with_no_session_or_message() {
    let agg = headless_running();
    let mut proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
    proposal.deadline_at_ms = Some(9_000);
    let next = created(request_now(&agg, proposal.clone())).facts;
    let record = next.interaction.as_ref().expect("a request");
    assert_eq!(record.target_session, None);
    assert_eq!(record.status, InteractionStatus::Pending);
    let attempt = next.attempt.as_ref().expect("the attempt");
    assert_eq!(
        attempt.status,
        AttemptStatus::Active,
        "the live runner keeps working on it"
    );
    assert_eq!(attempt.deadline_at_ms, Some(9_000));
    assert_eq!(
        (next.run.status, next.run.queue),
        (agg.run.status, agg.run.queue)
    );
    assert!(
        next.run.lease.live_claim(20).is_some(),
        "the claim stays with the runner"
    );
    assert!(
        next.messages.is_empty(),
        "no origin session, no step message"
    );
    assert_eq!(next.run.revision.0, agg.run.revision.0 + 1);
    // A repeat adopts; a visible assistant-message request is refused.
    assert!(matches!(
        request_now(&next, proposal),
        Ok(Requested::Adopted(_))
    ));
    assert_eq!(
        request_now(
            &agg,
            request_proposal(&agg, InteractionKind::AssistantMessage)
        ),
        Err(InteractionRejection::Headless)
    );
}

#[test]
fn a_headless_submission_needs_the_live_runner_and_acceptance_leaves_the_finish_to_it() {
    let agg = headless_running();
    let agg = created(request_now(
        &agg,
        request_proposal(&agg, InteractionKind::SubmittedOutput),
    ))
    .facts;
    let runner = agg.run.runner.clone().expect("a runner");
    let live = SubmitAuthority::Runner {
        generation: agg.run.lease.generation,
        runner_epoch: runner.runner_epoch.clone(),
    };
    assert_eq!(check_authority(&agg, &live, None), Ok(()));
    let stale = SubmitAuthority::Runner {
        generation: Generation(agg.run.lease.generation.0 + 1),
        runner_epoch: runner.runner_epoch.clone(),
    };
    assert_eq!(
        check_authority(&agg, &stale, None),
        Err(Rejection::StaleRunner.into())
    );
    let other = SubmitAuthority::Runner {
        generation: agg.run.lease.generation,
        runner_epoch: runner_epoch(9),
    };
    assert_eq!(
        check_authority(&agg, &other, None),
        Err(Rejection::StaleRunner.into())
    );
    let session = SubmitAuthority::Coordinator {
        session_id: SessionId::from("s-1"),
        coordinator_epoch: CoordinatorEpoch(1),
    };
    assert_eq!(
        check_authority(&agg, &session, Some(CoordinatorEpoch(1))),
        Err(InteractionRejection::WrongAuthority)
    );

    let attempt_id = agg.attempt.as_ref().unwrap().attempt_id.clone();
    assert_eq!(
        finish_allowed(&agg, &attempt_id),
        Err(InteractionRejection::NotAccepted)
    );
    let (agg, submissions) = validating_on(&agg, &[], "k1", 1);
    assert_eq!(
        finish_allowed(&agg, &attempt_id),
        Err(InteractionRejection::NotAccepted)
    );
    let submission_id = submissions[0].submission_id.clone();
    let verdict = validation_accepted(&agg, &submissions, &i1(), &submission_id, 40).unwrap();
    assert_eq!(
        verdict.follow_up, None,
        "the live runner finishes a headless attempt itself"
    );
    assert_eq!(verdict.submission.outcome, SubmissionOutcome::Accepted);
    assert_eq!(finish_allowed(&verdict.run.facts, &attempt_id), Ok(()));
}

#[test]
fn an_interactive_submission_needs_its_origin_session() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let origin = agg.run.mode.origin_session().cloned().unwrap();
    let active = Some(CoordinatorEpoch(3));
    let coordinator = SubmitAuthority::Coordinator {
        session_id: origin,
        coordinator_epoch: CoordinatorEpoch(3),
    };
    assert_eq!(check_authority(&agg, &coordinator, active), Ok(()));
    let other = SubmitAuthority::Coordinator {
        session_id: SessionId::from("another-session"),
        coordinator_epoch: CoordinatorEpoch(3),
    };
    assert_eq!(
        check_authority(&agg, &other, active),
        Err(InteractionRejection::WrongAuthority)
    );
    let live = SubmitAuthority::Runner {
        generation: agg.run.lease.generation,
        runner_epoch: runner_epoch(1),
    };
    assert_eq!(
        check_authority(&agg, &live, active),
        Err(InteractionRejection::WrongAuthority),
        "an interactive run takes no runner's submission"
    );
}

#[test]
fn an_interactive_submission_needs_the_active_coordinator_epoch() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let origin = agg.run.mode.origin_session().cloned().unwrap();
    let at = |epoch| SubmitAuthority::Coordinator {
        session_id: origin.clone(),
        coordinator_epoch: CoordinatorEpoch(epoch),
    };
    assert_eq!(
        check_authority(&agg, &at(4), Some(CoordinatorEpoch(4))),
        Ok(())
    );
    // A fenced connection (an older epoch) and one from a later epoch than
    // the server knows are both stale.
    for (epoch, active) in [(3, Some(4)), (5, Some(4)), (4, None)] {
        assert_eq!(
            check_authority(&agg, &at(epoch), active.map(CoordinatorEpoch)),
            Err(InteractionRejection::StaleCoordinator),
            "epoch {epoch} against the active {active:?}"
        );
    }
    // A stale coordinator lost its claim: the wire says `claimLost`.
    let rejection = InteractionRejection::StaleCoordinator;
    assert_eq!(rejection.code(), crate::reject::WireCode::ClaimLost);
    assert!(rejection.is_claim_loss());
    assert_eq!(rejection.protocol_check(), None);
    // Another session is refused as the wrong authority whatever its epoch.
    let other = SubmitAuthority::Coordinator {
        session_id: SessionId::from("another-session"),
        coordinator_epoch: CoordinatorEpoch(4),
    };
    assert_eq!(
        check_authority(&agg, &other, None),
        Err(InteractionRejection::WrongAuthority)
    );
}

#[test]
fn a_request_needs_the_proposed_active_attempt() {
    let agg = interactive_running(1);
    let mut proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
    proposal.attempt_id = AttemptId::from("a-old");
    assert_eq!(
        request_now(&agg, proposal),
        Err(InteractionRejection::NotActiveAttempt {
            attempt_id: AttemptId::from("a-old")
        })
    );
    let mut abandoned = interactive_running(1);
    abandoned.attempt.as_mut().unwrap().status = AttemptStatus::Abandoned;
    let proposal = request_proposal(&abandoned, InteractionKind::SubmittedOutput);
    let attempt_id = proposal.attempt_id.clone();
    assert_eq!(
        request_now(&abandoned, proposal),
        Err(InteractionRejection::NotActiveAttempt { attempt_id })
    );
}

#[test]
fn a_request_under_a_lost_claim_changes_nothing() {
    let agg = interactive_running(1);
    let proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
    assert_eq!(
        request(
            &agg,
            &host_authority(1),
            &runner_epoch(1),
            proposal.clone(),
            10 + TTL_MS,
            TTL_MS
        ),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::Expired
        }
        .into())
    );
    let mut stranger = host_authority(1);
    stranger.token_hash = Digest::repeat(0xee);
    assert_eq!(
        request(&agg, &stranger, &runner_epoch(1), proposal, 20, TTL_MS),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::TokenChanged
        }
        .into())
    );
}

// ---- submit ----------------------------------------------------------------

#[test]
fn submit_records_a_validating_submission_and_spawns_the_validator() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let Submitted::Validating { run, submission } =
        submit(&agg, &[], &i1(), new_submission("k", 1), 30).unwrap()
    else {
        panic!("a new key is recorded");
    };
    assert_eq!(submission.outcome, SubmissionOutcome::Validating);
    assert_eq!(submission.interaction_id, i1());
    assert_eq!(submission.submitted_at_ms, 30);
    assert!(run.outputs.contains(&Output::SpawnValidator {
        run_id: RunId::from("run-1"),
        interaction_id: i1(),
        submission_id: submission.submission_id.clone(),
    }));
    assert_eq!(run.facts.run.revision, agg.run.revision.next());
    assert_eq!(
        run.facts.interaction, agg.interaction,
        "the request stays pending"
    );
}

#[test]
fn a_repeated_key_adopts_its_stored_outcome_even_after_settlement() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let (agg, subs) = validating_on(&agg, &[], "k", 1);
    assert_eq!(
        submit(&agg, &subs, &i1(), new_submission("k", 1), 31),
        Ok(Submitted::Adopted(subs[0].clone()))
    );
    let verdict = validation_accepted(&agg, &subs, &i1(), &subs[0].submission_id, 40).unwrap();
    let settled = verdict.run.facts;
    let subs = replace(&subs, verdict.submission);
    let Ok(Submitted::Adopted(stored)) = submit(&settled, &subs, &i1(), new_submission("k", 1), 41)
    else {
        panic!("a settled submission is adopted");
    };
    assert_eq!(stored.outcome, SubmissionOutcome::Accepted);
}

#[test]
fn the_same_key_with_another_payload_conflicts() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let (agg, subs) = validating_on(&agg, &[], "k", 1);
    assert_eq!(
        submit(&agg, &subs, &i1(), new_submission("k", 2), 31),
        Err(InteractionRejection::SubmissionConflict {
            submission_id: subs[0].submission_id.clone()
        })
    );
}

#[test]
fn a_paused_run_refuses_new_submissions() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let paused = run::pause(&agg, None, control_request(), 25, TTL_MS)
        .unwrap()
        .facts;
    assert!(is_paused(&paused));
    assert_eq!(
        submit(&paused, &[], &i1(), new_submission("k", 1), 30),
        Err(Rejection::Paused.into())
    );
}

#[test]
fn a_settled_request_refuses_new_keys() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let (agg, subs) = validating_on(&agg, &[], "k", 1);
    let verdict = validation_accepted(&agg, &subs, &i1(), &subs[0].submission_id, 40).unwrap();
    let subs = replace(&subs, verdict.submission);
    assert_eq!(
        submit(
            &verdict.run.facts,
            &subs,
            &i1(),
            new_submission("k2", 1),
            41
        ),
        Err(InteractionRejection::NotPending {
            status: InteractionStatus::Accepted
        })
    );
}

#[test]
fn one_submission_validates_at_a_time() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let (agg, subs) = validating_on(&agg, &[], "k", 1);
    assert_eq!(
        submit(&agg, &subs, &i1(), new_submission("k2", 2), 31),
        Err(InteractionRejection::ValidationInProgress {
            submission_id: subs[0].submission_id.clone()
        })
    );
}

#[test]
fn an_assistant_message_step_takes_no_submission() {
    let agg = waiting_on_request(1, InteractionKind::AssistantMessage);
    assert_eq!(
        submit(&agg, &[], &i1(), new_submission("k", 1), 30),
        Err(InteractionRejection::NotSubmittedOutput)
    );
}

#[test]
fn a_submission_must_name_the_runs_request() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let other = InteractionId::from("i-9");
    assert_eq!(
        submit(&agg, &[], &other, new_submission("k", 1), 30),
        Err(InteractionRejection::UnknownInteraction {
            interaction_id: other
        })
    );
}

// ---- verdicts --------------------------------------------------------------

#[test]
fn acceptance_settles_the_request_and_asks_execution_to_finish_the_attempt() {
    let mut agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    agg.messages[0].state = MessageState::Sent;
    agg.messages.push(MessageRecord {
        message_id: MessageId::from("m-reminder"),
        kind: MessageKind::Step {
            interaction_id: i1(),
            reason: StepReason::Reminder,
        },
        order: 2,
        state: MessageState::Pending,
        ..agg.messages[0].clone()
    });
    let (agg, subs) = validating_on(&agg, &[], "k", 1);
    let id = subs[0].submission_id.clone();
    let verdict = validation_accepted(&agg, &subs, &i1(), &id, 40).unwrap();
    assert_eq!(verdict.submission.outcome, SubmissionOutcome::Accepted);
    let record = verdict.run.facts.interaction.as_ref().unwrap();
    assert_eq!(record.status, InteractionStatus::Accepted);
    assert_eq!(record.accepted_submission, Some(id.clone()));
    assert_eq!(
        verdict.run.facts.messages[0].state,
        MessageState::Sent,
        "sent stays sent"
    );
    assert_eq!(verdict.run.facts.messages[1].state, MessageState::Cancelled);
    assert_eq!(
        verdict.follow_up,
        Some(AttemptFollowUp::FinishOk {
            run_id: RunId::from("run-1"),
            attempt_id: record.attempt_id.clone(),
            submission_id: id,
        })
    );
    let attempt = verdict.run.facts.attempt.as_ref().unwrap();
    assert_eq!(
        attempt.status,
        AttemptStatus::Waiting,
        "routing is the execution module's"
    );
    assert!(verdict.run.outputs.iter().any(|o| matches!(
        o,
        Output::Event {
            event: RunEvent::SubmissionAccepted { .. },
            ..
        }
    )));
}

#[test]
fn a_verdict_for_anything_but_the_validating_submission_is_stale() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let (agg, subs) = validating_on(&agg, &[], "k", 1);
    let verdict = validation_rejected(&agg, &subs, &i1(), &subs[0].submission_id, 40).unwrap();
    let rejected = replace(&subs, verdict.submission);
    let id = rejected[0].submission_id.clone();
    for result in [
        validation_accepted(&verdict.run.facts, &rejected, &i1(), &id, 41),
        validation_rejected(&verdict.run.facts, &rejected, &i1(), &id, 41),
        validator_stopped(&verdict.run.facts, &rejected, &i1(), &id, 41),
    ] {
        assert_eq!(
            result,
            Err(InteractionRejection::StaleVerdict {
                submission_id: id.clone()
            })
        );
    }
    let unknown = SubmissionId::from("sub-unknown");
    assert_eq!(
        validation_accepted(&agg, &subs, &i1(), &unknown, 41),
        Err(InteractionRejection::StaleVerdict {
            submission_id: unknown
        })
    );
}

#[test]
fn a_verdict_after_the_run_ended_changes_nothing() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let (agg, subs) = validating_on(&agg, &[], "k", 1);
    let mut cancelled = run::cancel(&agg, None, control_request(), 35, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        cancelled.interaction.as_ref().unwrap().status,
        InteractionStatus::Cancelled
    );
    let id = subs[0].submission_id.clone();
    assert_eq!(
        validation_accepted(&cancelled, &subs, &i1(), &id, 40),
        Err(Rejection::Terminal {
            status: RunStatus::Cancelled
        }
        .into())
    );
    cancelled.run.status = RunStatus::Waiting;
    cancelled.run.queue = QueueStatus::Parked;
    assert_eq!(
        validation_accepted(&cancelled, &subs, &i1(), &id, 40),
        Err(InteractionRejection::NotPending {
            status: InteractionStatus::Cancelled
        })
    );
}

#[test]
fn a_rejected_submission_leaves_the_request_pending_for_a_retry() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let (agg, subs) = validating_on(&agg, &[], "k", 1);
    let verdict = validation_rejected(&agg, &subs, &i1(), &subs[0].submission_id, 40).unwrap();
    assert_eq!(verdict.submission.outcome, SubmissionOutcome::Rejected);
    assert_eq!(verdict.follow_up, None);
    assert_eq!(verdict.run.facts.interaction, agg.interaction);
    assert!(verdict.run.outputs.iter().any(|o| matches!(
        o,
        Output::Event {
            event: RunEvent::SubmissionRejected {
                cause: RejectionCause::Invalid,
                ..
            },
            ..
        }
    )));
    let subs = replace(&subs, verdict.submission);
    let (_, subs) = validating_on(&verdict.run.facts, &subs, "k2", 2);
    assert_eq!(subs[1].outcome, SubmissionOutcome::Validating);
}

#[test]
fn a_stopped_validator_rejects_the_provisional_submission() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let (agg, subs) = validating_on(&agg, &[], "k", 1);
    let verdict = validator_stopped(&agg, &subs, &i1(), &subs[0].submission_id, 40).unwrap();
    assert_eq!(verdict.submission.outcome, SubmissionOutcome::Rejected);
    assert_eq!(
        verdict.run.facts.interaction.as_ref().unwrap().status,
        InteractionStatus::Pending
    );
    assert!(verdict.run.outputs.iter().any(|o| matches!(
        o,
        Output::Event {
            event: RunEvent::SubmissionRejected {
                cause: RejectionCause::ValidatorStopped,
                ..
            },
            ..
        }
    )));
}

// ---- aborted-turn pause ----------------------------------------------------

#[test]
fn an_aborted_turn_pauses_the_waiting_run_and_cancels_pending_steps() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    assert!(!is_paused(&agg));
    let transition = pause_after_aborted_turn(&agg, 30).unwrap();
    let paused = &transition.facts;
    assert!(paused.run.paused);
    assert!(is_paused(paused));
    assert_eq!(
        paused.interaction, agg.interaction,
        "pause is never stored on the interaction"
    );
    assert_eq!(pending_steps(paused), 0);
    assert_eq!(
        (paused.run.status, paused.run.queue),
        (RunStatus::Waiting, QueueStatus::Parked)
    );
    assert!(
        !transition
            .outputs
            .iter()
            .any(|o| matches!(o, Output::StopRunner { .. }))
    );
    assert!(transition.outputs.iter().any(|o| matches!(
        o,
        Output::Event {
            event: RunEvent::Paused,
            ..
        }
    )));
}

#[test]
fn an_aborted_turn_cannot_pause_twice_a_terminal_run_or_a_live_runner() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let paused = pause_after_aborted_turn(&agg, 30).unwrap().facts;
    assert_eq!(
        pause_after_aborted_turn(&paused, 31),
        Err(Rejection::AlreadyPaused)
    );
    let cancelled = run::cancel(&agg, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        pause_after_aborted_turn(&cancelled, 31),
        Err(Rejection::Terminal {
            status: RunStatus::Cancelled
        })
    );
    assert_eq!(
        pause_after_aborted_turn(&interactive_running(1), 31),
        Err(Rejection::IllegalTransition {
            operation: Operation::Pause,
            status: RunStatus::Running,
            queue: QueueStatus::Running,
        })
    );
}

#[test]
fn resume_presents_the_paused_request_again_with_one_step() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let paused = pause_after_aborted_turn(&agg, 30).unwrap().facts.reload();
    let ids = ResumeIds {
        resumed_message_id: MessageId::from("m-r"),
        message_order: 2,
    };
    let resumed = run::resume(&paused, ids, 40).unwrap().facts;
    assert!(!is_paused(&resumed));
    assert_eq!(resumed.interaction.as_ref().unwrap().revision, 2);
    assert_eq!(pending_steps(&resumed), 1);
}

#[test]
fn a_terminal_run_cancels_its_pending_request() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let record = agg.interaction.clone().unwrap();
    assert_eq!(
        on_run_terminal(&record).status,
        InteractionStatus::Cancelled
    );
    let accepted = InteractionRecord {
        status: InteractionStatus::Accepted,
        ..record
    };
    assert_eq!(on_run_terminal(&accepted), accepted);
}

// ---- properties ------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    RepeatRequest,
    Submit { key: u8, payload: u8 },
    Accept { pick: u8 },
    Reject { pick: u8 },
    Stop { pick: u8 },
    Pause,
    AbortTurn,
    Resume,
    Cancel,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::RepeatRequest),
        (0u8..3, 0u8..2).prop_map(|(key, payload)| Op::Submit { key, payload }),
        (0u8..4).prop_map(|pick| Op::Accept { pick }),
        (0u8..4).prop_map(|pick| Op::Reject { pick }),
        (0u8..4).prop_map(|pick| Op::Stop { pick }),
        Just(Op::Pause),
        Just(Op::AbortTurn),
        Just(Op::Resume),
        Just(Op::Cancel),
    ]
}

/// The applied result of one operation: new run facts, submission rows.
type Applied = Result<(RunAggregate, Vec<SubmissionRecord>), ()>;

fn apply(agg: &RunAggregate, subs: &[SubmissionRecord], op: &Op, now_ms: u64, n: usize) -> Applied {
    let pick = |i: u8| {
        subs.get(usize::from(i))
            .map_or(SubmissionId::from("none"), |s| s.submission_id.clone())
    };
    let verdict = |result: Result<Verdict, InteractionRejection>| {
        result
            .map(|v| (v.run.facts, replace(subs, v.submission)))
            .map_err(|_| ())
    };
    match op {
        Op::RepeatRequest => {
            let proposal = RequestProposal {
                attempt_id: agg.interaction.as_ref().unwrap().attempt_id.clone(),
                ..request_proposal(&interactive_running(1), InteractionKind::SubmittedOutput)
            };
            match request(
                agg,
                &host_authority(1),
                &runner_epoch(1),
                proposal,
                now_ms,
                TTL_MS,
            ) {
                Ok(Requested::Adopted(_)) => Ok((agg.clone(), subs.to_vec())),
                _ => Err(()),
            }
        }
        Op::Submit { key, payload } => {
            let submission = NewSubmission {
                submission_id: SubmissionId::new(alloc::format!("sub-{n}")),
                idempotency_key: IdempotencyKey::new(alloc::format!("k-{key}")),
                payload_hash: Digest::repeat(*payload),
            };
            match submit(agg, subs, &i1(), submission, now_ms) {
                Ok(Submitted::Validating { run, submission }) => {
                    let mut all = subs.to_vec();
                    all.push(submission);
                    Ok((run.facts, all))
                }
                Ok(Submitted::Adopted(_)) => Ok((agg.clone(), subs.to_vec())),
                Err(_) => Err(()),
            }
        }
        Op::Accept { pick: i } => verdict(validation_accepted(agg, subs, &i1(), &pick(*i), now_ms)),
        Op::Reject { pick: i } => verdict(validation_rejected(agg, subs, &i1(), &pick(*i), now_ms)),
        Op::Stop { pick: i } => verdict(validator_stopped(agg, subs, &i1(), &pick(*i), now_ms)),
        Op::Pause => run::pause(agg, None, control_request(), now_ms, TTL_MS)
            .map(|t| (t.facts, subs.to_vec()))
            .map_err(|_| ()),
        Op::AbortTurn => pause_after_aborted_turn(agg, now_ms)
            .map(|t| (t.facts, subs.to_vec()))
            .map_err(|_| ()),
        Op::Resume => {
            let ids = ResumeIds {
                resumed_message_id: MessageId::new(alloc::format!("m-r{n}")),
                message_order: 10 + n as u64,
            };
            run::resume(agg, ids, now_ms)
                .map(|t| (t.facts, subs.to_vec()))
                .map_err(|_| ())
        }
        Op::Cancel => run::cancel(agg, None, control_request(), now_ms, TTL_MS)
            .map(|t| (t.facts, subs.to_vec()))
            .map_err(|_| ()),
    }
}

proptest! {
    /// Any sequence of submissions, verdicts, pauses, resumes and cancels keeps
    /// one validating submission at most, one payload per key, an accepted
    /// request tied to exactly its accepted submission, one pending step at
    /// most, and changes nothing on a rejection.
    #[test]
    fn submissions_and_verdicts_keep_the_request_consistent(ops in proptest::collection::vec(op(), 1..30)) {
        let mut agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
        let mut subs: Vec<SubmissionRecord> = Vec::new();
        let mut keys: Vec<(IdempotencyKey, Digest)> = Vec::new();
        for (n, op) in ops.iter().enumerate() {
            let now_ms = 30 + n as u64;
            let before = (agg.clone(), subs.clone());
            match apply(&agg, &subs, op, now_ms, n) {
                Ok((next, next_subs)) => {
                    agg = next.reload();
                    if agg.interaction.is_none() {
                        // A settled request leaves the reloaded aggregate; keep the row.
                        let mut settled = before.0.interaction.clone().unwrap();
                        if let Some(accepted) = next_subs.iter().find(|s| s.outcome == SubmissionOutcome::Accepted) {
                            settled.status = InteractionStatus::Accepted;
                            settled.accepted_submission = Some(accepted.submission_id.clone());
                        } else {
                            settled.status = InteractionStatus::Cancelled;
                        }
                        agg.interaction = Some(settled);
                    }
                    subs = next_subs;
                }
                Err(()) => prop_assert_eq!(&(agg.clone(), subs.clone()), &before),
            }
            let validating = subs.iter().filter(|s| s.outcome == SubmissionOutcome::Validating).count();
            prop_assert!(validating <= 1);
            for s in &subs {
                match keys.iter().find(|(k, _)| *k == s.idempotency_key) {
                    Some((_, hash)) => prop_assert_eq!(*hash, s.payload_hash),
                    None => keys.push((s.idempotency_key.clone(), s.payload_hash)),
                }
            }
            let record = agg.interaction.as_ref().unwrap();
            let accepted: Vec<_> = subs.iter().filter(|s| s.outcome == SubmissionOutcome::Accepted).collect();
            prop_assert!(accepted.len() <= 1);
            prop_assert_eq!(
                record.status == InteractionStatus::Accepted,
                accepted.len() == 1
            );
            prop_assert_eq!(
                record.accepted_submission.as_ref(),
                accepted.first().map(|s| &s.submission_id)
            );
            prop_assert!(pending_steps(&agg) <= 1);
            prop_assert_eq!(is_paused(&agg), agg.run.paused && record.status == InteractionStatus::Pending);
        }
    }

    /// A request made at any time either commits the whole wait (attempt
    /// waiting, run waiting/parked without a claim, one pending step) or
    /// changes nothing.
    #[test]
    fn a_request_is_all_or_nothing(at in 10u64..(20 + TTL_MS), generation in 0u64..3, epoch in 0u64..3) {
        let agg = interactive_running(1);
        let proposal = request_proposal(&agg, InteractionKind::SubmittedOutput);
        match request(&agg, &host_authority(generation), &runner_epoch(epoch), proposal, at, TTL_MS) {
            Ok(Requested::Created(t)) => {
                prop_assert!(generation == 1 && epoch == 1 && at < 10 + TTL_MS);
                prop_assert_eq!(t.facts.run.status, RunStatus::Waiting);
                prop_assert_eq!(&t.facts.run.lease.claim, &None);
                prop_assert_eq!(t.facts.run.lease.generation, Generation(1));
                prop_assert_eq!(t.facts.attempt.as_ref().unwrap().status, AttemptStatus::Waiting);
                prop_assert_eq!(pending_steps(&t.facts), 1);
            }
            Ok(Requested::Adopted(_)) => prop_assert!(false, "nothing to adopt"),
            Err(_) => prop_assert!(generation != 1 || epoch != 1 || at >= 10 + TTL_MS),
        }
    }
}

#[test]
fn a_validating_submission_of_a_closed_request_is_abandoned_as_rejected_and_an_open_one_is_not() {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    let (agg, submissions) = validating_on(&agg, &[], "k1", 1);
    let submission_id = submissions[0].submission_id.clone();
    assert!(matches!(
        validation_abandoned(&agg, &submissions, &i1(), &submission_id),
        Err(InteractionRejection::ValidationInProgress { .. })
    ));
    let mut closed = agg.clone();
    closed.interaction.as_mut().unwrap().status = InteractionStatus::Cancelled;
    // No verdict can settle it any more ...
    assert!(validation_accepted(&closed, &submissions, &i1(), &submission_id, 40).is_err());
    // ... so it is abandoned: rejected, and nothing else changes.
    let abandoned = validation_abandoned(&closed, &submissions, &i1(), &submission_id).unwrap();
    assert_eq!(abandoned.outcome, SubmissionOutcome::Rejected);
    assert_eq!(abandoned.submission_id, submission_id);
    let settled = replace(&submissions, abandoned);
    assert!(matches!(
        validation_abandoned(&closed, &settled, &i1(), &submission_id),
        Err(InteractionRejection::StaleVerdict { .. })
    ));
}

/// The torture driver's Pi lane found it (`server/tests/torture_pi`): a
/// server killed after a headless agent step's submission was accepted and
/// before its runner's `node.finished` left the attempt abandoned, and the
/// next generation ran the step again (a second Pi, a second accepted
/// submission, the first one lost). Now the accepted submission decides the
/// abandoned attempt: the next generation finishes it with that output and
/// the run parks `resumeReady` to route on.
#[test]
fn a_headless_attempt_abandoned_after_its_submission_was_accepted_finishes_with_it_next_generation()
{
    use crate::execution::{Dispatch, NodeResult, start_generation};
    use crate::runner::ExitKind;
    let agg = headless_running();
    let agg = created(request_now(
        &agg,
        request_proposal(&agg, InteractionKind::SubmittedOutput),
    ))
    .facts;
    let (agg, submissions) = validating_on(&agg, &[], "k1", 1);
    let submission_id = submissions[0].submission_id.clone();
    let accepted = validation_accepted(&agg, &submissions, &i1(), &submission_id, 40)
        .unwrap()
        .run
        .facts;
    assert_eq!(
        adoptable_submission(&accepted),
        None,
        "the live runner finishes it"
    );
    let attempt_id = accepted.attempt.as_ref().unwrap().attempt_id.clone();

    // The server dies before `node.finished`: the restarted one finds the
    // runner orphaned and abandons its attempt.
    let parked = fixtures::runner_exited(&accepted, ExitKind::Orphaned, 50).facts;
    assert_eq!(
        parked.attempt.as_ref().map(|a| a.status),
        Some(AttemptStatus::Abandoned)
    );
    assert_eq!(adoptable_submission(&parked), Some(&submission_id));

    let admitted = fixtures::admitted(&parked, 60).facts;
    let topology = fixtures::chain(&["ask", "next"]);
    let output = serde_json::json!({"verdict": "approve"});
    let result = NodeResult {
        outcome: crate::attempt::NodeOutcome::Ok,
        record: fixtures::result_record(
            attempt_id.as_str(),
            "ask",
            crate::attempt::NodeOutcome::Ok,
            output,
        ),
    };
    let start = |adopted: Option<NodeResult>| {
        start_generation(
            &admitted,
            &topology,
            &host_authority(2),
            &runner_epoch(2),
            None,
            adopted,
            crate::ids::AttemptId::from("a-2"),
            70,
            TTL_MS,
        )
    };
    assert_eq!(
        start(None).map(|_| ()),
        Err(Rejection::ResultMismatch),
        "rerunning the step would ask the agent again"
    );
    let (transition, dispatch) = start(Some(result)).expect("adopted");
    let next = transition.facts;
    assert!(matches!(dispatch, Dispatch::Exit { .. }), "{dispatch:?}");
    let attempt = next.attempt.as_ref().unwrap();
    assert_eq!(
        attempt.attempt_id, attempt_id,
        "the same attempt, not a new one"
    );
    assert_eq!(
        attempt.status,
        AttemptStatus::Finished(crate::attempt::NodeOutcome::Ok)
    );
    assert_eq!(
        next.steps.last().map(|step| step.attempt_id.clone()),
        Some(attempt_id)
    );
    assert_eq!(
        next.interaction.as_ref().map(|record| record.status),
        Some(InteractionStatus::Accepted)
    );
    assert_eq!(
        next.interaction
            .as_ref()
            .and_then(|record| record.accepted_submission.clone()),
        Some(submission_id)
    );
    assert_eq!(
        (next.run.status, next.run.queue, next.run.park_reason),
        (
            RunStatus::Running,
            QueueStatus::Parked,
            Some(crate::run::ParkReason::ResumeReady)
        ),
        "the next generation routes on from the committed step"
    );
    assert_eq!(adoptable_submission(&next), None);
}
