use super::*;
use crate::attempt::NodeOutcome;
use crate::fixtures::{node, plain, switch};
use crate::ids::AttemptId;
use crate::routing::{self, RouteFailure, RoutingError};
use crate::topology::{IncludeTransition, Mount, NodeSpec, NodeType};
use alloc::string::String;
use alloc::vec;
use proptest::prelude::*;

// ---- the list-based reference: the decisions as they were read from the
// whole list of steps -------------------------------------------------------

fn is_real_step(topology: &Topology, node_id: &NodeId) -> bool {
    topology
        .node(node_id)
        .is_none_or(|node| node.counts_as_step())
}

fn executed_steps(topology: &Topology, steps: &[StepRecord]) -> usize {
    steps
        .iter()
        .filter(|step| is_real_step(topology, &step.node_id))
        .count()
}

fn list_step_limit(
    topology: &Topology,
    steps: &[StepRecord],
    next: &NodeId,
) -> Result<(), RouteFailure> {
    let Some(next_node) = topology.node(next) else {
        return Err(RouteFailure::Routing {
            error: RoutingError::UnknownNode,
        });
    };
    let new = usize::from(next_node.counts_as_step());
    let limit = topology.root_max_steps();
    if executed_steps(topology, steps) + new > limit as usize {
        return Err(RouteFailure::MaxSteps { limit });
    }
    for depth in 1..=next_node.mount_path.len() {
        let Some(mount) = topology.mount(&next_node.mount_path[..depth]) else {
            continue;
        };
        let Some(limit) = mount.max_steps.filter(|_| mount.entry != *next) else {
            continue;
        };
        let since_entry = steps
            .iter()
            .rposition(|step| step.node_id == mount.entry)
            .map_or(steps, |entry| &steps[entry + 1..]);
        if executed_steps(topology, since_entry) + new > limit as usize {
            return Err(RouteFailure::MaxSteps { limit });
        }
    }
    Ok(())
}

fn list_next_visit(steps: &[StepRecord], node_id: &NodeId) -> u32 {
    let earlier = steps.iter().filter(|step| &step.node_id == node_id).count();
    u32::try_from(earlier).map_or(u32::MAX, |earlier| earlier.saturating_add(1))
}

// ---- fixtures --------------------------------------------------------------

fn id(text: &str) -> NodeId {
    NodeId::from(text)
}

fn step(index: usize, node_id: &NodeId, carried: bool) -> StepRecord {
    StepRecord {
        attempt_id: AttemptId::new(alloc::format!("a-{index}")),
        node_id: node_id.clone(),
        outcome: NodeOutcome::Ok,
        carried,
    }
}

/// `a → m (mount, entry) → m/work ⟲ → m/n (nested mount) → m/n/inner ⟲ →
/// m/n/__piw_exit_ok → m/__piw_exit_ok → b`, with the given limits.
fn nested_includes(root: u32, outer: Option<u32>, inner: Option<u32>) -> Topology {
    let inside = |node_id: &str, path: &[&str], transition| NodeSpec {
        mount_path: path.iter().map(|segment| String::from(*segment)).collect(),
        include_transition: transition,
        ..node(node_id, NodeType::Compute)
    };
    Topology {
        start_at: id("a"),
        max_steps: Some(root),
        nodes: vec![
            node("a", NodeType::Compute),
            inside("m", &["m"], Some(IncludeTransition::Entry)),
            inside("m/work", &["m"], None),
            inside("m/n", &["m", "n"], Some(IncludeTransition::Entry)),
            inside("m/n/inner", &["m", "n"], None),
            inside(
                "m/n/__piw_exit_ok",
                &["m", "n"],
                Some(IncludeTransition::Exit),
            ),
            inside("m/__piw_exit_ok", &["m"], Some(IncludeTransition::Exit)),
            node("b", NodeType::Compute),
        ],
        edges: vec![
            plain("a", "m"),
            plain("m", "m/work"),
            switch(
                "m/work",
                "$.route",
                &[
                    ("again", "m/work"),
                    ("in", "m/n"),
                    ("out", "m/__piw_exit_ok"),
                ],
            ),
            plain("m/n", "m/n/inner"),
            switch(
                "m/n/inner",
                "$.route",
                &[("again", "m/n/inner"), ("out", "m/n/__piw_exit_ok")],
            ),
            plain("m/n/__piw_exit_ok", "m/work"),
            plain("m/__piw_exit_ok", "b"),
            plain("b", "a"),
        ],
        mounts: vec![
            Mount {
                mount_path: vec![String::from("m")],
                entry: id("m"),
                max_steps: outer,
            },
            Mount {
                mount_path: vec![String::from("m"), String::from("n")],
                entry: id("m/n"),
                max_steps: inner,
            },
        ],
    }
}

/// What the shell loads: the summary with the visits of exactly the nodes
/// [`StepSummary::nodes_to_load`] names (the latest step and no attempt).
fn as_loaded(topology: &Topology, steps: &[StepRecord]) -> StepSummary {
    let mut summary = StepSummary::of(topology, steps);
    let keep: BTreeSet<NodeId> =
        StepSummary::nodes_to_load(topology, summary.last().map(|last| &last.node_id), None)
            .into_iter()
            .cloned()
            .collect();
    summary.visits.retain(|node_id, _| keep.contains(node_id));
    summary
}

fn history() -> impl Strategy<Value = (Topology, Vec<StepRecord>)> {
    let limits = (
        1u32..40,
        proptest::option::of(1u32..8),
        proptest::option::of(1u32..5),
    );
    (limits, 0usize..60, 0usize..10, any::<u64>()).prop_map(
        |((root, outer, inner), length, carried, seed)| {
            let topology = nested_includes(root, outer, inner);
            // Node ids drawn from the topology and one it does not know.
            let mut ids: Vec<NodeId> = topology.nodes.iter().map(|node| node.id.clone()).collect();
            ids.push(id("ghost"));
            let mut state = seed;
            let steps = (0..length)
                .map(|index| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let pick = (state >> 33) as usize % ids.len();
                    step(index, &ids[pick], index < carried)
                })
                .collect();
            (topology, steps)
        },
    )
}

// ---- properties ------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Every decision read from the loaded summary equals the one read from
    /// the whole list: the route's origin, own steps, the next visit of
    /// every node a route may reach, the real steps and the step limit for
    /// every node of the topology (and an unknown one).
    #[test]
    fn summary_decisions_equal_list_decisions((topology, steps) in history()) {
        let summary = as_loaded(&topology, &steps);
        prop_assert_eq!(summary.last(), steps.last());
        prop_assert_eq!(summary.count as usize, steps.len());
        prop_assert_eq!(summary.has_own_steps(), steps.iter().any(|step| !step.carried));
        prop_assert_eq!(summary.real as usize, executed_steps(&topology, &steps));
        let last = steps.last().map(|step| &step.node_id);
        for next in StepSummary::needed_nodes(&topology, last, None) {
            prop_assert_eq!(summary.next_visit(next), list_next_visit(&steps, next));
        }
        let mut candidates: Vec<NodeId> =
            topology.nodes.iter().map(|node| node.id.clone()).collect();
        candidates.push(id("ghost"));
        for next in &candidates {
            prop_assert_eq!(
                routing::check_step_limit(&topology, &summary, next),
                list_step_limit(&topology, &steps, next),
                "next {:?}", next
            );
        }
    }

    /// Recording a step into a loaded summary (what a transition does
    /// before it routes from the finished attempt) gives the summary of the
    /// longer list, for the nodes the attempt may route to.
    #[test]
    fn recording_into_a_loaded_summary_equals_the_longer_list(
        (topology, mut steps) in history(),
        pick in 0usize..8,
    ) {
        let attempt_node = topology.nodes[pick % topology.nodes.len()].id.clone();
        let last = steps.last().map(|step| step.node_id.clone());
        let mut summary = StepSummary::of(&topology, &steps);
        let keep: BTreeSet<NodeId> = StepSummary::needed_nodes(&topology, last.as_ref(), Some(&attempt_node))
            .into_iter()
            .chain(StepSummary::transitions_of(&topology))
            .cloned()
            .collect();
        summary.visits.retain(|node_id, _| keep.contains(node_id));
        let finished = step(steps.len(), &attempt_node, false);
        summary.record(finished.clone());
        steps.push(finished);
        prop_assert_eq!(summary.real as usize, executed_steps(&topology, &steps));
        for next in StepSummary::needed_nodes(&topology, Some(&attempt_node), None) {
            prop_assert_eq!(summary.next_visit(next), list_next_visit(&steps, next));
            prop_assert_eq!(
                routing::check_step_limit(&topology, &summary, next),
                list_step_limit(&topology, &steps, next)
            );
        }
    }
}

#[test]
fn a_continuation_carries_the_summary_and_has_no_own_step() {
    let topology = nested_includes(10, Some(3), None);
    let steps = vec![step(0, &id("a"), false), step(1, &id("m"), false)];
    let carried = StepSummary::of(&topology, &steps).carried();
    assert!(!carried.has_own_steps());
    assert_eq!(carried.count, 2);
    assert_eq!(carried.real, 1, "the entry transition is not a real step");
    assert_eq!(carried.since_entry.get(&id("m")), Some(&Some(0)));
    assert_eq!(
        carried.since_entry.get(&id("m/n")),
        None,
        "a mount without maxSteps is not watched"
    );
}

#[test]
fn watching_after_a_step_changes_nothing() {
    let topology = nested_includes(10, Some(3), None);
    let mut summary = StepSummary::default();
    summary.record(step(0, &id("m"), false));
    summary.watch(&topology);
    assert!(summary.transitions.is_empty() && summary.since_entry.is_empty());
    assert_eq!(summary.real, 1, "recorded before the topology was known");
}
