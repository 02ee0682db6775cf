/**
 * The fake `herdr` of scripts/fake-herdr.mjs in a fresh directory to put on
 * PATH, with its recorded calls and its state (panes, the linked plugin,
 * commands made to fail).
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { REPO_DIR } from "./server.js";

export interface HerdrPane {
  pane_id: string;
  tab_id: string;
  workspace_id: string;
  label?: string;
}

export interface HerdrState {
  panes: HerdrPane[];
  plugin: { plugin_id: string; plugin_root: string; manifest_path: string; version: string; enabled: boolean } | null;
  fail: string[];
  next: number;
}

export interface HerdrCall {
  argv: string[];
  env: { PI_WORKFLOWS_RUN_ID?: string; HERDR_PANE_ID?: string };
}

export const FAKE_HERDR = join(REPO_DIR, "scripts", "fake-herdr.mjs");

export class FakeHerdr {
  /** The directory to put first on PATH (it holds `herdr`). */
  readonly bin: string;

  constructor() {
    this.bin = mkdtempSync(join(tmpdir(), "pi-workflows-herdr-"));
    symlinkSync(FAKE_HERDR, join(this.bin, "herdr"));
  }

  /** A Herdr with the caller's pane and the plugin linked and enabled (or as `change` says). */
  static withPlugin(change: Partial<HerdrState> = {}): FakeHerdr {
    const herdr = new FakeHerdr();
    herdr.setState({
      panes: [{ pane_id: "w1:p1", tab_id: "w1:t1", workspace_id: "w1", label: "pi" }],
      plugin: { plugin_id: "osolmaz.pi-workflows", plugin_root: "/plugins/pi-workflows", manifest_path: "/plugins/pi-workflows/herdr-plugin.toml", version: "0.1.0", enabled: true },
      fail: [],
      next: 2,
      ...change,
    });
    return herdr;
  }

  setState(state: HerdrState): void {
    writeFileSync(join(this.bin, "herdr-state.json"), JSON.stringify(state, null, 2));
  }

  state(): HerdrState {
    return JSON.parse(readFileSync(join(this.bin, "herdr-state.json"), "utf8")) as HerdrState;
  }

  /** Every call so far, in order. */
  calls(): HerdrCall[] {
    const path = join(this.bin, "herdr-calls.ndjson");
    if (!existsSync(path)) return [];
    return readFileSync(path, "utf8")
      .split("\n")
      .filter((line) => line.length > 0)
      .map((line) => JSON.parse(line) as HerdrCall);
  }

  /** The calls as command lines (`plugin pane open --plugin …`). */
  commandLines(): string[] {
    return this.calls().map((call) => call.argv.join(" "));
  }

  /** PATH with the fake first. */
  path(rest = process.env.PATH ?? ""): string {
    return `${this.bin}:${rest}`;
  }

  remove(): void {
    rmSync(this.bin, { recursive: true, force: true });
  }
}
