//! The environment shared by the models over real run aggregates: one clock
//! unit, the ids the shell would make, and the composite steps (admit, then
//! `runner.ready` plus dispatch) that the kernel exposes through fixtures.

use kernel::claim::{self, Authority};
use kernel::fixtures;
use kernel::output::{Output, Transition};
use kernel::run::{self, RunAggregate};
use kernel::runner::{RunnerOutcome, RunnerStatus};

/// The claim lifetime every aggregate model passes to the kernel. One clock
/// tick of these models is exactly one lifetime, so a tick expires every
/// claim that was not renewed at the new instant.
pub const TTL: u64 = fixtures::TTL_MS;

/// The node every runner executes.
pub const NODE: &str = "work";

/// The host authority the server holds for the runner of `generation`.
pub fn host(generation: u64) -> Authority {
    fixtures::host_authority(generation)
}

/// `run::admit` with the next generation's runner epoch and token.
pub fn admit(agg: &RunAggregate, now: u64) -> Result<Transition<RunAggregate>, run::Rejection> {
    let generation = agg.run.lease.generation.next().0;
    run::admit(
        agg,
        fixtures::runner_epoch(generation),
        fixtures::token(generation),
        now,
        TTL,
    )
}

/// `runner.ready` plus dispatch of [`NODE`] for the runner of `generation`,
/// through the kernel's `fixtures::running` (which calls `run::mark_ready`).
/// The fixture expects success, so the claim is first checked with the
/// kernel's own `claim::check`; `None` means the kernel would refuse.
pub fn ready(agg: &RunAggregate, generation: u64, now: u64) -> Option<Transition<RunAggregate>> {
    let starting =
        (agg.run.status, agg.run.queue) == (run::RunStatus::Running, run::QueueStatus::Starting);
    let current = agg
        .run
        .runner
        .as_ref()
        .is_some_and(|r| r.runner_epoch == fixtures::runner_epoch(generation) && r.is_live());
    if !starting || !current || agg.run.lease.generation.0 != generation {
        return None;
    }
    claim::check(&agg.run.lease, Some(&host(generation)), now).ok()?;
    fixtures::try_running(agg, NODE, now).ok()
}

/// Whether a transition's outputs contain an event matching `pred`.
pub fn has_event(outputs: &[Output], pred: impl Fn(&kernel::output::RunEvent) -> bool) -> bool {
    outputs
        .iter()
        .any(|output| matches!(output, Output::Event { event, .. } if pred(event)))
}

/// Whether a committed step gave a run a second runner epoch that is not
/// `Exited`: `pre` records a live runner epoch and `post` records another
/// one. The aggregate keeps only the current epoch, but the shell's
/// `run_workers` table keeps both rows, and the old row stays live until its
/// exit is recorded — so this is exactly the moment the run has two.
pub fn second_live_epoch(pre: &RunAggregate, post: &RunAggregate) -> bool {
    pre.run.live_runner().is_some_and(|old| {
        post.run
            .runner
            .as_ref()
            .is_some_and(|new| new.runner_epoch != old.runner_epoch)
    })
}

/// The planted bug "admission beside a live runner": `run::admit` as
/// [`admit`], but the previous runner epoch counts as exited (the kernel
/// before the fix of finding 1).
pub fn admit_beside_live_runner(
    agg: &RunAggregate,
    now: u64,
) -> Result<Transition<RunAggregate>, run::Rejection> {
    let mut agg = agg.clone();
    if let Some(runner) = agg.run.runner.as_mut().filter(|r| r.is_live()) {
        runner.status = RunnerStatus::Exited(RunnerOutcome::Exited);
    }
    admit(&agg, now)
}
