/**
 * `/workflow-channel` in real Pi (scripts/install-pi.sh, rpc mode) against
 * the real server binary and its real Telegram adapter child: a broken
 * profile's diagnostic, reload, the adapter running, and a recover retry
 * the server refuses, with the duplicate warning. The profile's Bot API
 * base is a closed loopback port (no network; the adapter reports ready
 * before it polls).
 */
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import { type PiRecord, type PiRpc, piFixture } from "../test-support/pi.js";
import { SDK_DIR, TestServer, serverBinary } from "../test-support/server.js";
import { terminalRule } from "../test-support/terminal.js";

type UiRequest = Extract<PiRecord, { type: "extension_ui_request" }>;
type Notify = Extract<UiRequest, { method: "notify" }>;

const TOKEN = "123456:FAKE-token-never-shown";

/** Runs `/workflow-channel <args>` and resolves the notification it ends with. */
async function channel(pi: PiRpc, args: string): Promise<Notify> {
  const since = pi.mark();
  assert.equal(await pi.prompt(`/workflow-channel ${args}`), "handled");
  return (await pi.waitFor((record) => record.type === "extension_ui_request" && record.method === "notify", {
    since,
    what: `the notification of /workflow-channel ${args}`,
    timeoutMs: 30_000,
  })) as Notify;
}

describe("/workflow-channel in real Pi (rpc mode)", () => {
  it("status shows a broken profile's diagnostic; after the fix, reload runs the adapter; recover retry is refused by the server and warns that a duplicate is possible; no token anywhere", async (t) => {
    const fixture = await piFixture(t, { rules: [terminalRule] });
    const server = await TestServer.start({ env: { PI_WORKFLOWS_CHANNEL_POLL_MS: "100" } });
    t.after(() => server.stop());
    const tokenFile = join(server.root, "ops.token");
    writeFileSync(tokenFile, `${TOKEN}\n`);
    chmodSync(tokenFile, 0o644);
    const dir = join(server.home, "channels");
    mkdirSync(dir, { recursive: true });
    chmodSync(dir, 0o700);
    const config = join(dir, "channels.json");
    writeFileSync(
      config,
      JSON.stringify({ telegram: { ops: { tokenFile, allowedUserIds: ["4242"], allowedChatIds: ["4242"], audiences: ["operators"], apiBase: "http://127.0.0.1:9" } } }),
    );
    chmodSync(config, 0o600);
    const env: Record<string, string> = { PI_WORKFLOWS_BIN: serverBinary() };
    for (const [key, value] of Object.entries(server.env)) if (key.startsWith("PI_WORKFLOWS_")) env[key] = value;
    const pi = await fixture.spawnRpc({ extensions: [SDK_DIR], cwd: server.project(), env });
    const seen: string[] = [];

    const reloaded = await channel(pi, "reload");
    assert.deepEqual([reloaded.notifyType, reloaded.message], ["info", "Reloading 1 channel profile(s); see /workflow-channel status."]);
    const statusUntil = async (pattern: RegExp): Promise<Notify> => {
      const deadline = Date.now() + 30_000;
      for (;;) {
        const shown = await channel(pi, "status");
        seen.push(shown.message);
        if (pattern.test(shown.message)) return shown;
        if (Date.now() > deadline) assert.fail(`no status matching ${pattern}; last: ${shown.message}`);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    };
    const broken = await statusUntil(/^ops: failed/);
    assert.deepEqual([broken.notifyType, broken.message], ["warning", "ops: failed — profile ops: the token file must be private to its owner (chmod 600)"]);

    chmodSync(tokenFile, 0o600);
    assert.equal((await channel(pi, "reload")).notifyType, "info");
    const running = await statusUntil(/^ops: running$/);
    assert.equal(running.notifyType, "info");

    const retry = await channel(pi, "recover retry ops effect-00112233445566778899aabbccddeeff.1");
    seen.push(retry.message);
    assert.equal(retry.notifyType, "error");
    assert.match(retry.message, /^channel recover retry was refused: not the current attempt of this channel message\. Warning: a duplicate is possible/);
    const usage = await channel(pi, "recover");
    assert.equal(usage.notifyType, "warning");
    assert.match(usage.message, /^Usage: \/workflow-channel status \| reload \| recover confirm\|retry <profile> <attemptId>/);
    for (const shown of seen) assert.ok(!shown.includes(TOKEN) && !shown.includes(tokenFile), shown);
    assert.ok(!pi.stderr().includes(TOKEN));
  });
});
