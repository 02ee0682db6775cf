/**
 * `defineWorkflow` and `includeWorkflow`: eager shape validation (reference
 * §1.2). Graph rules are checked when the workflow is compiled (`graph.ts`).
 */
import { STABLE_ID_PATTERN, checkId, fail, hasOwn, isRecord } from "./errors.js";
import { checkAgentModel, isWorkflowNode } from "./nodes.js";
import {
  DEFINITION_BRAND,
  INCLUDE_BRAND,
  type IncludeContract,
  type NodeContext,
  type WorkflowDefinition,
  type WorkflowEdge,
  type WorkflowInclude,
  type WorkflowSpec,
} from "./types.js";

/** Names a workflow may not have: they are `/workflow` subcommands. */
export const RESERVED_WORKFLOW_NAMES: readonly string[] = ["answer", "cancel", "list", "pause", "resume", "status"];

const SWITCH_PATH = /^\$(?:|output|result)\.[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$/;

function checkEdge(edge: unknown, index: number): asserts edge is WorkflowEdge {
  const what = `edges[${index}]`;
  if (!isRecord(edge)) fail(`${what} must be an object`);
  if (typeof edge.from !== "string" || edge.from === "") fail(`${what}.from must be a node id`);
  const plain = hasOwn(edge, "to");
  const isSwitch = hasOwn(edge, "switch");
  if (plain === isSwitch) fail(`${what} needs exactly one of to or switch`);
  if (plain) {
    if (typeof edge.to !== "string" || edge.to === "") fail(`${what}.to must be a node id`);
    return;
  }
  const sw = edge.switch;
  if (!isRecord(sw) || typeof sw.on !== "string" || !isRecord(sw.cases)) {
    fail(`${what}.switch must be {on, cases}`);
  }
  if (!SWITCH_PATH.test(sw.on)) {
    fail(`${what}.switch.on must be $.<path>, $output.<path> or $result.<path> with simple dotted segments (got ${JSON.stringify(sw.on)})`);
  }
  if (Object.keys(sw.cases).length === 0) fail(`${what}.switch.cases must not be empty`);
  for (const [key, target] of Object.entries(sw.cases)) {
    if (typeof target !== "string" || target === "") fail(`${what}.switch.cases[${JSON.stringify(key)}] must be a node id`);
  }
}

/** Defines a workflow. Validates its shape now; its graph is checked when it is compiled. */
export function defineWorkflow<I = unknown>(spec: WorkflowSpec<I>): WorkflowDefinition<I> {
  if (!isRecord(spec)) fail("defineWorkflow() needs an options object");
  if (typeof spec.name !== "string" || spec.name.trim() === "") fail("defineWorkflow(): name is required");
  if (spec.name.length > 256) fail("defineWorkflow(): name is longer than 256 characters");
  if (RESERVED_WORKFLOW_NAMES.includes(spec.name)) {
    fail(`defineWorkflow(): ${JSON.stringify(spec.name)} is a reserved name (${RESERVED_WORKFLOW_NAMES.join(", ")})`);
  }
  const what = `workflow ${JSON.stringify(spec.name)}`;
  if (spec.source !== undefined && (typeof spec.source !== "string" || !spec.source.startsWith("file:"))) {
    fail(`${what}: source must be import.meta.url (a file: URL)`);
  }
  if (spec.contractId !== undefined && (typeof spec.contractId !== "string" || !STABLE_ID_PATTERN.test(spec.contractId))) {
    fail(`${what}: contractId must match ${STABLE_ID_PATTERN.source}`);
  }
  if (spec.input !== undefined && typeof spec.input !== "function") fail(`${what}: input must be a parser function`);
  if (spec.title !== undefined && typeof spec.title !== "string" && typeof spec.title !== "function") {
    fail(`${what}: title must be a string or a function`);
  }
  if (
    spec.presentationPrompt !== undefined &&
    typeof spec.presentationPrompt !== "string" &&
    typeof spec.presentationPrompt !== "function"
  ) {
    fail(`${what}: presentationPrompt must be a string or a function`);
  }
  if (typeof spec.startAt !== "string" || spec.startAt === "") fail(`${what}: startAt is required`);
  if (!isRecord(spec.nodes) || Object.keys(spec.nodes).length === 0) fail(`${what}: nodes must be a non-empty object`);
  for (const [id, node] of Object.entries(spec.nodes)) {
    checkId(id, `${what}: node id`);
    if (!isWorkflowNode(node)) fail(`${what}: node ${id} must be made by a node constructor (agent, compute, …)`);
  }
  const includes = spec.includes ?? {};
  if (!isRecord(includes)) fail(`${what}: includes must be an object`);
  for (const [mount, include] of Object.entries(includes)) {
    checkId(mount, `${what}: mount name`);
    if (hasOwn(spec.nodes, mount)) fail(`${what}: mount ${mount} collides with a node of the same id`);
    if (!isRecord(include) || (include as { [INCLUDE_BRAND]?: unknown })[INCLUDE_BRAND] !== true) {
      fail(`${what}: include ${mount} must be made by includeWorkflow()`);
    }
  }
  const exits = spec.exits ?? {};
  if (!isRecord(exits)) fail(`${what}: exits must be an object`);
  for (const [name, exit] of Object.entries(exits)) {
    checkId(name, `${what}: exit name`);
    if (!isRecord(exit) || typeof exit.from !== "string") fail(`${what}: exit ${name} needs from`);
    if (exit.validate !== undefined && typeof exit.validate !== "function") fail(`${what}: exit ${name}.validate must be a function`);
  }
  const edges = spec.edges ?? [];
  if (!Array.isArray(edges)) fail(`${what}: edges must be a list`);
  edges.forEach((edge, index) => checkEdge(edge, index));
  checkAgentModel(spec.model, "defineWorkflow(): model");
  if (spec.maxSteps !== undefined && (!Number.isInteger(spec.maxSteps) || spec.maxSteps <= 0 || spec.maxSteps > 4294967295)) {
    fail(`${what}: maxSteps must be a positive integer`);
  }
  const definition = {
    ...spec,
    [DEFINITION_BRAND]: true as const,
    nodes: Object.freeze({ ...spec.nodes }),
    edges: Object.freeze(edges.map((edge) => Object.freeze({ ...edge }))),
    includes: Object.freeze({ ...includes }),
    exits: Object.freeze({ ...exits }),
  };
  return Object.freeze(definition) as WorkflowDefinition<I>;
}

/** True for a value made by `defineWorkflow` (in any copy of this package). */
export function isWorkflowDefinition(value: unknown): value is WorkflowDefinition {
  return isRecord(value) && (value as { [DEFINITION_BRAND]?: unknown })[DEFINITION_BRAND] === true;
}

/** Options of an include. */
export interface IncludeOptions<I> {
  /** Maps the parent's context to the child's raw input (then the child's `input` parser runs). */
  input?: (ctx: NodeContext<I>) => unknown;
}

/**
 * Mounts a child workflow: a direct import (`includeWorkflow(child, {input})`),
 * or a reference resolved when the parent is compiled
 * (`includeWorkflow({workflow: "name" | "./path.workflow.ts" | "builtin:id", input, contract})`).
 */
export function includeWorkflow<I = unknown>(child: WorkflowDefinition, options?: IncludeOptions<I>): WorkflowInclude<I>;
export function includeWorkflow<I = unknown>(
  options: { workflow: string; contract?: IncludeContract } & IncludeOptions<I>,
): WorkflowInclude<I>;
export function includeWorkflow<I = unknown>(
  target: WorkflowDefinition | ({ workflow: string; contract?: IncludeContract } & IncludeOptions<I>),
  options: IncludeOptions<I> = {},
): WorkflowInclude<I> {
  if (isWorkflowDefinition(target)) {
    if (options.input !== undefined && typeof options.input !== "function") fail("includeWorkflow(): input must be a function");
    return Object.freeze({
      [INCLUDE_BRAND]: true as const,
      definition: target,
      ...(options.input ? { input: options.input } : {}),
    });
  }
  if (!isRecord(target) || typeof target.workflow !== "string" || target.workflow.trim() === "") {
    fail("includeWorkflow() needs a workflow definition or {workflow: name | path | builtin:id}");
  }
  if (target.input !== undefined && typeof target.input !== "function") fail("includeWorkflow(): input must be a function");
  const contract = target.contract;
  if (contract !== undefined) {
    if (!isRecord(contract) || !Array.isArray(contract.exits)) fail("includeWorkflow(): contract needs exits");
    if (contract.id !== undefined && (typeof contract.id !== "string" || !STABLE_ID_PATTERN.test(contract.id))) {
      fail(`includeWorkflow(): contract.id must match ${STABLE_ID_PATTERN.source}`);
    }
    for (const exit of contract.exits) checkId(exit, "includeWorkflow(): contract exit");
    if (contract.input !== undefined && typeof contract.input !== "boolean") fail("includeWorkflow(): contract.input must be a boolean");
  }
  return Object.freeze({
    [INCLUDE_BRAND]: true as const,
    ref: target.workflow,
    ...(contract ? { contract: Object.freeze({ ...contract, exits: [...contract.exits] }) } : {}),
    ...(target.input ? { input: target.input } : {}),
  });
}
