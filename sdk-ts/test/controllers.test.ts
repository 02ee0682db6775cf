import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";
import { WorkflowDefinitionError } from "../src/authoring/index.js";
import {
  conditionFalse,
  conditionTrue,
  conditionUnknown,
  controllerNameOf,
  defineController,
  discoverControllers,
  isControllerDefinition,
  results,
} from "../src/controllers/index.js";

const valid = {
  name: "pull-request",
  initialStatus: (spec: { head: string }) => ({ phase: "new", head: spec.head }),
  reconcile: () => results.settled(),
};

describe("defineController", () => {
  it("accepts a valid definition, brands it and keeps its functions", () => {
    const controller = defineController(valid);
    assert.ok(isControllerDefinition(controller));
    assert.equal(isControllerDefinition({ ...valid }), false);
    assert.deepEqual(controller.initialStatus({ head: "abc" }), { phase: "new", head: "abc" });
    assert.ok(Object.isFrozen(controller));
  });

  it("refuses a bad name, missing functions and a bad timeout with a message naming the rule", () => {
    for (const name of ["", "Pull", "1pr", "pr_x", "a".repeat(65)]) {
      assert.throws(() => defineController({ ...valid, name }), (error: unknown) => error instanceof WorkflowDefinitionError && /name must match/.test(error.message));
    }
    assert.throws(() => defineController({ ...valid, reconcile: undefined as never }), /reconcile\(ctx, resource\) must be a function/);
    assert.throws(() => defineController({ ...valid, initialStatus: 1 as never }), /initialStatus\(spec\) must be a function/);
    for (const timeoutMs of [0, -1, 1.5]) assert.throws(() => defineController({ ...valid, timeoutMs }), /timeoutMs must be a positive integer/);
  });
});

describe("conditions and results", () => {
  it("builds condition patches and refuses one without a type or reason", () => {
    assert.deepEqual(conditionTrue("Ready", "Merged"), { type: "Ready", status: true, reason: "Merged" });
    assert.deepEqual(conditionFalse("Ready", "ChecksFailed", "2 checks failed"), { type: "Ready", status: false, reason: "ChecksFailed", message: "2 checks failed" });
    assert.equal(conditionUnknown("Checks", "Pending").status, "unknown");
    assert.throws(() => conditionTrue("", "x"), /needs a type/);
    assert.throws(() => conditionTrue("Ready", ""), /needs a reason/);
  });

  it("builds the three results; requeueAfter needs a positive delay", () => {
    assert.deepEqual(results.settled(), { kind: "settled" });
    assert.deepEqual(results.requeue({ finalizers: [] }), { kind: "requeue", patch: { finalizers: [] } });
    assert.deepEqual(results.requeueAfter(500), { kind: "requeueAfter", afterMs: 500 });
    assert.throws(() => results.requeueAfter(0), /positive integer/);
  });
});

describe("controller discovery", () => {
  it("finds *.controller.{ts,js,mts,mjs} in the project, then the user's directory; the project wins a name, and so does the earlier suffix", async () => {
    const root = mkdtempSync(join(tmpdir(), "piw-controllers-"));
    const project = join(root, "project");
    const home = join(root, "home");
    const projectDir = join(project, ".pi", "controllers");
    const globalDir = join(home, ".pi", "agent", "controllers");
    mkdirSync(projectDir, { recursive: true });
    mkdirSync(globalDir, { recursive: true });
    for (const file of ["pull-request.controller.js", "pull-request.controller.ts", "deploy.controller.mjs", "Bad.controller.ts", "notes.ts", ".controller.ts"]) {
      writeFileSync(join(projectDir, file), "export default {}\n");
    }
    mkdirSync(join(projectDir, "dir.controller.ts"));
    writeFileSync(join(root, "target.js"), "");
    symlinkSync(join(root, "target.js"), join(projectDir, "linked.controller.js"));
    for (const file of ["pull-request.controller.ts", "cleanup.controller.ts"]) writeFileSync(join(globalDir, file), "");
    const found = await discoverControllers(project, home);
    assert.deepEqual(
      found.map(({ name, path, origin }) => [name, path.slice(root.length), origin]),
      [
        ["deploy", "/project/.pi/controllers/deploy.controller.mjs", "project"],
        ["linked", "/project/.pi/controllers/linked.controller.js", "project"],
        ["pull-request", "/project/.pi/controllers/pull-request.controller.ts", "project"],
        ["cleanup", "/home/.pi/agent/controllers/cleanup.controller.ts", "global"],
      ],
    );
    assert.deepEqual(await discoverControllers(join(root, "nowhere"), join(root, "nobody")), []);
    assert.equal(controllerNameOf("x/y/pull-request.controller.mts"), "pull-request");
    assert.equal(controllerNameOf("pull_request.controller.ts"), null);
  });
});
