//! Node attempts: one execution of one node, and the finished steps a run has.
//!
//! Invariants:
//! - A run has at most one unfinished attempt (`Active` or `Waiting`); the
//!   database enforces this with a partial unique index and the kernel never
//!   creates a second one.
//! - An attempt finishes once, with exactly one outcome. A finished attempt
//!   is a step; an `Abandoned` attempt (runner lost mid-node, pause, park) is
//!   not a step and never routes.
//! - `visit` counts this node's steps in the run including carried ones, so
//!   an effect key made from (node, visit) is the same for a rerun of the
//!   same visit and different for the next visit.
//! - The result record routing reads (`$result.…`) has one shape, built
//!   here ([`ResultRecord`]): the shell stores its parts and rebuilds it
//!   from committed rows with the same builder.

use crate::ids::{AttemptId, Generation, NodeId};
use crate::topology::{NodeType, Topology};
use alloc::string::String;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How a node attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeOutcome {
    Ok,
    Failed,
    TimedOut,
    Cancelled,
}

impl NodeOutcome {
    /// The `$result.outcome` value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
        }
    }
}

/// The state of one attempt row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AttemptStatus {
    /// A runner executes it now.
    Active,
    /// It waits for an interactive request in the origin session (no runner).
    Waiting,
    /// It finished with this outcome.
    Finished(NodeOutcome),
    /// Its runner stopped before it finished; a later attempt reruns the node.
    Abandoned,
}

impl AttemptStatus {
    /// Whether the attempt is the run's one unfinished attempt.
    pub const fn is_unfinished(self) -> bool {
        matches!(self, Self::Active | Self::Waiting)
    }
}

/// One `node_attempts` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub attempt_id: AttemptId,
    pub node_id: NodeId,
    /// 1 for the node's first step in the run, 2 for the next, …
    pub visit: u32,
    pub generation: Generation,
    pub status: AttemptStatus,
    pub started_at_ms: u64,
    /// The resolved wall-clock deadline, once the runner reports it.
    pub deadline_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    /// How many earlier attempts of this same visit were abandoned by a
    /// crashed runner (bounds crash loops).
    pub crash_retries: u32,
}

/// A finished attempt as routing and step limits see it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepRecord {
    pub attempt_id: AttemptId,
    pub node_id: NodeId,
    pub outcome: NodeOutcome,
    /// Carried from a checkpoint parent by a continuation.
    pub carried: bool,
}

/// The result record routing reads (`$result.…`): `{attemptId, nodeId,
/// nodeType, outcome, startedAt, finishedAt, durationMs, output?, error?}`,
/// with RFC 3339 UTC times (millisecond precision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultRecord<'a> {
    pub attempt_id: &'a AttemptId,
    pub node_id: &'a NodeId,
    pub node_type: NodeType,
    pub outcome: NodeOutcome,
    pub started_at_ms: u64,
    pub finished_at_ms: u64,
    pub output: Option<&'a Value>,
    pub error: Option<&'a str>,
}

impl<'a> ResultRecord<'a> {
    /// The record of `attempt` finishing with `outcome` at `finished_at_ms`
    /// (no output or error yet: see [`Self::output`], [`Self::error`]).
    pub fn of(
        attempt: &'a AttemptRecord,
        topology: &Topology,
        outcome: NodeOutcome,
        finished_at_ms: u64,
    ) -> Self {
        Self {
            attempt_id: &attempt.attempt_id,
            node_id: &attempt.node_id,
            node_type: node_type(topology, &attempt.node_id),
            outcome,
            started_at_ms: attempt.started_at_ms,
            finished_at_ms,
            output: None,
            error: None,
        }
    }

    /// With the node's output.
    #[must_use]
    pub const fn output(mut self, output: Option<&'a Value>) -> Self {
        self.output = output;
        self
    }

    /// With the node's error message.
    #[must_use]
    pub const fn error(mut self, error: Option<&'a str>) -> Self {
        self.error = error;
        self
    }

    /// The JSON record.
    pub fn to_value(&self) -> Value {
        let mut record = json!({
            "attemptId": self.attempt_id.as_str(),
            "nodeId": self.node_id.as_str(),
            "nodeType": self.node_type,
            "outcome": self.outcome.as_str(),
            "startedAt": rfc3339(self.started_at_ms),
            "finishedAt": rfc3339(self.finished_at_ms),
            "durationMs": self.finished_at_ms.saturating_sub(self.started_at_ms),
        });
        if let Some(output) = self.output {
            record["output"] = output.clone();
        }
        if let Some(error) = self.error {
            record["error"] = json!({ "message": error });
        }
        record
    }
}

/// The type of `node_id` in `topology` (`compute` for a node the topology
/// does not name).
pub fn node_type(topology: &Topology, node_id: &NodeId) -> NodeType {
    topology
        .node(node_id)
        .map_or(NodeType::Compute, |node| node.node_type)
}

/// `yyyy-mm-ddThh:mm:ss.mmmZ` for a Unix time in milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let seconds = ms / 1000;
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    alloc::format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        (rest % 3600) / 60,
        rest % 60,
        ms % 1000
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
const fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + (month <= 2) as i64;
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::chain;

    #[test]
    fn rfc3339_formats_milliseconds_and_leap_days() {
        assert_eq!(rfc3339(951_782_400_007), "2000-02-29T00:00:00.007Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn a_result_record_names_its_attempt_node_outcome_and_duration() {
        let topology = chain(&["work"]);
        let attempt = AttemptRecord {
            attempt_id: AttemptId::new("a-1"),
            node_id: NodeId::new("work"),
            visit: 1,
            generation: Generation(1),
            status: AttemptStatus::Active,
            started_at_ms: 1_000,
            deadline_at_ms: None,
            finished_at_ms: None,
            crash_retries: 0,
        };
        let output = json!({ "n": 1 });
        let record = ResultRecord::of(&attempt, &topology, NodeOutcome::Ok, 3_500)
            .output(Some(&output))
            .to_value();
        assert_eq!(
            record,
            json!({
                "attemptId": "a-1",
                "nodeId": "work",
                "nodeType": "compute",
                "outcome": "ok",
                "startedAt": "1970-01-01T00:00:01.000Z",
                "finishedAt": "1970-01-01T00:00:03.500Z",
                "durationMs": 2_500,
                "output": { "n": 1 },
            })
        );
        let failed = ResultRecord::of(&attempt, &topology, NodeOutcome::TimedOut, 900)
            .error(Some("late"))
            .to_value();
        assert_eq!(failed["error"], json!({ "message": "late" }));
        assert_eq!(
            failed["durationMs"],
            json!(0),
            "a clock step back is no negative duration"
        );
        assert_eq!(
            ResultRecord::of(
                &AttemptRecord {
                    node_id: NodeId::new("gone"),
                    ..attempt.clone()
                },
                &topology,
                NodeOutcome::Ok,
                1_000
            )
            .node_type,
            NodeType::Compute
        );
    }
}
