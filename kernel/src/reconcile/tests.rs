use super::*;
use alloc::vec::Vec;
use proptest::prelude::*;

const TOKEN: Digest = Digest::repeat(1);
const OTHER: Digest = Digest::repeat(2);

fn claimed(now_ms: u64) -> QueueRow {
    claim(&enqueue(None, now_ms), TOKEN, defaults::LEASE_MS, now_ms).unwrap()
}

#[test]
fn enqueue_keeps_the_earlier_time_and_counts_every_enqueue() {
    let row = enqueue(None, 500);
    assert_eq!((row.available_at_ms, row.version), (Some(500), 1));
    let later = enqueue(Some(&row), 900);
    assert_eq!((later.available_at_ms, later.version), (Some(500), 2));
    let sooner = enqueue(Some(&later), 100);
    assert_eq!((sooner.available_at_ms, sooner.version), (Some(100), 3));
}

#[test]
fn one_live_claim_and_an_expired_one_can_be_taken_over_with_a_higher_generation() {
    let row = claimed(0);
    assert_eq!(row.claim.unwrap().generation, 1);
    assert_eq!(
        claim(&row, OTHER, defaults::LEASE_MS, 10),
        Err(ReconcileRejection::NotClaimable)
    );
    let expiry = row.claim.unwrap().expires_at_ms;
    let taken = claim(&row, OTHER, defaults::LEASE_MS, expiry).unwrap();
    assert_eq!(taken.claim.unwrap().generation, 2);
    // The first worker's late result is refused and changes nothing.
    assert_eq!(
        finish(&taken, 1, &TOKEN, &Finished::Settled, expiry + 1),
        Err(ReconcileRejection::ClaimLost)
    );
    assert_eq!(
        renew(&taken, 1, &TOKEN, defaults::LEASE_MS, expiry + 1),
        Err(ReconcileRejection::ClaimLost)
    );
    // A row not yet available is not claimable.
    let future = enqueue(None, 1_000);
    assert_eq!(
        claim(&future, TOKEN, defaults::LEASE_MS, 999),
        Err(ReconcileRejection::NotClaimable)
    );
    assert_eq!(
        claim(&future, TOKEN, 10, 1_000),
        Err(ReconcileRejection::BadDuration)
    );
}

#[test]
fn an_expired_claim_cannot_settle_renew_or_fail() {
    let row = claimed(0);
    let expiry = row.claim.unwrap().expires_at_ms;
    for finished in [
        Finished::Settled,
        Finished::Requeue,
        Finished::Failed {
            error: "boom".into(),
            jitter_permille: 0,
        },
    ] {
        assert_eq!(
            finish(&row, 1, &TOKEN, &finished, expiry),
            Err(ReconcileRejection::ClaimLost)
        );
    }
    assert_eq!(
        finish(&row, 1, &OTHER, &Finished::Settled, 1),
        Err(ReconcileRejection::ClaimLost)
    );
    let renewed = renew(&row, 1, &TOKEN, defaults::LEASE_MS, 50_000).unwrap();
    assert_eq!(
        renewed.claim.unwrap().expires_at_ms,
        50_000 + defaults::LEASE_MS
    );
}

#[test]
fn a_settle_idles_the_row_unless_work_arrived_during_the_claim() {
    let row = claimed(0);
    let idle = finish(&row, 1, &TOKEN, &Finished::Settled, 5).unwrap();
    assert_eq!((idle.available_at_ms, idle.claim), (None, None));
    assert!(!claimable(&idle, u64::MAX));
    // The next enqueue wakes it, and its next claim has a higher generation.
    let woken = enqueue(Some(&idle), 9);
    assert_eq!(claim(&woken, OTHER, 1_000, 9).unwrap().generation, 2);
    let touched = enqueue(Some(&row), 3);
    let kept = finish(&touched, 1, &TOKEN, &Finished::Settled, 5).unwrap();
    assert_eq!(kept.available_at_ms, Some(5));
    assert!(kept.claim.is_none());
    assert!(claimable(&kept, 5));
}

#[test]
fn errors_back_off_exponentially_up_to_the_maximum_and_success_resets() {
    let mut row = claimed(0);
    let mut delays = Vec::new();
    for round in 0..8u64 {
        let now = round * 100_000;
        let Ok(next) = finish(
            &row,
            row.generation,
            &TOKEN,
            &Finished::Failed {
                error: "bad".into(),
                jitter_permille: 0,
            },
            now,
        ) else {
            panic!()
        };
        let available_at_ms = next.available_at_ms.unwrap();
        delays.push(available_at_ms - now);
        row = claim(&next, TOKEN, defaults::LEASE_MS, available_at_ms).unwrap();
    }
    assert_eq!(
        delays,
        [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]
    );
    assert_eq!(row.consecutive_errors, 8);
    assert_eq!(row.last_error.as_deref(), Some("bad"));
    let now = row.claim.unwrap().expires_at_ms - 1;
    let ok = finish(&row, row.generation, &TOKEN, &Finished::Requeue, now).unwrap();
    assert_eq!((ok.consecutive_errors, ok.last_error), (0, None));
    assert_eq!(ok.available_at_ms, Some(now));
}

#[test]
fn a_conflict_requeues_at_once_without_counting_an_error() {
    let row = claimed(0);
    let next = finish(&row, 1, &TOKEN, &Finished::Conflict, 7).unwrap();
    assert_eq!(
        (next.available_at_ms, next.consecutive_errors),
        (Some(7), 0)
    );
    let later = finish(&row, 1, &TOKEN, &Finished::RequeueAfter(250), 7).unwrap();
    assert_eq!(later.available_at_ms, Some(257));
    assert_eq!(
        finish(&row, 1, &TOKEN, &Finished::RequeueAfter(0), 7),
        Err(ReconcileRejection::BadDuration)
    );
}

#[test]
fn an_interrupted_pass_is_available_at_once_and_keeps_its_error_count() {
    let row = claimed(0);
    let failed = finish(
        &row,
        1,
        &TOKEN,
        &Finished::Failed {
            error: "boom".into(),
            jitter_permille: 0,
        },
        5,
    )
    .unwrap();
    let again = claim(&failed, TOKEN, defaults::LEASE_MS, 5_000).unwrap();
    let next = finish(&again, 2, &TOKEN, &Finished::Interrupted, 5_010).unwrap();
    assert_eq!(
        (
            next.available_at_ms,
            next.consecutive_errors,
            next.last_error.as_deref(),
            next.claim
        ),
        (Some(5_010), 1, Some("boom"), None)
    );
}

#[test]
fn only_the_live_claim_passes_the_check() {
    let row = claimed(0);
    assert_eq!(check_claim(&row, 1, &TOKEN, 10), Ok(()));
    assert_eq!(
        check_claim(&row, 1, &OTHER, 10),
        Err(ReconcileRejection::ClaimLost)
    );
    assert_eq!(
        check_claim(&row, 2, &TOKEN, 10),
        Err(ReconcileRejection::ClaimLost)
    );
    assert_eq!(
        check_claim(&row, 1, &TOKEN, defaults::LEASE_MS),
        Err(ReconcileRejection::ClaimLost)
    );
}

#[test]
fn an_abandoned_claim_is_released_at_start_up_and_an_idle_row_stays() {
    let row = claimed(0);
    let released = release_abandoned(&row, 40).unwrap();
    assert_eq!(
        (
            released.available_at_ms,
            released.claim,
            released.generation
        ),
        (Some(0), None, 1)
    );
    assert!(claimable(&released, 40));
    let idle = finish(&row, 1, &TOKEN, &Finished::Settled, 10).unwrap();
    assert_eq!(release_abandoned(&idle, 50), None);
}

#[test]
fn jitter_is_bounded_to_twenty_percent() {
    assert_eq!(backoff_ms(1, 1_000, 60_000, 200), 1_200);
    assert_eq!(backoff_ms(1, 1_000, 60_000, -200), 800);
    assert_eq!(backoff_ms(1, 1_000, 60_000, i16::MAX), 1_200);
    assert_eq!(backoff_ms(1, 1_000, 60_000, i16::MIN), 800);
    assert_eq!(backoff_ms(0, 1_000, 60_000, 0), 1_000);
    assert_eq!(backoff_ms(u32::MAX, 1_000, 60_000, 0), 60_000);
}

#[test]
fn a_long_error_is_cut_at_a_character_boundary() {
    let row = claimed(0);
    let error: alloc::string::String = "é".repeat(MAX_ERROR_BYTES);
    let next = finish(
        &row,
        1,
        &TOKEN,
        &Finished::Failed {
            error,
            jitter_permille: 0,
        },
        1,
    )
    .unwrap();
    assert!(next.last_error.unwrap().len() <= MAX_ERROR_BYTES);
}

#[derive(Clone, Debug)]
enum Op {
    Enqueue(u64),
    Claim(bool),
    Finish(u8),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..5_000u64).prop_map(Op::Enqueue),
        any::<bool>().prop_map(Op::Claim),
        (0..4u8).prop_map(Op::Finish),
        (0..200_000u64).prop_map(Op::Advance),
    ]
}

proptest! {
    /// Whatever interleaving of enqueues, claims by two workers, finishes
    /// and time: an enqueue is never lost (a row enqueued during its claim
    /// is still available after the settle), generations only grow, and a
    /// finish by anything but the live claim changes nothing.
    #[test]
    fn no_enqueue_is_lost_and_only_the_live_claim_finishes(ops in proptest::collection::vec(op(), 1..60)) {
        let mut now = 0u64;
        let mut row: Option<QueueRow> = None;
        let mut last_generation = 0u64;
        for op in ops {
            match op {
                Op::Enqueue(delay) => row = Some(enqueue(row.as_ref(), now + delay)),
                Op::Claim(second) => {
                    if let Some(current) = &row {
                        let token = if second { OTHER } else { TOKEN };
                        if let Ok(next) = claim(current, token, 1_000, now) {
                            prop_assert!(next.generation > last_generation);
                            last_generation = next.generation;
                            row = Some(next);
                        }
                    }
                }
                Op::Finish(kind) => {
                    if let Some(current) = row.clone() {
                        let finished = match kind {
                            0 => Finished::Settled,
                            1 => Finished::Requeue,
                            2 => Finished::Conflict,
                            _ => Finished::Failed { error: "x".into(), jitter_permille: 0 },
                        };
                        for token in [TOKEN, OTHER] {
                            match finish(&current, current.generation, &token, &finished, now) {
                                Ok(next) => {
                                    let claim = current.claim.unwrap();
                                    prop_assert!(claim.token_hash == token && now < claim.expires_at_ms);
                                    if next.available_at_ms.is_none() {
                                        prop_assert_eq!(current.version, claim.claimed_version);
                                    }
                                    prop_assert!(next.claim.is_none());
                                    row = Some(next);
                                    break;
                                }
                                Err(rejection) => prop_assert_eq!(rejection, ReconcileRejection::ClaimLost),
                            }
                        }
                    }
                }
                Op::Advance(ms) => now += ms,
            }
        }
    }
}
