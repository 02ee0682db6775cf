//! Decoding and encoding frames of each channel.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::{canonicalize_typed, check_depth, parse_canonical};
use crate::error::{SCHEMA_INVALID, SafeError, TOO_LARGE};
use crate::framing::{MAX_FRAME_BYTES, frame_content};
use crate::generated::dispatch::{
    RequestPayload, ResponseReceipt, parse_request_payload, parse_response_receipt,
};
use crate::generated::types::{ClientMessage, RunView, RunnerMessage, ServerMessage, WorkerLaunch};

/// A decoded client-channel frame: the message and, for a request or a
/// response with a receipt, the typed value its `operation` selects.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientFrame {
    /// The envelope.
    pub message: ClientMessage,
    /// The typed payload of a request.
    pub payload: Option<RequestPayload>,
    /// The typed receipt of a response that carries one.
    pub receipt: Option<ResponseReceipt>,
}

impl ClientFrame {
    /// The message kind used by the conformance corpus: `hello`,
    /// `request/<operation>`, `response/<operation>` or `event/<kind>`.
    pub fn kind(&self) -> String {
        match &self.message {
            ClientMessage::Hello { .. } => "hello".to_string(),
            ClientMessage::Request { operation, .. } => format!("request/{operation}"),
            ClientMessage::Response { operation, .. } => format!("response/{operation}"),
            ClientMessage::Event { event, .. } => format!("event/{}", tag_of(event, "kind")),
        }
    }
}

/// The `type` of a runner-to-server message (for example `node.started`).
pub fn runner_kind(message: &RunnerMessage) -> String {
    tag_of(message, "type")
}

/// The `type` of a server-to-runner message (for example `reply`).
pub fn server_kind(message: &ServerMessage) -> String {
    tag_of(message, "type")
}

/// `launch/<mode>`.
pub fn launch_kind(launch: &WorkerLaunch) -> String {
    format!("launch/{}", launch.mode)
}

fn tag_of<T: Serialize>(value: &T, tag: &str) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.get(tag).and_then(Value::as_str).map(str::to_string))
        .unwrap_or_default()
}

/// Deserializes `value` as `T` and requires the typed value to serialize
/// back to exactly `value`. The round trip catches what serde would
/// otherwise accept silently: `null` for an optional field (read as
/// absent), and anything else the typed model cannot represent.
fn typed<T: for<'de> Deserialize<'de> + Serialize>(value: &Value) -> Result<T, SafeError> {
    let typed = T::deserialize(value).map_err(|_| SCHEMA_INVALID)?;
    round_trips(&typed, value)?;
    Ok(typed)
}

fn round_trips<T: Serialize>(typed: &T, value: &Value) -> Result<(), SafeError> {
    match serde_json::to_value(typed) {
        Ok(v) if v == *value => Ok(()),
        _ => Err(SCHEMA_INVALID),
    }
}

/// Decodes canonical `bytes` as `T` with every check of [`parse_canonical`]
/// and [`typed`], in one pass on the path a valid message takes: the typed
/// value is read from the bytes and must encode back to exactly them. That
/// comparison proves the bytes canonical (they are an encoder output) and
/// the typed value a faithful round trip (a value has one canonical text).
/// Any other input takes the checks one by one, so its error is the first
/// check it fails, as before.
fn checked<T: for<'de> Deserialize<'de> + Serialize>(bytes: &[u8]) -> Result<T, SafeError> {
    check_depth(bytes)?;
    if let Ok(typed) = serde_json::from_slice::<T>(bytes)
        && canonicalize_typed(&typed).is_ok_and(|encoded| encoded == bytes)
    {
        return Ok(typed);
    }
    typed(&parse_canonical(bytes)?)
}

/// Decodes one client-channel frame (canonical JSON plus `\n`).
pub fn decode_client_frame(frame: &[u8]) -> Result<ClientFrame, SafeError> {
    let value = parse_canonical(frame_content(frame)?)?;
    let message: ClientMessage = typed(&value)?;
    let (payload, receipt) = match &message {
        ClientMessage::Request { operation, .. } => {
            let raw = value.get("payload").ok_or(SCHEMA_INVALID)?;
            let payload = parse_request_payload(*operation, raw).map_err(|_| SCHEMA_INVALID)?;
            round_trips(&payload, raw)?;
            (Some(payload), None)
        }
        ClientMessage::Response { operation, .. } => match value.get("receipt") {
            Some(raw) => {
                let receipt =
                    parse_response_receipt(*operation, raw).map_err(|_| SCHEMA_INVALID)?;
                round_trips(&receipt, raw)?;
                (None, Some(receipt))
            }
            None => (None, None),
        },
        _ => (None, None),
    };
    Ok(ClientFrame {
        message,
        payload,
        receipt,
    })
}

/// Decodes one runner-to-server frame.
pub fn decode_runner_frame(frame: &[u8]) -> Result<RunnerMessage, SafeError> {
    checked(frame_content(frame)?)
}

/// Decodes one server-to-runner frame.
pub fn decode_server_frame(frame: &[u8]) -> Result<ServerMessage, SafeError> {
    checked(frame_content(frame)?)
}

/// Decodes the launch envelope: the canonical JSON of the first line the
/// server writes to the runner's stdin, without its newline.
pub fn decode_launch(bytes: &[u8]) -> Result<WorkerLaunch, SafeError> {
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(TOO_LARGE);
    }
    typed(&parse_canonical(bytes)?)
}

/// Decodes a standalone run-view document (canonical JSON, no newline).
pub fn decode_run_view(bytes: &[u8]) -> Result<RunView, SafeError> {
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(TOO_LARGE);
    }
    typed(&parse_canonical(bytes)?)
}

fn frame<T: Serialize>(message: &T) -> Result<Vec<u8>, SafeError> {
    let mut bytes = canonicalize_typed(message)?;
    bytes.push(b'\n');
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(TOO_LARGE);
    }
    Ok(bytes)
}

/// Encodes a client-channel message as one frame (canonical JSON plus
/// `\n`). Fails with `frameTooLarge` above 1 MiB: send large values as
/// content references instead.
pub fn encode_client(message: &ClientMessage) -> Result<Vec<u8>, SafeError> {
    frame(message)
}

/// Encodes a runner-to-server message as one frame.
pub fn encode_runner(message: &RunnerMessage) -> Result<Vec<u8>, SafeError> {
    frame(message)
}

/// Encodes a server-to-runner message as one frame.
pub fn encode_server(message: &ServerMessage) -> Result<Vec<u8>, SafeError> {
    frame(message)
}

/// Encodes the launch envelope (canonical JSON, no newline).
pub fn encode_launch(launch: &WorkerLaunch) -> Result<Vec<u8>, SafeError> {
    let bytes = canonicalize_typed(launch)?;
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(TOO_LARGE);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generated::types::{RunnerMessage, ServerMessage};

    /// The one-pass check ([`checked`]) gives the verdict of the checks one
    /// by one (`parse_canonical`, then [`typed`]): the same message or the
    /// same error, for every frame of the conformance corpus of the runner
    /// channel, each decoded as either direction's message, and for each
    /// accepted frame with one byte changed at 64 positions.
    #[test]
    fn the_one_pass_check_agrees_with_the_checks_one_by_one_on_the_corpus() {
        fn agree<T>(bytes: &[u8]) -> bool
        where
            T: for<'de> Deserialize<'de> + Serialize + PartialEq + std::fmt::Debug,
        {
            let one_pass = checked::<T>(bytes);
            let one_by_one = parse_canonical(bytes).and_then(|value| typed::<T>(&value));
            assert_eq!(one_pass, one_by_one, "{}", String::from_utf8_lossy(bytes));
            one_pass.is_ok()
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/frames");
        let (mut frames, mut accepted) = (0, 0);
        for direction in ["runner", "server"] {
            for entry in std::fs::read_dir(root.join(direction)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|ext| ext != "in") {
                    continue;
                }
                let frame = std::fs::read(&path).unwrap();
                let Ok(bytes) = frame_content(&frame) else {
                    continue;
                };
                frames += 1;
                if agree::<RunnerMessage>(bytes) | agree::<ServerMessage>(bytes) {
                    accepted += 1;
                    let canonical =
                        crate::canonicalize(&serde_json::from_slice(bytes).unwrap()).unwrap();
                    // 64 positions spread over the frame, each changed
                    // three ways (whitespace, a digit, a quote).
                    let stride = canonical.len().div_ceil(64);
                    for at in (0..canonical.len()).step_by(stride) {
                        for replacement in [b' ', b'1', b'"'] {
                            let mut changed = canonical.clone();
                            changed[at] = replacement;
                            agree::<RunnerMessage>(&changed);
                            agree::<ServerMessage>(&changed);
                        }
                    }
                }
            }
        }
        assert!(
            frames >= 80 && accepted >= 30,
            "{frames} frames, {accepted} accepted"
        );
    }
}
