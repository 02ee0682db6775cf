//! One connection to the server socket speaking `pi-workflows.client.v1`,
//! at the level of frames: hello, requests as [`RequestSpec`]s, responses
//! and events as JSON values. It does not reconnect; [`crate::WorkflowClient`]
//! builds retries, typed operations and restored subscriptions on it, and
//! the server's black-box tests use it directly (including to send
//! malformed frames).
//!
//! Invariants:
//! - Every frame it sends is canonical and validated by the protocol crate
//!   before it is written; every frame it reads is decoded and validated
//!   the same way.
//! - A request id is never reused: each connection has its own random
//!   nonce, so two connections of one client id never send the same id.
//! - A connection made with [`Connection::connect_within`] waits at most
//!   its limit for the hello and for each response
//!   (`ClientError::TimedOut` names what it waited for); waiting for
//!   subscription events is never bounded.
//! - Events that arrive while a request waits for its response are kept, in
//!   order, for [`Connection::next_event`].

use crate::error::{ClientError, Waited};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_stream::StreamExt;
use tokio_util::codec::FramedRead;

/// The package version this client speaks (the server must run the same).
pub const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The reading half of a transport: the server's NDJSON frames.
pub type TransportRead = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a transport: this client's NDJSON frames.
pub type TransportWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// One connection.
pub struct Connection {
    frames: FramedRead<TransportRead, protocol::FrameCodec>,
    write: TransportWrite,
    client_id: String,
    /// The server's epoch from its hello.
    pub server_epoch: u64,
    /// The server's package version from its hello.
    pub server_version: String,
    next_request: u64,
    /// Random per connection, so request ids never repeat across reconnects.
    connection_nonce: String,
    /// Events that arrived while a request waited for its response.
    pending_events: VecDeque<Value>,
    /// How long the hello and each response may take (`None`: unbounded).
    answer_limit: Option<Duration>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("client_id", &self.client_id)
            .field("server_epoch", &self.server_epoch)
            .field("server_version", &self.server_version)
            .finish_non_exhaustive()
    }
}

/// A settled request.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    pub request_id: String,
    pub outcome: String,
    pub revision: Option<u64>,
    pub receipt: Option<Value>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// The whole response frame.
    pub frame: Value,
}

impl Response {
    /// Whether the server settled the request as `accepted` or `adopted`.
    pub fn is_accepted(&self) -> bool {
        matches!(self.outcome.as_str(), "accepted" | "adopted")
    }

    /// The error of a response that is not accepted (`None` when it is).
    pub fn error(&self) -> Option<ClientError> {
        let outcome = self.outcome.parse().ok()?;
        ClientError::of_outcome(
            outcome,
            self.error_code
                .as_deref()
                .and_then(|code| code.parse().ok()),
            self.error_message.clone(),
        )
    }
}

/// What to send (everything but the request id, which each attempt makes new).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestSpec {
    pub operation: String,
    pub run_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub expected_revision: Option<u64>,
    pub payload: Value,
}

impl RequestSpec {
    /// A read (no idempotency key).
    pub fn read(operation: &str, run_id: Option<&str>, payload: Value) -> Self {
        Self {
            operation: operation.into(),
            run_id: run_id.map(str::to_owned),
            idempotency_key: None,
            expected_revision: None,
            payload,
        }
    }

    /// A state-changing command with a fresh idempotency key.
    pub fn command(operation: &str, run_id: Option<&str>, payload: Value) -> Self {
        Self {
            idempotency_key: Some(crate::ids::idempotency_key()),
            ..Self::read(operation, run_id, payload)
        }
    }
}

impl Connection {
    /// Connects to the socket at `path` and exchanges hellos, waiting as
    /// long as the server takes.
    pub async fn connect(path: &Path, client_id: &str) -> Result<Self, ClientError> {
        Self::connect_as_version(path, client_id, PACKAGE_VERSION).await
    }

    /// [`Connection::connect`] announcing `package_version` in the hello
    /// (tests of the version check).
    pub async fn connect_as_version(
        path: &Path,
        client_id: &str,
        package_version: &str,
    ) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path).await.map_err(|error| {
            if error.kind() == std::io::ErrorKind::WouldBlock {
                // The listen queue is full: a server runs but does not accept.
                ClientError::ConnectionRefused(
                    "its queue of new connections is full; retry later".into(),
                )
            } else {
                ClientError::Unavailable
            }
        })?;
        let (read, write) = stream.into_split();
        Self::handshake(Box::new(read), Box::new(write), client_id, package_version).await
    }

    /// Exchanges hellos over an already open transport (for example `piw
    /// --connect`'s WebSocket bridge), waiting as long as the server takes.
    pub async fn handshake(
        read: TransportRead,
        write: TransportWrite,
        client_id: &str,
        package_version: &str,
    ) -> Result<Self, ClientError> {
        let mut connection = Self {
            frames: FramedRead::new(read, protocol::FrameCodec::new()),
            write,
            client_id: client_id.to_owned(),
            server_epoch: 0,
            server_version: String::new(),
            next_request: 0,
            connection_nonce: crate::ids::random_hex::<6>(),
            pending_events: VecDeque::new(),
            answer_limit: None,
        };
        let hello = json!({
            "schema": "pi-workflows.client.v1",
            "type": "hello",
            "role": "client",
            "clientId": client_id,
            "protocolVersion": PROTOCOL_VERSION,
            "packageVersion": package_version,
        });
        // A server that refuses the connection writes its reason and closes
        // without reading: the reason is read even when the hello could
        // not be written.
        let sent = connection.send(&hello).await;
        let server_hello = connection
            .receive_checked(|bytes| another_protocol(bytes, package_version))
            .await;
        if let Some(reason) = server_hello.as_ref().ok().and_then(closing_reason) {
            return Err(ClientError::ConnectionRefused(reason));
        }
        sent?;
        let server_hello = server_hello?;
        if server_hello.get("type").and_then(Value::as_str) != Some("hello") {
            return Err(ClientError::Lost("no server hello".into()));
        }
        let server_version = server_hello
            .get("packageVersion")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        if server_version != package_version {
            return Err(ClientError::VersionMismatch(format!(
                "the pi-workflows server is version {server_version} but this command line is {package_version}; install matching pi-workflows packages (or stop the other server with its own `pi-workflows server stop`)"
            )));
        }
        connection.server_version = server_version.to_owned();
        connection.server_epoch = server_hello
            .get("serverEpoch")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Ok(connection)
    }

    /// Connects like [`Connection::connect`], but waits at most `limit` for
    /// the hello and, afterwards, for each response.
    pub async fn connect_within(
        path: &Path,
        client_id: &str,
        limit: Duration,
    ) -> Result<Self, ClientError> {
        Self::connect_bounded(path, client_id, PACKAGE_VERSION, Some(limit)).await
    }

    /// Connects with an optional answer limit and package version.
    pub(crate) async fn connect_bounded(
        path: &Path,
        client_id: &str,
        package_version: &str,
        limit: Option<Duration>,
    ) -> Result<Self, ClientError> {
        Self::bounded(
            limit,
            Self::connect_as_version(path, client_id, package_version),
        )
        .await
    }

    /// Waits at most `limit` (when given) for `connecting`, and gives the
    /// connection that limit for each response.
    pub(crate) async fn bounded(
        limit: Option<Duration>,
        connecting: impl Future<Output = Result<Self, ClientError>>,
    ) -> Result<Self, ClientError> {
        let Some(limit) = limit else {
            return connecting.await;
        };
        match tokio::time::timeout(limit, connecting).await {
            Ok(connected) => connected.map(|mut connection| {
                connection.answer_limit = Some(limit);
                connection
            }),
            Err(_) => Err(ClientError::TimedOut {
                waited_for: Waited::Hello,
                limit,
            }),
        }
    }

    /// Sets how long each response may take (`None`: unbounded).
    pub fn set_answer_limit(&mut self, limit: Option<Duration>) {
        self.answer_limit = limit;
    }

    /// Sends one frame (validated first).
    pub async fn send(&mut self, value: &Value) -> Result<(), ClientError> {
        let mut bytes =
            protocol::canonicalize(value).map_err(|error| ClientError::Invalid(error.code()))?;
        bytes.push(b'\n');
        protocol::decode_client_frame(&bytes)
            .map_err(|error| ClientError::Invalid(error.code()))?;
        self.write_bytes(&bytes).await
    }

    /// Writes raw bytes (tests of malformed frames).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.write_bytes(bytes).await
    }

    async fn write_bytes(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.write
            .write_all(bytes)
            .await
            .map_err(|_| ClientError::Lost("write failed".into()))
    }

    /// Reads the next frame.
    pub async fn receive(&mut self) -> Result<Value, ClientError> {
        self.receive_checked(|_| None).await
    }

    /// Like [`Connection::receive`], but a frame that does not decode is
    /// first given to `undecoded`, which may name the error.
    async fn receive_checked(
        &mut self,
        undecoded: impl FnOnce(&[u8]) -> Option<ClientError>,
    ) -> Result<Value, ClientError> {
        match self.frames.next().await {
            Some(Ok(bytes)) => {
                let frame = protocol::decode_client_frame(&bytes).map_err(|error| {
                    undecoded(&bytes).unwrap_or_else(|| ClientError::Lost(error.to_string()))
                })?;
                let value = serde_json::to_value(&frame.message)
                    .map_err(|_| ClientError::Lost("decode".into()))?;
                if value.get("type").and_then(Value::as_str) == Some("response")
                    && value.pointer("/error/code").and_then(Value::as_str)
                        == Some("packageVersionMismatch")
                {
                    let message = value
                        .pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    return Err(ClientError::VersionMismatch(message.to_owned()));
                }
                Ok(value)
            }
            Some(Err(_)) => Err(ClientError::Lost("invalid frame".into())),
            None => Err(ClientError::Lost("the server closed the connection".into())),
        }
    }

    /// This connection's client id (stable across a client's connections).
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// A fresh request id, unique across connections of the same client id
    /// (request ids are remembered by the server with their payloads).
    pub fn request_id(&mut self) -> String {
        self.next_request += 1;
        format!(
            "{}-{}-r{}",
            self.client_id, self.connection_nonce, self.next_request
        )
    }

    /// Sends a request with a fresh request id and waits for its response
    /// (at most the connection's answer limit, when it has one).
    pub async fn request(&mut self, request: &RequestSpec) -> Result<Response, ClientError> {
        let request_id = self.request_id();
        self.request_with_id(request, &request_id).await
    }

    /// [`Connection::request`] with an explicit `request_id` (a test that
    /// repeats a request id, or sends one from another connection).
    pub async fn request_with_id(
        &mut self,
        request: &RequestSpec,
        request_id: &str,
    ) -> Result<Response, ClientError> {
        let Some(limit) = self.answer_limit else {
            return self.round_trip(request, request_id).await;
        };
        match tokio::time::timeout(limit, self.round_trip(request, request_id)).await {
            Ok(answered) => answered,
            Err(_) => Err(ClientError::TimedOut {
                waited_for: Waited::Response {
                    operation: request.operation.clone(),
                    state_changing: request.idempotency_key.is_some(),
                },
                limit,
            }),
        }
    }

    async fn round_trip(
        &mut self,
        request: &RequestSpec,
        request_id: &str,
    ) -> Result<Response, ClientError> {
        let mut frame = json!({
            "schema": "pi-workflows.client.v1",
            "type": "request",
            "requestId": request_id,
            "clientId": self.client_id,
            "operation": request.operation,
            "payload": request.payload,
        });
        if let Some(run_id) = &request.run_id {
            frame["runId"] = json!(run_id);
        }
        if let Some(key) = &request.idempotency_key {
            frame["idempotencyKey"] = json!(key);
        }
        if let Some(revision) = request.expected_revision {
            frame["expectedRevision"] = json!(revision);
        }
        self.send(&frame).await?;
        loop {
            let value = self.receive().await?;
            if let Some(reason) = closing_reason(&value) {
                return Err(ClientError::Lost(format!(
                    "the server closed the connection: {reason}"
                )));
            }
            if value.get("type").and_then(Value::as_str) == Some("event") {
                self.pending_events.push_back(value);
                continue;
            }
            if value.get("type").and_then(Value::as_str) == Some("response")
                && value.get("requestId").and_then(Value::as_str) == Some(request_id)
            {
                let text = |pointer: &str| {
                    value
                        .pointer(pointer)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                return Ok(Response {
                    request_id: request_id.to_owned(),
                    outcome: text("/outcome").unwrap_or_default(),
                    revision: value.get("revision").and_then(Value::as_u64),
                    receipt: value.get("receipt").cloned(),
                    error_code: text("/error/code"),
                    error_message: text("/error/message"),
                    frame: value,
                });
            }
        }
    }

    /// Subscribes to `target` (`{"kind": "run", "runId": …}`, `{"kind":
    /// "runList"}` or `{"kind": "session", "sessionId": …}`), resuming after
    /// `from_revision` when given. Returns the response; its receipt names
    /// the subscription id.
    pub async fn subscribe(
        &mut self,
        target: Value,
        from_revision: Option<u64>,
    ) -> Result<Response, ClientError> {
        let mut payload = json!({ "target": target });
        if let Some(revision) = from_revision {
            payload["fromRevision"] = json!(revision);
        }
        self.request(&RequestSpec::read("subscribe", None, payload))
            .await
    }

    /// The next event frame of any subscription on this connection,
    /// including the connection's own availability event (subscription id
    /// `connection`) sent before the server closes it.
    pub async fn next_event(&mut self) -> Result<Value, ClientError> {
        if let Some(event) = self.pending_events.pop_front() {
            return Ok(event);
        }
        loop {
            let value = self.receive().await?;
            if value.get("type").and_then(Value::as_str) == Some("event") {
                return Ok(value);
            }
        }
    }

    /// Reads the content behind a digest-bound `reference` of `run_id` in
    /// parts of at most 512 KiB ([`protocol::content::Assembler`]) and
    /// returns it only when the assembled bytes match the reference's length
    /// and SHA-256 digest (and every digest a part names). A refused part is
    /// the server's error; bytes that fail verification are
    /// `ClientError::Content`.
    pub async fn read_content(
        &mut self,
        run_id: &str,
        reference: &Value,
    ) -> Result<Vec<u8>, ClientError> {
        let mut assembler = protocol::content::Assembler::new(reference, None, u64::MAX)
            .map_err(ClientError::Content)?;
        while let Some(part) = assembler.next_request() {
            let payload =
                json!({ "reference": reference, "offset": part.offset, "length": part.length });
            let response = self
                .request(&RequestSpec::read("view.content", Some(run_id), payload))
                .await?;
            if let Some(error) = response.error() {
                return Err(error);
            }
            let chunk = response.receipt.unwrap_or_default();
            assembler
                .accept(protocol::content::Part {
                    reference: &chunk["reference"],
                    offset: chunk["offset"].as_u64().unwrap_or(u64::MAX),
                    data: chunk["data"].as_str().unwrap_or_default(),
                    last: chunk["final"].as_bool().unwrap_or(false),
                    digest: Some(chunk["digest"].as_str().unwrap_or_default()),
                })
                .map_err(ClientError::Content)?;
        }
        assembler.finish().map_err(ClientError::Content)
    }

    /// The complete run view at one revision: `run.view`, then every
    /// `view.page` of its steps and updates at that revision, so that
    /// `steps.items` and `updates.items` hold all `total` items and carry no
    /// `nextCursor`. Read again (at most [`COMPLETE_VIEW_ATTEMPTS`] times)
    /// when the run moved on between pages, then `KeptChanging`; a refused
    /// request is its error.
    pub async fn complete_view(&mut self, run_id: &str) -> Result<Value, ClientError> {
        'attempt: for _ in 0..COMPLETE_VIEW_ATTEMPTS {
            let response = self
                .request(&RequestSpec::read("run.view", Some(run_id), json!({})))
                .await?;
            if let Some(error) = response.error() {
                return Err(error);
            }
            let mut view = response.receipt.unwrap_or_default();
            let revision = view["revision"].clone();
            for collection in ["steps", "updates"] {
                let mut cursor = view[collection]["nextCursor"].as_str().map(str::to_owned);
                while let Some(at) = cursor {
                    let payload = json!({ "collection": collection, "cursor": at, "limit": 1000,
                        "maxBytes": MAX_PAGE_BYTES, "revision": revision });
                    let response = self
                        .request(&RequestSpec::read("view.page", Some(run_id), payload))
                        .await?;
                    if let Some(error) = response.error() {
                        return Err(error);
                    }
                    let page = response.receipt.unwrap_or_default();
                    if page["revision"] != revision {
                        continue 'attempt;
                    }
                    let items = page["items"].as_array().cloned().unwrap_or_default();
                    if let Some(inline) = view[collection]["items"].as_array_mut() {
                        inline.extend(items);
                    }
                    cursor = page["nextCursor"].as_str().map(str::to_owned);
                }
                let page = &mut view[collection];
                if page["items"].as_array().map(Vec::len)
                    != page["total"].as_u64().map(|n| n as usize)
                {
                    continue 'attempt;
                }
                if let Some(page) = page.as_object_mut() {
                    page.remove("nextCursor");
                }
            }
            return Ok(view);
        }
        Err(ClientError::KeptChanging)
    }
}

/// How often a complete view is read again when the run moved on between
/// its pages.
pub const COMPLETE_VIEW_ATTEMPTS: usize = 8;

/// The byte budget a complete view asks each page for (the server's own
/// page budget).
pub const MAX_PAGE_BYTES: u64 = 512 * 1024;

/// The reason of the server's error frame before it closes a connection
/// (an `availability: unavailable` event of subscription `connection`).
/// A server hello of another protocol version (off this client's schema,
/// so it never decodes) is the package-version line, not a lost connection.
fn another_protocol(bytes: &[u8], package_version: &str) -> Option<ClientError> {
    let hello: Value = serde_json::from_slice(bytes).ok()?;
    let protocol = hello.get("protocolVersion")?;
    (hello.get("type").and_then(Value::as_str) == Some("hello")
        && protocol.as_u64() != Some(PROTOCOL_VERSION))
    .then(|| {
        let server_version = hello
            .get("packageVersion")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        ClientError::VersionMismatch(format!(
            "the pi-workflows server is version {server_version} speaking protocol version {protocol} but this command line is {package_version} speaking protocol version {PROTOCOL_VERSION}; install matching pi-workflows packages (or stop the other server with its own `pi-workflows server stop`)"
        ))
    })
}

/// The client protocol version this client speaks (its hello's).
const PROTOCOL_VERSION: u64 = 1;

pub(crate) fn closing_reason(frame: &Value) -> Option<String> {
    (frame.get("type").and_then(Value::as_str) == Some("event")
        && frame.get("subscriptionId").and_then(Value::as_str) == Some("connection")
        && frame.pointer("/event/state").and_then(Value::as_str) == Some("unavailable"))
    .then(|| {
        let reason = frame
            .pointer("/event/reason")
            .and_then(Value::as_str)
            .unwrap_or("no reason given");
        // `<code>: <message>`: the message is the part a person reads.
        reason
            .split_once(": ")
            .map_or(reason, |(_, message)| message)
            .to_owned()
    })
}
