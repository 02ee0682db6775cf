/**
 * Decoding and encoding frames of each channel, in the same order as the
 * Rust crate so both report the same code for the same bytes: framing
 * (frameTooLarge, malformedFrame), nesting (nestingTooDeep), canonical form
 * (nonCanonical), schema (schemaInvalid, through the ajv standalone
 * validators generated from protocol/*.schema.json).
 *
 * The validators of each channel are one generated CommonJS module,
 * required on the first frame of that channel: a runner loads runner.v1's
 * (about a third of the code) and never client.v1's, a client the reverse,
 * a controller child only controller.v1's, and a workflow that imports the
 * SDK loads none.
 */
import { createRequire } from "node:module";
import { REPLY_RESULT_TYPES } from "../generated/types.js";
import type {
  ClientMessage,
  ControllerChildMessage,
  ControllerLaunch,
  ControllerServerMessage,
  JsonValue,
  ReplyResultByMessageType,
  RequestPayloadByOperation,
  ResponseReceiptByOperation,
  RunnerMessage,
  RunState,
  RunView,
  ServerMessage,
  WorkerLaunch,
} from "../generated/types.js";
import { canonicalString, checkDepth, parseCanonical } from "./canonical.js";
import { SCHEMA_INVALID, TOO_LARGE } from "./errors.js";
import { MAX_FRAME_BYTES, frameContent } from "./framing.js";

/** A compiled validator: true when `data` matches its schema (ajv leaves the reason in `errors`). */
export type Validator = ((data: unknown) => boolean) & { errors?: unknown };

/** `generated/runner-validators.cts`: runner.v1 (and one `validate<Name>` per reply result type, read by name in `decodeReplyResult`). */
interface RunnerValidators {
  validateRunnerMessage: Validator;
  validateServerMessage: Validator;
  validateWorkerLaunch: Validator;
  validateRunState: Validator;
}

/** `generated/controller-validators.cts`: the controller.v1 channel (its `$defs` live in runner.v1). */
interface ControllerValidators {
  validateControllerLaunch: Validator;
  validateControllerChildMessage: Validator;
  validateControllerServerMessage: Validator;
}

/** `generated/client-validators.cts`: client.v1 and the run view. */
interface ClientValidators {
  validateClientMessage: Validator;
  validateRunView: Validator;
}

const requireGenerated = createRequire(import.meta.url);

/** A generated module, required on the first call. */
function onFirstUse<T>(specifier: string): () => T {
  let loaded: T | undefined;
  return () => (loaded ??= requireGenerated(specifier) as T);
}

const runnerValidators = onFirstUse<RunnerValidators>("../generated/runner-validators.cjs");
const clientValidators = onFirstUse<ClientValidators>("../generated/client-validators.cjs");
const controllerValidators = onFirstUse<ControllerValidators>("../generated/controller-validators.cjs");

/** The generated validators by name, each channel's module loaded when one of its validators is first read. */
export const validators: Readonly<RunnerValidators & ControllerValidators & ClientValidators> = Object.freeze({
  get validateRunnerMessage(): Validator {
    return runnerValidators().validateRunnerMessage;
  },
  get validateServerMessage(): Validator {
    return runnerValidators().validateServerMessage;
  },
  get validateWorkerLaunch(): Validator {
    return runnerValidators().validateWorkerLaunch;
  },
  get validateRunState(): Validator {
    return runnerValidators().validateRunState;
  },
  get validateControllerLaunch(): Validator {
    return controllerValidators().validateControllerLaunch;
  },
  get validateControllerChildMessage(): Validator {
    return controllerValidators().validateControllerChildMessage;
  },
  get validateControllerServerMessage(): Validator {
    return controllerValidators().validateControllerServerMessage;
  },
  get validateClientMessage(): Validator {
    return clientValidators().validateClientMessage;
  },
  get validateRunView(): Validator {
    return clientValidators().validateRunView;
  },
});

const encoder = new TextEncoder();

function validated<T>(validate: Validator, value: JsonValue): T {
  if (!validate(value)) {
    throw SCHEMA_INVALID();
  }
  return value as unknown as T;
}

/** A request whose payload type follows its operation. */
export type TypedRequest<Op extends keyof RequestPayloadByOperation> = Extract<ClientMessage, { type: "request" }> & {
  operation: Op;
  payload: RequestPayloadByOperation[Op];
};

/** A response whose receipt type follows its operation. */
export type TypedResponse<Op extends keyof ResponseReceiptByOperation> = Extract<ClientMessage, { type: "response" }> & {
  operation: Op;
  receipt?: ResponseReceiptByOperation[Op];
};

/** The message kind used by the conformance corpus. */
export function clientKind(message: ClientMessage): string {
  switch (message.type) {
    case "hello":
      return "hello";
    case "request":
      return `request/${message.operation}`;
    case "response":
      return `response/${message.operation}`;
    case "event":
      return `event/${message.event.kind}`;
  }
}

/** Decodes one client-channel frame (canonical JSON plus "\n"). */
export function decodeClientFrame(frame: Uint8Array): ClientMessage {
  return validated<ClientMessage>(validators.validateClientMessage, parseCanonical(frameContent(frame)));
}

/** Decodes one runner-to-server frame. */
export function decodeRunnerFrame(frame: Uint8Array): RunnerMessage {
  return validated<RunnerMessage>(validators.validateRunnerMessage, parseCanonical(frameContent(frame)));
}

/** Decodes one server-to-runner frame. */
export function decodeServerFrame(frame: Uint8Array): ServerMessage {
  return validated<ServerMessage>(validators.validateServerMessage, parseCanonical(frameContent(frame)));
}

/** Decodes the launch envelope: the first stdin line the server writes, without its newline. */
export function decodeLaunch(bytes: Uint8Array): WorkerLaunch {
  if (bytes.length > MAX_FRAME_BYTES) {
    throw TOO_LARGE();
  }
  return validated<WorkerLaunch>(validators.validateWorkerLaunch, parseCanonical(bytes));
}

/** Decodes a controller child's launch: the first stdin line the server writes, without its newline. */
export function decodeControllerLaunch(bytes: Uint8Array): ControllerLaunch {
  if (bytes.length > MAX_FRAME_BYTES) {
    throw TOO_LARGE();
  }
  return validated<ControllerLaunch>(validators.validateControllerLaunch, parseCanonical(bytes));
}

/** Decodes one server-to-controller-child frame (a reply). */
export function decodeControllerServerFrame(frame: Uint8Array): ControllerServerMessage {
  return validated<ControllerServerMessage>(validators.validateControllerServerMessage, parseCanonical(frameContent(frame)));
}

/** Decodes one controller-child-to-server frame. */
export function decodeControllerChildFrame(frame: Uint8Array): ControllerChildMessage {
  return validated<ControllerChildMessage>(validators.validateControllerChildMessage, parseCanonical(frameContent(frame)));
}

/** Decodes a standalone run-view document (canonical JSON, no newline). */
export function decodeRunView(bytes: Uint8Array): RunView {
  if (bytes.length > MAX_FRAME_BYTES) {
    throw TOO_LARGE();
  }
  return validated<RunView>(validators.validateRunView, parseCanonical(bytes));
}

/**
 * Decodes the content behind a referenced command state: canonical JSON of
 * a `RunState` (no size limit: it was assembled from verified parts).
 */
export function decodeRunState(bytes: Uint8Array): RunState {
  return validated<RunState>(validators.validateRunState, parseCanonical(bytes));
}

/**
 * The result of an accepted reply to a `type` message, checked against the
 * types its schema variant's `x-replyResult` names (`REPLY_RESULT_TYPES`);
 * `schemaInvalid` when it is none of them.
 */
export function decodeReplyResult<T extends keyof ReplyResultByMessageType>(type: T, result: JsonValue): ReplyResultByMessageType[T] {
  const generated = runnerValidators() as unknown as Readonly<Record<string, Validator | undefined>>;
  for (const name of REPLY_RESULT_TYPES[type]) {
    const validate = generated[`validate${name}`];
    if (validate === undefined) throw new Error(`the runner validators have no validate${name}; run \`cargo run -p codegen\``);
    if (validate(result)) return result as unknown as ReplyResultByMessageType[T];
  }
  throw SCHEMA_INVALID();
}

/**
 * Encodes one frame, refusing what a decoder would refuse: canonical form
 * (`internal` for a value JSON cannot hold), nesting, size, then the schema
 * (the validator never sees a value nested beyond the limit).
 */
function frame(message: unknown, validate: Validator): Uint8Array {
  const bytes = encoder.encode(canonicalString(message) + "\n");
  checkDepth(bytes);
  if (bytes.length > MAX_FRAME_BYTES) {
    throw TOO_LARGE();
  }
  if (!validate(message)) {
    throw SCHEMA_INVALID();
  }
  return bytes;
}

/** Encodes a client-channel message as one frame; validates it first. Throws nestingTooDeep beyond 64 levels and frameTooLarge above 1 MiB. */
export function encodeClient(message: ClientMessage): Uint8Array {
  return frame(message, validators.validateClientMessage);
}

/** Encodes a runner-to-server message as one frame. */
export function encodeRunner(message: RunnerMessage): Uint8Array {
  return frame(message, validators.validateRunnerMessage);
}

/** Encodes a controller child's message as one frame. */
export function encodeControllerChild(message: ControllerChildMessage): Uint8Array {
  return frame(message, validators.validateControllerChildMessage);
}

/** Encodes a reply to a controller child as one frame. */
export function encodeControllerServer(message: ControllerServerMessage): Uint8Array {
  return frame(message, validators.validateControllerServerMessage);
}

/** Encodes a controller child's launch as one frame. */
export function encodeControllerLaunch(message: ControllerLaunch): Uint8Array {
  return frame(message, validators.validateControllerLaunch);
}

/** Encodes a server-to-runner message as one frame. */
export function encodeServer(message: ServerMessage): Uint8Array {
  return frame(message, validators.validateServerMessage);
}

/** Encodes the launch envelope (canonical JSON, no newline). */
export function encodeLaunch(launch: WorkerLaunch): Uint8Array {
  if (!validators.validateWorkerLaunch(launch)) {
    throw SCHEMA_INVALID();
  }
  const bytes = encoder.encode(canonicalString(launch));
  if (bytes.length > MAX_FRAME_BYTES) {
    throw TOO_LARGE();
  }
  return bytes;
}

/** Encodes a run-view document (canonical JSON, no newline). */
export function encodeRunView(view: RunView): Uint8Array {
  if (!validators.validateRunView(view)) {
    throw SCHEMA_INVALID();
  }
  return encoder.encode(canonicalString(view));
}
