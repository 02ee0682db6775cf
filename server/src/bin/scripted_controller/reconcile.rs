//! Reconcile mode: one pass under a claim, following a script in the
//! resource's spec. Each step is one `ControllerChildMessage` (or a local
//! action) and waits for its reply.
//!
//! The spec's `reconcile` is the list of steps of a pass; when the
//! resource is marked for deletion (`metadata.deletionTimestamp`), the
//! list in `reconcileDeleting` runs instead. Steps:
//! - `{"effect": {"key", "log": "<file>", "line": "<text>", "crashAfterApply"?: "<marker file>"}}`:
//!   `ctx.effects.ensure` of an effect whose apply appends `line` to `log`
//!   and whose observe reads `log` (applied when it holds the line). With
//!   `crashAfterApply`, the first apply (the marker file absent: it is
//!   created) kills the child with SIGKILL right after appending.
//! - `{"sleep": ms}`: sleeps, ignoring SIGTERM (a non-cooperative pass).
//! - `{"writePid": "<file>"}`: writes the child's pid to the file.
//! - `{"once": "<marker file>", "steps": [...]}`: the nested steps only
//!   while the marker file is absent (it is created first).
//! - `{"finish": "settled" | "requeue" | "requeueAfter", "afterMs"?, "patch"?}`:
//!   `finished` with the wire status patch; the pass ends.
//! - `{"fail": "<message>"}`: `failed`; the pass ends.
//! - `{"exit": code}`: exits at once without finishing.
//!
//! With no finishing step the pass ends `finished settled {}`. A rejected
//! reply ends the pass with `failed`.

use crate::channel::Channel;
use crate::log;
use protocol::generated::types::ControllerLaunch;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::io::Write as _;
use std::path::Path;

pub(crate) fn reconcile(channel: &mut Channel, launch: &ControllerLaunch) -> ! {
    let ControllerLaunch::ControllerReconcile { resource, .. } = launch else {
        std::process::exit(crate::EXIT_PROTOCOL);
    };
    let deleting = resource.metadata.deletion_timestamp.is_some();
    let script = if deleting {
        &resource.spec["reconcileDeleting"]
    } else {
        &resource.spec["reconcile"]
    };
    let steps = script.as_array().cloned().unwrap_or_default();
    log!(
        "reconcile: {} step(s){}",
        steps.len(),
        if deleting { " (deleting)" } else { "" }
    );
    run(channel, &steps);
    finish(
        channel,
        json!({"kind": "finished", "result": "settled", "patch": {}}),
    );
}

fn run(channel: &mut Channel, steps: &[Value]) {
    for step in steps {
        if let Some(effect) = step.get("effect") {
            ensure_effect(channel, effect);
        } else if let Some(ms) = step.get("sleep").and_then(Value::as_u64) {
            // A non-cooperative pass: SIGTERM does not stop it.
            let _ = signal_hook::flag::register(
                signal_hook::consts::SIGTERM,
                std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
            );
            std::thread::sleep(std::time::Duration::from_millis(ms));
        } else if let Some(file) = step.get("writePid").and_then(Value::as_str) {
            let _ = std::fs::write(file, std::process::id().to_string());
        } else if let Some(marker) = step.get("once").and_then(Value::as_str) {
            if !Path::new(marker).exists() {
                let _ = std::fs::write(marker, b"");
                run(channel, step["steps"].as_array().map_or(&[], Vec::as_slice));
            }
        } else if let Some(result) = step.get("finish").and_then(Value::as_str) {
            let mut message = json!({
                "kind": "finished",
                "result": result,
                "patch": step.get("patch").cloned().unwrap_or(json!({})),
            });
            if let Some(after) = step.get("afterMs") {
                message["afterMs"] = after.clone();
            }
            finish(channel, message);
        } else if let Some(text) = step.get("fail").and_then(Value::as_str) {
            finish(channel, json!({"kind": "failed", "message": text}));
        } else if let Some(code) = step.get("exit").and_then(Value::as_i64) {
            log!("reconcile: exiting without finishing");
            std::process::exit(code as i32);
        } else {
            finish(
                channel,
                json!({"kind": "failed", "message": "the scripted controller has an unknown step"}),
            );
        }
    }
}

/// Sends the pass's last message and exits 0 after its reply.
fn finish(channel: &mut Channel, message: Value) -> ! {
    let reply = channel.request(message);
    log!(
        "reconcile: finished ({})",
        reply["finishOutcome"]
            .as_str()
            .unwrap_or(reply["outcome"].as_str().unwrap_or("?"))
    );
    std::process::exit(0);
}

fn rejected(channel: &mut Channel, reply: &Value) -> ! {
    log!(
        "reconcile: a request was rejected ({})",
        reply["code"].as_str().unwrap_or("?")
    );
    finish(
        channel,
        json!({"kind": "failed", "message": "the server rejected a request of the pass"}),
    );
}

fn ensure_effect(channel: &mut Channel, effect: &Value) {
    let key = effect["key"].as_str().unwrap_or("effect");
    let log_path = effect["log"].as_str().unwrap_or_default().to_owned();
    let line = effect["line"].as_str().unwrap_or_default().to_owned();
    let request = json!({"log": log_path, "line": line});
    let canonical = protocol::canonicalize(&request).unwrap_or_default();
    let fingerprint = format!("sha256:{}", hex::encode(Sha256::digest(&canonical)));
    let mut reply = channel.request(json!({
        "kind": "effect.ensure",
        "key": key,
        "effectKind": "append-line",
        "requestFingerprint": fingerprint,
    }));
    loop {
        if reply["outcome"] != "accepted" {
            rejected(channel, &reply);
        }
        match reply["effectAction"].as_str() {
            Some("apply") => {
                log!("reconcile: applying the effect");
                let appended = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log_path)
                    .and_then(|mut file| writeln!(file, "{line}").and_then(|()| file.sync_all()));
                if let Some(marker) = effect["crashAfterApply"].as_str()
                    && !Path::new(marker).exists()
                {
                    let _ = std::fs::write(marker, b"");
                    log!("reconcile: killing itself after the apply");
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::this(),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let result = if appended.is_ok() {
                    "applied"
                } else {
                    "indeterminate"
                };
                reply = channel.request(json!({
                    "kind": "effect.settled",
                    "key": key,
                    "applyResult": result,
                }));
                if reply["outcome"] != "accepted" {
                    rejected(channel, &reply);
                }
                return;
            }
            Some("observe") => {
                let held = std::fs::read_to_string(&log_path)
                    .map(|text| text.lines().any(|held| held == line))
                    .unwrap_or(false);
                log!(
                    "reconcile: observed the effect ({})",
                    if held { "applied" } else { "not applied" }
                );
                reply = channel.request(json!({
                    "kind": "effect.observed",
                    "key": key,
                    "observation": if held { "applied" } else { "notApplied" },
                }));
            }
            _ => return,
        }
    }
}
