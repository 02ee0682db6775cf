//! Routing: which node runs after a node finishes, and the step limits.
//!
//! A node's result record is `{attemptId, nodeId, nodeType, outcome,
//! startedAt, finishedAt, durationMs, output?, error?}`; a switch path `$.x`
//! or `$output.x` reads `output.x`, and `$result.x` reads the record itself.
//!
//! Invariants:
//! - `cancelled` is never routed; it always cancels the run.
//! - An `ok` checkpoint always waits (its edge is followed by a continuation,
//!   see [`route_from_checkpoint`]); any other `ok` node follows its one
//!   outgoing edge, and a node without one completes the run.
//! - A switch picks a case only from a scalar (string, number, bool)
//!   stringified; a missing, non-scalar or unknown value is a routing error
//!   that fails the run, never a guess.
//! - A `failed` or `timed_out` node continues only through a `$result.`
//!   switch with a matching case; otherwise the run fails or times out.
//! - No route lets a run take more real steps than its root `maxSteps`, nor
//!   an include invocation more than its mount's `maxSteps`
//!   ([`check_step_limit`]). Include entry and exit transitions are not real
//!   steps; carried and replayed steps are.

use crate::attempt::NodeOutcome;
use crate::ids::NodeId;
use crate::steps::StepSummary;
use crate::topology::{Edge, NodeType, SwitchPath, SwitchSource, Topology};
use alloc::collections::BTreeMap;
use alloc::string::String;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The decision after a node finished.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// Run this node next.
    Next(NodeId),
    /// The run completes; its final output is the finished node's output.
    Complete,
    /// The run waits on this checkpoint (status `waiting`).
    Wait { checkpoint: NodeId },
    /// The run fails.
    Fail(RouteFailure),
    /// The run times out (a node deadline without a recovery edge).
    TimedOut,
    /// The run is cancelled.
    Cancelled,
}

/// Why routing fails the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "failure")]
pub enum RouteFailure {
    /// The node failed and no `$result.` case continues from it.
    NodeFailed,
    /// The graph or the data could not pick a next node.
    Routing { error: RoutingError },
    /// The next step would exceed a step limit.
    MaxSteps { limit: u32 },
}

/// Why a switch could not pick a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RoutingError {
    /// The node is not in the topology.
    UnknownNode,
    /// The switch path is not a valid path (an unvalidated topology).
    BadPath,
    /// The path resolves to nothing.
    MissingValue,
    /// The path resolves to `null`, an object or an array.
    NonScalar,
    /// The stringified value names no case.
    UnknownCase,
}

const fn routing(error: RoutingError) -> Route {
    Route::Fail(RouteFailure::Routing { error })
}

/// Routes after `node_id` finished with `outcome` and result `record`.
pub fn route(topology: &Topology, node_id: &NodeId, outcome: NodeOutcome, record: &Value) -> Route {
    let Some(node) = topology.node(node_id) else {
        return routing(RoutingError::UnknownNode);
    };
    match outcome {
        NodeOutcome::Cancelled => Route::Cancelled,
        NodeOutcome::Ok if node.node_type == NodeType::Checkpoint => Route::Wait {
            checkpoint: node_id.clone(),
        },
        NodeOutcome::Ok => follow(topology, node_id, record),
        NodeOutcome::Failed | NodeOutcome::TimedOut => recover(topology, node_id, outcome, record),
    }
}

/// Routes a continuation onward from its parent's checkpoint: the
/// checkpoint's edge is followed (a checkpoint without one completes the
/// continuation). `record` is the checkpoint's result record; for a
/// protected decision its output is the validated response.
pub fn route_from_checkpoint(topology: &Topology, checkpoint: &NodeId, record: &Value) -> Route {
    if topology.node(checkpoint).is_none() {
        return routing(RoutingError::UnknownNode);
    }
    follow(topology, checkpoint, record)
}

fn follow(topology: &Topology, node_id: &NodeId, record: &Value) -> Route {
    match topology.outgoing(node_id) {
        None => Route::Complete,
        Some(Edge::Plain { to, .. }) => Route::Next(to.clone()),
        Some(Edge::Switch { on, cases, .. }) => match pick(on, cases, record) {
            Ok(to) => Route::Next(to),
            Err(error) => routing(error),
        },
    }
}

fn recover(topology: &Topology, node_id: &NodeId, outcome: NodeOutcome, record: &Value) -> Route {
    if let Some(Edge::Switch { on, cases, .. }) = topology.outgoing(node_id)
        && SwitchPath::parse(on).is_some_and(|path| path.source == SwitchSource::Result)
        && let Ok(to) = pick(on, cases, record)
    {
        return Route::Next(to);
    }
    if outcome == NodeOutcome::TimedOut {
        Route::TimedOut
    } else {
        Route::Fail(RouteFailure::NodeFailed)
    }
}

fn pick(
    on: &str,
    cases: &BTreeMap<String, NodeId>,
    record: &Value,
) -> Result<NodeId, RoutingError> {
    let path = SwitchPath::parse(on).ok_or(RoutingError::BadPath)?;
    let value = resolve(&path, record).ok_or(RoutingError::MissingValue)?;
    let key = case_key(value).ok_or(RoutingError::NonScalar)?;
    cases.get(&key).cloned().ok_or(RoutingError::UnknownCase)
}

/// Reads the value at `path`: a simple lookup of object keys.
fn resolve<'v>(path: &SwitchPath<'_>, record: &'v Value) -> Option<&'v Value> {
    let root = match path.source {
        SwitchSource::Output => record.get("output")?,
        SwitchSource::Result => record,
    };
    path.segments
        .iter()
        .try_fold(root, |value, segment| value.as_object()?.get(*segment))
}

/// The case a scalar selects: strings as they are, booleans as `true` or
/// `false`, numbers as JavaScript prints them (integral values without a
/// fraction).
fn case_key(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Bool(flag) => Some(String::from(if *flag { "true" } else { "false" })),
        Value::Number(number) => Some(number_key(number)),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

fn number_key(number: &serde_json::Number) -> String {
    if number.is_f64()
        && let Some(float) = number.as_f64()
    {
        // JavaScript prints 2.0 as "2" and -0 as "0".
        const EXACT: f64 = 9_007_199_254_740_992.0;
        if float == 0.0 {
            return String::from("0");
        }
        if -EXACT < float && float < EXACT {
            // In range: the cast truncates the fraction, which the comparison detects.
            let integral = float as i64;
            if integral as f64 == float {
                return alloc::format!("{integral}");
            }
        }
        return alloc::format!("{float}");
    }
    alloc::format!("{number}")
}

/// Checks that running `next` after the summarised steps stays within the
/// root `maxSteps` and within the `maxSteps` of every mount `next` sits in
/// (counting the real steps since that mount's latest entry step).
/// Entering a mount starts a new invocation of it.
pub fn check_step_limit(
    topology: &Topology,
    steps: &StepSummary,
    next: &NodeId,
) -> Result<(), RouteFailure> {
    let Some(next_node) = topology.node(next) else {
        return Err(RouteFailure::Routing {
            error: RoutingError::UnknownNode,
        });
    };
    let new = u64::from(next_node.counts_as_step());
    let limit = topology.root_max_steps();
    if u64::from(steps.real) + new > u64::from(limit) {
        return Err(RouteFailure::MaxSteps { limit });
    }
    for depth in 1..=next_node.mount_path.len() {
        let Some(mount) = topology.mount(&next_node.mount_path[..depth]) else {
            continue;
        };
        let Some(limit) = mount.max_steps.filter(|_| mount.entry != *next) else {
            continue;
        };
        if u64::from(steps.real_since_entry(&mount.entry)) + new > u64::from(limit) {
            return Err(RouteFailure::MaxSteps { limit });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
