//! Live subscriptions: run views, the run list and origin sessions.
//!
//! Invariants:
//! - Every event carries a state that committed: a subscriber re-reads
//!   committed facts after each announced commit (`Store::subscribe`), or
//!   takes the identical patch another subscriber at the same cursor read
//!   (retained deltas never change), so a coalesced or lagging subscriber can
//!   be late but never wrong.
//! - A run subscriber receives the patches after its last accepted revision
//!   when they are retained, otherwise one bounded snapshot.
//! - A slow subscriber has at most one event buffered at a time: the next
//!   event is prepared only after the previous one reached the socket, and
//!   every change in between is coalesced into it. The server's memory per
//!   subscriber is bounded by one event.
//! - `unsubscribe` and connection close stop the subscription's task; a
//!   connection has at most [`MAX_SUBSCRIPTIONS`], and none starts after
//!   its connection closed.

use super::Presentation;
use crate::projection::run_view::to_wire;
use crate::store::{Published, viewer};
use crate::wire::client::{Outbox, frame};
use kernel::ids::{RunId, SessionId};
use protocol::generated::types::{Availability, ClientEvent, SubscriptionId};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

/// The fan-out point for committed changes (the store announces them). It
/// shares each computed patch with every subscriber at the same cursor, so
/// a commit is read once for all of a run's subscribers, not once each.
/// It also carries the progress of the running state-maintenance command.
#[derive(Debug)]
pub struct Hub {
    patches: Mutex<VecDeque<SharedPatch>>,
    /// Maintenance progress events with their sequence number (the
    /// revision of their event frames; it only grows).
    progress: broadcast::Sender<(u64, Arc<ClientEvent>)>,
    progress_sequence: AtomicU64,
}

/// How many progress events a slow maintenance subscriber may fall behind
/// before it skips to newer ones (the publisher sends a few a second).
const PROGRESS_BACKLOG: usize = 64;

impl Default for Hub {
    fn default() -> Self {
        Self {
            patches: Mutex::default(),
            progress: broadcast::Sender::new(PROGRESS_BACKLOG),
            progress_sequence: AtomicU64::new(0),
        }
    }
}

/// A patch event payload from one revision to another of one run. Deltas
/// never change, so an entry stays correct; only the newest few are kept.
#[derive(Debug)]
struct SharedPatch {
    run_id: RunId,
    from: u64,
    to: u64,
    payload: Arc<ClientEvent>,
}

/// How many computed patches the hub keeps.
const SHARED_PATCHES: usize = 64;

impl Hub {
    /// A hub.
    pub fn new() -> Self {
        Self::default()
    }

    /// Kernel `PublishRun` outputs need no work: the store announces every
    /// committed presentation revision itself, after the commit.
    pub fn publish_run(
        &self,
        _app: &Arc<Presentation>,
        _run_id: &RunId,
        _revision: kernel::ids::Revision,
    ) {
    }

    /// Session messages are announced with the run change that carried them.
    pub fn publish_session(&self, _app: &Arc<Presentation>, _session_id: &SessionId) {}

    /// Publishes the running maintenance command's progress (a
    /// `maintenanceProgress` event) to every maintenance subscriber.
    pub fn publish_progress(&self, event: ClientEvent) {
        let sequence = self.progress_sequence.fetch_add(1, Ordering::SeqCst) + 1;
        // No subscriber: nobody to tell.
        let _ = self.progress.send((sequence, Arc::new(event)));
    }

    fn shared_patch(&self, run_id: &RunId, from: u64, to: u64) -> Option<Arc<ClientEvent>> {
        let patches = self.patches.lock().expect("hub lock");
        patches
            .iter()
            .find(|patch| patch.from == from && patch.to == to && &patch.run_id == run_id)
            .map(|patch| patch.payload.clone())
    }

    fn share_patch(&self, run_id: &RunId, from: u64, to: u64, payload: Arc<ClientEvent>) {
        let mut patches = self.patches.lock().expect("hub lock");
        if patches.len() == SHARED_PATCHES {
            patches.pop_front();
        }
        patches.push_back(SharedPatch {
            run_id: run_id.clone(),
            from,
            to,
            payload,
        });
    }
}

/// What a subscription follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Run(RunId),
    RunList,
    Session(SessionId),
    /// The running state-maintenance command's progress.
    Maintenance,
}

/// How many subscriptions one connection may hold.
pub const MAX_SUBSCRIPTIONS: usize = 64;

/// The subscriptions of one connection.
#[derive(Clone, Debug, Default)]
pub struct Subscriptions {
    inner: Arc<Mutex<Active>>,
}

/// The live subscription tasks of a connection, and whether it closed.
#[derive(Debug, Default)]
struct Active {
    tasks: HashMap<String, JoinHandle<()>>,
    closed: bool,
}

/// Why a subscription did not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotStarted {
    /// The connection already holds [`MAX_SUBSCRIPTIONS`].
    Full,
    /// The connection closed.
    Closed,
}

impl Subscriptions {
    /// No subscriptions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a subscription task. Its first frame is the `subscribe`
    /// response that `accepted` builds from the new subscription id.
    pub fn start(
        &self,
        app: &Arc<Presentation>,
        outbox: &Outbox,
        target: Target,
        from_revision: Option<u64>,
        accepted: impl FnOnce(&str) -> Value,
    ) -> Result<String, NotStarted> {
        let mut active = self.inner.lock().expect("subscriptions lock");
        if active.closed {
            return Err(NotStarted::Closed);
        }
        if active.tasks.len() >= MAX_SUBSCRIPTIONS {
            return Err(NotStarted::Full);
        }
        let id = format!("sub-{}", crate::ids::random_hex::<6>());
        let response = frame(&accepted(&id));
        let (app, outbox_for_task, task_id) = (app.clone(), outbox.clone(), id.clone());
        let task = tokio::spawn(async move {
            if outbox_for_task.send(response).await {
                follow(app, outbox_for_task, task_id, target, from_revision).await;
            }
        });
        active.tasks.insert(id.clone(), task);
        Ok(id)
    }

    /// Stops one subscription; `false` when it does not exist.
    pub fn stop(&self, id: &str) -> bool {
        match self
            .inner
            .lock()
            .expect("subscriptions lock")
            .tasks
            .remove(id)
        {
            Some(task) => {
                task.abort();
                true
            }
            None => false,
        }
    }

    /// How many subscriptions are active.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("subscriptions lock").tasks.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops every subscription; none starts afterwards (connection closed).
    pub fn close_all(&self) {
        let mut active = self.inner.lock().expect("subscriptions lock");
        active.closed = true;
        for (_, task) in active.tasks.drain() {
            task.abort();
        }
    }
}

async fn follow(
    app: Arc<Presentation>,
    outbox: Outbox,
    id: String,
    target: Target,
    from_revision: Option<u64>,
) {
    // The id was made by `start` on the id pattern.
    let Ok(id) = to_wire::<SubscriptionId>("subscriptionId", &id) else {
        crate::log::line("a subscription id does not fit its schema; the subscription ends");
        return;
    };
    if target == Target::Maintenance {
        follow_progress(&app, &outbox, &id).await;
        return;
    }
    // Subscribe before the first read so no commit between them is missed.
    let mut changes = app.store.subscribe();
    let mut cursor = from_revision;
    // The newest revision of a followed run the store announced.
    let mut announced: Option<u64> = None;
    // The followed run was deleted by state retention.
    let mut deleted = false;
    loop {
        let sent = match &target {
            Target::Run(_) if deleted => {
                deliver_deleted(&outbox, &id, cursor).await;
                return;
            }
            Target::Run(run_id) => {
                deliver_run(&app, &outbox, &id, run_id, &mut cursor, announced).await
            }
            Target::RunList => deliver_list(&app, &outbox, &id, &mut cursor).await,
            Target::Session(session_id) => {
                deliver_session(&app, &outbox, &id, session_id, &mut cursor).await
            }
            Target::Maintenance => return,
        };
        if !sent || outbox.is_closed() {
            return;
        }
        // Wait for the next relevant commit, then coalesce everything pending.
        loop {
            match changes.recv().await {
                Ok(change) if relevant(&target, change.run_id()) => {
                    note(&target, &mut announced, &mut deleted, &change);
                    break;
                }
                Ok(_) => {}
                Err(RecvError::Lagged(_)) => {
                    announced = None;
                    break;
                }
                Err(RecvError::Closed) => return,
            }
        }
        loop {
            match changes.try_recv() {
                Ok(change) => note(&target, &mut announced, &mut deleted, &change),
                Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => announced = None,
                Err(_) => break,
            }
        }
    }
}

/// Remembers the newest announced revision of the followed run, or that it
/// was deleted.
fn note(target: &Target, announced: &mut Option<u64>, deleted: &mut bool, change: &Published) {
    let Target::Run(run_id) = target else {
        return;
    };
    match change {
        Published::Revised(changed, revision) if changed == run_id => {
            *announced = (*announced).max(Some(*revision));
        }
        Published::Deleted(changed) if changed == run_id => *deleted = true,
        Published::Revised(..) | Published::Deleted(_) => {}
    }
}

fn relevant(target: &Target, changed: &RunId) -> bool {
    match target {
        Target::Run(run_id) => run_id == changed,
        Target::RunList | Target::Session(_) => true,
        Target::Maintenance => false,
    }
}

/// Sends every maintenance progress event published after the
/// subscription started, in order; a reader more than `PROGRESS_BACKLOG`
/// events behind skips to newer ones.
async fn follow_progress(app: &Arc<Presentation>, outbox: &Outbox, id: &SubscriptionId) {
    let mut progress = app.hub.progress.subscribe();
    loop {
        match progress.recv().await {
            Ok((sequence, event)) => {
                if !outbox
                    .send_and_drain(crate::wire::frames::event(id, sequence, (*event).clone()))
                    .await
                {
                    return;
                }
            }
            Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

/// Tells a run subscriber that its run was deleted (an `unavailable` event
/// after the last revision it got); the subscription then ends, and the run
/// answers `notFound` from then on.
async fn deliver_deleted(outbox: &Outbox, id: &SubscriptionId, cursor: Option<u64>) {
    let event = ClientEvent::Availability {
        reason: "notFound: state retention deleted this run (its tree expired)"
            .parse()
            .ok(),
        state: Availability::Unavailable,
    };
    let revision = cursor.unwrap_or(0).saturating_add(1);
    outbox
        .send_and_drain(crate::wire::frames::event(id, revision, event))
        .await;
}

/// Sends what a run subscriber is missing: patches since its cursor when
/// retained, otherwise a snapshot. Returns `false` when the connection closed.
async fn deliver_run(
    app: &Arc<Presentation>,
    outbox: &Outbox,
    id: &SubscriptionId,
    run_id: &RunId,
    cursor: &mut Option<u64>,
    announced: Option<u64>,
) -> bool {
    // Another subscriber at the same cursor may have read this patch already.
    if let (Some(from), Some(to)) = (*cursor, announced)
        && let Some(payload) = app.hub.shared_patch(run_id, from, to)
    {
        *cursor = Some(to);
        return outbox
            .send_and_drain(crate::wire::frames::event(id, to, (*payload).clone()))
            .await;
    }
    let run = run_id.clone();
    let from = *cursor;
    let read = app
        .store
        .read(move |connection| {
            let current = viewer::presentation_revision(connection, &run)?;
            if from == Some(current) {
                return Ok(None);
            }
            if let Some(from) = from
                && let Some((revision, ops)) = viewer::patches_since(connection, &run, from)?
            {
                let patch = ClientEvent::RunViewPatch {
                    base_revision: crate::projection::run_view::revision(from)?,
                    ops,
                    run_id: to_wire("runId", &run)?,
                };
                return Ok(Some((revision, patch)));
            }
            let view = viewer::snapshot(connection, &run)?;
            Ok(view.map(|view| (current, ClientEvent::RunViewSnapshot { view })))
        })
        .await;
    match read {
        Ok(Some((revision, payload))) => {
            if let Some(from) = from
                && matches!(payload, ClientEvent::RunViewPatch { .. })
            {
                app.hub
                    .share_patch(run_id, from, revision, Arc::new(payload.clone()));
            }
            *cursor = Some(revision);
            outbox
                .send_and_drain(crate::wire::frames::event(id, revision, payload))
                .await
        }
        Ok(None) => true,
        Err(_) => !outbox.is_closed(),
    }
}

async fn deliver_list(
    app: &Arc<Presentation>,
    outbox: &Outbox,
    id: &SubscriptionId,
    cursor: &mut Option<u64>,
) -> bool {
    let page = app
        .store
        .read(|connection| {
            let (rows, next_cursor, revision) = crate::presentation::reads::run_list_rows(
                connection,
                None,
                crate::presentation::reads::LIST_PAGE,
                None,
            )?;
            let next_cursor = next_cursor
                .map(|next| to_wire("nextCursor", next))
                .transpose()?;
            Ok((ClientEvent::RunListSnapshot { next_cursor, rows }, revision))
        })
        .await;
    let Ok((payload, revision)) = page else {
        return !outbox.is_closed();
    };
    if *cursor == Some(revision) {
        return true;
    }
    *cursor = Some(revision);
    outbox
        .send_and_drain(crate::wire::frames::event(id, revision, payload))
        .await
}

async fn deliver_session(
    app: &Arc<Presentation>,
    outbox: &Outbox,
    id: &SubscriptionId,
    session_id: &SessionId,
    cursor: &mut Option<u64>,
) -> bool {
    let session = session_id.clone();
    let view = app
        .store
        .read(move |connection| crate::presentation::reads::session_document(connection, &session))
        .await;
    let Ok(view) = view else {
        return !outbox.is_closed();
    };
    let revision = view.revision.get();
    if *cursor == Some(revision) {
        return true;
    }
    *cursor = Some(revision);
    let payload = ClientEvent::SessionMessages {
        message_count: view.message_count,
        messages: view.messages,
        next_eligible_message_id: None,
        session_id: view.session_id,
    };
    outbox
        .send_and_drain(crate::wire::frames::event(id, revision, payload))
        .await
}
