/**
 * The one error class of `WorkflowClient`.
 *
 * Invariant (privacy): a `WorkflowClientError` carries only a closed code and
 * either the server's safe message (a `SafeError` the server chose, at most
 * 512 characters) or static text chosen here. It never carries request
 * payloads, socket or state paths, underlying system errors (their messages
 * name paths) or tokens: no `cause` is ever attached.
 */
import type { CommandOutcome, ErrorCode, Operation, SafeError as WireSafeError } from "../generated/types.js";
import { ErrorCodeValues } from "../generated/types.js";

/** The longest message a safe error may carry (the protocol's SafeMessage bound). */
export const MAX_ERROR_MESSAGE = 512;

/** Extra facts about a failed request. */
export interface WorkflowClientErrorDetails {
  /** The response outcome, when the server answered. */
  outcome?: CommandOutcome;
  /** The operation the request named. */
  operation?: Operation;
  /**
   * The idempotency key of a state-changing command whose fate is unknown
   * (the connection failed before its response): retrying with this key (and
   * the same client id) adopts the stored receipt if the command committed.
   */
  idempotencyKey?: string;
}

/** A failed client call: a closed `code` and a bounded, payload-free message. */
export class WorkflowClientError extends Error {
  readonly code: ErrorCode;
  // `declare`: optional facts become own properties only when present.
  declare readonly outcome?: CommandOutcome;
  declare readonly operation?: Operation;
  declare readonly idempotencyKey?: string;

  constructor(code: ErrorCode, message: string, details: WorkflowClientErrorDetails = {}) {
    super(bounded(message));
    this.name = "WorkflowClientError";
    this.code = code;
    const facts = this as { outcome?: CommandOutcome; operation?: Operation; idempotencyKey?: string };
    if (details.outcome !== undefined) facts.outcome = details.outcome;
    if (details.operation !== undefined) facts.operation = details.operation;
    if (details.idempotencyKey !== undefined) facts.idempotencyKey = details.idempotencyKey;
  }

  /** The error a server response carries: its safe code and message only. */
  static fromResponse(
    operation: Operation,
    outcome: CommandOutcome,
    error: WireSafeError | undefined,
  ): WorkflowClientError {
    const code = error !== undefined && isErrorCode(error.code) ? error.code : codeOfOutcome(outcome);
    const message = error?.message ?? `the server answered ${outcome} for ${operation}`;
    return new WorkflowClientError(code, message, { outcome, operation });
  }
}

/** Whether `value` is one of the protocol's closed error codes. */
export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === "string" && (ErrorCodeValues as readonly string[]).includes(value);
}

function codeOfOutcome(outcome: CommandOutcome): ErrorCode {
  switch (outcome) {
    case "notFound":
      return "notFound";
    case "conflict":
      return "conflict";
    case "claimLost":
      return "claimLost";
    case "unavailable":
      return "unavailable";
    default:
      return "internal";
  }
}

function bounded(message: string): string {
  const chars = Array.from(message);
  return chars.length <= MAX_ERROR_MESSAGE ? message : chars.slice(0, MAX_ERROR_MESSAGE).join("");
}

// Static messages (one clear next action each).
export const NOT_RUNNING = (): WorkflowClientError =>
  new WorkflowClientError(
    "unavailable",
    "the pi-workflows server is not running; start it with `pi-workflows server start`",
  );

export const CONNECTION_LOST = (details: WorkflowClientErrorDetails = {}): WorkflowClientError =>
  new WorkflowClientError(
    "unavailable",
    details.idempotencyKey === undefined
      ? "lost the connection to the pi-workflows server; retry the command"
      : "lost the connection to the pi-workflows server before the command was answered; retry it with the same idempotency key to adopt its receipt",
    details,
  );

export const CANCELLED = (operation?: Operation): WorkflowClientError =>
  new WorkflowClientError(
    "cancelled",
    "the request was cancelled locally; a command already sent may still complete on the server",
    operation === undefined ? {} : { operation },
  );

export const CLOSED = (): WorkflowClientError =>
  new WorkflowClientError("unavailable", "this WorkflowClient was closed; create a new one");
