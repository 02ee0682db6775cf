/**
 * Live subscriptions: the client side of `subscribe`/`unsubscribe` and the
 * `event` frames that follow.
 *
 * Invariants:
 * - A subscription tracks the last presentation revision it accepted.
 *   An event at or below it is a duplicate and is dropped; a
 *   `runViewPatch` whose `baseRevision` is not that revision is a gap: it
 *   is dropped and the subscription re-subscribes from the last accepted
 *   revision (the server answers with patches or a bounded snapshot).
 * - After a reconnect the client re-subscribes every open subscription from
 *   its last accepted revision; the server's new subscription id replaces
 *   the old one, and the consumer sees one local `availability` event for
 *   the outage (`unavailable`) and one for the recovery (`available`).
 * - The queue of undelivered events is bounded: on overflow it is dropped
 *   and the subscription re-subscribes from the last revision the consumer
 *   actually received (a bounded snapshot replaces the backlog).
 * - `close()` ends the iterator at once and removes the server subscription
 *   (when connected); a closed subscription is never re-subscribed.
 */
import type { ClientEvent, Event, SubscriptionTarget } from "../generated/types.js";
import type { WorkflowClientError } from "./errors.js";

/** One event delivered to the consumer. */
export interface SubscriptionEvent {
  /** The server subscription id the event came under (it changes after a re-subscribe); `local` for events this client made. */
  subscriptionId: string;
  /** The presentation revision the event brings the subscriber to (for availability events, the last accepted revision, or 0). */
  revision: number;
  event: ClientEvent;
}

/** What to do with an incoming event. */
export type EventVerdict = "accept" | "stale" | "gap";

/** Decides an event against the last accepted revision (undefined: nothing accepted yet). */
export function judgeEvent(lastRevision: number | undefined, message: Pick<Event, "revision" | "event">): EventVerdict {
  if (message.event.kind === "availability") return "accept";
  if (lastRevision !== undefined && message.revision <= lastRevision) return "stale";
  if (message.event.kind === "runViewPatch") {
    if (lastRevision === undefined || message.event.baseRevision !== lastRevision) return "gap";
  }
  return "accept";
}

/** The client operations a subscription needs (implemented by WorkflowClient). */
export interface SubscriptionHost {
  resync(subscription: Subscription): void;
  closeSubscription(subscription: Subscription): Promise<void>;
}

/** A live subscription: an async iterable of events. */
export class Subscription implements AsyncIterable<SubscriptionEvent> {
  readonly target: SubscriptionTarget;
  /** The server subscription id while bound to a connection. */
  id: string | undefined;
  /** The last accepted presentation revision. */
  revision: number | undefined;
  /** The last revision handed to the consumer (re-subscribe point after an overflow). */
  private delivered: number | undefined;
  private readonly queue: SubscriptionEvent[] = [];
  private readonly waiters: Array<{ resolve: (result: IteratorResult<SubscriptionEvent>) => void; reject: (error: unknown) => void }> = [];
  private ended = false;
  private failure: WorkflowClientError | null = null;
  private readonly host: SubscriptionHost;
  private readonly maxQueued: number;
  /** Whether the consumer was told the connection is unavailable. */
  private announcedOutage = false;

  /** @internal */
  constructor(host: SubscriptionHost, target: SubscriptionTarget, fromRevision: number | undefined, maxQueued: number) {
    this.host = host;
    this.target = target;
    this.revision = fromRevision;
    this.delivered = fromRevision;
    this.maxQueued = maxQueued;
  }

  /** Whether the subscription ended (closed, or failed). */
  get closed(): boolean {
    return this.ended;
  }

  /** @internal An event frame under this subscription's id. */
  receive(message: Event): void {
    if (this.ended) return;
    const verdict = judgeEvent(this.revision, message);
    if (verdict === "stale") return;
    if (verdict === "gap") {
      this.host.resync(this);
      return;
    }
    if (message.event.kind !== "availability") this.revision = message.revision;
    this.enqueue({ subscriptionId: message.subscriptionId, revision: message.revision, event: message.event });
  }

  /** @internal The connection carrying this subscription ended. */
  connectionLost(): void {
    this.id = undefined;
    if (this.ended || this.announcedOutage) return;
    this.announcedOutage = true;
    this.enqueue(this.local({ kind: "availability", state: "unavailable", reason: "the connection to the pi-workflows server was lost; reconnecting" }));
  }

  /** @internal Bound again after a reconnect. */
  recovered(): void {
    if (this.ended || !this.announcedOutage) return;
    this.announcedOutage = false;
    this.enqueue(this.local({ kind: "availability", state: "available" }));
  }

  /** @internal Ends the iterator with an error. */
  fail(error: WorkflowClientError): void {
    if (this.ended) return;
    this.failure = error;
    this.finish();
  }

  /** @internal Ends the iterator. */
  finish(): void {
    if (this.ended) return;
    this.ended = true;
    this.id = undefined;
    for (const waiter of this.waiters.splice(0)) {
      if (this.failure !== null && this.queue.length === 0) waiter.reject(this.failure);
      else waiter.resolve({ value: undefined, done: true });
    }
  }

  /** Ends the subscription and removes it on the server. */
  close(): Promise<void> {
    return this.host.closeSubscription(this);
  }

  [Symbol.asyncIterator](): AsyncIterator<SubscriptionEvent> {
    return {
      next: () => this.next(),
      // Leaving a `for await` loop ends the subscription at once; the server
      // unsubscribe is sent without waiting for its answer.
      return: () => {
        this.close().catch(() => undefined);
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }

  private next(): Promise<IteratorResult<SubscriptionEvent>> {
    const event = this.queue.shift();
    if (event !== undefined) {
      if (event.event.kind !== "availability") this.delivered = event.revision;
      return Promise.resolve({ value: event, done: false });
    }
    if (this.ended) {
      if (this.failure !== null) {
        const failure = this.failure;
        this.failure = null;
        return Promise.reject(failure);
      }
      return Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  private enqueue(event: SubscriptionEvent): void {
    const waiter = this.waiters.shift();
    if (waiter !== undefined) {
      if (event.event.kind !== "availability") this.delivered = event.revision;
      waiter.resolve({ value: event, done: false });
      return;
    }
    this.queue.push(event);
    if (this.queue.length > this.maxQueued) {
      // The consumer fell behind: drop the backlog and resume from what it has.
      this.queue.length = 0;
      this.revision = this.delivered;
      this.host.resync(this);
    }
  }

  private local(event: ClientEvent): SubscriptionEvent {
    return { subscriptionId: "local", revision: this.revision ?? 0, event };
  }
}
