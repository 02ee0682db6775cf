/**
 * Starting the server on demand: runs `<bin> server start` once. That
 * command starts the server in the background (its own process group) and
 * exits after the server's ready line, or with one error line on stderr.
 *
 * Invariant (privacy): only the CLI's own one-line message (`pi-workflows:
 * …`, static text chosen by the server) is kept; spawn errors, which name
 * the binary path, are reduced to static text.
 */
import { spawn } from "node:child_process";

import { MAX_ERROR_MESSAGE } from "./errors.js";

/** How `server start` ended. */
export interface StartResult {
  /** Exit code 0: the server is ready (or already was). */
  ok: boolean;
  /** The binary could not be executed at all. */
  spawnFailed: boolean;
  /** Another server holds the state directory (it may still be starting). */
  alreadyRunning: boolean;
  /** The CLI's one-line error message, if any. */
  message?: string;
}

const STDERR_LIMIT = 4096;

/** A running `server start`. */
export interface StartingServer {
  readonly done: Promise<StartResult>;
  /** Stops the child from keeping the process alive (used when the caller gives up). */
  unref(): void;
}

/** Runs `<bin> server start` with `env`. Never throws. */
export function startServer(bin: string, env: NodeJS.ProcessEnv): StartingServer {
  let child: ReturnType<typeof spawn>;
  try {
    child = spawn(bin, ["server", "start"], { env, stdio: ["ignore", "ignore", "pipe"] });
  } catch {
    return { done: Promise.resolve({ ok: false, spawnFailed: true, alreadyRunning: false }), unref: () => undefined };
  }
  let stderr = "";
  child.stderr?.setEncoding("utf8");
  child.stderr?.on("data", (text: string) => {
    if (stderr.length < STDERR_LIMIT) stderr += text.slice(0, STDERR_LIMIT - stderr.length);
  });
  const done = new Promise<StartResult>((resolve) => {
    let spawnFailed = false;
    child.on("error", () => {
      // The binary could not be executed (its path is never reported).
      spawnFailed = true;
      resolve({ ok: false, spawnFailed: true, alreadyRunning: false });
    });
    child.on("close", (code) => {
      if (spawnFailed) return;
      const message = cliMessage(stderr);
      const result: StartResult = {
        ok: code === 0,
        spawnFailed: false,
        alreadyRunning: message !== undefined && message.includes("already running"),
      };
      if (message !== undefined) result.message = message;
      resolve(result);
    });
  });
  return {
    done,
    unref: () => {
      child.unref();
      child.stderr?.destroy();
    },
  };
}

/** The last `pi-workflows: …` line of the CLI's stderr, without the prefix, bounded. */
export function cliMessage(stderr: string): string | undefined {
  const prefix = "pi-workflows: ";
  const lines = stderr.split("\n").filter((line) => line.startsWith(prefix));
  const last = lines[lines.length - 1];
  if (last === undefined) return undefined;
  return Array.from(last.slice(prefix.length).trim()).slice(0, MAX_ERROR_MESSAGE - 100).join("");
}
