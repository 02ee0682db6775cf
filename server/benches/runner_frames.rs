//! The receive cost of one runner frame (issue 12, item 3) against a plain
//! `serde_json` parse of the same bytes, in the same run.
//!
//! Run: `cargo bench -p server --bench runner_frames`. Not a timed test: it
//! prints a table. For a 1 KiB and a 64 KiB `node.finished` frame (an output
//! of many small objects, so the bytes are mostly structure) it measures
//!
//! - parse: `serde_json::from_slice::<Value>` of the frame content;
//! - receive: what the server does with a frame it reads from a runner
//!   (`server::wire::runner::receive`): framing, nesting scan, parse,
//!   canonical check, typed decode and its round trip, once, and the
//!   receipt digest as the SHA-256 of the checked bytes;
//! - before: the receive path this replaced: the checks one by one (a
//!   canonical parse into a `Value`, the typed decode from it and its round
//!   trip back to it), then the digest of the typed message canonicalised
//!   again (the digests are asserted equal).
//!
//! `BENCH_MS` sets the time per cell (default 1500 ms).
#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

use protocol::generated::types::RunnerMessage;
use serde::Deserialize;
use serde_json::{Value, json};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// A `node.finished` frame of exactly `size` bytes (its newline included).
fn frame_of(size: usize) -> Vec<u8> {
    let build = |items: usize, pad: usize| {
        let list: Vec<Value> = (0..items)
            .map(|i| {
                let text = if i + 1 == items {
                    "p".repeat(pad)
                } else {
                    format!("finding {i} of the review")
                };
                json!({"index": i, "text": text, "done": false})
            })
            .collect();
        let message = json!({
            "schema": "pi-workflows.worker-launch.v1", "type": "node.finished",
            "runId": "run-1", "generation": 2, "runnerEpoch": "re-1", "messageId": "re-1-m7",
            "expectedRevision": 12, "attemptId": "att-7", "output": {"items": list},
        });
        let mut bytes = protocol::canonicalize(&message).expect("canonical");
        bytes.push(b'\n');
        bytes
    };
    let mut items = 1;
    while build(items + 1, 0).len() <= size {
        items += 1;
    }
    let base = build(items, 0).len();
    let frame = build(items, size - base);
    assert_eq!(frame.len(), size);
    frame
}

/// Runs `f` repeatedly for about `budget`; returns seconds per call.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut iters = 0u64;
    let start = Instant::now();
    while start.elapsed() < budget {
        f();
        iters += 1;
    }
    start.elapsed().as_secs_f64() / iters as f64
}

fn main() {
    let budget = Duration::from_millis(
        std::env::var("BENCH_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1500),
    );
    println!(
        "Runner frame receive vs serde_json::from_slice::<Value> (same run, {budget:?} per cell)"
    );
    println!();
    println!(
        "| frame | serde_json parse | receive (digest of the checked bytes) | before: checks one by one, encoding again | receive / parse | before / parse |"
    );
    println!("|---|---|---|---|---|---|");
    for (label, size) in [("1 KiB", 1024), ("64 KiB", 65_536)] {
        let frame = frame_of(size);
        let content = &frame[..frame.len() - 1];
        let received = server::wire::runner::receive(&frame).expect("a valid runner frame");
        let encoded_again = protocol::canonicalize_typed(&received.message).expect("encodes");
        assert_eq!(
            received.payload_digest,
            server::ids::sha256(&encoded_again),
            "the digest of the checked bytes is the digest of the message encoded again"
        );
        let parse = time(budget, || {
            black_box(serde_json::from_slice::<Value>(black_box(content)).expect("parses"));
        });
        let receive = time(budget, || {
            black_box(server::wire::runner::receive(black_box(&frame)).expect("valid"));
        });
        // The receive path before the one-pass check: the checks one by one
        // (a canonical parse into a value, the typed decode from the value
        // and its round trip to the value), then the digest of the typed
        // message encoded again.
        let before = time(budget, || {
            let value = protocol::parse_canonical(black_box(content)).expect("canonical");
            let message = RunnerMessage::deserialize(&value).expect("typed");
            assert!(serde_json::to_value(&message).expect("encodes") == value);
            let digest =
                server::ids::sha256(&protocol::canonicalize_typed(&message).expect("encodes"));
            black_box((message, digest));
        });
        let us = |secs: f64| format!("{:.1} µs", secs * 1e6);
        println!(
            "| {label} | {} | {} | {} | {:.1}× | {:.1}× |",
            us(parse),
            us(receive),
            us(before),
            receive / parse,
            before / parse
        );
    }
}
