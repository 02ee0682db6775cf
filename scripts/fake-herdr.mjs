#!/usr/bin/env node
// A fake `herdr` (Herdr ≥ 0.7 cannot be installed on the test machines) for
// the tests of `/piw`, `piw --herdr-pane` and `pi-workflows herdr sync`.
// Tests link it as `herdr` into a directory on PATH. It keeps its state in
// `herdr-state.json` next to the link (created on first use) and appends
// every call, `{"argv": [...], "env": {PI_WORKFLOWS_RUN_ID?, HERDR_PANE_ID?}}`,
// to `herdr-calls.ndjson` there. It answers the commands pi-workflows uses
// with the JSON shapes of Herdr 0.7; a command listed in the state's `fail`
// array (e.g. "pane swap") exits 1; any other command exits 2.
import { appendFileSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";

const dir = dirname(process.argv[1]);
const statePath = join(dir, "herdr-state.json");
const argv = process.argv.slice(2);
const env = {};
for (const key of ["PI_WORKFLOWS_RUN_ID", "HERDR_PANE_ID"]) if (process.env[key] !== undefined) env[key] = process.env[key];
appendFileSync(join(dir, "herdr-calls.ndjson"), `${JSON.stringify({ argv, env })}\n`);

const state = existsSync(statePath)
  ? JSON.parse(readFileSync(statePath, "utf8"))
  : { panes: [{ pane_id: "w1:p1", tab_id: "w1:t1", workspace_id: "w1", label: "pi" }], plugin: null, fail: [], next: 2 };
const save = () => writeFileSync(statePath, JSON.stringify(state, null, 2));
const ok = (result) => {
  save();
  process.stdout.write(`${JSON.stringify({ result })}\n`);
  process.exit(0);
};
const fail = (code, message) => {
  process.stderr.write(`herdr: ${message}\n`);
  process.exit(code);
};
const option = (name) => {
  const index = argv.indexOf(name);
  return index < 0 ? undefined : argv[index + 1];
};
const options = (name) => argv.flatMap((arg, index) => (arg === name ? [argv[index + 1]] : []));
const command = argv.filter((arg) => !arg.startsWith("--")).slice(0, 3).join(" ");
for (const failing of state.fail ?? []) if (`${command} `.startsWith(`${failing} `)) fail(1, `${failing} failed (fake)`);
const pane = (id) => state.panes.find((candidate) => candidate.pane_id === id);

if (command.startsWith("pane current")) ok({ pane: state.panes[0] });
if (command.startsWith("plugin list")) ok({ plugins: state.plugin === null ? [] : [state.plugin] });
if (command.startsWith("api snapshot")) ok({ snapshot: { panes: state.panes } });
if (command.startsWith("plugin pane focus")) {
  if (pane(argv[3]) === undefined) fail(1, `no pane ${argv[3]}`);
  ok({ focused: argv[3] });
}
if (command.startsWith("plugin pane open")) {
  const workspace = option("--workspace") ?? pane(option("--target-pane"))?.workspace_id ?? "w1";
  const id = `${workspace}:p${state.next++}`;
  const runId = options("--env").find((entry) => entry.startsWith("PI_WORKFLOWS_RUN_ID="))?.slice("PI_WORKFLOWS_RUN_ID=".length);
  // The real pane runs `piw --herdr-pane`, which labels it; the fake labels it at once.
  const opened = { pane_id: id, tab_id: `${workspace}:t${state.next}`, workspace_id: workspace, label: runId === undefined ? "piw" : `piw · ${runId}` };
  state.panes.push(opened);
  ok({ plugin_pane: { pane: opened } });
}
if (command.startsWith("plugin pane close")) {
  state.panes = state.panes.filter((candidate) => candidate.pane_id !== argv[3]);
  ok({ closed: argv[3] });
}
if (command.startsWith("pane swap")) ok({ swapped: true });
if (command.startsWith("pane rename")) {
  const target = pane(argv[2]);
  if (target === undefined) fail(1, `no pane ${argv[2]}`);
  target.label = argv[3];
  ok({ pane: target });
}
if (command.startsWith("workspace create")) {
  const workspace = `w${state.next++}`;
  const root = { pane_id: `${workspace}:p1`, tab_id: `${workspace}:t1`, workspace_id: workspace, label: "shell" };
  state.panes.push(root);
  ok({ workspace: { workspace_id: workspace, label: option("--label") }, root_pane: root });
}
if (command.startsWith("workspace close")) {
  state.panes = state.panes.filter((candidate) => candidate.workspace_id !== argv[2]);
  ok({ closed: argv[2] });
}
if (command.startsWith("tab close")) {
  state.panes = state.panes.filter((candidate) => candidate.tab_id !== argv[2]);
  ok({ closed: argv[2] });
}
if (command.startsWith("plugin link")) {
  const root = argv[2];
  state.plugin = { plugin_id: "osolmaz.pi-workflows", plugin_root: root, manifest_path: join(root, "herdr-plugin.toml"), version: /^version = "([^"]+)"/m.exec(readFileSync(join(root, "herdr-plugin.toml"), "utf8"))?.[1] ?? "", enabled: true };
  ok({ plugin: state.plugin });
}
if (command.startsWith("plugin enable")) {
  if (state.plugin === null) fail(1, "no such plugin");
  state.plugin.enabled = true;
  ok({ plugin: state.plugin });
}
if (command.startsWith("plugin unlink")) {
  state.plugin = null;
  ok({ unlinked: argv[2] });
}
fail(2, `unknown command: ${argv.join(" ")}`);
