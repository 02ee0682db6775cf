/**
 * Controller discovery (reference §6, CONTROLLERS.md): the top-level
 * entries of `<project>/.pi/controllers/`, then `~/.pi/agent/controllers/`,
 * named `<name><suffix>` with a controller suffix and a valid controller
 * name, that are regular files after following symlinks. The first of a
 * name wins: the project over the global directory, and in one directory
 * the earlier suffix of CONTROLLER_SUFFIXES. Each directory's winners are
 * listed in byte order of their UTF-8 names, as workflow discovery does.
 * Discovery reads directory entries only; it never loads a module.
 */
import { readdir, stat } from "node:fs/promises";
import { homedir } from "node:os";
import { basename, join } from "node:path";

/** The file suffixes of controller modules, in precedence order. */
export const CONTROLLER_SUFFIXES: readonly string[] = [".controller.ts", ".controller.js", ".controller.mts", ".controller.mjs"];

const NAME = /^[a-z][a-z0-9-]*$/;

/** One discovered controller. */
export interface DiscoveredController {
  name: string;
  /** The absolute file path. */
  path: string;
  origin: "project" | "global";
}

function splitSuffix(file: string): { name: string; rank: number } | null {
  const base = basename(file);
  const rank = CONTROLLER_SUFFIXES.findIndex((suffix) => base.endsWith(suffix) && base.length > suffix.length);
  if (rank < 0) return null;
  const name = base.slice(0, -(CONTROLLER_SUFFIXES[rank] as string).length);
  return NAME.test(name) && name.length <= 64 ? { name, rank } : null;
}

/** The controller name of a file, or null when it is not a controller module. */
export function controllerNameOf(file: string): string | null {
  return splitSuffix(file)?.name ?? null;
}

/** The user's global controller directory (`~/.pi/agent/controllers`). */
export function globalControllerDir(home: string = process.env.HOME || homedir()): string {
  return join(home, ".pi", "agent", "controllers");
}

async function scan(dir: string, origin: DiscoveredController["origin"]): Promise<DiscoveredController[]> {
  let entries: string[];
  try {
    entries = await readdir(dir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT" || (error as NodeJS.ErrnoException).code === "ENOTDIR") return [];
    throw error;
  }
  const best = new Map<string, { path: string; rank: number }>();
  for (const entry of entries) {
    const split = splitSuffix(entry);
    if (split === null) continue;
    const path = join(dir, entry);
    const info = await stat(path).catch(() => null);
    if (info === null || !info.isFile()) continue;
    const held = best.get(split.name);
    if (held === undefined || split.rank < held.rank) best.set(split.name, { path, rank: split.rank });
  }
  return [...best.entries()]
    .sort(([a], [b]) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")))
    .map(([name, { path }]) => ({ name, path, origin }));
}

/** Every controller of a project and of the user, project first; a project controller hides a global one of the same name. */
export async function discoverControllers(projectDir: string, home?: string): Promise<DiscoveredController[]> {
  const project = await scan(join(projectDir, ".pi", "controllers"), "project");
  const names = new Set(project.map((found) => found.name));
  const global = (await scan(globalControllerDir(home), "global")).filter((found) => !names.has(found.name));
  return [...project, ...global];
}
