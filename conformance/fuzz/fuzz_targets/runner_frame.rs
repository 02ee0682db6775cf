//! The runner channel, both directions: each frame of the byte stream
//! through `decode_runner_frame` and `decode_server_frame`.
//!
//! Invariants: no panic; an accepted frame re-encodes to exactly its bytes
//! and decodes again to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pi_workflows_fuzz::for_each_frame;

fuzz_target!(|data: &[u8]| {
    for_each_frame(data, |frame| {
        if let Ok(message) = protocol::decode_runner_frame(frame) {
            let encoded = protocol::encode_runner(&message).expect("accepted frames encode");
            assert_eq!(
                encoded, frame,
                "an accepted runner frame re-encodes to its bytes"
            );
            assert_eq!(protocol::decode_runner_frame(&encoded), Ok(message));
        }
        if let Ok(message) = protocol::decode_server_frame(frame) {
            let encoded = protocol::encode_server(&message).expect("accepted frames encode");
            assert_eq!(
                encoded, frame,
                "an accepted server frame re-encodes to its bytes"
            );
            assert_eq!(protocol::decode_server_frame(&encoded), Ok(message));
        }
    });
});
