//! Kernel findings of the supervision and messages models. Both are fixed in
//! `kernel/`; each test here is the regression test of its fix and asserts
//! the fixed behaviour (see `model/README.md`, "Kernel findings").

use kernel::attempt::NodeOutcome;
use kernel::execution::{self, Actor, Dispatch, ExitReason, NodeResult};
use kernel::fixtures;
use kernel::ids::{AttemptId, NodeId};
use kernel::interaction::InteractionKind;
use kernel::output::{Output, StopReason};
use kernel::run::{self, FailureClass, ParkReason, QueueStatus, ReasonKind, Rejection, RunStatus};
use kernel::runner::{ExitKind, RunnerOutcome, RunnerStatus};
use kernel::topology::{NodeType, Topology};
use model::harness::Verdict;
use model::suite;
use serde_json::Value;
use stateright::Expectation;

const TTL: u64 = fixtures::TTL_MS;

/// Finding 1, fixed: `run::admit` waits until the run's previous runner epoch
/// exited. After `execution::expire_node` stops a live runner (a
/// `$result.outcome` route continues, so the run parks `resumeReady`), the
/// stopped runner's record stays `Ready` until the server reaps its process
/// and records the exit with `runner::decide_exit`. Until then the run is
/// not admissible and `run::admit` refuses with `RunnerLive`; after the exit
/// is recorded it is admitted with a new runner epoch, and the run never has
/// two runner epochs that are not `Exited`. Before the fix `run::admit`
/// recorded the second epoch at once, beside the live one.
#[test]
fn regression_admit_waits_until_the_stopped_runner_epoch_exited() {
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
    let (expired, _) = execution::expire_node(
        &started,
        &topology,
        Some(&fixtures::host_authority(1)),
        fixtures::control_request(),
        &attempt,
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

    // The fix: admission waits for that exit.
    assert!(!parked.run.is_admissible());
    assert_eq!(
        run::admit(
            &parked,
            fixtures::runner_epoch(2),
            fixtures::token(2),
            21,
            TTL,
        )
        .map(|_| ()),
        Err(Rejection::RunnerLive {
            runner_epoch: old.runner_epoch.clone()
        })
    );

    // The server reaps the stopped process and records its exit; the run
    // holds no claim, so the exit only records the outcome.
    let reaped = fixtures::runner_exited(
        &parked,
        ExitKind::Stopped {
            reason: StopReason::NodeTimedOut,
        },
        22,
    )
    .facts
    .reload();
    assert_eq!(
        reaped.run.runner.as_ref().map(|r| r.status),
        Some(RunnerStatus::Exited(RunnerOutcome::TimedOut))
    );
    assert_eq!(
        (reaped.run.status, reaped.run.queue, reaped.run.revision),
        (parked.run.status, parked.run.queue, parked.run.revision)
    );
    assert!(reaped.run.is_admissible());

    let admitted = run::admit(
        &reaped,
        fixtures::runner_epoch(2),
        fixtures::token(2),
        23,
        TTL,
    )
    .expect("admitted once the previous runner epoch exited");
    let new = admitted.facts.run.runner.expect("the new runner epoch");
    assert_ne!(new.runner_epoch, old.runner_epoch);
    assert!(new.is_live());
}

/// Finding 1 through the supervision model: with capacity 2 a slot is free
/// while a stopped runner is still running. With the kernel's own rules the
/// checker now explores the whole space (clock as the only fault) and finds
/// no state with two live runner processes or two runner epochs that are not
/// `Exited` for one run. Before the fix it found one in 7 kernel inputs
/// (admit, ready, node.started, tick, a slot freed, `expire_node`, admit);
/// the planted bug `supervision-admit-beside-live-runner` still does.
#[test]
fn regression_one_live_runner_per_run_with_capacity_two() {
    let report = suite::supervision_capacity_two();
    print!("{report}");
    for property in &report.properties {
        if property.expectation == Expectation::Always {
            assert_eq!(property.verdict, Verdict::Holds, "{}", property.name);
        }
    }
    for name in suite::KERNEL_FINDING_PROPERTIES {
        let property = report
            .properties
            .iter()
            .find(|p| p.name == name)
            .expect("the property");
        assert_eq!(property.verdict, Verdict::Holds, "{name}");
    }
}

/// Finding 2, fixed: `session::report_turn` fails the attempt after too many
/// unproductive turns with `AttemptFollowUp::Fail { reason: UnproductiveTurns }`,
/// and `execution::finish_attempt` with `Actor::Control { failure: Some(reason) }`
/// now writes that reason into the run error (the class stays `nodeFailed`).
/// Before the fix the control path took no reason and the run recorded
/// `reason: NodeFailed`. The `turns` model checks the same path: its witness
/// "the unproductive-turn limit fails the attempt and the run says why" is
/// reached only when the run error carries `UnproductiveTurns`
/// (`tests/ci.rs` requires every witness to be reached).
#[test]
fn regression_unproductive_turn_failure_records_its_reason() {
    let agg = fixtures::waiting_on_request(1, InteractionKind::SubmittedOutput);
    let attempt = agg.attempt.as_ref().expect("waiting").attempt_id.clone();
    let result = NodeResult {
        outcome: NodeOutcome::Failed,
        record: fixtures::result_record(attempt.as_str(), "ask", NodeOutcome::Failed, Value::Null),
    };
    let (failed, dispatch) = execution::finish_attempt(
        &agg,
        &fixtures::chain(&["ask"]),
        Actor::Control {
            request: fixtures::control_request(),
            failure: Some(ReasonKind::UnproductiveTurns),
        },
        &attempt,
        result,
        AttemptId::from("unused"),
        30,
        TTL,
    )
    .expect("the control path settles the waiting attempt");
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Failed
        }
    );
    let error = failed.facts.run.error.expect("a failed run has an error");
    assert_eq!(failed.facts.run.status, RunStatus::Failed);
    assert_eq!(error.class, FailureClass::NodeFailed);
    assert_eq!(error.reason, ReasonKind::UnproductiveTurns);
    assert_eq!(error.node_id, Some(NodeId::from("ask")));
}
