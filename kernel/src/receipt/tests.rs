use super::*;
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use proptest::prelude::*;

fn identity() -> CommandIdentity {
    CommandIdentity {
        client_id: ClientId::from("c-1"),
        operation: CommandOperation::RunCancel,
        idempotency_key: IdempotencyKey::from("k-1"),
        run_id: Some(RunId::from("run-1")),
        expected_revision: Some(Revision(12)),
        payload_digest: Digest::repeat(1),
    }
}

fn incoming(request_id: &str, identity: CommandIdentity) -> Incoming {
    Incoming {
        request_id: RequestId::from(request_id),
        identity,
    }
}

fn stored(request_id: &str, outcome: CommandOutcome) -> StoredCommand {
    record(
        &incoming(request_id, identity()),
        outcome,
        Some(Revision(13)),
        Digest::repeat(0xaa),
        100,
    )
    .expect("durable outcome")
}

// ---- operations and outcomes ----------------------------------------------

#[test]
fn every_operation_round_trips_through_its_wire_name() {
    for operation in CommandOperation::ALL {
        assert_eq!(
            CommandOperation::from_wire(operation.wire_name()),
            Some(operation)
        );
        let json = serde_json::to_string(&operation).unwrap();
        assert_eq!(json, alloc::format!("\"{}\"", operation.wire_name()));
    }
}

#[test]
fn reads_and_reports_are_not_commands() {
    for name in [
        "run.view",
        "run.why",
        "runs.list",
        "subscribe",
        "view.content",
        "server.status",
        "workflowTurn.report",
        "workflowMessage.reportBranch",
        "run.Cancel",
    ] {
        assert_eq!(CommandOperation::from_wire(name), None, "{name}");
    }
}

#[test]
fn only_accepted_rejected_and_not_found_are_durable() {
    use CommandOutcome as O;
    let durable: Vec<_> = [
        O::Accepted,
        O::Adopted,
        O::Rejected,
        O::Conflict,
        O::NotFound,
        O::ClaimLost,
        O::Unavailable,
    ]
    .into_iter()
    .filter(|outcome| outcome.is_durable())
    .collect();
    assert_eq!(durable, [O::Accepted, O::Rejected, O::NotFound]);
}

#[test]
fn outcomes_use_the_wire_vocabulary() {
    let json =
        serde_json::to_string(&[CommandOutcome::NotFound, CommandOutcome::ClaimLost]).unwrap();
    assert_eq!(json, "[\"notFound\",\"claimLost\"]");
}

// ---- decide and record -----------------------------------------------------

#[test]
fn a_new_command_executes() {
    assert_eq!(
        decide(None, None, &incoming("r-1", identity())),
        ReceiptDecision::Execute
    );
}

#[test]
fn a_retry_with_a_new_request_id_adopts_the_stored_receipt() {
    let receipt = stored("r-1", CommandOutcome::Accepted);
    let decision = decide(None, Some(&receipt), &incoming("r-2", identity()));
    assert_eq!(decision, ReceiptDecision::Adopt(receipt.clone()));
    assert_eq!(receipt.adopted_outcome(), CommandOutcome::Adopted);
}

#[test]
fn an_exact_repeat_of_the_request_adopts_the_stored_receipt() {
    let receipt = stored("r-1", CommandOutcome::Accepted);
    assert_eq!(
        decide(Some(&receipt), Some(&receipt), &incoming("r-1", identity())),
        ReceiptDecision::Adopt(receipt)
    );
}

#[test]
fn a_stored_rejection_or_not_found_is_what_a_retry_gets_again() {
    for outcome in [CommandOutcome::Rejected, CommandOutcome::NotFound] {
        let receipt = stored("r-1", outcome);
        let ReceiptDecision::Adopt(adopted) =
            decide(None, Some(&receipt), &incoming("r-2", identity()))
        else {
            panic!("a stored receipt is adopted");
        };
        assert_eq!(adopted.adopted_outcome(), outcome);
    }
}

#[test]
fn every_fingerprint_field_makes_a_used_key_conflict() {
    let receipt = stored("r-1", CommandOutcome::Accepted);
    let variants = [
        CommandIdentity {
            operation: CommandOperation::RunPause,
            ..identity()
        },
        CommandIdentity {
            run_id: Some(RunId::from("run-2")),
            ..identity()
        },
        CommandIdentity {
            run_id: None,
            ..identity()
        },
        CommandIdentity {
            expected_revision: Some(Revision(11)),
            ..identity()
        },
        CommandIdentity {
            payload_digest: Digest::repeat(2),
            ..identity()
        },
    ];
    for other in variants {
        assert_eq!(
            decide(None, Some(&receipt), &incoming("r-2", other.clone())),
            ReceiptDecision::Conflict(ConflictReason::IdempotencyKeyReused),
            "{other:?}"
        );
    }
}

#[test]
fn a_request_id_reused_with_another_fingerprint_conflicts() {
    let receipt = stored("r-1", CommandOutcome::Accepted);
    let other = CommandIdentity {
        idempotency_key: IdempotencyKey::from("k-2"),
        ..identity()
    };
    assert_eq!(
        decide(Some(&receipt), None, &incoming("r-1", other)),
        ReceiptDecision::Conflict(ConflictReason::RequestIdReused)
    );
}

#[test]
fn idempotency_keys_belong_to_one_client() {
    // The shell looks keys up per client, so another client's key finds nothing.
    let other_client = CommandIdentity {
        client_id: ClientId::from("c-2"),
        ..identity()
    };
    assert_eq!(
        decide(None, None, &incoming("r-9", other_client)),
        ReceiptDecision::Execute
    );
}

#[test]
fn request_ids_belong_to_one_client() {
    // The shell looks request ids up per client, so another client's `r-1`
    // finds nothing and executes.
    let other_client = CommandIdentity {
        client_id: ClientId::from("c-2"),
        idempotency_key: IdempotencyKey::from("k-2"),
        ..identity()
    };
    assert_eq!(
        decide(None, None, &incoming("r-1", other_client)),
        ReceiptDecision::Execute
    );
}

#[test]
#[should_panic(expected = "loaded by client and request id")]
fn a_row_loaded_under_another_clients_request_id_is_a_broken_invariant() {
    let receipt = stored("r-1", CommandOutcome::Accepted);
    let other_client = CommandIdentity {
        client_id: ClientId::from("c-2"),
        ..identity()
    };
    let _ = decide(Some(&receipt), None, &incoming("r-1", other_client));
}

#[test]
#[should_panic(expected = "loaded by client and idempotency key")]
fn a_row_loaded_under_another_key_is_a_broken_invariant() {
    let receipt = stored("r-1", CommandOutcome::Accepted);
    let other_key = CommandIdentity {
        idempotency_key: IdempotencyKey::from("k-2"),
        ..identity()
    };
    let _ = decide(None, Some(&receipt), &incoming("r-2", other_key));
}

#[test]
fn record_stores_durable_outcomes_without_the_request_id_in_the_fingerprint() {
    let receipt = record(
        &incoming("r-7", identity()),
        CommandOutcome::Accepted,
        Some(Revision(13)),
        Digest::repeat(0xaa),
        100,
    )
    .unwrap();
    assert_eq!(receipt.request_id, RequestId::from("r-7"));
    assert_eq!(receipt.identity, identity());
    assert_eq!(receipt.revision, Some(Revision(13)));
    assert_eq!(receipt.recorded_at_ms, 100);
}

#[test]
fn record_stores_nothing_for_transient_outcomes() {
    for outcome in [
        CommandOutcome::Adopted,
        CommandOutcome::Conflict,
        CommandOutcome::ClaimLost,
        CommandOutcome::Unavailable,
    ] {
        assert_eq!(
            record(
                &incoming("r-1", identity()),
                outcome,
                None,
                Digest::repeat(0),
                1
            ),
            None,
            "{outcome:?}"
        );
    }
}

// ---- runner messages -------------------------------------------------------

fn runner_message(epoch: &str, id: &str, payload: u8) -> RunnerMessage {
    RunnerMessage {
        runner_epoch: RunnerEpochId::from(epoch),
        message_id: RunnerMessageId::from(id),
        payload_digest: Digest::repeat(payload),
    }
}

#[test]
fn a_new_runner_message_executes_and_an_exact_retry_gets_the_stored_reply() {
    let message = runner_message("re-1", "m-1", 1);
    assert_eq!(
        decide_runner_message(None, &message),
        RunnerMessageDecision::Execute
    );
    let row = record_runner_message(
        &message,
        CommandOutcome::Accepted,
        Some(Revision(4)),
        Digest::repeat(9),
        50,
    )
    .unwrap();
    assert_eq!(
        decide_runner_message(Some(&row), &message),
        RunnerMessageDecision::Adopt(row.clone())
    );
    assert_eq!(row.reply_digest, Digest::repeat(9));
}

#[test]
fn another_payload_under_a_used_runner_message_id_conflicts() {
    let row = record_runner_message(
        &runner_message("re-1", "m-1", 1),
        CommandOutcome::Rejected,
        None,
        Digest::repeat(9),
        50,
    )
    .unwrap();
    assert_eq!(
        decide_runner_message(Some(&row), &runner_message("re-1", "m-1", 2)),
        RunnerMessageDecision::Conflict
    );
}

#[test]
fn transient_runner_replies_are_not_stored() {
    assert_eq!(
        record_runner_message(
            &runner_message("re-1", "m-1", 1),
            CommandOutcome::ClaimLost,
            None,
            Digest::repeat(9),
            50
        ),
        None
    );
}

#[test]
#[should_panic(expected = "loaded by runner epoch and message id")]
fn a_runner_row_of_another_epoch_is_a_broken_invariant() {
    let row = record_runner_message(
        &runner_message("re-1", "m-1", 1),
        CommandOutcome::Accepted,
        None,
        Digest::repeat(9),
        50,
    )
    .unwrap();
    let _ = decide_runner_message(Some(&row), &runner_message("re-2", "m-1", 1));
}

// ---- properties ------------------------------------------------------------

fn outcome() -> impl Strategy<Value = CommandOutcome> {
    prop_oneof![
        Just(CommandOutcome::Accepted),
        Just(CommandOutcome::Rejected),
        Just(CommandOutcome::NotFound),
        Just(CommandOutcome::Conflict),
        Just(CommandOutcome::ClaimLost),
        Just(CommandOutcome::Unavailable),
    ]
}

prop_compose! {
    fn arbitrary_incoming()(
        request in 0u8..6,
        client in 0u8..2,
        key in 0u8..3,
        pause in any::<bool>(),
        revision in 0u64..2,
        payload in 0u8..2,
    ) -> Incoming {
        let operation = if pause { CommandOperation::RunPause } else { CommandOperation::RunCancel };
        Incoming {
            request_id: RequestId::new(alloc::format!("r-{request}")),
            identity: CommandIdentity {
                client_id: ClientId::new(alloc::format!("c-{client}")),
                operation,
                idempotency_key: IdempotencyKey::new(alloc::format!("k-{key}")),
                run_id: Some(RunId::from("run-1")),
                expected_revision: Some(Revision(revision)),
                payload_digest: Digest::repeat(payload),
            },
        }
    }
}

/// The `host_commands` table: primary key (client, request id), unique
/// (client, key).
#[derive(Default)]
struct Table {
    by_request: BTreeMap<(ClientId, RequestId), StoredCommand>,
    by_key: BTreeMap<(ClientId, IdempotencyKey), StoredCommand>,
}

impl Table {
    fn key_of(identity: &CommandIdentity) -> (ClientId, IdempotencyKey) {
        (identity.client_id.clone(), identity.idempotency_key.clone())
    }

    fn request_of(client_id: &ClientId, request_id: &RequestId) -> (ClientId, RequestId) {
        (client_id.clone(), request_id.clone())
    }

    fn decide(&self, incoming: &Incoming) -> ReceiptDecision {
        decide(
            self.by_request.get(&Self::request_of(
                &incoming.identity.client_id,
                &incoming.request_id,
            )),
            self.by_key.get(&Self::key_of(&incoming.identity)),
            incoming,
        )
    }

    fn insert(&mut self, row: StoredCommand) {
        assert!(
            self.by_request
                .insert(
                    Self::request_of(&row.identity.client_id, &row.request_id),
                    row.clone()
                )
                .is_none()
        );
        assert!(
            self.by_key
                .insert(Self::key_of(&row.identity), row)
                .is_none()
        );
    }
}

proptest! {
    /// For any stream of commands with random request ids, keys and
    /// payloads: commands that share a key and fingerprint get the same
    /// receipt, a different fingerprint under a used key always conflicts,
    /// and the request id changes the decision only when it is reused with
    /// another fingerprint.
    #[test]
    fn one_key_and_fingerprint_always_get_one_receipt(
        stream in proptest::collection::vec((arbitrary_incoming(), outcome()), 1..60)
    ) {
        let mut table = Table::default();
        let mut now_ms = 0;
        for (incoming, outcome) in stream {
            now_ms += 1;
            let decision = table.decide(&incoming);
            let under_key = table.by_key.get(&Table::key_of(&incoming.identity)).cloned();
            let fresh = Incoming {
                request_id: RequestId::from("never-used"),
                identity: incoming.identity.clone(),
            };
            let without_request_id = table.decide(&fresh);
            if decision != ReceiptDecision::Conflict(ConflictReason::RequestIdReused) {
                prop_assert_eq!(&decision, &without_request_id, "the request id changed the decision");
            }
            if let Some(row) = &under_key {
                if row.identity == incoming.identity {
                    prop_assert!(matches!(
                        &decision,
                        ReceiptDecision::Adopt(adopted) if adopted == row
                    ) || decision == ReceiptDecision::Conflict(ConflictReason::RequestIdReused));
                } else {
                    prop_assert!(matches!(decision, ReceiptDecision::Conflict(_)));
                }
            }
            match decision {
                ReceiptDecision::Execute => {
                    prop_assert!(under_key.is_none());
                    prop_assert!(!table.by_request.contains_key(&Table::request_of(&incoming.identity.client_id, &incoming.request_id)));
                    if let Some(row) = record(&incoming, outcome, None, Digest::repeat(now_ms as u8), now_ms) {
                        table.insert(row);
                    }
                }
                ReceiptDecision::Adopt(row) => prop_assert_eq!(&row.identity, &incoming.identity),
                ReceiptDecision::Conflict(_) => {}
            }
        }
    }

    /// Runner messages: an exact retry always gets the first stored reply;
    /// another payload under a used (epoch, message id) always conflicts.
    #[test]
    fn runner_messages_adopt_exact_retries_and_refuse_other_payloads(
        stream in proptest::collection::vec((0u8..2, 0u8..3, 0u8..2, outcome()), 1..60)
    ) {
        let mut table: BTreeMap<(RunnerEpochId, RunnerMessageId), StoredRunnerMessage> = BTreeMap::new();
        for (step, (epoch, id, payload, outcome)) in stream.into_iter().enumerate() {
            let message = runner_message(&alloc::format!("re-{epoch}"), &alloc::format!("m-{id}"), payload);
            let name = (message.runner_epoch.clone(), message.message_id.clone());
            let row = table.get(&name);
            match decide_runner_message(row, &message) {
                RunnerMessageDecision::Execute => {
                    prop_assert!(row.is_none());
                    if let Some(new_row) = record_runner_message(&message, outcome, None, Digest::repeat(step as u8), step as u64) {
                        table.insert(name, new_row);
                    }
                }
                RunnerMessageDecision::Adopt(adopted) => {
                    prop_assert_eq!(Some(&adopted), row);
                    prop_assert_eq!(adopted.message.payload_digest, message.payload_digest);
                }
                RunnerMessageDecision::Conflict => {
                    prop_assert!(row.is_some_and(|r| r.message.payload_digest != message.payload_digest));
                }
            }
        }
    }
}
