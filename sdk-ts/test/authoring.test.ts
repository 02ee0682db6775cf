import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  type CompileHost,
  type LoadedWorkflow,
  type WorkflowDefinition,
  action,
  agent,
  appendStepContract,
  checkpoint,
  choice,
  compileWorkflow,
  compute,
  decision,
  decisionEdge,
  defineHumanChoices,
  defineWorkflow,
  humanDecision,
  humanDecisionEdge,
  includeWorkflow,
  notify,
  parseTolerantJson,
  normalizeOutput,
  shell,
  textInput,
} from "../src/index.js";

const noop = compute({ run: () => null });

const host = (defs: Record<string, WorkflowDefinition> = {}): CompileHost => ({
  hashFile: async (path) => `sha256:${"0".repeat(63)}${path.length % 10}`,
  resolveInclude: async (ref) => {
    const definition = defs[ref];
    if (!definition) throw new Error(`no ${ref}`);
    return { definition, source: { kind: "file", path: `/w/${ref}.workflow.ts`, hash: `sha256:${"a".repeat(64)}` } };
  },
});

const root = (definition: WorkflowDefinition): LoadedWorkflow => ({
  definition,
  source: { kind: "file", path: "/w/root.workflow.ts", hash: `sha256:${"b".repeat(64)}` },
});

describe("defineWorkflow", () => {
  it("rejects each reserved name", () => {
    for (const name of ["answer", "cancel", "list", "pause", "resume", "status"]) {
      assert.throws(() => defineWorkflow({ name, startAt: "a", nodes: { a: noop } }), /reserved name/);
    }
  });

  it("requires a name, startAt and nodes, and a positive integer maxSteps", () => {
    assert.throws(() => defineWorkflow({ name: "", startAt: "a", nodes: { a: noop } }), /name is required/);
    assert.throws(() => defineWorkflow({ name: "w", startAt: "a", nodes: {} }), /nodes must be a non-empty object/);
    assert.throws(() => defineWorkflow({ name: "w", startAt: "a", nodes: { a: noop }, maxSteps: 0 }), /maxSteps/);
    assert.throws(() => defineWorkflow({ name: "w", startAt: "a", nodes: { a: noop }, maxSteps: 2.5 }), /maxSteps/);
    assert.throws(() => defineWorkflow({ name: "w", startAt: "a", nodes: { a: noop }, contractId: "-bad" }), /contractId/);
  });

  it("checks node ids: pattern, the __piw_ prefix, Object.prototype members", () => {
    for (const id of ["a/b", "1a", "a.b", "__piw_x", "toString", "__proto__", "constructor"]) {
      assert.throws(() => defineWorkflow({ name: "w", startAt: id, nodes: { [id]: noop } }), WorkflowError, id);
    }
    assert.doesNotThrow(() => defineWorkflow({ name: "w", startAt: "_a-b_1", nodes: { "_a-b_1": noop } }));
  });

  it("rejects nodes not made by a constructor, malformed edges and switch paths", () => {
    assert.throws(() => defineWorkflow({ name: "w", startAt: "a", nodes: { a: { run: () => 1 } as never } }), /node constructor/);
    assert.throws(
      () => defineWorkflow({ name: "w", startAt: "a", nodes: { a: noop }, edges: [{ from: "a" } as never] }),
      /exactly one of to or switch/,
    );
    assert.throws(
      () => defineWorkflow({ name: "w", startAt: "a", nodes: { a: noop }, edges: [{ from: "a", switch: { on: "route", cases: { x: "a" } } }] }),
      /switch.on must be/,
    );
  });
});

const WorkflowError = /must|shadows|__piw_/;

describe("graph checks (at compile)", () => {
  const compileOf = (definition: WorkflowDefinition) => compileWorkflow(root(definition), host());

  it("startAt must exist", async () => {
    await assert.rejects(compileOf(defineWorkflow({ name: "w", startAt: "x", nodes: { a: noop } })), /startAt "x" is not a node/);
  });

  it("every edge target must exist (own properties only)", async () => {
    await assert.rejects(
      compileOf(defineWorkflow({ name: "w", startAt: "a", nodes: { a: noop }, edges: [{ from: "a", to: "toString" }] })),
      /unknown node "toString"/,
    );
  });

  it("at most one outgoing edge per node", async () => {
    const definition = defineWorkflow({
      name: "w",
      startAt: "a",
      nodes: { a: noop, b: noop, c: noop },
      edges: [
        { from: "a", to: "b" },
        { from: "a", to: "c" },
      ],
    });
    await assert.rejects(compileOf(definition), /more than one outgoing edge/);
  });

  it("every node must be reachable from startAt", async () => {
    const definition = defineWorkflow({ name: "w", startAt: "a", nodes: { a: noop, b: noop } });
    await assert.rejects(compileOf(definition), /node b is not reachable from a/);
  });

  it("an included child must name an exit for each terminal node", async () => {
    const child = defineWorkflow({
      name: "child",
      startAt: "x",
      nodes: { x: noop, y: noop, z: noop },
      edges: [{ from: "x", switch: { on: "$.k", cases: { a: "y", b: "z" } } }],
      exits: { done: { from: "y" } },
    });
    const parent = defineWorkflow({ name: "parent", startAt: "m", nodes: { end: noop }, includes: { m: includeWorkflow(child) }, edges: [{ from: "m.done", to: "end" }] });
    await assert.rejects(compileOf(parent), /terminal node z names no exit/);
  });

  it("rejects include cycles with the whole chain", async () => {
    const defs: Record<string, WorkflowDefinition> = {};
    defs.a = defineWorkflow({
      name: "a",
      startAt: "s",
      nodes: { s: noop },
      includes: { m: includeWorkflow({ workflow: "b" }) },
      edges: [{ from: "s", to: "m" }],
      exits: { out: { from: "m.out" } },
    });
    defs.b = defineWorkflow({
      name: "b",
      startAt: "s",
      nodes: { s: noop },
      includes: { n: includeWorkflow({ workflow: "a" }) },
      edges: [{ from: "s", to: "n" }],
      exits: { out: { from: "n.out" } },
    });
    await assert.rejects(compileWorkflow({ definition: defs.a, source: { kind: "file", path: "/w/a.workflow.ts", hash: `sha256:${"a".repeat(64)}` } }, host(defs)), (error: Error) => {
      assert.match(error.message, /include cycle: a \(\/w\/a\.workflow\.ts\) -> b \(\/w\/b\.workflow\.ts\) -> a \(\/w\/a\.workflow\.ts\)/);
      return true;
    });
  });

  it("a dynamic include must match its contract", async () => {
    const child = defineWorkflow({ name: "child", contractId: "c.v1", startAt: "x", nodes: { x: noop }, exits: { done: { from: "x" } } });
    const parentWith = (contract: { id?: string; exits: string[]; input?: boolean }) =>
      defineWorkflow({ name: "p", startAt: "m", nodes: { end: noop }, includes: { m: includeWorkflow({ workflow: "child", contract }) }, edges: [{ from: "m.done", to: "end" }] });
    await assert.doesNotReject(compileWorkflow(root(parentWith({ id: "c.v1", exits: ["done"], input: false })), host({ child })));
    await assert.rejects(compileWorkflow(root(parentWith({ id: "c.v2", exits: ["done"] })), host({ child })), /contractId "c.v1", not "c.v2"/);
    await assert.rejects(compileWorkflow(root(parentWith({ exits: ["done", "other"] })), host({ child })), /exits \[done\], not \[done, other\]/);
    await assert.rejects(compileWorkflow(root(parentWith({ exits: ["done"], input: true })), host({ child })), /input parser/);
  });
});

describe("compilation", () => {
  it("emits the kernel topology: node types, timeout kinds, edges, maxSteps", async () => {
    const definition = defineWorkflow({
      name: "w",
      maxSteps: 7,
      startAt: "a",
      nodes: {
        a: agent({ prompt: "do it" }),
        b: compute({ run: () => 1, timeoutMs: 5000 }),
        c: notify({ message: "hi", timeoutMs: null }),
        d: action({ run: () => 1, timeoutMs: () => 10 }),
        e: shell({ exec: () => ({ command: "true" }) }),
        f: checkpoint(),
      },
      edges: [
        { from: "a", to: "b" },
        { from: "b", switch: { on: "$result.outcome", cases: { ok: "c", failed: "d" } } },
        { from: "c", to: "e" },
        { from: "d", to: "e" },
        { from: "e", to: "f" },
      ],
    });
    const compiled = await compileWorkflow(root(definition), host());
    assert.deepEqual(compiled.topology, {
      startAt: "a",
      maxSteps: 7,
      nodes: [
        { id: "a", nodeType: "agent", timeout: { kind: "default" }, mountPath: [] },
        { id: "b", nodeType: "compute", timeout: { kind: "ms", ms: 5000 }, mountPath: [] },
        { id: "c", nodeType: "notify", timeout: { kind: "none" }, mountPath: [] },
        { id: "d", nodeType: "action", timeout: { kind: "dynamic" }, mountPath: [] },
        { id: "e", nodeType: "action", timeout: { kind: "default" }, mountPath: [] },
        { id: "f", nodeType: "checkpoint", timeout: { kind: "default" }, mountPath: [] },
      ],
      edges: [
        { kind: "plain", from: "a", to: "b" },
        { kind: "switch", from: "b", on: "$result.outcome", cases: { ok: "c", failed: "d" } },
        { kind: "plain", from: "c", to: "e" },
        { kind: "plain", from: "d", to: "e" },
        { kind: "plain", from: "e", to: "f" },
      ],
      mounts: [],
    });
    assert.deepEqual(compiled.source, { root: root(definition).source, mounted: [] });
  });

  it("flattens includes: entry `mount`, children `mount/local`, exits `mount/__piw_exit_<exit>`, mounts sorted", async () => {
    const child = defineWorkflow({
      name: "review",
      source: "file:///w/review.workflow.ts",
      maxSteps: 10,
      startAt: "check",
      nodes: { check: noop, approve: noop, reject: noop },
      edges: [{ from: "check", switch: { on: "$.ok", cases: { true: "approve", false: "reject" } } }],
      exits: { approved: { from: "approve" }, rejected: { from: "reject" } },
    });
    const parent = defineWorkflow({
      name: "parent",
      startAt: "draft",
      nodes: { draft: noop, publish: noop, revise: noop },
      includes: { zeta: includeWorkflow(child), m: includeWorkflow(child) },
      edges: [
        { from: "draft", to: "m" },
        { from: "m.approved", to: "zeta" },
        { from: "m.rejected", to: "revise" },
        { from: "zeta.approved", to: "publish" },
        { from: "zeta.rejected", to: "revise" },
      ],
    });
    const compiled = await compileWorkflow(root(parent), host());
    const ids = compiled.topology.nodes.map((node) => `${node.id}|${node.mountPath.join("/")}|${node.includeTransition ?? ""}`);
    assert.deepEqual(ids, [
      "draft||",
      "publish||",
      "revise||",
      "zeta|zeta|entry",
      "zeta/check|zeta|",
      "zeta/approve|zeta|",
      "zeta/reject|zeta|",
      "zeta/__piw_exit_approved|zeta|exit",
      "zeta/__piw_exit_rejected|zeta|exit",
      "m|m|entry",
      "m/check|m|",
      "m/approve|m|",
      "m/reject|m|",
      "m/__piw_exit_approved|m|exit",
      "m/__piw_exit_rejected|m|exit",
    ]);
    assert.deepEqual(compiled.topology.mounts, [
      { mountPath: ["m"], entry: "m", maxSteps: 10 },
      { mountPath: ["zeta"], entry: "zeta", maxSteps: 10 },
    ]);
    const edges = compiled.topology.edges.map((edge) => (edge.kind === "plain" ? `${edge.from}->${edge.to}` : `${edge.from}?${Object.values(edge.cases).join(",")}`));
    for (const expected of [
      "zeta->zeta/check",
      "zeta/check?zeta/approve,zeta/reject",
      "zeta/approve->zeta/__piw_exit_approved",
      "m/__piw_exit_approved->zeta",
      "m/__piw_exit_rejected->revise",
      "draft->m",
      "zeta/__piw_exit_approved->publish",
    ]) {
      assert.ok(edges.includes(expected), `${expected} in ${edges.join(" ")}`);
    }
    assert.equal(compiled.source.mounted.length, 2, "one mounted source per mount, in mount-path order");
    assert.deepEqual(compiled.source.mounted[0], { kind: "file", path: "/w/review.workflow.ts", hash: compiled.source.mounted[1]?.kind === "file" ? compiled.source.mounted[1].hash : "" });
  });

  it("parents cannot name child-internal nodes or leave a mount without an exit", async () => {
    const child = defineWorkflow({ name: "c", startAt: "x", nodes: { x: noop }, exits: { done: { from: "x" } } });
    const bad = defineWorkflow({ name: "p", startAt: "m", nodes: { end: noop }, includes: { m: includeWorkflow(child) }, edges: [{ from: "m", to: "end" }] });
    await assert.rejects(compileWorkflow(root(bad), host()), /leave a mount through one of its exits: m.done/);
    const internal = defineWorkflow({ name: "p", startAt: "m", nodes: { end: noop }, includes: { m: includeWorkflow(child) }, edges: [{ from: "m.done", to: "m/x" }] });
    await assert.rejects(compileWorkflow(root(internal), host()), /unknown node "m\/x"/);
  });

  it("the definition digest is sha256 of the canonical snapshot: stable, and it changes with the graph", async () => {
    const make = (ms: number) =>
      defineWorkflow({ name: "w", startAt: "a", nodes: { a: compute({ run: () => 1, timeoutMs: ms }), b: noop }, edges: [{ from: "a", to: "b" }] });
    const one = await compileWorkflow(root(make(1000)), host());
    const again = await compileWorkflow(root(make(1000)), host());
    const other = await compileWorkflow(root(make(2000)), host());
    assert.match(one.definitionDigest, /^sha256:[0-9a-f]{64}$/);
    assert.equal(one.definitionDigest, again.definitionDigest);
    assert.notEqual(one.definitionDigest, other.definitionDigest);
  });
});

describe("node constructors", () => {
  it("validate their options eagerly", () => {
    assert.throws(() => agent({ prompt: "" }), /prompt must not be empty/);
    assert.throws(() => compute({} as never), /run must be a function/);
    assert.throws(() => action({ run: () => 1, exec: () => ({ command: "x" }) } as never), /exactly one of run or exec/);
    assert.throws(() => shell({ exec: () => ({ command: "x" }), updates: { streams: ["stdin"] } as never }), /updates/);
    assert.throws(() => compute({ run: () => 1, timeoutMs: 0 }), /timeoutMs/);
    assert.throws(() => compute({ run: () => 1, timeoutMs: Number.POSITIVE_INFINITY }), /timeoutMs/);
    assert.throws(() => notify({ message: "x", kind: "loud" as never }), /kind/);
    assert.equal(action({ exec: () => ({ command: "true" }) }).kind, "shell");
  });

  it("decision builds an agent with the choice prompt, expected output and validation", async () => {
    const node = decision({ question: "Ship it?", choices: ["yes", "no"] as const });
    assert.equal(node.nodeType, "agent");
    const options = node.options as { prompt: (ctx: never) => Promise<string>; expectedOutput: string; validate: (o: unknown) => unknown };
    assert.equal(
      await options.prompt({} as never),
      'Ship it?\n\nAnswer by picking exactly one of: "yes" | "no". Include a short "reason" for the choice.',
    );
    assert.equal(options.expectedOutput, '{ "route": "yes" | "no", "reason": "short justification" }');
    assert.deepEqual(options.validate({ route: "yes", reason: "ok" }), { route: "yes", reason: "ok" });
    assert.throws(() => options.validate({ route: "maybe" }), /one of/);
    assert.throws(() => decision({ question: "q", choices: ["a", "a"] }), /listed twice/);
    assert.throws(() => decision({ question: "q", choices: [] }), /non-empty/);
    assert.throws(() => decision({ question: "q", choices: ["a"], field: "a.b" }), /simple key/);
  });

  it("decisionEdge is exhaustive and switches on $.<field>", () => {
    assert.deepEqual(decisionEdge({ from: "d", choices: ["yes", "no"], cases: { yes: "a", no: "b" } }), {
      from: "d",
      switch: { on: "$.route", cases: { yes: "a", no: "b" } },
    });
    assert.throws(() => decisionEdge({ from: "d", choices: ["yes", "no"], cases: { yes: "a" } as never }), /no case for choice "no"/);
  });

  it("human decisions: choices, labels, text inputs, the exhaustive edge, and the topology flag", async () => {
    const choices = defineHumanChoices({
      approve: choice({ label: "Approve" }),
      change: choice({ label: "Request changes", input: textInput({ name: "feedback", prompt: "What should change?" }) }),
    });
    assert.deepEqual(choices.ids, ["approve", "change"]);
    assert.throws(() => defineHumanChoices({ a: choice({ label: "Same" }), b: choice({ label: "Same" }) }), /used twice/);
    assert.throws(() => defineHumanChoices({ "1x": choice({ label: "x" }) }), /choice id/);
    assert.throws(() => choice({ label: "bad\u0007" }), /control characters/);
    assert.throws(() => textInput({ name: "x", prompt: "p", minLength: 5, maxLength: 2 }), /minLength/);
    assert.deepEqual(humanDecisionEdge({ from: "gate", choices, cases: { approve: "a", change: "b" } }), {
      from: "gate",
      switch: { on: "$.choice", cases: { approve: "a", change: "b" } },
    });
    assert.throws(() => humanDecisionEdge({ from: "gate", choices, cases: { approve: "a" } as never }), /no case for choice change/);
    const gate = humanDecision({ audience: "operator", choices, request: () => ({ title: "Ship?" }) });
    assert.equal(gate.nodeType, "checkpoint");
    const definition = defineWorkflow({
      name: "w",
      startAt: "gate",
      nodes: { gate, a: noop, b: noop },
      edges: [humanDecisionEdge({ from: "gate", choices, cases: { approve: "a", change: "b" } })],
    });
    const compiled = await compileWorkflow(root(definition), host());
    assert.deepEqual(compiled.topology.nodes[0], { id: "gate", nodeType: "checkpoint", timeout: { kind: "default" }, mountPath: [], humanDecision: true });
  });
});

describe("step contract", () => {
  it("is appended to the trimmed prompt exactly", () => {
    const text = appendStepContract("Review the change.  \n\n", "autoimplement", "review", "6f9d-1", '{ "route": "clean" | "issues_found" }');
    assert.equal(
      text,
      [
        "Review the change.",
        "",
        "---",
        "Workflow step contract (workflow: autoimplement, step: review, attempt: 6f9d-1)",
        "",
        "While this step is active, you may publish non-completing updates with:",
        '{"action": "update", "step": "review", "attempt": "6f9d-1", "update": {"type": "...", "key": "...", "data": {...}}}',
        "Complete this step by calling the `workflow` tool exactly once with:",
        '{"action": "submit", "step": "review", "attempt": "6f9d-1", "output": <your result>}',
        'Expected output: { "route": "clean" | "issues_found" }',
        "The step is complete only after the workflow tool accepts the output.",
        "If the tool reports a validation error, correct the output and call it again.",
      ].join("\n"),
    );
    assert.match(appendStepContract("p", "w", "s", "a", undefined), /\nExpected output: a JSON object with your result\n/);
    assert.match(appendStepContract("p", "w", "s", "a", undefined), /workflow step contract \(workflow: w, step: s, attempt: a\)/i);
  });
});

describe("outputs", () => {
  it("string agent outputs are parsed tolerantly", () => {
    assert.deepEqual(parseTolerantJson('{"a":1}'), { a: 1 });
    assert.deepEqual(parseTolerantJson('Here:\n```json\n{"route": "x"}\n```\nthanks'), { route: "x" });
    assert.deepEqual(parseTolerantJson('I think {"route": "y", "n": [1, {"b": "}"}]} is right'), { route: "y", n: [1, { b: "}" }] });
    assert.deepEqual(parseTolerantJson("first {not json} then [1, 2]"), [1, 2]);
    assert.equal(parseTolerantJson("plain words"), "plain words");
    assert.equal(parseTolerantJson(`${"{x ".repeat(70)}{"late": 1}`), `${"{x ".repeat(70)}{"late": 1}`, "at most 64 candidates are scanned");
  });

  it("outputs must survive a JSON round trip; undefined becomes null", () => {
    assert.equal(normalizeOutput(undefined, "o"), null);
    assert.deepEqual(normalizeOutput({ a: [1, "x", null] }, "o"), { a: [1, "x", null] });
    assert.throws(() => normalizeOutput({ when: new Date(0) }, "o"), /JSON round-trip/);
    assert.throws(() => normalizeOutput({ n: Number.NaN }, "o"), /JSON round-trip/);
    assert.throws(() => normalizeOutput({ u: undefined }, "o"), /JSON round-trip/);
    assert.throws(() => normalizeOutput(() => 1, "o"), /JSON round-trip/);
  });
});
