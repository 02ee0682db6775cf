/**
 * The controller authoring API (`@pi-workflows/sdk/controllers`; reference
 * §6, CONTROLLERS.md): `defineController`, the resource shape, conditions
 * and their helpers, and the reconcile context a controller's `reconcile`
 * receives.
 *
 * What is here: the definitions, their eager shape checks, the result
 * constructors, discovery (`discovery.ts`) and the controller child
 * (`child.ts`, the `pi-workflows-controller` program the server runs for a
 * resolve or a reconcile pass; it builds the real `ReconcileContext` over
 * the controller.v1 channel). The rules the server applies to what a
 * child proposes are the kernel's (`kernel::resource`, `reconcile`,
 * `controller_effect`, `child_workflow`).
 */
import { fail, isRecord } from "../authoring/errors.js";

/** Controller names: `^[a-z][a-z0-9-]*$`, at most 64 characters (as `kernel::resource::check_name`). */
export const CONTROLLER_NAME_PATTERN = /^[a-z][a-z0-9-]*$/;

/** A condition's value. */
export type ConditionStatus = true | false | "unknown";

/** One condition of a resource's status. */
export interface Condition {
  type: string;
  status: ConditionStatus;
  reason: string;
  message?: string;
  observedGeneration: number;
  /** Changes only when `status` changes. */
  lastTransitionTime: string;
}

/** A condition as `reconcile` proposes it; the server stamps the rest. */
export interface ConditionPatch {
  type: string;
  status: ConditionStatus;
  reason: string;
  message?: string;
}

/** What the server keeps about a resource. */
export interface ResourceMetadata {
  uid: string;
  controller: string;
  key: string;
  /** The compare-and-swap token: grows on every write. */
  resourceVersion: number;
  /** Grows only when the spec changes. */
  generation: number;
  deletionTimestamp?: string;
  finalizers: string[];
}

/** A child workflow run a controller points at. */
export interface WorkflowRunRef {
  requestKey: string;
  runId: string;
  state: WorkflowRequestState;
}

/** A resource's status. */
export interface ResourceStatus<S> {
  observedGeneration: number;
  conditions: Condition[];
  controllerStatus: S;
  workflowRun?: WorkflowRunRef;
}

/** A managed resource. */
export interface Resource<Spec, S> {
  metadata: ResourceMetadata;
  spec: Spec;
  status: ResourceStatus<S>;
}

/** The status change a reconcile proposes; an absent field keeps its value, `workflowRun: null` clears it. */
export interface StatusPatch<S> {
  controllerStatus?: S;
  conditions?: ConditionPatch[];
  workflowRun?: WorkflowRunRef | null;
  finalizers?: string[];
}

/** How a reconcile ends. */
export type ReconcileResult<S> =
  | { kind: "settled"; patch?: StatusPatch<S> }
  | { kind: "requeue"; patch?: StatusPatch<S> }
  | { kind: "requeueAfter"; afterMs: number; patch?: StatusPatch<S> };

/** An effect's state. */
export type EffectState = "pending" | "applied" | "rejected" | "indeterminate";

/** What `observe` found in the external system. */
export type Observation = "applied" | "not_applied" | "indeterminate";

/** One guarded external effect: observed before any retry, at most one per reconcile pass. */
export interface EffectSpec {
  key: string;
  kind: string;
  /** Its canonical JSON is the request fingerprint: the same key with another request is a conflict. */
  request: unknown;
  observe(signal: AbortSignal): Promise<Observation>;
  apply(signal: AbortSignal): Promise<"applied" | "rejected" | "indeterminate">;
}

/** An effect's record. */
export interface EffectRecord {
  key: string;
  kind: string;
  state: EffectState;
  /** Why apply ended indeterminate (a bounded message without payload contents). */
  error?: string;
  externalRef?: string;
}

/** A child workflow request's state. */
export type WorkflowRequestState = "running" | "waiting" | "succeeded" | "failed" | "interrupted";

/** A child workflow run by stable request key. */
export interface WorkflowRequestSpec {
  requestKey: string;
  workflow: string;
  input: unknown;
}

/** A child workflow request's record. */
export interface WorkflowRequestRecord {
  requestKey: string;
  workflow: string;
  attempt: number;
  runId: string;
  state: WorkflowRequestState;
}

/** What `reconcile` receives besides the resource. */
export interface ReconcileContext<S> {
  /** Aborted at the reconcile deadline or when the claim is lost: pass it to provider calls. */
  signal: AbortSignal;
  effects: { ensure(effect: EffectSpec): Promise<EffectRecord> };
  workflows: { ensure(request: WorkflowRequestSpec): Promise<WorkflowRequestRecord> };
  settled(patch?: StatusPatch<S>): ReconcileResult<S>;
  requeue(patch?: StatusPatch<S>): ReconcileResult<S>;
  requeueAfter(ms: number, patch?: StatusPatch<S>): ReconcileResult<S>;
}

/** A controller definition. */
export interface ControllerSpec<Spec, S> {
  name: string;
  initialStatus(spec: Spec): S;
  reconcile(ctx: ReconcileContext<S>, resource: Resource<Spec, S>): Promise<ReconcileResult<S>> | ReconcileResult<S>;
  /** The reconcile deadline (default 60 s). */
  timeoutMs?: number;
}

const CONTROLLER_BRAND: unique symbol = Symbol.for("pi-workflows.controller");

/** A checked controller definition. */
export interface ControllerDefinition<Spec = unknown, S = unknown> extends ControllerSpec<Spec, S> {
  readonly [CONTROLLER_BRAND]: true;
}

/** Defines a controller. Validates its shape now. */
export function defineController<Spec = unknown, S = unknown>(spec: ControllerSpec<Spec, S>): ControllerDefinition<Spec, S> {
  if (!isRecord(spec)) fail("defineController() needs an options object");
  if (typeof spec.name !== "string" || !CONTROLLER_NAME_PATTERN.test(spec.name) || spec.name.length > 64) {
    fail(`defineController(): name must match ${CONTROLLER_NAME_PATTERN.source} (at most 64 characters), got ${JSON.stringify(spec.name)}`);
  }
  const what = `controller ${JSON.stringify(spec.name)}`;
  if (typeof spec.initialStatus !== "function") fail(`${what}: initialStatus(spec) must be a function`);
  if (typeof spec.reconcile !== "function") fail(`${what}: reconcile(ctx, resource) must be a function`);
  if (spec.timeoutMs !== undefined && (!Number.isSafeInteger(spec.timeoutMs) || spec.timeoutMs <= 0)) {
    fail(`${what}: timeoutMs must be a positive integer`);
  }
  return Object.freeze({ ...spec, [CONTROLLER_BRAND]: true as const });
}

/** True for a value `defineController` returned. */
export function isControllerDefinition(value: unknown): value is ControllerDefinition {
  return isRecord(value) && (value as Record<PropertyKey, unknown>)[CONTROLLER_BRAND] === true;
}

function condition(type: string, status: ConditionStatus, reason: string, message?: string): ConditionPatch {
  if (typeof type !== "string" || type === "") fail("a condition needs a type");
  if (typeof reason !== "string" || reason === "") fail(`condition ${JSON.stringify(type)} needs a reason`);
  return message === undefined ? { type, status, reason } : { type, status, reason, message };
}

/** A condition that holds. */
export const conditionTrue = (type: string, reason: string, message?: string): ConditionPatch => condition(type, true, reason, message);
/** A condition that does not hold. */
export const conditionFalse = (type: string, reason: string, message?: string): ConditionPatch => condition(type, false, reason, message);
/** A condition whose value is not known yet. */
export const conditionUnknown = (type: string, reason: string, message?: string): ConditionPatch => condition(type, "unknown", reason, message);

/** The result constructors a `ReconcileContext` carries (`settled`, `requeue`, `requeueAfter`). */
export const results = {
  settled<S>(patch?: StatusPatch<S>): ReconcileResult<S> {
    return patch === undefined ? { kind: "settled" } : { kind: "settled", patch };
  },
  requeue<S>(patch?: StatusPatch<S>): ReconcileResult<S> {
    return patch === undefined ? { kind: "requeue" } : { kind: "requeue", patch };
  },
  requeueAfter<S>(ms: number, patch?: StatusPatch<S>): ReconcileResult<S> {
    if (!Number.isSafeInteger(ms) || ms <= 0) fail("requeueAfter(ms): ms must be a positive integer");
    return patch === undefined ? { kind: "requeueAfter", afterMs: ms } : { kind: "requeueAfter", afterMs: ms, patch };
  },
};

export { CONTROLLER_SUFFIXES, controllerNameOf, discoverControllers, globalControllerDir } from "./discovery.js";
export type { DiscoveredController } from "./discovery.js";
