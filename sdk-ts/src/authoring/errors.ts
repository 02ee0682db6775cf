/** Errors of the authoring API. */

/** A definition or node that breaks an authoring rule (shape or graph). */
export class WorkflowDefinitionError extends Error {
  override readonly name = "WorkflowDefinitionError";
}

/** An include chain that returns to a workflow already on it. */
export class IncludeCycleError extends WorkflowDefinitionError {
  constructor(readonly chain: readonly string[]) {
    super(`include cycle: ${chain.join(" -> ")}`);
  }
}

/** Throws a WorkflowDefinitionError with `message`. */
export function fail(message: string): never {
  throw new WorkflowDefinitionError(message);
}

/** Node ids and mount names: `^[A-Za-z_][A-Za-z0-9_-]*$`, no `__piw_` prefix, not an Object.prototype member. */
export const NODE_ID_PATTERN = /^[A-Za-z_][A-Za-z0-9_-]*$/;
/** The longest local id: qualified ids must fit the wire's 128 characters. */
export const MAX_ID_LENGTH = 64;

const PROTOTYPE_NAMES = new Set(Object.getOwnPropertyNames(Object.prototype));

/** Checks a node id or mount name. */
export function checkId(id: string, what: string): void {
  if (typeof id !== "string" || !NODE_ID_PATTERN.test(id)) {
    fail(`${what} ${JSON.stringify(id)} must match ${NODE_ID_PATTERN.source}`);
  }
  if (id.length > MAX_ID_LENGTH) {
    fail(`${what} ${JSON.stringify(id)} is longer than ${MAX_ID_LENGTH} characters`);
  }
  if (id.startsWith("__piw_")) {
    fail(`${what} ${JSON.stringify(id)} must not start with __piw_ (reserved for compiled include nodes)`);
  }
  if (PROTOTYPE_NAMES.has(id)) {
    fail(`${what} ${JSON.stringify(id)} shadows an Object.prototype member`);
  }
}

/** Contract, built-in and decision ids: `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`. */
export const STABLE_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/** True for a string with a control character (C0, DEL or C1). */
export function hasControl(text: string): boolean {
  // eslint-disable-next-line no-control-regex
  return /[\u0000-\u001f\u007f-\u009f]/.test(text);
}

/** A plain own-property record (not an array, not null). */
export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The own enumerable string keys of `value`. */
export function ownKeys(value: object): string[] {
  return Object.keys(value);
}

/** True when `key` is an own property of `record`. */
export function hasOwn(record: object, key: string): boolean {
  return Object.prototype.hasOwnProperty.call(record, key);
}
