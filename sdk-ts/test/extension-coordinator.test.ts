/**
 * The WorkflowMessageCoordinator and the turn reporter, through the
 * WorkflowSession that wires them, against a fake Pi and a fake server
 * (test/extension-fakes.ts). Each test asserts an ordering rule of the
 * workflow-server spec ("Interactive Pi execution", "Origin-session
 * activity") on the server call log.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { deliveryOf, startsTurn } from "../src/extension/messages.js";
import { WorkflowSession } from "../src/extension/session.js";
import { FakePi, FakeServer, FakeUi, node, runView, settle, step, until } from "./extension-fakes.js";

function harness(options: { grantsEpochs?: boolean } = {}) {
  const server = new FakeServer();
  server.grantsEpochs = options.grantsEpochs ?? true;
  const pi = new FakePi();
  const ui = new FakeUi();
  server.run = runView({ nodes: [node("draft", "agent", "waiting")], steps: { items: [step(1, "draft", 1_000, { attemptId: "att-1" })], total: 1 }, display: { status: "waiting", activity: "none", controls: ["pause", "cancel"], waitingOn: "draft" } });
  pi.onSend = () => server.log.push("SEND");
  const session = new WorkflowSession({
    server,
    pi,
    ui,
    sessionId: "session-1",
    projectPath: "/p",
    getLeafId: () => pi.leafId,
    pollMs: 0,
    entryWait: { attempts: 100, delayMs: 2 },
    now: () => 10_000,
  });
  return { server, pi, ui, session };
}

const index = (log: readonly string[], entry: string | RegExp): number =>
  log.findIndex((line) => (typeof entry === "string" ? line === entry : entry.test(line)));

describe("WorkflowMessageCoordinator", () => {
  it("reports the active branch before the first send, sends the eligible step once with a turn, then reports its entry", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Write the draft.\n\n---\nWorkflow step contract (workflow: review, step: draft, attempt: att-1)");
    await session.start();
    await until("the step to be sent", () => pi.sent.length === 1);
    await until("the entry to be reported", () => server.log.includes("reportBranch:e1:[msg-1=entry1]"));

    const log = server.log;
    const firstReport = index(log, "reportBranch:e1:[]");
    assert.ok(firstReport >= 0, log.join("\n"));
    assert.ok(firstReport < index(log, "SEND"), `the branch report comes first:\n${log.join("\n")}`);
    assert.ok(index(log, "SEND") < index(log, "reportBranch:e1:[msg-1=entry1]"), log.join("\n"));
    const [delivery] = pi.sent;
    assert.equal(delivery?.message.customType, "pi-workflows-agent-step");
    assert.equal(delivery?.message.display, true);
    assert.equal(delivery?.triggerTurn, true);
    assert.match(delivery?.message.content ?? "", /^Write the draft\.\n\n---\nWorkflow step contract \(workflow: review, step: draft, attempt: att-1\)$/);
    assert.deepEqual(delivery?.message.details, { schema: "pi-workflows.workflow-message.v1", workflowMessageId: "msg-1", runId: "run-1", kind: "step", stepReason: "initial" });
    await session.stop();
  });

  it("makes the final idle, pending-input and branch checks in the same synchronous block as pi.sendMessage (no await between them)", async () => {
    const { server, pi, session } = harness();
    server.addMessage("notification", "Built site.tar.");
    await session.start();
    await until("the notification to be sent", () => pi.sent.length === 1);
    assert.deepEqual(pi.checksAtSend, [["getBranch", "hasPendingMessages", "isIdle"]]);
    await session.stop();
  });

  it("does not send when Pi becomes busy while the message content is read, and sends once it is idle again", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    const read = server.readContent.bind(server);
    let reads = 0;
    server.readContent = async (reference, options) => {
      reads++;
      if (reads === 1) pi.idle = false; // a user prompt started during the await
      return read(reference, options);
    };
    await session.start();
    await until("the content to be read", () => reads === 1);
    await settle();
    assert.equal(pi.sent.length, 0, "sent while Pi was busy");
    pi.idle = true;
    session.onAgentSettled(false);
    await until("the step to be sent after the turn settled", () => pi.sent.length === 1);
    await session.stop();
  });

  it("never sends while Pi is busy or has pending input", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    pi.idle = false;
    await session.start();
    await session.tick();
    await settle();
    pi.idle = true;
    pi.pending = true;
    await session.tick();
    await settle();
    assert.equal(pi.sent.length, 0);
    assert.equal(session.coordinator.state, "waitingForPi");
    pi.pending = false;
    await session.tick();
    await until("the send", () => pi.sent.length === 1);
    await session.stop();
  });

  it("a poll cannot send an id twice: the queued map holds it while the server has not recorded it", async () => {
    const { server, pi, session } = harness();
    server.holdSent = true; // the server does not mark the message sent yet
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    pi.branch = []; // even a branch that lost the entry (another branch) does not make the poll send again
    for (let poll = 0; poll < 5; poll++) {
      await session.tick();
      await settle();
    }
    assert.deepEqual(pi.sentIds(), ["msg-1"]);
    assert.deepEqual(session.coordinator.queuedIds, ["msg-1"]);
    await session.stop();
  });

  it("reports a message that is already on the branch instead of sending it again", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    const entryId = pi.append({ type: "custom_message", customType: "pi-workflows-agent-step", details: { schema: "pi-workflows.workflow-message.v1", workflowMessageId: "msg-1", runId: "run-1", kind: "step" } });
    await session.start();
    await until("the branch report with the entry", () => server.log.includes(`reportBranch:e1:[msg-1=${entryId}]`));
    await session.tick();
    await settle();
    assert.equal(pi.sent.length, 0);
    assert.equal(server.messages[0]?.state, "sent");
    await session.stop();
  });

  it("sends decisions and notifications without a turn, steps, terminal and follow-up messages with one", async () => {
    const kinds = ["step", "decision", "notification", "terminal", "followUp"] as const;
    assert.deepEqual(
      kinds.map((kind) => startsTurn(kind)),
      [true, false, false, true, true],
    );
    const delivered = kinds.map((kind) => deliveryOf({ messageId: "m", runId: "r", kind, state: "pending", order: 1, content: { bytes: 1, digest: `sha256:${"0".repeat(64)}`, mediaType: "text/plain" } }, "x"));
    assert.deepEqual(
      delivered.map((delivery) => [delivery.message.customType, delivery.message.display, delivery.triggerTurn]),
      [
        ["pi-workflows-agent-step", true, true],
        ["pi-workflows-decision", true, false],
        ["pi-workflows-notification", true, false],
        ["pi-workflows-terminal", false, true],
        ["pi-workflows-follow-up", true, true],
      ],
    );
    const { server, pi, session } = harness();
    server.addMessage("notification", "Built.");
    await session.start();
    await until("the notification", () => pi.sent.length === 1);
    assert.equal(pi.sent[0]?.triggerTurn, false);
    await session.stop();
  });

  it("a fenced epoch never sends: a branch report answered claimLost stops the coordinator", async () => {
    const { server, pi, session } = harness();
    await session.start();
    await until("the first branch report", () => server.log.includes("reportBranch:e1:[]"));
    // Another Pi process takes the session's epoch; this one's next report is fenced.
    server.fenceEpochsBelow = 2;
    session.coordinator.reportingEpoch()!.branchReported = false;
    server.addMessage("step", "Step text");
    await session.tick();
    await settle();
    assert.equal(pi.sent.length, 0);
    assert.equal(session.coordinator.state, "fenced");
    assert.match(session.coordinator.currentProblem ?? "", /another Pi process/);
    await session.stop();
  });

  it("a view that no longer grants the epoch, or a changed connection, never sends", async () => {
    const { server, pi, session } = harness();
    await session.start();
    await until("the first branch report", () => server.log.includes("reportBranch:e1:[]"));
    server.grantsEpochs = false;
    (server as unknown as { activeEpoch: number | undefined }).activeEpoch = undefined;
    server.addMessage("step", "Step text");
    await session.tick();
    await settle();
    assert.equal(pi.sent.length, 0);
    assert.equal(session.coordinator.ownsEpoch(), false);
    await session.stop();
  });

  it("sends nothing and reports nothing when the server grants no epoch", async () => {
    const { server, pi, session } = harness({ grantsEpochs: false });
    server.addMessage("step", "Step text");
    await session.start();
    await session.tick();
    session.onAgentStart();
    session.onAgentEnd([{ role: "assistant", stopReason: "stop" }]);
    await settle();
    assert.equal(pi.sent.length, 0);
    assert.equal(server.ops("workflowMessage.reportBranch").length, 0);
    assert.equal(server.ops("workflowTurn.report").length, 0);
    assert.equal(session.coordinator.state, "noEpoch");
    assert.match(session.coordinator.currentProblem ?? "", /grants this session no coordinator epoch/);
    await session.stop();
  });

  it("a reconnect gets a new epoch and reports the branch again before anything else", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    await until("the entry report", () => server.log.includes("reportBranch:e1:[msg-1=entry1]"));
    const mark = server.log.length;
    server.reconnect();
    server.addMessage("notification", "Later note");
    await until("the notification after the reconnect", () => pi.sent.length === 2);
    const after = server.log.slice(mark);
    const report = index(after, "reportBranch:e2:[msg-1=entry1]");
    assert.ok(report >= 0, after.join("\n"));
    assert.ok(report < index(after, "SEND"), `branch first on the new epoch:\n${after.join("\n")}`);
    await session.stop();
  });
});

describe("TurnReporter", () => {
  it("buffers an agent_start that comes during the send and reports it after the branch report that records the message", async () => {
    const { server, pi, session } = harness();
    pi.onSend = () => {
      server.log.push("SEND");
      session.onAgentStart(); // Pi starts the turn before sendMessage returns
    };
    server.addMessage("step", "Step text");
    await session.start();
    await until("the start report", () => server.log.some((line) => line.startsWith("turn:start")));
    const log = server.log;
    assert.ok(index(log, "reportBranch:e1:[msg-1=entry1]") < index(log, /^turn:start:e1:msg-1:turn-/), log.join("\n"));
    pi.append({ type: "message", message: { role: "assistant" } });
    session.onAgentEnd([{ role: "assistant", stopReason: "toolUse" }, { role: "assistant", stopReason: "stop" }]);
    await until("the end report", () => server.log.some((line) => line.startsWith("turn:end")));
    const start = server.ops("workflowTurn.report")[0]?.payload as { turnId: string };
    const end = server.ops("workflowTurn.report")[1]?.payload as { turnId: string; stopReason: string; entryId: string };
    assert.equal(end.turnId, start.turnId);
    assert.equal(end.stopReason, "completed");
    assert.equal(end.entryId, "entry2");
    await session.stop();
  });

  it("buffers a turn that starts and ends before the first view, and reports start then end after the branch report", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    server.messages[0]!.state = "sent";
    server.messages[0]!.entryId = "entry1";
    pi.append({ type: "custom_message", details: { schema: "pi-workflows.workflow-message.v1", workflowMessageId: "msg-1" } });
    session.onAgentStart();
    session.onAgentEnd([{ role: "assistant", stopReason: "error" }]);
    assert.equal(server.ops("workflowTurn.report").length, 0);
    await session.start();
    await until("both reports", () => server.ops("workflowTurn.report").length === 2);
    const log = server.log;
    assert.ok(index(log, /^reportBranch:e1:/) < index(log, /^turn:start:e1:msg-1:/), log.join("\n"));
    assert.ok(index(log, /^turn:start:/) < index(log, /^turn:end:e1:msg-1:.*:error$/), log.join("\n"));
    await session.stop();
  });

  it("a turn that Escape ends before the branch report records its message is reported start then aborted end after that report", async () => {
    const { server, pi, session } = harness();
    pi.onSend = () => {
      server.log.push("SEND");
      session.onAgentStart(); // Pi starts the turn before sendMessage returns…
      session.onAgentEnd([{ role: "assistant", stopReason: "aborted" }]); // …and Escape ends it before the branch report
      session.onAgentSettled(true);
    };
    server.addMessage("step", "Step text");
    await session.start();
    await until("the end report", () => server.log.some((line) => line.startsWith("turn:end")));
    const log = server.log;
    assert.ok(index(log, "reportBranch:e1:[msg-1=entry1]") < index(log, /^turn:start:e1:msg-1:turn-/), log.join("\n"));
    assert.ok(index(log, /^turn:start:e1:msg-1:/) < index(log, /^turn:end:e1:msg-1:.*:aborted$/), log.join("\n"));
    await session.stop();
  });

  it("Escape reports one aborted end (the server pauses the run); no pause command is sent", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    session.onAgentStart();
    await until("the start report", () => server.log.some((line) => line.startsWith("turn:start")));
    session.onAgentEnd([{ role: "assistant", stopReason: "aborted" }]);
    session.onAgentSettled(true);
    await until("the end report", () => server.log.some((line) => line.startsWith("turn:end")));
    assert.match(server.log.find((line) => line.startsWith("turn:end")) ?? "", /:aborted$/);
    assert.equal(server.ops("run.pause").length, 0);
    await until("the paused view", () => session.view?.run?.display.status === "paused");
    await session.stop();
  });

  it("the extension's own abort of a closed step turn is reported as error, not aborted", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    pi.idle = false;
    session.onAgentStart();
    await until("the start report", () => server.log.some((line) => line.startsWith("turn:start")));
    await session.command("cancel");
    await until("the system abort", () => pi.aborts === 1);
    session.onAgentEnd([{ role: "assistant", stopReason: "aborted" }]);
    await until("the end report", () => server.log.some((line) => line.startsWith("turn:end")));
    assert.match(server.log.find((line) => line.startsWith("turn:end")) ?? "", /:error$/);
    pi.idle = true;
    session.onAgentSettled(true);
    await session.stop();
  });

  it("keeps the turn id through a reconnect: the start is reported again on the new epoch before the end", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    session.onAgentStart();
    await until("the start report", () => server.log.some((line) => line.startsWith("turn:start:e1")));
    server.reconnect();
    await until("the branch report on epoch 2", () => server.log.some((line) => line.startsWith("reportBranch:e2")));
    await until("the start again on epoch 2", () => server.log.some((line) => line.startsWith("turn:start:e2")));
    session.onAgentEnd([{ role: "assistant", stopReason: "stop" }]);
    await until("the end report", () => server.log.some((line) => line.startsWith("turn:end:e2")));
    const reports = server.ops("workflowTurn.report").map((call) => call.payload as { turnId: string; phase: string; coordinatorEpoch: number });
    assert.deepEqual(
      reports.map((report) => [report.phase, report.coordinatorEpoch]),
      [
        ["start", 1],
        ["start", 2],
        ["end", 2],
      ],
    );
    assert.equal(new Set(reports.map((report) => report.turnId)).size, 1);
    const log = server.log;
    assert.ok(index(log, /^reportBranch:e2/) < index(log, /^turn:start:e2/), log.join("\n"));
    await session.stop();
  });

  it("keeps the turn id through a server restart, whose epochs start at 1 again: the start is reported again on the new epoch before the end", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    session.onAgentStart();
    await until("the start report", () => server.log.some((line) => line.startsWith("turn:start:e1")));
    const mark = server.log.length;
    server.restart();
    await until("the branch report on the new server", () => server.log.slice(mark).some((line) => line.startsWith("reportBranch:e1")));
    await until("the start again on the new server", () => server.log.slice(mark).some((line) => line.startsWith("turn:start:e1")), 2_000);
    session.onAgentEnd([{ role: "assistant", stopReason: "stop" }]);
    await until("the end report", () => server.log.some((line) => line.startsWith("turn:end:e1")));
    const reports = server.ops("workflowTurn.report").map((call) => call.payload as { turnId: string; phase: string });
    assert.deepEqual(
      reports.map((report) => report.phase),
      ["start", "start", "end"],
    );
    assert.equal(new Set(reports.map((report) => report.turnId)).size, 1);
    await session.stop();
  });

  it("a turn the server says is not workflow work (absent) gets no end report", async () => {
    const { server, pi, session } = harness();
    server.turnOwnership = "absent";
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    session.onAgentStart();
    await until("the start report", () => server.log.some((line) => line.startsWith("turn:start")));
    session.onAgentEnd([{ role: "assistant", stopReason: "stop" }]);
    await session.tick();
    await settle();
    assert.equal(server.ops("workflowTurn.report").length, 1);
    await session.stop();
  });

  it("a turn with no open workflow message is not reported at all", async () => {
    const { server, session } = harness();
    await session.start();
    await until("the branch report", () => server.log.includes("reportBranch:e1:[]"));
    session.onAgentStart();
    session.onAgentEnd([{ role: "assistant", stopReason: "stop" }]);
    await session.tick();
    await settle();
    assert.equal(server.ops("workflowTurn.report").length, 0);
    assert.equal(session.turns.pending.length, 0);
    await session.stop();
  });
});

describe("session shutdown (DEFERRED_TURNS: a closing session cannot start another turn)", () => {
  const deferredTurn = {
    turnIntentId: `deferred-turn:${"a".repeat(64)}`,
    cause: "failed",
    stopsByDefault: false,
    presentation: { workflowName: "review", state: "failed", reasonKind: "nodeFailed", restart: { count: 0, limit: 3 } },
  };
  const failedRun = () => runView({ nodes: [node("draft", "agent", "failed")], display: { status: "failed", activity: "none", controls: ["restart"] } });
  /** Server operations that could end, pause or launch a run, and so create a turn intent or a turn. */
  const changing = (server: FakeServer): string[] =>
    server.calls.map((call) => call.operation).filter((operation) => /^(run\.|interaction\.|followUp\.)/.test(operation));

  it("a terminal fallback whose content read is in flight when session_shutdown begins is never sent, and nothing after the shutdown sends it", async () => {
    const { server, pi, session } = harness();
    server.run = failedRun();
    server.addMessage("terminal", "Workflow review ended: failed (run run-1).", { deferredTurn } as never);
    const read = server.readContent.bind(server);
    let release: (() => void) | undefined;
    let reads = 0;
    server.readContent = async (reference, options) => {
      reads++;
      if (reads === 1) await new Promise<void>((resolve) => (release = resolve));
      return read(reference, options);
    };
    await session.start();
    await until("the fallback's content read", () => release !== undefined);
    const before = server.log.length;
    await session.stop(); // session_shutdown began
    release?.();
    await settle();
    // Everything that used to wake a pass: a pushed change, a poll, a settled turn.
    server.changed();
    await session.tick();
    session.onAgentSettled(false);
    await settle();
    assert.deepEqual(pi.sent, [], "no fallback delivered after session_shutdown began");
    const after = server.log.slice(before);
    assert.deepEqual(after.filter((line) => line.startsWith("turn:") || line === "SEND"), [], after.join("\n"));
    assert.deepEqual(changing(server), [], "the shutdown asked the server for nothing that creates an intent");
  });

  it("a held launch is not activated and no turn starts once session_shutdown began, even when Pi goes idle", async () => {
    const { server, pi, session } = harness();
    server.run = runView({ nodes: [node("draft", "agent", "pending")], display: { status: "queued", activity: "none", controls: ["activate", "cancel"] } });
    pi.idle = false; // the decision turn that selected the launch is still running
    await session.start();
    await settle();
    assert.deepEqual(server.ops("run.activate"), [], "not during the turn");
    await session.stop();
    pi.idle = true;
    session.onAgentSettled(false);
    server.changed();
    await session.tick();
    await settle();
    assert.deepEqual(server.ops("run.activate"), [], "a closing session activates nothing");
    assert.deepEqual(pi.sent, []);
    assert.deepEqual(changing(server), []);
  });
});

describe("a surviving selected launch (DEFERRED_TURNS: session-start recovery activates it once)", () => {
  it("a new session start finds the held launch and activates it once, however many views arrive while the activation is in flight", async () => {
    const { server, pi, session } = harness();
    server.run = runView({ nodes: [node("draft", "agent", "pending")], display: { status: "queued", activity: "none", controls: ["activate", "cancel"] } });
    const request = server.request.bind(server);
    const gates: (() => void)[] = [];
    server.request = (async (operation: string, spec: never) => {
      if (operation === "run.activate") await new Promise<void>((resolve) => gates.push(resolve));
      return request(operation as never, spec);
    }) as typeof server.request;
    await session.start(); // Pi is idle: the session start offers the held run
    await until("the activation request", () => gates.length > 0);
    for (let view = 0; view < 5; view++) {
      server.changed();
      await session.tick();
      session.onAgentSettled(false);
      await settle();
    }
    assert.equal(gates.length, 1, "one activation in flight");
    for (const gate of gates) gate();
    await until("the activated run", () => session.source.current?.run?.display.status === "running");
    await session.tick();
    await settle();
    assert.deepEqual(
      server.ops("run.activate").map((call) => [call.runId, call.idempotencyKey]),
      [["run-1", "activate.run-1"]],
      "one activation, under the run's own key",
    );
    assert.deepEqual(pi.sent, [], "an activation is not a turn");
    await session.stop();
  });
});
