//! Startup recovery, in the seed's order for everything that does not need Pi.
//!
//! 1. The server epoch is taken (by `Context::open`).
//! 2. Runner records of earlier epochs are reaped when the exact process
//!    (pid and start time) is still alive; registered child groups too. A
//!    server that cannot read these records does not start (never a silent
//!    skip of orphan detection).
//! 3. Running rows and active attempts are found; an expired claim is
//!    recovered now, a live one when it expires (a new generation either way).
//! 4. Effect state is read before work may repeat, and
//! 5. parking turns an applying effect ambiguous, which blocks automatic
//!    resumption.
//! 6. Pure and settled work becomes claimable (`recovered`) and the scheduler
//!    admits it.
//! 7. Pending interactive requests and workflow messages are left untouched;
//!    a terminal workflow message a crash left unbuilt is built
//!    (`terminal_messages::build_missing`); pending protected decisions get
//!    their deadline wake again, and an accepted decision without a
//!    continuation (left by an older writer) is continued
//!    (`kernel::decision::recover`, prepare-or-adopt).
//! 8. Interactive node timeouts are model-turn time: every turn clock the
//!    previous server left running stops at its last sign of life
//!    (`kernel::epoch::last_alive_ms`), so server downtime consumes none,
//!    and a request whose budget is already spent is woken now for its
//!    timeout path, before other work is scheduled. A clock runs again only
//!    when a reconnected coordinator reports its turn.
//! 9. Every submission still `validating` gets a new validation child
//!    (`validator::resume_validating`); the kernel takes only its first verdict.

use crate::children::supervisor::kill_exact;
use crate::context::Context;
use crate::process::ProcessIdentity;
use crate::store::{Commit, StoreError};
use kernel::ids::{RunId, RunnerEpochId};
use kernel::output::WakeReason;
use kernel::runner::{ExitKind, RunnerExit};
use std::sync::Arc;

/// Runs startup recovery. A server that cannot read the runner records of
/// the server before it refuses to start with the store's error: going on
/// would skip orphan detection and leave their runs waiting for runners that
/// are gone.
pub async fn startup(app: &Arc<Context>) -> Result<(), StoreError> {
    let stale = app.store.read(stale_processes).await?;
    for identity in stale
        .iter()
        .filter_map(|(_, _, identity)| identity.as_ref())
    {
        kill_exact(identity);
    }
    // Each orphan is its own transaction; submitted together, the writer
    // commits them in batches (one fsync for many runs, not one each).
    let mut recording = tokio::task::JoinSet::new();
    for (run_id, runner_epoch, _) in stale {
        let app = app.clone();
        recording.spawn(async move { orphaned(&app, run_id, runner_epoch).await });
    }
    while let Some(recorded) = recording.join_next().await {
        if let Err(error) = recorded {
            // As before the tasks: a panic here is the server's panic.
            std::panic::resume_unwind(error.into_panic());
        }
    }
    stop_turn_clocks(app).await;
    release_abandoned_reconciles(app).await?;
    crate::terminal_messages::build_missing(app).await;
    crate::time::wakes::schedule_expired(app).await;
    decisions(app).await?;
    crate::children::validator::resume_validating(app).await;
    app.scheduler.notify();
    Ok(())
}

/// Recovery step 8 (see the module comment).
async fn stop_turn_clocks(app: &Arc<Context>) {
    let stopped_at = kernel::epoch::last_alive_ms(&app.previous_host, app.config.server_lease_ms);
    let running = app
        .store
        .read(crate::store::sessions::with_running_clocks)
        .await
        .unwrap_or_default();
    for session_id in running {
        let nobody = kernel::session::CoordinatorFacts::new(session_id);
        let stopped = crate::turn_clocks::suspend(app, nobody, Some(stopped_at)).await;
        if stopped.is_err() {
            crate::log::line("a turn clock the previous server left running could not be stopped");
        }
    }
    let clocks = app
        .store
        .read(crate::store::sessions::pending_clocks)
        .await
        .unwrap_or_default();
    let now_ms = app.clock.now_ms();
    for (run_id, attempt_id, clock) in clocks {
        if let Some(at_ms) = clock.deadline_at_ms(now_ms) {
            app.timers
                .wake(run_id, at_ms, WakeReason::NodeDeadline { attempt_id });
        }
    }
}

/// Arms the deadline wake of every pending decision and continues every
/// accepted decision that has none.
async fn decisions(app: &Arc<Context>) -> Result<(), StoreError> {
    let (deadlines, accepted) = app
        .store
        .read(|connection| {
            Ok((
                crate::store::decisions::pending_deadlines(connection)?,
                crate::store::decisions::accepted_without_continuation(connection)?,
            ))
        })
        .await?;
    for (run_id, at_ms) in deadlines {
        app.timers
            .wake(run_id, at_ms, kernel::output::WakeReason::DecisionDeadline);
    }
    for run_id in accepted {
        continue_accepted(app, run_id).await;
    }
    Ok(())
}

/// Continues the accepted decision of `run_id` (prepare, or adopt a
/// compatible child; an incompatible one changes nothing).
async fn continue_accepted(app: &Arc<Context>, run_id: RunId) {
    use kernel::decision::Recovered;
    let control = app.control.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    let _ = crate::shell::transact(app, move |connection, now_ms| {
        let nothing = || Ok(Commit::Discard(((), Vec::new())));
        let Some(parent) = crate::store::runs::load(connection, &run_id)? else {
            return nothing();
        };
        let Some(decision) = crate::store::decisions::for_checkpoint(connection, &parent)? else {
            return nothing();
        };
        let (Some(continuation), Some(response)) = (
            crate::continuation::for_decision(connection, &parent, &decision, control)?,
            crate::store::decisions::response(connection, &decision)?,
        ) else {
            return nothing();
        };
        let existing = crate::continuation::existing_child(connection, &parent)?;
        match kernel::decision::recover(
            &parent,
            &decision,
            existing.as_ref(),
            &continuation,
            now_ms,
            ttl_ms,
        ) {
            Ok(Recovered::Prepared(continued)) => {
                let response = crate::store::blobs::Blob::json(&response);
                let outputs = crate::continuation::write_continued(
                    connection, &parent, continued, &response, now_ms,
                )?;
                Ok(Commit::Keep(((), outputs)))
            }
            Ok(Recovered::Adopted { .. }) | Err(_) => nothing(),
        }
    })
    .await;
}

type Stale = (RunId, RunnerEpochId, Option<ProcessIdentity>);

/// Runner records that were live when an earlier server stopped, and the
/// child groups they registered.
fn stale_processes(connection: &rusqlite::Connection) -> rusqlite::Result<Vec<Stale>> {
    let mut stale: Vec<Stale> = crate::store::processes::live_runner_records(connection)?
        .into_iter()
        .map(|(run_id, epoch, identity)| {
            (
                run_id,
                epoch,
                identity.as_deref().and_then(ProcessIdentity::decode),
            )
        })
        .collect();
    let registered: Vec<Stale> = crate::store::processes::registered_children(connection)?
        .into_iter()
        .map(|(epoch, identity)| (RunId::new(""), epoch, ProcessIdentity::decode(&identity)))
        .collect();
    // Registered children are only killed; their runner's record decides.
    stale.extend(
        registered
            .into_iter()
            .map(|(_, epoch, identity)| (RunId::new(""), epoch, identity)),
    );
    Ok(stale)
}

/// Records an orphaned runner and lets the kernel decide its run; a claim that
/// is still live is recovered when it expires.
async fn orphaned(app: &Arc<Context>, run_id: RunId, runner_epoch: RunnerEpochId) {
    if run_id.as_str().is_empty() {
        let _ = app
            .store
            .write(move |connection| {
                crate::store::processes::forget_registered(connection, &runner_epoch)?;
                Ok(Commit::Keep(()))
            })
            .await;
        return;
    }
    let control = app.control.clone();
    let ttl_ms = app.config.claim_ttl_ms;
    let exit = RunnerExit {
        runner_epoch,
        kind: ExitKind::Orphaned,
    };
    crate::shell::apply(app, run_id, move |_, before, now_ms| {
        Ok(kernel::runner::on_exit(
            before, exit, None, control, now_ms, ttl_ms,
        ))
    })
    .await;
}

/// Claims of reconcile passes of a previous server are released: their
/// children are gone, and the rows are available again at once
/// (`kernel::reconcile::release_abandoned`).
async fn release_abandoned_reconciles(app: &Arc<Context>) -> Result<(), StoreError> {
    let now_ms = app.clock.now_ms();
    app.store
        .write(move |connection| {
            crate::store::resources::release_abandoned(connection, now_ms)?;
            Ok(crate::store::Commit::Keep(()))
        })
        .await
}
