/**
 * End to end through the real server: an include runs under its qualified
 * node ids (`review/check`, `review/__piw_exit_approved`) and leaves through
 * its exit; a shell action's update lines and `publishUpdate` reach the run
 * view as current updates.
 */
import assert from "node:assert/strict";
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

describe("waiting on the server", () => {
  it("include: the child runs under qualified ids and the parent leaves through review.approved", async () => {
    const runId = await client.start(project, "include", { text: "ship it" });
    const view = await client.settled(runId);
    assert.equal(view.status.run, "completed");
    assert.deepEqual(stepNodes(view), ["draft", "review", "review/check", "review/approve", "review/__piw_exit_approved", "publish"]);
    const rejected = await client.start(project, "include", { text: "TODO: finish" });
    assert.deepEqual(stepNodes(await client.settled(rejected)).at(-1), "revise");
  });

  it("shell with updates: each parsed line is published and the run view lists the latest progress", async () => {
    const runId = await client.start(project, "shell-updates", { steps: 3 });
    const view = await client.settled(runId);
    assert.equal(view.status.run, "completed", JSON.stringify(view.failure ?? null));
    const output = (await server.journalAfterExit(runId)).find((record) => record.event === "node" && record.nodeId === "count")?.output;
    assert.deepEqual(output, { lines: 4, last: "finished", exitCode: 0 });
    assert.deepEqual(view.updates.items.map((item) => [item.type, item.key, item.data]), [
      ["progress", "overall", { status: "completed", completed: 3, total: 3, unit: "steps" }],
    ]);
  });
});
