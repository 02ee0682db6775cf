use super::*;
use crate::attempt::NodeOutcome;
use crate::claim::ClaimLostReason;
use crate::effect::{EffectKey, EffectRecord};
use crate::execution;
use crate::fixtures::{
    TTL_MS, admitted, chain, control_request, host_authority, reserved, result_record,
    runner_epoch, running,
};
use crate::ids::{AttemptId, Digest, EffectId, NodeId, RunId};
use crate::run::{QueueStatus, RunStatus};
use alloc::string::String;
use alloc::vec;
use proptest::prelude::*;

fn pair(agg: &RunAggregate) -> (RunStatus, QueueStatus) {
    (agg.run.status, agg.run.queue)
}

fn exit(generation: u64, kind: ExitKind) -> RunnerExit {
    RunnerExit {
        runner_epoch: runner_epoch(generation),
        kind,
    }
}

fn exited_events(outputs: &[Output]) -> usize {
    outputs
        .iter()
        .filter(|o| {
            matches!(
                o,
                Output::Event {
                    event: RunEvent::RunnerExited { .. },
                    ..
                }
            )
        })
        .count()
}

fn publishes(outputs: &[Output]) -> bool {
    outputs
        .iter()
        .any(|o| matches!(o, Output::PublishRun { .. }))
}

/// Generation `g`'s runner is running node `work` (it became ready at t=10).
fn live() -> RunAggregate {
    running(&admitted(&reserved(1, 0), 5).facts, "work", 10).facts
}

/// A committed change after `runner.ready` (a node update, an effect…).
fn progressed(agg: &RunAggregate, now_ms: u64) -> RunAggregate {
    Tx::begin(agg, now_ms).commit().facts
}

fn decide(
    agg: &RunAggregate,
    exit: RunnerExit,
    now_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let generation = agg.run.lease.generation.0;
    decide_exit(
        agg,
        exit,
        Some(&host_authority(generation)),
        control_request(),
        now_ms,
        TTL_MS,
    )
}

fn runner_outcome(agg: &RunAggregate) -> Option<RunnerOutcome> {
    match agg.run.runner.as_ref()?.status {
        RunnerStatus::Exited(outcome) => Some(outcome),
        _ => None,
    }
}

// ---- exits that only record an outcome --------------------------------------

#[test]
fn a_superseded_epoch_only_records_claim_lost() {
    let agg = progressed(&live(), 20);
    let transition = decide(&agg, exit(0, ExitKind::Abnormal), 30).unwrap();
    let after = &transition.facts;
    assert_eq!(
        pair(after),
        pair(&agg),
        "claim loss never fails or parks a run"
    );
    assert_eq!(after.run.revision, agg.run.revision, "not run progress");
    assert_eq!(
        after.run.runner, agg.run.runner,
        "the current runner is untouched"
    );
    assert!(transition.outputs.contains(&Output::Event {
        run_id: agg.run.run_id.clone(),
        event: RunEvent::RunnerExited {
            runner_epoch: runner_epoch(0),
            outcome: RunnerOutcome::ClaimLost
        }
    }));
    assert!(!publishes(&transition.outputs));
    assert!(transition.outputs.contains(&Output::Schedule));
}

#[test]
fn a_superseded_epoch_stopped_for_pause_records_cancelled() {
    let agg = live();
    let stopped = ExitKind::Stopped {
        reason: StopReason::Paused,
    };
    let transition = decide(&agg, exit(0, stopped), 30).unwrap();
    assert!(transition.outputs.iter().any(|o| matches!(
        o,
        Output::Event {
            event: RunEvent::RunnerExited {
                outcome: RunnerOutcome::Cancelled,
                ..
            },
            ..
        }
    )));
}

#[test]
fn a_runner_that_exits_after_the_run_waits_records_exited() {
    let mut topology = chain(&["work"]);
    topology.nodes[0].node_type = crate::topology::NodeType::Checkpoint;
    let agg = live();
    let record = result_record("a-1-work", "work", NodeOutcome::Ok, serde_json::json!({}));
    let authority = host_authority(1);
    let epoch = runner_epoch(1);
    let (waiting, _) = execution::finish_attempt(
        &agg,
        &topology,
        execution::Actor::Runner {
            authority: &authority,
            runner_epoch: &epoch,
        },
        &AttemptId::from("a-1-work"),
        execution::NodeResult {
            outcome: NodeOutcome::Ok,
            record,
        },
        AttemptId::from("unused"),
        20,
        TTL_MS,
    )
    .unwrap();
    let waiting = waiting.facts.reload();
    assert_eq!(pair(&waiting), (RunStatus::Waiting, QueueStatus::Parked));
    let transition = decide(&waiting, exit(1, ExitKind::Clean), 30).unwrap();
    let after = &transition.facts;
    assert_eq!(runner_outcome(after), Some(RunnerOutcome::Exited));
    assert_eq!(after.run.runner.as_ref().unwrap().finished_at_ms, Some(30));
    assert_eq!(pair(after), pair(&waiting));
    assert_eq!(after.run.revision, waiting.run.revision);
    assert_eq!(exited_events(&transition.outputs), 1);
}

#[test]
fn a_runner_of_a_paused_or_cancelled_run_records_cancelled() {
    let paused = run::pause(
        &live(),
        Some(&host_authority(1)),
        control_request(),
        20,
        TTL_MS,
    )
    .unwrap()
    .facts;
    let stopped = ExitKind::Stopped {
        reason: StopReason::Paused,
    };
    let after = decide(&paused, exit(1, stopped), 30).unwrap().facts;
    assert_eq!(runner_outcome(&after), Some(RunnerOutcome::Cancelled));
    assert_eq!(pair(&after), (RunStatus::Running, QueueStatus::Parked));
    assert!(after.run.paused);

    let cancelled = run::cancel(
        &live(),
        Some(&host_authority(1)),
        control_request(),
        20,
        TTL_MS,
    )
    .unwrap()
    .facts;
    let after = decide(&cancelled, exit(1, ExitKind::Clean), 30)
        .unwrap()
        .facts;
    assert_eq!(runner_outcome(&after), Some(RunnerOutcome::Cancelled));
    assert_eq!(
        after.run.status,
        RunStatus::Cancelled,
        "terminal is absorbing"
    );
}

#[test]
fn a_runner_fenced_by_recovery_records_claim_lost() {
    let recovered = run::recover(
        &live(),
        control_request(),
        run::ParkReason::Recovered,
        10 + TTL_MS,
        TTL_MS,
    )
    .unwrap()
    .facts;
    let after = decide(&recovered, exit(1, ExitKind::Clean), 10 + TTL_MS + 1)
        .unwrap()
        .facts;
    assert_eq!(runner_outcome(&after), Some(RunnerOutcome::ClaimLost));
    assert_eq!(after.run.park_reason, Some(ParkReason::Recovered));
}

#[test]
fn a_runner_stopped_for_a_node_timeout_records_timed_out() {
    let parked = run::park(&live(), &host_authority(1), ParkReason::ResumeReady, 20)
        .unwrap()
        .facts;
    for (kind, outcome) in [
        (
            ExitKind::Stopped {
                reason: StopReason::NodeTimedOut,
            },
            RunnerOutcome::TimedOut,
        ),
        (
            ExitKind::Stopped {
                reason: StopReason::Parked,
            },
            RunnerOutcome::Exited,
        ),
        (ExitKind::Orphaned, RunnerOutcome::Orphaned),
        (ExitKind::Abnormal, RunnerOutcome::Crashed),
    ] {
        let after = decide(&parked, exit(1, kind), 30).unwrap().facts;
        assert_eq!(runner_outcome(&after), Some(outcome), "{kind:?}");
        assert_eq!(after.run.park_reason, Some(ParkReason::ResumeReady));
    }
}

// ---- exits that decide -----------------------------------------------------

#[test]
fn a_missed_startup_deadline_parks_worker_timed_out() {
    let starting = admitted(&reserved(1, 0), 5).facts;
    let transition = decide(&starting, exit(1, ExitKind::StartupDeadlineMissed), 30).unwrap();
    let parked = &transition.facts;
    assert_eq!(pair(parked), (RunStatus::Running, QueueStatus::Parked));
    assert_eq!(parked.run.park_reason, Some(ParkReason::WorkerTimedOut));
    assert_eq!(runner_outcome(parked), Some(RunnerOutcome::TimedOut));
    assert_eq!(parked.run.lease.claim, None);
    assert!(
        !parked.run.is_admissible(),
        "it waits for an explicit resume"
    );
    assert_eq!(parked.run.revision, starting.run.revision.next());
    assert!(
        !transition
            .outputs
            .iter()
            .any(|o| matches!(o, Output::StopRunner { .. })),
        "the runner is already gone"
    );
}

#[test]
fn an_applying_effect_makes_the_exit_park_for_review() {
    let mut agg = progressed(&live(), 20);
    agg.effects = vec![EffectRecord {
        effect_id: EffectId::from("e-1"),
        key: EffectKey {
            run_id: RunId::from("run-1"),
            effect_type: String::from("http"),
            node_path: NodeId::from("work"),
            visit: 1,
        },
        request_fingerprint: Digest::repeat(1),
        state: EffectState::Applying,
        attempt_number: 1,
        node_attempt_id: Some(AttemptId::from("a-1-work")),
        result_digest: None,
    }];
    let parked = decide(&agg, exit(1, ExitKind::Abnormal), 30).unwrap().facts;
    assert_eq!(parked.run.park_reason, Some(ParkReason::EffectAmbiguous));
    assert_eq!(parked.effects[0].state, EffectState::Ambiguous);
    assert_eq!(runner_outcome(&parked), Some(RunnerOutcome::Crashed));
    assert!(!parked.run.is_admissible());
}

#[test]
fn an_orphaned_or_drained_runner_parks_for_automatic_resume_even_without_progress() {
    let agg = live();
    let orphaned = decide_exit(
        &agg,
        exit(1, ExitKind::Orphaned),
        None,
        control_request(),
        10 + TTL_MS,
        TTL_MS,
    )
    .unwrap()
    .facts;
    assert_eq!(orphaned.run.park_reason, Some(ParkReason::Recovered));
    assert_eq!(runner_outcome(&orphaned), Some(RunnerOutcome::Orphaned));
    assert!(
        orphaned.run.is_admissible(),
        "a server crash is not the runner's fault"
    );
    let stopped = ExitKind::Stopped {
        reason: StopReason::Parked,
    };
    let drained = decide(&agg, exit(1, stopped), 20).unwrap().facts;
    assert_eq!(drained.run.park_reason, Some(ParkReason::Drained));
    assert!(drained.run.is_admissible());
}

#[test]
fn an_exit_without_progress_since_ready_parks_runner_no_progress() {
    let agg = live();
    let ready = agg.run.runner.as_ref().unwrap().ready_revision;
    assert_eq!(ready, Some(agg.run.revision));
    let parked = decide(&agg, exit(1, ExitKind::Abnormal), 30).unwrap().facts;
    assert_eq!(parked.run.park_reason, Some(ParkReason::RunnerNoProgress));
    assert!(
        !parked.run.is_admissible(),
        "not claimed again automatically"
    );
    assert_eq!(
        parked.attempt.as_ref().unwrap().crash_retries,
        0,
        "a no-progress park is not a crash retry"
    );
    // A runner that never became ready made no progress either.
    let starting = admitted(&reserved(1, 0), 5).facts;
    let parked = decide(&starting, exit(1, ExitKind::Clean), 30)
        .unwrap()
        .facts;
    assert_eq!(parked.run.park_reason, Some(ParkReason::RunnerNoProgress));
    assert_eq!(runner_outcome(&parked), Some(RunnerOutcome::Crashed));
}

/// Torture seed 0x5eed3204 trials 320, 374, 386, 409, 410: the server let a
/// runner's claim expire before it committed anything (a loaded machine),
/// the runner's `runner.ready` was refused `claimLost`, the server fenced and
/// stopped it, and its exit parked the run `runnerNoProgress` (explicit
/// resume only) with outcome `crashed`. Claim loss is a handoff, not the
/// runner's fault: the exit records `claimLost` and parks `recovered`, as
/// the claim-expiry wake would have, whether or not the runner was ready or
/// made progress, and it is not a crash retry.
#[test]
fn a_runner_stopped_for_claim_loss_parks_for_automatic_resume_even_before_ready() {
    let stopped = ExitKind::Stopped {
        reason: StopReason::ClaimLost,
    };
    let starting = admitted(&reserved(1, 0), 5).facts;
    for agg in [starting, live(), progressed(&live(), 20)] {
        let expired = claim_expiry(&agg) + 1;
        // Fenced: the server no longer acts with the runner's authority.
        let transition = decide_exit(
            &agg,
            exit(1, stopped),
            None,
            control_request(),
            expired,
            TTL_MS,
        )
        .unwrap();
        let parked = &transition.facts;
        assert_eq!(runner_outcome(parked), Some(RunnerOutcome::ClaimLost));
        assert_eq!(parked.run.park_reason, Some(ParkReason::Recovered));
        assert!(parked.run.is_admissible(), "resumed automatically");
        assert_eq!(parked.run.lease.claim, None);
        assert_eq!(
            parked.attempt.as_ref().map(|attempt| attempt.crash_retries),
            agg.attempt.as_ref().map(|attempt| attempt.crash_retries),
            "a claim loss is not a crash retry"
        );
    }
}

#[test]
fn a_crash_after_progress_parks_worker_crashed_and_counts_a_retry() {
    let agg = progressed(&live(), 20);
    let transition = decide(&agg, exit(1, ExitKind::Abnormal), 30).unwrap();
    let parked = &transition.facts;
    assert_eq!(parked.run.park_reason, Some(ParkReason::WorkerCrashed));
    assert!(parked.run.is_admissible(), "resumes automatically");
    let attempt = parked.attempt.as_ref().unwrap();
    assert_eq!(attempt.status, AttemptStatus::Abandoned);
    assert_eq!(attempt.crash_retries, 1);
    assert!(parked.steps.is_empty());
    assert!(transition.outputs.contains(&Output::Schedule));
    assert!(!transition.outputs.iter().any(|o| matches!(
        o,
        Output::Event {
            event: RunEvent::Failed { .. },
            ..
        }
    )));
}

#[test]
fn a_crash_loop_fails_the_run_when_one_visit_was_abandoned_max_times() {
    let topology = chain(&["work"]);
    let mut agg = progressed(&live(), 20);
    let mut now_ms = 30;
    for retry in 1..=MAX_CRASH_RETRIES {
        agg = decide(
            &agg,
            exit(agg.run.lease.generation.0, ExitKind::Abnormal),
            now_ms,
        )
        .unwrap()
        .facts
        .reload();
        assert_eq!(agg.run.park_reason, Some(ParkReason::WorkerCrashed));
        assert_eq!(agg.attempt.as_ref().unwrap().crash_retries, retry);
        let generation = agg.run.lease.generation.0 + 1;
        let next = admitted(&agg, now_ms + 1).facts;
        let (started, _) = execution::start_generation(
            &next,
            &topology,
            &host_authority(generation),
            &runner_epoch(generation),
            None,
            None,
            AttemptId::new(alloc::format!("a-{generation}")),
            now_ms + 2,
            TTL_MS,
        )
        .unwrap();
        agg = progressed(&started.facts, now_ms + 3);
        assert_eq!(
            agg.attempt.as_ref().unwrap().visit,
            1,
            "the same visit reruns"
        );
        now_ms += 10;
    }
    let transition = decide(
        &agg,
        exit(agg.run.lease.generation.0, ExitKind::Abnormal),
        now_ms,
    )
    .unwrap();
    let failed = &transition.facts;
    assert_eq!(pair(failed), (RunStatus::Failed, QueueStatus::Failed));
    assert_eq!(
        failed.run.error,
        Some(RunError {
            class: FailureClass::WorkerCrashed,
            reason: ReasonKind::WorkerCrashed,
            node_id: Some(NodeId::from("work"))
        })
    );
    assert_eq!(
        failed.attempt.as_ref().unwrap().status,
        AttemptStatus::Abandoned
    );
    assert!(failed.steps.is_empty(), "a crashed attempt is not a step");
    assert_eq!(failed.run.lease.claim, None);
}

#[test]
fn an_exit_after_the_claim_expired_decides_under_a_control_claim() {
    let agg = progressed(&live(), 20);
    let later = 20 + TTL_MS;
    let transition = decide_exit(
        &agg,
        exit(1, ExitKind::Abnormal),
        None,
        control_request(),
        later,
        TTL_MS,
    )
    .unwrap();
    let parked = &transition.facts;
    assert_eq!(parked.run.park_reason, Some(ParkReason::WorkerCrashed));
    assert_eq!(parked.run.lease.generation.0, 2);
    assert_eq!(parked.run.lease.claim, None);
    assert!(
        !transition
            .outputs
            .iter()
            .any(|o| matches!(o, Output::StopRunner { .. })),
        "the exited runner needs no stop"
    );
}

/// A message that fails a protocol check parks the run `protocolRejected`
/// with the check recorded, releases the claim, abandons the attempt and
/// stops the runner; the runner's later exit only records its outcome, and
/// the run waits for an explicit resume.
#[test]
fn a_protocol_rejection_parks_for_review_and_records_the_check() {
    for check in [
        ProtocolCheck::Schema,
        ProtocolCheck::Revision,
        ProtocolCheck::Attempt,
        ProtocolCheck::Idempotency,
    ] {
        let agg = live();
        let transition = protocol_rejected(
            &agg,
            &host_authority(1),
            &runner_epoch(1),
            check,
            20,
            TTL_MS,
        )
        .unwrap();
        let parked = &transition.facts;
        assert_eq!(pair(parked), (RunStatus::Running, QueueStatus::Parked));
        assert_eq!(parked.run.park_reason, Some(ParkReason::ProtocolRejected));
        assert!(parked.run.lease.claim.is_none(), "{check:?}");
        assert_eq!(
            parked.attempt.as_ref().map(|attempt| attempt.status),
            Some(AttemptStatus::Abandoned)
        );
        assert_eq!(parked.steps, agg.steps, "the message changed no step");
        assert!(parked.run.error.is_none(), "not a failure of another class");
        assert!(transition.outputs.iter().any(|o| matches!(
            o,
            Output::Event { event: RunEvent::ProtocolRejected { check: recorded }, .. } if *recorded == check
        )));
        assert!(
            transition
                .outputs
                .iter()
                .any(|o| matches!(o, Output::StopRunner { .. }))
        );
        assert_eq!(parked.run.revision, agg.run.revision.next());
        let exited = decide(
            parked,
            exit(
                1,
                ExitKind::Stopped {
                    reason: StopReason::Parked,
                },
            ),
            30,
        )
        .unwrap()
        .facts;
        assert_eq!(exited.run.park_reason, Some(ParkReason::ProtocolRejected));
        assert_eq!(runner_outcome(&exited), Some(RunnerOutcome::Exited));
        assert!(!exited.run.is_admissible(), "waits for an explicit resume");
    }
}

/// Only the runner that holds the live claim of the current epoch can be
/// rejected for its protocol: another one has lost its claim (its own class).
#[test]
fn a_protocol_rejection_needs_the_live_claim_of_the_current_runner() {
    let agg = live();
    assert!(matches!(
        protocol_rejected(
            &agg,
            &host_authority(2),
            &runner_epoch(1),
            ProtocolCheck::Schema,
            20,
            TTL_MS
        ),
        Err(Rejection::ClaimLost { .. })
    ));
    assert_eq!(
        protocol_rejected(
            &agg,
            &host_authority(1),
            &runner_epoch(2),
            ProtocolCheck::Schema,
            20,
            TTL_MS
        ),
        Err(Rejection::StaleRunner)
    );
    assert!(matches!(
        protocol_rejected(
            &agg,
            &host_authority(1),
            &runner_epoch(1),
            ProtocolCheck::Schema,
            10 + TTL_MS + 1,
            TTL_MS
        ),
        Err(Rejection::ClaimLost { .. })
    ));
}

#[test]
fn a_second_exit_of_one_epoch_is_refused() {
    let parked = decide(&live(), exit(1, ExitKind::Abnormal), 30)
        .unwrap()
        .facts;
    assert_eq!(
        decide(&parked, exit(1, ExitKind::Abnormal), 31).map(|_| ()),
        Err(Rejection::RunnerAlreadyExited)
    );
}

#[test]
fn a_decision_against_a_live_claim_needs_the_exact_host_authority() {
    let agg = live();
    assert_eq!(
        decide_exit(
            &agg,
            exit(1, ExitKind::Abnormal),
            None,
            control_request(),
            30,
            TTL_MS
        )
        .map(|_| ()),
        Err(Rejection::ClaimHeld {
            expires_at_ms: 10 + TTL_MS
        })
    );
    assert_eq!(
        decide_exit(
            &agg,
            exit(1, ExitKind::Abnormal),
            Some(&host_authority(4)),
            control_request(),
            30,
            TTL_MS
        )
        .map(|_| ()),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::OwnerChanged
        })
    );
}

// ---- properties ------------------------------------------------------------

fn exit_kind() -> impl Strategy<Value = ExitKind> {
    prop_oneof![
        Just(ExitKind::Clean),
        Just(ExitKind::Abnormal),
        Just(ExitKind::StartupDeadlineMissed),
        Just(ExitKind::Orphaned),
        prop_oneof![
            Just(StopReason::Paused),
            Just(StopReason::Cancelled),
            Just(StopReason::Parked),
            Just(StopReason::NodeTimedOut),
            Just(StopReason::ClaimLost),
            Just(StopReason::Finished),
        ]
        .prop_map(|reason| ExitKind::Stopped { reason }),
    ]
}

/// A run in one of the states a runner can exit from.
fn exit_state() -> impl Strategy<Value = RunAggregate> {
    (0u8..7, 0u32..5, any::<bool>()).prop_map(|(state, crash_retries, progress)| {
        let mut agg = match state {
            0 => admitted(&reserved(1, 0), 5).facts,
            1 | 2 => live(),
            3 => {
                run::park(&live(), &host_authority(1), ParkReason::Drained, 20)
                    .unwrap()
                    .facts
            }
            4 => {
                run::pause(
                    &live(),
                    Some(&host_authority(1)),
                    control_request(),
                    20,
                    TTL_MS,
                )
                .unwrap()
                .facts
            }
            5 => {
                run::cancel(
                    &live(),
                    Some(&host_authority(1)),
                    control_request(),
                    20,
                    TTL_MS,
                )
                .unwrap()
                .facts
            }
            _ => {
                run::recover(
                    &live(),
                    control_request(),
                    ParkReason::Recovered,
                    10 + TTL_MS,
                    TTL_MS,
                )
                .unwrap()
                .facts
            }
        };
        if let Some(attempt) = agg.attempt.as_mut() {
            attempt.crash_retries = crash_retries;
        }
        if progress && agg.run.status == RunStatus::Running {
            agg = progressed(&agg, 21);
        }
        agg
    })
}

proptest! {
    /// Every exit records exactly one outcome; an exit that does not come
    /// from the runner driving the run changes nothing but its record; a run
    /// fails only for repeated crashes (`workerCrashed`), never for claim
    /// loss; every result stays in the state table without a claim.
    #[test]
    fn an_exit_records_one_outcome_and_fails_only_for_crash_loops(
        agg in exit_state(),
        kind in exit_kind(),
        superseded in any::<bool>(),
    ) {
        let generation = if superseded { 0 } else { 1 };
        let now_ms = 30 + TTL_MS;
        let Ok(transition) = decide_exit(&agg, exit(generation, kind), Some(&host_authority(1)), control_request(), now_ms, TTL_MS) else {
            prop_assert!(!superseded, "a superseded exit is always recorded");
            return Ok(());
        };
        let after = &transition.facts;
        prop_assert_eq!(exited_events(&transition.outputs), 1);
        let drives = !superseded && RunRecord::pair_holds_claim(agg.run.status, agg.run.queue);
        if !drives {
            prop_assert_eq!(pair(after), pair(&agg));
            prop_assert_eq!(after.run.revision, agg.run.revision);
            prop_assert_eq!(&after.steps, &agg.steps);
        }
        prop_assert!(RunRecord::pair_is_legal(after.run.status, after.run.queue));
        if !RunRecord::pair_holds_claim(after.run.status, after.run.queue) {
            prop_assert_eq!(&after.run.lease.claim, &None);
        }
        if drives {
            prop_assert!(!RunRecord::pair_holds_claim(after.run.status, after.run.queue),
                "the exit of the driving runner always parks or ends the run");
        }
        if after.run.status == RunStatus::Failed && agg.run.status != RunStatus::Failed {
            prop_assert!(drives);
            prop_assert_eq!(after.run.error.as_ref().map(|e| e.class), Some(FailureClass::WorkerCrashed));
            let attempt = agg.attempt.as_ref().unwrap();
            prop_assert!(attempt.crash_retries >= MAX_CRASH_RETRIES);
        }
        let claim_lost_failure = transition.outputs.iter().any(|o| matches!(o,
            Output::Event { event: RunEvent::Failed { class: FailureClass::ClaimLost }, .. }));
        prop_assert!(!claim_lost_failure);
        if !superseded {
            prop_assert!(runner_outcome(after).is_some(), "the current runner row records it");
        }
    }
}

fn claim_expiry(agg: &RunAggregate) -> u64 {
    agg.run.lease.claim.as_ref().expect("a claim").expires_at_ms
}

#[test]
fn an_expired_claim_of_a_run_that_holds_none_decides_nothing() {
    let queued = reserved(1, 0);
    let step = on_claim_expired(&queued, false, control_request(), 5_000, TTL_MS);
    assert_eq!(step, Ok(Step::Nothing));
}

#[test]
fn a_claim_still_live_at_its_expiry_wake_defers_to_the_new_expiry() {
    let agg = live();
    let expires = claim_expiry(&agg);
    for supervised in [false, true] {
        let step = on_claim_expired(&agg, supervised, control_request(), expires - 1, TTL_MS);
        assert_eq!(
            step,
            Ok(Step::Defer {
                at_ms: expires,
                reason: WakeReason::ClaimExpiry
            }),
            "supervised: {supervised}"
        );
    }
}

#[test]
fn an_expired_claim_of_a_previous_servers_runner_is_an_orphaned_exit() {
    let agg = live();
    let now_ms = claim_expiry(&agg) + 1;
    let Ok(Step::Apply(step)) = on_claim_expired(&agg, false, control_request(), now_ms, TTL_MS)
    else {
        panic!("an orphaned runner's run is decided");
    };
    let orphaned = decide_exit(
        &agg,
        exit(1, ExitKind::Orphaned),
        None,
        control_request(),
        now_ms,
        TTL_MS,
    )
    .expect("orphaned exit");
    assert_eq!(step, orphaned);
    assert_eq!(runner_outcome(&step.facts), Some(RunnerOutcome::Orphaned));
    assert_eq!(step.facts.run.park_reason, Some(ParkReason::Recovered));
}

#[test]
fn an_expired_claim_of_our_own_stalled_runner_is_recovered_with_a_control_claim() {
    let agg = live();
    let now_ms = claim_expiry(&agg) + 1;
    let Ok(Step::Apply(step)) = on_claim_expired(&agg, true, control_request(), now_ms, TTL_MS)
    else {
        panic!("a stalled runner's run is recovered");
    };
    let recovered = run::recover(
        &agg,
        control_request(),
        ParkReason::Recovered,
        now_ms,
        TTL_MS,
    )
    .expect("recover");
    assert_eq!(step, recovered);
    assert_eq!(pair(&step.facts), (RunStatus::Running, QueueStatus::Parked));
    assert!(step.outputs.iter().any(|output| matches!(
        output,
        Output::StopRunner {
            reason: StopReason::ClaimLost,
            ..
        }
    )));
}

#[test]
fn an_exit_without_authority_while_the_claim_is_live_is_decided_at_its_expiry() {
    let agg = live();
    let expires = claim_expiry(&agg);
    let step = on_exit(
        &agg,
        exit(1, ExitKind::Abnormal),
        None,
        control_request(),
        expires - 1,
        TTL_MS,
    );
    assert_eq!(
        step,
        Ok(Step::Defer {
            at_ms: expires,
            reason: WakeReason::ClaimExpiry
        })
    );
    // With the host authority the same exit is decided now.
    let decided = on_exit(
        &agg,
        exit(1, ExitKind::Abnormal),
        Some(&host_authority(1)),
        control_request(),
        expires - 1,
        TTL_MS,
    );
    assert!(matches!(decided, Ok(Step::Apply(_))), "{decided:?}");
}
