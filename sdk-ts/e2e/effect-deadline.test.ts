/**
 * A managed effect whose node reaches its deadline while it applies: the
 * node runner aborts the action at the deadline and reports the attempt
 * `timed_out` without settling the effect. Nobody can say whether it reached
 * the external system, so the server records it `ambiguous` (shown in the
 * run view with its recovery), never left `applying` under a finished run.
 */
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { type TestClient, TestServer } from "../test-support/server.js";

let server: TestServer;
let client: TestClient;
let project: string;

before(async () => {
  server = await TestServer.start();
  project = server.project();
  client = await server.connect();
});

after(async () => {
  client?.close();
  await server?.stop();
});

describe("an effect in flight at its node's deadline", () => {
  it("is ambiguous in the finished run, with the apply begun once", async () => {
    const applyLog = join(server.root, "applied.log");
    writeFileSync(
      join(project, ".pi", "workflows", "deploy.workflow.ts"),
      `import { action, defineWorkflow } from "@pi-workflows/sdk";
import { appendFileSync } from "node:fs";
export default defineWorkflow({
  name: "deploy",
  startAt: "deploy",
  nodes: {
    deploy: action({
      timeoutMs: 1500,
      run: async () => {
        appendFileSync(${JSON.stringify(applyLog)}, "began\\n");
        await new Promise((resolve) => setTimeout(resolve, 60_000));
        return { deployed: true };
      },
    }),
  },
  edges: [],
});
`,
    );
    const runId = await client.start(project, "deploy");
    const view = await client.settled(runId, 30_000);
    assert.equal(view.status.run, "timed_out", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    assert.equal(readFileSync(applyLog, "utf8"), "began\n", "the action began once");
    assert.deepEqual(
      (view.ambiguousEffects ?? []).map((effect) => [effect.nodeId, effect.effectType, effect.attemptNumber]),
      [["deploy", "function", 1]],
      `the uncertain effect is ambiguous: ${JSON.stringify(view)}`,
    );
  });
});
