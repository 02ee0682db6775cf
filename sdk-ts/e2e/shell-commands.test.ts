/**
 * Shell actions whose commands a user writes first, through the real server
 * and node runners: commands that exit at once (in a loop of 100 workflow
 * runs, four at a time), commands that print nothing, that fill stdout and
 * stderr past the capture cap, and that die on a signal. Each run ends with
 * the command's real outcome, never at its node deadline, and no process
 * registration outlives its shell action.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { RunView } from "../src/generated/types.js";
import { type TestClient, TestServer } from "../test-support/server.js";

let server: TestServer;
let client: TestClient;
let project: string;

/** The runner's default capture cap of each stream, in characters. */
const DEFAULT_CAP = 1_000_000;
const MARKER = "\n…[output truncated]";

/**
 * `cmd`: one shell node running `input.command` with `input.args`. The output
 * keeps short streams whole and summarizes long ones (length, head, tail), so
 * that a capped stream can be checked without sending a megabyte back.
 */
const CMD_WORKFLOW = `import { defineWorkflow, shell } from "@pi-workflows/sdk";
const summary = (text) => (text.length <= 200 ? text : { chars: text.length, head: text.slice(0, 8), tail: text.slice(-24) });
export default defineWorkflow({
  name: "cmd",
  startAt: "run",
  nodes: {
    run: shell({
      exec: ({ input }) => ({
        command: input.command,
        args: input.args ?? [],
        allowNonZeroExit: input.allowNonZeroExit === true,
        ...(input.maxOutputChars !== undefined ? { maxOutputChars: input.maxOutputChars } : {}),
      }),
      parse: (result) => ({ stdout: summary(result.stdout), stderr: summary(result.stderr), exitCode: result.exitCode, signal: result.signal }),
    }),
  },
});
`;

/** `raw`: the same command without `parse`, so the node's output is the whole ShellResult. */
const RAW_WORKFLOW = `import { defineWorkflow, shell } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "raw",
  startAt: "run",
  nodes: { run: shell({ exec: ({ input }) => ({ command: input.command, args: input.args ?? [] }) }) },
});
`;

/** `registered`: a shell node long enough to register its process group, then a node that waits for a file. */
function registeredWorkflow(release: string): string {
  return `import { existsSync } from "node:fs";
import { compute, defineWorkflow, shell } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "registered",
  startAt: "sh",
  nodes: {
    sh: shell({ exec: () => ({ command: "sleep", args: ["0.5"] }) }),
    hold: compute({
      timeoutMs: 60_000,
      run: ({ signal }) => new Promise((resolve, reject) => {
        const timer = setInterval(() => { if (existsSync(${JSON.stringify(release)})) { clearInterval(timer); resolve({ released: true }); } }, 20);
        signal.addEventListener("abort", () => { clearInterval(timer); reject(signal.reason); });
      }),
    }),
  },
  edges: [{ from: "sh", to: "hold" }],
});
`;
}

before(async () => {
  server = await TestServer.start({ env: { PI_WORKFLOWS_MAX_WORKERS: "4" } });
  project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "cmd.workflow.ts"), CMD_WORKFLOW);
  writeFileSync(join(project, ".pi", "workflows", "raw.workflow.ts"), RAW_WORKFLOW);
  client = await server.connect();
});

after(async () => {
  client?.close();
  await server?.stop();
});

interface Cmd {
  command: string;
  args?: string[];
  allowNonZeroExit?: boolean;
  maxOutputChars?: number;
}

/** The output the runner proposed (and the server accepted) for the `run` node. */
async function output(runId: string): Promise<unknown> {
  const record = (await server.journalAfterExit(runId)).find((entry) => entry.event === "node" && entry.nodeId === "run");
  assert.ok(record, `no journal record of node run in ${runId}`);
  return record.output;
}

async function runCmd(cmd: Cmd): Promise<{ runId: string; view: RunView }> {
  const runId = await client.start(project, "cmd", cmd);
  return { runId, view: await client.settled(runId, 60_000) };
}

/** The live runner_processes rows (the server's registered shell process groups). */
function registeredProcesses(): number {
  const out = execFileSync("sqlite3", [join(server.home, "state.sqlite"), "SELECT count(*) FROM runner_processes"], { encoding: "utf8" });
  return Number(out.trim());
}

describe("shell commands", () => {
  it("100 runs of commands that exit at once (true, /bin/echo 42, sh -c \"echo hi\"), four at a time, all complete with their output", async () => {
    const commands: { cmd: Cmd; stdout: string }[] = [
      { cmd: { command: "true" }, stdout: "" },
      { cmd: { command: "/bin/echo", args: ["42"] }, stdout: "42\n" },
      { cmd: { command: "sh", args: ["-c", "echo hi"] }, stdout: "hi\n" },
    ];
    const startedAt = Date.now();
    // Four clients start runs side by side (each run.start resolves the workflow in a runner of its own).
    const runs: { runId: string; stdout: string }[] = [];
    let next = 0;
    await Promise.all(
      Array.from({ length: 4 }, async () => {
        for (let i = next++; i < 100; i = next++) {
          const { cmd, stdout } = commands[i % commands.length]!;
          const runId = await client.start(project, "cmd", cmd).catch((error: unknown) => {
            throw new Error(`run ${i} of 100: ${String(error)}\n${server.serverLog().split("\n--- ")[0]?.slice(-2000)}`);
          });
          runs[i] = { runId, stdout };
        }
      }),
    );
    const acceptedAt = Date.now();
    // Generous: a run that misses its child's exit waits for its 15-minute node deadline.
    const deadline = Date.now() + 240_000;
    const pending = new Set(runs.map((run) => run.runId));
    const views = new Map<string, RunView>();
    while (pending.size > 0 && Date.now() < deadline) {
      for (const runId of [...pending]) {
        const view = await client.view(runId);
        if (!["queued", "running"].includes(view.status.run)) {
          views.set(runId, view);
          pending.delete(runId);
        }
      }
      if (pending.size > 0) await new Promise((r) => setTimeout(r, 200));
    }
    if (pending.size > 0) {
      const stuck = await Promise.all([...pending].map((runId) => client.view(runId)));
      const counts = new Map<string, number>();
      for (const view of stuck) counts.set(view.status.run, (counts.get(view.status.run) ?? 0) + 1);
      const running = stuck.find((view) => view.status.run === "running");
      assert.fail(`${pending.size} of 100 runs never settled: ${JSON.stringify([...counts])}; a running one: ${JSON.stringify(running?.display ?? null)}`);
    }
    process.stderr.write(`# 100 runs: accepted in ${acceptedAt - startedAt} ms, all settled ${Date.now() - acceptedAt} ms later\n`);
    for (const { runId, stdout } of runs) {
      const view = views.get(runId)!;
      assert.equal(view.status.run, "completed", `${runId}: ${JSON.stringify(view.display)} ${JSON.stringify(view.failure ?? null)}`);
      assert.deepEqual(await output(runId), { stdout, stderr: "", exitCode: 0, signal: null });
    }
  });

  it("a command that prints nothing and exits 0 completes with empty streams; one that prints nothing and exits 3 fails naming exit 3", async () => {
    const quiet = await runCmd({ command: "sh", args: ["-c", "exit 0"] });
    assert.equal(quiet.view.status.run, "completed");
    assert.deepEqual(await output(quiet.runId), { stdout: "", stderr: "", exitCode: 0, signal: null });
    const failing = await runCmd({ command: "sh", args: ["-c", "exit 3"] });
    assert.equal(failing.view.status.run, "failed");
    assert.equal(failing.view.failure?.message, 'Shell action failed (sh "-c" "exit 3"): exit 3');
    const allowed = await runCmd({ command: "sh", args: ["-c", "exit 3"], allowNonZeroExit: true });
    assert.equal(allowed.view.status.run, "completed");
    assert.deepEqual(await output(allowed.runId), { stdout: "", stderr: "", exitCode: 3, signal: null });
  });

  it("stdout and stderr past the default cap are each kept to 1,000,000 characters plus the truncation marker; the command still completes", async () => {
    const script = "head -c 3000000 /dev/zero | tr '\\0' o; head -c 2000000 /dev/zero | tr '\\0' e >&2";
    const { runId, view } = await runCmd({ command: "sh", args: ["-c", script] });
    assert.equal(view.status.run, "completed", JSON.stringify(view.failure ?? null));
    const tail = (char: string): string => `${char.repeat(24 - MARKER.length)}${MARKER}`;
    assert.deepEqual(await output(runId), {
      stdout: { chars: DEFAULT_CAP + MARKER.length, head: "oooooooo", tail: tail("o") },
      stderr: { chars: DEFAULT_CAP + MARKER.length, head: "eeeeeeee", tail: tail("e") },
      exitCode: 0,
      signal: null,
    });
  });

  it("without parse, the output is the ShellResult: one capped stream fits the frame; two capped streams fail the node naming the 1 MiB limit", async () => {
    const one = await client.start(project, "raw", { command: "sh", args: ["-c", "head -c 3000000 /dev/zero | tr '\\0' o"] });
    const oneView = await client.settled(one, 60_000);
    assert.equal(oneView.status.run, "completed", JSON.stringify(oneView.failure ?? null));
    const result = (await output(one)) as { stdout: string; stderr: string; exitCode: number };
    assert.deepEqual([result.stdout.length, result.stdout.endsWith(MARKER), result.stderr, result.exitCode], [DEFAULT_CAP + MARKER.length, true, "", 0]);
    const two = await client.start(project, "raw", { command: "sh", args: ["-c", "head -c 3000000 /dev/zero | tr '\\0' o; head -c 3000000 /dev/zero | tr '\\0' e >&2"] });
    const twoView = await client.settled(two, 60_000);
    assert.equal(twoView.status.run, "failed");
    assert.match(
      twoView.failure?.message ?? "",
      /^its output is 1\.91 MiB encoded \(the effect\.settle frame would be 2,000,\d{3} bytes\); a frame must fit the protocol's 1 MiB limit \(1,048,576 bytes\)$/,
    );
  });

  it("maxOutputChars caps a stream at exactly that many characters", async () => {
    const { runId, view } = await runCmd({ command: "sh", args: ["-c", "yes | head -c 100000"], maxOutputChars: 6 });
    assert.equal(view.status.run, "completed");
    assert.deepEqual(await output(runId), { stdout: `y\ny\ny\n${MARKER}`, stderr: "", exitCode: 0, signal: null });
  });

  it("a command killed by a signal fails naming the signal; with allowNonZeroExit it completes with signal SIGTERM and no exit code", async () => {
    const killed = await runCmd({ command: "sh", args: ["-c", "kill -TERM $$"] });
    assert.equal(killed.view.status.run, "failed");
    assert.equal(killed.view.failure?.message, 'Shell action failed (sh "-c" "kill -TERM $$"): signal SIGTERM');
    const allowed = await runCmd({ command: "sh", args: ["-c", "echo bye; kill -TERM $$"], allowNonZeroExit: true });
    assert.equal(allowed.view.status.run, "completed");
    assert.deepEqual(await output(allowed.runId), { stdout: "bye\n", stderr: "", exitCode: null, signal: "SIGTERM" });
  });

  it("a missing executable fails its node with the spawn error", async () => {
    const { view } = await runCmd({ command: "/nonexistent/piw-no-such-command" });
    assert.equal(view.status.run, "failed");
    assert.match(view.failure?.message ?? "", /^Shell action failed \(\/nonexistent\/piw-no-such-command\): spawn \/nonexistent\/piw-no-such-command ENOENT$/);
  });

  it("a finished shell action leaves no registered process group behind while its run goes on", async () => {
    const release = join(server.root, "registered.release");
    writeFileSync(join(project, ".pi", "workflows", "registered.workflow.ts"), registeredWorkflow(release));
    const runId = await client.start(project, "registered");
    await client.waitFor(runId, (view) => view.steps.items.some((step) => step.nodeId === "sh" && step.outcome === "ok"), 30_000, "sh finished");
    await client.waitFor(runId, (view) => view.display.status === "running", 30_000, "hold running");
    assert.equal(registeredProcesses(), 0, "the shell group's registration was withdrawn when it closed");
    writeFileSync(release, "go");
    const view = await client.settled(runId);
    assert.equal(view.status.run, "completed");
    assert.equal(existsSync(release), true);
  });
});
