use super::*;
use crate::display::{self, DisplayFacts, DisplayStatus};
use crate::fixtures::{
    admitted, interactive_running, live_run, pending_decision, reserved, waiting_at_checkpoint,
    waiting_on_request,
};
use crate::ids::Digest;
use alloc::string::ToString;
use alloc::vec;
use proptest::prelude::*;

/// 2026-12-03 22:00:00 UTC.
const NOW: u64 = 1_796_335_200_000;

fn facts_of(agg: &RunAggregate) -> WhyFacts {
    WhyFacts::from_run(agg, OutsideFacts::default())
}

fn display_status(agg: &RunAggregate) -> DisplayStatus {
    display::status(&DisplayFacts::from_run(
        agg,
        display::OutsideFacts::default(),
    ))
}

fn text(why: &Why) -> String {
    why.lines.join("\n")
}

// ---- one state per kind of stuck run -----------------------------------------

#[test]
fn a_live_runner_mid_step_is_running_and_nobody_else_acts() {
    let agg = live_run(1, "work", 10);
    let facts = facts_of(&agg);
    let why = explain(&facts, 500);
    assert_eq!(
        (why.headline.state, why.headline.actor),
        (WhyState::Running, Actor::Runner)
    );
    assert!(why.headline.summary.contains("running at node `work`"));
    let (claim, live) = why.claim.expect("a claim");
    assert!(live);
    assert_eq!(claim.owner, OwnerKind::Host);
    assert!(
        text(&why).contains("claim: held by the server for its runner (generation 1), expires in")
    );
    assert_eq!(display_status(&agg), DisplayStatus::Running);
}

#[test]
fn the_claim_expiry_is_in_human_time_before_and_after_it_passes() {
    let mut facts = facts_of(&live_run(1, "work", 10));
    facts.claim = Some(ClaimFact {
        owner: OwnerKind::Host,
        generation: 3,
        expires_at_ms: NOW + 27_400,
    });
    let why = explain(&facts, NOW);
    assert!(
        text(&why).contains("expires in 27 s (at 22:00:27 UTC)"),
        "{}",
        text(&why)
    );
    let later = explain(&facts, NOW + 90_000);
    assert!(
        text(&later).contains("expired 62 s ago (at 22:00:27 UTC); the server recovers the run"),
        "{}",
        text(&later)
    );
    assert!(!later.claim.expect("claim").1);
}

#[test]
fn a_pending_decision_is_answered_by_a_person_with_the_answer_command() {
    let agg = waiting_at_checkpoint(&live_run(1, "work", 10), "approve", 20);
    let mut agg = agg;
    agg.decision = Some(pending_decision(&agg, Some(NOW + 3_600_000), None));
    let why = explain(&facts_of(&agg), NOW);
    assert_eq!(
        (why.headline.state, why.headline.actor),
        (WhyState::WaitingForAnswer, Actor::Person)
    );
    let text = text(&why);
    assert!(
        text.contains("`pi-workflows answer run-1 <choice> [text]`"),
        "{text}"
    );
    assert!(
        text.contains(
            "pending: a protected human decision at node `approve`, answered by a person"
        ),
        "{text}"
    );
    assert!(
        text.contains("expires in 60 min (at 23:00:00 UTC), then the run times out"),
        "{text}"
    );
    assert_eq!(why.pending.expect("pending").1, Actor::Person);
    assert_eq!(display_status(&agg), DisplayStatus::Waiting);
}

#[test]
fn a_waiting_checkpoint_is_answered_by_a_person_with_json() {
    let agg = waiting_at_checkpoint(&live_run(1, "work", 10), "gate", 20);
    let why = explain(&facts_of(&agg), NOW);
    assert_eq!(why.headline.state, WhyState::WaitingForAnswer);
    assert!(
        why.headline
            .summary
            .contains("`pi-workflows answer run-1 <json>`")
    );
    assert!(text(&why).contains("claim: none"));
}

#[test]
fn an_interactive_step_waits_for_the_origin_session_and_never_names_it() {
    let agg = waiting_on_request(1, crate::interaction::InteractionKind::SubmittedOutput);
    let why = explain(&facts_of(&agg), NOW);
    assert_eq!(
        (why.headline.state, why.headline.actor),
        (WhyState::WaitingForAgent, Actor::OriginSession)
    );
    // The fixture's origin session id.
    assert!(!text(&why).contains("s-1"), "{}", text(&why));
    assert!(
        why.headline
            .summary
            .contains("the Pi session that started the run")
    );
}

#[test]
fn a_headless_agent_step_waits_for_the_runner() {
    let mut facts = facts_of(&live_run(1, "ask", 10));
    facts.pending = Some(PendingFact {
        request: PendingRequest::AgentSubmit,
        node: Some(NodeId::from("ask")),
        in_origin_session: false,
        expires_at_ms: None,
        has_default: false,
    });
    assert_eq!(state(&facts), (WhyState::WaitingForAgent, Actor::Runner));
    facts.validating = true;
    assert_eq!(state(&facts), (WhyState::Validating, Actor::Server));
}

#[test]
fn an_ambiguous_effect_names_both_recovery_commands_and_wins_over_a_pending_request() {
    let agg = waiting_at_checkpoint(&live_run(1, "work", 10), "gate", 20);
    let mut facts = facts_of(&agg);
    facts.ambiguous = vec![EffectFact {
        effect_id: EffectId::from("effect-abc"),
        attempt_number: 2,
    }];
    let why = explain(&facts, NOW);
    assert_eq!(
        (why.headline.state, why.headline.actor),
        (WhyState::Ambiguous, Actor::Operator)
    );
    let text = text(&why);
    assert!(
        text.contains("`pi-workflows recover run-1 confirm --effect effect-abc`"),
        "{text}"
    );
    assert!(
        text.contains("`pi-workflows recover run-1 retry --effect effect-abc`"),
        "{text}"
    );
    assert!(text.contains("then: the run continues on its own once no effect is ambiguous"));
    assert_eq!(why.effects[0].attempt_number, 2);
}

#[test]
fn a_queued_run_shows_its_position_and_the_capacity() {
    let mut facts = facts_of(&reserved(4, 0));
    facts.queue_position = Some(QueueFact {
        position: 3,
        live_runners: 2,
        capacity: 2,
    });
    let why = explain(&facts, NOW);
    assert_eq!(
        (why.headline.state, why.headline.actor),
        (WhyState::Queued, Actor::Server)
    );
    assert!(
        text(&why).contains("queue: position 3 for admission (oldest first); runners 2 of 2 busy")
    );
    assert!(text(&why).contains("runner: none yet"));
}

#[test]
fn a_park_for_review_needs_an_operator_and_an_automatic_park_the_server() {
    let mut facts = facts_of(&live_run(1, "work", 10));
    facts.queue = QueueStatus::Parked;
    facts.claim = None;
    for (reason, expected, words) in [
        (
            ParkReason::WorkflowSourceChanged,
            (WhyState::ParkedForReview, Actor::Operator),
            "workflow source changed",
        ),
        (
            ParkReason::RunnerNoProgress,
            (WhyState::ParkedForReview, Actor::Operator),
            "without progress",
        ),
        (
            ParkReason::ProtocolRejected,
            (WhyState::ParkedForReview, Actor::Operator),
            "protocol check",
        ),
        (
            ParkReason::WorkerTimedOut,
            (WhyState::ParkedForReview, Actor::Operator),
            "handshake",
        ),
        (
            ParkReason::WorkerCrashed,
            (WhyState::Queued, Actor::Server),
            "crashed",
        ),
        (
            ParkReason::Drained,
            (WhyState::Queued, Actor::Server),
            "server stopped",
        ),
    ] {
        facts.park_reason = Some(reason);
        let why = explain(&facts, NOW);
        assert_eq!(
            (why.headline.state, why.headline.actor),
            expected,
            "{reason:?}"
        );
        assert!(text(&why).contains(words), "{reason:?}: {}", text(&why));
        assert_eq!(why.park, Some(reason));
        if expected.1 == Actor::Operator {
            assert!(why.headline.summary.contains("`pi-workflows resume run-1`"));
        }
    }
}

#[test]
fn a_pause_needs_an_operator_to_resume() {
    let mut facts = facts_of(&live_run(1, "work", 10));
    facts.paused = true;
    assert_eq!(state(&facts), (WhyState::Paused, Actor::Operator));
    assert!(
        headline(&facts)
            .summary
            .contains("`pi-workflows resume run-1`")
    );
    facts.model_turn_active = true;
    assert_eq!(
        state(&facts),
        (WhyState::WaitingForAgent, Actor::OriginSession)
    );
}

#[test]
fn a_run_whose_runner_is_gone_is_recovered_by_the_server() {
    let mut facts = facts_of(&live_run(1, "work", 10));
    facts.runner = Some(RunnerFact {
        status: RunnerStatus::Exited(RunnerOutcome::Crashed),
        since_ms: NOW - 5_000,
        last_message_at_ms: Some(NOW - 6_000),
    });
    let why = explain(&facts, NOW);
    assert_eq!(
        (why.headline.state, why.headline.actor),
        (WhyState::Recovering, Actor::Server)
    );
    assert!(
        text(&why)
            .contains("runner: crashed since 5 s ago (at 21:59:55 UTC); last message 6 s ago")
    );
}

#[test]
fn a_completed_run_is_done_and_nobody_acts() {
    let mut facts = facts_of(&live_run(1, "work", 10));
    facts.status = RunStatus::Completed;
    facts.queue = QueueStatus::Done;
    facts.claim = None;
    let why = explain(&facts, NOW);
    assert_eq!(
        (why.headline.state, why.headline.actor),
        (WhyState::Done, Actor::Nobody)
    );
    assert_eq!(
        why.headline.summary,
        "the run completed; nothing is pending"
    );
    facts.status = RunStatus::Failed;
    facts.failure = Some(FailureClass::NodeFailed);
    facts.restart_eligible = true;
    assert!(
        headline(&facts)
            .summary
            .contains("`pi-workflows restart run-1`")
    );
}

#[test]
fn the_last_commit_names_its_revision_time_and_event_kind() {
    let mut facts = facts_of(&admitted(&reserved(1, 0), 5).facts);
    facts.last_commit = CommitFact {
        revision: 7,
        at_ms: NOW - 12_000,
        event: Some("nodeFinished".to_string()),
    };
    assert!(
        text(&explain(&facts, NOW))
            .contains("last commit: revision 7 12 s ago (at 21:59:48 UTC), event nodeFinished")
    );
}

#[test]
fn human_time_spans_and_clock() {
    assert_eq!(span(850), "850 ms");
    assert_eq!(span(27_000), "27 s");
    assert_eq!(span(600_000), "10 min");
    assert_eq!(span(3 * 3_600_000), "3 h");
    assert_eq!(span(3 * 86_400_000), "3 d");
    assert_eq!(clock(NOW + 3_723_000), "23:02:03 UTC");
}

#[test]
fn the_states_agree_with_the_display_reducer_on_the_fixtures() {
    let checkpoint = waiting_at_checkpoint(&live_run(1, "work", 10), "gate", 20);
    let mut decision = checkpoint.clone();
    decision.decision = Some(pending_decision(&decision, None, Some(Digest::repeat(1))));
    for (agg, display_status_expected) in [
        (reserved(1, 0), DisplayStatus::Queued),
        (admitted(&reserved(1, 0), 5).facts, DisplayStatus::Queued),
        (live_run(1, "work", 10), DisplayStatus::Running),
        (interactive_running(1), DisplayStatus::Running),
        (checkpoint, DisplayStatus::Waiting),
        (decision, DisplayStatus::Waiting),
    ] {
        assert_eq!(display_status(&agg), display_status_expected);
        let (state, _) = state(&facts_of(&agg));
        let agrees = match display_status_expected {
            DisplayStatus::Queued => matches!(state, WhyState::Queued | WhyState::Starting),
            DisplayStatus::Running => {
                matches!(state, WhyState::Running | WhyState::WaitingForAgent)
            }
            DisplayStatus::Waiting => matches!(
                state,
                WhyState::WaitingForAnswer | WhyState::WaitingForAgent | WhyState::Validating
            ),
            _ => false,
        };
        assert!(agrees, "{display_status_expected:?} vs {state:?}");
    }
}

// ---- invariants over arbitrary facts -----------------------------------------

fn any_facts() -> impl Strategy<Value = WhyFacts> {
    let statuses = prop_oneof![
        Just((RunStatus::Queued, QueueStatus::Queued)),
        Just((RunStatus::Running, QueueStatus::Starting)),
        Just((RunStatus::Running, QueueStatus::Running)),
        Just((RunStatus::Running, QueueStatus::Parked)),
        Just((RunStatus::Waiting, QueueStatus::Parked)),
        Just((RunStatus::Completed, QueueStatus::Done)),
        Just((RunStatus::Failed, QueueStatus::Failed)),
        Just((RunStatus::TimedOut, QueueStatus::Failed)),
        Just((RunStatus::Cancelled, QueueStatus::Cancelled)),
    ];
    let parks = prop::option::of(prop_oneof![
        Just(ParkReason::Drained),
        Just(ParkReason::Recovered),
        Just(ParkReason::WorkerCrashed),
        Just(ParkReason::ResumeReady),
        Just(ParkReason::Paused),
        Just(ParkReason::RunnerNoProgress),
        Just(ParkReason::WorkflowSourceChanged),
        Just(ParkReason::EffectAmbiguous),
        Just(ParkReason::WorkerTimedOut),
        Just(ParkReason::ProtocolRejected),
        Just(ParkReason::Held),
    ]);
    let pending = prop::option::of(
        (
            0u8..4,
            any::<bool>(),
            prop::option::of(0u64..u64::from(u32::MAX)),
            any::<bool>(),
        )
            .prop_map(|(kind, origin, expires, default)| PendingFact {
                request: match kind {
                    0 => PendingRequest::AgentSubmit,
                    1 => PendingRequest::VisibleResponse,
                    2 => PendingRequest::CheckpointAnswer,
                    _ => PendingRequest::HumanDecision,
                },
                node: Some(NodeId::from("n")),
                in_origin_session: origin,
                expires_at_ms: expires,
                has_default: default,
            }),
    );
    let runner = prop::option::of(
        (
            0u8..4,
            0u64..u64::from(u32::MAX),
            prop::option::of(0u64..u64::from(u32::MAX)),
        )
            .prop_map(|(status, since_ms, last_message_at_ms)| RunnerFact {
                status: match status {
                    0 => RunnerStatus::Launching,
                    1 => RunnerStatus::Ready,
                    2 => RunnerStatus::Exited(RunnerOutcome::Crashed),
                    _ => RunnerStatus::Exited(RunnerOutcome::Orphaned),
                },
                since_ms,
                last_message_at_ms,
            }),
    );
    let claim = prop::option::of(
        (any::<bool>(), 0u64..1000, 0u64..u64::from(u32::MAX)).prop_map(
            |(host, generation, expires_at_ms)| ClaimFact {
                owner: if host {
                    OwnerKind::Host
                } else {
                    OwnerKind::Control
                },
                generation,
                expires_at_ms,
            },
        ),
    );
    (
        statuses,
        (any::<bool>(), parks, pending, any::<bool>(), any::<bool>()),
        (claim, runner, 0usize..40, any::<bool>()),
        prop::option::of((1u64..500, 0u64..64, 1u64..64)),
    )
        .prop_map(
            |(
                (status, queue),
                (paused, park_reason, pending, validating, turn),
                (claim, runner, effects, eligible),
                queue_position,
            )| WhyFacts {
                run_id: RunId::from("run-p"),
                status,
                queue,
                paused,
                park_reason,
                pending,
                validating,
                model_turn_active: turn,
                attempt_node: Some(NodeId::from("n")),
                claim,
                runner,
                ambiguous: (0..effects)
                    .map(|i| EffectFact {
                        effect_id: EffectId::new(alloc::format!("effect-{i}")),
                        attempt_number: 1,
                    })
                    .collect(),
                failure: Some(FailureClass::NodeFailed),
                restart_eligible: eligible,
                queue_position: queue_position.map(|(position, live_runners, capacity)| {
                    QueueFact {
                        position,
                        live_runners,
                        capacity,
                    }
                }),
                last_commit: CommitFact {
                    revision: 3,
                    at_ms: 0,
                    event: Some("nodeFinished".to_string()),
                },
            },
        )
}

proptest! {
    /// `explain` carries `headline` at every time, stays one screen, and the
    /// actor is the state's.
    #[test]
    fn explain_carries_the_headline_and_stays_one_screen(facts in any_facts(), now in 0u64..u64::from(u32::MAX)) {
        let why = explain(&facts, now);
        prop_assert_eq!(&why.headline, &headline(&facts));
        prop_assert!(why.lines.len() <= MAX_LINES);
        prop_assert!(why.lines.iter().all(|line| line.chars().count() <= MAX_LINE_CHARS));
        prop_assert!(why.effects.len() <= MAX_EFFECTS);
        prop_assert_eq!(why.queue.is_some(), why.headline.state == WhyState::Queued && facts.queue_position.is_some());
        prop_assert!(why.lines[1].starts_with("why: "));
        let expected_actor = match why.headline.state {
            WhyState::Done => Actor::Nobody,
            WhyState::Ambiguous | WhyState::Paused | WhyState::ParkedForReview => Actor::Operator,
            WhyState::WaitingForAnswer => Actor::Person,
            WhyState::Queued | WhyState::Recovering | WhyState::Validating => Actor::Server,
            WhyState::Running | WhyState::Starting => Actor::Runner,
            WhyState::Held => Actor::OriginSession,
            WhyState::WaitingForAgent => why.headline.actor,
        };
        prop_assert_eq!(why.headline.actor, expected_actor);
        // A terminal run is done whatever else the facts say.
        prop_assert_eq!(facts.status.is_terminal(), why.headline.state == WhyState::Done);
    }
}
