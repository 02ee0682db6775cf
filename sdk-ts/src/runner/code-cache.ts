/**
 * The V8 code cache of the runner channel's validators
 * (`generated/runner-validators.cjs`: about 600 KB of ajv standalone code).
 * Every runner process (a resolver, which also runs its run's first
 * generation, a later run generation, a validation child) requires that
 * module on its first frame and compiles the validators it calls: about 13
 * ms of CPU in a start of about 100. From the code cache, V8 deserializes
 * the module with the functions an earlier start compiled (lazily compiled
 * ones included, since the entry is made after they ran), about half that.
 *
 * Invariants:
 * - Only this package's own generated module goes through it, never
 *   workflow code: what a workflow runs is still exactly the verified bytes
 *   (the loader), and no entry is ever keyed by anything weaker than a
 *   sha256 of the source. (Node's own compile cache was measured too, but it
 *   would also cover workflow modules, keyed by a CRC32 of their source.)
 * - Content-addressed and checked like a transform: the entry is a
 *   [`TransformCache`] entry in `<state>/cache/code/` (a private directory,
 *   mode 0700, of this user; entries 0600, read without following a
 *   symlink, their body's sha256 in their header), keyed by the module's
 *   sha256, Node's version and the architecture. V8 itself refuses data made
 *   by another V8, under other flags or for a source of another length
 *   (`cachedDataRejected`).
 * - Never a reason to fail: a missing, refused or rejected entry compiles
 *   the module as Node would have. The entry is (re)written by
 *   [`CodeCache.store`] after the start answered, from the functions
 *   compiled by then; a store that fails is only logged.
 * - Loaded once: the compiled module is placed in Node's CommonJS module
 *   cache under its resolved path, where `protocol/messages.ts`'s `require`
 *   finds it; a process that already loaded it (a test calling `main`) keeps
 *   its instance.
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import nodeModule from "node:module";
import { dirname } from "node:path";
import { Script } from "node:vm";
import { type TransformCache, cacheKey } from "./transform-cache.js";

const requireHere = nodeModule.createRequire(import.meta.url);
/** The module `protocol/messages.ts` requires on the runner channel's first frame. */
const VALIDATORS = requireHere.resolve("../generated/runner-validators.cjs");
/** The entry's format (a [`TransformCache`] entry's `format`): base64 of V8's cached data. */
const FORMAT = "v8-code-base64";

/** The part of Node's CommonJS `Module` this uses. */
interface CjsModule {
  exports: unknown;
  filename: string;
  paths: string[];
  loaded: boolean;
}
interface ModuleApi {
  new (id: string, parent?: unknown): CjsModule;
  wrap(source: string): string;
  _nodeModulePaths(dir: string): string[];
}
const Module = nodeModule as unknown as ModuleApi;

/** What the load did with the cache (for the runner log). */
export type CodeCacheUse = "used" | "missed" | "rejected" | "already loaded" | `off (${string})` | `refused (${string})`;

export class CodeCache {
  private constructor(
    private readonly cache: TransformCache | null,
    private readonly key: string,
    private readonly script: Script | null,
    /** What the load did. */
    readonly use: CodeCacheUse,
  ) {}

  /**
   * Compiles the runner validators (with the entry of `cache` when it has
   * one) and puts the module where `require` finds it. `cache` is the opened
   * `cache/code` directory, or why there is none.
   */
  static loadValidators(cache: TransformCache | { off: string }): CodeCache {
    if (requireHere.cache[VALIDATORS] !== undefined) return new CodeCache(null, "", null, "already loaded");
    const source = readFileSync(VALIDATORS, "utf8");
    const store = "off" in cache ? null : cache;
    const key = cacheKey(FORMAT, process.version, process.arch, createHash("sha256").update(source).digest("hex"));
    const entry = store?.get(key);
    const cachedData = entry?.format === FORMAT ? Buffer.from(entry.body, "base64") : undefined;
    const script = new Script(Module.wrap(source), { filename: VALIDATORS, ...(cachedData !== undefined ? { cachedData } : {}) });
    const compiled = script.runInThisContext() as (exports: unknown, require: NodeJS.Require, module: CjsModule, filename: string, dirname: string) => void;
    const module = new Module(VALIDATORS, undefined);
    module.filename = VALIDATORS;
    module.paths = Module._nodeModulePaths(dirname(VALIDATORS));
    compiled.call(module.exports, module.exports, nodeModule.createRequire(VALIDATORS), module, VALIDATORS, dirname(VALIDATORS));
    module.loaded = true;
    requireHere.cache[VALIDATORS] = module as unknown as NodeJS.Module;
    const refused = store?.counts.refused[0];
    const use: CodeCacheUse =
      "off" in cache
        ? `off (${cache.off})`
        : refused !== undefined
          ? `refused (${refused})`
          : cachedData === undefined
            ? "missed"
            : script.cachedDataRejected === true
              ? "rejected"
              : "used";
    return new CodeCache(store, key, use === "used" ? null : script, use);
  }

  /** Writes the entry when the load did not use one (V8's data for the functions compiled so far); what it did, for the runner log, or null when there was nothing to do. */
  store(): string | null {
    if (this.cache === null || this.script === null) return null;
    const before = this.cache.counts.stored;
    this.cache.put(this.key, { format: FORMAT, body: this.script.createCachedData().toString("base64") });
    return this.cache.counts.stored > before ? "stored" : "not stored (unwritable)";
  }
}
