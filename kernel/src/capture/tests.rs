use super::*;
use crate::fixtures;
use alloc::string::String;
use alloc::vec;

fn event(seq: u64, event_type: &str) -> IncomingEvent {
    IncomingEvent {
        seq,
        event_type: String::from(event_type),
        digest: Digest::repeat(seq as u8),
        data_bytes: 10,
    }
}

fn batch(from: u64, to: u64) -> Vec<IncomingEvent> {
    (from..=to)
        .map(|seq| event(seq, "assistant_event"))
        .collect()
}

fn recorded(facts: &CaptureFacts, batch: &[IncomingEvent]) -> Recorded {
    record(facts, batch).expect("accepted")
}

/// The facts after `recorded`, with the stored digests of `stored` (what the
/// shell loads for a batch that repeats them).
fn with_overlap(recorded: &Recorded, stored: &[IncomingEvent]) -> CaptureFacts {
    CaptureFacts {
        overlap: stored.iter().map(|e| (e.seq, e.digest)).collect(),
        ..recorded.facts.clone()
    }
}

#[test]
fn numbers_start_at_one_and_run_on_without_gaps() {
    let empty = CaptureFacts::default();
    assert_eq!(
        record(&empty, &batch(2, 3)),
        Err(CaptureRejection::Gap { expected: 1 })
    );
    assert_eq!(
        record(&empty, &[event(0, "x")]),
        Err(CaptureRejection::Gap { expected: 1 })
    );
    let first = recorded(&empty, &batch(1, 3));
    assert_eq!(first.new, vec![1, 2, 3]);
    assert_eq!(first.facts.stored, 3);
    assert_eq!(
        record(&first.facts, &batch(5, 6)),
        Err(CaptureRejection::Gap { expected: 4 }),
        "a gap is refused"
    );
    let mut holes = batch(4, 6);
    holes[1].seq = 9;
    assert_eq!(
        record(&first.facts, &holes),
        Err(CaptureRejection::Gap { expected: 4 }),
        "a batch is contiguous"
    );
    assert_eq!(recorded(&first.facts, &batch(4, 4)).new, vec![4]);
}

#[test]
fn a_repeated_prefix_adopts_by_digest_and_another_content_conflicts() {
    let sent = batch(1, 3);
    let first = recorded(&CaptureFacts::default(), &sent);
    let repeat = recorded(&with_overlap(&first, &sent), &sent);
    assert_eq!((repeat.adopted, repeat.new.len()), (3, 0));
    assert_eq!(repeat.facts.stored, 3);
    // A retry that overlaps and goes on: the stored part adopts, the rest is new.
    let mut longer = batch(2, 5);
    let overlap = with_overlap(&first, &sent[1..]);
    let grown = recorded(&overlap, &longer);
    assert_eq!((grown.adopted, grown.new.clone()), (2, vec![4, 5]));
    longer[0].digest = Digest::repeat(0xee);
    assert_eq!(
        record(&overlap, &longer),
        Err(CaptureRejection::Conflict { seq: 2 })
    );
}

#[test]
fn batches_events_and_runs_are_bounded() {
    let empty = CaptureFacts::default();
    assert_eq!(
        record(&empty, &[]),
        Err(CaptureRejection::BatchSize { events: 0 })
    );
    assert_eq!(
        record(&empty, &batch(1, MAX_BATCH as u64 + 1)),
        Err(CaptureRejection::BatchSize {
            events: MAX_BATCH + 1
        })
    );
    assert_eq!(
        recorded(&empty, &batch(1, MAX_BATCH as u64)).new.len(),
        MAX_BATCH
    );
    let mut large = batch(1, 2);
    large[1].data_bytes = MAX_EVENT_BYTES + 1;
    assert_eq!(
        record(&empty, &large),
        Err(CaptureRejection::EventTooLarge { seq: 2 })
    );
    large[1].data_bytes = MAX_EVENT_BYTES;
    assert!(record(&empty, &large).is_ok());
    let nearly_full = CaptureFacts {
        stored: MAX_RUN_EVENTS - 1,
        ..CaptureFacts::default()
    };
    let last = MAX_RUN_EVENTS;
    assert!(record(&nearly_full, &batch(last, last)).is_ok());
    assert_eq!(
        record(&nearly_full, &batch(last, last + 1)),
        Err(CaptureRejection::RunFull)
    );
}

#[test]
fn a_checkpoint_follows_every_256th_event_with_the_replay_state() {
    let mut events: Vec<IncomingEvent> = vec![
        event(1, "turn_started"),
        event(2, "message_started"),
        event(3, "tool_execution_started"),
    ];
    for seq in 4..=255 {
        events.push(event(seq, "assistant_event"));
    }
    events.push(event(256, "message_finished"));
    let first = recorded(&CaptureFacts::default(), &events);
    assert_eq!(first.checkpoints.len(), 1);
    let checkpoint = &first.checkpoints[0];
    assert_eq!(checkpoint.through_seq, 256);
    assert!(checkpoint.turn_open);
    assert_eq!(checkpoint.open_messages, Vec::<u64>::new());
    assert_eq!(checkpoint.open_tools, vec![3]);
    assert!(!checkpoint.truncated);

    // The next one comes after event 512, whatever the batches.
    let mut facts = first.facts;
    let mut seen = Vec::new();
    for from in (257..=600).step_by(100) {
        let to = (from + 99).min(600);
        let next = recorded(&facts, &batch(from, to));
        seen.extend(next.checkpoints.iter().map(|c| c.through_seq));
        facts = next.facts;
    }
    assert_eq!(seen, vec![512]);
    // An adopted repeat writes no checkpoint again.
    let again = recorded(
        &CaptureFacts {
            overlap: vec![(512, event(512, "x").digest)],
            ..facts.clone()
        },
        &batch(512, 512),
    );
    assert!(again.checkpoints.is_empty());
}

#[test]
fn the_replay_state_stays_bounded_and_a_turn_end_closes_what_it_left_open() {
    let mut state = ReplayState::default();
    state.fold(1, "turn_started");
    for seq in 2..(2 + MAX_OPEN as u64 + 5) {
        state.fold(seq, "message_started");
    }
    assert_eq!(state.open_messages.len(), MAX_OPEN);
    assert!(state.truncated);
    assert_eq!(state.open_messages[0], 7, "the newest starts are kept");
    state.fold(100, "message_finished");
    assert_eq!(state.open_messages[0], 8);
    state.fold(101, "turn_finished");
    assert!(!state.turn_open);
    assert!(state.open_messages.is_empty() && state.open_tools.is_empty());
    assert_eq!(state.through_seq, 101);
}

#[test]
fn only_the_origin_session_through_its_active_epoch_records() {
    let interactive = fixtures::interactive_running(1).run;
    let origin = SessionId::from("s-1");
    assert_eq!(check_authority(&interactive, &origin, true), Ok(()));
    assert_eq!(
        check_authority(&interactive, &origin, false),
        Err(CaptureRejection::StaleCoordinator)
    );
    assert_eq!(
        check_authority(&interactive, &SessionId::from("s-2"), true),
        Err(CaptureRejection::NotOriginSession)
    );
    let headless = fixtures::live_run(2, "a", 10).run;
    assert_eq!(
        check_authority(&headless, &origin, true),
        Err(CaptureRejection::NotOriginSession)
    );
}
