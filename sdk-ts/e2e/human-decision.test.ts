/**
 * A `humanDecision` checkpoint through the real server binary and the node
 * runner (the authoring API a user writes): the runner seals the request in
 * TypeScript and the server (Rust, `wire::decision`) accepts the seals, opens
 * one pending decision, refuses the ordinary `checkpoint.answer`, and settles
 * it only through `decision.answer` with the digest the view shows; the
 * continuation routes on the chosen id and completes.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { RELEASE_GATE } from "../test-support/workflows.js";
import { type TestClient, TestServer, stepNodes } from "../test-support/server.js";


let server: TestServer;
let client: TestClient;
let project: string;

before(async () => {
  server = await TestServer.start();
  project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "release-gate.workflow.ts"), RELEASE_GATE);
  client = await server.connect();
});

after(async () => {
  client?.close();
  await server?.stop();
});

interface ShownDecision {
  decisionId: string;
  requestDigest: string;
  title: string;
  choices: unknown;
}

describe("humanDecision with the node runner", () => {
  it("the TypeScript-sealed request opens one decision; only decision.answer settles it and the continuation routes on the choice", async () => {
    const runId = await client.start(project, "release-gate");
    const waiting = await client.settled(runId);
    assert.equal(waiting.status.run, "waiting", `${JSON.stringify(waiting.display)}\n${server.serverLog()}`);
    assert.deepEqual(waiting.display.controls, ["humanAnswer", "pause", "cancel"]);
    const decision = (waiting as unknown as { decision: ShownDecision }).decision;
    assert.equal(decision.title, "Publish the release?");
    assert.equal((decision as unknown as { summary: string }).summary, "The release notes are drafted.");
    assert.match(decision.decisionId, /^decision-[0-9a-f]{40}$/);
    assert.ok(!JSON.stringify(waiting).includes("v1 notes"), "the view never shows the subject");

    const ordinary = await client.command("checkpoint.answer", { answer: { choice: "ship" } }, runId);
    assert.equal(ordinary.outcome, "rejected", JSON.stringify(ordinary));
    assert.equal(ordinary.error?.code, "decisionRequired");

    const stale = await client.command(
      "decision.answer",
      { decisionId: decision.decisionId, requestDigest: `sha256:${"0".repeat(64)}`, choice: "ship", input: null, source: { channel: "cli", actorId: "ana" } },
      runId,
    );
    assert.notEqual(stale.outcome, "accepted", "an answer to another request digest is refused");

    const answered = await client.command(
      "decision.answer",
      { decisionId: decision.decisionId, requestDigest: decision.requestDigest, choice: "revise", input: { change: "fix the changelog" }, source: { channel: "cli", actorId: "ana" } },
      runId,
    );
    assert.equal(answered.outcome, "accepted", JSON.stringify(answered));
    const continuationRunId = (answered.receipt as { continuationRunId: string }).continuationRunId;
    const continued = await client.settled(continuationRunId);
    assert.equal(continued.status.run, "completed", `${JSON.stringify(continued.display)}\n${server.serverLog()}`);
    assert.deepEqual(stepNodes(continued), ["draft", "gate", "revised"], "the parent's steps are carried, and the revise case ran");
    const revised = server.journal(continuationRunId).filter((record) => record.event === "node" && record.nodeId === "revised");
    assert.deepEqual(revised.at(-1)?.output, { revise: { choice: "revise", input: { change: "fix the changelog" } } }, "the accepted response is the checkpoint's output");
  });
});
