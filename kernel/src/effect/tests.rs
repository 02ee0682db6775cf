use super::*;
use crate::attempt::NodeOutcome;
use crate::claim::ClaimLostReason;
use crate::fixtures::{self, TTL_MS, control_request, host_authority, live_run};
use crate::output::StopReason;
use crate::run::Rejection;
use crate::runner::ExitKind;
use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;

const NOW_MS: u64 = 20;
/// The result a confirmation records (the digest of `null` in the shell).
const OBSERVED: Digest = Digest([0x0b; 32]);

fn request(fingerprint: u8) -> ReserveRequest {
    ReserveRequest {
        attempt_id: AttemptId::from("a-1-act"),
        effect_type: String::from("http"),
        request_fingerprint: Digest::repeat(fingerprint),
    }
}

fn live() -> RunAggregate {
    live_run(1, "act", 10)
}

fn the_key() -> EffectKey {
    EffectKey {
        run_id: RunId::from("run-1"),
        effect_type: String::from("http"),
        node_path: NodeId::from("act"),
        visit: 1,
    }
}

fn record(state: EffectState) -> EffectRecord {
    let key = the_key();
    EffectRecord {
        effect_id: key.effect_id(),
        key,
        request_fingerprint: Digest::repeat(7),
        state,
        attempt_number: 1,
        node_attempt_id: Some(AttemptId::from("a-1-act")),
        result_digest: matches!(state, EffectState::Applied | EffectState::Rejected)
            .then_some(Digest::repeat(0xee)),
    }
}

fn reserve_live(
    agg: &RunAggregate,
    fingerprint: u8,
    existing: Option<&EffectRecord>,
) -> Result<Reserved, EffectRejection> {
    reserve(
        agg,
        &host_authority(1),
        &fixtures::runner_epoch(1),
        request(fingerprint),
        existing,
        NOW_MS,
        TTL_MS,
    )
}

fn applying() -> RunAggregate {
    match reserve_live(&live(), 7, None).unwrap() {
        Reserved::Apply { transition, .. } => transition.facts,
        Reserved::Adopt { .. } => unreachable!("a new key applies"),
    }
}

fn report(outcome: SettleOutcome, digest: u8) -> SettleReport {
    SettleReport {
        effect_id: the_key().effect_id(),
        outcome,
        result_digest: Digest::repeat(digest),
    }
}

fn settle_live(
    agg: &RunAggregate,
    outcome: SettleOutcome,
    digest: u8,
    settled: Option<&EffectRecord>,
) -> Result<Settled, EffectRejection> {
    settle(
        agg,
        &host_authority(1),
        &fixtures::runner_epoch(1),
        report(outcome, digest),
        settled,
        NOW_MS + 1,
        TTL_MS,
    )
}

/// A run parked for review with the given effects (all built from `the_key`
/// with distinct visits so their ids differ).
fn parked_with(states: &[EffectState]) -> RunAggregate {
    let mut agg = live();
    agg.effects = states
        .iter()
        .enumerate()
        .map(|(index, state)| {
            let mut key = the_key();
            key.visit = index as u32 + 1;
            EffectRecord {
                effect_id: key.effect_id(),
                key,
                ..record(*state)
            }
        })
        .collect();
    let parked = run::park(&agg, &host_authority(1), ParkReason::Drained, 30)
        .unwrap()
        .facts;
    // The server reaps the runner it stopped.
    let stopped = ExitKind::Stopped {
        reason: StopReason::Parked,
    };
    fixtures::runner_exited(&parked, stopped, 31).facts
}

fn has_event(outputs: &[Output], wanted: impl Fn(&RunEvent) -> bool) -> bool {
    outputs
        .iter()
        .any(|output| matches!(output, Output::Event { event, .. } if wanted(event)))
}

// ---- key and id ------------------------------------------------------------

#[test]
fn the_effect_id_is_a_wire_safe_digest_of_the_key() {
    let id = the_key().effect_id();
    assert_eq!(id, the_key().effect_id(), "deterministic");
    assert_eq!(id.as_str().len(), "effect-".len() + 32);
    let included = EffectKey {
        run_id: RunId::from("run-1"),
        effect_type: String::from("100%/ok"),
        node_path: NodeId::from("mount/act"),
        visit: 12,
    };
    let wire_safe = |id: &EffectId| {
        id.as_str()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
    };
    assert!(wire_safe(&id) && wire_safe(&included.effect_id()));
    // Length prefixes keep component boundaries: moving a character from one
    // component to the next gives another id.
    let shifted = EffectKey {
        effect_type: String::from("100%/o"),
        node_path: NodeId::from("kmount/act"),
        ..included.clone()
    };
    assert_ne!(included.effect_id(), shifted.effect_id());
    let next_visit = EffectKey {
        visit: 13,
        ..included.clone()
    };
    assert_ne!(included.effect_id(), next_visit.effect_id());
}

#[test]
fn the_key_is_made_from_the_attempts_full_node_path_and_visit() {
    let mut attempt = fixtures::active_attempt("mount/act", "a-7", 1, 0);
    attempt.visit = 3;
    let key = effect_key(&RunId::from("run-1"), &attempt, "http");
    assert_eq!(
        key,
        EffectKey {
            run_id: RunId::from("run-1"),
            effect_type: String::from("http"),
            node_path: NodeId::from("mount/act"),
            visit: 3,
        }
    );
    let local = fixtures::active_attempt("act", "a-8", 1, 0);
    assert_ne!(
        effect_key(&RunId::from("run-1"), &local, "http").effect_id(),
        key.effect_id(),
        "an included workflow's node never shares a key with a local node of the same name"
    );
}

// ---- reserve ---------------------------------------------------------------

#[test]
fn reserving_a_new_key_records_it_applying_as_attempt_one() {
    let agg = live();
    let Reserved::Apply {
        transition,
        effect_id,
        attempt_number,
    } = reserve_live(&agg, 7, None).unwrap()
    else {
        panic!("a new key must apply");
    };
    assert_eq!(effect_id, the_key().effect_id());
    assert_eq!(attempt_number, 1);
    let effect = &transition.facts.effects[0];
    assert_eq!(effect.state, EffectState::Applying);
    assert_eq!(effect.key, the_key());
    assert_eq!(effect.request_fingerprint, Digest::repeat(7));
    assert_eq!(effect.node_attempt_id, Some(AttemptId::from("a-1-act")));
    assert_eq!(transition.facts.run.revision, agg.run.revision.next());
    let claim = transition.facts.run.lease.claim.as_ref().unwrap();
    assert_eq!(claim.expires_at_ms, NOW_MS + TTL_MS, "the claim is renewed");
    assert!(has_event(&transition.outputs, |event| matches!(
        event,
        RunEvent::EffectApplying {
            attempt_number: 1,
            ..
        }
    )));
    assert!(transition.outputs.iter().any(|o| matches!(
        o,
        Output::PublishRun { revision, .. } if *revision == transition.facts.run.revision
    )));
}

#[test]
fn reserving_after_an_operator_retry_applies_the_current_attempt_number() {
    let mut retried = record(EffectState::Reserved);
    retried.attempt_number = 2;
    retried.node_attempt_id = None;
    let mut agg = live();
    agg.effects = vec![retried.clone()];
    let Reserved::Apply {
        transition,
        attempt_number,
        ..
    } = reserve_live(&agg, 7, Some(&retried)).unwrap()
    else {
        panic!("a reserved effect must apply");
    };
    assert_eq!(attempt_number, 2);
    assert_eq!(transition.facts.effects.len(), 1);
    assert_eq!(transition.facts.effects[0].state, EffectState::Applying);
    assert_eq!(transition.facts.effects[0].attempt_number, 2);
}

#[test]
fn reserving_a_settled_effect_adopts_its_stored_result_without_change() {
    for state in [EffectState::Applied, EffectState::Rejected] {
        let stored = record(state);
        let result = reserve_live(&live(), 7, Some(&stored)).unwrap();
        assert_eq!(
            result,
            Reserved::Adopt {
                effect: stored.clone()
            }
        );
    }
}

#[test]
fn reserving_a_used_key_with_another_fingerprint_conflicts() {
    for state in [
        EffectState::Reserved,
        EffectState::Applied,
        EffectState::Ambiguous,
    ] {
        let stored = record(state);
        assert_eq!(
            reserve_live(&live(), 8, Some(&stored)),
            Err(EffectRejection::FingerprintConflict {
                effect_id: the_key().effect_id()
            }),
            "{state:?}"
        );
    }
}

#[test]
fn reserving_an_applying_effect_again_is_refused() {
    let agg = applying();
    assert_eq!(
        reserve_live(&agg, 7, None),
        Err(EffectRejection::AlreadyApplying {
            effect_id: the_key().effect_id()
        })
    );
}

#[test]
fn reserving_an_ambiguous_or_cancelled_effect_is_refused() {
    let ambiguous = record(EffectState::Ambiguous);
    assert_eq!(
        reserve_live(&live(), 7, Some(&ambiguous)),
        Err(EffectRejection::Ambiguous {
            effect_id: the_key().effect_id()
        })
    );
    let cancelled = record(EffectState::Cancelled);
    assert_eq!(
        reserve_live(&live(), 7, Some(&cancelled)),
        Err(EffectRejection::Cancelled {
            effect_id: the_key().effect_id()
        })
    );
}

#[test]
fn reserving_needs_the_live_claim_and_the_current_runner() {
    let agg = live();
    let stale_claim = reserve(
        &agg,
        &host_authority(2),
        &fixtures::runner_epoch(1),
        request(7),
        None,
        NOW_MS,
        TTL_MS,
    );
    assert_eq!(
        stale_claim,
        Err(EffectRejection::Run {
            run: Rejection::ClaimLost {
                reason: ClaimLostReason::OwnerChanged
            }
        })
    );
    let stale_runner = reserve(
        &agg,
        &host_authority(1),
        &fixtures::runner_epoch(9),
        request(7),
        None,
        NOW_MS,
        TTL_MS,
    );
    assert_eq!(
        stale_runner,
        Err(EffectRejection::Run {
            run: Rejection::StaleRunner
        })
    );
}

#[test]
fn reserving_for_an_attempt_that_is_not_active_is_refused() {
    let agg = live();
    let mut other = request(7);
    other.attempt_id = AttemptId::from("a-0-old");
    let result = reserve(
        &agg,
        &host_authority(1),
        &fixtures::runner_epoch(1),
        other,
        None,
        NOW_MS,
        TTL_MS,
    );
    assert_eq!(result, Err(EffectRejection::NotActiveAttempt));
    let mut no_attempt = live();
    no_attempt.attempt = None;
    assert_eq!(
        reserve_live(&no_attempt, 7, None),
        Err(EffectRejection::NotActiveAttempt)
    );
}

// ---- settle ----------------------------------------------------------------

#[test]
fn settling_an_applying_effect_makes_it_applied_or_rejected() {
    let agg = applying();
    for (outcome, state) in [
        (SettleOutcome::Applied, EffectState::Applied),
        (SettleOutcome::Rejected, EffectState::Rejected),
    ] {
        let Settled::Commit(transition) = settle_live(&agg, outcome, 0xee, None).unwrap() else {
            panic!("an applying effect must settle");
        };
        let effect = &transition.facts.effects[0];
        assert_eq!(effect.state, state);
        assert_eq!(effect.result_digest, Some(Digest::repeat(0xee)));
        assert!(has_event(&transition.outputs, |event| matches!(
            event,
            RunEvent::EffectSettled { state: s, .. } if *s == state
        )));
        assert!(
            transition.facts.clone().reload().effects.is_empty(),
            "a settled effect leaves the aggregate"
        );
    }
}

#[test]
fn an_exact_repeat_of_a_settle_adopts_and_another_report_conflicts() {
    let stored = record(EffectState::Applied);
    let agg = live();
    assert_eq!(
        settle_live(&agg, SettleOutcome::Applied, 0xee, Some(&stored)),
        Ok(Settled::Adopt {
            effect: stored.clone()
        })
    );
    assert_eq!(
        settle_live(&agg, SettleOutcome::Applied, 0xef, Some(&stored)),
        Err(EffectRejection::SettleConflict {
            state: EffectState::Applied
        })
    );
    assert_eq!(
        settle_live(&agg, SettleOutcome::Rejected, 0xee, Some(&stored)),
        Err(EffectRejection::SettleConflict {
            state: EffectState::Applied
        })
    );
}

#[test]
fn settling_an_unknown_effect_is_not_found() {
    assert_eq!(
        settle_live(&live(), SettleOutcome::Applied, 1, None),
        Err(EffectRejection::NotFound {
            effect_id: the_key().effect_id()
        })
    );
}

#[test]
fn only_an_applying_effect_settles() {
    for state in [
        EffectState::Reserved,
        EffectState::Ambiguous,
        EffectState::Cancelled,
    ] {
        let mut agg = live();
        agg.effects = vec![record(state)];
        assert_eq!(
            settle_live(&agg, SettleOutcome::Applied, 1, None),
            Err(EffectRejection::NotApplying { state })
        );
    }
}

#[test]
fn settling_needs_the_live_claim() {
    let agg = applying();
    let late = settle(
        &agg,
        &host_authority(1),
        &fixtures::runner_epoch(1),
        report(SettleOutcome::Applied, 1),
        None,
        NOW_MS + TTL_MS,
        TTL_MS,
    );
    assert_eq!(
        late,
        Err(EffectRejection::Run {
            run: Rejection::ClaimLost {
                reason: ClaimLostReason::Expired
            }
        })
    );
}

// ---- recover ---------------------------------------------------------------

#[test]
fn confirming_the_last_ambiguous_effect_makes_the_run_resumable() {
    let parked = parked_with(&[EffectState::Applying]);
    assert_eq!(parked.run.park_reason, Some(ParkReason::EffectAmbiguous));
    let effect_id = parked.effects[0].effect_id.clone();
    let transition = recover(&parked, &effect_id, RecoveryAction::Confirm, OBSERVED, 40).unwrap();
    let agg = &transition.facts;
    assert_eq!(agg.effects[0].state, EffectState::Applied);
    assert_eq!(agg.effects[0].attempt_number, 1);
    // An applied effect always has a result: the observed one, so the next
    // runner adopts it (the store's consistency check holds).
    assert_eq!(agg.effects[0].result_digest, Some(OBSERVED));
    assert_eq!(agg.run.park_reason, Some(ParkReason::Recovered));
    assert!(agg.run.is_admissible());
    assert!(transition.outputs.contains(&Output::Schedule));
    assert!(has_event(&transition.outputs, |event| matches!(
        event,
        RunEvent::EffectRecovered {
            action: RecoveryAction::Confirm,
            ..
        }
    )));
    assert_eq!(agg.run.revision, parked.run.revision.next());
}

#[test]
fn a_retry_reserves_the_next_attempt_which_the_next_runner_applies_once() {
    let parked = parked_with(&[EffectState::Applying]);
    let effect_id = parked.effects[0].effect_id.clone();
    let retried = recover(&parked, &effect_id, RecoveryAction::Retry, OBSERVED, 40)
        .unwrap()
        .facts
        .reload();
    assert_eq!(retried.effects[0].state, EffectState::Reserved);
    assert_eq!(retried.effects[0].attempt_number, 2);
    assert_eq!(retried.run.park_reason, Some(ParkReason::Recovered));

    let readmitted = fixtures::admitted(&retried, 50).facts;
    let rerun = fixtures::running(&readmitted, "act", 60).facts;
    let result = reserve(
        &rerun,
        &host_authority(2),
        &fixtures::runner_epoch(2),
        ReserveRequest {
            attempt_id: AttemptId::from("a-2-act"),
            ..request(7)
        },
        None,
        70,
        TTL_MS,
    )
    .unwrap();
    let Reserved::Apply {
        attempt_number,
        effect_id: applied,
        ..
    } = result
    else {
        panic!("a retried effect applies again");
    };
    assert_eq!((applied, attempt_number), (effect_id, 2));
}

#[test]
fn the_run_stays_parked_for_review_while_another_effect_is_ambiguous() {
    let parked = parked_with(&[EffectState::Applying, EffectState::Applying]);
    let first = parked.effects[0].effect_id.clone();
    let agg = recover(&parked, &first, RecoveryAction::Confirm, OBSERVED, 40)
        .unwrap()
        .facts;
    assert_eq!(agg.run.park_reason, Some(ParkReason::EffectAmbiguous));
    assert!(!agg.run.is_admissible());
}

#[test]
fn only_an_ambiguous_effect_can_be_recovered() {
    let parked = parked_with(&[EffectState::Reserved]);
    let effect_id = parked.effects[0].effect_id.clone();
    for action in [RecoveryAction::Confirm, RecoveryAction::Retry] {
        assert_eq!(
            recover(&parked, &effect_id, action, OBSERVED, 40),
            Err(EffectRejection::NotAmbiguous {
                state: EffectState::Reserved
            })
        );
    }
    assert_eq!(
        recover(
            &parked,
            &EffectId::from("effect:none"),
            RecoveryAction::Confirm,
            OBSERVED,
            40
        ),
        Err(EffectRejection::NotFound {
            effect_id: EffectId::from("effect:none")
        })
    );
}

#[test]
fn a_cancelled_run_records_a_confirmation_but_never_retries() {
    let mut agg = live();
    agg.effects = vec![record(EffectState::Applying)];
    let cancelled = run::cancel(
        &agg,
        Some(&host_authority(1)),
        control_request(),
        30,
        TTL_MS,
    )
    .unwrap()
    .facts
    .reload();
    let effect_id = the_key().effect_id();
    assert_eq!(
        recover(&cancelled, &effect_id, RecoveryAction::Retry, OBSERVED, 40),
        Err(EffectRejection::RetryAfterTerminal {
            status: RunStatus::Cancelled
        })
    );
    let confirmed = recover(
        &cancelled,
        &effect_id,
        RecoveryAction::Confirm,
        OBSERVED,
        40,
    )
    .unwrap()
    .facts;
    assert_eq!(confirmed.effects[0].state, EffectState::Applied);
    assert_eq!(confirmed.run.status, RunStatus::Cancelled);
    assert_eq!(confirmed.run.park_reason, None);
}

// ---- cancellation and runner loss -----------------------------------------

const ALL_STATES: [EffectState; 6] = [
    EffectState::Reserved,
    EffectState::Applying,
    EffectState::Applied,
    EffectState::Rejected,
    EffectState::Cancelled,
    EffectState::Ambiguous,
];

#[test]
fn cancellation_cancels_pending_effects_and_makes_applying_ones_ambiguous() {
    for state in ALL_STATES {
        let expected = match state {
            EffectState::Reserved => EffectState::Cancelled,
            EffectState::Applying => EffectState::Ambiguous,
            settled => settled,
        };
        let next = on_run_cancelled(&record(state));
        assert_eq!(next.state, expected, "{state:?}");
        assert_eq!(
            EffectRecord {
                state,
                ..next.clone()
            },
            record(state),
            "only the state changes"
        );
    }
}

#[test]
fn runner_loss_makes_only_applying_effects_ambiguous() {
    for state in ALL_STATES {
        let expected = if state == EffectState::Applying {
            EffectState::Ambiguous
        } else {
            state
        };
        assert_eq!(on_runner_lost(&record(state)).state, expected, "{state:?}");
    }
}

#[test]
fn settled_states_are_exactly_the_ones_automatic_execution_never_touches() {
    let settled: Vec<_> = ALL_STATES.into_iter().filter(|s| s.is_settled()).collect();
    assert_eq!(
        settled,
        vec![
            EffectState::Applied,
            EffectState::Rejected,
            EffectState::Cancelled,
            EffectState::Ambiguous
        ]
    );
}

// ---- properties ------------------------------------------------------------

fn component() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![Just('a'), Just('/'), Just('%'), Just('2'), Just('F')],
        0..5,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn key() -> impl Strategy<Value = EffectKey> {
    (component(), component(), component(), 0u32..3).prop_map(|(run, kind, node, visit)| {
        EffectKey {
            run_id: RunId::new(run),
            effect_type: kind,
            node_path: NodeId::new(node),
            visit,
        }
    })
}

#[derive(Clone, Debug)]
enum Op {
    Reserve {
        fingerprint: u8,
    },
    Settle {
        rejected: bool,
        digest: u8,
    },
    LoseRunner,
    Readmit,
    Cancel,
    Recover(RecoveryAction),
    Pause,
    Resume,
    /// The server records the exit of the run's runner process (stopped
    /// or crashed).
    RunnerExits,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (7u8..9).prop_map(|fingerprint| Op::Reserve { fingerprint }),
        3 => (any::<bool>(), 0u8..2).prop_map(|(rejected, digest)| Op::Settle { rejected, digest }),
        9 => Just(Op::LoseRunner),
        12 => Just(Op::Readmit),
        1 => Just(Op::Cancel),
        2 => Just(Op::Recover(RecoveryAction::Confirm)),
        9 => Just(Op::Recover(RecoveryAction::Retry)),
        2 => Just(Op::Pause),
        3 => Just(Op::Resume),
        9 => Just(Op::RunnerExits),
    ]
}

/// The database as the harness sees it: the run aggregate plus every effect
/// row ever written (settled ones included).
struct World {
    agg: RunAggregate,
    rows: BTreeMap<EffectId, EffectRecord>,
    now_ms: u64,
}

impl World {
    fn generation(&self) -> u64 {
        self.agg.run.lease.generation.0
    }

    fn attempt_id(&self) -> AttemptId {
        self.agg
            .attempt
            .as_ref()
            .map_or_else(|| AttemptId::from("none"), |a| a.attempt_id.clone())
    }

    fn commit(&mut self, transition: Transition<RunAggregate>) {
        for effect in &transition.facts.effects {
            self.rows.insert(effect.effect_id.clone(), effect.clone());
        }
        self.agg = transition.facts.reload();
    }

    fn readmit(&self) -> Option<Transition<RunAggregate>> {
        let generation = self.generation() + 1;
        let admitted = run::admit(
            &self.agg,
            fixtures::runner_epoch(generation),
            fixtures::token(generation),
            self.now_ms,
            TTL_MS,
        )
        .ok()?;
        Some(fixtures::running(&admitted.facts, "act", self.now_ms))
    }
}

proptest! {
    /// The effect id never maps two different keys to one id.
    #[test]
    fn effect_ids_are_injective(a in key(), b in key()) {
        prop_assert_eq!(a == b, a.effect_id() == b.effect_id());
    }

    /// Random runner, operator and lifecycle interleavings: an effect is
    /// applied at most once per attempt number, an ambiguous effect moves only
    /// by confirm or retry, cancellation maps reserved→cancelled and
    /// applying→ambiguous, the fingerprint under a key never changes, and
    /// adoption and rejection never change any fact.
    #[test]
    fn effects_apply_at_most_once_per_attempt_number(ops in proptest::collection::vec(op(), 1..80)) {
        let mut world = World { agg: live(), rows: BTreeMap::new(), now_ms: 10 };
        let effect_id = the_key().effect_id();
        let mut applies: BTreeMap<u32, u32> = BTreeMap::new();
        let mut first_fingerprint: Option<Digest> = None;
        for op in ops {
            world.now_ms += 7;
            let now_ms = world.now_ms;
            let generation = world.generation();
            let host = host_authority(generation);
            let epoch = fixtures::runner_epoch(generation);
            let before = world.agg.clone();
            let row_before = world.rows.get(&effect_id).cloned();
            let outcome: Result<Option<Transition<RunAggregate>>, ()> = match op.clone() {
                Op::Reserve { fingerprint } => {
                    let request = ReserveRequest {
                        attempt_id: world.attempt_id(),
                        ..request(fingerprint)
                    };
                    match reserve(&before, &host, &epoch, request, row_before.as_ref(), now_ms, TTL_MS) {
                        Ok(Reserved::Apply { transition, attempt_number, .. }) => {
                            *applies.entry(attempt_number).or_default() += 1;
                            prop_assert_eq!(applies[&attempt_number], 1, "applied twice");
                            Ok(Some(transition))
                        }
                        Ok(Reserved::Adopt { effect }) => {
                            prop_assert_eq!(Some(&effect), row_before.as_ref());
                            prop_assert!(matches!(effect.state, EffectState::Applied | EffectState::Rejected));
                            Ok(None)
                        }
                        Err(_) => Err(()),
                    }
                }
                Op::Settle { rejected, digest } => {
                    let outcome = if rejected { SettleOutcome::Rejected } else { SettleOutcome::Applied };
                    let report = SettleReport { effect_id: effect_id.clone(), outcome, result_digest: Digest::repeat(digest) };
                    match settle(&before, &host, &epoch, report, row_before.as_ref(), now_ms, TTL_MS) {
                        Ok(Settled::Commit(transition)) => Ok(Some(transition)),
                        Ok(Settled::Adopt { effect }) => {
                            prop_assert_eq!(Some(&effect), row_before.as_ref());
                            Ok(None)
                        }
                        Err(_) => Err(()),
                    }
                }
                Op::LoseRunner => run::park(&before, &host, ParkReason::WorkerCrashed, now_ms).map(Some).map_err(|_| ()),
                Op::Readmit => world.readmit().map(Some).ok_or(()),
                Op::Cancel => run::cancel(&before, Some(&host), control_request(), now_ms, TTL_MS).map(Some).map_err(|_| ()),
                Op::Recover(action) => recover(&before, &effect_id, action, OBSERVED, now_ms).map(Some).map_err(|_| ()),
                Op::Pause => run::pause(&before, Some(&host), control_request(), now_ms, TTL_MS).map(Some).map_err(|_| ()),
                Op::Resume => {
                    let ids = run::ResumeIds { resumed_message_id: crate::ids::MessageId::from("m"), message_order: 1 };
                    run::resume(&before, ids, now_ms).map(Some).map_err(|_| ())
                }
                Op::RunnerExits => match before.run.live_runner() {
                    Some(_) => fixtures::try_runner_exited(&before, ExitKind::Abnormal, now_ms)
                        .map(Some)
                        .map_err(|_| ()),
                    None => Err(()),
                },
            };
            match outcome {
                Ok(Some(transition)) => {
                    // Readmission is two commits (admit, then ready); an exit
                    // that decides nothing for the run (it no longer holds a
                    // claim) is not progress.
                    let commits = match op {
                        Op::Readmit => 2,
                        Op::RunnerExits
                            if !run::RunRecord::pair_holds_claim(before.run.status, before.run.queue) => 0,
                        _ => 1,
                    };
                    prop_assert_eq!(transition.facts.run.revision.0, before.run.revision.0 + commits);
                    world.commit(transition);
                }
                Ok(None) | Err(()) => prop_assert_eq!(&world.agg, &before, "an adoption or rejection changed facts"),
            }
            let row_after = world.rows.get(&effect_id).cloned();
            if let Some(after) = &row_after {
                let first = *first_fingerprint.get_or_insert(after.request_fingerprint);
                prop_assert_eq!(after.request_fingerprint, first, "the fingerprint changed");
                prop_assert_eq!(&after.key, &the_key());
            }
            if let (Some(old), Some(new)) = (&row_before, &row_after) {
                if old.state == EffectState::Ambiguous && new.state != EffectState::Ambiguous {
                    prop_assert!(matches!(op, Op::Recover(_)), "{:?} moved an ambiguous effect", op);
                }
                if matches!(op, Op::Cancel) && old.state != new.state {
                    prop_assert!(matches!(
                        (old.state, new.state),
                        (EffectState::Reserved, EffectState::Cancelled)
                            | (EffectState::Applying, EffectState::Ambiguous)
                    ));
                }
                prop_assert!(new.attempt_number >= old.attempt_number);
            }
            if world.agg.run.status.is_terminal() {
                prop_assert!(world.agg.effects.iter().all(|e| e.state != EffectState::Applying
                    && e.state != EffectState::Reserved));
            }
            if world.agg.run.park_reason == Some(ParkReason::Recovered) {
                prop_assert!(!world.agg.has_ambiguous_effect());
            }
        }
    }
}

/// The node attempt of `applying()` reports its end while its effect is still
/// applying (its action was aborted after the apply began, or the runner never
/// settled it): the outcome is unknown, so the effect becomes ambiguous and is
/// never left applying.
#[test]
fn an_effect_still_applying_when_its_attempt_finishes_becomes_ambiguous() {
    for outcome in [NodeOutcome::Ok, NodeOutcome::Failed, NodeOutcome::TimedOut] {
        let agg = applying();
        let attempt = agg.attempt.clone().unwrap();
        let record = fixtures::result_record(
            attempt.attempt_id.as_str(),
            attempt.node_id.as_str(),
            outcome,
            serde_json::Value::Null,
        );
        let (step, _) = crate::execution::finish_attempt(
            &agg,
            &fixtures::chain(&["act", "next"]),
            crate::execution::Actor::Runner {
                authority: &host_authority(1),
                runner_epoch: &fixtures::runner_epoch(1),
            },
            &attempt.attempt_id,
            crate::execution::NodeResult { outcome, record },
            AttemptId::from("a-2-next"),
            NOW_MS + 1,
            TTL_MS,
        )
        .unwrap();
        assert_eq!(
            step.facts
                .effects
                .iter()
                .map(|e| e.state)
                .collect::<Vec<_>>(),
            vec![EffectState::Ambiguous],
            "{outcome:?}"
        );
    }
}

/// The runner ends the run while an effect applies: the run is terminal and
/// the effect ambiguous, never applying under a terminal run.
#[test]
fn a_run_that_ends_while_an_effect_applies_leaves_it_ambiguous() {
    for terminal in [
        run::Terminal::Completed,
        run::Terminal::Failed {
            error: run::RunError {
                class: run::FailureClass::NodeFailed,
                reason: run::ReasonKind::NodeFailed,
                node_id: None,
            },
        },
    ] {
        let step =
            run::finish(&applying(), Some(&host_authority(1)), terminal, NOW_MS + 1).unwrap();
        assert!(step.facts.run.status.is_terminal());
        assert_eq!(
            step.facts
                .effects
                .iter()
                .map(|e| e.state)
                .collect::<Vec<_>>(),
            vec![EffectState::Ambiguous]
        );
    }
}
