use super::*;
use crate::ids::SessionId;
use alloc::vec;

fn s1() -> SessionId {
    SessionId::from("s-1")
}

fn interactive() -> ExecutionMode {
    ExecutionMode::Interactive {
        origin_session: s1(),
    }
}

fn root() -> RunId {
    RunId::from("run-1")
}

fn leaf() -> RunId {
    RunId::from("continuation-1")
}

fn new(id: &str, position: u64) -> NewFollowUp {
    NewFollowUp {
        follow_up_id: String::from(id),
        position,
        message_order: 7,
    }
}

fn queued(id: &str, position: u64) -> FollowUpRecord {
    FollowUpRecord {
        follow_up_id: String::from(id),
        session_id: s1(),
        chain_run_id: root(),
        position,
        state: FollowUpState::Queued,
        message_id: None,
    }
}

fn add_to(
    mode: &ExecutionMode,
    status: RunStatus,
) -> Result<Transition<FollowUpFacts>, FollowUpRejection> {
    let (root, leaf) = (root(), leaf());
    let chain = ChainFacts {
        mode,
        chain_run_id: &root,
        leaf_run_id: &leaf,
        leaf_status: status,
    };
    add(&chain, new("f-1", 3), 10)
}

#[test]
fn a_follow_up_of_a_live_chain_is_queued_without_a_message() {
    for status in [RunStatus::Queued, RunStatus::Running, RunStatus::Waiting] {
        let added = add_to(&interactive(), status).unwrap();
        assert_eq!(added.facts.follow_up, queued("f-1", 3));
        assert_eq!(added.facts.message, None);
        assert_eq!(
            added.outputs,
            vec![Output::PublishSession { session_id: s1() }]
        );
    }
}

#[test]
fn a_follow_up_of_a_completed_chain_gets_its_message_on_the_leaf_at_once() {
    let added = add_to(&interactive(), RunStatus::Completed).unwrap();
    assert_eq!(added.facts.follow_up.state, FollowUpState::Messaged);
    assert_eq!(added.facts.follow_up.message_id, Some(message_id("f-1")));
    let message = added.facts.message.unwrap();
    assert_eq!(message.run_id, leaf(), "the chain's final leaf");
    assert_eq!(message.state, MessageState::Pending);
    assert_eq!(message.order, 7);
    assert_eq!(
        message.kind,
        MessageKind::FollowUp {
            follow_up_id: String::from("f-1")
        }
    );
}

#[test]
fn nothing_follows_a_failed_timed_out_or_cancelled_chain_or_a_headless_run() {
    for status in [RunStatus::Failed, RunStatus::TimedOut, RunStatus::Cancelled] {
        assert_eq!(
            add_to(&interactive(), status),
            Err(FollowUpRejection::ChainEnded { status })
        );
    }
    assert_eq!(
        add_to(&ExecutionMode::Headless, RunStatus::Running),
        Err(FollowUpRejection::Headless)
    );
}

#[test]
fn completion_gives_queued_follow_ups_messages_in_position_order_and_failure_cancels_them() {
    let mut cancelled = queued("f-0", 1);
    cancelled.state = FollowUpState::Cancelled;
    let all = [queued("f-3", 4), cancelled, queued("f-2", 2)];
    let settled = settle(&all, &leaf(), RunStatus::Completed, 20, 50);
    let ids: Vec<_> = settled
        .iter()
        .map(|facts| facts.follow_up.follow_up_id.as_str())
        .collect();
    assert_eq!(ids, ["f-2", "f-3"], "position order; a cancelled one stays");
    let orders: Vec<_> = settled
        .iter()
        .map(|facts| facts.message.as_ref().unwrap().order)
        .collect();
    assert_eq!(orders, [20, 21]);
    assert!(settled.iter().all(|facts| {
        facts.follow_up.state == FollowUpState::Messaged
            && facts.message.as_ref().unwrap().run_id == leaf()
    }));

    for status in [RunStatus::Failed, RunStatus::TimedOut, RunStatus::Cancelled] {
        let settled = settle(&all, &leaf(), status, 20, 50);
        assert_eq!(settled.len(), 2);
        assert!(settled.iter().all(|facts| {
            facts.follow_up.state == FollowUpState::Cancelled && facts.message.is_none()
        }));
    }
    for status in [RunStatus::Queued, RunStatus::Running, RunStatus::Waiting] {
        assert!(settle(&all, &leaf(), status, 20, 50).is_empty());
    }
}

#[test]
fn cancel_cancels_a_queued_follow_up_or_its_pending_message_but_never_a_sent_one() {
    let cancelled = cancel(&queued("f-1", 1), None).unwrap().facts;
    assert_eq!(cancelled.follow_up.state, FollowUpState::Cancelled);
    assert_eq!(cancelled.message, None);
    // Again: nothing changes.
    let again = cancel(&cancelled.follow_up, None).unwrap().facts;
    assert_eq!(again, cancelled);

    let added = add_to(&interactive(), RunStatus::Completed).unwrap().facts;
    let message = added.message.clone().unwrap();
    let cancelled = cancel(&added.follow_up, Some(&message)).unwrap().facts;
    assert_eq!(cancelled.follow_up.state, FollowUpState::Cancelled);
    assert_eq!(cancelled.message.unwrap().state, MessageState::Cancelled);

    let mut sent = message;
    sent.state = MessageState::Sent;
    assert_eq!(
        cancel(&added.follow_up, Some(&sent)),
        Err(FollowUpRejection::AlreadyDelivered)
    );
}
