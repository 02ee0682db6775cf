//! Execution: node attempts driven by runner messages and by the server's
//! control path, and the one instruction the runner receives next.
//!
//! Invariants:
//! - A run has at most one unfinished attempt. A new attempt is created only
//!   after the previous one finished or was abandoned, and only in the same
//!   transition that decides to run its node.
//! - An attempt finishes once: its step is recorded, then routed
//!   ([`crate::routing`]); the route either dispatches the next node, parks
//!   the run for the next generation, waits, or ends the run — in that one
//!   transition.
//! - Only the runner holding the live claim of the current runner epoch can
//!   start or finish the active attempt; a stale message (older generation,
//!   other runner epoch, expired claim, another attempt) is rejected and
//!   changes nothing.
//! - A waiting attempt (an interactive request in the origin session) is
//!   finished only by the server's control path under a fresh control claim;
//!   a continuing route parks the run `resumeReady` and the next generation
//!   dispatches the next node.
//! - The resume point of a new generation comes from committed facts: an
//!   abandoned attempt reruns with the same visit; otherwise the run starts at
//!   `startAt` or routes on from its last step (a continuation from its
//!   parent's checkpoint).
//! - Recording a node's resolved deadline is not progress: it does not
//!   advance the run revision.

use crate::attempt::{AttemptRecord, AttemptStatus, NodeOutcome, ResultRecord, StepRecord};
use crate::claim::{self, Authority, ClaimRequest};
use crate::decision::{DecisionStatus, Opening};
use crate::effect;
use crate::ids::{AttemptId, MessageId, NodeId, RunnerEpochId};
use crate::interaction::InteractionStatus;
use crate::message::{MessageKind, MessageRecord, MessageState};
use crate::output::{Output, RunEvent, Step, StopReason, Transition, WakeReason};
use crate::routing::{self, Route, RouteFailure};
use crate::run::{
    self, FailureClass, Operation, ParkReason, QueueStatus, ReasonKind, Rejection, RunAggregate,
    RunError, RunRecord, RunStatus, Terminal, Tx,
};
use crate::runner::RunnerRecord;
use crate::topology::{NodeTimeout, NodeType, Topology};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the server tells the runner next: the `node` of its first command or
/// the `next` of a reply.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Dispatch {
    /// Run this node as this attempt.
    RunNode {
        node_id: NodeId,
        attempt_id: AttemptId,
        visit: u32,
    },
    /// The runner has nothing more to do in this generation and exits.
    Exit { reason: ExitReason },
}

/// Why a runner exits after a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExitReason {
    Completed,
    Waiting,
    Failed,
    TimedOut,
    Cancelled,
    /// The run continues in a later generation.
    Parked,
}

/// Who finishes an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Actor<'a> {
    /// The runner of the current epoch, with the host authority the server
    /// holds for it. The attempt must be the active one.
    Runner {
        authority: &'a Authority,
        runner_epoch: &'a RunnerEpochId,
    },
    /// The server's control path on a `waiting` run (an accepted interactive
    /// submission, an interactive deadline, too many unproductive turns). The
    /// attempt must be the waiting one.
    Control {
        request: ClaimRequest,
        /// Why the control path fails the attempt, when it does
        /// (`UnproductiveTurns` for the unproductive-turn limit, from
        /// `AttemptFollowUp::Fail`). Only with a `failed` result. When no
        /// route continues after the failure, the run error carries this
        /// reason instead of `NodeFailed` (the class stays `nodeFailed`).
        failure: Option<ReasonKind>,
    },
}

/// A finished node as the runner (or the control path) proposes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeResult {
    pub outcome: NodeOutcome,
    /// `{attemptId, nodeId, nodeType, outcome, startedAt, finishedAt,
    /// durationMs, output?, error?}`; its `attemptId`, `nodeId` and `outcome`
    /// must name the attempt and outcome being finished.
    pub record: Value,
}

/// How a route that continues proceeds.
enum Onward {
    /// A live runner runs the next node now as this attempt.
    Dispatch(AttemptId),
    /// The run parks `resumeReady`; the next generation dispatches.
    Park,
}

/// `runner.ready` plus the resume point, in one transition: marks the runner
/// ready, records [`RunnerRecord::ready_revision`] (the revision this
/// transition commits) and decides what the runner's one command carries.
///
/// `route_from` is the result record of the step the run routes on from (the
/// last step; for a continuation the parent's checkpoint, with the validated
/// response as its output for a protected decision). It is required exactly
/// when the run has steps and no abandoned attempt.
///
/// `adopted` is the `ok` result of an abandoned attempt whose interaction
/// accepted a submission ([`crate::interaction::adoptable_submission`], the record
/// with that submission's output): it is required exactly then; the attempt
/// finishes with it (the step is not run again) and the run parks
/// `resumeReady` or ends, so this runner exits and the next generation
/// routes on from the committed step.
#[expect(
    clippy::too_many_arguments,
    reason = "facts, authority and ids are all inputs"
)]
pub fn start_generation(
    agg: &RunAggregate,
    topology: &Topology,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    route_from: Option<&Value>,
    adopted: Option<NodeResult>,
    new_attempt_id: AttemptId,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch), Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    run::mark_ready(&mut tx, authority, runner_epoch, ttl_ms)?;
    let ready_revision = tx.agg.run.revision.next();
    if let Some(runner) = tx.agg.run.runner.as_mut() {
        runner.ready_revision = Some(ready_revision);
    }
    let adoptable = crate::interaction::adoptable_submission(agg).is_some();
    if adopted.is_some() != adoptable {
        return Err(Rejection::ResultMismatch);
    }
    let dispatch = match resume_point(agg, topology, route_from)? {
        ResumePoint::Rerun(abandoned) => match adopted {
            Some(result) => {
                if result.outcome != NodeOutcome::Ok {
                    return Err(Rejection::ResultMismatch);
                }
                let attempt = tx
                    .agg
                    .attempt
                    .as_mut()
                    .expect("resume_point found the abandoned attempt");
                attempt.status = AttemptStatus::Active;
                attempt.finished_at_ms = None;
                // The run parks `resumeReady` (or ends): the next generation
                // routes on from the committed step and its stored output.
                settle_attempt_in(&mut tx, topology, authority, result, Onward::Park, None)?
            }
            None => start_attempt_in(
                &mut tx,
                abandoned.node_id,
                new_attempt_id,
                abandoned.visit,
                abandoned.crash_retries,
            ),
        },
        ResumePoint::Route { route, from } => {
            let onward = Onward::Dispatch(new_attempt_id);
            apply_route_in(&mut tx, topology, authority, route, from, onward, None)?
        }
    };
    Ok((tx.commit(), dispatch))
}

enum ResumePoint {
    Rerun(AttemptRecord),
    Route { route: Route, from: Option<NodeId> },
}

fn resume_point(
    agg: &RunAggregate,
    topology: &Topology,
    route_from: Option<&Value>,
) -> Result<ResumePoint, Rejection> {
    match &agg.attempt {
        Some(attempt) if attempt.status == AttemptStatus::Abandoned => {
            known_node(topology, &attempt.node_id)?;
            return Ok(ResumePoint::Rerun(attempt.clone()));
        }
        Some(attempt) if attempt.status.is_unfinished() => {
            return Err(Rejection::UnfinishedAttempt);
        }
        _ => {}
    }
    let Some(last) = agg.steps.last() else {
        let start = topology.start_at.clone();
        return Ok(ResumePoint::Route {
            route: Route::Next(start),
            from: None,
        });
    };
    known_node(topology, &last.node_id)?;
    let record = route_from.ok_or(Rejection::RouteRecordMissing)?;
    check_record(record, &last.attempt_id, &last.node_id, last.outcome)?;
    let route = if !agg.steps.has_own_steps() && agg.run.lineage.continuation_of.is_some() {
        routing::route_from_checkpoint(topology, &last.node_id, record)
    } else {
        routing::route(topology, &last.node_id, last.outcome, record)
    };
    Ok(ResumePoint::Route {
        route,
        from: Some(last.node_id.clone()),
    })
}

/// `node.started`: records the attempt's resolved wall-clock deadline and
/// asks the shell to wake at it. It renews the claim but does not advance
/// the run revision, so it is not progress. A message without a deadline
/// leaves the attempt's deadline as it is: a node without one, or an
/// attempt whose static deadline the fused commit ([`finish_and_start`])
/// recorded, for which the runner reports only its status detail. A
/// deadline for an attempt that has one is refused
/// (`DeadlineAlreadyRecorded`): a recorded deadline never moves.
pub fn record_node_started(
    agg: &RunAggregate,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    attempt_id: &AttemptId,
    deadline_at_ms: Option<u64>,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Transition<RunAggregate>, Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
    let attempt = current_attempt(&tx.agg, attempt_id, AttemptStatus::Active)?;
    let Some(at_ms) = deadline_at_ms else {
        return Ok(tx.commit_unversioned());
    };
    if attempt.deadline_at_ms.is_some() {
        return Err(Rejection::DeadlineAlreadyRecorded);
    }
    if let Some(attempt) = tx.agg.attempt.as_mut() {
        attempt.deadline_at_ms = Some(at_ms);
    }
    let run_id = tx.agg.run.run_id.clone();
    let reason = WakeReason::NodeDeadline {
        attempt_id: attempt_id.clone(),
    };
    tx.output(Output::Wake {
        run_id,
        at_ms,
        reason,
    });
    Ok(tx.commit_unversioned())
}

/// `node.finished` / `node.failed` from the runner, or the control path's
/// settlement of a waiting attempt: records the step, routes, checks the step
/// limits and then dispatches the next attempt (visit = that node's earlier
/// steps + 1), parks the run for the next generation, waits, or ends the run.
/// `next_attempt_id` is used only when a runner continues to another node.
#[expect(
    clippy::too_many_arguments,
    reason = "facts, actor and ids are all inputs"
)]
pub fn finish_attempt(
    agg: &RunAggregate,
    topology: &Topology,
    actor: Actor<'_>,
    attempt_id: &AttemptId,
    result: NodeResult,
    next_attempt_id: AttemptId,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch), Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    let (authority, onward, failure) = match actor {
        Actor::Runner {
            authority,
            runner_epoch,
        } => {
            run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
            current_attempt(&tx.agg, attempt_id, AttemptStatus::Active)?;
            (authority.clone(), Onward::Dispatch(next_attempt_id), None)
        }
        Actor::Control { request, failure } => {
            if failure.is_some() && result.outcome != NodeOutcome::Failed {
                return Err(Rejection::ResultMismatch);
            }
            settle_waiting_precheck(agg, attempt_id)?;
            (
                run::take_control_in(&mut tx, request, ttl_ms)?,
                Onward::Park,
                failure,
            )
        }
    };
    let dispatch = settle_attempt_in(&mut tx, topology, &authority, result, onward, failure)?;
    Ok((tx.commit(), dispatch))
}

/// What a fused commit ([`finish_and_start`]) tells the runner about the
/// deadline of the attempt it dispatched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum StartDeadline {
    /// The node's timeout is static: the kernel resolved the deadline from
    /// the dispatch time (`None` for a node without one) and it is durable
    /// with the result, so `node.started` has nothing durable to add.
    Committed { deadline_at_ms: Option<u64> },
    /// The node's timeout is a function only the runner can evaluate: the
    /// runner reports it in `node.started` ([`record_node_started`]) before
    /// it proposes anything that depends on it (an interaction).
    RunnerResolves,
}

/// `node.finished` / `node.failed` fused with the start of the next node:
/// [`finish_attempt`] for the claim-holding runner (records the step,
/// routes, checks the step limits, dispatches the next attempt), and in the
/// same transition the dispatched attempt's deadline when the node's timeout
/// is static (a wake at it is requested). One commit then holds the result,
/// the next attempt and, for a static timeout, everything `node.started`
/// used to add; the deadline is `now_ms` + the timeout, so it never ends
/// later than one the runner would have resolved after receiving the reply.
/// `None` when the reply dispatches no node.
#[expect(
    clippy::too_many_arguments,
    reason = "facts, authority and ids are all inputs"
)]
pub fn finish_and_start(
    agg: &RunAggregate,
    topology: &Topology,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    attempt_id: &AttemptId,
    result: NodeResult,
    next_attempt_id: AttemptId,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch, Option<StartDeadline>), Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
    current_attempt(&tx.agg, attempt_id, AttemptStatus::Active)?;
    let onward = Onward::Dispatch(next_attempt_id);
    let dispatch = settle_attempt_in(&mut tx, topology, authority, result, onward, None)?;
    let deadline = dispatched_deadline_in(&mut tx, topology, &dispatch)?;
    Ok((tx.commit(), dispatch, deadline))
}

/// The deadline of the attempt `dispatch` starts, when it starts one.
fn dispatched_deadline_in(
    tx: &mut Tx,
    topology: &Topology,
    dispatch: &Dispatch,
) -> Result<Option<StartDeadline>, Rejection> {
    match dispatch {
        Dispatch::RunNode { node_id, .. } => {
            commit_static_deadline_in(tx, topology, node_id).map(Some)
        }
        Dispatch::Exit { .. } => Ok(None),
    }
}

/// Resolves the just-dispatched attempt's deadline from its node's static
/// timeout (and asks for a wake at it), or leaves it to the runner.
fn commit_static_deadline_in(
    tx: &mut Tx,
    topology: &Topology,
    node_id: &NodeId,
) -> Result<StartDeadline, Rejection> {
    let node = topology
        .node(node_id)
        .ok_or_else(|| Rejection::UnknownNode {
            node_id: node_id.clone(),
        })?;
    let deadline_at_ms = match node.timeout {
        NodeTimeout::Dynamic => return Ok(StartDeadline::RunnerResolves),
        NodeTimeout::Unbounded => None,
        NodeTimeout::EngineDefault | NodeTimeout::Fixed { .. } => node
            .timeout
            .static_ms()
            .map(|ms| tx.now_ms().saturating_add(ms)),
    };
    let attempt = tx
        .agg
        .attempt
        .as_mut()
        .expect("the dispatch started an attempt");
    attempt.deadline_at_ms = deadline_at_ms;
    if let Some(at_ms) = deadline_at_ms {
        let reason = WakeReason::NodeDeadline {
            attempt_id: attempt.attempt_id.clone(),
        };
        let run_id = tx.agg.run.run_id.clone();
        tx.output(Output::Wake {
            run_id,
            at_ms,
            reason,
        });
    }
    Ok(StartDeadline::Committed { deadline_at_ms })
}

/// Where a notify node's content goes: one passive `notification` message
/// in the origin session of an interactive run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotificationMessage {
    pub message_id: MessageId,
    /// The session order of the message.
    pub order: u64,
}

/// `notification.requested`: a notify node finishes `ok` with its receipt as
/// output and, for an interactive run, creates one passive `notification`
/// message in the same transition as the node result. A headless run has no
/// session to notify; the content stays in the node's output. A repeat is
/// handled by the runner-message receipt, so one visit never notifies twice.
/// Like [`finish_and_start`], the transition also records the static
/// deadline of the attempt it dispatches (`None` when it dispatches none).
#[expect(
    clippy::too_many_arguments,
    reason = "facts, authority and ids are all inputs"
)]
pub fn finish_notification(
    agg: &RunAggregate,
    topology: &Topology,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    attempt_id: &AttemptId,
    result: NodeResult,
    message: NotificationMessage,
    next_attempt_id: AttemptId,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch, Option<StartDeadline>), Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
    let attempt = current_attempt(&tx.agg, attempt_id, AttemptStatus::Active)?;
    let is_notify = topology
        .node(&attempt.node_id)
        .is_some_and(|node| node.node_type == crate::topology::NodeType::Notify);
    if !is_notify || result.outcome != NodeOutcome::Ok {
        return Err(Rejection::ResultMismatch);
    }
    let kind = MessageKind::Notification;
    message_origin_session(&mut tx, message.message_id, message.order, kind, now_ms);
    let onward = Onward::Dispatch(next_attempt_id);
    let dispatch = settle_attempt_in(&mut tx, topology, authority, result, onward, None)?;
    let deadline = dispatched_deadline_in(&mut tx, topology, &dispatch)?;
    Ok((tx.commit(), dispatch, deadline))
}

/// One pending message of `kind` in the run's origin session, in the
/// transition's commit; a headless run has no session, so nothing.
fn message_origin_session(
    tx: &mut Tx,
    message_id: MessageId,
    order: u64,
    kind: MessageKind,
    now_ms: u64,
) {
    if let Some(session_id) = tx.agg.run.mode.origin_session().cloned() {
        tx.agg.messages.push(MessageRecord {
            message_id,
            session_id,
            run_id: tx.agg.run.run_id.clone(),
            kind,
            order,
            state: MessageState::Pending,
            entry_id: None,
            created_at_ms: now_ms,
        });
        tx.publish_session();
    }
}

/// Where a protected decision's message goes: one `decision` message in
/// the origin session of an interactive run (a headless run's decision is
/// answered through `decision.answer` from the command line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionMessage {
    pub message_id: MessageId,
    /// The session order of the message.
    pub order: u64,
}

/// `node.finished` of a `humanDecision` checkpoint: the attempt finishes
/// `ok` with the sealed request as its output and, in the same transition,
/// the decision opens (pending, with its deadline and default), the run
/// waits on the checkpoint, an interactive run gets one `decision` message
/// (which never starts a model turn), and a wake is asked for at the
/// deadline. The shell checked the request's seals and its binding to this
/// attempt before; only a human-decision checkpoint finishing `ok` comes
/// here, and such a checkpoint finishes nowhere else.
#[expect(
    clippy::too_many_arguments,
    reason = "facts, authority and ids are all inputs"
)]
pub fn finish_protected_checkpoint(
    agg: &RunAggregate,
    topology: &Topology,
    authority: &Authority,
    runner_epoch: &RunnerEpochId,
    attempt_id: &AttemptId,
    result: NodeResult,
    opening: Opening,
    message: DecisionMessage,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch), Rejection> {
    let mut tx = Tx::begin(agg, now_ms);
    run::authorize_runner(&mut tx, authority, runner_epoch, ttl_ms)?;
    let attempt = current_attempt(&tx.agg, attempt_id, AttemptStatus::Active)?;
    let node_id = attempt.node_id.clone();
    let protected = topology
        .node(&node_id)
        .is_some_and(|node| node.human_decision && node.node_type == NodeType::Checkpoint);
    if !protected || result.outcome != NodeOutcome::Ok {
        return Err(Rejection::ResultMismatch);
    }
    let run_id = tx.agg.run.run_id.clone();
    let decision = opening.pending(run_id.clone(), node_id);
    let deadline_at_ms = decision.deadline_at_ms;
    let decision_id = decision.decision_id.clone();
    tx.agg.decision = Some(decision);
    // An `ok` checkpoint always waits (`routing::route`), so no onward
    // node is ever dispatched from here.
    let dispatch = settle_attempt_in(&mut tx, topology, authority, result, Onward::Park, None)?;
    let kind = MessageKind::Decision { decision_id };
    message_origin_session(&mut tx, message.message_id, message.order, kind, now_ms);
    if let Some(at_ms) = deadline_at_ms {
        tx.output(Output::Wake {
            run_id,
            at_ms,
            reason: WakeReason::DecisionDeadline,
        });
    }
    Ok((tx.commit(), dispatch))
}

/// A node deadline passed (the shell's `Wake` fired): the attempt times out
/// and is routed like [`finish_attempt`]. A waiting attempt's deadline is its
/// origin-session request's [`crate::interaction::TurnClock`] (model-turn
/// time); a stopped clock with time left never expires (the rejection names
/// no deadline, so nothing is deferred: the next turn start arms a new
/// wake). A `$result.outcome` switch may
/// continue (the run parks `resumeReady` for the next generation), otherwise
/// the run ends `timed_out`. An active attempt's runner is stopped
/// (`NodeTimedOut`); the server presents its host authority for it, or takes
/// a control claim when the runner's claim expired. A waiting attempt is
/// settled by the control path. The timed-out result record is built here
/// ([`ResultRecord`], error [`DEADLINE_MESSAGE`]).
pub fn expire_node(
    agg: &RunAggregate,
    topology: &Topology,
    host: Option<&Authority>,
    control: ClaimRequest,
    attempt_id: &AttemptId,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<(Transition<RunAggregate>, Dispatch), Rejection> {
    if agg.run.status.is_terminal() {
        return Err(Rejection::Terminal {
            status: agg.run.status,
        });
    }
    let attempt = agg
        .attempt
        .as_ref()
        .filter(|a| &a.attempt_id == attempt_id && a.status.is_unfinished())
        .ok_or(Rejection::StaleAttempt)?;
    // A waiting attempt's origin-session request counts model-turn time.
    let clock = agg
        .interaction
        .as_ref()
        .filter(|record| {
            attempt.status == AttemptStatus::Waiting
                && record.attempt_id == *attempt_id
                && record.status == InteractionStatus::Pending
                && record.target_session.is_some()
        })
        .map(|record| record.clock);
    match clock {
        Some(clock) if clock.expired(now_ms) => {}
        Some(clock) => {
            return Err(Rejection::DeadlineNotReached {
                deadline_at_ms: clock.deadline_at_ms(now_ms),
            });
        }
        None => match attempt.deadline_at_ms {
            Some(deadline_at_ms) if deadline_at_ms <= now_ms => {}
            deadline_at_ms => return Err(Rejection::DeadlineNotReached { deadline_at_ms }),
        },
    }
    let record = ResultRecord::of(attempt, topology, NodeOutcome::TimedOut, now_ms)
        .error(Some(DEADLINE_MESSAGE))
        .to_value();
    let result = NodeResult {
        outcome: NodeOutcome::TimedOut,
        record,
    };
    let mut tx = Tx::begin(agg, now_ms);
    let authority = if attempt.status == AttemptStatus::Waiting {
        settle_waiting_precheck(agg, attempt_id)?;
        run::take_control_in(&mut tx, control, ttl_ms)?
    } else {
        if !RunRecord::pair_holds_claim(agg.run.status, agg.run.queue) {
            return Err(run::illegal(Operation::FinishAttempt, &agg.run));
        }
        stop_runner_in(&mut tx, StopReason::NodeTimedOut);
        run::command_authority(&mut tx, host, control, ttl_ms)?
    };
    let dispatch = settle_attempt_in(&mut tx, topology, &authority, result, Onward::Park, None)?;
    run::dedup_stop(&mut tx.outputs);
    Ok((tx.commit(), dispatch))
}

/// The error message of a node that exceeded its deadline.
pub const DEADLINE_MESSAGE: &str = "the node exceeded its deadline";

/// A node-deadline wake fired: [`expire_node`] as a step. A deadline still
/// in the future, or another owner's live claim, defers the decision to
/// that time (the same `NodeDeadline` wake); a deadline that is gone (the
/// attempt finished or was replaced) is a rejection that changes nothing.
pub fn on_node_deadline(
    agg: &RunAggregate,
    topology: &Topology,
    host: Option<&Authority>,
    control: ClaimRequest,
    attempt_id: &AttemptId,
    now_ms: u64,
    ttl_ms: u64,
) -> Result<Step<RunAggregate>, Rejection> {
    let reason = WakeReason::NodeDeadline {
        attempt_id: attempt_id.clone(),
    };
    match expire_node(agg, topology, host, control, attempt_id, now_ms, ttl_ms) {
        Ok((transition, _)) => Ok(Step::Apply(transition)),
        Err(Rejection::DeadlineNotReached {
            deadline_at_ms: Some(at_ms),
        }) => Ok(Step::Defer { at_ms, reason }),
        Err(rejection) => Step::unless_claim_held(Err(rejection), reason),
    }
}

/// The control path acts only on the waiting attempt of an unpaused
/// `waiting/parked` run (paused time does not count and a paused request
/// accepts nothing).
fn settle_waiting_precheck(agg: &RunAggregate, attempt_id: &AttemptId) -> Result<(), Rejection> {
    let run = &agg.run;
    if (run.status, run.queue) != (RunStatus::Waiting, QueueStatus::Parked) {
        return Err(run::illegal(Operation::FinishAttempt, run));
    }
    if run.paused {
        return Err(Rejection::Paused);
    }
    current_attempt(agg, attempt_id, AttemptStatus::Waiting).map(|_| ())
}

fn current_attempt<'a>(
    agg: &'a RunAggregate,
    attempt_id: &AttemptId,
    status: AttemptStatus,
) -> Result<&'a AttemptRecord, Rejection> {
    agg.attempt
        .as_ref()
        .filter(|attempt| &attempt.attempt_id == attempt_id && attempt.status == status)
        .ok_or(Rejection::StaleAttempt)
}

fn known_node(topology: &Topology, node_id: &NodeId) -> Result<(), Rejection> {
    match topology.node(node_id) {
        Some(_) => Ok(()),
        None => Err(Rejection::UnknownNode {
            node_id: node_id.clone(),
        }),
    }
}

/// The record must name the attempt, node and outcome it is reported for.
fn check_record(
    record: &Value,
    attempt_id: &AttemptId,
    node_id: &NodeId,
    outcome: NodeOutcome,
) -> Result<(), Rejection> {
    let field = |name: &str| record.get(name).and_then(Value::as_str);
    let matches = field("attemptId") == Some(attempt_id.as_str())
        && field("nodeId") == Some(node_id.as_str())
        && field("outcome") == Some(outcome.as_str());
    if matches {
        Ok(())
    } else {
        Err(Rejection::ResultMismatch)
    }
}

/// Finishes the run's current (active or waiting) attempt with `result`,
/// records its step and applies the route. `failure` names why a failed
/// result failed (the control path's reason), for the run error.
fn settle_attempt_in(
    tx: &mut Tx,
    topology: &Topology,
    authority: &Authority,
    result: NodeResult,
    onward: Onward,
    failure: Option<ReasonKind>,
) -> Result<Dispatch, Rejection> {
    let attempt = tx
        .agg
        .attempt
        .clone()
        .expect("the caller checked the current attempt");
    known_node(topology, &attempt.node_id)?;
    check_record(
        &result.record,
        &attempt.attempt_id,
        &attempt.node_id,
        result.outcome,
    )?;
    // A protected checkpoint waits only with its pending decision, which
    // `finish_protected_checkpoint` opens before it settles the attempt.
    let protected = topology
        .node(&attempt.node_id)
        .is_some_and(|node| node.human_decision && node.node_type == NodeType::Checkpoint);
    let opened = tx.agg.decision.as_ref().is_some_and(|decision| {
        decision.node_id == attempt.node_id && decision.status == DecisionStatus::Pending
    });
    if protected && result.outcome == NodeOutcome::Ok && !opened {
        return Err(Rejection::ResultMismatch);
    }
    record_step_in(tx, result.outcome);
    settle_interaction_in(tx, &attempt.attempt_id, result.outcome);
    for effect in &mut tx.agg.effects {
        if effect.node_attempt_id.as_ref() == Some(&attempt.attempt_id) {
            *effect = effect::on_runner_lost(effect);
        }
    }
    let route = routing::route(topology, &attempt.node_id, result.outcome, &result.record);
    apply_route_in(
        tx,
        topology,
        authority,
        route,
        Some(attempt.node_id),
        onward,
        failure,
    )
}

fn record_step_in(tx: &mut Tx, outcome: NodeOutcome) {
    let now_ms = tx.now_ms();
    let attempt = tx
        .agg
        .attempt
        .as_mut()
        .expect("the caller checked the current attempt");
    attempt.status = AttemptStatus::Finished(outcome);
    attempt.finished_at_ms = Some(now_ms);
    let step = StepRecord {
        attempt_id: attempt.attempt_id.clone(),
        node_id: attempt.node_id.clone(),
        outcome,
        carried: false,
    };
    let (node_id, attempt_id) = (step.node_id.clone(), step.attempt_id.clone());
    tx.agg.steps.record(step);
    tx.event(if outcome == NodeOutcome::Ok {
        RunEvent::NodeFinished {
            node_id,
            attempt_id,
        }
    } else {
        RunEvent::NodeFailed {
            node_id,
            attempt_id,
        }
    });
}

/// A waiting attempt's pending interactive request settles with it, and its
/// pending step messages are cancelled.
fn settle_interaction_in(tx: &mut Tx, attempt_id: &AttemptId, outcome: NodeOutcome) {
    let Some(interaction) = tx.agg.interaction.as_mut().filter(|interaction| {
        interaction.status == InteractionStatus::Pending && &interaction.attempt_id == attempt_id
    }) else {
        return;
    };
    interaction.status = match outcome {
        NodeOutcome::Ok => InteractionStatus::Accepted,
        NodeOutcome::Failed => InteractionStatus::Failed,
        NodeOutcome::TimedOut => InteractionStatus::TimedOut,
        NodeOutcome::Cancelled => InteractionStatus::Cancelled,
    };
    let interaction_id = interaction.interaction_id.clone();
    for message in &mut tx.agg.messages {
        let is_step = matches!(&message.kind,
            MessageKind::Step { interaction_id: id, .. } if *id == interaction_id);
        if is_step && message.state == MessageState::Pending {
            message.state = MessageState::Cancelled;
        }
    }
    tx.publish_session();
}

/// Applies a route decided after `from` (or at the start of the run).
/// `node_failure` replaces `NodeFailed` as the reason when the route fails
/// the run for `from`'s failure.
fn apply_route_in(
    tx: &mut Tx,
    topology: &Topology,
    authority: &Authority,
    route: Route,
    from: Option<NodeId>,
    onward: Onward,
    node_failure: Option<ReasonKind>,
) -> Result<Dispatch, Rejection> {
    // The run's first route fixes what its step summary watches.
    tx.agg.steps.watch(topology);
    let terminal = match route {
        Route::Next(next) => match routing::check_step_limit(topology, &tx.agg.steps, &next) {
            Ok(()) => return continue_in(tx, authority, next, onward),
            Err(failure) => failed(failure, from, None),
        },
        Route::Wait { checkpoint } => {
            wait_again_in(tx, authority, checkpoint)?;
            return Ok(Dispatch::Exit {
                reason: ExitReason::Waiting,
            });
        }
        Route::Complete => Terminal::Completed,
        Route::Fail(failure) => failed(failure, from, node_failure),
        Route::TimedOut => Terminal::TimedOut {
            error: RunError {
                class: FailureClass::WorkerTimedOut,
                reason: ReasonKind::NodeTimedOut,
                node_id: from,
            },
        },
        Route::Cancelled => {
            for effect in &mut tx.agg.effects {
                *effect = effect::on_run_cancelled(effect);
            }
            Terminal::Cancelled
        }
    };
    let reason = match &terminal {
        Terminal::Completed => ExitReason::Completed,
        Terminal::Failed { .. } => ExitReason::Failed,
        Terminal::TimedOut { .. } => ExitReason::TimedOut,
        Terminal::Cancelled => ExitReason::Cancelled,
    };
    run::finish_in(tx, Some(authority), terminal)?;
    Ok(Dispatch::Exit { reason })
}

/// Routing failures are workflow failures (`nodeFailed`), told apart by
/// reason; a node's own failure carries `node_failure` when the control path
/// named why it failed.
const fn failed(
    failure: RouteFailure,
    node_id: Option<NodeId>,
    node_failure: Option<ReasonKind>,
) -> Terminal {
    let reason = match failure {
        RouteFailure::NodeFailed => match node_failure {
            Some(reason) => reason,
            None => ReasonKind::NodeFailed,
        },
        RouteFailure::Routing { .. } => ReasonKind::Routing,
        RouteFailure::MaxSteps { .. } => ReasonKind::MaxSteps,
    };
    Terminal::Failed {
        error: RunError {
            class: FailureClass::NodeFailed,
            reason,
            node_id,
        },
    }
}

fn continue_in(
    tx: &mut Tx,
    authority: &Authority,
    next: NodeId,
    onward: Onward,
) -> Result<Dispatch, Rejection> {
    match onward {
        Onward::Dispatch(attempt_id) => {
            let visit = tx.agg.steps.next_visit(&next);
            Ok(start_attempt_in(tx, next, attempt_id, visit, 0))
        }
        Onward::Park => {
            park_resume_ready_in(tx, authority)?;
            Ok(Dispatch::Exit {
                reason: ExitReason::Parked,
            })
        }
    }
}

fn start_attempt_in(
    tx: &mut Tx,
    node_id: NodeId,
    attempt_id: AttemptId,
    visit: u32,
    crash_retries: u32,
) -> Dispatch {
    debug_assert!(
        tx.agg
            .attempt
            .as_ref()
            .is_none_or(|attempt| !attempt.status.is_unfinished()),
        "a run has at most one unfinished attempt"
    );
    tx.agg.attempt = Some(AttemptRecord {
        attempt_id: attempt_id.clone(),
        node_id: node_id.clone(),
        visit,
        generation: tx.agg.run.lease.generation,
        status: AttemptStatus::Active,
        started_at_ms: tx.now_ms(),
        deadline_at_ms: None,
        finished_at_ms: None,
        crash_retries,
    });
    tx.event(RunEvent::NodeStarted {
        node_id: node_id.clone(),
        attempt_id: attempt_id.clone(),
    });
    Dispatch::RunNode {
        node_id,
        attempt_id,
        visit,
    }
}

/// An `ok` checkpoint: the run (re-)enters `waiting/parked` on it and gives
/// up its claim.
fn wait_again_in(tx: &mut Tx, authority: &Authority, checkpoint: NodeId) -> Result<(), Rejection> {
    let run = &tx.agg.run;
    if (run.status, run.queue) == (RunStatus::Running, QueueStatus::Running) {
        return run::wait_in(tx, authority, checkpoint, true);
    }
    release_in(tx, authority)?;
    tx.agg.run.waiting_on = Some(checkpoint.clone());
    tx.event(RunEvent::Waiting {
        node_id: checkpoint,
    });
    Ok(())
}

/// The route continues in the next generation: `running/parked` with
/// `resumeReady`, claim released, admission requested.
fn park_resume_ready_in(tx: &mut Tx, authority: &Authority) -> Result<(), Rejection> {
    let run = &tx.agg.run;
    if RunRecord::pair_holds_claim(run.status, run.queue) {
        run::park_in(tx, authority, ParkReason::ResumeReady)?;
    } else {
        release_in(tx, authority)?;
        let run = &mut tx.agg.run;
        run.status = RunStatus::Running;
        run.queue = QueueStatus::Parked;
        run.park_reason = Some(ParkReason::ResumeReady);
        run.waiting_on = None;
        tx.event(RunEvent::Parked {
            reason: ParkReason::ResumeReady,
        });
    }
    tx.output(Output::Schedule);
    Ok(())
}

fn release_in(tx: &mut Tx, authority: &Authority) -> Result<(), Rejection> {
    let lease = claim::release(&tx.agg.run.lease, authority, tx.now_ms())
        .map_err(|reason| Rejection::ClaimLost { reason })?;
    tx.agg.run.lease = lease;
    Ok(())
}

fn stop_runner_in(tx: &mut Tx, reason: StopReason) {
    if let Some(runner) = tx.agg.run.runner.clone().filter(RunnerRecord::is_live) {
        let run_id = tx.agg.run.run_id.clone();
        tx.output(Output::StopRunner {
            run_id,
            runner_epoch: runner.runner_epoch,
            reason,
        });
    }
}

#[cfg(test)]
mod tests;
