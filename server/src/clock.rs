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
    let stamp = crate::ids::utc_stamp(ms);
    // utc_stamp is `yyyymmddThhmmssZ`.
    format!(
        "{}-{}-{}T{}:{}:{}.{:03}Z",
        &stamp[0..4],
        &stamp[4..6],
        &stamp[6..8],
        &stamp[9..11],
        &stamp[11..13],
        &stamp[13..15],
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_formats_milliseconds() {
        assert_eq!(super::rfc3339(951_782_400_007), "2000-02-29T00:00:00.007Z");
    }
}
