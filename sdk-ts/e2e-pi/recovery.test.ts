/**
 * Workflow messages across the failures of a real Pi conversation (issue 14
 * item 8): real Pi 1.6.0 in rpc mode with this package's extension, the real
 * server binary, the node runner, the validation child and the mock model.
 *
 * - The server SIGKILLed mid-step and started again: the step message is
 *   not sent again and the run completes; the same for a graceful
 *   `server stop`, after which the open turn is still open.
 * - A notify node's notification reaches the session without a model turn.
 * - Two Pi processes on one session: the newer connection takes the
 *   coordinator epoch, and the fenced one never sends a workflow message or
 *   starts a turn afterwards.
 * - Pi restarted mid-step (killed inside the step's turn): the step
 *   message appears once and the run continues in the new process.
 *
 * A step turn is held open by a bash tool call that waits for a gate file
 * the test creates, so each failure lands inside the exact turn.
 * Run with `npm run test:pi` (after `scripts/install-pi.sh` and
 * `cargo build -p server`).
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type TestContext, describe, it } from "node:test";

import { type MockRequest, type MockRule, reply, submitStep } from "../test-support/mock-model.js";
import { MOCK_MODEL_ID, MOCK_PROVIDER, type PiFixture, type PiRecord, type PiRpc, piFixture, processAlive } from "../test-support/pi.js";
import { SDK_DIR, TestServer, serverBinary } from "../test-support/server.js";
import { TERMINAL_TYPE, terminalRule, terminalTurnSettled, terminalTurns } from "../test-support/terminal.js";

const REVIEW = `import { agent, compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "review",
  startAt: "review",
  model: { provider: "${MOCK_PROVIDER}", model: "${MOCK_MODEL_ID}" },
  nodes: {
    review: agent({
      prompt: ({ input }) => "Review the change: " + String((input as { task?: string } | null)?.task ?? ""),
      expectedOutput: '{ "verdict": "approve" | "reject", "reason": string }',
      validate: (output) => output,
    }),
    ship: compute({ run: ({ outputs }) => ({ shipped: true, review: outputs.review }) }),
  },
  edges: [{ from: "review", to: "ship" }],
});
`;

const NOTICE = "The release notes are ready for review.";
const ANNOUNCE = `import { compute, defineWorkflow, notify } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "announce",
  startAt: "announce",
  nodes: {
    announce: notify({ message: ${JSON.stringify(NOTICE)} }),
    done: compute({ run: () => ({ announced: true }) }),
  },
  edges: [{ from: "announce", to: "done" }],
});
`;

/** REVIEW with a 6 s node timeout, and a route for its timeout. */
const QUICK_TIMEOUT_MS = 6_000;
const QUICK = `import { agent, compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "quick",
  startAt: "review",
  model: { provider: "${MOCK_PROVIDER}", model: "${MOCK_MODEL_ID}" },
  nodes: {
    review: agent({
      prompt: () => "Review the change quickly.",
      expectedOutput: '{ "verdict": "approve" | "reject", "reason": string }',
      timeoutMs: ${QUICK_TIMEOUT_MS},
      validate: (output) => output,
    }),
    late: compute({ run: () => ({ late: true }) }),
  },
  edges: [{ from: "review", switch: { on: "$result.outcome", cases: { timed_out: "late" } } }],
});
`;
const QUICK_CONTRACT = "Workflow step contract (workflow: quick, step: review";

/** One compute node that works until the gate file exists (the runner's work, no Pi in it). */
const buildWorkflow = (gate: string): string => `import { existsSync } from "node:fs";
import { compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "build",
  startAt: "build",
  nodes: {
    build: compute({
      run: () => new Promise((resolve) => {
        const timer = setInterval(() => {
          if (existsSync(${JSON.stringify(gate)})) {
            clearInterval(timer);
            resolve({ built: true });
          }
        }, 20);
      }),
    }),
  },
});
`;

const STEP_CONTRACT = "Workflow step contract (workflow: review, step: review";
const APPROVED = { verdict: "approve", reason: "the tests pass" };
const RELEASED = "gate released";

type UiRequest = Extract<PiRecord, { type: "extension_ui_request" }>;
type Notify = Extract<UiRequest, { method: "notify" }>;

interface Setup {
  server: TestServer;
  fixture: PiFixture;
  project: string;
  env: Record<string, string>;
  gate: string;
}

/**
 * The step turn: a bash call that waits for the gate file, then (after its
 * result) the submission, then a closing text.
 */
function gatedRules(gate: string): MockRule[] {
  return [
    terminalRule,
    { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
    { name: "submit", lastRole: "tool", when: RELEASED, reply: submitStep(APPROVED) },
    { name: "wait", lastRole: "user", when: STEP_CONTRACT, reply: reply.toolCall("bash", { command: `while [ ! -e ${gate} ]; do sleep 0.1; done; echo ${RELEASED}` }) },
  ];
}

async function setup(t: TestContext, rules: (gate: string) => MockRule[] = gatedRules): Promise<Setup> {
  const fixture = await piFixture(t, { rules: [] });
  const gate = join(fixture.sandbox.root, "gate");
  fixture.mock.setRules(rules(gate));
  const server = await TestServer.start();
  t.after(() => server.stop());
  const project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "review.workflow.ts"), REVIEW);
  writeFileSync(join(project, ".pi", "workflows", "announce.workflow.ts"), ANNOUNCE);
  writeFileSync(join(project, ".pi", "workflows", "quick.workflow.ts"), QUICK);
  const env: Record<string, string> = { PI_WORKFLOWS_BIN: serverBinary() };
  for (const [key, value] of Object.entries(server.env)) if (key.startsWith("PI_WORKFLOWS_")) env[key] = value;
  return { server, fixture, project, env, gate };
}

function spawnWorkflowPi(s: Setup, args: string[] = []): Promise<PiRpc> {
  return s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env, args });
}

const isUi =
  <M extends UiRequest["method"]>(method: M, test: (request: Extract<UiRequest, { method: M }>) => boolean) =>
  (record: PiRecord): boolean =>
    record.type === "extension_ui_request" && record.method === method && test(record as Extract<UiRequest, { method: M }>);

async function workflow(pi: PiRpc, args: string): Promise<Notify> {
  const since = pi.mark();
  assert.equal(await pi.prompt(`/workflow ${args}`), "handled");
  return (await pi.waitFor(isUi("notify", () => true), { since, what: `the notification of /workflow ${args}`, timeoutMs: 30_000 })) as Notify;
}

async function widget(pi: PiRpc, pattern: RegExp, since = 0, timeoutMs = 60_000): Promise<void> {
  await pi.waitFor(isUi("setWidget", (r) => (r.widgetLines ?? []).some((line) => pattern.test(line))), { since, what: `a widget line matching ${pattern}`, timeoutMs });
}

const runIdOf = (notify: Notify): string => {
  const runId = /\(run ([^)\s]+)\)/.exec(notify.message)?.[1];
  assert.ok(runId, notify.message);
  return runId;
};

/** The custom messages of `customType` in Pi's session (its active branch as `get_entries` lists it). */
async function customEntries(pi: PiRpc, customType: string): Promise<{ id: string; content?: unknown; details?: { runId?: string; stepReason?: string } }[]> {
  const { entries } = await pi.getEntries();
  return (entries as unknown as { id: string; type: string; customType?: string; content?: unknown; details?: { runId?: string; stepReason?: string } }[]).filter(
    (entry) => entry.type === "custom_message" && entry.customType === customType,
  );
}

const STEP_TYPE = "pi-workflows-agent-step";

/** Records after `since` that show Pi sending a workflow message (any pi-workflows custom message) or starting a model run. */
const sendsOrTurns = (pi: PiRpc, since: number): PiRecord[] =>
  pi.records.slice(since).filter((record) => record.type === "agent_start" || (record.type !== "extension_ui_request" && JSON.stringify(record).includes('"customType":"pi-workflows-')));

/** Model requests that a step message opened (the last user message carries the step contract). */
const stepTurns = (requests: readonly MockRequest[]): MockRequest[] =>
  requests.filter((request) => request.last?.role === "user" && request.last.text.includes(STEP_CONTRACT));

async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Rows of a read-only query of the server's state file: only to explain a failure (the extension never opens it). */
function diagnose(server: TestServer, query: string): string[][] {
  const out = execFileSync("sqlite3", ["-readonly", "-separator", "\t", join(server.home, "state.sqlite"), query], { encoding: "utf8" });
  return out.split("\n").filter((line) => line !== "").map((line) => line.split("\t"));
}

/** The pid of the server process serving `server`'s state directory (from /proc). */
function serverPid(server: TestServer): number {
  const pid = serverPidOrUndefined(server);
  if (pid === undefined) throw new Error(`no server process for ${server.home}`);
  return pid;
}

function serverPidOrUndefined(server: TestServer): number | undefined {
  const binary = serverBinary();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
      if (argv[0] !== binary || argv[1] !== "server") continue;
      const environ = readFileSync(`/proc/${entry}/environ`, "utf8").split("\0");
      if (environ.includes(`PI_WORKFLOWS_HOME=${server.home}`)) return Number(entry);
    } catch {
      // The process ended while it was read: not the server.
    }
  }
  return undefined;
}

/**
 * SIGKILLs Pi inside the step's exact turn, once the server recorded that turn; its session file. The
 * step entry and the turn's assistant message are in the file then (Pi writes a new session's file only
 * once it holds a user or assistant message, so a kill before the first assistant message leaves no file
 * and the next process opens another session, whose run this is not).
 */
async function killInsideTheStepTurn(client: Awaited<ReturnType<TestServer["connect"]>>, pi: PiRpc, runId: string): Promise<string> {
  await client.waitFor(runId, (view) => view.display.activity === "modelTurn", 30_000, "the step's model turn");
  // Pi writes its session file at the turn's first assistant message: the
  // turn report can reach the view before that, so wait for the turn's tool
  // call (its assistant message ended) or a new Pi would not find the session.
  await pi.waitFor((record) => record.type === "tool_execution_start", { what: "the step turn's tool call", timeoutMs: 30_000 });
  const sessionFile = pi.state?.sessionFile;
  assert.ok(sessionFile);
  process.kill(-pi.pid, "SIGKILL");
  await pi.exited;
  return sessionFile;
}

/**
 * Once the server `pid` is gone: a new one (the extension's client starts one on demand when its next request
 * finds none; else the test starts it), and a test client connected to it.
 */
async function newServerAfter(t: TestContext, s: Setup, pid: number): Promise<Awaited<ReturnType<TestServer["connect"]>>> {
  await until("the server to be gone", () => !processAlive(pid), 10_000);
  await until("the extension to start a server", () => serverPidOrUndefined(s.server) !== undefined, 5_000).catch(async () => {
    assert.match(await s.server.cli(["server", "start"]), /pi-workflows server started/);
  });
  assert.notEqual(serverPid(s.server), pid, "a new server");
  let client: Awaited<ReturnType<TestServer["connect"]>> | undefined;
  await until("the new server to answer", async () => {
    client = await s.server.connect().catch(() => undefined);
    return client !== undefined;
  });
  assert.ok(client);
  t.after(() => client?.close());
  return client;
}

/** Starts `/workflow review` and waits until the step turn is inside its gated bash call. */
async function startGatedStep(s: Setup, pi: PiRpc): Promise<string> {
  const started = await workflow(pi, "review fix the bug");
  assert.equal(started.notifyType, "info", started.message);
  await s.fixture.mock.waitForRequest((request) => request.rule === "wait", 60_000, "the step turn's model request");
  await pi.waitFor((record) => record.type === "tool_execution_start", { what: "the gated bash call", timeoutMs: 30_000 });
  return runIdOf(started);
}

describe("workflow messages across failures in real Pi", () => {
  it("the server SIGKILLed mid-step and started again: no duplicate step message, and the run completes", async (t) => {
    const s = await setup(t);
    const pi = await spawnWorkflowPi(s);
    const runId = await startGatedStep(s, pi);
    const pid = serverPid(s.server);
    process.kill(pid, "SIGKILL");
    const client = await newServerAfter(t, s, pid);
    writeFileSync(s.gate, "");
    const done = await client.waitFor(runId, (view) => view.display.status === "completed" || view.display.status === "failed", 90_000, "the run to finish");
    assert.equal(done.display.status, "completed", `${JSON.stringify(done.display)}\n${s.server.serverLog()}`);
    await terminalTurnSettled(pi, s.fixture.mock, runId);
    assert.equal((await customEntries(pi, STEP_TYPE)).length, 1, "one step message across the crash");
    assert.equal(stepTurns(s.fixture.mock.requests).length, 1, "one model turn opened by the step");
    assert.equal(pi.records.filter((record) => record.type === "agent_start").length, 2, "the step's turn and the terminal message's");
  });

  it("a graceful server stop mid-step and a new server: the open step turn is not closed as lost, no duplicate step message, and the run completes", async (t) => {
    const s = await setup(t);
    const pi = await spawnWorkflowPi(s);
    const runId = await startGatedStep(s, pi);
    const pid = serverPid(s.server);
    await s.server.cli(["server", "stop"]).catch((error: unknown) => {
      throw new Error(`${String(error)}\n${s.server.serverLog()}`);
    });
    const client = await newServerAfter(t, s, pid);
    // The turn is still open on the new server (a turn closed as lost would have made a reminder at once).
    const open = await client.view(runId);
    assert.equal(open.display.activity, "modelTurn", JSON.stringify(open.display));
    writeFileSync(s.gate, "");
    const done = await client.waitFor(runId, (view) => view.display.status === "completed" || view.display.status === "failed", 90_000, "the run to finish");
    assert.equal(done.display.status, "completed", `${JSON.stringify(done.display)}\n${s.server.serverLog()}`);
    await terminalTurnSettled(pi, s.fixture.mock, runId);
    assert.deepEqual(
      (await customEntries(pi, STEP_TYPE)).map((entry) => entry.details?.stepReason),
      ["initial"],
      "one step message across the stop: no reminder for a lost turn",
    );
    assert.equal(stepTurns(s.fixture.mock.requests).length, 1, "one model turn opened by the step");
    assert.equal(pi.records.filter((record) => record.type === "agent_start").length, 2, "the step's turn and the terminal message's");
  });

  it("a notify node's notification reaches the session without a model turn", async (t) => {
    const s = await setup(t, () => [terminalRule, { name: "any", reply: reply.text("mock model: unexpected turn") }]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "announce");
    assert.equal(started.notifyType, "info", started.message);
    const runId = runIdOf(started);
    await widget(pi, /^✓ workflow announce \[completed\]$/, since);
    await until("the notification in the session", async () => (await customEntries(pi, "pi-workflows-notification")).length > 0);
    const notes = await customEntries(pi, "pi-workflows-notification");
    assert.equal(notes.length, 1, JSON.stringify(notes));
    assert.ok(JSON.stringify(notes[0]?.content).includes(NOTICE), JSON.stringify(notes[0]));
    assert.equal(notes[0]?.details?.runId, runId, JSON.stringify(notes[0]));
    // The run's terminal message opens the one model turn; give another turn the time to start, if the notification opened one.
    await terminalTurnSettled(pi, s.fixture.mock, runId, since);
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    assert.deepEqual(
      s.fixture.mock.requests.map((request) => request.rule),
      ["terminal"],
      "the only model request is the terminal message's: none was opened by the notification",
    );
    assert.equal(terminalTurns(s.fixture.mock.requests, runId).length, 1);
    assert.equal(pi.records.slice(since).filter((record) => record.type === "agent_start").length, 1, "one model turn: the terminal message's");
    assert.ok(!existsSync(s.gate));
  });
});

describe("workflow messages across two Pi processes in real Pi", () => {
  it("two Pi processes on one session: the second takes the coordinator epoch and only it sends; the fenced one sends no message and starts no turn", async (t) => {
    const s = await setup(t);
    const first = await spawnWorkflowPi(s);
    const runId = await startGatedStep(s, first);
    // Escape in the first process (inside the gated bash call) pauses the run through its turn report.
    await first.abort();
    // The resumed step's turn submits at once.
    s.fixture.mock.setRules([
      terminalRule,
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: STEP_CONTRACT, reply: submitStep(APPROVED) },
    ]);
    const client = await s.server.connect();
    t.after(() => client.close());
    await client.waitFor(runId, (view) => view.display.status === "paused", 30_000, "paused");
    await first.waitFor((record) => record.type === "agent_settled", { what: "the aborted turn to settle", timeoutMs: 30_000 });
    assert.equal((await customEntries(first, STEP_TYPE)).length, 1);

    // A second Pi opens the same session file: its connection takes the epoch.
    const sessionFile = first.state?.sessionFile;
    assert.ok(sessionFile, "the first Pi has a session file");
    const fenced = first.mark();
    const second = await spawnWorkflowPi(s, ["--session", sessionFile]);
    assert.equal(second.state?.sessionId, first.state?.sessionId, "one session");
    await widget(second, /^⏸ workflow review \[paused\]$/);
    // Let the first process's once-per-second recovery run a few times.
    await new Promise((resolve) => setTimeout(resolve, 3_000));

    const resumed = second.mark();
    await s.server.cli(["resume", runId]);
    await widget(second, /^✓ workflow review \[completed\]$/, resumed);
    await terminalTurnSettled(second, s.fixture.mock, runId, resumed);
    assert.equal((await client.view(runId)).display.status, "completed");
    // The second process sent the resumed step and ran its turn, then the terminal message's ...
    assert.equal(second.records.slice(resumed).filter((record) => record.type === "agent_start").length, 2);
    assert.equal((await customEntries(second, STEP_TYPE)).length, 2, "the first process's step (from the file) and the resumed one");
    // ... and the fenced process sent nothing and started no turn.
    assert.deepEqual(sendsOrTurns(first, fenced), []);
    assert.equal((await customEntries(first, STEP_TYPE)).length, 1);
  });

  it("Pi restarted mid-step: the step message appears once and the run continues in the new process", async (t) => {
    const s = await setup(t);
    const first = await spawnWorkflowPi(s);
    const runId = await startGatedStep(s, first);
    const client = await s.server.connect();
    t.after(() => client.close());
    const sessionFile = await killInsideTheStepTurn(client, first, runId);
    assert.ok(existsSync(sessionFile), "the killed Pi's session file holds its step turn");

    writeFileSync(s.gate, "");
    const second = await spawnWorkflowPi(s, ["--session", sessionFile]);
    assert.equal(second.state?.sessionId, first.state?.sessionId, "one session");
    const done = await client.waitFor(runId, (view) => view.display.status === "completed" || view.display.status === "failed", 90_000, "the run to finish").catch(async (error: unknown) => {
      const records = second.records.filter((r) => r.type !== "extension_ui_request").map((r) => r.type);
      throw new Error(
        `${String(error)}\nthe second Pi's records (no UI): ${records.join(",")}\nits step messages: ${(await customEntries(second, STEP_TYPE)).map((e) => e.details?.stepReason).join(",")}\n` +
          `the server's messages (diagnosis only): ${JSON.stringify(diagnose(s.server, "SELECT kind, step_reason, state FROM workflow_messages"))}\n` +
          `its turns: ${JSON.stringify(diagnose(s.server, "SELECT state, ended_at_ms IS NOT NULL FROM workflow_turns"))}`,
      );
    });
    assert.equal(done.display.status, "completed", JSON.stringify(done.display));
    // The step message is in the session once (the new process adopted it from the file and did not send it
    // again); the lost turn of the killed process is followed by the one reminder the unproductive-turn rule makes.
    const steps = await customEntries(second, STEP_TYPE);
    assert.deepEqual(
      steps.map((entry) => entry.details?.stepReason),
      ["initial", "reminder"],
      JSON.stringify(steps.map((entry) => entry.details)),
    );
    assert.equal(new Set(steps.map((entry) => JSON.stringify(entry.details))).size, steps.length, "no message twice");
  });
});

/**
 * A `build` run started from a first Pi process (after one exchange, so Pi
 * wrote its session file), then that Pi SIGKILLed while the run's node
 * computes (held by the gate).
 */
async function buildComputingWithPiKilled(t: TestContext) {
  const s = await setup(t, () => [terminalRule, { name: "hello", lastRole: "user", when: "hello", reply: reply.text("Hello.") }]);
  writeFileSync(join(s.project, ".pi", "workflows", "build.workflow.ts"), buildWorkflow(s.gate));
  const first = await spawnWorkflowPi(s);
  assert.equal(await first.prompt("hello"), "started");
  await first.waitFor((record) => record.type === "agent_settled", { what: "the first exchange", timeoutMs: 30_000 });
  const started = await workflow(first, "build");
  assert.equal(started.notifyType, "info", started.message);
  const runId = runIdOf(started);
  const client = await s.server.connect();
  t.after(() => client.close());
  await client.waitFor(runId, (view) => view.display.status === "running" && view.display.currentNode === "build", 30_000, "the build node computing");
  const sessionFile = first.state?.sessionFile;
  assert.ok(sessionFile && existsSync(sessionFile), "the first Pi has a session file");
  process.kill(-first.pid, "SIGKILL");
  await first.exited;
  return { s, first, runId, client, sessionFile };
}

describe("Pi restarted while a run's work computes", () => {
  it("Pi SIGKILLed while the run's node computes and opened again: the runner goes on without it, and the run's end reaches the new Pi process once", async (t) => {
    const { s, first, runId, client, sessionFile } = await buildComputingWithPiKilled(t);

    const second = await spawnWorkflowPi(s, ["--session", sessionFile]);
    assert.equal(second.state?.sessionId, first.state?.sessionId, "one session");
    const computing = await client.view(runId);
    assert.deepEqual(
      [computing.display.status, computing.steps.items.map((step) => `${step.nodeId}:${step.outcome ?? "unfinished"}`)],
      ["running", ["build:unfinished"]],
      "the node still computes while the new Pi is up",
    );
    writeFileSync(s.gate, "");
    const done = await client.waitFor(runId, (view) => ["completed", "failed", "timed_out", "cancelled"].includes(view.display.status), 60_000, "the run to end");
    assert.equal(done.display.status, "completed", JSON.stringify(done.display));
    await terminalTurnSettled(second, s.fixture.mock, runId);
    const terminal = await customEntries(second, TERMINAL_TYPE);
    assert.deepEqual(
      terminal.map((entry) => entry.details?.runId),
      [runId],
      "one terminal message, in the new process",
    );
    assert.equal(terminalTurns(s.fixture.mock.requests, runId).length, 1, "one model turn opened by it");
  });
});

describe("Pi restarted between a run's terminal commit and its terminal turn", () => {
  it("the run ends while Pi is closed: the Pi opened again gets exactly one deferred-turn card and one turn, and a third Pi process restores it without a turn", async (t) => {
    const { s, first, runId, client, sessionFile } = await buildComputingWithPiKilled(t);

    // The run ends and its terminal message (with its claimed intent) is committed while no Pi is open.
    writeFileSync(s.gate, "");
    const done = await client.waitFor(runId, (view) => ["completed", "failed", "timed_out", "cancelled"].includes(view.display.status), 60_000, "the run to end");
    assert.equal(done.display.status, "completed", JSON.stringify(done.display));
    const sessionId = first.state?.sessionId as string;
    const deadline = Date.now() + 30_000;
    for (;;) {
      const view = await client.request("sessionView.get", { sessionId });
      const messages = (view.receipt as { messages: { messageId: string; deferredTurn?: unknown }[] }).messages;
      if (messages.some((message) => message.messageId === `terminal:${runId}` && message.deferredTurn !== undefined)) break;
      assert.ok(Date.now() < deadline, `the terminal message with its intent: ${JSON.stringify(messages)}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.equal(terminalTurns(s.fixture.mock.requests, runId).length, 0, "no turn while Pi is closed");

    const second = await spawnWorkflowPi(s, ["--session", sessionFile]);
    await terminalTurnSettled(second, s.fixture.mock, runId);
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    const terminal = await customEntries(second, TERMINAL_TYPE);
    assert.deepEqual(terminal.map((entry) => entry.details?.runId), [runId], "one card, in the new process");
    assert.equal(terminalTurns(s.fixture.mock.requests, runId).length, 1, "exactly one turn");
    await second.stop();

    const third = await spawnWorkflowPi(s, ["--session", sessionFile]);
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    assert.deepEqual((await customEntries(third, TERMINAL_TYPE)).map((entry) => entry.details?.runId), [runId], "restored, not sent again");
    assert.equal(terminalTurns(s.fixture.mock.requests, runId).length, 1, "the restored card opens no turn");
    assert.equal(third.records.filter((record) => record.type === "agent_start").length, 0, "no agent run in the third process");
  });
});

describe("interactive deadlines in real Pi", () => {
  it("the deadline is not consumed while Pi is closed: the step waits far past its 6 s timeout, and times out only after reported turn time", async (t) => {
    const s = await setup(t, (gate) => [
      terminalRule,
      { name: "wait", lastRole: "user", when: QUICK_CONTRACT, reply: reply.toolCall("bash", { command: `while [ ! -e ${gate} ]; do sleep 0.1; done; echo ${RELEASED}` }) },
    ]);
    const first = await spawnWorkflowPi(s);
    const began = Date.now();
    const started = await workflow(first, "quick");
    assert.equal(started.notifyType, "info", started.message);
    const runId = runIdOf(started);
    const client = await s.server.connect();
    t.after(() => client.close());
    const sessionFile = await killInsideTheStepTurn(client, first, runId);
    // At most this much turn time can have run before the kill.
    const ranMs = Date.now() - began;
    assert.ok(ranMs < QUICK_TIMEOUT_MS, `the first turn ran ${ranMs} ms: too slow a box for this test`);

    // Pi stays closed for longer than the whole timeout: nothing is consumed.
    await new Promise((resolve) => setTimeout(resolve, QUICK_TIMEOUT_MS + 2_000));
    // (The killed Pi's turn stays open, so the view still shows it running:
    // only the next coordinator's branch report can prove it lost.)
    const closed = await client.view(runId);
    assert.ok(["waiting", "running"].includes(closed.display.status), `after Pi was closed past the timeout: ${JSON.stringify(closed.display)}`);
    const unfinished = closed.steps.items.map((step) => `${step.nodeId}:${step.outcome ?? "unfinished"}`);
    assert.deepEqual(unfinished, ["review:unfinished"], "the step has not timed out");

    // Pi opens the session again: the lost turn is followed by a reminder whose
    // turn (held in its gated bash call) runs the clock until the timeout.
    const reopened = Date.now();
    const second = await spawnWorkflowPi(s, ["--session", sessionFile]);
    assert.equal(second.state?.sessionId, first.state?.sessionId, "one session");
    const done = await client.waitFor(runId, (view) => ["completed", "failed", "timed_out", "cancelled"].includes(view.display.status), 60_000, "the run to end");
    const tookMs = Date.now() - reopened;
    assert.equal(done.display.status, "completed", `the timeout routed to late: ${JSON.stringify(done.display)}`);
    const outcomes = done.steps.items.map((step) => `${step.nodeId}:${step.outcome}`);
    assert.deepEqual(outcomes, ["review:timed_out", "late:ok"], JSON.stringify(outcomes));
    assert.ok(
      tookMs >= QUICK_TIMEOUT_MS - ranMs,
      `timed out ${tookMs} ms after Pi reopened, with at least ${QUICK_TIMEOUT_MS - ranMs} ms of turn time left`,
    );
  });
});
