//! Claim fencing: a runner that stalls past its claim loses the run to a new
//! generation, and nothing it writes afterwards commits.

mod support;

use nix::sys::signal::Signal;
use serde_json::json;
use std::time::Duration;
use support::*;

/// A stalled runner (SIGSTOP) whose claim expires is fenced: recovery takes
/// the run from it, and after SIGCONT none of its writes (its late
/// `node.update`, then a stream of `fenced` updates) commits; its epoch ends
/// as `claimLost`, and a new generation reruns its node and completes the
/// run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_runner_whose_claim_expired_is_fenced_and_none_of_its_writes_commit() {
    // The stop grace outlasts the fenced runner's writes, so the runner
    // (which ignores SIGTERM) is still alive when it is continued.
    let server = TestServer::start_with(&[("PI_WORKFLOWS_STOP_GRACE_MS", "20000")]);
    let script = write_script(
        server.scratch(),
        "fence.json",
        &json!({
            "workflowName": "fence",
            "topology": linear_topology(&["a", "b"]),
            "startup": {"ignoreSigterm": true, "keepWritingAfterClaimLost": true},
            "nodes": {"a": [{
                "update": {"type": "progress", "key": "early", "data": {"n": 1}},
                "then": {"sleepMs": 1200, "then": {
                    "update": {"type": "progress", "key": "late", "data": {"n": 2}},
                    "then": {"finish": {"done": "a"}}}}
            }]}
        }),
    );
    let mut client = server.client().await;
    let run_id = started(&mut client, &script).await;
    let db = server.db();

    // Generation 1 published its first update and sleeps inside node a.
    let old = wait_for(Duration::from_secs(10), "the first runner", || {
        let identity = runner_identity(&db, &run_id, 1)?;
        let published = count(
            &db,
            "SELECT COUNT(*) FROM workflow_updates WHERE run_id = ?1 AND update_key = 'early'",
            [&run_id],
        );
        (published == 1).then_some(identity)
    })
    .await;
    let old_epoch: String = db
        .query_row(
            "SELECT runner_epoch FROM run_workers WHERE run_id = ?1 AND generation = 1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    let old_attempt: String = db
        .query_row(
            "SELECT attempt_id FROM node_attempts WHERE run_id = ?1 AND generation = 1 AND node_id = 'a'",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap();
    signal(&old, Signal::SIGSTOP);

    // Its claim expires (the server does not renew a stopped runner's claim)
    // and recovery takes a control claim (generation 2): the old runner is
    // fenced and told to stop (SIGTERM, which it ignores).
    wait_for(
        Duration::from_secs(10),
        "recovery of the expired claim",
        || {
            let generation = count(
                &db,
                "SELECT generation FROM leases WHERE run_id = ?1",
                [&run_id],
            );
            (generation >= 2).then_some(())
        },
    )
    .await;
    let receipts_of_old = || {
        count(
            &db,
            "SELECT COUNT(*) FROM worker_messages WHERE runner_epoch = ?1",
            [&old_epoch],
        )
    };
    let old_receipts = receipts_of_old();
    let recovered_at_seq = count(
        &db,
        "SELECT MAX(seq) FROM events WHERE run_id = ?1",
        [&run_id],
    );
    let generation_one_rows = || -> String {
        db.query_row(
            "SELECT group_concat(attempt_id || ':' || status || ':' || COALESCE(outcome, '-'), ',') FROM node_attempts WHERE run_id = ?1 AND generation = 1",
            [&run_id],
            |row| row.get(0),
        )
        .unwrap()
    };
    let old_attempts_before = generation_one_rows();

    // Continued, the old runner finishes its sleep and keeps writing: its
    // late update, then (told `claimLost`) 20 `fenced` updates, then exits.
    // The stop grace (20 s) outlasts all of that.
    signal(&old, Signal::SIGCONT);
    wait_for(Duration::from_secs(15), "the fenced runner to exit", || {
        (!server::process::is_alive(&old)).then_some(())
    })
    .await;
    let outcome = wait_for(Duration::from_secs(5), "the old epoch's outcome", || {
        db.query_row(
            "SELECT outcome FROM run_workers WHERE runner_epoch = ?1 AND status = 'exited'",
            [&old_epoch],
            |row| row.get::<_, String>(0),
        )
        .ok()
    })
    .await;
    assert_eq!(outcome, "claimLost");
    // The old runner really wrote after it was continued (so the assertions
    // below are not vacuous): its log shows the refused writes.
    let log = std::fs::read_to_string(
        server
            .home
            .join("host")
            .join("logs")
            .join(format!("{old_epoch}.log")),
    )
    .unwrap();
    let fenced_writes = log.matches("(fenced write").count();
    assert!(
        log.contains("<- reply to") && log.contains("claimLost") && fenced_writes >= 10,
        "the continued runner must have kept writing: {log}"
    );

    // Only after the old process is gone can a new generation be admitted
    // (one live runner epoch per run); it reruns node a and completes.
    let view = wait_settled(&mut client, &run_id).await;
    assert_eq!(status(&view), "completed", "{view}");
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1 AND node_id = 'a' AND generation > 2 AND status = 'finished'",
            [&run_id],
        ),
        1,
        "a later generation reran node a"
    );

    // Nothing the old runner sent after recovery committed: every committed
    // runner message stores its receipt in the same transaction, and there
    // is none newer; its attempt stayed abandoned; no event after recovery
    // names its attempt or epoch except the server's record of its exit.
    assert_eq!(
        receipts_of_old(),
        old_receipts,
        "a receipt for a fenced write"
    );
    assert_eq!(generation_one_rows(), old_attempts_before);
    let old_status: String = db
        .query_row(
            "SELECT status FROM node_attempts WHERE run_id = ?1 AND attempt_id = ?2",
            rusqlite::params![run_id, old_attempt],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(old_status, "abandoned", "the old attempt never finished");
    let later: Vec<(String, String)> = db
        .prepare("SELECT kind, payload FROM events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq")
        .unwrap()
        .query_map(rusqlite::params![run_id, recovered_at_seq], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (kind, payload) in &later {
        let names_old = payload.contains(&old_attempt) || payload.contains(&old_epoch);
        assert!(
            !names_old || (kind == "runnerExited" && payload.contains("claimLost")),
            "an event of the fenced runner after recovery: {kind} {payload}"
        );
        assert!(
            !payload.contains("\"fenced\""),
            "a fenced update was published: {payload}"
        );
    }
    let late_updates = later
        .iter()
        .filter(|(kind, payload)| kind == "updatePublished" && payload.contains("\"late\""))
        .count();
    assert_eq!(
        late_updates, 1,
        "only the new generation's late update: {later:?}"
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM workflow_updates WHERE run_id = ?1 AND (update_type = 'fenced' OR attempt_id = ?2)",
            rusqlite::params![run_id, old_attempt],
        ),
        0,
        "no current update belongs to the old attempt"
    );
    wait_quiescent(&db).await;
    assert_eq!(consistency_violations(&db), Vec::<String>::new());
}
