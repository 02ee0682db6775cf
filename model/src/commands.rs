//! Client commands over a lossy connection: a client retries a command with
//! a new request id and the same idempotency key, the network duplicates and
//! reorders frames and drops replies, the server is sometimes unavailable,
//! and a buggy client reuses a key with another payload.
//!
//! The server side is the shell's job done literally: look the receipt up by
//! (client, request id) and by (client, key), call [`receipt::decide`], execute the run
//! transition ([`run::pause`], [`run::resume`]) on `Execute`, and store what
//! [`receipt::record`] returns, all in one transaction.

use crate::harness::Summarize;
use crate::world::TTL;
use core::fmt;
use kernel::claim::Authority;
use kernel::fixtures;
use kernel::ids::{ClientId, Digest, IdempotencyKey, MessageId, RequestId, Revision, RunId};
use kernel::receipt::{
    self, CommandIdentity, CommandOperation, CommandOutcome, ConflictReason, Incoming,
    ReceiptDecision, StoredCommand,
};
use kernel::run::{self, RunAggregate};
use stateright::{Model, Property};

/// The kernel's rules, or the shell/kernel with one check dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommandRules {
    Kernel,
    /// The fingerprint includes the transport request id.
    FingerprintIncludesRequestId,
    /// The payload digest is left out of the fingerprint comparison.
    PayloadOutsideFingerprint,
    /// The shell looks receipts up by request id only (not by key).
    NoLookupByKey,
    /// Transient outcomes are stored as receipts.
    StoreTransient,
}

/// The commands the client sends.
pub const COMMANDS: [Command; 3] = [Command::Pause, Command::PauseOtherPayload, Command::Resume];

/// One client command; each has a fixed identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Command {
    /// `run.pause` with key `k-1`.
    Pause,
    /// `run.pause` reusing key `k-1` with another payload (a client bug).
    PauseOtherPayload,
    /// `run.resume` with key `k-2`.
    Resume,
}

impl Command {
    fn index(self) -> usize {
        self as usize
    }

    /// The durable identity the client sends on every attempt.
    pub fn identity(self) -> CommandIdentity {
        let (operation, key, payload) = match self {
            Self::Pause => (CommandOperation::RunPause, "k-1", 0x11),
            Self::PauseOtherPayload => (CommandOperation::RunPause, "k-1", 0x12),
            Self::Resume => (CommandOperation::RunResume, "k-2", 0x21),
        };
        CommandIdentity {
            client_id: ClientId::from("c-1"),
            operation,
            idempotency_key: IdempotencyKey::from(key),
            run_id: Some(RunId::from("run-1")),
            expected_revision: None,
            payload_digest: Digest::repeat(payload),
        }
    }
}

/// The bounded configuration.
#[derive(Clone, Debug)]
pub struct CommandsModel {
    /// Request ids the client may use (sends, retries included).
    pub max_sends: u8,
    /// Deliveries the network may make (duplicates included).
    pub max_deliveries: u8,
    pub rules: CommandRules,
}

impl CommandsModel {
    /// The CI configuration.
    pub fn ci(rules: CommandRules) -> Self {
        Self {
            max_sends: 3,
            max_deliveries: 4,
            rules,
        }
    }

    /// Larger bounds for local runs.
    pub fn deep(rules: CommandRules) -> Self {
        Self {
            max_sends: 4,
            max_deliveries: 5,
            rules,
        }
    }

    /// A one-line description of the bounds.
    pub fn bounds(&self) -> String {
        format!(
            "3 commands (1 key reused), request ids<={}, deliveries<={}",
            self.max_sends, self.max_deliveries
        )
    }
}

/// A frame on the wire: one transport attempt of one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    pub command: Command,
    pub request: u8,
}

/// What a reply carried, for comparing receipts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Receipt {
    pub request_id: RequestId,
    pub revision: Option<Revision>,
    pub receipt_digest: Digest,
    pub outcome: CommandOutcome,
}

impl Receipt {
    fn of(stored: &StoredCommand) -> Self {
        Self {
            request_id: stored.request_id.clone(),
            revision: stored.revision,
            receipt_digest: stored.receipt_digest,
            outcome: stored.outcome,
        }
    }
}

/// Oracle verdicts and witnesses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Oracle {
    /// A command with a stored receipt got another reply than that receipt.
    pub receipt_changed: bool,
    /// A reused key with another payload was not a conflict, or changed facts.
    pub reuse_not_conflict: bool,
    /// Durable executions per idempotency key (`k-1`, `k-2`).
    pub executions: [u8; 2],
    // Witnesses.
    pub adopted_new_request: bool,
    pub adopted_duplicate: bool,
    pub conflicted: bool,
    pub executed_after_unavailable: bool,
    pub reply_after_loss: bool,
}

/// The model state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CommandsState {
    pub agg: RunAggregate,
    /// The committed `host_commands` rows.
    pub receipts: Vec<StoredCommand>,
    /// Frames in flight, sorted (a multiset: any may be delivered next).
    pub net: Vec<Frame>,
    pub sends: u8,
    pub deliveries: u8,
    /// Per command: the client has a reply.
    pub replied: [bool; 3],
    /// Per command: a reply was lost at least once.
    pub lost_reply: [bool; 3],
    /// Per command: it got `unavailable` at least once.
    pub unavailable: [bool; 3],
    pub oracle: Oracle,
}

/// One environment step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommandsAction {
    /// The client sends (or retries) a command with a new request id.
    Send(Command),
    /// The server processes a frame in flight. `duplicate` leaves a copy in
    /// the network; `reply_lost` drops the reply.
    Deliver {
        frame: Frame,
        duplicate: bool,
        reply_lost: bool,
    },
    /// The server is draining and answers `unavailable` (nothing is stored).
    Unavailable { frame: Frame },
}

impl fmt::Display for CommandsAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Send(command) => write!(f, "client sends {command:?} with a new request id"),
            Self::Deliver {
                frame,
                duplicate,
                reply_lost,
            } => write!(
                f,
                "server: receipt::decide + execute + receipt::record for {:?} rq-{}{}{}",
                frame.command,
                frame.request,
                if *duplicate {
                    " (frame duplicated)"
                } else {
                    ""
                },
                if *reply_lost { " (reply lost)" } else { "" }
            ),
            Self::Unavailable { frame } => write!(
                f,
                "server unavailable for {:?} rq-{} (receipt::record of a transient outcome)",
                frame.command, frame.request
            ),
        }
    }
}

fn incoming(frame: Frame) -> Incoming {
    Incoming {
        request_id: RequestId::new(format!("rq-{}", frame.request)),
        identity: frame.command.identity(),
    }
}

fn same_key(a: &CommandIdentity, b: &CommandIdentity) -> bool {
    a.client_id == b.client_id && a.idempotency_key == b.idempotency_key
}

impl CommandsModel {
    fn decide(&self, receipts: &[StoredCommand], incoming: &Incoming) -> ReceiptDecision {
        let by_request_id = receipts.iter().find(|r| {
            r.request_id == incoming.request_id
                && r.identity.client_id == incoming.identity.client_id
        });
        let by_key = receipts
            .iter()
            .find(|r| same_key(&r.identity, &incoming.identity));
        match self.rules {
            CommandRules::FingerprintIncludesRequestId => {
                // Planted bug: a receipt stored under another request id has
                // "another fingerprint".
                match (by_request_id, by_key) {
                    (None, Some(stored)) if stored.request_id != incoming.request_id => {
                        ReceiptDecision::Conflict(ConflictReason::IdempotencyKeyReused)
                    }
                    _ => receipt::decide(by_request_id, by_key, incoming),
                }
            }
            CommandRules::PayloadOutsideFingerprint => {
                // Planted bug: the payload digest is not compared.
                let mut blind = incoming.clone();
                if let Some(stored) = by_request_id.or(by_key) {
                    blind.identity.payload_digest = stored.identity.payload_digest;
                }
                receipt::decide(by_request_id, by_key, &blind)
            }
            CommandRules::NoLookupByKey => receipt::decide(by_request_id, None, incoming),
            _ => receipt::decide(by_request_id, by_key, incoming),
        }
    }

    fn record(
        &self,
        incoming: &Incoming,
        outcome: CommandOutcome,
        revision: Option<Revision>,
        digest: Digest,
    ) -> Option<StoredCommand> {
        if self.rules == CommandRules::StoreTransient && !outcome.is_durable() {
            // Planted bug: a transient outcome is stored as if durable.
            let stored = receipt::record(incoming, CommandOutcome::Rejected, revision, digest, 0);
            return stored.map(|s| StoredCommand { outcome, ..s });
        }
        receipt::record(incoming, outcome, revision, digest, 0)
    }

    /// Executes a command's run transition; `Err` is a transient outcome.
    fn execute(
        state: &CommandsState,
        command: Command,
    ) -> (Option<RunAggregate>, CommandOutcome, Option<Revision>) {
        let host: Option<Authority> = Some(fixtures::host_authority(1));
        let result = match command {
            Command::Pause | Command::PauseOtherPayload => run::pause(
                &state.agg,
                host.as_ref(),
                fixtures::control_request(),
                0,
                TTL,
            ),
            Command::Resume => run::resume(
                &state.agg,
                run::ResumeIds {
                    resumed_message_id: MessageId::from("m-resumed"),
                    message_order: 1,
                },
                0,
            ),
        };
        match result {
            Ok(transition) => {
                let revision = transition.facts.run.revision;
                (
                    Some(transition.facts.reload()),
                    CommandOutcome::Accepted,
                    Some(revision),
                )
            }
            Err(run::Rejection::ClaimLost { .. } | run::Rejection::ClaimHeld { .. }) => {
                (None, CommandOutcome::ClaimLost, None)
            }
            Err(_) => (None, CommandOutcome::Rejected, None),
        }
    }

    fn reply(state: &mut CommandsState, command: Command, reply_lost: bool) {
        let i = command.index();
        if reply_lost {
            state.lost_reply[i] = true;
        } else {
            if state.lost_reply[i] {
                state.oracle.reply_after_loss = true;
            }
            state.replied[i] = true;
        }
    }
}

impl Model for CommandsModel {
    type State = CommandsState;
    type Action = CommandsAction;

    fn init_states(&self) -> Vec<CommandsState> {
        vec![CommandsState {
            agg: fixtures::live_run(1, crate::world::NODE, 0),
            receipts: Vec::new(),
            net: Vec::new(),
            sends: 0,
            deliveries: 0,
            replied: [false; 3],
            lost_reply: [false; 3],
            unavailable: [false; 3],
            oracle: Oracle::default(),
        }]
    }

    fn actions(&self, state: &CommandsState, out: &mut Vec<CommandsAction>) {
        if state.sends < self.max_sends {
            for command in COMMANDS {
                if !state.replied[command.index()] {
                    out.push(CommandsAction::Send(command));
                }
            }
        }
        if state.deliveries < self.max_deliveries {
            let mut seen: Vec<Frame> = Vec::new();
            for frame in &state.net {
                if seen.contains(frame) {
                    continue;
                }
                seen.push(*frame);
                for (duplicate, reply_lost) in
                    [(false, false), (false, true), (true, false), (true, true)]
                {
                    out.push(CommandsAction::Deliver {
                        frame: *frame,
                        duplicate,
                        reply_lost,
                    });
                }
                out.push(CommandsAction::Unavailable { frame: *frame });
            }
        }
    }

    fn next_state(&self, state: &CommandsState, action: CommandsAction) -> Option<CommandsState> {
        let mut next = state.clone();
        match action {
            CommandsAction::Send(command) => {
                next.sends += 1;
                next.net.push(Frame {
                    command,
                    request: state.sends + 1,
                });
                next.net.sort();
            }
            CommandsAction::Unavailable { frame } => {
                next.deliveries += 1;
                let at = next.net.iter().position(|f| *f == frame)?;
                next.net.remove(at);
                let incoming = incoming(frame);
                if let Some(stored) = self.record(
                    &incoming,
                    CommandOutcome::Unavailable,
                    None,
                    Digest::repeat(0),
                ) {
                    next.receipts.push(stored);
                }
                // The client sees `unavailable` and will retry.
                next.unavailable[frame.command.index()] = true;
            }
            CommandsAction::Deliver {
                frame,
                duplicate,
                reply_lost,
            } => {
                next.deliveries += 1;
                if !duplicate {
                    let at = next.net.iter().position(|f| *f == frame)?;
                    next.net.remove(at);
                }
                let incoming = incoming(frame);
                // Oracle: what the pre-state says the reply must be.
                let identical = state
                    .receipts
                    .iter()
                    .find(|r| r.identity == incoming.identity)
                    .map(Receipt::of);
                let reused = state.receipts.iter().any(|r| {
                    same_key(&r.identity, &incoming.identity) && r.identity != incoming.identity
                });
                let decision = self.decide(&state.receipts, &incoming);
                let reply: Option<Receipt> = match &decision {
                    ReceiptDecision::Adopt(stored) => {
                        if stored.request_id == incoming.request_id {
                            next.oracle.adopted_duplicate = true;
                        } else {
                            next.oracle.adopted_new_request = true;
                        }
                        Some(Receipt::of(stored))
                    }
                    ReceiptDecision::Conflict(_) => {
                        next.oracle.conflicted = true;
                        None
                    }
                    ReceiptDecision::Execute => {
                        let (agg, outcome, revision) = Self::execute(state, frame.command);
                        let digest = Digest::repeat(
                            revision.map_or(0xee, |r| r.0 as u8) ^ (outcome as u8) << 4,
                        );
                        let stored = self.record(&incoming, outcome, revision, digest);
                        if let Some(agg) = agg {
                            next.agg = agg;
                        }
                        if outcome.is_durable() {
                            let key = usize::from(frame.command == Command::Resume);
                            next.oracle.executions[key] += 1;
                            if state.unavailable[frame.command.index()] {
                                next.oracle.executed_after_unavailable = true;
                            }
                        }
                        if let Some(stored) = stored {
                            assert!(
                                !state
                                    .receipts
                                    .iter()
                                    .any(|r| r.request_id == stored.request_id),
                                "host_commands primary key"
                            );
                            next.receipts.push(stored.clone());
                            Some(Receipt::of(&stored))
                        } else {
                            None
                        }
                    }
                };
                if let Some(expected) = &identical
                    && reply.as_ref() != Some(expected)
                {
                    next.oracle.receipt_changed = true;
                }
                if reused
                    && identical.is_none()
                    && (!matches!(decision, ReceiptDecision::Conflict(_))
                        || next.agg != state.agg
                        || next.receipts != state.receipts)
                {
                    next.oracle.reuse_not_conflict = true;
                }
                Self::reply(&mut next, frame.command, reply_lost);
            }
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a repeated command with the same key and fingerprint returns the same receipt",
                |_, s: &CommandsState| !s.oracle.receipt_changed,
            ),
            Property::always(
                "another payload under the same key is a conflict and changes nothing",
                |_, s: &CommandsState| !s.oracle.reuse_not_conflict,
            ),
            Property::always(
                "a command under one key commits at most once",
                |_, s: &CommandsState| s.oracle.executions.iter().all(|n| *n <= 1),
            ),
            Property::always(
                "only durable outcomes are stored as receipts",
                |_, s: &CommandsState| s.receipts.iter().all(|r| r.outcome.is_durable()),
            ),
            Property::sometimes(
                "a retry with a new request id adopts the receipt",
                |_, s: &CommandsState| s.oracle.adopted_new_request,
            ),
            Property::sometimes(
                "a duplicated frame adopts by request id",
                |_, s: &CommandsState| s.oracle.adopted_duplicate,
            ),
            Property::sometimes(
                "a reused key with another payload conflicts",
                |_, s: &CommandsState| s.oracle.conflicted,
            ),
            Property::sometimes(
                "a retry after unavailable executes",
                |_, s: &CommandsState| s.oracle.executed_after_unavailable,
            ),
            Property::sometimes(
                "the client gets a reply after a lost one",
                |_, s: &CommandsState| s.oracle.reply_after_loss,
            ),
        ]
    }
}

impl Summarize for CommandsModel {
    fn summarize(&self, s: &CommandsState) -> String {
        let receipts: Vec<String> = s
            .receipts
            .iter()
            .map(|r| {
                format!(
                    "{}:{}:{:?}",
                    r.request_id, r.identity.idempotency_key, r.outcome
                )
            })
            .collect();
        format!(
            "run {:?}/{:?} paused={} revision {}; receipts {receipts:?}; oracle {:?}",
            s.agg.run.status, s.agg.run.queue, s.agg.run.paused, s.agg.run.revision, s.oracle
        )
    }
}
