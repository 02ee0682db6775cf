//! The shell's one clock read. The kernel never reads time; handlers call
//! `now_ms()` once and pass the value in.
//!
//! A server reads its transaction time through its [`Clock`]
//! (`Context::clock`): the system clock, or a simulated one that only its
//! owner moves (the deterministic simulation of `crate::simulation`).
//! Invariant: a handler's job reads the time once, inside the job, from
//! its server's clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where a server reads the time.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// The system clock ([`now_ms`]).
    #[default]
    System,
    /// A clock that stands still until its owner sets it (milliseconds
    /// since the Unix epoch).
    Simulated(Arc<AtomicU64>),
}

impl Clock {
    /// Milliseconds since the Unix epoch, by this clock.
    pub fn now_ms(&self) -> u64 {
        match self {
            Self::System => now_ms(),
            Self::Simulated(at) => at.load(Ordering::SeqCst),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// RFC 3339 UTC text with milliseconds (`2026-11-30T09:37:38.123Z`).
pub fn rfc3339(ms: u64) -> String {
    kernel::attempt::rfc3339(ms)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_formats_milliseconds() {
        assert_eq!(super::rfc3339(951_782_400_007), "2000-02-29T00:00:00.007Z");
    }
}
