/**
 * Workflow discovery and reference resolution (reference §1.1).
 *
 * Discovery scans the top-level files of `<project>/.pi/workflows/`, then
 * `~/.pi/agent/workflows/`, then the built-in catalog (empty in this
 * version; the hook is `BUILTIN_WORKFLOWS`). A workflow is named by its file
 * stem; the first of a name wins. A reference is `builtin:<id>`, a path (it
 * contains `/` or `\`, or ends in a workflow suffix; relative to the project
 * or, for includes, to the including file's directory), or a discovered name.
 */
import { readdir, realpath, stat } from "node:fs/promises";
import { homedir } from "node:os";
import { basename, dirname, isAbsolute, join, resolve } from "node:path";
import type { WorkflowDefinition } from "../authoring/types.js";

/** The file suffixes of workflow modules. */
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

/** The workflow name of a file: its stem without the workflow suffix, or null when it has none. */
export function workflowNameOf(file: string): string | null {
  const base = basename(file);
  const suffix = WORKFLOW_SUFFIXES.find((candidate) => base.endsWith(candidate));
  if (suffix === undefined || base.length === suffix.length) return null;
  return base.slice(0, -suffix.length);
}

/** True when a reference is a path rather than a name. */
export function isPathReference(ref: string): boolean {
  return ref.includes("/") || ref.includes("\\") || workflowNameOf(ref) !== null;
}

/** The user's global workflow directory (`~/.pi/agent/workflows`). */
export function globalWorkflowDir(home: string = process.env.HOME || homedir()): string {
  return join(home, ".pi", "agent", "workflows");
}

async function scan(dir: string, origin: WorkflowOrigin): Promise<DiscoveredWorkflow[]> {
  let entries: string[];
  try {
    entries = await readdir(dir);
  } catch {
    return [];
  }
  const found: DiscoveredWorkflow[] = [];
  for (const entry of entries.sort()) {
    const name = workflowNameOf(entry);
    if (name === null) continue;
    const path = join(dir, entry);
    try {
      if (!(await stat(path)).isFile()) continue;
    } catch {
      continue;
    }
    found.push({ name, ref: path, origin });
  }
  return found.sort((a, b) => (a.ref < b.ref ? -1 : a.ref > b.ref ? 1 : 0));
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
