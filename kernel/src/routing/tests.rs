use super::*;
use crate::attempt::StepRecord;
use crate::fixtures::{chain, node, plain, result_record, switch};
use crate::ids::AttemptId;
use crate::topology::{IncludeTransition, Mount, NodeSpec};
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;
use serde_json::json;

/// `check_step_limit` after the summary of `steps`.
fn limit_after(
    topology: &Topology,
    steps: &[StepRecord],
    next: &NodeId,
) -> Result<(), RouteFailure> {
    check_step_limit(topology, &StepSummary::of(topology, steps), next)
}

/// The real steps of `steps`, as the summary counts them.
fn executed_steps(topology: &Topology, steps: &[StepRecord]) -> usize {
    StepSummary::of(topology, steps).real as usize
}

fn id(text: &str) -> NodeId {
    NodeId::from(text)
}

fn ok(output: Value) -> Value {
    result_record("a-1", "n", NodeOutcome::Ok, output)
}

fn not_ok(outcome: NodeOutcome) -> Value {
    result_record("a-1", "n", outcome, Value::Null)
}

fn step(node_id: &str) -> StepRecord {
    StepRecord {
        attempt_id: AttemptId::new(alloc::format!("a-{node_id}")),
        node_id: id(node_id),
        outcome: NodeOutcome::Ok,
        carried: false,
    }
}

/// `a → decide` where `decide` switches on `on` to `x` or `y`.
fn switching(on: &str) -> Topology {
    let mut topology = chain(&["a", "decide", "x", "y"]);
    topology.edges = vec![
        plain("a", "decide"),
        switch(
            "decide",
            on,
            &[("left", "x"), ("true", "y"), ("2", "x"), ("1.5", "y")],
        ),
    ];
    topology
}

fn route_decide(on: &str, outcome: NodeOutcome, record: &Value) -> Route {
    route(&switching(on), &id("decide"), outcome, record)
}

// ---- route -----------------------------------------------------------------

#[test]
fn a_plain_edge_routes_to_its_target() {
    let topology = chain(&["a", "b"]);
    assert_eq!(
        route(&topology, &id("a"), NodeOutcome::Ok, &ok(json!({}))),
        Route::Next(id("b"))
    );
}

#[test]
fn a_node_without_an_outgoing_edge_completes_the_run() {
    let topology = chain(&["a", "b"]);
    assert_eq!(
        route(&topology, &id("b"), NodeOutcome::Ok, &ok(json!({}))),
        Route::Complete
    );
}

#[test]
fn an_ok_checkpoint_waits_even_with_an_outgoing_edge() {
    let mut topology = chain(&["gate", "after"]);
    topology.nodes[0] = node("gate", NodeType::Checkpoint);
    assert_eq!(
        route(&topology, &id("gate"), NodeOutcome::Ok, &ok(json!({}))),
        Route::Wait {
            checkpoint: id("gate")
        }
    );
}

#[test]
fn a_continuation_follows_the_checkpoint_edge_or_completes() {
    let mut topology = chain(&["gate", "after"]);
    topology.nodes[0] = node("gate", NodeType::Checkpoint);
    assert_eq!(
        route_from_checkpoint(&topology, &id("gate"), &ok(json!({}))),
        Route::Next(id("after"))
    );
    let mut terminal = chain(&["a", "gate"]);
    terminal.nodes[1] = node("gate", NodeType::Checkpoint);
    assert_eq!(
        route_from_checkpoint(&terminal, &id("gate"), &ok(json!({}))),
        Route::Complete
    );
    let mut decided = chain(&["gate", "x", "y"]);
    decided.edges = vec![switch(
        "gate",
        "$.choice",
        &[("approve", "x"), ("reject", "y")],
    )];
    assert_eq!(
        route_from_checkpoint(&decided, &id("gate"), &ok(json!({"choice": "reject"}))),
        Route::Next(id("y"))
    );
    assert_eq!(
        route_from_checkpoint(&decided, &id("ghost"), &ok(json!({}))),
        Route::Fail(RouteFailure::Routing {
            error: RoutingError::UnknownNode
        })
    );
}

#[test]
fn a_switch_picks_the_case_of_a_stringified_scalar() {
    let cases = [
        ("$.route", json!({"route": "left"}), "x"),
        ("$output.route", json!({"route": "left"}), "x"),
        ("$.flag", json!({"flag": true}), "y"),
        ("$.count", json!({"count": 2}), "x"),
        ("$.count", json!({"count": 2.0}), "x"),
        ("$.ratio", json!({"ratio": 1.5}), "y"),
        ("$.deep.route", json!({"deep": {"route": "left"}}), "x"),
    ];
    for (on, output, target) in cases {
        assert_eq!(
            route_decide(on, NodeOutcome::Ok, &ok(output.clone())),
            Route::Next(id(target)),
            "{on} on {output}"
        );
    }
}

#[test]
fn result_paths_read_the_record_itself() {
    let mut record = ok(json!({}));
    record["label"] = json!("left");
    assert_eq!(
        route_decide("$result.label", NodeOutcome::Ok, &record),
        Route::Next(id("x"))
    );
}

#[test]
fn an_unknown_case_is_a_routing_failure() {
    assert_eq!(
        route_decide("$.route", NodeOutcome::Ok, &ok(json!({"route": "right"}))),
        Route::Fail(RouteFailure::Routing {
            error: RoutingError::UnknownCase
        })
    );
}

#[test]
fn a_missing_value_is_a_routing_failure() {
    for record in [ok(json!({})), ok(json!("text")), not_ok(NodeOutcome::Ok)] {
        assert_eq!(
            route_decide("$.route", NodeOutcome::Ok, &record),
            Route::Fail(RouteFailure::Routing {
                error: RoutingError::MissingValue
            })
        );
    }
}

#[test]
fn a_non_scalar_value_is_a_routing_failure() {
    for value in [json!(null), json!(["left"]), json!({"left": true})] {
        assert_eq!(
            route_decide("$.route", NodeOutcome::Ok, &ok(json!({ "route": value }))),
            Route::Fail(RouteFailure::Routing {
                error: RoutingError::NonScalar
            })
        );
    }
}

#[test]
fn an_invalid_path_in_an_unvalidated_topology_is_a_routing_failure() {
    assert_eq!(
        route_decide("route", NodeOutcome::Ok, &ok(json!({"route": "left"}))),
        Route::Fail(RouteFailure::Routing {
            error: RoutingError::BadPath
        })
    );
}

#[test]
fn an_unknown_node_is_a_routing_failure() {
    assert_eq!(
        route(
            &chain(&["a"]),
            &id("ghost"),
            NodeOutcome::Ok,
            &ok(json!({}))
        ),
        Route::Fail(RouteFailure::Routing {
            error: RoutingError::UnknownNode
        })
    );
}

#[test]
fn a_failed_node_continues_only_through_a_matching_result_case() {
    let mut topology = chain(&["a", "fix", "done"]);
    topology.edges = vec![
        switch("a", "$result.outcome", &[("ok", "done"), ("failed", "fix")]),
        plain("fix", "done"),
    ];
    let record = not_ok(NodeOutcome::Failed);
    assert_eq!(
        route(&topology, &id("a"), NodeOutcome::Failed, &record),
        Route::Next(id("fix"))
    );
    let timed_out = not_ok(NodeOutcome::TimedOut);
    assert_eq!(
        route(&topology, &id("a"), NodeOutcome::TimedOut, &timed_out),
        Route::TimedOut,
        "no timed_out case: the run times out"
    );
}

#[test]
fn a_failed_node_without_a_result_switch_fails_the_run() {
    let record = not_ok(NodeOutcome::Failed);
    assert_eq!(
        route(&chain(&["a", "b"]), &id("a"), NodeOutcome::Failed, &record),
        Route::Fail(RouteFailure::NodeFailed)
    );
    assert_eq!(
        route(&chain(&["a"]), &id("a"), NodeOutcome::Failed, &record),
        Route::Fail(RouteFailure::NodeFailed),
        "a terminal node that failed does not complete the run"
    );
    // An output switch is never followed after a failure, even if it matches.
    let mut record = not_ok(NodeOutcome::Failed);
    record["output"] = json!({"route": "left"});
    assert_eq!(
        route_decide("$.route", NodeOutcome::Failed, &record),
        Route::Fail(RouteFailure::NodeFailed)
    );
}

#[test]
fn a_timed_out_node_without_a_recovery_edge_times_the_run_out() {
    assert_eq!(
        route(
            &chain(&["a", "b"]),
            &id("a"),
            NodeOutcome::TimedOut,
            &not_ok(NodeOutcome::TimedOut)
        ),
        Route::TimedOut
    );
}

#[test]
fn cancelled_is_never_routed() {
    let mut topology = chain(&["a", "b"]);
    topology.edges = vec![switch("a", "$result.outcome", &[("cancelled", "b")])];
    assert_eq!(
        route(
            &topology,
            &id("a"),
            NodeOutcome::Cancelled,
            &not_ok(NodeOutcome::Cancelled)
        ),
        Route::Cancelled
    );
}

// ---- step limits -----------------------------------------------------------

#[test]
fn the_root_limit_counts_every_real_step_including_carried_ones() {
    let mut topology = chain(&["a", "b"]);
    topology.max_steps = Some(3);
    let mut steps = vec![step("a"), step("b")];
    steps[0].carried = true;
    assert_eq!(limit_after(&topology, &steps, &id("a")), Ok(()));
    steps.push(step("a"));
    assert_eq!(
        limit_after(&topology, &steps, &id("b")),
        Err(RouteFailure::MaxSteps { limit: 3 })
    );
}

#[test]
fn the_default_root_limit_is_one_hundred() {
    let topology = chain(&["a"]);
    let steps: Vec<StepRecord> = (0..99).map(|_| step("a")).collect();
    assert_eq!(limit_after(&topology, &steps, &id("a")), Ok(()));
    let steps: Vec<StepRecord> = (0..100).map(|_| step("a")).collect();
    assert_eq!(
        limit_after(&topology, &steps, &id("a")),
        Err(RouteFailure::MaxSteps { limit: 100 })
    );
}

/// `a → m → m/work ⟲ (switch) → m/__piw_exit_ok → a` (a loop through an include).
fn looping_include(mount_limit: Option<u32>, root_limit: u32) -> Topology {
    let in_mount = |node_id: &str, transition| NodeSpec {
        mount_path: vec![String::from("m")],
        include_transition: transition,
        ..node(node_id, NodeType::Compute)
    };
    Topology {
        start_at: id("a"),
        max_steps: Some(root_limit),
        nodes: vec![
            node("a", NodeType::Compute),
            in_mount("m", Some(IncludeTransition::Entry)),
            in_mount("m/work", None),
            in_mount("m/__piw_exit_ok", Some(IncludeTransition::Exit)),
        ],
        edges: vec![
            plain("a", "m"),
            plain("m", "m/work"),
            switch(
                "m/work",
                "$.again",
                &[("true", "m/work"), ("false", "m/__piw_exit_ok")],
            ),
            plain("m/__piw_exit_ok", "a"),
        ],
        mounts: vec![Mount {
            mount_path: vec![String::from("m")],
            entry: id("m"),
            max_steps: mount_limit,
        }],
    }
}

#[test]
fn include_transitions_do_not_count_as_steps() {
    let topology = looping_include(None, 2);
    let steps = vec![step("a"), step("m")];
    assert_eq!(executed_steps(&topology, &steps), 1);
    assert_eq!(limit_after(&topology, &steps, &id("m/work")), Ok(()));
    let steps = vec![step("a"), step("m"), step("m/work")];
    assert_eq!(
        limit_after(&topology, &steps, &id("m/__piw_exit_ok")),
        Ok(()),
        "an exit transition is not a step"
    );
}

#[test]
fn a_mount_limit_bounds_one_invocation_since_its_latest_entry() {
    let topology = looping_include(Some(2), 100);
    let first = vec![step("a"), step("m"), step("m/work"), step("m/work")];
    assert_eq!(
        limit_after(&topology, &first, &id("m/work")),
        Err(RouteFailure::MaxSteps { limit: 2 })
    );
    assert_eq!(
        limit_after(&topology, &first, &id("m/__piw_exit_ok")),
        Ok(())
    );
    let mut again = first.clone();
    again.extend([step("m/__piw_exit_ok"), step("a")]);
    assert_eq!(
        limit_after(&topology, &again, &id("m")),
        Ok(()),
        "entering the mount again starts a new invocation"
    );
    again.push(step("m"));
    assert_eq!(limit_after(&topology, &again, &id("m/work")), Ok(()));
}

#[test]
fn an_unknown_next_node_is_a_routing_failure() {
    assert_eq!(
        limit_after(&chain(&["a"]), &[], &id("ghost")),
        Err(RouteFailure::Routing {
            error: RoutingError::UnknownNode
        })
    );
}

// ---- properties ------------------------------------------------------------

/// Drives a whole run through `route` and `check_step_limit` with random
/// outputs and outcomes, the way execution does.
fn drive(topology: &Topology, choices: &[(u8, bool)]) -> (Vec<StepRecord>, Route) {
    let mut steps = Vec::new();
    let mut current = topology.start_at.clone();
    for (index, (choice, again)) in choices.iter().enumerate() {
        let outcome = match choice % 5 {
            0 => NodeOutcome::Failed,
            1 => NodeOutcome::TimedOut,
            _ => NodeOutcome::Ok,
        };
        let attempt = alloc::format!("a-{index}");
        let output = json!({"again": again, "route": alloc::format!("c{}", choice % 3)});
        let record = result_record(&attempt, current.as_str(), outcome, output);
        steps.push(StepRecord {
            attempt_id: AttemptId::new(attempt),
            node_id: current.clone(),
            outcome,
            carried: false,
        });
        match route(topology, &current, outcome, &record) {
            Route::Next(next) => match limit_after(topology, &steps, &next) {
                Ok(()) => current = next,
                Err(failure) => return (steps, Route::Fail(failure)),
            },
            other => return (steps, other),
        }
    }
    (steps, Route::Next(current))
}

/// A random looping graph over `n0..n4` with switch edges on `$.route`.
fn looping_graph() -> impl Strategy<Value = Topology> {
    (
        proptest::collection::vec(proptest::collection::vec(0usize..5, 1..4), 5),
        1u32..12,
    )
        .prop_map(|(targets, limit)| {
            let name = |i: usize| alloc::format!("n{i}");
            let edges = targets
                .iter()
                .enumerate()
                .map(|(from, to)| {
                    let cases: Vec<(String, String)> = to
                        .iter()
                        .enumerate()
                        .map(|(case, to)| (alloc::format!("c{case}"), name(*to)))
                        .collect();
                    let cases: Vec<(&str, &str)> = cases
                        .iter()
                        .map(|(c, t)| (c.as_str(), t.as_str()))
                        .collect();
                    switch(&name(from), "$.route", &cases)
                })
                .collect();
            Topology {
                start_at: id("n0"),
                max_steps: Some(limit),
                nodes: (0..5).map(|i| node(&name(i), NodeType::Compute)).collect(),
                edges,
                mounts: Vec::new(),
            }
        })
}

proptest! {
    /// However the outputs steer a looping graph, a run never takes more real
    /// steps than `maxSteps`: it fails with `MaxSteps` first.
    #[test]
    fn routing_never_exceeds_max_steps(
        topology in looping_graph(),
        choices in proptest::collection::vec((any::<u8>(), any::<bool>()), 1..40),
    ) {
        let (steps, last) = drive(&topology, &choices);
        let limit = topology.root_max_steps() as usize;
        prop_assert!(executed_steps(&topology, &steps) <= limit);
        if let Route::Fail(RouteFailure::MaxSteps { limit: reported }) = last {
            prop_assert_eq!(reported as usize, limit);
            prop_assert_eq!(executed_steps(&topology, &steps), limit,
                "only a step beyond the limit fails the run");
        }
    }

    /// Inside an include loop, no invocation takes more real steps than the
    /// mount's `maxSteps`, and the whole run stays within the root limit.
    #[test]
    fn include_invocations_stay_within_their_mount_limit(
        mount_limit in 1u32..5,
        root_limit in 1u32..30,
        choices in proptest::collection::vec((2u8..5, any::<bool>()), 1..60),
    ) {
        let topology = looping_include(Some(mount_limit), root_limit);
        let (steps, _) = drive(&topology, &choices);
        prop_assert!(executed_steps(&topology, &steps) <= root_limit as usize);
        for invocation in steps.split(|step| step.node_id == id("m")) {
            let inside = invocation.iter().filter(|step| step.node_id == id("m/work")).count();
            prop_assert!(inside <= mount_limit as usize);
        }
    }

    /// A cancelled node is never routed, whatever its edge and record.
    #[test]
    fn cancelled_always_cancels(topology in looping_graph(), node_index in 0usize..5) {
        let node_id = NodeId::new(alloc::format!("n{node_index}"));
        let record = result_record("a", node_id.as_str(), NodeOutcome::Cancelled, Value::Null);
        prop_assert_eq!(route(&topology, &node_id, NodeOutcome::Cancelled, &record), Route::Cancelled);
    }

    /// Without a `$result.` switch, a failed or timed-out node never continues.
    #[test]
    fn failures_continue_only_through_result_switches(
        topology in looping_graph(),
        node_index in 0usize..5,
        timed_out in any::<bool>(),
        route_case in 0u8..3,
    ) {
        let node_id = NodeId::new(alloc::format!("n{node_index}"));
        let outcome = if timed_out { NodeOutcome::TimedOut } else { NodeOutcome::Failed };
        let mut record = result_record("a", node_id.as_str(), outcome, Value::Null);
        record["output"] = json!({"route": alloc::format!("c{route_case}")});
        let expected = if timed_out { Route::TimedOut } else { Route::Fail(RouteFailure::NodeFailed) };
        prop_assert_eq!(route(&topology, &node_id, outcome, &record), expected);
    }
}
