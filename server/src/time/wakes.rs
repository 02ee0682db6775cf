//! Time-driven work: node deadlines, decision deadlines, stale-claim
//! recovery, the backup claim renewal and the server lease.
//!
//! Invariants:
//! - The timer renews only claims of runners that are alive and not stopped
//!   (a SIGSTOPped runner's claim is allowed to expire, so recovery can fence
//!   it). Correctness never depends on the timer: every protected write
//!   checks and renews its own claim.
//! - A server whose epoch another server took (a `Stale` renewal, possible
//!   only if the global lock was bypassed) stops at once: it is no longer
//!   the server. A renewal that could not be stored (a full disk) is not a
//!   lost epoch: the server holds the global lock, so no other server can
//!   take the epoch; it goes on serving and renews at the next tick (see
//!   docs/ARCHITECTURE.md, "Server epoch and the global lock").
//! - Wakes are hints: each one re-reads committed facts and lets the kernel
//!   decide, so a late or duplicate wake changes nothing.

use crate::context::Context;
use crate::context::wakes::Wake;
use crate::shell::{self, Applied};
use crate::store::blobs::Blob;
use crate::store::{Commit, attempts, meta, runs};
use kernel::execution::DEADLINE_MESSAGE;
use kernel::ids::{AttemptId, RunId};
use kernel::output::{Output, WakeReason};
use std::sync::Arc;
use std::time::Duration;

/// Whether a scheduled wake can still change something (keeps the server
/// alive): a node deadline of a still-unfinished attempt, a claim expiry of
/// a run that holds a claim, a decision deadline of a run that is not
/// terminal. A wake that can only find nothing to do (its attempt finished,
/// its run ended) does not keep an idle server running until it fires.
pub async fn has_live_wakes(app: &Arc<Context>) -> bool {
    let scheduled = app.timers.scheduled();
    if scheduled.is_empty() {
        return false;
    }
    app.store
        .read(move |connection| {
            for (run_id, reason) in &scheduled {
                let live = crate::store::runs::wake_can_act(connection, run_id, reason)?;
                if live {
                    return Ok(true);
                }
            }
            Ok(false)
        })
        .await
        .unwrap_or(true)
}

/// Fires wakes as they come due.
pub async fn run_wakes(app: Arc<Context>) {
    loop {
        if app.is_stopping() {
            return;
        }
        let now_ms = app.clock.now_ms();
        match app.timers.next_due(now_ms) {
            Ok(wake) => fire(&app, wake).await,
            Err(next) => {
                let wait = next.map_or(Duration::from_secs(1), |at| {
                    Duration::from_millis(at.saturating_sub(now_ms))
                });
                let _ = tokio::time::timeout(
                    wait.min(Duration::from_secs(1)),
                    app.timers.changed.notified(),
                )
                .await;
            }
        }
    }
}

/// Fires one due wake (the wake loop's work; the simulation's too).
pub(crate) async fn fire(app: &Arc<Context>, wake: Wake) {
    match wake.reason {
        WakeReason::NodeDeadline { attempt_id } => {
            expire_node(app, wake.run_id, attempt_id).await;
        }
        WakeReason::ClaimExpiry => {
            recover_stale(app, wake.run_id).await;
        }
        WakeReason::DecisionDeadline => {
            decision_deadline(app, wake.run_id).await;
        }
    }
}

/// A decision-deadline wake: `kernel::decision::on_deadline` decides. At
/// the deadline the `onTimeout` default is accepted (provenance `timeout`)
/// and the parent continues, or, without a default, the decision expires
/// and the run times out; both under one control claim. A deadline still
/// ahead defers to it; a paused run waits for resume, which arms the wake
/// again; a decision that is no longer pending changes nothing.
pub(crate) async fn decision_deadline(app: &Arc<Context>, run_id: RunId) {
    use kernel::decision::{DeadlineStep, Expiry};
    let control = app.control.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    let _ = shell::transact(app, move |connection, now_ms| {
        let Some(parent) = runs::load(connection, &run_id)? else {
            return Ok(Commit::Discard(((), Vec::new())));
        };
        let Some(decision) = parent.decision.clone() else {
            return Ok(Commit::Discard(((), Vec::new())));
        };
        let Some(continuation) =
            crate::continuation::for_decision(connection, &parent, &decision, control)?
        else {
            return Ok(Commit::Discard(((), Vec::new())));
        };
        let outputs = match kernel::decision::on_deadline(
            &parent,
            &decision,
            &continuation,
            now_ms,
            ttl_ms,
        ) {
            Ok(DeadlineStep::Expire(Expiry::Defaulted(continued))) => {
                let default =
                    crate::store::decisions::request(connection, &run_id, &decision.node_id)?
                        .and_then(|request| request.default_response);
                let Some(default) = default else {
                    return Ok(Commit::Discard(((), Vec::new())));
                };
                let response = Blob::json(&crate::wire::decision::response_value(&default));
                crate::continuation::write_continued(
                    connection, &parent, continued, &response, now_ms,
                )?
            }
            Ok(DeadlineStep::Expire(Expiry::Expired {
                parent: expired, ..
            })) => shell::write_transition(connection, Some(&parent), expired, &[], now_ms)?,
            Ok(DeadlineStep::Defer { at_ms }) => vec![Output::Wake {
                run_id: run_id.clone(),
                at_ms,
                reason: WakeReason::DecisionDeadline,
            }],
            Ok(DeadlineStep::Nothing) | Err(_) => Vec::new(),
        };
        Ok(Commit::Keep(((), outputs)))
    })
    .await;
}

/// A node-deadline wake: `kernel::execution::on_node_deadline` decides (it
/// defers while the deadline or another owner's claim is still ahead).
async fn expire_node(app: &Arc<Context>, run_id: RunId, attempt_id: AttemptId) -> Applied {
    let runners = app.clone();
    let control = app.control.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    let stored_attempt = attempt_id.clone();
    let stored_run = run_id.clone();
    let clock = app.clock.clone();
    shell::apply_then(
        app,
        run_id,
        move |connection, before, now_ms| {
            let host = runners.runners.authority_for(&before.run.run_id);
            let topology = match meta::load(connection, &before.run.run_id)? {
                Some(meta) => meta::topology(connection, &meta.definition_digest)?,
                None => None,
            };
            // A run without its stored topology is a broken store, not a decision.
            let topology = topology.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
            Ok(kernel::execution::on_node_deadline(
                before,
                &topology,
                host.as_ref(),
                control,
                &attempt_id,
                now_ms,
                ttl_ms,
            ))
        },
        move |connection, after| {
            let now_ms = clock.now_ms();
            let stored = attempts::AttemptResult {
                error_message: Some(DEADLINE_MESSAGE.into()),
                ..Default::default()
            };
            attempts::record_result(connection, &stored_run, &stored_attempt, &stored, now_ms)?;
            if after.run.error.is_some() {
                runs::record_error_message(connection, &stored_run, DEADLINE_MESSAGE)?;
            }
            Ok(())
        },
    )
    .await
}

/// A claim-expiry wake (or a claim startup found expired):
/// `kernel::runner::on_claim_expired` decides, given whether this server
/// supervises a runner of the run.
async fn recover_stale(app: &Arc<Context>, run_id: RunId) -> Applied {
    let supervised = app.runners.runner_of(&run_id).is_some();
    let control = app.control.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    shell::apply(app, run_id, move |_, before, now_ms| {
        Ok(kernel::runner::on_claim_expired(
            before, supervised, control, now_ms, ttl_ms,
        ))
    })
    .await
}

/// Renews live runners' claims (backup) and the server lease; schedules
/// recovery of expired rows.
pub async fn run_renewal(app: Arc<Context>) {
    let interval = app
        .config
        .claim_renew_interval()
        .min(app.config.server_lease_renew_interval());
    loop {
        tokio::time::sleep(interval).await;
        if app.is_stopping() {
            return;
        }
        match renew_epoch(&app).await {
            Renewal::Renewed | Renewal::NotStored => {}
            Renewal::TakenOver => {
                // Another server took the epoch: this process must not write again.
                crate::log::line(
                    "another server took this server's epoch (was the server lock file removed?); stopping",
                );
                app.request_stop();
                return;
            }
        }
        renew_claims(&app).await;
        schedule_expired(&app).await;
    }
}

/// What became of one lease renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewal {
    Renewed,
    /// The kernel refused it: another server holds the epoch.
    TakenOver,
    /// The write failed (the store logged why, e.g. a full disk); retried at
    /// the next tick.
    NotStored,
}

async fn renew_epoch(app: &Arc<Context>) -> Renewal {
    let epoch = app.epoch;
    let owner = app.server_owner.clone();
    let lease_ms = app.config.server_lease_ms;
    let clock = app.clock.clone();
    app.store
        .write(move |connection| {
            let now_ms = clock.now_ms();
            let facts = crate::store::host::load(connection)?;
            match kernel::epoch::renew(&facts, epoch, &owner, now_ms, lease_ms) {
                Ok(next) => {
                    crate::store::host::write(connection, &next, now_ms)?;
                    Ok(Commit::Keep(Renewal::Renewed))
                }
                Err(kernel::epoch::EpochRejection::Stale { .. }) => {
                    Ok(Commit::Discard(Renewal::TakenOver))
                }
            }
        })
        .await
        .unwrap_or(Renewal::NotStored)
}

async fn renew_claims(app: &Arc<Context>) {
    let runners: Vec<_> = app
        .runners
        .all()
        .into_iter()
        .filter(|runner| !runner.is_fenced())
        .filter(|runner| {
            runner
                .identity()
                .is_some_and(|identity| !crate::process::is_stopped(&identity))
        })
        .map(|runner| (runner.run_id.clone(), runner.authority.clone()))
        .collect();
    if runners.is_empty() {
        return;
    }
    let ttl_ms = app.config.claim_ttl_ms;
    let clock = app.clock.clone();
    let _ = app
        .store
        .write(move |connection| {
            let now_ms = clock.now_ms();
            for (run_id, authority) in runners {
                let Some(before) = runs::load(connection, &run_id)? else {
                    continue;
                };
                if let Ok(lease) =
                    kernel::claim::renew_by_timer(&before.run.lease, &authority, now_ms, ttl_ms)
                {
                    let mut after = before.clone();
                    after.run.lease = lease;
                    runs::write(connection, Some(&before), &after, &[], now_ms)?;
                }
            }
            Ok(Commit::Keep(()))
        })
        .await;
}

/// Finds running rows whose claims expired and schedules their recovery.
pub async fn schedule_expired(app: &Arc<Context>) {
    let clock = app.clock.clone();
    let expired = app
        .store
        .read(move |connection| {
            crate::store::runs::expired_running_claims(connection, clock.now_ms())
        })
        .await
        .unwrap_or_default();
    let now_ms = app.clock.now_ms();
    for run_id in expired {
        app.timers.wake(run_id, now_ms, WakeReason::ClaimExpiry);
    }
}
