/**
 * Unit tests of WorkflowClient against fake socket servers written here
 * (no pi-workflows binary): framing, hello, version mismatch, request
 * identity and retry adoption, interaction.submit waits, backpressure,
 * verified content, sanitized errors, subscriptions, cold start and timer
 * references (in child processes).
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import {
  ContentAssembler,
  PACKAGE_VERSION,
  WorkflowClient,
  WorkflowClientError,
  judgeEvent,
  type WorkflowClientOptions,
} from "../src/client/index.js";
import { Connection } from "../src/client/connection.js";
import { Fake, type FakeScript, Peer, frameOf, serverHello } from "../test-support/fake-server.js";
import type { ClientMessage, ContentReference, Request } from "../src/generated/types.js";
import { FrameDecoder, canonicalString, decodeClientFrame, isCanonical } from "../src/protocol/index.js";

/** A fake that answers every request with `accepted` and a receipt per operation. */
const answering = (receipts: Partial<Record<string, unknown>> = {}): FakeScript => ({
  onRequest: (request, peer) => {
    peer.respond(request, "accepted", receipts[request.operation] ?? { runId: request.runId ?? "run-1", revision: 2, status: "running" }, undefined, 2);
  },
});

const startPayload = (input: unknown = {}) => ({
  workflow: "linear",
  input: input as never,
  executionMode: "headless" as const,
  projectPath: "/project",
});

async function rejectsWith(promise: Promise<unknown>, code: string): Promise<WorkflowClientError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof WorkflowClientError, `expected WorkflowClientError, got ${String(error)}`);
    assert.equal(error.code, code, `code (message: ${error.message})`);
    return error;
  }
  assert.fail(`expected a ${code} error`);
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Strips the request id: what must stay equal across transport attempts. */
function identity(request: Request): Omit<Request, "requestId"> {
  const { requestId: _ignored, ...rest } = request;
  return rest;
}

// ---- tests -------------------------------------------------------------------------

describe("WorkflowClient: framing and hello", () => {
  it("sends a canonical client hello first, then canonical requests, all on one persistent connection", async () => {
    const fake = await Fake.start(answering({ "server.status": statusReceipt() }));
    const client = fake.client({ clientId: "client-under-test" });
    try {
      await client.serverStatus();
      await client.runPause("run-1");
      await client.runView("run-1").catch(() => undefined);
      assert.equal(fake.peers.length, 1, "one connection for every request");
      const [hello, ...rest] = fake.peers[0]!.messages;
      assert.deepEqual(hello, {
        schema: "pi-workflows.client.v1",
        type: "hello",
        role: "client",
        clientId: "client-under-test",
        protocolVersion: 1,
        packageVersion: PACKAGE_VERSION,
      });
      assert.deepEqual(rest.map((m) => (m.type === "request" ? m.operation : m.type)), ["server.status", "run.pause", "run.view"]);
      for (const frame of fake.peers[0]!.frames) {
        assert.equal(frame[frame.length - 1], 0x0a);
        assert.ok(isCanonical(frame.subarray(0, frame.length - 1)), "every frame is canonical JSON");
      }
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("finished requests leave no close listeners on the persistent connection", async () => {
    const fake = await Fake.start(answering({ "server.status": statusReceipt() }));
    const client = fake.client();
    try {
      for (let i = 0; i < 50; i++) await client.serverStatus();
      const internals = client as unknown as { connection: { closeListeners: Set<unknown> } };
      assert.equal(internals.connection.closeListeners.size, 0);
      assert.equal(fake.peers.length, 1);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("decodes responses split across reads one byte at a time", async () => {
    const fake = await Fake.start({
      hello: false,
      onConnect: (peer) => {
        const bytes = frameOf(serverHello());
        void (async () => {
          for (const byte of bytes) {
            peer.socket.write(Buffer.from([byte]));
            await sleep(0);
          }
        })();
      },
      onRequest: (request, peer) => {
        const bytes = frameOf({ schema: "pi-workflows.client.v1", type: "response", requestId: request.requestId, operation: request.operation, outcome: "accepted", receipt: statusReceipt() });
        const half = Math.floor(bytes.length / 2);
        peer.socket.write(bytes.subarray(0, half));
        setTimeout(() => peer.socket.write(bytes.subarray(half)), 20);
      },
    });
    const client = fake.client();
    try {
      const status = await client.serverStatus();
      assert.equal(status.serverEpoch, 7);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("a server hello with another package version is one packageVersionMismatch error that says to install matching packages", async () => {
    const fake = await Fake.start({ version: "9.9.9", ...answering() });
    const client = fake.client();
    try {
      const error = await rejectsWith(client.serverStatus(), "packageVersionMismatch");
      assert.match(error.message, /install matching pi-workflows packages/);
      assert.match(error.message, /9\.9\.9/);
      assert.doesNotMatch(error.message, /database|sqlite|reset/i);
      assert.equal(fake.requests.length, 0, "no request is sent after a mismatched hello");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("the server's packageVersionMismatch response is the same clear error", async () => {
    const fake = await Fake.start({
      hello: false,
      onConnect: (peer) => {
        peer.send({
          schema: "pi-workflows.client.v1",
          type: "response",
          requestId: "hello",
          operation: "server.status",
          outcome: "unavailable",
          error: { code: "packageVersionMismatch", message: "this server is pi-workflows 0.2.0; install matching pi-workflows packages" },
        });
        peer.socket.end();
      },
    });
    const client = fake.client();
    try {
      const error = await rejectsWith(client.serverStatus(), "packageVersionMismatch");
      assert.match(error.message, /this server is pi-workflows 0\.2\.0; install matching pi-workflows packages/);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("a server at its connection cap refuses with one frame instead of the hello, and the client reports its reason", async () => {
    const fake = await Fake.start({
      hello: false,
      onConnect: (peer) => {
        peer.event("connection", 0, {
          kind: "availability",
          state: "unavailable",
          reason: "unavailable: the server has too many connections (256); close another client or retry later",
        });
        peer.socket.end();
      },
    });
    const client = fake.client();
    try {
      const error = await rejectsWith(client.serverStatus(), "unavailable");
      assert.match(error.message, /too many connections/);
      assert.equal(fake.requests.length, 0, "no request is sent on a refused connection");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("an invalid frame from the server fails the request with its framing code and is not retried", async () => {
    const fake = await Fake.start({
      onRequest: (_request, peer) => {
        peer.socket.write('{"b":1, "a":2}\n');
      },
    });
    const client = fake.client();
    try {
      await rejectsWith(client.runPause("run-1"), "nonCanonical");
      assert.equal(fake.requests.length, 1);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("the server's connection error frame before it closes is reported with its code, not retried", async () => {
    const fake = await Fake.start({
      onRequest: (_request, peer) => {
        peer.event("connection", 0, { kind: "availability", state: "unavailable", reason: "schemaInvalid: frame does not match the protocol schema" });
        peer.socket.end();
      },
    });
    const client = fake.client();
    try {
      const error = await rejectsWith(client.runPause("run-1"), "schemaInvalid");
      assert.equal(error.message, "frame does not match the protocol schema");
      assert.equal(fake.requests.length, 1);
    } finally {
      client.close();
      await fake.close();
    }
  });
});

describe("WorkflowClient: request identity and retries", () => {
  it("a request that meets the server's idle close is retried on a new connection", async () => {
    const fake = await Fake.start({
      onRequest: (request, peer, self) => {
        if (self.requests.length === 1) {
          peer.event("connection", 0, { kind: "availability", state: "unavailable", reason: "timedOut: the connection was idle for 300000 ms; connect again when you need the server" });
          peer.socket.end();
          return;
        }
        peer.respond(request, "accepted", statusReceipt());
      },
    });
    const client = fake.client();
    try {
      await client.serverStatus();
      assert.equal(fake.requests.length, 2);
      assert.equal(fake.peers.length, 2, "the retry used a new connection");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("request ids are new per attempt, each command has its own key, and the client id is stable", async () => {
    const fake = await Fake.start(answering({ "server.status": statusReceipt() }));
    const client = fake.client();
    try {
      const first = await client.runPause("run-1");
      const second = await client.runResume("run-1");
      await client.serverStatus();
      const [a, b, c] = fake.requests;
      assert.ok(a !== undefined && b !== undefined && c !== undefined);
      assert.equal(new Set([a.requestId, b.requestId, c.requestId]).size, 3);
      assert.equal(a.clientId, client.clientId);
      assert.equal(b.clientId, client.clientId);
      assert.ok(a.idempotencyKey !== undefined && b.idempotencyKey !== undefined);
      assert.notEqual(a.idempotencyKey, b.idempotencyKey);
      assert.equal(first.idempotencyKey, a.idempotencyKey);
      assert.equal(second.idempotencyKey, b.idempotencyKey);
      assert.equal(c.idempotencyKey, undefined, "reads carry no idempotency key");
      assert.equal(a.runId, "run-1");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("two clients sharing a pinned client id never reuse each other's request ids", async () => {
    const fake = await Fake.start(answering());
    const one = fake.client({ clientId: "pinned-client" });
    const two = fake.client({ clientId: "pinned-client" });
    try {
      await one.runPause("run-1");
      await two.runPause("run-1");
      const [a, b] = fake.requests;
      assert.ok(a !== undefined && b !== undefined);
      assert.equal(a.clientId, b.clientId);
      assert.notEqual(a.requestId, b.requestId);
      assert.ok(a.requestId.startsWith("pinned-client."));
    } finally {
      one.close();
      two.close();
      await fake.close();
    }
  });

  it("after a disconnect, a command is retried with a new request id and the same client id, key, operation and payload, and adopts the receipt", async () => {
    const receipt = { runId: "run-9", revision: 1 };
    const fake = await Fake.start({
      onRequest: (request, peer, self) => {
        if (self.requests.length === 1) {
          peer.socket.destroy(); // as if the connection failed after the commit
          return;
        }
        peer.respond(request, "adopted", receipt, undefined, 1);
      },
    });
    const client = fake.client();
    try {
      const result = await client.runStart(startPayload({ x: 1 }), { expectedRevision: 3 });
      assert.equal(result.outcome, "adopted");
      assert.deepEqual(result.receipt, receipt);
      assert.equal(fake.peers.length, 2, "the retry used a new connection");
      const [first, retry] = fake.requests;
      assert.ok(first !== undefined && retry !== undefined);
      assert.notEqual(first.requestId, retry.requestId);
      assert.deepEqual(identity(retry), identity(first));
      assert.equal(first.idempotencyKey, result.idempotencyKey);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("gives up after maxAttempts disconnects with an unavailable error that keeps the key for a later adoption", async () => {
    const fake = await Fake.start({ onRequest: (_request, peer) => peer.socket.destroy() });
    const client = fake.client({ maxAttempts: 3 });
    try {
      const error = await rejectsWith(client.runCancel("run-1", { idempotencyKey: "key-1" }), "unavailable");
      assert.equal(error.idempotencyKey, "key-1");
      assert.equal(error.operation, "run.cancel");
      assert.match(error.message, /same idempotency key/);
      assert.equal(fake.requests.length, 3);
      assert.equal(new Set(fake.requests.map((r) => r.requestId)).size, 3);
      assert.equal(new Set(fake.requests.map((r) => r.idempotencyKey)).size, 1);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("server.stop is not retried after a disconnect", async () => {
    const fake = await Fake.start({ onRequest: (_request, peer) => peer.socket.destroy() });
    const client = fake.client();
    try {
      await rejectsWith(client.serverStop(), "unavailable");
      assert.equal(fake.requests.length, 1);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("interaction.submit waits for the durable outcome without a client timeout, and a reconnect waits for the same outcome", async () => {
    const payload = { interactionId: "i-1", attemptId: "a-1", submissionId: "sub-1", output: { answer: 42 }, authority: { kind: "coordinator" as const, sessionId: "s-1", coordinatorEpoch: 1 } };
    const fake = await Fake.start({
      onRequest: (request, peer, self) => {
        if (self.requests.length === 1) {
          setTimeout(() => peer.socket.destroy(), 100); // the connection fails while validation runs
          return;
        }
        // Validation settles well after any plausible short timeout.
        setTimeout(() => peer.respond(request, "adopted", { submissionId: "sub-1", outcome: "rejected", error: { code: "validationFailed", message: "answer must be a string" } }), 1500);
      },
    });
    const client = fake.client();
    try {
      const started = Date.now();
      const result = await client.interactionSubmit("run-1", payload, { idempotencyKey: "submit-key" });
      assert.ok(Date.now() - started >= 1500);
      assert.equal(result.outcome, "adopted");
      assert.deepEqual(result.receipt, { submissionId: "sub-1", outcome: "rejected", error: { code: "validationFailed", message: "answer must be a string" } });
      const [first, retry] = fake.requests;
      assert.ok(first !== undefined && retry !== undefined);
      assert.notEqual(first.requestId, retry.requestId);
      assert.deepEqual(identity(retry), identity(first));
      assert.equal(retry.idempotencyKey, "submit-key");
      assert.deepEqual(retry.payload, payload);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("typed commands throw for rejected and conflict outcomes; request() returns every outcome", async () => {
    const fake = await Fake.start({
      onRequest: (request, peer) => {
        if (request.operation === "run.pause") peer.respond(request, "rejected", undefined, { code: "terminal", message: "the run already ended" });
        else peer.respond(request, "conflict", undefined, { code: "conflict", message: "this idempotency key or request id was already used for another request" });
      },
    });
    const client = fake.client();
    try {
      const rejected = await rejectsWith(client.runPause("run-1"), "terminal");
      assert.equal(rejected.outcome, "rejected");
      assert.equal(rejected.message, "the run already ended");
      const conflict = await rejectsWith(client.runStart(startPayload(), { idempotencyKey: "k1" }), "conflict");
      assert.equal(conflict.outcome, "conflict");
      const settled = await client.request("run.cancel", { runId: "run-1", payload: {} });
      assert.equal(settled.outcome, "conflict");
      assert.equal(settled.error?.code, "conflict");
      assert.ok(settled.idempotencyKey !== undefined, "state-changing operations get a key by default");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("an AbortSignal stops waiting for a response; a late response is ignored and the connection stays usable", async () => {
    let held: { request: Request; peer: Peer } | null = null;
    const fake = await Fake.start({
      onRequest: (request, peer) => {
        if (request.operation === "run.pause") held = { request, peer };
        else peer.respond(request, "accepted", statusReceipt());
      },
    });
    const client = fake.client();
    try {
      const controller = new AbortController();
      const pending = client.runPause("run-1", { signal: controller.signal });
      await sleep(50);
      controller.abort();
      await rejectsWith(pending, "cancelled");
      const late = held as { request: Request; peer: Peer } | null;
      assert.ok(late !== null);
      late.peer.respond(late.request, "accepted", { runId: "run-1", revision: 2, status: "running" });
      const status = await client.serverStatus();
      assert.equal(status.serverEpoch, 7);
      assert.equal(fake.peers.length, 1);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("an invalid request is rejected locally with schemaInvalid and never sent", async () => {
    const fake = await Fake.start(answering());
    const client = fake.client();
    try {
      await rejectsWith(client.runStart({ ...startPayload(), projectPath: "relative/path" }), "schemaInvalid");
      await rejectsWith(client.runPause("not a valid id!"), "schemaInvalid");
      assert.equal(fake.requests.length, 0);
    } finally {
      client.close();
      await fake.close();
    }
  });
});

describe("WorkflowClient: sanitized errors", () => {
  const secret = "SECRET-PAYLOAD-MARKER";

  it("notFound and unavailable errors carry only the server's safe code and message", async () => {
    const fake = await Fake.start({
      onRequest: (request, peer) => {
        if (request.operation === "run.view") peer.respond(request, "notFound", undefined, { code: "notFound", message: "no run with this id; check `pi-workflows runs`" });
        else peer.respond(request, "unavailable", undefined, { code: "unavailable", message: "this operation is not available in this server version" });
      },
    });
    const client = fake.client();
    try {
      const notFound = await rejectsWith(client.runView(`run-${secret}`), "notFound");
      assert.equal(notFound.message, "no run with this id; check `pi-workflows runs`");
      assert.equal(notFound.outcome, "notFound");
      assert.deepEqual(Object.keys(notFound).sort(), ["code", "name", "operation", "outcome"]);
      const unavailable = await rejectsWith(client.checkpointAnswer("run-1", { note: secret }), "unavailable");
      assert.equal(unavailable.message, "this operation is not available in this server version");
      for (const error of [notFound, unavailable]) {
        assert.ok(!JSON.stringify({ ...error, message: error.message }).includes(secret));
        assert.equal(error.cause, undefined);
      }
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("an absent server is one unavailable error that names no path", async () => {
    const dir = mkdtempSync(join(tmpdir(), "piw-absent-SECRETPATH-"));
    const client = new WorkflowClient({ home: dir, autoStart: false });
    try {
      const error = await rejectsWith(client.serverStatus(), "unavailable");
      assert.match(error.message, /pi-workflows server start/);
      assert.ok(!error.message.includes(dir) && !error.message.includes("SECRETPATH"));
      assert.equal(error.cause, undefined);
    } finally {
      client.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("a start binary that cannot run is one unavailable error that names no path", async () => {
    const dir = mkdtempSync(join(tmpdir(), "piw-nobin-"));
    const bin = join(dir, "SECRETBIN", "pi-workflows");
    const client = new WorkflowClient({ home: dir, bin, startDeadlineMs: 5_000 });
    try {
      const error = await rejectsWith(client.serverStatus(), "unavailable");
      assert.match(error.message, /PI_WORKFLOWS_BIN/);
      assert.ok(!error.message.includes("SECRETBIN") && !error.message.includes(dir));
    } finally {
      client.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("WorkflowClient: backpressure", () => {
  /** A fake that greets and then never reads. */
  async function deaf(): Promise<Fake> {
    return Fake.start({ onConnect: (peer) => peer.socket.pause() });
  }

  const big = (): Uint8Array => new Uint8Array(8 * 1024 * 1024).fill(0x61);

  it("a write waiting for drain stops waiting when the connection closes", async () => {
    const fake = await deaf();
    try {
      const connection = await Connection.open({ socketPath: fake.socketPath, clientId: "c1", packageVersion: PACKAGE_VERSION, helloTimeoutMs: 2000, onMessage: () => undefined });
      let settled = false;
      const write = connection.write(big()).finally(() => {
        settled = true;
      });
      write.catch(() => undefined);
      await sleep(200);
      assert.equal(settled, false, "the write waits for drain while the peer does not read");
      fake.peers[0]!.socket.destroy();
      const error = await rejectsWith(write, "unavailable");
      assert.doesNotMatch(error.message, /piw-fake/);
    } finally {
      await fake.close();
    }
  });

  it("a write waiting for drain stops waiting when its AbortSignal fires", async () => {
    const fake = await deaf();
    try {
      const connection = await Connection.open({ socketPath: fake.socketPath, clientId: "c1", packageVersion: PACKAGE_VERSION, helloTimeoutMs: 2000, onMessage: () => undefined });
      const controller = new AbortController();
      let settled = false;
      const write = connection.write(big(), controller.signal).finally(() => {
        settled = true;
      });
      write.catch(() => undefined);
      await sleep(200);
      assert.equal(settled, false);
      controller.abort();
      await rejectsWith(write, "cancelled");
      // A second writer queued behind the full buffer also stops when the connection closes.
      const queued = connection.write(new Uint8Array([0x0a]));
      queued.catch(() => undefined);
      await sleep(50);
      connection.close();
      await rejectsWith(queued, "unavailable");
    } finally {
      await fake.close();
    }
  });

  it("a request whose write is backpressured ends when the connection closes and the server is gone", async () => {
    const fake = await deaf();
    const client = fake.client();
    try {
      const pending = client.runStart(startPayload({ blob: "x".repeat(900_000) }));
      pending.catch(() => undefined);
      await sleep(200);
      fake.stopListening();
      fake.peers[0]!.socket.destroy();
      const error = await rejectsWith(pending, "unavailable");
      assert.ok(!error.message.includes("xxxx"));
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("a request whose write is backpressured ends when its AbortSignal fires", async () => {
    const fake = await deaf();
    const client = fake.client();
    try {
      const controller = new AbortController();
      const pending = client.runStart(startPayload({ blob: "x".repeat(900_000) }), { signal: controller.signal });
      pending.catch(() => undefined);
      await sleep(200);
      controller.abort();
      await rejectsWith(pending, "cancelled");
    } finally {
      client.close();
      await fake.close();
    }
  });
});

describe("WorkflowClient: verified content", () => {
  const contentOf = (bytes: Buffer, mediaType = "application/json"): ContentReference => ({
    bytes: bytes.length,
    digest: "sha256:" + createHash("sha256").update(bytes).digest("hex"),
    mediaType,
  });

  /** Serves `view.content` from `stored`, optionally tampering with each chunk. */
  const serving = (stored: Buffer, tamper: (chunk: Record<string, unknown>) => Record<string, unknown> = (c) => c): FakeScript => ({
    onRequest: (request, peer) => {
      if (request.operation !== "view.content") return;
      const payload = request.payload as unknown as { reference: ContentReference; offset: number; length: number };
      const data = stored.subarray(payload.offset, payload.offset + payload.length);
      const digest = "sha256:" + createHash("sha256").update(stored).digest("hex");
      peer.respond(request, "accepted", tamper({ reference: payload.reference, digest, offset: payload.offset, data: data.toString("base64"), final: payload.offset + data.length >= stored.length }));
    },
  });

  const bytes = Buffer.from(Array.from({ length: 1_300_000 }, (_, i) => (i * 7) % 251));

  it("reads chunks of at most 512 KiB, assembles them and verifies both digests", async () => {
    const fake = await Fake.start(serving(bytes));
    const client = fake.client();
    try {
      const read = await client.readContent(contentOf(bytes), { runId: "run-1" });
      assert.ok(Buffer.from(read).equals(bytes));
      const asked = fake.requests.map((r) => {
        const p = r.payload as { offset: number; length: number };
        return [r.runId, p.offset, p.length];
      });
      assert.deepEqual(asked, [
        ["run-1", 0, 524288],
        ["run-1", 524288, 524288],
        ["run-1", 1048576, 1300000 - 1048576],
      ]);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("bytes that do not match the reference digest are a digestMismatch", async () => {
    const other = Buffer.from(bytes);
    other[1000] = (other[1000]! + 1) % 256;
    const fake = await Fake.start(serving(other));
    const client = fake.client();
    try {
      await rejectsWith(client.readContent(contentOf(bytes)), "digestMismatch");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("a chunk response whose digest differs is a digestMismatch even when the bytes match the reference", async () => {
    const fake = await Fake.start(serving(bytes, (chunk) => (chunk["offset"] === 524288 ? { ...chunk, digest: "sha256:" + "0".repeat(64) } : chunk)));
    const client = fake.client();
    try {
      await rejectsWith(client.readContent(contentOf(bytes)), "digestMismatch");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("a chunk at another offset, for another reference, too long, or not final at the end is a digestMismatch", () => {
    const small = Buffer.from("hello world");
    const reference = contentOf(small);
    const chunk = (over: Record<string, unknown> = {}) => ({ reference, digest: reference.digest, offset: 0, data: small.toString("base64"), final: true, ...over }) as never;
    const cases: Array<[string, unknown]> = [
      ["offset", chunk({ offset: 1 })],
      ["reference", chunk({ reference: { ...reference, mediaType: "text/plain" } })],
      ["too long", chunk({ data: Buffer.from("hello world!").toString("base64") })],
      ["not final", chunk({ final: false })],
      ["short final", chunk({ data: Buffer.from("hello").toString("base64") })],
      ["not base64", chunk({ data: "aGVsbG8gd29ybGQ" })],
    ];
    for (const [what, bad] of cases) {
      const assembler = new ContentAssembler(reference);
      assert.throws(() => assembler.accept(bad as never), (e: unknown) => e instanceof WorkflowClientError && e.code === "digestMismatch", what);
    }
    const ok = new ContentAssembler(reference);
    ok.accept(chunk());
    assert.equal(Buffer.from(ok.finish()).toString(), "hello world");
  });

  it("empty content needs no request and is still verified", async () => {
    const fake = await Fake.start(serving(Buffer.alloc(0)));
    const client = fake.client();
    try {
      const read = await client.readContent(contentOf(Buffer.alloc(0)));
      assert.equal(read.length, 0);
      await rejectsWith(client.readContent({ bytes: 0, digest: "sha256:" + "1".repeat(64), mediaType: "application/json" }), "digestMismatch");
      assert.equal(fake.requests.length, 0);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("readJsonContent parses verified JSON", async () => {
    const json = Buffer.from('{"nodes":[1,2,3]}');
    const fake = await Fake.start(serving(json));
    const client = fake.client();
    try {
      assert.deepEqual(await client.readJsonContent(contentOf(json)), { nodes: [1, 2, 3] });
    } finally {
      client.close();
      await fake.close();
    }
  });
});

describe("WorkflowClient: pages", () => {
  it("page() sends view.page for the run; pages() follows nextCursor until the last page", async () => {
    const fake = await Fake.start({
      onRequest: (request, peer) => {
        const payload = request.payload as { cursor?: string; revision: number; collection: string };
        const next: Record<string, string> = { start: "c1", c1: "c2" };
        const at = payload.cursor ?? "start";
        const page: Record<string, unknown> = { collection: payload.collection, revision: payload.revision, items: [at] };
        if (payload.cursor !== undefined) page["cursor"] = payload.cursor;
        if (next[at] !== undefined) page["nextCursor"] = next[at];
        peer.respond(request, "accepted", page);
      },
    });
    const client = fake.client();
    try {
      const items: unknown[] = [];
      for await (const page of client.pages("run-1", { collection: "steps", revision: 4, limit: 10, maxBytes: 65536 })) items.push(...page.items);
      assert.deepEqual(items, ["start", "c1", "c2"]);
      assert.deepEqual(
        fake.requests.map((r) => [r.operation, r.runId, (r.payload as { cursor?: string }).cursor]),
        [
          ["view.page", "run-1", undefined],
          ["view.page", "run-1", "c1"],
          ["view.page", "run-1", "c2"],
        ],
      );
      // Returning to a cursor seen before is just another page() call.
      const again = await client.page("run-1", { collection: "steps", revision: 4, limit: 10, maxBytes: 65536, cursor: "c1" });
      assert.deepEqual(again.items, ["c1"]);
    } finally {
      client.close();
      await fake.close();
    }
  });
});

describe("WorkflowClient: subscriptions", () => {
  const patch = (baseRevision: number) => ({ kind: "runViewPatch", runId: "run-1", baseRevision, ops: [{ op: "replace", path: "/display/status", value: "running" }] });

  it("judgeEvent: duplicates are stale, a patch must start at the last accepted revision, availability always passes", () => {
    assert.equal(judgeEvent(5, { revision: 5, event: { kind: "runListSnapshot", rows: [] } }), "stale");
    assert.equal(judgeEvent(5, { revision: 4, event: { kind: "runListSnapshot", rows: [] } }), "stale");
    assert.equal(judgeEvent(5, { revision: 6, event: { kind: "runListSnapshot", rows: [] } }), "accept");
    assert.equal(judgeEvent(undefined, { revision: 1, event: { kind: "runListSnapshot", rows: [] } }), "accept");
    assert.equal(judgeEvent(5, { revision: 6, event: patch(5) as never }), "accept");
    assert.equal(judgeEvent(5, { revision: 7, event: patch(6) as never }), "gap");
    assert.equal(judgeEvent(undefined, { revision: 7, event: patch(6) as never }), "gap");
    assert.equal(judgeEvent(5, { revision: 0, event: { kind: "availability", state: "unavailable" } }), "accept");
  });

  it("routes events by subscription id, tracks revisions, and re-subscribes after a reconnect from the last accepted revision", async () => {
    let connection = 0;
    const fake = await Fake.start({
      onRequest: (request, peer) => {
        if (request.operation === "unsubscribe") return peer.respond(request, "accepted", {});
        if (request.operation !== "subscribe") return;
        connection++;
        if (connection === 1) {
          peer.respond(request, "accepted", { subscriptionId: "s1" });
          peer.event("s1", 5, { kind: "runViewSnapshot", view: runViewAt(5) });
          peer.event("other", 9, { kind: "runListSnapshot", rows: [] }); // another subscription's event: not ours
          peer.event("s1", 6, patch(5));
          peer.event("s1", 6, patch(5)); // duplicate
          setTimeout(() => peer.socket.destroy(), 50);
        } else {
          peer.respond(request, "accepted", { subscriptionId: "s2" });
          peer.event("s1", 8, patch(7)); // the old id is gone
          peer.event("s2", 7, patch(6));
        }
      },
    });
    const client = fake.client({ retryIntervalMs: 20 });
    try {
      const subscription = await client.subscribe({ kind: "run", runId: "run-1" }, { fromRevision: 4 });
      const seen: string[] = [];
      for await (const { subscriptionId, revision, event } of subscription) {
        seen.push(`${subscriptionId}:${revision}:${event.kind}${event.kind === "availability" ? `:${event.state}` : ""}`);
        if (seen.length === 5) break;
      }
      assert.deepEqual(seen, ["s1:5:runViewSnapshot", "s1:6:runViewPatch", "local:6:availability:unavailable", "local:6:availability:available", "s2:7:runViewPatch"]);
      const subscribes = fake.requests.filter((r) => r.operation === "subscribe").map((r) => r.payload);
      assert.deepEqual(subscribes, [
        { target: { kind: "run", runId: "run-1" }, fromRevision: 4 },
        { target: { kind: "run", runId: "run-1" }, fromRevision: 6 },
      ]);
      await sleep(50);
      // Leaving the loop unsubscribed the current server subscription.
      const unsubscribes = fake.requests.filter((r) => r.operation === "unsubscribe").map((r) => r.payload);
      assert.deepEqual(unsubscribes, [{ subscriptionId: "s2" }]);
      assert.equal(subscription.closed, true);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("a patch after a gap re-subscribes from the last accepted revision", async () => {
    let subscribes = 0;
    const fake = await Fake.start({
      onRequest: (request, peer) => {
        if (request.operation === "unsubscribe") {
          peer.respond(request, "accepted", {});
          return;
        }
        if (request.operation !== "subscribe") return;
        subscribes++;
        if (subscribes === 1) {
          peer.respond(request, "accepted", { subscriptionId: "s1" });
          peer.event("s1", 3, { kind: "runViewSnapshot", view: runViewAt(3) });
          peer.event("s1", 6, patch(5)); // revisions 4 and 5 were missed
        } else {
          peer.respond(request, "accepted", { subscriptionId: "s2" });
          peer.event("s2", 6, { kind: "runViewSnapshot", view: runViewAt(6) });
        }
      },
    });
    const client = fake.client();
    try {
      const subscription = await client.subscribe({ kind: "run", runId: "run-1" });
      const seen: string[] = [];
      for await (const { subscriptionId, revision, event } of subscription) {
        seen.push(`${subscriptionId}:${revision}:${event.kind}`);
        if (seen.length === 2) break;
      }
      assert.deepEqual(seen, ["s1:3:runViewSnapshot", "s2:6:runViewSnapshot"]);
      const sent = fake.requests.map((r) => [r.operation, r.payload]);
      assert.deepEqual(sent.slice(0, 3), [
        ["subscribe", { target: { kind: "run", runId: "run-1" } }],
        ["unsubscribe", { subscriptionId: "s1" }],
        ["subscribe", { target: { kind: "run", runId: "run-1" }, fromRevision: 3 }],
      ]);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("a consumer that falls behind gets the backlog dropped and a re-subscription from what it received", async () => {
    let subscribes = 0;
    const fake = await Fake.start({
      onRequest: (request, peer) => {
        if (request.operation === "unsubscribe") return peer.respond(request, "accepted", {});
        if (request.operation !== "subscribe") return;
        subscribes++;
        if (subscribes === 1) {
          peer.respond(request, "accepted", { subscriptionId: "s1" });
          for (let revision = 2; revision <= 5; revision++) peer.event("s1", revision, { kind: "runListSnapshot", rows: [] });
        } else {
          peer.respond(request, "accepted", { subscriptionId: "s2" });
          peer.event("s2", 9, { kind: "runListSnapshot", rows: [] });
        }
      },
    });
    const client = fake.client({ maxQueuedEvents: 2 });
    try {
      const subscription = await client.subscribe({ kind: "runList" }, { fromRevision: 1 });
      await sleep(100); // the events arrive while nobody reads
      const iterator = subscription[Symbol.asyncIterator]();
      const first = await iterator.next();
      assert.equal(first.value?.revision, 9);
      const resubscribe = fake.requests.filter((r) => r.operation === "subscribe")[1];
      assert.deepEqual(resubscribe?.payload, { target: { kind: "runList" }, fromRevision: 1 });
      await subscription.close();
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("a server without subscriptions answers unavailable: subscribe() throws that safe error", async () => {
    const fake = await Fake.start({
      onRequest: (request, peer) => peer.respond(request, "unavailable", undefined, { code: "unavailable", message: "this operation is not available in this server version" }),
    });
    const client = fake.client();
    try {
      const error = await rejectsWith(client.subscribe({ kind: "runList" }), "unavailable");
      assert.equal(error.message, "this operation is not available in this server version");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("unsubscribe() ends the iterator and removes the server subscription", async () => {
    const fake = await Fake.start({
      onRequest: (request, peer) => {
        if (request.operation === "subscribe") peer.respond(request, "accepted", { subscriptionId: "s1" });
        else peer.respond(request, "accepted", {});
      },
    });
    const client = fake.client();
    try {
      const subscription = await client.subscribe({ kind: "session", sessionId: "session-1" });
      const next = subscription[Symbol.asyncIterator]().next();
      await client.unsubscribe(subscription);
      assert.deepEqual(await next, { value: undefined, done: true });
      assert.deepEqual(fake.requests.map((r) => [r.operation, r.payload]), [
        ["subscribe", { target: { kind: "session", sessionId: "session-1" } }],
        ["unsubscribe", { subscriptionId: "s1" }],
      ]);
    } finally {
      client.close();
      await fake.close();
    }
  });
});

// ---- cold start and timer references, in child processes ------------------------

const clientModule = new URL("../src/client/index.js", import.meta.url).href;

interface ChildResult {
  code: number | null;
  stdout: string;
  stderr: string;
  ms: number;
}

/** Runs an ES module script in a fresh node process. */
function runScript(source: string, timeoutMs = 20_000): Promise<ChildResult> {
  const dir = mkdtempSync(join(tmpdir(), "piw-script-"));
  const file = join(dir, "script.mjs");
  writeFileSync(file, source);
  const started = Date.now();
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [file], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`script did not exit within ${timeoutMs} ms: ${stdout} ${stderr}`));
    }, timeoutMs);
    child.on("close", (code) => {
      clearTimeout(timer);
      rmSync(dir, { recursive: true, force: true });
      resolve({ code, stdout, stderr, ms: Date.now() - started });
    });
  });
}

/** A CommonJS fake server for child processes: greets, answers server.status, exits after `lifeMs`. */
const FAKE_SERVER_JS = String.raw`
const net = require("node:net");
const fs = require("node:fs");
const [socketPath, delayMs, lifeMs, pidFile] = process.argv.slice(2);
fs.appendFileSync(pidFile, process.pid + "\n");
const canon = (v) => Array.isArray(v) ? "[" + v.map(canon).join(",") + "]"
  : v !== null && typeof v === "object" ? "{" + Object.keys(v).sort().map((k) => JSON.stringify(k) + ":" + canon(v[k])).join(",") + "}"
  : JSON.stringify(v);
setTimeout(() => {
  const server = net.createServer((socket) => {
    socket.on("error", () => {});
    socket.write(canon({ schema: "pi-workflows.client.v1", type: "hello", role: "server", protocolVersion: 1, packageVersion: "${PACKAGE_VERSION}", serverEpoch: 3 }) + "\n");
    let buffer = "";
    socket.on("data", (d) => {
      buffer += d.toString();
      let at;
      while ((at = buffer.indexOf("\n")) >= 0) {
        const message = JSON.parse(buffer.slice(0, at));
        buffer = buffer.slice(at + 1);
        if (message.type !== "request") continue;
        const receipt = message.operation === "subscribe" ? { subscriptionId: "s1" }
          : { activeRunners: 0, ambiguousEffects: 0, expiredClaims: 0, parked: 0, pendingInteractions: 0, queued: 0, running: 0, serverEpoch: 3, socketAvailable: true, waiting: 0 };
        socket.write(canon({ schema: "pi-workflows.client.v1", type: "response", requestId: message.requestId, operation: message.operation, outcome: "accepted", receipt }) + "\n");
        if (message.operation === "subscribe") setTimeout(() => { socket.destroy(); server.close(); }, 100);
      }
    });
  });
  server.listen(socketPath);
}, Number(delayMs));
setTimeout(() => process.exit(0), Number(lifeMs));
`;

describe("WorkflowClient: cold start and timer references", () => {
  let dir: string;
  let pidFile: string;
  let serverJs: string;

  before(() => {
    dir = mkdtempSync(join(tmpdir(), "piw-cold-"));
    pidFile = join(dir, "pids");
    serverJs = join(dir, "fake-server.cjs");
    writeFileSync(serverJs, FAKE_SERVER_JS);
    writeFileSync(pidFile, "");
  });

  after(() => {
    // Leave no fake server behind, whatever happened.
    for (const line of readFileSync(pidFile, "utf8").split("\n")) {
      const pid = Number(line);
      if (pid > 0) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // already gone
        }
      }
    }
    rmSync(dir, { recursive: true, force: true });
  });

  /** A fake `pi-workflows` binary: `server start` counts its calls, then runs `body` (shell). */
  function fakeBin(name: string, body: string): string {
    const file = join(dir, name);
    writeFileSync(file, `#!/bin/sh\necho start >> "${join(dir, name + ".calls")}"\n${body}\n`);
    chmodSync(file, 0o755);
    return file;
  }

  const calls = (name: string): number => {
    const file = join(dir, name + ".calls");
    return existsSync(file) ? readFileSync(file, "utf8").split("\n").filter(Boolean).length : 0;
  };

  it("runs `server start` once and keeps a referenced retry timer until the server is ready", async () => {
    const home = join(dir, "home-ready");
    const socketPath = join(home, "host", "server.sock");
    // `server start` returns at once; the server listens only 700 ms later.
    const bin = fakeBin("bin-ready", `mkdir -p "${join(home, "host")}"\n"${process.execPath}" "${serverJs}" "${socketPath}" 700 8000 "${pidFile}" </dev/null >/dev/null 2>&1 &\nexit 0`);
    const result = await runScript(`
      import { WorkflowClient } from ${JSON.stringify(clientModule)};
      const client = new WorkflowClient({ home: ${JSON.stringify(home)}, bin: ${JSON.stringify(bin)}, retryIntervalMs: 50, startDeadlineMs: 10000 });
      client.serverStatus().then((status) => { console.log("STATUS " + status.serverEpoch); client.close(); }, (error) => { console.log("ERROR " + error.code + " " + error.message); });
    `);
    assert.equal(result.code, 0, result.stderr);
    assert.equal(result.stdout.trim(), "STATUS 3", "the process stayed alive until the server was ready");
    assert.equal(calls("bin-ready"), 1, "server start ran once");
  });

  it("an idle connection does not keep the process alive", async () => {
    const home = join(dir, "home-idle");
    const socketPath = join(home, "host", "server.sock");
    const bin = fakeBin("bin-idle", `mkdir -p "${join(home, "host")}"\n"${process.execPath}" "${serverJs}" "${socketPath}" 0 8000 "${pidFile}" </dev/null >/dev/null 2>&1 &\nexit 0`);
    const result = await runScript(`
      import { WorkflowClient } from ${JSON.stringify(clientModule)};
      const client = new WorkflowClient({ home: ${JSON.stringify(home)}, bin: ${JSON.stringify(bin)}, retryIntervalMs: 50 });
      client.serverStatus().then((status) => console.log("STATUS " + status.serverEpoch));
      // The client is not closed: its connection stays open but unreferenced.
    `);
    assert.equal(result.code, 0, result.stderr);
    assert.equal(result.stdout.trim(), "STATUS 3");
    assert.ok(result.ms < 6000, `exited after ${result.ms} ms, long before the fake server's 8 s life`);
  });

  it("background reconnect timers are unreferenced: an open subscription whose server went away does not keep the process alive", async () => {
    const home = join(dir, "home-bg");
    const socketPath = join(home, "host", "server.sock");
    const bin = fakeBin("bin-bg", `mkdir -p "${join(home, "host")}"\n"${process.execPath}" "${serverJs}" "${socketPath}" 0 8000 "${pidFile}" </dev/null >/dev/null 2>&1 &\nexit 0`);
    const result = await runScript(`
      import { WorkflowClient } from ${JSON.stringify(clientModule)};
      const client = new WorkflowClient({ home: ${JSON.stringify(home)}, bin: ${JSON.stringify(bin)}, retryIntervalMs: 50 });
      async function main() {
        const subscription = await client.subscribe({ kind: "runList" });
        console.log("SUBSCRIBED");
        for await (const { event } of subscription) console.log("EVENT " + event.kind + " " + (event.state ?? ""));
      }
      main().catch((error) => console.log("ERROR " + error.message));
    `);
    assert.equal(result.code, 0, result.stderr);
    assert.deepEqual(result.stdout.trim().split("\n"), ["SUBSCRIBED", "EVENT availability unavailable"]);
    assert.ok(result.ms < 6000, `exited after ${result.ms} ms although reconnects were scheduled`);
  });

  it("a failing `server start` is one clear unavailable error with the CLI's message, without waiting for the deadline", async () => {
    const home = join(dir, "home-fail");
    const bin = fakeBin("bin-fail", `echo "pi-workflows: cannot create the private state directory; check PI_WORKFLOWS_HOME" >&2\nexit 1`);
    const client = new WorkflowClient({ home, bin, retryIntervalMs: 20, startDeadlineMs: 30_000 });
    try {
      const started = Date.now();
      const error = await rejectsWith(client.serverStatus(), "unavailable");
      assert.ok(Date.now() - started < 10_000);
      assert.equal(error.message, "`pi-workflows server start` failed: cannot create the private state directory; check PI_WORKFLOWS_HOME");
      assert.equal(calls("bin-fail"), 1);
    } finally {
      client.close();
    }
  });

  it("when the start deadline passes, the client fails with one unavailable error", async () => {
    const home = join(dir, "home-late");
    const bin = fakeBin("bin-late", "exit 0");
    const client = new WorkflowClient({ home, bin, retryIntervalMs: 20, startDeadlineMs: 400 });
    try {
      const error = await rejectsWith(client.serverStatus(), "unavailable");
      assert.match(error.message, /did not become ready within 1 s/);
      assert.equal(calls("bin-late"), 1);
    } finally {
      client.close();
    }
  });

  it("`already running` from a racing start keeps retrying until the other server is ready", async () => {
    const home = join(dir, "home-race");
    const socketPath = join(home, "host", "server.sock");
    const bin = fakeBin(
      "bin-race",
      `mkdir -p "${join(home, "host")}"\n"${process.execPath}" "${serverJs}" "${socketPath}" 500 8000 "${pidFile}" </dev/null >/dev/null 2>&1 &\necho "pi-workflows: a pi-workflows server is already running for this state directory; use \`pi-workflows server status\` or \`pi-workflows server stop\`" >&2\nexit 1`,
    );
    const client = new WorkflowClient({ home, bin, retryIntervalMs: 20, startDeadlineMs: 10_000 });
    try {
      const status = await client.serverStatus();
      assert.equal(status.serverEpoch, 3);
    } finally {
      client.close();
    }
  });
});

describe("package", () => {
  it("PACKAGE_VERSION is the version in package.json", () => {
    const pkg = JSON.parse(readFileSync(fileURLToPath(new URL("../../package.json", import.meta.url)), "utf8")) as { version: string; exports: Record<string, unknown> };
    assert.equal(PACKAGE_VERSION, pkg.version);
    assert.deepEqual(pkg.exports["./client"], { types: "./dist/client/index.d.ts", default: "./dist/client/index.js" });
  });
});

// ---- fixtures ------------------------------------------------------------------------

function statusReceipt() {
  return { activeRunners: 0, ambiguousEffects: 0, expiredClaims: 0, parked: 0, pendingInteractions: 0, queued: 0, running: 0, serverEpoch: 7, socketAvailable: true, waiting: 0 };
}

function runViewAt(revision: number) {
  const ref = { bytes: 2, digest: "sha256:" + "a".repeat(64), mediaType: "application/json" };
  return {
    schema: "pi-workflows.run-view.v1",
    runId: "run-1",
    revision,
    workflowName: "linear",
    status: { run: "running", queue: "running", paused: false, executionMode: "headless" },
    display: { status: "running", activity: "runner", controls: ["pause", "cancel"] },
    createdAtMs: 1,
    updatedAtMs: 2,
    nodes: [],
    edges: [],
    steps: { items: [], total: 0 },
    updates: { items: [], total: 0 },
    definition: ref,
    graphHistory: ref,
  };
}
