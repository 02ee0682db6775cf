//! Why a run is not progressing, and who must act: the stuck-run explainer
//! (`pi-workflows why <runId>`, `run.why`, and the run view's `display.why`).
//!
//! [`headline`] decides the state, the actor and a one-line summary from
//! durable facts only; the run view stores it at each revision. [`explain`]
//! adds what changes without a revision (the claim's expiry against
//! `now_ms`, the queue position and capacity, the runner's last message, the
//! last commit) as one screen of lines and the same content as data.
//!
//! Precedence of [`WhyState`] (first match wins; the order of
//! [`crate::display`], so the two never disagree):
//! 1. a terminal run is `Done` (nobody acts; a failure names its restart);
//! 2. an ambiguous effect: an operator recovers it (`pi-workflows recover`);
//! 3. a durable pause: an operator resumes it (an open origin-session model
//!    turn still shows as `WaitingForAgent` until it ends);
//! 4. a pending request: a checkpoint or decision is answered by a person,
//!    an agent step by the origin Pi session (interactive) or by the run's
//!    runner (headless); a submission being validated waits for the server;
//! 5. a park that only an explicit resume releases: an operator;
//! 6. a held launch: the origin session (its launching Pi turn settles);
//! 7. a run waiting for admission (queued, or parked to resume on its own):
//!    the server, when a runner slot is free;
//! 8. a run that holds its claim: its runner when that runner is ready or
//!    starting, else the server, which recovers the run once the claim
//!    expires.
//!
//! Invariants:
//! - Total and deterministic: every [`WhyFacts`] maps to exactly one
//!   [`Why`]; time is the `now_ms` argument, never read.
//! - `explain(f, now)` has the state, actor and summary of `headline(f)` for
//!   every `now`: the view's `display.why` and `run.why` never disagree.
//! - Private values never appear: the facts hold no claim token, prompt,
//!   output, payload, session id or path (an origin session is only a
//!   flag), so no line can show one.
//! - Every command a line names is one the CLI serves for that state
//!   (`answer`, `recover`, `resume`, `cancel`, `restart`), with the run's id.
//! - One screen: at most [`MAX_LINES`] lines, each at most
//!   [`MAX_LINE_CHARS`] characters, and at most [`MAX_EFFECTS`] effects.

use crate::claim::OwnerKind;
use crate::decision::DecisionStatus;
use crate::display::PendingRequest;
use crate::ids::{EffectId, NodeId, RunId};
use crate::interaction::{InteractionKind, InteractionStatus};
use crate::message::TurnState;
use crate::run::{FailureClass, ParkReason, QueueStatus, RunAggregate, RunStatus};
use crate::runner::{RunnerOutcome, RunnerStatus};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// The most lines of one explanation.
pub const MAX_LINES: usize = 24;
/// The most characters of one line (the wire's `SafeMessage`).
pub const MAX_LINE_CHARS: usize = 512;
/// The most ambiguous effects listed.
pub const MAX_EFFECTS: usize = 16;

/// Why the run is or is not progressing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WhyState {
    Done,
    Running,
    Starting,
    Recovering,
    WaitingForAnswer,
    WaitingForAgent,
    Validating,
    Ambiguous,
    Paused,
    ParkedForReview,
    Queued,
    Held,
}

/// Who must act for the run to move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Actor {
    Nobody,
    Server,
    Runner,
    Person,
    OriginSession,
    Operator,
}

/// The pending request, as the explainer reads it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PendingFact {
    pub request: PendingRequest,
    pub node: Option<NodeId>,
    /// The request is worked in the run's origin Pi session (else by its runner).
    pub in_origin_session: bool,
    /// A protected decision's deadline.
    pub expires_at_ms: Option<u64>,
    /// A protected decision records a default choice at its deadline.
    pub has_default: bool,
}

/// The run's claim without its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimFact {
    pub owner: OwnerKind,
    pub generation: u64,
    pub expires_at_ms: u64,
}

/// The run's latest runner (no process identity, no epoch id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunnerFact {
    pub status: RunnerStatus,
    /// Launched, ready or finished: when it entered its status.
    pub since_ms: u64,
    /// When it last sent a message the server accepted.
    pub last_message_at_ms: Option<u64>,
}

/// An ambiguous effect: its id and attempt (never its request or result).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EffectFact {
    pub effect_id: EffectId,
    pub attempt_number: u32,
}

/// A run waiting for admission: its place and the runner capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QueueFact {
    /// 1-based place among the admissible runs, oldest first.
    pub position: u64,
    pub live_runners: u64,
    pub capacity: u64,
}

/// The run's last commit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CommitFact {
    pub revision: u64,
    pub at_ms: u64,
    /// The kind of the run's last stored event (a closed set of names).
    pub event: Option<String>,
}

/// Everything the explainer reads, and nothing more.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WhyFacts {
    pub run_id: RunId,
    pub status: RunStatus,
    pub queue: QueueStatus,
    pub paused: bool,
    pub park_reason: Option<ParkReason>,
    pub pending: Option<PendingFact>,
    pub validating: bool,
    pub model_turn_active: bool,
    /// The node of the run's unfinished attempt.
    pub attempt_node: Option<NodeId>,
    pub claim: Option<ClaimFact>,
    pub runner: Option<RunnerFact>,
    pub ambiguous: Vec<EffectFact>,
    pub failure: Option<FailureClass>,
    pub restart_eligible: bool,
    /// The run's place in the admission order (time-varying: not in the
    /// view); shown only while the run waits for admission.
    pub queue_position: Option<QueueFact>,
    pub last_commit: CommitFact,
}

/// Facts that are not part of a [`RunAggregate`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OutsideFacts {
    pub validating: bool,
    pub restart_eligible: bool,
    pub last_message_at_ms: Option<u64>,
    pub queue_position: Option<QueueFact>,
    pub last_event: Option<String>,
}

impl WhyFacts {
    /// Reads the explainer's facts from a run aggregate as the shell loads it.
    pub fn from_run(agg: &RunAggregate, outside: OutsideFacts) -> Self {
        let run = &agg.run;
        let decision = agg
            .decision
            .as_ref()
            .filter(|decision| decision.status == DecisionStatus::Pending);
        let interaction = agg
            .interaction
            .as_ref()
            .filter(|interaction| interaction.status == InteractionStatus::Pending);
        let pending = if run.status.is_terminal() {
            None
        } else if let Some(decision) = decision {
            Some(PendingFact {
                request: PendingRequest::HumanDecision,
                node: Some(decision.node_id.clone()),
                in_origin_session: false,
                expires_at_ms: decision.deadline_at_ms,
                has_default: decision.default_answer_digest.is_some(),
            })
        } else if let Some(interaction) = interaction {
            Some(PendingFact {
                request: match interaction.kind {
                    InteractionKind::SubmittedOutput => PendingRequest::AgentSubmit,
                    InteractionKind::AssistantMessage => PendingRequest::VisibleResponse,
                },
                node: Some(interaction.node_id.clone()),
                in_origin_session: interaction.target_session.is_some(),
                expires_at_ms: None,
                has_default: false,
            })
        } else if run.status == RunStatus::Waiting && run.waiting_on.is_some() {
            Some(PendingFact {
                request: PendingRequest::CheckpointAnswer,
                node: run.waiting_on.clone(),
                in_origin_session: false,
                expires_at_ms: None,
                has_default: false,
            })
        } else {
            None
        };
        Self {
            run_id: run.run_id.clone(),
            status: run.status,
            queue: run.queue,
            paused: run.paused,
            park_reason: run.park_reason,
            pending,
            validating: outside.validating,
            model_turn_active: agg
                .turns
                .iter()
                .any(|turn| turn.run_id == run.run_id && turn.state == TurnState::Open),
            attempt_node: agg
                .attempt
                .as_ref()
                .filter(|attempt| attempt.status.is_unfinished())
                .map(|attempt| attempt.node_id.clone()),
            claim: run.lease.claim.as_ref().map(|claim| ClaimFact {
                owner: claim.owner_kind,
                generation: claim.generation.0,
                expires_at_ms: claim.expires_at_ms,
            }),
            runner: run.runner.as_ref().map(|runner| RunnerFact {
                status: runner.status,
                since_ms: match runner.status {
                    RunnerStatus::Launching => runner.launched_at_ms,
                    RunnerStatus::Ready => runner.ready_at_ms.unwrap_or(runner.launched_at_ms),
                    RunnerStatus::Exited(_) => runner
                        .finished_at_ms
                        .or(runner.ready_at_ms)
                        .unwrap_or(runner.launched_at_ms),
                },
                last_message_at_ms: outside.last_message_at_ms,
            }),
            ambiguous: agg
                .effects
                .iter()
                .filter(|effect| effect.state == crate::effect::EffectState::Ambiguous)
                .map(|effect| EffectFact {
                    effect_id: effect.effect_id.clone(),
                    attempt_number: effect.attempt_number,
                })
                .collect(),
            failure: run.error.as_ref().map(|error| error.class),
            restart_eligible: outside.restart_eligible,
            queue_position: outside.queue_position,
            last_commit: CommitFact {
                revision: run.revision.0,
                at_ms: run.updated_at_ms,
                event: outside.last_event,
            },
        }
    }
}

/// The durable part: state, actor and one line.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Headline {
    pub state: WhyState,
    pub actor: Actor,
    pub summary: String,
}

/// The recovery commands of one ambiguous effect.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EffectRecovery {
    pub effect_id: EffectId,
    pub attempt_number: u32,
    pub confirm: String,
    pub retry: String,
}

/// The whole explanation: the headline, one screen of lines and the same
/// content as data.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Why {
    pub headline: Headline,
    pub lines: Vec<String>,
    pub claim: Option<(ClaimFact, bool)>,
    pub runner: Option<RunnerFact>,
    pub pending: Option<(PendingFact, Actor)>,
    pub effects: Vec<EffectRecovery>,
    pub queue: Option<QueueFact>,
    pub park: Option<ParkReason>,
    pub last_commit: CommitFact,
}

/// Who answers a pending request.
pub const fn answered_by(pending: &PendingFact) -> Actor {
    match pending.request {
        PendingRequest::CheckpointAnswer | PendingRequest::HumanDecision => Actor::Person,
        PendingRequest::AgentSubmit | PendingRequest::VisibleResponse => {
            if pending.in_origin_session {
                Actor::OriginSession
            } else {
                Actor::Runner
            }
        }
    }
}

const fn parked(facts: &WhyFacts) -> bool {
    matches!(facts.status, RunStatus::Running) && matches!(facts.queue, QueueStatus::Parked)
}

/// The state and actor by the module's precedence.
pub fn state(facts: &WhyFacts) -> (WhyState, Actor) {
    if facts.status.is_terminal() {
        return (WhyState::Done, Actor::Nobody);
    }
    if !facts.ambiguous.is_empty() {
        return (WhyState::Ambiguous, Actor::Operator);
    }
    if facts.paused {
        if facts.model_turn_active {
            return (WhyState::WaitingForAgent, Actor::OriginSession);
        }
        return (WhyState::Paused, Actor::Operator);
    }
    if let Some(pending) = &facts.pending {
        if facts.validating {
            return (WhyState::Validating, Actor::Server);
        }
        return match answered_by(pending) {
            Actor::Person => (WhyState::WaitingForAnswer, Actor::Person),
            actor => (WhyState::WaitingForAgent, actor),
        };
    }
    if parked(facts) {
        if facts
            .park_reason
            .is_some_and(|reason| !reason.resumes_automatically())
        {
            return (WhyState::ParkedForReview, Actor::Operator);
        }
        return (WhyState::Queued, Actor::Server);
    }
    if matches!(facts.park_reason, Some(ParkReason::Held)) {
        return (WhyState::Held, Actor::OriginSession);
    }
    if matches!(facts.status, RunStatus::Queued) {
        return (WhyState::Queued, Actor::Server);
    }
    if facts.model_turn_active {
        return (WhyState::WaitingForAgent, Actor::OriginSession);
    }
    match facts.runner.map(|runner| runner.status) {
        Some(RunnerStatus::Ready) => (WhyState::Running, Actor::Runner),
        Some(RunnerStatus::Launching) => (WhyState::Starting, Actor::Runner),
        Some(RunnerStatus::Exited(_)) | None => (WhyState::Recovering, Actor::Server),
    }
}

fn node_words(node: Option<&NodeId>) -> String {
    node.map_or_else(String::new, |node| format!(" at node `{}`", node.as_str()))
}

const fn park_words(reason: ParkReason) -> &'static str {
    match reason {
        ParkReason::Drained => "the server stopped while it ran",
        ParkReason::Recovered => "startup recovery made it claimable again",
        ParkReason::WorkerCrashed => "its runner crashed after saving progress",
        ParkReason::ResumeReady => "an interactive request settled",
        ParkReason::Paused => "it was paused",
        ParkReason::RunnerNoProgress => {
            "its runner exited without progress (a runner that fails the same way again would loop)"
        }
        ParkReason::WorkflowSourceChanged => {
            "the workflow source changed since the run started; check the change before resuming"
        }
        ParkReason::EffectAmbiguous => "an effect may have applied without a receipt",
        ParkReason::WorkerTimedOut => "its runner missed its startup handshake deadline",
        ParkReason::ProtocolRejected => "a runner message failed a protocol check",
        ParkReason::Held => "it waits for the Pi turn that launched it to settle",
    }
}

const fn failure_words(class: FailureClass) -> &'static str {
    match class {
        FailureClass::ClaimLost => "claim lost",
        FailureClass::WorkerCrashed => "runner crashed",
        FailureClass::RunnerNoProgress => "runner made no progress",
        FailureClass::WorkerTimedOut => "runner timed out",
        FailureClass::HostUnavailable => "server unavailable",
        FailureClass::SourceChanged => "workflow source changed",
        FailureClass::EffectAmbiguous => "effect ambiguous",
        FailureClass::NodeFailed => "node failed",
        FailureClass::ProtocolRejected => "protocol rejected",
    }
}

const fn status_words(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Queued => "queued",
        RunStatus::Running => "running",
        RunStatus::Waiting => "waiting",
        RunStatus::Completed => "completed",
        RunStatus::Failed => "failed",
        RunStatus::TimedOut => "timed out",
        RunStatus::Cancelled => "cancelled",
    }
}

fn answer_command(facts: &WhyFacts, request: PendingRequest) -> String {
    let run = facts.run_id.as_str();
    match request {
        PendingRequest::HumanDecision => format!("`pi-workflows answer {run} <choice> [text]`"),
        _ => format!("`pi-workflows answer {run} <json>`"),
    }
}

fn pending_summary(facts: &WhyFacts, state: WhyState, pending: &PendingFact) -> String {
    let at = node_words(pending.node.as_ref());
    match (state, pending.request) {
        (WhyState::Validating, _) => format!("the server validates a submission{at}"),
        (_, PendingRequest::HumanDecision) => format!(
            "waiting for a person to decide{at}: {} (or piw, Pi, a channel)",
            answer_command(facts, pending.request)
        ),
        (_, PendingRequest::CheckpointAnswer) => format!(
            "waiting for a person to answer the checkpoint{at}: {} (or piw, Pi)",
            answer_command(facts, pending.request)
        ),
        (_, PendingRequest::AgentSubmit | PendingRequest::VisibleResponse) => {
            if pending.in_origin_session {
                format!("waiting for the Pi session that started the run to finish its step{at}")
            } else {
                format!(
                    "waiting for the run's headless agent (on its runner) to finish its step{at}"
                )
            }
        }
    }
}

/// The durable headline: state, actor and one line, with no time in it.
pub fn headline(facts: &WhyFacts) -> Headline {
    let (state, actor) = state(facts);
    let run = facts.run_id.as_str();
    let node = node_words(facts.attempt_node.as_ref());
    let summary = match state {
        WhyState::Done => match facts
            .failure
            .filter(|_| matches!(facts.status, RunStatus::Failed | RunStatus::TimedOut))
        {
            Some(class) if facts.restart_eligible => format!(
                "the run {} ({}); nothing runs again unless restarted: `pi-workflows restart {run}`",
                status_words(facts.status),
                failure_words(class)
            ),
            Some(class) => format!(
                "the run {} ({}); nothing is pending",
                status_words(facts.status),
                failure_words(class)
            ),
            None => format!("the run {}; nothing is pending", status_words(facts.status)),
        },
        WhyState::Ambiguous => format!(
            "an effect may have applied without a receipt; an operator checks the external system, then `pi-workflows recover {run} confirm|retry`"
        ),
        WhyState::Paused => format!("paused; an operator resumes it: `pi-workflows resume {run}`"),
        WhyState::WaitingForAnswer | WhyState::WaitingForAgent | WhyState::Validating => {
            match &facts.pending {
                Some(pending) => pending_summary(facts, state, pending),
                None => {
                    format!("an agent turn in the Pi session that started the run is open{node}")
                }
            }
        }
        WhyState::ParkedForReview => {
            let reason = facts.park_reason.map_or("", park_words);
            format!(
                "parked: {reason}; an operator resumes it: `pi-workflows resume {run}` (or `pi-workflows cancel {run}`)"
            )
        }
        WhyState::Held => {
            "held until the Pi turn that launched it settles; the Pi session releases it".into()
        }
        WhyState::Queued => match facts.park_reason.filter(|_| parked(facts)) {
            Some(reason) => format!(
                "waiting for a runner slot: parked because {}; the server admits it again on its own",
                park_words(reason)
            ),
            None => "waiting for a runner slot; the server admits it in FIFO order".into(),
        },
        WhyState::Running => format!("running{node} on its runner; nothing to do"),
        WhyState::Starting => "its runner is starting; nothing to do".into(),
        WhyState::Recovering => {
            "no runner drives it; the server recovers the run when its claim expires".into()
        }
    };
    Headline {
        state,
        actor,
        summary: bound(summary),
    }
}

/// At most [`MAX_LINE_CHARS`] characters.
fn bound(mut line: String) -> String {
    if line.chars().count() > MAX_LINE_CHARS {
        let cut = line
            .char_indices()
            .nth(MAX_LINE_CHARS - 1)
            .map_or(line.len(), |(index, _)| index);
        line.truncate(cut);
        line.push('…');
    }
    line
}

/// `HH:MM:SS UTC` of a Unix time in milliseconds.
pub fn clock(ms: u64) -> String {
    let seconds = ms / 1000;
    let day = seconds % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        day / 3600,
        (day % 3600) / 60,
        day % 60
    )
}

/// A duration in words: `850 ms`, `27 s`, `4 min`, `3 h`, `2 d`.
pub fn span(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..120_000 => format!("{} s", ms / 1_000),
        120_000..7_200_000 => format!("{} min", ms / 60_000),
        7_200_000..172_800_000 => format!("{} h", ms / 3_600_000),
        _ => format!("{} d", ms / 86_400_000),
    }
}

/// `in 27 s (at 22:01:03 UTC)` or `27 s ago (at …)`.
pub fn relative(at_ms: u64, now_ms: u64) -> String {
    if at_ms >= now_ms {
        format!("in {} (at {})", span(at_ms - now_ms), clock(at_ms))
    } else {
        format!("{} ago (at {})", span(now_ms - at_ms), clock(at_ms))
    }
}

const fn queue_words(queue: QueueStatus) -> &'static str {
    match queue {
        QueueStatus::Queued => "queued",
        QueueStatus::Starting => "starting",
        QueueStatus::Running => "running",
        QueueStatus::Parked => "parked",
        QueueStatus::Done => "done",
        QueueStatus::Failed => "failed",
        QueueStatus::Cancelled => "cancelled",
    }
}

const fn runner_words(status: RunnerStatus) -> &'static str {
    match status {
        RunnerStatus::Launching => "starting (no runner.ready yet)",
        RunnerStatus::Ready => "ready",
        RunnerStatus::Exited(RunnerOutcome::Exited) => "exited",
        RunnerStatus::Exited(RunnerOutcome::Cancelled) => "stopped by the server",
        RunnerStatus::Exited(RunnerOutcome::TimedOut) => "killed at a deadline",
        RunnerStatus::Exited(RunnerOutcome::Crashed) => "crashed",
        RunnerStatus::Exited(RunnerOutcome::ClaimLost) => "exited after losing its claim",
        RunnerStatus::Exited(RunnerOutcome::Orphaned) => "orphaned by a server restart",
    }
}

const fn actor_words(actor: Actor) -> &'static str {
    match actor {
        Actor::Nobody => "nobody",
        Actor::Server => "the server",
        Actor::Runner => "the run's runner",
        Actor::Person => "a person",
        Actor::OriginSession => "the Pi session that started the run",
        Actor::Operator => "an operator",
    }
}

const fn request_words(request: PendingRequest) -> &'static str {
    match request {
        PendingRequest::AgentSubmit => "an agent step (submitted output)",
        PendingRequest::VisibleResponse => "an agent step (visible reply)",
        PendingRequest::CheckpointAnswer => "a checkpoint answer",
        PendingRequest::HumanDecision => "a protected human decision",
    }
}

/// The whole explanation at `now_ms`.
pub fn explain(facts: &WhyFacts, now_ms: u64) -> Why {
    let headline = headline(facts);
    let run = facts.run_id.as_str();
    let mut lines = Vec::new();
    lines.push(format!(
        "run {run}: {}, queue {}{} — who acts: {}",
        status_words(facts.status),
        queue_words(facts.queue),
        if facts.paused { ", paused" } else { "" },
        actor_words(headline.actor)
    ));
    lines.push(format!("why: {}", headline.summary));
    let claim = facts.claim.map(|claim| {
        let live = now_ms < claim.expires_at_ms;
        let holder = match claim.owner {
            OwnerKind::Host => "the server for its runner",
            OwnerKind::Control => "the server's control path",
        };
        lines.push(if live {
            format!(
                "claim: held by {holder} (generation {}), expires {}",
                claim.generation,
                relative(claim.expires_at_ms, now_ms)
            )
        } else {
            format!(
                "claim: held by {holder} (generation {}), expired {}; the server recovers the run at its next check",
                claim.generation,
                relative(claim.expires_at_ms, now_ms)
            )
        });
        (claim, live)
    });
    if claim.is_none() && !facts.status.is_terminal() {
        lines.push("claim: none (no runner may write for the run)".into());
    }
    if let Some(runner) = facts.runner {
        let mut line = format!(
            "runner: {} since {}",
            runner_words(runner.status),
            relative(runner.since_ms, now_ms)
        );
        match runner.last_message_at_ms {
            Some(at) => line.push_str(&format!("; last message {}", relative(at, now_ms))),
            None => line.push_str("; no message accepted yet"),
        }
        lines.push(line);
    } else if !facts.status.is_terminal() {
        lines.push("runner: none yet".into());
    }
    let pending = facts.pending.clone().map(|pending| {
        let by = answered_by(&pending);
        let mut line = format!(
            "pending: {}{}, answered by {}",
            request_words(pending.request),
            node_words(pending.node.as_ref()),
            actor_words(by)
        );
        if by == Actor::Person {
            line.push_str(&format!(" with {}", answer_command(facts, pending.request)));
        }
        if let Some(at) = pending.expires_at_ms {
            line.push_str(&format!(
                "; expires {}{}",
                relative(at, now_ms),
                if pending.has_default {
                    ", then its default choice is recorded"
                } else {
                    ", then the run times out"
                }
            ));
        }
        lines.push(line);
        (pending, by)
    });
    let effects: Vec<EffectRecovery> = facts
        .ambiguous
        .iter()
        .take(MAX_EFFECTS)
        .map(|effect| {
            let id = effect.effect_id.as_str();
            EffectRecovery {
                effect_id: effect.effect_id.clone(),
                attempt_number: effect.attempt_number,
                confirm: format!("pi-workflows recover {run} confirm --effect {id}"),
                retry: format!("pi-workflows recover {run} retry --effect {id}"),
            }
        })
        .collect();
    for effect in effects.iter().take(4) {
        lines.push(format!(
            "ambiguous effect {} (attempt {}): check the external system, then `{}` if it applied, or `{}` (may apply twice)",
            effect.effect_id.as_str(),
            effect.attempt_number,
            effect.confirm,
            effect.retry
        ));
    }
    if facts.ambiguous.len() > 4 {
        lines.push(format!(
            "… and {} more ambiguous effects (see `pi-workflows why {run} --json`)",
            facts.ambiguous.len() - 4
        ));
    }
    if !effects.is_empty() {
        lines.push(
            "then: the run continues on its own once no effect is ambiguous (unless paused)".into(),
        );
    }
    let queue = facts
        .queue_position
        .filter(|_| headline.state == WhyState::Queued);
    if let Some(queue) = queue {
        lines.push(format!(
            "queue: position {} for admission (oldest first); runners {} of {} busy",
            queue.position, queue.live_runners, queue.capacity
        ));
    }
    let park = facts
        .park_reason
        .filter(|_| parked(facts) || matches!(facts.park_reason, Some(ParkReason::Held)));
    if let Some(reason) = park {
        lines.push(format!("park: {}", park_words(reason)));
    }
    let commit = &facts.last_commit;
    lines.push(format!(
        "last commit: revision {} {}{}",
        commit.revision,
        relative(commit.at_ms, now_ms),
        commit
            .event
            .as_ref()
            .map_or_else(String::new, |event| format!(", event {event}"))
    ));
    lines.truncate(MAX_LINES);
    let lines = lines.into_iter().map(bound).collect();
    Why {
        headline,
        lines,
        claim,
        runner: facts.runner,
        pending,
        effects,
        queue,
        park,
        last_commit: facts.last_commit.clone(),
    }
}

#[cfg(test)]
mod tests;
