/**
 * Plays the server end of the controller.v1 channel against the real
 * controller child (`node build/src/controllers/bin.js`): writes the launch,
 * decodes and schema-checks every line the child writes, and answers each
 * with the reply a test's handler returns.
 */
import { type ChildProcessWithoutNullStreams, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { ControllerChildMessage, ControllerLaunch, ControllerReconcileLaunch, ControllerResource, ControllerServerMessage } from "../src/generated/types.js";
import { FrameDecoder } from "../src/protocol/framing.js";
import { decodeControllerChildFrame, encodeControllerLaunch, encodeControllerServer } from "../src/protocol/messages.js";
import { SDK_DIR } from "./server.js";

/** The controller child the tests run (the test build of `bin.ts`). */
export const CONTROLLER_BIN = join(SDK_DIR, "build", "src", "controllers", "bin.js");

/** A reply without its kind and requestId (the harness adds them). */
export type ReplyFields = Omit<ControllerServerMessage, "kind" | "requestId">;

/** What a test's server end answers to one child message; `null` writes nothing (the test closes or kills the child). */
export type Handler = (message: ControllerChildMessage) => ReplyFields | string | null | Promise<ReplyFields>;

/** How one child process ended, and everything it said. */
export interface ChildTranscript {
  messages: ControllerChildMessage[];
  code: number | null;
  signal: NodeJS.Signals | null;
  stderr: string;
  /** Milliseconds from spawn to exit. */
  elapsedMs: number;
}

/** `sha256:<hex>` of a file's bytes. */
export function fileDigest(path: string): string {
  return `sha256:${createHash("sha256").update(readFileSync(path)).digest("hex")}`;
}

/** Runs the child with `launch` (an object, or raw bytes for malformed-launch tests) and answers its messages with `handler`. */
export function runChild(launch: ControllerLaunch | string, handler: Handler, env: NodeJS.ProcessEnv): Promise<ChildTranscript> {
  const started = Date.now();
  const child: ChildProcessWithoutNullStreams = spawn(process.execPath, [CONTROLLER_BIN], { stdio: ["pipe", "pipe", "pipe"], env });
  const messages: ControllerChildMessage[] = [];
  let stderr = "";
  const decoder = new FrameDecoder();
  let protocolError: Error | null = null;
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk: string) => (stderr += chunk));
  child.stdin.on("error", () => undefined);
  child.stdout.on("data", (chunk: Buffer) => {
    decoder.push(chunk);
    for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
      let message: ControllerChildMessage;
      try {
        message = decodeControllerChildFrame(frame);
      } catch (error) {
        protocolError = new Error(`the child wrote a line that is not a controller.v1 message: ${new TextDecoder().decode(frame)} (${String(error)})`);
        child.kill("SIGKILL");
        return;
      }
      if (message.requestId !== messages.length + 1) protocolError ??= new Error(`requestId ${message.requestId} out of sequence`);
      messages.push(message);
      const answer = handler(message);
      if (answer === null) continue;
      if (answer instanceof Promise) {
        const requestId = message.requestId;
        void answer.then((fields) => child.stdin.write(encodeControllerServer({ kind: "reply", requestId, ...fields })));
      } else if (typeof answer === "string") child.stdin.write(answer);
      else child.stdin.write(encodeControllerServer({ kind: "reply", requestId: message.requestId, ...answer }));
    }
  });
  child.stdin.write(typeof launch === "string" ? launch : encodeControllerLaunch(launch));
  return new Promise((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code, signal) => {
      if (protocolError !== null) reject(protocolError);
      else resolve({ messages, code, signal, stderr, elapsedMs: Date.now() - started });
    });
  });
}

/** A resource as the server would launch a reconcile with, with `spec`. */
export function resourceWith(controller: string, spec: unknown, overrides: Partial<ControllerResource> = {}): ControllerResource {
  return {
    metadata: { uid: "res-1", controller, key: "key-1", resourceVersion: 3, generation: 2, finalizers: [] },
    spec: spec as ControllerResource["spec"],
    status: {
      observedGeneration: 1,
      conditions: [{ type: "Ready", status: "unknown", reason: "New", observedGeneration: 1, lastTransitionTime: 1_700_000_000_000 }],
      controllerStatus: { phase: "new" },
      workflowRun: null,
    },
    ...overrides,
  };
}

/** A reconcile launch of `controllerPath`. */
export function reconcileLaunch(controller: string, controllerPath: string, projectPath: string, resource: ControllerResource, options: { timeoutMs?: number; sourceDigest?: string } = {}): ControllerReconcileLaunch {
  return {
    kind: "controller.reconcile",
    controller,
    controllerPath,
    projectPath,
    resource,
    claimGeneration: 7,
    sourceDigest: options.sourceDigest ?? fileDigest(controllerPath),
    timeoutMs: options.timeoutMs ?? 10_000,
  };
}

/** The accepted reply to finished or failed. */
export const committed: ReplyFields = { outcome: "accepted", finishOutcome: "committed" };
