//! `pi-workflows server run`: the server's main loop.
//!
//! Invariants:
//! - The ready line is printed only after the epoch is taken, recovery ran
//!   and the socket accepts connections. Nothing waits for a crashed
//!   server's lease: the global lock already proves it is gone.
//! - The server stays alive while it has a client, a runner, a running
//!   retention sweep, a scheduled wake that can still change something,
//!   admissible work, or a running channel adapter and a pending decision, and exits after `PI_WORKFLOWS_IDLE_EXIT_MS` of none.
//! - Shutdown waits for in-flight commands to store their receipts, parks
//!   live runs at their last durable boundary, stops runner groups and
//!   releases the epoch lease.

use crate::app::{self, StartError};
use crate::children::admission;
use crate::client_api::socket;
use crate::config::Config;
use crate::context::Context;
use crate::fault::Faults;
use crate::time::{recovery, sweep, wakes};
use kernel::output::{Step, StopReason};
use kernel::run::ParkReason;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How the ready handshake is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Print `ready <epoch>` (or `error <message>`) on stdout for `server start`.
    Line,
    /// Print a human sentence on stderr (attached `server run`).
    Human,
}

/// Runs the server until it stops. Returns the one-line error on failure.
pub async fn run(config: Config, faults: Faults, readiness: Readiness) -> Result<(), StartError> {
    let (app, lock) = app::open(config, faults).await?;
    recovery::startup(&app).await.map_err(StartError::State)?;
    let listener = socket::bind(&app)
        .map_err(|_| StartError::Other("cannot bind the server socket".into()))?;
    let channels = crate::channels::configure(&app);
    report_ready(&app, readiness);
    tokio::spawn(admission::run(app.clone()));
    tokio::spawn(wakes::run_wakes(app.clone()));
    tokio::spawn(wakes::run_renewal(app.clone()));
    tokio::spawn(idle_watch(app.clone()));
    tokio::spawn(stop_on_signal(app.clone()));
    // Recovery step 12: a retention sweep once normal work is idle.
    tokio::spawn(sweep::run(app.clone()));
    tokio::spawn(crate::channels::run(app.clone(), channels));
    app.maintenance.request_sweep();
    app.scheduler.notify();
    socket::serve(app.clone(), listener).await;
    shutdown(&app).await;
    drop(lock);
    Ok(())
}

fn report_ready(app: &Context, readiness: Readiness) {
    match readiness {
        Readiness::Line => {
            let mut stdout = std::io::stdout();
            let _ = writeln!(stdout, "ready {}", app.epoch.0);
            let _ = stdout.flush();
        }
        Readiness::Human => {
            let _ = writeln!(
                std::io::stderr(),
                "pi-workflows server ready (epoch {})",
                app.epoch.0
            );
        }
    }
}

async fn stop_on_signal(app: Arc<Context>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    app.request_stop();
}

/// Stops the server after the idle period with nothing to do.
async fn idle_watch(app: Arc<Context>) {
    let idle_limit = Duration::from_millis(app.config.idle_exit_ms);
    let mut idle_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(
            250.min(app.config.idle_exit_ms.max(1)),
        ))
        .await;
        if app.is_stopping() {
            return;
        }
        let busy = app.clients.load(Ordering::SeqCst) > 0
            || app.runners.occupied() > 0
            || app.reconciles.live() > 0
            || app.maintenance.is_sweeping()
            || wakes::has_live_wakes(&app).await
            || has_unsettled_work(&app).await
            || awaits_a_channel_answer(&app).await;
        if busy {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= idle_limit {
            app.request_stop();
            return;
        }
    }
}

/// Work that will need the server soon: runs waiting for admission, or running
/// rows whose claims still have to expire and be recovered.
async fn has_unsettled_work(app: &Arc<Context>) -> bool {
    app.store
        .read(|connection| {
            let count = crate::store::runs::unsettled_run_count(connection)?;
            // A queued or backing-off resource row is work to come.
            let resource_work = crate::store::resources::next_due_at(connection)?.is_some();
            Ok(count > 0 || resource_work)
        })
        .await
        .unwrap_or(true)
}

/// A running channel adapter and a pending decision it may answer, or a
/// delivered send it still has to settle.
async fn awaits_a_channel_answer(app: &Arc<Context>) -> bool {
    app.channels.any_running()
        && app
            .store
            .read(crate::store::channels::any_channel_work)
            .await
            .unwrap_or(true)
}

async fn shutdown(app: &Arc<Context>) {
    app.request_stop();
    app.drain_commands().await;
    crate::children::controller::interrupt_all(app);
    for runner in app.runners.all() {
        park_for_shutdown(app, &runner).await;
    }
    // Give runners the grace period to exit; their exits are recorded as they come.
    let deadline = Instant::now() + Duration::from_millis(app.config.stop_grace_ms + 1000);
    while (app.runners.live_count() > 0 || app.reconciles.live() > 0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app::release_epoch(app).await;
    let _ = std::fs::remove_file(app.config.socket_path());
}

/// Parks a live run at its last durable boundary and stops its runner.
async fn park_for_shutdown(app: &Arc<Context>, runner: &Arc<crate::context::runners::Runner>) {
    let run_id = runner.run_id.clone();
    let authority = runner.authority.clone();
    let parked = crate::shell::apply(app, run_id, move |_, before, now_ms| {
        Ok(kernel::run::park(before, &authority, ParkReason::Drained, now_ms).map(Step::Apply))
    })
    .await;
    // A run the kernel did not park (it no longer holds this runner's
    // claim) still loses its runner: the server is stopping.
    if !parked.changed() {
        crate::children::supervisor::stop_runner(app, runner, StopReason::Parked);
    }
}
