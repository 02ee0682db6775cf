//! Stopping an origin session's model-turn clocks when it has no active
//! coordinator: a closed coordinator connection (`client_api::coordinator`)
//! and a server restart (`time::recovery`, at the previous server's last
//! sign of life). One write step: load the session's facts, let
//! `kernel::session::suspend_clocks` decide, write, commit, perform.
//!
//! Invariant: a clock is stopped only by the kernel's decision, in one
//! transaction with the session facts it read.

use crate::context::Context;
use crate::store::{Commit, sessions};
use kernel::session;
use std::sync::Arc;

/// Stops the running turn clocks of `coordinator`'s session at `at_ms`
/// (default: now) when it has no active coordinator.
pub(crate) async fn suspend(
    app: &Arc<Context>,
    coordinator: session::CoordinatorFacts,
    at_ms: Option<u64>,
) -> Result<(), crate::store::StoreError> {
    let session_id = coordinator.session_id.clone();
    crate::shell::transact(app, move |connection, now_ms| {
        let before = sessions::load(connection, &session_id, None)?;
        match session::suspend_clocks(&before, &coordinator, at_ms.unwrap_or(now_ms)) {
            Some(transition) => {
                sessions::write(connection, &before, &transition.facts, now_ms)?;
                Ok(Commit::Keep(((), transition.outputs)))
            }
            None => Ok(Commit::Discard(((), Vec::new()))),
        }
    })
    .await
}
