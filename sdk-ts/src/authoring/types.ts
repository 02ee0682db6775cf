/**
 * The authoring model's types: workflow definitions, nodes, edges, includes
 * and the context every node callback receives (reference §1.2–§1.4, §1.7).
 */

/** Brands a value made by `defineWorkflow` (shared across module copies through the global symbol registry). */
export const DEFINITION_BRAND: unique symbol = Symbol.for("pi-workflows.definition") as never;
/** Brands a value made by a node constructor. */
export const NODE_BRAND: unique symbol = Symbol.for("pi-workflows.node") as never;
/** Brands a value made by `includeWorkflow`. */
export const INCLUDE_BRAND: unique symbol = Symbol.for("pi-workflows.include") as never;

/** The engine's five real node types. */
export type NodeType = "agent" | "compute" | "notify" | "action" | "checkpoint";
/** How an attempt ended. */
export type NodeOutcome = "ok" | "failed" | "timed_out" | "cancelled";

/** The latest result record of a node (`results[nodeId]`). */
export interface NodeResult {
  attemptId: string;
  nodeId: string;
  nodeType: string;
  outcome: NodeOutcome;
  startedAt: string;
  finishedAt: string;
  durationMs: number;
  output?: unknown;
  error?: { message: string };
}

/** The narrow run state a callback sees (projected to its include invocation). */
export interface RunStateView<I = unknown> {
  input: I;
  outputs: Record<string, unknown>;
  results: Record<string, NodeResult>;
  /** Real steps taken so far (of the current invocation inside an include). */
  steps: number;
}

/** Facts about the running attempt. */
export interface AttemptInfo {
  runId: string;
  workflowName: string;
  /** The node id local to its workflow. */
  nodeId: string;
  /** The qualified id in the compiled graph (`mount/local` inside includes). */
  qualifiedNodeId: string;
  attemptId: string;
  visit: number;
}

/** What every node callback receives. */
export interface NodeContext<I = unknown> {
  input: I;
  /** `outputs[nodeId]`: the latest `ok` output of each node. */
  outputs: Record<string, unknown>;
  /** `results[nodeId]`: the latest result record of each node. */
  results: Record<string, NodeResult>;
  state: RunStateView<I>;
  /** Aborts on node timeout, cancel, park, or claim loss. */
  signal: AbortSignal;
  attempt: AttemptInfo;
}

/** A workflow update: `type` `[a-z][a-z0-9.-]{0,63}`, `key` `[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}`, `data` a JSON object ≤ 64 KiB. */
export interface WorkflowUpdate {
  type: string;
  key: string;
  data: Record<string, unknown>;
}

/** The receipt of a published update. */
export interface UpdateReceipt {
  updateId: string;
  seq: number;
}

/** A context that can publish updates (function actions). */
export interface ActionContext<I = unknown> extends NodeContext<I> {
  publishUpdate(update: WorkflowUpdate): Promise<UpdateReceipt>;
}

type MaybePromise<T> = T | Promise<T>;

/** A node timeout: milliseconds, `null` for none, or resolved per attempt (30 s bound). Omitted: 15 min. */
export type TimeoutSpec<I = unknown> = number | null | ((ctx: NodeContext<I>) => MaybePromise<number | null>);

/** Fields every node accepts. */
export interface CommonNodeOptions<I = unknown> {
  timeoutMs?: TimeoutSpec<I>;
  statusDetail?: string;
}

/**
 * The Pi model arguments of a headless agent step (`pi --provider --model
 * --thinking`). A node's own wins over its workflow's, which wins over the
 * run's (`pi-workflows start --provider/--model/--thinking`); Pi's own
 * settings decide what none of them names.
 */
export interface AgentModel {
  provider?: string;
  model?: string;
  thinking?: "off" | "minimal" | "low" | "medium" | "high" | "xhigh";
}

/** An agent step whose output is the model's visible reply in the origin session (interactive runs only). */
export interface AssistantMessageOutput {
  kind: "assistant-message";
  maxChars?: number;
}

export interface AgentOptions<I = unknown> extends CommonNodeOptions<I> {
  prompt: string | ((ctx: NodeContext<I>) => MaybePromise<string>);
  /** What the submitted output should be (shown in the step contract), or a visible assistant-message step. */
  expectedOutput?: string | AssistantMessageOutput;
  /** The Pi model arguments of a headless run (overrides the workflow's `model`). */
  model?: AgentModel;
  validate?: (output: unknown, ctx: NodeContext<I>) => MaybePromise<unknown>;
}

export interface ComputeOptions<I = unknown> extends CommonNodeOptions<I> {
  run: (ctx: NodeContext<I>) => MaybePromise<unknown>;
}

export interface NotifyOptions<I = unknown> extends CommonNodeOptions<I> {
  message: string | ((ctx: NodeContext<I>) => MaybePromise<string>);
  kind?: "progress" | "final";
}

export interface FunctionActionOptions<I = unknown> extends CommonNodeOptions<I> {
  run: (ctx: ActionContext<I>) => MaybePromise<unknown>;
}

/** What a shell action runs. */
export interface ShellExecution {
  command: string;
  args?: readonly string[];
  /** Relative to the project directory. */
  cwd?: string;
  /** Merged over the runner's environment. */
  env?: Readonly<Record<string, string>>;
  stdin?: string;
  shell?: boolean;
  allowNonZeroExit?: boolean;
  timeoutMs?: number;
  maxOutputChars?: number;
}

/** A shell action's raw result (its output unless `parse` is given). */
export interface ShellResult {
  command: string;
  args: string[];
  cwd: string;
  stdout: string;
  stderr: string;
  exitCode: number | null;
  signal: string | null;
  durationMs: number;
}

export interface ShellUpdates<I = unknown> {
  streams?: readonly ("stdout" | "stderr")[];
  parseLine: (
    line: string,
    ctx: NodeContext<I> & { stream: "stdout" | "stderr" },
  ) => MaybePromise<WorkflowUpdate | readonly WorkflowUpdate[] | null | undefined>;
}

export interface ShellOptions<I = unknown> extends CommonNodeOptions<I> {
  exec: (ctx: NodeContext<I>) => MaybePromise<ShellExecution>;
  parse?: (result: ShellResult, ctx: NodeContext<I>) => MaybePromise<unknown>;
  updates?: ShellUpdates<I>;
}

export interface CheckpointOptions<I = unknown> extends CommonNodeOptions<I> {
  summary?: string;
  run?: (ctx: NodeContext<I>) => MaybePromise<unknown>;
}

/** A text input attached to a human choice. */
export interface TextInputSpec {
  kind: "text";
  name: string;
  prompt: string;
  minLength: number;
  maxLength: number;
}

/** One human choice. */
export interface HumanChoice {
  label: string;
  input?: TextInputSpec;
}

/** The validated choice set of a human decision. */
export interface HumanChoices<C extends string = string> {
  readonly [NODE_BRAND]: "humanChoices";
  readonly ids: readonly C[];
  readonly choices: Readonly<Record<C, HumanChoice>>;
}

/** A presentation block (`pi-workflows.decision-presentation.v1`). */
export type PresentationBlock =
  | { kind: "paragraph"; text: string }
  | { kind: "section"; title: string }
  | { kind: "bullets"; items: string[] }
  | { kind: "fields"; items: { label: string; value: string }[] }
  | { kind: "preformatted"; text: string };

export interface DecisionPresentation {
  summary: string;
  blocks: PresentationBlock[];
}

/** What `request(ctx)` of a human decision returns. */
export interface HumanDecisionRequestSpec {
  title: string;
  subject?: unknown;
  presentation?: DecisionPresentation;
  revision?: number;
  expiresAt?: string;
}

export interface HumanDecisionOnTimeout<C extends string = string> {
  afterMs: number;
  response: { choice: C; input?: Record<string, string> };
}

export interface HumanDecisionOptions<I = unknown, C extends string = string> extends CommonNodeOptions<I> {
  audience: string | ((ctx: NodeContext<I>) => MaybePromise<string>);
  choices: HumanChoices<C>;
  request: (ctx: NodeContext<I>) => MaybePromise<HumanDecisionRequestSpec>;
  onTimeout?: HumanDecisionOnTimeout<C> | ((ctx: NodeContext<I>) => MaybePromise<HumanDecisionOnTimeout<C> | undefined>);
}

/** The internal kind of a node (authoring sugar included). */
export type NodeKind = "agent" | "compute" | "notify" | "action" | "shell" | "checkpoint";

/** A node made by one of the constructors. */
export interface WorkflowNode<I = unknown> {
  readonly [NODE_BRAND]: "node";
  readonly kind: NodeKind;
  readonly nodeType: NodeType;
  readonly timeoutMs?: TimeoutSpec<I>;
  readonly statusDetail?: string;
  /** The constructor's options (callbacks included). */
  readonly options: unknown;
  /** Sugar this node came from, recorded in the definition snapshot. */
  readonly sugar?: { kind: "decision"; field: string; choices: readonly string[] } | { kind: "humanDecision"; choices: readonly string[] };
  /** Set for a human-decision checkpoint. */
  readonly humanDecision?: HumanDecisionOptions<I>;
}

/** An edge: plain, or a switch on `$.`/`$output.` (the output) or `$result.` (the result record). */
export type WorkflowEdge =
  | { from: string; to: string }
  | { from: string; switch: { on: string; cases: Readonly<Record<string, string>> } };

/** A named exit of a workflow used as an include. */
export interface WorkflowExit {
  from: string;
  validate?: (output: unknown, ctx: NodeContext) => unknown;
}

/** The static contract of a dynamic include (`includeWorkflow({workflow: name|path, contract})`). */
export interface IncludeContract {
  /** Must equal the child's `contractId` when given. */
  id?: string;
  /** The child's exit names, exactly. */
  exits: readonly string[];
  /** Whether the child declares an `input` parser. */
  input?: boolean;
}

/** An include of a child workflow under a mount name. */
export interface WorkflowInclude<I = unknown> {
  readonly [INCLUDE_BRAND]: true;
  /** The child definition (direct import) … */
  readonly definition?: WorkflowDefinition;
  /** … or a reference resolved at compile time: a name, a path, or `builtin:<id>`. */
  readonly ref?: string;
  readonly contract?: IncludeContract;
  /** Maps the parent's context to the child's raw input (default: `null`). */
  readonly input?: (ctx: NodeContext<I>) => unknown;
}

/** The fields of `defineWorkflow`. */
export interface WorkflowSpec<I = unknown> {
  name: string;
  /** `import.meta.url`: file provenance when another workflow imports this one directly. */
  source?: string;
  contractId?: string;
  /** Parses (normalizes) the raw input; throws to reject. */
  input?: (value: unknown) => I;
  title?: string | ((args: { input: I; workflowName: string }) => MaybePromise<string | undefined>);
  presentationPrompt?:
    | string
    | ((args: { state: unknown; finalOutput: unknown; signal: AbortSignal }) => MaybePromise<string | undefined>);
  startAt: string;
  nodes: Readonly<Record<string, WorkflowNode<I>>>;
  edges?: readonly WorkflowEdge[];
  includes?: Readonly<Record<string, WorkflowInclude<I>>>;
  exits?: Readonly<Record<string, WorkflowExit>>;
  maxSteps?: number;
  /** The Pi model arguments of this workflow's headless agent steps (a node's `model` wins). */
  model?: AgentModel;
}

/** A validated workflow definition (the default export of a `.workflow.ts` file). */
export interface WorkflowDefinition<I = unknown> extends Readonly<WorkflowSpec<I>> {
  readonly [DEFINITION_BRAND]: true;
  readonly edges: readonly WorkflowEdge[];
  readonly includes: Readonly<Record<string, WorkflowInclude<I>>>;
  readonly exits: Readonly<Record<string, WorkflowExit>>;
}
