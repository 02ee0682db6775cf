/**
 * The Pi extension's session modules (`WorkflowSession`: the view source,
 * the coordinator, the turn reporter) against the real server binary and the
 * node runner, with a scripted Pi (`FakePi`: its idle flag, pending input and
 * active branch are what the test sets). These are the origin-session rules
 * where Pi adds nothing but the three facts the extension reads from it; the
 * real-Pi tests (`e2e-pi/`) prove the rest.
 *
 * Each test names the conformance rows (conformance/COVERAGE.md) it proves:
 * - 15: every server connection reports the active branch before any send or
 *   turn report, and the server refuses a turn report before it;
 * - 37: an exact model turn presents the waiting node as running and changes
 *   nothing durable;
 * - 14 and 19: absence from the active branch counts only when Pi is idle
 *   with no pending input and the message's id is not on the branch; it
 *   presents the pending source again as one message of its own kind;
 * - 17: branch evidence turns a cancelled message into a sent one;
 * - 38 and 41: a stale turn end cannot clear a newer turn; a terminal turn
 *   is model-turn activity for its whole length; the retained terminal run
 *   offers no control and refuses commands.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { type TestContext, describe, it } from "node:test";

import { MAX_PAGE_BYTES, type Settled, WorkflowClient } from "../src/client/client.js";
import type { ServerPort } from "../src/extension/ports.js";
import { WorkflowSession } from "../src/extension/session.js";
import type { RunView, TurnReportPayload, WorkflowMessage } from "../src/generated/types.js";
import { FakePi, FakeUi } from "../test/extension-fakes.js";
import { TestServer, serverBinary } from "../test-support/server.js";

const REVIEW = `import { agent, compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "review",
  startAt: "review",
  nodes: {
    review: agent({
      prompt: () => "Review the change.",
      expectedOutput: '{ "verdict": "approve" | "reject" }',
      validate: (output) => output,
    }),
    ship: compute({ run: () => ({ shipped: true }) }),
  },
  edges: [{ from: "review", to: "ship" }],
});
`;

/** What the extension sent, in order: every branch and turn report with the connection that answered it, and every Pi send. */
interface Logged {
  line: string;
  generation: number | undefined;
}

interface Harness {
  server: TestServer;
  project: string;
  sessionId: string;
  /** The extension's client. */
  client: WorkflowClient;
  /** A second client that reads what the server holds (no epoch). */
  observer: WorkflowClient;
  pi: FakePi;
  ui: FakeUi;
  session: WorkflowSession;
  log: Logged[];
  turnReports: TurnReportPayload[];
}

async function harness(t: TestContext): Promise<Harness> {
  const server = await TestServer.start();
  const project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "review.workflow.ts"), REVIEW);
  const sessionId = `session-${randomUUID()}`;
  const options = { home: server.home, bin: serverBinary(), env: server.env, autoStart: false, retryIntervalMs: 50 };
  const client = new WorkflowClient(options);
  const observer = new WorkflowClient(options);
  const log: Logged[] = [];
  const turnReports: TurnReportPayload[] = [];
  const pi = new FakePi();
  const ui = new FakeUi();
  pi.onSend = (delivery) => log.push({ line: `send ${delivery.message.details.workflowMessageId}`, generation: client.connectionGeneration });
  const session = new WorkflowSession({
    server: recording(client, log, turnReports),
    pi,
    ui,
    sessionId,
    projectPath: project,
    getLeafId: () => pi.leafId,
    pollMs: 100,
    entryWait: { attempts: 200, delayMs: 10 },
  });
  t.after(async () => {
    await session.stop();
    client.close();
    observer.close();
    await server.stop();
  });
  return { server, project, sessionId, client, observer, pi, ui, session, log, turnReports };
}

/** The extension's client, with its branch and turn reports logged when answered (with the answering connection). */
function recording(client: WorkflowClient, log: Logged[], turnReports: TurnReportPayload[]): ServerPort {
  const answered = <T extends Settled<"workflowMessage.reportBranch"> | Settled<"workflowTurn.report">>(what: string, settled: T): T => {
    const ownership = (settled.receipt as { ownership?: string } | undefined)?.ownership;
    log.push({ line: `${what} ${settled.outcome}${ownership !== undefined ? ` ${ownership}` : ""}`, generation: settled.connectionGeneration });
    return settled;
  };
  return new Proxy(client, {
    get(target, property) {
      if (property === "reportBranch") {
        return (payload: Parameters<WorkflowClient["reportBranch"]>[0]) => target.reportBranch(payload).then((settled) => answered("reportBranch", settled));
      }
      if (property === "reportTurn") {
        return (payload: TurnReportPayload) => {
          turnReports.push(payload);
          return target.reportTurn(payload).then((settled) => answered(`reportTurn ${payload.phase}`, settled));
        };
      }
      const value = Reflect.get(target, property, target) as unknown;
      return typeof value === "function" ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
}

/** Waits until `check` holds (it may read the server), bounded. */
async function until(what: string, check: () => boolean | Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** `/workflow review …` through the extension; the run id from its notification. */
async function startReview(h: Harness): Promise<string> {
  await h.session.command("review fix the bug");
  const note = h.ui.lastNote ?? "";
  const runId = /\(run ([^)\s]+)\)/.exec(note)?.[1];
  assert.ok(runId, note);
  return runId;
}

/** The run's workflow messages as the server holds them (every state), in session order. */
async function messagesOf(observer: WorkflowClient, runId: string): Promise<WorkflowMessage[]> {
  const { revision } = await observer.runView(runId);
  const page = await observer.page(runId, { collection: "messages", limit: 100, maxBytes: MAX_PAGE_BYTES, revision });
  return page.items as unknown as WorkflowMessage[];
}

async function viewUntil(observer: WorkflowClient, runId: string, what: string, done: (view: RunView) => boolean, timeoutMs = 30_000): Promise<RunView> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const view = await observer.runView(runId);
    if (done(view)) return view;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(view.display)}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** What a view holds durably about the run's progress: its status, its nodes, its steps and attempts (not the presentation). */
function durable(view: RunView): string {
  return JSON.stringify({
    run: view.status.run,
    paused: view.status.paused,
    nodes: view.nodes.map((node) => [node.id, node.state, node.visits]),
    steps: view.steps.items.map((step) => [step.seq, step.nodeId, step.visit, step.startedAtMs, step.finishedAtMs ?? null, step.attempts.map((attempt) => [attempt.attemptId, attempt.attemptNumber, attempt.startedAtMs, attempt.finishedAtMs ?? null])]),
  });
}

/** Pi's assistant message and the end of its turn, as Pi emits them. */
function endTurn(h: Harness, stopReason: "stop" | "aborted" = "stop"): void {
  h.pi.append({ type: "message", message: { role: "assistant" } });
  h.session.onAgentEnd([{ role: "assistant", stopReason }]);
  h.pi.idle = true;
  h.session.onAgentSettled(stopReason === "aborted");
}

describe("the extension's session modules against the real server", () => {
  it("every connection reports the branch before any send or turn report (a turn report before it is refused); the exact turn shows the waiting node running and changes nothing durable; a graceful server stop mid-turn does not lose it", async (t) => {
    const h = await harness(t);
    await h.session.start();
    const runId = await startReview(h);
    await until("the step message sent", () => h.pi.sent.length === 1, 30_000);
    const stepId = h.pi.sentIds()[0] as string;
    const waiting = await viewUntil(h.observer, runId, "the step waiting", (view) => view.display.status === "waiting");
    assert.equal(waiting.display.waitingOn, "review", JSON.stringify(waiting.display));

    // Pi starts the model turn the step message triggers (row 37).
    h.pi.idle = false;
    h.session.onAgentStart();
    const running = await viewUntil(h.observer, runId, "the turn's start report", (view) => view.display.activity === "modelTurn");
    assert.deepEqual([running.display.status, running.display.currentNode, running.display.waitingOn], ["running", "review", undefined], JSON.stringify(running.display));
    assert.equal(running.status.run, "waiting", "the durable status stays waiting");
    assert.equal(durable(running), durable(waiting), "the turn changed nothing durable");

    // A graceful `server stop` inside the turn, then a new server (row 18's server half).
    await h.server.cli(["server", "stop"]);
    assert.match(await h.server.cli(["server", "start"]), /pi-workflows server started/);
    await until("the extension's turn start again on its new connection", () => h.log.some((entry) => entry.line === "reportTurn start accepted active" && (entry.generation ?? 0) > 1), 30_000).catch((error: unknown) => {
      throw new Error(`${String(error)}; the extension's requests: ${JSON.stringify(h.log)}; its coordinator: ${h.session.coordinator.state} ${h.session.coordinator.currentProblem ?? ""}; pending turns: ${JSON.stringify(h.session.turns.pending)}`);
    });
    const restarted = await viewUntil(h.observer, runId, "the view on the new server", () => true);
    assert.equal(restarted.display.activity, "modelTurn", `the turn is still open after the restart: ${JSON.stringify(restarted.display)}`);
    assert.equal(durable(restarted), durable(waiting));
    assert.deepEqual(
      (await messagesOf(h.observer, runId)).map((message) => [message.kind, message.stepReason, message.state]),
      [["step", "initial", "sent"]],
      "the restart closed no turn as lost (a lost step turn makes a reminder)",
    );

    // The turn ends without a submission: the one reminder, sent on the new connection.
    endTurn(h);
    await until("the reminder sent", () => h.pi.sent.length === 2, 30_000);
    const ended = await viewUntil(h.observer, runId, "the turn's end", (view) => view.display.activity !== "modelTurn");
    assert.equal(ended.display.status, "waiting");
    assert.equal(durable(ended), durable(waiting), "the step is the same attempt after the turn");
    assert.deepEqual(
      (await messagesOf(h.observer, runId)).map((message) => [message.kind, message.stepReason]),
      [
        ["step", "initial"],
        ["step", "reminder"],
      ],
    );

    // Row 15: on every connection, the first thing answered is the branch report.
    const generations = [...new Set(h.log.map((entry) => entry.generation))];
    assert.ok(generations.length >= 2, JSON.stringify(h.log));
    for (const generation of generations) {
      const lines = h.log.filter((entry) => entry.generation === generation).map((entry) => entry.line);
      const acted = lines.findIndex((line) => line.startsWith("send") || line.startsWith("reportTurn"));
      if (acted < 0) continue;
      const reported = lines.indexOf("reportBranch accepted");
      assert.ok(reported >= 0 && reported < acted, `connection ${generation}: ${lines.join(" | ")}`);
    }
    assert.ok(h.log.some((entry) => entry.line === `send ${stepId}` && entry.generation === generations[0]));

    // The server enforces it: a new connection that takes the epoch and reports a turn first is refused.
    const other = new WorkflowClient({ home: h.server.home, bin: serverBinary(), env: h.server.env, autoStart: false });
    t.after(() => other.close());
    const { view } = await other.sessionView({ sessionId: h.sessionId, coordinate: true });
    assert.ok(view.coordinatorEpoch !== undefined, "the newer connection takes the epoch");
    const reminder = h.pi.sentIds()[1] as string;
    const early = await other.reportTurn({ sessionId: h.sessionId, coordinatorEpoch: view.coordinatorEpoch, messageId: reminder, runId, turnId: `turn-${randomUUID()}`, phase: "start" });
    assert.equal(early.outcome, "rejected", JSON.stringify(early));
    assert.equal(early.error?.code, "illegalTransition");
    assert.match(early.error?.message ?? "", /report the active branch first/);
  });

  it("absence from the branch counts only when the id is not on it and Pi is idle with no pending input; then the pending step is presented again as one step message, sent once", async (t) => {
    const h = await harness(t);
    await h.session.start();
    const runId = await startReview(h);
    await until("the step message sent", () => h.pi.sent.length === 1, 30_000);
    const stepId = h.pi.sentIds()[0] as string;
    const entryId = h.pi.branch.at(-1)?.id as string;
    const recorded = async (): Promise<WorkflowMessage[]> => (await messagesOf(h.observer, runId)).filter((message) => message.kind === "step");
    await until("the server records the step as sent", async () => (await recorded())[0]?.state === "sent", 10_000);
    const epoch = h.session.coordinator.reportingEpoch()?.epoch;
    assert.ok(epoch !== undefined);
    // Reports made as the coordinator makes them (its epoch, its connection), with the branch and Pi's state as they are.
    const report = (isIdle: boolean, hasPendingMessages: boolean): Promise<Settled<"workflowMessage.reportBranch">> => {
      h.pi.idle = isIdle;
      h.pi.pending = hasPendingMessages;
      const entries = h.pi.branch.some((entry) => (entry.details as { workflowMessageId?: string } | undefined)?.workflowMessageId === stepId) ? [{ messageId: stepId, entryId }] : [];
      return h.client.reportBranch({ sessionId: h.sessionId, coordinatorEpoch: epoch, entries, isIdle, hasPendingMessages });
    };
    const created = (settled: Settled<"workflowMessage.reportBranch">): number => {
      assert.equal(settled.outcome, "accepted", JSON.stringify(settled));
      return (settled.receipt as { created: number }).created;
    };

    // The step's entry is on the active branch and Pi is idle: nothing is absent.
    assert.equal(created(await report(true, false)), 0);
    // The user moves to another branch, without the step message.
    h.pi.branch = [];
    assert.equal(created(await report(false, false)), 0, "a busy Pi proves no absence");
    assert.equal(created(await report(true, true)), 0, "pending input proves no absence");
    assert.equal((await recorded()).length, 1);
    // Absent, idle, no pending input: one step message presents the step again; a second report made at once finds it pending.
    const [first, second] = await Promise.all([report(true, false), report(true, false)]);
    assert.deepEqual([created(first), created(second)].sort(), [0, 1]);
    const steps = await recorded();
    assert.equal(steps.length, 2, JSON.stringify(steps));
    const again = steps[1] as WorkflowMessage;
    assert.deepEqual([again.kind, again.interactionId, again.attemptId], ["step", steps[0]?.interactionId, steps[0]?.attemptId], JSON.stringify(steps));
    // Pi is idle: the extension sends it, once, and reports it on this branch.
    await h.session.tick();
    await until("the presented step sent", () => h.pi.sent.length === 2, 10_000);
    assert.equal(h.pi.sentIds()[1], again.messageId);
    await until("the server records it as sent", async () => (await recorded())[1]?.state === "sent", 10_000);
    for (let poll = 0; poll < 5; poll++) await h.session.tick();
    assert.equal(h.pi.sent.length, 2, "sent once");
    assert.equal((await recorded()).length, 2, "no further message while its entry is on the branch");
  });

  it("branch evidence turns a cancelled step message into a sent one: an entry left by an earlier Pi process is adopted, not sent again", async (t) => {
    const h = await harness(t);
    // The run starts with no Pi session of its origin connected: its step message waits.
    const started = await h.observer.runStart({ workflow: "review", input: { task: "fix it" }, executionMode: "interactive", projectPath: h.project, originSessionId: h.sessionId });
    const runId = started.receipt.runId;
    const pendingStep = async (): Promise<WorkflowMessage | undefined> => (await messagesOf(h.observer, runId)).find((message) => message.kind === "step" && message.state === "pending");
    await until("the pending step message", async () => (await pendingStep()) !== undefined, 30_000);
    const step = (await pendingStep()) as WorkflowMessage;
    // An earlier Pi process delivered it (the entry is in its session file) and ended before it reported the branch.
    const entryId = h.pi.append({ type: "custom_message", customType: "pi-workflows-agent-step", details: { schema: "pi-workflows.workflow-message.v1", workflowMessageId: step.messageId, runId, kind: "step" } });
    // The run is paused meanwhile: the pending step message is cancelled.
    await h.observer.runPause(runId);
    await until("the step message cancelled", async () => (await messagesOf(h.observer, runId))[0]?.state === "cancelled", 10_000);

    // The session opens again: its branch report names the entry, and the server records the message as sent.
    await h.session.start();
    await until("the cancelled message adopted as sent", async () => (await messagesOf(h.observer, runId))[0]?.state === "sent", 10_000).catch(async (error: unknown) => {
      throw new Error(`${String(error)}: the server holds ${JSON.stringify(await messagesOf(h.observer, runId))}; the extension reported ${h.log.map((entry) => entry.line).join(" | ")}`);
    });
    assert.equal((await messagesOf(h.observer, runId))[0]?.entryId, entryId);
    assert.equal(h.pi.sent.length, 0, "the adopted message is not sent again");
    // Resume: one resumed step message, sent once.
    await h.observer.runResume(runId);
    await until("the resumed step sent", () => h.pi.sent.length === 1, 30_000);
    await until("the server records it as sent", async () => (await messagesOf(h.observer, runId)).at(-1)?.state === "sent", 10_000);
    assert.deepEqual(
      (await messagesOf(h.observer, runId)).map((message) => [message.stepReason, message.state]),
      [
        ["initial", "sent"],
        ["resumed", "sent"],
      ],
    );
  });

  it("a stale turn end cannot clear the newer turn; the terminal message's turn is model-turn activity from start to end, and the retained terminal run offers no control and refuses commands", async (t) => {
    const h = await harness(t);
    await h.session.start();
    const runId = await startReview(h);
    await until("the step message sent", () => h.pi.sent.length === 1, 30_000);
    h.pi.idle = false;
    h.session.onAgentStart();
    await until("the turn's start report", () => h.log.some((entry) => entry.line === "reportTurn start accepted active"), 10_000);
    const older = h.turnReports[0] as TurnReportPayload;
    const epoch = h.session.coordinator.reportingEpoch()?.epoch as number;

    // A newer turn of the same message starts (its report on the coordinator's epoch), which ends the older one;
    // then the older turn's end arrives late, as an abort.
    const newerTurnId = `turn-${randomUUID()}`;
    const newer = await h.client.reportTurn({ ...older, coordinatorEpoch: epoch, turnId: newerTurnId, phase: "start" });
    assert.equal((newer.receipt as { ownership?: string } | undefined)?.ownership, "active", JSON.stringify(newer));
    const stale = await h.client.reportTurn({ ...older, coordinatorEpoch: epoch, phase: "end", stopReason: "aborted" });
    assert.equal(stale.outcome, "accepted", JSON.stringify(stale));
    assert.equal((stale.receipt as { ownership?: string } | undefined)?.ownership, "settled", JSON.stringify(stale));
    const after = await h.observer.runView(runId);
    assert.deepEqual([after.display.status, after.display.activity, after.status.paused], ["running", "modelTurn", false], `the stale abort neither ended the newer turn nor paused the run: ${JSON.stringify(after.display)}`);

    // The step is submitted through the extension's tool; the run completes.
    const pending = after.steps.items.at(-1)?.attempts.at(-1)?.attemptId as string;
    const submitted = await h.session.tool("call-submit-1", { action: "submit", step: "review", attempt: pending, output: { verdict: "approve" } });
    assert.equal(submitted.isError, false, submitted.text);
    // Pi ends its turn: the newer one's end (reported here, as the extension tracks only the turn it saw start), then Pi's event.
    const newerEnd = await h.client.reportTurn({ ...older, coordinatorEpoch: epoch, turnId: newerTurnId, phase: "end", stopReason: "completed" });
    assert.equal(newerEnd.outcome, "accepted", JSON.stringify(newerEnd));
    endTurn(h);
    await viewUntil(h.observer, runId, "the run to complete", (view) => view.display.status === "completed");

    // The terminal message: sent as the deferred-turn card, and it opens one turn.
    await until("the terminal message sent", () => h.pi.sent.some((delivery) => delivery.message.customType === "pi-workflows-deferred-turn"), 30_000);
    const retained = (await h.observer.sessionView({ sessionId: h.sessionId })).view.activeRun;
    assert.equal(retained?.runId, runId, "the terminal run stays in the session view while its message is pending or its turn open");
    assert.deepEqual(retained?.display.controls, [], "no control of a retained terminal run");
    for (const refused of [() => h.observer.runPause(runId), () => h.observer.runResume(runId), () => h.observer.runCancel(runId)]) {
      await assert.rejects(refused(), "a command on the retained run is refused");
    }
    assert.equal((await h.observer.runView(runId)).display.status, "completed");
    h.pi.idle = false;
    h.session.onAgentStart();
    const samples: string[] = [];
    await until("the terminal turn reported", () => h.log.filter((entry) => entry.line === "reportTurn start accepted active").length === 2, 10_000);
    for (let sample = 0; sample < 10; sample++) {
      const view = await h.observer.runView(runId);
      samples.push(`${view.display.status}/${view.display.activity}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.deepEqual([...new Set(samples)], ["completed/modelTurn"], samples.join(","));
    endTurn(h);
    await viewUntil(h.observer, runId, "the terminal turn's end", (view) => view.display.activity === "none");
  });
});
