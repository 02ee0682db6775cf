//! Fresh identifiers and secrets. The kernel never makes ids; the shell
//! creates them here (from the OS random source) and passes them in.

use kernel::ids::Digest;
use sha2::{Digest as _, Sha256};

/// `n` random bytes from the operating system.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system random source is available");
    bytes
}

/// A random lowercase hex string of `2 * N` characters.
pub fn random_hex<const N: usize>() -> String {
    hex::encode(random_bytes::<N>())
}

/// A UUID-shaped random id (version 4 layout), used for attempts.
pub fn uuid() -> String {
    let mut bytes = random_bytes::<16>();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// A run id `<UTC yyyymmddThhmmssZ>-<slug ≤ 40 [a-z0-9-]>-<8 hex>` that sorts chronologically.
pub fn run_id(workflow_name: &str, now_ms: u64) -> String {
    let slug: String = workflow_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_matches('-')
        .chars()
        .take(40)
        .collect();
    let slug = if slug.is_empty() {
        "run".to_owned()
    } else {
        slug
    };
    format!("{}-{slug}-{}", utc_stamp(now_ms), random_hex::<4>())
}

/// `yyyymmddThhmmssZ` for a Unix time in milliseconds (the compact form of
/// `kernel::attempt::rfc3339`, `yyyy-mm-ddThh:mm:ss.mmmZ`).
pub fn utc_stamp(now_ms: u64) -> String {
    let full = kernel::attempt::rfc3339(now_ms);
    let (date_time, _millis) = full.split_once('.').unwrap_or((&full, ""));
    let mut stamp: String = date_time
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    stamp.push('Z');
    stamp
}

/// SHA-256 of `bytes` as a kernel digest.
pub fn sha256(bytes: &[u8]) -> Digest {
    Digest(Sha256::digest(bytes).into())
}

/// `sha256:<hex>` text form of a digest.
pub fn digest_text(digest: &Digest) -> String {
    format!("sha256:{}", hex::encode(digest.0))
}

/// Parses `sha256:<64 hex>`.
pub(crate) fn parse_digest(text: Option<&str>) -> Option<kernel::ids::Digest> {
    let hex = text?.strip_prefix("sha256:")?;
    let bytes = hex::decode(hex).ok()?;
    Some(kernel::ids::Digest(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_sort_by_time_and_carry_a_safe_slug() {
        let id = run_id("My Flow!", 1_764_494_171_000);
        assert!(id.starts_with("20251130T091611Z-my-flow-"), "{id}");
        assert_eq!(id.len(), "20251130T091611Z-my-flow-".len() + 8);
        assert!(run_id("a", 1_000) < run_id("a", 2_000));
    }

    #[test]
    fn utc_stamp_handles_leap_years() {
        assert_eq!(utc_stamp(951_782_400_000), "20000229T000000Z");
        assert_eq!(utc_stamp(0), "19700101T000000Z");
    }

    #[test]
    fn uuids_have_the_version_four_layout_and_differ() {
        let a = uuid();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_ne!(a, uuid());
    }

    #[test]
    fn sha256_matches_the_known_vector() {
        assert_eq!(
            digest_text(&sha256(b"abc")),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
