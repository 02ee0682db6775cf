/**
 * The `/workflow` command grammar (reference §5.2).
 *
 * Invariants:
 * - The words `list status pause resume cancel answer clear recover then`
 *   are always subcommands. A workflow whose name is one of them (authoring
 *   reserves all but `clear`, `recover` and `then`) is started by its path, e.g.
 *   `/workflow .pi/workflows/clear.workflow.ts`.
 * - Parsing is pure: it never touches the server, and a malformed command is
 *   one `error` with the usage to type instead.
 */
import type { DecisionChoice, JsonValue, RecoverAction } from "../generated/types.js";

/** The subcommand words. */
export const RESERVED_WORDS = ["list", "status", "pause", "resume", "cancel", "answer", "clear", "recover", "then"] as const;

const RUN_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/** One parsed `/workflow` command. */
export type WorkflowCommand =
  | { kind: "list"; offset: number }
  | { kind: "status"; runId?: string }
  | { kind: "pause" }
  | { kind: "resume" }
  | { kind: "cancel" }
  | { kind: "clear" }
  | { kind: "answer"; runId?: string; answer: JsonValue; text: string }
  | { kind: "recover"; action: RecoverAction; effectId?: string }
  | { kind: "followUp"; prompt: string }
  | { kind: "cancelFollowUp"; followUpId: string }
  | { kind: "start"; workflow: string; input: JsonValue }
  | { kind: "error"; message: string };

export const USAGE =
  "Usage: /workflow [list [offset]] | <name-or-path> [task… | --input-json <json>] | status [runId] | pause | resume | cancel | answer [runId] <json|text> | clear | recover confirm|retry [effectId] | then <prompt> | then cancel <followUpId>";

const THEN_USAGE = "Usage: /workflow then <prompt> (runs in this session after the workflow completes) | /workflow then cancel <followUpId>";

/** Effect ids have the run id's pattern (protocol `EffectId`). */
const EFFECT_ID = RUN_ID;

const RECOVER_USAGE = "Usage: /workflow recover confirm|retry [effectId] (confirm: the effect applied; retry: apply it again, a duplicate is possible)";

/** Splits the first word off. */
function head(text: string): [string, string] {
  const match = /^(\S+)\s*([^]*)$/.exec(text);
  return match === null ? ["", ""] : [match[1] as string, (match[2] as string).trim()];
}

function parseJson(text: string): { ok: true; value: JsonValue } | { ok: false } {
  try {
    return { ok: true, value: JSON.parse(text) as JsonValue };
  } catch {
    return { ok: false };
  }
}

/** Parses the arguments of `/workflow`. */
export function parseWorkflowCommand(args: string): WorkflowCommand {
  const text = args.trim();
  if (text === "") return { kind: "list", offset: 0 };
  const [word, rest] = head(text);
  switch (word) {
    case "list": {
      if (rest === "") return { kind: "list", offset: 0 };
      if (/^\d{1,15}$/.test(rest)) return { kind: "list", offset: Number(rest) };
      return { kind: "error", message: "Usage: /workflow list [offset] (the offset is a whole number)" };
    }
    case "status": {
      if (rest === "") return { kind: "status" };
      if (RUN_ID.test(rest)) return { kind: "status", runId: rest };
      return { kind: "error", message: "Usage: /workflow status [runId]" };
    }
    case "pause":
    case "resume":
    case "cancel":
    case "clear":
      if (rest !== "") return { kind: "error", message: `Usage: /workflow ${word} (it acts on this session's workflow and takes no arguments)` };
      return { kind: word };
    case "answer":
      return parseAnswer(rest);
    case "recover":
      return parseRecover(rest);
    case "then":
      return parseThen(rest);
    default:
      return parseStart(word, rest);
  }
}

/**
 * `then <prompt>`: a follow-up of this session's workflow; `then cancel
 * <followUpId>` cancels one. A prompt that starts with the word `cancel`
 * followed by anything but one follow-up id is a prompt.
 */
function parseThen(rest: string): WorkflowCommand {
  if (rest === "") return { kind: "error", message: THEN_USAGE };
  const [first, remainder] = head(rest);
  if (first === "cancel" && remainder !== "" && !/\s/.test(remainder) && RUN_ID.test(remainder)) return { kind: "cancelFollowUp", followUpId: remainder };
  if (first === "cancel" && remainder === "") return { kind: "error", message: THEN_USAGE };
  if (rest.length > 16384) return { kind: "error", message: "The follow-up prompt is longer than 16,384 characters." };
  return { kind: "followUp", prompt: rest };
}

/** `recover confirm|retry [effectId]`, as `pi-workflows recover RUN confirm|retry [--effect ID]` on this session's run. */
function parseRecover(rest: string): WorkflowCommand {
  const words = rest === "" ? [] : rest.split(/\s+/);
  const [action, effectId, ...extra] = words;
  if ((action !== "confirm" && action !== "retry") || extra.length > 0) return { kind: "error", message: RECOVER_USAGE };
  if (effectId === undefined) return { kind: "recover", action };
  if (!EFFECT_ID.test(effectId)) return { kind: "error", message: RECOVER_USAGE };
  return { kind: "recover", action, effectId };
}

function parseAnswer(rest: string): WorkflowCommand {
  if (rest === "") return { kind: "error", message: "Usage: /workflow answer [runId] <json|text>" };
  const [first, remainder] = head(rest);
  if (RUN_ID.test(first) && remainder !== "") {
    const parsed = parseJson(remainder);
    if (parsed.ok && typeof parsed.value === "object" && parsed.value !== null) return { kind: "answer", runId: first, answer: parsed.value, text: remainder };
  }
  const whole = parseJson(rest);
  return { kind: "answer", answer: whole.ok ? whole.value : { answer: rest }, text: rest };
}

/** A person's answer to a protected decision, as `decision.answer` takes it. */
export type DecisionResponse = { choice: string; input: Record<string, string> | null };

/**
 * `/workflow answer` for a protected decision: `<choice> [text…]`, or the
 * JSON `{"choice": …, "input": {<name>: …}}`. The choice must be one the
 * decision offers; its text is required when the choice takes one and
 * refused otherwise (the server checks it again against the request).
 */
export function decisionResponse(choices: readonly DecisionChoice[], answer: JsonValue, text: string): DecisionResponse | { error: string } {
  const ids = choices.map((choice) => choice.id).join(", ");
  let choiceId: string;
  let given: string | undefined;
  if (typeof answer === "object" && answer !== null && !Array.isArray(answer) && typeof answer.choice === "string") {
    choiceId = answer.choice;
    const input = answer.input;
    if (typeof input === "object" && input !== null && !Array.isArray(input)) {
      const values = Object.values(input);
      given = values.length === 1 && typeof values[0] === "string" ? values[0] : undefined;
      if (given === undefined) return { error: `The answer's input is one text: /workflow answer <choice> [text…] (choices: ${ids})` };
    }
  } else {
    const [first, remainder] = head(text);
    choiceId = first;
    given = remainder === "" ? undefined : remainder;
  }
  const choice = choices.find((candidate) => candidate.id === choiceId);
  if (choice === undefined) return { error: `Answer with one of the choices: /workflow answer <choice> [text…] (choices: ${ids})` };
  if (choice.input === undefined) {
    if (given !== undefined) return { error: `The choice ${choice.id} takes no text; answer with the choice alone.` };
    return { choice: choice.id, input: null };
  }
  if (given === undefined) return { error: `The choice ${choice.id} needs text (${choice.input.prompt}): /workflow answer ${choice.id} <text>` };
  return { choice: choice.id, input: { [choice.input.name]: given } };
}

function parseStart(workflow: string, rest: string): WorkflowCommand {
  if (rest === "") return { kind: "start", workflow, input: {} };
  if (rest === "--input-json" || rest.startsWith("--input-json ")) {
    const json = rest.slice("--input-json".length).trim();
    const parsed = parseJson(json);
    if (json === "" || !parsed.ok) return { kind: "error", message: `Usage: /workflow ${workflow} --input-json <json> (the input is not valid JSON)` };
    return { kind: "start", workflow, input: parsed.value };
  }
  return { kind: "start", workflow, input: { task: rest } };
}
