//! Identifiers, counters and digests shared by every kernel module.
//!
//! Invariants:
//! - Identifiers are opaque: the kernel compares them, never parses or
//!   generates them. The shell creates ids (random or derived) and passes
//!   them in, so every transition is deterministic.
//! - Counters (`Generation`, `Revision`, `ServerEpoch`, `CoordinatorEpoch`)
//!   only grow. They are capped at `MAX_SAFE_INTEGER` so that every value
//!   survives a round trip through JavaScript.
//! - A `Digest` is a SHA-256 computed by the shell before it opens a write
//!   transaction; the kernel only compares digests.

use alloc::string::String;
use core::fmt;
use serde::{Deserialize, Serialize};

/// The largest integer JavaScript represents exactly (2^53 − 1).
pub const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// Wraps an identifier produced by the shell.
            pub fn new(value: impl Into<String>) -> Self {
                Self(value.into())
            }

            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(String::from(value))
            }
        }
    };
}

string_id!(
    /// One workflow run.
    RunId
);
string_id!(
    /// One execution of one node (a fresh id per node visit and per retry).
    AttemptId
);
string_id!(
    /// A qualified node id in a compiled topology (`mount/local` for included nodes).
    NodeId
);
string_id!(
    /// The owner of a claim within its owner kind (a runner epoch, a control task).
    OwnerId
);
string_id!(
    /// One runner process lifetime within one generation.
    RunnerEpochId
);
string_id!(
    /// A Pi session (the origin session of an interactive run).
    SessionId
);
string_id!(
    /// One durable interactive request (agent step, decision) in an origin session.
    InteractionId
);
string_id!(
    /// One submission to an interactive request.
    SubmissionId
);
string_id!(
    /// One workflow message addressed to an origin session.
    MessageId
);
string_id!(
    /// One Pi model turn reported by the extension.
    TurnId
);
string_id!(
    /// A Pi session entry id (evidence that a message is on the active branch).
    EntryId
);
string_id!(
    /// One turn intent: the one successor model turn a workflow event owes its
    /// origin session (`deferred-turn:<sha256>`, derived by `intent::ids`).
    TurnIntentId
);
string_id!(
    /// The source event of a turn intent (`turn-source:<sha256>`, derived by
    /// `intent::ids`): one eligible event, at most one intent.
    TurnSourceId
);
string_id!(
    /// One managed effect (derived by the shell from its engine-made key).
    EffectId
);
string_id!(
    /// A protected human decision.
    DecisionId
);
string_id!(
    /// A connected client process.
    ClientId
);
string_id!(
    /// One client connection (process-local to the server).
    ConnectionId
);
string_id!(
    /// One transport attempt of a client request. Never part of a fingerprint.
    RequestId
);
string_id!(
    /// A client-chosen key that names one durable command across retries.
    IdempotencyKey
);

macro_rules! counter {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub u64);

        impl $name {
            /// The next value. Saturates at `MAX_SAFE_INTEGER` instead of wrapping, so a
            /// counter can never go backwards.
            #[must_use]
            pub const fn next(self) -> Self {
                if self.0 >= MAX_SAFE_INTEGER { Self(MAX_SAFE_INTEGER) } else { Self(self.0 + 1) }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

counter!(
    /// Increases each time a new owner claims a run; fences older owners.
    Generation
);
counter!(
    /// Increases with every committed change to one resource (a run).
    Revision
);
counter!(
    /// Increases each time a server process takes over the database.
    ServerEpoch
);
counter!(
    /// Increases each time a client connection becomes the coordinator of an origin session.
    CoordinatorEpoch
);

/// A SHA-256 digest computed by the shell.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// A digest whose every byte is `byte`; convenient for tests and models.
    pub const fn repeat(byte: u8) -> Self {
        Self([byte; 32])
    }
}

impl fmt::Debug for Digest {
    /// Prints only a short prefix: digests of tokens must never reach logs in full.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({:02x}{:02x}…)", self.0[0], self.0[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_grow_and_saturate_at_the_javascript_limit() {
        assert_eq!(Generation(4).next(), Generation(5));
        assert_eq!(
            Revision(MAX_SAFE_INTEGER).next(),
            Revision(MAX_SAFE_INTEGER)
        );
        assert_eq!(
            ServerEpoch(MAX_SAFE_INTEGER - 1).next(),
            ServerEpoch(MAX_SAFE_INTEGER)
        );
    }

    #[test]
    fn digest_debug_never_prints_the_whole_value() {
        let text = alloc::format!("{:?}", Digest::repeat(0xab));
        assert_eq!(text, "Digest(abab…)");
    }
}
