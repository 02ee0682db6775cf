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
//!   receipts committed.

use crate::app::{App, PACKAGE_VERSION};
use crate::handlers;
use protocol::generated::types::{ClientMessage, HelloRole};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_util::codec::FramedRead;

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

/// Frames queued for one connection's writer.
pub type Outbox = mpsc::UnboundedSender<Vec<u8>>;

/// Encodes a client-channel message as a frame.
pub fn frame(value: &Value) -> Vec<u8> {
    crate::runner_channel::frame_of(value).unwrap_or_else(|| {
        crate::runner_channel::frame_of(&json!({
            "schema": "pi-workflows.client.v1",
            "type": "event",
            "subscriptionId": "connection",
            "revision": 0,
            "event": { "kind": "availability", "state": "unavailable", "reason": "internal: the reply did not fit a frame" },
        }))
        .unwrap_or_default()
    })
}

/// The bounded error frame sent before a connection closes.
fn error_frame(code: &str, message: &str) -> Vec<u8> {
    frame(&json!({
        "schema": "pi-workflows.client.v1",
        "type": "event",
        "subscriptionId": "connection",
        "revision": 0,
        "event": { "kind": "availability", "state": "unavailable", "reason": format!("{code}: {message}") },
    }))
}

async fn connection(app: Arc<App>, stream: UnixStream) {
    app.clients.fetch_add(1, Ordering::SeqCst);
    let (read, mut write) = stream.into_split();
    let (outbox, mut pending) = mpsc::unbounded_channel::<Vec<u8>>();
    let faults = app.faults.clone();
    let writer = tokio::spawn(async move {
        while let Some(frame) = pending.recv().await {
            let close = frame.is_empty();
            if close || write.write_all(&frame).await.is_err() {
                break;
            }
            faults.hit(crate::fault::FaultPoint::AfterReply);
        }
        let _ = write.shutdown().await;
    });
    let _ = outbox.send(frame(&json!({
        "schema": "pi-workflows.client.v1",
        "type": "hello",
        "role": "server",
        "protocolVersion": 1,
        "packageVersion": PACKAGE_VERSION,
        "serverEpoch": app.epoch.0,
    })));
    read_frames(&app, read, &outbox).await;
    // An empty frame tells the writer to flush and close.
    let _ = outbox.send(Vec::new());
    drop(outbox);
    let _ = writer.await;
    app.clients.fetch_sub(1, Ordering::SeqCst);
}

async fn read_frames(app: &Arc<App>, read: tokio::net::unix::OwnedReadHalf, outbox: &Outbox) {
    let mut frames = FramedRead::new(read, protocol::FrameCodec::new());
    let mut greeted = false;
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(next) = frames.next().await {
        let bytes = match next {
            Ok(bytes) => bytes,
            Err(protocol::CodecError::Frame(error)) => {
                let _ = outbox.send(error_frame(&error.code().to_string(), error.message()));
                break;
            }
            Err(protocol::CodecError::Io(_)) => break,
        };
        let decoded = match protocol::decode_client_frame(&bytes) {
            Ok(decoded) => decoded,
            Err(error) => {
                let _ = outbox.send(error_frame(&error.code().to_string(), error.message()));
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
                    let _ = outbox.send(error_frame(
                        "schemaInvalid",
                        "expected one client hello with a clientId",
                    ));
                    break;
                }
                if package_version.as_str() != PACKAGE_VERSION {
                    let _ = outbox.send(frame(&json!({
                        "schema": "pi-workflows.client.v1",
                        "type": "response",
                        "requestId": "hello",
                        "operation": "server.status",
                        "outcome": "unavailable",
                        "error": {
                            "code": "packageVersionMismatch",
                            "message": format!("this server is pi-workflows {PACKAGE_VERSION}; install matching pi-workflows packages"),
                        },
                    })));
                    break;
                }
                greeted = true;
            }
            ClientMessage::Request { .. } if greeted => {
                let app = app.clone();
                let outbox = outbox.clone();
                tasks.spawn(async move {
                    let response =
                        handlers::handle(&app, decoded.message, decoded.payload, &outbox).await;
                    if let Some(response) = response {
                        let _ = outbox.send(frame(&response));
                    }
                });
            }
            _ => {
                let _ = outbox.send(error_frame(
                    "schemaInvalid",
                    "expected a client hello, then requests",
                ));
                break;
            }
        }
    }
    // In-flight commands finish and store their receipts even after a disconnect.
    while tasks.join_next().await.is_some() {}
}
