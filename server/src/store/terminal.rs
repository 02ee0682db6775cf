//! What a terminal workflow message is built from (`kernel::terminal`), read
//! from committed rows, and the terminal runs whose message is missing.
//!
//! Invariants:
//! - Every read is bounded: one run's metadata, input, final output and
//!   error, its restart chain (at most `kernel::run::MAX_RESTARTS` restarts,
//!   so a handful of runs), and the stored message with the run's terminal
//!   message id.
//! - The input and the final output are the stored canonical JSON bytes, as
//!   they are; nothing is re-encoded.

use super::Cached as _;
use super::codec::parse;
use super::meta::RunMeta;
use kernel::ids::{Digest, MessageId, NodeId, RunId};
use kernel::message::MessageRecord;
use kernel::run::{RestartLineage, RunError, RunRecord};
use kernel::terminal::EarlierOutcome;
use rusqlite::{Connection, OptionalExtension, params};

/// The committed rows a terminal message says something about.
#[derive(Clone, Debug)]
pub(crate) struct TerminalRows {
    pub meta: RunMeta,
    /// The stored canonical input.
    pub input: String,
    /// The stored canonical final output, if the run recorded one.
    pub output: Option<String>,
    pub error_message: Option<String>,
    pub fingerprint: Digest,
    pub restarts: Vec<RestartLineage>,
    pub earlier: Vec<EarlierOutcome>,
}

impl TerminalRows {
    /// The kernel's view of these rows.
    pub(crate) fn facts(&self) -> kernel::terminal::TerminalFacts<'_> {
        kernel::terminal::TerminalFacts {
            workflow_name: &self.meta.workflow_name,
            workflow_ref: &self.meta.workflow_ref,
            definition_digest: &self.meta.definition_digest,
            input_json: &self.input,
            output_json: self.output.as_deref(),
            error_message: self.error_message.as_deref(),
            fingerprint: self.fingerprint,
            restarts: &self.restarts,
            earlier: &self.earlier,
        }
    }
}

/// The rows of `run` (terminal), or `None` when its metadata or input is
/// missing.
pub(crate) fn rows(
    connection: &Connection,
    run: &RunRecord,
) -> rusqlite::Result<Option<TerminalRows>> {
    let Some(meta) = super::meta::load(connection, &run.run_id)? else {
        return Ok(None);
    };
    let Some((fingerprint, restarts)) = super::runs::restart_facts(connection, run)? else {
        return Ok(None);
    };
    let Some(input) = super::blobs::get(connection, &meta.input_digest)? else {
        return Ok(None);
    };
    let output = match super::attempts::final_output_digest(connection, &run.run_id)? {
        Some(digest) => super::blobs::get(connection, &digest)?,
        None => None,
    };
    let error_message: Option<String> = connection.query_row_cached(
        "SELECT error_message FROM runs WHERE run_id = ?1",
        params![run.run_id.as_str()],
        |row| row.get(0),
    )?;
    let earlier = earlier_outcomes(connection, run)?;
    Ok(Some(TerminalRows {
        meta,
        input: String::from_utf8_lossy(&input).into_owned(),
        output: output.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
        error_message,
        fingerprint,
        restarts,
        earlier,
    }))
}

/// The other terminal runs of `run`'s restart chain that were created before
/// it, oldest first.
fn earlier_outcomes(
    connection: &Connection,
    run: &RunRecord,
) -> rusqlite::Result<Vec<EarlierOutcome>> {
    let mut statement = connection.prepare_cached(
        "SELECT run_id, status, error_class, error_reason, error_node FROM runs
         WHERE (run_id = ?1 OR restart_root_run_id = ?1) AND run_id <> ?2
           AND finished_at_ms IS NOT NULL AND created_at_ms <= ?3
         ORDER BY created_at_ms, run_id",
    )?;
    let rows = statement.query_map(
        params![
            run.restart_root().as_str(),
            run.run_id.as_str(),
            super::codec::i64_of(run.created_at_ms)
        ],
        |row| {
            let error = match (
                row.get::<_, Option<String>>(2)?,
                row.get::<_, Option<String>>(3)?,
            ) {
                (Some(class), Some(reason)) => Some(RunError {
                    class: parse(&class)?,
                    reason: parse(&reason)?,
                    node_id: row.get::<_, Option<String>>(4)?.map(NodeId::new),
                }),
                _ => None,
            };
            Ok(EarlierOutcome {
                run_id: RunId::new(row.get::<_, String>(0)?),
                status: parse(&row.get::<_, String>(1)?)?,
                error,
            })
        },
    )?;
    rows.collect()
}

/// The stored message `message_id`, if any.
pub(crate) fn stored_message(
    connection: &Connection,
    run_id: &RunId,
    message_id: &MessageId,
) -> rusqlite::Result<Option<MessageRecord>> {
    connection
        .query_row_cached(
            "SELECT message_id, session_id, kind, source_id, step_reason, session_order, state, entry_id, created_at_ms
             FROM workflow_messages WHERE message_id = ?1",
            params![message_id.as_str()],
            |row| super::runs::message_from_row(run_id, row),
        )
        .optional()
}

/// Interactive terminal runs no continuation settled whose terminal message
/// does not exist (a crash between the terminal commit and the message),
/// oldest first.
pub(crate) fn missing(connection: &Connection) -> rusqlite::Result<Vec<RunId>> {
    let mut statement = connection.prepare_cached(
        "SELECT r.run_id FROM runs r JOIN run_bindings b ON b.run_id = r.run_id
         WHERE r.status IN ('completed', 'failed', 'timed_out', 'cancelled')
           AND r.continued_by IS NULL AND b.execution_mode = 'interactive'
           AND NOT EXISTS (SELECT 1 FROM workflow_messages m WHERE m.run_id = r.run_id AND m.kind = 'terminal')
         ORDER BY r.finished_at_ms, r.run_id",
    )?;
    let rows = statement.query_map([], |row| Ok(RunId::new(row.get::<_, String>(0)?)))?;
    rows.collect()
}
