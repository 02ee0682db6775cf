//! The client socket: `pi-workflows.client.v1` over a user-only Unix socket.
//!
//! Invariants:
//! - The socket file is mode 0600 inside the 0700 `host/` directory, and it is
//!   bound only after the server took its epoch.
//! - Each side's first frame is `hello`. A package-version mismatch gets one
//!   `unavailable` response with `packageVersionMismatch`, then the
//!   connection closes.
//! - A malformed, non-canonical, over-limit or invalid frame gets one bounded
//!   error frame and closes only that connection.
//! - Responses to state-changing requests are written only after their
//!   receipts committed. A request the server read runs to its receipt even
//!   when its connection closes first.
//! - One connection holds bounded memory: at most [`MAX_IN_FLIGHT`] of its
//!   requests run at once and at most [`OUTBOX_FRAMES`] frames wait for its
//!   socket; while its requests are at that bound the server reads nothing
//!   more from it (backpressure). A subscription waits until its last event
//!   reached the socket before it prepares the next one, and a connection
//!   has at most [`MAX_SUBSCRIPTIONS`](crate::presentation::hub::MAX_SUBSCRIPTIONS).
//! - A connection is closed with one error frame when it stays over its
//!   bound with no reply written for `PI_WORKFLOWS_STALLED_CLIENT_MS`
//!   (`rateLimited`), leaves a frame or its hello unfinished for
//!   `PI_WORKFLOWS_FRAME_TIMEOUT_MS`, or, with no subscription and no request
//!   in flight, is silent for `PI_WORKFLOWS_CONNECTION_IDLE_MS` (both
//!   `timedOut`). A closing frame waits at most [`CLOSE_GRACE`] for the peer.
//! - At most `PI_WORKFLOWS_MAX_CONNECTIONS` connections are served; one more
//!   gets one `unavailable` error frame instead of the hello, then closes.
//! - A failing `accept` (for example `EMFILE` at the descriptor limit) is
//!   retried after a back-off that doubles up to [`ACCEPT_BACKOFF_MAX`],
//!   never at once.

use crate::client_api;
use crate::config::ConnectionLimits;
use crate::context::Context;
use crate::presentation::hub::Subscriptions;
use crate::wire::PACKAGE_VERSION;
use crate::wire::client::{Outbox, Outgoing, error_frame, frame};
use bytes::BytesMut;
use protocol::generated::types::{ClientMessage, HelloRole};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::codec::Decoder;

/// How many frames may wait for one connection's socket.
pub const OUTBOX_FRAMES: usize = 32;

/// How many requests of one connection may run at once.
pub const MAX_IN_FLIGHT: usize = 32;

/// How long a closing error frame waits for the peer to read it.
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// The first and the longest wait after a failed `accept`.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// See [`ACCEPT_BACKOFF_MIN`].
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How many bytes one read asks for.
const READ_CHUNK: usize = 16 * 1024;

/// Binds the socket, replacing a stale file left by a dead server (the
/// caller holds the global lock, so no live server owns it).
pub fn bind(app: &Context) -> std::io::Result<UnixListener> {
    let path = app.config.socket_path();
    if path.exists() {
        std::fs::remove_file(&path)?;
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Accepts connections until the server stops.
pub async fn serve(app: Arc<Context>, listener: UnixListener) {
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    match Slot::take(&app) {
                        Some(slot) => {
                            tokio::spawn(connection(app.clone(), stream, slot));
                        }
                        None => refuse(stream, app.config.connections.max_connections),
                    }
                }
                Err(_) => {
                    // The error (EMFILE, ENFILE, ENOBUFS, …) is usually still
                    // there on the next try: wait instead of spinning.
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = app.stop_requested.notified() => return,
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                }
            },
            () = app.stop_requested.notified() => return,
        }
    }
}

/// One served connection's place under the cap (`Context::clients`).
#[derive(Debug)]
struct Slot {
    app: Arc<Context>,
}

impl Slot {
    /// Takes a place, or `None` when the server is at its connection cap.
    fn take(app: &Arc<Context>) -> Option<Self> {
        let cap = app.config.connections.max_connections;
        let taken = app
            .clients
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |clients| {
                (clients < cap).then_some(clients + 1)
            });
        taken.ok().map(|_| Self { app: app.clone() })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.app.clients.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers a connection over the cap with one error frame (instead of the
/// hello) and closes it.
fn refuse(mut stream: UnixStream, cap: usize) {
    let refusal = error_frame(
        "unavailable",
        &format!(
            "the server has too many connections ({cap}); close another client or retry later"
        ),
    );
    tokio::spawn(async move {
        let _ = tokio::time::timeout(CLOSE_GRACE, stream.write_all(&refusal)).await;
        let _ = stream.shutdown().await;
    });
}

/// The closing frame of a connection that stopped reading its replies.
/// The server's hello: the first frame on every connection.
fn server_hello(server_epoch: u64) -> Vec<u8> {
    let hello = || {
        Some(ClientMessage::Hello {
            client_id: None,
            package_version: PACKAGE_VERSION.parse().ok()?,
            protocol_version: protocol::generated::constrained::ProtocolVersion::new(1)?,
            role: HelloRole::Server,
            schema: protocol::generated::types::ClientSchemaId::PiWorkflowsClientV1,
            server_epoch: protocol::generated::constrained::ServerEpoch::new(server_epoch),
        })
    };
    hello()
        .as_ref()
        .and_then(crate::wire::frames::client_message)
        .unwrap_or_else(|| error_frame("internal", "the server hello did not fit its schema"))
}

fn stalled_frame(limits: &ConnectionLimits) -> Vec<u8> {
    error_frame(
        "rateLimited",
        &format!(
            "the client did not read its replies for {} ms with {MAX_IN_FLIGHT} requests waiting; read each response",
            limits.stalled_client_ms
        ),
    )
}

/// When one connection last moved bytes, shared by its reader and writer.
#[derive(Debug)]
struct Activity {
    opened: Instant,
    /// Milliseconds after `opened` of the last byte read or written.
    last_traffic_ms: AtomicU64,
    /// One more than the milliseconds after `opened` when the frame being
    /// written last made progress; 0 while nothing waits to be written.
    write_waiting_since_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            last_traffic_ms: AtomicU64::new(0),
            write_waiting_since_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn traffic(&self) {
        self.last_traffic_ms.store(self.now_ms(), Ordering::SeqCst);
    }

    /// A frame is waiting to be written, or the one being written moved on.
    fn write_waiting(&self) {
        let now = self.now_ms();
        self.last_traffic_ms.store(now, Ordering::SeqCst);
        self.write_waiting_since_ms.store(now + 1, Ordering::SeqCst);
    }

    /// Nothing waits to be written.
    fn write_idle(&self) {
        self.traffic();
        self.write_waiting_since_ms.store(0, Ordering::SeqCst);
    }

    /// Whether the writer has been waiting for the peer for `limit_ms`.
    fn write_stalled(&self, limit_ms: u64) -> bool {
        match self.write_waiting_since_ms.load(Ordering::SeqCst) {
            0 => false,
            since => self.now_ms().saturating_sub(since - 1) >= limit_ms,
        }
    }

    /// When the connection is idle for `limit`, measured from its last traffic.
    fn idle_deadline(&self, limit: Duration) -> Instant {
        self.opened + Duration::from_millis(self.last_traffic_ms.load(Ordering::SeqCst)) + limit
    }
}

/// How a connection's reading ended.
#[derive(Debug)]
enum End {
    /// The peer closed its side (or the read failed): requests already read
    /// still answer.
    Eof,
    /// Close after the answers to requests already read, then this frame.
    Close(Vec<u8>),
    /// Close now: drop unwritten answers, write this frame (bounded).
    Abort(Vec<u8>),
}

async fn connection(app: Arc<Context>, stream: UnixStream, slot: Slot) {
    let limits = app.config.connections.clone();
    let (read, write) = stream.into_split();
    let (sender, pending) = mpsc::channel::<Outgoing>(OUTBOX_FRAMES);
    let (abort, aborted) = oneshot::channel::<Vec<u8>>();
    let activity = Arc::new(Activity::new());
    let writer = tokio::spawn(write_frames(
        write,
        pending,
        aborted,
        activity.clone(),
        app.faults.clone(),
    ));
    let outbox = Outbox {
        sender,
        connection: kernel::ids::ConnectionId::new(format!(
            "conn-{}",
            crate::ids::random_hex::<8>()
        )),
    };
    let hello = server_hello(app.epoch.0);
    outbox.send(hello).await;
    let subscriptions = Subscriptions::new();
    let mut tasks = JoinSet::new();
    let end = read_frames(
        &app,
        read,
        &outbox,
        &subscriptions,
        &mut tasks,
        &activity,
        &limits,
    )
    .await;
    subscriptions.close_all();
    crate::client_api::coordinator::disconnected(&app, outbox.connection_id()).await;
    let mut abort = Some(abort);
    let closing = match end {
        End::Eof => None,
        End::Close(frame) => Some(frame),
        End::Abort(frame) => {
            if let Some(abort) = abort.take() {
                let _ = abort.send(frame);
            }
            None
        }
    };
    // Requests already read run to their receipts; their answers and the
    // closing frame are written unless the peer stops reading for the
    // stall limit, which aborts the connection.
    let flush = async move {
        while tasks.join_next().await.is_some() {}
        if let Some(frame) = closing {
            outbox.send(frame).await;
        }
        drop(outbox);
    };
    tokio::pin!(flush);
    let check = stall_check_interval(&limits);
    loop {
        tokio::select! {
            () = &mut flush => break,
            () = tokio::time::sleep(check) => {
                if activity.write_stalled(limits.stalled_client_ms)
                    && let Some(abort) = abort.take()
                {
                    let _ = abort.send(stalled_frame(&limits));
                }
            }
        }
    }
    let _ = writer.await;
    drop(abort);
    drop(slot);
}

/// How often a waiting connection checks whether its writer stalled.
fn stall_check_interval(limits: &ConnectionLimits) -> Duration {
    Duration::from_millis((limits.stalled_client_ms / 4).clamp(10, 1000))
}

/// Writes queued frames until every sender is gone or the connection is
/// aborted. An abort drops the frames not yet written, finishes the frame
/// in progress (so the stream stays framed), adds the abort's frame, and
/// gives the peer [`CLOSE_GRACE`] to take them.
async fn write_frames(
    mut write: OwnedWriteHalf,
    mut pending: mpsc::Receiver<Outgoing>,
    mut aborted: oneshot::Receiver<Vec<u8>>,
    activity: Arc<Activity>,
    faults: crate::fault::Faults,
) {
    let mut last_words: Option<Vec<u8>> = None;
    'frames: loop {
        let outgoing = tokio::select! {
            biased;
            frame = &mut aborted => {
                last_words = frame.ok();
                break 'frames;
            }
            outgoing = pending.recv() => match outgoing {
                Some(outgoing) => outgoing,
                None => break 'frames,
            },
        };
        activity.write_waiting();
        let mut offset = 0;
        while offset < outgoing.frame.len() {
            tokio::select! {
                biased;
                frame = &mut aborted => {
                    let mut rest = outgoing.frame[offset..].to_vec();
                    if let Ok(frame) = frame {
                        rest.extend_from_slice(&frame);
                    }
                    last_words = Some(rest);
                    break 'frames;
                }
                written = write.write(&outgoing.frame[offset..]) => match written {
                    Ok(0) | Err(_) => break 'frames,
                    Ok(count) => {
                        offset += count;
                        activity.write_waiting();
                    }
                },
            }
        }
        activity.write_idle();
        faults.hit(crate::fault::FaultPoint::AfterReply);
        if let Some(written) = outgoing.written {
            let _ = written.send(());
        }
    }
    // Senders still waiting for room see the connection closed.
    drop(pending);
    if let Some(bytes) = last_words {
        let _ = tokio::time::timeout(CLOSE_GRACE, write.write_all(&bytes)).await;
    }
    let _ = write.shutdown().await;
}

/// Reads frames and starts their requests until the connection ends.
async fn read_frames(
    app: &Arc<Context>,
    mut read: OwnedReadHalf,
    outbox: &Outbox,
    subscriptions: &Subscriptions,
    tasks: &mut JoinSet<()>,
    activity: &Activity,
    limits: &ConnectionLimits,
) -> End {
    let requests = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let frame_timeout = Duration::from_millis(limits.frame_timeout_ms);
    let idle_limit = Duration::from_millis(limits.idle_ms);
    let mut codec = protocol::FrameCodec::new();
    let mut buffer = BytesMut::new();
    let mut at_eof = false;
    let mut greeted = false;
    // When the bytes now in the buffer started arriving (the hello counts
    // from the connection's start).
    let mut frame_started = Some(Instant::now());
    loop {
        while tasks.try_join_next().is_some() {}
        let decoded = if at_eof {
            codec.decode_eof(&mut buffer)
        } else {
            codec.decode(&mut buffer)
        };
        let bytes = match decoded {
            Ok(Some(bytes)) => {
                frame_started = (!buffer.is_empty()).then(Instant::now);
                bytes
            }
            Ok(None) if at_eof => return End::Eof,
            Ok(None) => {
                if buffer.is_empty() && greeted {
                    frame_started = None;
                } else if frame_started.is_none() {
                    frame_started = Some(Instant::now());
                }
                let idle = greeted
                    && subscriptions.is_empty()
                    && requests.available_permits() == MAX_IN_FLIGHT;
                let deadline = match frame_started {
                    Some(started) => started + frame_timeout,
                    None if idle => activity.idle_deadline(idle_limit),
                    // Busy: look again after a while.
                    None => Instant::now() + idle_limit,
                };
                buffer.reserve(READ_CHUNK);
                tokio::select! {
                    biased;
                    read = read.read_buf(&mut buffer) => match read {
                        Ok(0) => at_eof = true,
                        Ok(_) => activity.traffic(),
                        Err(_) => return End::Eof,
                    },
                    () = tokio::time::sleep_until(deadline.into()) => {
                        if let Some(closing) = timed_out(frame_started, greeted, idle, activity, limits) {
                            return End::Close(closing);
                        }
                    }
                }
                continue;
            }
            Err(protocol::CodecError::Frame(error)) => {
                return End::Close(error_frame(&error.code().to_string(), error.message()));
            }
            Err(protocol::CodecError::Io(_)) => return End::Eof,
        };
        let decoded = match protocol::decode_client_frame(&bytes) {
            Ok(decoded) => decoded,
            Err(error) => {
                return End::Close(error_frame(&error.code().to_string(), error.message()));
            }
        };
        match decoded.message {
            ClientMessage::Hello {
                role,
                package_version,
                client_id,
                ..
            } => {
                if greeted || role != HelloRole::Client || client_id.is_none() {
                    return End::Close(error_frame(
                        "schemaInvalid",
                        "expected one client hello with a clientId",
                    ));
                }
                if package_version.as_str() != PACKAGE_VERSION {
                    return End::Close(frame(&crate::wire::client::response(
                        "hello",
                        "server.status",
                        "unavailable",
                        None,
                        None,
                        Some((
                            protocol::ErrorCode::PackageVersionMismatch,
                            format!(
                                "this server is pi-workflows {PACKAGE_VERSION}; install matching pi-workflows packages"
                            ),
                        )),
                    )));
                }
                greeted = true;
            }
            ClientMessage::Request { .. } if greeted => {
                let Some(permit) = request_slot(&requests, activity, limits).await else {
                    return End::Abort(stalled_frame(limits));
                };
                let app = app.clone();
                let outbox = outbox.clone();
                let subscriptions = subscriptions.clone();
                tasks.spawn(async move {
                    client_api::handle(
                        &app,
                        decoded.message,
                        decoded.payload,
                        &outbox,
                        &subscriptions,
                    )
                    .await;
                    drop(permit);
                });
            }
            _ => {
                return End::Close(error_frame(
                    "schemaInvalid",
                    "expected a client hello, then requests",
                ));
            }
        }
    }
}

/// The closing frame when a read deadline passed, or `None` when the
/// connection has earned more time (it became busy or moved bytes).
fn timed_out(
    frame_started: Option<Instant>,
    greeted: bool,
    idle: bool,
    activity: &Activity,
    limits: &ConnectionLimits,
) -> Option<Vec<u8>> {
    let now = Instant::now();
    match frame_started {
        Some(started) if now >= started + Duration::from_millis(limits.frame_timeout_ms) => {
            Some(error_frame(
                "timedOut",
                &if greeted {
                    format!(
                        "a frame was not completed within {} ms of its first byte",
                        limits.frame_timeout_ms
                    )
                } else {
                    format!(
                        "the connection sent no complete hello within {} ms",
                        limits.frame_timeout_ms
                    )
                },
            ))
        }
        Some(_) => None,
        None if idle && now >= activity.idle_deadline(Duration::from_millis(limits.idle_ms)) => {
            Some(error_frame(
                "timedOut",
                &format!(
                    "the connection was idle for {} ms; connect again when you need the server",
                    limits.idle_ms
                ),
            ))
        }
        None => None,
    }
}

/// A place for one more running request of this connection. While none is
/// free nothing more is read; `None` when the connection's writer made no
/// progress for the stall limit meanwhile (the peer does not read).
async fn request_slot(
    requests: &Arc<Semaphore>,
    activity: &Activity,
    limits: &ConnectionLimits,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(permit) = requests.clone().try_acquire_owned() {
        return Some(permit);
    }
    let check = stall_check_interval(limits);
    loop {
        tokio::select! {
            permit = requests.clone().acquire_owned() => return permit.ok(),
            () = tokio::time::sleep(check) => {
                if activity.write_stalled(limits.stalled_client_ms) {
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_message_over_one_frame_becomes_a_bounded_answer_to_the_same_requester() {
        let big = "x".repeat(protocol::MAX_FRAME_BYTES);
        let response = json!({
            "schema": "pi-workflows.client.v1", "type": "response", "requestId": "c1-r7",
            "operation": "run.view", "outcome": "accepted", "receipt": { "pad": big },
        });
        let decoded = protocol::decode_client_frame(&frame(&response)).expect("a valid frame");
        let value = serde_json::to_value(&decoded.message).unwrap();
        assert_eq!(value["type"], "response");
        assert_eq!(value["requestId"], "c1-r7", "the requester gets its answer");
        assert_eq!(value["operation"], "run.view");
        assert_eq!(value["outcome"], "unavailable");
        assert_eq!(value["error"]["code"], "frameTooLarge");

        let event = json!({
            "schema": "pi-workflows.client.v1", "type": "event", "subscriptionId": "sub-1",
            "revision": 4,
            "event": { "kind": "page", "page": {
                "collection": "steps", "items": [{ "pad": big }], "revision": 4,
            } },
        });
        let decoded = protocol::decode_client_frame(&frame(&event)).expect("a valid frame");
        let value = serde_json::to_value(&decoded.message).unwrap();
        assert_eq!(value["subscriptionId"], "sub-1");
        assert_eq!(value["event"]["kind"], "availability");
        assert_eq!(value["event"]["state"], "unavailable");
    }
}
