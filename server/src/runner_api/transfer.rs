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
use crate::store::blobs::{self, Blob};
use rusqlite::Connection;
use serde_json::{Value, json};
use std::sync::Arc;

/// The reference to stored canonical JSON.
fn reference_to(blob: &Blob) -> Value {
    json!({
        "digest": crate::ids::digest_text(&blob.digest),
        "mediaType": blobs::JSON,
        "bytes": blob.bytes.len(),
    })
}

/// `message` as it can be sent: unchanged when it fits a frame, otherwise
/// with its unbounded value stored and referenced (inside the caller's
/// transaction).
pub(crate) fn fit(
    connection: &Connection,
    mut message: Value,
    now_ms: u64,
) -> rusqlite::Result<Value> {
    if crate::wire::frames::fits(&message) {
        return Ok(message);
    }
    match message.get("type").and_then(Value::as_str) {
        Some("command") => {
            let state = message
                .pointer_mut("/state/value")
                .map(Value::take)
                .unwrap_or(Value::Null);
            let blob = Blob::json(&state);
            blobs::put(connection, &blob, blobs::JSON, now_ms)?;
            message["state"] = json!({ "kind": "reference", "reference": reference_to(&blob) });
        }
        Some("reply") => {
            let result = message
                .get_mut("result")
                .map(Value::take)
                .unwrap_or(Value::Null);
            let blob = Blob::json(&result);
            blobs::put(connection, &blob, blobs::JSON, now_ms)?;
            message["resultContent"] = reference_to(&blob);
        }
        _ => {}
    }
    Ok(message)
}

/// The content references a server-to-runner frame carries (canonical
/// text), which the runner may then read.
pub(crate) fn references(message: &Value) -> Vec<String> {
    [
        message.pointer("/state/reference"),
        message.get("resultContent"),
    ]
    .into_iter()
    .flatten()
    .filter_map(|reference| protocol::canonicalize(reference).ok())
    .filter_map(|bytes| String::from_utf8(bytes).ok())
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
    reference: &Value,
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
    message_id: &str,
    content: &protocol::generated::types::ContentReference,
    offset: u64,
    length: u64,
) -> Value {
    let digest = crate::ids::parse_digest(Some(content.digest.as_str()));
    // The reference as this server issued it (its canonical text is what
    // `issue` recorded) and as the chunk repeats it.
    let reference = serde_json::to_value(content).unwrap_or(Value::Null);
    let issued = protocol::canonicalize(&reference)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .is_some_and(|text| runner.was_issued(&text));
    let stored = match digest.filter(|_| issued) {
        Some(digest) => app
            .store
            .read(move |connection| blobs::get(connection, &digest))
            .await
            .ok()
            .flatten(),
        None => None,
    };
    let envelope = |kind: &str| {
        json!({
            "type": kind,
            "schema": "pi-workflows.worker-launch.v1",
            "runId": runner.run_id.as_str(),
            "generation": runner.generation.0,
            "runnerEpoch": runner.runner_epoch.as_str(),
            "inReplyTo": message_id,
        })
    };
    match part(issued, stored.as_deref(), &reference, offset, length) {
        Ok((data, last)) => {
            let mut chunk = envelope("content.chunk");
            chunk["reference"] = reference;
            chunk["offset"] = json!(offset);
            chunk["data"] = json!(data);
            chunk["final"] = json!(last);
            chunk
        }
        Err(refusal) => {
            let mut answer = envelope("reply");
            answer["outcome"] = json!("rejected");
            answer["result"] = Value::Null;
            answer["error"] = json!({ "code": "contentUnavailable", "message": refusal.message() });
            answer
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(bytes: &[u8]) -> Value {
        json!({
            "digest": crate::ids::digest_text(&crate::ids::sha256(bytes)),
            "mediaType": "application/json",
            "bytes": bytes.len(),
        })
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
        let mut wrong_length = good.clone();
        wrong_length["bytes"] = json!(bytes.len() + 1);
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
        let digest = crate::ids::parse_digest(reference["digest"].as_str()).unwrap();
        let bytes = blobs::get(connection, &digest).unwrap().unwrap();
        assert_eq!(reference["bytes"], bytes.len());
        assert_eq!(reference["mediaType"], "application/json");
        protocol::content::json(&bytes).unwrap()
    }

    #[test]
    fn a_message_that_fits_is_unchanged_and_an_oversized_one_moves_its_value_to_the_store() {
        let connection = store();
        let small =
            json!({ "type": "command", "state": { "kind": "inline", "value": { "steps": 1 } } });
        assert_eq!(fit(&connection, small.clone(), 1).unwrap(), small);
        assert_eq!(crate::store::blobs::count(&connection).unwrap(), 0);

        let state = json!({ "input": {}, "results": { "a": { "output": "s".repeat(1_200_000) } }, "resultOrder": ["a"], "steps": 1 });
        let command = json!({ "type": "command", "command": "resume", "state": { "kind": "inline", "value": state } });
        let fitted = fit(&connection, command, 1).unwrap();
        assert_eq!(fitted["state"]["kind"], "reference");
        assert!(
            fitted.get("command").is_some(),
            "the rest of the command stays"
        );
        assert!(crate::wire::frames::fits(&fitted));
        assert_eq!(
            referenced(&connection, &fitted["state"]["reference"]),
            state
        );

        let result = json!({ "effectId": "e", "result": "r".repeat(1_100_000) });
        let reply =
            json!({ "type": "reply", "inReplyTo": "m1", "outcome": "adopted", "result": result });
        let fitted = fit(&connection, reply, 1).unwrap();
        assert_eq!(fitted["result"], Value::Null);
        assert_eq!(fitted["outcome"], "adopted");
        assert!(crate::wire::frames::fits(&fitted));
        assert_eq!(referenced(&connection, &fitted["resultContent"]), result);
    }

    #[test]
    fn only_an_oversized_field_moves_and_the_references_are_listed() {
        let small = json!({ "type": "reply", "result": { "a": 1 } });
        assert!(references(&small).is_empty());
        let command = json!({ "type": "command", "state": { "kind": "reference", "reference": reference(b"x") } });
        assert_eq!(references(&command).len(), 1);
        let reply = json!({ "type": "reply", "result": null, "resultContent": reference(b"y") });
        assert_eq!(
            references(&reply),
            vec![String::from_utf8(protocol::canonicalize(&reference(b"y")).unwrap()).unwrap()]
        );
    }
}
