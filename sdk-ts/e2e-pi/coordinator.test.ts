/**
 * Interactive workflows inside a real Pi conversation (issue 14, server
 * half): real Pi 1.6.0 in rpc mode with this package's extension, the real
 * server binary, the node runner, the validation child and the mock model.
 * The server grants the session's coordinator epoch, the extension delivers
 * the step message through `pi.sendMessage()`, reports the branch and the
 * exact model turn, and the model submits through the `workflow` tool.
 * Run with `npm run test:pi` (after `scripts/install-pi.sh` and
 * `cargo build -p server`).
 */
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type TestContext, describe, it } from "node:test";

import { type MockRequest, type MockRule, reply, submitStep } from "../test-support/mock-model.js";
import { MOCK_MODEL_ID, MOCK_PROVIDER, type PiFixture, type PiRecord, type PiRpc, piFixture } from "../test-support/pi.js";
import { SDK_DIR, TestServer, serverBinary } from "../test-support/server.js";
import { TERMINAL_TYPE, terminalRule, terminalTurnSettled, terminalTurns } from "../test-support/terminal.js";

/** One agent step whose `validate` accepts only approve or reject; the verdict routes the run. */
const REVIEW = `import { agent, compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "review",
  startAt: "review",
  model: { provider: "${MOCK_PROVIDER}", model: "${MOCK_MODEL_ID}" },
  nodes: {
    review: agent({
      prompt: ({ input }) => "Review the change: " + String((input as { task?: string } | null)?.task ?? ""),
      expectedOutput: '{ "verdict": "approve" | "reject", "reason": string }',
      validate: (output) => {
        const verdict = (output as { verdict?: unknown }).verdict;
        if (verdict !== "approve" && verdict !== "reject") throw new Error("verdict must be approve or reject, got " + JSON.stringify(verdict));
        return output;
      },
    }),
    ship: compute({ run: ({ outputs }) => ({ shipped: true, review: outputs.review }) }),
    rework: compute({ run: () => ({ shipped: false }) }),
  },
  edges: [{ from: "review", switch: { on: "$.verdict", cases: { approve: "ship", reject: "rework" } } }],
});
`;

/** A checkpoint, then a compute node: the answer's continuation runs `publish` and completes. */
const CHAIN = `import { checkpoint, compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "chain",
  startAt: "review",
  nodes: {
    review: checkpoint({ timeoutMs: () => 600_000, run: () => ({ summary: "publish?" }) }),
    publish: compute({ run: () => ({ published: true }) }),
  },
  edges: [{ from: "review", to: "publish" }],
});
`;

const STEP_CONTRACT = "Workflow step contract (workflow: review, step: review";
const APPROVED = { verdict: "approve", reason: "the tests pass" };

type UiRequest = Extract<PiRecord, { type: "extension_ui_request" }>;
type Notify = Extract<UiRequest, { method: "notify" }>;
type Widget = Extract<UiRequest, { method: "setWidget" }>;

interface Setup {
  server: TestServer;
  fixture: PiFixture;
  project: string;
  env: Record<string, string>;
}

/** The run ends: the terminal message's model turn is answered too (`terminalRule`). */
async function setup(t: TestContext, rules: MockRule[]): Promise<Setup> {
  const fixture = await piFixture(t, { rules: [terminalRule, ...rules] });
  const server = await TestServer.start();
  t.after(() => server.stop());
  const project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "review.workflow.ts"), REVIEW);
  writeFileSync(join(project, ".pi", "workflows", "chain.workflow.ts"), CHAIN);
  const env: Record<string, string> = { PI_WORKFLOWS_BIN: serverBinary() };
  for (const [key, value] of Object.entries(server.env)) if (key.startsWith("PI_WORKFLOWS_")) env[key] = value;
  return { server, fixture, project, env };
}

function spawnWorkflowPi(s: Setup): Promise<PiRpc> {
  return s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
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

async function widget(pi: PiRpc, pattern: RegExp, since = 0, timeoutMs = 60_000): Promise<Widget> {
  return (await pi.waitFor(isUi("setWidget", (r) => (r.widgetLines ?? []).some((line) => pattern.test(line))), {
    since,
    what: `a widget line matching ${pattern}`,
    timeoutMs,
  })) as Widget;
}

/** The custom messages of `customType` the extension put into Pi's session. */
async function customEntries(pi: PiRpc, customType: string): Promise<{ customType?: string; content?: unknown; display?: boolean; details?: { runId?: string } }[]> {
  const { entries } = await pi.getEntries();
  return (entries as unknown as { type: string; customType?: string; content?: unknown; display?: boolean; details?: { runId?: string } }[]).filter(
    (entry) => entry.type === "custom_message" && entry.customType === customType,
  );
}

/** The step messages the extension put into Pi's session (custom messages of the step type). */
const stepEntries = (pi: PiRpc): ReturnType<typeof customEntries> => customEntries(pi, "pi-workflows-agent-step");

/** Model requests that a step message opened (the last user message carries the step contract). */
const stepTurns = (requests: readonly MockRequest[]): MockRequest[] =>
  requests.filter((request) => request.last?.role === "user" && request.last.text.includes(STEP_CONTRACT));

async function until(what: string, check: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

const agentStarts = (pi: PiRpc, since = 0): number => pi.records.slice(since).filter((record) => record.type === "agent_start").length;

describe("interactive workflows in a real Pi conversation", () => {
  it("/workflow review runs to completion: one visible step message, one model turn for the step, the accepted submission routes the run", async (t) => {
    const s = await setup(t, [
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: STEP_CONTRACT, reply: submitStep(APPROVED) },
    ]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "review fix the bug");
    assert.equal(started.notifyType, "info", started.message);
    assert.match(started.message, /^Workflow review started \(run [^)]+\)\./);

    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    await widget(pi, /^✓ workflow review \[completed\]$/, since);
    await terminalTurnSettled(pi, s.fixture.mock, runId, since);

    const steps = await stepEntries(pi);
    assert.equal(steps.length, 1, `one step message in the session, got ${steps.length}`);
    assert.equal(stepTurns(s.fixture.mock.requests).length, 1, "one model turn opened by the step");
    assert.equal(terminalTurns(s.fixture.mock.requests).length, 1, "one model turn opened by the terminal message");
    assert.equal(agentStarts(pi, since), 2, "one Pi agent run for the step, one for the terminal message");
    const submits = s.fixture.mock.requests.filter((request) => request.last?.role === "tool");
    assert.equal(submits.length, 1);
    assert.match(submits[0]?.last?.text ?? "", /^Output accepted for step review\. .*End your turn now\.$/);

    const client = await s.server.connect();
    t.after(() => client.close());
    const view = await client.view(runId);
    assert.equal(view.display.status, "completed");
  });

  it("two reminders, then the attempt fails: three step turns end without a submission, and the run fails with its reason", async (t) => {
    // The model answers every step message (the initial one and each
    // reminder) with text and never calls the tool.
    const s = await setup(t, [{ name: "stall", lastRole: "user", when: STEP_CONTRACT, reply: reply.text("I will look at it later.") }]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "review fix the bug");
    assert.equal(started.notifyType, "info", started.message);
    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    const client = await s.server.connect();
    t.after(() => client.close());
    // The run waits in the session while its step is pending (display `waiting`).
    const ended = await client.waitFor(runId, (view) => !["queued", "running", "waiting"].includes(view.display.status), 120_000, "the run to end");
    assert.equal(ended.display.status, "failed", JSON.stringify(ended.display));
    await terminalTurnSettled(pi, s.fixture.mock, runId, since);

    const steps = await stepEntries(pi);
    assert.deepEqual(
      steps.map((entry) => (entry.details as { stepReason?: string } | undefined)?.stepReason),
      ["initial", "reminder", "reminder"],
      JSON.stringify(steps.map((entry) => entry.details)),
    );
    assert.equal(stepTurns(s.fixture.mock.requests).length, 3, "one model turn for the step message and one for each reminder");
    assert.equal(s.fixture.mock.requests.filter((request) => request.last?.role === "tool").length, 0, "the model never called the tool");
    const attempt = ended.steps.items.find((step) => step.nodeId === "review")?.attempts.at(-1);
    assert.equal(attempt?.outcome, "failed", JSON.stringify(attempt));
    await widget(pi, /^✗ workflow review \[failed\]$/, since);
  });

  it("a submission that validate rejects gets the stored error; the corrected one is accepted in the same turn and routes the run", async (t) => {
    const s = await setup(t, [
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "corrected", lastRole: "tool", when: "Output rejected for step review", reply: submitStep(APPROVED) },
      { name: "first", lastRole: "user", when: STEP_CONTRACT, reply: submitStep({ verdict: "maybe" }) },
    ]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "review fix the bug");
    assert.equal(started.notifyType, "info", started.message);
    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    await widget(pi, /^✓ workflow review \[completed\]$/, since);
    await terminalTurnSettled(pi, s.fixture.mock, runId, since);

    const results = s.fixture.mock.requests.filter((request) => request.last?.role === "tool").map((request) => request.last?.text ?? "");
    assert.equal(results.length, 2, results.join("\n"));
    assert.match(results[0] as string, /^Output rejected for step review: .*verdict must be approve or reject, got "maybe"/);
    assert.match(results[1] as string, /^Output accepted for step review\./);
    assert.equal((await stepEntries(pi)).length, 1, "the rejection sends no new step message");
    assert.equal(stepTurns(s.fixture.mock.requests).length, 1);
    assert.equal(agentStarts(pi, since), 2, "the step's turn and the terminal message's");
    const client = await s.server.connect();
    t.after(() => client.close());
    const view = await client.view(runId);
    assert.equal(view.display.status, "completed");
  });

  it("Escape during the step turn pauses the run through the turn report; /workflow resume sends one resumed step message and one fresh turn completes it", async (t) => {
    const slow = "Let me look at this change carefully before I decide anything at all. ".repeat(20);
    const s = await setup(t, [
      { name: "slow", lastRole: "user", when: STEP_CONTRACT, times: 1, reply: reply.text(slow, { chunkChars: 4, delayMs: 100 }) },
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: STEP_CONTRACT, reply: submitStep(APPROVED) },
    ]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "review fix the bug");
    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    await s.fixture.mock.waitForRequest((request) => request.last?.text.includes(STEP_CONTRACT) === true, 60_000, "the step turn's model request");
    await pi.abort();
    await widget(pi, /^⏸ workflow review \[paused\]$/, since);
    const client = await s.server.connect();
    t.after(() => client.close());
    assert.equal((await client.view(runId)).display.status, "paused");
    assert.equal(s.fixture.mock.requests.filter((request) => request.rule === "submit").length, 0);
    assert.equal((await stepEntries(pi)).length, 1);

    const resumedSince = pi.mark();
    const resumed = await workflow(pi, "resume");
    assert.equal(resumed.notifyType, "info", resumed.message);
    await widget(pi, /^✓ workflow review \[completed\]$/, resumedSince);
    await terminalTurnSettled(pi, s.fixture.mock, runId, resumedSince);
    assert.equal((await stepEntries(pi)).length, 2, "the initial and one resumed step message");
    assert.equal(agentStarts(pi, resumedSince), 2, "one fresh turn after resume, then the terminal message's");
    assert.equal(stepTurns(s.fixture.mock.requests).length, 2, "the aborted turn and the fresh one");
    assert.equal((await client.view(runId)).display.status, "completed");
  });

  it("a step message that becomes eligible while Pi runs another turn is sent once, after that turn settles: no queued duplicate and one model turn for the step", async (t) => {
    // A plain prompt keeps Pi busy: its turn waits in a bash call until the test creates the gate file.
    const gate = join(mkdtempSync(join(tmpdir(), "pi-busy-")), "gate");
    const s = await setup(t, [
      { name: "busy", lastRole: "user", when: "tell me a long story", reply: reply.toolCall("bash", { command: `while [ ! -e ${gate} ]; do sleep 0.1; done; echo story told` }) },
      { name: "told", lastRole: "tool", when: "story told", reply: reply.text("The end.") },
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: STEP_CONTRACT, reply: submitStep(APPROVED) },
    ]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    assert.equal(await pi.prompt("tell me a long story"), "started");
    await s.fixture.mock.waitForRequest((request) => request.rule === "busy", 60_000, "the busy turn's model request");
    // A run of this session starts from outside (the CLI, another client) while Pi streams: its step message is pending.
    const client = await s.server.connect();
    t.after(() => client.close());
    const sessionId = pi.state?.sessionId;
    assert.ok(sessionId);
    const started = await client.command("run.start", { workflow: "review", input: { task: "fix the bug" }, executionMode: "interactive", projectPath: s.project, originSessionId: sessionId });
    assert.equal(started.outcome, "accepted", JSON.stringify(started));
    const runId = (started.receipt as { runId: string }).runId;
    const deadline = Date.now() + 30_000;
    for (;;) {
      const read = await client.request("sessionView.get", { sessionId });
      const window = read.receipt as { messages: { kind: string; state: string }[]; nextEligibleMessageId?: string };
      if (window.messages.some((message) => message.kind === "step" && message.state === "pending")) break;
      assert.ok(Date.now() < deadline, `the step message pending: ${JSON.stringify(window)}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    // Let the extension's once-per-second recovery and the session subscription see it a few times while Pi is busy.
    await new Promise((resolve) => setTimeout(resolve, 2_500));
    assert.equal(pi.records.slice(since).filter((record) => record.type === "agent_settled").length, 0, "Pi is still busy with the story");
    assert.equal((await stepEntries(pi)).length, 0, "nothing was sent into the busy session");
    assert.equal(stepTurns(s.fixture.mock.requests).length, 0);
    writeFileSync(gate, "");

    const settled = await pi.waitFor((record) => record.type === "agent_settled", { since, what: "the story's turn to settle", timeoutMs: 60_000 });
    await widget(pi, /^✓ workflow review \[completed\]$/, since);
    await terminalTurnSettled(pi, s.fixture.mock, runId, since);
    const steps = await stepEntries(pi);
    assert.equal(steps.length, 1, `one step message, got ${steps.length}`);
    assert.equal(stepTurns(s.fixture.mock.requests).length, 1, "one model turn opened by the step");
    const stepStart = pi.records.findIndex((record, index) => index > pi.records.indexOf(settled) && record.type === "agent_start");
    assert.ok(stepStart > 0, "the step's turn started after the busy turn settled");
    assert.equal(agentStarts(pi, since), 3, "the story's turn, the step's and the terminal message's");
    assert.equal(s.fixture.mock.requests.filter((request) => request.rule === "told").length, 1, "the story's turn ended once");
    assert.equal((await client.view(runId)).display.status, "completed");
  });

  it("a model-started run is saved held and activates only after the initiating turn settles", async (t) => {
    const s = await setup(t, [
      { name: "start", lastRole: "user", when: "please start the review workflow", reply: reply.toolCall("workflow", { action: "start", workflow: "review", input: { task: "fix it" } }) },
      // Streamed slowly (about 2 s): the held run is checked while this turn runs.
      { name: "queued", lastRole: "tool", when: "Workflow review queued", reply: reply.text("It is queued.", { chunkChars: 1, delayMs: 150 }) },
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: STEP_CONTRACT, reply: submitStep(APPROVED) },
    ]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    assert.equal(await pi.prompt("please start the review workflow"), "started");
    const queuedRequest = await s.fixture.mock.waitForRequest((request) => request.rule === "queued", 60_000, "the tool result of start");
    const runId = /queued \(run ([^)\s]+)\)/.exec(queuedRequest.last?.text ?? "")?.[1];
    assert.ok(runId, queuedRequest.last?.text);
    const client = await s.server.connect();
    t.after(() => client.close());
    const held = await client.view(runId);
    assert.equal(held.display.status, "queued");
    assert.ok(held.display.controls.includes("activate"), `controls: ${held.display.controls.join(",")}`);
    assert.equal(held.steps.total, 0, "nothing ran before the turn settled");

    const settled = await pi.waitFor((record) => record.type === "agent_settled", { since, what: "the initiating turn to settle", timeoutMs: 30_000 });
    const settledAt = pi.records.indexOf(settled);
    await widget(pi, /^✓ workflow review \[completed\]$/, since);
    const stepRequest = stepTurns(s.fixture.mock.requests);
    assert.equal(stepRequest.length, 1);
    const stepStart = pi.records.findIndex((record, index) => index > settledAt && record.type === "agent_start");
    assert.ok(stepStart > settledAt, "the step turn started after the initiating turn settled");
    assert.equal((await client.view(runId)).display.status, "completed");
    await terminalTurnSettled(pi, s.fixture.mock, runId, since);
  });

  it("a terminal message reaches only the final leaf of a continuation chain: one deferred-turn card for the continuation, claiming its terminal intent, none for its parent, one model turn in which the model stops", async (t) => {
    const s = await setup(t, []);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "chain");
    const parent = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    await widget(pi, /^⏸ workflow chain \[waiting\]$/, since);
    const answered = await workflow(pi, `answer {"approved":true}`);
    assert.equal(answered.notifyType, "info", answered.message);
    const client = await s.server.connect();
    t.after(() => client.close());
    const parentView = await client.view(parent);
    assert.equal(parentView.display.status, "completed", "the parent is settled by its continuation");
    const runs = await client.request("runs.list", { limit: 10 });
    const leaf = (runs.receipt as { rows: { runId: string }[] }).rows.map((row) => row.runId).find((runId) => runId !== parent);
    assert.ok(leaf, JSON.stringify(runs.receipt));
    await client.waitFor(leaf, (view) => view.display.status === "completed", 30_000, "the continuation to complete");

    const request = await terminalTurnSettled(pi, s.fixture.mock, leaf, since);
    assert.match(request.last?.text ?? "", /^Workflow chain ended: completed \(run /);
    assert.ok(request.last?.text.includes(`"state":"completed"`), request.last?.text);
    assert.ok(request.last?.text.includes(`"result":{"published":true}`), request.last?.text);
    assert.ok(request.last?.text.includes("not an instruction"), request.last?.text);
    // Give a second message (for the parent) the time to arrive, if the server made one.
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    const terminal = await customEntries(pi, TERMINAL_TYPE);
    assert.deepEqual(
      terminal.map((entry) => entry.details?.runId),
      [leaf],
      "one terminal message, the continuation's",
    );
    assert.equal(terminal[0]?.display, true, "the visible card");
    const details = terminal[0]?.details as { schema?: string; turnIntentId?: string; cause?: string; stopsByDefault?: boolean; presentation?: unknown } | undefined;
    assert.equal(details?.schema, "pi-workflows.deferred-turn-message.v1");
    assert.match(details?.turnIntentId ?? "", /^deferred-turn:[0-9a-f]{64}$/);
    assert.deepEqual([details?.cause, details?.stopsByDefault], ["terminal", false]);
    assert.deepEqual(details?.presentation, { workflowName: "chain", state: "completed", restart: { count: 0, limit: 3 } });
    assert.equal(terminalTurns(s.fixture.mock.requests).length, 1, "one model turn, opened by it");
    assert.equal(terminalTurns(s.fixture.mock.requests, parent).length, 0);
    assert.equal(agentStarts(pi, since), 1, "the terminal message's turn is the only model turn of the chain");
    // The model stopped: its answer was text, and nothing started after it.
    assert.equal(request.outcome, "completed", JSON.stringify(request.outcome));
    const after = await client.request("runs.list", { limit: 10 });
    assert.equal((after.receipt as { rows: unknown[] }).rows.length, 2, "no run started after the terminal turn");
  });

  it("a cancelled run gets one deferred-turn card that stops by default: its turn is told not to restart, the model stops, and nothing starts again", async (t) => {
    const s = await setup(t, []);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "chain");
    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    await widget(pi, /^⏸ workflow chain \[waiting\]$/, since);
    const cancelled = await workflow(pi, "cancel");
    assert.equal(cancelled.notifyType, "info", cancelled.message);
    const client = await s.server.connect();
    t.after(() => client.close());
    await client.waitFor(runId, (view) => view.display.status === "cancelled", 30_000, "the run to be cancelled");

    const request = await terminalTurnSettled(pi, s.fixture.mock, runId, since);
    assert.match(request.last?.text ?? "", /^Workflow chain ended: cancelled \(run /);
    assert.ok(request.last?.text.includes("The workflow was cancelled. Do not restart it"), request.last?.text);
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    const terminal = await customEntries(pi, TERMINAL_TYPE);
    assert.equal(terminal.length, 1, JSON.stringify(terminal));
    const details = terminal[0]?.details as { cause?: string; stopsByDefault?: boolean; runId?: string } | undefined;
    assert.deepEqual([details?.runId, details?.cause, details?.stopsByDefault], [runId, "cancelled", true]);
    assert.equal(terminalTurns(s.fixture.mock.requests, runId).length, 1, "one model turn");
    assert.equal(agentStarts(pi, since), 1, "the cancellation's turn is the only model turn");
    const runs = await client.request("runs.list", { limit: 10 });
    assert.equal((runs.receipt as { rows: unknown[] }).rows.length, 1, "nothing restarted");
  });

  it("two follow-ups of a continuation chain reach Pi in order, each opening one model turn, only after the final leaf's terminal turn", async (t) => {
    const s = await setup(t, [
      { name: "first", lastRole: "user", when: "FOLLOW-UP ONE", reply: reply.text("Did the first.") },
      { name: "second", lastRole: "user", when: "FOLLOW-UP TWO", reply: reply.text("Did the second.") },
    ]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "chain");
    const parent = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    await widget(pi, /^⏸ workflow chain \[waiting\]$/, since);
    const client = await s.server.connect();
    t.after(() => client.close());
    for (const prompt of ["FOLLOW-UP ONE", "FOLLOW-UP TWO"]) {
      const added = await client.command("followUp.add", { prompt }, parent);
      assert.equal(added.outcome, "accepted", JSON.stringify(added));
    }
    // Queued while the chain waits: nothing reaches Pi.
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    assert.deepEqual(await customEntries(pi, "pi-workflows-follow-up"), [], "no follow-up while the chain waits");
    const answered = await workflow(pi, `answer {"approved":true}`);
    assert.equal(answered.notifyType, "info", answered.message);
    await until("both follow-up turns answered", () => s.fixture.mock.requests.filter((request) => request.rule === "second" && request.outcome === "completed").length === 1, 60_000);
    await until("Pi settled after the second follow-up's turn", () => pi.records.slice(since).filter((record) => record.type === "agent_settled").length >= 3, 30_000);
    const rules = s.fixture.mock.requests.map((request) => request.rule);
    assert.deepEqual(rules, ["terminal", "first", "second"], "the terminal turn, then one turn per follow-up, in order");
    const entries = await customEntries(pi, "pi-workflows-follow-up");
    assert.equal(entries.length, 2, JSON.stringify(entries));
    assert.ok(JSON.stringify(entries[0]?.content).includes("FOLLOW-UP ONE") && JSON.stringify(entries[1]?.content).includes("FOLLOW-UP TWO"), JSON.stringify(entries));
    assert.equal(agentStarts(pi, since), 3, "three model turns: the terminal message's and one per follow-up");
  });

  it("a run that completes while the step turn's closing text streams: Pi finishes the turn, its capture ends normally, and no interruption shows", async (t) => {
    // The closing text streams for about 4.5 s after the accepted submission (15 chunks, 300 ms apart).
    const closing = "All done here. ".repeat(16);
    const s = await setup(t, [
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text(closing, { delayMs: 300 }) },
      { name: "submit", lastRole: "user", when: STEP_CONTRACT, reply: submitStep(APPROVED) },
    ]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "review fix the bug");
    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    const client = await s.server.connect();
    t.after(() => client.close());
    // The runner's continuation ends the run inside the step turn.
    await client.waitFor(runId, (view) => view.display.status === "completed", 60_000, "the run to complete");
    const closingRequest = s.fixture.mock.requests.find((request) => request.rule === "done");
    assert.equal(closingRequest?.outcome, "streaming", "the run ended while the step turn's closing text still streamed");
    await terminalTurnSettled(pi, s.fixture.mock, runId, since);
    assert.equal(closingRequest?.outcome, "completed", "Pi finished the closing text: nothing stopped the step turn");
    const stepEnd = pi.records.slice(since).find((record) => record.type === "agent_end") as { messages?: { role?: string; stopReason?: string }[] } | undefined;
    assert.deepEqual(
      (stepEnd?.messages ?? []).filter((message) => message.role === "assistant").map((message) => message.stopReason).at(-1),
      "stop",
      "the step turn's last assistant message ended normally",
    );
    // Its capture ends as a turn that finished, not one aborted.
    const page = await client.request("view.page", { collection: "sessionEvents", limit: 256, maxBytes: 524_288, revision: 1 }, { runId });
    const items = (page.receipt as { items: { type: string; data: Record<string, unknown> }[] }).items;
    assert.deepEqual(items.find((event) => event.type === "turn_finished")?.data.aborted, false, JSON.stringify(items.map((event) => event.type)));
    // No interruption is shown: no widget line, status or notification speaks of one.
    const shown = pi.records
      .slice(since)
      .flatMap((record) => (record.type === "extension_ui_request" ? [...((record as { widgetLines?: string[] }).widgetLines ?? []), String((record as { message?: unknown }).message ?? ""), String((record as { statusText?: unknown }).statusText ?? "")] : []));
    assert.deepEqual(shown.filter((line) => /interrupt|server stopped|lost|error/i.test(line)), [], "no interruption shown");
  });

  it("session capture: the step turn's Pi events reach the server under run-wide numbers from 1, and a viewer reads them back in pages", async (t) => {
    const s = await setup(t, [
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: STEP_CONTRACT, reply: submitStep(APPROVED) },
    ]);
    const pi = await spawnWorkflowPi(s);
    const since = pi.mark();
    const started = await workflow(pi, "review fix the bug");
    const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    await widget(pi, /^✓ workflow review \[completed\]$/, since);
    await terminalTurnSettled(pi, s.fixture.mock, runId, since);

    const client = await s.server.connect();
    t.after(() => client.close());
    type Stored = { seq: number; type: string; data: Record<string, unknown> };
    const captured = async (): Promise<Stored[]> => {
      const events: Stored[] = [];
      let cursor: string | undefined;
      for (;;) {
        const page = await client.request("view.page", { collection: "sessionEvents", limit: 256, maxBytes: 524_288, revision: 1, ...(cursor !== undefined ? { cursor } : {}) }, { runId });
        assert.equal(page.outcome, "accepted", JSON.stringify(page));
        const receipt = page.receipt as { items: Stored[]; nextCursor?: string };
        events.push(...receipt.items);
        if (receipt.nextCursor === undefined) return events;
        cursor = receipt.nextCursor;
      }
    };
    // Both workflow turns of the run (the step's, the terminal message's) end in the capture.
    const deadline = Date.now() + 30_000;
    let events = await captured();
    while (events.filter((event) => event.type === "turn_finished").length < 2) {
      assert.ok(Date.now() < deadline, `the capture holds both turns: ${JSON.stringify(events.map((event) => event.type))}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
      events = await captured();
    }
    assert.deepEqual(events.map((event) => event.seq), Array.from({ length: events.length }, (_, index) => index + 1), "numbered from 1 without gaps");
    const turns = events.filter((event) => event.type === "turn_started").map((event) => event.data.turnId);
    assert.equal(turns.length, 2);
    assert.equal(new Set(turns).size, 2);
    const step = events.slice(0, events.findIndex((event) => event.type === "turn_finished") + 1);
    assert.equal(step[0]?.type, "turn_started");
    const submit = step.find((event) => event.type === "tool_execution_started");
    assert.deepEqual([submit?.data.toolName, (submit?.data.args as { action?: string } | undefined)?.action], ["workflow", "submit"]);
    const finished = step.find((event) => event.type === "tool_execution_finished");
    assert.deepEqual([finished?.data.toolCallId, finished?.data.isError], [submit?.data.toolCallId, false]);
    assert.ok(step.some((event) => event.type === "message_finished" && event.data.role === "assistant"), JSON.stringify(step.map((event) => event.type)));
    assert.ok(step.some((event) => event.type === "model_call_finished" && typeof event.data.messageEntryId === "string"), "model calls link their session entries");
    assert.deepEqual(step.at(-1)?.data, { turnId: turns[0], aborted: false });
    // A turn that is not workflow work is never captured: a plain prompt after the run adds nothing.
    const count = events.length;
    const plainSince = pi.mark();
    assert.equal(await pi.prompt("Done."), "started");
    await pi.waitSettled();
    await pi.waitFor((record) => record.type === "agent_settled", { since: plainSince, what: "the plain turn settles" });
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    assert.equal((await captured()).length, count, "an ordinary turn adds no event");
  });
});

describe("interactive workflows in real Pi's TUI (tmux)", () => {
  it("a restored deferred-turn card renders collapsed (name, state, run, restarts; no content), expands to the whole message, and starts no turn", async (t) => {
    const s = await setup(t, [{ name: "hello", lastRole: "user", when: "hello", reply: reply.text("Hello.") }]);
    const client = await s.server.connect();
    t.after(() => client.close());
    // First an rpc Pi runs the chain to its end and the terminal turn; its session file keeps the card.
    const pi = await spawnWorkflowPi(s);
    assert.equal(await pi.prompt("hello"), "started");
    await pi.waitFor((record) => record.type === "agent_settled", { what: "the first exchange", timeoutMs: 30_000 });
    const started = await workflow(pi, "chain");
    const parent = /\(run ([^)\s]+)\)/.exec(started.message)?.[1] as string;
    await widget(pi, /^⏸ workflow chain \[waiting\]$/);
    await workflow(pi, `answer {"approved":true}`);
    const runs = await client.request("runs.list", { limit: 10 });
    const leaf = (runs.receipt as { rows: { runId: string }[] }).rows.map((row) => row.runId).find((runId) => runId !== parent) as string;
    await terminalTurnSettled(pi, s.fixture.mock, leaf);
    const sessionFile = pi.state?.sessionFile as string;
    await pi.stop();
    const requestsBefore = s.fixture.mock.requests.length;

    const tui = await s.fixture.startTui({ extensions: [SDK_DIR], cwd: s.project, env: s.env, args: ["--session", sessionFile] }, { cols: 200, rows: 50 });
    const { tmux } = tui;
    const card = new RegExp(`◆ chain · completed · run ${leaf.slice(0, 40).replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}`);
    await tmux.waitForScreen(card, 30_000);
    const collapsed = tmux.capture();
    assert.match(collapsed, /restarts 0\/3/, collapsed);
    assert.ok(!collapsed.includes("Terminal facts") && !collapsed.includes("This message comes from the workflow server"), `collapsed shows no content:\n${collapsed}`);
    tmux.sendKeys("C-o");
    await tmux.waitForScreen(/Terminal facts \(pi-workflows\.terminal-facts\.v1/, 10_000);
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    assert.equal(s.fixture.mock.requests.length, requestsBefore, "the restored card opens no model turn");
    assert.equal(terminalTurns(s.fixture.mock.requests, leaf).length, 1);
    const stop = await tui.stop();
    assert.equal(stop.status, 0);
  });

  it("the widget shows running for the whole exact step turn, and paused only once the server holds the durable pause", async (t) => {
    const slow = "Let me look at this change carefully before I decide anything at all. ".repeat(20);
    const s = await setup(t, [
      { name: "slow", lastRole: "user", when: STEP_CONTRACT, times: 1, reply: reply.text(slow, { chunkChars: 4, delayMs: 100 }) },
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: STEP_CONTRACT, reply: submitStep(APPROVED) },
    ]);
    const client = await s.server.connect();
    t.after(() => client.close());
    const tui = await s.fixture.startTui({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const { tmux } = tui;
    tmux.type("/workflow review fix the bug");
    tmux.sendKeys("Enter");
    await s.fixture.mock.waitForRequest((request) => request.last?.text.includes(STEP_CONTRACT) === true, 60_000, "the step turn's model request");
    // The turn's start report makes the run's display running: from then on, every sample of the screen while the
    // model streams says running, and the run is not paused.
    await tmux.waitForScreen(/wf review \[running\] review/, 30_000);
    const samples: string[] = [];
    for (const until = Date.now() + 3_000; Date.now() < until; await new Promise((resolve) => setTimeout(resolve, 150))) {
      samples.push(/wf review \[([a-z_]+)\]/.exec(tmux.capture())?.[1] ?? "none");
    }
    assert.ok(samples.length >= 10, `${samples.length} samples`);
    assert.deepEqual([...new Set(samples)], ["running"], samples.join(","));
    assert.ok(s.fixture.mock.requests.some((request) => request.rule === "slow" && request.outcome === "streaming"), "the samples were taken inside the turn");
    const runId = (await client.request("runs.list", { limit: 10 })).receipt as { rows: { runId: string }[] };
    const run = runId.rows[0]?.runId as string;

    // Escape: the screen says paused only once the server's run is durably paused.
    tmux.sendKeys("Escape");
    const deadline = Date.now() + 30_000;
    for (;;) {
      assert.ok(Date.now() < deadline, `paused on the screen:\n${tmux.capture()}`);
      const status = /wf review \[([a-z_]+)\]/.exec(tmux.capture())?.[1];
      if (status === "paused") break;
      assert.equal(status, "running", "nothing but running before the pause");
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const view = await client.view(run);
    assert.deepEqual([view.display.status, view.status.paused], ["paused", true], "the server holds the pause the widget shows");
    await tmux.waitForScreen(/⏸ workflow review \[paused\]/, 10_000);
    const stop = await tui.stop();
    assert.equal(stop.status, 0);
  });
});
