/**
 * Exact model-turn reports (`workflowTurn.report`) from documented Pi
 * events.
 *
 * Invariants:
 * - A turn id is made at `agent_start` and kept through its end and through
 *   server reconnects; a new `agent_start` makes a new turn.
 * - Starts and ends are buffered and reported strictly in event order, and
 *   only while the coordinator holds an epoch whose branch it reported. After
 *   a reconnect or a server restart (a new held epoch, even when the restarted
 *   server gives the same number) an open or unreported turn's start is
 *   reported again with the same id before its end.
 * - A turn is bound to a workflow message through the view: the message the
 *   coordinator just sent when it started the turn (the report waits until
 *   the view shows that message sent), otherwise the newest sent step,
 *   terminal or follow-up message of the window. The server alone decides
 *   whether the turn is workflow work (`active`); `absent` or `settled`
 *   drops it, and its end is not reported.
 * - The stop reason comes from the assistant messages of `agent_end`
 *   (`aborted`, `error`, else `completed`), or from `agent_settled` when
 *   `agent_end` had no assistant message. An abort the extension itself
 *   requested (`markSystemAbort`) is reported as `error`, never `aborted`:
 *   only a user's Escape pauses the run, through this end report and never
 *   through a second command.
 */
import { randomUUID } from "node:crypto";
import type { MessageKind, StopReason, TurnOwnership } from "../generated/types.js";
import type { HeldEpoch, Trigger, TurnSink } from "./coordinator.js";
import { type BranchEntryLike, branchIndex } from "./messages.js";
import { CoalescedPasses } from "./passes.js";
import type { ServerPort } from "./ports.js";
import type { LoadedView } from "./view-source.js";

/** What the reporter needs from the coordinator. */
export interface TurnGate {
  reportingEpoch(): HeldEpoch | undefined;
  fence(epoch: HeldEpoch): void;
  takeTrigger(): Trigger | undefined;
  readonly currentView: LoadedView | undefined;
}

/** The workflow message a turn is reported against. */
export interface Binding {
  messageId: string;
  runId: string;
  kind: MessageKind;
}

/** One Pi model turn as the reporter tracks it. */
export interface LocalTurn {
  readonly turnId: string;
  /** The leaf entry when the turn started (the response entry comes after it). */
  readonly startLeaf: string | null;
  trigger: Trigger | undefined;
  binding: Binding | "none" | undefined;
  /**
   * The held epoch the start was last reported on. Compared by identity: the
   * coordinator holds a new one for every granted epoch on every connection,
   * and epoch numbers alone repeat (a restarted server numbers from 1 again).
   */
  startReportedOn: HeldEpoch | undefined;
  ownership: TurnOwnership | undefined;
  end: { stopReason: StopReason; entryId: string | undefined } | undefined;
  /** `agent_end` came without an assistant message: the end waits for `agent_settled`. */
  endAwaitsSettle: boolean;
  endReported: boolean;
  /** The extension aborted this turn itself (once). */
  systemAborted: boolean;
  /** The server accepted a step output submitted in this turn: its step closed normally. */
  stepAccepted: boolean;
}

export interface TurnReporterOptions {
  server: ServerPort;
  gate: TurnGate;
  sessionId: string;
  /** `ctx.sessionManager.getBranch()`. */
  getBranch: () => readonly BranchEntryLike[];
  /** `ctx.sessionManager.getLeafId()`. */
  getLeafId: () => string | null;
  /** A turn the server accepted as workflow work started or ended (for the widget). */
  onActivity?: () => void;
  /** A local turn was made at `agent_start`. */
  onTurnStart?: (turnId: string) => void;
  /** The server's answer about a turn: the run it works for (`active`), or undefined (not workflow work). */
  onOwnership?: (turnId: string, runId: string | undefined) => void;
  newTurnId?: () => string;
}

/** The stop reason of the last assistant message, if there is one. */
export function stopReasonOf(messages: readonly unknown[]): StopReason | undefined {
  for (let index = messages.length - 1; index >= 0; index--) {
    const message = messages[index] as { role?: unknown; stopReason?: unknown } | undefined;
    if (message?.role !== "assistant") continue;
    if (message.stopReason === "aborted") return "aborted";
    if (message.stopReason === "error") return "error";
    return "completed";
  }
  return undefined;
}

export class TurnReporter implements TurnSink {
  private readonly options: TurnReporterOptions;
  private readonly turns: LocalTurn[] = [];
  private systemAbort = false;
  private readonly passes = new CoalescedPasses(() => this.flushOnce());

  constructor(options: TurnReporterOptions) {
    this.options = options;
  }

  /** Turns not yet fully reported, oldest first (tests and status). */
  get pending(): readonly LocalTurn[] {
    return this.turns;
  }

  /** The newest turn the server accepted as workflow work and that has not ended. */
  activeWorkflowTurn(): LocalTurn | undefined {
    const last = this.turns.at(-1);
    return last !== undefined && last.ownership === "active" && last.end === undefined ? last : undefined;
  }

  /**
   * The terminal message whose decision turn is the open turn (DEFERRED_TURNS
   * "Selected launch"): the open turn's message when it is a terminal message
   * the server accepted the turn for (`active`). Waits up to `waitMs` while
   * the turn is not bound or its start not answered yet (a tool call can run
   * before the start report returns); undefined for any other turn.
   */
  async decisionMessage(waitMs = 3000): Promise<string | undefined> {
    const deadline = Date.now() + waitMs;
    for (;;) {
      const turn = this.openTurn();
      if (turn === undefined) return undefined;
      const binding = turn.binding;
      if (binding === "none" || turn.ownership === "absent" || turn.ownership === "settled") return undefined;
      if (binding !== undefined && turn.ownership === "active") return binding.kind === "terminal" ? binding.messageId : undefined;
      if (Date.now() >= deadline) return undefined;
      void this.flush();
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }

  /** The extension is about to call `ctx.abort()` itself: the turn it ends is not a user's Escape. */
  markSystemAbort(): void {
    this.systemAbort = true;
  }

  /** The `workflow` tool's submission was accepted inside the open turn. */
  markStepAccepted(): void {
    const turn = this.openTurn();
    if (turn !== undefined) turn.stepAccepted = true;
  }

  /** `agent_start`. */
  onAgentStart(): void {
    const view = this.options.gate.currentView;
    const turn: LocalTurn = {
      turnId: (this.options.newTurnId ?? (() => `turn-${randomUUID()}`))(),
      startLeaf: this.options.getLeafId(),
      trigger: this.options.gate.takeTrigger(),
      binding: undefined,
      startReportedOn: undefined,
      ownership: undefined,
      end: undefined,
      endAwaitsSettle: false,
      endReported: false,
      systemAborted: false,
      stepAccepted: false,
    };
    if (turn.trigger === undefined && view !== undefined) turn.binding = candidateOf(view);
    this.turns.push(turn);
    this.options.onTurnStart?.(turn.turnId);
    void this.flush();
  }

  /** `agent_end` with its messages. */
  onAgentEnd(messages: readonly unknown[]): void {
    const turn = this.openTurn();
    if (turn === undefined) return;
    const reason = stopReasonOf(messages);
    if (reason === undefined) {
      turn.endAwaitsSettle = true;
      return;
    }
    this.end(turn, reason);
  }

  /** `agent_settled`. */
  onAgentSettled(aborted: boolean): void {
    const turn = this.turns.find((candidate) => candidate.endAwaitsSettle && candidate.end === undefined);
    if (turn !== undefined) this.end(turn, aborted ? "aborted" : "error");
    this.systemAbort = false;
    void this.flush();
  }

  /** Reports what can be reported, in order (coalesced). */
  flush(): Promise<void> {
    return this.passes.request();
  }

  private openTurn(): LocalTurn | undefined {
    for (let index = this.turns.length - 1; index >= 0; index--) {
      const turn = this.turns[index];
      if (turn !== undefined && turn.end === undefined && !turn.endAwaitsSettle) return turn;
    }
    return undefined;
  }

  private end(turn: LocalTurn, reason: StopReason): void {
    const stopReason: StopReason = reason === "aborted" && this.systemAbort ? "error" : reason;
    turn.endAwaitsSettle = false;
    turn.end = { stopReason, entryId: this.responseEntryOf(turn) };
    void this.flush();
  }

  /** The last assistant message entry after the turn's start leaf, if any. */
  private responseEntryOf(turn: LocalTurn): string | undefined {
    const branch = this.options.getBranch();
    let after = turn.startLeaf === null;
    let found: string | undefined;
    for (const entry of branch) {
      if (!after) {
        after = entry.id === turn.startLeaf;
        continue;
      }
      const message = entry.message as { role?: unknown } | undefined;
      if (entry.type === "message" && message?.role === "assistant") found = entry.id;
    }
    return found;
  }

  private async flushOnce(): Promise<void> {
    const { gate, server, sessionId } = this.options;
    while (this.turns.length > 0) {
      const turn = this.turns[0] as LocalTurn;
      const epoch = gate.reportingEpoch();
      const view = gate.currentView;
      if (epoch === undefined || view === undefined) return;
      if (turn.binding === undefined) {
        const bound = this.bind(turn, view);
        if (bound === "wait") return;
      }
      if (turn.binding === "none" || turn.ownership === "absent" || turn.ownership === "settled") {
        this.turns.shift();
        this.options.onOwnership?.(turn.turnId, undefined);
        continue;
      }
      const binding = turn.binding as Binding;
      const base = { sessionId, coordinatorEpoch: epoch.epoch, messageId: binding.messageId, runId: binding.runId, turnId: turn.turnId };
      if (turn.startReportedOn !== epoch) {
        const answer = await this.report(epoch, { ...base, phase: "start" });
        if (answer === "retry") return;
        turn.startReportedOn = epoch;
        turn.ownership = answer === "drop" ? "absent" : answer;
        if (turn.ownership === "active") this.options.onOwnership?.(turn.turnId, binding.runId);
        this.options.onActivity?.();
        continue;
      }
      if (turn.end === undefined) return; // open: wait for its end
      if (!turn.endReported) {
        const payload = { ...base, phase: "end" as const, stopReason: turn.end.stopReason, ...(turn.end.entryId !== undefined ? { entryId: turn.end.entryId } : {}) };
        const answer = await this.report(epoch, payload);
        if (answer === "retry") return;
        turn.endReported = true;
        this.options.onActivity?.();
      }
      this.turns.shift();
    }
  }

  /** Binds a turn to its message; "wait" while the triggering message is not yet recorded as sent. */
  private bind(turn: LocalTurn, view: LoadedView): "bound" | "wait" {
    const trigger = turn.trigger;
    if (trigger !== undefined) {
      const message = view.messages.find((candidate) => candidate.messageId === trigger.messageId);
      // The message is not recorded as sent yet: wait while the turn is open, and after it ended while its
      // entry is on the branch (the coordinator's branch report records it next); otherwise the server decides.
      const recording = turn.end === undefined || branchIndex(this.options.getBranch()).has(trigger.messageId);
      if (message !== undefined && message.state === "pending" && recording) return "wait";
      if (message !== undefined && message.state === "sent") {
        turn.binding = { messageId: message.messageId, runId: message.runId, kind: message.kind };
        return "bound";
      }
    }
    turn.binding = candidateOf(view);
    return "bound";
  }

  /**
   * One report: the ownership the server answered; "retry" when it must be
   * reported again later (no answer, an answer on another connection, the
   * server unavailable, or the epoch fenced); "drop" when the server refused
   * it (a start against a closed message, a conflicting repeat): the turn is
   * not workflow work.
   */
  private async report(epoch: HeldEpoch, payload: Parameters<ServerPort["reportTurn"]>[0]): Promise<TurnOwnership | "retry" | "drop"> {
    let settled;
    try {
      settled = await this.options.server.reportTurn(payload);
    } catch {
      return "retry";
    }
    if (settled.connectionGeneration !== epoch.generation) return "retry";
    if (settled.error?.code === "claimLost") {
      this.options.gate.fence(epoch);
      return "retry";
    }
    switch (settled.outcome) {
      case "accepted":
      case "adopted":
        return settled.receipt?.ownership ?? "retry";
      case "claimLost":
        this.options.gate.fence(epoch);
        return "retry";
      case "unavailable":
        return "retry";
      case "rejected":
      case "conflict":
      case "notFound":
        return "drop";
    }
  }
}

/** The newest sent step, terminal or follow-up message of the window, or "none". */
function candidateOf(view: LoadedView): Binding | "none" {
  let best: (Binding & { order: number }) | undefined;
  for (const message of view.messages) {
    if (message.state !== "sent") continue;
    if (message.kind !== "step" && message.kind !== "terminal" && message.kind !== "followUp") continue;
    if (best === undefined || message.order > best.order) best = { messageId: message.messageId, runId: message.runId, kind: message.kind, order: message.order };
  }
  return best === undefined ? "none" : { messageId: best.messageId, runId: best.runId, kind: best.kind };
}
