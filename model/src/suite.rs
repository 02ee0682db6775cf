//! The registry of models and planted bugs that the `model` binary and the
//! tests run. A new model adds one [`ModelEntry`] and its [`Mutation`]s here.

use crate::claims::{ClaimRules, ClaimsModel};
use crate::commands::{CommandRules, CommandsModel};
use crate::decisions::{DecisionRules, DecisionsModel};
use crate::effects::{EffectRules, EffectsModel};
use crate::harness::{Mode, Report, Stop, check};
use crate::lifecycle::{LifecycleModel, LifecycleRules};
use crate::messages::{Focus, MessageRules, MessagesModel};
use crate::supervision::{SupervisionModel, SupervisionRules};
use stateright::{Expectation, Model};

/// One model configuration with the kernel's rules.
#[derive(Clone, Copy, Debug)]
pub struct ModelEntry {
    pub name: &'static str,
    /// The unique state count of the CI configuration (pinned: a change in
    /// the kernel or the model that changes the explored space shows here).
    pub ci_unique_states: usize,
    run: fn(Mode) -> Report,
    properties: fn() -> Vec<(&'static str, Expectation)>,
}

impl ModelEntry {
    /// Checks the model exhaustively in `mode`.
    pub fn run(&self, mode: Mode) -> Report {
        (self.run)(mode)
    }

    /// The model's properties (names and kinds), without checking it.
    pub fn properties(&self) -> Vec<(&'static str, Expectation)> {
        (self.properties)()
    }
}

fn names<M: Model>(model: &M) -> Vec<(&'static str, Expectation)> {
    model
        .properties()
        .into_iter()
        .map(|p| (p.name, p.expectation))
        .collect()
}

/// One planted bug: a rule set with exactly one check dropped, and the
/// `always` or `eventually` property the checker must then violate.
#[derive(Clone, Copy, Debug)]
pub struct Mutation {
    pub name: &'static str,
    pub model: &'static str,
    pub dropped_check: &'static str,
    pub breaks: &'static str,
    run: fn(&'static str) -> Report,
}

impl Mutation {
    /// Checks the CI configuration under this mutation until the target
    /// property is violated (or the space is exhausted).
    pub fn run(&self) -> Report {
        (self.run)(self.breaks)
    }
}

fn claims(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => ClaimsModel::ci(ClaimRules::Kernel),
        Mode::Deep => ClaimsModel::deep(ClaimRules::Kernel),
    };
    check("claims", model.bounds(), model, Stop::Exhaustive)
}

fn effects(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => EffectsModel::ci(EffectRules::Kernel),
        Mode::Deep => EffectsModel::deep(EffectRules::Kernel),
    };
    check("effects", model.bounds(), model, Stop::Exhaustive)
}

fn commands(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => CommandsModel::ci(CommandRules::Kernel),
        Mode::Deep => CommandsModel::deep(CommandRules::Kernel),
    };
    check("commands", model.bounds(), model, Stop::Exhaustive)
}

fn decisions(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => DecisionsModel::ci(DecisionRules::Kernel),
        Mode::Deep => DecisionsModel::deep(DecisionRules::Kernel),
    };
    check("decisions", model.bounds(), model, Stop::Exhaustive)
}

fn lifecycle(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => LifecycleModel::ci(LifecycleRules::Kernel),
        Mode::Deep => LifecycleModel::deep(LifecycleRules::Kernel),
    };
    check("lifecycle", model.bounds(), model, Stop::Exhaustive)
}

fn liveness(mode: Mode) -> Report {
    let pauses = match mode {
        Mode::Ci => LIVENESS_PAUSES_CI,
        Mode::Deep => LIVENESS_PAUSES_DEEP,
    };
    let model = LifecycleModel::fault_free(LifecycleRules::Kernel, pauses);
    check("liveness", model.bounds(), model, Stop::Exhaustive)
}

fn messages(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => MessagesModel::ci(Focus::Delivery, MessageRules::Kernel),
        Mode::Deep => MessagesModel::deep(Focus::Delivery, MessageRules::Kernel),
    };
    check("messages", model.bounds(), model, Stop::Exhaustive)
}

fn turns(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => MessagesModel::ci(Focus::Turns, MessageRules::Kernel),
        Mode::Deep => MessagesModel::deep(Focus::Turns, MessageRules::Kernel),
    };
    check("turns", model.bounds(), model, Stop::Exhaustive)
}

fn supervision(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => SupervisionModel::ci(SupervisionRules::Kernel),
        Mode::Deep => SupervisionModel::deep(SupervisionRules::Kernel),
    };
    check("supervision", model.bounds(), model, Stop::Exhaustive)
}

/// The properties kernel finding 1 broke with capacity 2 (see
/// [`supervision_capacity_two`]).
pub const KERNEL_FINDING_PROPERTIES: [&str; 2] = [
    "at most one live runner per run",
    "at most one runner epoch per run that is not Exited",
];

/// The regression check of kernel finding 1, not a registered model: with
/// capacity 2 a slot is free while a stopped runner is still running. Before
/// the fix `run::admit` admitted such a run again and it had two live
/// runners (7 kernel inputs). Checked exhaustively with the clock as the only
/// fault ([`SupervisionModel::capacity_two_clock_only`], about 270 k states);
/// the full CI bounds with capacity 2 are about 11 M states.
pub fn supervision_capacity_two() -> Report {
    let model = SupervisionModel::capacity_two_clock_only(SupervisionRules::Kernel);
    check(
        "supervision (capacity 2, clock only)",
        model.bounds(),
        model,
        Stop::Exhaustive,
    )
}

/// The property the fused commit adds a planted bug for.
const FUSED_DEADLINE_PROPERTY: &str =
    "a runner runs a node with a static timeout only once its deadline is durable";

/// The fused commit (`execution::finish_and_start`): one run under every
/// fault of the supervision bounds (two runs in the deep mode).
fn supervision_fused(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => SupervisionModel::ci_fused(SupervisionRules::Kernel),
        Mode::Deep => SupervisionModel {
            runs: 2,
            ..SupervisionModel::ci_fused(SupervisionRules::Kernel)
        },
    };
    check("supervision-fused", model.bounds(), model, Stop::Exhaustive)
}

fn supervision_liveness(mode: Mode) -> Report {
    let model = match mode {
        Mode::Ci => SupervisionModel::fault_free(SupervisionRules::Kernel),
        Mode::Deep => SupervisionModel::fault_free_deep(SupervisionRules::Kernel),
    };
    check(
        "supervision-liveness",
        model.bounds(),
        model,
        Stop::Exhaustive,
    )
}

const LIVENESS_PAUSES_CI: u8 = 3;
const LIVENESS_PAUSES_DEEP: u8 = 6;

/// Every model, in the order the binary prints them.
pub fn models() -> Vec<ModelEntry> {
    vec![
        ModelEntry {
            name: "claims",
            ci_unique_states: 1_542_788,
            run: claims,
            properties: || names(&ClaimsModel::ci(ClaimRules::Kernel)),
        },
        ModelEntry {
            name: "effects",
            ci_unique_states: 209_574,
            run: effects,
            properties: || names(&EffectsModel::ci(EffectRules::Kernel)),
        },
        ModelEntry {
            name: "commands",
            ci_unique_states: 84_411,
            run: commands,
            properties: || names(&CommandsModel::ci(CommandRules::Kernel)),
        },
        ModelEntry {
            name: "decisions",
            ci_unique_states: 6_702,
            run: decisions,
            properties: || names(&DecisionsModel::ci(DecisionRules::Kernel)),
        },
        ModelEntry {
            name: "lifecycle",
            ci_unique_states: 759_889,
            run: lifecycle,
            properties: || names(&LifecycleModel::ci(LifecycleRules::Kernel)),
        },
        ModelEntry {
            name: "liveness",
            ci_unique_states: 296,
            run: liveness,
            properties: || {
                names(&LifecycleModel::fault_free(
                    LifecycleRules::Kernel,
                    LIVENESS_PAUSES_CI,
                ))
            },
        },
        ModelEntry {
            name: "supervision",
            // The claim-expiry step is `runner::on_claim_expired` (it parks
            // `recovered`, as the server does) and the kernel builds the
            // timed-out result record: 414_038 before.
            ci_unique_states: 413_856,
            run: supervision,
            properties: || names(&SupervisionModel::ci(SupervisionRules::Kernel)),
        },
        ModelEntry {
            name: "supervision-fused",
            ci_unique_states: 9_399,
            run: supervision_fused,
            // It checks every supervision property; the planted bugs of the
            // others target the `supervision` entry, this one's the deadline.
            properties: || {
                names(&SupervisionModel::ci_fused(SupervisionRules::Kernel))
                    .into_iter()
                    .filter(|(name, _)| *name == FUSED_DEADLINE_PROPERTY)
                    .collect()
            },
        },
        ModelEntry {
            name: "supervision-liveness",
            ci_unique_states: 1_571,
            run: supervision_liveness,
            properties: || names(&SupervisionModel::fault_free(SupervisionRules::Kernel)),
        },
        ModelEntry {
            name: "messages",
            ci_unique_states: 699_730,
            run: messages,
            properties: || names(&MessagesModel::ci(Focus::Delivery, MessageRules::Kernel)),
        },
        ModelEntry {
            name: "turns",
            ci_unique_states: 1_124_957,
            run: turns,
            properties: || names(&MessagesModel::ci(Focus::Turns, MessageRules::Kernel)),
        },
    ]
}

fn target(property: &'static str) -> Stop {
    Stop::Property(property)
}

macro_rules! mutation {
    ($name:literal, $model:literal, $dropped:literal, $breaks:literal, $build:expr) => {
        Mutation {
            name: $name,
            model: $model,
            dropped_check: $dropped,
            breaks: $breaks,
            run: |breaks| {
                let model = $build;
                check($model, model.bounds(), model, target(breaks))
            },
        }
    };
}

/// Every planted bug. Each `always` and `eventually` property of every
/// model appears at least once in `breaks`.
pub fn mutations() -> Vec<Mutation> {
    vec![
        mutation!(
            "owner-only-fencing",
            "claims",
            "a protected write compares only the owner, not token, generation or expiry",
            "no write from an expired, older-generation or foreign claim commits",
            ClaimsModel::ci(ClaimRules::OwnerOnlyFencing)
        ),
        mutation!(
            "renew-after-expiry",
            "claims",
            "renewal skips the expiry check when the identity matches",
            "an expired claim never renews itself",
            ClaimsModel::ci(ClaimRules::RenewAfterExpiry)
        ),
        mutation!(
            "acquire-while-held",
            "claims",
            "acquire ignores a live claim",
            "at most one live claim per run",
            ClaimsModel::ci(ClaimRules::AcquireWhileHeld)
        ),
        mutation!(
            "take-without-lock",
            "claims",
            "a starting server takes the epoch without holding the global server lock",
            "at most one server epoch accepts commands: only the current epoch commits writes",
            ClaimsModel::ci(ClaimRules::TakeWithoutLock)
        ),
        mutation!(
            "runner-loss-retries-applying",
            "effects",
            "losing the runner makes an applying effect reserved (retried) instead of ambiguous",
            "an effect is applied at most once per attempt, and re-applied only after an operator retry",
            EffectsModel::ci(EffectRules::RunnerLossRetriesApplying)
        ),
        mutation!(
            "reserve-while-applying",
            "effects",
            "reserve starts an effect that is already applying (no AlreadyApplying)",
            "an effect that may have applied is never retried without review",
            EffectsModel::ci(EffectRules::ReserveWhileApplying)
        ),
        mutation!(
            "cancel-forgets-applying",
            "effects",
            "cancellation marks an applying effect cancelled instead of ambiguous",
            "cancellation turns reserved into cancelled and applying into ambiguous",
            EffectsModel::ci(EffectRules::CancelForgetsApplying)
        ),
        mutation!(
            "effects-admit-beside-live-runner",
            "effects",
            "admission ignores the previous runner epoch: a run whose runner has not exited is admitted again",
            "at most one runner epoch per run that is not Exited",
            EffectsModel::ci(EffectRules::AdmitBesideLiveRunner)
        ),
        mutation!(
            "fingerprint-includes-request-id",
            "commands",
            "the fingerprint includes the transport request id",
            "a repeated command with the same key and fingerprint returns the same receipt",
            CommandsModel::ci(CommandRules::FingerprintIncludesRequestId)
        ),
        mutation!(
            "payload-outside-fingerprint",
            "commands",
            "the payload digest is not compared",
            "another payload under the same key is a conflict and changes nothing",
            CommandsModel::ci(CommandRules::PayloadOutsideFingerprint)
        ),
        mutation!(
            "no-lookup-by-key",
            "commands",
            "the shell looks receipts up by request id only",
            "a command under one key commits at most once",
            CommandsModel::ci(CommandRules::NoLookupByKey)
        ),
        mutation!(
            "store-transient",
            "commands",
            "receipt::record stores transient outcomes",
            "only durable outcomes are stored as receipts",
            CommandsModel::ci(CommandRules::StoreTransient)
        ),
        mutation!(
            "second-answer-also-continues",
            "decisions",
            "a different answer after acceptance is not refused (already decided)",
            "a decision is accepted at most once: its winner never changes",
            DecisionsModel::ci(DecisionRules::SecondAnswerAlsoContinues)
        ),
        mutation!(
            "two-continuation-winners",
            "decisions",
            "a different answer after acceptance is not refused and reserves its own child",
            "a waiting parent has at most one continuation and one engine start",
            DecisionsModel::ci(DecisionRules::SecondAnswerAlsoContinues)
        ),
        mutation!(
            "answer-after-deadline-wins",
            "decisions",
            "an answer is not compared with the deadline",
            "an answer at or after the deadline never wins",
            DecisionsModel::ci(DecisionRules::AnswerAfterDeadlineWins)
        ),
        mutation!(
            "deadline-ignores-pause",
            "decisions",
            "the deadline timer does not check the durable pause",
            "no decision is accepted while its run is paused",
            DecisionsModel::ci(DecisionRules::DeadlineIgnoresPause)
        ),
        mutation!(
            "checkpoint-answer-ignores-decision",
            "decisions",
            "an ordinary checkpoint answer does not look for a protected decision",
            "a continuation exists only for an accepted decision",
            DecisionsModel::ci(DecisionRules::CheckpointAnswerIgnoresDecision)
        ),
        mutation!(
            "cancel-ignores-terminal",
            "lifecycle",
            "cancel does not refuse a terminal run",
            "terminal run states are absorbing",
            LifecycleModel::ci(LifecycleRules::CancelIgnoresTerminal)
        ),
        mutation!(
            "park-keeps-attempt",
            "lifecycle",
            "parking does not abandon the active attempt",
            "run, queue, claim, pause and attempt projections agree after every step",
            LifecycleModel::ci(LifecycleRules::ParkKeepsAttempt)
        ),
        mutation!(
            "recover-live-claim",
            "lifecycle",
            "recovery does not wait for the claim to expire",
            "recovery never takes over a live claim",
            LifecycleModel::ci(LifecycleRules::RecoverLiveClaim)
        ),
        mutation!(
            "admit-beside-live-runner",
            "lifecycle",
            "admission ignores the previous runner epoch: a run whose stopped runner has not exited is admitted again (the kernel before finding 1 was fixed)",
            "at most one runner epoch per run that is not Exited",
            LifecycleModel::ci(LifecycleRules::AdmitBesideLiveRunner)
        ),
        mutation!(
            "admit-only-queued",
            "liveness",
            "the scheduler never admits a resumable parked run",
            "with no faults, every admitted run reaches a terminal or waiting state",
            LifecycleModel::fault_free(LifecycleRules::AdmitOnlyQueued, LIVENESS_PAUSES_CI)
        ),
        mutation!(
            "owner-only-runner-fencing",
            "supervision",
            "a runner write compares only the claim owner, not token, generation or expiry",
            "no stale runner write commits",
            SupervisionModel::ci(SupervisionRules::OwnerOnlyRunnerFencing)
        ),
        mutation!(
            "exit-park-keeps-attempt",
            "supervision",
            "the runner-exit decision parks without abandoning the active attempt",
            "a run has at most one unfinished attempt, run by its current generation",
            SupervisionModel::ci(SupervisionRules::ParkKeepsAttempt)
        ),
        mutation!(
            "started-drops-deadline",
            "supervision",
            "node.started records no deadline",
            "a runner runs a node with a static timeout only once its deadline is durable",
            SupervisionModel::ci(SupervisionRules::StartedDropsDeadline)
        ),
        mutation!(
            "fused-drops-deadline",
            "supervision-fused",
            "the fused commit reports a static deadline it does not record",
            "a runner runs a node with a static timeout only once its deadline is durable",
            SupervisionModel::ci_fused(SupervisionRules::FusedDropsDeadline)
        ),
        mutation!(
            "no-step-limit",
            "supervision",
            "routing does not check maxSteps",
            "steps never exceed maxSteps",
            SupervisionModel::ci(SupervisionRules::NoStepLimit)
        ),
        mutation!(
            "capacity-ignored",
            "supervision",
            "the scheduler ignores the capacity",
            "never more live runners than capacity",
            SupervisionModel::ci(SupervisionRules::CapacityIgnored)
        ),
        mutation!(
            "supervision-admit-beside-live-runner",
            "supervision",
            "admission ignores the previous runner epoch: a parked run whose stopped runner has not exited is a candidate and is admitted (checked with capacity 2, clock only: with capacity 1 the stopped runner holds the only slot)",
            "at most one runner epoch per run that is not Exited",
            SupervisionModel::capacity_two_clock_only(SupervisionRules::AdmitBesideLiveRunner)
        ),
        mutation!(
            "supervision-admit-beside-live-runner-process",
            "supervision",
            "the same planted bug, aimed at the per-process property (capacity 2, clock only)",
            "at most one live runner per run",
            SupervisionModel::capacity_two_clock_only(SupervisionRules::AdmitBesideLiveRunner)
        ),
        mutation!(
            "no-crash-retry-budget",
            "supervision",
            "the runner-exit decision ignores the crash-retry budget",
            "claim loss never produces a failed run",
            SupervisionModel::ci(SupervisionRules::NoCrashRetryBudget)
        ),
        mutation!(
            "readmit-no-progress",
            "supervision",
            "runnerNoProgress is treated as a reason that resumes automatically",
            "a run without progress since ready is never re-admitted automatically",
            SupervisionModel::ci(SupervisionRules::ReadmitNoProgress)
        ),
        mutation!(
            "admit-reuses-generation",
            "supervision",
            "run::admit does not take a new generation for the new runner epoch",
            "exactly one engine start (launch command) per generation",
            SupervisionModel::ci(SupervisionRules::AdmitReusesGeneration)
        ),
        mutation!(
            "admit-ignores-terminal",
            "supervision",
            "admission does not refuse a terminal run",
            "terminal run states are absorbing",
            SupervisionModel::ci(SupervisionRules::AdmitIgnoresTerminal)
        ),
        mutation!(
            "exit-keeps-claim",
            "supervision",
            "the runner-exit decision parks without releasing the claim",
            "run, queue, runner and claim projections agree after every crash point",
            SupervisionModel::ci(SupervisionRules::ExitKeepsClaim)
        ),
        mutation!(
            "no-runner-receipts",
            "supervision",
            "the shell never looks up runner-message receipts",
            "every delivery of one runner message gets the same durable reply",
            SupervisionModel::ci(SupervisionRules::NoRunnerReceipts)
        ),
        mutation!(
            "runner-fingerprint-ignored",
            "supervision",
            "decide_runner_message does not compare the payload digest",
            "another payload under a runner message id is a conflict, never a stored reply",
            SupervisionModel::ci(SupervisionRules::RunnerFingerprintIgnored)
        ),
        mutation!(
            "supervision-admit-only-queued",
            "supervision-liveness",
            "the scheduler never admits a parked run (resumeReady after a timeout route)",
            "with no faults, every admitted run reaches a terminal or waiting state",
            SupervisionModel::fault_free(SupervisionRules::AdmitOnlyQueued)
        ),
        mutation!(
            "no-coordinator-epoch-check",
            "messages",
            "branch and turn reports are accepted from any connection, without session::check",
            "at most one active coordinator epoch per origin session: only the newest connection's reports are accepted",
            MessagesModel::ci(Focus::Delivery, MessageRules::NoCoordinatorEpochCheck)
        ),
        mutation!(
            "fenced-retakes-epoch",
            "messages",
            "session::connect forgets fenced connections, so a fenced connection's next session-view read takes the epoch back",
            "a fenced connection stays fenced while another connection is active: its session-view reads take no epoch",
            MessagesModel::ci(Focus::Delivery, MessageRules::FencedRetakesEpoch)
        ),
        mutation!(
            "old-epoch-still-offered",
            "messages",
            "session::offer serves any connection, not only the active epoch",
            "only the active epoch is offered messages",
            MessagesModel::ci(Focus::Delivery, MessageRules::OldEpochStillOffered)
        ),
        mutation!(
            "sent-returns-to-pending",
            "messages",
            "a sent message absent from an idle branch becomes pending again",
            "a sent message never returns to pending",
            MessagesModel::ci(Focus::Delivery, MessageRules::SentReturnsToPending)
        ),
        mutation!(
            "send-without-branch-report",
            "messages",
            "session::offer does not wait for the epoch's branch report",
            "a message becomes sent only from branch evidence and is never offered while the branch shows it",
            MessagesModel::ci(Focus::Delivery, MessageRules::SendWithoutBranchReport)
        ),
        mutation!(
            "reminder-without-guard",
            "turns",
            "the unproductive-turn rule creates a reminder without the one-pending-step guard",
            "at most one pending step message per interactive request and at most one pending reminder",
            MessagesModel::ci(Focus::Turns, MessageRules::ReminderWithoutGuard)
        ),
        mutation!(
            "stale-turn-clears-newer",
            "turns",
            "a turn-end report is matched to its message's open turn instead of its turn id",
            "a stale turn id never clears a newer open turn",
            MessagesModel::ci(Focus::Turns, MessageRules::StaleTurnClearsNewer)
        ),
        mutation!(
            "counter-past-limit",
            "turns",
            "the unproductive-turn limit is compared one end late",
            "the unproductive counter never exceeds 3, reaching 3 fails the attempt, and only eligible ends count",
            MessagesModel::ci(Focus::Turns, MessageRules::CounterPastLimit)
        ),
        mutation!(
            "terminal-keeps-turns",
            "turns",
            "ending the run does not end its open turns as lost",
            "message projections agree with the run",
            MessagesModel::ci(Focus::Turns, MessageRules::TerminalKeepsTurns)
        ),
        mutation!(
            "disconnect-keeps-clock",
            "turns",
            "a closed coordinator connection leaves its session's turn clocks running (no session::suspend_clocks)",
            "a request's turn clock runs only during a reported step turn of the active coordinator on an unpaused run",
            MessagesModel::ci(Focus::Turns, MessageRules::DisconnectKeepsClock)
        ),
        mutation!(
            "terminal-message-not-run-keyed",
            "turns",
            "the terminal message is not keyed by its run: a rebuild at startup does not find it and makes another",
            "a run has at most one terminal message, and only once it ended",
            MessagesModel::ci(Focus::Turns, MessageRules::TerminalMessageNotRunKeyed)
        ),
    ]
}

/// The model entry named `name`.
pub fn model(name: &str) -> Option<ModelEntry> {
    models().into_iter().find(|entry| entry.name == name)
}

/// The mutation named `name`.
pub fn mutation(name: &str) -> Option<Mutation> {
    mutations().into_iter().find(|m| m.name == name)
}
