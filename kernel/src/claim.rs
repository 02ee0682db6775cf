//! Run claims: the time-limited right to change one run, fenced by generation.
//!
//! Invariants:
//! - A claim is acquired only when no claim exists or the previous one has
//!   expired (`expires_at_ms <= now_ms`); every acquisition increases the
//!   generation by exactly one.
//! - A protected write succeeds only when the presented authority matches the
//!   current claim exactly (owner kind, owner id, token hash, generation) and
//!   the claim's expiry is in the future. It renews that exact claim and no
//!   other.
//! - An expired claim never renews itself, even when every identity field
//!   still matches: recovery must acquire a new claim (a new generation).
//! - Rejections carry exactly one `ClaimLostReason`; they never say which
//!   token is current.

use crate::ids::{Digest, Generation, OwnerId};
use serde::{Deserialize, Serialize};

/// Default claim lifetime. The shell may pass another value; tests use short ones.
pub const CLAIM_TTL_MS: u64 = 30_000;
/// Default period of the server's backup renewal timer.
pub const CLAIM_RENEW_INTERVAL_MS: u64 = 10_000;
const _: () = assert!(CLAIM_RENEW_INTERVAL_MS * 2 < CLAIM_TTL_MS);

/// Who holds a claim. `Host` is the retained version-1 owner value for the
/// server acting on behalf of one runner epoch; `Control` is a short claim
/// the server takes to settle an expired row (cancel, deadline, recovery).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OwnerKind {
    /// The server, on behalf of a supervised runner.
    Host,
    /// The server's own control path (stale cancel, timeout, continuation).
    Control,
}

/// The live or expired claim recorded on a run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Claim {
    pub owner_kind: OwnerKind,
    pub owner_id: OwnerId,
    pub token_hash: Digest,
    pub generation: Generation,
    pub acquired_at_ms: u64,
    pub heartbeat_at_ms: u64,
    pub expires_at_ms: u64,
}

impl Claim {
    /// Whether the claim still grants authority at `now_ms`.
    pub const fn is_live(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }
}

/// The durable claim facts of one run (the `leases` row).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeaseFacts {
    /// The current claim, or `None` after a release.
    pub claim: Option<Claim>,
    /// The last generation ever issued for this run (0 before the first claim).
    pub generation: Generation,
}

impl LeaseFacts {
    /// The claim when it is live at `now_ms`.
    pub fn live_claim(&self, now_ms: u64) -> Option<&Claim> {
        self.claim.as_ref().filter(|claim| claim.is_live(now_ms))
    }
}

/// What a writer presents to prove its authority.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Authority {
    pub owner_kind: OwnerKind,
    pub owner_id: OwnerId,
    pub token_hash: Digest,
    pub generation: Generation,
}

impl Authority {
    /// The authority that the holder of `claim` presents.
    pub fn of(claim: &Claim) -> Self {
        Self {
            owner_kind: claim.owner_kind,
            owner_id: claim.owner_id.clone(),
            token_hash: claim.token_hash,
            generation: claim.generation,
        }
    }
}

/// A request to acquire a claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimRequest {
    pub owner_kind: OwnerKind,
    pub owner_id: OwnerId,
    pub token_hash: Digest,
}

/// Why a protected write was refused (`ClaimLostError` in the seed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ClaimLostReason {
    /// No claim exists, or the writer presented none.
    MissingAuthority,
    /// The writer's claim exists but its expiry has passed.
    Expired,
    /// Another owner (kind or id) holds the claim.
    OwnerChanged,
    /// The same owner presented another token.
    TokenChanged,
    /// The claim belongs to another generation.
    GenerationChanged,
}

/// Why a claim could not be acquired.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AcquireRejection {
    /// A live claim exists; it can be taken only after `expires_at_ms`.
    StillHeld { expires_at_ms: u64 },
}

/// Acquires a new claim when none is live. The generation increases by one.
pub fn acquire(
    facts: &LeaseFacts,
    request: ClaimRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<LeaseFacts, AcquireRejection> {
    if let Some(live) = facts.live_claim(now_ms) {
        return Err(AcquireRejection::StillHeld {
            expires_at_ms: live.expires_at_ms,
        });
    }
    let generation = facts.generation.next();
    debug_assert!(generation > facts.generation);
    Ok(LeaseFacts {
        claim: Some(Claim {
            owner_kind: request.owner_kind,
            owner_id: request.owner_id,
            token_hash: request.token_hash,
            generation,
            acquired_at_ms: now_ms,
            heartbeat_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
        }),
        generation,
    })
}

/// Checks the presented authority against the current claim without changing it.
///
/// Identity is compared before expiry: a writer whose claim was replaced learns
/// that the owner, token or generation changed, not merely that time passed.
pub fn check<'facts>(
    facts: &'facts LeaseFacts,
    authority: Option<&Authority>,
    now_ms: u64,
) -> Result<&'facts Claim, ClaimLostReason> {
    let (Some(claim), Some(authority)) = (facts.claim.as_ref(), authority) else {
        return Err(ClaimLostReason::MissingAuthority);
    };
    if claim.owner_kind != authority.owner_kind || claim.owner_id != authority.owner_id {
        return Err(ClaimLostReason::OwnerChanged);
    }
    if claim.token_hash != authority.token_hash {
        return Err(ClaimLostReason::TokenChanged);
    }
    if claim.generation != authority.generation {
        return Err(ClaimLostReason::GenerationChanged);
    }
    if !claim.is_live(now_ms) {
        return Err(ClaimLostReason::Expired);
    }
    Ok(claim)
}

/// The check-and-renew step of every protected write: verifies the exact live
/// claim and renews its heartbeat and expiry. The caller applies its domain
/// change only on `Ok`.
pub fn check_and_renew(
    facts: &LeaseFacts,
    authority: Option<&Authority>,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<LeaseFacts, ClaimLostReason> {
    let claim = check(facts, authority, now_ms)?;
    let mut renewed = claim.clone();
    renewed.heartbeat_at_ms = now_ms;
    renewed.expires_at_ms = renewed.expires_at_ms.max(now_ms.saturating_add(ttl_ms));
    Ok(LeaseFacts {
        claim: Some(renewed),
        generation: facts.generation,
    })
}

/// The server's backup renewal timer. It is the same rule as a protected
/// write: an expired claim is never revived by the timer.
pub fn renew_by_timer(
    facts: &LeaseFacts,
    authority: &Authority,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<LeaseFacts, ClaimLostReason> {
    check_and_renew(facts, Some(authority), now_ms, ttl_ms)
}

/// Releases the exact live claim. The generation is kept so that the next
/// acquisition still increases it.
pub fn release(
    facts: &LeaseFacts,
    authority: &Authority,
    now_ms: u64,
) -> Result<LeaseFacts, ClaimLostReason> {
    check(facts, Some(authority), now_ms)?;
    Ok(LeaseFacts {
        claim: None,
        generation: facts.generation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TTL: u64 = 100;

    fn request(owner: &str, token: u8) -> ClaimRequest {
        ClaimRequest {
            owner_kind: OwnerKind::Host,
            owner_id: OwnerId::from(owner),
            token_hash: Digest::repeat(token),
        }
    }

    fn held(owner: &str, token: u8, now_ms: u64) -> (LeaseFacts, Authority) {
        let facts = acquire(&LeaseFacts::default(), request(owner, token), now_ms, TTL).unwrap();
        let authority = Authority::of(facts.claim.as_ref().unwrap());
        (facts, authority)
    }

    #[test]
    fn acquire_on_empty_row_takes_generation_one() {
        let (facts, authority) = held("a", 1, 10);
        assert_eq!(facts.generation, Generation(1));
        assert_eq!(authority.generation, Generation(1));
        let claim = facts.claim.unwrap();
        assert_eq!(
            (
                claim.acquired_at_ms,
                claim.heartbeat_at_ms,
                claim.expires_at_ms
            ),
            (10, 10, 110)
        );
    }

    #[test]
    fn acquire_while_live_is_refused_with_the_expiry() {
        let (facts, _) = held("a", 1, 0);
        assert_eq!(
            acquire(&facts, request("b", 2), 99, TTL),
            Err(AcquireRejection::StillHeld { expires_at_ms: 100 })
        );
        // Even the same owner cannot take a second generation of a live claim.
        assert!(acquire(&facts, request("a", 1), 50, TTL).is_err());
    }

    #[test]
    fn acquire_after_expiry_increments_generation() {
        let (facts, _) = held("a", 1, 0);
        let next = acquire(&facts, request("b", 2), 100, TTL).unwrap();
        assert_eq!(next.generation, Generation(2));
        assert_eq!(next.claim.unwrap().owner_id, OwnerId::from("b"));
    }

    #[test]
    fn acquire_after_release_increments_generation() {
        let (facts, authority) = held("a", 1, 0);
        let released = release(&facts, &authority, 5).unwrap();
        assert_eq!(released.claim, None);
        assert_eq!(released.generation, Generation(1));
        let next = acquire(&released, request("a", 3), 6, TTL).unwrap();
        assert_eq!(next.generation, Generation(2));
    }

    #[test]
    fn check_and_renew_extends_the_exact_claim() {
        let (facts, authority) = held("a", 1, 0);
        let renewed = check_and_renew(&facts, Some(&authority), 60, TTL).unwrap();
        let claim = renewed.claim.unwrap();
        assert_eq!(claim.heartbeat_at_ms, 60);
        assert_eq!(claim.expires_at_ms, 160);
        assert_eq!(claim.generation, Generation(1));
        assert_eq!(claim.acquired_at_ms, 0);
    }

    #[test]
    fn renewal_never_shortens_a_claim() {
        let (facts, authority) = held("a", 1, 0);
        let renewed = check_and_renew(&facts, Some(&authority), 10, 5).unwrap();
        assert_eq!(renewed.claim.unwrap().expires_at_ms, 100);
    }

    #[test]
    fn missing_claim_or_missing_authority_is_missing_authority() {
        let (facts, authority) = held("a", 1, 0);
        assert_eq!(
            check(&LeaseFacts::default(), Some(&authority), 1),
            Err(ClaimLostReason::MissingAuthority)
        );
        assert_eq!(
            check(&facts, None, 1),
            Err(ClaimLostReason::MissingAuthority)
        );
        let released = release(&facts, &authority, 1).unwrap();
        assert_eq!(
            check_and_renew(&released, Some(&authority), 2, TTL),
            Err(ClaimLostReason::MissingAuthority)
        );
    }

    #[test]
    fn each_identity_field_has_its_own_reason() {
        let (facts, authority) = held("a", 1, 0);
        let mut other_owner = authority.clone();
        other_owner.owner_id = OwnerId::from("b");
        assert_eq!(
            check(&facts, Some(&other_owner), 1),
            Err(ClaimLostReason::OwnerChanged)
        );
        let mut other_kind = authority.clone();
        other_kind.owner_kind = OwnerKind::Control;
        assert_eq!(
            check(&facts, Some(&other_kind), 1),
            Err(ClaimLostReason::OwnerChanged)
        );
        let mut other_token = authority.clone();
        other_token.token_hash = Digest::repeat(9);
        assert_eq!(
            check(&facts, Some(&other_token), 1),
            Err(ClaimLostReason::TokenChanged)
        );
        let mut other_generation = authority.clone();
        other_generation.generation = Generation(7);
        assert_eq!(
            check(&facts, Some(&other_generation), 1),
            Err(ClaimLostReason::GenerationChanged)
        );
    }

    #[test]
    fn an_expired_claim_never_renews_itself() {
        let (facts, authority) = held("a", 1, 0);
        assert_eq!(
            check_and_renew(&facts, Some(&authority), 100, TTL),
            Err(ClaimLostReason::Expired)
        );
        assert_eq!(
            renew_by_timer(&facts, &authority, 150, TTL),
            Err(ClaimLostReason::Expired)
        );
        assert_eq!(
            release(&facts, &authority, 100),
            Err(ClaimLostReason::Expired)
        );
    }

    #[test]
    fn a_replaced_claim_reports_the_change_not_the_expiry() {
        let (facts, old) = held("a", 1, 0);
        let replaced = acquire(&facts, request("a", 1), 100, TTL).unwrap();
        assert_eq!(
            check(&replaced, Some(&old), 101),
            Err(ClaimLostReason::GenerationChanged)
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Acquire { owner: u8 },
        Write { owner: u8 },
        Release { owner: u8 },
        Timer { owner: u8 },
        Advance { ms: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3).prop_map(|owner| Op::Acquire { owner }),
            (0u8..3).prop_map(|owner| Op::Write { owner }),
            (0u8..3).prop_map(|owner| Op::Release { owner }),
            (0u8..3).prop_map(|owner| Op::Timer { owner }),
            (0u64..80).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    proptest! {
        /// Random interleavings of claim operations by three owners that each
        /// remember the authority they last acquired (and may be stale): a write
        /// is accepted only when the writer's authority is the live claim.
        #[test]
        fn no_stale_write_is_ever_accepted(ops in proptest::collection::vec(op(), 1..60)) {
            let mut facts = LeaseFacts::default();
            let mut beliefs: [Option<Authority>; 3] = [None, None, None];
            let mut now_ms = 0u64;
            let mut last_generation = Generation(0);
            for op in ops {
                match op {
                    Op::Advance { ms } => now_ms += ms,
                    Op::Acquire { owner } => {
                        let req = request(["a", "b", "c"][owner as usize], owner);
                        if let Ok(next) = acquire(&facts, req, now_ms, TTL) {
                            prop_assert_eq!(next.generation, facts.generation.next());
                            beliefs[owner as usize] = next.claim.as_ref().map(Authority::of);
                            facts = next;
                        }
                    }
                    Op::Write { owner } | Op::Timer { owner } => {
                        let belief = beliefs[owner as usize].clone();
                        let live = facts.live_claim(now_ms).cloned();
                        match check_and_renew(&facts, belief.as_ref(), now_ms, TTL) {
                            Ok(next) => {
                                let live = live.expect("an accepted write needs a live claim");
                                prop_assert_eq!(Some(Authority::of(&live)), belief);
                                prop_assert!(next.claim.as_ref().unwrap().expires_at_ms > now_ms);
                                facts = next;
                            }
                            Err(_) => {
                                let exact = live.map(|c| Some(Authority::of(&c)) == belief);
                                prop_assert_ne!(exact, Some(true));
                            }
                        }
                    }
                    Op::Release { owner } => {
                        if let Some(authority) = beliefs[owner as usize].clone()
                            && let Ok(next) = release(&facts, &authority, now_ms)
                        {
                            facts = next;
                        }
                    }
                }
                prop_assert!(facts.generation >= last_generation);
                last_generation = facts.generation;
                if let Some(claim) = &facts.claim {
                    prop_assert_eq!(claim.generation, facts.generation);
                }
            }
        }
    }
}
