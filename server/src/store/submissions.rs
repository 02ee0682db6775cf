//! `interactive_submissions`: the submissions of interactive requests.
//!
//! Invariants:
//! - A submission is inserted `validating` with its payload (a blob) in the
//!   transaction that the kernel's `interaction::submit` decided; one
//!   (request, idempotency key) pair is one row (the schema's unique key).
//! - A verdict sets the outcome once: `accepted` with the normalized output
//!   (a blob, `receipt_digest`) or `rejected` with the actionable error the
//!   model sees (`error_message`). Nothing else changes a row.

use super::Cached as _;
use super::blobs::{self, Blob};
use super::codec::{DigestColumn, i64_of, name, parse, u64_of};
use kernel::ids::{Digest, IdempotencyKey, InteractionId, RunId, SubmissionId};
use kernel::interaction::{SubmissionOutcome, SubmissionRecord};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

/// The stored outcome of one submission, as its receipt repeats it.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    pub record: SubmissionRecord,
    /// `rejected`: the actionable error.
    pub error_message: Option<String>,
    /// `accepted`: the normalized output.
    pub accepted_output: Option<Value>,
}

fn record_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SubmissionRecord> {
    Ok(SubmissionRecord {
        submission_id: SubmissionId::new(row.get::<_, String>(0)?),
        interaction_id: InteractionId::new(row.get::<_, String>(1)?),
        idempotency_key: IdempotencyKey::new(row.get::<_, String>(2)?),
        payload_hash: row.get::<_, DigestColumn>(3)?.0,
        outcome: parse(&row.get::<_, String>(4)?)?,
        submitted_at_ms: u64_of(row.get(5)?),
    })
}

const COLUMNS: &str =
    "submission_id, interaction_id, idempotency_key, payload_hash, outcome, submitted_at_ms";

/// Every submission of one request.
pub(crate) fn of_interaction(
    connection: &Connection,
    interaction_id: &InteractionId,
) -> rusqlite::Result<Vec<SubmissionRecord>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM interactive_submissions WHERE interaction_id = ?1 ORDER BY submitted_at_ms, submission_id"
    ))?;
    let rows = statement.query_map(params![interaction_id.as_str()], record_from_row)?;
    rows.collect()
}

/// Inserts a new `validating` submission with its payload.
pub(crate) fn insert(
    connection: &Connection,
    record: &SubmissionRecord,
    payload: &Blob,
    now_ms: u64,
) -> rusqlite::Result<()> {
    blobs::put(connection, payload, blobs::JSON, now_ms)?;
    connection.execute_cached(
        "INSERT INTO interactive_submissions (submission_id, interaction_id, idempotency_key, payload_hash,
             payload_digest, outcome, submitted_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            record.submission_id.as_str(),
            record.interaction_id.as_str(),
            record.idempotency_key.as_str(),
            record.payload_hash.0.to_vec(),
            payload.digest.0.to_vec(),
            name(&record.outcome),
            i64_of(record.submitted_at_ms),
        ],
    )?;
    Ok(())
}

/// Records the verdict of a validating submission.
pub(crate) fn settle(
    connection: &Connection,
    record: &SubmissionRecord,
    error_message: Option<&str>,
    accepted_output: Option<&Blob>,
    now_ms: u64,
) -> rusqlite::Result<()> {
    if let Some(output) = accepted_output {
        blobs::put(connection, output, blobs::JSON, now_ms)?;
    }
    connection.execute_cached(
        "UPDATE interactive_submissions SET outcome = ?2, error_message = ?3, receipt_digest = ?4
         WHERE submission_id = ?1 AND outcome = 'validating'",
        params![
            record.submission_id.as_str(),
            name(&record.outcome),
            error_message,
            accepted_output.map(|blob| blob.digest.0.to_vec()),
        ],
    )?;
    Ok(())
}

/// One submission with its stored outcome, error and accepted output.
pub(crate) fn stored(
    connection: &Connection,
    submission_id: &SubmissionId,
) -> rusqlite::Result<Option<Stored>> {
    let row = connection
        .query_row_cached(
            &format!("SELECT {COLUMNS}, error_message, receipt_digest FROM interactive_submissions WHERE submission_id = ?1"),
            params![submission_id.as_str()],
            |row| {
                Ok((
                    record_from_row(row)?,
                    row.get::<_, Option<String>>(6)?,
                    row.get::<_, Option<DigestColumn>>(7)?,
                ))
            },
        )
        .optional()?;
    let Some((record, error_message, receipt)) = row else {
        return Ok(None);
    };
    let accepted_output = match (record.outcome, receipt) {
        (SubmissionOutcome::Accepted, Some(digest)) => {
            Some(blobs::get_json(connection, &digest.0)?)
        }
        _ => None,
    };
    Ok(Some(Stored {
        record,
        error_message,
        accepted_output,
    }))
}

/// The submitted output of one submission (what its validation child checks).
pub(crate) fn payload(
    connection: &Connection,
    submission_id: &SubmissionId,
) -> rusqlite::Result<Option<Value>> {
    let digest: Option<DigestColumn> = connection
        .query_row_cached(
            "SELECT payload_digest FROM interactive_submissions WHERE submission_id = ?1",
            params![submission_id.as_str()],
            |row| row.get(0),
        )
        .optional()?
        .flatten();
    match digest {
        Some(digest) => Ok(Some(blobs::get_json(connection, &digest.0)?)),
        None => Ok(None),
    }
}

/// Every submission still `validating`, with its run and submission time
/// (the scheduler's validation candidates).
pub(crate) fn validating(
    connection: &Connection,
) -> rusqlite::Result<Vec<(RunId, InteractionId, SubmissionId, u64)>> {
    let mut statement = connection.prepare_cached(
        "SELECT r.run_id, s.interaction_id, s.submission_id, s.submitted_at_ms
         FROM interactive_submissions s JOIN interactive_requests r ON r.interaction_id = s.interaction_id
         WHERE s.outcome = 'validating' ORDER BY s.submitted_at_ms",
    )?;
    let rows = statement.query_map([], |row| {
        Ok((
            RunId::new(row.get::<_, String>(0)?),
            InteractionId::new(row.get::<_, String>(1)?),
            SubmissionId::new(row.get::<_, String>(2)?),
            u64_of(row.get(3)?),
        ))
    })?;
    rows.collect()
}

/// The digest of a payload, computed before the transaction.
pub fn payload_hash(output: &Value) -> (Digest, Blob) {
    let blob = Blob::json(output);
    (blob.digest, blob)
}
