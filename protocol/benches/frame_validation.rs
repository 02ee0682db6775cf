//! Frame validation throughput against plain `serde_json` parsing.
//!
//! Run: `cargo bench -p protocol --bench frame_validation`. Not a timed
//! test: it only prints a table. For 1 KiB, 64 KiB and 1 MiB client frames
//! (a `sessionEvents.record` request with many small events, so the bytes
//! are mostly structure rather than one long string), it measures
//!
//! - baseline: `serde_json::from_slice::<Value>` of the frame content;
//! - validate: the full receive path — `FrameDecoder` (framing), nesting
//!   scan, parse, canonical re-encoding and comparison, typed decode with
//!   the payload dispatch, and the typed round trip;
//!
//! in the same run, and prints each throughput and their ratio.

use std::hint::black_box;
use std::time::{Duration, Instant};

use protocol::{FrameDecoder, decode_client_frame};
use serde_json::{Value, json};

/// A `sessionEvents.record` request frame of exactly `size` bytes
/// (including its newline).
fn frame_of(size: usize) -> Vec<u8> {
    let build = |events: usize, pad: usize| {
        let list: Vec<Value> = (0..events)
            .map(|i| {
                let text = if i + 1 == events { "p".repeat(pad) } else { format!("delta number {i} of the reply") };
                json!({"seq": i, "type": "message.delta", "data": {"index": i, "text": text, "final": false}})
            })
            .collect();
        let v = json!({"schema":"pi-workflows.client.v1","type":"request","requestId":"req-1","clientId":"cli-1",
            "operation":"sessionEvents.record","idempotencyKey":"k-1",
            "payload":{"sessionId":"sess-1","runId":"run-1","events":list}});
        let mut b = protocol::canonicalize(&v).expect("canonical");
        b.push(b'\n');
        b
    };
    let mut events = 1;
    while build(events + 1, 0).len() <= size {
        events += 1;
    }
    let base = build(events, 0).len();
    let f = build(events, size - base);
    assert_eq!(f.len(), size);
    f
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
        "Rust frame validation vs serde_json::from_slice::<Value> (same run, {budget:?} per cell)"
    );
    println!(
        "| frame | serde_json parse | full validation | ratio (validation / parse throughput) |"
    );
    println!("|---|---|---|---|");
    for (label, size) in [("1 KiB", 1024), ("64 KiB", 65_536), ("1 MiB", 1_048_576)] {
        let frame = frame_of(size);
        let content = &frame[..frame.len() - 1];
        assert!(
            decode_client_frame(&frame).is_ok(),
            "benchmark frame must be valid"
        );
        let parse = time(budget, || {
            black_box(serde_json::from_slice::<Value>(black_box(content)).expect("parses"));
        });
        let validate = time(budget, || {
            let mut d = FrameDecoder::new();
            d.push(black_box(&frame));
            let f = d.next_frame().expect("frames").expect("one frame");
            black_box(decode_client_frame(&f).expect("valid"));
        });
        let mib = |secs: f64| size as f64 / secs / 1_048_576.0;
        println!(
            "| {label} | {:.1} MiB/s | {:.1} MiB/s | {:.2} (validation is {:.1}x slower) |",
            mib(parse),
            mib(validate),
            parse / validate,
            validate / parse
        );
    }
}
