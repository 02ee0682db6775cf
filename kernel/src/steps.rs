//! The bounded summary of a run's finished steps: all that a transition
//! reads of the run's history.
//!
//! A run's finished steps grow with its length, but a transition reads
//! only: the latest step (where a new generation routes from, and whether
//! the run has steps of its own), the visits of the nodes it may route to
//! (a new attempt's visit number), the real steps so far (the root
//! `maxSteps`) and, for each mount whose `maxSteps` bounds an invocation,
//! the real steps since the mount's latest entry. [`StepSummary`] keeps
//! exactly these, so its size is bounded by the topology, never by the
//! run's length, and the shell loads it with bounded queries.
//!
//! Invariants:
//! - Every decision read from a summary equals the one read from the full
//!   list of steps it summarises, when the summary holds the visits of
//!   [`StepSummary::needed_nodes`] (the tests compare both over random
//!   histories, with the summary cut down to exactly those nodes).
//! - Carried steps come first, so the run has steps of its own exactly
//!   when its latest step is not carried.
//! - `visits[n]` is the number of finished steps of `n`. The kernel numbers
//!   a new attempt's visit one more than that, so it is also the visit
//!   number of `n`'s latest finished step (the shell reads it there).
//! - `transitions` and the keys of `since_entry` are fixed before the
//!   run's first step (the kernel sets them at the run's first route, the
//!   shell loads them from the topology), so [`StepSummary::record`] needs
//!   no topology.

use crate::attempt::{AttemptRecord, StepRecord};
use crate::ids::NodeId;
use crate::topology::Topology;
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// What a transition reads of a run's finished steps (carried included).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepSummary {
    /// How many steps finished.
    pub count: u32,
    /// The latest finished step.
    pub last: Option<StepRecord>,
    /// Finished steps that count against step limits (every step but the
    /// include transitions).
    pub real: u32,
    /// Finished steps per node: at least for every node of
    /// [`Self::needed_nodes`] (a node absent has none). A summary folded
    /// from the run's start holds every node it recorded.
    pub visits: BTreeMap<NodeId, u32>,
    /// The topology's include transitions (not real steps).
    pub transitions: BTreeSet<NodeId>,
    /// For each entry of [`Self::watched_entries`]: `None` before its first
    /// step, then the real steps after its latest one.
    pub since_entry: BTreeMap<NodeId, Option<u32>>,
}

impl StepSummary {
    /// An empty summary prepared for `topology` (see [`Self::watch`]).
    pub fn new(topology: &Topology) -> Self {
        let mut summary = Self::default();
        summary.watch(topology);
        summary
    }

    /// The summary of `steps` (in order, carried ones first) for `topology`.
    pub fn of(topology: &Topology, steps: &[StepRecord]) -> Self {
        let mut summary = Self::new(topology);
        for step in steps {
            summary.record(step.clone());
        }
        summary
    }

    /// The entries of the mounts whose `maxSteps` bounds an invocation.
    pub fn watched_entries(topology: &Topology) -> impl Iterator<Item = &NodeId> {
        topology
            .mounts
            .iter()
            .filter(|mount| mount.max_steps.is_some())
            .map(|mount| &mount.entry)
    }

    /// The include transitions of `topology` (entries and exits).
    pub fn transitions_of(topology: &Topology) -> impl Iterator<Item = &NodeId> {
        topology
            .nodes
            .iter()
            .filter(|node| !node.counts_as_step())
            .map(|node| &node.id)
    }

    /// The nodes whose visits a transition may read, given the latest step's
    /// node and the current attempt's node: the start node and every node
    /// an outgoing edge of either leads to (routing only follows those).
    pub fn needed_nodes<'a>(
        topology: &'a Topology,
        last: Option<&'a NodeId>,
        attempt: Option<&'a NodeId>,
    ) -> BTreeSet<&'a NodeId> {
        let mut nodes = BTreeSet::new();
        nodes.insert(&topology.start_at);
        for from in last.into_iter().chain(attempt) {
            if let Some(edge) = topology.outgoing(from) {
                nodes.extend(edge.targets());
            }
        }
        nodes
    }

    /// The nodes whose visits the shell loads for `attempt` after `last`.
    pub fn nodes_to_load<'a>(
        topology: &'a Topology,
        last: Option<&'a NodeId>,
        attempt: Option<&'a AttemptRecord>,
    ) -> Vec<&'a NodeId> {
        let mut nodes = Self::needed_nodes(topology, last, attempt.map(|a| &a.node_id));
        nodes.extend(Self::transitions_of(topology));
        nodes.into_iter().collect()
    }

    /// Fixes the include transitions and watched entries of `topology`.
    /// Only an empty summary changes: the facts since an entry cannot be
    /// known for steps recorded before it was watched.
    pub fn watch(&mut self, topology: &Topology) {
        if self.last.is_some() {
            return;
        }
        self.transitions = Self::transitions_of(topology).cloned().collect();
        self.since_entry = Self::watched_entries(topology)
            .map(|entry| (entry.clone(), None))
            .collect();
    }

    /// Appends one finished step.
    pub fn record(&mut self, step: StepRecord) {
        let node = &step.node_id;
        let real = u32::from(!self.transitions.contains(node));
        self.count = self.count.saturating_add(1);
        self.real = self.real.saturating_add(real);
        let visits = self.visits.entry(node.clone()).or_insert(0);
        *visits = visits.saturating_add(1);
        for (entry, since) in &mut self.since_entry {
            if entry == node {
                *since = Some(0);
            } else if let Some(since) = since {
                *since = since.saturating_add(real);
            }
        }
        self.last = Some(step);
    }

    /// Whether no step finished.
    pub const fn is_empty(&self) -> bool {
        self.last.is_none()
    }

    /// The latest finished step.
    pub const fn last(&self) -> Option<&StepRecord> {
        self.last.as_ref()
    }

    /// Whether the run has a step of its own (not carried).
    pub fn has_own_steps(&self) -> bool {
        self.last.as_ref().is_some_and(|step| !step.carried)
    }

    /// 1 + the node's earlier steps in the run, carried ones included.
    pub fn next_visit(&self, node_id: &NodeId) -> u32 {
        self.visits
            .get(node_id)
            .copied()
            .unwrap_or(0)
            .saturating_add(1)
    }

    /// The real steps since the latest step of `entry` (all of them before
    /// its first). An entry that is not watched is treated as never
    /// entered (a summary the shell or the kernel prepared watches every
    /// entry a step limit reads).
    pub fn real_since_entry(&self, entry: &NodeId) -> u32 {
        match self.since_entry.get(entry) {
            Some(Some(since)) => *since,
            Some(None) => self.real,
            None => {
                debug_assert!(false, "entry {entry:?} is not watched");
                self.real
            }
        }
    }

    /// The same steps carried into a continuation.
    #[must_use]
    pub fn carried(&self) -> Self {
        let mut carried = self.clone();
        if let Some(last) = carried.last.as_mut() {
            last.carried = true;
        }
        carried
    }
}

#[cfg(test)]
mod tests;
