//! Claims and fencing: runner owners that acquire, renew and write through a
//! run claim, the server's backup renewal timer, runners that stall past
//! expiry and then write, recovery that takes a new (control) generation, and
//! server processes that crash, restart and take a new server epoch.
//!
//! Every transition is the kernel's: [`claim::acquire`],
//! [`claim::check_and_renew`], [`claim::renew_by_timer`], [`claim::release`],
//! [`epoch::take`], [`epoch::renew`]. The model adds the environment (who
//! acts, message delay, clock, crashes, the global server lock) and oracles
//! that judge each committed write from the pre-state facts.
//!
//! A server process acts (admits, recovers, renews claims, processes runner
//! writes) for as long as it runs, as the server does: its writes do not
//! check the epoch. What keeps an older epoch from writing is the global
//! server lock: a process takes the epoch only while it holds the lock,
//! which the operating system releases when the process exits or crashes,
//! so no other server process runs. That is also why taking the epoch never
//! waits for a crashed server's lease, and why a server whose lease lapsed
//! (its renewals could not be stored, e.g. on a full disk) keeps running and
//! renews later.

use crate::harness::Summarize;
use core::fmt;
use kernel::claim::{self, Authority, ClaimLostReason, ClaimRequest, LeaseFacts, OwnerKind};
use kernel::epoch::{self, EpochRejection, HostFacts};
use kernel::ids::{Digest, Generation, OwnerId, ServerEpoch};
use stateright::{Model, Property};

/// Claim lifetime in model ticks.
pub const CLAIM_TTL: u64 = 2;
/// Server lease lifetime in model ticks.
pub const SERVER_TTL: u64 = 3;

/// Which rule set the model runs: the kernel's, or the kernel with exactly
/// one check dropped (a planted bug the checker must find).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClaimRules {
    Kernel,
    /// A protected write checks only the owner (not token, generation or expiry).
    OwnerOnlyFencing,
    /// Renewal skips the expiry check when the identity still matches.
    RenewAfterExpiry,
    /// Acquire ignores a live claim.
    AcquireWhileHeld,
    /// A starting server takes the epoch without holding the global lock
    /// (while another server process still runs).
    TakeWithoutLock,
}

/// The bounded configuration.
#[derive(Clone, Debug)]
pub struct ClaimsModel {
    pub runners: usize,
    pub servers: usize,
    pub max_time: u64,
    /// No acquisition beyond this generation.
    pub max_generation: u64,
    /// No server start beyond this epoch.
    pub max_epoch: u64,
    /// Committed writes plus rejected deliveries are bounded by this.
    pub max_writes: u8,
    pub rules: ClaimRules,
}

impl ClaimsModel {
    /// The CI configuration.
    pub fn ci(rules: ClaimRules) -> Self {
        Self {
            runners: 3,
            servers: 2,
            max_time: 5,
            max_generation: 3,
            max_epoch: 2,
            max_writes: 2,
            rules,
        }
    }

    /// The deep configuration: a longer clock and one more generation.
    pub fn deep(rules: ClaimRules) -> Self {
        Self {
            runners: 3,
            servers: 2,
            max_time: 6,
            max_generation: 4,
            max_epoch: 2,
            max_writes: 2,
            rules,
        }
    }

    /// A one-line description of the bounds.
    pub fn bounds(&self) -> String {
        format!(
            "{} runners, {} servers, t<={}, gen<={}, epoch<={}, writes<={}, ttl {}/{}",
            self.runners,
            self.servers,
            self.max_time,
            self.max_generation,
            self.max_epoch,
            self.max_writes,
            CLAIM_TTL,
            SERVER_TTL
        )
    }
}

/// What one runner process remembers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RunnerMem {
    /// The authority it believes it holds.
    pub held: Option<Authority>,
    /// A write it sent that the server has not processed (network delay, stall).
    pub in_flight: Option<Authority>,
}

/// A claim the kernel granted, with the expiry its holder was last told.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    pub generation: Generation,
    pub expires_at: u64,
}

/// Oracle verdicts, computed from the pre-state of each transition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Oracle {
    /// A write committed whose authority was not the exact live claim.
    pub stale_write: bool,
    /// A renewal succeeded on a claim whose expiry had passed.
    pub expired_renewal: bool,
    /// Two granted claims were live at once.
    pub two_live: bool,
    /// A write committed through a server whose epoch was not current.
    pub stale_epoch_write: bool,
    // Reachability witnesses.
    pub committed: u8,
    pub stale_rejected: bool,
    pub recovered_write: bool,
    pub new_epoch_write: bool,
    pub timer_renewed: bool,
    /// A server took the epoch at once after a crash, while the crashed
    /// server's lease was still live.
    pub takeover_before_expiry: bool,
    /// A server renewed its lease after it had lapsed.
    pub renewed_after_lapse: bool,
}

/// The model state: committed facts, process memory and oracle verdicts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimsState {
    pub now: u64,
    /// The run's `leases` row (committed).
    pub lease: LeaseFacts,
    /// The `workflow_host_state` row (committed).
    pub host: HostFacts,
    pub runners: Vec<RunnerMem>,
    /// Each server process's in-memory epoch (`None`: not running).
    pub servers: Vec<Option<ServerEpoch>>,
    /// Granted claims that may still be live (oracle bookkeeping).
    pub grants: Vec<Grant>,
    /// Deliveries processed so far (bounds the space).
    pub deliveries: u8,
    /// Whether some owner lost a claim that a later generation replaced.
    pub lost: bool,
    pub oracle: Oracle,
}

/// One step of the environment, named by the kernel input it causes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClaimsAction {
    Tick,
    /// Server `s` admits runner `r`: `claim::acquire` with a host owner.
    Acquire {
        server: usize,
        runner: usize,
    },
    /// Server `s` recovers the run: `claim::acquire` (control) then `claim::release`.
    Recover {
        server: usize,
    },
    /// Server `s`'s backup timer: `claim::renew_by_timer` for runner `r`.
    TimerRenew {
        server: usize,
        runner: usize,
    },
    /// Runner `r` sends a protected write with the authority it holds.
    SendWrite {
        runner: usize,
    },
    /// Server `s` processes runner `r`'s delayed write: `claim::check_and_renew`.
    DeliverWrite {
        server: usize,
        runner: usize,
    },
    /// Server process `s` starts: takes the global lock, then `epoch::take`.
    TakeEpoch {
        server: usize,
    },
    /// Server `s`'s lease timer: `epoch::renew` (a renewal that could not be
    /// stored is the clock advancing without this step).
    RenewEpoch {
        server: usize,
    },
    /// Server process `s` crashes: its memory and its lock are gone,
    /// committed facts stay.
    CrashServer {
        server: usize,
    },
}

impl fmt::Display for ClaimsAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tick => write!(f, "clock advances one tick"),
            Self::Acquire { server, runner } => {
                write!(f, "server s{server}: claim::acquire(Host owner r{runner})")
            }
            Self::Recover { server } => write!(
                f,
                "server s{server}: recovery claim::acquire(Control) + claim::release"
            ),
            Self::TimerRenew { server, runner } => write!(
                f,
                "server s{server}: claim::renew_by_timer(authority of r{runner})"
            ),
            Self::SendWrite { runner } => {
                write!(f, "runner r{runner} sends a protected write (delayed)")
            }
            Self::DeliverWrite { server, runner } => write!(
                f,
                "server s{server} processes r{runner}'s write: claim::check_and_renew"
            ),
            Self::TakeEpoch { server } => {
                write!(f, "server s{server} starts: global lock + epoch::take")
            }
            Self::RenewEpoch { server } => write!(f, "server s{server}: epoch::renew"),
            Self::CrashServer { server } => write!(
                f,
                "server s{server} crashes (memory and lock lost, facts kept)"
            ),
        }
    }
}

fn owner(runner: usize) -> OwnerId {
    OwnerId::new(format!("r{runner}"))
}

fn server_owner(server: usize) -> OwnerId {
    OwnerId::new(format!("s{server}"))
}

fn host_request(runner: usize, generation: Generation) -> ClaimRequest {
    ClaimRequest {
        owner_kind: OwnerKind::Host,
        owner_id: owner(runner),
        // A fresh token per generation, as the shell makes one per claim.
        token_hash: Digest::repeat(generation.0 as u8),
    }
}

fn control_request() -> ClaimRequest {
    kernel::fixtures::control_request()
}

/// Whether `authority` is exactly the live claim at `now` (the oracle; it
/// reads the facts, it does not call the kernel's check).
fn exact_live(lease: &LeaseFacts, authority: &Authority, now: u64) -> bool {
    lease.claim.as_ref().is_some_and(|claim| {
        claim.owner_kind == authority.owner_kind
            && claim.owner_id == authority.owner_id
            && claim.token_hash == authority.token_hash
            && claim.generation == authority.generation
            && now < claim.expires_at_ms
    })
}

impl ClaimsModel {
    fn acquire(
        &self,
        facts: &LeaseFacts,
        request: ClaimRequest,
        now: u64,
    ) -> Result<LeaseFacts, claim::AcquireRejection> {
        match self.rules {
            ClaimRules::AcquireWhileHeld => {
                // Planted bug: the live claim is ignored (treated as expired).
                let mut expired = facts.clone();
                if let Some(claim) = expired.claim.as_mut() {
                    claim.expires_at_ms = claim.expires_at_ms.min(now);
                }
                claim::acquire(&expired, request, now, CLAIM_TTL)
            }
            _ => claim::acquire(facts, request, now, CLAIM_TTL),
        }
    }

    fn check_and_renew(
        &self,
        facts: &LeaseFacts,
        authority: &Authority,
        now: u64,
    ) -> Result<LeaseFacts, ClaimLostReason> {
        match self.rules {
            ClaimRules::OwnerOnlyFencing => {
                // Planted bug: only the owner is compared.
                let Some(current) = facts.claim.as_ref() else {
                    return Err(ClaimLostReason::MissingAuthority);
                };
                if current.owner_kind != authority.owner_kind
                    || current.owner_id != authority.owner_id
                {
                    return Err(ClaimLostReason::OwnerChanged);
                }
                let mut renewed = facts.clone();
                if let Some(claim) = renewed.claim.as_mut() {
                    claim.heartbeat_at_ms = now;
                }
                Ok(renewed)
            }
            ClaimRules::RenewAfterExpiry => {
                // Planted bug: an expired claim with a matching identity is
                // renewed as if it were live.
                let mut revived = facts.clone();
                if let Some(claim) = revived.claim.as_mut()
                    && claim.expires_at_ms <= now
                {
                    claim.expires_at_ms = now + 1;
                }
                claim::check_and_renew(&revived, Some(authority), now, CLAIM_TTL)
            }
            _ => claim::check_and_renew(facts, Some(authority), now, CLAIM_TTL),
        }
    }

    /// The oracle's view of a granted claim's renewal.
    fn note_renewal(state: &mut ClaimsState, before: &LeaseFacts, after: &LeaseFacts) {
        let (Some(old), Some(new)) = (before.claim.as_ref(), after.claim.as_ref()) else {
            return;
        };
        if old.expires_at_ms <= state.now {
            state.oracle.expired_renewal = true;
        }
        match state
            .grants
            .iter_mut()
            .find(|grant| grant.generation == new.generation)
        {
            Some(grant) => grant.expires_at = new.expires_at_ms,
            None => state.grants.push(Grant {
                generation: new.generation,
                expires_at: new.expires_at_ms,
            }),
        }
    }

    fn note_grant(state: &mut ClaimsState, facts: &LeaseFacts) {
        if let Some(claim) = facts.claim.as_ref() {
            let now = state.now;
            if state.grants.iter().any(|grant| grant.expires_at > now) {
                state.oracle.two_live = true;
            }
            if state.lease.generation.0 >= 1 {
                state.lost = true;
            }
            state.grants.push(Grant {
                generation: claim.generation,
                expires_at: claim.expires_at_ms,
            });
        }
    }

    fn prune(state: &mut ClaimsState) {
        let now = state.now;
        state.grants.retain(|grant| grant.expires_at > now);
        state.grants.sort_by_key(|grant| grant.generation);
    }
}

impl Model for ClaimsModel {
    type State = ClaimsState;
    type Action = ClaimsAction;

    fn init_states(&self) -> Vec<ClaimsState> {
        vec![ClaimsState {
            now: 0,
            lease: LeaseFacts::default(),
            host: HostFacts::default(),
            runners: vec![
                RunnerMem {
                    held: None,
                    in_flight: None,
                };
                self.runners
            ],
            servers: vec![None; self.servers],
            grants: Vec::new(),
            deliveries: 0,
            lost: false,
            oracle: Oracle::default(),
        }]
    }

    fn actions(&self, state: &ClaimsState, out: &mut Vec<ClaimsAction>) {
        if state.now < self.max_time {
            out.push(ClaimsAction::Tick);
        }
        for server in 0..self.servers {
            match state.servers[server] {
                None => {
                    // Each start is a new process: server `s` is the one that
                    // takes epoch `s + 1` (a restarted server does not reuse
                    // an old process's owner id, and the symmetric orders of
                    // the same starts are explored once). The global lock is
                    // free when no server process runs.
                    let next_process = state.host.epoch.0 == server as u64;
                    let lock_free = state.servers.iter().all(Option::is_none);
                    let may_start = lock_free || self.rules == ClaimRules::TakeWithoutLock;
                    if state.host.epoch.0 < self.max_epoch && next_process && may_start {
                        out.push(ClaimsAction::TakeEpoch { server });
                    }
                }
                Some(_) => {
                    out.push(ClaimsAction::RenewEpoch { server });
                    out.push(ClaimsAction::CrashServer { server });
                    if state.lease.generation.0 < self.max_generation {
                        out.push(ClaimsAction::Recover { server });
                        for runner in 0..self.runners {
                            out.push(ClaimsAction::Acquire { server, runner });
                        }
                    }
                    for runner in 0..self.runners {
                        if state.runners[runner].held.is_some() {
                            out.push(ClaimsAction::TimerRenew { server, runner });
                        }
                        if state.runners[runner].in_flight.is_some() {
                            out.push(ClaimsAction::DeliverWrite { server, runner });
                        }
                    }
                }
            }
        }
        for runner in 0..self.runners {
            let mem = &state.runners[runner];
            if mem.held.is_some() && mem.in_flight.is_none() && state.deliveries < self.max_writes {
                out.push(ClaimsAction::SendWrite { runner });
            }
        }
    }

    fn next_state(&self, state: &ClaimsState, action: ClaimsAction) -> Option<ClaimsState> {
        let mut next = state.clone();
        let now = state.now;
        match action {
            ClaimsAction::Tick => {
                next.now += 1;
                Self::prune(&mut next);
            }
            ClaimsAction::TakeEpoch { server } => {
                let host = epoch::take(
                    &state.host,
                    server_owner(server),
                    now,
                    SERVER_TTL,
                    epoch::ServerLockHeld,
                );
                if state.host.owner_id.is_some() && now < state.host.lease_expires_at_ms {
                    next.oracle.takeover_before_expiry = true;
                }
                next.servers[server] = Some(host.epoch);
                next.host = host;
            }
            ClaimsAction::RenewEpoch { server } => {
                let epoch = state.servers[server]?;
                match epoch::renew(&state.host, epoch, &server_owner(server), now, SERVER_TTL) {
                    Ok(host) => {
                        if now >= state.host.lease_expires_at_ms {
                            next.oracle.renewed_after_lapse = true;
                        }
                        next.host = host;
                    }
                    // Another server took the epoch: this one stops.
                    Err(EpochRejection::Stale { .. }) => next.servers[server] = None,
                }
            }
            ClaimsAction::CrashServer { server } => next.servers[server] = None,
            ClaimsAction::Acquire { server: _, runner } => {
                let generation = state.lease.generation.next();
                let lease = self
                    .acquire(&state.lease, host_request(runner, generation), now)
                    .ok()?;
                Self::note_grant(&mut next, &lease);
                next.runners[runner].held = lease.claim.as_ref().map(Authority::of);
                next.lease = lease;
            }
            ClaimsAction::Recover { server: _ } => {
                let lease = self.acquire(&state.lease, control_request(), now).ok()?;
                Self::note_grant(&mut next, &lease);
                let authority = Authority::of(lease.claim.as_ref()?);
                let released = claim::release(&lease, &authority, now).ok()?;
                // The control claim ends at once: its holder was told so.
                if let Some(grant) = next
                    .grants
                    .iter_mut()
                    .find(|grant| grant.generation == authority.generation)
                {
                    grant.expires_at = now;
                }
                next.lease = released;
                Self::prune(&mut next);
            }
            ClaimsAction::TimerRenew { server: _, runner } => {
                let authority = state.runners[runner].held.clone()?;
                let result = match self.rules {
                    ClaimRules::Kernel
                    | ClaimRules::TakeWithoutLock
                    | ClaimRules::AcquireWhileHeld => {
                        claim::renew_by_timer(&state.lease, &authority, now, CLAIM_TTL)
                    }
                    _ => self.check_and_renew(&state.lease, &authority, now),
                };
                match result {
                    Ok(lease) => {
                        Self::note_renewal(&mut next, &state.lease, &lease);
                        next.oracle.timer_renewed = true;
                        next.lease = lease;
                    }
                    // The server tells the runner its claim is lost.
                    Err(_) => next.runners[runner].held = None,
                }
            }
            ClaimsAction::SendWrite { runner } => {
                next.runners[runner].in_flight = state.runners[runner].held.clone();
            }
            ClaimsAction::DeliverWrite { server, runner } => {
                let authority = next.runners[runner].in_flight.take()?;
                next.deliveries += 1;
                match self.check_and_renew(&state.lease, &authority, now) {
                    Ok(lease) => {
                        if !exact_live(&state.lease, &authority, now) {
                            next.oracle.stale_write = true;
                        }
                        let epoch_ok = state.servers[server].is_some_and(|epoch| {
                            epoch == state.host.epoch
                                && state.host.owner_id.as_ref() == Some(&server_owner(server))
                        });
                        if !epoch_ok {
                            next.oracle.stale_epoch_write = true;
                        }
                        Self::note_renewal(&mut next, &state.lease, &lease);
                        next.oracle.committed += 1;
                        if state.lost && authority.generation.0 >= 2 {
                            next.oracle.recovered_write = true;
                        }
                        if state.host.epoch.0 >= 2 {
                            next.oracle.new_epoch_write = true;
                        }
                        next.lease = lease;
                    }
                    Err(_) => {
                        next.oracle.stale_rejected = true;
                        next.runners[runner].held = None;
                    }
                }
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no write from an expired, older-generation or foreign claim commits",
                |_, s: &ClaimsState| !s.oracle.stale_write,
            ),
            Property::always(
                "an expired claim never renews itself",
                |_, s: &ClaimsState| !s.oracle.expired_renewal,
            ),
            Property::always("at most one live claim per run", |_, s: &ClaimsState| {
                !s.oracle.two_live
            }),
            Property::always(
                "at most one server epoch accepts commands: only the current epoch commits writes",
                |_, s: &ClaimsState| !s.oracle.stale_epoch_write,
            ),
            Property::sometimes("a write commits", |_, s: &ClaimsState| {
                s.oracle.committed > 0
            }),
            Property::sometimes(
                "a stalled runner's write is rejected after its claim moved",
                |_, s: &ClaimsState| s.oracle.stale_rejected,
            ),
            Property::sometimes(
                "a claim is lost and a later generation commits",
                |_, s: &ClaimsState| s.oracle.recovered_write,
            ),
            Property::sometimes(
                "a restarted server with a new epoch commits a write",
                |_, s: &ClaimsState| s.oracle.new_epoch_write,
            ),
            Property::sometimes(
                "the server's timer renews a live claim",
                |_, s: &ClaimsState| s.oracle.timer_renewed,
            ),
            Property::sometimes(
                "a server started after a crash takes the epoch while the crashed server's lease is live",
                |_, s: &ClaimsState| s.oracle.takeover_before_expiry,
            ),
            Property::sometimes(
                "a server renews its lease after it lapsed and stays the server",
                |_, s: &ClaimsState| s.oracle.renewed_after_lapse,
            ),
        ]
    }
}

impl Summarize for ClaimsModel {
    fn summarize(&self, s: &ClaimsState) -> String {
        let claim = s.lease.claim.as_ref().map_or_else(
            || "none".to_owned(),
            |c| {
                format!(
                    "{:?} {} gen {} expires {}",
                    c.owner_kind, c.owner_id, c.generation, c.expires_at_ms
                )
            },
        );
        format!(
            "t={} claim: {claim}; server epoch {} held by {:?} until {}; oracle {:?}",
            s.now, s.host.epoch, s.host.owner_id, s.host.lease_expires_at_ms, s.oracle
        )
    }
}
