/**
 * Test support: a real `pi-workflows` server per test file (temporary
 * PI_WORKFLOWS_HOME and HOME, short timings, the node runner built from this
 * package), and a minimal client.v1 connection over its socket built on the
 * SDK's protocol module. Not a WorkflowClient: just enough to start runs,
 * send commands and read run views.
 */
import { execFile, spawn, spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { createConnection, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { ClientMessage, RunView } from "../src/generated/types.js";
import { FrameDecoder } from "../src/protocol/framing.js";
import { decodeClientFrame, encodeClient } from "../src/protocol/messages.js";

/** `sdk-ts/` (this file is compiled to `sdk-ts/build/test-support/`). */
export const SDK_DIR = resolve(fileURLToPath(new URL("../..", import.meta.url)));
/** The repository root. */
export const REPO_DIR = resolve(SDK_DIR, "..");
/** The node runner under test (the freshly compiled sources). */
export const RUNNER_BIN = join(SDK_DIR, "build", "src", "runner", "bin.js");
/** The example workflows. */
export const EXAMPLES_DIR = join(REPO_DIR, "examples", "workflows");

/** The server binary: PI_WORKFLOWS_BIN or `target/debug/pi-workflows`. */
export function serverBinary(): string {
  const bin = process.env.PI_WORKFLOWS_BIN ?? join(REPO_DIR, "target", "debug", "pi-workflows");
  if (!existsSync(bin)) {
    throw new Error(`the server binary ${bin} does not exist: run \`cargo build -p server\` or set PI_WORKFLOWS_BIN`);
  }
  return bin;
}

/** Whether process `pid` exists and is not a zombie (a zombie ended and waits to be reaped). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    return !/^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

/** The scripted Rust runner next to the server binary. */
export function scriptedRunnerBinary(): string {
  return join(resolve(serverBinary(), ".."), "pi-workflows-scripted-runner");
}

export interface ServerOptions {
  /** The runner command (default: `node <build>/src/runner/bin.js`). */
  runner?: string;
  env?: Record<string, string>;
  /** The `pi-workflows` binary (default: `serverBinary()`), e.g. another version's for a benchmark's baseline. */
  bin?: string;
}

/** One server with its own state directory. */
export class TestServer {
  readonly root: string;
  readonly home: string;
  readonly userHome: string;
  readonly env: Record<string, string>;
  private readonly bin: string;

  private constructor(options: ServerOptions) {
    this.bin = options.bin ?? serverBinary();
    this.root = mkdtempSync(join(tmpdir(), "piw-e2e-"));
    this.home = join(this.root, "state");
    this.userHome = join(this.root, "home");
    this.env = {
      ...(process.env as Record<string, string>),
      HOME: this.userHome,
      PI_WORKFLOWS_HOME: this.home,
      PI_WORKFLOWS_CLAIM_TTL_MS: "3000",
      // 3 s like the Rust harness: the 100-run shell test loads a shared machine hard.
      PI_WORKFLOWS_SERVER_LEASE_MS: "3000",
      PI_WORKFLOWS_STOP_GRACE_MS: "1000",
      PI_WORKFLOWS_IDLE_EXIT_MS: "600000",
      PI_WORKFLOWS_RUNNER: options.runner ?? `${process.execPath} ${RUNNER_BIN}`,
      PI_WORKFLOWS_RUNNER_JOURNAL: join(this.root, "journal.ndjson"),
      ...options.env,
    };
  }

  /** Starts a server (`pi-workflows server start`) and waits until it is ready. */
  static async start(options: ServerOptions = {}): Promise<TestServer> {
    const server = new TestServer(options);
    const out = await server.cli(["server", "start"]);
    if (!/pi-workflows server started \(epoch \d+\)/.test(out)) {
      throw new Error(`the server did not start: ${out}\n${server.serverLog()}`);
    }
    return server;
  }

  /**
   * Runs the server attached (`pi-workflows server run`) under `wrapper`
   * (e.g. `strace -f -o <file>`), and resolves once it answers. `exited`
   * resolves when the wrapper ends (after `stop()`).
   */
  static async runWrapped(wrapper: string[], options: ServerOptions = {}): Promise<{ server: TestServer; exited: Promise<number | null> }> {
    const server = new TestServer(options);
    const [command = server.bin, ...args] = [...wrapper, server.bin, "server", "run"];
    const child = spawn(command, args, { env: server.env, stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr?.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number | null>((resolveExit) => child.on("exit", (code) => resolveExit(code)));
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (existsSync(server.socketPath) && (await server.cli(["server", "status"]).then(() => true, () => false))) break;
      if (child.exitCode !== null || Date.now() > deadline) throw new Error(`the wrapped server did not start: ${stderr}\n${server.serverLog()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    return { server, exited };
  }

  /** Runs the CLI with this server's environment (in `cwd`, default this process's); resolves its stdout and stderr. */
  cli(args: string[], cwd?: string): Promise<string> {
    return new Promise((resolvePromise, reject) => {
      execFile(this.bin, args, { env: this.env, timeout: 60_000, ...(cwd ? { cwd } : {}) }, (error, stdout, stderr) => {
        if (error) reject(new Error(`pi-workflows ${args.join(" ")}: ${error.message}\n${stdout}${stderr}`));
        else resolvePromise(stdout + stderr);
      });
    });
  }

  get socketPath(): string {
    return join(this.home, "host", "server.sock");
  }

  /** A new project directory with `.pi/workflows/`. */
  project(name = "project"): string {
    const dir = join(this.root, name);
    spawnSync("mkdir", ["-p", join(dir, ".pi", "workflows")]);
    return dir;
  }

  /** The server log and every runner log (for failure messages). */
  serverLog(): string {
    const parts: string[] = [];
    const host = join(this.home, "host");
    try {
      parts.push(readFileSync(join(host, "server.log"), "utf8"));
      for (const file of readdirSync(join(host, "logs"))) {
        parts.push(`--- ${file}\n${readFileSync(join(host, "logs", file), "utf8")}`);
      }
    } catch {
      // nothing logged yet
    }
    return parts.join("\n").slice(-20_000);
  }

  /** The runner journal records of `runId` (PI_WORKFLOWS_RUNNER_JOURNAL). */
  journal(runId?: string): Record<string, unknown>[] {
    const path = this.env.PI_WORKFLOWS_RUNNER_JOURNAL as string;
    if (!existsSync(path)) return [];
    // Only newline-terminated lines are complete records: a runner may be
    // appending the last one while it is read.
    const lines = readFileSync(path, "utf8").split("\n");
    lines.pop();
    return lines
      .filter((line) => line !== "")
      .map((line) => JSON.parse(line) as Record<string, unknown>)
      .filter((record) => runId === undefined || record.runId === runId);
  }

  /**
   * The journal records of `runId` once its runner journaled its exit: the
   * runner journals a node after the server's reply, which can land just
   * after a client saw the run settle.
   */
  async journalAfterExit(runId: string, timeoutMs = 20_000): Promise<Record<string, unknown>[]> {
    const deadline = Date.now() + timeoutMs;
    let records = this.journal(runId);
    while (!records.some((record) => record.event === "exit")) {
      if (Date.now() > deadline) throw new Error(`the runner of ${runId} journaled no exit within ${timeoutMs} ms: ${JSON.stringify(records)}`);
      await new Promise((r) => setTimeout(r, 50));
      records = this.journal(runId);
    }
    return records;
  }

  /** Stops the server and removes its directory. */
  async stop(): Promise<void> {
    try {
      await this.cli(["server", "stop"]);
    } finally {
      rmSync(this.root, { recursive: true, force: true });
    }
  }

  async connect(): Promise<TestClient> {
    return TestClient.connect(this.socketPath);
  }
}

/** A response frame. */
export type Response = Extract<ClientMessage, { type: "response" }>;

/** A minimal client.v1 connection. */
export class TestClient {
  readonly clientId = `test-${randomUUID().slice(0, 8)}`;
  private readonly waiting = new Map<string, (response: Response) => void>();
  private counter = 0;

  private constructor(private readonly socket: Socket) {}

  static async connect(path: string): Promise<TestClient> {
    const socket = createConnection(path);
    await new Promise<void>((resolvePromise, reject) => {
      socket.once("connect", resolvePromise);
      socket.once("error", reject);
    });
    const client = new TestClient(socket);
    const decoder = new FrameDecoder();
    let greeted: (() => void) | undefined;
    const hello = new Promise<void>((resolvePromise) => {
      greeted = resolvePromise;
    });
    socket.on("data", (chunk: Buffer) => {
      decoder.push(chunk);
      for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
        const message = decodeClientFrame(frame);
        if (message.type === "hello") greeted?.();
        if (message.type === "response") client.waiting.get(message.requestId)?.(message);
      }
    });
    socket.write(
      encodeClient({
        schema: "pi-workflows.client.v1",
        type: "hello",
        role: "client",
        protocolVersion: 1,
        packageVersion: "0.1.0",
        clientId: client.clientId,
      }),
    );
    await hello;
    return client;
  }

  /** Sends one request and waits for its response. */
  request(operation: string, payload: unknown, options: { runId?: string; idempotencyKey?: string } = {}): Promise<Response> {
    this.counter += 1;
    const requestId = `r${this.counter}-${randomUUID().slice(0, 8)}`;
    const message = {
      schema: "pi-workflows.client.v1",
      type: "request",
      requestId,
      clientId: this.clientId,
      operation,
      payload,
      ...(options.runId ? { runId: options.runId } : {}),
      ...(options.idempotencyKey ? { idempotencyKey: options.idempotencyKey } : {}),
    } as unknown as ClientMessage;
    const response = new Promise<Response>((resolvePromise, reject) => {
      const timer = setTimeout(() => reject(new Error(`no response to ${operation} in 60 s`)), 60_000);
      this.waiting.set(requestId, (r) => {
        clearTimeout(timer);
        this.waiting.delete(requestId);
        resolvePromise(r);
      });
    });
    this.socket.write(encodeClient(message));
    return response;
  }

  /** A state-changing command with a fresh idempotency key. */
  command(operation: string, payload: unknown, runId?: string): Promise<Response> {
    return this.request(operation, payload, { ...(runId ? { runId } : {}), idempotencyKey: `k-${randomUUID()}` });
  }

  /** `run.start` of a headless run; resolves the run id or throws with the server's error. */
  async start(projectPath: string, workflow: string, input: unknown = {}): Promise<string> {
    const response = await this.command("run.start", { workflow, input, executionMode: "headless", projectPath });
    if (response.outcome !== "accepted") {
      throw new Error(`run.start ${workflow}: ${response.outcome} ${JSON.stringify(response.error ?? null)}`);
    }
    return (response.receipt as { runId: string }).runId;
  }

  async view(runId: string): Promise<RunView> {
    const response = await this.request("run.view", {}, { runId });
    if (response.outcome !== "accepted" || response.receipt === undefined) {
      throw new Error(`run.view ${runId}: ${response.outcome} ${JSON.stringify(response.error ?? null)}`);
    }
    return response.receipt as unknown as RunView;
  }

  /** Polls `run.view` until `done(view)` holds (or throws after `timeoutMs`). */
  async waitFor(runId: string, done: (view: RunView) => boolean, timeoutMs = 30_000, describe = ""): Promise<RunView> {
    const deadline = Date.now() + timeoutMs;
    let view = await this.view(runId);
    while (!done(view)) {
      if (Date.now() > deadline) {
        throw new Error(`run ${runId} did not reach the expected state${describe ? ` (${describe})` : ""}; last view: ${JSON.stringify(view.status)} ${JSON.stringify(view.display)} ${JSON.stringify(view.failure ?? null)}`);
      }
      await new Promise((r) => setTimeout(r, 50));
      view = await this.view(runId);
    }
    return view;
  }

  /** Waits until the run's status is terminal (or `waiting`). */
  settled(runId: string, timeoutMs = 30_000): Promise<RunView> {
    return this.waitFor(runId, (view) => !["queued", "running"].includes(view.status.run), timeoutMs, "terminal");
  }

  close(): void {
    this.socket.end();
    this.socket.destroy();
  }
}

/** The node ids of a view's steps, in order. */
export function stepNodes(view: RunView): string[] {
  return view.steps.items.map((step) => step.nodeId);
}
