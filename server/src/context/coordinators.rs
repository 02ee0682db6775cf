//! The process-local coordinator epochs of origin sessions (a coordinator
//! is a connection: its epoch ends with it, so nothing here is durable).
//!
//! Invariants:
//! - No write job reads or changes this state. A coordinator operation
//!   [`hold`](Coordinators::hold)s it, reads the session's facts before its
//!   write job (they enter the job as a fact the kernel decides over),
//!   and stores the kernel's next facts only after the job committed.
//! - Holders run one at a time (an async lock held across the job), so a
//!   read-decide-commit-update cycle is atomic against every other
//!   coordinator operation and no update is lost.

use kernel::ids::{CoordinatorEpoch, SessionId};
use kernel::session::CoordinatorFacts;
use std::collections::HashMap;
use tokio::sync::{Mutex, MutexGuard};

/// The process-local coordinator state of every origin session.
#[derive(Debug, Default)]
pub struct Coordinators {
    sessions: Mutex<HashMap<SessionId, CoordinatorFacts>>,
}

impl Coordinators {
    /// Holds the coordinator state for one load → decide → commit → update
    /// cycle (waits for the current holder).
    pub async fn hold(&self) -> Held<'_> {
        Held(self.sessions.lock().await)
    }

    /// For work under an origin session's authority (`session_id`): the
    /// held state and the session's active epoch, which enters the write
    /// job as a fact (held, not re-read in the job, so no takeover commits
    /// between this read and the job; the kernel compares it). Nothing for
    /// work under a runner's authority.
    pub async fn hold_for(
        &self,
        session_id: Option<&SessionId>,
    ) -> (Option<Held<'_>>, Option<CoordinatorEpoch>) {
        match session_id {
            Some(session_id) => {
                let held = self.hold().await;
                let active = held.active_epoch(session_id);
                (Some(held), active)
            }
            None => (None, None),
        }
    }
}

/// The coordinator state, held by one operation.
#[derive(Debug)]
pub struct Held<'a>(MutexGuard<'a, HashMap<SessionId, CoordinatorFacts>>);

impl Held<'_> {
    /// The coordinator facts of `session_id` (a session nobody coordinated
    /// yet has none active).
    pub fn get(&self, session_id: &SessionId) -> CoordinatorFacts {
        self.0
            .get(session_id)
            .cloned()
            .unwrap_or_else(|| CoordinatorFacts::new(session_id.clone()))
    }

    /// Stores the kernel's next facts of a committed decision.
    pub fn set(&mut self, facts: CoordinatorFacts) {
        self.0.insert(facts.session_id.clone(), facts);
    }

    /// The active epoch of `session_id`, if a coordinator is connected.
    pub fn active_epoch(&self, session_id: &SessionId) -> Option<CoordinatorEpoch> {
        self.get(session_id).active.map(|active| active.epoch)
    }

    /// Every session's facts, for a change that is not one session's (a
    /// closed connection ends the epochs it owned).
    pub fn every_session(&mut self) -> impl Iterator<Item = &mut CoordinatorFacts> {
        self.0.values_mut()
    }
}
