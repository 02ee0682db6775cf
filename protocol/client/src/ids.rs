//! Fresh random identifiers of a client: client ids, connection nonces and
//! idempotency keys (from the operating system's random source).

/// A random lowercase hex string of `2 * N` characters.
pub(crate) fn random_hex<const N: usize>() -> String {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).expect("the operating system random source is available");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A fresh idempotency key for one logical command.
pub fn idempotency_key() -> String {
    format!("k-{}", random_hex::<12>())
}

/// A fresh client id with `prefix` (`cli-…`, `piw-…`).
pub fn client_id(prefix: &str) -> String {
    format!("{prefix}-{}", random_hex::<8>())
}
