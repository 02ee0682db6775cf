//! Kernel findings of the supervision and messages models, as
//! demonstrations: each test passes while the finding stands and asserts
//! exactly the behaviour the finding describes. `kernel/` is not changed
//! here; when the kernel is fixed, the assertions below flip and these tests
//! must be turned into regression tests of the fix.

use kernel::attempt::NodeOutcome;
use kernel::execution::{self, Actor, NodeResult};
use kernel::fixtures;
use kernel::ids::AttemptId;
use kernel::interaction::InteractionKind;
use kernel::output::{Output, StopReason};
use kernel::run::{self, ParkReason, QueueStatus, ReasonKind, RunStatus};
use kernel::topology::{NodeType, Topology};
use model::harness::Verdict;
use model::suite;
use serde_json::Value;

const TTL: u64 = fixtures::TTL_MS;

/// `run::admit` does not check that the run's previous runner epoch has
/// exited. After `execution::expire_node` stops a live runner (a
/// `$result.outcome` route continues, so the run parks `resumeReady`), the
/// run is admissible at once, and `run::admit` records a second runner epoch
/// while the first (`Ready`, never `Exited`) may still be running. This
/// breaks the `runner` module's invariant "one run has at most one runner
/// epoch that is not `Exited`" whenever a slot is free.
#[test]
fn demonstrates_kernel_bug_admit_records_a_second_live_runner_epoch() {
    let agg = fixtures::live_run(1, "work", 10);
    let attempt = AttemptId::from("a-1-work");
    let started = execution::record_node_started(
        &agg,
        &fixtures::host_authority(1),
        &fixtures::runner_epoch(1),
        &attempt,
        Some(20),
        10,
        TTL,
    )
    .expect("node.started")
    .facts;
    let topology = Topology {
        nodes: vec![
            fixtures::node("work", NodeType::Compute),
            fixtures::node("after", NodeType::Compute),
        ],
        edges: vec![fixtures::switch(
            "work",
            "$result.outcome",
            &[("timed_out", "after")],
        )],
        ..fixtures::chain(&["work"])
    };
    let record = fixtures::result_record("a-1-work", "work", NodeOutcome::TimedOut, Value::Null);
    let (expired, _) = execution::expire_node(
        &started,
        &topology,
        Some(&fixtures::host_authority(1)),
        fixtures::control_request(),
        &attempt,
        record,
        20,
        TTL,
    )
    .expect("the deadline passed");
    assert!(expired.outputs.iter().any(|o| matches!(
        o,
        Output::StopRunner {
            reason: StopReason::NodeTimedOut,
            ..
        }
    )));
    let parked = expired.facts.reload();
    assert_eq!(
        (parked.run.status, parked.run.queue, parked.run.park_reason),
        (
            RunStatus::Running,
            QueueStatus::Parked,
            Some(ParkReason::ResumeReady)
        )
    );
    let old = parked
        .run
        .runner
        .clone()
        .expect("the stopped runner's epoch");
    assert!(old.is_live(), "the stopped runner has not exited yet");

    // The finding: admission does not wait for that exit.
    let admitted = run::admit(
        &parked,
        fixtures::runner_epoch(2),
        fixtures::token(2),
        21,
        TTL,
    )
    .expect("admitted while the previous runner epoch is still live");
    let new = admitted.facts.run.runner.expect("the new runner epoch");
    assert_ne!(new.runner_epoch, old.runner_epoch);
    assert!(
        new.is_live() && old.is_live(),
        "two live runner epochs for one run"
    );
}

/// The same finding through the supervision model: with capacity 2 and the
/// kernel's own rules, the checker finds a state with two live runner
/// processes for one run.
#[test]
fn demonstrates_kernel_bug_two_live_runners_for_one_run_with_capacity_two() {
    let report = suite::supervision_capacity_two();
    print!("{report}");
    let property = report
        .properties
        .iter()
        .find(|p| p.name == suite::KERNEL_FINDING_PROPERTY)
        .expect("the property");
    assert!(
        matches!(property.verdict, Verdict::Violated(_)),
        "expected the kernel finding to reproduce, got {:?}",
        property.verdict
    );
}

/// `session::report_turn` fails the attempt after too many unproductive
/// turns with `AttemptFollowUp::Fail { reason: UnproductiveTurns }`, but
/// `execution::finish_attempt` (the only way to apply it, with
/// `Actor::Control`) takes no failure reason: the failed result routes like
/// any node failure and the run records `reason: NodeFailed`.
/// `ReasonKind::UnproductiveTurns` is never written to a run.
#[test]
fn demonstrates_kernel_gap_unproductive_turn_failure_records_node_failed() {
    let agg = fixtures::waiting_on_request(1, InteractionKind::SubmittedOutput);
    let attempt = agg.attempt.as_ref().expect("waiting").attempt_id.clone();
    let result = NodeResult {
        outcome: NodeOutcome::Failed,
        record: fixtures::result_record(attempt.as_str(), "ask", NodeOutcome::Failed, Value::Null),
    };
    let (failed, _) = execution::finish_attempt(
        &agg,
        &fixtures::chain(&["ask"]),
        Actor::Control {
            request: fixtures::control_request(),
        },
        &attempt,
        result,
        AttemptId::from("unused"),
        30,
        TTL,
    )
    .expect("the control path settles the waiting attempt");
    let error = failed.facts.run.error.expect("a failed run has an error");
    assert_eq!(failed.facts.run.status, RunStatus::Failed);
    assert_eq!(error.reason, ReasonKind::NodeFailed);
    assert_ne!(error.reason, ReasonKind::UnproductiveTurns);
}
