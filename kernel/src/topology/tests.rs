use super::*;
use crate::fixtures::{chain, node, plain, switch};
use alloc::vec;
use proptest::prelude::*;
use serde_json::{Value, json};

/// The contract example from the protocol notes (shape only: `b` is not a node).
fn contract_example() -> Value {
    json!({"startAt":"a","maxSteps":100,
     "nodes":[{"id":"a","nodeType":"agent","timeout":{"kind":"default"},"mountPath":[]},
              {"id":"m","nodeType":"compute","timeout":{"kind":"ms","ms":5000},"mountPath":["m"],"includeTransition":"entry"},
              {"id":"m/__piw_exit_ok","nodeType":"compute","timeout":{"kind":"none"},"mountPath":["m"],"includeTransition":"exit"},
              {"id":"g","nodeType":"checkpoint","timeout":{"kind":"dynamic"},"mountPath":[],"humanDecision":true}],
     "edges":[{"kind":"plain","from":"a","to":"m"},{"kind":"switch","from":"b","on":"$.route","cases":{"x":"c","y":"d"}}],
     "mounts":[{"mountPath":["m"],"entry":"m","maxSteps":10}]})
}

/// `a → m (include entry) → m/work → m/__piw_exit_ok → g (human decision)`.
fn included() -> Topology {
    let in_mount = |id: &str, transition| NodeSpec {
        mount_path: vec![String::from("m")],
        include_transition: transition,
        ..node(id, NodeType::Compute)
    };
    let mut gate = node("g", NodeType::Checkpoint);
    gate.human_decision = true;
    Topology {
        start_at: NodeId::from("a"),
        max_steps: Some(20),
        nodes: vec![
            node("a", NodeType::Agent),
            in_mount("m", Some(IncludeTransition::Entry)),
            in_mount("m/work", None),
            in_mount("m/__piw_exit_ok", Some(IncludeTransition::Exit)),
            gate,
        ],
        edges: vec![
            plain("a", "m"),
            plain("m", "m/work"),
            plain("m/work", "m/__piw_exit_ok"),
            plain("m/__piw_exit_ok", "g"),
        ],
        mounts: vec![Mount {
            mount_path: vec![String::from("m")],
            entry: NodeId::from("m"),
            max_steps: Some(3),
        }],
    }
}

#[test]
fn the_contract_example_parses_into_every_field_and_round_trips() {
    let topology: Topology = serde_json::from_value(contract_example()).unwrap();
    assert_eq!(topology.start_at, NodeId::from("a"));
    assert_eq!(topology.max_steps, Some(100));
    assert_eq!(topology.nodes[0].timeout, NodeTimeout::EngineDefault);
    assert_eq!(topology.nodes[1].timeout, NodeTimeout::Fixed { ms: 5_000 });
    assert_eq!(
        topology.nodes[1].include_transition,
        Some(IncludeTransition::Entry)
    );
    assert_eq!(topology.nodes[2].timeout, NodeTimeout::Unbounded);
    assert_eq!(topology.nodes[3].timeout, NodeTimeout::Dynamic);
    assert!(topology.nodes[3].human_decision);
    assert!(!topology.nodes[0].human_decision);
    assert_eq!(
        topology.edges[1],
        switch("b", "$.route", &[("x", "c"), ("y", "d")])
    );
    assert_eq!(topology.mounts[0].max_steps, Some(10));
    assert_eq!(serde_json::to_value(&topology).unwrap(), contract_example());
}

#[test]
fn optional_fields_are_omitted_never_null() {
    let value = serde_json::to_value(chain(&["a", "b"])).unwrap();
    assert_eq!(
        value,
        json!({"startAt":"a",
               "nodes":[{"id":"a","nodeType":"compute","timeout":{"kind":"default"},"mountPath":[]},
                        {"id":"b","nodeType":"compute","timeout":{"kind":"default"},"mountPath":[]}],
               "edges":[{"kind":"plain","from":"a","to":"b"}],
               "mounts":[]})
    );
    let mount = Mount {
        mount_path: vec![String::from("m")],
        entry: NodeId::from("m"),
        max_steps: None,
    };
    assert_eq!(
        serde_json::to_value(mount).unwrap(),
        json!({"mountPath":["m"],"entry":"m"})
    );
}

#[test]
fn lookups_find_nodes_and_their_one_outgoing_edge() {
    let topology = included();
    assert_eq!(
        topology.node(&NodeId::from("m/work")).unwrap().node_type,
        NodeType::Compute
    );
    assert!(topology.node(&NodeId::from("nope")).is_none());
    assert_eq!(
        topology.outgoing(&NodeId::from("a")),
        Some(&plain("a", "m"))
    );
    assert_eq!(topology.outgoing(&NodeId::from("g")), None);
    assert_eq!(
        topology.mount(&[String::from("m")]).unwrap().entry.as_str(),
        "m"
    );
    assert!(!topology.node(&NodeId::from("m")).unwrap().counts_as_step());
    assert!(
        topology
            .node(&NodeId::from("m/work"))
            .unwrap()
            .counts_as_step()
    );
}

#[test]
fn the_root_step_limit_defaults_to_one_hundred() {
    assert_eq!(chain(&["a"]).root_max_steps(), DEFAULT_MAX_STEPS);
    assert_eq!(DEFAULT_MAX_STEPS, 100);
    assert_eq!(included().root_max_steps(), 20);
}

#[test]
fn static_timeouts_are_known_before_the_node_starts() {
    assert_eq!(NodeTimeout::EngineDefault.static_ms(), Some(900_000));
    assert_eq!(NodeTimeout::Fixed { ms: 5 }.static_ms(), Some(5));
    assert_eq!(NodeTimeout::Unbounded.static_ms(), None);
    assert_eq!(NodeTimeout::Dynamic.static_ms(), None);
}

#[test]
fn a_well_formed_graph_with_an_include_and_a_switch_validates() {
    assert_eq!(included().validate(), Ok(()));
    let mut topology = chain(&["a", "b", "c"]);
    topology.edges[1] = switch("b", "$result.outcome", &[("ok", "c"), ("failed", "a")]);
    assert_eq!(topology.validate(), Ok(()));
}

#[test]
fn duplicate_node_ids_are_refused() {
    let mut topology = chain(&["a", "b"]);
    topology.nodes.push(node("b", NodeType::Agent));
    assert_eq!(
        topology.validate(),
        Err(TopologyError::DuplicateNode {
            node_id: NodeId::from("b")
        })
    );
}

#[test]
fn a_missing_start_node_is_refused() {
    let mut topology = chain(&["a", "b"]);
    topology.start_at = NodeId::from("z");
    assert_eq!(
        topology.validate(),
        Err(TopologyError::StartAtMissing {
            start_at: NodeId::from("z")
        })
    );
}

#[test]
fn zero_step_limits_are_refused() {
    let mut topology = chain(&["a"]);
    topology.max_steps = Some(0);
    assert_eq!(topology.validate(), Err(TopologyError::ZeroMaxSteps));
    let mut topology = included();
    topology.mounts[0].max_steps = Some(0);
    assert_eq!(
        topology.validate(),
        Err(TopologyError::ZeroMountMaxSteps {
            entry: NodeId::from("m")
        })
    );
}

#[test]
fn a_mount_without_its_entry_node_is_refused() {
    let mut topology = included();
    topology.mounts[0].entry = NodeId::from("m/missing");
    assert_eq!(
        topology.validate(),
        Err(TopologyError::MountEntryMissing {
            entry: NodeId::from("m/missing")
        })
    );
}

#[test]
fn a_node_in_an_undeclared_mount_is_refused() {
    let mut topology = included();
    topology.nodes[2].mount_path = vec![String::from("other")];
    assert_eq!(
        topology.validate(),
        Err(TopologyError::UnknownMount {
            node_id: NodeId::from("m/work")
        })
    );
}

#[test]
fn edges_must_start_and_end_at_known_nodes() {
    let mut topology = chain(&["a", "b"]);
    topology.edges.push(plain("ghost", "a"));
    assert_eq!(
        topology.validate(),
        Err(TopologyError::UnknownEdgeSource {
            from: NodeId::from("ghost")
        })
    );
    let mut topology = chain(&["a", "b"]);
    topology
        .edges
        .push(switch("b", "$.route", &[("x", "a"), ("y", "nowhere")]));
    assert_eq!(
        topology.validate(),
        Err(TopologyError::UnknownEdgeTarget {
            from: NodeId::from("b"),
            to: NodeId::from("nowhere")
        })
    );
}

#[test]
fn a_second_outgoing_edge_is_refused() {
    let mut topology = chain(&["a", "b", "c"]);
    topology.edges.push(plain("a", "c"));
    assert_eq!(
        topology.validate(),
        Err(TopologyError::MultipleOutgoing {
            from: NodeId::from("a")
        })
    );
}

#[test]
fn bad_switch_paths_are_refused() {
    for on in [
        "route", "$route", "$.", "$..x", "$.a..b", "$.a.", "$.a[0]", "$.a b", "$input.x",
        "$result.", "",
    ] {
        let mut topology = chain(&["a", "b"]);
        topology.edges[0] = switch("a", on, &[("x", "b")]);
        assert_eq!(
            topology.validate(),
            Err(TopologyError::BadSwitchPath {
                from: NodeId::from("a")
            }),
            "{on:?} must be refused"
        );
    }
}

#[test]
fn switch_paths_parse_into_source_and_segments() {
    let parsed = |on| SwitchPath::parse(on).map(|path| (path.source, path.segments));
    assert_eq!(
        parsed("$.route"),
        Some((SwitchSource::Output, vec!["route"]))
    );
    assert_eq!(
        parsed("$output.a.b_c-1"),
        Some((SwitchSource::Output, vec!["a", "b_c-1"]))
    );
    assert_eq!(
        parsed("$result.outcome"),
        Some((SwitchSource::Result, vec!["outcome"]))
    );
    assert_eq!(parsed("$.a.[b]"), None);
}

#[test]
fn an_unreachable_node_is_refused() {
    let mut topology = chain(&["a", "b"]);
    topology.nodes.push(node("island", NodeType::Compute));
    assert_eq!(
        topology.validate(),
        Err(TopologyError::Unreachable {
            node_id: NodeId::from("island")
        })
    );
    // A cycle that never touches startAt is unreachable too.
    let mut topology = chain(&["a"]);
    topology.nodes.push(node("x", NodeType::Compute));
    topology.nodes.push(node("y", NodeType::Compute));
    topology.edges = vec![plain("x", "y"), plain("y", "x")];
    assert!(matches!(
        topology.validate(),
        Err(TopologyError::Unreachable { .. })
    ));
}

// ---- properties ------------------------------------------------------------

/// A random graph over nodes `n0..nk`: each node has no edge, a plain edge or
/// a switch edge to random nodes (possibly itself).
fn graph() -> impl Strategy<Value = Topology> {
    (1usize..7).prop_flat_map(|count| {
        let edge = prop_oneof![
            Just(None),
            (0..count).prop_map(|to| Some(vec![to])),
            proptest::collection::vec(0..count, 1..3).prop_map(Some),
        ];
        (
            proptest::collection::vec(edge, count),
            proptest::option::of(1u32..50),
        )
            .prop_map(move |(edges, max_steps)| {
                let name = |i: usize| alloc::format!("n{i}");
                let nodes = (0..count)
                    .map(|i| node(&name(i), NodeType::Compute))
                    .collect();
                let edges = edges
                    .iter()
                    .enumerate()
                    .filter_map(|(from, targets)| {
                        let targets = targets.as_ref()?;
                        Some(match targets.as_slice() {
                            [to] => plain(&name(from), &name(*to)),
                            many => Edge::Switch {
                                from: NodeId::new(name(from)),
                                on: String::from("$.route"),
                                cases: many
                                    .iter()
                                    .enumerate()
                                    .map(|(case, to)| {
                                        (alloc::format!("c{case}"), NodeId::new(name(*to)))
                                    })
                                    .collect(),
                            },
                        })
                    })
                    .collect();
                Topology {
                    start_at: NodeId::from("n0"),
                    max_steps,
                    nodes,
                    edges,
                    mounts: Vec::new(),
                }
            })
    })
}

/// Reachability by fixpoint iteration (independent of the validator's search).
fn all_reachable(topology: &Topology) -> bool {
    let mut reached = BTreeSet::from([topology.start_at.clone()]);
    for _ in 0..topology.nodes.len() {
        let next: Vec<NodeId> = topology
            .edges
            .iter()
            .filter(|edge| reached.contains(edge.from()))
            .flat_map(|edge| edge.targets().cloned())
            .collect();
        reached.extend(next);
    }
    topology.nodes.iter().all(|node| reached.contains(&node.id))
}

proptest! {
    /// A graph with unique nodes, one edge per node and valid paths is
    /// accepted exactly when every node is reachable from `startAt`.
    #[test]
    fn validation_accepts_exactly_the_reachable_graphs(topology in graph()) {
        let expected = all_reachable(&topology);
        prop_assert_eq!(topology.validate().is_ok(), expected);
    }

    /// Any topology survives a JSON round trip unchanged.
    #[test]
    fn json_round_trips(topology in graph()) {
        let text = serde_json::to_string(&topology).unwrap();
        prop_assert!(!text.contains("null"));
        let back: Topology = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(back, topology);
    }

    /// Adding an edge to a valid graph keeps it valid exactly when the node
    /// had no outgoing edge; a second one is `MultipleOutgoing`.
    #[test]
    fn an_added_edge_is_valid_only_from_a_node_without_one(topology in graph(), pick in 0usize..7) {
        prop_assume!(topology.validate().is_ok());
        let from = topology.nodes[pick % topology.nodes.len()].id.clone();
        let mut broken = topology.clone();
        broken.edges.push(Edge::Plain { from: from.clone(), to: topology.start_at.clone() });
        if topology.outgoing(&from).is_some() {
            prop_assert_eq!(broken.validate(), Err(TopologyError::MultipleOutgoing { from }));
        } else {
            prop_assert_eq!(broken.validate(), Ok(()));
        }
    }
}
