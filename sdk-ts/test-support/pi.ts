/**
 * Test support: real Pi (installed by `scripts/install-pi.sh`) in an isolated
 * sandbox, driven in rpc mode over JSONL or in its TUI through tmux.
 *
 * Invariants:
 * - A sandbox is a fresh temporary directory with its own HOME, Pi agent dir
 *   (`$HOME/.pi/agent`, with models.json and settings.json pointing at the
 *   mock model, retry off) and project dir. Pi runs with PI_OFFLINE=1,
 *   telemetry and the version check off, and no provider API key from the
 *   caller's environment.
 * - Every Pi process runs in its own process group. `stop()` closes stdin,
 *   then sends SIGTERM and SIGKILL to the group when Pi does not exit in
 *   time, and kills what is left of the group after Pi exits; the process's
 *   exit hook SIGKILLs the group of any Pi still running. No Pi outlives its
 *   test.
 * - stdout is split into records on `\n` only (never readline: U+2028 and
 *   U+2029 are valid inside JSON strings). A line that is not JSON is kept as
 *   a protocol error and reported by `stop()`.
 * - Every wait has a deadline and fails with what was seen when it passes, or
 *   at once when Pi exits: a test never continues silently.
 */
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import type {
  AgentSessionEvent,
  RpcCommand,
  RpcExtensionUIRequest,
  RpcResponse,
  RpcSessionState,
} from "@earendil-works/pi-coding-agent";
import { type MockModel, type MockRule, startMockModel } from "./mock-model.js";
import { type PiInstall, piInstall } from "./pi-install.js";
import { Tmux } from "./tmux.js";

export { type PiInstall, piInstall } from "./pi-install.js";
export { processAlive } from "./server.js";

/** Every record Pi writes on stdout in rpc mode. */
export type PiRecord =
  | AgentSessionEvent
  | RpcResponse
  | RpcExtensionUIRequest
  | { type: "extension_error"; extensionPath?: string; event?: string; error?: string };

export type PiAgentSettled = Extract<AgentSessionEvent, { type: "agent_settled" }>;

/** How a Pi process ended. */
export interface PiExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The signal the harness had to send to the group because Pi did not exit on stdin EOF. */
  forced: "SIGTERM" | "SIGKILL" | null;
  /** Processes of Pi's group were still alive after Pi exited (they were killed). */
  leftoverGroup: boolean;
  /** stdout lines that were not JSON. */
  protocolErrors: string[];
}

/** Answers to dialogs (`select`, `confirm`, `input`, `editor`). */
export type UiAnswer = { value: string } | { confirmed: boolean } | { cancelled: true };

export interface PiSandboxOptions {
  /** The mock model's base URL (`MockModel.baseUrl`). */
  baseUrl: string;
  /** Merged over the default settings.json. */
  settings?: Record<string, unknown>;
}

export interface PiProcessOptions {
  /** Extension files or package dirs, each passed as `-e`. */
  extensions?: string[];
  /** More CLI flags (after the defaults), e.g. `--continue` or `--session <file>`. */
  args?: string[];
  /** More environment variables for Pi. */
  env?: Record<string, string>;
  /** Pass `--approve` (trust project-local files); default true. */
  approve?: boolean;
  /** Working directory (default: the sandbox's project dir). */
  cwd?: string;
  /** Also load discovered and configured extensions (`pi install`ed packages): omit `--no-extensions`. */
  discover?: boolean;
  /** A command Pi runs under, e.g. `["strace", "-f", "-o", file]` (rpc mode only). */
  prefix?: string[];
}

export const MOCK_PROVIDER = "mock";
export const MOCK_MODEL_ID = "mock-model";
/** A second model of the mock provider (not the default), for tests that choose a model. */
export const MOCK_ALT_MODEL_ID = "mock-model-alt";

/** The sandbox of one test: HOME, agent dir and project dir under one temporary directory. */
export class PiSandbox {
  readonly root: string;
  readonly home: string;
  readonly agentDir: string;
  readonly projectDir: string;
  readonly install: PiInstall;

  private constructor(options: PiSandboxOptions) {
    this.install = piInstall();
    this.root = mkdtempSync(join(tmpdir(), "pi-e2e-"));
    this.home = join(this.root, "home");
    this.agentDir = join(this.home, ".pi", "agent");
    this.projectDir = join(this.root, "project");
    mkdirSync(this.agentDir, { recursive: true });
    mkdirSync(this.projectDir, { recursive: true });
    const models = {
      providers: {
        [MOCK_PROVIDER]: {
          baseUrl: options.baseUrl,
          api: "openai-completions",
          apiKey: "mock-key",
          compat: { supportsDeveloperRole: false, supportsReasoningEffort: false },
          models: [
            { id: MOCK_MODEL_ID, name: "Mock Model", contextWindow: 32_000, maxTokens: 1024 },
            { id: MOCK_ALT_MODEL_ID, name: "Mock Model Alt", contextWindow: 32_000, maxTokens: 1024 },
          ],
        },
      },
    };
    const settings = {
      defaultProvider: MOCK_PROVIDER,
      defaultModel: MOCK_MODEL_ID,
      quietStartup: true,
      enableInstallTelemetry: false,
      retry: { enabled: false },
      ...options.settings,
    };
    writeFileSync(join(this.agentDir, "models.json"), `${JSON.stringify(models, null, 2)}\n`);
    writeFileSync(join(this.agentDir, "settings.json"), `${JSON.stringify(settings, null, 2)}\n`);
  }

  static create(options: PiSandboxOptions): PiSandbox {
    return new PiSandbox(options);
  }

  /** Pi's environment: the caller's, without provider keys, with the sandbox's HOME and agent dir. */
  env(extra: Record<string, string> = {}): Record<string, string> {
    const env: Record<string, string> = {};
    for (const [key, value] of Object.entries(process.env)) {
      if (value === undefined || key.endsWith("_API_KEY") || key === "TMUX" || key.startsWith("PI_CODING_AGENT")) continue;
      env[key] = value;
    }
    return {
      ...env,
      HOME: this.home,
      PI_CODING_AGENT_DIR: this.agentDir,
      PI_OFFLINE: "1",
      PI_TELEMETRY: "0",
      PI_SKIP_VERSION_CHECK: "1",
      ...extra,
    };
  }

  /** The command line: Node 22, cli.js, the isolating defaults, then the caller's flags. */
  command(options: PiProcessOptions, mode: "rpc" | "tui"): string[] {
    return [
      this.install.node,
      this.install.cli,
      ...(mode === "rpc" ? ["--mode", "rpc"] : []),
      "--provider",
      MOCK_PROVIDER,
      "--model",
      MOCK_MODEL_ID,
      ...(options.discover === true ? [] : ["--no-extensions"]),
      "--no-skills",
      "--no-prompt-templates",
      "--no-context-files",
      "--no-themes",
      "--no-mcp",
      "--offline",
      ...(options.approve === false ? [] : ["--approve"]),
      ...(options.extensions ?? []).flatMap((path) => ["-e", path]),
      ...(options.args ?? []),
    ];
  }

  /**
   * An executable `pi` for this sandbox (`<root>/bin/pi`): it sets the
   * sandbox environment and runs Node 22 + cli.js with the isolating flags
   * (not the mode, model or extensions: the caller adds those), the way a
   * user's `pi` on PATH is run by the runner (`PI_WORKFLOWS_PI`).
   */
  piExecutable(): string {
    const bin = join(this.root, "bin");
    mkdirSync(bin, { recursive: true });
    const path = join(bin, "pi");
    const quote = (value: string): string => `'${value.replace(/'/g, "'\\''")}'`;
    const env = this.env();
    const exports = ["HOME", "PI_CODING_AGENT_DIR", "PI_OFFLINE", "PI_TELEMETRY", "PI_SKIP_VERSION_CHECK"].map((key) => `export ${key}=${quote(env[key] as string)}`);
    const flags = ["--no-skills", "--no-prompt-templates", "--no-context-files", "--no-themes", "--no-mcp", "--offline"];
    writeFileSync(path, ["#!/bin/sh", ...exports, `exec ${quote(this.install.node)} ${quote(this.install.cli)} ${flags.join(" ")} "$@"`, ""].join("\n"), { mode: 0o755 });
    return path;
  }

  /** Starts Pi in rpc mode and waits until it answers `get_state`. */
  async spawnRpc(options: PiProcessOptions = {}, readyTimeoutMs = 30_000): Promise<PiRpc> {
    const [node, ...args] = [...(options.prefix ?? []), ...this.command(options, "rpc")];
    const child = spawn(node as string, args, {
      cwd: options.cwd ?? this.projectDir,
      env: this.env(options.env),
      stdio: ["pipe", "pipe", "pipe"],
      detached: true,
    });
    const pi = new PiRpc(child);
    try {
      pi.state = await pi.getState(readyTimeoutMs);
    } catch (error) {
      await pi.stop();
      throw error;
    }
    return pi;
  }

  /** Starts Pi's TUI in a private tmux server and waits until the footer shows the mock model. */
  async startTui(options: PiProcessOptions = {}, size: { cols?: number; rows?: number } = {}): Promise<PiTui> {
    const stderrPath = join(this.root, `pi-tui-${Date.now()}.stderr`);
    const tmux = await Tmux.start({
      command: this.command(options, "tui"),
      cwd: options.cwd ?? this.projectDir,
      env: this.env(options.env),
      dir: this.root,
      stderrPath,
      ...size,
    });
    const tui = new PiTui(tmux, stderrPath);
    try {
      await tmux.waitForScreen(new RegExp(MOCK_MODEL_ID), 30_000);
    } catch (error) {
      await tui.stop();
      throw new Error(`${(error as Error).message}\nPi stderr: ${tui.stderr().slice(-2000)}`);
    }
    return tui;
  }

  /** Removes the sandbox (kept when PI_E2E_KEEP=1, for debugging). */
  cleanup(): void {
    if (process.env.PI_E2E_KEEP === "1") {
      process.stderr.write(`PI_E2E_KEEP: sandbox kept at ${this.root}\n`);
      return;
    }
    rmSync(this.root, { recursive: true, force: true });
  }
}

/** Pi groups still running; killed when the test process exits. */
const liveGroups = new Set<number>();
process.on("exit", () => {
  for (const pgid of liveGroups) killGroup(pgid, "SIGKILL");
});

function killGroup(pgid: number, signal: NodeJS.Signals): boolean {
  try {
    process.kill(-pgid, signal);
    return true;
  } catch {
    return false;
  }
}

/** Whether any process of the group is alive. */

export function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

interface Waiter {
  predicate: (record: PiRecord) => boolean;
  since: number;
  resolve: (record: PiRecord) => void;
  reject: (error: Error) => void;
}

export interface WaitOptions {
  timeoutMs?: number;
  /** Only records at or after this index (`mark()`) count; default 0. */
  since?: number;
  /** What is waited for, for the error message. */
  what?: string;
}

/** One Pi process in rpc mode. */
export class PiRpc {
  readonly pid: number;
  /** Every stdout record, in order. */
  readonly records: PiRecord[] = [];
  readonly protocolErrors: string[] = [];
  /** The `get_state` answer at startup. */
  state: RpcSessionState | undefined;
  /** Resolves when the process exits (code, signal). */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  private stderrText = "";
  private exitInfo: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  private readonly waiters = new Set<Waiter>();
  private counter = 0;
  private promptMark = 0;
  private stopping: Promise<PiExit> | undefined;

  constructor(private readonly child: ChildProcessWithoutNullStreams) {
    if (child.pid === undefined) throw new Error("Pi did not start (no pid)");
    this.pid = child.pid;
    liveGroups.add(this.pid);
    let pending: Buffer = Buffer.alloc(0);
    child.stdout.on("data", (chunk: Buffer) => {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      for (let at = pending.indexOf(0x0a); at >= 0; at = pending.indexOf(0x0a)) {
        const line = pending.subarray(0, at).toString("utf8");
        pending = pending.subarray(at + 1);
        this.onLine(line.endsWith("\r") ? line.slice(0, -1) : line);
      }
    });
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk: string) => {
      this.stderrText = (this.stderrText + chunk).slice(-100_000);
    });
    child.stdin.on("error", () => {
      // Pi exited with commands unsent; the exit is reported to every waiter.
    });
    this.exited = new Promise((resolvePromise) => {
      child.on("exit", (code, signal) => {
        this.exitInfo = { code, signal };
        for (const waiter of this.waiters) waiter.reject(new Error(`Pi exited (code ${code}, signal ${signal}) ${this.context()}`));
        this.waiters.clear();
        resolvePromise(this.exitInfo);
      });
    });
  }

  private onLine(line: string): void {
    if (line.trim() === "") return;
    let record: PiRecord;
    try {
      record = JSON.parse(line) as PiRecord;
    } catch {
      this.protocolErrors.push(line);
      return;
    }
    this.records.push(record);
    const index = this.records.length - 1;
    for (const waiter of [...this.waiters]) {
      if (index >= waiter.since && waiter.predicate(record)) {
        this.waiters.delete(waiter);
        waiter.resolve(record);
      }
    }
  }

  /** Pi's stderr so far (last 100 kB). */
  stderr(): string {
    return this.stderrText;
  }

  /** The index the next record will have: pass it as `since` to wait only for newer records. */
  mark(): number {
    return this.records.length;
  }

  private context(): string {
    const types = this.records.slice(-15).map((r) => (r.type === "extension_ui_request" ? `ui:${r.method}` : r.type));
    const stderr = this.stderrText.trim().slice(-1500);
    return `[last records: ${types.join(", ") || "none"}]${stderr ? ` [stderr: ${stderr}]` : ""}`;
  }

  /** Resolves the first record at or after `since` that satisfies `predicate`; rejects on timeout or exit. */
  waitFor<T extends PiRecord>(predicate: (record: PiRecord) => record is T, options?: WaitOptions): Promise<T>;
  waitFor(predicate: (record: PiRecord) => boolean, options?: WaitOptions): Promise<PiRecord>;
  waitFor(predicate: (record: PiRecord) => boolean, options: WaitOptions = {}): Promise<PiRecord> {
    const { timeoutMs = 15_000, since = 0, what = "a matching record" } = options;
    const hit = this.records.slice(since).find(predicate);
    if (hit !== undefined) return Promise.resolve(hit);
    if (this.exitInfo !== undefined) {
      return Promise.reject(new Error(`waiting for ${what}: Pi already exited (code ${this.exitInfo.code}) ${this.context()}`));
    }
    return new Promise((resolvePromise, reject) => {
      const timer = setTimeout(() => {
        this.waiters.delete(waiter);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what} ${this.context()}`));
      }, timeoutMs);
      const waiter: Waiter = {
        predicate,
        since,
        resolve: (record) => {
          clearTimeout(timer);
          resolvePromise(record);
        },
        reject: (error) => {
          clearTimeout(timer);
          reject(error);
        },
      };
      this.waiters.add(waiter);
    });
  }

  /** Writes one command (an `id` is added when missing); returns the id. */
  send(command: RpcCommand | Record<string, unknown>): string {
    const id = typeof command.id === "string" ? command.id : `t${++this.counter}`;
    this.child.stdin.write(`${JSON.stringify({ ...command, id })}\n`);
    return id;
  }

  /** Sends a command and resolves its response (successful or not). */
  async request(command: RpcCommand | Record<string, unknown>, timeoutMs = 15_000): Promise<RpcResponse> {
    const since = this.mark();
    const id = this.send(command);
    return this.waitFor((r): r is RpcResponse => r.type === "response" && r.id === id, {
      timeoutMs,
      since,
      what: `the response to ${String(command.type)}`,
    });
  }

  /** Sends a command and resolves its `data`; throws when Pi answers `success: false`. */
  async command(command: RpcCommand | Record<string, unknown>, timeoutMs = 15_000): Promise<unknown> {
    const response = await this.request(command, timeoutMs);
    if (!response.success) throw new Error(`Pi refused ${String(command.type)}: ${response.error}`);
    return (response as { data?: unknown }).data;
  }

  /**
   * Sends a prompt; resolves its disposition (`started`, `queued`, `handled`).
   * `waitSettled()` then waits for the `agent_settled` that follows it.
   */
  async prompt(message: string, options: { streamingBehavior?: "steer" | "followUp" } = {}): Promise<string> {
    this.promptMark = this.mark();
    const data = (await this.command({ type: "prompt", message, ...options })) as { disposition?: string } | undefined;
    return String(data?.disposition);
  }

  /** Waits for the next `agent_settled` after the last `prompt()` (or after `since`). */
  waitSettled(options: WaitOptions = {}): Promise<PiAgentSettled> {
    return this.waitFor((r): r is PiAgentSettled => r.type === "agent_settled", {
      timeoutMs: 20_000,
      since: this.promptMark,
      what: "agent_settled",
      ...options,
    });
  }

  /** What Escape does: `clear_queue`, then `abort` (answered once the session is idle); resolves the cleared queue. */
  async abort(): Promise<{ steering: string[]; followUp: string[] }> {
    const cleared = (await this.command({ type: "clear_queue" })) as { steering: string[]; followUp: string[] };
    await this.command({ type: "abort" }, 20_000);
    return cleared;
  }

  /** The extension UI requests so far (of one method, when given). */
  uiRequests<M extends RpcExtensionUIRequest["method"]>(method?: M, since = 0): Extract<RpcExtensionUIRequest, { method: M }>[] {
    return this.records
      .slice(since)
      .filter((r): r is Extract<RpcExtensionUIRequest, { method: M }> => r.type === "extension_ui_request" && (method === undefined || r.method === method));
  }

  /** Waits for an extension UI request of `method` at or after `since`. */
  waitForUi<M extends RpcExtensionUIRequest["method"]>(method: M, options: WaitOptions = {}): Promise<Extract<RpcExtensionUIRequest, { method: M }>> {
    return this.waitFor(
      (r): r is Extract<RpcExtensionUIRequest, { method: M }> => r.type === "extension_ui_request" && r.method === method,
      { what: `extension_ui_request ${method}`, ...options },
    );
  }

  /** Answers a dialog request. */
  answerUi(id: string, answer: UiAnswer): void {
    this.child.stdin.write(`${JSON.stringify({ type: "extension_ui_response", id, ...answer })}\n`);
  }

  async getState(timeoutMs = 15_000): Promise<RpcSessionState> {
    return (await this.command({ type: "get_state" }, timeoutMs)) as RpcSessionState;
  }

  /** Session entries in append order (only those after entry `since`, when given). */
  async getEntries(since?: string): Promise<{ entries: Record<string, unknown>[]; leafId: string | null }> {
    return (await this.command({ type: "get_entries", ...(since !== undefined ? { since } : {}) })) as {
      entries: Record<string, unknown>[];
      leafId: string | null;
    };
  }

  /** Stops Pi: stdin EOF, then SIGTERM and SIGKILL to its group after `timeoutMs` each. Idempotent. */
  stop(timeoutMs = 10_000): Promise<PiExit> {
    this.stopping ??= this.stopOnce(timeoutMs);
    return this.stopping;
  }

  private async stopOnce(timeoutMs: number): Promise<PiExit> {
    const within = (ms: number) =>
      Promise.race([this.exited.then(() => true), new Promise<false>((r) => setTimeout(() => r(false), ms).unref())]);
    let forced: PiExit["forced"] = null;
    if (this.exitInfo === undefined) {
      this.child.stdin.end();
      if (!(await within(timeoutMs))) {
        forced = "SIGTERM";
        killGroup(this.pid, "SIGTERM");
        if (!(await within(3_000))) {
          forced = "SIGKILL";
          killGroup(this.pid, "SIGKILL");
          await this.exited;
        }
      }
    }
    const exit = await this.exited;
    const leftoverGroup = groupAlive(this.pid);
    if (leftoverGroup) killGroup(this.pid, "SIGKILL");
    liveGroups.delete(this.pid);
    return { ...exit, forced, leftoverGroup, protocolErrors: [...this.protocolErrors] };
  }
}

/** Pi's TUI in a tmux pane. */
export class PiTui {
  constructor(
    readonly tmux: Tmux,
    private readonly stderrPath: string,
  ) {}

  /** What Pi wrote on stderr (redirected to a file so it does not draw over the screen). */
  stderr(): string {
    return existsSync(this.stderrPath) ? readFileSync(this.stderrPath, "utf8") : "";
  }

  /**
   * Quits with Ctrl+D (the editor must be empty; sent again every 2 s until
   * Pi exits), then kills the tmux server;
   * resolves Pi's exit status or signal, `forced` when Pi did not exit in time.
   */
  stop(timeoutMs = 10_000): Promise<{ status: number | null; signal: number | null; forced: boolean }> {
    this.stopping ??= this.stopOnce(timeoutMs);
    return this.stopping;
  }

  private stopping: Promise<{ status: number | null; signal: number | null; forced: boolean }> | undefined;

  private async stopOnce(timeoutMs: number): Promise<{ status: number | null; signal: number | null; forced: boolean }> {
    let exit: { status: number | null; signal: number | null } = { status: null, signal: null };
    let forced = false;
    // A Ctrl+D that arrives while Pi is still redrawing (a loaded machine,
    // right after an abort) can be missed: send it again every 2 s until
    // Pi exits or the deadline passes.
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (!this.tmux.paneDead()) this.tmux.sendKeys("C-d");
      try {
        exit = await this.tmux.waitForExit(Math.max(0, Math.min(2_000, deadline - Date.now())));
        break;
      } catch {
        if (Date.now() >= deadline) {
          forced = true;
          break;
        }
      }
    }
    this.tmux.kill();
    return { ...exit, forced };
  }
}

/** What one real-Pi test gets from `piFixture`. */
export interface PiFixture {
  mock: MockModel;
  sandbox: PiSandbox;
  /** `sandbox.spawnRpc`, stopped (and checked) when the test ends. */
  spawnRpc(options?: PiProcessOptions): Promise<PiRpc>;
  /** `sandbox.startTui`, stopped when the test ends. */
  startTui(options?: PiProcessOptions, size?: { cols?: number; rows?: number }): Promise<PiTui>;
}

/**
 * A mock model with `rules` and a sandbox pointing at it, torn down when the
 * test `t` ends: every Pi started through the fixture is stopped first, and
 * the test fails when one left processes in its group or wrote non-JSON on
 * stdout; then the mock closes and the sandbox is removed.
 */
export async function piFixture(t: TestContext, options: { rules?: MockRule[]; settings?: Record<string, unknown> } = {}): Promise<PiFixture> {
  const mock = await startMockModel({ rules: options.rules ?? [] });
  let sandbox: PiSandbox;
  try {
    sandbox = PiSandbox.create({ baseUrl: mock.baseUrl, ...(options.settings ? { settings: options.settings } : {}) });
  } catch (error) {
    await mock.close();
    throw error;
  }
  const rpcs: PiRpc[] = [];
  const tuis: PiTui[] = [];
  t.after(async () => {
    const problems: string[] = [];
    try {
      for (const pi of rpcs) {
        const exit = await pi.stop();
        if (exit.leftoverGroup) problems.push(`Pi ${pi.pid} left processes in its group (killed)`);
        if (exit.protocolErrors.length > 0) problems.push(`Pi ${pi.pid} wrote non-JSON on stdout: ${exit.protocolErrors.slice(0, 3).join(" | ")}`);
      }
      for (const tui of tuis) await tui.stop();
    } finally {
      await mock.close();
      sandbox.cleanup();
    }
    if (problems.length > 0) throw new Error(problems.join("; "));
  });
  return {
    mock,
    sandbox,
    async spawnRpc(processOptions = {}) {
      const pi = await sandbox.spawnRpc(processOptions);
      rpcs.push(pi);
      return pi;
    },
    async startTui(processOptions = {}, size = {}) {
      const tui = await sandbox.startTui(processOptions, size);
      tuis.push(tui);
      return tui;
    },
  };
}
