//! The one transaction path of a run decision: load the run's bounded facts,
//! let the kernel decide, write the facts, their events and the presentation
//! revision, commit, then perform the outputs.
//!
//! [`apply`] is that path for every decision that is not a client command
//! or a runner message: node-deadline and claim-expiry wakes, startup
//! recovery, scheduler admission, runner exits, shutdown parking and
//! refused runner frames. Client commands (`client_api::command`, with their
//! receipts) and runner messages (`runner_channel`, with runner-message
//! receipts) run their own receipt job and write the kernel's decision with
//! [`write_step`], the same in-transaction half. Decisions that are not one
//! run's step (a submission and its verdict, a coordinator's report) run
//! through [`transact`]: the same load → kernel → write → commit → perform,
//! with the job's own answer; their transitions are written with
//! [`write_transition`].
//!
//! Invariants:
//! - The shell decides nothing here: the closure returns the kernel's
//!   [`Step`] or rejection unchanged. A deferral is the kernel's
//!   (`Step::Defer`) and becomes exactly one `Wake`; the shell never turns a
//!   rejection into a wake.
//! - Outputs are performed only after the job committed, and only the
//!   outputs of that job.
//! - A rejection writes none of the kernel's facts. Supervision records the
//!   closure itself wrote before deciding (a runner's exit status) are kept.
//! - A decision that hands a lost queue claim to a new owner under an
//!   active workflow turn writes the kernel's `claimLost` turn intent in its
//!   own transaction (event policy row 7), before the turn is aborted.
//! - This module names only the store: the server context reaches it
//!   through [`Shell`], so the transaction path sits below every handler in
//!   the import graph.

use crate::store::blobs::Blob;
use crate::store::{Commit, Store, StoreError, intents, runs};
use kernel::ids::{MessageId, RunId};
use kernel::output::{Output, Step, Transition};
use kernel::run::{Rejection, RunAggregate};
use rusqlite::Connection;

/// What the transaction path needs of the server: the store to run the job
/// on and the performer of the committed outputs (`App`).
pub(crate) trait Shell {
    fn store(&self) -> &Store;
    /// Where the job reads its transaction time.
    fn clock(&self) -> crate::clock::Clock;
    /// Performs outputs of a committed job, in order.
    fn perform(&self, outputs: Vec<Output>);
}

/// What [`apply`] did (its outputs are already performed).
#[derive(Debug)]
pub(crate) enum Applied {
    /// The kernel's transition was written and committed.
    Changed,
    /// The kernel deferred the decision; one wake is scheduled.
    Deferred,
    /// The kernel had nothing to decide.
    Nothing,
    /// The kernel refused (for a wake, the facts moved on: the attempt
    /// finished, another generation owns the run); nothing it decided was
    /// written.
    Rejected,
    /// There is no such run.
    Missing,
    /// The store could not run the job (it logged why).
    Unavailable,
}

impl Applied {
    /// Whether new facts were committed.
    pub(crate) const fn changed(&self) -> bool {
        matches!(self, Self::Changed)
    }
}

/// A kernel decision over the loaded run: the run's facts, the job's
/// connection (for the bounded extra facts a decision reads, such as the
/// stored topology) and `now_ms`.
pub(crate) type Decided = Result<Step<RunAggregate>, Rejection>;

/// The in-transaction half: writes `step` over `before` (facts, events and
/// the run's presentation mark, plus the content of new messages only the
/// caller knows) and returns the outputs to perform after the commit (a
/// deferral's one `Wake`).
pub(crate) fn write_step(
    connection: &Connection,
    before: &RunAggregate,
    step: Step<RunAggregate>,
    contents: &[(MessageId, Blob)],
    now_ms: u64,
) -> rusqlite::Result<Vec<Output>> {
    match step {
        Step::Apply(transition) => {
            write_transition(connection, Some(before), transition, contents, now_ms)
        }
        deferred_or_nothing => Ok(deferred_or_nothing.into_outputs(&before.run.run_id).1),
    }
}

/// Writes one accepted transition over `before` (`None`: a run the
/// transition creates, such as a reservation, restart or continuation) and
/// returns its outputs to perform after the commit.
pub(crate) fn write_transition(
    connection: &Connection,
    before: Option<&RunAggregate>,
    transition: Transition<RunAggregate>,
    contents: &[(MessageId, Blob)],
    now_ms: u64,
) -> rusqlite::Result<Vec<Output>> {
    runs::write_with_contents(
        connection,
        before,
        &transition.facts,
        &transition.outputs,
        contents,
        now_ms,
    )?;
    Ok(transition.outputs)
}

/// Load → decide → write → commit → perform, for a job that answers `R`:
/// `job` gets the connection and `now_ms`, and returns `Commit::Keep((answer,
/// outputs))` to commit or `Commit::Discard((answer, _))` to write nothing.
/// The outputs of a kept job are performed after its commit; a discarded
/// job's are dropped (nothing it decided was written).
pub(crate) async fn transact<R, J>(app: &impl Shell, job: J) -> Result<R, StoreError>
where
    R: Send + 'static,
    J: FnOnce(&Connection, u64) -> rusqlite::Result<Commit<(R, Vec<Output>)>> + Send + 'static,
{
    let clock = app.clock();
    let (answer, outputs) = app
        .store()
        .write(move |connection| {
            Ok(match job(connection, clock.now_ms())? {
                Commit::Keep(kept) => Commit::Keep(kept),
                Commit::Discard((answer, _not_written)) => Commit::Discard((answer, Vec::new())),
            })
        })
        .await?;
    app.perform(outputs);
    Ok(answer)
}

/// Load → decide → write → commit → perform, for the run `run_id`.
pub(crate) async fn apply<D>(app: &impl Shell, run_id: RunId, decide: D) -> Applied
where
    D: FnOnce(&Connection, &RunAggregate, u64) -> rusqlite::Result<Decided> + Send + 'static,
{
    apply_then(app, run_id, decide, |_, _| Ok(())).await
}

/// [`apply`], with `then`: rows that belong beside the kernel's new facts
/// (an attempt's stored error message), written in the same transaction
/// after them, only when the kernel changed the run.
pub(crate) async fn apply_then<D, T>(app: &impl Shell, run_id: RunId, decide: D, then: T) -> Applied
where
    D: FnOnce(&Connection, &RunAggregate, u64) -> rusqlite::Result<Decided> + Send + 'static,
    T: FnOnce(&Connection, &RunAggregate) -> rusqlite::Result<()> + Send + 'static,
{
    transact(app, move |connection, now_ms| {
        let Some(before) = runs::load(connection, &run_id)? else {
            return Ok(Commit::Discard((Applied::Missing, Vec::new())));
        };
        let step = match decide(connection, &before, now_ms)? {
            Ok(step) => step,
            Err(_) => return Ok(Commit::Keep((Applied::Rejected, Vec::new()))),
        };
        let applied = match &step {
            Step::Apply(_) => Applied::Changed,
            Step::Defer { .. } => Applied::Deferred,
            Step::Nothing => Applied::Nothing,
        };
        let (facts, outputs) = step.into_outputs(&before.run.run_id);
        if let Some(facts) = &facts {
            runs::write(connection, Some(&before), facts, &outputs, now_ms)?;
            claim_lost_intent(connection, &before, facts, now_ms)?;
            then(connection, facts)?;
        }
        Ok(Commit::Keep((applied, outputs)))
    })
    .await
    .unwrap_or(Applied::Unavailable)
}

/// A decision that handed a lost queue claim to a new owner while a workflow
/// turn of the run was active (the claim-expiry wake, a fenced or orphaned
/// runner's exit: `kernel::intent::loses_claim_with_active_turn`) creates
/// the run's `claimLost` intent, ineligible, in its own transaction
/// (`kernel::intent::on_claim_lost`); the run's later terminal message
/// reuses it.
fn claim_lost_intent(
    connection: &Connection,
    before: &RunAggregate,
    after: &RunAggregate,
    now_ms: u64,
) -> rusqlite::Result<()> {
    if !kernel::intent::loses_claim_with_active_turn(before, after) {
        return Ok(());
    }
    let open = intents::open_of_run(connection, &after.run.run_id)?;
    if let Some(intent) = kernel::intent::on_claim_lost(before, after, open.as_ref(), now_ms) {
        intents::write(connection, &intent, None)?;
    }
    Ok(())
}
