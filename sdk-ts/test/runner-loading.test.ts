/**
 * How the runner loads workflow modules: the transform cache in the state
 * directory (used on a second start, never for changed bytes, refused and
 * rebuilt when an entry is not intact or not private) and the fallback from
 * Node's type stripping to jiti. Every case spawns the real runner bin on
 * this Node (run the suite with Node 20 and with Node 22) and reads what it
 * logs: `loaded workflow modules: …; transform cache: U used, S stored, R refused`.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { spawn } from "node:child_process";
import { chmodSync, chownSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import nodeModule from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, before, describe, it } from "node:test";
import type { RunnerMessage, WorkerLaunch } from "../src/generated/types.js";
import { FrameDecoder } from "../src/protocol/framing.js";
import { decodeRunnerFrame, encodeLaunch } from "../src/protocol/messages.js";
import { MAX_ENTRIES, PRUNED_ENTRIES, TransformCache, cacheKey } from "../src/runner/transform-cache.js";
import { RUNNER_BIN } from "../test-support/server.js";

/** Whether this Node strips types itself (22.18+): then the runner imports with it, else with jiti. */
const NODE_STRIPS_TYPES =
  Boolean((process.features as { typescript?: unknown }).typescript) && typeof (nodeModule as { registerHooks?: unknown }).registerHooks === "function";

/** Gives `path` to another user (needs root, as on the development machines and CI: then it cannot be skipped by accident). */
function giveAway(path: string): void {
  assert.equal(process.getuid?.(), 0, "this case gives a file to another user: run the suite as root");
  chownSync(path, 4242, 4242);
}

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), "piw-loading-"));
});
after(() => rmSync(dir, { recursive: true, force: true }));

interface Started {
  messages: RunnerMessage[];
  code: number | null;
  stderr: string;
}

/** Spawns the runner with `launch` (after `nodeArgs`); a run-mode runner is sent EOF once it said runner.ready or run.parked (it then exits). */
async function start(launch: WorkerLaunch, state: string, nodeArgs: string[] = []): Promise<Started> {
  const child = spawn(process.execPath, [...nodeArgs, RUNNER_BIN], {
    cwd: launch.projectPath,
    stdio: ["pipe", "pipe", "pipe"],
    env: { ...process.env, PI_WORKFLOWS_HOME: state, HOME: join(dir, "home") },
  });
  const messages: RunnerMessage[] = [];
  const decoder = new FrameDecoder();
  let stderr = "";
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  child.stdout.on("data", (chunk: Buffer) => {
    decoder.push(chunk);
    for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
      const message = decodeRunnerFrame(frame);
      messages.push(message);
      // A run-mode runner waits for an answer to what it said first, a resolver for its run's launch: EOF ends either (it exits).
      if (message.type === "runner.ready" || message.type === "run.parked" || message.type === "resolve.result") child.stdin.end();
    }
  });
  child.stdin.write(encodeLaunch(launch));
  child.stdin.write("\n");
  const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
  return { messages, code, stderr };
}

const base = (projectPath: string): Omit<WorkerLaunch, "mode"> => ({
  schema: "pi-workflows.worker-launch.v1",
  runId: "run-1",
  generation: 1,
  runnerEpoch: "re-1",
  projectPath,
  protocolVersion: 1,
});

/** Resolves `workflow` in `root`; returns the resolve.result and the start's log. */
async function resolve(root: string, workflow: string, state: string): Promise<{ result: Extract<RunnerMessage, { type: "resolve.result" }>; stderr: string }> {
  const started = await start({ ...base(root), mode: "resolve", resolve: { workflow, input: null } }, state);
  const result = started.messages[0];
  assert.equal(result?.type, "resolve.result", `${JSON.stringify(started.messages)}\n${started.stderr}`);
  return { result: result as Extract<RunnerMessage, { type: "resolve.result" }>, stderr: started.stderr };
}

/** A resolution of `workflow` in `root`, then a run-mode start of what it resolved (its runner.ready, then EOF); both after `nodeArgs`. */
async function resolveThenRun(root: string, workflow: string, state: string, nodeArgs: string[] = []): Promise<{ resolved: Started; run: Started }> {
  const resolved = await start({ ...base(root), mode: "resolve", resolve: { workflow, input: null } }, state, nodeArgs);
  assert.equal(resolved.messages[0]?.type, "resolve.result", resolved.stderr);
  const result = resolved.messages[0] as Extract<RunnerMessage, { type: "resolve.result" }>;
  const run = await start({ ...base(root), mode: "run", workflowSource: result.workflowSource, definitionDigest: result.definitionDigest }, state, nodeArgs);
  assert.deepEqual(run.messages.map((message) => message.type), ["runner.ready"], run.stderr);
  return { resolved, run };
}

interface CacheLine {
  used: number;
  stored: number;
  refused: number;
  line: string;
}

/** The runner's `transform cache:` counts. */
function cacheLine(stderr: string): CacheLine {
  const match = /loaded workflow modules: .*transform cache: (\d+) used, (\d+) stored, (\d+) refused.*/.exec(stderr);
  assert.ok(match, `no transform cache line in the runner log:\n${stderr}`);
  return { used: Number(match[1]), stored: Number(match[2]), refused: Number(match[3]), line: match[0] };
}

function project(name: string, files: Record<string, string>): string {
  const root = join(dir, name);
  mkdirSync(join(root, ".pi", "workflows"), { recursive: true });
  for (const [file, text] of Object.entries(files)) writeFileSync(join(root, ".pi", "workflows", file), text);
  return root;
}

/** The cache entries under a state directory (none before the first start made the directory). */
function entriesOf(state: string): string[] {
  const transform = join(state, "cache", "transform");
  if (!existsSync(transform)) return [];
  return readdirSync(transform)
    .filter((name) => name.endsWith(".entry"))
    .map((name) => join(transform, name));
}

const named = (name: string, extra = ""): string =>
  `import { compute, defineWorkflow } from "@pi-workflows/sdk";\n${extra}export default defineWorkflow({ name: ${JSON.stringify(name)}, startAt: "a", nodes: { a: compute({ run: () => ({ from: ${JSON.stringify(name)} }) }) } });\n`;

describe("the transform cache", () => {
  it("is filled by the first start and used by the second: resolve stores root, include and helper; run mode uses all three", async () => {
    const state = join(dir, "state-hit");
    const root = project("hit", {
      "helper.ts": `export const greeting: string = "hello";\n`,
      "child.workflow.ts": `import { compute, defineWorkflow } from "@pi-workflows/sdk";\nexport default defineWorkflow({ name: "child", startAt: "x", nodes: { x: compute({ run: () => 1 }) }, exits: { done: { from: "x" } } });\n`,
      "parent.workflow.ts": `import { compute, defineWorkflow, includeWorkflow } from "@pi-workflows/sdk";\nimport { greeting } from "./helper.ts";\ntype Out = { text: string };\nexport default defineWorkflow({ name: "parent", startAt: "a", nodes: { a: compute({ run: (): Out => ({ text: greeting }) }), end: compute({ run: () => 2 }) }, includes: { kid: includeWorkflow({ workflow: "child" }) }, edges: [{ from: "a", to: "kid" }, { from: "kid.done", to: "end" }] });\n`,
    });
    const first = await resolve(root, "parent", state);
    assert.deepEqual(
      { ...cacheLine(first.stderr), line: undefined },
      { used: 0, stored: 3, refused: 0, line: undefined },
      cacheLine(first.stderr).line,
    );
    assert.equal(first.result.workflowSource.mounted.length, 1);
    const entries = entriesOf(state);
    assert.equal(entries.length, 3);
    assert.equal(statSync(join(state, "cache", "transform")).mode & 0o777, 0o700);
    for (const entry of entries) assert.equal(statSync(entry).mode & 0o777, 0o600, entry);

    const run = await start(
      { ...base(root), mode: "run", workflowSource: first.result.workflowSource, definitionDigest: first.result.definitionDigest },
      state,
    );
    assert.deepEqual(run.messages.map((message) => message.type), ["runner.ready"], run.stderr);
    assert.deepEqual({ ...cacheLine(run.stderr), line: undefined }, { used: 3, stored: 0, refused: 0, line: undefined }, cacheLine(run.stderr).line);
    assert.equal(entriesOf(state).length, 3);
  });

  it("checks the saved hashes before it loads anything: a source changed after its resolution parks the run, and nothing is loaded from the cache", async () => {
    const state = join(dir, "state-run-changed");
    const root = project("run-changed", { "edit.workflow.ts": named("before") });
    const first = await resolve(root, "edit", state);
    assert.equal(cacheLine(first.stderr).stored, 1);
    writeFileSync(join(root, ".pi", "workflows", "edit.workflow.ts"), named("after"));

    const run = await start(
      { ...base(root), mode: "run", workflowSource: first.result.workflowSource, definitionDigest: first.result.definitionDigest },
      state,
    );
    assert.deepEqual(
      run.messages.map((message) => [message.type, message.type === "run.parked" ? message.reason : null]),
      [["run.parked", "workflowSourceChanged"]],
      run.stderr,
    );
    assert.match(run.stderr, /source changed before loading/);
    assert.doesNotMatch(run.stderr, /loaded workflow modules:/, "nothing was loaded, natively, by jiti or from the cache");
    assert.equal(entriesOf(state).length, 1);
  });

  it("never serves a changed source from the entry of its old bytes", async () => {
    const state = join(dir, "state-changed");
    const root = project("changed", { "edit.workflow.ts": named("before") });
    const first = await resolve(root, "edit", state);
    assert.equal(first.result.workflowName, "before");
    assert.equal(cacheLine(first.stderr).stored, 1);

    writeFileSync(join(root, ".pi", "workflows", "edit.workflow.ts"), named("after"));
    const second = await resolve(root, "edit", state);
    assert.equal(second.result.workflowName, "after");
    assert.deepEqual({ ...cacheLine(second.stderr), line: undefined }, { used: 0, stored: 1, refused: 0, line: undefined }, cacheLine(second.stderr).line);
    assert.equal(entriesOf(state).length, 2, "the old bytes keep their own entry");

    // Back to the old bytes: their entry is used again.
    writeFileSync(join(root, ".pi", "workflows", "edit.workflow.ts"), named("before"));
    const third = await resolve(root, "edit", state);
    assert.equal(third.result.workflowName, "before");
    assert.equal(cacheLine(third.stderr).used, 1);
  });

  /** Each case damages the one entry of a resolved workflow "intact"; the next start must refuse it, rebuild it and resolve the real source. */
  const tampering: { name: string; reason: RegExp; damage: (entry: string, state: string) => void }[] = [
    {
      name: "an edited body (its digest no longer matches)",
      reason: /its digest does not match/,
      damage: (entry) => writeFileSync(entry, readFileSync(entry, "utf8").replaceAll('"intact"', '"tampered"')),
    },
    {
      name: "a torn entry (cut short)",
      reason: /its digest does not match|no valid header/,
      damage: (entry) => {
        const text = readFileSync(entry, "utf8");
        writeFileSync(entry, text.slice(0, text.indexOf("\n") + 20));
      },
    },
    {
      name: "an intact entry of another source under this key (a foreign entry)",
      reason: /made for another key/,
      damage: (entry, state) => {
        const other = entriesOf(state).find((path) => path !== entry) as string;
        copyFileSync(other, entry);
      },
    },
    {
      name: "an entry readable by others",
      reason: /readable or writable by others/,
      damage: (entry) => chmodSync(entry, 0o644),
    },
    {
      name: "an entry of another user",
      reason: /another user's file/,
      damage: (entry) => giveAway(entry),
    },
    {
      name: "a symlink to an intact entry",
      reason: /a symlink/,
      damage: (entry, state) => {
        const elsewhere = join(state, "elsewhere.entry");
        copyFileSync(entry, elsewhere);
        chmodSync(elsewhere, 0o600);
        rmSync(entry);
        symlinkSync(elsewhere, entry);
      },
    },
  ];

  for (const [index, tamper] of tampering.entries()) {
    it(`refuses, removes and rebuilds ${tamper.name}`, async () => {
      const state = join(dir, `state-tamper-${index}`);
      const root = project(`tamper-${index}`, { "intact.workflow.ts": named("intact"), "other.workflow.ts": named("other") });
      const entryOf = async (workflow: string): Promise<string> => {
        const before = new Set(entriesOf(state));
        await resolve(root, workflow, state);
        const added = entriesOf(state).filter((path) => !before.has(path));
        assert.equal(added.length, 1);
        return added[0] as string;
      };
      const entry = await entryOf("intact");
      await entryOf("other");
      tamper.damage(entry, state);

      const refused = await resolve(root, "intact", state);
      assert.equal(refused.result.workflowName, "intact");
      assert.deepEqual(refused.result.topology.nodes.map((node) => node.id), ["a"]);
      const line = cacheLine(refused.stderr);
      assert.deepEqual({ used: line.used, stored: line.stored, refused: line.refused }, { used: 0, stored: 1, refused: 1 }, line.line);
      assert.match(line.line, tamper.reason);
      const stats = statSync(entry, { throwIfNoEntry: true });
      assert.ok(stats.isFile(), "the rebuilt entry is a regular file");
      assert.equal(stats.mode & 0o777, 0o600);

      const again = await resolve(root, "intact", state);
      assert.deepEqual({ ...cacheLine(again.stderr), line: undefined }, { used: 1, stored: 0, refused: 0, line: undefined }, cacheLine(again.stderr).line);
    });
  }

  it("makes a cache directory open to others private again, and does not use one of another user", async () => {
    const state = join(dir, "state-dir");
    const root = project("dir", { "plain.workflow.ts": named("plain") });
    await resolve(root, "plain", state);
    const transform = join(state, "cache", "transform");
    chmodSync(transform, 0o777);
    const reopened = await resolve(root, "plain", state);
    assert.equal(statSync(transform).mode & 0o777, 0o700);
    assert.equal(cacheLine(reopened.stderr).used, 1);

    giveAway(transform);
    const off = await resolve(root, "plain", state);
    assert.equal(off.result.workflowName, "plain");
    assert.match(off.stderr, /loaded workflow modules: .*; transform cache: off \(cache\/transform belongs to another user\)/);
  });
});

describe("the transform cache's bound", () => {
  it(`keeps at most ${MAX_ENTRIES} entries: the store past the bound removes the oldest until ${PRUNED_ENTRIES} remain`, () => {
    const state = join(dir, "state-bound");
    const cache = TransformCache.open(state);
    assert.ok(cache instanceof TransformCache, JSON.stringify(cache));
    const keys = Array.from({ length: MAX_ENTRIES + 1 }, (_, i) => cacheKey("bound", String(i)));
    for (const [i, key] of keys.entries()) {
      cache.put(key, { format: "module", body: `export default ${i};\n` });
      // Distinct modification times, oldest first, whatever the file system's timestamp resolution.
      const at = new Date(Date.UTC(2026, 0, 1) + i * 1000);
      if (i < MAX_ENTRIES) utimesSync(join(cache.dir, `${key}.entry`), at, at);
    }
    assert.equal(entriesOf(state).length, PRUNED_ENTRIES);
    assert.equal(cache.get(keys[0] as string), null, "the oldest entry was removed");
    assert.deepEqual(cache.get(keys[MAX_ENTRIES] as string), { format: "module", body: `export default ${MAX_ENTRIES};\n` }, "the newest entry was kept");
    assert.equal(cache.counts.stored, MAX_ENTRIES + 1);
  });
});

describe("loading with Node's type stripping", () => {
  it("falls back to jiti for what type stripping cannot load (an enum), and the workflow works", async () => {
    const state = join(dir, "state-enum");
    const root = project("enum", {
      "enum.workflow.ts": `import { compute, defineWorkflow } from "@pi-workflows/sdk";\nenum Greeting { Hello = "hello from an enum" }\nexport default defineWorkflow({ name: "enum", title: () => Greeting.Hello, startAt: "a", nodes: { a: compute({ run: () => Greeting.Hello }) } });\n`,
    });
    for (const start of ["first", "second"]) {
      const { result, stderr } = await resolve(root, "enum", state);
      assert.equal(result.title, "hello from an enum", start);
      const loaders = /loaded workflow modules: ([^;]*);/.exec(stderr)?.[1];
      assert.equal(
        loaders,
        NODE_STRIPS_TYPES
          ? "0 by Node type stripping, 1 by jiti (1 after type stripping failed: ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX)"
          : "0 by Node type stripping, 1 by jiti",
        `${start} start: ${stderr}`,
      );
      // Entries: jiti's transform, and with type stripping the record that it fails (so a later start does not try again).
      const entries = NODE_STRIPS_TYPES ? 2 : 1;
      const line = cacheLine(stderr);
      assert.deepEqual([line.used, line.stored], start === "first" ? [0, entries] : [entries, 0], line.line);
    }
  });

  it("loads plain TypeScript with Node's type stripping where Node has it", async () => {
    const state = join(dir, "state-native");
    const root = project("native", { "typed.workflow.ts": named("typed", "interface Unused { x: number }\nconst label: string = 'typed';\nvoid label;\n") });
    const { result, stderr } = await resolve(root, "typed", state);
    assert.equal(result.workflowName, "typed");
    assert.match(stderr, NODE_STRIPS_TYPES ? /loaded workflow modules: 1 by Node type stripping, 0 by jiti;/ : /loaded workflow modules: 0 by Node type stripping, 1 by jiti;/);
  });
});

describe("the validators of each channel", () => {
  /** A preload that prints, at exit, the CommonJS modules the process loaded (the generated validators are CommonJS, required on first use). */
  const probe = (): string => {
    const path = join(dir, "probe.cjs");
    writeFileSync(path, `process.on("exit", () => process.stderr.write("loaded-cjs " + JSON.stringify(Object.keys(require.cache)) + "\\n"));\n`);
    return path;
  };
  const validatorModules = (stderr: string): string[] => {
    const line = /^loaded-cjs (.*)$/m.exec(stderr)?.[1];
    assert.ok(line, `no probe line:\n${stderr}`);
    return (JSON.parse(line) as string[]).map((path) => /([a-z]+-validators)\.cjs$/.exec(path)?.[1]).filter((name): name is string => name !== undefined);
  };

  it("a runner loads the runner channel's validators and never the client channel's", async () => {
    const state = join(dir, "state-validators");
    const root = project("validators", { "plain.workflow.ts": named("plain") });
    const { resolved, run } = await resolveThenRun(root, "plain", state, ["--require", probe()]);
    assert.deepEqual(validatorModules(resolved.stderr), ["runner-validators"]);
    assert.deepEqual(validatorModules(run.stderr), ["runner-validators"]);
  });

  it("a client loads the client channel's validators and never the runner channel's", async () => {
    const src = join(dirname(RUNNER_BIN), "..");
    const url = (path: string): string => JSON.stringify(pathToFileURL(join(src, path)).href);
    // The client package and the encoding its connection does for every frame it sends.
    const script = `import ${url("client/index.js")};
import { encodeClient } from ${url("protocol/messages.js")};
const frame = encodeClient({ schema: "pi-workflows.client.v1", type: "request", requestId: "r1", clientId: "c1", operation: "run.cancel", runId: "run-1", idempotencyKey: "k1", payload: {} });
process.stdout.write(String(frame.length));`;
    const child = spawn(process.execPath, ["--require", probe(), "--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
    assert.equal(code, 0, stderr);
    assert.ok(Number(stdout) > 0, `the client frame was encoded: ${stdout} ${stderr}`);
    assert.deepEqual(validatorModules(stderr), ["client-validators"]);
  });
});

describe("what a start loads", () => {
  /** A preload that prints, at exit, whether Node's `child_process` module was loaded (`process.moduleLoadList`). */
  const probe = (): string => {
    const path = join(dir, "probe-builtins.cjs");
    writeFileSync(path, `process.on("exit", () => process.stderr.write("child_process loaded: " + process.moduleLoadList.includes("NativeModule child_process") + "\\n"));\n`);
    return path;
  };
  const childProcessLoaded = (stderr: string): boolean => {
    const line = /^child_process loaded: (true|false)$/m.exec(stderr)?.[1];
    assert.ok(line, `no probe line:\n${stderr}`);
    return line === "true";
  };

  it("a resolver and a run-mode start that spawn nothing never load node:child_process", async () => {
    const state = join(dir, "state-builtins");
    const root = project("builtins", { "plain.workflow.ts": named("plain") });
    const { resolved, run } = await resolveThenRun(root, "plain", state, ["--require", probe()]);
    assert.equal(childProcessLoaded(resolved.stderr), false, resolved.stderr);
    assert.equal(childProcessLoaded(run.stderr), false, run.stderr);
  });
});

describe("the code cache of the runner validators", () => {
  /** The `runner validators: code cache …` lines of a start's log. */
  const codeCacheLines = (stderr: string): string[] => [...stderr.matchAll(/runner validators: code cache (.*)$/gm)].map((match) => match[1] as string);
  const codeEntries = (state: string): string[] => {
    const code = join(state, "cache", "code");
    return existsSync(code) ? readdirSync(code).filter((name) => name.endsWith(".entry")).map((name) => join(code, name)) : [];
  };
  /** A run-mode start of a resolved one-node workflow (its runner.ready, then EOF). */
  const runStart = async (root: string, state: string, result: Extract<RunnerMessage, { type: "resolve.result" }>): Promise<Started> => {
    const run = await start({ ...base(root), mode: "run", workflowSource: result.workflowSource, definitionDigest: result.definitionDigest }, state);
    assert.deepEqual(run.messages.map((message) => message.type), ["runner.ready"], run.stderr);
    return run;
  };

  it("lives in the private cache/code directory: the first start stores it (0600 in a 0700 directory), the next one uses it", async () => {
    const state = join(dir, "state-code");
    const root = project("code", { "plain.workflow.ts": named("plain") });
    const { result, stderr } = await resolve(root, "plain", state);
    assert.deepEqual(codeCacheLines(stderr), ["missed", "stored"]);
    const codeDir = join(state, "cache", "code");
    assert.equal(statSync(codeDir).mode & 0o777, 0o700);
    const [entry, ...more] = codeEntries(state);
    assert.ok(entry !== undefined && more.length === 0, `one entry: ${codeEntries(state).join(", ")}`);
    assert.equal(statSync(entry).mode & 0o777, 0o600);
    const run = await runStart(root, state, result);
    assert.deepEqual(codeCacheLines(run.stderr), ["used"]);
    // The workflow's own modules never go through it: they stay in the transform cache.
    assert.match(run.stderr, /transform cache: 1 used, 0 stored, 0 refused/);
  });

  for (const corruption of [
    { name: "an entry whose body no longer matches its digest", expect: /^refused \(its digest does not match\)$/, corrupt: (text: string) => `${text.slice(0, -8)}AAAAAAAA` },
    {
      name: "an intact entry whose data V8 refuses",
      expect: /^rejected$/,
      corrupt: (text: string) => {
        const header = JSON.parse(text.slice(0, text.indexOf("\n"))) as { digest: string };
        const body = Buffer.from("not V8's cached data").toString("base64");
        header.digest = createHash("sha256").update(body, "utf8").digest("hex");
        return `${JSON.stringify(header)}\n${body}`;
      },
    },
  ]) {
    it(`does not break a start: ${corruption.name} is compiled past and rewritten`, async () => {
      const state = join(dir, `state-code-${corruption.name.length}`);
      const root = project(`code-${corruption.name.length}`, { "plain.workflow.ts": named("plain") });
      const { result } = await resolve(root, "plain", state);
      const [entry] = codeEntries(state);
      assert.ok(entry !== undefined);
      writeFileSync(entry, corruption.corrupt(readFileSync(entry, "utf8")), { mode: 0o600 });
      const run = await runStart(root, state, result);
      const [use, stored] = codeCacheLines(run.stderr);
      assert.match(use ?? "", corruption.expect, run.stderr);
      assert.equal(stored, "stored", run.stderr);
      assert.deepEqual(codeCacheLines((await runStart(root, state, result)).stderr), ["used"]);
    });
  }

  it("is off, and the start works, when cache/code belongs to another user", async () => {
    const state = join(dir, "state-code-foreign");
    const root = project("code-foreign", { "plain.workflow.ts": named("plain") });
    mkdirSync(join(state, "cache", "code"), { recursive: true, mode: 0o700 });
    giveAway(join(state, "cache", "code"));
    const { stderr } = await resolve(root, "plain", state);
    assert.deepEqual(codeCacheLines(stderr), ["off (cache/code belongs to another user)"]);
  });
});
