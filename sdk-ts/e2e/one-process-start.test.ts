/**
 * One runner process for the resolution and the first run of a fresh
 * `run.start` (docs/ARCHITECTURE.md, "One process for resolution and the
 * first run"), through the real server and the node runner, on both
 * loaders: Node 20 (jiti) and Node 22 (Node's type stripping; the Node that
 * `scripts/install-pi.sh` installs into `.e2e/pi/`).
 *
 * Every runner process the server starts is counted: the runner command is
 * `node --import <counter> bin.js`, and the counter appends the process id
 * to a file before the runner's own modules load.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, before, describe, it } from "node:test";
import { piInstall } from "../test-support/pi-install.js";
import { RUNNER_BIN, type TestClient, TestServer, processAlive } from "../test-support/server.js";

const SDK = '"@pi-workflows/sdk"';

/** Whether `node` strips TypeScript types itself, with the hooks the runner's native loader needs (Node 22.18+). */
function stripsTypes(node: string): boolean {
  const probe = "console.log(Boolean(process.features.typescript) && typeof require('node:module').registerHooks === 'function')";
  return execFileSync(node, ["-e", probe], { encoding: "utf8" }).trim() === "true";
}

/** A server whose runner command records the id of every runner process it starts. */
class CountedServer {
  private constructor(
    readonly server: TestServer,
    readonly client: TestClient,
    readonly project: string,
    private readonly counterDir: string,
  ) {}

  static async start(node: string, env: Record<string, string> = {}): Promise<CountedServer> {
    const counterDir = mkdtempSync(join(tmpdir(), "piw-spawns-"));
    const counter = join(counterDir, "count.mjs");
    writeFileSync(counter, `import { appendFileSync } from "node:fs";\nappendFileSync(${JSON.stringify(join(counterDir, "spawned"))}, process.pid + "\\n");\n`);
    const server = await TestServer.start({ runner: `${node} --import=${pathToFileURL(counter).href} ${RUNNER_BIN}`, env });
    return new CountedServer(server, await server.connect(), server.project(), counterDir);
  }

  async stop(): Promise<void> {
    this.client.close();
    await this.server.stop();
    rmSync(this.counterDir, { recursive: true, force: true });
  }

  /** The ids of every runner process started so far, in order. */
  spawned(): number[] {
    const path = join(this.counterDir, "spawned");
    if (!existsSync(path)) return [];
    return readFileSync(path, "utf8")
      .split("\n")
      .filter((line) => line !== "")
      .map(Number);
  }

  /** Waits until none of the runner processes started so far, but `except`, is alive. */
  async noneAliveBut(except: number[] = [], timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    const living = (): number[] => this.spawned().filter((pid) => !except.includes(pid) && processAlive(pid));
    while (living().length > 0) {
      if (Date.now() > deadline) throw new Error(`runner processes still alive: ${living().join(", ")}\n${this.server.serverLog()}`);
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  writeWorkflow(name: string, source: string): string {
    const path = join(this.project, ".pi", "workflows", `${name}.workflow.ts`);
    writeFileSync(path, source);
    return path;
  }
}

/** Two compute nodes. */
function chain(name: string): string {
  return `import { compute, defineWorkflow } from ${SDK};
export default defineWorkflow({
  name: ${JSON.stringify(name)},
  startAt: "a",
  nodes: {
    a: compute({ run: () => ({ a: 1 }) }),
    b: compute({ run: ({ outputs }) => ({ b: (outputs.a as { a: number }).a + 1 }) }),
  },
  edges: [{ from: "a", to: "b" }],
});
`;
}

/** `first → hold`: \`hold\` writes \`<name>.started\` and waits until \`<name>.release\` exists. */
function holding(name: string, dir: string): string {
  const started = JSON.stringify(join(dir, `${name}.started`));
  const release = JSON.stringify(join(dir, `${name}.release`));
  return `import { existsSync, writeFileSync } from "node:fs";
import { compute, defineWorkflow } from ${SDK};
export default defineWorkflow({
  name: ${JSON.stringify(name)},
  startAt: "first",
  nodes: {
    first: compute({ run: () => ({ n: 1 }) }),
    hold: compute({
      timeoutMs: 60_000,
      run: ({ signal }) => new Promise((resolve, reject) => {
        writeFileSync(${started}, String(process.pid));
        const timer = setInterval(() => { if (existsSync(${release})) { clearInterval(timer); resolve({ held: true }); } }, 20);
        signal.addEventListener("abort", () => { clearInterval(timer); reject(signal.reason); });
      }),
    }),
  },
  edges: [{ from: "first", to: "hold" }],
});
`;
}

async function waitForFile(path: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!existsSync(path)) {
    if (Date.now() > deadline) throw new Error(`${path} did not appear`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

for (const loader of ["jiti", "type stripping"] as const) {
  describe(`one process for resolution and the first run, ${loader === "jiti" ? "Node 20 (jiti)" : "Node 22 (Node's type stripping)"}`, () => {
    let counted: CountedServer;
    const node = loader === "jiti" ? process.execPath : piInstall().node;

    before(async () => {
      assert.equal(stripsTypes(node), loader === "type stripping", `${node} is not the Node this case is about`);
      counted = await CountedServer.start(node);
    });
    after(async () => counted?.stop());

    it("a fresh run.start resolves and runs its first generation in one runner process", async () => {
      counted.writeWorkflow("pair", chain("pair"));
      const before = counted.spawned().length;
      const runId = await counted.client.start(counted.project, "pair");
      const view = await counted.client.settled(runId);
      assert.equal(view.status.run, "completed", JSON.stringify(view.failure ?? null));
      assert.deepEqual(view.steps.items.map((step) => `${step.nodeId}:${step.outcome}`), ["a:ok", "b:ok"]);
      const spawned = counted.spawned().slice(before);
      assert.equal(spawned.length, 1, `runner processes started for one fresh run.start: ${spawned.length}\n${counted.server.serverLog()}`);
      const loaded = loader === "jiti" ? /loaded workflow modules: 0 by Node type stripping, 1 by jiti/ : /loaded workflow modules: 1 by Node type stripping, 0 by jiti/;
      assert.match(counted.server.serverLog(), loaded);
      await counted.noneAliveBut();
    });

    it("a source changed after resolution parks the run workflowSourceChanged before any node runs", async () => {
      // title() runs at resolution after the sources were hashed and checked: it edits the file, so the handed run launch no longer verifies.
      const path = join(counted.project, ".pi", "workflows", "edited.workflow.ts");
      const marker = join(counted.server.root, "edited.marker");
      const original = `import { appendFileSync, readFileSync, writeFileSync } from "node:fs";
import { compute, defineWorkflow } from ${SDK};
export default defineWorkflow({
  name: "edited",
  title: () => { writeFileSync(${JSON.stringify(path)}, readFileSync(${JSON.stringify(path)}, "utf8") + "\\n// edited\\n"); return "edits itself"; },
  startAt: "a",
  nodes: { a: compute({ run: () => { appendFileSync(${JSON.stringify(marker)}, "a ran\\n"); return {}; } }) },
});
`;
      counted.writeWorkflow("edited", original);
      const before = counted.spawned().length;
      const runId = await counted.client.start(counted.project, "edited");
      const parked = await counted.client.waitFor(runId, (v) => /source changed/i.test(v.display.reason ?? ""), 20_000, "parked for the source change");
      assert.equal(parked.status.queue, "parked");
      assert.equal(parked.status.run, "running");
      assert.equal(existsSync(marker), false, "no node ran");
      assert.ok(counted.server.journal(runId).some((record) => record.event === "parked" && record.reason === "workflowSourceChanged"));
      assert.equal(counted.spawned().length - before, 1, "the resolving process parked it");
      await counted.noneAliveBut();
    });
  });
}

describe("one process for resolution and the first run: what ends the resolving process", () => {
  let counted: CountedServer;

  before(async () => {
    counted = await CountedServer.start(process.execPath);
  });
  after(async () => counted?.stop());

  it("an adopted retry of a started run starts no process", async () => {
    counted.writeWorkflow("retried", chain("retried"));
    const key = "k-retried-once";
    const payload = { workflow: "retried", input: {}, executionMode: "headless", projectPath: counted.project };
    const first = await counted.client.request("run.start", payload, { idempotencyKey: key });
    assert.equal(first.outcome, "accepted");
    const runId = (first.receipt as { runId: string }).runId;
    await counted.client.settled(runId);
    const before = counted.spawned().length;
    const retry = await counted.client.request("run.start", payload, { idempotencyKey: key });
    assert.equal(retry.outcome, "adopted");
    assert.deepEqual(retry.receipt, first.receipt);
    assert.equal(counted.spawned().length, before, "an adopted retry resolves nothing and runs nothing");
    await counted.noneAliveBut();
  });

  it("a start refused after its resolution leaves no process", async () => {
    counted.writeWorkflow("refused", chain("refused"));
    const before = counted.spawned().length;
    // Only an interactive run can be held: the kernel refuses this one after the workflow resolved.
    const refused = await counted.client.command("run.start", { workflow: "refused", input: {}, executionMode: "headless", projectPath: counted.project, held: true });
    assert.equal(refused.outcome, "rejected", JSON.stringify(refused));
    assert.equal(counted.spawned().length - before, 1, "one resolving process");
    await counted.noneAliveBut();
  });

  it("a held start ends its resolving process; activation starts a fresh runner", async () => {
    counted.writeWorkflow("held", chain("held"));
    const before = counted.spawned().length;
    const response = await counted.client.command("run.start", {
      workflow: "held",
      input: {},
      executionMode: "interactive",
      originSessionId: "session-held",
      projectPath: counted.project,
      held: true,
    });
    assert.equal(response.outcome, "accepted", JSON.stringify(response));
    const runId = (response.receipt as { runId: string }).runId;
    // Nothing waits while the run is held.
    await counted.noneAliveBut();
    assert.equal(counted.spawned().length - before, 1);
    assert.equal((await counted.client.command("run.activate", {}, runId)).outcome, "accepted");
    const view = await counted.client.settled(runId);
    assert.equal(view.status.run, "completed", JSON.stringify(view.failure ?? null));
    assert.equal(counted.spawned().length - before, 2, "the resolving process and a fresh runner");
    await counted.noneAliveBut();
  });
});

describe("one process for resolution and the first run: a queued start", () => {
  let counted: CountedServer;

  before(async () => {
    counted = await CountedServer.start(process.execPath, { PI_WORKFLOWS_MAX_WORKERS: "1" });
  });
  after(async () => counted?.stop());

  it("a start not admitted at once ends its resolving process; its later admission starts a fresh runner", async () => {
    const dir = counted.server.root;
    counted.writeWorkflow("blocker", holding("blocker", dir));
    counted.writeWorkflow("queued", chain("queued"));
    const blocker = await counted.client.start(counted.project, "blocker");
    await waitForFile(join(dir, "blocker.started"));
    const blockerPid = Number(readFileSync(join(dir, "blocker.started"), "utf8"));
    assert.deepEqual(counted.spawned(), [blockerPid], "the blocker resolved and runs in one process");
    const queued = await counted.client.start(counted.project, "queued");
    assert.equal((await counted.client.view(queued)).status.run, "queued");
    // The only slot is taken: the queued run's resolving process does not wait for it.
    await counted.noneAliveBut([blockerPid]);
    assert.equal(counted.spawned().length, 2);
    writeFileSync(join(dir, "blocker.release"), "go");
    assert.equal((await counted.client.settled(blocker)).status.run, "completed");
    const view = await counted.client.settled(queued);
    assert.equal(view.status.run, "completed", JSON.stringify(view.failure ?? null));
    assert.equal(counted.spawned().length, 3, "the queued run's admission started a fresh runner");
    await counted.noneAliveBut();
  });
});
