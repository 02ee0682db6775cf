//! A fake Telegram Bot API on 127.0.0.1 for the channel tests: it answers
//! `getUpdates` (long-polled, from a queue of presses and replies the test
//! adds),
//! `sendMessage`, `editMessageText` and `answerCallbackQuery` at
//! `/bot<token>/<method>`, records every call, and can drop the connection
//! of the next `sendMessage` after reading it (an ambiguous send) or hold
//! every `sendMessage` or `editMessageText` without answering (a send or an
//! edit in flight). Like the Bot API, it refuses an edit that would not
//! change the message ("message is not modified").

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One recorded call.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    pub token: String,
    pub body: Value,
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    updates: Vec<Value>,
    next_update: i64,
    next_message: i64,
    drop_next_send: bool,
    hold_sends: bool,
    hold_edits: bool,
    /// Where each sent message landed: (chat id, message id).
    sent: Vec<(i64, i64)>,
    /// The text each edited message shows now.
    edited: std::collections::BTreeMap<(i64, i64), Value>,
}

/// The fake server.
pub struct FakeTelegram {
    port: u16,
    token: String,
    shared: Arc<(Mutex<State>, Condvar)>,
}

impl FakeTelegram {
    /// Starts serving `token` on a free loopback port.
    pub fn start(token: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake Bot API");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let for_accept = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = for_accept.clone();
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        Self {
            port,
            token: token.into(),
            shared,
        }
    }

    /// The profile's `apiBase`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Queues a button press of `user` in `chat` with `data`; returns its id.
    pub fn press(&self, user: i64, chat: i64, data: &str) -> String {
        let (lock, ready) = &*self.shared;
        let mut state = lock.lock().unwrap();
        state.next_update += 1;
        let id = format!("press-{}", state.next_update);
        let update = json!({
            "update_id": state.next_update,
            "callback_query": {
                "id": id,
                "from": {"id": user},
                "message": {"message_id": 1, "chat": {"id": chat}},
                "data": data,
            },
        });
        state.updates.push(update);
        ready.notify_all();
        id
    }

    /// Queues a message of `user` in `chat` replying to message `reply_to`
    /// with `text`; returns the event id the adapter reports it under.
    pub fn reply(&self, user: i64, chat: i64, reply_to: i64, text: &str) -> String {
        let (lock, ready) = &*self.shared;
        let mut state = lock.lock().unwrap();
        state.next_update += 1;
        let message_id = 10_000 + state.next_update;
        let update = json!({
            "update_id": state.next_update,
            "message": {
                "message_id": message_id,
                "from": {"id": user},
                "chat": {"id": chat},
                "text": text,
                "reply_to_message": {"message_id": reply_to, "chat": {"id": chat}},
            },
        });
        state.updates.push(update);
        ready.notify_all();
        format!("reply-{chat}-{message_id}")
    }

    /// Drops the connection of the next `sendMessage` after reading it.
    pub fn drop_next_send(&self) {
        self.shared.0.lock().unwrap().drop_next_send = true;
    }

    /// Holds every `sendMessage` without an answer (or stops holding).
    pub fn hold_sends(&self, hold: bool) {
        self.shared.0.lock().unwrap().hold_sends = hold;
    }

    /// Holds every `editMessageText` without an answer (or stops holding).
    pub fn hold_edits(&self, hold: bool) {
        self.shared.0.lock().unwrap().hold_edits = hold;
    }

    /// Where every answered `sendMessage` landed: (chat id, message id).
    pub fn sent(&self) -> Vec<(i64, i64)> {
        self.shared.0.lock().unwrap().sent.clone()
    }

    /// Every call of `method` so far.
    pub fn calls(&self, method: &str) -> Vec<Call> {
        let state = self.shared.0.lock().unwrap();
        state
            .calls
            .iter()
            .filter(|call| call.method == method)
            .cloned()
            .collect()
    }

    /// Every call's body as text (for redaction checks).
    pub fn all_bodies(&self) -> String {
        let state = self.shared.0.lock().unwrap();
        state
            .calls
            .iter()
            .map(|call| call.body.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until `method` was called `n` times; returns those calls.
    pub fn wait_calls(&self, method: &str, n: usize, timeout: Duration) -> Vec<Call> {
        let deadline = Instant::now() + timeout;
        loop {
            let calls = self.calls(method);
            if calls.len() >= n {
                return calls;
            }
            assert!(
                Instant::now() < deadline,
                "{method} was called {} times, not {n}",
                calls.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The token every call used.
    pub fn token(&self) -> &str {
        &self.token
    }
}

fn serve(mut stream: TcpStream, shared: &(Mutex<State>, Condvar)) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let path = request_line.split(' ').nth(1).unwrap_or_default();
    let Some((token, method)) = path
        .strip_prefix("/bot")
        .and_then(|rest| rest.split_once('/'))
    else {
        return respond(&mut stream, 404, &json!({"ok": false}));
    };
    let (lock, ready) = shared;
    let mut state = lock.lock().unwrap();
    state.calls.push(Call {
        method: method.into(),
        token: token.into(),
        body: body.clone(),
    });
    let answer = match method {
        "getUpdates" => {
            let offset = body["offset"].as_i64().unwrap_or(0);
            let deadline = Instant::now() + Duration::from_millis(500);
            loop {
                let pending: Vec<Value> = state
                    .updates
                    .iter()
                    .filter(|update| update["update_id"].as_i64().unwrap_or(0) >= offset)
                    .cloned()
                    .collect();
                let left = deadline.saturating_duration_since(Instant::now());
                if !pending.is_empty() || left.is_zero() {
                    break json!({"ok": true, "result": pending});
                }
                state = ready.wait_timeout(state, left).unwrap().0;
            }
        }
        "sendMessage" => {
            if state.drop_next_send {
                state.drop_next_send = false;
                drop(state);
                let _ = stream.shutdown(std::net::Shutdown::Both);
                return;
            }
            if state.hold_sends {
                drop(state);
                std::thread::sleep(Duration::from_secs(600));
                return;
            }
            state.next_message += 1;
            let landed = (body["chat_id"].as_i64().unwrap_or(0), state.next_message);
            state.sent.push(landed);
            json!({"ok": true, "result": {"message_id": state.next_message, "chat": {"id": body["chat_id"]}}})
        }
        "editMessageText" => {
            if state.hold_edits {
                drop(state);
                std::thread::sleep(Duration::from_secs(600));
                return;
            }
            let message = (
                body["chat_id"].as_i64().unwrap_or(0),
                body["message_id"].as_i64().unwrap_or(0),
            );
            if state.edited.get(&message) == Some(&body["text"]) {
                drop(state);
                return respond(
                    &mut stream,
                    400,
                    &json!({"ok": false, "error_code": 400, "description": "Bad Request: message is not modified"}),
                );
            }
            state.edited.insert(message, body["text"].clone());
            json!({"ok": true, "result": true})
        }
        "answerCallbackQuery" => json!({"ok": true, "result": true}),
        _ => json!({"ok": false, "description": "unknown method"}),
    };
    drop(state);
    respond(&mut stream, 200, &answer);
}

fn respond(stream: &mut TcpStream, status: u16, body: &Value) {
    let text = body.to_string();
    let _ = write!(
        stream,
        "HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}
