/**
 * How a server workflow message becomes a Pi custom message, and how the
 * coordinator finds it again on the active branch.
 *
 * Invariants:
 * - Every workflow message is sent with its server message id in
 *   `details.workflowMessageId` (details never reach the model); the branch
 *   is searched for that id, never for the text.
 * - The kind alone decides the custom type, visibility and whether the send
 *   starts a turn: step, terminal and follow-up messages start one;
 *   decisions and notifications never do. A terminal message that claimed
 *   a turn intent (`deferredTurn`) is the visible `pi-workflows-deferred-turn`
 *   card, delivered as a follow-up (deferred-turn.ts).
 */
import type { MessageKind, StepReason, WorkflowMessage } from "../generated/types.js";
import { DEFERRED_TURN_SCHEMA, DEFERRED_TURN_TYPE, type DeferredTurnDetails, deferredTurnDetails } from "./deferred-turn.js";

/** The `details.schema` of every workflow message this extension sends. */
export const MESSAGE_DETAILS_SCHEMA = "pi-workflows.workflow-message.v1";

/** The custom type of each kind. */
export const CUSTOM_TYPES: Readonly<Record<MessageKind, string>> = {
  step: "pi-workflows-agent-step",
  decision: "pi-workflows-decision",
  notification: "pi-workflows-notification",
  terminal: "pi-workflows-terminal",
  followUp: "pi-workflows-follow-up",
};

/** What the details of a sent workflow message hold. */
export interface WorkflowMessageDetails {
  schema: typeof MESSAGE_DETAILS_SCHEMA;
  workflowMessageId: string;
  runId: string;
  kind: MessageKind;
  stepReason?: StepReason;
}

/** The Pi message and send options for one workflow message. */
export interface Delivery {
  message: { customType: string; content: string; display: boolean; details: WorkflowMessageDetails | DeferredTurnDetails };
  triggerTurn: boolean;
  deliverAs?: "followUp";
}

/** Whether a kind starts a model turn when it is sent. */
export function startsTurn(kind: MessageKind): boolean {
  switch (kind) {
    case "step":
    case "terminal":
    case "followUp":
      return true;
    case "decision":
    case "notification":
      return false;
  }
}

/**
 * The Pi message for `message` with its text. A terminal message with its
 * turn intent is the visible deferred-turn card; one without (a server that
 * sends none) is hidden (the model answers it visibly).
 */
export function deliveryOf(message: WorkflowMessage, text: string): Delivery {
  if (message.kind === "terminal" && message.deferredTurn !== undefined) {
    return {
      message: { customType: DEFERRED_TURN_TYPE, content: text, display: true, details: deferredTurnDetails(message, message.deferredTurn) },
      triggerTurn: true,
      deliverAs: "followUp",
    };
  }
  const details: WorkflowMessageDetails = {
    schema: MESSAGE_DETAILS_SCHEMA,
    workflowMessageId: message.messageId,
    runId: message.runId,
    kind: message.kind,
  };
  if (message.stepReason !== undefined) details.stepReason = message.stepReason;
  return {
    message: { customType: CUSTOM_TYPES[message.kind], content: text, display: message.kind !== "terminal", details },
    triggerTurn: startsTurn(message.kind),
  };
}

/** The part of a Pi session entry the coordinator reads. */
export interface BranchEntryLike {
  type: string;
  id: string;
  customType?: string;
  details?: unknown;
  message?: unknown;
}

/** The workflow message id an entry carries, when it is one of ours. */
export function workflowMessageIdOf(entry: BranchEntryLike): string | undefined {
  if (entry.type !== "custom_message") return undefined;
  const details = entry.details;
  if (typeof details !== "object" || details === null) return undefined;
  const fields = details as { schema?: unknown; workflowMessageId?: unknown };
  const ours = fields.schema === MESSAGE_DETAILS_SCHEMA || fields.schema === DEFERRED_TURN_SCHEMA;
  return ours && typeof fields.workflowMessageId === "string" ? fields.workflowMessageId : undefined;
}

/** The entry ids of the workflow messages on a branch, by message id (the last entry wins). */
export function branchIndex(branch: readonly BranchEntryLike[]): Map<string, string> {
  const found = new Map<string, string>();
  for (const entry of branch) {
    const id = workflowMessageIdOf(entry);
    if (id !== undefined) found.set(id, entry.id);
  }
  return found;
}

/** The request a step message presents (`interactionId`, `attemptId`, `nodeId`). */
export interface StepSource {
  interactionId: string;
  attemptId: string;
  nodeId: string | undefined;
}

/** The request a step message presents, when the server names it (step messages only). */
export function stepSourceOf(message: WorkflowMessage): StepSource | undefined {
  if (message.kind !== "step" || message.interactionId === undefined || message.attemptId === undefined) return undefined;
  return { interactionId: message.interactionId, attemptId: message.attemptId, nodeId: message.nodeId };
}
