/**
 * Node values the runner.v1 wire cannot carry as they are, through the real
 * server and node runners: an output nested deeper than the 64-level frame
 * limit, an output over the 1 MiB frame limit, a string with a lone
 * surrogate (canonical JSON cannot encode it), an output deeper than the run
 * state a resumed runner receives can carry, an action's effect result and an
 * update's data of the same kinds. Each fails its node with a reason
 * that names the rule; the runner proposes that failure and exits normally
 * (it never dies, and the run never parks as runnerNoProgress). Values at the
 * limits still complete.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { RunView } from "../src/generated/types.js";
import { type TestClient, TestServer } from "../test-support/server.js";

let server: TestServer;
let client: TestClient;
let project: string;

/**
 * `values`: one node whose kind and produced value come from the input:
 * `{kind: "compute" | "action" | "shell" | "update", value: "nested" | "string" | "surrogate", size}`.
 * `nested` is `size` levels of `{"a": …}` (the innermost `{}` counts as one),
 * `string` a string of `size` ASCII characters.
 */
const VALUES_WORKFLOW = `import { action, compute, defineWorkflow, shell } from "@pi-workflows/sdk";
function make({ value, size }) {
  if (value === "nested") {
    let v = {};
    for (let i = 1; i < size; i += 1) v = { a: v };
    return v;
  }
  if (value === "string") return "x".repeat(size);
  if (value === "surrogate") return { text: "ok \\ud800 broken" };
  throw new Error("unknown value " + value);
}
export default defineWorkflow({
  name: "values",
  startAt: "route",
  nodes: {
    route: compute({ run: ({ input }) => input }),
    compute: compute({ run: ({ input }) => make(input) }),
    action: action({ run: ({ input }) => make(input) }),
    shell: shell({ exec: () => ({ command: "true" }), parse: (_result, { input }) => make(input) }),
    update: action({
      run: async ({ input, publishUpdate }) => {
        await publishUpdate({ type: "progress", key: "deep", data: { status: "running", detail: make(input) } });
        return { published: true };
      },
    }),
  },
  edges: [{ from: "route", switch: { on: "$.kind", cases: { compute: "compute", action: "action", shell: "shell", update: "update" } } }],
});
`;

const DEEP_OUTPUT = (depth: number): string =>
  `its output nests ${depth} levels; it may nest at most 59, so that the run state a runner receives (command.state.value.results.<node>.output) fits the protocol's 64-level frame limit`;

/** `deep-resume`: `first` outputs 59 levels, `hold` waits for `release`, `last` measures `outputs.first`. */
function resumeWorkflow(release: string): string {
  return `import { existsSync } from "node:fs";
import { compute, defineWorkflow } from "@pi-workflows/sdk";
const depth = (v) => (typeof v === "object" && v !== null ? 1 + Math.max(0, ...Object.values(v).map(depth)) : 0);
export default defineWorkflow({
  name: "deep-resume",
  startAt: "first",
  nodes: {
    first: compute({ run: () => { let v = {}; for (let i = 1; i < 59; i += 1) v = { a: v }; return v; } }),
    hold: compute({
      timeoutMs: 60_000,
      run: ({ signal }) => new Promise((resolve, reject) => {
        const timer = setInterval(() => { if (existsSync(${JSON.stringify(release)})) { clearInterval(timer); resolve({ held: true }); } }, 20);
        signal.addEventListener("abort", () => { clearInterval(timer); reject(signal.reason); });
      }),
    }),
    last: compute({ run: ({ outputs }) => ({ depth: depth(outputs.first) }) }),
  },
  edges: [{ from: "first", to: "hold" }, { from: "hold", to: "last" }],
});
`;
}

before(async () => {
  server = await TestServer.start();
  project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "values.workflow.ts"), VALUES_WORKFLOW);
  client = await server.connect();
});

after(async () => {
  client?.close();
  await server?.stop();
});

interface Case {
  kind: "compute" | "action" | "shell" | "update";
  value: "nested" | "string" | "surrogate";
  size?: number;
}

/** Runs one case to its end; checks the runner proposed the outcome itself and exited normally. */
async function run(input: Case): Promise<RunView> {
  const runId = await client.start(project, "values", input);
  const view = await client.settled(runId, 60_000);
  // The runner journaled its exit: it did not crash.
  const journal = await server.journalAfterExit(runId);
  const node = journal.find((record) => record.event === "node" && record.nodeId === input.kind);
  assert.ok(node, `the runner proposed a result for ${input.kind} (${JSON.stringify(view.status)} ${JSON.stringify(view.failure ?? null)})`);
  return view;
}

/** The run fails `nodeFailed` with `reason`, and its view says which node failed and why. */
async function fails(input: Case, reason: string | RegExp): Promise<RunView> {
  const view = await run(input);
  assert.equal(view.status.run, "failed", JSON.stringify(view.display));
  assert.equal(view.failure?.class, "nodeFailed");
  const message = view.failure?.message ?? "";
  if (typeof reason === "string") assert.equal(message, reason);
  else assert.match(message, reason);
  assert.equal(view.display.reason, `node ${input.kind} failed: ${message}`);
  return view;
}

/** The states of the run's managed effects (the server's effects table). */
function effectStates(runId: string): string[] {
  const out = execFileSync("sqlite3", [join(server.home, "state.sqlite"), `SELECT state FROM effects WHERE run_id = '${runId}'`], { encoding: "utf8" });
  return out.split("\n").filter((line) => line !== "");
}

async function completes(input: Case): Promise<void> {
  const view = await run(input);
  assert.equal(view.status.run, "completed", `${JSON.stringify(input)}: ${JSON.stringify(view.failure ?? null)}`);
}

describe("node values the wire cannot carry", () => {
  it("a compute output nested deeper than the run state can carry fails its node naming the limit; 59 levels still complete", async () => {
    await fails({ kind: "compute", value: "nested", size: 70 }, DEEP_OUTPUT(70));
    await fails({ kind: "compute", value: "nested", size: 60 }, DEEP_OUTPUT(60));
    await completes({ kind: "compute", value: "nested", size: 59 });
  });

  it("an output of 59 levels survives pause and resume: the resumed runner receives it in its run state", async () => {
    const release = join(server.root, "resume.release");
    writeFileSync(join(project, ".pi", "workflows", "deep-resume.workflow.ts"), resumeWorkflow(release));
    const runId = await client.start(project, "deep-resume", {});
    await client.waitFor(runId, (view) => view.display.currentNode === "hold", 30_000, "hold running");
    assert.equal((await client.command("run.pause", {}, runId)).outcome, "accepted");
    await client.waitFor(runId, (view) => view.display.status === "paused" && view.status.queue === "parked", 30_000, "paused");
    writeFileSync(release, "go");
    assert.equal((await client.command("run.resume", {}, runId)).outcome, "accepted");
    const view = await client.settled(runId, 60_000);
    assert.equal(view.status.run, "completed", JSON.stringify(view.failure ?? null));
    const journal = await server.journalAfterExit(runId);
    const last = journal.find((record) => record.event === "node" && record.nodeId === "last");
    assert.deepEqual(last?.output, { depth: 59 });
    const commands = journal.filter((record) => record.event === "command").map((record) => record.command);
    assert.deepEqual(commands, ["start", "resume"]);
  });

  it("a compute output over the 1 MiB frame limit fails its node naming the limit; 1,000,000 characters still complete", async () => {
    await fails(
      { kind: "compute", value: "string", size: 1_400_000 },
      /^its output is 1\.34 MiB encoded \(the node\.finished frame would be 1,400,\d\d\d bytes\); a frame must fit the protocol's 1 MiB limit \(1,048,576 bytes\)$/,
    );
    await completes({ kind: "compute", value: "string", size: 1_000_000 });
  });

  it("an output string with a lone surrogate fails its node: canonical JSON cannot encode it", async () => {
    await fails({ kind: "compute", value: "surrogate" }, "the output of compute holds a string with a lone UTF-16 surrogate, which canonical JSON (RFC 8785) cannot encode");
  });

  it("an action output that its effect result cannot carry fails the node; the effect is settled, not left applying", async () => {
    const deep = await fails({ kind: "action", value: "nested", size: 63 }, DEEP_OUTPUT(63));
    assert.deepEqual(effectStates(deep.runId), ["applied"], "the action ran: its effect is settled applied, without the value");
    // The receipt in the frame names the command's directory and duration, so the frame size varies.
    const large = await fails(
      { kind: "shell", value: "string", size: 1_100_000 },
      /^its output is 1\.05 MiB encoded \(the effect\.settle frame would be 1,1\d\d,\d\d\d bytes\); a frame must fit the protocol's 1 MiB limit \(1,048,576 bytes\)$/,
    );
    assert.deepEqual(effectStates(large.runId), ["applied"]);
    await completes({ kind: "action", value: "nested", size: 59 });
  });

  it("update data the wire cannot carry fails the publishing node with the reason", async () => {
    await fails(
      { kind: "update", value: "nested", size: 63 },
      "update progress/deep data nests 64 levels; a node.update message can carry at most 62, within the protocol's 64-level frame limit",
    );
  });
});
