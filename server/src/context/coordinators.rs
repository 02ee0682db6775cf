//! The process-local coordinator epochs of origin sessions (a coordinator
//! is a connection: its epoch ends with it, so nothing here is durable).

use kernel::ids::{CoordinatorEpoch, SessionId};
use kernel::session::CoordinatorFacts;
use std::collections::HashMap;
use std::sync::Mutex;

/// The process-local coordinator state of every origin session.
#[derive(Debug, Default)]
pub struct Coordinators {
    pub(crate) sessions: Mutex<HashMap<SessionId, CoordinatorFacts>>,
}

impl Coordinators {
    pub(crate) fn get(&self, session_id: &SessionId) -> CoordinatorFacts {
        self.sessions
            .lock()
            .expect("coordinators lock")
            .get(session_id)
            .cloned()
            .unwrap_or_else(|| CoordinatorFacts::new(session_id.clone()))
    }

    pub(crate) fn set(&self, facts: CoordinatorFacts) {
        self.sessions
            .lock()
            .expect("coordinators lock")
            .insert(facts.session_id.clone(), facts);
    }

    /// The active epoch of `session_id`, if a coordinator is connected.
    pub fn active_epoch(&self, session_id: &SessionId) -> Option<CoordinatorEpoch> {
        self.get(session_id).active.map(|active| active.epoch)
    }
}
