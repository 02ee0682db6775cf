/**
 * The runner under supervision, through the real server: node timeouts that
 * kill shell process groups, a runner SIGKILLed mid-node, pause, resume,
 * cancel, and a workflow edited while its run is parked.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { type TestClient, TestServer, stepNodes } from "../test-support/server.js";

let server: TestServer;
let client: TestClient;
let project: string;

before(async () => {
  server = await TestServer.start();
  project = server.project();
  client = await server.connect();
});

after(async () => {
  client?.close();
  await server?.stop();
});

const SDK = '"@pi-workflows/sdk"';

function writeWorkflow(name: string, source: string): string {
  const path = join(project, ".pi", "workflows", `${name}.workflow.ts`);
  writeFileSync(path, source);
  return path;
}

async function waitForFile(path: string, timeoutMs = 20_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  while (!existsSync(path) || readFileSync(path, "utf8") === "") {
    if (Date.now() > deadline) throw new Error(`${path} did not appear\n${server.serverLog()}`);
    await new Promise((r) => setTimeout(r, 25));
  }
  return readFileSync(path, "utf8");
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function waitGone(pids: number[], timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (pids.some(alive)) {
    if (Date.now() > deadline) throw new Error(`still alive: ${pids.filter(alive).join(", ")}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function lines(path: string): string[] {
  return existsSync(path) ? readFileSync(path, "utf8").split("\n").filter((line) => line !== "") : [];
}

/** A workflow `first → hold → last`: each node appends its name to `log`; `hold` writes its runner's pid and blocks until `release` exists. */
function holdingWorkflow(name: string, dir: string, extra = ""): string {
  const log = JSON.stringify(join(dir, `${name}.log`));
  const pid = JSON.stringify(join(dir, `${name}.pid`));
  const release = JSON.stringify(join(dir, `${name}.release`));
  return `import { appendFileSync, existsSync, writeFileSync } from "node:fs";
import { compute, defineWorkflow } from ${SDK};
${extra}
export default defineWorkflow({
  name: ${JSON.stringify(name)},
  startAt: "first",
  nodes: {
    first: compute({ run: () => { appendFileSync(${log}, "first\\n"); return { n: 1 }; } }),
    hold: compute({
      timeoutMs: 60_000,
      run: ({ signal }) => new Promise((resolve, reject) => {
        appendFileSync(${log}, "hold\\n");
        writeFileSync(${pid}, String(process.pid));
        const timer = setInterval(() => { if (existsSync(${release})) { clearInterval(timer); resolve({ held: true }); } }, 20);
        signal.addEventListener("abort", () => { clearInterval(timer); reject(signal.reason); });
      }),
    }),
    last: compute({ run: ({ outputs }) => { appendFileSync(${log}, "last\\n"); return { first: outputs.first, hold: outputs.hold }; } }),
  },
  edges: [{ from: "first", to: "hold" }, { from: "hold", to: "last" }],
});
`;
}

describe("supervision", () => {
  it("a shell action killed by its node timeout leaves no process behind", async () => {
    const pids = join(server.root, "shell.pids");
    const script = `process.on('SIGTERM', () => {}); const c = require('child_process').spawn('sleep', ['1000'], { stdio: 'ignore' }); require('fs').writeFileSync(${JSON.stringify(pids)}, process.pid + ' ' + c.pid); setInterval(() => {}, 1000);`;
    writeWorkflow(
      "stuck",
      `import { defineWorkflow, shell } from ${SDK};
export default defineWorkflow({ name: "stuck", startAt: "wait", nodes: {
  wait: shell({ timeoutMs: 1500, exec: () => ({ command: process.execPath, args: ["-e", ${JSON.stringify(script)}] }) }),
} });
`,
    );
    const runId = await client.start(project, "stuck");
    const [shellPid, sleepPid] = (await waitForFile(pids)).split(" ").map(Number) as [number, number];
    assert.ok(alive(shellPid) && alive(sleepPid));
    const view = await client.settled(runId, 20_000);
    assert.equal(view.status.run, "timed_out", JSON.stringify(view.display));
    assert.deepEqual(view.steps.items.map((step) => `${step.nodeId}:${step.outcome}`), ["wait:timed_out"]);
    await waitGone([shellPid, sleepPid]);
  });

  it("a runner SIGKILLed mid-node resumes from the last durable boundary and reruns only that node", async () => {
    const dir = server.root;
    writeWorkflow("crashy", holdingWorkflow("crashy", dir));
    const runId = await client.start(project, "crashy");
    const firstPid = Number(await waitForFile(join(dir, "crashy.pid")));
    writeFileSync(join(dir, "crashy.pid"), "");
    process.kill(firstPid, "SIGKILL");
    const secondPid = Number(await waitForFile(join(dir, "crashy.pid"), 30_000));
    assert.notEqual(secondPid, firstPid, "a new runner reran the interrupted node");
    writeFileSync(join(dir, "crashy.release"), "go");
    const view = await client.settled(runId, 30_000);
    assert.equal(view.status.run, "completed", JSON.stringify(view.display));
    assert.deepEqual(lines(join(dir, "crashy.log")), ["first", "hold", "hold", "last"], "first ran once, hold twice, last once");
    const resumed = server.journal(runId).filter((record) => record.event === "command");
    assert.deepEqual(resumed.map((record) => [record.command, (record.node as { nodeId: string }).nodeId]), [["start", "first"], ["resume", "hold"]]);
    assert.deepEqual(Object.keys((resumed[1]?.state as { outputs: object }).outputs), ["first"], "the resumed runner got the durable outputs");
  });

  it("pause stops the runner at once; resume reruns the interrupted node and completes", async () => {
    const dir = server.root;
    writeWorkflow("pausable", holdingWorkflow("pausable", dir));
    const runId = await client.start(project, "pausable");
    const pid = Number(await waitForFile(join(dir, "pausable.pid")));
    writeFileSync(join(dir, "pausable.pid"), "");
    const paused = await client.command("run.pause", {}, runId);
    assert.equal(paused.outcome, "accepted", JSON.stringify(paused));
    const view = await client.waitFor(runId, (v) => v.display.status === "paused" && v.status.queue === "parked", 10_000, "paused");
    assert.equal(view.status.paused, true);
    await waitGone([pid]);
    writeFileSync(join(dir, "pausable.release"), "go");
    const resumed = await client.command("run.resume", {}, runId);
    assert.equal(resumed.outcome, "accepted", JSON.stringify(resumed));
    const done = await client.settled(runId, 30_000);
    assert.equal(done.status.run, "completed");
    assert.deepEqual(lines(join(dir, "pausable.log")), ["first", "hold", "hold", "last"]);
  });

  it("a run with 5 MiB of outputs survives pause and resume and completes; the resumed nodes see the same outputs", async () => {
    const dir = server.root;
    const pid = JSON.stringify(join(dir, "big.pid"));
    const release = JSON.stringify(join(dir, "big.release"));
    const big = Array.from({ length: 10 }, (_, i) => `n${i + 1}`);
    const nodes = big.map((id, i) => `    ${id}: compute({ run: () => ({ node: ${i + 1}, pad: "${String(i + 1).padStart(2, "0")}-" + "x".repeat(512_000) }) }),`).join("\n");
    const edges = [...big, "hold", "last"].slice(1).map((to, i) => `{ from: ${JSON.stringify([...big, "hold"][i])}, to: ${JSON.stringify(to)} }`).join(", ");
    writeWorkflow(
      "big",
      `import { existsSync, writeFileSync } from "node:fs";
import { compute, defineWorkflow } from ${SDK};
export default defineWorkflow({
  name: "big",
  startAt: "n1",
  nodes: {
${nodes}
    hold: compute({
      timeoutMs: 60_000,
      run: ({ signal }) => new Promise((resolve, reject) => {
        writeFileSync(${pid}, String(process.pid));
        const timer = setInterval(() => { if (existsSync(${release})) { clearInterval(timer); resolve({ held: true }); } }, 20);
        signal.addEventListener("abort", () => { clearInterval(timer); reject(signal.reason); });
      }),
    }),
    last: compute({ run: ({ outputs, results }) => ({
      outputs: Object.keys(outputs).sort(),
      intact: Object.entries(outputs).filter(([id]) => id.startsWith("n")).every(([id, o]) => {
        const i = Number(id.slice(1));
        return o.node === i && o.pad === String(i).padStart(2, "0") + "-" + "x".repeat(512_000) && JSON.stringify(results[id].output) === JSON.stringify(o);
      }),
      bytes: Object.values(outputs).reduce((sum, o) => sum + JSON.stringify(o).length, 0),
    }) }),
  },
  edges: [${edges}],
});
`,
    );
    const runId = await client.start(project, "big");
    const runnerPid = Number(await waitForFile(join(dir, "big.pid"), 60_000));
    assert.equal((await client.command("run.pause", {}, runId)).outcome, "accepted");
    await client.waitFor(runId, (v) => v.display.status === "paused" && v.status.queue === "parked", 20_000, "paused");
    await waitGone([runnerPid]);
    writeFileSync(join(dir, "big.release"), "go");
    assert.equal((await client.command("run.resume", {}, runId)).outcome, "accepted");
    const done = await client.settled(runId, 60_000);
    assert.equal(done.status.run, "completed", JSON.stringify(done.display));
    const commands = server.journal(runId).filter((record) => record.event === "command");
    assert.deepEqual(commands.map((record) => [record.command, (record.node as { nodeId: string }).nodeId]), [["start", "n1"], ["resume", "hold"]]);
    const last = server.journal(runId).find((record) => record.event === "node" && record.nodeId === "last");
    const output = last?.output as { outputs: string[]; intact: boolean; bytes: number };
    assert.deepEqual(output.outputs, [...big, "hold"].sort());
    assert.equal(output.intact, true, "every resumed output is the one its node returned, and results[id].output is the same value");
    assert.ok(output.bytes > 5 * 512_000, `${output.bytes} bytes of outputs`);
  });

  it("cancel ends the run cancelled and stops its runner", async () => {
    const dir = server.root;
    writeWorkflow("cancellable", holdingWorkflow("cancellable", dir));
    const runId = await client.start(project, "cancellable");
    const pid = Number(await waitForFile(join(dir, "cancellable.pid")));
    const cancelled = await client.command("run.cancel", {}, runId);
    assert.equal(cancelled.outcome, "accepted");
    const view = await client.settled(runId);
    assert.equal(view.status.run, "cancelled");
    await waitGone([pid]);
    assert.deepEqual(stepNodes(view).slice(0, 1), ["first"]);
    assert.ok(!lines(join(dir, "cancellable.log")).includes("last"));
  });

  it("a workflow edited while its run is parked parks it workflowSourceChanged on resume; no edited code runs", async () => {
    const dir = server.root;
    const path = writeWorkflow("editable", holdingWorkflow("editable", dir));
    const runId = await client.start(project, "editable");
    await waitForFile(join(dir, "editable.pid"));
    assert.equal((await client.command("run.pause", {}, runId)).outcome, "accepted");
    await client.waitFor(runId, (v) => v.display.status === "paused" && v.status.queue === "parked", 10_000, "paused");
    const marker = join(dir, "edited.marker");
    writeFileSync(path, holdingWorkflow("editable", dir, `writeFileSync(${JSON.stringify(marker)}, "edited code ran");`));
    writeFileSync(join(dir, "editable.release"), "go");
    assert.equal((await client.command("run.resume", {}, runId)).outcome, "accepted");
    const parked = await client.waitFor(runId, (v) => /source changed/i.test(v.display.reason ?? ""), 20_000, "parked for the source change");
    assert.equal(parked.status.queue, "parked");
    assert.equal(parked.status.run, "running");
    assert.equal(existsSync(marker), false, "the edited module was never loaded");
    assert.ok(server.journal(runId).some((record) => record.event === "parked" && record.reason === "workflowSourceChanged"));
    assert.deepEqual(lines(join(dir, "editable.log")), ["first", "hold"]);
  });
});
