//! Crash injection for tests: `PI_WORKFLOWS_FAULT=<point>[:<n>]` makes the
//! server kill itself with SIGKILL the `n`-th time (default 1st) it reaches
//! `<point>` (an error point fails that step instead: `Faults::fails`).
//! Unset in production; the points are the places where a crash is most
//! likely to leave inconsistent state if the design were wrong.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A place around a commit or a spawn where a crash can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPoint {
    /// Inside the write transaction, after the jobs ran, before `COMMIT`.
    BeforeCommit,
    /// After `COMMIT`, before any reply was sent.
    AfterCommit,
    /// After a runner launch was committed, before the process is spawned.
    BeforeSpawn,
    /// After the runner process was spawned.
    AfterSpawn,
    /// After a command's receipt committed, before the command's outputs
    /// are performed or its reply is sent (counts commands, not commits:
    /// timers and reads do not shift it).
    AfterReceipt,
    /// After a reply was written to a client socket.
    AfterReply,
    /// After a run's terminal state committed, before its terminal
    /// workflow message is built (counts terminal commits).
    BeforeTerminalMessage,
    /// State retention: inside a run tree's deletion transaction, after its
    /// rows were deleted, before its commit (counts deleted trees).
    TreeDeleted,
    /// State retention: after a run tree's deletion committed, before the
    /// next tree (counts deleted trees).
    TreeCommitted,
    /// State retention: a run tree's deletion fails with an SQL error
    /// instead of running (an error, not a crash; see [`Faults::fails`]).
    TreeError,
    /// Inside the transaction of an accepted `decision.answer`, after the
    /// decision, the settled parent and the continuation were written,
    /// before `COMMIT`.
    DecisionBeforeCommit,
    /// Inside the write transaction of a fused step (a node's result, the
    /// next attempt and its static deadline: `node.finished`, `node.failed`,
    /// `notification.requested`), after its receipt was written, before
    /// `COMMIT` (counts fused commits only).
    BeforeFusedCommit,
    /// After a fused step committed, before its outputs are performed or its
    /// reply (the next dispatch) is sent to the runner.
    AfterFusedCommit,
}

impl FaultPoint {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "before_commit" => Self::BeforeCommit,
            "after_commit" => Self::AfterCommit,
            "before_spawn" => Self::BeforeSpawn,
            "after_spawn" => Self::AfterSpawn,
            "after_receipt" => Self::AfterReceipt,
            "after_reply" => Self::AfterReply,
            "before_terminal_message" => Self::BeforeTerminalMessage,
            "tree_deleted" => Self::TreeDeleted,
            "tree_committed" => Self::TreeCommitted,
            "tree_error" => Self::TreeError,
            "decision_before_commit" => Self::DecisionBeforeCommit,
            "before_fused_commit" => Self::BeforeFusedCommit,
            "after_fused_commit" => Self::AfterFusedCommit,
            _ => return None,
        })
    }
}

/// The configured fault, shared by every thread of the server.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    armed: Option<(FaultPoint, u64, Arc<AtomicU64>)>,
}

impl Faults {
    /// Reads `PI_WORKFLOWS_FAULT`. An unknown point is ignored.
    pub fn from_env() -> Self {
        let Ok(spec) = std::env::var("PI_WORKFLOWS_FAULT") else {
            return Self::default();
        };
        let (name, count) = spec.split_once(':').unwrap_or((spec.as_str(), "1"));
        match (FaultPoint::parse(name), count.parse::<u64>()) {
            (Some(point), Ok(n)) if n > 0 => Self {
                armed: Some((point, n, Arc::new(AtomicU64::new(0)))),
            },
            _ => Self::default(),
        }
    }

    /// Kills the process if `point` is the armed point and its count is reached.
    pub fn hit(&self, point: FaultPoint) {
        if self.reached(point) {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// Whether the armed error point `point` fails now (its count is
    /// reached): the caller fails instead of going on.
    pub fn fails(&self, point: FaultPoint) -> bool {
        self.reached(point)
    }

    fn reached(&self, point: FaultPoint) -> bool {
        matches!(&self.armed, Some((armed, n, seen))
            if *armed == point && seen.fetch_add(1, Ordering::SeqCst) + 1 == *n)
    }
}
