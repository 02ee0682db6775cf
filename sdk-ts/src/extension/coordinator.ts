/**
 * `WorkflowMessageCoordinator`: the one path by which server workflow
 * messages of every kind (step, decision, notification, terminal,
 * follow-up) enter the Pi session, and the gate of every turn report.
 *
 * Invariants:
 * - The coordinator acts only with an epoch the server granted in a complete
 *   origin-session view, and only while the connection that read that view
 *   is still the client's open connection and no report was answered with a
 *   fence (`claimLost`). A new connection means a new epoch.
 * - Before any send or turn report on an epoch, it reports the active branch
 *   (`workflowMessage.reportBranch`) with the workflow message ids and Pi
 *   entry ids of the complete view window, `isIdle` and
 *   `hasPendingMessages`.
 * - It sends only the message the view names as next eligible, only when Pi
 *   is idle with no pending input, the id is absent from the branch and from
 *   the in-memory queued map, and its connection still owns the epoch. That
 *   final check, the queued-map insert and `pi.sendMessage()` run in one
 *   synchronous block: no `await` between them.
 * - A message found on the branch is reported, never sent again. After a
 *   send it waits for the entry and reports the branch, so the server records
 *   the entry id and marks the message sent.
 * - Passes are serialized and coalesced (`CoalescedPasses`): one at a time,
 *   any number of requests during a pass cause exactly one more, and a
 *   request that comes as a pass ends is never lost.
 */
import type { WorkflowMessage } from "../generated/types.js";
import { type BranchEntryLike, branchIndex, deliveryOf, startsTurn } from "./messages.js";
import { CoalescedPasses } from "./passes.js";
import type { PiPort, ServerPort } from "./ports.js";
import type { LoadedView } from "./view-source.js";

/** An epoch as the coordinator holds it. */
export interface HeldEpoch {
  readonly epoch: number;
  /** The connection the epoch belongs to. */
  readonly generation: number;
  branchReported: boolean;
  fenced: boolean;
}

/** A sent message that starts a turn, until the turn reporter takes it at the next `agent_start`. */
export interface Trigger {
  messageId: string;
  runId: string;
}

/** What the turn reporter needs from the coordinator. */
export interface TurnSink {
  /** Reports buffered turn events in order; called after every branch report and on every pass. */
  flush(): Promise<void>;
}

export interface CoordinatorOptions {
  server: ServerPort;
  pi: PiPort;
  sessionId: string;
  /** Reads the view again (coalesced); the coordinator calls it after it changed server state. */
  refresh: () => void;
  /** How long to look for the entry of a sent message (default 100 × 20 ms). */
  entryWait?: { attempts: number; delayMs: number };
  /** Why the coordinator is not acting, for `/workflow status` (safe text). */
  onProblem?: (problem: string | undefined) => void;
}

/** Why a pass stopped, for status and tests. */
export type CoordinatorState =
  | "noView"
  | "noEpoch"
  | "fenced"
  | "branchUnreported"
  | "idle"
  | "waitingForPi"
  | "sending";

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms).unref());

export class WorkflowMessageCoordinator {
  private readonly options: CoordinatorOptions;
  private view: LoadedView | undefined;
  private held: HeldEpoch | undefined;
  /** Messages handed to `pi.sendMessage()` by this process, by id. */
  private readonly queued = new Set<string>();
  private readonly contents = new Map<string, string>();
  private trigger: Trigger | undefined;
  private stopped = false;
  private readonly passes = new CoalescedPasses(() => this.passOnce(), () => this.stopped);
  private turns: TurnSink | undefined;
  private lastState: CoordinatorState = "noView";
  private problem: string | undefined;

  constructor(options: CoordinatorOptions) {
    this.options = options;
  }

  /** Connects the turn reporter (its reports wait for the branch report). */
  attachTurns(turns: TurnSink): void {
    this.turns = turns;
  }

  /** The last complete view. */
  get currentView(): LoadedView | undefined {
    return this.view;
  }

  /** Where the last pass stopped. */
  get state(): CoordinatorState {
    return this.lastState;
  }

  /** Ids in the queued map (tests and status). */
  get queuedIds(): readonly string[] {
    return [...this.queued];
  }

  /** Why the coordinator does not act, if it does not. */
  get currentProblem(): string | undefined {
    return this.problem;
  }

  /** Takes in a complete view: adopts its epoch and runs a pass. */
  onView(view: LoadedView): void {
    this.view = view;
    const granted = view.coordinatorEpoch;
    if (granted === undefined) {
      // The server gives this connection no epoch (not supported, or another coordinator is active).
      if (this.held !== undefined && this.held.generation === view.connectionGeneration) this.held = undefined;
    } else if (this.held === undefined || this.held.epoch !== granted || this.held.generation !== view.connectionGeneration) {
      this.held = { epoch: granted, generation: view.connectionGeneration, branchReported: false, fenced: false };
    }
    for (const id of [...this.queued]) {
      const message = view.messages.find((candidate) => candidate.messageId === id);
      if (message !== undefined && message.state !== "pending") {
        this.queued.delete(id);
        this.contents.delete(id);
      }
    }
    this.schedule();
  }

  /**
   * The epoch that may report turns now: held, not fenced, on the open
   * connection, still granted by the current view, and its branch reported.
   */
  reportingEpoch(): HeldEpoch | undefined {
    return this.ownsEpoch() && this.held?.branchReported === true ? this.held : undefined;
  }

  /** A report on `epoch` was answered with a fence. */
  fence(epoch: HeldEpoch): void {
    epoch.fenced = true;
    this.setProblem("another Pi process now coordinates this session's workflow messages");
  }

  /** The sent message that will start the next turn, once. */
  takeTrigger(): Trigger | undefined {
    const trigger = this.trigger;
    this.trigger = undefined;
    return trigger;
  }

  /** Requests a pass (coalesced). Resolves when a pass that started after the request ended. */
  schedule(): Promise<void> {
    return this.passes.request();
  }

  /** Stops acting (session shutdown). */
  stop(): void {
    this.stopped = true;
  }

  /** Synchronous: the held epoch is live on the open connection and the current view still grants it. */
  ownsEpoch(): boolean {
    const held = this.held;
    const view = this.view;
    return (
      held !== undefined &&
      !held.fenced &&
      view !== undefined &&
      view.coordinatorEpoch === held.epoch &&
      view.connectionGeneration === held.generation &&
      this.options.server.connectionGeneration === held.generation
    );
  }

  private async passOnce(): Promise<void> {
    try {
      this.lastState = await this.pass();
    } catch (error) {
      this.setProblem(error instanceof Error ? error.message : "the coordinator failed");
    }
  }

  private async pass(): Promise<CoordinatorState> {
    if (this.stopped) return "idle";
    if (this.view === undefined) return "noView";
    const held = this.held;
    if (held === undefined) {
      this.setProblem("the pi-workflows server grants this session no coordinator epoch, so no workflow message is delivered");
      return "noEpoch";
    }
    if (held.fenced) return "fenced";
    if (!this.ownsEpoch()) return "noEpoch";
    if (!held.branchReported) {
      if (!(await this.reportBranch(held))) return held.fenced ? "fenced" : "branchUnreported";
      await this.turns?.flush();
      // The report may have adopted or created messages: read again before sending.
      this.options.refresh();
      return "idle";
    }
    await this.turns?.flush();
    return this.sendNext(held);
  }

  /** Reports the branch on `held`; true when the server accepted it on that epoch's connection. */
  private async reportBranch(held: HeldEpoch): Promise<boolean> {
    const view = this.view;
    if (view === undefined) return false;
    const { pi, server, sessionId } = this.options;
    const payload = {
      sessionId,
      coordinatorEpoch: held.epoch,
      entries: branchEntries(view.messages, pi.getBranch()),
      isIdle: pi.isIdle(),
      hasPendingMessages: pi.hasPendingMessages(),
    };
    let settled;
    try {
      settled = await server.reportBranch(payload);
    } catch (error) {
      this.setProblem(error instanceof Error ? error.message : "the branch report failed");
      return false;
    }
    // An answer on another connection belongs to an epoch that is gone.
    if (settled.connectionGeneration !== held.generation) return false;
    if (settled.outcome === "accepted" || settled.outcome === "adopted") {
      held.branchReported = true;
      this.setProblem(undefined);
      return true;
    }
    if (settled.outcome === "claimLost" || settled.error?.code === "claimLost") {
      this.fence(held);
      return false;
    }
    this.setProblem(settled.error?.message ?? `the server answered ${settled.outcome} to the branch report`);
    return false;
  }

  private async sendNext(held: HeldEpoch): Promise<CoordinatorState> {
    const view = this.view;
    const id = view?.nextEligibleMessageId;
    if (view === undefined || id === undefined || this.queued.has(id)) return "idle";
    const message = view.messages.find((candidate) => candidate.messageId === id);
    if (message === undefined || message.state !== "pending") return "idle";
    const { pi } = this.options;
    if (branchIndex(pi.getBranch()).has(id)) {
      // Already on the branch (a send before a crash or reload): report it, never send it again.
      await this.reportBranch(held);
      this.options.refresh();
      return "idle";
    }
    if (!pi.isIdle() || pi.hasPendingMessages()) return "waitingForPi";
    const text = await this.contentOf(message);
    if (text === undefined) return "idle";
    // The final check, the queued insert and the send: one synchronous block.
    if (!this.maySend(message)) return pi.isIdle() ? "idle" : "waitingForPi";
    this.queued.add(id);
    // Set before the send: Pi may emit agent_start for the turn it starts before sendMessage returns.
    const previousTrigger = this.trigger;
    if (startsTurn(message.kind)) this.trigger = { messageId: id, runId: message.runId };
    try {
      pi.sendMessage(deliveryOf(message, text));
    } catch (error) {
      this.queued.delete(id);
      this.trigger = previousTrigger;
      this.setProblem(error instanceof Error ? `Pi refused the workflow message: ${error.message}` : "Pi refused the workflow message");
      return "idle";
    }
    await this.waitForEntry(id);
    if (this.ownsEpoch()) await this.reportBranch(held);
    await this.turns?.flush();
    this.options.refresh();
    return "sending";
  }

  /** Synchronous final check before a send. */
  private maySend(message: WorkflowMessage): boolean {
    const { pi } = this.options;
    return (
      !this.stopped &&
      this.ownsEpoch() &&
      this.held?.branchReported === true &&
      this.view?.nextEligibleMessageId === message.messageId &&
      !this.queued.has(message.messageId) &&
      pi.isIdle() &&
      !pi.hasPendingMessages() &&
      !branchIndex(pi.getBranch()).has(message.messageId)
    );
  }

  private async waitForEntry(id: string): Promise<boolean> {
    const { attempts, delayMs } = this.options.entryWait ?? { attempts: 100, delayMs: 20 };
    for (let attempt = 0; ; attempt++) {
      if (branchIndex(this.options.pi.getBranch()).has(id)) return true;
      if (attempt >= attempts || this.stopped) return false;
      await sleep(delayMs);
    }
  }

  /** The message text, read (verified) from the server once. */
  private async contentOf(message: WorkflowMessage): Promise<string | undefined> {
    const cached = this.contents.get(message.messageId);
    if (cached !== undefined) return cached;
    try {
      const bytes = await this.options.server.readContent(message.content, { runId: message.runId });
      const text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
      this.contents.set(message.messageId, text);
      return text;
    } catch (error) {
      this.setProblem(`the content of workflow message ${message.messageId} could not be read: ${error instanceof Error ? error.message : "unknown error"}`);
      return undefined;
    }
  }

  private setProblem(problem: string | undefined): void {
    if (this.problem === problem) return;
    this.problem = problem;
    this.options.onProblem?.(problem);
  }
}

/** The branch entries of the messages in the view window (the only ids a report may name). */
export function branchEntries(window: readonly WorkflowMessage[], branch: readonly BranchEntryLike[]): { messageId: string; entryId: string }[] {
  const index = branchIndex(branch);
  const entries: { messageId: string; entryId: string }[] = [];
  for (const message of window) {
    const entryId = index.get(message.messageId);
    if (entryId !== undefined) entries.push({ messageId: message.messageId, entryId });
  }
  return entries;
}
