//! Loading and writing a run's `RunAggregate` (the bounded facts one
//! lifecycle transition reads and changes).
//!
//! Invariants:
//! - `load` reads only unfinished and unsettled records, exactly what
//!   `RunAggregate::reload` keeps, plus the run's bounded step summary
//!   (`kernel::steps`), read with indexed lookups whose number depends on
//!   the topology, never on the run's length: it never reads the step list.
//!   Loading after a write gives the same facts the kernel returned, except
//!   the summary's visits, which hold the nodes the next transition needs.
//! - A transition finishes at most one step; `write` gives it the next step
//!   index, and a continuation copies its parent's finished rows as they are.
//! - `write` writes only rows that changed between the loaded and the new
//!   aggregate, plus one event row per `Output::Event`, inside the caller's
//!   transaction.

use super::Cached as _;
use super::blobs::Blob;
use super::codec::{DigestColumn, from_json, i64_of, json, name, parse, parse_opt, u64_of};
use kernel::attempt::{AttemptRecord, AttemptStatus, NodeOutcome, StepRecord};
use kernel::claim::{Claim, LeaseFacts};
use kernel::decision::{DecisionRecord, DecisionStatus, Provenance};
use kernel::effect::{EffectKey, EffectRecord};
use kernel::ids::*;
use kernel::interaction::{InteractionRecord, TurnClock};
use kernel::message::{MessageKind, MessageRecord, StepReason, TurnRecord};
use kernel::output::{Output, RunEvent};
use kernel::run::{
    ContinuationOf, ExecutionMode, Lineage, RestartLineage, RunAggregate, RunError, RunRecord,
    TerminalOutcome,
};
use kernel::runner::{RunnerRecord, RunnerStatus};
use kernel::steps::StepSummary;
use kernel::topology::Topology;
use rusqlite::{Connection, OptionalExtension, params};

/// Loads the aggregate of `run_id`, or `None` when the run does not exist.
pub(crate) fn load(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<RunAggregate>> {
    let Some(mut aggregate) = load_current(connection, run_id)? else {
        return Ok(None);
    };
    aggregate.steps = load_step_summary(connection, run_id, aggregate.attempt.as_ref())?;
    Ok(Some(aggregate))
}

/// The aggregate of `run_id` without its step summary (`steps` empty):
/// every other fact `load` reads, a bounded read whatever the run's length.
/// For presentation, which reads the steps it shows from its own rows.
pub(crate) fn load_current(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<RunAggregate>> {
    let Some(run) = load_run(connection, run_id)? else {
        return Ok(None);
    };
    let mut aggregate = RunAggregate::new(run);
    aggregate.attempt = load_latest_attempt(connection, run_id)?;
    aggregate.effects = load_effects(connection, run_id)?;
    aggregate.interaction = load_interaction(connection, run_id)?;
    aggregate.decision = load_decision(connection, run_id)?;
    aggregate.messages = load_messages(connection, run_id)?;
    aggregate.turns = load_turns(connection, run_id)?;
    Ok(Some(aggregate))
}

/// What the restart rule reads about a terminal run: the fingerprint of its
/// outcome ([`TerminalOutcome`], built from its stored reference, input,
/// status, error and final output) and every restart recorded in its chain
/// (siblings included). `None` when the run's metadata is missing.
pub(crate) fn restart_facts(
    connection: &Connection,
    run: &RunRecord,
) -> rusqlite::Result<Option<(Digest, Vec<RestartLineage>)>> {
    let Some(meta) = super::meta::load(connection, &run.run_id)? else {
        return Ok(None);
    };
    let output_digest = super::attempts::final_output(connection, &run.run_id)?
        .map(|output| super::blobs::Blob::json(&output).digest);
    let outcome = TerminalOutcome {
        workflow_ref: &meta.workflow_ref,
        definition_digest: &meta.definition_digest,
        input_digest: meta.input_digest,
        status: run.status,
        error: run.error.as_ref(),
        output_digest,
    };
    Ok(Some((
        outcome.fingerprint(),
        restart_chain(connection, run.restart_root())?,
    )))
}

/// Every restart recorded in the chain rooted at `root`.
fn restart_chain(connection: &Connection, root: &RunId) -> rusqlite::Result<Vec<RestartLineage>> {
    let mut statement = connection.prepare_cached(
        "SELECT restart_json FROM runs WHERE restart_root_run_id = ?1 AND restart_json IS NOT NULL",
    )?;
    let rows = statement.query_map(params![root.as_str()], |row| row.get::<_, String>(0))?;
    rows.map(|text| from_json(&text?)).collect()
}

/// The check of the run's latest `protocolRejected` event, if it has one.
pub(crate) fn latest_protocol_check(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<kernel::runner::ProtocolCheck>> {
    let payload: Option<String> = connection
        .query_row_cached(
            "SELECT payload FROM events WHERE run_id = ?1 AND kind = 'protocolRejected' ORDER BY seq DESC LIMIT 1",
            params![run_id.as_str()],
            |row| row.get(0),
        )
        .optional()?;
    match payload {
        Some(text) => match from_json::<RunEvent>(&text)? {
            RunEvent::ProtocolRejected { check } => Ok(Some(check)),
            _ => Ok(None),
        },
        None => Ok(None),
    }
}

/// Marks every run of the chain rooted at `root` (the root included) for a
/// new presentation revision: a restart changes whether the chain's other
/// runs may restart.
pub(crate) fn mark_restart_chain(connection: &Connection, root: &RunId) -> rusqlite::Result<()> {
    let mut statement = connection
        .prepare_cached("SELECT run_id FROM runs WHERE run_id = ?1 OR restart_root_run_id = ?1")?;
    let rows = statement.query_map(params![root.as_str()], |row| row.get::<_, String>(0))?;
    for run_id in rows {
        super::viewer::mark(&RunId::new(run_id?));
    }
    Ok(())
}

fn load_run(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Option<RunRecord>> {
    let row = connection
        .query_row_cached(
            "SELECT r.status, q.status, r.paused, r.park_reason, r.revision, b.execution_mode, b.origin_session_id,
                    r.continuation_of, r.continuation_checkpoint, r.continued_by, r.restart_json,
                    r.error_class, r.error_reason, r.error_node, r.waiting_on,
                    r.created_at_ms, r.updated_at_ms, r.finished_at_ms
             FROM runs r JOIN run_queue q ON q.run_id = r.run_id JOIN run_bindings b ON b.run_id = r.run_id
             WHERE r.run_id = ?1",
            params![run_id.as_str()],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, i64>(4)?,
                    row.get::<_, String>(5)?,
                    row.get::<_, Option<String>>(6)?,
                    (
                        row.get::<_, Option<String>>(7)?,
                        row.get::<_, Option<String>>(8)?,
                        row.get::<_, Option<String>>(9)?,
                        row.get::<_, Option<String>>(10)?,
                    ),
                    (
                        row.get::<_, Option<String>>(11)?,
                        row.get::<_, Option<String>>(12)?,
                        row.get::<_, Option<String>>(13)?,
                        row.get::<_, Option<String>>(14)?,
                    ),
                    (row.get::<_, i64>(15)?, row.get::<_, i64>(16)?, row.get::<_, Option<i64>>(17)?),
                ))
            },
        )
        .optional()?;
    let Some((status, queue, paused, park_reason, revision, mode, origin, lineage, error, times)) =
        row
    else {
        return Ok(None);
    };
    let (continuation_of, checkpoint, continued_by, restart_json) = lineage;
    let (error_class, error_reason, error_node, waiting_on) = error;
    let mode = match (mode.as_str(), origin) {
        ("interactive", Some(session)) => ExecutionMode::Interactive {
            origin_session: SessionId::new(session),
        },
        _ => ExecutionMode::Headless,
    };
    let error = match (error_class, error_reason) {
        (Some(class), Some(reason)) => Some(RunError {
            class: parse(&class)?,
            reason: parse(&reason)?,
            node_id: error_node.map(NodeId::new),
        }),
        _ => None,
    };
    Ok(Some(RunRecord {
        run_id: run_id.clone(),
        status: parse(&status)?,
        queue: parse(&queue)?,
        paused: paused != 0,
        park_reason: parse_opt(park_reason)?,
        revision: Revision(u64_of(revision)),
        lease: load_lease(connection, run_id)?,
        mode,
        lineage: Lineage {
            continuation_of: match (continuation_of, checkpoint) {
                (Some(parent), Some(checkpoint)) => Some(ContinuationOf {
                    parent_run_id: RunId::new(parent),
                    checkpoint: NodeId::new(checkpoint),
                }),
                _ => None,
            },
            continued_by: continued_by.map(RunId::new),
            restart: restart_json.map(|text| from_json(&text)).transpose()?,
        },
        runner: load_runner(connection, run_id)?,
        error,
        waiting_on: waiting_on.map(NodeId::new),
        created_at_ms: u64_of(times.0),
        updated_at_ms: u64_of(times.1),
        finished_at_ms: times.2.map(u64_of),
    }))
}

fn load_lease(connection: &Connection, run_id: &RunId) -> rusqlite::Result<LeaseFacts> {
    let lease = connection
        .query_row_cached(
            "SELECT generation, owner_kind, owner_id, token_hash, acquired_at_ms, heartbeat_at_ms, expires_at_ms
             FROM leases WHERE run_id = ?1",
            params![run_id.as_str()],
            |row| {
                let generation = Generation(u64_of(row.get(0)?));
                let kind: Option<String> = row.get(1)?;
                let claim = match kind {
                    None => None,
                    Some(kind) => Some(Claim {
                        owner_kind: parse(&kind)?,
                        owner_id: OwnerId::new(row.get::<_, String>(2)?),
                        token_hash: row.get::<_, DigestColumn>(3)?.0,
                        generation,
                        acquired_at_ms: u64_of(row.get(4)?),
                        heartbeat_at_ms: u64_of(row.get(5)?),
                        expires_at_ms: u64_of(row.get(6)?),
                    }),
                };
                Ok(LeaseFacts { claim, generation })
            },
        )
        .optional()?;
    Ok(lease.unwrap_or_default())
}

fn load_runner(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Option<RunnerRecord>> {
    connection
        .query_row_cached(
            "SELECT runner_epoch, generation, status, outcome, launched_at_ms, ready_at_ms, ready_revision, finished_at_ms
             FROM run_workers WHERE run_id = ?1 ORDER BY launched_at_ms DESC, rowid DESC LIMIT 1",
            params![run_id.as_str()],
            |row| {
                let status: String = row.get(2)?;
                let outcome: Option<String> = row.get(3)?;
                let status = match (status.as_str(), outcome) {
                    ("launching", _) => RunnerStatus::Launching,
                    ("ready", _) => RunnerStatus::Ready,
                    (_, Some(outcome)) => RunnerStatus::Exited(parse(&outcome)?),
                    _ => RunnerStatus::Exited(kernel::runner::RunnerOutcome::Crashed),
                };
                Ok(RunnerRecord {
                    runner_epoch: RunnerEpochId::new(row.get::<_, String>(0)?),
                    generation: Generation(u64_of(row.get(1)?)),
                    status,
                    launched_at_ms: u64_of(row.get(4)?),
                    ready_at_ms: row.get::<_, Option<i64>>(5)?.map(u64_of),
                    ready_revision: row.get::<_, Option<i64>>(6)?.map(|r| Revision(u64_of(r))),
                    finished_at_ms: row.get::<_, Option<i64>>(7)?.map(u64_of),
                })
            },
        )
        .optional()
}

/// The run's step summary: the latest finished step (its index is the
/// count), then, with the run's topology, the visits of the nodes
/// [`StepSummary::nodes_to_load`] names, and for each watched mount entry
/// the real steps since its latest step. Every read is one indexed lookup.
fn load_step_summary(
    connection: &Connection,
    run_id: &RunId,
    attempt: Option<&AttemptRecord>,
) -> rusqlite::Result<StepSummary> {
    let topology = run_topology(connection, run_id)?;
    let mut summary = topology
        .as_deref()
        .map_or_else(StepSummary::default, StepSummary::new);
    let last = connection
        .query_row_cached(
            "SELECT attempt_id, node_id, outcome, carried, step_index FROM node_attempts
             WHERE run_id = ?1 AND step_index IS NOT NULL ORDER BY step_index DESC LIMIT 1",
            params![run_id.as_str()],
            |row| {
                Ok((
                    StepRecord {
                        attempt_id: AttemptId::new(row.get::<_, String>(0)?),
                        node_id: NodeId::new(row.get::<_, String>(1)?),
                        outcome: parse(&row.get::<_, String>(2)?)?,
                        carried: row.get::<_, i64>(3)? != 0,
                    },
                    count_of(row.get(4)?),
                ))
            },
        )
        .optional()?;
    let Some((last, count)) = last else {
        return Ok(summary);
    };
    summary.count = count;
    summary.real = count;
    let Some(topology) = topology else {
        // Nothing routes without a topology: the count and the latest step.
        summary.last = Some(last);
        return Ok(summary);
    };
    for node_id in StepSummary::nodes_to_load(&topology, Some(&last.node_id), attempt) {
        if let Some((visits, _)) = latest_step_of(connection, run_id, node_id, None)? {
            summary.visits.insert(node_id.clone(), visits);
        }
    }
    let visits_of = |node_id: &NodeId| summary.visits.get(node_id).copied().unwrap_or(0);
    let transition_steps: u32 = summary.transitions.iter().map(visits_of).sum();
    summary.real = count.saturating_sub(transition_steps);
    let mut since_entry = summary.since_entry.clone();
    for (entry, since) in &mut since_entry {
        let Some((_, entry_index)) = latest_step_of(connection, run_id, entry, None)? else {
            continue;
        };
        let mut transitions_after = 0u32;
        for transition in &summary.transitions {
            let through = latest_step_of(connection, run_id, transition, Some(entry_index))?
                .map_or(0, |(visits, _)| visits);
            transitions_after += visits_of(transition).saturating_sub(through);
        }
        *since = Some(
            count
                .saturating_sub(entry_index)
                .saturating_sub(transitions_after),
        );
    }
    summary.since_entry = since_entry;
    summary.last = Some(last);
    Ok(summary)
}

/// The visit and step index of `node_id`'s latest finished step (up to
/// step index `through`): its visit is the node's finished steps so far.
fn latest_step_of(
    connection: &Connection,
    run_id: &RunId,
    node_id: &NodeId,
    through: Option<u32>,
) -> rusqlite::Result<Option<(u32, u32)>> {
    connection
        .query_row_cached(
            "SELECT visit, step_index FROM node_attempts
             WHERE run_id = ?1 AND node_id = ?2 AND status = 'finished' AND step_index <= ?3
             ORDER BY step_index DESC LIMIT 1",
            params![
                run_id.as_str(),
                node_id.as_str(),
                through.map_or(i64::MAX, i64::from)
            ],
            |row| Ok((count_of(row.get(0)?), count_of(row.get(1)?))),
        )
        .optional()
}

fn count_of(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// The parsed topology of the run's definition (cached by digest), if the
/// run has one.
fn run_topology(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<std::sync::Arc<Topology>>> {
    let digest: Option<String> = connection
        .query_row_cached(
            "SELECT definition_digest FROM runs WHERE run_id = ?1",
            params![run_id.as_str()],
            |row| row.get(0),
        )
        .optional()?
        .flatten();
    match digest {
        Some(digest) => super::meta::topology(connection, &digest),
        None => Ok(None),
    }
}

fn attempt_status(status: &str, outcome: Option<String>) -> rusqlite::Result<AttemptStatus> {
    Ok(match (status, outcome) {
        ("active", _) => AttemptStatus::Active,
        ("waiting", _) => AttemptStatus::Waiting,
        ("abandoned", _) => AttemptStatus::Abandoned,
        (_, Some(outcome)) => AttemptStatus::Finished(parse::<NodeOutcome>(&outcome)?),
        _ => AttemptStatus::Abandoned,
    })
}

fn attempt_status_columns(status: AttemptStatus) -> (&'static str, Option<String>) {
    match status {
        AttemptStatus::Active => ("active", None),
        AttemptStatus::Waiting => ("waiting", None),
        AttemptStatus::Abandoned => ("abandoned", None),
        AttemptStatus::Finished(outcome) => ("finished", Some(name(&outcome))),
    }
}

fn load_latest_attempt(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<AttemptRecord>> {
    let attempt = connection
        .query_row_cached(
            "SELECT attempt_id, node_id, visit, generation, status, outcome, started_at_ms, deadline_at_ms,
                    finished_at_ms, crash_retries
             FROM node_attempts WHERE run_id = ?1 AND carried = 0 ORDER BY seq DESC LIMIT 1",
            params![run_id.as_str()],
            |row| {
                Ok(AttemptRecord {
                    attempt_id: AttemptId::new(row.get::<_, String>(0)?),
                    node_id: NodeId::new(row.get::<_, String>(1)?),
                    visit: row.get::<_, i64>(2)? as u32,
                    generation: Generation(u64_of(row.get(3)?)),
                    status: attempt_status(&row.get::<_, String>(4)?, row.get(5)?)?,
                    started_at_ms: u64_of(row.get(6)?),
                    deadline_at_ms: row.get::<_, Option<i64>>(7)?.map(u64_of),
                    finished_at_ms: row.get::<_, Option<i64>>(8)?.map(u64_of),
                    crash_retries: row.get::<_, i64>(9)? as u32,
                })
            },
        )
        .optional()?;
    Ok(attempt.filter(|attempt| !matches!(attempt.status, AttemptStatus::Finished(_))))
}

fn load_effects(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Vec<EffectRecord>> {
    let mut statement = connection.prepare_cached(
        "SELECT effect_id, effect_type, node_path, visit, request_fingerprint, state, attempt_number,
                node_attempt_id, result_digest
         FROM effects WHERE run_id = ?1 AND state IN ('reserved', 'applying', 'ambiguous') ORDER BY created_at_ms, effect_id",
    )?;
    let rows = statement.query_map(params![run_id.as_str()], |row| effect_from_row(run_id, row))?;
    rows.collect()
}

pub(crate) fn effect_from_row(
    run_id: &RunId,
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<EffectRecord> {
    Ok(EffectRecord {
        effect_id: EffectId::new(row.get::<_, String>(0)?),
        key: EffectKey {
            run_id: run_id.clone(),
            effect_type: row.get(1)?,
            node_path: NodeId::new(row.get::<_, String>(2)?),
            visit: row.get::<_, i64>(3)? as u32,
        },
        request_fingerprint: row.get::<_, DigestColumn>(4)?.0,
        state: parse(&row.get::<_, String>(5)?)?,
        attempt_number: row.get::<_, i64>(6)? as u32,
        node_attempt_id: row.get::<_, Option<String>>(7)?.map(AttemptId::new),
        result_digest: row
            .get::<_, Option<DigestColumn>>(8)?
            .map(|digest| digest.0),
    })
}

const INTERACTION_COLUMNS: &str =
    "interaction_id, attempt_id, node_id, target_session_id, kind, contract_hash, status,
     accepted_submission_id, unproductive_turn_ends, revision, created_at_ms, run_id,
     clock_budget_ms, clock_consumed_ms, clock_running_since_ms";

fn interaction_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<InteractionRecord> {
    Ok(InteractionRecord {
        interaction_id: InteractionId::new(row.get::<_, String>(0)?),
        run_id: RunId::new(row.get::<_, String>(11)?),
        attempt_id: AttemptId::new(row.get::<_, String>(1)?),
        node_id: NodeId::new(row.get::<_, String>(2)?),
        target_session: row.get::<_, Option<String>>(3)?.map(SessionId::new),
        kind: parse(&row.get::<_, String>(4)?)?,
        contract_hash: row.get::<_, DigestColumn>(5)?.0,
        status: parse(&row.get::<_, String>(6)?)?,
        accepted_submission: row.get::<_, Option<String>>(7)?.map(SubmissionId::new),
        unproductive_turn_ends: row.get::<_, i64>(8)? as u32,
        revision: row.get::<_, i64>(9)? as u32,
        clock: TurnClock {
            budget_ms: row.get::<_, Option<i64>>(12)?.map(u64_of),
            consumed_ms: u64_of(row.get(13)?),
            running_since_ms: row.get::<_, Option<i64>>(14)?.map(u64_of),
        },
        created_at_ms: u64_of(row.get(10)?),
    })
}

/// The run's pending interactive request or, when there is none, the
/// accepted request of an abandoned attempt (a headless runner lost between
/// the acceptance and its `node.finished`): the next generation finishes that
/// attempt with the accepted submission (`kernel::interaction::adoptable_submission`).
fn load_interaction(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<InteractionRecord>> {
    let pending = connection
        .query_row_cached(
            &format!("SELECT {INTERACTION_COLUMNS} FROM interactive_requests WHERE run_id = ?1 AND status = 'pending'"),
            params![run_id.as_str()],
            interaction_from_row,
        )
        .optional()?;
    if pending.is_some() {
        return Ok(pending);
    }
    connection
        .query_row_cached(
            &format!(
                "SELECT {INTERACTION_COLUMNS} FROM interactive_requests r
                 WHERE r.run_id = ?1 AND r.status = 'accepted' AND EXISTS (
                   SELECT 1 FROM node_attempts a
                   WHERE a.run_id = r.run_id AND a.attempt_id = r.attempt_id AND a.status = 'abandoned')
                 ORDER BY r.created_at_ms DESC LIMIT 1"
            ),
            params![run_id.as_str()],
            interaction_from_row,
        )
        .optional()
}

/// One interactive request by id, whatever its status (a settled request's
/// repeated submission adopts its stored outcome).
pub(crate) fn interaction_by_id(
    connection: &Connection,
    interaction_id: &InteractionId,
) -> rusqlite::Result<Option<InteractionRecord>> {
    connection
        .query_row_cached(
            &format!(
                "SELECT {INTERACTION_COLUMNS} FROM interactive_requests WHERE interaction_id = ?1"
            ),
            params![interaction_id.as_str()],
            interaction_from_row,
        )
        .optional()
}

fn load_decision(
    connection: &Connection,
    run_id: &RunId,
) -> rusqlite::Result<Option<DecisionRecord>> {
    connection
        .query_row_cached(
            "SELECT decision_id, node_id, request_digest, state, provenance, answer_digest, deadline_at_ms,
                    default_answer_digest, continuation_run_id
             FROM human_decisions WHERE run_id = ?1 AND state = 'pending'",
            params![run_id.as_str()],
            |row| decision_from_row(run_id, row),
        )
        .optional()
}

pub(crate) fn decision_from_row(
    run_id: &RunId,
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<DecisionRecord> {
    let state: String = row.get(3)?;
    let status = match state.as_str() {
        "accepted" => DecisionStatus::Accepted {
            provenance: parse::<Provenance>(&row.get::<_, String>(4)?)?,
            answer_digest: row.get::<_, DigestColumn>(5)?.0,
        },
        "cancelled" => DecisionStatus::Cancelled,
        "expired" => DecisionStatus::Expired,
        _ => DecisionStatus::Pending,
    };
    Ok(DecisionRecord {
        decision_id: DecisionId::new(row.get::<_, String>(0)?),
        run_id: run_id.clone(),
        node_id: NodeId::new(row.get::<_, String>(1)?),
        request_digest: row.get::<_, DigestColumn>(2)?.0,
        status,
        deadline_at_ms: row.get::<_, Option<i64>>(6)?.map(u64_of),
        default_answer_digest: row
            .get::<_, Option<DigestColumn>>(7)?
            .map(|digest| digest.0),
        continuation_run_id: row.get::<_, Option<String>>(8)?.map(RunId::new),
    })
}

fn load_messages(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Vec<MessageRecord>> {
    let mut statement = connection.prepare_cached(
        "SELECT message_id, session_id, kind, source_id, step_reason, session_order, state, entry_id, created_at_ms
         FROM workflow_messages WHERE run_id = ?1 AND state = 'pending' ORDER BY session_order",
    )?;
    let rows = statement.query_map(params![run_id.as_str()], |row| {
        message_from_row(run_id, row)
    })?;
    rows.collect()
}

pub(crate) fn message_from_row(
    run_id: &RunId,
    row: &rusqlite::Row<'_>,
) -> rusqlite::Result<MessageRecord> {
    let kind: String = row.get(2)?;
    let source: Option<String> = row.get(3)?;
    let reason: Option<String> = row.get(4)?;
    let kind = match (kind.as_str(), source, reason) {
        ("step", Some(source), Some(reason)) => MessageKind::Step {
            interaction_id: InteractionId::new(source),
            reason: parse(&reason)?,
        },
        ("decision", Some(source), _) => MessageKind::Decision {
            decision_id: DecisionId::new(source),
        },
        ("followUp", Some(source), _) => MessageKind::FollowUp {
            follow_up_id: source,
        },
        ("terminal", _, _) => MessageKind::Terminal,
        _ => MessageKind::Notification,
    };
    Ok(MessageRecord {
        message_id: MessageId::new(row.get::<_, String>(0)?),
        session_id: SessionId::new(row.get::<_, String>(1)?),
        run_id: run_id.clone(),
        kind,
        order: u64_of(row.get(5)?),
        state: parse(&row.get::<_, String>(6)?)?,
        entry_id: row.get::<_, Option<String>>(7)?.map(EntryId::new),
        created_at_ms: u64_of(row.get(8)?),
    })
}

fn load_turns(connection: &Connection, run_id: &RunId) -> rusqlite::Result<Vec<TurnRecord>> {
    let mut statement = connection.prepare_cached(
        "SELECT turn_id, message_id, session_id, state, started_at_ms, ended_at_ms, response_entry_id
         FROM workflow_turns WHERE run_id = ?1 AND state = 'open' ORDER BY started_at_ms",
    )?;
    let rows = statement.query_map(params![run_id.as_str()], |row| {
        Ok(TurnRecord {
            turn_id: TurnId::new(row.get::<_, String>(0)?),
            message_id: MessageId::new(row.get::<_, String>(1)?),
            run_id: run_id.clone(),
            session_id: SessionId::new(row.get::<_, String>(2)?),
            state: parse(&row.get::<_, String>(3)?)?,
            started_at_ms: u64_of(row.get(4)?),
            ended_at_ms: row.get::<_, Option<i64>>(5)?.map(u64_of),
            response_entry_id: row.get::<_, Option<String>>(6)?.map(EntryId::new),
        })
    })?;
    rows.collect()
}

/// Writes every record that differs between `before` (as loaded; `None` for
/// a new run whose `runs` row the caller inserted) and `after`, and one event
/// row per event output. A new workflow message needs no content from the
/// caller when [`message_content`] derives it (resumed and reminder steps,
/// decisions, terminal messages).
pub(crate) fn write(
    connection: &Connection,
    before: Option<&RunAggregate>,
    after: &RunAggregate,
    outputs: &[Output],
    now_ms: u64,
) -> rusqlite::Result<()> {
    write_with_contents(connection, before, after, outputs, &[], now_ms)
}

/// [`write`], with the content of new messages that only the caller knows
/// (the prompt of an initial step, the text of a notification), by message id.
pub(crate) fn write_with_contents(
    connection: &Connection,
    before: Option<&RunAggregate>,
    after: &RunAggregate,
    outputs: &[Output],
    contents: &[(MessageId, Blob)],
    now_ms: u64,
) -> rusqlite::Result<()> {
    let run = &after.run;
    super::viewer::mark(&run.run_id);
    if before.is_none_or(|before| before.run != *run) {
        write_run(connection, before.map(|b| &b.run), run, now_ms)?;
    }
    write_attempts(connection, before, after, now_ms)?;
    for effect in &after.effects {
        if before.is_none_or(|b| !b.effects.contains(effect)) {
            write_effect(connection, effect, now_ms)?;
        }
    }
    if let Some(interaction) = &after.interaction
        && before.is_none_or(|b| b.interaction.as_ref() != Some(interaction))
    {
        write_interaction(connection, interaction, now_ms)?;
    }
    if let Some(decision) = &after.decision
        && before.is_none_or(|b| b.decision.as_ref() != Some(decision))
    {
        write_decision(connection, decision, now_ms)?;
    }
    for message in &after.messages {
        if before.is_none_or(|b| !b.messages.contains(message)) {
            let known = before.is_some_and(|b| {
                b.messages
                    .iter()
                    .any(|old| old.message_id == message.message_id)
            });
            if known {
                update_message(connection, message, now_ms)?;
            } else {
                let content = message_content(connection, message, after, contents, now_ms)?;
                insert_message(connection, message, &content, now_ms)?;
            }
        }
    }
    for turn in &after.turns {
        if before.is_none_or(|b| !b.turns.contains(turn)) {
            write_turn(connection, turn)?;
        }
    }
    write_events(connection, outputs, now_ms)
}

fn write_run(
    connection: &Connection,
    before: Option<&RunRecord>,
    run: &RunRecord,
    now_ms: u64,
) -> rusqlite::Result<()> {
    let error = run.error.as_ref();
    connection.execute_cached(
        "UPDATE runs SET status = ?2, paused = ?3, park_reason = ?4, revision = ?5, waiting_on = ?6,
                error_class = ?7, error_reason = ?8, error_node = ?9, continued_by = ?10, restart_json = ?11,
                restart_root_run_id = ?14, updated_at_ms = ?12, finished_at_ms = ?13
         WHERE run_id = ?1",
        params![
            run.run_id.as_str(),
            name(&run.status),
            i64::from(run.paused),
            run.park_reason.as_ref().map(name),
            i64_of(run.revision.0),
            run.waiting_on.as_ref().map(NodeId::as_str),
            error.map(|e| name(&e.class)),
            error.map(|e| name(&e.reason)),
            error.and_then(|e| e.node_id.as_ref()).map(NodeId::as_str),
            run.lineage.continued_by.as_ref().map(RunId::as_str),
            run.lineage.restart.as_ref().map(json),
            i64_of(run.updated_at_ms),
            run.finished_at_ms.map(i64_of),
            run.lineage
                .restart
                .as_ref()
                .map(|restart| restart.root_run_id.as_str()),
        ],
    )?;
    connection.execute_cached(
        "UPDATE run_queue SET status = ?2, updated_at_ms = ?3 WHERE run_id = ?1",
        params![run.run_id.as_str(), name(&run.queue), i64_of(now_ms)],
    )?;
    if before.is_none_or(|b| b.lease != run.lease) {
        write_lease(connection, &run.run_id, &run.lease)?;
    }
    if let Some(runner) = &run.runner
        && before.is_none_or(|b| b.runner.as_ref() != Some(runner))
    {
        write_runner(connection, &run.run_id, runner)?;
    }
    Ok(())
}

fn write_lease(
    connection: &Connection,
    run_id: &RunId,
    lease: &LeaseFacts,
) -> rusqlite::Result<()> {
    let claim = lease.claim.as_ref();
    connection.execute_cached(
        "INSERT INTO leases (run_id, generation, owner_kind, owner_id, token_hash, acquired_at_ms, heartbeat_at_ms, expires_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (run_id) DO UPDATE SET generation = excluded.generation, owner_kind = excluded.owner_kind,
           owner_id = excluded.owner_id, token_hash = excluded.token_hash, acquired_at_ms = excluded.acquired_at_ms,
           heartbeat_at_ms = excluded.heartbeat_at_ms, expires_at_ms = excluded.expires_at_ms",
        params![
            run_id.as_str(),
            i64_of(lease.generation.0),
            claim.map(|c| name(&c.owner_kind)),
            claim.map(|c| c.owner_id.as_str()),
            claim.map(|c| c.token_hash.0.to_vec()),
            claim.map(|c| i64_of(c.acquired_at_ms)),
            claim.map(|c| i64_of(c.heartbeat_at_ms)),
            claim.map(|c| i64_of(c.expires_at_ms)),
        ],
    )?;
    Ok(())
}

/// Writes one runner epoch row (insert on admission, update afterwards).
pub(crate) fn write_runner(
    connection: &Connection,
    run_id: &RunId,
    runner: &RunnerRecord,
) -> rusqlite::Result<()> {
    let (status, outcome) = match runner.status {
        RunnerStatus::Launching => ("launching", None),
        RunnerStatus::Ready => ("ready", None),
        RunnerStatus::Exited(outcome) => ("exited", Some(name(&outcome))),
    };
    connection.execute_cached(
        "INSERT INTO run_workers (runner_epoch, run_id, generation, server_epoch, status, outcome, launched_at_ms,
                                  ready_at_ms, ready_revision, finished_at_ms)
         VALUES (?1, ?2, ?3, (SELECT epoch FROM workflow_host_state WHERE singleton = 1), ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (runner_epoch) DO UPDATE SET status = excluded.status, outcome = excluded.outcome,
           ready_at_ms = excluded.ready_at_ms, ready_revision = excluded.ready_revision,
           finished_at_ms = excluded.finished_at_ms",
        params![
            runner.runner_epoch.as_str(),
            run_id.as_str(),
            i64_of(runner.generation.0),
            status,
            outcome,
            i64_of(runner.launched_at_ms),
            runner.ready_at_ms.map(i64_of),
            runner.ready_revision.map(|r| i64_of(r.0)),
            runner.finished_at_ms.map(i64_of),
        ],
    )?;
    Ok(())
}

fn write_attempts(
    connection: &Connection,
    before: Option<&RunAggregate>,
    after: &RunAggregate,
    now_ms: u64,
) -> rusqlite::Result<()> {
    let run_id = &after.run.run_id;
    // Carried steps of a new continuation: copy the parent's finished rows.
    if let (None, Some(parent)) = (before, after.run.lineage.continuation_of.as_ref())
        && !after.steps.is_empty()
    {
        connection.execute_cached(
            "INSERT INTO node_attempts (run_id, attempt_id, seq, node_id, visit, generation, status, outcome, carried,
                 started_at_ms, deadline_at_ms, finished_at_ms, crash_retries, status_detail, output_digest,
                 error_message, action_json, step_index)
             SELECT ?1, attempt_id, seq, node_id, visit, generation, status, outcome, 1, started_at_ms, deadline_at_ms,
                    finished_at_ms, crash_retries, status_detail, output_digest, error_message, action_json, step_index
             FROM node_attempts WHERE run_id = ?2 AND status = 'finished'",
            params![run_id.as_str(), parent.parent_run_id.as_str()],
        )?;
    }
    // The step the transition finished (an attempt that finished and was
    // replaced by the next one is only the summary's latest step): finish
    // its row first, so the next attempt never meets the one-unfinished-
    // attempt index.
    let known = before.map_or(0, |b| b.steps.count);
    match after.steps.count.checked_sub(known) {
        Some(0) => {}
        Some(1) if before.is_some() => {
            let step = after.steps.last().ok_or_else(|| unwritable("a new step"))?;
            connection.execute_cached(
                "UPDATE node_attempts SET status = 'finished', outcome = ?3, finished_at_ms = COALESCE(finished_at_ms, ?4),
                     step_index = ?5
                 WHERE run_id = ?1 AND attempt_id = ?2 AND status != 'finished'",
                params![
                    run_id.as_str(),
                    step.attempt_id.as_str(),
                    name(&step.outcome),
                    i64_of(now_ms),
                    i64::from(after.steps.count)
                ],
            )?;
        }
        // A continuation's carried steps, copied above.
        Some(_) if before.is_none() && !after.steps.has_own_steps() => {}
        _ => return Err(unwritable("more than one step in one transition")),
    }
    let Some(attempt) = &after.attempt else {
        return Ok(());
    };
    if before.is_some_and(|b| b.attempt.as_ref() == Some(attempt)) {
        return Ok(());
    }
    let (status, outcome) = attempt_status_columns(attempt.status);
    let step_index = after
        .steps
        .last()
        .filter(|step| outcome.is_some() && step.attempt_id == attempt.attempt_id)
        .map(|_| i64::from(after.steps.count));
    connection.execute_cached(
        "INSERT INTO node_attempts (run_id, attempt_id, seq, node_id, visit, generation, status, outcome, carried,
             started_at_ms, deadline_at_ms, finished_at_ms, crash_retries, step_index)
         VALUES (?1, ?2, (SELECT COALESCE(MAX(seq), 0) + 1 FROM node_attempts WHERE run_id = ?1), ?3, ?4, ?5, ?6, ?7, 0,
                 ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT (run_id, attempt_id) DO UPDATE SET status = excluded.status, outcome = excluded.outcome,
           deadline_at_ms = excluded.deadline_at_ms, finished_at_ms = excluded.finished_at_ms,
           crash_retries = excluded.crash_retries, step_index = COALESCE(node_attempts.step_index, excluded.step_index)",
        params![
            run_id.as_str(),
            attempt.attempt_id.as_str(),
            attempt.node_id.as_str(),
            i64::from(attempt.visit),
            i64_of(attempt.generation.0),
            status,
            outcome,
            i64_of(attempt.started_at_ms),
            attempt.deadline_at_ms.map(i64_of),
            attempt.finished_at_ms.map(i64_of),
            i64::from(attempt.crash_retries),
            step_index,
        ],
    )?;
    Ok(())
}

/// Writes one effect row and its current attempt row.
pub(crate) fn write_effect(
    connection: &Connection,
    effect: &EffectRecord,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO effects (effect_id, run_id, effect_type, node_path, visit, request_fingerprint, state,
                              attempt_number, node_attempt_id, result_digest, created_at_ms, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11)
         ON CONFLICT (effect_id) DO UPDATE SET state = excluded.state, attempt_number = excluded.attempt_number,
           node_attempt_id = excluded.node_attempt_id, result_digest = excluded.result_digest,
           updated_at_ms = excluded.updated_at_ms",
        params![
            effect.effect_id.as_str(),
            effect.key.run_id.as_str(),
            effect.key.effect_type,
            effect.key.node_path.as_str(),
            i64::from(effect.key.visit),
            effect.request_fingerprint.0.to_vec(),
            name(&effect.state),
            i64::from(effect.attempt_number),
            effect.node_attempt_id.as_ref().map(AttemptId::as_str),
            effect.result_digest.map(|d| d.0.to_vec()),
            i64_of(now_ms),
        ],
    )?;
    connection.execute_cached(
        "INSERT INTO effect_attempts (effect_id, attempt_number, state, node_attempt_id, started_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (effect_id, attempt_number) DO UPDATE SET state = excluded.state,
           finished_at_ms = CASE WHEN excluded.state IN ('applied', 'rejected', 'cancelled', 'ambiguous')
                                 THEN ?5 ELSE finished_at_ms END",
        params![
            effect.effect_id.as_str(),
            i64::from(effect.attempt_number),
            name(&effect.state),
            effect.node_attempt_id.as_ref().map(AttemptId::as_str),
            i64_of(now_ms),
        ],
    )?;
    Ok(())
}

pub(crate) fn write_interaction(
    connection: &Connection,
    record: &InteractionRecord,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO interactive_requests (interaction_id, run_id, attempt_id, node_id, target_session_id, kind,
             contract_hash, status, accepted_submission_id, unproductive_turn_ends, revision, created_at_ms, updated_at_ms,
             clock_budget_ms, clock_consumed_ms, clock_running_since_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
         ON CONFLICT (interaction_id) DO UPDATE SET status = excluded.status,
           accepted_submission_id = excluded.accepted_submission_id,
           unproductive_turn_ends = excluded.unproductive_turn_ends, revision = excluded.revision,
           updated_at_ms = excluded.updated_at_ms, clock_budget_ms = excluded.clock_budget_ms,
           clock_consumed_ms = excluded.clock_consumed_ms,
           clock_running_since_ms = excluded.clock_running_since_ms",
        params![
            record.interaction_id.as_str(),
            record.run_id.as_str(),
            record.attempt_id.as_str(),
            record.node_id.as_str(),
            record.target_session.as_ref().map(SessionId::as_str),
            name(&record.kind),
            record.contract_hash.0.to_vec(),
            name(&record.status),
            record.accepted_submission.as_ref().map(SubmissionId::as_str),
            i64::from(record.unproductive_turn_ends),
            i64::from(record.revision),
            i64_of(record.created_at_ms),
            i64_of(now_ms),
            record.clock.budget_ms.map(i64_of),
            i64_of(record.clock.consumed_ms),
            record.clock.running_since_ms.map(i64_of),
        ],
    )?;
    Ok(())
}

/// Writes one decision row.
pub(crate) fn write_decision(
    connection: &Connection,
    record: &DecisionRecord,
    now_ms: u64,
) -> rusqlite::Result<()> {
    let (state, provenance, answer) = match &record.status {
        DecisionStatus::Pending => ("pending", None, None),
        DecisionStatus::Accepted {
            provenance,
            answer_digest,
        } => (
            "accepted",
            Some(name(provenance)),
            Some(answer_digest.0.to_vec()),
        ),
        DecisionStatus::Cancelled => ("cancelled", None, None),
        DecisionStatus::Expired => ("expired", None, None),
    };
    connection.execute_cached(
        "INSERT INTO human_decisions (decision_id, run_id, node_id, request_digest, state, provenance, answer_digest,
             deadline_at_ms, default_answer_digest, continuation_run_id, created_at_ms, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11)
         ON CONFLICT (decision_id) DO UPDATE SET state = excluded.state, provenance = excluded.provenance,
           answer_digest = excluded.answer_digest, continuation_run_id = excluded.continuation_run_id,
           updated_at_ms = excluded.updated_at_ms",
        params![
            record.decision_id.as_str(),
            record.run_id.as_str(),
            record.node_id.as_str(),
            record.request_digest.0.to_vec(),
            state,
            provenance,
            answer,
            record.deadline_at_ms.map(i64_of),
            record.default_answer_digest.map(|d| d.0.to_vec()),
            record.continuation_run_id.as_ref().map(RunId::as_str),
            i64_of(now_ms),
        ],
    )?;
    Ok(())
}

/// A message kind whose content only its creator knows, written without it.
#[derive(Debug)]
struct MissingContent(&'static str);

impl std::fmt::Display for MissingContent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a new {} message needs its content", self.0)
    }
}

impl std::error::Error for MissingContent {}

fn missing(kind: &'static str) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(MissingContent(kind)))
}

/// Facts the kernel cannot have returned (its transitions finish at most
/// one step), refused rather than written.
#[derive(Debug)]
struct Unwritable(&'static str);

impl std::fmt::Display for Unwritable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the aggregate cannot be written: {}", self.0)
    }
}

impl std::error::Error for Unwritable {}

fn unwritable(what: &'static str) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(Unwritable(what)))
}

/// The content digest of a new message, stored (in `blobs`) before the row
/// that names it. A step presents its interaction's prompt: an initial step
/// brings it (and records it as the interaction's prompt), a resumed step
/// presents the same prompt again, a reminder puts a reminder line before
/// it. A notification, a follow-up and a terminal message (built by
/// `kernel::terminal`) bring their own text. A decision message states, in
/// one line, what it is about. A kind
/// without its content is an error: no message is ever stored without one.
pub(crate) fn message_content(
    connection: &Connection,
    message: &MessageRecord,
    after: &RunAggregate,
    contents: &[(MessageId, Blob)],
    now_ms: u64,
) -> rusqlite::Result<Digest> {
    let given = contents
        .iter()
        .find(|(id, _)| *id == message.message_id)
        .map(|(_, blob)| blob);
    let put = |blob: &Blob| -> rusqlite::Result<Digest> {
        super::blobs::put(connection, blob, super::blobs::TEXT, now_ms)?;
        Ok(blob.digest)
    };
    match &message.kind {
        MessageKind::Step {
            interaction_id,
            reason,
        } => {
            if let Some(blob) = given {
                let digest = put(blob)?;
                connection.execute_cached(
                    "UPDATE interactive_requests SET prompt_digest = ?2
                     WHERE interaction_id = ?1 AND prompt_digest IS NULL",
                    params![interaction_id.as_str(), digest.0.to_vec()],
                )?;
                return Ok(digest);
            }
            let prompt: Option<DigestColumn> = connection
                .query_row_cached(
                    "SELECT prompt_digest FROM interactive_requests WHERE interaction_id = ?1",
                    params![interaction_id.as_str()],
                    |row| row.get(0),
                )
                .optional()?
                .flatten();
            let Some(DigestColumn(prompt)) = prompt else {
                return Err(missing("step"));
            };
            match reason {
                StepReason::Initial | StepReason::Resumed => Ok(prompt),
                StepReason::Reminder => {
                    let node = after
                        .interaction
                        .as_ref()
                        .filter(|interaction| interaction.interaction_id == *interaction_id)
                        .map_or("", |interaction| interaction.node_id.as_str());
                    let prompt = super::blobs::get(connection, &prompt)?.unwrap_or_default();
                    let text = format!(
                        "Reminder: workflow step {node} is still awaiting your output. Submit it with the workflow tool as the step below asks.\n\n{}",
                        String::from_utf8_lossy(&prompt)
                    );
                    put(&Blob::text(&text))
                }
            }
        }
        MessageKind::Notification => given.map(put).unwrap_or(Err(missing("notification"))),
        MessageKind::FollowUp { .. } => given.map(put).unwrap_or(Err(missing("follow-up"))),
        MessageKind::Decision { .. } => {
            // The request the decision was opened for, stored as its
            // checkpoint's output before this message (same transaction).
            let request = match after.decision.as_ref() {
                Some(decision) => {
                    super::decisions::request(connection, &decision.run_id, &decision.node_id)?
                }
                None => None,
            };
            let Some(request) = request else {
                return Err(missing("decision"));
            };
            let text = crate::projection::decision::message_text(message.run_id.as_str(), &request);
            put(given.unwrap_or(&Blob::text(&text)))
        }
        // `kernel::terminal` writes every terminal message's content.
        MessageKind::Terminal => given.map(put).unwrap_or(Err(missing("terminal"))),
    }
}

/// Inserts a new workflow message row with its content (see
/// [`message_content`]).
pub(crate) fn insert_message(
    connection: &Connection,
    message: &MessageRecord,
    content: &Digest,
    now_ms: u64,
) -> rusqlite::Result<()> {
    let (kind, source, reason) = match &message.kind {
        MessageKind::Step {
            interaction_id,
            reason,
        } => ("step", Some(interaction_id.0.clone()), Some(name(reason))),
        MessageKind::Decision { decision_id } => ("decision", Some(decision_id.0.clone()), None),
        MessageKind::Notification => ("notification", None, None),
        MessageKind::Terminal => ("terminal", None, None),
        MessageKind::FollowUp { follow_up_id } => ("followUp", Some(follow_up_id.clone()), None),
    };
    connection.execute_cached(
        "INSERT INTO workflow_messages (message_id, session_id, run_id, kind, source_id, step_reason, session_order,
             state, entry_id, content_digest, created_at_ms, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            message.message_id.as_str(),
            message.session_id.as_str(),
            message.run_id.as_str(),
            kind,
            source,
            reason,
            i64_of(message.order),
            name(&message.state),
            message.entry_id.as_ref().map(EntryId::as_str),
            content.0.to_vec(),
            i64_of(message.created_at_ms),
            i64_of(now_ms),
        ],
    )?;
    Ok(())
}

/// Updates what can change on a stored message: its state and Pi entry.
pub(crate) fn update_message(
    connection: &Connection,
    message: &MessageRecord,
    now_ms: u64,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "UPDATE workflow_messages SET state = ?2, entry_id = ?3, version = version + 1, updated_at_ms = ?4
         WHERE message_id = ?1",
        params![
            message.message_id.as_str(),
            name(&message.state),
            message.entry_id.as_ref().map(EntryId::as_str),
            i64_of(now_ms),
        ],
    )?;
    Ok(())
}

/// Writes one turn row.
pub(crate) fn write_turn(connection: &Connection, turn: &TurnRecord) -> rusqlite::Result<()> {
    connection.execute_cached(
        "INSERT INTO workflow_turns (turn_id, message_id, run_id, session_id, state, started_at_ms, ended_at_ms,
             response_entry_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (turn_id) DO UPDATE SET state = excluded.state, ended_at_ms = excluded.ended_at_ms,
           response_entry_id = excluded.response_entry_id",
        params![
            turn.turn_id.as_str(),
            turn.message_id.as_str(),
            turn.run_id.as_str(),
            turn.session_id.as_str(),
            name(&turn.state),
            i64_of(turn.started_at_ms),
            turn.ended_at_ms.map(i64_of),
            turn.response_entry_id.as_ref().map(EntryId::as_str),
        ],
    )?;
    Ok(())
}

/// Writes the event rows among `outputs`.
pub(crate) fn write_events(
    connection: &Connection,
    outputs: &[Output],
    now_ms: u64,
) -> rusqlite::Result<()> {
    let mut statement = connection.prepare_cached(
        "INSERT INTO events (run_id, recorded_at_ms, kind, payload) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for output in outputs {
        if let Output::Event { run_id, event } = output {
            statement.execute(params![
                run_id.as_str(),
                i64_of(now_ms),
                event.kind(),
                json(event)
            ])?;
        }
    }
    Ok(())
}

/// Stores the message text of a run's terminal error beside its class.
pub fn record_error_message(
    connection: &Connection,
    run_id: &RunId,
    message: &str,
) -> rusqlite::Result<()> {
    connection.execute_cached(
        "UPDATE runs SET error_message = ?2 WHERE run_id = ?1",
        rusqlite::params![run_id.as_str(), message],
    )?;
    Ok(())
}

/// Loads one effect row by id (any state).
pub fn load_effect(
    connection: &Connection,
    run_id: &RunId,
    effect_id: &EffectId,
) -> rusqlite::Result<Option<EffectRecord>> {
    connection
        .query_row_cached(
            "SELECT effect_id, effect_type, node_path, visit, request_fingerprint, state, attempt_number,
                    node_attempt_id, result_digest
             FROM effects WHERE run_id = ?1 AND effect_id = ?2",
            rusqlite::params![run_id.as_str(), effect_id.as_str()],
            |row| effect_from_row(run_id, row),
        )
        .optional()
}

/// Runs that may be admissible (unpaused, queued or parked running), oldest
/// first, at most 256: the run id and when it was queued. The kernel
/// decides which are admitted.
pub fn admission_candidates(connection: &Connection) -> rusqlite::Result<Vec<(RunId, i64)>> {
    let mut statement = connection.prepare_cached(
        "SELECT r.run_id, q.queued_at_ms FROM runs r JOIN run_queue q ON q.run_id = r.run_id
         WHERE r.paused = 0 AND ((r.status = 'queued' AND q.status = 'queued') OR (r.status = 'running' AND q.status = 'parked'))
         ORDER BY q.queued_at_ms, r.run_id LIMIT 256",
    )?;
    statement
        .query_map([], |row| {
            Ok((RunId::new(row.get::<_, String>(0)?), row.get(1)?))
        })?
        .collect()
}

/// How many runs will need the server soon: waiting for admission, or
/// running rows whose claims still have to expire and be recovered.
pub fn unsettled_run_count(connection: &Connection) -> rusqlite::Result<i64> {
    connection.query_row_cached(
        "SELECT COUNT(*) FROM runs r JOIN run_queue q ON q.run_id = r.run_id
         WHERE r.paused = 0 AND ((r.status = 'queued' AND q.status = 'queued')
            OR (r.status = 'running' AND q.status IN ('starting', 'running'))
            OR (r.status = 'running' AND q.status = 'parked'
                AND (r.park_reason IS NULL OR r.park_reason IN ('drained', 'recovered', 'workerCrashed', 'resumeReady'))))",
        [],
        |row| row.get(0),
    )
}

/// Whether a scheduled wake of `run_id` can still find something to do:
/// its attempt is active or waiting (a node deadline), its run is running
/// with a starting or running queue row (a claim expiry), or its run has
/// not ended (a decision deadline).
pub fn wake_can_act(
    connection: &Connection,
    run_id: &RunId,
    reason: &kernel::output::WakeReason,
) -> rusqlite::Result<bool> {
    use kernel::output::WakeReason;
    let (sql, attempt) = match reason {
        WakeReason::NodeDeadline { attempt_id } => (
            "SELECT COUNT(*) FROM node_attempts WHERE run_id = ?1 AND attempt_id = ?2 AND status IN ('active', 'waiting')",
            attempt_id.as_str().to_owned(),
        ),
        WakeReason::ClaimExpiry => (
            "SELECT COUNT(*) FROM runs r JOIN run_queue q ON q.run_id = r.run_id
             WHERE r.run_id = ?1 AND r.status = 'running' AND q.status IN ('starting', 'running') AND ?2 = ?2",
            String::new(),
        ),
        WakeReason::DecisionDeadline => (
            "SELECT COUNT(*) FROM runs WHERE run_id = ?1
             AND status NOT IN ('completed', 'failed', 'timed_out', 'cancelled') AND ?2 = ?2",
            String::new(),
        ),
    };
    let live: i64 =
        connection.query_row_cached(sql, rusqlite::params![run_id.as_str(), attempt], |row| {
            row.get(0)
        })?;
    Ok(live > 0)
}

/// Running rows (starting or running queue) whose claim expired at `now_ms`.
pub fn expired_running_claims(
    connection: &Connection,
    now_ms: u64,
) -> rusqlite::Result<Vec<RunId>> {
    let mut statement = connection.prepare_cached(
        "SELECT r.run_id FROM runs r JOIN run_queue q ON q.run_id = r.run_id JOIN leases l ON l.run_id = r.run_id
         WHERE r.status = 'running' AND q.status IN ('starting', 'running')
           AND (l.expires_at_ms IS NULL OR l.expires_at_ms <= ?1)",
    )?;
    statement
        .query_map([now_ms as i64], |row| {
            Ok(RunId::new(row.get::<_, String>(0)?))
        })?
        .collect()
}
