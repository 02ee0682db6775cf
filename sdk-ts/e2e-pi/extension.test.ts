/**
 * The pi-workflows extension in real Pi (scripts/install-pi.sh) against the
 * real server binary and the node runner: Pi loads this package directory
 * (`-e <sdk-ts>`, through the package manifest, so `npm run test:pi` builds
 * `dist/` first), in rpc mode for protocol behaviour and in its TUI through
 * tmux for what a person sees.
 *
 * What the server supports today is covered here: `/workflow` list, start
 * of a workflow without agent steps, status, pause, resume, cancel, answer of
 * a checkpoint, the widget and the status line, recovery when the server was
 * unavailable at startup and after a server restart, and the proof that the
 * extension never opens `state.sqlite`. Message delivery needs the server's
 * coordinator epoch (issue 14, server half) and is not tested here yet.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, it, type TestContext } from "node:test";

import { type MockRule, reply } from "../test-support/mock-model.js";
import { type PiFixture, type PiRecord, type PiRpc, piFixture } from "../test-support/pi.js";
import { SDK_DIR, TestServer, scriptedRunnerBinary, serverBinary, stepNodes } from "../test-support/server.js";
import { terminalRule, terminalTurnSettled } from "../test-support/terminal.js";
import { RELEASE_GATE } from "../test-support/workflows.js";

type UiRequest = Extract<PiRecord, { type: "extension_ui_request" }>;
type Notify = Extract<UiRequest, { method: "notify" }>;
type Widget = Extract<UiRequest, { method: "setWidget" }>;
type Status = Extract<UiRequest, { method: "setStatus" }>;

const CHECKPOINT = `
import { checkpoint, compute, defineWorkflow } from "@pi-workflows/sdk";

export default defineWorkflow({
  name: "approve",
  title: "Approve the draft",
  source: import.meta.url,
  startAt: "draft",
  nodes: {
    draft: compute({ run: () => ({ text: "notes v1" }) }),
    review: checkpoint({ timeoutMs: () => 600_000, run: ({ outputs }) => ({ summary: "approve?", draft: outputs.draft }) }),
    publish: compute({ run: ({ input }) => ({ approvedBy: (input as { approver?: string } | null)?.approver ?? "unknown" }) }),
  },
  edges: [
    { from: "draft", to: "review" },
    { from: "review", to: "publish" },
  ],
});
`;

/** A workflow whose first node takes a while, so that it can be paused and cancelled while it runs. */
const SLOW = `
import { compute, defineWorkflow } from "@pi-workflows/sdk";

export default defineWorkflow({
  name: "slow",
  source: import.meta.url,
  startAt: "wait",
  nodes: {
    wait: compute({ run: async () => { await new Promise((resolve) => setTimeout(resolve, 3000)); return { waited: true }; } }),
    done: compute({ run: () => ({ ok: true }) }),
  },
  edges: [{ from: "wait", to: "done" }],
});
`;

/** Twenty nodes before a checkpoint: more rows than the TUI widget shows, so it scrolls. */
const LONG = `
import { checkpoint, compute, defineWorkflow } from "@pi-workflows/sdk";

const steps = Array.from({ length: 20 }, (_, index) => \`s\${String(index + 1).padStart(2, "0")}\`);

export default defineWorkflow({
  name: "long",
  source: import.meta.url,
  startAt: "s01",
  nodes: {
    ...Object.fromEntries(steps.map((id) => [id, compute({ run: () => ({ id }) })])),
    gate: checkpoint({ timeoutMs: () => 600_000, run: () => ({ summary: "go on?" }) }),
  },
  edges: [...steps.slice(1).map((id, index) => ({ from: steps[index] as string, to: id })), { from: "s20", to: "gate" }],
});
`;


/** The reference's refusal of the model's answer to a protected decision (§5.3). */
const HUMAN_ANSWER_TOOL_TEXT = "This checkpoint requires a verified human answer from Pi UI or a configured decision channel.";

interface Setup {
  server: TestServer;
  project: string;
  fixture: PiFixture;
  /** Pi's environment: the server's state dir, binary and runner (so a start from Pi is the same server). */
  env: Record<string, string>;
}

/** A real server with the two workflows in a project, and a Pi sandbox whose mock answers terminal messages' turns. */
async function setup(t: TestContext, rules: MockRule[] = []): Promise<Setup> {
  // The fixture first: its teardown (stopping every Pi) runs before the server stops.
  const fixture = await piFixture(t, { rules: [terminalRule, ...rules] });
  const server = await TestServer.start();
  t.after(() => server.stop());
  const project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "approve.workflow.ts"), CHECKPOINT);
  writeFileSync(join(project, ".pi", "workflows", "slow.workflow.ts"), SLOW);
  const env: Record<string, string> = { PI_WORKFLOWS_BIN: serverBinary() };
  for (const [key, value] of Object.entries(server.env)) if (key.startsWith("PI_WORKFLOWS_")) env[key] = value;
  return { server, project, fixture, env };
}

async function spawnWorkflowPi(setup: Setup, args: string[] = []): Promise<PiRpc> {
  return setup.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: setup.project, env: setup.env, args });
}

const isUi =
  <M extends UiRequest["method"]>(method: M, test: (request: Extract<UiRequest, { method: M }>) => boolean) =>
  (record: PiRecord): boolean =>
    record.type === "extension_ui_request" && record.method === method && test(record as Extract<UiRequest, { method: M }>);

/** Runs `/workflow <args>` and resolves the notification it ends with. */
async function workflow(pi: PiRpc, args: string): Promise<Notify> {
  const since = pi.mark();
  assert.equal(await pi.prompt(`/workflow ${args}`), "handled");
  return (await pi.waitFor(isUi("notify", () => true), { since, what: `the notification of /workflow ${args}`, timeoutMs: 30_000 })) as Notify;
}

/** Waits for a status line matching `pattern`. */
async function statusLine(pi: PiRpc, pattern: RegExp, since = 0): Promise<Status> {
  return (await pi.waitFor(isUi("setStatus", (r) => pattern.test(r.statusText ?? "")), { since, what: `a status line matching ${pattern}`, timeoutMs: 30_000 })) as Status;
}

/** Waits for widget lines of which one matches `pattern`. */
async function widget(pi: PiRpc, pattern: RegExp, since = 0): Promise<Widget> {
  return (await pi.waitFor(isUi("setWidget", (r) => (r.widgetLines ?? []).some((line) => pattern.test(line))), {
    since,
    what: `a widget line matching ${pattern}`,
    timeoutMs: 30_000,
  })) as Widget;
}

function runIdOf(text: string): string {
  const match = /\(run ([^)\s]+)\)/.exec(text);
  assert.ok(match !== null, `no run id in ${JSON.stringify(text)}`);
  return match[1] as string;
}

/** The lines of an `strace -e trace=open,openat,openat2` log that open the state file or its WAL or shared memory. */
function stateFileOpens(opens: readonly string[]): string[] {
  return opens.filter((line) => /state\.sqlite|\.sqlite-wal|\.sqlite-shm/.test(line));
}

describe("the extension in real Pi (rpc mode)", () => {
  it("/workflow list names the project's workflows; /workflow <name> starts one that waits at its checkpoint; status and the widget show it; answer continues it to completion", async (t) => {
    const s = await setup(t);
    const pi = await spawnWorkflowPi(s);

    const list = await workflow(pi, "list");
    assert.equal(list.notifyType, "info");
    assert.match(list.message, /^Workflows \(1-2 of 2\):/);
    assert.match(list.message, /\n {2}approve( — Approve the draft)? \(project\)\n/);
    assert.match(list.message, /\n {2}slow \(project\)/);

    const since = pi.mark();
    const started = await workflow(pi, "approve");
    assert.match(started.message, /^Workflow approve started \(run [^)]+\)\./);
    const runId = runIdOf(started.message);

    const waiting = await widget(pi, /^⏸ workflow approve — Approve the draft \[waiting\]$/, since);
    assert.deepEqual(waiting.widgetKey, "pi-workflows");
    const lines = waiting.widgetLines ?? [];
    assert.ok(lines.some((l) => /^ {2}✓ ƒ draft/.test(l)), lines.join("\n"));
    assert.ok(lines.some((l) => /^ {2}⏸ ◆ review/.test(l)), lines.join("\n"));
    assert.ok(lines.some((l) => /^ {2}· ƒ publish$/.test(l)), lines.join("\n"));
    assert.ok(lines.includes("  waiting on checkpoint: review — answer with /workflow answer <json>"), lines.join("\n"));
    await statusLine(pi, /^wf approve \[waiting\] review$/, since);

    const status = await workflow(pi, "status");
    assert.match(status.message, new RegExp(`^Workflow approve — Approve the draft \\[waiting\\] \\(run ${runId}\\)\\n {2}waiting on: review\\n`));
    assert.match(status.message, /\n {2}controls: [^\n]*answer/);

    const answeredSince = pi.mark();
    const answered = await workflow(pi, `answer {"approver":"ann"}`);
    assert.equal(answered.notifyType, "info", answered.message);
    assert.match(answered.message, /approve/);
    await widget(pi, /^✓ workflow approve — Approve the draft \[completed\]$/, answeredSince);
    await statusLine(pi, /^wf approve \[completed\]/, answeredSince);
    const after = await workflow(pi, "status");
    assert.match(after.message, /\[completed\]/);
    assert.doesNotMatch(after.message, new RegExp(`run ${runId}\\)`), "the completed continuation run is the one in view");
  });

  it("pause, resume and cancel act on this session's run through the server, and the status line follows the server's display", async (t) => {
    const s = await setup(t);
    const pi = await spawnWorkflowPi(s);

    const since = pi.mark();
    const started = await workflow(pi, "slow");
    const runId = runIdOf(started.message);
    await statusLine(pi, /^wf slow \[running\] wait$/, since);

    const paused = await workflow(pi, "pause");
    assert.equal(paused.notifyType, "info", paused.message);
    await statusLine(pi, /^wf slow \[paused\]/, since);
    const view = await s.server.connect();
    t.after(() => view.close());
    assert.equal((await view.view(runId)).display.status, "paused");

    const resumedSince = pi.mark();
    const resumed = await workflow(pi, "resume");
    assert.equal(resumed.notifyType, "info", resumed.message);
    assert.equal(resumed.message, `Workflow slow resumed (run ${runId}).`);
    await statusLine(pi, /^wf slow \[completed\]/, resumedSince);
    assert.equal((await view.view(runId)).display.status, "completed");

    const second = await workflow(pi, "slow");
    const secondRunId = runIdOf(second.message);
    const cancelSince = pi.mark();
    const cancelled = await workflow(pi, "cancel");
    assert.equal(cancelled.message, `Workflow slow cancelled (run ${secondRunId}).`);
    await statusLine(pi, /^wf slow \[cancelled\]/, cancelSince);
    assert.equal((await view.view(secondRunId)).display.status, "cancelled");

    const nothing = await workflow(pi, "pause");
    assert.deepEqual([nothing.notifyType, nothing.message], ["warning", "No workflow is running."]);
  });

  it("the model's workflow tool lists, answers the waiting checkpoint, and starts a run the server holds for the turn (one run, queued)", async (t) => {
    const s = await setup(t, [
      { name: "after-tool", lastRole: "tool", reply: reply.text("Done with the workflow tool.") },
      { name: "list", when: "list the workflows", withTool: "workflow", reply: reply.toolCall("workflow", { action: "list" }) },
      { name: "answer", when: "approve it", withTool: "workflow", reply: reply.toolCall("workflow", { action: "answer", input: { approver: "model" } }) },
      { name: "start", when: "start slow", withTool: "workflow", reply: reply.toolCall("workflow", { action: "start", workflow: "slow" }) },
    ]);
    const pi = await spawnWorkflowPi(s);
    const toolResult = async (prompt: string): Promise<{ text: string; isError: boolean }> => {
      const since = pi.mark();
      assert.equal(await pi.prompt(prompt), "started");
      await pi.waitSettled();
      const end = (await pi.waitFor((r) => r.type === "tool_execution_end", { since, what: "the workflow tool's end" })) as Extract<PiRecord, { type: "tool_execution_end" }>;
      assert.equal(end.toolName, "workflow");
      const result = end.result as { content: { type: string; text?: string }[] };
      return { text: result.content.map((part) => part.text ?? "").join(""), isError: end.isError };
    };

    const listed = await toolResult("please list the workflows");
    assert.equal(listed.isError, false, listed.text);
    assert.match(listed.text, /^Workflows \(1-2 of 2\):\n {2}approve/);

    const since = pi.mark();
    await workflow(pi, "approve");
    await statusLine(pi, /^wf approve \[waiting\] review$/, since);
    const answered = await toolResult("please approve it");
    assert.equal(answered.isError, false, answered.text);
    await statusLine(pi, /^wf approve \[completed\]/, since);
    // The continuation's terminal message opens one model turn: let it settle before the next prompt.
    await terminalTurnSettled(pi, s.fixture.mock, undefined, since);

    // Saved before the tool reports it queued (held until the initiating
    // turn settles: coordinator.test.ts follows the activation).
    const queued = await toolResult("please start slow");
    assert.equal(queued.isError, false, queued.text);
    const runId = /^Workflow slow queued \(run ([^)\s]+)\)\.$/.exec(queued.text)?.[1];
    assert.ok(runId, queued.text);
    const view = await s.server.connect();
    t.after(() => view.close());
    const runs = await view.request("runs.list", { limit: 10 });
    const rows = (runs.receipt as { rows: { runId: string; workflowName?: string }[] }).rows;
    assert.deepEqual(rows.filter((row) => row.workflowName === "slow").map((row) => row.runId), [runId], JSON.stringify(rows));
    assert.ok(s.fixture.mock.requests[0]?.tools.includes("workflow"), `offered tools: ${s.fixture.mock.requests[0]?.tools.join(",")}`);
  });

  it("a protected human decision: the widget hints /workflow answer <choice>, the model's answer action is refused with the reference text, and /workflow answer <choice> <text> continues the run on that choice", async (t) => {
    const s = await setup(t, [
      { name: "after-tool", lastRole: "tool", reply: reply.text("The workflow tool refused my answer.") },
      { name: "answer", when: "ship the release", withTool: "workflow", reply: reply.toolCall("workflow", { action: "answer", input: { choice: "ship" } }) },
    ]);
    writeFileSync(join(s.project, ".pi", "workflows", "release-gate.workflow.ts"), RELEASE_GATE);
    const pi = await spawnWorkflowPi(s);
    const view = await s.server.connect();
    t.after(() => view.close());

    const since = pi.mark();
    const started = await workflow(pi, "release-gate");
    const runId = runIdOf(started.message);
    const waiting = await widget(pi, /^ {2}waiting on decision: gate/, since);
    assert.ok(
      (waiting.widgetLines ?? []).includes("  waiting on decision: gate (Publish the release?) — answer with /workflow answer <choice> [text] (choices: ship, revise)"),
      (waiting.widgetLines ?? []).join("\n"),
    );
    await statusLine(pi, /^wf release-gate \[waiting\] gate$/, since);
    assert.deepEqual((await view.view(runId)).display.controls, ["humanAnswer", "pause", "cancel"]);
    // The decision message reaches the session once, and starts no model turn.
    const decisionEntries = async (): Promise<{ details?: { runId?: string } }[]> =>
      ((await pi.getEntries()).entries as { type: string; customType?: string; details?: { runId?: string } }[]).filter(
        (entry) => entry.type === "custom_message" && entry.customType === "pi-workflows-decision",
      );
    for (const deadline = Date.now() + 30_000; (await decisionEntries()).length === 0; await new Promise((resolve) => setTimeout(resolve, 50))) {
      assert.ok(Date.now() < deadline, "the decision message reaches the session");
    }
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    assert.deepEqual((await decisionEntries()).map((entry) => entry.details?.runId), [runId]);
    assert.equal(s.fixture.mock.requests.length, 0, "the decision message starts no model turn");
    assert.ok(!pi.records.slice(since).some((record) => record.type === "agent_start"), "no agent run before the user's prompt");

    // The model's tool cannot answer it.
    const toolSince = pi.mark();
    assert.equal(await pi.prompt("please ship the release"), "started");
    await pi.waitSettled();
    const end = (await pi.waitFor((r) => r.type === "tool_execution_end", { since: toolSince, what: "the workflow tool's end" })) as Extract<PiRecord, { type: "tool_execution_end" }>;
    const result = end.result as { content: { type: string; text?: string }[] };
    assert.deepEqual([end.toolName, end.isError, result.content.map((part) => part.text ?? "").join("")], ["workflow", true, HUMAN_ANSWER_TOOL_TEXT]);
    const still = await view.view(runId);
    assert.deepEqual([still.display.status, still.display.waitingOn], ["waiting", "gate"], "the refused answer changed nothing");

    // A person answers it in Pi.
    const refused = await workflow(pi, "answer maybe");
    assert.deepEqual([refused.notifyType, refused.message], ["warning", "Answer with one of the choices: /workflow answer <choice> [text…] (choices: ship, revise)"]);
    const answeredSince = pi.mark();
    const answered = await workflow(pi, "answer revise fix the changelog");
    assert.equal(answered.notifyType, "info", answered.message);
    const continuation = new RegExp(`^Answered workflow release-gate at gate \\(run ${runId}\\); it continues as run (\\S+)\\.$`).exec(answered.message)?.[1];
    assert.ok(continuation !== undefined, answered.message);
    await statusLine(pi, /^wf release-gate \[completed\]/, answeredSince);
    await terminalTurnSettled(pi, s.fixture.mock, undefined, answeredSince);
    const done = await view.view(continuation);
    assert.equal(done.display.status, "completed");
    assert.deepEqual(stepNodes(done), ["draft", "gate", "revised"], "the revise case ran");
    const revised = s.server.journal(continuation).filter((record) => record.event === "node" && record.nodeId === "revised");
    assert.deepEqual(revised.at(-1)?.output, { revise: { choice: "revise", input: { change: "fix the changelog" } } }, "the person's choice and text are the decision's output");
  });

  it("an ambiguous effect: the widget names /workflow recover; retry warns that a duplicate is possible and applies it again, confirm records it applied, and each run completes", async (t) => {
    // The fixture first (its teardown stops Pi before the server stops); the scripted runner applies and crashes.
    const fixture = await piFixture(t, { rules: [terminalRule] });
    const server = await TestServer.start({ runner: scriptedRunnerBinary() });
    t.after(() => server.stop());
    const project = server.project();
    const applyLog = join(server.root, "apply.log");
    const script = join(server.root, "send.json");
    // An action that reserves an effect and crashes while applying its first attempt (server/tests/cli.rs's ambiguous script).
    writeFileSync(
      script,
      JSON.stringify({
        workflowName: "send",
        topology: { startAt: "send", nodes: [{ id: "send", nodeType: "action", timeout: { kind: "default" }, mountPath: [] }], edges: [], mounts: [] },
        nodes: { send: [{ effect: { type: "mail.send", request: { to: "ops" }, applyLog, crashOnAttempt: 1 } }] },
      }),
    );
    const env: Record<string, string> = { PI_WORKFLOWS_BIN: serverBinary() };
    for (const [key, value] of Object.entries(server.env)) if (key.startsWith("PI_WORKFLOWS_")) env[key] = value;
    const pi = await fixture.spawnRpc({ extensions: [SDK_DIR], cwd: project, env });
    const view = await server.connect();
    t.after(() => view.close());
    const applied = (): string[] => (existsSync(applyLog) ? readFileSync(applyLog, "utf8").split("\n").filter((line) => line !== "") : []);

    const ambiguousRun = async (): Promise<{ runId: string; effectId: string }> => {
      const since = pi.mark();
      const runId = runIdOf((await workflow(pi, script)).message);
      await statusLine(pi, /^wf send \[ambiguous\]/, since);
      const lines = (await widget(pi, /^ {2}⚠ mail\.send at send may have applied/, since)).widgetLines ?? [];
      assert.ok(lines.includes("  ⚠ mail.send at send may have applied: check it, then /workflow recover confirm|retry"), lines.join("\n"));
      assert.ok(!lines.some((line) => line.includes("effect.recover")), lines.join("\n"));
      const shown = await view.view(runId);
      assert.ok(shown.display.controls.includes("recoverEffect"), JSON.stringify(shown.display));
      const status = await workflow(pi, "status");
      assert.match(status.message, /\n {2}reason: An external effect \(mail\.send at send, attempt 1\) may have applied without a receipt; check the external system, then \/workflow recover confirm \(it applied\) or \/workflow recover retry/);
      return { runId, effectId: shown.ambiguousEffects?.[0]?.effectId as string };
    };

    const first = await ambiguousRun();
    assert.deepEqual(applied(), [`${first.effectId} 1`]);
    const retrySince = pi.mark();
    const retried = await workflow(pi, "recover retry");
    assert.equal(retried.notifyType, "warning");
    assert.match(retried.message, new RegExp(`^Effect mail\\.send at send \\(effect ${first.effectId}\\) of workflow send \\(run ${first.runId}\\) will be applied again as attempt 2\\. Warning: .*a duplicate is possible`));
    await statusLine(pi, /^wf send \[completed\]/, retrySince);
    await terminalTurnSettled(pi, fixture.mock, first.runId, retrySince);
    assert.deepEqual(applied(), [`${first.effectId} 1`, `${first.effectId} 2`], "the retry applied attempt 2 once");

    const second = await ambiguousRun();
    const confirmSince = pi.mark();
    const confirmed = await workflow(pi, `recover confirm ${second.effectId}`);
    assert.deepEqual(
      [confirmed.notifyType, confirmed.message],
      ["info", `Confirmed effect mail.send at send (effect ${second.effectId}) of workflow send (run ${second.runId}): recorded as applied.`],
    );
    await statusLine(pi, /^wf send \[completed\]/, confirmSince);
    await terminalTurnSettled(pi, fixture.mock, second.runId, confirmSince);
    assert.deepEqual(applied().filter((line) => line.startsWith(second.effectId)), [`${second.effectId} 1`], "a confirmed effect is not applied again");
    const nothing = await workflow(pi, "recover confirm");
    assert.equal(nothing.notifyType, "warning");
    assert.match(nothing.message, /^(No workflow is running\.|Workflow send cannot recover an effect now: it is completed)/);
  });

  it("`pi install <sdk-ts>` makes Pi load the extension from the package manifest without -e", async (t) => {
    const s = await setup(t);
    const { sandbox } = s.fixture;
    const installed = spawnSync(sandbox.install.node, [sandbox.install.cli, "install", SDK_DIR], { cwd: s.project, env: sandbox.env(s.env), encoding: "utf8", timeout: 60_000 });
    assert.equal(installed.status, 0, `${installed.stdout}${installed.stderr}`);
    const settings = JSON.parse(readFileSync(join(sandbox.agentDir, "settings.json"), "utf8")) as { packages?: string[] };
    // Pi stores a local package relative to the settings file.
    assert.deepEqual((settings.packages ?? []).map((path) => resolve(sandbox.agentDir, path)), [SDK_DIR]);
    const pi = await s.fixture.spawnRpc({ cwd: s.project, env: s.env, discover: true });
    const commands = (await pi.command({ type: "get_commands" })) as { commands: { name: string; source?: string }[] };
    assert.ok(commands.commands.some((command) => command.name === "workflow"), JSON.stringify(commands));
    const list = await workflow(pi, "list");
    assert.match(list.message, /^Workflows \(1-2 of 2\):/);
  });

  it("bad /workflow input gets one usage line and changes nothing", async (t) => {
    const s = await setup(t);
    const pi = await spawnWorkflowPi(s);
    const bad = await workflow(pi, "approve --input-json {not json");
    assert.deepEqual([bad.notifyType, bad.message], ["warning", "Usage: /workflow approve --input-json <json> (the input is not valid JSON)"]);
    const unknown = await workflow(pi, "no-such-workflow");
    assert.equal(unknown.notifyType, "error");
    assert.doesNotMatch(unknown.message, /\n/);
    const view = await s.server.connect();
    t.after(() => view.close());
    const runs = await view.request("runs.list", { limit: 10 });
    assert.equal(runs.outcome, "accepted", JSON.stringify(runs));
    assert.deepEqual((runs.receipt as { rows: unknown[] }).rows, [], "no run was started");
    const status = await workflow(pi, "status");
    assert.match(status.message, /^No workflow is running\./);
  });

  it("an open session recovers when the server was unavailable at startup, and again after a server restart", async (t) => {
    const s = await setup(t);
    await s.server.cli(["server", "stop"]);
    // Pi may not start the server itself here: the binary it would run does not exist.
    const pi = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: { ...s.env, PI_WORKFLOWS_BIN: join(s.server.root, "no-such-binary") } });
    const down = await workflow(pi, "status");
    assert.equal(down.notifyType, "warning");
    assert.match(down.message, /^The pi-workflows server is unavailable \(.+\); status shows again once it is back\.$/);

    await s.server.cli(["server", "start"]);
    const view = await s.server.connect();
    t.after(() => view.close());
    const sessionId = pi.state?.sessionId;
    assert.ok(sessionId !== undefined);
    const since = pi.mark();
    const start = await view.command("run.start", { workflow: "approve", input: {}, executionMode: "interactive", originSessionId: sessionId, projectPath: s.project });
    assert.equal(start.outcome, "accepted", JSON.stringify(start));
    // No command from Pi: the once-per-second recovery finds the server and the run.
    await statusLine(pi, /^wf approve \[waiting\] review$/, since);

    view.close();
    await s.server.cli(["server", "stop"]);
    const downSince = pi.mark();
    await statusLine(pi, /^wf \[unavailable\]$/, downSince);
    await s.server.cli(["server", "start"]);
    await statusLine(pi, /^wf approve \[waiting\] review$/, downSince);
    const again = await workflow(pi, "status");
    assert.match(again.message, /^Workflow approve — Approve the draft \[waiting\]/);
  });

  it("never opens state.sqlite: no file open of it in Pi's process tree while it lists, starts, reads and answers a run", async (t) => {
    const s = await setup(t);
    const trace = join(s.server.root, "pi.strace");
    const pi = await s.fixture.spawnRpc({ extensions: [SDK_DIR], cwd: s.project, env: s.env, prefix: ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", trace] });
    await workflow(pi, "list");
    const since = pi.mark();
    await workflow(pi, "approve");
    await statusLine(pi, /^wf approve \[waiting\] review$/, since);
    await workflow(pi, "status");
    const answered = pi.mark();
    await workflow(pi, `answer {"approver":"bob"}`);
    await statusLine(pi, /^wf approve \[completed\]/, answered);
    await pi.stop();
    const opens = readFileSync(trace, "utf8").split("\n").filter((line) => /open/.test(line));
    assert.ok(opens.some((line) => line.includes("dist/extension/index.js")), "the trace shows the extension being loaded");
    assert.ok(opens.some((line) => line.includes("server.sock") || line.includes("approve.workflow.ts")) || opens.length > 100, "the trace covers the session");
    assert.deepEqual(stateFileOpens(opens), []);
    // The state file exists and the server (outside the trace) uses it.
    assert.equal(spawnSync("test", ["-f", join(s.server.home, "state.sqlite")]).status, 0);
  });

  it("the state.sqlite trace check fails when an extension in Pi's process tree opens the file (a planted open)", async (t) => {
    const s = await setup(t);
    const trace = join(s.server.root, "pi-planted.strace");
    const planted = join(s.server.root, "planted-extension.ts");
    // A planted extension beside ours: it opens the server's state file read-only at session start.
    writeFileSync(
      planted,
      `import { closeSync, openSync } from "node:fs";
export default function (pi: { on(event: "session_start", handler: () => void): void }) {
  pi.on("session_start", () => closeSync(openSync(${JSON.stringify(join(s.server.home, "state.sqlite"))}, "r")));
}
`,
    );
    const pi = await s.fixture.spawnRpc({ extensions: [SDK_DIR, planted], cwd: s.project, env: s.env, prefix: ["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", trace] });
    await workflow(pi, "list");
    await pi.stop();
    const opens = readFileSync(trace, "utf8").split("\n").filter((line) => /open/.test(line));
    const found = stateFileOpens(opens);
    assert.equal(found.length, 1, found.join("\n"));
    assert.match(found[0] as string, /openat\(.*state\.sqlite", O_RDONLY/);
  });
});

describe("the extension in real Pi's TUI (tmux)", () => {
  it("draws the widget as a component and the status line from the server's view, and the answer completes the run", async (t) => {
    const s = await setup(t);
    const tui = await s.fixture.startTui({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const { tmux } = tui;
    tmux.type("/workflow approve");
    tmux.sendKeys("Enter");
    await tmux.waitForScreen(/⏸ workflow approve — Approve the draft \[waiting\]/, 30_000);
    const screen = await tmux.waitForScreen(/wf approve \[waiting\] review/, 30_000);
    assert.match(screen, / {2}⏸ ◆ review/);
    assert.match(screen, /waiting on checkpoint: review — answer with \/workflow answer <json>/);

    tmux.type(`/workflow answer {"approver":"tui"}`);
    tmux.sendKeys("Enter");
    await tmux.waitForScreen(/✓ workflow approve — Approve the draft \[completed\]/, 30_000);
    await tmux.waitForScreen(/wf approve \[completed\]/, 30_000);
    const stop = await tui.stop();
    assert.deepEqual(stop, { status: 0, signal: null, forced: false });
  });

  it("windows a long run around its active node, and Shift+Up / Shift+Down scroll the widget", async (t) => {
    const s = await setup(t);
    writeFileSync(join(s.project, ".pi", "workflows", "long.workflow.ts"), LONG);
    const tui = await s.fixture.startTui({ extensions: [SDK_DIR], cwd: s.project, env: s.env });
    const { tmux } = tui;
    tmux.type("/workflow long");
    tmux.sendKeys("Enter");
    // 21 nodes, 16 widget lines: the window follows the waiting checkpoint at the end.
    let screen = await tmux.waitForScreen(/shift\+↑\/↓ scroll \(8 above, end\)/, 30_000);
    assert.match(screen, /⏸ ◆ gate/);
    assert.doesNotMatch(screen, /✓ ƒ s08\b/);
    tmux.sendKeys("S-Up");
    screen = await tmux.waitForScreen(/shift\+↑\/↓ scroll \(5 above, 3 below\)/, 10_000);
    assert.match(screen, /✓ ƒ s06\b/);
    assert.doesNotMatch(screen, /◆ gate/);
    tmux.sendKeys("S-Down");
    await tmux.waitForScreen(/shift\+↑\/↓ scroll \(8 above, end\)/, 10_000);
    await tmux.waitForScreen(/wf long \[waiting\] gate/, 10_000);
    const stop = await tui.stop();
    assert.deepEqual(stop, { status: 0, signal: null, forced: false });
  });
});
