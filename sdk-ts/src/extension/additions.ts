/**
 * The client.v1 additions the extension is written against and the server
 * half of issue 14 must provide (docs/EXTENSION.md, "What the server must
 * provide"). Each one is read or written only here.
 *
 * Invariants:
 * - What this package's schema accepts is decided by encoding a sample
 *   request with the bundled protocol module (`encodeClient`), never by a
 *   hand-set switch: the schema is the one truth, and a client must match the
 *   server's package version, so the bundled schema is the server's.
 * - A field the schema does not have yet is never sent (the encoder and the
 *   server would reject the whole frame) and is read from a view only through
 *   the accessors below, which answer `undefined` while it is absent.
 */
import type { RunStartPayload, RunView, SessionView, WorkflowMessage } from "../generated/types.js";
import { encodeClient } from "../protocol/messages.js";
import type { ClientMessage } from "../generated/types.js";

/** Which additions the bundled client.v1 schema has. */
export interface ProtocolAdditions {
  /** `sessionView.get {sessionId, coordinate: true}` makes the asking connection the session's coordinator. */
  coordinate: boolean;
  /** `run.start {…, held: true}` saves a run that waits for `run.activate`. */
  heldStart: boolean;
  /** `run.activate` (runId in the envelope, payload `{}`) releases a held run. */
  activate: boolean;
}

function accepts(operation: string, payload: Record<string, unknown>): boolean {
  try {
    encodeClient({
      schema: "pi-workflows.client.v1",
      type: "request",
      requestId: "probe",
      clientId: "probe",
      operation,
      payload,
      ...(operation === "run.activate" ? { runId: "probe", idempotencyKey: "probe" } : {}),
    } as unknown as ClientMessage);
    return true;
  } catch {
    return false;
  }
}

/** The additions of the bundled schema (computed once). */
export const BUNDLED_ADDITIONS: ProtocolAdditions = {
  coordinate: accepts("sessionView.get", { sessionId: "probe", coordinate: true }),
  heldStart: accepts("run.start", {
    workflow: "probe",
    input: {},
    executionMode: "interactive",
    projectPath: "/probe",
    originSessionId: "probe",
    held: true,
  }),
  activate: accepts("run.activate", {}),
};

/** The `sessionView.get` payload of a coordinator: it asks to coordinate when the schema can say so. */
export function sessionViewPayload(sessionId: string, additions: ProtocolAdditions): { sessionId: string } {
  return (additions.coordinate ? { sessionId, coordinate: true } : { sessionId }) as { sessionId: string };
}

/** The coordinator epoch a session view grants the connection that read it (addition: `SessionView.coordinatorEpoch`). */
export function coordinatorEpochOf(view: SessionView): number | undefined {
  const epoch = (view as SessionView & { coordinatorEpoch?: unknown }).coordinatorEpoch;
  return typeof epoch === "number" && Number.isSafeInteger(epoch) && epoch >= 0 ? epoch : undefined;
}

/** The source of a step message (addition: `WorkflowMessage.interactionId`, `attemptId`, `nodeId`). */
export interface StepSource {
  interactionId: string;
  attemptId: string;
  nodeId: string | undefined;
}

/** The interaction a step message presents, when the server names it. */
export function stepSourceOf(message: WorkflowMessage): StepSource | undefined {
  const fields = message as WorkflowMessage & { interactionId?: unknown; attemptId?: unknown; nodeId?: unknown };
  if (message.kind !== "step" || typeof fields.interactionId !== "string" || typeof fields.attemptId !== "string") return undefined;
  return { interactionId: fields.interactionId, attemptId: fields.attemptId, nodeId: typeof fields.nodeId === "string" ? fields.nodeId : undefined };
}

/** A held model-started launch (addition: `RunStartPayload.held`). */
export function heldStartPayload(payload: RunStartPayload): RunStartPayload {
  return { ...payload, held: true } as RunStartPayload;
}

/** Whether the server offers `activate` for a held run (addition: the `activate` control). */
export function offersActivate(view: RunView): boolean {
  return (view.display.controls as readonly string[]).includes("activate");
}
