/**
 * `/piw` and Ctrl+Shift+R (src/extension/piw.ts) against the fake `herdr`
 * of scripts/fake-herdr.mjs, run as a real process through a real `exec`
 * (what `pi.exec` does): focus of the pane labelled `piw · <runId>`, every
 * placement's Herdr calls, cleanup when a placement fails half-way, and the
 * bounded reasons outside Herdr or without the plugin or `piw`.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { describe, it, type TestContext } from "node:test";

import { type ExecPort, PIW_PLACEMENTS, PiwOpener, parsePiwArgs, piwPaneLabel, registerPiw, type PiwContext, type PiwHost } from "../src/extension/piw.js";
import { FakeHerdr, type HerdrState } from "../test-support/herdr.js";

const TARGET = { runId: "run-20261201-approve-1a2b", workflowName: "approve" };
const OPEN_PREFIX = "plugin pane open --plugin osolmaz.pi-workflows --entrypoint piw --env PI_WORKFLOWS_RUN_ID=run-20261201-approve-1a2b";

/** `pi.exec` as Pi implements it: a child process with a timeout, never throwing for a non-zero exit. */
function realExec(path: string): ExecPort {
  return (command, args, options) =>
    new Promise((resolve, reject) => {
      execFile(command, args, { timeout: options.timeout, env: { ...process.env, PATH: path } }, (error, stdout, stderr) => {
        if (error !== null && typeof error.code === "string") return reject(error);
        resolve({ stdout, stderr, code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, killed: error?.killed === true });
      });
    });
}

/** A fake Herdr with the plugin linked, a `piw` on PATH, and an opener in Herdr. */
function inHerdr(t: TestContext, change: Partial<HerdrState> = {}, withPiw = true): { herdr: FakeHerdr; opener: PiwOpener } {
  const herdr = FakeHerdr.withPlugin(change);
  t.after(() => herdr.remove());
  if (withPiw) writeFileSync(join(herdr.bin, "piw"), "#!/bin/sh\necho piw 0.1.0\n", { mode: 0o755 });
  const opener = new PiwOpener({ exec: realExec(`${herdr.bin}:${dirname(process.execPath)}:/usr/bin:/bin`), env: { HERDR_ENV: "1" } });
  return { herdr, opener };
}

describe("/piw arguments", () => {
  it("take nothing or one placement; anything else gets the usage", () => {
    assert.deepEqual(parsePiwArgs(""), { placement: undefined });
    for (const placement of PIW_PLACEMENTS) assert.deepEqual(parsePiwArgs(` ${placement} `), { placement });
    for (const bad of ["sideways", "right below"]) assert.deepEqual(parsePiwArgs(bad), { error: "Usage: /piw [right|below|left|above|tab|workspace]" });
    assert.equal(piwPaneLabel("r-1"), "piw · r-1");
  });
});

describe("/piw outside Herdr", () => {
  it("gives one bounded reason with the command to run, and runs nothing", async () => {
    const calls: string[] = [];
    const opener = new PiwOpener({ exec: async (command) => (calls.push(command), { stdout: "", stderr: "", code: 0, killed: false }), env: {} });
    assert.deepEqual(await opener.open(TARGET, "right", "/project"), {
      level: "warning",
      message: "piw opens in a pane only inside Herdr (HERDR_ENV=1); run `piw run-20261201-approve-1a2b` in a terminal.",
    });
    assert.deepEqual(await opener.open(undefined, "right", "/project"), {
      level: "warning",
      message: "No workflow run in this session to show in piw; start one with /workflow <name>, or run `piw` to browse every run.",
    });
    assert.deepEqual(calls, []);
  });
});

describe("/piw inside Herdr (fake herdr)", () => {
  it("opens a split to the right of the caller on the exact run, then focuses that pane instead of opening another", async (t) => {
    const { herdr, opener } = inHerdr(t);
    const opened = await opener.open(TARGET, "right", "/project");
    assert.deepEqual(opened, { level: "info", message: "Opened piw for run run-20261201-approve-1a2b (right, Herdr pane w1:p2)." });
    assert.deepEqual(herdr.commandLines(), [
      "pane current --current",
      "plugin list --plugin osolmaz.pi-workflows --json",
      "api snapshot",
      `${OPEN_PREFIX} --placement split --target-pane w1:p1 --direction right --focus`,
    ]);
    assert.ok(herdr.state().panes.some((pane) => pane.label === "piw · run-20261201-approve-1a2b"));

    const before = herdr.calls().length;
    const focused = await opener.open(TARGET, "below", "/project");
    assert.deepEqual(focused, { level: "info", message: "Focused piw for run run-20261201-approve-1a2b (Herdr pane w1:p2)." });
    assert.deepEqual(herdr.commandLines().slice(before), ["pane current --current", "plugin list --plugin osolmaz.pi-workflows --json", "api snapshot", "plugin pane focus w1:p2"]);
    assert.equal(herdr.state().panes.length, 2, "no second pane");
  });

  it("matches the pane label exactly: a pane of another run (or a prefix of the id) is not focused", async (t) => {
    const { herdr, opener } = inHerdr(t, {
      panes: [
        { pane_id: "w1:p1", tab_id: "w1:t1", workspace_id: "w1", label: "pi" },
        { pane_id: "w1:p7", tab_id: "w1:t1", workspace_id: "w1", label: "piw · run-20261201-approve-1a2" },
      ],
      next: 8,
    });
    const outcome = await opener.open(TARGET, "tab", "/project");
    assert.equal(outcome.message, "Opened piw for run run-20261201-approve-1a2b (tab, Herdr pane w1:p8).");
    assert.ok(!herdr.commandLines().some((line) => line.startsWith("plugin pane focus")), herdr.commandLines().join("\n"));
    assert.equal(herdr.commandLines().at(-1), `${OPEN_PREFIX} --placement tab --workspace w1 --focus`);
  });

  it("every placement sends its own Herdr calls (left and above are a split plus a swap; a workspace is created and its bootstrap tab closed)", async (t) => {
    const expected: Record<string, string[]> = {
      right: [`${OPEN_PREFIX} --placement split --target-pane w1:p1 --direction right --focus`],
      below: [`${OPEN_PREFIX} --placement split --target-pane w1:p1 --direction down --focus`],
      left: [`${OPEN_PREFIX} --placement split --target-pane w1:p1 --direction right --focus`, "pane swap --source-pane w1:p2 --target-pane w1:p1"],
      above: [`${OPEN_PREFIX} --placement split --target-pane w1:p1 --direction down --focus`, "pane swap --source-pane w1:p2 --target-pane w1:p1"],
      tab: [`${OPEN_PREFIX} --placement tab --workspace w1 --focus`],
      workspace: ["workspace create --cwd /project --label piw · approve --no-focus", `${OPEN_PREFIX} --placement tab --workspace w2 --focus`, "tab close w2:t1"],
    };
    for (const placement of PIW_PLACEMENTS) {
      const { herdr, opener } = inHerdr(t);
      const outcome = await opener.open(TARGET, placement, "/project");
      assert.equal(outcome.level, "info", `${placement}: ${outcome.message}`);
      assert.deepEqual(herdr.commandLines().slice(3), expected[placement], placement);
    }
  });

  it("a placement that fails half-way closes what it opened and says what to run instead", async (t) => {
    const swap = inHerdr(t, { fail: ["pane swap"] });
    const left = await swap.opener.open(TARGET, "left", "/project");
    assert.deepEqual(left, { level: "warning", message: "herdr pane swap failed: herdr: pane swap failed (fake); run `piw run-20261201-approve-1a2b` in a terminal." });
    assert.equal(swap.herdr.commandLines().at(-1), "plugin pane close w1:p2");
    assert.deepEqual(swap.herdr.state().panes.map((pane) => pane.pane_id), ["w1:p1"], "the new pane was closed");

    const open = inHerdr(t, { fail: ["plugin pane open"] });
    const workspace = await open.opener.open(TARGET, "workspace", "/project");
    assert.equal(workspace.level, "warning");
    assert.match(workspace.message, /^herdr plugin pane open failed: .*; run `piw run-20261201-approve-1a2b` in a terminal\.$/);
    assert.equal(open.herdr.commandLines().at(-1), "workspace close w2");
    assert.deepEqual(open.herdr.state().panes.map((pane) => pane.pane_id), ["w1:p1"], "the new workspace was closed");
  });

  it("without the linked plugin, or without piw, nothing opens and the reason names the fix", async (t) => {
    const unlinked = inHerdr(t, { plugin: null });
    assert.deepEqual(await unlinked.opener.open(TARGET, "right", "/project"), {
      level: "warning",
      message: "the Herdr plugin osolmaz.pi-workflows is not linked and enabled: run `pi-workflows herdr sync`; run `piw run-20261201-approve-1a2b` in a terminal.",
    });
    const disabled = inHerdr(t, { plugin: { plugin_id: "osolmaz.pi-workflows", plugin_root: "/p", manifest_path: "/p/herdr-plugin.toml", version: "0.1.0", enabled: false } });
    assert.match((await disabled.opener.open(TARGET, "right", "/project")).message, /is not linked and enabled/);
    const noPiw = inHerdr(t, {}, false);
    assert.deepEqual(await noPiw.opener.open(TARGET, "right", "/project"), {
      level: "warning",
      message: "piw is not installed (not on PATH): install it with `cargo install --path piw`; run `piw run-20261201-approve-1a2b` in a terminal.",
    });
    for (const herdr of [unlinked.herdr, disabled.herdr, noPiw.herdr]) assert.ok(!herdr.commandLines().some((line) => line.startsWith("plugin pane open")));
  });

  it("a herdr that is not on PATH is one bounded reason", async () => {
    const opener = new PiwOpener({ exec: realExec(`${dirname(process.execPath)}:/usr/bin:/bin`), env: { HERDR_ENV: "1" } });
    const outcome = await opener.open(TARGET, "right", "/project");
    assert.equal(outcome.level, "warning");
    assert.match(outcome.message, /^herdr could not be run: .*ENOENT.*; run `piw run-20261201-approve-1a2b` in a terminal\.$/);
    assert.ok(outcome.message.length < 400);
  });
});

describe("registerPiw", () => {
  it("registers /piw and Ctrl+Shift+R; both target the run the view gives, and the shortcut asks for a placement inside Herdr", async (t) => {
    const herdr = FakeHerdr.withPlugin();
    t.after(() => herdr.remove());
    writeFileSync(join(herdr.bin, "piw"), "#!/bin/sh\necho piw 0.1.0\n", { mode: 0o755 });
    const commands = new Map<string, (args: string, ctx: PiwContext) => Promise<void>>();
    const shortcuts = new Map<string, (ctx: PiwContext) => Promise<void> | void>();
    const exec = realExec(`${herdr.bin}:${dirname(process.execPath)}:/usr/bin:/bin`);
    const host: PiwHost = {
      exec: (command, args, options) => exec(command, args, { timeout: options?.timeout ?? 5000 }),
      registerCommand: (name, options) => commands.set(name, options.handler),
      registerShortcut: (key, options) => shortcuts.set(key, options.handler),
    };
    const notes: string[] = [];
    const asked: string[][] = [];
    const ctx: PiwContext = { cwd: "/project", hasUI: true, ui: { select: async (_title, options) => (asked.push(options), "below"), notify: (message, level) => notes.push(`${level}: ${message}`) } };
    const previous = process.env.HERDR_ENV;
    process.env.HERDR_ENV = "1";
    t.after(() => (previous === undefined ? delete process.env.HERDR_ENV : (process.env.HERDR_ENV = previous)));
    let view: typeof TARGET | undefined;
    registerPiw(host, () => view);
    assert.deepEqual([...commands.keys()], ["piw"]);
    assert.deepEqual([...shortcuts.keys()], ["ctrl+shift+r"]);

    await commands.get("piw")?.("", ctx);
    assert.deepEqual(notes.pop(), "warning: No workflow run in this session to show in piw; start one with /workflow <name>, or run `piw` to browse every run.");
    assert.deepEqual(asked, [], "no placement menu without a run");

    view = TARGET;
    await shortcuts.get("ctrl+shift+r")?.(ctx);
    assert.deepEqual(asked, [[...PIW_PLACEMENTS]]);
    assert.equal(notes.pop(), "info: Opened piw for run run-20261201-approve-1a2b (below, Herdr pane w1:p2).");
    await commands.get("piw")?.("sideways", ctx);
    assert.equal(notes.pop(), "warning: Usage: /piw [right|below|left|above|tab|workspace]");
    await commands.get("piw")?.("tab", ctx);
    assert.equal(notes.pop(), "info: Focused piw for run run-20261201-approve-1a2b (Herdr pane w1:p2).");
  });
});
