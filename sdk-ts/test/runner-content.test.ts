/**
 * The runner's reads of values over one frame: a command state sent as a
 * content reference and a reply's `resultContent`, read with `content.read`
 * in verified parts against a fake server on in-memory streams, and every
 * bounded failure (missing content, bad range, wrong length, wrong digest,
 * another media type, malformed JSON, not a run state, oversized, an
 * oversized server error), plus the runner process exiting cleanly when its
 * state cannot be read.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { after, before, describe, it } from "node:test";

import type { ContentReference, RunnerMessage, ServerMessage, WorkerLaunch } from "../src/generated/types.js";
import { canonicalString } from "../src/protocol/canonical.js";
import { digestOf } from "../src/protocol/content.js";
import { SafeError } from "../src/protocol/errors.js";
import { FrameDecoder } from "../src/protocol/framing.js";
import { decodeRunnerFrame, encodeLaunch, encodeServer } from "../src/protocol/messages.js";
import { ContentReadError, MAX_REFERENCED_BYTES, RunnerChannel } from "../src/runner/channel.js";
import { loadAndCompile, hashFile } from "../src/runner/loader.js";
import { EXAMPLES_DIR, RUNNER_BIN } from "../test-support/server.js";

const encoder = new TextEncoder();

const launch: WorkerLaunch = {
  schema: "pi-workflows.worker-launch.v1",
  mode: "run",
  runId: "run-1",
  generation: 2,
  runnerEpoch: "re-1",
  projectPath: "/p",
  protocolVersion: 1,
};

const envelope = { schema: "pi-workflows.worker-launch.v1", runId: "run-1", generation: 2, runnerEpoch: "re-1" } as const;

function referenceOf(bytes: Uint8Array, mediaType = "application/json"): ContentReference {
  return { digest: digestOf(bytes), mediaType, bytes: bytes.length };
}

/** How the fake server answers one `content.read` (default: honestly from `content`). */
type ReadAnswer = (read: Extract<RunnerMessage, { type: "content.read" }>, content: Uint8Array) => ServerMessage;

const honest: ReadAnswer = (read, content) => {
  const end = Math.min(read.offset + read.length, content.length);
  return {
    ...envelope,
    type: "content.chunk",
    inReplyTo: read.messageId,
    reference: read.reference,
    offset: read.offset,
    data: Buffer.from(content.subarray(read.offset, end)).toString("base64"),
    final: end === content.length,
  };
};

/** A channel wired to a fake server that serves `content` and answers other messages with `reply`. */
function wired(content: Uint8Array, answerRead: ReadAnswer = honest, reply?: (message: RunnerMessage) => ServerMessage | undefined) {
  const toRunner = new PassThrough();
  const fromRunner = new PassThrough();
  const channel = new RunnerChannel(launch, toRunner, fromRunner, new FrameDecoder(), () => undefined);
  const received: RunnerMessage[] = [];
  const decoder = new FrameDecoder();
  fromRunner.on("data", (chunk: Buffer) => {
    decoder.push(chunk);
    for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
      const message = decodeRunnerFrame(frame);
      received.push(message);
      const answer = message.type === "content.read" ? answerRead(message, content) : reply?.(message);
      if (answer) toRunner.write(encodeServer(answer));
    }
  });
  channel.start();
  return { channel, received, reads: () => received.filter((m) => m.type === "content.read") as Extract<RunnerMessage, { type: "content.read" }>[] };
}

async function failsWith(promise: Promise<unknown>, code: string, pattern?: RegExp): Promise<void> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof ContentReadError, `a ContentReadError, not ${String(error)}`);
    assert.equal(error.code, code, error.message);
    assert.ok(error.message.length <= 512);
    if (pattern) assert.match(error.message, pattern);
    return;
  }
  assert.fail(`expected a ${code} failure`);
}

const bigState = {
  input: { task: "t" },
  results: Object.fromEntries(
    Array.from({ length: 3 }, (_, i) => [`n${i}`, { attemptId: `a${i}`, nodeId: `n${i}`, nodeType: "compute", outcome: "ok", output: { pad: "z".repeat(500_000) } }]),
  ),
  resultOrder: ["n0", "n1", "n2"],
  steps: 3,
};

describe("typed reply results on the runner channel", () => {
  /** The reply to the first `type` message, with `outcome` and `result`. */
  const answering =
    (type: RunnerMessage["type"], outcome: "accepted" | "rejected", result: unknown) =>
    (message: RunnerMessage): ServerMessage | undefined =>
      message.type === type ? ({ ...envelope, type: "reply", inReplyTo: message.messageId, outcome, result } as ServerMessage) : undefined;
  const reserve = { attemptId: "att-1", effectType: "function", requestDigest: digestOf(new Uint8Array()) } as const;

  it("an accepted reply carries the result type x-replyResult names for its message", async () => {
    const reservation = { effectId: "e1", state: "applying", attemptNumber: 1 };
    const { channel } = wired(new Uint8Array(), honest, answering("effect.reserve", "accepted", reservation));
    const reply = await channel.request("effect.reserve", reserve);
    assert.equal(reply.outcome, "accepted");
    if (reply.outcome !== "accepted") return;
    assert.deepEqual(reply.result, reservation);
    assert.equal(reply.result.state, "applying");
    const update = { updateId: "upd_1", seq: 4 };
    const updated = wired(new Uint8Array(), honest, answering("node.update", "accepted", update)).channel;
    const receipt = await updated.request("node.update", { attemptId: "att-1", update: { type: "progress", key: "k", data: 1 }, idempotencyKey: "att-1:u1" });
    assert.deepEqual(receipt.result, update);
  });

  it("a result off the types its message names, or a result on a refusal, is refused as schemaInvalid", async () => {
    const cases: [string, RunnerMessage["type"], "accepted" | "rejected", unknown][] = [
      ["a settlement answering effect.reserve", "effect.reserve", "accepted", { effectId: "e1", state: "applied" }],
      ["an unknown field", "effect.reserve", "accepted", { effectId: "e1", state: "applying", attemptNumber: 1, extra: true }],
      ["no result where one is named", "node.update", "accepted", null],
      ["a result where none is named", "node.finished", "accepted", { updateId: "upd_1", seq: 1 }],
      ["a result on a refusal", "effect.reserve", "rejected", { effectId: "e1", state: "applying", attemptNumber: 1 }],
    ];
    for (const [what, type, outcome, result] of cases) {
      const { channel } = wired(new Uint8Array(), honest, answering(type, outcome, result));
      const fields =
        type === "effect.reserve"
          ? reserve
          : type === "node.update"
            ? { attemptId: "att-1", update: { type: "progress", key: "k", data: 1 }, idempotencyKey: "att-1:u1" }
            : { attemptId: "att-1", output: null };
      await assert.rejects(
        channel.request(type, fields as never),
        (error: unknown) => error instanceof SafeError && error.code === "schemaInvalid",
        what,
      );
    }
  });
});

describe("referenced content on the runner channel", () => {
  it("a referenced run state is read in parts of at most 512 KiB, verified and decoded", async () => {
    const bytes = encoder.encode(canonicalString(bigState));
    const { channel, reads } = wired(bytes);
    const state = await channel.runState({ kind: "reference", reference: referenceOf(bytes) });
    assert.deepEqual(state, bigState);
    assert.deepEqual(
      reads().map((read) => [read.offset, read.length]),
      [
        [0, 524_288],
        [524_288, 524_288],
        [1_048_576, bytes.length - 1_048_576],
      ],
    );
    assert.deepEqual(await channel.runState({ kind: "inline", value: bigState as never }), bigState, "an inline state is used as it is");
  });

  it("a reply whose result is referenced resolves with the result itself", async () => {
    const result = { effectId: "e1", state: "applied", attemptNumber: 1, result: { pad: "q".repeat(1_100_000) } };
    const bytes = encoder.encode(canonicalString(result));
    const { channel } = wired(bytes, honest, (message) =>
      message.type === "effect.reserve"
        ? { ...envelope, type: "reply", inReplyTo: message.messageId, outcome: "adopted", result: null, resultContent: referenceOf(bytes) }
        : undefined,
    );
    const reply = await channel.request("effect.reserve", { attemptId: "att-1", effectType: "function", requestDigest: digestOf(new Uint8Array()) });
    assert.equal(reply.outcome, "adopted");
    assert.deepEqual(reply.result, result);
    assert.equal("resultContent" in reply, false);
  });

  it("every unreadable reference is one bounded failure, and the channel keeps working", async () => {
    const good = encoder.encode(canonicalString(bigState));
    const state = (reference: ContentReference) => ({ kind: "reference" as const, reference });
    const cases: [string, Uint8Array, ReadAnswer, ContentReference, string, RegExp][] = [
      [
        "missing content",
        good,
        (read) => ({ ...envelope, type: "reply", inReplyTo: read.messageId, outcome: "rejected", result: null, error: { code: "contentUnavailable", message: "the referenced content is not stored" } }),
        referenceOf(good),
        "contentUnavailable",
        /not stored/,
      ],
      ["a bad range", good, (read, content) => ({ ...(honest(read, content) as object), offset: read.offset + 1 }) as ServerMessage, referenceOf(good), "digestMismatch", /another offset/],
      ["a part for another reference", good, (read, content) => ({ ...(honest(read, content) as object), reference: referenceOf(encoder.encode("{}")) }) as ServerMessage, referenceOf(good), "digestMismatch", /another reference/],
      ["a wrong length (short content)", good.subarray(0, good.length - 5), honest, referenceOf(good), "digestMismatch", /shorter/],
      ["a wrong digest", good, honest, { ...referenceOf(good), digest: digestOf(encoder.encode("other")) }, "digestMismatch", /digest/],
      ["another media type", good, honest, referenceOf(good, "text/plain"), "schemaInvalid", /application\/json/],
      ["malformed JSON", encoder.encode("{not json"), honest, referenceOf(encoder.encode("{not json")), "schemaInvalid", /canonical RunState/],
      ["JSON that is not canonical", encoder.encode('{ "a": 1 }'), honest, referenceOf(encoder.encode('{ "a": 1 }')), "schemaInvalid", /canonical RunState/],
      ["JSON that is not a run state", encoder.encode('{"a":1}'), honest, referenceOf(encoder.encode('{"a":1}')), "schemaInvalid", /canonical RunState/],
      ["an oversized reference", good, honest, { ...referenceOf(good), bytes: MAX_REFERENCED_BYTES + 1 }, "frameTooLarge", /256 MiB/],
      [
        "an oversized server error",
        good,
        (read) => ({ ...envelope, type: "reply", inReplyTo: read.messageId, outcome: "rejected", result: null, error: { code: "contentUnavailable", message: "m".repeat(512) } }),
        referenceOf(good),
        "contentUnavailable",
        /refused/,
      ],
    ];
    for (const [what, content, answer, reference, code, pattern] of cases) {
      const { channel, reads } = wired(content, answer, (message) =>
        message.type === "runner.progress" ? { ...envelope, type: "reply", inReplyTo: message.messageId, outcome: "accepted", result: null } : undefined,
      );
      await failsWith(channel.runState(state(reference)), code, pattern);
      if (code === "frameTooLarge" || what === "another media type") assert.equal(reads().length, 0, `${what}: refused before any read`);
      const after = await channel.request("runner.progress", { operation: "process.register", pid: 1, startIdentity: "1:1" });
      assert.equal(after.outcome, "accepted", `${what}: the channel still works`);
    }
  });
});

describe("a runner whose command state cannot be read", () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "piw-runner-content-"));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("logs one line, sends runner.exiting fatal and exits 2", async () => {
    const root = join(dir, "project");
    mkdirSync(join(root, ".pi", "workflows"), { recursive: true });
    const path = join(root, ".pi", "workflows", "linear.workflow.ts");
    cpSync(join(EXAMPLES_DIR, "linear.workflow.ts"), path);
    const compiled = await loadAndCompile(path, root);
    const run: WorkerLaunch = {
      ...launch,
      projectPath: root,
      workflowSource: { root: { kind: "file", path, hash: await hashFile(path) }, mounted: [] },
      definitionDigest: compiled.definitionDigest,
    };
    const child = spawn(process.execPath, [RUNNER_BIN], { cwd: root, stdio: ["pipe", "pipe", "pipe"], env: { ...process.env, HOME: join(dir, "home") } });
    const messages: RunnerMessage[] = [];
    const decoder = new FrameDecoder();
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const missing = referenceOf(encoder.encode(canonicalString(bigState)));
    child.stdout.on("data", (chunk: Buffer) => {
      decoder.push(chunk);
      for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
        const message = decodeRunnerFrame(frame);
        messages.push(message);
        if (message.type === "runner.ready") {
          child.stdin.write(
            encodeServer({ ...envelope, type: "command", command: "resume", node: { nodeId: "greet", attemptId: "att-1", visit: 1 }, state: { kind: "reference", reference: missing } }),
          );
        } else if (message.type === "content.read") {
          child.stdin.write(
            encodeServer({ ...envelope, type: "reply", inReplyTo: message.messageId, outcome: "rejected", result: null, error: { code: "contentUnavailable", message: "the referenced content is not stored" } }),
          );
        }
      }
    });
    child.stdin.write(encodeLaunch(run));
    child.stdin.write("\n");
    const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
    assert.equal(code, 2, stderr);
    assert.deepEqual(
      messages.map((m) => m.type),
      ["runner.ready", "content.read", "runner.exiting"],
    );
    assert.equal((messages[2] as Extract<RunnerMessage, { type: "runner.exiting" }>).reason, "fatal");
    assert.match(stderr, /the run state of the resume command could not be read: contentUnavailable/);
    assert.doesNotMatch(stderr, /fatal: |at .*\.js/, "no stack trace: a bounded failure, not a crash");
  });
});
