/**
 * The extension's module graph has no path to SQLite: every module reachable
 * from `src/extension/index.ts` (static imports, re-exports and dynamic
 * imports, followed through relative paths) imports only Node built-ins and
 * packages that cannot open a database, and no module names `state.sqlite`.
 * (The real-Pi suite shows the same at runtime under strace.)
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { describe, it } from "node:test";
import { SDK_DIR } from "../test-support/server.js";

const ENTRY = join(SDK_DIR, "src", "extension", "index.ts");

/** Bare specifiers the extension may import: none of them can open SQLite. */
const ALLOWED_PACKAGES = new Set(["@earendil-works/pi-coding-agent", "@earendil-works/pi-tui", "typebox", "ajv", "canonicalize"]);
const ALLOWED_BUILTINS = new Set(["node:crypto", "node:net", "node:child_process", "node:fs", "node:os", "node:path", "node:events", "node:timers", "node:url", "node:util", "node:buffer", "node:module"]);

/** `ajv/dist/x.js` → `ajv`, `@scope/name/x` → `@scope/name`. */
function packageOf(specifier: string): string {
  const parts = specifier.split("/");
  return (specifier.startsWith("@") ? parts.slice(0, 2) : parts.slice(0, 1)).join("/");
}

function specifiers(source: string): string[] {
  const found: string[] = [];
  const patterns = [/\bfrom\s+["']([^"']+)["']/g, /\bimport\s*\(\s*["']([^"']+)["']\s*\)/g, /^\s*import\s+["']([^"']+)["']/gm];
  for (const pattern of patterns) for (const match of source.matchAll(pattern)) found.push(match[1] as string);
  return found;
}

/** Every module reachable from `entry`, with the bare specifiers each imports. */
function moduleGraph(entry: string): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  const todo = [entry];
  while (todo.length > 0) {
    const file = todo.pop() as string;
    if (graph.has(file)) continue;
    const source = readFileSync(file, "utf8");
    const bare: string[] = [];
    for (const specifier of specifiers(source)) {
      if (specifier.startsWith(".")) {
        const target = resolve(dirname(file), specifier.replace(/\.js$/, ".ts"));
        assert.ok(existsSync(target), `${relative(SDK_DIR, file)} imports ${specifier}, which is not a source file`);
        todo.push(target);
      } else {
        bare.push(specifier);
      }
    }
    graph.set(file, bare);
  }
  return graph;
}

describe("the extension's module graph", () => {
  it("reaches the client and protocol modules but no SQLite module, and no module names state.sqlite", () => {
    const graph = moduleGraph(ENTRY);
    const files = [...graph.keys()].map((file) => relative(SDK_DIR, file));
    assert.ok(files.includes("src/client/client.ts"), files.join("\n"));
    assert.ok(files.includes("src/extension/coordinator.ts"), files.join("\n"));
    assert.ok(files.length > 10, files.join("\n"));
    // No workflow code runs in Pi's event loop: neither the runner nor the authoring API is reachable.
    assert.deepEqual(files.filter((file) => file.startsWith("src/runner/") || file.startsWith("src/authoring/")), []);
    const problems: string[] = [];
    for (const [file, bare] of graph) {
      const name = relative(SDK_DIR, file);
      for (const specifier of bare) {
        if (/sqlite/i.test(specifier)) problems.push(`${name} imports ${specifier}`);
        else if (!ALLOWED_PACKAGES.has(packageOf(specifier)) && !ALLOWED_BUILTINS.has(specifier)) problems.push(`${name} imports ${specifier}, which is not on the extension's list`);
      }
      if (/state\.sqlite/.test(readFileSync(file, "utf8"))) problems.push(`${name} names state.sqlite`);
    }
    assert.deepEqual(problems, []);
  });

  it("the check sees an import of SQLite (it is not vacuous)", () => {
    assert.deepEqual(specifiers(`import { DatabaseSync } from "node:sqlite";\nconst m = await import("better-sqlite3");`), ["node:sqlite", "better-sqlite3"]);
  });
});
