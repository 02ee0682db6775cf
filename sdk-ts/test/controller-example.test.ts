/**
 * The pull-request controller example (examples/controllers/
 * pull-request.controller.ts) through the real controller child against the
 * fake forge (test-support/fake-forge.ts) on 127.0.0.1. The test plays the
 * server end with a small in-memory model of what the server keeps (the
 * resource with its status patch applied, effect records, child workflow
 * requests): each pass is one child process, as the server runs it.
 */
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { ChildWorkflowView, ControllerChildMessage, ControllerEffectState, ControllerResource, ResourceCondition } from "../src/generated/types.js";
import { loadAndCompile } from "../src/runner/loader.js";
import { type ChildTranscript, type ReplyFields, reconcileLaunch, runChild } from "../test-support/controller-child.js";
import { FakeForge } from "../test-support/fake-forge.js";
import { EXAMPLES_DIR, REPO_DIR } from "../test-support/server.js";

const CONTROLLER = join(REPO_DIR, "examples", "controllers", "pull-request.controller.ts");
const FINALIZER = "pull-request.examples/label";
const REPO = "octo/widgets";

let forge: FakeForge;
let project: string;
let env: NodeJS.ProcessEnv;

before(async () => {
  forge = await FakeForge.start();
  const dir = mkdtempSync(join(tmpdir(), "piw-controller-example-"));
  project = join(dir, "project");
  env = { ...process.env, HOME: join(dir, "home"), PI_WORKFLOWS_HOME: join(dir, "state") };
});

after(async () => {
  await forge?.stop();
});

interface EffectRow {
  kind: string;
  fingerprint: string;
  state: ControllerEffectState;
  error?: string;
}

/** What the server would keep for one resource, and the replies it would give (the kernel's rules, reduced to this test's needs). */
class Model {
  resource: ControllerResource;
  readonly effects = new Map<string, EffectRow>();
  readonly workflows = new Map<string, ChildWorkflowView & { input: unknown }>();
  /** Every effect decision, as `key action`. */
  readonly actions: string[] = [];
  private now = 1_700_000_000_000;

  constructor(spec: unknown, uid: string) {
    this.resource = {
      metadata: { uid, controller: "pull-request", key: `${REPO}#${(spec as { number: number }).number}`, resourceVersion: 1, generation: 1, finalizers: [] },
      spec: spec as ControllerResource["spec"],
      status: { observedGeneration: 0, conditions: [], controllerStatus: { phase: "new" }, workflowRun: null },
    };
  }

  condition(type: string): ResourceCondition["status"] | undefined {
    return this.resource.status.conditions.find((c) => c.type === type)?.status;
  }

  /** One reconcile pass: the child's transcript and its finished (or failed) message. */
  async pass(): Promise<{ transcript: ChildTranscript; end: ControllerChildMessage }> {
    this.now += 1000;
    let effectThisPass: string | null = null;
    const handler = (m: ControllerChildMessage): ReplyFields => {
      switch (m.kind) {
        case "effect.ensure": {
          if (effectThisPass !== null && effectThisPass !== m.key) return { outcome: "rejected", code: "conflict", message: "one effect per reconcile pass" };
          effectThisPass = m.key;
          const row = this.effects.get(m.key);
          if (row !== undefined && row.fingerprint !== m.requestFingerprint) return { outcome: "rejected", code: "conflict", message: "the effect key was used with another request" };
          const action = row === undefined ? "apply" : row.state === "pending" || row.state === "indeterminate" ? "observe" : "done";
          if (row === undefined) this.effects.set(m.key, { kind: m.effectKind, fingerprint: m.requestFingerprint, state: "pending" });
          this.actions.push(`${m.key} ${action}`);
          return { outcome: "accepted", effectAction: action, effect: this.view(m.key) };
        }
        case "effect.observed": {
          const row = this.effects.get(m.key) as EffectRow;
          this.actions.push(`${m.key} observed ${m.observation}`);
          if (m.observation === "notApplied") return { outcome: "accepted", effectAction: "apply", effect: this.view(m.key) };
          row.state = m.observation;
          return { outcome: "accepted", effectAction: "done", effect: this.view(m.key) };
        }
        case "effect.settled": {
          const row = this.effects.get(m.key) as EffectRow;
          row.state = m.applyResult;
          if (m.error !== undefined) row.error = m.error;
          this.actions.push(`${m.key} settled ${m.applyResult}`);
          return { outcome: "accepted", effect: this.view(m.key) };
        }
        case "workflow.ensure": {
          let request = this.workflows.get(m.requestKey);
          if (request === undefined) {
            request = { requestKey: m.requestKey, workflow: m.workflow, attempt: 1, runId: `run-${this.workflows.size + 1}`, state: "running", input: m.input };
            this.workflows.set(m.requestKey, request);
          }
          const { input: _input, ...view } = request;
          return { outcome: "accepted", workflowRequest: view };
        }
        case "finished":
          this.apply(m);
          return { outcome: "accepted", finishOutcome: "committed" };
        default:
          return { outcome: "accepted", finishOutcome: "committed" };
      }
    };
    const transcript = await runChild(reconcileLaunch("pull-request", CONTROLLER, project, this.resource), handler, env);
    assert.equal(transcript.code, 0, transcript.stderr);
    const end = transcript.messages.at(-1) as ControllerChildMessage;
    assert.ok(end.kind === "finished", `the pass failed: ${JSON.stringify(end)}\n${transcript.stderr}`);
    return { transcript, end };
  }

  private view(key: string) {
    const row = this.effects.get(key) as EffectRow;
    return { key, kind: row.kind, state: row.state, ...(row.error !== undefined ? { error: row.error } : {}) };
  }

  /** The status patch, as the kernel merges it: conditions by type (transition time only on a change), finalizers replaced. */
  private apply(m: Extract<ControllerChildMessage, { kind: "finished" }>): void {
    const r = this.resource;
    const status = { ...r.status, observedGeneration: r.metadata.generation };
    if (m.patch.controllerStatus !== undefined) status.controllerStatus = m.patch.controllerStatus.value;
    if (m.patch.workflowRun !== undefined) status.workflowRun = m.patch.workflowRun.value;
    for (const c of m.patch.conditions ?? []) {
      const old = status.conditions.find((o) => o.type === c.type);
      const next: ResourceCondition = { ...c, observedGeneration: r.metadata.generation, lastTransitionTime: old !== undefined && old.status === c.status ? old.lastTransitionTime : this.now };
      status.conditions = [...status.conditions.filter((o) => o.type !== c.type), next];
    }
    const finalizers = m.patch.finalizers ?? r.metadata.finalizers;
    this.resource = { ...r, metadata: { ...r.metadata, finalizers, resourceVersion: r.metadata.resourceVersion + 1 }, status };
  }
}

const spec = (number: number) => ({ forge: forge.url, repo: REPO, number });
const mergeCalls = () => forge.calls.filter((c) => c.method === "PUT" && c.path.endsWith("/merge"));

describe("examples/controllers/pull-request.controller.ts against the fake forge", () => {
  it("resolves through the child: default export, initialStatus, and a spec it refuses (invalidInput)", async () => {
    const launch = (s: unknown) => ({ kind: "controller.resolve" as const, controller: "pull-request", controllerPath: CONTROLLER, projectPath: project, spec: s as never });
    const good = await runChild(launch(spec(1)), () => ({ outcome: "accepted" }), env);
    assert.deepEqual(good.messages.map((m) => [m.kind, (m as { exportName?: string }).exportName, (m as { initialStatus?: unknown }).initialStatus]), [["resolved", "default", { phase: "new" }]]);
    const bad = await runChild(launch({ forge: "ftp://x", repo: REPO, number: 1 }), () => ({ outcome: "accepted" }), env);
    assert.deepEqual(bad.messages.map((m) => [m.kind, (m as { code?: string }).code]), [["resolveFailed", "invalidInput"]]);
  });

  it("the review workflow it starts compiles", async () => {
    const compiled = await loadAndCompile(join(EXAMPLES_DIR, "pr-review.workflow.ts"), EXAMPLES_DIR);
    assert.equal(compiled.definition.name, "pr-review");
  });

  it("finalizer, label, review run, checks, then one guarded merge with an idempotency key: Ready, ChecksPassed, Merged", async () => {
    forge.addPull(REPO, { number: 7, title: "Add the widget", head: "aaa111" });
    const model = new Model(spec(7), "uid-7");

    let { end } = await model.pass();
    assert.deepEqual(model.resource.metadata.finalizers, [FINALIZER], "the finalizer comes first");
    assert.equal(forge.calls.length, 0, "before any forge call");
    assert.equal(end.kind === "finished" && end.result, "requeue");

    await model.pass();
    assert.deepEqual(forge.pulls.get(`${REPO}#7`)?.labels, ["pi-workflows"]);
    assert.deepEqual(model.actions, ["label:7 apply", "label:7 settled applied"]);

    ({ end } = await model.pass());
    const review = model.workflows.get("review:7:aaa111");
    assert.deepEqual(review && { workflow: review.workflow, input: review.input }, { workflow: "pr-review", input: { repo: REPO, number: 7, head: "aaa111", title: "Add the widget" } });
    assert.deepEqual(model.resource.status.workflowRun, { requestKey: "review:7:aaa111", runId: "run-1", state: "running" });
    assert.equal(model.condition("Ready"), "false");
    assert.equal(end.kind === "finished" && end.result, "requeueAfter");

    // The same head finds the same request; the run is still going.
    await model.pass();
    assert.equal(model.workflows.size, 1);

    (model.workflows.get("review:7:aaa111") as ChildWorkflowView).state = "succeeded";
    await model.pass();
    assert.equal(model.condition("ChecksPassed"), "unknown", "checks pending");
    assert.equal(mergeCalls().length, 0);

    forge.checks.set("aaa111", "success");
    await model.pass();
    assert.equal(model.condition("ChecksPassed"), "true");
    assert.deepEqual(model.resource.status.controllerStatus, { phase: "merging", head: "aaa111", label: "applied" });
    assert.equal(mergeCalls().length, 0, "the head to merge is recorded before the merge");

    ({ end } = await model.pass());
    assert.equal(end.kind === "finished" && end.result, "settled");
    assert.deepEqual(mergeCalls().map((c) => [c.idempotencyKey, c.body, c.status]), [["uid-7:merge:7:aaa111", { sha: "aaa111", merge_method: "merge" }, 200]]);
    assert.deepEqual([model.condition("Ready"), model.condition("ChecksPassed"), model.condition("Merged")], ["true", "true", "true"]);
    assert.equal(forge.pulls.get(`${REPO}#7`)?.merged, true);
  });

  it("a merge whose response was lost is indeterminate, and the next pass observes the forge instead of merging again", async () => {
    forge.addPull(REPO, { number: 8, title: "Fix the gadget", head: "bbb222", labels: ["pi-workflows"] });
    forge.checks.set("bbb222", "success");
    const model = new Model(spec(8), "uid-8");
    model.resource.metadata.finalizers = [FINALIZER];
    model.resource.status.controllerStatus = { phase: "merging", head: "bbb222", label: "applied" };
    forge.dropNextMergeResponse = true;

    const first = await model.pass();
    assert.deepEqual(model.actions, ["merge:8:bbb222 apply", "merge:8:bbb222 settled indeterminate"]);
    assert.equal(first.end.kind === "finished" && first.end.result, "requeueAfter");
    assert.equal(model.condition("Merged"), "unknown");
    assert.equal(forge.pulls.get(`${REPO}#8`)?.merged, true, "the forge did merge");

    const before = forge.calls.length;
    await model.pass();
    assert.deepEqual(model.actions.slice(2), ["merge:8:bbb222 observe", "merge:8:bbb222 observed applied"]);
    assert.deepEqual(
      forge.calls.slice(before).map((c) => `${c.method} ${c.path}`),
      [`GET /repos/${REPO}/pulls/8`],
      "observe read the pull request; no second merge request",
    );
    assert.equal(mergeCalls().filter((c) => c.path.includes("/pulls/8/")).length, 1);
    assert.deepEqual([model.condition("Ready"), model.condition("Merged")], ["true", "true"]);
  });

  it("the expected-head guard: a head pushed during the merge is refused (rejected), and the next pass reviews the new head", async () => {
    const pull = forge.addPull(REPO, { number: 9, title: "Tune the gizmo", head: "ccc333", labels: ["pi-workflows"] });
    forge.checks.set("ccc333", "success");
    const model = new Model(spec(9), "uid-9");
    model.resource.metadata.finalizers = [FINALIZER];
    model.resource.status.controllerStatus = { phase: "merging", head: "ccc333", label: "applied" };
    forge.beforeMerge = (p) => {
      if (p === pull) p.head = "ddd444";
    };
    try {
      await model.pass();
    } finally {
      forge.beforeMerge = null;
    }
    assert.deepEqual(model.actions, ["merge:9:ccc333 apply", "merge:9:ccc333 settled rejected"]);
    assert.deepEqual(mergeCalls().filter((c) => c.path.includes("/pulls/9/")).map((c) => [c.body, c.status]), [[{ sha: "ccc333", merge_method: "merge" }, 409]]);
    assert.equal(pull.merged, false);
    assert.equal(model.condition("Ready"), "false");

    await model.pass();
    assert.ok(model.workflows.has("review:9:ddd444"), "a new head is a new review request");
  });

  it("deletion removes the label (an effect), then the finalizer", async () => {
    const pull = forge.addPull(REPO, { number: 10, title: "Drop the doohickey", head: "eee555", labels: ["pi-workflows", "keep"] });
    const model = new Model(spec(10), "uid-10");
    model.resource.metadata.finalizers = [FINALIZER, "someone-else/finalizer"];
    model.resource.metadata.deletionTimestamp = 1_700_000_500_000;
    const { end } = await model.pass();
    assert.deepEqual(pull.labels, ["keep"]);
    assert.deepEqual(model.actions, ["unlabel:10 apply", "unlabel:10 settled applied"]);
    assert.equal(end.kind === "finished" && end.result, "settled");
    assert.deepEqual(model.resource.metadata.finalizers, ["someone-else/finalizer"], "only its own finalizer is removed");
  });
});
