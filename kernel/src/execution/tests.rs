use super::*;
use crate::claim::ClaimLostReason;
use crate::effect::{EffectKey, EffectRecord, EffectState};
use crate::fixtures::{
    self, TTL_MS, admitted, chain, control_request, host_authority, node, plain, reserved,
    result_record, runner_epoch, switch,
};
use crate::ids::{Digest, Generation, InteractionId, MessageId, RunId, SessionId};
use crate::interaction::{InteractionKind, InteractionRecord, TurnClock};
use crate::message::{MessageRecord, StepReason};
use crate::run::{ContinuationOf, Lineage};
use crate::runner::{ExitKind, RunnerExit, RunnerStatus, decide_exit};
use crate::steps::StepSummary;
use crate::topology::{NodeTimeout, NodeType};
use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;
use serde_json::json;

fn id(text: &str) -> NodeId {
    NodeId::from(text)
}

fn attempt_id(text: &str) -> AttemptId {
    AttemptId::from(text)
}

fn pair(agg: &RunAggregate) -> (RunStatus, QueueStatus) {
    (agg.run.status, agg.run.queue)
}

fn has(outputs: &[Output], wanted: impl Fn(&Output) -> bool) -> bool {
    outputs.iter().any(wanted)
}

fn count(outputs: &[Output], wanted: impl Fn(&Output) -> bool) -> usize {
    outputs.iter().filter(|output| wanted(output)).count()
}

fn current(agg: &RunAggregate) -> &AttemptRecord {
    agg.attempt.as_ref().expect("an attempt")
}

/// The result record of the run's current attempt.
fn record(agg: &RunAggregate, outcome: NodeOutcome, output: Value) -> Value {
    let attempt = current(agg);
    result_record(
        attempt.attempt_id.as_str(),
        attempt.node_id.as_str(),
        outcome,
        output,
    )
}

fn step_record(step: &StepRecord, output: Value) -> Value {
    result_record(
        step.attempt_id.as_str(),
        step.node_id.as_str(),
        step.outcome,
        output,
    )
}

/// Admits `agg` at t=5 and starts its generation at t=10.
fn start(
    agg: &RunAggregate,
    topology: &Topology,
    route_from: Option<&Value>,
) -> (RunAggregate, Dispatch) {
    let admitted = admitted(agg, 5).facts;
    let generation = admitted.run.lease.generation.0;
    let (transition, dispatch) = start_generation(
        &admitted,
        topology,
        &host_authority(generation),
        &runner_epoch(generation),
        route_from,
        None,
        attempt_id(&alloc::format!("a-{generation}-start")),
        10,
        TTL_MS,
    )
    .unwrap();
    (transition.facts, dispatch)
}

/// The server reaps the runner of `agg` that exited as `kind` (after a stop,
/// a crash or its last reply): `runner::decide_exit` records the exit.
fn reaped(agg: &RunAggregate, kind: ExitKind, now_ms: u64) -> RunAggregate {
    fixtures::runner_exited(agg, kind, now_ms).facts.reload()
}

const fn stopped(reason: StopReason) -> ExitKind {
    ExitKind::Stopped { reason }
}

/// A fresh run of `topology` running its start node (generation 1).
fn live(topology: &Topology) -> RunAggregate {
    start(&reserved(1, 0), topology, None).0
}

/// The current runner finishes the current attempt at `now_ms`.
fn finish_as_runner(
    agg: &RunAggregate,
    topology: &Topology,
    outcome: NodeOutcome,
    output: Value,
    now_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch), Rejection> {
    let generation = agg.run.lease.generation.0;
    let authority = host_authority(generation);
    let epoch = runner_epoch(generation);
    let actor = Actor::Runner {
        authority: &authority,
        runner_epoch: &epoch,
    };
    let attempt = current(agg).attempt_id.clone();
    let result = NodeResult {
        outcome,
        record: record(agg, outcome, output),
    };
    let next = attempt_id(&alloc::format!("a-next-{now_ms}"));
    finish_attempt(agg, topology, actor, &attempt, result, next, now_ms, TTL_MS)
}

fn ok_through(agg: &RunAggregate, topology: &Topology, now_ms: u64) -> RunAggregate {
    finish_as_runner(agg, topology, NodeOutcome::Ok, json!({}), now_ms)
        .unwrap()
        .0
        .facts
        .reload()
}

fn interaction(agg: &RunAggregate) -> InteractionRecord {
    let attempt = current(agg);
    InteractionRecord {
        interaction_id: InteractionId::from("i-1"),
        run_id: agg.run.run_id.clone(),
        attempt_id: attempt.attempt_id.clone(),
        node_id: attempt.node_id.clone(),
        target_session: Some(SessionId::from("s-1")),
        kind: InteractionKind::SubmittedOutput,
        contract_hash: Digest::repeat(3),
        status: InteractionStatus::Pending,
        accepted_submission: None,
        unproductive_turn_ends: 0,
        revision: 1,
        clock: TurnClock::default(),
        created_at_ms: 20,
    }
}

fn pending_step_message(agg: &RunAggregate) -> MessageRecord {
    MessageRecord {
        message_id: MessageId::from("m-1"),
        session_id: SessionId::from("s-1"),
        run_id: agg.run.run_id.clone(),
        kind: MessageKind::Step {
            interaction_id: InteractionId::from("i-1"),
            reason: StepReason::Reminder,
        },
        order: 1,
        state: MessageState::Pending,
        entry_id: None,
        created_at_ms: 20,
    }
}

/// The start node of an interactive run waits on an interactive request in
/// its origin session (deadline t=500), as `interaction.requested` commits it.
fn waiting_interactive(topology: &Topology) -> RunAggregate {
    let agg = start(&fixtures::reserved_interactive(1, 0), topology, None).0;
    let mut tx = Tx::begin(&agg, 20);
    let attempt = tx.agg.attempt.as_mut().unwrap();
    attempt.status = AttemptStatus::Waiting;
    attempt.deadline_at_ms = Some(500);
    let node_id = attempt.node_id.clone();
    run::wait_in(&mut tx, &host_authority(1), node_id, false).unwrap();
    let mut record = interaction(&agg);
    // 480 ms of model-turn time left, in a turn running since the request.
    record.clock = TurnClock::new(Some(480)).started(20);
    tx.agg.interaction = Some(record);
    tx.agg.messages = vec![pending_step_message(&agg)];
    tx.commit().facts.reload()
}

fn settle_as_control(
    agg: &RunAggregate,
    topology: &Topology,
    outcome: NodeOutcome,
    output: Value,
    now_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch), Rejection> {
    let attempt = current(agg).attempt_id.clone();
    let result = NodeResult {
        outcome,
        record: record(agg, outcome, output),
    };
    let actor = Actor::Control {
        request: control_request(),
        failure: None,
    };
    finish_attempt(
        agg,
        topology,
        actor,
        &attempt,
        result,
        attempt_id("unused"),
        now_ms,
        TTL_MS,
    )
}

fn with_deadline(agg: &RunAggregate, deadline_at_ms: u64) -> RunAggregate {
    let generation = agg.run.lease.generation.0;
    record_node_started(
        agg,
        &host_authority(generation),
        &runner_epoch(generation),
        &current(agg).attempt_id,
        Some(deadline_at_ms),
        11,
        TTL_MS,
    )
    .unwrap()
    .facts
}

fn expire(
    agg: &RunAggregate,
    topology: &Topology,
    host: Option<&Authority>,
    now_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch), Rejection> {
    let attempt = current(agg).attempt_id.clone();
    expire_node(
        agg,
        topology,
        host,
        control_request(),
        &attempt,
        now_ms,
        TTL_MS,
    )
}

/// `work` → `next` → `done`, where `work` recovers from a timeout through a
/// `$result.outcome` switch to `recover`.
fn recovering() -> Topology {
    let mut topology = chain(&["work", "next", "recover"]);
    topology.edges = vec![switch(
        "work",
        "$result.outcome",
        &[("ok", "next"), ("timed_out", "recover")],
    )];
    topology
}

fn applying_effect() -> EffectRecord {
    EffectRecord {
        effect_id: crate::ids::EffectId::from("e-1"),
        key: EffectKey {
            run_id: RunId::from("run-1"),
            effect_type: String::from("http"),
            node_path: id("a"),
            visit: 1,
        },
        request_fingerprint: Digest::repeat(7),
        state: EffectState::Applying,
        attempt_number: 1,
        node_attempt_id: None,
        result_digest: None,
    }
}

// ---- start_generation ------------------------------------------------------

#[test]
fn a_new_run_starts_at_start_at_with_visit_one() {
    let topology = chain(&["a", "b"]);
    let admitted = admitted(&reserved(1, 0), 5).facts;
    let (transition, dispatch) = start_generation(
        &admitted,
        &topology,
        &host_authority(1),
        &runner_epoch(1),
        None,
        None,
        attempt_id("a-1"),
        10,
        TTL_MS,
    )
    .unwrap();
    assert_eq!(
        dispatch,
        Dispatch::RunNode {
            node_id: id("a"),
            attempt_id: attempt_id("a-1"),
            visit: 1
        }
    );
    let agg = &transition.facts;
    assert_eq!(pair(agg), (RunStatus::Running, QueueStatus::Running));
    let attempt = current(agg);
    assert_eq!(attempt.status, AttemptStatus::Active);
    assert_eq!(attempt.generation, Generation(1));
    let runner = agg.run.runner.as_ref().unwrap();
    assert_eq!(runner.status, RunnerStatus::Ready);
    assert_eq!(
        runner.ready_revision,
        Some(agg.run.revision),
        "ready_revision is the revision this transition commits"
    );
    assert_eq!(agg.run.revision, admitted.run.revision.next());
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::Event {
            event: RunEvent::NodeStarted { .. },
            ..
        }
    )));
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::Event {
            event: RunEvent::RunnerReady { .. },
            ..
        }
    )));
}

#[test]
fn a_restart_also_starts_at_start_at() {
    let topology = chain(&["a", "b"]);
    let mut queued = reserved(2, 0);
    queued.run.lineage.restart = Some(crate::run::RestartLineage {
        root_run_id: RunId::from("run-1"),
        parent_run_id: RunId::from("run-1"),
        number: 1,
        parent_fingerprint: Digest::repeat(1),
    });
    let (_, dispatch) = start(&queued, &topology, None);
    assert!(matches!(dispatch, Dispatch::RunNode { node_id, .. } if node_id == id("a")));
}

#[test]
fn an_abandoned_attempt_is_rerun_with_the_same_visit_and_crash_retries() {
    let topology = chain(&["a", "b"]);
    let agg = ok_through(&live(&topology), &topology, 20);
    let parked = run::park(&agg, &host_authority(1), ParkReason::WorkerCrashed, 30)
        .unwrap()
        .facts
        .reload();
    let mut parked = reaped(&parked, ExitKind::Abnormal, 31);
    parked.attempt.as_mut().unwrap().crash_retries = 2;
    let abandoned = current(&parked).clone();
    assert_eq!(abandoned.status, AttemptStatus::Abandoned);
    let (rerun, dispatch) = start(&parked, &topology, None);
    assert_eq!(
        dispatch,
        Dispatch::RunNode {
            node_id: id("b"),
            attempt_id: attempt_id("a-2-start"),
            visit: abandoned.visit
        }
    );
    let attempt = current(&rerun);
    assert_eq!(attempt.crash_retries, 2);
    assert_eq!(attempt.generation, Generation(2));
    assert_ne!(attempt.attempt_id, abandoned.attempt_id);
    assert_eq!(
        rerun.steps.count, 1,
        "the abandoned attempt never became a step"
    );
}

#[test]
fn a_resumed_run_routes_on_from_its_last_step() {
    let topology = chain(&["a", "b", "c"]);
    let agg = ok_through(&live(&topology), &topology, 20);
    // The runner finished `a`; `b` was dispatched but the run was drained
    // before `b` started and the abandoned attempt was superseded… here we
    // model a run parked right after `a` with no attempt left.
    let parked = run::park(&agg, &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts
        .reload();
    let mut parked = reaped(&parked, stopped(StopReason::Parked), 31);
    parked.attempt = None;
    let last = parked.steps.last().unwrap().clone();
    let record = step_record(&last, json!({}));
    let (resumed, dispatch) = start(&parked, &topology, Some(&record));
    assert!(
        matches!(dispatch, Dispatch::RunNode { ref node_id, visit: 1, .. } if *node_id == id("b"))
    );
    assert_eq!(current(&resumed).node_id, id("b"));
}

#[test]
fn a_resumed_run_whose_last_step_was_its_checkpoint_waits_again() {
    let mut topology = chain(&["gate", "after"]);
    topology.nodes[0] = node("gate", NodeType::Checkpoint);
    let parked = run::park(
        &live(&topology),
        &host_authority(1),
        ParkReason::Drained,
        20,
    )
    .unwrap()
    .facts
    .reload();
    let mut parked = reaped(&parked, stopped(StopReason::Parked), 21);
    parked.attempt = None;
    parked.steps = StepSummary::of(
        &topology,
        &[StepRecord {
            attempt_id: attempt_id("a-1-start"),
            node_id: id("gate"),
            outcome: NodeOutcome::Ok,
            carried: false,
        }],
    );
    let record = step_record(
        parked.steps.last().unwrap(),
        json!({"summary": "checkpoint"}),
    );
    let (waiting, dispatch) = start(&parked, &topology, Some(&record));
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Waiting
        }
    );
    assert_eq!(pair(&waiting), (RunStatus::Waiting, QueueStatus::Parked));
    assert_eq!(waiting.run.waiting_on, Some(id("gate")));
    assert_eq!(waiting.run.lease.claim, None);
}

/// A continuation child of a parent that waited on `gate`.
fn continuation(checkpoint_output: Value) -> (RunAggregate, Value) {
    let mut child = reserved(2, 0);
    child.run.lineage = Lineage {
        continuation_of: Some(ContinuationOf {
            parent_run_id: RunId::from("run-1"),
            checkpoint: id("gate"),
        }),
        ..Lineage::default()
    };
    for step in [
        StepRecord {
            attempt_id: attempt_id("p-a"),
            node_id: id("a"),
            outcome: NodeOutcome::Ok,
            carried: true,
        },
        StepRecord {
            attempt_id: attempt_id("p-gate"),
            node_id: id("gate"),
            outcome: NodeOutcome::Ok,
            carried: true,
        },
    ] {
        child.steps.record(step);
    }
    let record = step_record(child.steps.last().unwrap(), checkpoint_output);
    (child, record)
}

#[test]
fn a_continuation_routes_on_from_the_checkpoint_edge() {
    let mut topology = chain(&["a", "gate", "x", "y"]);
    topology.nodes[1] = node("gate", NodeType::Checkpoint);
    topology.edges = vec![
        plain("a", "gate"),
        switch("gate", "$.choice", &[("approve", "x"), ("reject", "y")]),
    ];
    let (child, decided) = continuation(json!({"choice": "reject"}));
    let admitted_child = admitted(&child, 5);
    assert!(has(&admitted_child.outputs, |o| matches!(
        o,
        Output::SpawnRunner {
            command: crate::output::LaunchCommand::Continue { .. },
            ..
        }
    )));
    let (running, dispatch) = start(&child, &topology, Some(&decided));
    assert!(
        matches!(dispatch, Dispatch::RunNode { ref node_id, visit: 1, .. } if *node_id == id("y"))
    );
    assert_eq!(pair(&running), (RunStatus::Running, QueueStatus::Running));
}

#[test]
fn a_continuation_of_a_terminal_checkpoint_completes_at_once() {
    let mut topology = chain(&["a", "gate"]);
    topology.nodes[1] = node("gate", NodeType::Checkpoint);
    let (child, record) = continuation(json!({}));
    let (done, dispatch) = start(&child, &topology, Some(&record));
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Completed
        }
    );
    assert_eq!(pair(&done), (RunStatus::Completed, QueueStatus::Done));
    assert_eq!(done.run.lease.claim, None);
}

#[test]
fn a_resume_point_beyond_max_steps_fails_the_run() {
    let mut topology = chain(&["a", "gate", "x"]);
    topology.nodes[1] = node("gate", NodeType::Checkpoint);
    topology.max_steps = Some(2);
    let (child, record) = continuation(json!({}));
    let (failed, dispatch) = start(&child, &topology, Some(&record));
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Failed
        }
    );
    let error = failed.run.error.unwrap();
    assert_eq!(error.reason, ReasonKind::MaxSteps);
    assert_eq!(error.class, FailureClass::NodeFailed);
    assert_eq!(error.node_id, Some(id("gate")));
}

#[test]
fn start_generation_refuses_what_runner_ready_refuses() {
    let topology = chain(&["a"]);
    let admitted = admitted(&reserved(1, 0), 5).facts;
    let ready = |authority: &Authority, epoch: &RunnerEpochId, now_ms| {
        start_generation(
            &admitted,
            &topology,
            authority,
            epoch,
            None,
            None,
            attempt_id("a"),
            now_ms,
            TTL_MS,
        )
        .map(|_| ())
    };
    assert_eq!(
        ready(&host_authority(1), &runner_epoch(9), 10),
        Err(Rejection::StaleRunner)
    );
    assert_eq!(
        ready(&host_authority(2), &runner_epoch(1), 10),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::OwnerChanged
        })
    );
    assert_eq!(
        ready(&host_authority(1), &runner_epoch(1), 5 + TTL_MS),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::Expired
        })
    );
    let running = live(&topology);
    assert!(matches!(
        start_generation(
            &running,
            &topology,
            &host_authority(1),
            &runner_epoch(1),
            None,
            None,
            attempt_id("b"),
            11,
            TTL_MS
        ),
        Err(Rejection::IllegalTransition {
            operation: Operation::Ready,
            ..
        })
    ));
}

#[test]
fn start_generation_refuses_an_unfinished_attempt() {
    let topology = chain(&["a"]);
    let mut admitted = admitted(&reserved(1, 0), 5).facts;
    admitted.attempt = Some(fixtures::active_attempt("a", "old", 0, 1));
    assert_eq!(
        start_generation(
            &admitted,
            &topology,
            &host_authority(1),
            &runner_epoch(1),
            None,
            None,
            attempt_id("a"),
            10,
            TTL_MS
        )
        .map(|_| ()),
        Err(Rejection::UnfinishedAttempt)
    );
}

#[test]
fn start_generation_needs_the_record_of_the_step_it_routes_from() {
    let topology = chain(&["a", "gate", "b"]);
    let (child, record) = continuation(json!({}));
    let admitted = admitted(&child, 5).facts;
    let begin = |route_from: Option<&Value>| {
        start_generation(
            &admitted,
            &topology,
            &host_authority(1),
            &runner_epoch(1),
            route_from,
            None,
            attempt_id("a"),
            10,
            TTL_MS,
        )
        .map(|_| ())
    };
    assert_eq!(begin(None), Err(Rejection::RouteRecordMissing));
    let mut other = record.clone();
    other["attemptId"] = json!("someone-else");
    assert_eq!(begin(Some(&other)), Err(Rejection::ResultMismatch));
}

#[test]
fn start_generation_refuses_nodes_the_topology_does_not_have() {
    let topology = chain(&["a", "b"]);
    let (child, record) = continuation(json!({}));
    let admitted = admitted(&child, 5).facts;
    assert_eq!(
        start_generation(
            &admitted,
            &topology,
            &host_authority(1),
            &runner_epoch(1),
            Some(&record),
            None,
            attempt_id("a"),
            10,
            TTL_MS
        )
        .map(|_| ()),
        Err(Rejection::UnknownNode {
            node_id: id("gate")
        })
    );
}

// ---- record_node_started ---------------------------------------------------

#[test]
fn node_started_records_the_deadline_without_advancing_the_revision() {
    let agg = live(&chain(&["a"]));
    let transition = record_node_started(
        &agg,
        &host_authority(1),
        &runner_epoch(1),
        &current(&agg).attempt_id,
        Some(900),
        11,
        TTL_MS,
    )
    .unwrap();
    let started = &transition.facts;
    assert_eq!(current(started).deadline_at_ms, Some(900));
    assert_eq!(started.run.revision, agg.run.revision, "not progress");
    assert_eq!(
        started.run.lease.claim.as_ref().unwrap().heartbeat_at_ms,
        11
    );
    assert_eq!(
        transition.outputs,
        vec![Output::Wake {
            run_id: agg.run.run_id.clone(),
            at_ms: 900,
            reason: WakeReason::NodeDeadline {
                attempt_id: current(&agg).attempt_id.clone()
            }
        }]
    );
}

#[test]
fn node_started_without_a_deadline_asks_for_no_wake() {
    let agg = live(&chain(&["a"]));
    let transition = record_node_started(
        &agg,
        &host_authority(1),
        &runner_epoch(1),
        &current(&agg).attempt_id,
        None,
        11,
        TTL_MS,
    )
    .unwrap();
    assert!(transition.outputs.is_empty());
    assert_eq!(current(&transition.facts).deadline_at_ms, None);
}

#[test]
fn node_started_cannot_move_a_recorded_deadline() {
    let agg = with_deadline(&live(&chain(&["a"])), 900);
    assert_eq!(
        record_node_started(
            &agg,
            &host_authority(1),
            &runner_epoch(1),
            &current(&agg).attempt_id,
            Some(5_000),
            12,
            TTL_MS
        ),
        Err(Rejection::DeadlineAlreadyRecorded)
    );
}

#[test]
fn node_started_for_another_attempt_or_a_stale_claim_is_refused() {
    let agg = live(&chain(&["a"]));
    assert_eq!(
        record_node_started(
            &agg,
            &host_authority(1),
            &runner_epoch(1),
            &attempt_id("other"),
            None,
            11,
            TTL_MS
        ),
        Err(Rejection::StaleAttempt)
    );
    assert_eq!(
        record_node_started(
            &agg,
            &host_authority(1),
            &runner_epoch(1),
            &current(&agg).attempt_id,
            None,
            10 + TTL_MS,
            TTL_MS
        ),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::Expired
        })
    );
}

// ---- finish_and_start: the fused commit ------------------------------------

/// The current runner finishes the current attempt `ok` at `now_ms` through
/// the fused transition.
fn fused(
    agg: &RunAggregate,
    topology: &Topology,
    now_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch, Option<StartDeadline>), Rejection> {
    let generation = agg.run.lease.generation.0;
    let result = NodeResult {
        outcome: NodeOutcome::Ok,
        record: record(agg, NodeOutcome::Ok, json!({})),
    };
    finish_and_start(
        agg,
        topology,
        &host_authority(generation),
        &runner_epoch(generation),
        &current(agg).attempt_id.clone(),
        result,
        attempt_id(&alloc::format!("a-next-{now_ms}")),
        now_ms,
        TTL_MS,
    )
}

/// `a → b` where `b` has `timeout`.
fn then_timeout(timeout: NodeTimeout) -> Topology {
    let mut topology = chain(&["a", "b"]);
    topology.nodes[1].timeout = timeout;
    topology
}

#[test]
fn a_fused_commit_records_the_result_the_next_attempt_and_its_static_deadline() {
    let topology = then_timeout(NodeTimeout::Fixed { ms: 5_000 });
    let agg = live(&topology);
    let (transition, dispatch, deadline) = fused(&agg, &topology, 20).unwrap();
    assert_eq!(
        deadline,
        Some(StartDeadline::Committed {
            deadline_at_ms: Some(5_020)
        })
    );
    let next = current(&transition.facts);
    assert_eq!(
        dispatch,
        Dispatch::RunNode {
            node_id: id("b"),
            attempt_id: next.attempt_id.clone(),
            visit: 1
        }
    );
    assert_eq!(
        (next.status, next.deadline_at_ms),
        (AttemptStatus::Active, Some(5_020))
    );
    assert_eq!(transition.facts.steps.count, 1, "the result is the step");
    assert_eq!(
        transition.facts.run.revision,
        agg.run.revision.next(),
        "one revision for the whole step"
    );
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::Wake { at_ms: 5_020, reason: WakeReason::NodeDeadline { attempt_id }, .. }
            if *attempt_id == next.attempt_id
    )));
    // `node.started` would add nothing durable: the deadline is recorded.
    assert_eq!(
        record_node_started(
            &transition.facts,
            &host_authority(1),
            &runner_epoch(1),
            &next.attempt_id,
            Some(6_000),
            21,
            TTL_MS
        ),
        Err(Rejection::DeadlineAlreadyRecorded)
    );
}

/// After a fused commit the runner sends `node.started` only to report a
/// status detail: a message without a deadline is accepted, keeps the
/// committed deadline and asks for no second wake.
#[test]
fn a_node_started_without_a_deadline_keeps_the_committed_one() {
    let topology = then_timeout(NodeTimeout::Fixed { ms: 5_000 });
    let (transition, _, _) = fused(&live(&topology), &topology, 20).unwrap();
    let next = current(&transition.facts).clone();
    let started = record_node_started(
        &transition.facts,
        &host_authority(1),
        &runner_epoch(1),
        &next.attempt_id,
        None,
        21,
        TTL_MS,
    )
    .unwrap();
    assert_eq!(current(&started.facts).deadline_at_ms, Some(5_020));
    assert_eq!(started.facts.run.revision, transition.facts.run.revision);
    assert!(!has(&started.outputs, |o| matches!(o, Output::Wake { .. })));
}

#[test]
fn a_fused_commit_gives_the_engine_default_and_no_deadline_for_an_unbounded_node() {
    let topology = then_timeout(NodeTimeout::EngineDefault);
    let (transition, _, deadline) = fused(&live(&topology), &topology, 20).unwrap();
    let at = 20 + crate::topology::DEFAULT_NODE_TIMEOUT_MS;
    assert_eq!(
        deadline,
        Some(StartDeadline::Committed {
            deadline_at_ms: Some(at)
        })
    );
    assert_eq!(current(&transition.facts).deadline_at_ms, Some(at));

    let topology = then_timeout(NodeTimeout::Unbounded);
    let (transition, _, deadline) = fused(&live(&topology), &topology, 20).unwrap();
    assert_eq!(
        deadline,
        Some(StartDeadline::Committed {
            deadline_at_ms: None
        })
    );
    assert_eq!(current(&transition.facts).deadline_at_ms, None);
    assert!(!has(&transition.outputs, |o| matches!(
        o,
        Output::Wake { .. }
    )));
}

#[test]
fn a_dynamic_timeout_is_left_to_node_started_before_anything_depends_on_it() {
    let topology = then_timeout(NodeTimeout::Dynamic);
    let (transition, _, deadline) = fused(&live(&topology), &topology, 20).unwrap();
    assert_eq!(deadline, Some(StartDeadline::RunnerResolves));
    let next = current(&transition.facts).clone();
    assert_eq!(next.deadline_at_ms, None);
    assert!(!has(&transition.outputs, |o| matches!(
        o,
        Output::Wake { .. }
    )));
    let started = record_node_started(
        &transition.facts,
        &host_authority(1),
        &runner_epoch(1),
        &next.attempt_id,
        Some(9_000),
        25,
        TTL_MS,
    )
    .unwrap();
    assert_eq!(current(&started.facts).deadline_at_ms, Some(9_000));
}

#[test]
fn a_fused_commit_that_dispatches_nothing_names_no_deadline() {
    let topology = chain(&["a"]);
    let (transition, dispatch, deadline) = fused(&live(&topology), &topology, 20).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Completed
        }
    );
    assert_eq!(deadline, None);
    assert_eq!(transition.facts.run.status, RunStatus::Completed);
}

#[test]
fn a_fused_commit_refuses_what_node_finished_refuses_and_changes_nothing() {
    let topology = then_timeout(NodeTimeout::Fixed { ms: 5_000 });
    let agg = live(&topology);
    let stale = finish_and_start(
        &agg,
        &topology,
        &host_authority(1),
        &runner_epoch(1),
        &attempt_id("other"),
        NodeResult {
            outcome: NodeOutcome::Ok,
            record: record(&agg, NodeOutcome::Ok, json!({})),
        },
        attempt_id("a-next"),
        20,
        TTL_MS,
    );
    assert_eq!(stale.err(), Some(Rejection::StaleAttempt));
    assert_eq!(
        fused(&agg, &topology, 10 + TTL_MS).err(),
        Some(Rejection::ClaimLost {
            reason: ClaimLostReason::Expired
        })
    );
}

/// The fused commit is `node.finished` then `node.started` with the static
/// deadline, in one transition: the same facts, except that the revision
/// and outputs come from one commit.
#[test]
fn a_fused_commit_equals_node_finished_then_node_started_with_the_static_deadline() {
    let topology = then_timeout(NodeTimeout::Fixed { ms: 700 });
    let agg = live(&topology);
    let (fused_transition, fused_dispatch, _) = fused(&agg, &topology, 20).unwrap();
    let (finished, dispatch) =
        finish_as_runner(&agg, &topology, NodeOutcome::Ok, json!({}), 20).unwrap();
    let started = record_node_started(
        &finished.facts,
        &host_authority(1),
        &runner_epoch(1),
        &current(&finished.facts).attempt_id.clone(),
        Some(720),
        20,
        TTL_MS,
    )
    .unwrap();
    assert_eq!(fused_dispatch, dispatch);
    assert_eq!(fused_transition.facts, started.facts);
}

// ---- finish_attempt by the runner ------------------------------------------

#[test]
fn an_ok_node_dispatches_the_next_one_in_the_same_generation() {
    let topology = chain(&["a", "b"]);
    let agg = live(&topology);
    let (transition, dispatch) =
        finish_as_runner(&agg, &topology, NodeOutcome::Ok, json!({}), 20).unwrap();
    let next = &transition.facts;
    assert_eq!(
        dispatch,
        Dispatch::RunNode {
            node_id: id("b"),
            attempt_id: attempt_id("a-next-20"),
            visit: 1
        }
    );
    assert_eq!(next.steps.count, 1);
    assert_eq!(
        next.steps.last(),
        Some(&StepRecord {
            attempt_id: attempt_id("a-1-start"),
            node_id: id("a"),
            outcome: NodeOutcome::Ok,
            carried: false
        })
    );
    assert_eq!(current(next).status, AttemptStatus::Active);
    assert_eq!(next.run.revision, agg.run.revision.next());
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::Event {
            event: RunEvent::NodeFinished { .. },
            ..
        }
    )));
}

#[test]
fn a_loop_gives_each_visit_of_a_node_the_next_visit_number() {
    let mut topology = chain(&["a", "b"]);
    topology.edges = vec![plain("a", "b"), plain("b", "a")];
    let mut agg = live(&topology);
    let mut visits = Vec::new();
    for now_ms in [20, 30, 40, 50] {
        let (transition, dispatch) =
            finish_as_runner(&agg, &topology, NodeOutcome::Ok, json!({}), now_ms).unwrap();
        if let Dispatch::RunNode { node_id, visit, .. } = dispatch {
            visits.push((node_id, visit));
        }
        agg = transition.facts.reload();
    }
    assert_eq!(
        visits,
        vec![(id("b"), 1), (id("a"), 2), (id("b"), 2), (id("a"), 3)]
    );
}

#[test]
fn the_last_node_completes_the_run_and_releases_the_claim() {
    let topology = chain(&["a"]);
    let (transition, dispatch) =
        finish_as_runner(&live(&topology), &topology, NodeOutcome::Ok, json!({}), 20).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Completed
        }
    );
    let done = &transition.facts;
    assert_eq!(pair(done), (RunStatus::Completed, QueueStatus::Done));
    assert_eq!(done.run.lease.claim, None);
    assert_eq!(
        current(done).status,
        AttemptStatus::Finished(NodeOutcome::Ok)
    );
    assert_eq!(
        done.steps.count, 1,
        "the finished attempt is one step, once"
    );
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::BuildTerminalMessage { .. }
    )));
}

#[test]
fn an_ok_checkpoint_makes_the_run_wait() {
    let mut topology = chain(&["a", "gate", "after"]);
    topology.nodes[1] = node("gate", NodeType::Checkpoint);
    let agg = ok_through(&live(&topology), &topology, 20);
    let (transition, dispatch) =
        finish_as_runner(&agg, &topology, NodeOutcome::Ok, json!({}), 30).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Waiting
        }
    );
    let waiting = &transition.facts;
    assert_eq!(pair(waiting), (RunStatus::Waiting, QueueStatus::Parked));
    assert_eq!(waiting.run.waiting_on, Some(id("gate")));
    assert_eq!(waiting.run.lease.claim, None);
}

#[test]
fn a_failed_node_fails_the_run_with_its_node() {
    let topology = chain(&["a", "b"]);
    let (transition, dispatch) = finish_as_runner(
        &live(&topology),
        &topology,
        NodeOutcome::Failed,
        Value::Null,
        20,
    )
    .unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Failed
        }
    );
    let failed = &transition.facts;
    assert_eq!(pair(failed), (RunStatus::Failed, QueueStatus::Failed));
    assert_eq!(
        failed.run.error,
        Some(RunError {
            class: FailureClass::NodeFailed,
            reason: ReasonKind::NodeFailed,
            node_id: Some(id("a"))
        })
    );
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::Event {
            event: RunEvent::NodeFailed { .. },
            ..
        }
    )));
}

#[test]
fn a_failed_node_continues_through_a_result_outcome_case() {
    let mut topology = chain(&["a", "fix"]);
    topology.edges = vec![switch("a", "$result.outcome", &[("failed", "fix")])];
    let (_, dispatch) = finish_as_runner(
        &live(&topology),
        &topology,
        NodeOutcome::Failed,
        Value::Null,
        20,
    )
    .unwrap();
    assert!(matches!(dispatch, Dispatch::RunNode { node_id, .. } if node_id == id("fix")));
}

#[test]
fn a_node_timeout_reported_by_the_runner_times_the_run_out() {
    let topology = chain(&["a", "b"]);
    let (transition, dispatch) = finish_as_runner(
        &live(&topology),
        &topology,
        NodeOutcome::TimedOut,
        Value::Null,
        20,
    )
    .unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::TimedOut
        }
    );
    let timed_out = &transition.facts;
    assert_eq!(pair(timed_out), (RunStatus::TimedOut, QueueStatus::Failed));
    assert_eq!(
        timed_out.run.error.as_ref().unwrap().class,
        FailureClass::WorkerTimedOut
    );
}

#[test]
fn a_routing_error_fails_the_run() {
    let mut topology = chain(&["a", "b"]);
    topology.edges = vec![switch("a", "$.route", &[("x", "b")])];
    let (transition, _) = finish_as_runner(
        &live(&topology),
        &topology,
        NodeOutcome::Ok,
        json!({"route": "y"}),
        20,
    )
    .unwrap();
    assert_eq!(
        transition.facts.run.error.unwrap().reason,
        ReasonKind::Routing
    );
}

#[test]
fn a_step_beyond_max_steps_fails_the_run() {
    let mut topology = chain(&["a"]);
    topology.edges = vec![plain("a", "a")];
    topology.max_steps = Some(2);
    let agg = ok_through(&live(&topology), &topology, 20);
    let (transition, dispatch) =
        finish_as_runner(&agg, &topology, NodeOutcome::Ok, json!({}), 30).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Failed
        }
    );
    let failed = transition.facts;
    assert_eq!(failed.steps.count, 2);
    assert_eq!(failed.run.error.unwrap().reason, ReasonKind::MaxSteps);
}

#[test]
fn a_cancelled_node_cancels_the_run_and_its_pending_effects() {
    let topology = chain(&["a", "b"]);
    let mut agg = live(&topology);
    let mut reserved_effect = applying_effect();
    reserved_effect.state = EffectState::Reserved;
    agg.effects = vec![reserved_effect];
    let (transition, dispatch) =
        finish_as_runner(&agg, &topology, NodeOutcome::Cancelled, Value::Null, 20).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Cancelled
        }
    );
    assert_eq!(
        pair(&transition.facts),
        (RunStatus::Cancelled, QueueStatus::Cancelled)
    );
    assert_eq!(transition.facts.effects[0].state, EffectState::Cancelled);
}

#[test]
fn stale_runner_messages_are_refused_with_the_claim_lost_reason() {
    let topology = chain(&["a", "b"]);
    let agg = live(&topology);
    let attempt = current(&agg).attempt_id.clone();
    let result = || NodeResult {
        outcome: NodeOutcome::Ok,
        record: record(&agg, NodeOutcome::Ok, json!({})),
    };
    let send = |authority: &Authority, epoch: &RunnerEpochId, now_ms| {
        let actor = Actor::Runner {
            authority,
            runner_epoch: epoch,
        };
        finish_attempt(
            &agg,
            &topology,
            actor,
            &attempt,
            result(),
            attempt_id("n"),
            now_ms,
            TTL_MS,
        )
        .map(|_| ())
    };
    let mut older = host_authority(1);
    older.generation = Generation(0);
    assert_eq!(
        send(&older, &runner_epoch(1), 20),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::GenerationChanged
        })
    );
    assert_eq!(
        send(&host_authority(2), &runner_epoch(2), 20),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::OwnerChanged
        })
    );
    assert_eq!(
        send(&host_authority(1), &runner_epoch(1), 10 + TTL_MS),
        Err(Rejection::ClaimLost {
            reason: ClaimLostReason::Expired
        })
    );
    assert_eq!(
        send(&host_authority(1), &runner_epoch(7), 20),
        Err(Rejection::StaleRunner)
    );
}

#[test]
fn a_message_for_another_or_an_already_finished_attempt_is_stale() {
    let topology = chain(&["a", "b"]);
    let agg = live(&topology);
    let authority = host_authority(1);
    let epoch = runner_epoch(1);
    let actor = || Actor::Runner {
        authority: &authority,
        runner_epoch: &epoch,
    };
    let result = NodeResult {
        outcome: NodeOutcome::Ok,
        record: result_record("ghost", "a", NodeOutcome::Ok, json!({})),
    };
    assert_eq!(
        finish_attempt(
            &agg,
            &topology,
            actor(),
            &attempt_id("ghost"),
            result,
            attempt_id("n"),
            20,
            TTL_MS
        )
        .map(|_| ()),
        Err(Rejection::StaleAttempt)
    );
    // The first attempt finished; repeating its finish is stale.
    let first = current(&agg).attempt_id.clone();
    let first_record = record(&agg, NodeOutcome::Ok, json!({}));
    let next = ok_through(&agg, &topology, 20);
    let repeat = NodeResult {
        outcome: NodeOutcome::Ok,
        record: first_record,
    };
    assert_eq!(
        finish_attempt(
            &next,
            &topology,
            actor(),
            &first,
            repeat,
            attempt_id("n2"),
            30,
            TTL_MS
        )
        .map(|_| ()),
        Err(Rejection::StaleAttempt)
    );
}

#[test]
fn a_result_record_for_something_else_is_refused() {
    let topology = chain(&["a", "b"]);
    let agg = live(&topology);
    let authority = host_authority(1);
    let epoch = runner_epoch(1);
    let attempt = current(&agg).attempt_id.clone();
    for (field, value) in [
        ("attemptId", json!("other")),
        ("nodeId", json!("b")),
        ("outcome", json!("failed")),
    ] {
        let mut wrong = record(&agg, NodeOutcome::Ok, json!({}));
        wrong[field] = value;
        let actor = Actor::Runner {
            authority: &authority,
            runner_epoch: &epoch,
        };
        let result = NodeResult {
            outcome: NodeOutcome::Ok,
            record: wrong,
        };
        assert_eq!(
            finish_attempt(
                &agg,
                &topology,
                actor,
                &attempt,
                result,
                attempt_id("n"),
                20,
                TTL_MS
            )
            .map(|_| ()),
            Err(Rejection::ResultMismatch),
            "{field}"
        );
    }
}

#[test]
fn an_attempt_of_a_node_missing_from_the_topology_is_refused() {
    let topology = chain(&["a"]);
    let agg = live(&topology);
    assert_eq!(
        finish_as_runner(&agg, &chain(&["z"]), NodeOutcome::Ok, json!({}), 20).map(|_| ()),
        Err(Rejection::UnknownNode { node_id: id("a") })
    );
}

// ---- finish_attempt by the control path ------------------------------------

#[test]
fn an_accepted_submission_parks_the_run_resume_ready_for_the_next_generation() {
    let topology = chain(&["ask", "after"]);
    let waiting = waiting_interactive(&topology);
    assert_eq!(pair(&waiting), (RunStatus::Waiting, QueueStatus::Parked));
    // The runner exited on its own after its `waiting` reply.
    let waiting = reaped(&waiting, ExitKind::Clean, 30);
    let (transition, dispatch) = settle_as_control(
        &waiting,
        &topology,
        NodeOutcome::Ok,
        json!({"answer": 1}),
        40,
    )
    .unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Parked
        }
    );
    let parked = &transition.facts;
    assert_eq!(pair(parked), (RunStatus::Running, QueueStatus::Parked));
    assert_eq!(parked.run.park_reason, Some(ParkReason::ResumeReady));
    assert_eq!(parked.run.lease.claim, None);
    assert_eq!(
        parked.run.lease.generation,
        Generation(2),
        "a control claim fenced the old generation"
    );
    assert!(parked.run.is_admissible());
    assert_eq!(
        parked.interaction.as_ref().unwrap().status,
        InteractionStatus::Accepted
    );
    assert_eq!(parked.messages[0].state, MessageState::Cancelled);
    assert_eq!(parked.steps.count, 1);
    assert!(has(&transition.outputs, |o| matches!(o, Output::Schedule)));
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::Event {
            event: RunEvent::ControlClaimed { .. },
            ..
        }
    )));
    // The next generation dispatches the next node from that step.
    let parked = parked.clone().reload();
    let last = parked.steps.last().unwrap().clone();
    let route_from = step_record(&last, json!({"answer": 1}));
    let (next, dispatch) = start(&parked, &topology, Some(&route_from));
    assert!(matches!(dispatch, Dispatch::RunNode { node_id, .. } if node_id == id("after")));
    assert_eq!(next.run.lease.generation, Generation(3));
}

#[test]
fn a_settled_waiting_attempt_on_a_terminal_node_completes_the_run() {
    let topology = chain(&["ask"]);
    let waiting = waiting_interactive(&topology);
    let (transition, dispatch) =
        settle_as_control(&waiting, &topology, NodeOutcome::Ok, json!({}), 40).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Completed
        }
    );
    assert_eq!(
        pair(&transition.facts),
        (RunStatus::Completed, QueueStatus::Done)
    );
    assert_eq!(transition.facts.run.lease.claim, None);
}

/// The control path fails the waiting attempt for `reason` (what
/// `AttemptFollowUp::Fail` names).
fn fail_as_control(
    agg: &RunAggregate,
    topology: &Topology,
    outcome: NodeOutcome,
    reason: ReasonKind,
    now_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch), Rejection> {
    let attempt = current(agg).attempt_id.clone();
    let result = NodeResult {
        outcome,
        record: record(agg, outcome, Value::Null),
    };
    let actor = Actor::Control {
        request: control_request(),
        failure: Some(reason),
    };
    finish_attempt(
        agg,
        topology,
        actor,
        &attempt,
        result,
        attempt_id("unused"),
        now_ms,
        TTL_MS,
    )
}

#[test]
fn too_many_unproductive_turns_fail_the_waiting_attempt_and_the_run_says_why() {
    let topology = chain(&["ask", "after"]);
    let waiting = waiting_interactive(&topology);
    let (transition, dispatch) = fail_as_control(
        &waiting,
        &topology,
        NodeOutcome::Failed,
        ReasonKind::UnproductiveTurns,
        40,
    )
    .unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Failed
        }
    );
    let failed = &transition.facts;
    assert_eq!(pair(failed), (RunStatus::Failed, QueueStatus::Failed));
    assert_eq!(
        failed.run.error,
        Some(RunError {
            class: FailureClass::NodeFailed,
            reason: ReasonKind::UnproductiveTurns,
            node_id: Some(id("ask")),
        })
    );
    assert_eq!(
        failed.interaction.as_ref().unwrap().status,
        InteractionStatus::Failed
    );
}

#[test]
fn a_control_failure_without_a_reason_records_node_failed() {
    let topology = chain(&["ask", "after"]);
    let waiting = waiting_interactive(&topology);
    let (transition, _) =
        settle_as_control(&waiting, &topology, NodeOutcome::Failed, Value::Null, 40).unwrap();
    let error = transition.facts.run.error.unwrap();
    assert_eq!(
        (error.class, error.reason),
        (FailureClass::NodeFailed, ReasonKind::NodeFailed)
    );
}

#[test]
fn a_control_failure_reason_does_not_stop_a_route_that_continues() {
    let topology = Topology {
        nodes: vec![
            node("ask", NodeType::Compute),
            node("after", NodeType::Compute),
        ],
        edges: vec![switch("ask", "$result.outcome", &[("failed", "after")])],
        ..chain(&["ask"])
    };
    let waiting = waiting_interactive(&topology);
    let (transition, dispatch) = fail_as_control(
        &waiting,
        &topology,
        NodeOutcome::Failed,
        ReasonKind::UnproductiveTurns,
        40,
    )
    .unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Parked
        }
    );
    let parked = &transition.facts;
    assert_eq!(pair(parked), (RunStatus::Running, QueueStatus::Parked));
    assert_eq!(parked.run.park_reason, Some(ParkReason::ResumeReady));
    assert_eq!(parked.run.error, None);
}

#[test]
fn a_control_failure_reason_needs_a_failed_result() {
    let topology = chain(&["ask", "after"]);
    let waiting = waiting_interactive(&topology);
    for outcome in [
        NodeOutcome::Ok,
        NodeOutcome::TimedOut,
        NodeOutcome::Cancelled,
    ] {
        assert_eq!(
            fail_as_control(
                &waiting,
                &topology,
                outcome,
                ReasonKind::UnproductiveTurns,
                40
            )
            .map(|_| ()),
            Err(Rejection::ResultMismatch),
            "{outcome:?}"
        );
    }
}

#[test]
fn a_waiting_checkpoint_attempt_settled_ok_waits_on_the_checkpoint() {
    let mut topology = chain(&["gate"]);
    topology.nodes[0] = node("gate", NodeType::Checkpoint);
    let waiting = waiting_interactive(&topology);
    let (transition, dispatch) =
        settle_as_control(&waiting, &topology, NodeOutcome::Ok, json!({}), 40).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Waiting
        }
    );
    let settled = &transition.facts;
    assert_eq!(pair(settled), (RunStatus::Waiting, QueueStatus::Parked));
    assert_eq!(settled.run.waiting_on, Some(id("gate")));
    assert_eq!(settled.run.lease.claim, None);
}

#[test]
fn the_control_path_acts_only_on_the_waiting_attempt_of_an_unpaused_waiting_run() {
    let topology = chain(&["ask", "after"]);
    let running = live(&topology);
    assert!(matches!(
        settle_as_control(&running, &topology, NodeOutcome::Ok, json!({}), 40),
        Err(Rejection::IllegalTransition {
            operation: Operation::FinishAttempt,
            ..
        })
    ));
    let waiting = waiting_interactive(&topology);
    let paused = run::pause(&waiting, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts
        .reload();
    assert_eq!(
        settle_as_control(&paused, &topology, NodeOutcome::Ok, json!({}), 40).map(|_| ()),
        Err(Rejection::Paused)
    );
    let mut other = waiting.clone();
    other.attempt.as_mut().unwrap().status = AttemptStatus::Active;
    assert_eq!(
        settle_as_control(&other, &topology, NodeOutcome::Ok, json!({}), 40).map(|_| ()),
        Err(Rejection::StaleAttempt)
    );
    let cancelled = run::cancel(&waiting, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        settle_as_control(&cancelled, &topology, NodeOutcome::Ok, json!({}), 40).map(|_| ()),
        Err(Rejection::Terminal {
            status: RunStatus::Cancelled
        })
    );
}

// ---- expire_node -----------------------------------------------------------

#[test]
fn an_expired_active_node_times_the_run_out_and_stops_its_runner_once() {
    let topology = chain(&["work", "next"]);
    let agg = with_deadline(&live(&topology), 300);
    let (transition, dispatch) = expire(&agg, &topology, Some(&host_authority(1)), 300).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::TimedOut
        }
    );
    let timed_out = &transition.facts;
    assert_eq!(pair(timed_out), (RunStatus::TimedOut, QueueStatus::Failed));
    assert_eq!(
        timed_out.run.error,
        Some(RunError {
            class: FailureClass::WorkerTimedOut,
            reason: ReasonKind::NodeTimedOut,
            node_id: Some(id("work"))
        })
    );
    assert_eq!(
        current(timed_out).status,
        AttemptStatus::Finished(NodeOutcome::TimedOut)
    );
    assert_eq!(
        count(&transition.outputs, |o| matches!(
            o,
            Output::StopRunner { .. }
        )),
        1
    );
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::StopRunner {
            reason: StopReason::NodeTimedOut,
            ..
        }
    )));
}

#[test]
fn an_expired_node_with_a_timeout_edge_parks_for_the_recovery_node() {
    let topology = recovering();
    let agg = with_deadline(&live(&topology), 300);
    let (transition, dispatch) = expire(&agg, &topology, Some(&host_authority(1)), 301).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Parked
        }
    );
    let parked = transition.facts.clone().reload();
    assert_eq!(pair(&parked), (RunStatus::Running, QueueStatus::Parked));
    assert_eq!(parked.run.park_reason, Some(ParkReason::ResumeReady));
    assert_eq!(parked.steps.count, 1);
    assert_eq!(parked.steps.last().unwrap().outcome, NodeOutcome::TimedOut);
    assert_eq!(
        count(&transition.outputs, |o| matches!(
            o,
            Output::StopRunner {
                reason: StopReason::NodeTimedOut,
                ..
            }
        )),
        1
    );
    assert!(
        !parked.run.is_admissible(),
        "the stopped runner has not exited yet"
    );
    let parked = reaped(&parked, stopped(StopReason::NodeTimedOut), 302);
    let last = parked.steps.last().unwrap().clone();
    let route_from = step_record(&last, Value::Null);
    let (_, dispatch) = start(&parked, &topology, Some(&route_from));
    assert!(matches!(dispatch, Dispatch::RunNode { node_id, .. } if node_id == id("recover")));
}

#[test]
fn an_expired_node_whose_claim_expired_is_settled_under_a_control_claim() {
    let topology = chain(&["work"]);
    let agg = with_deadline(&live(&topology), 300);
    let later = 11 + TTL_MS;
    let (transition, _) = expire(&agg, &topology, None, later).unwrap();
    assert_eq!(transition.facts.run.status, RunStatus::TimedOut);
    assert_eq!(transition.facts.run.lease.generation, Generation(2));
    assert_eq!(transition.facts.run.lease.claim, None);
}

#[test]
fn an_expired_waiting_attempt_times_out_through_the_control_path() {
    let topology = chain(&["ask", "after"]);
    let waiting = waiting_interactive(&topology);
    let (transition, dispatch) = expire(&waiting, &topology, None, 500).unwrap();
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::TimedOut
        }
    );
    let timed_out = &transition.facts;
    assert_eq!(pair(timed_out), (RunStatus::TimedOut, QueueStatus::Failed));
    assert_eq!(
        timed_out.interaction.as_ref().unwrap().status,
        InteractionStatus::TimedOut
    );
    assert_eq!(timed_out.messages[0].state, MessageState::Cancelled);
}

#[test]
fn a_deadline_that_is_absent_or_ahead_is_not_reached() {
    let topology = chain(&["work"]);
    let agg = live(&topology);
    assert_eq!(
        expire(&agg, &topology, Some(&host_authority(1)), 900).map(|_| ()),
        Err(Rejection::DeadlineNotReached {
            deadline_at_ms: None
        })
    );
    let agg = with_deadline(&agg, 300);
    assert_eq!(
        expire(&agg, &topology, Some(&host_authority(1)), 299).map(|_| ()),
        Err(Rejection::DeadlineNotReached {
            deadline_at_ms: Some(300)
        })
    );
}

#[test]
fn expiry_of_a_finished_attempt_or_a_terminal_run_is_refused() {
    let topology = chain(&["work", "next"]);
    let agg = with_deadline(&live(&topology), 300);
    let finished = ok_through(&agg, &topology, 20);
    let old = current(&agg).attempt_id.clone();
    assert_eq!(
        expire_node(
            &finished,
            &topology,
            Some(&host_authority(1)),
            control_request(),
            &old,
            400,
            TTL_MS
        )
        .map(|_| ()),
        Err(Rejection::StaleAttempt)
    );
    let done = run::cancel(
        &agg,
        Some(&host_authority(1)),
        control_request(),
        30,
        TTL_MS,
    )
    .unwrap()
    .facts;
    assert_eq!(
        expire(&done, &topology, None, 400).map(|_| ()),
        Err(Rejection::Terminal {
            status: RunStatus::Cancelled
        })
    );
}

#[test]
fn expiry_against_a_live_claim_needs_the_host_authority() {
    let topology = chain(&["work"]);
    let agg = with_deadline(&live(&topology), 300);
    assert_eq!(
        expire(&agg, &topology, None, 300).map(|_| ()),
        Err(Rejection::ClaimHeld {
            expires_at_ms: 11 + TTL_MS
        })
    );
}

#[test]
fn expiry_of_a_paused_waiting_attempt_is_refused() {
    let topology = chain(&["ask"]);
    let waiting = waiting_interactive(&topology);
    // Paused after the budget ran out, before the wake: the timeout waits
    // for resume.
    let paused = run::pause(&waiting, None, control_request(), 510, TTL_MS)
        .unwrap()
        .facts
        .reload();
    assert_eq!(
        expire(&paused, &topology, None, 600).map(|_| ()),
        Err(Rejection::Paused)
    );
}

#[test]
fn a_waiting_attempts_deadline_is_model_turn_time() {
    let topology = chain(&["ask"]);
    let waiting = waiting_interactive(&topology);
    assert_eq!(
        expire(&waiting, &topology, None, 499).map(|_| ()),
        Err(Rejection::DeadlineNotReached {
            deadline_at_ms: Some(500)
        }),
        "a running clock defers to the end of its budget"
    );
    // Paused at 30: 10 ms consumed, the clock stopped. Wall-clock time
    // passes without consuming it, and its wake finds nothing to defer to.
    let paused = run::pause(&waiting, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts
        .reload();
    let clock = paused.interaction.as_ref().unwrap().clock;
    assert_eq!(
        clock,
        TurnClock {
            budget_ms: Some(480),
            consumed_ms: 10,
            running_since_ms: None
        }
    );
    assert_eq!(
        expire(&paused, &topology, None, 10_000).map(|_| ()),
        Err(Rejection::DeadlineNotReached {
            deadline_at_ms: None
        })
    );
    // Running again from 1000, the budget ends 470 ms later.
    let mut resumed = paused.clone();
    resumed.run.paused = false;
    resumed.interaction.as_mut().unwrap().clock = clock.started(1_000);
    assert_eq!(
        expire(&resumed, &topology, None, 1_469).map(|_| ()),
        Err(Rejection::DeadlineNotReached {
            deadline_at_ms: Some(1_470)
        })
    );
    let (timed_out, _) = expire(&resumed, &topology, None, 1_470).unwrap();
    assert_eq!(timed_out.facts.run.status, RunStatus::TimedOut);
}

// ---- property: random runner messages over random graphs -------------------

/// A random small graph over `n0..n4`: node types and edges (none, plain,
/// output switch, `$result.outcome` switch) are random; nodes unreachable
/// from `n0` are dropped.
fn graph() -> impl Strategy<Value = Topology> {
    let edge = prop_oneof![
        Just(None),
        (0usize..5).prop_map(|to| Some((0u8, vec![to]))),
        proptest::collection::vec(0usize..5, 1..3).prop_map(|to| Some((1u8, to))),
        proptest::collection::vec(0usize..5, 3).prop_map(|to| Some((2u8, to))),
    ];
    (
        proptest::collection::vec((edge, 0u8..6), 5),
        proptest::option::of(1u32..9),
    )
        .prop_map(|(specs, max_steps)| {
            let name = |i: usize| alloc::format!("n{i}");
            let mut topology = Topology {
                start_at: id("n0"),
                max_steps,
                nodes: Vec::new(),
                edges: Vec::new(),
                mounts: Vec::new(),
            };
            for (index, (edge, kind)) in specs.iter().enumerate() {
                let node_type = if *kind == 0 {
                    NodeType::Checkpoint
                } else {
                    NodeType::Compute
                };
                topology.nodes.push(node(&name(index), node_type));
                let from = name(index);
                let Some((edge_kind, targets)) = edge else {
                    continue;
                };
                let names: Vec<String> = targets.iter().map(|t| name(*t)).collect();
                topology.edges.push(match edge_kind {
                    0 => plain(&from, &names[0]),
                    1 => {
                        let cases: Vec<(String, &str)> = names
                            .iter()
                            .enumerate()
                            .map(|(c, to)| (alloc::format!("c{c}"), to.as_str()))
                            .collect();
                        let cases: Vec<(&str, &str)> =
                            cases.iter().map(|(c, t)| (c.as_str(), *t)).collect();
                        switch(&from, "$.route", &cases)
                    }
                    _ => switch(
                        &from,
                        "$result.outcome",
                        &[
                            ("ok", &names[0]),
                            ("failed", &names[1]),
                            ("timed_out", &names[2]),
                        ],
                    ),
                });
            }
            keep_reachable(topology)
        })
}

fn keep_reachable(mut topology: Topology) -> Topology {
    let mut reached = alloc::collections::BTreeSet::from([topology.start_at.clone()]);
    let mut frontier = vec![topology.start_at.clone()];
    while let Some(node_id) = frontier.pop() {
        if let Some(edge) = topology.outgoing(&node_id) {
            for to in edge.targets() {
                if reached.insert(to.clone()) {
                    frontier.push(to.clone());
                }
            }
        }
    }
    topology.nodes.retain(|node| reached.contains(&node.id));
    topology.edges.retain(|edge| reached.contains(edge.from()));
    topology
}

#[derive(Clone, Debug)]
enum Op {
    Admit,
    Ready,
    Started { deadline_in_ms: Option<u64> },
    Finish { outcome: NodeOutcome, route: u8 },
    StaleGeneration,
    StaleAttempt,
    ExpiredClaim,
    Crash(ExitKind),
    Expire,
    Resume,
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let outcome = prop_oneof![
        4 => Just(NodeOutcome::Ok),
        1 => Just(NodeOutcome::Failed),
        1 => Just(NodeOutcome::TimedOut),
    ];
    prop_oneof![
        2 => Just(Op::Admit),
        2 => Just(Op::Ready),
        1 => proptest::option::of(0u64..500).prop_map(|deadline_in_ms| Op::Started { deadline_in_ms }),
        6 => (outcome, 0u8..3).prop_map(|(outcome, route)| Op::Finish { outcome, route }),
        1 => Just(Op::StaleGeneration),
        1 => Just(Op::StaleAttempt),
        1 => Just(Op::ExpiredClaim),
        1 => prop_oneof![
            Just(ExitKind::Abnormal),
            Just(ExitKind::Clean),
            Just(ExitKind::StartupDeadlineMissed),
        ].prop_map(Op::Crash),
        1 => Just(Op::Expire),
        1 => Just(Op::Resume),
        1 => (0u64..600).prop_map(Op::Advance),
    ]
}

/// Everything the simulated shell keeps between transitions.
struct World {
    topology: Topology,
    agg: RunAggregate,
    now_ms: u64,
    next_id: u32,
    /// Every attempt row ever written, by id (what the database would hold).
    attempt_rows: BTreeMap<AttemptId, AttemptStatus>,
    /// The result record of every finished attempt.
    records: BTreeMap<AttemptId, Value>,
}

impl World {
    fn fresh_id(&mut self) -> AttemptId {
        self.next_id += 1;
        AttemptId::new(alloc::format!("at-{}", self.next_id))
    }

    fn authority(&self) -> (Authority, RunnerEpochId) {
        let generation = self.agg.run.lease.generation.0;
        (host_authority(generation), runner_epoch(generation))
    }

    fn apply(&mut self, op: &Op) -> Option<Result<Transition<RunAggregate>, Rejection>> {
        let (authority, epoch) = self.authority();
        let now_ms = self.now_ms;
        let result = match op.clone() {
            Op::Advance(ms) => {
                self.now_ms += ms;
                return None;
            }
            Op::Admit => {
                let generation = self.agg.run.lease.generation.0 + 1;
                run::admit(
                    &self.agg,
                    runner_epoch(generation),
                    fixtures::token(generation),
                    now_ms,
                    TTL_MS,
                )
            }
            Op::Ready => {
                let route_from = self
                    .agg
                    .steps
                    .last()
                    .and_then(|step| self.records.get(&step.attempt_id))
                    .cloned();
                let new_id = self.fresh_id();
                start_generation(
                    &self.agg,
                    &self.topology,
                    &authority,
                    &epoch,
                    route_from.as_ref(),
                    None,
                    new_id,
                    now_ms,
                    TTL_MS,
                )
                .map(|(transition, _)| transition)
            }
            Op::Started { deadline_in_ms } => {
                let attempt = self.agg.attempt.as_ref()?.attempt_id.clone();
                let deadline = deadline_in_ms.map(|ms| now_ms + ms);
                record_node_started(
                    &self.agg, &authority, &epoch, &attempt, deadline, now_ms, TTL_MS,
                )
            }
            Op::Finish { outcome, route } => {
                let attempt = self.agg.attempt.as_ref()?.clone();
                let output = json!({ "route": alloc::format!("c{route}") });
                let record = result_record(
                    attempt.attempt_id.as_str(),
                    attempt.node_id.as_str(),
                    outcome,
                    output,
                );
                self.records
                    .insert(attempt.attempt_id.clone(), record.clone());
                let actor = if attempt.status == AttemptStatus::Waiting {
                    Actor::Control {
                        request: control_request(),
                        failure: None,
                    }
                } else {
                    Actor::Runner {
                        authority: &authority,
                        runner_epoch: &epoch,
                    }
                };
                let new_id = self.fresh_id();
                let result = NodeResult { outcome, record };
                finish_attempt(
                    &self.agg,
                    &self.topology,
                    actor,
                    &attempt.attempt_id,
                    result,
                    new_id,
                    now_ms,
                    TTL_MS,
                )
                .map(|(transition, _)| transition)
            }
            Op::StaleGeneration | Op::StaleAttempt | Op::ExpiredClaim => {
                return Some(self.stale(op, &authority, &epoch));
            }
            Op::Crash(kind) => {
                let runner_epoch = self.agg.run.runner.as_ref()?.runner_epoch.clone();
                decide_exit(
                    &self.agg,
                    RunnerExit { runner_epoch, kind },
                    Some(&authority),
                    control_request(),
                    now_ms,
                    TTL_MS,
                )
            }
            Op::Expire => {
                let attempt = self.agg.attempt.as_ref()?.clone();
                self.now_ms = self.now_ms.max(attempt.deadline_at_ms?);
                let record =
                    ResultRecord::of(&attempt, &self.topology, NodeOutcome::TimedOut, self.now_ms)
                        .error(Some(DEADLINE_MESSAGE))
                        .to_value();
                self.records.insert(attempt.attempt_id.clone(), record);
                expire_node(
                    &self.agg,
                    &self.topology,
                    Some(&authority),
                    control_request(),
                    &attempt.attempt_id,
                    self.now_ms,
                    TTL_MS,
                )
                .map(|(transition, _)| transition)
            }
            Op::Resume => run::resume(
                &self.agg,
                run::ResumeIds {
                    resumed_message_id: MessageId::from("m-r"),
                    message_order: 1,
                },
                now_ms,
            ),
        };
        Some(result)
    }

    /// A message the current runner cannot legitimately send: from the
    /// previous generation, for an attempt that is not current, or after its
    /// claim expired. It must be refused.
    fn stale(
        &self,
        op: &Op,
        authority: &Authority,
        epoch: &RunnerEpochId,
    ) -> Result<Transition<RunAggregate>, Rejection> {
        let generation = self.agg.run.lease.generation.0;
        let (attempt, node_id) = self.agg.attempt.as_ref().map_or_else(
            || (attempt_id("none"), id("n0")),
            |a| (a.attempt_id.clone(), a.node_id.clone()),
        );
        let (authority, epoch, attempt, now_ms) = match op {
            Op::StaleGeneration => (
                host_authority(generation.saturating_sub(1)),
                runner_epoch(generation.saturating_sub(1)),
                attempt,
                self.now_ms,
            ),
            Op::StaleAttempt => (
                authority.clone(),
                epoch.clone(),
                attempt_id("not-current"),
                self.now_ms,
            ),
            _ => (
                authority.clone(),
                epoch.clone(),
                attempt,
                self.now_ms + 10 * TTL_MS,
            ),
        };
        let record = result_record(
            attempt.as_str(),
            node_id.as_str(),
            NodeOutcome::Ok,
            json!({"route": "c0"}),
        );
        let actor = Actor::Runner {
            authority: &authority,
            runner_epoch: &epoch,
        };
        let result = NodeResult {
            outcome: NodeOutcome::Ok,
            record,
        };
        finish_attempt(
            &self.agg,
            &self.topology,
            actor,
            &attempt,
            result,
            attempt_id("x"),
            now_ms,
            TTL_MS,
        )
        .map(|(transition, _)| transition)
    }
}

fn check_invariants(world: &World) -> Result<(), TestCaseError> {
    let agg = &world.agg;
    let run = &agg.run;
    prop_assert!(
        RunRecord::pair_is_legal(run.status, run.queue),
        "illegal pair {:?}",
        pair(agg)
    );
    if !RunRecord::pair_holds_claim(run.status, run.queue) {
        prop_assert_eq!(&run.lease.claim, &None);
    }
    let unfinished = world
        .attempt_rows
        .values()
        .filter(|s| s.is_unfinished())
        .count();
    prop_assert!(unfinished <= 1, "{} unfinished attempts", unfinished);
    if run.status.is_terminal() {
        prop_assert_eq!(unfinished, 0);
    }
    let active = agg
        .attempt
        .as_ref()
        .is_some_and(|a| a.status == AttemptStatus::Active);
    prop_assert_eq!(
        active,
        pair(agg) == (RunStatus::Running, QueueStatus::Running),
        "an active attempt exactly while a runner runs a node"
    );
    let limit = world.topology.root_max_steps() as usize;
    prop_assert!(agg.steps.real as usize <= limit);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// Random runner messages (ready, node started, finish ok / failed /
    /// timed out, stale generation, stale attempt, expired claim, crash,
    /// deadline) over a random graph keep the run inside the state table,
    /// keep at most one unfinished attempt, never exceed `maxSteps`, keep
    /// terminal states absorbing and let no stale message change anything.
    #[test]
    fn random_runner_messages_keep_every_execution_invariant(
        topology in graph(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        prop_assert_eq!(topology.validate(), Ok(()));
        let mut world = World {
            topology,
            agg: reserved(1, 0),
            now_ms: 1,
            next_id: 0,
            attempt_rows: BTreeMap::new(),
            records: BTreeMap::new(),
        };
        for op in ops {
            let before = world.agg.clone();
            let stale = matches!(op, Op::StaleGeneration | Op::StaleAttempt | Op::ExpiredClaim);
            let Some(result) = world.apply(&op) else { continue };
            match result {
                Ok(transition) => {
                    prop_assert!(!stale, "a stale message was accepted: {:?}", op);
                    let after = transition.facts;
                    if before.run.status.is_terminal() {
                        prop_assert_eq!(after.run.status, before.run.status, "terminal is absorbing");
                        prop_assert_eq!(&after.steps, &before.steps);
                    }
                    prop_assert!(after.run.revision >= before.run.revision);
                    prop_assert!(after.run.revision <= before.run.revision.next());
                    // The shell writes the new step's attempt row, then the current attempt.
                    let new_steps = after.steps.count - before.steps.count;
                    prop_assert!(new_steps <= 1, "one step per transition at most");
                    if new_steps == 1 {
                        let step = after.steps.last().expect("the new step");
                        let earlier = world.attempt_rows.get(&step.attempt_id);
                        prop_assert!(
                            !matches!(earlier, Some(AttemptStatus::Finished(_))),
                            "an attempt finished twice"
                        );
                        let status = AttemptStatus::Finished(step.outcome);
                        world.attempt_rows.insert(step.attempt_id.clone(), status);
                    }
                    if let Some(attempt) = &after.attempt {
                        world.attempt_rows.insert(attempt.attempt_id.clone(), attempt.status);
                    }
                    world.agg = after.reload();
                }
                Err(_) => prop_assert_eq!(&world.agg, &before),
            }
            check_invariants(&world)?;
        }
    }
}

// ---- notify ----------------------------------------------------------------

fn notify_graph() -> Topology {
    let mut topology = chain(&["tell", "after"]);
    topology.nodes[0] = node("tell", NodeType::Notify);
    topology
}

fn notify(
    agg: &RunAggregate,
    topology: &Topology,
    generation: u64,
) -> Result<(Transition<RunAggregate>, Dispatch, Option<StartDeadline>), Rejection> {
    let attempt = current(agg).attempt_id.clone();
    let result = NodeResult {
        outcome: NodeOutcome::Ok,
        record: record(agg, NodeOutcome::Ok, json!({"notificationId": "m-note"})),
    };
    let message = NotificationMessage {
        message_id: MessageId::from("m-note"),
        order: 4,
    };
    finish_notification(
        agg,
        topology,
        &host_authority(generation),
        &runner_epoch(generation),
        &attempt,
        result,
        message,
        attempt_id("a-after"),
        30,
        TTL_MS,
    )
}

#[test]
fn a_notification_finishes_the_node_and_adds_one_passive_message_in_the_origin_session() {
    let topology = notify_graph();
    let agg = start(&fixtures::reserved_interactive(1, 0), &topology, None).0;
    let (transition, dispatch, _) = notify(&agg, &topology, 1).unwrap();
    let facts = &transition.facts;
    assert_eq!(facts.steps.count, 1);
    assert_eq!(facts.steps.last().unwrap().outcome, NodeOutcome::Ok);
    let messages: Vec<_> = facts
        .messages
        .iter()
        .filter(|m| m.kind == MessageKind::Notification)
        .collect();
    assert_eq!(messages.len(), 1);
    assert_eq!(
        (messages[0].order, messages[0].state),
        (4, MessageState::Pending)
    );
    assert!(
        matches!(dispatch, Dispatch::RunNode { ref node_id, .. } if node_id.as_str() == "after")
    );
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::PublishSession { .. }
    )));
}

#[test]
fn a_headless_notification_keeps_its_content_in_the_output_only() {
    let topology = notify_graph();
    let agg = live(&topology);
    let (transition, _, _) = notify(&agg, &topology, 1).unwrap();
    assert!(transition.facts.messages.is_empty());
    assert_eq!(transition.facts.steps.count, 1);
}

/// A notify step is one commit too: the node it dispatches gets its static
/// deadline in the same transition, as after `node.finished`.
#[test]
fn a_notification_records_the_static_deadline_of_the_node_it_dispatches() {
    let mut topology = notify_graph();
    topology.nodes[1].timeout = NodeTimeout::Fixed { ms: 400 };
    let (transition, _, deadline) = notify(&live(&topology), &topology, 1).unwrap();
    assert_eq!(
        deadline,
        Some(StartDeadline::Committed {
            deadline_at_ms: Some(430)
        })
    );
    let next = current(&transition.facts);
    assert_eq!(next.deadline_at_ms, Some(430));
    assert!(has(&transition.outputs, |o| matches!(
        o,
        Output::Wake { at_ms: 430, reason: WakeReason::NodeDeadline { attempt_id }, .. }
            if *attempt_id == next.attempt_id
    )));
    let mut last = chain(&["tell"]);
    last.nodes[0] = node("tell", NodeType::Notify);
    let (_, dispatch, deadline) = notify(&live(&last), &last, 1).unwrap();
    assert!(matches!(dispatch, Dispatch::Exit { .. }));
    assert_eq!(deadline, None);
}

#[test]
fn only_a_notify_node_of_the_live_runner_can_notify() {
    let plain_graph = chain(&["tell", "after"]);
    let agg = live(&plain_graph);
    assert_eq!(
        notify(&agg, &plain_graph, 1).unwrap_err(),
        Rejection::ResultMismatch
    );
    let topology = notify_graph();
    let agg = live(&topology);
    assert!(matches!(
        notify(&agg, &topology, 2),
        Err(Rejection::ClaimLost { .. })
    ));
}

// ---- on_node_deadline --------------------------------------------------------

#[test]
fn a_deadline_wake_before_the_deadline_defers_to_the_deadline() {
    let topology = chain(&["work", "next"]);
    let agg = with_deadline(&live(&topology), 300);
    let attempt = current(&agg).attempt_id.clone();
    let step = on_node_deadline(
        &agg,
        &topology,
        Some(&host_authority(1)),
        control_request(),
        &attempt,
        299,
        TTL_MS,
    );
    assert_eq!(
        step,
        Ok(Step::Defer {
            at_ms: 300,
            reason: WakeReason::NodeDeadline {
                attempt_id: attempt
            }
        })
    );
}

#[test]
fn a_deadline_wake_without_authority_while_the_claim_is_live_defers_to_its_expiry() {
    let topology = chain(&["work", "next"]);
    let agg = with_deadline(&live(&topology), 300);
    let attempt = current(&agg).attempt_id.clone();
    let expires = agg.run.lease.claim.as_ref().unwrap().expires_at_ms;
    assert!(expires > 300, "the claim outlives the deadline");
    let step = on_node_deadline(
        &agg,
        &topology,
        None,
        control_request(),
        &attempt,
        300,
        TTL_MS,
    );
    assert_eq!(
        step,
        Ok(Step::Defer {
            at_ms: expires,
            reason: WakeReason::NodeDeadline {
                attempt_id: attempt
            }
        })
    );
}

#[test]
fn a_passed_deadline_times_the_node_out_with_the_kernels_result_record() {
    let topology = recovering();
    let agg = with_deadline(&live(&topology), 300);
    let attempt = current(&agg).clone();
    let Ok(Step::Apply(transition)) = on_node_deadline(
        &agg,
        &topology,
        Some(&host_authority(1)),
        control_request(),
        &attempt.attempt_id,
        450,
        TTL_MS,
    ) else {
        panic!("a passed deadline is decided now");
    };
    let step = transition.facts.steps.last().expect("a step");
    assert_eq!(step.outcome, NodeOutcome::TimedOut);
    // The timeout edge routed on the record the kernel built (it names the
    // attempt and outcome: `check_record` accepted it).
    assert_eq!(step.attempt_id, attempt.attempt_id);
    assert_eq!(
        ResultRecord::of(&attempt, &topology, NodeOutcome::TimedOut, 450)
            .error(Some(DEADLINE_MESSAGE))
            .to_value()["durationMs"],
        json!(450 - attempt.started_at_ms)
    );
}

// ---- protected checkpoints ---------------------------------------------------

/// `ask → gate (human decision) → done`.
fn protected_topology() -> Topology {
    let mut topology = chain(&["ask", "gate", "done"]);
    topology.nodes[1].node_type = NodeType::Checkpoint;
    topology.nodes[1].human_decision = true;
    topology
}

fn opening(deadline_at_ms: Option<u64>) -> crate::decision::Opening {
    crate::decision::Opening {
        decision_id: crate::ids::DecisionId::from("decision-1"),
        request_digest: Digest::repeat(0x71),
        deadline_at_ms,
        default_answer_digest: deadline_at_ms.map(|_| Digest::repeat(0xdf)),
    }
}

fn decision_message() -> DecisionMessage {
    DecisionMessage {
        message_id: MessageId::from("m-decision"),
        order: 7,
    }
}

/// Finishes the current attempt (the gate) as the protected checkpoint.
fn finish_protected(
    agg: &RunAggregate,
    topology: &Topology,
    outcome: NodeOutcome,
    deadline_at_ms: Option<u64>,
) -> Result<(Transition<RunAggregate>, Dispatch), Rejection> {
    let generation = agg.run.lease.generation.0;
    let attempt = current(agg).attempt_id.clone();
    let result = NodeResult {
        outcome,
        record: record(agg, outcome, json!({"schema": "request"})),
    };
    finish_protected_checkpoint(
        agg,
        topology,
        &host_authority(generation),
        &runner_epoch(generation),
        &attempt,
        result,
        opening(deadline_at_ms),
        decision_message(),
        40,
        TTL_MS,
    )
}

#[test]
fn a_protected_checkpoint_opens_its_decision_in_the_commit_that_makes_the_run_wait() {
    let topology = protected_topology();
    let at_gate = ok_through(&live(&topology), &topology, 30);
    assert_eq!(current(&at_gate).node_id, id("gate"));
    let (transition, dispatch) =
        finish_protected(&at_gate, &topology, NodeOutcome::Ok, Some(900)).unwrap();
    let waiting = &transition.facts;
    assert_eq!(pair(waiting), (RunStatus::Waiting, QueueStatus::Parked));
    assert_eq!(waiting.run.waiting_on, Some(id("gate")));
    assert_eq!(
        dispatch,
        Dispatch::Exit {
            reason: ExitReason::Waiting
        }
    );
    let decision = waiting.decision.as_ref().expect("the decision opened");
    assert_eq!(decision.status, DecisionStatus::Pending);
    assert_eq!(
        (decision.run_id.clone(), decision.node_id.clone()),
        (waiting.run.run_id.clone(), id("gate"))
    );
    assert_eq!(decision.deadline_at_ms, Some(900));
    assert_eq!(decision.default_answer_digest, Some(Digest::repeat(0xdf)));
    assert_eq!(waiting.run.revision, at_gate.run.revision.next());
    assert!(has(&transition.outputs, |output| matches!(
        output,
        Output::Wake {
            at_ms: 900,
            reason: WakeReason::DecisionDeadline,
            ..
        }
    )));
    // A headless run has no session to present the decision in.
    assert!(waiting.messages.is_empty());
}

#[test]
fn an_interactive_protected_checkpoint_gets_one_decision_message_and_no_deadline_without_expiry() {
    let topology = protected_topology();
    let agg = start(&fixtures::reserved_interactive(1, 0), &topology, None).0;
    let at_gate = ok_through(&agg, &topology, 30);
    let (transition, _) = finish_protected(&at_gate, &topology, NodeOutcome::Ok, None).unwrap();
    let messages = &transition.facts.messages;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].message_id, MessageId::from("m-decision"));
    assert_eq!(messages[0].order, 7);
    assert_eq!(messages[0].state, MessageState::Pending);
    assert!(matches!(
        &messages[0].kind,
        MessageKind::Decision { decision_id } if decision_id.as_str() == "decision-1"
    ));
    assert!(!has(&transition.outputs, |output| matches!(
        output,
        Output::Wake {
            reason: WakeReason::DecisionDeadline,
            ..
        }
    )));
}

#[test]
fn a_protected_checkpoint_finishes_only_through_its_decision() {
    let topology = protected_topology();
    let at_gate = ok_through(&live(&topology), &topology, 30);
    // A plain `ok` finish would wait without a decision: refused.
    assert_eq!(
        finish_as_runner(&at_gate, &topology, NodeOutcome::Ok, json!({}), 40).unwrap_err(),
        Rejection::ResultMismatch
    );
    // A failure of the checkpoint's request code routes as any failure.
    let (failed, _) =
        finish_as_runner(&at_gate, &topology, NodeOutcome::Failed, json!(null), 40).unwrap();
    assert_eq!(failed.facts.run.status, RunStatus::Failed);
    // The decision path takes only an `ok` human-decision checkpoint.
    assert_eq!(
        finish_protected(&at_gate, &topology, NodeOutcome::Failed, None).unwrap_err(),
        Rejection::ResultMismatch
    );
    let ordinary = chain(&["ask", "gate", "done"]);
    let at_ordinary_gate = ok_through(&live(&ordinary), &ordinary, 30);
    assert_eq!(
        finish_protected(&at_ordinary_gate, &ordinary, NodeOutcome::Ok, None).unwrap_err(),
        Rejection::ResultMismatch
    );
}
