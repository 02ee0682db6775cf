/**
 * The controller child (`pi-workflows-controller`) as the server runs it: a
 * real node process on the built bin, its stdio played by the test as the
 * server end of controller.v1. Each test asserts through the channel (the
 * messages the child wrote, each decoded and schema-checked) and through an
 * apply log the test controller appends to.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { before, describe, it } from "node:test";
import { requestFingerprint } from "../src/controllers/child.js";
import type { ControllerChildMessage, ControllerResolveLaunch } from "../src/generated/types.js";
import { canonicalString } from "../src/protocol/canonical.js";
import { type ReplyFields, committed, fileDigest, reconcileLaunch, resourceWith, runChild } from "../test-support/controller-child.js";

/**
 * The test controller. Its spec chooses a scenario and names the apply log;
 * it appends one JSON line per thing it did (observe, apply, what reconcile
 * saw, what a ctx call threw, whether the signal aborted).
 */
const TEST_CONTROLLER = `
import { appendFileSync } from "node:fs";
import { conditionFalse, conditionTrue, conditionUnknown, defineController } from "@osolmaz/pi-workflows/controllers";

interface Spec { scenario: string; log: string; secret?: string; observation?: string; request?: unknown; badInitial?: boolean }
const note = (spec: Spec, entry: unknown): void => appendFileSync(spec.log, JSON.stringify(entry) + "\\n");

export default defineController<Spec, { phase: string }>({
  name: "test",
  timeoutMs: 5000,
  initialStatus(spec) {
    if (spec.badInitial) throw new Error("initial refused: " + spec.secret);
    return { phase: "new" };
  },
  async reconcile(ctx, resource) {
    const spec = resource.spec;
    const merge = (key: string) => ({
      key,
      kind: "merge",
      request: spec.request ?? { head: "abc" },
      async observe() { note(spec, { did: "observe", key }); return spec.observation as never; },
      async apply() {
        note(spec, { did: "apply", key });
        if (spec.scenario === "applyThrows") throw new Error("provider said " + spec.secret);
        return "applied" as const;
      },
    });
    switch (spec.scenario) {
      case "ready":
        note(spec, { did: "saw", resource });
        return ctx.settled({
          controllerStatus: { phase: "ready" },
          conditions: [conditionTrue("Ready", "Done", "all good"), conditionFalse("Blocked", "NotBlocked"), conditionUnknown("Checks", "Pending")],
          finalizers: ["test/cleanup"],
          workflowRun: null,
        });
      case "effect":
      case "applyThrows": {
        const record = await ctx.effects.ensure(merge("merge-1"));
        note(spec, { did: "record", record });
        return ctx.requeueAfter(1000, { controllerStatus: { phase: record.state } });
      }
      case "twoEffects": {
        await ctx.effects.ensure(merge("merge-1"));
        try {
          await ctx.effects.ensure(merge("merge-2"));
        } catch (error) {
          note(spec, { did: "secondRefused", message: (error as Error).message });
          throw error;
        }
        return ctx.settled();
      }
      case "workflow": {
        const run = await ctx.workflows.ensure({ requestKey: "review-1", workflow: "review", input: { pr: 1 } });
        note(spec, { did: "workflow", run });
        return ctx.requeue({ workflowRun: { requestKey: run.requestKey, runId: run.runId, state: run.state } });
      }
      case "cooperative":
        await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve(), { once: true }));
        note(spec, { did: "aborted", reason: (ctx.signal.reason as Error).name });
        throw ctx.signal.reason;
      case "claimLost":
        try {
          await ctx.effects.ensure(merge("merge-1"));
        } catch (error) {
          note(spec, { did: "ensureRefused", message: (error as Error).message, aborted: ctx.signal.aborted });
        }
        return ctx.settled();
      case "throws":
        throw new Error("leaks " + spec.secret);
      case "badResult":
        return { kind: "done" } as never;
      default:
        return ctx.settled();
    }
  },
});
`;

const SECRET = "s3cr3t-token-value";

let dir: string;
let project: string;
let controllerPath: string;
let env: NodeJS.ProcessEnv;
let logCount = 0;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "piw-controller-child-"));
  project = join(dir, "project");
  mkdirSync(join(project, ".pi", "controllers"), { recursive: true });
  controllerPath = join(project, ".pi", "controllers", "test.controller.ts");
  writeFileSync(controllerPath, TEST_CONTROLLER);
  // One state directory for the file: its transform cache makes every load after the first skip Babel.
  env = { ...process.env, HOME: join(dir, "home"), PI_WORKFLOWS_HOME: join(dir, "state") };
  // Warm the transform cache, so that a pass's deadline (which runs from its launch) is not spent in Babel.
  const warm = await runChild(resolveLaunch("test", controllerPath, {}), () => ({ outcome: "accepted" }), env);
  assert.equal(warm.code, 0, warm.stderr);
});

/** A fresh apply log. */
function newLog(): string {
  logCount += 1;
  return join(dir, `apply-${logCount}.ndjson`);
}

function readLog(path: string): Array<Record<string, unknown>> {
  if (!existsSync(path)) return [];
  return readFileSync(path, "utf8")
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

function resolveLaunch(controller: string, path: string, spec: unknown): ControllerResolveLaunch {
  return { kind: "controller.resolve", controller, controllerPath: path, projectPath: project, spec: spec as never };
}

const kinds = (messages: ControllerChildMessage[]): string[] => messages.map((m) => m.kind);

/** Replies to a pass that reserves a new effect: apply, then the settled record. */
function effectServer(first: "apply" | "observe", afterObserve: (m: Extract<ControllerChildMessage, { kind: "effect.observed" }>) => ReplyFields) {
  return (message: ControllerChildMessage): ReplyFields => {
    switch (message.kind) {
      case "effect.ensure":
        return { outcome: "accepted", effectAction: first, effect: { key: message.key, kind: message.effectKind, state: first === "apply" ? "pending" : "indeterminate" } };
      case "effect.observed":
        return afterObserve(message);
      case "effect.settled":
        return { outcome: "accepted", effect: { key: message.key, kind: "merge", state: message.applyResult, ...(message.error !== undefined ? { error: message.error } : {}) } };
      default:
        return committed;
    }
  };
}

describe("controller child: resolve mode", () => {
  it("resolves a good controller: export, initialStatus, digest of the exact bytes, timeoutMs; exits 0", async () => {
    const t = await runChild(resolveLaunch("test", controllerPath, { scenario: "ready", log: newLog() }), () => ({ outcome: "accepted" }), env);
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(t.messages, [{ kind: "resolved", requestId: 1, exportName: "default", initialStatus: { phase: "new" }, sourceDigest: fileDigest(controllerPath), timeoutMs: 5000 }]);
  });

  it("answers resolveFailed invalidDefinition for a module without a controller, and for another controller name", async () => {
    const empty = join(project, ".pi", "controllers", "empty.controller.ts");
    writeFileSync(empty, "export const answer: number = 42;\n");
    const none = await runChild(resolveLaunch("empty", empty, {}), () => ({ outcome: "accepted" }), env);
    assert.equal(none.code, 0, none.stderr);
    assert.equal(none.messages.length, 1);
    const [failed] = none.messages;
    assert.ok(failed?.kind === "resolveFailed");
    assert.equal(failed.code, "invalidDefinition");
    assert.match(failed.message, /exports no defineController/);

    const wrong = await runChild(resolveLaunch("other", controllerPath, {}), () => ({ outcome: "accepted" }), env);
    const [named] = wrong.messages;
    assert.ok(named?.kind === "resolveFailed");
    assert.equal(named.code, "invalidDefinition");
    assert.match(named.message, /no controller named "other" \(it exports: test\)/);
  });

  it("answers resolveFailed invalidInput when initialStatus throws, without the error's contents; sourceNotFound, invalidDefinition (a defineController shape error) and compileFailed likewise", async () => {
    const t = await runChild(resolveLaunch("test", controllerPath, { scenario: "ready", log: newLog(), badInitial: true, secret: SECRET }), () => ({ outcome: "accepted" }), env);
    assert.equal(t.code, 0, t.stderr);
    const [failed] = t.messages;
    assert.ok(failed?.kind === "resolveFailed");
    assert.equal(failed.code, "invalidInput");
    assert.match(failed.message, /initialStatus\(spec\) threw Error/);
    assert.ok(!JSON.stringify(t.messages).includes(SECRET) && !t.stderr.includes(SECRET), "no spec contents in the messages or the log");

    const missing = await runChild(resolveLaunch("gone", join(project, ".pi", "controllers", "gone.controller.ts"), {}), () => ({ outcome: "accepted" }), env);
    assert.equal((missing.messages[0] as { code?: string }).code, "sourceNotFound");

    const misnamed = join(project, ".pi", "controllers", "misnamed.controller.ts");
    writeFileSync(misnamed, 'import { defineController } from "@pi-workflows/sdk/controllers";\nexport default defineController({ name: "Bad_Name", initialStatus: () => ({}), reconcile: () => ({ kind: "settled" }) });\n');
    const shape = await runChild(resolveLaunch("misnamed", misnamed, {}), () => ({ outcome: "accepted" }), env);
    assert.equal((shape.messages[0] as { code?: string }).code, "invalidDefinition", JSON.stringify(shape.messages));
    assert.match((shape.messages[0] as { message: string }).message, /name must match/);

    const broken = join(project, ".pi", "controllers", "broken.controller.ts");
    writeFileSync(broken, "export default {{{ ;\n");
    const syntax = await runChild(resolveLaunch("broken", broken, {}), () => ({ outcome: "accepted" }), env);
    assert.equal((syntax.messages[0] as { code?: string }).code, "compileFailed");
    assert.ok(!(syntax.messages[0] as { message: string }).message.includes(project), "no paths in the message");
  });

  it("exits 2 with one stderr line on a malformed launch", async () => {
    for (const bad of ["not json\n", `${canonicalString({ kind: "controller.resolve", controller: "test" })}\n`, '{"kind": "controller.resolve"}\n']) {
      const t = await runChild(bad, () => null, env);
      assert.equal(t.code, 2);
      assert.deepEqual(t.messages, []);
      const lines = t.stderr.trim().split("\n");
      assert.equal(lines.length, 1, t.stderr);
      assert.match(lines[0] as string, /^pi-workflows-controller: the launch line is not a controller\.v1 launch \((nonCanonical|schemaInvalid)\); this program is started by the pi-workflows server/);
    }
  });
});

describe("controller child: reconcile mode", () => {
  it("settles Ready with conditions: the resource shown with ISO times and boolean statuses, the patch sent with wire statuses", async () => {
    const log = newLog();
    const t = await runChild(reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "ready", log })), () => committed, env);
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(t.messages, [
      {
        kind: "finished",
        requestId: 1,
        result: "settled",
        patch: {
          controllerStatus: { value: { phase: "ready" } },
          conditions: [
            { type: "Ready", status: "true", reason: "Done", message: "all good" },
            { type: "Blocked", status: "false", reason: "NotBlocked" },
            { type: "Checks", status: "unknown", reason: "Pending" },
          ],
          finalizers: ["test/cleanup"],
          workflowRun: { value: null },
        },
      },
    ]);
    const [saw] = readLog(log);
    const resource = saw?.["resource"] as { status: { conditions: Array<Record<string, unknown>> }; metadata: Record<string, unknown> };
    assert.deepEqual(resource.status.conditions, [{ type: "Ready", status: "unknown", reason: "New", observedGeneration: 1, lastTransitionTime: "2023-11-14T22:13:20.000Z" }]);
    assert.equal(resource.metadata["generation"], 2);
    assert.equal("workflowRun" in resource.status, false, "a null workflowRun is absent in the authoring shape");
  });

  it("a newly reserved effect: ensure with the request fingerprint, apply once, settled; no observe", async () => {
    const log = newLog();
    const request = { head: "abc", repo: "o/r", n: 1 };
    const t = await runChild(reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "effect", log, request })), effectServer("apply", () => committed), env);
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(kinds(t.messages), ["effect.ensure", "effect.settled", "finished"]);
    const ensure = t.messages[0] as Extract<ControllerChildMessage, { kind: "effect.ensure" }>;
    assert.equal(ensure.key, "merge-1");
    assert.equal(ensure.effectKind, "merge");
    // sha256 of the canonical JSON: keys sorted, no spaces.
    assert.equal(ensure.requestFingerprint, `sha256:${(await import("node:crypto")).createHash("sha256").update('{"head":"abc","n":1,"repo":"o/r"}').digest("hex")}`);
    assert.equal(ensure.requestFingerprint, requestFingerprint({ repo: "o/r", n: 1, head: "abc" }));
    assert.deepEqual(t.messages[1], { kind: "effect.settled", requestId: 2, key: "merge-1", applyResult: "applied" });
    assert.deepEqual(
      readLog(log).map((e) => e["did"]),
      ["apply", "record"],
    );
    assert.deepEqual(readLog(log)[1]?.["record"], { key: "merge-1", kind: "merge", state: "applied" });
    const finished = t.messages[2] as Extract<ControllerChildMessage, { kind: "finished" }>;
    assert.equal(finished.result, "requeueAfter");
    assert.equal(finished.afterMs, 1000);
  });

  it("an effect pending from an earlier pass is observed first: applied → no apply; notApplied → apply once", async () => {
    const appliedLog = newLog();
    const seen = await runChild(
      reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "effect", log: appliedLog, observation: "applied" })),
      effectServer("observe", (m) => ({ outcome: "accepted", effectAction: "done", effect: { key: m.key, kind: "merge", state: m.observation === "applied" ? "applied" : "pending" } })),
      env,
    );
    assert.equal(seen.code, 0, seen.stderr);
    assert.deepEqual(kinds(seen.messages), ["effect.ensure", "effect.observed", "finished"]);
    assert.equal((seen.messages[1] as { observation: string }).observation, "applied");
    assert.deepEqual(
      readLog(appliedLog).map((e) => e["did"]),
      ["observe", "record"],
      "observed applied: apply never called",
    );

    const notLog = newLog();
    const retried = await runChild(
      reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "effect", log: notLog, observation: "not_applied" })),
      effectServer("observe", (m) => (m.observation === "notApplied" ? { outcome: "accepted", effectAction: "apply", effect: { key: m.key, kind: "merge", state: "pending" } } : { outcome: "rejected", code: "internal", message: "unexpected" })),
      env,
    );
    assert.equal(retried.code, 0, retried.stderr);
    assert.deepEqual(kinds(retried.messages), ["effect.ensure", "effect.observed", "effect.settled", "finished"]);
    assert.equal((retried.messages[1] as { observation: string }).observation, "notApplied");
    assert.deepEqual(
      readLog(notLog).map((e) => e["did"]),
      ["observe", "apply", "record"],
      "observed not applied: applied exactly once, after the observation",
    );
  });

  it("apply throwing settles the effect indeterminate, with a message that carries none of the error's contents", async () => {
    const log = newLog();
    const t = await runChild(reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "applyThrows", log, secret: SECRET })), effectServer("apply", () => committed), env);
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(t.messages[1], { kind: "effect.settled", requestId: 2, key: "merge-1", applyResult: "indeterminate", error: "apply threw Error" });
    assert.deepEqual(readLog(log)[1]?.["record"], { key: "merge-1", kind: "merge", state: "indeterminate", error: "apply threw Error" });
    assert.ok(!JSON.stringify(t.messages).includes(SECRET) && !t.stderr.includes(SECRET));
  });

  it("a second effect in one pass, rejected by the server, throws in reconcile and fails the pass", async () => {
    const log = newLog();
    let ensures = 0;
    const base = effectServer("apply", () => committed);
    const t = await runChild(
      reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "twoEffects", log })),
      (m) => {
        if (m.kind === "effect.ensure" && ++ensures === 2) return { outcome: "rejected", code: "conflict", message: "one effect per reconcile pass" };
        return base(m);
      },
      env,
    );
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(kinds(t.messages), ["effect.ensure", "effect.settled", "effect.ensure", "failed"]);
    assert.deepEqual(
      readLog(log).map((e) => e["did"]),
      ["apply", "secondRefused"],
    );
    assert.match(String(readLog(log)[1]?.["message"]), /rejected effect\.ensure \(conflict\): one effect per reconcile pass/);
    assert.match((t.messages[3] as { message: string }).message, /rejected effect\.ensure \(conflict\)/);
  });

  it("a child workflow by request key: workflow.ensure carries key, workflow and input; the reply's record reaches reconcile", async () => {
    const log = newLog();
    const t = await runChild(
      reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "workflow", log })),
      (m) => (m.kind === "workflow.ensure" ? { outcome: "accepted", workflowRequest: { requestKey: m.requestKey, workflow: m.workflow, attempt: 1, runId: "run-42", state: "running" } } : committed),
      env,
    );
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(t.messages[0], { kind: "workflow.ensure", requestId: 1, requestKey: "review-1", workflow: "review", input: { pr: 1 } });
    assert.deepEqual(readLog(log)[0]?.["run"], { requestKey: "review-1", workflow: "review", attempt: 1, runId: "run-42", state: "running" });
    assert.deepEqual((t.messages[1] as { patch: unknown }).patch, { workflowRun: { value: { requestKey: "review-1", runId: "run-42", state: "running" } } });
  });

  it("the deadline aborts a cooperative reconcile: the signal's reason is a TimeoutError and the pass fails", async () => {
    const log = newLog();
    const t = await runChild(reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "cooperative", log }), { timeoutMs: 600 }), () => committed, env);
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(t.messages, [{ kind: "failed", requestId: 1, message: "the reconcile deadline (600 ms) passed" }]);
    // The abort reached reconcile's signal before the child wrote `failed` (or right after: the race decides which is logged first).
    await waitFor(() => readLog(log).length > 0, 500);
    assert.deepEqual(readLog(log), [{ did: "aborted", reason: "TimeoutError" }]);
  });

  it("an effect whose ensure reply arrives after the deadline is not applied: the pass fails and the effect stays for the next pass to observe", async () => {
    const log = newLog();
    const late = effectServer("apply", () => committed);
    const t = await runChild(
      reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "effect", log }), { timeoutMs: 600 }),
      // The reply leaves after the deadline, however long loading took.
      (m) => (m.kind === "effect.ensure" ? new Promise<ReplyFields>((resolve) => setTimeout(() => resolve(late(m)), 700)) : late(m)),
      env,
    );
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(t.messages.map((m) => m.kind), ["effect.ensure", "failed"]);
    assert.equal((t.messages[1] as { message: string }).message, "the reconcile deadline (600 ms) passed");
    assert.deepEqual(readLog(log), [], "apply never ran");
  });

  it("a claimLost reply aborts the signal and the pass ends without writing a result", async () => {
    const log = newLog();
    const t = await runChild(
      reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "claimLost", log })),
      (m) => (m.kind === "effect.ensure" ? { outcome: "rejected", code: "claimLost", message: "another owner holds the claim" } : committed),
      env,
    );
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(kinds(t.messages), ["effect.ensure"], "no finished after the claim is lost");
    assert.deepEqual(readLog(log), [{ did: "ensureRefused", message: "the server rejected effect.ensure (claimLost): another owner holds the claim", aborted: true }]);
    assert.match(t.stderr, /the claim is lost/);
  });

  it("a changed source digest is refused before any controller code runs", async () => {
    const log = newLog();
    const stale = `sha256:${"0".repeat(64)}`;
    const t = await runChild(reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "ready", log }), { sourceDigest: stale }), () => committed, env);
    assert.equal(t.code, 0, t.stderr);
    assert.deepEqual(t.messages, [{ kind: "failed", requestId: 1, message: "the controller source changed since the resource was applied; apply it again" }]);
    assert.deepEqual(readLog(log), [], "reconcile never ran");
  });

  it("a throwing reconcile or an invalid result fails the pass with a bounded message and no spec contents", async () => {
    const thrown = await runChild(reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "throws", log: newLog(), secret: SECRET })), () => committed, env);
    assert.deepEqual(thrown.messages, [{ kind: "failed", requestId: 1, message: "reconcile threw Error" }]);
    assert.ok(!thrown.stderr.includes(SECRET));
    const invalid = await runChild(reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "badResult", log: newLog() })), () => committed, env);
    assert.match((invalid.messages[0] as { message: string }).message, /^reconcile returned an invalid result/);
  });

  it("exits 2 with one stderr line on a malformed reply (wrong requestId, missing effectAction)", async () => {
    for (const reply of [
      (m: ControllerChildMessage) => `${canonicalString({ kind: "reply", outcome: "accepted", requestId: m.requestId + 1, finishOutcome: "committed" })}\n`,
      () => ({ outcome: "accepted" }) as ReplyFields,
    ]) {
      const log = newLog();
      const t = await runChild(reconcileLaunch("test", controllerPath, project, resourceWith("test", { scenario: "effect", log })), reply, env);
      assert.equal(t.code, 2, t.stderr);
      assert.deepEqual(kinds(t.messages), ["effect.ensure"]);
      assert.deepEqual(readLog(log), [], "no apply after a malformed reply");
      const lines = t.stderr.trim().split("\n").filter((l) => !l.includes("reconcile pass of controller"));
      assert.equal(lines.length, 1, t.stderr);
      assert.match(lines[0] as string, /^pi-workflows-controller: (a reply names request 2 while request 1|the accepted reply to request 1 \(effect\.ensure\) lacks effectAction)/);
    }
  });
});

async function waitFor(condition: () => boolean, ms: number): Promise<void> {
  const until = Date.now() + ms;
  while (!condition() && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 10));
}


