//! `pi-workflows-telegram-adapter`: the transport-only child the server
//! runs for one configured Telegram profile (docs/CHANNELS.md).
//!
//! It reads one launch line on stdin (epoch, profile, Bot API base, the
//! profile's one credential, the allowed user and chat ids), then speaks
//! the private channel protocol: NDJSON, one message a line, each with the
//! adapter epoch, profile, a growing sequence, the channel revision it
//! expects and the attempt id. It sends what the server tells it to
//! (`channel.present`: the rendered text and the button labels; nothing
//! else of the decision), long-polls `getUpdates` for button presses, and
//! reports presses from allowed identities (`channel.answer`). It opens no
//! database, loads no workflow code and changes no run state: the server
//! checks and decides everything it reports.
//!
//! Invariants:
//! - The token is used only in request paths; it is never printed, logged
//!   or reported (errors name the Bot API method, never the URL).
//! - A send whose request may have left (written, then no complete answer)
//!   is reported `unknown`, never retried here; a send that never connected
//!   is a retryable refusal; a Bot API refusal is a refusal (retryable for
//!   429 and 5xx).
//! - stdin closing means the server is gone: the adapter exits.

mod http;

use serde_json::{Value, json};
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The launch line.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Launch {
    kind: String,
    epoch: u64,
    profile: String,
    api_base: String,
    token: String,
    allowed_user_ids: Vec<String>,
    allowed_chat_ids: Vec<String>,
    poll_timeout_s: u64,
}

/// The adapter's side of the channel: the header fields and stdout.
struct Channel {
    epoch: u64,
    profile: String,
    sequence: AtomicU64,
    out: Mutex<std::io::Stdout>,
    /// Test fault (`PI_WORKFLOWS_ADAPTER_FAULT=stale_epoch`): answers name
    /// the previous epoch, as a replaced adapter would. Unset in production.
    stale_epoch: bool,
}

impl Channel {
    fn send(&self, kind: &str, attempt_id: Option<&str>, expected_revision: u64, fields: Value) {
        let epoch = if self.stale_epoch && kind == "channel.answer" {
            self.epoch.saturating_sub(1)
        } else {
            self.epoch
        };
        let mut message = json!({
            "kind": kind,
            "epoch": epoch,
            "profile": self.profile,
            "sequence": self.sequence.fetch_add(1, Ordering::SeqCst) + 1,
            "expectedRevision": expected_revision,
            "attemptId": attempt_id,
        });
        if let (Some(message), Value::Object(fields)) = (message.as_object_mut(), fields) {
            message.extend(fields);
        }
        let mut out = self
            .out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = writeln!(out, "{message}");
        let _ = out.flush();
    }
}

fn main() {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let Some(Ok(first)) = lines.next() else {
        eprintln!("telegram adapter: no launch line");
        std::process::exit(2);
    };
    let launch: Launch = match serde_json::from_str(&first) {
        Ok(launch) => launch,
        Err(_) => {
            eprintln!("telegram adapter: the launch line is not a channel launch");
            std::process::exit(2);
        }
    };
    if launch.kind != "channel.launch" {
        eprintln!("telegram adapter: the launch line is not a channel launch");
        std::process::exit(2);
    }
    let api = match http::Api::new(&launch.api_base, &launch.token) {
        Ok(api) => Arc::new(api),
        Err(reason) => {
            eprintln!("telegram adapter: {reason}");
            std::process::exit(2);
        }
    };
    let channel = Arc::new(Channel {
        epoch: launch.epoch,
        profile: launch.profile.clone(),
        sequence: AtomicU64::new(0),
        out: Mutex::new(std::io::stdout()),
        stale_epoch: std::env::var("PI_WORKFLOWS_ADAPTER_FAULT").as_deref() == Ok("stale_epoch"),
    });
    let ids =
        |ids: &[String]| -> Vec<i64> { ids.iter().filter_map(|id| id.parse().ok()).collect() };
    let allowed = Arc::new((ids(&launch.allowed_user_ids), ids(&launch.allowed_chat_ids)));
    {
        let (api, channel, allowed) = (api.clone(), channel.clone(), allowed.clone());
        let timeout = launch.poll_timeout_s;
        std::thread::spawn(move || poll(&api, &channel, &allowed, timeout));
    }
    channel.send("channel.ready", None, 0, json!({}));
    for line in lines {
        let Ok(line) = line else { break };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        match message["kind"].as_str() {
            Some("channel.present") => present(&api, &channel, &allowed.1, &message),
            Some("channel.answer") => verdict(&api, &message),
            _ => eprintln!("telegram adapter: an unknown server message"),
        }
    }
    channel.send(
        "channel.exiting",
        None,
        0,
        json!({"reason": "the server closed the channel"}),
    );
}

/// Sends the presentation to every allowed chat and reports the attempt.
fn present(api: &http::Api, channel: &Channel, chats: &[i64], message: &Value) {
    let attempt_id = message["attemptId"].as_str().unwrap_or_default();
    let revision = message["expectedRevision"].as_u64().unwrap_or_default();
    let buttons: Vec<Value> = message["buttons"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(index, label)| {
            json!([{"text": label, "callback_data": format!("{attempt_id}|{revision}|{index}")}])
        })
        .collect();
    let mut sent = Vec::new();
    for chat in chats {
        let body = json!({
            "chat_id": chat,
            "text": message["text"],
            "reply_markup": {"inline_keyboard": buttons},
        });
        let report = match api.call("sendMessage", &body) {
            Ok(http::Answer::Ok(result)) => {
                let message_id = result["message_id"].as_i64().unwrap_or_default();
                sent.push(json!({"chatId": chat.to_string(), "messageId": message_id.to_string()}));
                continue;
            }
            Ok(http::Answer::Refused { retryable }) => {
                json!({"outcome": "refused", "retryable": retryable})
            }
            Err(http::Failure::NotSent) => json!({"outcome": "refused", "retryable": true}),
            Err(http::Failure::Unknown) => json!({"outcome": "unknown"}),
        };
        channel.send("channel.present", Some(attempt_id), revision, report);
        return;
    }
    channel.send(
        "channel.present",
        Some(attempt_id),
        revision,
        json!({"outcome": "delivered", "messages": sent}),
    );
}

/// The server's verdict on a press: answers the callback query with it.
fn verdict(api: &http::Api, message: &Value) {
    let body = json!({
        "callback_query_id": message["eventId"],
        "text": message["note"],
    });
    if api.call("answerCallbackQuery", &body).is_err() {
        eprintln!("telegram adapter: answerCallbackQuery failed");
    }
}

/// Long-polls button presses and reports those of allowed identities.
fn poll(api: &http::Api, channel: &Channel, allowed: &(Vec<i64>, Vec<i64>), timeout_s: u64) {
    let mut offset: i64 = 0;
    loop {
        let body =
            json!({"offset": offset, "timeout": timeout_s, "allowed_updates": ["callback_query"]});
        let updates = match api.call("getUpdates", &body) {
            Ok(http::Answer::Ok(Value::Array(updates))) => updates,
            _ => {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        for update in updates {
            offset = offset.max(update["update_id"].as_i64().unwrap_or_default() + 1);
            let press = &update["callback_query"];
            let (Some(event_id), Some(user), Some(chat), Some(data)) = (
                press["id"].as_str(),
                press["from"]["id"].as_i64(),
                press["message"]["chat"]["id"].as_i64(),
                press["data"].as_str(),
            ) else {
                continue;
            };
            if !allowed.0.contains(&user) || !allowed.1.contains(&chat) {
                let body = json!({"callback_query_id": event_id, "text": "You may not answer this decision."});
                let _ = api.call("answerCallbackQuery", &body);
                continue;
            }
            let mut parts = data.split('|');
            let (Some(attempt_id), Some(Ok(revision)), Some(Ok(index)), None) = (
                parts.next(),
                parts.next().map(str::parse::<u64>),
                parts.next().map(str::parse::<u64>),
                parts.next(),
            ) else {
                continue;
            };
            channel.send(
                "channel.answer",
                Some(attempt_id),
                revision,
                json!({"choiceIndex": index, "userId": user.to_string(), "chatId": chat.to_string(), "eventId": event_id}),
            );
        }
    }
}
