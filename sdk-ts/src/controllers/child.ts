/**
 * The controller child (`pi-workflows-controller`): the program the server
 * runs for one resolve or one reconcile pass, speaking the private
 * controller.v1 channel (protocol/runner.v1.schema.json `$defs`,
 * docs/CONTROLLERS.md) on its stdio.
 *
 * Invariants:
 * - NDJSON both ways, canonical JSON, frames of at most 1 MiB. The first
 *   stdin line is a `ControllerLaunch`; every later line is a reply. Every
 *   line is decoded and checked against the schema (the generated
 *   controller validators), and every message is checked before it is
 *   written. A malformed launch or reply is one stderr line and exit 2.
 * - Strictly sequential: the child's messages carry requestId 1, 2, …, and
 *   each waits for its reply (same requestId) before the next is written.
 * - Resolve mode loads the module (the workflow loader: type stripping, else
 *   jiti), finds the exported `defineController` definition named by the
 *   launch, computes `initialStatus(spec)` and answers `resolved` (with the
 *   sha256 digest of the exact bytes hashed before and after loading) or
 *   `resolveFailed`.
 * - Reconcile mode refuses a source whose digest is not the launch's
 *   `sourceDigest` (no changed code runs), then runs `reconcile(ctx,
 *   resource)` once. `ctx.signal` aborts at the launch's `timeoutMs` or on a
 *   `claimLost` reply. An effect newly reserved is applied; one pending or
 *   indeterminate from an earlier pass is observed first and applied only
 *   when the server, told `notApplied`, says so; an exception from `apply`
 *   is `indeterminate`, from `observe` an `indeterminate` observation. After
 *   the deadline the pass is `failed` at once (an ignored promise is left
 *   behind; the server kills the process group after a grace).
 * - Messages the child writes (and its stderr log) never contain spec,
 *   status, request or payload contents: errors thrown by controller code
 *   are reported by their class name and where they were thrown; messages
 *   are bounded to 512 characters.
 * - The child never writes the database and never talks to the client
 *   socket: everything it changes goes through the server's replies.
 */
import { createHash } from "node:crypto";
import { readFile } from "node:fs/promises";
import type { Readable, Writable } from "node:stream";
import { WorkflowDefinitionError } from "../authoring/errors.js";
import type {
  ChildWorkflowView,
  ControllerChildMessage,
  ControllerEffectView,
  ControllerLaunch,
  ControllerObservation,
  ControllerReconcileLaunch,
  ControllerResolveLaunch,
  ControllerServerMessage,
  JsonValue,
  ResolveFailureCode,
  ResourceCondition,
  ResourceConditionPatch,
  ResourceConditionStatus,
  ResourceStatusPatch,
} from "../generated/types.js";
import { canonicalString, checkDepth } from "../protocol/canonical.js";
import { SafeError } from "../protocol/errors.js";
import { FrameDecoder, MAX_FRAME_BYTES, frameContent } from "../protocol/framing.js";
import { decodeControllerLaunch, decodeControllerServerFrame, encodeControllerChild } from "../protocol/messages.js";
import { configureLoading, importModuleFile, rememberVerified } from "../runner/loader.js";
import { TransformCache } from "../runner/transform-cache.js";
import { defaultHome } from "../home.js";
import {
  type Condition,
  type ConditionPatch,
  type ConditionStatus,
  type ControllerDefinition,
  type EffectRecord,
  type EffectSpec,
  type Observation,
  type ReconcileContext,
  type ReconcileResult,
  type Resource,
  type StatusPatch,
  type WorkflowRequestRecord,
  type WorkflowRequestSpec,
  isControllerDefinition,
  results,
} from "./index.js";

/** Exit codes: 0 after the last reply (or after the claim was lost), 2 for a malformed launch or reply or a closed channel. */
export const EXIT_OK = 0;
export const EXIT_PROTOCOL = 2;

/** The longest message the child writes (SafeMessage). */
const MAX_MESSAGE = 512;

/** What the server tells the child when its source changed (reconcile mode). */
export const SOURCE_CHANGED_MESSAGE = "the controller source changed since the resource was applied; apply it again";

/** A line on stderr: the server copies it into the runner log. */
export type Log = (line: string) => void;

const defaultLog: Log = (line) => {
  process.stderr.write(`pi-workflows-controller: ${line}\n`);
};

/** A bounded message. */
function bounded(message: string): string {
  return message.length <= MAX_MESSAGE ? message : `${message.slice(0, MAX_MESSAGE - 1)}…`;
}

/** Reports an error of controller code without its message (which may carry spec or status contents). */
function described(error: unknown, where: string): string {
  if (error instanceof ControllerChannelError) return bounded(error.message);
  const name = error instanceof Error ? error.name : typeof error;
  return bounded(`${where} threw ${name}`);
}

/** The channel broke (malformed launch or reply, closed stdin): the child exits 2. */
export class ControllerProtocolError extends Error {
  override readonly name = "ControllerProtocolError";
}

/**
 * A refusal the child itself or the server's reply raises inside
 * `reconcile` (a rejected reply, a call after the pass ended, an invalid
 * effect or request): its message is safe to report as the pass's failure.
 */
export class ControllerChannelError extends Error {
  override readonly name = "ControllerChannelError";
  constructor(
    message: string,
    /** The server's code for a rejected reply. */
    readonly code?: string,
  ) {
    super(bounded(message));
  }
}

/** `sha256:<hex>` of bytes or of a string's UTF-8. */
export function sha256Digest(bytes: Uint8Array | string): string {
  return `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
}

/** The request fingerprint of an effect: `sha256:` + hex(sha256(canonical JSON of request)). */
export function requestFingerprint(request: unknown): string {
  return sha256Digest(canonicalString(request));
}

// --- the channel ------------------------------------------------------------

type Outgoing = ControllerChildMessage extends infer M ? (M extends { requestId: number } ? Omit<M, "requestId"> : never) : never;

/**
 * The child's end of the channel: reads frames from stdin, writes one
 * message at a time and waits for its reply.
 */
export class ControllerChannel {
  private readonly decoder = new FrameDecoder();
  private readonly frames: Uint8Array[] = [];
  private waiter: ((frame: Uint8Array | Error) => void) | null = null;
  private closed: Error | null = null;
  private nextId = 1;
  /** The tail of the one-at-a-time chain of requests. */
  private chain: Promise<unknown> = Promise.resolve();
  private breakWith: (error: ControllerProtocolError) => void = () => undefined;
  /**
   * Rejects with the first protocol error of any request (a malformed
   * reply, a closed stdin): the pass ends with it even when controller code
   * caught the error its call threw.
   */
  readonly broken: Promise<never> = new Promise<never>((_, reject) => {
    this.breakWith = reject;
  });

  constructor(
    private readonly input: Readable,
    private readonly output: Writable,
  ) {
    input.on("data", (chunk: Buffer) => this.push(chunk));
    input.on("end", () => this.fail(new ControllerProtocolError("stdin closed before the server's reply")));
    input.on("error", () => this.fail(new ControllerProtocolError("stdin failed")));
    this.broken.catch(() => undefined);
  }

  private push(chunk: Uint8Array): void {
    try {
      this.decoder.push(chunk);
      for (let frame = this.decoder.nextFrame(); frame !== null; frame = this.decoder.nextFrame()) {
        this.deliver(frame);
      }
    } catch (error) {
      this.fail(new ControllerProtocolError(`a stdin line breaks the framing (${error instanceof SafeError ? error.code : "malformedFrame"})`));
    }
  }

  private deliver(frame: Uint8Array): void {
    const waiter = this.waiter;
    if (waiter !== null) {
      this.waiter = null;
      waiter(frame);
    } else {
      this.frames.push(frame);
    }
  }

  private fail(error: Error): void {
    this.closed ??= error;
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.(this.closed);
  }

  /** The next stdin frame. */
  private next(): Promise<Uint8Array> {
    const frame = this.frames.shift();
    if (frame !== undefined) return Promise.resolve(frame);
    if (this.closed !== null) return Promise.reject(this.closed);
    return new Promise((resolve, reject) => {
      this.waiter = (value) => (value instanceof Error ? reject(value) : resolve(value));
    });
  }

  /** Reads and decodes the launch (the first line). */
  async launch(): Promise<ControllerLaunch> {
    let frame: Uint8Array;
    try {
      frame = await this.next();
    } catch {
      throw new ControllerProtocolError("stdin closed before the launch line");
    }
    try {
      return decodeControllerLaunch(frameContent(frame));
    } catch (error) {
      throw new ControllerProtocolError(`the launch line is not a controller.v1 launch (${error instanceof SafeError ? error.code : "malformedFrame"})`);
    }
  }

  /** Writes one message and waits for its reply (after every earlier request's). */
  request(message: Outgoing): Promise<ControllerServerMessage> {
    const turn = this.chain.then(() =>
      this.exchange(message).catch((error: unknown) => {
        if (error instanceof ControllerProtocolError) this.breakWith(error);
        throw error;
      }),
    );
    this.chain = turn.catch(() => undefined);
    return turn;
  }

  private async exchange(message: Outgoing): Promise<ControllerServerMessage> {
    const requestId = this.nextId;
    const full = { ...message, requestId } as ControllerChildMessage;
    // Throws SafeError (schemaInvalid, frameTooLarge, nestingTooDeep, internal) before anything is written; the id is not used up.
    const bytes = encodeControllerChild(full);
    this.nextId += 1;
    await new Promise<void>((resolve, reject) => this.output.write(bytes, (error) => (error ? reject(new ControllerProtocolError("stdout closed")) : resolve())));
    let frame: Uint8Array;
    try {
      frame = await this.next();
    } catch (error) {
      throw error instanceof ControllerProtocolError ? error : new ControllerProtocolError("stdin failed");
    }
    let reply: ControllerServerMessage;
    try {
      reply = decodeControllerServerFrame(frame);
    } catch (error) {
      throw new ControllerProtocolError(`the reply to request ${requestId} (${message.kind}) is not a controller.v1 reply (${error instanceof SafeError ? error.code : "malformedFrame"})`);
    }
    if (reply.requestId !== requestId) {
      throw new ControllerProtocolError(`a reply names request ${reply.requestId} while request ${requestId} (${message.kind}) waits`);
    }
    if (reply.outcome === "accepted") {
      const missing = missingReplyField(message.kind, reply);
      if (missing !== null) throw new ControllerProtocolError(`the accepted reply to request ${requestId} (${message.kind}) lacks ${missing}`);
    }
    return reply;
  }
}

/** The field an accepted reply to a `kind` message must carry, when it lacks it. */
function missingReplyField(kind: ControllerChildMessage["kind"], reply: ControllerServerMessage): string | null {
  switch (kind) {
    case "effect.ensure":
    case "effect.observed":
      if (reply.effectAction === undefined) return "effectAction";
      return reply.effect === undefined ? "effect" : null;
    case "effect.settled":
      return reply.effect === undefined ? "effect" : null;
    case "workflow.ensure":
      return reply.workflowRequest === undefined ? "workflowRequest" : null;
    case "finished":
    case "failed":
      return reply.finishOutcome === undefined ? "finishOutcome" : null;
    case "resolved":
    case "resolveFailed":
      return null;
  }
}

// --- loading ----------------------------------------------------------------

/** A controller definition found in a module, with the name of its export. */
interface Found {
  exportName: string;
  definition: ControllerDefinition;
}

/** Why a controller could not be loaded: a resolve failure code and a safe message. */
class LoadFailure extends Error {
  constructor(
    readonly code: ResolveFailureCode,
    message: string,
  ) {
    super(bounded(message));
  }
}

/** The source bytes and their digest, or `sourceNotFound`. */
async function readSource(path: string): Promise<{ bytes: Buffer; digest: string }> {
  try {
    const bytes = await readFile(path);
    return { bytes, digest: sha256Digest(bytes) };
  } catch (error) {
    const code = (error as { code?: unknown } | null)?.code;
    throw new LoadFailure("sourceNotFound", `the controller file cannot be read (${typeof code === "string" ? code : "error"})`);
  }
}

/** Loads the module and finds the exported definition named `controller`. */
async function loadController(path: string, controller: string, bytes: Buffer, digest: string): Promise<Found> {
  rememberVerified(path, bytes);
  let namespace: unknown;
  try {
    namespace = await importModuleFile(path, false, (error) => error instanceof WorkflowDefinitionError);
  } catch (error) {
    if (error instanceof WorkflowDefinitionError) {
      // defineController's own checks: messages name the rule and the controller name, never a spec.
      throw new LoadFailure("invalidDefinition", error.message.split("\n")[0] ?? "invalid definition");
    }
    throw new LoadFailure("compileFailed", "the controller module cannot be loaded (a syntax, import or evaluation error; run it with node to see it)");
  }
  // The bytes loaded must be the bytes hashed (jiti reads the file again).
  const after = await readSource(path);
  if (after.digest !== digest) throw new LoadFailure("sourceChanged", "the controller file changed while it was loaded; apply it again");
  const found: Found[] = [];
  const seen = new Set<unknown>();
  const others: string[] = [];
  if (namespace !== null && (typeof namespace === "object" || typeof namespace === "function")) {
    for (const exportName of Object.keys(namespace).sort((a, b) => (a === "default" ? -1 : b === "default" ? 1 : a < b ? -1 : a > b ? 1 : 0))) {
      const value = (namespace as Record<string, unknown>)[exportName];
      if (!isControllerDefinition(value)) continue;
      if (value.name !== controller) {
        others.push(value.name);
        continue;
      }
      if (seen.has(value)) continue;
      seen.add(value);
      found.push({ exportName, definition: value });
    }
  }
  if (found.length === 1) return found[0] as Found;
  if (found.length > 1) throw new LoadFailure("invalidDefinition", `the module exports ${found.length} different definitions named ${JSON.stringify(controller)}; keep one`);
  if (others.length > 0) {
    const names = [...new Set(others)].sort().join(", ");
    throw new LoadFailure("invalidDefinition", `the module exports no controller named ${JSON.stringify(controller)} (it exports: ${names}); the file name and defineController({name}) must agree`);
  }
  throw new LoadFailure("invalidDefinition", "the module exports no defineController({...}) definition");
}

/** Whether a value is JSON the wire can carry (canonical, at most 64 levels). */
function jsonValue(value: unknown): value is JsonValue {
  try {
    checkDepth(new TextEncoder().encode(canonicalString(value)));
    return true;
  } catch {
    return false;
  }
}

// --- resolve mode -----------------------------------------------------------

async function resolveMode(channel: ControllerChannel, launch: ControllerResolveLaunch, log: Log): Promise<number> {
  let answer: Outgoing;
  try {
    const { bytes, digest } = await readSource(launch.controllerPath);
    const { exportName, definition } = await loadController(launch.controllerPath, launch.controller, bytes, digest);
    let initialStatus: unknown;
    try {
      initialStatus = definition.initialStatus(launch.spec);
    } catch (error) {
      throw new LoadFailure("invalidInput", `the spec is refused: ${described(error, "initialStatus(spec)")}`);
    }
    if (!jsonValue(initialStatus)) throw new LoadFailure("invalidDefinition", "initialStatus(spec) returned a value that is not JSON (or nests deeper than 64 levels)");
    answer = {
      kind: "resolved",
      exportName,
      initialStatus,
      sourceDigest: digest,
      ...(definition.timeoutMs !== undefined ? { timeoutMs: definition.timeoutMs } : {}),
    };
  } catch (error) {
    if (!(error instanceof LoadFailure)) throw error;
    log(`resolve of controller ${launch.controller} failed: ${error.code}: ${error.message}`);
    answer = { kind: "resolveFailed", code: error.code, message: error.message };
  }
  let reply: ControllerServerMessage;
  try {
    reply = await channel.request(answer);
  } catch (error) {
    if (error instanceof SafeError && answer.kind === "resolved") {
      // initialStatus that breaks a wire bound (frame size): the resolution fails instead.
      const failed: Outgoing = { kind: "resolveFailed", code: "invalidDefinition", message: `initialStatus(spec) cannot be sent (${error.code})` };
      reply = await channel.request(failed);
    } else {
      throw error;
    }
  }
  log(`resolve of controller ${launch.controller}: ${answer.kind}, reply ${reply.outcome}`);
  return EXIT_OK;
}

// --- reconcile mode -----------------------------------------------------------

/** Wire condition status ↔ authoring. */
export function conditionStatusFromWire(status: ResourceConditionStatus): ConditionStatus {
  switch (status) {
    case "true":
      return true;
    case "false":
      return false;
    case "unknown":
      return "unknown";
  }
}

/** Authoring condition status → wire; null for a value that is none of true, false, "unknown". */
export function conditionStatusToWire(status: unknown): ResourceConditionStatus | null {
  if (status === true) return "true";
  if (status === false) return "false";
  if (status === "unknown") return "unknown";
  return null;
}

const iso = (ms: number): string => new Date(ms).toISOString();

/** The resource as the authoring API shows it (timestamps ISO strings, condition statuses true/false/"unknown"). */
export function resourceFromWire(launch: ControllerReconcileLaunch): Resource<unknown, unknown> {
  const { metadata, spec, status } = launch.resource;
  const conditions: Condition[] = status.conditions.map((c: ResourceCondition) => ({
    type: c.type,
    status: conditionStatusFromWire(c.status),
    reason: c.reason,
    ...(c.message !== undefined ? { message: c.message } : {}),
    observedGeneration: c.observedGeneration,
    lastTransitionTime: iso(c.lastTransitionTime),
  }));
  const workflowRun = status.workflowRun;
  return {
    metadata: {
      uid: metadata.uid,
      controller: metadata.controller,
      key: metadata.key,
      resourceVersion: metadata.resourceVersion,
      generation: metadata.generation,
      ...(metadata.deletionTimestamp !== undefined ? { deletionTimestamp: iso(metadata.deletionTimestamp) } : {}),
      finalizers: [...metadata.finalizers],
    },
    spec,
    status: {
      observedGeneration: status.observedGeneration,
      conditions,
      controllerStatus: status.controllerStatus,
      ...(workflowRun !== null ? { workflowRun: workflowRun as unknown as NonNullable<Resource<unknown, unknown>["status"]["workflowRun"]> } : {}),
    },
  };
}

/** A reconcile result that is not one `results` builds. */
class InvalidResult extends Error {}

/** The wire status patch of a result's patch; throws InvalidResult naming the field. */
export function patchToWire(patch: StatusPatch<unknown> | undefined): ResourceStatusPatch {
  if (patch === undefined) return {};
  if (patch === null || typeof patch !== "object" || Array.isArray(patch)) throw new InvalidResult("the patch must be an object");
  const wire: ResourceStatusPatch = {};
  if (patch.controllerStatus !== undefined) {
    if (!jsonValue(patch.controllerStatus)) throw new InvalidResult("patch.controllerStatus is not JSON");
    wire.controllerStatus = { value: patch.controllerStatus };
  }
  if (patch.conditions !== undefined) {
    if (!Array.isArray(patch.conditions)) throw new InvalidResult("patch.conditions must be an array");
    wire.conditions = patch.conditions.map((c: ConditionPatch, i): ResourceConditionPatch => {
      if (c === null || typeof c !== "object") throw new InvalidResult(`patch.conditions[${i}] must be an object`);
      const status = conditionStatusToWire(c.status);
      if (status === null) throw new InvalidResult(`patch.conditions[${i}].status must be true, false or "unknown"`);
      if (typeof c.type !== "string" || typeof c.reason !== "string") throw new InvalidResult(`patch.conditions[${i}] needs a type and a reason`);
      if (c.message !== undefined && typeof c.message !== "string") throw new InvalidResult(`patch.conditions[${i}].message must be a string`);
      return { type: c.type, status, reason: c.reason, ...(c.message !== undefined ? { message: c.message } : {}) };
    });
  }
  if (patch.workflowRun !== undefined) {
    const run = patch.workflowRun;
    if (run === null) wire.workflowRun = { value: null };
    else {
      if (typeof run !== "object" || typeof run.requestKey !== "string" || typeof run.runId !== "string" || typeof run.state !== "string") {
        throw new InvalidResult("patch.workflowRun must be null or {requestKey, runId, state}");
      }
      wire.workflowRun = { value: { requestKey: run.requestKey, runId: run.runId, state: run.state } };
    }
  }
  if (patch.finalizers !== undefined) {
    if (!Array.isArray(patch.finalizers) || !patch.finalizers.every((f) => typeof f === "string")) throw new InvalidResult("patch.finalizers must be an array of strings");
    wire.finalizers = [...patch.finalizers];
  }
  return wire;
}

/** The `finished` message of a result; throws InvalidResult. */
function finishedMessage(result: unknown): Outgoing {
  if (result === null || typeof result !== "object") throw new InvalidResult("reconcile must return ctx.settled(), ctx.requeue() or ctx.requeueAfter(ms)");
  const r = result as ReconcileResult<unknown>;
  const patch = patchToWire(r.patch);
  switch (r.kind) {
    case "settled":
    case "requeue":
      return { kind: "finished", result: r.kind, patch };
    case "requeueAfter":
      if (!Number.isSafeInteger(r.afterMs) || r.afterMs <= 0) throw new InvalidResult("requeueAfter needs a positive integer afterMs");
      return { kind: "finished", result: "requeueAfter", afterMs: r.afterMs, patch };
    default:
      throw new InvalidResult("reconcile must return ctx.settled(), ctx.requeue() or ctx.requeueAfter(ms)");
  }
}

/** The authoring record of an effect view. */
function effectRecord(view: ControllerEffectView): EffectRecord {
  return {
    key: view.key,
    kind: view.kind,
    state: view.state,
    ...(view.error !== undefined ? { error: view.error } : {}),
    ...(view.externalRef !== undefined ? { externalRef: view.externalRef } : {}),
  };
}

function workflowRecord(view: ChildWorkflowView): WorkflowRequestRecord {
  return { requestKey: view.requestKey, workflow: view.workflow, attempt: view.attempt, runId: view.runId, state: view.state };
}

const OBSERVATIONS: Record<Observation, ControllerObservation> = { applied: "applied", not_applied: "notApplied", indeterminate: "indeterminate" };

/** One reconcile pass's state: the signal, whether the pass ended, whether the claim is lost. */
class Pass {
  readonly abort = new AbortController();
  ended = false;
  claimLost = false;
  effectBusy = false;

  constructor(
    readonly channel: ControllerChannel,
    readonly log: Log,
  ) {}

  /** Sends a message from inside reconcile; a rejected reply throws (claimLost also aborts the signal). */
  async call(message: Outgoing): Promise<ControllerServerMessage> {
    if (this.claimLost) throw new ControllerChannelError("the claim is lost: this pass can change nothing", "claimLost");
    if (this.ended) throw new ControllerChannelError("the reconcile pass has ended (deadline or result): ctx can no longer be used");
    let reply: ControllerServerMessage;
    try {
      reply = await this.channel.request(message);
    } catch (error) {
      if (error instanceof SafeError) throw new ControllerChannelError(`the ${message.kind} message breaks the protocol (${error.code})`);
      throw error;
    }
    if (reply.outcome === "rejected") {
      const code = reply.code ?? "rejected";
      if (code === "claimLost") this.loseClaim();
      throw new ControllerChannelError(`the server rejected ${message.kind} (${code})${reply.message !== undefined ? `: ${reply.message}` : ""}`, code);
    }
    return reply;
  }

  /** Throws when the pass is over (deadline, claim lost): no provider call starts after it. */
  private live(what: string): void {
    if (this.claimLost) throw new ControllerChannelError(`the claim is lost: ${what} is not called`, "claimLost");
    if (this.ended || this.abort.signal.aborted) throw new ControllerChannelError(`the reconcile pass has ended: ${what} is not called`);
  }

  loseClaim(): void {
    if (this.claimLost) return;
    this.claimLost = true;
    this.log("the claim is lost: aborting the reconcile signal");
    const reason = new Error("the claim is lost");
    reason.name = "AbortError";
    this.abort.abort(reason);
  }

  async ensureEffect(effect: EffectSpec): Promise<EffectRecord> {
    if (effect === null || typeof effect !== "object") throw new ControllerChannelError("ctx.effects.ensure needs {key, kind, request, observe, apply}");
    if (typeof effect.key !== "string" || effect.key === "") throw new ControllerChannelError("ctx.effects.ensure: key must be a non-empty string");
    if (typeof effect.kind !== "string" || effect.kind === "") throw new ControllerChannelError("ctx.effects.ensure: kind must be a non-empty string");
    if (typeof effect.observe !== "function" || typeof effect.apply !== "function") throw new ControllerChannelError("ctx.effects.ensure: observe(signal) and apply(signal) must be functions");
    let fingerprint: string;
    try {
      fingerprint = requestFingerprint(effect.request);
    } catch {
      throw new ControllerChannelError("ctx.effects.ensure: request must be a JSON value");
    }
    if (this.effectBusy) throw new ControllerChannelError("ctx.effects.ensure: another effect of this pass is still in progress");
    this.effectBusy = true;
    try {
      let reply = await this.call({ kind: "effect.ensure", key: effect.key, effectKind: effect.kind, requestFingerprint: fingerprint });
      if (reply.effectAction === "observe") {
        let observation: ControllerObservation;
        this.live("observe");
        try {
          const found: unknown = await effect.observe(this.abort.signal);
          const mapped = typeof found === "string" ? OBSERVATIONS[found as Observation] : undefined;
          if (mapped === undefined) {
            this.log(`effect observe returned a value that is not "applied", "not_applied" or "indeterminate": treated as indeterminate`);
          }
          observation = mapped ?? "indeterminate";
        } catch (error) {
          this.log(`effect observe failed (${described(error, "observe")}): reported indeterminate`);
          observation = "indeterminate";
        }
        reply = await this.call({ kind: "effect.observed", key: effect.key, observation });
        if (reply.effectAction === "observe") throw new ControllerProtocolError("the server asked to observe an effect again after its observation");
      }
      if (reply.effectAction === "apply") {
        let applyResult: "applied" | "rejected" | "indeterminate";
        let error: string | undefined;
        this.live("apply");
        try {
          const result: unknown = await effect.apply(this.abort.signal);
          if (result === "applied" || result === "rejected" || result === "indeterminate") applyResult = result;
          else {
            applyResult = "indeterminate";
            error = 'apply returned a value that is not "applied", "rejected" or "indeterminate"';
          }
        } catch (thrown) {
          applyResult = "indeterminate";
          error = described(thrown, "apply");
        }
        reply = await this.call({ kind: "effect.settled", key: effect.key, applyResult, ...(error !== undefined ? { error } : {}) });
      }
      return effectRecord(reply.effect as ControllerEffectView);
    } finally {
      this.effectBusy = false;
    }
  }

  async ensureWorkflow(request: WorkflowRequestSpec): Promise<WorkflowRequestRecord> {
    if (request === null || typeof request !== "object") throw new ControllerChannelError("ctx.workflows.ensure needs {requestKey, workflow, input}");
    if (typeof request.requestKey !== "string" || request.requestKey === "") throw new ControllerChannelError("ctx.workflows.ensure: requestKey must be a non-empty string");
    if (typeof request.workflow !== "string" || request.workflow === "") throw new ControllerChannelError("ctx.workflows.ensure: workflow must be a non-empty string");
    const input = request.input === undefined ? null : request.input;
    if (!jsonValue(input)) throw new ControllerChannelError("ctx.workflows.ensure: input must be a JSON value");
    const reply = await this.call({ kind: "workflow.ensure", requestKey: request.requestKey, workflow: request.workflow, input });
    return workflowRecord(reply.workflowRequest as ChildWorkflowView);
  }

  context(): ReconcileContext<unknown> {
    return {
      signal: this.abort.signal,
      effects: { ensure: (effect) => this.ensureEffect(effect) },
      workflows: { ensure: (request) => this.ensureWorkflow(request) },
      settled: (patch) => results.settled(patch),
      requeue: (patch) => results.requeue(patch),
      requeueAfter: (ms, patch) => results.requeueAfter(ms, patch),
    };
  }
}

async function reconcileMode(channel: ControllerChannel, launch: ControllerReconcileLaunch, log: Log): Promise<number> {
  log(`reconcile pass of controller ${launch.controller}, claim generation ${launch.claimGeneration}, deadline ${launch.timeoutMs} ms`);
  const pass = new Pass(channel, log);
  // The deadline runs from the launch: loading counts against it.
  let expired!: () => void;
  const deadline = new Promise<"deadline">((resolve) => {
    expired = () => resolve("deadline");
  });
  const timer = setTimeout(() => {
    const reason = new Error(`the reconcile deadline (${launch.timeoutMs} ms) passed`);
    reason.name = "TimeoutError";
    pass.abort.abort(reason);
    expired();
  }, launch.timeoutMs);
  const claimLost = new Promise<"claimLost">((resolve) => pass.abort.signal.addEventListener("abort", () => pass.claimLost && resolve("claimLost"), { once: true }));
  try {
    const running = runPass(pass, launch);
    const outcome = await Promise.race([running, deadline, claimLost, channel.broken]);
    pass.ended = true;
    if (outcome === "claimLost" || pass.claimLost) {
      // Nothing more is sent; reconcile may still see its aborted signal and stop (until the deadline).
      await Promise.race([running.catch(() => undefined), deadline]);
      log("the claim is lost: the pass ends without a result");
      return EXIT_OK;
    }
    let message: Outgoing;
    if (outcome === "deadline") {
      log(`the reconcile deadline (${launch.timeoutMs} ms) passed: the pass fails`);
      message = { kind: "failed", message: `the reconcile deadline (${launch.timeoutMs} ms) passed` };
    } else {
      message = outcome;
    }
    let reply: ControllerServerMessage;
    try {
      reply = await channel.request(message);
    } catch (error) {
      if (!(error instanceof SafeError)) throw error;
      // A result beyond the wire's bounds (too many conditions, a frame over 1 MiB): the pass fails instead.
      log(`the ${message.kind} message breaks the protocol (${error.code}): the pass fails`);
      reply = await channel.request({ kind: "failed", message: `reconcile returned a result the protocol refuses (${error.code})` });
    }
    log(`pass ${message.kind === "finished" ? `finished (${message.result})` : "failed"}: reply ${reply.outcome}${reply.finishOutcome !== undefined ? ` (${reply.finishOutcome})` : reply.code !== undefined ? ` (${reply.code})` : ""}`);
    return EXIT_OK;
  } finally {
    clearTimeout(timer);
  }
}

/** Checks the source, loads it and runs reconcile: the message that ends the pass. */
async function runPass(pass: Pass, launch: ControllerReconcileLaunch): Promise<Outgoing> {
  let found: Found;
  try {
    const { bytes, digest } = await readSource(launch.controllerPath);
    if (digest !== launch.sourceDigest) {
      pass.log("the controller source digest differs from the applied one: refused");
      return { kind: "failed", message: SOURCE_CHANGED_MESSAGE };
    }
    found = await loadController(launch.controllerPath, launch.controller, bytes, digest);
  } catch (error) {
    if (!(error instanceof LoadFailure)) throw error;
    pass.log(`cannot load controller ${launch.controller}: ${error.code}`);
    return { kind: "failed", message: error.code === "sourceChanged" ? SOURCE_CHANGED_MESSAGE : error.message };
  }
  let result: unknown;
  try {
    result = await found.definition.reconcile(pass.context(), resourceFromWire(launch));
  } catch (error) {
    if (error instanceof ControllerProtocolError) throw error;
    if (pass.abort.signal.aborted && !pass.claimLost) return { kind: "failed", message: `reconcile stopped: ${String((pass.abort.signal.reason as Error).message)}` };
    return { kind: "failed", message: described(error, "reconcile") };
  }
  try {
    return finishedMessage(result);
  } catch (error) {
    if (error instanceof InvalidResult) return { kind: "failed", message: bounded(`reconcile returned an invalid result: ${error.message}`) };
    throw error;
  }
}

// --- main ---------------------------------------------------------------------

/** Runs the controller child on the given stdio and returns its exit code. */
export async function main(input: Readable = process.stdin, output: Writable = process.stdout, log: Log = defaultLog): Promise<number> {
  const channel = new ControllerChannel(input, output);
  try {
    const launch = await channel.launch();
    // One short-lived process: Node's type stripping where it has it, and the user-only transform cache.
    configureLoading({ native: true, cache: TransformCache.open(defaultHome()) });
    switch (launch.kind) {
      case "controller.resolve":
        return await resolveMode(channel, launch, log);
      case "controller.reconcile":
        return await reconcileMode(channel, launch, log);
    }
  } catch (error) {
    if (error instanceof ControllerProtocolError) {
      log(`${error.message}; this program is started by the pi-workflows server (controller.v1 channel), check that the server and the SDK are the same version`);
      return EXIT_PROTOCOL;
    }
    throw error;
  }
}
