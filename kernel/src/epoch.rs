//! The server epoch: which server process may accept commands.
//!
//! Invariants:
//! - A server takes the epoch only while it holds the global server lock
//!   (an exclusive `flock` the operating system releases when its holder
//!   exits, however it exits). Holding it proves that every process that
//!   held the epoch before has exited, so a lease such a process left
//!   behind is void: taking the epoch never waits for it to run out, and
//!   increases the epoch by exactly one.
//! - At most one epoch accepts commands at any instant: only the lock
//!   holder takes an epoch, and an older epoch (or another owner) is
//!   refused by `check`, `renew` and `release` as `Stale`.
//! - The lease records when the holder last renewed (its expiry is a
//!   liveness record for diagnosis): a holder whose renewals could not be
//!   stored (a full disk) renews once it can, because no other server can
//!   have taken the epoch while it held the lock; a `Stale` renewal means
//!   the lock was bypassed and the server must stop.
//! - Messages stamped with an older epoch are rejected; a newer epoch than
//!   the current one cannot exist.
//! - A clean stop releases the lease; the epoch number stays.

use crate::ids::{OwnerId, ServerEpoch};
use serde::{Deserialize, Serialize};

/// Default lifetime of the server lease (renewed by the server's timer).
pub const SERVER_LEASE_TTL_MS: u64 = 15_000;
/// Default renewal period of the server lease.
pub const SERVER_LEASE_RENEW_INTERVAL_MS: u64 = 3_000;
const _: () = assert!(SERVER_LEASE_RENEW_INTERVAL_MS * 3 < SERVER_LEASE_TTL_MS);

/// The one `workflow_host_state` row.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostFacts {
    /// The last epoch taken (0 for a new database).
    pub epoch: ServerEpoch,
    /// The server process that holds `epoch`, or `None` after a clean stop.
    pub owner_id: Option<OwnerId>,
    /// When the holder's lease ends unless renewed.
    pub lease_expires_at_ms: u64,
}

/// The shell's proof that no earlier holder of the epoch is alive: the
/// starting server holds the global server lock. Only a lock holder may
/// construct it (the shell does so right after acquiring the lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServerLockHeld;

/// Why an epoch operation was refused.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EpochRejection {
    /// The presented epoch is older than the current one (or its owner
    /// changed): another server took the epoch, and this one must stop.
    Stale { current: ServerEpoch },
}

/// A starting server that holds the global lock takes the next epoch, at
/// once: the lock proves that the previous holder exited, whether it
/// released its lease (a clean stop) or crashed with it still live.
pub fn take(
    facts: &HostFacts,
    owner_id: OwnerId,
    now_ms: u64,
    ttl_ms: u64,
    _lock: ServerLockHeld,
) -> HostFacts {
    HostFacts {
        epoch: facts.epoch.next(),
        owner_id: Some(owner_id),
        lease_expires_at_ms: now_ms.saturating_add(ttl_ms),
    }
}

/// Verifies that `epoch` held by `owner_id` is the current epoch.
pub fn check(
    facts: &HostFacts,
    epoch: ServerEpoch,
    owner_id: &OwnerId,
) -> Result<(), EpochRejection> {
    if epoch != facts.epoch || facts.owner_id.as_ref() != Some(owner_id) {
        return Err(EpochRejection::Stale {
            current: facts.epoch,
        });
    }
    Ok(())
}

/// Renews the lease of the current epoch, also one that lapsed while its
/// renewals could not be stored: its holder still holds the lock, so no
/// other server took the epoch (a takeover would have made it `Stale`).
pub fn renew(
    facts: &HostFacts,
    epoch: ServerEpoch,
    owner_id: &OwnerId,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<HostFacts, EpochRejection> {
    check(facts, epoch, owner_id)?;
    let mut next = facts.clone();
    next.lease_expires_at_ms = facts.lease_expires_at_ms.max(now_ms.saturating_add(ttl_ms));
    Ok(next)
}

/// A clean stop gives up the lease; the epoch number stays so the next server
/// still moves forward.
pub fn release(
    facts: &HostFacts,
    epoch: ServerEpoch,
    owner_id: &OwnerId,
    now_ms: u64,
) -> Result<HostFacts, EpochRejection> {
    check(facts, epoch, owner_id)?;
    Ok(HostFacts {
        epoch: facts.epoch,
        owner_id: None,
        lease_expires_at_ms: now_ms,
    })
}

/// The last instant the holder of `facts` is known to have been alive, as a
/// starting server reads it before it takes the epoch: the release time
/// after a clean stop, otherwise its last renewal (the lease expiry minus
/// its lifetime `ttl_ms`). Work that counts only while the server runs
/// (turn clocks) stops there.
pub const fn last_alive_ms(facts: &HostFacts, ttl_ms: u64) -> u64 {
    match facts.owner_id {
        None => facts.lease_expires_at_ms,
        Some(_) => facts.lease_expires_at_ms.saturating_sub(ttl_ms),
    }
}

/// Accepts a message stamped with `message_epoch` only if it is the current epoch.
pub fn accept_message(
    current: ServerEpoch,
    message_epoch: ServerEpoch,
) -> Result<(), EpochRejection> {
    if message_epoch == current {
        Ok(())
    } else {
        Err(EpochRejection::Stale { current })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TTL: u64 = 50;

    fn owner(name: &str) -> OwnerId {
        OwnerId::from(name)
    }

    fn take_at(facts: &HostFacts, name: &str, now_ms: u64) -> HostFacts {
        take(facts, owner(name), now_ms, TTL, ServerLockHeld)
    }

    #[test]
    fn the_last_sign_of_life_is_the_release_or_the_last_renewal() {
        let taken = take_at(&HostFacts::default(), "s1", 0);
        let renewed = renew(&taken, ServerEpoch(1), &owner("s1"), 30, TTL).unwrap();
        assert_eq!(
            last_alive_ms(&renewed, TTL),
            30,
            "crashed after renewing at 30"
        );
        let released = release(&renewed, ServerEpoch(1), &owner("s1"), 42).unwrap();
        assert_eq!(last_alive_ms(&released, TTL), 42, "stopped cleanly at 42");
        assert_eq!(last_alive_ms(&HostFacts::default(), TTL), 0);
    }

    #[test]
    fn first_server_takes_epoch_one() {
        let facts = take_at(&HostFacts::default(), "s1", 0);
        assert_eq!(facts.epoch, ServerEpoch(1));
        assert_eq!(facts.lease_expires_at_ms, 50);
        assert!(check(&facts, ServerEpoch(1), &owner("s1")).is_ok());
    }

    /// The previous server crashed with its lease live: the next one (which
    /// holds the lock, so the previous one is gone) takes the epoch at once.
    #[test]
    fn a_crashed_servers_live_lease_does_not_delay_the_next_server() {
        let crashed = take_at(&HostFacts::default(), "s1", 0);
        let next = take_at(&crashed, "s2", 1);
        assert_eq!(next.epoch, ServerEpoch(2));
        assert_eq!(next.owner_id, Some(owner("s2")));
        assert_eq!(next.lease_expires_at_ms, 51);
    }

    #[test]
    fn the_old_server_is_fenced_after_takeover() {
        let first = take_at(&HostFacts::default(), "s1", 0);
        let second = take_at(&first, "s2", 10);
        assert_eq!(
            check(&second, ServerEpoch(1), &owner("s1")),
            Err(EpochRejection::Stale {
                current: ServerEpoch(2)
            })
        );
        assert!(renew(&second, ServerEpoch(1), &owner("s1"), 11, TTL).is_err());
        assert!(release(&second, ServerEpoch(1), &owner("s1"), 11).is_err());
    }

    /// A holder whose renewals could not be stored for longer than its lease
    /// (a full disk) renews once it can: nobody else took the epoch.
    #[test]
    fn a_lapsed_lease_of_the_current_holder_is_renewed() {
        let facts = take_at(&HostFacts::default(), "s1", 0);
        let renewed = renew(&facts, ServerEpoch(1), &owner("s1"), 500, TTL).unwrap();
        assert_eq!(renewed.epoch, ServerEpoch(1));
        assert_eq!(renewed.lease_expires_at_ms, 550);
        let early = renew(&facts, ServerEpoch(1), &owner("s1"), 30, TTL).unwrap();
        assert_eq!(early.lease_expires_at_ms, 80);
    }

    #[test]
    fn release_keeps_the_epoch_and_the_next_server_moves_forward() {
        let facts = take_at(&HostFacts::default(), "s1", 0);
        let released = release(&facts, ServerEpoch(1), &owner("s1"), 10).unwrap();
        assert_eq!(released.owner_id, None);
        assert_eq!(released.epoch, ServerEpoch(1));
        let next = take_at(&released, "s2", 11);
        assert_eq!(next.epoch, ServerEpoch(2));
    }

    #[test]
    fn messages_from_an_older_epoch_are_rejected() {
        assert!(accept_message(ServerEpoch(3), ServerEpoch(3)).is_ok());
        assert_eq!(
            accept_message(ServerEpoch(3), ServerEpoch(2)),
            Err(EpochRejection::Stale {
                current: ServerEpoch(3)
            })
        );
    }

    proptest! {
        /// Servers that take the epoch only while they hold the lock (at
        /// most one process at a time), renew, release and crash: the epoch
        /// never goes back, and at most one server passes `check` at any
        /// instant.
        #[test]
        fn at_most_one_epoch_accepts_commands(
            ops in proptest::collection::vec((0u8..5, 0u8..3, 0u64..40), 1..60)
        ) {
            let mut facts = HostFacts::default();
            // The epoch each server process holds in memory (`None`: not running).
            let mut held: [Option<ServerEpoch>; 3] = [None; 3];
            let mut now_ms = 0;
            for (kind, server, advance) in ops {
                now_ms += advance;
                let index = server as usize;
                let id = owner(["s0", "s1", "s2"][index]);
                let before = facts.epoch;
                let lock_free = held.iter().all(Option::is_none);
                match kind {
                    0 if lock_free => {
                        facts = take(&facts, id, now_ms, TTL, ServerLockHeld);
                        held[index] = Some(facts.epoch);
                    }
                    1 => if let Some(epoch) = held[index] {
                        match renew(&facts, epoch, &id, now_ms, TTL) {
                            Ok(next) => facts = next,
                            Err(EpochRejection::Stale { .. }) => held[index] = None,
                        }
                    },
                    2 => if let Some(epoch) = held[index] {
                        if let Ok(next) = release(&facts, epoch, &id, now_ms) {
                            facts = next;
                        }
                        held[index] = None;
                    },
                    // A crash: the process and its lock are gone, the facts stay.
                    3 => held[index] = None,
                    _ => {}
                }
                prop_assert!(facts.epoch >= before);
                let accepting = (0..3).filter(|i| held[*i].is_some_and(|epoch| {
                    check(&facts, epoch, &owner(["s0", "s1", "s2"][*i])).is_ok()
                })).count();
                prop_assert!(accepting <= 1);
                prop_assert!(held.iter().filter(|epoch| epoch.is_some()).count() <= 1);
            }
        }
    }
}
