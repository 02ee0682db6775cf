/**
 * `/controller` (src/extension/controllers.ts) as Pi calls it, registered on a recording host,
 * against the REAL server binary with the scripted controller child
 * (`pi-workflows-scripted-controller`, beside `pi-workflows`) resolving each apply in the
 * server's own child process: apply from the session's project directory, list, get, reconcile,
 * delete, and the refusals — each rendered from the server's own answer. The spec and the
 * controller's status value never appear in what is shown.
 */
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, readlinkSync, realpathSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, before, describe, it } from "node:test";

import { WorkflowClient } from "../src/client/index.js";
import { CONTROLLER_USAGE, type ControllerHost, parseControllerCommand, registerController } from "../src/extension/controllers.js";
import { CONTROLLER_BIN } from "../test-support/controller-child.js";
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

describe("/controller with the real controller child", () => {
  let server: TestServer;
  let client: WorkflowClient;
  let handler: Handler;

  before(async () => {
    server = await TestServer.start({ env: { PI_WORKFLOWS_CONTROLLER_RUNNER: `${process.execPath} ${CONTROLLER_BIN}` } });
    client = new WorkflowClient({ home: server.home, bin: serverBinary(), env: server.env, startDeadlineMs: 60_000 });
    registerController({ registerCommand: (_name, options) => (handler = options.handler) }, () => client);
  });

  after(async () => {
    client?.close();
    await server?.stop();
  });

  it("neither the extension nor the server loads controller code: the module records each process that loads it, and each is a controller child of the server", async () => {
    const project = join(server.root, "project");
    const marker = join(server.root, "loaded-by.ndjson");
    const file = join(project, ".pi", "controllers", "probe.controller.mjs");
    mkdirSync(dirname(file), { recursive: true });
    writeFileSync(
      file,
      [
        'import { appendFileSync } from "node:fs";',
        // No package import: any process that evaluates the file records itself, whatever it could resolve.
        `appendFileSync(${JSON.stringify(marker)}, JSON.stringify({ pid: process.pid, ppid: process.ppid, entry: process.argv[1] }) + "\\n");`,
        'export default { name: "probe", initialStatus: () => ({ seen: false }), reconcile: (ctx) => ctx.settled(), [Symbol.for("pi-workflows.controller")]: true };',
        "",
      ].join("\n"),
    );
    const notified: { message: string; level: string }[] = [];
    await handler("apply probe one {}", { cwd: project, ui: { notify: (message, level) => notified.push({ message, level }) } });
    assert.deepEqual(notified, [{ message: "Applied probe/one: resource version 1; the server reconciles it (/controller get probe one).", level: "info" }]);

    const serverExe = realpathSync(serverBinary());
    const loads = readFileSync(marker, "utf8").trim().split("\n").map((line) => JSON.parse(line) as { pid: number; ppid: number; entry: string });
    assert.ok(loads.length >= 1, "the resolve child loaded the module");
    for (const load of loads) {
      assert.notEqual(load.pid, process.pid, "the extension's process loaded controller code");
      assert.equal(load.entry, CONTROLLER_BIN, "a controller child loaded it");
      // Its parent is the server (still running): the server spawned it and did not load the module itself.
      assert.equal(readlinkSync(`/proc/${load.ppid}/exe`), serverExe, "the loading process is a child of the server");
    }
  });
});
