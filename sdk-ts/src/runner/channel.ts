/**
 * The runner end of the runner.v1 channel (docs/PROTOCOL.md): the launch
 * envelope (the first stdin frame), NDJSON frames both ways, stable message
 * ids, and reply correlation.
 *
 * Every message carries `schema`, `runId`, `generation` and `runnerEpoch`
 * from the launch and a message id `<runnerEpoch>-m<counter>`; each frame is
 * encoded and checked before it is written (`encodeRunner`: schema, canonical
 * JSON, the 64-level nesting limit, the 1 MiB frame limit). A frame that
 * breaks a rule is never written: `send` throws `FrameRefused`, which names
 * the rule and what it measured, and the message id is not used up.
 * A `claimLost` reply to any message calls `onClaimLost` (the runner stops).
 *
 * Values over one frame: a command's state (`{kind: reference}`) and a
 * reply's `resultContent` are digest-bound references, read here with
 * `content.read` in verified parts of at most 512 KiB (`PartAssembler`).
 * `request()` returns a reply with its referenced result read and typed by
 * the message it answers (`ReplyTo`): an accepted result is checked against
 * the types the schema's `x-replyResult` names, any other result must be
 * null (`schemaInvalid` otherwise);
 * `runState()` reads a command's state. Missing content, a bad range, a
 * wrong length or digest, another media type, JSON that is not canonical or
 * not a run state, or a value over 256 MiB is one `ContentReadError`
 * (a closed code and a bounded message), never a crash.
 */
import type { Readable, Writable } from "node:stream";
import type {
  CommandState,
  ContentChunkMessage,
  ContentReference,
  ErrorCode,
  JsonValue,
  Reply,
  ReplyResultByMessageType,
  RunnerCommand,
  RunnerMessage,
  RunState,
  ServerMessage,
  WorkerLaunch,
} from "../generated/types.js";
import { MAX_DEPTH, canonicalString, canonicalize, jsonDepth, nestingDepth, parseCanonical } from "../protocol/canonical.js";
import { PartAssembler, type PartRequest } from "../protocol/content.js";
import { SafeError } from "../protocol/errors.js";
import { FrameDecoder, MAX_FRAME_BYTES, frameContent } from "../protocol/framing.js";
import { REPLY_RESULT_TYPES } from "../generated/types.js";
import { SCHEMA_INVALID } from "../protocol/errors.js";
import { decodeLaunch, decodeReplyResult, decodeRunState, decodeServerFrame, encodeRunner } from "../protocol/messages.js";

/** The fields of a runner message without the common envelope. */
export type Fields<T extends RunnerMessage["type"]> = Omit<
  Extract<RunnerMessage, { type: T }>,
  "type" | "schema" | "runId" | "generation" | "runnerEpoch" | "messageId"
>;

/** The result of an accepted reply to a `T` message: a type `x-replyResult` names, or null for a message without one. */
export type ReplyResultOf<T extends RunnerMessage["type"]> = T extends keyof ReplyResultByMessageType ? ReplyResultByMessageType[T] : null;

/** A reply to a `T` message, its referenced result read: an accepted (or adopted) reply carries `ReplyResultOf<T>`, a refusal a null result. */
export type ReplyTo<T extends RunnerMessage["type"]> =
  | (Omit<Reply, "outcome" | "result" | "resultContent"> & { outcome: "accepted" | "adopted"; result: ReplyResultOf<T> })
  | (Omit<Reply, "outcome" | "result" | "resultContent"> & { outcome: "rejected" | "claimLost"; result: null });

/** A reply to any runner message (its result one of the typed results or null). */
export type RunnerReply = ReplyTo<RunnerMessage["type"]>;

/** Whether the schema names result types for the accepted reply to a `type` message. */
function hasReplyResult(type: RunnerMessage["type"]): type is keyof ReplyResultByMessageType {
  return Object.hasOwn(REPLY_RESULT_TYPES, type);
}

/** `reply` to a `type` message with its result checked and typed (`schemaInvalid` when the result is off the schema). */
function typedReply<T extends RunnerMessage["type"]>(type: T, reply: Omit<Reply, "resultContent">): ReplyTo<T> {
  const { outcome, result } = reply;
  if (outcome === "accepted" || outcome === "adopted") {
    if (hasReplyResult(type)) return { ...reply, outcome, result: decodeReplyResult(type, result) as ReplyResultOf<T> };
    if (result === null) return { ...reply, outcome, result: null as ReplyResultOf<T> };
    throw SCHEMA_INVALID();
  }
  if (result !== null) throw SCHEMA_INVALID();
  return { ...reply, outcome, result: null };
}

/** What the server asks for after `runner.ready`: a command, or a reply whose `next` decides. */
export type Dispatch = { kind: "command"; command: RunnerCommand } | { kind: "reply"; reply: Reply };

/** The channel closed (stdin ended or a frame was invalid). */
export class ChannelClosedError extends Error {
  override readonly name = "ChannelClosedError";
}

/** The largest referenced value this runner reads: 256 MiB. */
export const MAX_REFERENCED_BYTES = 256 * 1024 * 1024;

/** Referenced content could not be read: a closed code and a bounded message (no content in it). */
export class ContentReadError extends Error {
  override readonly name = "ContentReadError";
  constructor(
    readonly code: ErrorCode,
    message: string,
  ) {
    super(message.slice(0, 512));
  }
}

/** The answer to one `content.read`: its part, or the reply that refuses it. */
type PartAnswer = ContentChunkMessage | Reply;
/** The protocol rule a refused frame breaks. */
export type FrameRule = "nesting" | "size" | "encoding" | "schema";

/** A runner message the runner did not write because its frame breaks a protocol rule. */
export class FrameRefused extends Error {
  override readonly name = "FrameRefused";
  constructor(
    readonly messageType: RunnerMessage["type"],
    readonly rule: FrameRule,
    /** The frame's nesting depth (`nesting`) or its size in bytes with the newline (`size`); 0 otherwise. */
    readonly measured: number,
  ) {
    super(`the ${messageType} message ${RULE_TEXT[rule](measured)}`);
  }
}

const RULE_TEXT: Record<FrameRule, (measured: number) => string> = {
  nesting: (depth) => `nests ${depth} levels, deeper than the protocol's ${MAX_DEPTH}-level frame limit`,
  size: (bytes) => `would be a ${grouped(bytes)}-byte frame, over the protocol's 1 MiB frame limit (${grouped(MAX_FRAME_BYTES)} bytes)`,
  encoding: () => "cannot be written as canonical JSON (RFC 8785)",
  schema: () => "does not match the runner.v1 schema",
};

function grouped(n: number): string {
  return n.toLocaleString("en-US");
}

function article(word: string): string {
  return /^[aeiou]/.test(word) ? "an" : "a";
}

/** Bytes as `1.34 MiB` or `980.2 KiB`. */
function sizeText(bytes: number): string {
  return bytes >= MAX_FRAME_BYTES ? `${(bytes / MAX_FRAME_BYTES).toFixed(2)} MiB` : `${(bytes / 1024).toFixed(1)} KiB`;
}

/**
 * Why `value` (described by `what`, e.g. "its output") cannot travel in
 * the refused frame, in terms of the value: its depth and the most this
 * message allows, or its encoded size and the frame's.
 */
export function refusalReason(refused: FrameRefused, what: string, value: unknown): string {
  const type = refused.messageType;
  switch (refused.rule) {
    case "nesting": {
      const depth = jsonDepth(value);
      const allowed = MAX_DEPTH - (refused.measured - depth);
      return `${what} nests ${depth} levels; ${article(type)} ${type} message can carry at most ${allowed}, within the protocol's ${MAX_DEPTH}-level frame limit`;
    }
    case "size": {
      const bytes = canonicalize(value).length;
      return `${what} is ${sizeText(bytes)} encoded (the ${type} frame would be ${grouped(refused.measured)} bytes); a frame must fit the protocol's 1 MiB limit (${grouped(MAX_FRAME_BYTES)} bytes)`;
    }
    case "encoding":
      return `${what} cannot be written as canonical JSON (RFC 8785)`;
    case "schema":
      return `${what} does not fit the runner.v1 schema of ${type}`;
  }
}

/** Encodes `message`, or throws the FrameRefused that says which rule it breaks. */
function encodeOrRefuse(message: RunnerMessage): Uint8Array {
  try {
    return encodeRunner(message);
  } catch (error) {
    if (!(error instanceof SafeError)) throw error;
    switch (error.code) {
      case "schemaInvalid":
        throw new FrameRefused(message.type, "schema", 0);
      case "internal":
        throw new FrameRefused(message.type, "encoding", 0);
      case "nestingTooDeep":
        throw new FrameRefused(message.type, "nesting", nestingDepth(canonicalize(message)));
      case "frameTooLarge":
        throw new FrameRefused(message.type, "size", Buffer.byteLength(canonicalString(message)) + 1);
      default:
        // encodeRunner refuses with the four codes above only.
        throw error;
    }
  }
}

interface Pending {
  resolve: (reply: Reply) => void;
  reject: (error: Error) => void;
}

/**
 * Reads a launch envelope: the first line of `input`, or (a resolver waiting
 * for its run, `decoder` holding what was read before) the next one.
 * Returns it and the decoder holding any bytes after it; stdin's end before
 * a whole envelope rejects with `ChannelClosedError`.
 */
export function readLaunch(input: Readable, decoder = new FrameDecoder()): Promise<{ launch: WorkerLaunch; decoder: FrameDecoder }> {
  return new Promise((resolve, reject) => {
    try {
      const buffered = decoder.nextFrame();
      if (buffered !== null) return resolve({ launch: decodeLaunch(frameContent(buffered)), decoder });
    } catch (error) {
      return reject(error);
    }
    if (input.readableEnded) return reject(new ChannelClosedError("stdin closed before the launch envelope"));
    const cleanup = (): void => {
      input.off("data", onData);
      input.off("end", onEnd);
      input.off("error", onError);
      input.pause();
    };
    const onData = (chunk: Uint8Array): void => {
      try {
        decoder.push(chunk);
        const frame = decoder.nextFrame();
        if (frame === null) return;
        cleanup();
        resolve({ launch: decodeLaunch(frameContent(frame)), decoder });
      } catch (error) {
        cleanup();
        reject(error);
      }
    };
    const onEnd = (): void => {
      cleanup();
      reject(new ChannelClosedError("stdin closed before the launch envelope"));
    };
    const onError = (error: Error): void => {
      cleanup();
      reject(error);
    };
    input.on("data", onData);
    input.once("end", onEnd);
    input.once("error", onError);
    // A stream paused after an earlier envelope does not flow again by itself.
    input.resume();
  });
}

export class RunnerChannel {
  private counter = 0;
  private readonly pending = new Map<string, Pending>();
  private readonly pendingReads = new Map<string, { resolve: (answer: PartAnswer) => void; reject: (error: Error) => void }>();
  private dispatchWaiter: { readyId: string; resolve: (d: Dispatch) => void; reject: (e: Error) => void } | undefined;
  private queuedCommand: RunnerCommand | undefined;
  private closedError: Error | undefined;
  /** Called once when a reply says the claim is lost. */
  onClaimLost: (() => void) | undefined;
  /** Called once when the channel closes. */
  onClosed: ((error: Error) => void) | undefined;

  constructor(
    readonly launch: WorkerLaunch,
    private readonly input: Readable,
    private readonly output: Writable,
    private readonly decoder: FrameDecoder,
    private readonly log: (line: string) => void,
  ) {}

  /** Starts reading server frames (after the launch envelope). */
  start(): void {
    const drainBuffered = (): boolean => {
      try {
        for (let frame = this.decoder.nextFrame(); frame !== null; frame = this.decoder.nextFrame()) {
          this.handle(decodeServerFrame(frame));
        }
        return true;
      } catch (error) {
        this.close(error instanceof Error ? error : new Error(String(error)));
        return false;
      }
    };
    if (!drainBuffered()) return;
    this.input.on("data", (chunk: Uint8Array) => {
      if (this.closedError) return;
      this.decoder.push(chunk);
      drainBuffered();
    });
    this.input.on("end", () => {
      try {
        this.decoder.finish();
        this.close(new ChannelClosedError("the server closed the channel"));
      } catch (error) {
        this.close(error instanceof Error ? error : new Error(String(error)));
      }
    });
    this.input.on("error", (error) => this.close(error));
    this.input.resume();
  }

  private close(error: Error): void {
    if (this.closedError) return;
    this.closedError = error;
    for (const pending of this.pending.values()) pending.reject(error);
    this.pending.clear();
    for (const pending of this.pendingReads.values()) pending.reject(error);
    this.pendingReads.clear();
    this.dispatchWaiter?.reject(error);
    this.dispatchWaiter = undefined;
    this.onClosed?.(error);
  }

  private handle(message: ServerMessage): void {
    if (message.type === "command") {
      if (this.dispatchWaiter) {
        const waiter = this.dispatchWaiter;
        this.dispatchWaiter = undefined;
        waiter.resolve({ kind: "command", command: message });
      } else {
        this.queuedCommand = message;
      }
      return;
    }
    if (message.type === "content.chunk") {
      const read = this.pendingReads.get(message.inReplyTo);
      if (read) {
        this.pendingReads.delete(message.inReplyTo);
        read.resolve(message);
      } else {
        this.log(`content.chunk for ${message.inReplyTo} ignored (no read asked for it)`);
      }
      return;
    }
    if (message.outcome === "claimLost") {
      this.log(`claimLost in reply to ${message.inReplyTo}`);
      this.onClaimLost?.();
    }
    const read = this.pendingReads.get(message.inReplyTo);
    if (read) {
      this.pendingReads.delete(message.inReplyTo);
      read.resolve(message);
      return;
    }
    if (this.dispatchWaiter && message.inReplyTo === this.dispatchWaiter.readyId) {
      const waiter = this.dispatchWaiter;
      if (message.next !== undefined || message.outcome !== "accepted") {
        this.dispatchWaiter = undefined;
        waiter.resolve({ kind: "reply", reply: message });
      }
      return;
    }
    const pending = this.pending.get(message.inReplyTo);
    if (pending) {
      this.pending.delete(message.inReplyTo);
      pending.resolve(message);
    } else if (message.outcome !== "accepted" && message.outcome !== "adopted") {
      this.log(`reply to ${message.inReplyTo}: ${message.outcome}${message.error ? ` (${message.error.code}: ${message.error.message})` : ""}`);
    }
  }

  /** The refusal `send` would throw for this message, or null when its frame is within every rule (nothing is written). */
  check<T extends RunnerMessage["type"]>(type: T, fields: Fields<T>): FrameRefused | null {
    try {
      encodeOrRefuse(this.envelope(type, fields, `${this.launch.runnerEpoch}-m${this.counter + 1}`));
      return null;
    } catch (error) {
      if (error instanceof FrameRefused) return error;
      throw error;
    }
  }

  private envelope<T extends RunnerMessage["type"]>(type: T, fields: Fields<T>, messageId: string): RunnerMessage {
    return {
      ...fields,
      type,
      schema: "pi-workflows.worker-launch.v1",
      runId: this.launch.runId,
      generation: this.launch.generation,
      runnerEpoch: this.launch.runnerEpoch,
      messageId,
    } as unknown as RunnerMessage;
  }

  /** Writes one message; resolves when it is handed to the OS. Returns its message id. Throws FrameRefused (nothing written) when its frame breaks a protocol rule. */
  async send<T extends RunnerMessage["type"]>(type: T, fields: Fields<T>): Promise<string> {
    if (this.closedError) throw this.closedError;
    const messageId = `${this.launch.runnerEpoch}-m${this.counter + 1}`;
    const frame = encodeOrRefuse(this.envelope(type, fields, messageId));
    this.counter += 1;
    if (!this.output.write(frame)) {
      await new Promise<void>((resolve, reject) => {
        const onDrain = (): void => {
          this.output.off("error", onError);
          resolve();
        };
        const onError = (error: Error): void => {
          this.output.off("drain", onDrain);
          reject(error);
        };
        this.output.once("drain", onDrain);
        this.output.once("error", onError);
      });
    }
    return messageId;
  }

  /**
   * Writes a message and waits for its reply. A result the server sent as
   * `resultContent` is read and verified first (`ContentReadError` when it
   * cannot be), so the reply's `result` is always the value itself, typed
   * by `type` and checked against the schema (`SafeError` `schemaInvalid`
   * when it is off it).
   */
  async request<T extends RunnerMessage["type"]>(type: T, fields: Fields<T>): Promise<ReplyTo<T>> {
    if (this.closedError) throw this.closedError;
    // Register before writing: the reply may arrive before `send` resolves.
    const nextId = `${this.launch.runnerEpoch}-m${this.counter + 1}`;
    const reply = new Promise<Reply>((resolve, reject) => this.pending.set(nextId, { resolve, reject }));
    let sent: string;
    try {
      sent = await this.send(type, fields);
    } catch (error) {
      this.pending.delete(nextId);
      throw error;
    }
    if (sent !== nextId) throw new Error("message ids went out of order");
    const answer = await reply;
    const { resultContent, ...rest } = answer;
    if (resultContent === undefined) return typedReply(type, rest);
    const bytes = await this.readContent(resultContent);
    let result: JsonValue;
    try {
      result = parseCanonical(bytes);
    } catch {
      throw new ContentReadError("schemaInvalid", "the referenced reply result is not canonical JSON");
    }
    return typedReply(type, { ...rest, result });
  }

  /** The run state of a command: inline, or read and verified from its reference. */
  async runState(state: CommandState): Promise<RunState> {
    if (state.kind === "inline") return state.value;
    const bytes = await this.readContent(state.reference);
    try {
      return decodeRunState(bytes);
    } catch {
      throw new ContentReadError("schemaInvalid", "the referenced run state is not a canonical RunState");
    }
  }

  /** Reads referenced JSON content with `content.read` in verified parts of at most 512 KiB. */
  async readContent(reference: ContentReference): Promise<Uint8Array> {
    if (reference.mediaType !== "application/json") {
      throw new ContentReadError("schemaInvalid", "the referenced content is not application/json");
    }
    if (reference.bytes > MAX_REFERENCED_BYTES) {
      throw new ContentReadError("frameTooLarge", "the referenced content is larger than this runner reads (256 MiB)");
    }
    const assembler = new PartAssembler(reference, (code, what) => new ContentReadError(code, `referenced content failed verification: ${what}`));
    for (let next = assembler.nextRequest(); next !== null; next = assembler.nextRequest()) {
      const answer = await this.readPart(next);
      if (answer.type === "reply") {
        const code = answer.error?.code ?? "contentUnavailable";
        throw new ContentReadError(code, `the server refused a content part: ${answer.error?.message ?? answer.outcome}`);
      }
      assembler.accept(answer);
    }
    return assembler.finish();
  }

  /** Sends one `content.read` and waits for its part (or the refusing reply). */
  private async readPart(part: PartRequest): Promise<PartAnswer> {
    if (this.closedError) throw this.closedError;
    const nextId = `${this.launch.runnerEpoch}-m${this.counter + 1}`;
    const answer = new Promise<PartAnswer>((resolve, reject) => this.pendingReads.set(nextId, { resolve, reject }));
    const sent = await this.send("content.read", { reference: part.reference, offset: part.offset, length: part.length });
    if (sent !== nextId) throw new Error("message ids went out of order");
    return answer;
  }

  /** Sends `runner.ready` and waits for the one command (or a reply whose `next` says what to do). */
  async ready(): Promise<Dispatch> {
    if (this.queuedCommand) throw new Error("a command arrived before runner.ready");
    const readyId = `${this.launch.runnerEpoch}-m${this.counter + 1}`;
    const dispatch = new Promise<Dispatch>((resolve, reject) => {
      this.dispatchWaiter = { readyId, resolve, reject };
    });
    await this.send("runner.ready", { sourceVerified: true });
    return dispatch;
  }
}
