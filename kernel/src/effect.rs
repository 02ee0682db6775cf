//! Managed effects: side effects reserved and settled through one durable record.
//!
//! Invariants:
//! - The key is made by the engine from (run id, effect type, full compiled
//!   node path, node visit); workflow code never supplies it. One key names
//!   one effect, and reusing it with another request fingerprint is a
//!   conflict. The fingerprint stored under a key never changes, and the
//!   effect id is an injective encoding of the key.
//! - `Applied`, `Rejected` and `Cancelled` are terminal. `Ambiguous` is
//!   terminal for automatic retry: only an explicit operator `confirm`
//!   (→ `Applied`) or `retry` (→ `Reserved` with the next attempt number)
//!   leaves it.
//! - Cancellation turns `Reserved` into `Cancelled` and `Applying` into
//!   `Ambiguous`; losing the runner while `Applying` also gives `Ambiguous`,
//!   and so does the end of its node attempt or of its run with no settle
//!   reported: an effect is never left `Applying` by anything but its runner.
//! - An effect is applied at most once per attempt number: `reserve` moves
//!   an effect to `Applying` only when it is new or `Reserved`, and only the
//!   runner holding the live claim may do so. A settled effect is adopted
//!   (its stored result is returned and nothing changes), so the runner
//!   skips execution.
//! - A run parked `effectAmbiguous` becomes automatically resumable
//!   (`recovered`) once no ambiguous effect remains.

use crate::attempt::{AttemptRecord, AttemptStatus};
use crate::claim::Authority;
use crate::ids::{AttemptId, Digest, EffectId, NodeId, RunId, RunnerEpochId};
use crate::output::{Output, RunEvent, Transition};
use crate::run::{self, ParkReason, QueueStatus, RunAggregate, RunStatus, Tx};
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// The engine-made idempotency key of an effect.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EffectKey {
    pub run_id: RunId,
    pub effect_type: String,
    pub node_path: NodeId,
    pub visit: u32,
}

impl EffectKey {
    /// The deterministic effect id of this key: `effect-` and the first 32 hex
    /// digits (128 bits) of the SHA-256 of the key's length-prefixed
    /// components. It fits every wire id pattern whatever the run id or node
    /// path contain, and two keys share an id only on a hash collision (which
    /// the unique index on the key would still refuse).
    pub fn effect_id(&self) -> EffectId {
        use sha2::Digest as _;
        let mut hasher = sha2::Sha256::new();
        for component in [
            self.run_id.as_str(),
            self.effect_type.as_str(),
            self.node_path.as_str(),
        ] {
            hasher.update((component.len() as u64).to_be_bytes());
            hasher.update(component.as_bytes());
        }
        hasher.update(u64::from(self.visit).to_be_bytes());
        let digest = hasher.finalize();
        let mut id = String::from("effect-");
        for byte in &digest[..16] {
            id.push_str(&alloc::format!("{byte:02x}"));
        }
        EffectId::new(id)
    }
}

/// The key the engine makes for an effect of `effect_type` requested by
/// `attempt` of run `run_id`: the attempt's full compiled node path and its
/// visit, so a rerun of the same visit finds the same effect and the next
/// visit gets a new one.
pub fn effect_key(run_id: &RunId, attempt: &AttemptRecord, effect_type: &str) -> EffectKey {
    EffectKey {
        run_id: run_id.clone(),
        effect_type: String::from(effect_type),
        node_path: attempt.node_id.clone(),
        visit: attempt.visit,
    }
}

/// The state of one effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EffectState {
    Reserved,
    Applying,
    Applied,
    Rejected,
    Cancelled,
    Ambiguous,
}

impl EffectState {
    /// Whether automatic execution may never touch this effect again.
    pub const fn is_settled(self) -> bool {
        matches!(
            self,
            Self::Applied | Self::Rejected | Self::Cancelled | Self::Ambiguous
        )
    }
}

/// One `effects` row (with its current `effect_attempts` number).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EffectRecord {
    pub effect_id: EffectId,
    pub key: EffectKey,
    /// Digest of the canonical request; another digest under the same key is a conflict.
    pub request_fingerprint: Digest,
    pub state: EffectState,
    /// 1 for the first attempt; an explicit retry creates the next number.
    pub attempt_number: u32,
    /// The node attempt that last began applying it.
    pub node_attempt_id: Option<AttemptId>,
    /// Digest of the stored result once applied or rejected.
    pub result_digest: Option<Digest>,
}

/// What cancellation of the run does to its effects.
pub fn on_run_cancelled(effect: &EffectRecord) -> EffectRecord {
    let mut next = effect.clone();
    next.state = match effect.state {
        EffectState::Reserved => EffectState::Cancelled,
        EffectState::Applying => EffectState::Ambiguous,
        settled => settled,
    };
    next
}

/// What losing the runner (crash, pause, claim loss) does to an effect: an
/// effect that may have reached the external system becomes ambiguous; a
/// reservation that never began stays reusable. The end of the effect's node
/// attempt or of its run without a settle does the same: nobody will report
/// the outcome any more.
pub fn on_runner_lost(effect: &EffectRecord) -> EffectRecord {
    let mut next = effect.clone();
    if effect.state == EffectState::Applying {
        next.state = EffectState::Ambiguous;
    }
    next
}

/// Why an effect transition was refused. Nothing changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum EffectRejection {
    /// The run-level check failed (claim lost, stale runner, terminal run).
    Run { run: run::Rejection },
    /// The named attempt is not the run's active attempt.
    NotActiveAttempt,
    /// The key already names an effect with another request fingerprint.
    FingerprintConflict { effect_id: EffectId },
    /// The effect is applying already; a second start could apply it twice.
    AlreadyApplying { effect_id: EffectId },
    /// The effect is ambiguous: only an operator's `effect.recover` moves it.
    Ambiguous { effect_id: EffectId },
    /// The effect was cancelled with its run.
    Cancelled { effect_id: EffectId },
    /// No effect with this id exists for the run.
    NotFound { effect_id: EffectId },
    /// `settle` needs an applying effect.
    NotApplying { state: EffectState },
    /// The effect settled already with another outcome or result.
    SettleConflict { state: EffectState },
    /// `recover` needs an ambiguous effect.
    NotAmbiguous { state: EffectState },
    /// A cancelled or finished run can record an observed outcome (`confirm`)
    /// but never retries an effect.
    RetryAfterTerminal { status: RunStatus },
}

impl From<run::Rejection> for EffectRejection {
    fn from(run: run::Rejection) -> Self {
        Self::Run { run }
    }
}

/// The runner's `effect.reserve` request for its active attempt.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReserveRequest {
    pub attempt_id: AttemptId,
    pub effect_type: String,
    /// Digest of the canonical request the runner would send.
    pub request_fingerprint: Digest,
}

/// The accepted answer to `effect.reserve`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// Commit `transition`; the reply authorizes the runner to apply attempt
    /// `attempt_number` of the effect now.
    Apply {
        transition: Transition<RunAggregate>,
        effect_id: EffectId,
        attempt_number: u32,
    },
    /// The effect already settled: nothing changes and the runner skips
    /// execution, using the stored state and result digest.
    Adopt { effect: EffectRecord },
}

/// `effect.reserve`: the runner asks to apply an effect for its active
/// attempt. The engine makes the key; a new key is recorded and moves straight
/// to `Applying` (attempt 1), a `Reserved` effect (after an operator retry)
/// moves to `Applying` with its current attempt number, and a settled effect
/// is adopted without change.
///
/// `existing` is the `effects` row for the key as the shell loaded it; settled
/// effects are not part of the aggregate, so the shell must pass it. An
/// unsettled effect in the aggregate takes precedence.
///
/// # Panics
/// If `existing` names another effect than the one the key derives (the shell
/// loaded the wrong row; a broken invariant).
pub fn reserve(
    agg: &RunAggregate,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    request: ReserveRequest,
    existing: Option<&EffectRecord>,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Reserved, EffectRejection> {
    let mut tx = Tx::begin(agg, now_ms);
    run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
    let attempt = active_attempt(agg, &request.attempt_id)?;
    let key = effect_key(&agg.run.run_id, attempt, &request.effect_type);
    let effect_id = key.effect_id();
    let found = find(agg, &effect_id, existing);
    let record = match found {
        None => EffectRecord {
            effect_id: effect_id.clone(),
            key,
            request_fingerprint: request.request_fingerprint,
            state: EffectState::Reserved,
            attempt_number: 1,
            node_attempt_id: None,
            result_digest: None,
        },
        Some(effect) if effect.request_fingerprint != request.request_fingerprint => {
            return Err(EffectRejection::FingerprintConflict { effect_id });
        }
        Some(effect) => match effect.state {
            EffectState::Reserved => effect.clone(),
            EffectState::Applied | EffectState::Rejected => {
                return Ok(Reserved::Adopt {
                    effect: effect.clone(),
                });
            }
            EffectState::Applying => return Err(EffectRejection::AlreadyApplying { effect_id }),
            EffectState::Ambiguous => return Err(EffectRejection::Ambiguous { effect_id }),
            EffectState::Cancelled => return Err(EffectRejection::Cancelled { effect_id }),
        },
    };
    let attempt_number = record.attempt_number;
    let applying = EffectRecord {
        state: EffectState::Applying,
        node_attempt_id: Some(request.attempt_id),
        ..record
    };
    upsert(&mut tx.agg.effects, applying);
    tx.event(RunEvent::EffectApplying {
        effect_id: effect_id.clone(),
        attempt_number,
    });
    Ok(Reserved::Apply {
        transition: tx.commit(),
        effect_id,
        attempt_number,
    })
}

/// How the runner says an applying effect ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SettleOutcome {
    /// The external system applied it.
    Applied,
    /// The external system refused it (a definite, non-retried outcome).
    Rejected,
}

impl SettleOutcome {
    const fn state(self) -> EffectState {
        match self {
            Self::Applied => EffectState::Applied,
            Self::Rejected => EffectState::Rejected,
        }
    }
}

/// The runner's `effect.settle` report.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SettleReport {
    pub effect_id: EffectId,
    pub outcome: SettleOutcome,
    /// Digest of the stored result (the external receipt or refusal).
    pub result_digest: Digest,
}

/// The accepted answer to `effect.settle`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Commit `transition`: the effect is terminal with the reported result.
    Commit(Transition<RunAggregate>),
    /// An exact repeat of the settle that already committed; nothing changes.
    Adopt { effect: EffectRecord },
}

/// `effect.settle`: the runner reports the outcome of the effect it is
/// applying. Only `Applying` settles; an exact repeat (same outcome and
/// result digest) adopts; anything else is refused.
///
/// `settled` is the `effects` row for `effect_id` when it is no longer in the
/// aggregate (already applied or rejected), so an exact repeat can adopt it.
pub fn settle(
    agg: &RunAggregate,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    report: SettleReport,
    settled: Option<&EffectRecord>,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Settled, EffectRejection> {
    let mut tx = Tx::begin(agg, now_ms);
    run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
    let SettleReport {
        effect_id,
        outcome,
        result_digest,
    } = report;
    let effect_id = &effect_id;
    let Some(effect) = find(agg, effect_id, settled) else {
        return Err(EffectRejection::NotFound {
            effect_id: effect_id.clone(),
        });
    };
    let state = effect.state;
    match state {
        EffectState::Applying => {}
        EffectState::Applied | EffectState::Rejected
            if state == outcome.state() && effect.result_digest == Some(result_digest) =>
        {
            return Ok(Settled::Adopt {
                effect: effect.clone(),
            });
        }
        EffectState::Applied | EffectState::Rejected => {
            return Err(EffectRejection::SettleConflict { state });
        }
        EffectState::Reserved | EffectState::Cancelled | EffectState::Ambiguous => {
            return Err(EffectRejection::NotApplying { state });
        }
    }
    let next = EffectRecord {
        state: outcome.state(),
        result_digest: Some(result_digest),
        ..effect.clone()
    };
    upsert(&mut tx.agg.effects, next);
    tx.event(RunEvent::EffectSettled {
        effect_id: effect_id.clone(),
        state: outcome.state(),
    });
    Ok(Settled::Commit(tx.commit()))
}

/// An operator's reviewed recovery of an ambiguous effect (`effect.recover`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RecoveryAction {
    /// The operator observed that the effect applied.
    Confirm,
    /// Apply it again as the next numbered attempt. A duplicate in the
    /// external system is possible; the shell warns before it sends this.
    Retry,
}

/// `effect.recover`: only an ambiguous effect moves. `Confirm` makes it
/// `Applied` with `observed_result` as its result (the operator saw it
/// apply but holds no receipt: the shell passes the digest of `null`), so
/// the next runner adopts it and skips execution; `Retry` makes it
/// `Reserved` again with the next attempt number, so the next runner's
/// `reserve` applies it once more. When no ambiguous effect remains and the
/// run was parked `effectAmbiguous`, the run becomes automatically
/// resumable (`recovered`). A terminal run may record a confirmation but
/// never retries.
pub fn recover(
    agg: &RunAggregate,
    effect_id: &EffectId,
    action: RecoveryAction,
    observed_result: Digest,
    now_ms: u64,
) -> Result<Transition<RunAggregate>, EffectRejection> {
    let Some(effect) = find(agg, effect_id, None) else {
        return Err(EffectRejection::NotFound {
            effect_id: effect_id.clone(),
        });
    };
    if effect.state != EffectState::Ambiguous {
        return Err(EffectRejection::NotAmbiguous {
            state: effect.state,
        });
    }
    let status = agg.run.status;
    if action == RecoveryAction::Retry && status.is_terminal() {
        return Err(EffectRejection::RetryAfterTerminal { status });
    }
    let next = match action {
        RecoveryAction::Confirm => EffectRecord {
            state: EffectState::Applied,
            result_digest: Some(effect.result_digest.unwrap_or(observed_result)),
            ..effect.clone()
        },
        RecoveryAction::Retry => EffectRecord {
            state: EffectState::Reserved,
            attempt_number: effect.attempt_number.saturating_add(1),
            ..effect.clone()
        },
    };
    let mut tx = Tx::begin(agg, now_ms);
    upsert(&mut tx.agg.effects, next);
    tx.event(RunEvent::EffectRecovered {
        effect_id: effect_id.clone(),
        action,
    });
    release_review_park_in(&mut tx);
    Ok(tx.commit())
}

/// A run parked for effect review becomes claimable again once nothing is ambiguous.
fn release_review_park_in(tx: &mut Tx) {
    let run = &tx.agg.run;
    let parked_for_review = (run.status, run.queue) == (RunStatus::Running, QueueStatus::Parked)
        && run.park_reason == Some(ParkReason::EffectAmbiguous);
    if !parked_for_review || tx.agg.has_ambiguous_effect() {
        return;
    }
    tx.agg.run.park_reason = Some(ParkReason::Recovered);
    tx.event(RunEvent::Parked {
        reason: ParkReason::Recovered,
    });
    tx.output(Output::Schedule);
}

fn active_attempt<'agg>(
    agg: &'agg RunAggregate,
    attempt_id: &AttemptId,
) -> Result<&'agg AttemptRecord, EffectRejection> {
    agg.attempt
        .as_ref()
        .filter(|attempt| attempt.status == AttemptStatus::Active)
        .filter(|attempt| attempt.attempt_id == *attempt_id)
        .ok_or(EffectRejection::NotActiveAttempt)
}

/// The effect named `effect_id`: the aggregate's unsettled copy first, then the
/// row the shell loaded.
fn find<'a>(
    agg: &'a RunAggregate,
    effect_id: &EffectId,
    loaded: Option<&'a EffectRecord>,
) -> Option<&'a EffectRecord> {
    if let Some(loaded) = loaded {
        assert_eq!(
            &loaded.effect_id, effect_id,
            "the shell loaded another effect than the one asked for"
        );
    }
    agg.effects
        .iter()
        .find(|effect| effect.effect_id == *effect_id)
        .or(loaded)
}

/// Replaces the effect of `record`'s id in `effects`, or adds it.
pub(crate) fn upsert(effects: &mut alloc::vec::Vec<EffectRecord>, record: EffectRecord) {
    match effects
        .iter_mut()
        .find(|effect| effect.effect_id == record.effect_id)
    {
        Some(slot) => *slot = record,
        None => effects.push(record),
    }
}

#[cfg(test)]
mod tests;
