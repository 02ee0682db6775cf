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
//!   receipts committed. Writes are bounded: a connection that stops reading
//!   holds at most a few frames, and a subscription waits until its last
//!   event reached the socket before it prepares the next one.

use crate::app::{App, PACKAGE_VERSION};
use crate::handlers;
use crate::views::Subscriptions;
use protocol::generated::types::{ClientMessage, HelloRole};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_util::codec::FramedRead;

/// How many frames may wait for one connection's socket.
const OUTBOX_FRAMES: usize = 32;

/// Binds the socket, replacing a stale file left by a dead server (the
/// caller holds the global lock, so no live server owns it).
pub fn bind(app: &App) -> std::io::Result<UnixListener> {
    let path = app.config.socket_path();
    if path.exists() {
        std::fs::remove_file(&path)?;
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Accepts connections until the server stops.
pub async fn serve(app: Arc<App>, listener: UnixListener) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    tokio::spawn(connection(app.clone(), stream));
                }
            }
            () = app.stop_requested.notified() => return,
        }
    }
}

/// One frame on its way to the socket, with an optional drain notification.
#[derive(Debug)]
struct Outgoing {
    frame: Vec<u8>,
    written: Option<oneshot::Sender<()>>,
}

/// The bounded write side of one connection.
#[derive(Clone, Debug)]
pub struct Outbox {
    sender: mpsc::Sender<Outgoing>,
}

impl Outbox {
    /// Queues a frame; waits while the connection's queue is full. Returns
    /// `false` when the connection is gone.
    pub async fn send(&self, frame: Vec<u8>) -> bool {
        self.sender
            .send(Outgoing {
                frame,
                written: None,
            })
            .await
            .is_ok()
    }

    /// Queues a frame and waits until it was written to the socket. Returns
    /// `false` when the connection closed first.
    pub async fn send_and_drain(&self, frame: Vec<u8>) -> bool {
        let (written, done) = oneshot::channel();
        if self
            .sender
            .send(Outgoing {
                frame,
                written: Some(written),
            })
            .await
            .is_err()
        {
            return false;
        }
        done.await.is_ok()
    }

    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// Encodes a client-channel message as a frame. Every page and view is
/// bounded to fit one; should a message still not fit, its receiver is told
/// so: a response becomes a `frameTooLarge` response to the same request
/// id, an event an `unavailable` availability event of the same
/// subscription. Nothing is dropped silently.
pub fn frame(value: &Value) -> Vec<u8> {
    if let Some(frame) = crate::runner_channel::frame_of(value) {
        return frame;
    }
    let substitute = match value.get("type").and_then(Value::as_str) {
        Some("response") => json!({
            "schema": "pi-workflows.client.v1",
            "type": "response",
            "requestId": value["requestId"],
            "operation": value["operation"],
            "outcome": "unavailable",
            "error": { "code": "frameTooLarge", "message": "the response did not fit one 1 MiB frame; report this server bug" },
        }),
        Some("event") => json!({
            "schema": "pi-workflows.client.v1",
            "type": "event",
            "subscriptionId": value["subscriptionId"],
            "revision": value["revision"],
            "event": { "kind": "availability", "state": "unavailable", "reason": "frameTooLarge: the event did not fit one 1 MiB frame; report this server bug" },
        }),
        _ => return error_frame("internal", "the reply did not fit a frame"),
    };
    crate::runner_channel::frame_of(&substitute)
        .unwrap_or_else(|| error_frame("internal", "the reply did not fit a frame"))
}

/// The bounded error frame sent before a connection closes.
fn error_frame(code: &str, message: &str) -> Vec<u8> {
    crate::runner_channel::frame_of(&json!({
        "schema": "pi-workflows.client.v1",
        "type": "event",
        "subscriptionId": "connection",
        "revision": 0,
        "event": { "kind": "availability", "state": "unavailable", "reason": format!("{code}: {message}") },
    }))
    .unwrap_or_default()
}

async fn connection(app: Arc<App>, stream: UnixStream) {
    app.clients.fetch_add(1, Ordering::SeqCst);
    let (read, mut write) = stream.into_split();
    let (sender, mut pending) = mpsc::channel::<Outgoing>(OUTBOX_FRAMES);
    let outbox = Outbox { sender };
    let faults = app.faults.clone();
    let writer = tokio::spawn(async move {
        while let Some(outgoing) = pending.recv().await {
            if outgoing.frame.is_empty() || write.write_all(&outgoing.frame).await.is_err() {
                break;
            }
            faults.hit(crate::fault::FaultPoint::AfterReply);
            if let Some(written) = outgoing.written {
                let _ = written.send(());
            }
        }
        let _ = write.shutdown().await;
    });
    let hello = frame(&json!({
        "schema": "pi-workflows.client.v1",
        "type": "hello",
        "role": "server",
        "protocolVersion": 1,
        "packageVersion": PACKAGE_VERSION,
        "serverEpoch": app.epoch.0,
    }));
    outbox.send(hello).await;
    let subscriptions = Subscriptions::new();
    read_frames(&app, read, &outbox, &subscriptions).await;
    subscriptions.close_all();
    // An empty frame tells the writer to flush and close.
    outbox.send(Vec::new()).await;
    drop(outbox);
    let _ = writer.await;
    app.clients.fetch_sub(1, Ordering::SeqCst);
}

async fn read_frames(
    app: &Arc<App>,
    read: tokio::net::unix::OwnedReadHalf,
    outbox: &Outbox,
    subscriptions: &Subscriptions,
) {
    let mut frames = FramedRead::new(read, protocol::FrameCodec::new());
    let mut greeted = false;
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(next) = frames.next().await {
        while tasks.try_join_next().is_some() {}
        let bytes = match next {
            Ok(bytes) => bytes,
            Err(protocol::CodecError::Frame(error)) => {
                outbox
                    .send(error_frame(&error.code().to_string(), error.message()))
                    .await;
                break;
            }
            Err(protocol::CodecError::Io(_)) => break,
        };
        let decoded = match protocol::decode_client_frame(&bytes) {
            Ok(decoded) => decoded,
            Err(error) => {
                outbox
                    .send(error_frame(&error.code().to_string(), error.message()))
                    .await;
                break;
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
                    outbox
                        .send(error_frame(
                            "schemaInvalid",
                            "expected one client hello with a clientId",
                        ))
                        .await;
                    break;
                }
                if package_version.as_str() != PACKAGE_VERSION {
                    outbox
                        .send(frame(&json!({
                            "schema": "pi-workflows.client.v1",
                            "type": "response",
                            "requestId": "hello",
                            "operation": "server.status",
                            "outcome": "unavailable",
                            "error": {
                                "code": "packageVersionMismatch",
                                "message": format!("this server is pi-workflows {PACKAGE_VERSION}; install matching pi-workflows packages"),
                            },
                        })))
                        .await;
                    break;
                }
                greeted = true;
            }
            ClientMessage::Request { .. } if greeted => {
                let app = app.clone();
                let outbox = outbox.clone();
                let subscriptions = subscriptions.clone();
                tasks.spawn(async move {
                    handlers::handle(
                        &app,
                        decoded.message,
                        decoded.payload,
                        &outbox,
                        &subscriptions,
                    )
                    .await;
                });
            }
            _ => {
                outbox
                    .send(error_frame(
                        "schemaInvalid",
                        "expected a client hello, then requests",
                    ))
                    .await;
                break;
            }
        }
    }
    // In-flight commands finish and store their receipts even after a disconnect.
    while tasks.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "revision": 4, "event": { "kind": "page", "page": { "pad": big } },
        });
        let decoded = protocol::decode_client_frame(&frame(&event)).expect("a valid frame");
        let value = serde_json::to_value(&decoded.message).unwrap();
        assert_eq!(value["subscriptionId"], "sub-1");
        assert_eq!(value["event"]["kind"], "availability");
        assert_eq!(value["event"]["state"], "unavailable");
    }
}
