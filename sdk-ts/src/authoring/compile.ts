/**
 * Compilation: flattens a definition and its includes into the topology the
 * kernel routes on (reference §1.7), plus the definition snapshot, its digest
 * and the source identity.
 *
 * Qualified ids: a root node keeps its id; a child node is `mount/local`; an
 * include's entry node is `mount` and its exit nodes are
 * `mount/__piw_exit_<exit>` (nested mounts repeat the pattern). Entry and
 * exit nodes are compute nodes that belong to their own mount.
 */
import { createHash } from "node:crypto";
import { fileURLToPath } from "node:url";
import type {
  SourceIdentity,
  TimeoutSpec as WireTimeout,
  Topology,
  TopologyEdge,
  TopologyMount,
  TopologyNode,
  WorkflowSource,
} from "../generated/types.js";
import { canonicalString } from "../protocol/canonical.js";
import { IncludeCycleError, WorkflowDefinitionError, fail, hasOwn } from "./errors.js";
import { checkGraph, splitMountExit } from "./graph.js";
import type {
  NodeType,
  WorkflowDefinition,
  WorkflowExit,
  WorkflowInclude,
  WorkflowNode,
} from "./types.js";

/** A definition plus where it came from. */
export interface LoadedWorkflow {
  definition: WorkflowDefinition;
  /** Its source identity, when it has one (a file or a built-in). */
  source?: SourceIdentity;
}

/** What compilation needs from its environment. */
export interface CompileHost {
  /** Resolves a name, path or `builtin:<id>` include; `fromPath` is the including file (paths are relative to its directory). */
  resolveInclude(ref: string, fromPath: string | undefined): Promise<LoadedWorkflow>;
  /** `sha256:<hex>` of a file's bytes. */
  hashFile(path: string): Promise<string>;
}

/** One node of the compiled graph. */
export interface CompiledNode {
  /** The qualified id. */
  id: string;
  /** The id inside its own workflow (`__piw_exit_<exit>` for exits; the mount name for entries). */
  localId: string;
  /** The mounts it sits in, outermost first. */
  mountPath: readonly string[];
  nodeType: NodeType;
  transition?: "entry" | "exit";
  /** The definition whose callbacks run: the node's own workflow; for entry and exit nodes, the child. */
  workflow: WorkflowDefinition;
  /** A real node. */
  node?: WorkflowNode;
  /** Entry: the including workflow and its include. */
  entry?: { parent: WorkflowDefinition; include: WorkflowInclude };
  /** Exit: its name, the child's terminal node (qualified) and validator. */
  exit?: { name: string; from: string; validate?: WorkflowExit["validate"] };
  timeout: WireTimeout;
}

/** One mounted child. */
export interface CompiledMount {
  mountPath: readonly string[];
  entry: string;
  workflow: WorkflowDefinition;
  exits: readonly string[];
  source?: SourceIdentity;
}

/** The result of compiling a workflow. */
export interface CompiledWorkflow {
  definition: WorkflowDefinition;
  topology: Topology;
  nodes: ReadonlyMap<string, CompiledNode>;
  mounts: readonly CompiledMount[];
  source: WorkflowSource;
  /** The definition snapshot the digest covers. */
  snapshot: unknown;
  /** `sha256:<hex>` of the canonical JSON of the snapshot. */
  definitionDigest: string;
}

/** `sha256:<hex>` of `bytes`. */
export function sha256Digest(bytes: Uint8Array | string): string {
  return `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
}

/** The wire timeout of a node's `timeoutMs`. */
export function timeoutOf(timeoutMs: WorkflowNode["timeoutMs"]): WireTimeout {
  if (timeoutMs === undefined) return { kind: "default" };
  if (timeoutMs === null) return { kind: "none" };
  if (typeof timeoutMs === "function") return { kind: "dynamic" };
  return { kind: "ms", ms: Math.ceil(timeoutMs) };
}

const EXIT_PREFIX = "__piw_exit_";

function compareMountPaths(a: readonly string[], b: readonly string[]): number {
  const length = Math.min(a.length, b.length);
  for (let i = 0; i < length; i += 1) {
    const x = a[i] as string;
    const y = b[i] as string;
    if (x !== y) return x < y ? -1 : 1;
  }
  return a.length - b.length;
}

interface Frame {
  definition: WorkflowDefinition;
  label: string;
  path: string | undefined;
}

interface Level {
  /** Qualified id of the level's start. */
  start: string;
  /** Qualified id of each terminal endpoint, by local endpoint name. */
  endpoints: Map<string, string>;
}

class Compiler {
  readonly nodes = new Map<string, CompiledNode>();
  readonly edges: TopologyEdge[] = [];
  readonly mounts: CompiledMount[] = [];

  constructor(private readonly host: CompileHost) {}

  private qualify(mountPath: readonly string[], local: string): string {
    return [...mountPath, local].join("/");
  }

  private addNode(node: CompiledNode): void {
    if (this.nodes.has(node.id)) fail(`compiled node id ${node.id} is used twice`);
    this.nodes.set(node.id, node);
  }

  async level(loaded: LoadedWorkflow, mountPath: readonly string[], stack: readonly Frame[], asChild: boolean): Promise<Level> {
    const definition = loaded.definition;
    const path = loaded.source?.kind === "file" ? loaded.source.path : undefined;
    const label = path ? `${definition.name} (${path})` : definition.name;
    const cycle = stack.findIndex((frame) => frame.definition === definition || (path !== undefined && frame.path === path));
    if (cycle >= 0) {
      throw new IncludeCycleError([...stack.slice(cycle).map((frame) => frame.label), label]);
    }
    const frames = [...stack, { definition, label, path }];
    // Resolve the children first: their exits are part of this level's graph.
    const children = new Map<string, LoadedWorkflow>();
    for (const [mount, include] of Object.entries(definition.includes)) {
      children.set(mount, await this.child(include, path, mount, definition));
    }
    const mountExits = new Map<string, string[]>();
    for (const [mount, child] of children) mountExits.set(mount, Object.keys(child.definition.exits));
    checkGraph(definition, mountExits, asChild);

    for (const [id, node] of Object.entries(definition.nodes)) {
      this.addNode({
        id: this.qualify(mountPath, id),
        localId: id,
        mountPath,
        nodeType: node.nodeType,
        workflow: definition,
        node,
        timeout: timeoutOf(node.timeoutMs),
      });
    }
    const exitIds = new Map<string, string>();
    for (const [mount, child] of children) {
      const childPath = [...mountPath, mount];
      const entryId = this.qualify(mountPath, mount);
      const include = definition.includes[mount] as WorkflowInclude;
      this.addNode({
        id: entryId,
        localId: mount,
        mountPath: childPath,
        nodeType: "compute",
        transition: "entry",
        workflow: child.definition,
        entry: { parent: definition, include },
        timeout: { kind: "default" },
      });
      const inner = await this.level(child, childPath, frames, true);
      this.edges.push({ kind: "plain", from: entryId, to: inner.start });
      const exitNames: string[] = [];
      for (const [name, exit] of Object.entries(child.definition.exits)) {
        const exitId = this.qualify(childPath, `${EXIT_PREFIX}${name}`);
        const from = inner.endpoints.get(exit.from) as string;
        this.addNode({
          id: exitId,
          localId: `${EXIT_PREFIX}${name}`,
          mountPath: childPath,
          nodeType: "compute",
          transition: "exit",
          workflow: child.definition,
          exit: { name, from, ...(exit.validate ? { validate: exit.validate } : {}) },
          timeout: { kind: "default" },
        });
        this.edges.push({ kind: "plain", from, to: exitId });
        exitIds.set(`${mount}.${name}`, exitId);
        exitNames.push(name);
      }
      this.mounts.push({
        mountPath: childPath,
        entry: entryId,
        workflow: child.definition,
        exits: exitNames,
        ...(child.source ? { source: child.source } : {}),
      });
    }
    const resolveSource = (local: string): string => exitIds.get(local) ?? this.qualify(mountPath, local);
    const resolveTarget = (local: string): string => this.qualify(mountPath, local);
    for (const edge of definition.edges) {
      if ("to" in edge) {
        this.edges.push({ kind: "plain", from: resolveSource(edge.from), to: resolveTarget(edge.to) });
      } else {
        const cases: Record<string, string> = {};
        for (const [key, target] of Object.entries(edge.switch.cases)) cases[key] = resolveTarget(target);
        this.edges.push({ kind: "switch", from: resolveSource(edge.from), on: edge.switch.on, cases });
      }
    }
    const endpoints = new Map<string, string>();
    for (const id of Object.keys(definition.nodes)) endpoints.set(id, this.qualify(mountPath, id));
    for (const [local, exitId] of exitIds) endpoints.set(local, exitId);
    return { start: resolveTarget(definition.startAt), endpoints };
  }

  private async child(
    include: WorkflowInclude,
    fromPath: string | undefined,
    mount: string,
    parent: WorkflowDefinition,
  ): Promise<LoadedWorkflow> {
    if (include.definition) {
      const definition = include.definition;
      if (definition.source === undefined) return { definition };
      const path = fileURLToPath(definition.source);
      return { definition, source: { kind: "file", path, hash: await this.host.hashFile(path) } };
    }
    const ref = include.ref as string;
    const loaded = await this.host.resolveInclude(ref, fromPath);
    const contract = include.contract;
    if (contract) {
      const what = `workflow ${JSON.stringify(parent.name)}: include ${mount} (${ref})`;
      const child = loaded.definition;
      if (contract.id !== undefined && child.contractId !== contract.id) {
        fail(`${what} has contractId ${JSON.stringify(child.contractId ?? null)}, not ${JSON.stringify(contract.id)}`);
      }
      const exits = Object.keys(child.exits).sort();
      const wanted = [...contract.exits].sort();
      if (exits.join("\n") !== wanted.join("\n")) {
        fail(`${what} has exits [${exits.join(", ")}], not [${wanted.join(", ")}]`);
      }
      if (contract.input !== undefined && (child.input !== undefined) !== contract.input) {
        fail(`${what} ${child.input !== undefined ? "declares" : "does not declare"} an input parser, unlike its contract`);
      }
    }
    return loaded;
  }
}

function nodeSnapshot(node: CompiledNode): Record<string, unknown> {
  const snapshot: Record<string, unknown> = {
    id: node.id,
    localNodeId: node.localId,
    mountPath: node.mountPath,
    nodeType: node.nodeType,
    timeout: node.timeout,
  };
  if (node.transition) snapshot.includeTransition = node.transition;
  const real = node.node;
  if (real) {
    snapshot.kind = real.kind;
    if (real.statusDetail !== undefined) snapshot.statusDetail = real.statusDetail;
    if (real.sugar) snapshot.sugar = real.sugar;
    const options = real.options as Record<string, unknown>;
    for (const key of ["expectedOutput", "summary", "kind"] as const) {
      const value = options[key];
      if (typeof value === "string") snapshot[key === "kind" ? "notifyKind" : key] = value;
    }
    for (const key of ["prompt", "message"] as const) {
      const value = options[key];
      if (typeof value === "string") snapshot[key] = value;
    }
  }
  if (node.exit) snapshot.exit = { name: node.exit.name, from: node.exit.from };
  return snapshot;
}

/**
 * Compiles `root` (and every include, resolved through `host`): checks the
 * graph rules at each level, rejects include cycles with the full chain, and
 * returns the topology, snapshot, digest and source identity.
 */
export async function compileWorkflow(root: LoadedWorkflow, host: CompileHost): Promise<CompiledWorkflow> {
  const compiler = new Compiler(host);
  const top = await compiler.level(root, [], [], false);
  const definition = root.definition;
  const nodes: TopologyNode[] = [...compiler.nodes.values()].map((node) => ({
    id: node.id,
    nodeType: node.nodeType,
    timeout: node.timeout,
    mountPath: [...node.mountPath],
    ...(node.transition ? { includeTransition: node.transition } : {}),
    ...(node.node?.humanDecision ? { humanDecision: true as const } : {}),
  }));
  const mounts: TopologyMount[] = [...compiler.mounts]
    .sort((a, b) => compareMountPaths(a.mountPath, b.mountPath))
    .map((mount) => ({
      mountPath: [...mount.mountPath],
      entry: mount.entry,
      ...(mount.workflow.maxSteps !== undefined ? { maxSteps: mount.workflow.maxSteps } : {}),
    }));
  const topology: Topology = {
    startAt: top.start,
    ...(definition.maxSteps !== undefined ? { maxSteps: definition.maxSteps } : {}),
    nodes,
    edges: compiler.edges,
    mounts,
  };
  const sortedMounts = [...compiler.mounts].sort((a, b) => compareMountPaths(a.mountPath, b.mountPath));
  const mounted = sortedMounts.flatMap((mount) => (mount.source ? [mount.source] : []));
  if (!root.source) throw new WorkflowDefinitionError(`workflow ${definition.name} has no source identity`);
  const snapshot = {
    schema: "pi-workflows.definition-snapshot.v1",
    workflowName: definition.name,
    ...(definition.contractId !== undefined ? { contractId: definition.contractId } : {}),
    ...(typeof definition.title === "string" ? { title: definition.title } : {}),
    hasInputParser: definition.input !== undefined,
    exits: Object.keys(definition.exits),
    topology,
    nodes: [...compiler.nodes.values()].map(nodeSnapshot),
    composition: {
      mounts: sortedMounts.map((mount) => ({
        mountPath: mount.mountPath,
        workflowName: mount.workflow.name,
        entryNode: mount.entry,
        exits: mount.exits,
        ...(mount.workflow.maxSteps !== undefined ? { maxSteps: mount.workflow.maxSteps } : {}),
      })),
    },
  };
  return {
    definition,
    topology,
    nodes: compiler.nodes,
    mounts: sortedMounts,
    source: { root: root.source, mounted },
    snapshot,
    definitionDigest: sha256Digest(canonicalString(snapshot)),
  };
}

/** True when `id` names a compiled include exit node. */
export function isExitNodeId(id: string): boolean {
  const last = id.slice(id.lastIndexOf("/") + 1);
  return last.startsWith(EXIT_PREFIX);
}

export { splitMountExit, hasOwn };
