/**
 * The widget's piw call to action (src/extension/widget.ts, reference §5.7):
 * while Herdr is available the widget names `Ctrl+Shift+R piw`, on the
 * scroll hint's line when node rows are hidden and on a line of its own
 * otherwise; without Herdr it never does.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { STRING_WIDGET_LINES, renderWidget } from "../src/extension/widget.js";
import { node, runView } from "./extension-fakes.js";

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
