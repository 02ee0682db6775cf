//! `piw --connect ws://127.0.0.1:PORT/ws`: the client library's
//! [`Dialer`] over a WebSocket to `piw serve`.
//!
//! Invariants:
//! - Each dial opens one WebSocket, so one client connection is one relay
//!   connection is one server-socket connection. The bridge between the
//!   WebSocket and the client's NDJSON transport is the relay's own
//!   [`pump`](crate::relay::pump): one message is one frame (the bytes plus
//!   `\n`), one frame is one message (the bytes without it); nothing is
//!   re-encoded.
//! - When the WebSocket ends, the transport ends: the client sees a lost
//!   connection, dials again with its backoff and restores the run list
//!   and the selected run from the revision it holds.
//! - A refused dial is one line: the relay's own reason (for example that
//!   the server is not running) or how to reach a relay.

use pi_workflows_client::{ClientError, DialFuture, Dialer};
use tokio_tungstenite::tungstenite;

/// Bytes buffered between the WebSocket and the client.
const BRIDGE_BYTES: usize = 256 * 1024;

/// Checks a `--connect` URL: `ws://HOST:PORT/PATH`.
pub fn check_url(url: &str) -> Result<String, String> {
    let rest = url.strip_prefix("ws://").ok_or_else(|| {
        format!("`{url}` is not a ws:// URL; connect like --connect ws://127.0.0.1:9377/ws")
    })?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!(
            "`{url}` names no host; connect like --connect ws://127.0.0.1:9377/ws"
        ));
    }
    Ok(url.to_owned())
}

/// The line shown while the relay at `url` cannot be reached.
pub fn unreachable_line(url: &str) -> String {
    format!(
        "no piw relay answers at {url}; start `piw serve` where the server runs (and tunnel it: ssh -L 9377:127.0.0.1:9377 HOST)"
    )
}

/// A dialer that opens one WebSocket to `url` per connection.
pub fn dialer(url: String) -> Dialer {
    Dialer::new(move || -> DialFuture {
        let url = url.clone();
        Box::pin(async move { dial(&url).await })
    })
}

async fn dial(
    url: &str,
) -> Result<
    (
        pi_workflows_client::TransportRead,
        pi_workflows_client::TransportWrite,
    ),
    ClientError,
> {
    let (socket, _) = match tokio_tungstenite::connect_async(url).await {
        Ok(connected) => connected,
        Err(tungstenite::Error::Http(response)) => {
            let reason = response
                .body()
                .as_deref()
                .and_then(|body| std::str::from_utf8(body).ok())
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.contains('\n'))
                .map(str::to_owned);
            return Err(match reason {
                Some(line) if response.status().as_u16() == 503 => ClientError::StartFailed(line),
                Some(line) => ClientError::ConnectionRefused(line),
                None => ClientError::ConnectionRefused(format!(
                    "the relay answered HTTP {}",
                    response.status().as_u16()
                )),
            });
        }
        Err(_) => return Err(ClientError::Unavailable),
    };
    let (ours, theirs) = tokio::io::duplex(BRIDGE_BYTES);
    let (read, write) = tokio::io::split(theirs);
    tokio::spawn(crate::relay::pump(socket, read, write));
    let (read, write) = tokio::io::split(ours);
    Ok((Box::new(read), Box::new(write)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_ws_with_a_host() {
        assert!(check_url("ws://127.0.0.1:9377/ws").is_ok());
        assert!(
            check_url("http://127.0.0.1:9377/ws")
                .unwrap_err()
                .contains("ws://")
        );
        assert!(check_url("ws:///ws").unwrap_err().contains("no host"));
    }
}
