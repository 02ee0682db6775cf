use super::*;
use crate::fixtures::{self, host_authority};
use crate::ids::{Digest, NodeId, SessionId};
use crate::run::{FailureClass, ReasonKind, RunAggregate, Terminal};
use alloc::vec;
use serde_json::{Value, json};

const INPUT: &str = r#"{"task":"fix the bug","weights":[1.5,2]}"#;

fn ended(agg: &RunAggregate, terminal: Terminal) -> RunRecord {
    run::finish(agg, Some(&host_authority(1)), terminal, 50)
        .expect("the live runner ends the run")
        .facts
        .run
}

fn node_failed() -> RunError {
    RunError {
        class: FailureClass::NodeFailed,
        reason: ReasonKind::NodeFailed,
        node_id: Some(NodeId::from("review")),
    }
}

fn facts<'a>(
    output_json: Option<&'a str>,
    restarts: &'a [RestartLineage],
    earlier: &'a [EarlierOutcome],
) -> TerminalFacts<'a> {
    TerminalFacts {
        workflow_name: "review",
        workflow_ref: "/project/.pi/workflows/review.workflow.ts",
        definition_digest: "sha256:def",
        input_json: INPUT,
        output_json,
        error_message: Some("verdict must be approve or reject"),
        fingerprint: Digest::repeat(0xf1),
        restarts,
        earlier,
    }
}

/// The facts block of a content: the JSON object between the header and
/// the instruction.
fn facts_of(content: &str) -> Value {
    let block = content
        .split("\n\n")
        .nth(1)
        .and_then(|part| part.split_once(":\n"))
        .map(|(_, json)| json)
        .expect("a facts block");
    serde_json::from_str(block).expect("the facts block is JSON")
}

fn built(run: &RunRecord, facts: &TerminalFacts<'_>) -> Built {
    build(run, facts, None, 7, 60).expect("built").facts
}

#[test]
fn only_a_terminal_interactive_run_that_no_continuation_settled_has_a_recipient() {
    let live = fixtures::interactive_running(1);
    assert_eq!(recipient(&live.run), Err(TerminalRejection::NotTerminal));

    let completed = ended(&live, Terminal::Completed);
    assert_eq!(recipient(&completed), Ok(&SessionId::from("s-1")));

    let headless = ended(&fixtures::live_run(2, "a", 10), Terminal::Completed);
    assert_eq!(recipient(&headless), Err(TerminalRejection::Headless));

    // A parent settled by its continuation is `completed` but is not the
    // chain's final leaf; its continuation is.
    let waiting = fixtures::waiting_at_checkpoint(&fixtures::interactive_running(3), "check", 30);
    let reserved = run::reserve_continuation(&waiting, RunId::from("run-3-c"), 40)
        .expect("the continuation is reserved");
    let parent = reserved.parent.facts.run;
    assert_eq!(parent.status, RunStatus::Completed);
    assert_eq!(
        recipient(&parent),
        Err(TerminalRejection::SettledByContinuation)
    );
    assert!(
        !reserved
            .parent
            .outputs
            .iter()
            .any(|output| matches!(output, Output::BuildTerminalMessage { .. })),
        "a settled parent does not even ask for one"
    );
    let mut leaf = reserved.child.facts.run;
    leaf.status = RunStatus::Completed;
    assert_eq!(recipient(&leaf), Ok(&SessionId::from("s-1")));
}

#[test]
fn the_message_is_pending_named_after_its_run_and_built_once() {
    let run = ended(&fixtures::interactive_running(1), Terminal::Completed);
    let transition =
        build(&run, &facts(Some("{}"), &[], &[]), None, 7, 60).expect("a final leaf gets one");
    let message = &transition.facts.message;
    assert_eq!(message.message_id, MessageId::from("terminal:run-1"));
    assert_eq!(message.kind, MessageKind::Terminal);
    assert_eq!(message.state, MessageState::Pending);
    assert_eq!((message.order, message.created_at_ms), (7, 60));
    assert_eq!(message.session_id, SessionId::from("s-1"));
    assert_eq!(
        transition.outputs,
        vec![Output::PublishSession {
            session_id: SessionId::from("s-1")
        }]
    );
    assert_eq!(
        build(&run, &facts(Some("{}"), &[], &[]), Some(message), 8, 70),
        Err(TerminalRejection::AlreadyBuilt),
        "building again finds the stored message"
    );
}

#[test]
fn a_completed_run_carries_identity_exact_input_and_its_result() {
    let run = ended(&fixtures::interactive_running(1), Terminal::Completed);
    let output = r#"{"shipped":true}"#;
    let content = built(&run, &facts(Some(output), &[], &[])).content;
    assert!(
        content.starts_with("Workflow review ended: completed (run run-1).\n"),
        "{content}"
    );
    assert!(
        content.contains(&alloc::format!("\"input\":{INPUT},")),
        "the exact stored input text: {content}"
    );
    let facts = facts_of(&content);
    assert_eq!(
        facts,
        json!({
            "definitionDigest": "sha256:def",
            "earlierOutcomes": [],
            "error": null,
            "input": {"task": "fix the bug", "weights": [1.5, 2]},
            "restart": {"allowed": false, "count": 0, "limit": 3, "refusal": "completed"},
            "result": {"shipped": true},
            "resultBytes": output.len(),
            "resultTruncated": false,
            "runId": "run-1",
            "schema": FACTS_SCHEMA,
            "state": "completed",
            "workflowName": "review",
            "workflowRef": "/project/.pi/workflows/review.workflow.ts",
        })
    );
    assert!(content.contains("Do not restart or repeat completed work."));
    assert!(content.contains("not from the user"));
    assert!(!content.contains("pi-workflows restart"), "{content}");
}

#[test]
fn a_result_over_16_kib_is_cut_at_a_character_boundary_and_marked() {
    let run = ended(&fixtures::interactive_running(1), Terminal::Completed);
    // 3-byte characters: 16 KiB is not a boundary.
    let long = alloc::format!("\"{}\"", "€".repeat(RESULT_LIMIT_BYTES));
    let content = built(&run, &facts(Some(&long), &[], &[])).content;
    let facts = facts_of(&content);
    assert_eq!(facts["resultTruncated"], true);
    assert_eq!(facts["resultBytes"], long.len());
    let prefix = facts["result"]
        .as_str()
        .expect("a truncated result is a string");
    assert!(prefix.len() <= RESULT_LIMIT_BYTES && prefix.len() > RESULT_LIMIT_BYTES - 4);
    assert!(long.starts_with(prefix));
    assert!(content.len() < 2 * RESULT_LIMIT_BYTES, "bounded content");

    let exact = alloc::format!("\"{}\"", "a".repeat(RESULT_LIMIT_BYTES - 2));
    let facts = facts_of(&built(&run, &self::facts(Some(&exact), &[], &[])).content);
    assert_eq!(facts["resultTruncated"], false);
    assert_eq!(
        facts["result"].as_str().map(str::len),
        Some(RESULT_LIMIT_BYTES - 2)
    );
}

#[test]
fn a_failed_run_names_its_error_and_offers_a_restart_the_rule_allows() {
    let error = node_failed();
    let run = ended(
        &fixtures::interactive_running(1),
        Terminal::Failed {
            error: error.clone(),
        },
    );
    let content = built(&run, &facts(None, &[], &[])).content;
    let facts = facts_of(&content);
    assert_eq!(facts["state"], "failed");
    assert_eq!(
        facts["error"],
        json!({"class": "nodeFailed", "message": "verdict must be approve or reject",
               "messageTruncated": false, "nodeId": "review", "reason": "nodeFailed"})
    );
    assert_eq!(facts["result"], Value::Null);
    assert_eq!(
        facts["restart"],
        json!({"allowed": true, "count": 0, "limit": 3})
    );
    assert!(content.contains("prefer one safe restart"), "{content}");
    assert!(
        content.contains("`pi-workflows restart run-1`"),
        "{content}"
    );
}

#[test]
fn a_restart_chain_shows_its_count_its_earlier_outcomes_and_the_rules_refusal() {
    let error = node_failed();
    let mut run = ended(
        &fixtures::interactive_running(4),
        Terminal::TimedOut {
            error: error.clone(),
        },
    );
    let root = RunId::from("run-1");
    let restart = |number: u32, parent: &str, fingerprint: u8| RestartLineage {
        root_run_id: root.clone(),
        parent_run_id: RunId::from(parent),
        number,
        parent_fingerprint: Digest::repeat(fingerprint),
    };
    let restarts = [
        restart(1, "run-1", 1),
        restart(2, "run-2", 2),
        restart(3, "run-3", 3),
    ];
    run.lineage.restart = Some(restarts[2].clone());
    let earlier = [
        EarlierOutcome {
            run_id: RunId::from("run-1"),
            status: RunStatus::Failed,
            error: Some(error.clone()),
        },
        EarlierOutcome {
            run_id: RunId::from("run-2"),
            status: RunStatus::Cancelled,
            error: None,
        },
    ];
    let content = built(&run, &facts(None, &restarts, &earlier)).content;
    let facts = facts_of(&content);
    assert_eq!(
        facts["restart"],
        json!({"allowed": false, "count": 3, "limit": 3, "refusal": "limitReached"})
    );
    assert_eq!(
        facts["earlierOutcomes"],
        json!([
            {"error": {"class": "nodeFailed", "nodeId": "review", "reason": "nodeFailed"},
             "runId": "run-1", "state": "failed"},
            {"error": null, "runId": "run-2", "state": "cancelled"},
        ])
    );
    assert_eq!(facts["state"], "timed_out");
    assert_eq!(
        serde_json::to_value(presentation(&run, &self::facts(None, &restarts, &earlier))).unwrap(),
        json!({"workflowName": "review", "state": "timed_out", "reasonKind": "nodeFailed",
               "restart": {"count": 3, "limit": 3}}),
        "the card's fields: the chain's restart count, never input, result or instruction"
    );
    assert!(content.contains("Do not restart it"), "{content}");
    assert!(!content.contains("pi-workflows restart"), "{content}");

    // The same failure restarted before: a repeated failure.
    let mut once = ended(
        &fixtures::interactive_running(2),
        Terminal::Failed { error },
    );
    once.lineage.restart = Some(restarts[0].clone());
    let repeated = [restart(1, "run-1", 0xf1)];
    let facts = facts_of(&built(&once, &self::facts(None, &repeated, &[])).content);
    assert_eq!(facts["restart"]["refusal"], "repeatedFailure");
}

#[test]
fn a_cancelled_run_asks_for_no_restart() {
    let run = ended(&fixtures::interactive_running(1), Terminal::Cancelled);
    let content = built(&run, &facts(None, &[], &[])).content;
    let facts = facts_of(&content);
    assert_eq!(facts["state"], "cancelled");
    assert_eq!(facts["restart"]["refusal"], "cancelled");
    assert!(content.contains("Do not restart it or continue its work"));
    assert_eq!(facts["error"], Value::Null);
}
