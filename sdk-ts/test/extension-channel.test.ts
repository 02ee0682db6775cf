/**
 * `/workflow-channel` (src/extension/channels.ts) as Pi calls it, registered
 * on a recording host, against the REAL server binary and its real Telegram
 * adapter child (`target/debug/pi-workflows-telegram-adapter`, beside
 * `pi-workflows`): status of a broken and of a running profile, reload,
 * and a recover refusal, each rendered from the server's own answer. The
 * profile's Bot API base is a closed loopback port: no network, and the
 * adapter runs (it reports ready before it polls).
 */
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { WorkflowClient } from "../src/client/index.js";
import { CHANNEL_USAGE, type ChannelHost, parseChannelCommand, registerWorkflowChannel } from "../src/extension/channels.js";
import { TestServer, serverBinary } from "../test-support/server.js";

const TOKEN = "123456:FAKE-token-never-shown";

type Handler = Parameters<ChannelHost["registerCommand"]>[1]["handler"];

describe("/workflow-channel arguments", () => {
  it("parses every form and refuses anything else with the usage", () => {
    assert.deepEqual(parseChannelCommand(""), { kind: "status" });
    assert.deepEqual(parseChannelCommand(" status "), { kind: "status" });
    assert.deepEqual(parseChannelCommand("reload"), { kind: "reload" });
    assert.deepEqual(parseChannelCommand("recover retry ops effect-00ff.2"), { kind: "recover", action: "retry", profile: "ops", attemptId: "effect-00ff.2" });
    assert.deepEqual(parseChannelCommand("recover confirm ops effect-00ff.1"), { kind: "recover", action: "confirm", profile: "ops", attemptId: "effect-00ff.1" });
    for (const bad of ["recover", "recover undo ops a.1", "recover retry ops", "recover retry ops a.1 extra", "reload now", "stop"]) {
      assert.deepEqual(parseChannelCommand(bad), { kind: "error", message: CHANNEL_USAGE }, bad);
    }
    assert.match((parseChannelCommand("recover retry o/ps a.1") as { message: string }).message, /^Not a channel profile name/);
  });
});

describe("/workflow-channel against the real server", () => {
  let server: TestServer;
  let client: WorkflowClient;
  let handler: Handler;
  let tokenFile: string;

  /** Runs `/workflow-channel <args>` and returns what it notified. */
  const command = async (args: string): Promise<{ message: string; level: string }> => {
    const notified: { message: string; level: string }[] = [];
    await handler(args, { ui: { notify: (message, level) => notified.push({ message, level }) } });
    assert.equal(notified.length, 1, JSON.stringify(notified));
    return notified[0] as { message: string; level: string };
  };

  const statusUntil = async (pattern: RegExp): Promise<{ message: string; level: string }> => {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const shown = await command("status");
      if (pattern.test(shown.message)) return shown;
      if (Date.now() > deadline) assert.fail(`no status matching ${pattern}; last: ${shown.message}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  };

  before(async () => {
    server = await TestServer.start({ env: { PI_WORKFLOWS_CHANNEL_POLL_MS: "100" } });
    client = new WorkflowClient({ home: server.home, bin: serverBinary(), env: server.env, startDeadlineMs: 60_000 });
    const host: ChannelHost = {
      registerCommand: (name, options) => {
        assert.equal(name, "workflow-channel");
        handler = options.handler;
      },
    };
    registerWorkflowChannel(host, () => client);
    // A profile whose token file others can read: the server refuses it.
    tokenFile = join(server.root, "ops.token");
    writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o644 });
    chmodSync(tokenFile, 0o644);
    const dir = join(server.home, "channels");
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    chmodSync(dir, 0o700);
    const config = join(dir, "channels.json");
    writeFileSync(
      config,
      JSON.stringify({ telegram: { ops: { tokenFile, allowedUserIds: ["4242"], allowedChatIds: ["4242"], audiences: ["operators"], apiBase: "http://127.0.0.1:9" } } }),
      { mode: 0o600 },
    );
    chmodSync(config, 0o600);
  });

  after(async () => {
    client?.close();
    await server?.stop();
  });

  it("shows a broken profile's one diagnostic, reloads, and shows the adapter running, never the token or its path", async () => {
    const reloaded = await command("reload");
    assert.deepEqual(reloaded, { message: "Reloading 1 channel profile(s); see /workflow-channel status.", level: "info" });
    const broken = await statusUntil(/ops: failed/);
    assert.deepEqual(broken, { message: "ops: failed — profile ops: the token file must be private to its owner (chmod 600)", level: "warning" });

    chmodSync(tokenFile, 0o600);
    assert.equal((await command("reload")).level, "info");
    const running = await statusUntil(/ops: running/);
    assert.deepEqual(running, { message: "ops: running", level: "info" });
    for (const shown of [broken.message, running.message]) {
      assert.ok(!shown.includes(TOKEN) && !shown.includes(tokenFile), shown);
    }
  });

  it("recover retry of an attempt the server does not know is refused with the server's reason and warns that a duplicate is possible", async () => {
    const refused = await command("recover retry ops effect-00112233445566778899aabbccddeeff.1");
    assert.equal(refused.level, "error");
    assert.match(refused.message, /^channel recover retry was refused: not the current attempt of this channel message\./);
    assert.match(refused.message, /Warning: a duplicate is possible/);
    const confirm = await command("recover confirm ops effect-00112233445566778899aabbccddeeff.1");
    assert.equal(confirm.level, "error");
    assert.doesNotMatch(confirm.message, /duplicate/);
    assert.deepEqual(await command("recover undo ops x.1"), { message: CHANNEL_USAGE, level: "warning" });
  });
});
