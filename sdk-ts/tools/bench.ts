/**
 * Frame validation throughput against plain JSON.parse (not a timed test;
 * prints a table). Run: `npm run bench` in sdk-ts.
 *
 * For 1 KiB, 64 KiB and 1 MiB client frames (the same sessionEvents.record
 * shape as the Rust benchmark) it measures, in the same run:
 * - baseline: JSON.parse(TextDecoder.decode(content)), the least a receiver
 *   must do with bytes off a socket;
 * - validate: FrameDecoder framing, nesting scan, fatal UTF-8 decode,
 *   JSON.parse, canonicalize and compare, and the ajv standalone validator.
 */
import { FrameDecoder, canonicalString, decodeClientFrame } from "../src/protocol/index.js";

const enc = new TextEncoder();
const dec = new TextDecoder();

function build(events: number, pad: number): Uint8Array {
  const list = [];
  for (let i = 0; i < events; i++) {
    const text = i + 1 === events ? "p".repeat(pad) : `delta number ${i} of the reply`;
    list.push({ seq: i, type: "message.delta", data: { index: i, text, final: false } });
  }
  const v = {
    schema: "pi-workflows.client.v1",
    type: "request",
    requestId: "req-1",
    clientId: "cli-1",
    operation: "sessionEvents.record",
    idempotencyKey: "k-1",
    payload: { sessionId: "sess-1", runId: "run-1", events: list },
  };
  return enc.encode(canonicalString(v) + "\n");
}

function frameOf(size: number): Uint8Array {
  let events = 1;
  while (build(events + 1, 0).length <= size) {
    events++;
  }
  const f = build(events, size - build(events, 0).length);
  if (f.length !== size) {
    throw new Error(`frame is ${f.length} bytes, wanted ${size}`);
  }
  return f;
}

let sink: unknown;

function time(budgetMs: number, f: () => void): number {
  f();
  let iters = 0;
  const start = process.hrtime.bigint();
  const budget = BigInt(budgetMs) * 1_000_000n;
  while (process.hrtime.bigint() - start < budget) {
    f();
    iters++;
  }
  return Number(process.hrtime.bigint() - start) / 1e9 / iters;
}

const budgetMs = Number(process.env["BENCH_MS"] ?? 1500);
console.log(`TypeScript frame validation vs JSON.parse (node ${process.version}, same run, ${budgetMs} ms per cell)`);
console.log("| frame | JSON.parse | full validation | ratio (validation / parse throughput) |");
console.log("|---|---|---|---|");
for (const [label, size] of [
  ["1 KiB", 1024],
  ["64 KiB", 65536],
  ["1 MiB", 1048576],
] as const) {
  const frame = frameOf(size);
  const content = frame.subarray(0, frame.length - 1);
  decodeClientFrame(frame);
  const parse = time(budgetMs, () => {
    sink = JSON.parse(dec.decode(content));
  });
  const validate = time(budgetMs, () => {
    const d = new FrameDecoder();
    d.push(frame);
    const f = d.nextFrame();
    if (f === null) {
      throw new Error("no frame");
    }
    sink = decodeClientFrame(f);
  });
  const mib = (secs: number): string => (size / secs / 1048576).toFixed(1);
  console.log(`| ${label} | ${mib(parse)} MiB/s | ${mib(validate)} MiB/s | ${(parse / validate).toFixed(2)} (validation is ${(validate / parse).toFixed(1)}x slower) |`);
}
void sink;
