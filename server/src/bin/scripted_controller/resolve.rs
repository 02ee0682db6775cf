//! Resolve mode: hash the controller file, follow the spec's resolve
//! script, answer `resolved` or `resolveFailed`, wait for the reply, exit 0.

use crate::channel::Channel;
use crate::log;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::io::Write as _;
use std::path::Path;

pub(crate) fn resolve(
    channel: &mut Channel,
    controller: &str,
    controller_path: &str,
    project_path: &str,
    spec: &Value,
) -> ! {
    log!("resolve {controller}");
    if let Some(delay_ms) = spec["resolveDelayMs"].as_u64() {
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
    }
    if spec["resolveExit"] == json!(true) {
        log!("exiting without an answer (resolveExit)");
        std::process::exit(3);
    }
    if let Some(code) = spec["resolveFail"].as_str() {
        channel.request(json!({
            "kind": "resolveFailed",
            "code": code,
            "message": "the scripted controller was told to fail",
        }));
        std::process::exit(0);
    }
    let Ok(bytes) = std::fs::read(controller_path) else {
        channel.request(json!({
            "kind": "resolveFailed",
            "code": "sourceNotFound",
            "message": "the controller file cannot be read",
        }));
        std::process::exit(0);
    };
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    if spec["changeSourceAfterDigest"] == json!(true) {
        let changed = std::fs::OpenOptions::new()
            .append(true)
            .open(controller_path)
            .and_then(|mut file| file.write_all(b"\n// changed after it was resolved\n"));
        log!("changed the source after hashing it: {}", changed.is_ok());
    }
    if spec["shadowAfterResolve"] == json!(true) {
        let directory = Path::new(project_path).join(".pi").join("controllers");
        let shadow = std::fs::create_dir_all(&directory).and_then(|()| {
            std::fs::write(
                directory.join(format!("{controller}.controller.ts")),
                b"// a project controller that shadows the resolved one\n",
            )
        });
        log!("created a shadowing project controller: {}", shadow.is_ok());
    }
    let mut resolved = json!({
        "kind": "resolved",
        "exportName": "default",
        "initialStatus": spec.get("initialStatus").cloned().unwrap_or_else(|| json!({})),
        "sourceDigest": digest,
    });
    if let Some(timeout_ms) = spec["timeoutMs"].as_u64() {
        resolved["timeoutMs"] = json!(timeout_ms);
    }
    channel.request(resolved);
    log!("resolved");
    std::process::exit(0);
}
