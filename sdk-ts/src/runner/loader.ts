/**
 * Loading workflow modules with jiti (TypeScript and ESM on Node 20, no
 * build step, no module cache), and compiling a root workflow with its
 * includes. Imports of `@pi-workflows/sdk` (and `pi-workflows`) inside a
 * workflow resolve to this package's own authoring module.
 */
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { createJiti } from "jiti";
import { type CompileHost, type CompiledWorkflow, type LoadedWorkflow, compileWorkflow, sha256Digest } from "../authoring/compile.js";
import { isWorkflowDefinition } from "../authoring/define.js";
import { WorkflowDefinitionError } from "../authoring/errors.js";
import type { WorkflowDefinition } from "../authoring/types.js";
import { includeBaseDir, resolveWorkflowRef } from "./discovery.js";

const SDK_ENTRY = fileURLToPath(new URL("../index.js", import.meta.url));
const RUNNER_ENTRY = fileURLToPath(new URL("./index.js", import.meta.url));
const PROTOCOL_ENTRY = fileURLToPath(new URL("../protocol/index.js", import.meta.url));

/** A module that could not be loaded (syntax, import or evaluation error). */
export class WorkflowLoadError extends Error {
  override readonly name = "WorkflowLoadError";
}

let jiti: ReturnType<typeof createJiti> | undefined;

function loader(): ReturnType<typeof createJiti> {
  jiti ??= createJiti(import.meta.url, {
    moduleCache: false,
    fsCache: false,
    interopDefault: true,
    alias: {
      "@pi-workflows/sdk/runner": RUNNER_ENTRY,
      "@pi-workflows/sdk/protocol": PROTOCOL_ENTRY,
      "@pi-workflows/sdk": SDK_ENTRY,
      "pi-workflows": SDK_ENTRY,
    },
  });
  return jiti;
}

/** `sha256:<hex>` of a file's bytes. */
export async function hashFile(path: string): Promise<string> {
  return sha256Digest(await readFile(path));
}

/** Loads a workflow file and returns its default export, which must be a `defineWorkflow` value. */
export async function loadWorkflowFile(path: string): Promise<WorkflowDefinition> {
  let exported: unknown;
  try {
    exported = await loader().import(path, { default: true });
  } catch (error) {
    if (error instanceof WorkflowDefinitionError) throw error;
    const message = error instanceof Error ? error.message : String(error);
    throw new WorkflowLoadError(`cannot load ${path}: ${message}`);
  }
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
