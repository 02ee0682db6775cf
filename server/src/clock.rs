//! The shell's one clock read. The kernel never reads time; handlers call
//! `now_ms()` once and pass the value in.

use std::time::{SystemTime, UNIX_EPOCH};

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
