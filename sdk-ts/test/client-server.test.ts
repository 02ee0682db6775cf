/**
 * Integration tests of WorkflowClient against the REAL server binary
 * (`target/debug/pi-workflows`, or PI_WORKFLOWS_BIN), with the scripted Rust
 * runner (`target/debug/pi-workflows-scripted-runner`, or
 * PI_WORKFLOWS_SCRIPTED_RUNNER) as the runner and the JSON scripts of
 * server/tests/scripts as workflows. One server per file, in a temporary
 * PI_WORKFLOWS_HOME, started by the client itself; the file ends by
 * stopping it and checking that no process of that home is left.
 *
 * Build the binaries first: `cargo build -p server` (scripts/test-all.sh does).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createConnection, createServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import { LiveRunView, WorkflowClient, WorkflowClientError, type Accepted } from "../src/client/index.js";
import type { ClientMessage, Request, Response, RunView } from "../src/generated/types.js";
import { FrameDecoder, decodeClientFrame } from "../src/protocol/index.js";

const repo = fileURLToPath(new URL("../../../", import.meta.url));
const bin = process.env["PI_WORKFLOWS_BIN"] || join(repo, "target", "debug", "pi-workflows");
const runner = process.env["PI_WORKFLOWS_SCRIPTED_RUNNER"] || join(repo, "target", "debug", "pi-workflows-scripted-runner");
const controllerChild = process.env["PI_WORKFLOWS_SCRIPTED_CONTROLLER"] || join(repo, "target", "debug", "pi-workflows-scripted-controller");
const scripts = join(repo, "server", "tests", "scripts");

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

async function rejectsWith(promise: Promise<unknown>, code: string, outcome?: string): Promise<WorkflowClientError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof WorkflowClientError, `expected WorkflowClientError, got ${String(error)}`);
    assert.equal(error.code, code, `code (message: ${error.message})`);
    if (outcome !== undefined) assert.equal(error.outcome, outcome);
    return error;
  }
  assert.fail(`expected a ${code} error`);
}

/** Processes whose environment names this home (the server and its runners). */
function processesOf(home: string): number[] {
  const marker = Buffer.from(`PI_WORKFLOWS_HOME=${home}\0`);
  const found: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${entry}/environ`).includes(marker)) found.push(Number(entry));
    } catch {
      // gone, or not ours
    }
  }
  return found;
}

const active = (s: { queued: number; running: number; parked: number; waiting: number }): number => s.queued + s.running + s.parked + s.waiting;

describe("WorkflowClient against the real server", () => {
  let dir: string;
  let home: string;
  let project: string;
  let env: NodeJS.ProcessEnv;
  let client: WorkflowClient;

  const settled = (runId: string, statuses = ["completed", "failed", "cancelled", "timed_out"]): Promise<RunView> =>
    until(`run ${runId} to settle`, async () => {
      const view = await client.runView(runId);
      return statuses.includes(view.status.run) ? view : undefined;
    });

  const start = (workflow: string, input: unknown = {}, options = {}): Promise<Accepted<"run.start">> =>
    client.runStart({ workflow, input: input as never, executionMode: "headless", projectPath: project }, options);

  /** A script whose node `a` blocks until its runner is stopped. */
  let stallScript: string;

  before(() => {
    for (const [what, path] of [
      ["the server binary", bin],
      ["the scripted runner", runner],
      ["the scripted controller", controllerChild],
    ] as const) {
      if (!existsSync(path)) throw new Error(`${what} is missing at ${path}: build it first with \`cargo build -p server\` (or set PI_WORKFLOWS_BIN / PI_WORKFLOWS_SCRIPTED_RUNNER)`);
    }
    dir = mkdtempSync(join(tmpdir(), "piw-it-"));
    home = join(dir, "home");
    project = join(dir, "project");
    env = {
      ...process.env,
      PI_WORKFLOWS_HOME: home,
      PI_WORKFLOWS_RUNNER: runner,
      PI_WORKFLOWS_CONTROLLER_RUNNER: controllerChild,
      PI_WORKFLOWS_CLAIM_TTL_MS: "3000",
      PI_WORKFLOWS_SERVER_LEASE_MS: "2000",
      PI_WORKFLOWS_STOP_GRACE_MS: "1000",
      PI_WORKFLOWS_IDLE_EXIT_MS: "600000",
    };
    stallScript = join(dir, "stall.json");
    writeFileSync(
      stallScript,
      JSON.stringify({
        workflowName: "stall",
        topology: {
          startAt: "a",
          nodes: [
            { id: "a", nodeType: "compute", timeout: { kind: "none" }, mountPath: [] },
            { id: "b", nodeType: "compute", timeout: { kind: "default" }, mountPath: [] },
          ],
          edges: [{ kind: "plain", from: "a", to: "b" }],
          mounts: [],
        },
        nodes: { a: [{ stall: true }] },
      }),
    );
    client = new WorkflowClient({ home, bin, env, startDeadlineMs: 60_000 });
  });

  after(async () => {
    client?.close();
    if (home === undefined) return;
    await new Promise<void>((resolve) => execFile(bin, ["server", "stop"], { env, timeout: 30_000 }, () => resolve()));
    let left = processesOf(home);
    for (let i = 0; i < 40 && left.length > 0; i++) {
      await sleep(50);
      left = processesOf(home);
    }
    for (const pid of left) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    rmSync(dir, { recursive: true, force: true });
    assert.deepEqual(left, [], "no server or runner process is left behind");
  });

  it("starts the server on demand when the socket is absent", async () => {
    const socket = join(home, "host", "server.sock");
    assert.equal(existsSync(socket), false);
    const status = await client.serverStatus();
    assert.ok(status.serverEpoch >= 1);
    assert.equal(status.socketAvailable, true);
    assert.equal(statSync(socket).mode & 0o777, 0o600, "the socket is user-only");
    const connected = await client.connect();
    assert.equal(connected.serverVersion, "0.1.0");
  });

  it("starts a run and reads its view until it completed", async () => {
    const started = await start(join(scripts, "linear.json"));
    assert.equal(started.outcome, "accepted");
    assert.ok(started.receipt.runId.length > 0);
    const view = await settled(started.receipt.runId);
    assert.equal(view.status.run, "completed");
    assert.equal(view.display.status, "completed");
    assert.equal(view.title, "A linear three-node run");
    assert.deepEqual(
      view.steps.items.map((step) => [step.nodeId, step.outcome]),
      [
        ["a", "ok"],
        ["b", "ok"],
        ["c", "ok"],
      ],
    );
  });

  it("failure routing through $result.outcome completes; a completed run cannot be restarted", async () => {
    const started = await start(join(scripts, "switch.json"));
    const view = await settled(started.receipt.runId);
    assert.equal(view.status.run, "completed");
    assert.deepEqual(
      view.steps.items.map((step) => [step.nodeId, step.outcome]),
      [
        ["fetch", "failed"],
        ["recover", "ok"],
      ],
    );
    await rejectsWith(client.runRestart(started.receipt.runId), "restartRefused", "rejected");
  });

  it("restart makes a new run from a failed run's reference; the same failure again is not restarted", async () => {
    const started = await start(join(scripts, "loop.json"));
    const failed = await settled(started.receipt.runId);
    assert.equal(failed.status.run, "failed");
    assert.equal(failed.steps.items.length, 6, "maxSteps 6 bounds the loop");
    const restarted = await client.runRestart(started.receipt.runId);
    assert.equal(restarted.outcome, "accepted");
    assert.equal(restarted.receipt.runId, started.receipt.runId);
    assert.notEqual(restarted.receipt.newRunId, started.receipt.runId);
    const again = await settled(restarted.receipt.newRunId);
    assert.equal(again.status.run, "failed");
    await rejectsWith(client.runRestart(restarted.receipt.newRunId), "restartRefused", "rejected");
  });

  it("pause, resume and cancel behave as the kernel says", async () => {
    const started = await start(stallScript);
    const runId = started.receipt.runId;
    await until("node a to run", async () => {
      const view = await client.runView(runId);
      return view.display.status === "running" && view.display.currentNode === "a" ? view : undefined;
    });

    const paused = await client.runPause(runId);
    assert.equal(paused.outcome, "accepted");
    assert.equal(paused.receipt.runId, runId);
    let view = await client.runView(runId);
    assert.equal(view.status.paused, true);
    assert.equal(view.display.status, "paused");
    assert.ok(view.display.controls.includes("resume"));
    await rejectsWith(client.runPause(runId), "alreadyPaused", "rejected");

    const resumed = await client.runResume(runId);
    assert.equal(resumed.outcome, "accepted");
    view = await until("node a to run again", async () => {
      const next = await client.runView(runId);
      return !next.status.paused && next.display.status === "running" && next.display.currentNode === "a" ? next : undefined;
    });
    await rejectsWith(client.runResume(runId), "notResumable", "rejected");

    const cancelled = await client.runCancel(runId);
    assert.equal(cancelled.outcome, "accepted");
    assert.equal(cancelled.receipt.status, "cancelled");
    view = await client.runView(runId);
    assert.equal(view.status.run, "cancelled");
    assert.equal(view.display.status, "cancelled");
    await rejectsWith(client.runPause(runId), "terminal", "rejected");
    await rejectsWith(client.runResume(runId), "terminal", "rejected");
    await rejectsWith(client.runCancel(runId), "terminal", "rejected");
  });

  it("a checkpoint waits; its answer starts one continuation that completes, and a repeated answer adopts it", async () => {
    const started = await start(join(scripts, "checkpoint.json"));
    const runId = started.receipt.runId;
    await settled(runId, ["waiting"]);
    const answer = await client.checkpointAnswer(runId, { publish: true }, { idempotencyKey: "answer-1" });
    assert.equal(answer.outcome, "accepted");
    const continuation = answer.receipt.continuationRunId;
    const again = await client.checkpointAnswer(runId, { publish: true }, { idempotencyKey: "answer-1" });
    assert.equal(again.outcome, "adopted");
    assert.equal(again.receipt.continuationRunId, continuation);
    await rejectsWith(client.checkpointAnswer(runId, { publish: false }), "conflict", "rejected");
    const view = await settled(continuation);
    assert.equal(view.status.run, "completed");
    const nodes = view.steps.items.map((step) => step.nodeId);
    assert.equal(nodes[nodes.length - 1], "publish");
    assert.equal(nodes.filter((node) => node === "publish").length, 1);
  });

  it("a retry after a dropped connection adopts the stored receipt: one run, same receipt", async () => {
    const before = active(await client.serverStatus());
    const proxy = await dropProxy(join(home, "host", "server.sock"), join(dir, "proxy.sock"), "run.start");
    const dropped = new WorkflowClient({ socketPath: proxy.path, autoStart: false, retryIntervalMs: 20 });
    try {
      const result = await dropped.runStart({ workflow: stallScript, input: { n: 1 }, executionMode: "headless", projectPath: project });
      const original = await proxy.original;
      assert.equal(original.outcome, "accepted", "the first attempt committed on the server although its connection was gone");
      assert.equal(result.outcome, "adopted");
      assert.deepEqual(result.receipt, original.receipt);
      assert.equal(proxy.connections(), 2);
      const [first, retry] = proxy.requests();
      assert.ok(first !== undefined && retry !== undefined);
      assert.notEqual(retry.requestId, first.requestId);
      const { requestId: _a, ...firstIdentity } = first;
      const { requestId: _b, ...retryIdentity } = retry;
      assert.deepEqual(retryIdentity, firstIdentity);
      assert.equal(active(await client.serverStatus()), before + 1, "exactly one run was created");
      await client.runCancel(result.receipt.runId);
    } finally {
      dropped.close();
      await proxy.close();
    }
  });

  it("reusing an idempotency key with another payload is a conflict", async () => {
    const workflow = join(scripts, "linear.json");
    const first = await start(workflow, { a: 1 }, { idempotencyKey: "start-key-1" });
    assert.equal(first.outcome, "accepted");
    const same = await start(workflow, { a: 1 }, { idempotencyKey: "start-key-1" });
    assert.equal(same.outcome, "adopted");
    assert.deepEqual(same.receipt, first.receipt);
    const error = await rejectsWith(start(workflow, { a: 2 }, { idempotencyKey: "start-key-1" }), "conflict", "conflict");
    assert.equal(error.message, "this idempotency key or request id was already used for another request");
    await settled(first.receipt.runId);
  });

  it("a start the resolver refuses is rejected with the resolver's safe error", async () => {
    const error = await rejectsWith(start(join(dir, "missing.json")), "notFound", "rejected");
    assert.equal(error.message, "the workflow script was not found");
  });

  it("notFound errors carry only the server's safe code and message", async () => {
    const view = await rejectsWith(client.runView("run-does-not-exist"), "notFound", "notFound");
    assert.equal(view.message, "no run with this id; check `pi-workflows runs`");
    assert.deepEqual(Object.keys(view).sort(), ["code", "name", "operation", "outcome"]);
    await rejectsWith(client.runCancel("run-does-not-exist"), "notFound", "notFound");
  });

  it("referenced content is read and verified, and is unavailable through another run or media type", async () => {
    const first = await start(join(scripts, "linear.json"));
    const view = await settled(first.receipt.runId);
    const definition = (await client.readJsonContent(view.definition, { runId: view.runId })) as { startAt?: string };
    assert.equal(typeof definition.startAt, "string");
    const history = (await client.readJsonContent(view.graphHistory, { runId: view.runId })) as unknown[];
    assert.equal(history.length, view.steps.total);
    const other = await start(join(scripts, "switch.json"));
    await settled(other.receipt.runId);
    await rejectsWith(client.readContent(view.definition, { runId: other.receipt.runId }), "contentUnavailable", "unavailable");
    await rejectsWith(
      client.readContent({ ...view.definition, mediaType: "text/plain" }, { runId: view.runId }),
      "contentUnavailable",
      "unavailable",
    );
  });

  it("a run with 10 MiB of updates: the view stays bounded, a live view follows it and the complete view holds every update", async () => {
    // 17 nodes × 10 updates of 60 KB (each inside the 64 KiB limit), paced
    // under the update rate limit (a burst of 100, then 20 per second).
    const ids = Array.from({ length: 17 }, (_, i) => `u${i + 1}`);
    const nodes: Record<string, unknown[]> = {};
    ids.forEach((id, n) => {
      let behaviour: Record<string, unknown> = { finish: { node: id } };
      for (let u = 9; u >= 0; u--) {
        const key = `k${String(n * 10 + u).padStart(3, "0")}`;
        behaviour = { update: { type: "log", key, data: { key, pad: "y".repeat(60_000) } }, then: { sleepMs: 60, then: behaviour } };
      }
      nodes[id] = [behaviour];
    });
    const script = join(dir, "updates.json");
    writeFileSync(
      script,
      JSON.stringify({
        workflowName: "updates",
        topology: {
          startAt: "u1",
          nodes: ids.map((id) => ({ id, nodeType: "compute", timeout: { kind: "default" }, mountPath: [] })),
          edges: ids.slice(1).map((to, i) => ({ kind: "plain", from: ids[i], to })),
          mounts: [],
        },
        nodes,
      }),
    );
    const expected = Array.from({ length: 170 }, (_, i) => `k${String(i).padStart(3, "0")}`);
    const keysOf = (items: { key: string; data: unknown }[]): string[] =>
      items
        .map((item) => {
          const data = item.data as { key: string; pad: string };
          assert.equal(data.key, item.key);
          assert.equal(data.pad.length, 60_000);
          return item.key;
        })
        .sort();
    const started = await start(script);
    const runId = started.receipt.runId;
    // A live view from the start follows the run to its end.
    const live = new LiveRunView();
    const subscription = await client.subscribe({ kind: "run", runId });
    const followed = (async () => {
      for await (const frame of subscription) {
        if (frame.event.kind === "availability") {
          assert.notEqual(frame.subscriptionId, "connection", `the server ended the connection: ${frame.event.reason ?? ""}`);
          continue;
        }
        const view = live.apply(frame.event);
        if (view.display.status === "completed") return view;
      }
      assert.fail("the subscription ended before the run completed");
    })();
    // An unref'd deadline: a pending timer would keep this file's process alive for two minutes after its tests.
    const deadline = new Promise<never>((_, reject) => setTimeout(() => reject(new Error("the live view did not see the run complete")), 120_000).unref());
    const final = await Promise.race([followed, deadline]);
    subscription.close();
    assert.equal(final.updates.total, 170);
    // The inline view is bounded; every update is reachable through pages.
    // (Read once the runner's exit is recorded, so the revision holds still.)
    const view = await until("the runner exit to be recorded", async () => {
      const current = await client.runView(runId, { signal: AbortSignal.timeout(30_000) });
      return current.display.activity === "none" ? current : undefined;
    });
    assert.equal(view.updates.total, 170);
    assert.ok(view.updates.items.length < 170 && view.updates.nextCursor === String(view.updates.items.length));
    const paged = [...view.updates.items];
    for await (const page of client.pages(runId, { collection: "updates", revision: view.revision, limit: 1000, maxBytes: 1024 * 1024, cursor: view.updates.nextCursor })) {
      assert.equal(page.revision, view.revision);
      paged.push(...(page.items as unknown as typeof paged));
    }
    assert.deepEqual(keysOf(paged), expected);
    // The complete view: every update and step inline, at one revision.
    const complete = await client.completeRunView(runId, { signal: AbortSignal.timeout(60_000) });
    assert.equal(complete.revision, view.revision);
    assert.equal(complete.updates.nextCursor, undefined);
    assert.equal(complete.updates.total, 170);
    assert.deepEqual(keysOf(complete.updates.items), expected);
    assert.deepEqual(complete.updates.items, paged, "the same updates, newest first");
    assert.equal(complete.steps.items.length, 17);
    assert.deepEqual({ ...complete, updates: null }, { ...view, updates: null }, "the rest is the bounded view");
  });

  it("resources: apply, reconcile, get, list and delete; a missing resource is notFound", async () => {
    const controllers = join(project, ".pi", "controllers");
    mkdirSync(controllers, { recursive: true });
    writeFileSync(join(controllers, "repos.controller.ts"), "export default {};\n");
    const spec = { initialStatus: { phase: "new" }, repo: "acme/widgets" };
    const applied = await client.resourceApply({ controller: "repos", key: "acme#1", spec, projectPath: project });
    assert.equal(applied.receipt.resourceVersion, 1);
    // The server reconciles the resource on its own (each settled pass writes
    // a version), so what the client's own commands did is read from the
    // generation and the audit feed, never from an exact later version.
    const again = await client.resourceApply({ controller: "repos", key: "acme#1", spec, projectPath: project });
    assert.ok(again.receipt.resourceVersion >= 1);
    assert.ok((await client.resourceReconcile("repos", "acme#1")).receipt.resourceVersion >= 1);
    const view = await client.resourceGet("repos", "acme#1");
    assert.deepEqual(view.spec, spec);
    assert.equal(view.generation, 1, "the same spec again is not a new generation");
    assert.deepEqual(view.status.controllerStatus, { phase: "new" });
    const commands = view.events.map((event) => event.kind).filter((kind) => kind === "applied" || kind === "reconcile_requested" || kind === "deletion_requested");
    assert.deepEqual(commands, ["applied", "reconcile_requested"], "the same spec again writes no second applied event");
    const list = await client.resourceList("repos");
    assert.deepEqual(list.resources.map((row) => [row.key, row.generation, row.deleting]), [["acme#1", 1, false]]);
    assert.ok((await client.resourceDelete("repos", "acme#1")).receipt.resourceVersion > view.resourceVersion);
    assert.equal((await client.resourceList()).resources[0]?.deleting, true);
    await rejectsWith(client.resourceGet("repos", "missing"), "notFound", "notFound");
    await rejectsWith(client.resourceReconcile("repos", "missing"), "notFound", "notFound");
  });

  it("a client of another package version gets one clear package-version error", async () => {
    const other = new WorkflowClient({ home, bin, env, packageVersion: "0.0.1" });
    try {
      const error = await rejectsWith(other.serverStatus(), "packageVersionMismatch");
      assert.match(error.message, /install matching pi-workflows packages/);
      assert.doesNotMatch(error.message, /database|sqlite/i);
    } finally {
      other.close();
    }
  });

  it("server.stop stops the server; nothing of this home keeps running", async () => {
    const stopped = await client.serverStop();
    assert.equal(stopped.stopping, true);
    await until("the server to exit", async () => (processesOf(home).length === 0 ? true : undefined));
    const offline = new WorkflowClient({ home, bin, env, autoStart: false });
    try {
      await rejectsWith(offline.serverStatus(), "unavailable");
    } finally {
      offline.close();
    }
  });
});

/**
 * A socket proxy in front of the server that drops the client's connection
 * right after forwarding the first `operation` request (the server still
 * receives and commits it), and lets the client's next connection through
 * only once the server answered that first attempt, so the retry finds the
 * stored receipt.
 */
async function dropProxy(upstreamPath: string, path: string, operation: string) {
  const requests: Request[] = [];
  let connections = 0;
  let resolveOriginal!: (response: Response) => void;
  const original = new Promise<Response>((resolve) => {
    resolveOriginal = resolve;
  });
  const sockets: Socket[] = [];
  const tap = (onMessage: (message: ClientMessage) => void) => {
    const decoder = new FrameDecoder();
    return (chunk: Buffer) => {
      decoder.push(chunk);
      for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) onMessage(decodeClientFrame(frame));
    };
  };
  const server = createServer((downstream) => {
    connections++;
    sockets.push(downstream);
    downstream.on("error", () => undefined);
    if (connections === 1) {
      const upstream = createConnection(upstreamPath);
      sockets.push(upstream);
      upstream.on("error", () => undefined);
      let droppedId: string | null = null;
      upstream.on(
        "data",
        tap((message) => {
          if (message.type === "response" && message.requestId === droppedId) {
            resolveOriginal(message);
            upstream.end();
          }
        }),
      );
      upstream.on("data", (chunk: Buffer) => {
        if (droppedId === null && !downstream.destroyed) downstream.write(chunk);
      });
      downstream.on("data", (chunk: Buffer) => {
        if (droppedId === null) upstream.write(chunk);
      });
      downstream.on(
        "data",
        tap((message) => {
          if (message.type === "request" && message.operation === operation && droppedId === null) {
            requests.push(message);
            droppedId = message.requestId;
            setImmediate(() => downstream.destroy()); // after the bytes went upstream
          }
        }),
      );
      return;
    }
    downstream.pause();
    void original.then(() => {
      const upstream = createConnection(upstreamPath);
      sockets.push(upstream);
      upstream.on("error", () => undefined);
      downstream.on(
        "data",
        tap((message) => {
          if (message.type === "request" && message.operation === operation) requests.push(message);
        }),
      );
      downstream.pipe(upstream);
      upstream.pipe(downstream);
      downstream.resume();
    });
  });
  await new Promise<void>((resolve) => server.listen(path, resolve));
  return {
    path,
    original,
    requests: () => requests,
    connections: () => connections,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
