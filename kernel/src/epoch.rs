//! The server epoch: which server process may accept commands.
//!
//! Invariants:
//! - A server takes the epoch only when no server holds it or the previous
//!   server's lease has expired; taking it increases the epoch by exactly one.
//! - At most one epoch accepts commands at any instant: every server write
//!   first checks that its epoch is current and its lease is live.
//! - Messages stamped with an older epoch are rejected; a newer epoch than
//!   the current one cannot exist.
//! - A clean stop releases the lease so the next server need not wait.

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

impl HostFacts {
    /// Whether some server holds a live lease at `now_ms`.
    pub fn is_held(&self, now_ms: u64) -> bool {
        self.owner_id.is_some() && now_ms < self.lease_expires_at_ms
    }
}

/// Why an epoch operation was refused.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EpochRejection {
    /// Another server holds a live lease until `expires_at_ms`.
    Held { expires_at_ms: u64 },
    /// The presented epoch is older than the current one (or its owner changed).
    Stale { current: ServerEpoch },
    /// The presented epoch is current but its lease has lapsed; the server must stop.
    LeaseExpired,
}

/// A starting server takes the next epoch.
pub fn take(
    facts: &HostFacts,
    owner_id: OwnerId,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<HostFacts, EpochRejection> {
    if facts.is_held(now_ms) {
        return Err(EpochRejection::Held {
            expires_at_ms: facts.lease_expires_at_ms,
        });
    }
    Ok(HostFacts {
        epoch: facts.epoch.next(),
        owner_id: Some(owner_id),
        lease_expires_at_ms: now_ms.saturating_add(ttl_ms),
    })
}

/// Verifies that `epoch` held by `owner_id` is the current, live epoch.
pub fn check(
    facts: &HostFacts,
    epoch: ServerEpoch,
    owner_id: &OwnerId,
    now_ms: u64,
) -> Result<(), EpochRejection> {
    if epoch != facts.epoch || facts.owner_id.as_ref() != Some(owner_id) {
        return Err(EpochRejection::Stale {
            current: facts.epoch,
        });
    }
    if now_ms >= facts.lease_expires_at_ms {
        return Err(EpochRejection::LeaseExpired);
    }
    Ok(())
}

/// Renews the live lease of the current epoch. An expired lease is never revived.
pub fn renew(
    facts: &HostFacts,
    epoch: ServerEpoch,
    owner_id: &OwnerId,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<HostFacts, EpochRejection> {
    check(facts, epoch, owner_id, now_ms)?;
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
    check(facts, epoch, owner_id, now_ms)?;
    Ok(HostFacts {
        epoch: facts.epoch,
        owner_id: None,
        lease_expires_at_ms: now_ms,
    })
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

    #[test]
    fn first_server_takes_epoch_one() {
        let facts = take(&HostFacts::default(), owner("s1"), 0, TTL).unwrap();
        assert_eq!(facts.epoch, ServerEpoch(1));
        assert_eq!(facts.lease_expires_at_ms, 50);
        assert!(check(&facts, ServerEpoch(1), &owner("s1"), 49).is_ok());
    }

    #[test]
    fn second_server_waits_for_the_live_lease() {
        let facts = take(&HostFacts::default(), owner("s1"), 0, TTL).unwrap();
        assert_eq!(
            take(&facts, owner("s2"), 49, TTL),
            Err(EpochRejection::Held { expires_at_ms: 50 })
        );
        let next = take(&facts, owner("s2"), 50, TTL).unwrap();
        assert_eq!(next.epoch, ServerEpoch(2));
    }

    #[test]
    fn the_old_server_is_fenced_after_takeover() {
        let first = take(&HostFacts::default(), owner("s1"), 0, TTL).unwrap();
        let second = take(&first, owner("s2"), 60, TTL).unwrap();
        assert_eq!(
            check(&second, ServerEpoch(1), &owner("s1"), 61),
            Err(EpochRejection::Stale {
                current: ServerEpoch(2)
            })
        );
        assert!(renew(&second, ServerEpoch(1), &owner("s1"), 61, TTL).is_err());
    }

    #[test]
    fn an_expired_lease_is_not_renewed() {
        let facts = take(&HostFacts::default(), owner("s1"), 0, TTL).unwrap();
        assert_eq!(
            renew(&facts, ServerEpoch(1), &owner("s1"), 50, TTL),
            Err(EpochRejection::LeaseExpired)
        );
        let renewed = renew(&facts, ServerEpoch(1), &owner("s1"), 30, TTL).unwrap();
        assert_eq!(renewed.lease_expires_at_ms, 80);
    }

    #[test]
    fn release_lets_the_next_server_start_at_once_with_a_higher_epoch() {
        let facts = take(&HostFacts::default(), owner("s1"), 0, TTL).unwrap();
        let released = release(&facts, ServerEpoch(1), &owner("s1"), 10).unwrap();
        assert!(!released.is_held(10));
        let next = take(&released, owner("s2"), 11, TTL).unwrap();
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
        /// Whatever servers try to take, renew and release, the epoch never goes
        /// back and at most one owner passes `check` at any instant.
        #[test]
        fn at_most_one_epoch_accepts_commands(
            ops in proptest::collection::vec((0u8..4, 0u8..3, 0u64..40), 1..60)
        ) {
            let mut facts = HostFacts::default();
            let mut held: [Option<ServerEpoch>; 3] = [None; 3];
            let mut now_ms = 0;
            for (kind, server, advance) in ops {
                now_ms += advance;
                let id = owner(["s0", "s1", "s2"][server as usize]);
                let before = facts.epoch;
                match kind {
                    0 => if let Ok(next) = take(&facts, id, now_ms, TTL) {
                        held[server as usize] = Some(next.epoch);
                        facts = next;
                    },
                    1 => if let Some(epoch) = held[server as usize]
                        && let Ok(next) = renew(&facts, epoch, &id, now_ms, TTL)
                    {
                        facts = next;
                    },
                    2 => if let Some(epoch) = held[server as usize]
                        && let Ok(next) = release(&facts, epoch, &id, now_ms)
                    {
                        facts = next;
                    },
                    _ => {}
                }
                prop_assert!(facts.epoch >= before);
                let accepting = (0..3).filter(|i| held[*i].is_some_and(|epoch| {
                    check(&facts, epoch, &owner(["s0", "s1", "s2"][*i]), now_ms).is_ok()
                })).count();
                prop_assert!(accepting <= 1);
            }
        }
    }
}
