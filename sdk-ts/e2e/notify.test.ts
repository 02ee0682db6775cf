/**
 * A real `notify` node through the real server binary and the node runner:
 * the node finishes with its receipt as output and the run goes on; an
 * interactive run's notification lands in its origin session as one passive
 * `notification` message with the text as its content (seed: "A notify node
 * creates a passive `notification` message in the same transaction as its
 * node result"); a headless run has no session, so nothing is delivered and
 * the node still completes.
 */
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { type TestClient, TestServer, stepNodes } from "../test-support/server.js";

const WORKFLOW = `
import { compute, defineWorkflow, notify } from "@pi-workflows/sdk";

export default defineWorkflow({
  name: "announce",
  source: import.meta.url,
  startAt: "build",
  nodes: {
    build: compute({ run: () => ({ artifact: "site.tar" }) }),
    tell: notify({ kind: "final", message: ({ outputs }) => \`Built \${(outputs.build as { artifact: string }).artifact}.\` }),
    after: compute({ run: ({ outputs }) => ({ receipt: outputs.tell }) }),
  },
  edges: [
    { from: "build", to: "tell" },
    { from: "tell", to: "after" },
  ],
});
`;

let server: TestServer;
let client: TestClient;
let project: string;

before(async () => {
  server = await TestServer.start();
  project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "announce.workflow.ts"), WORKFLOW);
  client = await server.connect();
});

after(async () => {
  client?.close();
  await server?.stop();
});

/** The output the runner recorded for `nodeId` in `runId`. */
function output(runId: string, nodeId: string): unknown {
  const records = server.journal(runId).filter((record) => record.event === "node" && record.nodeId === nodeId);
  assert.ok(records.length > 0, `no journal record of ${nodeId} in ${runId}: ${server.serverLog()}`);
  return records.at(-1)?.output;
}

describe("notify", () => {
  it("a headless run's notify node completes and the run goes on", async () => {
    const runId = await client.start(project, "announce");
    const view = await client.settled(runId);
    assert.equal(view.status.run, "completed", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    assert.deepEqual(stepNodes(view), ["build", "tell", "after"]);
    assert.deepEqual(output(runId, "tell"), { notificationId: null, targetSessionId: null, text: "Built site.tar." });
  });

  it("an interactive run's notification lands in its origin session with its text", async () => {
    const session = "session-announce";
    const response = await client.command("run.start", {
      workflow: "announce",
      input: {},
      executionMode: "interactive",
      originSessionId: session,
      projectPath: project,
    });
    assert.equal(response.outcome, "accepted", JSON.stringify(response));
    const runId = (response.receipt as { runId: string }).runId;
    const view = await client.settled(runId);
    assert.equal(view.status.run, "completed", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    const receipt = output(runId, "tell") as { notificationId: string; targetSessionId: string };
    assert.equal(receipt.targetSessionId, session);
    assert.deepEqual(output(runId, "after"), { receipt });
    const sessionView = await client.request("sessionView.get", { sessionId: session });
    assert.equal(sessionView.outcome, "accepted", JSON.stringify(sessionView));
    const window = sessionView.receipt as { messageCount: number; messages: { messageId: string; kind: string; content: { bytes: number } }[] };
    // The notification, and (once built after the terminal commit) the run's terminal message after it.
    assert.deepEqual(
      window.messages.map((message) => message.kind),
      window.messageCount === 1 ? ["notification"] : ["notification", "terminal"],
      JSON.stringify(window),
    );
    assert.equal(window.messages[0]?.messageId, receipt.notificationId);
    assert.equal(window.messages[0]?.content.bytes, Buffer.byteLength("Built site.tar."));
  });
});
