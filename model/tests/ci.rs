//! The CI checks: every model in its bounded configuration holds all its
//! properties with its pinned unique state count, and every planted bug is
//! caught with a counterexample. Run with `cargo test --release -p model`.

use model::harness::{Mode, Verdict};
use model::suite;
use stateright::Expectation;

fn holds_with_pinned_count(name: &str) {
    let entry = suite::model(name).expect("a registered model");
    let report = entry.run(Mode::Ci);
    print!("{report}");
    assert!(
        report.passed(),
        "{name}: properties not met: {:?}",
        report.failures()
    );
    assert_eq!(
        report.unique_states, entry.ci_unique_states,
        "{name}: the pinned unique state count changed"
    );
}

fn is_caught(name: &str) {
    let mutation = suite::mutation(name).expect("a registered mutation");
    let report = mutation.run();
    print!("{report}");
    let steps = report.counterexample(mutation.breaks);
    assert!(
        steps.is_some_and(|steps| !steps.is_empty()),
        "{name}: the checker found no counterexample to {:?}",
        mutation.breaks
    );
}

#[test]
fn claims_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("claims");
}

#[test]
fn effects_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("effects");
}

#[test]
fn commands_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("commands");
}

#[test]
fn decisions_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("decisions");
}

#[test]
fn lifecycle_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("lifecycle");
}

#[test]
fn liveness_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("liveness");
}

#[test]
fn supervision_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("supervision");
}

#[test]
fn supervision_fused_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("supervision-fused");
}

#[test]
fn supervision_liveness_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("supervision-liveness");
}

#[test]
fn messages_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("messages");
}

#[test]
fn turns_model_holds_with_its_pinned_state_count() {
    holds_with_pinned_count("turns");
}

#[test]
fn owner_only_fencing_is_caught() {
    is_caught("owner-only-fencing");
}

#[test]
fn renew_after_expiry_is_caught() {
    is_caught("renew-after-expiry");
}

#[test]
fn acquire_while_held_is_caught() {
    is_caught("acquire-while-held");
}

#[test]
fn taking_the_epoch_without_the_lock_is_caught() {
    is_caught("take-without-lock");
}

#[test]
fn runner_loss_retrying_an_applying_effect_is_caught() {
    is_caught("runner-loss-retries-applying");
}

#[test]
fn reserve_while_applying_is_caught() {
    is_caught("reserve-while-applying");
}

#[test]
fn cancel_forgetting_an_applying_effect_is_caught() {
    is_caught("cancel-forgets-applying");
}

#[test]
fn effects_admission_beside_a_live_runner_is_caught() {
    is_caught("effects-admit-beside-live-runner");
}

#[test]
fn fingerprint_including_the_request_id_is_caught() {
    is_caught("fingerprint-includes-request-id");
}

#[test]
fn payload_outside_the_fingerprint_is_caught() {
    is_caught("payload-outside-fingerprint");
}

#[test]
fn no_receipt_lookup_by_key_is_caught() {
    is_caught("no-lookup-by-key");
}

#[test]
fn storing_transient_outcomes_is_caught() {
    is_caught("store-transient");
}

#[test]
fn a_second_answer_that_also_continues_is_caught() {
    is_caught("second-answer-also-continues");
}

#[test]
fn two_continuation_winners_are_caught() {
    is_caught("two-continuation-winners");
}

#[test]
fn an_answer_after_the_deadline_winning_is_caught() {
    is_caught("answer-after-deadline-wins");
}

#[test]
fn a_deadline_ignoring_the_pause_is_caught() {
    is_caught("deadline-ignores-pause");
}

#[test]
fn a_checkpoint_answer_ignoring_the_decision_is_caught() {
    is_caught("checkpoint-answer-ignores-decision");
}

#[test]
fn cancel_ignoring_a_terminal_run_is_caught() {
    is_caught("cancel-ignores-terminal");
}

#[test]
fn park_keeping_the_attempt_is_caught() {
    is_caught("park-keeps-attempt");
}

#[test]
fn recovery_of_a_live_claim_is_caught() {
    is_caught("recover-live-claim");
}

#[test]
fn admission_beside_a_live_runner_is_caught() {
    is_caught("admit-beside-live-runner");
}

#[test]
fn admitting_only_queued_runs_is_caught_by_liveness() {
    is_caught("admit-only-queued");
}

#[test]
fn owner_only_fencing_of_runner_messages_is_caught() {
    is_caught("owner-only-runner-fencing");
}

#[test]
fn an_exit_park_that_keeps_the_attempt_is_caught() {
    is_caught("exit-park-keeps-attempt");
}

#[test]
fn routing_without_the_step_limit_is_caught() {
    is_caught("no-step-limit");
}

#[test]
fn ignoring_the_capacity_is_caught() {
    is_caught("capacity-ignored");
}

#[test]
fn supervision_admission_beside_a_live_runner_is_caught() {
    is_caught("supervision-admit-beside-live-runner");
}

#[test]
fn supervision_admission_beside_a_live_runner_is_caught_per_process() {
    is_caught("supervision-admit-beside-live-runner-process");
}

#[test]
fn an_exit_decision_without_the_crash_retry_budget_is_caught() {
    is_caught("no-crash-retry-budget");
}

#[test]
fn readmitting_a_run_without_progress_is_caught() {
    is_caught("readmit-no-progress");
}

#[test]
fn an_admission_that_reuses_the_generation_is_caught() {
    is_caught("admit-reuses-generation");
}

#[test]
fn admitting_a_terminal_run_is_caught() {
    is_caught("admit-ignores-terminal");
}

#[test]
fn an_exit_park_that_keeps_the_claim_is_caught() {
    is_caught("exit-keeps-claim");
}

#[test]
fn runner_messages_without_receipts_are_caught() {
    is_caught("no-runner-receipts");
}

#[test]
fn an_ignored_runner_message_fingerprint_is_caught() {
    is_caught("runner-fingerprint-ignored");
}

#[test]
fn admitting_only_queued_runs_is_caught_by_supervision_liveness() {
    is_caught("supervision-admit-only-queued");
}

#[test]
fn reports_without_the_coordinator_epoch_check_are_caught() {
    is_caught("no-coordinator-epoch-check");
}

#[test]
fn a_fenced_connection_retaking_the_epoch_is_caught() {
    is_caught("fenced-retakes-epoch");
}

#[test]
fn offers_to_an_old_epoch_are_caught() {
    is_caught("old-epoch-still-offered");
}

#[test]
fn a_sent_message_returning_to_pending_is_caught() {
    is_caught("sent-returns-to-pending");
}

#[test]
fn an_offer_before_the_branch_report_is_caught() {
    is_caught("send-without-branch-report");
}

#[test]
fn a_reminder_without_the_one_pending_guard_is_caught() {
    is_caught("reminder-without-guard");
}

#[test]
fn a_stale_turn_clearing_a_newer_one_is_caught() {
    is_caught("stale-turn-clears-newer");
}

#[test]
fn an_unproductive_counter_past_the_limit_is_caught() {
    is_caught("counter-past-limit");
}

#[test]
fn a_terminal_run_keeping_open_turns_is_caught() {
    is_caught("terminal-keeps-turns");
}

#[test]
fn a_turn_clock_left_running_after_a_disconnect_is_caught() {
    is_caught("disconnect-keeps-clock");
}

#[test]
fn a_terminal_message_that_is_not_keyed_by_its_run_is_caught() {
    is_caught("terminal-message-not-run-keyed");
}

#[test]
fn node_started_without_a_deadline_is_caught() {
    is_caught("started-drops-deadline");
}

#[test]
fn a_fused_commit_that_drops_the_deadline_is_caught() {
    is_caught("fused-drops-deadline");
}

/// Completeness: every registered model and every registered planted bug
/// has its own test in this file, so `cargo test --release -p model` (what
/// scripts/test-all.sh runs) checks all of them, as the `model` binary does.
#[test]
fn every_registered_model_and_planted_bug_has_a_test_here() {
    let source = include_str!("ci.rs");
    for entry in suite::models() {
        let call = format!("holds_with_pinned_count(\"{}\")", entry.name);
        assert!(
            source.contains(&call),
            "model {:?} has no test: add one calling {call}",
            entry.name
        );
    }
    for mutation in suite::mutations() {
        let call = format!("is_caught(\"{}\")", mutation.name);
        assert!(
            source.contains(&call),
            "planted bug {:?} has no test: add one calling {call}",
            mutation.name
        );
    }
}

/// Non-vacuity: each `always` and `eventually` property of every model is
/// the target of at least one planted bug, and every target names a real
/// property of its model.
#[test]
fn every_safety_and_liveness_property_has_a_planted_bug() {
    let mutations = suite::mutations();
    for entry in suite::models() {
        let properties = entry.properties();
        for (name, expectation) in &properties {
            if *expectation == Expectation::Sometimes {
                continue;
            }
            assert!(
                mutations
                    .iter()
                    .any(|m| m.model == entry.name && m.breaks == *name),
                "{}: no planted bug targets {name:?}",
                entry.name
            );
        }
        for mutation in mutations.iter().filter(|m| m.model == entry.name) {
            assert!(
                properties
                    .iter()
                    .any(|(name, e)| *name == mutation.breaks && *e != Expectation::Sometimes),
                "{}: {} targets an unknown property {:?}",
                entry.name,
                mutation.name,
                mutation.breaks
            );
        }
    }
}

/// A counterexample is printed as numbered kernel inputs and ends with a
/// summary of the violating state; safety counterexamples are the shortest.
#[test]
fn counterexamples_are_shortest_numbered_kernel_inputs() {
    let mutation = suite::mutation("cancel-forgets-applying").expect("registered");
    let report = mutation.run();
    let property = report
        .properties
        .iter()
        .find(|p| p.name == mutation.breaks)
        .expect("the target property");
    let Verdict::Violated(steps) = &property.verdict else {
        panic!("expected a counterexample, got {:?}", property.verdict);
    };
    assert_eq!(
        steps.as_slice(),
        [
            " 1. runner: effect::reserve",
            " 2. client: run::cancel",
            "    => run Cancelled/Cancelled park None; effect rows [\"Cancelled attempt 1\"]; external applications [0, 0, 0, 0]; operator retries 0",
        ]
    );
}
