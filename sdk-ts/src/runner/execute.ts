/**
 * Running one node attempt: the context, the resolved deadline, the
 * callbacks (raced against the attempt's AbortSignal so non-cooperative code
 * still times out), managed effects for actions, and the result proposed to
 * the server (`node.finished` / `node.failed`).
 */
import { resolve as resolvePath } from "node:path";
import type { CompiledNode, CompiledWorkflow } from "../authoring/compile.js";
import { appendStepContract } from "../authoring/contract.js";
import { hasLoneSurrogate, normalizeOutput, parseTolerantJson } from "../authoring/json.js";
import type {
  ActionContext,
  AgentOptions,
  CheckpointOptions,
  ComputeOptions,
  FunctionActionOptions,
  HumanDecisionOptions,
  NodeContext,
  NodeResult,
  NotifyOptions,
  ShellOptions,
  UpdateReceipt,
  WorkflowUpdate,
} from "../authoring/types.js";
import type { ActionReceipt, NodeFailureOutcome, SafeError, StartDeadline } from "../generated/types.js";
import { canonicalString } from "../protocol/canonical.js";
import { sha256Digest } from "../authoring/compile.js";
import { type Fields, FrameRefused, type ReplyTo, type RunnerChannel, type RunnerReply, refusalReason } from "./channel.js";
import { buildDecisionRequest } from "./decision.js";
import { HeadlessStepFailed, PI_STOP_GRACE_MS, type PiCommand, PiUnavailable, resolvePi, runHeadlessStep } from "./pi.js";
import { processStartIdentity, resolveExecution, runShell } from "./shell.js";
import { MAX_OUTPUT_DEPTH, type RunState, stateDepthProblem } from "./state.js";

/** The engine default node deadline: 15 minutes. */
export const DEFAULT_NODE_TIMEOUT_MS = 15 * 60 * 1000;
/** How long a timeout function, the title function and similar may take. */
export const RESOLVE_BOUND_MS = 30_000;
/** How long a shell action may take to clean up after its signal aborts. */
const SHELL_CLEANUP_MS = 3_500;
/** How long a headless agent step may take to stop its Pi group after its signal aborts. */
const PI_CLEANUP_MS = PI_STOP_GRACE_MS + 1_000;
/** How long a validate-mode runner lets the node's `validate` run. */
export const VALIDATE_BOUND_MS = 5 * 60 * 1000;
/** The longest inline text on the wire. */
const MAX_INLINE_TEXT = 16_384;
/** The longest SafeError message. */
const MAX_SAFE_MESSAGE = 512;

/** Why a node output cannot be kept in the run state, or null. */
function outputDepthProblem(output: unknown): string | null {
  return stateDepthProblem(output, "its output", MAX_OUTPUT_DEPTH, "command.state.value.results.<node>.output");
}

/** The one attempt the server asked for. */
export interface AttemptTarget {
  nodeId: string;
  attemptId: string;
  visit: number;
  /** The deadline the server committed with the dispatch (`next.deadline` of the reply to a result); absent for the generation's first node, whose deadline the runner resolves. */
  deadline?: StartDeadline;
}

/** The accepted reply to `notification.requested`: the server recorded the notify node's result, its `NotificationResult`. */
type Settled = Extract<ReplyTo<"notification.requested">, { outcome: "accepted" | "adopted" }>;

/** What the runner does after an attempt. */
export type AfterAttempt =
  | { kind: "reply"; reply: RunnerReply }
  /** The run needs nothing more from this process (for example an interactive request was accepted). */
  | { kind: "exit"; reply: RunnerReply };

/** A node failure with its outcome and wire error. */
export class NodeFailure extends Error {
  constructor(
    readonly outcome: NodeFailureOutcome,
    readonly code: SafeError["code"],
    message: string,
    readonly action?: ActionReceipt,
  ) {
    super(message);
  }
}

/** A node's static timeout in ms (null: none), or "dynamic" for a function only the runner can evaluate. */
function staticTimeoutMs(node: CompiledNode): number | null | "dynamic" {
  const spec = node.node?.timeoutMs;
  if (spec === undefined) return node.timeout.kind === "none" ? null : DEFAULT_NODE_TIMEOUT_MS;
  if (spec === null) return null;
  if (typeof spec === "number") return Math.ceil(spec);
  return "dynamic";
}

/** A timeout abort reason. */
function timeoutReason(ms: number): Error {
  const error = new Error(`the node exceeded its deadline of ${ms} ms`);
  error.name = "TimeoutError";
  return error;
}

/** A bounded wire message that canonical JSON can carry (a lone surrogate becomes U+FFFD). */
export function safeMessage(text: string): string {
  const bounded = text.length <= MAX_SAFE_MESSAGE ? text : `${text.slice(0, MAX_SAFE_MESSAGE - 1)}…`;
  return bounded.replace(/\p{Cs}/gu, "\uFFFD");
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Races `work` against `signal`; rejects with the signal's reason when it aborts first. */
export function raceAbort<T>(work: Promise<T>, signal: AbortSignal, graceMs = 0): Promise<T> {
  if (signal.aborted && graceMs === 0) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const onAbort = (): void => {
      if (graceMs === 0) reject(signal.reason);
      else timer = setTimeout(() => reject(signal.reason), graceMs);
    };
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
    work.then(
      (value) => {
        if (timer) clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (error: unknown) => {
        if (timer) clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        reject(error);
      },
    );
  });
}

/** Resolves `work` within `ms` or throws. */
export async function withBound<T>(work: Promise<T> | T, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      Promise.resolve(work),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what} did not resolve within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    if (timer) clearTimeout(timer);
  }
}

/** Everything an attempt needs from its runner. */
export interface ExecutorHost {
  channel: RunnerChannel;
  compiled: CompiledWorkflow;
  state: RunState;
  runId: string;
  projectPath: string;
  log: (line: string) => void;
  /** Aborted when the runner stops (SIGTERM, claim loss, channel closed). */
  stopSignal: AbortSignal;
  /** Appends a journal record when PI_WORKFLOWS_RUNNER_JOURNAL is set. */
  journal: (record: Record<string, unknown>) => void;
}

/** What applying a managed effect produced. */
interface Applied {
  state: "applied" | "rejected";
  /** The result stored with the settled effect. */
  result: unknown;
  /** The user value inside `result`, named, and the result to store instead when the settle frame cannot carry it. */
  carries?: { what: string; value: unknown; instead: (reason: string) => unknown };
}

/** A stored effect result that says why its value is missing. */
interface Unsendable {
  unsendable?: string;
}

export class Executor {
  private readonly mountEntries: ReadonlySet<string>;
  /**
   * The attempt whose node code is running. A message for any other attempt
   * fails the server's attempt check and parks the run `protocolRejected`,
   * so an update published after its node settled (an un-awaited
   * `publishUpdate`) is refused here instead.
   */
  private running: string | undefined;

  constructor(private readonly host: ExecutorHost) {
    this.mountEntries = new Set(host.compiled.mounts.map((mount) => mount.entry));
  }

  private context(node: CompiledNode, target: AttemptTarget, signal: AbortSignal, level: readonly string[]): NodeContext {
    const view = this.host.state.project(level, this.mountEntries);
    return {
      input: view.input,
      outputs: view.outputs,
      results: view.results,
      state: view,
      signal,
      attempt: {
        runId: this.host.runId,
        workflowName: node.workflow.name,
        nodeId: node.localId,
        qualifiedNodeId: node.id,
        attemptId: target.attemptId,
        visit: target.visit,
      },
    };
  }

  /**
   * Validate mode: the node's `validate` (through [`acceptAgentOutput`]) on a
   * provisional submission, bounded by [`VALIDATE_BOUND_MS`]. A refusal is the
   * actionable message the model sees.
   */
  async validateSubmission(target: AttemptTarget, output: unknown): Promise<{ accepted: true; output: unknown } | { accepted: false; message: string }> {
    const node = this.host.compiled.nodes.get(target.nodeId);
    const real = node?.node;
    if (!node || real?.kind !== "agent") return { accepted: false, message: `node ${target.nodeId} is not an agent step of this workflow` };
    const ctx = this.context(node, target, this.host.stopSignal, node.mountPath);
    try {
      const value = await raceAbort(withBound(acceptAgentOutput(real.options as AgentOptions, output, ctx), VALIDATE_BOUND_MS, "validate()"), this.host.stopSignal);
      const tooDeep = outputDepthProblem(value);
      return tooDeep === null ? { accepted: true, output: value } : { accepted: false, message: tooDeep };
    } catch (error) {
      if (this.host.stopSignal.aborted) throw error;
      return { accepted: false, message: errorText(error) };
    }
  }

  /** Runs one attempt and proposes its result; returns the server's reply. */
  async run(target: AttemptTarget): Promise<AfterAttempt> {
    const { channel, compiled } = this.host;
    const node = compiled.nodes.get(target.nodeId);
    const controller = new AbortController();
    const onStop = (): void => controller.abort(this.host.stopSignal.reason);
    if (this.host.stopSignal.aborted) onStop();
    else this.host.stopSignal.addEventListener("abort", onStop, { once: true });
    const startedAt = Date.now();
    this.running = target.attemptId;
    let deadlineTimer: NodeJS.Timeout | undefined;
    let outcome: { ok: true; output: unknown; action?: ActionReceipt } | { ok: false; failure: NodeFailure } | { exit: RunnerReply } | { settled: Settled };
    try {
      if (!node) throw new NodeFailure("failed", "nodeFailed", `node ${target.nodeId} is not in the compiled workflow`);
      const ctx = this.context(node, target, controller.signal, node.transition === "entry" ? node.mountPath.slice(0, -1) : node.mountPath);
      const statusDetail = node.node?.statusDetail;
      let timer: { inMs: number; timeoutMs: number } | null;
      // The reply to node.started is not awaited: a claimLost reply stops the runner through the channel.
      if (target.deadline?.kind === "committed") {
        // The server recorded the deadline with the previous result (one commit per step): enforce it;
        // node.started has only a status detail to report.
        const deadlineAtMs = target.deadline.deadlineAtMs;
        const configured = staticTimeoutMs(node);
        timer =
          deadlineAtMs === undefined
            ? null
            : { inMs: Math.max(0, deadlineAtMs - Date.now()), timeoutMs: typeof configured === "number" ? configured : deadlineAtMs - startedAt };
        if (statusDetail !== undefined) await channel.send("node.started", { attemptId: target.attemptId, statusDetail });
      } else {
        // The generation's first node, or a dynamic timeout: resolved here and made durable by node.started.
        const timeoutMs = await this.resolveTimeout(node, ctx);
        const deadlineAtMs = timeoutMs === null ? undefined : startedAt + timeoutMs;
        await channel.send("node.started", {
          attemptId: target.attemptId,
          ...(deadlineAtMs !== undefined ? { deadlineAtMs } : {}),
          ...(statusDetail !== undefined ? { statusDetail } : {}),
        });
        timer = timeoutMs === null ? null : { inMs: timeoutMs, timeoutMs };
      }
      if (timer !== null) {
        const { inMs, timeoutMs } = timer;
        deadlineTimer = setTimeout(() => controller.abort(timeoutReason(timeoutMs)), inMs);
      }
      const done = await this.dispatch(node, target, ctx);
      outcome = "exit" in done || "settled" in done ? done : { ok: true, output: done.output, ...(done.action ? { action: done.action } : {}) };
    } catch (error) {
      outcome = { ok: false, failure: this.failureOf(error, controller.signal) };
    } finally {
      this.running = undefined;
      if (deadlineTimer) clearTimeout(deadlineTimer);
      this.host.stopSignal.removeEventListener("abort", onStop);
    }
    if ("exit" in outcome) return { kind: "exit", reply: outcome.exit };
    if (this.host.stopSignal.aborted) {
      // The runner is stopping: the server decides what happens to the attempt.
      throw this.host.stopSignal.reason;
    }
    const finishedAt = Date.now();
    const base = {
      attemptId: target.attemptId,
      nodeId: target.nodeId,
      nodeType: node?.nodeType ?? "compute",
      startedAt: new Date(startedAt).toISOString(),
      finishedAt: new Date(finishedAt).toISOString(),
      durationMs: finishedAt - startedAt,
    };
    let reply: RunnerReply;
    let result: NodeResult;
    if ("settled" in outcome) {
      // The server already recorded this attempt's result: its receipt.
      reply = outcome.settled;
      result = { ...base, outcome: "ok", output: reply.result };
    } else {
      ({ reply, result } = await this.propose(target, base, outcome));
    }
    if (reply.outcome === "accepted" || reply.outcome === "adopted") {
      this.host.state.record(target.nodeId, result);
      this.host.journal({
        event: "node",
        nodeId: target.nodeId,
        attemptId: target.attemptId,
        visit: target.visit,
        outcome: result.outcome,
        ...(result.outcome === "ok" ? { output: result.output } : { error: result.error?.message }),
      });
    }
    return { kind: "reply", reply };
  }

  /**
   * Proposes the attempt's result: `node.finished`, or `node.failed` when the
   * attempt failed or its output cannot travel (deeper than the run state
   * carries, or a frame the wire refuses).
   */
  private async propose(
    target: AttemptTarget,
    base: Omit<NodeResult, "outcome" | "output" | "error">,
    outcome: { ok: true; output: unknown; action?: ActionReceipt } | { ok: false; failure: NodeFailure },
  ): Promise<{ reply: RunnerReply; result: NodeResult }> {
    const channel = this.host.channel;
    let failure: NodeFailure;
    if (outcome.ok) {
      const tooDeep = outputDepthProblem(outcome.output);
      if (tooDeep === null) {
        try {
          const reply = await channel.request("node.finished", {
            attemptId: target.attemptId,
            output: outcome.output as never,
            ...(outcome.action ? { action: outcome.action } : {}),
          });
          return { reply, result: { ...base, outcome: "ok", output: outcome.output } };
        } catch (error) {
          if (!(error instanceof FrameRefused)) throw error;
          failure = new NodeFailure("failed", "nodeFailed", refusalReason(error, "its output", outcome.output), outcome.action);
        }
      } else {
        failure = new NodeFailure("failed", "nodeFailed", tooDeep, outcome.action);
      }
    } else {
      failure = outcome.failure;
    }
    // The closed code only: the message may carry workflow data, which logs never hold.
    this.host.log(`node ${target.nodeId} attempt ${target.attemptId}: ${failure.outcome} (${failure.code})`);
    const reply = await channel.request("node.failed", {
      attemptId: target.attemptId,
      outcome: failure.outcome,
      error: { code: failure.code, message: safeMessage(failure.message) },
      ...(failure.action ? { action: failure.action } : {}),
    });
    return { reply, result: { ...base, outcome: failure.outcome, error: { message: failure.message } } };
  }

  private failureOf(error: unknown, signal: AbortSignal): NodeFailure {
    if (error instanceof NodeFailure) return error;
    if (signal.aborted) {
      const reason: unknown = signal.reason;
      if (reason instanceof Error && reason.name === "TimeoutError") {
        return new NodeFailure("timed_out", "timedOut", reason.message);
      }
      return new NodeFailure("cancelled", "cancelled", "the node was stopped");
    }
    return new NodeFailure("failed", "nodeFailed", errorText(error));
  }

  private async resolveTimeout(node: CompiledNode, ctx: NodeContext): Promise<number | null> {
    const configured = staticTimeoutMs(node);
    if (configured !== "dynamic") return configured;
    const spec = node.node?.timeoutMs;
    if (typeof spec !== "function") return null;
    const value = await withBound(Promise.resolve().then(() => spec(ctx)), RESOLVE_BOUND_MS, "timeoutMs()");
    if (value === null) return null;
    if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) {
      throw new NodeFailure("failed", "nodeFailed", "timeoutMs() must return a finite positive number or null");
    }
    return Math.ceil(value);
  }

  private async dispatch(
    node: CompiledNode,
    target: AttemptTarget,
    ctx: NodeContext,
  ): Promise<{ output: unknown; action?: ActionReceipt } | { exit: RunnerReply } | { settled: Settled }> {
    const signal = ctx.signal;
    if (node.transition === "entry") return { output: await raceAbort(this.entry(node, target, ctx), signal) };
    if (node.transition === "exit") return { output: await raceAbort(this.exit(node, target), signal) };
    const real = node.node;
    if (!real) throw new NodeFailure("failed", "nodeFailed", `node ${node.id} has nothing to run`);
    switch (real.kind) {
      case "compute": {
        const options = real.options as ComputeOptions;
        const output = await raceAbort(Promise.resolve().then(() => options.run(ctx)), signal);
        return { output: normalizeOutput(output, `the output of ${node.id}`) };
      }
      case "checkpoint": {
        if (real.humanDecision) {
          const request = await raceAbort(buildDecisionRequest(real.humanDecision as HumanDecisionOptions, ctx), signal);
          return { output: normalizeOutput(request, `the decision request of ${node.id}`) };
        }
        const options = real.options as CheckpointOptions;
        const output = options.run
          ? await raceAbort(Promise.resolve().then(() => options.run?.(ctx)), signal)
          : { summary: options.summary ?? "checkpoint" };
        return { output: normalizeOutput(output, `the output of ${node.id}`) };
      }
      case "action":
        return raceAbort(this.functionAction(node, target, real.options as FunctionActionOptions, ctx), signal);
      case "shell":
        return raceAbort(this.shellAction(node, target, real.options as ShellOptions, ctx), signal, SHELL_CLEANUP_MS);
      case "notify":
        return { settled: await raceAbort(this.notify(node, target, real.options as NotifyOptions, ctx), signal) };
      case "agent":
        return raceAbort(this.agent(node, target, real.options as AgentOptions, ctx), signal, PI_CLEANUP_MS);
    }
  }

  private async entry(node: CompiledNode, target: AttemptTarget, parentCtx: NodeContext): Promise<unknown> {
    const include = node.entry?.include;
    const raw = include?.input ? await include.input(parentCtx) : null;
    const child = node.workflow;
    let input: unknown = raw === undefined ? null : raw;
    if (child.input) input = await child.input(input);
    input = normalizeOutput(input, `the input of included workflow ${child.name} (mount ${node.id})`);
    return { schema: "pi-workflows.include-entry.v1", invocation: target.visit, input };
  }

  private async exit(node: CompiledNode, target: AttemptTarget): Promise<unknown> {
    const exit = node.exit;
    if (!exit) throw new NodeFailure("failed", "nodeFailed", `exit node ${node.id} has no exit`);
    const state = this.host.state;
    if (!Object.prototype.hasOwnProperty.call(state.outputs, exit.from)) {
      throw new NodeFailure("failed", "nodeFailed", `exit ${exit.name} of ${node.mountPath.join("/")}: ${exit.from} has no output`);
    }
    let output = state.outputs[exit.from];
    if (exit.validate) {
      const ctx = this.context(node, target, new AbortController().signal, node.mountPath);
      const validated = await exit.validate(output, ctx);
      output = validated === undefined ? output : validated;
    }
    return normalizeOutput({ exit: exit.name, output }, `the exit output of ${node.id}`);
  }

  /** Publishes one update through the server (it enforces patterns, size, key count and rate). */
  private publisher(target: AttemptTarget): (update: WorkflowUpdate) => Promise<UpdateReceipt> {
    let counter = 0;
    return async (update) => {
      if (typeof update !== "object" || update === null) throw new Error("publishUpdate() needs {type, key, data}");
      if (typeof update.type !== "string" || typeof update.key !== "string") throw new Error("publishUpdate(): type and key must be strings");
      if (typeof update.data !== "object" || update.data === null || Array.isArray(update.data)) {
        throw new Error("publishUpdate(): data must be a JSON object");
      }
      normalizeOutput(update.data, "update data");
      if (this.running !== target.attemptId) {
        throw new Error(`publishUpdate(): node ${target.nodeId} already finished; publish (and await) updates while the node runs`);
      }
      counter += 1;
      let reply: ReplyTo<"node.update">;
      try {
        reply = await this.host.channel.request("node.update", {
          attemptId: target.attemptId,
          update: { type: update.type, key: update.key, data: update.data as never },
          idempotencyKey: `${target.attemptId}:u${counter}`,
        });
      } catch (error) {
        if (!(error instanceof FrameRefused)) throw error;
        if (error.rule === "schema") throw new Error(`update ${update.type}/${update.key} does not fit the runner.v1 schema of node.update (check its type, key and data)`);
        throw new Error(refusalReason(error, `update ${update.type}/${update.key} data`, update.data));
      }
      if (reply.outcome !== "accepted" && reply.outcome !== "adopted") {
        throw new Error(`update ${update.type}/${update.key} was rejected: ${reply.error?.code ?? reply.outcome}: ${reply.error?.message ?? ""}`);
      }
      return reply.result;
    };
  }

  /**
   * Reserve, apply (unless an earlier attempt settled it), settle. When the
   * settle frame cannot carry the applied result, the effect is settled with
   * `carries.instead(reason)` (the effect did happen; its stored result says
   * why its value is missing) and the caller fails the node with `unsendable`.
   */
  private async managedEffect(
    target: AttemptTarget,
    effectType: "function" | "shell",
    request: unknown,
    apply: () => Promise<Applied>,
  ): Promise<{ effectId: string; state: "applied" | "rejected"; result: unknown; adopted: boolean }> {
    const channel = this.host.channel;
    const reserved = await channel.request("effect.reserve", {
      attemptId: target.attemptId,
      effectType,
      requestDigest: sha256Digest(canonicalString(request)),
    });
    if (reserved.outcome !== "accepted" && reserved.outcome !== "adopted") {
      throw new NodeFailure("failed", reserved.error?.code ?? "conflict", `the effect reservation was refused: ${reserved.error?.message ?? reserved.outcome}`);
    }
    // An EffectReservation (apply it now) or an EffectAdoption (it already settled).
    const reservation = reserved.result;
    if (reservation.state !== "applying") {
      this.host.log(`effect ${reservation.effectId} already ${reservation.state}; using its stored result`);
      return { effectId: reservation.effectId, state: reservation.state, result: reservation.result, adopted: true };
    }
    const applied = await apply();
    const settle = (result: unknown): Promise<ReplyTo<"effect.settle">> =>
      channel.request("effect.settle", { effectId: reservation.effectId, state: applied.state, result: result as never });
    const tooDeep = applied.carries === undefined ? null : outputDepthProblem(applied.carries.value);
    let stored = tooDeep === null || applied.carries === undefined ? applied.result : applied.carries.instead(tooDeep);
    let settled: ReplyTo<"effect.settle">;
    try {
      settled = await settle(stored);
    } catch (error) {
      if (!(error instanceof FrameRefused) || applied.carries === undefined) throw error;
      stored = applied.carries.instead(refusalReason(error, applied.carries.what, applied.carries.value));
      settled = await settle(stored);
    }
    if (settled.outcome !== "accepted" && settled.outcome !== "adopted") {
      throw new NodeFailure("failed", settled.error?.code ?? "conflict", `the effect settlement was refused: ${settled.error?.message ?? settled.outcome}`);
    }
    return { effectId: reservation.effectId, state: applied.state, result: stored, adopted: false };
  }

  private async functionAction(
    node: CompiledNode,
    target: AttemptTarget,
    options: FunctionActionOptions,
    ctx: NodeContext,
  ): Promise<{ output: unknown; action: ActionReceipt }> {
    const actionCtx: ActionContext = { ...ctx, publishUpdate: this.publisher(target) };
    const effect = await this.managedEffect(target, "function", { actionType: "function", node: node.id }, async (): Promise<Applied> => {
      try {
        const output = normalizeOutput(await raceAbort(Promise.resolve().then(() => options.run(actionCtx)), ctx.signal), `the output of ${node.id}`);
        return {
          state: "applied",
          result: { actionType: "function", output },
          carries: { what: "its output", value: output, instead: (reason) => ({ actionType: "function", unsendable: reason }) },
        };
      } catch (error) {
        if (ctx.signal.aborted) throw error;
        return { state: "rejected", result: { actionType: "function", error: safeMessage(errorText(error)) } };
      }
    });
    const stored = (effect.result ?? {}) as { output?: unknown; error?: string } & Unsendable;
    const action: ActionReceipt = { effectId: effect.effectId, state: effect.state, result: { actionType: "function" } };
    if (effect.state === "rejected") {
      throw new NodeFailure("failed", "nodeFailed", stored.error ?? "the action failed", action);
    }
    if (stored.unsendable !== undefined) throw new NodeFailure("failed", "nodeFailed", stored.unsendable, action);
    return { output: stored.output === undefined ? null : stored.output, action };
  }

  private async shellAction(
    node: CompiledNode,
    target: AttemptTarget,
    options: ShellOptions,
    ctx: NodeContext,
  ): Promise<{ output: unknown; action: ActionReceipt }> {
    const execution = resolveExecution(await options.exec(ctx), this.host.projectPath, resolvePath);
    const request = {
      actionType: "shell",
      command: execution.command,
      args: execution.args,
      cwd: execution.cwd,
      env: execution.env,
      stdin: execution.stdin,
      shell: execution.shell,
    };
    const publish = this.publisher(target);
    const channel = this.host.channel;
    const updates = options.updates;
    const effect = await this.managedEffect(target, "shell", request, async (): Promise<Applied> => {
      let registered: { pid: number; startIdentity: string } | undefined;
      const outcome = await runShell(execution, {
        signal: ctx.signal,
        ...(updates
          ? {
              lineStreams: updates.streams ?? ["stdout"],
              onLine: async (line, stream) => {
                const produced = await updates.parseLine(line, { ...ctx, stream });
                const list = produced === null || produced === undefined ? [] : Array.isArray(produced) ? produced : [produced];
                for (const update of list as WorkflowUpdate[]) await publish(update);
              },
            }
          : {}),
        // The identity is read at spawn (the child cannot have been reaped yet) and the
        // same identity is unregistered: a registration never outlives its group.
        onSpawn: async (pid) => {
          const startIdentity = processStartIdentity(pid);
          if (startIdentity === null) return;
          const reply = await channel.request("runner.progress", { operation: "process.register", pid, startIdentity });
          if (reply.outcome === "accepted") registered = { pid, startIdentity };
          else if (processStartIdentity(pid) === startIdentity) this.host.log(`process.register ${pid}: ${reply.outcome} ${reply.error?.message ?? ""}`);
          // Otherwise the command ended before the server looked: there is nothing to register.
        },
        onClose: async () => {
          if (registered === undefined) return;
          await channel.send("runner.progress", { operation: "process.unregister", ...registered });
        },
      });
      const { stdout: _stdout, stderr: _stderr, ...receiptFields } = outcome.result;
      const receipt = { actionType: "shell", ...receiptFields };
      if (outcome.failure) {
        return { state: "rejected", result: { receipt, error: safeMessage(outcome.failure.message), cause: outcome.failure.cause } };
      }
      let output: unknown;
      try {
        output = normalizeOutput(options.parse ? await options.parse(outcome.result, ctx) : outcome.result, `the output of ${node.id}`);
      } catch (error) {
        return { state: "rejected", result: { receipt, error: safeMessage(errorText(error)), cause: "parse" } };
      }
      return {
        state: "applied",
        result: { receipt, output },
        carries: { what: "its output", value: output, instead: (reason) => ({ receipt, unsendable: reason }) },
      };
    });
    const stored = (effect.result ?? {}) as { receipt?: unknown; output?: unknown; error?: string; cause?: string } & Unsendable;
    const action: ActionReceipt = { effectId: effect.effectId, state: effect.state, result: (stored.receipt ?? { actionType: "shell" }) as never };
    if (effect.state === "rejected") {
      if (stored.cause === "aborted" && ctx.signal.aborted) throw ctx.signal.reason;
      throw new NodeFailure("failed", "nodeFailed", stored.error ?? "the shell action failed", action);
    }
    if (stored.unsendable !== undefined) throw new NodeFailure("failed", "nodeFailed", stored.unsendable, action);
    return { output: stored.output === undefined ? null : stored.output, action };
  }

  /**
   * Sends `notification.requested`. The server records the node's result (its
   * receipt is the reply's `result`) in the same transaction as the
   * notification message, so the accepted reply ends the attempt and carries
   * the next instruction; no `node.finished` follows.
   */
  private async notify(node: CompiledNode, target: AttemptTarget, options: NotifyOptions, ctx: NodeContext): Promise<Settled> {
    const raw = typeof options.message === "function" ? await options.message(ctx) : options.message;
    if (typeof raw !== "string" || raw.trim() === "") throw new NodeFailure("failed", "nodeFailed", `notify ${node.id}: the message must be a non-empty string`);
    const text = raw.trim();
    if (text.length > MAX_INLINE_TEXT) throw new NodeFailure("failed", "nodeFailed", `notify ${node.id}: the message is longer than ${MAX_INLINE_TEXT} characters`);
    if (hasLoneSurrogate(text)) throw new NodeFailure("failed", "nodeFailed", `notify ${node.id}: the message holds a lone UTF-16 surrogate, which canonical JSON (RFC 8785) cannot encode`);
    const reply = await this.host.channel.request("notification.requested", {
      attemptId: target.attemptId,
      kind: options.kind ?? "progress",
      content: { kind: "inline", text },
    });
    if (reply.outcome !== "accepted" && reply.outcome !== "adopted") {
      throw new NodeFailure("failed", reply.error?.code ?? "nodeFailed", `the server refused the notification: ${reply.error?.message ?? reply.outcome}`);
    }
    return reply;
  }

  /**
   * An agent step. Interactive: `interaction.requested`, then the runner
   * exits and the origin session does the work. Headless: the same request,
   * then one `pi --mode rpc` child (pi.ts) runs the step to its accepted
   * output, which this attempt proposes as its result. A visible
   * assistant-message step needs an origin session: a headless run fails it
   * with `headlessAssistantMessage` before anything starts.
   */
  private async agent(node: CompiledNode, target: AttemptTarget, options: AgentOptions, ctx: NodeContext): Promise<{ exit: RunnerReply } | { output: unknown }> {
    const launch = this.host.channel.launch;
    const headless = launch.executionMode === "headless";
    const assistantMessage = typeof options.expectedOutput === "object";
    if (headless && assistantMessage) {
      throw new NodeFailure(
        "failed",
        "headlessAssistantMessage",
        `agent ${node.id}: a visible assistant-message step needs an origin Pi session, and a headless run has none; start the run from Pi, or make the step submit its output`,
      );
    }
    const expectedOutput = typeof options.expectedOutput === "string" ? options.expectedOutput : undefined;
    const prompt = typeof options.prompt === "function" ? await options.prompt(ctx) : options.prompt;
    if (typeof prompt !== "string" || prompt.trim() === "") throw new NodeFailure("failed", "nodeFailed", `agent ${node.id}: the prompt must be a non-empty string`);
    if (ctx.signal.aborted) throw ctx.signal.reason;
    const text = assistantMessage ? prompt.trim() : appendStepContract(prompt, node.workflow.name, node.localId, target.attemptId, expectedOutput);
    if (text.length > MAX_INLINE_TEXT) {
      throw new NodeFailure("failed", "nodeFailed", `agent ${node.id}: the prompt with its step contract is longer than ${MAX_INLINE_TEXT} characters`);
    }
    if (hasLoneSurrogate(text)) {
      throw new NodeFailure("failed", "nodeFailed", `agent ${node.id}: the prompt holds a lone UTF-16 surrogate, which canonical JSON (RFC 8785) cannot encode`);
    }
    let pi: PiCommand | undefined;
    if (headless) {
      try {
        pi = resolvePi();
      } catch (error) {
        if (!(error instanceof PiUnavailable)) throw error;
        throw new NodeFailure("failed", "nodeFailed", `agent ${node.id}: ${error.message}`);
      }
    }
    const reply = await this.requestInteraction(node, {
      attemptId: target.attemptId,
      kind: assistantMessage ? "visibleResponse" : "agent",
      prompt: { kind: "inline", text },
      contract: {
        schema: "pi-workflows.agent-step-contract.v1",
        runId: this.host.runId,
        workflowName: node.workflow.name,
        nodeId: node.localId,
        qualifiedNodeId: node.id,
        attemptId: target.attemptId,
        ...(expectedOutput !== undefined ? { expectedOutput } : {}),
      },
    }, expectedOutput);
    if (reply.outcome !== "accepted" && reply.outcome !== "adopted") {
      const message = reply.error?.message ?? reply.outcome;
      throw new NodeFailure("failed", reply.error?.code ?? "nodeFailed", `agent ${node.id}: the server refused the agent step request: ${message}`);
    }
    if (pi === undefined) return { exit: reply };
    const interactionId = reply.result.interactionId;
    const model = { ...launch.agentModel, ...node.workflow.model, ...options.model };
    const channel = this.host.channel;
    this.host.log(`agent ${node.id}: headless pi (${pi.source}) for request ${interactionId}`);
    try {
      const output = await runHeadlessStep({
        pi,
        projectPath: this.host.projectPath,
        prompt: text,
        model,
        bridge: {
          runId: this.host.runId,
          interactionId,
          attemptId: target.attemptId,
          step: node.localId,
          workflowName: node.workflow.name,
          generation: launch.generation,
          runnerEpoch: launch.runnerEpoch,
        },
        signal: ctx.signal,
        register: async (pid, startIdentity) => {
          const answer = await channel.request("runner.progress", { operation: "process.register", pid, startIdentity });
          if (answer.outcome !== "accepted") this.host.log(`process.register ${pid}: ${answer.outcome} ${answer.error?.message ?? ""}`);
          return answer.outcome === "accepted";
        },
        unregister: async (pid, startIdentity) => {
          await channel.send("runner.progress", { operation: "process.unregister", pid, startIdentity });
        },
        log: this.host.log,
      });
      return { output };
    } catch (error) {
      if (error instanceof HeadlessStepFailed) throw new NodeFailure("failed", "nodeFailed", `agent ${node.id}: ${error.message}`);
      throw error;
    }
  }

  /** `interaction.requested`; a frame the wire cannot carry (its expectedOutput) fails the node naming the rule. */
  private async requestInteraction(
    node: CompiledNode,
    fields: Fields<"interaction.requested">,
    expectedOutput: unknown,
  ): Promise<ReplyTo<"interaction.requested">> {
    try {
      return await this.host.channel.request("interaction.requested", fields);
    } catch (error) {
      if (!(error instanceof FrameRefused)) throw error;
      throw new NodeFailure("failed", "nodeFailed", `agent ${node.id}: ${refusalReason(error, "its expectedOutput", expectedOutput ?? null)}`);
    }
  }
}

/** Normalizes a submitted agent output: tolerant JSON for strings, then `validate`, then the JSON round trip. */
export async function acceptAgentOutput(options: AgentOptions, output: unknown, ctx: NodeContext): Promise<unknown> {
  let value = typeof output === "string" ? parseTolerantJson(output) : output;
  if (options.validate) {
    const validated = await options.validate(value, ctx);
    if (validated !== undefined) value = validated;
  }
  return normalizeOutput(value, "the step output");
}
