import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { sha256Digest } from "../src/authoring/compile.js";
import type { Reply, RunnerMessage, WorkerLaunch } from "../src/generated/types.js";
import { canonicalString } from "../src/protocol/canonical.js";
import { FrameDecoder } from "../src/protocol/framing.js";
import { decodeRunnerFrame, encodeLaunch } from "../src/protocol/messages.js";
import type { RunnerChannel } from "../src/runner/channel.js";
import { discoverWorkflows, resolveWorkflowRef } from "../src/runner/discovery.js";
import { Executor } from "../src/runner/execute.js";
import { loadAndCompile } from "../src/runner/loader.js";
import { PiUnavailable, modelArgs, resolvePi } from "../src/runner/pi.js";
import { TRUNCATION_MARKER, resolveExecution, runShell } from "../src/runner/shell.js";
import { RunState } from "../src/runner/state.js";
import { EXAMPLES_DIR, RUNNER_BIN } from "../test-support/server.js";
import { resolve as resolvePath } from "node:path";

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), "piw-runner-"));
});
after(() => rmSync(dir, { recursive: true, force: true }));

function project(name: string, files: Record<string, string>): string {
  const root = join(dir, name);
  mkdirSync(join(root, ".pi", "workflows"), { recursive: true });
  for (const [file, text] of Object.entries(files)) writeFileSync(join(root, ".pi", "workflows", file), text);
  return root;
}

/** Spawns the runner bin with a launch envelope and collects what it writes. */
async function runRunner(launch: WorkerLaunch, cwd: string): Promise<{ messages: RunnerMessage[]; code: number | null; stderr: string }> {
  const child = spawn(process.execPath, [RUNNER_BIN], { cwd, stdio: ["pipe", "pipe", "pipe"], env: { ...process.env, HOME: join(dir, "home") } });
  const messages: RunnerMessage[] = [];
  const decoder = new FrameDecoder();
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  child.stdout.on("data", (chunk: Buffer) => {
    decoder.push(chunk);
    for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
      const message = decodeRunnerFrame(frame);
      messages.push(message);
      // A resolver waits for its run's launch: EOF says none follows (it exits 0).
      if (message.type === "resolve.result") child.stdin.end();
      if (message.type === "run.parked") {
        child.stdin.write(
          `${JSON.stringify({ generation: launch.generation, inReplyTo: message.messageId, next: { kind: "exit", reason: "parked" }, outcome: "accepted", result: null, runId: launch.runId, runnerEpoch: launch.runnerEpoch, schema: "pi-workflows.worker-launch.v1", type: "reply" })}\n`,
        );
      }
    }
  });
  child.stdin.write(encodeLaunch(launch));
  child.stdin.write("\n");
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  return { messages, code, stderr };
}

const launchBase = (projectPath: string): Omit<WorkerLaunch, "mode"> => ({
  schema: "pi-workflows.worker-launch.v1",
  runId: "run-1",
  generation: 1,
  runnerEpoch: "re-1",
  projectPath,
  protocolVersion: 1,
});

describe("resolve mode", () => {
  it("answers resolve.result: name, source identity, topology, digest, normalized input, title", async () => {
    const root = project("resolve-ok", {});
    cpSync(join(EXAMPLES_DIR, "linear.workflow.ts"), join(root, ".pi", "workflows", "linear.workflow.ts"));
    const { messages, code, stderr } = await runRunner({ ...launchBase(root), mode: "resolve", resolve: { workflow: "linear", input: {} } }, root);
    assert.equal(code, 0, stderr);
    assert.equal(messages.length, 1);
    const result = messages[0] as Extract<RunnerMessage, { type: "resolve.result" }>;
    assert.equal(result.type, "resolve.result", JSON.stringify(result));
    const path = join(root, ".pi", "workflows", "linear.workflow.ts");
    assert.equal(result.workflowName, "linear");
    assert.deepEqual(result.workflowSource, { root: { kind: "file", path, hash: sha256Digest(readFileSync(path)) }, mounted: [] });
    assert.deepEqual(result.input, { name: "world" });
    assert.equal(result.title, "Greet world");
    assert.deepEqual(result.topology.nodes.map((node) => node.id), ["greet", "shout", "summarize"]);
    assert.equal(result.definitionDigest, (await loadAndCompile(path, root)).definitionDigest);
  });

  it("answers resolve.failed with the closed codes", async () => {
    const root = project("resolve-bad", {
      "syntax.workflow.ts": "export default defineWorkflow({ name: ",
      "graph.workflow.ts": `import { compute, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "graph", startAt: "a", nodes: { a: compute({ run: () => 1 }), b: compute({ run: () => 2 }) } });\n`,
      "strict.workflow.ts": `import { compute, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "strict", input: (v) => { if (typeof v !== "number") throw new Error("a number please"); return v; }, startAt: "a", nodes: { a: compute({ run: () => 1 }) } });\n`,
      "plain.workflow.ts": "export default { name: 'not a definition' };\n",
      "deep.workflow.ts": `import { compute, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "deep", input: () => { let v = {}; for (let i = 1; i < 70; i++) v = { a: v }; return v; }, startAt: "a", nodes: { a: compute({ run: () => 1 }) } });\n`,
    });
    const cases: [string, string, RegExp][] = [
      ["missing", "sourceNotFound", /no workflow named "missing" \(available: deep, graph, plain, strict, syntax\)/],
      ["deep", "invalidInput", /^invalid input: the normalized input nests 70 levels; it may nest at most 61, so that the run state a runner receives \(command\.state\.value\.input\) fits the protocol's 64-level frame limit$/],
      ["syntax", "compileFailed", /cannot load/],
      ["graph", "invalidDefinition", /node b is not reachable/],
      ["plain", "invalidDefinition", /must default-export defineWorkflow/],
      ["strict", "invalidInput", /a number please/],
      ["./nowhere.workflow.ts", "sourceNotFound", /was not found/],
    ];
    for (const [workflow, code, message] of cases) {
      const { messages } = await runRunner({ ...launchBase(root), mode: "resolve", resolve: { workflow, input: "x" } }, root);
      const failed = messages[0] as Extract<RunnerMessage, { type: "resolve.failed" }>;
      assert.equal(failed?.type, "resolve.failed", `${workflow}: ${JSON.stringify(messages)}`);
      assert.equal(failed.code, code, workflow);
      assert.match(failed.message, message, workflow);
    }
  });
});

/**
 * Resolves `workflow` in one runner process, then hands that process the run
 * launch `handed(result)` makes (after `between` ran), answers its
 * `runner.ready` with `command start` of the first node and every later
 * message with `exit finished`, and collects what it writes.
 */
async function resolveThenRun(
  root: string,
  workflow: string,
  handed: (result: Extract<RunnerMessage, { type: "resolve.result" }>) => WorkerLaunch,
  between: () => void = () => undefined,
): Promise<{ messages: RunnerMessage[]; code: number | null; stderr: string }> {
  const child = spawn(process.execPath, [RUNNER_BIN], { cwd: root, stdio: ["pipe", "pipe", "pipe"], env: { ...process.env, HOME: join(dir, "home"), PI_WORKFLOWS_HOME: join(dir, "state") } });
  const messages: RunnerMessage[] = [];
  const decoder = new FrameDecoder();
  let stderr = "";
  let run: WorkerLaunch | undefined;
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  child.stdout.on("data", (chunk: Buffer) => {
    decoder.push(chunk);
    for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
      const message = decodeRunnerFrame(frame);
      messages.push(message);
      if (message.type === "resolve.result") {
        between();
        run = handed(message);
        child.stdin.write(encodeLaunch(run));
        child.stdin.write("\n");
        continue;
      }
      if (run === undefined || message.type === "runner.exiting") continue;
      const envelope = { schema: "pi-workflows.worker-launch.v1", runId: run.runId, generation: run.generation, runnerEpoch: run.runnerEpoch };
      const first = (messages.find((m) => m.type === "resolve.result") as Extract<RunnerMessage, { type: "resolve.result" }>).topology.startAt;
      const answer =
        message.type === "runner.ready"
          ? { ...envelope, type: "command", command: "start", node: { nodeId: first, attemptId: "att-1", visit: 1 }, state: { kind: "inline", value: { input: {}, results: {}, resultOrder: [], steps: 0 } } }
          : { ...envelope, type: "reply", inReplyTo: message.messageId, outcome: "accepted", result: null, next: { kind: "exit", reason: "finished" } };
      child.stdin.write(`${canonicalString(answer)}\n`);
    }
  });
  child.stdin.write(encodeLaunch({ ...launchBase(root), runId: "resolve-1", runnerEpoch: "resolve-1-0", generation: 0, mode: "resolve", resolve: { workflow, input: {} } }));
  child.stdin.write("\n");
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  return { messages, code, stderr };
}

/** The run launch of the run a resolve.result describes. */
function runLaunchOf(root: string, result: Extract<RunnerMessage, { type: "resolve.result" }>): WorkerLaunch {
  return { ...launchBase(root), runId: "run-7", runnerEpoch: "re-7", mode: "run", workflowSource: result.workflowSource, definitionDigest: result.definitionDigest, executionMode: "headless" };
}

describe("a resolver handed its run", () => {
  const workflow = (name: string, marker: string): string => `import { appendFileSync } from "node:fs";
import { compute, defineWorkflow } from "@pi-workflows/sdk";
appendFileSync(${JSON.stringify(marker)}, "top level\\n");
export default defineWorkflow({ name: ${JSON.stringify(name)}, startAt: "a", nodes: { a: compute({ run: () => { appendFileSync(${JSON.stringify(marker)}, "a\\n"); return { ok: true }; } }) } });
`;

  it("says it awaits the run, then runs the run launch it is handed in the same process without loading the workflow again", async () => {
    const marker = join(dir, "handed.marker");
    const root = project("handed", { "handed.workflow.ts": workflow("handed", marker) });
    const { messages, code, stderr } = await resolveThenRun(root, "handed", (result) => runLaunchOf(root, result));
    assert.equal(code, 0, stderr);
    const result = messages[0] as Extract<RunnerMessage, { type: "resolve.result" }>;
    assert.equal(result.type, "resolve.result");
    assert.equal(result.awaitsRun, true);
    assert.equal(result.runId, "resolve-1");
    const run = messages.slice(1);
    assert.deepEqual(run.map((m) => m.type), ["runner.ready", "node.started", "node.finished", "runner.exiting"], stderr);
    for (const message of run) {
      assert.deepEqual([message.runId, message.runnerEpoch, message.generation], ["run-7", "re-7", 1], "the run's frames carry the run launch's envelope");
    }
    assert.deepEqual((run[2] as Extract<RunnerMessage, { type: "node.finished" }>).output, { ok: true });
    assert.deepEqual(readFileSync(marker, "utf8").split("\n").filter(Boolean), ["top level", "a"], "the module was evaluated once, at resolution");
    assert.equal(stderr.match(/loaded workflow modules:/g)?.length, 1, stderr);
    assert.match(stderr, /launched: mode run, run run-7, generation 1, epoch re-7/);
    assert.match(stderr, /start-up: .*run launch [\d.]+, verify [\d.]+, ready [\d.]+ \(ready [\d.]+ ms after the process started, [\d.]+ ms after its run launch\)/);
  });

  it("parks the run workflowSourceChanged when a source changed after the resolution, and runs no node", async () => {
    const marker = join(dir, "changed.marker");
    const root = project("changed", { "changed.workflow.ts": workflow("changed", marker) });
    const path = join(root, ".pi", "workflows", "changed.workflow.ts");
    const { messages, code, stderr } = await resolveThenRun(root, "changed", (result) => runLaunchOf(root, result), () => writeFileSync(path, `${readFileSync(path, "utf8")}// edited\n`));
    assert.equal(code, 0, stderr);
    assert.deepEqual(messages.map((m) => m.type), ["resolve.result", "run.parked"], stderr);
    assert.equal((messages[1] as Extract<RunnerMessage, { type: "run.parked" }>).reason, "workflowSourceChanged");
    assert.deepEqual(readFileSync(marker, "utf8").split("\n").filter(Boolean), ["top level"], "no node ran");
  });

  it("parks the run when its launch names other sources than the ones it resolved", async () => {
    const marker = join(dir, "other.marker");
    const root = project("other", { "mine.workflow.ts": workflow("mine", marker), "theirs.workflow.ts": workflow("theirs", marker) });
    const theirs = join(root, ".pi", "workflows", "theirs.workflow.ts");
    const { messages, stderr } = await resolveThenRun(root, "mine", (result) => ({
      ...runLaunchOf(root, result),
      workflowSource: { root: { kind: "file", path: theirs, hash: sha256Digest(readFileSync(theirs)) }, mounted: [] },
    }));
    assert.deepEqual(messages.map((m) => m.type), ["resolve.result", "run.parked"], stderr);
    assert.match(stderr, /the run launch names other sources than the ones resolved/);
    assert.deepEqual(readFileSync(marker, "utf8").split("\n").filter(Boolean), ["top level"], "theirs was never loaded, no node ran");
  });

  it("exits 0 when stdin ends instead of a run launch", async () => {
    const root = project("unhanded", { "plain.workflow.ts": workflow("plain", join(dir, "unhanded.marker")) });
    const { messages, code, stderr } = await runRunner({ ...launchBase(root), mode: "resolve", resolve: { workflow: "plain", input: {} } }, root);
    assert.equal(code, 0, stderr);
    assert.deepEqual(messages.map((m) => m.type), ["resolve.result"]);
    assert.match(stderr, /no run launch followed the resolution/);
  });
});

/** Runs the runner bin in validate mode: answers runner.ready with the validate command and every request with accepted. */
async function runValidator(launch: WorkerLaunch, cwd: string, output: unknown): Promise<{ messages: RunnerMessage[]; code: number | null; stderr: string }> {
  const child = spawn(process.execPath, [RUNNER_BIN], { cwd, stdio: ["pipe", "pipe", "pipe"], env: { ...process.env, HOME: join(dir, "home") } });
  const messages: RunnerMessage[] = [];
  const decoder = new FrameDecoder();
  let stderr = "";
  const envelope = { schema: "pi-workflows.worker-launch.v1", runId: launch.runId, generation: launch.generation, runnerEpoch: launch.runnerEpoch };
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  child.stdout.on("data", (chunk: Buffer) => {
    decoder.push(chunk);
    for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
      const message = decodeRunnerFrame(frame);
      messages.push(message);
      if (message.type === "runner.ready") {
        const target = launch.validate as { nodeId: string; attemptId: string };
        const state = { input: { task: "X" }, results: {}, resultOrder: [], steps: 0 };
        child.stdin.write(`${canonicalString({ ...envelope, type: "command", command: "validate", node: { nodeId: target.nodeId, attemptId: target.attemptId, visit: 1 }, state: { kind: "inline", value: state }, submission: { output } })}\n`);
      } else if (message.type === "interaction.accepted" || message.type === "interaction.rejected") {
        child.stdin.write(`${canonicalString({ ...envelope, type: "reply", inReplyTo: message.messageId, outcome: "accepted", result: null })}\n`);
      }
    }
  });
  child.stdin.write(encodeLaunch(launch));
  child.stdin.write("\n");
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  return { messages, code, stderr };
}

describe("validate mode", () => {
  const validating = `import { agent, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({ name: "judge", startAt: "judge", nodes: { judge: agent({ prompt: "Judge", validate: (output, ctx) => {
  const verdict = (output as { verdict?: unknown }).verdict;
  if (verdict !== "approve" && verdict !== "reject") throw new Error("verdict must be approve or reject, got " + JSON.stringify(verdict));
  return { verdict, task: (ctx.input as { task: string }).task };
} }) } });
`;
  const launchFor = async (root: string): Promise<WorkerLaunch> => {
    const path = join(root, ".pi", "workflows", "judge.workflow.ts");
    const compiled = await loadAndCompile(path, root);
    return {
      ...launchBase(root),
      mode: "validate",
      workflowSource: compiled.source,
      definitionDigest: compiled.definitionDigest,
      validate: { nodeId: "judge", attemptId: "att-1", interactionId: "int-1", submissionId: "sub-1" },
    };
  };

  it("runs the node's validate with the run state: a valid payload is accepted with the normalized output (tolerant JSON first)", async () => {
    const root = project("validate-ok", { "judge.workflow.ts": validating });
    const { messages, code, stderr } = await runValidator(await launchFor(root), root, 'Here you go: {"verdict": "approve"}');
    assert.equal(code, 0, stderr);
    assert.deepEqual(messages.map((m) => m.type), ["runner.ready", "interaction.accepted", "runner.exiting"]);
    const accepted = messages[1] as Extract<RunnerMessage, { type: "interaction.accepted" }>;
    assert.deepEqual([accepted.interactionId, accepted.submissionId], ["int-1", "sub-1"]);
    assert.deepEqual(accepted.output, { verdict: "approve", task: "X" });
  });

  it("a refused payload is rejected with validationFailed and the validate error the model will see", async () => {
    const root = project("validate-bad", { "judge.workflow.ts": validating });
    const { messages, code, stderr } = await runValidator(await launchFor(root), root, { verdict: "maybe" });
    assert.equal(code, 0, stderr);
    assert.deepEqual(messages.map((m) => m.type), ["runner.ready", "interaction.rejected", "runner.exiting"]);
    const rejected = messages[1] as Extract<RunnerMessage, { type: "interaction.rejected" }>;
    assert.deepEqual(rejected.error, { code: "validationFailed", message: 'verdict must be approve or reject, got "maybe"' });
  });

  it("a changed source rejects the submission with sourceChanged before any workflow code loads", async () => {
    const root = project("validate-changed", { "judge.workflow.ts": validating });
    const launch = await launchFor(root);
    writeFileSync(join(root, ".pi", "workflows", "judge.workflow.ts"), validating.replace("Judge", "Judge again"));
    const { messages, code, stderr } = await runValidator(launch, root, { verdict: "approve" });
    assert.equal(code, 0, stderr);
    assert.deepEqual(messages.map((m) => m.type), ["interaction.rejected", "runner.exiting"]);
    assert.equal((messages[0] as Extract<RunnerMessage, { type: "interaction.rejected" }>).error.code, "sourceChanged");
  });
});

describe("run mode source verification", () => {
  it("parks with workflowSourceChanged before loading any module when a hash differs", async () => {
    const marker = join(dir, "loaded.marker");
    const root = project("verify", {
      "marked.workflow.ts": `import { writeFileSync } from "node:fs";\nimport { compute, defineWorkflow } from "@pi-workflows/sdk";\nwriteFileSync(${JSON.stringify(marker)}, "loaded");\nexport default defineWorkflow({ name: "marked", startAt: "a", nodes: { a: compute({ run: () => 1 }) } });\n`,
    });
    const path = join(root, ".pi", "workflows", "marked.workflow.ts");
    const { messages, code } = await runRunner(
      {
        ...launchBase(root),
        mode: "run",
        workflowSource: { root: { kind: "file", path, hash: `sha256:${"0".repeat(64)}` }, mounted: [] },
        definitionDigest: `sha256:${"0".repeat(64)}`,
      },
      root,
    );
    assert.equal(code, 0);
    assert.deepEqual(messages.map((m) => m.type), ["run.parked"]);
    assert.equal((messages[0] as Extract<RunnerMessage, { type: "run.parked" }>).reason, "workflowSourceChanged");
    assert.equal(existsSync(marker), false, "no workflow code ran");
  });
});

/** An in-process channel: records messages and answers requests through `answer`. */
function stubChannel(answer: (type: string, fields: Record<string, unknown>) => Record<string, unknown> | undefined, executionMode: "interactive" | "headless" = "interactive") {
  const sent: Record<string, unknown>[] = [];
  let counter = 0;
  const reply = (type: string, fields: Record<string, unknown>): Reply => ({
    type: "reply",
    schema: "pi-workflows.worker-launch.v1",
    runId: "run-1",
    generation: 1,
    runnerEpoch: "re-1",
    inReplyTo: `m${counter}`,
    outcome: "accepted",
    result: null,
    next: { kind: "exit", reason: "finished" },
    ...(answer(type, fields) as Partial<Reply> | undefined),
  });
  const channel = {
    launch: { runId: "run-1", generation: 1, runnerEpoch: "re-1", executionMode },
    async send(type: string, fields: Record<string, unknown>) {
      counter += 1;
      sent.push({ type, ...fields });
      return `m${counter}`;
    },
    async request(type: string, fields: Record<string, unknown>) {
      counter += 1;
      sent.push({ type, ...fields });
      return reply(type, fields);
    },
  };
  return { channel: channel as unknown as RunnerChannel, sent };
}

async function executorFor(file: string, answer: Parameters<typeof stubChannel>[0], input: unknown = null) {
  const path = join(EXAMPLES_DIR, file);
  const compiled = await loadAndCompile(path, EXAMPLES_DIR);
  const { channel, sent } = stubChannel(answer);
  const state = new RunState({ input: input as never, results: {}, resultOrder: [], steps: 0 });
  const executor = new Executor({ channel, compiled, state, runId: "run-1", projectPath: dir, log: () => undefined, stopSignal: new AbortController().signal, journal: () => undefined });
  return { executor, sent, state, compiled };
}

describe("node execution (in process)", () => {
  it("runs an include: entry maps the input, children see local names, the exit returns {exit, output}", async () => {
    const { executor, sent, state, compiled } = await executorFor("include.workflow.ts", () => undefined, { text: "  ship it  " });
    assert.deepEqual(compiled.source.mounted.map((s) => (s.kind === "file" ? s.path : s.id)), [join(EXAMPLES_DIR, "review.workflow.ts")]);
    let visit = 0;
    for (const nodeId of ["draft", "review", "review/check", "review/approve", "review/__piw_exit_approved", "publish"]) {
      visit += 1;
      const after = await executor.run({ nodeId, attemptId: `a${visit}`, visit: 1 });
      assert.equal(after.reply.outcome, "accepted");
      const last = sent.at(-1) as { type: string; error?: unknown };
      assert.equal(last.type, "node.finished", `${nodeId}: ${JSON.stringify(last)}`);
    }
    assert.deepEqual(state.outputs.review, { schema: "pi-workflows.include-entry.v1", invocation: 1, input: { text: "ship it" } });
    assert.deepEqual(state.outputs["review/check"], { ok: true, length: 7 });
    assert.deepEqual(state.outputs["review/__piw_exit_approved"], { exit: "approved", output: { verdict: "approved", text: "ship it" } });
    assert.deepEqual(state.outputs.publish, { published: true, review: { exit: "approved", output: { verdict: "approved", text: "ship it" } } });
    const mounts = new Set(["review"]);
    assert.deepEqual(Object.keys(state.project(["review"], mounts).outputs).sort(), ["approve", "check"], "child sees its local names only");
  });

  it("re-entering a mount starts a fresh invocation with empty local state", () => {
    const state = new RunState({ input: null, results: {}, resultOrder: [], steps: 0 });
    const result = (nodeId: string, output: unknown) => ({ attemptId: nodeId, nodeId, nodeType: "compute", outcome: "ok" as const, startedAt: "", finishedAt: "", durationMs: 0, output });
    state.record("m", result("m", { schema: "pi-workflows.include-entry.v1", invocation: 1, input: { n: 1 } }));
    state.record("m/x", result("m/x", { first: true }));
    state.record("m/__piw_exit_done", result("m/__piw_exit_done", { exit: "done", output: 1 }));
    assert.deepEqual(state.project([], new Set(["m"])).outputs, { m: { exit: "done", output: 1 } });
    state.record("m", result("m", { schema: "pi-workflows.include-entry.v1", invocation: 2, input: { n: 2 } }));
    const child = state.project(["m"], new Set(["m"]));
    assert.deepEqual(child, { input: { n: 2 }, outputs: {}, results: {}, steps: 0 });
    assert.equal(state.project([], new Set(["m"])).outputs.m, undefined, "re-entered, not exited");
  });

  it("reports the resolved deadline and times a non-cooperative callback out", async () => {
    const root = project("deadline", {
      "slow.workflow.ts": `import { compute, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "slow", startAt: "a", nodes: { a: compute({ timeoutMs: 100, run: () => new Promise(() => undefined) }), b: compute({ timeoutMs: () => 5000, run: () => 1 }) }, edges: [{ from: "a", to: "b" }] });\n`,
    });
    const compiled = await loadAndCompile(join(root, ".pi", "workflows", "slow.workflow.ts"), root);
    const { channel, sent } = stubChannel(() => undefined);
    const executor = new Executor({ channel, compiled, state: new RunState({ input: null, results: {}, resultOrder: [], steps: 0 }), runId: "r", projectPath: root, log: () => undefined, stopSignal: new AbortController().signal, journal: () => undefined });
    const before = Date.now();
    await executor.run({ nodeId: "a", attemptId: "a1", visit: 1 });
    const started = sent[0] as { type: string; deadlineAtMs: number };
    assert.equal(started.type, "node.started");
    assert.ok(started.deadlineAtMs >= before + 100 && started.deadlineAtMs <= Date.now() + 100);
    assert.deepEqual(sent[1], { type: "node.failed", attemptId: "a1", outcome: "timed_out", error: { code: "timedOut", message: "the node exceeded its deadline of 100 ms" } });
    await executor.run({ nodeId: "b", attemptId: "b1", visit: 1 });
    const dynamic = sent[2] as { deadlineAtMs: number };
    assert.ok(dynamic.deadlineAtMs >= before + 5000, "a function timeout is resolved and reported");
  });

  it("enforces a deadline the server committed with the dispatch and sends node.started only for a status detail", async () => {
    const root = project("committed", {
      "slow.workflow.ts": `import { compute, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "slow", startAt: "a", nodes: { a: compute({ timeoutMs: 100, run: () => new Promise(() => undefined) }), b: compute({ timeoutMs: 100, statusDetail: "busy", run: () => 1 }), c: compute({ timeoutMs: null, run: () => 2 }) }, edges: [{ from: "a", to: "b" }, { from: "b", to: "c" }] });\n`,
    });
    const compiled = await loadAndCompile(join(root, ".pi", "workflows", "slow.workflow.ts"), root);
    const { channel, sent } = stubChannel(() => undefined);
    const executor = new Executor({ channel, compiled, state: new RunState({ input: null, results: {}, resultOrder: [], steps: 0 }), runId: "r", projectPath: root, log: () => undefined, stopSignal: new AbortController().signal, journal: () => undefined });
    const started = Date.now();
    await executor.run({ nodeId: "a", attemptId: "a1", visit: 1, deadline: { kind: "committed", deadlineAtMs: started + 150 } });
    assert.ok(Date.now() >= started + 140, "the timer runs to the committed deadline");
    assert.deepEqual(sent, [{ type: "node.failed", attemptId: "a1", outcome: "timed_out", error: { code: "timedOut", message: "the node exceeded its deadline of 100 ms" } }], "no node.started");
    await executor.run({ nodeId: "b", attemptId: "b1", visit: 1, deadline: { kind: "committed", deadlineAtMs: Date.now() + 100 } });
    assert.deepEqual(sent[1], { type: "node.started", attemptId: "b1", statusDetail: "busy" }, "the status detail alone, no second deadline");
    assert.equal((sent[2] as { type: string }).type, "node.finished");
    await executor.run({ nodeId: "c", attemptId: "c1", visit: 1, deadline: { kind: "committed" } });
    assert.deepEqual(sent.slice(3).map((m) => m.type), ["node.finished"], "no deadline, nothing to report");
  });

  it("function actions go through effect.reserve/settle; a settled effect is adopted without running again", async () => {
    const root = project("effects", {
      "act.workflow.ts": `import { appendFileSync } from "node:fs";\nimport { action, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "act", startAt: "a", nodes: { a: action({ run: () => { appendFileSync(${JSON.stringify(join(dir, "applied.log"))}, "x"); return { sent: 1 }; } }) } });\n`,
    });
    const compiled = await loadAndCompile(join(root, ".pi", "workflows", "act.workflow.ts"), root);
    const make = (state: string, result?: unknown) => {
      const stub = stubChannel((type) =>
        type === "effect.reserve" ? { result: { effectId: "effect-1", state, attemptNumber: 1, ...(result !== undefined ? { result } : {}) } as never } : undefined,
      );
      return { ...stub, executor: new Executor({ channel: stub.channel, compiled, state: new RunState({ input: null, results: {}, resultOrder: [], steps: 0 }), runId: "r", projectPath: root, log: () => undefined, stopSignal: new AbortController().signal, journal: () => undefined }) };
    };
    const fresh = make("applying");
    await fresh.executor.run({ nodeId: "a", attemptId: "a1", visit: 1 });
    assert.deepEqual(fresh.sent.map((m) => m.type), ["node.started", "effect.reserve", "effect.settle", "node.finished"]);
    assert.match((fresh.sent[1] as { requestDigest: string }).requestDigest, /^sha256:[0-9a-f]{64}$/);
    assert.equal((fresh.sent[1] as { effectType: string }).effectType, "function");
    assert.deepEqual(fresh.sent[2], { type: "effect.settle", effectId: "effect-1", state: "applied", result: { actionType: "function", output: { sent: 1 } } });
    assert.deepEqual(fresh.sent[3], { type: "node.finished", attemptId: "a1", output: { sent: 1 }, action: { effectId: "effect-1", state: "applied", result: { actionType: "function" } } });
    assert.equal(readFileSync(join(dir, "applied.log"), "utf8"), "x");
    const adopted = make("applied", { actionType: "function", output: { sent: 1 } });
    await adopted.executor.run({ nodeId: "a", attemptId: "a2", visit: 1 });
    assert.deepEqual(adopted.sent.map((m) => m.type), ["node.started", "effect.reserve", "node.finished"]);
    assert.equal(readFileSync(join(dir, "applied.log"), "utf8"), "x", "the callback did not run again");
  });

  it("publishUpdate sends node.update; a rejection becomes an error thrown in the callback", async () => {
    const root = project("updates", {
      "upd.workflow.ts": `import { action, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "upd", startAt: "a", nodes: { a: action({ run: async ({ publishUpdate }) => { const r = await publishUpdate({ type: "progress", key: "overall", data: { status: "running" } }); try { await publishUpdate({ type: "progress", key: "second", data: { status: "running" } }); } catch (e) { return { first: r, rejected: e.message }; } return { first: r }; } }) } });\n`,
    });
    const compiled = await loadAndCompile(join(root, ".pi", "workflows", "upd.workflow.ts"), root);
    let updates = 0;
    const { channel, sent } = stubChannel((type) => {
      if (type === "effect.reserve") return { result: { effectId: "e", state: "applying", attemptNumber: 1 } };
      if (type !== "node.update") return undefined;
      updates += 1;
      return updates === 1 ? { result: { updateId: "upd_1", seq: 4 } } : { outcome: "rejected", error: { code: "rateLimited", message: "updates are limited to 20 per second with a burst of 100" } };
    });
    const executor = new Executor({ channel, compiled, state: new RunState({ input: null, results: {}, resultOrder: [], steps: 0 }), runId: "r", projectPath: root, log: () => undefined, stopSignal: new AbortController().signal, journal: () => undefined });
    await executor.run({ nodeId: "a", attemptId: "att", visit: 1 });
    assert.deepEqual(sent[2], { type: "node.update", attemptId: "att", update: { type: "progress", key: "overall", data: { status: "running" } }, idempotencyKey: "att:u1" });
    const finished = sent.at(-1) as { output: { first: unknown; rejected: string } };
    assert.deepEqual(finished.output.first, { updateId: "upd_1", seq: 4 });
    assert.match(finished.output.rejected, /update progress\/second was rejected: rateLimited: updates are limited/);
  });

  it("an update published after its node settled is refused in the runner, never sent for a finished attempt", async () => {
    const root = project("late-update", {
      "late.workflow.ts": `import { action, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "late", startAt: "a", nodes: { a: action({ run: async ({ publishUpdate }) => { (globalThis as Record<string, unknown>).latePublish = publishUpdate; return { done: true }; } }) } });\n`,
    });
    const file = join(root, ".pi", "workflows", "late.workflow.ts");
    const compiled = await loadAndCompile(file, root);
    const { channel, sent } = stubChannel((type) => (type === "effect.reserve" ? { result: { effectId: "e", state: "applying", attemptNumber: 1 } } : undefined));
    const executor = new Executor({ channel, compiled, state: new RunState({ input: null, results: {}, resultOrder: [], steps: 0 }), runId: "r", projectPath: root, log: () => undefined, stopSignal: new AbortController().signal, journal: () => undefined });
    await executor.run({ nodeId: "a", attemptId: "att", visit: 1 });
    assert.equal((sent.at(-1) as { type: string }).type, "node.finished");
    const sentBefore = sent.length;
    // The node kept its publisher and calls it after it returned (an un-awaited update).
    const latePublish = (globalThis as Record<string, unknown>).latePublish as (update: unknown) => Promise<unknown>;
    await assert.rejects(latePublish({ type: "progress", key: "late", data: { n: 1 } }), /publishUpdate\(\): node a already finished/);
    assert.equal(sent.length, sentBefore, "nothing was sent for the finished attempt");
  });

  it("agent steps send the prompt with its step contract; a headless run fails with a clear error", async () => {
    const root = project("agent", {
      "ask.workflow.ts": `import { agent, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "ask", startAt: "plan", nodes: { plan: agent({ prompt: ({ input }) => "Plan " + input.task, expectedOutput: "{ \\"steps\\": string[] }" }) } });\n`,
    });
    const compiled = await loadAndCompile(join(root, ".pi", "workflows", "ask.workflow.ts"), root);
    const interactive = stubChannel((type) => (type === "interaction.requested" ? { result: { interactionId: "int-1" }, next: { kind: "exit", reason: "waiting" } } : undefined));
    const run = (channel: RunnerChannel) =>
      new Executor({ channel, compiled, state: new RunState({ input: { task: "X" }, results: {}, resultOrder: [], steps: 0 }), runId: "r", projectPath: root, log: () => undefined, stopSignal: new AbortController().signal, journal: () => undefined }).run({ nodeId: "plan", attemptId: "att-1", visit: 1 });
    const after = await run(interactive.channel);
    assert.equal(after.kind, "exit");
    const request = interactive.sent[1] as { type: string; kind: string; prompt: { kind: string; text: string }; contract: Record<string, unknown> };
    assert.equal(request.type, "interaction.requested");
    assert.equal(request.kind, "agent");
    assert.ok(request.prompt.text.startsWith("Plan X\n\n---\nWorkflow step contract (workflow: ask, step: plan, attempt: att-1)\n"));
    assert.ok(request.prompt.text.includes('\nExpected output: { "steps": string[] }\n'));
    assert.equal(request.contract.expectedOutput, '{ "steps": string[] }');
  });

  it("a headless run fails a visible assistant-message step with headlessAssistantMessage before it asks for anything", async () => {
    const root = project("assistant", {
      "say.workflow.ts": `import { agent, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "say", startAt: "say", nodes: { say: agent({ prompt: "Say hello", expectedOutput: { kind: "assistant-message" } }) } });\n`,
    });
    const compiled = await loadAndCompile(join(root, ".pi", "workflows", "say.workflow.ts"), root);
    const run = (channel: RunnerChannel) =>
      new Executor({ channel, compiled, state: new RunState({ input: null, results: {}, resultOrder: [], steps: 0 }), runId: "r", projectPath: root, log: () => undefined, stopSignal: new AbortController().signal, journal: () => undefined }).run({ nodeId: "say", attemptId: "att-1", visit: 1 });
    const headless = stubChannel(() => undefined, "headless");
    await run(headless.channel);
    assert.deepEqual(headless.sent.map((m) => m.type), ["node.started", "node.failed"]);
    const failed = headless.sent[1] as { error: { code: string; message: string } };
    assert.equal(failed.error.code, "headlessAssistantMessage");
    assert.match(failed.error.message, /needs an origin Pi session/);
    const interactive = stubChannel((type) => (type === "interaction.requested" ? { result: { interactionId: "int-1" }, next: { kind: "exit", reason: "waiting" } } : undefined));
    assert.equal((await run(interactive.channel)).kind, "exit");
    const request = interactive.sent[1] as { type: string; kind: string; prompt: { text: string } };
    assert.equal(request.kind, "visibleResponse");
    assert.equal(request.prompt.text, "Say hello", "an assistant-message step carries no submit contract");
  });

  it("a headless agent step without Pi fails with one line naming the install command, before any request", async () => {
    const root = project("nopi", {
      "ask.workflow.ts": `import { agent, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "ask", startAt: "plan", nodes: { plan: agent({ prompt: "Plan" }) } });\n`,
    });
    const compiled = await loadAndCompile(join(root, ".pi", "workflows", "ask.workflow.ts"), root);
    const notExecutable = join(root, "not-pi");
    writeFileSync(notExecutable, "#!/bin/sh\n");
    const saved = process.env.PI_WORKFLOWS_PI;
    process.env.PI_WORKFLOWS_PI = notExecutable;
    try {
      const headless = stubChannel(() => undefined, "headless");
      await new Executor({ channel: headless.channel, compiled, state: new RunState({ input: null, results: {}, resultOrder: [], steps: 0 }), runId: "r", projectPath: root, log: () => undefined, stopSignal: new AbortController().signal, journal: () => undefined }).run({ nodeId: "plan", attemptId: "att-1", visit: 1 });
      assert.deepEqual(headless.sent.map((m) => m.type), ["node.started", "node.failed"]);
      const message = (headless.sent[1] as { error: { message: string } }).error.message;
      assert.doesNotMatch(message, /\n/);
      assert.match(message, /npm install -g @earendil-works\/pi-coding-agent/);
      assert.match(message, /scripts\/install-pi\.sh/);
    } finally {
      if (saved === undefined) delete process.env.PI_WORKFLOWS_PI;
      else process.env.PI_WORKFLOWS_PI = saved;
    }
  });

  it("finds Pi in PI_WORKFLOWS_PI, then on PATH, else says how to install it", () => {
    const bin = join(dir, "pi-bin");
    mkdirSync(bin, { recursive: true });
    const fakePi = join(bin, "pi");
    writeFileSync(fakePi, "#!/bin/sh\n", { mode: 0o755 });
    assert.deepEqual(resolvePi({ PI_WORKFLOWS_PI: fakePi, PATH: "" }), { program: fakePi, args: [], source: "PI_WORKFLOWS_PI" });
    assert.deepEqual(resolvePi({ PATH: `/nonexistent:${bin}` }), { program: fakePi, args: [], source: "PATH" });
    assert.throws(() => resolvePi({ PI_WORKFLOWS_PI: join(bin, "missing"), PATH: bin }), (error: Error) => error instanceof PiUnavailable && /is not an executable file/.test(error.message));
    assert.deepEqual(modelArgs({ provider: "anthropic", model: "claude-sonnet-4-5", thinking: "low" }), ["--provider", "anthropic", "--model", "claude-sonnet-4-5", "--thinking", "low"]);
    assert.deepEqual(modelArgs({}), []);
  });
});

describe("discovery", () => {
  it("finds .pi/workflows first, then ~/.pi/agent/workflows, named by file stem; resolves names and paths", async () => {
    const home = join(dir, "disc-home");
    const root = project("disc", { "a.workflow.ts": "", "shared.workflow.mjs": "", "notes.ts": "", "b.workflow.js": "" });
    mkdirSync(join(home, ".pi", "agent", "workflows"), { recursive: true });
    for (const file of ["shared.workflow.ts", "global.workflow.mts", "x.txt"]) writeFileSync(join(home, ".pi", "agent", "workflows", file), "");
    const found = await discoverWorkflows(root, home);
    assert.deepEqual(found.map((w) => `${w.name}:${w.origin}`), ["a:project", "b:project", "shared:project", "global:global"]);
    const byName = await resolveWorkflowRef("global", { projectPath: root, home });
    assert.deepEqual(byName, { kind: "file", path: join(home, ".pi", "agent", "workflows", "global.workflow.mts") });
    const byPath = await resolveWorkflowRef(".pi/workflows/a.workflow.ts", { projectPath: root, home });
    assert.deepEqual(byPath, { kind: "file", path: join(root, ".pi", "workflows", "a.workflow.ts") });
    await assert.rejects(resolveWorkflowRef("nope", { projectPath: root, home }), /available: a, b, shared, global/);
    await assert.rejects(resolveWorkflowRef("builtin:monitor", { projectPath: root, home }), /this version ships none/);
  });
});

describe("shell actions", () => {
  const exec = (execution: Parameters<typeof resolveExecution>[0]) => resolveExecution(execution, dir, resolvePath);
  const never = new AbortController().signal;

  it("passes stdin, env and cwd, and captures stdout and stderr", async () => {
    mkdirSync(join(dir, "sub"), { recursive: true });
    const outcome = await runShell(
      exec({ command: process.execPath, args: ["-e", "process.stdin.pipe(process.stdout); console.error(process.env.PIW_X + ' ' + process.cwd())"], stdin: "from stdin", env: { PIW_X: "x-value" }, cwd: "sub" }),
      { signal: never },
    );
    assert.equal(outcome.failure, undefined);
    assert.equal(outcome.result.stdout, "from stdin");
    assert.equal(outcome.result.stderr, `x-value ${join(dir, "sub")}\n`);
    assert.equal(outcome.result.exitCode, 0);
  });

  /** Resolves `work`, or rejects after `ms` naming what hung (a hang is the defect, not slowness). */
  const within = <T,>(work: Promise<T>, ms: number, what: string): Promise<T> =>
    Promise.race([work, new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} did not end within ${ms} ms`)), ms).unref())]);

  it("sees the exit of a command that ends while its process group is still being registered", async () => {
    for (const command of [{ command: "true" }, { command: "/bin/echo", args: ["42"] }, { command: "sh", args: ["-c", "echo hi"] }]) {
      const events: string[] = [];
      const outcome = await within(
        runShell(exec(command), {
          signal: never,
          // A registration round trip slower than the command itself.
          onSpawn: async (pid) => {
            events.push(`spawn ${pid}`);
            await new Promise((resolve) => setTimeout(resolve, 300));
            events.push("registered");
          },
          onClose: async (pid) => {
            events.push(`close ${pid}`);
          },
        }),
        20_000,
        command.command,
      );
      assert.equal(outcome.failure, undefined, command.command);
      assert.equal(outcome.result.exitCode, 0);
      assert.equal(outcome.result.stdout, command.command === "true" ? "" : command.command === "sh" ? "hi\n" : "42\n");
      const pid = events[0]?.split(" ")[1];
      assert.deepEqual(events, [`spawn ${pid}`, "registered", `close ${pid}`], "the group is unregistered only after its registration settled");
    }
  });

  it("a command killed by a signal reports the signal and no exit code", async () => {
    const outcome = await within(runShell(exec({ command: "sh", args: ["-c", "kill -TERM $$"] }), { signal: never }), 20_000, "kill -TERM");
    assert.deepEqual([outcome.result.exitCode, outcome.result.signal], [null, "SIGTERM"]);
    assert.equal(outcome.failure?.message, 'Shell action failed (sh "-c" "kill -TERM $$"): signal SIGTERM');
  });

  it("caps each stream at maxOutputChars with the truncation marker", async () => {
    const outcome = await runShell(exec({ command: process.execPath, args: ["-e", "process.stdout.write('y'.repeat(5000))"], maxOutputChars: 10 }), { signal: never });
    assert.equal(outcome.result.stdout, `yyyyyyyyyy${TRUNCATION_MARKER}`);
    assert.equal(TRUNCATION_MARKER, "\n…[output truncated]");
  });

  it("never cuts a surrogate pair in half at the cap (canonical JSON could not carry the half)", async () => {
    const outcome = await runShell(exec({ command: process.execPath, args: ["-e", "process.stdout.write('😀'.repeat(50))"], maxOutputChars: 3 }), { signal: never });
    assert.equal(outcome.result.stdout, `😀${TRUNCATION_MARKER}`);
  });

  it("fails on a non-zero exit with the command and stderr; allowNonZeroExit accepts it", async () => {
    const failing = exec({ command: process.execPath, args: ["-e", "console.error('bad thing'); process.exit(3)"] });
    const outcome = await runShell(failing, { signal: never });
    assert.equal(outcome.failure?.message, `Shell action failed (${process.execPath} "-e" "console.error('bad thing'); process.exit(3)"): exit 3\nbad thing\n`);
    assert.equal(outcome.result.exitCode, 3);
    const allowed = await runShell({ ...failing, allowNonZeroExit: true }, { signal: never });
    assert.equal(allowed.failure, undefined);
  });

  it("keeps a receipt when the executable is missing", async () => {
    const outcome = await runShell(exec({ command: "/nonexistent/piw-no-such-binary" }), { signal: never });
    assert.equal(outcome.failure?.cause, "spawn");
    assert.match(outcome.failure?.message ?? "", /ENOENT/);
    assert.equal(outcome.result.exitCode, null);
    assert.equal(outcome.result.command, "/nonexistent/piw-no-such-binary");
  });

  it("an abort stops the whole process group (SIGTERM, then SIGKILL after 1 s)", async () => {
    const pids = join(dir, "pids.txt");
    const controller = new AbortController();
    const script = `process.on('SIGTERM', () => {}); const c = require('child_process').spawn('sleep', ['1000'], { stdio: 'ignore' }); require('fs').writeFileSync(${JSON.stringify(pids)}, process.pid + ' ' + c.pid); setInterval(() => {}, 1000);`;
    const running = runShell(exec({ command: process.execPath, args: ["-e", script] }), { signal: controller.signal });
    while (!existsSync(pids)) await new Promise((r) => setTimeout(r, 20));
    const started = Date.now();
    controller.abort(new Error("stop"));
    const outcome = await running;
    assert.equal(outcome.failure?.cause, "aborted");
    assert.ok(Date.now() - started >= 900, "SIGTERM was ignored, so SIGKILL came after the escalation delay");
    for (const pid of readFileSync(pids, "utf8").split(" ").map(Number)) {
      assert.throws(() => process.kill(pid, 0), /ESRCH/, `process ${pid} is gone`);
    }
  });

  it("parses update lines (trailing partial line included) and rejects invalid UTF-8", async () => {
    const lines: string[] = [];
    const outcome = await runShell(exec({ command: process.execPath, args: ["-e", "process.stdout.write('one\\ntwo\\nthree')"] }), {
      signal: never,
      onLine: async (line) => {
        await new Promise((r) => setTimeout(r, 5));
        lines.push(line);
      },
    });
    assert.equal(outcome.failure, undefined);
    assert.deepEqual(lines, ["one", "two", "three"]);
    const bad = await runShell(exec({ command: process.execPath, args: ["-e", "process.stdout.write(Buffer.from([0x66, 0xff, 0x0a]))"] }), { signal: never, onLine: async () => undefined });
    assert.equal(bad.failure?.cause, "updates");
    const thrown = await runShell(exec({ command: process.execPath, args: ["-e", "console.log('x'); setTimeout(() => {}, 5000)"] }), {
      signal: never,
      onLine: async () => {
        throw new Error("parser broke");
      },
    });
    assert.match(thrown.failure?.message ?? "", /parser broke/);
  });
});
