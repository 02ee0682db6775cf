/**
 * Agent-step benchmark (a script, not a test): `npm --prefix sdk-ts run bench:agent`.
 *
 * In one process run, interleaved, against the same mock model and the same Pi:
 * 1. Pi alone: spawn `pi --mode rpc`, wait until it answers, one prompt
 *    whose mock turn is one tool call and a closing text, wait for
 *    `agent_settled`, stop (stdin EOF).
 * 2. One headless agent step through the product: `run.start` of a
 *    one-agent-node workflow to its completed view — the resolver child
 *    (which also runs the run's first generation), Pi's spawn, the same mock
 *    turn (a `workflow` submit, then the closing text), the validation
 *    child, the group stop, the commits. With BENCH_BASELINE (a git ref) the
 *    same step again on a second server whose node runner is that ref's
 *    (built from `git archive`, see `tools/bench-support.ts`).
 * 3. The floor: Node's bootstrap alone (`node -e` writing one line).
 *
 * For each it reports the wall clock (client clock, medians) and the CPU
 * time, which a loaded machine inflates far less: Pi alone is this
 * process's reaped-children CPU (`/proc/self/stat` cutime + cstime) across
 * the segment; a step is the server's own CPU plus everything it reaped
 * (resolver, runner, validation child, and Pi, reaped by the runner) across
 * the step, read after every process of the step is gone.
 *
 * Where the time goes: every node process of the step (runners and Pi)
 * starts with a small preload (`--require`, or NODE_OPTIONS for Pi) that
 * appends to a trace file its start (`performance.timeOrigin`), its
 * stderr lines with their time and its CPU so far, and at exit its CPU and
 * its reaped children's; the mock model marks the time of each request. From these,
 * the step is cut into phases (ms, medians): run.start → resolver spawned,
 * the resolver's start-up to `resolve.result`, its run's `runner.ready`,
 * ready → Pi spawned, Pi's own start-up to its first model request, the
 * mock turn and submit until the validation child starts, the validation
 * child until its verdict, the verdict → Pi gone (the reply, the tool result, the group
 * stop), Pi gone → the run finished (unregister, the node's commit), and
 * finished → the client's view.
 *
 * Needs the server binaries (`cargo build -p server`, or PI_WORKFLOWS_BIN and
 * PI_WORKFLOWS_SCRIPTED_RUNNER) and scripts/install-pi.sh; run it under the
 * Node the runner should use (the runner is `process.execPath`): Node 22 for
 * Node's type stripping. BENCH_REPEATS (default 5) measured repeats after
 * one warm-up; BENCH_TRACE_DUMP=1 prints each step's trace records (times
 * relative to its `run.start`).
 */
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { buildBaseline, cpuMsOf, median } from "../tools/bench-support.js";
import { reply, startMockModel, submitStep } from "../test-support/mock-model.js";
import { PiSandbox } from "../test-support/pi.js";
import { RUNNER_BIN, type TestClient, TestServer } from "../test-support/server.js";

const REPEATS = Number(process.env.BENCH_REPEATS ?? 5);
const BASELINE = process.env.BENCH_BASELINE ?? "";
/** Clock ticks per second of /proc's utime/stime/cutime/cstime (USER_HZ, 100 on Linux x86_64). */
const TICK_MS = 10;

const WORKFLOW = `import { agent, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "bench",
  startAt: "step",
  nodes: { step: agent({ prompt: "Say ok.", validate: (output) => output }) },
});
`;

// --- the trace --------------------------------------------------------------

const dir = mkdtempSync(join(tmpdir(), "piw-bench-agent-"));
const TRACE = join(dir, "trace.ndjson");
const PRELOAD = join(dir, "trace.cjs");
writeFileSync(
  PRELOAD,
  `"use strict";
const fs = require("node:fs");
const put = (record) => { try { fs.appendFileSync(${JSON.stringify(TRACE)}, JSON.stringify({ pid: process.pid, ppid: process.ppid, kind: process.env.BENCH_TRACE_KIND || "runner", ...record }) + "\\n"); } catch {} };
const now = () => performance.timeOrigin + performance.now();
put({ event: "start", at: performance.timeOrigin });
const write = process.stderr.write;
const cpu = () => { const usage = process.cpuUsage(); return (usage.user + usage.system) / 1000; };
process.stderr.write = function (chunk, ...rest) { put({ event: "log", at: now(), cpuMs: cpu(), line: String(chunk).slice(0, 400) }); return write.call(this, chunk, ...rest); };
process.on("exit", () => {
  let childCpuMs = 0;
  try { const stat = fs.readFileSync("/proc/self/stat", "utf8"); const f = stat.slice(stat.lastIndexOf(")") + 2).split(" "); childCpuMs = (Number(f[13]) + Number(f[14])) * ${TICK_MS}; } catch {}
  put({ event: "exit", at: now(), cpuMs: cpu(), childCpuMs });
});
`,
);

interface TraceRecord {
  pid: number;
  ppid: number;
  kind: string;
  event: "start" | "log" | "exit";
  at: number;
  line?: string;
  cpuMs?: number;
  childCpuMs?: number;
}

let traceRead = 0;
/** The trace records appended since the last call. */
function newTrace(): TraceRecord[] {
  if (!existsSync(TRACE)) return [];
  const bytes = readFileSync(TRACE);
  const end = bytes.lastIndexOf(0x0a) + 1;
  if (end <= traceRead) return [];
  const fresh = bytes.subarray(traceRead, end).toString("utf8");
  traceRead = end;
  return fresh
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as TraceRecord);
}

/** utime + stime (+ cutime + cstime with `children`) of `pid`, in ms. */
function procCpuMs(pid: number | "self", children: boolean): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ").map(Number);
  return ((f[11] as number) + (f[12] as number) + (children ? (f[13] as number) + (f[14] as number) : 0)) * TICK_MS;
}

async function until(what: string, check: () => boolean, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

// --- the segments -------------------------------------------------------------

const mockMarks: number[] = [];
const mark = <T>(value: T): (() => T) => () => {
  mockMarks.push(Date.now());
  return value;
};
const mock = await startMockModel({
  rules: [
    { name: "closing", lastRole: "tool", reply: mark(reply.text("Done.")) },
    { name: "submit", lastRole: "user", when: "Workflow step contract", reply: mark(submitStep({ ok: true })) },
    { name: "alone", lastRole: "user", when: "bench turn", reply: mark(reply.toolCall("bash", { command: "true" })) },
  ],
});
const sandbox = PiSandbox.create({ baseUrl: mock.baseUrl });
const piWrapper = join(dir, "pi");
writeFileSync(piWrapper, `#!/bin/sh\nNODE_OPTIONS="--require ${PRELOAD}" BENCH_TRACE_KIND=pi exec ${sandbox.piExecutable()} "$@"\n`, { mode: 0o755 });

interface Sample {
  wallMs: number;
  cpuMs: number;
  phases: Record<string, number>;
  /** CPU ms by process kind (self), from the trace's exit records. */
  processCpu: Record<string, number>;
}

async function piAlone(): Promise<Sample> {
  newTrace();
  mockMarks.length = 0;
  const cpuBefore = procCpuMs("self", true) - procCpuMs("self", false);
  const started = Date.now();
  const pi = await sandbox.spawnRpc({ env: { NODE_OPTIONS: `--require ${PRELOAD}`, BENCH_TRACE_KIND: "pi" } });
  await pi.prompt("bench turn");
  await pi.waitSettled();
  const settled = Date.now();
  await pi.stop();
  const wallMs = Date.now() - started;
  const cpuMs = procCpuMs("self", true) - procCpuMs("self", false) - cpuBefore;
  const trace = newTrace();
  const start = trace.find((r) => r.kind === "pi" && r.event === "start");
  const exit = trace.find((r) => r.kind === "pi" && r.event === "exit");
  const [first, second] = mockMarks;
  const phases: Record<string, number> = {
    "spawn → Pi process started": (start?.at ?? NaN) - started,
    "Pi start-up → first model request": (first ?? NaN) - (start?.at ?? NaN),
    "tool call → second model request": (second ?? NaN) - (first ?? NaN),
    "→ agent_settled seen": settled - (second ?? NaN),
    "stop → Pi gone": started + wallMs - settled,
  };
  return { wallMs, cpuMs, phases, processCpu: { pi: exit?.cpuMs ?? NaN } };
}

/** The mode a runner process logged (`launched: mode X`), first launch first. */
function modesOf(records: TraceRecord[], pid: number): string[] {
  return records.filter((r) => r.pid === pid && r.event === "log" && /launched: mode /.test(r.line ?? "")).map((r) => /launched: mode (\w+)/.exec(r.line as string)?.[1] as string);
}

async function agentStep(server: TestServer, client: TestClient, project: string): Promise<Sample> {
  newTrace();
  mockMarks.length = 0;
  const serverPid = serverPids.get(server);
  const cpuBefore = serverPid === undefined ? NaN : procCpuMs(serverPid, true);
  const started = Date.now();
  const runId = await client.start(project, "bench");
  const view = await client.settled(runId, 60_000);
  const seen = Date.now();
  if (view.status.run !== "completed") throw new Error(`the bench run ended ${view.status.run}: ${server.serverLog()}`);
  // Every process of the step has exited and been reaped (its CPU is then in the server's cutime).
  let trace: TraceRecord[] = [];
  await until("the step's processes to exit", () => {
    trace = [...trace, ...newTrace()];
    const started = trace.filter((r) => r.event === "start");
    return started.length >= 3 && started.every((s) => !existsSync(`/proc/${s.pid}`));
  });
  trace = [...trace, ...newTrace()];
  if (process.env.BENCH_TRACE_DUMP) for (const r of trace) console.log(JSON.stringify({ ...r, at: r.at - started }));
  const runner = trace.find((r) => r.kind === "runner" && r.event === "start" && modesOf(trace, r.pid)[0] === "resolve");
  if (runner === undefined) throw new Error("no resolver in the trace");
  if (serverPid === undefined) serverPids.set(server, runner.ppid);
  const cpuMs = serverPid === undefined ? NaN : procCpuMs(serverPid, true) - cpuBefore;
  const validator = trace.find((r) => r.kind === "runner" && r.event === "start" && modesOf(trace, r.pid)[0] === "validate");
  const pi = trace.find((r) => r.kind === "pi" && r.event === "start");
  const record = (pid: number | undefined, event: "exit" | RegExp): TraceRecord | undefined =>
    trace.find((r) => r.pid === pid && (event === "exit" ? r.event === "exit" : r.event === "log" && event.test(r.line ?? "")));
  const at = (pid: number | undefined, event: "exit" | RegExp): number => record(pid, event)?.at ?? NaN;
  const exitOf = (pid: number | undefined): TraceRecord | undefined => trace.find((r) => r.pid === pid && r.event === "exit");
  const resolved = at(runner.pid, /start-up: .*\(resolved /);
  const ready = at(runner.pid, /start-up: .*\(ready /);
  const firstRequest = mockMarks[0] ?? NaN;
  const piGone = at(pi?.pid, "exit");
  // The validation child's verdict (the server may stop the child before its own exit is traced).
  const verdictLine = record(validator?.pid, /submission \S+ (accepted|rejected)/);
  const verdict = verdictLine?.at ?? NaN;
  const finished = view.finishedAtMs ?? NaN;
  const phases: Record<string, number> = {
    "run.start → resolver process started": runner.at - started,
    "resolver start-up → resolve.result": resolved - runner.at,
    "resolve.result → runner.ready (its run handed)": ready - resolved,
    "runner.ready → Pi process started": (pi?.at ?? NaN) - ready,
    "Pi start-up → first model request": firstRequest - (pi?.at ?? NaN),
    "mock turn + submit → validation child started": (validator?.at ?? NaN) - firstRequest,
    "validation child (start → its verdict)": verdict - (validator?.at ?? NaN),
    "verdict → Pi gone (reply, tool result, group stop)": piGone - verdict,
    "Pi gone → run finished (unregister, commits)": finished - piGone,
    "run finished → client sees the view": seen - finished,
  };
  const processCpu = {
    "resolver + run (one process)": exitOf(runner.pid)?.cpuMs ?? NaN,
    "validation child (to its verdict)": verdictLine?.cpuMs ?? NaN,
    pi: exitOf(pi?.pid)?.cpuMs ?? NaN,
  };
  return { wallMs: seen - started, cpuMs, phases, processCpu };
}
const serverPids = new Map<TestServer, number>();

/** The floor: `node -e` writing one line, spawn → that line (wall, and CPU until then). */
async function floor(): Promise<Sample> {
  const started = performance.now();
  const child = spawn(process.execPath, ["-e", "process.stdout.write('\\n')"], { stdio: ["ignore", "pipe", "ignore"] });
  const sample = await new Promise<Sample>((resolve) =>
    child.stdout.once("data", () => resolve({ wallMs: performance.now() - started, cpuMs: cpuMsOf(child.pid as number), phases: {}, processCpu: {} })),
  );
  await new Promise((resolve) => child.once("exit", resolve));
  return sample;
}

async function serverWith(runnerBin: string): Promise<{ server: TestServer; client: TestClient; project: string }> {
  const server = await TestServer.start({ runner: `${process.execPath} --require ${PRELOAD} ${runnerBin}`, env: { PI_WORKFLOWS_PI: piWrapper, PI_WORKFLOWS_RUNNER_JOURNAL: "" } });
  const project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "bench.workflow.ts"), WORKFLOW);
  return { server, client: await server.connect(), project };
}

const variants: { name: string; measure: () => Promise<Sample> }[] = [
  { name: "floor: Node bootstrap (`node -e`)", measure: floor },
  { name: "Pi alone", measure: piAlone },
];
const servers: { server: TestServer; client: TestClient }[] = [];
try {
  const after = await serverWith(RUNNER_BIN);
  servers.push(after);
  variants.push({ name: "agent step", measure: () => agentStep(after.server, after.client, after.project) });
  if (BASELINE !== "") {
    const baseDir = join(dir, "baseline");
    mkdirSync(baseDir);
    const before = await serverWith(buildBaseline(BASELINE, baseDir));
    servers.push(before);
    variants.push({ name: `agent step, runner of ${BASELINE}`, measure: () => agentStep(before.server, before.client, before.project) });
  }
  const load = [loadavg()[0] as number];
  const samples = new Map<string, Sample[]>();
  // Interleaved, so every variant sees the same machine load; one warm-up of each first.
  for (let i = 0; i <= REPEATS; i += 1) {
    for (const variant of variants) {
      const sample = await variant.measure();
      if (i > 0) samples.set(variant.name, [...(samples.get(variant.name) ?? []), sample]);
    }
  }
  load.push(loadavg()[0] as number);

  const of = (name: string): Sample[] => samples.get(name) as Sample[];
  const wall = (name: string): number => median(of(name).map((s) => s.wallMs));
  const cpu = (name: string): number => median(of(name).map((s) => s.cpuMs));
  const ms = (value: number): string => (Number.isNaN(value) ? "–" : value.toFixed(0));
  console.log(`agent step benchmark (${REPEATS} repeats each after one warm-up, interleaved, medians; node ${process.version}; load average ${load.map((x) => x.toFixed(1)).join(" → ")})`);
  console.log("| variant | wall ms | × Pi alone | CPU ms | × Pi alone |");
  console.log("|---|---|---|---|---|");
  for (const variant of variants) {
    const name = variant.name;
    console.log(`| ${name} | ${ms(wall(name))} | ${(wall(name) / wall("Pi alone")).toFixed(2)}× | ${cpu(name).toFixed(0)} | ${(cpu(name) / cpu("Pi alone")).toFixed(2)}× |`);
  }
  for (const variant of variants.slice(1)) {
    const name = variant.name;
    console.log(`\n${name}: phases (wall ms, medians)`);
    for (const phase of Object.keys(of(name)[0]?.phases ?? {})) console.log(`  ${phase.padEnd(52)} ${ms(median(of(name).map((s) => s.phases[phase] as number)))}`);
    console.log(`  CPU by process (ms, medians): ${Object.keys(of(name)[0]?.processCpu ?? {}).map((p) => `${p} ${ms(median(of(name).map((s) => s.processCpu[p] as number)))}`).join(", ")}`);
    console.log(`  raw wall: ${of(name).map((s) => s.wallMs.toFixed(0)).join(" ")}; raw CPU: ${of(name).map((s) => s.cpuMs.toFixed(0)).join(" ")}`);
  }
} finally {
  for (const { server, client } of servers) {
    client.close();
    await server.stop();
  }
  await mock.close();
  sandbox.cleanup();
  rmSync(dir, { recursive: true, force: true });
}
