/**
 * Workflow discovery and reference resolution (reference §1.1; the rule is
 * docs/AUTHORING.md, "Where workflows are found", and the Rust server's
 * `workflows.list` follows the same one: both run the shared fixtures in
 * `protocol/fixtures/discovery/`).
 *
 * Discovery scans the top-level entries of `<project>/.pi/workflows/`, then
 * `~/.pi/agent/workflows/`, then the built-in catalog (empty in this
 * version; the hook is `BUILTIN_WORKFLOWS`). An entry is a workflow when its
 * name is `<name><suffix>` with a non-empty name and a workflow suffix, and
 * it is a regular file after following symlinks. The first of a name wins:
 * the project over the global directory, and in one directory the earlier
 * suffix of WORKFLOW_SUFFIXES. Each directory's winners are listed in byte
 * order of their UTF-8 names. A reference is `builtin:<id>`, a path (it
 * contains `/` or `\`, or ends in a workflow suffix; relative to the project
 * or, for includes, to the including file's directory), or a discovered name.
 */
import { readdir, realpath, stat } from "node:fs/promises";
import { homedir } from "node:os";
import { basename, dirname, isAbsolute, join, resolve } from "node:path";
import type { WorkflowDefinition } from "../authoring/types.js";

/** The file suffixes of workflow modules, in precedence order. */
export const WORKFLOW_SUFFIXES: readonly string[] = [".workflow.ts", ".workflow.js", ".workflow.mts", ".workflow.mjs"];

/** Where a discovered workflow comes from. */
export type WorkflowOrigin = "project" | "global" | "builtin";

/** One discovered workflow. */
export interface DiscoveredWorkflow {
  name: string;
  /** The absolute file path, or `builtin:<id>`. */
  ref: string;
  origin: WorkflowOrigin;
}

/** A built-in workflow: process-local, never re-read from disk. */
export interface BuiltinWorkflow {
  id: string;
  revision: string;
  definition: WorkflowDefinition;
}

/** The built-in catalog (none ship in this version; the hook stays). */
export const BUILTIN_WORKFLOWS: ReadonlyMap<string, BuiltinWorkflow> = new Map();

/** A reference that names no workflow. */
export class WorkflowNotFoundError extends Error {
  override readonly name = "WorkflowNotFoundError";
}

/** The workflow name of a file and the precedence rank of its suffix, or null. */
function splitSuffix(file: string): { name: string; rank: number } | null {
  const base = basename(file);
  const rank = WORKFLOW_SUFFIXES.findIndex((candidate) => base.endsWith(candidate) && base.length > candidate.length);
  if (rank < 0) return null;
  return { name: base.slice(0, -(WORKFLOW_SUFFIXES[rank] as string).length), rank };
}

/** The workflow name of a file: its stem without the workflow suffix, or null when it has none (or nothing before it). */
export function workflowNameOf(file: string): string | null {
  return splitSuffix(file)?.name ?? null;
}

/** Orders strings by their UTF-8 bytes (as the Rust server does), not by UTF-16 code units. */
function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/** True when a reference is a path rather than a name. */
export function isPathReference(ref: string): boolean {
  return ref.includes("/") || ref.includes("\\") || workflowNameOf(ref) !== null;
}

/** The user's global workflow directory (`~/.pi/agent/workflows`). */
export function globalWorkflowDir(home: string = process.env.HOME || homedir()): string {
  return join(home, ".pi", "agent", "workflows");
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

/** One directory's workflows: one per name (the earliest suffix), in byte order of the names. */
async function scan(dir: string, origin: WorkflowOrigin): Promise<DiscoveredWorkflow[]> {
  let entries: Buffer[];
  try {
    entries = await readdir(dir, { encoding: "buffer" });
  } catch {
    return [];
  }
  const candidates: { name: string; rank: number; path: string }[] = [];
  for (const raw of entries) {
    let entry: string;
    try {
      entry = strictUtf8.decode(raw);
    } catch {
      continue; // a name that is not UTF-8 cannot be started by name
    }
    const split = splitSuffix(entry);
    if (split === null) continue;
    const path = join(dir, entry);
    try {
      // `stat` follows symlinks: a link to a file counts, a dangling link does not.
      if (!(await stat(path)).isFile()) continue;
    } catch {
      continue;
    }
    candidates.push({ ...split, path });
  }
  candidates.sort((a, b) => byteOrder(a.name, b.name) || a.rank - b.rank);
  return candidates
    .filter((candidate, index) => index === 0 || candidates[index - 1]?.name !== candidate.name)
    .map((candidate) => ({ name: candidate.name, ref: candidate.path, origin }));
}

/** Every workflow visible from `projectPath`, first of each name wins (project, global, built-in). */
export async function discoverWorkflows(projectPath: string, home?: string): Promise<DiscoveredWorkflow[]> {
  const candidates = [
    ...(await scan(join(projectPath, ".pi", "workflows"), "project")),
    ...(await scan(globalWorkflowDir(home), "global")),
    ...[...BUILTIN_WORKFLOWS.values()].map((builtin) => ({
      name: builtin.id,
      ref: `builtin:${builtin.id}`,
      origin: "builtin" as const,
    })),
  ];
  const seen = new Set<string>();
  return candidates.filter((candidate) => {
    if (seen.has(candidate.name)) return false;
    seen.add(candidate.name);
    return true;
  });
}

/** A resolved reference: a file or a built-in. */
export type ResolvedRef = { kind: "file"; path: string } | { kind: "builtin"; builtin: BuiltinWorkflow };

/**
 * Resolves a workflow reference. Paths are relative to `baseDir` (the
 * project, or the including file's directory); names are discovered from
 * `projectPath`. Throws WorkflowNotFoundError naming the available workflows.
 */
export async function resolveWorkflowRef(
  ref: string,
  options: { projectPath: string; baseDir?: string; home?: string },
): Promise<ResolvedRef> {
  if (ref.startsWith("builtin:")) {
    const id = ref.slice("builtin:".length);
    const builtin = BUILTIN_WORKFLOWS.get(id);
    if (!builtin) {
      const ids = [...BUILTIN_WORKFLOWS.keys()];
      throw new WorkflowNotFoundError(
        `no built-in workflow ${JSON.stringify(id)} (${ids.length === 0 ? "this version ships none" : `available: ${ids.join(", ")}`})`,
      );
    }
    return { kind: "builtin", builtin };
  }
  if (isPathReference(ref)) {
    const path = isAbsolute(ref) ? ref : resolve(options.baseDir ?? options.projectPath, ref);
    try {
      if (!(await stat(path)).isFile()) throw new Error("not a file");
      return { kind: "file", path: await realpath(path) };
    } catch {
      throw new WorkflowNotFoundError(`workflow file ${JSON.stringify(ref)} was not found (resolved to ${path})`);
    }
  }
  const found = await discoverWorkflows(options.projectPath, options.home);
  const match = found.find((candidate) => candidate.name === ref);
  if (!match) {
    const names = found.map((candidate) => candidate.name);
    throw new WorkflowNotFoundError(
      `no workflow named ${JSON.stringify(ref)} (available: ${names.length === 0 ? "none" : names.join(", ")})`,
    );
  }
  if (match.origin === "builtin") {
    return { kind: "builtin", builtin: BUILTIN_WORKFLOWS.get(match.name) as BuiltinWorkflow };
  }
  return { kind: "file", path: await realpath(match.ref) };
}

/** The directory paths in a file's includes are relative to. */
export function includeBaseDir(path: string): string {
  return dirname(path);
}
