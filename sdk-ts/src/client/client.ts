/**
 * `WorkflowClient`: the one TypeScript client of the pi-workflows server.
 *
 * Invariants:
 * - One persistent connection per client (use `sharedWorkflowClient()` for
 *   one per process), opened on demand. When the socket is absent or
 *   refuses, the client runs `<bin> server start` once and retries on a
 *   REFERENCED timer until the server is ready or the start deadline passes,
 *   then fails with one `unavailable` error. Background reconnects (for
 *   subscriptions, with no request waiting) use UNREFERENCED timers and never
 *   start a server.
 * - The connection keeps the process alive only while a request is in
 *   flight or a subscription is open.
 * - Every transport attempt has a new request id; a logical state-changing
 *   command has one idempotency key; the client id is fixed per instance.
 *   After a disconnect, a request is retried with a new request id and the
 *   same client id, key, operation, run id, expected revision and payload,
 *   so the server adopts its stored receipt instead of executing it twice.
 * - Requests have no client-side timeout (an `interaction.submit` response
 *   waits for the durable validation outcome); callers bound a wait with an
 *   AbortSignal, which stops waiting without cancelling the server command.
 * - Errors are `WorkflowClientError`s with a closed code and the server's
 *   safe message or static text (see errors.ts).
 */
import { randomBytes, randomUUID } from "node:crypto";
import { join } from "node:path";

import type {
  ClientMessage,
  CommandOutcome,
  ContentReference,
  DecisionAnswerPayload,
  EffectRecoverPayload,
  SessionEventsRecordPayload,
  InteractionSubmitPayload,
  InteractionUpdatePayload,
  JsonValue,
  Operation,
  PageCollection,
  Request,
  RequestPayloadByOperation,
  Response,
  ResponseReceiptByOperation,
  ReportBranchPayload,
  RunCancelPayload,
  RunRestartPayload,
  RunStartPayload,
  RunView,
  SessionView,
  ResourceApplyPayload,
  ResourceListView,
  ResourceView,
  SettingsUpdatePayload,
  SettingsView,
  SafeError as WireSafeError,
  ServerStatus,
  ServerStopReceipt,
  SubscriptionTarget,
  TurnReportPayload,
  ViewPage,
  ViewPagePayload,
} from "../generated/types.js";
import { STATE_CHANGING_OPERATIONS } from "../generated/types.js";

/** Operations that store a durable receipt (generated from client.v1's `x-stateChanging`): they get an idempotency key by default. */
export { STATE_CHANGING_OPERATIONS };
import { defaultHome } from "../home.js";
import { SafeError } from "../protocol/errors.js";
import { encodeClient } from "../protocol/messages.js";
import { Connection, ConnectFailure } from "./connection.js";
import { ContentAssembler } from "./content.js";
import { CANCELLED, CLOSED, CONNECTION_LOST, NOT_RUNNING, WorkflowClientError } from "./errors.js";
import { startServer, type StartingServer } from "./start.js";
import { Subscription, type SubscriptionHost } from "./subscription.js";
import { PACKAGE_VERSION } from "./version.js";

/** How a client finds, starts and talks to the server. Every field is optional. */
export interface WorkflowClientOptions {
  /** The state directory (default: `PI_WORKFLOWS_HOME`, else `~/.pi/agent/workflows`). */
  home?: string;
  /** The socket (default: `<home>/host/server.sock`). */
  socketPath?: string;
  /** The `pi-workflows` binary used to start the server (default: `PI_WORKFLOWS_BIN`, else `pi-workflows` on `PATH`). */
  bin?: string;
  /** Start the server when the socket is absent (default true). */
  autoStart?: boolean;
  /** How long a cold start may take before one `unavailable` error (default 60 000 ms). */
  startDeadlineMs?: number;
  /** Retry period while the server starts (default 100 ms). */
  retryIntervalMs?: number;
  /** Longest pause between background reconnect attempts (default 5 000 ms). */
  maxReconnectDelayMs?: number;
  /** How long to wait for the server's hello (default 10 000 ms). */
  helloTimeoutMs?: number;
  /** Transport attempts per request before giving up after repeated disconnects (default 5). */
  maxAttempts?: number;
  /** Undelivered events a subscription buffers before it drops them and re-subscribes (default 1 024). */
  maxQueuedEvents?: number;
  /** The stable client id (default: a random id per instance). Reuse it to adopt receipts across processes. */
  clientId?: string;
  /** The package version announced in the hello (default: this package's version). */
  packageVersion?: string;
  /** The environment of `server start` (default `process.env`; `PI_WORKFLOWS_HOME` is set from `home`). */
  env?: NodeJS.ProcessEnv;
}

/** Per-request options. */
export interface RequestOptions {
  /** Stops waiting (the server may still complete a command already sent). */
  signal?: AbortSignal;
}

/** Options of a state-changing command. */
export interface CommandOptions extends RequestOptions {
  /** The durable identity of this logical command (default: a fresh key). Reuse it to retry across client instances with the same client id. */
  idempotencyKey?: string;
  /** Refuse the command unless the run is at this revision (`staleRevision`). */
  expectedRevision?: number;
}

/** A generic request. */
export interface RequestSpec<Op extends Operation> extends RequestOptions {
  runId?: string;
  payload: RequestPayloadByOperation[Op];
  /**
   * The idempotency key: `true` for a fresh key, a string for that key,
   * `false` for none. Default: a fresh key for state-changing operations,
   * none for reads.
   */
  idempotent?: boolean | string;
  expectedRevision?: number;
}

/** A settled request: the server's response, whatever its outcome. */
export interface Settled<Op extends Operation> {
  operation: Op;
  outcome: CommandOutcome;
  /** The request id of the transport attempt that was answered. */
  requestId: string;
  /** The idempotency key the request carried. */
  idempotencyKey?: string;
  revision?: number;
  receipt?: ResponseReceiptByOperation[Op];
  error?: WireSafeError;
  /** The generation of the connection that answered (see `WorkflowClient.connectionGeneration`). */
  connectionGeneration: number;
}

/** An accepted (or adopted) command. */
export interface Accepted<Op extends Operation> {
  operation: Op;
  outcome: "accepted" | "adopted";
  requestId: string;
  idempotencyKey?: string;
  revision?: number;
  receipt: ResponseReceiptByOperation[Op];
  /** The generation of the connection that answered. */
  connectionGeneration: number;
}

/** Options of `connect()`. */
export interface ConnectOptions extends RequestOptions {
  /** Start the server when it is not running (default: the client's `autoStart`). False: only connect. */
  start?: boolean;
}

/** Subscription options. */
export interface SubscribeOptions extends RequestOptions {
  /** The presentation revision the caller already has: the server sends what follows it (patches, or a bounded snapshot). */
  fromRevision?: number;
}

/** What `pages()` walks. */
export interface PagesSpec {
  collection: PageCollection;
  revision: number;
  limit: number;
  maxBytes: number;
  /** Start here (default: the first page). */
  cursor?: string;
}

/** How often `completeRunView` reads the view again when the run moved on between pages. */
export const COMPLETE_VIEW_ATTEMPTS = 8;

/** The byte budget `completeRunView` asks pages for (the server's own page budget). */
export const MAX_PAGE_BYTES = 512 * 1024;


interface PendingRequest {
  connection: Connection;
  settle: (response: Response) => void;
  /** Called synchronously when the response arrives, before any later frame is handled. */
  onResponse?: (response: Response, connection: Connection) => void;
}

type Exchange = { kind: "response"; response: Response } | { kind: "lost"; error: WorkflowClientError };

/** The default state directory (`home.ts`: the runner finds its transform cache there too). */
export { defaultHome };

/** The socket under a state directory. */
export function socketPathOf(home: string): string {
  return join(home, "host", "server.sock");
}

/** The one client of the pi-workflows server. */
export class WorkflowClient implements SubscriptionHost {
  /** Stable for this instance; part of every command's durable identity. */
  readonly clientId: string;
  readonly socketPath: string;

  private readonly home: string;
  private readonly bin: string;
  private readonly autoStart: boolean;
  private readonly startDeadlineMs: number;
  private readonly retryIntervalMs: number;
  private readonly maxReconnectDelayMs: number;
  private readonly helloTimeoutMs: number;
  private readonly maxAttempts: number;
  private readonly maxQueuedEvents: number;
  private readonly packageVersion: string;
  private readonly env: NodeJS.ProcessEnv;

  private connection: Connection | null = null;
  private connecting: Promise<Connection> | null = null;
  /** Whether the attempt in `connecting` may start the server. */
  private connectingMayStart = false;
  private readonly pending = new Map<string, PendingRequest>();
  private readonly subscriptions = new Set<Subscription>();
  private readonly bySubscriptionId = new Map<string, Subscription>();
  /** Subscriptions with a `subscribe` in flight, and how many. */
  private readonly binding = new Map<Subscription, number>();
  private requestCounter = 0;
  private readonly requestNonce = randomBytes(6).toString("hex");
  /** Requests in progress (connecting, writing or waiting for a response). */
  private foreground = 0;
  private isClosed = false;
  private reconnectTimer: NodeJS.Timeout | null = null;
  private reconnectDelayMs: number;
  /** How many connections this client adopted; the current one's generation. */
  private generations = 0;
  private readonly generationOf = new WeakMap<Connection, number>();
  private readonly connectionListeners = new Set<(generation: number) => void>();

  constructor(options: WorkflowClientOptions = {}) {
    const env = options.env ?? process.env;
    this.home = options.home ?? defaultHome(env);
    this.socketPath = options.socketPath ?? socketPathOf(this.home);
    this.bin = options.bin ?? nonEmpty(env["PI_WORKFLOWS_BIN"]) ?? "pi-workflows";
    this.autoStart = options.autoStart ?? true;
    this.startDeadlineMs = options.startDeadlineMs ?? 60_000;
    this.retryIntervalMs = options.retryIntervalMs ?? 100;
    this.maxReconnectDelayMs = options.maxReconnectDelayMs ?? 5_000;
    this.helloTimeoutMs = options.helloTimeoutMs ?? 10_000;
    this.maxAttempts = Math.max(1, options.maxAttempts ?? 5);
    this.maxQueuedEvents = Math.max(1, options.maxQueuedEvents ?? 1024);
    this.clientId = options.clientId ?? `ts-${randomUUID()}`;
    this.packageVersion = options.packageVersion ?? PACKAGE_VERSION;
    this.env = { ...env, PI_WORKFLOWS_HOME: this.home };
    this.reconnectDelayMs = this.retryIntervalMs;
  }

  // ---- typed operations ------------------------------------------------------

  /** `run.start`: resolves the workflow and creates a run. */
  runStart(payload: RunStartPayload, options: CommandOptions = {}): Promise<Accepted<"run.start">> {
    return this.command("run.start", undefined, payload, options);
  }

  /** `run.pause`. */
  runPause(runId: string, options: CommandOptions = {}): Promise<Accepted<"run.pause">> {
    return this.command("run.pause", runId, {}, options);
  }

  /** `run.resume`. */
  runResume(runId: string, options: CommandOptions = {}): Promise<Accepted<"run.resume">> {
    return this.command("run.resume", runId, {}, options);
  }

  /** `run.cancel`. */
  runCancel(runId: string, options: CommandOptions = {}, payload: RunCancelPayload = {}): Promise<Accepted<"run.cancel">> {
    return this.command("run.cancel", runId, payload, options);
  }

  /** `run.restart`: a new run from a terminal run's exact reference and input. */
  runRestart(runId: string, options: CommandOptions = {}, payload: RunRestartPayload = {}): Promise<Accepted<"run.restart">> {
    return this.command("run.restart", runId, payload, options);
  }

  /** `followUp.add`: queues `prompt` to run in the run's origin session after its continuation chain completes. */
  followUpAdd(runId: string, prompt: string, options: CommandOptions = {}): Promise<Accepted<"followUp.add">> {
    return this.command("followUp.add", runId, { prompt }, options);
  }

  /** `followUp.cancel`: cancels a follow-up that was not delivered yet. */
  followUpCancel(followUpId: string, options: CommandOptions = {}): Promise<Accepted<"followUp.cancel">> {
    return this.command("followUp.cancel", undefined, { followUpId }, options);
  }

  /**
   * `settings.update`: one JSON merge patch (`null` deletes a key) of the
   * user's settings or of a project's (`{scope: "project", projectPath}`);
   * the receipt is the scope's revision after it.
   */
  settingsUpdate(payload: SettingsUpdatePayload, options: CommandOptions = {}): Promise<Accepted<"settings.update">> {
    return this.command("settings.update", undefined, payload, options);
  }

  /**
   * `resource.apply`: the server resolves the controller (discovered in
   * `projectPath`'s `.pi/controllers/`, then `~/.pi/agent/controllers/`) in
   * a controller child and stores the spec; the receipt is the resource
   * version (unchanged when the spec is the same).
   */
  resourceApply(payload: ResourceApplyPayload, options: CommandOptions = {}): Promise<Accepted<"resource.apply">> {
    return this.command("resource.apply", undefined, payload, options);
  }

  /** `resource.reconcile`: queue the resource for a reconcile now. */
  resourceReconcile(controller: string, key: string, options: CommandOptions = {}): Promise<Accepted<"resource.reconcile">> {
    return this.command("resource.reconcile", undefined, { controller, key }, options);
  }

  /** `resource.delete`: mark the resource for deletion (gone once its controller settles it with no finalizer). */
  resourceDelete(controller: string, key: string, options: CommandOptions = {}): Promise<Accepted<"resource.delete">> {
    return this.command("resource.delete", undefined, { controller, key }, options);
  }

  /** `checkpoint.answer`: the answer becomes the input of the one continuation run. */
  checkpointAnswer(runId: string, answer: JsonValue, options: CommandOptions = {}): Promise<Accepted<"checkpoint.answer">> {
    return this.command("checkpoint.answer", runId, { answer }, options);
  }

  /**
   * `decision.answer`: a person's answer to a protected human decision (the
   * request digest they saw, a typed choice, its text, and where they
   * answered); the one continuation's id is in the receipt.
   */
  decisionAnswer(runId: string, payload: DecisionAnswerPayload, options: CommandOptions = {}): Promise<Accepted<"decision.answer">> {
    return this.command("decision.answer", runId, payload, options);
  }

  /**
   * `effect.recover`: an operator's review of an ambiguous managed effect.
   * `confirm` records that it applied; `retry` reserves its next attempt and
   * the receipt's `warning` says a duplicate is possible.
   */
  effectRecover(runId: string, payload: EffectRecoverPayload, options: CommandOptions = {}): Promise<Accepted<"effect.recover">> {
    return this.command("effect.recover", runId, payload, options);
  }

  /**
   * `interaction.submit`: resolves only when the submission's durable
   * validation outcome is settled (`receipt.outcome` is `accepted` or
   * `rejected`). There is no client-side timeout; a reconnect retries with
   * the same identity and waits for the same outcome.
   */
  interactionSubmit(runId: string, payload: InteractionSubmitPayload, options: CommandOptions = {}): Promise<Accepted<"interaction.submit">> {
    return this.command("interaction.submit", runId, payload, options);
  }

  /**
   * `interaction.update`: stores a non-completing update of a pending
   * interaction (the key is usually derived from the Pi tool-call id).
   */
  interactionUpdate(runId: string, payload: InteractionUpdatePayload, options: CommandOptions = {}): Promise<Accepted<"interaction.update">> {
    return this.command("interaction.update", runId, payload, options);
  }

  /** `workflows.list`: one page of the workflows `run.start` can start in a project. */
  async workflowsList(payload: RequestPayloadByOperation["workflows.list"], options: RequestOptions = {}): Promise<ResponseReceiptByOperation["workflows.list"]> {
    return (await this.read("workflows.list", undefined, payload, options)).receipt;
  }

  /**
   * `sessionView.get`: the origin-session view from one consistent read (the
   * active or retained run view, the message window and its count). Resolves
   * with the generation of the connection that answered, which is what a
   * coordinator epoch in the view belongs to.
   */
  async sessionView(payload: RequestPayloadByOperation["sessionView.get"], options: RequestOptions = {}): Promise<{ view: SessionView; connectionGeneration: number }> {
    const answered = await this.read("sessionView.get", undefined, payload, options);
    return { view: answered.receipt, connectionGeneration: answered.connectionGeneration };
  }

  /** `sessionView.clearTerminal`: hides the retained terminal run of a session (changes no workflow state). */
  sessionViewClearTerminal(sessionId: string, options: CommandOptions = {}): Promise<Accepted<"sessionView.clearTerminal">> {
    return this.command("sessionView.clearTerminal", undefined, { sessionId }, options);
  }

  /** `workflowMessage.reportBranch`, settled whatever the outcome (a fenced epoch is an answer, not an exception). */
  reportBranch(payload: ReportBranchPayload, options: RequestOptions = {}): Promise<Settled<"workflowMessage.reportBranch">> {
    return this.request("workflowMessage.reportBranch", { payload, idempotent: false, ...signalOf(options) });
  }

  /**
   * `sessionEvents.record`, settled whatever the outcome: a batch of a run's
   * captured Pi events under their run-wide numbers (the numbers are the
   * batch's identity; a repeat is adopted, so a retry resends it unchanged).
   */
  recordSessionEvents(payload: SessionEventsRecordPayload, options: RequestOptions = {}): Promise<Settled<"sessionEvents.record">> {
    return this.request("sessionEvents.record", { payload, idempotent: false, ...signalOf(options) });
  }

  /** `workflowTurn.report`, settled whatever the outcome. */
  reportTurn(payload: TurnReportPayload, options: RequestOptions = {}): Promise<Settled<"workflowTurn.report">> {
    return this.request("workflowTurn.report", { payload, idempotent: false, ...signalOf(options) });
  }

  /**
   * The generation of the open connection: 1 for the first connection this
   * client adopted, one more for each later one; `undefined` while no
   * connection is open. A value that changed means a new server connection
   * (for example after a reconnect), so anything granted per connection (a
   * coordinator epoch) must be asked for again.
   */
  get connectionGeneration(): number | undefined {
    const connection = this.connection;
    if (connection === null || connection.isClosed) return undefined;
    return this.generationOf.get(connection);
  }

  /** Calls `listener` with the generation of every connection adopted from now on. Returns the function that removes it. */
  onConnection(listener: (generation: number) => void): () => void {
    this.connectionListeners.add(listener);
    return () => this.connectionListeners.delete(listener);
  }

  /** `server.status`: counts and the epoch (no ids, paths or payloads). */
  async serverStatus(options: RequestOptions = {}): Promise<ServerStatus> {
    return (await this.read("server.status", undefined, {}, options)).receipt;
  }

  /** `run.view`: the live run view. A missing run is a `notFound` error. */
  async runView(runId: string, options: RequestOptions = {}): Promise<RunView> {
    return (await this.read("run.view", runId, {}, options)).receipt;
  }

  /** `settings.get`: the user's settings, and the project's of `projectPath` when given. */
  async settingsGet(projectPath?: string, options: RequestOptions = {}): Promise<SettingsView> {
    return (await this.read("settings.get", undefined, projectPath !== undefined ? { projectPath } : {}, options)).receipt;
  }

  /** `resource.get`: one resource with its queue, effects, child workflows and recent events. */
  async resourceGet(controller: string, key: string, options: RequestOptions = {}): Promise<ResourceView> {
    return (await this.read("resource.get", undefined, { controller, key }, options)).receipt;
  }

  /** `resource.list`: resources (of one controller when given), by controller and key. */
  async resourceList(controller?: string, options: RequestOptions = {}): Promise<ResourceListView> {
    return (await this.read("resource.list", undefined, controller !== undefined ? { controller } : {}, options)).receipt;
  }

  /**
   * `server.stop`: the server stores in-flight receipts, parks its runs and
   * exits. Never starts a server, and is not retried after a disconnect.
   */
  async serverStop(options: RequestOptions = {}): Promise<ServerStopReceipt> {
    const settled = await this.request("server.stop", { payload: {}, idempotent: false, signal: options.signal });
    return accepted(settled).receipt;
  }

  /**
   * The complete run view at one revision: `run.view`, then every
   * `view.page` of its steps and updates at that revision, so that
   * `steps.items` and `updates.items` hold all `total` items and carry no
   * `nextCursor` (the server's view bounds both pages by items and bytes).
   * Read again when the run moved on between pages, at most
   * `COMPLETE_VIEW_ATTEMPTS` times, then one `unavailable` error.
   */
  async completeRunView(runId: string, options: RequestOptions = {}): Promise<RunView> {
    for (let attempt = 0; attempt < COMPLETE_VIEW_ATTEMPTS; attempt++) {
      const view = await this.runView(runId, options);
      if ((await this.fillPage(view, "steps", options)) && (await this.fillPage(view, "updates", options))) return view;
    }
    throw new WorkflowClientError("unavailable", `run ${runId} kept changing while its view was read; read it again`, { operation: "run.view" });
  }

  /** Appends every further page of `collection` to the view's inline page; false when the run moved on. */
  private async fillPage(view: RunView, collection: "steps" | "updates", options: RequestOptions): Promise<boolean> {
    const page = view[collection];
    if (page.nextCursor !== undefined) {
      const spec: PagesSpec = { collection, revision: view.revision, limit: 1000, maxBytes: MAX_PAGE_BYTES, cursor: page.nextCursor };
      for await (const next of this.pages(view.runId, spec, options)) {
        if (next.revision !== view.revision) return false;
        (page.items as unknown[]).push(...next.items);
      }
    }
    if (page.items.length !== page.total) return false;
    delete page.nextCursor;
    return true;
  }

  /** `view.page`: one page of a run-view collection at a revision. */
  async page(runId: string, payload: ViewPagePayload, options: RequestOptions = {}): Promise<ViewPage> {
    return (await this.read("view.page", runId, payload, options)).receipt;
  }

  /** Every page of a collection at one revision, following `nextCursor`. */
  async *pages(runId: string, spec: PagesSpec, options: RequestOptions = {}): AsyncGenerator<ViewPage> {
    let cursor = spec.cursor;
    for (;;) {
      const payload: ViewPagePayload = { collection: spec.collection, revision: spec.revision, limit: spec.limit, maxBytes: spec.maxBytes };
      if (cursor !== undefined) payload.cursor = cursor;
      const page = await this.page(runId, payload, options);
      yield page;
      if (page.nextCursor === undefined) return;
      cursor = page.nextCursor;
    }
  }

  /**
   * Reads referenced content with `view.content` in chunks of at most
   * 512 KiB and returns the assembled bytes after verifying them against the
   * reference digest and every chunk's digest (`digestMismatch` otherwise).
   * `runId` names the run the content belongs to.
   */
  async readContent(reference: ContentReference, options: RequestOptions & { runId?: string } = {}): Promise<Uint8Array> {
    const assembler = new ContentAssembler(reference);
    for (let next = assembler.nextRequest(); next !== null; next = assembler.nextRequest()) {
      const chunk = (await this.read("view.content", options.runId, next, options)).receipt;
      assembler.accept(chunk);
    }
    return assembler.finish();
  }

  /** `readContent` decoded as UTF-8 JSON (for `application/json` references). */
  async readJsonContent(reference: ContentReference, options: RequestOptions & { runId?: string } = {}): Promise<JsonValue> {
    const bytes = await this.readContent(reference, options);
    try {
      return JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes)) as JsonValue;
    } catch {
      throw new WorkflowClientError("contentUnavailable", "verified referenced content is not UTF-8 JSON");
    }
  }

  /**
   * `subscribe`: returns an open subscription (an async iterable of events).
   * The subscription follows reconnects, re-subscribing from its last
   * accepted revision. Close it with `close()` or `unsubscribe()`, or by
   * leaving a `for await` loop.
   */
  async subscribe(target: SubscriptionTarget, options: SubscribeOptions = {}): Promise<Subscription> {
    if (this.isClosed) throw CLOSED();
    const subscription = new Subscription(this, target, options.fromRevision, this.maxQueuedEvents);
    this.subscriptions.add(subscription);
    // Bound by this call, not by the reconnect logic.
    this.beginBinding(subscription);
    this.updateRef();
    try {
      for (let attempt = 1; ; attempt++) {
        if (options.signal?.aborted === true) throw CANCELLED("subscribe");
        const connection = await this.connected(options.signal);
        const bound = await this.bind(subscription, connection, options.signal);
        if (bound.kind === "response") {
          if (bound.response.outcome !== "accepted" && bound.response.outcome !== "adopted") {
            throw WorkflowClientError.fromResponse("subscribe", bound.response.outcome, bound.response.error);
          }
          return subscription;
        }
        if (attempt >= this.maxAttempts) throw CONNECTION_LOST({ operation: "subscribe" });
      }
    } catch (error) {
      this.subscriptions.delete(subscription);
      subscription.finish();
      this.updateRef();
      throw error;
    } finally {
      this.endBinding(subscription);
    }
  }

  /** `unsubscribe`: ends the subscription locally at once and removes it on the server when connected. */
  unsubscribe(subscription: Subscription): Promise<void> {
    return this.closeSubscription(subscription);
  }

  /**
   * Any operation, typed by the generated operation → payload/receipt maps.
   * Resolves with the response whatever its outcome; throws a
   * `WorkflowClientError` only when no response could be obtained
   * (unavailable server, version mismatch, invalid request, cancelled).
   */
  async request<Op extends Operation>(operation: Op, spec: RequestSpec<Op>): Promise<Settled<Op>> {
    if (this.isClosed) throw CLOSED();
    const idempotencyKey = keyFor(operation, spec.idempotent);
    const retryable = operation !== "server.stop";
    this.foreground++;
    this.updateRef();
    try {
      for (let attempt = 1; ; attempt++) {
        if (spec.signal?.aborted === true) throw CANCELLED(operation);
        const connection = await this.connected(spec.signal, operation !== "server.stop");
        const requestId = this.nextRequestId();
        const message: Request = {
          schema: "pi-workflows.client.v1",
          type: "request",
          requestId,
          clientId: this.clientId,
          operation,
          payload: spec.payload as Request["payload"],
        };
        if (spec.runId !== undefined) message.runId = spec.runId;
        if (idempotencyKey !== undefined) message.idempotencyKey = idempotencyKey;
        if (spec.expectedRevision !== undefined) message.expectedRevision = spec.expectedRevision;
        const bytes = encodeRequest(message);
        const exchanged = await this.exchange(connection, requestId, bytes, spec.signal);
        if (exchanged.kind === "response") {
          return settledOf(operation, exchanged.response, idempotencyKey, this.generationOf.get(connection) ?? 0);
        }
        if (!retryable || attempt >= this.maxAttempts) {
          throw idempotencyKey === undefined ? CONNECTION_LOST({ operation }) : CONNECTION_LOST({ operation, idempotencyKey });
        }
      }
    } finally {
      this.foreground--;
      this.updateRef();
    }
  }

  /**
   * Connects now (starting the server if needed, unless `start: false`);
   * resolves with the server's epoch and version and the connection's
   * generation.
   */
  async connect(options: ConnectOptions = {}): Promise<{ serverEpoch: number | undefined; serverVersion: string; connectionGeneration: number }> {
    this.foreground++;
    this.updateRef();
    try {
      const connection = await this.connected(options.signal, options.start ?? true);
      return { serverEpoch: connection.serverEpoch, serverVersion: connection.serverVersion, connectionGeneration: this.generationOf.get(connection) ?? 0 };
    } finally {
      this.foreground--;
      this.updateRef();
    }
  }

  /** Closes the connection and every subscription; later calls fail. */
  close(): void {
    if (this.isClosed) return;
    this.isClosed = true;
    if (this.reconnectTimer !== null) clearTimeout(this.reconnectTimer);
    this.reconnectTimer = null;
    for (const subscription of this.subscriptions) subscription.finish();
    this.subscriptions.clear();
    this.bySubscriptionId.clear();
    this.connection?.close();
    this.connection = null;
  }

  // ---- SubscriptionHost ------------------------------------------------------

  /** @internal Re-subscribes after a revision gap or a queue overflow. */
  resync(subscription: Subscription): void {
    if (subscription.closed) return;
    // Unbound with a subscribe in flight: that subscribe brings a fresh id.
    if (subscription.id === undefined && this.binding.has(subscription)) return;
    const oldId = subscription.id;
    if (oldId !== undefined) this.bySubscriptionId.delete(oldId);
    subscription.id = undefined;
    const connection = this.connection;
    if (connection === null || connection.isClosed) return; // the reconnect re-subscribes it
    this.beginBinding(subscription);
    void (async () => {
      try {
        if (oldId !== undefined) await this.sendUnsubscribe(connection, oldId);
        const bound = await this.bind(subscription, connection);
        if (bound.kind === "response" && bound.response.outcome !== "accepted" && bound.response.outcome !== "adopted") {
          this.dropSubscription(subscription, WorkflowClientError.fromResponse("subscribe", bound.response.outcome, bound.response.error));
        }
      } catch (error) {
        if (error instanceof WorkflowClientError && error.code !== "unavailable") this.dropSubscription(subscription, error);
      } finally {
        this.endBinding(subscription);
      }
    })();
  }

  /** @internal */
  async closeSubscription(subscription: Subscription): Promise<void> {
    const id = subscription.id;
    const wasOpen = this.subscriptions.delete(subscription);
    if (id !== undefined) this.bySubscriptionId.delete(id);
    subscription.finish();
    this.updateRef();
    const connection = this.connection;
    if (!wasOpen || id === undefined || connection === null || connection.isClosed) return;
    this.foreground++;
    this.updateRef();
    try {
      const response = await this.sendUnsubscribe(connection, id);
      if (response !== null && response.outcome !== "accepted" && response.outcome !== "adopted" && response.outcome !== "notFound") {
        throw WorkflowClientError.fromResponse("unsubscribe", response.outcome, response.error);
      }
    } finally {
      this.foreground--;
      this.updateRef();
    }
  }

  // ---- internals ---------------------------------------------------------------

  private async command<Op extends Operation>(operation: Op, runId: string | undefined, payload: RequestPayloadByOperation[Op], options: CommandOptions): Promise<Accepted<Op>> {
    const spec: RequestSpec<Op> = { payload, idempotent: options.idempotencyKey ?? true };
    if (runId !== undefined) spec.runId = runId;
    if (options.expectedRevision !== undefined) spec.expectedRevision = options.expectedRevision;
    if (options.signal !== undefined) spec.signal = options.signal;
    return accepted(await this.request(operation, spec));
  }

  private async read<Op extends Operation>(operation: Op, runId: string | undefined, payload: RequestPayloadByOperation[Op], options: RequestOptions): Promise<Accepted<Op>> {
    const spec: RequestSpec<Op> = { payload, idempotent: false };
    if (runId !== undefined) spec.runId = runId;
    if (options.signal !== undefined) spec.signal = options.signal;
    return accepted(await this.request(operation, spec));
  }

  /**
   * A new transport-attempt id: the client id (for diagnostics), a random
   * per-instance nonce (request ids are unique server-wide, and two
   * processes may share a pinned client id) and a counter.
   */
  private nextRequestId(): string {
    this.requestCounter++;
    return `${this.clientId.slice(0, 80)}.${this.requestNonce}.${this.requestCounter}`;
  }

  /** Sends one request frame on `connection` and waits for its response or the end of the connection. */
  private exchange(connection: Connection, requestId: string, bytes: Uint8Array, signal?: AbortSignal, onResponse?: PendingRequest["onResponse"]): Promise<Exchange> {
    return new Promise<Exchange>((resolve, reject) => {
      let done = false;
      let removeClose = (): void => undefined;
      const finish = (): void => {
        done = true;
        this.pending.delete(requestId);
        signal?.removeEventListener("abort", onAbort);
        removeClose();
      };
      const onAbort = (): void => {
        if (done) return;
        finish();
        reject(CANCELLED());
      };
      const entry: PendingRequest = {
        connection,
        settle: (response) => {
          if (done) return;
          finish();
          resolve({ kind: "response", response });
        },
      };
      if (onResponse !== undefined) entry.onResponse = onResponse;
      this.pending.set(requestId, entry);
      signal?.addEventListener("abort", onAbort, { once: true });
      removeClose = connection.onClose((end) => {
        if (done) return;
        finish();
        if (end.retryable) resolve({ kind: "lost", error: end.error });
        else reject(end.error);
      });
      connection.write(bytes, signal).catch((error: unknown) => {
        if (done) return;
        // A closed connection is reported by `closed` above; only a cancelled wait ends here.
        if (error instanceof WorkflowClientError && error.code === "cancelled") {
          finish();
          reject(error);
        }
      });
    });
  }

  /** The open connection, connecting (and, when allowed, starting the server) first. */
  private async connected(signal?: AbortSignal, mayStart = true): Promise<Connection> {
    for (;;) {
      if (this.isClosed) throw CLOSED();
      if (this.connection !== null && !this.connection.isClosed) return this.connection;
      if (this.connecting === null) {
        const connecting = this.coldConnect(mayStart && this.autoStart);
        this.connecting = connecting;
        this.connectingMayStart = mayStart && this.autoStart;
        void connecting.then(
          () => {
            if (this.connecting === connecting) this.connecting = null;
          },
          () => {
            if (this.connecting === connecting) this.connecting = null;
          },
        );
        return abortable(connecting, signal);
      }
      const startsServer = this.connectingMayStart;
      try {
        return await abortable(this.connecting, signal);
      } catch (error) {
        // A background attempt (which never starts a server) may have failed where this one would.
        if (error instanceof WorkflowClientError && error.code === "unavailable" && !startsServer && mayStart && this.autoStart) continue;
        throw error;
      }
    }
  }

  /**
   * Connects; when nothing listens and `start` is true, runs `server start`
   * once and retries on a referenced timer until ready or the deadline.
   */
  private async coldConnect(start: boolean, foreground = true): Promise<Connection> {
    const deadline = Date.now() + this.startDeadlineMs;
    let starting: StartingServer | null = null;
    let startFailure: WorkflowClientError | null = null;
    for (;;) {
      try {
        const connection = await Connection.open({
          socketPath: this.socketPath,
          clientId: this.clientId,
          packageVersion: this.packageVersion,
          helloTimeoutMs: this.helloTimeoutMs,
          // A background attempt never keeps the process alive.
          ref: foreground,
          onMessage: (from, message) => this.dispatch(from, message),
        });
        this.adopt(connection);
        return connection;
      } catch (error) {
        if (!(error instanceof ConnectFailure)) throw error;
        if (!error.absent) throw error.error;
      }
      if (this.isClosed) throw CLOSED();
      if (!start) throw NOT_RUNNING();
      if (startFailure !== null) throw startFailure;
      if (starting === null) {
        const current = startServer(this.bin, this.env);
        starting = current;
        void current.done.then((result) => {
          if (result.ok || result.alreadyRunning) return; // keep retrying until ready or the deadline
          startFailure = new WorkflowClientError(
            "unavailable",
            result.spawnFailed
              ? "cannot run `pi-workflows server start`: install pi-workflows or set PI_WORKFLOWS_BIN"
              : `\`pi-workflows server start\` failed: ${result.message ?? "see host/server.log under PI_WORKFLOWS_HOME"}`,
          );
        });
      }
      if (Date.now() >= deadline) {
        starting.unref();
        throw new WorkflowClientError(
          "unavailable",
          `the pi-workflows server did not become ready within ${Math.max(1, Math.ceil(this.startDeadlineMs / 1000))} s; check \`pi-workflows server status\` and host/server.log under PI_WORKFLOWS_HOME`,
        );
      }
      if (this.foreground === 0 && this.subscriptions.size === 0) {
        starting.unref();
        throw CANCELLED();
      }
      // A REFERENCED timer: a foreground caller waits for the server, so the process must not exit.
      await sleep(Math.min(this.retryIntervalMs, Math.max(1, deadline - Date.now())), true);
    }
  }

  /** Makes `connection` the current one and restores subscriptions on it. */
  private adopt(connection: Connection): void {
    this.connection = connection;
    this.generations++;
    this.generationOf.set(connection, this.generations);
    this.reconnectDelayMs = this.retryIntervalMs;
    if (this.reconnectTimer !== null) {
      clearTimeout(this.reconnectTimer);
      this.reconnectTimer = null;
    }
    this.updateRef();
    void connection.closed.then((end) => this.lost(connection, end.retryable ? null : end.error));
    for (const subscription of this.subscriptions) {
      if (subscription.id === undefined && !this.binding.has(subscription) && !subscription.closed) {
        this.rebind(subscription, connection);
      }
    }
    const generation = this.generations;
    for (const listener of [...this.connectionListeners]) {
      try {
        listener(generation);
      } catch {
        // A listener's failure is its own; the connection is adopted either way.
      }
    }
  }

  /** Re-subscribes one subscription on a new connection. */
  private rebind(subscription: Subscription, connection: Connection): void {
    this.beginBinding(subscription);
    void (async () => {
      try {
        const bound = await this.bind(subscription, connection);
        if (bound.kind !== "response") return; // lost again: the next connection retries
        if (bound.response.outcome !== "accepted" && bound.response.outcome !== "adopted") this.dropSubscription(subscription, WorkflowClientError.fromResponse("subscribe", bound.response.outcome, bound.response.error));
      } catch (error) {
        this.dropSubscription(subscription, error instanceof WorkflowClientError ? error : CONNECTION_LOST());
      } finally {
        this.endBinding(subscription);
      }
      // A newer connection may have been adopted while this attempt was in flight.
      const current = this.connection;
      if (subscription.id === undefined && !subscription.closed && current !== null && current !== connection && !current.isClosed) {
        this.rebind(subscription, current);
      }
    })();
  }

  private beginBinding(subscription: Subscription): void {
    this.binding.set(subscription, (this.binding.get(subscription) ?? 0) + 1);
  }

  private endBinding(subscription: Subscription): void {
    const count = (this.binding.get(subscription) ?? 1) - 1;
    if (count > 0) this.binding.set(subscription, count);
    else this.binding.delete(subscription);
  }

  /** Sends `subscribe` for `subscription` on `connection`; binds the new id as soon as the response arrives. */
  private bind(subscription: Subscription, connection: Connection, signal?: AbortSignal): Promise<Exchange> {
    const requestId = this.nextRequestId();
    const payload: RequestPayloadByOperation["subscribe"] = { target: subscription.target };
    if (subscription.revision !== undefined) payload.fromRevision = subscription.revision;
    const bytes = encodeRequest({
      schema: "pi-workflows.client.v1",
      type: "request",
      requestId,
      clientId: this.clientId,
      operation: "subscribe",
      payload: payload as unknown as Request["payload"],
    });
    return this.exchange(connection, requestId, bytes, signal, (response) => {
      const receipt = response.receipt as ResponseReceiptByOperation["subscribe"] | undefined;
      if ((response.outcome === "accepted" || response.outcome === "adopted") && receipt !== undefined && !subscription.closed) {
        subscription.id = receipt.subscriptionId;
        this.bySubscriptionId.set(receipt.subscriptionId, subscription);
        // Before any event of the new subscription is handled.
        subscription.recovered();
      }
    });
  }

  private async sendUnsubscribe(connection: Connection, subscriptionId: string): Promise<Response | null> {
    const requestId = this.nextRequestId();
    const bytes = encodeRequest({
      schema: "pi-workflows.client.v1",
      type: "request",
      requestId,
      clientId: this.clientId,
      operation: "unsubscribe",
      payload: { subscriptionId },
    });
    const exchanged = await this.exchange(connection, requestId, bytes);
    // A lost connection removed the server subscription with it.
    return exchanged.kind === "response" ? exchanged.response : null;
  }

  private dropSubscription(subscription: Subscription, error: WorkflowClientError): void {
    this.subscriptions.delete(subscription);
    if (subscription.id !== undefined) this.bySubscriptionId.delete(subscription.id);
    subscription.fail(error);
    this.updateRef();
  }

  /** Routes one frame received after the hello. */
  private dispatch(connection: Connection, message: ClientMessage): void {
    if (message.type === "response") {
      const entry = this.pending.get(message.requestId);
      if (entry === undefined || entry.connection !== connection) return; // a late answer to an abandoned attempt
      entry.onResponse?.(message, connection);
      entry.settle(message);
      return;
    }
    if (message.type === "event") {
      this.bySubscriptionId.get(message.subscriptionId)?.receive(message);
    }
  }

  /** The current connection ended. */
  private lost(connection: Connection, fatal: WorkflowClientError | null): void {
    if (this.connection === connection) this.connection = null;
    for (const subscription of this.subscriptions) {
      if (subscription.id !== undefined && this.bySubscriptionId.get(subscription.id) === subscription) {
        this.bySubscriptionId.delete(subscription.id);
      }
      if (fatal !== null) this.dropSubscription(subscription, fatal);
      else subscription.connectionLost();
    }
    if (fatal === null) this.scheduleReconnect();
  }

  /** Background reconnect for open subscriptions: unreferenced timers, no server start. */
  private scheduleReconnect(): void {
    if (this.isClosed || this.reconnectTimer !== null || this.subscriptions.size === 0) return;
    const delay = this.reconnectDelayMs;
    this.reconnectDelayMs = Math.min(this.maxReconnectDelayMs, this.reconnectDelayMs * 2);
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = null;
      if (this.isClosed || this.subscriptions.size === 0) return;
      if ((this.connection !== null && !this.connection.isClosed) || this.connecting !== null) {
        // A foreground request is connecting; it restores the subscriptions.
        if (this.connecting !== null) void this.connecting.catch(() => this.scheduleReconnect());
        return;
      }
      const connecting = this.coldConnect(false, false);
      this.connecting = connecting;
      this.connectingMayStart = false;
      connecting.then(
        () => {
          if (this.connecting === connecting) this.connecting = null;
        },
        () => {
          if (this.connecting === connecting) this.connecting = null;
          this.scheduleReconnect();
        },
      );
    }, delay);
    this.reconnectTimer.unref();
  }

  /** The socket keeps the process alive only while a request waits or a subscription is open. */
  private updateRef(): void {
    this.connection?.setRef(this.foreground > 0 || this.subscriptions.size > 0);
  }
}

let shared: WorkflowClient | null = null;

/**
 * The process-wide client (one persistent connection per process), created
 * on first use with `options`; later calls return the same instance.
 */
export function sharedWorkflowClient(options?: WorkflowClientOptions): WorkflowClient {
  if (shared === null) shared = new WorkflowClient(options);
  return shared;
}

/** Throws unless the command was accepted or adopted with a receipt. */
export function accepted<Op extends Operation>(settled: Settled<Op>): Accepted<Op> {
  if ((settled.outcome === "accepted" || settled.outcome === "adopted") && settled.receipt !== undefined) {
    const result: Accepted<Op> = {
      operation: settled.operation,
      outcome: settled.outcome,
      requestId: settled.requestId,
      receipt: settled.receipt,
      connectionGeneration: settled.connectionGeneration,
    };
    if (settled.idempotencyKey !== undefined) result.idempotencyKey = settled.idempotencyKey;
    if (settled.revision !== undefined) result.revision = settled.revision;
    return result;
  }
  if (settled.outcome === "accepted" || settled.outcome === "adopted") {
    throw new WorkflowClientError("internal", `the server accepted ${settled.operation} without a receipt; install matching pi-workflows packages`, { outcome: settled.outcome, operation: settled.operation });
  }
  throw WorkflowClientError.fromResponse(settled.operation, settled.outcome, settled.error);
}

function settledOf<Op extends Operation>(operation: Op, response: Response, idempotencyKey: string | undefined, connectionGeneration: number): Settled<Op> {
  const settled: Settled<Op> = { operation, outcome: response.outcome, requestId: response.requestId, connectionGeneration };
  if (idempotencyKey !== undefined) settled.idempotencyKey = idempotencyKey;
  if (response.revision !== undefined) settled.revision = response.revision;
  if (response.receipt !== undefined) settled.receipt = response.receipt as unknown as ResponseReceiptByOperation[Op];
  if (response.error !== undefined) settled.error = { code: response.error.code, message: response.error.message };
  return settled;
}

function signalOf(options: RequestOptions): { signal?: AbortSignal } {
  return options.signal === undefined ? {} : { signal: options.signal };
}

function keyFor(operation: Operation, idempotent: boolean | string | undefined): string | undefined {
  if (typeof idempotent === "string") return idempotent;
  const wanted = idempotent ?? STATE_CHANGING_OPERATIONS.has(operation);
  return wanted ? `k-${randomUUID()}` : undefined;
}

function encodeRequest(message: Request): Uint8Array {
  try {
    return encodeClient(message);
  } catch (error) {
    if (error instanceof SafeError && error.code === "frameTooLarge") {
      throw new WorkflowClientError("frameTooLarge", "the request is larger than one 1 MiB frame", { operation: message.operation });
    }
    throw new WorkflowClientError("schemaInvalid", "the request does not match the client.v1 schema (check the operation's payload, ids and paths)", { operation: message.operation });
  }
}

function abortable<T>(promise: Promise<T>, signal?: AbortSignal): Promise<T> {
  if (signal === undefined) return promise;
  if (signal.aborted) return Promise.reject(CANCELLED());
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(CANCELLED());
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(error instanceof Error ? error : new Error(String(error)));
      },
    );
  });
}

function sleep(ms: number, ref: boolean): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    if (!ref) timer.unref();
  });
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value === "" ? undefined : value;
}
