//! The run lifecycle over the `run` transitions available now: admit,
//! `runner.ready`, complete, fail, wait at a checkpoint, drain (park), pause,
//! resume, cancel with a live or an expired claim, restart of a failed run,
//! continuation of a waiting run, and recovery.
//!
//! Runner exits are their own steps, as in the server (`supervisor::finish`
//! → `runner_channel::record_exit`): a runner process that ends (told to
//! stop, finished, crashed) is reaped by the server, which records its exit
//! with `runner::decide_exit` (with the host authority it holds for that
//! generation); until then the run is not admitted again (`RunnerLive`). A
//! runner crash parks the run through that exit decision; if the claim runs
//! out first, the server's `run::recover` of its own runner races it. A
//! server crash drops the server's memory (host authorities, runner pipes)
//! and keeps the committed aggregates; every runner process, acting or
//! ended, is then an orphan. The restarted server records each orphan's exit
//! with `decide_exit(Orphaned)` and no host authority, as startup recovery
//! (`recovery::startup`) and `timers::recover_stale` do: refused while the
//! claim is live, retried after it expired, and never `run::recover`. A run
//! that is terminal or waits at a checkpoint is never admitted again, so the
//! exit of its runner is recorded in the same step (a reduction that keeps
//! the interleavings of exits to the runs that can be admitted again).
//!
//! Two configurations share the model: with faults (clock, crashes, drain)
//! for the safety properties, and fault-free for liveness, where the state
//! graph is path-acyclic (every accepted transition increases a revision and
//! the generation is bounded) so stateright's `eventually` is sound.

use crate::harness::Summarize;
use crate::world::{self, TTL};
use core::fmt;
use kernel::claim::Authority;
use kernel::fixtures;
use kernel::ids::{Digest, MessageId, RunId};
use kernel::output::StopReason;
use kernel::output::{Output, RunEvent, Transition};
use kernel::run::{
    self, ExecutionMode, FailureClass, NewRun, ParkReason, QueueStatus, ReasonKind, RestartSource,
    RunAggregate, RunError, RunStatus, Terminal,
};
use kernel::runner::{self, ExitKind, RunnerExit, RunnerOutcome, RunnerStatus};
use stateright::{Model, Property};

/// The kernel's rules, or the kernel with one check dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LifecycleRules {
    Kernel,
    /// Cancel does not refuse a terminal run.
    CancelIgnoresTerminal,
    /// Parking (recovery, drain) does not abandon the active attempt.
    ParkKeepsAttempt,
    /// Recovery takes over a claim that is still live.
    RecoverLiveClaim,
    /// The scheduler admits only `queued/queued` runs, never a resumable parked one.
    AdmitOnlyQueued,
    /// Admission ignores the previous runner epoch: a run whose stopped
    /// runner has not exited yet is admitted again (the kernel before the
    /// fix of finding 1).
    AdmitBesideLiveRunner,
}

/// The bounded configuration.
#[derive(Clone, Debug)]
pub struct LifecycleModel {
    /// Clock, runner and server crashes, drain.
    pub faults: bool,
    pub max_ticks: u64,
    pub max_generation: u64,
    /// Runs in the model: 1, or 2 to allow a restart or a continuation.
    pub max_runs: usize,
    pub max_pauses: u8,
    pub max_crashes: u8,
    pub rules: LifecycleRules,
}

impl LifecycleModel {
    /// The CI configuration with faults.
    pub fn ci(rules: LifecycleRules) -> Self {
        Self {
            faults: true,
            // One tick: with runner exits as their own steps, two ticks
            // explored 2.8 M states (26 s) instead of 0.65 M (6 s).
            max_ticks: 1,
            max_generation: 3,
            max_runs: 2,
            max_pauses: 1,
            max_crashes: 1,
            rules,
        }
    }

    /// Larger bounds with faults, for local runs.
    pub fn deep(rules: LifecycleRules) -> Self {
        Self {
            faults: true,
            max_ticks: 2,
            max_generation: 4,
            max_runs: 2,
            max_pauses: 1,
            max_crashes: 1,
            rules,
        }
    }

    /// The fault-free configuration for liveness.
    pub fn fault_free(rules: LifecycleRules, max_pauses: u8) -> Self {
        Self {
            faults: false,
            max_ticks: 0,
            max_generation: u64::from(max_pauses) + 2,
            max_runs: 1,
            max_pauses,
            max_crashes: 0,
            rules,
        }
    }

    /// A one-line description of the bounds.
    pub fn bounds(&self) -> String {
        if self.faults {
            format!(
                "faults on, runs<={}, ticks<={}, gen<={}, pauses<={}, crashes<={}",
                self.max_runs,
                self.max_ticks,
                self.max_generation,
                self.max_pauses,
                self.max_crashes
            )
        } else {
            format!(
                "fault-free (no crash, clock, drain or cancel), 1 run, gen<={}, pauses<={}",
                self.max_generation, self.max_pauses
            )
        }
    }
}

/// Oracle verdicts and witnesses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Oracle {
    /// The terminal status each run first reached.
    pub terminal: Vec<Option<RunStatus>>,
    pub left_terminal: bool,
    pub projections_disagree: bool,
    pub took_live_claim: bool,
    /// A run recorded a second runner epoch while its previous one was not
    /// `Exited` ([`world::second_live_epoch`]).
    pub two_live_epochs: bool,
    // Witnesses.
    pub runner_crash_recovered: bool,
    pub server_crash_recovered: bool,
    pub cancelled_expired: bool,
    pub cancelled_live: bool,
    pub resumed: bool,
    pub drained: bool,
    pub readmitted_after_exit: bool,
    pub readmitted_after_orphan: bool,
}

/// A runner process that stopped acting (told to stop, finished, crashed or
/// orphaned) and whose exit the server has not recorded yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Exiting {
    pub generation: u64,
    pub kind: ExitKind,
}

/// The model state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LifecycleState {
    pub ticks: u64,
    pub now: u64,
    /// Committed aggregates, `run-1` first.
    pub runs: Vec<RunAggregate>,
    pub server_up: bool,
    pub server_restarted: bool,
    /// The server's in-memory host authority per run.
    pub host: Vec<Option<Authority>>,
    /// The generation of each run's runner process while it acts.
    pub runners: Vec<Option<u64>>,
    /// Each run's runner process that ended, until its exit is recorded.
    pub exiting: Vec<Option<Exiting>>,
    pub pauses: u8,
    pub crashes: u8,
    pub oracle: Oracle,
}

/// One environment step on run `i` (or the whole server).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LifecycleAction {
    Tick,
    Admit(usize),
    Ready(usize),
    Complete(usize),
    Fail(usize),
    Wait(usize),
    Drain(usize),
    Pause(usize),
    Resume(usize),
    Cancel(usize),
    Recover(usize),
    Restart(usize),
    Continue(usize),
    CrashRunner(usize),
    RunnerExit(usize),
    CrashServer,
    StartServer,
}

impl fmt::Display for LifecycleAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = |i: &usize| format!("run-{}", i + 1);
        match self {
            Self::Tick => write!(f, "clock advances one claim lifetime"),
            Self::Admit(i) => write!(f, "scheduler: run::admit({})", run(i)),
            Self::Ready(i) => write!(f, "runner of {}: runner.ready + dispatch", run(i)),
            Self::Complete(i) => write!(f, "runner of {}: run::finish(completed)", run(i)),
            Self::Fail(i) => write!(f, "runner of {}: run::finish(failed)", run(i)),
            Self::Wait(i) => write!(f, "runner of {}: checkpoint wait", run(i)),
            Self::Drain(i) => write!(f, "server drain: run::park({}, drained)", run(i)),
            Self::Pause(i) => write!(f, "client: run::pause({})", run(i)),
            Self::Resume(i) => write!(f, "client: run::resume({})", run(i)),
            Self::Cancel(i) => write!(f, "client: run::cancel({})", run(i)),
            Self::Recover(i) => write!(f, "server: run::recover({})", run(i)),
            Self::Restart(i) => write!(f, "client: run::restart({}) as run-2", run(i)),
            Self::Continue(i) => {
                write!(f, "client: run::reserve_continuation({}) as run-2", run(i))
            }
            Self::CrashRunner(i) => write!(f, "runner of {} crashes", run(i)),
            Self::RunnerExit(i) => write!(
                f,
                "server reaps the runner of {}: runner::decide_exit",
                run(i)
            ),
            Self::CrashServer => write!(f, "server crashes (memory lost, facts kept)"),
            Self::StartServer => write!(f, "server starts"),
        }
    }
}

/// The documented state table, restated: which (run, queue) pairs exist and
/// which of them hold a claim or run a node.
fn projections_agree(agg: &RunAggregate) -> bool {
    use QueueStatus as Q;
    use RunStatus as R;
    let run = &agg.run;
    let pair = (run.status, run.queue);
    let in_table = matches!(
        pair,
        (R::Queued, Q::Queued)
            | (R::Running, Q::Starting | Q::Running | Q::Parked)
            | (R::Waiting, Q::Parked)
            | (R::Completed, Q::Done)
            | (R::Failed | R::TimedOut, Q::Failed)
            | (R::Cancelled, Q::Cancelled)
    );
    let claimed = matches!(pair, (R::Running, Q::Starting | Q::Running));
    let active_attempt = agg
        .attempt
        .as_ref()
        .is_some_and(|a| a.status.is_unfinished());
    in_table
        && (run.lease.claim.is_none() || claimed)
        && (!active_attempt || pair == (R::Running, Q::Running))
        && !(run.paused && claimed)
        && !(run.status.is_terminal() && (run.paused || run.park_reason.is_some()))
}

fn stop_reason(outputs: &[Output]) -> Option<StopReason> {
    outputs.iter().find_map(|output| match output {
        Output::StopRunner { reason, .. } => Some(*reason),
        _ => None,
    })
}

impl LifecycleModel {
    /// Commits a transition; a runner it stops stops acting and exits.
    fn commit(state: &mut LifecycleState, i: usize, transition: Transition<RunAggregate>) {
        if let Some(reason) = stop_reason(&transition.outputs) {
            Self::end_process(state, i, ExitKind::Stopped { reason });
        }
        state.runs[i] = transition.facts.reload();
    }

    /// Run `i`'s acting runner process ends as `kind`; the server records
    /// the exit later ([`LifecycleAction::RunnerExit`]).
    fn end_process(state: &mut LifecycleState, i: usize, kind: ExitKind) {
        if let Some(generation) = state.runners[i].take() {
            state.exiting[i] = Some(Exiting { generation, kind });
        }
    }

    fn cancel(&self, state: &LifecycleState, i: usize) -> Option<Transition<RunAggregate>> {
        let mut agg = state.runs[i].clone();
        if self.rules == LifecycleRules::CancelIgnoresTerminal && agg.run.status.is_terminal() {
            // Planted bug: the terminal check is skipped.
            agg.run.status = RunStatus::Waiting;
            agg.run.queue = QueueStatus::Parked;
        }
        run::cancel(
            &agg,
            state.host[i].as_ref(),
            fixtures::control_request(),
            state.now,
            TTL,
        )
        .ok()
    }

    fn keep_attempt(&self, before: &RunAggregate, transition: &mut Transition<RunAggregate>) {
        if self.rules == LifecycleRules::ParkKeepsAttempt {
            // Planted bug: the active attempt is not abandoned.
            transition.facts.attempt = before.attempt.clone();
        }
    }

    fn recover(&self, state: &LifecycleState, i: usize) -> Option<Transition<RunAggregate>> {
        let mut agg = state.runs[i].clone();
        if self.rules == LifecycleRules::RecoverLiveClaim
            && let Some(claim) = agg.run.lease.claim.as_mut()
        {
            // Planted bug: recovery does not wait for the claim to expire.
            claim.expires_at_ms = claim.expires_at_ms.min(state.now);
        }
        let reason = if state.server_restarted {
            ParkReason::Recovered
        } else {
            ParkReason::WorkerCrashed
        };
        let mut transition =
            run::recover(&agg, fixtures::control_request(), reason, state.now, TTL).ok()?;
        self.keep_attempt(&state.runs[i], &mut transition);
        Some(transition)
    }

    fn admit(&self, state: &LifecycleState, i: usize) -> Option<Transition<RunAggregate>> {
        let agg = &state.runs[i];
        if self.rules == LifecycleRules::AdmitOnlyQueued && agg.run.status != RunStatus::Queued {
            return None;
        }
        if self.rules == LifecycleRules::AdmitBesideLiveRunner {
            // Planted bug: the previous runner epoch counts as exited.
            return world::admit_beside_live_runner(agg, state.now).ok();
        }
        world::admit(agg, state.now).ok()
    }

    /// The server records the exit of run `i`'s ended runner process.
    fn record_exit(state: &LifecycleState, i: usize) -> Option<Transition<RunAggregate>> {
        let exiting = state.exiting[i]?;
        let host = state.host[i]
            .clone()
            .filter(|host| host.generation.0 == exiting.generation);
        let exit = RunnerExit {
            runner_epoch: fixtures::runner_epoch(exiting.generation),
            kind: exiting.kind,
        };
        runner::decide_exit(
            &state.runs[i],
            exit,
            host.as_ref(),
            fixtures::control_request(),
            state.now,
            TTL,
        )
        .ok()
    }

    /// A run that is terminal or waits at a checkpoint is never admitted
    /// again, so the exit of its ended runner changes only its runner row:
    /// the server records it in the same step (this keeps the interleavings
    /// of exits to the runs that can be admitted again).
    fn reap_settled(next: &mut LifecycleState) {
        for i in 0..next.runs.len() {
            let status = next.runs[i].run.status;
            if !(status.is_terminal() || status == RunStatus::Waiting) {
                continue;
            }
            if let Some(transition) = Self::record_exit(next, i) {
                Self::commit(next, i, transition);
                next.exiting[i] = None;
            }
        }
    }

    fn check_step(state: &LifecycleState, next: &mut LifecycleState) {
        next.oracle.terminal.resize(next.runs.len(), None);
        for (i, agg) in next.runs.iter().enumerate() {
            if let Some(status) = state.oracle.terminal.get(i).copied().flatten() {
                if agg.run.status != status {
                    next.oracle.left_terminal = true;
                }
            } else if agg.run.status.is_terminal() {
                next.oracle.terminal[i] = Some(agg.run.status);
            }
            if !projections_agree(agg) {
                next.oracle.projections_disagree = true;
            }
            if state
                .runs
                .get(i)
                .is_some_and(|pre| world::second_live_epoch(pre, agg))
            {
                next.oracle.two_live_epochs = true;
            }
        }
    }
}

impl Model for LifecycleModel {
    type State = LifecycleState;
    type Action = LifecycleAction;

    fn init_states(&self) -> Vec<LifecycleState> {
        vec![LifecycleState {
            ticks: 0,
            now: 0,
            runs: vec![fixtures::reserved(1, 0)],
            server_up: true,
            server_restarted: false,
            host: vec![None],
            runners: vec![None],
            exiting: vec![None],
            pauses: 0,
            crashes: 0,
            oracle: Oracle {
                terminal: vec![None],
                ..Oracle::default()
            },
        }]
    }

    fn actions(&self, state: &LifecycleState, out: &mut Vec<LifecycleAction>) {
        use LifecycleAction as A;
        if self.faults && state.ticks < self.max_ticks {
            out.push(A::Tick);
        }
        if !state.server_up {
            out.push(A::StartServer);
            return;
        }
        let can_crash = self.faults && state.crashes < self.max_crashes;
        for i in 0..state.runs.len() {
            let agg = &state.runs[i];
            if state.exiting[i].is_some() {
                out.push(A::RunnerExit(i));
            }
            if agg.run.status.is_terminal() {
                if self.rules == LifecycleRules::CancelIgnoresTerminal {
                    out.push(A::Cancel(i));
                }
                if state.runs.len() < self.max_runs {
                    out.push(A::Restart(i));
                }
                continue;
            }
            if agg.run.lease.generation.0 < self.max_generation {
                out.push(A::Admit(i));
            }
            if state.runners[i].is_some() {
                out.push(A::Ready(i));
                out.push(A::Complete(i));
                out.push(A::Fail(i));
                out.push(A::Wait(i));
                if can_crash {
                    out.push(A::CrashRunner(i));
                }
            }
            if self.faults {
                out.push(A::Drain(i));
                out.push(A::Recover(i));
            }
            if state.pauses < self.max_pauses {
                out.push(A::Pause(i));
            }
            out.push(A::Resume(i));
            // Cancellation would end every path trivially, so the liveness
            // configuration leaves it (with the faults) to the other one.
            if self.faults {
                out.push(A::Cancel(i));
            }
            if state.runs.len() < self.max_runs {
                out.push(A::Continue(i));
            }
        }
        if can_crash {
            out.push(A::CrashServer);
        }
    }

    fn next_state(
        &self,
        state: &LifecycleState,
        action: LifecycleAction,
    ) -> Option<LifecycleState> {
        use LifecycleAction as A;
        let mut next = state.clone();
        let now = state.now;
        match action {
            A::Tick => {
                next.ticks += 1;
                next.now += TTL;
            }
            A::StartServer => {
                next.server_up = true;
                next.server_restarted = true;
            }
            A::CrashServer => {
                next.crashes += 1;
                next.server_up = false;
                next.host.iter_mut().for_each(|h| *h = None);
                // Every runner process, acting or exiting, is now an orphan
                // the restarted server finds.
                for i in 0..next.runs.len() {
                    let generation = next.runners[i]
                        .take()
                        .or(next.exiting[i].map(|e| e.generation));
                    next.exiting[i] = generation.map(|generation| Exiting {
                        generation,
                        kind: ExitKind::Orphaned,
                    });
                }
            }
            A::CrashRunner(i) => {
                state.runners[i]?;
                next.crashes += 1;
                Self::end_process(&mut next, i, ExitKind::Abnormal);
            }
            A::RunnerExit(i) => {
                let mut transition = Self::record_exit(state, i)?;
                self.keep_attempt(&state.runs[i], &mut transition);
                Self::commit(&mut next, i, transition);
                next.exiting[i] = None;
                if !run::RunRecord::pair_holds_claim(
                    next.runs[i].run.status,
                    next.runs[i].run.queue,
                ) {
                    next.host[i] = None;
                }
            }
            A::Admit(i) => {
                let transition = self.admit(state, i)?;
                let generation = transition.facts.run.lease.generation.0;
                if let Some(runner) = state.runs[i].run.runner.as_ref() {
                    next.oracle.readmitted_after_exit = true;
                    if runner.status == RunnerStatus::Exited(RunnerOutcome::Orphaned) {
                        next.oracle.readmitted_after_orphan = true;
                    }
                }
                Self::commit(&mut next, i, transition);
                next.host[i] = Some(world::host(generation));
                next.runners[i] = Some(generation);
            }
            A::Ready(i) => {
                let generation = state.runners[i]?;
                let transition = world::ready(&state.runs[i], generation, now)?;
                Self::commit(&mut next, i, transition);
            }
            A::Complete(i) | A::Fail(i) => {
                let generation = state.runners[i]?;
                let terminal = if matches!(action, A::Complete(_)) {
                    Terminal::Completed
                } else {
                    Terminal::Failed {
                        error: RunError {
                            class: FailureClass::NodeFailed,
                            reason: ReasonKind::NodeFailed,
                            node_id: None,
                        },
                    }
                };
                let authority = world::host(generation);
                let transition =
                    run::finish(&state.runs[i], Some(&authority), terminal, now).ok()?;
                Self::commit(&mut next, i, transition);
                Self::end_process(&mut next, i, ExitKind::Clean);
                next.host[i] = None;
            }
            A::Wait(i) => {
                let generation = state.runners[i]?;
                let agg = &state.runs[i];
                if (agg.run.status, agg.run.queue) != (RunStatus::Running, QueueStatus::Running)
                    || agg.run.lease.generation.0 != generation
                {
                    return None;
                }
                kernel::claim::check(&agg.run.lease, Some(&world::host(generation)), now).ok()?;
                next.runs[i] = fixtures::waiting_at_checkpoint(agg, "gate", now);
                Self::end_process(&mut next, i, ExitKind::Clean);
                next.host[i] = None;
            }
            A::Drain(i) => {
                let host = state.host[i].as_ref()?;
                let mut transition =
                    run::park(&state.runs[i], host, ParkReason::Drained, now).ok()?;
                self.keep_attempt(&state.runs[i], &mut transition);
                Self::commit(&mut next, i, transition);
                next.host[i] = None;
                next.oracle.drained = true;
            }
            A::Pause(i) => {
                let transition = run::pause(
                    &state.runs[i],
                    state.host[i].as_ref(),
                    fixtures::control_request(),
                    now,
                    TTL,
                )
                .ok()?;
                next.pauses += 1;
                if stop_reason(&transition.outputs).is_some() {
                    next.host[i] = None;
                }
                Self::commit(&mut next, i, transition);
            }
            A::Resume(i) => {
                let ids = run::ResumeIds {
                    resumed_message_id: MessageId::from("m-resumed"),
                    message_order: 1,
                };
                let transition = run::resume(&state.runs[i], ids, now).ok()?;
                Self::commit(&mut next, i, transition);
                next.oracle.resumed = true;
            }
            A::Cancel(i) => {
                let transition = self.cancel(state, i)?;
                let took_control = world::has_event(&transition.outputs, |e| {
                    matches!(e, RunEvent::ControlClaimed { .. })
                });
                let had_claim = state.runs[i].run.lease.claim.is_some();
                Self::commit(&mut next, i, transition);
                next.host[i] = None;
                if took_control && had_claim {
                    next.oracle.cancelled_expired = true;
                } else if had_claim {
                    next.oracle.cancelled_live = true;
                }
            }
            A::Recover(i) => {
                // The server recovers with `run::recover` only a run whose
                // runner process is its own; an orphan's record is decided
                // by `decide_exit(Orphaned)` (`RunnerExit`), as the server's
                // `recover_stale` does.
                let ours = state.runners[i].is_some()
                    || state.exiting[i].is_some_and(|e| e.kind != ExitKind::Orphaned);
                if !ours {
                    return None;
                }
                let live = state.runs[i]
                    .run
                    .lease
                    .claim
                    .as_ref()
                    .is_some_and(|c| now < c.expires_at_ms);
                let transition = self.recover(state, i)?;
                if live {
                    next.oracle.took_live_claim = true;
                }
                Self::commit(&mut next, i, transition);
                next.host[i] = None;
            }
            A::Restart(i) => {
                // The chain as the shell loads it: every recorded restart
                // whose lineage names this run's chain root.
                let root = state.runs[i].run.restart_root();
                let chain: Vec<_> = state
                    .runs
                    .iter()
                    .filter_map(|agg| agg.run.lineage.restart.clone())
                    .filter(|restart| restart.root_run_id == *root)
                    .collect();
                let source = RestartSource {
                    run: &state.runs[i].run,
                    terminal_fingerprint: Digest::repeat(0x70 + i as u8),
                    chain: &chain,
                };
                let new_run = NewRun {
                    run_id: RunId::from("run-2"),
                    mode: ExecutionMode::Headless,
                };
                let transition = run::restart(source, new_run, &[], now).ok()?;
                next.runs.push(transition.facts.reload());
                next.host.push(None);
                next.runners.push(None);
                next.exiting.push(None);
            }
            A::Continue(i) => {
                let reserved =
                    run::reserve_continuation(&state.runs[i], RunId::from("run-2"), now).ok()?;
                next.runs[i] = reserved.parent.facts.reload();
                next.runs.push(reserved.child.facts.reload());
                next.host.push(None);
                next.runners.push(None);
                next.exiting.push(None);
            }
        }
        if next.server_up {
            Self::reap_settled(&mut next);
        }
        Self::check_step(state, &mut next);
        let completed = next
            .runs
            .iter()
            .any(|r| r.run.status == RunStatus::Completed)
            && !state
                .runs
                .iter()
                .any(|r| r.run.status == RunStatus::Completed);
        if completed && state.crashes > 0 {
            if state.server_restarted {
                next.oracle.server_crash_recovered = true;
            } else {
                next.oracle.runner_crash_recovered = true;
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = Vec::new();
        if self.faults {
            // The safety properties are checked (and mutation-tested) in the
            // configuration with faults; the fault-free one checks liveness.
            properties.extend([
                Property::always(
                    "terminal run states are absorbing",
                    |_, s: &LifecycleState| !s.oracle.left_terminal,
                ),
                Property::always(
                    "run, queue, claim, pause and attempt projections agree after every step",
                    |_, s: &LifecycleState| !s.oracle.projections_disagree,
                ),
                Property::always(
                    "recovery never takes over a live claim",
                    |_, s: &LifecycleState| !s.oracle.took_live_claim,
                ),
                Property::always(
                    "at most one runner epoch per run that is not Exited",
                    |_, s: &LifecycleState| !s.oracle.two_live_epochs,
                ),
            ]);
        }
        properties.extend([
            Property::sometimes("a run completes", |_, s: &LifecycleState| {
                s.runs[0].run.status == RunStatus::Completed
            }),
            Property::sometimes("a run waits at a checkpoint", |_, s: &LifecycleState| {
                s.runs[0].run.status == RunStatus::Waiting
            }),
            Property::sometimes("a paused run resumes", |_, s: &LifecycleState| {
                s.oracle.resumed
            }),
            Property::sometimes(
                "a run is admitted again after its runner's exit is recorded",
                |_, s: &LifecycleState| s.oracle.readmitted_after_exit,
            ),
        ]);
        if self.faults {
            properties.extend([
                Property::sometimes("a failed run is restarted", |_, s: &LifecycleState| {
                    s.runs.len() == 2 && s.runs[1].run.lineage.restart.is_some()
                }),
                Property::sometimes(
                    "a waiting run is continued and the child completes",
                    |_, s: &LifecycleState| {
                        s.runs.len() == 2
                            && s.runs[1].run.lineage.continuation_of.is_some()
                            && s.runs[1].run.status == RunStatus::Completed
                    },
                ),
                Property::sometimes(
                    "a runner crash is recovered and the run completes",
                    |_, s: &LifecycleState| s.oracle.runner_crash_recovered,
                ),
                Property::sometimes(
                    "a server crash is recovered from committed facts and the run completes",
                    |_, s: &LifecycleState| s.oracle.server_crash_recovered,
                ),
                Property::sometimes(
                    "a run is cancelled after its claim expired",
                    |_, s: &LifecycleState| s.oracle.cancelled_expired,
                ),
                Property::sometimes("a live run is cancelled", |_, s: &LifecycleState| {
                    s.oracle.cancelled_live
                }),
                Property::sometimes("a drained run is parked", |_, s: &LifecycleState| {
                    s.oracle.drained
                }),
                Property::sometimes(
                    "after a server crash an orphaned runner's exit is recorded and its run is admitted again",
                    |_, s: &LifecycleState| s.oracle.readmitted_after_orphan,
                ),
            ]);
        } else {
            properties.push(Property::eventually(
                "with no faults, every admitted run reaches a terminal or waiting state",
                |_, s: &LifecycleState| {
                    let status = s.runs[0].run.status;
                    status.is_terminal() || status == RunStatus::Waiting
                },
            ));
        }
        properties
    }
}

impl Summarize for LifecycleModel {
    fn summarize(&self, s: &LifecycleState) -> String {
        let runs: Vec<String> = s
            .runs
            .iter()
            .map(|agg| {
                format!(
                    "{} {:?}/{:?} paused={} park={:?} gen={} claim={} attempt={:?}",
                    agg.run.run_id,
                    agg.run.status,
                    agg.run.queue,
                    agg.run.paused,
                    agg.run.park_reason,
                    agg.run.lease.generation,
                    agg.run.lease.claim.is_some(),
                    agg.attempt.as_ref().map(|a| a.status)
                )
            })
            .collect();
        format!("t={} server_up={} {runs:?}", s.now, s.server_up)
    }
}
