/**
 * The `/workflow` grammar, the `workflow` tool's schema and strict parsing,
 * and what commands and tool calls send to the server (a fake server, a fake
 * Pi), with the reference texts (pi-workflows-behaviour.md §5.2, §5.3).
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { WorkflowClientError } from "../src/client/errors.js";
import { RESERVED_WORDS, parseWorkflowCommand } from "../src/extension/grammar.js";
import { WorkflowSession, keyOfToolCall } from "../src/extension/session.js";
import { ACTIONS, MAX_ISSUES, WORKFLOW_TOOL_PARAMETERS, parseToolCall } from "../src/extension/tool.js";
import { DECISION, FakePi, FakeServer, FakeUi, ambiguousRun, node, runView, settle, step, until } from "./extension-fakes.js";

describe("/workflow grammar", () => {
  it("parses every form", () => {
    const cases: [string, unknown][] = [
      ["", { kind: "list", offset: 0 }],
      ["list", { kind: "list", offset: 0 }],
      ["list 50", { kind: "list", offset: 50 }],
      ["status", { kind: "status" }],
      ["status run-1", { kind: "status", runId: "run-1" }],
      ["pause", { kind: "pause" }],
      ["resume", { kind: "resume" }],
      ["cancel", { kind: "cancel" }],
      ["clear", { kind: "clear" }],
      ["recover confirm", { kind: "recover", action: "confirm" }],
      ["recover retry effect-7", { kind: "recover", action: "retry", effectId: "effect-7" }],
      ["answer yes please", { kind: "answer", answer: { answer: "yes please" }, text: "yes please" }],
      ['answer {"ok": true}', { kind: "answer", answer: { ok: true }, text: '{"ok": true}' }],
      ['answer run-7 {"ok": true}', { kind: "answer", runId: "run-7", answer: { ok: true }, text: '{"ok": true}' }],
      ["answer run-7 yes", { kind: "answer", answer: { answer: "run-7 yes" }, text: "run-7 yes" }],
      ["answer 42", { kind: "answer", answer: 42, text: "42" }],
      ["review", { kind: "start", workflow: "review", input: {} }],
      ["review fix the login bug", { kind: "start", workflow: "review", input: { task: "fix the login bug" } }],
      ['review --input-json {"files": ["a.ts"]}', { kind: "start", workflow: "review", input: { files: ["a.ts"] } }],
      [".pi/workflows/clear.workflow.ts", { kind: "start", workflow: ".pi/workflows/clear.workflow.ts", input: {} }],
      ["then summarize the changes", { kind: "followUp", prompt: "summarize the changes" }],
      ["then cancel the release afterwards", { kind: "followUp", prompt: "cancel the release afterwards" }],
      ["then cancel 3f2a-9c", { kind: "cancelFollowUp", followUpId: "3f2a-9c" }],
    ];
    for (const [args, expected] of cases) assert.deepEqual(parseWorkflowCommand(args), expected, `/workflow ${args}`);
  });

  it("refuses malformed commands with their usage, and treats the reserved words as subcommands", () => {
    assert.deepEqual([...RESERVED_WORDS], ["list", "status", "pause", "resume", "cancel", "answer", "clear", "recover", "then"]);
    for (const [args, usage] of [
      ["list next", /Usage: \/workflow list \[offset\]/],
      ["status two words", /Usage: \/workflow status \[runId\]/],
      ["pause now", /Usage: \/workflow pause/],
      ["clear all", /Usage: \/workflow clear/],
      ["answer", /Usage: \/workflow answer \[runId\] <json\|text>/],
      ["recover", /Usage: \/workflow recover confirm\|retry \[effectId\]/],
      ["recover undo", /Usage: \/workflow recover confirm\|retry \[effectId\]/],
      ["recover retry e-1 e-2", /Usage: \/workflow recover confirm\|retry \[effectId\]/],
      ["review --input-json {broken", /the input is not valid JSON/],
      ["review --input-json", /the input is not valid JSON/],
      ["then", /Usage: \/workflow then <prompt>/],
      ["then cancel", /Usage: \/workflow then <prompt>/],
    ] as const) {
      const parsed = parseWorkflowCommand(args);
      assert.equal(parsed.kind, "error", args);
      assert.match((parsed as { message: string }).message, usage, args);
    }
  });
});

describe("workflow tool parameters", () => {
  it("are one flat object with an action enum and every other field optional (no oneOf)", () => {
    const schema = JSON.parse(JSON.stringify(WORKFLOW_TOOL_PARAMETERS)) as { type: string; required: string[]; properties: Record<string, { enum?: string[] }> };
    assert.equal(schema.type, "object");
    assert.deepEqual(schema.required, ["action"]);
    assert.deepEqual(schema.properties["action"]?.enum, [...ACTIONS]);
    assert.deepEqual(Object.keys(schema.properties).sort(), ["action", "attempt", "followUpId", "input", "offset", "output", "prompt", "runId", "step", "update", "workflow"]);
    assert.doesNotMatch(JSON.stringify(schema), /oneOf|anyOf|allOf/);
  });

  it("parses each action strictly and reports at most three issues", () => {
    assert.deepEqual(parseToolCall({ action: "list" }), { ok: true, call: { action: "list", offset: 0 } });
    assert.deepEqual(parseToolCall({ action: "start", workflow: "review" }), { ok: true, call: { action: "start", workflow: "review", input: {} } });
    assert.deepEqual(parseToolCall({ action: "submit", step: "draft", attempt: "att-1", output: { text: "x" } }), {
      ok: true,
      call: { action: "submit", step: "draft", attempt: "att-1", output: { text: "x" } },
    });
    assert.deepEqual(parseToolCall({ action: "start" }), { ok: false, error: 'Invalid workflow call for action "start": workflow: required.' });
    assert.deepEqual(parseToolCall({ action: "pause", runId: "run-1" }), { ok: false, error: 'Invalid workflow call for action "pause": runId: not allowed for this action.' });
    const many = parseToolCall({ action: "submit", workflow: "x", offset: 1, input: {}, runId: "r" });
    assert.equal(many.ok, false);
    const message = (many as { error: string }).error;
    assert.equal(message.split(";").length, MAX_ISSUES + 1, message);
    assert.match(message, /^Invalid workflow call for action "submit": step: required; attempt: required; output: required; and 4 more\.$/);
    assert.match((parseToolCall({ action: "fly" }) as { error: string }).error, /action must be one of list, start, status, pause, resume, cancel, restart, answer, followUp, cancelFollowUp, update, submit/);
    assert.deepEqual(parseToolCall({ action: "restart", runId: "run-1" }), { ok: true, call: { action: "restart", runId: "run-1" } });
    assert.deepEqual(parseToolCall({ action: "restart" }), { ok: false, error: 'Invalid workflow call for action "restart": runId: required.' });
    assert.deepEqual(parseToolCall({ action: "followUp", prompt: " next " }), { ok: true, call: { action: "followUp", prompt: "next" } });
    assert.deepEqual(parseToolCall({ action: "cancelFollowUp", followUpId: "fu-1" }), { ok: true, call: { action: "cancelFollowUp", followUpId: "fu-1" } });
    assert.match((parseToolCall({ action: "followUp", prompt: "" }) as { error: string }).error, /prompt: must be a prompt/);
    assert.match((parseToolCall({ action: "update", step: "s", attempt: "a", update: { type: "progress", key: "k", data: 3 } }) as { error: string }).error, /update: data must be a JSON object/);
    assert.match((parseToolCall({ action: "list", offset: -1 }) as { error: string }).error, /offset: must be a whole number/);
  });
});

function harness() {
  const server = new FakeServer();
  const pi = new FakePi();
  const ui = new FakeUi();
  const session = new WorkflowSession({
    server,
    pi,
    ui,
    sessionId: "session-1",
    projectPath: "/p",
    getLeafId: () => pi.leafId,
    pollMs: 0,
    entryWait: { attempts: 10, delayMs: 2 },
    now: () => 10_000,
  });
  return { server, pi, ui, session };
}

function waitingAgent(controls: string[]) {
  return runView({
    nodes: [node("draft", "agent", "waiting")],
    steps: { items: [step(1, "draft", 1_000, { attemptId: "att-1" })], total: 1 },
    display: { status: "waiting", activity: "none", controls: controls as never, waitingOn: "draft" },
  });
}

describe("/workflow commands", () => {
  it("list shows the project's workflows and how to start one", async () => {
    const { server, ui, session } = harness();
    await session.start();
    await session.command("list");
    assert.deepEqual(server.ops("workflows.list")[0]?.payload, { projectPath: "/p", offset: 0, limit: 50 });
    assert.equal(
      ui.lastNote,
      ["Workflows (1-2 of 2):", "  review — Review a change (/p/.pi/workflows/review.workflow.ts)", "  ship (/p/.pi/workflows/ship.workflow.ts)", "Start one with /workflow <name> [task]"].join("\n"),
    );
  });

  it("<name> task starts an interactive run of this session at once (not held)", async () => {
    const { server, ui, session } = harness();
    await session.start();
    await session.command("review fix the login bug");
    assert.deepEqual(server.ops("run.start")[0]?.payload, {
      workflow: "review",
      input: { task: "fix the login bug" },
      executionMode: "interactive",
      projectPath: "/p",
      originSessionId: "session-1",
    });
    assert.equal(ui.lastNote, "Workflow review started (run run-1). Follow it live with: pi-workflows view run-1");
    assert.deepEqual(server.ops("run.activate"), []);
  });

  it("pause, resume and cancel act on this session's run only when its view allows them", async () => {
    const { server, ui, session } = harness();
    server.run = waitingAgent(["pause", "cancel"]);
    await session.start();
    await session.command("resume");
    assert.equal(ui.lastNote, "Workflow review cannot resume now: it is waiting (allowed: pause, cancel).");
    assert.equal(server.ops("run.resume").length, 0);
    await session.command("pause");
    assert.equal(ui.lastNote, "Pausing workflow review (run run-1): the current step finishes first. /workflow resume continues it.");
    assert.deepEqual(server.ops("run.pause").map((call) => call.runId), ["run-1"]);
    server.setRun({ ...(server.run as NonNullable<typeof server.run>), display: { status: "paused", activity: "none", controls: ["resume", "cancel"] } });
    await session.command("resume");
    assert.equal(ui.lastNote, "Workflow review resumed (run run-1).");
    await session.command("cancel");
    assert.equal(ui.lastNote, "Workflow review cancelled (run run-1).");
    assert.deepEqual(server.ops("run.cancel").map((call) => call.payload), [{ by: "user" }], "a person's cancel: the run's turn intent is `cancelled`");
  });

  it("cancel with only a finished run in view clears it; with nothing it says no workflow is running", async () => {
    const { server, ui, session } = harness();
    server.run = runView({ display: { status: "completed", activity: "none", controls: [] } });
    await session.start();
    await session.command("cancel");
    assert.equal(ui.lastNote, "Cleared the finished workflow review (run run-1) from this session's view.");
    assert.equal(server.ops("sessionView.clearTerminal").length, 1);
    await session.command("cancel");
    assert.equal(ui.lastNote, "No workflow is running.");
  });

  it("answer sends a checkpoint answer to the waiting run; a protected decision is refused", async () => {
    const { server, ui, session } = harness();
    server.run = runView({ nodes: [node("approve", "checkpoint", "completed")], display: { status: "waiting", activity: "none", controls: ["answer", "cancel"], waitingOn: "approve" } });
    await session.start();
    await session.command("answer ship it");
    assert.deepEqual(server.ops("checkpoint.answer")[0], { operation: "checkpoint.answer", payload: { answer: { answer: "ship it" } }, runId: "run-1" });
    assert.equal(ui.lastNote, "Answered workflow review at approve (run run-1); it continues as run run-1-cont.");
    server.setRun(runView({ display: { status: "waiting", activity: "none", controls: ["humanAnswer", "cancel"], waitingOn: "approve" }, decision: DECISION }));
    await session.command("answer yes");
    assert.equal(ui.lastNote, "Answer with one of the choices: /workflow answer <choice> [text…] (choices: ship, revise)");
    assert.equal(server.ops("checkpoint.answer").length, 1, "a protected decision is never answered with checkpoint.answer");
    assert.equal(server.ops("decision.answer").length, 0);
  });

  it("answer on a protected decision sends decision.answer with the shown digest, the choice, its text and the session as the Pi source", async () => {
    const { server, ui, session } = harness();
    server.run = runView({ display: { status: "waiting", activity: "none", controls: ["humanAnswer", "cancel"], waitingOn: "gate" }, decision: DECISION });
    await session.start();
    await session.command("answer ship now");
    assert.equal(ui.lastNote, "The choice ship takes no text; answer with the choice alone.");
    await session.command("answer revise");
    assert.equal(ui.lastNote, "The choice revise needs text (What should change?): /workflow answer revise <text>");
    assert.equal(server.ops("decision.answer").length, 0, "refused locally: nothing sent");
    await session.command("answer revise fix the changelog");
    assert.deepEqual(server.ops("decision.answer")[0], {
      operation: "decision.answer",
      runId: "run-1",
      payload: {
        decisionId: DECISION.decisionId,
        requestDigest: DECISION.requestDigest,
        choice: "revise",
        input: { change: "fix the changelog" },
        source: { channel: "pi", actorId: "session-1" },
      },
    });
    assert.equal(ui.lastNote, "Answered workflow review at gate (run run-1); it continues as run continuation-run-1.");
    await session.command('answer {"choice": "ship"}');
    assert.deepEqual((server.ops("decision.answer")[1]?.payload as { choice: string; input: unknown }).input, null);
    assert.equal(server.ops("checkpoint.answer").length, 0);
  });

  it("recover confirm|retry sends effect.recover for the view's ambiguous effect, only while the view offers recoverEffect; retry warns that a duplicate is possible", async () => {
    const { server, ui, session } = harness();
    server.run = ambiguousRun([{ effectId: "effect-1", effectType: "mail.send", nodeId: "send", attemptNumber: 1 }]);
    await session.start();
    await session.command("recover confirm");
    assert.deepEqual(server.ops("effect.recover")[0], { operation: "effect.recover", runId: "run-1", payload: { effectId: "effect-1", action: "confirm" } });
    assert.deepEqual(ui.notes.at(-1), {
      message: "Confirmed effect mail.send at send (effect effect-1) of workflow review (run run-1): recorded as applied.",
      level: "info",
    });
    server.effectRecoverWarning = "a duplicate is possible (fake)";
    await session.command("recover retry effect-1");
    assert.deepEqual(server.ops("effect.recover")[1]?.payload, { effectId: "effect-1", action: "retry" });
    assert.deepEqual(ui.notes.at(-1), {
      message: "Effect mail.send at send (effect effect-1) of workflow review (run run-1) will be applied again as attempt 2. Warning: a duplicate is possible (fake)",
      level: "warning",
    });
    // Not offered: nothing is sent.
    server.setRun(runView({ display: { status: "running", activity: "runner", controls: ["pause", "cancel"], currentNode: "send" } }));
    await session.command("recover confirm");
    assert.deepEqual(ui.notes.at(-1), { message: "Workflow review cannot recover an effect now: it is running (allowed: pause, cancel).", level: "warning" });
    assert.equal(server.ops("effect.recover").length, 2);
  });

  it("recover without an effect id names the effects when there are several, and refuses an id the view does not show", async () => {
    const { server, ui, session } = harness();
    server.run = ambiguousRun([
      { effectId: "effect-1", effectType: "mail.send", nodeId: "send", attemptNumber: 1 },
      { effectId: "effect-2", effectType: "http.post", nodeId: "notify", attemptNumber: 2 },
    ]);
    await session.start();
    await session.command("recover retry");
    assert.deepEqual(ui.notes.at(-1), {
      message: "Workflow review (run run-1) has 2 ambiguous effects (effect-1, effect-2); name one: /workflow recover confirm|retry <effectId>",
      level: "warning",
    });
    await session.command("recover confirm effect-9");
    assert.deepEqual(ui.notes.at(-1), {
      message: "Workflow review (run run-1) has no ambiguous effect effect-9 (ambiguous: effect-1, effect-2).",
      level: "warning",
    });
    assert.equal(server.ops("effect.recover").length, 0);
    await session.command("recover confirm effect-2");
    assert.deepEqual(server.ops("effect.recover")[0]?.payload, { effectId: "effect-2", action: "confirm" });
  });

  it("status of an ambiguous run names /workflow recover, not the wire operation", async () => {
    const { server, ui, session } = harness();
    server.run = ambiguousRun([{ effectId: "effect-1", effectType: "mail.send", nodeId: "send", attemptNumber: 1 }]);
    await session.start();
    await session.command("status");
    const note = ui.lastNote ?? "";
    assert.match(note, /\n {2}reason: An external effect \(mail\.send at send, attempt 1\) may have applied without a receipt; check the external system, then \/workflow recover confirm \(it applied\) or \/workflow recover retry \(apply it again: a duplicate is possible\)\.\n/);
    assert.doesNotMatch(note, /effect\.recover/);
  });

  it("status summarizes the server's view", async () => {
    const { server, ui, session } = harness();
    server.run = waitingAgent(["pause", "cancel"]);
    await session.start();
    await session.command("status");
    assert.equal(
      ui.lastNote,
      ["Workflow review [waiting] (run run-1)", "  waiting on: draft", "  steps: 1; updates: 0", "  started: 1970-01-01T00:00:01.000Z", "  controls: pause, cancel"].join("\n"),
    );
  });

  it("a server that cannot be reached is one clear error", async () => {
    const { server, ui, session } = harness();
    server.down = true;
    await session.start();
    await session.command("list");
    assert.deepEqual(ui.notes.at(-1), { message: "the pi-workflows server is not running (fake)", level: "error" });
  });

  it("recovery makes one connection attempt at a time (only session_start may start the server) and keeps one subscription", async () => {
    const { server, session } = harness();
    server.down = true;
    await Promise.all([session.start(), session.tick(), session.tick()]);
    // One attempt was in flight; the ticks joined it.
    assert.deepEqual(server.log.filter((entry) => entry.startsWith("connect")), ["connect:start"]);
    await session.tick();
    await session.tick();
    assert.deepEqual(server.log.filter((entry) => entry.startsWith("connect")), ["connect:start", "connect:noStart", "connect:noStart"]);
    server.down = false;
    await Promise.all([session.tick(), session.tick(), session.tick()]);
    await settle();
    await session.tick();
    await settle();
    assert.equal(server.log.filter((entry) => entry.startsWith("connect")).length, 4, server.log.join(" "));
    assert.equal(server.subscriptions.length, 1, server.log.join(" "));
    assert.ok(session.view !== undefined, "the view was read once the server was back");
  });

  it("status while the server cannot be reached says so, and never shows the last run as current", async () => {
    const { server, ui, session } = harness();
    server.run = waitingAgent(["pause", "cancel"]);
    await session.start();
    server.down = true;
    server.close();
    await session.command("status");
    assert.deepEqual(ui.notes.at(-1), { message: "The pi-workflows server is unavailable (the pi-workflows server is not running (fake)); status shows again once it is back.", level: "warning" });
  });
});

describe("workflow tool", () => {
  it("start saves a held run before it answers queued, and the run is activated only once Pi is idle", async () => {
    const { server, pi, session } = harness();
    await session.start();
    pi.idle = false; // inside the model's turn
    const outcome = await session.tool("call_mock_1", { action: "start", workflow: "review", input: { task: "x" } });
    assert.deepEqual(outcome, { text: "Workflow review queued (run run-1).", details: { action: "start", workflow: "review", runId: "run-1", queued: true }, isError: false });
    const start = server.ops("run.start")[0];
    assert.deepEqual(start?.payload, { workflow: "review", input: { task: "x" }, executionMode: "interactive", projectPath: "/p", originSessionId: "session-1", held: true });
    assert.equal(start?.idempotencyKey, keyOfToolCall("call_mock_1"));
    assert.match(start?.idempotencyKey ?? "", /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/);
    await session.tick();
    await settle();
    assert.deepEqual(server.ops("run.activate"), [], "activated during the turn");
    pi.idle = true;
    session.onAgentSettled(false);
    await until("the activation", () => server.ops("run.activate").length === 1);
    assert.equal(server.ops("run.activate")[0]?.runId, "run-1");
  });

  it("cancel tells the server the model cancelled (its turn intent is agentCancelled)", async () => {
    const { server, session } = harness();
    server.run = waitingAgent(["pause", "cancel"]);
    await session.start();
    const outcome = await session.tool("call_c", { action: "cancel" });
    assert.equal(outcome.isError, false, outcome.text);
    assert.deepEqual(
      server.ops("run.cancel").map((call) => [call.runId, call.payload]),
      [["run-1", { by: "agent" }]],
    );
  });

  it("restart outside a decision turn is a held restart; a refusal names the server's restart rule", async () => {
    const { server, session } = harness();
    await session.start();
    const outcome = await session.tool("call_r", { action: "restart", runId: "run-9" });
    assert.equal(outcome.isError, false, outcome.text);
    assert.match(outcome.text, /^Workflow run run-9 restarted as run run-1; it starts after this turn ends\.$/);
    const restart = server.ops("run.restart")[0];
    assert.deepEqual(restart?.payload, { held: true });
    assert.equal(restart?.runId, "run-9");
    assert.equal(restart?.idempotencyKey, keyOfToolCall("call_r"));
  });

  it("in a terminal message's turn, restart and start carry that message as their selected launch; the server's refusal of a second launch is a clear error", async () => {
    const { server, pi, session } = harness();
    const terminal = server.addMessage("terminal", "Workflow fails ended: failed", { state: "sent", runId: "run-9" });
    await session.start();
    pi.idle = false;
    session.onAgentStart(); // the terminal message's decision turn (the server answers active)
    const restarted = await session.tool("call_r", { action: "restart", runId: "run-9" });
    assert.equal(restarted.isError, false, restarted.text);
    assert.match(restarted.text, /This was this turn's one workflow launch: end your turn now\.$/);
    assert.deepEqual(server.ops("run.restart")[0]?.payload, { held: true, selectedLaunch: { messageId: terminal.messageId, toolCallId: keyOfToolCall("call_r") } });
    server.failing.set("run.start", new WorkflowClientError("conflict", "this workflow decision turn already selected its one launch (a restart or a start); it runs after the turn ends, so end your turn now"));
    const second = await session.tool("call_s", { action: "start", workflow: "review" });
    assert.equal(second.isError, true);
    assert.match(second.text, /^Not launched: this workflow decision turn already selected its one launch/);
  });

  it("followUp queues a prompt on this session's run and cancelFollowUp cancels it, each keyed by its tool call", async () => {
    const { server, session } = harness();
    await session.start();
    await session.tool("call_s", { action: "start", workflow: "review" });
    const added = await session.tool("call_f", { action: "followUp", prompt: "then write the notes" });
    assert.equal(added.isError, false, added.text);
    assert.match(added.text, /^Follow-up fu-\d+ queued: it runs in this session after workflow run run-1 completes/);
    const add = server.ops("followUp.add")[0];
    assert.deepEqual(add?.payload, { prompt: "then write the notes" });
    assert.equal(add?.runId, "run-1");
    assert.equal(add?.idempotencyKey, keyOfToolCall("call_f"));
    const followUpId = added.details["followUpId"] as string;
    const cancelled = await session.tool("call_c", { action: "cancelFollowUp", followUpId });
    assert.equal(cancelled.text, `Follow-up ${followUpId} cancelled.`);
    assert.deepEqual(server.ops("followUp.cancel")[0]?.payload, { followUpId });
  });

  it("submit outside a step, with a wrong step or a stale attempt gets the reference errors", async () => {
    const { server, session } = harness();
    await session.start();
    assert.equal((await session.tool("c1", { action: "submit", step: "draft", attempt: "att-1", output: {} })).text, "No workflow step is awaiting output. Do not call the workflow tool outside an active workflow step.");
    server.setRun(waitingAgent(["submit", "update", "pause", "cancel"]));
    assert.equal((await session.tool("c2", { action: "submit", step: "review", attempt: "att-1", output: {} })).text, 'Wrong step id "review"; the pending step is "draft".');
    assert.equal((await session.tool("c3", { action: "submit", step: "draft", attempt: "att-0", output: {} })).text, 'Stale attempt id "att-0". Use the attempt id from the latest step contract.');
    assert.equal(server.ops("interaction.submit").length, 0);
  });

  it("submit is reported unavailable, not accepted, while the server does not offer it", async () => {
    const { server, session } = harness();
    server.run = waitingAgent(["pause", "cancel"]);
    await session.start();
    const outcome = await session.tool("c1", { action: "submit", step: "draft", attempt: "att-1", output: { text: "done" } });
    assert.deepEqual(outcome, {
      text: "Workflow step draft is waiting, but this pi-workflows server does not accept step output yet (interaction.submit is unavailable). The step stays pending.",
      details: { action: "submit", step: "draft" },
      isError: true,
    });
    assert.equal(server.ops("interaction.submit").length, 0);
  });

  it("submit sends interaction.submit with the tool-call id as idempotency key; acceptance says to end the turn and drops later text", async () => {
    const { server, session } = harness();
    server.run = waitingAgent(["submit", "update", "pause", "cancel"]);
    server.addMessage("step", "Do it", { state: "sent", interactionId: "int-1", attemptId: "att-1", nodeId: "draft" });
    await session.start();
    const outcome = await session.tool("call_mock_7", { action: "submit", step: "draft", attempt: "att-1", output: { text: "done" } });
    assert.deepEqual(outcome, {
      text: "Output accepted for step draft. If the workflow continues, the next step arrives as a new workflow message. End your turn now.",
      details: { action: "submit", step: "draft", accepted: true },
      isError: false,
    });
    const call = server.ops("interaction.submit")[0];
    assert.equal(call?.runId, "run-1");
    assert.equal(call?.idempotencyKey, keyOfToolCall("call_mock_7"));
    assert.deepEqual(call?.payload, { interactionId: "int-1", attemptId: "att-1", submissionId: keyOfToolCall("call_mock_7", "sub"), output: { text: "done" }, authority: { kind: "coordinator", sessionId: "session-1", coordinatorEpoch: 1 } });
    assert.equal(session.suppressesTail, true);
    session.onAgentStart();
    assert.equal(session.suppressesTail, false);
  });

  it("a rejected submission returns the stored error and keeps the step pending", async () => {
    const { server, session } = harness();
    server.run = waitingAgent(["submit", "update", "pause", "cancel"]);
    server.addMessage("step", "Do it", { state: "sent", interactionId: "int-1", attemptId: "att-1" });
    server.submitOutcome = { outcome: "rejected", message: "text must not be empty" };
    await session.start();
    const outcome = await session.tool("c1", { action: "submit", step: "draft", attempt: "att-1", output: { text: "" } });
    assert.equal(outcome.text, "Output rejected for step draft: text must not be empty");
    assert.equal(outcome.isError, true);
    assert.equal(session.suppressesTail, false);
  });

  it("update sends interaction.update with the tool-call id as its key", async () => {
    const { server, session } = harness();
    server.run = waitingAgent(["submit", "update", "cancel"]);
    server.addMessage("step", "Do it", { state: "sent", interactionId: "int-1", attemptId: "att-1" });
    await session.start();
    const outcome = await session.tool("c9", { action: "update", step: "draft", attempt: "att-1", update: { type: "progress", key: "overall", data: { status: "running" } } });
    assert.equal(outcome.text, "Update progress/overall recorded for step draft (seq 9). The step stays open.");
    assert.deepEqual(server.ops("interaction.update")[0]?.payload, {
      interactionId: "int-1",
      attemptId: "att-1",
      toolCallId: keyOfToolCall("c9"),
      update: { type: "progress", key: "overall", data: { status: "running" } },
      authority: { kind: "coordinator", sessionId: "session-1", coordinatorEpoch: 1 },
    });
  });

  it("submit and update without a coordinator epoch are refused with the reason and send nothing", async () => {
    const { server, session } = harness();
    server.grantsEpochs = false;
    server.run = waitingAgent(["submit", "update", "cancel"]);
    server.addMessage("step", "Do it", { state: "sent", interactionId: "int-1", attemptId: "att-1" });
    await session.start();
    const submitted = await session.tool("c10", { action: "submit", step: "draft", attempt: "att-1", output: { text: "done" } });
    assert.equal(submitted.isError, true);
    assert.match(submitted.text, /granted it no coordinator epoch/);
    const updated = await session.tool("c11", { action: "update", step: "draft", attempt: "att-1", update: { type: "progress", key: "overall", data: {} } });
    assert.equal(updated.isError, true);
    assert.deepEqual([server.ops("interaction.submit").length, server.ops("interaction.update").length], [0, 0]);
  });

  it("answer is refused for a protected decision with the reference text", async () => {
    const { server, session } = harness();
    server.run = runView({ display: { status: "waiting", activity: "none", controls: ["humanAnswer"], waitingOn: "gate" } });
    await session.start();
    const outcome = await session.tool("c1", { action: "answer", input: { choice: "yes" } });
    assert.equal(outcome.text, "This checkpoint requires a verified human answer from Pi UI or a configured decision channel.");
    assert.equal(outcome.isError, true);
  });
});
