/**
 * The `pi-workflows-deferred-turn` message (DEFERRED_TURNS): how a terminal
 * workflow message that claimed a turn intent is sent, and its compact card.
 *
 * Invariants:
 * - The details are `pi-workflows.deferred-turn-message.v1`: the intent id,
 *   the run id, the cause, the card's small fields (`presentation`), whether
 *   the decision defaults to stopping, and the server message id the
 *   coordinator finds the entry by. They never reach the model; the model
 *   receives the content, collapsed or expanded alike.
 * - The collapsed card reads only the details: the workflow name, the state
 *   or cause, the run id and the restart count. It never shows the content
 *   (facts JSON, input, result, instruction). Expanded, it shows the whole
 *   content.
 * - Every text the card shows is sanitized: ANSI escapes and control
 *   characters are removed. Missing or invalid details render a safe
 *   generic card.
 * - Rendering is pure: a restored message renders the same and causes no
 *   send, entry or turn.
 */
import type { DeferredTurn, WorkflowMessage } from "../generated/types.js";

/** The custom type of the message. */
export const DEFERRED_TURN_TYPE = "pi-workflows-deferred-turn";
/** The `details.schema` of the message. */
export const DEFERRED_TURN_SCHEMA = "pi-workflows.deferred-turn-message.v1";

/** What the details of a sent deferred-turn message hold. */
export interface DeferredTurnDetails {
  schema: typeof DEFERRED_TURN_SCHEMA;
  turnIntentId: string;
  runId: string;
  cause: DeferredTurn["cause"];
  stopsByDefault: boolean;
  presentation: DeferredTurn["presentation"];
  workflowMessageId: string;
}

/** The details of `message`, which claimed `intent`. */
export function deferredTurnDetails(message: WorkflowMessage, intent: DeferredTurn): DeferredTurnDetails {
  return {
    schema: DEFERRED_TURN_SCHEMA,
    turnIntentId: intent.turnIntentId,
    runId: message.runId,
    cause: intent.cause,
    stopsByDefault: intent.stopsByDefault,
    presentation: intent.presentation,
    workflowMessageId: message.messageId,
  };
}

// ESC [ … final byte, ESC ] … BEL or ESC \, and any other two-byte escape.
const ANSI = /\u001b\[[0-?]*[ -/]*[@-~]|\u001b\][^\u0007\u001b]*(?:\u0007|\u001b\\)|\u001b[@-_]/g;
// C0 (but tab and newline), DEL and C1 controls.
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;

/** `text` without ANSI escapes and control characters (tabs become spaces; newlines kept). */
export function sanitize(text: string): string {
  return text.replace(ANSI, "").replace(/\t/g, "  ").replace(CONTROL, "");
}

/** One line of `text`: sanitized, newlines as spaces, at most `max` characters. */
function field(text: string, max = 120): string {
  const line = sanitize(text).replace(/\n/g, " ").trim();
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

const CAUSES: ReadonlySet<string> = new Set(["agentCancelled", "timedOut", "failed", "launchFailed", "controllerInterrupted", "claimLost", "terminal", "cancelled"]);

/** The card's fields read from `details`, or undefined when they are missing or invalid. */
export function cardFields(details: unknown): { workflowName: string; state: string; runId: string; restart?: string } | undefined {
  if (typeof details !== "object" || details === null) return undefined;
  const fields = details as Partial<Record<keyof DeferredTurnDetails, unknown>>;
  if (fields.schema !== DEFERRED_TURN_SCHEMA || typeof fields.runId !== "string" || typeof fields.cause !== "string" || !CAUSES.has(fields.cause)) return undefined;
  const presentation = (typeof fields.presentation === "object" && fields.presentation !== null ? fields.presentation : {}) as {
    workflowName?: unknown;
    state?: unknown;
    reasonKind?: unknown;
    restart?: { count?: unknown; limit?: unknown };
  };
  const name = typeof presentation.workflowName === "string" && presentation.workflowName.length > 0 ? presentation.workflowName : "workflow";
  let state = typeof presentation.state === "string" ? presentation.state.replace(/_/g, " ") : fields.cause;
  if (typeof presentation.reasonKind === "string") state = `${state} (${presentation.reasonKind})`;
  const restart = presentation.restart;
  const counted = restart !== undefined && typeof restart.count === "number" && typeof restart.limit === "number";
  return {
    workflowName: field(name, 80),
    state: field(state, 60),
    runId: field(fields.runId, 100),
    ...(counted ? { restart: `${restart.count}/${restart.limit}` } : {}),
  };
}

/** How the card colours its parts (Pi's theme; identity in tests). */
export interface CardStyle {
  accent(text: string): string;
  dim(text: string): string;
  bold(text: string): string;
}

/**
 * The card's lines before width truncation: collapsed, one line of the
 * details' fields and a dim hint; expanded, that line and the whole content,
 * sanitized, line by line.
 */
export function deferredTurnCard(details: unknown, content: unknown, expanded: boolean, style: CardStyle): string[] {
  const fields = cardFields(details);
  const head =
    fields === undefined
      ? `${style.accent("◆")} ${style.bold("workflow")} ${style.dim("· a workflow message")}`
      : `${style.accent("◆")} ${style.bold(fields.workflowName)} · ${fields.state} ${style.dim(`· run ${fields.runId}`)}${fields.restart === undefined ? "" : style.dim(` · restarts ${fields.restart}`)}`;
  if (!expanded) return [head, style.dim("  (expand to see the workflow's message)")];
  return [head, ...sanitize(textOf(content)).split("\n").map((line) => `  ${line}`)];
}

/** The text of a custom message's content (a string, or text parts). */
function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((part) => (typeof part === "object" && part !== null && (part as { type?: unknown }).type === "text" ? String((part as { text?: unknown }).text ?? "") : ""))
    .join("\n");
}
