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
//! - Once the decision is no longer pending (answered from any source,
//!   defaulted, cancelled or expired), each delivered send is settled: its
//!   messages are edited to state the outcome, without buttons. The edit is
//!   a second managed effect of the same run, `channel.settle:` and the
//!   profile at the decision's node ([`settle`]), with the same rules as a
//!   send: reserved and `applying` in a commit before the adapter edits,
//!   numbered attempts, a bounded new attempt after a known rejection,
//!   `ambiguous` when interrupted. A send with no known messages (an
//!   operator confirmed it without a receipt) has nothing to edit: its
//!   settlement is recorded `cancelled`.
//! - A report names its work: a send's report cannot settle an edit, nor an
//!   edit's a send, nor one profile's adapter the other's
//!   ([`ChannelRejection::StaleAttempt`]).
//! - An ambiguous edit may be retried after its run ended (the adapter
//!   edits; the run executes nothing again): [`recover`].

use crate::effect::{
    EffectKey, EffectRecord, EffectRejection, EffectState, RecoveryAction, upsert,
};
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

/// The effect type of the settlement edits of `profile`'s messages.
pub fn settle_type(profile: &str) -> String {
    format!("channel.settle:{profile}")
}

/// The profile of a channel effect type (a send's or a settlement's).
pub fn profile_of(effect_type: &str) -> Option<&str> {
    effect_type
        .strip_prefix("channel.send:")
        .or_else(|| effect_type.strip_prefix("channel.settle:"))
}

/// The two kinds of channel work an adapter performs and reports on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ChannelWork {
    /// Presenting a pending decision (`channel.present`).
    Send,
    /// Editing the presented messages once the decision is decided
    /// (`channel.settle`).
    Settle,
}

impl ChannelWork {
    /// The effect type of this work for `profile`.
    pub fn effect_type(self, profile: &str) -> String {
        match self {
            Self::Send => send_type(profile),
            Self::Settle => settle_type(profile),
        }
    }
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

/// The key of the settlement of `send` (a send effect of `profile`): the
/// same run and node, type `channel.settle:<profile>`.
pub fn settle_key(send: &EffectRecord, profile: &str) -> EffectKey {
    EffectKey {
        run_id: send.key.run_id.clone(),
        effect_type: settle_type(profile),
        node_path: send.key.node_path.clone(),
        visit: 1,
    }
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
    /// The pressed choice takes a text input, which a button cannot carry:
    /// the presser gives it by replying to the decision message.
    NeedsText,
    /// The decision is still pending: there is nothing to settle yet.
    DecisionPending,
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
    Ok(match next_attempt(agg, key, fingerprint, existing)? {
        Next::Attempt(record) => {
            let (effect_id, attempt_number) = (record.effect_id.clone(), record.attempt_number);
            Presented::Send {
                transition: moved_to(agg, record, EffectState::Applying, now_ms),
                effect_id,
                attempt_number,
            }
        }
        Next::Settled(effect) => Presented::Settled { effect },
    })
}

/// What a channel effect's next step is.
enum Next {
    /// Apply this attempt (a new effect's first, or a `reserved` one's).
    Attempt(EffectRecord),
    /// It settled already: nothing changes.
    Settled(EffectRecord),
}

/// The next attempt of the channel effect `key`: a new effect is attempt 1
/// (with `fingerprint`); a `reserved` one (after a known rejection or an
/// operator's retry) keeps its attempt number; an applying one could be
/// applied twice and an ambiguous one waits for an operator (both refused).
/// `existing` is the effect row when it is settled (settled effects are not
/// in the aggregate).
fn next_attempt(
    agg: &RunAggregate,
    key: EffectKey,
    fingerprint: Digest,
    existing: Option<&EffectRecord>,
) -> Result<Next, ChannelRejection> {
    let effect_id = key.effect_id();
    let Some(effect) = find(agg, &effect_id, existing) else {
        return Ok(Next::Attempt(EffectRecord {
            effect_id,
            key,
            request_fingerprint: fingerprint,
            state: EffectState::Reserved,
            attempt_number: 1,
            node_attempt_id: None,
            result_digest: None,
        }));
    };
    match effect.state {
        EffectState::Reserved => Ok(Next::Attempt(effect.clone())),
        EffectState::Applying => Err(ChannelRejection::AlreadyApplying),
        EffectState::Ambiguous => Err(ChannelRejection::Ambiguous),
        EffectState::Applied | EffectState::Rejected | EffectState::Cancelled => {
            Ok(Next::Settled(effect.clone()))
        }
    }
}

/// `record` moved to `state` (`applying`, or `cancelled` when there is
/// nothing to apply), committed without a new revision.
fn moved_to(
    agg: &RunAggregate,
    record: EffectRecord,
    state: EffectState,
    now_ms: u64,
) -> Transition<RunAggregate> {
    let (effect_id, attempt_number) = (record.effect_id.clone(), record.attempt_number);
    let mut tx = Tx::begin(agg, now_ms);
    upsert(&mut tx.agg.effects, EffectRecord { state, ..record });
    tx.event(if state == EffectState::Applying {
        RunEvent::EffectApplying {
            effect_id,
            attempt_number,
        }
    } else {
        RunEvent::EffectSettled { effect_id, state }
    });
    tx.commit_unversioned()
}

/// The accepted answer to a settlement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settling {
    /// Commit, then tell the adapter to edit the messages as attempt
    /// `attempt_number`.
    Edit {
        transition: Transition<RunAggregate>,
        effect_id: EffectId,
        attempt_number: u32,
    },
    /// The send has no known messages: commit the settlement as
    /// `cancelled`; nothing is edited.
    NothingToEdit {
        transition: Transition<RunAggregate>,
    },
    /// The settlement settled already: nothing changes, nothing is edited.
    Settled { effect: EffectRecord },
}

/// Reserves the settlement edit of `send` (`agg`'s delivered send to
/// `profile`, as loaded: settled effects are not in the aggregate) and
/// moves it to `applying`, once `agg` waits on no pending decision.
/// `messages` is how many messages the send delivered; `existing` is the
/// settlement's row when it is settled. A new settlement is attempt 1; a
/// `reserved` one (after a known rejection or an operator's retry) keeps
/// its attempt number.
pub fn settle(
    agg: &RunAggregate,
    profile: &str,
    send: &EffectRecord,
    messages: usize,
    fingerprint: Digest,
    existing: Option<&EffectRecord>,
    now_ms: u64,
) -> Result<Settling, ChannelRejection> {
    if agg
        .decision
        .as_ref()
        .is_some_and(|decision| decision.status == crate::decision::DecisionStatus::Pending)
    {
        return Err(ChannelRejection::DecisionPending);
    }
    if send.key.run_id != agg.run.run_id || send.key.effect_type != send_type(profile) {
        return Err(ChannelRejection::StaleAttempt);
    }
    if send.state != EffectState::Applied {
        return Err(ChannelRejection::NotDelivered { state: send.state });
    }
    let record = match next_attempt(agg, settle_key(send, profile), fingerprint, existing)? {
        Next::Attempt(record) => record,
        Next::Settled(effect) => return Ok(Settling::Settled { effect }),
    };
    if messages == 0 {
        return Ok(Settling::NothingToEdit {
            transition: moved_to(agg, record, EffectState::Cancelled, now_ms),
        });
    }
    let (effect_id, attempt_number) = (record.effect_id.clone(), record.attempt_number);
    Ok(Settling::Edit {
        transition: moved_to(agg, record, EffectState::Applying, now_ms),
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

/// `profile`'s adapter reports attempt `attempt_number` of the applying
/// `work` (a send or a settlement) `effect_id` of `agg`. The effect must be
/// that work of that profile, at that attempt.
#[allow(clippy::too_many_arguments)]
pub fn report(
    agg: &RunAggregate,
    profile: &str,
    work: ChannelWork,
    effect_id: &EffectId,
    attempt_number: u32,
    outcome: SendOutcome,
    result: Digest,
    now_ms: u64,
) -> Result<Reported, ChannelRejection> {
    let Some(effect) = find(agg, effect_id, None) else {
        return Err(ChannelRejection::StaleAttempt);
    };
    if effect.key.effect_type != work.effect_type(profile)
        || effect.attempt_number != attempt_number
    {
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
/// sends and settlements still applying in `agg` becomes `ambiguous`.
/// `None` when none was.
pub fn on_adapter_lost(
    agg: &RunAggregate,
    profile: &str,
    now_ms: u64,
) -> Option<Transition<RunAggregate>> {
    let types = [send_type(profile), settle_type(profile)];
    let lost: Vec<EffectId> = agg
        .effects
        .iter()
        .filter(|effect| {
            types.contains(&effect.key.effect_type) && effect.state == EffectState::Applying
        })
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

/// `effect.recover` of any effect of `agg`: [`crate::effect::recover`],
/// except that an ambiguous settlement edit may be retried after its run
/// ended. The adapter performs the edit and the run executes nothing
/// again, so the terminal run's own rule (never retry) does not apply; a
/// send is never retried after its run ended (its decision is decided).
pub fn recover(
    agg: &RunAggregate,
    effect_id: &EffectId,
    action: RecoveryAction,
    observed_result: Digest,
    now_ms: u64,
) -> Result<Transition<RunAggregate>, EffectRejection> {
    let settle_after_end = find(agg, effect_id, None).filter(|effect| {
        action == RecoveryAction::Retry
            && agg.run.status.is_terminal()
            && effect.state == EffectState::Ambiguous
            && effect.key.effect_type.starts_with("channel.settle:")
    });
    let Some(effect) = settle_after_end else {
        return crate::effect::recover(agg, effect_id, action, observed_result, now_ms);
    };
    let next = EffectRecord {
        state: EffectState::Reserved,
        attempt_number: effect.attempt_number.saturating_add(1),
        ..effect.clone()
    };
    let mut tx = Tx::begin(agg, now_ms);
    upsert(&mut tx.agg.effects, next);
    tx.event(RunEvent::EffectRecovered {
        effect_id: effect_id.clone(),
        action,
    });
    Ok(tx.commit())
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
