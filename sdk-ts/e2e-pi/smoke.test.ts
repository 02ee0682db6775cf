/**
 * Smoke tests of the real-Pi harness: real Pi (scripts/install-pi.sh) with
 * the smoke extension, against the mock model, in rpc mode and in its TUI
 * through tmux. Run with `npm run test:pi`.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { describe, it } from "node:test";

import { queue, reply } from "../test-support/mock-model.js";
import { groupAlive, type PiRecord, piFixture } from "../test-support/pi.js";
import { SDK_DIR } from "../test-support/server.js";

const SMOKE_EXTENSION = join(SDK_DIR, "e2e-pi", "fixtures", "smoke-extension.ts");
const SLOW_TEXT = "This deliberately slow answer streams one short chunk at a time so that the test can interrupt it.";

type Rec<T extends PiRecord["type"]> = Extract<PiRecord, { type: T }>;
const is =
  <T extends PiRecord["type"]>(type: T) =>
  (record: PiRecord): record is Rec<T> =>
    record.type === type;

describe("real Pi in rpc mode", () => {
  it("runs the extension's tool for the model's tool call and sends its result back to the model", async (t) => {
    const { mock, spawnRpc } = await piFixture(t, {
      rules: [
        { name: "after-tool", lastRole: "tool", reply: reply.text("Tool finished.") },
        { name: "call-echo", when: "please echo", withTool: "smoke_echo", reply: reply.toolCall("smoke_echo", { text: "hello-rpc" }) },
      ],
    });
    const pi = await spawnRpc({ extensions: [SMOKE_EXTENSION] });

    assert.equal(await pi.prompt("please echo hello"), "started");
    const settled = await pi.waitSettled();
    assert.equal(settled.aborted, false);

    const toolEnd = await pi.waitFor(is("tool_execution_end"));
    assert.equal(toolEnd.toolName, "smoke_echo");
    assert.equal(toolEnd.isError, false);
    assert.deepEqual(mock.requests.map((r) => r.rule), ["call-echo", "after-tool"]);
    assert.ok(mock.requests[0]?.tools.includes("smoke_echo"), `offered tools: ${mock.requests[0]?.tools.join(",")}`);
    const toolResult = mock.requests[1]?.messages.find((m) => m.role === "tool");
    assert.equal(toolResult?.text, "ECHO:hello-rpc");
    const call = mock.requests[1]?.messages.find((m) => m.role === "assistant")?.toolCalls?.[0];
    assert.equal(call?.name, "smoke_echo");
    assert.equal(toolResult?.toolCallId, call?.id);
    assert.deepEqual(await pi.command({ type: "get_last_assistant_text" }), { text: "Tool finished." });

    const exit = await pi.stop();
    assert.deepEqual([exit.code, exit.forced, exit.leftoverGroup, exit.protocolErrors], [0, null, false, []]);
    assert.equal(groupAlive(pi.pid), false);
  });

  it("delivers a hidden custom message with triggerTurn to the model and settles the turn it starts", async (t) => {
    const { mock, spawnRpc } = await piFixture(t, {
      rules: [{ name: "hidden", when: "HIDDEN-NOTE-42", lastRole: "user", reply: reply.text("Seen the hidden note.") }],
    });
    const pi = await spawnRpc({ extensions: [SMOKE_EXTENSION] });

    assert.equal(await pi.prompt("/smoke hidden HIDDEN-NOTE-42"), "handled");
    const settled = await pi.waitSettled();
    assert.equal(settled.aborted, false);
    assert.equal(mock.requests.length, 1);
    assert.equal(mock.requests[0]?.last?.text, "HIDDEN-NOTE-42");

    const { entries } = await pi.getEntries();
    const custom = entries.filter((e) => e.type === "custom_message");
    assert.equal(custom.length, 1);
    assert.equal(custom[0]?.customType, "smoke-hidden");
    assert.equal(custom[0]?.display, false);
    assert.deepEqual(await pi.command({ type: "get_last_assistant_text" }), { text: "Seen the hidden note." });
  });

  it("aborts a turn mid-stream (clear_queue, then abort): agent_settled says aborted and the model's stream is cut", async (t) => {
    const { mock, spawnRpc } = await piFixture(t, { rules: queue(reply.text(SLOW_TEXT, { chunkChars: 4, delayMs: 100 })) });
    const pi = await spawnRpc({ extensions: [SMOKE_EXTENSION] });

    assert.equal(await pi.prompt("stream slowly"), "started");
    await pi.waitFor((r) => r.type === "message_update" && r.assistantMessageEvent.type === "text_delta", { what: "the first text delta" });
    assert.deepEqual(await pi.abort(), { steering: [], followUp: [] });
    const settled = await pi.waitSettled();
    assert.equal(settled.aborted, true);

    const end = await pi.waitFor(is("agent_end"));
    const lastAssistant = end.messages.filter((m) => m.role === "assistant").at(-1);
    assert.equal(lastAssistant?.role === "assistant" ? lastAssistant.stopReason : undefined, "aborted");
    const request = await mock.waitForRequest((r) => r.outcome !== "streaming", 5_000, "the stream to end");
    assert.equal(request.outcome, "clientClosed");
  });

  it("shows extension UI requests and takes dialog answers", async (t) => {
    const { spawnRpc } = await piFixture(t);
    const pi = await spawnRpc({ extensions: [SMOKE_EXTENSION] });

    assert.equal(await pi.prompt("/smoke widget hello-rpc"), "handled");
    const widget = await pi.waitForUi("setWidget");
    assert.deepEqual([widget.widgetKey, widget.widgetLines], ["smoke", ["smoke widget: hello-rpc"]]);

    const since = pi.mark();
    const asked = pi.prompt("/smoke ask");
    const select = await pi.waitForUi("select", { since });
    assert.deepEqual([select.title, select.options], ["Pick a side", ["left", "right"]]);
    pi.answerUi(select.id, { value: "right" });
    assert.equal(await asked, "handled");
    const notify = await pi.waitForUi("notify", { since });
    assert.equal(notify.message, "picked right");
    assert.deepEqual(pi.uiRequests().map((r) => r.method), ["setWidget", "select", "notify"]);
  });

  it("runs two Pi processes on one session file, and a restarted Pi continues the session with both turns", async (t) => {
    const { mock, spawnRpc } = await piFixture(t, { rules: [{ reply: reply.text("Noted.") }] });
    const first = await spawnRpc();
    const sessionFile = first.state?.sessionFile;
    assert.ok(sessionFile !== undefined, "get_state gave no session file");
    assert.equal(await first.prompt("turn from the first Pi"), "started");
    await first.waitSettled();

    const second = await spawnRpc({ args: ["--session", sessionFile] });
    assert.deepEqual([second.state?.sessionId, second.state?.sessionFile], [first.state?.sessionId, sessionFile]);
    assert.equal(await second.prompt("turn from the second Pi"), "started");
    await second.waitSettled();
    for (const pi of [first, second]) assert.equal((await pi.stop()).code, 0);

    const restarted = await spawnRpc({ args: ["--continue"] });
    assert.equal(restarted.state?.sessionFile, sessionFile);
    const { entries } = await restarted.getEntries();
    const userTexts = entries
      .filter((e) => e.type === "message" && (e.message as { role?: string }).role === "user")
      .map((e) => JSON.stringify((e.message as { content?: unknown }).content));
    assert.equal(userTexts.length, 2, userTexts.join(" | "));
    assert.match(userTexts[0] ?? "", /turn from the first Pi/);
    assert.match(userTexts[1] ?? "", /turn from the second Pi/);
    assert.equal(mock.requests.length, 2);
  });

  it("fails a wait at its deadline, and at once when Pi exits", async (t) => {
    const { spawnRpc } = await piFixture(t);
    const pi = await spawnRpc();

    await assert.rejects(pi.waitFor((r) => r.type === "compaction_start", { timeoutMs: 300, what: "a compaction" }), /timed out after 300 ms waiting for a compaction/);
    const pending = pi.waitFor((r) => r.type === "compaction_start", { timeoutMs: 60_000, what: "a compaction" });
    const exit = await pi.stop();
    assert.equal(exit.code, 0);
    await assert.rejects(pending, /Pi exited \(code 0/);
  });
});

describe("real Pi's TUI through tmux", () => {
  it("shows the extension's widget, and Escape aborts a slow stream", async (t) => {
    const { mock, startTui } = await piFixture(t, {
      rules: [{ name: "slow", when: "stream slowly", reply: reply.text(SLOW_TEXT, { chunkChars: 4, delayMs: 100 }) }],
    });
    const tui = await startTui({ extensions: [SMOKE_EXTENSION] });
    const { tmux } = tui;

    tmux.type("/smoke widget hello-tui");
    tmux.sendKeys("Enter");
    await tmux.waitForScreen(/smoke widget: hello-tui/);

    tmux.type("stream slowly");
    tmux.sendKeys("Enter");
    await tmux.waitForScreen(/This deliber/);
    tmux.sendKeys("Escape");
    await tmux.waitForScreen(/Operation aborted/);
    const request = await mock.waitForRequest((r) => r.outcome !== "streaming", 5_000, "the stream to end");
    assert.equal(request.outcome, "clientClosed");
    assert.doesNotMatch(tmux.capture(), /interrupt it\./, "the whole answer arrived despite Escape");

    await assert.rejects(tmux.waitForScreen(/never on screen/, 200), /timed out after 200 ms waiting for \/never on screen\/ on the screen:\n[^]*smoke widget: hello-tui/);
    const stop = await tui.stop();
    assert.deepEqual(stop, { status: 0, signal: null, forced: false });
  });
});
