//! The live source: piw's [`Source`] on the Rust client library
//! (`pi-workflows-client`), the one way piw reaches a server, through the
//! home's Unix socket or through `piw serve` (`--connect`, a
//! [`Dialer`](pi_workflows_client::Dialer) from [`crate::connect`]).
//!
//! Invariants:
//! - One worker thread owns one [`WorkflowClient`]; the screens talk to it
//!   only through [`Command`]s and [`SourceEvent`]s, so a slow server never
//!   blocks a redraw.
//! - What it delivers is the server's: the run list is every row of one
//!   `runList` subscription event (further rows read with `runs.list` from
//!   that event's cursor); a run view is the subscription's snapshot folded
//!   with its patches by the client's [`LiveView`] (a patch on another base
//!   is never shown: the client re-subscribes); a frame that cannot be
//!   folded into a run view (a patch that does not apply, a document that is
//!   no run view) is told to piw as a stale view, never dropped, and the
//!   run is subscribed again from nothing for a fresh snapshot; pages are `view.page`
//!   answers; content is the client's verified bytes; resources are one
//!   `resource.list` or `resource.get` answer per command (reads only; piw
//!   asks again to refresh, nothing is subscribed).
//! - Desired state survives any loss: the run list and the watched run are
//!   subscribed again (the run from the revision piw holds) when the
//!   connection comes back, after the client's own restore or, when that
//!   gave up, by this worker with backoff. piw never starts a server other
//!   than through the client's on-demand start (the installed
//!   `pi-workflows`), and never over `--connect`.
//! - A control is sent once per confirmed action, with that action's
//!   idempotency key; the client's retries reuse the key, so the server
//!   adopts the stored receipt.
//! - Every failure the user sees is one line: the client's own message (an
//!   absent server says how to start it; another version says to install
//!   matching packages). Nothing here names a database.

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use pi_workflows_client::{
    CallOptions, ClientError, ClientOptions, Delivery, LiveError, LiveView, RequestSpec,
    SubscriptionHandle, WorkflowClient, ops,
};
use protocol::generated::types::{
    ClientEvent, ContentReference, PageCollection, ResourceGetPayload, ResourceListPayload,
    RunListRow, RunView, RunsListPayload, SubscriptionTarget, ViewPagePayload,
};
use tokio::sync::mpsc;

use crate::source::{Availability, Command, ControlRequest, Source, SourceEvent};

/// Items asked for per page of a run-view collection.
const PAGE_LIMIT: u64 = 200;
/// Rows asked for per `runs.list` page.
const RUN_PAGE_LIMIT: u64 = 1000;
/// The longest wait between two reconnect attempts of the worker.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The live source.
#[derive(Debug)]
pub struct LiveSource {
    commands: mpsc::UnboundedSender<Command>,
    events: std_mpsc::Receiver<SourceEvent>,
    /// Whether piw was told that the worker stopped.
    worker_gone: bool,
}

impl LiveSource {
    /// Starts the worker with these client options. `unreachable` is the
    /// line shown while no server answers (the client's own line for the
    /// home's socket; the relay's for `--connect`). `wake` is called after
    /// every event (the terminal loop redraws).
    pub fn start(
        options: ClientOptions,
        unreachable: Option<String>,
        wake: impl Fn() + Send + 'static,
    ) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let (sender, events) = std_mpsc::channel();
        std::thread::Builder::new()
            .name("piw-source".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime");
                let worker = Worker {
                    client: WorkflowClient::new(options),
                    unreachable,
                    out: Box::new(move |event| {
                        let sent = sender.send(event).is_ok();
                        wake();
                        sent
                    }),
                    runs: None,
                    run: None,
                    connected: false,
                };
                runtime.block_on(worker.run(receiver));
            })
            .expect("the source thread starts");
        Self {
            commands,
            events,
            worker_gone: false,
        }
    }
}

impl Source for LiveSource {
    fn send(&mut self, command: Command) {
        // The worker ends only with the process; a failed send means it
        // stopped, which `try_next` tells piw (once).
        let _ = self.commands.send(command);
    }

    fn try_next(&mut self) -> Option<SourceEvent> {
        match self.events.try_recv() {
            Ok(event) => Some(event),
            Err(std_mpsc::TryRecvError::Empty) => None,
            // The worker stopped (it ends only with piw, so it failed):
            // nothing on screen is current any more. Said once.
            Err(std_mpsc::TryRecvError::Disconnected) => {
                (!std::mem::replace(&mut self.worker_gone, true)).then(|| {
                    SourceEvent::Availability(Availability::Unavailable(WORKER_GONE.into()))
                })
            }
        }
    }
}

/// The line shown once the worker stopped.
const WORKER_GONE: &str =
    "piw's connection worker stopped; nothing shown is current: quit (q) and start piw again";

/// Folds one event of the watched run's subscription into `live` and types
/// the result; `Err` says in a few words why there is no view to show (the
/// event is not a run-view event, its patch does not apply to the view held,
/// or the folded document is not a run view). `live` is unchanged by a
/// patch that does not apply.
fn fold(live: &mut LiveView, event: &ClientEvent) -> Result<Box<RunView>, &'static str> {
    live.apply_event(event).map_err(|error| match error {
        LiveError::BaseMismatch { .. } => "a view change skipped a revision",
        LiveError::BadOperation(_) => "a view change did not apply",
        LiveError::NotRunView => "the run sent an event that is no view",
    })?;
    live.view()
        // Typed straight from the folded document (no copy of it).
        .map(<RunView as serde::Deserialize>::deserialize)
        .and_then(Result::ok)
        .map(Box::new)
        .ok_or("the server sent a view piw cannot read")
}

/// The watched run.
struct Watched {
    run_id: String,
    handle: Option<SubscriptionHandle>,
    live: LiveView,
}

struct Worker {
    client: WorkflowClient,
    unreachable: Option<String>,
    /// Delivers one event; `false` once piw is gone.
    out: Box<dyn Fn(SourceEvent) -> bool + Send>,
    runs: Option<SubscriptionHandle>,
    run: Option<Watched>,
    connected: bool,
}

/// What the worker does next.
enum Next {
    Command(Option<Command>),
    Delivery(Result<Delivery, ClientError>),
}

impl Worker {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut watch_runs = false;
        let mut backoff = Duration::from_millis(100);
        loop {
            // (Re)establish the desired subscriptions.
            if watch_runs && (self.runs.is_none() || self.needs_run_subscription()) {
                match self.establish().await {
                    Ok(()) => backoff = Duration::from_millis(100),
                    Err(error) => {
                        if !self.tell_failure(&error) {
                            return;
                        }
                        // Wait, still taking commands (a quit ends us).
                        match tokio::time::timeout(backoff, commands.recv()).await {
                            Ok(None) => return,
                            Ok(Some(command)) => {
                                if matches!(command, Command::WatchRuns) {
                                    watch_runs = true;
                                }
                                self.command(command).await;
                            }
                            Err(_) => {}
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                }
            }
            let subscribed =
                self.runs.is_some() || self.run.as_ref().is_some_and(|w| w.handle.is_some());
            let next = if subscribed {
                tokio::select! {
                    biased;
                    command = commands.recv() => Next::Command(command),
                    delivery = self.client.next_event() => Next::Delivery(delivery),
                }
            } else {
                Next::Command(commands.recv().await)
            };
            match next {
                Next::Command(None) => return,
                Next::Command(Some(command)) => {
                    if matches!(command, Command::WatchRuns) {
                        watch_runs = true;
                        continue;
                    }
                    self.command(command).await;
                }
                Next::Delivery(Ok(delivery)) => {
                    if !self.deliver(delivery).await {
                        return;
                    }
                }
                Next::Delivery(Err(error)) => {
                    // The client gave up restoring: start over with backoff.
                    self.client.close();
                    self.runs = None;
                    if let Some(watched) = self.run.as_mut() {
                        watched.handle = None;
                    }
                    if !self.tell_failure(&error) {
                        return;
                    }
                }
            }
        }
    }

    fn needs_run_subscription(&self) -> bool {
        self.run.as_ref().is_some_and(|w| w.handle.is_none())
    }

    /// Connects and subscribes the run list and the watched run.
    async fn establish(&mut self) -> Result<(), ClientError> {
        self.client.connect().await?;
        if !self.connected {
            self.connected = true;
            (self.out)(SourceEvent::Availability(Availability::Available));
        }
        if self.runs.is_none() {
            self.runs = Some(
                self.client
                    .subscribe(&SubscriptionTarget::RunList, None)
                    .await?,
            );
        }
        self.subscribe_run().await
    }

    /// Subscribes the watched run (from the revision piw holds).
    async fn subscribe_run(&mut self) -> Result<(), ClientError> {
        let Some(watched) = self.run.as_mut().filter(|w| w.handle.is_none()) else {
            return Ok(());
        };
        let target = SubscriptionTarget::Run {
            run_id: watched
                .run_id
                .parse()
                .map_err(|_| ClientError::Invalid(protocol::ErrorCode::SchemaInvalid))?,
        };
        match self
            .client
            .subscribe(&target, watched.live.revision())
            .await
        {
            Ok(handle) => {
                watched.handle = Some(handle);
                Ok(())
            }
            Err(
                error @ (ClientError::NotFound { .. }
                | ClientError::Refused { .. }
                | ClientError::Invalid(_)),
            ) => {
                let run_id = watched.run_id.clone();
                self.run = None;
                (self.out)(SourceEvent::RunMissing {
                    run_id,
                    line: error.to_string(),
                });
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Tells piw why there is no server; `false` once piw is gone.
    fn tell_failure(&mut self, error: &ClientError) -> bool {
        self.connected = false;
        let availability = match error {
            ClientError::VersionMismatch(line) => Availability::VersionMismatch(line.clone()),
            ClientError::Unavailable | ClientError::Lost(_) => Availability::Unavailable(
                self.unreachable
                    .clone()
                    .unwrap_or_else(|| error.to_string()),
            ),
            other => Availability::Unavailable(other.to_string()),
        };
        (self.out)(SourceEvent::Availability(availability))
    }

    async fn deliver(&mut self, delivery: Delivery) -> bool {
        match delivery {
            Delivery::Unavailable => {
                self.connected = false;
                let line = self
                    .unreachable
                    .clone()
                    .unwrap_or_else(|| ClientError::Unavailable.to_string());
                (self.out)(SourceEvent::Availability(Availability::Unavailable(
                    format!("{line} (reconnecting…)"),
                )))
            }
            Delivery::Available => {
                self.connected = true;
                (self.out)(SourceEvent::Availability(Availability::Available))
            }
            Delivery::Event {
                subscription,
                revision,
                event,
            } => {
                if Some(subscription) == self.runs {
                    return self.run_list(revision, event).await;
                }
                let Some(watched) = self.run.as_mut().filter(|w| w.handle == Some(subscription))
                else {
                    return true;
                };
                match fold(&mut watched.live, &event) {
                    Ok(view) => (self.out)(SourceEvent::RunView(view)),
                    Err(what) => self.stale(what).await,
                }
            }
        }
    }

    /// The watched run's view could not be folded: tells piw that the view
    /// it holds is stale and subscribes again from nothing (the server
    /// answers with a fresh snapshot); `false` once piw is gone.
    async fn stale(&mut self, what: &str) -> bool {
        let Some(watched) = self.run.as_mut() else {
            return true;
        };
        let run_id = watched.run_id.clone();
        let revision = watched
            .live
            .revision()
            .map_or_else(String::new, |revision| format!(" (revision {revision})"));
        let handle = watched.handle.take();
        watched.live = LiveView::new();
        if let Some(handle) = handle {
            // A lost connection already ended the server's subscription;
            // the client forgot this one either way.
            let _ = self.client.unsubscribe(handle).await;
        }
        let line = format!(
            "{what}{revision}; asking for a fresh one (if this repeats, install matching \
             pi-workflows and piw versions)"
        );
        if !(self.out)(SourceEvent::RunViewStale { run_id, line }) {
            return false;
        }
        match self.subscribe_run().await {
            Ok(()) => true,
            Err(error) => self.tell_failure(&error),
        }
    }

    /// One run-list event: the rows, and the rest of them when the event
    /// was bounded.
    async fn run_list(&mut self, revision: u64, event: ClientEvent) -> bool {
        let ClientEvent::RunListSnapshot {
            mut rows,
            next_cursor,
        } = event
        else {
            return true;
        };
        let mut cursor = next_cursor;
        while let Some(at) = cursor.take() {
            match self.runs_page(Some(at)).await {
                Ok((page, next)) => {
                    rows.extend(page);
                    cursor = next;
                }
                Err(error) => {
                    (self.out)(SourceEvent::Availability(Availability::Unavailable(
                        error.to_string(),
                    )));
                    break;
                }
            }
        }
        (self.out)(SourceEvent::RunList { revision, rows })
    }

    async fn runs_page(
        &mut self,
        cursor: Option<protocol::generated::types::Cursor>,
    ) -> Result<(Vec<RunListRow>, Option<protocol::generated::types::Cursor>), ClientError> {
        let payload = RunsListPayload {
            cursor,
            limit: Some(
                RUN_PAGE_LIMIT
                    .try_into()
                    .map_err(|_| ClientError::Invalid(protocol::ErrorCode::SchemaInvalid))?,
            ),
            max_bytes: None,
        };
        let page = self
            .client
            .call::<ops::RunsList>(None, &payload, CallOptions::default())
            .await?
            .receipt;
        Ok((page.rows, page.next_cursor))
    }

    async fn command(&mut self, command: Command) {
        match command {
            Command::WatchRuns => {}
            Command::WatchRun { run_id } => {
                if self.run.as_ref().is_some_and(|w| w.run_id == run_id) {
                    return;
                }
                self.unwatch().await;
                self.run = Some(Watched {
                    run_id,
                    handle: None,
                    live: LiveView::new(),
                });
                if self.connected
                    && let Err(error) = self.subscribe_run().await
                {
                    self.tell_failure(&error);
                }
            }
            Command::UnwatchRun { run_id } => {
                if self.run.as_ref().is_some_and(|w| w.run_id == run_id) {
                    self.unwatch().await;
                }
            }
            Command::FetchPage {
                run_id,
                collection,
                cursor,
                revision,
            } => self.page(run_id, collection, cursor, revision).await,
            Command::FetchContent { run_id, reference } => self.content(run_id, reference).await,
            Command::Control(request) => self.control(request).await,
            Command::ListResources => self.resources().await,
            Command::GetResource { controller, key } => self.resource(controller, key).await,
        }
    }

    /// `resource.list` once: the rows or the client's one line.
    async fn resources(&mut self) {
        let answer = self
            .client
            .call::<ops::ResourceList>(
                None,
                &ResourceListPayload { controller: None },
                CallOptions::default(),
            )
            .await;
        (self.out)(SourceEvent::ResourceList(
            answer
                .map(|page| page.receipt.resources.into_inner())
                .map_err(|error| error.to_string()),
        ));
    }

    /// `resource.get` once for this resource: its view or the client's one
    /// line (a name the protocol refuses is said so without asking).
    async fn resource(&mut self, controller: String, key: String) {
        let payload = serde_json::from_value::<ResourceGetPayload>(serde_json::json!({
            "controller": controller, "key": key,
        }));
        let result = match payload {
            Ok(payload) => self
                .client
                .call::<ops::ResourceGet>(None, &payload, CallOptions::default())
                .await
                .map(|view| Box::new(view.receipt))
                .map_err(|error| error.to_string()),
            Err(_) => Err("this resource cannot be asked for (its name is not valid)".to_owned()),
        };
        (self.out)(SourceEvent::Resource {
            controller,
            key,
            result,
        });
    }

    async fn unwatch(&mut self) {
        if let Some(Watched {
            handle: Some(handle),
            ..
        }) = self.run.take()
        {
            // A lost connection already ended the server's subscription.
            let _ = self.client.unsubscribe(handle).await;
        }
    }

    async fn page(
        &mut self,
        run_id: String,
        collection: PageCollection,
        cursor: Option<String>,
        revision: u64,
    ) {
        let payload = serde_json::json!({
            "collection": collection, "revision": revision, "limit": PAGE_LIMIT,
            "maxBytes": pi_workflows_client::MAX_PAGE_BYTES, "cursor": cursor,
        });
        let payload = match serde_json::from_value::<ViewPagePayload>(payload) {
            Ok(payload) => payload,
            Err(_) => {
                (self.out)(SourceEvent::PageFailed {
                    run_id,
                    collection,
                    line: "this page cannot be asked for (its cursor is not valid)".into(),
                });
                return;
            }
        };
        let answer = self
            .client
            .call::<ops::ViewPage>(Some(&run_id), &payload, CallOptions::default())
            .await;
        (self.out)(match answer {
            Ok(page) => SourceEvent::Page {
                run_id,
                page: page.receipt,
            },
            Err(error) => SourceEvent::PageFailed {
                run_id,
                collection,
                line: error.to_string(),
            },
        });
    }

    async fn content(&mut self, run_id: String, reference: ContentReference) {
        let result = self
            .client
            .read_content(&run_id, &reference)
            .await
            .map_err(|error| error.to_string());
        (self.out)(SourceEvent::Content {
            run_id,
            reference,
            result,
        });
    }

    async fn control(&mut self, request: ControlRequest) {
        let spec = RequestSpec {
            operation: request.operation.to_owned(),
            run_id: Some(request.run_id.clone()),
            idempotency_key: Some(request.idempotency_key.clone()),
            // The view's revision is its presentation revision, not the run
            // revision the server compares `expectedRevision` with (a view
            // moves on without the run, e.g. when a runner exits), so a
            // control is sent without one, like the CLI's.
            expected_revision: None,
            payload: request.payload.clone(),
        };
        let (outcome, line) = match self.client.send(&spec).await {
            Ok(response) => {
                let line = match (response.error(), response.revision) {
                    (Some(error), _) => error.to_string(),
                    (None, Some(revision)) => format!("the server is at revision {revision}"),
                    (None, None) => "the server took it".to_owned(),
                };
                (response.outcome, line)
            }
            Err(error) => ("unsent".to_owned(), error.to_string()),
        };
        (self.out)(SourceEvent::ControlResult {
            idempotency_key: request.idempotency_key,
            control: request.control,
            outcome,
            line,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_worker_is_told_once_as_unavailable() {
        let (commands, receiver) = mpsc::unbounded_channel();
        let (sender, events) = std_mpsc::channel();
        let mut source = LiveSource {
            commands,
            events,
            worker_gone: false,
        };
        sender
            .send(SourceEvent::Availability(Availability::Available))
            .unwrap();
        // The worker ends (a panic drops its sender and its receiver).
        drop((sender, receiver));
        source.send(Command::WatchRuns);
        assert_eq!(
            source.try_next(),
            Some(SourceEvent::Availability(Availability::Available))
        );
        let told = source.try_next();
        assert!(
            matches!(&told, Some(SourceEvent::Availability(Availability::Unavailable(line)))
                if line.contains("stopped") && line.contains("start piw again")),
            "{told:?}"
        );
        assert_eq!(source.try_next(), None);
    }
}
