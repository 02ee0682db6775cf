/**
 * Agent workflows end to end: the real server binary, the node runner, real
 * Pi (`pi --mode rpc` with the bridge extension) and the mock model. A run
 * started with `pi-workflows start` runs its agent step headless; the
 * validation child rejects the first submission, the model sees the stored
 * error and corrects it, and the accepted output routes the run. Run with
 * `npm run test:pi`.
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { type TestContext, describe, it } from "node:test";

import { reply, stepContract, submitStep } from "../test-support/mock-model.js";
import { MOCK_ALT_MODEL_ID, MOCK_MODEL_ID, MOCK_PROVIDER, piFixture, processAlive } from "../test-support/pi.js";
import { TestServer, stepNodes } from "../test-support/server.js";
import { callKey } from "../src/runner/pi-bridge.js";
import { REVIEW_WORKFLOW } from "../test-support/workflows.js";

describe("agent workflows through the server with real Pi", () => {
  it("pi-workflows start runs the agent step headless; validate rejects the first submission, the model sees the error, the second is accepted and routes the run", async (t) => {
    const approved = { verdict: "approve", reason: "the tests pass" };
    const { mock, sandbox } = await piFixture(t, {
      rules: [
        { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
        { name: "corrected", lastRole: "tool", when: "Output rejected for step review", reply: submitStep(approved) },
        { name: "first", lastRole: "user", when: "Workflow step contract (workflow: review, step: review", reply: submitStep({ verdict: "maybe" }) },
      ],
    });
    const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
    t.after(() => server.stop());
    const project = server.project();
    writeFileSync(join(project, ".pi", "workflows", "review.workflow.ts"), REVIEW_WORKFLOW);
    const out = await server.cli(["start", "review", "fix", "the", "bug"], project);
    const runId = /started run (\S+)/.exec(out)?.[1];
    assert.ok(runId, out);
    const client = await server.connect();
    t.after(() => client.close());
    const view = await client.settled(runId);
    assert.equal(view.status.run, "completed", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    assert.deepEqual(stepNodes(view), ["review", "ship"], "the accepted verdict routed the run");
    assert.equal(view.status.executionMode, "headless");

    const toolTexts = mock.requests.flatMap((request) => request.messages.filter((m) => m.role === "tool").map((m) => m.text));
    assert.ok(
      toolTexts.includes('Output rejected for step review: verdict must be approve or reject, got "maybe". Correct the output and call the workflow tool again.'),
      `the model sees the stored error: ${toolTexts.join(" | ")}`,
    );
    assert.ok(toolTexts.some((text) => text.startsWith("Output accepted for step review.")), toolTexts.join(" | "));
    const prompt = mock.requests[0]?.messages.find((m) => m.role === "user")?.text ?? "";
    assert.match(prompt, /^Review the change: fix the bug\n\n---\nWorkflow step contract \(workflow: review, step: review, attempt: [0-9a-f-]+\)\n/);
    const records = await server.journalAfterExit(runId);
    const review = records.filter((record) => record.event === "node" && record.nodeId === "review");
    assert.deepEqual(review.map((record) => record.output), [approved], "one attempt, the accepted output");
  });
});

async function until(what: string, check: () => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** A server and a headless `review` run whose agent step is inside a `sleep 300` bash tool call; resolves once the tool runs. */
async function startSleepingStep(t: TestContext) {
  const { sandbox, mock } = await piFixture(t);
  const pidFile = join(sandbox.root, "tool.pid");
  mock.setRules([{ name: "sleep", lastRole: "user", when: "Workflow step contract", reply: reply.toolCall("bash", { command: `echo $$ > ${pidFile}; exec sleep 300` }) }]);
  const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
  t.after(() => server.stop());
  const project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "review.workflow.ts"), REVIEW_WORKFLOW);
  const out = await server.cli(["start", "review", "slow"], project);
  const runId = /started run (\S+)/.exec(out)?.[1];
  assert.ok(runId, out);
  await until("the bash tool to start", () => existsSync(pidFile) && readFileSync(pidFile, "utf8").trim() !== "");
  return { server, mock, runId, toolPid: Number(readFileSync(pidFile, "utf8").trim()) };
}

/** The parent pid of `pid` (from /proc). */
function parentOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
}

describe("cancelling an agent step through the server", () => {
  it("cancellation mid-turn stops Pi and every tool descendant; no process of the run is left", async (t) => {
    const { server, runId, toolPid } = await startSleepingStep(t);
    const piPid = parentOf(toolPid);
    assert.notEqual(piPid, toolPid);
    assert.ok(processAlive(toolPid) && processAlive(piPid), "the tool and its Pi run");
    await server.cli(["cancel", runId]);
    const client = await server.connect();
    t.after(() => client.close());
    const view = await client.settled(runId);
    assert.equal(view.status.run, "cancelled", server.serverLog());
    await until("Pi and its tool to be gone", () => !processAlive(toolPid) && !processAlive(piPid), 15_000);
  });
});

describe("a runner killed during an agent step", () => {
  it("its registered Pi group is reaped, and the step runs again once and completes", async (t) => {
    const { server, mock, runId, toolPid } = await startSleepingStep(t);
    // Walk up from the tool to the runner (the process running the runner's bin.js).
    let runnerPid = parentOf(toolPid);
    const chain: number[] = [];
    while (runnerPid > 1 && !readFileSync(`/proc/${runnerPid}/cmdline`, "utf8").includes("runner/bin.js")) {
      chain.push(runnerPid);
      runnerPid = parentOf(runnerPid);
    }
    assert.ok(runnerPid > 1, "found the runner above the tool");
    const piPid = chain.at(-1) as number;
    const approved = { verdict: "approve", reason: "after the crash" };
    mock.setRules([
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: "Workflow step contract", reply: submitStep(approved) },
    ]);
    process.kill(runnerPid, "SIGKILL");
    await until("the old Pi group and its tool to be reaped", () => !processAlive(toolPid) && !processAlive(piPid), 20_000).catch((error: unknown) => {
      throw new Error(`${String(error)}; tool ${toolPid} alive ${processAlive(toolPid)}, pi ${piPid} alive ${processAlive(piPid)}, runner ${runnerPid} alive ${processAlive(runnerPid)}\n${server.serverLog()}`);
    });
    const client = await server.connect();
    t.after(() => client.close());
    const view = await client.settled(runId, 60_000);
    assert.equal(view.status.run, "completed", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    assert.deepEqual(stepNodes(view), ["review", "ship"]);
    const review = view.steps.items.find((step) => step.nodeId === "review");
    assert.equal(review?.attempts.filter((attempt) => attempt.outcome === "ok").length, 1, JSON.stringify(review));
    // One request per attempt: the new attempt's is accepted, none is left pending for the killed one.
    const okAttempt = review?.attempts.find((attempt) => attempt.outcome === "ok")?.attemptId;
    const requests = sql(server, `SELECT attempt_id, status FROM interactive_requests WHERE run_id = '${runId}' ORDER BY created_at_ms`);
    assert.equal(requests.length, 2, JSON.stringify(requests));
    assert.deepEqual(requests.filter(([, status]) => status === "pending"), [], `no request left pending: ${JSON.stringify(requests)}`);
    assert.deepEqual(requests.filter(([attempt]) => attempt === okAttempt), [[okAttempt, "accepted"]]);
  });
});

/** One query on the server's state file (read-only, through the sqlite3 CLI). */
function sql(server: TestServer, query: string): string[][] {
  const out = execFileSync("sqlite3", ["-readonly", "-separator", "\t", join(server.home, "state.sqlite"), query], { encoding: "utf8" });
  return out.split("\n").filter((line) => line !== "").map((line) => line.split("\t"));
}

describe("repeated submissions through the server", () => {
  it("a duplicate submit waits for and adopts the same outcome; the same key with another payload conflicts", async (t) => {
    const approved = { verdict: "approve", reason: "ok" };
    const { sandbox } = await piFixture(t, {
      rules: [
        { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
        { name: "submit", lastRole: "user", when: "Workflow step contract", reply: submitStep(approved) },
      ],
    });
    const release = join(sandbox.root, "release-validation");
    const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
    t.after(() => server.stop());
    const project = server.project();
    // validate waits until the test releases it, so the submission stays `validating`.
    writeFileSync(
      join(project, ".pi", "workflows", "review.workflow.ts"),
      REVIEW_WORKFLOW.replace(
        "validate: (output) => {",
        `validate: async (output) => {\n        while (!(await import("node:fs")).existsSync(${JSON.stringify(release)})) await new Promise((r) => setTimeout(r, 50));`,
      ),
    );
    const out = await server.cli(["start", "review", "dup"], project);
    const runId = /started run (\S+)/.exec(out)?.[1];
    assert.ok(runId, out);
    let rows: string[][] = [];
    await until("a validating submission", () => {
      rows = sql(server, "SELECT s.interaction_id, s.submission_id, s.idempotency_key, r.attempt_id FROM interactive_submissions s JOIN interactive_requests r USING (interaction_id) WHERE s.outcome = 'validating'");
      return rows.length === 1;
    });
    const [interactionId, submissionId, key, attemptId] = rows[0] as string[];
    const [[generation, runnerEpoch]] = sql(server, `SELECT generation, runner_epoch FROM run_workers WHERE run_id = '${runId}' AND status = 'ready'`) as [[string, string]];
    const authority = { kind: "runner", generation: Number(generation), runnerEpoch };
    const client = await server.connect();
    t.after(() => client.close());
    const payload = { interactionId, attemptId, submissionId, authority, output: approved };
    const conflicting = await client.request("interaction.submit", { ...payload, output: { verdict: "reject", reason: "other" } }, { runId, idempotencyKey: key });
    assert.equal(conflicting.outcome, "conflict", JSON.stringify(conflicting));
    assert.equal(conflicting.error?.code, "conflict");
    const duplicate = client.request("interaction.submit", payload, { runId, idempotencyKey: key });
    let answered = false;
    void duplicate.then(() => (answered = true));
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal(answered, false, "the duplicate waits for the durable outcome");
    writeFileSync(release, "");
    const adopted = await duplicate;
    assert.equal(adopted.outcome, "adopted", JSON.stringify(adopted));
    assert.deepEqual(adopted.receipt, { submissionId, outcome: "accepted", accepted: { output: approved } });
    const view = await client.settled(runId, 60_000);
    assert.equal(view.status.run, "completed", server.serverLog());
    assert.deepEqual(sql(server, `SELECT outcome FROM interactive_submissions WHERE interaction_id = '${interactionId}'`), [["accepted"]], "one submission, one outcome");
  });
});

describe("updates from a headless agent step", () => {
  it("an update publishes progress that the view shows", async (t) => {
    const approved = { verdict: "approve", reason: "reviewed" };
    const progress = { phase: "reading", done: 1, of: 3 };
    const { mock, sandbox } = await piFixture(t, {
      rules: [
        { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
        { name: "submit", lastRole: "tool", when: "Workflow update recorded", reply: submitStep(approved) },
        {
          name: "update",
          lastRole: "user",
          when: "Workflow step contract (workflow: review, step: review",
          reply: (request) => {
            const contract = stepContract(request);
            return reply.toolCall("workflow", {
              action: "update",
              step: contract?.step,
              attempt: contract?.attempt,
              update: { type: "progress", key: "overall", data: progress },
            }, { id: "call-update-1" });
          },
        },
      ],
    });
    const gate = join(sandbox.root, "release-validation");
    const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
    t.after(() => server.stop());
    const project = server.project();
    // validate waits until the test has seen the update in the live view.
    writeFileSync(
      join(project, ".pi", "workflows", "review.workflow.ts"),
      REVIEW_WORKFLOW.replace(
        "validate: (output) => {",
        `validate: async (output) => {\n        while (!(await import("node:fs")).existsSync(${JSON.stringify(gate)})) await new Promise((r) => setTimeout(r, 50));`,
      ),
    );
    const out = await server.cli(["start", "review", "with", "progress"], project);
    const runId = /started run (\S+)/.exec(out)?.[1];
    assert.ok(runId, out);
    const client = await server.connect();
    t.after(() => client.close());
    const toolTexts = () => mock.requests.flatMap((request) => request.messages.filter((m) => m.role === "tool").map((m) => m.text));
    // Until the view shows an update, the run ends, or the model saw the
    // tool's answer to it (a refusal included). A run still `queued` (its
    // resolver not yet handed the launch) has not started, so it is waited
    // for too.
    const live = await client.waitFor(
      runId,
      (view) =>
        view.updates.items.length > 0 ||
        (view.status.run !== "queued" && view.status.run !== "running") ||
        toolTexts().some((text) => text.startsWith("Workflow update")),
      60_000,
      "an update or the tool's answer",
    );
    assert.equal(live.status.run, "running", `${JSON.stringify(live.display)} | ${toolTexts().join(" | ")}\n${server.serverLog()}`);
    assert.equal(live.updates.items.length, 1, `the live view shows the update: ${toolTexts().join(" | ")}`);
    const [update] = live.updates.items;
    const attempt = live.steps.items.find((step) => step.nodeId === "review")?.attempts.at(-1);
    assert.deepEqual(
      { type: update?.type, key: update?.key, data: update?.data, attemptId: update?.attemptId },
      { type: "progress", key: "overall", data: progress, attemptId: attempt?.attemptId },
    );
    // The tool call's receipt over the wire: the identical update adopts it, the same key with other data conflicts.
    const [[generation, runnerEpoch]] = sql(server, `SELECT generation, runner_epoch FROM run_workers WHERE run_id = '${runId}' AND status = 'ready'`) as [[string, string]];
    const [[interactionId]] = sql(server, `SELECT interaction_id FROM interactive_requests WHERE run_id = '${runId}'`) as [[string]];
    const payload = {
      interactionId,
      attemptId: attempt?.attemptId,
      toolCallId: callKey("tc", "call-update-1"),
      authority: { kind: "runner", generation: Number(generation), runnerEpoch },
      update: { type: "progress", key: "overall", data: progress },
    };
    const idempotencyKey = callKey("update", "call-update-1");
    const repeated = await client.request("interaction.update", payload, { runId, idempotencyKey });
    assert.equal(repeated.outcome, "adopted", JSON.stringify(repeated));
    assert.deepEqual(repeated.receipt, { updateId: update?.updateId, seq: update?.seq });
    const conflicting = await client.request("interaction.update", { ...payload, update: { ...payload.update, data: { phase: "other" } } }, { runId, idempotencyKey });
    assert.equal(conflicting.outcome, "conflict", JSON.stringify(conflicting));
    const stale = await client.request("interaction.update", { ...payload, authority: { ...payload.authority, runnerEpoch: "re-not-the-runner" } }, { runId, idempotencyKey });
    assert.equal(stale.outcome, "claimLost", `another runner's authority is refused before the receipt: ${JSON.stringify(stale)}`);
    writeFileSync(gate, "");
    const view = await client.settled(runId, 60_000);
    assert.equal(view.status.run, "completed", server.serverLog());
    assert.deepEqual(stepNodes(view), ["review", "ship"]);
    assert.ok(toolTexts().includes("Workflow update recorded. Continue the same step."), toolTexts().join(" | "));
    assert.deepEqual(sql(server, `SELECT update_type, update_key FROM workflow_updates WHERE run_id = '${runId}'`), [["progress", "overall"]]);
  });
});

describe("a server killed during validation", () => {
  it("a server SIGKILLed while a submission is validating ends, after restart, with exactly one outcome", async (t) => {
    const first = { verdict: "approve", reason: "before the crash" };
    const { sandbox, mock } = await piFixture(t, {
      rules: [
        { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
        { name: "submit", lastRole: "user", when: "Workflow step contract", reply: submitStep(first) },
      ],
    });
    const gate = join(sandbox.root, "release-validation");
    const calls = join(sandbox.root, "validate-calls");
    const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
    t.after(() => server.stop());
    const project = server.project();
    // validate records its process and the submitted reason, then waits until the test releases it.
    writeFileSync(
      join(project, ".pi", "workflows", "review.workflow.ts"),
      REVIEW_WORKFLOW.replace(
        "validate: (output) => {",
        `validate: async (output) => {
        const fs = await import("node:fs");
        fs.appendFileSync(${JSON.stringify(calls)}, process.pid + " " + (output as { reason?: string }).reason + "\\n");
        while (!fs.existsSync(${JSON.stringify(gate)})) await new Promise((r) => setTimeout(r, 50));`,
      ),
    );
    const out = await server.cli(["start", "review", "crash"], project);
    const runId = /started run (\S+)/.exec(out)?.[1];
    assert.ok(runId, out);
    const validateCalls = (): string[][] => (existsSync(calls) ? readFileSync(calls, "utf8").split("\n").filter((line) => line !== "").map((line) => line.split(" ")) : []);
    await until("the first validation to run", () => validateCalls().length === 1, 60_000);
    const [[submissionId, interactionId]] = sql(server, "SELECT submission_id, interaction_id FROM interactive_submissions WHERE outcome = 'validating'") as [[string, string]];
    const validatorPid = Number(validateCalls()[0]?.[0]);
    const serverPid = parentOf(validatorPid);
    assert.ok(readFileSync(`/proc/${serverPid}/cmdline`, "utf8").includes("server"), "the validation child's parent is the server");
    // After the crash the model submits another output, so each validate call says whose it is.
    const second = { verdict: "approve", reason: "after the crash" };
    mock.setRules([
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: "Workflow step contract", reply: submitStep(second) },
    ]);
    process.kill(serverPid, "SIGKILL");
    await until("the server to be gone", () => !processAlive(serverPid), 10_000);
    const restarted = await server.cli(["server", "start"]);
    assert.match(restarted, /pi-workflows server started/);
    await until("recovery to validate the crashed submission in a new child", () => validateCalls().filter(([, reason]) => reason === "before").length === 2, 60_000).catch((error: unknown) => {
      throw new Error(`${String(error)}: ${JSON.stringify(validateCalls())}\n${server.serverLog()}`);
    });
    const recovered = validateCalls().filter(([, reason]) => reason === "before");
    assert.notEqual(recovered[1]?.[0], recovered[0]?.[0], "a new validation child");
    writeFileSync(gate, "");
    const client = await server.connect();
    t.after(() => client.close());
    const view = await client.settled(runId, 90_000);
    assert.equal(view.status.run, "completed", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    assert.deepEqual(stepNodes(view), ["review", "ship"]);
    const review = view.steps.items.find((step) => step.nodeId === "review");
    assert.equal(review?.attempts.filter((attempt) => attempt.outcome === "ok").length, 1, JSON.stringify(review));
    // The crashed submission has exactly one outcome; nothing is left validating.
    const outcome = sql(server, `SELECT outcome FROM interactive_submissions WHERE submission_id = '${submissionId}'`);
    assert.equal(outcome.length, 1);
    assert.ok(["accepted", "rejected"].includes(outcome[0]?.[0] ?? ""), `one final outcome: ${JSON.stringify(outcome)}`);
    assert.deepEqual(sql(server, "SELECT COUNT(*) FROM interactive_submissions WHERE outcome = 'validating'"), [["0"]]);
    assert.deepEqual(sql(server, `SELECT COUNT(*) FROM interactive_submissions WHERE interaction_id = '${interactionId}'`), [["1"]]);
  });
});

describe("headless agent steps that end without an accepted output", () => {
  it("a step whose model never submits fails after two reminders, and $result.outcome routes the run", async (t) => {
    const { mock, sandbox } = await piFixture(t, { rules: [{ name: "idle", reply: reply.text("I will not call the tool.") }] });
    const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
    t.after(() => server.stop());
    const project = server.project();
    writeFileSync(
      join(project, ".pi", "workflows", "review.workflow.ts"),
      REVIEW_WORKFLOW.replace(
        'edges: [{ from: "review", switch: { on: "$.verdict", cases: { approve: "ship", reject: "rework" } } }]',
        'edges: [{ from: "review", switch: { on: "$result.outcome", cases: { ok: "ship", failed: "rework" } } }]',
      ),
    );
    assert.match(readFileSync(join(project, ".pi", "workflows", "review.workflow.ts"), "utf8"), /"\$result\.outcome"/);
    const out = await server.cli(["start", "review", "stall"], project);
    const runId = /started run (\S+)/.exec(out)?.[1];
    assert.ok(runId, out);
    const client = await server.connect();
    t.after(() => client.close());
    const view = await client.settled(runId, 60_000);
    assert.equal(view.status.run, "completed", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    assert.deepEqual(view.steps.items.map((step) => `${step.nodeId}:${step.outcome}`), ["review:failed", "rework:ok"], "the failed outcome routed the run");
    // One prompt and two reminders, each one model turn; then the step failed.
    const prompts = mock.requests.map((request) => request.last?.text ?? "");
    assert.equal(prompts.length, 3, prompts.join(" | "));
    assert.match(prompts[0] ?? "", /Workflow step contract \(workflow: review, step: review/);
    assert.match(prompts[1] ?? "", /^Reminder: workflow step review is still awaiting your output \(1 reminder left\)\./);
    assert.match(prompts[2] ?? "", /^Reminder: workflow step review is still awaiting your output \(0 reminders left\)\./);
    const records = await server.journalAfterExit(runId);
    const review = records.find((record) => record.event === "node" && record.nodeId === "review");
    assert.match(String(review?.error), /the agent settled 3 times without submitting step review via the workflow tool/);
  });

  it("a visible assistant-message step of a headless run fails with headlessAssistantMessage and starts no Pi", async (t) => {
    const { mock, sandbox } = await piFixture(t, { rules: [{ name: "any", reply: reply.text("unexpected") }] });
    const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
    t.after(() => server.stop());
    const project = server.project();
    writeFileSync(
      join(project, ".pi", "workflows", "say.workflow.ts"),
      `import { agent, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "say", startAt: "say", nodes: { say: agent({ prompt: "Say hello", expectedOutput: { kind: "assistant-message" } }) } });\n`,
    );
    const out = await server.cli(["start", "say"], project);
    const runId = /started run (\S+)/.exec(out)?.[1];
    assert.ok(runId, out);
    const client = await server.connect();
    t.after(() => client.close());
    const view = await client.settled(runId);
    assert.equal(view.status.run, "failed", JSON.stringify(view.display));
    assert.deepEqual(view.steps.items.map((step) => `${step.nodeId}:${step.outcome}`), ["say:failed"]);
    assert.match(view.display.reason ?? "", /needs an origin Pi session/);
    // The runner refuses the step with the closed code `headlessAssistantMessage`
    // on its `node.failed` frame (schema-checked by the server); the run's
    // stored failure is that node's failure, with the message saying what to do.
    const [row] = sql(server, `SELECT error_class, error_reason, error_node, error_message FROM runs WHERE run_id = '${runId}'`);
    assert.deepEqual(row, [
      "nodeFailed",
      "nodeFailed",
      "say",
      "agent say: a visible assistant-message step needs an origin Pi session, and a headless run has none; start the run from Pi, or make the step submit its output",
    ]);
    const runnerLogs = readdirSync(join(server.home, "host", "logs")).map((name) => readFileSync(join(server.home, "host", "logs", name), "utf8"));
    assert.ok(runnerLogs.some((log) => log.includes("headlessAssistantMessage")), `the runner logged the closed code: ${runnerLogs.join("\n")}`);
    assert.equal(mock.requests.length, 0, "no Pi was started: the model saw nothing");
  });
});

describe("the run's model arguments", () => {
  it("pi-workflows start --model provider/model --thinking level reaches the Pi child of a workflow without a model", async (t) => {
    const approved = { verdict: "approve", reason: "chosen model" };
    const { mock, sandbox } = await piFixture(t, {
      rules: [
        { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
        { name: "submit", lastRole: "user", when: "Workflow step contract", reply: submitStep(approved) },
      ],
    });
    const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
    t.after(() => server.stop());
    const project = server.project();
    writeFileSync(
      join(project, ".pi", "workflows", "review.workflow.ts"),
      REVIEW_WORKFLOW.replace(`  model: { provider: "${MOCK_PROVIDER}", model: "${MOCK_MODEL_ID}" },\n`, ""),
    );
    assert.doesNotMatch(readFileSync(join(project, ".pi", "workflows", "review.workflow.ts"), "utf8"), /model: \{/);
    const out = await server.cli(["start", "review", "--model", `${MOCK_PROVIDER}/${MOCK_ALT_MODEL_ID}`, "--thinking", "low", "pick", "a", "model"], project);
    const runId = /started run (\S+)/.exec(out)?.[1];
    assert.ok(runId, out);
    const client = await server.connect();
    t.after(() => client.close());
    const view = await client.settled(runId, 60_000);
    assert.equal(view.status.run, "completed", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    assert.ok(mock.requests.length > 0);
    assert.deepEqual([...new Set(mock.requests.map((request) => request.body.model))], [MOCK_ALT_MODEL_ID], "every model request names the run's model, not Pi's default");
    // A malformed --model is refused before anything is sent.
    await assert.rejects(server.cli(["start", "review", "--model", "no-slash"], project), /--model takes provider\/model/);
    await assert.rejects(server.cli(["start", "review", "--thinking", "extreme"], project), /--thinking takes one of off, minimal, low, medium, high, xhigh/);
  });
});

describe("validation children and capacity", () => {
  it("validation children recovered after a restart are admitted through the scheduler: at most PI_WORKFLOWS_MAX_WORKERS at once", async (t) => {
    const first = { verdict: "approve", reason: "before the crash" };
    const { sandbox, mock } = await piFixture(t, {
      rules: [
        { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
        { name: "submit", lastRole: "user", when: "Workflow step contract", reply: submitStep(first) },
      ],
    });
    const gate = join(sandbox.root, "release-validation");
    const calls = join(sandbox.root, "validate-calls");
    const server = await TestServer.start({ env: { PI_WORKFLOWS_PI: sandbox.piExecutable(), PI_WORKFLOWS_MAX_WORKERS: "2" } });
    t.after(() => server.stop());
    const project = server.project();
    writeFileSync(
      join(project, ".pi", "workflows", "review.workflow.ts"),
      REVIEW_WORKFLOW.replace(
        "validate: (output) => {",
        `validate: async (output) => {
        const fs = await import("node:fs");
        fs.appendFileSync(${JSON.stringify(calls)}, process.pid + " " + (output as { reason?: string }).reason + "\\n");
        while (!fs.existsSync(${JSON.stringify(gate)})) await new Promise((r) => setTimeout(r, 50));`,
      ),
    );
    const runIds: string[] = [];
    for (const task of ["one", "two"]) {
      const out = await server.cli(["start", "review", task], project);
      const runId = /started run (\S+)/.exec(out)?.[1];
      assert.ok(runId, out);
      runIds.push(runId);
    }
    const validateCalls = (reason: string): string[] =>
      (existsSync(calls) ? readFileSync(calls, "utf8").split("\n") : []).filter((line) => line.endsWith(` ${reason}`)).map((line) => line.split(" ")[0] as string);
    await until("both submissions to validate", () => validateCalls("before the crash").length === 2, 60_000);
    const serverPid = parentOf(Number(validateCalls("before the crash")[0]));
    mock.setRules([
      { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
      { name: "submit", lastRole: "user", when: "Workflow step contract", reply: submitStep({ verdict: "approve", reason: "after the crash" }) },
    ]);
    process.kill(serverPid, "SIGKILL");
    await until("the server to be gone", () => !processAlive(serverPid), 10_000);
    // One execution slot after the restart: two recovered validations must not both run.
    server.env.PI_WORKFLOWS_MAX_WORKERS = "1";
    await server.cli(["server", "start"]).catch(async (error: unknown) => {
      const status = await server.cli(["server", "status"]).catch((e: unknown) => String(e));
      const log = existsSync(join(server.home, "host", "server.log")) ? readFileSync(join(server.home, "host", "server.log"), "utf8") : "(no server.log)";
      throw new Error(`${String(error)}\nSTATUS ${status}\nLOG ${log.slice(-3000)}`);
    });
    await until("recovery to start a validation child", () => validateCalls("before the crash").length >= 3, 60_000);
    // The gate is closed, so the child that holds the one slot cannot finish; give a second one ample time to (wrongly) start.
    await new Promise((resolve) => setTimeout(resolve, 3_000));
    assert.equal(validateCalls("before the crash").length, 3, `one recovered validation child at a time with one slot: ${readFileSync(calls, "utf8")}`);
    writeFileSync(gate, "");
    const client = await server.connect();
    t.after(() => client.close());
    for (const runId of runIds) {
      const view = await client.settled(runId, 120_000);
      assert.equal(view.status.run, "completed", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    }
    assert.deepEqual(sql(server, "SELECT COUNT(*) FROM interactive_submissions WHERE outcome = 'validating'"), [["0"]], "every submission has its outcome");
  });
});
