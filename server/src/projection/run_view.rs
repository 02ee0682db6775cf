//! The live run view (`pi-workflows.run-view.v1`): its small documents and
//! how a view is assembled from them. Pure: no SQL (the rows live in
//! `store::viewer` and `store::view_facts`), no I/O.
//!
//! Invariants:
//! - `display` comes only from the kernel's reducer; the view adds no status
//!   logic of its own.
//! - A view is made of small documents: the header, one entry per topology
//!   node, one document per graph step, the update page. The same builders
//!   serve the incremental presentation rows written at commit time and the
//!   from-scratch rebuild that checks them, so both give the same bytes.
//! - Nothing that grows is inline without bounds, so a snapshot (and with
//!   it every patch and page) fits one 1 MiB frame, even inside an
//!   origin-session view beside its 256 KiB message window: the step and
//!   update pages have an item limit and an encoded byte budget, a step
//!   shows its newest attempts only, the graph projection of a definition
//!   is bounded when it is resolved ([`graph_projection_bytes`]), reasons
//!   over 16 KiB are references, failure messages and titles are cut. The
//!   rest is reached through `view.page` and the referenced graph history.

use crate::wire::codec_name;
use kernel::display::{self, DisplayFacts, DisplayReason, OutsideFacts};
use kernel::ids::RunId;
use kernel::run::{ParkReason, RunAggregate};
use kernel::runner::ProtocolCheck;
use kernel::topology::Topology;
use serde_json::{Map, Value, json};

/// Reasons longer than this many characters become a notice plus a reference.
pub const INLINE_REASON_CHARS: usize = 16 * 1024;
/// At most this many steps are inline in a view; the rest are paged.
pub const STEP_PAGE_LIMIT: usize = 256;
/// The encoded bytes the inline steps may take (at least one step is shown).
pub const STEP_PAGE_BYTES: usize = 128 * 1024;
/// A step document lists at most this many attempts: the newest (their
/// `attemptNumber` says which); the graph history has all of them.
pub const STEP_ATTEMPTS_SHOWN: usize = 16;
/// At most this many current updates are inline in a view (newest first).
pub const UPDATE_PAGE_LIMIT: usize = 64;
/// The encoded bytes the inline updates may take (at least one update, at
/// most 64 KiB of data, is shown).
pub const UPDATE_PAGE_BYTES: usize = 128 * 1024;
/// The encoded bytes a definition's `nodes` and `edges` may take in a view.
/// A larger graph is refused when the workflow is resolved.
pub const GRAPH_PROJECTION_BYTES: usize = 256 * 1024;

/// The canonical (wire) length of a value.
pub fn encoded_len(value: &Value) -> usize {
    protocol::canonicalize(value).map_or(usize::MAX, |bytes| bytes.len())
}

/// The canonical (wire) text of a value (empty when not encodable, never
/// for the documents of a view).
pub fn canonical_text(value: &Value) -> String {
    protocol::canonicalize(value)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .unwrap_or_default()
}

/// How many leading items of a page fit: at most `limit` items whose
/// `sizes` add up to at most `max_bytes`, but always the first one (an
/// item on its own is bounded by the rules that made it).
pub fn page_prefix(
    sizes: impl IntoIterator<Item = usize>,
    limit: usize,
    max_bytes: usize,
) -> usize {
    let mut used = 0usize;
    let mut count = 0usize;
    for size in sizes {
        if count == limit || (count > 0 && used.saturating_add(size) > max_bytes) {
            break;
        }
        used = used.saturating_add(size);
        count += 1;
    }
    count
}

/// Whether a step of `size` bytes joins an inline step page that holds
/// `count` steps of `used` bytes (the first always does).
pub fn step_fits(count: usize, used: usize, size: usize) -> bool {
    count == 0 || (count < STEP_PAGE_LIMIT && used.saturating_add(size) <= STEP_PAGE_BYTES)
}

/// One attempt row of a run, as the graph history shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRow {
    pub seq: u64,
    pub attempt_id: String,
    pub node_id: String,
    pub visit: i64,
    pub status: String,
    pub outcome: Option<String>,
    pub started_at_ms: i64,
    pub finished_at_ms: Option<i64>,
}

/// One graph step (a node visit) with every attempt, folded from its
/// attempt rows in `seq` order.
#[derive(Clone, Debug, PartialEq)]
pub struct StepDoc {
    /// The step's position, from 1.
    pub index: usize,
    pub node_id: String,
    pub visit: i64,
    /// The `seq` of its first attempt row.
    pub first_seq: u64,
    /// The outcome of its last attempt when that attempt finished.
    pub outcome: Option<String>,
    /// The complete step document (every attempt).
    pub value: Value,
}

impl StepDoc {
    /// A step that starts with `row`.
    pub fn new(index: usize, row: &AttemptRow) -> Self {
        let mut value = Map::new();
        value.insert("seq".into(), json!(index));
        value.insert("nodeId".into(), Value::String(row.node_id.clone()));
        value.insert("visit".into(), json!(row.visit));
        value.insert("attempts".into(), Value::Array(Vec::new()));
        value.insert("startedAtMs".into(), json!(row.started_at_ms));
        let mut step = Self {
            index,
            node_id: row.node_id.clone(),
            visit: row.visit,
            first_seq: row.seq,
            outcome: None,
            value: Value::Object(value),
        };
        step.add(row);
        step
    }

    /// Whether `row` is another attempt of this step.
    pub fn holds(&self, row: &AttemptRow) -> bool {
        self.node_id == row.node_id && self.visit == row.visit
    }

    /// Adds the next attempt row of this step.
    pub fn add(&mut self, row: &AttemptRow) {
        let object = self.value.as_object_mut().expect("a step object");
        let attempts = object
            .get_mut("attempts")
            .and_then(Value::as_array_mut)
            .expect("attempts array");
        let mut attempt = json!({ "attemptId": row.attempt_id, "attemptNumber": attempts.len() + 1, "startedAtMs": row.started_at_ms });
        if let Some(finished) = row.finished_at_ms {
            attempt["finishedAtMs"] = json!(finished);
        }
        if let Some(outcome) = &row.outcome {
            attempt["outcome"] = json!(outcome);
        }
        attempts.push(attempt);
        if row.status == "finished" {
            object.insert("finishedAtMs".into(), json!(row.finished_at_ms));
            object.insert("outcome".into(), json!(row.outcome));
            self.outcome = row.outcome.clone();
        } else {
            object.remove("finishedAtMs");
            object.remove("outcome");
            self.outcome = None;
        }
    }

    /// The step as a view shows it: its newest [`STEP_ATTEMPTS_SHOWN`]
    /// attempts (unchanged when it has no more).
    pub fn shown(&self) -> Value {
        shown_step(self.value.clone())
    }
}

/// Folds attempt rows (in `seq` order) into steps numbered from
/// `first_index`: a row joins the step of its node visit (the last step,
/// in practice: only the last step gets attempts), or starts the next step.
pub fn fold_steps(rows: &[AttemptRow], first_index: usize) -> Vec<StepDoc> {
    let mut steps: Vec<StepDoc> = Vec::new();
    let mut index: std::collections::HashMap<(&str, i64), usize> = Default::default();
    for row in rows {
        match index.get(&(row.node_id.as_str(), row.visit)) {
            Some(&at) => steps[at].add(row),
            None => {
                index.insert((row.node_id.as_str(), row.visit), steps.len());
                steps.push(StepDoc::new(first_index + steps.len(), row));
            }
        }
    }
    steps
}

fn shown_step(mut step: Value) -> Value {
    if let Some(attempts) = step.get_mut("attempts").and_then(Value::as_array_mut)
        && attempts.len() > STEP_ATTEMPTS_SHOWN
    {
        attempts.drain(..attempts.len() - STEP_ATTEMPTS_SHOWN);
    }
    step
}

/// A node's entry: its visits, and its state from its last step's outcome,
/// the run's unfinished attempt and the checkpoint it waits at.
pub fn node_entry(
    node: &kernel::topology::NodeSpec,
    visits: u64,
    last_outcome: Option<&str>,
    agg: &RunAggregate,
) -> Value {
    let unfinished = agg
        .attempt
        .as_ref()
        .filter(|attempt| attempt.status.is_unfinished() && attempt.node_id == node.id);
    let state = match (unfinished.map(|attempt| attempt.status), last_outcome) {
        (Some(kernel::attempt::AttemptStatus::Waiting), _) => "waiting",
        (Some(_), _) => "running",
        (None, Some("ok")) if agg.run.waiting_on.as_ref() == Some(&node.id) => "waiting",
        (None, Some("ok")) => "completed",
        (None, Some("failed")) => "failed",
        (None, Some("timed_out")) => "timed_out",
        (None, Some("cancelled")) => "cancelled",
        _ => "pending",
    };
    json!({ "id": node.id.as_str(), "nodeType": codec_name(&node.node_type), "visits": visits, "state": state })
}

/// The nodes whose entry depends on the run's unfinished attempt or its
/// checkpoint (a change of either changes only these entries).
pub fn hot_nodes(agg: &RunAggregate) -> Vec<String> {
    let mut nodes = Vec::new();
    if let Some(attempt) = agg
        .attempt
        .as_ref()
        .filter(|attempt| attempt.status.is_unfinished())
    {
        nodes.push(attempt.node_id.as_str().to_owned());
    }
    if let Some(node) = &agg.run.waiting_on
        && !nodes.iter().any(|known| known == node.as_str())
    {
        nodes.push(node.as_str().to_owned());
    }
    nodes
}

/// The facts of a header that are not in the aggregate.
#[derive(Debug)]
pub struct HeaderFacts<'a> {
    pub workflow_name: &'a str,
    pub title: Option<&'a str>,
    pub error_message: Option<&'a str>,
    /// The display object, its long reason already a reference.
    pub display: Value,
    pub definition: Value,
    pub graph_history: Value,
}

/// The header document: `status`, `display`, timestamps, `failure`,
/// `title`, `workflowName`, `lineage` and the content references.
pub fn header(agg: &RunAggregate, facts: HeaderFacts<'_>) -> Map<String, Value> {
    let mut header = Map::new();
    header.insert("workflowName".into(), json!(facts.workflow_name));
    if let Some(title) = facts.title.filter(|title| !title.is_empty()) {
        header.insert(
            "title".into(),
            json!(title.chars().take(200).collect::<String>()),
        );
    }
    header.insert(
        "status".into(),
        json!({
            "run": codec_name(&agg.run.status),
            "queue": codec_name(&agg.run.queue),
            "paused": agg.run.paused,
            "executionMode": if agg.run.mode.origin_session().is_some() { "interactive" } else { "headless" },
        }),
    );
    header.insert("display".into(), facts.display);
    header.insert("createdAtMs".into(), json!(agg.run.created_at_ms));
    header.insert("updatedAtMs".into(), json!(agg.run.updated_at_ms));
    if let Some(finished) = agg.run.finished_at_ms {
        header.insert("finishedAtMs".into(), json!(finished));
    }
    if let Some(error) = &agg.run.error {
        let message = facts
            .error_message
            .filter(|message| !message.is_empty())
            .map_or_else(|| error_description(error), str::to_owned);
        header.insert(
            "failure".into(),
            json!({ "class": codec_name(&error.class), "message": message.chars().take(512).collect::<String>() }),
        );
    }
    if let Some(lineage) = lineage_value(agg) {
        header.insert("lineage".into(), lineage);
    }
    header.insert("definition".into(), facts.definition);
    header.insert("graphHistory".into(), facts.graph_history);
    header
}

/// The display object from the kernel's reducer (its reason in words, not
/// yet bounded).
pub fn display_value(
    agg: &RunAggregate,
    outside: OutsideFacts,
    detail: &ReasonDetail<'_>,
) -> Value {
    let display = display::display(&DisplayFacts::from_run(agg, outside));
    let mut value = json!({
        "status": codec_name(&display.status),
        "activity": codec_name(&display.activity),
        "controls": display.controls.iter().map(codec_name).collect::<Vec<_>>(),
    });
    if let Some(node) = &display.current_node {
        value["currentNode"] = json!(node.as_str());
    }
    if let Some(node) = &display.waiting_on {
        value["waitingOn"] = json!(node.as_str());
    }
    if let Some(reason) = display.reason.as_ref() {
        value["reason"] = json!(reason_text(reason, detail));
    }
    value
}

/// The inline step page: `items` (the leading shown steps), the total and
/// the cursor of the first paged step.
pub fn step_page(items: Vec<Value>, total: usize) -> Value {
    let shown = items.len();
    let mut page = json!({ "items": items, "total": total });
    if total > shown {
        page["nextCursor"] = json!(shown.to_string());
    }
    page
}

/// The inline update page, exactly as a snapshot and a patch carry it.
pub fn update_page(items: &[Value], total: usize) -> Value {
    let mut page = json!({ "items": items, "total": total });
    if total > items.len() {
        page["nextCursor"] = json!(items.len().to_string());
    }
    page
}

/// Assembles the view document from its parts.
pub fn document(
    run_id: &RunId,
    revision: u64,
    header: &Map<String, Value>,
    nodes: Vec<Value>,
    topology: Option<&Topology>,
    steps: Value,
    updates: Value,
) -> Value {
    let mut view = Map::new();
    view.insert("schema".into(), json!("pi-workflows.run-view.v1"));
    view.insert("runId".into(), json!(run_id.as_str()));
    view.insert("revision".into(), json!(revision));
    for (key, value) in header {
        view.insert(key.clone(), value.clone());
    }
    view.insert("nodes".into(), Value::Array(nodes));
    view.insert("edges".into(), Value::Array(edges(topology)));
    view.insert("steps".into(), steps);
    view.insert("updates".into(), updates);
    Value::Object(view)
}

/// The run's lineage, when it has any.
pub fn lineage_value(agg: &RunAggregate) -> Option<Value> {
    let lineage = &agg.run.lineage;
    let mut value = Map::new();
    if let Some(of) = &lineage.continuation_of {
        value.insert(
            "continuationOf".into(),
            json!({ "runId": of.parent_run_id.as_str(), "checkpoint": of.checkpoint.as_str() }),
        );
    }
    if let Some(child) = &lineage.continued_by {
        value.insert("continuedBy".into(), json!(child.as_str()));
    }
    if let Some(restart) = &lineage.restart {
        value.insert("restartOf".into(), json!(restart.parent_run_id.as_str()));
    }
    (!value.is_empty()).then_some(Value::Object(value))
}

/// What a run error means, in words (the stored message adds the detail).
pub fn error_description(error: &kernel::run::RunError) -> String {
    use kernel::run::ReasonKind;
    let node = error
        .node_id
        .as_ref()
        .map_or("a node", |node| node.as_str());
    match error.reason {
        ReasonKind::NodeFailed => format!("node {node} failed"),
        ReasonKind::NodeTimedOut => format!("node {node} timed out"),
        ReasonKind::MaxSteps => "the run reached its maxSteps limit".into(),
        ReasonKind::Routing => format!("no edge from node {node} matched its output"),
        ReasonKind::UnproductiveTurns => {
            format!("agent step {node} ended too many turns without an output")
        }
        ReasonKind::DecisionExpired => format!("the human decision at {node} expired"),
        ReasonKind::WorkerCrashed => "the runner crashed repeatedly".into(),
        ReasonKind::RunnerFailed => "the runner failed".into(),
    }
}

/// The stored facts a reason's words come from (beside the kernel's reason).
#[derive(Debug)]
pub struct ReasonDetail<'a> {
    /// The message text of a failed run's error.
    pub error_message: Option<&'a str>,
    pub terminal: bool,
    /// The check a `protocolRejected` run's runner message failed.
    pub protocol_check: Option<ProtocolCheck>,
}

fn reason_text(reason: &DisplayReason, detail: &ReasonDetail<'_>) -> String {
    let terminal = detail.terminal;
    match reason {
        DisplayReason::Error { error } => match detail.error_message.filter(|message| !message.is_empty()) {
            Some(message) => format!("{}: {message}", error_description(error)),
            None => error_description(error),
        },
        // This server version cannot confirm or retry an effect yet
        // (`effect.recover` answers `unavailable`): say what can be done now.
        DisplayReason::EffectAmbiguous if terminal => {
            "An external effect may have applied without a receipt; check the external system (this server version cannot confirm or retry the effect).".into()
        }
        DisplayReason::EffectAmbiguous => {
            "An external effect may have applied without a receipt, so the run cannot continue; check the external system, then cancel the run (this server version cannot confirm or retry the effect).".into()
        }
        // The display status stays `queued` (the closed set); the reason
        // says first that the run waits for the user, then why.
        DisplayReason::ParkedForReview { park_reason } => {
            let (why, next) = match park_reason {
                ParkReason::RunnerNoProgress => (
                    "the runner exited before the run made progress",
                    "Fix the cause, then resume or cancel the run.",
                ),
                ParkReason::WorkflowSourceChanged => (
                    "the workflow source changed since the run started",
                    "Restore the source and resume, or cancel the run.",
                ),
                ParkReason::WorkerTimedOut => (
                    "the runner did not start in time",
                    "Resume to try again, or cancel the run.",
                ),
                ParkReason::ProtocolRejected => {
                    let why = match detail.protocol_check {
                        Some(ProtocolCheck::Schema) => "a runner message failed the protocol's schema check (protocolRejected)",
                        Some(ProtocolCheck::Revision) => "a runner message failed the protocol's revision check (protocolRejected)",
                        Some(ProtocolCheck::Attempt) => "a runner message failed the protocol's attempt check (protocolRejected)",
                        Some(ProtocolCheck::Idempotency) => "a runner message failed the protocol's idempotency check (protocolRejected)",
                        None => "a runner message failed a protocol check (protocolRejected)",
                    };
                    (why, "Fix or update the runner, then resume or cancel the run.")
                }
                // Parks that resume on their own are never parked for review.
                ParkReason::Drained
                | ParkReason::Recovered
                | ParkReason::WorkerCrashed
                | ParkReason::ResumeReady
                | ParkReason::Paused
                | ParkReason::EffectAmbiguous
                | ParkReason::Held => (
                    "it is parked",
                    "Resume or cancel the run.",
                ),
            };
            format!("Needs an explicit resume or cancel: {why}, so the run will not start again on its own. {next}")
        }
    }
}

/// What a piece of generated content is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentRole {
    Definition,
    GraphHistory,
    Reason,
}

impl ContentRole {
    /// The role's column value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Definition => "definition",
            Self::GraphHistory => "graphHistory",
            Self::Reason => "reason",
        }
    }
}

/// How many generated contents of one role a run keeps; an older reference
/// reads as unavailable and the client takes a fresh view.
pub const RETAINED_CONTENTS: i64 = 16;

/// A content reference to `bytes` bytes with `digest`.
pub fn content_reference(digest: &kernel::ids::Digest, media_type: &str, bytes: usize) -> Value {
    json!({ "digest": crate::ids::digest_text(digest), "mediaType": media_type, "bytes": bytes })
}

/// Moves a reason above the inline limit out of `display`: a notice plus
/// `reference` (made by the caller from the reason's bytes).
pub fn long_reason(display: &Value) -> Option<String> {
    display
        .get("reason")
        .and_then(Value::as_str)
        .filter(|reason| reason.chars().count() > INLINE_REASON_CHARS)
        .map(str::to_owned)
}

/// Replaces the long reason of `display` with its notice and reference.
pub fn bound_reason(display: &mut Value, reference: Value) {
    let object = display.as_object_mut().expect("display is an object");
    object.remove("reason");
    object.insert(
        "reasonNotice".into(),
        json!("The reason is longer than 16 KiB; read it through reasonContent."),
    );
    object.insert("reasonContent".into(), reference);
}

pub fn edges(topology: Option<&Topology>) -> Vec<Value> {
    let Some(topology) = topology else {
        return Vec::new();
    };
    let mut edges = Vec::new();
    for edge in &topology.edges {
        match edge {
            kernel::topology::Edge::Plain { from, to } => {
                edges.push(json!({ "from": from.as_str(), "to": to.as_str() }))
            }
            kernel::topology::Edge::Switch { from, cases, .. } => {
                for (case, to) in cases {
                    edges.push(json!({ "from": from.as_str(), "to": to.as_str(), "label": case.chars().take(200).collect::<String>() }));
                }
            }
        }
    }
    edges
}

/// The encoded bytes of the `nodes` and `edges` a view of `topology` shows,
/// at their largest (every node at its longest state and visit count).
pub fn graph_projection_bytes(topology: &Topology) -> usize {
    let nodes: usize = topology
        .nodes
        .iter()
        .map(|node| {
            encoded_len(&json!({ "id": node.id.as_str(), "nodeType": codec_name(&node.node_type), "visits": u32::MAX, "state": "completed" }))
        })
        .sum();
    let edges: usize = edges(Some(topology)).iter().map(encoded_len).sum();
    nodes + edges
}
