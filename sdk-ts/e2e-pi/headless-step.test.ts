/**
 * A headless agent step of the runner with real Pi (`pi --mode rpc`, the
 * bridge extension) against the mock model. The runner channel is recorded
 * in process and the bridge talks to a fake client socket, so this proves
 * the runner's side: the Pi group, the order of registration, prompt and
 * unregistration, the bridge's request contract and the texts the model
 * sees. Run with `npm run test:pi`.
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import type { Reply, Request } from "../src/generated/types.js";
import type { RunnerChannel } from "../src/runner/channel.js";
import { Executor } from "../src/runner/execute.js";
import { loadAndCompile } from "../src/runner/loader.js";
import { RunState } from "../src/runner/state.js";
import { Fake } from "../test-support/fake-server.js";
import { reply, submitStep } from "../test-support/mock-model.js";
import { MOCK_MODEL_ID, MOCK_PROVIDER, groupAlive, piFixture, processAlive } from "../test-support/pi.js";

const WORKFLOW = `import { agent, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "review",
  startAt: "review",
  model: { provider: "${MOCK_PROVIDER}", model: "${MOCK_MODEL_ID}" },
  nodes: { review: agent({ prompt: "Review the change.", expectedOutput: '{ "verdict": "approve" | "reject" }' }) },
});
`;

interface Sent {
  type: string;
  fields: Record<string, unknown>;
  /** How many model requests the mock had seen when the message was sent. */
  modelRequests: number;
}

/** A runner channel that records what the executor sends and answers like the server of a headless run. */
function headlessChannel(modelRequests: () => number, onSend: (sent: Sent) => void): { channel: RunnerChannel; sent: Sent[] } {
  const sent: Sent[] = [];
  let counter = 0;
  const record = (type: string, fields: Record<string, unknown>): void => {
    counter += 1;
    const entry = { type, fields, modelRequests: modelRequests() };
    sent.push(entry);
    onSend(entry);
  };
  const reply = (type: string): Reply => ({
    type: "reply",
    schema: "pi-workflows.worker-launch.v1",
    runId: "run-1",
    generation: 1,
    runnerEpoch: "re-1",
    inReplyTo: `re-1-m${counter}`,
    outcome: "accepted",
    result: type === "interaction.requested" ? { interactionId: "int-1" } : null,
    ...(type === "node.finished" ? { next: { kind: "exit", reason: "finished" } } : {}),
  });
  const channel = {
    launch: { runId: "run-1", generation: 1, runnerEpoch: "re-1", executionMode: "headless" },
    async send(type: string, fields: Record<string, unknown>) {
      record(type, fields);
      return `re-1-m${counter}`;
    },
    async request(type: string, fields: Record<string, unknown>) {
      record(type, fields);
      return reply(type);
    },
  };
  return { channel: channel as unknown as RunnerChannel, sent };
}

describe("a headless agent step with real Pi", () => {
  it("runs Pi in its own registered group; a rejected submission's error reaches the model; the accepted output is the step's; the group is gone before unregister", async (t) => {
    const accepted = { verdict: "approve" };
    const { mock, sandbox } = await piFixture(t, {
      rules: [
        { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
        { name: "corrected", lastRole: "tool", when: "Output rejected for step review", reply: submitStep(accepted) },
        { name: "first", lastRole: "user", when: "Workflow step contract (workflow: review, step: review", reply: submitStep({ verdict: "maybe" }) },
      ],
    });
    const submits: Request[] = [];
    const fake = await Fake.start({
      onRequest(request, peer) {
        if (request.operation !== "interaction.submit") return;
        submits.push(request);
        const payload = request.payload as { submissionId: string };
        // The server answers only at the durable outcome: here, a little later.
        setTimeout(() => {
          if (submits.length === 1) {
            peer.respond(request, "accepted", { submissionId: payload.submissionId, outcome: "rejected", error: { code: "validationFailed", message: "verdict must be approve or reject" } });
          } else {
            peer.respond(request, "accepted", { submissionId: payload.submissionId, outcome: "accepted", accepted: { output: accepted } });
          }
        }, 200);
      },
    });
    t.after(() => fake.close());
    const saved = { pi: process.env.PI_WORKFLOWS_PI, home: process.env.PI_WORKFLOWS_HOME };
    process.env.PI_WORKFLOWS_PI = sandbox.piExecutable();
    process.env.PI_WORKFLOWS_HOME = fake.dir;
    t.after(() => {
      for (const [key, value] of [["PI_WORKFLOWS_PI", saved.pi], ["PI_WORKFLOWS_HOME", saved.home]] as const) {
        if (value === undefined) delete process.env[key];
        else process.env[key] = value;
      }
    });

    mkdirSync(join(sandbox.projectDir, ".pi", "workflows"), { recursive: true });
    const file = join(sandbox.projectDir, ".pi", "workflows", "review.workflow.ts");
    writeFileSync(file, WORKFLOW);
    const compiled = await loadAndCompile(file, sandbox.projectDir);
    let groupAtUnregister: boolean | undefined;
    const { channel, sent } = headlessChannel(
      () => mock.requests.length,
      (entry) => {
        if (entry.fields.operation === "process.unregister") groupAtUnregister = groupAlive(entry.fields.pid as number);
      },
    );
    const executor = new Executor({
      channel,
      compiled,
      state: new RunState({ input: null, results: {}, resultOrder: [], steps: 0 }),
      runId: "run-1",
      projectPath: sandbox.projectDir,
      log: () => undefined,
      stopSignal: new AbortController().signal,
      journal: () => undefined,
    });
    const after = await executor.run({ nodeId: "review", attemptId: "att-1", visit: 1 });
    assert.equal(after.kind, "reply");

    const types = sent.map((entry) => (entry.type === "runner.progress" ? String(entry.fields.operation) : entry.type));
    assert.deepEqual(types, ["node.started", "interaction.requested", "process.register", "process.unregister", "node.finished"]);
    const register = sent[2] as Sent;
    assert.equal(register.modelRequests, 0, "registered before the prompt reached the model");
    assert.equal(groupAtUnregister, false, "unregistered only after the whole group was gone");
    assert.equal(groupAlive(register.fields.pid as number), false);
    assert.deepEqual((sent[4] as Sent).fields.output, accepted, "the accepted output is the step's output");

    // The model saw the prompt with its contract, the stored error, then the acceptance.
    const first = mock.requests[0];
    assert.ok(first?.messages.some((m) => m.role === "user" && m.text.startsWith("Review the change.\n\n---\nWorkflow step contract (workflow: review, step: review, attempt: att-1)\n")));
    assert.equal(first?.body.model, MOCK_MODEL_ID, "the workflow's model arguments reach Pi");
    assert.ok(first?.tools.includes("workflow"));
    const toolTexts = mock.requests.flatMap((request) => request.messages.filter((m) => m.role === "tool").map((m) => m.text));
    assert.ok(toolTexts.includes("Output rejected for step review: verdict must be approve or reject. Correct the output and call the workflow tool again."), toolTexts.join(" | "));
    assert.ok(toolTexts.some((text) => text.startsWith("Output accepted for step review.")), toolTexts.join(" | "));

    // The bridge's request contract: the exact request, the runner's authority, one key per tool call.
    assert.equal(submits.length, 2);
    for (const request of submits) {
      const payload = request.payload as Record<string, unknown>;
      assert.equal(request.runId, "run-1");
      assert.equal(payload.interactionId, "int-1");
      assert.equal(payload.attemptId, "att-1");
      assert.deepEqual(payload.authority, { kind: "runner", generation: 1, runnerEpoch: "re-1" });
      assert.match(request.idempotencyKey ?? "", /^submit-[0-9a-f]{40}$/);
    }
    assert.notEqual(submits[0]?.idempotencyKey, submits[1]?.idempotencyKey, "each tool call is its own submission");
    assert.deepEqual((submits[0]?.payload as { output: unknown }).output, { verdict: "maybe" });
  });

  it("an abort mid-turn stops Pi and every tool descendant, then unregisters; the attempt reports the abort", async (t) => {
    const { mock, sandbox } = await piFixture(t);
    const pidDir = join(sandbox.root, "pids");
    mkdirSync(pidDir);
    mock.setRules([{ name: "sleep", lastRole: "user", when: "Workflow step contract", reply: reply.toolCall("bash", { command: `echo $$ > ${join(pidDir, "tool.pid")}; exec sleep 300` }) }]);
    const saved = process.env.PI_WORKFLOWS_PI;
    process.env.PI_WORKFLOWS_PI = sandbox.piExecutable();
    t.after(() => {
      if (saved === undefined) delete process.env.PI_WORKFLOWS_PI;
      else process.env.PI_WORKFLOWS_PI = saved;
    });
    mkdirSync(join(sandbox.projectDir, ".pi", "workflows"), { recursive: true });
    const file = join(sandbox.projectDir, ".pi", "workflows", "review.workflow.ts");
    writeFileSync(file, WORKFLOW);
    const compiled = await loadAndCompile(file, sandbox.projectDir);
    let groupAtUnregister: boolean | undefined;
    const { channel, sent } = headlessChannel(
      () => mock.requests.length,
      (entry) => {
        if (entry.fields.operation === "process.unregister") groupAtUnregister = groupAlive(entry.fields.pid as number);
      },
    );
    const stop = new AbortController();
    const executor = new Executor({
      channel,
      compiled,
      state: new RunState({ input: null, results: {}, resultOrder: [], steps: 0 }),
      runId: "run-1",
      projectPath: sandbox.projectDir,
      log: () => undefined,
      stopSignal: stop.signal,
      journal: () => undefined,
    });
    const running = executor.run({ nodeId: "review", attemptId: "att-1", visit: 1 });
    const toolPidFile = join(pidDir, "tool.pid");
    const deadline = Date.now() + 30_000;
    while (!existsSync(toolPidFile) || readFileSync(toolPidFile, "utf8").trim() === "") {
      if (Date.now() > deadline) assert.fail("the bash tool never started");
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const toolPid = Number(readFileSync(toolPidFile, "utf8").trim());
    assert.ok(processAlive(toolPid), "the tool's process runs");
    stop.abort(new Error("the run was cancelled"));
    await assert.rejects(running, /the run was cancelled/);
    // The runner's cleanup (stop the group, then unregister) finishes within its bound.
    const cleanup = Date.now() + 15_000;
    while (!sent.some((entry) => entry.fields.operation === "process.unregister")) {
      if (Date.now() > cleanup) assert.fail(`no unregister: ${sent.map((entry) => entry.type).join(", ")}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const register = sent.find((entry) => entry.fields.operation === "process.register") as Sent;
    assert.equal(groupAtUnregister, false, "unregistered only after the whole group was gone");
    assert.equal(groupAlive(register.fields.pid as number), false);
    assert.equal(processAlive(toolPid), false, "the tool's descendant is gone too");
  });
});
