//! Rejections are wire codes: every rejection enum of the kernel names its
//! closed wire code, its static message and the protocol check a runner
//! failed with it, in one exhaustive `match` per enum.
//!
//! Invariants:
//! - No catch-all arm: a new rejection variant does not compile until it has
//!   its code here. [`WireCode`] is generated from `common.v1`'s `ErrorCode`
//!   (`kernel/src/generated.rs`), and the server converts it to `protocol`'s
//!   type with a generated exhaustive conversion, so the kernel and the wire
//!   cannot drift.
//! - A message is static text that names no payload, id or path; it says what
//!   to do next where a person reads it.
//! - The outcome follows the code: `claimLost` is the transient claim-loss
//!   outcome (nothing is stored, the runner must exit), every other code is
//!   a durable `rejected`.

use crate::capture::CaptureRejection;
use crate::channel::ChannelRejection;
use crate::child_workflow::ChildRejection;
use crate::controller_effect::EffectEnsureRejection;
use crate::decision::DecisionRejection;
use crate::effect::EffectRejection;
use crate::follow_up::FollowUpRejection;
use crate::intent::IntentRejection;
use crate::interaction::InteractionRejection;
use crate::launch::LaunchRefusal;
use crate::maintenance::{BackupRefusal, PruneRefusal};
use crate::reconcile::ReconcileRejection;
use crate::resource::ResourceRejection;
use crate::run::{Rejection, RestartRefusal};
use crate::runner::ProtocolCheck;
use crate::session::SessionRejection;
use crate::settings::SettingsRejection;
use crate::updates::UpdateRejection;

pub use crate::generated::WireCode;

/// A rejection as the wire reports it.
pub trait Coded {
    /// The closed wire code.
    fn code(&self) -> WireCode;
    /// A static, safe message.
    fn message(&self) -> &'static str;
    /// The runner-protocol check the message failed, if this rejection
    /// means the runner broke the protocol (the run is then parked
    /// `protocolRejected`).
    fn protocol_check(&self) -> Option<ProtocolCheck>;
    /// Whether the writer lost its claim (the outcome is `claimLost`).
    fn is_claim_loss(&self) -> bool {
        self.code() == WireCode::ClaimLost
    }
}

const STATE: &str = "the run cannot do that in its current state";
const CLAIM_LOST: &str = "another generation owns the run or the claim expired";
const NOT_ACTIVE: &str = "not the active attempt";

impl Coded for Rejection {
    fn code(&self) -> WireCode {
        match self {
            Self::ClaimLost { .. } | Self::ClaimHeld { .. } | Self::StaleRunner => {
                WireCode::ClaimLost
            }
            Self::Terminal { .. } => WireCode::Terminal,
            Self::Paused => WireCode::Paused,
            Self::StaleAttempt | Self::ResultMismatch => WireCode::StaleAttempt,
            Self::AlreadyPaused => WireCode::AlreadyPaused,
            Self::NotResumable => WireCode::NotResumable,
            Self::EffectAmbiguous => WireCode::EffectAmbiguous,
            Self::SessionBusy { .. } => WireCode::SessionBusy,
            Self::RestartRefused { .. } => WireCode::RestartRefused,
            Self::AlreadyContinued { .. } => WireCode::Conflict,
            Self::StaleRevision { .. } => WireCode::StaleRevision,
            Self::IllegalTransition { .. }
            | Self::UnfinishedAttempt
            | Self::RouteRecordMissing
            | Self::UnknownNode { .. }
            | Self::DeadlineNotReached { .. }
            | Self::DeadlineAlreadyRecorded
            | Self::RunnerAlreadyExited
            | Self::RunnerLive { .. } => WireCode::IllegalTransition,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::ClaimLost { .. } | Self::ClaimHeld { .. } | Self::StaleRunner => CLAIM_LOST,
            Self::Terminal { .. } => "the run already ended",
            Self::Paused => "the run is paused",
            Self::StaleAttempt | Self::ResultMismatch => NOT_ACTIVE,
            Self::AlreadyPaused => "the run is already paused",
            Self::NotResumable => {
                "the run is neither paused nor parked for review, so there is nothing to resume"
            }
            Self::EffectAmbiguous => {
                "an external effect of the run may have applied without a receipt; check the external system, then confirm or retry it (effect.recover)"
            }
            Self::SessionBusy { .. } => {
                "the origin session already has an unfinished interactive run; finish or cancel it first"
            }
            Self::RestartRefused { reason } => reason.message(),
            Self::AlreadyContinued { .. } => {
                "the checkpoint was already answered with another answer"
            }
            Self::StaleRevision { .. } => {
                "the run changed since the revision the request names; reload it and retry"
            }
            Self::IllegalTransition { .. }
            | Self::UnfinishedAttempt
            | Self::RouteRecordMissing
            | Self::UnknownNode { .. }
            | Self::DeadlineNotReached { .. }
            | Self::DeadlineAlreadyRecorded
            | Self::RunnerAlreadyExited
            | Self::RunnerLive { .. } => STATE,
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::StaleAttempt | Self::ResultMismatch => Some(ProtocolCheck::Attempt),
            Self::StaleRevision { .. } => Some(ProtocolCheck::Revision),
            Self::Terminal { .. }
            | Self::IllegalTransition { .. }
            | Self::ClaimLost { .. }
            | Self::ClaimHeld { .. }
            | Self::AlreadyPaused
            | Self::Paused
            | Self::NotResumable
            | Self::EffectAmbiguous
            | Self::SessionBusy { .. }
            | Self::StaleRunner
            | Self::RestartRefused { .. }
            | Self::AlreadyContinued { .. }
            | Self::UnfinishedAttempt
            | Self::RouteRecordMissing
            | Self::UnknownNode { .. }
            | Self::DeadlineNotReached { .. }
            | Self::DeadlineAlreadyRecorded
            | Self::RunnerAlreadyExited
            | Self::RunnerLive { .. } => None,
        }
    }
}

impl RestartRefusal {
    /// What the person who asked for the restart can do instead.
    pub const fn message(self) -> &'static str {
        match self {
            Self::NotTerminal => {
                "only a failed or timed-out run can be restarted; wait until it ends"
            }
            Self::Cancelled => "a cancelled run cannot be restarted; start a new run instead",
            Self::Completed => "a completed run cannot be restarted; start a new run instead",
            Self::LimitReached => {
                "the run's restart chain already has three restarts after its original run; start a new run instead"
            }
            Self::RepeatedFailure => {
                "the run's restart chain already restarted after this same failure; fix the cause, then start a new run"
            }
        }
    }
}

impl Coded for DecisionRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::Run { run } => run.code(),
            Self::IncompatibleContinuation { .. } | Self::AlreadyDecided => WireCode::Conflict,
            Self::Paused => WireCode::Paused,
            Self::ProtectedDecision { .. } => WireCode::DecisionRequired,
            Self::StaleRequest => WireCode::DigestMismatch,
            Self::UnknownChoice
            | Self::InputRequired
            | Self::InputNotTaken
            | Self::InputLength { .. } => WireCode::ValidationFailed,
            Self::NotThisCheckpoint
            | Self::DeadlinePassed { .. }
            | Self::Cancelled
            | Self::Expired
            | Self::NotDue { .. }
            | Self::NotAccepted => WireCode::IllegalTransition,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::Run { run } => run.message(),
            Self::IncompatibleContinuation { .. } => {
                "the checkpoint was already answered with another answer"
            }
            Self::AlreadyDecided => "the decision was already answered",
            Self::Paused => "the run is paused; resume it before answering",
            Self::ProtectedDecision { .. } => {
                "this checkpoint requires a verified human answer from Pi UI or a configured decision channel (decision.answer)"
            }
            Self::NotThisCheckpoint => "the decision does not belong to this checkpoint",
            Self::DeadlinePassed { .. } | Self::Expired => "the decision's deadline has passed",
            Self::Cancelled => "the decision was cancelled with its run",
            Self::NotDue { .. } => "the decision's deadline has not passed yet",
            Self::NotAccepted => "the decision cannot do that in its current state",
            Self::StaleRequest => {
                "the decision's request changed since it was shown; read the run view again and answer the request it shows"
            }
            Self::UnknownChoice => {
                "the decision offers no such choice; answer with one of its choices"
            }
            Self::InputRequired => {
                "this choice needs its text; answer with the choice and the text"
            }
            Self::InputNotTaken => {
                "this choice takes no text (or another input); answer with the choice alone"
            }
            Self::InputLength { .. } => {
                "the text is shorter or longer than the choice allows; see its bounds in the run view"
            }
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::Run { run } => run.protocol_check(),
            Self::NotThisCheckpoint
            | Self::DeadlinePassed { .. }
            | Self::AlreadyDecided
            | Self::Cancelled
            | Self::Expired
            | Self::Paused
            | Self::NotDue { .. }
            | Self::NotAccepted
            | Self::ProtectedDecision { .. }
            | Self::IncompatibleContinuation { .. }
            | Self::StaleRequest
            | Self::UnknownChoice
            | Self::InputRequired
            | Self::InputNotTaken
            | Self::InputLength { .. } => None,
        }
    }
}

impl Coded for EffectRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::Run { run } => run.code(),
            Self::NotActiveAttempt => WireCode::StaleAttempt,
            Self::FingerprintConflict { .. } => WireCode::Conflict,
            Self::Ambiguous { .. } => WireCode::EffectAmbiguous,
            Self::Cancelled { .. } => WireCode::Cancelled,
            Self::NotFound { .. } => WireCode::NotFound,
            Self::AlreadyApplying { .. }
            | Self::NotApplying { .. }
            | Self::SettleConflict { .. }
            | Self::NotAmbiguous { .. }
            | Self::RetryAfterTerminal { .. } => WireCode::IllegalTransition,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::Run { run } => run.message(),
            Self::NotActiveAttempt => NOT_ACTIVE,
            Self::FingerprintConflict { .. } => "the effect key was reserved with another request",
            Self::Ambiguous { .. } => {
                "the effect may have applied; it needs an explicit effect.recover"
            }
            Self::Cancelled { .. } => "the effect was cancelled with its run",
            Self::NotFound { .. } => "the run has no effect with this id",
            Self::AlreadyApplying { .. }
            | Self::NotApplying { .. }
            | Self::SettleConflict { .. }
            | Self::NotAmbiguous { .. }
            | Self::RetryAfterTerminal { .. } => "the effect cannot do that in its current state",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::Run { run } => run.protocol_check(),
            Self::NotActiveAttempt => Some(ProtocolCheck::Attempt),
            Self::FingerprintConflict { .. }
            | Self::AlreadyApplying { .. }
            | Self::Ambiguous { .. }
            | Self::Cancelled { .. }
            | Self::NotFound { .. }
            | Self::NotApplying { .. }
            | Self::SettleConflict { .. }
            | Self::NotAmbiguous { .. }
            | Self::RetryAfterTerminal { .. } => None,
        }
    }
}

impl Coded for ChannelRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::StaleAdapter => WireCode::ClaimLost,
            Self::SequenceReplayed => WireCode::Conflict,
            Self::StaleAttempt => WireCode::StaleAttempt,
            Self::StaleRevision => WireCode::StaleRevision,
            Self::NoPendingDecision => WireCode::NotFound,
            Self::AlreadyApplying | Self::NotDelivered { .. } | Self::DecisionPending => {
                WireCode::IllegalTransition
            }
            Self::Ambiguous => WireCode::EffectAmbiguous,
            Self::NotAllowed => WireCode::DecisionRequired,
            Self::NeedsText => WireCode::SchemaInvalid,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::StaleAdapter => "another channel adapter replaced this one",
            Self::SequenceReplayed => "this adapter message was already received",
            Self::StaleAttempt => "not the current attempt of this channel message",
            Self::StaleRevision => "the decision changed since this message was shown",
            Self::NoPendingDecision => "the run waits on no pending decision",
            Self::AlreadyApplying => "the channel message is being sent",
            Self::Ambiguous => {
                "the channel message may have been sent; check the channel, then recover it"
            }
            Self::NotDelivered { .. } => "the channel message was not delivered",
            Self::DecisionPending => "the decision is still pending: there is nothing to settle",
            Self::NotAllowed => "this user or chat may not answer this decision",
            Self::NeedsText => {
                "this choice takes text: reply to the decision message with it (or answer in Pi with /workflow answer, or with pi-workflows answer)"
            }
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::StaleAdapter
            | Self::SequenceReplayed
            | Self::StaleAttempt
            | Self::StaleRevision
            | Self::NoPendingDecision
            | Self::AlreadyApplying
            | Self::Ambiguous
            | Self::NotDelivered { .. }
            | Self::DecisionPending
            | Self::NotAllowed
            | Self::NeedsText => None,
        }
    }
}

impl Coded for UpdateRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::Run(run) => run.code(),
            Self::NoUnfinishedAttempt | Self::AttemptMismatch | Self::AttemptNotActive => {
                WireCode::StaleAttempt
            }
            Self::RateLimited { .. } | Self::TooManyPairs => WireCode::RateLimited,
            Self::IdempotencyConflict => WireCode::Conflict,
            Self::InvalidType
            | Self::InvalidKey
            | Self::DataNotObject { .. }
            | Self::DataTooLarge { .. }
            | Self::DataTooDeep { .. } => WireCode::SchemaInvalid,
            Self::AttemptNotWaiting
            | Self::RequestMismatch
            | Self::NotAgentStep
            | Self::WrongSession
            | Self::NotHeadless => WireCode::IllegalTransition,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::Run(run) => run.message(),
            Self::NoUnfinishedAttempt
            | Self::AttemptMismatch
            | Self::AttemptNotActive
            | Self::AttemptNotWaiting
            | Self::RequestMismatch
            | Self::NotAgentStep
            | Self::WrongSession => "the update does not name the run's active attempt",
            Self::NotHeadless => {
                "the update names a runner's authority for an interactive run (its agent tool works in the origin session)"
            }
            Self::RateLimited { .. } => "updates are limited to 20 per second with a burst of 100",
            Self::TooManyPairs => "a run holds at most 1,024 current update keys",
            Self::IdempotencyConflict => "the idempotency key names another update",
            Self::InvalidType | Self::InvalidKey => "invalid update type or key",
            Self::DataNotObject { .. } => "update data must be a JSON object",
            Self::DataTooLarge { .. } => "update data is limited to 64 KiB",
            Self::DataTooDeep { .. } => {
                "update data may nest at most 57 levels (the run view places it 7 levels deep in a 64-level frame)"
            }
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::Run(run) => run.protocol_check(),
            // A runner's update must name the attempt it was dispatched.
            Self::NoUnfinishedAttempt | Self::AttemptMismatch | Self::AttemptNotActive => {
                Some(ProtocolCheck::Attempt)
            }
            Self::IdempotencyConflict
            | Self::InvalidType
            | Self::InvalidKey
            | Self::DataNotObject { .. }
            | Self::DataTooLarge { .. }
            | Self::DataTooDeep { .. }
            | Self::AttemptNotWaiting
            | Self::RequestMismatch
            | Self::NotAgentStep
            | Self::WrongSession
            | Self::NotHeadless
            | Self::TooManyPairs
            | Self::RateLimited { .. } => None,
        }
    }
}

impl Coded for InteractionRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::Run { rejection } => rejection.code(),
            Self::Headless => WireCode::NoOriginSession,
            Self::StaleCoordinator => WireCode::ClaimLost,
            Self::NotActiveAttempt { .. } => WireCode::StaleAttempt,
            Self::RequestConflict { .. } | Self::SubmissionConflict { .. } => WireCode::Conflict,
            Self::UnknownInteraction { .. } => WireCode::NotFound,
            Self::NotSubmittedOutput
            | Self::NotPending { .. }
            | Self::ValidationInProgress { .. }
            | Self::StaleVerdict { .. }
            | Self::WrongAuthority
            | Self::NotAccepted => WireCode::IllegalTransition,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::Run { rejection } => rejection.message(),
            Self::Headless => {
                "a headless run has no origin session; agent steps run in the runner's own Pi process"
            }
            Self::NotActiveAttempt { .. } => NOT_ACTIVE,
            Self::RequestConflict { .. } => "the attempt already has another request",
            Self::SubmissionConflict { .. } => "the submission id names another submission",
            Self::UnknownInteraction { .. } => "the run has no interaction with this id",
            Self::NotSubmittedOutput
            | Self::NotPending { .. }
            | Self::ValidationInProgress { .. }
            | Self::StaleVerdict { .. } => "the request cannot do that in its current state",
            Self::WrongAuthority => {
                "the submission names another authority than its run's (the origin session of an interactive run, the live runner of a headless one)"
            }
            Self::NotAccepted => "the attempt's request has no accepted submission yet",
            Self::StaleCoordinator => {
                "another connection is the session's coordinator now; read the session view again"
            }
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::Run { rejection } => rejection.protocol_check(),
            Self::NotActiveAttempt { .. } | Self::NotAccepted => Some(ProtocolCheck::Attempt),
            Self::Headless
            | Self::WrongAuthority
            | Self::StaleCoordinator
            | Self::RequestConflict { .. }
            | Self::UnknownInteraction { .. }
            | Self::NotSubmittedOutput
            | Self::SubmissionConflict { .. }
            | Self::NotPending { .. }
            | Self::ValidationInProgress { .. }
            | Self::StaleVerdict { .. } => None,
        }
    }
}

impl Coded for SessionRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::StaleCoordinator => WireCode::ClaimLost,
            Self::TurnConflict { .. } => WireCode::Conflict,
            Self::UnknownMessage { .. } | Self::RunMismatch { .. } => WireCode::NotFound,
            Self::BranchNotReported => WireCode::IllegalTransition,
            // The shell passed too few ids: a server defect, not the client's.
            Self::MissingNewId => WireCode::Internal,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::StaleCoordinator => "another connection is the session's coordinator now",
            Self::TurnConflict { .. } => "the turn id names another turn",
            Self::UnknownMessage { .. } => "the session has no workflow message with this id",
            Self::RunMismatch { .. } => "the message belongs to another run",
            Self::BranchNotReported => "report the active branch first",
            Self::MissingNewId => "the server could not number the new messages; retry",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::StaleCoordinator
            | Self::BranchNotReported
            | Self::UnknownMessage { .. }
            | Self::MissingNewId
            | Self::TurnConflict { .. }
            | Self::RunMismatch { .. } => None,
        }
    }
}

impl Coded for FollowUpRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::Headless => WireCode::NoOriginSession,
            Self::ChainEnded { .. } => WireCode::Terminal,
            Self::AlreadyDelivered => WireCode::IllegalTransition,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::Headless => "a headless run has no session to follow up in",
            Self::ChainEnded { .. } => {
                "the workflow already failed, timed out or was cancelled; nothing follows it"
            }
            Self::AlreadyDelivered => "the follow-up was already delivered to the session",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::Headless | Self::ChainEnded { .. } | Self::AlreadyDelivered => None,
        }
    }
}

impl Coded for SettingsRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::ProjectRequired
            | Self::ProjectForUserScope
            | Self::TooManyKeys { .. }
            | Self::TooLarge { .. } => WireCode::SchemaInvalid,
            Self::RevisionExhausted => WireCode::IllegalTransition,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::ProjectRequired => "the project scope needs the project's path (projectPath)",
            Self::ProjectForUserScope => {
                "the user scope names no project; drop projectPath or use the project scope"
            }
            Self::TooManyKeys { .. } => {
                "the settings would hold more than 512 keys; delete keys (set them to null) first"
            }
            Self::TooLarge { .. } => {
                "the settings would exceed 64 KiB of JSON; delete or shorten values first"
            }
            Self::RevisionExhausted => "the settings scope reached its highest revision",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::ProjectRequired
            | Self::ProjectForUserScope
            | Self::TooManyKeys { .. }
            | Self::TooLarge { .. }
            | Self::RevisionExhausted => None,
        }
    }
}

impl Coded for LaunchRefusal {
    fn code(&self) -> WireCode {
        match self {
            Self::NotADecisionTurn => WireCode::IllegalTransition,
            Self::AlreadySelected { .. } | Self::ToolCallReused { .. } => WireCode::Conflict,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::NotADecisionTurn => {
                "only the model turn of a workflow's terminal message can select a launch from it"
            }
            Self::AlreadySelected { .. } => {
                "this workflow decision turn already selected its one launch (a restart or a start); it runs after the turn ends, so end your turn now"
            }
            Self::ToolCallReused { .. } => {
                "this tool call already selected another launch; repeat it with its original request"
            }
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::NotADecisionTurn | Self::AlreadySelected { .. } | Self::ToolCallReused { .. } => {
                None
            }
        }
    }
}

impl Coded for IntentRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::AlreadyClaimed { .. } => WireCode::Conflict,
            Self::NotEligible => WireCode::IllegalTransition,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::AlreadyClaimed { .. } => "another message already presents this workflow turn",
            Self::NotEligible => "the workflow turn is not due yet",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::AlreadyClaimed { .. } | Self::NotEligible => None,
        }
    }
}

impl Coded for CaptureRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::NotOriginSession => WireCode::NoOriginSession,
            Self::StaleCoordinator => WireCode::ClaimLost,
            Self::BatchSize { .. } | Self::EventTooLarge { .. } => WireCode::SchemaInvalid,
            Self::Gap { .. } | Self::RunFull => WireCode::IllegalTransition,
            Self::Conflict { .. } => WireCode::Conflict,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::NotOriginSession => "the session is not the run's origin session",
            Self::StaleCoordinator => "another connection is the session's coordinator now",
            Self::BatchSize { .. } => "a batch holds 1 to 256 events",
            Self::EventTooLarge { .. } => "an event's data is at most 64 KiB",
            Self::Gap { .. } => {
                "events are numbered from 1 without gaps; send from the next number"
            }
            Self::RunFull => "the run's capture holds its 1,000,000 events",
            Self::Conflict { .. } => "another event is stored under this number",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::NotOriginSession
            | Self::StaleCoordinator
            | Self::BatchSize { .. }
            | Self::EventTooLarge { .. }
            | Self::Gap { .. }
            | Self::RunFull
            | Self::Conflict { .. } => None,
        }
    }
}

impl Coded for PruneRefusal {
    fn code(&self) -> WireCode {
        match self {
            Self::ApplyWithoutBackup | Self::BackupWithoutApply | Self::DaysOutOfRange => {
                WireCode::SchemaInvalid
            }
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::ApplyWithoutBackup => {
                "applying a prune needs a new backup: give an absolute backup path with it"
            }
            Self::BackupWithoutApply => {
                "a dry run writes nothing: give a backup path only with apply"
            }
            Self::DaysOutOfRange => "olderThanDays must be between 1 and 36500",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::ApplyWithoutBackup | Self::BackupWithoutApply | Self::DaysOutOfRange => None,
        }
    }
}

impl Coded for BackupRefusal {
    fn code(&self) -> WireCode {
        match self {
            Self::StateFile | Self::NoSuchDirectory => WireCode::SchemaInvalid,
            Self::DestinationExists => WireCode::Conflict,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::StateFile => "the backup path names the live state; choose a path outside it",
            Self::DestinationExists => {
                "a file already exists at the backup path, and a backup never replaces a file; choose a new path"
            }
            Self::NoSuchDirectory => {
                "the backup path's directory does not exist; create it or choose another path"
            }
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::StateFile | Self::DestinationExists | Self::NoSuchDirectory => None,
        }
    }
}

impl Coded for ResourceRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::BadControllerName | Self::BadKey | Self::TooLarge | Self::BadStatus => {
                WireCode::SchemaInvalid
            }
            Self::Deleting => WireCode::IllegalTransition,
            Self::NotFound => WireCode::NotFound,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::BadControllerName => {
                "a controller name is lowercase letters, digits and dashes, starting with a letter"
            }
            Self::BadKey => "a resource key is 1 to 512 bytes with no control characters",
            Self::TooLarge => "a resource spec or status is at most 1 MiB of JSON",
            Self::BadStatus => {
                "a condition needs a type and a reason (at most 64 conditions), and finalizers are at most 32 names"
            }
            Self::Deleting => {
                "the resource is being deleted; wait until it is gone, then apply it again"
            }
            Self::NotFound => "no such resource; list them with `pi-workflows resources`",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::BadControllerName
            | Self::BadKey
            | Self::TooLarge
            | Self::BadStatus
            | Self::Deleting
            | Self::NotFound => None,
        }
    }
}

impl Coded for ReconcileRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::ClaimLost => WireCode::ClaimLost,
            Self::NotClaimable => WireCode::Conflict,
            Self::BadDuration => WireCode::SchemaInvalid,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::ClaimLost => "another reconcile owns the resource or its claim expired",
            Self::NotClaimable => "the resource is being reconciled or is not due yet",
            Self::BadDuration => "a lease is at least 300 ms and a requeue delay more than 0 ms",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::ClaimLost | Self::NotClaimable | Self::BadDuration => None,
        }
    }
}

impl Coded for EffectEnsureRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::RequestConflict | Self::SecondEffectInPass => WireCode::Conflict,
            Self::BadKey => WireCode::SchemaInvalid,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::RequestConflict => {
                "this effect key was used with another kind, request or generation; use a new key"
            }
            Self::SecondEffectInPass => {
                "a reconcile applies at most one effect; requeue and apply the next one in the next pass"
            }
            Self::BadKey => "an effect key and kind are 1 to 512 bytes",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::RequestConflict | Self::SecondEffectInPass | Self::BadKey => None,
        }
    }
}

impl Coded for ChildRejection {
    fn code(&self) -> WireCode {
        match self {
            Self::RequestConflict => WireCode::Conflict,
            Self::BadKey => WireCode::SchemaInvalid,
            Self::StaleRun => WireCode::StaleAttempt,
        }
    }

    fn message(&self) -> &'static str {
        match self {
            Self::RequestConflict => {
                "this request key was used with another workflow or input; a changed input needs a new key"
            }
            Self::BadKey => "a workflow request key is 1 to 512 bytes",
            Self::StaleRun => "the run is not the request's current attempt",
        }
    }

    fn protocol_check(&self) -> Option<ProtocolCheck> {
        match self {
            Self::RequestConflict | Self::BadKey | Self::StaleRun => None,
        }
    }
}
