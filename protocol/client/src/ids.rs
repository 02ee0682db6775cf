//! Identifiers of a client: fresh random client ids, connection nonces and
//! idempotency keys (from the operating system's random source), and the
//! actor id a person answering a decision from this machine is recorded
//! under.

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

/// Who answers a protected decision from a terminal client (the CLI's
/// `pi-workflows answer`, piw's answer dialog): the local user (`USER`,
/// else `LOGNAME`; the client runs as a user of its machine), else
/// `local-user`; at most 256 characters (the protocol's `ActorId`).
pub fn local_actor() -> String {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|user| !user.is_empty()))
        .map_or_else(
            || "local-user".to_owned(),
            |user| user.chars().take(256).collect(),
        )
}
