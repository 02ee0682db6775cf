//! Presentation revisions and patches (`viewer_runs`, `viewer_deltas`).
//!
//! Invariants:
//! - A transaction that changes what a run's view shows advances the run's
//!   presentation revision and writes its patch in the same commit (the
//!   writer thread flushes every run a job touched before the job's
//!   savepoint is released).
//! - A patch is computed by comparing the run's small documents (header,
//!   node entries, step entries, the update page) with the ones stored at the
//!   previous revision — never by diffing whole views.
//! - 256 revisions are retained; a reader older than that, or so far behind
//!   that the patches since its revision exceed `PATCH_BYTES`, gets a
//!   snapshot. Every page in the documents is bounded by items and bytes
//!   (`view`), so no patch or snapshot outgrows a frame.
//! - A change that shows nothing new (a lease renewal) makes no revision.

use super::Cached as _;
use super::codec::i64_of;
use crate::view::{self, Projection};
use kernel::ids::RunId;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value, json};
use std::cell::RefCell;
use std::collections::BTreeSet;

/// How many presentation revisions keep their patches.
pub const RETAINED_REVISIONS: u64 = 256;

thread_local! {
    /// Runs the current job changed (the writer thread runs one job at a time).
    static DIRTY: RefCell<BTreeSet<RunId>> = const { RefCell::new(BTreeSet::new()) };
}

/// Marks a run as changed by the current job.
pub(crate) fn mark(run_id: &RunId) {
    DIRTY.with(|dirty| dirty.borrow_mut().insert(run_id.clone()));
}

/// Forgets the marks of a job that rolled back.
pub(crate) fn discard() {
    DIRTY.with(|dirty| dirty.borrow_mut().clear());
}

/// Records a new presentation revision and patch for every run the current
/// job changed. Returns the runs that got a new revision.
pub(crate) fn flush(connection: &Connection) -> rusqlite::Result<Vec<(RunId, u64)>> {
    let dirty = DIRTY.with(|dirty| std::mem::take(&mut *dirty.borrow_mut()));
    let mut published = Vec::new();
    for run_id in dirty {
        if let Some(revision) = record(connection, &run_id)? {
            published.push((run_id, revision));
        }
    }
    Ok(published)
}

/// The stored small documents of the last revision.
#[derive(Default)]
struct Stored {
    revision: u64,
    header: Map<String, Value>,
    nodes: Vec<Value>,
    steps_total: usize,
    steps_tail: Option<Value>,
    updates: Vec<Value>,
    updates_total: usize,
}

fn stored(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Stored> {
    let row = connection
        .query_row_cached(
            "SELECT presentation_revision, header_json, nodes_json, steps_total, steps_tail_json, updates_json,
               updates_total
             FROM viewer_runs WHERE run_id = ?1",
            params![run_id.as_str()],
            |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, i64>(3)?,
                    row.get::<_, Option<String>>(4)?,
                    row.get::<_, Option<String>>(5)?,
                    row.get::<_, i64>(6)?,
                ))
            },
        )
        .optional()?;
    let Some((revision, header, nodes, steps_total, tail, updates, updates_total)) = row else {
        return Ok(Stored::default());
    };
    // Parsed straight into their shapes (text of another shape reads as
    // empty, as before), without copying them out of a `Value`.
    fn parse<T: serde::de::DeserializeOwned>(text: Option<String>) -> Option<T> {
        text.and_then(|text| serde_json::from_str::<T>(&text).ok())
    }
    Ok(Stored {
        revision: revision.max(0) as u64,
        header: parse::<Map<String, Value>>(header).unwrap_or_default(),
        nodes: parse::<Vec<Value>>(nodes).unwrap_or_default(),
        steps_total: steps_total.max(0) as usize,
        steps_tail: parse::<Value>(tail),
        updates: parse::<Vec<Value>>(updates).unwrap_or_default(),
        updates_total: updates_total.max(0) as usize,
    })
}

/// Computes and stores the patch of one run, if its view changed.
fn record(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Option<u64>> {
    let Some(projection) = view::projection(connection, run_id)? else {
        return Ok(None);
    };
    let before = stored(connection, run_id)?;
    let mut ops = Vec::new();
    diff_header(&before.header, &projection.header, &mut ops);
    for (index, node) in projection.nodes.iter().enumerate() {
        match before.nodes.get(index) {
            Some(old) if old == node => {}
            Some(_) => ops
                .push(json!({ "op": "replace", "path": format!("/nodes/{index}"), "value": node })),
            None => ops.push(json!({ "op": "append", "path": "/nodes", "value": node })),
        }
    }
    diff_steps(&before, &projection, &mut ops);
    if before.updates != projection.updates || before.updates_total != projection.updates_total {
        ops.push(json!({ "op": "replace", "path": "/updates", "value": projection.update_page() }));
    }
    if ops.is_empty() {
        return Ok(None);
    }
    let revision = before.revision + 1;
    ops.push(json!({ "op": "replace", "path": "/revision", "value": revision }));
    store(connection, run_id, revision, &projection, &ops)?;
    Ok(Some(revision))
}

fn diff_header(before: &Map<String, Value>, after: &Map<String, Value>, ops: &mut Vec<Value>) {
    for (key, value) in after {
        match before.get(key) {
            Some(old) if old == value => {}
            Some(_) => {
                ops.push(json!({ "op": "replace", "path": format!("/{key}"), "value": value }))
            }
            None => ops.push(json!({ "op": "add", "path": format!("/{key}"), "value": value })),
        }
    }
    for key in before.keys().filter(|key| !after.contains_key(*key)) {
        ops.push(json!({ "op": "remove", "path": format!("/{key}") }));
    }
}

/// Steps only grow, and only the last one changes while its attempts run.
/// The inline page holds the leading steps that fit its item limit and byte
/// budget; later steps are reached through pages.
///
/// The previous step list is the current one cut to the previous total with
/// the stored tail as its last entry (every earlier step is final), so the
/// previous inline count is recomputed exactly: the inline page grows by
/// appends, changes its last entry in place, or loses its last entry when
/// that step grew past the budget.
fn diff_steps(before: &Stored, after: &Projection, ops: &mut Vec<Value>) {
    let total = after.steps.len();
    let known = before.steps_total;
    let tail_size = before.steps_tail.as_ref().map(view::encoded_len);
    if known > total || (known > 0 && tail_size.is_none()) {
        // Not a prefix of this run's steps (never expected): the whole page.
        ops.push(json!({ "op": "replace", "path": "/steps", "value": after.step_page() }));
        return;
    }
    let before_sizes = after.step_sizes[..known.saturating_sub(1)]
        .iter()
        .copied()
        .chain(tail_size);
    let shown_before =
        view::page_prefix(before_sizes, view::STEP_PAGE_LIMIT, view::STEP_PAGE_BYTES);
    let shown_after = after.inline_steps();
    if known > 0 && known - 1 < shown_before.min(shown_after) {
        let index = known - 1;
        if before.steps_tail.as_ref() != Some(&after.steps[index]) {
            ops.push(json!({ "op": "replace", "path": format!("/steps/items/{index}"), "value": after.steps[index] }));
        }
    }
    for index in (shown_after..shown_before).rev() {
        ops.push(json!({ "op": "remove", "path": format!("/steps/items/{index}") }));
    }
    for index in shown_before..shown_after {
        ops.push(json!({ "op": "append", "path": "/steps/items", "value": after.steps[index] }));
    }
    if total != known {
        ops.push(json!({ "op": "replace", "path": "/steps/total", "value": total }));
    }
    match (known > shown_before, total > shown_after) {
        (false, true) => ops.push(json!({ "op": "add", "path": "/steps/nextCursor", "value": shown_after.to_string() })),
        (true, true) if shown_before != shown_after => ops.push(json!({ "op": "replace", "path": "/steps/nextCursor", "value": shown_after.to_string() })),
        (true, false) => ops.push(json!({ "op": "remove", "path": "/steps/nextCursor" })),
        _ => {}
    }
}

fn store(
    connection: &Connection,
    run_id: &RunId,
    revision: u64,
    projection: &Projection,
    ops: &[Value],
) -> rusqlite::Result<()> {
    // The documents serialise as they are (a `Map` or `Vec<Value>` writes the
    // same JSON as the `Value` wrapping it), without copying them first.
    fn text<T: serde::Serialize + ?Sized>(value: &T) -> String {
        serde_json::to_string(value).unwrap_or_default()
    }
    let tail = projection.steps.last().map(text);
    connection.execute_cached(
        "INSERT INTO viewer_runs (run_id, presentation_revision, retained_floor, header_json, nodes_json, steps_total,
             steps_tail_json, updates_json, updates_total)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (run_id) DO UPDATE SET presentation_revision = excluded.presentation_revision,
           retained_floor = excluded.retained_floor, header_json = excluded.header_json,
           nodes_json = excluded.nodes_json, steps_total = excluded.steps_total,
           steps_tail_json = excluded.steps_tail_json, updates_json = excluded.updates_json,
           updates_total = excluded.updates_total",
        params![
            run_id.as_str(),
            i64_of(revision),
            i64_of(revision.saturating_sub(RETAINED_REVISIONS)),
            text(&projection.header),
            text(&projection.nodes),
            projection.steps.len() as i64,
            tail,
            text(&projection.updates),
            projection.updates_total as i64,
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
) -> rusqlite::Result<Option<(u64, Vec<Value>)>> {
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
        if let Ok(Value::Array(items)) = serde_json::from_str(&patch) {
            ops.extend(items);
        }
    }
    Ok(Some((current, ops)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step document of about `bytes` bytes with `attempts` attempts.
    fn step(seq: usize, attempts: usize, bytes: usize) -> Value {
        let attempts: Vec<Value> = (1..=attempts)
            .map(|number| json!({ "attemptId": format!("a{seq}-{number}"), "attemptNumber": number, "startedAtMs": 1 }))
            .collect();
        json!({ "seq": seq, "nodeId": format!("n{seq}-{}", "p".repeat(bytes)), "visit": 1, "startedAtMs": 1, "attempts": attempts })
    }

    fn projection(steps: &[Value]) -> Projection {
        Projection {
            header: Map::new(),
            nodes: Vec::new(),
            topology: None,
            steps: steps.to_vec(),
            step_sizes: steps.iter().map(view::encoded_len).collect(),
            updates: Vec::new(),
            updates_total: 0,
        }
    }

    fn stored_of(projection: &Projection) -> Stored {
        Stored {
            steps_total: projection.steps.len(),
            steps_tail: projection.steps.last().cloned(),
            ..Stored::default()
        }
    }

    /// Every change a run makes to its steps (append, grow the last one past
    /// the byte budget, append after the page is full, shrink nothing else):
    /// the previous page plus the patch is exactly the new snapshot page, and
    /// no page is over its budget unless it holds a single step.
    #[test]
    fn step_patches_rebuild_the_snapshot_page_as_steps_cross_the_byte_budget() {
        let big = view::STEP_PAGE_BYTES / 5;
        let mut steps: Vec<Value> = Vec::new();
        let mut changes: Vec<Vec<Value>> = Vec::new();
        for seq in 1..=4 {
            steps.push(step(seq, 1, big));
            changes.push(steps.clone());
        }
        // The last inline step grows (more attempts, a longer document)
        // until it no longer fits: it leaves the inline page.
        for attempts in [2, 3] {
            let last = steps.len() - 1;
            steps[last] = step(4, attempts, big + attempts * big / 2);
            changes.push(steps.clone());
        }
        for seq in 5..=8 {
            steps.push(step(seq, 1, 100));
            changes.push(steps.clone());
        }
        // Many small steps: the item limit takes over.
        for seq in 9..=300 {
            steps.push(step(seq, 1, 10));
        }
        changes.push(steps.clone());
        let mut previous = projection(&[]);
        let mut page = json!({ "steps": previous.step_page() });
        let mut saw_removal = false;
        for after in changes {
            let next = projection(&after);
            let mut ops = Vec::new();
            diff_steps(&stored_of(&previous), &next, &mut ops);
            saw_removal |= ops.iter().any(|op| op["op"] == "remove");
            pi_workflows_client::live::apply_patch(&mut page, &ops).unwrap();
            assert_eq!(
                page["steps"],
                next.step_page(),
                "after {} steps: {ops:?}",
                after.len()
            );
            let inline = next.inline_steps();
            let bytes: usize = next.step_sizes[..inline].iter().sum();
            assert!(inline <= view::STEP_PAGE_LIMIT);
            assert!(
                inline == 1 || bytes <= view::STEP_PAGE_BYTES,
                "{bytes} bytes inline"
            );
            previous = next;
        }
        assert!(
            saw_removal,
            "a step that grew past the budget left the page"
        );
    }

    #[test]
    fn a_step_shows_its_newest_attempts_only() {
        let many = step(1, view::STEP_ATTEMPTS_SHOWN + 5, 1);
        let shown = crate::view::steps_shown_for_test(many);
        let attempts = shown["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), view::STEP_ATTEMPTS_SHOWN);
        assert_eq!(attempts[0]["attemptNumber"], 6);
        assert_eq!(
            attempts.last().unwrap()["attemptNumber"],
            view::STEP_ATTEMPTS_SHOWN + 5
        );
    }
}
