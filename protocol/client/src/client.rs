//! `WorkflowClient`: the Rust twin of the TypeScript `WorkflowClient`
//! (docs/CLIENT.md). One persistent connection, typed operations, retries
//! that adopt stored receipts, subscriptions kept as desired state and
//! restored after a reconnect, verified content and complete views.
//!
//! Invariants:
//! - One connection at a time, opened on first use; a client id fixed per
//!   instance; every transport attempt gets a new request id (a fresh
//!   connection nonce plus a counter, see [`Connection::request_id`]).
//! - A state-changing operation (`ClientOperation::STATE_CHANGING`, generated
//!   from the schema's `x-stateChanging`)
//!   carries one idempotency key for the logical command. A request whose
//!   connection drops before its response is sent again on a new connection
//!   with a NEW request id and the SAME client id, key, operation, run id,
//!   expected revision and payload, so the server adopts the stored receipt
//!   (`adopted`) instead of executing twice. Reads are simply sent again.
//!   At most [`ClientOptions::max_attempts`] attempts, with bounded
//!   backoff; `server.stop` is never retried and never starts a server.
//! - A subscription is desired state: its target and the last presentation
//!   revision the consumer accepted. After any reconnect every desired
//!   subscription is requested again from that revision (the server sends
//!   the retained patches, or one snapshot when the revision is stale); an
//!   event at or below the last revision is dropped, and a patch whose base
//!   is not the last revision re-subscribes from it. The consumer sees one
//!   local `Unavailable` when the connection is lost and one `Available`
//!   when it is back.
//! - A reconnect for subscriptions never starts a server and waits at most
//!   [`ClientOptions::reconnect_deadline`]; a request starts one (when
//!   configured) only when no server answers at the socket.
//! - The client is driven by its owner (`&mut self`): events that arrive
//!   while a request waits are kept in order for [`WorkflowClient::next_event`].

use crate::connection::{
    Connection, PACKAGE_VERSION, RequestSpec, Response, TransportRead, TransportWrite,
    closing_reason,
};
use crate::error::ClientError;
use crate::home::Home;
use crate::start::{SERVER_READY_DEADLINE, StartCommand};
use protocol::generated::types::{
    ClientEvent, CommandOutcome, ContentReference, ErrorCode, Operation, RunView,
    SubscriptionTarget,
};
use protocol::{ClientOperation, ops};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a [`Dialer`] returns: an open transport to a server (its two
/// halves, carrying NDJSON frames), or why there is none.
pub type DialFuture =
    Pin<Box<dyn Future<Output = Result<(TransportRead, TransportWrite), ClientError>> + Send>>;

/// Another way to reach a server than the socket of the client's home (for
/// example `piw --connect`'s WebSocket bridge to `piw serve`). A client
/// with a dialer never starts a server.
#[derive(Clone)]
pub struct Dialer(Arc<dyn Fn() -> DialFuture + Send + Sync>);

impl Dialer {
    /// A dialer that opens a transport each time it is called.
    pub fn new(dial: impl Fn() -> DialFuture + Send + Sync + 'static) -> Self {
        Self(Arc::new(dial))
    }

    fn dial(&self) -> DialFuture {
        (self.0)()
    }
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dialer")
    }
}

/// How a client connects, starts and retries.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// The state directory whose socket the client uses.
    pub home: Home,
    /// The client id (default: `rs-<random>`).
    pub client_id: Option<String>,
    /// How to start a server when none answers (`None`: never start one;
    /// the error is `Unavailable`).
    pub start: Option<StartCommand>,
    /// Called once before the client starts a server (the CLI says so on
    /// stderr).
    pub on_start: Option<fn()>,
    /// How long the hello and each response may take (`None`: unbounded).
    pub answer_limit: Option<Duration>,
    /// Attempts of one request across dropped connections (default 5).
    pub max_attempts: u32,
    /// The first delay before a retry or reconnect (default 100 ms); it
    /// doubles up to `max_reconnect_delay` (default 1 s).
    pub retry_interval: Duration,
    /// The longest delay between reconnect attempts.
    pub max_reconnect_delay: Duration,
    /// How long subscriptions wait for a lost server to come back (default
    /// 60 s), then `Unavailable`.
    pub reconnect_deadline: Duration,
    /// The package version announced in the hello (default: this crate's).
    pub package_version: String,
    /// Reach the server through this instead of the home's socket (`None`:
    /// the socket). `start` is not used with a dialer.
    pub dialer: Option<Dialer>,
}

impl ClientOptions {
    /// The defaults for `home`: no on-demand start, no answer limit.
    pub fn new(home: Home) -> Self {
        Self {
            home,
            client_id: None,
            start: None,
            on_start: None,
            answer_limit: None,
            max_attempts: 5,
            retry_interval: Duration::from_millis(100),
            max_reconnect_delay: Duration::from_secs(1),
            reconnect_deadline: Duration::from_secs(60),
            package_version: PACKAGE_VERSION.to_owned(),
            dialer: None,
        }
    }
}

/// Per-call options of a command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// The idempotency key of the logical command (default: a fresh one for
    /// a state-changing operation, none for a read).
    pub idempotency_key: Option<String>,
    /// `expectedRevision` of the request.
    pub expected_revision: Option<u64>,
}

/// A settled request of operation `Op`, whatever its outcome.
#[derive(Clone, Debug)]
pub struct Settled<Op: ClientOperation> {
    /// The request id of the attempt that was answered.
    pub request_id: String,
    /// The command's idempotency key (state-changing operations).
    pub idempotency_key: Option<String>,
    pub outcome: CommandOutcome,
    pub revision: Option<u64>,
    /// The typed receipt, when the response carries one.
    pub receipt: Option<Op::Receipt>,
    /// The server's error code and message, when it sent one.
    pub error: Option<(ErrorCode, String)>,
}

/// An `accepted` (or, for a retry, `adopted`) command.
#[derive(Clone, Debug)]
pub struct Accepted<Op: ClientOperation> {
    pub request_id: String,
    pub idempotency_key: Option<String>,
    /// Whether the server adopted a receipt stored by an earlier attempt.
    pub adopted: bool,
    pub revision: Option<u64>,
    pub receipt: Op::Receipt,
}

impl<Op: ClientOperation> Settled<Op> {
    fn of(response: Response, idempotency_key: Option<String>) -> Result<Self, ClientError> {
        let outcome: CommandOutcome = response
            .outcome
            .parse()
            .map_err(|_| ClientError::Lost("a response without a known outcome".into()))?;
        let receipt = response
            .receipt
            .map(serde_json::from_value::<Op::Receipt>)
            .transpose()
            .map_err(|_| ClientError::Lost("a receipt of another shape".into()))?;
        let error = response.error_code.and_then(|code| {
            code.parse()
                .ok()
                .map(|code| (code, response.error_message.unwrap_or_default()))
        });
        Ok(Self {
            request_id: response.request_id,
            idempotency_key,
            outcome,
            revision: response.revision,
            receipt,
            error,
        })
    }

    /// The accepted command, or the error kind of its outcome.
    pub fn accepted(self) -> Result<Accepted<Op>, ClientError> {
        let (code, message) = self.error.clone().unzip();
        if let Some(error) = ClientError::of_outcome(self.outcome, code, message) {
            return Err(error);
        }
        let receipt = self
            .receipt
            .ok_or_else(|| ClientError::Lost("an accepted response without its receipt".into()))?;
        Ok(Accepted {
            request_id: self.request_id,
            idempotency_key: self.idempotency_key,
            adopted: self.outcome == CommandOutcome::Adopted,
            revision: self.revision,
            receipt,
        })
    }
}

/// A subscription's local handle (stable across reconnects, unlike the
/// server's subscription id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SubscriptionHandle(u64);

/// What [`WorkflowClient::next_event`] delivers.
#[derive(Clone, Debug, PartialEq)]
pub enum Delivery {
    /// One event of a subscription at `revision`.
    Event {
        subscription: SubscriptionHandle,
        revision: u64,
        event: ClientEvent,
    },
    /// The connection was lost; the client reconnects and restores every
    /// subscription.
    Unavailable,
    /// The connection is back and every subscription was requested again
    /// from its last revision.
    Available,
}

#[derive(Clone, Debug)]
struct Desired {
    handle: SubscriptionHandle,
    target: Value,
    /// The server's id on the current connection.
    server_id: Option<String>,
    last_revision: Option<u64>,
}

/// The client.
#[derive(Debug)]
pub struct WorkflowClient {
    options: ClientOptions,
    client_id: String,
    connection: Option<Connection>,
    subscriptions: Vec<Desired>,
    next_handle: u64,
    deliveries: VecDeque<Delivery>,
    /// A local `Unavailable` was delivered and no `Available` yet.
    announced_loss: bool,
}

impl WorkflowClient {
    /// A client; it connects on first use.
    pub fn new(options: ClientOptions) -> Self {
        let client_id = options
            .client_id
            .clone()
            .unwrap_or_else(|| crate::ids::client_id("rs"));
        Self {
            options,
            client_id,
            connection: None,
            subscriptions: Vec::new(),
            next_handle: 0,
            deliveries: VecDeque::new(),
            announced_loss: false,
        }
    }

    /// This client's id.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Connects now (starting the server when configured) and returns the
    /// server's epoch.
    pub async fn connect(&mut self) -> Result<u64, ClientError> {
        Ok(self.connection(true).await?.server_epoch)
    }

    /// Sets how long the hello and each response may take from now on, on
    /// the current connection too (`None`: unbounded). A command whose
    /// answer may take long (`state backup`) connects with a limit, then
    /// waits without one while it watches the server's progress.
    pub fn set_answer_limit(&mut self, limit: Option<Duration>) {
        self.options.answer_limit = limit;
        if let Some(connection) = self.connection.as_mut() {
            connection.set_answer_limit(limit);
        }
    }

    /// Whether the client holds a connection.
    pub fn is_connected(&self) -> bool {
        self.connection.is_some()
    }

    /// Closes the connection and forgets every subscription.
    pub fn close(&mut self) {
        self.connection = None;
        self.subscriptions.clear();
        self.deliveries.clear();
    }

    /// Sends operation `Op` and returns its settled response whatever the
    /// outcome (`Err` only when there was no response).
    pub async fn request<Op: ClientOperation>(
        &mut self,
        run_id: Option<&str>,
        payload: &Op::Payload,
        options: CallOptions,
    ) -> Result<Settled<Op>, ClientError> {
        let payload = serde_json::to_value(payload)
            .map_err(|_| ClientError::Invalid(ErrorCode::SchemaInvalid))?;
        let idempotency_key = match (options.idempotency_key, Op::STATE_CHANGING) {
            (Some(key), _) => Some(key),
            (None, true) => Some(crate::ids::idempotency_key()),
            (None, false) => None,
        };
        let spec = RequestSpec {
            operation: Op::OPERATION.to_string(),
            run_id: run_id.map(str::to_owned),
            idempotency_key: idempotency_key.clone(),
            expected_revision: options.expected_revision,
            payload,
        };
        let response = self.send(&spec).await?;
        Settled::of(response, idempotency_key)
    }

    /// [`WorkflowClient::request`] that returns the accepted command or the
    /// error kind of any other outcome.
    pub async fn call<Op: ClientOperation>(
        &mut self,
        run_id: Option<&str>,
        payload: &Op::Payload,
        options: CallOptions,
    ) -> Result<Accepted<Op>, ClientError> {
        self.request::<Op>(run_id, payload, options)
            .await?
            .accepted()
    }

    /// [`WorkflowClient::call`] with the payload given as JSON: it is read
    /// as the operation's payload type first, so an invalid one is
    /// `Invalid(schemaInvalid)` and is not sent.
    pub async fn call_json<Op: ClientOperation>(
        &mut self,
        run_id: Option<&str>,
        payload: Value,
        options: CallOptions,
    ) -> Result<Accepted<Op>, ClientError> {
        let payload: Op::Payload = serde_json::from_value(payload)
            .map_err(|_| ClientError::Invalid(ErrorCode::SchemaInvalid))?;
        self.call::<Op>(run_id, &payload, options).await
    }

    /// Sends one request as it is (its idempotency key included) with the
    /// retry rule, and returns the response.
    pub async fn send(&mut self, spec: &RequestSpec) -> Result<Response, ClientError> {
        let stop = spec.operation == Operation::ServerStop.to_string();
        self.with_retry(!stop, !stop, async |connection: &mut Connection| {
            connection.request(spec).await
        })
        .await
    }

    /// The content behind `reference` of `run_id`, read in verified parts
    /// (a dropped connection reads it again from the start).
    pub async fn read_content(
        &mut self,
        run_id: &str,
        reference: &ContentReference,
    ) -> Result<Vec<u8>, ClientError> {
        let reference = serde_json::to_value(reference)
            .map_err(|_| ClientError::Invalid(ErrorCode::SchemaInvalid))?;
        self.with_retry(true, true, async |connection: &mut Connection| {
            connection.read_content(run_id, &reference).await
        })
        .await
    }

    /// The complete run view at one revision (every step and update page),
    /// as the server's JSON document.
    pub async fn complete_view_json(&mut self, run_id: &str) -> Result<Value, ClientError> {
        self.with_retry(true, true, async |connection: &mut Connection| {
            connection.complete_view(run_id).await
        })
        .await
    }

    /// [`WorkflowClient::complete_view_json`], typed.
    pub async fn complete_view(&mut self, run_id: &str) -> Result<RunView, ClientError> {
        let view = self.complete_view_json(run_id).await?;
        serde_json::from_value(view)
            .map_err(|_| ClientError::Lost("a view of another shape".into()))
    }

    /// The run view of `run_id`.
    pub async fn run_view(&mut self, run_id: &str) -> Result<RunView, ClientError> {
        let empty = protocol::generated::types::EmptyPayload {};
        Ok(self
            .call::<ops::RunView>(Some(run_id), &empty, CallOptions::default())
            .await?
            .receipt)
    }

    /// `run.why`: why the run is not progressing and who must act (the
    /// kernel's explanation, `kernel::why`).
    pub async fn run_why(
        &mut self,
        run_id: &str,
    ) -> Result<protocol::generated::types::RunWhy, ClientError> {
        let empty = protocol::generated::types::EmptyPayload {};
        Ok(self
            .call::<ops::RunWhy>(Some(run_id), &empty, CallOptions::default())
            .await?
            .receipt)
    }

    /// Subscribes to `target`, resuming after `from_revision` when given.
    /// The subscription is kept (and restored after reconnects) until
    /// [`WorkflowClient::unsubscribe`].
    pub async fn subscribe(
        &mut self,
        target: &SubscriptionTarget,
        from_revision: Option<u64>,
    ) -> Result<SubscriptionHandle, ClientError> {
        let target = serde_json::to_value(target)
            .map_err(|_| ClientError::Invalid(ErrorCode::SchemaInvalid))?;
        self.next_handle += 1;
        let handle = SubscriptionHandle(self.next_handle);
        let mut desired = Desired {
            handle,
            target,
            server_id: None,
            last_revision: from_revision,
        };
        let subscribe = desired.clone();
        desired.server_id = Some(
            self.with_retry(true, true, async |connection: &mut Connection| {
                subscribe_on(connection, &subscribe).await
            })
            .await?,
        );
        self.subscriptions.push(desired);
        Ok(handle)
    }

    /// Ends a subscription locally and removes it from the server.
    pub async fn unsubscribe(&mut self, handle: SubscriptionHandle) -> Result<(), ClientError> {
        let Some(index) = self.subscriptions.iter().position(|d| d.handle == handle) else {
            return Ok(());
        };
        let desired = self.subscriptions.remove(index);
        if let (Some(connection), Some(id)) = (self.connection.as_mut(), desired.server_id) {
            match unsubscribe_on(connection, &id).await {
                // A lost connection dropped the server's subscription too.
                Err(ClientError::Lost(_)) => self.connection = None,
                other => other?,
            }
        }
        Ok(())
    }

    /// The last revision the consumer accepted of a subscription.
    pub fn last_revision(&self, handle: SubscriptionHandle) -> Option<u64> {
        self.subscriptions
            .iter()
            .find(|d| d.handle == handle)
            .and_then(|d| d.last_revision)
    }

    /// The next delivery of any subscription, waiting as long as it takes
    /// (a lost connection is restored within the reconnect deadline).
    pub async fn next_event(&mut self) -> Result<Delivery, ClientError> {
        loop {
            if let Some(delivery) = self.deliveries.pop_front() {
                return Ok(delivery);
            }
            if self.subscriptions.is_empty() {
                return Err(ClientError::NothingSubscribed);
            }
            let Some(connection) = self.connection.as_mut() else {
                self.reconnect_for_events().await?;
                continue;
            };
            let frame = match connection.next_event().await {
                Ok(frame) if closing_reason(&frame).is_none() => frame,
                // The server closes this connection (it is stopping): the
                // subscriptions wait for the next server.
                Ok(_) | Err(ClientError::Lost(_)) => {
                    self.lose();
                    continue;
                }
                Err(error) => return Err(error),
            };
            if let Some(delivery) = self.route(&frame).await? {
                return Ok(delivery);
            }
        }
    }

    /// Routes one event frame: `None` when it is dropped (another or an
    /// ended subscription, a duplicate, or a gap that re-subscribed).
    async fn route(&mut self, frame: &Value) -> Result<Option<Delivery>, ClientError> {
        let server_id = frame["subscriptionId"].as_str();
        let Some(index) = self
            .subscriptions
            .iter()
            .position(|d| d.server_id.is_some() && d.server_id.as_deref() == server_id)
        else {
            return Ok(None);
        };
        let revision = frame["revision"].as_u64().unwrap_or(0);
        let last = self.subscriptions[index].last_revision;
        if last.is_some_and(|last| revision <= last) {
            return Ok(None);
        }
        let event: ClientEvent = serde_json::from_value(frame["event"].clone())
            .map_err(|_| ClientError::Lost("an event of another shape".into()))?;
        if let ClientEvent::RunViewPatch { base_revision, .. } = &event
            && Some(base_revision.get()) != last
        {
            // A gap: ask again from what the consumer holds.
            self.resubscribe(index).await?;
            return Ok(None);
        }
        let desired = &mut self.subscriptions[index];
        desired.last_revision = Some(revision);
        Ok(Some(Delivery::Event {
            subscription: desired.handle,
            revision,
            event,
        }))
    }

    async fn resubscribe(&mut self, index: usize) -> Result<(), ClientError> {
        let desired = self.subscriptions[index].clone();
        let Some(connection) = self.connection.as_mut() else {
            return Ok(());
        };
        let renewed = async {
            if let Some(id) = &desired.server_id {
                unsubscribe_on(connection, id).await?;
            }
            subscribe_on(connection, &desired).await
        }
        .await;
        match renewed {
            Ok(id) => {
                self.subscriptions[index].server_id = Some(id);
                Ok(())
            }
            Err(ClientError::Lost(_)) => {
                self.lose();
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// Forgets a lost connection; subscribers hear of it once.
    fn lose(&mut self) {
        self.connection = None;
        for desired in &mut self.subscriptions {
            desired.server_id = None;
        }
        if !self.subscriptions.is_empty() && !self.announced_loss {
            self.announced_loss = true;
            self.deliveries.push_back(Delivery::Unavailable);
        }
    }

    /// Reconnects (never starting a server) within the reconnect deadline.
    async fn reconnect_for_events(&mut self) -> Result<(), ClientError> {
        let deadline = Instant::now() + self.options.reconnect_deadline;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.connection(false).await {
                Ok(_) => return Ok(()),
                Err(ClientError::Unavailable | ClientError::Lost(_)) => {
                    self.connection = None;
                }
                Err(error) => return Err(error),
            }
            if Instant::now() >= deadline {
                return Err(ClientError::Unavailable);
            }
            tokio::time::sleep(self.backoff(attempt)).await;
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(10);
        (self.options.retry_interval * factor).min(self.options.max_reconnect_delay)
    }

    /// Runs `exchange` on the connection; when the connection drops, runs it
    /// again on a new one (when `retry`), at most `max_attempts` times.
    async fn with_retry<T>(
        &mut self,
        retry: bool,
        may_start: bool,
        mut exchange: impl AsyncFnMut(&mut Connection) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = match self.connection(may_start).await {
                Ok(connection) => exchange(connection).await,
                Err(error) => Err(error),
            };
            match outcome {
                // After a loss the server may be restarting: an absent
                // server is retried like a dropped connection.
                Err(error @ (ClientError::Lost(_) | ClientError::Unavailable))
                    if retry && attempt < self.options.max_attempts =>
                {
                    if matches!(error, ClientError::Unavailable) && attempt == 1 {
                        return Err(error);
                    }
                    self.lose();
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
                Err(error @ ClientError::Lost(_)) => {
                    self.lose();
                    return Err(error);
                }
                other => return other,
            }
        }
    }

    /// The current connection, opened (and its subscriptions restored) when
    /// there is none.
    async fn connection(&mut self, may_start: bool) -> Result<&mut Connection, ClientError> {
        if self.connection.is_none() {
            let mut connection = self.open(may_start).await?;
            for desired in &mut self.subscriptions {
                desired.server_id = Some(subscribe_on(&mut connection, desired).await?);
            }
            self.connection = Some(connection);
            if self.announced_loss {
                self.announced_loss = false;
                self.deliveries.push_back(Delivery::Available);
            }
        }
        Ok(self
            .connection
            .as_mut()
            .expect("a connection was just opened"))
    }

    async fn open(&self, may_start: bool) -> Result<Connection, ClientError> {
        if let Some(dialer) = &self.options.dialer {
            let dialed = async {
                let (read, write) = dialer.dial().await?;
                Connection::handshake(read, write, &self.client_id, &self.options.package_version)
                    .await
            };
            return Connection::bounded(self.options.answer_limit, dialed).await;
        }
        let socket = self.options.home.socket_path();
        let connect = || {
            Connection::connect_bounded(
                &socket,
                &self.client_id,
                &self.options.package_version,
                self.options.answer_limit,
            )
        };
        let start = match (connect().await, &self.options.start) {
            (Err(ClientError::Unavailable), Some(start)) if may_start => start.clone(),
            (connected, _) => return connected,
        };
        if let Some(announce) = self.options.on_start {
            announce();
        }
        let home = self.options.home.clone();
        let started = tokio::task::spawn_blocking(move || start.spawn(&home))
            .await
            .map_err(|_| ClientError::StartFailed("could not start the server; retry".into()))?;
        match started {
            Ok(_) => connect().await,
            // Another client is starting it: wait for it to answer.
            Err(reason) if reason.starts_with("a pi-workflows server is already running") => {
                let deadline = Instant::now() + SERVER_READY_DEADLINE;
                loop {
                    match connect().await {
                        Err(ClientError::Unavailable) if Instant::now() < deadline => {
                            tokio::time::sleep(self.options.retry_interval).await;
                        }
                        other => return other,
                    }
                }
            }
            Err(reason) => Err(ClientError::StartFailed(reason)),
        }
    }
}

/// Subscribes `desired` on `connection` and returns the server's id.
async fn subscribe_on(
    connection: &mut Connection,
    desired: &Desired,
) -> Result<String, ClientError> {
    let response = connection
        .subscribe(desired.target.clone(), desired.last_revision)
        .await?;
    if let Some(error) = response.error() {
        return Err(error);
    }
    response
        .receipt
        .as_ref()
        .and_then(|receipt| receipt["subscriptionId"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| ClientError::Lost("a subscription without its id".into()))
}

async fn unsubscribe_on(connection: &mut Connection, id: &str) -> Result<(), ClientError> {
    let response = connection
        .request(&RequestSpec::read(
            "unsubscribe",
            None,
            json!({ "subscriptionId": id }),
        ))
        .await?;
    match response.error() {
        // The server already ended it (its run was deleted, or a restart).
        Some(ClientError::NotFound { .. }) | None => Ok(()),
        Some(error) => Err(error),
    }
}
