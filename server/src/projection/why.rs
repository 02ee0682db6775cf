//! The stuck-run explainer's wire documents: `run.why`'s [`wire::RunWhy`]
//! and the run view's `display.why` ([`wire::WhyHeadline`]), built from the
//! kernel's decision (`kernel::why`) field by field.
//!
//! Invariant: nothing here adds a fact or a word; every value is the
//! kernel's, checked against its schema type (a value off its schema is
//! [`OffSchema`], never a partial document).

use super::run_view::{OffSchema, to_wire};
use kernel::claim::OwnerKind;
use kernel::ids::RunId;
use kernel::runner::RunnerStatus;
use kernel::why::{Headline, Why};
use protocol::generated::constrained as bounded;
use protocol::generated::types as wire;

/// `display.why`: the durable headline.
pub fn headline(headline: &Headline) -> Result<wire::WhyHeadline, OffSchema> {
    Ok(wire::WhyHeadline {
        actor: to_wire("why.actor", headline.actor)?,
        state: to_wire("why.state", headline.state)?,
        summary: to_wire("why.summary", &headline.summary)?,
    })
}

fn timestamp(field: &'static str, ms: u64) -> Result<bounded::TimestampMs, OffSchema> {
    bounded::TimestampMs::new(ms).ok_or(OffSchema(field))
}

fn count(field: &'static str, n: u64) -> Result<bounded::Count, OffSchema> {
    bounded::Count::new(n).ok_or(OffSchema(field))
}

/// The `run.why` receipt.
pub fn run_why(run_id: &RunId, why: &Why) -> Result<wire::RunWhy, OffSchema> {
    let lines = why
        .lines
        .iter()
        .map(|line| to_wire("lines", line))
        .collect::<Result<Vec<wire::SafeMessage>, _>>()?;
    let claim = why
        .claim
        .map(|(claim, live)| {
            Ok::<_, OffSchema>(wire::WhyClaim {
                expires_at_ms: timestamp("claim.expiresAtMs", claim.expires_at_ms)?,
                generation: bounded::Generation::new(claim.generation)
                    .ok_or(OffSchema("claim.generation"))?,
                live,
                owner: match claim.owner {
                    OwnerKind::Host => wire::WhyClaimOwner::Runner,
                    OwnerKind::Control => wire::WhyClaimOwner::Control,
                },
            })
        })
        .transpose()?;
    let runner = why
        .runner
        .map(|runner| {
            let (state, outcome) = match runner.status {
                RunnerStatus::Launching => (wire::WhyRunnerState::Starting, None),
                RunnerStatus::Ready => (wire::WhyRunnerState::Ready, None),
                RunnerStatus::Exited(outcome) => (
                    wire::WhyRunnerState::Exited,
                    Some(to_wire("runner.outcome", outcome)?),
                ),
            };
            Ok::<_, OffSchema>(wire::WhyRunner {
                last_message_at_ms: runner
                    .last_message_at_ms
                    .map(|ms| timestamp("runner.lastMessageAtMs", ms))
                    .transpose()?,
                outcome,
                since_ms: timestamp("runner.sinceMs", runner.since_ms)?,
                state,
            })
        })
        .transpose()?;
    let pending = why
        .pending
        .as_ref()
        .map(|(pending, by)| {
            Ok::<_, OffSchema>(wire::WhyPending {
                answered_by: to_wire("pending.answeredBy", by)?,
                expires_at_ms: pending
                    .expires_at_ms
                    .map(|ms| timestamp("pending.expiresAtMs", ms))
                    .transpose()?,
                kind: to_wire("pending.kind", pending.request)?,
                node_id: pending
                    .node
                    .as_ref()
                    .map(|node| to_wire("pending.nodeId", node))
                    .transpose()?,
            })
        })
        .transpose()?;
    let effects = why
        .effects
        .iter()
        .map(|effect| {
            Ok(wire::WhyEffect {
                attempt_number: bounded::AttemptNumber::new(u64::from(effect.attempt_number))
                    .ok_or(OffSchema("ambiguousEffects.attemptNumber"))?,
                confirm: to_wire("ambiguousEffects.confirm", &effect.confirm)?,
                effect_id: to_wire("ambiguousEffects.effectId", &effect.effect_id)?,
                retry: to_wire("ambiguousEffects.retry", &effect.retry)?,
            })
        })
        .collect::<Result<Vec<_>, OffSchema>>()?;
    let queue = why
        .queue
        .map(|queue| {
            Ok::<_, OffSchema>(wire::WhyQueue {
                capacity: count("queue.capacity", queue.capacity)?,
                live_runners: count("queue.liveRunners", queue.live_runners)?,
                position: count("queue.position", queue.position)?,
            })
        })
        .transpose()?;
    let commit = &why.last_commit;
    Ok(wire::RunWhy {
        actor: to_wire("actor", why.headline.actor)?,
        ambiguous_effects: if effects.is_empty() {
            None
        } else {
            Some(bounded::WhyEffects::new(effects).map_err(|_| OffSchema("ambiguousEffects"))?)
        },
        claim,
        last_commit: wire::WhyCommit {
            at_ms: timestamp("lastCommit.atMs", commit.at_ms)?,
            event: commit
                .event
                .as_ref()
                .map(|event| to_wire("lastCommit.event", event))
                .transpose()?,
            revision: bounded::Revision::new(commit.revision)
                .ok_or(OffSchema("lastCommit.revision"))?,
        },
        lines: bounded::WhyLines::new(lines).map_err(|_| OffSchema("lines"))?,
        park: why.park.map(|park| to_wire("park", park)).transpose()?,
        pending,
        queue,
        run_id: to_wire("runId", run_id)?,
        runner,
        state: to_wire("state", why.headline.state)?,
        summary: to_wire("summary", &why.headline.summary)?,
    })
}
