//! The Rust protocol client: one connection to the server socket speaking
//! `pi-workflows.client.v1`. The CLI and the black-box tests use it; it never
//! opens SQLite.
//!
//! Invariants:
//! - Every frame it sends is canonical and validated by the protocol crate
//!   before it is written.
//! - A retry after a dropped connection reuses the client id, idempotency key,
//!   operation and payload with a new request id, so it adopts the stored
//!   receipt instead of executing twice.
//! - A client connected with [`Client::connect_within`] waits at most its
//!   limit for the hello and for each response (`ClientError::TimedOut`
//!   names what it waited for); waiting for subscription events is never
//!   bounded.

use crate::app::PACKAGE_VERSION;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio_stream::StreamExt;
use tokio_util::codec::FramedRead;

/// Why a client call failed, as one line that says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// No server is listening.
    Unavailable,
    /// The server runs another package version.
    VersionMismatch(String),
    /// The server refused the connection (its reason, e.g. too many connections).
    Refused(String),
    /// The server did not answer within the client's limit.
    TimedOut { waited_for: Waited, limit: Duration },
    /// The connection broke or the server sent something unexpected.
    Protocol(String),
}

/// What a timed-out client waited for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    /// The server's hello after connecting.
    Hello,
    /// The response to a request of this operation; `state_changing` when
    /// it carried an idempotency key (it may still be applied).
    Response {
        operation: String,
        state_changing: bool,
    },
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable => f.write_str(
                "the pi-workflows server is not running; start it with `pi-workflows server start`",
            ),
            Self::VersionMismatch(message) => write!(f, "{message}"),
            Self::Refused(reason) => write!(
                f,
                "the pi-workflows server refused the connection: {reason}"
            ),
            Self::TimedOut { waited_for, limit } => {
                let within = seconds(*limit);
                match waited_for {
                    Waited::Hello => write!(
                        f,
                        "the pi-workflows server accepted the connection but did not answer the hello within {within}; it may be overloaded or hung: retry later or restart it (PI_WORKFLOWS_CLI_TIMEOUT_MS sets this wait)"
                    ),
                    Waited::Response {
                        operation,
                        state_changing: false,
                    } => write!(
                        f,
                        "the pi-workflows server did not answer `{operation}` within {within}; retry later (PI_WORKFLOWS_CLI_TIMEOUT_MS sets this wait)"
                    ),
                    Waited::Response {
                        operation,
                        state_changing: true,
                    } => write!(
                        f,
                        "the pi-workflows server did not answer `{operation}` within {within}; it may still apply it, so check `pi-workflows runs` before you retry (PI_WORKFLOWS_CLI_TIMEOUT_MS sets this wait)"
                    ),
                }
            }
            Self::Protocol(message) => write!(
                f,
                "lost the connection to the pi-workflows server ({message}); retry the command"
            ),
        }
    }
}

/// `1 s`, `1.5 s`.
fn seconds(limit: Duration) -> String {
    let millis = limit.as_millis();
    if millis.is_multiple_of(1000) {
        format!("{} s", millis / 1000)
    } else {
        format!("{} s", limit.as_secs_f64())
    }
}

/// One connection.
#[derive(Debug)]
pub struct Client {
    frames: FramedRead<OwnedReadHalf, protocol::FrameCodec>,
    write: OwnedWriteHalf,
    client_id: String,
    /// The server's epoch from its hello.
    pub server_epoch: u64,
    next_request: u64,
    /// Random per connection, so request ids never repeat across reconnects.
    connection_nonce: String,
    /// Events that arrived while a request waited for its response.
    pending_events: VecDeque<Value>,
    /// How long the hello and each response may take (`None`: unbounded).
    answer_limit: Option<Duration>,
}

/// A settled request.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    pub outcome: String,
    pub revision: Option<u64>,
    pub receipt: Option<Value>,
    pub error_code: Option<String>,
    pub error_message: Option<String>,
    /// The whole response frame.
    pub frame: Value,
}

impl Client {
    /// Connects to the socket at `path` and exchanges hellos, waiting as
    /// long as the server takes.
    pub async fn connect(path: &Path, client_id: &str) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path).await.map_err(|error| {
            if error.kind() == std::io::ErrorKind::WouldBlock {
                // The listen queue is full: a server runs but does not accept.
                ClientError::Refused("its queue of new connections is full; retry later".into())
            } else {
                ClientError::Unavailable
            }
        })?;
        let (read, write) = stream.into_split();
        let mut client = Self {
            frames: FramedRead::new(read, protocol::FrameCodec::new()),
            write,
            client_id: client_id.to_owned(),
            server_epoch: 0,
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
            "protocolVersion": 1,
            "packageVersion": PACKAGE_VERSION,
        });
        // A server that refuses the connection writes its reason and closes
        // without reading: the reason is read even when the hello could
        // not be written.
        let sent = client.send(&hello).await;
        let server_hello = client.receive().await;
        if let Some(reason) = server_hello.as_ref().ok().and_then(closing_reason) {
            return Err(ClientError::Refused(reason));
        }
        sent?;
        let server_hello = server_hello?;
        if server_hello.get("type").and_then(Value::as_str) != Some("hello") {
            return Err(ClientError::Protocol("no server hello".into()));
        }
        let server_version = server_hello
            .get("packageVersion")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        if server_version != PACKAGE_VERSION {
            return Err(ClientError::VersionMismatch(format!(
                "the pi-workflows server is version {server_version} but this command line is {PACKAGE_VERSION}; install matching pi-workflows packages (or stop the other server with its own `pi-workflows server stop`)"
            )));
        }
        client.server_epoch = server_hello
            .get("serverEpoch")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Ok(client)
    }

    /// Connects like [`Client::connect`], but waits at most `limit` for the
    /// hello and, afterwards, for each response.
    pub async fn connect_within(
        path: &Path,
        client_id: &str,
        limit: Duration,
    ) -> Result<Self, ClientError> {
        match tokio::time::timeout(limit, Self::connect(path, client_id)).await {
            Ok(connected) => connected.map(|mut client| {
                client.answer_limit = Some(limit);
                client
            }),
            Err(_) => Err(ClientError::TimedOut {
                waited_for: Waited::Hello,
                limit,
            }),
        }
    }

    /// Sends one frame (validated first).
    pub async fn send(&mut self, value: &Value) -> Result<(), ClientError> {
        let mut bytes = protocol::canonicalize(value)
            .map_err(|error| ClientError::Protocol(error.to_string()))?;
        bytes.push(b'\n');
        protocol::decode_client_frame(&bytes)
            .map_err(|error| ClientError::Protocol(error.to_string()))?;
        self.write
            .write_all(&bytes)
            .await
            .map_err(|_| ClientError::Protocol("write failed".into()))
    }

    /// Writes raw bytes (tests of malformed frames).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.write
            .write_all(bytes)
            .await
            .map_err(|_| ClientError::Protocol("write failed".into()))
    }

    /// Reads the next frame.
    pub async fn receive(&mut self) -> Result<Value, ClientError> {
        match self.frames.next().await {
            Some(Ok(bytes)) => {
                let frame = protocol::decode_client_frame(&bytes)
                    .map_err(|error| ClientError::Protocol(error.to_string()))?;
                let value = serde_json::to_value(&frame.message)
                    .map_err(|_| ClientError::Protocol("decode".into()))?;
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
            Some(Err(_)) => Err(ClientError::Protocol("invalid frame".into())),
            None => Err(ClientError::Protocol(
                "the server closed the connection".into(),
            )),
        }
    }

    /// This client's id (stable across its connections).
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

    /// Sends a request and waits for its response (at most the client's
    /// answer limit, when it has one).
    pub async fn request(&mut self, request: &RequestSpec) -> Result<Response, ClientError> {
        let Some(limit) = self.answer_limit else {
            return self.round_trip(request).await;
        };
        match tokio::time::timeout(limit, self.round_trip(request)).await {
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

    async fn round_trip(&mut self, request: &RequestSpec) -> Result<Response, ClientError> {
        let request_id = self.request_id();
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
                return Err(ClientError::Protocol(format!(
                    "the server closed the connection: {reason}"
                )));
            }
            if value.get("type").and_then(Value::as_str) == Some("event") {
                self.pending_events.push_back(value);
                continue;
            }
            if value.get("type").and_then(Value::as_str) == Some("response")
                && value.get("requestId").and_then(Value::as_str) == Some(request_id.as_str())
            {
                return Ok(Response {
                    outcome: value
                        .get("outcome")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    revision: value.get("revision").and_then(Value::as_u64),
                    receipt: value.get("receipt").cloned(),
                    error_code: value
                        .pointer("/error/code")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    error_message: value
                        .pointer("/error/message")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    frame: value,
                });
            }
        }
    }
}

impl Client {
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
            match value.get("type").and_then(Value::as_str) {
                Some("event") => return Ok(value),
                _ => continue,
            }
        }
    }
}

/// The reason of the server's error frame before it closes a connection
/// (an `availability: unavailable` event of subscription `connection`).
fn closing_reason(frame: &Value) -> Option<String> {
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

/// Why generated content could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentError {
    /// The server has no such content for this run and media type.
    Unavailable(String),
    /// The assembled bytes do not match the reference's digest or length.
    DigestMismatch,
    /// The connection failed.
    Client(ClientError),
}

impl From<ClientError> for ContentError {
    fn from(error: ClientError) -> Self {
        Self::Client(error)
    }
}

impl Client {
    /// Reads the content behind a digest-bound `reference` of `run_id` in
    /// chunks and returns it only when the assembled bytes match the
    /// reference's length and SHA-256 digest.
    pub async fn read_content(
        &mut self,
        run_id: &str,
        reference: &Value,
    ) -> Result<Vec<u8>, ContentError> {
        let mut assembler = protocol::content::Assembler::new(reference, None, u64::MAX)
            .map_err(|_| ContentError::DigestMismatch)?;
        while let Some(part) = assembler.next_request() {
            let payload =
                json!({ "reference": reference, "offset": part.offset, "length": part.length });
            let response = self
                .request(&RequestSpec::read("view.content", Some(run_id), payload))
                .await?;
            let Some(chunk) = response.receipt.filter(|_| response.outcome == "accepted") else {
                return Err(ContentError::Unavailable(
                    response
                        .error_message
                        .unwrap_or_else(|| response.outcome.clone()),
                ));
            };
            assembler
                .accept(protocol::content::Part {
                    reference: &chunk["reference"],
                    offset: chunk["offset"].as_u64().unwrap_or(u64::MAX),
                    data: chunk["data"].as_str().unwrap_or_default(),
                    last: chunk["final"].as_bool().unwrap_or(false),
                    digest: Some(chunk["digest"].as_str().unwrap_or_default()),
                })
                .map_err(|_| ContentError::DigestMismatch)?;
        }
        assembler.finish().map_err(|_| ContentError::DigestMismatch)
    }
}

/// How often a complete view is read again when the run moved on between
/// its pages.
pub const COMPLETE_VIEW_ATTEMPTS: usize = 8;

/// A complete view, or why there is none.
#[derive(Clone, Debug, PartialEq)]
pub enum CompleteView {
    /// The view at one revision with every step and update inline.
    View(Value),
    /// The server refused `run.view` or a page (its response).
    Refused(Response),
    /// The run changed between pages on every attempt.
    Moving,
}

impl Client {
    /// The complete run view at one revision: `run.view`, then every
    /// `view.page` of its steps and updates at that revision, so that
    /// `steps.items` and `updates.items` hold all `total` items and carry no
    /// `nextCursor`. Read again (at most [`COMPLETE_VIEW_ATTEMPTS`] times)
    /// when the run moved on between pages.
    pub async fn complete_view(&mut self, run_id: &str) -> Result<CompleteView, ClientError> {
        'attempt: for _ in 0..COMPLETE_VIEW_ATTEMPTS {
            let response = self
                .request(&RequestSpec::read("run.view", Some(run_id), json!({})))
                .await?;
            let Some(mut view) = response
                .receipt
                .clone()
                .filter(|_| response.outcome == "accepted")
            else {
                return Ok(CompleteView::Refused(response));
            };
            let revision = view["revision"].clone();
            for collection in ["steps", "updates"] {
                let mut cursor = view[collection]["nextCursor"].as_str().map(str::to_owned);
                while let Some(at) = cursor {
                    let payload = json!({ "collection": collection, "cursor": at, "limit": 1000,
                        "maxBytes": crate::reads::PAGE_BYTES, "revision": revision });
                    let response = self
                        .request(&RequestSpec::read("view.page", Some(run_id), payload))
                        .await?;
                    let Some(page) = response
                        .receipt
                        .clone()
                        .filter(|_| response.outcome == "accepted")
                    else {
                        return Ok(CompleteView::Refused(response));
                    };
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
            return Ok(CompleteView::View(view));
        }
        Ok(CompleteView::Moving)
    }
}

/// The client id of one CLI process.
pub fn cli_client_id() -> String {
    format!("cli-{}", crate::ids::random_hex::<8>())
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
            operation: operation.into(),
            run_id: run_id.map(str::to_owned),
            idempotency_key: Some(format!("k-{}", crate::ids::random_hex::<12>())),
            expected_revision: None,
            payload,
        }
    }
}
