//! Checkpoint answers and protected human decisions, and the one continuation
//! each waiting checkpoint may start.
//!
//! Invariants:
//! - A decision is accepted at most once. The first valid human answer
//!   before the deadline, or the `onTimeout` default at the deadline, wins;
//!   an answer at or after the deadline loses, even when the deadline timer
//!   has not fired yet. Without a default the deadline expires the decision
//!   and the run ends `timed_out`.
//! - An identical retry of the winning answer adopts it; another answer
//!   after acceptance is a conflict ("already decided").
//! - Acceptance and continuation are one transition: one control claim on
//!   the waiting parent (exactly one new generation), the accepted decision,
//!   the released claim, the settled parent and the queued child. A decision
//!   that is accepted without a continuation (a crash in an older writer) is
//!   continued by `recover`.
//! - A waiting parent has at most one continuation. The first caller
//!   prepares it; a compatible later caller adopts it without changing any
//!   fact (no lease, queue, timestamp or event change); an incompatible reuse
//!   fails without change.
//! - While the run is paused, answers, deadlines and continuations wait for
//!   resume.
//! - Only people answer protected decisions: the shell refuses the model's
//!   tool action, so model-originated answers never reach [`answer`]. An
//!   ordinary checkpoint answer never settles a protected decision.
//! - A protected checkpoint waits only with its pending decision: the
//!   decision opens in the transition that finishes the checkpoint
//!   (`execution::finish_protected_checkpoint`), and a plain finish of an
//!   `ok` human-decision checkpoint is refused.
//! - An answer counts only for the request the person saw (its digest) and
//!   only as one of the request's typed choices, with the text input that
//!   choice takes and no other ([`check_answer`]).
//! - The deadline is one wake: a paused decision's deadline does nothing
//!   until resume re-arms it; a deadline that has not come defers to it
//!   ([`on_deadline`]).

use crate::claim::{self, ClaimRequest};
use crate::ids::{DecisionId, Digest, NodeId, RunId, SessionId};
use crate::output::{RunEvent, Transition};
use crate::run::{
    self, ContinuationReserved, FailureClass, ReasonKind, RunAggregate, RunError, Terminal, Tx,
};
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// Who decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Provenance {
    Human,
    Timeout,
}

/// The state of one protected decision.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum DecisionStatus {
    Pending,
    Accepted {
        provenance: Provenance,
        answer_digest: Digest,
    },
    Cancelled,
    /// The deadline passed with no default response.
    Expired,
}

/// One protected human decision on a waiting checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub decision_id: DecisionId,
    pub run_id: RunId,
    pub node_id: NodeId,
    pub request_digest: Digest,
    pub status: DecisionStatus,
    pub deadline_at_ms: Option<u64>,
    /// Digest of the validated default response, when `onTimeout` has one.
    pub default_answer_digest: Option<Digest>,
    pub continuation_run_id: Option<RunId>,
}

/// What cancelling the waiting run does to its pending decision.
pub fn on_run_cancelled(record: &DecisionRecord) -> DecisionRecord {
    let mut next = record.clone();
    if record.status == DecisionStatus::Pending {
        next.status = DecisionStatus::Cancelled;
    }
    next
}

/// What makes two continuation requests the same continuation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContinuationIdentity {
    /// The deterministic id of the child run.
    pub child_run_id: RunId,
    pub workflow_source_digest: Digest,
    pub definition_digest: Digest,
    /// The child's input: the answer of an ordinary checkpoint, or the
    /// parent's original input for a protected decision.
    pub input_digest: Digest,
    pub launch_options_digest: Digest,
    pub parent_run_id: RunId,
    /// The origin session the child inherits (`None` when headless).
    pub owning_session: Option<SessionId>,
}

/// What the shell stored about one continuation (the one being asked for,
/// or the child that already exists), as [`ContinuationIdentity::of`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContinuationFacts<'a> {
    pub child_run_id: &'a RunId,
    pub parent_run_id: &'a RunId,
    /// The origin session the child has or would inherit.
    pub owning_session: Option<&'a SessionId>,
    /// The workflow source the run was started from, as stored.
    pub workflow_source: &'a str,
    /// The compiled definition's digest, as stored (text).
    pub definition_digest: &'a str,
    pub input_digest: Digest,
}

impl ContinuationIdentity {
    /// The identity of a continuation: the stored source and definition
    /// are hashed (SHA-256 of their text); this version has no launch
    /// options, so every continuation has the digest of the empty options
    /// object `{}`.
    pub fn of(facts: ContinuationFacts<'_>) -> Self {
        let digest_of_text = |text: &str| {
            use sha2::Digest as _;
            Digest(sha2::Sha256::digest(text.as_bytes()).into())
        };
        Self {
            child_run_id: facts.child_run_id.clone(),
            workflow_source_digest: digest_of_text(facts.workflow_source),
            definition_digest: digest_of_text(facts.definition_digest),
            input_digest: facts.input_digest,
            launch_options_digest: digest_of_text("{}"),
            parent_run_id: facts.parent_run_id.clone(),
            owning_session: facts.owning_session.cloned(),
        }
    }
}

/// The identity stored for an existing continuation child.
pub type ChildIdentity = ContinuationIdentity;

/// One field of a [`ContinuationIdentity`], named when two identities differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum IdentityField {
    ChildRun,
    WorkflowSource,
    Definition,
    Input,
    LaunchOptions,
    ParentRun,
    OwningSession,
}

impl ContinuationIdentity {
    /// The first field in which `self` and `other` differ, if any.
    pub fn first_difference(&self, other: &Self) -> Option<IdentityField> {
        let fields = [
            (
                self.child_run_id == other.child_run_id,
                IdentityField::ChildRun,
            ),
            (
                self.workflow_source_digest == other.workflow_source_digest,
                IdentityField::WorkflowSource,
            ),
            (
                self.definition_digest == other.definition_digest,
                IdentityField::Definition,
            ),
            (
                self.input_digest == other.input_digest,
                IdentityField::Input,
            ),
            (
                self.launch_options_digest == other.launch_options_digest,
                IdentityField::LaunchOptions,
            ),
            (
                self.parent_run_id == other.parent_run_id,
                IdentityField::ParentRun,
            ),
            (
                self.owning_session == other.owning_session,
                IdentityField::OwningSession,
            ),
        ];
        fields
            .into_iter()
            .find(|(equal, _)| !equal)
            .map(|(_, field)| field)
    }
}

/// What a decision path needs to continue the waiting parent.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ContinuationRequest {
    /// The continuation to prepare (or to find already prepared).
    pub identity: ContinuationIdentity,
    /// The control claim the server takes on the waiting parent.
    pub control: ClaimRequest,
}

/// Why a decision or continuation transition was refused. Nothing changes on
/// a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum DecisionRejection {
    /// The run-level step failed (terminal, not waiting on a checkpoint,
    /// claim held).
    Run { run: run::Rejection },
    /// The decision does not belong to the checkpoint this run waits on.
    NotThisCheckpoint,
    /// The answer arrived at or after the deadline; it can never win.
    DeadlinePassed { deadline_at_ms: u64 },
    /// Another answer was accepted already ("already decided").
    AlreadyDecided,
    /// The decision was cancelled with its run.
    Cancelled,
    /// The decision expired without a default response.
    Expired,
    /// The run is paused; answers and deadlines wait for resume.
    Paused,
    /// The deadline has not come (or the decision has none).
    NotDue { deadline_at_ms: Option<u64> },
    /// Recovery needs an accepted decision.
    NotAccepted,
    /// The checkpoint carries a protected decision; it needs `decision.answer`.
    ProtectedDecision { decision_id: DecisionId },
    /// The parent's continuation exists (or would be) with another identity.
    IncompatibleContinuation { field: IdentityField },
    /// The answer names another request than the pending one (the person
    /// saw an older or another request).
    StaleRequest,
    /// The answer names a choice the request does not offer.
    UnknownChoice,
    /// The choice takes a text input and the answer gives none.
    InputRequired,
    /// The answer gives a text input the choice does not take (or under
    /// another name).
    InputNotTaken,
    /// The text input is shorter or longer than the choice allows (UTF-16
    /// code units).
    InputLength { min: u32, max: u32 },
}

impl From<run::Rejection> for DecisionRejection {
    fn from(run: run::Rejection) -> Self {
        match run {
            run::Rejection::Paused => Self::Paused,
            run => Self::Run { run },
        }
    }
}

/// A decision that was accepted and continued in one transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Continued {
    /// The decision row as it is now: accepted, naming its continuation.
    pub decision: DecisionRecord,
    /// The parent, settled `completed/done` and continued by the child.
    pub parent: Transition<RunAggregate>,
    /// The new child, `queued/queued`; the scheduler admits it once.
    pub child: Transition<RunAggregate>,
}

/// The accepted result of a human answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answered {
    /// The answer won: commit the decision, parent and child.
    Accepted(Continued),
    /// An identical retry of the winning answer: nothing changes. When the
    /// record names no continuation yet (an older writer crashed after
    /// acceptance), the shell continues it with [`recover`].
    Adopted(DecisionRecord),
}

/// The accepted result of a decision deadline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// The default response won (provenance `timeout`) and the parent continued.
    Defaulted(Continued),
    /// No default: the decision expired and the run ended `timed_out`.
    Expired {
        decision: DecisionRecord,
        parent: Transition<RunAggregate>,
    },
}

/// The accepted result of continuation recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovered {
    /// The accepted decision had no continuation; it has one now.
    Prepared(Continued),
    /// The continuation exists and matches: nothing changes.
    Adopted { child_run_id: RunId },
}

/// The accepted result of prepare-or-adopt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrepareOutcome {
    /// The first caller: commit the settled parent and the new child.
    Prepared(ContinuationReserved),
    /// A compatible later caller: the existing child, and no change at all.
    Adopted { child_run_id: RunId },
}

/// `decision.answer`: a person's answer to a protected decision. A pending
/// decision before its deadline accepts it (provenance `human`) and, in the
/// same transition, takes one control claim on the waiting parent, releases
/// it and reserves the continuation. An identical retry of the winning answer
/// adopts; any other answer after acceptance is `AlreadyDecided`; an answer
/// at or after the deadline is `DeadlinePassed` even if the timer has not
/// fired. Model-originated answers never reach this function: the shell
/// refuses the model's tool action for protected decisions.
pub fn answer(
    parent: &RunAggregate,
    decision: &DecisionRecord,
    answer_digest: Digest,
    continuation: &ContinuationRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Answered, DecisionRejection> {
    check_checkpoint(parent, decision)?;
    match &decision.status {
        DecisionStatus::Pending => {}
        DecisionStatus::Accepted {
            provenance: Provenance::Human,
            answer_digest: winner,
        } if *winner == answer_digest => return Ok(Answered::Adopted(decision.clone())),
        DecisionStatus::Accepted {
            provenance: Provenance::Timeout,
            ..
        } => {
            return Err(decision
                .deadline_at_ms
                .map_or(DecisionRejection::AlreadyDecided, |deadline_at_ms| {
                    DecisionRejection::DeadlinePassed { deadline_at_ms }
                }));
        }
        DecisionStatus::Accepted { .. } => return Err(DecisionRejection::AlreadyDecided),
        DecisionStatus::Cancelled => return Err(DecisionRejection::Cancelled),
        DecisionStatus::Expired => return Err(DecisionRejection::Expired),
    }
    if let Some(deadline_at_ms) = decision.deadline_at_ms.filter(|at| now_ms >= *at) {
        return Err(DecisionRejection::DeadlinePassed { deadline_at_ms });
    }
    let accepted = accepted(decision, Provenance::Human, answer_digest);
    accept_and_continue(parent, accepted, true, continuation, now_ms, ttl_ms)
        .map(Answered::Accepted)
}

/// The decision deadline fired. At or after the deadline a pending decision
/// with a default accepts it (provenance `timeout`) and continues exactly as
/// [`answer`] does; without a default the decision expires and the run ends
/// `timed_out` (`decisionExpired`) under one control claim. Before the
/// deadline nothing happens (`NotDue`).
pub fn expire(
    parent: &RunAggregate,
    decision: &DecisionRecord,
    continuation: &ContinuationRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Expiry, DecisionRejection> {
    check_checkpoint(parent, decision)?;
    match decision.status {
        DecisionStatus::Pending => {}
        DecisionStatus::Accepted { .. } => return Err(DecisionRejection::AlreadyDecided),
        DecisionStatus::Cancelled => return Err(DecisionRejection::Cancelled),
        DecisionStatus::Expired => return Err(DecisionRejection::Expired),
    }
    if decision.deadline_at_ms.is_none_or(|at| now_ms < at) {
        return Err(DecisionRejection::NotDue {
            deadline_at_ms: decision.deadline_at_ms,
        });
    }
    if parent.run.paused {
        return Err(DecisionRejection::Paused);
    }
    match decision.default_answer_digest {
        Some(default) => {
            let accepted = accepted(decision, Provenance::Timeout, default);
            accept_and_continue(parent, accepted, true, continuation, now_ms, ttl_ms)
                .map(Expiry::Defaulted)
        }
        None => expire_without_default(parent, decision, continuation, now_ms, ttl_ms),
    }
}

/// Continuation recovery for an accepted decision (direct answer handling and
/// recovery may both get here): without a continuation it prepares one
/// exactly as acceptance would have; with a compatible continuation it
/// adopts it without change; with another one it fails with the first
/// differing field.
///
/// # Panics
/// As [`prepare_continuation`], if `existing_child` is not the child the
/// parent is continued by.
pub fn recover(
    parent: &RunAggregate,
    decision: &DecisionRecord,
    existing_child: Option<&ChildIdentity>,
    continuation: &ContinuationRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Recovered, DecisionRejection> {
    check_checkpoint(parent, decision)?;
    match decision.status {
        DecisionStatus::Accepted { .. } => {}
        DecisionStatus::Pending => return Err(DecisionRejection::NotAccepted),
        DecisionStatus::Cancelled => return Err(DecisionRejection::Cancelled),
        DecisionStatus::Expired => return Err(DecisionRejection::Expired),
    }
    if let Some(child_run_id) =
        existing_continuation(parent, existing_child, &continuation.identity)?
    {
        return Ok(Recovered::Adopted { child_run_id });
    }
    accept_and_continue(
        parent,
        decision.clone(),
        false,
        continuation,
        now_ms,
        ttl_ms,
    )
    .map(Recovered::Prepared)
}

/// Prepare-or-adopt, the one continuation coordinator. The first caller
/// prepares the continuation (the parent settles and the child is reserved
/// through [`run::reserve_continuation`]); a later caller with the same
/// identity adopts the existing child without changing any fact; a caller
/// with another identity fails with the first differing field.
///
/// `existing_child` is the identity of the child the parent's
/// `continued_by` names, loaded by the shell.
///
/// # Panics
/// If `existing_child` and the parent's `continued_by` disagree (a broken
/// invariant: both are written in one transaction).
pub fn prepare_continuation(
    parent: &RunAggregate,
    existing_child: Option<&ChildIdentity>,
    wanted: &ContinuationIdentity,
    now_ms: u64,
) -> Result<PrepareOutcome, DecisionRejection> {
    if let Some(child_run_id) = existing_continuation(parent, existing_child, wanted)? {
        return Ok(PrepareOutcome::Adopted { child_run_id });
    }
    let reserved = run::reserve_continuation(parent, wanted.child_run_id.clone(), now_ms)?;
    Ok(PrepareOutcome::Prepared(reserved))
}

/// `checkpoint.answer`: the ordinary answer to a waiting checkpoint. The
/// answer is the continuation's input, so its digest is `wanted.input_digest`
/// and a different answer is an incompatible identity. A checkpoint that
/// carries a protected decision refuses it (`protected` is that decision in
/// any state, loaded by the shell); it needs `decision.answer`.
pub fn answer_checkpoint(
    parent: &RunAggregate,
    protected: Option<&DecisionRecord>,
    existing_child: Option<&ChildIdentity>,
    wanted: &ContinuationIdentity,
    now_ms: u64,
) -> Result<PrepareOutcome, DecisionRejection> {
    if let Some(decision) = protected.or(parent.decision.as_ref()) {
        return Err(DecisionRejection::ProtectedDecision {
            decision_id: decision.decision_id.clone(),
        });
    }
    prepare_continuation(parent, existing_child, wanted, now_ms)
}

/// One choice a protected decision offers, as the kernel checks answers
/// against it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Choice {
    pub id: String,
    /// The text input the choice takes, if any.
    pub input: Option<TextInput>,
}

/// The text input of a choice.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TextInput {
    pub name: String,
    /// Bounds of the text in UTF-16 code units (as the authoring API counts).
    pub min_length: u32,
    pub max_length: u32,
}

/// A response as a person (or the `onTimeout` default) gives it: a choice
/// and, for a choice with a text input, its name and text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Response {
    pub choice: String,
    pub input: Option<(String, String)>,
}

/// Whether `response` is an answer to the request `decision` was opened
/// for (`seen_request_digest`) and one of its `choices`, with exactly the
/// text input that choice takes, within its bounds. The `onTimeout` default
/// is checked the same way when the decision opens.
pub fn check_answer(
    decision: &DecisionRecord,
    seen_request_digest: &Digest,
    choices: &[Choice],
    response: &Response,
) -> Result<(), DecisionRejection> {
    if *seen_request_digest != decision.request_digest {
        return Err(DecisionRejection::StaleRequest);
    }
    check_response(choices, response)
}

/// [`check_answer`] without the request binding: the response against the
/// typed choices alone.
pub fn check_response(choices: &[Choice], response: &Response) -> Result<(), DecisionRejection> {
    let Some(choice) = choices.iter().find(|choice| choice.id == response.choice) else {
        return Err(DecisionRejection::UnknownChoice);
    };
    match (&choice.input, &response.input) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(DecisionRejection::InputNotTaken),
        (Some(_), None) => Err(DecisionRejection::InputRequired),
        (Some(spec), Some((name, _))) if *name != spec.name => {
            Err(DecisionRejection::InputNotTaken)
        }
        (Some(spec), Some((_, text))) => {
            let units = text.encode_utf16().count();
            let fits = usize::try_from(spec.min_length).is_ok_and(|min| units >= min)
                && usize::try_from(spec.max_length).is_ok_and(|max| units <= max);
            if fits {
                Ok(())
            } else {
                Err(DecisionRejection::InputLength {
                    min: spec.min_length,
                    max: spec.max_length,
                })
            }
        }
    }
}

/// The pending decision a protected checkpoint opens, as the shell checked
/// it from the runner's sealed request.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Opening {
    pub decision_id: DecisionId,
    pub request_digest: Digest,
    /// The `expiresAt` of the request, when it has one.
    pub deadline_at_ms: Option<u64>,
    /// The digest of the `onTimeout` default response, when it has one.
    pub default_answer_digest: Option<Digest>,
}

impl Opening {
    /// The pending decision of `run_id` at `node_id`.
    pub fn pending(self, run_id: RunId, node_id: NodeId) -> DecisionRecord {
        DecisionRecord {
            decision_id: self.decision_id,
            run_id,
            node_id,
            request_digest: self.request_digest,
            status: DecisionStatus::Pending,
            deadline_at_ms: self.deadline_at_ms,
            default_answer_digest: self.default_answer_digest,
            continuation_run_id: None,
        }
    }
}

/// What the decision deadline's wake does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadlineStep {
    /// The deadline passed: the default won, or the decision expired.
    Expire(Expiry),
    /// The deadline (or another owner's live claim) is still ahead: wake
    /// again at `at_ms`.
    Defer { at_ms: u64 },
    /// Nothing to do now: the run is paused (resume arms the wake again).
    Nothing,
}

/// The decision deadline's wake fired: [`expire`] as a step. A deadline
/// still ahead, or a live claim of another owner, defers to that time; a
/// paused run waits for resume, which arms the wake again; a decision that
/// is no longer pending is a rejection that changes nothing.
pub fn on_deadline(
    parent: &RunAggregate,
    decision: &DecisionRecord,
    continuation: &ContinuationRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<DeadlineStep, DecisionRejection> {
    match expire(parent, decision, continuation, now_ms, ttl_ms) {
        Ok(expiry) => Ok(DeadlineStep::Expire(expiry)),
        Err(DecisionRejection::NotDue {
            deadline_at_ms: Some(at_ms),
        }) => Ok(DeadlineStep::Defer { at_ms }),
        Err(DecisionRejection::Paused) => Ok(DeadlineStep::Nothing),
        Err(DecisionRejection::Run {
            run: run::Rejection::ClaimHeld { expires_at_ms },
        }) => Ok(DeadlineStep::Defer {
            at_ms: expires_at_ms,
        }),
        Err(rejection) => Err(rejection),
    }
}

fn check_checkpoint(
    parent: &RunAggregate,
    decision: &DecisionRecord,
) -> Result<(), DecisionRejection> {
    let run = &parent.run;
    if decision.run_id != run.run_id || run.waiting_on.as_ref() != Some(&decision.node_id) {
        return Err(DecisionRejection::NotThisCheckpoint);
    }
    Ok(())
}

fn accepted(
    decision: &DecisionRecord,
    provenance: Provenance,
    answer_digest: Digest,
) -> DecisionRecord {
    DecisionRecord {
        status: DecisionStatus::Accepted {
            provenance,
            answer_digest,
        },
        ..decision.clone()
    }
}

/// The existing child when the parent is continued and `wanted` matches it;
/// `None` when the parent has no continuation yet.
fn existing_continuation(
    parent: &RunAggregate,
    existing_child: Option<&ChildIdentity>,
    wanted: &ContinuationIdentity,
) -> Result<Option<RunId>, DecisionRejection> {
    assert_eq!(
        existing_child.map(|child| &child.child_run_id),
        parent.run.lineage.continued_by.as_ref(),
        "the loaded child must be the one the parent is continued by"
    );
    check_names_parent(parent, wanted)?;
    let Some(existing) = existing_child else {
        return Ok(None);
    };
    match existing.first_difference(wanted) {
        None => Ok(Some(existing.child_run_id.clone())),
        Some(field) => Err(DecisionRejection::IncompatibleContinuation { field }),
    }
}

/// A continuation must name its parent and the parent's origin session.
fn check_names_parent(
    parent: &RunAggregate,
    wanted: &ContinuationIdentity,
) -> Result<(), DecisionRejection> {
    let field = if wanted.parent_run_id != parent.run.run_id {
        IdentityField::ParentRun
    } else if wanted.owning_session.as_ref() != parent.run.mode.origin_session() {
        IdentityField::OwningSession
    } else {
        return Ok(());
    };
    Err(DecisionRejection::IncompatibleContinuation { field })
}

/// One control claim on the waiting parent (a new generation), the accepted
/// decision, the released claim and the reserved continuation, as one
/// revision of the parent.
fn accept_and_continue(
    parent: &RunAggregate,
    decision: DecisionRecord,
    newly_accepted: bool,
    continuation: &ContinuationRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Continued, DecisionRejection> {
    let wanted = &continuation.identity;
    check_names_parent(parent, wanted)?;
    if parent.run.paused {
        return Err(DecisionRejection::Paused);
    }
    let child_run_id = wanted.child_run_id.clone();
    let mut tx = Tx::begin(parent, now_ms);
    let authority = run::take_control_in(&mut tx, continuation.control.clone(), ttl_ms)?;
    tx.agg.run.lease = claim::release(&tx.agg.run.lease, &authority, now_ms)
        .map_err(|reason| run::Rejection::ClaimLost { reason })?;
    let decision = DecisionRecord {
        continuation_run_id: Some(child_run_id.clone()),
        ..decision
    };
    if let DecisionStatus::Accepted { provenance, .. } = decision.status
        && newly_accepted
    {
        tx.event(RunEvent::DecisionAccepted {
            decision_id: decision.decision_id.clone(),
            provenance,
        });
    }
    tx.agg.decision = Some(decision.clone());
    // `reserve_continuation` commits the staged parent, so acceptance and
    // continuation are one revision with one publish.
    let mut outputs = core::mem::take(&mut tx.outputs);
    let reserved = run::reserve_continuation(&tx.agg, child_run_id, now_ms)?;
    let mut settled = reserved.parent;
    outputs.append(&mut settled.outputs);
    settled.outputs = outputs;
    Ok(Continued {
        decision,
        parent: settled,
        child: reserved.child,
    })
}

fn expire_without_default(
    parent: &RunAggregate,
    decision: &DecisionRecord,
    continuation: &ContinuationRequest,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Expiry, DecisionRejection> {
    let mut tx = Tx::begin(parent, now_ms);
    let authority = run::take_control_in(&mut tx, continuation.control.clone(), ttl_ms)?;
    let expired = DecisionRecord {
        status: DecisionStatus::Expired,
        ..decision.clone()
    };
    tx.agg.decision = Some(expired.clone());
    tx.event(RunEvent::DecisionExpired {
        decision_id: decision.decision_id.clone(),
    });
    let error = RunError {
        class: FailureClass::NodeFailed,
        reason: ReasonKind::DecisionExpired,
        node_id: Some(decision.node_id.clone()),
    };
    run::finish_in(&mut tx, Some(&authority), Terminal::TimedOut { error })?;
    Ok(Expiry::Expired {
        decision: expired,
        parent: tx.commit(),
    })
}

#[cfg(test)]
mod tests;
