use super::*;
use crate::decision::DecisionRecord;
use crate::fixtures::{session_of, waiting_on_request};
use crate::ids::{DecisionId, Digest, IdempotencyKey, NodeId, SubmissionId};
use crate::interaction::InteractionKind;
use crate::message::{self, TerminalKind};
use alloc::string::String;
use alloc::vec;
use proptest::prelude::*;

const E1: CoordinatorEpoch = CoordinatorEpoch(1);

fn conn(n: u8) -> ConnectionId {
    ConnectionId::new(alloc::format!("c-{n}"))
}

fn mid(id: &str) -> MessageId {
    MessageId::from(id)
}

fn ids() -> Vec<MessageId> {
    vec![mid("new-1"), mid("new-2"), mid("new-3")]
}

fn i1() -> InteractionId {
    InteractionId::from("i-1")
}

fn run1() -> RunId {
    RunId::from("run-1")
}

fn step_kind(reason: StepReason) -> MessageKind {
    MessageKind::Step {
        interaction_id: i1(),
        reason,
    }
}

/// Run 1 waits on submitted-output request `i-1`; `m-1` is its pending initial step.
fn waiting() -> SessionFacts {
    let agg = waiting_on_request(1, InteractionKind::SubmittedOutput);
    session_of(&agg, &[])
}

fn waiting_kind(kind: InteractionKind) -> SessionFacts {
    session_of(&waiting_on_request(1, kind), &[])
}

fn mark_sent(session: &mut SessionFacts, id: &str) {
    let message = session
        .messages
        .iter_mut()
        .find(|m| m.message_id == mid(id))
        .unwrap();
    message.state = MessageState::Sent;
    message.entry_id = Some(EntryId::new(alloc::format!("e-{id}")));
}

/// [`waiting`] with `m-1` sent.
fn sent_step() -> SessionFacts {
    let mut session = waiting();
    mark_sent(&mut session, "m-1");
    session
}

fn push(session: &mut SessionFacts, id: &str, kind: MessageKind, state: MessageState) {
    let order = session.next_message_order;
    session.next_message_order += 1;
    session.messages.push(MessageRecord {
        message_id: mid(id),
        session_id: session.session_id.clone(),
        run_id: run1(),
        kind,
        order,
        state,
        entry_id: (state == MessageState::Sent).then(|| EntryId::new(alloc::format!("e-{id}"))),
        created_at_ms: 0,
    });
}

fn open_turn(session: &mut SessionFacts, turn: &str, message: &str) {
    session.turns.push(TurnRecord {
        turn_id: TurnId::from(turn),
        message_id: mid(message),
        run_id: run1(),
        session_id: session.session_id.clone(),
        state: TurnState::Open,
        started_at_ms: 1,
        ended_at_ms: None,
        response_entry_id: None,
    });
}

fn run_mut(session: &mut SessionFacts) -> &mut SessionRun {
    &mut session.runs[0]
}

fn record(session: &SessionFacts) -> &InteractionRecord {
    session.runs[0].interaction.as_ref().unwrap()
}

fn make_terminal(session: &mut SessionFacts, kind: TerminalKind) {
    let run = run_mut(session);
    run.status = match kind {
        TerminalKind::Completed => RunStatus::Completed,
        TerminalKind::Failed => RunStatus::Failed,
        TerminalKind::TimedOut => RunStatus::TimedOut,
        TerminalKind::Cancelled => RunStatus::Cancelled,
    };
    run.paused = false;
    if let Some(record) = run.interaction.as_mut() {
        *record = interaction::on_run_terminal(record);
    }
    for m in &mut session.messages {
        *m = message::on_run_terminal(m, kind);
    }
    for t in &mut session.turns {
        *t = message::on_run_terminal_turn(t, 99);
    }
}

fn busy() -> BranchReport {
    BranchReport {
        entries: Vec::new(),
        is_idle: false,
        has_pending_messages: false,
        active_message: None,
    }
}

fn idle(entries: &[&str]) -> BranchReport {
    BranchReport {
        entries: entries
            .iter()
            .map(|id| (mid(id), EntryId::new(alloc::format!("e-{id}"))))
            .collect(),
        is_idle: true,
        has_pending_messages: false,
        active_message: None,
    }
}

/// Connection `c-1` with epoch 1 after a busy branch report (nothing durable changes).
fn ready(session: &SessionFacts) -> CoordinatorFacts {
    let coordinator = connect(&CoordinatorFacts::new(session.session_id.clone()), conn(1)).facts;
    let reported = report_branch(session, &coordinator, &conn(1), E1, &busy(), &[], 5).unwrap();
    assert_eq!(reported.session, None);
    reported.coordinator
}

fn branch(session: &SessionFacts, report: &BranchReport) -> BranchReported {
    let coordinator = ready(session);
    report_branch(session, &coordinator, &conn(1), E1, report, &ids(), 50).unwrap()
}

fn turn_report(message: &str, turn: &str, phase: TurnPhase) -> TurnReport {
    TurnReport {
        message_id: mid(message),
        run_id: run1(),
        turn_id: TurnId::from(turn),
        phase,
    }
}

fn end(stop_reason: StopReason) -> TurnPhase {
    TurnPhase::End {
        stop_reason,
        entry_id: Some(EntryId::from("e-reply")),
    }
}

fn report(session: &SessionFacts, report: &TurnReport) -> Result<TurnReported, SessionRejection> {
    report_turn(session, &ready(session), &conn(1), E1, report, &ids(), 60)
}

/// The new facts of an accepted report.
fn after(result: Result<TurnReported, SessionRejection>) -> (SessionFacts, TurnReported) {
    let reported = result.unwrap();
    let facts = reported.session.as_ref().unwrap().facts.clone();
    (facts, reported)
}

fn pending_steps(session: &SessionFacts) -> Vec<&MessageRecord> {
    session
        .messages
        .iter()
        .filter(|m| m.state == MessageState::Pending && matches!(m.kind, MessageKind::Step { .. }))
        .collect()
}

fn decision(status: DecisionStatus) -> DecisionRecord {
    DecisionRecord {
        decision_id: DecisionId::from("d-1"),
        run_id: run1(),
        node_id: NodeId::from("gate"),
        request_digest: Digest::repeat(1),
        status,
        deadline_at_ms: None,
        default_answer_digest: None,
        continuation_run_id: None,
    }
}

fn submission(outcome: SubmissionOutcome) -> SubmissionRecord {
    SubmissionRecord {
        interaction_id: i1(),
        submission_id: SubmissionId::from("sub-1"),
        idempotency_key: IdempotencyKey::from("k"),
        payload_hash: Digest::repeat(1),
        outcome,
        submitted_at_ms: 30,
    }
}

fn follow_up(id: &str) -> MessageKind {
    MessageKind::FollowUp {
        follow_up_id: String::from(id),
    }
}

// ---- coordinator epochs ----------------------------------------------------

#[test]
fn a_new_connection_becomes_the_one_coordinator_and_fences_the_old_one() {
    let empty = CoordinatorFacts::new(SessionId::from("s-1"));
    let first = connect(&empty, conn(1));
    assert_eq!(first.facts.last_epoch, E1);
    assert!(first.outputs.contains(&Output::PublishSession {
        session_id: SessionId::from("s-1")
    }));
    let second = connect(&first.facts, conn(2)).facts;
    let active = second.active.as_ref().unwrap();
    assert_eq!(
        (active.connection_id.clone(), active.epoch),
        (conn(2), CoordinatorEpoch(2))
    );
    assert!(!active.branch_reported);
    assert_eq!(
        check(&second, &conn(1), E1),
        Err(SessionRejection::StaleCoordinator)
    );
    assert!(check(&second, &conn(2), CoordinatorEpoch(2)).is_ok());
}

#[test]
fn a_repeated_connect_keeps_the_epoch() {
    let first = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    let again = connect(&first, conn(1));
    assert_eq!(again.facts, first);
    assert!(again.outputs.is_empty());
}

#[test]
fn a_fenced_connection_stays_fenced_while_another_is_active() {
    let first = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    let second = connect(&first, conn(2)).facts;
    assert_eq!(second.fenced, vec![conn(1)]);
    // The fenced connection reads the session view again (it polls): no
    // epoch comes back to it and the active one keeps its epoch.
    let reread = connect(&second, conn(1));
    assert_eq!(reread.facts, second);
    assert!(reread.outputs.is_empty());
    assert_eq!(epoch_of(&reread.facts, &conn(1)), None);
    assert_eq!(epoch_of(&reread.facts, &conn(2)), Some(CoordinatorEpoch(2)));
    assert_eq!(
        check(&reread.facts, &conn(1), E1),
        Err(SessionRejection::StaleCoordinator)
    );
    // A third, new connection still replaces the active one.
    let third = connect(&reread.facts, conn(3)).facts;
    assert_eq!(epoch_of(&third, &conn(3)), Some(CoordinatorEpoch(3)));
    assert_eq!(third.fenced, vec![conn(1), conn(2)]);
    assert_eq!(connect(&third, conn(2)).facts, third);
}

#[test]
fn a_fenced_connection_coordinates_again_once_no_connection_is_active() {
    let first = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    let second = connect(&first, conn(2)).facts;
    let gone = disconnect(&second, &conn(2)).facts;
    assert_eq!(gone.active, None);
    let back = connect(&gone, conn(1)).facts;
    assert_eq!(epoch_of(&back, &conn(1)), Some(CoordinatorEpoch(3)));
    assert!(back.fenced.is_empty());
}

#[test]
fn a_closed_fenced_connection_is_forgotten() {
    let first = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    let second = connect(&first, conn(2)).facts;
    let closed = disconnect(&second, &conn(1));
    assert!(closed.facts.fenced.is_empty());
    assert_eq!(closed.facts.active, second.active);
    assert!(closed.outputs.is_empty());
}

#[test]
fn disconnect_ends_only_the_active_epoch_and_epochs_never_repeat() {
    let first = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    let unrelated = disconnect(&first, &conn(9));
    assert_eq!(unrelated.facts, first);
    assert!(unrelated.outputs.is_empty());
    let ended = disconnect(&first, &conn(1)).facts;
    assert_eq!(ended.active, None);
    assert_eq!(
        check(&ended, &conn(1), E1),
        Err(SessionRejection::StaleCoordinator)
    );
    let back = connect(&ended, conn(1)).facts;
    assert_eq!(back.active.unwrap().epoch, CoordinatorEpoch(2));
}

#[test]
fn disconnect_leaves_open_turns_open() {
    let session = sent_step();
    let coordinator = ready(&session);
    let (started, _) = after(report_turn(
        &session,
        &coordinator,
        &conn(1),
        E1,
        &turn_report("m-1", "t-1", TurnPhase::Start),
        &ids(),
        60,
    ));
    let gone = disconnect(&coordinator, &conn(1)).facts;
    let next = connect(&gone, conn(2)).facts;
    let reported = report_branch(
        &started,
        &next,
        &conn(2),
        CoordinatorEpoch(2),
        &busy(),
        &ids(),
        70,
    )
    .unwrap();
    assert_eq!(
        reported.session, None,
        "a busy branch report keeps the turn open"
    );
    assert_eq!(started.turns[0].state, TurnState::Open);
}

#[test]
fn check_rejects_a_wrong_epoch_a_wrong_connection_and_no_coordinator() {
    let empty = CoordinatorFacts::new(SessionId::from("s-1"));
    assert_eq!(
        check(&empty, &conn(1), E1),
        Err(SessionRejection::StaleCoordinator)
    );
    let first = connect(&empty, conn(1)).facts;
    assert_eq!(
        check(&first, &conn(1), CoordinatorEpoch(2)),
        Err(SessionRejection::StaleCoordinator)
    );
    assert_eq!(
        check(&first, &conn(2), E1),
        Err(SessionRejection::StaleCoordinator)
    );
}

// ---- next eligible and offers ----------------------------------------------

#[test]
fn nothing_is_offered_before_the_branch_report_or_to_a_stale_epoch() {
    let session = waiting();
    let connected = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    assert_eq!(next_eligible(&session, &connected, &conn(1), E1), None);
    assert_eq!(
        offer(&session, &connected, &conn(1), E1),
        Err(SessionRejection::BranchNotReported)
    );
    let coordinator = ready(&session);
    assert_eq!(
        next_eligible(&session, &coordinator, &conn(1), E1),
        Some(mid("m-1"))
    );
    let replaced = connect(&coordinator, conn(2)).facts;
    assert_eq!(next_eligible(&session, &replaced, &conn(1), E1), None);
    assert_eq!(
        offer(&session, &replaced, &conn(1), E1),
        Err(SessionRejection::StaleCoordinator)
    );
}

#[test]
fn a_step_is_eligible_only_while_pending_unpaused_and_alone() {
    let session = waiting();
    let coordinator = ready(&session);
    let mut paused = session.clone();
    run_mut(&mut paused).paused = true;
    assert_eq!(next_eligible(&paused, &coordinator, &conn(1), E1), None);
    let mut settled = session.clone();
    run_mut(&mut settled).interaction.as_mut().unwrap().status = InteractionStatus::Accepted;
    assert_eq!(next_eligible(&settled, &coordinator, &conn(1), E1), None);
    let mut doubled = session.clone();
    push(
        &mut doubled,
        "m-2",
        step_kind(StepReason::Reminder),
        MessageState::Pending,
    );
    assert_eq!(next_eligible(&doubled, &coordinator, &conn(1), E1), None);
}

#[test]
fn an_ineligible_or_cancelled_earlier_message_does_not_block_later_work() {
    let mut session = waiting();
    run_mut(&mut session).paused = true;
    push(
        &mut session,
        "m-cancelled",
        MessageKind::Notification,
        MessageState::Cancelled,
    );
    push(
        &mut session,
        "m-follow",
        follow_up("f-1"),
        MessageState::Pending,
    );
    push(
        &mut session,
        "m-note",
        MessageKind::Notification,
        MessageState::Pending,
    );
    push(
        &mut session,
        "m-note-2",
        MessageKind::Notification,
        MessageState::Pending,
    );
    let coordinator = ready(&session);
    assert_eq!(
        next_eligible(&session, &coordinator, &conn(1), E1),
        Some(mid("m-note")),
        "acceptance order among eligible messages"
    );
}

#[test]
fn a_decision_message_is_eligible_while_its_decision_is_pending() {
    let mut session = waiting();
    session.messages.clear();
    run_mut(&mut session).interaction = None;
    push(
        &mut session,
        "m-d",
        MessageKind::Decision {
            decision_id: DecisionId::from("d-1"),
        },
        MessageState::Pending,
    );
    let coordinator = ready(&session);
    assert_eq!(
        next_eligible(&session, &coordinator, &conn(1), E1),
        None,
        "no decision"
    );
    run_mut(&mut session).decision = Some(decision(DecisionStatus::Pending));
    assert_eq!(
        next_eligible(&session, &coordinator, &conn(1), E1),
        Some(mid("m-d"))
    );
    run_mut(&mut session).paused = true;
    assert_eq!(
        next_eligible(&session, &coordinator, &conn(1), E1),
        Some(mid("m-d")),
        "pause does not hide a protected decision"
    );
    run_mut(&mut session).decision = Some(decision(DecisionStatus::Cancelled));
    assert_eq!(next_eligible(&session, &coordinator, &conn(1), E1), None);
}

#[test]
fn a_terminal_message_waits_for_the_terminal_run() {
    let mut session = sent_step();
    push(
        &mut session,
        "m-t",
        MessageKind::Terminal,
        MessageState::Pending,
    );
    let coordinator = ready(&session);
    assert_eq!(next_eligible(&session, &coordinator, &conn(1), E1), None);
    make_terminal(&mut session, TerminalKind::Completed);
    assert_eq!(
        next_eligible(&session, &coordinator, &conn(1), E1),
        Some(mid("m-t"))
    );
}

#[test]
fn follow_ups_wait_for_the_terminal_turn_and_earlier_follow_ups() {
    let mut session = sent_step();
    push(
        &mut session,
        "m-f1",
        follow_up("f-1"),
        MessageState::Pending,
    );
    push(
        &mut session,
        "m-f2",
        follow_up("f-2"),
        MessageState::Pending,
    );
    push(
        &mut session,
        "m-t",
        MessageKind::Terminal,
        MessageState::Pending,
    );
    make_terminal(&mut session, TerminalKind::Completed);
    let coordinator = ready(&session);
    let next = |s: &SessionFacts| next_eligible(s, &coordinator, &conn(1), E1);
    assert_eq!(next(&session), Some(mid("m-t")));
    mark_sent(&mut session, "m-t");
    assert_eq!(
        next(&session),
        None,
        "the terminal message's first turn has not ended"
    );
    open_turn(&mut session, "t-t", "m-t");
    assert_eq!(next(&session), None);
    session.turns[0].state = TurnState::Completed;
    assert_eq!(next(&session), Some(mid("m-f1")));
    mark_sent(&mut session, "m-f1");
    assert_eq!(next(&session), None, "f-2 waits for f-1's first turn");
    open_turn(&mut session, "t-f1", "m-f1");
    session.turns[1].state = TurnState::Lost;
    assert_eq!(next(&session), Some(mid("m-f2")));
}

/// A follow-up also waits for the release of the session's reservation (a
/// queued, running or waiting run of the session), and for an earlier
/// follow-up of another run: the queue is the session's.
#[test]
fn follow_ups_wait_for_the_session_reservation_and_earlier_follow_ups_of_other_runs() {
    let mut session = sent_step();
    push(
        &mut session,
        "m-t",
        MessageKind::Terminal,
        MessageState::Sent,
    );
    push(
        &mut session,
        "m-f1",
        follow_up("f-1"),
        MessageState::Pending,
    );
    make_terminal(&mut session, TerminalKind::Completed);
    open_turn(&mut session, "t-t", "m-t");
    session.turns[0].state = TurnState::Completed;
    // Another run of the session holds its reservation (a launch the
    // terminal turn selected), with a terminal message of its own.
    let mut other = session.runs[0].clone();
    other.run_id = RunId::from("run-2");
    other.status = RunStatus::Running;
    other.interaction = None;
    session.runs.push(other);
    let coordinator = ready(&session);
    let next = |s: &SessionFacts| next_eligible(s, &coordinator, &conn(1), E1);
    assert_eq!(next(&session), None, "the session's reservation is held");
    session.runs[1].status = RunStatus::Completed;
    assert_eq!(next(&session), Some(mid("m-f1")), "released");
    // A follow-up of run 2, accepted later, waits for f-1 of run 1 even
    // though run 2's own terminal turn ended.
    let order = session.next_message_order;
    session.next_message_order += 2;
    for (offset, (id, kind, state)) in [
        ("m-t2", MessageKind::Terminal, MessageState::Sent),
        ("m-f2", follow_up("f-2"), MessageState::Pending),
    ]
    .into_iter()
    .enumerate()
    {
        session.messages.push(MessageRecord {
            message_id: mid(id),
            session_id: session.session_id.clone(),
            run_id: RunId::from("run-2"),
            kind,
            order: order + offset as u64,
            state,
            entry_id: None,
            created_at_ms: 0,
        });
    }
    session.turns.push(TurnRecord {
        turn_id: TurnId::from("t-t2"),
        message_id: mid("m-t2"),
        run_id: RunId::from("run-2"),
        session_id: session.session_id.clone(),
        state: TurnState::Completed,
        started_at_ms: 2,
        ended_at_ms: Some(3),
        response_entry_id: None,
    });
    mark_sent(&mut session, "m-f1");
    assert_eq!(next(&session), None, "f-2 waits for f-1 of another run");
    open_turn(&mut session, "t-f1", "m-f1");
    let last = session.turns.len() - 1;
    session.turns[last].state = TurnState::Completed;
    assert_eq!(next(&session), Some(mid("m-f2")));
}

#[test]
fn an_offer_holds_until_branch_evidence_settles_it() {
    let mut session = waiting();
    session.messages[0].kind = follow_up("f-1");
    push(
        &mut session,
        "m-note",
        MessageKind::Notification,
        MessageState::Pending,
    );
    let coordinator = ready(&session);
    let offered = offer(&session, &coordinator, &conn(1), E1).unwrap();
    assert_eq!(offered.message_id, Some(mid("m-note")));
    let coordinator = offered.coordinator;
    // An earlier message becomes eligible: the offered one is still named.
    session.messages[0].kind = MessageKind::Notification;
    assert_eq!(
        next_eligible(&session, &coordinator, &conn(1), E1),
        Some(mid("m-note"))
    );
    // A busy report proves nothing: the offer holds.
    let held = report_branch(&session, &coordinator, &conn(1), E1, &busy(), &ids(), 50).unwrap();
    assert_eq!(
        next_eligible(&session, &held.coordinator, &conn(1), E1),
        Some(mid("m-note"))
    );
    // Idle absence settles it; acceptance order applies again.
    let absent =
        report_branch(&session, &coordinator, &conn(1), E1, &idle(&[]), &ids(), 50).unwrap();
    assert_eq!(absent.coordinator.active.as_ref().unwrap().offered, None);
    assert_eq!(
        next_eligible(&session, &absent.coordinator, &conn(1), E1),
        Some(mid("m-1"))
    );
}

#[test]
fn an_adopted_message_is_never_offered_again() {
    let session = waiting();
    let coordinator = ready(&session);
    let offered = offer(&session, &coordinator, &conn(1), E1).unwrap();
    assert_eq!(offered.message_id, Some(mid("m-1")));
    let reported = report_branch(
        &session,
        &offered.coordinator,
        &conn(1),
        E1,
        &BranchReport {
            is_idle: false,
            ..idle(&["m-1"])
        },
        &ids(),
        50,
    )
    .unwrap();
    let facts = reported.session.unwrap().facts;
    assert_eq!(facts.messages[0].state, MessageState::Sent);
    assert_eq!(reported.coordinator.active.as_ref().unwrap().offered, None);
    assert_eq!(
        next_eligible(&facts, &reported.coordinator, &conn(1), E1),
        None
    );
}

// ---- branch reports --------------------------------------------------------

#[test]
fn a_branch_report_adopts_pending_and_cancelled_messages_and_keeps_sent_ones() {
    let mut session = waiting();
    push(
        &mut session,
        "m-c",
        MessageKind::Notification,
        MessageState::Cancelled,
    );
    push(
        &mut session,
        "m-s",
        MessageKind::Notification,
        MessageState::Sent,
    );
    let mut report = busy();
    report.entries = vec![
        (mid("m-1"), EntryId::from("e-a")),
        (mid("m-c"), EntryId::from("e-b")),
        (mid("m-s"), EntryId::from("e-other")),
    ];
    let coordinator = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    let reported =
        report_branch(&session, &coordinator, &conn(1), E1, &report, &ids(), 50).unwrap();
    assert!(
        reported
            .coordinator
            .active
            .as_ref()
            .unwrap()
            .branch_reported
    );
    let transition = reported.session.unwrap();
    assert!(transition.outputs.contains(&Output::PublishSession {
        session_id: SessionId::from("s-1")
    }));
    let facts = transition.facts;
    let entry = |id: &str| {
        let m = facts.message(&mid(id)).unwrap();
        (m.state, m.entry_id.clone())
    };
    assert_eq!(
        entry("m-1"),
        (MessageState::Sent, Some(EntryId::from("e-a")))
    );
    assert_eq!(
        entry("m-c"),
        (MessageState::Sent, Some(EntryId::from("e-b")))
    );
    assert_eq!(
        entry("m-s"),
        (MessageState::Sent, Some(EntryId::from("e-m-s")))
    );
}

#[test]
fn a_branch_report_names_only_window_messages() {
    let session = waiting();
    let coordinator = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    let mut report = idle(&["m-elsewhere"]);
    report.entries.insert(0, (mid("m-1"), EntryId::from("e-1")));
    assert_eq!(
        report_branch(&session, &coordinator, &conn(1), E1, &report, &ids(), 50),
        Err(SessionRejection::UnknownMessage {
            message_id: mid("m-elsewhere")
        })
    );
}

#[test]
fn only_the_active_epoch_reports_the_branch() {
    let session = waiting();
    let coordinator = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    let replaced = connect(&coordinator, conn(2)).facts;
    assert_eq!(
        report_branch(
            &session,
            &replaced,
            &conn(1),
            E1,
            &idle(&["m-1"]),
            &ids(),
            50
        ),
        Err(SessionRejection::StaleCoordinator)
    );
}

#[test]
fn a_busy_branch_proves_no_absence() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    run_mut(&mut session).decision = Some(decision(DecisionStatus::Pending));
    for report in [
        busy(),
        BranchReport {
            has_pending_messages: true,
            ..idle(&[])
        },
    ] {
        let reported = branch(&session, &report);
        assert_eq!(reported.session, None);
        assert!(reported.follow_ups.is_empty());
    }
}

#[test]
fn an_idle_branch_loses_unproved_open_turns_and_counts_a_lost_step() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    let facts = branch(&session, &idle(&["m-1"])).session.unwrap().facts;
    assert_eq!(facts.turns[0].state, TurnState::Lost);
    assert_eq!(facts.turns[0].ended_at_ms, Some(50));
    assert_eq!(record(&facts).unproductive_turn_ends, 1);
    let pending = pending_steps(&facts);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].kind, step_kind(StepReason::Reminder));
    assert_eq!(pending[0].message_id, mid("new-1"));
    assert_eq!(pending[0].order, session.next_message_order);
    assert_eq!(facts.next_message_order, session.next_message_order + 1);
}

#[test]
fn an_idle_branch_keeps_the_turn_of_the_message_it_shows_active() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    let report = BranchReport {
        active_message: Some(mid("m-1")),
        ..idle(&["m-1"])
    };
    assert_eq!(branch(&session, &report).session, None);
}

#[test]
fn a_branch_change_presents_each_pending_source_once_in_its_own_kind() {
    let mut session = sent_step();
    push(
        &mut session,
        "m-d",
        MessageKind::Decision {
            decision_id: DecisionId::from("d-1"),
        },
        MessageState::Sent,
    );
    run_mut(&mut session).decision = Some(decision(DecisionStatus::Pending));
    let reported = branch(&session, &idle(&[]));
    let facts = reported.session.unwrap().facts;
    let created: Vec<_> = facts
        .messages
        .iter()
        .filter(|m| m.state == MessageState::Pending)
        .collect();
    assert_eq!(created.len(), 2);
    assert_eq!(created[0].kind, step_kind(StepReason::Resumed));
    assert_eq!(
        created[1].kind,
        MessageKind::Decision {
            decision_id: DecisionId::from("d-1")
        }
    );
    assert_eq!(record(&facts).revision, 2, "the step is presented again");
    assert_eq!(record(&facts).unproductive_turn_ends, 0);

    let repeat = branch(&facts, &idle(&[]));
    assert_eq!(repeat.session, None, "a repeated report creates nothing");
    let returned = branch(&session, &idle(&["m-1", "m-d"]));
    assert_eq!(
        returned.session, None,
        "a branch that shows the sources creates nothing"
    );
}

#[test]
fn a_paused_or_settled_source_is_not_presented_again() {
    let mut paused = sent_step();
    run_mut(&mut paused).paused = true;
    assert_eq!(branch(&paused, &idle(&[])).session, None);
    let mut settled = sent_step();
    make_terminal(&mut settled, TerminalKind::Cancelled);
    assert_eq!(branch(&settled, &idle(&[])).session, None);
}

#[test]
fn a_branch_report_needs_an_id_for_each_message_it_creates() {
    let session = sent_step();
    let coordinator = ready(&session);
    assert_eq!(
        report_branch(&session, &coordinator, &conn(1), E1, &idle(&[]), &[], 50),
        Err(SessionRejection::MissingNewId)
    );
}

// ---- turn reports ----------------------------------------------------------

#[test]
fn a_turn_starts_against_the_latest_sent_step() {
    let session = sent_step();
    let (facts, reported) = after(report(
        &session,
        &turn_report("m-1", "t-1", TurnPhase::Start),
    ));
    assert_eq!(reported.receipt.ownership, TurnOwnership::Active);
    let turn = reported.receipt.turn.unwrap();
    assert_eq!((turn.state, turn.started_at_ms), (TurnState::Open, 60));
    assert_eq!(facts.turns, vec![turn]);
    let repeat = report(&facts, &turn_report("m-1", "t-1", TurnPhase::Start)).unwrap();
    assert_eq!(repeat.receipt.ownership, TurnOwnership::Active);
    assert_eq!(repeat.session, None, "a matching repeat adopts");
}

#[test]
fn a_start_against_a_closed_message_is_absent() {
    let absent = |session: &SessionFacts, message: &str| {
        let reported = report(session, &turn_report(message, "t-9", TurnPhase::Start)).unwrap();
        assert_eq!(
            reported.receipt,
            TurnReceipt {
                ownership: TurnOwnership::Absent,
                turn: None
            }
        );
        assert_eq!(reported.session, None, "{message}: nothing changes");
    };
    absent(&waiting(), "m-1"); // not sent yet
    absent(&sent_step(), "m-unknown");
    let mut paused = sent_step();
    run_mut(&mut paused).paused = true;
    absent(&paused, "m-1");
    let mut newer = sent_step();
    push(
        &mut newer,
        "m-2",
        step_kind(StepReason::Reminder),
        MessageState::Sent,
    );
    absent(&newer, "m-1"); // only the latest sent step is open
    let mut terminal = sent_step();
    make_terminal(&mut terminal, TerminalKind::Failed);
    absent(&terminal, "m-1");
    let mut passive = sent_step();
    push(
        &mut passive,
        "m-n",
        MessageKind::Notification,
        MessageState::Sent,
    );
    push(
        &mut passive,
        "m-d",
        MessageKind::Decision {
            decision_id: DecisionId::from("d-1"),
        },
        MessageState::Sent,
    );
    run_mut(&mut passive).decision = Some(decision(DecisionStatus::Pending));
    absent(&passive, "m-n");
    absent(&passive, "m-d");
}

#[test]
fn a_terminal_message_is_open_until_its_first_turn_ends() {
    let mut session = sent_step();
    push(
        &mut session,
        "m-t",
        MessageKind::Terminal,
        MessageState::Sent,
    );
    make_terminal(&mut session, TerminalKind::Completed);
    let (facts, reported) = after(report(
        &session,
        &turn_report("m-t", "t-1", TurnPhase::Start),
    ));
    assert_eq!(reported.receipt.ownership, TurnOwnership::Active);
    let (facts, ended) = after(report(
        &facts,
        &turn_report("m-t", "t-1", end(StopReason::Aborted)),
    ));
    assert_eq!(ended.receipt.ownership, TurnOwnership::Settled);
    assert!(
        ended.follow_ups.is_empty(),
        "a terminal run is never paused"
    );
    let again = report(&facts, &turn_report("m-t", "t-2", TurnPhase::Start)).unwrap();
    assert_eq!(again.receipt.ownership, TurnOwnership::Absent);
}

#[test]
fn a_turn_id_names_one_message_and_run() {
    let mut session = sent_step();
    push(
        &mut session,
        "m-t",
        MessageKind::Terminal,
        MessageState::Sent,
    );
    open_turn(&mut session, "t-1", "m-1");
    assert_eq!(
        report(&session, &turn_report("m-t", "t-1", TurnPhase::Start)),
        Err(SessionRejection::TurnConflict {
            turn_id: TurnId::from("t-1")
        })
    );
    let mut other_run = turn_report("m-1", "t-2", TurnPhase::Start);
    other_run.run_id = RunId::from("run-9");
    assert_eq!(
        report(&session, &other_run),
        Err(SessionRejection::RunMismatch {
            message_id: mid("m-1")
        })
    );
}

#[test]
fn turn_reports_need_the_active_epoch_after_its_branch_report() {
    let session = sent_step();
    let connected = connect(&CoordinatorFacts::new(SessionId::from("s-1")), conn(1)).facts;
    let start = turn_report("m-1", "t-1", TurnPhase::Start);
    assert_eq!(
        report_turn(&session, &connected, &conn(1), E1, &start, &ids(), 60),
        Err(SessionRejection::BranchNotReported)
    );
    let replaced = connect(&ready(&session), conn(2)).facts;
    assert_eq!(
        report_turn(&session, &replaced, &conn(1), E1, &start, &ids(), 60),
        Err(SessionRejection::StaleCoordinator)
    );
}

#[test]
fn a_completed_turn_without_a_submission_creates_one_reminder() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    let (facts, reported) = after(report(
        &session,
        &turn_report("m-1", "t-1", end(StopReason::Completed)),
    ));
    let turn = reported.receipt.turn.clone().unwrap();
    assert_eq!(reported.receipt.ownership, TurnOwnership::Settled);
    assert_eq!(
        (turn.state, turn.ended_at_ms),
        (TurnState::Completed, Some(60))
    );
    assert_eq!(turn.response_entry_id, Some(EntryId::from("e-reply")));
    assert_eq!(record(&facts).unproductive_turn_ends, 1);
    assert_eq!(
        pending_steps(&facts)[0].kind,
        step_kind(StepReason::Reminder)
    );
    assert!(reported.follow_ups.is_empty());
}

#[test]
fn an_errored_turn_counts_like_a_completed_one() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    let (facts, _) = after(report(
        &session,
        &turn_report("m-1", "t-1", end(StopReason::Error)),
    ));
    assert_eq!(facts.turns[0].state, TurnState::Error);
    assert_eq!(record(&facts).unproductive_turn_ends, 1);
}

#[test]
fn a_repeated_end_adopts_and_a_conflicting_one_is_an_error() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    let (facts, first) = after(report(
        &session,
        &turn_report("m-1", "t-1", end(StopReason::Completed)),
    ));
    let repeat = report(
        &facts,
        &turn_report("m-1", "t-1", end(StopReason::Completed)),
    )
    .unwrap();
    assert_eq!(repeat.receipt, first.receipt);
    assert_eq!(repeat.session, None);
    assert_eq!(
        report(&facts, &turn_report("m-1", "t-1", end(StopReason::Aborted))),
        Err(SessionRejection::TurnConflict {
            turn_id: TurnId::from("t-1")
        })
    );
    let other_entry = TurnPhase::End {
        stop_reason: StopReason::Completed,
        entry_id: None,
    };
    assert_eq!(
        report(&facts, &turn_report("m-1", "t-1", other_entry)),
        Err(SessionRejection::TurnConflict {
            turn_id: TurnId::from("t-1")
        })
    );
    let start_again = report(&facts, &turn_report("m-1", "t-1", TurnPhase::Start)).unwrap();
    assert_eq!(start_again.receipt.ownership, TurnOwnership::Settled);
    assert_eq!(start_again.session, None);
}

#[test]
fn a_late_end_adopts_the_terminal_cleanup() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    make_terminal(&mut session, TerminalKind::Cancelled);
    let reported = report(
        &session,
        &turn_report("m-1", "t-1", end(StopReason::Completed)),
    )
    .unwrap();
    assert_eq!(reported.receipt.ownership, TurnOwnership::Settled);
    assert_eq!(reported.receipt.turn.unwrap().state, TurnState::Lost);
    assert_eq!(reported.session, None);
}

#[test]
fn an_end_for_an_unknown_turn_is_absent() {
    let reported = report(
        &sent_step(),
        &turn_report("m-1", "t-x", end(StopReason::Completed)),
    )
    .unwrap();
    assert_eq!(
        reported.receipt,
        TurnReceipt {
            ownership: TurnOwnership::Absent,
            turn: None
        }
    );
    assert_eq!(reported.session, None);
}

#[test]
fn an_aborted_step_turn_pauses_the_run_without_counting() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    push(
        &mut session,
        "m-2",
        step_kind(StepReason::Reminder),
        MessageState::Pending,
    );
    let (facts, reported) = after(report(
        &session,
        &turn_report("m-1", "t-1", end(StopReason::Aborted)),
    ));
    assert_eq!(
        reported.follow_ups,
        vec![RunFollowUp::Pause { run_id: run1() }]
    );
    assert!(facts.runs[0].paused);
    assert_eq!(record(&facts).unproductive_turn_ends, 0);
    assert!(pending_steps(&facts).is_empty());
    assert_eq!(facts.turns[0].state, TurnState::Aborted);
}

#[test]
fn an_aborted_turn_of_a_paused_run_does_not_pause_again() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    run_mut(&mut session).paused = true;
    let (_, reported) = after(report(
        &session,
        &turn_report("m-1", "t-1", end(StopReason::Aborted)),
    ));
    assert!(reported.follow_ups.is_empty());
}

#[test]
fn the_third_unproductive_end_fails_the_attempt() {
    let mut session = sent_step();
    run_mut(&mut session)
        .interaction
        .as_mut()
        .unwrap()
        .unproductive_turn_ends = 2;
    open_turn(&mut session, "t-1", "m-1");
    let (facts, reported) = after(report(
        &session,
        &turn_report("m-1", "t-1", end(StopReason::Completed)),
    ));
    let record = record(&facts);
    assert_eq!(record.unproductive_turn_ends, 3);
    assert_eq!(record.status, InteractionStatus::Failed);
    assert!(
        pending_steps(&facts).is_empty(),
        "no reminder after the last one"
    );
    assert_eq!(
        reported.follow_ups,
        vec![RunFollowUp::Attempt {
            follow_up: AttemptFollowUp::Fail {
                run_id: run1(),
                attempt_id: record.attempt_id.clone(),
                reason: ReasonKind::UnproductiveTurns,
            }
        }]
    );
}

#[test]
fn a_turn_end_counts_only_for_an_open_submitted_output_step() {
    let unchanged_counter = |session: SessionFacts| {
        let mut session = session;
        open_turn(&mut session, "t-1", "m-1");
        let (facts, _) = after(report(
            &session,
            &turn_report("m-1", "t-1", end(StopReason::Completed)),
        ));
        assert_eq!(record(&facts).unproductive_turn_ends, 0);
        assert!(pending_steps(&facts).is_empty());
    };
    let mut validating = sent_step();
    run_mut(&mut validating).submissions = vec![submission(SubmissionOutcome::Validating)];
    unchanged_counter(validating);
    let mut accepted = sent_step();
    run_mut(&mut accepted).submissions = vec![submission(SubmissionOutcome::Accepted)];
    unchanged_counter(accepted);
    let mut paused = sent_step();
    run_mut(&mut paused).paused = true;
    unchanged_counter(paused);
    let mut reply = waiting_kind(InteractionKind::AssistantMessage);
    mark_sent(&mut reply, "m-1");
    unchanged_counter(reply);
    let mut rejected = sent_step();
    run_mut(&mut rejected).submissions = vec![submission(SubmissionOutcome::Rejected)];
    open_turn(&mut rejected, "t-1", "m-1");
    let (facts, _) = after(report(
        &rejected,
        &turn_report("m-1", "t-1", end(StopReason::Completed)),
    ));
    assert_eq!(
        record(&facts).unproductive_turn_ends,
        1,
        "a rejected submission is no output"
    );
}

#[test]
fn at_most_one_reminder_is_pending() {
    let mut session = sent_step();
    push(
        &mut session,
        "m-2",
        step_kind(StepReason::Reminder),
        MessageState::Pending,
    );
    open_turn(&mut session, "t-1", "m-1");
    let (facts, _) = after(report(
        &session,
        &turn_report("m-1", "t-1", end(StopReason::Completed)),
    ));
    assert_eq!(record(&facts).unproductive_turn_ends, 1);
    assert_eq!(pending_steps(&facts).len(), 1);
}

#[test]
fn a_new_turn_ends_the_older_open_turn_and_a_stale_end_cannot_clear_it() {
    let mut session = sent_step();
    open_turn(&mut session, "t-1", "m-1");
    let (facts, reported) = after(report(
        &session,
        &turn_report("m-1", "t-2", TurnPhase::Start),
    ));
    assert_eq!(reported.receipt.ownership, TurnOwnership::Active);
    let old = facts
        .turns
        .iter()
        .find(|t| t.turn_id == TurnId::from("t-1"))
        .unwrap();
    assert_eq!(old.state, TurnState::Lost);
    assert_eq!(
        record(&facts).unproductive_turn_ends,
        1,
        "a proved-lost step turn counts"
    );
    let stale = report(&facts, &turn_report("m-1", "t-1", end(StopReason::Aborted))).unwrap();
    assert_eq!(stale.receipt.ownership, TurnOwnership::Settled);
    assert_eq!(stale.session, None);
    assert!(stale.follow_ups.is_empty(), "a stale abort does not pause");
}

#[test]
fn a_new_turn_that_exhausts_the_reminders_is_absent() {
    let mut session = sent_step();
    run_mut(&mut session)
        .interaction
        .as_mut()
        .unwrap()
        .unproductive_turn_ends = 2;
    open_turn(&mut session, "t-1", "m-1");
    let reported = report(&session, &turn_report("m-1", "t-2", TurnPhase::Start)).unwrap();
    assert_eq!(reported.receipt.ownership, TurnOwnership::Absent);
    let facts = reported.session.unwrap().facts;
    assert_eq!(
        facts.turns.len(),
        1,
        "no turn opens against the failed step"
    );
    assert_eq!(record(&facts).status, InteractionStatus::Failed);
    assert_eq!(reported.follow_ups.len(), 1);
}

// ---- properties ------------------------------------------------------------

/// Who presents a coordinator request.
#[derive(Clone, Copy, Debug)]
enum Who {
    /// The active connection with its epoch (a stranger when none is active).
    Active,
    /// The active connection with an older epoch.
    StaleEpoch,
    /// Connection `c-<n>` with the latest epoch.
    Other(u8),
}

fn who() -> impl Strategy<Value = Who> {
    prop_oneof![
        6 => Just(Who::Active),
        1 => Just(Who::StaleEpoch),
        1 => (0u8..3).prop_map(Who::Other),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Connect(u8),
    Disconnect(u8),
    Offer(Who),
    Branch {
        who: Who,
        shown: u8,
        idle: bool,
        pending: bool,
        active: Option<u8>,
    },
    /// `message: None` starts against the latest sent step; `turn: None` is a
    /// fresh turn id, `Some(k)` one of a few reused ids.
    Start {
        who: Who,
        message: Option<u8>,
        turn: Option<u8>,
    },
    /// `turn: None` ends the open turn, if any.
    End {
        who: Who,
        turn: Option<u8>,
        reason: u8,
    },
    Pause,
    Resume,
    ToggleValidation,
    Accept,
    Terminal(u8),
    Notify,
    FollowUp,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u8..3).prop_map(Op::Connect),
        1 => (0u8..3).prop_map(Op::Disconnect),
        2 => who().prop_map(Op::Offer),
        4 => (who(), any::<u8>(), prop::bool::weighted(0.7), prop::bool::weighted(0.2), proptest::option::weighted(0.2, any::<u8>()))
            .prop_map(|(who, shown, idle, pending, active)| Op::Branch { who, shown, idle, pending, active }),
        4 => (who(), proptest::option::weighted(0.3, any::<u8>()), proptest::option::weighted(0.3, 0u8..3))
            .prop_map(|(who, message, turn)| Op::Start { who, message, turn }),
        4 => (who(), proptest::option::weighted(0.3, 0u8..3), 0u8..3)
            .prop_map(|(who, turn, reason)| Op::End { who, turn, reason }),
        1 => Just(Op::Pause),
        1 => Just(Op::Resume),
        1 => Just(Op::ToggleValidation),
        1 => Just(Op::Accept),
        1 => (0u8..4).prop_map(Op::Terminal),
        1 => Just(Op::Notify),
        1 => Just(Op::FollowUp),
    ]
}

/// The harness's stand-in for the shell and the other modules.
#[derive(Clone, Debug)]
struct World {
    session: SessionFacts,
    coordinator: CoordinatorFacts,
    fresh: u32,
}

impl World {
    fn fresh_id(&mut self) -> MessageId {
        self.fresh += 1;
        MessageId::new(alloc::format!("x-{}", self.fresh))
    }

    fn push(&mut self, kind: MessageKind) {
        let id = self.fresh_id();
        let order = self.session.next_message_order;
        self.session.next_message_order += 1;
        self.session.messages.push(MessageRecord {
            message_id: id,
            session_id: self.session.session_id.clone(),
            run_id: run1(),
            kind,
            order,
            state: MessageState::Pending,
            entry_id: None,
            created_at_ms: 0,
        });
    }

    /// The (connection, epoch) a request presents, and whether it owns the
    /// active epoch (decided here, independently of [`check`]).
    fn credentials(&self, who: Who) -> (ConnectionId, CoordinatorEpoch, bool) {
        let active = self.coordinator.active.as_ref();
        let latest = self.coordinator.last_epoch;
        match (who, active) {
            (Who::Active, Some(a)) => (a.connection_id.clone(), a.epoch, true),
            (Who::StaleEpoch, Some(a)) => (
                a.connection_id.clone(),
                CoordinatorEpoch(a.epoch.0 - 1),
                false,
            ),
            (Who::Other(n), Some(a)) => {
                let valid = conn(n) == a.connection_id;
                (conn(n), latest, valid)
            }
            (Who::Other(n), None) => (conn(n), latest, false),
            (_, None) => (conn(9), latest, false),
        }
    }

    fn apply_follow_ups(&mut self, follow_ups: &[RunFollowUp]) {
        for follow_up in follow_ups {
            match follow_up {
                RunFollowUp::Pause { .. } => assert!(self.session.runs[0].paused),
                RunFollowUp::Attempt { .. } => {
                    make_terminal(&mut self.session, TerminalKind::Failed)
                }
            }
        }
    }

    fn external(&mut self, op: &Op) {
        let run = &self.session.runs[0];
        let live = !run.status.is_terminal();
        let pending = run
            .interaction
            .as_ref()
            .is_some_and(|r| r.status == InteractionStatus::Pending);
        match op {
            Op::Pause if live && !run.paused => {
                run_mut(&mut self.session).paused = true;
                for m in &mut self.session.messages {
                    *m = message::on_pause(m);
                }
            }
            Op::Resume if live && run.paused => {
                run_mut(&mut self.session).paused = false;
                if pending {
                    run_mut(&mut self.session)
                        .interaction
                        .as_mut()
                        .unwrap()
                        .revision += 1;
                    self.push(step_kind(StepReason::Resumed));
                }
            }
            Op::ToggleValidation if pending => {
                let run = run_mut(&mut self.session);
                match run.submissions.last_mut() {
                    Some(s) if s.outcome == SubmissionOutcome::Validating => {
                        s.outcome = SubmissionOutcome::Rejected;
                    }
                    _ => run
                        .submissions
                        .push(submission(SubmissionOutcome::Validating)),
                }
            }
            Op::Accept
                if pending
                    && run
                        .submissions
                        .last()
                        .is_some_and(|s| s.outcome == SubmissionOutcome::Validating) =>
            {
                let run = run_mut(&mut self.session);
                run.submissions.last_mut().unwrap().outcome = SubmissionOutcome::Accepted;
                let record = run.interaction.as_mut().unwrap();
                record.status = InteractionStatus::Accepted;
                record.accepted_submission = Some(SubmissionId::from("sub-1"));
                run.status = RunStatus::Running;
                interaction::cancel_pending_steps(&mut self.session.messages, &i1());
            }
            Op::Terminal(kind) if live => {
                let kind = [
                    TerminalKind::Completed,
                    TerminalKind::Failed,
                    TerminalKind::TimedOut,
                    TerminalKind::Cancelled,
                ][usize::from(*kind)];
                make_terminal(&mut self.session, kind);
                self.push(MessageKind::Terminal);
            }
            Op::Notify => self.push(MessageKind::Notification),
            Op::FollowUp => {
                let id = self.fresh_id();
                self.push(follow_up(id.as_str()));
            }
            _ => {}
        }
    }
}

fn sent_entries(session: &SessionFacts) -> Vec<(MessageId, Option<EntryId>)> {
    session
        .messages
        .iter()
        .filter(|m| m.state == MessageState::Sent)
        .map(|m| (m.message_id.clone(), m.entry_id.clone()))
        .collect()
}

fn check_invariants(world: &World) -> Result<(), TestCaseError> {
    let session = &world.session;
    let steps = pending_steps(session);
    prop_assert!(steps.len() <= 1, "pending steps {:?}", steps);
    let reminders = steps
        .iter()
        .filter(|m| m.kind == step_kind(StepReason::Reminder))
        .count();
    prop_assert!(reminders <= 1);
    let record = session.runs[0].interaction.as_ref().unwrap();
    prop_assert!(record.unproductive_turn_ends <= 3);
    let open = session
        .turns
        .iter()
        .filter(|t| t.state == TurnState::Open)
        .count();
    prop_assert!(open <= 1, "Pi runs one turn at a time");
    let coordinator = &world.coordinator;
    if let Some(active) = &coordinator.active {
        prop_assert_eq!(active.epoch, coordinator.last_epoch);
        if let Some(next) = next_eligible(session, coordinator, &active.connection_id, active.epoch)
        {
            let message = session.message(&next).unwrap();
            prop_assert_eq!(
                message.state,
                MessageState::Pending,
                "a sent message is never offered"
            );
            prop_assert!(active.branch_reported);
        }
    }
    Ok(())
}

/// Whether a turn end of the step may count now, written out independently
/// of the code under test.
fn counts_now(session: &SessionFacts) -> bool {
    let run = &session.runs[0];
    let record = run.interaction.as_ref().unwrap();
    let settling = run
        .submissions
        .iter()
        .any(|s| s.outcome != SubmissionOutcome::Rejected);
    record.status == InteractionStatus::Pending
        && record.kind == InteractionKind::SubmittedOutput
        && record.accepted_submission.is_none()
        && !run.paused
        && !run.status.is_terminal()
        && !settling
}

/// Whether a fresh turn may open against `message_id`, written out
/// independently of the code under test.
fn open_oracle(session: &SessionFacts, message_id: &MessageId) -> bool {
    let Some(message) = session.message(message_id) else {
        return false;
    };
    let run = &session.runs[0];
    let record = run.interaction.as_ref().unwrap();
    let has_turn = session.turns.iter().any(|t| t.message_id == *message_id);
    message.state == MessageState::Sent
        && match &message.kind {
            MessageKind::Step { .. } => {
                let latest = session
                    .messages
                    .iter()
                    .filter(|m| {
                        m.state == MessageState::Sent && matches!(m.kind, MessageKind::Step { .. })
                    })
                    .max_by_key(|m| m.order)
                    .map(|m| &m.message_id);
                record.status == InteractionStatus::Pending
                    && !run.paused
                    && latest == Some(message_id)
            }
            MessageKind::Terminal | MessageKind::FollowUp { .. } => !has_turn,
            MessageKind::Decision { .. } | MessageKind::Notification => false,
        }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Any interleaving of coordinator connections, offers, branch and turn
    /// reports, and source changes keeps: one pending step and one pending
    /// reminder at most; sent messages sent with their first entry; only the
    /// active epoch served; offered messages pending; older turns untouched by
    /// an end report; the counter at most 3, moving by one only for a turn
    /// that ended productive-eligible and never for an abort.
    #[test]
    fn session_rules_hold_under_any_interleaving(ops in proptest::collection::vec(op(), 1..100)) {
        let mut world = World {
            session: waiting(),
            coordinator: CoordinatorFacts::new(SessionId::from("s-1")),
            fresh: 0,
        };
        for (n, op) in ops.iter().enumerate() {
            let now_ms = 100 + n as u64;
            let before = world.clone();
            let new_ids: Vec<MessageId> = (0..4).map(|j| MessageId::new(alloc::format!("n-{n}-{j}"))).collect();
            let window: Vec<MessageId> = world.session.messages.iter().map(|m| m.message_id.clone()).collect();
            match op {
                Op::Connect(c) => world.coordinator = connect(&world.coordinator, conn(*c)).facts,
                Op::Disconnect(c) => world.coordinator = disconnect(&world.coordinator, &conn(*c)).facts,
                Op::Offer(who) => {
                    let (connection, epoch, valid) = world.credentials(*who);
                    match offer(&world.session, &world.coordinator, &connection, epoch) {
                        Ok(offered) => {
                            prop_assert!(valid);
                            world.coordinator = offered.coordinator;
                        }
                        Err(SessionRejection::StaleCoordinator) => {
                            prop_assert!(!valid);
                            prop_assert_eq!(next_eligible(&world.session, &world.coordinator, &connection, epoch), None);
                        }
                        Err(other) => prop_assert_eq!(other, SessionRejection::BranchNotReported),
                    }
                }
                Op::Branch { who, shown, idle, pending, active } => {
                    let (connection, epoch, valid) = world.credentials(*who);
                    let entries = window.iter().enumerate()
                        .filter(|(i, _)| shown & (1 << (i % 8)) != 0)
                        .map(|(i, id)| (id.clone(), EntryId::new(alloc::format!("e-{n}-{i}"))))
                        .collect();
                    let report = BranchReport {
                        entries,
                        is_idle: *idle,
                        has_pending_messages: *pending,
                        active_message: active.and_then(|a| window.get(usize::from(a) % window.len().max(1)).cloned()),
                    };
                    match report_branch(&world.session, &world.coordinator, &connection, epoch, &report, &new_ids, now_ms) {
                        Ok(reported) => {
                            prop_assert!(valid);
                            world.coordinator = reported.coordinator;
                            if let Some(t) = reported.session { world.session = t.facts; }
                            world.apply_follow_ups(&reported.follow_ups);
                            if !*idle || *pending {
                                prop_assert_eq!(&world.session.turns, &before.session.turns, "a busy branch proves no loss");
                                prop_assert_eq!(world.session.messages.len(), before.session.messages.len());
                            }
                            for (id, _) in &report.entries {
                                let m = world.session.message(id).unwrap();
                                prop_assert_eq!(m.state, MessageState::Sent, "the branch shows it");
                                let next = next_eligible(&world.session, &world.coordinator, &connection, epoch);
                                prop_assert_ne!(next.as_ref(), Some(id), "offered again while shown");
                            }
                        }
                        Err(rejection) => prop_assert!(!valid && rejection == SessionRejection::StaleCoordinator),
                    }
                }
                Op::Start { who, turn, .. } | Op::End { who, turn, .. } => {
                    let (connection, epoch, valid) = world.credentials(*who);
                    let open = world.session.turns.iter().find(|t| t.state == TurnState::Open);
                    let turn_id = match (turn, op) {
                        (Some(k), _) => TurnId::new(alloc::format!("t-{k}")),
                        (None, Op::End { .. }) => open.map_or_else(|| TurnId::from("t-none"), |t| t.turn_id.clone()),
                        (None, _) => TurnId::new(alloc::format!("t-fresh-{n}")),
                    };
                    let is_end = matches!(op, Op::End { .. });
                    let (message_id, phase) = match op {
                        Op::End { reason, .. } => {
                            let saved = world.session.turns.iter().find(|t| t.turn_id == turn_id);
                            let message_id = saved.map_or_else(|| mid("m-1"), |t| t.message_id.clone());
                            let stop_reason = [StopReason::Completed, StopReason::Aborted, StopReason::Error][usize::from(*reason)];
                            (message_id, TurnPhase::End { stop_reason, entry_id: None })
                        }
                        Op::Start { message: Some(i), .. } => (window[usize::from(*i) % window.len()].clone(), TurnPhase::Start),
                        _ => {
                            let latest = world.session.latest_sent_step(&i1()).map_or_else(|| mid("m-1"), |m| m.message_id.clone());
                            (latest, TurnPhase::Start)
                        }
                    };
                    let report = TurnReport { message_id, run_id: run1(), turn_id: turn_id.clone(), phase: phase.clone() };
                    let counted_before = world.session.runs[0].interaction.as_ref().unwrap().unproductive_turn_ends;
                    let eligible_before = counts_now(&world.session);
                    let fresh_start = !is_end && !world.session.turns.iter().any(|t| t.turn_id == turn_id);
                    let open_before = open_oracle(&world.session, &report.message_id);
                    match report_turn(&world.session, &world.coordinator, &connection, epoch, &report, &new_ids, now_ms) {
                        Ok(reported) => {
                            prop_assert!(valid);
                            if fresh_start && reported.receipt.ownership == TurnOwnership::Active {
                                prop_assert!(open_before, "a turn opened against a closed message");
                            }
                            if fresh_start && !open_before {
                                prop_assert_eq!(reported.receipt.ownership, TurnOwnership::Absent);
                                prop_assert_eq!(&reported.session, &None);
                            }
                            if let Some(t) = reported.session { world.session = t.facts; }
                            let counted = world.session.runs[0].interaction.as_ref().unwrap().unproductive_turn_ends;
                            prop_assert!(counted == counted_before || (counted == counted_before + 1 && eligible_before));
                            if matches!(phase, TurnPhase::End { stop_reason: StopReason::Aborted, .. }) {
                                prop_assert_eq!(counted, counted_before, "an abort is never counted");
                            }
                            if is_end {
                                for old in before.session.turns.iter().filter(|t| t.turn_id != turn_id) {
                                    let now = world.session.turns.iter().find(|t| t.turn_id == old.turn_id).unwrap();
                                    prop_assert_eq!(now, old, "an end report touches only its own turn");
                                }
                            }
                            world.apply_follow_ups(&reported.follow_ups);
                        }
                        Err(SessionRejection::StaleCoordinator) => prop_assert!(!valid),
                        Err(SessionRejection::BranchNotReported) => prop_assert!(valid),
                        Err(SessionRejection::TurnConflict { .. } | SessionRejection::RunMismatch { .. }) => {}
                        Err(other) => prop_assert!(false, "unexpected {:?}", other),
                    }
                }
                external => world.external(external),
            }
            for (id, entry) in sent_entries(&before.session) {
                let m = world.session.message(&id).unwrap();
                prop_assert_eq!(m.state, MessageState::Sent, "sent never returns");
                prop_assert_eq!(&m.entry_id, &entry, "a sent message keeps its entry");
            }
            prop_assert!(world.coordinator.last_epoch >= before.coordinator.last_epoch);
            check_invariants(&world)?;
        }
    }
}

#[test]
fn a_sessions_next_message_order_follows_its_highest_stored_order() {
    assert_eq!(next_message_order(None), 1);
    assert_eq!(next_message_order(Some(1)), 2);
    assert_eq!(next_message_order(Some(41)), 42);
}

// ---- turn clocks (model-turn time) -----------------------------------------

/// [`sent_step`] whose request has `budget` ms of model-turn time left.
fn sent_step_with_budget(budget: u64) -> SessionFacts {
    let mut session = sent_step();
    run_mut(&mut session).interaction.as_mut().unwrap().clock =
        interaction::TurnClock::new(Some(budget));
    session
}

fn clock(session: &SessionFacts) -> interaction::TurnClock {
    record(session).clock
}

fn deadline_wakes(outputs: &[Output]) -> Vec<u64> {
    outputs
        .iter()
        .filter_map(|output| match output {
            Output::Wake {
                at_ms,
                reason: WakeReason::NodeDeadline { .. },
                ..
            } => Some(*at_ms),
            _ => None,
        })
        .collect()
}

#[test]
fn a_turn_clock_counts_only_its_running_segments() {
    let fresh = interaction::TurnClock::new(Some(100));
    assert!(!fresh.expired(1_000_000), "a stopped clock never runs out");
    assert_eq!(fresh.deadline_at_ms(5), None);
    let running = fresh.started(10);
    assert_eq!(
        running.started(20),
        running,
        "a running clock keeps its start"
    );
    assert_eq!(running.deadline_at_ms(30), Some(110));
    let stopped = running.stopped(40);
    assert_eq!(stopped.consumed_ms, 30);
    assert_eq!(stopped.stopped(90), stopped);
    assert_eq!(stopped.deadline_at_ms(500), None);
    let again = stopped.started(500);
    assert_eq!(again.deadline_at_ms(500), Some(570));
    assert!(!again.expired(569));
    assert!(again.expired(570));
    assert_eq!(again.deadline_at_ms(600), Some(600), "spent: due now");
    assert_eq!(
        running.stopped(5).consumed_ms,
        0,
        "a segment never ends before it began"
    );
    assert!(
        !interaction::TurnClock::new(None)
            .started(0)
            .expired(u64::MAX)
    );
    assert_eq!(
        interaction::TurnClock::at_request(Some(300), 20),
        interaction::TurnClock::new(Some(280))
    );
}

#[test]
fn a_step_turn_runs_its_requests_clock_and_its_end_stops_it() {
    let session = sent_step_with_budget(1_000);
    let (started, reported) = after(report(
        &session,
        &turn_report("m-1", "t-1", TurnPhase::Start),
    ));
    assert_eq!(clock(&started).running_since_ms, Some(60));
    let outputs = &reported.session.as_ref().unwrap().outputs;
    assert_eq!(
        deadline_wakes(outputs),
        vec![1_060],
        "one wake at the deadline"
    );

    let ended = report_turn(
        &started,
        &ready(&started),
        &conn(1),
        E1,
        &turn_report("m-1", "t-1", end(StopReason::Completed)),
        &ids(),
        460,
    )
    .unwrap();
    let ended = ended.session.unwrap().facts;
    assert_eq!(
        clock(&ended),
        interaction::TurnClock {
            budget_ms: Some(1_000),
            consumed_ms: 400,
            running_since_ms: None
        }
    );
}

#[test]
fn an_idle_branch_that_loses_the_turn_stops_the_clock() {
    let session = sent_step_with_budget(1_000);
    let (started, _) = after(report(
        &session,
        &turn_report("m-1", "t-1", TurnPhase::Start),
    ));
    let coordinator = ready(&started);
    let reported = report_branch(
        &started,
        &coordinator,
        &conn(1),
        E1,
        &idle(&["m-1"]),
        &ids(),
        260,
    )
    .unwrap();
    let facts = reported.session.unwrap().facts;
    assert_eq!(clock(&facts).running_since_ms, None);
    assert_eq!(clock(&facts).consumed_ms, 200);
}

#[test]
fn a_disconnect_suspends_the_clock_and_the_new_epochs_start_repeat_resumes_it() {
    let session = sent_step_with_budget(1_000);
    let coordinator = ready(&session);
    let (started, _) = after(report_turn(
        &session,
        &coordinator,
        &conn(1),
        E1,
        &turn_report("m-1", "t-1", TurnPhase::Start),
        &ids(),
        100,
    ));
    // While the connection is active, nothing is suspended.
    assert_eq!(suspend_clocks(&started, &coordinator, 300), None);
    let gone = disconnect(&coordinator, &conn(1)).facts;
    let suspended = suspend_clocks(&started, &gone, 300).expect("the clock stops");
    assert!(suspended.outputs.contains(&Output::PublishSession {
        session_id: SessionId::from("s-1")
    }));
    let suspended = suspended.facts;
    assert_eq!(clock(&suspended).consumed_ms, 200);
    assert_eq!(clock(&suspended).running_since_ms, None);
    assert_eq!(suspend_clocks(&suspended, &gone, 400), None, "nothing runs");
    assert_eq!(
        suspended.turns[0].state,
        TurnState::Open,
        "the turn stays open"
    );

    // A new connection reports the branch (busy), then repeats the open
    // turn's start: the clock runs again with its 200 ms kept.
    let next = connect(&gone, conn(2)).facts;
    let e2 = CoordinatorEpoch(2);
    let next = report_branch(&suspended, &next, &conn(2), e2, &busy(), &[], 5_000)
        .unwrap()
        .coordinator;
    let repeat = report_turn(
        &suspended,
        &next,
        &conn(2),
        e2,
        &turn_report("m-1", "t-1", TurnPhase::Start),
        &ids(),
        5_000,
    )
    .unwrap();
    assert_eq!(repeat.receipt.ownership, TurnOwnership::Active);
    let resumed = repeat.session.expect("the clock changed");
    assert_eq!(deadline_wakes(&resumed.outputs), vec![5_800]);
    assert_eq!(clock(&resumed.facts).running_since_ms, Some(5_000));
    assert_eq!(clock(&resumed.facts).consumed_ms, 200);
    // A second repeat changes nothing.
    let again = report_turn(
        &resumed.facts,
        &next,
        &conn(2),
        e2,
        &turn_report("m-1", "t-1", TurnPhase::Start),
        &ids(),
        5_100,
    )
    .unwrap();
    assert_eq!(again.session, None);
}

#[test]
fn an_aborted_turn_stops_the_clock_before_the_pause() {
    let session = sent_step_with_budget(1_000);
    let (started, _) = after(report(
        &session,
        &turn_report("m-1", "t-1", TurnPhase::Start),
    ));
    let aborted = report_turn(
        &started,
        &ready(&started),
        &conn(1),
        E1,
        &turn_report("m-1", "t-1", end(StopReason::Aborted)),
        &ids(),
        90,
    )
    .unwrap();
    let facts = aborted.session.unwrap().facts;
    assert!(facts.runs[0].paused);
    assert_eq!(clock(&facts).running_since_ms, None);
    assert_eq!(clock(&facts).consumed_ms, 30);
}

#[test]
fn a_terminal_or_decision_turn_runs_no_clock() {
    let mut session = sent_step_with_budget(1_000);
    push(
        &mut session,
        "term",
        MessageKind::Terminal,
        MessageState::Sent,
    );
    make_terminal(&mut session, TerminalKind::Completed);
    let reported = report(&session, &turn_report("term", "t-9", TurnPhase::Start)).unwrap();
    let facts = reported.session.unwrap();
    assert!(deadline_wakes(&facts.outputs).is_empty());
    assert!(!clock(&facts.facts).is_running());
}
