/**
 * The transform cache: workflow modules already transformed (TypeScript
 * types stripped by Node, or jiti's Babel transform), kept in the user-only
 * state directory (`<PI_WORKFLOWS_HOME>/cache/transform/`), so that a later
 * start of the same source runs no transform at all.
 *
 * Invariants:
 * - Content-addressed. An entry's name is the sha256 of its key: the cache
 *   format, the transformer and its version, the transform options, the
 *   file's path where the transformer writes it into its output, and the
 *   sha256 of the exact bytes transformed. A changed source is another
 *   entry; nothing is ever updated in place, and an entry is only ever used
 *   for the bytes it was made from.
 * - Checked before use. An entry is used only when the cache directory is
 *   this user's and private (owner = this uid, no group or other bits), the
 *   entry is a regular file (opened without following a symlink) of this
 *   user with no group or other bits, its header names the same key, and the
 *   sha256 of its body equals the header's digest. Anything else is refused:
 *   counted, removed, and rebuilt from the source by the caller.
 * - Whole or absent. An entry is written to a fresh private temp file and
 *   renamed into place, so a reader sees all of it or nothing; a torn entry
 *   (a crash before the data reached the disk) fails its digest.
 * - Never a reason to fail. A cache that cannot be opened, read or written
 *   only costs the transform; the reason is reported (`summary`).
 * - Bounded: past MAX_ENTRIES entries, a store removes the oldest until
 *   PRUNED_ENTRIES remain.
 */
import { createHash, randomBytes } from "node:crypto";
import { chmodSync, closeSync, constants, fstatSync, lstatSync, mkdirSync, openSync, readFileSync, readdirSync, renameSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** The entry format; part of every key, so a new format never reads an old entry. */
const CACHE_FORMAT = "pi-workflows.transform-cache.v1";
/** Stores past this many entries prune the oldest. */
export const MAX_ENTRIES = 1000;
/** What pruning leaves. */
export const PRUNED_ENTRIES = 800;

/** One entry's contents: how to load the body (a module format, or a loader's name) and the body. */
export interface CacheEntry {
  format: string;
  body: string;
}

/** What a process did with the cache. */
export interface CacheCounts {
  /** Entries used (a transform that did not run). */
  used: number;
  /** Entries written. */
  stored: number;
  /** Entries refused (and removed), each with its reason. */
  refused: string[];
  /** Stores that failed (disk full, permissions); the transform's result was used without storing it. */
  unwritable: number;
}

/** The key of a transform: the sha256 (hex) of its parts, with the cache format first. */
export function cacheKey(...parts: string[]): string {
  return createHash("sha256").update(JSON.stringify([CACHE_FORMAT, ...parts])).digest("hex");
}

function sha256Hex(text: string): string {
  return createHash("sha256").update(text, "utf8").digest("hex");
}

function errorCode(error: unknown): string {
  return (error as { code?: unknown } | null)?.code === undefined ? String(error) : String((error as { code: unknown }).code);
}

/** Whether a stat belongs to this user and grants nothing to group or others. */
function privateTo(uid: number, stats: { uid: number; mode: number }): boolean {
  return stats.uid === uid && (stats.mode & 0o077) === 0;
}

export class TransformCache {
  readonly counts: CacheCounts = { used: 0, stored: 0, refused: [], unwritable: 0 };

  private constructor(
    /** The entries' directory. */
    readonly dir: string,
    private readonly uid: number,
  ) {}

  /**
   * Opens (creating it, mode 0700) `<stateDir>/cache/<name>/`: `transform`
   * for workflow modules, `code` for the runner's own compiled code
   * (`code-cache.ts`). Returns the reason instead when the cache cannot be
   * used: no POSIX owner, a directory that is not one or belongs to another
   * user.
   */
  static open(stateDir: string, name: "transform" | "code" = "transform"): TransformCache | { off: string } {
    const uid = process.getuid?.();
    if (uid === undefined) return { off: "no POSIX file owners on this platform" };
    const cacheDir = join(stateDir, "cache");
    const dir = join(cacheDir, name);
    try {
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      for (const path of [cacheDir, dir]) {
        const stats = lstatSync(path);
        if (!stats.isDirectory()) return { off: `${path === dir ? `cache/${name}` : "cache"} is not a directory` };
        if (stats.uid !== uid) return { off: `${path === dir ? `cache/${name}` : "cache"} belongs to another user` };
        // Ours but open to others (made by hand, or a umask-less copy): make it private again, as the server does with its directories.
        if (!privateTo(uid, stats)) chmodSync(path, 0o700);
      }
    } catch (error) {
      return { off: `the cache directory cannot be prepared (${errorCode(error)})` };
    }
    return new TransformCache(dir, uid);
  }

  private path(key: string): string {
    return join(this.dir, `${key}.entry`);
  }

  /** The checked entry of `key`, or null (a miss, or a refused entry, which is then removed). */
  get(key: string): CacheEntry | null {
    const path = this.path(key);
    let fd: number;
    try {
      fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    } catch (error) {
      const code = errorCode(error);
      if (code === "ENOENT") return null;
      return this.refuse(path, code === "ELOOP" ? "a symlink" : `unreadable (${code})`);
    }
    let text: string;
    try {
      const stats = fstatSync(fd);
      if (!stats.isFile()) return this.refuse(path, "not a regular file");
      if (stats.uid !== this.uid) return this.refuse(path, "another user's file");
      if ((stats.mode & 0o077) !== 0) return this.refuse(path, "readable or writable by others");
      text = readFileSync(fd, "utf8");
    } catch (error) {
      return this.refuse(path, `unreadable (${errorCode(error)})`);
    } finally {
      closeSync(fd);
    }
    const newline = text.indexOf("\n");
    let header: { cache?: unknown; key?: unknown; format?: unknown; digest?: unknown };
    try {
      header = newline < 0 ? {} : (JSON.parse(text.slice(0, newline)) as typeof header);
    } catch {
      header = {};
    }
    if (header.cache !== CACHE_FORMAT || typeof header.format !== "string" || typeof header.digest !== "string") {
      return this.refuse(path, "no valid header");
    }
    if (header.key !== key) return this.refuse(path, "made for another key");
    const body = text.slice(newline + 1);
    if (sha256Hex(body) !== header.digest) return this.refuse(path, "its digest does not match");
    this.counts.used += 1;
    return { format: header.format, body };
  }

  /** Stores `body` under `key` (best effort: a failure is counted, never thrown). */
  put(key: string, entry: CacheEntry): void {
    const header = JSON.stringify({ cache: CACHE_FORMAT, key, format: entry.format, digest: sha256Hex(entry.body) });
    const temp = join(this.dir, `.${key}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
    try {
      writeFileSync(temp, `${header}\n${entry.body}`, { mode: 0o600, flag: "wx" });
      renameSync(temp, this.path(key));
      this.counts.stored += 1;
    } catch {
      this.counts.unwritable += 1;
      try {
        unlinkSync(temp);
      } catch {
        // never created
      }
      return;
    }
    this.prune();
  }

  private refuse(path: string, reason: string): null {
    this.counts.refused.push(reason);
    try {
      unlinkSync(path);
    } catch {
      // gone already, or not ours to remove: the rebuilt entry is renamed over it
    }
    return null;
  }

  /** Removes the oldest entries (by modification time) once there are more than MAX_ENTRIES. */
  private prune(): void {
    let names: string[];
    try {
      names = readdirSync(this.dir).filter((name) => name.endsWith(".entry"));
    } catch {
      return;
    }
    if (names.length <= MAX_ENTRIES) return;
    const aged = names.flatMap((name) => {
      try {
        return [{ name, mtimeMs: statSync(join(this.dir, name)).mtimeMs }];
      } catch {
        return [];
      }
    });
    aged.sort((a, b) => a.mtimeMs - b.mtimeMs);
    for (const { name } of aged.slice(0, aged.length - PRUNED_ENTRIES)) {
      try {
        unlinkSync(join(this.dir, name));
      } catch {
        // removed by another runner
      }
    }
  }
}
