/**
 * A client-side live run view: the snapshot a subscription delivered plus
 * the patches after it. The same rules as the Rust client (`server::live`).
 *
 * Invariants:
 * - A patch applies only to the exact revision it names as its base; any
 *   other base is refused, so the holder never shows a view that mixes two
 *   revisions (it re-subscribes from its revision instead).
 * - Operations are the server's four: `add`, `replace`, `remove` (a JSON
 *   pointer into an object or array) and `append` (push onto an array).
 * - A refused patch leaves the view unchanged.
 */
import type { ClientEvent, JsonValue, PatchOp, RunView } from "../generated/types.js";

/** Why an event could not be applied. */
export class LiveViewError extends Error {
  readonly code: "baseMismatch" | "badOperation" | "notRunView";
  constructor(code: LiveViewError["code"], message: string) {
    super(message);
    this.name = "LiveViewError";
    this.code = code;
  }
}

type Json = JsonValue;

function isObject(value: unknown): value is Record<string, Json> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function unescape(token: string): string {
  return token.replace(/~1/g, "/").replace(/~0/g, "~");
}

/** The value at a JSON pointer, or undefined. */
function resolve(document: Json, pointer: string): Json | undefined {
  if (pointer === "") return document;
  if (!pointer.startsWith("/")) return undefined;
  let current: Json | undefined = document;
  for (const raw of pointer.slice(1).split("/")) {
    const token = unescape(raw);
    if (Array.isArray(current)) {
      if (!/^(0|[1-9][0-9]*)$/.test(token)) return undefined;
      current = current[Number(token)];
    } else if (isObject(current)) {
      current = Object.prototype.hasOwnProperty.call(current, token) ? current[token] : undefined;
    } else {
      return undefined;
    }
    if (current === undefined) return undefined;
  }
  return current;
}

/** Applies `ops` to a copy of `document` in order; throws on the first bad operation. */
export function applyPatch<T extends Json>(document: T, ops: readonly PatchOp[]): T {
  const patched = structuredClone(document) as Json;
  for (const op of ops) {
    const bad = (): LiveViewError => new LiveViewError("badOperation", `${op.op} ${op.path}`);
    if (op.op === "append") {
      const target = resolve(patched, op.path);
      if (!Array.isArray(target)) throw bad();
      target.push(structuredClone(op.value));
      continue;
    }
    const cut = op.path.lastIndexOf("/");
    if (cut < 0) throw bad();
    const parent = resolve(patched, op.path.slice(0, cut));
    const key = unescape(op.path.slice(cut + 1));
    if (isObject(parent)) {
      const present = Object.prototype.hasOwnProperty.call(parent, key);
      if (op.op === "remove") {
        if (!present) throw bad();
        delete parent[key];
      } else {
        if (op.op === "replace" && !present) throw bad();
        parent[key] = structuredClone(op.value);
      }
    } else if (Array.isArray(parent)) {
      const index = key === "-" && op.op === "add" ? parent.length : /^(0|[1-9][0-9]*)$/.test(key) ? Number(key) : -1;
      if (index < 0) throw bad();
      if (op.op === "replace") {
        if (index >= parent.length) throw bad();
        parent[index] = structuredClone(op.value);
      } else if (op.op === "add") {
        if (index > parent.length) throw bad();
        parent.splice(index, 0, structuredClone(op.value));
      } else {
        if (index >= parent.length) throw bad();
        parent.splice(index, 1);
      }
    } else {
      throw bad();
    }
  }
  return patched as T;
}

/** The view a run subscriber holds. */
export class LiveRunView {
  #view: RunView | undefined;

  /** The current view, once a snapshot arrived. */
  get view(): RunView | undefined {
    return this.#view;
  }

  /** The revision of the current view. */
  get revision(): number | undefined {
    return this.#view?.revision;
  }

  /** Applies one event (`runViewSnapshot` or `runViewPatch`); throws `LiveViewError` and changes nothing when it does not fit. */
  apply(event: ClientEvent): RunView {
    if (event.kind === "runViewSnapshot") {
      this.#view = structuredClone(event.view);
      return this.#view;
    }
    if (event.kind !== "runViewPatch") throw new LiveViewError("notRunView", `a ${event.kind} event is not a run view`);
    if (this.#view === undefined || this.#view.revision !== event.baseRevision) {
      throw new LiveViewError("baseMismatch", `a patch from revision ${event.baseRevision} does not fit revision ${String(this.revision)}`);
    }
    this.#view = applyPatch(this.#view as unknown as Json, event.ops) as unknown as RunView;
    return this.#view;
  }
}
