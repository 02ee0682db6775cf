//! Runner transfer content: a value the server sends a runner that would
//! not fit one 1 MiB frame goes to the content-addressed blob store, and the
//! frame carries a small digest-bound reference instead, which the runner
//! reads with `content.read` in parts of at most 512 KiB.
//!
//! Invariants:
//! - Every server-to-runner frame is measured; only one over the limit
//!   changes, and only in its one unbounded field: a command's `state`
//!   becomes `{kind: reference}`, a reply's `result` becomes `null` plus
//!   `resultContent`. Every other field of both is bounded.
//! - The blob is written in the transaction that stores the reply receipt
//!   naming it, so the reference never exists before its bytes, and a
//!   repeated message gets the same reference back.
//! - A runner reads only content sent to it (its runner epoch) under the
//!   exact digest, length and media type it was given; anything else is a
//!   bounded `contentUnavailable` refusal.

use crate::context::runners::Runner;
use crate::projection::run_view::{OffSchema, to_wire};
use crate::runner_api::reply::Addressee;
use crate::store::blobs::{self, Blob};
use protocol::ErrorCode;
use protocol::generated::constrained::ByteOffset;
use protocol::generated::types::{CommandState, ContentReference, ReplyOutcome, ServerMessage};
use rusqlite::Connection;
use serde_json::Value;
use std::sync::Arc;

/// The reference to stored canonical JSON.
fn reference_to(blob: &Blob) -> Result<ContentReference, OffSchema> {
    crate::projection::run_view::content_reference(&blob.digest, blobs::JSON, blob.bytes.len())
}

/// Canonical JSON bytes of a typed value with their digest.
fn blob_of<T: serde::Serialize>(value: &T) -> Result<Blob, OffSchema> {
    let bytes = protocol::canonicalize_typed(value).map_err(|_| OffSchema("state"))?;
    Ok(Blob {
        digest: crate::ids::sha256(&bytes),
        bytes,
    })
}

/// `message` as it can be sent: unchanged when it fits a frame, otherwise
/// with its unbounded value stored and referenced (inside the caller's
/// transaction).
pub(crate) fn fit(
    connection: &Connection,
    mut message: ServerMessage,
    now_ms: u64,
) -> rusqlite::Result<ServerMessage> {
    if crate::wire::frames::fits(&message) {
        return Ok(message);
    }
    match &mut message {
        ServerMessage::Command { state, .. } => match state {
            CommandState::Inline { value } => {
                let blob = blob_of(value)?;
                blobs::put(connection, &blob, blobs::JSON, now_ms)?;
                *state = CommandState::Reference {
                    reference: reference_to(&blob)?,
                };
            }
            // Already a reference: nothing unbounded is left in the command.
            CommandState::Reference { .. } => {}
        },
        ServerMessage::Reply {
            result,
            result_content,
            ..
        } => {
            let blob = Blob::json(result);
            blobs::put(connection, &blob, blobs::JSON, now_ms)?;
            *result = Value::Null;
            *result_content = Some(reference_to(&blob)?);
        }
        // A chunk carries at most 512 KiB of content: it always fits.
        ServerMessage::ContentChunk { .. } => {}
    }
    Ok(message)
}

/// The content references a server-to-runner frame carries (canonical
/// text), which the runner may then read.
pub(crate) fn references(message: &ServerMessage) -> Vec<String> {
    let reference = match message {
        ServerMessage::Command {
            state: CommandState::Reference { reference },
            ..
        } => Some(reference),
        ServerMessage::Reply { result_content, .. } => result_content.as_ref(),
        ServerMessage::Command {
            state: CommandState::Inline { .. },
            ..
        }
        | ServerMessage::ContentChunk { .. } => None,
    };
    reference
        .map(|reference| crate::projection::run_view::canonical_text(&reference))
        .into_iter()
        .collect()
}

/// Why a `content.read` is refused (static, bounded text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadRefusal {
    NotIssued,
    Missing,
    Range(&'static str),
}

impl ReadRefusal {
    /// The message of the refusing reply.
    pub const fn message(self) -> &'static str {
        match self {
            Self::NotIssued => "this content was not sent to this runner",
            Self::Missing => "the referenced content is not stored",
            Self::Range(message) => message,
        }
    }
}

/// One part of issued content: checks the reference against what was
/// issued and what is stored, then slices (a pure decision over the
/// facts the caller read).
pub fn part(
    issued: bool,
    stored: Option<&[u8]>,
    reference: &ContentReference,
    offset: u64,
    length: u64,
) -> Result<(String, bool), ReadRefusal> {
    if !issued {
        return Err(ReadRefusal::NotIssued);
    }
    let Some(bytes) = stored else {
        return Err(ReadRefusal::Missing);
    };
    let offset = usize::try_from(offset)
        .map_err(|_| ReadRefusal::Range("the offset is past the end of the content"))?;
    let length = usize::try_from(length).unwrap_or(usize::MAX);
    crate::presentation::reads::part_of(bytes, reference, offset, length)
        .map_err(ReadRefusal::Range)
}

/// Answers one `content.read` of `runner`: a `content.chunk`, or a
/// `rejected` reply with `contentUnavailable`.
pub(crate) async fn read(
    app: &Arc<crate::context::Context>,
    runner: &Arc<Runner>,
    to: &Addressee,
    content: &ContentReference,
    offset: u64,
    length: u64,
) -> ServerMessage {
    let digest = crate::ids::parse_digest(Some(content.digest.as_str()));
    // The reference as this server issued it (its canonical text is what
    // `issue` recorded) and as the chunk repeats it.
    let issued = runner.was_issued(&crate::projection::run_view::canonical_text(content));
    let stored = match digest.filter(|_| issued) {
        Some(digest) => app
            .store
            .read(move |connection| blobs::get(connection, &digest))
            .await
            .ok()
            .flatten(),
        None => None,
    };
    match part(issued, stored.as_deref(), content, offset, length) {
        Ok((data, last)) => chunk(to, content, offset, data, last).unwrap_or_else(|error| {
            crate::log::line(&format!("a content.read answer was not built: {error}"));
            to.refusal(
                ReplyOutcome::Rejected,
                ErrorCode::Internal,
                "the server could not answer this read",
            )
        }),
        Err(refusal) => to.refusal(
            ReplyOutcome::Rejected,
            ErrorCode::ContentUnavailable,
            refusal.message(),
        ),
    }
}

/// The `content.chunk` of one part.
fn chunk(
    to: &Addressee,
    reference: &ContentReference,
    offset: u64,
    data: String,
    last: bool,
) -> Result<ServerMessage, OffSchema> {
    Ok(to.content_chunk(
        reference.clone(),
        ByteOffset::new(offset).ok_or(OffSchema("offset"))?,
        to_wire("data", data)?,
        last,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reference(bytes: &[u8]) -> ContentReference {
        crate::projection::run_view::content_reference(
            &crate::ids::sha256(bytes),
            blobs::JSON,
            bytes.len(),
        )
        .unwrap()
    }

    #[test]
    fn issued_stored_content_is_served_in_bounded_parts() {
        let bytes = vec![b'7'; 700_000];
        let reference = reference(&bytes);
        let (data, last) = part(true, Some(&bytes), &reference, 0, 1 << 20).unwrap();
        use base64::Engine as _;
        let first = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        assert_eq!(
            first.len(),
            512 * 1024,
            "a part is at most 512 KiB whatever is asked"
        );
        assert!(!last);
        let (data, last) = part(
            true,
            Some(&bytes),
            &reference,
            first.len() as u64,
            512 * 1024,
        )
        .unwrap();
        let rest = base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap();
        assert_eq!(first.len() + rest.len(), bytes.len());
        assert!(last);
    }

    #[test]
    fn content_not_issued_missing_or_read_out_of_range_is_refused() {
        let bytes = b"{\"a\":1}".to_vec();
        let good = reference(&bytes);
        assert_eq!(
            part(false, Some(&bytes), &good, 0, 10),
            Err(ReadRefusal::NotIssued)
        );
        assert_eq!(part(true, None, &good, 0, 10), Err(ReadRefusal::Missing));
        assert!(matches!(
            part(true, Some(&bytes), &good, bytes.len() as u64 + 1, 10),
            Err(ReadRefusal::Range(_))
        ));
        assert!(matches!(
            part(true, Some(&bytes), &good, u64::MAX, 10),
            Err(ReadRefusal::Range(_))
        ));
        let wrong_length = crate::projection::run_view::content_reference(
            &crate::ids::sha256(&bytes),
            blobs::JSON,
            bytes.len() + 1,
        )
        .unwrap();
        assert!(matches!(
            part(true, Some(&bytes), &wrong_length, 0, 10),
            Err(ReadRefusal::Range(_))
        ));
    }

    fn store() -> Connection {
        let connection = Connection::open_in_memory().unwrap();
        connection.execute_batch(crate::store::schema::DDL).unwrap();
        connection
    }

    /// The stored bytes behind a reference, checked against it.
    fn referenced(connection: &Connection, reference: &Value) -> Value {
        let reference: ContentReference = serde_json::from_value(reference.clone()).unwrap();
        let digest = crate::ids::parse_digest(Some(reference.digest.as_str())).unwrap();
        let bytes = blobs::get(connection, &digest).unwrap().unwrap();
        assert_eq!(reference.bytes.get(), bytes.len() as u64);
        assert_eq!(reference.media_type.as_str(), "application/json");
        protocol::content::json(&bytes).unwrap()
    }

    /// A complete `runner.v1` command carrying `state`.
    fn command(state: Value) -> ServerMessage {
        serde_json::from_value(json!({
            "schema": "pi-workflows.worker-launch.v1", "type": "command", "command": "resume",
            "runId": "run-1", "generation": 1, "runnerEpoch": "epoch-1",
            "node": { "nodeId": "a", "visit": 1, "attemptId": "att-1" },
            "state": state,
        }))
        .unwrap()
    }

    /// A complete `runner.v1` reply carrying `result`.
    fn reply(result: Value) -> ServerMessage {
        serde_json::from_value(json!({
            "schema": "pi-workflows.worker-launch.v1", "type": "reply", "inReplyTo": "m1",
            "runId": "run-1", "generation": 1, "runnerEpoch": "epoch-1",
            "outcome": "adopted", "result": result,
        }))
        .unwrap()
    }

    /// A message as JSON, to look at its fields.
    fn json_of(message: &ServerMessage) -> Value {
        serde_json::to_value(message).unwrap()
    }

    #[test]
    fn a_message_that_fits_is_unchanged_and_an_oversized_one_moves_its_value_to_the_store() {
        let connection = store();
        let small = command(
            json!({ "kind": "inline", "value": { "input": {}, "results": {}, "resultOrder": [], "steps": 1 } }),
        );
        assert!(
            crate::wire::frames::server_message(&small).is_some(),
            "the fixture is on the schema"
        );
        assert_eq!(fit(&connection, small.clone(), 1).unwrap(), small);
        assert_eq!(crate::store::blobs::count(&connection).unwrap(), 0);

        let state = json!({ "input": {}, "results": { "a": { "output": "s".repeat(1_200_000) } }, "resultOrder": ["a"], "steps": 1 });
        let fitted = fit(
            &connection,
            command(json!({ "kind": "inline", "value": state })),
            1,
        )
        .unwrap();
        assert!(crate::wire::frames::server_message(&fitted).is_some());
        let fitted = json_of(&fitted);
        assert_eq!(fitted["state"]["kind"], "reference");
        assert_eq!(fitted["command"], "resume", "the rest of the command stays");
        assert_eq!(
            referenced(&connection, &fitted["state"]["reference"]),
            state
        );

        let result = json!({ "effectId": "e", "result": "r".repeat(1_100_000) });
        let fitted = fit(&connection, reply(result.clone()), 1).unwrap();
        assert!(crate::wire::frames::server_message(&fitted).is_some());
        let fitted = json_of(&fitted);
        assert_eq!(fitted["result"], Value::Null);
        assert_eq!(fitted["outcome"], "adopted");
        assert_eq!(referenced(&connection, &fitted["resultContent"]), result);
    }

    #[test]
    fn only_an_oversized_field_moves_and_the_references_are_listed() {
        assert!(references(&reply(json!({ "a": 1 }))).is_empty());
        let by_reference = json!({ "kind": "reference", "reference": reference(b"x") });
        assert_eq!(references(&command(by_reference)).len(), 1);
        let mut referencing = reply(Value::Null);
        if let ServerMessage::Reply { result_content, .. } = &mut referencing {
            *result_content = Some(reference(b"y"));
        }
        assert_eq!(
            references(&referencing),
            vec![crate::projection::run_view::canonical_text(&reference(
                b"y"
            ))]
        );
    }
}
