//! The launch envelope (the runner's first stdin line, no newline) and the
//! standalone run-view document.
//!
//! Invariants: no panic; an accepted envelope re-encodes to exactly its
//! bytes and decodes again to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(launch) = protocol::decode_launch(data) {
        let encoded = protocol::encode_launch(&launch).expect("accepted envelopes encode");
        assert_eq!(
            encoded, data,
            "an accepted launch envelope re-encodes to its bytes"
        );
        assert_eq!(protocol::decode_launch(&encoded), Ok(launch));
    }
    if let Ok(view) = protocol::decode_run_view(data) {
        let encoded = protocol::canonicalize_typed(&view).expect("accepted views encode");
        assert_eq!(
            encoded, data,
            "an accepted run view re-encodes to its bytes"
        );
        assert_eq!(protocol::decode_run_view(&encoded), Ok(view));
    }
});
