//! `piw serve`: the loopback WebSocket relay of `pi-workflows.client.v1`.
//!
//! Invariants:
//! - It binds loopback addresses only ([`check_bind`]); other machines
//!   reach it through an SSH tunnel.
//! - A handshake that carries an `Origin` header is refused (403): the
//!   relay serves no web page, so every Origin is foreign, and a browser
//!   page can never drive the server. Only the path [`PATH`] is served.
//! - One WebSocket is one connection to the server socket, opened for it
//!   and closed with it: when either side ends, the other is closed. A
//!   server that cannot be reached refuses the handshake (503) with the
//!   client library's one line.
//! - It carries frames only: one WebSocket text message is one canonical
//!   JSON object, written to the socket as that frame plus `\n`; one frame
//!   from the socket is one message of the same bytes without the `\n`.
//!   No translation, no multiplexing, no state, no database.
//! - A message that is not one canonical JSON object of at most the frame
//!   limit closes that WebSocket (and its socket connection) with a close
//!   reason; no other connection notices.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use futures_util::{SinkExt as _, StreamExt as _};
use pi_workflows_client::ClientError;
use protocol::MAX_FRAME_BYTES;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};
use tokio_util::codec::FramedRead;

/// The one path the relay serves.
pub const PATH: &str = "/ws";
/// The address `piw serve` binds without `--bind`.
pub const DEFAULT_BIND: &str = "127.0.0.1:9377";

/// Parses a bind address and refuses anything but a loopback IP (or
/// `localhost`), with one line that says what to do.
pub fn check_bind(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    let address = match text.strip_prefix("localhost:") {
        Some(port) => format!("127.0.0.1:{port}"),
        None => text.to_owned(),
    };
    let address: SocketAddr = address.parse().map_err(|_| {
        format!("`{text}` is not an address with a port; bind like --bind {DEFAULT_BIND}")
    })?;
    let loopback = match address.ip() {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => ip.is_loopback(),
    };
    if !loopback {
        return Err(format!(
            "piw serve binds loopback addresses only (127.0.0.1 or [::1]), not {}; reach it from another machine through an SSH tunnel (ssh -L {port}:127.0.0.1:{port} HOST)",
            address.ip(),
            port = address.port()
        ));
    }
    Ok(address)
}

/// A bound relay.
#[derive(Debug)]
pub struct Relay {
    listener: TcpListener,
    socket: PathBuf,
}

impl Relay {
    /// Binds `address` (checked with [`check_bind`]) for the server socket
    /// at `socket`.
    pub async fn bind(address: &str, socket: PathBuf) -> Result<Self, String> {
        let address = check_bind(address)?;
        let listener = TcpListener::bind(address).await.map_err(|error| {
            format!(
                "cannot listen on {address} ({}); pick another port with --bind",
                error.kind()
            )
        })?;
        Ok(Self { listener, socket })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Serves until the process ends; each WebSocket runs on its own task.
    pub async fn serve(self) {
        loop {
            let Ok((stream, _)) = self.listener.accept().await else {
                continue;
            };
            tokio::spawn(relay_one(stream, self.socket.clone()));
        }
    }
}

fn refusal(status: StatusCode, line: &str) -> ErrorResponse {
    let mut response = ErrorResponse::new(Some(line.to_owned()));
    *response.status_mut() = status;
    response
}

/// Relays one WebSocket to one socket connection, until either ends.
#[allow(clippy::result_large_err)] // tungstenite's callback type, not ours
async fn relay_one(stream: TcpStream, socket: PathBuf) {
    // The socket connection is opened first, so a handshake without a
    // server is refused with the reason.
    let server = UnixStream::connect(&socket).await;
    let reachable = server.is_ok();
    let callback = move |request: &Request, response: Response| {
        if request.headers().contains_key("origin") {
            return Err(refusal(
                StatusCode::FORBIDDEN,
                "piw serve refuses browser origins; connect with piw --connect",
            ));
        }
        if request.uri().path() != PATH {
            return Err(refusal(
                StatusCode::NOT_FOUND,
                &format!("piw serve relays at {PATH} only"),
            ));
        }
        if !reachable {
            return Err(refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                &ClientError::Unavailable.to_string(),
            ));
        }
        Ok(response)
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(2 * MAX_FRAME_BYTES))
        .max_frame_size(Some(2 * MAX_FRAME_BYTES));
    let Ok(socket_ws) =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config)).await
    else {
        return;
    };
    let Ok(server) = server else { return };
    let (read, write) = server.into_split();
    pump(socket_ws, read, write).await;
}

/// Moves frames between a WebSocket and an NDJSON byte stream until either
/// ends, then ends the other: each WebSocket message, checked with
/// [`check_message`] (a bad one closes the WebSocket with its reason), is
/// written as that frame plus `\n`; each frame read is sent as one text
/// message of the same bytes without the `\n`. `piw serve` pumps between a
/// WebSocket and the server socket, `piw --connect` between its WebSocket
/// and the client's transport.
pub async fn pump<S>(
    mut socket: tokio_tungstenite::WebSocketStream<S>,
    read: impl tokio::io::AsyncRead + Unpin,
    mut write: impl tokio::io::AsyncWrite + Unpin,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut frames = FramedRead::new(read, protocol::FrameCodec::new());
    loop {
        tokio::select! {
            message = socket.next() => {
                let bytes = match message {
                    Some(Ok(Message::Text(text))) => text.as_bytes().to_vec(),
                    Some(Ok(Message::Binary(bytes))) => bytes.to_vec(),
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                };
                if let Err((code, reason)) = check_message(&bytes) {
                    let frame = CloseFrame { code, reason: Utf8Bytes::from(reason) };
                    let _ = socket.close(Some(frame)).await;
                    break;
                }
                let mut framed = bytes;
                framed.push(b'\n');
                if write.write_all(&framed).await.is_err() {
                    break;
                }
            }
            frame = frames.next() => {
                let Some(Ok(frame)) = frame else { break };
                let content = &frame[..frame.len().saturating_sub(1)];
                let Ok(text) = std::str::from_utf8(content) else { break };
                if socket.send(Message::Text(Utf8Bytes::from(text))).await.is_err() {
                    break;
                }
            }
        }
    }
    // Either side ended: end the other (dropping the stream's halves closes
    // a server connection).
    let _ = socket.close(None).await;
    let _ = write.shutdown().await;
}

/// Whether one message is one frame: at most the frame limit with its
/// `\n`, and exactly one canonical JSON object.
pub fn check_message(bytes: &[u8]) -> Result<(), (CloseCode, &'static str)> {
    if bytes.len() + 1 > MAX_FRAME_BYTES {
        return Err((CloseCode::Size, "frameTooLarge: a frame is at most 1 MiB"));
    }
    match protocol::parse_canonical(bytes) {
        Ok(value) if value.is_object() => Ok(()),
        Ok(_) => Err((
            CloseCode::Invalid,
            "schemaInvalid: a frame is one JSON object",
        )),
        Err(_) => Err((
            CloseCode::Invalid,
            "nonCanonical: a frame is one canonical JSON object",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_binds_are_accepted() {
        assert!(check_bind("127.0.0.1:9377").is_ok());
        assert!(check_bind("[::1]:9377").is_ok());
        assert_eq!(
            check_bind("localhost:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        for refused in ["0.0.0.0:9377", "[::]:9377", "192.168.1.2:80", "10.0.0.1:1"] {
            let line = check_bind(refused).unwrap_err();
            assert!(line.contains("loopback addresses only"), "{line}");
            assert!(!line.contains('\n'));
        }
        assert!(check_bind("nonsense").unwrap_err().contains("--bind"));
    }

    #[test]
    fn a_message_is_one_canonical_object_within_the_frame_limit() {
        assert!(check_message(br#"{"a":1}"#).is_ok());
        assert_eq!(
            check_message(br#"{ "a": 1 }"#).unwrap_err().0,
            CloseCode::Invalid
        );
        assert_eq!(check_message(b"[1]").unwrap_err().0, CloseCode::Invalid);
        assert_eq!(
            check_message(b"{\"a\":1}\n").unwrap_err().0,
            CloseCode::Invalid
        );
        let big = format!("{{\"a\":\"{}\"}}", "x".repeat(MAX_FRAME_BYTES));
        assert_eq!(
            check_message(big.as_bytes()).unwrap_err().0,
            CloseCode::Size
        );
    }
}
