use super::*;
use crate::attempt::AttemptStatus;
use crate::claim::ClaimLostReason;
use crate::effect::{EffectKey, EffectRecord, EffectState};
use crate::fixtures::{self, TTL_MS, admitted, control_request, host_authority, reserved, running};
use crate::ids::{AttemptId, EffectId, InteractionId, MessageId, Revision, SessionId, TurnId};
use crate::interaction::{InteractionKind, InteractionRecord, InteractionStatus};
use crate::message::{MessageKind, MessageRecord, MessageState, StepReason, TurnRecord, TurnState};
use crate::runner::{ExitKind, RunnerOutcome, RunnerStatus};
use alloc::string::String;
use alloc::vec;
use proptest::prelude::*;

fn pair(agg: &RunAggregate) -> (RunStatus, QueueStatus) {
    (agg.run.status, agg.run.queue)
}

fn has_output(outputs: &[Output], wanted: impl Fn(&Output) -> bool) -> bool {
    outputs.iter().any(wanted)
}

fn effect(state: EffectState) -> EffectRecord {
    EffectRecord {
        effect_id: EffectId::new(alloc::format!("e-{state:?}")),
        key: EffectKey {
            run_id: RunId::from("run-1"),
            effect_type: String::from("http"),
            node_path: NodeId::from("act"),
            visit: 1,
        },
        request_fingerprint: Digest::repeat(7),
        state,
        attempt_number: 1,
        node_attempt_id: None,
        result_digest: None,
    }
}

fn step_message(id: &str, state: MessageState, reason: StepReason) -> MessageRecord {
    MessageRecord {
        message_id: MessageId::from(id),
        session_id: SessionId::from("s-1"),
        run_id: RunId::from("run-1"),
        kind: MessageKind::Step {
            interaction_id: InteractionId::from("i-1"),
            reason,
        },
        order: 1,
        state,
        entry_id: None,
        created_at_ms: 0,
    }
}

fn message(id: &str, kind: MessageKind) -> MessageRecord {
    MessageRecord {
        message_id: MessageId::from(id),
        session_id: SessionId::from("s-1"),
        run_id: RunId::from("run-1"),
        kind,
        order: 2,
        state: MessageState::Pending,
        entry_id: None,
        created_at_ms: 0,
    }
}

fn interaction(kind: InteractionKind) -> InteractionRecord {
    InteractionRecord {
        interaction_id: InteractionId::from("i-1"),
        run_id: RunId::from("run-1"),
        attempt_id: AttemptId::from("a-1-ask"),
        node_id: NodeId::from("ask"),
        target_session: Some(SessionId::from("s-1")),
        kind,
        contract_hash: Digest::repeat(3),
        status: InteractionStatus::Pending,
        accepted_submission: None,
        unproductive_turn_ends: 0,
        revision: 1,
        clock: crate::interaction::TurnClock::default(),
        created_at_ms: 0,
    }
}

/// `running/running` with an active attempt, generation 1, at t=10.
fn live() -> RunAggregate {
    let agg = admitted(&reserved(1, 0), 5).facts;
    running(&agg, "work", 10).facts
}

/// The server reaps the runner it stopped for `reason`: its exit is recorded
/// through `runner::decide_exit`.
fn stopped_runner_exited(agg: &RunAggregate, reason: StopReason, now_ms: u64) -> RunAggregate {
    fixtures::runner_exited(agg, ExitKind::Stopped { reason }, now_ms).facts
}

/// A run waiting on an interactive request of `kind`.
fn waiting_on_interaction(kind: InteractionKind) -> RunAggregate {
    let agg = live();
    let mut tx = Tx::begin(&agg, 20);
    tx.agg.attempt.as_mut().unwrap().status = AttemptStatus::Waiting;
    wait_in(&mut tx, &host_authority(1), NodeId::from("work"), false).unwrap();
    tx.agg.interaction = Some(interaction(kind));
    tx.agg.messages = vec![step_message("m-1", MessageState::Sent, StepReason::Initial)];
    tx.commit().facts.reload()
}

/// A run waiting on checkpoint `gate`, with two finished steps.
fn waiting_on_checkpoint() -> RunAggregate {
    let agg = live();
    let mut tx = Tx::begin(&agg, 20);
    tx.agg.attempt = None;
    for step in [
        StepRecord {
            attempt_id: AttemptId::from("a-1-work"),
            node_id: NodeId::from("work"),
            outcome: NodeOutcome::Ok,
            carried: false,
        },
        StepRecord {
            attempt_id: AttemptId::from("a-1-gate"),
            node_id: NodeId::from("gate"),
            outcome: NodeOutcome::Ok,
            carried: false,
        },
    ] {
        tx.agg.steps.record(step);
    }
    wait_in(&mut tx, &host_authority(1), NodeId::from("gate"), true).unwrap();
    tx.commit().facts
}

fn resume_ids() -> ResumeIds {
    ResumeIds {
        resumed_message_id: MessageId::from("m-resumed"),
        message_order: 9,
    }
}

// ---- reserve ---------------------------------------------------------------

#[test]
fn reserve_creates_a_queued_run_at_revision_one() {
    let agg = reserved(1, 7);
    assert_eq!(pair(&agg), (RunStatus::Queued, QueueStatus::Queued));
    assert_eq!(agg.run.revision, Revision(1));
    assert_eq!(agg.run.lease, LeaseFacts::default());
    assert_eq!(agg.run.created_at_ms, 7);
    assert_eq!(agg.launch_command(), LaunchCommand::Start);
}

#[test]
fn reserve_refuses_a_second_interactive_run_in_one_session() {
    let mode = ExecutionMode::Interactive {
        origin_session: SessionId::from("s-1"),
    };
    let new_run = NewRun {
        run_id: RunId::from("run-2"),
        mode,
    };
    let busy = [RunId::from("run-1")];
    assert_eq!(
        reserve(new_run.clone(), Lineage::default(), &busy, 0).unwrap_err(),
        Rejection::SessionBusy {
            run_id: RunId::from("run-1")
        }
    );
    // A headless run reserves no session.
    let headless = NewRun {
        run_id: RunId::from("run-3"),
        mode: ExecutionMode::Headless,
    };
    assert!(reserve(headless, Lineage::default(), &busy, 0).is_ok());
}

#[test]
fn a_held_launch_waits_unscheduled_until_activate_releases_it_once() {
    let interactive = || NewRun {
        run_id: RunId::from("run-1"),
        mode: ExecutionMode::Interactive {
            origin_session: SessionId::from("s-1"),
        },
    };
    let held = reserve_held(interactive(), Lineage::default(), &[], 0).unwrap();
    assert_eq!(pair(&held.facts), (RunStatus::Queued, QueueStatus::Queued));
    assert_eq!(held.facts.run.park_reason, Some(ParkReason::Held));
    assert!(!has_output(&held.outputs, |o| matches!(
        o,
        Output::Schedule
    )));
    assert!(!held.facts.run.is_admissible());
    let token = crate::ids::Digest([7; 32]);
    assert!(matches!(
        admit(&held.facts, RunnerEpochId::from("re-1"), token, 1, TTL_MS),
        Err(Rejection::IllegalTransition {
            operation: Operation::Admit,
            ..
        })
    ));
    let activated = activate(&held.facts, 2).unwrap();
    assert_eq!(activated.facts.run.park_reason, None);
    assert!(has_output(&activated.outputs, |o| matches!(
        o,
        Output::Schedule
    )));
    assert!(activated.facts.run.is_admissible());
    assert_eq!(activated.facts.run.revision, held.facts.run.revision.next());
    assert!(matches!(
        activate(&activated.facts, 3),
        Err(Rejection::IllegalTransition {
            operation: Operation::Activate,
            ..
        })
    ));
    // Only an interactive launch (one with an origin session) can be held.
    let headless = NewRun {
        run_id: RunId::from("run-2"),
        mode: ExecutionMode::Headless,
    };
    assert!(reserve_held(headless, Lineage::default(), &[], 0).is_err());
}

#[test]
fn reserve_emits_event_schedule_and_publish() {
    let transition = reserve(
        NewRun {
            run_id: RunId::from("run-1"),
            mode: ExecutionMode::Headless,
        },
        Lineage::default(),
        &[],
        0,
    )
    .unwrap();
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::Event {
            event: RunEvent::Reserved,
            ..
        }
    )));
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::Schedule
    )));
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::PublishRun {
            revision: Revision(1),
            ..
        }
    )));
}

// ---- admit and ready -------------------------------------------------------

#[test]
fn admit_takes_generation_one_and_spawns_after_recording_the_epoch() {
    let transition = admitted(&reserved(1, 0), 5);
    let agg = &transition.facts;
    assert_eq!(pair(agg), (RunStatus::Running, QueueStatus::Starting));
    assert_eq!(agg.run.lease.generation, Generation(1));
    let runner = agg.run.runner.as_ref().unwrap();
    assert_eq!(runner.status, RunnerStatus::Launching);
    assert_eq!(runner.runner_epoch, fixtures::runner_epoch(1));
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::SpawnRunner {
            generation: Generation(1),
            command: LaunchCommand::Start,
            ..
        }
    )));
}

#[test]
fn admit_refuses_paused_running_terminal_and_ambiguous_runs() {
    let queued = reserved(1, 0);
    let paused = pause(&queued, None, control_request(), 1, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        admit(
            &paused,
            fixtures::runner_epoch(1),
            fixtures::token(1),
            2,
            TTL_MS
        ),
        Err(Rejection::Paused)
    );
    let starting = admitted(&queued, 1).facts;
    assert_eq!(
        admit(
            &starting,
            fixtures::runner_epoch(2),
            fixtures::token(2),
            2,
            TTL_MS
        ),
        Err(Rejection::IllegalTransition {
            operation: Operation::Admit,
            status: RunStatus::Running,
            queue: QueueStatus::Starting
        })
    );
    let cancelled = cancel(&queued, None, control_request(), 1, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        admit(
            &cancelled,
            fixtures::runner_epoch(1),
            fixtures::token(1),
            2,
            TTL_MS
        ),
        Err(Rejection::Terminal {
            status: RunStatus::Cancelled
        })
    );
    let parked = park(&live(), &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts;
    let mut ambiguous = stopped_runner_exited(&parked, StopReason::Parked, 35);
    ambiguous.effects.push(effect(EffectState::Ambiguous));
    assert_eq!(
        admit(
            &ambiguous,
            fixtures::runner_epoch(2),
            fixtures::token(2),
            40,
            TTL_MS
        ),
        Err(Rejection::EffectAmbiguous)
    );
}

#[test]
fn parked_runs_are_admissible_only_for_automatic_reasons() {
    let parked = park(&live(), &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts;
    let parked = stopped_runner_exited(&parked, StopReason::Parked, 35);
    assert!(parked.run.is_admissible());
    let readmitted = admitted(&parked, 40);
    assert_eq!(readmitted.facts.run.lease.generation, Generation(2));
    assert!(has_output(&readmitted.outputs, |o| matches!(
        o,
        Output::SpawnRunner {
            command: LaunchCommand::Resume,
            ..
        }
    )));
    for reason in [
        ParkReason::RunnerNoProgress,
        ParkReason::WorkflowSourceChanged,
        ParkReason::WorkerTimedOut,
        ParkReason::ProtocolRejected,
    ] {
        let parked = park(&live(), &host_authority(1), reason, 30).unwrap().facts;
        let parked = stopped_runner_exited(&parked, StopReason::Parked, 35);
        assert!(
            !parked.run.is_admissible(),
            "{reason:?} must wait for an explicit resume"
        );
    }
}

#[test]
fn admission_waits_until_the_previous_runner_epoch_exited() {
    // A `Ready` runner stopped by a drain.
    let parked = park(&live(), &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts;
    assert_eq!(
        parked.run.runner.as_ref().unwrap().status,
        RunnerStatus::Ready
    );
    assert!(!parked.run.is_admissible());
    let refused = Err(Rejection::RunnerLive {
        runner_epoch: fixtures::runner_epoch(1),
    });
    let admit_at = |agg: &RunAggregate, generation: u64, now_ms: u64| {
        admit(
            agg,
            fixtures::runner_epoch(generation),
            fixtures::token(generation),
            now_ms,
            TTL_MS,
        )
    };
    assert_eq!(admit_at(&parked, 2, 31), refused);
    let reaped = stopped_runner_exited(&parked, StopReason::Parked, 32);
    assert_eq!(
        reaped.run.runner.as_ref().unwrap().status,
        RunnerStatus::Exited(RunnerOutcome::Exited)
    );
    assert!(reaped.run.is_admissible());
    let readmitted = admit_at(&reaped, 2, 33).unwrap().facts;
    assert_eq!(readmitted.run.lease.generation, Generation(2));
    assert_eq!(
        readmitted.run.runner.as_ref().unwrap().runner_epoch,
        fixtures::runner_epoch(2)
    );

    // A `Launching` runner whose claim expired before `runner.ready`.
    let starting = admitted(&reserved(1, 0), 5).facts;
    let recovered = recover(
        &starting,
        control_request(),
        ParkReason::Recovered,
        5 + TTL_MS,
        TTL_MS,
    )
    .unwrap()
    .facts;
    assert_eq!(
        recovered.run.runner.as_ref().unwrap().status,
        RunnerStatus::Launching
    );
    assert!(!recovered.run.is_admissible());
    assert_eq!(admit_at(&recovered, 3, 6 + TTL_MS), refused);
    let reaped = stopped_runner_exited(&recovered, StopReason::ClaimLost, 7 + TTL_MS);
    assert_eq!(
        reaped.run.runner.as_ref().unwrap().status,
        RunnerStatus::Exited(RunnerOutcome::ClaimLost)
    );
    assert!(reaped.run.is_admissible());
    let readmitted = admit_at(&reaped, 3, 8 + TTL_MS).unwrap().facts;
    assert_eq!(readmitted.run.lease.generation, Generation(3));
}

#[test]
fn ready_requires_starting_the_current_epoch_and_the_live_claim() {
    let starting = admitted(&reserved(1, 0), 5).facts;
    let mut tx = Tx::begin(&starting, 6);
    assert_eq!(
        mark_ready(
            &mut tx,
            &host_authority(1),
            &fixtures::runner_epoch(9),
            TTL_MS
        ),
        Err(Rejection::StaleRunner)
    );
    let mut tx = Tx::begin(&starting, 6);
    assert_eq!(
        mark_ready(
            &mut tx,
            &host_authority(2),
            &fixtures::runner_epoch(1),
            TTL_MS
        ),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::OwnerChanged
        })
    );
    let mut tx = Tx::begin(&starting, 5 + TTL_MS);
    assert_eq!(
        mark_ready(
            &mut tx,
            &host_authority(1),
            &fixtures::runner_epoch(1),
            TTL_MS
        ),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::Expired
        })
    );
    let agg = live();
    assert_eq!(pair(&agg), (RunStatus::Running, QueueStatus::Running));
    assert_eq!(agg.run.runner.as_ref().unwrap().status, RunnerStatus::Ready);
    let mut tx = Tx::begin(&agg, 11);
    assert!(matches!(
        mark_ready(
            &mut tx,
            &host_authority(1),
            &fixtures::runner_epoch(1),
            TTL_MS
        ),
        Err(Rejection::IllegalTransition {
            operation: Operation::Ready,
            ..
        })
    ));
}

// ---- park and wait ---------------------------------------------------------

#[test]
fn park_releases_the_claim_and_abandons_the_active_attempt() {
    let transition = park(&live(), &host_authority(1), ParkReason::Drained, 30).unwrap();
    let agg = &transition.facts;
    assert_eq!(pair(agg), (RunStatus::Running, QueueStatus::Parked));
    assert_eq!(agg.run.lease.claim, None);
    assert_eq!(agg.run.lease.generation, Generation(1));
    assert_eq!(
        agg.attempt.as_ref().unwrap().status,
        AttemptStatus::Abandoned
    );
    assert!(agg.steps.is_empty(), "an abandoned attempt is not a step");
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::StopRunner {
            reason: StopReason::Parked,
            ..
        }
    )));
    let reloaded = agg.clone().reload();
    assert_eq!(
        reloaded.attempt.map(|attempt| attempt.status),
        Some(AttemptStatus::Abandoned),
        "the abandoned attempt stays loaded: it names the node to rerun"
    );
    assert!(
        reloaded.steps.is_empty(),
        "an abandoned attempt is still not a step"
    );
}

#[test]
fn park_with_an_applying_effect_parks_for_review() {
    let mut agg = live();
    agg.effects = vec![effect(EffectState::Applying), effect(EffectState::Reserved)];
    let parked = park(&agg, &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts;
    assert_eq!(parked.run.park_reason, Some(ParkReason::EffectAmbiguous));
    assert_eq!(parked.effects[0].state, EffectState::Ambiguous);
    assert_eq!(
        parked.effects[1].state,
        EffectState::Reserved,
        "a reservation that never began is reusable"
    );
    assert!(!parked.run.is_admissible());
}

#[test]
fn park_is_refused_for_a_stale_owner_and_outside_claim_holding_pairs() {
    assert_eq!(
        park(&live(), &host_authority(2), ParkReason::Drained, 30),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::OwnerChanged
        })
    );
    let parked = park(&live(), &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts;
    assert!(matches!(
        park(&parked, &host_authority(1), ParkReason::Drained, 31),
        Err(Rejection::IllegalTransition {
            operation: Operation::Park,
            ..
        })
    ));
}

#[test]
fn wait_moves_to_waiting_parked_without_a_claim() {
    let agg = waiting_on_checkpoint();
    assert_eq!(pair(&agg), (RunStatus::Waiting, QueueStatus::Parked));
    assert_eq!(agg.run.lease.claim, None);
    assert_eq!(agg.run.waiting_on, Some(NodeId::from("gate")));
    let interactive = waiting_on_interaction(InteractionKind::SubmittedOutput);
    assert_eq!(interactive.run.waiting_on, None);
    assert_eq!(
        interactive.attempt.as_ref().unwrap().status,
        AttemptStatus::Waiting
    );
}

// ---- pause -----------------------------------------------------------------

#[test]
fn pause_of_a_live_run_parks_releases_and_stops_the_runner_once() {
    let mut agg = live();
    agg.messages = vec![step_message(
        "m-1",
        MessageState::Pending,
        StepReason::Initial,
    )];
    let transition = pause(
        &agg,
        Some(&host_authority(1)),
        control_request(),
        30,
        TTL_MS,
    )
    .unwrap();
    let paused = &transition.facts;
    assert!(paused.run.paused);
    assert_eq!(pair(paused), (RunStatus::Running, QueueStatus::Parked));
    assert_eq!(paused.run.lease.claim, None);
    assert_eq!(paused.messages[0].state, MessageState::Cancelled);
    let stops = transition
        .outputs
        .iter()
        .filter(|o| matches!(o, Output::StopRunner { .. }))
        .count();
    assert_eq!(stops, 1);
    assert!(!paused.run.is_admissible());
}

#[test]
fn pause_against_another_live_claim_is_refused_and_an_expired_one_is_taken_over() {
    let agg = live();
    assert_eq!(
        pause(&agg, None, control_request(), 30, TTL_MS),
        Err(Rejection::ClaimHeld {
            expires_at_ms: 10 + TTL_MS
        })
    );
    assert_eq!(
        pause(
            &agg,
            Some(&host_authority(7)),
            control_request(),
            30,
            TTL_MS
        ),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::OwnerChanged
        })
    );
    let later = 10 + TTL_MS;
    let transition = pause(&agg, None, control_request(), later, TTL_MS).unwrap();
    assert_eq!(transition.facts.run.lease.generation, Generation(2));
    assert_eq!(transition.facts.run.lease.claim, None);
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::Event {
            event: RunEvent::ControlClaimed { .. },
            ..
        }
    )));
}

#[test]
fn pause_of_queued_and_waiting_runs_sets_the_flag_only() {
    let queued = pause(&reserved(1, 0), None, control_request(), 1, TTL_MS)
        .unwrap()
        .facts;
    assert!(queued.run.paused);
    assert_eq!(pair(&queued), (RunStatus::Queued, QueueStatus::Queued));
    let waiting = pause(
        &waiting_on_checkpoint(),
        None,
        control_request(),
        30,
        TTL_MS,
    )
    .unwrap()
    .facts;
    assert!(waiting.run.paused);
    assert_eq!(pair(&waiting), (RunStatus::Waiting, QueueStatus::Parked));
    assert_eq!(
        pause(&waiting, None, control_request(), 31, TTL_MS),
        Err(Rejection::AlreadyPaused)
    );
}

// ---- resume ----------------------------------------------------------------

#[test]
fn resume_of_a_paused_parked_run_makes_it_admissible() {
    let paused = pause(
        &live(),
        Some(&host_authority(1)),
        control_request(),
        30,
        TTL_MS,
    )
    .unwrap()
    .facts;
    let paused = stopped_runner_exited(&paused, StopReason::Paused, 35);
    let transition = resume(&paused, resume_ids(), 40).unwrap();
    assert!(!transition.facts.run.paused);
    assert!(transition.facts.run.is_admissible());
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::Schedule
    )));
    assert!(
        transition.facts.messages.is_empty(),
        "no interaction, no message"
    );
}

#[test]
fn resume_of_a_paused_submitted_output_step_presents_it_once_more() {
    let waiting = waiting_on_interaction(InteractionKind::SubmittedOutput);
    let paused = pause(&waiting, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts
        .reload();
    let resumed = resume(&paused, resume_ids(), 40).unwrap().facts;
    assert_eq!(resumed.interaction.as_ref().unwrap().revision, 2);
    let pending: Vec<_> = resumed
        .messages
        .iter()
        .filter(|m| m.state == MessageState::Pending)
        .collect();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].message_id, MessageId::from("m-resumed"));
    assert!(matches!(
        pending[0].kind,
        MessageKind::Step {
            reason: StepReason::Resumed,
            ..
        }
    ));
    assert_eq!(pair(&resumed), (RunStatus::Waiting, QueueStatus::Parked));
}

#[test]
fn resume_of_a_visible_response_step_does_not_create_a_step_message() {
    let waiting = waiting_on_interaction(InteractionKind::AssistantMessage);
    let paused = pause(&waiting, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts
        .reload();
    let resumed = resume(&paused, resume_ids(), 40).unwrap().facts;
    assert_eq!(resumed.interaction.as_ref().unwrap().revision, 1);
    assert!(
        resumed
            .messages
            .iter()
            .all(|m| m.state != MessageState::Pending)
    );
}

#[test]
fn resume_releases_a_review_park_but_not_an_ambiguous_effect() {
    let parked = park(
        &live(),
        &host_authority(1),
        ParkReason::RunnerNoProgress,
        30,
    )
    .unwrap()
    .facts;
    let parked = stopped_runner_exited(&parked, StopReason::Parked, 35);
    let resumed = resume(&parked, resume_ids(), 40).unwrap().facts;
    assert!(resumed.run.is_admissible());
    assert_eq!(resumed.run.park_reason, None);

    let mut agg = live();
    agg.effects = vec![effect(EffectState::Applying)];
    let ambiguous = park(&agg, &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts;
    assert_eq!(
        resume(&ambiguous, resume_ids(), 40),
        Err(Rejection::EffectAmbiguous)
    );
}

#[test]
fn resume_is_refused_when_there_is_nothing_to_resume() {
    assert_eq!(
        resume(&live(), resume_ids(), 20),
        Err(Rejection::NotResumable)
    );
    assert_eq!(
        resume(&reserved(1, 0), resume_ids(), 20),
        Err(Rejection::NotResumable)
    );
    let drained = park(&live(), &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts;
    assert_eq!(
        resume(&drained, resume_ids(), 40),
        Err(Rejection::NotResumable)
    );
    let done = finish(&live(), Some(&host_authority(1)), Terminal::Completed, 30)
        .unwrap()
        .facts;
    assert_eq!(
        resume(&done, resume_ids(), 40),
        Err(Rejection::Terminal {
            status: RunStatus::Completed
        })
    );
}

// ---- cancel ----------------------------------------------------------------

#[test]
fn cancel_of_a_live_run_settles_everything_in_one_transition() {
    let mut agg = live();
    agg.effects = vec![effect(EffectState::Reserved), effect(EffectState::Applying)];
    agg.interaction = Some(interaction(InteractionKind::SubmittedOutput));
    agg.messages = vec![
        step_message("m-1", MessageState::Pending, StepReason::Reminder),
        message("m-2", MessageKind::Notification),
        message(
            "m-3",
            MessageKind::FollowUp {
                follow_up_id: String::from("f-1"),
            },
        ),
    ];
    agg.turns = vec![TurnRecord {
        turn_id: TurnId::from("t-1"),
        message_id: MessageId::from("m-0"),
        run_id: RunId::from("run-1"),
        session_id: SessionId::from("s-1"),
        state: TurnState::Open,
        started_at_ms: 12,
        ended_at_ms: None,
        response_entry_id: None,
    }];
    let transition = cancel(
        &agg,
        Some(&host_authority(1)),
        control_request(),
        30,
        TTL_MS,
    )
    .unwrap();
    let done = &transition.facts;
    assert_eq!(pair(done), (RunStatus::Cancelled, QueueStatus::Cancelled));
    assert_eq!(done.run.lease.claim, None);
    assert_eq!(done.effects[0].state, EffectState::Cancelled);
    assert_eq!(done.effects[1].state, EffectState::Ambiguous);
    assert_eq!(
        done.attempt.as_ref().unwrap().status,
        AttemptStatus::Finished(NodeOutcome::Cancelled)
    );
    assert_eq!(
        done.interaction.as_ref().unwrap().status,
        InteractionStatus::Cancelled
    );
    assert_eq!(done.messages[0].state, MessageState::Cancelled);
    assert_eq!(
        done.messages[1].state,
        MessageState::Pending,
        "a notification stays eligible"
    );
    assert_eq!(
        done.messages[2].state,
        MessageState::Cancelled,
        "cancellation cancels follow-ups"
    );
    assert_eq!(done.turns[0].state, TurnState::Lost);
    assert_eq!(done.run.finished_at_ms, Some(30));
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::StopRunner {
            reason: StopReason::Cancelled,
            ..
        }
    )));
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::BuildTerminalMessage { .. }
    )));
}

#[test]
fn cancel_of_an_expired_row_first_takes_a_control_claim() {
    let agg = live();
    let transition = cancel(&agg, None, control_request(), 10 + TTL_MS, TTL_MS).unwrap();
    assert_eq!(transition.facts.run.status, RunStatus::Cancelled);
    assert_eq!(transition.facts.run.lease.generation, Generation(2));
    assert_eq!(transition.facts.run.lease.claim, None);
}

#[test]
fn cancel_cannot_force_a_live_claim_through_the_stale_path() {
    assert_eq!(
        cancel(&live(), None, control_request(), 30, TTL_MS),
        Err(Rejection::ClaimHeld {
            expires_at_ms: 10 + TTL_MS
        })
    );
}

#[test]
fn cancel_of_waiting_and_queued_runs_needs_no_claim() {
    let mut waiting = waiting_on_checkpoint();
    waiting.decision = Some(DecisionRecord {
        decision_id: crate::ids::DecisionId::from("d-1"),
        run_id: RunId::from("run-1"),
        node_id: NodeId::from("gate"),
        request_digest: Digest::repeat(1),
        status: decision::DecisionStatus::Pending,
        deadline_at_ms: None,
        default_answer_digest: None,
        continuation_run_id: None,
    });
    let cancelled = cancel(&waiting, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(cancelled.run.status, RunStatus::Cancelled);
    assert_eq!(
        cancelled.decision.unwrap().status,
        decision::DecisionStatus::Cancelled
    );
    assert_eq!(
        cancelled.run.lease.generation,
        Generation(1),
        "no claim was needed"
    );
    let queued = cancel(&reserved(1, 0), None, control_request(), 1, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        pair(&queued),
        (RunStatus::Cancelled, QueueStatus::Cancelled)
    );
}

// ---- finish ----------------------------------------------------------------

#[test]
fn finish_maps_each_terminal_to_its_pair() {
    let error = RunError {
        class: FailureClass::NodeFailed,
        reason: ReasonKind::NodeFailed,
        node_id: None,
    };
    let cases = [
        (
            Terminal::Completed,
            (RunStatus::Completed, QueueStatus::Done),
        ),
        (
            Terminal::Failed {
                error: error.clone(),
            },
            (RunStatus::Failed, QueueStatus::Failed),
        ),
        (
            Terminal::TimedOut {
                error: error.clone(),
            },
            (RunStatus::TimedOut, QueueStatus::Failed),
        ),
        (
            Terminal::Cancelled,
            (RunStatus::Cancelled, QueueStatus::Cancelled),
        ),
    ];
    for (terminal, expected) in cases {
        let mut agg = live();
        agg.attempt = None;
        let done = finish(&agg, Some(&host_authority(1)), terminal, 30)
            .unwrap()
            .facts;
        assert_eq!(pair(&done), expected);
        assert_eq!(done.run.lease.claim, None);
    }
}

#[test]
fn completion_keeps_follow_ups_and_failure_cancels_them() {
    let mut agg = live();
    agg.attempt = None;
    agg.messages = vec![message(
        "m-3",
        MessageKind::FollowUp {
            follow_up_id: String::from("f-1"),
        },
    )];
    let completed = finish(&agg, Some(&host_authority(1)), Terminal::Completed, 30)
        .unwrap()
        .facts;
    assert_eq!(completed.messages[0].state, MessageState::Pending);
    let error = RunError {
        class: FailureClass::NodeFailed,
        reason: ReasonKind::NodeFailed,
        node_id: None,
    };
    let failed = finish(
        &agg,
        Some(&host_authority(1)),
        Terminal::Failed { error },
        30,
    )
    .unwrap()
    .facts;
    assert_eq!(failed.messages[0].state, MessageState::Cancelled);
    assert_eq!(failed.run.error.unwrap().class, FailureClass::NodeFailed);
}

#[test]
fn finish_by_a_stale_owner_changes_nothing() {
    assert_eq!(
        finish(&live(), Some(&host_authority(2)), Terminal::Completed, 30),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::OwnerChanged
        })
    );
    assert_eq!(
        finish(&live(), None, Terminal::Completed, 30),
        Err(Rejection::ClaimHeld {
            expires_at_ms: 10 + TTL_MS
        })
    );
}

/// Found by the `kernel_ops` fuzz target: a runner's authority ended a run
/// that holds no claim (a queued run, a run parked by a drain), so a stale
/// runner's `run.failed` could end a run it no longer owns whenever the
/// shell did not check the claim first.
#[test]
fn finish_under_an_authority_needs_the_claim() {
    let queued = reserved(1, 0);
    let drained = park(&live(), &host_authority(1), ParkReason::Drained, 20)
        .unwrap()
        .facts;
    let missing = Err(Rejection::ClaimLost {
        reason: ClaimLostReason::MissingAuthority,
    });
    for agg in [&queued, &drained] {
        for authority in [host_authority(0), host_authority(1), host_authority(2)] {
            let failed = Terminal::Failed {
                error: RunError {
                    class: FailureClass::NodeFailed,
                    reason: ReasonKind::RunnerFailed,
                    node_id: None,
                },
            };
            assert_eq!(finish(agg, Some(&authority), failed, 30), missing);
            assert_eq!(
                finish(agg, Some(&authority), Terminal::Completed, 30),
                missing
            );
        }
    }
}

#[test]
fn finishing_a_running_run_whose_claim_expired_needs_a_control_claim() {
    let agg = live();
    assert_eq!(
        finish(&agg, None, Terminal::Completed, 10 + TTL_MS),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::MissingAuthority
        })
    );
    let cancelled = cancel(&agg, None, control_request(), 10 + TTL_MS, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        cancelled.run.lease.generation,
        Generation(2),
        "the stale path took a new generation"
    );
}

#[test]
fn terminal_states_are_absorbing() {
    let done = finish(&live(), Some(&host_authority(1)), Terminal::Completed, 30)
        .unwrap()
        .facts;
    let terminal = Rejection::Terminal {
        status: RunStatus::Completed,
    };
    assert_eq!(
        pause(&done, None, control_request(), 31, TTL_MS),
        Err(terminal.clone())
    );
    assert_eq!(
        cancel(&done, None, control_request(), 31, TTL_MS),
        Err(terminal.clone())
    );
    assert_eq!(
        finish(&done, None, Terminal::Cancelled, 31),
        Err(terminal.clone())
    );
    assert_eq!(
        recover(&done, control_request(), ParkReason::Recovered, 31, TTL_MS),
        Err(terminal.clone())
    );
    assert_eq!(
        admit(
            &done,
            fixtures::runner_epoch(2),
            fixtures::token(2),
            31,
            TTL_MS
        ),
        Err(terminal)
    );
}

// ---- restart ---------------------------------------------------------------

fn failed_run(n: u32, lineage: Option<RestartLineage>) -> RunAggregate {
    let mut agg = live();
    agg.run.run_id = RunId::new(alloc::format!("run-{n}"));
    agg.run.lineage.restart = lineage;
    let error = RunError {
        class: FailureClass::NodeFailed,
        reason: ReasonKind::NodeFailed,
        node_id: None,
    };
    finish(
        &agg,
        Some(&host_authority(1)),
        Terminal::Failed { error },
        30,
    )
    .unwrap()
    .facts
}

fn restart_lineage(parent: &str, number: u32, fingerprint: u8) -> RestartLineage {
    RestartLineage {
        root_run_id: RunId::from("run-0"),
        parent_run_id: RunId::from(parent),
        number,
        parent_fingerprint: Digest::repeat(fingerprint),
    }
}

#[test]
fn restart_reserves_a_new_run_with_lineage_and_leaves_the_old_one_unchanged() {
    let old = failed_run(1, None);
    let source = RestartSource {
        run: &old.run,
        terminal_fingerprint: Digest::repeat(1),
        chain: &[],
    };
    let new_run = NewRun {
        run_id: RunId::from("run-2"),
        mode: ExecutionMode::Headless,
    };
    let transition = restart(source, new_run, &[], 40).unwrap();
    let lineage = transition.facts.run.lineage.restart.clone().unwrap();
    assert_eq!(
        lineage,
        RestartLineage {
            root_run_id: RunId::from("run-1"),
            parent_run_id: RunId::from("run-1"),
            number: 1,
            parent_fingerprint: Digest::repeat(1),
        }
    );
    assert_eq!(
        transition.facts.launch_command(),
        LaunchCommand::Restart {
            restarted_run_id: RunId::from("run-1")
        }
    );
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::Event { run_id, event: RunEvent::Restarted { .. } } if *run_id == RunId::from("run-1")
    )));
    assert_eq!(
        pair(&transition.facts),
        (RunStatus::Queued, QueueStatus::Queued)
    );
}

#[test]
fn restart_refuses_cancelled_completed_and_live_runs() {
    let new_run = || NewRun {
        run_id: RunId::from("run-9"),
        mode: ExecutionMode::Headless,
    };
    let cancelled = cancel(&reserved(1, 0), None, control_request(), 1, TTL_MS)
        .unwrap()
        .facts;
    let completed = finish(&live(), Some(&host_authority(1)), Terminal::Completed, 30)
        .unwrap()
        .facts;
    let running = live();
    for (agg, reason) in [
        (&cancelled, RestartRefusal::Cancelled),
        (&completed, RestartRefusal::Completed),
        (&running, RestartRefusal::NotTerminal),
    ] {
        assert_eq!(
            restart_allowed(&agg.run, &Digest::repeat(1), &[]),
            Err(reason)
        );
        let source = RestartSource {
            run: &agg.run,
            terminal_fingerprint: Digest::repeat(1),
            chain: &[],
        };
        assert_eq!(
            restart(source, new_run(), &[], 40),
            Err(Rejection::RestartRefused { reason })
        );
    }
}

/// The chain counts from its root, siblings included: restarting the same
/// failed run twice is a repeated failure (its fingerprint was restarted
/// already), and a fourth restart anywhere in the chain is over the limit,
/// whichever run it starts from.
#[test]
fn restart_counts_the_whole_chain_from_its_root_siblings_included() {
    let new_run = || NewRun {
        run_id: RunId::from("run-9"),
        mode: ExecutionMode::Headless,
    };
    let refused = |reason| Err(Rejection::RestartRefused { reason });
    let root = failed_run(0, None);
    // The root was restarted once (fingerprint 0): restarting it again is
    // refused however it is reached.
    let once = [restart_lineage("run-0", 1, 0)];
    let source = RestartSource {
        run: &root.run,
        terminal_fingerprint: Digest::repeat(0),
        chain: &once,
    };
    assert_eq!(
        restart(source, new_run(), &[], 40),
        refused(RestartRefusal::RepeatedFailure)
    );
    // Its restart failed the same way: refused too.
    let first = failed_run(1, Some(restart_lineage("run-0", 1, 0)));
    let source = RestartSource {
        run: &first.run,
        terminal_fingerprint: Digest::repeat(0),
        chain: &once,
    };
    assert_eq!(
        restart(source, new_run(), &[], 40),
        refused(RestartRefusal::RepeatedFailure)
    );
    // A new failure restarts, as the chain's second restart.
    let source = RestartSource {
        run: &first.run,
        terminal_fingerprint: Digest::repeat(1),
        chain: &once,
    };
    let second = restart(source, new_run(), &[], 40).unwrap().facts;
    assert_eq!(
        second.run.lineage.restart,
        Some(RestartLineage {
            root_run_id: RunId::from("run-0"),
            parent_run_id: RunId::from("run-1"),
            number: 2,
            parent_fingerprint: Digest::repeat(1),
        })
    );
    // Three restarts in the chain (two of them siblings of each other): no
    // fourth, from any run of the chain, even with a new fingerprint.
    let three = [
        restart_lineage("run-0", 1, 0),
        restart_lineage("run-1", 2, 1),
        restart_lineage("run-1", 3, 2),
    ];
    for source_run in [
        &root,
        &first,
        &failed_run(3, Some(restart_lineage("run-1", 3, 2))),
    ] {
        assert_eq!(
            restart_allowed(&source_run.run, &Digest::repeat(9), &three),
            Err(RestartRefusal::LimitReached)
        );
    }
    // Restarts of another chain do not count.
    let other = [RestartLineage {
        root_run_id: RunId::from("run-x"),
        ..restart_lineage("run-x", 1, 9)
    }];
    assert_eq!(
        restart_allowed(&root.run, &Digest::repeat(9), &other),
        Ok(())
    );
}

/// The fingerprint covers the workflow identity and revision, the exact
/// input, the terminal state, the result or error and the reason, and
/// nothing else: equal outcomes share it, and changing any one part changes
/// it.
#[test]
fn the_terminal_fingerprint_changes_with_every_part_of_the_outcome_and_only_with_it() {
    let error = RunError {
        class: FailureClass::NodeFailed,
        reason: ReasonKind::MaxSteps,
        node_id: None,
    };
    let base = TerminalOutcome {
        workflow_ref: "loop",
        definition_digest: "sha256:aa",
        input_digest: Digest::repeat(1),
        status: RunStatus::Failed,
        error: Some(&error),
        output_digest: None,
    };
    assert_eq!(base.fingerprint(), base.clone().fingerprint());
    let other_class = RunError {
        class: FailureClass::WorkerCrashed,
        ..error.clone()
    };
    let other_reason = RunError {
        reason: ReasonKind::NodeFailed,
        ..error.clone()
    };
    let other_node = RunError {
        node_id: Some(NodeId::from("a")),
        ..error.clone()
    };
    let variants = [
        TerminalOutcome {
            workflow_ref: "loop2",
            ..base
        },
        TerminalOutcome {
            definition_digest: "sha256:ab",
            ..base
        },
        TerminalOutcome {
            input_digest: Digest::repeat(2),
            ..base
        },
        TerminalOutcome {
            status: RunStatus::TimedOut,
            ..base
        },
        TerminalOutcome {
            error: Some(&other_class),
            ..base
        },
        TerminalOutcome {
            error: Some(&other_reason),
            ..base
        },
        TerminalOutcome {
            error: Some(&other_node),
            ..base
        },
        TerminalOutcome {
            error: None,
            ..base
        },
        TerminalOutcome {
            output_digest: Some(Digest::repeat(3)),
            ..base
        },
    ];
    for (index, variant) in variants.iter().enumerate() {
        assert_ne!(variant.fingerprint(), base.fingerprint(), "variant {index}");
    }
}

// ---- continuation ----------------------------------------------------------

#[test]
fn continuation_settles_the_parent_and_carries_its_steps() {
    let parent = waiting_on_checkpoint();
    let reserved = reserve_continuation(&parent, RunId::from("run-1c"), 40).unwrap();
    let settled = &reserved.parent.facts;
    assert_eq!(pair(settled), (RunStatus::Completed, QueueStatus::Done));
    assert_eq!(
        settled.run.lineage.continued_by,
        Some(RunId::from("run-1c"))
    );
    assert!(
        !has_output(&reserved.parent.outputs, |o| matches!(
            o,
            Output::BuildTerminalMessage { .. }
        )),
        "a parent settled by its continuation gets no terminal message"
    );
    assert!(
        has_output(&reserved.parent.outputs, |o| matches!(
            o,
            Output::Event {
                event: RunEvent::Completed,
                ..
            }
        )),
        "a settled parent is completed, with its completed event"
    );
    let child = &reserved.child.facts;
    assert_eq!(pair(child), (RunStatus::Queued, QueueStatus::Queued));
    assert_eq!(child.steps.count, 2);
    assert!(
        !child.steps.has_own_steps(),
        "every carried step is carried"
    );
    assert!(child.steps.last().is_some_and(|step| step.carried));
    assert_eq!(
        child.launch_command(),
        LaunchCommand::Continue {
            parent_run_id: RunId::from("run-1"),
            checkpoint: NodeId::from("gate")
        }
    );
}

#[test]
fn continuation_is_refused_twice_while_paused_and_outside_a_checkpoint_wait() {
    let parent = waiting_on_checkpoint();
    let settled = reserve_continuation(&parent, RunId::from("run-1c"), 40)
        .unwrap()
        .parent
        .facts;
    assert_eq!(
        reserve_continuation(&settled, RunId::from("run-1d"), 41),
        Err(Rejection::AlreadyContinued {
            continuation_run_id: RunId::from("run-1c")
        })
    );
    let paused = pause(&parent, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        reserve_continuation(&paused, RunId::from("run-1c"), 40),
        Err(Rejection::Paused)
    );
    let interactive = waiting_on_interaction(InteractionKind::SubmittedOutput);
    assert!(matches!(
        reserve_continuation(&interactive, RunId::from("run-1c"), 40),
        Err(Rejection::IllegalTransition {
            operation: Operation::Continue,
            ..
        })
    ));
}

#[test]
fn an_interactive_continuation_inherits_the_parent_session_reservation() {
    let mut parent = waiting_on_checkpoint();
    parent.run.mode = ExecutionMode::Interactive {
        origin_session: SessionId::from("s-1"),
    };
    let reserved = reserve_continuation(&parent, RunId::from("run-1c"), 40).unwrap();
    assert_eq!(reserved.child.facts.run.mode, parent.run.mode);
}

// ---- recovery --------------------------------------------------------------

#[test]
fn recovery_takes_a_new_generation_and_parks_expired_rows() {
    let agg = live();
    assert_eq!(
        recover(&agg, control_request(), ParkReason::Recovered, 30, TTL_MS),
        Err(Rejection::ClaimHeld {
            expires_at_ms: 10 + TTL_MS
        })
    );
    let transition = recover(
        &agg,
        control_request(),
        ParkReason::Recovered,
        10 + TTL_MS,
        TTL_MS,
    )
    .unwrap();
    let recovered = &transition.facts;
    assert_eq!(pair(recovered), (RunStatus::Running, QueueStatus::Parked));
    assert_eq!(recovered.run.lease.generation, Generation(2));
    assert_eq!(recovered.run.park_reason, Some(ParkReason::Recovered));
    assert!(has_output(&transition.outputs, |o| matches!(
        o,
        Output::StopRunner {
            reason: StopReason::ClaimLost,
            ..
        }
    )));
    assert!(
        !has_output(&transition.outputs, |o| matches!(
            o,
            Output::Event {
                event: RunEvent::Failed { .. },
                ..
            }
        )),
        "claim loss is a handoff, not a failure"
    );
    let reaped = stopped_runner_exited(recovered, StopReason::ClaimLost, 10 + TTL_MS + 1);
    assert!(reaped.run.is_admissible());
    let readmitted = admitted(&reaped, 10 + TTL_MS + 2).facts;
    assert_eq!(readmitted.run.lease.generation, Generation(3));
}

// ---- properties ------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Admit,
    Ready,
    Park(ParkReason),
    Wait,
    Pause {
        with_host: bool,
    },
    Resume,
    Cancel {
        with_host: bool,
    },
    Complete,
    Fail,
    Recover,
    /// The recorded runner's process exits (stopped, or on its own).
    RunnerExits(ExitKind),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Admit),
        Just(Op::Ready),
        prop_oneof![
            Just(ParkReason::Drained),
            Just(ParkReason::RunnerNoProgress),
            Just(ParkReason::WorkflowSourceChanged)
        ]
        .prop_map(Op::Park),
        Just(Op::Wait),
        any::<bool>().prop_map(|with_host| Op::Pause { with_host }),
        Just(Op::Resume),
        any::<bool>().prop_map(|with_host| Op::Cancel { with_host }),
        Just(Op::Complete),
        Just(Op::Fail),
        Just(Op::Recover),
        prop_oneof![
            Just(ExitKind::Clean),
            Just(ExitKind::Abnormal),
            Just(ExitKind::Stopped {
                reason: StopReason::Parked
            }),
        ]
        .prop_map(Op::RunnerExits),
        (0u64..1_500).prop_map(Op::Advance),
    ]
}

proptest! {
    /// Any sequence of lifecycle operations keeps the run inside the state
    /// table, never holds a claim outside claim-holding pairs, keeps terminal
    /// states absorbing, admits only after the previous runner epoch exited
    /// and increases the revision once per accepted step (a runner exit that
    /// decides nothing for the run keeps it).
    #[test]
    fn every_reachable_pair_is_in_the_table(ops in proptest::collection::vec(op(), 1..40)) {
        let mut agg = reserved(1, 0);
        let mut now_ms = 1u64;
        for op in ops {
            let generation = agg.run.lease.generation.0;
            let host = host_authority(generation);
            let before = agg.clone();
            let result = match op {
                Op::Advance(ms) => { now_ms += ms; continue; }
                Op::Admit => admit(&agg, fixtures::runner_epoch(generation + 1), fixtures::token(generation + 1), now_ms, TTL_MS),
                Op::Ready => {
                    let mut tx = Tx::begin(&agg, now_ms);
                    mark_ready(&mut tx, &host, &fixtures::runner_epoch(generation), TTL_MS).map(|()| {
                        tx.agg.attempt = Some(fixtures::active_attempt("n", "a", generation, now_ms));
                        tx.commit()
                    })
                }
                Op::Park(reason) => park(&agg, &host, reason, now_ms),
                Op::Wait => {
                    let mut tx = Tx::begin(&agg, now_ms);
                    wait_in(&mut tx, &host, NodeId::from("n"), true).map(|()| tx.commit())
                }
                Op::Pause { with_host } => pause(&agg, with_host.then_some(&host), control_request(), now_ms, TTL_MS),
                Op::Resume => resume(&agg, resume_ids(), now_ms),
                Op::Cancel { with_host } => cancel(&agg, with_host.then_some(&host), control_request(), now_ms, TTL_MS),
                Op::Complete => finish(&agg, Some(&host), Terminal::Completed, now_ms),
                Op::Fail => finish(&agg, Some(&host), Terminal::Failed {
                    error: RunError { class: FailureClass::NodeFailed, reason: ReasonKind::NodeFailed, node_id: None },
                }, now_ms),
                Op::Recover => recover(&agg, control_request(), ParkReason::Recovered, now_ms, TTL_MS),
                Op::RunnerExits(kind) => {
                    if agg.run.live_runner().is_none() {
                        continue;
                    }
                    fixtures::try_runner_exited(&agg, kind, now_ms)
                }
            };
            match result {
                Ok(transition) => {
                    if let Op::RunnerExits(_) = op {
                        agg = transition.facts.reload();
                        prop_assert!(agg.run.live_runner().is_none(), "the exit was not recorded");
                        let decided = RunRecord::pair_holds_claim(before.run.status, before.run.queue);
                        let revision = if decided { before.run.revision.next() } else { before.run.revision };
                        prop_assert_eq!(agg.run.revision, revision);
                    } else {
                        prop_assert!(!before.run.status.is_terminal(), "a terminal run changed");
                        agg = transition.facts.reload();
                        prop_assert_eq!(agg.run.revision, before.run.revision.next());
                    }
                    if let Op::Admit = op {
                        prop_assert!(before.run.live_runner().is_none(), "admitted beside a live runner epoch");
                    }
                    prop_assert!(agg.run.lease.generation >= before.run.lease.generation);
                }
                Err(_) => prop_assert_eq!(&agg, &before),
            }
            prop_assert!(RunRecord::pair_is_legal(agg.run.status, agg.run.queue),
                "illegal pair {:?}", (agg.run.status, agg.run.queue));
            if !RunRecord::pair_holds_claim(agg.run.status, agg.run.queue) {
                prop_assert_eq!(&agg.run.lease.claim, &None);
            }
            if agg.run.status.is_terminal() {
                prop_assert!(agg.run.finished_at_ms.is_some());
                prop_assert!(!agg.run.paused);
            }
        }
    }
}

#[test]
fn a_stale_expected_revision_is_refused_before_anything_is_decided() {
    use crate::reject::{Coded as _, WireCode};
    let agg = reserved(1, 0);
    let current = agg.run.revision.0;
    assert_eq!(check_revision(&agg.run, None), Ok(()));
    assert_eq!(check_revision(&agg.run, Some(current)), Ok(()));
    let stale = check_revision(&agg.run, Some(current + 1));
    assert_eq!(
        stale,
        Err(Rejection::StaleRevision {
            revision: agg.run.revision
        })
    );
    let rejection = stale.unwrap_err();
    assert_eq!(rejection.code(), WireCode::StaleRevision);
    // A runner that names a stale revision broke the protocol's revision check.
    assert_eq!(
        rejection.protocol_check(),
        Some(crate::runner::ProtocolCheck::Revision)
    );
}

#[test]
fn a_held_restart_is_the_same_restart_parked_held_and_not_scheduled_until_activated() {
    let old = failed_run(1, None);
    let source = RestartSource {
        run: &old.run,
        terminal_fingerprint: Digest::repeat(1),
        chain: &[],
    };
    let interactive = ExecutionMode::Interactive {
        origin_session: SessionId::from("s-1"),
    };
    let new_run = NewRun {
        run_id: RunId::from("run-2"),
        mode: interactive,
    };
    let held = restart_held(source.clone(), new_run, &[], 40).unwrap();
    assert_eq!(held.facts.run.park_reason, Some(ParkReason::Held));
    assert!(!held.facts.run.is_admissible());
    assert!(!held.outputs.contains(&Output::Schedule));
    assert_eq!(held.facts.run.lineage.restart.as_ref().unwrap().number, 1);
    let activated = activate(&held.facts, 50).unwrap();
    assert!(activated.facts.run.is_admissible());
    assert!(activated.outputs.contains(&Output::Schedule));
    // A headless run has no turn to wait for: it cannot be held.
    let headless = NewRun {
        run_id: RunId::from("run-3"),
        mode: ExecutionMode::Headless,
    };
    assert!(restart_held(source, headless, &[], 40).is_err());
}
