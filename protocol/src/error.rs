//! The one safe error of the protocol layer.
//!
//! A [`SafeError`] is a closed [`ErrorCode`] plus a `&'static str` message
//! chosen by this crate. It never carries text derived from the frame (no
//! serde messages, field names, values or offsets), so it can be logged and
//! sent to the peer as-is.

use crate::generated::types::{self, ErrorCode};

/// A closed error code and a static, bounded message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SafeError {
    code: ErrorCode,
    message: &'static str,
}

impl SafeError {
    /// A new error. `message` is a literal chosen by the caller, at most 512
    /// characters, and never contains payload contents.
    pub const fn new(code: ErrorCode, message: &'static str) -> Self {
        Self { code, message }
    }

    /// The closed code.
    pub const fn code(&self) -> ErrorCode {
        self.code
    }

    /// The static message.
    pub const fn message(&self) -> &'static str {
        self.message
    }

    /// The wire form (`{"code":…,"message":…}`) for a response or reply.
    pub fn to_wire(&self) -> types::SafeError {
        types::SafeError {
            code: self.code,
            // Every message of this crate is a short literal; fall back to an
            // empty message rather than fail if one ever exceeded the bound.
            message: types::SafeMessage::try_from(self.message)
                .or_else(|_| types::SafeMessage::try_from(""))
                .unwrap_or_else(|_| unreachable!("the empty message is valid")),
        }
    }
}

impl std::fmt::Display for SafeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for SafeError {}

pub(crate) const TOO_LARGE: SafeError = SafeError::new(
    ErrorCode::FrameTooLarge,
    "frame exceeds 1 MiB including its newline",
);
pub(crate) const UNTERMINATED: SafeError = SafeError::new(
    ErrorCode::MalformedFrame,
    "frame does not end with a newline",
);
pub(crate) const CARRIAGE_RETURN: SafeError = SafeError::new(
    ErrorCode::MalformedFrame,
    "frame contains a carriage return",
);
pub(crate) const EMBEDDED_NEWLINE: SafeError = SafeError::new(
    ErrorCode::MalformedFrame,
    "frame contains more than one line",
);
pub(crate) const TOO_DEEP: SafeError = SafeError::new(
    ErrorCode::NestingTooDeep,
    "frame nests deeper than 64 levels",
);
pub(crate) const NON_CANONICAL: SafeError = SafeError::new(
    ErrorCode::NonCanonical,
    "frame is not canonical JSON (RFC 8785)",
);
pub(crate) const SCHEMA_INVALID: SafeError = SafeError::new(
    ErrorCode::SchemaInvalid,
    "frame does not match the protocol schema",
);
pub(crate) const NOT_ENCODABLE: SafeError = SafeError::new(
    ErrorCode::Internal,
    "value cannot be encoded as canonical JSON",
);
