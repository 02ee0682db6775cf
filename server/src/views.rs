//! Publishing run changes to live subscribers.
//!
//! Invariant: a publish is a notification that committed facts changed; a
//! subscriber re-reads the committed view, so a dropped or coalesced notice
//! can delay a renderer but never show it a state that did not commit.

use crate::app::App;
use kernel::ids::{Revision, RunId, SessionId};
use std::sync::Arc;
use tokio::sync::broadcast;

/// What changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Run { run_id: RunId, revision: Revision },
    Session { session_id: SessionId },
}

/// The fan-out point for committed changes.
#[derive(Debug)]
pub struct Hub {
    changes: broadcast::Sender<Change>,
}

impl Default for Hub {
    fn default() -> Self {
        Self::new()
    }
}

impl Hub {
    /// A hub with no subscribers.
    pub fn new() -> Self {
        Self {
            changes: broadcast::channel(1024).0,
        }
    }

    /// A new receiver of changes.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// A run's durable facts changed at `revision`.
    pub fn publish_run(&self, _app: &Arc<App>, run_id: &RunId, revision: Revision) {
        let _ = self.changes.send(Change::Run {
            run_id: run_id.clone(),
            revision,
        });
    }

    /// An origin session's messages changed.
    pub fn publish_session(&self, _app: &Arc<App>, session_id: &SessionId) {
        let _ = self.changes.send(Change::Session {
            session_id: session_id.clone(),
        });
    }
}
