/**
 * Which process opens what, from a system-call trace of a real run: the
 * server attached under `strace -f`, so every thread and child it makes
 * (the resolver, the node runner, the validation child, headless Pi and its
 * tools) is traced, and each CLI command under its own trace. A headless
 * agent run goes through all of them with the mock model.
 *
 * - The server is the only process that opens the live state
 *   (`state.sqlite` and its `-wal`, `-shm`, `-journal`): every such open is
 *   by a thread of the server process.
 * - The server runs no workflow code: no thread of the server process
 *   opens the `.workflow.ts` file; its children do.
 *
 * Run with `npm run test:pi` (needs strace; scripts/test-all.sh installs it).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import { reply, submitStep } from "../test-support/mock-model.js";
import { piFixture } from "../test-support/pi.js";
import { TestServer, serverBinary, stepNodes } from "../test-support/server.js";
import { REVIEW_WORKFLOW } from "../test-support/workflows.js";

const TRACED = ["-f", "-qq", "-s", "4096", "-e", "trace=open,openat,openat2,execve,clone,clone3,fork,vfork"];

/** One traced task's opens and the program it runs. */
interface Task {
  tid: number;
  /** The process (thread group) the task belongs to. */
  process: number;
  opened: string[];
  /** The last program the task exec'd (inherited from its creator until then). */
  program: string;
}

/**
 * Reads an `strace -f` log: tasks by id, each with its process (a clone
 * with CLONE_THREAD adds a thread to its creator's process; any other clone,
 * fork or vfork starts a new process), the paths it opened successfully, and
 * the program it runs.
 */
function readTrace(text: string): Map<number, Task> {
  const tasks = new Map<number, Task>();
  const task = (tid: number): Task => {
    let found = tasks.get(tid);
    if (found === undefined) {
      found = { tid, process: tid, opened: [], program: "" };
      tasks.set(tid, found);
    }
    return found;
  };
  // A call split by another task's line: its head waits for its resumed tail.
  const unfinished = new Map<number, string>();
  for (const raw of text.split("\n")) {
    const head = /^(\d+) +(.*)$/.exec(raw);
    if (head === null) continue;
    const tid = Number(head[1]);
    let line = head[2] as string;
    if (line.endsWith("<unfinished ...>")) {
      unfinished.set(tid, line.slice(0, -"<unfinished ...>".length));
      continue;
    }
    const resumed = /^<\.\.\. \w+ resumed>(.*)$/.exec(line);
    if (resumed !== null) {
      line = (unfinished.get(tid) ?? "") + resumed[1];
      unfinished.delete(tid);
    }
    const creator = task(tid);
    const created = /^(clone3?|fork|vfork)\((.*)\) = (\d+)$/.exec(line);
    if (created !== null) {
      const child = task(Number(created[3]));
      child.process = (created[2] as string).includes("CLONE_THREAD") ? creator.process : child.tid;
      child.program = creator.program;
      continue;
    }
    const exec = /^execve\("([^"]+)", \[(.*?)\].* = 0$/.exec(line);
    if (exec !== null) {
      creator.program = `${exec[1]} ${exec[2]}`;
      continue;
    }
    const open = /^open(?:at2?)?\((?:AT_FDCWD|\d+), "([^"]+)".* = \d+$/.exec(line) ?? /^open\("([^"]+)".* = \d+$/.exec(line);
    if (open !== null) creator.opened.push(open[1] as string);
  }
  return tasks;
}

const STATE_FILE = /\/state\.sqlite(-wal|-shm|-journal)?$/;

function cliTraced(server: TestServer, trace: string, args: string[], cwd: string): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    execFile("strace", [...TRACED, "-o", trace, serverBinary(), ...args], { env: server.env, cwd, timeout: 60_000 }, (error, stdout, stderr) =>
      error ? reject(new Error(`${args.join(" ")}: ${error.message}\n${stdout}${stderr}`)) : resolvePromise(stdout + stderr),
    );
  });
}

describe("the server alone opens the live state and runs no workflow code", () => {
  it("a headless agent run under strace: only server threads open state.sqlite, and only its children open the workflow file", async (t) => {
    const { sandbox } = await piFixture(t, {
      rules: [
        { name: "done", lastRole: "tool", when: "Output accepted for step review", reply: reply.text("Done.") },
        { name: "submit", lastRole: "user", when: "Workflow step contract (workflow: review, step: review", reply: submitStep({ verdict: "approve", reason: "ok" }) },
      ],
    });
    const serverTrace = join(sandbox.root, "server.trace");
    const { server, exited } = await TestServer.runWrapped(["strace", ...TRACED, "-o", serverTrace], { env: { PI_WORKFLOWS_PI: sandbox.piExecutable() } });
    let stopped = false;
    t.after(async () => {
      if (!stopped) await server.stop();
    });
    const project = server.project();
    writeFileSync(join(project, ".pi", "workflows", "review.workflow.ts"), REVIEW_WORKFLOW);
    const cliTrace = join(sandbox.root, "cli.trace");
    const out = await cliTraced(server, cliTrace, ["start", "review", "check", "it"], project);
    const runId = /started run (\S+)/.exec(out)?.[1];
    assert.ok(runId, out);
    const client = await server.connect();
    const view = await client.settled(runId);
    client.close();
    assert.equal(view.status.run, "completed", `${JSON.stringify(view.display)}\n${server.serverLog()}`);
    assert.deepEqual(stepNodes(view), ["review", "ship"]);
    stopped = true;
    await server.stop();
    assert.equal(await exited, 0, "the traced server exited cleanly");

    const tasks = readTrace(readFileSync(serverTrace, "utf8"));
    const serverPid = [...tasks.values()].find((task) => / server run$|"server", "run"/.test(task.program) && task.process === task.tid)?.process;
    assert.ok(serverPid !== undefined, "the trace shows the server process");
    const programs = new Set([...tasks.values()].filter((task) => task.process !== serverPid).map((task) => task.program));
    const ran = (pattern: RegExp): boolean => [...programs].some((program) => pattern.test(program));
    assert.ok(ran(/runner\/bin\.js/), `the node runner ran under the trace: ${[...programs].join(" | ")}`);
    assert.ok(ran(/\bpi\b/), `Pi ran under the trace: ${[...programs].join(" | ")}`);

    const stateOpeners = [...tasks.values()].filter((task) => task.opened.some((path) => STATE_FILE.test(path)));
    assert.ok(stateOpeners.some((task) => task.process === serverPid), "the server opened its state (the trace sees it)");
    assert.deepEqual(
      stateOpeners.filter((task) => task.process !== serverPid).map((task) => `${task.tid} ${task.program}`),
      [],
      "no other process opened the live state",
    );
    const workflowOpeners = [...tasks.values()].filter((task) => task.opened.some((path) => path.endsWith("review.workflow.ts")));
    assert.ok(workflowOpeners.length > 0, "the children loaded the workflow (the trace sees it)");
    assert.deepEqual(
      workflowOpeners.filter((task) => task.process === serverPid).map((task) => task.tid),
      [],
      "no thread of the server opened the workflow's code",
    );
    const cli = readTrace(readFileSync(cliTrace, "utf8"));
    assert.ok([...cli.values()].some((task) => task.opened.length > 0), "the CLI's trace has its opens");
    assert.deepEqual(
      [...cli.values()].filter((task) => task.opened.some((path) => STATE_FILE.test(path))).map((task) => task.program),
      [],
      "the CLI did not open the live state",
    );
  });
});
