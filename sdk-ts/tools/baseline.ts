/**
 * A benchmark's baseline runner: the `sdk-ts` of a git ref, built from `git
 * archive` with this package's node_modules and its own tsc, so that the
 * same script can time this runner and the one of `ref` in one process run.
 */
import { execFileSync } from "node:child_process";
import { symlinkSync } from "node:fs";
import { join } from "node:path";
import { SDK_DIR } from "../test-support/server.js";

/** Builds the runner of git ref `ref` into `dir` and returns its bin (`dist/runner/bin.js`). */
export function buildBaseline(ref: string, dir: string): string {
  const repo = join(SDK_DIR, "..");
  const archive = execFileSync("git", ["-C", repo, "archive", "--format=tar", ref, "sdk-ts"], { maxBuffer: 1 << 28 });
  execFileSync("tar", ["-x", "-C", dir], { input: archive });
  const sdk = join(dir, "sdk-ts");
  symlinkSync(join(SDK_DIR, "node_modules"), join(sdk, "node_modules"));
  execFileSync(process.execPath, [join(SDK_DIR, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"], { cwd: sdk, stdio: "inherit" });
  return join(sdk, "dist", "runner", "bin.js");
}
