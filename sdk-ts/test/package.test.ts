/**
 * The production package as npm packs it (`npm pack --dry-run`): what a user
 * installs with `pi install` or `npm install`. It holds no embedded execution
 * fallback: the only packed modules that execute workflow code are the
 * runner's (`dist/runner/`), which the server starts as a supervised child
 * (`pi-workflows-runner`). No entry a client loads in its own process (the Pi
 * extension, the client, the protocol, the authoring API) reaches a runner
 * module or SQLite, and nothing outside `dist/runner/` imports one.
 * (`extension-module-graph.test.ts` checks the extension's source graph; this
 * checks the packed, compiled files.)
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";
import { describe, it } from "node:test";
import { SDK_DIR } from "../test-support/server.js";

interface PackedFile {
  path: string;
}

/** The package's file list, exactly as `npm pack` would write the tarball. */
function packedFiles(): string[] {
  const out = execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts"], { cwd: SDK_DIR, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  const [pack] = JSON.parse(out) as [{ files: PackedFile[] }];
  return pack.files.map((file) => file.path).sort();
}

/** Static, re-export, side-effect and dynamic import specifiers of a compiled module. */
export function specifiers(source: string): string[] {
  const found: string[] = [];
  const patterns = [/\bfrom\s*["']([^"']+)["']/g, /\bimport\s*\(\s*["']([^"']+)["']\s*\)/g, /^\s*import\s*["']([^"']+)["']/gm, /\brequire\s*\(\s*["']([^"']+)["']\s*\)/g];
  for (const pattern of patterns) for (const match of source.matchAll(pattern)) found.push(match[1] as string);
  return found;
}

/**
 * Every packed module reachable from `entry` through relative imports, with
 * the bare specifiers each imports. A relative import of a file that is not
 * packed fails the walk: the installed package would not load.
 */
function packedGraph(entry: string, packed: Set<string>): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  const todo = [entry];
  while (todo.length > 0) {
    const file = todo.pop() as string;
    if (graph.has(file)) continue;
    assert.ok(packed.has(file), `${file} is imported but not in the package`);
    const bare: string[] = [];
    for (const specifier of specifiers(readFileSync(join(SDK_DIR, file), "utf8"))) {
      if (specifier.startsWith(".")) todo.push(normalize(join(dirname(file), specifier)));
      else bare.push(specifier);
    }
    graph.set(file, bare);
  }
  return graph;
}

const manifest = JSON.parse(readFileSync(join(SDK_DIR, "package.json"), "utf8")) as {
  exports: Record<string, { default: string }>;
  bin: Record<string, string>;
  pi: { extensions: string[] };
  dependencies: Record<string, string>;
};
const strip = (path: string): string => relative(".", path);
/** The controller child program (a server child like the runner): the only files outside dist/runner/ that may import the runner's modules. */
const CONTROLLER_CHILD = new Set(["dist/controllers/bin.js", "dist/controllers/child.js"]);

describe("the production package (npm pack --dry-run)", () => {
  it("packs the compiled dist and package.json, and every export, bin and Pi extension it declares", () => {
    assert.ok(existsSync(join(SDK_DIR, "dist", "extension", "index.js")), "build the package first (npm run build)");
    const files = packedFiles();
    assert.deepEqual(files.filter((file) => file !== "package.json" && !file.startsWith("dist/")), []);
    const declared = [...Object.values(manifest.exports).map((target) => target.default), ...Object.values(manifest.bin), ...manifest.pi.extensions].map(strip);
    assert.deepEqual(declared.filter((file) => !files.includes(file)), [], "a declared entry is not packed");
    assert.deepEqual(Object.keys(manifest.dependencies).filter((name) => /sqlite/i.test(name)), []);
  });

  it("holds no embedded execution fallback: in-process entries reach no runner module, no controller child and no SQLite, and only the server's child programs (the runner, the controller child) import the runner", () => {
    const files = packedFiles();
    const packed = new Set(files);
    const inProcess = Object.entries(manifest.exports)
      .filter(([subpath]) => subpath !== "./runner")
      .map(([, target]) => strip(target.default));
    inProcess.push(...manifest.pi.extensions.map(strip));
    assert.ok(inProcess.includes("dist/extension/index.js") && inProcess.includes("dist/client/index.js"), inProcess.join(", "));
    const problems: string[] = [];
    for (const entry of new Set(inProcess)) {
      const graph = packedGraph(entry, packed);
      assert.ok(graph.size > 1, `${entry} reaches nothing: the walk did not follow its imports`);
      for (const [file, bare] of graph) {
        if (file.startsWith("dist/runner/") || CONTROLLER_CHILD.has(file)) problems.push(`${entry} reaches ${file}`);
        for (const specifier of bare) if (/sqlite/i.test(specifier)) problems.push(`${file} (from ${entry}) imports ${specifier}`);
      }
    }
    for (const file of files.filter((name) => name.endsWith(".js") && !name.startsWith("dist/runner/") && !CONTROLLER_CHILD.has(name))) {
      for (const specifier of specifiers(readFileSync(join(SDK_DIR, file), "utf8"))) {
        if (specifier.startsWith(".") && normalize(join(dirname(file), specifier)).startsWith("dist/runner/")) problems.push(`${file} imports ${specifier}`);
        if (specifier.includes("/runner")) problems.push(`${file} imports ${specifier}`);
      }
    }
    assert.deepEqual(problems, []);
    // The runner itself is packed, as the server's child: its bin is a runner module.
    assert.equal(strip(manifest.bin["pi-workflows-runner"] as string), "dist/runner/bin.js");
    // So is the controller child (it loads controller modules with the runner's loader).
    assert.equal(strip(manifest.bin["pi-workflows-controller"] as string), "dist/controllers/bin.js");
    assert.ok([...CONTROLLER_CHILD].every((file) => packed.has(file)), "the controller child is packed");
  });

  it("the walk sees compiled imports of every form (it is not vacuous)", () => {
    const source = `import { a } from "./x.js";\nexport * from "../runner/execute.js";\nimport "./side.js";\nconst m = await import("node:sqlite");\nconst r = require("better-sqlite3");`;
    assert.deepEqual(specifiers(source).sort(), ["../runner/execute.js", "./side.js", "./x.js", "better-sqlite3", "node:sqlite"]);
  });
});
