//! Outgoing frames: the canonical bytes of one message of one channel.
//!
//! Invariants:
//! - Every frame the server sends is built here: a client-channel message
//!   ([`client`]), a server-to-runner message ([`runner`]) or a launch
//!   envelope ([`launch`]). Each is canonical JSON and fits one 1 MiB frame,
//!   or the caller gets `None` and sends its bounded substitute.
//! - In debug builds and tests every frame is decoded again with the
//!   channel's own schema decoder (`protocol::decode_*`: typed, unknown
//!   fields refused, round trip exact) before it is sent. A frame that does
//!   not match its schema is a server defect: the check panics, naming the
//!   channel and the message kind only (never a payload), so a test that
//!   provokes it fails. Release builds skip the check.
//! - A typed message ([`client_message`], [`event`]) is canonicalised from
//!   its generated type directly, to the same bytes its JSON value gives.

use protocol::generated::types::{
    Availability, ClientEvent, ClientMessage, ClientSchemaId, SubscriptionId,
};
use serde::{Deserialize as _, Serialize};
use serde_json::Value;

/// The channel a frame is sent on (what its schema is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// `client.v1` on the client socket.
    Client,
    /// `runner.v1` server-to-runner messages.
    Runner,
    /// `worker-launch.v1`, the first line on a runner's stdin (no newline).
    Launch,
}

/// A client-channel frame (`\n`-terminated).
pub fn client(value: &Value) -> Option<Vec<u8>> {
    encode(Channel::Client, value, || client_kind(value))
}

/// A client-channel frame of a typed message (`\n`-terminated).
pub fn client_message(message: &ClientMessage) -> Option<Vec<u8>> {
    encode(Channel::Client, message, || message_kind(message))
}

/// The frame of one event of subscription `subscription_id`. An event that
/// does not fit one frame (every page and view is bounded to fit) becomes
/// an `unavailable` availability event of the same subscription, so its
/// receiver is told; nothing is dropped silently.
pub fn event(subscription_id: &SubscriptionId, revision: u64, event: ClientEvent) -> Vec<u8> {
    let message = |event| {
        Some(ClientMessage::Event {
            event,
            revision: protocol::generated::constrained::Revision::new(revision)?,
            schema: ClientSchemaId::PiWorkflowsClientV1,
            subscription_id: subscription_id.clone(),
        })
    };
    if let Some(frame) = message(event).as_ref().and_then(client_message) {
        return frame;
    }
    let substitute = ClientEvent::Availability {
        reason: "frameTooLarge: the event did not fit one 1 MiB frame; report this server bug"
            .parse()
            .ok(),
        state: Availability::Unavailable,
    };
    message(substitute)
        .as_ref()
        .and_then(client_message)
        .unwrap_or_default()
}

/// A server-to-runner frame of a typed message (`\n`-terminated).
pub fn server_message(message: &protocol::generated::types::ServerMessage) -> Option<Vec<u8>> {
    use protocol::generated::types::ServerMessage;
    encode(Channel::Runner, message, || {
        match message {
            ServerMessage::Command { .. } => "command",
            ServerMessage::Reply { .. } => "reply",
            ServerMessage::ContentChunk { .. } => "content.chunk",
        }
        .into()
    })
}

/// A launch envelope frame (`\n`-terminated; the schema covers the bytes
/// before the newline).
pub fn launch(launch: &protocol::generated::types::WorkerLaunch) -> Option<Vec<u8>> {
    encode(Channel::Launch, launch, || {
        format!("{} launch", launch.mode)
    })
}

/// Whether `value` fits one frame once canonical (no schema check: the
/// frame is checked when it is built to be sent).
pub fn fits<T: Serialize>(value: &T) -> bool {
    canonical_frame(value).is_some()
}

fn canonical_frame<T: Serialize>(value: &T) -> Option<Vec<u8>> {
    let mut bytes = protocol::canonicalize_typed(value).ok()?;
    bytes.push(b'\n');
    (bytes.len() <= protocol::MAX_FRAME_BYTES).then_some(bytes)
}

fn encode<T: Serialize>(
    channel: Channel,
    value: &T,
    kind: impl FnOnce() -> String,
) -> Option<Vec<u8>> {
    let bytes = canonical_frame(value)?;
    if cfg!(debug_assertions)
        && let Err(error) = check(channel, &bytes)
    {
        panic!(
            "an outgoing {channel:?} frame ({}) does not match its schema: {}",
            kind(),
            error.code()
        );
    }
    Some(bytes)
}

/// Decodes `bytes` with the schema decoder of `channel`.
pub fn check(channel: Channel, bytes: &[u8]) -> Result<(), protocol::SafeError> {
    match channel {
        Channel::Client => protocol::decode_client_frame(bytes).map(drop),
        Channel::Runner => protocol::decode_server_frame(bytes).map(drop),
        Channel::Launch => {
            protocol::decode_launch(bytes.strip_suffix(b"\n").unwrap_or(bytes)).map(drop)
        }
    }
}

/// The message kind of a client frame built as JSON, for the panic message
/// (no payload): read through the generated type, or named as off the type.
fn client_kind(value: &Value) -> String {
    match ClientMessage::deserialize(value) {
        Ok(message) => message_kind(&message),
        Err(_) => "a value that is no ClientMessage".into(),
    }
}

/// The message kind of a typed frame, for the panic message (no payload).
fn message_kind(message: &ClientMessage) -> String {
    match message {
        ClientMessage::Hello { .. } => "hello".into(),
        ClientMessage::Request { operation, .. } => format!("request/{operation}"),
        ClientMessage::Response { operation, .. } => format!("response/{operation}"),
        ClientMessage::Event { event, .. } => format!(
            "event/{}",
            match event {
                ClientEvent::RunListSnapshot { .. } => "runListSnapshot",
                ClientEvent::RunViewSnapshot { .. } => "runViewSnapshot",
                ClientEvent::RunViewPatch { .. } => "runViewPatch",
                ClientEvent::Page { .. } => "page",
                ClientEvent::SessionMessages { .. } => "sessionMessages",
                ClientEvent::Availability { .. } => "availability",
                ClientEvent::MaintenanceProgress { .. } => "maintenanceProgress",
            }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_frame_off_its_schema_is_refused_by_the_check() {
        let hello = json!({
            "schema": "pi-workflows.client.v1",
            "type": "event",
            "subscriptionId": "connection",
            "revision": 0,
            "event": { "kind": "availability", "state": "unavailable", "reason": "x" },
        });
        let bytes = canonical_frame(&hello).unwrap();
        assert_eq!(check(Channel::Client, &bytes), Ok(()));
        let mut extra = hello.clone();
        extra["unexpected"] = json!(1);
        let bytes = canonical_frame(&extra).unwrap();
        assert!(check(Channel::Client, &bytes).is_err());
        // The same bytes are not a runner-channel message.
        assert!(check(Channel::Runner, &canonical_frame(&hello).unwrap()).is_err());
    }

    #[test]
    #[should_panic(expected = "does not match its schema")]
    fn debug_builds_panic_on_a_frame_off_its_schema() {
        let _ = client(&json!({ "schema": "pi-workflows.client.v1", "type": "event" }));
    }

    /// A protocol fixture (canonical bytes) as a JSON value.
    fn fixture(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    const REPLY: &str =
        include_str!("../../../protocol/fixtures/frames/server/reply-result-content.canonical");
    const LAUNCH: &str =
        include_str!("../../../protocol/fixtures/frames/launch/launch-run.canonical");

    #[test]
    fn the_runner_and_launch_checks_refuse_a_planted_document_off_their_schema() {
        let reply = fixture(REPLY);
        assert_eq!(
            check(Channel::Runner, &canonical_frame(&reply).unwrap()),
            Ok(())
        );
        let mut planted = reply.clone();
        planted["outcome"] = json!("maybe");
        assert!(check(Channel::Runner, &canonical_frame(&planted).unwrap()).is_err());
        let launch = fixture(LAUNCH);
        assert_eq!(
            check(Channel::Launch, &canonical_frame(&launch).unwrap()),
            Ok(())
        );
        let mut planted = launch.clone();
        planted["protocolVersion"] = json!(2);
        assert!(check(Channel::Launch, &canonical_frame(&planted).unwrap()).is_err());
        // A runner message is not a launch envelope, nor a client frame.
        assert!(check(Channel::Launch, &canonical_frame(&reply).unwrap()).is_err());
        assert!(check(Channel::Client, &canonical_frame(&reply).unwrap()).is_err());
    }

    /// A typed reply the generated type holds but the frame check refuses:
    /// its result nests deeper than the protocol's 64 levels.
    #[test]
    #[should_panic(expected = "an outgoing Runner frame (reply) does not match its schema")]
    fn debug_builds_panic_on_a_runner_frame_off_its_schema() {
        let mut planted: protocol::generated::types::ServerMessage =
            serde_json::from_value(fixture(REPLY)).expect("the fixture is a ServerMessage");
        if let protocol::generated::types::ServerMessage::Reply {
            result,
            result_content,
            ..
        } = &mut planted
        {
            *result_content = None;
            *result = (0..70).fold(json!(1), |inner, _| json!([inner]));
        }
        let _ = server_message(&planted);
    }

    /// A launch envelope is built as the generated `WorkerLaunch` (the
    /// schema has no rule the type cannot hold): a field off the schema is
    /// no `WorkerLaunch`, and the fixture's frame is its canonical bytes.
    #[test]
    fn a_launch_envelope_is_its_typed_frame() {
        let envelope = fixture(LAUNCH);
        let typed: protocol::generated::types::WorkerLaunch =
            serde_json::from_value(envelope.clone()).expect("the fixture is a WorkerLaunch");
        assert_eq!(launch(&typed), canonical_frame(&envelope));
        let mut planted = envelope;
        planted["unexpected"] = json!(true);
        assert!(
            serde_json::from_value::<protocol::generated::types::WorkerLaunch>(planted).is_err()
        );
    }

    /// A typed response whose receipt is not the receipt of its operation:
    /// the generated type cannot say so (a receipt is any object), the
    /// schema check does.
    #[test]
    #[should_panic(
        expected = "an outgoing Client frame (response/server.status) does not match its schema"
    )]
    fn debug_builds_panic_on_a_typed_response_whose_receipt_is_off_its_schema() {
        use protocol::generated::types::{CommandOutcome, JsonObject, Operation};
        let receipt = json!({ "queued": "many" });
        let _ = client_message(&ClientMessage::Response {
            error: None,
            operation: Operation::ServerStatus,
            outcome: CommandOutcome::Accepted,
            receipt: Some(JsonObject(receipt.as_object().unwrap().clone())),
            request_id: "req-1".parse().unwrap(),
            revision: None,
            schema: ClientSchemaId::PiWorkflowsClientV1,
        });
    }

    #[test]
    fn an_event_that_does_not_fit_a_frame_tells_its_subscription() {
        use protocol::generated::types::{PageCollection, ViewPage};
        let subscription: SubscriptionId = "sub-abc".parse().unwrap();
        let page = ViewPage {
            checkpoint: None,
            collection: PageCollection::Steps,
            cursor: None,
            items: vec![Value::String("x".repeat(protocol::MAX_FRAME_BYTES))],
            next_cursor: None,
            revision: protocol::generated::constrained::Revision::new(3).unwrap(),
        };
        let frame = event(&subscription, 3, ClientEvent::Page { page });
        assert!(frame.len() < 1024, "the substitute is small");
        let decoded = protocol::decode_client_frame(&frame).unwrap();
        match decoded.message {
            ClientMessage::Event {
                event: ClientEvent::Availability { state, reason },
                subscription_id,
                revision,
                ..
            } => {
                assert_eq!(state, Availability::Unavailable);
                assert!(reason.unwrap().starts_with("frameTooLarge"));
                assert_eq!(subscription_id, subscription);
                assert_eq!(revision.get(), 3);
            }
            other => panic!("not an availability event: {other:?}"),
        }
    }
}
