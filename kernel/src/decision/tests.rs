use super::*;
use crate::claim::ClaimLostReason;
use crate::fixtures::{TTL_MS, control_request, live_run, pending_decision, waiting_at_checkpoint};
use crate::ids::{Generation, MessageId};
use crate::message::{MessageKind, MessageRecord, MessageState};
use crate::output::{LaunchCommand, Output};
use crate::run::{ExecutionMode, QueueStatus, RunStatus};
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;

const DEADLINE_MS: u64 = 100;

fn answer_a() -> Digest {
    Digest::repeat(0xa1)
}

fn answer_b() -> Digest {
    Digest::repeat(0xb2)
}

fn default_answer() -> Digest {
    Digest::repeat(0xdf)
}

/// `run-1` waiting on checkpoint `gate` (generation 1, revision r) with a
/// pending decision `d-1` and its pending decision message.
fn parent_with(deadline_at_ms: Option<u64>, default: Option<Digest>) -> RunAggregate {
    let mut agg = waiting_at_checkpoint(&live_run(1, "work", 10), "gate", 20);
    agg.decision = Some(pending_decision(&agg, deadline_at_ms, default));
    agg.messages = vec![MessageRecord {
        message_id: MessageId::from("m-d"),
        session_id: SessionId::from("s-1"),
        run_id: RunId::from("run-1"),
        kind: MessageKind::Decision {
            decision_id: DecisionId::from("d-1"),
        },
        order: 1,
        state: MessageState::Pending,
        entry_id: None,
        created_at_ms: 20,
    }];
    agg
}

fn parent() -> RunAggregate {
    parent_with(Some(DEADLINE_MS), Some(default_answer()))
}

fn pending(agg: &RunAggregate) -> DecisionRecord {
    agg.decision.clone().expect("a pending decision")
}

fn identity() -> ContinuationIdentity {
    ContinuationIdentity {
        child_run_id: RunId::from("run-1c"),
        workflow_source_digest: Digest::repeat(1),
        definition_digest: Digest::repeat(2),
        input_digest: Digest::repeat(3),
        launch_options_digest: Digest::repeat(4),
        parent_run_id: RunId::from("run-1"),
        owning_session: None,
    }
}

fn request() -> ContinuationRequest {
    ContinuationRequest {
        identity: identity(),
        control: control_request(),
    }
}

fn accepted_by(provenance: Provenance, digest: Digest) -> DecisionStatus {
    DecisionStatus::Accepted {
        provenance,
        answer_digest: digest,
    }
}

fn events(outputs: &[Output]) -> Vec<RunEvent> {
    outputs
        .iter()
        .filter_map(|output| match output {
            Output::Event { event, .. } => Some(event.clone()),
            _ => None,
        })
        .collect()
}

fn publishes(outputs: &[Output]) -> usize {
    outputs
        .iter()
        .filter(|output| matches!(output, Output::PublishRun { .. }))
        .count()
}

/// Checks the one-transition shape every acceptance shares.
fn assert_continued(before: &RunAggregate, continued: &Continued) {
    let settled = &continued.parent.facts;
    assert_eq!(
        (settled.run.status, settled.run.queue),
        (RunStatus::Completed, QueueStatus::Done)
    );
    assert_eq!(
        settled.run.lineage.continued_by,
        Some(RunId::from("run-1c"))
    );
    assert_eq!(
        settled.run.lease.generation,
        before.run.lease.generation.next(),
        "exactly one control generation"
    );
    assert_eq!(
        settled.run.lease.claim, None,
        "the control claim is released"
    );
    assert_eq!(settled.run.revision, before.run.revision.next());
    assert_eq!(publishes(&continued.parent.outputs), 1);
    assert_eq!(
        continued.decision.continuation_run_id,
        Some(RunId::from("run-1c"))
    );
    assert!(
        settled
            .messages
            .iter()
            .all(|m| m.state != MessageState::Pending)
    );
    let child = &continued.child.facts;
    assert_eq!(
        (child.run.status, child.run.queue),
        (RunStatus::Queued, QueueStatus::Queued)
    );
    assert_eq!(
        child.launch_command(),
        LaunchCommand::Continue {
            parent_run_id: RunId::from("run-1"),
            checkpoint: NodeId::from("gate")
        }
    );
    let parent_events = events(&continued.parent.outputs);
    assert!(parent_events.contains(&RunEvent::ControlClaimed {
        generation: before.run.lease.generation.next()
    }));
    assert!(parent_events.contains(&RunEvent::Continued {
        continuation_run_id: RunId::from("run-1c")
    }));
}

// ---- answer ----------------------------------------------------------------

#[test]
fn an_answer_before_the_deadline_is_accepted_and_continued_in_one_transition() {
    let agg = parent();
    let Answered::Accepted(continued) = answer(
        &agg,
        &pending(&agg),
        answer_a(),
        &request(),
        DEADLINE_MS - 1,
        TTL_MS,
    )
    .unwrap() else {
        panic!("a timely answer wins");
    };
    assert_continued(&agg, &continued);
    assert_eq!(
        continued.decision.status,
        accepted_by(Provenance::Human, answer_a())
    );
    assert_eq!(
        continued.parent.facts.decision.as_ref(),
        Some(&continued.decision)
    );
    assert!(
        events(&continued.parent.outputs).contains(&RunEvent::DecisionAccepted {
            decision_id: DecisionId::from("d-1"),
            provenance: Provenance::Human,
        })
    );
}

#[test]
fn an_answer_at_or_after_the_deadline_loses_even_before_the_timer_fires() {
    let agg = parent();
    for now_ms in [DEADLINE_MS, DEADLINE_MS + 1] {
        assert_eq!(
            answer(&agg, &pending(&agg), answer_a(), &request(), now_ms, TTL_MS),
            Err(DecisionRejection::DeadlinePassed {
                deadline_at_ms: DEADLINE_MS
            })
        );
    }
}

#[test]
fn a_decision_without_a_deadline_accepts_answers_at_any_time() {
    let agg = parent_with(None, None);
    assert!(matches!(
        answer(
            &agg,
            &pending(&agg),
            answer_a(),
            &request(),
            1_000_000,
            TTL_MS
        ),
        Ok(Answered::Accepted(_))
    ));
}

#[test]
fn an_identical_retry_adopts_and_another_answer_is_already_decided() {
    let agg = parent();
    let Answered::Accepted(continued) =
        answer(&agg, &pending(&agg), answer_a(), &request(), 50, TTL_MS).unwrap()
    else {
        panic!("a timely answer wins");
    };
    let settled = continued.parent.facts.reload();
    let decided = continued.decision;
    // The retry may arrive after the deadline: it is the same, winning answer.
    assert_eq!(
        answer(
            &settled,
            &decided,
            answer_a(),
            &request(),
            DEADLINE_MS + 5,
            TTL_MS
        ),
        Ok(Answered::Adopted(decided.clone()))
    );
    assert_eq!(
        answer(&settled, &decided, answer_b(), &request(), 60, TTL_MS),
        Err(DecisionRejection::AlreadyDecided)
    );
}

#[test]
fn a_late_answer_after_the_default_won_reports_the_deadline() {
    let agg = parent();
    let mut decided = pending(&agg);
    decided.status = accepted_by(Provenance::Timeout, default_answer());
    assert_eq!(
        answer(&agg, &decided, default_answer(), &request(), 120, TTL_MS),
        Err(DecisionRejection::DeadlinePassed {
            deadline_at_ms: DEADLINE_MS
        })
    );
}

#[test]
fn answers_to_cancelled_or_expired_decisions_are_refused() {
    let agg = parent();
    let mut cancelled = pending(&agg);
    cancelled.status = DecisionStatus::Cancelled;
    assert_eq!(
        answer(&agg, &cancelled, answer_a(), &request(), 50, TTL_MS),
        Err(DecisionRejection::Cancelled)
    );
    let mut expired = pending(&agg);
    expired.status = DecisionStatus::Expired;
    assert_eq!(
        answer(&agg, &expired, answer_a(), &request(), 50, TTL_MS),
        Err(DecisionRejection::Expired)
    );
}

#[test]
fn answers_wait_while_the_run_is_paused() {
    let agg = parent();
    let paused = run::pause(&agg, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        answer(&paused, &pending(&agg), answer_a(), &request(), 50, TTL_MS),
        Err(DecisionRejection::Paused)
    );
}

#[test]
fn an_answer_for_another_checkpoint_is_refused() {
    let agg = parent();
    let mut other = pending(&agg);
    other.node_id = NodeId::from("other-gate");
    assert_eq!(
        answer(&agg, &other, answer_a(), &request(), 50, TTL_MS),
        Err(DecisionRejection::NotThisCheckpoint)
    );
    let mut other_run = pending(&agg);
    other_run.run_id = RunId::from("run-2");
    assert_eq!(
        answer(&agg, &other_run, answer_a(), &request(), 50, TTL_MS),
        Err(DecisionRejection::NotThisCheckpoint)
    );
}

#[test]
fn an_answer_whose_continuation_names_another_parent_or_session_is_refused() {
    let agg = parent();
    let mut other_parent = request();
    other_parent.identity.parent_run_id = RunId::from("run-2");
    assert_eq!(
        answer(&agg, &pending(&agg), answer_a(), &other_parent, 50, TTL_MS),
        Err(DecisionRejection::IncompatibleContinuation {
            field: IdentityField::ParentRun
        })
    );
    let mut other_session = request();
    other_session.identity.owning_session = Some(SessionId::from("s-9"));
    assert_eq!(
        answer(&agg, &pending(&agg), answer_a(), &other_session, 50, TTL_MS),
        Err(DecisionRejection::IncompatibleContinuation {
            field: IdentityField::OwningSession
        })
    );
}

#[test]
fn an_answer_cannot_take_control_of_a_parent_with_a_live_claim() {
    let mut agg = parent();
    let held = claim::acquire(&agg.run.lease, control_request(), 40, TTL_MS).unwrap();
    agg.run.lease = held;
    assert_eq!(
        answer(&agg, &pending(&agg), answer_a(), &request(), 50, TTL_MS),
        Err(DecisionRejection::Run {
            run: run::Rejection::ClaimHeld {
                expires_at_ms: 40 + TTL_MS
            }
        })
    );
}

// ---- expire ----------------------------------------------------------------

#[test]
fn the_deadline_accepts_the_default_and_continues() {
    let agg = parent();
    let Expiry::Defaulted(continued) =
        expire(&agg, &pending(&agg), &request(), DEADLINE_MS, TTL_MS).unwrap()
    else {
        panic!("a default applies at the deadline");
    };
    assert_continued(&agg, &continued);
    assert_eq!(
        continued.decision.status,
        accepted_by(Provenance::Timeout, default_answer())
    );
}

#[test]
fn the_deadline_without_a_default_expires_the_decision_and_times_the_run_out() {
    let agg = parent_with(Some(DEADLINE_MS), None);
    let Expiry::Expired { decision, parent } =
        expire(&agg, &pending(&agg), &request(), DEADLINE_MS + 3, TTL_MS).unwrap()
    else {
        panic!("no default: the decision expires");
    };
    assert_eq!(decision.status, DecisionStatus::Expired);
    let run = &parent.facts.run;
    assert_eq!(
        (run.status, run.queue),
        (RunStatus::TimedOut, QueueStatus::Failed)
    );
    let error = run.error.as_ref().unwrap();
    assert_eq!(error.reason, ReasonKind::DecisionExpired);
    assert_eq!(error.node_id, Some(NodeId::from("gate")));
    assert_eq!(run.lease.generation, Generation(2));
    assert_eq!(run.lease.claim, None);
    assert_eq!(run.revision, agg.run.revision.next());
    assert_eq!(parent.facts.messages[0].state, MessageState::Cancelled);
    let emitted = events(&parent.outputs);
    assert!(emitted.contains(&RunEvent::DecisionExpired {
        decision_id: DecisionId::from("d-1")
    }));
    assert!(emitted.contains(&RunEvent::TimedOut));
    assert!(parent.outputs.contains(&Output::BuildTerminalMessage {
        run_id: RunId::from("run-1")
    }));
}

#[test]
fn the_deadline_is_not_due_before_it_comes_or_without_one() {
    let agg = parent();
    assert_eq!(
        expire(&agg, &pending(&agg), &request(), DEADLINE_MS - 1, TTL_MS),
        Err(DecisionRejection::NotDue {
            deadline_at_ms: Some(DEADLINE_MS)
        })
    );
    let open = parent_with(None, Some(default_answer()));
    assert_eq!(
        expire(&open, &pending(&open), &request(), 1_000_000, TTL_MS),
        Err(DecisionRejection::NotDue {
            deadline_at_ms: None
        })
    );
}

#[test]
fn the_deadline_does_nothing_to_a_settled_decision() {
    let agg = parent();
    for (status, rejection) in [
        (
            accepted_by(Provenance::Human, answer_a()),
            DecisionRejection::AlreadyDecided,
        ),
        (DecisionStatus::Cancelled, DecisionRejection::Cancelled),
        (DecisionStatus::Expired, DecisionRejection::Expired),
    ] {
        let mut decision = pending(&agg);
        decision.status = status;
        assert_eq!(
            expire(&agg, &decision, &request(), DEADLINE_MS, TTL_MS),
            Err(rejection)
        );
    }
}

#[test]
fn the_deadline_waits_while_the_run_is_paused() {
    for default in [Some(default_answer()), None] {
        let agg = parent_with(Some(DEADLINE_MS), default);
        let paused = run::pause(&agg, None, control_request(), 30, TTL_MS)
            .unwrap()
            .facts;
        assert_eq!(
            expire(&paused, &pending(&agg), &request(), DEADLINE_MS, TTL_MS),
            Err(DecisionRejection::Paused)
        );
    }
}

// ---- recover ---------------------------------------------------------------

/// The state an older writer leaves when it crashes between acceptance and
/// continuation: the decision is accepted, the parent still waits.
fn accepted_without_continuation() -> (RunAggregate, DecisionRecord) {
    let mut agg = parent();
    let mut decision = agg.decision.take().unwrap();
    decision.status = accepted_by(Provenance::Human, answer_a());
    (agg, decision)
}

#[test]
fn recovery_continues_an_accepted_decision_that_has_no_continuation() {
    let (agg, decision) = accepted_without_continuation();
    let Recovered::Prepared(continued) =
        recover(&agg, &decision, None, &request(), 200, TTL_MS).unwrap()
    else {
        panic!("no continuation yet: recovery prepares it");
    };
    assert_continued(&agg, &continued);
    assert_eq!(continued.decision.status, decision.status);
    assert!(
        !events(&continued.parent.outputs)
            .iter()
            .any(|event| matches!(event, RunEvent::DecisionAccepted { .. })),
        "the decision was accepted before; recovery does not accept it again"
    );
}

#[test]
fn recovery_adopts_a_compatible_continuation_and_refuses_another() {
    let (agg, decision) = accepted_without_continuation();
    let Recovered::Prepared(continued) =
        recover(&agg, &decision, None, &request(), 200, TTL_MS).unwrap()
    else {
        panic!("prepares first");
    };
    let settled = continued.parent.facts.reload();
    let decided = continued.decision;
    assert_eq!(
        recover(
            &settled,
            &decided,
            Some(&identity()),
            &request(),
            201,
            TTL_MS
        ),
        Ok(Recovered::Adopted {
            child_run_id: RunId::from("run-1c")
        })
    );
    let mut other = request();
    other.identity.input_digest = Digest::repeat(9);
    assert_eq!(
        recover(&settled, &decided, Some(&identity()), &other, 201, TTL_MS),
        Err(DecisionRejection::IncompatibleContinuation {
            field: IdentityField::Input
        })
    );
}

#[test]
fn recovery_needs_an_accepted_decision() {
    let agg = parent();
    assert_eq!(
        recover(&agg, &pending(&agg), None, &request(), 50, TTL_MS),
        Err(DecisionRejection::NotAccepted)
    );
    for (status, rejection) in [
        (DecisionStatus::Cancelled, DecisionRejection::Cancelled),
        (DecisionStatus::Expired, DecisionRejection::Expired),
    ] {
        let mut decision = pending(&agg);
        decision.status = status;
        assert_eq!(
            recover(&agg, &decision, None, &request(), 50, TTL_MS),
            Err(rejection)
        );
    }
}

#[test]
fn recovery_waits_while_the_run_is_paused() {
    let (agg, decision) = accepted_without_continuation();
    let paused = run::pause(&agg, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        recover(&paused, &decision, None, &request(), 50, TTL_MS),
        Err(DecisionRejection::Paused)
    );
}

// ---- prepare-or-adopt ------------------------------------------------------

fn ordinary_parent() -> RunAggregate {
    waiting_at_checkpoint(&live_run(1, "work", 10), "gate", 20)
}

#[test]
fn the_first_caller_prepares_the_continuation() {
    let agg = ordinary_parent();
    let PrepareOutcome::Prepared(reserved) =
        prepare_continuation(&agg, None, &identity(), 30).unwrap()
    else {
        panic!("the first caller prepares");
    };
    assert_eq!(
        reserved.parent.facts.run.lineage.continued_by,
        Some(RunId::from("run-1c"))
    );
    assert_eq!(reserved.child.facts.run.run_id, RunId::from("run-1c"));
    assert_eq!(
        reserved.parent.facts.run.lease, agg.run.lease,
        "an ordinary continuation takes no claim"
    );
}

#[test]
fn a_compatible_later_caller_adopts_without_changing_any_fact() {
    let agg = ordinary_parent();
    let PrepareOutcome::Prepared(reserved) =
        prepare_continuation(&agg, None, &identity(), 30).unwrap()
    else {
        panic!("the first caller prepares");
    };
    let settled = reserved.parent.facts.reload();
    let snapshot = settled.clone();
    assert_eq!(
        prepare_continuation(&settled, Some(&identity()), &identity(), 31),
        Ok(PrepareOutcome::Adopted {
            child_run_id: RunId::from("run-1c")
        })
    );
    assert_eq!(settled, snapshot);
}

#[test]
fn an_incompatible_identity_fails_with_the_first_differing_field() {
    let agg = ordinary_parent();
    let PrepareOutcome::Prepared(reserved) =
        prepare_continuation(&agg, None, &identity(), 30).unwrap()
    else {
        panic!("the first caller prepares");
    };
    let settled = reserved.parent.facts.reload();
    let variants: [(ContinuationIdentity, IdentityField); 5] = [
        (
            ContinuationIdentity {
                child_run_id: RunId::from("run-1d"),
                ..identity()
            },
            IdentityField::ChildRun,
        ),
        (
            ContinuationIdentity {
                workflow_source_digest: Digest::repeat(9),
                ..identity()
            },
            IdentityField::WorkflowSource,
        ),
        (
            ContinuationIdentity {
                definition_digest: Digest::repeat(9),
                ..identity()
            },
            IdentityField::Definition,
        ),
        (
            ContinuationIdentity {
                input_digest: Digest::repeat(9),
                ..identity()
            },
            IdentityField::Input,
        ),
        (
            ContinuationIdentity {
                launch_options_digest: Digest::repeat(9),
                ..identity()
            },
            IdentityField::LaunchOptions,
        ),
    ];
    for (wanted, field) in variants {
        assert_eq!(
            prepare_continuation(&settled, Some(&identity()), &wanted, 31),
            Err(DecisionRejection::IncompatibleContinuation { field })
        );
    }
}

#[test]
fn even_the_first_caller_must_name_the_parent_and_its_session() {
    let mut agg = ordinary_parent();
    agg.run.mode = ExecutionMode::Interactive {
        origin_session: SessionId::from("s-1"),
    };
    assert_eq!(
        prepare_continuation(&agg, None, &identity(), 30),
        Err(DecisionRejection::IncompatibleContinuation {
            field: IdentityField::OwningSession
        })
    );
    let interactive = ContinuationIdentity {
        owning_session: Some(SessionId::from("s-1")),
        ..identity()
    };
    assert!(matches!(
        prepare_continuation(&agg, None, &interactive, 30),
        Ok(PrepareOutcome::Prepared(_))
    ));
}

#[test]
fn preparation_waits_while_the_parent_is_paused_and_needs_a_checkpoint_wait() {
    let agg = ordinary_parent();
    let paused = run::pause(&agg, None, control_request(), 25, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        prepare_continuation(&paused, None, &identity(), 30),
        Err(DecisionRejection::Paused)
    );
    let running = live_run(1, "work", 10);
    assert!(matches!(
        prepare_continuation(&running, None, &identity(), 30),
        Err(DecisionRejection::Run {
            run: run::Rejection::IllegalTransition { .. }
        })
    ));
}

#[test]
#[should_panic(expected = "the loaded child must be the one the parent is continued by")]
fn a_child_the_parent_does_not_name_is_a_broken_invariant() {
    let agg = ordinary_parent();
    let _ = prepare_continuation(&agg, Some(&identity()), &identity(), 30);
}

#[test]
fn first_difference_names_the_first_differing_field_or_none() {
    assert_eq!(identity().first_difference(&identity()), None);
    let other = ContinuationIdentity {
        parent_run_id: RunId::from("run-2"),
        owning_session: Some(SessionId::from("s-1")),
        ..identity()
    };
    assert_eq!(
        identity().first_difference(&other),
        Some(IdentityField::ParentRun)
    );
}

// ---- checkpoint answers ----------------------------------------------------

#[test]
fn an_ordinary_checkpoint_answer_becomes_the_continuation_input() {
    let agg = ordinary_parent();
    let first = answer_checkpoint(&agg, None, None, &identity(), 30).unwrap();
    let PrepareOutcome::Prepared(reserved) = first else {
        panic!("the first answer prepares");
    };
    let settled = reserved.parent.facts.reload();
    assert_eq!(
        answer_checkpoint(&settled, None, Some(&identity()), &identity(), 31),
        Ok(PrepareOutcome::Adopted {
            child_run_id: RunId::from("run-1c")
        })
    );
    let other_answer = ContinuationIdentity {
        input_digest: answer_b(),
        ..identity()
    };
    assert_eq!(
        answer_checkpoint(&settled, None, Some(&identity()), &other_answer, 31),
        Err(DecisionRejection::IncompatibleContinuation {
            field: IdentityField::Input
        })
    );
}

#[test]
fn a_checkpoint_with_a_protected_decision_refuses_the_ordinary_answer() {
    let agg = parent();
    assert_eq!(
        answer_checkpoint(&agg, None, None, &identity(), 30),
        Err(DecisionRejection::ProtectedDecision {
            decision_id: DecisionId::from("d-1")
        })
    );
    let (waiting, accepted) = accepted_without_continuation();
    assert_eq!(
        answer_checkpoint(&waiting, Some(&accepted), None, &identity(), 30),
        Err(DecisionRejection::ProtectedDecision {
            decision_id: DecisionId::from("d-1")
        })
    );
}

#[test]
fn cancelling_the_waiting_run_cancels_its_pending_decision() {
    let agg = parent();
    let cancelled = run::cancel(&agg, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        cancelled.decision.as_ref().unwrap().status,
        DecisionStatus::Cancelled
    );
    let decision = cancelled.decision.clone().unwrap();
    assert_eq!(
        answer(&cancelled, &decision, answer_a(), &request(), 40, TTL_MS),
        Err(DecisionRejection::Cancelled)
    );
    assert_eq!(
        on_run_cancelled(&pending(&agg)).status,
        DecisionStatus::Cancelled
    );
    let decided = DecisionRecord {
        status: accepted_by(Provenance::Human, answer_a()),
        ..pending(&agg)
    };
    assert_eq!(
        on_run_cancelled(&decided),
        decided,
        "an accepted decision stays"
    );
}

#[test]
fn run_rejections_keep_their_reason_and_a_run_pause_is_the_decision_pause() {
    let rejection: DecisionRejection = run::Rejection::ClaimLost {
        reason: ClaimLostReason::Expired,
    }
    .into();
    assert_eq!(
        rejection,
        DecisionRejection::Run {
            run: run::Rejection::ClaimLost {
                reason: ClaimLostReason::Expired
            }
        }
    );
    assert_eq!(
        DecisionRejection::from(run::Rejection::Paused),
        DecisionRejection::Paused
    );
}

// ---- properties ------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Answer { second: bool, at_ms: u64 },
    Expire { at_ms: u64 },
    Recover { at_ms: u64 },
    AnswerCheckpoint,
    Pause,
    Resume,
}

fn around_deadline() -> impl Strategy<Value = u64> {
    (DEADLINE_MS - 3)..(DEADLINE_MS + 3)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), around_deadline()).prop_map(|(second, at_ms)| Op::Answer { second, at_ms }),
        3 => around_deadline().prop_map(|at_ms| Op::Expire { at_ms }),
        3 => around_deadline().prop_map(|at_ms| Op::Recover { at_ms }),
        1 => Just(Op::AnswerCheckpoint),
        1 => Just(Op::Pause),
        1 => Just(Op::Resume),
    ]
}

/// What one step of the race did to the facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    None,
    Continued,
    Expired,
    Lifecycle,
}

/// The durable facts a decision race touches.
#[derive(Clone, Debug, PartialEq)]
struct World {
    parent: RunAggregate,
    decision: DecisionRecord,
    child: Option<ChildIdentity>,
}

impl World {
    fn continue_with(&mut self, continued: Continued) {
        self.decision = continued.decision;
        self.parent = continued.parent.facts.reload();
        self.child = Some(identity());
    }
}

proptest! {
    /// Interleavings of human answers (a or b), deadline firings and recovery
    /// at times around the deadline, with pauses: at most one decision is
    /// accepted and it never changes, at most one continuation exists, an
    /// answer at or after the deadline never wins, adopters name the existing
    /// facts, and every acceptance is one revision and one generation.
    #[test]
    fn one_winner_and_one_continuation(
        with_default in any::<bool>(),
        crashed_after_acceptance in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..25),
    ) {
        let default = with_default.then(default_answer);
        let mut agg = parent_with(Some(DEADLINE_MS), default);
        let mut decision = pending(&agg);
        if crashed_after_acceptance {
            agg.decision = None;
            decision.status = accepted_by(Provenance::Human, answer_a());
        }
        let mut world = World { parent: agg, decision, child: None };
        let mut continuations = 0;
        let mut clock_ms = 30;
        for op in ops {
            clock_ms += 1;
            let before = world.clone();
            let change = match op {
                Op::Answer { second, at_ms } => {
                    let digest = if second { answer_b() } else { answer_a() };
                    match answer(&before.parent, &before.decision, digest, &request(), at_ms, TTL_MS) {
                        Ok(Answered::Accepted(continued)) => {
                            prop_assert!(at_ms < DEADLINE_MS, "an answer at {} won", at_ms);
                            world.continue_with(continued);
                            Change::Continued
                        }
                        Ok(Answered::Adopted(adopted)) => {
                            prop_assert_eq!(&adopted, &before.decision);
                            Change::None
                        }
                        Err(_) => Change::None,
                    }
                }
                Op::Expire { at_ms } => match expire(&before.parent, &before.decision, &request(), at_ms, TTL_MS) {
                    Ok(Expiry::Defaulted(continued)) => {
                        prop_assert!(at_ms >= DEADLINE_MS);
                        world.continue_with(continued);
                        Change::Continued
                    }
                    Ok(Expiry::Expired { decision, parent }) => {
                        prop_assert!(at_ms >= DEADLINE_MS && default.is_none());
                        world.decision = decision;
                        world.parent = parent.facts.reload();
                        Change::Expired
                    }
                    Err(_) => Change::None,
                },
                Op::Recover { at_ms } => match recover(&before.parent, &before.decision, before.child.as_ref(), &request(), at_ms, TTL_MS) {
                    Ok(Recovered::Prepared(continued)) => {
                        world.continue_with(continued);
                        Change::Continued
                    }
                    Ok(Recovered::Adopted { child_run_id }) => {
                        prop_assert_eq!(Some(child_run_id), before.parent.run.lineage.continued_by.clone());
                        Change::None
                    }
                    Err(_) => Change::None,
                },
                Op::AnswerCheckpoint => {
                    let result = answer_checkpoint(&before.parent, Some(&before.decision), before.child.as_ref(), &identity(), clock_ms);
                    let refused = matches!(result, Err(DecisionRejection::ProtectedDecision { .. }));
                    prop_assert!(refused, "an ordinary answer settled a protected checkpoint");
                    Change::None
                }
                Op::Pause => match run::pause(&before.parent, None, control_request(), clock_ms, TTL_MS) {
                    Ok(t) => {
                        world.parent = t.facts.reload();
                        Change::Lifecycle
                    }
                    Err(_) => Change::None,
                },
                Op::Resume => {
                    let ids = run::ResumeIds { resumed_message_id: MessageId::from("m-r"), message_order: 9 };
                    match run::resume(&before.parent, ids, clock_ms) {
                        Ok(t) => {
                            world.parent = t.facts.reload();
                            Change::Lifecycle
                        }
                        Err(_) => Change::None,
                    }
                }
            };
            match change {
                Change::Continued => {
                    continuations += 1;
                    prop_assert_eq!(world.parent.run.revision, before.parent.run.revision.next());
                    prop_assert_eq!(world.parent.run.lease.generation, before.parent.run.lease.generation.next());
                }
                Change::Expired => {
                    prop_assert!(world.parent.run.status == RunStatus::TimedOut);
                    prop_assert_eq!(world.parent.run.lease.generation, before.parent.run.lease.generation.next());
                }
                Change::Lifecycle => prop_assert_eq!(&world.decision, &before.decision),
                Change::None => prop_assert_eq!(&world, &before, "{:?} changed facts", op),
            }
            prop_assert!(continuations <= 1, "two continuations");
            if let DecisionStatus::Accepted { .. } = before.decision.status {
                prop_assert_eq!(&world.decision.status, &before.decision.status, "the winner changed");
            }
            if before.parent.run.lineage.continued_by.is_some() {
                prop_assert_eq!(&world.parent, &before.parent, "a continued parent changed");
            }
            if let DecisionStatus::Accepted { provenance: Provenance::Timeout, answer_digest } = world.decision.status {
                prop_assert_eq!(Some(answer_digest), default);
            }
            prop_assert_eq!(
                world.decision.continuation_run_id.is_some(),
                world.parent.run.lineage.continued_by.is_some()
            );
        }
    }

    /// Any number of racing prepare-or-adopt callers, compatible or not, with
    /// pauses: exactly the first successful caller prepares; every later
    /// compatible caller adopts the same child; incompatible callers fail;
    /// and after preparation no caller changes the parent.
    #[test]
    fn prepare_or_adopt_prepares_once(
        callers in proptest::collection::vec((0u8..4, any::<bool>()), 1..20)
    ) {
        let mut parent = ordinary_parent();
        let mut child: Option<ChildIdentity> = None;
        let mut clock_ms = 30;
        for (variant, pause_first) in callers {
            clock_ms += 1;
            if pause_first {
                let toggled = if parent.run.paused {
                    let ids = run::ResumeIds { resumed_message_id: MessageId::from("m-r"), message_order: 9 };
                    run::resume(&parent, ids, clock_ms)
                } else {
                    run::pause(&parent, None, control_request(), clock_ms, TTL_MS)
                };
                if let Ok(t) = toggled {
                    parent = t.facts.reload();
                }
            }
            let wanted = match variant {
                0 | 1 => identity(),
                2 => ContinuationIdentity { input_digest: Digest::repeat(9), ..identity() },
                _ => ContinuationIdentity { child_run_id: RunId::from("run-1x"), ..identity() },
            };
            let before = parent.clone();
            match prepare_continuation(&parent, child.as_ref(), &wanted, clock_ms) {
                Ok(PrepareOutcome::Prepared(reserved)) => {
                    prop_assert!(child.is_none(), "prepared twice");
                    prop_assert!(!before.run.paused);
                    parent = reserved.parent.facts.reload();
                    child = Some(wanted.clone());
                }
                Ok(PrepareOutcome::Adopted { child_run_id }) => {
                    let existing = child.as_ref().expect("adopts only an existing child");
                    prop_assert_eq!(&child_run_id, &existing.child_run_id);
                    prop_assert_eq!(existing, &wanted);
                }
                Err(rejection) => {
                    if let Some(existing) = &child {
                        prop_assert_ne!(existing, &wanted, "a compatible caller was refused");
                        let incompatible = matches!(rejection, DecisionRejection::IncompatibleContinuation { .. });
                        prop_assert!(incompatible, "unexpected refusal");
                    } else {
                        prop_assert_eq!(rejection, DecisionRejection::Paused);
                    }
                }
            }
            if child.is_some() && before.run.lineage.continued_by.is_some() {
                prop_assert_eq!(&parent, &before, "an adopter or a refused caller changed the parent");
            }
        }
    }
}

#[test]
fn a_continuation_identity_hashes_the_stored_source_and_definition_and_has_no_launch_options() {
    let child = RunId::from("continuation-1");
    let parent = RunId::from("run-1");
    let session = SessionId::from("s-1");
    let facts = ContinuationFacts {
        child_run_id: &child,
        parent_run_id: &parent,
        owning_session: Some(&session),
        workflow_source: "{\"kind\":\"file\"}",
        definition_digest: "sha256:00",
        input_digest: answer_a(),
    };
    let identity = ContinuationIdentity::of(facts);
    // SHA-256("{}"), the empty launch options object.
    assert_eq!(
        identity.launch_options_digest.0[..4],
        [0x44, 0x13, 0x6f, 0xa3]
    );
    assert_eq!(identity.child_run_id, child);
    assert_eq!(identity.parent_run_id, parent);
    assert_eq!(identity.owning_session, Some(session.clone()));
    assert_eq!(identity.input_digest, answer_a());
    // Each stored fact changes its own digest and only its own.
    let other_source = ContinuationIdentity::of(ContinuationFacts {
        workflow_source: "{\"kind\":\"builtin\"}",
        ..facts
    });
    assert_ne!(
        other_source.workflow_source_digest,
        identity.workflow_source_digest
    );
    assert_eq!(other_source.definition_digest, identity.definition_digest);
    let other_definition = ContinuationIdentity::of(ContinuationFacts {
        definition_digest: "sha256:01",
        ..facts
    });
    assert_ne!(
        other_definition.definition_digest,
        identity.definition_digest
    );
    assert_eq!(
        other_definition.workflow_source_digest,
        identity.workflow_source_digest
    );
}

// ---- answers against the request, deadline wakes, resume ----------------------

fn choices() -> Vec<Choice> {
    vec![
        Choice {
            id: "approve".into(),
            input: None,
        },
        Choice {
            id: "revise".into(),
            input: Some(TextInput {
                name: "feedback".into(),
                min_length: 2,
                max_length: 5,
            }),
        },
    ]
}

fn response(choice: &str, input: Option<(&str, &str)>) -> Response {
    Response {
        choice: choice.into(),
        input: input.map(|(name, text)| (name.into(), text.into())),
    }
}

#[test]
fn an_answer_counts_only_for_the_request_shown_and_its_typed_choices() {
    let decision = pending(&parent());
    let shown = decision.request_digest;
    let check =
        |seen: Digest, answer: Response| check_answer(&decision, &seen, &choices(), &answer);
    assert_eq!(check(shown, response("approve", None)), Ok(()));
    assert_eq!(
        check(shown, response("revise", Some(("feedback", "ab")))),
        Ok(())
    );
    assert_eq!(
        check(Digest::repeat(0x99), response("approve", None)),
        Err(DecisionRejection::StaleRequest)
    );
    assert_eq!(
        check(shown, response("reject", None)),
        Err(DecisionRejection::UnknownChoice)
    );
    assert_eq!(
        check(shown, response("revise", None)),
        Err(DecisionRejection::InputRequired)
    );
    assert_eq!(
        check(shown, response("approve", Some(("feedback", "ab")))),
        Err(DecisionRejection::InputNotTaken)
    );
    assert_eq!(
        check(shown, response("revise", Some(("comment", "ab")))),
        Err(DecisionRejection::InputNotTaken)
    );
    for text in ["a", "abcdef"] {
        assert_eq!(
            check(shown, response("revise", Some(("feedback", text)))),
            Err(DecisionRejection::InputLength { min: 2, max: 5 })
        );
    }
    // Lengths are UTF-16 code units, as the authoring API counts them: one
    // astral character is two.
    assert_eq!(
        check(shown, response("revise", Some(("feedback", "😀")))),
        Ok(())
    );
    assert_eq!(
        check(shown, response("revise", Some(("feedback", "😀😀😀")))),
        Err(DecisionRejection::InputLength { min: 2, max: 5 })
    );
}

#[test]
fn the_deadline_wake_defers_until_due_waits_out_a_pause_and_then_decides() {
    let parent = parent();
    let decision = pending(&parent);
    assert_eq!(
        on_deadline(&parent, &decision, &request(), DEADLINE_MS - 1, TTL_MS),
        Ok(DeadlineStep::Defer { at_ms: DEADLINE_MS })
    );
    let paused = run::pause(&parent, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts
        .reload();
    assert_eq!(
        on_deadline(&paused, &pending(&paused), &request(), DEADLINE_MS, TTL_MS),
        Ok(DeadlineStep::Nothing)
    );
    match on_deadline(&parent, &decision, &request(), DEADLINE_MS, TTL_MS) {
        Ok(DeadlineStep::Expire(Expiry::Defaulted(continued))) => {
            assert_continued(&parent, &continued);
        }
        other => panic!("the default wins at the deadline: {other:?}"),
    }
    let decided = DecisionRecord {
        status: accepted_by(Provenance::Human, answer_a()),
        ..decision
    };
    assert_eq!(
        on_deadline(&parent, &decided, &request(), DEADLINE_MS, TTL_MS),
        Err(DecisionRejection::AlreadyDecided)
    );
}

#[test]
fn resume_arms_the_deadline_again_and_keeps_the_decision_and_its_one_message() {
    let parent = parent();
    let paused = run::pause(&parent, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts
        .reload();
    assert_eq!(
        paused.messages, parent.messages,
        "pause keeps the decision message"
    );
    let ids = run::ResumeIds {
        resumed_message_id: MessageId::from("m-resumed"),
        message_order: 9,
    };
    let resumed = run::resume(&paused, ids, 40).unwrap();
    assert_eq!(
        resumed.facts.decision, parent.decision,
        "same decision, same request"
    );
    assert_eq!(
        resumed.facts.messages, parent.messages,
        "no second decision message"
    );
    assert!(resumed.outputs.iter().any(|output| matches!(
        output,
        Output::Wake {
            at_ms: DEADLINE_MS,
            reason: crate::output::WakeReason::DecisionDeadline,
            ..
        }
    )));
}
