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

use kernel::display::{self, DisplayFacts, DisplayReason, OutsideFacts};
use kernel::ids::RunId;
use kernel::run::{ParkReason, RunAggregate};
use kernel::runner::ProtocolCheck;
use kernel::topology::Topology;
use protocol::generated::constrained as bounded;
use protocol::generated::types as wire;
use serde::{Deserialize, Serialize};

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

/// A stored fact that does not fit the view's schema (a server defect: the
/// read or commit that builds the document fails instead of sending it).
/// Names the field only, never its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffSchema(pub &'static str);

impl std::fmt::Display for OffSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a view fact does not fit its schema: {}", self.0)
    }
}

impl std::error::Error for OffSchema {}

impl From<OffSchema> for rusqlite::Error {
    fn from(error: OffSchema) -> Self {
        rusqlite::Error::ToSqlConversionFailure(Box::new(error))
    }
}

/// `value` (a kernel id or enum, a stored name) as its wire type.
pub fn to_wire<W: serde::de::DeserializeOwned>(
    field: &'static str,
    value: impl Serialize,
) -> Result<W, OffSchema> {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| serde_json::from_value(value).ok())
        .ok_or(OffSchema(field))
}

/// A stored millisecond timestamp as its wire type.
pub fn timestamp(field: &'static str, ms: i64) -> Result<bounded::TimestampMs, OffSchema> {
    u64::try_from(ms)
        .ok()
        .and_then(bounded::TimestampMs::new)
        .ok_or(OffSchema(field))
}

/// A count as its wire type.
pub fn count(field: &'static str, n: usize) -> Result<bounded::Count, OffSchema> {
    bounded::Count::new(n as u64).ok_or(OffSchema(field))
}

/// A presentation revision as its wire type.
pub fn revision(revision: u64) -> Result<bounded::Revision, OffSchema> {
    bounded::Revision::new(revision).ok_or(OffSchema("revision"))
}

/// A page cursor (the position of the first item not shown).
pub fn cursor(position: usize) -> Result<wire::Cursor, OffSchema> {
    to_wire("nextCursor", position.to_string())
}

/// The canonical (wire) length of a document.
pub fn encoded_len<T: Serialize>(value: &T) -> usize {
    protocol::canonicalize_typed(value).map_or(usize::MAX, |bytes| bytes.len())
}

/// The canonical (wire) text of a document (empty when not encodable,
/// never for the documents of a view).
pub fn canonical_text<T: Serialize>(value: &T) -> String {
    protocol::canonicalize_typed(value)
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
    pub outcome: Option<wire::NodeOutcome>,
    /// The complete step document (every attempt).
    pub value: wire::StepRecord,
}

impl StepDoc {
    /// A step that starts with `row`.
    pub fn new(index: usize, row: &AttemptRow) -> Result<Self, OffSchema> {
        let value = wire::StepRecord {
            attempts: Vec::new(),
            finished_at_ms: None,
            node_id: to_wire("nodeId", &row.node_id)?,
            outcome: None,
            seq: bounded::Sequence::new(index as u64).ok_or(OffSchema("seq"))?,
            started_at_ms: timestamp("startedAtMs", row.started_at_ms)?,
            visit: u64::try_from(row.visit)
                .ok()
                .and_then(bounded::Visit::new)
                .ok_or(OffSchema("visit"))?,
        };
        let mut step = Self {
            index,
            node_id: row.node_id.clone(),
            visit: row.visit,
            first_seq: row.seq,
            outcome: None,
            value,
        };
        step.add(row)?;
        Ok(step)
    }

    /// Whether `row` is another attempt of this step.
    pub fn holds(&self, row: &AttemptRow) -> bool {
        self.node_id == row.node_id && self.visit == row.visit
    }

    /// Adds the next attempt row of this step.
    pub fn add(&mut self, row: &AttemptRow) -> Result<(), OffSchema> {
        let outcome: Option<wire::NodeOutcome> = row
            .outcome
            .as_ref()
            .map(|outcome| to_wire("outcome", outcome))
            .transpose()?;
        let finished_at_ms = row
            .finished_at_ms
            .map(|ms| timestamp("finishedAtMs", ms))
            .transpose()?;
        let attempts = &mut self.value.attempts;
        attempts.push(wire::AttemptRecord {
            attempt_id: to_wire("attemptId", &row.attempt_id)?,
            attempt_number: bounded::AttemptNumber::new(attempts.len() as u64 + 1)
                .ok_or(OffSchema("attemptNumber"))?,
            finished_at_ms,
            outcome,
            started_at_ms: timestamp("startedAtMs", row.started_at_ms)?,
        });
        if row.status == "finished" {
            self.value.finished_at_ms = finished_at_ms;
            self.value.outcome = outcome;
            self.outcome = outcome;
        } else {
            self.value.finished_at_ms = None;
            self.value.outcome = None;
            self.outcome = None;
        }
        Ok(())
    }

    /// The step as a view shows it: its newest [`STEP_ATTEMPTS_SHOWN`]
    /// attempts (unchanged when it has no more).
    pub fn shown(&self) -> wire::StepRecord {
        let mut step = self.value.clone();
        if step.attempts.len() > STEP_ATTEMPTS_SHOWN {
            step.attempts
                .drain(..step.attempts.len() - STEP_ATTEMPTS_SHOWN);
        }
        step
    }

    /// Whether the view shows fewer attempts than the step has.
    pub fn is_cut(&self) -> bool {
        self.value.attempts.len() > STEP_ATTEMPTS_SHOWN
    }
}

/// Folds attempt rows (in `seq` order) into steps numbered from
/// `first_index`: a row joins the step of its node visit (the last step,
/// in practice: only the last step gets attempts), or starts the next step.
pub fn fold_steps(rows: &[AttemptRow], first_index: usize) -> Result<Vec<StepDoc>, OffSchema> {
    let mut steps: Vec<StepDoc> = Vec::new();
    let mut index: std::collections::HashMap<(&str, i64), usize> = Default::default();
    for row in rows {
        match index.get(&(row.node_id.as_str(), row.visit)) {
            Some(&at) => steps[at].add(row)?,
            None => {
                index.insert((row.node_id.as_str(), row.visit), steps.len());
                steps.push(StepDoc::new(first_index + steps.len(), row)?);
            }
        }
    }
    Ok(steps)
}

/// A node's entry: its visits, and its state from its last step's outcome,
/// the run's unfinished attempt and the checkpoint it waits at.
pub fn node_entry(
    node: &kernel::topology::NodeSpec,
    visits: u64,
    last_outcome: Option<wire::NodeOutcome>,
    agg: &RunAggregate,
) -> Result<wire::GraphNode, OffSchema> {
    use wire::{NodeOutcome as Outcome, NodeState as State};
    let unfinished = agg
        .attempt
        .as_ref()
        .filter(|attempt| attempt.status.is_unfinished() && attempt.node_id == node.id);
    let state = match (unfinished.map(|attempt| attempt.status), last_outcome) {
        (Some(kernel::attempt::AttemptStatus::Waiting), _) => State::Waiting,
        (Some(_), _) => State::Running,
        (None, Some(Outcome::Ok)) if agg.run.waiting_on.as_ref() == Some(&node.id) => {
            State::Waiting
        }
        (None, Some(Outcome::Ok)) => State::Completed,
        (None, Some(Outcome::Failed)) => State::Failed,
        (None, Some(Outcome::TimedOut)) => State::TimedOut,
        (None, Some(Outcome::Cancelled)) => State::Cancelled,
        (None, None) => State::Pending,
    };
    graph_node(node, visits, state)
}

fn graph_node(
    node: &kernel::topology::NodeSpec,
    visits: u64,
    state: wire::NodeState,
) -> Result<wire::GraphNode, OffSchema> {
    Ok(wire::GraphNode {
        id: to_wire("id", &node.id)?,
        node_type: to_wire("nodeType", node.node_type)?,
        state,
        visits: bounded::Count::new(visits).ok_or(OffSchema("visits"))?,
    })
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
    pub display: bounded::Display,
    pub definition: wire::ContentReference,
    pub graph_history: wire::ContentReference,
    /// The request of the run's pending protected decision, when it has one.
    pub decision_request: Option<&'a wire::HumanDecisionRequest>,
    /// The settings revisions the run saw (`store::settings`), when bound.
    pub settings: Option<kernel::settings::Binding>,
}

/// The header of a run view: every [`wire::RunView`] field that is not the
/// run id, the revision, a node, an edge, a step or an update (those are
/// stored as their own rows). [`document`] moves each field into the
/// generated `RunView`, so the compiler holds the two to the same types.
/// Stored as `viewer_runs.header_json`; a patch replaces a field whole.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    #[serde(rename = "ambiguousEffects", skip_serializing_if = "Option::is_none")]
    pub ambiguous_effects: Option<bounded::AmbiguousEffects>,
    #[serde(rename = "createdAtMs")]
    pub created_at_ms: bounded::TimestampMs,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<wire::DecisionView>,
    pub definition: wire::ContentReference,
    pub display: bounded::Display,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<wire::RunFailure>,
    #[serde(rename = "finishedAtMs", skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<bounded::TimestampMs>,
    #[serde(rename = "graphHistory")]
    pub graph_history: wire::ContentReference,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lineage: Option<wire::Lineage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<wire::SettingsRevisions>,
    pub status: wire::StatusFacts,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<wire::Title>,
    #[serde(rename = "updatedAtMs")]
    pub updated_at_ms: bounded::TimestampMs,
    #[serde(rename = "workflowName")]
    pub workflow_name: wire::WorkflowName,
}

impl Header {
    /// The patch operations from `before` (none before the first revision)
    /// to `self`: an `add` or `replace` per changed field in key order,
    /// then a `remove` per field that went away.
    pub fn diff(
        &self,
        before: Option<&Self>,
        ops: &mut Vec<wire::PatchOp>,
    ) -> Result<(), OffSchema> {
        let mut removed = Vec::new();
        let mut diff = Diff {
            ops,
            removed: &mut removed,
        };
        diff.field(
            "/ambiguousEffects",
            before.and_then(|b| b.ambiguous_effects.as_ref()),
            self.ambiguous_effects.as_ref(),
        )?;
        diff.field(
            "/createdAtMs",
            before.map(|b| &b.created_at_ms),
            Some(&self.created_at_ms),
        )?;
        diff.field(
            "/decision",
            before.and_then(|b| b.decision.as_ref()),
            self.decision.as_ref(),
        )?;
        diff.field(
            "/definition",
            before.map(|b| &b.definition),
            Some(&self.definition),
        )?;
        diff.field("/display", before.map(|b| &b.display), Some(&self.display))?;
        diff.field(
            "/failure",
            before.and_then(|b| b.failure.as_ref()),
            self.failure.as_ref(),
        )?;
        diff.field(
            "/finishedAtMs",
            before.and_then(|b| b.finished_at_ms.as_ref()),
            self.finished_at_ms.as_ref(),
        )?;
        diff.field(
            "/graphHistory",
            before.map(|b| &b.graph_history),
            Some(&self.graph_history),
        )?;
        diff.field(
            "/lineage",
            before.and_then(|b| b.lineage.as_ref()),
            self.lineage.as_ref(),
        )?;
        diff.field(
            "/settings",
            before.and_then(|b| b.settings.as_ref()),
            self.settings.as_ref(),
        )?;
        diff.field("/status", before.map(|b| &b.status), Some(&self.status))?;
        diff.field(
            "/title",
            before.and_then(|b| b.title.as_ref()),
            self.title.as_ref(),
        )?;
        diff.field(
            "/updatedAtMs",
            before.map(|b| &b.updated_at_ms),
            Some(&self.updated_at_ms),
        )?;
        diff.field(
            "/workflowName",
            before.map(|b| &b.workflow_name),
            Some(&self.workflow_name),
        )?;
        ops.extend(removed);
        Ok(())
    }
}

/// The operations of a header diff, its removals kept for the end.
struct Diff<'a> {
    ops: &'a mut Vec<wire::PatchOp>,
    removed: &'a mut Vec<wire::PatchOp>,
}

impl Diff<'_> {
    fn field<T: Serialize + PartialEq>(
        &mut self,
        path: &'static str,
        before: Option<&T>,
        after: Option<&T>,
    ) -> Result<(), OffSchema> {
        let op = match (before, after) {
            (Some(old), Some(new)) if old == new => return Ok(()),
            (None, None) => return Ok(()),
            (Some(_), Some(new)) => wire::PatchOp::Replace {
                path: pointer(path)?,
                value: patch_value(new)?,
            },
            (None, Some(new)) => wire::PatchOp::Add {
                path: pointer(path)?,
                value: patch_value(new)?,
            },
            (Some(_), None) => {
                self.removed.push(wire::PatchOp::Remove {
                    path: pointer(path)?,
                });
                return Ok(());
            }
        };
        self.ops.push(op);
        Ok(())
    }
}

/// A JSON pointer into the view document.
pub fn pointer(path: impl Into<String>) -> Result<wire::JsonPointer, OffSchema> {
    wire::JsonPointer::try_from(path.into()).map_err(|_| OffSchema("path"))
}

/// The value of a patch operation (a typed document, as the patch's
/// any-JSON `value`).
pub fn patch_value<T: Serialize + ?Sized>(value: &T) -> Result<serde_json::Value, OffSchema> {
    serde_json::to_value(value).map_err(|_| OffSchema("value"))
}

/// The header document: `status`, `display`, timestamps, `failure`,
/// `title`, `workflowName`, `lineage` and the content references.
pub fn header(agg: &RunAggregate, facts: HeaderFacts<'_>) -> Result<Header, OffSchema> {
    let failure = match &agg.run.error {
        Some(error) => {
            let message = facts
                .error_message
                .filter(|message| !message.is_empty())
                .map_or_else(|| error_description(error), str::to_owned);
            Some(wire::RunFailure {
                class: to_wire("failure.class", error.class)?,
                message: to_wire(
                    "failure.message",
                    message.chars().take(512).collect::<String>(),
                )?,
            })
        }
        None => None,
    };
    Ok(Header {
        ambiguous_effects: ambiguous_effects(agg)?,
        created_at_ms: bounded::TimestampMs::new(agg.run.created_at_ms)
            .ok_or(OffSchema("createdAtMs"))?,
        decision: decision_view(agg, facts.decision_request)?,
        definition: facts.definition,
        display: facts.display,
        failure,
        finished_at_ms: agg
            .run
            .finished_at_ms
            .map(|ms| bounded::TimestampMs::new(ms).ok_or(OffSchema("finishedAtMs")))
            .transpose()?,
        graph_history: facts.graph_history,
        lineage: lineage_value(agg)?,
        settings: facts
            .settings
            .map(|binding| {
                Ok(wire::SettingsRevisions {
                    project: revision(binding.project)?,
                    user: revision(binding.user)?,
                })
            })
            .transpose()?,
        status: wire::StatusFacts {
            execution_mode: if agg.run.mode.origin_session().is_some() {
                wire::ExecutionMode::Interactive
            } else {
                wire::ExecutionMode::Headless
            },
            paused: agg.run.paused,
            queue: to_wire("status.queue", agg.run.queue)?,
            run: to_wire("status.run", agg.run.status)?,
        },
        title: facts
            .title
            .filter(|title| !title.is_empty())
            .map(|title| to_wire("title", title.chars().take(200).collect::<String>()))
            .transpose()?,
        updated_at_ms: bounded::TimestampMs::new(agg.run.updated_at_ms)
            .ok_or(OffSchema("updatedAtMs"))?,
        workflow_name: to_wire("workflowName", facts.workflow_name)?,
    })
}

/// The run's ambiguous effects (the first 16), each needing
/// `effect.recover`; absent when there is none.
fn ambiguous_effects(agg: &RunAggregate) -> Result<Option<bounded::AmbiguousEffects>, OffSchema> {
    use kernel::effect::EffectState;
    let effects = agg
        .effects
        .iter()
        .filter(|effect| effect.state == EffectState::Ambiguous)
        .take(16)
        .map(|effect| {
            Ok(wire::AmbiguousEffect {
                attempt_number: bounded::AttemptNumber::new(u64::from(effect.attempt_number))
                    .ok_or(OffSchema("ambiguousEffects.attemptNumber"))?,
                effect_id: to_wire("ambiguousEffects.effectId", effect.effect_id.as_str())?,
                effect_type: to_wire("ambiguousEffects.effectType", &effect.key.effect_type)?,
                node_id: to_wire("ambiguousEffects.nodeId", effect.key.node_path.as_str())?,
            })
        })
        .collect::<Result<Vec<_>, OffSchema>>()?;
    if effects.is_empty() {
        return Ok(None);
    }
    bounded::AmbiguousEffects::new(effects)
        .map(Some)
        .map_err(|_| OffSchema("ambiguousEffects"))
}

/// What a waiting run shows of its pending protected decision: enough to
/// answer it, never its subject or who answered. Absent without a pending
/// decision (or its request).
fn decision_view(
    agg: &RunAggregate,
    request: Option<&wire::HumanDecisionRequest>,
) -> Result<Option<wire::DecisionView>, OffSchema> {
    use kernel::decision::DecisionStatus;
    let (Some(decision), Some(request)) = (
        agg.decision
            .as_ref()
            .filter(|decision| decision.status == DecisionStatus::Pending),
        request,
    ) else {
        return Ok(None);
    };
    Ok(Some(wire::DecisionView {
        choices: request.choices.clone(),
        decision_id: request.decision_id.clone(),
        default_choice: request
            .default_response
            .as_ref()
            .map(|default| default.choice.clone()),
        expires_at_ms: decision
            .deadline_at_ms
            .map(|ms| bounded::TimestampMs::new(ms).ok_or(OffSchema("decision.expiresAtMs")))
            .transpose()?,
        node_id: to_wire("decision.nodeId", decision.node_id.as_str())?,
        request_digest: request.request_digest.clone(),
        summary: request.presentation.summary.clone(),
        title: to_wire("decision.title", request.title.as_str())?,
    }))
}

/// The display fields from the kernel's reducer, without their reason, and
/// the reason in words (not yet bounded: [`bound_display`] places it).
pub fn display_value(
    agg: &RunAggregate,
    outside: OutsideFacts,
    detail: &ReasonDetail<'_>,
) -> Result<(wire::DisplayFields, Option<String>), OffSchema> {
    let display = display::display(&DisplayFacts::from_run(agg, outside));
    let why = kernel::why::headline(&kernel::why::WhyFacts::from_run(
        agg,
        kernel::why::OutsideFacts {
            validating: outside.submission_validating,
            restart_eligible: outside.restart_eligible,
            ..kernel::why::OutsideFacts::default()
        },
    ));
    let controls: Vec<wire::Control> = display
        .controls
        .iter()
        .map(|control| to_wire("controls", control))
        .collect::<Result<_, _>>()?;
    let fields = wire::DisplayFields {
        activity: to_wire("activity", display.activity)?,
        controls: to_wire("controls", controls)?,
        current_node: display
            .current_node
            .as_ref()
            .map(|node| to_wire("currentNode", node))
            .transpose()?,
        reason: None,
        reason_content: None,
        reason_notice: None,
        status: to_wire("status", display.status)?,
        waiting_on: display
            .waiting_on
            .as_ref()
            .map(|node| to_wire("waitingOn", node))
            .transpose()?,
        why: Some(super::why::headline(&why)?),
    };
    let reason = display
        .reason
        .as_ref()
        .map(|reason| reason_text(reason, detail));
    Ok((fields, reason))
}

/// Whether a reason is too long to be inline (it becomes a reference).
pub fn is_long_reason(reason: &str) -> bool {
    reason.chars().count() > INLINE_REASON_CHARS
}

/// The display object: `reason` inline, or, for a long reason, its notice
/// and `reference` (made by the caller from the reason's bytes).
pub fn bound_display(
    mut fields: wire::DisplayFields,
    reason: Option<String>,
    reference: Option<wire::ContentReference>,
) -> Result<bounded::Display, OffSchema> {
    match reference {
        Some(reference) => {
            fields.reason_notice = Some(to_wire(
                "reasonNotice",
                "The reason is longer than 16 KiB; read it through reasonContent.",
            )?);
            fields.reason_content = Some(reference);
        }
        None => {
            fields.reason = reason.map(|reason| to_wire("reason", reason)).transpose()?;
        }
    }
    bounded::Display::new(fields).map_err(|_| OffSchema("display"))
}

/// The inline step page: `items` (the leading shown steps), the total and
/// the cursor of the first paged step.
pub fn step_page(items: Vec<wire::StepRecord>, total: usize) -> Result<wire::StepPage, OffSchema> {
    let shown = items.len();
    Ok(wire::StepPage {
        items,
        next_cursor: (total > shown).then(|| cursor(shown)).transpose()?,
        total: count("steps.total", total)?,
    })
}

/// The inline update page, exactly as a snapshot and a patch carry it.
pub fn update_page(
    items: Vec<wire::UpdateRecord>,
    total: usize,
) -> Result<wire::UpdatePage, OffSchema> {
    let shown = items.len();
    Ok(wire::UpdatePage {
        items,
        next_cursor: (total > shown).then(|| cursor(shown)).transpose()?,
        total: count("updates.total", total)?,
    })
}

/// Assembles the view document from its parts.
pub fn document(
    run_id: &RunId,
    revision: u64,
    header: Header,
    nodes: Vec<wire::GraphNode>,
    topology: Option<&Topology>,
    steps: wire::StepPage,
    updates: wire::UpdatePage,
) -> Result<wire::RunView, OffSchema> {
    let Header {
        ambiguous_effects,
        created_at_ms,
        decision,
        definition,
        display,
        failure,
        finished_at_ms,
        graph_history,
        lineage,
        settings,
        status,
        title,
        updated_at_ms,
        workflow_name,
    } = header;
    Ok(wire::RunView {
        ambiguous_effects,
        created_at_ms,
        decision,
        definition,
        display,
        edges: edges(topology)?,
        failure,
        finished_at_ms,
        graph_history,
        lineage,
        nodes,
        revision: self::revision(revision)?,
        run_id: to_wire("runId", run_id)?,
        schema: wire::RunViewSchemaId::PiWorkflowsRunViewV1,
        settings,
        status,
        steps,
        title,
        updated_at_ms,
        updates,
        workflow_name,
    })
}

/// The run's lineage, when it has any.
pub fn lineage_value(agg: &RunAggregate) -> Result<Option<wire::Lineage>, OffSchema> {
    let lineage = &agg.run.lineage;
    let value = wire::Lineage {
        continuation_of: lineage
            .continuation_of
            .as_ref()
            .map(|of| {
                Ok(wire::ContinuationOf {
                    checkpoint: to_wire("lineage.continuationOf.checkpoint", &of.checkpoint)?,
                    run_id: to_wire("lineage.continuationOf.runId", &of.parent_run_id)?,
                })
            })
            .transpose()?,
        continued_by: lineage
            .continued_by
            .as_ref()
            .map(|child| to_wire("lineage.continuedBy", child))
            .transpose()?,
        restart_of: lineage
            .restart
            .as_ref()
            .map(|restart| to_wire("lineage.restartOf", &restart.parent_run_id))
            .transpose()?,
    };
    Ok((value != wire::Lineage::default()).then_some(value))
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
        DisplayReason::EffectAmbiguous if terminal => {
            "An external effect may have applied without a receipt; check the external system, then record what you saw with effect.recover confirm (the run ended, so it cannot retry).".into()
        }
        DisplayReason::EffectAmbiguous => {
            "An external effect may have applied without a receipt, so the run cannot continue on its own; check the external system, then effect.recover confirm (it applied) or retry (apply it again: a duplicate is possible).".into()
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
pub fn content_reference(
    digest: &kernel::ids::Digest,
    media_type: &str,
    bytes: usize,
) -> Result<wire::ContentReference, OffSchema> {
    Ok(wire::ContentReference {
        bytes: bounded::ByteCount::new(bytes as u64).ok_or(OffSchema("bytes"))?,
        digest: to_wire("digest", crate::ids::digest_text(digest))?,
        media_type: to_wire("mediaType", media_type)?,
    })
}

/// The graph's edges as a view shows them (a switch gives one labelled
/// edge per case).
pub fn edges(topology: Option<&Topology>) -> Result<Vec<wire::GraphEdge>, OffSchema> {
    let Some(topology) = topology else {
        return Ok(Vec::new());
    };
    let mut edges = Vec::new();
    for edge in &topology.edges {
        match edge {
            kernel::topology::Edge::Plain { from, to } => edges.push(wire::GraphEdge {
                from: to_wire("edge.from", from)?,
                label: None,
                to: to_wire("edge.to", to)?,
            }),
            kernel::topology::Edge::Switch { from, cases, .. } => {
                for (case, to) in cases {
                    edges.push(wire::GraphEdge {
                        from: to_wire("edge.from", from)?,
                        label: Some(to_wire(
                            "edge.label",
                            case.chars().take(200).collect::<String>(),
                        )?),
                        to: to_wire("edge.to", to)?,
                    });
                }
            }
        }
    }
    Ok(edges)
}

/// The encoded bytes of the `nodes` and `edges` a view of `topology` shows,
/// at their largest (every node at its longest state and visit count).
/// `usize::MAX` when a node or edge does not fit the view's schema.
pub fn graph_projection_bytes(topology: &Topology) -> usize {
    let nodes: Result<usize, OffSchema> = topology
        .nodes
        .iter()
        .map(|node| {
            graph_node(node, u64::from(u32::MAX), wire::NodeState::Completed)
                .map(|entry| encoded_len(&entry))
        })
        .sum();
    let edges = edges(Some(topology)).map(|edges| edges.iter().map(encoded_len).sum::<usize>());
    match (nodes, edges) {
        (Ok(nodes), Ok(edges)) => nodes + edges,
        _ => usize::MAX,
    }
}
