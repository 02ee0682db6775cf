//! Presentation facts read off one run view: glyphs and words for the
//! server's closed vocabularies, each node's last step, attempts, timing
//! and progress, and the path the run took.
//!
//! Invariants:
//! - Nothing here decides a status. Run status is `display.status`; a
//!   node's state is the server's `nodes[].state`, except the node the
//!   server names in `display.currentNode`/`display.waitingOn`, which shows
//!   `display.status` (the server's presentation rule for that node).
//! - Steps are the complete history when the source resolved the graph
//!   history content (or the inline page was complete); otherwise the
//!   inline page, and [`RunModel::steps_complete`] says so.

use std::collections::{BTreeSet, HashMap};

use protocol::generated::types::{
    Control, DisplayStatus, NodeOutcome, NodeState, NodeType, RunView, StepRecord,
};
use serde_json::Value;

/// The glyph of a run's display status.
pub fn status_glyph(status: DisplayStatus) -> &'static str {
    match status {
        DisplayStatus::Queued => "○",
        DisplayStatus::Running => "◐",
        DisplayStatus::Waiting => "◷",
        DisplayStatus::Paused => "‖",
        DisplayStatus::Completed => "✓",
        DisplayStatus::Failed => "✗",
        DisplayStatus::TimedOut => "×",
        DisplayStatus::Cancelled => "⊘",
        DisplayStatus::Ambiguous => "⚠",
    }
}

/// The words of a run's display status.
pub fn status_word(status: DisplayStatus) -> &'static str {
    match status {
        DisplayStatus::Queued => "queued",
        DisplayStatus::Running => "running",
        DisplayStatus::Waiting => "waiting",
        DisplayStatus::Paused => "paused",
        DisplayStatus::Completed => "completed",
        DisplayStatus::Failed => "failed",
        DisplayStatus::TimedOut => "timed out",
        DisplayStatus::Cancelled => "cancelled",
        DisplayStatus::Ambiguous => "ambiguous",
    }
}

/// The glyph of a node's projected state.
pub fn node_glyph(state: NodeState) -> &'static str {
    match state {
        NodeState::Pending => "○",
        NodeState::Running => "◐",
        NodeState::Waiting => "◷",
        NodeState::Completed => "✓",
        NodeState::Failed => "✗",
        NodeState::TimedOut => "×",
        NodeState::Cancelled => "⊘",
    }
}

/// The words of a node's projected state.
pub fn node_word(state: NodeState) -> &'static str {
    match state {
        NodeState::Pending => "pending",
        NodeState::Running => "running",
        NodeState::Waiting => "waiting",
        NodeState::Completed => "completed",
        NodeState::Failed => "failed",
        NodeState::TimedOut => "timed out",
        NodeState::Cancelled => "cancelled",
    }
}

/// The glyph of a node type.
pub fn type_glyph(node_type: NodeType) -> &'static str {
    match node_type {
        NodeType::Agent => "✦",
        NodeType::Compute => "ƒ",
        NodeType::Notify => "✉",
        NodeType::Action => "⚙",
        NodeType::Checkpoint => "⚑",
    }
}

/// The words of a node type.
pub fn type_word(node_type: NodeType) -> &'static str {
    match node_type {
        NodeType::Agent => "agent",
        NodeType::Compute => "compute",
        NodeType::Notify => "notify",
        NodeType::Action => "action",
        NodeType::Checkpoint => "checkpoint",
    }
}

/// The words of a step or attempt outcome.
pub fn outcome_word(outcome: NodeOutcome) -> &'static str {
    match outcome {
        NodeOutcome::Ok => "ok",
        NodeOutcome::Failed => "failed",
        NodeOutcome::TimedOut => "timed out",
        NodeOutcome::Cancelled => "cancelled",
    }
}

/// How a control is offered: its key, its words, and the client.v1
/// operation piw sends for it (`None`: the control is the agent's, sent by
/// its Pi tool call, so piw names where to act instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlSpec {
    pub key: char,
    pub label: &'static str,
    pub operation: Option<&'static str>,
    /// Why piw cannot send it (when `operation` is `None`).
    pub elsewhere: &'static str,
}

/// The spec of every control.
pub fn control_spec(control: Control) -> ControlSpec {
    let spec = |key, label, operation, elsewhere| ControlSpec {
        key,
        label,
        operation,
        elsewhere,
    };
    match control {
        Control::Pause => spec('p', "pause", Some("run.pause"), ""),
        Control::Resume => spec('r', "resume", Some("run.resume"), ""),
        Control::Cancel => spec('x', "cancel", Some("run.cancel"), ""),
        Control::Restart => spec('R', "restart", Some("run.restart"), ""),
        Control::Answer => spec('a', "answer", Some("checkpoint.answer"), ""),
        Control::Activate => spec('o', "activate", Some("run.activate"), ""),
        Control::HumanAnswer => spec('A', "human answer", Some("decision.answer"), ""),
        Control::RecoverEffect => spec('E', "recover effect", Some("effect.recover"), ""),
        Control::Submit => spec(
            'S',
            "submit",
            None,
            "the agent submits through its Pi tool call",
        ),
        Control::Update => spec(
            'U',
            "update",
            None,
            "the agent publishes updates through its Pi tool call",
        ),
    }
}

/// `850ms`, `12.3s`, `4m05s`, `2h03m`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// `12s ago`, `4m ago`, `3h ago`, `2d ago`.
pub fn age(then_ms: u64, now_ms: u64) -> String {
    let seconds = now_ms.saturating_sub(then_ms) / 1000;
    match seconds {
        0..=59 => format!("{seconds}s ago"),
        60..=3599 => format!("{}m ago", seconds / 60),
        3600..=86_399 => format!("{}h ago", seconds / 3600),
        _ => format!("{}d ago", seconds / 86_400),
    }
}

/// `HH:MM:SS` (UTC) of a timestamp.
pub fn clock(ms: u64) -> String {
    let seconds = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// `HH:MM:SS.mmm` (UTC).
pub fn clock_ms(ms: u64) -> String {
    format!("{}.{:03}", clock(ms), ms % 1000)
}

/// One progress update's fields (`pi-workflows.progress.v1` data).
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub key: String,
    pub status: Option<String>,
    pub label: Option<String>,
    pub completed: Option<f64>,
    pub total: Option<f64>,
    pub unit: Option<String>,
}

impl Progress {
    /// Reads a `progress` update's data (other types: `None`).
    pub fn from_update(update_type: &str, key: &str, data: &Value) -> Option<Self> {
        if update_type != "progress" {
            return None;
        }
        let text = |name: &str| data.get(name).and_then(Value::as_str).map(str::to_owned);
        Some(Self {
            key: key.to_owned(),
            status: text("status"),
            label: text("label"),
            completed: data.get("completed").and_then(Value::as_f64),
            total: data.get("total").and_then(Value::as_f64),
            unit: text("unit"),
        })
    }

    /// Completed over total, in `0..=1`, when both are known.
    pub fn fraction(&self) -> Option<f64> {
        match (self.completed, self.total) {
            (Some(done), Some(total)) if total > 0.0 => Some((done / total).clamp(0.0, 1.0)),
            _ => None,
        }
    }

    /// `412/1280 tests`.
    pub fn count(&self) -> Option<String> {
        let (done, total) = (self.completed?, self.total?);
        let unit = self
            .unit
            .as_deref()
            .map(|u| format!(" {u}"))
            .unwrap_or_default();
        Some(format!("{}/{}{unit}", number(done), number(total)))
    }
}

/// A number without a needless fraction.
pub fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        format!("{value:.1}")
    }
}

/// What a node's card shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// The index (into [`RunModel::steps`]) of the node's last step.
    pub last_step: Option<usize>,
    /// The highest attempt number of that step.
    pub attempt: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    /// The newest progress update of one of the node's attempts.
    pub progress: Option<Progress>,
}

/// Presentation facts of one view revision.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunModel {
    /// Graph steps in order.
    pub steps: Vec<StepRecord>,
    /// Whether `steps` is the complete history.
    pub steps_complete: bool,
    /// Node id to index in `view.nodes`.
    pub index: HashMap<String, usize>,
    /// Per node (by index in `view.nodes`).
    pub nodes: Vec<NodeFacts>,
    /// Attempt id to node id.
    pub attempt_node: HashMap<String, String>,
}

impl RunModel {
    /// The facts of `view`, with the complete graph history when the source
    /// resolved it.
    pub fn new(view: &RunView, history: Option<&[StepRecord]>) -> Self {
        let inline_complete = view.steps.next_cursor.is_none()
            && view.steps.items.len() as u64 == view.steps.total.get();
        let (steps, steps_complete) = match history {
            Some(history) if history.len() >= view.steps.items.len() => (history.to_vec(), true),
            _ => (view.steps.items.clone(), inline_complete),
        };
        let index: HashMap<String, usize> = view
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (node.id.to_string(), i))
            .collect();
        let mut nodes = vec![NodeFacts::default(); view.nodes.len()];
        let mut attempt_node = HashMap::new();
        for (s, step) in steps.iter().enumerate() {
            for attempt in &step.attempts {
                attempt_node.insert(attempt.attempt_id.to_string(), step.node_id.to_string());
            }
            if let Some(&i) = index.get(step.node_id.as_str()) {
                let facts = &mut nodes[i];
                facts.last_step = Some(s);
                facts.attempt = step
                    .attempts
                    .iter()
                    .map(|a| a.attempt_number.get())
                    .max()
                    .unwrap_or(1);
                facts.started_ms = Some(step.started_at_ms.get());
                facts.finished_ms = step.finished_at_ms.map(|t| t.get());
            }
        }
        // Newest first: the first progress update of a node is its newest.
        for update in &view.updates.items {
            let Some(node) = attempt_node.get(update.attempt_id.as_str()) else {
                continue;
            };
            let Some(&i) = index.get(node) else { continue };
            if nodes[i].progress.is_none() {
                nodes[i].progress =
                    Progress::from_update(update.type_.as_str(), update.key.as_str(), &update.data);
            }
        }
        Self {
            steps,
            steps_complete,
            index,
            nodes,
            attempt_node,
        }
    }

    /// The node the server names as current or waited on.
    pub fn focus_node<'a>(&self, view: &'a RunView) -> Option<&'a str> {
        view.display
            .current_node
            .as_deref()
            .or(view.display.waiting_on.as_deref())
            .map(String::as_str)
    }

    /// The node edges the run took among its first `steps` steps
    /// (consecutive steps joined by an edge of the graph).
    pub fn taken_edges(&self, view: &RunView, steps: usize) -> BTreeSet<(String, String)> {
        let edges: BTreeSet<(&str, &str)> = view
            .edges
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str()))
            .collect();
        self.steps[..steps.min(self.steps.len())]
            .windows(2)
            .filter(|w| edges.contains(&(w[0].node_id.as_str(), w[1].node_id.as_str())))
            .map(|w| (w[0].node_id.to_string(), w[1].node_id.to_string()))
            .collect()
    }

    /// A node's state as of the first `steps` steps of the history (for
    /// replay): the outcome of its latest step among them, `running` for an
    /// unfinished one, `pending` before its first.
    pub fn state_at(&self, node: &str, steps: usize) -> NodeState {
        let latest = self.steps[..steps.min(self.steps.len())]
            .iter()
            .rev()
            .find(|step| step.node_id.as_str() == node);
        match latest.map(|step| step.outcome) {
            None => NodeState::Pending,
            Some(None) => NodeState::Running,
            Some(Some(NodeOutcome::Ok)) => NodeState::Completed,
            Some(Some(NodeOutcome::Failed)) => NodeState::Failed,
            Some(Some(NodeOutcome::TimedOut)) => NodeState::TimedOut,
            Some(Some(NodeOutcome::Cancelled)) => NodeState::Cancelled,
        }
    }
}

/// The status a node's card shows: the display status for the node the
/// server names (`currentNode`/`waitingOn`), the node's own state
/// otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CardStatus {
    Display(DisplayStatus),
    Node(NodeState),
}

impl CardStatus {
    pub fn glyph(self) -> &'static str {
        match self {
            Self::Display(status) => status_glyph(status),
            Self::Node(state) => node_glyph(state),
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Self::Display(status) => status_word(status),
            Self::Node(state) => node_word(state),
        }
    }

    /// Whether it is the running state (heavy border).
    pub fn is_running(self) -> bool {
        matches!(
            self,
            Self::Display(DisplayStatus::Running) | Self::Node(NodeState::Running)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_ages_read_naturally() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(12_340), "12.3s");
        assert_eq!(duration(245_000), "4m05s");
        assert_eq!(duration(7_380_000), "2h03m");
        assert_eq!(age(0, 12_000), "12s ago");
        assert_eq!(age(0, 3 * 86_400_000), "3d ago");
        assert_eq!(clock_ms(3_723_004), "01:02:03.004");
    }

    #[test]
    fn progress_reads_its_count_and_fraction() {
        let data = serde_json::json!({"status": "running", "completed": 412, "total": 1280, "unit": "tests"});
        let progress = Progress::from_update("progress", "suite", &data).unwrap();
        assert_eq!(progress.count().as_deref(), Some("412/1280 tests"));
        assert!((progress.fraction().unwrap() - 0.321_875).abs() < 1e-9);
        assert!(Progress::from_update("log", "x", &data).is_none());
    }

    #[test]
    fn every_control_has_a_distinct_key() {
        let all = [
            Control::Submit,
            Control::Update,
            Control::Answer,
            Control::HumanAnswer,
            Control::Pause,
            Control::Resume,
            Control::Cancel,
            Control::RecoverEffect,
            Control::Restart,
            Control::Activate,
        ];
        let mut keys: Vec<char> = all.iter().map(|&c| control_spec(c).key).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), all.len());
    }
}
