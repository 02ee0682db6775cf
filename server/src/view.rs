//! The live run view (`pi-workflows.run-view.v1`) built from one consistent
//! read of committed facts.
//!
//! Invariants:
//! - One transaction reads every fact of one view, so a view never mixes two
//!   revisions.
//! - `display` comes only from the kernel's reducer; the view adds no status
//!   logic of its own.
//! - Snapshots and patches come from the same [`Projection`], so a snapshot
//!   at revision N equals an older snapshot plus the patches up to N.
//! - Generated content (the complete definition and graph history, long
//!   reasons) is stored under the exact run id, digest and media type in
//!   `run_view_content` before a reference to it is returned.
//! - Nothing that grows is inline without bounds, so a snapshot (and with
//!   it every patch and page) fits one 1 MiB frame, even inside an
//!   origin-session view beside its 256 KiB message window: the step and
//!   update pages have an item limit and an encoded byte budget, a step
//!   shows its newest attempts only, the graph projection of a definition
//!   is bounded when it is resolved ([`graph_projection_bytes`]), reasons
//!   over 16 KiB are references, failure messages and titles are cut. The
//!   rest is reached through `view.page` and the referenced graph history.

use crate::app::App;
use crate::store::Cached as _;
use crate::store::codec_name;
use crate::store::{Commit, meta, runs};
use kernel::display::{self, DisplayFacts, DisplayReason, OutsideFacts};
use kernel::ids::RunId;
use kernel::run::{ParkReason, RunAggregate};
use kernel::runner::ProtocolCheck;
use kernel::topology::Topology;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value, json};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

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

/// The small documents a run view is made of. Patches replace or append
/// inside these; they are never computed by diffing whole views.
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    /// `status`, `display`, timestamps, `failure`, `title`, `workflowName`.
    pub header: Map<String, Value>,
    /// One entry per topology node, in definition order.
    pub nodes: Vec<Value>,
    /// The definition's graph; a snapshot lists its edges (they never change,
    /// so patches never carry them and a flush does not build them).
    pub topology: Option<Arc<Topology>>,
    /// Every graph step (node visit with its newest attempts), in order.
    pub steps: Vec<Value>,
    /// The encoded length of each of `steps`.
    pub step_sizes: Vec<usize>,
    /// The newest current updates.
    pub updates: Vec<Value>,
    pub updates_total: usize,
}

/// Reads the projection of `run_id`, or `None` when it does not exist.
pub fn projection(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Option<Projection>> {
    let Some(agg) = runs::load(connection, run_id)? else {
        return Ok(None);
    };
    let Some(meta) = meta::load(connection, run_id)? else {
        return Ok(None);
    };
    let topology = meta::topology(connection, &meta.definition_digest)?;
    let error_message: Option<String> = connection.query_row_cached(
        "SELECT error_message FROM runs WHERE run_id = ?1",
        params![run_id.as_str()],
        |row| row.get(0),
    )?;
    let steps = step_records(connection, run_id)?;
    let mut header = Map::new();
    header.insert("workflowName".into(), json!(meta.workflow_name));
    if let Some(title) = meta.title.as_ref().filter(|title| !title.is_empty()) {
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
    let mut display = display_value(connection, &agg, error_message.as_deref())?;
    bound_reason(connection, run_id, &mut display)?;
    header.insert("display".into(), display);
    header.insert("createdAtMs".into(), json!(agg.run.created_at_ms));
    header.insert("updatedAtMs".into(), json!(agg.run.updated_at_ms));
    if let Some(finished) = agg.run.finished_at_ms {
        header.insert("finishedAtMs".into(), json!(finished));
    }
    if let Some(error) = &agg.run.error {
        let message = error_message
            .clone()
            .filter(|message| !message.is_empty())
            .unwrap_or_else(|| error_description(error));
        header.insert(
            "failure".into(),
            json!({ "class": codec_name(&error.class), "message": message.chars().take(512).collect::<String>() }),
        );
    }
    if let Some(lineage) = lineage_value(&agg) {
        header.insert("lineage".into(), lineage);
    }
    header.insert(
        "definition".into(),
        definition_content(connection, run_id, &meta.definition_digest)?,
    );
    let node_values = nodes(topology.as_deref(), &agg, &steps);
    let complete: Vec<Value> = steps.into_iter().map(|step| step.value).collect();
    let (history, complete_sizes) = graph_history(run_id, &complete);
    let (step_values, step_sizes) = shown_steps(complete, complete_sizes);
    header.insert(
        "graphHistory".into(),
        store_content(
            connection,
            run_id,
            &history,
            "application/json",
            ContentRole::GraphHistory,
        )?,
    );
    let (updates, updates_total) = updates(connection, run_id)?;
    Ok(Some(Projection {
        header,
        nodes: node_values,
        topology,
        steps: step_values,
        step_sizes,
        updates,
        updates_total,
    }))
}

/// A step document as the view shows it: its newest
/// [`STEP_ATTEMPTS_SHOWN`] attempts (unchanged when it has no more).
fn shown_step(mut step: Value) -> Value {
    if let Some(attempts) = step.get_mut("attempts").and_then(Value::as_array_mut)
        && attempts.len() > STEP_ATTEMPTS_SHOWN
    {
        attempts.drain(..attempts.len() - STEP_ATTEMPTS_SHOWN);
    }
    step
}

/// [`shown_step`] for tests of other modules.
#[cfg(test)]
pub(crate) fn steps_shown_for_test(step: Value) -> Value {
    shown_step(step)
}

/// The shown step documents and their encoded lengths (a step that shows
/// all its attempts keeps the length the graph history measured).
fn shown_steps(complete: Vec<Value>, sizes: Vec<usize>) -> (Vec<Value>, Vec<usize>) {
    complete
        .into_iter()
        .zip(sizes)
        .map(|(step, size)| {
            let cut = step["attempts"]
                .as_array()
                .is_some_and(|a| a.len() > STEP_ATTEMPTS_SHOWN);
            if cut {
                let shown = shown_step(step);
                let size = encoded_len(&shown);
                (shown, size)
            } else {
                (step, size)
            }
        })
        .unzip()
}

/// How many step documents the graph-history memo keeps (all runs together)
/// before it starts over.
const HISTORY_MEMO_STEPS: usize = 16 * 1024;

/// Per run: each step document with its canonical bytes, as last seen; and
/// how many steps that is in all.
type HistoryMemo = (usize, HashMap<RunId, Vec<(Value, Vec<u8>)>>);

thread_local! {
    static HISTORY_MEMO: RefCell<HistoryMemo> = RefCell::new((0, HashMap::new()));
}

/// The canonical bytes of a run's graph history (the JSON array of its step
/// documents), exactly `protocol::canonicalize(&json!(steps))`, and the
/// canonical length of each step document.
///
/// Canonical JSON writes an array as `[`, its canonical elements joined by
/// `,`, and `]`, so each step document is canonicalised once and remembered:
/// steps only grow and only the last one changes while its attempts run, so
/// a flush canonicalises one or two steps instead of the whole history. The
/// memo maps a document to its own bytes, so it is never stale; it only
/// bounds its memory.
fn graph_history(run_id: &RunId, steps: &[Value]) -> (Vec<u8>, Vec<usize>) {
    HISTORY_MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        let (remembered, runs) = &mut *memo;
        let known = runs.remove(run_id).unwrap_or_default();
        *remembered -= known.len();
        let mut parts: Vec<(Value, Vec<u8>)> = Vec::with_capacity(steps.len());
        let mut known = known.into_iter();
        for step in steps {
            let part = match known.next() {
                Some((value, bytes)) if value == *step => (value, bytes),
                _ => match protocol::canonicalize(step) {
                    Ok(bytes) => (step.clone(), bytes),
                    // Not encodable (never for step documents): whatever the
                    // whole array gives, unmemoised.
                    Err(_) => {
                        let sizes = steps.iter().map(encoded_len).collect();
                        return (
                            protocol::canonicalize(&json!(steps)).unwrap_or_default(),
                            sizes,
                        );
                    }
                },
            };
            parts.push(part);
        }
        let mut bytes =
            Vec::with_capacity(2 + parts.iter().map(|(_, part)| part.len() + 1).sum::<usize>());
        bytes.push(b'[');
        for (index, (_, part)) in parts.iter().enumerate() {
            if index > 0 {
                bytes.push(b',');
            }
            bytes.extend_from_slice(part);
        }
        bytes.push(b']');
        if *remembered + parts.len() > HISTORY_MEMO_STEPS {
            runs.clear();
            *remembered = 0;
        }
        *remembered += parts.len();
        let sizes = parts.iter().map(|(_, part)| part.len()).collect();
        runs.insert(run_id.clone(), parts);
        (bytes, sizes)
    })
}

/// Builds the run view of `run_id`, or `None` when it does not exist.
pub async fn build(
    app: &Arc<App>,
    run_id: RunId,
) -> Result<Option<Value>, crate::store::StoreError> {
    app.store
        .write(move |connection| Ok(Commit::Keep(build_in(connection, &run_id)?)))
        .await
}

/// The presentation revision of a run (0 before its first change).
pub fn presentation_revision(connection: &Connection, run_id: &RunId) -> rusqlite::Result<u64> {
    let revision: Option<i64> = connection
        .query_row_cached(
            "SELECT presentation_revision FROM viewer_runs WHERE run_id = ?1",
            params![run_id.as_str()],
            |row| row.get(0),
        )
        .optional()?;
    Ok(revision.map_or(0, |revision| revision.max(0) as u64))
}

/// Builds the complete view document inside the caller's transaction.
pub fn build_in(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Option<Value>> {
    let Some(projection) = projection(connection, run_id)? else {
        return Ok(None);
    };
    let revision = presentation_revision(connection, run_id)?;
    Ok(Some(document(run_id, revision, &projection)))
}

/// Assembles the view document from a projection.
fn document(run_id: &RunId, revision: u64, projection: &Projection) -> Value {
    let mut view = Map::new();
    view.insert("schema".into(), json!("pi-workflows.run-view.v1"));
    view.insert("runId".into(), json!(run_id.as_str()));
    view.insert("revision".into(), json!(revision));
    for (key, value) in &projection.header {
        view.insert(key.clone(), value.clone());
    }
    view.insert("nodes".into(), json!(projection.nodes));
    view.insert(
        "edges".into(),
        Value::Array(edges(projection.topology.as_deref())),
    );
    view.insert("steps".into(), projection.step_page());
    view.insert("updates".into(), projection.update_page());
    Value::Object(view)
}

impl Projection {
    /// How many leading steps are inline (the rest are paged).
    pub fn inline_steps(&self) -> usize {
        page_prefix(
            self.step_sizes.iter().copied(),
            STEP_PAGE_LIMIT,
            STEP_PAGE_BYTES,
        )
    }

    /// The inline step page, exactly as a snapshot carries it.
    pub fn step_page(&self) -> Value {
        let shown = self.inline_steps();
        let mut page = json!({ "items": self.steps[..shown], "total": self.steps.len() });
        if self.steps.len() > shown {
            page["nextCursor"] = json!(shown.to_string());
        }
        page
    }

    /// The inline update page, exactly as a snapshot and a patch carry it.
    pub fn update_page(&self) -> Value {
        let mut page = json!({ "items": self.updates, "total": self.updates_total });
        if self.updates_total > self.updates.len() {
            page["nextCursor"] = json!(self.updates.len().to_string());
        }
        page
    }
}

fn display_value(
    connection: &Connection,
    agg: &RunAggregate,
    error_message: Option<&str>,
) -> rusqlite::Result<Value> {
    let validating: bool = match &agg.interaction {
        Some(interaction) => connection.query_row_cached(
            "SELECT EXISTS (SELECT 1 FROM interactive_submissions WHERE interaction_id = ?1 AND outcome = 'validating')",
            params![interaction.interaction_id.as_str()],
            |row| row.get(0),
        )?,
        None => false,
    };
    let outside = OutsideFacts {
        submission_validating: validating,
        restart_eligible: restart_eligible(connection, agg)?,
    };
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
        let detail = ReasonDetail {
            error_message,
            terminal: agg.run.status.is_terminal(),
            protocol_check: match agg.run.park_reason {
                Some(ParkReason::ProtocolRejected) => {
                    runs::latest_protocol_check(connection, &agg.run.run_id)?
                }
                _ => None,
            },
        };
        value["reason"] = json!(reason_text(reason, &detail));
    }
    Ok(value)
}

/// The run's lineage, when it has any.
fn lineage_value(agg: &RunAggregate) -> Option<Value> {
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

/// Whether `run.restart` would be accepted: the kernel's one restart rule
/// over the run's terminal fingerprint and its whole chain.
fn restart_eligible(connection: &Connection, agg: &RunAggregate) -> rusqlite::Result<bool> {
    if kernel::run::restart_state_allows(&agg.run).is_err() {
        return Ok(false);
    }
    Ok(
        runs::restart_facts(connection, &agg.run)?.is_some_and(|(fingerprint, chain)| {
            kernel::run::restart_allowed(&agg.run, &fingerprint, &chain).is_ok()
        }),
    )
}

/// What a run error means, in words (the stored message adds the detail).
fn error_description(error: &kernel::run::RunError) -> String {
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
struct ReasonDetail<'a> {
    /// The message text of a failed run's error.
    error_message: Option<&'a str>,
    terminal: bool,
    /// The check a `protocolRejected` run's runner message failed.
    protocol_check: Option<ProtocolCheck>,
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
    fn as_str(self) -> &'static str {
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

/// Stores generated content for `run_id` and returns its reference. The row
/// is written before the reference exists anywhere else.
pub fn store_content(
    connection: &Connection,
    run_id: &RunId,
    bytes: &[u8],
    media_type: &str,
    role: ContentRole,
) -> rusqlite::Result<Value> {
    let digest = crate::ids::sha256(bytes);
    let inserted = connection.execute_cached(
        "INSERT INTO run_view_content (run_id, digest, media_type, role, bytes, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT DO NOTHING",
        params![run_id.as_str(), digest.0.to_vec(), media_type, role.as_str(), bytes, crate::clock::now_ms() as i64],
    )?;
    if inserted > 0 && role != ContentRole::Definition {
        connection.execute_cached(
            "DELETE FROM run_view_content WHERE run_id = ?1 AND role = ?2 AND rowid NOT IN
               (SELECT rowid FROM run_view_content WHERE run_id = ?1 AND role = ?2 ORDER BY rowid DESC LIMIT ?3)",
            params![run_id.as_str(), role.as_str(), RETAINED_CONTENTS],
        )?;
    }
    Ok(
        json!({ "digest": crate::ids::digest_text(&digest), "mediaType": media_type, "bytes": bytes.len() }),
    )
}

/// The reference to the run's complete definition (stored once per run).
fn definition_content(
    connection: &Connection,
    run_id: &RunId,
    definition_digest: &str,
) -> rusqlite::Result<Value> {
    let stored: Option<(Vec<u8>, i64)> = connection
        .query_row_cached(
            "SELECT digest, length(bytes) FROM run_view_content WHERE run_id = ?1 AND role = 'definition'",
            params![run_id.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    if let Some((digest, length)) = stored {
        let digest = kernel::ids::Digest(digest.try_into().unwrap_or([0; 32]));
        return Ok(
            json!({ "digest": crate::ids::digest_text(&digest), "mediaType": "application/json", "bytes": length }),
        );
    }
    let topology_json: String = connection.query_row_cached(
        "SELECT topology_json FROM workflow_definitions WHERE definition_digest = ?1",
        params![definition_digest],
        |row| row.get(0),
    )?;
    store_content(
        connection,
        run_id,
        topology_json.as_bytes(),
        "application/json",
        ContentRole::Definition,
    )
}

/// A reason above the inline limit becomes a notice plus a reference.
fn bound_reason(
    connection: &Connection,
    run_id: &RunId,
    display: &mut Value,
) -> rusqlite::Result<()> {
    let Some(reason) = display
        .get("reason")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return Ok(());
    };
    if reason.chars().count() <= INLINE_REASON_CHARS {
        return Ok(());
    }
    let reference = store_content(
        connection,
        run_id,
        reason.as_bytes(),
        "text/plain",
        ContentRole::Reason,
    )?;
    let object = display.as_object_mut().expect("display is an object");
    object.remove("reason");
    object.insert(
        "reasonNotice".into(),
        json!("The reason is longer than 16 KiB; read it through reasonContent."),
    );
    object.insert("reasonContent".into(), reference);
    Ok(())
}

/// One graph step with its attempts.
struct Step {
    node_id: String,
    outcome: Option<String>,
    value: Value,
}

/// Every graph step of a run as the view shows it, in order (a read;
/// writes nothing).
pub fn steps(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Vec<Value>> {
    Ok(step_records(connection, run_id)?
        .into_iter()
        .map(|step| shown_step(step.value))
        .collect())
}

fn step_records(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Vec<Step>> {
    let mut statement = connection.prepare_cached(
        "SELECT attempt_id, node_id, visit, status, outcome, started_at_ms, finished_at_ms
         FROM node_attempts WHERE run_id = ?1 ORDER BY seq",
    )?;
    let rows = statement.query_map(params![run_id.as_str()], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, i64>(2)?,
            row.get::<_, String>(3)?,
            row.get::<_, Option<String>>(4)?,
            row.get::<_, i64>(5)?,
            row.get::<_, Option<i64>>(6)?,
        ))
    })?;
    let mut steps: Vec<Step> = Vec::new();
    let mut index: BTreeMap<(String, i64), usize> = BTreeMap::new();
    for row in rows {
        let (attempt_id, node_id, visit, status, outcome, started, finished) = row?;
        let mut attempt =
            json!({ "attemptId": attempt_id, "attemptNumber": 1, "startedAtMs": started });
        if let Some(finished) = finished {
            attempt["finishedAtMs"] = json!(finished);
        }
        if let Some(outcome) = &outcome {
            attempt["outcome"] = json!(outcome);
        }
        let key = (node_id.clone(), visit);
        if let Some(&at) = index.get(&key) {
            let step = &mut steps[at];
            let attempts = step.value["attempts"]
                .as_array_mut()
                .expect("attempts array");
            attempt["attemptNumber"] = json!(attempts.len() + 1);
            attempts.push(attempt);
            set_step_end(step, finished, outcome, &status);
            continue;
        }
        // Built from parts (`json!` would copy the attempt document by
        // serialising it).
        let mut value = Map::new();
        value.insert("seq".into(), json!(steps.len() + 1));
        value.insert("nodeId".into(), Value::String(node_id.clone()));
        value.insert("visit".into(), json!(visit));
        value.insert("attempts".into(), Value::Array(vec![attempt]));
        value.insert("startedAtMs".into(), json!(started));
        let mut step = Step {
            node_id,
            outcome: None,
            value: Value::Object(value),
        };
        set_step_end(&mut step, finished, outcome, &status);
        index.insert(key, steps.len());
        steps.push(step);
    }
    Ok(steps)
}

fn set_step_end(step: &mut Step, finished: Option<i64>, outcome: Option<String>, status: &str) {
    let object = step.value.as_object_mut().expect("a step object");
    if status == "finished" {
        object.insert("finishedAtMs".into(), json!(finished));
        object.insert("outcome".into(), json!(outcome));
        step.outcome = outcome;
    } else {
        object.remove("finishedAtMs");
        object.remove("outcome");
        step.outcome = None;
    }
}

fn nodes(topology: Option<&Topology>, agg: &RunAggregate, steps: &[Step]) -> Vec<Value> {
    let Some(topology) = topology else {
        return Vec::new();
    };
    let mut visits: BTreeMap<&str, usize> = BTreeMap::new();
    let mut last: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for step in steps {
        *visits.entry(step.node_id.as_str()).or_default() += 1;
        last.insert(step.node_id.as_str(), step.outcome.as_deref());
    }
    topology
        .nodes
        .iter()
        .map(|node| {
            let id = node.id.as_str();
            let unfinished = agg.attempt.as_ref().filter(|attempt| attempt.status.is_unfinished() && attempt.node_id == node.id);
            let state = match (unfinished.map(|attempt| attempt.status), last.get(id).copied().flatten()) {
                (Some(kernel::attempt::AttemptStatus::Waiting), _) => "waiting",
                (Some(_), _) => "running",
                (None, Some("ok")) if agg.run.waiting_on.as_ref() == Some(&node.id) => "waiting",
                (None, Some("ok")) => "completed",
                (None, Some("failed")) => "failed",
                (None, Some("timed_out")) => "timed_out",
                (None, Some("cancelled")) => "cancelled",
                _ => "pending",
            };
            json!({ "id": id, "nodeType": codec_name(&node.node_type), "visits": visits.get(id).copied().unwrap_or(0), "state": state })
        })
        .collect()
}

fn edges(topology: Option<&Topology>) -> Vec<Value> {
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

/// The newest current updates (inline) and the total number of current pairs.
fn updates(connection: &Connection, run_id: &RunId) -> rusqlite::Result<(Vec<Value>, usize)> {
    let total: i64 = connection.query_row_cached(
        "SELECT COUNT(*) FROM workflow_updates WHERE run_id = ?1",
        params![run_id.as_str()],
        |row| row.get(0),
    )?;
    let mut items = update_page(connection, run_id, 0, UPDATE_PAGE_LIMIT)?;
    let shown = page_prefix(
        items.iter().map(encoded_len),
        UPDATE_PAGE_LIMIT,
        UPDATE_PAGE_BYTES,
    );
    items.truncate(shown);
    Ok((items, total.max(0) as usize))
}

/// Current updates newest first, from `offset`.
pub fn update_page(
    connection: &Connection,
    run_id: &RunId,
    offset: usize,
    limit: usize,
) -> rusqlite::Result<Vec<Value>> {
    let mut statement = connection.prepare_cached(
        "SELECT update_id, attempt_id, seq, update_type, update_key, data_json FROM workflow_updates
         WHERE run_id = ?1 ORDER BY seq DESC, update_type, update_key LIMIT ?2 OFFSET ?3",
    )?;
    let rows = statement.query_map(
        params![run_id.as_str(), limit as i64, offset as i64],
        |row| {
            let data: String = row.get(5)?;
            Ok(json!({
                "updateId": row.get::<_, String>(0)?,
                "attemptId": row.get::<_, String>(1)?,
                "seq": row.get::<_, i64>(2)?,
                "type": row.get::<_, String>(3)?,
                "key": row.get::<_, String>(4)?,
                "data": serde_json::from_str::<Value>(&data).unwrap_or(Value::Null),
            }))
        },
    )?;
    rows.collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(seq: u64, node: &str, finished: Option<u64>) -> Value {
        let mut value = json!({
            "seq": seq, "nodeId": node, "visit": 1, "startedAtMs": 1_700_000_000_000u64 + seq,
            "attempts": [{ "attemptId": format!("a-{seq}"), "attemptNumber": 1, "startedAtMs": 1_700_000_000_000u64 + seq }],
        });
        if let Some(finished) = finished {
            value["finishedAtMs"] = json!(finished);
            value["outcome"] = json!("ok");
        }
        value
    }

    /// The memoised, element-wise history is byte-identical to canonicalising
    /// the whole array, through growth, a changing last step, odd strings and
    /// another run's history in between.
    #[test]
    fn graph_history_equals_whole_array_canonicalisation() {
        let run = RunId::new("run-a");
        let other = RunId::new("run-b");
        let odd = "n\u{e9}\"\\\u{1}\u{2028}\u{1f600}\u{7f}";
        let mut steps: Vec<Value> = Vec::new();
        let check = |run: &RunId, steps: &[Value]| {
            let expected = protocol::canonicalize(&json!(steps)).unwrap_or_default();
            let (bytes, sizes) = graph_history(run, steps);
            assert_eq!(bytes, expected, "{steps:?}");
            let each: Vec<usize> = steps.iter().map(encoded_len).collect();
            assert_eq!(sizes, each);
        };
        check(&run, &steps);
        for seq in 1..=6u64 {
            let node = if seq == 3 {
                odd.to_owned()
            } else {
                format!("n{seq}")
            };
            steps.push(step(seq, &node, None));
            check(&run, &steps);
            check(&other, &steps[..1]);
            let last = steps.len() - 1;
            steps[last] = step(seq, &node, Some(1_700_000_000_100 + seq));
            check(&run, &steps);
        }
        // A different history for the same run (not a prefix) is recomputed.
        let mut changed = steps.clone();
        changed[0]["attempts"][0]["attemptNumber"] = json!(2);
        check(&run, &changed);
        check(&run, &steps);
    }
}
