//! Random operation sequences through the kernel's run transitions, as the
//! shell would call them: admission, `runner.ready` and dispatch,
//! `node.started`, `node.finished`/`node.failed`, finish, drain, runner
//! exits (supervised and orphaned), claim expiry and recovery, a server
//! crash (the host authorities are lost), a clock, and client commands
//! (pause, resume, cancel) through the receipt rules with retries under
//! reused request ids and idempotency keys. Runner operations may present
//! the previous generation's authority (a stale runner).
//!
//! After every step the target checks (each shown to catch a planted bug,
//! see conformance/fuzz/README.md):
//! 1. terminal states are absorbing: once terminal, the status, queue,
//!    error and finish time never change;
//! 2. no contradictory terminal state: a terminal run holds no claim and no
//!    unfinished attempt, is not paused, has a finish time, and has an error
//!    exactly when it failed or timed out;
//! 3. claim generations are monotonic: the lease generation never
//!    decreases, an admission raises it by exactly one, and a claim carries
//!    the lease's generation;
//! 4. no stale write: a runner operation commits only with the exact live
//!    claim of the current generation;
//! 5. one live runner: no step gives the run a second runner epoch while
//!    the previous one is not exited;
//! 6. revisions: a step raises the revision by at most one and publishes it
//!    exactly when it does, and a change of status, queue or pause always
//!    raises it;
//! 7. receipts are idempotent: a command identity executes at most once per
//!    request id and per idempotency key, a retry adopts the stored receipt
//!    of its first execution, and a conflict names a receipt with another
//!    identity.
//!
//! Managed effects run through the same sequences (`effect.reserve`,
//! `effect.settle` by the runner, `effect.recover` by an operator, against
//! a simulated `effects` table the way the shell loads it), with:
//! 8. never twice: an effect begins applying at most once per attempt
//!    number, and only a runner write with the live claim begins it;
//! 9. settled is settled: an applied, rejected or cancelled row never
//!    changes again, an ambiguous one changes only by an operator's
//!    recovery, and an applying one settles as applied or rejected only by
//!    the runner's report;
//! 10. uncertainty is kept: an applying effect that does not settle becomes
//!    ambiguous (never reserved or cancelled), and a terminal run leaves no
//!    effect applying.
#![no_main]

use arbitrary::Arbitrary;
use kernel::attempt::NodeOutcome;
use kernel::effect::{
    self, EffectRecord, EffectState, RecoveryAction, ReserveRequest, SettleOutcome, SettleReport,
};
use kernel::execution::{self, Actor, NodeResult};
use kernel::fixtures;
use kernel::ids::{
    AttemptId, ClientId, Digest, EffectId, Generation, IdempotencyKey, MessageId, RequestId,
    Revision,
};
use kernel::output::StopReason;
use kernel::output::{Output, RunEvent, Step, Transition};
use kernel::receipt::{
    self, CommandIdentity, CommandOperation, CommandOutcome, ConflictReason, Incoming,
    ReceiptDecision, StoredCommand,
};
use kernel::run::{
    self, FailureClass, ParkReason, ReasonKind, RunAggregate, RunError, RunRecord, Terminal,
};
use kernel::runner::{self, ExitKind, RunnerExit};
use kernel::topology::Topology;
use libfuzzer_sys::fuzz_target;
use std::collections::{BTreeMap, BTreeSet};

const TTL: u64 = fixtures::TTL_MS;
const NODES: [&str; 3] = ["a", "b", "c"];

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Command {
    Pause,
    Resume,
    Cancel,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Exit {
    Clean,
    Abnormal,
    Stopped,
    StartupDeadlineMissed,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// The clock advances by `ms` (up to two claim lifetimes).
    Tick {
        ms: u16,
    },
    /// The scheduler admits the run with the next generation's runner.
    Admit,
    /// `runner.ready` plus dispatch.
    Ready {
        stale: bool,
    },
    NodeStarted {
        stale: bool,
        deadline_ms: Option<u16>,
    },
    NodeFinished {
        stale: bool,
        ok: bool,
    },
    /// The runner ends the run (a workflow-level completion or failure).
    Finish {
        stale: bool,
        completed: bool,
    },
    /// The server drains: it parks the run under the runner's authority.
    Drain {
        stale: bool,
    },
    /// The recorded runner's process ends and the server records it.
    RunnerExited {
        exit: Exit,
    },
    /// The server's claim-expiry timer fires.
    ClaimExpired,
    /// The server crashes: it forgets every host authority; the runner it
    /// spawned is an orphan from now on.
    ServerCrash,
    /// The runner asks to apply effect `kind` (of two) of its active
    /// attempt, with one of two request fingerprints.
    EffectReserve {
        stale: bool,
        kind: bool,
        fingerprint: bool,
    },
    /// The runner reports how effect `kind` of the active attempt ended.
    EffectSettle {
        stale: bool,
        kind: bool,
        applied: bool,
        result: bool,
    },
    /// An operator recovers effect `which` (of those recorded).
    EffectRecover {
        which: u8,
        retry: bool,
    },
    /// A client command (request ids and keys from a small set, so retries
    /// and reuse are frequent).
    Client {
        client: u8,
        request: u8,
        key: u8,
        command: Command,
        expected_revision: Option<u8>,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    interactive: bool,
    ops: Vec<Op>,
}

struct World {
    agg: RunAggregate,
    topology: Topology,
    now: u64,
    /// Whether this server spawned the recorded runner (holds its host authority).
    supervised: bool,
    next_attempt: u64,
    next_message: u64,
    receipts: Vec<StoredCommand>,
    /// The `effects` table: every effect row as last committed.
    effects: BTreeMap<EffectId, EffectRecord>,
    /// Every (effect, attempt number) that began applying.
    applying_began: BTreeSet<(EffectId, u32)>,
    /// Every durable execution: (client, request id, key, identity, outcome, revision).
    executions: Vec<(
        ClientId,
        RequestId,
        IdempotencyKey,
        CommandIdentity,
        CommandOutcome,
    )>,
}

impl World {
    fn generation(&self) -> u64 {
        self.agg.run.lease.generation.0
    }

    /// The runner generation an operation presents: the current one, or
    /// the previous one for a stale runner.
    fn runner_generation(&self, stale: bool) -> u64 {
        let generation = self.generation();
        if stale {
            generation.saturating_sub(1)
        } else {
            generation
        }
    }

    fn host(&self) -> Option<kernel::claim::Authority> {
        self.supervised
            .then(|| fixtures::host_authority(self.generation()))
    }

    fn attempt_id(&mut self) -> AttemptId {
        self.next_attempt += 1;
        AttemptId::new(format!("a-{}", self.next_attempt))
    }
}

/// Invariant 2, on one state.
fn check_state(agg: &RunAggregate) {
    let run = &agg.run;
    assert!(
        RunRecord::pair_is_legal(run.status, run.queue),
        "illegal pair {:?}/{:?}",
        run.status,
        run.queue
    );
    if let Some(claim) = &run.lease.claim {
        assert!(
            RunRecord::pair_holds_claim(run.status, run.queue),
            "a claim outside a claim-holding pair"
        );
        assert_eq!(
            claim.generation, run.lease.generation,
            "a claim carries the lease generation"
        );
    }
    if run.status.is_terminal() {
        assert!(run.lease.claim.is_none(), "terminal run holds a claim");
        assert!(
            agg.attempt
                .as_ref()
                .is_none_or(|a| !a.status.is_unfinished()),
            "terminal run {:?} keeps an unfinished attempt",
            run.status
        );
        assert!(!run.paused, "terminal run is paused");
        assert!(
            run.finished_at_ms.is_some(),
            "terminal run without a finish time"
        );
        let errs = matches!(
            run.status,
            run::RunStatus::Failed | run::RunStatus::TimedOut
        );
        assert_eq!(
            run.error.is_some(),
            errs,
            "error recorded exactly for failed/timed-out runs ({:?})",
            run.status
        );
    }
}

/// Invariants 1, 3, 5 and 6 on one accepted step.
fn check_step(pre: &RunAggregate, step: &Transition<RunAggregate>, admitted: bool) {
    let post = &step.facts;
    check_state(post);
    let (a, b) = (&pre.run, &post.run);
    if a.status.is_terminal() {
        assert_eq!(
            (a.status, a.queue, &a.error, a.finished_at_ms),
            (b.status, b.queue, &b.error, b.finished_at_ms),
            "a terminal run changed"
        );
    }
    assert!(
        b.lease.generation >= a.lease.generation,
        "the lease generation decreased"
    );
    if admitted {
        assert_eq!(
            b.lease.generation,
            a.lease.generation.next(),
            "an admission raises the generation by one"
        );
    }
    assert!(
        !pre.run.live_runner().is_some_and(|old| b
            .runner
            .as_ref()
            .is_some_and(|new| new.runner_epoch != old.runner_epoch)),
        "a second runner epoch while the previous one is live"
    );
    let published: Vec<Revision> = step
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::PublishRun { revision, .. } => Some(*revision),
            _ => None,
        })
        .collect();
    if b.revision == a.revision {
        assert!(published.is_empty(), "published an unchanged revision");
        assert_eq!(
            (a.status, a.queue, a.paused),
            (b.status, b.queue, b.paused),
            "status, queue or pause changed without a new revision"
        );
    } else {
        assert_eq!(
            b.revision,
            a.revision.next(),
            "the revision rose by more than one"
        );
        assert_eq!(
            published,
            vec![b.revision],
            "a new revision is published exactly once"
        );
    }
}

/// Invariant 4: a runner operation presenting `generation` committed.
fn check_runner_write(pre: &RunAggregate, generation: u64, now: u64) {
    let claim = pre
        .run
        .lease
        .claim
        .as_ref()
        .expect("a runner write needs a claim");
    assert_eq!(
        claim.generation,
        Generation(generation),
        "a stale runner's write committed"
    );
    assert_eq!(
        claim.token_hash,
        fixtures::token(generation),
        "a write with another token committed"
    );
    assert!(
        claim.is_live(now),
        "a write under an expired claim committed"
    );
}

fn apply(
    world: &mut World,
    result: Result<Transition<RunAggregate>, run::Rejection>,
    admitted: bool,
) -> bool {
    match result {
        Ok(step) => {
            check_step(&world.agg, &step, admitted);
            record_effects(world, &step);
            world.agg = step.facts.reload();
            true
        }
        Err(_) => false,
    }
}

/// Invariant 8, and the committed rows into the simulated table.
fn record_effects(world: &mut World, step: &Transition<RunAggregate>) {
    for output in &step.outputs {
        if let Output::Event {
            event:
                RunEvent::EffectApplying {
                    effect_id,
                    attempt_number,
                },
            ..
        } = output
        {
            assert!(
                world
                    .applying_began
                    .insert((effect_id.clone(), *attempt_number)),
                "effect {effect_id:?} began applying twice as attempt {attempt_number}"
            );
        }
    }
    for effect in &step.facts.effects {
        world.effects.insert(effect.effect_id.clone(), effect.clone());
    }
}

/// What an operation may do to effect rows (invariants 9 and 10).
#[derive(Clone, Copy, PartialEq, Eq)]
enum EffectWrite {
    Other,
    Settle,
    Recover,
}

/// Invariants 9 and 10 over one operation's change of the table.
fn check_effects(
    before: &BTreeMap<EffectId, EffectRecord>,
    world: &World,
    write: EffectWrite,
) {
    for (id, old) in before {
        let new = &world.effects[id];
        match (old.state, new.state) {
            (EffectState::Applied | EffectState::Rejected | EffectState::Cancelled, _) => {
                assert_eq!(old, new, "a settled effect changed");
            }
            (EffectState::Ambiguous, EffectState::Ambiguous) => {}
            (EffectState::Ambiguous, _) => assert!(
                write == EffectWrite::Recover,
                "an ambiguous effect moved without an operator's recovery"
            ),
            (EffectState::Applying, EffectState::Applied | EffectState::Rejected) => assert!(
                write == EffectWrite::Settle,
                "an applying effect settled without the runner's report"
            ),
            (EffectState::Applying, EffectState::Reserved | EffectState::Cancelled) => {
                panic!("an applying effect became {:?}, not ambiguous", new.state)
            }
            (EffectState::Applying | EffectState::Reserved, _) => {}
        }
    }
    if world.agg.run.status.is_terminal() {
        assert!(
            world
                .effects
                .values()
                .all(|effect| effect.state != EffectState::Applying),
            "a terminal run leaves an effect applying"
        );
    }
}

fn route_from(agg: &RunAggregate) -> Option<serde_json::Value> {
    agg.steps.last().map(|last| {
        fixtures::result_record(
            last.attempt_id.as_str(),
            last.node_id.as_str(),
            last.outcome,
            serde_json::Value::Null,
        )
    })
}

fn runner_op(world: &mut World, op: &Op) {
    let (stale, generation) = match op {
        Op::Ready { stale }
        | Op::NodeStarted { stale, .. }
        | Op::NodeFinished { stale, .. }
        | Op::Finish { stale, .. }
        | Op::Drain { stale } => (*stale, world.runner_generation(*stale)),
        _ => unreachable!("only runner operations"),
    };
    let _ = stale;
    let authority = fixtures::host_authority(generation);
    let epoch = fixtures::runner_epoch(generation);
    let now = world.now;
    let pre = world.agg.clone();
    let result = match op {
        Op::Ready { .. } => {
            let attempt = world.attempt_id();
            execution::start_generation(
                &pre,
                &world.topology,
                &authority,
                &epoch,
                route_from(&pre).as_ref(),
                None,
                attempt,
                now,
                TTL,
            )
            .map(|(t, _)| t)
        }
        Op::NodeStarted { deadline_ms, .. } => {
            let Some(attempt) = pre.attempt.clone() else {
                return;
            };
            let deadline = deadline_ms.map(|d| now + u64::from(d));
            execution::record_node_started(
                &pre,
                &authority,
                &epoch,
                &attempt.attempt_id,
                deadline,
                now,
                TTL,
            )
        }
        Op::NodeFinished { ok, .. } => {
            let Some(attempt) = pre.attempt.clone() else {
                return;
            };
            let outcome = if *ok {
                NodeOutcome::Ok
            } else {
                NodeOutcome::Failed
            };
            let record = fixtures::result_record(
                attempt.attempt_id.as_str(),
                attempt.node_id.as_str(),
                outcome,
                serde_json::Value::Null,
            );
            let next = world.attempt_id();
            let actor = Actor::Runner {
                authority: &authority,
                runner_epoch: &epoch,
            };
            execution::finish_attempt(
                &pre,
                &world.topology,
                actor,
                &attempt.attempt_id,
                NodeResult { outcome, record },
                next,
                now,
                TTL,
            )
            .map(|(t, _)| t)
        }
        Op::Finish { completed, .. } => {
            let terminal = if *completed {
                Terminal::Completed
            } else {
                Terminal::Failed {
                    error: RunError {
                        class: FailureClass::NodeFailed,
                        reason: ReasonKind::NodeFailed,
                        node_id: None,
                    },
                }
            };
            run::finish(&pre, Some(&authority), terminal, now)
        }
        Op::Drain { .. } => run::park(&pre, &authority, ParkReason::Drained, now),
        _ => unreachable!("only runner operations"),
    };
    if apply(world, result, false) {
        check_runner_write(&pre, generation, now);
    }
}

/// An effect operation's transition (its rejection is not a run rejection,
/// so it goes through `apply` as a plain step).
fn apply_effect(world: &mut World, decided: Result<Transition<RunAggregate>, ()>) -> bool {
    match decided {
        Ok(step) => apply(world, Ok(step), false),
        Err(()) => false,
    }
}

/// `effect.reserve` and `effect.settle` by the runner of `generation`.
fn effect_op(world: &mut World, op: &Op) {
    let (stale, kind) = match op {
        Op::EffectReserve { stale, kind, .. } | Op::EffectSettle { stale, kind, .. } => {
            (*stale, *kind)
        }
        _ => unreachable!("only effect operations"),
    };
    let generation = world.runner_generation(stale);
    let authority = fixtures::host_authority(generation);
    let epoch = fixtures::runner_epoch(generation);
    let Some(attempt) = world.agg.attempt.clone() else {
        return;
    };
    let effect_type = if kind { "deploy" } else { "notify" };
    let effect_id = effect::effect_key(&world.agg.run.run_id, &attempt, effect_type).effect_id();
    let row = world.effects.get(&effect_id).cloned();
    let pre = world.agg.clone();
    let now = world.now;
    let committed = match op {
        Op::EffectReserve { fingerprint, .. } => {
            let request = ReserveRequest {
                attempt_id: attempt.attempt_id.clone(),
                effect_type: effect_type.to_owned(),
                request_fingerprint: Digest::repeat(u8::from(*fingerprint)),
            };
            match effect::reserve(&pre, &authority, &epoch, request, row.as_ref(), now, TTL) {
                Ok(effect::Reserved::Apply { transition, .. }) => {
                    apply_effect(world, Ok(transition))
                }
                Ok(effect::Reserved::Adopt { effect }) => {
                    assert!(
                        matches!(effect.state, EffectState::Applied | EffectState::Rejected),
                        "adopted an effect that did not settle"
                    );
                    false
                }
                Err(_) => false,
            }
        }
        Op::EffectSettle {
            applied, result, ..
        } => {
            let report = SettleReport {
                effect_id,
                outcome: if *applied {
                    SettleOutcome::Applied
                } else {
                    SettleOutcome::Rejected
                },
                result_digest: Digest::repeat(u8::from(*result)),
            };
            match effect::settle(&pre, &authority, &epoch, report, row.as_ref(), now, TTL) {
                Ok(effect::Settled::Commit(transition)) => apply_effect(world, Ok(transition)),
                Ok(effect::Settled::Adopt { .. }) | Err(_) => false,
            }
        }
        _ => unreachable!("only effect operations"),
    };
    if committed {
        check_runner_write(&pre, generation, now);
    }
}

fn client(
    world: &mut World,
    client: u8,
    request: u8,
    key: u8,
    command: Command,
    expected: Option<u8>,
) {
    let client_id = ClientId::new(format!("c-{}", client % 2));
    let request_id = RequestId::new(format!("r-{}", request % 4));
    let idempotency_key = IdempotencyKey::new(format!("k-{}", key % 4));
    let operation = match command {
        Command::Pause => CommandOperation::RunPause,
        Command::Resume => CommandOperation::RunResume,
        Command::Cancel => CommandOperation::RunCancel,
    };
    let identity = CommandIdentity {
        client_id: client_id.clone(),
        operation,
        idempotency_key: idempotency_key.clone(),
        run_id: Some(world.agg.run.run_id.clone()),
        expected_revision: expected.map(|r| Revision(u64::from(r % 8))),
        payload_digest: Digest::repeat(command as u8),
    };
    let incoming = Incoming {
        request_id: request_id.clone(),
        identity: identity.clone(),
    };
    let by_request = world
        .receipts
        .iter()
        .find(|s| s.identity.client_id == client_id && s.request_id == request_id);
    let by_key = world.receipts.iter().find(|s| {
        s.identity.client_id == client_id && s.identity.idempotency_key == idempotency_key
    });
    let first = world
        .executions
        .iter()
        .find(|(c, r, k, ..)| *c == client_id && (*r == request_id || *k == idempotency_key))
        .cloned();
    match receipt::decide(by_request, by_key, &incoming) {
        ReceiptDecision::Execute => {
            assert!(
                first.is_none(),
                "a command with a stored receipt executed again"
            );
            let pre = world.agg.clone();
            let now = world.now;
            let host = world.host();
            let decided = run::check_revision(&pre.run, identity.expected_revision.map(|r| r.0))
                .and_then(|()| match command {
                    Command::Pause => {
                        run::pause(&pre, host.as_ref(), fixtures::control_request(), now, TTL)
                    }
                    Command::Resume => {
                        world.next_message += 1;
                        let ids = run::ResumeIds {
                            resumed_message_id: MessageId::new(format!("m-{}", world.next_message)),
                            message_order: world.next_message,
                        };
                        run::resume(&pre, ids, now)
                    }
                    Command::Cancel => {
                        run::cancel(&pre, host.as_ref(), fixtures::control_request(), now, TTL)
                    }
                });
            let outcome = match &decided {
                Ok(_) => CommandOutcome::Accepted,
                Err(run::Rejection::ClaimLost { .. }) => CommandOutcome::ClaimLost,
                Err(run::Rejection::ClaimHeld { .. }) => CommandOutcome::Unavailable,
                Err(_) => CommandOutcome::Rejected,
            };
            apply(world, decided, false);
            let revision = (outcome == CommandOutcome::Accepted).then_some(world.agg.run.revision);
            if let Some(row) = receipt::record(
                &incoming,
                outcome,
                revision,
                Digest::repeat(outcome as u8),
                now,
            ) {
                world
                    .executions
                    .push((client_id, request_id, idempotency_key, identity, outcome));
                world.receipts.push(row);
            }
        }
        ReceiptDecision::Adopt(stored) => {
            assert_eq!(
                stored.identity, identity,
                "adopted a receipt of another command"
            );
            assert!(stored.outcome.is_durable(), "adopted a transient outcome");
            let (.., first_identity, first_outcome) =
                first.expect("an adopted receipt was executed");
            assert_eq!(
                (first_identity, first_outcome),
                (identity, stored.outcome),
                "a retry adopts its first execution"
            );
        }
        ReceiptDecision::Conflict(reason) => {
            let stored = match reason {
                ConflictReason::RequestIdReused => by_request,
                ConflictReason::IdempotencyKeyReused => by_key,
            };
            let stored = stored.expect("a conflict names a stored receipt");
            assert_ne!(
                stored.identity, identity,
                "a conflict with the same command"
            );
        }
    }
}

fn step(world: &mut World, op: &Op) {
    match op {
        Op::Tick { ms } => world.now += u64::from(*ms) % (2 * TTL + 1),
        Op::Admit => {
            let generation = world.generation() + 1;
            let decided = run::admit(
                &world.agg,
                fixtures::runner_epoch(generation),
                fixtures::token(generation),
                world.now,
                TTL,
            );
            if apply(world, decided, true) {
                world.supervised = true;
            }
        }
        Op::Ready { .. }
        | Op::NodeStarted { .. }
        | Op::NodeFinished { .. }
        | Op::Finish { .. }
        | Op::Drain { .. } => runner_op(world, op),
        Op::RunnerExited { exit } => {
            let Some(runner) = world.agg.run.runner.clone() else {
                return;
            };
            let (kind, host) = if world.supervised {
                let kind = match exit {
                    Exit::Clean => ExitKind::Clean,
                    Exit::Abnormal => ExitKind::Abnormal,
                    Exit::Stopped => ExitKind::Stopped {
                        reason: StopReason::Finished,
                    },
                    Exit::StartupDeadlineMissed => ExitKind::StartupDeadlineMissed,
                };
                (kind, Some(fixtures::host_authority(runner.generation.0)))
            } else {
                (ExitKind::Orphaned, None)
            };
            let exit = RunnerExit {
                runner_epoch: runner.runner_epoch.clone(),
                kind,
            };
            let decided = runner::decide_exit(
                &world.agg,
                exit,
                host.as_ref(),
                fixtures::control_request(),
                world.now,
                TTL,
            );
            apply(world, decided, false);
        }
        Op::ClaimExpired => {
            let decided = runner::on_claim_expired(
                &world.agg,
                world.supervised,
                fixtures::control_request(),
                world.now,
                TTL,
            );
            if let Ok(Step::Apply(transition)) = decided {
                apply(world, Ok(transition), false);
            }
        }
        Op::EffectReserve { .. } | Op::EffectSettle { .. } => effect_op(world, op),
        Op::EffectRecover { which, retry } => {
            let Some(id) = world
                .effects
                .keys()
                .nth(usize::from(*which) % world.effects.len().max(1))
                .cloned()
            else {
                return;
            };
            let action = if *retry {
                RecoveryAction::Retry
            } else {
                RecoveryAction::Confirm
            };
            let decided = effect::recover(&world.agg, &id, action, Digest::repeat(0), world.now)
                .map_err(|_| ());
            apply_effect(world, decided);
        }
        Op::ServerCrash => world.supervised = false,
        Op::Client {
            client: c,
            request,
            key,
            command,
            expected_revision,
        } => client(world, *c, *request, *key, *command, *expected_revision),
    }
}

fuzz_target!(|input: Input| {
    let agg = if input.interactive {
        fixtures::reserved_interactive(1, 0)
    } else {
        fixtures::reserved(1, 0)
    };
    check_state(&agg);
    let mut world = World {
        agg,
        topology: fixtures::chain(&NODES),
        now: 0,
        supervised: false,
        next_attempt: 0,
        next_message: 0,
        receipts: Vec::new(),
        executions: Vec::new(),
        effects: BTreeMap::new(),
        applying_began: BTreeSet::new(),
    };
    let trace = std::env::var_os("KERNEL_OPS_TRACE").is_some();
    for op in input.ops.iter().take(64) {
        if trace {
            eprintln!(
                "{op:?} @{} on {:?}/{:?}",
                world.now, world.agg.run.status, world.agg.run.queue
            );
        }
        let before = world.effects.clone();
        step(&mut world, op);
        let write = match op {
            Op::EffectSettle { .. } => EffectWrite::Settle,
            Op::EffectRecover { .. } => EffectWrite::Recover,
            _ => EffectWrite::Other,
        };
        check_effects(&before, &world, write);
    }
});
