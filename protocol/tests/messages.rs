//! Decoding, typed dispatch and encoding of frames.

use protocol::generated::constrained::{Controls, Revision};
use protocol::generated::types::{Control, Operation};
use protocol::{
    ClientMessage, ErrorCode, MAX_FRAME_BYTES, RequestPayload, ResponseReceipt,
    decode_client_frame, decode_runner_frame, encode_client, parse_request_payload,
};
use serde_json::json;

fn frame(v: &serde_json::Value) -> Vec<u8> {
    let mut b = protocol::canonicalize(v).unwrap();
    b.push(b'\n');
    b
}

fn cancel() -> serde_json::Value {
    json!({"schema":"pi-workflows.client.v1","type":"request","requestId":"r1","clientId":"c1",
           "operation":"run.cancel","runId":"run-1","idempotencyKey":"k1","payload":{}})
}

#[test]
fn decodes_a_request_with_its_typed_payload_and_encodes_it_back() {
    let bytes = frame(&cancel());
    let decoded = decode_client_frame(&bytes).unwrap();
    assert_eq!(decoded.kind(), "request/run.cancel");
    assert!(matches!(
        decoded.payload,
        Some(RequestPayload::RunCancel(_))
    ));
    assert_eq!(encode_client(&decoded.message).unwrap(), bytes);
}

#[test]
fn the_payload_follows_the_operation() {
    let start = json!({"workflow":"w","input":{},"executionMode":"headless","projectPath":"/p"});
    assert!(matches!(
        parse_request_payload(Operation::RunStart, &start),
        Ok(RequestPayload::RunStart(_))
    ));
    assert!(parse_request_payload(Operation::RunCancel, &start).is_err());
    let mut v = cancel();
    v["payload"] = start;
    assert_eq!(
        decode_client_frame(&frame(&v)).unwrap_err().code(),
        ErrorCode::SchemaInvalid
    );
}

#[test]
fn null_for_an_optional_field_is_rejected_at_every_level() {
    let mut v = cancel();
    v["runId"] = json!(null);
    assert_eq!(
        decode_client_frame(&frame(&v)).unwrap_err().code(),
        ErrorCode::SchemaInvalid
    );
    let mut v = cancel();
    v["operation"] = json!("run.start");
    v["payload"] = json!({"workflow":"w","input":{},"executionMode":"headless","projectPath":"/p","originSessionId":null});
    assert_eq!(
        decode_client_frame(&frame(&v)).unwrap_err().code(),
        ErrorCode::SchemaInvalid
    );
}

#[test]
fn a_response_receipt_is_typed_by_operation() {
    let v = json!({"schema":"pi-workflows.client.v1","type":"response","requestId":"r1","operation":"run.start",
                   "outcome":"accepted","revision":1,"receipt":{"runId":"run-1","revision":1}});
    let decoded = decode_client_frame(&frame(&v)).unwrap();
    assert!(matches!(
        decoded.receipt,
        Some(ResponseReceipt::RunStart(_))
    ));
}

#[test]
fn constrained_types_enforce_what_typify_does_not() {
    assert!(Revision::new(9_007_199_254_740_991).is_some());
    assert!(Revision::new(9_007_199_254_740_992).is_none());
    assert!(serde_json::from_value::<Revision>(json!(9_007_199_254_740_992_u64)).is_err());
    assert!(serde_json::from_value::<Revision>(json!(-1)).is_err());
    assert!(Controls::new(vec![Control::Pause, Control::Cancel]).is_ok());
    assert!(Controls::new(vec![Control::Pause, Control::Pause]).is_err());
    // Order is kept (a set would reorder and break the round trip).
    let c: Controls = serde_json::from_value(json!(["pause", "cancel"])).unwrap();
    assert_eq!(c.as_slice(), &[Control::Pause, Control::Cancel]);
}

#[test]
fn encoding_refuses_frames_over_the_limit() {
    let mut v = cancel();
    v["operation"] = json!("checkpoint.answer");
    v["payload"] = json!({"answer": "x".repeat(MAX_FRAME_BYTES)});
    let message: ClientMessage = serde_json::from_value(v).unwrap();
    assert_eq!(
        encode_client(&message).unwrap_err().code(),
        ErrorCode::FrameTooLarge
    );
}

#[test]
fn the_runner_channel_rejects_server_messages_and_vice_versa() {
    let reply = json!({"schema":"pi-workflows.worker-launch.v1","type":"reply","runId":"run-1","generation":2,
                       "runnerEpoch":"re-1","inReplyTo":"m1","outcome":"accepted","result":null});
    assert!(protocol::decode_server_frame(&frame(&reply)).is_ok());
    assert_eq!(
        decode_runner_frame(&frame(&reply)).unwrap_err().code(),
        ErrorCode::SchemaInvalid
    );
}

#[test]
fn extra_fields_on_a_unit_variant_are_rejected_by_the_round_trip() {
    // serde's internally tagged enums ignore unknown fields on unit variants
    // even with deny_unknown_fields; the typed round trip catches it.
    let mut v = cancel();
    v["operation"] = json!("subscribe");
    v["payload"] = json!({"target": {"kind": "runList", "runId": "run-1"}});
    let payload = &v["payload"];
    assert!(
        parse_request_payload(Operation::Subscribe, payload).is_ok(),
        "serde alone accepts it"
    );
    assert_eq!(
        decode_client_frame(&frame(&v)).unwrap_err().code(),
        ErrorCode::SchemaInvalid
    );
    v["payload"] = json!({"target": {"kind": "runList"}});
    assert!(decode_client_frame(&frame(&v)).is_ok());
}
