//! Builders for tests and models: realistic facts with short, readable ids.
//!
//! Only compiled for tests and for the `fixtures` feature (the model crate).

use crate::attempt::{AttemptRecord, AttemptStatus, NodeOutcome};
use crate::claim::{Authority, ClaimRequest, OwnerKind};
use crate::execution;
use crate::ids::{AttemptId, Digest, Generation, NodeId, OwnerId, RunId, RunnerEpochId, SessionId};
use crate::output::Transition;
use crate::run::{self, ExecutionMode, Lineage, NewRun, RunAggregate};
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
pub fn running(agg: &RunAggregate, node: &str, now_ms: u64) -> Transition<RunAggregate> {
    let generation = agg.run.lease.generation.0;
    let attempt = AttemptId::new(alloc::format!("a-{generation}-{node}"));
    let (transition, _) = execution::start_generation(
        agg,
        &chain(&[node]),
        &host_authority(generation),
        &runner_epoch(generation),
        None,
        attempt,
        now_ms,
        TTL_MS,
    )
    .expect("ready");
    transition
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
