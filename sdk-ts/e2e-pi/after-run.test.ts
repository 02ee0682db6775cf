/**
 * What happens after a run ends in a real Pi conversation (issue 16): the
 * terminal decision turn's one selected launch (a restart through the
 * `workflow` tool, held until the turn settles), the restart rule as the
 * model meets it (the same failure twice, a fourth restart), and ordered
 * follow-ups from `/workflow then` (run in order after the terminal turn;
 * cancelled by a failure), the model's own cancel (its card stops by
 * default), and a selected launch whose activation fails (its factual
 * fallback reaches the model once). Real Pi 1.6.0 in rpc mode with this package's
 * extension, the real server binary, the node runner and the mock model.
 * Run with `npm run test:pi` (after `scripts/install-pi.sh` and
 * `cargo build -p server`).
 */
import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type TestContext, describe, it } from "node:test";

import { type MockRequest, type MockRule, reply } from "../test-support/mock-model.js";
import { type PiFixture, type PiRecord, type PiRpc, piFixture } from "../test-support/pi.js";
import { SDK_DIR, TestServer, serverBinary } from "../test-support/server.js";
import { TERMINAL_FACTS, TERMINAL_REPLY, TERMINAL_TYPE, terminalRule, terminalTurnSettled, terminalTurns } from "../test-support/terminal.js";

/** One compute node that always fails the same way. */
const FAILS = `import { compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "fails",
  startAt: "build",
  nodes: { build: compute({ run: () => { throw new Error("the build broke"); } }) },
  edges: [],
});
`;

/**
 * Fails at a different node on each run (a counter file names it), so every
 * restart has a new terminal fingerprint and only the restart limit stops it.
 */
const FLAKY = `import { compute, defineWorkflow } from "@pi-workflows/sdk";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
const fail = (where) => compute({ run: () => { throw new Error("failed at " + where); } });
export default defineWorkflow({
  name: "flaky",
  startAt: "pick",
  nodes: {
    pick: compute({ run: ({ input }) => {
      const file = input.counter;
      const n = existsSync(file) ? Number(readFileSync(file, "utf8")) + 1 : 1;
      writeFileSync(file, String(n));
      return { at: "f" + Math.min(n, 5) };
    } }),
    f1: fail("f1"), f2: fail("f2"), f3: fail("f3"), f4: fail("f4"), f5: fail("f5"),
  },
  edges: [{ from: "pick", switch: { on: "$.at", cases: { f1: "f1", f2: "f2", f3: "f3", f4: "f4", f5: "f5" } } }],
});
`;

/** Waits until the gate file exists, then completes (or fails when the input says so). */
const GATED = `import { compute, defineWorkflow } from "@pi-workflows/sdk";
import { existsSync } from "node:fs";
export default defineWorkflow({
  name: "gated",
  startAt: "wait",
  nodes: {
    wait: compute({ run: async ({ input }) => {
      while (!existsSync(input.gate)) await new Promise((resolve) => setTimeout(resolve, 50));
      if (input.fail === true) throw new Error("the gated work failed");
      return { done: true };
    } }),
  },
  edges: [],
});
`;

/**
 * A workflow whose module throws while it loads once `marker` exists: it
 * resolves when started, and its runner cannot load it when the marker was
 * written before its activation.
 */
const brittle = (marker: string): string => `import { compute, defineWorkflow } from "@pi-workflows/sdk";
import { existsSync } from "node:fs";
if (existsSync(${JSON.stringify(marker)})) throw new Error("the brittle workflow cannot load now");
export default defineWorkflow({
  name: "brittle",
  startAt: "work",
  nodes: { work: compute({ run: () => ({ done: true }) }) },
  edges: [],
});
`;

type UiRequest = Extract<PiRecord, { type: "extension_ui_request" }>;
type Notify = Extract<UiRequest, { method: "notify" }>;

interface Setup {
  server: TestServer;
  fixture: PiFixture;
  project: string;
  env: Record<string, string>;
}

async function setup(t: TestContext, rules: MockRule[]): Promise<Setup> {
  const fixture = await piFixture(t, { rules });
  const server = await TestServer.start();
  t.after(() => server.stop());
  const project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "fails.workflow.ts"), FAILS);
  writeFileSync(join(project, ".pi", "workflows", "flaky.workflow.ts"), FLAKY);
  writeFileSync(join(project, ".pi", "workflows", "gated.workflow.ts"), GATED);
  const env: Record<string, string> = { PI_WORKFLOWS_BIN: serverBinary() };
  for (const [key, value] of Object.entries(server.env)) if (key.startsWith("PI_WORKFLOWS_")) env[key] = value;
  return { server, fixture, project, env };
}

async function workflow(pi: PiRpc, args: string): Promise<Notify> {
  const since = pi.mark();
  assert.equal(await pi.prompt(`/workflow ${args}`), "handled");
  return (await pi.waitFor((record) => record.type === "extension_ui_request" && record.method === "notify", {
    since,
    what: `the notification of /workflow ${args}`,
    timeoutMs: 30_000,
  })) as Notify;
}

/** The terminal run a terminal message's facts name (the top-level runId, before `schema`; earlier outcomes name theirs first). */
function terminalRunId(request: MockRequest): string {
  const match = /"runId":"([^"]+)","schema":"pi-workflows\.terminal-facts\.v1"/.exec(request.last?.text ?? "");
  assert.ok(match, `no runId in the terminal message: ${request.last?.text.slice(0, 400)}`);
  return match[1] as string;
}

/** The custom messages of `customType` the extension put into Pi's session. */
async function customEntries(pi: PiRpc, customType: string): Promise<{ content?: unknown; details?: Record<string, unknown> }[]> {
  const { entries } = await pi.getEntries();
  return (entries as unknown as { type: string; customType?: string; content?: unknown; details?: Record<string, unknown> }[]).filter(
    (entry) => entry.type === "custom_message" && entry.customType === customType,
  );
}

/** The tool results the model received (the last message of a request is the tool's result). */
const toolResults = (requests: readonly MockRequest[]): string[] => requests.filter((request) => request.last?.role === "tool").map((request) => request.last?.text ?? "");

async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** The model restarts every failed run it is told about, once per terminal turn. */
const restartRules: MockRule[] = [
  { name: "restart", lastRole: "user", when: TERMINAL_FACTS, reply: (request) => reply.toolCall("workflow", { action: "restart", runId: terminalRunId(request) }) },
  // The tool's result arrives while the decision turn is still open; the
  // reply is slow so the test can look at the reserved run meanwhile.
  { name: "restarted", lastRole: "tool", when: /restarted as run/, reply: reply.text("Restart queued; it runs after this turn.", { delayMs: 150, chunkChars: 8 }) },
  { name: "refused", lastRole: "tool", when: /cannot be restarted/, reply: reply.text("The restart was refused; stopping here.") },
];

describe("after a run ends in a real Pi conversation", () => {
  it("a failed run: the model restarts it once through the tool, the restart runs only after the turn settles, and the same failure again cannot restart", async (t) => {
    const s = await setup(t, restartRules);
    const pi = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const client = await s.server.connect();
    t.after(() => client.close());
    const started = await workflow(pi, "fails");
    assert.equal(started.notifyType, "info", started.message);
    const first = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;

    // The decision turn of the failed run calls restart; while that turn is
    // still open (its reply streams), the new run is saved but held.
    const restartedResult = await s.fixture.mock.waitForRequest((request) => request.last?.role === "tool" && /restarted as run/.test(request.last.text), 60_000, "the restart's tool result");
    const second = /restarted as run ([^;\s]+);/.exec(restartedResult.last?.text ?? "")?.[1] as string;
    assert.ok(second !== undefined && second !== first, restartedResult.last?.text);
    assert.match(restartedResult.last?.text ?? "", /it starts after this turn ends\. This was this turn's one workflow launch: end your turn now\.$/);
    const held = await client.view(second);
    assert.equal(held.display.status, "queued", JSON.stringify(held.display));
    assert.ok(held.display.controls.includes("activate"), "held until the turn settles");
    const lastAgentEvent = pi.records.filter((record) => record.type === "agent_start" || record.type === "agent_settled").at(-1);
    assert.equal(lastAgentEvent?.type, "agent_start", "the decision turn is still open");

    // After the turn settles the extension activates it; it fails the same way.
    const ended = await client.waitFor(second, (view) => view.display.status === "failed", 60_000, "the restart fails");
    assert.equal(ended.display.status, "failed");
    const original = await client.view(first);
    assert.equal(original.display.status, "failed", "the old run never changes");

    // Its decision turn tries to restart it too: the same failure twice is refused with its rule.
    await until("the refused restart's tool result", () => toolResults(s.fixture.mock.requests).some((text) => /cannot be restarted/.test(text)));
    const refused = toolResults(s.fixture.mock.requests).find((text) => /cannot be restarted/.test(text)) as string;
    assert.match(refused, new RegExp(`^Workflow run ${second} cannot be restarted: the run's restart chain already restarted after this same failure`));
    await terminalTurnSettled(pi, s.fixture.mock, second);
    assert.equal(terminalTurns(s.fixture.mock.requests).length, 2, "one decision turn per failed run");
    assert.equal(toolResults(s.fixture.mock.requests).filter((text) => /restarted as run/.test(text)).length, 1, "exactly one restart");
  });

  it("Pi killed inside the decision turn after the restart was reserved: the reopened Pi activates the surviving reservation once", async (t) => {
    const s = await setup(t, [
      { name: "restart", lastRole: "user", when: TERMINAL_FACTS, reply: (request) => reply.toolCall("workflow", { action: "restart", runId: terminalRunId(request) }) },
      // The first answer to the restart's result streams for a long time: Pi is killed inside it.
      { name: "restarted-slow", lastRole: "tool", when: /restarted as run/, times: 1, reply: reply.text("Restart queued; it runs after this turn ends.", { delayMs: 1000, chunkChars: 2 }) },
      { name: "refused", lastRole: "tool", when: /cannot be restarted/, reply: reply.text("The restart was refused; stopping here.") },
    ]);
    const first = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const client = await s.server.connect();
    t.after(() => client.close());
    const started = await workflow(first, "fails");
    const original = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    const result = await s.fixture.mock.waitForRequest((request) => request.last?.role === "tool" && /restarted as run/.test(request.last.text), 60_000, "the restart's tool result");
    const restarted = /restarted as run ([^;\s]+);/.exec(result.last?.text ?? "")?.[1] as string;
    const sessionFile = first.state?.sessionFile;
    assert.ok(sessionFile);
    process.kill(-first.pid, "SIGKILL");
    await first.exited;
    assert.equal((await client.view(restarted)).display.status, "queued", "held: the decision turn never settled");
    await new Promise((resolve) => setTimeout(resolve, 1000));
    assert.equal((await client.view(restarted)).display.status, "queued", "no Pi, no activation");

    const second = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env, args: ["--session", sessionFile] });
    const ended = await client.waitFor(restarted, (view) => view.display.status === "failed", 60_000, "the surviving reservation runs once the session is open and idle");
    assert.equal(ended.display.status, "failed");
    await terminalTurnSettled(second, s.fixture.mock, restarted);
    assert.equal(toolResults(s.fixture.mock.requests).filter((text) => /restarted as run/.test(text)).length, 1, "one restart, reserved once");
    assert.equal((await client.view(original)).display.status, "failed");
    // The restarted run's own decision turn meets the restart rule (same failure).
    await until("the refusal", () => toolResults(s.fixture.mock.requests).some((text) => new RegExp(`^Workflow run ${restarted} cannot be restarted`).test(text)));
  });

  it("each new failure may restart, but a fourth restart of the chain is refused", async (t) => {
    const s = await setup(t, restartRules);
    const pi = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const counter = join(s.project, "flaky-counter");
    const started = await workflow(pi, `flaky --input-json ${JSON.stringify({ counter })}`);
    assert.equal(started.notifyType, "info", started.message);
    await until("the fourth restart's refusal", () => toolResults(s.fixture.mock.requests).some((text) => /cannot be restarted/.test(text)), 120_000);
    const results = toolResults(s.fixture.mock.requests);
    assert.equal(results.filter((text) => /restarted as run/.test(text)).length, 3, results.join("\n"));
    const refused = results.find((text) => /cannot be restarted/.test(text)) as string;
    assert.match(refused, /already has three restarts after its original run/);
    assert.equal(terminalTurns(s.fixture.mock.requests).length, 4, "the original run and its three restarts each had one decision turn");
  });

  it("two follow-ups run in order after the terminal turn, each in its own turn", async (t) => {
    const s = await setup(t, [
      terminalRule,
      { name: "first", lastRole: "user", when: "FOLLOW-UP-ONE", reply: reply.text("First follow-up done.") },
      { name: "second", lastRole: "user", when: "FOLLOW-UP-TWO", reply: reply.text("Second follow-up done.") },
    ]);
    const pi = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const gate = join(s.project, "gate-open");
    const started = await workflow(pi, `gated --input-json ${JSON.stringify({ gate })}`);
    assert.equal(started.notifyType, "info", started.message);
    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    const one = await workflow(pi, "then FOLLOW-UP-ONE: write the release notes");
    assert.equal(one.notifyType, "info", one.message);
    assert.match(one.message, new RegExp(`^Follow-up \\S+ queued: it runs in this session after workflow run ${runId} completes`));
    const two = await workflow(pi, "then FOLLOW-UP-TWO: tell the team");
    assert.equal(two.notifyType, "info", two.message);
    writeFileSync(gate, "open");

    await until("the second follow-up's turn", () => s.fixture.mock.requests.some((request) => request.last?.role === "user" && request.last.text.includes("FOLLOW-UP-TWO") && request.outcome === "completed"));
    const order = s.fixture.mock.requests
      .filter((request) => request.last?.role === "user")
      .map((request) => (request.last?.text.includes(TERMINAL_FACTS) ? "terminal" : request.last?.text.includes("FOLLOW-UP-ONE") ? "one" : request.last?.text.includes("FOLLOW-UP-TWO") ? "two" : "other"))
      .filter((kind) => kind !== "other");
    assert.deepEqual(order, ["terminal", "one", "two"], "the terminal turn, then each follow-up once, in order");
    // Each follow-up opened its turn only after the previous turn ended: the
    // second follow-up's request already carries both earlier answers.
    const last = s.fixture.mock.requests.find((request) => request.last?.role === "user" && request.last.text.includes("FOLLOW-UP-TWO"));
    const answers = last?.messages.filter((message) => message.role === "assistant").map((message) => message.text) ?? [];
    assert.deepEqual(answers.slice(-2), [TERMINAL_REPLY, "First follow-up done."]);
    assert.equal(s.fixture.mock.requests.filter((request) => request.last?.text.includes("FOLLOW-UP-ONE")).length, 1, "the first follow-up ran once");
  });

  it("a failing run cancels its follow-ups: only its terminal turn follows", async (t) => {
    const s = await setup(t, [terminalRule, { name: "follow-up", lastRole: "user", when: "FOLLOW-UP-NEVER", reply: reply.text("This must not run.") }]);
    const pi = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const gate = join(s.project, "gate-open");
    const started = await workflow(pi, `gated --input-json ${JSON.stringify({ gate, fail: true })}`);
    assert.equal(started.notifyType, "info", started.message);
    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    const queued = await workflow(pi, "then FOLLOW-UP-NEVER: deploy it");
    assert.equal(queued.notifyType, "info", queued.message);
    const followUpId = /^Follow-up (\S+) queued/.exec(queued.message)?.[1] as string;
    writeFileSync(gate, "open");
    await terminalTurnSettled(pi, s.fixture.mock, runId);
    // Give a wrongly delivered follow-up every chance to show up.
    await new Promise((resolve) => setTimeout(resolve, 3000));
    assert.equal(s.fixture.mock.requests.filter((request) => request.last?.text.includes("FOLLOW-UP-NEVER")).length, 0, "the follow-up never ran");
    assert.equal(terminalTurns(s.fixture.mock.requests).length, 1);
    assert.ok(followUpId !== undefined, queued.message);
  });
  it("a cancelled run has a stopping default: the model cancels it through the workflow tool, its one card is agentCancelled and stops by default, the model stops, and nothing restarts", async (t) => {
    const s = await setup(t, [
      { name: "cancel", lastRole: "user", when: "CANCEL-THE-WORKFLOW", reply: reply.toolCall("workflow", { action: "cancel" }) },
      { name: "cancelled", lastRole: "tool", when: /^Workflow gated cancelled \(run /, reply: reply.text("I cancelled the workflow.") },
      terminalRule,
    ]);
    const pi = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const client = await s.server.connect();
    t.after(() => client.close());
    const started = await workflow(pi, `gated --input-json ${JSON.stringify({ gate: join(s.project, "never-opened") })}`);
    assert.equal(started.notifyType, "info", started.message);
    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    await client.waitFor(runId, (view) => view.display.status === "running", 30_000, "the run to run");
    const since = pi.mark();
    assert.equal(await pi.prompt("CANCEL-THE-WORKFLOW: it is no longer needed"), "started");
    await client.waitFor(runId, (view) => view.display.status === "cancelled", 30_000, "the model's cancel");

    const request = await terminalTurnSettled(pi, s.fixture.mock, runId, since);
    assert.ok(request.last?.text.includes("The workflow was cancelled. Do not restart it or continue its work on your own"), request.last?.text);
    assert.equal(request.outcome, "completed");
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    const cards = await customEntries(pi, TERMINAL_TYPE);
    assert.equal(cards.length, 1, JSON.stringify(cards));
    assert.deepEqual([cards[0]?.details?.runId, cards[0]?.details?.cause, cards[0]?.details?.stopsByDefault], [runId, "agentCancelled", true]);
    assert.equal(terminalTurns(s.fixture.mock.requests, runId).length, 1, "one decision turn");
    assert.equal(toolResults(s.fixture.mock.requests).length, 1, "the model called no tool in its decision turn");
    const runs = await client.request("runs.list", { limit: 10 });
    assert.equal((runs.receipt as { rows: unknown[] }).rows.length, 1, "nothing restarted");
  });

  it("a launch failure gets its fallback: the decision turn's selected start cannot load when it activates, and the model sees the factual launchFailed message exactly once", async (t) => {
    let marker = "";
    const s = await setup(t, [
      // The failed run's decision turn starts another workflow (its one selected launch).
      { name: "start", lastRole: "user", when: TERMINAL_FACTS, times: 1, reply: reply.toolCall("workflow", { action: "start", workflow: "brittle", input: {} }) },
      // The start resolved; before the turn settles and the launch activates, the workflow breaks.
      {
        name: "queued",
        lastRole: "tool",
        when: /^Workflow brittle queued \(run /,
        reply: () => {
          writeFileSync(marker, "broken");
          return reply.text("Started brittle; it runs after this turn.");
        },
      },
      terminalRule,
    ]);
    marker = join(s.project, "brittle-broken");
    writeFileSync(join(s.project, ".pi", "workflows", "brittle.workflow.ts"), brittle(marker));
    const pi = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const client = await s.server.connect();
    t.after(() => client.close());
    const started = await workflow(pi, "fails");
    assert.equal(started.notifyType, "info", started.message);
    const first = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    const queued = await s.fixture.mock.waitForRequest((request) => request.last?.role === "tool" && /^Workflow brittle queued/.test(request.last.text), 60_000, "the start's tool result");
    const launched = /\(run ([^)\s]+)\)/.exec(queued.last?.text ?? "")?.[1] as string;
    assert.ok(launched !== undefined && launched !== first, queued.last?.text);
    assert.ok(existsSync(marker));

    const ended = await client.waitFor(launched, (view) => view.display.status === "failed", 60_000, "the activation to fail");
    assert.equal(ended.display.status, "failed");
    const request = await terminalTurnSettled(pi, s.fixture.mock, launched);
    assert.match(request.last?.text ?? "", /^Workflow brittle ended: failed \(run /);
    assert.ok(request.last?.text.includes("the brittle workflow cannot load now"), request.last?.text);
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    const cards = (await customEntries(pi, TERMINAL_TYPE)).filter((card) => card.details?.runId === launched);
    assert.equal(cards.length, 1, JSON.stringify(cards));
    assert.equal(cards[0]?.details?.cause, "launchFailed");
    assert.equal(cards[0]?.details?.stopsByDefault, false);
    assert.deepEqual(cards[0]?.details?.presentation, { workflowName: "brittle", state: "failed", reasonKind: "runnerFailed", restart: { count: 0, limit: 3 } });
    assert.equal(terminalTurns(s.fixture.mock.requests, launched).length, 1, "the model saw the fallback exactly once");
    assert.equal(terminalTurns(s.fixture.mock.requests, first).length, 1);
  });
});
