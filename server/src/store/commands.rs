//! Durable command receipts (`host_commands`) and runner-message receipts
//! (`worker_messages`).
//!
//! Invariant: a receipt row is written in the same transaction as the change
//! it acknowledges, so a reply is never sent for a change that did not commit
//! and a committed change always has its receipt.

use super::Cached as _;
use super::codec::{DigestColumn, i64_of, name, parse, u64_of};
use kernel::ids::{ClientId, IdempotencyKey, RequestId, Revision, RunId, RunnerEpochId};
use kernel::receipt::{
    CommandIdentity, RunnerMessage, RunnerMessageId, StoredCommand, StoredRunnerMessage,
};
use rusqlite::{Connection, OptionalExtension, params};

/// The receipt columns `command_from_row` reads, with a `WHERE` clause (a
/// literal, so each lookup is one constant SQL text in the statement cache).
macro_rules! select_command {
    ($where:literal) => {
        concat!(
            "SELECT request_id, client_id, operation, idempotency_key, run_id, expected_revision,
    payload_digest, outcome, revision, receipt_digest, created_at_ms, receipt_json FROM host_commands ",
            $where
        )
    };
}

fn command_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(StoredCommand, String)> {
    Ok((
        StoredCommand {
            request_id: RequestId::new(row.get::<_, String>(0)?),
            identity: CommandIdentity {
                client_id: ClientId::new(row.get::<_, String>(1)?),
                operation: parse(&row.get::<_, String>(2)?)?,
                idempotency_key: IdempotencyKey::new(row.get::<_, String>(3)?),
                run_id: row.get::<_, Option<String>>(4)?.map(RunId::new),
                expected_revision: row.get::<_, Option<i64>>(5)?.map(|r| Revision(u64_of(r))),
                payload_digest: row.get::<_, DigestColumn>(6)?.0,
            },
            outcome: parse(&row.get::<_, String>(7)?)?,
            revision: row.get::<_, Option<i64>>(8)?.map(|r| Revision(u64_of(r))),
            receipt_digest: row.get::<_, DigestColumn>(9)?.0,
            recorded_at_ms: u64_of(row.get(10)?),
        },
        row.get(11)?,
    ))
}

/// The receipt stored under a client's request id, with its receipt JSON
/// (request ids are scoped by client).
pub(crate) fn by_request_id(
    connection: &Connection,
    client_id: &ClientId,
    request_id: &RequestId,
) -> rusqlite::Result<Option<(StoredCommand, String)>> {
    connection
        .query_row_cached(
            select_command!("WHERE client_id = ?1 AND request_id = ?2"),
            params![client_id.as_str(), request_id.as_str()],
            command_from_row,
        )
        .optional()
}

/// The receipt stored under a client's idempotency key, with its receipt JSON.
pub(crate) fn by_key(
    connection: &Connection,
    client_id: &ClientId,
    key: &IdempotencyKey,
) -> rusqlite::Result<Option<(StoredCommand, String)>> {
    connection
        .query_row_cached(
            select_command!("WHERE client_id = ?1 AND idempotency_key = ?2"),
            params![client_id.as_str(), key.as_str()],
            command_from_row,
        )
        .optional()
}

/// Stores a durable receipt.
pub(crate) fn insert(
    connection: &Connection,
    stored: &StoredCommand,
    fingerprint: &kernel::ids::Digest,
    receipt_json: &str,
) -> rusqlite::Result<()> {
    let identity = &stored.identity;
    connection.execute_cached(
        "INSERT INTO host_commands (request_id, client_id, operation, idempotency_key, run_id, expected_revision,
             payload_digest, fingerprint, outcome, revision, receipt_json, receipt_digest, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        params![
            stored.request_id.as_str(),
            identity.client_id.as_str(),
            name(&identity.operation),
            identity.idempotency_key.as_str(),
            identity.run_id.as_ref().map(RunId::as_str),
            identity.expected_revision.map(|r| i64_of(r.0)),
            identity.payload_digest.0.to_vec(),
            fingerprint.0.to_vec(),
            name(&stored.outcome),
            stored.revision.map(|r| i64_of(r.0)),
            receipt_json,
            stored.receipt_digest.0.to_vec(),
            i64_of(stored.recorded_at_ms),
        ],
    )?;
    Ok(())
}

/// The stored reply of a runner message, with its reply JSON.
pub(crate) fn runner_message(
    connection: &Connection,
    runner_epoch: &RunnerEpochId,
    message_id: &RunnerMessageId,
) -> rusqlite::Result<Option<(StoredRunnerMessage, String)>> {
    connection
        .query_row_cached(
            "SELECT payload_digest, outcome, revision, reply_json, created_at_ms, reply_digest FROM worker_messages
             WHERE runner_epoch = ?1 AND message_id = ?2",
            params![runner_epoch.as_str(), message_id.as_str()],
            |row| {
                let reply_json: String = row.get(3)?;
                Ok((
                    StoredRunnerMessage {
                        message: RunnerMessage {
                            runner_epoch: runner_epoch.clone(),
                            message_id: message_id.clone(),
                            payload_digest: row.get::<_, DigestColumn>(0)?.0,
                        },
                        outcome: parse(&row.get::<_, String>(1)?)?,
                        revision: row.get::<_, Option<i64>>(2)?.map(|r| Revision(u64_of(r))),
                        reply_digest: row.get::<_, DigestColumn>(5)?.0,
                        recorded_at_ms: u64_of(row.get(4)?),
                    },
                    reply_json,
                ))
            },
        )
        .optional()
}

/// Stores a runner message receipt, with the blob its reply references
/// (a command state or a reply result moved out of the frame by
/// `runner_api::transfer`), so the blob stays referenced while the receipt
/// lives and state retention collects it with the receipt.
pub(crate) fn insert_runner_message(
    connection: &Connection,
    stored: &StoredRunnerMessage,
    reply_json: &str,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO worker_messages (runner_epoch, message_id, payload_digest, outcome, revision, reply_json,
             reply_digest, content_digest, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7,
           unhex(substr(COALESCE(json_extract(?6, '$.state.reference.digest'),
                                 json_extract(?6, '$.resultContent.digest')), 8)),
           ?8)",
        params![
            stored.message.runner_epoch.as_str(),
            stored.message.message_id.as_str(),
            stored.message.payload_digest.0.to_vec(),
            name(&stored.outcome),
            stored.revision.map(|r| i64_of(r.0)),
            reply_json,
            stored.reply_digest.0.to_vec(),
            i64_of(stored.recorded_at_ms),
        ],
    )?;
    Ok(())
}
