/**
 * Runner benchmark (a script, not a test): `npm --prefix sdk-ts run bench:runner`.
 *
 * 1. Marginal cost per step: a 100-step and a 1-step compute chain, each run
 *    headless to completion through a real server, with the node runner and
 *    with the scripted Rust runner (`pi-workflows-scripted-runner`) in the
 *    same process run. Duration = the run view's finishedAtMs − createdAtMs
 *    (server clock); marginal = (median d100 − median d1) / 99.
 * 2. Cold start: spawn → `runner.ready` on stdout for a one-node workflow,
 *    launched directly in run mode (p50 of N spawns), for both runners.
 *
 * Needs `cargo build -p server` (or PI_WORKFLOWS_BIN); prints a table.
 */
import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadAndCompile } from "../src/runner/loader.js";
import { FrameDecoder } from "../src/protocol/framing.js";
import { decodeRunnerFrame, encodeLaunch } from "../src/protocol/messages.js";
import { sha256Digest } from "../src/authoring/compile.js";
import { RUNNER_BIN, TestServer, scriptedRunnerBinary } from "../test-support/server.js";

const REPEATS = Number(process.env.BENCH_REPEATS ?? 5);
const COLD_STARTS = Number(process.env.BENCH_COLD_STARTS ?? 10);

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

function chainWorkflow(steps: number): string {
  const nodes = Array.from({ length: steps }, (_, i) => `    n${i + 1}: compute({ run: ({ outputs }) => ({ i: ${i + 1}, prev: (outputs.n${i} as { i?: number } | undefined)?.i ?? 0 }) }),`);
  const edges = Array.from({ length: steps - 1 }, (_, i) => `    { from: "n${i + 1}", to: "n${i + 2}" },`);
  return `import { compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "chain${steps}",
  maxSteps: ${steps},
  startAt: "n1",
  nodes: {
${nodes.join("\n")}
  },
  edges: [
${edges.join("\n")}
  ],
});
`;
}

function chainScript(steps: number): string {
  const nodes = Array.from({ length: steps }, (_, i) => ({ id: `n${i + 1}`, nodeType: "compute", timeout: { kind: "default" }, mountPath: [] }));
  const edges = Array.from({ length: steps - 1 }, (_, i) => ({ kind: "plain", from: `n${i + 1}`, to: `n${i + 2}` }));
  return JSON.stringify({ workflowName: `chain${steps}`, topology: { startAt: "n1", maxSteps: steps, nodes, edges, mounts: [] } });
}

async function durations(runner: "node" | "scripted"): Promise<{ d1: number[]; d100: number[] }> {
  const server = await TestServer.start({ ...(runner === "scripted" ? { runner: scriptedRunnerBinary() } : {}), env: { PI_WORKFLOWS_RUNNER_JOURNAL: "" } });
  try {
    const project = server.project();
    const refs: Record<number, string> = {};
    for (const steps of [1, 100]) {
      if (runner === "node") {
        writeFileSync(join(project, ".pi", "workflows", `chain${steps}.workflow.ts`), chainWorkflow(steps));
        refs[steps] = `chain${steps}`;
      } else {
        writeFileSync(join(project, `chain${steps}.json`), chainScript(steps));
        refs[steps] = `chain${steps}.json`;
      }
    }
    const client = await server.connect();
    const out = { d1: [] as number[], d100: [] as number[] };
    for (let repeat = 0; repeat < REPEATS; repeat += 1) {
      for (const steps of [1, 100] as const) {
        const runId = await client.start(project, refs[steps] as string, {});
        const view = await client.settled(runId, 120_000);
        if (view.status.run !== "completed") throw new Error(`${runner} chain${steps}: ${view.status.run} ${JSON.stringify(view.failure ?? null)}`);
        (steps === 1 ? out.d1 : out.d100).push((view.finishedAtMs ?? 0) - view.createdAtMs);
      }
    }
    client.close();
    return out;
  } finally {
    await server.stop();
  }
}

/** Spawn → runner.ready, in ms, for one run-mode launch. */
async function coldStart(command: string[], launch: Uint8Array, cwd: string): Promise<number> {
  const started = performance.now();
  const child = spawn(command[0] as string, command.slice(1), { cwd, stdio: ["pipe", "pipe", "ignore"] });
  child.stdin.write(launch);
  child.stdin.write("\n");
  const decoder = new FrameDecoder();
  const ready = await new Promise<number>((resolve, reject) => {
    child.stdout.on("data", (chunk: Buffer) => {
      decoder.push(chunk);
      for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
        const message = decodeRunnerFrame(frame);
        if (message.type === "runner.ready") resolve(performance.now() - started);
        else reject(new Error(`unexpected ${message.type}`));
      }
    });
    child.once("exit", () => reject(new Error("the runner exited before runner.ready")));
  });
  child.kill("SIGKILL");
  return ready;
}

async function coldStarts(dir: string): Promise<{ node: number[]; scripted: number[] }> {
  mkdirSync(dir, { recursive: true });
  const workflow = join(dir, "one.workflow.ts");
  writeFileSync(workflow, chainWorkflow(1));
  const compiled = await loadAndCompile(workflow, dir);
  const script = join(dir, "one.json");
  writeFileSync(script, chainScript(1));
  const launch = (path: string, digest: string): Uint8Array =>
    encodeLaunch({
      schema: "pi-workflows.worker-launch.v1",
      mode: "run",
      runId: "bench",
      generation: 1,
      runnerEpoch: "bench-1",
      projectPath: dir,
      protocolVersion: 1,
      workflowSource: { root: { kind: "file", path, hash: sha256Digest(readFileSync(path)) }, mounted: [] },
      definitionDigest: digest,
    });
  const node: number[] = [];
  const scripted: number[] = [];
  for (let i = 0; i < COLD_STARTS; i += 1) {
    node.push(await coldStart([process.execPath, RUNNER_BIN], launch(workflow, compiled.definitionDigest), dir));
    scripted.push(await coldStart([scriptedRunnerBinary()], launch(script, `sha256:${"0".repeat(64)}`), dir));
  }
  return { node, scripted };
}

const nodeRuns = await durations("node");
const scriptedRuns = await durations("scripted");
const marginal = (runs: { d1: number[]; d100: number[] }): number => (median(runs.d100) - median(runs.d1)) / 99;
const nodeMarginal = marginal(nodeRuns);
const scriptedMarginal = marginal(scriptedRuns);
const cold = await coldStarts(join(process.env.TMPDIR ?? "/tmp", `piw-bench-${process.pid}`));

console.log(`runner benchmark (${REPEATS} runs of each chain, ${COLD_STARTS} cold starts; node ${process.version})`);
console.log("| runner | 1-step run (median ms) | 100-step run (median ms) | marginal ms/step | cold start to runner.ready p50 (ms) |");
console.log("|---|---|---|---|---|");
console.log(`| node (jiti) | ${median(nodeRuns.d1)} | ${median(nodeRuns.d100)} | ${nodeMarginal.toFixed(2)} | ${median(cold.node).toFixed(0)} |`);
console.log(`| scripted (Rust) | ${median(scriptedRuns.d1)} | ${median(scriptedRuns.d100)} | ${scriptedMarginal.toFixed(2)} | ${median(cold.scripted).toFixed(0)} |`);
console.log(`marginal cost per step, node / scripted: ${(nodeMarginal / scriptedMarginal).toFixed(2)}x`);
