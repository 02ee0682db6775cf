/**
 * Headless agent steps: one `pi --mode rpc` child per agent attempt of a
 * headless run, with the bridge extension (`pi-bridge.ts`) as its only
 * extension.
 *
 * Invariants:
 * - Pi is found in this order: `PI_WORKFLOWS_PI` (an executable), `pi` on
 *   `PATH`, the pi-workflows checkout's own install (`.e2e/pi/env`, written
 *   by `scripts/install-pi.sh`); otherwise the step fails with one line that
 *   names the install command ([`PiUnavailable`]).
 * - The child runs in its own process group. It is registered with the
 *   server (`process.register`) before the prompt is written, and
 *   unregistered only after its whole group is gone (normal completion,
 *   failure or abort all end in [`stopGroup`]: stdin EOF, SIGTERM to the
 *   group, SIGKILL after a bound, then a wait until no process of the group
 *   is left). The group is in `liveGroups`, so a stopping runner signals it
 *   with its shell groups.
 * - Pi receives only the step prompt (with its step contract), the model
 *   arguments and the bridge. Its stderr is the runner's stderr (the
 *   server's bounded, user-only runner log); its stdout is the rpc event
 *   stream, read here, of which only a bounded tail is kept (and logged when
 *   the step fails).
 * - The step completes only when the bridge reports (in the `workflow` tool
 *   result's details) that the server accepted a submission; the accepted,
 *   normalized output is the step's output. A turn that settles without an
 *   accepted submission gets a reminder, at most [`MAX_REMINDERS`] times;
 *   the next one fails the step.
 */
import type { ChildProcessWithoutNullStreams } from "node:child_process";
import { accessSync, constants, existsSync, readFileSync, readdirSync } from "node:fs";
import { delimiter, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { AgentModel } from "../authoring/types.js";
import { childProcess, liveGroups, processStartIdentity, signalGroup } from "./shell.js";

/** Reminders after a turn settles without an accepted submission (reference §5.4). */
export const MAX_REMINDERS = 2;
/** How long Pi may take to exit after stdin EOF and SIGTERM before SIGKILL. */
export const PI_STOP_GRACE_MS = 3_000;
/** The most of Pi's stdout kept in memory (the tail). */
export const STDOUT_TAIL_BYTES = 64 * 1024;
/** The most of that tail written to the runner log when a step fails. */
const LOGGED_TAIL_BYTES = 4 * 1024;

/** The one-line error when no Pi can be found. */
export const PI_INSTALL_HINT =
  "headless agent steps need Pi: install it with `npm install -g @earendil-works/pi-coding-agent` (Node >= 22.19), run scripts/install-pi.sh in the pi-workflows checkout, or set PI_WORKFLOWS_PI to the pi executable";

/** No Pi executable was found. */
export class PiUnavailable extends Error {
  override readonly name = "PiUnavailable";
}

/** How to start Pi: a program and the arguments before Pi's own. */
export interface PiCommand {
  program: string;
  args: string[];
  /** Where it was found (for the runner log). */
  source: "PI_WORKFLOWS_PI" | "PATH" | ".e2e/pi";
}

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** The pi-workflows checkout's `.e2e/pi/env` (this file is `sdk-ts/{src,dist}/runner/pi.*`). */
function checkoutInstall(): PiCommand | null {
  const envFile = fileURLToPath(new URL("../../../.e2e/pi/env", import.meta.url));
  if (!existsSync(envFile)) return null;
  const values: Record<string, string> = {};
  for (const line of readFileSync(envFile, "utf8").split("\n")) {
    const at = line.indexOf("=");
    if (at > 0) values[line.slice(0, at)] = line.slice(at + 1);
  }
  const node = values.PI_E2E_NODE;
  const cli = values.PI_E2E_CLI;
  if (node === undefined || cli === undefined || !executable(node) || !existsSync(cli)) return null;
  return { program: node, args: [cli], source: ".e2e/pi" };
}

/** Finds Pi (see the module comment) or throws [`PiUnavailable`]. */
export function resolvePi(env: NodeJS.ProcessEnv = process.env): PiCommand {
  const explicit = env.PI_WORKFLOWS_PI;
  if (explicit !== undefined && explicit !== "") {
    if (!executable(explicit)) throw new PiUnavailable(`PI_WORKFLOWS_PI=${explicit} is not an executable file; ${PI_INSTALL_HINT}`);
    return { program: explicit, args: [], source: "PI_WORKFLOWS_PI" };
  }
  for (const dir of (env.PATH ?? "").split(delimiter)) {
    if (dir === "") continue;
    const candidate = join(dir, "pi");
    if (executable(candidate)) return { program: candidate, args: [], source: "PATH" };
  }
  const installed = checkoutInstall();
  if (installed) return installed;
  throw new PiUnavailable(PI_INSTALL_HINT);
}

/** The bridge extension file next to this module (compiled `.js` in dist, `.ts` when run from source). */
export function bridgePath(): string {
  const js = fileURLToPath(new URL("./pi-bridge.js", import.meta.url));
  return existsSync(js) ? js : fileURLToPath(new URL("./pi-bridge.ts", import.meta.url));
}

/** `--provider`, `--model`, `--thinking` for the given model arguments. */
export function modelArgs(model: AgentModel): string[] {
  const args: string[] = [];
  if (model.provider !== undefined) args.push("--provider", model.provider);
  if (model.model !== undefined) args.push("--model", model.model);
  if (model.thinking !== undefined) args.push("--thinking", model.thinking);
  return args;
}

/** What the bridge needs to know (passed as `PI_WORKFLOWS_BRIDGE`, JSON). */
export interface BridgeTarget {
  runId: string;
  interactionId: string;
  attemptId: string;
  /** The step id of the contract (the node's local id). */
  step: string;
  workflowName: string;
  generation: number;
  runnerEpoch: string;
}

/** What a headless step needs from the runner. */
export interface HeadlessStep {
  pi: PiCommand;
  projectPath: string;
  prompt: string;
  model: AgentModel;
  bridge: BridgeTarget;
  signal: AbortSignal;
  /** `process.register`; resolves true when the server accepted it. */
  register: (pid: number, startIdentity: string) => Promise<boolean>;
  /** `process.unregister` (called only after the group is gone). */
  unregister: (pid: number, startIdentity: string) => Promise<void>;
  log: (line: string) => void;
}

/** Why a headless step failed (the executor turns it into a node failure). */
export class HeadlessStepFailed extends Error {
  override readonly name = "HeadlessStepFailed";
}

/** The details the bridge puts in its `workflow` tool results. */
export interface BridgeDetails {
  bridge: "pi-workflows";
  action: "submit" | "update";
  outcome: "accepted" | "rejected" | "refused";
  attemptId: string;
  submissionId?: string;
  /** submit accepted: the normalized output the server accepted. */
  output?: unknown;
}

type PiEvent = { type?: unknown; [key: string]: unknown };

/** How often the group is checked while members other than the leader are left. */
const GROUP_POLL_MS = 20;

/**
 * Waits until no process of group `pgid` is left (bounded by `ms`); true
 * when it is empty. Each wait also ends when the leader exits (`leaderExit`:
 * Node reaps it first), so the usual group, Pi alone, is seen gone at once
 * rather than on the next poll.
 */
async function groupGone(pgid: number, ms: number, leaderExit: Promise<void>): Promise<boolean> {
  const until = Date.now() + ms;
  // Once the leader is gone, only the poll wakes the wait.
  let leader: Promise<"leader"> | null = leaderExit.then(() => "leader" as const);
  for (;;) {
    try {
      process.kill(-pgid, 0);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ESRCH") return true;
    }
    const left = until - Date.now();
    if (left <= 0) return false;
    let timer: NodeJS.Timeout | undefined;
    const poll = new Promise<"poll">((resolve) => (timer = setTimeout(() => resolve("poll"), Math.min(GROUP_POLL_MS, left))));
    const woke = await Promise.race(leader === null ? [poll] : [leader, poll]);
    clearTimeout(timer);
    if (woke === "leader") leader = null;
  }
}

/** `/proc/<pid>/stat`: the parent pid and process group, or null. */
function procStat(pid: number): { parent: number; group: number } | null {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
    return { parent: Number(fields[1]), group: Number(fields[2]) };
  } catch {
    return null;
  }
}

/**
 * Every descendant of the members of group `pgid`, also those in groups of
 * their own (Pi runs its bash tool detached). Read before the group is
 * signalled: once a parent dies, its children are reparented.
 */
export function groupDescendants(pgid: number): number[] {
  const all: { pid: number; parent: number; group: number }[] = [];
  for (const name of readdirSync("/proc")) {
    const pid = Number(name);
    if (!Number.isInteger(pid)) continue;
    const stat = procStat(pid);
    if (stat) all.push({ pid, ...stat });
  }
  const inside = new Set(all.filter((p) => p.group === pgid).map((p) => p.pid));
  const found: number[] = [];
  for (let grew = true; grew; ) {
    grew = false;
    for (const p of all) {
      if (!inside.has(p.pid) && inside.has(p.parent)) {
        inside.add(p.pid);
        found.push(p.pid);
        grew = true;
      }
    }
  }
  return found;
}

/**
 * Stops the whole group of `child` and every descendant: stdin EOF, SIGTERM
 * to the group, SIGKILL after `graceMs`, then SIGKILL to what is left of the
 * descendants (and their groups), and waits until the group is empty.
 */
export async function stopGroup(child: ChildProcessWithoutNullStreams, graceMs = PI_STOP_GRACE_MS): Promise<void> {
  const pgid = child.pid;
  if (pgid === undefined) return;
  const descendants = groupDescendants(pgid);
  const leaderExit = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once("exit", () => resolve());
  });
  child.stdin.end();
  signalGroup(pgid, "SIGTERM");
  if (!(await groupGone(pgid, graceMs, leaderExit))) {
    signalGroup(pgid, "SIGKILL");
    await groupGone(pgid, 10_000, leaderExit);
  }
  for (const pid of descendants) {
    if (!signalGroup(pid, "SIGKILL")) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
  }
  liveGroups.delete(pgid);
}

function reminderText(bridge: BridgeTarget, remaining: number): string {
  const step = JSON.stringify(bridge.step);
  const attempt = JSON.stringify(bridge.attemptId);
  return [
    `Reminder: workflow step ${bridge.step} is still awaiting your output (${remaining} reminder${remaining === 1 ? "" : "s"} left).`,
    "Complete this step by calling the `workflow` tool exactly once with:",
    `{"action": "submit", "step": ${step}, "attempt": ${attempt}, "output": <your result>}`,
  ].join("\n");
}

/**
 * Runs one headless agent step to its accepted output. Throws the signal's
 * reason when it aborts, [`HeadlessStepFailed`] when Pi exits or the model
 * settles too often without an accepted submission.
 */
export async function runHeadlessStep(step: HeadlessStep): Promise<unknown> {
  const { bridge, log } = step;
  if (step.signal.aborted) throw step.signal.reason;
  const args = [...step.pi.args, "--mode", "rpc", "--no-session", "--no-extensions", "-e", bridgePath(), ...modelArgs(step.model)];
  const child = childProcess().spawn(step.pi.program, args, {
    cwd: step.projectPath,
    detached: true,
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, PI_WORKFLOWS_BRIDGE: JSON.stringify(bridge) },
  }) as unknown as ChildProcessWithoutNullStreams;
  const pid = child.pid;
  let tail = "";
  let exited: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  let settle: { resolve: (output: unknown) => void; reject: (error: unknown) => void } | undefined;
  const outcome = new Promise<unknown>((resolve, reject) => {
    settle = { resolve, reject };
  });
  const finish = {
    ok: (output: unknown): void => settle?.resolve(output),
    fail: (error: unknown): void => settle?.reject(error),
  };
  child.once("error", (error) => finish.fail(new HeadlessStepFailed(`pi could not be started (${step.pi.program}): ${error.message}`)));
  child.once("exit", (code, signal) => {
    exited = { code, signal };
    finish.fail(new HeadlessStepFailed(`the headless pi session exited mid-step (${signal ? `signal ${signal}` : `code ${code}`})`));
  });
  if (pid === undefined) {
    await outcome.catch(() => undefined);
    throw new HeadlessStepFailed(`pi could not be started (${step.pi.program})`);
  }
  liveGroups.add(pid);
  const startIdentity = processStartIdentity(pid);
  let registered = false;
  const onAbort = (): void => finish.fail(step.signal.reason);
  step.signal.addEventListener("abort", onAbort, { once: true });
  try {
    if (startIdentity === null) throw new HeadlessStepFailed("the headless pi session exited before it could be registered");
    registered = await step.register(pid, startIdentity);
    if (!registered) throw new HeadlessStepFailed("the server refused to register the headless pi session");
    let reminders = 0;
    let buffered = "";
    const write = (command: Record<string, unknown>): void => {
      if (!child.stdin.destroyed) child.stdin.write(`${JSON.stringify(command)}\n`);
    };
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk: string) => {
      tail = (tail + chunk).slice(-STDOUT_TAIL_BYTES);
      buffered += chunk;
      for (let at = buffered.indexOf("\n"); at >= 0; at = buffered.indexOf("\n")) {
        const line = buffered.slice(0, at);
        buffered = buffered.slice(at + 1);
        let event: PiEvent;
        try {
          event = JSON.parse(line) as PiEvent;
        } catch {
          continue;
        }
        if (event.type === "tool_execution_end" && event.toolName === "workflow") {
          const details = (event.result as { details?: BridgeDetails } | undefined)?.details;
          if (details?.bridge === "pi-workflows" && details.action === "submit" && details.outcome === "accepted" && details.attemptId === bridge.attemptId) {
            finish.ok(details.output === undefined ? null : details.output);
          }
        } else if (event.type === "agent_settled") {
          if (reminders >= MAX_REMINDERS) {
            finish.fail(new HeadlessStepFailed(`the agent settled ${reminders + 1} times without submitting step ${bridge.step} via the workflow tool`));
          } else {
            reminders += 1;
            write({ type: "prompt", message: reminderText(bridge, MAX_REMINDERS - reminders) });
          }
        } else if (event.type === "response" && event.success === false) {
          finish.fail(new HeadlessStepFailed(`pi refused the ${String(event.command)} command: ${String(event.error ?? "no reason given")}`));
        }
      }
    });
    write({ id: "step", type: "prompt", message: step.prompt });
    return await outcome;
  } catch (error) {
    if (!step.signal.aborted) {
      const logged = tail.slice(-LOGGED_TAIL_BYTES).replace(/\n/g, "\n  ");
      log(`headless pi (pid ${pid}) failed step ${bridge.step}${exited ? ` after exiting ${exited.signal ?? exited.code}` : ""}; the end of its rpc output:\n  ${logged}`);
    }
    throw error;
  } finally {
    step.signal.removeEventListener("abort", onAbort);
    await stopGroup(child);
    if (registered && startIdentity !== null) await step.unregister(pid, startIdentity);
  }
}
