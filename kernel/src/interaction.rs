//! Interactive requests and their submissions.
//!
//! Invariants:
//! - A runner makes a request for its one `Active` attempt, under its live
//!   claim. One node attempt has at most one interactive request: a repeat
//!   of the same request adopts it without change, another request for the
//!   same attempt is a conflict.
//! - An interactive run's request moves its attempt to `Waiting`, the run to
//!   `waiting/parked` (claim released) and creates exactly one pending
//!   `initial` step message. A headless run's request has no session and no
//!   message: the attempt stays `Active` under the live runner's claim, the
//!   runner's own Pi child does the work, and the runner finishes the attempt
//!   itself once a submission is accepted ([`finish_allowed`]). An attempt
//!   abandoned after its submission was accepted is decided by it: the next
//!   generation adopts that output ([`adoptable_submission`]), never asks
//!   again.
//! - A submission names its authority: the origin session and its active
//!   coordinator epoch for an interactive run, the live runner (generation
//!   and epoch) for a headless one ([`check_authority`]), checked before any
//!   receipt lookup. A coordinator epoch that is not the session's active
//!   one (a fenced or ended connection) is `StaleCoordinator`, a claim loss.
//! - Pause is stored once, on the run; an interaction is paused exactly when
//!   its run is paused ([`is_paused`]) and is never paused on its own.
//! - One idempotency key names one payload: a repeat adopts the stored
//!   submission, another payload under the same key is a conflict.
//! - At most one submission of a request is `Validating`. Only the verdict
//!   for that submission counts; any other verdict is stale.
//! - A request settles only through an accepted submission, cancellation,
//!   timeout or failure; a rejected or stopped validation leaves it pending.
//!   Acceptance cancels the request's pending step messages.
//! - This module never routes: an accepted submission returns
//!   [`AttemptFollowUp::FinishOk`] for the execution module to apply.
//! - An origin-session request's node timeout is model-turn time
//!   ([`TurnClock`]): it counts only while a reported model turn of its step
//!   message runs from the session's connected coordinator. Message
//!   delivery, waiting, pause, a disconnect, a closed Pi session and server
//!   downtime do not consume it; what a stopped segment consumed is kept.

use crate::attempt::AttemptStatus;
use crate::claim::Authority;
use crate::ids::{
    AttemptId, CoordinatorEpoch, Digest, IdempotencyKey, InteractionId, MessageId, NodeId, RunId,
    RunnerEpochId, SessionId, SubmissionId,
};
use crate::message::{MessageKind, MessageRecord, MessageState, StepReason};
use crate::output::{Output, RunEvent, Transition, WakeReason};
use crate::run::{self, Operation, ReasonKind, Rejection, RunAggregate, RunRecord, Tx};
use serde::{Deserialize, Serialize};

/// What kind of work the origin session must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InteractionKind {
    /// An agent step that completes through `submit` (and may `update`).
    SubmittedOutput,
    /// An agent step whose visible assistant reply is the output.
    AssistantMessage,
}

/// The state of one interactive request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum InteractionStatus {
    Pending,
    /// Settled by the accepted submission.
    Accepted,
    Cancelled,
    TimedOut,
    /// The attempt failed (for example after too many unproductive turns).
    Failed,
}

/// One `interactive_requests` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InteractionRecord {
    pub interaction_id: InteractionId,
    pub run_id: RunId,
    pub attempt_id: AttemptId,
    pub node_id: NodeId,
    /// The origin session that does the work; `None` for a headless run,
    /// whose live runner does it in its own Pi child.
    pub target_session: Option<SessionId>,
    pub kind: InteractionKind,
    pub contract_hash: Digest,
    pub status: InteractionStatus,
    pub accepted_submission: Option<SubmissionId>,
    /// Completed, recoverably failed or lost turns that ended without a submission.
    pub unproductive_turn_ends: u32,
    /// Increases when the request is presented again (resume after an aborted turn).
    pub revision: u32,
    /// The node timeout in model-turn time (origin-session requests only).
    pub clock: TurnClock,
    pub created_at_ms: u64,
}

/// The node timeout of an origin-session request, counted in model-turn
/// time: a segment runs from a reported model turn's start (of the request's
/// step message, from the session's connected coordinator) until that turn
/// ends or is lost, the coordinator disconnects, the run pauses or the
/// server stops; only running segments consume the budget.
///
/// Invariants: `consumed_ms` only grows; a stopped segment keeps what it
/// consumed; a clock without a budget never expires.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct TurnClock {
    /// The node's time left when the request committed (its resolved
    /// deadline minus the request time); `None`: no deadline.
    pub budget_ms: Option<u64>,
    /// Turn time consumed by stopped segments.
    pub consumed_ms: u64,
    /// The start of the running segment, if one runs.
    pub running_since_ms: Option<u64>,
}

impl TurnClock {
    /// A stopped clock with `budget_ms` to spend.
    pub const fn new(budget_ms: Option<u64>) -> Self {
        Self {
            budget_ms,
            consumed_ms: 0,
            running_since_ms: None,
        }
    }

    /// The clock of a request made at `now_ms` for an attempt whose resolved
    /// wall-clock deadline is `deadline_at_ms`: the time left then.
    pub fn at_request(deadline_at_ms: Option<u64>, now_ms: u64) -> Self {
        Self::new(deadline_at_ms.map(|deadline| deadline.saturating_sub(now_ms)))
    }

    /// Whether a segment runs.
    pub const fn is_running(&self) -> bool {
        self.running_since_ms.is_some()
    }

    /// Turn time consumed up to `now_ms`.
    pub fn used_ms(&self, now_ms: u64) -> u64 {
        let running = self
            .running_since_ms
            .map_or(0, |since| now_ms.saturating_sub(since));
        self.consumed_ms.saturating_add(running)
    }

    /// Whether the budget is spent at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.budget_ms
            .is_some_and(|budget| self.used_ms(now_ms) >= budget)
    }

    /// When the budget is spent if the clock keeps running: `now_ms` once
    /// it is spent, the end of the running segment's budget while one runs,
    /// and `None` while the clock is stopped with time left (or has no
    /// budget): a stopped clock cannot expire.
    pub fn deadline_at_ms(&self, now_ms: u64) -> Option<u64> {
        let budget = self.budget_ms?;
        let left = budget.saturating_sub(self.used_ms(now_ms));
        if left == 0 {
            return Some(now_ms);
        }
        self.running_since_ms.map(|_| now_ms.saturating_add(left))
    }

    /// The clock with a segment running from `now_ms` (unchanged while one runs).
    #[must_use]
    pub const fn started(self, now_ms: u64) -> Self {
        match self.running_since_ms {
            Some(_) => self,
            None => Self {
                running_since_ms: Some(now_ms),
                ..self
            },
        }
    }

    /// The clock with its running segment ended at `at_ms` (never before the
    /// segment began), its time added to `consumed_ms`; unchanged while stopped.
    #[must_use]
    pub fn stopped(self, at_ms: u64) -> Self {
        match self.running_since_ms {
            Some(since) => Self {
                budget_ms: self.budget_ms,
                consumed_ms: self.consumed_ms.saturating_add(at_ms.saturating_sub(since)),
                running_since_ms: None,
            },
            None => self,
        }
    }
}

/// The validation state of one submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SubmissionOutcome {
    /// A supervised child is running the node's `validate`.
    Validating,
    Accepted,
    Rejected,
}

/// One `interactive_submissions` row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SubmissionRecord {
    pub interaction_id: InteractionId,
    pub submission_id: SubmissionId,
    pub idempotency_key: IdempotencyKey,
    pub payload_hash: Digest,
    pub outcome: SubmissionOutcome,
    pub submitted_at_ms: u64,
}

/// What a terminal run (cancelled, failed, timed out) does to its pending request.
pub fn on_run_terminal(record: &InteractionRecord) -> InteractionRecord {
    let mut next = record.clone();
    if record.status == InteractionStatus::Pending {
        next.status = InteractionStatus::Cancelled;
    }
    next
}

/// Whether the run's pending interaction is paused. Pause lives only on the
/// run; this is the one place an interaction's paused state is derived.
pub fn is_paused(agg: &RunAggregate) -> bool {
    agg.run.paused
        && agg
            .interaction
            .as_ref()
            .is_some_and(|record| record.status == InteractionStatus::Pending)
}

/// Why an interaction transition was refused. Nothing changes on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "reason")]
pub enum InteractionRejection {
    /// A lifecycle rule refused it (claim lost, stale runner, paused, terminal, …).
    Run { rejection: Rejection },
    /// A headless run has no origin session to ask.
    Headless,
    /// The run has no `Active` attempt with the proposed id.
    NotActiveAttempt { attempt_id: AttemptId },
    /// The attempt already has another request.
    RequestConflict { existing: InteractionId },
    /// The run's request is not the one named.
    UnknownInteraction { interaction_id: InteractionId },
    /// Only a submitted-output request takes submissions.
    NotSubmittedOutput,
    /// The idempotency key already names another payload.
    SubmissionConflict { submission_id: SubmissionId },
    /// The request is settled.
    NotPending { status: InteractionStatus },
    /// Another submission is still being validated.
    ValidationInProgress { submission_id: SubmissionId },
    /// The verdict is not for the request's validating submission.
    StaleVerdict { submission_id: SubmissionId },
    /// The submission names another authority than the run's (a runner for
    /// an interactive run, a session for a headless one, another session).
    WrongAuthority,
    /// The origin session's coordinator epoch named is not its active one:
    /// another connection coordinates the session now (or none does).
    StaleCoordinator,
    /// A headless runner proposed the attempt's result before a submission
    /// was accepted.
    NotAccepted,
}

impl From<Rejection> for InteractionRejection {
    fn from(rejection: Rejection) -> Self {
        Self::Run { rejection }
    }
}

/// What another module must do in the same transaction, as decided here.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "followUp")]
pub enum AttemptFollowUp {
    /// The accepted submission is the attempt's output: finish it `ok`
    /// with that output and route (the execution module does both).
    FinishOk {
        run_id: RunId,
        attempt_id: AttemptId,
        submission_id: SubmissionId,
    },
    /// The attempt fails for `reason` (too many unproductive turns): the
    /// execution module finishes it `failed` with `Actor::Control { failure:
    /// Some(reason) }`, so a run that ends there records this reason.
    Fail {
        run_id: RunId,
        attempt_id: AttemptId,
        reason: ReasonKind,
    },
}

/// The runner's `interaction.requested` proposal.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestProposal {
    pub interaction_id: InteractionId,
    pub attempt_id: AttemptId,
    pub kind: InteractionKind,
    pub contract_hash: Digest,
    /// The resolved wall-clock deadline, used when the attempt has none yet.
    pub deadline_at_ms: Option<u64>,
    /// The id of the `initial` step message.
    pub message_id: MessageId,
    /// The session order of that message.
    pub message_order: u64,
}

/// The result of an accepted request proposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requested {
    /// A new request: commit the transition.
    Created(Transition<RunAggregate>),
    /// A repeat of the committed request: nothing changes.
    Adopted(InteractionRecord),
}

/// The runner proposes `interaction.requested` for its `Active` attempt.
///
/// The request is created pending (revision 1); the attempt waits with its
/// resolved deadline, whose time left becomes the request's stopped
/// [`TurnClock`]; the run becomes `waiting/parked` and releases the claim;
/// one pending `initial` step message is created. The shell wakes at once
/// only when no time is left (the clock otherwise starts with a turn).
pub fn request(
    agg: &RunAggregate,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    proposal: RequestProposal,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Requested, InteractionRejection> {
    let existing = agg
        .interaction
        .as_ref()
        .filter(|record| record.attempt_id == proposal.attempt_id);
    if let Some(existing) = existing {
        return adopt_request(&agg.run, existing, authority, runner_epoch, &proposal);
    }
    let Some(session_id) = agg.run.mode.origin_session().cloned() else {
        return request_headless(agg, authority, runner_epoch, proposal, now_ms, ttl_ms);
    };
    let mut tx = Tx::begin(agg, now_ms);
    run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
    let (node_id, deadline_at_ms) = attempt_waits_in(&mut tx, &proposal)?;
    run::wait_in(&mut tx, authority, node_id.clone(), false)?;
    let mut record = pending_record(agg, &proposal, node_id, Some(session_id.clone()), now_ms);
    record.clock = TurnClock::at_request(deadline_at_ms, now_ms);
    // The clock starts with the step's first reported turn; only a budget
    // already spent needs a wake now.
    let wake_at = record.clock.deadline_at_ms(now_ms);
    let message = MessageRecord {
        message_id: proposal.message_id,
        session_id,
        run_id: agg.run.run_id.clone(),
        kind: MessageKind::Step {
            interaction_id: proposal.interaction_id.clone(),
            reason: StepReason::Initial,
        },
        order: proposal.message_order,
        state: MessageState::Pending,
        entry_id: None,
        created_at_ms: now_ms,
    };
    tx.agg.interaction = Some(record);
    tx.agg.messages.push(message);
    tx.event(RunEvent::InteractionRequested {
        interaction_id: proposal.interaction_id,
        attempt_id: proposal.attempt_id.clone(),
    });
    if let Some(at_ms) = wake_at {
        let run_id = agg.run.run_id.clone();
        let reason = WakeReason::NodeDeadline {
            attempt_id: proposal.attempt_id,
        };
        tx.output(Output::Wake {
            run_id,
            at_ms,
            reason,
        });
    }
    tx.publish_session();
    Ok(Requested::Created(tx.commit()))
}

/// A headless run's request: pending, no session, no message; the attempt
/// stays `Active` (with the proposed deadline when it has none) under the
/// renewed claim of the live runner, whose Pi child does the work.
fn request_headless(
    agg: &RunAggregate,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    proposal: RequestProposal,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Requested, InteractionRejection> {
    if proposal.kind != InteractionKind::SubmittedOutput {
        return Err(InteractionRejection::Headless);
    }
    let mut tx = Tx::begin(agg, now_ms);
    run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
    let (node_id, _) = resolve_deadline_in(tx.agg.attempt.as_mut(), &proposal)?;
    tx.agg.interaction = Some(pending_record(agg, &proposal, node_id, None, now_ms));
    tx.event(RunEvent::InteractionRequested {
        interaction_id: proposal.interaction_id,
        attempt_id: proposal.attempt_id,
    });
    Ok(Requested::Created(tx.commit()))
}

/// A new pending request (revision 1, no turns, no submission).
fn pending_record(
    agg: &RunAggregate,
    proposal: &RequestProposal,
    node_id: NodeId,
    target_session: Option<SessionId>,
    now_ms: u64,
) -> InteractionRecord {
    InteractionRecord {
        interaction_id: proposal.interaction_id.clone(),
        run_id: agg.run.run_id.clone(),
        attempt_id: proposal.attempt_id.clone(),
        node_id,
        target_session,
        kind: proposal.kind,
        contract_hash: proposal.contract_hash,
        status: InteractionStatus::Pending,
        accepted_submission: None,
        unproductive_turn_ends: 0,
        revision: 1,
        clock: TurnClock::new(None),
        created_at_ms: now_ms,
    }
}

/// Who a submission or update says it works for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum SubmitAuthority {
    /// The origin session's coordinator at `coordinator_epoch` (an
    /// interactive run).
    Coordinator {
        session_id: SessionId,
        coordinator_epoch: CoordinatorEpoch,
    },
    /// The live runner of a headless run.
    Runner {
        generation: crate::ids::Generation,
        runner_epoch: RunnerEpochId,
    },
}

/// Checks the authority of a submission against the run, before any receipt
/// lookup: the origin session of an interactive run at its active
/// coordinator epoch, or the live runner (same generation and epoch) of a
/// headless one. `active_coordinator` is the origin session's active epoch
/// as the shell read it before the job (`None` when no connection
/// coordinates the session; unused for a runner's submission).
pub fn check_authority(
    agg: &RunAggregate,
    authority: &SubmitAuthority,
    active_coordinator: Option<CoordinatorEpoch>,
) -> Result<(), InteractionRejection> {
    match (agg.run.mode.origin_session(), authority) {
        (
            Some(origin),
            SubmitAuthority::Coordinator {
                session_id,
                coordinator_epoch,
            },
        ) if origin == session_id => {
            if active_coordinator == Some(*coordinator_epoch) {
                Ok(())
            } else {
                Err(InteractionRejection::StaleCoordinator)
            }
        }
        (
            None,
            SubmitAuthority::Runner {
                generation,
                runner_epoch,
            },
        ) => {
            if is_live_runner(&agg.run, *generation, runner_epoch) {
                Ok(())
            } else {
                Err(Rejection::StaleRunner.into())
            }
        }
        _ => Err(InteractionRejection::WrongAuthority),
    }
}

/// Whether `runner_epoch` at `generation` is the run's live runner (the
/// authority of a headless run's agent tool: its submissions and updates).
pub fn is_live_runner(
    run: &RunRecord,
    generation: crate::ids::Generation,
    runner_epoch: &RunnerEpochId,
) -> bool {
    run.live_runner()
        .is_some_and(|runner| runner.runner_epoch == *runner_epoch)
        && run.lease.generation == generation
}

/// Whether the runner of a headless run may finish `attempt_id` with
/// `node.finished`: when the attempt has a request, only after a submission
/// was accepted (the output it proposes is that submission's).
pub fn finish_allowed(
    agg: &RunAggregate,
    attempt_id: &AttemptId,
) -> Result<(), InteractionRejection> {
    match agg
        .interaction
        .as_ref()
        .filter(|record| record.attempt_id == *attempt_id)
    {
        Some(record) if record.status != InteractionStatus::Accepted => {
            Err(InteractionRejection::NotAccepted)
        }
        _ => Ok(()),
    }
}

/// The accepted submission that decides an abandoned attempt. A headless
/// runner finishes its attempt itself once a submission is accepted
/// ([`finish_allowed`]); when the runner (or the server) dies between that
/// acceptance and its `node.finished`, the attempt is abandoned with its
/// request accepted. That output is the step's: the next generation adopts
/// it (`execution::start_generation`) instead of asking the agent again.
pub fn adoptable_submission(agg: &RunAggregate) -> Option<&SubmissionId> {
    let attempt = agg
        .attempt
        .as_ref()
        .filter(|attempt| attempt.status == AttemptStatus::Abandoned)?;
    agg.interaction
        .as_ref()
        .filter(|record| {
            record.attempt_id == attempt.attempt_id && record.status == InteractionStatus::Accepted
        })
        .and_then(|record| record.accepted_submission.as_ref())
}

/// A repeat for an attempt that already has a request. The claim was released
/// when the request committed, so the repeat is fenced by the runner epoch and
/// generation instead of the claim.
fn adopt_request(
    run: &RunRecord,
    existing: &InteractionRecord,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    proposal: &RequestProposal,
) -> Result<Requested, InteractionRejection> {
    let same = existing.interaction_id == proposal.interaction_id
        && existing.kind == proposal.kind
        && existing.contract_hash == proposal.contract_hash;
    if !same {
        return Err(InteractionRejection::RequestConflict {
            existing: existing.interaction_id.clone(),
        });
    }
    let current_runner = run
        .runner
        .as_ref()
        .is_some_and(|runner| runner.runner_epoch == *runner_epoch);
    if !current_runner || authority.generation != run.lease.generation {
        return Err(Rejection::StaleRunner.into());
    }
    Ok(Requested::Adopted(existing.clone()))
}

/// Moves the proposed `Active` attempt to `Waiting` and resolves its deadline:
/// a deadline the attempt already committed wins over the proposal's.
fn attempt_waits_in(
    tx: &mut Tx,
    proposal: &RequestProposal,
) -> Result<(NodeId, Option<u64>), InteractionRejection> {
    let resolved = resolve_deadline_in(tx.agg.attempt.as_mut(), proposal)?;
    if let Some(attempt) = tx.agg.attempt.as_mut() {
        attempt.status = AttemptStatus::Waiting;
    }
    Ok(resolved)
}

/// The proposed `Active` attempt with its resolved deadline (a deadline the
/// attempt already committed wins over the proposal's): its node and deadline.
fn resolve_deadline_in(
    attempt: Option<&mut crate::attempt::AttemptRecord>,
    proposal: &RequestProposal,
) -> Result<(NodeId, Option<u64>), InteractionRejection> {
    let attempt = attempt
        .filter(|attempt| {
            attempt.attempt_id == proposal.attempt_id && attempt.status == AttemptStatus::Active
        })
        .ok_or_else(|| InteractionRejection::NotActiveAttempt {
            attempt_id: proposal.attempt_id.clone(),
        })?;
    attempt.deadline_at_ms = attempt.deadline_at_ms.or(proposal.deadline_at_ms);
    Ok((attempt.node_id.clone(), attempt.deadline_at_ms))
}

/// One submission from the agent's tool call.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NewSubmission {
    /// A fresh id for the submission row (unused when the key is a repeat).
    pub submission_id: SubmissionId,
    pub idempotency_key: IdempotencyKey,
    pub payload_hash: Digest,
}

/// The result of an accepted submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// A new provisional submission: commit `run`, insert `submission`; the
    /// outputs ask the shell to start the validation child.
    Validating {
        run: Transition<RunAggregate>,
        submission: SubmissionRecord,
    },
    /// A repeat of a stored submission: nothing changes; reply with its outcome.
    Adopted(SubmissionRecord),
}

/// A submission to the run's request. `agg.interaction` must be the named
/// request (settled or not, so that a repeat can adopt after settlement) and
/// `submissions` its stored submissions. The shell checks the origin-session
/// coordinator authority first.
pub fn submit(
    agg: &RunAggregate,
    submissions: &[SubmissionRecord],
    interaction_id: &InteractionId,
    submission: NewSubmission,
    now_ms: u64,
) -> Result<Submitted, InteractionRejection> {
    let record = named(agg, interaction_id)?;
    if record.kind != InteractionKind::SubmittedOutput {
        return Err(InteractionRejection::NotSubmittedOutput);
    }
    let stored = submissions
        .iter()
        .find(|stored| stored.idempotency_key == submission.idempotency_key);
    if let Some(stored) = stored {
        if stored.payload_hash != submission.payload_hash {
            return Err(InteractionRejection::SubmissionConflict {
                submission_id: stored.submission_id.clone(),
            });
        }
        return Ok(Submitted::Adopted(stored.clone()));
    }
    if agg.run.paused {
        return Err(Rejection::Paused.into());
    }
    if record.status != InteractionStatus::Pending {
        return Err(InteractionRejection::NotPending {
            status: record.status,
        });
    }
    if let Some(validating) = submissions
        .iter()
        .find(|stored| stored.outcome == SubmissionOutcome::Validating)
    {
        return Err(InteractionRejection::ValidationInProgress {
            submission_id: validating.submission_id.clone(),
        });
    }
    let row = SubmissionRecord {
        interaction_id: interaction_id.clone(),
        submission_id: submission.submission_id,
        idempotency_key: submission.idempotency_key,
        payload_hash: submission.payload_hash,
        outcome: SubmissionOutcome::Validating,
        submitted_at_ms: now_ms,
    };
    let mut tx = Tx::begin(agg, now_ms);
    tx.output(Output::SpawnValidator {
        run_id: agg.run.run_id.clone(),
        interaction_id: interaction_id.clone(),
        submission_id: row.submission_id.clone(),
    });
    tx.publish_session();
    Ok(Submitted::Validating {
        run: tx.commit(),
        submission: row,
    })
}

fn named<'a>(
    agg: &'a RunAggregate,
    interaction_id: &InteractionId,
) -> Result<&'a InteractionRecord, InteractionRejection> {
    agg.interaction
        .as_ref()
        .filter(|record| record.interaction_id == *interaction_id)
        .ok_or_else(|| InteractionRejection::UnknownInteraction {
            interaction_id: interaction_id.clone(),
        })
}

/// Why a provisional submission was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RejectionCause {
    /// The node's `validate` refused the payload.
    Invalid,
    /// The validation child stopped before it reported a verdict.
    ValidatorStopped,
}

/// The result of a verdict on the validating submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The run facts to commit.
    pub run: Transition<RunAggregate>,
    /// The submission row with its final outcome.
    pub submission: SubmissionRecord,
    /// What the execution module must do in the same transaction.
    pub follow_up: Option<AttemptFollowUp>,
}

/// The validation child accepted the validating submission: the submission
/// and the request are accepted and the request's pending step messages are
/// cancelled. The attempt must then finish `ok` with the accepted output,
/// which [`Verdict::follow_up`] hands to the execution module. A pause that
/// arrived during validation does not discard the accepted answer.
pub fn validation_accepted(
    agg: &RunAggregate,
    submissions: &[SubmissionRecord],
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
    now_ms: u64,
) -> Result<Verdict, InteractionRejection> {
    let (record, submission) = validating(agg, submissions, interaction_id, submission_id)?;
    if record.status != InteractionStatus::Pending {
        return Err(InteractionRejection::NotPending {
            status: record.status,
        });
    }
    let mut tx = Tx::begin(agg, now_ms);
    let settled = tx
        .agg
        .interaction
        .as_mut()
        .expect("validating() found the request");
    settled.status = InteractionStatus::Accepted;
    settled.accepted_submission = Some(submission_id.clone());
    // A headless run's live runner finishes the attempt itself (`finish_allowed`).
    let follow_up = settled
        .target_session
        .is_some()
        .then(|| AttemptFollowUp::FinishOk {
            run_id: settled.run_id.clone(),
            attempt_id: settled.attempt_id.clone(),
            submission_id: submission_id.clone(),
        });
    cancel_pending_steps(&mut tx.agg.messages, interaction_id);
    tx.event(RunEvent::SubmissionAccepted {
        interaction_id: interaction_id.clone(),
        submission_id: submission_id.clone(),
    });
    tx.publish_session();
    Ok(Verdict {
        run: tx.commit(),
        submission: SubmissionRecord {
            outcome: SubmissionOutcome::Accepted,
            ..submission.clone()
        },
        follow_up,
    })
}

/// The validation child rejected the validating submission: it becomes
/// `Rejected` and the request stays pending for a corrected retry.
pub fn validation_rejected(
    agg: &RunAggregate,
    submissions: &[SubmissionRecord],
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
    now_ms: u64,
) -> Result<Verdict, InteractionRejection> {
    reject_in(
        agg,
        submissions,
        interaction_id,
        submission_id,
        RejectionCause::Invalid,
        now_ms,
    )
}

/// The validation child stopped without a verdict: the provisional submission
/// becomes `Rejected` and the request stays pending for a corrected retry.
pub fn validator_stopped(
    agg: &RunAggregate,
    submissions: &[SubmissionRecord],
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
    now_ms: u64,
) -> Result<Verdict, InteractionRejection> {
    reject_in(
        agg,
        submissions,
        interaction_id,
        submission_id,
        RejectionCause::ValidatorStopped,
        now_ms,
    )
}

fn reject_in(
    agg: &RunAggregate,
    submissions: &[SubmissionRecord],
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
    cause: RejectionCause,
    now_ms: u64,
) -> Result<Verdict, InteractionRejection> {
    let (_, submission) = validating(agg, submissions, interaction_id, submission_id)?;
    let mut tx = Tx::begin(agg, now_ms);
    tx.event(RunEvent::SubmissionRejected {
        interaction_id: interaction_id.clone(),
        submission_id: submission_id.clone(),
        cause,
    });
    tx.publish_session();
    Ok(Verdict {
        run: tx.commit(),
        submission: SubmissionRecord {
            outcome: SubmissionOutcome::Rejected,
            ..submission.clone()
        },
        follow_up: None,
    })
}

/// A validating submission whose verdict can no longer count (its request is
/// no longer pending, or its run ended): it becomes `Rejected` and nothing
/// else changes, so that no submission stays `validating` for ever (a
/// validation child would otherwise be started for it again and again). A
/// submission that a verdict can still settle is refused as
/// [`InteractionRejection::ValidationInProgress`], one that is not
/// validating as [`InteractionRejection::StaleVerdict`].
pub fn validation_abandoned(
    agg: &RunAggregate,
    submissions: &[SubmissionRecord],
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
) -> Result<SubmissionRecord, InteractionRejection> {
    let record = named(agg, interaction_id)?;
    let submission = submissions
        .iter()
        .find(|stored| {
            stored.submission_id == *submission_id
                && stored.interaction_id == *interaction_id
                && stored.outcome == SubmissionOutcome::Validating
        })
        .ok_or_else(|| InteractionRejection::StaleVerdict {
            submission_id: submission_id.clone(),
        })?;
    if !agg.run.status.is_terminal() && record.status == InteractionStatus::Pending {
        return Err(InteractionRejection::ValidationInProgress {
            submission_id: submission_id.clone(),
        });
    }
    Ok(SubmissionRecord {
        outcome: SubmissionOutcome::Rejected,
        ..submission.clone()
    })
}

/// The request and its validating submission named by a verdict.
fn validating<'a>(
    agg: &'a RunAggregate,
    submissions: &'a [SubmissionRecord],
    interaction_id: &InteractionId,
    submission_id: &SubmissionId,
) -> Result<(&'a InteractionRecord, &'a SubmissionRecord), InteractionRejection> {
    let record = named(agg, interaction_id)?;
    if agg.run.status.is_terminal() {
        return Err(Rejection::Terminal {
            status: agg.run.status,
        }
        .into());
    }
    let submission = submissions
        .iter()
        .find(|stored| {
            stored.submission_id == *submission_id
                && stored.interaction_id == *interaction_id
                && stored.outcome == SubmissionOutcome::Validating
        })
        .ok_or_else(|| InteractionRejection::StaleVerdict {
            submission_id: submission_id.clone(),
        })?;
    Ok((record, submission))
}

/// Cancels the pending step messages of one request.
pub(crate) fn cancel_pending_steps(messages: &mut [MessageRecord], interaction_id: &InteractionId) {
    for message in messages {
        let is_step = matches!(
            &message.kind,
            MessageKind::Step { interaction_id: id, .. } if id == interaction_id
        );
        if is_step && message.state == MessageState::Pending {
            message.state = MessageState::Cancelled;
        }
    }
}

/// The run-level half of an aborted origin-session step turn
/// ([`crate::session::RunFollowUp::Pause`]): the durable pause with the same
/// rules as an explicit pause ([`run::pause`]), on a waiting run that holds no
/// claim. Pending step messages are cancelled; nothing is incremented.
pub fn pause_after_aborted_turn(
    agg: &RunAggregate,
    now_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let run = &agg.run;
    if run.status.is_terminal() {
        return Err(Rejection::Terminal { status: run.status });
    }
    if run.paused {
        return Err(Rejection::AlreadyPaused);
    }
    if RunRecord::pair_holds_claim(run.status, run.queue) {
        // A turn never stops a runner; only a waiting run is paused by a turn.
        return Err(Rejection::IllegalTransition {
            operation: Operation::Pause,
            status: run.status,
            queue: run.queue,
        });
    }
    let mut tx = Tx::begin(agg, now_ms);
    run::set_pause_in(&mut tx);
    Ok(tx.commit())
}

#[cfg(test)]
mod tests;
