//! Terminal workflow messages (`Output::BuildTerminalMessage`): after a run's
//! terminal state committed, one write job reads what the message says from
//! committed rows (`store::terminal`), lets `kernel::terminal` decide whether
//! the run gets one and what it says, and inserts it with its content.
//! Startup builds every one a crash left missing.
//!
//! Invariants:
//! - The message is built in its own transaction, after the terminal commit:
//!   a crash between them (fault point `before_terminal_message`) loses no
//!   terminal state, and startup ([`build_missing`]) builds the message.
//! - Building again changes nothing: the kernel finds the stored message
//!   (`terminal:<run id>`), so a repeated output or a startup scan never
//!   makes a second one.
//! - The chain's queued follow-ups are settled in the message's
//!   transaction (`kernel::follow_up::settle`): a completed leaf gives each
//!   its message after the terminal message, any other end cancels them.
//! - A message that cannot be built now (its rows are missing, the store is
//!   unavailable) never touches the run; the job is tried again a bounded
//!   number of times, and at the next startup.

use crate::context::Context;
use crate::store::blobs::Blob;
use crate::store::{
    Commit, StoreError, follow_ups, intents, launches, meta, runs, terminal, viewer,
};
use kernel::ids::RunId;
use kernel::intent::{Canceller, IntentRejection};
use kernel::terminal::TerminalRejection;
use std::sync::Arc;
use std::time::Duration;

/// How often a build that could not run is tried again before startup does it.
const RETRIES: u32 = 3;
/// The pause before each retry.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// What one build did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Built {
    /// The message was inserted.
    Inserted,
    /// The kernel refused: the run gets none, or it exists.
    Refused(TerminalRejection),
    /// The run or the rows its message needs are missing.
    Missing,
    /// The run's turn intent cannot be claimed by its terminal message.
    IntentRefused(IntentRejection),
}

/// Performs `Output::BuildTerminalMessage` after its commit: one task that
/// builds the message, retried a bounded number of times while the store
/// cannot run it.
pub fn spawn(app: &Arc<Context>, run_id: RunId) {
    app.faults
        .hit(crate::fault::FaultPoint::BeforeTerminalMessage);
    let app = app.clone();
    tokio::spawn(async move {
        for attempt in 0..=RETRIES {
            if attempt > 0 {
                tokio::time::sleep(RETRY_AFTER).await;
            }
            match build(&app, run_id.clone()).await {
                Ok(Built::Missing) => {
                    crate::log::line(
                        "a terminal workflow message was not built: its run's stored facts are missing",
                    );
                    return;
                }
                Ok(Built::Inserted | Built::Refused(_) | Built::IntentRefused(_)) => return,
                Err(_) => {}
            }
        }
        crate::log::line(
            "a terminal workflow message could not be stored; the next server start builds it",
        );
    });
}

/// Builds `run_id`'s terminal message when the kernel says it gets one.
pub async fn build(app: &Arc<Context>, run_id: RunId) -> Result<Built, StoreError> {
    crate::shell::transact(app, move |connection, now_ms| {
        let Some(agg) = runs::load_current(connection, &run_id)? else {
            return Ok(Commit::Discard((Built::Missing, Vec::new())));
        };
        let session = match kernel::terminal::recipient(&agg.run) {
            Ok(session) => session.clone(),
            Err(rejection) => return Ok(Commit::Discard((Built::Refused(rejection), Vec::new()))),
        };
        let message_id = kernel::terminal::message_id(&run_id);
        let existing = terminal::stored_message(connection, &run_id, &message_id)?;
        let Some(rows) = terminal::rows(connection, &agg.run)? else {
            return Ok(Commit::Discard((Built::Missing, Vec::new())));
        };
        let order = meta::next_message_order(connection, Some(&session))?;
        let built = match kernel::terminal::build(
            &agg.run,
            &rows.facts(),
            existing.as_ref(),
            order,
            now_ms,
        ) {
            Ok(built) => built,
            Err(rejection) => return Ok(Commit::Discard((Built::Refused(rejection), Vec::new()))),
        };
        // The run's turn intent, claimed by this message before it can be
        // sent (DEFERRED_TURNS); refused: no message.
        // A cancellation's intent (with who cancelled) is the open one.
        let open = intents::open_of_run(connection, &run_id)?;
        let launch = launches::launch_facts(connection, &run_id)?;
        let intent = match kernel::intent::for_terminal_message(
            &agg.run,
            open.as_ref(),
            Canceller::User,
            launch,
            &message_id,
            now_ms,
        ) {
            Ok(intent) => intent,
            Err(rejection) => {
                return Ok(Commit::Discard((
                    Built::IntentRefused(rejection),
                    Vec::new(),
                )));
            }
        };
        let message = &built.facts.message;
        let content = [(message_id, Blob::text(&built.facts.content))];
        let digest = runs::message_content(connection, message, &agg, &content, now_ms)?;
        runs::insert_message(connection, message, &digest, now_ms)?;
        if let Some(intent) = &intent {
            let card = kernel::terminal::presentation(&agg.run, &rows.facts());
            intents::write(connection, intent, Some(&card))?;
        }
        viewer::mark(&run_id);
        // The chain ended with this leaf: its queued follow-ups get their
        // messages (completed) or are cancelled, in this transaction.
        let chain_run_id = follow_ups::chain_root(connection, &run_id)?;
        let queued = follow_ups::queued_of_chain(connection, &chain_run_id)?;
        let first_order = meta::next_message_order(connection, Some(&session))?;
        let settled =
            kernel::follow_up::settle(&queued, &run_id, agg.run.status, first_order, now_ms);
        for follow_up in &settled {
            follow_ups::write(connection, follow_up, now_ms)?;
        }
        Ok(Commit::Keep((Built::Inserted, built.outputs)))
    })
    .await
}

/// Startup: builds the terminal message of every interactive terminal run
/// that should have one and has none (the server stopped between the
/// terminal commit and its message).
pub async fn build_missing(app: &Arc<Context>) {
    let Ok(missing) = app.store.read(terminal::missing).await else {
        crate::log::line("the terminal workflow messages a crash left missing could not be read");
        return;
    };
    for run_id in missing {
        if build(app, run_id).await.is_err() {
            crate::log::line(
                "a terminal workflow message could not be stored; the next server start builds it",
            );
        }
    }
}
