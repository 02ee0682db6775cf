//! The one continuation of a waiting checkpoint, as the shell stores it:
//! the identity the kernel's prepare-or-adopt compares (`kernel::decision`),
//! and the write of a decision that was accepted and continued.
//!
//! Invariants:
//! - A continuation's identity is computed from stored metadata only
//!   (`kernel::decision::ContinuationIdentity::of`): the same facts give the
//!   same identity whoever asks (a person's answer, the deadline, recovery).
//! - A protected decision's continuation has a deterministic id
//!   (`continuation-` and the decision id's hex) and the parent's original
//!   input; the accepted response is its checkpoint's output.
//! - An accepted decision and its continuation are written in the caller's
//!   one transaction: the decision row, the settled parent, the child's
//!   metadata and facts, and the carried response.

use crate::store::blobs::Blob;
use crate::store::meta::{self, RunMeta};
use crate::store::{decisions, runs};
use kernel::claim::ClaimRequest;
use kernel::decision::{
    ChildIdentity, ContinuationFacts, ContinuationIdentity, ContinuationRequest, Continued,
    DecisionRecord,
};
use kernel::ids::{Digest, RunId, SessionId};
use kernel::output::Output;
use kernel::run::RunAggregate;
use rusqlite::Connection;

/// The continuation identity of `child_run_id` from stored metadata.
pub(crate) fn identity(
    meta: &RunMeta,
    child_run_id: &RunId,
    input_digest: &Digest,
    parent_run_id: &RunId,
    owning_session: Option<&SessionId>,
) -> ContinuationIdentity {
    ContinuationIdentity::of(ContinuationFacts {
        child_run_id,
        parent_run_id,
        owning_session,
        workflow_source: &meta.source_json,
        definition_digest: &meta.definition_digest,
        input_digest: *input_digest,
    })
}

/// The identity of the child that already continues `parent`, if any.
pub(crate) fn existing_child(
    connection: &Connection,
    parent: &RunAggregate,
) -> rusqlite::Result<Option<ChildIdentity>> {
    let Some(child) = &parent.run.lineage.continued_by else {
        return Ok(None);
    };
    let (Some(child_meta), Some(child_agg)) = (
        meta::load(connection, child)?,
        runs::load(connection, child)?,
    ) else {
        return Ok(None);
    };
    Ok(Some(identity(
        &child_meta,
        child,
        &child_meta.input_digest,
        &parent.run.run_id,
        child_agg.run.mode.origin_session(),
    )))
}

/// The deterministic continuation id of a protected decision.
pub(crate) fn decision_child_id(decision: &DecisionRecord) -> RunId {
    let hex = decision
        .decision_id
        .as_str()
        .strip_prefix("decision-")
        .unwrap_or(decision.decision_id.as_str());
    RunId::new(format!("continuation-{hex}"))
}

/// What the kernel needs to continue `parent` for its protected `decision`:
/// the continuation it would prepare (the parent's own input) and the
/// control claim it takes. `None` when the parent's metadata is gone.
pub(crate) fn for_decision(
    connection: &Connection,
    parent: &RunAggregate,
    decision: &DecisionRecord,
    control: ClaimRequest,
) -> rusqlite::Result<Option<ContinuationRequest>> {
    let Some(meta) = meta::load(connection, &parent.run.run_id)? else {
        return Ok(None);
    };
    let identity = identity(
        &meta,
        &decision_child_id(decision),
        &meta.input_digest,
        &parent.run.run_id,
        parent.run.mode.origin_session(),
    );
    Ok(Some(ContinuationRequest { identity, control }))
}

/// Writes a decision that was accepted and continued in one kernel
/// transition: the parent (with the accepted decision row), the child's
/// metadata (the parent's, under the child's id) and facts, and `response`
/// as the child's checkpoint output. Returns the outputs to perform after
/// the commit.
pub(crate) fn write_continued(
    connection: &Connection,
    parent: &RunAggregate,
    continued: Continued,
    response: &Blob,
    now_ms: u64,
) -> rusqlite::Result<Vec<Output>> {
    let Some(meta) = meta::load(connection, &parent.run.run_id)? else {
        return Err(rusqlite::Error::QueryReturnedNoRows);
    };
    let Continued {
        decision,
        parent: settled,
        child,
    } = continued;
    let child_run_id = child.facts.run.run_id.clone();
    let child_meta = RunMeta {
        run_id: child_run_id.clone(),
        ..meta
    };
    let checkpoint = decision.node_id.clone();
    meta::insert_run(
        connection,
        &child_meta,
        &parent.run.mode,
        Some((&parent.run.run_id, checkpoint.as_str())),
        now_ms,
    )?;
    let mut outputs =
        crate::shell::write_transition(connection, Some(parent), settled, &[], now_ms)?;
    outputs.extend(crate::shell::write_transition(
        connection,
        None,
        child,
        &[],
        now_ms,
    )?);
    decisions::carry_response(connection, &child_run_id, &checkpoint, response, now_ms)?;
    Ok(outputs)
}
