//! External channel adapters: the private channel protocol's checks and
//! the managed effects that deliver a protected decision to a channel.
//!
//! A channel adapter is a transport-only child the server supervises, one
//! per configured profile. It receives the rendered presentation, the
//! allowed identities and its one credential; it never sees the decision
//! subject or the state. Everything it reports is checked here first.
//!
//! Invariants:
//! - Every adapter message names the adapter epoch, the profile, a
//!   sequence number, the channel revision it expects and (for work) the
//!   attempt id. A message of another epoch or profile is refused
//!   ([`ChannelRejection::StaleAdapter`]); sequence numbers only grow
//!   within an epoch ([`ChannelRejection::SequenceReplayed`]). So an adapter
//!   the server replaced can settle nothing, and a replayed line changes
//!   nothing.
//! - The channel revision is the request revision of the decision the
//!   presentation showed; an answer for another revision is refused
//!   ([`ChannelRejection::StaleRevision`]).
//! - Every send to a channel is a managed effect of the decision's run
//!   (`effects` and `effect_attempts`), keyed by (run, `channel.send:` and
//!   the profile, the decision's node, visit 1: a run waits on at most one
//!   decision, its continuation is a new run), reserved and moved to
//!   `applying` in a commit before the adapter is told to send.
//! - An attempt id names one numbered attempt of one send effect
//!   ([`attempt_id`], [`parse_attempt_id`]). A report or answer for any
//!   other attempt than the effect's current one is refused
//!   ([`ChannelRejection::StaleAttempt`]); an answer counts only through a
//!   delivered (`applied`) send of the decision still pending.
//! - A known rejection of the channel starts the next numbered attempt,
//!   at most [`MAX_ATTEMPTS`] in all; then the send is `rejected`. An
//!   attempt whose outcome is unknown (the connection broke after the
//!   request left, the adapter or the server stopped while it was applying)
//!   becomes `ambiguous` and is never sent again automatically: only
//!   `effect.recover` (confirm or retry) moves it.
//! - Only the allowed identities of the profile answer
//!   ([`ChannelRejection::NotAllowed`]).

use crate::effect::{EffectKey, EffectRecord, EffectState, upsert};
use crate::ids::{Digest, EffectId};
use crate::output::{RunEvent, Transition};
use crate::run::{RunAggregate, Tx};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// Attempts a send may take through known rejections.
pub const MAX_ATTEMPTS: u32 = 3;

/// The effect type of a send to `profile`.
pub fn send_type(profile: &str) -> String {
    format!("channel.send:{profile}")
}

/// The attempt id of attempt `number` of `effect_id`.
pub fn attempt_id(effect_id: &EffectId, number: u32) -> String {
    format!("{}.{number}", effect_id.as_str())
}

/// The effect and attempt number an attempt id names.
pub fn parse_attempt_id(attempt_id: &str) -> Option<(EffectId, u32)> {
    let (effect, number) = attempt_id.rsplit_once('.')?;
    let number: u32 = number.parse().ok()?;
    (number >= 1 && effect.starts_with("effect-")).then(|| (EffectId::new(effect), number))
}

/// The key of the send of `agg`'s pending decision to `profile`.
pub fn send_key(agg: &RunAggregate, profile: &str) -> Option<EffectKey> {
    let decision = agg
        .decision
        .as_ref()
        .filter(|decision| decision.status == crate::decision::DecisionStatus::Pending)?;
    Some(EffectKey {
        run_id: agg.run.run_id.clone(),
        effect_type: send_type(profile),
        node_path: decision.node_id.clone(),
        visit: 1,
    })
}

/// The server's view of one running adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterSession {
    pub profile: String,
    pub epoch: u64,
    /// The highest sequence accepted in this epoch (0: none yet).
    pub last_sequence: u64,
}

impl AdapterSession {
    /// A freshly launched adapter.
    pub fn launched(profile: String, epoch: u64) -> Self {
        Self {
            profile,
            epoch,
            last_sequence: 0,
        }
    }
}

/// The fields every adapter message carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub epoch: u64,
    pub profile: String,
    pub sequence: u64,
    pub expected_revision: u64,
    pub attempt_id: Option<String>,
}

/// Why an adapter message or a channel transition was refused. Nothing
/// changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum ChannelRejection {
    /// Another epoch or profile than the running adapter's.
    StaleAdapter,
    /// The sequence is not above the last accepted one.
    SequenceReplayed,
    /// The attempt id names no attempt, or not the effect's current one.
    StaleAttempt,
    /// The channel revision is not the presented request's.
    StaleRevision,
    /// The run waits on no pending decision.
    NoPendingDecision,
    /// The send is applying already.
    AlreadyApplying,
    /// The send may have been delivered: only `effect.recover` moves it.
    Ambiguous,
    /// The send was not delivered (rejected, cancelled, or not reported).
    NotDelivered { state: EffectState },
    /// The answering identity is not allowed for the profile.
    NotAllowed,
    /// The pressed choice takes a text input, which a button cannot carry.
    NeedsText,
}

/// Checks `header` against the running adapter `session` and returns the
/// session with the accepted sequence.
pub fn check_header(
    session: &AdapterSession,
    header: &Header,
) -> Result<AdapterSession, ChannelRejection> {
    if header.epoch != session.epoch || header.profile != session.profile {
        return Err(ChannelRejection::StaleAdapter);
    }
    if header.sequence <= session.last_sequence {
        return Err(ChannelRejection::SequenceReplayed);
    }
    Ok(AdapterSession {
        last_sequence: header.sequence,
        ..session.clone()
    })
}

/// Whether `user` in `chat` may answer: both must be allowed.
pub fn check_identity(
    allowed_users: &[i64],
    allowed_chats: &[i64],
    user: i64,
    chat: i64,
) -> Result<(), ChannelRejection> {
    if allowed_users.contains(&user) && allowed_chats.contains(&chat) {
        Ok(())
    } else {
        Err(ChannelRejection::NotAllowed)
    }
}

/// The accepted answer to a present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Presented {
    /// Commit, then tell the adapter to send attempt `attempt_number`.
    Send {
        transition: Transition<RunAggregate>,
        effect_id: EffectId,
        attempt_number: u32,
    },
    /// The send settled already (delivered or definitely refused):
    /// nothing changes and nothing is sent.
    Settled { effect: EffectRecord },
}

/// Reserves the send of `agg`'s pending decision to `profile` and moves it
/// to `applying`: a new send is attempt 1; a `reserved` one (after a known
/// rejection or an operator's retry) keeps its attempt number. `existing`
/// is the effect row when it is settled (settled effects are not in the
/// aggregate).
pub fn present(
    agg: &RunAggregate,
    profile: &str,
    fingerprint: Digest,
    existing: Option<&EffectRecord>,
    now_ms: u64,
) -> Result<Presented, ChannelRejection> {
    let Some(key) = send_key(agg, profile) else {
        return Err(ChannelRejection::NoPendingDecision);
    };
    let effect_id = key.effect_id();
    let found = find(agg, &effect_id, existing);
    let record = match found {
        None => EffectRecord {
            effect_id: effect_id.clone(),
            key,
            request_fingerprint: fingerprint,
            state: EffectState::Reserved,
            attempt_number: 1,
            node_attempt_id: None,
            result_digest: None,
        },
        Some(effect) => match effect.state {
            EffectState::Reserved => effect.clone(),
            EffectState::Applying => return Err(ChannelRejection::AlreadyApplying),
            EffectState::Ambiguous => return Err(ChannelRejection::Ambiguous),
            EffectState::Applied | EffectState::Rejected | EffectState::Cancelled => {
                return Ok(Presented::Settled {
                    effect: effect.clone(),
                });
            }
        },
    };
    let attempt_number = record.attempt_number;
    let mut tx = Tx::begin(agg, now_ms);
    upsert(
        &mut tx.agg.effects,
        EffectRecord {
            state: EffectState::Applying,
            ..record
        },
    );
    tx.event(RunEvent::EffectApplying {
        effect_id: effect_id.clone(),
        attempt_number,
    });
    Ok(Presented::Send {
        transition: tx.commit_unversioned(),
        effect_id,
        attempt_number,
    })
}

/// How the adapter says a send attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SendOutcome {
    /// The channel accepted it (its message references are the result).
    Delivered,
    /// The channel answered with a known refusal; `retryable` when the
    /// same request may succeed on a new attempt (rate limits, a server error
    /// answered before anything was sent).
    Refused { retryable: bool },
    /// The request may have reached the channel; nobody knows.
    Unknown,
}

/// A send report's decision: the transition, and the state the reported
/// attempt ended in (its `effect_attempts` row), which differs from the
/// effect's when a known rejection started the next attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reported {
    pub transition: Transition<RunAggregate>,
    pub attempt_number: u32,
    pub attempt_state: EffectState,
}

/// The adapter reports attempt `attempt_number` of the applying send
/// `effect_id` of `agg`.
pub fn report(
    agg: &RunAggregate,
    effect_id: &EffectId,
    attempt_number: u32,
    outcome: SendOutcome,
    result: Digest,
    now_ms: u64,
) -> Result<Reported, ChannelRejection> {
    let Some(effect) = find(agg, effect_id, None) else {
        return Err(ChannelRejection::StaleAttempt);
    };
    if effect.attempt_number != attempt_number {
        return Err(ChannelRejection::StaleAttempt);
    }
    if effect.state != EffectState::Applying {
        return Err(ChannelRejection::NotDelivered {
            state: effect.state,
        });
    }
    let (next, attempt_state) = match outcome {
        SendOutcome::Delivered => (
            EffectRecord {
                state: EffectState::Applied,
                result_digest: Some(result),
                ..effect.clone()
            },
            EffectState::Applied,
        ),
        SendOutcome::Refused { retryable: true } if attempt_number < MAX_ATTEMPTS => (
            EffectRecord {
                state: EffectState::Reserved,
                attempt_number: attempt_number + 1,
                ..effect.clone()
            },
            EffectState::Rejected,
        ),
        SendOutcome::Refused { .. } => (
            EffectRecord {
                state: EffectState::Rejected,
                result_digest: Some(result),
                ..effect.clone()
            },
            EffectState::Rejected,
        ),
        SendOutcome::Unknown => (
            EffectRecord {
                state: EffectState::Ambiguous,
                ..effect.clone()
            },
            EffectState::Ambiguous,
        ),
    };
    let mut tx = Tx::begin(agg, now_ms);
    let state = next.state;
    upsert(&mut tx.agg.effects, next);
    tx.event(RunEvent::EffectSettled {
        effect_id: effect_id.clone(),
        state,
    });
    let transition = if state == EffectState::Ambiguous {
        // The view shows the run needs review.
        tx.commit()
    } else {
        tx.commit_unversioned()
    };
    Ok(Reported {
        transition,
        attempt_number,
        attempt_state,
    })
}

/// The adapter of `profile` stopped (or the server restarted): each of its
/// sends still applying in `agg` becomes `ambiguous`. `None` when none was.
pub fn on_adapter_lost(
    agg: &RunAggregate,
    profile: &str,
    now_ms: u64,
) -> Option<Transition<RunAggregate>> {
    let send = send_type(profile);
    let lost: Vec<EffectId> = agg
        .effects
        .iter()
        .filter(|effect| effect.key.effect_type == send && effect.state == EffectState::Applying)
        .map(|effect| effect.effect_id.clone())
        .collect();
    if lost.is_empty() {
        return None;
    }
    let mut tx = Tx::begin(agg, now_ms);
    for effect in &mut tx.agg.effects {
        if lost.contains(&effect.effect_id) {
            effect.state = EffectState::Ambiguous;
        }
    }
    for effect_id in lost {
        tx.event(RunEvent::EffectSettled {
            effect_id,
            state: EffectState::Ambiguous,
        });
    }
    Some(tx.commit())
}

/// Whether an answer through attempt `attempt_number` of `send` (the
/// effect row, loaded by the shell) may answer `agg`'s pending decision of
/// request revision `revision`: the send belongs to this run and profile,
/// is the current attempt, was delivered, and the adapter saw this
/// revision.
pub fn check_answer(
    agg: &RunAggregate,
    profile: &str,
    send: &EffectRecord,
    attempt_number: u32,
    expected_revision: u64,
    revision: u64,
) -> Result<(), ChannelRejection> {
    let pending = agg
        .decision
        .as_ref()
        .filter(|decision| decision.status == crate::decision::DecisionStatus::Pending);
    let Some(decision) = pending else {
        return Err(ChannelRejection::NoPendingDecision);
    };
    if send.key.run_id != agg.run.run_id
        || send.key.effect_type != send_type(profile)
        || send.key.node_path != decision.node_id
        || send.attempt_number != attempt_number
    {
        return Err(ChannelRejection::StaleAttempt);
    }
    if send.state != EffectState::Applied {
        return Err(ChannelRejection::NotDelivered { state: send.state });
    }
    if expected_revision != revision {
        return Err(ChannelRejection::StaleRevision);
    }
    Ok(())
}

fn find<'a>(
    agg: &'a RunAggregate,
    effect_id: &EffectId,
    loaded: Option<&'a EffectRecord>,
) -> Option<&'a EffectRecord> {
    agg.effects
        .iter()
        .find(|effect| effect.effect_id == *effect_id)
        .or(loaded.filter(|effect| effect.effect_id == *effect_id))
}

#[cfg(test)]
mod tests;
