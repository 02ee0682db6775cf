/**
 * `/piw` in real Pi (rpc mode, scripts/install-pi.sh) against the real
 * server and the node runner, with the fake `herdr` of
 * scripts/fake-herdr.mjs on PATH (Herdr ≥ 0.7 cannot be installed here) and
 * the real `piw` binary: inside Herdr it opens the plugin pane on the exact
 * run of the session's view, the pane's command (`piw --herdr-pane`, run in
 * tmux with the environment Herdr gives it) labels the pane and shows that
 * run, started from Pi, and a second `/piw` focuses that pane; outside
 * Herdr it answers with the command to run.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it, type TestContext } from "node:test";

import { FakeHerdr } from "../test-support/herdr.js";
import { type PiRecord, type PiRpc, piFixture } from "../test-support/pi.js";
import { REPO_DIR, SDK_DIR, TestServer, serverBinary } from "../test-support/server.js";
import { Tmux } from "../test-support/tmux.js";

type UiRequest = Extract<PiRecord, { type: "extension_ui_request" }>;
type Notify = Extract<UiRequest, { method: "notify" }>;

const CHECKPOINT = `
import { checkpoint, compute, defineWorkflow } from "@pi-workflows/sdk";

export default defineWorkflow({
  name: "approve",
  source: import.meta.url,
  startAt: "draft",
  nodes: {
    draft: compute({ run: () => ({ text: "notes v1" }) }),
    review: checkpoint({ timeoutMs: () => 600_000, run: () => ({ summary: "approve?" }) }),
  },
  edges: [{ from: "draft", to: "review" }],
});
`;

/** The piw binary the pane runs (`cargo build -p piw`). */
const PIW_DIR = join(process.env.PIW_BIN_DIR ?? join(REPO_DIR, "target", "debug"));

async function piInProject(t: TestContext, extraEnv: Record<string, string>): Promise<{ pi: PiRpc; server: TestServer }> {
  const fixture = await piFixture(t);
  const server = await TestServer.start();
  t.after(() => server.stop());
  const project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "approve.workflow.ts"), CHECKPOINT);
  const env: Record<string, string> = { PI_WORKFLOWS_BIN: serverBinary(), ...extraEnv };
  for (const [key, value] of Object.entries(server.env)) if (key.startsWith("PI_WORKFLOWS_")) env[key] = value;
  return { pi: await fixture.spawnRpc({ extensions: [SDK_DIR], cwd: project, env }), server };
}

/** Runs `/<command>` and resolves the notification it ends with. */
async function command(pi: PiRpc, text: string): Promise<Notify> {
  const since = pi.mark();
  assert.equal(await pi.prompt(text), "handled");
  return (await pi.waitFor((record) => record.type === "extension_ui_request" && record.method === "notify", { since, what: `the notification of ${text}`, timeoutMs: 30_000 })) as Notify;
}

/** Starts `approve` from Pi and waits until the session's view shows it waiting; its run id. */
async function startApprove(pi: PiRpc): Promise<string> {
  const since = pi.mark();
  const started = await command(pi, "/workflow approve");
  const runId = /\(run ([^)\s]+)\)/.exec(started.message)?.[1];
  assert.ok(runId !== undefined, started.message);
  await pi.waitFor((record) => record.type === "extension_ui_request" && record.method === "setStatus" && /^wf approve \[waiting\]/.test(record.statusText ?? ""), {
    since,
    what: "the waiting status line",
    timeoutMs: 30_000,
  });
  return runId;
}

describe("/piw in real Pi (rpc mode)", () => {
  it("inside Herdr (fake herdr, real piw): opens the piw plugin pane on the exact run of the session's view, then focuses it instead of opening another", async (t) => {
    const herdr = FakeHerdr.withPlugin();
    t.after(() => herdr.remove());
    const path = herdr.path(`${PIW_DIR}:${process.env.PATH ?? ""}`);
    const { pi, server } = await piInProject(t, { HERDR_ENV: "1", PATH: path });
    const runId = await startApprove(pi);

    const opened = await command(pi, "/piw right");
    assert.deepEqual([opened.notifyType, opened.message], ["info", `Opened piw for run ${runId} (right, Herdr pane w1:p2).`]);
    assert.deepEqual(herdr.commandLines(), [
      "pane current --current",
      "plugin list --plugin osolmaz.pi-workflows --json",
      "api snapshot",
      `plugin pane open --plugin osolmaz.pi-workflows --entrypoint piw --env PI_WORKFLOWS_RUN_ID=${runId} --placement split --target-pane w1:p1 --direction right --focus`,
    ]);

    // What Herdr does with that call: run the manifest's pane command with the call's environment and the new pane's id.
    const opening = herdr.calls().at(-1);
    assert.equal(opening?.argv.includes("--entrypoint"), true);
    const paneEnv: Record<string, string> = { HOME: server.env["HOME"] ?? tmpdir(), PATH: path, TERM: "xterm-256color", HERDR_PANE_ID: "w1:p2" };
    for (const [key, value] of Object.entries(server.env)) if (key.startsWith("PI_WORKFLOWS_")) paneEnv[key] = value;
    for (const entry of opening?.argv.filter((_arg, index, argv) => argv[index - 1] === "--env") ?? []) {
      const [key, ...rest] = entry.split("=");
      paneEnv[key as string] = rest.join("=");
    }
    const dir = mkdtempSync(join(tmpdir(), "piw-pane-"));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const pane = await Tmux.start({ command: ["piw", "--herdr-pane"], cwd: dir, env: paneEnv, dir, cols: 120, rows: 32 });
    t.after(() => pane.kill());
    // The header names the run while its view is still loading: wait for the graph's node.
    const screen = await pane.waitForScreen(/review/, 30_000);
    assert.match(screen, new RegExp(`^ piw .*${runId}`, "m"), screen);
    assert.deepEqual(herdr.calls().at(-1)?.argv, ["pane", "rename", "w1:p2", `piw · ${runId}`]);

    const again = await command(pi, "/piw below");
    assert.deepEqual([again.notifyType, again.message], ["info", `Focused piw for run ${runId} (Herdr pane w1:p2).`]);
    assert.equal(herdr.commandLines().at(-1), "plugin pane focus w1:p2");
    assert.equal(herdr.state().panes.filter((pane) => pane.label === `piw · ${runId}`).length, 1);

    const usage = await command(pi, "/piw sideways");
    assert.deepEqual([usage.notifyType, usage.message], ["warning", "Usage: /piw [right|below|left|above|tab|workspace]"]);
  });

  it("outside Herdr: one bounded reason with the command that opens the same run, and no herdr call", async (t) => {
    const herdr = FakeHerdr.withPlugin();
    t.after(() => herdr.remove());
    const { pi } = await piInProject(t, { HERDR_ENV: "", PATH: herdr.path(`${PIW_DIR}:${process.env.PATH ?? ""}`) });
    const none = await command(pi, "/piw");
    assert.equal(none.message, "No workflow run in this session to show in piw; start one with /workflow <name>, or run `piw` to browse every run.");
    const runId = await startApprove(pi);
    const outside = await command(pi, "/piw");
    assert.deepEqual([outside.notifyType, outside.message], ["warning", `piw opens in a pane only inside Herdr (HERDR_ENV=1); run \`piw ${runId}\` in a terminal.`]);
    assert.deepEqual(herdr.calls(), []);
  });
});
