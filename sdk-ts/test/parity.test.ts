/**
 * TypeScript and Rust subscription parity against the REAL server: the
 * WorkflowClient (with LiveRunView) and the Rust client (through
 * `pi-workflows view <run> --json`, which prints the view it holds after
 * every event) follow the same run while commands drive it. At every step
 * both reach the server's revision, and every revision both saw shows the
 * same view: status, display, allowed controls and everything else.
 *
 * Build the binaries first: `cargo build -p server` (scripts/test-all.sh does).
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";

import { LiveRunView, WorkflowClient } from "../src/client/index.js";
import type { RunView } from "../src/generated/types.js";

const repo = fileURLToPath(new URL("../../../", import.meta.url));
const bin = process.env["PI_WORKFLOWS_BIN"] || join(repo, "target", "debug", "pi-workflows");
const runner = process.env["PI_WORKFLOWS_SCRIPTED_RUNNER"] || join(repo, "target", "debug", "pi-workflows-scripted-runner");
const scripts = join(repo, "server", "tests", "scripts");
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Every view one client held, by revision. */
type Seen = Map<number, RunView>;

/** Follows a run with the Rust CLI; its stdout is one view per line. */
function followWithRust(runId: string, env: NodeJS.ProcessEnv): { seen: Seen; child: ChildProcess; exited: Promise<number | null> } {
  const seen: Seen = new Map();
  const child = spawn(bin, ["view", runId, "--json"], { env, stdio: ["ignore", "pipe", "inherit"] });
  createInterface({ input: child.stdout! }).on("line", (line) => {
    const view = JSON.parse(line) as RunView;
    if (view.runId === runId) seen.set(view.revision, view);
  });
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return { seen, child, exited };
}

describe("TypeScript and Rust clients show the same live run view", () => {
  let dir: string;
  let env: NodeJS.ProcessEnv;
  let client: WorkflowClient;
  let project: string;
  const children: ChildProcess[] = [];

  before(() => {
    for (const path of [bin, runner]) if (!existsSync(path)) throw new Error(`${path} is missing: build it with \`cargo build -p server\``);
    dir = mkdtempSync(join(tmpdir(), "piw-parity-"));
    project = dir;
    env = {
      ...process.env,
      PI_WORKFLOWS_HOME: join(dir, "home"),
      PI_WORKFLOWS_RUNNER: runner,
      PI_WORKFLOWS_CLAIM_TTL_MS: "3000",
      PI_WORKFLOWS_SERVER_LEASE_MS: "2000",
      PI_WORKFLOWS_STOP_GRACE_MS: "1000",
      PI_WORKFLOWS_IDLE_EXIT_MS: "600000",
    };
    client = new WorkflowClient({ home: env["PI_WORKFLOWS_HOME"], bin, env, startDeadlineMs: 60_000 });
  });

  after(async () => {
    for (const child of children) child.kill("SIGKILL");
    await client.serverStop().catch(() => undefined);
    client.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Follows `runId` with both clients while `drive` issues commands. */
  async function follow(runId: string, drive: (step: (what: string) => Promise<void>) => Promise<void>): Promise<void> {
    const rust = followWithRust(runId, env);
    children.push(rust.child);
    const ts: Seen = new Map();
    const live = new LiveRunView();
    const subscription = await client.subscribe({ kind: "run", runId });
    const reading = (async () => {
      for await (const { event } of subscription) {
        if (event.kind !== "runViewSnapshot" && event.kind !== "runViewPatch") continue;
        const view = live.apply(event);
        ts.set(view.revision, view);
      }
    })();
    const checkpoints: Array<[string, number]> = [];
    /** Waits until both clients hold the server's current revision. */
    const step = async (what: string): Promise<void> => {
      const deadline = Date.now() + 20_000;
      for (;;) {
        const current = (await client.runView(runId)).revision;
        if (ts.has(current) && rust.seen.has(current)) {
          checkpoints.push([what, current]);
          return;
        }
        if (Date.now() > deadline) assert.fail(`${what}: both clients did not reach revision ${current} (ts ${[...ts.keys()]}, rust ${[...rust.seen.keys()]})`);
        await sleep(20);
      }
    };
    await drive(step);
    await subscription.close();
    await reading;
    rust.child.kill("SIGTERM");
    await rust.exited;
    assert.ok(checkpoints.length >= 3, "the run was compared at several steps");
    for (const [what, revision] of checkpoints) {
      const [mine, theirs] = [ts.get(revision)!, rust.seen.get(revision)!];
      assert.equal(mine.display.status, theirs.display.status, `${what}: display status at revision ${revision}`);
      assert.deepEqual(mine.display.controls, theirs.display.controls, `${what}: allowed controls at revision ${revision}`);
    }
    for (const [revision, view] of ts) {
      const other = rust.seen.get(revision);
      if (other !== undefined) assert.deepEqual(view, other, `the whole view at revision ${revision}`);
    }
  }

  /** Waits until the server shows `runId` with display `status`; fails the
   *  test when it does not within 20 s (it never goes on regardless). */
  async function untilStatus(runId: string, status: string): Promise<void> {
    const deadline = Date.now() + 20_000;
    let seen = "";
    for (;;) {
      seen = (await client.runView(runId)).display.status;
      if (seen === status) return;
      if (Date.now() > deadline) assert.fail(`the run did not reach display status ${status} within 20 s (it shows ${seen})`);
      await sleep(25);
    }
  }

  const start = async (script: string): Promise<string> =>
    (await client.runStart({ workflow: script, input: {}, executionMode: "headless", projectPath: project })).receipt.runId;

  it("through pause, resume and cancel of a running node", async () => {
    const stall = join(dir, "stall.json");
    writeFileSync(
      stall,
      JSON.stringify({
        workflowName: "stall",
        topology: {
          startAt: "a",
          nodes: [{ id: "a", nodeType: "compute", timeout: { kind: "none" }, mountPath: [] }],
          edges: [],
          mounts: [],
        },
        nodes: { a: [{ stall: true }] },
      }),
    );
    const runId = await start(stall);
    await follow(runId, async (step) => {
      const until = (status: string): Promise<void> => untilStatus(runId, status);
      await until("running");
      await step("running");
      await client.runPause(runId);
      await until("paused");
      await step("paused");
      await client.runResume(runId);
      await until("running");
      await step("resumed");
      await client.runCancel(runId);
      await until("cancelled");
      await step("cancelled");
    });
  });

  it("through a checkpoint that waits, is paused, resumed and answered", async () => {
    const runId = await start(join(scripts, "checkpoint.json"));
    await follow(runId, async (step) => {
      const until = (status: string): Promise<void> => untilStatus(runId, status);
      await until("waiting");
      await step("waiting");
      await client.runPause(runId);
      await until("paused");
      await step("paused");
      await client.runResume(runId);
      await until("waiting");
      await step("waiting again");
      await client.checkpointAnswer(runId, { approved: true });
      await until("completed");
      await step("answered");
    });
  });
});
