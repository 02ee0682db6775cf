/**
 * Node constructors. Each validates its options eagerly and returns a frozen
 * node; `shell`, `decision` and `humanDecision` are sugar over the five real
 * node types (reference §1.4).
 */
import { checkId, fail, hasControl, hasOwn, isRecord } from "./errors.js";
import {
  type ActionContext,
  type AgentOptions,
  type CheckpointOptions,
  type CommonNodeOptions,
  type ComputeOptions,
  type FunctionActionOptions,
  type HumanChoice,
  type HumanChoices,
  type HumanDecisionOptions,
  NODE_BRAND,
  type NodeContext,
  type NodeKind,
  type NodeType,
  type NotifyOptions,
  type ShellOptions,
  type TextInputSpec,
  type WorkflowEdge,
  type WorkflowNode,
} from "./types.js";

function checkCommon(options: CommonNodeOptions<never>, what: string): void {
  const timeout = options.timeoutMs;
  if (timeout !== undefined && timeout !== null && typeof timeout !== "function") {
    if (typeof timeout !== "number" || !Number.isFinite(timeout) || timeout <= 0) {
      fail(`${what}: timeoutMs must be a finite positive number, null, or a function`);
    }
  }
  if (options.statusDetail !== undefined) {
    if (typeof options.statusDetail !== "string" || options.statusDetail.length > 512) {
      fail(`${what}: statusDetail must be a string of at most 512 characters`);
    }
  }
}

function makeNode<I>(
  kind: NodeKind,
  nodeType: NodeType,
  options: CommonNodeOptions<I>,
  extra: Partial<Pick<WorkflowNode<I>, "sugar" | "humanDecision">> = {},
): WorkflowNode<I> {
  const node: WorkflowNode<I> = {
    [NODE_BRAND]: "node",
    kind,
    nodeType,
    options,
    ...(options.timeoutMs !== undefined ? { timeoutMs: options.timeoutMs } : {}),
    ...(options.statusDetail !== undefined ? { statusDetail: options.statusDetail } : {}),
    ...extra,
  };
  return Object.freeze(node);
}

function requireOptions(options: unknown, what: string): asserts options is Record<string, unknown> {
  if (!isRecord(options)) {
    fail(`${what} needs an options object`);
  }
}

function requireFunction(value: unknown, what: string): void {
  if (typeof value !== "function") {
    fail(`${what} must be a function`);
  }
}

const THINKING_LEVELS: ReadonlySet<string> = new Set(["off", "minimal", "low", "medium", "high", "xhigh"]);
const PROVIDER_NAME = /^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$/;
const MODEL_NAME = /^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}$/;

function checkExpectedOutput(value: unknown): void {
  if (value === undefined || typeof value === "string") return;
  if (!isRecord(value) || value.kind !== "assistant-message") {
    fail('agent(): expectedOutput must be a string or {kind: "assistant-message", maxChars?}');
  }
  for (const key of Object.keys(value)) {
    if (key !== "kind" && key !== "maxChars") fail(`agent(): expectedOutput has an unknown field ${JSON.stringify(key)}`);
  }
  if (value.maxChars !== undefined && (!Number.isInteger(value.maxChars) || (value.maxChars as number) <= 0)) {
    fail("agent(): expectedOutput.maxChars must be a positive integer");
  }
}

/** Checks `{provider?, model?, thinking?}` (the AgentModel of the runner.v1 protocol). */
export function checkAgentModel(value: unknown, what: string): void {
  if (value === undefined) return;
  if (!isRecord(value)) fail(`${what} must be {provider?, model?, thinking?}`);
  for (const [key, field] of Object.entries(value)) {
    if (key === "provider") {
      if (typeof field !== "string" || !PROVIDER_NAME.test(field)) fail(`${what}.provider must be a provider name such as "anthropic"`);
    } else if (key === "model") {
      if (typeof field !== "string" || !MODEL_NAME.test(field)) fail(`${what}.model must be a model id such as "claude-sonnet-4-5"`);
    } else if (key === "thinking") {
      if (typeof field !== "string" || !THINKING_LEVELS.has(field)) fail(`${what}.thinking must be one of ${[...THINKING_LEVELS].join(", ")}`);
    } else {
      fail(`${what} has an unknown field ${JSON.stringify(key)} (provider, model, thinking)`);
    }
  }
}

/** An agent step: the model completes it through the step contract. */
export function agent<I = unknown>(options: AgentOptions<I>): WorkflowNode<I> {
  requireOptions(options, "agent()");
  if (typeof options.prompt !== "string" && typeof options.prompt !== "function") {
    fail("agent(): prompt must be a string or a function");
  }
  if (typeof options.prompt === "string" && options.prompt.trim() === "") {
    fail("agent(): prompt must not be empty");
  }
  checkExpectedOutput(options.expectedOutput);
  if (options.validate !== undefined) requireFunction(options.validate, "agent(): validate");
  checkAgentModel(options.model, "agent(): model");
  checkCommon(options, "agent()");
  return makeNode("agent", "agent", options);
}

/** A pure function of the context; its return value is the output. It may run again after a crash. */
export function compute<I = unknown>(options: ComputeOptions<I>): WorkflowNode<I> {
  requireOptions(options, "compute()");
  requireFunction(options.run, "compute(): run");
  checkCommon(options, "compute()");
  return makeNode("compute", "compute", options);
}

/** A notification to the run's origin session; its output is the server's receipt. */
export function notify<I = unknown>(options: NotifyOptions<I>): WorkflowNode<I> {
  requireOptions(options, "notify()");
  if (typeof options.message !== "string" && typeof options.message !== "function") {
    fail("notify(): message must be a string or a function");
  }
  if (typeof options.message === "string" && options.message.trim() === "") {
    fail("notify(): message must not be empty");
  }
  if (options.kind !== undefined && options.kind !== "progress" && options.kind !== "final") {
    fail('notify(): kind must be "progress" or "final"');
  }
  checkCommon(options, "notify()");
  return makeNode("notify", "notify", options);
}

/** A side-effecting function, run once per visit through a managed effect; it may publish updates. */
export function action<I = unknown>(options: FunctionActionOptions<I>): WorkflowNode<I>;
/** A shell action (same as `shell`). */
export function action<I = unknown>(options: ShellOptions<I>): WorkflowNode<I>;
export function action<I = unknown>(options: FunctionActionOptions<I> | ShellOptions<I>): WorkflowNode<I> {
  requireOptions(options, "action()");
  const hasRun = hasOwn(options, "run");
  const hasExec = hasOwn(options, "exec");
  if (hasRun === hasExec) {
    fail("action(): give exactly one of run or exec");
  }
  if (hasExec) {
    return shell(options as ShellOptions<I>);
  }
  requireFunction((options as FunctionActionOptions<I>).run, "action(): run");
  checkCommon(options, "action()");
  return makeNode("action", "action", options);
}

/** A command run in its own process group, through a managed effect. */
export function shell<I = unknown>(options: ShellOptions<I>): WorkflowNode<I> {
  requireOptions(options, "shell()");
  if (hasOwn(options, "run")) {
    fail("shell(): give exec, not run");
  }
  requireFunction(options.exec, "shell(): exec");
  if (options.parse !== undefined) requireFunction(options.parse, "shell(): parse");
  if (options.updates !== undefined) {
    if (!isRecord(options.updates)) fail("shell(): updates must be an object");
    requireFunction(options.updates.parseLine, "shell(): updates.parseLine");
    const streams = options.updates.streams;
    if (streams !== undefined) {
      if (!Array.isArray(streams) || streams.length === 0 || streams.some((s) => s !== "stdout" && s !== "stderr")) {
        fail('shell(): updates.streams must be a non-empty list of "stdout" and "stderr"');
      }
    }
  }
  checkCommon(options, "shell()");
  return makeNode("shell", "action", options);
}

/** Ends the run `waiting`; a continuation run follows its edge. */
export function checkpoint<I = unknown>(options: CheckpointOptions<I> = {}): WorkflowNode<I> {
  requireOptions(options, "checkpoint()");
  if (options.summary !== undefined && typeof options.summary !== "string") {
    fail("checkpoint(): summary must be a string");
  }
  if (options.run !== undefined) requireFunction(options.run, "checkpoint(): run");
  checkCommon(options, "checkpoint()");
  return makeNode("checkpoint", "checkpoint", options);
}

const SIMPLE_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;

function checkChoices(choices: unknown, what: string): asserts choices is readonly string[] {
  if (!Array.isArray(choices) || choices.length === 0) {
    fail(`${what}: choices must be a non-empty list`);
  }
  const seen = new Set<string>();
  for (const choice of choices) {
    if (typeof choice !== "string" || choice === "") {
      fail(`${what}: every choice must be a non-empty string`);
    }
    if (seen.has(choice)) {
      fail(`${what}: choice ${JSON.stringify(choice)} is listed twice`);
    }
    seen.add(choice);
  }
}

/** Options of `decision`: an agent that picks one of `choices`. */
export interface DecisionOptions<I, C extends string> extends Omit<AgentOptions<I>, "prompt" | "expectedOutput" | "validate"> {
  question: string | ((ctx: NodeContext<I>) => string | Promise<string>);
  choices: readonly C[];
  field?: string;
}

/** An agent node that answers by picking exactly one choice, with a short reason. */
export function decision<I = unknown, const C extends string = string>(options: DecisionOptions<I, C>): WorkflowNode<I> {
  requireOptions(options, "decision()");
  checkChoices(options.choices, "decision()");
  const field = options.field ?? "route";
  if (typeof field !== "string" || !SIMPLE_KEY.test(field)) {
    fail("decision(): field must be a simple key");
  }
  if (typeof options.question !== "string" && typeof options.question !== "function") {
    fail("decision(): question must be a string or a function");
  }
  const choices: readonly string[] = [...options.choices];
  const listed = choices.map((choice) => JSON.stringify(choice)).join(" | ");
  const question = options.question;
  const { question: _question, choices: _choices, field: _field, ...agentOptions } = options;
  const node = agent<I>({
    ...agentOptions,
    prompt: async (ctx) => {
      const text = typeof question === "function" ? await question(ctx) : question;
      return `${text.trim()}\n\nAnswer by picking exactly one of: ${listed}. Include a short "reason" for the choice.`;
    },
    expectedOutput: `{ ${JSON.stringify(field)}: ${listed}, "reason": "short justification" }`,
    validate: (output) => {
      if (!isRecord(output) || typeof output[field] !== "string" || !choices.includes(output[field])) {
        throw new Error(`the output must be an object whose ${JSON.stringify(field)} is one of ${listed}`);
      }
      return output;
    },
  });
  return Object.freeze({ ...node, sugar: { kind: "decision" as const, field, choices } });
}

/** The switch edge of a `decision`: exhaustive over its choices. */
export function decisionEdge<const C extends string>(options: {
  from: string;
  choices: readonly C[];
  field?: string;
  cases: { readonly [K in C]: string };
}): WorkflowEdge {
  checkChoices(options.choices, "decisionEdge()");
  const field = options.field ?? "route";
  if (!SIMPLE_KEY.test(field)) fail("decisionEdge(): field must be a simple key");
  const cases: Record<string, string> = {};
  for (const choice of options.choices) {
    const target = (options.cases as Record<string, string>)[choice];
    if (typeof target !== "string" || !hasOwn(options.cases, choice)) {
      fail(`decisionEdge(): no case for choice ${JSON.stringify(choice)}`);
    }
    cases[choice] = target;
  }
  for (const key of Object.keys(options.cases)) {
    if (!options.choices.includes(key as C)) fail(`decisionEdge(): case ${JSON.stringify(key)} is not a choice`);
  }
  return { from: options.from, switch: { on: `$.${field}`, cases } };
}

const CHOICE_ID = /^[A-Za-z_][A-Za-z0-9_-]{0,127}$/;

/** A text input for a human choice. */
export function textInput(options: { name: string; prompt: string; minLength?: number; maxLength?: number }): TextInputSpec {
  requireOptions(options, "textInput()");
  if (typeof options.name !== "string" || !SIMPLE_KEY.test(options.name)) fail("textInput(): name must be a simple key");
  if (typeof options.prompt !== "string" || options.prompt.trim() === "" || hasControl(options.prompt)) {
    fail("textInput(): prompt must be a non-empty string without control characters");
  }
  const minLength = options.minLength ?? 1;
  const maxLength = options.maxLength ?? 4000;
  if (!Number.isInteger(minLength) || minLength < 0 || !Number.isInteger(maxLength) || maxLength < Math.max(1, minLength)) {
    fail("textInput(): minLength and maxLength must be integers with 0 <= minLength <= maxLength, maxLength >= 1");
  }
  return Object.freeze({ kind: "text" as const, name: options.name, prompt: options.prompt, minLength, maxLength });
}

/** One human choice: a label and an optional text input. */
export function choice(options: { label: string; input?: TextInputSpec }): HumanChoice {
  requireOptions(options, "choice()");
  if (typeof options.label !== "string" || options.label.trim() === "" || hasControl(options.label)) {
    fail("choice(): label must be a non-empty string without control characters");
  }
  if (options.input !== undefined && (!isRecord(options.input) || options.input.kind !== "text")) {
    fail("choice(): input must come from textInput()");
  }
  return Object.freeze({ label: options.label, ...(options.input ? { input: options.input } : {}) });
}

/** The choice set of a human decision: ids `^[A-Za-z_][A-Za-z0-9_-]{0,127}$`, unique labels. */
export function defineHumanChoices<const C extends string>(choices: { readonly [K in C]: HumanChoice }): HumanChoices<C> {
  if (!isRecord(choices)) fail("defineHumanChoices() needs an object of choices");
  const ids = Object.keys(choices) as C[];
  if (ids.length === 0) fail("defineHumanChoices(): at least one choice is required");
  const labels = new Set<string>();
  for (const id of ids) {
    if (!CHOICE_ID.test(id)) fail(`defineHumanChoices(): choice id ${JSON.stringify(id)} must match ${CHOICE_ID.source}`);
    const entry = (choices as Record<string, HumanChoice>)[id];
    if (!isRecord(entry) || typeof entry.label !== "string") fail(`defineHumanChoices(): choice ${id} must come from choice()`);
    if (labels.has(entry.label)) fail(`defineHumanChoices(): label ${JSON.stringify(entry.label)} is used twice`);
    labels.add(entry.label);
  }
  return Object.freeze({ [NODE_BRAND]: "humanChoices" as const, ids, choices: Object.freeze({ ...choices }) });
}

/** A checkpoint that waits for a verified human decision. */
export function humanDecision<I = unknown, C extends string = string>(options: HumanDecisionOptions<I, C>): WorkflowNode<I> {
  requireOptions(options, "humanDecision()");
  if (typeof options.audience !== "function" && (typeof options.audience !== "string" || options.audience.trim() === "")) {
    fail("humanDecision(): audience must be a non-empty string or a function");
  }
  if (!isRecord(options.choices) || options.choices[NODE_BRAND] !== "humanChoices") {
    fail("humanDecision(): choices must come from defineHumanChoices()");
  }
  requireFunction(options.request, "humanDecision(): request");
  if (options.onTimeout !== undefined && typeof options.onTimeout !== "function") {
    const timeout = options.onTimeout;
    if (!isRecord(timeout) || !Number.isFinite(timeout.afterMs) || timeout.afterMs <= 0) {
      fail("humanDecision(): onTimeout.afterMs must be a positive number");
    }
    if (!options.choices.ids.includes(timeout.response?.choice as C)) {
      fail("humanDecision(): onTimeout.response.choice must be one of the choices");
    }
  }
  checkCommon(options, "humanDecision()");
  return makeNode("checkpoint", "checkpoint", options as unknown as CommonNodeOptions<I>, {
    sugar: { kind: "humanDecision", choices: [...options.choices.ids] },
    humanDecision: options as unknown as HumanDecisionOptions<I>,
  });
}

/** The switch edge of a human decision: exhaustive, on `$.choice`. */
export function humanDecisionEdge<const C extends string>(options: {
  from: string;
  choices: HumanChoices<C>;
  cases: { readonly [K in C]: string };
}): WorkflowEdge {
  if (!isRecord(options.choices) || options.choices[NODE_BRAND] !== "humanChoices") {
    fail("humanDecisionEdge(): choices must come from defineHumanChoices()");
  }
  const cases: Record<string, string> = {};
  for (const id of options.choices.ids) {
    const target = (options.cases as Record<string, string>)[id];
    if (typeof target !== "string" || !hasOwn(options.cases, id)) fail(`humanDecisionEdge(): no case for choice ${id}`);
    cases[id] = target;
  }
  for (const key of Object.keys(options.cases)) {
    if (!options.choices.ids.includes(key as C)) fail(`humanDecisionEdge(): case ${JSON.stringify(key)} is not a choice`);
  }
  return { from: options.from, switch: { on: "$.choice", cases } };
}

/** True for a value made by a node constructor. */
export function isWorkflowNode(value: unknown): value is WorkflowNode {
  return isRecord(value) && (value as { [NODE_BRAND]?: unknown })[NODE_BRAND] === "node";
}

/** Re-exported for node-id checks in other modules. */
export { checkId };
export type { ActionContext };
