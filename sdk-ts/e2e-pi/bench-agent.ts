/**
 * Agent-step benchmark (a script, not a test): `npm --prefix sdk-ts run bench:agent`.
 *
 * In one process run, against the same mock model and the same Pi:
 * 1. Pi alone: spawn `pi --mode rpc`, wait until it answers, one prompt
 *    whose mock turn is one tool call and a closing text, wait for
 *    `agent_settled`, stop (stdin EOF) — wall time per turn.
 * 2. One headless agent step through the product: `run.start` of a
 *    one-agent-node workflow to its completed view — the resolver child, the
 *    runner's cold start, Pi's spawn, the same mock turn (a `workflow`
 *    submit, then the closing text), the validation child, the commits —
 *    wall time from the request to the settled view (client clock).
 * 3. Where the difference goes: the cold start of a validate-mode runner
 *    child (spawn → exit after its verdict) and of a run-mode runner
 *    (spawn → `runner.ready`), each launched directly.
 *
 * Needs `cargo build -p server` and scripts/install-pi.sh; prints a table
 * (medians of BENCH_REPEATS, default 5).
 */
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { loadAndCompile } from "../src/runner/loader.js";
import { canonicalString } from "../src/protocol/canonical.js";
import { FrameDecoder } from "../src/protocol/framing.js";
import { decodeRunnerFrame, encodeLaunch } from "../src/protocol/messages.js";
import type { WorkerLaunch } from "../src/generated/types.js";
import { reply, startMockModel, submitStep } from "../test-support/mock-model.js";
import { PiSandbox } from "../test-support/pi.js";
import { RUNNER_BIN, TestServer } from "../test-support/server.js";

const REPEATS = Number(process.env.BENCH_REPEATS ?? 5);

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

const WORKFLOW = `import { agent, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "bench",
  startAt: "step",
  nodes: { step: agent({ prompt: "Say ok.", validate: (output) => output }) },
});
`;

/** Spawns the runner bin with `launch`; resolves the ms until `until` says stop (answering runner.ready with `command`). */
function timeRunner(launch: WorkerLaunch, cwd: string, command: Record<string, unknown> | null, stopAt: "ready" | "exit"): Promise<number> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const child = spawn(process.execPath, [RUNNER_BIN], { cwd, stdio: ["pipe", "pipe", "ignore"] });
    const decoder = new FrameDecoder();
    const envelope = { schema: "pi-workflows.worker-launch.v1", runId: launch.runId, generation: launch.generation, runnerEpoch: launch.runnerEpoch };
    child.stdout.on("data", (chunk: Buffer) => {
      decoder.push(chunk);
      for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
        const message = decodeRunnerFrame(frame);
        if (message.type === "runner.ready") {
          if (stopAt === "ready") {
            resolve(performance.now() - started);
            child.kill("SIGKILL");
            return;
          }
          child.stdin.write(`${canonicalString({ ...envelope, ...command })}\n`);
        } else if (message.type === "interaction.accepted" || message.type === "interaction.rejected") {
          child.stdin.write(`${canonicalString({ ...envelope, type: "reply", inReplyTo: message.messageId, outcome: "accepted", result: null })}\n`);
        }
      }
    });
    child.once("exit", () => resolve(performance.now() - started));
    child.once("error", reject);
    child.stdin.write(encodeLaunch(launch));
    child.stdin.write("\n");
  });
}

const mock = await startMockModel({
  rules: [
    { name: "closing", lastRole: "tool", reply: reply.text("Done.") },
    { name: "submit", lastRole: "user", when: "Workflow step contract", reply: submitStep({ ok: true }) },
    { name: "alone", lastRole: "user", when: "bench turn", reply: reply.toolCall("bash", { command: "true" }) },
  ],
});
const sandbox = PiSandbox.create({ baseUrl: mock.baseUrl });
const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
try {
  const project = server.project();
  const file = join(project, ".pi", "workflows", "bench.workflow.ts");
  writeFileSync(file, WORKFLOW);
  const client = await server.connect();

  const alone: number[] = [];
  const step: number[] = [];
  // Alternate, so both see the same machine load; one warm-up of each first.
  for (let i = 0; i <= REPEATS; i += 1) {
    let started = performance.now();
    const pi = await sandbox.spawnRpc();
    await pi.prompt("bench turn");
    await pi.waitSettled();
    await pi.stop();
    if (i > 0) alone.push(performance.now() - started);

    started = performance.now();
    const runId = await client.start(project, "bench");
    const view = await client.settled(runId, 60_000);
    if (view.status.run !== "completed") throw new Error(`the bench run ended ${view.status.run}: ${server.serverLog()}`);
    if (i > 0) step.push(performance.now() - started);
  }
  client.close();

  const compiled = await loadAndCompile(file, project);
  const base = { schema: "pi-workflows.worker-launch.v1" as const, runId: "run-bench", generation: 1, runnerEpoch: "re-bench", projectPath: project, protocolVersion: 1 as const, workflowSource: compiled.source, definitionDigest: compiled.definitionDigest };
  const validate: number[] = [];
  const ready: number[] = [];
  for (let i = 0; i < REPEATS; i += 1) {
    validate.push(
      await timeRunner(
        { ...base, mode: "validate", validate: { nodeId: "step", attemptId: "att-1", interactionId: "int-1", submissionId: "sub-1" } },
        project,
        { type: "command", command: "validate", node: { nodeId: "step", attemptId: "att-1", visit: 1 }, state: { kind: "inline", value: { input: null, results: {}, resultOrder: [], steps: 0 } }, submission: { output: { ok: true } } },
        "exit",
      ),
    );
    ready.push(await timeRunner({ ...base, mode: "run", executionMode: "headless" }, project, null, "ready"));
  }
  const ms = (value: number): string => `${value.toFixed(0)} ms`;
  const [a, s] = [median(alone), median(step)];
  console.log(`agent step benchmark (${REPEATS} repeats each, medians, one process run)`);
  console.log(`  Pi alone (spawn, one mock turn, settle, stop)         ${ms(a)}`);
  console.log(`  one headless agent step (run.start to completed)      ${ms(s)}   = ${(s / a).toFixed(2)}x Pi alone`);
  console.log(`  of which, measured alone: validation child            ${ms(median(validate))}`);
  console.log(`                            runner cold start to ready   ${ms(median(ready))}`);
  console.log(`  raw: alone ${alone.map((v) => v.toFixed(0)).join(" ")} | step ${step.map((v) => v.toFixed(0)).join(" ")}`);
} finally {
  await server.stop();
  await mock.close();
  sandbox.cleanup();
}
