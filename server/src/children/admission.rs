//! Admission: the one scheduler that turns eligible runs into runners.
//!
//! Invariants:
//! - Capacity counts live runners and launches being admitted; it is never
//!   exceeded (`kernel::scheduler::admit_next` decides which runs go).
//! - Requests stay durable while capacity is full: a queued run waits in
//!   SQLite, not in memory.
//! - Eligibility is the kernel's (`RunRecord::is_admissible`); the query only
//!   narrows the candidates.
//! - Resource-manager work is admitted here too (`WorkKind::ResourceManager`,
//!   from claimable `resource_queue` rows): a reconcile pass holds one slot
//!   from its claim until its child is gone (`children::controller`). The
//!   loop also wakes at the earliest due row (`resources::next_due_at`).
//! - Validation children are admitted here too (`WorkKind::Validation`, from
//!   the durable `validating` rows); the one of a run whose live runner waits
//!   for it works in that runner's slot (`validator`'s invariants).
//! - A resolver waiting for its run (`context::waiting`) is decided by the
//!   first round that begins after its start committed: the round's
//!   admission of the run hands it the launch (`supervisor::launch`), and a
//!   round that does not admit the run ends it. No process waits for
//!   capacity.

use crate::context::Context;
use crate::store::runs;
use kernel::claim::{Authority, OwnerKind};
use kernel::ids::{OwnerId, RunId, RunnerEpochId, SubmissionId};
use kernel::output::Step;
use kernel::scheduler::{Candidate, Capacity, WorkKind};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// Runs admission rounds until the server stops: on every notification and
/// at least once a second.
pub async fn run(app: Arc<Context>) {
    let mut wait = Duration::from_secs(1);
    loop {
        let _ = tokio::time::timeout(wait, app.scheduler.notify.notified()).await;
        if app.is_stopping() {
            return;
        }
        admit_round(&app).await;
        wait = next_wait(&app).await;
    }
}

/// Until the earliest due resource row (a backoff or `requeueAfter`), at most a second.
async fn next_wait(app: &Arc<Context>) -> Duration {
    let now_ms = app.clock.now_ms();
    let due = app
        .store
        .read(crate::store::resources::next_due_at)
        .await
        .ok()
        .flatten();
    let second = Duration::from_secs(1);
    due.map_or(second, |at_ms| {
        Duration::from_millis(at_ms.saturating_sub(now_ms).max(5)).min(second)
    })
}

/// One admission round (the loop's work; the simulation's too).
pub(crate) async fn admit_round(app: &Arc<Context>) {
    let offered = app.waiting.offered();
    admit_all(app).await;
    app.waiting.end(&offered);
}

/// Admits runs and validation children until capacity or candidates run out.
async fn admit_all(app: &Arc<Context>) {
    loop {
        let reader = app.clone();
        // Taken before the read's snapshot: a child whose verdict commits
        // after that snapshot still counts as in flight (its row still
        // reads `validating` there), so it is never started twice.
        let in_flight = app.validations.in_flight_now();
        let now_ms = app.clock.now_ms();
        let Ok((mut candidates, mut validations, resource_rows)) = app
            .store
            .read(move |connection| {
                let (candidates, validations) = candidates(&reader, &in_flight, connection)?;
                let rows = crate::children::controller::candidates(&reader, connection, now_ms)?;
                Ok((candidates, validations, rows))
            })
            .await
        else {
            return;
        };
        // A resource row competes under a name no run id can take.
        let resource_name = |uid: &str| RunId::new(format!("resource {uid}"));
        candidates.extend(resource_rows.iter().map(|row| Candidate {
            run_id: resource_name(&row.uid),
            kind: WorkKind::ResourceManager,
            queued_at_ms: row.row.available_at_ms.unwrap_or(now_ms),
        }));
        // A child in its live runner's slot needs no free one.
        validations.retain(|job| {
            if job.runner_is_live {
                crate::children::validator::start(app, job.clone(), false);
            }
            !job.runner_is_live
        });
        let occupied =
            (app.runners.occupied() + app.validations.slots_taken() + app.reconciles.live()) as u32;
        let max_workers = app.config.max_workers;
        if occupied >= max_workers {
            return;
        }
        let capacity = Capacity {
            max_workers,
            live_workers: occupied,
            pending_launches: 0,
        };
        let last_kind = *app.scheduler.last_kind.lock().expect("scheduler lock");
        let admission = kernel::scheduler::admit_next(capacity, &candidates, last_kind);
        *app.scheduler.last_kind.lock().expect("scheduler lock") = admission.last_kind;
        let chosen = admission.admitted;
        if chosen.is_empty() {
            return;
        }
        let mut admitted_any = false;
        for run_id in chosen {
            if let Some(row) = resource_rows
                .iter()
                .find(|row| resource_name(&row.uid) == run_id)
            {
                admitted_any |= crate::children::controller::admit(app, row.uid.clone()).await;
                continue;
            }
            let validation = validations
                .iter()
                .position(|job| job.run_id == run_id)
                .map(|at| validations.swap_remove(at));
            match validation {
                Some(job) => {
                    crate::children::validator::start(app, job, true);
                    admitted_any = true;
                }
                None => admitted_any |= admit(app, run_id).await,
            }
        }
        if !admitted_any {
            return;
        }
    }
}

/// Runs that may be admissible, oldest first (the kernel decides), with the
/// validation jobs waiting for a child (those that need a slot are candidates).
fn candidates(
    app: &Context,
    in_flight: &BTreeSet<SubmissionId>,
    connection: &rusqlite::Connection,
) -> rusqlite::Result<(Vec<Candidate>, Vec<crate::children::validator::Job>)> {
    let rows = runs::admission_candidates(connection)?;
    let validations = crate::children::validator::waiting(app, in_flight, connection)?;
    let mut candidates: Vec<Candidate> = validations
        .iter()
        .filter(|job| !job.runner_is_live)
        .map(|job| Candidate {
            run_id: job.run_id.clone(),
            kind: WorkKind::Validation,
            queued_at_ms: job.submitted_at_ms,
        })
        .collect();
    for (run_id, queued_at_ms) in rows {
        let Some(agg) = runs::load(connection, &run_id)? else {
            continue;
        };
        if agg.run.is_admissible() && !agg.has_ambiguous_effect() {
            candidates.push(Candidate {
                run_id,
                kind: WorkKind::Workflow,
                queued_at_ms: queued_at_ms as u64,
            });
        }
    }
    Ok((candidates, validations))
}

/// Admits one run: a new host claim and runner epoch, committed before the
/// runner is spawned. Returns whether it was admitted.
async fn admit(app: &Arc<Context>, run_id: RunId) -> bool {
    let runner_epoch = RunnerEpochId::new(format!("re-{}", crate::ids::random_hex::<8>()));
    let token_hash = crate::ids::sha256(&crate::ids::random_bytes::<32>());
    app.runners.reserve_slot(runner_epoch.clone());
    let ttl_ms = app.config.claim_ttl_ms;
    let epoch_for_job = runner_epoch.clone();
    let job_app = app.clone();
    let applied = crate::shell::apply(app, run_id, move |_, before, now_ms| {
        let decided = kernel::run::admit(before, epoch_for_job.clone(), token_hash, now_ms, ttl_ms);
        if let Ok(transition) = &decided {
            // The authority is known before the commit, so a command in
            // the next job already acts as this claim's owner.
            let authority = Authority {
                owner_kind: OwnerKind::Host,
                owner_id: OwnerId::new(epoch_for_job.as_str()),
                token_hash,
                generation: transition.facts.run.lease.generation,
            };
            job_app
                .runners
                .prepare(epoch_for_job, before.run.run_id.clone(), authority);
        }
        Ok(decided.map(Step::Apply))
    })
    .await;
    if !applied.changed() {
        app.runners.forget(&runner_epoch);
    }
    applied.changed()
}
