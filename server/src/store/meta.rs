//! Run metadata the kernel does not need but the shell does: project,
//! workflow name and reference, definition, input, source identity.
//!
//! Invariant: a run's definition digest, input digest and source identity
//! never change after reservation; a restart or continuation copies them
//! (a continuation takes its answer as the new input).

use super::Cached as _;
use super::codec::{DigestColumn, i64_of};
use kernel::ids::{Digest, RunId, SessionId};
use kernel::run::ExecutionMode;
use kernel::topology::Topology;
use rusqlite::{Connection, OptionalExtension, params};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Everything needed to launch or restart a run.
#[derive(Clone, Debug)]
pub struct RunMeta {
    pub run_id: RunId,
    pub project_id: String,
    pub project_path: String,
    pub workflow_name: String,
    pub workflow_ref: String,
    pub title: Option<String>,
    pub definition_digest: String,
    pub input_digest: Digest,
    pub input_hash: String,
    pub source_json: String,
    /// `run.start`'s `agentModel` (canonical JSON): the Pi model arguments
    /// of the run's headless agent steps; restarts and continuations keep it.
    pub agent_model_json: Option<String>,
}

/// Loads a run's metadata.
pub(crate) fn load(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Option<RunMeta>> {
    connection
        .query_row_cached(
            "SELECT r.project_id, s.project_path, r.workflow_name, r.workflow_ref, r.title, r.definition_digest,
                    r.input_digest, s.input_hash, s.source_json, s.agent_model_json
             FROM runs r JOIN run_sources s ON s.run_id = r.run_id WHERE r.run_id = ?1",
            params![run_id.as_str()],
            |row| {
                Ok(RunMeta {
                    run_id: run_id.clone(),
                    project_id: row.get(0)?,
                    project_path: row.get(1)?,
                    workflow_name: row.get(2)?,
                    workflow_ref: row.get(3)?,
                    title: row.get(4)?,
                    definition_digest: row.get(5)?,
                    input_digest: row.get::<_, DigestColumn>(6)?.0,
                    input_hash: row.get(7)?,
                    source_json: row.get(8)?,
                    agent_model_json: row.get(9)?,
                })
            },
        )
        .optional()
}

/// The project id of a canonical path (whether or not it is stored).
pub(crate) fn project_id_of(path: &str) -> String {
    hex::encode(&crate::ids::sha256(path.as_bytes()).0[..12])
}

/// The project id of a canonical path, inserting the project if new.
pub(crate) fn ensure_project(
    connection: &Connection,
    path: &str,
    now_ms: u64,
) -> rusqlite::Result<String> {
    let project_id = project_id_of(path);
    connection.execute_cached(
        "INSERT INTO projects (project_id, canonical_path, created_at_ms) VALUES (?1, ?2, ?3)
         ON CONFLICT (project_id) DO NOTHING",
        params![project_id, path, i64_of(now_ms)],
    )?;
    Ok(project_id)
}

/// Stores a compiled definition (no-op when the digest exists).
pub(crate) fn put_definition(
    connection: &Connection,
    digest: &str,
    workflow_name: &str,
    topology_json: &str,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO workflow_definitions (definition_digest, workflow_name, topology_json, created_at_ms)
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (definition_digest) DO NOTHING",
        params![digest, workflow_name, topology_json, i64_of(now_ms)],
    )?;
    Ok(())
}

/// Loads the topology of a definition. Definitions are immutable, so parsed
/// topologies are cached by digest for the life of the process.
pub(crate) fn topology(
    connection: &Connection,
    digest: &str,
) -> rusqlite::Result<Option<Arc<Topology>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Topology>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(found) = cache.lock().expect("topology cache").get(digest) {
        return Ok(Some(found.clone()));
    }
    let text: Option<String> = connection
        .query_row_cached(
            "SELECT topology_json FROM workflow_definitions WHERE definition_digest = ?1",
            params![digest],
            |row| row.get(0),
        )
        .optional()?;
    let parsed = text
        .and_then(|text| serde_json::from_str::<Topology>(&text).ok())
        .map(Arc::new);
    if let Some(topology) = &parsed {
        cache
            .lock()
            .expect("topology cache")
            .insert(digest.to_owned(), topology.clone());
    }
    Ok(parsed)
}

/// Inserts the rows of a new run (`runs`, `run_sources`, `run_bindings`,
/// `run_queue`, `leases`, `viewer_runs`, and its settings binding: the
/// revisions in effect, or a continuation's parent's) in the reserved
/// state; the kernel's reservation then writes its facts over them.
pub(crate) fn insert_run(
    connection: &Connection,
    meta: &RunMeta,
    mode: &ExecutionMode,
    continuation_parent: Option<(&RunId, &str)>,
    now_ms: u64,
) -> rusqlite::Result<()> {
    let now = i64_of(now_ms);
    connection.execute_cached(
        "INSERT INTO runs (run_id, project_id, workflow_name, workflow_ref, title, definition_digest, input_digest,
             status, paused, revision, continuation_of, continuation_checkpoint, created_at_ms, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', 0, 1, ?8, ?9, ?10, ?10)",
        params![
            meta.run_id.as_str(),
            meta.project_id,
            meta.workflow_name,
            meta.workflow_ref,
            meta.title,
            meta.definition_digest,
            meta.input_digest.0.to_vec(),
            continuation_parent.map(|(parent, _)| parent.as_str()),
            continuation_parent.map(|(_, checkpoint)| checkpoint),
            now,
        ],
    )?;
    connection.execute_cached(
        "INSERT INTO run_sources (run_id, project_path, source_json, input_hash, agent_model_json) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            meta.run_id.as_str(),
            meta.project_path,
            meta.source_json,
            meta.input_hash,
            meta.agent_model_json
        ],
    )?;
    let (execution_mode, session) = match mode {
        ExecutionMode::Interactive { origin_session } => {
            ("interactive", Some(origin_session.as_str()))
        }
        ExecutionMode::Headless => ("headless", None),
    };
    connection.execute_cached(
        "INSERT INTO run_bindings (run_id, execution_mode, origin_session_id) VALUES (?1, ?2, ?3)",
        params![meta.run_id.as_str(), execution_mode, session],
    )?;
    connection.execute_cached(
        "INSERT INTO run_queue (run_id, status, origin_session_id, parent_run_id, queued_at_ms, updated_at_ms)
         VALUES (?1, 'queued', ?2, ?3, ?4, ?4)",
        params![meta.run_id.as_str(), session, continuation_parent.map(|(parent, _)| parent.as_str()), now],
    )?;
    connection.execute_cached(
        "INSERT INTO leases (run_id, generation) VALUES (?1, 0)",
        params![meta.run_id.as_str()],
    )?;
    connection.execute_cached(
        "INSERT INTO viewer_runs (run_id, presentation_revision, retained_floor) VALUES (?1, 0, 0)",
        params![meta.run_id.as_str()],
    )?;
    let parent_binding = match continuation_parent {
        Some((parent, _)) => super::settings::binding(connection, parent)?,
        None => None,
    };
    let current = super::settings::current_binding(connection, &meta.project_id)?;
    super::settings::insert_binding(
        connection,
        &meta.run_id,
        kernel::settings::bind(parent_binding, current),
    )?;
    Ok(())
}

/// The nonterminal interactive runs that hold `session`'s reservation.
pub(crate) fn session_runs(
    connection: &Connection,
    session: &SessionId,
) -> rusqlite::Result<Vec<RunId>> {
    let mut statement = connection.prepare_cached(
        "SELECT r.run_id FROM runs r JOIN run_bindings b ON b.run_id = r.run_id
         WHERE b.origin_session_id = ?1 AND r.status IN ('queued', 'running', 'waiting')",
    )?;
    let rows = statement.query_map(params![session.as_str()], |row| {
        Ok(RunId::new(row.get::<_, String>(0)?))
    })?;
    rows.collect()
}

/// The order the next workflow message of a run with origin session
/// `origin` receives: the one source of `SessionFacts::next_message_order`
/// and of every run transition that creates a message (the kernel's
/// `session::next_message_order` over the session's highest order). A
/// headless run (no session) creates no messages; its order is the first.
pub(crate) fn next_message_order(
    connection: &Connection,
    origin: Option<&SessionId>,
) -> rusqlite::Result<u64> {
    let Some(session) = origin else {
        return Ok(kernel::session::next_message_order(None));
    };
    let max: Option<i64> = connection.query_row_cached(
        "SELECT MAX(session_order) FROM workflow_messages WHERE session_id = ?1",
        params![session.as_str()],
        |row| row.get(0),
    )?;
    Ok(kernel::session::next_message_order(
        max.map(super::codec::u64_of),
    ))
}
