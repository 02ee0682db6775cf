/**
 * Session capture (src/extension/capture.ts) through the WorkflowSession
 * that wires it, against the fake server's model of `sessionEvents.record`
 * (kernel::capture's numbering, adoption and authority rules): only a turn
 * the server accepts as workflow work is captured, numbered run-wide from 1;
 * a failed batch is resent unchanged; a new process learns where the
 * numbering stands; batches and the held events are bounded.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { MAX_PENDING } from "../src/extension/capture.js";
import { WorkflowSession } from "../src/extension/session.js";
import type { SessionEvent } from "../src/generated/types.js";
import { FakePi, FakeServer, FakeUi, node, runView, settle, step, until } from "./extension-fakes.js";

function harness(server = new FakeServer()) {
  const pi = new FakePi();
  const ui = new FakeUi();
  server.run = runView({ nodes: [node("draft", "agent", "waiting")], steps: { items: [step(1, "draft", 1_000, { attemptId: "att-1" })], total: 1 }, display: { status: "waiting", activity: "none", controls: ["pause", "cancel"], waitingOn: "draft" } });
  const session = new WorkflowSession({ server, pi, ui, sessionId: "session-1", projectPath: "/p", getLeafId: () => pi.leafId, pollMs: 0, entryWait: { attempts: 100, delayMs: 2 }, now: () => 10_000 });
  return { server, pi, session };
}

/** One Pi agent run with a tool call, as Pi's events come. */
function turnEvents(session: WorkflowSession, marker: string): void {
  session.onPiEvent("message_started", { role: "assistant" });
  session.onPiEvent("tool_execution_started", { toolCallId: `call-${marker}`, toolName: "workflow", args: { action: "status" } });
  session.onPiEvent("tool_execution_finished", { toolCallId: `call-${marker}`, toolName: "workflow", isError: false, result: { text: marker } });
  session.onPiEvent("message_finished", { role: "assistant", message: { text: marker } });
  session.onPiEvent("model_call_finished", { turnIndex: 0, messageEntryId: `entry-${marker}`, toolResultEntryIds: [] });
}

const TURN_TYPES = ["turn_started", "message_started", "tool_execution_started", "tool_execution_finished", "message_finished", "model_call_finished", "turn_finished"];

const seqs = (events: readonly SessionEvent[]): number[] => events.map((event) => event.seq);

describe("session capture", () => {
  it("records a workflow turn's events only after the active receipt, numbered from 1 in event order, without sending from Pi's handlers", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    session.onAgentStart();
    turnEvents(session, "one");
    assert.equal(server.captureCalls.length, 0, "Pi's handlers only append: nothing is sent before the server's answer about the turn");
    session.onAgentEnd([{ role: "assistant", stopReason: "stop" }]);
    session.onAgentSettled(false);
    await until("the turn's events stored", () => (server.captured.get("run-1")?.length ?? 0) === TURN_TYPES.length);
    const stored = server.captured.get("run-1") ?? [];
    assert.deepEqual(stored.map((event) => event.type), TURN_TYPES);
    assert.deepEqual(seqs(stored), [1, 2, 3, 4, 5, 6, 7]);
    const turnId = server.ops("workflowTurn.report").map((call) => (call.payload as { turnId: string }).turnId)[0];
    assert.deepEqual(stored[0]?.data, { turnId, startLeaf: "entry1" }, "the leaf the turn started after");
    assert.deepEqual(stored.at(-1)?.data, { turnId, aborted: false });
    assert.ok(server.captureCalls.every((call) => call.sessionId === "session-1" && call.runId === "run-1"));
    // A second workflow turn continues the run's numbering.
    session.onAgentStart();
    turnEvents(session, "two");
    session.onAgentSettled(false);
    await until("the second turn stored", () => (server.captured.get("run-1")?.length ?? 0) === 2 * TURN_TYPES.length);
    assert.deepEqual(seqs(server.captured.get("run-1") ?? []), Array.from({ length: 14 }, (_, index) => index + 1));
    assert.equal(session.capture.pendingEvents, 0);
    await session.stop();
  });

  it("never captures a turn the server says is not workflow work", async () => {
    const { server, pi, session } = harness();
    server.turnOwnership = "absent";
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    session.onAgentStart();
    turnEvents(session, "one");
    session.onAgentEnd([{ role: "assistant", stopReason: "stop" }]);
    session.onAgentSettled(false);
    await until("the start report", () => server.ops("workflowTurn.report").length === 1);
    await session.tick();
    await settle();
    assert.deepEqual([server.captureCalls.length, session.capture.pendingEvents], [0, 0]);
    await session.stop();
  });

  it("resends a batch that got no answer unchanged across a reconnect, and the server adopts it once", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    server.captureFailures = 1_000_000;
    session.onAgentStart();
    turnEvents(session, "one");
    await until("a failed batch", () => server.captureCalls.length >= 1);
    server.captureFailures = 0;
    server.reconnect();
    await until("the batch stored", () => (server.captured.get("run-1")?.length ?? 0) > 0);
    const [failed, ...again] = server.captureCalls;
    assert.ok(again.length >= 1);
    for (const call of again) assert.deepEqual(call, failed, "every resend has the same numbers and content");
    session.onAgentSettled(false);
    await until("the turn stored", () => (server.captured.get("run-1")?.length ?? 0) === TURN_TYPES.length);
    assert.deepEqual(seqs(server.captured.get("run-1") ?? []), [1, 2, 3, 4, 5, 6, 7], "no duplicate, no gap");
    await session.stop();
  });

  it("a new process reads where the run's numbering stands, and a gap or a conflict makes it read again and renumber", async () => {
    const server = new FakeServer();
    const earlier = Array.from({ length: 300 }, (_, index) => ({ seq: index + 1, type: "message_finished", data: { n: index + 1 } }));
    server.captured.set("run-1", earlier);
    const { pi, session } = harness(server);
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    session.onAgentStart();
    turnEvents(session, "one");
    await until("the first batch stored", () => (server.captured.get("run-1")?.length ?? 0) > 300);
    assert.equal(server.log.filter((line) => line === "page:sessionEvents").length, 2, "two pages of at most 256 were read");
    assert.equal(server.captureCalls[0]?.events[0]?.seq, 301);
    // Another process recorded 3 events meanwhile: the next batch conflicts, is renumbered after them, and nothing is lost.
    await until("the turn's events so far", () => (server.captured.get("run-1")?.length ?? 0) === 306);
    const stored = server.captured.get("run-1") ?? [];
    for (let n = 1; n <= 3; n++) stored.push({ seq: stored.length + 1, type: "message_finished", data: { other: n } });
    session.onAgentSettled(false);
    await until("the turn's end stored", () => (server.captured.get("run-1") ?? []).some((event) => event.type === "turn_finished"));
    const after = server.captured.get("run-1") ?? [];
    assert.deepEqual(seqs(after), Array.from({ length: 310 }, (_, index) => index + 1));
    assert.deepEqual(after.at(-1)?.type, "turn_finished");
    assert.equal(server.log.filter((line) => line === "page:sessionEvents").length, 4, "the conflict made it read the stored count again");
    await session.stop();
  });

  it("is bounded: batches of at most 256 events, at most MAX_PENDING held, and what was dropped is recorded as one events_dropped event", async () => {
    const { server, pi, session } = harness();
    server.addMessage("step", "Step text");
    await session.start();
    await until("the send", () => pi.sent.length === 1);
    server.captureFailures = 1_000_000;
    session.onAgentStart();
    for (let index = 0; index < MAX_PENDING + 100; index++) session.onPiEvent("message_started", { role: "assistant", index });
    assert.equal(session.capture.pendingEvents, MAX_PENDING);
    assert.equal(session.capture.droppedEvents, 101, "the turn's start and 4,095 events are held; 101 are dropped");
    server.captureFailures = 0;
    await session.tick();
    await until("the held events stored", () => (server.captured.get("run-1")?.length ?? 0) === MAX_PENDING);
    session.onAgentSettled(false);
    await until("the end stored", () => (server.captured.get("run-1")?.length ?? 0) === MAX_PENDING + 2);
    const stored = server.captured.get("run-1") ?? [];
    assert.deepEqual(stored.slice(-2).map((event) => [event.type, event.data]), [
      ["events_dropped", { count: 101 }],
      ["turn_finished", { turnId: (stored[0]?.data as { turnId: string }).turnId, aborted: false }],
    ]);
    assert.ok(server.captureCalls.every((call) => call.events.length <= 256), "every batch holds at most 256 events");
    await session.stop();
  });
});
