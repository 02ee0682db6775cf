use super::*;
use crate::claim::ClaimLostReason;
use crate::fixtures::{self, TTL_MS, admitted, control_request, host_authority, running};
use crate::ids::RunId;
use crate::interaction::InteractionRecord;
use crate::output::Output;
use crate::run::{QueueStatus, RunStatus, Terminal};
use alloc::collections::BTreeMap;
use alloc::collections::BTreeSet;
use alloc::vec::Vec;
use proptest::prelude::*;

// ---- builders ----------------------------------------------------------------

/// An interactive run `running/running` on node `work` (attempt `a-1-work`),
/// generation 1, claim live until t=1010.
fn live() -> RunAggregate {
    let agg = admitted(&fixtures::reserved_interactive(1, 0), 5).facts;
    running(&agg, "work", 10).facts
}

fn interaction(kind: InteractionKind) -> InteractionRecord {
    InteractionRecord {
        interaction_id: InteractionId::from("i-1"),
        run_id: RunId::from("run-1"),
        attempt_id: AttemptId::from("a-1-work"),
        node_id: NodeId::from("work"),
        target_session: Some(SessionId::from("s-1")),
        kind,
        contract_hash: Digest::repeat(3),
        status: InteractionStatus::Pending,
        accepted_submission: None,
        unproductive_turn_ends: 0,
        revision: 1,
        clock: crate::interaction::TurnClock::default(),
        created_at_ms: 20,
    }
}

/// The live run, now `waiting/parked` on a pending request of `kind` at t=20.
fn waiting(kind: InteractionKind) -> RunAggregate {
    let mut tx = Tx::begin(&live(), 20);
    tx.agg.attempt.as_mut().unwrap().status = AttemptStatus::Waiting;
    run::wait_in(&mut tx, &host_authority(1), NodeId::from("work"), false).unwrap();
    tx.agg.interaction = Some(interaction(kind));
    tx.commit().facts
}

fn runner_source() -> UpdateSource {
    UpdateSource::Runner {
        authority: host_authority(1),
        runner_epoch: fixtures::runner_epoch(1),
        ttl_ms: TTL_MS,
    }
}

fn agent_source() -> UpdateSource {
    UpdateSource::AgentTool {
        session_id: SessionId::from("s-1"),
        interaction_id: InteractionId::from("i-1"),
    }
}

fn data(byte: u8) -> UpdateData {
    UpdateData {
        kind: JsonKind::Object,
        encoded_bytes: 20,
        depth: 1,
        digest: Digest::repeat(byte),
    }
}

fn input(idempotency_key: &str, key: &str) -> UpdateInput {
    UpdateInput {
        idempotency_key: IdempotencyKey::from(idempotency_key),
        update_id: UpdateId::new(alloc::format!("upd_{idempotency_key}")),
        attempt_id: AttemptId::from("a-1-work"),
        update_type: String::from("progress"),
        key: String::from(key),
        data: data(1),
    }
}

fn fresh() -> UpdateLookup<'static> {
    UpdateLookup {
        by_idempotency_key: None,
        pair_is_current: false,
    }
}

fn accepted(decision: Result<UpdateDecision, UpdateRejection>) -> Transition<Updated> {
    match decision {
        Ok(UpdateDecision::Accepted(transition)) => transition,
        other => panic!("expected acceptance, got {other:?}"),
    }
}

fn rejection(decision: Result<UpdateDecision, UpdateRejection>) -> UpdateRejection {
    match decision {
        Err(rejection) => rejection,
        Ok(other) => panic!("expected a rejection, got {other:?}"),
    }
}

// ---- pattern matchers --------------------------------------------------------

#[test]
fn type_pattern_examples() {
    let longest = "a".repeat(MAX_TYPE_BYTES);
    for valid in [
        "progress",
        "a",
        "command-batch.item",
        "a9.-",
        longest.as_str(),
    ] {
        assert!(is_valid_type(valid), "{valid}");
    }
    let too_long = "a".repeat(MAX_TYPE_BYTES + 1);
    for invalid in [
        "",
        "Progress",
        "9a",
        ".a",
        "-a",
        "a_b",
        "a b",
        "a/b",
        "é",
        "aé",
        too_long.as_str(),
    ] {
        assert!(!is_valid_type(invalid), "{invalid}");
    }
}

#[test]
fn key_pattern_examples() {
    let longest = "K".repeat(MAX_KEY_BYTES);
    for valid in [
        "overall",
        "A",
        "0",
        "Live-Agent",
        "a/b:c.d-e_f",
        longest.as_str(),
    ] {
        assert!(is_valid_key(valid), "{valid}");
    }
    let too_long = "K".repeat(MAX_KEY_BYTES + 1);
    for invalid in [
        "",
        "-a",
        ".a",
        "_a",
        ":a",
        "/a",
        "a b",
        "a\n",
        "aé",
        too_long.as_str(),
    ] {
        assert!(!is_valid_key(invalid), "{invalid}");
    }
}

#[test]
fn keys_are_case_sensitive_pairs() {
    assert!(is_valid_key("Overall") && is_valid_key("overall"));
    let agg = waiting(InteractionKind::SubmittedOutput);
    let first = accepted(publish(
        &agg,
        &UpdateFacts::new(0),
        fresh(),
        &agent_source(),
        input("k1", "overall"),
        30,
    ));
    let second = accepted(publish(
        &first.facts.run,
        &first.facts.facts,
        fresh(),
        &agent_source(),
        input("k2", "Overall"),
        31,
    ));
    assert_eq!(second.facts.facts.current_pairs, 2);
}

// ---- token bucket ------------------------------------------------------------

#[test]
fn a_full_bucket_stays_full_and_forgets_idle_time() {
    let bucket = TokenBucket::full(0).refilled(10_000);
    assert_eq!(
        bucket,
        TokenBucket {
            tokens: BUCKET_BURST,
            refilled_at_ms: 10_000
        }
    );
}

#[test]
fn refill_earns_one_token_per_interval_and_carries_the_remainder() {
    let empty = TokenBucket {
        tokens: 0,
        refilled_at_ms: 1_000,
    };
    assert_eq!(empty.refilled(1_049), empty);
    let one = empty.refilled(1_070);
    assert_eq!(
        one,
        TokenBucket {
            tokens: 1,
            refilled_at_ms: 1_050
        }
    );
    // The 20 ms carried from the last refill count toward the next token.
    assert_eq!(one.refilled(1_100).tokens, 2);
    assert_eq!(empty.refilled(1_000 + 20 * REFILL_INTERVAL_MS).tokens, 20);
    assert_eq!(empty.next_token_at_ms(), 1_050);
}

#[test]
fn a_clock_that_goes_backwards_earns_nothing() {
    let bucket = TokenBucket {
        tokens: 3,
        refilled_at_ms: 1_000,
    };
    assert_eq!(bucket.refilled(10), bucket);
}

// ---- accepted updates --------------------------------------------------------

#[test]
fn a_runner_update_commits_one_revision_and_renews_the_claim() {
    let agg = live();
    let facts = UpdateFacts::new(0);
    let transition = accepted(publish(
        &agg,
        &facts,
        fresh(),
        &runner_source(),
        input("m-1", "overall"),
        500,
    ));
    let updated = &transition.facts;
    assert_eq!(updated.run.run.revision, agg.run.revision.next());
    assert_eq!(
        updated.run.run.lease.claim.as_ref().unwrap().expires_at_ms,
        500 + TTL_MS
    );
    assert_eq!(
        (updated.run.run.status, updated.run.run.queue),
        (RunStatus::Running, QueueStatus::Running)
    );
    assert_eq!(
        updated.run.attempt, agg.attempt,
        "an update never finishes a node"
    );
    assert_eq!(updated.facts.current_pairs, 1);
    assert_eq!(updated.facts.bucket.tokens, BUCKET_BURST - 1);
    assert_eq!(updated.receipt.seq, updated.run.run.revision);
    assert_eq!(updated.receipt.update_id, UpdateId::new("upd_m-1"));
    assert_eq!(updated.receipt.at_ms, 500);
    assert_eq!(
        updated.current,
        CurrentUpdate {
            update_type: String::from("progress"),
            key: String::from("overall"),
            update_id: UpdateId::new("upd_m-1"),
            seq: updated.run.run.revision,
            node_id: NodeId::from("work"),
            attempt_id: AttemptId::from("a-1-work"),
            data_digest: Digest::repeat(1),
            at_ms: 500,
        }
    );
    assert_eq!(
        transition.outputs,
        [
            Output::Event {
                run_id: RunId::from("run-1"),
                event: RunEvent::UpdatePublished {
                    update_id: UpdateId::new("upd_m-1"),
                    update_type: String::from("progress"),
                    key: String::from("overall"),
                    data_digest: Digest::repeat(1),
                },
            },
            Output::PublishRun {
                run_id: RunId::from("run-1"),
                revision: updated.run.run.revision,
            },
        ]
    );
}

#[test]
fn an_agent_update_on_its_waiting_step_leaves_the_run_waiting() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let transition = accepted(publish(
        &agg,
        &UpdateFacts::new(0),
        fresh(),
        &agent_source(),
        input("call-1", "overall"),
        30,
    ));
    let run = &transition.facts.run;
    assert_eq!(
        (run.run.status, run.run.queue),
        (RunStatus::Waiting, QueueStatus::Parked)
    );
    assert_eq!(run.run.lease.claim, None);
    assert_eq!(run.interaction, agg.interaction);
    assert_eq!(
        transition.facts.receipt.fingerprint.origin,
        UpdateOrigin::AgentTool {
            session_id: SessionId::from("s-1")
        }
    );
}

#[test]
fn replacing_a_current_pair_does_not_count_it_again() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let full = UpdateFacts {
        bucket: TokenBucket::full(0),
        current_pairs: MAX_CURRENT_PAIRS,
    };
    let replace = UpdateLookup {
        by_idempotency_key: None,
        pair_is_current: true,
    };
    let transition = accepted(publish(
        &agg,
        &full,
        replace,
        &agent_source(),
        input("call-1", "overall"),
        30,
    ));
    assert_eq!(transition.facts.facts.current_pairs, MAX_CURRENT_PAIRS);
}

#[test]
fn a_replay_returns_the_first_receipt_even_after_the_run_ended() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let first = accepted(publish(
        &agg,
        &UpdateFacts::new(0),
        fresh(),
        &agent_source(),
        input("call-1", "overall"),
        30,
    ));
    let receipt = first.facts.receipt.clone();
    let stored = UpdateLookup {
        by_idempotency_key: Some(&receipt),
        pair_is_current: true,
    };
    let mut redelivered = input("call-1", "overall");
    redelivered.update_id = UpdateId::new("upd_other");
    assert_eq!(
        publish(
            &first.facts.run,
            &first.facts.facts,
            stored,
            &agent_source(),
            redelivered.clone(),
            40,
        ),
        Ok(UpdateDecision::Replayed(receipt.clone()))
    );
    let cancelled = run::cancel(&first.facts.run, None, control_request(), 50, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        publish(
            &cancelled,
            &first.facts.facts,
            stored,
            &agent_source(),
            redelivered,
            60
        ),
        Ok(UpdateDecision::Replayed(receipt))
    );
}

// ---- one test per rejection ----------------------------------------------------

#[test]
fn another_update_under_a_used_key_is_a_conflict() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let first = accepted(publish(
        &agg,
        &UpdateFacts::new(0),
        fresh(),
        &agent_source(),
        input("call-1", "overall"),
        30,
    ));
    let stored = UpdateLookup {
        by_idempotency_key: Some(&first.facts.receipt),
        pair_is_current: true,
    };
    let mut other_data = input("call-1", "overall");
    other_data.data = data(2);
    let other_key = input("call-1", "phase");
    let other_session = UpdateSource::AgentTool {
        session_id: SessionId::from("s-2"),
        interaction_id: InteractionId::from("i-1"),
    };
    for (source, update, expected) in [
        (
            agent_source(),
            other_data,
            UpdateRejection::IdempotencyConflict,
        ),
        (
            agent_source(),
            other_key,
            UpdateRejection::IdempotencyConflict,
        ),
        // Another session is refused before the receipt is looked up.
        (
            other_session,
            input("call-1", "overall"),
            UpdateRejection::WrongSession,
        ),
    ] {
        assert_eq!(
            rejection(publish(
                &first.facts.run,
                &first.facts.facts,
                stored,
                &source,
                update,
                40
            )),
            expected
        );
    }
}

fn reject_input(update: UpdateInput) -> UpdateRejection {
    let agg = waiting(InteractionKind::SubmittedOutput);
    rejection(publish(
        &agg,
        &UpdateFacts::new(0),
        fresh(),
        &agent_source(),
        update,
        30,
    ))
}

#[test]
fn an_invalid_type_is_rejected() {
    let mut update = input("call-1", "overall");
    update.update_type = String::from("Progress");
    assert_eq!(reject_input(update), UpdateRejection::InvalidType);
}

#[test]
fn an_invalid_key_is_rejected() {
    assert_eq!(
        reject_input(input("call-1", "-overall")),
        UpdateRejection::InvalidKey
    );
}

#[test]
fn data_must_be_a_non_null_object() {
    for kind in [
        JsonKind::Null,
        JsonKind::Bool,
        JsonKind::Number,
        JsonKind::String,
        JsonKind::Array,
    ] {
        let mut update = input("call-1", "overall");
        update.data.kind = kind;
        assert_eq!(
            reject_input(update),
            UpdateRejection::DataNotObject { kind }
        );
    }
}

#[test]
fn data_may_be_at_most_64_kib() {
    let mut update = input("call-1", "overall");
    update.data.encoded_bytes = MAX_DATA_BYTES;
    let agg = waiting(InteractionKind::SubmittedOutput);
    assert!(
        publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &agent_source(),
            update.clone(),
            30
        )
        .is_ok()
    );
    update.data.encoded_bytes = MAX_DATA_BYTES + 1;
    assert_eq!(
        reject_input(update),
        UpdateRejection::DataTooLarge {
            encoded_bytes: MAX_DATA_BYTES + 1
        }
    );
}

#[test]
fn data_nests_at_most_the_depth_its_deepest_frame_leaves() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let mut update = input("call-1", "overall");
    update.data.depth = MAX_DATA_DEPTH;
    assert!(
        publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &agent_source(),
            update.clone(),
            30
        )
        .is_ok()
    );
    update.data.depth = MAX_DATA_DEPTH + 1;
    assert_eq!(
        reject_input(update),
        UpdateRejection::DataTooDeep {
            depth: MAX_DATA_DEPTH + 1
        }
    );
}

#[test]
fn a_terminal_run_accepts_no_update() {
    let agg = live();
    let done = run::finish(&agg, Some(&host_authority(1)), Terminal::Completed, 30)
        .unwrap()
        .facts;
    assert_eq!(
        rejection(publish(
            &done,
            &UpdateFacts::new(0),
            fresh(),
            &runner_source(),
            input("m-1", "k"),
            40
        )),
        UpdateRejection::Run(run::Rejection::Terminal {
            status: RunStatus::Completed
        })
    );
}

#[test]
fn a_paused_run_accepts_no_update() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let paused = run::pause(&agg, None, control_request(), 30, TTL_MS)
        .unwrap()
        .facts;
    assert_eq!(
        rejection(publish(
            &paused,
            &UpdateFacts::new(0),
            fresh(),
            &agent_source(),
            input("c", "k"),
            40
        )),
        UpdateRejection::Run(run::Rejection::Paused)
    );
}

#[test]
fn a_runner_without_the_live_claim_is_refused() {
    let agg = live();
    let stale = UpdateSource::Runner {
        authority: crate::claim::Authority {
            token_hash: Digest::repeat(0xee),
            ..host_authority(1)
        },
        runner_epoch: fixtures::runner_epoch(1),
        ttl_ms: TTL_MS,
    };
    assert_eq!(
        rejection(publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &stale,
            input("m-1", "k"),
            30
        )),
        UpdateRejection::Run(run::Rejection::ClaimLost {
            reason: ClaimLostReason::TokenChanged
        })
    );
    // An expired claim never renews itself through an update.
    assert_eq!(
        rejection(publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &runner_source(),
            input("m-1", "k"),
            10 + TTL_MS
        )),
        UpdateRejection::Run(run::Rejection::ClaimLost {
            reason: ClaimLostReason::Expired
        })
    );
}

#[test]
fn another_runner_epoch_is_stale() {
    let agg = live();
    let other = UpdateSource::Runner {
        authority: host_authority(1),
        runner_epoch: fixtures::runner_epoch(9),
        ttl_ms: TTL_MS,
    };
    assert_eq!(
        rejection(publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &other,
            input("m-1", "k"),
            30
        )),
        UpdateRejection::Run(run::Rejection::StaleRunner)
    );
}

#[test]
fn a_run_without_an_unfinished_attempt_is_refused() {
    let mut agg = live();
    agg.attempt = None;
    assert_eq!(
        rejection(publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &runner_source(),
            input("m-1", "k"),
            30
        )),
        UpdateRejection::NoUnfinishedAttempt
    );
    let mut abandoned = live();
    abandoned.attempt.as_mut().unwrap().status = AttemptStatus::Abandoned;
    assert_eq!(
        rejection(publish(
            &abandoned,
            &UpdateFacts::new(0),
            fresh(),
            &runner_source(),
            input("m-1", "k"),
            30
        )),
        UpdateRejection::NoUnfinishedAttempt
    );
}

#[test]
fn another_attempt_id_is_refused() {
    let mut update = input("m-1", "k");
    update.attempt_id = AttemptId::from("a-0-work");
    assert_eq!(
        rejection(publish(
            &live(),
            &UpdateFacts::new(0),
            fresh(),
            &runner_source(),
            update,
            30
        )),
        UpdateRejection::AttemptMismatch
    );
}

#[test]
fn a_runner_cannot_update_a_waiting_attempt() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    assert_eq!(
        rejection(publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &runner_source(),
            input("m-1", "k"),
            30
        )),
        UpdateRejection::AttemptNotActive
    );
}

#[test]
fn the_agent_tool_cannot_update_an_active_attempt() {
    assert_eq!(
        rejection(publish(
            &live(),
            &UpdateFacts::new(0),
            fresh(),
            &agent_source(),
            input("c", "k"),
            30
        )),
        // An active attempt has no pending request to name (checked before
        // the receipt lookup).
        UpdateRejection::RequestMismatch
    );
}

#[test]
fn the_agent_tool_must_name_the_pending_request() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let other = UpdateSource::AgentTool {
        session_id: SessionId::from("s-1"),
        interaction_id: InteractionId::from("i-0"),
    };
    assert_eq!(
        rejection(publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &other,
            input("c", "k"),
            30
        )),
        UpdateRejection::RequestMismatch
    );
    let mut settled = agg.clone();
    settled.interaction.as_mut().unwrap().status = InteractionStatus::Accepted;
    assert_eq!(
        rejection(publish(
            &settled,
            &UpdateFacts::new(0),
            fresh(),
            &agent_source(),
            input("c", "k"),
            30
        )),
        UpdateRejection::RequestMismatch
    );
}

#[test]
fn a_visible_response_step_takes_no_update() {
    let agg = waiting(InteractionKind::AssistantMessage);
    assert_eq!(
        rejection(publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &agent_source(),
            input("c", "k"),
            30
        )),
        UpdateRejection::NotAgentStep
    );
}

#[test]
fn another_session_cannot_update_the_request() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let other = UpdateSource::AgentTool {
        session_id: SessionId::from("s-2"),
        interaction_id: InteractionId::from("i-1"),
    };
    assert_eq!(
        rejection(publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &other,
            input("c", "k"),
            30
        )),
        UpdateRejection::WrongSession
    );
}

#[test]
fn a_new_pair_beyond_the_limit_is_refused() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let full = UpdateFacts {
        bucket: TokenBucket::full(0),
        current_pairs: MAX_CURRENT_PAIRS,
    };
    assert_eq!(
        rejection(publish(
            &agg,
            &full,
            fresh(),
            &agent_source(),
            input("c", "k"),
            30
        )),
        UpdateRejection::TooManyPairs
    );
}

#[test]
fn an_empty_bucket_is_rate_limited_until_the_next_token() {
    let agg = waiting(InteractionKind::SubmittedOutput);
    let empty = UpdateFacts {
        bucket: TokenBucket {
            tokens: 0,
            refilled_at_ms: 1_000,
        },
        current_pairs: 0,
    };
    assert_eq!(
        rejection(publish(
            &agg,
            &empty,
            fresh(),
            &agent_source(),
            input("c", "k"),
            1_030
        )),
        UpdateRejection::RateLimited { retry_at_ms: 1_050 }
    );
    let transition = accepted(publish(
        &agg,
        &empty,
        fresh(),
        &agent_source(),
        input("c", "k"),
        1_050,
    ));
    assert_eq!(
        transition.facts.facts.bucket,
        TokenBucket {
            tokens: 0,
            refilled_at_ms: 1_050
        }
    );
}

#[test]
fn a_burst_of_100_then_20_per_second() {
    let mut agg = waiting(InteractionKind::SubmittedOutput);
    let mut facts = UpdateFacts::new(0);
    let mut accepted_count = 0;
    for n in 0..150u32 {
        let update = input(&alloc::format!("c-{n}"), "overall");
        match publish(&agg, &facts, fresh(), &agent_source(), update, 100) {
            Ok(UpdateDecision::Accepted(transition)) => {
                agg = transition.facts.run;
                facts = transition.facts.facts;
                accepted_count += 1;
            }
            Err(UpdateRejection::RateLimited { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(accepted_count, BUCKET_BURST);
    // One second later exactly 20 more fit.
    facts.current_pairs = 0;
    let mut later = 0;
    for n in 0..40u32 {
        let update = input(&alloc::format!("d-{n}"), "overall");
        if let Ok(UpdateDecision::Accepted(transition)) =
            publish(&agg, &facts, fresh(), &agent_source(), update, 1_100)
        {
            agg = transition.facts.run;
            facts = transition.facts.facts;
            later += 1;
        }
    }
    assert_eq!(later, 20);
}

// ---- properties ------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    /// Publish under idempotency key `call` for pair `pair` with data `byte`.
    Publish {
        call: u8,
        pair: u8,
        byte: u8,
    },
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (any::<u8>(), 0u8..12, 0u8..2).prop_map(|(call, pair, byte)| Op::Publish { call, pair, byte }),
        1 => (0u64..120).prop_map(Op::Advance),
    ]
}

proptest! {
    /// Every string of the type pattern is accepted; appending any byte
    /// outside the tail class, or a 65th character, is rejected.
    #[test]
    fn type_matcher_agrees_with_the_pattern(valid in "[a-z][a-z0-9.-]{0,63}", bad in "[^a-z0-9.-]") {
        prop_assert!(is_valid_type(&valid));
        let mut with_bad = valid.clone();
        with_bad.push_str(&bad);
        prop_assert!(!is_valid_type(&with_bad));
        let mut too_long = valid.clone();
        while too_long.len() <= MAX_TYPE_BYTES { too_long.push('a'); }
        prop_assert!(!is_valid_type(&too_long));
    }

    /// Every string of the key pattern is accepted; a bad byte or a 129th
    /// character is rejected.
    #[test]
    fn key_matcher_agrees_with_the_pattern(valid in "[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}", bad in "[^A-Za-z0-9._:/-]") {
        prop_assert!(is_valid_key(&valid));
        let mut with_bad = valid.clone();
        with_bad.push_str(&bad);
        prop_assert!(!is_valid_key(&with_bad));
        let mut too_long = valid.clone();
        while too_long.len() <= MAX_KEY_BYTES { too_long.push('K'); }
        prop_assert!(!is_valid_key(&too_long));
    }

    /// Over random publish and time sequences: accepted updates never exceed
    /// the bucket (burst plus one per interval, in any window), the pair count
    /// never exceeds the limit and matches the distinct pairs, and a replay of
    /// a used key returns its first receipt while another update under it is
    /// a conflict.
    #[test]
    fn updates_respect_bucket_pairs_and_idempotency(
        base_pairs in (MAX_CURRENT_PAIRS - 8)..=MAX_CURRENT_PAIRS,
        ops in proptest::collection::vec(op(), 1..400),
    ) {
        let mut agg = waiting(InteractionKind::SubmittedOutput);
        let mut facts = UpdateFacts { bucket: TokenBucket::full(0), current_pairs: base_pairs };
        let mut pairs: BTreeSet<u8> = BTreeSet::new();
        let mut receipts: BTreeMap<u8, UpdateReceipt> = BTreeMap::new();
        let mut accepted_at: Vec<u64> = Vec::new();
        let mut now_ms = 0u64;
        for op in ops {
            let (call, pair, byte) = match op {
                Op::Advance(ms) => { now_ms += ms; continue; }
                Op::Publish { call, pair, byte } => (call, pair, byte),
            };
            let mut update = input(&alloc::format!("call-{call}"), &alloc::format!("k{pair}"));
            update.data = data(byte);
            let lookup = UpdateLookup {
                by_idempotency_key: receipts.get(&call),
                pair_is_current: pairs.contains(&pair),
            };
            match publish(&agg, &facts, lookup, &agent_source(), update.clone(), now_ms) {
                Ok(UpdateDecision::Accepted(transition)) => {
                    prop_assert!(!receipts.contains_key(&call));
                    prop_assert_eq!(transition.facts.run.run.revision, agg.run.revision.next());
                    agg = transition.facts.run;
                    facts = transition.facts.facts;
                    pairs.insert(pair);
                    receipts.insert(call, transition.facts.receipt);
                    accepted_at.push(now_ms);
                }
                Ok(UpdateDecision::Replayed(receipt)) => {
                    let stored = receipts.get(&call).unwrap();
                    prop_assert_eq!(&receipt, stored);
                    prop_assert_eq!(&receipt.fingerprint, &UpdateFingerprint::of(&agent_source(), &update));
                }
                Err(UpdateRejection::IdempotencyConflict) => {
                    let stored = receipts.get(&call).unwrap();
                    prop_assert_ne!(&stored.fingerprint, &UpdateFingerprint::of(&agent_source(), &update));
                }
                Err(UpdateRejection::TooManyPairs) => {
                    prop_assert!(!pairs.contains(&pair));
                    prop_assert_eq!(facts.current_pairs, MAX_CURRENT_PAIRS);
                }
                Err(UpdateRejection::RateLimited { retry_at_ms }) => prop_assert!(retry_at_ms > now_ms),
                Err(other) => prop_assert!(false, "unexpected {:?}", other),
            }
            prop_assert!(facts.current_pairs <= MAX_CURRENT_PAIRS);
            prop_assert!(facts.bucket.tokens <= BUCKET_BURST);
            let new_pairs = u32::try_from(pairs.len()).unwrap();
            prop_assert_eq!(facts.current_pairs, base_pairs + new_pairs);
        }
        let burst = u64::from(BUCKET_BURST);
        for (i, start) in accepted_at.iter().enumerate() {
            for (j, end) in accepted_at.iter().enumerate().skip(i) {
                let count = (j - i + 1) as u64;
                prop_assert!(count <= burst + (end - start) / REFILL_INTERVAL_MS + 1,
                    "{} updates between {} and {}", count, start, end);
            }
        }
        if let Some(last) = accepted_at.last() {
            prop_assert!(accepted_at.len() as u64 <= burst + last / REFILL_INTERVAL_MS);
        }
    }
}

// ---- the headless agent tool (interaction.update with the runner's authority) ----

/// A headless run `running/running` on `work` (attempt `a-1-work`, still
/// `Active` under the live runner's claim) with a pending request of `kind`
/// that has no origin session.
fn headless_on_request(kind: InteractionKind) -> RunAggregate {
    let agg = admitted(&fixtures::reserved(1, 0), 5).facts;
    let mut agg = running(&agg, "work", 10).facts;
    agg.interaction = Some(InteractionRecord {
        target_session: None,
        ..interaction(kind)
    });
    agg
}

fn headless_source() -> UpdateSource {
    UpdateSource::HeadlessTool {
        generation: crate::ids::Generation(1),
        runner_epoch: fixtures::runner_epoch(1),
        interaction_id: InteractionId::from("i-1"),
    }
}

#[test]
fn a_headless_tool_update_publishes_for_the_active_attempt_and_a_repeat_adopts() {
    let agg = headless_on_request(InteractionKind::SubmittedOutput);
    let first = accepted(publish(
        &agg,
        &UpdateFacts::new(0),
        fresh(),
        &headless_source(),
        input("call-1", "overall"),
        30,
    ));
    assert_eq!(first.facts.run.run.revision.0, agg.run.revision.0 + 1);
    assert_eq!(first.facts.current.attempt_id, AttemptId::from("a-1-work"));
    assert_eq!(first.facts.current.node_id, NodeId::from("work"));
    assert_eq!(
        first.facts.run.attempt.as_ref().unwrap().status,
        AttemptStatus::Active,
        "an update never completes the step"
    );
    let stored = UpdateLookup {
        by_idempotency_key: Some(&first.facts.receipt),
        pair_is_current: true,
    };
    // The identical repeat adopts the first receipt, even after the request settled.
    let mut settled = first.facts.run.clone();
    settled.interaction.as_mut().unwrap().status = InteractionStatus::Accepted;
    for run in [&first.facts.run, &settled] {
        assert_eq!(
            publish(
                run,
                &first.facts.facts,
                stored,
                &headless_source(),
                input("call-1", "overall"),
                40
            ),
            Ok(UpdateDecision::Replayed(first.facts.receipt.clone()))
        );
    }
    // The same key with another payload conflicts.
    let mut other = input("call-1", "overall");
    other.data = data(2);
    assert_eq!(
        rejection(publish(
            &first.facts.run,
            &first.facts.facts,
            stored,
            &headless_source(),
            other,
            40
        )),
        UpdateRejection::IdempotencyConflict
    );
    // A new update after settlement has no pending request.
    assert_eq!(
        rejection(publish(
            &settled,
            &first.facts.facts,
            fresh(),
            &headless_source(),
            input("call-2", "overall"),
            40
        )),
        UpdateRejection::RequestMismatch
    );
}

#[test]
fn a_headless_tool_update_is_checked_for_its_authority_before_its_receipt() {
    let agg = headless_on_request(InteractionKind::SubmittedOutput);
    let first = accepted(publish(
        &agg,
        &UpdateFacts::new(0),
        fresh(),
        &headless_source(),
        input("call-1", "overall"),
        30,
    ));
    let stored = UpdateLookup {
        by_idempotency_key: Some(&first.facts.receipt),
        pair_is_current: true,
    };
    let with = |generation: u64, epoch: u64, interaction: &str| UpdateSource::HeadlessTool {
        generation: crate::ids::Generation(generation),
        runner_epoch: fixtures::runner_epoch(epoch),
        interaction_id: InteractionId::from(interaction),
    };
    let stale = UpdateRejection::Run(run::Rejection::StaleRunner);
    for (source, expected) in [
        (with(2, 1, "i-1"), stale.clone()),
        (with(1, 9, "i-1"), stale),
        (with(1, 1, "i-2"), UpdateRejection::RequestMismatch),
    ] {
        // A stored receipt under the same key is never consulted first.
        for lookup in [fresh(), stored] {
            assert_eq!(
                rejection(publish(
                    &first.facts.run,
                    &first.facts.facts,
                    lookup,
                    &source,
                    input("call-1", "overall"),
                    40
                )),
                expected
            );
        }
    }
    // Another attempt than the request's.
    let mut other_attempt = input("call-3", "overall");
    other_attempt.attempt_id = AttemptId::from("a-2-work");
    assert_eq!(
        rejection(publish(
            &agg,
            &UpdateFacts::new(0),
            fresh(),
            &headless_source(),
            other_attempt,
            30
        )),
        UpdateRejection::RequestMismatch
    );
    // An assistant-message request takes no tool update.
    let assistant = headless_on_request(InteractionKind::AssistantMessage);
    assert_eq!(
        rejection(publish(
            &assistant,
            &UpdateFacts::new(0),
            fresh(),
            &headless_source(),
            input("call-1", "overall"),
            30
        )),
        UpdateRejection::NotAgentStep
    );
    // A runner's authority for an interactive run.
    assert_eq!(
        rejection(publish(
            &waiting(InteractionKind::SubmittedOutput),
            &UpdateFacts::new(0),
            fresh(),
            &headless_source(),
            input("call-1", "overall"),
            30
        )),
        UpdateRejection::NotHeadless
    );
    // A paused headless run accepts no new update.
    let mut paused = agg.clone();
    paused.run.paused = true;
    assert_eq!(
        rejection(publish(
            &paused,
            &UpdateFacts::new(0),
            fresh(),
            &headless_source(),
            input("call-4", "overall"),
            30
        )),
        UpdateRejection::Run(run::Rejection::Paused)
    );
}
