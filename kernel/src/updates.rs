//! Workflow updates: non-completing `(type, key) → data` values that a runner
//! (`node.update`) or the agent tool (`interaction.update`) publishes for the
//! run's unfinished attempt.
//!
//! Invariants:
//! - An update never completes a node, touches outputs or results, routes,
//!   notifies or starts a turn. It replaces the current value of its
//!   `(type, key)` pair and nothing else.
//! - The envelope is checked in full: `type` matches `[a-z][a-z0-9.-]{0,63}`,
//!   `key` matches `[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}` (case-sensitive),
//!   `data` is a JSON object of at most [`MAX_DATA_BYTES`] encoded bytes
//!   that nests at most [`MAX_DATA_DEPTH`] levels, so that every frame that
//!   carries it (its deepest placement is a run-view patch) stays within the
//!   protocol's 64-level limit.
//! - A run has at most [`MAX_CURRENT_PAIRS`] current pairs; replacing an
//!   existing pair never counts twice.
//! - Per run, a token bucket admits at most [`BUCKET_BURST`] updates at once
//!   and one more per [`REFILL_INTERVAL_MS`] (20 per second) after that. The
//!   bucket is a durable fact in integer milliseconds; a rejected update
//!   spends no token.
//! - An update is idempotent by its idempotency key: the same key with the
//!   same fingerprint returns the first receipt and changes nothing; the same
//!   key with another fingerprint is a conflict. Replays are answered before
//!   any other rule, so a retry after the run moved on still gets its receipt.
//! - Only the run's one unfinished attempt with the matching id may publish:
//!   an `Active` attempt under the runner's live claim (which is renewed), or
//!   the `Waiting` attempt of a pending submitted-output request in its
//!   origin session, or the `Active` attempt of a headless run's pending
//!   submitted-output request from the live runner's agent tool. A paused or
//!   terminal run accepts no update.
//! - A headless agent-tool update is checked for its authority (the live
//!   runner's generation and epoch) and its request's kind before its
//!   receipt is looked up.
//! - Every accepted update increases the run revision once (its `seq`) and
//!   writes one `updatePublished` event.

use crate::attempt::AttemptStatus;
use crate::claim::Authority;
use crate::ids::{
    AttemptId, Digest, Generation, IdempotencyKey, InteractionId, NodeId, Revision, RunnerEpochId,
    SessionId,
};
use crate::interaction::{InteractionKind, InteractionStatus};
use crate::output::{RunEvent, Transition};
use crate::run::{self, RunAggregate, Tx};
use alloc::string::String;
use core::fmt;
use serde::{Deserialize, Serialize};

/// The longest `type`, in bytes.
pub const MAX_TYPE_BYTES: usize = 64;
/// The longest `key`, in bytes.
pub const MAX_KEY_BYTES: usize = 128;
/// The largest encoded `data` object (64 KiB).
pub const MAX_DATA_BYTES: u64 = 64 * 1_024;
/// The deepest nesting of `data` (the data object itself is level 1).
///
/// The deepest frame that carries update data is a run-view patch event that
/// replaces the updates page: `ClientMessage` (1) › `event` (2) › `ops` (3) ›
/// one op (4) › `value`, the `UpdatePage` (5) › `items` (6) › the
/// `UpdateRecord` (7) › `data`. Seven levels enclose the data, and a frame
/// nests at most 64 (`protocol::MAX_DEPTH`), so data may nest 64 − 7 = 57.
/// The other placements are shallower: a snapshot event or session view 6, a
/// `run.view` receipt 5, a page event 5, a `view.page` receipt 4, and the
/// `node.update` message itself 2. `server/tests` pins this against the
/// schemas (`update_data_depth_fits_its_deepest_frame`).
pub const MAX_DATA_DEPTH: u32 = 57;
/// The most current `(type, key)` pairs one run holds.
pub const MAX_CURRENT_PAIRS: u32 = 1_024;
/// The token bucket's capacity: the largest burst of updates.
pub const BUCKET_BURST: u32 = 100;
/// One token is earned per this many milliseconds (20 per second).
pub const REFILL_INTERVAL_MS: u64 = 50;

/// The runtime-owned id of one accepted update (`upd_…`, made by the shell).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct UpdateId(pub String);

impl UpdateId {
    /// Wraps an id produced by the shell.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
}

impl fmt::Display for UpdateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `value` matches `[a-z][a-z0-9.-]{0,63}`.
pub fn is_valid_type(value: &str) -> bool {
    let Some((first, rest)) = value.as_bytes().split_first() else {
        return false;
    };
    rest.len() < MAX_TYPE_BYTES
        && first.is_ascii_lowercase()
        && rest
            .iter()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || b".-".contains(byte))
}

/// Whether `value` matches `[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}`.
pub fn is_valid_key(value: &str) -> bool {
    let Some((first, rest)) = value.as_bytes().split_first() else {
        return false;
    };
    rest.len() < MAX_KEY_BYTES
        && first.is_ascii_alphanumeric()
        && rest
            .iter()
            .all(|byte| byte.is_ascii_alphanumeric() || b"._:/-".contains(byte))
}

/// The per-run rate limiter (durable: `tokens` and `refilled_at_ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TokenBucket {
    /// Whole tokens available as of `refilled_at_ms`.
    pub tokens: u32,
    /// The time up to which earned tokens are counted. Time after it that is
    /// shorter than one interval is carried to the next refill, never lost,
    /// except while the bucket is full.
    pub refilled_at_ms: u64,
}

impl TokenBucket {
    /// A full bucket (a new run, or a continuation, which starts empty of updates).
    pub const fn full(now_ms: u64) -> Self {
        Self {
            tokens: BUCKET_BURST,
            refilled_at_ms: now_ms,
        }
    }

    /// The bucket with the tokens earned up to `now_ms` added. A clock that
    /// went backwards earns nothing.
    #[must_use]
    pub fn refilled(self, now_ms: u64) -> Self {
        let Some(elapsed_ms) = now_ms.checked_sub(self.refilled_at_ms) else {
            return self;
        };
        let earned = elapsed_ms / REFILL_INTERVAL_MS;
        let burst = u64::from(BUCKET_BURST);
        let tokens = u64::from(self.tokens).saturating_add(earned).min(burst);
        let refilled_at_ms = if tokens == burst {
            now_ms
        } else {
            self.refilled_at_ms + earned * REFILL_INTERVAL_MS
        };
        Self {
            tokens: u32::try_from(tokens).unwrap_or(BUCKET_BURST),
            refilled_at_ms,
        }
    }

    /// When the next token is earned.
    pub const fn next_token_at_ms(&self) -> u64 {
        self.refilled_at_ms.saturating_add(REFILL_INTERVAL_MS)
    }
}

/// The durable per-run update facts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UpdateFacts {
    pub bucket: TokenBucket,
    /// How many `(type, key)` pairs currently hold a value.
    pub current_pairs: u32,
}

impl UpdateFacts {
    /// The facts of a run with no updates yet.
    pub const fn new(now_ms: u64) -> Self {
        Self {
            bucket: TokenBucket::full(now_ms),
            current_pairs: 0,
        }
    }
}

/// The JSON type of the `data` value, as the shell parsed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JsonKind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

/// What the kernel needs to know about `data` (the bytes stay in the shell).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UpdateData {
    pub kind: JsonKind,
    /// The size of its canonical encoding.
    pub encoded_bytes: u64,
    /// How deep its arrays and objects nest (the data object is level 1).
    pub depth: u32,
    /// Digest of its canonical encoding.
    pub digest: Digest,
}

/// Who publishes, with the authority that source presents.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "source")]
pub enum UpdateSource {
    /// `node.update` from the run's supervised runner.
    Runner {
        authority: Authority,
        runner_epoch: RunnerEpochId,
        ttl_ms: u64,
    },
    /// `interaction.update` from the agent tool in the origin session, after
    /// the shell verified the coordinator authority
    /// (`interaction::check_authority`).
    AgentTool {
        session_id: SessionId,
        interaction_id: InteractionId,
    },
    /// `interaction.update` from the agent tool of a headless run: the bridge
    /// in the live runner's own Pi child, with the runner's authority.
    HeadlessTool {
        generation: Generation,
        runner_epoch: RunnerEpochId,
        interaction_id: InteractionId,
    },
}

/// Who published an update, as the fingerprint remembers it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "origin")]
pub enum UpdateOrigin {
    Runner { runner_epoch: RunnerEpochId },
    AgentTool { session_id: SessionId },
}

impl UpdateOrigin {
    fn of(source: &UpdateSource) -> Self {
        match source {
            UpdateSource::Runner { runner_epoch, .. }
            | UpdateSource::HeadlessTool { runner_epoch, .. } => Self::Runner {
                runner_epoch: runner_epoch.clone(),
            },
            UpdateSource::AgentTool { session_id, .. } => Self::AgentTool {
                session_id: session_id.clone(),
            },
        }
    }
}

/// One proposed update.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UpdateInput {
    /// The tool-call id for agent updates; derived from the message id for runners.
    pub idempotency_key: IdempotencyKey,
    /// The id the update gets if it is accepted.
    pub update_id: UpdateId,
    pub attempt_id: AttemptId,
    pub update_type: String,
    pub key: String,
    pub data: UpdateData,
}

/// What makes two deliveries under one idempotency key the same update.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UpdateFingerprint {
    pub origin: UpdateOrigin,
    pub attempt_id: AttemptId,
    pub update_type: String,
    pub key: String,
    pub data_digest: Digest,
}

impl UpdateFingerprint {
    /// The fingerprint of `input` from `source` (the update id is runtime-owned
    /// and not part of it).
    pub fn of(source: &UpdateSource, input: &UpdateInput) -> Self {
        Self {
            origin: UpdateOrigin::of(source),
            attempt_id: input.attempt_id.clone(),
            update_type: input.update_type.clone(),
            key: input.key.clone(),
            data_digest: input.data.digest,
        }
    }
}

/// The stored receipt `{updateId, seq, at, type, key}` with its idempotency identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct UpdateReceipt {
    pub idempotency_key: IdempotencyKey,
    pub fingerprint: UpdateFingerprint,
    pub update_id: UpdateId,
    /// The run revision the update committed at.
    pub seq: Revision,
    pub at_ms: u64,
}

/// The current value row of one `(type, key)` pair.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CurrentUpdate {
    pub update_type: String,
    pub key: String,
    pub update_id: UpdateId,
    pub seq: Revision,
    pub node_id: NodeId,
    pub attempt_id: AttemptId,
    pub data_digest: Digest,
    pub at_ms: u64,
}

/// What the shell looked up for this update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdateLookup<'a> {
    /// The receipt already stored under the update's idempotency key.
    pub by_idempotency_key: Option<&'a UpdateReceipt>,
    /// The update's `(type, key)` already holds a current value.
    pub pair_is_current: bool,
}

/// The facts an accepted update writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Updated {
    pub run: RunAggregate,
    pub facts: UpdateFacts,
    /// The new current value of the pair (replacing any previous one).
    pub current: CurrentUpdate,
    pub receipt: UpdateReceipt,
}

/// The answer to an update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateDecision {
    /// A new update: commit the transition, then reply with its receipt.
    Accepted(Transition<Updated>),
    /// A repeat of an accepted update: reply with the first receipt, change nothing.
    Replayed(UpdateReceipt),
}

/// Why an update was refused. Nothing changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum UpdateRejection {
    /// A lifecycle rule: `terminal`, `paused`, `claimLost` or `staleRunner`.
    Run(run::Rejection),
    /// The idempotency key already names another update.
    IdempotencyConflict,
    InvalidType,
    InvalidKey,
    DataNotObject {
        kind: JsonKind,
    },
    DataTooLarge {
        encoded_bytes: u64,
    },
    /// The data nests deeper than [`MAX_DATA_DEPTH`].
    DataTooDeep {
        depth: u32,
    },
    /// The run has no unfinished attempt.
    NoUnfinishedAttempt,
    /// The update names another attempt than the run's unfinished one.
    AttemptMismatch,
    /// A runner update for an attempt that waits in the origin session.
    AttemptNotActive,
    /// An agent-tool update for an attempt that a runner executes.
    AttemptNotWaiting,
    /// No pending request with this id belongs to the attempt.
    RequestMismatch,
    /// The pending request is not a submitted-output agent step.
    NotAgentStep,
    /// The request belongs to another origin session.
    WrongSession,
    /// A headless agent-tool update for an interactive run (whose agent tool
    /// works in the origin session, with the coordinator's authority).
    NotHeadless,
    /// The run already holds the most current pairs; this one would be new.
    TooManyPairs,
    /// The bucket is empty; the next token is earned at `retry_at_ms`.
    RateLimited {
        retry_at_ms: u64,
    },
}

/// Publishes one update: replay, envelope, lifecycle, authority, pair limit
/// and rate, in that order; then one committed revision.
pub fn publish(
    agg: &RunAggregate,
    facts: &UpdateFacts,
    lookup: UpdateLookup<'_>,
    source: &UpdateSource,
    input: UpdateInput,
    now_ms: u64,
) -> Result<UpdateDecision, UpdateRejection> {
    let fingerprint = UpdateFingerprint::of(source, &input);
    // Ownership and request kind come before any receipt lookup.
    match source {
        UpdateSource::HeadlessTool {
            generation,
            runner_epoch,
            interaction_id,
        } => check_headless_tool(
            agg,
            *generation,
            runner_epoch,
            interaction_id,
            &input.attempt_id,
        )?,
        UpdateSource::AgentTool {
            session_id,
            interaction_id,
        } => check_agent_tool(agg, session_id, interaction_id, &input.attempt_id)?,
        UpdateSource::Runner { .. } => {}
    }
    if let Some(stored) = lookup.by_idempotency_key {
        if stored.fingerprint != fingerprint {
            return Err(UpdateRejection::IdempotencyConflict);
        }
        return Ok(UpdateDecision::Replayed(stored.clone()));
    }
    check_envelope(&input)?;
    check_lifecycle(agg)?;
    let mut tx = Tx::begin(agg, now_ms);
    let node_id = authorize_source(&mut tx, source, &input.attempt_id)?;
    if !lookup.pair_is_current && facts.current_pairs >= MAX_CURRENT_PAIRS {
        return Err(UpdateRejection::TooManyPairs);
    }
    let mut bucket = facts.bucket.refilled(now_ms);
    if bucket.tokens == 0 {
        return Err(UpdateRejection::RateLimited {
            retry_at_ms: bucket.next_token_at_ms(),
        });
    }
    bucket.tokens -= 1;
    let next_facts = UpdateFacts {
        bucket,
        current_pairs: facts.current_pairs + u32::from(!lookup.pair_is_current),
    };
    tx.event(RunEvent::UpdatePublished {
        update_id: input.update_id.clone(),
        update_type: input.update_type.clone(),
        key: input.key.clone(),
        data_digest: input.data.digest,
    });
    let committed = tx.commit();
    let seq = committed.facts.run.revision;
    let current = CurrentUpdate {
        update_type: input.update_type,
        key: input.key,
        update_id: input.update_id.clone(),
        seq,
        node_id,
        attempt_id: input.attempt_id,
        data_digest: input.data.digest,
        at_ms: now_ms,
    };
    let receipt = UpdateReceipt {
        idempotency_key: input.idempotency_key,
        fingerprint,
        update_id: input.update_id,
        seq,
        at_ms: now_ms,
    };
    Ok(UpdateDecision::Accepted(Transition {
        facts: Updated {
            run: committed.facts,
            facts: next_facts,
            current,
            receipt,
        },
        outputs: committed.outputs,
    }))
}

fn check_envelope(input: &UpdateInput) -> Result<(), UpdateRejection> {
    if !is_valid_type(&input.update_type) {
        return Err(UpdateRejection::InvalidType);
    }
    if !is_valid_key(&input.key) {
        return Err(UpdateRejection::InvalidKey);
    }
    if input.data.kind != JsonKind::Object {
        return Err(UpdateRejection::DataNotObject {
            kind: input.data.kind,
        });
    }
    if input.data.encoded_bytes > MAX_DATA_BYTES {
        return Err(UpdateRejection::DataTooLarge {
            encoded_bytes: input.data.encoded_bytes,
        });
    }
    if input.data.depth > MAX_DATA_DEPTH {
        return Err(UpdateRejection::DataTooDeep {
            depth: input.data.depth,
        });
    }
    Ok(())
}

fn check_lifecycle(agg: &RunAggregate) -> Result<(), UpdateRejection> {
    let run = &agg.run;
    if run.status.is_terminal() {
        return Err(UpdateRejection::Run(run::Rejection::Terminal {
            status: run.status,
        }));
    }
    if run.paused {
        return Err(UpdateRejection::Run(run::Rejection::Paused));
    }
    Ok(())
}

/// Checks that `source` may publish for `attempt_id` and returns its node.
/// A runner's claim is renewed in `tx`.
fn authorize_source(
    tx: &mut Tx,
    source: &UpdateSource,
    attempt_id: &AttemptId,
) -> Result<NodeId, UpdateRejection> {
    let attempt = tx
        .agg
        .attempt
        .as_ref()
        .filter(|attempt| attempt.status.is_unfinished())
        .ok_or(UpdateRejection::NoUnfinishedAttempt)?;
    if attempt.attempt_id != *attempt_id {
        return Err(UpdateRejection::AttemptMismatch);
    }
    let node_id = attempt.node_id.clone();
    match source {
        UpdateSource::Runner {
            authority,
            runner_epoch,
            ttl_ms,
        } => {
            if attempt.status != AttemptStatus::Active {
                return Err(UpdateRejection::AttemptNotActive);
            }
            run::authorize_runner(tx, authority, runner_epoch, *ttl_ms)
                .map_err(UpdateRejection::Run)?;
        }
        // `publish` checked the authority and the named request's kind (and,
        // from the origin session, its session) before the receipt lookup;
        // a new update also needs the request still pending.
        UpdateSource::AgentTool { interaction_id, .. } => {
            if attempt.status != AttemptStatus::Waiting {
                return Err(UpdateRejection::AttemptNotWaiting);
            }
            check_pending(&tx.agg, interaction_id)?;
        }
        UpdateSource::HeadlessTool { interaction_id, .. } => {
            if attempt.status != AttemptStatus::Active {
                return Err(UpdateRejection::AttemptNotActive);
            }
            check_pending(&tx.agg, interaction_id)?;
        }
    }
    Ok(node_id)
}

/// The named submitted-output request of the named attempt, settled or not
/// (so that a repeat after settlement is answered): what an agent-tool
/// update, from either mode, must name.
fn agent_request<'a>(
    agg: &'a RunAggregate,
    interaction_id: &InteractionId,
    attempt_id: &AttemptId,
) -> Result<&'a crate::interaction::InteractionRecord, UpdateRejection> {
    let request = agg
        .interaction
        .as_ref()
        .filter(|request| {
            request.interaction_id == *interaction_id && request.attempt_id == *attempt_id
        })
        .ok_or(UpdateRejection::RequestMismatch)?;
    if request.kind != InteractionKind::SubmittedOutput {
        return Err(UpdateRejection::NotAgentStep);
    }
    Ok(request)
}

/// The request of an origin-session agent-tool update, checked before its
/// receipt is looked up (the shell checked the coordinator epoch with
/// `interaction::check_authority`): the named agent request, sent to this
/// session.
fn check_agent_tool(
    agg: &RunAggregate,
    session_id: &SessionId,
    interaction_id: &InteractionId,
    attempt_id: &AttemptId,
) -> Result<(), UpdateRejection> {
    let request = agent_request(agg, interaction_id, attempt_id)?;
    if request.target_session.as_ref() != Some(session_id) {
        return Err(UpdateRejection::WrongSession);
    }
    Ok(())
}

/// The authority and request of a headless agent-tool update, checked before
/// its receipt is looked up: a headless run, its live runner (generation and
/// epoch), and the named submitted-output request of the named attempt
/// (settled or not, so that a repeat after settlement is answered).
fn check_headless_tool(
    agg: &RunAggregate,
    generation: Generation,
    runner_epoch: &RunnerEpochId,
    interaction_id: &InteractionId,
    attempt_id: &AttemptId,
) -> Result<(), UpdateRejection> {
    if agg.run.mode.origin_session().is_some() {
        return Err(UpdateRejection::NotHeadless);
    }
    if !crate::interaction::is_live_runner(&agg.run, generation, runner_epoch) {
        return Err(UpdateRejection::Run(run::Rejection::StaleRunner));
    }
    agent_request(agg, interaction_id, attempt_id).map(|_| ())
}

/// The named request is still pending.
fn check_pending(
    agg: &RunAggregate,
    interaction_id: &InteractionId,
) -> Result<(), UpdateRejection> {
    let pending = agg.interaction.as_ref().is_some_and(|request| {
        request.interaction_id == *interaction_id && request.status == InteractionStatus::Pending
    });
    if pending {
        Ok(())
    } else {
        Err(UpdateRejection::RequestMismatch)
    }
}

#[cfg(test)]
mod tests;
