//! Canonical JSON (RFC 8785, JCS) and the "canonical on the wire" rule.
//!
//! Canonicalization is `serde_json_canonicalizer` (ECMAScript number
//! formatting, object keys sorted by UTF-16 code units, minimal escapes).
//! A text is canonical when `canonicalize(parse(text)) == text`; that single
//! comparison rejects duplicate keys, `1.0`, `1e2`, `-0`, integers that a
//! double cannot hold exactly, needless escapes, whitespace, a byte-order
//! mark, unsorted keys, and (through the parser) lone surrogates and invalid
//! UTF-8.

use serde::Serialize;
use serde_json::Value;

use crate::error::{NON_CANONICAL, NOT_ENCODABLE, SafeError, TOO_DEEP};

/// The deepest allowed nesting of arrays and objects (the top-level object
/// is depth 1).
pub const MAX_DEPTH: usize = 64;

/// The canonical bytes of a JSON value.
pub fn canonicalize(value: &Value) -> Result<Vec<u8>, SafeError> {
    serde_json_canonicalizer::to_vec(value).map_err(|_| NOT_ENCODABLE)
}

/// The canonical bytes of any serializable value (for example a generated
/// message type).
pub fn canonicalize_typed<T: Serialize>(value: &T) -> Result<Vec<u8>, SafeError> {
    serde_json_canonicalizer::to_vec(value).map_err(|_| NOT_ENCODABLE)
}

/// Whether `bytes` is exactly the canonical form of the JSON it encodes.
pub fn is_canonical(bytes: &[u8]) -> bool {
    parse_canonical(bytes).is_ok()
}

/// Parses `bytes`, requiring them to be within the nesting limit and exactly
/// canonical.
pub fn parse_canonical(bytes: &[u8]) -> Result<Value, SafeError> {
    check_depth(bytes)?;
    let value: Value = serde_json::from_slice(bytes).map_err(|_| NON_CANONICAL)?;
    if canonicalize(&value)? != bytes {
        return Err(NON_CANONICAL);
    }
    Ok(value)
}

/// Rejects text whose arrays and objects nest deeper than [`MAX_DEPTH`].
///
/// A byte scan that skips string contents, so it runs before (and protects)
/// the parser; malformed text that stays within the limit is left to the
/// parser.
pub fn check_depth(bytes: &[u8]) -> Result<(), SafeError> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(TOO_DEEP);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}
