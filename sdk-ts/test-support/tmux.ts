/**
 * Test support: one program in a pane of a private tmux server, for tests of
 * what a person sees in a terminal.
 *
 * Invariants:
 * - The server has its own socket file (`-S`, never the user's default
 *   server) and its own config: `extended-keys on` (so modified keys such as
 *   ctrl+shift+r reach the program), `remain-on-exit on` (so the last screen
 *   and the exit status can be read after the program ends).
 * - The pane runs the program itself (`exec`), so the pane's exit status is
 *   the program's and the pane's process group is the program's.
 * - `waitForScreen` fails with the last screen when its deadline passes.
 * - `kill()` kills the server and then SIGKILLs whatever is left of the
 *   pane's process group; the process's exit hook kills every server still
 *   running.
 */
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const CONFIG = [
  "set -g extended-keys on",
  'set -g default-terminal "tmux-256color"',
  "set -g history-limit 5000",
  "set -g remain-on-exit on",
  "set -g status off",
  "",
].join("\n");

export interface TmuxStartOptions {
  /** The program and its arguments. */
  command: string[];
  cwd: string;
  /** The program's whole environment. */
  env: Record<string, string>;
  /** A directory for the socket and config (the test's sandbox). */
  dir: string;
  /** Redirect the program's stderr to this file. */
  stderrPath?: string;
  cols?: number;
  rows?: number;
}

/** tmux servers still running; killed when the test process exits. */
const liveServers = new Set<string>();
process.on("exit", () => {
  for (const socket of liveServers) spawnSync("tmux", ["-S", socket, "kill-server"], { stdio: "ignore" });
});

const quote = (arg: string): string => `'${arg.replaceAll("'", `'\\''`)}'`;

export class Tmux {
  private paneGroup: number | undefined;

  private constructor(
    readonly socket: string,
    private readonly config: string,
    private readonly statusFile: string,
  ) {}

  /** Starts the server with one session, `main`, running `command`. */
  static async start(options: TmuxStartOptions): Promise<Tmux> {
    if (spawnSync("tmux", ["-V"], { stdio: "ignore" }).status !== 0) {
      throw new Error("tmux not found: run scripts/install-pi.sh as root, or install tmux (Debian: apt-get install tmux)");
    }
    const socket = join(options.dir, "tmux.sock");
    const config = join(options.dir, "tmux.conf");
    writeFileSync(config, CONFIG);
    const tmux = new Tmux(socket, config, join(options.dir, "exit-status"));
    // The shell records the program's exit status in a file: tmux 3.3 does
    // not always have `pane_dead_status` once the pane is dead.
    const statusFile = join(options.dir, "exit-status");
    const shell = `${options.command.map(quote).join(" ")}${options.stderrPath ? ` 2>${quote(options.stderrPath)}` : ""}; echo $? >${quote(statusFile)}`;
    liveServers.add(socket);
    // The server's global environment is the one of the client that starts it: the program's.
    tmux.run(["new-session", "-d", "-s", "main", "-x", String(options.cols ?? 120), "-y", String(options.rows ?? 40), "-c", options.cwd, shell], options.env);
    tmux.paneGroup = Number(tmux.run(["display-message", "-p", "-t", "main", "#{pane_pid}"]).trim());
    return tmux;
  }

  /** Runs a tmux command against this server; throws with tmux's stderr when it fails. */
  run(args: string[], env: Record<string, string | undefined> = process.env): string {
    const { TMUX: _outerTmux, ...clean } = env;
    const result = spawnSync("tmux", ["-S", this.socket, "-f", this.config, ...args], { encoding: "utf8", env: clean });
    if (result.status !== 0) throw new Error(`tmux ${args[0]} failed: ${(result.stderr || result.error?.message || "").trim()}`);
    return result.stdout;
  }

  /** Sends tmux key names (`Enter`, `Escape`, `C-d`, `S-Up`, `C-S-r`, …). */
  sendKeys(...keys: string[]): void {
    this.run(["send-keys", "-t", "main", ...keys]);
  }

  /** Types `text` literally. */
  type(text: string): void {
    this.run(["send-keys", "-t", "main", "-l", text]);
  }

  /** The visible screen, one line per row. */
  capture(): string {
    return this.run(["capture-pane", "-p", "-t", "main"]);
  }

  /** Resolves the screen once `pattern` matches it; fails with the last screen after `timeoutMs`. */
  async waitForScreen(pattern: RegExp, timeoutMs = 10_000): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    let screen = this.capture();
    while (!pattern.test(screen)) {
      if (Date.now() > deadline) {
        throw new Error(`timed out after ${timeoutMs} ms waiting for ${pattern} on the screen:\n${screen.trimEnd()}`);
      }
      await new Promise((r) => setTimeout(r, 50));
      screen = this.capture();
    }
    return screen;
  }

  /** Whether the program has ended (its terminal closed). */
  paneDead(): boolean {
    return this.run(["display-message", "-p", "-t", "main", "#{pane_dead}"]).trim() === "1";
  }

  /**
   * How the program ended, once tmux has its exit status (the pane can read
   * as dead a moment before the status is in), else null.
   */
  paneExit(): { status: number | null; signal: number | null } | null {
    if (!existsSync(this.statusFile)) return null;
    const text = readFileSync(this.statusFile, "utf8").trim();
    if (text === "") return null;
    // The shell's `$?`: 128 + N for a program killed by signal N.
    const code = Number(text);
    return code > 128 ? { status: null, signal: code - 128 } : { status: code, signal: null };
  }

  /** Resolves how the program ended; fails after `timeoutMs`. */
  async waitForExit(timeoutMs = 10_000): Promise<{ status: number | null; signal: number | null }> {
    const deadline = Date.now() + timeoutMs;
    for (let exit = this.paneExit(); ; exit = this.paneExit()) {
      if (exit !== null) return exit;
      if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for the program to exit:\n${this.capture().trimEnd()}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Kills the server and what is left of the program's process group. */
  kill(): void {
    if (existsSync(this.socket)) spawnSync("tmux", ["-S", this.socket, "kill-server"], { stdio: "ignore" });
    liveServers.delete(this.socket);
    if (this.paneGroup !== undefined && this.paneGroup > 0) {
      try {
        process.kill(-this.paneGroup, "SIGKILL");
      } catch {
        // the group is gone
      }
    }
  }
}
