//! `pi-workflows-telegram-adapter`: the transport-only child the server
//! runs for one configured Telegram profile (docs/CHANNELS.md).
//!
//! It reads one launch line on stdin (epoch, profile, Bot API base, the
//! profile's one credential, the allowed user and chat ids), then speaks
//! the private channel protocol: NDJSON, one message a line, each with the
//! adapter epoch, profile, a growing sequence, the channel revision it
//! expects and the attempt id. It sends what the server tells it to
//! (`channel.present`: the rendered text and the button labels; nothing
//! else of the decision), edits the messages of a decided decision to its
//! settled text without buttons (`channel.settle`: the text and the chat
//! and message ids), long-polls `getUpdates` for button presses and
//! replies, and reports presses from allowed identities (`channel.answer`).
//! A press on a choice that takes text gets a verdict with `awaitText`: the
//! presser's next reply (to a message) in that chat is reported as that
//! choice's answer with its text. It opens no
//! database, loads no workflow code and changes no run state: the server
//! checks and decides everything it reports.
//!
//! Invariants:
//! - The token is used only in request paths; it is never printed, logged
//!   or reported (errors name the Bot API method, never the URL).
//! - A send or edit whose request may have left (written, then no complete
//!   answer) is reported `unknown`, never retried here; one that never
//!   connected is a retryable refusal; a Bot API refusal is a refusal
//!   (retryable for 429 and 5xx). An edit the Bot API refuses as "message
//!   is not modified" already shows the settled text: it counts as done.
//! - stdin closing means the server is gone: the adapter exits.
//! - A reply's text is reported to the server and nowhere else (never
//!   printed or logged); a reply counts only from an allowed user in an
//!   allowed chat who pressed a text choice there, once.

mod http;

use serde_json::{Value, json};
use std::collections::HashMap;
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

/// A press as the adapter reported it: what a reply with text answers.
#[derive(Clone)]
struct Press {
    attempt_id: String,
    revision: u64,
    index: u64,
    user: i64,
    chat: i64,
}

/// Presses waiting for their verdict (by event id), and the text choices
/// waiting for a reply (by user and chat). Bounded: a map past
/// [`MAX_PENDING`] entries starts again empty.
#[derive(Default)]
struct Pending {
    presses: HashMap<String, Press>,
    awaiting_text: HashMap<(i64, i64), Press>,
}

const MAX_PENDING: usize = 1024;

/// The adapter's side of the channel: the header fields and stdout.
struct Channel {
    epoch: u64,
    profile: String,
    sequence: AtomicU64,
    out: Mutex<std::io::Stdout>,
    /// Test fault (`PI_WORKFLOWS_ADAPTER_FAULT=stale_epoch`): answers and
    /// settlement reports name the previous epoch, as a replaced adapter
    /// would. Unset in production.
    stale_epoch: bool,
}

impl Channel {
    fn send(&self, kind: &str, attempt_id: Option<&str>, expected_revision: u64, fields: Value) {
        let epoch = if self.stale_epoch && (kind == "channel.answer" || kind == "channel.settle") {
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
    let pending = Arc::new(Mutex::new(Pending::default()));
    {
        let (api, channel, allowed, pending) = (
            api.clone(),
            channel.clone(),
            allowed.clone(),
            pending.clone(),
        );
        let timeout = launch.poll_timeout_s;
        std::thread::spawn(move || poll(&api, &channel, &allowed, &pending, timeout));
    }
    channel.send("channel.ready", None, 0, json!({}));
    for line in lines {
        let Ok(line) = line else { break };
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        match message["kind"].as_str() {
            Some("channel.present") => present(&api, &channel, &allowed.1, &message),
            Some("channel.settle") => settle(&api, &channel, &message),
            Some("channel.answer") => verdict(&api, &pending, &message),
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
            Ok(http::Answer::Refused { retryable, .. }) => {
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

/// Edits each message of a decided decision to its settled text, without
/// buttons, and reports the attempt.
fn settle(api: &http::Api, channel: &Channel, message: &Value) {
    let attempt_id = message["attemptId"].as_str().unwrap_or_default();
    let revision = message["expectedRevision"].as_u64().unwrap_or_default();
    for sent in message["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let (Some(Ok(chat)), Some(Ok(message_id))) = (
            sent["chatId"].as_str().map(str::parse::<i64>),
            sent["messageId"].as_str().map(str::parse::<i64>),
        ) else {
            continue;
        };
        let body = json!({
            "chat_id": chat,
            "message_id": message_id,
            "text": message["text"],
            "reply_markup": {"inline_keyboard": []},
        });
        let report = match api.call("editMessageText", &body) {
            Ok(
                http::Answer::Ok(_)
                | http::Answer::Refused {
                    not_modified: true, ..
                },
            ) => continue,
            Ok(http::Answer::Refused { retryable, .. }) => {
                json!({"outcome": "refused", "retryable": retryable})
            }
            Err(http::Failure::NotSent) => json!({"outcome": "refused", "retryable": true}),
            Err(http::Failure::Unknown) => json!({"outcome": "unknown"}),
        };
        channel.send("channel.settle", Some(attempt_id), revision, report);
        return;
    }
    channel.send(
        "channel.settle",
        Some(attempt_id),
        revision,
        json!({"outcome": "delivered"}),
    );
}

/// The server's verdict on a press: answers the callback query with it,
/// and with `awaitText` waits for the presser's reply. A reply has no
/// callback query to answer.
fn verdict(api: &http::Api, pending: &Mutex<Pending>, message: &Value) {
    let event_id = message["eventId"].as_str().unwrap_or_default();
    if event_id.starts_with("reply-") {
        return;
    }
    let press = lock(pending).presses.remove(event_id);
    if let (Some(press), Value::Bool(true)) = (press, &message["awaitText"]) {
        let mut pending = lock(pending);
        if pending.awaiting_text.len() >= MAX_PENDING {
            pending.awaiting_text.clear();
        }
        pending
            .awaiting_text
            .insert((press.user, press.chat), press);
    }
    let body = json!({
        "callback_query_id": event_id,
        "text": message["note"],
    });
    if api.call("answerCallbackQuery", &body).is_err() {
        eprintln!("telegram adapter: answerCallbackQuery failed");
    }
}

fn lock(pending: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    pending
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Reports `press` (with `text` for a reply) as `event_id`.
fn report_answer(channel: &Channel, press: &Press, event_id: &str, text: Option<&str>) {
    let mut fields = json!({
        "choiceIndex": press.index,
        "userId": press.user.to_string(),
        "chatId": press.chat.to_string(),
        "eventId": event_id,
    });
    if let (Some(text), Some(fields)) = (text, fields.as_object_mut()) {
        fields.insert("text".into(), Value::String(text.into()));
    }
    channel.send(
        "channel.answer",
        Some(&press.attempt_id),
        press.revision,
        fields,
    );
}

/// A reply in an allowed chat from an allowed user who pressed a choice
/// that takes text there: reported once, as that choice's answer.
fn reply(
    channel: &Channel,
    allowed: &(Vec<i64>, Vec<i64>),
    pending: &Mutex<Pending>,
    message: &Value,
) {
    let (Some(user), Some(chat), Some(message_id), Some(text)) = (
        message["from"]["id"].as_i64(),
        message["chat"]["id"].as_i64(),
        message["message_id"].as_i64(),
        message["text"].as_str(),
    ) else {
        return;
    };
    if message["reply_to_message"].is_null()
        || !allowed.0.contains(&user)
        || !allowed.1.contains(&chat)
    {
        return;
    }
    let press = lock(pending).awaiting_text.remove(&(user, chat));
    if let Some(press) = press {
        report_answer(
            channel,
            &press,
            &format!("reply-{chat}-{message_id}"),
            Some(text),
        );
    }
}

/// Long-polls button presses and replies, and reports those of allowed
/// identities.
fn poll(
    api: &http::Api,
    channel: &Channel,
    allowed: &(Vec<i64>, Vec<i64>),
    pending: &Mutex<Pending>,
    timeout_s: u64,
) {
    let mut offset: i64 = 0;
    loop {
        let body = json!({"offset": offset, "timeout": timeout_s, "allowed_updates": ["callback_query", "message"]});
        let updates = match api.call("getUpdates", &body) {
            Ok(http::Answer::Ok(Value::Array(updates))) => updates,
            _ => {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        for update in updates {
            offset = offset.max(update["update_id"].as_i64().unwrap_or_default() + 1);
            if update["message"].is_object() {
                reply(channel, allowed, pending, &update["message"]);
                continue;
            }
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
            let press = Press {
                attempt_id: attempt_id.into(),
                revision,
                index,
                user,
                chat,
            };
            {
                let mut pending = lock(pending);
                if pending.presses.len() >= MAX_PENDING {
                    pending.presses.clear();
                }
                pending.presses.insert(event_id.into(), press.clone());
            }
            report_answer(channel, &press, event_id, None);
        }
    }
}
