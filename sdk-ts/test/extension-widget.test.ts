/**
 * The widget's piw call to action (src/extension/widget.ts, reference §5.7):
 * while Herdr is available the widget names `Ctrl+Shift+R piw`, on the
 * scroll hint's line when node rows are hidden and on a line of its own
 * otherwise; without Herdr it never does.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { STRING_WIDGET_LINES, renderWidget } from "../src/extension/widget.js";
import type { RunView } from "../src/generated/types.js";
import { DECISION, ambiguousRun, node, runView } from "./extension-fakes.js";

const few = runView({ nodes: [node("draft", "compute", "completed"), node("review", "agent", "running")], display: { status: "running", activity: "modelTurn", controls: ["pause", "cancel"], currentNode: "review" } });
const many = runView({
  nodes: Array.from({ length: 14 }, (_, index) => node(`n${index}`, "compute", index < 7 ? "completed" : index === 7 ? "running" : "pending")),
  display: { status: "running", activity: "runner", controls: ["pause", "cancel"], currentNode: "n7" },
});

describe("the widget's Ctrl+Shift+R piw hint", () => {
  it("is a line of its own inside Herdr when every node row fits", () => {
    const { lines } = renderWidget(few, { nowMs: 2_000, maxLines: STRING_WIDGET_LINES, scroll: 0, piwHint: true });
    assert.deepEqual(lines.slice(1, 3).map((line) => line.trim().split(" ").at(-1)), ["draft", "review"], lines.join("\n"));
    assert.equal(lines.at(-1), "  Ctrl+Shift+R piw", lines.join("\n"));
  });

  it("shares the scroll hint's line inside Herdr when rows are hidden, within Pi's 10 lines", () => {
    const { lines, hiddenRows } = renderWidget(many, { nowMs: 2_000, maxLines: STRING_WIDGET_LINES, scroll: 0, piwHint: true });
    assert.ok(hiddenRows > 0);
    assert.equal(lines.length, STRING_WIDGET_LINES, lines.join("\n"));
    assert.match(lines.at(-1) ?? "", /^ {2}shift\+↑\/↓ scroll \(\d+ above, \d+ below\) · Ctrl\+Shift\+R piw$/, lines.join("\n"));
    assert.equal(lines.filter((line) => line.includes("Ctrl+Shift+R")).length, 1);
  });

  it("is absent outside Herdr, with or without hidden rows", () => {
    for (const view of [few, many]) {
      const { lines } = renderWidget(view, { nowMs: 2_000, maxLines: STRING_WIDGET_LINES, scroll: 0 });
      assert.ok(!lines.some((line) => line.includes("Ctrl+Shift+R")), lines.join("\n"));
    }
    assert.match(renderWidget(many, { nowMs: 2_000, maxLines: STRING_WIDGET_LINES, scroll: 0 }).lines.at(-1) ?? "", /^ {2}shift\+↑\/↓ scroll \(\d+ above, \d+ below\)$/);
  });
});

describe("the widget's call to action", () => {
  const render = (view: RunView): string[] => renderWidget(view, { nowMs: 2_000, maxLines: STRING_WIDGET_LINES, scroll: 0 }).lines;

  it("names /workflow answer for an ordinary checkpoint and for a protected human decision, with the decision's choices", () => {
    const checkpoint = runView({ nodes: [node("review", "checkpoint", "waiting")], display: { status: "waiting", activity: "none", controls: ["answer", "pause", "cancel"], waitingOn: "review" } });
    assert.equal(render(checkpoint).at(-1), "  waiting on checkpoint: review — answer with /workflow answer <json>");
    const decision = runView({
      nodes: [node("gate", "checkpoint", "waiting")],
      display: { status: "waiting", activity: "none", controls: ["humanAnswer", "pause", "cancel"], waitingOn: "gate" },
      decision: DECISION,
    });
    const lines = render(decision);
    assert.equal(lines.at(-1), "  waiting on decision: gate (Publish the release?) — answer with /workflow answer <choice> [text] (choices: ship, revise)", lines.join("\n"));
  });

  it("shows an ambiguous run's reason with the /workflow recover commands, never the wire operation", () => {
    const ambiguous = ambiguousRun([{ effectId: "effect-1", effectType: "mail.send", nodeId: "send", attemptNumber: 1 }]);
    const lines = render(ambiguous);
    assert.ok(!lines.some((line) => line.includes("effect.recover")), lines.join("\n"));
    assert.ok(lines.includes("  ⚠ mail.send at send may have applied: check it, then /workflow recover confirm|retry"), lines.join("\n"));
    // A run that ended can only record what happened.
    const ended = runView({ ...ambiguous, display: { ...ambiguous.display, status: "cancelled", controls: ["recoverEffect"] } });
    assert.ok(render(ended).includes("  ⚠ mail.send at send may have applied: check it, then /workflow recover confirm"), render(ended).join("\n"));
  });
});

describe("the widget's who-acts line (display.why)", () => {
  const render = (view: RunView): string[] => renderWidget(view, { nowMs: 2_000, maxLines: STRING_WIDGET_LINES, scroll: 0 }).lines;

  it("names who must act in one compact line when it is not the run's own runner and no answer or recovery line says so", () => {
    const parked = runView({
      nodes: [node("a", "compute", "pending")],
      display: {
        status: "queued", activity: "none", controls: ["pause", "resume", "cancel"],
        why: { state: "parkedForReview", actor: "operator", summary: "parked: the workflow source changed since the run started; an operator resumes it: `pi-workflows resume run-1`" },
      },
    });
    const lines = render(parked);
    assert.ok(lines.includes(`  who acts: an operator · parked for review (pi-workflows why ${parked.runId})`), lines.join("\n"));
    const checkpoint = runView({
      nodes: [node("review", "checkpoint", "waiting")],
      display: { status: "waiting", activity: "none", controls: ["answer", "pause", "cancel"], waitingOn: "review", why: { state: "waitingForAnswer", actor: "person", summary: "waiting for a person" } },
    });
    // The checkpoint's answer line already says who acts: no second line.
    const withAnswer = render(checkpoint);
    assert.ok(!withAnswer.some((line) => line.includes("who acts")), withAnswer.join("\n"));
    assert.equal(withAnswer.at(-1), "  waiting on checkpoint: review — answer with /workflow answer <json>");
  });

  it("says nothing while the run's runner drives it or nobody needs to act", () => {
    for (const actor of ["runner", "nobody"] as const) {
      const view = runView({ nodes: [node("a", "compute", "running")], display: { status: "running", activity: "runner", controls: ["pause", "cancel"], currentNode: "a", why: { state: "running", actor, summary: "running" } } });
      assert.ok(!render(view).some((line) => line.includes("who acts")), render(view).join("\n"));
    }
  });
});
