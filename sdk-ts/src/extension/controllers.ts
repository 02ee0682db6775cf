/**
 * `/controller list [<controller>] | get <controller> <key> | apply <controller> <key> <spec JSON> |
 * reconcile <controller> <key> | delete <controller> <key>`: the server's managed resources
 * (docs/CONTROLLERS.md) from Pi, answered through `resource.list`, `resource.get`,
 * `resource.apply`, `resource.reconcile` and `resource.delete`.
 *
 * Invariants:
 * - The extension never loads controller code: `apply` sends the spec and the session's project
 *   directory, and the server resolves the controller in its own child process.
 * - Parsing is pure; a malformed command is one warning with the usage, and nothing is sent.
 * - Every answer is rendered from the server's receipt or its safe error. A resource's spec and
 *   its controller's own status value are never shown here (`pi-workflows resource` shows them):
 *   only names, versions, conditions, effects, child runs and the audit feed's bounded phrases.
 * - Reconciliation does not depend on Pi: there is no start or stop here, because the server
 *   reconciles whether or not a Pi session is open.
 */
import type { CommandOutcome, JsonValue, RequestPayloadByOperation, ResponseReceiptByOperation, SafeError } from "../generated/types.js";

/** The `/controller` usage. */
export const CONTROLLER_USAGE =
  "Usage: /controller list [<controller>] | get <controller> <key> | apply <controller> <key> <spec JSON> | reconcile <controller> <key> | delete <controller> <key>";

const CONTROLLER_NAME = /^[a-z][a-z0-9-]{0,63}$/;
const MAX_KEY_BYTES = 512;

/** One parsed `/controller` command. */
export type ControllerCommand =
  | { kind: "list"; controller?: string }
  | { kind: "get" | "reconcile" | "delete"; controller: string; key: string }
  | { kind: "apply"; controller: string; key: string; spec: JsonValue }
  | { kind: "error"; message: string };

function checkRef(controller: string, key: string): string | undefined {
  if (!CONTROLLER_NAME.test(controller)) return `Not a controller name: ${controller.slice(0, 40)} (lowercase letters, digits and -, starting with a letter). ${CONTROLLER_USAGE}`;
  if (Buffer.byteLength(key) > MAX_KEY_BYTES || /\p{Cc}/u.test(key)) return `Not a resource key: at most ${MAX_KEY_BYTES} bytes, no control characters. ${CONTROLLER_USAGE}`;
  return undefined;
}

/** Parses the arguments of `/controller`. The spec of `apply` is the rest of the line, as JSON. */
export function parseControllerCommand(args: string): ControllerCommand {
  const trimmed = args.trim();
  const match = /^(\S+)(?:\s+(\S+))?(?:\s+(\S+))?(?:\s+([\s\S]*))?$/.exec(trimmed);
  if (trimmed === "") return { kind: "list" };
  if (match === null) return { kind: "error", message: CONTROLLER_USAGE };
  const [, verb, controller, key, rest] = match;
  if (verb === "list" && key === undefined) {
    if (controller === undefined) return { kind: "list" };
    const bad = checkRef(controller, "-");
    return bad === undefined ? { kind: "list", controller } : { kind: "error", message: bad };
  }
  if ((verb === "get" || verb === "reconcile" || verb === "delete") && controller !== undefined && key !== undefined && rest === undefined) {
    const bad = checkRef(controller, key);
    return bad === undefined ? { kind: verb, controller, key } : { kind: "error", message: bad };
  }
  if (verb === "apply" && controller !== undefined && key !== undefined && rest !== undefined) {
    const bad = checkRef(controller, key);
    if (bad !== undefined) return { kind: "error", message: bad };
    let spec: JsonValue;
    try {
      spec = JSON.parse(rest) as JsonValue;
    } catch {
      return { kind: "error", message: `The spec is not JSON: give it as one JSON value after the key. ${CONTROLLER_USAGE}` };
    }
    return { kind: "apply", controller, key, spec };
  }
  return { kind: "error", message: CONTROLLER_USAGE };
}

type ResourceOp = "resource.list" | "resource.get" | "resource.apply" | "resource.reconcile" | "resource.delete";

/** What the server answered, as `WorkflowClient.request` resolves it. */
export interface ControllerSettled<Op extends ResourceOp> {
  outcome: CommandOutcome;
  receipt?: ResponseReceiptByOperation[Op];
  error?: SafeError;
}

/** The one client call `/controller` makes (`WorkflowClient.request`). */
export interface ControllerServer {
  request<Op extends ResourceOp>(operation: Op, spec: { payload: RequestPayloadByOperation[Op]; idempotent: boolean }): Promise<ControllerSettled<Op>>;
}

/** A rendered answer. */
export interface ControllerReply {
  text: string;
  level: "info" | "warning" | "error";
}

function refusal(what: string, settled: { outcome: CommandOutcome; error?: SafeError }): ControllerReply {
  const why = settled.error?.message ?? `the server answered ${settled.outcome}`;
  return { text: `${what} was refused: ${why}`, level: "error" };
}

const done = (outcome: CommandOutcome): boolean => outcome === "accepted" || outcome === "adopted";

/** Runs one parsed command against the server and renders its answer; `projectPath` is the session's project directory. */
export async function runControllerCommand(server: ControllerServer, command: ControllerCommand, projectPath: string): Promise<ControllerReply> {
  switch (command.kind) {
    case "error":
      return { text: command.message, level: "warning" };
    case "list": {
      const payload = command.controller === undefined ? {} : { controller: command.controller };
      const settled = await server.request("resource.list", { payload, idempotent: false });
      if (settled.outcome !== "accepted" || settled.receipt === undefined) return refusal("controller list", settled);
      return renderResourceList(settled.receipt);
    }
    case "get": {
      const settled = await server.request("resource.get", { payload: { controller: command.controller, key: command.key }, idempotent: false });
      if (settled.outcome !== "accepted" || settled.receipt === undefined) return refusal(`controller get ${command.controller} ${command.key}`, settled);
      return renderResource(settled.receipt);
    }
    case "apply": {
      const payload = { controller: command.controller, key: command.key, spec: command.spec, projectPath };
      const settled = await server.request("resource.apply", { payload, idempotent: true });
      if (!done(settled.outcome) || settled.receipt === undefined) return refusal(`controller apply ${command.controller} ${command.key}`, settled);
      return { text: `Applied ${command.controller}/${command.key}: resource version ${settled.receipt.resourceVersion}; the server reconciles it (/controller get ${command.controller} ${command.key}).`, level: "info" };
    }
    case "reconcile":
    case "delete": {
      const operation = command.kind === "reconcile" ? "resource.reconcile" : "resource.delete";
      const settled = await server.request(operation, { payload: { controller: command.controller, key: command.key }, idempotent: true });
      if (!done(settled.outcome) || settled.receipt === undefined) return refusal(`controller ${command.kind} ${command.controller} ${command.key}`, settled);
      const what = command.kind === "reconcile" ? "Reconcile requested for" : "Deletion requested for";
      return { text: `${what} ${command.controller}/${command.key} (resource version ${settled.receipt.resourceVersion}).`, level: "info" };
    }
  }
}

const ready = (value: "true" | "false" | "unknown" | undefined): string => (value === undefined ? "Ready: none yet" : `Ready: ${value}`);

/** `resource.list` as lines: one per resource. */
export function renderResourceList(view: ResponseReceiptByOperation["resource.list"]): ControllerReply {
  if (view.resources.length === 0) return { text: "No resources. Apply one with /controller apply <controller> <key> <spec JSON>.", level: "info" };
  const lines = view.resources.map((row) => {
    let line = `${row.controller}/${row.key}: ${ready(row.ready)}, generation ${row.generation} (observed ${row.observedGeneration}), version ${row.resourceVersion}`;
    if (row.deleting) line += ", deleting";
    if (row.consecutiveErrors > 0) line += `, ${row.consecutiveErrors} error(s)${row.lastError === undefined ? "" : `: ${row.lastError}`}`;
    return line;
  });
  const troubled = view.resources.some((row) => row.consecutiveErrors > 0 || row.ready === "false");
  return { text: lines.join("\n"), level: troubled ? "warning" : "info" };
}

/** `resource.get` as lines: identity, conditions, queue, effects, child runs and recent events (never the spec or the controller's own status value). */
export function renderResource(view: ResponseReceiptByOperation["resource.get"]): ControllerReply {
  const lines: string[] = [`${view.controller}/${view.key}: generation ${view.generation} (observed ${view.status.observedGeneration}), version ${view.resourceVersion}`];
  if (view.deletionRequestedAtMs !== undefined) lines.push(`deletion requested at ${new Date(view.deletionRequestedAtMs).toISOString()}${view.finalizers.length > 0 ? `; finalizers: ${view.finalizers.join(", ")}` : ""}`);
  if (view.status.conditions.length === 0) lines.push("conditions: none yet");
  for (const condition of view.status.conditions) {
    lines.push(`condition ${condition.type}: ${condition.status} (${condition.reason}${condition.message === undefined ? "" : `: ${condition.message}`})`);
  }
  const queue = view.queue;
  if (queue !== undefined) {
    const when = queue.claimed ? "reconciling now" : queue.availableAtMs === undefined ? "idle" : `due at ${new Date(queue.availableAtMs).toISOString()}`;
    lines.push(`queue: ${when}${queue.consecutiveErrors > 0 ? `, ${queue.consecutiveErrors} error(s)${queue.lastError === undefined ? "" : `: ${queue.lastError}`}` : ""}`);
  }
  for (const effect of view.effects) lines.push(`effect ${effect.key} (${effect.kind}): ${effect.state}${effect.error === undefined ? "" : `: ${effect.error}`}`);
  for (const child of view.childWorkflows) lines.push(`child ${child.requestKey}: ${child.workflow} attempt ${child.attempt}, run ${child.runId}, ${child.state}`);
  for (const event of view.events) lines.push(`event ${new Date(event.atMs).toISOString()} ${event.kind}${event.detail === undefined ? "" : `: ${event.detail}`}`);
  const troubled = (queue?.consecutiveErrors ?? 0) > 0 || view.effects.some((effect) => effect.state === "indeterminate");
  return { text: lines.join("\n"), level: troubled ? "warning" : "info" };
}

/** The documented Pi APIs `/controller` uses (typed here so that the unit build needs no Pi types). */
export interface ControllerHost {
  registerCommand(
    name: string,
    options: {
      description?: string;
      getArgumentCompletions?: (prefix: string) => { value: string; label: string }[] | null;
      handler: (args: string, ctx: { cwd: string; ui: { notify(message: string, level: "info" | "warning" | "error"): void } }) => Promise<void>;
    },
  ): void;
}

const VERBS = ["list", "get", "apply", "reconcile", "delete"] as const;

/** Registers `/controller` on `pi`; `server` is the session's client (undefined before `session_start`). */
export function registerController(pi: ControllerHost, server: () => ControllerServer | undefined): void {
  pi.registerCommand("controller", {
    description: "Managed resources: /controller list | get | apply | reconcile | delete (the server reconciles them, with or without Pi)",
    getArgumentCompletions: (prefix) => VERBS.filter((verb) => verb.startsWith(prefix)).map((verb) => ({ value: verb, label: verb })),
    handler: async (args, ctx) => {
      const command = parseControllerCommand(args);
      if (command.kind === "error") {
        ctx.ui.notify(command.message, "warning");
        return;
      }
      const client = server();
      if (client === undefined) {
        ctx.ui.notify(`pi-workflows is not ready in this session yet; try again. ${CONTROLLER_USAGE}`, "warning");
        return;
      }
      let reply: ControllerReply;
      try {
        reply = await runControllerCommand(client, command, ctx.cwd);
      } catch (error) {
        reply = { text: `The pi-workflows server could not be reached: ${error instanceof Error ? error.message : String(error)}`, level: "error" };
      }
      ctx.ui.notify(reply.text, reply.level);
    },
  });
}
