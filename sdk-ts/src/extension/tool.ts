/**
 * The model-facing `workflow` tool: its schema and its strict per-action
 * parsing (reference §5.3).
 *
 * Invariants:
 * - The schema is ONE flat object: `action` is a string enum and every other
 *   field is optional. It is deliberately not a `oneOf` (providers differ in
 *   what they accept); each action is then parsed strictly here: a missing
 *   field, a field the action does not take, or a value of the wrong shape is
 *   an issue, and an error reports at most 3 issues.
 * - Parsing is pure and never touches the server.
 */
import { Type } from "typebox";
import type { JsonValue } from "../generated/types.js";

export const TOOL_NAME = "workflow";

export const ACTIONS = ["list", "start", "status", "pause", "resume", "cancel", "restart", "answer", "followUp", "cancelFollowUp", "update", "submit"] as const;
export type ToolAction = (typeof ACTIONS)[number];

export const TOOL_DESCRIPTION = [
  "Work with pi-workflows runs of this Pi session: list the workflows, start one (it is saved at once and runs after your turn ends),",
  "inspect a run's status, pause, resume or cancel it, answer a waiting checkpoint,",
  "restart a failed or timed-out run (runId; it runs after your turn ends; a cancelled run, a run that failed the same way after a restart, or a fourth restart is refused),",
  "and queue (followUp, prompt) or cancel (cancelFollowUp, followUpId) a prompt that runs in this session after the workflow completes.",
  "After a workflow's terminal message, start or restart at most one workflow in that turn.",
  "Use update and submit only when a workflow step contract asks for them, with the step and attempt ids of the latest step contract:",
  "update publishes a non-completing update of the step, submit completes the step with its output.",
].join(" ");

/** The tool's parameter schema: one flat object (no oneOf), every field but `action` optional. */
export const WORKFLOW_TOOL_PARAMETERS = Type.Object({
  action: Type.Unsafe<ToolAction>({ type: "string", enum: [...ACTIONS], description: "What to do." }),
  offset: Type.Optional(Type.Integer({ minimum: 0, description: "list: the first workflow to list (default 0)." })),
  workflow: Type.Optional(Type.String({ description: "start: the workflow name or path." })),
  input: Type.Optional(Type.Unknown({ description: "start: the workflow input (default {}); answer: the checkpoint answer." })),
  runId: Type.Optional(Type.String({ description: "status, cancel, answer, followUp: the run (default: this session's run); restart: the ended run to restart." })),
  prompt: Type.Optional(Type.String({ description: "followUp: the prompt to run after the workflow completes." })),
  followUpId: Type.Optional(Type.String({ description: "cancelFollowUp: the follow-up id followUp returned." })),
  step: Type.Optional(Type.String({ description: "update, submit: the step id of the step contract." })),
  attempt: Type.Optional(Type.String({ description: "update, submit: the attempt id of the step contract." })),
  update: Type.Optional(
    Type.Object(
      {
        type: Type.String({ description: "The update type, e.g. progress." }),
        key: Type.String({ description: "Updates with the same type and key replace each other." }),
        data: Type.Unknown({ description: "A JSON object." }),
      },
      { description: "update: the update {type, key, data}." },
    ),
  ),
  output: Type.Optional(Type.Unknown({ description: "submit: the step's output, as the contract's expected output says." })),
});

/** One parsed, valid tool call. */
export type ToolCall =
  | { action: "list"; offset: number }
  | { action: "start"; workflow: string; input: JsonValue }
  | { action: "status"; runId?: string }
  | { action: "pause" }
  | { action: "resume" }
  | { action: "cancel"; runId?: string }
  | { action: "restart"; runId: string }
  | { action: "followUp"; prompt: string; runId?: string }
  | { action: "cancelFollowUp"; followUpId: string }
  | { action: "answer"; input: JsonValue; runId?: string }
  | { action: "update"; step: string; attempt: string; update: { type: string; key: string; data: JsonValue } }
  | { action: "submit"; step: string; attempt: string; output: JsonValue };

const FIELDS: Readonly<Record<ToolAction, { required: readonly string[]; optional: readonly string[] }>> = {
  list: { required: [], optional: ["offset"] },
  start: { required: ["workflow"], optional: ["input"] },
  status: { required: [], optional: ["runId"] },
  pause: { required: [], optional: [] },
  resume: { required: [], optional: [] },
  cancel: { required: [], optional: ["runId"] },
  restart: { required: ["runId"], optional: [] },
  followUp: { required: ["prompt"], optional: ["runId"] },
  cancelFollowUp: { required: ["followUpId"], optional: [] },
  answer: { required: ["input"], optional: ["runId"] },
  update: { required: ["step", "attempt", "update"], optional: [] },
  submit: { required: ["step", "attempt", "output"], optional: [] },
};

/** The most issues one error reports. */
export const MAX_ISSUES = 3;

const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/** A follow-up prompt's longest inline text (protocol `PromptText`). */
export const MAX_PROMPT = 16384;
const UPDATE_TYPE = /^[A-Za-z][A-Za-z0-9._-]{0,63}$/;

/** Parses the tool's arguments strictly for their action. */
export function parseToolCall(params: unknown): { ok: true; call: ToolCall } | { ok: false; error: string } {
  if (typeof params !== "object" || params === null || Array.isArray(params)) return { ok: false, error: "Invalid workflow call: the arguments must be an object with an action." };
  const args = params as Record<string, unknown>;
  const action = args["action"];
  if (typeof action !== "string" || !(ACTIONS as readonly string[]).includes(action)) {
    return { ok: false, error: `Invalid workflow call: action must be one of ${ACTIONS.join(", ")}.` };
  }
  const rule = FIELDS[action as ToolAction];
  const issues: string[] = [];
  for (const field of rule.required) if (args[field] === undefined) issues.push(`${field}: required`);
  for (const field of Object.keys(args)) {
    if (field === "action" || args[field] === undefined) continue;
    if (!rule.required.includes(field) && !rule.optional.includes(field)) issues.push(`${field}: not allowed for this action`);
  }
  const check = (field: string, problem: string | undefined): void => {
    if (args[field] !== undefined && problem !== undefined) issues.push(`${field}: ${problem}`);
  };
  check("offset", Number.isSafeInteger(args["offset"]) && (args["offset"] as number) >= 0 ? undefined : "must be a whole number ≥ 0");
  check("workflow", typeof args["workflow"] === "string" && args["workflow"].trim() !== "" ? undefined : "must be a workflow name or path");
  check("runId", typeof args["runId"] === "string" && ID.test(args["runId"]) ? undefined : "must be a run id");
  check("prompt", typeof args["prompt"] === "string" && args["prompt"].trim() !== "" && args["prompt"].length <= MAX_PROMPT ? undefined : `must be a prompt of 1-${MAX_PROMPT} characters`);
  check("followUpId", typeof args["followUpId"] === "string" && ID.test(args["followUpId"]) ? undefined : "must be a follow-up id");
  check("step", typeof args["step"] === "string" && args["step"] !== "" ? undefined : "must be the step id of the step contract");
  check("attempt", typeof args["attempt"] === "string" && ID.test(args["attempt"]) ? undefined : "must be the attempt id of the step contract");
  check("update", updateProblem(args["update"]));
  for (const field of ["input", "output"]) check(field, jsonProblem(args[field]));
  if (issues.length > 0) {
    const shown = issues.slice(0, MAX_ISSUES).join("; ");
    const more = issues.length > MAX_ISSUES ? `; and ${issues.length - MAX_ISSUES} more` : "";
    return { ok: false, error: `Invalid workflow call for action "${action}": ${shown}${more}.` };
  }
  return { ok: true, call: callOf(action as ToolAction, args) };
}

function updateProblem(value: unknown): string | undefined {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return "must be {type, key, data}";
  const update = value as Record<string, unknown>;
  const extra = Object.keys(update).filter((key) => key !== "type" && key !== "key" && key !== "data");
  if (extra.length > 0) return `must be {type, key, data} (not ${extra.join(", ")})`;
  if (typeof update["type"] !== "string" || !UPDATE_TYPE.test(update["type"])) return "type must be a word such as progress";
  if (typeof update["key"] !== "string" || update["key"].length > 256) return "key must be a string of at most 256 characters";
  if (typeof update["data"] !== "object" || update["data"] === null || Array.isArray(update["data"])) return "data must be a JSON object";
  return jsonProblem(update["data"]);
}

/** Whether a value survives JSON (no functions, no undefined inside, no non-finite numbers). */
function jsonProblem(value: unknown): string | undefined {
  if (value === undefined) return undefined;
  try {
    const text = JSON.stringify(value);
    return text === undefined || JSON.stringify(JSON.parse(text)) !== text ? "must be a JSON value" : undefined;
  } catch {
    return "must be a JSON value";
  }
}

function callOf(action: ToolAction, args: Record<string, unknown>): ToolCall {
  const runId = typeof args["runId"] === "string" ? { runId: args["runId"] } : {};
  switch (action) {
    case "list":
      return { action, offset: (args["offset"] as number | undefined) ?? 0 };
    case "start":
      return { action, workflow: (args["workflow"] as string).trim(), input: (args["input"] as JsonValue | undefined) ?? {} };
    case "status":
      return { action, ...runId };
    case "pause":
    case "resume":
      return { action };
    case "cancel":
      return { action, ...runId };
    case "restart":
      return { action, runId: args["runId"] as string };
    case "followUp":
      return { action, prompt: (args["prompt"] as string).trim(), ...runId };
    case "cancelFollowUp":
      return { action, followUpId: args["followUpId"] as string };
    case "answer":
      return { action, input: args["input"] as JsonValue, ...runId };
    case "update":
      return { action, step: args["step"] as string, attempt: args["attempt"] as string, update: args["update"] as { type: string; key: string; data: JsonValue } };
    case "submit":
      return { action, step: args["step"] as string, attempt: args["attempt"] as string, output: args["output"] as JsonValue };
  }
}
