//! The consistency checks of committed state: cross-table invariants the
//! server's writes keep, each one query that lists its violations.
//! `state verify` runs them on the live database (or a backup), and the
//! server's black-box tests run them after every crash, fencing,
//! supervision, lifecycle and retention scenario (`server/tests/support`).
//!
//! Invariants:
//! - A check's `sql` selects one text row per violation, naming the
//!   offending rows by id only (never a payload); `message` says which
//!   invariant it broke. `server/tests/consistency_checks.rs` plants, for
//!   every check, the corruption it exists to catch.
//! - A check whose query fails, or whose row is not one text, is reported as
//!   a violation, never skipped silently.
//! - A `quiescent_only` check holds only while no runner is between its last
//!   message and its recorded exit; `state verify` skips it (and says so)
//!   while runners are live.

use rusqlite::Connection;

/// One cross-table invariant of committed state.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub message: &'static str,
    pub sql: &'static str,
    /// Holds only when every runner's exit is recorded.
    pub quiescent_only: bool,
}

/// Every check, in order.
pub const CHECKS: &[Check] = &[
    Check {
        message: "run/queue pair outside the state table",
        // A run without its queue row is a pair outside the table too (an
        // inner join would skip it).
        quiescent_only: false,
        sql: "SELECT r.run_id || ' ' || r.status || '/' || COALESCE(q.status, 'no queue row')
         FROM runs r LEFT JOIN run_queue q USING (run_id)
         WHERE q.status IS NULL OR NOT ((r.status = 'queued' AND q.status = 'queued')
             OR (r.status = 'running' AND q.status IN ('starting', 'running', 'parked'))
             OR (r.status = 'waiting' AND q.status = 'parked')
             OR (r.status = 'completed' AND q.status = 'done')
             OR (r.status IN ('failed', 'timed_out') AND q.status = 'failed')
             OR (r.status = 'cancelled' AND q.status = 'cancelled'))",
    },
    Check {
        message: "claim held outside running/starting|running",
        quiescent_only: false,
        sql: "SELECT l.run_id FROM leases l JOIN runs r USING (run_id) JOIN run_queue q USING (run_id)
         WHERE l.owner_kind IS NOT NULL AND NOT (r.status = 'running' AND q.status IN ('starting', 'running'))",
    },
    Check {
        message: "more than one unfinished attempt",
        quiescent_only: false,
        sql: "SELECT run_id FROM node_attempts WHERE status IN ('active', 'waiting') GROUP BY run_id HAVING COUNT(*) > 1",
    },
    Check {
        message: "active attempt on a run without a live runner slot",
        quiescent_only: false,
        sql: "SELECT a.run_id FROM node_attempts a JOIN runs r USING (run_id)
         WHERE a.status = 'active' AND NOT (r.status = 'running' AND r.run_id IN (SELECT run_id FROM run_queue WHERE status IN ('starting', 'running')))",
    },
    Check {
        message: "terminal run without finished_at",
        quiescent_only: false,
        sql: "SELECT run_id FROM runs WHERE status IN ('completed', 'failed', 'timed_out', 'cancelled') AND finished_at_ms IS NULL",
    },
    Check {
        message: "more than one live runner epoch",
        quiescent_only: false,
        sql: "SELECT run_id FROM run_workers WHERE status IN ('launching', 'ready') GROUP BY run_id HAVING COUNT(*) > 1",
    },
    Check {
        message: "failed event while the run is not failed",
        quiescent_only: false,
        sql: "SELECT e.run_id FROM events e JOIN runs r USING (run_id) WHERE e.kind = 'failed' AND r.status NOT IN ('failed')",
    },
    // Checks added with the crash-injection tests.
    Check {
        message: "completed event while the run is not completed",
        quiescent_only: false,
        sql: "SELECT e.run_id FROM events e JOIN runs r USING (run_id) WHERE e.kind = 'completed' AND r.status != 'completed'",
    },
    Check {
        message: "completed run without its completed event",
        quiescent_only: false,
        sql: "SELECT r.run_id FROM runs r WHERE r.status = 'completed' AND NOT EXISTS
           (SELECT 1 FROM events e WHERE e.run_id = r.run_id AND e.kind = 'completed')",
    },
    // Added with the fused commit (a node's result and the next attempt in
    // one commit): a crash on either side of it reruns only the dispatched
    // attempt, never records a result twice.
    Check {
        message: "a node visit with more than one finished result",
        quiescent_only: false,
        sql: "SELECT run_id || ' ' || node_id || ' v' || visit FROM node_attempts
         WHERE status = 'finished' GROUP BY run_id, node_id, visit HAVING COUNT(*) > 1",
    },
    Check {
        message: "unfinished attempt on a terminal run",
        quiescent_only: false,
        sql: "SELECT a.run_id || ' ' || a.node_id FROM node_attempts a JOIN runs r USING (run_id)
         WHERE a.status IN ('active', 'waiting') AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled')",
    },
    Check {
        message: "live runner epoch on a terminal run",
        quiescent_only: true,
        sql: "SELECT w.runner_epoch FROM run_workers w JOIN runs r USING (run_id)
         WHERE w.status IN ('launching', 'ready') AND r.status IN ('completed', 'failed', 'timed_out', 'cancelled')",
    },
    Check {
        message: "a runner epoch or attempt of a generation newer than the lease",
        quiescent_only: false,
        sql: "SELECT l.run_id FROM leases l
         WHERE l.generation < (SELECT MAX(generation) FROM run_workers w WHERE w.run_id = l.run_id)
            OR l.generation < (SELECT MAX(generation) FROM node_attempts a WHERE a.run_id = l.run_id AND a.carried = 0)",
    },
    Check {
        message: "an applying effect on a run without a live runner slot (it must be ambiguous)",
        quiescent_only: false,
        // A channel send or settlement is applied by its channel adapter, not
        // by a runner: it is applying while its run waits on the decision
        // (a lost adapter leaves it ambiguous, `kernel::channel`).
        sql: "SELECT e.effect_id FROM effects e JOIN run_queue q USING (run_id)
         WHERE e.state = 'applying' AND q.status NOT IN ('starting', 'running')
           AND e.effect_type NOT LIKE 'channel.send:%' AND e.effect_type NOT LIKE 'channel.settle:%'",
    },
    Check {
        message: "effect without a matching current effect attempt",
        quiescent_only: false,
        sql: "SELECT e.effect_id FROM effects e WHERE NOT EXISTS
           (SELECT 1 FROM effect_attempts a WHERE a.effect_id = e.effect_id AND a.attempt_number = e.attempt_number AND a.state = e.state)",
    },
    Check {
        message: "applied effect without a result",
        quiescent_only: false,
        sql: "SELECT e.effect_id FROM effects e WHERE e.state = 'applied' AND e.result_digest IS NULL",
    },
    Check {
        message: "an accepted run.start receipt whose run does not exist",
        quiescent_only: false,
        sql: "SELECT request_id FROM host_commands WHERE operation = 'run.start' AND outcome = 'accepted'
           AND json_extract(receipt_json, '$.receipt.runId') NOT IN (SELECT run_id FROM runs)",
    },
    Check {
        message: "an accepted run command receipt for a run that does not exist",
        quiescent_only: false,
        sql: "SELECT request_id FROM host_commands WHERE outcome = 'accepted' AND run_id IS NOT NULL
           AND run_id NOT IN (SELECT run_id FROM runs)",
    },
    Check {
        message: "a runner-message receipt of an unknown runner epoch",
        quiescent_only: false,
        sql: "SELECT m.runner_epoch || ' ' || m.message_id FROM worker_messages m
         WHERE m.runner_epoch NOT IN (SELECT runner_epoch FROM run_workers)",
    },
    // A resumed run waits parked without a reason until its admission
    // (`kernel::run::resume`; `RunRecord::is_admissible` admits it, `why`
    // says it waits for a runner slot): only a run whose latest park was not
    // followed by a resume (every park writes a `parked` event) is a violation (found by `crate::simulation`: `state
    // verify` flagged every resumed run that waited for capacity).
    Check {
        message: "parked run without a park reason",
        quiescent_only: false,
        sql: "SELECT r.run_id FROM runs r JOIN run_queue q USING (run_id)
         WHERE r.status = 'running' AND q.status = 'parked' AND r.park_reason IS NULL AND r.paused = 0
           AND (SELECT e.kind FROM events e WHERE e.run_id = r.run_id AND e.kind IN ('parked', 'resumed')
                ORDER BY e.seq DESC LIMIT 1) IS NOT 'resumed'",
    },
    // The viewer projection advances in the same commit as the change.
    Check {
        message: "a run without a presentation revision",
        quiescent_only: false,
        sql: "SELECT r.run_id FROM runs r LEFT JOIN viewer_runs v USING (run_id)
         WHERE v.run_id IS NULL OR v.presentation_revision < 1",
    },
    Check {
        message: "a patch outside the retained revisions",
        quiescent_only: false,
        sql: "SELECT d.run_id FROM viewer_deltas d JOIN viewer_runs v USING (run_id)
         WHERE d.presentation_revision > v.presentation_revision
            OR d.presentation_revision <= v.retained_floor",
    },
    Check {
        message: "a retained revision without its patch",
        quiescent_only: false,
        sql: "SELECT v.run_id FROM viewer_runs v
         WHERE v.presentation_revision - v.retained_floor
               <> (SELECT COUNT(DISTINCT presentation_revision) FROM viewer_deltas d WHERE d.run_id = v.run_id)",
    },
    // Protected human decisions.
    Check {
        message: "a pending decision on a run that does not wait on its checkpoint",
        quiescent_only: false,
        sql: "SELECT d.decision_id FROM human_decisions d JOIN runs r USING (run_id)
         WHERE d.state = 'pending' AND NOT (r.status = 'waiting' AND r.waiting_on IS d.node_id)",
    },
    Check {
        message: "an accepted decision without the continuation of its run",
        quiescent_only: false,
        sql: "SELECT d.decision_id FROM human_decisions d LEFT JOIN runs c ON c.run_id = d.continuation_run_id
         WHERE d.state = 'accepted' AND (c.run_id IS NULL OR c.continuation_of IS NOT d.run_id)",
    },
    Check {
        message: "who answered recorded for anything but a person's accepted answer, or missing for one",
        quiescent_only: false,
        sql: "SELECT decision_id FROM human_decisions
         WHERE COALESCE(state = 'accepted' AND provenance = 'human', 0)
            <> (answer_channel IS NOT NULL AND answer_actor_id IS NOT NULL)",
    },
    // Terminal messages (kernel::terminal) and session capture (kernel::capture).
    Check {
        message: "a terminal message of a run that is not an ended final leaf, or a second one",
        quiescent_only: false,
        sql: "SELECT m.message_id FROM workflow_messages m JOIN runs r USING (run_id)
         WHERE m.kind = 'terminal' AND (r.status NOT IN ('completed', 'failed', 'timed_out', 'cancelled')
             OR r.continued_by IS NOT NULL
             OR (SELECT COUNT(*) FROM workflow_messages o WHERE o.run_id = m.run_id AND o.kind = 'terminal') > 1)",
    },
    // Turn intents (kernel::intent): a claim names a message of the same
    // run and session, made once the intent was eligible; every terminal
    // message claimed its run's intent when it was built.
    Check {
        message: "a turn intent claimed by a missing message or one of another run or session, or before it was eligible",
        quiescent_only: false,
        sql: "SELECT i.intent_id FROM turn_intents i LEFT JOIN workflow_messages m ON m.message_id = i.message_id
         WHERE i.message_id IS NOT NULL
           AND (m.message_id IS NULL OR m.run_id <> i.run_id OR m.session_id <> i.session_id OR i.eligible_at_ms IS NULL)",
    },
    Check {
        message: "a terminal message that claimed no turn intent",
        quiescent_only: false,
        sql: "SELECT m.message_id FROM workflow_messages m
         WHERE m.kind = 'terminal' AND NOT EXISTS (SELECT 1 FROM turn_intents i WHERE i.message_id = m.message_id)",
    },
    Check {
        message: "a session capture whose events are not numbered 1..n without gaps",
        quiescent_only: false,
        sql: "SELECT c.run_id FROM session_captures c
         WHERE c.events <> (SELECT COUNT(*) FROM session_events e WHERE e.run_id = c.run_id)
            OR c.events <> COALESCE((SELECT MAX(run_seq) FROM session_events e WHERE e.run_id = c.run_id), 0)",
    },
    Check {
        message: "a stored run view that disagrees with its run",
        // `IS NOT`: a header that lacks the status (or is NULL) disagrees
        // too (`<>` with NULL is never true).
        quiescent_only: false,
        sql: "SELECT v.run_id FROM viewer_runs v JOIN runs r USING (run_id)
         WHERE json_extract(v.header_json, '$.status.run') IS NOT r.status
            OR json_extract(v.header_json, '$.status.paused') IS NOT (r.paused = 1)",
    },
    // Checks added with state retention: what a partly deleted run tree, or
    // a blob collected while referenced, would leave behind.
    Check {
        message: "an event of a run that does not exist",
        quiescent_only: false,
        sql: "SELECT e.seq || ' ' || e.run_id FROM events e
         WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = e.run_id)",
    },
    Check {
        message: "a restart or continuation whose chain root or parent does not exist",
        quiescent_only: false,
        sql: "SELECT r.run_id FROM runs r
         WHERE (r.restart_root_run_id IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM runs p WHERE p.run_id = r.restart_root_run_id))
            OR (r.continuation_of IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM runs p WHERE p.run_id = r.continuation_of))",
    },
    Check {
        message: "a workflow turn of a run that does not exist",
        quiescent_only: false,
        sql: "SELECT t.turn_id FROM workflow_turns t
         WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = t.run_id)",
    },
    Check {
        message: "a reference to a blob that does not exist",
        quiescent_only: false,
        // Every column of `retention::BLOB_REFERENCES` (a unit test there
        // keeps the two lists equal).
        sql: "SELECT x.what FROM (
           SELECT 'runs.input_digest ' || run_id AS what, input_digest AS digest FROM runs
           UNION ALL SELECT 'node_attempts.output_digest ' || run_id || ' ' || attempt_id, output_digest
             FROM node_attempts WHERE output_digest IS NOT NULL
           UNION ALL SELECT 'interactive_requests.prompt_digest ' || interaction_id, prompt_digest
             FROM interactive_requests WHERE prompt_digest IS NOT NULL
           UNION ALL SELECT 'interactive_submissions.payload_digest ' || submission_id, payload_digest
             FROM interactive_submissions WHERE payload_digest IS NOT NULL
           UNION ALL SELECT 'interactive_submissions.receipt_digest ' || submission_id, receipt_digest
             FROM interactive_submissions WHERE receipt_digest IS NOT NULL
           UNION ALL SELECT 'workflow_messages.content_digest ' || message_id, content_digest FROM workflow_messages
           UNION ALL SELECT 'effects.result_digest ' || effect_id, result_digest
             FROM effects WHERE result_digest IS NOT NULL
           UNION ALL SELECT 'human_decisions.answer_digest ' || decision_id, answer_digest
             FROM human_decisions WHERE answer_digest IS NOT NULL
           UNION ALL SELECT 'human_decisions.default_answer_digest ' || decision_id, default_answer_digest
             FROM human_decisions WHERE default_answer_digest IS NOT NULL
           UNION ALL SELECT 'run_workers.diagnostic_digest ' || runner_epoch, diagnostic_digest
             FROM run_workers WHERE diagnostic_digest IS NOT NULL
           UNION ALL SELECT 'worker_messages.content_digest ' || runner_epoch || ' ' || message_id, content_digest
             FROM worker_messages WHERE content_digest IS NOT NULL
           UNION ALL SELECT 'viewer_session_checkpoints.checkpoint_digest ' || run_id || ' ' || event_seq, checkpoint_digest
             FROM viewer_session_checkpoints
         ) x WHERE NOT EXISTS (SELECT 1 FROM blobs b WHERE b.digest = x.digest)",
    },
];

/// The violations of `checks` on `connection`, as `<message>: <row>` (empty
/// when consistent). A check whose query fails, or whose row is not one text
/// (a NULL from `||` with a NULL column), is reported as `<message>: query
/// failed: ...` or `<message>: unreadable row: ...`, never skipped.
pub fn violations_of(connection: &Connection, checks: &[Check]) -> Vec<String> {
    let mut violations = Vec::new();
    for check in checks {
        let rows: Vec<String> = connection
            .prepare(check.sql)
            .and_then(|mut statement| {
                statement
                    .query_map([], |row| row.get::<_, String>(0))
                    .map(|rows| {
                        rows.map(|row| {
                            row.unwrap_or_else(|error| format!("unreadable row: {error}"))
                        })
                        .collect()
                    })
            })
            .unwrap_or_else(|error| vec![format!("query failed: {error}")]);
        for row in rows {
            violations.push(format!("{}: {row}", check.message));
        }
    }
    violations
}
