//! The compiled workflow graph the kernel routes on.
//!
//! The runner compiles a `.workflow.ts` definition once (includes flattened to
//! qualified ids `mount/local`, the mount's entry node `mount`, its exit nodes
//! `mount/__piw_exit_<exit>`) and sends this topology as JSON; the server
//! stores it and passes the parsed value to every routing decision.
//!
//! Invariants (checked by [`Topology::validate`], which the server runs before
//! it stores a topology; routing assumes a validated one):
//! - Node ids are unique and `startAt` names a node.
//! - Every edge starts and ends at a node, and a node has at most one
//!   outgoing edge.
//! - Every node is reachable from `startAt`.
//! - A switch path starts with `$.`, `$output.` or `$result.` and continues
//!   with simple dotted segments (`[A-Za-z0-9_-]+`).
//! - Step limits are positive; every mount's entry node exists, and every
//!   node inside a mount names a declared mount.
//! - The JSON shape is a contract shared with the protocol schema: camelCase,
//!   optional fields omitted (never `null`).

use crate::ids::NodeId;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// The engine's step limit when the root workflow declares none.
pub const DEFAULT_MAX_STEPS: u32 = 100;
/// The engine's node deadline when a node declares no timeout (15 min).
pub const DEFAULT_NODE_TIMEOUT_MS: u64 = 15 * 60 * 1_000;

/// One of the engine's five real node types (authoring sugar compiles to these).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NodeType {
    Agent,
    Compute,
    Notify,
    Action,
    Checkpoint,
}

/// A node's declared wall-clock limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum NodeTimeout {
    /// Omitted: the engine default, [`DEFAULT_NODE_TIMEOUT_MS`].
    #[serde(rename = "default")]
    EngineDefault,
    /// `null`: no wall-clock deadline (cancel, park and claim loss still apply).
    #[serde(rename = "none")]
    Unbounded,
    /// A fixed number of milliseconds.
    #[serde(rename = "ms")]
    Fixed { ms: u64 },
    /// A function the runner resolves and reports in `node.started`.
    Dynamic,
}

impl NodeTimeout {
    /// The limit in milliseconds when it is known before the node starts
    /// (`None` for unbounded and dynamic timeouts).
    pub const fn static_ms(self) -> Option<u64> {
        match self {
            Self::EngineDefault => Some(DEFAULT_NODE_TIMEOUT_MS),
            Self::Fixed { ms } => Some(ms),
            Self::Unbounded | Self::Dynamic => None,
        }
    }
}

/// Which include transition a compiled node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum IncludeTransition {
    /// `<mount>`: maps the parent's input into the child.
    Entry,
    /// `<mount>/__piw_exit_<exit>`: validates and returns the child's exit.
    Exit,
}

/// One compiled node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    pub id: NodeId,
    pub node_type: NodeType,
    pub timeout: NodeTimeout,
    /// The mounts this node sits in, outermost first (`[]` for root nodes;
    /// an include's entry and exit nodes belong to their own mount).
    pub mount_path: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_transition: Option<IncludeTransition>,
    /// A checkpoint with a protected human decision.
    #[serde(default, skip_serializing_if = "is_false")]
    pub human_decision: bool,
}

impl NodeSpec {
    /// Whether the node is a real step (include transitions are not counted
    /// against step limits).
    pub const fn counts_as_step(&self) -> bool {
        self.include_transition.is_none()
    }
}

const fn is_false(value: &bool) -> bool {
    !*value
}

/// The one outgoing edge of a node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Edge {
    /// Always continue to `to`.
    Plain { from: NodeId, to: NodeId },
    /// Continue to the case named by the scalar at path `on`.
    Switch {
        from: NodeId,
        on: String,
        cases: BTreeMap<String, NodeId>,
    },
}

impl Edge {
    /// The node the edge leaves.
    pub const fn from(&self) -> &NodeId {
        match self {
            Self::Plain { from, .. } | Self::Switch { from, .. } => from,
        }
    }

    /// Every node the edge may lead to.
    pub fn targets(&self) -> impl Iterator<Item = &NodeId> {
        let (plain, cases) = match self {
            Self::Plain { to, .. } => (Some(to), None),
            Self::Switch { cases, .. } => (None, Some(cases.values())),
        };
        plain.into_iter().chain(cases.into_iter().flatten())
    }
}

/// One included workflow's mount.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub mount_path: Vec<String>,
    /// The mount's entry node (`<mount>`).
    pub entry: NodeId,
    /// Bounds the real steps of one invocation of the child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
}

/// The flattened graph of one workflow definition.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    pub start_at: NodeId,
    /// The root step limit; [`DEFAULT_MAX_STEPS`] when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    pub nodes: Vec<NodeSpec>,
    pub edges: Vec<Edge>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
}

/// Why a topology was refused. The first problem found is reported.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "error")]
pub enum TopologyError {
    /// Two nodes share one id.
    DuplicateNode { node_id: NodeId },
    /// `startAt` names no node.
    StartAtMissing { start_at: NodeId },
    /// The root `maxSteps` is zero.
    ZeroMaxSteps,
    /// A mount's `maxSteps` is zero.
    ZeroMountMaxSteps { entry: NodeId },
    /// A mount's entry node does not exist.
    MountEntryMissing { entry: NodeId },
    /// A node sits in a mount path that no mount declares.
    UnknownMount { node_id: NodeId },
    /// An edge leaves a node that does not exist.
    UnknownEdgeSource { from: NodeId },
    /// An edge leads to a node that does not exist.
    UnknownEdgeTarget { from: NodeId, to: NodeId },
    /// A node has more than one outgoing edge.
    MultipleOutgoing { from: NodeId },
    /// A switch path is not `$.`, `$output.` or `$result.` plus simple segments.
    BadSwitchPath { from: NodeId },
    /// A node cannot be reached from `startAt`.
    Unreachable { node_id: NodeId },
}

/// What a switch path reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SwitchSource {
    /// `$.` or `$output.`: the node's accepted output.
    Output,
    /// `$result.`: the node's result record (`$result.outcome`, …).
    Result,
}

/// A parsed switch path: its source and one or more simple segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchPath<'a> {
    pub source: SwitchSource,
    pub segments: Vec<&'a str>,
}

impl<'a> SwitchPath<'a> {
    /// Parses `$.a.b`, `$output.a` or `$result.outcome`; `None` for anything else.
    pub fn parse(on: &'a str) -> Option<Self> {
        let (source, rest) = if let Some(rest) = on.strip_prefix("$result.") {
            (SwitchSource::Result, rest)
        } else if let Some(rest) = on.strip_prefix("$output.") {
            (SwitchSource::Output, rest)
        } else {
            (SwitchSource::Output, on.strip_prefix("$.")?)
        };
        let segments: Vec<&str> = rest.split('.').collect();
        segments
            .iter()
            .all(|segment| is_simple_segment(segment))
            .then_some(Self { source, segments })
    }
}

fn is_simple_segment(segment: &str) -> bool {
    !segment.is_empty()
        && segment
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

impl Topology {
    /// The node with this id.
    pub fn node(&self, node_id: &NodeId) -> Option<&NodeSpec> {
        self.nodes.iter().find(|node| &node.id == node_id)
    }

    /// The node's one outgoing edge, if it has one.
    pub fn outgoing(&self, node_id: &NodeId) -> Option<&Edge> {
        self.edges.iter().find(|edge| edge.from() == node_id)
    }

    /// The root step limit.
    pub fn root_max_steps(&self) -> u32 {
        self.max_steps.unwrap_or(DEFAULT_MAX_STEPS)
    }

    /// The mount declared for exactly this mount path.
    pub fn mount(&self, mount_path: &[String]) -> Option<&Mount> {
        self.mounts
            .iter()
            .find(|mount| mount.mount_path == mount_path)
    }

    /// Checks every structural rule the kernel relies on.
    pub fn validate(&self) -> Result<(), TopologyError> {
        self.check_nodes()?;
        self.check_mounts()?;
        self.check_edges()?;
        self.check_reachable()
    }

    fn check_nodes(&self) -> Result<(), TopologyError> {
        let mut seen = BTreeSet::new();
        for node in &self.nodes {
            if !seen.insert(&node.id) {
                return Err(TopologyError::DuplicateNode {
                    node_id: node.id.clone(),
                });
            }
        }
        if self.node(&self.start_at).is_none() {
            return Err(TopologyError::StartAtMissing {
                start_at: self.start_at.clone(),
            });
        }
        if self.max_steps == Some(0) {
            return Err(TopologyError::ZeroMaxSteps);
        }
        Ok(())
    }

    fn check_mounts(&self) -> Result<(), TopologyError> {
        for mount in &self.mounts {
            let entry = mount.entry.clone();
            if mount.max_steps == Some(0) {
                return Err(TopologyError::ZeroMountMaxSteps { entry });
            }
            if self.node(&mount.entry).is_none() {
                return Err(TopologyError::MountEntryMissing { entry });
            }
        }
        let unknown = self
            .nodes
            .iter()
            .find(|node| !node.mount_path.is_empty() && self.mount(&node.mount_path).is_none());
        match unknown {
            Some(node) => Err(TopologyError::UnknownMount {
                node_id: node.id.clone(),
            }),
            None => Ok(()),
        }
    }

    fn check_edges(&self) -> Result<(), TopologyError> {
        let mut sources = BTreeSet::new();
        for edge in &self.edges {
            let from = edge.from().clone();
            if self.node(&from).is_none() {
                return Err(TopologyError::UnknownEdgeSource { from });
            }
            if let Some(to) = edge.targets().find(|to| self.node(to).is_none()) {
                let to = to.clone();
                return Err(TopologyError::UnknownEdgeTarget { from, to });
            }
            if let Edge::Switch { on, .. } = edge
                && SwitchPath::parse(on).is_none()
            {
                return Err(TopologyError::BadSwitchPath { from });
            }
            if !sources.insert(edge.from()) {
                return Err(TopologyError::MultipleOutgoing { from });
            }
        }
        Ok(())
    }

    fn check_reachable(&self) -> Result<(), TopologyError> {
        let mut reached = BTreeSet::new();
        let mut frontier = Vec::from([&self.start_at]);
        while let Some(node_id) = frontier.pop() {
            if !reached.insert(node_id) {
                continue;
            }
            if let Some(edge) = self.outgoing(node_id) {
                frontier.extend(edge.targets());
            }
        }
        match self.nodes.iter().find(|node| !reached.contains(&node.id)) {
            Some(node) => Err(TopologyError::Unreachable {
                node_id: node.id.clone(),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
