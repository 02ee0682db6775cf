import assert from "node:assert/strict";
import { Readable } from "node:stream";
import { describe, it } from "node:test";

import {
  FrameDecoder,
  MAX_DEPTH,
  MAX_FRAME_BYTES,
  SafeError,
  canonicalString,
  decodeClientFrame,
  decodeLaunch,
  decodeRunnerFrame,
  decodeServerFrame,
  encodeClient,
  frameContent,
  isCanonical,
  parseCanonical,
  readFrames,
  type ClientMessage,
  type TypedRequest,
  OperationValues,
} from "../src/protocol/index.js";

const enc = new TextEncoder();
const frame = (v: unknown): Uint8Array => enc.encode(canonicalString(v) + "\n");
const code = (f: () => unknown): string => {
  try {
    f();
  } catch (e) {
    assert.ok(e instanceof SafeError, `expected SafeError, got ${String(e)}`);
    return e.code;
  }
  assert.fail("expected an error");
};

const cancel = {
  schema: "pi-workflows.client.v1",
  type: "request",
  requestId: "r1",
  clientId: "c1",
  operation: "run.cancel",
  runId: "run-1",
  idempotencyKey: "k1",
  payload: {},
} as const;

describe("canonical on the wire", () => {
  it("accepts only exact canonical text", () => {
    const cases: Array<[string, boolean]> = [
      ['{"a":1,"b":"x"}', true],
      ['{"a":"é"}', true],
      ['{"a":1e+21}', true],
      ['{"b":"x","a":1}', false],
      ['{"a":1,"a":2}', false],
      ['{"a":1.0}', false],
      ['{"a":9007199254740993}', false],
      ['{"a":-0}', false],
      ['{"a":"\\u0041"}', false],
      ['{"a": 1}', false],
      ['{"a":1e2}', false],
      ['{"a":"\\ud800"}', false],
      ["\ufeff{}", false],
      ['{"a":"\\/"}', false],
    ];
    for (const [text, want] of cases) {
      assert.equal(isCanonical(enc.encode(text)), want, text);
    }
  });

  it("sorts keys by UTF-16 code units", () => {
    assert.equal(canonicalString({ "\ufb33": 1, "😀": 2, a: 3 }), '{"a":3,"😀":2,"\ufb33":1}');
  });

  it("limits nesting to 64, ignoring brackets inside strings", () => {
    const nested = (n: number): Uint8Array => enc.encode("[".repeat(n) + "0" + "]".repeat(n));
    assert.doesNotThrow(() => parseCanonical(nested(MAX_DEPTH)));
    assert.equal(code(() => parseCanonical(nested(MAX_DEPTH + 1))), "nestingTooDeep");
    assert.doesNotThrow(() => parseCanonical(enc.encode(`["\\"${"[".repeat(200)}"]`)));
  });
});

describe("framing", () => {
  const frameOf = (len: number): Uint8Array => {
    const f = new Uint8Array(len).fill(0x78);
    f[len - 1] = 0x0a;
    return f;
  };
  const split = (input: Uint8Array, chunk: number): { frames: Uint8Array[]; error: string | null } => {
    const d = new FrameDecoder();
    const frames: Uint8Array[] = [];
    try {
      for (let i = 0; i < input.length; i += chunk) {
        d.push(input.subarray(i, i + chunk));
        for (let f = d.nextFrame(); f !== null; f = d.nextFrame()) {
          frames.push(f);
        }
      }
      d.finish();
      return { frames, error: null };
    } catch (e) {
      assert.ok(e instanceof SafeError);
      return { frames, error: e.code };
    }
  };

  it("splits frames across any chunking", () => {
    const input = enc.encode('{"a":1}\n{"b":2}\n[]\n');
    for (const chunk of [1, 2, 3, 7, 64]) {
      const { frames, error } = split(input, chunk);
      assert.equal(error, null);
      assert.deepEqual(
        frames.map((f) => Buffer.from(f).toString()),
        ['{"a":1}\n', '{"b":2}\n', "[]\n"],
      );
    }
  });

  it("counts the newline in the 1 MiB limit", () => {
    assert.equal(split(frameOf(MAX_FRAME_BYTES), 65536).frames.length, 1);
    assert.equal(split(frameOf(MAX_FRAME_BYTES + 1), 65536).error, "frameTooLarge");
    assert.equal(code(() => frameContent(frameOf(MAX_FRAME_BYTES + 1))), "frameTooLarge");
  });

  it("rejects CR, unterminated tails, and stays failed", () => {
    assert.equal(split(enc.encode("{}\r\n"), 4).error, "malformedFrame");
    const tail = split(enc.encode("{}\n{}"), 2);
    assert.equal(tail.frames.length, 1);
    assert.equal(tail.error, "malformedFrame");
    const d = new FrameDecoder();
    d.push(enc.encode("{}\r\n"));
    assert.equal(code(() => d.nextFrame()), "malformedFrame");
    d.push(enc.encode('{"a":1}\n'));
    assert.equal(code(() => d.nextFrame()), "malformedFrame");
  });

  it("reads frames from a stream", async () => {
    const got: string[] = [];
    for await (const f of readFrames(Readable.from([enc.encode('{"a"'), enc.encode(":1}\n{}\n")]))) {
      got.push(Buffer.from(f).toString());
    }
    assert.deepEqual(got, ['{"a":1}\n', "{}\n"]);
    await assert.rejects(async () => {
      for await (const _ of readFrames(Readable.from([enc.encode("{}\n{")]))) {
        // drain
      }
    }, SafeError);
  });
});

describe("messages", () => {
  it("decodes and re-encodes a request", () => {
    const bytes = frame(cancel);
    const m = decodeClientFrame(bytes);
    assert.equal(m.type, "request");
    assert.deepEqual(encodeClient(m), bytes);
  });

  it("selects the payload schema by operation", () => {
    const start = { workflow: "w", input: {}, executionMode: "headless", projectPath: "/p" };
    assert.equal(decodeClientFrame(frame({ ...cancel, operation: "run.start", payload: start })).type, "request");
    assert.equal(code(() => decodeClientFrame(frame({ ...cancel, payload: start }))), "schemaInvalid");
    const typed: TypedRequest<"run.start"> = { ...cancel, operation: "run.start", payload: { workflow: "w", input: {}, executionMode: "headless", projectPath: "/p" } };
    assert.equal(typed.payload.executionMode, "headless");
    assert.equal(OperationValues.length, 41);
  });

  it("rejects null for optional fields and unknown fields", () => {
    assert.equal(code(() => decodeClientFrame(frame({ ...cancel, runId: null }))), "schemaInvalid");
    assert.equal(code(() => decodeClientFrame(frame({ ...cancel, extra: 1 }))), "schemaInvalid");
    assert.equal(code(() => decodeClientFrame(frame({ ...cancel, payload: { extra: 1 } }))), "schemaInvalid");
  });

  it("refuses to encode frames over the limit", () => {
    const big = { ...cancel, operation: "checkpoint.answer", payload: { answer: "x".repeat(MAX_FRAME_BYTES) } } as ClientMessage;
    assert.equal(code(() => encodeClient(big)), "frameTooLarge");
  });

  it("keeps the runner and server directions apart", () => {
    const reply = { schema: "pi-workflows.worker-launch.v1", type: "reply", runId: "run-1", generation: 2, runnerEpoch: "re-1", inReplyTo: "m1", outcome: "accepted", result: null };
    assert.equal(decodeServerFrame(frame(reply)).type, "reply");
    assert.equal(code(() => decodeRunnerFrame(frame(reply))), "schemaInvalid");
  });

  it("never puts frame contents into an error", () => {
    const SECRET = "SECRET-MARKER-7f3a";
    const payload = { workflow: SECRET, input: { [SECRET]: SECRET }, executionMode: SECRET, projectPath: "/p" };
    const good = { ...cancel, operation: "run.start", payload };
    const body = frame(good);
    const frames = [
      body,
      frame({ ...good, [SECRET]: SECRET }),
      frame({ ...good, type: SECRET }),
      Buffer.concat([body.subarray(0, body.length - 1), enc.encode(" \n")]),
      enc.encode(`{"${SECRET}":1,"a":\n`),
      enc.encode(`${SECRET}\r\n`),
      enc.encode(`${"[".repeat(70)}${SECRET}\n`),
    ];
    for (const f of frames) {
      for (const decode of [decodeClientFrame, decodeRunnerFrame, decodeLaunch]) {
        try {
          decode(f);
          assert.fail("expected a rejection");
        } catch (e) {
          assert.ok(e instanceof SafeError);
          const rendered = `${e.message} ${String(e)} ${JSON.stringify(e.toWire())} ${e.stack ?? ""}`;
          assert.ok(!rendered.includes(SECRET), rendered);
        }
      }
    }
  });
});
