/**
 * What the benchmark scripts share (`bench-runner.ts`, `e2e-pi/bench-agent.ts`):
 * - a baseline runner: the `sdk-ts` of a git ref, built from `git archive`
 *   with this package's node_modules and its own tsc, so that one script
 *   times this runner and the one of `ref` in the same process run;
 * - the CPU time of a live process from /proc, which a loaded machine
 *   inflates far less than the wall clock;
 * - medians and percentiles.
 */
import { execFileSync } from "node:child_process";
import { readFileSync, readdirSync, symlinkSync } from "node:fs";
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

/**
 * CPU time of every thread of `pid` so far, in ms: the first field of
 * `/proc/<pid>/task/<tid>/schedstat` (ns on a CPU). It does not grow while
 * the process waits for a core, so on a loaded machine it shows the
 * process's own work where the wall clock shows the machine's load.
 */
export function cpuMsOf(pid: number): number {
  let ns = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(" ")[0]);
    } catch {
      // the thread ended
    }
  }
  return ns / 1e6;
}

/** The median of the values that were measured (NaN, a phase a trace missed, is left out; NaN when none was). */
export function median(values: number[]): number {
  const sorted = values.filter((value) => !Number.isNaN(value)).sort((a, b) => a - b);
  if (sorted.length === 0) return NaN;
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

/** The nearest-rank percentile `p` (0–100) of `values`. */
export function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)] as number;
}
