/**
 * Fakes for the extension's unit tests: a Pi session (`FakePi`) and a small
 * model of the server half (`FakeServer`) with the coordinator rules of the
 * workflow-server spec (one active epoch per session, branch report before
 * anything, next eligible message only for the active epoch). Every server
 * call is logged in order, so tests assert orderings.
 */
import { createHash } from "node:crypto";

import type { Accepted, Settled } from "../src/client/client.js";
import { WorkflowClientError } from "../src/client/errors.js";
import type { SubscriptionEvent } from "../src/client/subscription.js";
import type { BranchEntryLike, Delivery } from "../src/extension/messages.js";
import type { PiPort, ServerPort, SubscriptionLike, UiPort } from "../src/extension/ports.js";
import type {
  ContentReference,
  GraphNode,
  DecisionAnswerPayload,
  EffectRecoverPayload,
  InteractionSubmitPayload,
  InteractionUpdatePayload,
  Operation,
  ResponseReceiptByOperation,
  RunStartPayload,
  RunView,
  SessionEvent,
  SessionEventsRecordPayload,
  SessionView,
  StepRecord,
  TurnOwnership,
  UpdateRecord,
  ViewPage,
  ViewPagePayload,
  WorkflowMessage,
} from "../src/generated/types.js";


const reference = (text: string): ContentReference => ({
  bytes: Buffer.byteLength(text),
  digest: `sha256:${createHash("sha256").update(text).digest("hex")}`,
  mediaType: "text/plain",
});

/** A run view with sensible defaults. */
export function runView(overrides: Partial<RunView> & { display?: Partial<RunView["display"]> } = {}): RunView {
  const { display, ...rest } = overrides;
  return {
    schema: "pi-workflows.run-view.v1",
    runId: "run-1",
    revision: 1,
    workflowName: "review",
    status: { run: "waiting", queue: "parked", paused: false, executionMode: "interactive" },
    display: { status: "waiting", activity: "none", controls: ["pause", "cancel"], ...display },
    createdAtMs: 1_000,
    updatedAtMs: 1_000,
    nodes: [],
    edges: [],
    steps: { items: [], total: 0 },
    updates: { items: [], total: 0 },
    definition: reference("definition"),
    graphHistory: reference("history"),
    ...rest,
  };
}

export function node(id: string, nodeType: GraphNode["nodeType"], state: GraphNode["state"], visits = state === "pending" ? 0 : 1): GraphNode {
  return { id, nodeType, state, visits };
}

export function step(seq: number, nodeId: string, startedAtMs: number, options: { finishedAtMs?: number; outcome?: StepRecord["outcome"]; attemptId?: string } = {}): StepRecord {
  const attempt = { attemptId: options.attemptId ?? `att-${seq}`, attemptNumber: 1, startedAtMs, ...(options.finishedAtMs !== undefined ? { finishedAtMs: options.finishedAtMs } : {}), ...(options.outcome !== undefined ? { outcome: options.outcome } : {}) };
  return { seq, nodeId, visit: 1, startedAtMs, attempts: [attempt], ...(options.finishedAtMs !== undefined ? { finishedAtMs: options.finishedAtMs } : {}), ...(options.outcome !== undefined ? { outcome: options.outcome } : {}) };
}

export function update(seq: number, type: string, key: string, data: unknown): UpdateRecord {
  return { updateId: `upd-${seq}`, attemptId: "att-1", seq, type, key, data: data as UpdateRecord["data"] };
}

/** A Pi session: idle or busy, a branch, and every send recorded with the checks made in the same synchronous block. */
export class FakePi implements PiPort {
  idle = true;
  pending = false;
  branch: BranchEntryLike[] = [];
  readonly sent: Delivery[] = [];
  /** For each send: the checks (isIdle, hasPendingMessages, getBranch) made in the same synchronous block before it. */
  readonly checksAtSend: string[][] = [];
  aborts = 0;
  /** Called inside sendMessage (e.g. to emit agent_start synchronously). */
  onSend: ((delivery: Delivery) => void) | undefined;
  /** The entry a send appends (false: the send leaves no entry, as if Pi went away). */
  appendOnSend = true;
  private segment = new Set<string>();
  private entries = 0;

  private touch(check: string): void {
    if (this.segment.size === 0) queueMicrotask(() => this.segment.clear());
    this.segment.add(check);
  }

  isIdle(): boolean {
    this.touch("isIdle");
    return this.idle;
  }

  hasPendingMessages(): boolean {
    this.touch("hasPendingMessages");
    return this.pending;
  }

  getBranch(): readonly BranchEntryLike[] {
    this.touch("getBranch");
    return [...this.branch];
  }

  sendMessage(delivery: Delivery): void {
    this.checksAtSend.push([...this.segment].sort());
    this.sent.push(delivery);
    if (this.appendOnSend) this.append({ type: "custom_message", customType: delivery.message.customType, details: delivery.message.details });
    this.onSend?.(delivery);
  }

  abort(): void {
    this.aborts++;
  }

  /** Appends an entry with a fresh id; returns the id. */
  append(entry: Omit<BranchEntryLike, "id">): string {
    const id = `entry${++this.entries}`;
    this.branch.push({ ...entry, id });
    return id;
  }

  get leafId(): string | null {
    return this.branch.at(-1)?.id ?? null;
  }

  /** The message ids of the sends, in order. */
  sentIds(): string[] {
    return this.sent.map((delivery) => delivery.message.details.workflowMessageId);
  }
}

/** The UI: every call recorded. */
export class FakeUi implements UiPort {
  readonly notes: { message: string; level: string }[] = [];
  readonly widgets: (readonly string[] | undefined)[] = [];
  readonly statuses: (string | undefined)[] = [];
  constructor(readonly mode = "rpc") {}
  notify(message: string, level: "info" | "warning" | "error"): void {
    this.notes.push({ message, level });
  }
  setStatus(text: string | undefined): void {
    this.statuses.push(text);
  }
  setWidget(lines: readonly string[] | undefined): void {
    this.widgets.push(lines === undefined ? undefined : [...lines]);
  }
  get lastNote(): string | undefined {
    return this.notes.at(-1)?.message;
  }
}

interface ServerMessage extends WorkflowMessage {
  text: string;
  interactionId?: string;
  attemptId?: string;
  nodeId?: string;
}

/** A pending protected decision as a waiting run's view shows it. */
export const DECISION = {
  decisionId: `decision-${"a".repeat(40)}`,
  requestDigest: `sha256:${"b".repeat(64)}`,
  nodeId: "gate",
  title: "Publish the release?",
  summary: "The release notes are drafted.",
  choices: [
    { id: "ship", label: "Ship it" },
    { id: "revise", label: "Ask for changes", input: { kind: "text" as const, name: "change", prompt: "What should change?", minLength: 1, maxLength: 200 } },
  ],
};

/** An ambiguous run as the server shows it: its reason names the wire operation, its controls offer recoverEffect. */
export function ambiguousRun(effects: { effectId: string; effectType: string; nodeId: string; attemptNumber: number }[]) {
  return runView({
    nodes: [node("send", "action", "running")],
    display: {
      status: "ambiguous",
      activity: "none",
      controls: ["pause", "cancel", "recoverEffect"],
      reason: "An external effect may have applied without a receipt, so the run cannot continue on its own; check the external system, then effect.recover confirm (it applied) or retry (apply it again: a duplicate is possible).",
    },
    ambiguousEffects: effects,
  });
}

/** A small model of the server half for one origin session. */
export class FakeServer implements ServerPort {
  connectionGeneration: number | undefined = undefined;
  readonly log: string[] = [];
  readonly calls: { operation: string; runId?: string; payload: unknown; idempotencyKey?: string }[] = [];
  run: RunView | undefined;
  readonly messages: ServerMessage[] = [];
  /** Epochs granted per connection generation; the active one is the newest. */
  private readonly epochs = new Map<number, number>();
  private activeEpoch: number | undefined;
  private lastEpoch = 0;
  private branchReported = new Set<number>();
  private readonly listeners = new Set<(generation: number) => void>();
  private order = 0;
  /** When set, the server does not mark reported entries sent (a slow server). */
  holdSent = false;
  /** The ownership turn starts get. */
  turnOwnership: TurnOwnership = "active";
  /** Failing operations: operation → error. */
  readonly failing = new Map<string, WorkflowClientError>();
  /** The server is not reachable: connect fails. */
  down = false;
  /** Grants epochs (the coordinate addition). */
  grantsEpochs = true;
  readonly subscriptions: FakeSubscription[] = [];
  private runs = 0;

  constructor(readonly sessionId = "session-1") {}

  // ---- test controls ----

  addMessage(kind: WorkflowMessage["kind"], text: string, fields: Partial<ServerMessage> = {}): ServerMessage {
    const message: ServerMessage = {
      messageId: `msg-${++this.order}`,
      runId: this.run?.runId ?? "run-1",
      kind,
      state: "pending",
      order: this.order,
      content: reference(text),
      text,
      ...(kind === "step" ? { stepReason: "initial" as const } : {}),
      ...fields,
    };
    this.messages.push(message);
    this.changed();
    return message;
  }

  /** A new connection (a reconnect): the old epoch is fenced. */
  reconnect(): number {
    const generation = (this.connectionGeneration ?? 0) + 1;
    this.connectionGeneration = generation;
    for (const listener of [...this.listeners]) listener(generation);
    return generation;
  }

  /** A server restart: a new connection, and epochs numbered from 1 again (they are process-local). */
  restart(): number {
    this.epochs.clear();
    this.branchReported.clear();
    this.activeEpoch = undefined;
    this.lastEpoch = 0;
    return this.reconnect();
  }

  /** Disconnects without a new connection. */
  disconnect(): void {
    this.connectionGeneration = undefined;
  }

  /** Replaces the run with a new presentation revision (as the server does on every change). */
  setRun(run: RunView): void {
    this.run = { ...run, revision: (this.run?.revision ?? 0) + 1 };
    this.changed();
  }

  /** Reports on epochs below this are fenced (another process took the session), while views still grant them. */
  fenceEpochsBelow = 0;

  changed(): void {
    for (const subscription of this.subscriptions) subscription.push();
  }

  ops(operation: string): { operation: string; runId?: string; payload: unknown; idempotencyKey?: string }[] {
    return this.calls.filter((call) => call.operation === operation);
  }

  private fail(operation: string): void {
    const error = this.failing.get(operation);
    if (error !== undefined) throw error;
  }

  private record(operation: string, payload: unknown, runId?: string, idempotencyKey?: string): void {
    this.calls.push({ operation, payload, ...(runId !== undefined ? { runId } : {}), ...(idempotencyKey !== undefined ? { idempotencyKey } : {}) });
  }

  private accepted<Op extends Operation>(operation: Op, receipt: ResponseReceiptByOperation[Op]): Accepted<Op> {
    return { operation, outcome: "accepted", requestId: `r${this.calls.length}`, receipt, connectionGeneration: this.connectionGeneration ?? 0 };
  }

  private settled<Op extends Operation>(operation: Op, outcome: Settled<Op>["outcome"], receipt?: ResponseReceiptByOperation[Op], code?: string): Settled<Op> {
    const settled: Settled<Op> = { operation, outcome, requestId: `r${this.calls.length}`, connectionGeneration: this.connectionGeneration ?? 0 };
    if (receipt !== undefined) settled.receipt = receipt;
    if (code !== undefined) settled.error = { code: code as never, message: `${code} (fake)` };
    return settled;
  }

  private requireConnection(): number {
    if (this.connectionGeneration === undefined) throw new WorkflowClientError("unavailable", "the pi-workflows server is not running (fake)");
    return this.connectionGeneration;
  }

  // ---- ServerPort ----

  onConnection(listener: (generation: number) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async connect(options: { start?: boolean } = {}): Promise<{ connectionGeneration: number }> {
    this.log.push(`connect:${options.start === false ? "noStart" : "start"}`);
    if (this.down) throw new WorkflowClientError("unavailable", "the pi-workflows server is not running (fake)");
    if (this.connectionGeneration === undefined) this.reconnect();
    return { connectionGeneration: this.connectionGeneration as number };
  }

  async sessionView(payload: { sessionId: string }): Promise<{ view: SessionView; connectionGeneration: number }> {
    const generation = this.requireConnection();
    this.fail("sessionView.get");
    const coordinate = (payload as { coordinate?: boolean }).coordinate === true;
    if (coordinate && this.grantsEpochs && !this.epochs.has(generation)) {
      this.lastEpoch++;
      this.epochs.set(generation, this.lastEpoch);
      this.activeEpoch = this.lastEpoch;
      this.log.push(`epoch:${this.lastEpoch}`);
    }
    const epoch = this.epochs.get(generation);
    const active = epoch !== undefined && epoch === this.activeEpoch;
    this.log.push("sessionView");
    const view: SessionView & { coordinatorEpoch?: number } = {
      sessionId: this.sessionId,
      revision: this.calls.length,
      messages: this.messages.filter((message) => message.state === "pending" || message.state === "sent").map(wire),
      messageCount: this.messages.length,
    };
    if (this.run !== undefined) view.activeRun = structuredClone(this.run);
    if (active && epoch !== undefined) {
      view.coordinatorEpoch = epoch;
      const next = this.branchReported.has(epoch) ? this.messages.find((message) => message.state === "pending") : undefined;
      if (next !== undefined) view.nextEligibleMessageId = next.messageId;
    }
    return { view, connectionGeneration: generation };
  }

  async reportBranch(payload: { sessionId: string; coordinatorEpoch: number; entries: { messageId: string; entryId: string }[]; isIdle: boolean; hasPendingMessages: boolean }): Promise<Settled<"workflowMessage.reportBranch">> {
    this.requireConnection();
    this.record("workflowMessage.reportBranch", payload);
    this.log.push(`reportBranch:e${payload.coordinatorEpoch}:[${payload.entries.map((entry) => `${entry.messageId}=${entry.entryId}`).join(",")}]`);
    if (payload.coordinatorEpoch !== this.activeEpoch || payload.coordinatorEpoch < this.fenceEpochsBelow) return this.settled("workflowMessage.reportBranch", "claimLost", undefined, "claimLost");
    this.branchReported.add(payload.coordinatorEpoch);
    let adopted = 0;
    if (!this.holdSent) {
      for (const entry of payload.entries) {
        const message = this.messages.find((candidate) => candidate.messageId === entry.messageId);
        if (message !== undefined && message.state !== "sent") {
          message.state = "sent";
          message.entryId = entry.entryId;
          adopted++;
        }
      }
    }
    return this.settled("workflowMessage.reportBranch", "accepted", { adopted, created: 0, lostTurns: 0 });
  }

  async reportTurn(payload: { coordinatorEpoch: number; messageId: string; turnId: string; phase: string; stopReason?: string; entryId?: string }): Promise<Settled<"workflowTurn.report">> {
    this.requireConnection();
    this.record("workflowTurn.report", payload);
    this.log.push(`turn:${payload.phase}:e${payload.coordinatorEpoch}:${payload.messageId}:${payload.turnId}${payload.stopReason !== undefined ? `:${payload.stopReason}` : ""}`);
    if (payload.coordinatorEpoch !== this.activeEpoch || payload.coordinatorEpoch < this.fenceEpochsBelow) return this.settled("workflowTurn.report", "claimLost", undefined, "claimLost");
    if (payload.phase === "end" && payload.stopReason === "aborted" && this.run !== undefined) {
      this.setRun({ ...this.run, status: { ...this.run.status, paused: true }, display: { ...this.run.display, status: "paused" } });
    }
    return this.settled("workflowTurn.report", "accepted", { ownership: this.turnOwnership, turn: payload.turnId });
  }

  async readContent(ref: ContentReference, options: { runId?: string } = {}): Promise<Uint8Array> {
    this.requireConnection();
    this.fail("view.content");
    this.log.push(`content:${options.runId ?? "?"}`);
    const message = this.messages.find((candidate) => candidate.content.digest === ref.digest);
    if (message === undefined) throw new WorkflowClientError("contentUnavailable", "no such content (fake)");
    return new TextEncoder().encode(message.text);
  }

  async subscribe(): Promise<SubscriptionLike> {
    this.requireConnection();
    this.log.push("subscribe");
    const subscription = new FakeSubscription();
    this.subscriptions.push(subscription);
    return subscription;
  }

  // ---- session capture (kernel::capture's rules) ----

  /** Captured events per run, numbered from 1. */
  readonly captured = new Map<string, SessionEvent[]>();
  /** Every `sessionEvents.record` call (kept out of `calls` and `log`). */
  readonly captureCalls: SessionEventsRecordPayload[] = [];
  /** The next this many `sessionEvents.record` calls fail with no response (the connection dropped). */
  captureFailures = 0;

  async recordSessionEvents(payload: SessionEventsRecordPayload): Promise<Settled<"sessionEvents.record">> {
    this.requireConnection();
    this.captureCalls.push(structuredClone(payload));
    if (this.captureFailures > 0) {
      this.captureFailures--;
      throw new WorkflowClientError("unavailable", "the connection closed before the answer (fake)");
    }
    if (this.activeEpoch === undefined || this.activeEpoch < this.fenceEpochsBelow) return this.settled("sessionEvents.record", "claimLost", undefined, "claimLost");
    const stored = this.captured.get(payload.runId) ?? [];
    const events = payload.events;
    const first = events[0]?.seq ?? 0;
    if (events.length === 0 || events.length > 256 || events.some((event, index) => event.seq !== first + index)) return this.settled("sessionEvents.record", "rejected", undefined, "schemaInvalid");
    if (first < 1 || first > stored.length + 1) return this.settled("sessionEvents.record", "rejected", undefined, "illegalTransition");
    for (const event of events) {
      const old = stored[event.seq - 1];
      if (old !== undefined && JSON.stringify([old.type, old.data]) !== JSON.stringify([event.type, event.data])) return this.settled("sessionEvents.record", "conflict", undefined, "conflict");
    }
    for (const event of events) if (event.seq > stored.length) stored.push(structuredClone(event));
    this.captured.set(payload.runId, stored);
    return this.settled("sessionEvents.record", "accepted", { accepted: events.length });
  }

  /** Pages of the captured events (other collections: the fake serves complete views). */
  async page(runId: string, payload: ViewPagePayload): Promise<ViewPage> {
    this.requireConnection();
    if (payload.collection !== "sessionEvents") throw new WorkflowClientError("internal", "the fake serves complete views");
    this.log.push("page:sessionEvents");
    const stored = this.captured.get(runId) ?? [];
    const offset = Number(payload.cursor ?? "0");
    const items = stored.slice(offset, offset + Math.min(payload.limit, 256));
    const next = offset + items.length;
    return { collection: "sessionEvents", items: structuredClone(items) as never, revision: this.run?.revision ?? 1, ...(next < stored.length ? { nextCursor: String(next) } : {}) };
  }

  async runView(runId: string): Promise<RunView> {
    this.requireConnection();
    if (this.run === undefined || this.run.runId !== runId) throw new WorkflowClientError("notFound", "no run with this id (fake)");
    return structuredClone(this.run);
  }

  async workflowsList(payload: { projectPath: string; offset?: number; limit?: number }): Promise<ResponseReceiptByOperation["workflows.list"]> {
    this.requireConnection();
    this.record("workflows.list", payload);
    const all = [
      { name: "review", source: "/p/.pi/workflows/review.workflow.ts", title: "Review a change" },
      { name: "ship", source: "/p/.pi/workflows/ship.workflow.ts" },
    ];
    const offset = payload.offset ?? 0;
    return { workflows: all.slice(offset, offset + (payload.limit ?? 50)), total: all.length };
  }

  async runStart(payload: RunStartPayload, options: { idempotencyKey?: string } = {}): Promise<Accepted<"run.start">> {
    const held = (payload as RunStartPayload & { held?: boolean }).held === true;
    this.requireConnection();
    this.fail("run.start");
    this.record("run.start", payload, undefined, options.idempotencyKey);
    this.log.push(`run.start${held ? ":held" : ""}`);
    const runId = `run-${++this.runs}`;
    this.run = runView({
      runId,
      workflowName: payload.workflow,
      status: { run: "queued", queue: "queued", paused: false, executionMode: "interactive" },
      display: { status: "queued", activity: "none", controls: held ? (["activate", "cancel"] as never) : ["cancel"] },
    });
    this.changed();
    return this.accepted("run.start", { runId, revision: 1 });
  }

  private control<Op extends "run.pause" | "run.resume" | "run.cancel">(operation: Op, runId: string, idempotencyKey?: string, payload: Record<string, unknown> = {}): Accepted<Op> {
    this.requireConnection();
    this.fail(operation);
    this.record(operation, payload, runId, idempotencyKey);
    this.log.push(operation);
    const status = operation === "run.pause" ? "paused" : operation === "run.resume" ? "running" : "cancelled";
    if (this.run !== undefined) this.setRun({ ...this.run, display: { ...this.run.display, status, controls: status === "cancelled" ? [] : this.run.display.controls } });
    this.changed();
    return this.accepted(operation, { runId, revision: 2, status: status === "paused" ? "waiting" : status === "running" ? "running" : "cancelled" } as ResponseReceiptByOperation[Op]);
  }

  async runPause(runId: string, options: { idempotencyKey?: string } = {}): Promise<Accepted<"run.pause">> {
    return this.control("run.pause", runId, options.idempotencyKey);
  }

  async runResume(runId: string, options: { idempotencyKey?: string } = {}): Promise<Accepted<"run.resume">> {
    return this.control("run.resume", runId, options.idempotencyKey);
  }

  async runCancel(runId: string, options: { idempotencyKey?: string } = {}, payload: Record<string, unknown> = {}): Promise<Accepted<"run.cancel">> {
    return this.control("run.cancel", runId, options.idempotencyKey, payload);
  }

  async runRestart(runId: string, options: { idempotencyKey?: string } = {}, payload: Record<string, unknown> = {}): Promise<Accepted<"run.restart">> {
    this.requireConnection();
    this.fail("run.restart");
    this.record("run.restart", payload, runId, options.idempotencyKey);
    this.log.push(`run.restart${payload["held"] === true ? ":held" : ""}`);
    const newRunId = `run-${++this.runs}`;
    return this.accepted("run.restart", { runId, revision: 1, status: "failed", newRunId });
  }

  async followUpAdd(runId: string, prompt: string, options: { idempotencyKey?: string } = {}): Promise<Accepted<"followUp.add">> {
    this.requireConnection();
    this.fail("followUp.add");
    this.record("followUp.add", { prompt }, runId, options.idempotencyKey);
    return this.accepted("followUp.add", { followUpId: `fu-${this.calls.length}` });
  }

  async followUpCancel(followUpId: string, options: { idempotencyKey?: string } = {}): Promise<Accepted<"followUp.cancel">> {
    this.requireConnection();
    this.fail("followUp.cancel");
    this.record("followUp.cancel", { followUpId }, undefined, options.idempotencyKey);
    return this.accepted("followUp.cancel", { followUpId });
  }

  async checkpointAnswer(runId: string, answer: unknown, options: { idempotencyKey?: string } = {}): Promise<Accepted<"checkpoint.answer">> {
    this.requireConnection();
    this.fail("checkpoint.answer");
    this.record("checkpoint.answer", { answer }, runId, options.idempotencyKey);
    return this.accepted("checkpoint.answer", { continuationRunId: `${runId}-cont` });
  }

  async decisionAnswer(runId: string, payload: DecisionAnswerPayload, options: { idempotencyKey?: string } = {}): Promise<Accepted<"decision.answer">> {
    this.requireConnection();
    this.fail("decision.answer");
    this.record("decision.answer", payload, runId, options.idempotencyKey);
    return this.accepted("decision.answer", { decisionId: payload.decisionId, continuationRunId: `continuation-${runId}` });
  }

  /** The warning `effect.recover retry` answers with. */
  effectRecoverWarning: string | undefined;

  async effectRecover(runId: string, payload: EffectRecoverPayload, options: { idempotencyKey?: string } = {}): Promise<Accepted<"effect.recover">> {
    this.requireConnection();
    this.fail("effect.recover");
    this.record("effect.recover", payload, runId, options.idempotencyKey);
    const retry = payload.action === "retry";
    return this.accepted("effect.recover", {
      effectId: payload.effectId,
      state: retry ? "reserved" : "applied",
      attemptNumber: retry ? 2 : 1,
      ...(retry && this.effectRecoverWarning !== undefined ? { warning: this.effectRecoverWarning } : {}),
    });
  }

  submitOutcome: { outcome: "accepted" | "rejected"; message?: string } = { outcome: "accepted" };

  async interactionSubmit(runId: string, payload: InteractionSubmitPayload, options: { idempotencyKey?: string } = {}): Promise<Accepted<"interaction.submit">> {
    this.requireConnection();
    this.fail("interaction.submit");
    this.record("interaction.submit", payload, runId, options.idempotencyKey);
    const receipt: ResponseReceiptByOperation["interaction.submit"] = { submissionId: payload.submissionId, outcome: this.submitOutcome.outcome };
    if (this.submitOutcome.message !== undefined) receipt.error = { code: "validationFailed", message: this.submitOutcome.message };
    return this.accepted("interaction.submit", receipt);
  }

  async interactionUpdate(runId: string, payload: InteractionUpdatePayload, options: { idempotencyKey?: string } = {}): Promise<Accepted<"interaction.update">> {
    this.requireConnection();
    this.fail("interaction.update");
    this.record("interaction.update", payload, runId, options.idempotencyKey);
    return this.accepted("interaction.update", { updateId: "upd-9", seq: 9 });
  }

  async sessionViewClearTerminal(sessionId: string): Promise<Accepted<"sessionView.clearTerminal">> {
    this.requireConnection();
    this.record("sessionView.clearTerminal", { sessionId });
    this.run = undefined;
    return this.accepted("sessionView.clearTerminal", {});
  }

  async request<Op extends Operation>(operation: Op, spec: { runId?: string; payload: unknown; idempotent?: boolean | string }): Promise<Settled<Op>> {
    this.requireConnection();
    this.record(operation, spec.payload, spec.runId, typeof spec.idempotent === "string" ? spec.idempotent : undefined);
    this.log.push(operation);
    if ((operation as string) === "run.activate" && this.run !== undefined) {
      this.setRun({ ...this.run, display: { ...this.run.display, status: "running", controls: ["pause", "cancel"] } });
      this.changed();
      return this.settled(operation, "accepted", { runId: this.run.runId, revision: 3, status: "running" } as never);
    }
    return this.settled(operation, "unavailable", undefined, "unavailable");
  }

  close(): void {
    this.connectionGeneration = undefined;
  }
}

function wire(message: ServerMessage): WorkflowMessage {
  const { text: _text, ...rest } = message;
  return structuredClone(rest) as WorkflowMessage;
}

/** A subscription the fake pushes change events into. */
export class FakeSubscription implements SubscriptionLike {
  private readonly waiting: ((result: IteratorResult<SubscriptionEvent>) => void)[] = [];
  private pendingEvents = 0;
  private closed = false;
  private revision = 0;

  push(): void {
    this.revision++;
    const event: SubscriptionEvent = { subscriptionId: "s1", revision: this.revision, event: { kind: "sessionMessages", sessionId: "session-1", messages: [], messageCount: 0 } };
    const waiter = this.waiting.shift();
    if (waiter !== undefined) waiter({ value: event, done: false });
    else this.pendingEvents++;
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const waiter of this.waiting.splice(0)) waiter({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterator<SubscriptionEvent> {
    return {
      next: () => {
        if (this.closed) return Promise.resolve({ value: undefined, done: true });
        if (this.pendingEvents > 0) {
          this.pendingEvents--;
          return Promise.resolve({ value: { subscriptionId: "s1", revision: ++this.revision, event: { kind: "sessionMessages", sessionId: "session-1", messages: [], messageCount: 0 } }, done: false });
        }
        return new Promise((resolve) => this.waiting.push(resolve));
      },
    };
  }
}

/** Waits until `condition` holds (bounded). */
export async function until(what: string, condition: () => boolean, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** Lets every pending promise chain settle. */
export async function settle(rounds = 20): Promise<void> {
  for (let round = 0; round < rounds; round++) await new Promise((resolve) => setImmediate(resolve));
}
