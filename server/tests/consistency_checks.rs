//! Every consistency check catches the bug it exists for. Real runs through
//! a real server (scripted runner) leave a consistent state file; then, for
//! every check of `support::CONSISTENCY_CHECKS`, a private copy of that file
//! gets exactly the corruption the check exists to catch, planted with
//! direct SQL (the rows a broken server could commit), and
//! `consistency_violations` must report that check and no other.

mod support;

use pi_workflows_client::{Connection as Client, RequestSpec};
use rusqlite::Connection;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;
use support::*;

/// The fixture's runs, one per workflow name (planting SQL finds a run by
/// its `workflow_name`): run status, queue status, park reason.
const FIXTURE_RUNS: &[(&str, &str, &str, Option<&str>)] = &[
    // a → b → c, completed.
    ("linear", "completed", "done", None),
    // a reserves, applies and settles one effect (applied, with a result).
    ("effects", "completed", "done", None),
    // draft → review (checkpoint): waiting for an answer.
    ("checkpoint", "waiting", "parked", None),
    // gate (a human decision): waiting on its pending decision.
    ("gate", "waiting", "parked", None),
    // a fails.
    ("failing", "failed", "failed", None),
    // cancelled inside its slow node a (the attempt ends `cancelled`).
    ("slow", "cancelled", "cancelled", None),
    // paused inside a (attempt abandoned, runner g1 cancelled), its script
    // edited, resumed: runner g2 reports the changed source and the run
    // parks for review.
    (
        "editable",
        "running",
        "parked",
        Some("workflowSourceChanged"),
    ),
];

/// One planted corruption: the bug in words, the checks it must trip, and
/// the SQL that commits it (on a copy, with foreign keys off, so that the
/// SQL writes exactly the rows it names).
struct Planted {
    bug: &'static str,
    trips: &'static [&'static str],
    sql: &'static str,
}

const PAIR: &str = "run/queue pair outside the state table";
const CLAIM: &str = "claim held outside running/starting|running";
const TWO_UNFINISHED: &str = "more than one unfinished attempt";
const ACTIVE_WITHOUT_SLOT: &str = "active attempt on a run without a live runner slot";
const NO_FINISHED_AT: &str = "terminal run without finished_at";
const TWO_LIVE_EPOCHS: &str = "more than one live runner epoch";
const STRAY_FAILED: &str = "failed event while the run is not failed";
const STRAY_COMPLETED: &str = "completed event while the run is not completed";
const MISSING_COMPLETED: &str = "completed run without its completed event";
const UNFINISHED_ON_TERMINAL: &str = "unfinished attempt on a terminal run";
const LIVE_EPOCH_ON_TERMINAL: &str = "live runner epoch on a terminal run";
const NEWER_THAN_LEASE: &str = "a runner epoch or attempt of a generation newer than the lease";
const APPLYING_WITHOUT_SLOT: &str =
    "an applying effect on a run without a live runner slot (it must be ambiguous)";
const EFFECT_ATTEMPT: &str = "effect without a matching current effect attempt";
const APPLIED_WITHOUT_RESULT: &str = "applied effect without a result";
const START_RECEIPT: &str = "an accepted run.start receipt whose run does not exist";
const RUN_RECEIPT: &str = "an accepted run command receipt for a run that does not exist";
const MESSAGE_RECEIPT: &str = "a runner-message receipt of an unknown runner epoch";
const RESULT_TWICE: &str = "a node visit with more than one finished result";
const NO_PARK_REASON: &str = "parked run without a park reason";
const NO_PRESENTATION: &str = "a run without a presentation revision";
const PATCH_OUTSIDE: &str = "a patch outside the retained revisions";
const MISSING_PATCH: &str = "a retained revision without its patch";
const VIEW_DISAGREES: &str = "a stored run view that disagrees with its run";
const TERMINAL_MESSAGE: &str =
    "a terminal message of a run that is not an ended final leaf, or a second one";
const INTENT_CLAIM: &str = "a turn intent claimed by a missing message or one of another run or session, or before it was eligible";
const UNCLAIMED_TERMINAL: &str = "a terminal message that claimed no turn intent";
const CAPTURE_GAP: &str = "a session capture whose events are not numbered 1..n without gaps";
const STRAY_EVENT: &str = "an event of a run that does not exist";
const LOST_LINEAGE: &str = "a restart or continuation whose chain root or parent does not exist";
const STRAY_TURN: &str = "a workflow turn of a run that does not exist";
const MISSING_BLOB: &str = "a reference to a blob that does not exist";
const DECISION_OFF_CHECKPOINT: &str =
    "a pending decision on a run that does not wait on its checkpoint";
const DECISION_UNCONTINUED: &str = "an accepted decision without the continuation of its run";
const DECISION_SOURCE: &str =
    "who answered recorded for anything but a person's accepted answer, or missing for one";

const PLANTED: &[Planted] = &[
    Planted {
        bug: "a pending decision left on another node than the one its run waits on",
        trips: &[DECISION_OFF_CHECKPOINT],
        sql: "UPDATE human_decisions SET node_id = 'elsewhere'
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'gate')",
    },
    Planted {
        bug: "a decision accepted without continuing its waiting run",
        trips: &[DECISION_UNCONTINUED],
        sql: "UPDATE human_decisions SET state = 'accepted', provenance = 'human', answer_digest = (SELECT input_digest FROM runs r WHERE r.run_id = human_decisions.run_id),
                answer_channel = 'cli', answer_actor_id = 'someone'
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'gate')",
    },
    Planted {
        bug: "who answered recorded on a decision nobody answered",
        trips: &[DECISION_SOURCE],
        sql: "UPDATE human_decisions SET answer_channel = 'cli', answer_actor_id = 'someone'
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'gate')",
    },
    Planted {
        bug: "a completed run whose queue slot ended failed",
        trips: &[PAIR],
        sql: "UPDATE run_queue SET status = 'failed'
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a waiting run whose queue slot is still running",
        trips: &[PAIR],
        sql: "UPDATE run_queue SET status = 'running'
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'checkpoint')",
    },
    Planted {
        bug: "a run committed without its queue slot",
        trips: &[PAIR],
        sql: "DELETE FROM run_queue
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'failing')",
    },
    Planted {
        bug: "the claim of a completed run was never released",
        trips: &[CLAIM],
        sql: "UPDATE leases SET owner_kind = 'host', owner_id = 'server', expires_at_ms = 9000000000000
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a run parked for review still holds its claim",
        trips: &[CLAIM],
        sql: "UPDATE leases SET owner_kind = 'host', owner_id = 'server', expires_at_ms = 9000000000000
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'editable')",
    },
    Planted {
        // The partial unique index `node_attempts_one_unfinished` forbids
        // this too; the check is the second line of defence, so the plant
        // drops the index first (as a schema that lost it would).
        bug: "two unfinished attempts on one waiting run",
        trips: &[TWO_UNFINISHED],
        sql: "DROP INDEX node_attempts_one_unfinished;
              UPDATE node_attempts SET status = 'waiting', outcome = NULL
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'checkpoint')",
    },
    Planted {
        bug: "the attempt a pause interrupted was never abandoned (the run is parked)",
        trips: &[ACTIVE_WITHOUT_SLOT],
        sql: "UPDATE node_attempts SET status = 'active'
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'editable')",
    },
    Planted {
        bug: "a node's result recorded twice (a crashed step rerun as a new result of the same visit)",
        trips: &[RESULT_TWICE],
        sql: "INSERT INTO node_attempts (run_id, attempt_id, seq, node_id, visit, generation, status,
                outcome, carried, started_at_ms, deadline_at_ms, finished_at_ms, crash_retries,
                status_detail, output_digest, error_message, action_json, step_index)
              SELECT run_id, attempt_id || '-again', seq + 1000, node_id, visit, generation, status,
                outcome, carried, started_at_ms, deadline_at_ms, finished_at_ms, crash_retries,
                status_detail, output_digest, error_message, action_json, step_index + 1000
              FROM node_attempts
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')
                AND node_id = 'b'",
    },
    Planted {
        bug: "a checkpoint attempt still active while its run waits",
        trips: &[ACTIVE_WITHOUT_SLOT],
        sql: "UPDATE node_attempts SET status = 'active', outcome = NULL
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'checkpoint')
                AND node_id = 'review'",
    },
    Planted {
        bug: "a cancelled run without its finish time",
        trips: &[NO_FINISHED_AT],
        sql: "UPDATE runs SET finished_at_ms = NULL WHERE workflow_name = 'slow'",
    },
    Planted {
        // The partial unique index `run_workers_one_active` forbids this
        // too; the plant drops it first (see the two-attempts case).
        bug: "both runner epochs of a (non-terminal) run are live",
        trips: &[TWO_LIVE_EPOCHS],
        sql: "DROP INDEX run_workers_one_active;
              UPDATE run_workers SET status = 'ready', outcome = NULL
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'editable')",
    },
    Planted {
        bug: "a failed event appended to a completed run",
        trips: &[STRAY_FAILED],
        sql: "INSERT INTO events (run_id, recorded_at_ms, kind, payload)
              SELECT run_id, updated_at_ms, 'failed', '{}' FROM runs WHERE workflow_name = 'linear'",
    },
    Planted {
        bug: "a completed event appended to a failed run",
        trips: &[STRAY_COMPLETED],
        sql: "INSERT INTO events (run_id, recorded_at_ms, kind, payload)
              SELECT run_id, updated_at_ms, 'completed', '{}' FROM runs WHERE workflow_name = 'failing'",
    },
    Planted {
        bug: "a run completed without its completed event",
        trips: &[MISSING_COMPLETED],
        sql: "DELETE FROM events WHERE kind = 'completed'
                AND run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a completed run whose last attempt is still waiting",
        trips: &[UNFINISHED_ON_TERMINAL],
        sql: "UPDATE node_attempts SET status = 'waiting', outcome = NULL
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear') AND node_id = 'c'",
    },
    Planted {
        // An active attempt on a terminal run is necessarily also active
        // without a live runner slot (a terminal run has none): both fire.
        bug: "a cancel that left the interrupted attempt active",
        trips: &[ACTIVE_WITHOUT_SLOT, UNFINISHED_ON_TERMINAL],
        sql: "UPDATE node_attempts SET status = 'active', outcome = NULL
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'slow')",
    },
    Planted {
        bug: "a completed run whose runner exit was never recorded",
        trips: &[LIVE_EPOCH_ON_TERMINAL],
        sql: "UPDATE run_workers SET status = 'ready', outcome = NULL
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a runner epoch launched at a generation the lease never granted",
        trips: &[NEWER_THAN_LEASE],
        sql: "UPDATE run_workers SET generation = generation + 1
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "an attempt recorded at a generation the lease never granted",
        trips: &[NEWER_THAN_LEASE],
        sql: "UPDATE node_attempts SET generation = generation + 1
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear') AND node_id = 'c'",
    },
    Planted {
        bug: "a lease whose generation went back below its newest runner epoch",
        trips: &[NEWER_THAN_LEASE],
        sql: "UPDATE leases SET generation = generation - 1
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'editable')",
    },
    Planted {
        bug: "an effect left applying after its run completed",
        trips: &[APPLYING_WITHOUT_SLOT],
        sql: "UPDATE effects SET state = 'applying', result_digest = NULL
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'effects');
              UPDATE effect_attempts SET state = 'applying', finished_at_ms = NULL
              WHERE effect_id IN (SELECT effect_id FROM effects
                WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'effects'))",
    },
    Planted {
        bug: "an effect settled applied while its attempt still says applying",
        trips: &[EFFECT_ATTEMPT],
        sql: "UPDATE effect_attempts SET state = 'applying', finished_at_ms = NULL",
    },
    Planted {
        bug: "an effect without any attempt",
        trips: &[EFFECT_ATTEMPT],
        sql: "DELETE FROM effect_attempts",
    },
    Planted {
        bug: "an effect whose current attempt number was never recorded",
        trips: &[EFFECT_ATTEMPT],
        sql: "UPDATE effects SET attempt_number = attempt_number + 1",
    },
    Planted {
        bug: "an effect settled applied without its result",
        trips: &[APPLIED_WITHOUT_RESULT],
        sql: "UPDATE effects SET result_digest = NULL",
    },
    Planted {
        bug: "a run.start receipt committed without its run",
        trips: &[START_RECEIPT],
        sql: "UPDATE host_commands SET receipt_json = json_set(receipt_json, '$.receipt.runId', 'run-never-created')
              WHERE operation = 'run.start'
                AND json_extract(receipt_json, '$.receipt.runId') = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a run.cancel receipt stored under a run that does not exist",
        trips: &[RUN_RECEIPT],
        sql: "UPDATE host_commands SET run_id = 'run-never-created' WHERE operation = 'run.cancel'",
    },
    Planted {
        // The cancelled run has both receipts (its run.start and its
        // run.cancel): losing the run orphans both, so both checks fire.
        // A partly deleted run: its receipts and events stay behind.
        bug: "a cancelled run lost with its receipts kept",
        trips: &[START_RECEIPT, RUN_RECEIPT, STRAY_EVENT],
        sql: "DELETE FROM runs WHERE workflow_name = 'slow'",
    },
    Planted {
        bug: "runner-message receipts kept after their runner epoch was lost",
        trips: &[MESSAGE_RECEIPT],
        sql: "DELETE FROM run_workers
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a runner-message receipt of an epoch never launched",
        trips: &[MESSAGE_RECEIPT],
        sql: "INSERT INTO worker_messages (runner_epoch, message_id, payload_digest, outcome, revision,
                reply_json, reply_digest, created_at_ms)
              SELECT 're-never-launched', 're-never-launched-m1', payload_digest, outcome, revision,
                reply_json, reply_digest, created_at_ms
              FROM worker_messages LIMIT 1",
    },
    Planted {
        bug: "a run parked (not paused) without a reason",
        trips: &[NO_PARK_REASON],
        sql: "UPDATE runs SET park_reason = NULL WHERE workflow_name = 'editable'",
    },
    Planted {
        bug: "a run without its viewer projection",
        trips: &[NO_PRESENTATION],
        sql: "DELETE FROM viewer_runs
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a run whose viewer projection never got a revision",
        trips: &[NO_PRESENTATION],
        sql: "UPDATE viewer_runs SET presentation_revision = 0, retained_floor = 0
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear');
              DELETE FROM viewer_deltas
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "the newest patch stored under a revision after the run's",
        trips: &[PATCH_OUTSIDE],
        sql: "UPDATE viewer_deltas SET presentation_revision = presentation_revision + 1
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')
                AND presentation_revision = (SELECT presentation_revision FROM viewer_runs
                  WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear'))",
    },
    Planted {
        bug: "the first patch stored under a pruned revision",
        trips: &[PATCH_OUTSIDE],
        sql: "UPDATE viewer_deltas SET presentation_revision = 0
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')
                AND presentation_revision = 1",
    },
    Planted {
        // Raising the floor without pruning leaves patches at or below the
        // floor, and those count as retained revisions too: both fire.
        bug: "the retained floor raised without pruning its patches",
        trips: &[PATCH_OUTSIDE, MISSING_PATCH],
        sql: "UPDATE viewer_runs SET retained_floor = 2
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a presentation revision committed without its patch",
        trips: &[MISSING_PATCH],
        sql: "UPDATE viewer_runs SET presentation_revision = presentation_revision + 1
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a retained patch lost",
        trips: &[MISSING_PATCH],
        sql: "DELETE FROM viewer_deltas
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'effects')
                AND presentation_revision = 3",
    },
    Planted {
        bug: "a completed run's view stored with another run's header (waiting)",
        trips: &[VIEW_DISAGREES],
        sql: "UPDATE viewer_runs SET header_json = (SELECT header_json FROM viewer_runs
                WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'checkpoint'))
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'linear')",
    },
    Planted {
        bug: "a run paused without a new view",
        trips: &[VIEW_DISAGREES],
        sql: "UPDATE runs SET paused = 1 WHERE workflow_name = 'editable'",
    },
    Planted {
        bug: "a view that shows a parked run as paused",
        trips: &[VIEW_DISAGREES],
        sql: "UPDATE viewer_runs SET header_json = json_set(header_json, '$.status.paused', json('true'))
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'editable')",
    },
    Planted {
        bug: "a view stored without its header",
        trips: &[VIEW_DISAGREES],
        sql: "UPDATE viewer_runs SET header_json = NULL
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'failing')",
    },
    Planted {
        bug: "a view header without the run's status",
        trips: &[VIEW_DISAGREES],
        sql: "UPDATE viewer_runs SET header_json = json_remove(header_json, '$.status')
              WHERE run_id = (SELECT run_id FROM runs WHERE workflow_name = 'failing')",
    },
    Planted {
        bug: "a terminal message built for a run that still waits",
        trips: &[TERMINAL_MESSAGE],
        sql: "INSERT INTO workflow_messages (message_id, session_id, run_id, kind, content_digest, session_order,
                  state, created_at_ms, updated_at_ms)
              SELECT 'terminal:' || run_id, 's-planted', run_id, 'terminal', input_digest, 1, 'pending', 0, 0
              FROM runs WHERE workflow_name = 'checkpoint';
              INSERT INTO turn_intents (intent_id, source_id, session_id, run_id, cause, eligible_at_ms,
                  stops_by_default, message_id, created_at_ms)
              SELECT 'deferred-turn:planted', 'turn-source:planted', 's-planted', run_id, 'terminal', 0, 0,
                     'terminal:' || run_id, 0
              FROM runs WHERE workflow_name = 'checkpoint'",
    },
    Planted {
        bug: "a second terminal message for an ended run",
        trips: &[TERMINAL_MESSAGE, UNCLAIMED_TERMINAL],
        sql: "INSERT INTO workflow_messages (message_id, session_id, run_id, kind, content_digest, session_order,
                  state, created_at_ms, updated_at_ms)
              SELECT 'terminal-' || n || ':' || run_id, 's-planted', run_id, 'terminal', input_digest, n, 'pending', 0, 0
              FROM runs, (SELECT 1 AS n UNION SELECT 2) WHERE workflow_name = 'linear'",
    },
    Planted {
        bug: "a terminal message built without claiming its run's turn intent",
        trips: &[UNCLAIMED_TERMINAL],
        sql: "INSERT INTO workflow_messages (message_id, session_id, run_id, kind, content_digest, session_order,
                  state, created_at_ms, updated_at_ms)
              SELECT 'terminal:' || run_id, 's-planted', run_id, 'terminal', input_digest, 1, 'pending', 0, 0
              FROM runs WHERE workflow_name = 'linear';
              INSERT INTO turn_intents (intent_id, source_id, session_id, run_id, cause, eligible_at_ms,
                  stops_by_default, created_at_ms)
              SELECT 'deferred-turn:planted', 'turn-source:planted', 's-planted', run_id, 'terminal', 0, 0, 0
              FROM runs WHERE workflow_name = 'linear'",
    },
    Planted {
        bug: "a turn intent claimed by another run's message",
        trips: &[INTENT_CLAIM],
        sql: "INSERT INTO workflow_messages (message_id, session_id, run_id, kind, content_digest, session_order,
                  state, created_at_ms, updated_at_ms)
              SELECT 'terminal:' || run_id, 's-planted', run_id, 'terminal', input_digest, 1, 'pending', 0, 0
              FROM runs WHERE workflow_name = 'linear';
              INSERT INTO turn_intents (intent_id, source_id, session_id, run_id, cause, eligible_at_ms,
                  stops_by_default, message_id, created_at_ms)
              SELECT 'deferred-turn:planted', 'turn-source:planted', 's-planted', c.run_id, 'terminal', 0, 0,
                     'terminal:' || l.run_id, 0
              FROM runs l, runs c WHERE l.workflow_name = 'linear' AND c.workflow_name = 'checkpoint'",
    },
    Planted {
        bug: "a captured event stored past a gap",
        trips: &[CAPTURE_GAP],
        sql: "INSERT INTO session_captures (run_id, events, replay_state_json, updated_at_ms)
              SELECT run_id, 2, '{}', 0 FROM runs WHERE workflow_name = 'checkpoint';
              INSERT INTO session_events (run_id, run_seq, event_type, data_json, digest, recorded_at_ms)
              SELECT run_id, s, 'x', '{}', zeroblob(32), 0 FROM runs, (SELECT 1 AS s UNION SELECT 3)
              WHERE workflow_name = 'checkpoint'",
    },
    // What a partly deleted run tree, or a blob collected while referenced,
    // leaves behind (state retention).
    Planted {
        bug: "a run's row was deleted but its events were not",
        trips: &[STRAY_EVENT],
        sql: "INSERT INTO events (run_id, recorded_at_ms, kind, payload) VALUES ('deleted-run', 0, 'nodeStarted', '{}')",
    },
    Planted {
        bug: "a restart's chain root was deleted without the restart",
        trips: &[LOST_LINEAGE],
        sql: "UPDATE runs SET restart_root_run_id = 'deleted-root'
              WHERE workflow_name = 'failing'",
    },
    Planted {
        bug: "a workflow turn outlived its run",
        trips: &[STRAY_TURN],
        sql: "INSERT INTO workflow_turns (turn_id, message_id, run_id, session_id, state, started_at_ms)
              VALUES ('turn-1', 'message-1', 'deleted-run', 'session-1', 'completed', 0)",
    },
    Planted {
        bug: "a run's input blob was collected while the run still refers to it",
        trips: &[MISSING_BLOB],
        sql: "DELETE FROM blobs WHERE digest = (SELECT input_digest FROM runs WHERE workflow_name = 'linear')",
    },
];

/// The bytes of a consistent state file that real runs left behind (built
/// once per test binary; every case writes its own copy).
fn fixture() -> &'static [u8] {
    static FIXTURE: OnceLock<Vec<u8>> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(run_the_fixture())
    })
}

/// A slow linear run named `name`: node `a` sleeps 30 s.
fn slow_script(name: &str) -> Value {
    json!({
        "workflowName": name,
        "topology": linear_topology(&["a", "b"]),
        "nodes": {"a": [{"sleepMs": 30000, "then": {"finish": {"a": 1}}}]}
    })
}

/// Runs the `FIXTURE_RUNS` through a real server, stops it, and returns a
/// `VACUUM INTO` copy of its state file.
async fn run_the_fixture() -> Vec<u8> {
    let mut server = TestServer::start();
    let dir = server.scratch().to_path_buf();
    let effects = write_script(
        &dir,
        "effects.json",
        &json!({
            "workflowName": "effects",
            "topology": linear_topology(&["a", "b"]),
            "nodes": {"a": [{
                "effect": {"type": "mail", "request": {"to": "ops"}, "applyLog": "apply.log", "receipt": true},
                "then": {"finish": {"a": true}}
            }]}
        }),
    );
    let failing = write_script(
        &dir,
        "failing.json",
        &json!({
            "workflowName": "failing",
            "topology": linear_topology(&["a", "b"]),
            "nodes": {"a": [{"fail": "boom"}]}
        }),
    );
    let gate = write_script(
        &dir,
        "gate.json",
        &json!({
            "workflowName": "gate",
            "topology": {"startAt": "gate", "nodes": [{"id": "gate", "nodeType": "checkpoint", "humanDecision": true,
                          "timeout": {"kind": "default"}, "mountPath": []}], "edges": [], "mounts": []},
            "nodes": {"gate": [{"decide": {"title": "Ship?", "choices": [{"id": "approve", "label": "Approve"}]}}]}
        }),
    );
    let slow = write_script(&dir, "slow.json", &slow_script("slow"));
    let editable = write_script(&dir, "editable.json", &slow_script("editable"));

    let mut client = server.client().await;
    let linear = started(&mut client, &script("linear.json")).await;
    let effects = started(&mut client, &effects).await;
    let checkpoint = started(&mut client, &script("checkpoint.json")).await;
    let gate = started(&mut client, &gate).await;
    let failing = started(&mut client, &failing).await;
    let slow = started(&mut client, &slow).await;
    let editable_run = started(&mut client, &editable).await;

    for (run, expected) in [
        (&linear, "completed"),
        (&effects, "completed"),
        (&checkpoint, "waiting"),
        (&gate, "waiting"),
        (&failing, "failed"),
    ] {
        let view = wait_settled(&mut client, run).await;
        assert_eq!(status(&view), expected, "{view}");
    }

    // Both slow runs are inside node `a`: cancel one; pause the other,
    // edit its script and resume it.
    for run in [&slow, &editable_run] {
        wait_node_started(&server, run).await;
    }
    command(&mut client, "run.cancel", &slow).await;
    command(&mut client, "run.pause", &editable_run).await;
    let view = wait_settled(&mut client, &slow).await;
    assert_eq!(status(&view), "cancelled", "{view}");
    wait_view(
        &mut client,
        &editable_run,
        Duration::from_secs(10),
        |view| status(view) == "paused",
    )
    .await;
    wait_quiescent_at(&server).await;
    let mut edited = slow_script("editable");
    edited["nodes"] = json!({"a": [{"finish": {"edited": true}}]});
    write_script(&dir, "editable.json", &edited);
    command(&mut client, "run.resume", &editable_run).await;
    wait_view(
        &mut client,
        &editable_run,
        Duration::from_secs(10),
        |view| {
            view["display"]["reason"]
                .as_str()
                .is_some_and(|reason| reason.contains("source"))
        },
    )
    .await;
    wait_quiescent_at(&server).await;
    drop(client);
    server.stop();

    let copy = dir.join("fixture.sqlite");
    server
        .db()
        .execute("VACUUM INTO ?1", [copy.to_string_lossy()])
        .expect("copy the state file");
    std::fs::read(&copy).expect("read the copy")
}

/// Waits until `run` recorded its first `nodeStarted` event.
async fn wait_node_started(server: &TestServer, run: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count(
        &server.db(),
        "SELECT COUNT(*) FROM events WHERE run_id = ?1 AND kind = 'nodeStarted'",
        [run],
    ) == 0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{run} never started a node"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends a control command to `run`; it must be accepted.
async fn command(client: &mut Client, operation: &str, run: &str) {
    let response = client
        .request(&RequestSpec::command(operation, Some(run), json!({})))
        .await
        .expect(operation);
    assert_eq!(
        response.outcome, "accepted",
        "{operation}: {:?}",
        response.frame
    );
}

/// A private copy of the fixture in `dir`, open read-write.
fn copy_of_fixture(dir: &Path) -> Connection {
    let path = dir.join("state.sqlite");
    std::fs::write(&path, fixture()).expect("write the copy");
    let db = Connection::open(&path).expect("open the copy");
    db.execute_batch("PRAGMA foreign_keys = OFF")
        .expect("foreign keys off");
    db
}

/// The distinct check messages of `violations`; a violation that names no
/// check, or a check whose query failed, is returned as an error.
fn fired(violations: &[String]) -> Result<BTreeSet<&'static str>, String> {
    let mut messages = BTreeSet::new();
    for violation in violations {
        let check = CONSISTENCY_CHECKS
            .iter()
            .find(|check| violation.starts_with(&format!("{}: ", check.message)))
            .ok_or_else(|| format!("a violation of no known check: {violation}"))?;
        let row = &violation[check.message.len() + 2..];
        if row.starts_with("query failed: ") || row.starts_with("unreadable row: ") {
            return Err(format!("a check did not run: {violation}"));
        }
        messages.insert(check.message);
    }
    Ok(messages)
}

#[test]
fn real_runs_leave_a_consistent_state_file_with_every_kind_of_row() {
    let dir = tempfile::tempdir().unwrap();
    let db = copy_of_fixture(dir.path());
    for (name, run, queue, park) in FIXTURE_RUNS {
        let (actual_run, actual_queue, actual_park): (String, String, Option<String>) = db
            .query_row(
                "SELECT r.status, q.status, r.park_reason FROM runs r JOIN run_queue q USING (run_id)
                 WHERE r.workflow_name = ?1",
                [name],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .unwrap_or_else(|error| panic!("the {name} run: {error}"));
        assert_eq!(
            (
                actual_run.as_str(),
                actual_queue.as_str(),
                actual_park.as_deref()
            ),
            (*run, *queue, *park),
            "the {name} run"
        );
    }
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM runs", []),
        FIXTURE_RUNS.len() as i64
    );
    // The rows the planted cases change exist.
    for (what, sql, expected) in [
        (
            "an applied effect with a result and its attempt",
            "SELECT COUNT(*) FROM effects e JOIN effect_attempts a USING (effect_id)
             WHERE e.state = 'applied' AND a.state = 'applied' AND e.result_digest IS NOT NULL",
            1,
        ),
        (
            "two runner epochs of the parked run",
            "SELECT COUNT(*) FROM run_workers w JOIN runs r USING (run_id)
             WHERE r.workflow_name = 'editable' AND w.status = 'exited'",
            2,
        ),
        (
            "the parked run's abandoned attempt",
            "SELECT COUNT(*) FROM node_attempts a JOIN runs r USING (run_id)
             WHERE r.workflow_name = 'editable' AND a.status = 'abandoned'",
            1,
        ),
        (
            "an accepted run.start receipt per run",
            "SELECT COUNT(*) FROM host_commands WHERE operation = 'run.start' AND outcome = 'accepted'",
            FIXTURE_RUNS.len() as i64,
        ),
        (
            "an accepted run.cancel receipt",
            "SELECT COUNT(*) FROM host_commands WHERE operation = 'run.cancel' AND outcome = 'accepted'",
            1,
        ),
        (
            "a lease per run, none held",
            "SELECT COUNT(*) FROM leases WHERE owner_kind IS NULL",
            FIXTURE_RUNS.len() as i64,
        ),
        (
            "runs whose every presentation revision keeps its patch",
            "SELECT COUNT(*) FROM viewer_runs v WHERE v.retained_floor = 0 AND v.presentation_revision >= 3
               AND v.presentation_revision = (SELECT COUNT(DISTINCT presentation_revision) FROM viewer_deltas d WHERE d.run_id = v.run_id)",
            FIXTURE_RUNS.len() as i64,
        ),
    ] {
        assert_eq!(count(&db, sql, []), expected, "{what}");
    }
    assert!(
        count(&db, "SELECT COUNT(*) FROM worker_messages", []) > 0,
        "runner-message receipts"
    );
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}

#[test]
fn every_planted_corruption_trips_exactly_its_checks() {
    let mut failures = Vec::new();
    for planted in PLANTED {
        let dir = tempfile::tempdir().unwrap();
        let db = copy_of_fixture(dir.path());
        if let Err(error) = db.execute_batch(planted.sql) {
            failures.push(format!("{}: the plant failed: {error}", planted.bug));
            continue;
        }
        if db.total_changes() == 0 {
            failures.push(format!("{}: the plant changed no row", planted.bug));
            continue;
        }
        let violations = consistency_violations(&db);
        let expected: BTreeSet<&str> = planted.trips.iter().copied().collect();
        match fired(&violations) {
            Ok(fired) if fired == expected => {}
            Ok(fired) => failures.push(format!(
                "{}: expected {expected:?}, fired {fired:?} ({violations:?})",
                planted.bug
            )),
            Err(error) => failures.push(format!("{}: {error}", planted.bug)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} planted corruptions:\n{}",
        failures.len(),
        PLANTED.len(),
        failures.join("\n")
    );
}

#[test]
fn every_check_has_a_planted_case_that_trips_it_alone() {
    let known: BTreeSet<&str> = CONSISTENCY_CHECKS
        .iter()
        .map(|check| check.message)
        .collect();
    assert_eq!(
        known.len(),
        CONSISTENCY_CHECKS.len(),
        "two checks share a message"
    );
    for planted in PLANTED {
        for message in planted.trips {
            assert!(
                known.contains(message),
                "{}: no check reports {message:?}",
                planted.bug
            );
        }
    }
    let alone: BTreeSet<&str> = PLANTED
        .iter()
        .filter(|planted| planted.trips.len() == 1)
        .map(|planted| planted.trips[0])
        .collect();
    let uncovered: Vec<&str> = known.difference(&alone).copied().collect();
    assert!(
        uncovered.is_empty(),
        "checks without a planted case that trips them alone: {uncovered:?}"
    );
}

#[test]
fn a_check_whose_query_fails_is_reported_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let db = copy_of_fixture(dir.path());
    db.execute_batch("DROP TABLE effect_attempts").unwrap();
    let violations = consistency_violations(&db);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(
        violations[0].starts_with(&format!("{EFFECT_ATTEMPT}: query failed: ")),
        "{violations:?}"
    );
    assert!(fired(&violations).is_err());
}

#[test]
fn a_violation_row_that_is_not_text_is_reported_not_dropped() {
    let db = Connection::open_in_memory().unwrap();
    let checks = [
        Check {
            message: "a NULL row",
            sql: "SELECT NULL",
            quiescent_only: false,
        },
        Check {
            message: "an integer row",
            sql: "SELECT 7",
            quiescent_only: false,
        },
        Check {
            message: "a text row",
            sql: "SELECT 'run-1'",
            quiescent_only: false,
        },
    ];
    let violations = violations_of(&db, &checks);
    assert_eq!(violations.len(), 3, "{violations:?}");
    assert!(violations[0].starts_with("a NULL row: unreadable row: "));
    assert!(violations[1].starts_with("an integer row: unreadable row: "));
    assert_eq!(violations[2], "a text row: run-1");
}
