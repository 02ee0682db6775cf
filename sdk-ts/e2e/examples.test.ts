/**
 * Each example workflow through the real server binary and real node
 * runners: terminal state and steps from `run.view` over the socket; node
 * outputs from the runner journal (PI_WORKFLOWS_RUNNER_JOURNAL), because
 * run-view.v1 carries no node outputs yet.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { EXAMPLES_DIR, type TestClient, TestServer, stepNodes } from "../test-support/server.js";

let server: TestServer;
let client: TestClient;
let project: string;

before(async () => {
  server = await TestServer.start();
  project = server.project();
  for (const file of readdirSync(EXAMPLES_DIR)) cpSync(join(EXAMPLES_DIR, file), join(project, ".pi", "workflows", file));
  client = await server.connect();
});

after(async () => {
  client?.close();
  await server?.stop();
});

/** The output the runner proposed (and the server accepted) for `nodeId` in `runId` (read once the runner journaled its exit: it journals a node after the server's reply, which can land after the run settled). */
async function output(runId: string, nodeId: string): Promise<unknown> {
  const records = (await server.journalAfterExit(runId)).filter((record) => record.event === "node" && record.nodeId === nodeId);
  assert.ok(records.length > 0, `no journal record of ${nodeId} in ${runId}`);
  return records.at(-1)?.output;
}

describe("examples", () => {
  it("linear runs its three nodes and completes with the summary", async () => {
    const runId = await client.start(project, "linear", { name: "Ada" });
    const view = await client.settled(runId);
    assert.equal(view.status.run, "completed", JSON.stringify(view));
    assert.equal(view.title, "Greet Ada");
    assert.deepEqual(stepNodes(view), ["greet", "shout", "summarize"]);
    assert.deepEqual(await output(runId, "summarize"), { greeting: "Hello, Ada", shouted: "HELLO, ADA!" });
    // One durable commit per step: each result's reply carried the next node with its committed
    // deadline, so the node runner reported only the first node's start. Every message that
    // commits stores its runner-message receipt: ready, greet's start and three results.
    const sql = (query: string): string => execFileSync("sqlite3", [join(server.home, "state.sqlite"), query], { encoding: "utf8" }).trim();
    const epoch = sql(`SELECT runner_epoch FROM run_workers WHERE run_id = '${runId}'`);
    assert.equal(sql(`SELECT count(*) FROM worker_messages WHERE runner_epoch = '${epoch}'`), "5");
    assert.equal(sql(`SELECT count(*) FROM node_attempts WHERE run_id = '${runId}' AND deadline_at_ms = started_at_ms + 900000`), "2", "shout and summarize: the engine default, committed at dispatch");
  });

  it("switch routing follows $.route", async () => {
    const large = await client.start(project, "switch", { size: 50 });
    const small = await client.start(project, "switch", { size: 2 });
    const [largeView, smallView] = [await client.settled(large), await client.settled(small)];
    assert.deepEqual([largeView.status.run, ...stepNodes(largeView)], ["completed", "classify", "large"]);
    assert.deepEqual([smallView.status.run, ...stepNodes(smallView)], ["completed", "classify", "small"]);
    assert.deepEqual(await output(large, "large"), { handledBy: "large", size: 50 });
  });

  it("failure routing continues through $result.outcome", async () => {
    const failing = await client.start(project, "failure-routing", {});
    const view = await client.settled(failing);
    assert.equal(view.status.run, "completed");
    assert.deepEqual(view.steps.items.map((step) => `${step.nodeId}:${step.outcome}`), ["fetch:failed", "recover:ok"]);
    assert.deepEqual(await output(failing, "recover"), { used: "cached", because: "the upstream service is unavailable" });
    const working = await client.start(project, "failure-routing", { fail: false });
    assert.deepEqual(stepNodes(await client.settled(working)), ["fetch", "use"]);
  });

  it("a loop completes within maxSteps, and fails when it would exceed them", async () => {
    const short = await client.start(project, "loop", { target: 3 });
    const done = await client.settled(short);
    assert.equal(done.status.run, "completed");
    assert.equal(done.steps.items.length, 7);
    assert.deepEqual(await output(short, "done"), { count: 3 });
    const long = await client.start(project, "loop", { target: 9 });
    const failed = await client.settled(long);
    assert.equal(failed.status.run, "failed");
    assert.equal(failed.steps.items.length, 10, "maxSteps: 10 real steps ran, no more");
    assert.match(failed.display.reason ?? "", /maxSteps/);
  });

  it("an input the workflow's parser rejects refuses run.start", async () => {
    const response = await client.command("run.start", { workflow: "loop", input: { target: -1 }, executionMode: "headless", projectPath: project });
    assert.equal(response.outcome, "rejected");
    assert.match(response.error?.message ?? "", /target must be a positive integer/);
  });

  it("a checkpoint waits; its answer starts exactly one continuation, which completes", async () => {
    const runId = await client.start(project, "checkpoint", {});
    const waiting = await client.settled(runId);
    assert.equal(waiting.status.run, "waiting");
    assert.equal(waiting.display.waitingOn, "review");
    assert.deepEqual(await output(runId, "review"), { summary: "approve the draft?", draft: { text: "release notes v1" } });
    const answer = { approver: "ana" };
    const first = await client.command("checkpoint.answer", { answer }, runId);
    assert.equal(first.outcome, "accepted", JSON.stringify(first));
    const continuationRunId = (first.receipt as { continuationRunId: string }).continuationRunId;
    const again = await client.command("checkpoint.answer", { answer }, runId);
    assert.equal((again.receipt as { continuationRunId: string } | undefined)?.continuationRunId, continuationRunId, "the same continuation");
    const other = await client.command("checkpoint.answer", { answer: { approver: "bo" } }, runId);
    assert.notEqual(other.outcome, "accepted", "a different answer cannot start a second continuation");
    const continued = await client.settled(continuationRunId);
    assert.equal(continued.status.run, "completed");
    assert.deepEqual(await output(continuationRunId, "publish"), { published: "release notes v1", approvedBy: "ana" });
    const commands = server.journal(continuationRunId).filter((record) => record.event === "command");
    assert.equal(commands.length, 1);
    assert.equal(commands[0]?.command, "continue");
  });

  it("release (the README's main job): compute, shell progress, the included review, a checkpoint and its continuation", async () => {
    const runId = await client.start(project, "release", { task: "ship it", steps: 3 });
    const waiting = await client.settled(runId);
    assert.equal(waiting.status.run, "waiting", JSON.stringify(waiting.display));
    assert.equal(waiting.title, "Release: ship it");
    assert.deepEqual(stepNodes(waiting), ["plan", "build", "review", "review/check", "review/approve", "review/__piw_exit_approved", "approve"]);
    const progress = waiting.updates.items.find((update) => update.type === "progress" && update.key === "build");
    assert.deepEqual(progress?.data, { status: "completed", completed: 3, total: 3, unit: "steps" });
    const answered = await client.command("checkpoint.answer", { answer: { approver: "ana" } }, runId);
    assert.equal(answered.outcome, "accepted", JSON.stringify(answered));
    const continuationRunId = (answered.receipt as { continuationRunId: string }).continuationRunId;
    const done = await client.settled(continuationRunId);
    assert.equal(done.status.run, "completed");
    assert.deepEqual(await output(continuationRunId, "publish"), { published: "ship it", approvedBy: "ana" });
  });
});
