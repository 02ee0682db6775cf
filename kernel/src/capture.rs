//! Session capture: the Pi events of a run's workflow turns, recorded by the
//! run's origin-session coordinator (`sessionEvents.record`) for viewers.
//!
//! Invariants:
//! - Only the run's origin session records, through the connection that owns
//!   its active coordinator epoch ([`check_authority`]); checked before any
//!   stored event is read.
//! - Events carry run-wide sequence numbers from 1 without gaps. A batch is
//!   contiguous; the part of it already stored adopts when every event has
//!   the stored content digest and conflicts otherwise (nothing changes);
//!   the rest must start at the next number.
//! - Bounds: at most [`MAX_BATCH`] events a batch, [`MAX_EVENT_BYTES`] an
//!   event, [`MAX_RUN_EVENTS`] a run. A refused batch stores nothing.
//! - After every [`CHECKPOINT_EVERY`]th event a replay checkpoint is written in
//!   the same transaction: the bounded state a viewer needs to replay from
//!   the next event on (whether a turn is open, and the start numbers of the
//!   messages and tool executions still open, at most [`MAX_OPEN`] each).
//! - Captured events are presentation: they never enter a run's state, a
//!   runner's command or a result blob.

use crate::ids::{Digest, SessionId};
use crate::run::RunRecord;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// The most events one `sessionEvents.record` carries.
pub const MAX_BATCH: usize = 256;
/// The most bytes one event's canonical data takes.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// The most events one run keeps.
pub const MAX_RUN_EVENTS: u64 = 1_000_000;
/// A replay checkpoint follows every this many events.
pub const CHECKPOINT_EVERY: u64 = 256;
/// The most open messages (and, separately, tool executions) a checkpoint names.
pub const MAX_OPEN: usize = 64;

/// Why a batch was refused. Nothing is stored on a rejection.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "rejection")]
pub enum CaptureRejection {
    /// The session is not the run's origin session (or the run is headless).
    NotOriginSession,
    /// The connection does not own the session's active coordinator epoch.
    StaleCoordinator,
    /// A batch holds no event, or more than [`MAX_BATCH`].
    BatchSize { events: usize },
    /// An event's data is larger than [`MAX_EVENT_BYTES`].
    EventTooLarge { seq: u64 },
    /// The batch is not contiguous, or does not reach the next number.
    Gap { expected: u64 },
    /// A stored event has another content under this number.
    Conflict { seq: u64 },
    /// The run holds [`MAX_RUN_EVENTS`] events.
    RunFull,
}

/// One event of a batch, as the shell measured it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IncomingEvent {
    pub seq: u64,
    /// What replay folds: `turn_started`, `message_started`, ... (others pass).
    pub event_type: alloc::string::String,
    /// Digest of the event's canonical `{type, data}`.
    pub digest: Digest,
    /// Bytes of its canonical data.
    pub data_bytes: usize,
}

/// The replay state after an event: what a viewer starting at the next
/// event needs (the events before are not read again).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayState {
    /// The number of the last event folded in.
    pub through_seq: u64,
    /// Whether a model turn is open.
    pub turn_open: bool,
    /// Start numbers of the messages still open, oldest first (the newest
    /// [`MAX_OPEN`]).
    pub open_messages: Vec<u64>,
    /// Start numbers of the tool executions still open, oldest first.
    pub open_tools: Vec<u64>,
    /// Whether older open starts were dropped to stay bounded.
    pub truncated: bool,
}

impl ReplayState {
    /// The state after `event` (numbered `seq`).
    fn fold(&mut self, seq: u64, event_type: &str) {
        self.through_seq = seq;
        match event_type {
            "turn_started" => self.turn_open = true,
            "turn_finished" => {
                self.turn_open = false;
                self.open_messages.clear();
                self.open_tools.clear();
            }
            "message_started" => push_bounded(&mut self.open_messages, seq, &mut self.truncated),
            "message_finished" => drop_oldest(&mut self.open_messages),
            "tool_execution_started" => {
                push_bounded(&mut self.open_tools, seq, &mut self.truncated);
            }
            "tool_execution_finished" => drop_oldest(&mut self.open_tools),
            _ => {}
        }
    }
}

fn push_bounded(open: &mut Vec<u64>, seq: u64, truncated: &mut bool) {
    open.push(seq);
    if open.len() > MAX_OPEN {
        open.remove(0);
        *truncated = true;
    }
}

fn drop_oldest(open: &mut Vec<u64>) {
    if !open.is_empty() {
        open.remove(0);
    }
}

/// A run's capture as the shell loads it in the write transaction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CaptureFacts {
    /// Events stored (the next number is this plus one).
    pub stored: u64,
    /// The replay state after the last stored event.
    pub state: ReplayState,
    /// The stored digests of the batch's numbers that are already stored.
    pub overlap: Vec<(u64, Digest)>,
}

/// What a batch changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The numbers to insert (a suffix of the batch), in order.
    pub new: Vec<u64>,
    /// How many events of the batch were already stored and adopted.
    pub adopted: usize,
    /// The facts after the batch.
    pub facts: CaptureFacts,
    /// A replay checkpoint after each of these events.
    pub checkpoints: Vec<ReplayState>,
}

/// The authority of `sessionEvents.record`: `session` must be `run`'s origin
/// session and the connection must own its active coordinator epoch
/// (`coordinator_epoch_owned`, from `session::epoch_of`).
pub fn check_authority(
    run: &RunRecord,
    session: &SessionId,
    coordinator_epoch_owned: bool,
) -> Result<(), CaptureRejection> {
    if run.mode.origin_session() != Some(session) {
        return Err(CaptureRejection::NotOriginSession);
    }
    if !coordinator_epoch_owned {
        return Err(CaptureRejection::StaleCoordinator);
    }
    Ok(())
}

/// Records `batch` over `facts` (see the module invariants). The run's
/// status does not matter: a terminal run's last turns (its terminal
/// message's) are captured too.
pub fn record(facts: &CaptureFacts, batch: &[IncomingEvent]) -> Result<Recorded, CaptureRejection> {
    if batch.is_empty() || batch.len() > MAX_BATCH {
        return Err(CaptureRejection::BatchSize {
            events: batch.len(),
        });
    }
    if let Some(large) = batch
        .iter()
        .find(|event| event.data_bytes > MAX_EVENT_BYTES)
    {
        return Err(CaptureRejection::EventTooLarge { seq: large.seq });
    }
    let first = batch[0].seq;
    let next = facts.stored + 1;
    let contiguous = batch
        .iter()
        .enumerate()
        .all(|(index, event)| event.seq == first + index as u64);
    if first == 0 || !contiguous || first > next {
        return Err(CaptureRejection::Gap { expected: next });
    }
    let mut adopted = 0;
    for event in batch.iter().filter(|event| event.seq < next) {
        let stored = facts
            .overlap
            .iter()
            .find(|(seq, _)| *seq == event.seq)
            .map(|(_, digest)| digest);
        if stored != Some(&event.digest) {
            return Err(CaptureRejection::Conflict { seq: event.seq });
        }
        adopted += 1;
    }
    let fresh = &batch[adopted..];
    if facts.stored + fresh.len() as u64 > MAX_RUN_EVENTS {
        return Err(CaptureRejection::RunFull);
    }
    let mut next_facts = CaptureFacts {
        stored: facts.stored + fresh.len() as u64,
        state: facts.state.clone(),
        overlap: Vec::new(),
    };
    let mut checkpoints = Vec::new();
    for event in fresh {
        next_facts.state.fold(event.seq, &event.event_type);
        if event.seq % CHECKPOINT_EVERY == 0 {
            checkpoints.push(next_facts.state.clone());
        }
    }
    Ok(Recorded {
        new: fresh.iter().map(|event| event.seq).collect(),
        adopted,
        facts: next_facts,
        checkpoints,
    })
}

#[cfg(test)]
mod tests;
