//! Builders for tests and models: realistic facts with short, readable ids.
//!
//! Only compiled for tests and for the `fixtures` feature (the model crate).

use crate::attempt::{AttemptRecord, AttemptStatus, NodeOutcome, StepRecord};
use crate::claim::{Authority, ClaimRequest, OwnerKind};
use crate::decision::{DecisionRecord, DecisionStatus};
use crate::execution;
use crate::ids::{
    AttemptId, DecisionId, Digest, Generation, InteractionId, MessageId, NodeId, OwnerId, RunId,
    RunnerEpochId, SessionId,
};
use crate::interaction::{self, InteractionKind, RequestProposal, Requested, SubmissionRecord};
use crate::output::Transition;
use crate::run::{self, ExecutionMode, Lineage, NewRun, RunAggregate};
use crate::runner::{self, ExitKind, RunnerExit};
use crate::session::{SessionFacts, SessionRun};
use crate::topology::{Edge, NodeSpec, NodeTimeout, NodeType, Topology};
use alloc::string::String;
use alloc::vec::Vec;
use serde_json::Value;

/// The claim lifetime used by fixtures.
pub const TTL_MS: u64 = 1_000;

/// A reserved headless run `run-<n>` at `now_ms`.
pub fn reserved(n: u32, now_ms: u64) -> RunAggregate {
    reserved_with(n, ExecutionMode::Headless, now_ms)
}

/// A reserved interactive run in session `s-1`.
pub fn reserved_interactive(n: u32, now_ms: u64) -> RunAggregate {
    let mode = ExecutionMode::Interactive {
        origin_session: SessionId::from("s-1"),
    };
    reserved_with(n, mode, now_ms)
}

fn reserved_with(n: u32, mode: ExecutionMode, now_ms: u64) -> RunAggregate {
    let new_run = NewRun {
        run_id: RunId::new(alloc::format!("run-{n}")),
        mode,
    };
    run::reserve(new_run, Lineage::default(), &[], now_ms)
        .expect("fresh reservation")
        .facts
}

/// The runner epoch id used for generation `g`.
pub fn runner_epoch(generation: u64) -> RunnerEpochId {
    RunnerEpochId::new(alloc::format!("re-{generation}"))
}

/// The token hash the shell would hold for generation `g`.
pub fn token(generation: u64) -> Digest {
    Digest::repeat(generation as u8)
}

/// The host authority the server holds for the runner of generation `g`.
pub fn host_authority(generation: u64) -> Authority {
    Authority {
        owner_kind: OwnerKind::Host,
        owner_id: OwnerId::new(runner_epoch(generation).as_str()),
        token_hash: token(generation),
        generation: Generation(generation),
    }
}

/// The control claim request the server uses for stale-path operations.
pub fn control_request() -> ClaimRequest {
    ClaimRequest {
        owner_kind: OwnerKind::Control,
        owner_id: OwnerId::from("control"),
        token_hash: Digest::repeat(0xcc),
    }
}

/// Admits `agg` with the next generation's runner epoch and token.
pub fn admitted(agg: &RunAggregate, now_ms: u64) -> Transition<RunAggregate> {
    let generation = agg.run.lease.generation.next().0;
    run::admit(
        agg,
        runner_epoch(generation),
        token(generation),
        now_ms,
        TTL_MS,
    )
    .expect("admissible")
}

/// The server reaps the process of `agg`'s recorded runner epoch: its exit
/// (`kind`) goes through [`runner::decide_exit`] with the host authority of
/// that runner's generation. On a run that no longer holds a claim (parked,
/// waiting, terminal) this only records the outcome, which makes a parked
/// run admissible again.
pub fn runner_exited(agg: &RunAggregate, kind: ExitKind, now_ms: u64) -> Transition<RunAggregate> {
    try_runner_exited(agg, kind, now_ms).expect("the exit is recorded")
}

/// [`runner_exited`], returning the kernel's rejection instead of panicking.
/// `agg` must have a recorded runner epoch.
pub fn try_runner_exited(
    agg: &RunAggregate,
    kind: ExitKind,
    now_ms: u64,
) -> Result<Transition<RunAggregate>, run::Rejection> {
    let runner = agg.run.runner.as_ref().expect("a recorded runner epoch");
    let exit = RunnerExit {
        runner_epoch: runner.runner_epoch.clone(),
        kind,
    };
    let host = host_authority(runner.generation.0);
    runner::decide_exit(agg, exit, Some(&host), control_request(), now_ms, TTL_MS)
}

/// An active attempt of `node` with visit 1 in generation `g`.
pub fn active_attempt(node: &str, attempt: &str, generation: u64, now_ms: u64) -> AttemptRecord {
    AttemptRecord {
        attempt_id: AttemptId::from(attempt),
        node_id: NodeId::from(node),
        visit: 1,
        generation: Generation(generation),
        status: AttemptStatus::Active,
        started_at_ms: now_ms,
        deadline_at_ms: None,
        finished_at_ms: None,
        crash_retries: 0,
    }
}

/// Marks the admitted runner of `agg` ready and dispatches an active attempt
/// `a-<generation>-<node>` of `node` (what `runner.ready` commits for a run
/// whose workflow starts at `node`). The attempt has visit 1.
///
/// A run that already has steps (a resumed run, a continuation) routes on to
/// `node` from its last step through a plain edge.
pub fn running(agg: &RunAggregate, node: &str, now_ms: u64) -> Transition<RunAggregate> {
    try_running(agg, node, now_ms).expect("ready")
}

/// [`running`], returning the kernel's rejection instead of panicking.
pub fn try_running(
    agg: &RunAggregate,
    node: &str,
    now_ms: u64,
) -> Result<Transition<RunAggregate>, run::Rejection> {
    let generation = agg.run.lease.generation.0;
    let attempt = AttemptId::new(alloc::format!("a-{generation}-{node}"));
    let mut topology = chain(&[node]);
    let route_from = agg.steps.last().map(|last| {
        if last.node_id.as_str() != node {
            topology
                .nodes
                .push(self::node(last.node_id.as_str(), NodeType::Compute));
        }
        topology.edges = alloc::vec![plain(last.node_id.as_str(), node)];
        result_record(
            last.attempt_id.as_str(),
            last.node_id.as_str(),
            last.outcome,
            Value::Null,
        )
    });
    let (transition, _) = execution::start_generation(
        agg,
        &topology,
        &host_authority(generation),
        &runner_epoch(generation),
        route_from.as_ref(),
        None,
        attempt,
        now_ms,
        TTL_MS,
    )?;
    Ok(transition)
}

/// Run `run-<n>` in `running/running` (generation 1) with an active attempt
/// of `node`: reserved at 0, admitted at 5, ready at `now_ms`.
pub fn live_run(n: u32, node: &str, now_ms: u64) -> RunAggregate {
    let agg = admitted(&reserved(n, 0), 5).facts;
    running(&agg, node, now_ms).facts
}

/// `agg` (live, generation `g`) after its active attempt finished `ok` as a
/// step and the run now waits on checkpoint `checkpoint` (`waiting/parked`,
/// no claim, no unfinished attempt).
pub fn waiting_at_checkpoint(agg: &RunAggregate, checkpoint: &str, now_ms: u64) -> RunAggregate {
    let generation = agg.run.lease.generation.0;
    let mut tx = run::Tx::begin(agg, now_ms);
    if let Some(attempt) = tx.agg.attempt.take() {
        tx.agg.steps.record(StepRecord {
            attempt_id: attempt.attempt_id,
            node_id: attempt.node_id,
            outcome: NodeOutcome::Ok,
            carried: false,
        });
    }
    let authority = host_authority(generation);
    run::wait_in(&mut tx, &authority, NodeId::from(checkpoint), true).expect("wait");
    tx.commit().facts.reload()
}

/// A pending protected decision `d-1` on the checkpoint `agg` waits on.
pub fn pending_decision(
    agg: &RunAggregate,
    deadline_at_ms: Option<u64>,
    default_answer_digest: Option<Digest>,
) -> DecisionRecord {
    DecisionRecord {
        decision_id: DecisionId::from("d-1"),
        run_id: agg.run.run_id.clone(),
        node_id: agg.run.waiting_on.clone().expect("a checkpoint wait"),
        request_digest: Digest::repeat(0xd1),
        status: DecisionStatus::Pending,
        deadline_at_ms,
        default_answer_digest,
        continuation_run_id: None,
    }
}

/// The runner's `interaction.requested` proposal for the active attempt of
/// `run-<n>`: request `i-<n>`, initial step message `m-<n>` with order 1, no
/// deadline.
pub fn request_proposal(agg: &RunAggregate, kind: InteractionKind) -> RequestProposal {
    let attempt = agg.attempt.as_ref().expect("an active attempt");
    let n = agg.run.run_id.as_str().trim_start_matches("run-");
    RequestProposal {
        interaction_id: InteractionId::new(alloc::format!("i-{n}")),
        attempt_id: attempt.attempt_id.clone(),
        kind,
        contract_hash: Digest::repeat(0x5c),
        deadline_at_ms: None,
        message_id: MessageId::new(alloc::format!("m-{n}")),
        message_order: 1,
    }
}

/// An interactive run `run-<n>` in session `s-1` whose node `ask` runs in
/// generation 1 (admitted at t=5, ready at t=10).
pub fn interactive_running(n: u32) -> RunAggregate {
    let agg = admitted(&reserved_interactive(n, 0), 5).facts;
    running(&agg, "ask", 10).facts
}

/// [`interactive_running`] after its runner requested `kind` at t=20: the run
/// waits on pending request `i-<n>` with one pending initial step `m-<n>`.
pub fn waiting_on_request(n: u32, kind: InteractionKind) -> RunAggregate {
    let agg = interactive_running(n);
    let proposal = request_proposal(&agg, kind);
    let requested = interaction::request(
        &agg,
        &host_authority(1),
        &runner_epoch(1),
        proposal,
        20,
        TTL_MS,
    );
    match requested.expect("a fresh request") {
        Requested::Created(transition) => transition.facts.reload(),
        Requested::Adopted(_) => panic!("a fresh request is never adopted"),
    }
}

/// The session facts of the origin session of `agg`, as the shell would load
/// them: the run's pending messages and open turns, and the run itself.
pub fn session_of(agg: &RunAggregate, submissions: &[SubmissionRecord]) -> SessionFacts {
    let session_id = agg
        .run
        .mode
        .origin_session()
        .cloned()
        .expect("an interactive run");
    let next_message_order =
        crate::session::next_message_order(agg.messages.iter().map(|m| m.order).max());
    SessionFacts {
        session_id,
        messages: agg.messages.clone(),
        turns: agg.turns.clone(),
        runs: alloc::vec![SessionRun {
            run_id: agg.run.run_id.clone(),
            status: agg.run.status,
            paused: agg.run.paused,
            interaction: agg.interaction.clone(),
            submissions: submissions.to_vec(),
            decision: agg.decision.clone(),
        }],
        next_message_order,
    }
}

/// A root node of `node_type` with the engine's default timeout.
pub fn node(id: &str, node_type: NodeType) -> NodeSpec {
    NodeSpec {
        id: NodeId::from(id),
        node_type,
        timeout: NodeTimeout::EngineDefault,
        mount_path: Vec::new(),
        include_transition: None,
        human_decision: false,
    }
}

/// A plain edge `from → to`.
pub fn plain(from: &str, to: &str) -> Edge {
    Edge::Plain {
        from: NodeId::from(from),
        to: NodeId::from(to),
    }
}

/// A switch edge from `from` on path `on` with `(case, target)` pairs.
pub fn switch(from: &str, on: &str, cases: &[(&str, &str)]) -> Edge {
    Edge::Switch {
        from: NodeId::from(from),
        on: String::from(on),
        cases: cases
            .iter()
            .map(|(case, to)| (String::from(*case), NodeId::from(*to)))
            .collect(),
    }
}

/// Compute nodes `ids[0] → ids[1] → …` joined by plain edges, starting at the
/// first, with the default step limit.
pub fn chain(ids: &[&str]) -> Topology {
    Topology {
        start_at: NodeId::from(ids[0]),
        max_steps: None,
        nodes: ids.iter().map(|id| node(id, NodeType::Compute)).collect(),
        edges: ids.windows(2).map(|pair| plain(pair[0], pair[1])).collect(),
        mounts: Vec::new(),
    }
}

/// The result record of one finished attempt, as the shell builds it.
pub fn result_record(attempt: &str, node: &str, outcome: NodeOutcome, output: Value) -> Value {
    let mut record = serde_json::json!({
        "attemptId": attempt,
        "nodeId": node,
        "nodeType": "compute",
        "outcome": outcome.as_str(),
        "startedAt": 0,
        "finishedAt": 1,
        "durationMs": 1,
    });
    if outcome == NodeOutcome::Ok {
        record["output"] = output;
    } else {
        record["error"] = serde_json::json!({ "message": "node failed" });
    }
    record
}
