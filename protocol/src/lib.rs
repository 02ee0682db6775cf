//! The pi-workflows wire protocols in Rust.
//!
//! The schemas under `protocol/*.schema.json` are normative; `generated`
//! holds the types `cargo run -p codegen` derives from them. This crate adds
//! what a schema cannot say:
//!
//! - [`canonical`]: RFC 8785 canonical JSON and the "canonical on the wire"
//!   rule (`canonicalize(parse(bytes)) == bytes`);
//! - [`framing`]: exact NDJSON framing ([`FrameDecoder`], and
//!   [`FrameCodec`] for tokio);
//! - decoding and encoding of every channel's frames, with unknown fields
//!   rejected at every level (typify's `deny_unknown_fields`, the generated
//!   payload/receipt dispatch, and a typed round trip that must reproduce
//!   the frame);
//! - [`SafeError`]: a closed code and a static message, never payload text;
//! - [`content`]: verified reads of digest-bound content references in
//!   512 KiB parts (the server, the runners and the Rust client share it);
//! - [`workflow_ref`]: the one rule that tells a workflow path from a name;
//! - [`controller_ref`]: the one rule that tells a controller module's file name.
//!
//! A frame is decoded in this order, identical in the TypeScript SDK (so
//! both report the same code for the same bytes): framing
//! (`frameTooLarge`, `malformedFrame`), nesting depth (`nestingTooDeep`),
//! canonical form (`nonCanonical`), schema (`schemaInvalid`).

pub mod canonical;
pub mod content;
pub mod controller_ref;
mod error;
pub mod framing;
pub mod generated;
mod message;
pub mod workflow_ref;

pub use canonical::{MAX_DEPTH, canonicalize, canonicalize_typed, is_canonical, parse_canonical};
pub use error::SafeError;
#[cfg(feature = "tokio")]
pub use framing::{CodecError, FrameCodec};
pub use framing::{FrameDecoder, MAX_FRAME_BYTES, frame_content};
pub use generated::dispatch::{
    RequestPayload, ResponseReceipt, parse_request_payload, parse_response_receipt,
};
/// One marker type per client operation (`ops::RunPause`, …), each a
/// [`ClientOperation`] naming its payload and receipt types.
pub use generated::operations as ops;
pub use generated::operations::ClientOperation;
pub use generated::types::{
    ClientMessage, ErrorCode, RunView, RunnerMessage, ServerMessage, WorkerLaunch,
};
pub use message::{
    ClientFrame, decode_client_frame, decode_launch, decode_run_view, decode_runner_frame,
    decode_server_frame, encode_client, encode_launch, encode_runner, encode_server, launch_kind,
    runner_kind, server_kind,
};
