/**
 * One socket connection speaking `pi-workflows.client.v1`: connect, hello
 * exchange, frame decoding, and writes that respect backpressure.
 *
 * Invariants:
 * - The first frame each side sends is its hello. The client checks the
 *   server's `packageVersion` itself (the server compares the same two
 *   strings), so a mismatch is detected on the server hello and reported as
 *   one `packageVersionMismatch` error; the server's own mismatch response is
 *   reported the same way.
 * - Every frame received is decoded with the protocol module (framing,
 *   nesting, canonical form, schema); any failure ends the connection.
 * - A write that waits for `drain` stops waiting when the connection closes,
 *   errors, or the caller's AbortSignal fires.
 * - `closed` settles exactly once, with the error pending requests should
 *   see; whether they may retry is `retryable`. A connection error frame
 *   the server sent before closing is that error (not retryable, except the
 *   idle close `timedOut`); one sent instead of the hello (a server at its
 *   connection cap) fails the connect with its code and reason.
 */
import { Socket, createConnection } from "node:net";

import type { ClientMessage, Hello } from "../generated/types.js";
import { FrameDecoder } from "../protocol/framing.js";
import { SafeError } from "../protocol/errors.js";
import { decodeClientFrame, encodeClient } from "../protocol/messages.js";
import { CANCELLED, WorkflowClientError, isErrorCode } from "./errors.js";
import { PROTOCOL_VERSION } from "./version.js";

/** How a connection ended: the error to report, and whether a retry on a new connection may succeed. */
export interface ConnectionEnd {
  error: WorkflowClientError;
  /** True for a plain disconnect; false for a protocol rejection or a version mismatch. */
  retryable: boolean;
}

/** Why a connection attempt failed before the hello completed. */
export class ConnectFailure extends Error {
  /** True when nothing listens on the socket (absent file, refused, not a socket): starting the server may help. */
  readonly absent: boolean;
  readonly error: WorkflowClientError;

  constructor(absent: boolean, error: WorkflowClientError) {
    super(error.message);
    this.absent = absent;
    this.error = error;
  }
}

/** What `Connection.open` needs. */
export interface OpenOptions {
  socketPath: string;
  clientId: string;
  packageVersion: string;
  /** How long to wait for the server's hello after connecting. */
  helloTimeoutMs: number;
  /** Whether the attempt keeps the process alive (false for background reconnects). */
  ref?: boolean;
  /** Receives every frame after the hello. */
  onMessage: (connection: Connection, message: ClientMessage) => void;
}

const ABSENT_CODES = new Set(["ENOENT", "ECONNREFUSED", "ENOTSOCK", "ECONNRESET", "EPIPE"]);

export const versionMismatch = (serverVersion: string | undefined, clientVersion: string, serverMessage?: string): WorkflowClientError =>
  new WorkflowClientError(
    "packageVersionMismatch",
    serverMessage !== undefined
      ? `${serverMessage} (this client is @pi-workflows/sdk ${clientVersion})`
      : `the pi-workflows server is version ${serverVersion ?? "unknown"} but this client is @pi-workflows/sdk ${clientVersion}; install matching pi-workflows packages`,
  );

/** One open, greeted connection. */
export class Connection {
  /** The server's epoch from its hello. */
  readonly serverEpoch: number | undefined;
  /** The server's package version from its hello. */
  readonly serverVersion: string;
  /** Settles once, when the connection ends. */
  readonly closed: Promise<ConnectionEnd>;

  private readonly socket: Socket;
  private end: ConnectionEnd | null = null;
  private resolveClosed!: (end: ConnectionEnd) => void;
  private drainWait: Promise<void> | null = null;
  /** Called once when the connection ends (registered by waits, removed when they finish). */
  private readonly closeListeners = new Set<(end: ConnectionEnd) => void>();
  /** The reason a server error event gave before it closed the connection. */
  private serverError: WorkflowClientError | null = null;

  private readonly clientVersion: string;

  private constructor(socket: Socket, hello: Hello, clientVersion: string) {
    this.socket = socket;
    this.clientVersion = clientVersion;
    this.serverEpoch = hello.serverEpoch;
    this.serverVersion = hello.packageVersion;
    this.closed = new Promise((resolve) => {
      this.resolveClosed = resolve;
    });
  }

  /** Whether the connection has ended. */
  get isClosed(): boolean {
    return this.end !== null;
  }

  /** Connects, sends the client hello and waits for the server's. Throws `ConnectFailure`. */
  static open(options: OpenOptions): Promise<Connection> {
    return new Promise((resolve, reject) => {
      const socket = createConnection({ path: options.socketPath });
      if (options.ref === false) socket.unref();
      const decoder = new FrameDecoder();
      let connection: Connection | null = null;
      let settled = false;
      const fail = (failure: ConnectFailure): void => {
        if (!settled) {
          settled = true;
          clearTimeout(timer);
          reject(failure);
        }
        socket.destroy();
      };
      const timer = setTimeout(() => {
        fail(new ConnectFailure(false, new WorkflowClientError("unavailable", "the pi-workflows server did not answer the hello in time; check `pi-workflows server status`")));
      }, options.helloTimeoutMs);
      timer.unref();

      socket.on("connect", () => {
        const hello: Hello = {
          schema: "pi-workflows.client.v1",
          type: "hello",
          role: "client",
          clientId: options.clientId,
          protocolVersion: PROTOCOL_VERSION,
          packageVersion: options.packageVersion,
        };
        let bytes: Uint8Array;
        try {
          bytes = encodeClient(hello);
        } catch {
          fail(new ConnectFailure(false, new WorkflowClientError("schemaInvalid", "the client hello is invalid (check the clientId and packageVersion options)")));
          return;
        }
        socket.write(bytes);
      });

      socket.on("data", (chunk: Buffer) => {
        decoder.push(chunk);
        for (;;) {
          let message: ClientMessage;
          try {
            const frame = decoder.nextFrame();
            if (frame === null) return;
            message = decodeClientFrame(frame);
          } catch (error) {
            const code = error instanceof SafeError ? error.code : "internal";
            const rejected = new WorkflowClientError(code, "the pi-workflows server sent an invalid frame; install matching pi-workflows packages");
            if (connection !== null) connection.finish({ error: rejected, retryable: false });
            else fail(new ConnectFailure(false, rejected));
            return;
          }
          if (connection !== null) {
            connection.receive(message);
            if (connection.isClosed) return;
            continue;
          }
          // The first frame must be the server's hello.
          if (message.type !== "hello" || message.role !== "server") {
            const refusal = asConnectionError(message);
            const mismatch = asVersionMismatch(message, options.packageVersion);
            fail(new ConnectFailure(false, refusal ?? mismatch ?? new WorkflowClientError("schemaInvalid", "the pi-workflows server did not send its hello first; install matching pi-workflows packages")));
            return;
          }
          if (message.packageVersion !== options.packageVersion) {
            fail(new ConnectFailure(false, versionMismatch(message.packageVersion, options.packageVersion)));
            return;
          }
          connection = new Connection(socket, message, options.packageVersion);
          connection.onMessage = options.onMessage;
          settled = true;
          clearTimeout(timer);
          resolve(connection);
        }
      });

      socket.on("error", (error: NodeJS.ErrnoException) => {
        if (connection !== null) {
          connection.finish({ error: new WorkflowClientError("unavailable", "the connection to the pi-workflows server failed"), retryable: true });
          return;
        }
        // Never include error.message: it names the socket path.
        const absent = error.code !== undefined && ABSENT_CODES.has(error.code);
        fail(new ConnectFailure(absent, absent ? new WorkflowClientError("unavailable", "the pi-workflows server is not running; start it with `pi-workflows server start`") : new WorkflowClientError("unavailable", "cannot connect to the pi-workflows server socket; check PI_WORKFLOWS_HOME and `pi-workflows server status`")));
      });

      socket.on("close", () => {
        if (connection !== null) {
          try {
            decoder.finish();
          } catch {
            // A partial last frame: the connection is over either way.
          }
          connection.finish({ error: new WorkflowClientError("unavailable", "the pi-workflows server closed the connection"), retryable: true });
          return;
        }
        fail(new ConnectFailure(true, new WorkflowClientError("unavailable", "the pi-workflows server closed the connection during the hello; retry")));
      });
    });
  }

  private onMessage: OpenOptions["onMessage"] = () => undefined;

  private receive(message: ClientMessage): void {
    if (message.type === "response" && message.error?.code === "packageVersionMismatch") {
      this.finish({ error: versionMismatch(undefined, this.clientVersion, message.error.message), retryable: false });
      return;
    }
    const closing = asConnectionError(message);
    if (closing !== null) {
      this.serverError = closing;
      return;
    }
    this.onMessage(this, message);
  }

  /** Ends the connection once; pending waits see `end`. */
  private finish(reported: ConnectionEnd): void {
    if (this.end !== null) return;
    // A protocol rejection the server announced wins over a plain close. An
    // idle close (`timedOut`) is not a rejection: a request written as it
    // closed was never read, so it is retried on a new connection.
    const end =
      this.serverError !== null && reported.retryable ? { error: this.serverError, retryable: this.serverError.code === "timedOut" } : reported;
    this.end = end;
    this.socket.destroy();
    this.resolveClosed(end);
    for (const listener of this.closeListeners) listener(end);
    this.closeListeners.clear();
  }

  /**
   * Calls `listener` once when the connection ends (at once if it has).
   * Returns the function that removes it; long-lived connections stay free
   * of listeners of finished waits.
   */
  onClose(listener: (end: ConnectionEnd) => void): () => void {
    if (this.end !== null) {
      listener(this.end);
      return () => undefined;
    }
    this.closeListeners.add(listener);
    return () => this.closeListeners.delete(listener);
  }

  /** Closes the connection (pending requests see a retryable end). */
  close(): void {
    this.finish({ error: new WorkflowClientError("unavailable", "the connection was closed by this client"), retryable: true });
  }

  /** Keeps (true) or stops (false) the connection keeping the process alive. */
  setRef(ref: boolean): void {
    if (ref) this.socket.ref();
    else this.socket.unref();
  }

  /**
   * Writes one encoded frame. When the socket buffer is full, waits for
   * `drain`; the wait ends early when the connection ends (rejects with the
   * end's error) or `signal` fires (rejects with `cancelled`).
   */
  async write(bytes: Uint8Array, signal?: AbortSignal): Promise<void> {
    while (this.drainWait !== null) {
      await this.until(this.drainWait, signal);
    }
    if (this.end !== null) throw this.end.error;
    if (signal?.aborted === true) throw CANCELLED();
    if (this.socket.write(bytes)) return;
    const wait = new Promise<void>((resolve) => {
      this.socket.once("drain", resolve);
    });
    this.drainWait = wait;
    void wait.then(() => {
      if (this.drainWait === wait) this.drainWait = null;
    });
    await this.until(wait, signal);
  }

  /** Waits for `promise`, the end of the connection, or the abort of `signal`, whichever comes first. */
  private until(promise: Promise<void>, signal?: AbortSignal): Promise<void> {
    if (this.end !== null) return Promise.reject(this.end.error);
    if (signal?.aborted === true) return Promise.reject(CANCELLED());
    return new Promise<void>((resolve, reject) => {
      let removeClose = (): void => undefined;
      const onAbort = (): void => {
        cleanup();
        reject(CANCELLED());
      };
      const cleanup = (): void => {
        signal?.removeEventListener("abort", onAbort);
        removeClose();
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      removeClose = this.onClose((end) => {
        cleanup();
        reject(end.error);
      });
      promise.then(
        () => {
          cleanup();
          resolve();
        },
        (error: unknown) => {
          cleanup();
          reject(error instanceof Error ? error : new Error(String(error)));
        },
      );
    });
  }
}

/**
 * The server's bounded error frame before it closes a connection (an
 * `availability: unavailable` event of subscription `connection`, reason
 * "<code>: <message>"), e.g. the refusal a server at its connection cap
 * sends instead of its hello.
 */
function asConnectionError(message: ClientMessage): WorkflowClientError | null {
  if (message.type !== "event" || message.subscriptionId !== "connection" || message.event.kind !== "availability" || message.event.state !== "unavailable") return null;
  const reason = message.event.reason ?? "";
  const split = reason.indexOf(": ");
  const code = split > 0 ? reason.slice(0, split) : "";
  return new WorkflowClientError(isErrorCode(code) ? code : "unavailable", split > 0 ? reason.slice(split + 2) : reason || "the server reported a connection error");
}

function asVersionMismatch(message: ClientMessage, clientVersion: string): WorkflowClientError | null {
  if (message.type === "response" && message.error?.code === "packageVersionMismatch") {
    return versionMismatch(undefined, clientVersion, message.error.message);
  }
  return null;
}
