//! The client channel: a byte stream through `FrameDecoder`, each frame
//! through `decode_client_frame` (framing, depth, canonical form, envelope,
//! operation → payload/receipt correlation).
//!
//! Invariants: no panic; an accepted frame re-encodes to exactly its bytes
//! and decodes again to the same value; the streaming decoder and the
//! one-frame check (`frame_content`) agree on every frame; after an error
//! the stream decoder yields only that error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pi_workflows_fuzz::for_each_frame;

fuzz_target!(|data: &[u8]| {
    for_each_frame(data, |frame| {
        if let Ok(decoded) = protocol::decode_client_frame(frame) {
            let encoded =
                protocol::encode_client(&decoded.message).expect("accepted frames encode");
            assert_eq!(
                encoded, frame,
                "an accepted client frame re-encodes to its bytes"
            );
            assert_eq!(
                protocol::decode_client_frame(&encoded).as_ref(),
                Ok(&decoded),
                "the re-encoded frame decodes to the same value"
            );
        }
    });
});
