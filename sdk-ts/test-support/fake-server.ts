/**
 * Test support: a fake pi-workflows server on a Unix socket (no binary):
 * it sends the server hello, decodes every client frame and lets a test
 * script answer each request (`Peer.respond`). Used by the WorkflowClient
 * unit tests and by the real-Pi tests of the runner's bridge extension.
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { PACKAGE_VERSION, WorkflowClient, type WorkflowClientOptions } from "../src/client/index.js";
import type { ClientMessage, Request } from "../src/generated/types.js";
import { FrameDecoder, canonicalString, decodeClientFrame } from "../src/protocol/index.js";

export const frameOf = (value: unknown): Buffer => Buffer.from(canonicalString(value) + "\n");

export const serverHello = (packageVersion = PACKAGE_VERSION): object => ({
  schema: "pi-workflows.client.v1",
  type: "hello",
  role: "server",
  protocolVersion: 1,
  packageVersion,
  serverEpoch: 7,
});

/** The server side of one accepted connection. */
export class Peer {
  readonly socket: Socket;
  readonly messages: ClientMessage[] = [];
  /** Every raw frame received, newline included. */
  readonly frames: Buffer[] = [];
  private readonly waiters: Array<(message: ClientMessage) => void> = [];
  private readonly decoder = new FrameDecoder();

  constructor(socket: Socket, onMessage: (peer: Peer, message: ClientMessage) => void) {
    this.socket = socket;
    socket.on("error", () => undefined);
    socket.on("data", (chunk: Buffer) => {
      this.decoder.push(chunk);
      for (let frame = this.decoder.nextFrame(); frame !== null; frame = this.decoder.nextFrame()) {
        this.frames.push(Buffer.from(frame));
        const message = decodeClientFrame(frame);
        this.messages.push(message);
        const waiter = this.waiters.shift();
        if (waiter !== undefined) waiter(message);
        onMessage(this, message);
      }
    });
  }

  send(value: unknown): void {
    this.socket.write(frameOf(value));
  }

  respond(request: Request, outcome: string, receipt?: unknown, error?: { code: string; message: string }, revision?: number): void {
    const response: Record<string, unknown> = {
      schema: "pi-workflows.client.v1",
      type: "response",
      requestId: request.requestId,
      operation: request.operation,
      outcome,
    };
    if (receipt !== undefined) response["receipt"] = receipt;
    if (error !== undefined) response["error"] = error;
    if (revision !== undefined) response["revision"] = revision;
    this.send(response);
  }

  event(subscriptionId: string, revision: number, event: unknown): void {
    this.send({ schema: "pi-workflows.client.v1", type: "event", subscriptionId, revision, event });
  }
}

export interface FakeScript {
  /** The version in the server hello (default: the client's). */
  version?: string;
  /** Send the server hello on connect (default true). */
  hello?: boolean;
  onConnect?: (peer: Peer, fake: Fake) => void;
  onRequest?: (request: Request, peer: Peer, fake: Fake) => void;
}

export class Fake {
  readonly dir: string;
  readonly socketPath: string;
  readonly peers: Peer[] = [];
  readonly requests: Request[] = [];
  private readonly server: Server;

  private constructor(dir: string, server: Server) {
    this.dir = dir;
    this.socketPath = join(dir, "host", "server.sock");
    this.server = server;
  }

  static async start(script: FakeScript = {}): Promise<Fake> {
    const dir = mkdtempSync(join(tmpdir(), "piw-fake-"));
    const server = createServer();
    const fake = new Fake(dir, server);
    server.on("connection", (socket) => {
      const peer = new Peer(socket, (from, message) => {
        if (message.type === "request") {
          fake.requests.push(message);
          script.onRequest?.(message, from, fake);
        }
      });
      fake.peers.push(peer);
      if (script.hello !== false) peer.send(serverHello(script.version));
      script.onConnect?.(peer, fake);
    });
    mkdirSync(join(dir, "host"));
    await new Promise<void>((resolve) => server.listen(fake.socketPath, resolve));
    return fake;
  }

  client(options: WorkflowClientOptions = {}): WorkflowClient {
    return new WorkflowClient({ socketPath: this.socketPath, home: this.dir, autoStart: false, retryIntervalMs: 20, ...options });
  }

  /** Stops accepting connections (existing ones stay until destroyed). */
  stopListening(): void {
    if (this.server.listening) this.server.close();
  }

  async close(): Promise<void> {
    for (const peer of this.peers) peer.socket.destroy();
    if (this.server.listening) await new Promise<void>((resolve) => this.server.close(() => resolve()));
    rmSync(this.dir, { recursive: true, force: true });
  }
}
