/**
 * Loading workflow (and controller) modules, and compiling a root workflow
 * with its includes. Imports of `@pi-workflows/sdk` (and `/runner`,
 * `/protocol`, `/controllers`, `pi-workflows`), and of
 * `@osolmaz/pi-workflows` and `@osolmaz/pi-workflows/controllers` (the
 * reference package's names), inside a loaded module resolve to this
 * package's own modules.
 *
 * Two loaders:
 * - Node's type stripping, where the process enabled it
 *   (`configureLoading({ native: true })`, which the runner does) and Node
 *   has it (22.18 and later: `process.features.typescript`,
 *   `module.registerHooks`, `module.stripTypeScriptTypes`). Synchronous
 *   module hooks alias the SDK imports and hand Node each TypeScript file as
 *   plain JavaScript: from the transform cache, or stripped now and stored.
 *   Node itself then imports the module (one instance per file per process).
 *   A verified source (`rememberVerified`), or at resolution a hashed one
 *   (`hashFile`), is served from the bytes that were hashed, never re-read.
 * - jiti (Node 20, and whatever type stripping cannot load: enums,
 *   namespaces, parameter properties, relative imports without an
 *   extension, CommonJS globals). Babel, loaded only when needed, transforms
 *   each module; with a transform cache, a transform is first looked up by
 *   the hash of the source jiti read, so a warm start loads no Babel. No
 *   module cache: every load evaluates afresh.
 *
 * A native import that fails for any reason but the workflow's own
 * definition error is retried with jiti; if that fails too, jiti's error is
 * reported. (A module that failed while it was being evaluated runs its top
 * level a second time under jiti; top-level code runs in every runner
 * process that loads the workflow: a resolver, which also runs the first
 * generation of a fresh start, and every later run or validate process.)
 *
 * The transform cache (`transform-cache.ts`) is keyed by the exact bytes
 * transformed, so it never changes what runs; source identity is still
 * checked by the callers (hashes before loading, and again after).
 */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import nodeModule from "node:module";
import { dirname } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { Jiti, TransformOptions, TransformResult } from "jiti";
import { type CompileHost, type CompiledWorkflow, type LoadedWorkflow, compileWorkflow, sha256Digest } from "../authoring/compile.js";
import { isWorkflowDefinition } from "../authoring/define.js";
import { WorkflowDefinitionError } from "../authoring/errors.js";
import type { WorkflowDefinition } from "../authoring/types.js";
import { canonicalString } from "../protocol/canonical.js";
import { includeBaseDir, resolveWorkflowRef } from "./discovery.js";
import { type TransformCache, cacheKey } from "./transform-cache.js";

const SDK_ENTRY = fileURLToPath(new URL("../index.js", import.meta.url));
const RUNNER_ENTRY = fileURLToPath(new URL("./index.js", import.meta.url));
const PROTOCOL_ENTRY = fileURLToPath(new URL("../protocol/index.js", import.meta.url));
const CONTROLLERS_ENTRY = fileURLToPath(new URL("../controllers/index.js", import.meta.url));
const ALIASES: Record<string, string> = {
  "@pi-workflows/sdk/controllers": CONTROLLERS_ENTRY,
  "@osolmaz/pi-workflows/controllers": CONTROLLERS_ENTRY,
  "pi-workflows/controllers": CONTROLLERS_ENTRY,
  "@osolmaz/pi-workflows": SDK_ENTRY,
  "@pi-workflows/sdk/runner": RUNNER_ENTRY,
  "@pi-workflows/sdk/protocol": PROTOCOL_ENTRY,
  "@pi-workflows/sdk": SDK_ENTRY,
  "pi-workflows": SDK_ENTRY,
};
/** The version of this file's loading rules: part of every cache key. */
const LOADER_VERSION = "1";
const TYPESCRIPT_FILE = /\.[cm]?ts$/;

/** A module that could not be loaded (syntax, import or evaluation error). */
export class WorkflowLoadError extends Error {
  override readonly name = "WorkflowLoadError";
}

/** Which loader a process may use, and its cache. */
export interface LoadingOptions {
  /** Use Node's type stripping where Node has it (the runner: one short-lived process per run). */
  native?: boolean;
  /** The transform cache, or why there is none. */
  cache?: TransformCache | { off: string };
}

/** What this process loaded, and how. */
export interface LoadCounts {
  /** Workflow files imported by Node's type stripping. */
  native: number;
  /** Workflow files imported by jiti. */
  jiti: number;
  /** Of those, the ones type stripping could not load, each with its error code. */
  fellBack: string[];
}

const counts: LoadCounts = { native: 0, jiti: 0, fellBack: [] };
let cache: TransformCache | undefined;
let cacheOff = "not enabled";
let native = false;
/** Verified source bytes by absolute path (served to Node as they were hashed). */
const verified = new Map<string, Buffer>();

/** Node's module API beyond @types/node 20: present on Node 22.18+. */
interface NodeModuleApi {
  registerHooks?: (hooks: {
    resolve?: (specifier: string, context: object, next: (specifier: string, context: object) => ResolveResult) => ResolveResult;
    load?: (url: string, context: { format?: string | null }, next: (url: string, context: object) => LoadResult) => LoadResult;
  }) => unknown;
  stripTypeScriptTypes?: (code: string, options?: { mode?: "strip" }) => string;
  findPackageJSON?: (specifier: string | URL, base?: string | URL) => string | undefined;
}
interface ResolveResult {
  url: string;
  format?: string | null;
  shortCircuit?: boolean;
}
interface LoadResult {
  format?: string | null;
  source?: string | Uint8Array | null;
  shortCircuit?: boolean;
}
const api = nodeModule as unknown as NodeModuleApi;

/** Whether this Node strips TypeScript types itself, with the hooks the native loader needs. */
export function nodeStripsTypes(): boolean {
  const features = process.features as { typescript?: unknown };
  return Boolean(features.typescript) && typeof api.registerHooks === "function" && typeof api.stripTypeScriptTypes === "function";
}

/** Sets how this process loads workflow modules (once, before the first load). */
export function configureLoading(options: LoadingOptions): void {
  if (options.cache !== undefined) {
    if ("off" in options.cache) cacheOff = options.cache.off;
    else cache = options.cache;
  }
  if (options.native && !native && nodeStripsTypes()) {
    registerNativeHooks();
    native = true;
  }
}

/** Remembers the verified bytes of a source file, so the native loader runs exactly them. */
export function rememberVerified(path: string, bytes: Buffer): void {
  verified.set(path, bytes);
}

/** One line saying what this process loaded and what the cache did (no paths). */
export function loadSummary(): string {
  const fellBack = counts.fellBack.length > 0 ? ` (${counts.fellBack.length} after type stripping failed: ${[...new Set(counts.fellBack)].join(", ")})` : "";
  const loaders = `${counts.native} by Node type stripping, ${counts.jiti} by jiti${fellBack}`;
  if (!cache) return `loaded workflow modules: ${loaders}; transform cache: off (${cacheOff})`;
  const c = cache.counts;
  const refused = c.refused.length > 0 ? ` (${[...new Set(c.refused)].join("; ")})` : "";
  const unwritable = c.unwritable > 0 ? `, ${c.unwritable} not stored (unwritable)` : "";
  return `loaded workflow modules: ${loaders}; transform cache: ${c.used} used, ${c.stored} stored, ${c.refused.length} refused${refused}${unwritable}`;
}

function sha256Hex(bytes: Uint8Array | string): string {
  return createHash("sha256").update(bytes).digest("hex");
}

// --- Node's type stripping ------------------------------------------------

/** Where a stripped TypeScript file's cache entry says it failed: the body is the error code. */
const UNSUPPORTED = "unsupported";
/** Node's errors for bytes type stripping cannot turn into JavaScript: a property of the bytes, so worth remembering. */
const STRIP_SYNTAX_ERRORS = new Set(["ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX", "ERR_INVALID_TYPESCRIPT_SYNTAX"]);
const packageTypes = new Map<string, string>();

/** The `type` of the package.json that scopes `path` (`none` without one, or without a type). */
function packageTypeOf(path: string): string {
  const dir = dirname(path);
  let type = packageTypes.get(dir);
  if (type === undefined) {
    type = "none";
    const file = api.findPackageJSON?.(pathToFileURL(path));
    if (file !== undefined) {
      try {
        const parsed = JSON.parse(readFileSync(file, "utf8")) as { type?: unknown };
        if (parsed.type === "module" || parsed.type === "commonjs") type = parsed.type;
      } catch {
        // Node reports an unreadable package.json when it imports the module
      }
    }
    packageTypes.set(dir, type);
  }
  return type;
}

/** An error of Node's loader (code first, as Node's own errors). */
function loaderError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/** Strips types without Node's one-time experimental warning for `stripTypeScriptTypes` (the loader's own use of it is not news to the user). */
function strip(code: string): string {
  const emit = process.emitWarning;
  process.emitWarning = ((warning: string | Error, ...rest: unknown[]) => {
    const text = typeof warning === "string" ? warning : warning.message;
    if (text.startsWith("stripTypeScriptTypes is an experimental feature")) return;
    (emit as (...args: unknown[]) => void).call(process, warning, ...rest);
  }) as typeof process.emitWarning;
  try {
    return (api.stripTypeScriptTypes as NonNullable<NodeModuleApi["stripTypeScriptTypes"]>)(code, { mode: "strip" });
  } finally {
    process.emitWarning = emit;
  }
}

/**
 * The load hook for TypeScript files: the stripped JavaScript and its module
 * format, from the cache when the same bytes were stripped before by this
 * Node under the same package type; otherwise Node decides the format (as it
 * would import the file), the types are stripped and the result is stored.
 */
function loadTypeScript(url: string, context: object, next: (url: string, context: object) => LoadResult): LoadResult {
  const path = fileURLToPath(url);
  const bytes = verified.get(path) ?? readFileSync(path);
  const ext = TYPESCRIPT_FILE.exec(path)?.[0] ?? ".ts";
  const key = cacheKey("node-strip", LOADER_VERSION, process.version, ext, ext === ".ts" ? packageTypeOf(path) : "-", sha256Hex(bytes));
  const hit = cache?.get(key);
  if (hit) {
    if (hit.format === UNSUPPORTED) throw loaderError(hit.body, `${url} cannot be type-stripped (${hit.body})`);
    if (hit.format === "module" || hit.format === "commonjs") return { format: hit.format, source: hit.body, shortCircuit: true };
  }
  let stripped: string;
  let format: "module" | "commonjs";
  try {
    // Node's own load decides the format, and already refuses syntax it cannot strip (Node 22.18+ parses the file to detect its format).
    const decided = next(url, context).format;
    if (decided !== "module-typescript" && decided !== "commonjs-typescript") {
      throw loaderError("ERR_UNKNOWN_FILE_EXTENSION", `${url} is not a TypeScript module Node can load (format ${String(decided)})`);
    }
    format = decided === "module-typescript" ? "module" : "commonjs";
    stripped = strip(bytes.toString("utf8"));
  } catch (error) {
    // Only a verdict on these bytes is remembered (not, say, an unreadable package.json).
    const code = (error as { code?: unknown } | null)?.code;
    if (typeof code === "string" && STRIP_SYNTAX_ERRORS.has(code)) cache?.put(key, { format: UNSUPPORTED, body: code });
    throw error;
  }
  cache?.put(key, { format, body: stripped });
  return { format, source: stripped, shortCircuit: true };
}

function registerNativeHooks(): void {
  const aliases = new Map(Object.entries(ALIASES).map(([specifier, path]) => [specifier, pathToFileURL(path).href]));
  (api.registerHooks as NonNullable<NodeModuleApi["registerHooks"]>)({
    resolve(specifier, context, next) {
      const url = aliases.get(specifier);
      return url !== undefined ? { url, shortCircuit: true } : next(specifier, context);
    },
    load(url, context, next) {
      if (url.startsWith("file:") && TYPESCRIPT_FILE.test(new URL(url).pathname)) return loadTypeScript(url, context, next);
      return next(url, context);
    },
  });
}

// --- jiti -----------------------------------------------------------------

const requireHere = nodeModule.createRequire(import.meta.url);
let jiti: Jiti | undefined;
let babelJiti: Jiti | undefined;

type CreateJiti = (id: string, options?: object) => Jiti;

/** jiti's CommonJS entry (a `require` skips the ES-module lexer pass over jiti's 190 KB bundle). */
function createJiti(): CreateJiti {
  return (requireHere("jiti") as { createJiti: CreateJiti }).createJiti;
}

/** A jiti with the default transform: Babel, loaded on its first use. */
function babel(): Jiti {
  babelJiti ??= createJiti()(import.meta.url, { moduleCache: false, fsCache: false });
  return babelJiti;
}

/** jiti's transform through the cache: Babel runs only for bytes it has not transformed before. */
function cachedTransform(store: TransformCache): (options: TransformOptions) => TransformResult {
  const version = (requireHere("jiti/package.json") as { version: string }).version;
  return (options) => {
    const { source, ...rest } = options;
    let settings: string;
    try {
      // The options include the file name: jiti writes it into the output (import.meta.url, __filename).
      settings = canonicalString(rest);
    } catch {
      return { code: babel().transform(options) };
    }
    const key = cacheKey("jiti", LOADER_VERSION, version, settings, sha256Hex(source));
    const hit = store.get(key);
    if (hit && hit.format === "jiti") return { code: hit.body };
    const code = babel().transform(options);
    // A syntax error becomes code that throws it: never stored, so that the next start reports it afresh.
    if (!code.includes("__JITI_ERROR__")) store.put(key, { format: "jiti", body: code });
    return { code };
  };
}

function loader(): Jiti {
  jiti ??= createJiti()(import.meta.url, {
    moduleCache: false,
    fsCache: false,
    interopDefault: true,
    alias: ALIASES,
    ...(cache ? { transform: cachedTransform(cache) } : {}),
  });
  return jiti;
}

// --- loading --------------------------------------------------------------

/**
 * `sha256:<hex>` of a file's bytes. With the native loader, the bytes of a
 * file hashed before it was verified (resolution hashes what it loads) are
 * remembered, so Node runs exactly the bytes whose hash the source identity
 * records; bytes already verified are never replaced.
 */
export async function hashFile(path: string): Promise<string> {
  const bytes = await readFile(path);
  if (native && !verified.has(path)) verified.set(path, bytes);
  return sha256Digest(bytes);
}

/**
 * Imports a module file with this process's loaders (type stripping where
 * enabled, else or after a failure jiti) and returns its namespace, or with
 * `defaultOnly` its default export (the namespace when it has none).
 * `keep(error)` names errors of the module's own definitions, thrown as
 * they are; any other failure is a `WorkflowLoadError`.
 */
export async function importModuleFile(path: string, defaultOnly: boolean, keep: (error: unknown) => boolean): Promise<unknown> {
  if (native) {
    try {
      const namespace = (await import(pathToFileURL(path).href)) as { default?: unknown };
      counts.native += 1;
      return defaultOnly ? (namespace.default ?? namespace) : namespace;
    } catch (error) {
      if (keep(error)) throw error;
      const code = (error as { code?: unknown } | null)?.code;
      counts.fellBack.push(typeof code === "string" ? code : error instanceof Error ? error.name : "error");
    }
  }
  try {
    const exported = await loader().import(path, defaultOnly ? { default: true } : {});
    counts.jiti += 1;
    return exported;
  } catch (error) {
    if (keep(error)) throw error;
    const message = error instanceof Error ? error.message : String(error);
    throw new WorkflowLoadError(`cannot load ${path}: ${message}`);
  }
}

/** Loads a workflow file and returns its default export, which must be a `defineWorkflow` value. */
export async function loadWorkflowFile(path: string): Promise<WorkflowDefinition> {
  const exported = await importModuleFile(path, true, (error) => error instanceof WorkflowDefinitionError);
  if (!isWorkflowDefinition(exported)) {
    throw new WorkflowDefinitionError(`${path} must default-export defineWorkflow({...})`);
  }
  return exported;
}

/** The compile host that loads includes from disk relative to `projectPath`. */
export function fileCompileHost(projectPath: string): CompileHost {
  return {
    hashFile,
    async resolveInclude(ref, fromPath) {
      const resolved = await resolveWorkflowRef(ref, {
        projectPath,
        ...(fromPath !== undefined ? { baseDir: includeBaseDir(fromPath) } : {}),
      });
      if (resolved.kind === "builtin") {
        const { id, revision, definition } = resolved.builtin;
        return { definition, source: { kind: "builtin", id, revision } };
      }
      const hash = await hashFile(resolved.path);
      const definition = await loadWorkflowFile(resolved.path);
      return { definition, source: { kind: "file", path: resolved.path, hash } };
    },
  };
}

/** Loads and compiles the workflow file at `path` (its hash taken before it is loaded). */
export async function loadAndCompile(path: string, projectPath: string): Promise<CompiledWorkflow> {
  const hash = await hashFile(path);
  const definition = await loadWorkflowFile(path);
  const root: LoadedWorkflow = { definition, source: { kind: "file", path, hash } };
  return compileWorkflow(root, fileCompileHost(projectPath));
}
