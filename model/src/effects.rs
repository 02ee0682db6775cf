//! Effects on a real run aggregate: a runner reserves an effect
//! (`effect::reserve`), applies it to the external system, settles it
//! (`effect::settle`); replies may be lost so requests are retried; the
//! runner may crash before, during or after applying; the server records a
//! runner's exit (`runner::decide_exit`, which parks a run whose runner
//! crashed), recovers an expired claim (`run::recover`), cancels the run
//! (`run::cancel`), an operator confirms or retries an ambiguous effect
//! (`effect::recover`), and a new generation is admitted (`run::admit` +
//! `runner.ready`) once the previous runner's exit is recorded.
//!
//! The external system is the oracle: it counts real applications per
//! attempt number, independently of what the kernel recorded.

use crate::harness::Summarize;
use crate::world::{self, TTL};
use core::fmt;
use kernel::claim::Authority;
use kernel::effect::{
    self, EffectKey, EffectRecord, EffectRejection, EffectState, RecoveryAction, ReserveRequest,
    Reserved, SettleOutcome, SettleReport, Settled,
};
use kernel::fixtures;
use kernel::ids::{AttemptId, Digest, EffectId, NodeId, RunId};
use kernel::output::{Output, StopReason, Transition};
use kernel::run::{self, ParkReason, RunAggregate, Terminal};
use kernel::runner::{self, ExitKind, RunnerExit};
use stateright::{Model, Property};

const EFFECT_TYPE: &str = "email";

/// The kernel's rules, or the kernel with one check dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EffectRules {
    Kernel,
    /// `reserve` starts an effect that is already applying (no `AlreadyApplying`).
    ReserveWhileApplying,
    /// Losing the runner treats an applying effect as never started
    /// (automatic retry instead of `ambiguous`).
    RunnerLossRetriesApplying,
    /// Cancellation marks an applying effect `cancelled` instead of `ambiguous`.
    CancelForgetsApplying,
    /// Admission ignores the previous runner epoch: a run whose runner has
    /// not exited yet is admitted again.
    AdmitBesideLiveRunner,
}

/// The bounded configuration.
#[derive(Clone, Debug)]
pub struct EffectsModel {
    pub max_ticks: u64,
    pub max_generation: u64,
    pub max_reviews: u8,
    pub max_requests: u8,
    pub rules: EffectRules,
}

impl EffectsModel {
    /// The CI configuration.
    pub fn ci(rules: EffectRules) -> Self {
        Self {
            max_ticks: 3,
            max_generation: 4,
            max_reviews: 2,
            max_requests: 8,
            rules,
        }
    }

    /// Larger bounds for local runs.
    pub fn deep(rules: EffectRules) -> Self {
        Self {
            max_ticks: 4,
            max_generation: 6,
            max_reviews: 4,
            max_requests: 12,
            rules,
        }
    }

    /// A one-line description of the bounds.
    pub fn bounds(&self) -> String {
        format!(
            "1 effect, ticks<={}, gen<={}, reviews<={}, runner requests<={}",
            self.max_ticks, self.max_generation, self.max_reviews, self.max_requests
        )
    }
}

/// Where the runner process is in its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Executing the node; it has not got an answer to `effect.reserve`.
    Working,
    /// Told to apply attempt `n`.
    Authorized(u32),
    /// Applied attempt `n` to the external system; settle not yet acknowledged.
    Applied(u32),
    /// The effect is settled (or adopted); the node can finish.
    Settled,
}

/// A live runner process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Runner {
    pub generation: u64,
    pub phase: Phase,
    /// The server told it to stop (its process group is being stopped).
    pub stop: Option<StopReason>,
}

impl Runner {
    /// How the server sees this process end on its own: stopped for the
    /// reason it was told, or `other`.
    fn exit_kind(&self, other: ExitKind) -> ExitKind {
        self.stop
            .map_or(other, |reason| ExitKind::Stopped { reason })
    }
}

/// A runner process that ended and whose exit the server has not recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Exiting {
    pub generation: u64,
    pub kind: ExitKind,
}

/// Oracle verdicts and reachability witnesses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Oracle {
    /// Real applications in the external system, per attempt number (1-based).
    pub applied: [u8; 4],
    /// Explicit operator retries.
    pub retries: u8,
    /// The kernel authorized an application that is neither settled nor
    /// reviewed yet (it may have reached the external system).
    pub unreviewed_authorization: bool,
    /// An application was authorized while an earlier one was unreviewed.
    pub automatic_retry: bool,
    /// A cancellation did not turn reserved into cancelled and applying into ambiguous.
    pub cancel_mismatch: bool,
    /// The run recorded a second runner epoch while its previous one was not
    /// `Exited` ([`world::second_live_epoch`]).
    pub two_live_epochs: bool,
    // Witnesses.
    pub settled_applied: bool,
    pub ambiguous_after_crash: bool,
    pub ambiguous_after_cancel: bool,
    pub confirmed: bool,
    pub completed_after_review: bool,
}

/// The model state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EffectsState {
    pub ticks: u64,
    pub now: u64,
    /// The committed run aggregate as the shell reloads it.
    pub agg: RunAggregate,
    /// The committed `effects` rows, settled ones included.
    pub table: Vec<EffectRecord>,
    /// The server's in-memory host authority for the live runner.
    pub server_host: Option<Authority>,
    pub runner: Option<Runner>,
    /// The ended runner process, until the server records its exit.
    pub exiting: Option<Exiting>,
    pub requests: u8,
    pub reviews: u8,
    pub oracle: Oracle,
}

/// One environment step, named by the kernel input it causes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EffectsAction {
    Tick,
    /// `effect.reserve`; the reply may be lost.
    Reserve {
        reply_lost: bool,
    },
    /// The runner applies its authorized attempt to the external system.
    Apply,
    /// `effect.settle(applied)`; the reply may be lost.
    Settle {
        reply_lost: bool,
    },
    /// `run::finish(completed)` by the runner.
    Finish,
    /// The runner process ends: it crashes, or the server's stop takes effect.
    CrashRunner,
    /// The server reaps the ended process: `runner::decide_exit`.
    RunnerExit,
    /// `run::recover(workerCrashed)` on an expired claim.
    Recover,
    /// `run::admit` and `runner.ready` for a new generation.
    StartRunner,
    /// `run::cancel` by a client.
    Cancel,
    /// `effect::recover` by an operator.
    Review(RecoveryAction),
}

impl fmt::Display for EffectsAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lost = |lost: &bool| if *lost { " (reply lost)" } else { "" };
        match self {
            Self::Tick => write!(f, "clock advances one claim lifetime"),
            Self::Reserve { reply_lost } => {
                write!(f, "runner: effect::reserve{}", lost(reply_lost))
            }
            Self::Apply => write!(f, "runner applies its authorized attempt externally"),
            Self::Settle { reply_lost } => {
                write!(f, "runner: effect::settle(applied){}", lost(reply_lost))
            }
            Self::Finish => write!(f, "runner: run::finish(completed)"),
            Self::CrashRunner => write!(f, "runner process ends (crash or stop)"),
            Self::RunnerExit => write!(f, "server reaps the runner: runner::decide_exit"),
            Self::Recover => write!(f, "server: run::recover(workerCrashed)"),
            Self::StartRunner => write!(f, "server: run::admit + runner.ready"),
            Self::Cancel => write!(f, "client: run::cancel"),
            Self::Review(action) => write!(f, "operator: effect::recover({action:?})"),
        }
    }
}

fn request() -> ReserveRequest {
    ReserveRequest {
        attempt_id: AttemptId::from("unset"),
        effect_type: EFFECT_TYPE.into(),
        request_fingerprint: Digest::repeat(0xe1),
    }
}

/// The one effect's id: the engine's key for (run-1, email, work, visit 1).
fn the_effect_id() -> EffectId {
    EffectKey {
        run_id: RunId::from("run-1"),
        effect_type: EFFECT_TYPE.into(),
        node_path: NodeId::from(world::NODE),
        visit: 1,
    }
    .effect_id()
}

impl EffectsModel {
    /// Commits a transition: the `effects` table gets every row, the
    /// aggregate is what the shell reloads. A runner it stops is told so.
    fn commit(state: &mut EffectsState, transition: Transition<RunAggregate>) {
        if world::second_live_epoch(&state.agg, &transition.facts) {
            state.oracle.two_live_epochs = true;
        }
        for output in &transition.outputs {
            if let Output::StopRunner { reason, .. } = output
                && let Some(runner) = state.runner.as_mut()
            {
                runner.stop.get_or_insert(*reason);
            }
        }
        for effect in &transition.facts.effects {
            match state
                .table
                .iter_mut()
                .find(|e| e.effect_id == effect.effect_id)
            {
                Some(row) => *row = effect.clone(),
                None => state.table.push(effect.clone()),
            }
        }
        state.agg = transition.facts.reload();
    }

    fn reserve(&self, state: &EffectsState, runner: &Runner) -> Result<Reserved, EffectRejection> {
        let mut req = request();
        // The attempt the runner was dispatched (what `fixtures::running` names it).
        req.attempt_id = AttemptId::new(format!("a-{}-{}", runner.generation, world::NODE));
        let id = the_effect_id();
        let existing = state.table.iter().find(|e| e.effect_id == id);
        let mut agg = state.agg.clone();
        if self.rules == EffectRules::ReserveWhileApplying {
            // Planted bug: an applying effect looks reserved to `reserve`.
            for effect in &mut agg.effects {
                if effect.state == EffectState::Applying {
                    effect.state = EffectState::Reserved;
                }
            }
        }
        let authority = world::host(runner.generation);
        effect::reserve(
            &agg,
            &authority,
            &fixtures::runner_epoch(runner.generation),
            req,
            existing,
            state.now,
            TTL,
        )
    }

    /// Run `state`'s runner process ends as `kind` (unless it was stopped).
    fn end_runner(state: &mut EffectsState, kind: ExitKind) {
        if let Some(runner) = state.runner.take() {
            state.exiting = Some(Exiting {
                generation: runner.generation,
                kind: runner.exit_kind(kind),
            });
        }
    }

    fn recover_run(&self, state: &EffectsState) -> Option<Transition<RunAggregate>> {
        let transition = run::recover(
            &state.agg,
            fixtures::control_request(),
            ParkReason::WorkerCrashed,
            state.now,
            TTL,
        )
        .ok()?;
        Some(self.runner_lost(state, transition))
    }

    /// `runner::decide_exit` for the ended process, with the host authority
    /// the server holds for it.
    fn decide_exit(&self, state: &EffectsState) -> Option<Transition<RunAggregate>> {
        let exiting = state.exiting?;
        let host = state
            .server_host
            .clone()
            .filter(|host| host.generation.0 == exiting.generation);
        let exit = RunnerExit {
            runner_epoch: fixtures::runner_epoch(exiting.generation),
            kind: exiting.kind,
        };
        let transition = runner::decide_exit(
            &state.agg,
            exit,
            host.as_ref(),
            fixtures::control_request(),
            state.now,
            TTL,
        )
        .ok()?;
        Some(self.runner_lost(state, transition))
    }

    /// A transition that may park the run after it lost its runner, under the rules.
    fn runner_lost(
        &self,
        state: &EffectsState,
        mut transition: Transition<RunAggregate>,
    ) -> Transition<RunAggregate> {
        if self.rules == EffectRules::RunnerLossRetriesApplying {
            // Planted bug: an effect that was applying is made reusable again.
            let was_applying: Vec<EffectId> = state
                .agg
                .effects
                .iter()
                .filter(|e| e.state == EffectState::Applying)
                .map(|e| e.effect_id.clone())
                .collect();
            for effect in &mut transition.facts.effects {
                if was_applying.contains(&effect.effect_id) {
                    effect.state = EffectState::Reserved;
                }
            }
            if !transition.facts.has_ambiguous_effect()
                && transition.facts.run.park_reason == Some(ParkReason::EffectAmbiguous)
            {
                transition.facts.run.park_reason = Some(ParkReason::WorkerCrashed);
            }
        }
        transition
    }

    fn cancel(&self, state: &EffectsState) -> Option<Transition<RunAggregate>> {
        let mut transition = run::cancel(
            &state.agg,
            state.server_host.as_ref(),
            fixtures::control_request(),
            state.now,
            TTL,
        )
        .ok()?;
        if self.rules == EffectRules::CancelForgetsApplying {
            for effect in &mut transition.facts.effects {
                let before = state
                    .agg
                    .effects
                    .iter()
                    .find(|e| e.effect_id == effect.effect_id);
                if before.is_some_and(|e| e.state == EffectState::Applying) {
                    effect.state = EffectState::Cancelled;
                }
            }
        }
        Some(transition)
    }
}

impl Model for EffectsModel {
    type State = EffectsState;
    type Action = EffectsAction;

    fn init_states(&self) -> Vec<EffectsState> {
        let reserved = fixtures::reserved(1, 0);
        let admitted = world::admit(&reserved, 0).expect("a reserved run is admissible");
        let running = world::ready(&admitted.facts, 1, 0).expect("the new runner is ready");
        vec![EffectsState {
            ticks: 0,
            now: 0,
            agg: running.facts.reload(),
            table: Vec::new(),
            server_host: Some(world::host(1)),
            runner: Some(Runner {
                generation: 1,
                phase: Phase::Working,
                stop: None,
            }),
            exiting: None,
            requests: 0,
            reviews: 0,
            oracle: Oracle::default(),
        }]
    }

    fn actions(&self, state: &EffectsState, out: &mut Vec<EffectsAction>) {
        if state.ticks < self.max_ticks {
            out.push(EffectsAction::Tick);
        }
        if let Some(runner) = &state.runner {
            let can_request = state.requests < self.max_requests;
            match runner.phase {
                Phase::Working if can_request => {
                    out.push(EffectsAction::Reserve { reply_lost: false });
                    out.push(EffectsAction::Reserve { reply_lost: true });
                }
                Phase::Authorized(_) => out.push(EffectsAction::Apply),
                Phase::Applied(_) if can_request => {
                    out.push(EffectsAction::Settle { reply_lost: false });
                    out.push(EffectsAction::Settle { reply_lost: true });
                }
                Phase::Settled => out.push(EffectsAction::Finish),
                _ => {}
            }
            out.push(EffectsAction::CrashRunner);
        } else if state.agg.run.lease.generation.0 < self.max_generation {
            out.push(EffectsAction::StartRunner);
        }
        if state.exiting.is_some() {
            out.push(EffectsAction::RunnerExit);
        }
        out.push(EffectsAction::Recover);
        out.push(EffectsAction::Cancel);
        if state.reviews < self.max_reviews && state.agg.has_ambiguous_effect() {
            out.push(EffectsAction::Review(RecoveryAction::Confirm));
            out.push(EffectsAction::Review(RecoveryAction::Retry));
        }
    }

    fn next_state(&self, state: &EffectsState, action: EffectsAction) -> Option<EffectsState> {
        let mut next = state.clone();
        let now = state.now;
        match action {
            EffectsAction::Tick => {
                next.ticks += 1;
                next.now += TTL;
            }
            EffectsAction::Reserve { reply_lost } => {
                let runner = state.runner.clone()?;
                next.requests += 1;
                match self.reserve(state, &runner) {
                    Ok(Reserved::Apply {
                        transition,
                        attempt_number,
                        ..
                    }) => {
                        if state.oracle.unreviewed_authorization {
                            next.oracle.automatic_retry = true;
                        }
                        next.oracle.unreviewed_authorization = true;
                        Self::commit(&mut next, transition);
                        if !reply_lost && let Some(r) = next.runner.as_mut() {
                            r.phase = Phase::Authorized(attempt_number);
                        }
                    }
                    Ok(Reserved::Adopt { .. }) => {
                        if !reply_lost && let Some(r) = next.runner.as_mut() {
                            r.phase = Phase::Settled;
                        }
                    }
                    // A refused runner is stopped (claim lost) and exits.
                    Err(_) if !reply_lost => Self::end_runner(
                        &mut next,
                        ExitKind::Stopped {
                            reason: StopReason::ClaimLost,
                        },
                    ),
                    Err(_) => {}
                }
            }
            EffectsAction::Apply => {
                let runner = next.runner.as_mut()?;
                let Phase::Authorized(n) = runner.phase else {
                    return None;
                };
                runner.phase = Phase::Applied(n);
                let slot = next.oracle.applied.get_mut(n as usize - 1)?;
                *slot = slot.saturating_add(1);
            }
            EffectsAction::Settle { reply_lost } => {
                let runner = state.runner.clone()?;
                next.requests += 1;
                let id = the_effect_id();
                let report = SettleReport {
                    effect_id: id.clone(),
                    outcome: SettleOutcome::Applied,
                    result_digest: Digest::repeat(0xa9),
                };
                let settled = state.table.iter().find(|e| e.effect_id == id);
                let result = effect::settle(
                    &state.agg,
                    &world::host(runner.generation),
                    &fixtures::runner_epoch(runner.generation),
                    report,
                    settled,
                    now,
                    TTL,
                );
                match result {
                    Ok(Settled::Commit(transition)) => {
                        next.oracle.unreviewed_authorization = false;
                        next.oracle.settled_applied = true;
                        Self::commit(&mut next, transition);
                        if !reply_lost && let Some(r) = next.runner.as_mut() {
                            r.phase = Phase::Settled;
                        }
                    }
                    Ok(Settled::Adopt { .. }) => {
                        if !reply_lost && let Some(r) = next.runner.as_mut() {
                            r.phase = Phase::Settled;
                        }
                    }
                    Err(_) if !reply_lost => Self::end_runner(
                        &mut next,
                        ExitKind::Stopped {
                            reason: StopReason::ClaimLost,
                        },
                    ),
                    Err(_) => {}
                }
            }
            EffectsAction::Finish => {
                let runner = state.runner.as_ref()?;
                let authority = world::host(runner.generation);
                let transition =
                    run::finish(&state.agg, Some(&authority), Terminal::Completed, now);
                // It exits after its reply (a refused finish: it was stopped).
                Self::end_runner(
                    &mut next,
                    if transition.is_ok() {
                        ExitKind::Clean
                    } else {
                        ExitKind::Stopped {
                            reason: StopReason::ClaimLost,
                        }
                    },
                );
                if let Ok(transition) = transition {
                    if state.reviews > 0 {
                        next.oracle.completed_after_review = true;
                    }
                    next.server_host = None;
                    Self::commit(&mut next, transition);
                }
            }
            EffectsAction::CrashRunner => Self::end_runner(&mut next, ExitKind::Abnormal),
            EffectsAction::RunnerExit => {
                let transition = self.decide_exit(state)?;
                next.exiting = None;
                Self::commit(&mut next, transition);
                if !run::RunRecord::pair_holds_claim(next.agg.run.status, next.agg.run.queue) {
                    next.server_host = None;
                }
                if next.agg.has_ambiguous_effect() && !state.agg.has_ambiguous_effect() {
                    next.oracle.ambiguous_after_crash = true;
                }
            }
            EffectsAction::Recover => {
                let transition = self.recover_run(state)?;
                Self::commit(&mut next, transition);
                next.server_host = None;
                if next.agg.has_ambiguous_effect() {
                    next.oracle.ambiguous_after_crash = true;
                }
            }
            EffectsAction::StartRunner => {
                let admitted = if self.rules == EffectRules::AdmitBesideLiveRunner {
                    // Planted bug: the previous runner epoch counts as exited.
                    world::admit_beside_live_runner(&state.agg, now).ok()?
                } else {
                    world::admit(&state.agg, now).ok()?
                };
                let generation = admitted.facts.run.lease.generation.0;
                let running = world::ready(&admitted.facts, generation, now)?;
                Self::commit(&mut next, running);
                next.server_host = Some(world::host(generation));
                next.runner = Some(Runner {
                    generation,
                    phase: Phase::Working,
                    stop: None,
                });
            }
            EffectsAction::Cancel => {
                let transition = self.cancel(state)?;
                for before in &state.agg.effects {
                    let after = transition
                        .facts
                        .effects
                        .iter()
                        .find(|e| e.effect_id == before.effect_id)
                        .map(|e| e.state);
                    let expected = match before.state {
                        EffectState::Reserved => Some(EffectState::Cancelled),
                        EffectState::Applying => Some(EffectState::Ambiguous),
                        other => Some(other),
                    };
                    if after != expected {
                        next.oracle.cancel_mismatch = true;
                    }
                }
                Self::commit(&mut next, transition);
                next.server_host = None;
                if next.agg.has_ambiguous_effect() {
                    next.oracle.ambiguous_after_cancel = true;
                }
            }
            EffectsAction::Review(action) => {
                let id = state
                    .agg
                    .effects
                    .iter()
                    .find(|e| e.state == EffectState::Ambiguous)?
                    .effect_id
                    .clone();
                let transition =
                    effect::recover(&state.agg, &id, action, Digest::repeat(0x0b), now).ok()?;
                next.reviews += 1;
                next.oracle.unreviewed_authorization = false;
                match action {
                    RecoveryAction::Confirm => next.oracle.confirmed = true,
                    RecoveryAction::Retry => next.oracle.retries += 1,
                }
                Self::commit(&mut next, transition);
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "an effect is applied at most once per attempt, and re-applied only after an operator retry",
                |_, s: &EffectsState| {
                    let total: u32 = s.oracle.applied.iter().map(|n| u32::from(*n)).sum();
                    s.oracle.applied.iter().all(|n| *n <= 1)
                        && total <= 1 + u32::from(s.oracle.retries)
                },
            ),
            Property::always(
                "an effect that may have applied is never retried without review",
                |_, s: &EffectsState| !s.oracle.automatic_retry,
            ),
            Property::always(
                "cancellation turns reserved into cancelled and applying into ambiguous",
                |_, s: &EffectsState| !s.oracle.cancel_mismatch,
            ),
            Property::always(
                "at most one runner epoch per run that is not Exited",
                |_, s: &EffectsState| !s.oracle.two_live_epochs,
            ),
            Property::sometimes("an effect is applied and settled", |_, s: &EffectsState| {
                s.oracle.settled_applied
            }),
            Property::sometimes(
                "a crash while applying leaves the effect ambiguous",
                |_, s: &EffectsState| s.oracle.ambiguous_after_crash,
            ),
            Property::sometimes(
                "cancelling while applying leaves the effect ambiguous",
                |_, s: &EffectsState| s.oracle.ambiguous_after_cancel,
            ),
            Property::sometimes(
                "an operator retry applies the effect a second time",
                |_, s: &EffectsState| s.oracle.applied[1] == 1,
            ),
            Property::sometimes(
                "an operator confirms an ambiguous effect",
                |_, s: &EffectsState| s.oracle.confirmed,
            ),
            Property::sometimes(
                "the run completes after an effect review",
                |_, s: &EffectsState| s.oracle.completed_after_review,
            ),
        ]
    }
}

impl Summarize for EffectsModel {
    fn summarize(&self, s: &EffectsState) -> String {
        let effects: Vec<String> = s
            .table
            .iter()
            .map(|e| format!("{:?} attempt {}", e.state, e.attempt_number))
            .collect();
        format!(
            "run {:?}/{:?} park {:?}; effect rows {effects:?}; external applications {:?}; operator retries {}",
            s.agg.run.status,
            s.agg.run.queue,
            s.agg.run.park_reason,
            s.oracle.applied,
            s.oracle.retries
        )
    }
}
