/**
 * Discovery through the CLI and the real server: a workflow that is a
 * symbolic link (in the project and in the user's directory) is listed by
 * `pi-workflows list --json` and `pi-workflows start <name>` runs it. The
 * listing (Rust) and the name resolution (the node runner) follow one rule,
 * pinned by `protocol/fixtures/discovery/`.
 */
import assert from "node:assert/strict";
import { mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { type TestClient, TestServer } from "../test-support/server.js";

let server: TestServer;
let client: TestClient;
let project: string;

function workflowSource(name: string): string {
  return `import { compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({ name: ${JSON.stringify(name)}, startAt: "hello", nodes: { hello: compute({ run: () => ({ ran: ${JSON.stringify(name)} }) }) } });
`;
}

before(async () => {
  server = await TestServer.start();
  project = server.project();
  // Sources kept outside the workflow directories, linked in.
  const sources = join(server.root, "sources");
  mkdirSync(sources, { recursive: true });
  writeFileSync(join(sources, "linked.ts"), workflowSource("linked"));
  writeFileSync(join(sources, "global-linked.ts"), workflowSource("global-linked"));
  symlinkSync(join(sources, "linked.ts"), join(project, ".pi", "workflows", "linked.workflow.ts"));
  writeFileSync(join(project, ".pi", "workflows", "plain.workflow.ts"), workflowSource("plain"));
  const global = join(server.userHome, ".pi", "agent", "workflows");
  mkdirSync(global, { recursive: true });
  symlinkSync("../../../../sources/global-linked.ts", join(global, "global-linked.workflow.ts"));
  client = await server.connect();
});

after(async () => {
  client?.close();
  await server?.stop();
});

describe("discovery through the CLI", () => {
  it("list --json shows symlinked workflows, and start runs each by the name it lists", async () => {
    const listed = JSON.parse((await server.cli(["list", "--json"], project)).trim()) as { workflows: { name: string; source: string }[] };
    assert.deepEqual(listed.workflows, [
      { name: "linked", source: "project" },
      { name: "plain", source: "project" },
      { name: "global-linked", source: "global" },
    ]);
    for (const { name } of listed.workflows) {
      const started = JSON.parse((await server.cli(["start", name, "--json"], project)).trim()) as { runId: string };
      const view = await client.settled(started.runId);
      assert.equal(view.status.run, "completed", `${name}: ${JSON.stringify(view.failure ?? null)}`);
      const output = (await server.journalAfterExit(started.runId)).find((record) => record.event === "node" && record.nodeId === "hello")?.output;
      assert.deepEqual(output, { ran: name });
    }
  });
});
