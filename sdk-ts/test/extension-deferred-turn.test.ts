/**
 * The terminal decision message (src/extension/deferred-turn.ts,
 * messages.ts; DEFERRED_TURNS "Compact TUI card"): a terminal message that
 * claimed a turn intent is sent as the visible `pi-workflows-deferred-turn`
 * follow-up with the intent's details, found again on the branch by its
 * message id; the collapsed card shows only sanitized detail fields, the
 * expanded card the whole content; invalid details draw a generic card.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { DEFERRED_TURN_SCHEMA, DEFERRED_TURN_TYPE, cardFields, deferredTurnCard, sanitize } from "../src/extension/deferred-turn.js";
import { branchIndex, deliveryOf } from "../src/extension/messages.js";
import type { WorkflowMessage } from "../src/generated/types.js";

const INTENT = `deferred-turn:${"a".repeat(64)}`;
const CONTENT = 'Workflow review ended: completed (run r-1).\n\nTerminal facts (…):\n{"input":{"task":"secret input"},"result":{"ok":true}}\n\nThis message comes from the workflow server.';

function terminal(extra: Partial<WorkflowMessage> = {}): WorkflowMessage {
  return {
    messageId: "terminal:r-1",
    runId: "r-1",
    kind: "terminal",
    state: "pending",
    order: 3,
    content: { digest: `sha256:${"b".repeat(64)}`, bytes: CONTENT.length, mediaType: "text/plain" },
    deferredTurn: {
      turnIntentId: INTENT,
      cause: "terminal",
      stopsByDefault: false,
      presentation: { workflowName: "review", state: "completed", restart: { count: 1, limit: 3 } },
    },
    ...extra,
  } as WorkflowMessage;
}

const plain = { accent: (text: string) => text, dim: (text: string) => text, bold: (text: string) => text };

describe("the deferred-turn message", () => {
  it("is the visible follow-up card with the intent's details, and the branch finds it by its message id", () => {
    const delivery = deliveryOf(terminal(), CONTENT);
    assert.equal(delivery.message.customType, DEFERRED_TURN_TYPE);
    assert.equal(delivery.message.display, true);
    assert.equal(delivery.triggerTurn, true);
    assert.equal(delivery.deliverAs, "followUp");
    assert.equal(delivery.message.content, CONTENT, "the model receives the whole content");
    assert.deepEqual(delivery.message.details, {
      schema: DEFERRED_TURN_SCHEMA,
      turnIntentId: INTENT,
      runId: "r-1",
      cause: "terminal",
      stopsByDefault: false,
      presentation: { workflowName: "review", state: "completed", restart: { count: 1, limit: 3 } },
      workflowMessageId: "terminal:r-1",
    });
    const index = branchIndex([{ type: "custom_message", id: "e-9", customType: DEFERRED_TURN_TYPE, details: delivery.message.details }]);
    assert.equal(index.get("terminal:r-1"), "e-9");
  });

  it("a terminal message without an intent stays the hidden terminal message", () => {
    const { deferredTurn: _omitted, ...bare } = terminal();
    const delivery = deliveryOf(bare as WorkflowMessage, CONTENT);
    assert.equal(delivery.message.customType, "pi-workflows-terminal");
    assert.equal(delivery.message.display, false);
    assert.equal(delivery.deliverAs, undefined);
  });

  it("collapsed shows the name, state, run and restart count, never the content; expanded shows the whole content", () => {
    const details = deliveryOf(terminal(), CONTENT).message.details;
    const collapsed = deferredTurnCard(details, CONTENT, false, plain);
    assert.match(collapsed[0] ?? "", /review · completed · run r-1 · restarts 1\/3/);
    const text = collapsed.join("\n");
    assert.ok(!text.includes("secret input") && !text.includes("Terminal facts") && !text.includes("workflow server"), text);
    const expanded = deferredTurnCard(details, CONTENT, true, plain).join("\n");
    for (const line of CONTENT.split("\n")) assert.ok(expanded.includes(line), `${line} in ${expanded}`);
  });

  it("sanitizes ANSI escapes and control characters in every field and in the expanded content", () => {
    const hostile = terminal({
      runId: "r-\u001b[31m1\u0007",
      deferredTurn: {
        turnIntentId: INTENT,
        cause: "failed",
        stopsByDefault: false,
        presentation: { workflowName: "re\u001b]0;title\u0007view\u0000", state: "failed", reasonKind: "nodeFailed", restart: { count: 0, limit: 3 } },
      },
    });
    const details = deliveryOf(hostile, CONTENT).message.details;
    const lines = deferredTurnCard(details, "line\u001b[2J one\u0008\nline two\u009b", true, plain);
    for (const line of lines) assert.ok(!/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/.test(line), JSON.stringify(line));
    assert.match(lines[0] ?? "", /review · failed \(nodeFailed\) · run r-1/);
    assert.equal(sanitize("a\tb"), "a  b");
  });

  it("missing or invalid details draw a safe generic card", () => {
    for (const details of [undefined, null, "x", { schema: "other" }, { schema: DEFERRED_TURN_SCHEMA, runId: "r", cause: "bogus" }]) {
      assert.equal(cardFields(details), undefined);
      const lines = deferredTurnCard(details, CONTENT, false, plain);
      assert.match(lines[0] ?? "", /workflow · a workflow message/);
      assert.ok(!lines.join("\n").includes("secret input"));
    }
  });
});
