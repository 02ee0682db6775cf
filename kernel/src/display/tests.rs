use super::*;
use crate::attempt::AttemptStatus;
use crate::decision::{DecisionRecord, DecisionStatus};
use crate::effect::{EffectKey, EffectRecord, EffectState};
use crate::fixtures::{self, TTL_MS, admitted, control_request, host_authority, reserved, running};
use crate::ids::{
    AttemptId, DecisionId, Digest, EffectId, InteractionId, MessageId, RunId, SessionId, TurnId,
};
use crate::interaction::InteractionRecord;
use crate::message::TurnRecord;
use crate::run::{self, FailureClass, ReasonKind, ResumeIds, Terminal, Tx};
use alloc::string::String;
use alloc::vec;
use proptest::prelude::*;

use Control as C;
use DisplayStatus as S;

// ---- builders ----------------------------------------------------------------

/// Facts of a live `running/running` run executing `work`.
fn live_facts() -> DisplayFacts {
    DisplayFacts {
        status: RunStatus::Running,
        queue: QueueStatus::Running,
        paused: false,
        park_reason: None,
        effect_ambiguous: false,
        pending_request: None,
        runner: RunnerActivity::Live,
        model_turn_active: false,
        submission_validating: false,
        attempt_node: Some(NodeId::from("work")),
        checkpoint_node: None,
        error: None,
        restart_eligible: false,
    }
}

/// Facts of a run waiting on `request` at node `ask` (or checkpoint `gate`).
fn waiting_facts(request: PendingRequest) -> DisplayFacts {
    let checkpoint = matches!(
        request,
        PendingRequest::CheckpointAnswer | PendingRequest::HumanDecision
    );
    DisplayFacts {
        status: RunStatus::Waiting,
        queue: QueueStatus::Parked,
        runner: RunnerActivity::None,
        pending_request: Some(request),
        attempt_node: (!checkpoint).then(|| NodeId::from("ask")),
        checkpoint_node: checkpoint.then(|| NodeId::from("gate")),
        ..live_facts()
    }
}

fn parked_facts(reason: ParkReason) -> DisplayFacts {
    DisplayFacts {
        queue: QueueStatus::Parked,
        park_reason: Some(reason),
        runner: RunnerActivity::None,
        attempt_node: None,
        ..live_facts()
    }
}

fn terminal_facts(status: RunStatus) -> DisplayFacts {
    let queue = match status {
        RunStatus::Completed => QueueStatus::Done,
        RunStatus::Cancelled => QueueStatus::Cancelled,
        _ => QueueStatus::Failed,
    };
    let error = matches!(status, RunStatus::Failed | RunStatus::TimedOut).then(|| RunError {
        class: FailureClass::NodeFailed,
        reason: ReasonKind::NodeFailed,
        node_id: Some(NodeId::from("work")),
    });
    DisplayFacts {
        status,
        queue,
        runner: RunnerActivity::None,
        attempt_node: None,
        error,
        restart_eligible: true,
        ..live_facts()
    }
}

fn node(id: &str) -> Option<NodeId> {
    Some(NodeId::from(id))
}

// ---- one row per situation ---------------------------------------------------

#[test]
fn table_of_situations() {
    struct Row {
        name: &'static str,
        facts: DisplayFacts,
        status: DisplayStatus,
        activity: Activity,
        controls: &'static [Control],
        current_node: Option<NodeId>,
        waiting_on: Option<NodeId>,
    }
    let queued = DisplayFacts {
        status: RunStatus::Queued,
        queue: QueueStatus::Queued,
        runner: RunnerActivity::None,
        attempt_node: None,
        ..live_facts()
    };
    let starting = DisplayFacts {
        queue: QueueStatus::Starting,
        runner: RunnerActivity::Starting,
        attempt_node: None,
        ..live_facts()
    };
    let with_turn = |facts: DisplayFacts| DisplayFacts {
        model_turn_active: true,
        ..facts
    };
    let paused = |facts: DisplayFacts| DisplayFacts {
        paused: true,
        ..facts
    };
    let ambiguous = |facts: DisplayFacts| DisplayFacts {
        effect_ambiguous: true,
        ..facts
    };
    let rows = [
        Row {
            name: "reserved, not admitted",
            facts: queued.clone(),
            status: S::Queued,
            activity: Activity::None,
            controls: &[C::Pause, C::Cancel],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "admitted, runner not ready",
            facts: starting.clone(),
            status: S::Queued,
            activity: Activity::Starting,
            controls: &[C::Pause, C::Cancel],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "live runner",
            facts: live_facts(),
            status: S::Running,
            activity: Activity::Runner,
            controls: &[C::Pause, C::Cancel],
            current_node: node("work"),
            waiting_on: None,
        },
        Row {
            name: "parked to resume automatically",
            facts: parked_facts(ParkReason::ResumeReady),
            status: S::Queued,
            activity: Activity::None,
            controls: &[C::Pause, C::Cancel],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "parked while its runner still stops",
            facts: DisplayFacts {
                runner: RunnerActivity::Live,
                ..parked_facts(ParkReason::Drained)
            },
            status: S::Queued,
            activity: Activity::Runner,
            controls: &[C::Pause, C::Cancel],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "parked for review",
            facts: parked_facts(ParkReason::RunnerNoProgress),
            status: S::Queued,
            activity: Activity::None,
            controls: &[C::Pause, C::Resume, C::Cancel],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "agent step waits",
            facts: waiting_facts(PendingRequest::AgentSubmit),
            status: S::Waiting,
            activity: Activity::None,
            controls: &[C::Submit, C::Update, C::Pause, C::Cancel],
            current_node: None,
            waiting_on: node("ask"),
        },
        Row {
            name: "agent step during its exact model turn",
            facts: with_turn(waiting_facts(PendingRequest::AgentSubmit)),
            status: S::Running,
            activity: Activity::ModelTurn,
            controls: &[C::Submit, C::Update, C::Pause, C::Cancel],
            current_node: node("ask"),
            waiting_on: None,
        },
        Row {
            name: "agent step while its submission validates",
            facts: DisplayFacts {
                submission_validating: true,
                ..waiting_facts(PendingRequest::AgentSubmit)
            },
            status: S::Waiting,
            activity: Activity::Validating,
            controls: &[C::Submit, C::Update, C::Pause, C::Cancel],
            current_node: None,
            waiting_on: node("ask"),
        },
        Row {
            name: "visible-response step",
            facts: waiting_facts(PendingRequest::VisibleResponse),
            status: S::Waiting,
            activity: Activity::None,
            controls: &[C::Pause, C::Cancel],
            current_node: None,
            waiting_on: node("ask"),
        },
        Row {
            name: "ordinary checkpoint",
            facts: waiting_facts(PendingRequest::CheckpointAnswer),
            status: S::Waiting,
            activity: Activity::None,
            controls: &[C::Answer, C::Pause, C::Cancel],
            current_node: None,
            waiting_on: node("gate"),
        },
        Row {
            name: "checkpoint during an exact model turn",
            facts: with_turn(waiting_facts(PendingRequest::CheckpointAnswer)),
            status: S::Running,
            activity: Activity::ModelTurn,
            controls: &[C::Answer, C::Pause, C::Cancel],
            current_node: node("gate"),
            waiting_on: None,
        },
        Row {
            name: "protected decision",
            facts: waiting_facts(PendingRequest::HumanDecision),
            status: S::Waiting,
            activity: Activity::None,
            controls: &[C::HumanAnswer, C::Pause, C::Cancel],
            current_node: None,
            waiting_on: node("gate"),
        },
        Row {
            name: "paused agent step: no answer controls",
            facts: paused(waiting_facts(PendingRequest::AgentSubmit)),
            status: S::Paused,
            activity: Activity::None,
            controls: &[C::Resume, C::Cancel],
            current_node: None,
            waiting_on: node("ask"),
        },
        Row {
            name: "paused, but the pausing turn still runs: running until its end",
            facts: paused(with_turn(waiting_facts(PendingRequest::AgentSubmit))),
            status: S::Running,
            activity: Activity::ModelTurn,
            controls: &[C::Resume, C::Cancel],
            current_node: node("ask"),
            waiting_on: None,
        },
        Row {
            name: "paused while the runner stops",
            facts: paused(DisplayFacts {
                queue: QueueStatus::Parked,
                park_reason: Some(ParkReason::Paused),
                attempt_node: None,
                ..live_facts()
            }),
            status: S::Paused,
            activity: Activity::Runner,
            controls: &[C::Resume, C::Cancel],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "paused before admission",
            facts: paused(queued),
            status: S::Paused,
            activity: Activity::None,
            controls: &[C::Resume, C::Cancel],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "ambiguous effect on a parked run",
            facts: ambiguous(parked_facts(ParkReason::EffectAmbiguous)),
            status: S::Ambiguous,
            activity: Activity::None,
            controls: &[C::Pause, C::Cancel, C::RecoverEffect],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "ambiguous wins over pause and a pending request",
            facts: ambiguous(paused(with_turn(waiting_facts(
                PendingRequest::AgentSubmit,
            )))),
            status: S::Ambiguous,
            activity: Activity::ModelTurn,
            controls: &[C::Cancel, C::RecoverEffect],
            current_node: None,
            waiting_on: node("ask"),
        },
        Row {
            name: "completed",
            facts: terminal_facts(RunStatus::Completed),
            status: S::Completed,
            activity: Activity::None,
            controls: &[],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "completed while its terminal turn runs",
            facts: with_turn(terminal_facts(RunStatus::Completed)),
            status: S::Completed,
            activity: Activity::ModelTurn,
            controls: &[],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "failed",
            facts: terminal_facts(RunStatus::Failed),
            status: S::Failed,
            activity: Activity::None,
            controls: &[C::Restart],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "failed at the restart limit",
            facts: DisplayFacts {
                restart_eligible: false,
                ..terminal_facts(RunStatus::Failed)
            },
            status: S::Failed,
            activity: Activity::None,
            controls: &[],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "timed out while the runner is reaped",
            facts: DisplayFacts {
                runner: RunnerActivity::Live,
                ..terminal_facts(RunStatus::TimedOut)
            },
            status: S::TimedOut,
            activity: Activity::Runner,
            controls: &[C::Restart],
            current_node: None,
            waiting_on: None,
        },
        Row {
            name: "cancelled with an ambiguous effect keeps its label",
            facts: ambiguous(terminal_facts(RunStatus::Cancelled)),
            status: S::Cancelled,
            activity: Activity::None,
            controls: &[C::RecoverEffect],
            current_node: None,
            waiting_on: None,
        },
    ];
    for row in rows {
        let shown = display(&row.facts);
        assert_eq!(shown.status, row.status, "{}", row.name);
        assert_eq!(shown.activity, row.activity, "{}", row.name);
        assert_eq!(shown.controls, row.controls, "{}", row.name);
        assert_eq!(shown.current_node, row.current_node, "{}", row.name);
        assert_eq!(shown.waiting_on, row.waiting_on, "{}", row.name);
    }
}

#[test]
fn reasons_name_the_action_that_is_required() {
    let failed = terminal_facts(RunStatus::Failed);
    assert_eq!(
        display(&failed).reason,
        Some(DisplayReason::Error {
            error: failed.error.clone().unwrap()
        })
    );
    let ambiguous_cancel = DisplayFacts {
        effect_ambiguous: true,
        ..terminal_facts(RunStatus::Cancelled)
    };
    assert_eq!(
        display(&ambiguous_cancel).reason,
        Some(DisplayReason::EffectAmbiguous)
    );
    for park_reason in [
        ParkReason::RunnerNoProgress,
        ParkReason::WorkflowSourceChanged,
        ParkReason::WorkerTimedOut,
        ParkReason::ProtocolRejected,
    ] {
        assert_eq!(
            display(&parked_facts(park_reason)).reason,
            Some(DisplayReason::ParkedForReview { park_reason })
        );
    }
    assert_eq!(display(&parked_facts(ParkReason::Drained)).reason, None);
    assert_eq!(display(&live_facts()).reason, None);
    assert_eq!(display(&terminal_facts(RunStatus::Completed)).reason, None);
}

#[test]
fn display_serializes_to_the_wire_names() {
    let shown = display(&DisplayFacts {
        model_turn_active: true,
        ..waiting_facts(PendingRequest::HumanDecision)
    });
    let json = serde_json::to_value(&shown).unwrap();
    assert_eq!(json["status"], "running");
    assert_eq!(json["activity"], "modelTurn");
    assert_eq!(
        json["controls"],
        serde_json::json!(["humanAnswer", "pause", "cancel"])
    );
    assert_eq!(
        serde_json::to_value(controls(&DisplayFacts {
            model_turn_active: true,
            ..waiting_facts(PendingRequest::HumanDecision)
        }))
        .unwrap(),
        serde_json::json!(["humanAnswer", "pause", "cancel"])
    );
    assert_eq!(json["currentNode"], "gate");
    assert_eq!(
        serde_json::to_value(DisplayStatus::TimedOut).unwrap(),
        "timed_out"
    );
    assert_eq!(
        serde_json::to_value(Control::RecoverEffect).unwrap(),
        "recoverEffect"
    );
}

// ---- the exhaustive table ----------------------------------------------------

/// Every durable state the table holds, with the park reasons that matter.
fn durable_states() -> alloc::vec::Vec<(RunStatus, QueueStatus, Option<ParkReason>)> {
    let mut states = vec![
        (RunStatus::Queued, QueueStatus::Queued, None),
        (RunStatus::Running, QueueStatus::Starting, None),
        (RunStatus::Running, QueueStatus::Running, None),
        (RunStatus::Waiting, QueueStatus::Parked, None),
        (RunStatus::Completed, QueueStatus::Done, None),
        (RunStatus::Failed, QueueStatus::Failed, None),
        (RunStatus::TimedOut, QueueStatus::Failed, None),
        (RunStatus::Cancelled, QueueStatus::Cancelled, None),
    ];
    for reason in ALL_PARK_REASONS {
        states.push((RunStatus::Running, QueueStatus::Parked, Some(reason)));
    }
    states
}

const ALL_PARK_REASONS: [ParkReason; 10] = [
    ParkReason::Drained,
    ParkReason::Recovered,
    ParkReason::WorkerCrashed,
    ParkReason::ResumeReady,
    ParkReason::Paused,
    ParkReason::RunnerNoProgress,
    ParkReason::WorkflowSourceChanged,
    ParkReason::EffectAmbiguous,
    ParkReason::WorkerTimedOut,
    ParkReason::ProtocolRejected,
];

const RUNNERS: [RunnerActivity; 3] = [
    RunnerActivity::None,
    RunnerActivity::Starting,
    RunnerActivity::Live,
];

const REQUESTS: [Option<PendingRequest>; 5] = [
    None,
    Some(PendingRequest::AgentSubmit),
    Some(PendingRequest::VisibleResponse),
    Some(PendingRequest::CheckpointAnswer),
    Some(PendingRequest::HumanDecision),
];

/// The seed's precedence written as a table over
/// (terminal label, ambiguous, paused, pending request, exact turn, live runner).
fn expected_status(facts: &DisplayFacts) -> DisplayStatus {
    let label = match facts.status {
        RunStatus::Completed => Some(S::Completed),
        RunStatus::Failed => Some(S::Failed),
        RunStatus::TimedOut => Some(S::TimedOut),
        RunStatus::Cancelled => Some(S::Cancelled),
        _ => None,
    };
    let live = facts.runner == RunnerActivity::Live
        && matches!(facts.queue, QueueStatus::Starting | QueueStatus::Running);
    match (
        label,
        facts.effect_ambiguous,
        facts.paused,
        facts.pending_request.is_some(),
        facts.model_turn_active,
        live,
    ) {
        (Some(label), ..) => label,
        (None, true, ..) => S::Ambiguous,
        (None, false, true, _, false, _) => S::Paused,
        (None, false, true, _, true, _) => S::Running,
        (None, false, false, true, true, _) => S::Running,
        (None, false, false, true, false, _) => S::Waiting,
        (None, false, false, false, true, _) | (None, false, false, false, false, true) => {
            S::Running
        }
        (None, false, false, false, false, false) => S::Queued,
    }
}

fn expected_activity(facts: &DisplayFacts) -> Activity {
    match (
        facts.model_turn_active,
        facts.submission_validating,
        facts.runner,
    ) {
        (true, ..) => Activity::ModelTurn,
        (false, true, _) => Activity::Validating,
        (false, false, RunnerActivity::Live) => Activity::Runner,
        (false, false, RunnerActivity::Starting) => Activity::Starting,
        (false, false, RunnerActivity::None) => Activity::None,
    }
}

fn check_controls(facts: &DisplayFacts, controls: &[Control]) {
    let nonterminal = !facts.status.is_terminal();
    let answerable = nonterminal && !facts.effect_ambiguous && !facts.paused;
    let has = |control| controls.contains(&control);
    let request = facts.pending_request;
    assert_eq!(
        has(C::Submit),
        answerable && request == Some(PendingRequest::AgentSubmit)
    );
    assert_eq!(has(C::Update), has(C::Submit));
    assert_eq!(
        has(C::Answer),
        answerable && request == Some(PendingRequest::CheckpointAnswer)
    );
    assert_eq!(
        has(C::HumanAnswer),
        answerable && request == Some(PendingRequest::HumanDecision)
    );
    assert_eq!(has(C::Pause), nonterminal && !facts.paused);
    let review = facts.queue == QueueStatus::Parked
        && facts.status == RunStatus::Running
        && !matches!(
            facts.park_reason,
            None | Some(
                ParkReason::Drained
                    | ParkReason::Recovered
                    | ParkReason::WorkerCrashed
                    | ParkReason::ResumeReady
            )
        );
    assert_eq!(
        has(C::Resume),
        nonterminal && !facts.effect_ambiguous && (facts.paused || review)
    );
    assert_eq!(has(C::Cancel), nonterminal);
    assert_eq!(has(C::RecoverEffect), facts.effect_ambiguous);
    assert_eq!(
        has(C::Restart),
        matches!(facts.status, RunStatus::Failed | RunStatus::TimedOut) && facts.restart_eligible
    );
    assert!(
        controls.windows(2).all(|pair| pair[0] < pair[1]),
        "controls sorted and unique: {controls:?}"
    );
}

fn check_nodes(facts: &DisplayFacts, shown: &RunDisplay) {
    let waiting_node = facts
        .attempt_node
        .clone()
        .or_else(|| facts.checkpoint_node.clone());
    let expected = if facts.status.is_terminal() {
        (None, None)
    } else if facts.pending_request.is_some() && shown.status == S::Running {
        (waiting_node, None)
    } else if facts.pending_request.is_some() {
        (None, waiting_node)
    } else {
        (facts.attempt_node.clone(), None)
    };
    assert_eq!(
        (shown.current_node.clone(), shown.waiting_on.clone()),
        expected
    );
}

/// Every durable state × runner × pending request × pause × ambiguous × exact
/// turn × validation × restart eligibility.
#[test]
fn exhaustive_table_follows_the_precedence() {
    let mut checked = 0u32;
    for (status, queue, park_reason) in durable_states() {
        for runner in RUNNERS {
            for pending_request in REQUESTS {
                for bits in 0u8..32 {
                    let bit = |n: u8| bits & (1 << n) != 0;
                    let checkpoint = matches!(
                        pending_request,
                        Some(PendingRequest::CheckpointAnswer | PendingRequest::HumanDecision)
                    );
                    let facts = DisplayFacts {
                        status,
                        queue,
                        paused: bit(0),
                        park_reason,
                        effect_ambiguous: bit(1),
                        pending_request,
                        runner,
                        model_turn_active: bit(2),
                        submission_validating: bit(3),
                        attempt_node: (!checkpoint).then(|| NodeId::from("n")),
                        checkpoint_node: checkpoint.then(|| NodeId::from("gate")),
                        error: None,
                        restart_eligible: bit(4),
                    };
                    let shown = display(&facts);
                    assert_eq!(shown.status, expected_status(&facts), "{facts:?}");
                    assert_eq!(shown.activity, expected_activity(&facts), "{facts:?}");
                    check_controls(&facts, &shown.controls);
                    check_nodes(&facts, &shown);
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 18 * 3 * 5 * 32);
}

// ---- facts read from real aggregates -----------------------------------------

fn interaction(kind: InteractionKind) -> InteractionRecord {
    InteractionRecord {
        interaction_id: InteractionId::from("i-1"),
        run_id: RunId::from("run-1"),
        attempt_id: AttemptId::from("a-1-work"),
        node_id: NodeId::from("work"),
        target_session: Some(SessionId::from("s-1")),
        kind,
        contract_hash: Digest::repeat(3),
        status: InteractionStatus::Pending,
        accepted_submission: None,
        unproductive_turn_ends: 0,
        revision: 1,
        clock: crate::interaction::TurnClock::default(),
        created_at_ms: 20,
    }
}

fn effect(state: EffectState) -> EffectRecord {
    EffectRecord {
        effect_id: EffectId::from("e-1"),
        key: EffectKey {
            run_id: RunId::from("run-1"),
            effect_type: String::from("http"),
            node_path: NodeId::from("work"),
            visit: 1,
        },
        request_fingerprint: Digest::repeat(7),
        state,
        attempt_number: 1,
        node_attempt_id: None,
        result_digest: None,
    }
}

fn open_turn() -> TurnRecord {
    TurnRecord {
        turn_id: TurnId::from("t-1"),
        message_id: MessageId::from("m-1"),
        run_id: RunId::from("run-1"),
        session_id: SessionId::from("s-1"),
        state: TurnState::Open,
        started_at_ms: 25,
        ended_at_ms: None,
        response_entry_id: None,
    }
}

/// An interactive run `running/running` on node `work`, generation 1, at t=10.
fn live_run() -> RunAggregate {
    let agg = admitted(&fixtures::reserved_interactive(1, 0), 5).facts;
    running(&agg, "work", 10).facts
}

/// The live run, now waiting on an interaction of `kind` for its attempt.
fn waiting_on(kind: InteractionKind) -> RunAggregate {
    let agg = live_run();
    let mut tx = Tx::begin(&agg, 20);
    tx.agg.attempt.as_mut().unwrap().status = AttemptStatus::Waiting;
    run::wait_in(&mut tx, &host_authority(1), NodeId::from("work"), false).unwrap();
    tx.agg.interaction = Some(interaction(kind));
    tx.commit().facts
}

/// The live run, now waiting on checkpoint `gate` (no unfinished attempt).
fn waiting_on_checkpoint() -> RunAggregate {
    let agg = live_run();
    let mut tx = Tx::begin(&agg, 20);
    tx.agg.attempt = None;
    run::wait_in(&mut tx, &host_authority(1), NodeId::from("gate"), true).unwrap();
    tx.commit().facts
}

fn shown(agg: &RunAggregate) -> RunDisplay {
    display(&DisplayFacts::from_run(agg, OutsideFacts::default()))
}

#[test]
fn from_run_reads_queued_starting_and_live_runs() {
    let queued = reserved(1, 0);
    assert_eq!(shown(&queued).status, S::Queued);
    assert_eq!(shown(&queued).activity, Activity::None);
    let starting = admitted(&queued, 5).facts;
    let display = shown(&starting);
    assert_eq!(
        (display.status, display.activity),
        (S::Queued, Activity::Starting)
    );
    let live = running(&starting, "work", 10).facts;
    let display = shown(&live);
    assert_eq!(
        (display.status, display.activity),
        (S::Running, Activity::Runner)
    );
    assert_eq!(display.current_node, node("work"));
    assert_eq!(display.controls, [C::Pause, C::Cancel]);
}

#[test]
fn from_run_reads_interactive_requests_and_exact_turns() {
    let agent = waiting_on(InteractionKind::SubmittedOutput);
    let display = shown(&agent);
    assert_eq!(display.status, S::Waiting);
    assert_eq!(display.waiting_on, node("work"));
    assert_eq!(
        display.controls,
        [C::Submit, C::Update, C::Pause, C::Cancel]
    );

    let mut turning = agent.clone();
    turning.turns.push(open_turn());
    let display = shown(&turning);
    assert_eq!(
        (display.status, display.activity),
        (S::Running, Activity::ModelTurn)
    );
    assert_eq!(
        (display.current_node, display.waiting_on),
        (node("work"), None)
    );
    // Presentation only: the durable run still waits.
    assert_eq!(turning.run.status, RunStatus::Waiting);

    let mut ended = turning.clone();
    ended.turns[0].state = TurnState::Completed;
    assert_eq!(shown(&ended).status, S::Waiting);

    let visible = waiting_on(InteractionKind::AssistantMessage);
    assert_eq!(shown(&visible).controls, [C::Pause, C::Cancel]);

    let validating = display_with(
        &agent,
        OutsideFacts {
            submission_validating: true,
            restart_eligible: false,
        },
    );
    assert_eq!(validating.activity, Activity::Validating);
    assert_eq!(validating.status, S::Waiting);
}

fn display_with(agg: &RunAggregate, outside: OutsideFacts) -> RunDisplay {
    display(&DisplayFacts::from_run(agg, outside))
}

#[test]
fn from_run_reads_checkpoints_and_protected_decisions() {
    let checkpoint = waiting_on_checkpoint();
    let display = shown(&checkpoint);
    assert_eq!(display.status, S::Waiting);
    assert_eq!(
        (display.current_node, display.waiting_on),
        (None, node("gate"))
    );
    assert_eq!(display.controls, [C::Answer, C::Pause, C::Cancel]);

    let mut decision = checkpoint.clone();
    decision.decision = Some(DecisionRecord {
        decision_id: DecisionId::from("d-1"),
        run_id: RunId::from("run-1"),
        node_id: NodeId::from("gate"),
        request_digest: Digest::repeat(4),
        status: DecisionStatus::Pending,
        deadline_at_ms: Some(1_000),
        default_answer_digest: None,
        continuation_run_id: None,
    });
    assert_eq!(
        shown(&decision).controls,
        [C::HumanAnswer, C::Pause, C::Cancel]
    );
    decision.decision.as_mut().unwrap().status = DecisionStatus::Cancelled;
    assert_eq!(shown(&decision).controls, [C::Answer, C::Pause, C::Cancel]);
}

#[test]
fn from_run_shows_pause_only_from_the_durable_flag() {
    let agent = waiting_on(InteractionKind::SubmittedOutput);
    let paused = run::pause(&agent, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts;
    let display = shown(&paused);
    assert_eq!(display.status, S::Paused);
    assert_eq!(display.waiting_on, node("work"));
    assert_eq!(display.controls, [C::Resume, C::Cancel]);

    // A parked queue alone is not a pause; its stopping runner is activity only.
    let parked = run::park(&live_run(), &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts;
    let display = shown(&parked);
    assert_eq!(
        (display.status, display.activity),
        (S::Queued, Activity::Runner)
    );

    // Pausing a live run shows `paused` at once, while its runner still stops.
    let live = live_run();
    let paused_live = run::pause(
        &live,
        Some(&host_authority(1)),
        control_request(),
        30,
        TTL_MS,
    )
    .unwrap()
    .facts;
    let display = shown(&paused_live);
    assert_eq!(
        (display.status, display.activity),
        (S::Paused, Activity::Runner)
    );
}

#[test]
fn from_run_shows_ambiguity_and_terminal_results() {
    let mut live = live_run();
    live.effects.push(effect(EffectState::Applying));
    let parked = run::park(&live, &host_authority(1), ParkReason::WorkerCrashed, 30)
        .unwrap()
        .facts;
    let display = shown(&parked);
    assert_eq!(display.status, S::Ambiguous);
    assert_eq!(display.controls, [C::Pause, C::Cancel, C::RecoverEffect]);

    let cancelled = run::cancel(
        &live,
        Some(&host_authority(1)),
        control_request(),
        30,
        TTL_MS,
    )
    .unwrap()
    .facts;
    let display = shown(&cancelled);
    assert_eq!(display.status, S::Cancelled);
    // The applying effect became ambiguous with the cancellation: its
    // review (a confirmation; a retry is refused) is still offered.
    assert_eq!(display.controls, [C::RecoverEffect]);

    let error = RunError {
        class: FailureClass::NodeFailed,
        reason: ReasonKind::NodeFailed,
        node_id: node("work"),
    };
    let failed = run::finish(
        &live_run(),
        Some(&host_authority(1)),
        Terminal::Failed {
            error: error.clone(),
        },
        30,
    )
    .unwrap()
    .facts;
    let eligible = OutsideFacts {
        submission_validating: false,
        restart_eligible: true,
    };
    let display = display_with(&failed, eligible);
    assert_eq!(display.status, S::Failed);
    assert_eq!(display.controls, [C::Restart]);
    assert_eq!(display.reason, Some(DisplayReason::Error { error }));
    assert_eq!(shown(&failed).controls, []);
}

// ---- controls agree with the lifecycle rules ---------------------------------

#[derive(Clone, Debug)]
enum Op {
    Admit,
    Ready,
    Park(ParkReason),
    WaitInteraction,
    WaitCheckpoint,
    Pause,
    Resume,
    Cancel,
    Fail,
    Complete,
    Ambiguous,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Admit),
        Just(Op::Ready),
        proptest::sample::select(ALL_PARK_REASONS.to_vec()).prop_map(Op::Park),
        Just(Op::WaitInteraction),
        Just(Op::WaitCheckpoint),
        Just(Op::Pause),
        Just(Op::Resume),
        Just(Op::Cancel),
        Just(Op::Fail),
        Just(Op::Complete),
        Just(Op::Ambiguous),
    ]
}

fn apply(agg: &RunAggregate, op: &Op, now_ms: u64) -> Option<RunAggregate> {
    let generation = agg.run.lease.generation.0;
    let host = host_authority(generation);
    let result = match op {
        Op::Admit => run::admit(
            agg,
            fixtures::runner_epoch(generation + 1),
            fixtures::token(generation + 1),
            now_ms,
            TTL_MS,
        ),
        Op::Ready => {
            let mut tx = Tx::begin(agg, now_ms);
            run::mark_ready(&mut tx, &host, &fixtures::runner_epoch(generation), TTL_MS).map(|()| {
                let attempt = fixtures::active_attempt("work", "a-1-work", generation, now_ms);
                tx.agg.attempt = Some(attempt);
                tx.commit()
            })
        }
        Op::Park(reason) => run::park(agg, &host, *reason, now_ms),
        Op::WaitInteraction => {
            let mut tx = Tx::begin(agg, now_ms);
            run::wait_in(&mut tx, &host, NodeId::from("work"), false).map(|()| {
                if let Some(attempt) = tx.agg.attempt.as_mut() {
                    attempt.status = AttemptStatus::Waiting;
                }
                tx.agg.interaction = Some(interaction(InteractionKind::SubmittedOutput));
                tx.commit()
            })
        }
        Op::WaitCheckpoint => {
            let mut tx = Tx::begin(agg, now_ms);
            run::wait_in(&mut tx, &host, NodeId::from("gate"), true).map(|()| {
                tx.agg.attempt = None;
                tx.commit()
            })
        }
        Op::Pause => run::pause(agg, Some(&host), control_request(), now_ms, TTL_MS),
        Op::Resume => run::resume(agg, resume_ids(), now_ms),
        Op::Cancel => run::cancel(agg, Some(&host), control_request(), now_ms, TTL_MS),
        Op::Fail => run::finish(
            agg,
            Some(&host),
            Terminal::Failed {
                error: RunError {
                    class: FailureClass::NodeFailed,
                    reason: ReasonKind::NodeFailed,
                    node_id: None,
                },
            },
            now_ms,
        ),
        Op::Complete => run::finish(agg, Some(&host), Terminal::Completed, now_ms),
        Op::Ambiguous => {
            let mut next = agg.clone();
            next.effects = vec![effect(EffectState::Ambiguous)];
            return Some(next);
        }
    };
    result.ok().map(|transition| transition.facts.reload())
}

fn resume_ids() -> ResumeIds {
    ResumeIds {
        resumed_message_id: MessageId::from("m-resumed"),
        message_order: 9,
    }
}

/// Whether the lifecycle rules accept each control's command on this
/// aggregate, claims aside (the server presents its own live authority).
fn accepted_by_lifecycle(agg: &RunAggregate, now_ms: u64) -> [(Control, bool); 4] {
    let host = host_authority(agg.run.lease.generation.0);
    let pause = run::pause(agg, Some(&host), control_request(), now_ms, TTL_MS);
    let cancel = run::cancel(agg, Some(&host), control_request(), now_ms, TTL_MS);
    let restart = run::restart(
        run::RestartSource {
            run: &agg.run,
            terminal_fingerprint: Digest::repeat(0x55),
            chain: &[],
        },
        run::NewRun {
            run_id: RunId::from("run-r"),
            mode: run::ExecutionMode::Headless,
        },
        &[],
        now_ms,
    );
    [
        (C::Pause, pause.is_ok()),
        (C::Resume, run::resume(agg, resume_ids(), now_ms).is_ok()),
        (C::Cancel, cancel.is_ok()),
        (C::Restart, restart.is_ok()),
    ]
}

fn arb_facts() -> impl Strategy<Value = DisplayFacts> {
    let status = proptest::sample::select(vec![
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Waiting,
        RunStatus::Completed,
        RunStatus::Failed,
        RunStatus::TimedOut,
        RunStatus::Cancelled,
    ]);
    let queue = proptest::sample::select(vec![
        QueueStatus::Queued,
        QueueStatus::Starting,
        QueueStatus::Running,
        QueueStatus::Parked,
        QueueStatus::Done,
        QueueStatus::Failed,
        QueueStatus::Cancelled,
    ]);
    let park_reason = proptest::option::of(proptest::sample::select(ALL_PARK_REASONS.to_vec()));
    let request = proptest::sample::select(REQUESTS.to_vec());
    let runner = proptest::sample::select(RUNNERS.to_vec());
    let node = proptest::option::of(proptest::sample::select(vec!["a", "b"]));
    (
        (status, queue, park_reason, request, runner),
        proptest::array::uniform6(any::<bool>()),
        (node.clone(), node),
    )
        .prop_map(
            |((status, queue, park_reason, pending_request, runner), bits, (attempt, gate))| {
                DisplayFacts {
                    status,
                    queue,
                    paused: bits[0],
                    park_reason,
                    effect_ambiguous: bits[1],
                    pending_request,
                    runner,
                    model_turn_active: bits[2],
                    submission_validating: bits[3],
                    attempt_node: attempt.map(NodeId::from),
                    checkpoint_node: gate.map(NodeId::from),
                    error: bits[4].then_some(RunError {
                        class: FailureClass::WorkerCrashed,
                        reason: ReasonKind::WorkerCrashed,
                        node_id: None,
                    }),
                    restart_eligible: bits[5],
                }
            },
        )
}

proptest! {
    /// The reducer is total and deterministic over arbitrary facts, even ones
    /// no transition produces, and its controls are sorted and unique.
    #[test]
    fn reducer_is_total_and_deterministic(facts in arb_facts()) {
        let first = display(&facts);
        prop_assert_eq!(&first, &display(&facts.clone()));
        prop_assert!(first.controls.windows(2).all(|pair| pair[0] < pair[1]));
        prop_assert!(first.current_node.is_none() || first.waiting_on.is_none());
    }

    /// `paused` appears exactly when the durable pause flag is set on a
    /// nonterminal run without an ambiguous effect and no exact turn is still open.
    #[test]
    fn paused_iff_durable_pause(facts in arb_facts()) {
        let expected = facts.paused
            && !facts.status.is_terminal()
            && !facts.effect_ambiguous
            && !facts.model_turn_active;
        prop_assert_eq!(display(&facts).status == S::Paused, expected);
    }

    /// A terminal status never changes with runner, turn or validation activity.
    #[test]
    fn terminal_status_ignores_activity(
        facts in arb_facts(),
        runner in proptest::sample::select(RUNNERS.to_vec()),
        turn in any::<bool>(),
        validating in any::<bool>(),
    ) {
        prop_assume!(facts.status.is_terminal());
        let busy = DisplayFacts {
            runner,
            model_turn_active: turn,
            submission_validating: validating,
            ..facts.clone()
        };
        prop_assert_eq!(display(&facts).status, display(&busy).status);
        prop_assert_eq!(display(&facts).controls, display(&busy).controls);
    }

    /// On every reachable aggregate the lifecycle controls the display offers
    /// are exactly the commands `run` accepts (restart eligibility assumed).
    #[test]
    fn lifecycle_controls_agree_with_run_transitions(ops in proptest::collection::vec(op(), 1..25)) {
        let mut agg = fixtures::reserved_interactive(1, 0);
        let mut now_ms = 1;
        for op in ops {
            now_ms += 1;
            if let Some(next) = apply(&agg, &op, now_ms) {
                agg = next;
            }
            let eligible = OutsideFacts { submission_validating: false, restart_eligible: true };
            let shown = display_with(&agg, eligible);
            for (control, accepted) in accepted_by_lifecycle(&agg, now_ms + 1) {
                prop_assert_eq!(
                    shown.controls.contains(&control), accepted,
                    "{:?} on {:?}/{:?} paused={} park={:?}",
                    control, agg.run.status, agg.run.queue, agg.run.paused, agg.run.park_reason
                );
            }
        }
    }
}
