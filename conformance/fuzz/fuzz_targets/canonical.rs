//! Canonical JSON (RFC 8785) and the nesting limit.
//!
//! Invariants: `is_canonical` and `parse_canonical` agree; whatever is
//! accepted re-encodes to the same bytes; `canonicalize` of any parsed
//! value is itself canonical (idempotent); text nesting deeper than
//! `MAX_DEPTH` is rejected with `nestingTooDeep` and never reaches the
//! parser; the depth scan is exact on accepted text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pi_workflows_fuzz::value_depth;
use protocol::{ErrorCode, MAX_DEPTH};

fuzz_target!(|data: &[u8]| {
    let parsed = protocol::parse_canonical(data);
    assert_eq!(protocol::is_canonical(data), parsed.is_ok());
    match &parsed {
        Ok(value) => {
            let encoded = protocol::canonicalize(value).expect("a parsed value encodes");
            assert_eq!(encoded, data, "accepted text is its own canonical form");
            assert!(
                value_depth(value) <= MAX_DEPTH,
                "accepted text is within the depth limit"
            );
        }
        Err(e) if e.code() == ErrorCode::NestingTooDeep => {
            assert!(protocol::canonical::check_depth(data).is_err());
        }
        Err(e) => assert_eq!(e.code(), ErrorCode::NonCanonical, "the only other verdict"),
    }
    // Any JSON the lenient parser reads canonicalizes to text that is
    // accepted and reads back to the same value (within the depth limit).
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(encoded) = protocol::canonicalize(&value) {
            match protocol::parse_canonical(&encoded) {
                Ok(again) => {
                    assert_eq!(protocol::canonicalize(&again).as_deref(), Ok(&encoded[..]));
                    assert!(value_depth(&value) <= MAX_DEPTH);
                }
                Err(e) => {
                    assert_eq!(
                        e.code(),
                        ErrorCode::NestingTooDeep,
                        "canonical output is canonical"
                    );
                    assert!(value_depth(&value) > MAX_DEPTH);
                }
            }
        }
    }
});
