//! Managed resources and their controller state (`resources`,
//! `resource_queue`, `controller_effects`, `controller_child_requests`,
//! `resource_events`): rows in, kernel records out. The decisions are
//! `kernel::resource`, `kernel::reconcile`, `kernel::controller_effect` and
//! `kernel::child_workflow`'s; this module only reads and writes them.
//!
//! Invariants:
//! - A resource row reads back into the `ResourceRecord` it was written
//!   from. [`update`] writes a record only over the version just before
//!   it (`resource_version` grows by exactly one per write); anything else
//!   fails the job (nothing is written).
//! - The queue row is written with its resource ([`write_queue`] after
//!   [`insert`]) and deleted with it (`ON DELETE CASCADE`); a claim's
//!   token is stored only as its hash, and no read for a view returns it
//!   ([`QueueView`]).
//! - The queue helpers ([`enqueue`], [`claim`], [`renew`], [`finish`])
//!   load the row, call the kernel's decision and write its row only when
//!   the kernel accepted; a rejection writes nothing.
//! - Events are appended, never changed; their detail is a bounded phrase
//!   (at most [`MAX_EVENT_DETAIL_BYTES`]) and never spec or status contents.

use super::Cached as _;
use super::codec::{DigestColumn, from_json, i64_of, json, name, parse, u64_of};
use kernel::child_workflow::ChildRequest;
use kernel::controller_effect::ControllerEffect;
use kernel::ids::{Digest, RunId};
use kernel::reconcile::{self, Finished, QueueRow, ReconcileClaim, ReconcileRejection};
use kernel::resource::{ResourceRecord, ResourceStatus};
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};

/// The longest event detail, in bytes.
pub const MAX_EVENT_DETAIL_BYTES: usize = 1024;

/// How many resources `list` returns at most.
pub const MAX_LISTED: usize = 1000;

/// A resource row: the kernel's record and what only the server keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResource {
    pub record: ResourceRecord,
    /// The controller file the spec was accepted under.
    pub controller_path: String,
    /// The project the resource was applied from (`None`: home only).
    pub project_path: Option<String>,
    pub created_at_ms: u64,
}

const RESOURCE_COLUMNS: &str = "uid, controller, resource_key, resource_version, generation, spec_json, spec_digest, status_json, deletion_requested_at_ms, finalizers_json, source_digest, updated_at_ms, controller_path, project_path, created_at_ms";

fn resource_of(row: &Row<'_>) -> rusqlite::Result<StoredResource> {
    let spec_json: String = row.get(5)?;
    let status_json: String = row.get(7)?;
    let finalizers_json: String = row.get(9)?;
    Ok(StoredResource {
        record: ResourceRecord {
            uid: row.get(0)?,
            controller: row.get(1)?,
            key: row.get(2)?,
            resource_version: u64_of(row.get(3)?),
            generation: u64_of(row.get(4)?),
            spec: from_json(&spec_json)?,
            spec_digest: row.get::<_, DigestColumn>(6)?.0,
            status: from_json::<ResourceStatus>(&status_json)?,
            deletion_requested_at_ms: row.get::<_, Option<i64>>(8)?.map(u64_of),
            finalizers: from_json(&finalizers_json)?,
            source_digest: row.get::<_, DigestColumn>(10)?.0,
            updated_at_ms: u64_of(row.get(11)?),
        },
        controller_path: row.get(12)?,
        project_path: row.get(13)?,
        created_at_ms: u64_of(row.get(14)?),
    })
}

/// The resource `controller`/`key`, if it exists.
pub fn load(
    connection: &Connection,
    controller: &str,
    key: &str,
) -> rusqlite::Result<Option<StoredResource>> {
    connection
        .query_row_cached(
            &format!(
                "SELECT {RESOURCE_COLUMNS} FROM resources WHERE controller = ?1 AND resource_key = ?2"
            ),
            params![controller, key],
            resource_of,
        )
        .optional()
}

/// The resource with `uid`, if it exists.
pub fn load_by_uid(connection: &Connection, uid: &str) -> rusqlite::Result<Option<StoredResource>> {
    connection
        .query_row_cached(
            &format!("SELECT {RESOURCE_COLUMNS} FROM resources WHERE uid = ?1"),
            params![uid],
            resource_of,
        )
        .optional()
}

/// Inserts a new resource (`kernel::resource::Applied::Created`). Write its
/// queue row next, in the same transaction.
pub fn insert(connection: &Connection, resource: &StoredResource) -> rusqlite::Result<()> {
    let record = &resource.record;
    connection.execute_cached(
        "INSERT INTO resources (uid, controller, resource_key, resource_version, generation, spec_json, spec_digest, status_json, deletion_requested_at_ms, finalizers_json, source_digest, updated_at_ms, controller_path, project_path, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
        params![
            record.uid,
            record.controller,
            record.key,
            i64_of(record.resource_version),
            i64_of(record.generation),
            json(&record.spec),
            record.spec_digest.0.to_vec(),
            json(&record.status),
            record.deletion_requested_at_ms.map(i64_of),
            json(&record.finalizers),
            record.source_digest.0.to_vec(),
            i64_of(record.updated_at_ms),
            resource.controller_path,
            resource.project_path,
            i64_of(resource.created_at_ms),
        ],
    )?;
    Ok(())
}

/// Writes a changed record (`Applied::Updated`, `request_deletion`,
/// `Proposed::Written`) over the row one version before it. The row must
/// be at `record.resource_version - 1`; otherwise nothing is written and
/// the job fails.
pub fn update(connection: &Connection, record: &ResourceRecord) -> rusqlite::Result<()> {
    let changed = connection.execute_cached(
        "UPDATE resources SET resource_version = ?2, generation = ?3, spec_json = ?4, spec_digest = ?5,
           status_json = ?6, deletion_requested_at_ms = ?7, finalizers_json = ?8, source_digest = ?9,
           updated_at_ms = ?10
         WHERE uid = ?1 AND resource_version = ?2 - 1",
        params![
            record.uid,
            i64_of(record.resource_version),
            i64_of(record.generation),
            json(&record.spec),
            record.spec_digest.0.to_vec(),
            json(&record.status),
            record.deletion_requested_at_ms.map(i64_of),
            json(&record.finalizers),
            record.source_digest.0.to_vec(),
            i64_of(record.updated_at_ms),
        ],
    )?;
    one_row(changed)
}

/// Records the controller file (and project) a changed spec was accepted
/// under (with [`update`] for `Applied::Updated`).
pub fn set_source(
    connection: &Connection,
    uid: &str,
    controller_path: &str,
    project_path: Option<&str>,
) -> rusqlite::Result<()> {
    let changed = connection.execute_cached(
        "UPDATE resources SET controller_path = ?2, project_path = ?3 WHERE uid = ?1",
        params![uid, controller_path, project_path],
    )?;
    one_row(changed)
}

/// Deletes a resource (`Proposed::Deleted`) with its queue row, effects and
/// child requests; its events stay.
pub fn delete(connection: &Connection, uid: &str) -> rusqlite::Result<()> {
    let changed =
        connection.execute_cached("DELETE FROM resources WHERE uid = ?1", params![uid])?;
    one_row(changed)
}

fn one_row(changed: usize) -> rusqlite::Result<()> {
    if changed == 1 {
        Ok(())
    } else {
        Err(rusqlite::Error::StatementChangedRows(changed))
    }
}

/// One row of `resource.list`: no spec, no claim secrets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedResource {
    pub controller: String,
    pub key: String,
    pub uid: String,
    pub resource_version: u64,
    pub generation: u64,
    pub status: ResourceStatus,
    pub deletion_requested_at_ms: Option<u64>,
    pub updated_at_ms: u64,
    /// The queue's last error and consecutive error count.
    pub last_error: Option<String>,
    pub consecutive_errors: u32,
    /// When the queue may reconcile it next (`None`: idle).
    pub available_at_ms: Option<u64>,
}

/// Resources by controller and key (of one controller when given), at most
/// [`MAX_LISTED`].
pub fn list(
    connection: &Connection,
    controller: Option<&str>,
) -> rusqlite::Result<Vec<ListedResource>> {
    let mut statement = connection.prepare_cached(
        "SELECT r.controller, r.resource_key, r.uid, r.resource_version, r.generation, r.status_json,
                r.deletion_requested_at_ms, r.updated_at_ms, q.last_error, q.consecutive_errors, q.available_at_ms
         FROM resources r LEFT JOIN resource_queue q ON q.resource_uid = r.uid
         WHERE ?1 IS NULL OR r.controller = ?1
         ORDER BY r.controller, r.resource_key LIMIT ?2",
    )?;
    let rows = statement.query_map(params![controller, i64_of(MAX_LISTED as u64)], |row| {
        let status_json: String = row.get(5)?;
        Ok(ListedResource {
            controller: row.get(0)?,
            key: row.get(1)?,
            uid: row.get(2)?,
            resource_version: u64_of(row.get(3)?),
            generation: u64_of(row.get(4)?),
            status: from_json(&status_json)?,
            deletion_requested_at_ms: row.get::<_, Option<i64>>(6)?.map(u64_of),
            updated_at_ms: u64_of(row.get(7)?),
            last_error: row.get(8)?,
            consecutive_errors: u32::try_from(row.get::<_, Option<i64>>(9)?.unwrap_or(0))
                .unwrap_or(u32::MAX),
            available_at_ms: row.get::<_, Option<i64>>(10)?.map(u64_of),
        })
    })?;
    rows.collect()
}

// ---- the queue (kernel::reconcile) --------------------------------------------

fn queue_of(row: &Row<'_>) -> rusqlite::Result<QueueRow> {
    let generation = u64_of(row.get(4)?);
    let token_hash: Option<DigestColumn> = row.get(5)?;
    let claim = match token_hash {
        None => None,
        Some(token_hash) => Some(ReconcileClaim {
            generation,
            token_hash: token_hash.0,
            expires_at_ms: u64_of(row.get::<_, Option<i64>>(6)?.unwrap_or(0)),
            claimed_version: u64_of(row.get::<_, Option<i64>>(7)?.unwrap_or(0)),
        }),
    };
    Ok(QueueRow {
        available_at_ms: row.get::<_, Option<i64>>(0)?.map(u64_of),
        version: u64_of(row.get(1)?),
        consecutive_errors: u32::try_from(row.get::<_, i64>(2)?).unwrap_or(u32::MAX),
        last_error: row.get(3)?,
        generation,
        claim,
    })
}

const QUEUE_COLUMNS: &str = "available_at_ms, version, consecutive_errors, last_error, claim_generation, claim_token_hash, claim_expires_at_ms, claimed_version";

/// The queue row of the resource `uid`.
pub fn load_queue(connection: &Connection, uid: &str) -> rusqlite::Result<Option<QueueRow>> {
    connection
        .query_row_cached(
            &format!("SELECT {QUEUE_COLUMNS} FROM resource_queue WHERE resource_uid = ?1"),
            params![uid],
            queue_of,
        )
        .optional()
}

/// Writes the queue row of the resource `uid` (insert or replace): the row
/// a kernel::reconcile decision returned. A claim's generation is the
/// row's (`kernel::reconcile::claim` hands out `generation + 1` to both).
pub fn write_queue(connection: &Connection, uid: &str, row: &QueueRow) -> rusqlite::Result<()> {
    debug_assert!(
        row.claim
            .is_none_or(|claim| claim.generation == row.generation)
    );
    connection.execute_cached(
        "INSERT INTO resource_queue (resource_uid, available_at_ms, version, consecutive_errors, last_error, claim_generation, claim_token_hash, claim_expires_at_ms, claimed_version)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (resource_uid) DO UPDATE SET available_at_ms = excluded.available_at_ms,
           version = excluded.version, consecutive_errors = excluded.consecutive_errors,
           last_error = excluded.last_error, claim_generation = excluded.claim_generation,
           claim_token_hash = excluded.claim_token_hash, claim_expires_at_ms = excluded.claim_expires_at_ms,
           claimed_version = excluded.claimed_version",
        params![
            uid,
            row.available_at_ms.map(i64_of),
            i64_of(row.version),
            i64::from(row.consecutive_errors),
            row.last_error,
            i64_of(row.generation),
            row.claim.map(|claim| claim.token_hash.0.to_vec()),
            row.claim.map(|claim| i64_of(claim.expires_at_ms)),
            row.claim.map(|claim| i64_of(claim.claimed_version)),
        ],
    )?;
    Ok(())
}

/// `kernel::reconcile::enqueue` on the resource's row (a new row when it
/// has none), written; the row written.
pub fn enqueue(connection: &Connection, uid: &str, at_ms: u64) -> rusqlite::Result<QueueRow> {
    let row = reconcile::enqueue(load_queue(connection, uid)?.as_ref(), at_ms);
    write_queue(connection, uid, &row)?;
    Ok(row)
}

/// `kernel::reconcile::claim` on the resource's row; written when accepted.
/// `None`: the resource has no queue row.
pub fn claim(
    connection: &Connection,
    uid: &str,
    token_hash: Digest,
    lease_ms: u64,
    now_ms: u64,
) -> rusqlite::Result<Option<Result<QueueRow, ReconcileRejection>>> {
    decide(connection, uid, |row| {
        reconcile::claim(row, token_hash, lease_ms, now_ms)
    })
}

/// `kernel::reconcile::renew` on the resource's row; written when accepted.
pub fn renew(
    connection: &Connection,
    uid: &str,
    generation: u64,
    token_hash: &Digest,
    lease_ms: u64,
    now_ms: u64,
) -> rusqlite::Result<Option<Result<QueueRow, ReconcileRejection>>> {
    decide(connection, uid, |row| {
        reconcile::renew(row, generation, token_hash, lease_ms, now_ms)
    })
}

/// `kernel::reconcile::finish` on the resource's row; written when accepted.
pub fn finish(
    connection: &Connection,
    uid: &str,
    generation: u64,
    token_hash: &Digest,
    finished: &Finished,
    now_ms: u64,
) -> rusqlite::Result<Option<Result<QueueRow, ReconcileRejection>>> {
    decide(connection, uid, |row| {
        reconcile::finish(row, generation, token_hash, finished, now_ms)
    })
}

fn decide(
    connection: &Connection,
    uid: &str,
    decision: impl FnOnce(&QueueRow) -> Result<QueueRow, ReconcileRejection>,
) -> rusqlite::Result<Option<Result<QueueRow, ReconcileRejection>>> {
    let Some(row) = load_queue(connection, uid)? else {
        return Ok(None);
    };
    let decided = decision(&row);
    if let Ok(next) = &decided {
        write_queue(connection, uid, next)?;
    }
    Ok(Some(decided))
}

/// A queue row the admission loop may claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimable {
    pub uid: String,
    pub controller: String,
    pub key: String,
    pub row: QueueRow,
}

/// Up to `limit` rows claimable at `now_ms` (available and unclaimed or
/// with an expired claim: `kernel::reconcile::claimable`), soonest first.
pub fn claimable(
    connection: &Connection,
    now_ms: u64,
    limit: usize,
) -> rusqlite::Result<Vec<Claimable>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {QUEUE_COLUMNS}, r.uid, r.controller, r.resource_key
         FROM resource_queue q JOIN resources r ON r.uid = q.resource_uid
         WHERE q.available_at_ms IS NOT NULL AND q.available_at_ms <= ?1
           AND (q.claim_expires_at_ms IS NULL OR q.claim_expires_at_ms <= ?1)
         ORDER BY q.available_at_ms, r.uid LIMIT ?2"
    ))?;
    let rows = statement.query_map(params![i64_of(now_ms), i64_of(limit as u64)], |row| {
        Ok(Claimable {
            row: queue_of(row)?,
            uid: row.get(8)?,
            controller: row.get(9)?,
            key: row.get(10)?,
        })
    })?;
    let rows: Vec<Claimable> = rows.collect::<rusqlite::Result<_>>()?;
    Ok(rows
        .into_iter()
        .filter(|candidate| reconcile::claimable(&candidate.row, now_ms))
        .collect())
}

/// The earliest time a row becomes available or a claim expires (for the
/// admission timer); `None` when every row is idle and unclaimed.
pub fn next_due_at(connection: &Connection) -> rusqlite::Result<Option<u64>> {
    let due: Option<i64> = connection.query_row_cached(
        "SELECT min(m) FROM (
           SELECT min(available_at_ms) AS m FROM resource_queue WHERE available_at_ms IS NOT NULL AND claim_token_hash IS NULL
           UNION ALL
           SELECT min(claim_expires_at_ms) FROM resource_queue WHERE claim_expires_at_ms IS NOT NULL)",
        [],
        |row| row.get(0),
    )?;
    Ok(due.map(u64_of))
}

/// A queue row as a view shows it: no token hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueView {
    pub available_at_ms: Option<u64>,
    pub version: u64,
    pub consecutive_errors: u32,
    pub last_error: Option<String>,
    /// Whether a claim is held (live or expired, see `claim_expires_at_ms`).
    pub claim_generation: Option<u64>,
    pub claim_expires_at_ms: Option<u64>,
}

impl From<&QueueRow> for QueueView {
    fn from(row: &QueueRow) -> Self {
        Self {
            available_at_ms: row.available_at_ms,
            version: row.version,
            consecutive_errors: row.consecutive_errors,
            last_error: row.last_error.clone(),
            claim_generation: row.claim.map(|claim| claim.generation),
            claim_expires_at_ms: row.claim.map(|claim| claim.expires_at_ms),
        }
    }
}

// ---- controller effects (kernel::controller_effect) ---------------------------------

/// An effect row: the kernel's record and what apply reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEffect {
    pub effect: ControllerEffect,
    pub external_ref: Option<String>,
    pub error: Option<String>,
}

const EFFECT_COLUMNS: &str = "resource_uid, effect_key, kind, request_fingerprint, generation, state, started_at_ms, completed_at_ms, external_ref, error";

fn effect_of(row: &Row<'_>) -> rusqlite::Result<StoredEffect> {
    let state: String = row.get(5)?;
    Ok(StoredEffect {
        effect: ControllerEffect {
            resource_uid: row.get(0)?,
            key: row.get(1)?,
            kind: row.get(2)?,
            request_fingerprint: row.get::<_, DigestColumn>(3)?.0,
            generation: u64_of(row.get(4)?),
            state: parse(&state)?,
            started_at_ms: u64_of(row.get(6)?),
            completed_at_ms: row.get::<_, Option<i64>>(7)?.map(u64_of),
        },
        external_ref: row.get(8)?,
        error: row.get(9)?,
    })
}

/// The effect `key` of the resource `uid`.
pub fn load_effect(
    connection: &Connection,
    uid: &str,
    key: &str,
) -> rusqlite::Result<Option<StoredEffect>> {
    connection
        .query_row_cached(
            &format!(
                "SELECT {EFFECT_COLUMNS} FROM controller_effects WHERE resource_uid = ?1 AND effect_key = ?2"
            ),
            params![uid, key],
            effect_of,
        )
        .optional()
}

/// Reserves a new effect (`Ensure::Apply` of a new key: `pending`).
pub fn insert_effect(connection: &Connection, effect: &ControllerEffect) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO controller_effects (resource_uid, effect_key, kind, request_fingerprint, generation, state, started_at_ms, completed_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            effect.resource_uid,
            effect.key,
            effect.kind,
            effect.request_fingerprint.0.to_vec(),
            i64_of(effect.generation),
            name(&effect.state),
            i64_of(effect.started_at_ms),
            effect.completed_at_ms.map(i64_of),
        ],
    )?;
    Ok(())
}

/// Writes an effect's new state (`observed`, `applied`) and what apply
/// reported (`None` keeps what is stored). Its key, kind, fingerprint and
/// generation never change.
pub fn update_effect(
    connection: &Connection,
    effect: &ControllerEffect,
    external_ref: Option<&str>,
    error: Option<&str>,
) -> rusqlite::Result<()> {
    let changed = connection.execute_cached(
        "UPDATE controller_effects SET state = ?3, started_at_ms = ?4, completed_at_ms = ?5,
           external_ref = coalesce(?6, external_ref), error = coalesce(?7, error)
         WHERE resource_uid = ?1 AND effect_key = ?2",
        params![
            effect.resource_uid,
            effect.key,
            name(&effect.state),
            i64_of(effect.started_at_ms),
            effect.completed_at_ms.map(i64_of),
            external_ref,
            error,
        ],
    )?;
    one_row(changed)
}

/// The effects of the resource `uid`, newest first, at most `limit`.
pub fn effects_of(
    connection: &Connection,
    uid: &str,
    limit: usize,
) -> rusqlite::Result<Vec<StoredEffect>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {EFFECT_COLUMNS} FROM controller_effects WHERE resource_uid = ?1
         ORDER BY started_at_ms DESC, effect_key LIMIT ?2"
    ))?;
    let rows = statement.query_map(params![uid, i64_of(limit as u64)], effect_of)?;
    rows.collect()
}

// ---- child workflow requests (kernel::child_workflow) -------------------------------

const CHILD_COLUMNS: &str =
    "resource_uid, request_key, workflow, input_fingerprint, attempt, run_id, state";

fn child_of(row: &Row<'_>) -> rusqlite::Result<ChildRequest> {
    let state: String = row.get(6)?;
    Ok(ChildRequest {
        resource_uid: row.get(0)?,
        request_key: row.get(1)?,
        workflow: row.get(2)?,
        input_fingerprint: row.get::<_, DigestColumn>(3)?.0,
        attempt: u32::try_from(row.get::<_, i64>(4)?).unwrap_or(u32::MAX),
        run_id: RunId::new(row.get::<_, String>(5)?),
        state: parse(&state)?,
    })
}

/// The child request `request_key` of the resource `uid`.
pub fn load_child(
    connection: &Connection,
    uid: &str,
    request_key: &str,
) -> rusqlite::Result<Option<ChildRequest>> {
    connection
        .query_row_cached(
            &format!(
                "SELECT {CHILD_COLUMNS} FROM controller_child_requests WHERE resource_uid = ?1 AND request_key = ?2"
            ),
            params![uid, request_key],
            child_of,
        )
        .optional()
}

/// The child request whose current attempt is the run `run_id` (for
/// `kernel::child_workflow::on_run_ended` in the run's terminal transaction).
pub fn load_child_by_run(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<ChildRequest>> {
    connection
        .query_row_cached(
            &format!("SELECT {CHILD_COLUMNS} FROM controller_child_requests WHERE run_id = ?1"),
            params![run_id.as_str()],
            child_of,
        )
        .optional()
}

/// Writes a child request (`Ensured::Start`: a new request or a new attempt
/// with its reserved run id; `on_run_ended`: its new state).
pub fn upsert_child(
    connection: &Connection,
    request: &ChildRequest,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO controller_child_requests (resource_uid, request_key, workflow, input_fingerprint, attempt, run_id, state, created_at_ms, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)
         ON CONFLICT (resource_uid, request_key) DO UPDATE SET workflow = excluded.workflow,
           input_fingerprint = excluded.input_fingerprint, attempt = excluded.attempt,
           run_id = excluded.run_id, state = excluded.state, updated_at_ms = excluded.updated_at_ms",
        params![
            request.resource_uid,
            request.request_key,
            request.workflow,
            request.input_fingerprint.0.to_vec(),
            i64::from(request.attempt),
            request.run_id.as_str(),
            name(&request.state),
            i64_of(now_ms),
        ],
    )?;
    Ok(())
}

/// The child requests of the resource `uid`, newest first, at most `limit`.
pub fn children_of(
    connection: &Connection,
    uid: &str,
    limit: usize,
) -> rusqlite::Result<Vec<ChildRequest>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {CHILD_COLUMNS} FROM controller_child_requests WHERE resource_uid = ?1
         ORDER BY updated_at_ms DESC, request_key LIMIT ?2"
    ))?;
    let rows = statement.query_map(params![uid, i64_of(limit as u64)], child_of)?;
    rows.collect()
}

// ---- events -------------------------------------------------------------------

/// What happened to a resource (the `resource_events.kind` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceEventKind {
    /// `resource.apply` created the resource or changed its spec.
    Applied,
    /// `resource.reconcile` enqueued it.
    ReconcileRequested,
    /// `resource.delete` marked it for deletion.
    DeletionRequested,
    ReconcileStarted,
    ReconcileSettled,
    ReconcileRequeued,
    /// A reconcile's status write lost its compare-and-swap.
    ReconcileConflict,
    ReconcileFailed,
    /// A reconcile's claim was lost (expired or superseded).
    ClaimLost,
    EffectReserved,
    EffectSettled,
    /// A pending or indeterminate effect was observed by a later pass.
    EffectRecovered,
    WorkflowStarted,
    WorkflowEnded,
    /// The row was deleted (marked, settled, no finalizer left).
    ResourceDeleted,
}

/// One event to append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceEvent {
    pub controller: String,
    pub key: String,
    pub uid: String,
    pub kind: ResourceEventKind,
    pub resource_version: Option<u64>,
    pub generation: Option<u64>,
    pub at_ms: u64,
    /// A bounded phrase (cut at [`MAX_EVENT_DETAIL_BYTES`]); never spec or
    /// status contents.
    pub detail: Option<String>,
}

impl ResourceEvent {
    /// An event about `record` at its current version and generation.
    pub fn of(record: &ResourceRecord, kind: ResourceEventKind, at_ms: u64) -> Self {
        Self {
            controller: record.controller.clone(),
            key: record.key.clone(),
            uid: record.uid.clone(),
            kind,
            resource_version: Some(record.resource_version),
            generation: Some(record.generation),
            at_ms,
            detail: None,
        }
    }

    /// The same event with a detail phrase.
    #[must_use]
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// A stored event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    pub seq: u64,
    pub event: ResourceEvent,
}

/// Appends an event; its sequence number.
pub fn append_event(connection: &Connection, event: &ResourceEvent) -> rusqlite::Result<u64> {
    let detail = event.detail.as_deref().map(bounded_detail);
    connection.execute_cached(
        "INSERT INTO resource_events (controller, resource_key, resource_uid, kind, resource_version, generation, at_ms, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            event.controller,
            event.key,
            event.uid,
            name(&event.kind),
            event.resource_version.map(i64_of),
            event.generation.map(i64_of),
            i64_of(event.at_ms),
            detail,
        ],
    )?;
    Ok(u64_of(connection.last_insert_rowid()))
}

/// The last `limit` events of `controller`/`key` (of every uid it had),
/// oldest first.
pub fn recent_events(
    connection: &Connection,
    controller: &str,
    key: &str,
    limit: usize,
) -> rusqlite::Result<Vec<StoredEvent>> {
    let mut statement = connection.prepare_cached(
        "SELECT seq, controller, resource_key, resource_uid, kind, resource_version, generation, at_ms, detail
         FROM (SELECT * FROM resource_events WHERE controller = ?1 AND resource_key = ?2
               ORDER BY seq DESC LIMIT ?3)
         ORDER BY seq",
    )?;
    let rows = statement.query_map(params![controller, key, i64_of(limit as u64)], |row| {
        let kind: String = row.get(4)?;
        Ok(StoredEvent {
            seq: u64_of(row.get(0)?),
            event: ResourceEvent {
                controller: row.get(1)?,
                key: row.get(2)?,
                uid: row.get(3)?,
                kind: parse(&kind)?,
                resource_version: row.get::<_, Option<i64>>(5)?.map(u64_of),
                generation: row.get::<_, Option<i64>>(6)?.map(u64_of),
                at_ms: u64_of(row.get(7)?),
                detail: row.get(8)?,
            },
        })
    })?;
    rows.collect()
}

fn bounded_detail(detail: &str) -> &str {
    if detail.len() <= MAX_EVENT_DETAIL_BYTES {
        return detail;
    }
    let mut end = MAX_EVENT_DETAIL_BYTES;
    while !detail.is_char_boundary(end) {
        end -= 1;
    }
    &detail[..end]
}

// --- reconcile supervision (sup19) ---

/// At server start-up: `kernel::reconcile::release_abandoned` on every row
/// that still holds a claim (a pass of a previous server); the rows
/// released.
pub fn release_abandoned(connection: &Connection, now_ms: u64) -> rusqlite::Result<usize> {
    let uids: Vec<String> = connection
        .prepare_cached(
            "SELECT resource_uid FROM resource_queue WHERE claim_expires_at_ms IS NOT NULL",
        )?
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut released = 0;
    for uid in uids {
        let Some(row) = load_queue(connection, &uid)? else {
            continue;
        };
        if let Some(next) = reconcile::release_abandoned(&row, now_ms) {
            write_queue(connection, &uid, &next)?;
            released += 1;
        }
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    //! The resource tables on a real SQLite file: every row reads back into the
    //! kernel record it was written from, and each guard of the module holds.

    use super::*;
    use crate::store::open;
    use kernel::child_workflow::ChildState;
    use kernel::controller_effect::ControllerEffectState;
    use kernel::resource::{self as resource_kernel, Applied, ApplyInput};
    use serde_json::json;

    fn database() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().expect("temp dir");
        let connection = open::open(&dir.path().join("state.sqlite")).expect("open");
        (dir, connection)
    }

    fn created(uid: &str, key: &str, spec: serde_json::Value) -> StoredResource {
        let input = ApplyInput {
            new_uid: uid,
            controller: "pull-request",
            key,
            spec: &spec,
            spec_digest: Digest::repeat(spec.to_string().len() as u8),
            spec_bytes: spec.to_string().len(),
            initial_status: &json!({"phase": "new"}),
            source_digest: Digest::repeat(9),
        };
        let Ok(Applied::Created(record)) = resource_kernel::apply(None, &input, 1_000) else {
            panic!("a new resource is created");
        };
        StoredResource {
            record,
            controller_path: "/p/.pi/controllers/pull-request.controller.ts".into(),
            project_path: Some("/p".into()),
            created_at_ms: 1_000,
        }
    }

    fn count(connection: &Connection, table: &str) -> i64 {
        connection
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                row.get(0)
            })
            .expect("count")
    }

    #[test]
    fn a_resource_row_reads_back_into_its_record_and_updates_advance_one_version() {
        let (_dir, connection) = database();
        let stored = created("r-1", "acme/repo#1", json!({"repo": "acme/repo", "n": 1}));
        insert(&connection, &stored).expect("insert");
        assert_eq!(
            load(&connection, "pull-request", "acme/repo#1").expect("load"),
            Some(stored.clone())
        );
        assert_eq!(
            load_by_uid(&connection, "r-1").expect("load"),
            Some(stored.clone())
        );
        assert_eq!(
            load(&connection, "pull-request", "other").expect("load"),
            None
        );

        // A deletion request is the next version: written.
        let marked = resource_kernel::request_deletion(&stored.record, 2_000).expect("marked");
        update(&connection, &marked).expect("update");
        let read = load_by_uid(&connection, "r-1").expect("load").expect("row");
        assert_eq!(read.record, marked);
        assert_eq!(read.record.resource_version, 2);

        // A record that does not follow the stored version is refused whole.
        let mut skipped = marked.clone();
        skipped.resource_version = 4;
        skipped.spec = json!({"changed": true});
        let refused = update(&connection, &skipped).expect_err("a skipped version is refused");
        assert!(matches!(refused, rusqlite::Error::StatementChangedRows(0)));
        let mut stale = marked.clone();
        stale.spec = json!({"stale": true});
        assert!(
            update(&connection, &stale).is_err(),
            "the same version again is refused"
        );
        assert_eq!(
            load_by_uid(&connection, "r-1")
                .expect("load")
                .expect("row")
                .record,
            marked
        );

        set_source(
            &connection,
            "r-1",
            "/home/.pi/agent/controllers/pull-request.controller.js",
            None,
        )
        .expect("set source");
        let read = load_by_uid(&connection, "r-1").expect("load").expect("row");
        assert_eq!(read.project_path, None);
        assert!(read.controller_path.starts_with("/home/"));
    }

    #[test]
    fn deleting_a_resource_deletes_its_queue_effects_and_children_but_keeps_its_events() {
        let (_dir, connection) = database();
        let stored = created("r-1", "k", json!({}));
        insert(&connection, &stored).expect("insert");
        enqueue(&connection, "r-1", 1_000).expect("enqueue");
        insert_effect(&connection, &effect("r-1", "merge")).expect("effect");
        upsert_child(&connection, &child("r-1", "review", "run-1"), 1_000).expect("child");
        append_event(
            &connection,
            &ResourceEvent::of(&stored.record, ResourceEventKind::Applied, 1_000),
        )
        .expect("event");
        delete(&connection, "r-1").expect("delete");
        assert_eq!(load_by_uid(&connection, "r-1").expect("load"), None);
        for table in [
            "resource_queue",
            "controller_effects",
            "controller_child_requests",
        ] {
            assert_eq!(
                count(&connection, table),
                0,
                "{table} kept a deleted resource's row"
            );
        }
        assert_eq!(
            recent_events(&connection, "pull-request", "k", 10)
                .expect("events")
                .len(),
            1
        );
        assert!(
            delete(&connection, "r-1").is_err(),
            "deleting a missing resource is an error"
        );
    }

    #[test]
    fn the_queue_row_follows_the_kernel_and_a_rejection_writes_nothing() {
        let (_dir, connection) = database();
        insert(&connection, &created("r-1", "k", json!({}))).expect("insert");
        assert_eq!(load_queue(&connection, "r-1").expect("load"), None);
        assert_eq!(
            claim(&connection, "r-1", Digest::repeat(1), 1_000, 0).expect("claim"),
            None
        );

        let first = enqueue(&connection, "r-1", 5_000).expect("enqueue");
        assert_eq!(first.version, 1);
        assert_eq!(first.available_at_ms, Some(5_000));
        let again = enqueue(&connection, "r-1", 3_000).expect("enqueue");
        assert_eq!((again.version, again.available_at_ms), (2, Some(3_000)));
        assert_eq!(
            load_queue(&connection, "r-1").expect("load"),
            Some(again.clone())
        );
        assert_eq!(next_due_at(&connection).expect("due"), Some(3_000));

        // Not yet available: refused, nothing written.
        let early = claim(&connection, "r-1", Digest::repeat(1), 1_000, 2_000).expect("claim");
        assert_eq!(early, Some(Err(ReconcileRejection::NotClaimable)));
        assert_eq!(
            load_queue(&connection, "r-1").expect("load"),
            Some(again.clone())
        );
        assert!(
            claimable(&connection, 2_999, 10)
                .expect("claimable")
                .is_empty()
        );
        let candidates = claimable(&connection, 3_000, 10).expect("claimable");
        assert_eq!(candidates.len(), 1);
        assert_eq!(
            (
                candidates[0].controller.as_str(),
                candidates[0].key.as_str()
            ),
            ("pull-request", "k")
        );

        let token = Digest::repeat(7);
        let claimed = claim(&connection, "r-1", token, 1_000, 3_000)
            .expect("claim")
            .expect("row")
            .expect("claimed");
        let stored = load_queue(&connection, "r-1").expect("load").expect("row");
        assert_eq!(stored, claimed);
        let live = stored.claim.expect("a claim");
        assert_eq!(
            (
                live.generation,
                live.token_hash,
                live.expires_at_ms,
                live.claimed_version
            ),
            (1, token, 4_000, 2)
        );
        assert!(
            claimable(&connection, 3_500, 10)
                .expect("claimable")
                .is_empty(),
            "a live claim is not claimable"
        );
        assert_eq!(
            next_due_at(&connection).expect("due"),
            Some(4_000),
            "the claim's expiry is due"
        );

        // Another token cannot renew or finish; nothing changes.
        let other = Digest::repeat(8);
        assert_eq!(
            renew(&connection, "r-1", 1, &other, 1_000, 3_100).expect("renew"),
            Some(Err(ReconcileRejection::ClaimLost))
        );
        assert_eq!(
            finish(&connection, "r-1", 1, &other, &Finished::Settled, 3_100).expect("finish"),
            Some(Err(ReconcileRejection::ClaimLost))
        );
        assert_eq!(load_queue(&connection, "r-1").expect("load"), Some(claimed));

        let renewed = renew(&connection, "r-1", 1, &token, 1_000, 3_500)
            .expect("renew")
            .expect("row")
            .expect("renewed");
        assert_eq!(renewed.claim.expect("claim").expires_at_ms, 4_500);
        let failed = Finished::Failed {
            error: "boom".into(),
            jitter_permille: 0,
        };
        let finished = finish(&connection, "r-1", 1, &token, &failed, 3_600)
            .expect("finish")
            .expect("row")
            .expect("finished");
        assert_eq!(finished.claim, None);
        assert_eq!(finished.consecutive_errors, 1);
        let stored = load_queue(&connection, "r-1").expect("load").expect("row");
        assert_eq!(stored, finished);
        assert_eq!(stored.available_at_ms, Some(4_600));
        assert_eq!(
            stored.generation, 1,
            "the lease generation is kept after the claim ends"
        );

        let view = QueueView::from(&stored);
        assert_eq!(view.last_error.as_deref(), Some("boom"));
        assert_eq!(view.claim_generation, None);
    }

    #[test]
    fn list_shows_each_resource_with_its_queue_error_and_filters_by_controller() {
        let (_dir, connection) = database();
        insert(&connection, &created("r-2", "b", json!({"x": 2}))).expect("insert");
        insert(&connection, &created("r-1", "a", json!({"x": 1}))).expect("insert");
        let mut other = created("r-3", "c", json!({}));
        other.record.controller = "deploy".into();
        insert(&connection, &other).expect("insert");
        let row = QueueRow {
            available_at_ms: Some(9_000),
            version: 3,
            consecutive_errors: 2,
            last_error: Some("the forge answered 500".into()),
            generation: 2,
            claim: None,
        };
        write_queue(&connection, "r-2", &row).expect("queue");
        let all = list(&connection, None).expect("list");
        let names: Vec<_> = all
            .iter()
            .map(|r| (r.controller.as_str(), r.key.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("deploy", "c"),
                ("pull-request", "a"),
                ("pull-request", "b")
            ]
        );
        let b = &all[2];
        assert_eq!(
            (
                b.last_error.as_deref(),
                b.consecutive_errors,
                b.available_at_ms
            ),
            (Some("the forge answered 500"), 2, Some(9_000))
        );
        assert_eq!(b.status.controller_status, json!({"phase": "new"}));
        assert_eq!(list(&connection, Some("deploy")).expect("list").len(), 1);
        assert!(list(&connection, Some("none")).expect("list").is_empty());
    }

    fn effect(uid: &str, key: &str) -> ControllerEffect {
        ControllerEffect {
            resource_uid: uid.into(),
            key: key.into(),
            kind: "forge.merge".into(),
            request_fingerprint: Digest::repeat(3),
            generation: 1,
            state: ControllerEffectState::Pending,
            started_at_ms: 1_000,
            completed_at_ms: None,
        }
    }

    #[test]
    fn effects_read_back_and_keep_what_apply_reported() {
        let (_dir, connection) = database();
        insert(&connection, &created("r-1", "k", json!({}))).expect("insert");
        let pending = effect("r-1", "merge");
        insert_effect(&connection, &pending).expect("insert");
        assert!(
            insert_effect(&connection, &pending).is_err(),
            "a key is reserved once"
        );
        let read = load_effect(&connection, "r-1", "merge")
            .expect("load")
            .expect("row");
        assert_eq!(
            (read.effect, read.external_ref, read.error),
            (pending.clone(), None, None)
        );

        let applied = kernel::controller_effect::applied(
            &pending,
            kernel::controller_effect::ApplyResult::Applied,
            2_000,
        );
        update_effect(&connection, &applied, Some("merge-commit-1"), None).expect("update");
        let indeterminate = ControllerEffect {
            state: ControllerEffectState::Indeterminate,
            ..applied.clone()
        };
        update_effect(
            &connection,
            &indeterminate,
            None,
            Some("the forge timed out"),
        )
        .expect("update");
        let read = load_effect(&connection, "r-1", "merge")
            .expect("load")
            .expect("row");
        assert_eq!(read.effect, indeterminate);
        assert_eq!(
            read.external_ref.as_deref(),
            Some("merge-commit-1"),
            "None keeps the stored reference"
        );
        assert_eq!(read.error.as_deref(), Some("the forge timed out"));
        assert!(
            update_effect(&connection, &effect("r-1", "other"), None, None).is_err(),
            "a missing effect is an error"
        );
        assert_eq!(
            effects_of(&connection, "r-1", 10).expect("effects").len(),
            1
        );
        assert_eq!(
            load_effect(&connection, "r-1", "other").expect("load"),
            None
        );
    }

    fn child(uid: &str, key: &str, run_id: &str) -> ChildRequest {
        ChildRequest {
            resource_uid: uid.into(),
            request_key: key.into(),
            workflow: "review".into(),
            input_fingerprint: Digest::repeat(4),
            attempt: 1,
            run_id: RunId::new(run_id),
            state: ChildState::Running,
        }
    }

    #[test]
    fn child_requests_are_found_by_key_and_by_run_and_a_new_attempt_replaces_the_run() {
        let (_dir, connection) = database();
        insert(&connection, &created("r-1", "k", json!({}))).expect("insert");
        let first = child("r-1", "review", "run-1");
        upsert_child(&connection, &first, 1_000).expect("upsert");
        assert_eq!(
            load_child(&connection, "r-1", "review").expect("load"),
            Some(first.clone())
        );
        assert_eq!(
            load_child_by_run(&connection, &RunId::new("run-1")).expect("load"),
            Some(first.clone())
        );
        let interrupted = ChildRequest {
            state: ChildState::Interrupted,
            ..first.clone()
        };
        upsert_child(&connection, &interrupted, 2_000).expect("upsert");
        let second = ChildRequest {
            attempt: 2,
            run_id: RunId::new("run-2"),
            state: ChildState::Running,
            ..first
        };
        upsert_child(&connection, &second, 3_000).expect("upsert");
        assert_eq!(
            load_child(&connection, "r-1", "review").expect("load"),
            Some(second.clone())
        );
        assert_eq!(
            load_child_by_run(&connection, &RunId::new("run-1")).expect("load"),
            None,
            "an old attempt's run is not the request's"
        );
        assert_eq!(
            load_child_by_run(&connection, &RunId::new("run-2")).expect("load"),
            Some(second)
        );
        assert_eq!(
            children_of(&connection, "r-1", 10).expect("children").len(),
            1
        );
    }

    #[test]
    fn recent_events_are_the_last_ones_oldest_first_with_bounded_detail() {
        let (_dir, connection) = database();
        let stored = created("r-1", "k", json!({}));
        for (i, kind) in [
            ResourceEventKind::Applied,
            ResourceEventKind::ReconcileRequested,
            ResourceEventKind::ReconcileStarted,
            ResourceEventKind::ReconcileFailed,
        ]
        .into_iter()
        .enumerate()
        {
            let event = ResourceEvent::of(&stored.record, kind, 1_000 + i as u64)
                .with_detail("é".repeat(600));
            append_event(&connection, &event).expect("append");
        }
        let recent = recent_events(&connection, "pull-request", "k", 2).expect("events");
        let kinds: Vec<_> = recent.iter().map(|e| e.event.kind).collect();
        assert_eq!(
            kinds,
            [
                ResourceEventKind::ReconcileStarted,
                ResourceEventKind::ReconcileFailed
            ]
        );
        assert!(recent[0].seq < recent[1].seq);
        let detail = recent[1].event.detail.as_deref().expect("detail");
        assert_eq!(
            detail.len(),
            MAX_EVENT_DETAIL_BYTES,
            "cut on a character boundary"
        );
        assert_eq!(recent[1].event.resource_version, Some(1));
        assert!(
            recent_events(&connection, "pull-request", "other", 10)
                .expect("events")
                .is_empty()
        );
    }
}
