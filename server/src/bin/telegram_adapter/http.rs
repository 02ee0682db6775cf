//! The Bot API over plain HTTP/1.1 (`POST <base>/bot<token>/<method>`, a
//! JSON body, `Connection: close`).
//!
//! Only `http://` bases are built in: a local Bot API server, a TLS proxy
//! on the machine, or the tests' fake server. An `https://` base is refused
//! at launch with one clear reason (no TLS library is linked).
//!
//! Invariant: what may have reached the Bot API is told apart from what
//! did not. A connection that never opened is [`Failure::NotSent`]; a
//! request written with no complete answer read back is
//! [`Failure::Unknown`].

use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A Bot API endpoint with its credential.
pub(crate) struct Api {
    authority: String,
    prefix: String,
    token: String,
}

/// A complete Bot API answer.
pub(crate) enum Answer {
    /// `ok: true` and its `result`.
    Ok(Value),
    /// `ok: false` (or an HTTP error status): retryable for 429 and 5xx;
    /// `not_modified` when an edit would not change the message (it shows
    /// that text already).
    Refused { retryable: bool, not_modified: bool },
}

/// A request without a complete answer.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Nothing was sent: the connection did not open.
    NotSent,
    /// The request may have arrived.
    Unknown,
}

impl Api {
    pub(crate) fn new(base: &str, token: &str) -> Result<Self, &'static str> {
        let Some(rest) = base.strip_prefix("http://") else {
            return Err(
                "only an http:// Bot API base is built in (a local Bot API server or TLS proxy)",
            );
        };
        let (authority, prefix) = match rest.find('/') {
            Some(at) => (&rest[..at], rest[at..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() || token.is_empty() || token.contains(['/', ' ', '\r', '\n']) {
            return Err("the Bot API base or the credential is malformed");
        }
        Ok(Self {
            authority: authority.into(),
            prefix: prefix.into(),
            token: token.into(),
        })
    }

    /// Calls `method` with `body`.
    pub(crate) fn call(&self, method: &str, body: &Value) -> Result<Answer, Failure> {
        let mut stream = TcpStream::connect(&self.authority).map_err(|_| Failure::NotSent)?;
        let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
        let body = body.to_string();
        let request = format!(
            "POST {}/bot{}/{method} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.prefix,
            self.token,
            self.authority,
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|_| Failure::Unknown)?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .map_err(|_| Failure::Unknown)?;
        let text = String::from_utf8_lossy(&response);
        let (head, payload) = text.split_once("\r\n\r\n").ok_or(Failure::Unknown)?;
        let status: u16 = head
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or(Failure::Unknown)?;
        let value: Value = serde_json::from_str(payload).unwrap_or(Value::Null);
        if status == 200 && value["ok"] == Value::Bool(true) {
            return Ok(Answer::Ok(value["result"].clone()));
        }
        let not_modified = value["description"]
            .as_str()
            .is_some_and(|description| description.contains("message is not modified"));
        Ok(Answer::Refused {
            retryable: status == 429 || status >= 500,
            not_modified,
        })
    }
}
