/**
 * Session capture: the Pi events of a workflow turn, sent to the server
 * with `sessionEvents.record` so that viewers can replay the turn
 * (reference §5.8; the server numbers nothing, it checks the numbers).
 *
 * Invariants:
 * - Capture starts only for a turn the server accepted as workflow work (an
 *   `active` receipt): events of a turn are held locally until the receipt
 *   says which run the turn works for, and dropped when it is `absent` or
 *   `settled` or refused. Nothing else is captured.
 * - Pi's handlers only append to memory: sending is in the background and
 *   never awaited by a Pi event, so capture never blocks a turn.
 * - Events carry run-wide numbers from 1 without gaps. A process that does
 *   not know where a run's numbering stands reads the stored events
 *   (`view.page sessionEvents`) before it numbers any.
 * - A numbered batch is its own identity: until the server answers it, it is
 *   resent unchanged (same numbers, same content) after a failure or a
 *   reconnect, and the server adopts a repeat. A gap or a conflict (another
 *   process recorded those numbers) makes the sender read the stored count
 *   again and renumber what it has not had accepted.
 * - Bounded: at most `MAX_BATCH` events and `MAX_BATCH_BYTES` bytes a batch,
 *   each event's data cut to `MAX_EVENT_BYTES`, at most `MAX_PENDING` events
 *   held; what does not fit is counted and recorded as one `events_dropped`
 *   event once there is room.
 * - Only the connection that owns the session's coordinator epoch records;
 *   a fence (`claimLost`) waits for the next epoch.
 */
import type { JsonValue, SessionEvent } from "../generated/types.js";
import type { HeldEpoch } from "./coordinator.js";
import { CoalescedPasses } from "./passes.js";
import type { ServerPort } from "./ports.js";

/** The server's limits (kernel::capture). */
export const MAX_BATCH = 256;
export const MAX_EVENT_BYTES = 64 * 1024;
/** A batch's bytes: well under a client frame. */
export const MAX_BATCH_BYTES = 512 * 1024;
/** Events held (unsent or not yet owned) across the session. */
export const MAX_PENDING = 4096;
/** A stored page read to learn the run's numbering. */
const PAGE_LIMIT = 256;
const PAGE_BYTES = 1024 * 1024;

/** The Pi events of a turn that are captured (besides `turn_started`, `turn_finished`, `events_dropped`). */
export type CapturedEventType = "message_started" | "message_finished" | "tool_execution_started" | "tool_execution_finished" | "model_call_finished";

/** An event before it has a run-wide number. */
export interface CapturedEvent {
  type: string;
  data: JsonValue;
}

export interface CaptureGate {
  /** The held epoch whose branch was reported, if any. */
  reportingEpoch(): HeldEpoch | undefined;
  fence(epoch: HeldEpoch): void;
}

export interface SessionCaptureOptions {
  server: ServerPort;
  gate: CaptureGate;
  sessionId: string;
  /** A revision to read pages at (the server reads the current one). */
  revisionOf?: (runId: string) => number | undefined;
}

interface LocalTurnCapture {
  events: CapturedEvent[];
  /** The receipt's answer: the run, or dropped. */
  owner: { runId: string } | "none" | undefined;
}

interface RunCapture {
  queue: CapturedEvent[];
  /** The number the next event gets; undefined until read from the server. */
  next: number | undefined;
  /** The numbered batch sent and not yet answered: resent unchanged. */
  inflight: SessionEvent[] | undefined;
  /** The run cannot be recorded (not this session's run): its events are dropped. */
  refused: boolean;
}

/** The size of `value` as canonical-enough JSON. */
function sizeOf(value: JsonValue): number {
  return Buffer.byteLength(JSON.stringify(value) ?? "null");
}

/** `data` cut to fit one event: a text summary in place of a value too large. */
export function boundedData(data: JsonValue): JsonValue {
  if (sizeOf(data) <= MAX_EVENT_BYTES - 256) return data;
  const text = JSON.stringify(data) ?? "";
  const kept = Array.from(text.slice(0, (MAX_EVENT_BYTES - 1024) / 4)).join("");
  return { truncated: true, bytes: Buffer.byteLength(text), head: kept };
}

export class SessionCapture {
  private readonly options: SessionCaptureOptions;
  private readonly turns = new Map<string, LocalTurnCapture>();
  private readonly runs = new Map<string, RunCapture>();
  private current: string | undefined;
  private held = 0;
  private dropped = 0;
  private stopped = false;
  private readonly passes = new CoalescedPasses(() => this.flushOnce(), () => this.stopped);

  constructor(options: SessionCaptureOptions) {
    this.options = options;
  }

  /** Events held now (tests). */
  get pendingEvents(): number {
    return this.held;
  }

  /** Events dropped for want of room and not yet recorded as dropped (tests). */
  get droppedEvents(): number {
    return this.dropped;
  }

  /** The runs' next numbers as far as known (tests). */
  nextNumber(runId: string): number | undefined {
    return this.runs.get(runId)?.next;
  }

  stop(): void {
    this.stopped = true;
  }

  /** A Pi agent run started as local turn `turnId`: its events are held until the server says whose it is. */
  beginTurn(turnId: string, data: JsonValue): void {
    this.current = turnId;
    this.turns.set(turnId, { events: [], owner: undefined });
    this.append({ type: "turn_started", data: { turnId, ...(typeof data === "object" && data !== null && !Array.isArray(data) ? data : {}) } });
  }

  /** One Pi event of the current turn. */
  event(type: CapturedEventType, data: JsonValue): void {
    if (this.current === undefined) return;
    this.append({ type, data: boundedData(data) });
  }

  /** The current turn ended (`agent_settled`). */
  endTurn(aborted: boolean): void {
    const turnId = this.current;
    if (turnId === undefined) return;
    this.append({ type: "turn_finished", data: { turnId, aborted } });
    this.current = undefined;
    if (this.turns.get(turnId)?.owner !== undefined) this.turns.delete(turnId);
  }

  /** The server's answer about local turn `turnId`: `active` for `runId` starts its capture; anything else drops it. */
  owned(turnId: string, runId: string | undefined): void {
    const turn = this.turns.get(turnId);
    if (turn === undefined || turn.owner !== undefined) return;
    turn.owner = runId === undefined ? "none" : { runId };
    this.release(turnId, turn);
    void this.flush();
  }

  private append(event: CapturedEvent): void {
    const turnId = this.current;
    const turn = turnId === undefined ? undefined : this.turns.get(turnId);
    if (turnId === undefined || turn === undefined || turn.owner === "none") return;
    if (this.held >= MAX_PENDING) {
      this.dropped++;
      return;
    }
    if (this.dropped > 0 && this.held < MAX_PENDING - 1) {
      this.push(turn, { type: "events_dropped", data: { count: this.dropped } });
      this.dropped = 0;
    }
    this.push(turn, event);
  }

  private push(turn: LocalTurnCapture, event: CapturedEvent): void {
    if (turn.owner === undefined) {
      this.held++;
      turn.events.push(event);
      return;
    }
    if (turn.owner === "none") return;
    const run = this.runOf(turn.owner.runId);
    if (run.refused) return;
    this.held++;
    run.queue.push(event);
    void this.flush();
  }

  /** Moves a decided turn's held events to its run's queue (or drops them). */
  private release(turnId: string, turn: LocalTurnCapture): void {
    const events = turn.events;
    turn.events = [];
    if (turn.owner === "none" || turn.owner === undefined) {
      this.held -= events.length;
    } else {
      const run = this.runOf(turn.owner.runId);
      if (run.refused) this.held -= events.length;
      else run.queue.push(...events);
    }
    if (this.current !== turnId) this.turns.delete(turnId);
  }

  private runOf(runId: string): RunCapture {
    let run = this.runs.get(runId);
    if (run === undefined) {
      run = { queue: [], next: undefined, inflight: undefined, refused: false };
      this.runs.set(runId, run);
    }
    return run;
  }

  /** Sends what can be sent (coalesced; every failure waits for the next call: a view, a poll, a new event). */
  flush(): Promise<void> {
    return this.passes.request();
  }

  private async flushOnce(): Promise<void> {
    for (const [runId, run] of this.runs) {
      while (!this.stopped && !run.refused && (run.inflight !== undefined || run.queue.length > 0)) {
        const epoch = this.options.gate.reportingEpoch();
        if (epoch === undefined) return;
        if (run.next === undefined && run.inflight === undefined) {
          const stored = await this.storedCount(runId);
          if (stored === undefined) return;
          run.next = stored + 1;
        }
        run.inflight ??= this.number(run);
        const outcome = await this.send(runId, run.inflight, epoch);
        if (outcome === "wait") return;
        if (outcome === "accepted") {
          this.held -= run.inflight.length;
          run.inflight = undefined;
        } else if (outcome === "renumber") {
          // Put the events back, unnumbered, and read the stored count again.
          run.queue.unshift(...run.inflight.map((event) => ({ type: event.type, data: event.data })));
          run.inflight = undefined;
          run.next = undefined;
        } else {
          this.held -= run.inflight.length + run.queue.length;
          run.inflight = undefined;
          run.queue = [];
          run.refused = true;
        }
      }
    }
  }

  /** The next batch of `run`'s queue, numbered from `run.next`. */
  private number(run: RunCapture): SessionEvent[] {
    const batch: SessionEvent[] = [];
    let bytes = 0;
    let seq = run.next as number;
    while (run.queue.length > 0 && batch.length < MAX_BATCH) {
      const event = run.queue[0] as CapturedEvent;
      const size = sizeOf(event.data) + event.type.length + 32;
      if (batch.length > 0 && bytes + size > MAX_BATCH_BYTES) break;
      run.queue.shift();
      batch.push({ seq, type: event.type, data: event.data });
      bytes += size;
      seq++;
    }
    run.next = seq;
    return batch;
  }

  private async send(runId: string, events: SessionEvent[], epoch: HeldEpoch): Promise<"accepted" | "wait" | "renumber" | "refused"> {
    let settled;
    try {
      settled = await this.options.server.recordSessionEvents({ sessionId: this.options.sessionId, runId, events });
    } catch {
      return "wait";
    }
    switch (settled.outcome) {
      case "accepted":
      case "adopted":
        return "accepted";
      case "claimLost":
        this.options.gate.fence(epoch);
        return "wait";
      case "unavailable":
        return "wait";
      case "conflict":
        return "renumber";
      case "rejected":
        if (settled.error?.code === "claimLost") {
          this.options.gate.fence(epoch);
          return "wait";
        }
        return settled.error?.code === "illegalTransition" ? "renumber" : "refused";
      case "notFound":
        return "refused";
    }
  }

  /** How many events of `runId` the server holds: its pages read to the end. */
  private async storedCount(runId: string): Promise<number | undefined> {
    let count = 0;
    let cursor: string | undefined;
    const revision = this.options.revisionOf?.(runId) ?? 1;
    try {
      for (;;) {
        const page = await this.options.server.page(runId, { collection: "sessionEvents", limit: PAGE_LIMIT, maxBytes: PAGE_BYTES, revision, ...(cursor !== undefined ? { cursor } : {}) });
        count += page.items.length;
        if (page.nextCursor === undefined) return count;
        cursor = page.nextCursor;
      }
    } catch {
      return undefined;
    }
  }
}
