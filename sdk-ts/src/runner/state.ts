/**
 * The runner's copy of the narrow run state (`command.state`), kept current
 * as its own attempts finish, and the projection a node's callbacks see.
 *
 * Projection (reference §1.7): a node inside a mount sees its own level only,
 * under local names: the child's mapped input (the entry node's output), and
 * the outputs and results of the current invocation (recorded after the
 * mount's latest entry). A nested mount appears to its parent as
 * `outputs[mount] = {exit, output}` of its latest exit.
 *
 * Outputs: the wire state carries each output once, in its result; the
 * outputs are derived here (the latest `ok` result's output, null when it
 * has none), exactly what the server's `outputs` used to say.
 *
 * Ordering: `command.state.resultOrder` orders the latest results that
 * predate this runner process by the step that recorded them; results of
 * this process follow in the order they were recorded.
 */
import type { NodeResult, RunStateView } from "../authoring/types.js";
import type { RunState as WireRunState } from "../generated/types.js";
import { MAX_DEPTH, jsonDepth } from "../protocol/canonical.js";

/**
 * The deepest a node output may nest: a runner that resumes the run receives
 * it at `command.state.value.results.<node>.output`, five levels down a frame
 * of at most MAX_DEPTH (64) levels. Deeper outputs could be proposed but never
 * resumed.
 */
export const MAX_OUTPUT_DEPTH = MAX_DEPTH - 5;
/** The deepest a run's normalized input may nest: it travels at `command.state.value.input`, three levels down. */
export const MAX_INPUT_DEPTH = MAX_DEPTH - 3;

/** Why `value` is too deep for its place in the run state, or null. */
export function stateDepthProblem(value: unknown, what: string, max: number, place: string): string | null {
  const depth = jsonDepth(value);
  if (depth <= max) return null;
  return `${what} nests ${depth} levels; it may nest at most ${max}, so that the run state a runner receives (${place}) fits the protocol's ${MAX_DEPTH}-level frame limit`;
}

const EXIT_PREFIX = "__piw_exit_";

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export class RunState {
  input: unknown;
  readonly outputs: Record<string, unknown>;
  readonly results: Record<string, NodeResult>;
  steps: number;
  private readonly order = new Map<string, number>();
  private counter = 0;

  constructor(state: WireRunState) {
    this.input = state.input;
    this.results = { ...(state.results as unknown as Record<string, NodeResult>) };
    // Each output travels once, inside its result: the latest `ok` result
    // of a node holds its output (absent means null). A copy, so that
    // `outputs` and `results` stay independent values as before.
    this.outputs = {};
    for (const [id, result] of Object.entries(this.results)) {
      if (result.outcome === "ok") this.outputs[id] = result.output === undefined ? null : structuredClone(result.output);
    }
    this.steps = state.steps;
    for (const id of state.resultOrder) {
      if (id in this.results) this.order.set(id, ++this.counter);
    }
  }

  /** Records a finished attempt of `nodeId` (the server accepted it). */
  record(nodeId: string, result: NodeResult): void {
    if (result.outcome === "ok") this.outputs[nodeId] = result.output === undefined ? null : result.output;
    else delete this.outputs[nodeId];
    this.results[nodeId] = result;
    this.steps += 1;
    this.order.set(nodeId, ++this.counter);
  }

  /** The order index of a node's latest result (0 when none). */
  orderOf(nodeId: string): number {
    return this.order.get(nodeId) ?? 0;
  }

  /**
   * The state as seen at `mountPath` (`[]` for the root): local names only,
   * the current invocation only, nested mounts as their latest exit.
   */
  project(mountPath: readonly string[], mounts: ReadonlySet<string>): RunStateView {
    if (mountPath.length === 0 && mounts.size === 0) {
      return { input: this.input, outputs: { ...this.outputs }, results: { ...this.results }, steps: this.steps };
    }
    const entryId = mountPath.join("/");
    const prefix = mountPath.length === 0 ? "" : `${entryId}/`;
    const since = mountPath.length === 0 ? 0 : this.orderOf(entryId);
    const outputs: Record<string, unknown> = {};
    const results: Record<string, NodeResult> = {};
    let steps = 0;
    const latestExit = new Map<string, string>();
    for (const id of Object.keys(this.results)) {
      if (!id.startsWith(prefix) || this.orderOf(id) <= since) continue;
      const rest = id.slice(prefix.length);
      const slash = rest.indexOf("/");
      if (slash < 0) {
        if (rest.startsWith(EXIT_PREFIX) || mounts.has(id)) continue;
        results[rest] = { ...(this.results[id] as NodeResult), nodeId: rest };
        if (Object.prototype.hasOwnProperty.call(this.outputs, id)) outputs[rest] = this.outputs[id];
        steps += 1;
        continue;
      }
      const mount = rest.slice(0, slash);
      const tail = rest.slice(slash + 1);
      if (tail.startsWith(EXIT_PREFIX) && !tail.includes("/")) {
        const current = latestExit.get(mount);
        if (current === undefined || this.orderOf(id) > this.orderOf(current)) latestExit.set(mount, id);
      }
    }
    for (const [mount, exitId] of latestExit) {
      const mountEntry = prefix + mount;
      if (this.orderOf(exitId) < this.orderOf(mountEntry)) continue; // re-entered, not exited yet
      results[mount] = { ...(this.results[exitId] as NodeResult), nodeId: mount };
      if (Object.prototype.hasOwnProperty.call(this.outputs, exitId)) outputs[mount] = this.outputs[exitId];
    }
    let input = this.input;
    if (mountPath.length > 0) {
      const entry = this.outputs[entryId];
      input = isRecord(entry) ? (entry.input ?? null) : null;
    }
    return { input, outputs, results, steps };
  }

  /** The invocation number of the mount whose entry is `entryId` (its entry output's `invocation`). */
  invocationOf(entryId: string): number {
    const entry = this.outputs[entryId];
    return isRecord(entry) && typeof entry.invocation === "number" ? entry.invocation : 0;
  }
}
