use super::*;
use alloc::string::ToString;

fn s1() -> SessionId {
    SessionId::from("s-1")
}

fn intent() -> TurnIntentId {
    TurnIntentId::from("deferred-turn:aa")
}

fn terminal_message() -> SourceMessage {
    SourceMessage {
        message_id: MessageId::from("terminal:run-1"),
        session_id: s1(),
        terminal: true,
        sent: true,
        intent_id: Some(intent()),
    }
}

fn restart_of(run: &str) -> Digest {
    request_fingerprint(LaunchKind::Restart {
        run_id: &RunId::from(run),
    })
}

fn request(tool_call: &str, fingerprint: Digest) -> LaunchRequest {
    LaunchRequest {
        session_id: Some(s1()),
        tool_call_id: tool_call.to_string(),
        fingerprint,
    }
}

fn reserved(tool_call: &str, fingerprint: Digest) -> Reservation {
    Reservation {
        intent_id: intent(),
        tool_call_id: tool_call.to_string(),
        fingerprint,
        run_id: RunId::from("run-2"),
    }
}

#[test]
fn the_first_launch_of_a_decision_turn_is_reserved_against_its_intent() {
    let decided = select(
        Some(&terminal_message()),
        None,
        &request("tc.1", restart_of("run-1")),
    );
    assert_eq!(
        decided,
        Ok(Selected::Reserve {
            intent_id: intent()
        })
    );
}

#[test]
fn the_same_tool_call_with_the_same_request_adopts_the_reserved_run() {
    let existing = reserved("tc.1", restart_of("run-1"));
    let decided = select(
        Some(&terminal_message()),
        Some(&existing),
        &request("tc.1", restart_of("run-1")),
    );
    assert_eq!(
        decided,
        Ok(Selected::Adopt {
            run_id: RunId::from("run-2")
        })
    );
}

#[test]
fn another_tool_call_from_the_same_intent_is_refused_even_for_the_same_request() {
    let existing = reserved("tc.1", restart_of("run-1"));
    for fingerprint in [
        restart_of("run-1"),
        request_fingerprint(LaunchKind::Start {
            workflow_ref: "review",
            input_digest: Digest::repeat(1),
        }),
    ] {
        let decided = select(
            Some(&terminal_message()),
            Some(&existing),
            &request("tc.2", fingerprint),
        );
        assert_eq!(
            decided,
            Err(LaunchRefusal::AlreadySelected {
                run_id: RunId::from("run-2")
            })
        );
    }
}

#[test]
fn the_same_tool_call_with_another_request_is_refused() {
    let existing = reserved("tc.1", restart_of("run-1"));
    let decided = select(
        Some(&terminal_message()),
        Some(&existing),
        &request("tc.1", restart_of("run-9")),
    );
    assert_eq!(
        decided,
        Err(LaunchRefusal::ToolCallReused {
            run_id: RunId::from("run-2")
        })
    );
}

#[test]
fn only_a_sent_terminal_message_of_this_session_with_an_intent_opens_a_decision_turn() {
    let not_terminal = SourceMessage {
        terminal: false,
        ..terminal_message()
    };
    let not_sent = SourceMessage {
        sent: false,
        ..terminal_message()
    };
    let no_intent = SourceMessage {
        intent_id: None,
        ..terminal_message()
    };
    let other_session = SourceMessage {
        session_id: SessionId::from("s-2"),
        ..terminal_message()
    };
    for source in [
        None,
        Some(&not_terminal),
        Some(&not_sent),
        Some(&no_intent),
        Some(&other_session),
    ] {
        assert_eq!(
            select(source, None, &request("tc.1", restart_of("run-1"))),
            Err(LaunchRefusal::NotADecisionTurn)
        );
    }
}

#[test]
fn a_headless_launch_is_never_a_decision_turn_launch() {
    let headless = LaunchRequest {
        session_id: None,
        ..request("tc.1", restart_of("run-1"))
    };
    assert_eq!(
        select(Some(&terminal_message()), None, &headless),
        Err(LaunchRefusal::NotADecisionTurn)
    );
}

#[test]
fn a_reservation_of_another_intent_is_not_adopted() {
    let existing = Reservation {
        intent_id: TurnIntentId::from("deferred-turn:bb"),
        ..reserved("tc.1", restart_of("run-1"))
    };
    assert_eq!(
        select(
            Some(&terminal_message()),
            Some(&existing),
            &request("tc.1", restart_of("run-1"))
        ),
        Err(LaunchRefusal::NotADecisionTurn)
    );
}

#[test]
fn fingerprints_tell_launches_apart_and_repeat_for_the_same_request() {
    let start = |workflow: &str, input: u8| {
        request_fingerprint(LaunchKind::Start {
            workflow_ref: workflow,
            input_digest: Digest::repeat(input),
        })
    };
    assert_eq!(restart_of("run-1"), restart_of("run-1"));
    assert_ne!(restart_of("run-1"), restart_of("run-2"));
    assert_eq!(start("review", 1), start("review", 1));
    assert_ne!(start("review", 1), start("review", 2));
    assert_ne!(start("review", 1), start("triage", 1));
    // A restart and a start never share a fingerprint through their fields.
    assert_ne!(restart_of("review"), start("review", 1));
}
