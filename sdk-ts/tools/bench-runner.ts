/**
 * Runner benchmark (a script, not a test): `npm --prefix sdk-ts run bench:runner`.
 *
 * 1. Marginal cost per step: a 100-step and a 1-step compute chain, each run
 *    headless to completion through a real server, with the node runner and
 *    with the scripted Rust runner (`pi-workflows-scripted-runner`) in the
 *    same process run. Duration = the run view's finishedAtMs − createdAtMs
 *    (server clock); marginal = (median d100 − median d1) / 99.
 * 2. Start-up: spawn → `runner.ready` on stdout, launched directly in run
 *    mode (as the server launches a run), p50 and p95 of BENCH_COLD_STARTS
 *    spawns, for a 1-node and a 100-node workflow, interleaved in one loop
 *    so every variant sees the same machine; with each, the CPU time the
 *    process used until then (all threads, /proc schedstat), which a loaded
 *    machine inflates far less than the wall clock:
 *    - the floor: Node bootstrap alone (`node -e` writing one line: spawn →
 *      that line);
 *    - before: the runner of BENCH_BASELINE (a git ref, e.g. `main`), built
 *      from `git archive` into a temp directory with this package's
 *      node_modules (skipped when BENCH_BASELINE is unset);
 *    - this runner with an empty state directory (no transform cache: the
 *      first start of these bytes ever);
 *    - this runner with the transform cache a resolution filled (every run
 *      start: resolution precedes it and stores the transforms);
 *    - a resolver handed its run: a process that resolved the workflow and
 *      awaits its run, from the run launch written to its stdin to
 *      `runner.ready` (what a fresh `run.start` admitted at once pays
 *      instead of a second process's spawn → ready), with the CPU it used
 *      meanwhile;
 *    - the scripted Rust runner.
 *    All on this Node (`process.execPath`): run the script under Node 22 to
 *    measure Node's type stripping, under Node 20 to measure jiti.
 * 3. A 10-step run from `run.start` to completed (`BENCH_SECTIONS=start10`):
 *    a 10-node compute chain started headless through a real server, timed
 *    from just before the `run.start` request to the run view's
 *    `finishedAtMs` (one machine, one clock), BENCH_REPEATS runs of each
 *    variant interleaved: the node runner and the scripted runner on this
 *    server, and, with BENCH_BEFORE_BIN (a `pi-workflows` binary of the
 *    baseline, its scripted runner beside it) and BENCH_BASELINE (the
 *    baseline's node runner, built as in 2), the same two on the baseline.
 *    Prints the medians and the node / scripted ratio of each.
 *
 * BENCH_SECTIONS=steps,startup,start10 (default steps,startup). Needs
 * `cargo build -p server` (or PI_WORKFLOWS_BIN); prints tables.
 */
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { loadAndCompile } from "../src/runner/loader.js";
import { FrameDecoder } from "../src/protocol/framing.js";
import { decodeRunnerFrame, encodeLaunch } from "../src/protocol/messages.js";
import type { RunnerMessage } from "../src/generated/types.js";
import { sha256Digest } from "../src/authoring/compile.js";
import { buildBaseline, cpuMsOf, median, percentile } from "./bench-support.js";
import { RUNNER_BIN, type TestClient, TestServer, scriptedRunnerBinary, serverBinary } from "../test-support/server.js";

const REPEATS = Number(process.env.BENCH_REPEATS ?? 5);
const COLD_STARTS = Number(process.env.BENCH_COLD_STARTS ?? 40);
const SECTIONS = new Set((process.env.BENCH_SECTIONS ?? "steps,startup").split(","));
const BASELINE = process.env.BENCH_BASELINE ?? "";

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

/** One start: wall ms from spawn to the first answer, and the CPU ms the process used by then (all its threads). */
interface Start {
  wallMs: number;
  cpuMs: number;
}

/**
 * Spawns `command` and waits for its first line on stdout (the floor) or its
 * `runner.ready` frame, then kills it (`end: "eof"`: closes its stdin
 * instead and waits until it exits, as a runner ends when its server closes
 * the channel, storing what it stores on the way out).
 */
async function startOnce(command: string[], launch: Uint8Array | null, cwd: string, env: NodeJS.ProcessEnv, end: "kill" | "eof" = "kill"): Promise<Start> {
  const started = performance.now();
  const child = spawn(command[0] as string, command.slice(1), { cwd, env, stdio: ["pipe", "pipe", "ignore"] });
  if (launch !== null) {
    child.stdin.write(launch);
    child.stdin.write("\n");
  }
  const decoder = new FrameDecoder();
  const start = await new Promise<Start>((resolve, reject) => {
    const answered = (): void => resolve({ wallMs: performance.now() - started, cpuMs: cpuMsOf(child.pid as number) });
    child.stdout.on("data", (chunk: Buffer) => {
      if (launch === null) return answered();
      decoder.push(chunk);
      for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
        const message = decodeRunnerFrame(frame);
        if (message.type === "runner.ready") answered();
        else reject(new Error(`unexpected ${message.type}`));
      }
    });
    child.once("exit", () => reject(new Error(`${command.join(" ")} exited before it answered`)));
  });
  const exited = new Promise((resolve) => child.once("exit", resolve));
  if (end === "eof") child.stdin.end();
  else child.kill("SIGKILL");
  await exited;
  return start;
}

/**
 * Spawns a resolver of `workflow` (resolve mode), waits for its
 * `resolve.result`, then measures from writing the run launch to its
 * `runner.ready`: wall ms, and the CPU ms the process used in between.
 */
async function handedOnce(command: string[], resolveLaunch: Uint8Array, runLaunch: (result: Extract<RunnerMessage, { type: "resolve.result" }>) => Uint8Array, cwd: string, env: NodeJS.ProcessEnv): Promise<Start> {
  const child = spawn(command[0] as string, command.slice(1), { cwd, env, stdio: ["pipe", "pipe", "ignore"] });
  child.stdin.write(resolveLaunch);
  child.stdin.write("\n");
  const decoder = new FrameDecoder();
  let handed: { at: number; cpu: number } | undefined;
  const start = await new Promise<Start>((resolve, reject) => {
    child.stdout.on("data", (chunk: Buffer) => {
      decoder.push(chunk);
      for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
        const message = decodeRunnerFrame(frame);
        if (message.type === "resolve.result" && handed === undefined) {
          if (message.awaitsRun !== true) return reject(new Error("the resolver does not await its run"));
          handed = { at: performance.now(), cpu: cpuMsOf(child.pid as number) };
          child.stdin.write(runLaunch(message));
          child.stdin.write("\n");
        } else if (message.type === "runner.ready" && handed !== undefined) {
          resolve({ wallMs: performance.now() - handed.at, cpuMs: cpuMsOf(child.pid as number) - handed.cpu });
        } else reject(new Error(`unexpected ${message.type}`));
      }
    });
    child.once("exit", () => reject(new Error(`${command.join(" ")} exited before it answered`)));
  });
  child.kill("SIGKILL");
  await new Promise((resolve) => child.once("exit", resolve));
  return start;
}

interface Variant {
  name: string;
  command: (workflow: Workflow) => string[] | null;
  launch: (workflow: Workflow) => Uint8Array | null;
  /** The state directory (PI_WORKFLOWS_HOME) of one start. */
  home: () => string;
  /** Measures a resolver handed its run instead of a spawn (its resolve launch; `launch` is then unused). */
  handed?: (workflow: Workflow) => Uint8Array;
}

interface Workflow {
  nodes: number;
  path: string;
  script: string;
  digest: string;
}

async function startups(dir: string): Promise<{ variants: Variant[]; samples: Map<string, Start[]> }> {
  mkdirSync(join(dir, ".pi", "workflows"), { recursive: true });
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
  const resolveLaunch = (path: string): Uint8Array =>
    encodeLaunch({
      schema: "pi-workflows.worker-launch.v1",
      mode: "resolve",
      runId: "bench-resolve",
      generation: 0,
      runnerEpoch: "bench-resolve-0",
      projectPath: dir,
      protocolVersion: 1,
      resolve: { workflow: path, input: null },
    });
  const workflows: Workflow[] = [];
  for (const nodes of [1, 100]) {
    const path = join(dir, ".pi", "workflows", `chain${nodes}.workflow.ts`);
    writeFileSync(path, chainWorkflow(nodes));
    const script = join(dir, `chain${nodes}.json`);
    writeFileSync(script, chainScript(nodes));
    workflows.push({ nodes, path, script, digest: (await loadAndCompile(path, dir)).definitionDigest });
  }
  const warm = join(dir, "home-warm");
  let fresh = 0;
  const emptyHome = (): string => {
    const home = join(dir, `home-empty-${fresh++}`);
    mkdirSync(home, { mode: 0o700 });
    return home;
  };
  const runnerLaunch = (workflow: Workflow): Uint8Array => launch(workflow.path, workflow.digest);
  // The floor: Node's bootstrap and one write to stdout, nothing loaded (`node -e ''` plus the line that says it is up).
  const variants: Variant[] = [{ name: "floor: Node bootstrap (`node -e` writing one line)", command: () => [process.execPath, "-e", "process.stdout.write('\\n')"], launch: () => null, home: () => warm }];
  const baselineWarm = join(dir, "home-baseline-warm");
  let baselineBin: string | undefined;
  if (BASELINE !== "") {
    const bin = buildBaseline(BASELINE, mkdtempSync(join(dir, "baseline-")));
    baselineBin = bin;
    variants.push(
      { name: `before: runner of ${BASELINE}, empty state directory`, command: () => [process.execPath, bin], launch: runnerLaunch, home: emptyHome },
      { name: `before: runner of ${BASELINE}, caches warm`, command: () => [process.execPath, bin], launch: runnerLaunch, home: () => baselineWarm },
    );
  }
  variants.push(
    { name: "runner, empty state directory (no cache)", command: () => [process.execPath, RUNNER_BIN], launch: runnerLaunch, home: emptyHome },
    { name: "runner, caches warm (transforms, validators' code)", command: () => [process.execPath, RUNNER_BIN], launch: runnerLaunch, home: () => warm },
    {
      name: "resolver handed its run: run launch → runner.ready",
      command: () => [process.execPath, RUNNER_BIN],
      launch: () => null,
      home: () => warm,
      handed: (workflow) => resolveLaunch(workflow.path),
    },
    { name: "scripted runner (Rust)", command: () => [scriptedRunnerBinary()], launch: (workflow) => launch(workflow.script, `sha256:${"0".repeat(64)}`), home: () => warm },
  );
  // One start of each workflow fills the warm caches (the workflow's transforms, the validators' code), as the resolution before every run start does; it ends as a runner ends, so that it stores what it stores at exit.
  for (const workflow of workflows) {
    await startOnce([process.execPath, RUNNER_BIN], runnerLaunch(workflow), dir, { ...process.env, PI_WORKFLOWS_HOME: warm }, "eof");
    if (baselineBin !== undefined) await startOnce([process.execPath, baselineBin], runnerLaunch(workflow), dir, { ...process.env, PI_WORKFLOWS_HOME: baselineWarm }, "eof");
  }
  const samples = new Map<string, Start[]>();
  for (let i = 0; i < COLD_STARTS; i += 1) {
    for (const workflow of workflows) {
      for (const variant of variants) {
        const key = `${variant.name}|${workflow.nodes}`;
        const home = variant.home();
        const env = { ...process.env, PI_WORKFLOWS_HOME: home };
        const one =
          variant.handed === undefined
            ? await startOnce(variant.command(workflow) as string[], variant.launch(workflow), dir, env)
            : await handedOnce(variant.command(workflow) as string[], variant.handed(workflow), (result) => launch(result.workflowSource.root.kind === "file" ? result.workflowSource.root.path : workflow.path, result.definitionDigest), dir, env);
        if (home !== warm && home !== baselineWarm) rmSync(home, { recursive: true, force: true });
        samples.set(key, [...(samples.get(key) ?? []), one]);
      }
    }
  }
  return { variants, samples };
}

/** One way to run the 10-step chain: a server binary and a runner command. */
interface StartVariant {
  name: string;
  bin: string;
  /** The runner command. */
  runner: string;
  scripted: boolean;
}

/** `run.start` → completed of a 10-node chain, BENCH_REPEATS times per variant, interleaved; ms per run. */
async function start10(variants: StartVariant[]): Promise<Map<string, number[]>> {
  const servers = await Promise.all(variants.map((variant) => TestServer.start({ bin: variant.bin, runner: variant.runner, env: { PI_WORKFLOWS_RUNNER_JOURNAL: "" } })));
  const out = new Map<string, number[]>();
  try {
    const clients = await Promise.all(servers.map((server) => server.connect()));
    const refs = servers.map((server, at) => {
      const project = server.project();
      if (variants[at]?.scripted) {
        writeFileSync(join(project, "chain10.json"), chainScript(10));
        return { project, ref: "chain10.json" };
      }
      writeFileSync(join(project, ".pi", "workflows", "chain10.workflow.ts"), chainWorkflow(10));
      return { project, ref: "chain10" };
    });
    // One unmeasured run each: the transform cache and the page cache are warm for every measured run.
    for (let repeat = -1; repeat < REPEATS; repeat += 1) {
      for (const [at, variant] of variants.entries()) {
        const client = clients[at] as TestClient;
        const { project, ref } = refs[at] as { project: string; ref: string };
        const sent = Date.now();
        const runId = await client.start(project, ref, {});
        const view = await client.settled(runId, 120_000);
        if (view.status.run !== "completed") throw new Error(`${variant.name}: ${view.status.run} ${JSON.stringify(view.failure ?? null)}`);
        if (repeat >= 0) out.set(variant.name, [...(out.get(variant.name) ?? []), (view.finishedAtMs ?? 0) - sent]);
      }
    }
    for (const client of clients) client.close();
  } finally {
    await Promise.all(servers.map((server) => server.stop()));
  }
  return out;
}

if (SECTIONS.has("start10")) {
  const before = process.env.BENCH_BEFORE_BIN ?? "";
  const variants: StartVariant[] = [
    { name: "after: node runner", bin: serverBinary(), runner: `${process.execPath} ${RUNNER_BIN}`, scripted: false },
    { name: "after: scripted runner", bin: serverBinary(), runner: scriptedRunnerBinary(), scripted: true },
  ];
  if (before !== "" && BASELINE !== "") {
    const dir = mkdtempSync(join(tmpdir(), "piw-bench-start10-"));
    const bin = buildBaseline(BASELINE, dir);
    variants.push(
      { name: `before (${BASELINE}): node runner`, bin: before, runner: `${process.execPath} ${bin}`, scripted: false },
      { name: `before (${BASELINE}): scripted runner`, bin: before, runner: join(before, "..", "pi-workflows-scripted-runner"), scripted: true },
    );
  }
  const runs = await start10(variants);
  console.log(`a 10-step run, run.start → completed (${REPEATS} runs of each, interleaved; node ${process.version}; load ${loadavg().map((x) => x.toFixed(1)).join(" ")})`);
  console.log("| variant | median ms | min ms | max ms |");
  console.log("|---|---|---|---|");
  for (const variant of variants) {
    const ms = runs.get(variant.name) as number[];
    console.log(`| ${variant.name} | ${median(ms).toFixed(0)} | ${Math.min(...ms).toFixed(0)} | ${Math.max(...ms).toFixed(0)} |`);
  }
  const ratio = (node: string, scripted: string): string => (median(runs.get(node) as number[]) / median(runs.get(scripted) as number[])).toFixed(2);
  console.log(`node / scripted, after: ${ratio("after: node runner", "after: scripted runner")}x`);
  if (variants.length > 2) {
    console.log(`node / scripted, before: ${ratio(`before (${BASELINE}): node runner`, `before (${BASELINE}): scripted runner`)}x`);
    console.log(`node runner, after / before: ${ratio("after: node runner", `before (${BASELINE}): node runner`)}x`);
  }
  console.log("");
}

if (SECTIONS.has("steps")) {
  const nodeRuns = await durations("node");
  const scriptedRuns = await durations("scripted");
  const marginal = (runs: { d1: number[]; d100: number[] }): number => (median(runs.d100) - median(runs.d1)) / 99;
  const nodeMarginal = marginal(nodeRuns);
  const scriptedMarginal = marginal(scriptedRuns);
  console.log(`per-step cost (${REPEATS} runs of each chain; node ${process.version})`);
  console.log("| runner | 1-step run (median ms) | 100-step run (median ms) | marginal ms/step |");
  console.log("|---|---|---|---|");
  console.log(`| node | ${median(nodeRuns.d1)} | ${median(nodeRuns.d100)} | ${nodeMarginal.toFixed(2)} |`);
  console.log(`| scripted (Rust) | ${median(scriptedRuns.d1)} | ${median(scriptedRuns.d100)} | ${scriptedMarginal.toFixed(2)} |`);
  console.log(`marginal cost per step, node / scripted: ${(nodeMarginal / scriptedMarginal).toFixed(2)}x`);
  console.log("");
}

if (SECTIONS.has("startup")) {
  const dir = mkdtempSync(join(tmpdir(), "piw-bench-startup-"));
  try {
    const { variants, samples } = await startups(dir);
    console.log(`runner start-up, spawn → runner.ready (${COLD_STARTS} starts of each, interleaved; node ${process.version}; load ${loadavg().map((x) => x.toFixed(1)).join(" ")})`);
    console.log("| variant | 1 node: wall p50 / p95 (ms) | CPU p50 (ms) | 100 nodes: wall p50 / p95 (ms) | CPU p50 (ms) |");
    console.log("|---|---|---|---|---|");
    for (const variant of variants) {
      const cells = (nodes: number): string => {
        const starts = samples.get(`${variant.name}|${nodes}`) as Start[];
        const wall = starts.map((start) => start.wallMs);
        const cpu = starts.map((start) => start.cpuMs);
        return `${percentile(wall, 50).toFixed(1)} / ${percentile(wall, 95).toFixed(1)} | ${percentile(cpu, 50).toFixed(1)}`;
      };
      console.log(`| ${variant.name} | ${cells(1)} | ${cells(100)} |`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
