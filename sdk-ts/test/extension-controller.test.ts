/**
 * `/controller` (src/extension/controllers.ts) as Pi calls it, registered on a recording host,
 * against the REAL server binary with the scripted controller child
 * (`pi-workflows-scripted-controller`, beside `pi-workflows`) resolving each apply in the
 * server's own child process: apply from the session's project directory, list, get, reconcile,
 * delete, and the refusals — each rendered from the server's own answer. The spec and the
 * controller's status value never appear in what is shown.
 */
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, before, describe, it } from "node:test";

import { WorkflowClient } from "../src/client/index.js";
import { CONTROLLER_USAGE, type ControllerHost, parseControllerCommand, registerController } from "../src/extension/controllers.js";
import { TestServer, serverBinary } from "../test-support/server.js";

type Handler = Parameters<ControllerHost["registerCommand"]>[1]["handler"];

describe("/controller arguments", () => {
  it("parses every form and refuses anything else with the usage, sending nothing", () => {
    assert.deepEqual(parseControllerCommand(""), { kind: "list" });
    assert.deepEqual(parseControllerCommand(" list "), { kind: "list" });
    assert.deepEqual(parseControllerCommand("list repos"), { kind: "list", controller: "repos" });
    assert.deepEqual(parseControllerCommand("get repos acme/api#7"), { kind: "get", controller: "repos", key: "acme/api#7" });
    assert.deepEqual(parseControllerCommand("reconcile repos k"), { kind: "reconcile", controller: "repos", key: "k" });
    assert.deepEqual(parseControllerCommand("delete repos k"), { kind: "delete", controller: "repos", key: "k" });
    assert.deepEqual(parseControllerCommand('apply repos k {"a": [1, 2], "b": "x y"}'), { kind: "apply", controller: "repos", key: "k", spec: { a: [1, 2], b: "x y" } });
    assert.deepEqual(parseControllerCommand("apply repos k 3"), { kind: "apply", controller: "repos", key: "k", spec: 3 });
    for (const bad of ["get", "get repos", "get repos k extra", "apply repos k", "list a b", "start", "stop repos k"]) {
      assert.deepEqual(parseControllerCommand(bad), { kind: "error", message: CONTROLLER_USAGE }, bad);
    }
    assert.match((parseControllerCommand("apply repos k {nope") as { message: string }).message, /^The spec is not JSON/);
    assert.match((parseControllerCommand("get Repos k") as { message: string }).message, /^Not a controller name: Repos/);
  });
});

describe("/controller against the real server", () => {
  let server: TestServer;
  let client: WorkflowClient;
  let handler: Handler;
  let project: string;
  const SECRET = "spec-value-never-shown";

  /** Runs `/controller <args>` in the project and returns what it notified. */
  const command = async (args: string, cwd = project): Promise<{ message: string; level: string }> => {
    const notified: { message: string; level: string }[] = [];
    await handler(args, { cwd, ui: { notify: (message, level) => notified.push({ message, level }) } });
    assert.equal(notified.length, 1, JSON.stringify(notified));
    return notified[0] as { message: string; level: string };
  };

  before(async () => {
    const scriptedController = join(dirname(serverBinary()), "pi-workflows-scripted-controller");
    server = await TestServer.start({ env: { PI_WORKFLOWS_CONTROLLER_RUNNER: scriptedController } });
    client = new WorkflowClient({ home: server.home, bin: serverBinary(), env: server.env, startDeadlineMs: 60_000 });
    const host: ControllerHost = {
      registerCommand: (name, options) => {
        assert.equal(name, "controller");
        handler = options.handler;
      },
    };
    registerController(host, () => client);
    project = join(server.root, "project");
    const file = join(project, ".pi", "controllers", "repos.controller.ts");
    mkdirSync(dirname(file), { recursive: true });
    writeFileSync(file, "export default {};\n");
  });

  after(async () => {
    client?.close();
    await server?.stop();
  });

  it("applies from the session's project, lists, shows, reconciles and deletes, each from the server's answer", async () => {
    assert.deepEqual(await command("list"), { message: "No resources. Apply one with /controller apply <controller> <key> <spec JSON>.", level: "info" });

    const applied = await command(`apply repos acme/api {"secret": "${SECRET}"}`);
    assert.deepEqual(applied, { message: "Applied repos/acme/api: resource version 1; the server reconciles it (/controller get repos acme/api).", level: "info" });
    // The same spec again writes nothing: the same version.
    assert.match((await command(`apply repos acme/api {"secret": "${SECRET}"}`)).message, /resource version 1;/);

    const listed = await command("list repos");
    assert.match(listed.message, /^repos\/acme\/api: Ready: none yet, generation 1 \(observed 0\), version 1$/);

    const shown = await command("get repos acme/api");
    assert.match(shown.message, /^repos\/acme\/api: generation 1 \(observed 0\), version 1\n/);
    assert.match(shown.message, /\nconditions: none yet\n/);
    assert.match(shown.message, /\nevent \S+ applied/);

    assert.match((await command("reconcile repos acme/api")).message, /^Reconcile requested for repos\/acme\/api \(resource version \d+\)\.$/);
    const deleted = await command("delete repos acme/api");
    assert.match(deleted.message, /^Deletion requested for repos\/acme\/api \(resource version \d+\)\.$/);
    assert.match((await command("get repos acme/api")).message, /\ndeletion requested at /);

    for (const message of [applied.message, listed.message, shown.message, deleted.message]) {
      assert.ok(!message.includes(SECRET), message);
    }
  });

  it("refusals carry the server's reason: an unknown resource, a controller no discovery finds, a bad name", async () => {
    const missing = await command("get repos nothing-here");
    assert.equal(missing.level, "error");
    assert.match(missing.message, /^controller get repos nothing-here was refused: /);

    const elsewhere = await command('apply repos k {"a": 1}', join(server.root, "another-project"));
    assert.equal(elsewhere.level, "error");
    assert.match(elsewhere.message, /^controller apply repos k was refused: /);

    assert.equal((await command("get Repos k")).level, "warning");
  });
});
