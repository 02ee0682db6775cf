/**
 * Graph rules of one definition (reference §1.2): `startAt` exists, every
 * edge source and target exists (own properties only), at most one outgoing
 * edge per node, every node is reachable from `startAt`, and an included
 * child names an exit for each of its terminal nodes.
 *
 * Endpoints: a node id; a mount name as a target (its entry); `mount.exit`
 * as a source (the child's exit). Parents cannot name child-internal nodes.
 */
import { fail, hasOwn } from "./errors.js";
import type { WorkflowDefinition, WorkflowEdge } from "./types.js";

/** The exits each mount's child declares. */
export type MountExits = ReadonlyMap<string, readonly string[]>;

/** The ids an edge can lead to from `edge`. */
export function edgeTargets(edge: WorkflowEdge): string[] {
  return "to" in edge ? [edge.to] : Object.values(edge.switch.cases);
}

function isNode(definition: WorkflowDefinition, id: string): boolean {
  return hasOwn(definition.nodes, id);
}

function isMount(definition: WorkflowDefinition, id: string): boolean {
  return hasOwn(definition.includes, id);
}

/** `mount.exit` split, or null when `source` is not an exit endpoint of a declared mount. */
export function splitMountExit(definition: WorkflowDefinition, source: string): { mount: string; exit: string } | null {
  const dot = source.indexOf(".");
  if (dot <= 0) return null;
  const mount = source.slice(0, dot);
  const exit = source.slice(dot + 1);
  return isMount(definition, mount) ? { mount, exit } : null;
}

/**
 * Checks the graph rules of `definition`. `mountExits` gives each mount's
 * child exits; `asChild` adds the rule that every terminal endpoint is named
 * by exactly one exit. Returns the terminal endpoints.
 */
export function checkGraph(definition: WorkflowDefinition, mountExits: MountExits, asChild: boolean): string[] {
  const what = `workflow ${JSON.stringify(definition.name)}`;
  const isSource = (id: string): boolean => {
    if (isNode(definition, id)) return true;
    const split = splitMountExit(definition, id);
    return split !== null && (mountExits.get(split.mount) ?? []).includes(split.exit);
  };
  const isTarget = (id: string): boolean => isNode(definition, id) || isMount(definition, id);
  if (!isTarget(definition.startAt)) fail(`${what}: startAt ${JSON.stringify(definition.startAt)} is not a node`);
  const outgoing = new Map<string, WorkflowEdge>();
  for (const edge of definition.edges) {
    if (!isSource(edge.from)) {
      const hint = isMount(definition, edge.from)
        ? ` (leave a mount through one of its exits: ${(mountExits.get(edge.from) ?? []).map((e) => `${edge.from}.${e}`).join(", ")})`
        : "";
      fail(`${what}: edge from ${JSON.stringify(edge.from)} does not start at a node${hint}`);
    }
    for (const target of edgeTargets(edge)) {
      if (!isTarget(target)) fail(`${what}: edge from ${edge.from} leads to unknown node ${JSON.stringify(target)}`);
    }
    if (outgoing.has(edge.from)) fail(`${what}: node ${edge.from} has more than one outgoing edge`);
    outgoing.set(edge.from, edge);
  }
  // Reachability: a mount's entry reaches each of its exits.
  const reached = new Set<string>();
  const frontier = [definition.startAt];
  while (frontier.length > 0) {
    const id = frontier.pop() as string;
    if (reached.has(id)) continue;
    reached.add(id);
    if (isMount(definition, id)) {
      for (const exit of mountExits.get(id) ?? []) frontier.push(`${id}.${exit}`);
      continue;
    }
    const edge = outgoing.get(id);
    if (edge) frontier.push(...edgeTargets(edge));
  }
  for (const id of [...Object.keys(definition.nodes), ...Object.keys(definition.includes)]) {
    if (!reached.has(id)) fail(`${what}: node ${id} is not reachable from ${definition.startAt}`);
  }
  const terminals: string[] = [];
  for (const id of Object.keys(definition.nodes)) {
    if (!outgoing.has(id)) terminals.push(id);
  }
  for (const mount of Object.keys(definition.includes)) {
    for (const exit of mountExits.get(mount) ?? []) {
      if (!outgoing.has(`${mount}.${exit}`)) terminals.push(`${mount}.${exit}`);
    }
  }
  const exitFrom = new Map<string, string>();
  for (const [name, exit] of Object.entries(definition.exits)) {
    if (!isSource(exit.from)) fail(`${what}: exit ${name} is from unknown node ${JSON.stringify(exit.from)}`);
    if (outgoing.has(exit.from)) fail(`${what}: exit ${name} is from ${exit.from}, which has an outgoing edge (exits leave terminal nodes)`);
    const other = exitFrom.get(exit.from);
    if (other !== undefined) fail(`${what}: exits ${other} and ${name} both leave ${exit.from} (one exit per terminal node)`);
    exitFrom.set(exit.from, name);
  }
  if (asChild) {
    if (Object.keys(definition.exits).length === 0) fail(`${what} is included but names no exits`);
    for (const terminal of terminals) {
      if (!exitFrom.has(terminal)) fail(`${what} is included but its terminal node ${terminal} names no exit`);
    }
  }
  return terminals;
}
