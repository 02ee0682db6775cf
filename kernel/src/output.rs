//! What a transition asks the shell to do after it commits.
//!
//! Invariants:
//! - Outputs are data. The kernel never performs them; the shell performs
//!   them in order, and only after the transaction that wrote the new facts
//!   has committed (events are the exception: the shell writes them in the
//!   same transaction as the facts).
//! - Every transition that changes a run's durable facts emits exactly one
//!   `PublishRun` for that run, so every renderer sees the new revision.
//!   Supervision records that are not run progress (a resolved node
//!   deadline, the exit of a runner that no longer drives the run) keep the
//!   revision and publish nothing.

use crate::ids::{
    AttemptId, Generation, InteractionId, NodeId, Revision, RunId, RunnerEpochId, SessionId,
    SubmissionId,
};
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// The result of an accepted transition: the new facts and the shell's to-do list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition<F> {
    pub facts: F,
    pub outputs: Vec<Output>,
}

impl<F> Transition<F> {
    /// A transition with no outputs yet.
    pub fn new(facts: F) -> Self {
        Self {
            facts,
            outputs: Vec::new(),
        }
    }

    /// Appends one output.
    #[must_use]
    pub fn with(mut self, output: Output) -> Self {
        self.outputs.push(output);
        self
    }
}

/// What a time- or exit-driven decision asks of the shell: write a
/// transition now, decide again later, or nothing. A deferral is the
/// kernel's answer, not a rejection the shell converts: the facts do not
/// change and the shell schedules one wake for the same run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Step<F> {
    /// Write these facts, commit, then perform the outputs.
    Apply(Transition<F>),
    /// Nothing changes now; decide again at `at_ms` (an `Output::Wake` for
    /// the run).
    Defer { at_ms: u64, reason: WakeReason },
    /// Nothing to decide: the committed facts already settle it.
    Nothing,
}

impl<F> Step<F> {
    /// A transition result as a step that defers while another owner's
    /// claim is live: `ClaimHeld` becomes a wake at the claim's expiry for
    /// `reason`; every other rejection stays a rejection.
    pub fn unless_claim_held(
        decided: Result<Transition<F>, crate::run::Rejection>,
        reason: WakeReason,
    ) -> Result<Self, crate::run::Rejection> {
        match decided {
            Ok(transition) => Ok(Self::Apply(transition)),
            Err(crate::run::Rejection::ClaimHeld { expires_at_ms }) => Ok(Self::Defer {
                at_ms: expires_at_ms,
                reason,
            }),
            Err(rejection) => Err(rejection),
        }
    }

    /// The outputs the shell performs for this step for `run_id` (a
    /// deferral is one `Wake`).
    pub fn into_outputs(self, run_id: &RunId) -> (Option<F>, Vec<Output>) {
        match self {
            Self::Apply(transition) => (Some(transition.facts), transition.outputs),
            Self::Defer { at_ms, reason } => (
                None,
                alloc::vec![Output::Wake {
                    run_id: run_id.clone(),
                    at_ms,
                    reason,
                }],
            ),
            Self::Nothing => (None, Vec::new()),
        }
    }
}

/// Which explicit command a new runner receives after `runner.ready`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LaunchCommand {
    /// A new run from the workflow's start node.
    Start,
    /// An existing run from its last durable boundary.
    Resume,
    /// A continuation of a waiting checkpoint parent.
    Continue {
        parent_run_id: RunId,
        checkpoint: NodeId,
    },
    /// A restart of a terminal run, from the workflow's start node.
    Restart { restarted_run_id: RunId },
}

/// Why the shell must stop a runner's process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StopReason {
    Paused,
    Cancelled,
    Parked,
    NodeTimedOut,
    ClaimLost,
    Finished,
}

/// Why the shell must wake up later.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WakeReason {
    /// A node attempt's resolved deadline.
    NodeDeadline { attempt_id: AttemptId },
    /// A protected decision's `onTimeout` deadline.
    DecisionDeadline,
    /// A claim's expiry (recovery of a stale row).
    ClaimExpiry,
}

/// One immutable event row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum RunEvent {
    Reserved,
    Admitted {
        generation: Generation,
    },
    RunnerReady {
        runner_epoch: RunnerEpochId,
    },
    NodeStarted {
        node_id: NodeId,
        attempt_id: AttemptId,
    },
    NodeFinished {
        node_id: NodeId,
        attempt_id: AttemptId,
    },
    NodeFailed {
        node_id: NodeId,
        attempt_id: AttemptId,
    },
    Parked {
        reason: crate::run::ParkReason,
    },
    Waiting {
        node_id: NodeId,
    },
    Paused,
    Resumed,
    Cancelled,
    Completed,
    Failed {
        class: crate::run::FailureClass,
    },
    TimedOut,
    Restarted {
        new_run_id: RunId,
    },
    Continued {
        continuation_run_id: RunId,
    },
    /// The server took a control claim (stale recovery, deadline, cancel).
    /// The previous owner, if any, lost its authority: a handoff, never a failure.
    ControlClaimed {
        generation: Generation,
    },
    EffectAmbiguous {
        effect_type: alloc::string::String,
    },
    /// The runner may apply this effect attempt now (`effect.reserve` accepted).
    EffectApplying {
        effect_id: crate::ids::EffectId,
        attempt_number: u32,
    },
    /// The runner reported the effect's outcome (`applied` or `rejected`).
    EffectSettled {
        effect_id: crate::ids::EffectId,
        state: crate::effect::EffectState,
    },
    /// An operator resolved an ambiguous effect.
    EffectRecovered {
        effect_id: crate::ids::EffectId,
        action: crate::effect::RecoveryAction,
    },
    /// A protected decision was accepted (by a person or by its `onTimeout` default).
    DecisionAccepted {
        decision_id: crate::ids::DecisionId,
        provenance: crate::decision::Provenance,
    },
    /// A protected decision reached its deadline without a default response.
    DecisionExpired {
        decision_id: crate::ids::DecisionId,
    },
    RunnerExited {
        runner_epoch: RunnerEpochId,
        outcome: crate::runner::RunnerOutcome,
    },
    /// A runner message failed this protocol check (`protocolRejected`); the
    /// run was parked for an explicit resume or cancel.
    ProtocolRejected {
        check: crate::runner::ProtocolCheck,
    },
    /// A workflow update became the current value of its `(type, key)`
    /// (`update_published`; the shell stores the data bytes beside it).
    UpdatePublished {
        update_id: crate::updates::UpdateId,
        update_type: alloc::string::String,
        key: alloc::string::String,
        data_digest: crate::ids::Digest,
    },
    /// The runner's attempt now waits for an interactive request in the origin session.
    InteractionRequested {
        interaction_id: InteractionId,
        attempt_id: AttemptId,
    },
    /// The validation child accepted a submission; the request is settled.
    SubmissionAccepted {
        interaction_id: InteractionId,
        submission_id: SubmissionId,
    },
    /// A provisional submission was rejected; the request stays pending.
    SubmissionRejected {
        interaction_id: InteractionId,
        submission_id: SubmissionId,
        cause: crate::interaction::RejectionCause,
    },
}

impl RunEvent {
    /// The event's `kind` as stored (its serde tag), for the events table's
    /// `kind` column (one arm each: a new event names its kind here).
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Admitted { .. } => "admitted",
            Self::RunnerReady { .. } => "runnerReady",
            Self::NodeStarted { .. } => "nodeStarted",
            Self::NodeFinished { .. } => "nodeFinished",
            Self::NodeFailed { .. } => "nodeFailed",
            Self::Parked { .. } => "parked",
            Self::Waiting { .. } => "waiting",
            Self::Paused => "paused",
            Self::Resumed => "resumed",
            Self::Cancelled => "cancelled",
            Self::Completed => "completed",
            Self::Failed { .. } => "failed",
            Self::TimedOut => "timedOut",
            Self::Restarted { .. } => "restarted",
            Self::Continued { .. } => "continued",
            Self::ControlClaimed { .. } => "controlClaimed",
            Self::EffectAmbiguous { .. } => "effectAmbiguous",
            Self::EffectApplying { .. } => "effectApplying",
            Self::EffectSettled { .. } => "effectSettled",
            Self::EffectRecovered { .. } => "effectRecovered",
            Self::DecisionAccepted { .. } => "decisionAccepted",
            Self::DecisionExpired { .. } => "decisionExpired",
            Self::RunnerExited { .. } => "runnerExited",
            Self::ProtocolRejected { .. } => "protocolRejected",
            Self::UpdatePublished { .. } => "updatePublished",
            Self::InteractionRequested { .. } => "interactionRequested",
            Self::SubmissionAccepted { .. } => "submissionAccepted",
            Self::SubmissionRejected { .. } => "submissionRejected",
        }
    }
}

/// Something the shell must do.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Output {
    /// Write an immutable event row in the same transaction.
    Event { run_id: RunId, event: RunEvent },
    /// Spawn a runner (after commit) in its own process group.
    SpawnRunner {
        run_id: RunId,
        generation: Generation,
        runner_epoch: RunnerEpochId,
        command: LaunchCommand,
    },
    /// Stop a runner's process group: SIGTERM, then bounded SIGKILL.
    StopRunner {
        run_id: RunId,
        runner_epoch: RunnerEpochId,
        reason: StopReason,
    },
    /// Publish the run's new view revision to subscribers.
    PublishRun { run_id: RunId, revision: Revision },
    /// Publish the origin session's view (messages changed).
    PublishSession { session_id: SessionId },
    /// Wake the shell at `at_ms` for `reason`.
    Wake {
        run_id: RunId,
        at_ms: u64,
        reason: WakeReason,
    },
    /// Start a supervised validation child for a provisional submission.
    SpawnValidator {
        run_id: RunId,
        interaction_id: InteractionId,
        submission_id: SubmissionId,
    },
    /// Build the terminal workflow message after the terminal state committed.
    BuildTerminalMessage { run_id: RunId },
    /// Admission may have become possible (capacity freed or new work).
    Schedule,
    /// Ask for an automatic retention sweep once the server is idle.
    RequestRetentionSweep,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Digest, EffectId};
    use alloc::vec;

    /// One event of every kind.
    fn every_event() -> Vec<RunEvent> {
        let attempt = || AttemptId::new("att-1");
        let node = || NodeId::new("a");
        let interaction = || InteractionId::new("int-1");
        let submission = || SubmissionId::new("sub-1");
        vec![
            RunEvent::Reserved,
            RunEvent::Admitted {
                generation: Generation(1),
            },
            RunEvent::RunnerReady {
                runner_epoch: RunnerEpochId::new("epoch-1"),
            },
            RunEvent::NodeStarted {
                node_id: node(),
                attempt_id: attempt(),
            },
            RunEvent::NodeFinished {
                node_id: node(),
                attempt_id: attempt(),
            },
            RunEvent::NodeFailed {
                node_id: node(),
                attempt_id: attempt(),
            },
            RunEvent::Parked {
                reason: crate::run::ParkReason::Drained,
            },
            RunEvent::Waiting { node_id: node() },
            RunEvent::Paused,
            RunEvent::Resumed,
            RunEvent::Cancelled,
            RunEvent::Completed,
            RunEvent::Failed {
                class: crate::run::FailureClass::NodeFailed,
            },
            RunEvent::TimedOut,
            RunEvent::Restarted {
                new_run_id: RunId::new("run-2"),
            },
            RunEvent::Continued {
                continuation_run_id: RunId::new("run-3"),
            },
            RunEvent::ControlClaimed {
                generation: Generation(2),
            },
            RunEvent::EffectAmbiguous {
                effect_type: "http".into(),
            },
            RunEvent::EffectApplying {
                effect_id: EffectId::new("eff-1"),
                attempt_number: 1,
            },
            RunEvent::EffectSettled {
                effect_id: EffectId::new("eff-1"),
                state: crate::effect::EffectState::Applied,
            },
            RunEvent::EffectRecovered {
                effect_id: EffectId::new("eff-1"),
                action: crate::effect::RecoveryAction::Confirm,
            },
            RunEvent::DecisionAccepted {
                decision_id: crate::ids::DecisionId::new("dec-1"),
                provenance: crate::decision::Provenance::Human,
            },
            RunEvent::DecisionExpired {
                decision_id: crate::ids::DecisionId::new("dec-1"),
            },
            RunEvent::RunnerExited {
                runner_epoch: RunnerEpochId::new("epoch-1"),
                outcome: crate::runner::RunnerOutcome::Exited,
            },
            RunEvent::ProtocolRejected {
                check: crate::runner::ProtocolCheck::Schema,
            },
            RunEvent::UpdatePublished {
                update_id: crate::updates::UpdateId::new("upd_1"),
                update_type: "progress".into(),
                key: "k".into(),
                data_digest: Digest([0; 32]),
            },
            RunEvent::InteractionRequested {
                interaction_id: interaction(),
                attempt_id: attempt(),
            },
            RunEvent::SubmissionAccepted {
                interaction_id: interaction(),
                submission_id: submission(),
            },
            RunEvent::SubmissionRejected {
                interaction_id: interaction(),
                submission_id: submission(),
                cause: crate::interaction::RejectionCause::Invalid,
            },
        ]
    }

    #[test]
    fn an_events_kind_is_its_stored_tag() {
        for event in every_event() {
            let stored = serde_json::to_value(&event).unwrap();
            assert_eq!(
                stored.get("kind").and_then(serde_json::Value::as_str),
                Some(event.kind()),
                "{event:?}"
            );
        }
    }
}
