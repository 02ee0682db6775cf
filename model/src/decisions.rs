//! Protected human decisions: a person's answer ([`decision::answer`]), a
//! second person with another answer, identical retries, the deadline timer
//! ([`decision::expire`], with and without a default), startup recovery
//! ([`decision::recover`]), an ordinary checkpoint answer
//! ([`decision::answer_checkpoint`]), pause, resume and cancel of the waiting
//! parent, and the scheduler admitting the continuation child — all racing
//! around the deadline for one accepted decision and one continuation.

use crate::harness::Summarize;
use crate::world::{self, TTL};
use core::fmt;
use kernel::decision::{
    self, Answered, ChildIdentity, ContinuationIdentity, ContinuationRequest, Continued,
    DecisionRecord, DecisionRejection, DecisionStatus, Expiry, PrepareOutcome, Provenance,
    Recovered,
};
use kernel::fixtures;
use kernel::ids::{Digest, MessageId, RunId};
use kernel::output::{LaunchCommand, Output};
use kernel::run::{self, ContinuationOf, ExecutionMode, Lineage, NewRun, RunAggregate};
use stateright::{Model, Property};

/// The decision deadline: one claim lifetime after the parent began waiting.
pub const DEADLINE: u64 = TTL;

/// The kernel's rules, or the kernel with one check dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecisionRules {
    Kernel,
    /// An answer at or after the deadline is accepted.
    AnswerAfterDeadlineWins,
    /// A second, different answer after acceptance also continues the parent
    /// (no "already decided" check: two continuation winners).
    SecondAnswerAlsoContinues,
    /// The deadline timer ignores the durable pause.
    DeadlineIgnoresPause,
    /// An ordinary checkpoint answer ignores the protected decision.
    CheckpointAnswerIgnoresDecision,
}

/// The bounded configuration.
#[derive(Clone, Debug)]
pub struct DecisionsModel {
    pub max_ticks: u64,
    /// Human answers (first answers and retries).
    pub max_answers: u8,
    pub max_pauses: u8,
    pub rules: DecisionRules,
}

impl DecisionsModel {
    /// The CI configuration.
    pub fn ci(rules: DecisionRules) -> Self {
        Self {
            max_ticks: 3,
            max_answers: 4,
            max_pauses: 2,
            rules,
        }
    }

    /// Larger bounds for local runs.
    pub fn deep(rules: DecisionRules) -> Self {
        Self {
            max_ticks: 4,
            max_answers: 6,
            max_pauses: 3,
            rules,
        }
    }

    /// A one-line description of the bounds.
    pub fn bounds(&self) -> String {
        format!(
            "deadline at tick 1, with and without default, ticks<={}, answers<={}, pauses<={}",
            self.max_ticks, self.max_answers, self.max_pauses
        )
    }
}

/// A person's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Person {
    Alice,
    Bob,
}

impl Person {
    fn digest(self) -> Digest {
        match self {
            Self::Alice => Digest::repeat(0xa1),
            Self::Bob => Digest::repeat(0xb2),
        }
    }
}

/// Oracle verdicts and witnesses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Oracle {
    /// The first accepted (provenance, answer).
    pub winner: Option<(Provenance, Digest)>,
    pub winner_changed: bool,
    pub late_human_win: bool,
    pub accepted_while_paused: bool,
    /// `SpawnRunner` outputs with a `continue` command.
    pub continuation_starts: u8,
    // Witnesses.
    pub human_won: bool,
    pub default_won: bool,
    pub expired: bool,
    pub late_answer_refused: bool,
    pub retry_adopted: bool,
    pub recovery_adopted: bool,
    pub paused_answer_refused: bool,
}

/// The model state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DecisionsState {
    pub ticks: u64,
    pub now: u64,
    /// The waiting parent as the shell reloads it.
    pub parent: RunAggregate,
    /// The committed decision row.
    pub decision: DecisionRecord,
    /// Continuation children, with the identity each was prepared with.
    pub children: Vec<(RunAggregate, ContinuationIdentity)>,
    pub answers: u8,
    pub pauses: u8,
    pub oracle: Oracle,
}

/// One environment step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecisionsAction {
    Tick,
    Answer(Person),
    Deadline,
    Recover,
    CheckpointAnswer,
    Pause,
    Resume,
    Cancel,
    AdmitChild,
}

impl fmt::Display for DecisionsAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tick => write!(f, "clock advances one claim lifetime (deadline = tick 1)"),
            Self::Answer(person) => write!(f, "{person:?}: decision::answer"),
            Self::Deadline => write!(f, "deadline timer: decision::expire"),
            Self::Recover => write!(f, "startup recovery: decision::recover"),
            Self::CheckpointAnswer => write!(f, "client: decision::answer_checkpoint"),
            Self::Pause => write!(f, "client: run::pause of the waiting parent"),
            Self::Resume => write!(f, "client: run::resume of the waiting parent"),
            Self::Cancel => write!(f, "client: run::cancel of the waiting parent"),
            Self::AdmitChild => write!(f, "scheduler: run::admit of the continuation child"),
        }
    }
}

fn identity(child: &str, input: Digest) -> ContinuationIdentity {
    ContinuationIdentity {
        child_run_id: RunId::from(child),
        workflow_source_digest: Digest::repeat(1),
        definition_digest: Digest::repeat(2),
        input_digest: input,
        launch_options_digest: Digest::repeat(4),
        parent_run_id: RunId::from("run-1"),
        owning_session: None,
    }
}

fn request() -> ContinuationRequest {
    ContinuationRequest {
        identity: identity("run-1c", Digest::repeat(3)),
        control: fixtures::control_request(),
    }
}

fn is_accepted(status: &DecisionStatus) -> bool {
    matches!(status, DecisionStatus::Accepted { .. })
}

impl DecisionsModel {
    fn existing_child(state: &DecisionsState) -> Option<&ChildIdentity> {
        let continued_by = state.parent.run.lineage.continued_by.as_ref()?;
        state
            .children
            .iter()
            .find(|(child, _)| &child.run.run_id == continued_by)
            .map(|(_, identity)| identity)
    }

    fn answer(
        &self,
        state: &DecisionsState,
        person: Person,
    ) -> Result<Answered, DecisionRejection> {
        let mut row = state.decision.clone();
        if self.rules == DecisionRules::AnswerAfterDeadlineWins {
            // Planted bug: the deadline is not compared with `now`.
            row.deadline_at_ms = None;
        }
        let result = decision::answer(
            &state.parent,
            &row,
            person.digest(),
            &request(),
            state.now,
            TTL,
        );
        match result {
            Ok(Answered::Accepted(mut continued)) => {
                continued.decision.deadline_at_ms = state.decision.deadline_at_ms;
                Ok(Answered::Accepted(continued))
            }
            other => other,
        }
    }

    /// The planted "second winner": a different answer after acceptance
    /// reserves its own continuation child and overwrites the winner.
    fn second_winner(&self, state: &DecisionsState, person: Person) -> Option<DecisionsState> {
        let DecisionStatus::Accepted { answer_digest, .. } = state.decision.status else {
            return None;
        };
        if answer_digest == person.digest() || state.children.len() >= 2 {
            return None;
        }
        let child_id = format!("run-1c-{}", state.children.len() + 1);
        let lineage = Lineage {
            continuation_of: Some(ContinuationOf {
                parent_run_id: RunId::from("run-1"),
                checkpoint: state.decision.node_id.clone(),
            }),
            continued_by: None,
            restart: None,
        };
        let new_run = NewRun {
            run_id: RunId::new(child_id.clone()),
            mode: ExecutionMode::Headless,
        };
        let child = run::reserve(new_run, lineage, &[], state.now).ok()?;
        let mut next = state.clone();
        next.decision.status = DecisionStatus::Accepted {
            provenance: Provenance::Human,
            answer_digest: person.digest(),
        };
        next.children
            .push((child.facts.reload(), identity(&child_id, Digest::repeat(3))));
        Some(next)
    }

    fn commit_continued(next: &mut DecisionsState, continued: Continued) {
        next.decision = continued.decision;
        next.parent = continued.parent.facts.reload();
        next.children
            .push((continued.child.facts.reload(), request().identity));
    }

    fn note_acceptance(&self, state: &DecisionsState, next: &mut DecisionsState) {
        let DecisionStatus::Accepted {
            provenance,
            answer_digest,
        } = next.decision.status.clone()
        else {
            if state.oracle.winner.is_some() {
                next.oracle.winner_changed = true;
            }
            return;
        };
        match &state.oracle.winner {
            None => {
                next.oracle.winner = Some((provenance, answer_digest));
                if state.parent.run.paused {
                    next.oracle.accepted_while_paused = true;
                }
                match provenance {
                    Provenance::Human => {
                        next.oracle.human_won = true;
                        if state
                            .decision
                            .deadline_at_ms
                            .is_some_and(|d| state.now >= d)
                        {
                            next.oracle.late_human_win = true;
                        }
                    }
                    Provenance::Timeout => next.oracle.default_won = true,
                }
            }
            Some(winner) => {
                if *winner != (provenance, answer_digest) {
                    next.oracle.winner_changed = true;
                }
            }
        }
    }
}

impl Model for DecisionsModel {
    type State = DecisionsState;
    type Action = DecisionsAction;

    fn init_states(&self) -> Vec<DecisionsState> {
        let waiting =
            fixtures::waiting_at_checkpoint(&fixtures::live_run(1, world::NODE, 0), "gate", 0);
        [Some(Digest::repeat(0xdf)), None]
            .into_iter()
            .map(|default| {
                let mut parent = waiting.clone();
                let decision = fixtures::pending_decision(&parent, Some(DEADLINE), default);
                parent.decision = Some(decision.clone());
                DecisionsState {
                    ticks: 0,
                    now: 0,
                    parent,
                    decision,
                    children: Vec::new(),
                    answers: 0,
                    pauses: 0,
                    oracle: Oracle::default(),
                }
            })
            .collect()
    }

    fn actions(&self, state: &DecisionsState, out: &mut Vec<DecisionsAction>) {
        if state.ticks < self.max_ticks {
            out.push(DecisionsAction::Tick);
        }
        if state.answers < self.max_answers {
            out.push(DecisionsAction::Answer(Person::Alice));
            out.push(DecisionsAction::Answer(Person::Bob));
        }
        out.push(DecisionsAction::Deadline);
        out.push(DecisionsAction::Recover);
        out.push(DecisionsAction::CheckpointAnswer);
        if state.pauses < self.max_pauses {
            out.push(DecisionsAction::Pause);
        }
        out.push(DecisionsAction::Resume);
        out.push(DecisionsAction::Cancel);
        if !state.children.is_empty() {
            out.push(DecisionsAction::AdmitChild);
        }
    }

    fn next_state(
        &self,
        state: &DecisionsState,
        action: DecisionsAction,
    ) -> Option<DecisionsState> {
        let mut next = state.clone();
        let now = state.now;
        match action {
            DecisionsAction::Tick => {
                next.ticks += 1;
                next.now += TTL;
            }
            DecisionsAction::Answer(person) => {
                next.answers += 1;
                match self.answer(state, person) {
                    Ok(Answered::Accepted(continued)) => {
                        Self::commit_continued(&mut next, continued)
                    }
                    Ok(Answered::Adopted(_)) => next.oracle.retry_adopted = true,
                    Err(DecisionRejection::DeadlinePassed { .. }) => {
                        next.oracle.late_answer_refused = true;
                    }
                    Err(DecisionRejection::Paused) => next.oracle.paused_answer_refused = true,
                    Err(DecisionRejection::AlreadyDecided)
                        if self.rules == DecisionRules::SecondAnswerAlsoContinues =>
                    {
                        next = self.second_winner(state, person)?;
                        next.answers += 1;
                    }
                    Err(_) => {}
                }
            }
            DecisionsAction::Deadline => {
                let mut parent = state.parent.clone();
                if self.rules == DecisionRules::DeadlineIgnoresPause {
                    // Planted bug: the timer does not see the pause.
                    parent.run.paused = false;
                }
                match decision::expire(&parent, &state.decision, &request(), now, TTL).ok()? {
                    Expiry::Defaulted(continued) => Self::commit_continued(&mut next, continued),
                    Expiry::Expired { decision, parent } => {
                        next.decision = decision;
                        next.parent = parent.facts.reload();
                        next.oracle.expired = true;
                    }
                }
            }
            DecisionsAction::Recover => {
                let existing = Self::existing_child(state);
                match decision::recover(
                    &state.parent,
                    &state.decision,
                    existing,
                    &request(),
                    now,
                    TTL,
                )
                .ok()?
                {
                    Recovered::Prepared(continued) => Self::commit_continued(&mut next, continued),
                    Recovered::Adopted { .. } => next.oracle.recovery_adopted = true,
                }
            }
            DecisionsAction::CheckpointAnswer => {
                let mut parent = state.parent.clone();
                let mut protected = Some(&state.decision);
                if self.rules == DecisionRules::CheckpointAnswerIgnoresDecision {
                    // Planted bug: the protected decision is not looked up.
                    parent.decision = None;
                    protected = None;
                }
                let wanted = identity("run-1c", Digest::repeat(3));
                let existing = Self::existing_child(state);
                match decision::answer_checkpoint(&parent, protected, existing, &wanted, now)
                    .ok()?
                {
                    PrepareOutcome::Prepared(reserved) => {
                        next.parent = reserved.parent.facts.reload();
                        next.children.push((reserved.child.facts.reload(), wanted));
                    }
                    PrepareOutcome::Adopted { .. } => return None,
                }
            }
            DecisionsAction::Pause => {
                let transition =
                    run::pause(&state.parent, None, fixtures::control_request(), now, TTL).ok()?;
                next.pauses += 1;
                next.parent = transition.facts.reload();
            }
            DecisionsAction::Resume => {
                let ids = run::ResumeIds {
                    resumed_message_id: MessageId::from("m-resumed"),
                    message_order: 2,
                };
                let transition = run::resume(&state.parent, ids, now).ok()?;
                next.parent = transition.facts.reload();
            }
            DecisionsAction::Cancel => {
                let transition =
                    run::cancel(&state.parent, None, fixtures::control_request(), now, TTL).ok()?;
                if let Some(row) = transition.facts.decision.clone() {
                    next.decision = row;
                }
                next.parent = transition.facts.reload();
            }
            DecisionsAction::AdmitChild => {
                let index = next
                    .children
                    .iter()
                    .position(|(child, _)| child.run.is_admissible())?;
                let transition = world::admit(&next.children[index].0, now).ok()?;
                let starts = transition
                    .outputs
                    .iter()
                    .filter(|o| {
                        matches!(
                            o,
                            Output::SpawnRunner {
                                command: LaunchCommand::Continue { .. },
                                ..
                            }
                        )
                    })
                    .count();
                next.oracle.continuation_starts += starts as u8;
                next.children[index].0 = transition.facts.reload();
            }
        }
        self.note_acceptance(state, &mut next);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a decision is accepted at most once: its winner never changes",
                |_, s: &DecisionsState| !s.oracle.winner_changed,
            ),
            Property::always(
                "an answer at or after the deadline never wins",
                |_, s: &DecisionsState| !s.oracle.late_human_win,
            ),
            Property::always(
                "a waiting parent has at most one continuation and one engine start",
                |_, s: &DecisionsState| s.children.len() <= 1 && s.oracle.continuation_starts <= 1,
            ),
            Property::always(
                "no decision is accepted while its run is paused",
                |_, s: &DecisionsState| !s.oracle.accepted_while_paused,
            ),
            Property::always(
                "a continuation exists only for an accepted decision",
                |_, s: &DecisionsState| {
                    s.children.is_empty()
                        || (is_accepted(&s.decision.status)
                            && s.decision.continuation_run_id.is_some()
                            && s.parent.run.lineage.continued_by == s.decision.continuation_run_id)
                },
            ),
            Property::sometimes(
                "the human answer wins and the continuation starts",
                |_, s: &DecisionsState| s.oracle.human_won && s.oracle.continuation_starts == 1,
            ),
            Property::sometimes("the deadline default wins", |_, s: &DecisionsState| {
                s.oracle.default_won
            }),
            Property::sometimes(
                "the decision expires and the run times out",
                |_, s: &DecisionsState| {
                    s.oracle.expired && s.parent.run.status == run::RunStatus::TimedOut
                },
            ),
            Property::sometimes("a late answer is refused", |_, s: &DecisionsState| {
                s.oracle.late_answer_refused
            }),
            Property::sometimes(
                "an identical retry adopts the winning answer",
                |_, s: &DecisionsState| s.oracle.retry_adopted,
            ),
            Property::sometimes(
                "recovery adopts the existing continuation",
                |_, s: &DecisionsState| s.oracle.recovery_adopted,
            ),
            Property::sometimes(
                "an answer waits while the run is paused",
                |_, s: &DecisionsState| s.oracle.paused_answer_refused,
            ),
        ]
    }
}

impl Summarize for DecisionsModel {
    fn summarize(&self, s: &DecisionsState) -> String {
        let children: Vec<String> = s
            .children
            .iter()
            .map(|(child, _)| format!("{} {:?}", child.run.run_id, child.run.status))
            .collect();
        format!(
            "t={} parent {:?}/{:?} paused={}; decision {:?}; children {children:?}; continue starts {}",
            s.now,
            s.parent.run.status,
            s.parent.run.queue,
            s.parent.run.paused,
            s.decision.status,
            s.oracle.continuation_starts
        )
    }
}
