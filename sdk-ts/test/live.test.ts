/**
 * LiveRunView and applyPatch: the same cases as the Rust client's
 * `server::live` tests, so both clients fold snapshots and patches alike.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { LiveRunView, LiveViewError } from "../src/client/index.js";
import type { ClientEvent, PatchOp, RunView } from "../src/generated/types.js";

function snapshot(revision: number): ClientEvent {
  const view = {
    revision,
    display: { status: "running" },
    steps: { items: [{ seq: 1 }], total: 1 },
    nodes: [{ id: "a" }],
  } as unknown as RunView;
  return { kind: "runViewSnapshot", view };
}

const patch = (baseRevision: number, ops: PatchOp[]): ClientEvent => ({ kind: "runViewPatch", runId: "r", baseRevision, ops });

describe("LiveRunView", () => {
  it("applies patches in order on their base", () => {
    const live = new LiveRunView();
    live.apply(snapshot(3));
    live.apply(
      patch(3, [
        { op: "replace", path: "/display/status", value: "paused" },
        { op: "append", path: "/steps/items", value: { seq: 2 } },
        { op: "replace", path: "/steps/total", value: 2 },
        { op: "add", path: "/title", value: "t" },
        { op: "replace", path: "/nodes/0", value: { id: "a", state: "completed" } },
        { op: "replace", path: "/revision", value: 4 },
      ]),
    );
    const view = live.view as unknown as Record<string, any>;
    assert.equal(view["display"].status, "paused");
    assert.equal(view["steps"].items[1].seq, 2);
    assert.equal(view["nodes"][0].state, "completed");
    assert.equal(live.revision, 4);
    live.apply(
      patch(4, [
        { op: "remove", path: "/title" },
        { op: "replace", path: "/revision", value: 5 },
      ]),
    );
    assert.equal("title" in (live.view as object), false);
  });

  it("refuses a patch on another base and changes nothing", () => {
    const live = new LiveRunView();
    const next = patch(3, [{ op: "replace", path: "/revision", value: 4 }]);
    assert.throws(() => live.apply(next), (error: unknown) => error instanceof LiveViewError && error.code === "baseMismatch");
    live.apply(snapshot(2));
    const before = structuredClone(live.view);
    assert.throws(() => live.apply(next), (error: unknown) => error instanceof LiveViewError && error.code === "baseMismatch");
    assert.deepEqual(live.view, before);
  });

  it("refuses a bad operation and changes nothing", () => {
    const live = new LiveRunView();
    live.apply(snapshot(1));
    const before = structuredClone(live.view);
    for (const op of [
      { op: "replace", path: "/missing", value: 1 },
      { op: "replace", path: "/nodes/7", value: 1 },
      { op: "append", path: "/display", value: 1 },
      { op: "remove", path: "/nodes/3" },
    ] as PatchOp[]) {
      assert.throws(
        () => live.apply(patch(1, [{ op: "replace", path: "/revision", value: 2 }, op])),
        (error: unknown) => error instanceof LiveViewError && error.code === "badOperation",
        JSON.stringify(op),
      );
      assert.deepEqual(live.view, before);
    }
  });
});
