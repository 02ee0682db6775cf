//! Runner epochs: one runner process lifetime within one run generation, its
//! terminal outcome, and what the server decides after it exits.
//!
//! Invariants:
//! - The server records a runner epoch (`Launching`) before it spawns the
//!   process; one run has at most one runner epoch that is not `Exited`.
//! - Each runner epoch records exactly one terminal outcome.
//! - A runner exit is not a run failure by itself. The decision comes from
//!   the last committed attempt and effect state; claim loss never fails a run.
//! - Only the exit of the runner that still drives the run (current epoch,
//!   claim-holding pair) decides anything, and it parks unless the same visit
//!   already crashed [`MAX_CRASH_RETRIES`] times. Every other exit only
//!   records its outcome, without advancing the run revision.
//! - A runner that made no progress after `runner.ready` (the revision did
//!   not move past [`RunnerRecord::ready_revision`]) parks the run for an
//!   explicit resume; it is never claimed again automatically. A runner the
//!   server stopped (orphaned, drained, fenced for claim loss) is not judged
//!   by its progress: its run resumes automatically.

use crate::attempt::AttemptStatus;
use crate::claim::{Authority, ClaimRequest};
use crate::effect::EffectState;
use crate::ids::{Generation, Revision, RunnerEpochId};
use crate::output::{Output, RunEvent, Step, StopReason, Transition, WakeReason};
use crate::run::{
    self, FailureClass, ParkReason, QueueStatus, ReasonKind, Rejection, RunAggregate, RunError,
    RunRecord, Terminal, Tx,
};
use serde::{Deserialize, Serialize};

/// How many times one visit of a node may be abandoned by crashed runners
/// before the next crash fails the run (`workerCrashed`).
pub const MAX_CRASH_RETRIES: u32 = 3;

/// The protocol check a runner message failed (failure class
/// `protocolRejected`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ProtocolCheck {
    /// The frame is not a runner message the schema allows.
    Schema,
    /// Its `expectedRevision` is not the run's revision.
    Revision,
    /// It names an attempt that is not the run's active attempt.
    Attempt,
    /// Its message id was already used for another payload.
    Idempotency,
}

/// The terminal outcome of one runner epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RunnerOutcome {
    /// Exited on its own after the server told it to (or after its last reply).
    Exited,
    /// Stopped by the server for pause or cancellation.
    Cancelled,
    /// Killed for exceeding the startup or a node deadline.
    TimedOut,
    /// Exited without a terminal protocol message, or was killed by a signal.
    Crashed,
    /// Exited after the server told it that its claim was lost.
    ClaimLost,
    /// Found after a server restart with no supervising server.
    Orphaned,
}

/// The lifecycle of one runner epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RunnerStatus {
    /// Recorded; the process is being spawned or has not said `runner.ready`.
    Launching,
    /// Said `runner.ready` and received its command.
    Ready,
    /// Gone, with this outcome.
    Exited(RunnerOutcome),
}

/// One `run_workers` row as the kernel sees it (process identity stays in the shell).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunnerRecord {
    pub runner_epoch: RunnerEpochId,
    pub generation: Generation,
    pub status: RunnerStatus,
    pub launched_at_ms: u64,
    pub ready_at_ms: Option<u64>,
    /// The run revision right after the runner became ready and received its
    /// command. Progress means the revision moved past this value.
    pub ready_revision: Option<Revision>,
    pub finished_at_ms: Option<u64>,
}

impl RunnerRecord {
    /// Whether the process may still be alive.
    pub const fn is_live(&self) -> bool {
        !matches!(self.status, RunnerStatus::Exited(_))
    }
}

/// How the shell saw a runner process end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum ExitKind {
    /// It exited on its own with status 0.
    Clean,
    /// It exited on its own with another status, or a signal the server did
    /// not send.
    Abnormal,
    /// The server stopped its process group for this reason.
    Stopped { reason: StopReason },
    /// The server killed it for missing the startup handshake deadline.
    StartupDeadlineMissed,
    /// A restarted server found it without a supervising server.
    Orphaned,
}

/// A runner process ended.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunnerExit {
    pub runner_epoch: RunnerEpochId,
    pub kind: ExitKind,
}

/// What the server does after a runner exits. Records exactly one
/// [`RunnerOutcome`] (as the runner row and a `RunnerExited` event) and
/// decides from committed facts:
///
/// - a superseded epoch, or a run that no longer holds a claim (waiting,
///   parked, terminal): only the outcome is recorded (`exited`, `cancelled`
///   after pause or cancel, `claimLost` if it was fenced, …);
/// - a missed startup deadline: park `workerTimedOut`;
/// - a runner orphaned by a server crash, stopped by a draining server, or
///   stopped because it lost its claim (outcome `claimLost`): park
///   `recovered` / `drained` (resumed automatically), ready or not;
/// - an effect still applying: park (it becomes ambiguous, `effectAmbiguous`);
/// - no progress since `runner.ready` (or never ready): park `runnerNoProgress`;
/// - the active attempt's visit already abandoned by crashes
///   [`MAX_CRASH_RETRIES`] times: fail `workerCrashed`;
/// - otherwise park `workerCrashed`; the next generation reruns the abandoned
///   attempt's visit with one more crash retry.
///
/// A decision acts with the server's host authority for this runner, or a
/// fresh control claim once the runner's claim expired.
pub fn decide_exit(
    agg: &RunAggregate,
    exit: RunnerExit,
    host_authority: Option<&Authority>,
    control: ClaimRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    let Some(runner) = agg
        .run
        .runner
        .as_ref()
        .filter(|runner| runner.runner_epoch == exit.runner_epoch)
    else {
        let outcome = recorded_outcome(&agg.run, None, exit.kind);
        record_exit_in(&mut tx, exit.runner_epoch, outcome);
        return Ok(tx.commit_unversioned());
    };
    if !runner.is_live() {
        return Err(Rejection::RunnerAlreadyExited);
    }
    if !RunRecord::pair_holds_claim(agg.run.status, agg.run.queue) {
        let outcome = recorded_outcome(&agg.run, Some(runner), exit.kind);
        record_exit_in(&mut tx, exit.runner_epoch, outcome);
        return Ok(tx.commit_unversioned());
    }
    let outcome = match exit.kind {
        ExitKind::StartupDeadlineMissed => RunnerOutcome::TimedOut,
        ExitKind::Orphaned => RunnerOutcome::Orphaned,
        ExitKind::Stopped {
            reason: StopReason::ClaimLost,
        } => RunnerOutcome::ClaimLost,
        ExitKind::Clean | ExitKind::Abnormal | ExitKind::Stopped { .. } => RunnerOutcome::Crashed,
    };
    record_exit_in(&mut tx, exit.runner_epoch, outcome);
    let authority = run::command_authority(&mut tx, host_authority, control, ttl_ms)?;
    match exit_decision(agg, runner, exit.kind) {
        ExitDecision::Park(reason) => park_after_exit_in(&mut tx, &authority, reason)?,
        ExitDecision::FailCrashed => fail_crashed_in(&mut tx, &authority)?,
    }
    Ok(tx.commit())
}

/// [`decide_exit`] as a step: while another owner's claim is still live
/// (`ClaimHeld`, e.g. the exit of a runner the server no longer holds
/// authority for) the decision is deferred to that claim's expiry.
pub fn on_exit(
    agg: &RunAggregate,
    exit: RunnerExit,
    host_authority: Option<&Authority>,
    control: ClaimRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Step<RunAggregate>, Rejection> {
    Step::unless_claim_held(
        decide_exit(agg, exit, host_authority, control, now_ms, ttl_ms),
        WakeReason::ClaimExpiry,
    )
}

/// A claim-expiry wake fired for `agg` (or startup found its claim
/// expired). `supervised` says whether this server supervises a runner of
/// the run. The decision tree:
///
/// - the pair holds no claim (queued, waiting, parked, terminal): nothing;
/// - the claim is still live (it was renewed): decide again at its expiry;
/// - a live runner record this server does not supervise (a runner of a
///   previous server, reaped at startup): [`decide_exit`] with
///   [`ExitKind::Orphaned`];
/// - otherwise (our own runner stalled past its claim, or no runner): a
///   control claim fences it and the run parks `recovered`
///   ([`run::recover`]).
pub fn on_claim_expired(
    agg: &RunAggregate,
    supervised: bool,
    control: ClaimRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Step<RunAggregate>, Rejection> {
    if !RunRecord::pair_holds_claim(agg.run.status, agg.run.queue) {
        return Ok(Step::Nothing);
    }
    if let Some(claim) = agg.run.lease.live_claim(now_ms) {
        return Ok(Step::Defer {
            at_ms: claim.expires_at_ms,
            reason: WakeReason::ClaimExpiry,
        });
    }
    let orphan = agg
        .run
        .runner
        .as_ref()
        .filter(|runner| runner.is_live() && !supervised);
    let decided = match orphan {
        Some(runner) => decide_exit(
            agg,
            RunnerExit {
                runner_epoch: runner.runner_epoch.clone(),
                kind: ExitKind::Orphaned,
            },
            None,
            control,
            now_ms,
            ttl_ms,
        ),
        None => run::recover(agg, control, ParkReason::Recovered, now_ms, ttl_ms),
    };
    Step::unless_claim_held(decided, WakeReason::ClaimExpiry)
}

/// A message of the runner that holds the run's live claim failed a protocol
/// check. The message changes nothing; in one transition the run is parked
/// `protocolRejected` for an explicit resume or cancel (an effect that was
/// applying becomes ambiguous and the park is `effectAmbiguous`), the
/// `ProtocolRejected` event records the check, the claim is released and the
/// runner is stopped. It is never reported as a crash, as no progress or as
/// a node failure. A runner without the live claim is refused with
/// `ClaimLost`: claim loss is its own class.
pub fn protocol_rejected(
    agg: &RunAggregate,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    check: ProtocolCheck,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
    run::park_in(&mut tx, authority, ParkReason::ProtocolRejected)?;
    tx.event(RunEvent::ProtocolRejected { check });
    Ok(tx.commit())
}

/// The outcome of an exit that decides nothing for the run.
fn recorded_outcome(
    run: &RunRecord,
    runner: Option<&RunnerRecord>,
    kind: ExitKind,
) -> RunnerOutcome {
    let fenced = runner.is_none_or(|runner| run.lease.generation > runner.generation);
    match kind {
        ExitKind::Stopped {
            reason: StopReason::Paused | StopReason::Cancelled,
        } => RunnerOutcome::Cancelled,
        ExitKind::Stopped {
            reason: StopReason::ClaimLost,
        } => RunnerOutcome::ClaimLost,
        ExitKind::Stopped {
            reason: StopReason::NodeTimedOut,
        }
        | ExitKind::StartupDeadlineMissed => RunnerOutcome::TimedOut,
        ExitKind::Stopped {
            reason: StopReason::Parked | StopReason::Finished,
        } => RunnerOutcome::Exited,
        ExitKind::Orphaned => RunnerOutcome::Orphaned,
        ExitKind::Clean | ExitKind::Abnormal if fenced => RunnerOutcome::ClaimLost,
        ExitKind::Clean | ExitKind::Abnormal
            if run.paused || run.status == run::RunStatus::Cancelled =>
        {
            RunnerOutcome::Cancelled
        }
        ExitKind::Clean => RunnerOutcome::Exited,
        ExitKind::Abnormal => RunnerOutcome::Crashed,
    }
}

fn record_exit_in(tx: &mut Tx, runner_epoch: RunnerEpochId, outcome: RunnerOutcome) {
    let now_ms = tx.now_ms();
    if let Some(runner) = tx
        .agg
        .run
        .runner
        .as_mut()
        .filter(|runner| runner.runner_epoch == runner_epoch)
    {
        runner.status = RunnerStatus::Exited(outcome);
        runner.finished_at_ms = Some(now_ms);
    }
    tx.event(RunEvent::RunnerExited {
        runner_epoch,
        outcome,
    });
    // A worker slot is free again.
    tx.output(Output::Schedule);
}

enum ExitDecision {
    Park(ParkReason),
    FailCrashed,
}

fn exit_decision(agg: &RunAggregate, runner: &RunnerRecord, kind: ExitKind) -> ExitDecision {
    let run = &agg.run;
    if kind == ExitKind::StartupDeadlineMissed && run.queue == QueueStatus::Starting {
        return ExitDecision::Park(ParkReason::WorkerTimedOut);
    }
    // The server, not the runner, stopped: a runner orphaned by a server
    // crash, parked by a draining server, or fenced because the server let
    // its claim expire (a claim loss is a handoff, decided as the
    // claim-expiry wake would have: `on_claim_expired`), did nothing wrong,
    // ready or not. Its run resumes automatically (an applying effect still
    // makes it ambiguous).
    match kind {
        ExitKind::Orphaned
        | ExitKind::Stopped {
            reason: StopReason::ClaimLost,
        } => return ExitDecision::Park(ParkReason::Recovered),
        ExitKind::Stopped {
            reason: StopReason::Parked,
        } => return ExitDecision::Park(ParkReason::Drained),
        _ => {}
    }
    if agg
        .effects
        .iter()
        .any(|effect| effect.state == EffectState::Applying)
    {
        // park_in turns the applying effect ambiguous and parks for review.
        return ExitDecision::Park(ParkReason::WorkerCrashed);
    }
    if runner
        .ready_revision
        .is_none_or(|ready| run.revision <= ready)
    {
        return ExitDecision::Park(ParkReason::RunnerNoProgress);
    }
    let exhausted = agg.attempt.as_ref().is_some_and(|attempt| {
        attempt.status == AttemptStatus::Active && attempt.crash_retries >= MAX_CRASH_RETRIES
    });
    if exhausted {
        ExitDecision::FailCrashed
    } else {
        ExitDecision::Park(ParkReason::WorkerCrashed)
    }
}

fn park_after_exit_in(
    tx: &mut Tx,
    authority: &Authority,
    reason: ParkReason,
) -> Result<(), Rejection> {
    let crashed_attempt = tx
        .agg
        .attempt
        .as_ref()
        .is_some_and(|attempt| attempt.status == AttemptStatus::Active);
    run::park_in(tx, authority, reason)?;
    let crashed = crashed_attempt && tx.agg.run.park_reason == Some(ParkReason::WorkerCrashed);
    if let Some(attempt) = tx.agg.attempt.as_mut().filter(|_| crashed) {
        attempt.crash_retries = attempt.crash_retries.saturating_add(1);
    }
    Ok(())
}

fn fail_crashed_in(tx: &mut Tx, authority: &Authority) -> Result<(), Rejection> {
    run::abandon_attempt(tx);
    let node_id = tx
        .agg
        .attempt
        .as_ref()
        .map(|attempt| attempt.node_id.clone());
    let error = RunError {
        class: FailureClass::WorkerCrashed,
        reason: ReasonKind::WorkerCrashed,
        node_id,
    };
    run::finish_in(tx, Some(authority), Terminal::Failed { error })
}

#[cfg(test)]
mod tests;
