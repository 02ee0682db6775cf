//! Presentation revisions and patches: the live view's rows
//! (`viewer_runs`, `viewer_nodes`, `viewer_steps`, `viewer_history_refs`,
//! `viewer_deltas`), maintained from what each transaction changed.
//!
//! Invariants:
//! - A transaction that changes what a run's view shows advances the run's
//!   presentation revision and writes its patch in the same commit (the
//!   writer thread flushes every run a job marked before the job's
//!   savepoint is released).
//! - A flush reads and writes only what the change touched, whatever the
//!   run's length: the run's bounded aggregate (no step summaries), the
//!   attempt rows of its last step and any new ones, the entries of the
//!   nodes those steps, the unfinished attempt and the checkpoint name, the
//!   header, and the update page when updates changed. It never rebuilds
//!   or diffs the whole view; the patch is the list of those small changes.
//! - The graph history is append-only rows: a step's row is final once a
//!   later step exists, and only the last row changes while its attempts
//!   run. Its content reference is digest-bound: the SHA-256 state over the
//!   final prefix is stored, so a flush hashes only the step that changed.
//!   (If a row ever changed for an earlier step, the run's rows are rebuilt
//!   from its attempts and the patch replaces the nodes and steps whole.)
//! - A snapshot is assembled from the same rows, so a snapshot at revision
//!   N equals an older snapshot plus the patches up to N; [`rebuilt`]
//!   builds the same view from the facts alone, to check that.
//! - 256 revisions are retained; a reader older than that, or so far behind
//!   that the patches since its revision exceed `PATCH_BYTES`, gets a
//!   snapshot. Every page in the documents is bounded by items and bytes
//!   (`view`), so no patch or snapshot outgrows a frame.
//! - A change that shows nothing new (a lease renewal) makes no revision.

use super::Cached as _;
use super::codec::i64_of;
use super::{meta, runs, view_facts};
use crate::projection::run_view::{self as view, OffSchema, StepDoc, patch_value, pointer};
use kernel::ids::RunId;
use protocol::generated::types::{self as wire, PatchOp};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use sha2::digest::common::hazmat::SerializableState as _;
use sha2::{Digest as _, Sha256};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

/// How many presentation revisions keep their patches.
pub const RETAINED_REVISIONS: u64 = 256;

/// What a job changed of one run's view facts.
#[derive(Clone, Copy, Debug, Default)]
struct Marked {
    /// The run's published updates changed (the update page is read again).
    updates: bool,
}

thread_local! {
    /// Runs the current job changed (the writer thread runs one job at a time).
    static DIRTY: RefCell<BTreeMap<RunId, Marked>> = const { RefCell::new(BTreeMap::new()) };
    /// Runs the current job deleted (state retention).
    static DELETED: RefCell<BTreeSet<RunId>> = const { RefCell::new(BTreeSet::new()) };
}

/// Marks a run the current job deleted: its subscribers are told after
/// the commit, and the run list's revision advances.
pub(crate) fn mark_deleted(run_id: &RunId) {
    DELETED.with(|deleted| {
        deleted.borrow_mut().insert(run_id.clone());
    });
}

/// Marks a run as changed by the current job.
pub(crate) fn mark(run_id: &RunId) {
    DIRTY.with(|dirty| {
        dirty.borrow_mut().entry(run_id.clone()).or_default();
    });
}

/// Marks a run whose published updates the current job changed.
pub(crate) fn mark_updates(run_id: &RunId) {
    DIRTY.with(|dirty| {
        dirty
            .borrow_mut()
            .entry(run_id.clone())
            .or_default()
            .updates = true
    });
}

/// Forgets the marks of a job that rolled back.
pub(crate) fn discard() {
    DIRTY.with(|dirty| dirty.borrow_mut().clear());
    DELETED.with(|deleted| deleted.borrow_mut().clear());
}

/// Records a new presentation revision and patch for every run the current
/// job changed, and advances the run list's revision once for the runs it
/// deleted. Returns the changes to announce after the commit.
pub(crate) fn flush(connection: &Connection) -> rusqlite::Result<Vec<super::Published>> {
    let dirty = DIRTY.with(|dirty| std::mem::take(&mut *dirty.borrow_mut()));
    let deleted = DELETED.with(|deleted| std::mem::take(&mut *deleted.borrow_mut()));
    let mut published = Vec::new();
    for (run_id, marked) in dirty {
        if deleted.contains(&run_id) {
            continue;
        }
        if let Some(revision) = record(connection, &run_id, marked)? {
            published.push(super::Published::Revised(run_id, revision));
        }
    }
    if !deleted.is_empty() {
        connection.execute_cached(
            "UPDATE viewer_list SET revision = revision + 1 WHERE singleton = 1",
            [],
        )?;
        published.extend(deleted.into_iter().map(super::Published::Deleted));
    }
    Ok(published)
}

/// The presentation row of the last revision.
#[derive(Clone, Debug, Default)]
struct Stored {
    revision: u64,
    /// The header of the last revision (`None` before the first one).
    header: Option<view::Header>,
    steps_total: usize,
    steps_inline: usize,
    steps_inline_bytes: usize,
    steps_tail_seq: u64,
    history_state: Option<Vec<u8>>,
    history_prefix_bytes: usize,
    hot_nodes: Vec<String>,
    updates_json: Option<String>,
    updates_total: usize,
}

fn stored(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Stored> {
    let row = connection
        .query_row_cached(
            "SELECT presentation_revision, header_json, steps_total, steps_inline, steps_inline_bytes, steps_tail_seq,
               history_state, history_prefix_bytes, hot_nodes_json, updates_json, updates_total
             FROM viewer_runs WHERE run_id = ?1",
            params![run_id.as_str()],
            |row| {
                let count = |index: usize| -> rusqlite::Result<usize> {
                    Ok(row.get::<_, i64>(index)?.max(0) as usize)
                };
                Ok(Stored {
                    revision: count(0)? as u64,
                    header: row
                        .get::<_, Option<String>>(1)?
                        .map(|text| serde_json::from_str(&text).map_err(|_| OffSchema("header")))
                        .transpose()?,
                    steps_total: count(2)?,
                    steps_inline: count(3)?,
                    steps_inline_bytes: count(4)?,
                    steps_tail_seq: count(5)? as u64,
                    history_state: row.get(6)?,
                    history_prefix_bytes: count(7)?,
                    hot_nodes: row
                        .get::<_, Option<String>>(8)?
                        .and_then(|text| serde_json::from_str(&text).ok())
                        .unwrap_or_default(),
                    updates_json: row.get(9)?,
                    updates_total: count(10)?,
                })
            },
        )
        .optional()?;
    Ok(row.unwrap_or(Stored {
        history_prefix_bytes: 1,
        ..Stored::default()
    }))
}

/// The SHA-256 state over the graph history's final prefix.
fn history_hasher(state: Option<&[u8]>) -> Sha256 {
    state
        .and_then(|bytes| {
            let serialized =
                sha2::digest::common::hazmat::SerializedState::<Sha256>::try_from(bytes).ok()?;
            Sha256::deserialize(&serialized).ok()
        })
        .unwrap_or_else(|| {
            let mut hasher = Sha256::new();
            hasher.update(b"[");
            hasher
        })
}

/// A stored step row: its node visit and texts.
struct StepRow {
    node_id: String,
    visit: i64,
    document: String,
    shown: String,
}

fn step_row(
    connection: &Connection,
    run_id: &RunId,
    seq: usize,
) -> rusqlite::Result<Option<StepRow>> {
    connection
        .query_row_cached(
            "SELECT node_id, visit, document, shown FROM viewer_steps WHERE run_id = ?1 AND seq = ?2",
            params![run_id.as_str(), seq as i64],
            |row| {
                Ok(StepRow {
                    node_id: row.get(0)?,
                    visit: row.get(1)?,
                    document: row.get(2)?,
                    shown: row.get(3)?,
                })
            },
        )
        .optional()
}

fn step_seq_of(
    connection: &Connection,
    run_id: &RunId,
    node_id: &str,
    visit: i64,
) -> rusqlite::Result<Option<i64>> {
    connection
        .query_row_cached(
            "SELECT seq FROM viewer_steps WHERE run_id = ?1 AND node_id = ?2 AND visit = ?3",
            params![run_id.as_str(), node_id, visit],
            |row| row.get(0),
        )
        .optional()
}

fn write_step(
    connection: &Connection,
    run_id: &RunId,
    step: &StepDoc,
    document: &str,
    shown: &str,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO viewer_steps (run_id, seq, node_id, visit, document, shown) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (run_id, seq) DO UPDATE SET document = excluded.document, shown = excluded.shown",
        params![run_id.as_str(), step.index as i64, step.node_id, step.visit, document, shown],
    )?;
    Ok(())
}

/// The canonical texts of a step: complete, and as shown.
fn step_texts(step: &StepDoc) -> (String, String) {
    let document = view::canonical_text(&step.value);
    let shown = if step.is_cut() {
        view::canonical_text(&step.shown())
    } else {
        document.clone()
    };
    (document, shown)
}

/// A stored document (canonical text this module wrote) as its type.
fn parse<T: serde::de::DeserializeOwned>(field: &'static str, text: &str) -> Result<T, OffSchema> {
    serde_json::from_str(text).map_err(|_| OffSchema(field))
}

/// A stored node's last outcome.
fn outcome_of(text: Option<String>) -> rusqlite::Result<Option<wire::NodeOutcome>> {
    Ok(text
        .map(|text| view::to_wire("last_outcome", text))
        .transpose()?)
}

/// One node entry row.
struct NodeRow {
    index: usize,
    visits: u64,
    last_outcome: Option<wire::NodeOutcome>,
    document: String,
}

fn node_rows(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<BTreeMap<String, NodeRow>> {
    let mut statement = connection.prepare_cached(
        "SELECT node_id, node_index, visits, last_outcome, document FROM viewer_nodes WHERE run_id = ?1",
    )?;
    let rows = statement.query_map(params![run_id.as_str()], |row| {
        Ok((
            row.get::<_, String>(0)?,
            NodeRow {
                index: row.get::<_, i64>(1)?.max(0) as usize,
                visits: row.get::<_, i64>(2)?.max(0) as u64,
                last_outcome: outcome_of(row.get(3)?)?,
                document: row.get(4)?,
            },
        ))
    })?;
    rows.collect()
}

fn node_row(
    connection: &Connection,
    run_id: &RunId,
    node_id: &str,
) -> rusqlite::Result<Option<NodeRow>> {
    connection
        .query_row_cached(
            "SELECT node_index, visits, last_outcome, document FROM viewer_nodes WHERE run_id = ?1 AND node_id = ?2",
            params![run_id.as_str(), node_id],
            |row| {
                Ok(NodeRow {
                    index: row.get::<_, i64>(0)?.max(0) as usize,
                    visits: row.get::<_, i64>(1)?.max(0) as u64,
                    last_outcome: outcome_of(row.get(2)?)?,
                    document: row.get(3)?,
                })
            },
        )
        .optional()
}

/// Computes and stores the patch of one run, if its view changed.
fn record(
    connection: &Connection,
    run_id: &RunId,
    marked: Marked,
) -> rusqlite::Result<Option<u64>> {
    let Some(agg) = runs::load_current(connection, run_id)? else {
        return Ok(None);
    };
    let Some(meta) = meta::load(connection, run_id)? else {
        return Ok(None);
    };
    let topology = meta::topology(connection, &meta.definition_digest)?;
    let before = stored(connection, run_id)?;
    let first = before.revision == 0;
    let mut after = before.clone();
    // Item operations on the node list and the step page (a first revision
    // or a rebuild replaces both whole instead).
    let mut item_ops = Vec::new();
    let mut step_ops = Vec::new();

    // The graph steps this change touched: the last one folded again from
    // its first attempt row, and any new ones.
    let mut last = match before.steps_total {
        0 => None,
        seq => step_row(connection, run_id, seq)?,
    };
    let from_seq = if last.is_some() {
        before.steps_tail_seq
    } else {
        0
    };
    let rows = view_facts::attempt_rows(connection, run_id, from_seq)?;
    let mut folded = view::fold_steps(&rows, before.steps_total.max(1))?;
    let mut whole = first;
    let continues = match (&last, folded.first()) {
        (None, _) => before.steps_total == 0,
        (Some(row), Some(step)) => row.node_id == step.node_id && row.visit == step.visit,
        (Some(_), None) => false,
    };
    let mut known_new = false;
    if continues {
        for step in folded.iter().skip(usize::from(last.is_some())) {
            if step_seq_of(connection, run_id, &step.node_id, step.visit)?.is_some() {
                known_new = true;
            }
        }
    }
    if !continues || known_new {
        // An earlier step changed (never expected): rebuild the run's rows.
        whole = true;
        connection.execute_cached(
            "DELETE FROM viewer_steps WHERE run_id = ?1",
            params![run_id.as_str()],
        )?;
        connection.execute_cached(
            "DELETE FROM viewer_history_refs WHERE run_id = ?1",
            params![run_id.as_str()],
        )?;
        connection.execute_cached(
            "UPDATE viewer_nodes SET visits = 0, last_outcome = NULL WHERE run_id = ?1",
            params![run_id.as_str()],
        )?;
        after.steps_total = 0;
        after.steps_inline = 0;
        after.steps_inline_bytes = 0;
        after.history_state = None;
        after.history_prefix_bytes = 1;
        last = None;
        folded = view::fold_steps(&view_facts::attempt_rows(connection, run_id, 0)?, 1)?;
    }
    let mut hasher = history_hasher(after.history_state.as_deref());
    let mut history_changed = first || whole || before.header.is_none();
    // Per node: whether the step is a new visit, and its outcome.
    let mut node_changes: Vec<(String, bool, Option<wire::NodeOutcome>)> = Vec::new();
    let mut last_document = last.as_ref().map(|row| row.document.clone());
    for step in &folded {
        let (document, shown) = step_texts(step);
        let n = after.steps_total;
        let mut page = Page {
            total: n,
            inline: after.steps_inline,
            bytes: after.steps_inline_bytes,
        };
        if step.index <= n {
            // The last step again.
            let Some(old) = last.as_ref() else { continue };
            if old.document == document {
                continue;
            }
            step_ops.extend(page.last_changed(&old.shown, &shown)?);
            node_changes.push((step.node_id.clone(), false, step.outcome));
        } else {
            // A new step: the previous last one is final from now on.
            if let Some(previous) = &last_document {
                hasher.update(previous.as_bytes());
                hasher.update(b",");
                after.history_prefix_bytes += previous.len() + 1;
            }
            after.steps_tail_seq = step.first_seq;
            step_ops.extend(page.appended(&shown)?);
            node_changes.push((step.node_id.clone(), true, step.outcome));
        }
        (
            after.steps_total,
            after.steps_inline,
            after.steps_inline_bytes,
        ) = (page.total, page.inline, page.bytes);
        write_step(connection, run_id, step, &document, &shown)?;
        history_changed = true;
        last_document = Some(document);
        last = None;
    }

    let graph_history = if history_changed {
        let mut total = hasher.clone();
        let bytes = match &last_document {
            Some(document) => {
                total.update(document.as_bytes());
                after.history_prefix_bytes + document.len() + 1
            }
            None => after.history_prefix_bytes + 1,
        };
        total.update(b"]");
        let digest = kernel::ids::Digest(total.finalize().into());
        connection.execute_cached(
            "INSERT INTO viewer_history_refs (run_id, digest, steps, tail, bytes) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT DO NOTHING",
            params![run_id.as_str(), digest.0.to_vec(), after.steps_total as i64, last_document, bytes as i64],
        )?;
        connection.execute_cached(
            "DELETE FROM viewer_history_refs WHERE run_id = ?1 AND rowid NOT IN
               (SELECT rowid FROM viewer_history_refs WHERE run_id = ?1 ORDER BY rowid DESC LIMIT ?2)",
            params![run_id.as_str(), view::RETAINED_CONTENTS],
        )?;
        after.history_state = Some(hasher.serialize().to_vec());
        view::content_reference(&digest, "application/json", bytes)?
    } else {
        match &before.header {
            Some(header) => header.graph_history.clone(),
            None => return Err(OffSchema("graphHistory").into()),
        }
    };

    // Node entries: those the steps, the unfinished attempt or the
    // checkpoint touched (before or now), or every one.
    let hot = view::hot_nodes(&agg);
    if let Some(topology) = topology.as_deref() {
        if first {
            for (index, node) in topology.nodes.iter().enumerate() {
                connection.execute_cached(
                    "INSERT INTO viewer_nodes (run_id, node_index, node_id, visits, last_outcome, document)
                     VALUES (?1, ?2, ?3, 0, NULL, '') ON CONFLICT DO NOTHING",
                    params![run_id.as_str(), index as i64, node.id.as_str()],
                )?;
            }
        }
        let mut rows: BTreeMap<String, NodeRow> = if whole {
            node_rows(connection, run_id)?
        } else {
            let mut rows = BTreeMap::new();
            let touched = before
                .hot_nodes
                .iter()
                .chain(&hot)
                .chain(node_changes.iter().map(|(node, _, _)| node));
            for node in touched {
                if !rows.contains_key(node)
                    && let Some(row) = node_row(connection, run_id, node)?
                {
                    rows.insert(node.clone(), row);
                }
            }
            rows
        };
        for (node, visit, outcome) in &node_changes {
            if let Some(row) = rows.get_mut(node) {
                row.visits += u64::from(*visit);
                row.last_outcome = *outcome;
            }
        }
        let mut entries: Vec<(usize, wire::GraphNode)> = Vec::new();
        for (node_id, row) in &rows {
            let Some(node) = topology
                .nodes
                .get(row.index)
                .filter(|node| node.id.as_str() == node_id)
            else {
                continue;
            };
            let entry = view::node_entry(node, row.visits, row.last_outcome, &agg)?;
            let text = view::canonical_text(&entry);
            if text != row.document
                || node_changes
                    .iter()
                    .any(|(changed, _, _)| changed == node_id)
            {
                connection.execute_cached(
                    "UPDATE viewer_nodes SET visits = ?3, last_outcome = ?4, document = ?5 WHERE run_id = ?1 AND node_index = ?2",
                    params![
                        run_id.as_str(),
                        row.index as i64,
                        row.visits as i64,
                        row.last_outcome.as_ref().map(crate::wire::codec_name),
                        text
                    ],
                )?;
            }
            if text != row.document && !whole {
                item_ops.push(PatchOp::Replace {
                    path: pointer(format!("/nodes/{}", row.index))?,
                    value: patch_value(&entry)?,
                });
            }
            entries.push((row.index, entry));
        }
        if whole {
            entries.sort_by_key(|(index, _)| *index);
            let nodes: Vec<wire::GraphNode> = entries.into_iter().map(|(_, entry)| entry).collect();
            item_ops.insert(0, whole_op(first, "/nodes", &nodes)?);
        }
    } else if first {
        item_ops.push(whole_op(true, "/nodes", &Vec::<wire::GraphNode>::new())?);
    }
    after.hot_nodes = hot;

    let header = view_facts::header(connection, &agg, &meta, graph_history)?;
    let mut ops = Vec::new();
    header.diff(before.header.as_ref(), &mut ops)?;
    ops.extend(item_ops);
    if whole {
        drop(step_ops);
        let page = step_page(connection, run_id, after.steps_inline, after.steps_total)?;
        ops.push(whole_op(first, "/steps", &page)?);
    } else {
        ops.extend(step_ops);
        step_page_fields(&before, &after, &mut ops)?;
    }
    if marked.updates || first {
        let (items, total) = view_facts::updates(connection, run_id)?;
        let text = serde_json::to_string(&items).unwrap_or_default();
        if first
            || before.updates_json.as_deref() != Some(text.as_str())
            || before.updates_total != total
        {
            ops.push(whole_op(
                first,
                "/updates",
                &view::update_page(items, total)?,
            )?);
        }
        after.updates_json = Some(text);
        after.updates_total = total;
    }
    if ops.is_empty() {
        return Ok(None);
    }
    let revision = before.revision + 1;
    ops.push(PatchOp::Replace {
        path: pointer("/revision")?,
        value: patch_value(&revision)?,
    });
    after.revision = revision;
    after.header = Some(header);
    store(connection, run_id, &after, &ops)?;
    Ok(Some(revision))
}

/// The inline step page's bookkeeping: how many steps there are, how many
/// lead the inline page and the bytes those take. Only the last step
/// changes and steps are only appended, so the page changes at its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Page {
    total: usize,
    inline: usize,
    bytes: usize,
}

impl Page {
    /// The last step's shown text changed from `old` to `new`: it stays,
    /// leaves or joins the inline page. Returns its item operation.
    fn last_changed(&mut self, old: &str, new: &str) -> Result<Option<PatchOp>, OffSchema> {
        let n = self.total;
        if self.inline == n {
            let prefix = self.bytes - old.len().min(self.bytes);
            if view::step_fits(n - 1, prefix, new.len()) {
                self.bytes = prefix + new.len();
                if old == new {
                    return Ok(None);
                }
                return Ok(Some(PatchOp::Replace {
                    path: pointer(format!("/steps/items/{}", n - 1))?,
                    value: parse("step", new)?,
                }));
            }
            self.inline = n - 1;
            self.bytes = prefix;
            return Ok(Some(PatchOp::Remove {
                path: pointer(format!("/steps/items/{}", n - 1))?,
            }));
        }
        if self.inline + 1 == n && view::step_fits(self.inline, self.bytes, new.len()) {
            self.inline = n;
            self.bytes += new.len();
            return Ok(Some(PatchOp::Append {
                path: pointer("/steps/items")?,
                value: parse("step", new)?,
            }));
        }
        Ok(None)
    }

    /// A new last step with `shown` text. Returns its item operation.
    fn appended(&mut self, shown: &str) -> Result<Option<PatchOp>, OffSchema> {
        let n = self.total;
        self.total = n + 1;
        if self.inline == n && view::step_fits(n, self.bytes, shown.len()) {
            self.inline = n + 1;
            self.bytes += shown.len();
            return Ok(Some(PatchOp::Append {
                path: pointer("/steps/items")?,
                value: parse("step", shown)?,
            }));
        }
        Ok(None)
    }
}

/// The `total` and `nextCursor` operations of the step page.
fn step_page_fields(
    before: &Stored,
    after: &Stored,
    ops: &mut Vec<PatchOp>,
) -> Result<(), OffSchema> {
    if after.steps_total != before.steps_total {
        ops.push(PatchOp::Replace {
            path: pointer("/steps/total")?,
            value: patch_value(&view::count("steps.total", after.steps_total)?)?,
        });
    }
    let paged_before = before.steps_inline < before.steps_total;
    let paged_after = after.steps_inline < after.steps_total;
    let cursor = || patch_value(&view::cursor(after.steps_inline)?);
    let path = || pointer("/steps/nextCursor");
    match (paged_before, paged_after) {
        (false, true) => ops.push(PatchOp::Add {
            path: path()?,
            value: cursor()?,
        }),
        (true, true) if before.steps_inline != after.steps_inline => ops.push(PatchOp::Replace {
            path: path()?,
            value: cursor()?,
        }),
        (true, false) => ops.push(PatchOp::Remove { path: path()? }),
        (false, false) | (true, true) => {}
    }
    Ok(())
}

/// The operation that sets a whole member: `add` in the first revision,
/// `replace` after it.
fn whole_op<T: serde::Serialize>(first: bool, path: &str, value: &T) -> Result<PatchOp, OffSchema> {
    let (path, value) = (pointer(path)?, patch_value(value)?);
    Ok(if first {
        PatchOp::Add { path, value }
    } else {
        PatchOp::Replace { path, value }
    })
}

fn store(
    connection: &Connection,
    run_id: &RunId,
    after: &Stored,
    ops: &[PatchOp],
) -> rusqlite::Result<()> {
    fn text<T: serde::Serialize + ?Sized>(value: &T) -> String {
        serde_json::to_string(value).unwrap_or_default()
    }
    let revision = after.revision;
    connection.execute_cached(
        "INSERT INTO viewer_runs (run_id, presentation_revision, retained_floor, header_json, steps_total, steps_inline,
             steps_inline_bytes, steps_tail_seq, history_state, history_prefix_bytes, hot_nodes_json, updates_json,
             updates_total)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
         ON CONFLICT (run_id) DO UPDATE SET presentation_revision = excluded.presentation_revision,
           retained_floor = excluded.retained_floor, header_json = excluded.header_json,
           steps_total = excluded.steps_total, steps_inline = excluded.steps_inline,
           steps_inline_bytes = excluded.steps_inline_bytes, steps_tail_seq = excluded.steps_tail_seq,
           history_state = excluded.history_state, history_prefix_bytes = excluded.history_prefix_bytes,
           hot_nodes_json = excluded.hot_nodes_json, updates_json = excluded.updates_json,
           updates_total = excluded.updates_total",
        params![
            run_id.as_str(),
            i64_of(revision),
            i64_of(revision.saturating_sub(RETAINED_REVISIONS)),
            text(&after.header),
            after.steps_total as i64,
            after.steps_inline as i64,
            after.steps_inline_bytes as i64,
            i64_of(after.steps_tail_seq),
            after.history_state,
            after.history_prefix_bytes as i64,
            text(&after.hot_nodes),
            after.updates_json,
            after.updates_total as i64,
        ],
    )?;
    connection.execute_cached(
        "UPDATE viewer_list SET revision = revision + 1 WHERE singleton = 1",
        [],
    )?;
    connection.execute_cached(
        "INSERT INTO viewer_deltas (run_id, presentation_revision, delta_index, patch_json) VALUES (?1, ?2, 0, ?3)",
        params![run_id.as_str(), i64_of(revision), text(ops)],
    )?;
    connection.execute_cached(
        "DELETE FROM viewer_deltas WHERE run_id = ?1 AND presentation_revision <= ?2",
        params![
            run_id.as_str(),
            i64_of(revision.saturating_sub(RETAINED_REVISIONS))
        ],
    )?;
    Ok(())
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

/// Shown step documents from position `offset` (0-based), at most `limit`.
pub fn step_items(
    connection: &Connection,
    run_id: &RunId,
    offset: usize,
    limit: usize,
) -> rusqlite::Result<Vec<wire::StepRecord>> {
    let mut statement = connection.prepare_cached(
        "SELECT shown FROM viewer_steps WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
    )?;
    let rows = statement.query_map(
        params![run_id.as_str(), offset as i64, limit as i64],
        |row| row.get::<_, String>(0),
    )?;
    rows.map(|text| Ok(parse("step", &text?)?)).collect()
}

fn step_page(
    connection: &Connection,
    run_id: &RunId,
    inline: usize,
    total: usize,
) -> rusqlite::Result<wire::StepPage> {
    Ok(view::step_page(
        step_items(connection, run_id, 0, inline)?,
        total,
    )?)
}

/// The run's view at its current presentation revision, assembled from the
/// stored rows (a read: writes nothing). `None` when the run does not exist
/// or has no revision yet.
pub fn snapshot(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<wire::RunView>> {
    let before = stored(connection, run_id)?;
    if before.revision == 0 {
        return Ok(None);
    }
    let header = before.header.clone().ok_or(OffSchema("header"))?;
    let Some(meta) = meta::load(connection, run_id)? else {
        return Ok(None);
    };
    let topology = meta::topology(connection, &meta.definition_digest)?;
    let mut statement = connection.prepare_cached(
        "SELECT document FROM viewer_nodes WHERE run_id = ?1 ORDER BY node_index",
    )?;
    let nodes: Vec<wire::GraphNode> = statement
        .query_map(params![run_id.as_str()], |row| row.get::<_, String>(0))?
        .map(|text| Ok(parse("node", &text?)?))
        .collect::<rusqlite::Result<_>>()?;
    let updates: Vec<wire::UpdateRecord> = match before.updates_json.as_deref() {
        Some(text) => parse("updates", text)?,
        None => Vec::new(),
    };
    Ok(Some(view::document(
        run_id,
        before.revision,
        header,
        nodes,
        topology.as_deref(),
        step_page(connection, run_id, before.steps_inline, before.steps_total)?,
        view::update_page(updates, before.updates_total)?,
    )?))
}

/// The bytes of an advertised graph-history reference of `run_id`: its
/// final steps' rows and the last step as it was, or `None` when the
/// reference is not (or no longer) retained.
pub fn history_bytes(
    connection: &Connection,
    run_id: &RunId,
    digest: &kernel::ids::Digest,
) -> rusqlite::Result<Option<Vec<u8>>> {
    let reference: Option<(i64, Option<String>, i64)> = connection
        .query_row_cached(
            "SELECT steps, tail, bytes FROM viewer_history_refs WHERE run_id = ?1 AND digest = ?2",
            params![run_id.as_str(), digest.0.to_vec()],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .optional()?;
    let Some((steps, tail, length)) = reference else {
        return Ok(None);
    };
    let mut bytes = Vec::with_capacity(length.max(0) as usize);
    bytes.push(b'[');
    let mut statement = connection.prepare_cached(
        "SELECT document FROM viewer_steps WHERE run_id = ?1 AND seq < ?2 ORDER BY seq",
    )?;
    for document in statement.query_map(params![run_id.as_str(), steps], |row| {
        row.get::<_, String>(0)
    })? {
        bytes.extend_from_slice(document?.as_bytes());
        bytes.push(b',');
    }
    if let Some(tail) = tail {
        bytes.extend_from_slice(tail.as_bytes());
    }
    bytes.push(b']');
    Ok((bytes.len() as i64 == length).then_some(bytes))
}

/// The run's view built from scratch from its facts (every attempt row,
/// the aggregate, the updates), never from the presentation rows: with the
/// complete graph history's bytes. The presentation revision is the stored
/// one. A check of the incremental rows (the tests compare the two); it
/// writes only content that is already stored.
pub fn rebuilt(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<(Value, Vec<u8>)>> {
    let Some(agg) = runs::load_current(connection, run_id)? else {
        return Ok(None);
    };
    let Some(meta) = meta::load(connection, run_id)? else {
        return Ok(None);
    };
    let topology = meta::topology(connection, &meta.definition_digest)?;
    let steps = view::fold_steps(&view_facts::attempt_rows(connection, run_id, 0)?, 1)?;
    let complete: Vec<&wire::StepRecord> = steps.iter().map(|step| &step.value).collect();
    let history = protocol::canonicalize_typed(&complete).unwrap_or_default();
    let digest = crate::ids::sha256(&history);
    let graph_history = view::content_reference(&digest, "application/json", history.len())?;
    let header = view_facts::header(connection, &agg, &meta, graph_history)?;
    let mut visits: BTreeMap<&str, u64> = BTreeMap::new();
    let mut last: BTreeMap<&str, Option<wire::NodeOutcome>> = BTreeMap::new();
    for step in &steps {
        *visits.entry(step.node_id.as_str()).or_default() += 1;
        last.insert(step.node_id.as_str(), step.outcome);
    }
    let nodes: Vec<wire::GraphNode> = topology
        .as_deref()
        .map(|topology| {
            topology
                .nodes
                .iter()
                .map(|node| {
                    let id = node.id.as_str();
                    view::node_entry(
                        node,
                        visits.get(id).copied().unwrap_or(0),
                        last.get(id).copied().flatten(),
                        &agg,
                    )
                })
                .collect::<Result<_, _>>()
        })
        .transpose()?
        .unwrap_or_default();
    let shown: Vec<wire::StepRecord> = steps.iter().map(StepDoc::shown).collect();
    let inline = view::page_prefix(
        shown.iter().map(view::encoded_len),
        view::STEP_PAGE_LIMIT,
        view::STEP_PAGE_BYTES,
    );
    let total = shown.len();
    let items: Vec<wire::StepRecord> = shown.into_iter().take(inline).collect();
    let (updates, updates_total) = view_facts::updates(connection, run_id)?;
    let revision = presentation_revision(connection, run_id)?;
    let view = view::document(
        run_id,
        revision,
        header,
        nodes,
        topology.as_deref(),
        view::step_page(items, total)?,
        view::update_page(updates, updates_total)?,
    )?;
    // The check compares documents, so it hands out the document itself.
    Ok(Some((
        serde_json::to_value(&view).map_err(|_| OffSchema("view"))?,
        history,
    )))
}

/// The patches after `from` take at most this many bytes together; a reader
/// further behind gets a snapshot (bounded by the view's own limits).
pub const PATCH_BYTES: usize = 384 * 1024;

/// The patches after `from` up to the current revision, or `None` when
/// `from` is older than the retained floor or the patches together exceed
/// [`PATCH_BYTES`] (the reader needs a snapshot).
pub fn patches_since(
    connection: &Connection,
    run_id: &RunId,
    from: u64,
) -> rusqlite::Result<Option<(u64, Vec<PatchOp>)>> {
    let (current, floor): (i64, i64) = match connection
        .query_row_cached(
            "SELECT presentation_revision, retained_floor FROM viewer_runs WHERE run_id = ?1",
            params![run_id.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?
    {
        Some(row) => row,
        None => return Ok(None),
    };
    let (current, floor) = (current.max(0) as u64, floor.max(0) as u64);
    if from < floor || from > current {
        return Ok(None);
    }
    let mut statement = connection.prepare_cached(
        "SELECT patch_json FROM viewer_deltas WHERE run_id = ?1 AND presentation_revision > ?2
         ORDER BY presentation_revision, delta_index",
    )?;
    let mut ops = Vec::new();
    let mut bytes = 0usize;
    for patch in statement.query_map(params![run_id.as_str(), i64_of(from)], |row| {
        row.get::<_, String>(0)
    })? {
        let patch = patch?;
        bytes += patch.len();
        if bytes > PATCH_BYTES {
            return Ok(None);
        }
        ops.extend(parse::<Vec<PatchOp>>("patch", &patch)?);
    }
    Ok(Some((current, ops)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::generated::constrained as bounded;

    /// A step document with `attempts` attempts and about `bytes` more
    /// bytes of attempts (each about 150 bytes).
    fn step(seq: usize, attempts: usize, bytes: usize) -> wire::StepRecord {
        let pad = "p".repeat(100);
        let attempts = (1..=attempts + bytes / 150)
            .map(|number| wire::AttemptRecord {
                attempt_id: view::to_wire("attemptId", format!("a{seq}-{number}-{pad}")).unwrap(),
                attempt_number: bounded::AttemptNumber::new(number as u64).unwrap(),
                finished_at_ms: None,
                outcome: None,
                started_at_ms: bounded::TimestampMs::new(1).unwrap(),
            })
            .collect();
        wire::StepRecord {
            attempts,
            finished_at_ms: None,
            node_id: view::to_wire("nodeId", format!("n{seq}")).unwrap(),
            outcome: None,
            seq: bounded::Sequence::new(seq as u64).unwrap(),
            started_at_ms: bounded::TimestampMs::new(1).unwrap(),
            visit: bounded::Visit::new(1).unwrap(),
        }
    }

    /// The snapshot's step page of `steps`, from scratch.
    fn snapshot_page(steps: &[String]) -> wire::StepPage {
        let inline = view::page_prefix(
            steps.iter().map(String::len),
            view::STEP_PAGE_LIMIT,
            view::STEP_PAGE_BYTES,
        );
        view::step_page(
            steps[..inline]
                .iter()
                .map(|text| parse("step", text).unwrap())
                .collect(),
            steps.len(),
        )
        .unwrap()
    }

    /// Every change a run makes to its steps (append, grow the last one past
    /// the byte budget, shrink it back in, append after the page is full):
    /// the previous page plus the patch is exactly the page rebuilt from
    /// scratch, and the bookkeeping matches it.
    #[test]
    fn step_patches_rebuild_the_snapshot_page_as_steps_cross_the_byte_budget() {
        let big = view::STEP_PAGE_BYTES / 5;
        // Each change: `Err(text)` a new last step, `Ok(text)` the last step changed.
        let mut changes: Vec<Result<String, String>> = Vec::new();
        for seq in 1..=4 {
            changes.push(Err(view::canonical_text(&step(seq, 1, big))));
        }
        for attempts in [2, 3] {
            changes.push(Ok(view::canonical_text(&step(
                4,
                attempts,
                big + attempts * big / 2,
            ))));
        }
        // Shrinks back into the page (a shown step can lose bytes).
        changes.push(Ok(view::canonical_text(&step(4, 1, 10))));
        changes.push(Ok(view::canonical_text(&step(4, 3, big * 3))));
        for seq in 5..=8 {
            changes.push(Err(view::canonical_text(&step(seq, 1, 100))));
        }
        let mut small: Vec<Result<String, String>> = (9..=300)
            .map(|seq| Err(view::canonical_text(&step(seq, 1, 10))))
            .collect();
        changes.append(&mut small);
        // And a run whose steps are all small: the item limit takes over.
        let mut steps: Vec<String> = Vec::new();
        let mut page = Page {
            total: 0,
            inline: 0,
            bytes: 0,
        };
        let mut document = serde_json::json!({ "steps": snapshot_page(&steps) });
        let (mut saw_removal, mut saw_rejoin) = (false, false);
        for change in changes {
            let before = page;
            let op = match change {
                Ok(text) => {
                    let old = steps.last().cloned().unwrap();
                    *steps.last_mut().unwrap() = text.clone();
                    page.last_changed(&old, &text).unwrap()
                }
                Err(text) => {
                    steps.push(text.clone());
                    page.appended(&text).unwrap()
                }
            };
            saw_removal |= matches!(op, Some(PatchOp::Remove { .. }));
            saw_rejoin |= before.inline + 1 == before.total && page.inline == page.total;
            let mut ops: Vec<PatchOp> = op.into_iter().collect();
            let as_stored = |page: &Page| Stored {
                steps_total: page.total,
                steps_inline: page.inline,
                ..Stored::default()
            };
            step_page_fields(&as_stored(&before), &as_stored(&page), &mut ops).unwrap();
            let values: Vec<Value> = ops.iter().map(|op| patch_value(op).unwrap()).collect();
            pi_workflows_client::live::apply_patch(&mut document, &values).unwrap();
            let expected = snapshot_page(&steps);
            assert_eq!(
                document["steps"],
                patch_value(&expected).unwrap(),
                "after {} steps: {ops:?}",
                steps.len()
            );
            let inline = expected.items.len();
            assert_eq!(page.inline, inline);
            assert_eq!(
                page.bytes,
                steps[..inline].iter().map(String::len).sum::<usize>()
            );
        }
        assert!(
            saw_removal,
            "a step that grew past the budget left the page"
        );
        assert!(saw_rejoin, "a step that shrank joined the page again");
    }

    #[test]
    fn a_step_shows_its_newest_attempts_only() {
        let rows: Vec<view::AttemptRow> = (1..=view::STEP_ATTEMPTS_SHOWN as u64 + 5)
            .map(|seq| view::AttemptRow {
                seq,
                attempt_id: format!("a{seq}"),
                node_id: "n".into(),
                visit: 1,
                status: "finished".into(),
                outcome: Some("failed".into()),
                started_at_ms: 1,
                finished_at_ms: Some(2),
            })
            .collect();
        let steps = view::fold_steps(&rows, 1).unwrap();
        assert_eq!(steps.len(), 1, "one node visit is one step");
        let (complete, shown) = step_texts(&steps[0]);
        let complete: wire::StepRecord = parse("step", &complete).unwrap();
        assert_eq!(complete.attempts.len(), view::STEP_ATTEMPTS_SHOWN + 5);
        let shown: wire::StepRecord = parse("step", &shown).unwrap();
        let attempts = &shown.attempts;
        assert_eq!(attempts.len(), view::STEP_ATTEMPTS_SHOWN);
        assert_eq!(attempts[0].attempt_number.get(), 6);
        assert_eq!(
            attempts.last().unwrap().attempt_number.get(),
            view::STEP_ATTEMPTS_SHOWN as u64 + 5
        );
    }

    /// The stored SHA-256 state over the final prefix, resumed and finished
    /// with the last step, gives the digest of the whole history.
    #[test]
    fn the_resumed_history_digest_is_the_digest_of_the_whole_history() {
        let steps: Vec<String> = (1..=40)
            .map(|seq| view::canonical_text(&step(seq, seq % 3 + 1, seq * 7)))
            .collect();
        let mut hasher = history_hasher(None);
        for (index, document) in steps.iter().enumerate() {
            let mut total = hasher.clone();
            total.update(document.as_bytes());
            total.update(b"]");
            let whole = format!("[{}]", steps[..=index].join(","));
            assert_eq!(
                <[u8; 32]>::from(total.finalize()),
                crate::ids::sha256(whole.as_bytes()).0
            );
            hasher.update(document.as_bytes());
            hasher.update(b",");
            // Stored and read back between steps.
            hasher = history_hasher(Some(hasher.serialize().as_slice()));
        }
    }
}
