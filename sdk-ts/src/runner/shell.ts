/**
 * Shell actions (reference §1.4): the command runs in its own process group
 * with the given stdin, environment (merged over the runner's) and working
 * directory; stdout and stderr are captured up to `maxOutputChars` each
 * (default 1,000,000, then the `\n…[output truncated]` marker); stopping it
 * sends SIGTERM to the group and SIGKILL after 1 s, and waits up to 2 s more
 * so a receipt always lands. Update lines are decoded as strict UTF-8, at most
 * 64 KiB each, with the stream paused while the parser runs; a trailing
 * partial line is parsed at close.
 *
 * The exit and stream listeners are attached at spawn, before anything is
 * awaited, so a command that ends at once is seen like any other; the
 * registration hook runs beside the command, and the close hook only after
 * the registration settled.
 */
import type { ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import type { ShellExecution, ShellResult } from "../authoring/types.js";

const requireBuiltin = createRequire(import.meta.url);

/**
 * `node:child_process`, loaded at the first spawn rather than with the
 * runner: a resolver until its run and a validation child spawn nothing,
 * and its load (with `net` and the stream machinery) is a few ms of CPU on
 * the start-up path.
 */
export function childProcess(): typeof import("node:child_process") {
  return requireBuiltin("node:child_process") as typeof import("node:child_process");
}

/** The default cap of each captured stream, in characters. */
export const DEFAULT_MAX_OUTPUT_CHARS = 1_000_000;
/** Appended to a capped stream. */
export const TRUNCATION_MARKER = "\n…[output truncated]";
/** SIGTERM to SIGKILL escalation. */
export const KILL_ESCALATION_MS = 1_000;
/** How long the runner waits for the group to close after SIGKILL. */
export const CLEANUP_WAIT_MS = 2_000;
/** The longest update line, in bytes. */
export const MAX_LINE_BYTES = 64 * 1024;

type Stream = "stdout" | "stderr";

/** A shell execution with every default applied. */
export interface ResolvedExecution {
  command: string;
  args: string[];
  cwd: string;
  env: Record<string, string>;
  stdin: string;
  shell: boolean;
  allowNonZeroExit: boolean;
  timeoutMs?: number;
  maxOutputChars: number;
}

/** Checks and completes what `exec(ctx)` returned. */
export function resolveExecution(execution: ShellExecution, projectPath: string, resolvePath: (base: string, p: string) => string): ResolvedExecution {
  if (typeof execution !== "object" || execution === null) throw new Error("exec() must return {command, args?, …}");
  if (typeof execution.command !== "string" || execution.command === "") throw new Error("exec(): command must be a non-empty string");
  const args = execution.args ?? [];
  if (!Array.isArray(args) || args.some((arg) => typeof arg !== "string")) throw new Error("exec(): args must be a list of strings");
  const env = execution.env ?? {};
  if (typeof env !== "object" || env === null || Object.values(env).some((value) => typeof value !== "string")) {
    throw new Error("exec(): env must map names to strings");
  }
  if (execution.stdin !== undefined && typeof execution.stdin !== "string") throw new Error("exec(): stdin must be a string");
  const maxOutputChars = execution.maxOutputChars ?? DEFAULT_MAX_OUTPUT_CHARS;
  if (!Number.isInteger(maxOutputChars) || maxOutputChars < 0) throw new Error("exec(): maxOutputChars must be a non-negative integer");
  if (execution.timeoutMs !== undefined && (!Number.isFinite(execution.timeoutMs) || execution.timeoutMs <= 0)) {
    throw new Error("exec(): timeoutMs must be a positive number");
  }
  return {
    command: execution.command,
    args: [...args],
    cwd: resolvePath(projectPath, execution.cwd ?? "."),
    env: { ...env },
    stdin: execution.stdin ?? "",
    shell: execution.shell === true,
    allowNonZeroExit: execution.allowNonZeroExit === true,
    ...(execution.timeoutMs !== undefined ? { timeoutMs: execution.timeoutMs } : {}),
    maxOutputChars,
  };
}

/** `cmd "arg" "arg"`: how a failed command is named. */
export function describeCommand(command: string, args: readonly string[]): string {
  return [command, ...args.map((arg) => JSON.stringify(arg))].join(" ");
}

/** How a shell action ended. */
export interface ShellOutcome {
  result: ShellResult;
  /** Set when the action failed (spawn error, non-zero exit, signal, timeout, abort, parser error). */
  failure?: { message: string; cause: "spawn" | "exit" | "timeout" | "aborted" | "updates" };
}

/** What a running shell action reports to its runner. */
export interface ShellHooks {
  signal: AbortSignal;
  /** Parses one line; a throw kills the command and fails the node. */
  onLine?: (line: string, stream: Stream) => Promise<void>;
  lineStreams?: readonly Stream[];
  /**
   * The process group leader started (the runner registers it with the
   * server). Called synchronously right after the spawn, with every exit
   * listener already attached; the command runs on while it is pending.
   */
  onSpawn?: (pid: number) => Promise<void>;
  /** The group closed; called once `onSpawn` has settled. */
  onClose?: (pid: number) => Promise<void>;
}

class Capture {
  text = "";
  truncated = false;
  constructor(private readonly max: number) {}
  add(chunk: string): void {
    if (this.truncated) return;
    const room = this.max - this.text.length;
    if (chunk.length <= room) {
      this.text += chunk;
    } else {
      let kept = chunk.slice(0, Math.max(0, room));
      // Never keep half of a surrogate pair: canonical JSON cannot carry a lone surrogate.
      if (/[\uD800-\uDBFF]$/.test(kept)) kept = kept.slice(0, -1);
      this.text += kept;
      this.truncated = true;
    }
  }
  value(): string {
    return this.truncated ? this.text + TRUNCATION_MARKER : this.text;
  }
}

/** The `<pid>:<start time>` identity of a process (field 22 of /proc/<pid>/stat), or null. */
export function processStartIdentity(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const start = fields[19];
    return start === undefined ? null : `${pid}:${start}`;
  } catch {
    return null;
  }
}

/** Signals a process group; false when it is gone. */
export function signalGroup(pid: number, signal: NodeJS.Signals): boolean {
  try {
    process.kill(-pid, signal);
    return true;
  } catch {
    return false;
  }
}

/** Runs `work` (its synchronous part now) and waits for it; a hook's failure never fails the command. */
async function settle(work: () => Promise<void> | undefined): Promise<void> {
  try {
    await work();
  } catch {
    // The hook reports its own failures (the runner logs a refused registration).
  }
}

/** `work`'s value, or null when it has not settled within `ms`. */
async function within<T>(work: Promise<T>, ms: number): Promise<T | null> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([work, new Promise<null>((resolve) => (timer = setTimeout(() => resolve(null), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** Live shell process groups of this runner (killed when the runner stops). */
export const liveGroups = new Set<number>();

/** Runs a resolved shell execution to completion (or until stopped). */
export async function runShell(execution: ResolvedExecution, hooks: ShellHooks): Promise<ShellOutcome> {
  const started = Date.now();
  const captures: Record<Stream, Capture> = {
    stdout: new Capture(execution.maxOutputChars),
    stderr: new Capture(execution.maxOutputChars),
  };
  let child: ChildProcess;
  let failure: ShellOutcome["failure"];
  const result = (exitCode: number | null, signal: string | null): ShellResult => ({
    command: execution.command,
    args: execution.args,
    cwd: execution.cwd,
    stdout: captures.stdout.value(),
    stderr: captures.stderr.value(),
    exitCode,
    signal,
    durationMs: Date.now() - started,
  });
  try {
    child = childProcess().spawn(execution.command, execution.args, {
      cwd: execution.cwd,
      env: { ...process.env, ...execution.env },
      detached: true,
      shell: execution.shell,
      stdio: ["pipe", "pipe", "pipe"],
    });
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    return { result: result(null, null), failure: { message: `Shell action failed (${describeCommand(execution.command, execution.args)}): ${message}`, cause: "spawn" } };
  }
  const pid = child.pid;
  // Every listener is attached before the first await: a command may exit at once,
  // and Node emits its `close` only once.
  const closed = new Promise<{ code: number | null; signal: string | null; spawnError?: Error }>((resolve) => {
    child.once("error", (error) => resolve({ code: null, signal: null, spawnError: error }));
    child.once("close", (code, signal) => resolve({ code, signal }));
  });
  let killTimer: NodeJS.Timeout | undefined;
  let stopping = false;
  let stopRequested: () => void = () => undefined;
  const stopped = new Promise<void>((resolve) => {
    stopRequested = resolve;
  });
  const stop = (why: NonNullable<ShellOutcome["failure"]>): void => {
    failure ??= why;
    if (stopping || pid === undefined) return;
    stopping = true;
    signalGroup(pid, "SIGTERM");
    killTimer = setTimeout(() => signalGroup(pid, "SIGKILL"), KILL_ESCALATION_MS);
    stopRequested();
  };
  // The registration runs beside the command (its synchronous part first); the
  // group is unregistered only after it settled.
  let registration: Promise<void> | undefined;
  if (pid !== undefined) {
    liveGroups.add(pid);
    registration = settle(() => hooks.onSpawn?.(pid));
  }
  child.stdin?.on("error", () => undefined);
  child.stdin?.end(execution.stdin);

  const lineStreams = new Set(hooks.onLine ? (hooks.lineStreams ?? ["stdout"]) : []);
  const pumps: Promise<void>[] = [];
  for (const name of ["stdout", "stderr"] as const) {
    const stream = child[name];
    if (!stream) continue;
    const parse = lineStreams.has(name);
    const decoder = new TextDecoder("utf-8", { fatal: parse });
    let pending = "";
    let pendingBytes = 0;
    const parseLines = async (text: string, final: boolean): Promise<void> => {
      pending += text;
      let newline = pending.indexOf("\n");
      while (newline >= 0) {
        const line = pending.slice(0, newline);
        pending = pending.slice(newline + 1);
        await hooks.onLine?.(line.endsWith("\r") ? line.slice(0, -1) : line, name);
        newline = pending.indexOf("\n");
      }
      pendingBytes = Buffer.byteLength(pending);
      if (pendingBytes > MAX_LINE_BYTES) throw new Error(`an update line on ${name} is longer than 64 KiB`);
      if (final && pending !== "") {
        const line = pending;
        pending = "";
        await hooks.onLine?.(line, name);
      }
    };
    pumps.push(
      (async () => {
        try {
          for await (const chunk of stream) {
            const text = decoder.decode(chunk as Uint8Array, { stream: true });
            captures[name].add(text);
            // Iterating the stream awaits the parser before the next chunk: that is the backpressure.
            if (parse && !failure) await parseLines(text, false);
          }
          const rest = decoder.decode();
          captures[name].add(rest);
          if (parse && !failure) await parseLines(rest, true);
        } catch (error) {
          const message = error instanceof Error ? error.message : String(error);
          stop({ message: `Shell action update failed (${describeCommand(execution.command, execution.args)}): ${message}`, cause: "updates" });
          stream.resume();
        }
      })(),
    );
  }
  const onAbort = (): void => {
    const reason: unknown = hooks.signal.reason;
    const timedOut = reason instanceof Error && reason.name === "TimeoutError";
    stop({ message: timedOut ? "the node exceeded its deadline" : "the node was stopped", cause: "aborted" });
  };
  if (hooks.signal.aborted) onAbort();
  else hooks.signal.addEventListener("abort", onAbort, { once: true });
  const commandTimer =
    execution.timeoutMs !== undefined
      ? setTimeout(
          () => stop({ message: `Shell action failed (${describeCommand(execution.command, execution.args)}): timed out after ${execution.timeoutMs} ms`, cause: "timeout" }),
          execution.timeoutMs,
        )
      : undefined;
  // Once stopping, wait for the close at most the escalation plus the cleanup wait.
  const ended = await Promise.race([closed, stopped.then(() => within(closed, KILL_ESCALATION_MS + CLEANUP_WAIT_MS))]);
  hooks.signal.removeEventListener("abort", onAbort);
  if (commandTimer) clearTimeout(commandTimer);
  if (ended !== null) {
    await within(Promise.all(pumps), CLEANUP_WAIT_MS);
  }
  if (pid !== undefined) {
    // No member of the group may outlive the action.
    if (signalGroup(pid, "SIGKILL") && ended === null) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    if (killTimer) clearTimeout(killTimer);
    liveGroups.delete(pid);
    await registration;
    await settle(() => hooks.onClose?.(pid));
  } else if (killTimer) {
    clearTimeout(killTimer);
  }
  const code = ended?.code ?? null;
  const signal = ended?.signal ?? null;
  const shellResult = result(code, signal);
  if (ended?.spawnError) {
    return {
      result: shellResult,
      failure: { message: `Shell action failed (${describeCommand(execution.command, execution.args)}): ${ended.spawnError.message}`, cause: "spawn" },
    };
  }
  if (failure) return { result: shellResult, failure };
  if (!execution.allowNonZeroExit && (code !== 0 || signal !== null)) {
    const status = signal !== null ? `signal ${signal}` : `exit ${code}`;
    const stderr = shellResult.stderr;
    return {
      result: shellResult,
      failure: { message: `Shell action failed (${describeCommand(execution.command, execution.args)}): ${status}${stderr ? `\n${stderr}` : ""}`, cause: "exit" },
    };
  }
  return { result: shellResult };
}
