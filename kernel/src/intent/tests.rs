use super::*;
use crate::fixtures::{self, host_authority};
use crate::run::{self, FailureClass, ReasonKind, RunAggregate, RunError, Terminal};

fn row(event: SourceEvent) -> (Creates, Fallback) {
    let policy = policy(event);
    (policy.creates, policy.fallback)
}

fn creates(cause: Cause, when: CreateWhen) -> Creates {
    Creates::Intent { cause, when }
}

// One test per row of the event policy table, in the table's order.

#[test]
fn row_1_a_top_level_interactive_run_that_completes_creates_one_terminal_intent_the_presentation_competes_for()
 {
    assert_eq!(
        row(SourceEvent::Completed),
        (
            creates(Cause::Terminal, CreateWhen::WithTerminalState),
            Fallback::PresentationCompetes
        )
    );
}

#[test]
fn row_2_a_failure_or_timeout_creates_or_reuses_the_abort_intent_eligible_after_the_durable_terminal_state()
 {
    assert_eq!(
        row(SourceEvent::FailedOrTimedOut { timed_out: false }),
        (
            creates(Cause::Failed, CreateWhen::BeforeTurnAbort),
            Fallback::AfterTerminalDurable
        )
    );
    assert_eq!(
        row(SourceEvent::FailedOrTimedOut { timed_out: true }),
        (
            creates(Cause::TimedOut, CreateWhen::BeforeTurnAbort),
            Fallback::AfterTerminalDurable
        )
    );
}

#[test]
fn row_3_an_agent_or_user_cancellation_creates_an_intent_eligible_after_durable_cancellation_that_stops_by_default()
 {
    assert_eq!(
        row(SourceEvent::Cancelled {
            by: Canceller::Agent
        }),
        (
            creates(Cause::AgentCancelled, CreateWhen::BeforeTurnAbort),
            Fallback::AfterDurableCancellation
        )
    );
    assert_eq!(
        row(SourceEvent::Cancelled {
            by: Canceller::User
        }),
        (
            creates(Cause::Cancelled, CreateWhen::BeforeTurnAbort),
            Fallback::AfterDurableCancellation
        )
    );
    assert!(Fallback::AfterDurableCancellation.stops_by_default());
}

#[test]
fn row_4_a_crash_before_the_first_prompt_creates_an_eligible_intent_after_the_durable_failure() {
    assert_eq!(
        row(SourceEvent::CrashedBeforeFirstPrompt),
        (
            creates(Cause::Failed, CreateWhen::AfterDurableFailure),
            Fallback::CreatedEligible
        )
    );
}

#[test]
fn row_5_a_failed_launch_activation_creates_an_eligible_intent_after_the_queue_row_failed() {
    assert_eq!(
        row(SourceEvent::LaunchActivationFailed),
        (
            creates(Cause::LaunchFailed, CreateWhen::AfterQueueFailed),
            Fallback::CreatedEligible
        )
    );
}

#[test]
fn row_6_a_controller_interrupt_creates_an_intent_whose_eligibility_the_terminal_or_handoff_state_decides()
 {
    assert_eq!(
        row(SourceEvent::ControllerInterrupted),
        (
            creates(Cause::ControllerInterrupted, CreateWhen::BeforeTurnAbort),
            Fallback::TerminalOrHandoffDecides
        )
    );
}

#[test]
fn row_7_a_lost_claim_creates_an_intent_kept_ineligible_while_a_new_owner_can_continue() {
    assert_eq!(
        row(SourceEvent::ClaimLost),
        (
            creates(Cause::ClaimLost, CreateWhen::BeforeTurnAbort),
            Fallback::IneligibleWhileNewOwnerCanContinue
        )
    );
    assert!(!Fallback::IneligibleWhileNewOwnerCanContinue.eligible(true));
}

#[test]
fn row_8_a_waiting_presentation_creates_no_terminal_intent_and_may_resolve_an_earlier_one() {
    assert_eq!(
        row(SourceEvent::WaitingPresented),
        (Creates::Nothing, Fallback::ResolvesEarlierIntent)
    );
}

#[test]
fn row_9_an_owned_run_creates_no_terminal_intent_its_owner_receives_the_result() {
    assert_eq!(
        row(SourceEvent::OwnedRunEnded),
        (Creates::Nothing, Fallback::OwnerReceivesResult)
    );
}

#[test]
fn rows_10_to_12_pause_escape_hold_and_shutdown_create_nothing_and_no_automatic_turn() {
    assert_eq!(
        row(SourceEvent::Paused),
        (Creates::Nothing, Fallback::NoAutomaticTurn)
    );
    assert_eq!(
        row(SourceEvent::EscapeOrHeld),
        (Creates::Nothing, Fallback::NoAutomaticTurn)
    );
    assert_eq!(
        row(SourceEvent::SessionShutdown),
        (Creates::Nothing, Fallback::ClosingSession)
    );
}

fn ended(agg: &RunAggregate, terminal: Terminal) -> RunRecord {
    run::finish(agg, Some(&host_authority(1)), terminal, 50)
        .expect("the live runner ends the run")
        .facts
        .run
}

fn interactive_live() -> RunAggregate {
    fixtures::interactive_running(1)
}

fn failed() -> Terminal {
    Terminal::Failed {
        error: RunError {
            class: FailureClass::NodeFailed,
            reason: ReasonKind::NodeFailed,
            node_id: None,
        },
    }
}

#[test]
fn the_terminal_event_of_each_end_is_its_policy_row() {
    let live = interactive_live();
    let completed = ended(&live, Terminal::Completed);
    assert_eq!(
        terminal_event(&completed, Canceller::User, false),
        Some(SourceEvent::Completed)
    );
    let failed_run = ended(&live, failed());
    assert_eq!(
        terminal_event(&failed_run, Canceller::User, false),
        Some(SourceEvent::FailedOrTimedOut { timed_out: false })
    );
    assert_eq!(
        terminal_event(&failed_run, Canceller::User, true),
        Some(SourceEvent::LaunchActivationFailed)
    );
    let cancelled = run::cancel(
        &live,
        Some(&host_authority(1)),
        fixtures::control_request(),
        50,
        fixtures::TTL_MS,
    )
    .expect("cancel")
    .facts
    .run;
    assert_eq!(
        terminal_event(&cancelled, Canceller::Agent, false),
        Some(SourceEvent::Cancelled {
            by: Canceller::Agent
        })
    );
    assert_eq!(
        terminal_event(&live.run, Canceller::User, false),
        None,
        "a live run has no terminal event"
    );
    let headless = fixtures::live_run(2, "build", 10);
    let headless_done = ended(&headless, Terminal::Completed);
    assert_eq!(
        terminal_event(&headless_done, Canceller::User, false),
        Some(SourceEvent::OwnedRunEnded)
    );
}

#[test]
fn a_terminal_run_gets_one_eligible_intent_with_its_cause_and_derived_ids() {
    let run = ended(&interactive_live(), failed());
    let event = SourceEvent::FailedOrTimedOut { timed_out: false };
    let intent = on_event(&run, None, event, None, 60).expect("an interactive failure owes a turn");
    assert_eq!(intent.cause, Cause::Failed);
    assert_eq!(intent.eligible_at_ms, Some(60));
    assert_eq!(intent.session_id.as_str(), "s-1");
    assert!(!intent.stops_by_default);
    assert!(intent.intent_id.as_str().starts_with("deferred-turn:"));
    assert!(intent.source_id.as_str().starts_with("turn-source:"));
    assert_eq!(intent.intent_id.as_str().len(), "deferred-turn:".len() + 64);
    let again = on_event(&run, None, event, None, 99).expect("same event");
    assert_eq!(
        (again.intent_id, again.source_id),
        (intent.intent_id, intent.source_id),
        "the same source event names the same intent"
    );
}

#[test]
fn different_events_of_a_run_name_different_intents() {
    let session = SessionId::from("s-1");
    let run_id = RunId::from("run-1");
    let failed = ids(
        &session,
        &run_id,
        SourceEvent::FailedOrTimedOut { timed_out: false },
        None,
        None,
        Cause::Failed,
    );
    let timed_out = ids(
        &session,
        &run_id,
        SourceEvent::FailedOrTimedOut { timed_out: true },
        None,
        None,
        Cause::TimedOut,
    );
    let other_session = ids(
        &SessionId::from("s-2"),
        &run_id,
        SourceEvent::FailedOrTimedOut { timed_out: false },
        None,
        None,
        Cause::Failed,
    );
    assert_ne!(failed.0, timed_out.0);
    assert_ne!(failed.1, timed_out.1);
    assert_ne!(failed.0, other_session.0);
    assert_eq!(
        failed.1, other_session.1,
        "the source event does not depend on the session"
    );
}

#[test]
fn no_intent_comes_from_pause_escape_hold_shutdown_a_waiting_result_or_a_run_without_an_origin_session()
 {
    let run = ended(&interactive_live(), Terminal::Completed);
    for event in [
        SourceEvent::Paused,
        SourceEvent::EscapeOrHeld,
        SourceEvent::SessionShutdown,
        SourceEvent::WaitingPresented,
        SourceEvent::OwnedRunEnded,
    ] {
        assert_eq!(on_event(&run, None, event, None, 60), None, "{event:?}");
    }
    let headless = ended(&fixtures::live_run(2, "build", 10), Terminal::Completed);
    assert_eq!(
        on_event(&headless, None, SourceEvent::Completed, None, 60),
        None,
        "a headless run has no session to owe a turn to"
    );
}

#[test]
fn a_cancellation_intent_stops_by_default_and_an_agent_cancel_names_its_cause() {
    let live = interactive_live();
    let cancelled = run::cancel(
        &live,
        Some(&host_authority(1)),
        fixtures::control_request(),
        50,
        fixtures::TTL_MS,
    )
    .expect("cancel")
    .facts
    .run;
    let by_agent = on_event(
        &cancelled,
        None,
        SourceEvent::Cancelled {
            by: Canceller::Agent,
        },
        None,
        60,
    )
    .expect("intent");
    assert_eq!(by_agent.cause, Cause::AgentCancelled);
    assert!(by_agent.stops_by_default);
    assert_eq!(by_agent.eligible_at_ms, Some(60));
}

#[test]
fn an_intent_before_the_terminal_state_waits_and_a_later_event_of_the_run_reuses_it() {
    let live = interactive_live();
    let attempt = AttemptId::from("a-1");
    let node = NodeId::from("ask");
    let at = EventAt {
        node_id: &node,
        attempt_id: &attempt,
    };
    let abort = on_event(&live.run, None, SourceEvent::ClaimLost, Some(at), 20)
        .expect("a lost claim under a workflow turn owes a turn");
    assert_eq!(
        abort.eligible_at_ms, None,
        "ineligible while a new owner can continue"
    );
    assert_eq!(abort.node_id.as_ref(), Some(&node));
    assert_eq!(
        claim(&abort, &MessageId::from("m-1")),
        Err(IntentRejection::NotEligible)
    );
    let failed_run = ended(&live, failed());
    let reused = on_event(
        &failed_run,
        Some(&abort),
        SourceEvent::FailedOrTimedOut { timed_out: false },
        None,
        70,
    )
    .expect("reused");
    assert_eq!(
        reused.intent_id, abort.intent_id,
        "the run keeps its one intent"
    );
    assert_eq!(reused.cause, Cause::ClaimLost);
    assert_eq!(
        reused.eligible_at_ms,
        Some(70),
        "eligible after the durable failure"
    );
    let repeated = on_event(
        &failed_run,
        Some(&reused),
        SourceEvent::FailedOrTimedOut { timed_out: false },
        None,
        90,
    )
    .expect("reused");
    assert_eq!(repeated.eligible_at_ms, Some(70), "eligibility never moves");
}

#[test]
fn one_message_claims_an_intent_and_no_other_message_can() {
    let run = ended(&interactive_live(), Terminal::Completed);
    let intent = on_event(&run, None, SourceEvent::Completed, None, 60).expect("intent");
    let first = MessageId::from("terminal:run-1");
    let claimed = claim(&intent, &first).expect("eligible and unclaimed");
    assert_eq!(claimed.message_id.as_ref(), Some(&first));
    assert_eq!(
        claim(&claimed, &first),
        Ok(claimed.clone()),
        "a repeat is the same claim"
    );
    assert_eq!(
        claim(&claimed, &MessageId::from("other")),
        Err(IntentRejection::AlreadyClaimed {
            message_id: first.clone()
        })
    );
    assert!(!is_resolved(&claimed, false), "claimed but not sent");
    assert!(is_resolved(&claimed, true));
    assert!(!is_resolved(&intent, true), "unclaimed is never resolved");
}

#[test]
fn a_terminal_message_claims_its_runs_intent_by_the_runs_end_and_a_headless_run_has_none() {
    let live = interactive_live();
    let message = MessageId::from("terminal:run-1");
    let completed = ended(&live, Terminal::Completed);
    let intent = for_terminal_message(
        &completed,
        None,
        Canceller::User,
        LaunchFacts::default(),
        &message,
        70,
    )
    .expect("eligible at once")
    .expect("an interactive end owes a turn");
    assert_eq!(intent.cause, Cause::Terminal);
    assert_eq!(intent.message_id.as_ref(), Some(&message), "claimed");
    assert_eq!(intent.eligible_at_ms, Some(70));
    assert!(!intent.stops_by_default);

    let cancelled = run::cancel(
        &live,
        Some(&host_authority(1)),
        fixtures::control_request(),
        50,
        fixtures::TTL_MS,
    )
    .expect("cancel")
    .facts
    .run;
    let intent = for_terminal_message(
        &cancelled,
        None,
        Canceller::User,
        LaunchFacts::default(),
        &message,
        70,
    )
    .expect("eligible after the durable cancellation")
    .expect("a cancellation owes a turn");
    assert_eq!(
        (intent.cause, intent.stops_by_default),
        (Cause::Cancelled, true),
        "a user cancellation: the kernel's (0.15.0) row, stopping by default"
    );

    // An unresolved intent of the run (an earlier abort intent) is reused
    // and claimed, not a second one created.
    let failed_run = ended(&live, failed());
    let earlier = on_event(
        &live.run,
        None,
        SourceEvent::FailedOrTimedOut { timed_out: false },
        None,
        40,
    )
    .expect("created before the terminal state");
    assert_eq!(earlier.eligible_at_ms, None);
    let reused = for_terminal_message(
        &failed_run,
        Some(&earlier),
        Canceller::User,
        LaunchFacts::default(),
        &message,
        80,
    )
    .expect("eligible now")
    .expect("reused");
    assert_eq!(reused.intent_id, earlier.intent_id);
    assert_eq!(reused.eligible_at_ms, Some(80));
    assert_eq!(reused.message_id.as_ref(), Some(&message));

    // Claimed by another message: refused, so no second message is built.
    let other = MessageId::from("other");
    let mut claimed = reused.clone();
    claimed.message_id = Some(other.clone());
    assert_eq!(
        for_terminal_message(
            &failed_run,
            Some(&claimed),
            Canceller::User,
            LaunchFacts::default(),
            &message,
            90
        ),
        Err(IntentRejection::AlreadyClaimed { message_id: other })
    );

    let headless = ended(&fixtures::live_run(2, "build", 10), Terminal::Completed);
    assert_eq!(
        for_terminal_message(
            &headless,
            None,
            Canceller::User,
            LaunchFacts::default(),
            &message,
            70
        ),
        Ok(None),
        "its owner receives the result"
    );
}

#[test]
fn a_cancel_creates_its_intent_in_its_own_transaction_and_the_terminal_message_keeps_the_agents_cause()
 {
    let live = interactive_live();
    let cancelled = run::cancel(
        &live,
        Some(&host_authority(1)),
        fixtures::control_request(),
        50,
        fixtures::TTL_MS,
    )
    .expect("cancel")
    .facts
    .run;
    let by_agent = on_cancel(&cancelled, None, Canceller::Agent, 55).expect("an interactive run");
    assert_eq!(
        (by_agent.cause, by_agent.stops_by_default),
        (Cause::AgentCancelled, true)
    );
    assert_eq!(
        by_agent.eligible_at_ms,
        Some(55),
        "the cancellation is durable with it"
    );
    assert_eq!(by_agent.message_id, None, "no message claimed it yet");
    // The terminal message does not know who cancelled: it reuses the
    // cancel's intent, so the agent's cause stays.
    let message = MessageId::from("terminal:run-1");
    let claimed = for_terminal_message(
        &cancelled,
        Some(&by_agent),
        Canceller::User,
        LaunchFacts::default(),
        &message,
        70,
    )
    .expect("eligible")
    .expect("an interactive end");
    assert_eq!(claimed.intent_id, by_agent.intent_id);
    assert_eq!(claimed.cause, Cause::AgentCancelled);
    assert_eq!(claimed.message_id.as_ref(), Some(&message));
    assert_eq!(claimed.eligible_at_ms, Some(55));

    let by_user = on_cancel(&cancelled, None, Canceller::User, 55).expect("an interactive run");
    assert_eq!(
        (by_user.cause, by_user.stops_by_default),
        (Cause::Cancelled, true),
        "a direct cancellation creates one too (0.15.0 row 3)"
    );
    assert_ne!(by_user.intent_id, by_agent.intent_id);
    // Before the run is terminal (a cancellation that has not ended it
    // yet): created, not eligible.
    let waiting = on_cancel(&live.run, None, Canceller::Agent, 45).expect("interactive");
    assert_eq!(waiting.eligible_at_ms, None);

    let headless = fixtures::live_run(2, "build", 10);
    let headless_cancelled = run::cancel(
        &headless,
        Some(&host_authority(1)),
        fixtures::control_request(),
        50,
        fixtures::TTL_MS,
    )
    .expect("cancel")
    .facts
    .run;
    assert_eq!(
        on_cancel(&headless_cancelled, None, Canceller::Agent, 55),
        None,
        "a run without an origin session owes no turn"
    );
}

#[test]
fn a_selected_launch_that_fails_before_any_node_ran_is_a_launch_failure_created_eligible() {
    let live = interactive_live();
    let failed_run = ended(&live, failed());
    let selected = LaunchFacts {
        selected_launch: true,
        node_started: false,
    };
    assert!(launch_failed(&failed_run, selected));
    assert!(!launch_failed(
        &failed_run,
        LaunchFacts {
            node_started: true,
            ..selected
        }
    ));
    assert!(!launch_failed(&failed_run, LaunchFacts::default()));
    let completed = ended(&live, Terminal::Completed);
    assert!(!launch_failed(&completed, selected));

    let message = MessageId::from("terminal:run-1");
    let intent = for_terminal_message(&failed_run, None, Canceller::User, selected, &message, 70)
        .expect("created eligible")
        .expect("an interactive end");
    assert_eq!(intent.cause, Cause::LaunchFailed);
    assert_eq!(intent.eligible_at_ms, Some(70));
    assert!(!intent.stops_by_default);
    assert_eq!(intent.message_id.as_ref(), Some(&message));
    let plain = for_terminal_message(
        &failed_run,
        None,
        Canceller::User,
        LaunchFacts {
            node_started: true,
            ..selected
        },
        &message,
        70,
    )
    .expect("eligible")
    .expect("an interactive end");
    assert_eq!(plain.cause, Cause::Failed, "a node ran: a plain failure");
    assert_ne!(plain.intent_id, intent.intent_id);
}

/// `agg` with an open workflow turn of its run in its origin session.
fn with_active_turn(agg: &RunAggregate) -> RunAggregate {
    let mut agg = agg.clone();
    let session_id = agg.run.mode.origin_session().expect("interactive").clone();
    agg.turns.push(crate::message::TurnRecord {
        turn_id: crate::ids::TurnId::from("turn-1"),
        message_id: MessageId::from("m-1"),
        run_id: agg.run.run_id.clone(),
        session_id,
        state: crate::message::TurnState::Open,
        started_at_ms: 8,
        ended_at_ms: None,
        response_entry_id: None,
    });
    agg
}

#[test]
fn row_7_a_claim_loss_under_an_active_turn_creates_an_ineligible_intent_its_terminal_message_reuses()
 {
    let live = with_active_turn(&interactive_live());
    // The claim expired (the runner stalled): the claim-expiry decision
    // fences it and parks the run `recovered` for a new owner.
    let expired_at = live
        .run
        .lease
        .claim
        .as_ref()
        .expect("claimed")
        .expires_at_ms
        + 1;
    let recovered = match crate::runner::on_claim_expired(
        &live,
        true,
        fixtures::control_request(),
        expired_at,
        fixtures::TTL_MS,
    )
    .expect("recovered")
    {
        crate::output::Step::Apply(transition) => transition.facts,
        other => panic!("the expired claim is recovered: {other:?}"),
    };
    assert!(loses_claim_with_active_turn(&live, &recovered));
    let lost = on_claim_lost(&live, &recovered, None, expired_at).expect("a claimLost intent");
    assert_eq!(lost.cause, Cause::ClaimLost);
    assert_eq!(
        lost.eligible_at_ms, None,
        "ineligible while a new owner can continue"
    );
    assert_eq!(
        lost.node_id,
        live.attempt.as_ref().map(|a| a.node_id.clone())
    );
    assert_eq!(
        claim(&lost, &MessageId::from("terminal:run-1")),
        Err(IntentRejection::NotEligible)
    );
    // No active turn, or a park that is not a handoff (a pause): none.
    let idle = interactive_live();
    let idle_recovered = run::recover(
        &idle,
        fixtures::control_request(),
        run::ParkReason::Recovered,
        expired_at,
        fixtures::TTL_MS,
    )
    .expect("recovered")
    .facts;
    assert_eq!(
        on_claim_lost(&idle, &idle_recovered, None, expired_at),
        None
    );
    let drained = run::recover(
        &live,
        fixtures::control_request(),
        run::ParkReason::Drained,
        expired_at,
        fixtures::TTL_MS,
    )
    .expect("drained")
    .facts;
    assert_eq!(on_claim_lost(&live, &drained, None, expired_at), None);
    // The new owner continues the run to its end: the terminal message
    // reuses the one intent with its cause, eligible only now.
    let completed = ended(&interactive_live(), Terminal::Completed);
    let message = MessageId::from("terminal:run-1");
    let claimed = for_terminal_message(
        &completed,
        Some(&lost),
        Canceller::User,
        LaunchFacts::default(),
        &message,
        900,
    )
    .expect("claimable once terminal")
    .expect("an intent");
    assert_eq!(claimed.intent_id, lost.intent_id, "one intent, one turn");
    assert_eq!(claimed.cause, Cause::ClaimLost);
    assert_eq!(claimed.eligible_at_ms, Some(900));
    assert_eq!(claimed.message_id.as_ref(), Some(&message));
}
