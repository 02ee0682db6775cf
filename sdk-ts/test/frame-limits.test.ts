/**
 * The runner's check of every frame before it is written: the encoder
 * refuses what a decoder would refuse (nesting, size, canonical form), the
 * channel throws FrameRefused with the exact measurement and writes nothing,
 * and the reasons a node fails with name the rule in terms of the value.
 */
import assert from "node:assert/strict";
import { PassThrough, Writable } from "node:stream";
import { describe, it } from "node:test";
import { normalizeOutput } from "../src/authoring/json.js";
import type { RunnerMessage, WorkerLaunch } from "../src/generated/types.js";
import { MAX_DEPTH, canonicalString, nestingDepth } from "../src/protocol/canonical.js";
import { SafeError } from "../src/protocol/errors.js";
import { FrameDecoder, MAX_FRAME_BYTES } from "../src/protocol/framing.js";
import { decodeRunnerFrame, encodeRunner } from "../src/protocol/messages.js";
import { FrameRefused, RunnerChannel, refusalReason } from "../src/runner/channel.js";
import { safeMessage } from "../src/runner/execute.js";

const launch: WorkerLaunch = {
  schema: "pi-workflows.worker-launch.v1",
  mode: "run",
  runId: "run-1",
  generation: 1,
  runnerEpoch: "re-1",
  projectPath: "/p",
  protocolVersion: 1,
};

/** `depth` levels of `{"a": …}` (the innermost `{}` is one). */
function nested(depth: number): unknown {
  let value: unknown = {};
  for (let i = 1; i < depth; i += 1) value = { a: value };
  return value;
}

/** A channel whose written frames are collected. */
function channel(): { channel: RunnerChannel; written: Buffer[] } {
  const written: Buffer[] = [];
  const output = new Writable({
    write(chunk: Buffer, _encoding, done) {
      written.push(chunk);
      done();
    },
  });
  return { channel: new RunnerChannel(launch, new PassThrough(), output, new FrameDecoder(), () => undefined), written };
}

function finished(output: unknown): { attemptId: string; output: never } {
  return { attemptId: "att-1", output: output as never };
}

function code(work: () => unknown): string {
  try {
    work();
  } catch (error) {
    return error instanceof SafeError ? error.code : `not a SafeError: ${String(error)}`;
  }
  return "no error";
}

const envelope = {
  schema: "pi-workflows.worker-launch.v1",
  runId: "run-1",
  generation: 1,
  runnerEpoch: "re-1",
  messageId: "re-1-m1",
  type: "node.finished",
  attemptId: "att-1",
} as const;

describe("the encoder refuses what a decoder refuses", () => {
  it("nesting: 64 levels encode, 65 are nestingTooDeep", () => {
    // node.finished is level 1, so its output may nest 63.
    const ok = encodeRunner({ ...envelope, output: nested(MAX_DEPTH - 1) } as unknown as RunnerMessage);
    assert.equal(nestingDepth(ok), MAX_DEPTH);
    assert.equal(decodeRunnerFrame(ok).type, "node.finished");
    assert.equal(code(() => encodeRunner({ ...envelope, output: nested(MAX_DEPTH) } as unknown as RunnerMessage)), "nestingTooDeep");
  });

  it("a lone surrogate is not canonical JSON; a value nested far beyond the limit is refused, never a crash", () => {
    assert.equal(code(() => encodeRunner({ ...envelope, output: "\ud800" } as unknown as RunnerMessage)), "internal");
    assert.notEqual(code(() => encodeRunner({ ...envelope, output: nested(5_000) } as unknown as RunnerMessage)), "no error");
  });
});

describe("RunnerChannel.send checks the exact frame", () => {
  it("a frame of exactly 1 MiB is written; one byte more is refused with its size, and nothing is written", async () => {
    const { channel: probe } = channel();
    const base = Buffer.byteLength(canonicalString({ ...envelope, output: "" })) + 1;
    const fits = "x".repeat(MAX_FRAME_BYTES - base);
    assert.equal(probe.check("node.finished", finished(fits)), null);
    const { channel: exact, written } = channel();
    await exact.send("node.finished", finished(fits));
    assert.equal(Buffer.concat(written).length, MAX_FRAME_BYTES);

    const { channel: over, written: none } = channel();
    const refused = await over.send("node.finished", finished(`${fits}x`)).catch((error: unknown) => error);
    assert.ok(refused instanceof FrameRefused);
    assert.deepEqual([refused.messageType, refused.rule, refused.measured], ["node.finished", "size", MAX_FRAME_BYTES + 1]);
    assert.equal(none.length, 0, "nothing was written");
    // The refused message did not use up its id.
    assert.equal(await over.send("node.finished", finished("small")), "re-1-m1");
  });

  it("nesting is measured on the frame; a refused request leaves nothing pending", async () => {
    const { channel: deep, written } = channel();
    const refused = await deep.request("node.finished", finished(nested(70))).catch((error: unknown) => error);
    assert.ok(refused instanceof FrameRefused);
    assert.deepEqual([refused.rule, refused.measured], ["nesting", 71]);
    assert.equal(refused.message, "the node.finished message nests 71 levels, deeper than the protocol's 64-level frame limit");
    assert.equal(written.length, 0);
    assert.equal((deep as unknown as { pending: Map<string, unknown> }).pending.size, 0, "no reply is awaited for it");
  });

  it("a frame that breaks the schema is refused as schema", async () => {
    const { channel: bad } = channel();
    const refused = bad.check("node.update", { attemptId: "att-1", update: { type: "not a type!", key: "k", data: {} }, idempotencyKey: "att-1:u1" });
    assert.equal(refused?.rule, "schema");
  });
});

describe("the reasons a node fails with", () => {
  it("name the rule in terms of the value: its depth and the most the message allows, its encoded size and the frame's", () => {
    const { channel: probe } = channel();
    const deep = nested(70);
    assert.equal(
      refusalReason(probe.check("node.finished", finished(deep)) as FrameRefused, "its output", deep),
      "its output nests 70 levels; a node.finished message can carry at most 63, within the protocol's 64-level frame limit",
    );
    const update = { detail: nested(63) };
    assert.equal(
      refusalReason(probe.check("node.update", { attemptId: "att-1", update: { type: "progress", key: "k", data: update as never }, idempotencyKey: "att-1:u1" }) as FrameRefused, "update progress/k data", update),
      "update progress/k data nests 64 levels; a node.update message can carry at most 62, within the protocol's 64-level frame limit",
    );
    const big = "y".repeat(1_500_000);
    const refused = probe.check("node.finished", finished(big)) as FrameRefused;
    assert.equal(
      refusalReason(refused, "its output", big),
      `its output is 1.43 MiB encoded (the node.finished frame would be ${refused.measured.toLocaleString("en-US")} bytes); a frame must fit the protocol's 1 MiB limit (1,048,576 bytes)`,
    );
    assert.equal(refused.measured, Buffer.byteLength(canonicalString({ ...envelope, output: big })) + 1);
  });

  it("a lone surrogate fails normalizeOutput (in a string or a key); a well-formed pair passes; safeMessage replaces one", () => {
    assert.throws(() => normalizeOutput({ text: "a\udc00b" }, "the output of n"), /the output of n holds a string with a lone UTF-16 surrogate, which canonical JSON \(RFC 8785\) cannot encode/);
    assert.throws(() => normalizeOutput({ ["k\ud800"]: 1 }, "the output of n"), /lone UTF-16 surrogate/);
    assert.deepEqual(normalizeOutput({ emoji: "😀" }, "the output of n"), { emoji: "😀" });
    assert.equal(safeMessage("bad \ud800 text"), "bad \ufffd text");
  });
});
