//! The child's side of the controller.v1 channel: one canonical JSON object
//! per line, `requestId` 1, 2, … and a blocking wait for each reply.

use serde_json::Value;
use std::io::{BufRead, Write};

use crate::{EXIT_PROTOCOL, log};

pub(crate) struct Channel {
    stdin: std::io::StdinLock<'static>,
    next_request_id: u64,
}

impl Channel {
    pub(crate) fn new() -> Self {
        Self {
            stdin: std::io::stdin().lock(),
            next_request_id: 1,
        }
    }

    /// The next stdin line without its newline; `None` at EOF.
    pub(crate) fn read_line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.stdin.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim_end_matches('\n').to_owned()),
        }
    }

    /// Sends `message` (its `requestId` added) and returns the reply.
    pub(crate) fn request(&mut self, mut message: Value) -> Value {
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        message["requestId"] = Value::from(request_id);
        let mut bytes = protocol::canonicalize(&message).unwrap_or_else(|_| {
            log!("a message could not be encoded");
            std::process::exit(EXIT_PROTOCOL);
        });
        bytes.push(b'\n');
        let mut stdout = std::io::stdout().lock();
        if stdout
            .write_all(&bytes)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            log!("stdout closed");
            std::process::exit(EXIT_PROTOCOL);
        }
        drop(stdout);
        let Some(line) = self.read_line() else {
            log!("stdin closed before the reply of request {request_id}");
            std::process::exit(EXIT_PROTOCOL);
        };
        let reply: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if reply["kind"] != "reply" || reply["requestId"] != request_id {
            log!("an unexpected line instead of the reply of request {request_id}");
            std::process::exit(EXIT_PROTOCOL);
        }
        reply
    }
}
