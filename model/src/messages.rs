//! Workflow messages: one origin session, one interactive run waiting on a
//! submitted-output request, and two Pi processes whose connections connect,
//! disconnect and replace each other (`session::connect`, `disconnect`,
//! coordinator epochs).
//!
//! The active coordinator asks for the next eligible message
//! (`session::offer`), Pi "sends" it (an entry appears on the active branch,
//! or is lost when Pi crashes first), the coordinator reports the branch
//! (`session::report_branch`: busy or idle, with or without the entry) and
//! model turns (`session::report_turn`: start, end completed / aborted /
//! error, duplicated and stale reports). The run-level follow-ups are applied
//! in the same step, as the shell does: `RunFollowUp::Pause` through
//! `interaction::pause_after_aborted_turn`, `RunFollowUp::Attempt(Fail)`
//! through `execution::finish_attempt` with `Actor::Control`. A client
//! resumes the paused run (`run::resume`); the agent submits
//! (`interaction::submit`), the validator accepts
//! (`interaction::validation_accepted`) and the control path finishes the
//! attempt (`execution::finish_attempt`). The user may change the branch
//! (entries disappear).
//!
//! When a transition ends the run, the model performs its
//! `BuildTerminalMessage` output as the shell does (`terminal::build`), and
//! the server may restart once after the run ended (`ServerRestart`, the
//! model's last step):
//! coordinator memory is gone, every running turn clock is suspended
//! (`session::suspend_clocks`) and the startup scan builds a missing
//! terminal message again. A
//! disconnect or crash of the active connection suspends the clocks too,
//! as the shell does when the connection closes.
//!
//! The durable facts are the run aggregate and the session's
//! `workflow_messages`, `workflow_turns` and `interactive_submissions` rows;
//! the coordinator facts are server memory; each Pi process has its own
//! memory (connection, queued message, running model turn).

use crate::harness::Summarize;
use crate::world::TTL;
use core::fmt;
use kernel::attempt::NodeOutcome;
use kernel::execution::{self, Actor, NodeResult};
use kernel::fixtures;
use kernel::ids::{
    AttemptId, ConnectionId, CoordinatorEpoch, Digest, EntryId, IdempotencyKey, InteractionId,
    MessageId, SubmissionId, TurnId,
};
use kernel::interaction::{
    self, AttemptFollowUp, InteractionKind, InteractionStatus, NewSubmission, SubmissionOutcome,
    SubmissionRecord, Submitted,
};
use kernel::message::{
    MessageKind, MessageRecord, MessageState, StepReason, TurnRecord, TurnState,
};
use kernel::output::{Output, Transition};
use kernel::run::{self, ReasonKind, RunAggregate, RunStatus};
use kernel::session::{
    self, BranchReport, CoordinatorFacts, RunFollowUp, SessionFacts, SessionRun, StopReason,
    TurnPhase, TurnReport,
};
use kernel::terminal;
use kernel::topology::Topology;
use serde_json::Value;
use stateright::{Model, Property};

/// The instant of every step (this model has no deadlines).
const NOW: u64 = 100;

/// The kernel's rules, or the kernel with one check dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageRules {
    Kernel,
    /// Branch and turn reports are accepted from any connection (no epoch check).
    NoCoordinatorEpochCheck,
    /// An offer is made to any connection, not only the active epoch.
    OldEpochStillOffered,
    /// An offer does not wait for the epoch's branch report.
    SendWithoutBranchReport,
    /// The unproductive-turn rule creates a reminder without the
    /// one-pending-step guard (the pending step is not seen).
    ReminderWithoutGuard,
    /// A sent message absent from an idle branch returns to pending.
    SentReturnsToPending,
    /// A turn-end report is matched to its message's open turn, not to its turn id.
    StaleTurnClearsNewer,
    /// The unproductive-turn limit is compared one end late.
    CounterPastLimit,
    /// Ending the run leaves its open turns open.
    TerminalKeepsTurns,
    /// `session::connect` forgets fenced connections: a fenced connection's
    /// next session-view read takes the epoch back.
    FencedRetakesEpoch,
    /// A closed coordinator connection leaves its session's turn clocks
    /// running (`session::suspend_clocks` is not applied).
    DisconnectKeepsClock,
    /// The terminal message is not keyed by its run: the builder does not
    /// find the stored one and makes another under a fresh id.
    TerminalMessageNotRunKeyed,
}

/// Which half of the behaviour a configuration explores. Both run the same
/// `next_state`; they differ in the environment's budgets and in the
/// properties they check, so that each stays small enough for CI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Focus {
    /// Two Pi processes: connect, disconnect, replacement, send, crash after
    /// send, busy and idle branch reports, branch changes (one model turn).
    Delivery,
    /// One Pi process: model turns, duplicated and stale reports, reminders,
    /// the unproductive-turn limit, aborted turns, resume, submission.
    Turns,
}

/// The bounded configuration.
#[derive(Clone, Debug)]
pub struct MessagesModel {
    pub focus: Focus,
    /// Pi processes (1 or 2).
    pub pis: u8,
    /// Connections made (by either Pi process).
    pub max_connects: u8,
    pub max_disconnects: u8,
    /// Session-view reads (`sessionView.get {coordinate: true}`, the
    /// extension's poll) on a connection that already has an epoch.
    pub max_rereads: u8,
    /// Pi crashes (with a send or without).
    pub max_crashes: u8,
    /// Model turns Pi starts (a send starts one; input may start more).
    pub max_turns: u8,
    /// Repeated turn-end reports (duplicates and stale ids).
    pub max_repeats: u8,
    /// Branch changes that drop the newest entry.
    pub max_branch_changes: u8,
    pub max_resumes: u8,
    pub max_submissions: u8,
    /// Server restarts.
    pub max_restarts: u8,
    pub rules: MessageRules,
}

impl MessagesModel {
    /// The CI configuration of `focus`.
    pub fn ci(focus: Focus, rules: MessageRules) -> Self {
        match focus {
            Focus::Delivery => Self {
                focus,
                pis: 2,
                max_connects: 3,
                max_disconnects: 1,
                max_rereads: 1,
                max_crashes: 1,
                max_turns: 2,
                max_repeats: 0,
                max_branch_changes: 1,
                max_resumes: 0,
                max_submissions: 0,
                max_restarts: 0,
                rules,
            },
            Focus::Turns => Self {
                focus,
                pis: 1,
                max_connects: 2,
                max_disconnects: 1,
                max_rereads: 0,
                max_crashes: 0,
                max_turns: 3,
                max_repeats: 1,
                max_branch_changes: 1,
                max_resumes: 1,
                max_submissions: 1,
                max_restarts: 1,
                rules,
            },
        }
    }

    /// Larger bounds, for local runs.
    pub fn deep(focus: Focus, rules: MessageRules) -> Self {
        let ci = Self::ci(focus, rules);
        match focus {
            Focus::Delivery => Self {
                max_connects: 4,
                max_disconnects: 2,
                max_repeats: 1,
                ..ci
            },
            Focus::Turns => Self { max_turns: 4, ..ci },
        }
    }

    /// A one-line description of the bounds.
    pub fn bounds(&self) -> String {
        format!(
            "1 session, 1 interactive run, {} Pi process(es), connects<={}, disconnects<={}, re-reads<={}, Pi crashes<={}, turns<={}, repeated end reports<={}, branch changes<={}, resumes<={}, submissions<={}, server restarts<={}",
            self.pis,
            self.max_connects,
            self.max_disconnects,
            self.max_rereads,
            self.max_crashes,
            self.max_turns,
            self.max_repeats,
            self.max_branch_changes,
            self.max_resumes,
            self.max_submissions,
            self.max_restarts
        )
    }
}

/// A model turn Pi runs (process memory).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PiTurn {
    pub turn: u8,
    pub message: MessageId,
    /// `None` while the turn runs.
    pub ended: Option<StopReason>,
    pub start_reported: bool,
    pub end_reported: bool,
}

/// One Pi process and its extension (process memory).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pi {
    pub alive: bool,
    /// The coordinator epoch this connection was given.
    pub epoch: Option<CoordinatorEpoch>,
    /// The message the server offered and the coordinator queued.
    pub queued: Option<MessageId>,
    /// The current model turn (running, or ended and not yet reported).
    pub turn: Option<PiTurn>,
    /// The last turn whose end this Pi reported (it may report it again).
    pub last_ended: Option<PiTurn>,
}

impl Pi {
    fn busy(&self) -> bool {
        self.turn.as_ref().is_some_and(|t| t.ended.is_none())
    }
}

/// Oracle verdicts and witnesses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Oracle {
    pub stale_accepted: bool,
    pub stale_offered: bool,
    pub two_pending_steps: bool,
    pub sent_to_pending: bool,
    pub sent_without_evidence: bool,
    pub offered_while_shown: bool,
    pub stale_cleared_newer: bool,
    pub counter_wrong: bool,
    pub projections_disagree: bool,
    pub fenced_retook_epoch: bool,
    /// A pending request's clock runs without an open step turn from an
    /// active coordinator on an unpaused run.
    pub clock_outside_turn: bool,
    /// A run has two terminal messages, or one it may not have.
    pub terminal_wrong: bool,
    // Witnesses.
    pub clock_ran: bool,
    pub clock_suspended: bool,
    pub terminal_turn: bool,
    pub adopted_after_crash: bool,
    pub reminder_created: bool,
    pub aborted_paused: bool,
    pub resumed_presented: bool,
    pub fenced: bool,
    pub limit_failed: bool,
}

/// The model state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MessagesState {
    /// The run (its messages and turns live in the tables below).
    pub agg: RunAggregate,
    /// `workflow_messages` rows of the session, in order.
    pub messages: Vec<MessageRecord>,
    /// `workflow_turns` rows.
    pub turns: Vec<TurnRecord>,
    pub submissions: Vec<SubmissionRecord>,
    /// Server memory.
    pub coordinator: CoordinatorFacts,
    /// Pi's active branch (the session file): workflow entries on it.
    pub branch: Vec<(MessageId, EntryId)>,
    pub pis: [Pi; 2],
    pub connects: u8,
    pub disconnects: u8,
    pub rereads: u8,
    pub crashes: u8,
    pub turns_started: u8,
    pub repeats: u8,
    pub branch_changes: u8,
    pub resumes: u8,
    pub submitted: u8,
    pub restarts: u8,
    pub oracle: Oracle,
}

/// One environment step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessagesAction {
    Connect(u8),
    Disconnect(u8),
    /// The connection reads the session view again to coordinate (its poll).
    Reread(u8),
    /// Pi crashes; a pending send, if any, is persisted or lost.
    Crash(u8),
    ReportBranch(u8),
    Offer(u8),
    Send(u8),
    /// Pi sends and crashes before the branch report; the entry may be lost.
    SendThenCrash {
        pi: u8,
        persisted: bool,
    },
    /// Pi starts another model turn (user input) on the session view's open message.
    NewTurn(u8),
    ReportTurnStart(u8),
    EndTurn(u8, StopReason),
    ReportTurnEnd(u8),
    /// The end report of the Pi's last turn arrives again (duplicate or stale).
    RepeatTurnEnd(u8),
    BranchChange,
    Resume,
    Submit(u8),
    ValidationAccepted,
    /// The server stops and starts again: connections and epochs are gone,
    /// running clocks are suspended, missing terminal messages are built.
    ServerRestart,
}

impl fmt::Display for MessagesAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pi = |p: &u8| format!("Pi-{}", p + 1);
        match self {
            Self::Connect(p) => write!(f, "{} connects: session::connect", pi(p)),
            Self::Disconnect(p) => write!(f, "{} disconnects: session::disconnect", pi(p)),
            Self::Reread(p) => write!(
                f,
                "{} reads the session view again: session::connect",
                pi(p)
            ),
            Self::Crash(p) => write!(f, "{} crashes", pi(p)),
            Self::ReportBranch(p) => write!(f, "{}: session::report_branch", pi(p)),
            Self::Offer(p) => write!(f, "{}: session::offer", pi(p)),
            Self::Send(p) => write!(
                f,
                "{} sends its queued message (entry on the branch, turn starts)",
                pi(p)
            ),
            Self::SendThenCrash { pi: p, persisted } => write!(
                f,
                "{} sends and crashes before the branch report (entry {})",
                pi(p),
                if *persisted { "persisted" } else { "lost" }
            ),
            Self::NewTurn(p) => write!(f, "{} starts another model turn", pi(p)),
            Self::ReportTurnStart(p) => write!(f, "{}: session::report_turn(start)", pi(p)),
            Self::EndTurn(p, reason) => write!(f, "{}'s model turn ends ({reason:?})", pi(p)),
            Self::ReportTurnEnd(p) => {
                write!(f, "{}: session::report_turn(end) + run follow-ups", pi(p))
            }
            Self::RepeatTurnEnd(p) => write!(
                f,
                "{}: session::report_turn(end) of its last turn again",
                pi(p)
            ),
            Self::BranchChange => write!(f, "the user changes the branch (newest entry gone)"),
            Self::Resume => write!(f, "client: run::resume"),
            Self::Submit(p) => write!(f, "{}'s agent: interaction::submit", pi(p)),
            Self::ValidationAccepted => write!(
                f,
                "validator: interaction::validation_accepted + execution::finish_attempt(Control)"
            ),
            Self::ServerRestart => write!(
                f,
                "the server restarts: session::suspend_clocks + terminal::build for a missing message"
            ),
        }
    }
}

fn connection(p: u8) -> ConnectionId {
    ConnectionId::new(format!("c-{}", p + 1))
}

fn turn_id(turn: u8) -> TurnId {
    TurnId::new(format!("t-{turn}"))
}

fn entry(message: &MessageId) -> EntryId {
    EntryId::new(format!("e-{message}"))
}

fn topology() -> Topology {
    fixtures::chain(&["ask"])
}

fn is_step(message: &MessageRecord) -> bool {
    matches!(message.kind, MessageKind::Step { .. })
}

impl MessagesModel {
    /// The session facts the shell loads: the whole (small) session window.
    fn session(state: &MessagesState) -> SessionFacts {
        let agg = &state.agg;
        SessionFacts {
            session_id: kernel::ids::SessionId::from("s-1"),
            messages: state.messages.clone(),
            turns: state.turns.clone(),
            runs: vec![SessionRun {
                run_id: agg.run.run_id.clone(),
                status: agg.run.status,
                paused: agg.run.paused,
                interaction: agg.interaction.clone(),
                submissions: state.submissions.clone(),
                decision: agg.decision.clone(),
            }],
            next_message_order: state.messages.iter().map(|m| m.order).max().unwrap_or(0) + 1,
        }
    }

    fn new_ids(state: &MessagesState) -> Vec<MessageId> {
        let next = state.messages.iter().map(|m| m.order).max().unwrap_or(0) + 1;
        (next..next + 3)
            .map(|order| MessageId::new(format!("m-{order}")))
            .collect()
    }

    /// The run aggregate the shell loads: pending messages and open turns included.
    fn loaded(state: &MessagesState) -> RunAggregate {
        let mut agg = state.agg.clone();
        agg.messages = state
            .messages
            .iter()
            .filter(|m| m.state == MessageState::Pending)
            .cloned()
            .collect();
        agg.turns = state
            .turns
            .iter()
            .filter(|t| t.state == TurnState::Open)
            .cloned()
            .collect();
        agg
    }

    /// Writes a committed run transition back to the tables.
    fn commit_run(
        &self,
        state: &MessagesState,
        next: &mut MessagesState,
        transition: Transition<RunAggregate>,
    ) {
        let build_terminal = transition
            .outputs
            .iter()
            .any(|output| matches!(output, Output::BuildTerminalMessage { .. }));
        let mut facts = transition.facts;
        if self.rules == MessageRules::TerminalKeepsTurns && facts.run.status.is_terminal() {
            // Planted bug: the terminal cleanup leaves open turns open.
            for turn in &mut facts.turns {
                if let Some(before) = state.turns.iter().find(|t| t.turn_id == turn.turn_id) {
                    *turn = before.clone();
                }
            }
        }
        for message in &facts.messages {
            match next
                .messages
                .iter_mut()
                .find(|m| m.message_id == message.message_id)
            {
                Some(row) => *row = message.clone(),
                None => next.messages.push(message.clone()),
            }
        }
        for turn in &facts.turns {
            match next.turns.iter_mut().find(|t| t.turn_id == turn.turn_id) {
                Some(row) => *row = turn.clone(),
                None => next.turns.push(turn.clone()),
            }
        }
        let mut agg = facts.reload();
        agg.messages.clear();
        agg.turns.clear();
        next.agg = agg;
        if build_terminal {
            // Performed after the commit, as the shell does.
            self.build_terminal(next);
        }
    }

    /// `terminal::build` for the run, over the stored messages (the shell's
    /// `terminal_messages::build`, after the terminal commit and at startup).
    fn build_terminal(&self, next: &mut MessagesState) {
        let run = &next.agg.run;
        let message_id = terminal::message_id(&run.run_id);
        let existing = next
            .messages
            .iter()
            .find(|m| m.message_id == message_id)
            .filter(|_| self.rules != MessageRules::TerminalMessageNotRunKeyed)
            .cloned();
        let facts = terminal::TerminalFacts {
            workflow_name: "ask",
            workflow_ref: "ask.workflow.ts",
            definition_digest: "sha256:ask",
            input_json: "{}",
            output_json: None,
            error_message: None,
            fingerprint: Digest::repeat(0),
            restarts: &[],
            earlier: &[],
        };
        let order = next.messages.iter().map(|m| m.order).max().unwrap_or(0) + 1;
        if let Ok(built) = terminal::build(run, &facts, existing.as_ref(), order, NOW) {
            let mut message = built.facts.message;
            if self.rules == MessageRules::TerminalMessageNotRunKeyed {
                // Planted bug: a fresh id, as other messages get.
                message.message_id = MessageId::new(format!("m-{order}"));
            }
            next.messages.push(message);
        }
    }

    /// The shell after the active coordinator's connection closed (or the
    /// server stopped): `session::suspend_clocks`.
    fn suspend_clocks(&self, next: &mut MessagesState) {
        if self.rules == MessageRules::DisconnectKeepsClock {
            // Planted bug: the clocks keep running.
            return;
        }
        let running = next
            .agg
            .interaction
            .as_ref()
            .is_some_and(|i| i.clock.is_running());
        if let Some(transition) =
            session::suspend_clocks(&Self::session(next), &next.coordinator, NOW)
        {
            next.oracle.clock_suspended |= running;
            Self::commit_session(next, transition.facts);
        }
    }

    /// Writes committed session facts back (messages, turns, the request row).
    fn commit_session(next: &mut MessagesState, facts: SessionFacts) {
        next.messages = facts.messages;
        next.turns = facts.turns;
        let interaction = facts
            .runs
            .into_iter()
            .next()
            .and_then(|run| run.interaction);
        if let (Some(row), Some(new)) = (next.agg.interaction.as_mut(), interaction) {
            *row = new;
        }
    }

    /// Applies the session's run follow-ups in the same step; `None` if the
    /// run refuses one (the whole transaction rolls back).
    fn follow_ups(&self, next: &mut MessagesState, follow_ups: &[RunFollowUp]) -> Option<()> {
        for follow_up in follow_ups {
            let agg = Self::loaded(next);
            let transition = match follow_up {
                RunFollowUp::Pause { .. } => {
                    next.oracle.aborted_paused = true;
                    interaction::pause_after_aborted_turn(&agg, NOW).ok()?
                }
                RunFollowUp::Attempt {
                    follow_up:
                        AttemptFollowUp::Fail {
                            attempt_id, reason, ..
                        },
                } => {
                    let transition =
                        Self::finish_control(&agg, attempt_id, NodeOutcome::Failed, Some(*reason))?;
                    // The witness needs the run error to say why it failed.
                    next.oracle.limit_failed |= transition
                        .facts
                        .run
                        .error
                        .as_ref()
                        .is_some_and(|e| e.reason == ReasonKind::UnproductiveTurns);
                    transition
                }
                RunFollowUp::Attempt {
                    follow_up: AttemptFollowUp::FinishOk { attempt_id, .. },
                } => Self::finish_control(&agg, attempt_id, NodeOutcome::Ok, None)?,
            };
            let before = next.clone();
            self.commit_run(&before, next, transition);
        }
        Some(())
    }

    fn finish_control(
        agg: &RunAggregate,
        attempt_id: &AttemptId,
        outcome: NodeOutcome,
        failure: Option<ReasonKind>,
    ) -> Option<Transition<RunAggregate>> {
        let result = NodeResult {
            outcome,
            record: fixtures::result_record(attempt_id.as_str(), "ask", outcome, Value::Null),
        };
        execution::finish_attempt(
            agg,
            &topology(),
            Actor::Control {
                request: fixtures::control_request(),
                failure,
            },
            attempt_id,
            result,
            AttemptId::from("unused"),
            NOW,
            TTL,
        )
        .ok()
        .map(|(transition, _)| transition)
    }

    /// The coordinator a call is checked against: the server's, or (planted
    /// bug) one in which the caller is the active epoch.
    fn coordinator_for(&self, state: &MessagesState, p: u8, bypass: bool) -> CoordinatorFacts {
        let mut coordinator = state.coordinator.clone();
        let pi = &state.pis[p as usize];
        if bypass
            && let Some(epoch) = pi.epoch
            && coordinator.active.as_ref().is_none_or(|a| a.epoch != epoch)
        {
            coordinator.active = Some(session::ActiveCoordinator {
                connection_id: connection(p),
                epoch,
                branch_reported: true,
                offered: None,
            });
        }
        coordinator
    }

    /// Whether `p` holds the newest epoch issued and it is active.
    fn is_active(state: &MessagesState, p: u8) -> bool {
        let pi = &state.pis[p as usize];
        pi.epoch.is_some_and(|epoch| {
            session::check(&state.coordinator, &connection(p), epoch).is_ok()
                && epoch == state.coordinator.last_epoch
        })
    }

    fn report_branch(&self, state: &MessagesState, next: &mut MessagesState, p: u8) -> Option<()> {
        let pi = &state.pis[p as usize];
        let epoch = pi.epoch?;
        let bypass = self.rules == MessageRules::NoCoordinatorEpochCheck;
        let coordinator = self.coordinator_for(state, p, bypass);
        let running = pi.turn.as_ref().filter(|t| t.ended.is_none());
        let report = BranchReport {
            entries: state.branch.clone(),
            is_idle: running.is_none(),
            has_pending_messages: false,
            active_message: running.map(|t| t.message.clone()),
        };
        let facts = Self::session(state);
        let reported = match session::report_branch(
            &facts,
            &coordinator,
            &connection(p),
            epoch,
            &report,
            &Self::new_ids(state),
            NOW,
        ) {
            Ok(reported) => reported,
            Err(_) => {
                next.oracle.fenced |= state.coordinator.last_epoch > epoch;
                return (*next != *state).then_some(());
            }
        };
        if !Self::is_active(state, p) {
            next.oracle.stale_accepted = true;
        }
        if !bypass || Self::is_active(state, p) {
            next.coordinator = reported.coordinator;
        }
        if let Some(transition) = reported.session {
            let mut facts = transition.facts;
            if self.rules == MessageRules::SentReturnsToPending && report.proves_absence() {
                // Planted bug: a sent message absent from an idle branch is pending again.
                for message in &mut facts.messages {
                    if message.state == MessageState::Sent
                        && !report
                            .entries
                            .iter()
                            .any(|(id, _)| *id == message.message_id)
                    {
                        message.state = MessageState::Pending;
                    }
                }
            }
            for message in &facts.messages {
                let before = state
                    .messages
                    .iter()
                    .find(|m| m.message_id == message.message_id);
                if before.is_some_and(|b| b.state == MessageState::Pending)
                    && message.state == MessageState::Sent
                    && state.crashes > 0
                {
                    next.oracle.adopted_after_crash = true;
                }
            }
            Self::commit_session(next, facts);
        }
        // The coordinator forgets its queued message once the branch shows it.
        let queued = &mut next.pis[p as usize].queued;
        if queued
            .as_ref()
            .is_some_and(|q| state.branch.iter().any(|(id, _)| id == q))
        {
            *queued = None;
        }
        self.follow_ups(next, &reported.follow_ups)
    }

    /// Planted bug `ReminderWithoutGuard`: the turn report does not see the
    /// pending step messages, so the unproductive-turn rule creates a
    /// reminder even when a step message is already pending.
    fn hide_pending_steps(&self, facts: &mut SessionFacts) -> Vec<MessageRecord> {
        if self.rules != MessageRules::ReminderWithoutGuard {
            return Vec::new();
        }
        let hidden: Vec<MessageRecord> = facts
            .messages
            .iter()
            .filter(|m| m.state == MessageState::Pending && is_step(m))
            .cloned()
            .collect();
        facts
            .messages
            .retain(|m| !(m.state == MessageState::Pending && is_step(m)));
        hidden
    }

    fn unhide(facts: &mut SessionFacts, hidden: Vec<MessageRecord>) {
        for message in hidden {
            if !facts
                .messages
                .iter()
                .any(|m| m.message_id == message.message_id)
            {
                facts.messages.push(message);
            }
        }
        facts.messages.sort_by_key(|m| m.order);
    }

    fn report_turn(
        &self,
        state: &MessagesState,
        next: &mut MessagesState,
        p: u8,
        turn: &PiTurn,
        phase: TurnPhase,
    ) -> Option<()> {
        let pi = &state.pis[p as usize];
        let epoch = pi.epoch?;
        let bypass = self.rules == MessageRules::NoCoordinatorEpochCheck;
        let coordinator = self.coordinator_for(state, p, bypass);
        let mut report = TurnReport {
            message_id: turn.message.clone(),
            run_id: state.agg.run.run_id.clone(),
            turn_id: turn_id(turn.turn),
            phase,
        };
        if self.rules == MessageRules::StaleTurnClearsNewer
            && matches!(report.phase, TurnPhase::End { .. })
            && let Some(open) = state.turns.iter().find(|t| {
                t.state == TurnState::Open
                    && t.message_id == turn.message
                    && t.turn_id != report.turn_id
            })
            && state
                .turns
                .iter()
                .any(|t| t.turn_id == report.turn_id && t.state != TurnState::Open)
        {
            // Planted bug: the end is matched to the message's open turn.
            report.turn_id = open.turn_id.clone();
        }
        let mut facts = Self::session(state);
        if self.rules == MessageRules::CounterPastLimit
            && let Some(interaction) = facts.runs[0].interaction.as_mut()
            && interaction.unproductive_turn_ends >= 2
        {
            // Planted bug: the limit is compared one end late.
            interaction.unproductive_turn_ends -= 1;
        }
        let hidden = self.hide_pending_steps(&mut facts);
        let reported = match session::report_turn(
            &facts,
            &coordinator,
            &connection(p),
            epoch,
            &report,
            &Self::new_ids(state),
            NOW,
        ) {
            Ok(reported) => reported,
            Err(_) => {
                next.oracle.fenced |= state.coordinator.last_epoch > epoch;
                return (*next != *state).then_some(());
            }
        };
        if !Self::is_active(state, p) {
            next.oracle.stale_accepted = true;
        }
        if let Some(transition) = reported.session {
            let mut facts = transition.facts;
            Self::unhide(&mut facts, hidden);
            if self.rules == MessageRules::CounterPastLimit
                && let (Some(new), Some(old)) = (
                    facts.runs[0].interaction.as_mut(),
                    state.agg.interaction.as_ref(),
                )
                && old.unproductive_turn_ends >= 2
            {
                new.unproductive_turn_ends += 1;
            }
            Self::commit_session(next, facts);
        }
        // A stale end report never ends a newer open turn.
        let reported_turn = turn_id(turn.turn);
        if matches!(report.phase, TurnPhase::End { .. }) {
            for before in state.turns.iter().filter(|t| t.state == TurnState::Open) {
                let after = next.turns.iter().find(|t| t.turn_id == before.turn_id);
                let newer = before.turn_id.as_str() > reported_turn.as_str();
                if newer && after.is_some_and(|t| t.state != TurnState::Open) {
                    next.oracle.stale_cleared_newer = true;
                }
            }
        }
        self.follow_ups(next, &reported.follow_ups)
    }

    fn check_step(&self, state: &MessagesState, next: &mut MessagesState, action: MessagesAction) {
        let interaction_id = InteractionId::from("i-1");
        let steps: Vec<&MessageRecord> = next
            .messages
            .iter()
            .filter(|m| m.state == MessageState::Pending && is_step(m))
            .collect();
        let reminders = steps
            .iter()
            .filter(|m| {
                matches!(
                    m.kind,
                    MessageKind::Step {
                        reason: StepReason::Reminder,
                        ..
                    }
                )
            })
            .count();
        if steps.len() > 1 || reminders > 1 {
            next.oracle.two_pending_steps = true;
        }
        for message in &next.messages {
            let before = state
                .messages
                .iter()
                .find(|m| m.message_id == message.message_id);
            if before.is_some_and(|b| b.state == MessageState::Sent)
                && message.state == MessageState::Pending
            {
                next.oracle.sent_to_pending = true;
            }
            let shown = state.branch.iter().any(|(id, _)| *id == message.message_id);
            let newly_sent = message.state == MessageState::Sent
                && before.is_none_or(|b| b.state != MessageState::Sent);
            if newly_sent && !(matches!(action, MessagesAction::ReportBranch(_)) && shown) {
                next.oracle.sent_without_evidence = true;
            }
            if before.is_none()
                && matches!(
                    message.kind,
                    MessageKind::Step {
                        reason: StepReason::Reminder,
                        ..
                    }
                )
            {
                next.oracle.reminder_created = true;
            }
            if before.is_none()
                && matches!(
                    message.kind,
                    MessageKind::Step {
                        reason: StepReason::Resumed,
                        ..
                    }
                )
                && matches!(action, MessagesAction::Resume)
            {
                next.oracle.resumed_presented = true;
            }
        }
        // The counter: at most 3, reaching 3 fails the attempt, and it moves
        // only on an eligible end.
        let count = |s: &MessagesState| {
            s.agg
                .interaction
                .as_ref()
                .filter(|i| i.interaction_id == interaction_id)
                .map_or(0, |i| i.unproductive_turn_ends)
        };
        let pending = next
            .agg
            .interaction
            .as_ref()
            .is_some_and(|i| i.status == InteractionStatus::Pending);
        let settling = state.submissions.iter().any(|s| {
            matches!(
                s.outcome,
                SubmissionOutcome::Accepted | SubmissionOutcome::Validating
            )
        });
        let aborted_end = match action {
            MessagesAction::ReportTurnEnd(p) => state.pis[p as usize].turn.as_ref(),
            MessagesAction::RepeatTurnEnd(p) => state.pis[p as usize].last_ended.as_ref(),
            _ => None,
        }
        .is_some_and(|t| t.ended == Some(StopReason::Aborted));
        let eligible = state
            .agg
            .interaction
            .as_ref()
            .is_some_and(|i| i.status == InteractionStatus::Pending)
            && !state.agg.run.paused
            && !settling
            && !aborted_end;
        let limit = session::MAX_REMINDERS + 1;
        if count(next) > limit
            || (count(next) >= limit && pending)
            || (count(next) > count(state) && !eligible)
        {
            next.oracle.counter_wrong = true;
        }
        // Message projections agree with the run.
        let run = &next.agg.run;
        let pending_step = next.messages.iter().any(|m| {
            m.state == MessageState::Pending
                && matches!(
                    m.kind,
                    MessageKind::Step { .. } | MessageKind::Decision { .. }
                )
        });
        // A terminal message's turn stays open after the run ended.
        let open_turn = next.turns.iter().any(|t| {
            t.state == TurnState::Open
                && next
                    .messages
                    .iter()
                    .any(|m| m.message_id == t.message_id && m.kind != MessageKind::Terminal)
        });
        let waiting = next
            .agg
            .interaction
            .as_ref()
            .is_some_and(|i| i.status == InteractionStatus::Pending);
        if (run.status.is_terminal() && (pending_step || open_turn))
            || (run.paused && pending_step)
            || (waiting != (run.status == RunStatus::Waiting))
        {
            next.oracle.projections_disagree = true;
        }
        // The turn clock runs only in a reported step turn of the active
        // coordinator, on an unpaused run.
        let clock_running = next
            .agg
            .interaction
            .as_ref()
            .is_some_and(|i| i.status == InteractionStatus::Pending && i.clock.is_running());
        let step_turn_open = next.turns.iter().any(|t| {
            t.state == TurnState::Open
                && next
                    .messages
                    .iter()
                    .any(|m| m.message_id == t.message_id && is_step(m))
        });
        if clock_running {
            next.oracle.clock_ran = true;
            if next.coordinator.active.is_none() || !step_turn_open || run.paused {
                next.oracle.clock_outside_turn = true;
            }
        }
        // One terminal message, and only for the ended run.
        let terminal: Vec<&MessageRecord> = next
            .messages
            .iter()
            .filter(|m| m.kind == MessageKind::Terminal)
            .collect();
        if terminal.len() > 1 || (!terminal.is_empty() && !run.status.is_terminal()) {
            next.oracle.terminal_wrong = true;
        }
        if next
            .turns
            .iter()
            .any(|t| terminal.iter().any(|m| m.message_id == t.message_id))
        {
            next.oracle.terminal_turn = true;
        }
    }
}

impl Model for MessagesModel {
    type State = MessagesState;
    type Action = MessagesAction;

    fn init_states(&self) -> Vec<MessagesState> {
        let mut agg = fixtures::waiting_on_request(1, InteractionKind::SubmittedOutput);
        if let Some(record) = agg.interaction.as_mut() {
            record.clock = interaction::TurnClock::new(Some(60_000));
        }
        let messages = core::mem::take(&mut agg.messages);
        let pi = Pi {
            alive: true,
            epoch: None,
            queued: None,
            turn: None,
            last_ended: None,
        };
        vec![MessagesState {
            agg,
            messages,
            turns: Vec::new(),
            submissions: Vec::new(),
            coordinator: CoordinatorFacts::new(kernel::ids::SessionId::from("s-1")),
            branch: Vec::new(),
            pis: [pi.clone(), pi],
            connects: 0,
            disconnects: 0,
            rereads: 0,
            crashes: 0,
            turns_started: 0,
            repeats: 0,
            branch_changes: 0,
            resumes: 0,
            submitted: 0,
            restarts: 0,
            oracle: Oracle::default(),
        }]
    }

    fn actions(&self, state: &MessagesState, out: &mut Vec<MessagesAction>) {
        use MessagesAction as A;
        if state.restarts > 0 {
            // The restart is the last step: what follows it (fresh
            // connections to a session with no coordinator) is what the
            // model explores from its initial state.
            return;
        }
        for p in 0..self.pis {
            let pi = &state.pis[p as usize];
            if !pi.alive {
                continue;
            }
            match pi.epoch {
                None => {
                    if state.connects < self.max_connects {
                        out.push(A::Connect(p));
                    }
                }
                Some(_) => {
                    if state.disconnects < self.max_disconnects {
                        out.push(A::Disconnect(p));
                    }
                    // A fenced connection reads the view again while another
                    // connection is active (the active one's read changes
                    // nothing). Under the kernel's rules the read changes
                    // nothing either, so it adds no state.
                    if state.rereads < self.max_rereads
                        && state.coordinator.active.is_some()
                        && session::epoch_of(&state.coordinator, &connection(p)).is_none()
                    {
                        out.push(A::Reread(p));
                    }
                    out.push(A::ReportBranch(p));
                    if pi.queued.is_none() && !pi.busy() {
                        out.push(A::Offer(p));
                    }
                    if pi.queued.is_some() && !pi.busy() && state.turns_started < self.max_turns {
                        out.push(A::Send(p));
                        if state.crashes < self.max_crashes {
                            out.push(A::SendThenCrash {
                                pi: p,
                                persisted: true,
                            });
                            out.push(A::SendThenCrash {
                                pi: p,
                                persisted: false,
                            });
                        }
                    }
                    if pi.last_ended.is_some() && state.repeats < self.max_repeats {
                        out.push(A::RepeatTurnEnd(p));
                    }
                    if let Some(turn) = &pi.turn {
                        if !turn.start_reported && pi.queued.is_none() {
                            out.push(A::ReportTurnStart(p));
                        }
                        if turn.ended.is_some() && turn.start_reported && !turn.end_reported {
                            out.push(A::ReportTurnEnd(p));
                        }
                        if turn.ended.is_none()
                            && turn.start_reported
                            && state.submitted < self.max_submissions
                        {
                            out.push(A::Submit(p));
                        }
                    }
                }
            }
            if pi.busy() {
                for reason in [
                    StopReason::Completed,
                    StopReason::Aborted,
                    StopReason::Error,
                ] {
                    out.push(A::EndTurn(p, reason));
                }
            } else if state.turns_started < self.max_turns
                && pi.queued.is_none()
                && pi.turn.as_ref().is_none_or(|t| !t.start_reported)
            {
                out.push(A::NewTurn(p));
            }
            if state.crashes < self.max_crashes {
                out.push(A::Crash(p));
            }
        }
        if state.branch_changes < self.max_branch_changes && !state.branch.is_empty() {
            out.push(A::BranchChange);
        }
        if state.resumes < self.max_resumes && state.agg.run.paused {
            out.push(A::Resume);
        }
        if state
            .submissions
            .iter()
            .any(|s| s.outcome == SubmissionOutcome::Validating)
        {
            out.push(A::ValidationAccepted);
        }
        // The server restarts once the run ended: the startup scan is what
        // a restart adds to this model (a disconnect already suspends
        // running clocks the way a restart does).
        if state.restarts < self.max_restarts && state.agg.run.status.is_terminal() {
            out.push(A::ServerRestart);
        }
    }

    fn next_state(&self, state: &MessagesState, action: MessagesAction) -> Option<MessagesState> {
        use MessagesAction as A;
        let mut next = state.clone();
        match action {
            A::Connect(p) => {
                let transition = session::connect(&state.coordinator, connection(p));
                next.coordinator = transition.facts;
                let pi = &mut next.pis[p as usize];
                pi.epoch = next.coordinator.active.as_ref().map(|a| a.epoch);
                pi.queued = None;
                next.connects += 1;
            }
            A::Reread(p) => {
                let mut before = state.coordinator.clone();
                if self.rules == MessageRules::FencedRetakesEpoch {
                    before.fenced.clear();
                }
                let was_fenced = session::epoch_of(&before, &connection(p)).is_none();
                next.coordinator = session::connect(&before, connection(p)).facts;
                next.oracle.fenced_retook_epoch |= was_fenced
                    && before.active.is_some()
                    && session::epoch_of(&next.coordinator, &connection(p)).is_some();
                // The view names an epoch only to its owner; a fenced
                // connection keeps the one it had and learns of the fence
                // from its next report.
                if let Some(epoch) = session::epoch_of(&next.coordinator, &connection(p)) {
                    let pi = &mut next.pis[p as usize];
                    if pi.epoch != Some(epoch) {
                        pi.queued = None;
                    }
                    pi.epoch = Some(epoch);
                }
                if next.coordinator != state.coordinator {
                    next.rereads += 1;
                }
            }
            A::Disconnect(p) => {
                next.coordinator = session::disconnect(&state.coordinator, &connection(p)).facts;
                self.suspend_clocks(&mut next);
                let pi = &mut next.pis[p as usize];
                pi.epoch = None;
                pi.queued = None;
                next.disconnects += 1;
            }
            A::Crash(p) => {
                next.coordinator = session::disconnect(&state.coordinator, &connection(p)).facts;
                self.suspend_clocks(&mut next);
                next.pis[p as usize] = Pi {
                    alive: false,
                    epoch: None,
                    queued: None,
                    turn: None,
                    last_ended: None,
                };
                next.crashes += 1;
            }
            A::ReportBranch(p) => self.report_branch(state, &mut next, p)?,
            A::Offer(p) => {
                let pi = &state.pis[p as usize];
                let epoch = pi.epoch?;
                let mut coordinator = self.coordinator_for(
                    state,
                    p,
                    self.rules == MessageRules::OldEpochStillOffered,
                );
                if self.rules == MessageRules::SendWithoutBranchReport
                    && let Some(active) = coordinator.active.as_mut()
                {
                    // Planted bug: the offer does not wait for the branch report.
                    active.branch_reported = true;
                }
                match session::offer(&Self::session(state), &coordinator, &connection(p), epoch) {
                    Ok(offered) => {
                        let id = offered.message_id?;
                        if !Self::is_active(state, p) {
                            next.oracle.stale_offered = true;
                        } else {
                            next.coordinator = offered.coordinator;
                            if let Some(active) = next.coordinator.active.as_mut() {
                                active.branch_reported = state
                                    .coordinator
                                    .active
                                    .as_ref()
                                    .is_some_and(|a| a.branch_reported);
                            }
                        }
                        if state.branch.iter().any(|(shown, _)| *shown == id) {
                            next.oracle.offered_while_shown = true;
                        }
                        next.pis[p as usize].queued = Some(id);
                    }
                    Err(_) => {
                        next.oracle.fenced |= state.coordinator.last_epoch > epoch;
                        return (next != *state).then_some(next);
                    }
                }
            }
            A::Send(p) | A::SendThenCrash { pi: p, .. } => {
                let pi = &state.pis[p as usize];
                let id = pi.queued.clone()?;
                // The extension's last synchronous checks before `pi.sendMessage()`.
                if pi.busy()
                    || state.branch.iter().any(|(shown, _)| *shown == id)
                    || session::check(&state.coordinator, &connection(p), pi.epoch?).is_err()
                {
                    return None;
                }
                let persisted = !matches!(
                    action,
                    A::SendThenCrash {
                        persisted: false,
                        ..
                    }
                );
                if persisted {
                    next.branch.push((id.clone(), entry(&id)));
                }
                next.turns_started += 1;
                let turn = next.turns_started;
                next.pis[p as usize].turn = Some(PiTurn {
                    turn,
                    message: id,
                    ended: None,
                    start_reported: false,
                    end_reported: false,
                });
                if let A::SendThenCrash { .. } = action {
                    next.coordinator =
                        session::disconnect(&state.coordinator, &connection(p)).facts;
                    self.suspend_clocks(&mut next);
                    next.pis[p as usize] = Pi {
                        alive: false,
                        epoch: None,
                        queued: None,
                        turn: None,
                        last_ended: None,
                    };
                    next.crashes += 1;
                }
            }
            A::NewTurn(p) => {
                // agent_start binds through the session view: the latest sent message.
                let message = state
                    .messages
                    .iter()
                    .filter(|m| m.state == MessageState::Sent)
                    .max_by_key(|m| m.order)?
                    .message_id
                    .clone();
                next.turns_started += 1;
                let turn = next.turns_started;
                next.pis[p as usize].turn = Some(PiTurn {
                    turn,
                    message,
                    ended: None,
                    start_reported: false,
                    end_reported: false,
                });
            }
            A::ReportTurnStart(p) => {
                let turn = state.pis[p as usize].turn.clone()?;
                self.report_turn(state, &mut next, p, &turn, TurnPhase::Start)?;
                if let Some(t) = next.pis[p as usize].turn.as_mut() {
                    t.start_reported = true;
                }
            }
            A::EndTurn(p, reason) => {
                let turn = next.pis[p as usize].turn.as_mut()?;
                turn.ended = Some(reason);
            }
            A::ReportTurnEnd(p) | A::RepeatTurnEnd(p) => {
                let pi = &state.pis[p as usize];
                let turn = if let A::RepeatTurnEnd(_) = action {
                    pi.last_ended.clone()?
                } else {
                    pi.turn.clone()?
                };
                let phase = TurnPhase::End {
                    stop_reason: turn.ended?,
                    entry_id: None,
                };
                self.report_turn(state, &mut next, p, &turn, phase)?;
                let pi = &mut next.pis[p as usize];
                if let A::RepeatTurnEnd(_) = action {
                    next.repeats += 1;
                } else if pi.alive {
                    pi.last_ended = pi.turn.take().map(|t| PiTurn {
                        end_reported: true,
                        ..t
                    });
                }
            }
            A::BranchChange => {
                next.branch.pop();
                next.branch_changes += 1;
            }
            A::Resume => {
                let order = state.messages.iter().map(|m| m.order).max().unwrap_or(0) + 1;
                let ids = run::ResumeIds {
                    resumed_message_id: MessageId::new(format!("m-{order}")),
                    message_order: order,
                };
                let transition = run::resume(&Self::loaded(state), ids, NOW).ok()?;
                self.commit_run(state, &mut next, transition);
                next.resumes += 1;
            }
            A::Submit(p) => {
                let epoch = state.pis[p as usize].epoch?;
                session::check(&state.coordinator, &connection(p), epoch).ok()?;
                let submission = NewSubmission {
                    submission_id: SubmissionId::from("sub-1"),
                    idempotency_key: IdempotencyKey::from("k-1"),
                    payload_hash: Digest::repeat(0x51),
                };
                let submitted = interaction::submit(
                    &Self::loaded(state),
                    &state.submissions,
                    &InteractionId::from("i-1"),
                    submission,
                    NOW,
                )
                .ok()?;
                let Submitted::Validating { run, submission } = submitted else {
                    return None;
                };
                self.commit_run(state, &mut next, run);
                next.submissions.push(submission);
                next.submitted += 1;
            }
            A::ValidationAccepted => {
                let submission = state
                    .submissions
                    .iter()
                    .find(|s| s.outcome == SubmissionOutcome::Validating)?;
                let verdict = interaction::validation_accepted(
                    &Self::loaded(state),
                    &state.submissions,
                    &InteractionId::from("i-1"),
                    &submission.submission_id,
                    NOW,
                )
                .ok()?;
                self.commit_run(state, &mut next, verdict.run);
                for row in &mut next.submissions {
                    if row.submission_id == verdict.submission.submission_id {
                        *row = verdict.submission.clone();
                    }
                }
                if let Some(follow_up) = verdict.follow_up {
                    let follow_up = RunFollowUp::Attempt { follow_up };
                    self.follow_ups(&mut next, &[follow_up])?;
                }
            }
            A::ServerRestart => {
                next.coordinator = CoordinatorFacts::new(kernel::ids::SessionId::from("s-1"));
                for pi in &mut next.pis {
                    pi.epoch = None;
                    pi.queued = None;
                }
                self.suspend_clocks(&mut next);
                if next.agg.run.status.is_terminal() {
                    self.build_terminal(&mut next);
                }
                next.restarts += 1;
            }
        }
        self.check_step(state, &mut next, action);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        match self.focus {
            Focus::Delivery => vec![
                Property::always(
                    "at most one active coordinator epoch per origin session: only the newest connection's reports are accepted",
                    |_, s: &MessagesState| !s.oracle.stale_accepted,
                ),
                Property::always(
                    "a fenced connection stays fenced while another connection is active: its session-view reads take no epoch",
                    |_, s: &MessagesState| !s.oracle.fenced_retook_epoch,
                ),
                Property::always(
                    "only the active epoch is offered messages",
                    |_, s: &MessagesState| !s.oracle.stale_offered,
                ),
                Property::always(
                    "a sent message never returns to pending",
                    |_, s: &MessagesState| !s.oracle.sent_to_pending,
                ),
                Property::always(
                    "a message becomes sent only from branch evidence and is never offered while the branch shows it",
                    |_, s: &MessagesState| {
                        !s.oracle.sent_without_evidence && !s.oracle.offered_while_shown
                    },
                ),
                Property::sometimes(
                    "a message is adopted from branch evidence after a crash",
                    |_, s: &MessagesState| s.oracle.adopted_after_crash,
                ),
                Property::sometimes(
                    "a replacement connection fences the old one",
                    |_, s: &MessagesState| s.oracle.fenced,
                ),
                Property::sometimes(
                    "a source without its entry on the idle branch is presented again",
                    |_, s: &MessagesState| {
                        s.messages.iter().any(|m| {
                            matches!(
                                m.kind,
                                MessageKind::Step {
                                    reason: StepReason::Resumed,
                                    ..
                                }
                            )
                        })
                    },
                ),
            ],
            Focus::Turns => vec![
                Property::always(
                    "at most one pending step message per interactive request and at most one pending reminder",
                    |_, s: &MessagesState| !s.oracle.two_pending_steps,
                ),
                Property::always(
                    "a stale turn id never clears a newer open turn",
                    |_, s: &MessagesState| !s.oracle.stale_cleared_newer,
                ),
                Property::always(
                    "the unproductive counter never exceeds 3, reaching 3 fails the attempt, and only eligible ends count",
                    |_, s: &MessagesState| !s.oracle.counter_wrong,
                ),
                Property::always(
                    "message projections agree with the run",
                    |_, s: &MessagesState| !s.oracle.projections_disagree,
                ),
                Property::sometimes("a reminder is created", |_, s: &MessagesState| {
                    s.oracle.reminder_created
                }),
                Property::sometimes(
                    "the unproductive-turn limit fails the attempt and the run says why",
                    |_, s: &MessagesState| {
                        s.oracle.limit_failed && s.agg.run.status == RunStatus::Failed
                    },
                ),
                Property::sometimes("an aborted turn pauses the run", |_, s: &MessagesState| {
                    s.oracle.aborted_paused
                }),
                Property::sometimes(
                    "a resume presents the step again",
                    |_, s: &MessagesState| s.oracle.resumed_presented,
                ),
                Property::sometimes(
                    "an accepted submission completes the run",
                    |_, s: &MessagesState| s.agg.run.status == RunStatus::Completed,
                ),
                Property::always(
                    "a request's turn clock runs only during a reported step turn of the active coordinator on an unpaused run",
                    |_, s: &MessagesState| !s.oracle.clock_outside_turn,
                ),
                Property::always(
                    "a run has at most one terminal message, and only once it ended",
                    |_, s: &MessagesState| !s.oracle.terminal_wrong,
                ),
                Property::sometimes("a step turn runs the clock", |_, s: &MessagesState| {
                    s.oracle.clock_ran
                }),
                Property::sometimes(
                    "a closed connection or a server restart suspends a running clock",
                    |_, s: &MessagesState| s.oracle.clock_suspended,
                ),
                Property::sometimes(
                    "the terminal message opens a model turn",
                    |_, s: &MessagesState| s.oracle.terminal_turn,
                ),
            ],
        }
    }
}

impl Summarize for MessagesModel {
    fn summarize(&self, s: &MessagesState) -> String {
        let messages: Vec<String> = s
            .messages
            .iter()
            .map(|m| {
                let kind = match &m.kind {
                    MessageKind::Step { reason, .. } => format!("step/{reason:?}"),
                    other => format!("{other:?}"),
                };
                format!("{} {kind} {:?}", m.message_id, m.state)
            })
            .collect();
        let turns: Vec<String> = s
            .turns
            .iter()
            .map(|t| format!("{}@{} {:?}", t.turn_id, t.message_id, t.state))
            .collect();
        let branch: Vec<&str> = s.branch.iter().map(|(id, _)| id.as_str()).collect();
        format!(
            "run {:?} paused={} unproductive={:?}; messages {messages:?}; turns {turns:?}; branch {branch:?}; active epoch {:?}",
            s.agg.run.status,
            s.agg.run.paused,
            s.agg.interaction.as_ref().map(|i| i.unproductive_turn_ends),
            s.coordinator
                .active
                .as_ref()
                .map(|a| (a.connection_id.as_str().to_owned(), a.epoch.0)),
        )
    }
}
