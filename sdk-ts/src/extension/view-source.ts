/**
 * The origin-session view: the one input of the widget, the status line,
 * the coordinator, the turn reporter, the commands and the tool.
 *
 * Invariants:
 * - A view is one `sessionView.get` answer (one consistent server read),
 *   completed with every page of its run's steps and updates at that run's
 *   revision; a page at another revision restarts the read (at most
 *   `COMPLETE_VIEW_ATTEMPTS` times). Listeners never see a partial view.
 * - Reads are serialized and coalesced (`CoalescedPasses`): at most one read
 *   is in flight, requests made meanwhile cause exactly one more read after
 *   it, and a request that comes as a read ends is never lost.
 * - At most one connection attempt and at most one session subscription
 *   exist at a time. Only the first attempt (at `session_start`) may start
 *   the server; later ones (the 1 s poll) only connect, so an open session
 *   recovers when a server becomes available without starting one itself.
 * - Nothing here derives workflow state: the view is what the server sent.
 */
import { COMPLETE_VIEW_ATTEMPTS, MAX_PAGE_BYTES } from "../client/client.js";
import { WorkflowClientError } from "../client/errors.js";
import type { RunView, SessionView, WorkflowMessage } from "../generated/types.js";
import { CoalescedPasses } from "./passes.js";
import type { ServerPort, SubscriptionLike } from "./ports.js";

/** One complete origin-session view. */
export interface LoadedView {
  sessionId: string;
  /** The session revision the server reported. */
  revision: number;
  /** The active (or retained terminal) run, with every step and update. */
  run: RunView | undefined;
  /** The message window, in session order. */
  messages: readonly WorkflowMessage[];
  messageCount: number;
  /** Given only to the active coordinator epoch. */
  nextEligibleMessageId: string | undefined;
  /** The epoch the view grants this connection, if any. */
  coordinatorEpoch: number | undefined;
  /** The connection that answered the read. */
  connectionGeneration: number;
}

export interface SessionViewSourceOptions {
  server: ServerPort;
  sessionId: string;
  /** Every complete view, in read order. */
  onView: (view: LoadedView) => void;
  /** A read or connection failed (the message is safe to show). */
  onUnavailable?: (error: WorkflowClientError) => void;
}

/** Reads and follows one origin session. */
export class SessionViewSource {
  private readonly options: SessionViewSourceOptions;
  private latest: LoadedView | undefined;
  private readonly reads = new CoalescedPasses(
    async () => {
      await this.readOnce();
    },
    () => this.stopped,
  );
  private connecting: Promise<boolean> | null = null;
  private subscription: SubscriptionLike | undefined;
  private subscribing = false;
  private stopped = false;
  private lastError: WorkflowClientError | undefined;

  constructor(options: SessionViewSourceOptions) {
    this.options = options;
  }

  /** The last complete view. */
  get current(): LoadedView | undefined {
    return this.latest;
  }

  /** The last read or connection error, until a read succeeds. */
  get unavailable(): WorkflowClientError | undefined {
    return this.lastError;
  }

  /** Whether a session subscription is open. */
  get subscribed(): boolean {
    return this.subscription !== undefined;
  }

  /** Reads the view (coalesced with a read in flight); resolves the newest complete view. */
  refresh(): Promise<LoadedView | undefined> {
    if (this.stopped) return Promise.resolve(this.latest);
    return this.reads.request().then(() => this.latest);
  }

  /** Connects when no connection is open (one attempt at a time). */
  ensureConnected(start: boolean): Promise<boolean> {
    if (this.stopped) return Promise.resolve(false);
    if (this.options.server.connectionGeneration !== undefined) return Promise.resolve(true);
    if (this.connecting !== null) return this.connecting;
    const attempt = this.options.server.connect({ start }).then(
      () => true,
      (error: unknown) => {
        this.fail(error);
        return false;
      },
    );
    this.connecting = attempt;
    void attempt.finally(() => {
      if (this.connecting === attempt) this.connecting = null;
    });
    return attempt;
  }

  /** Opens the session subscription when none is open; its events trigger reads. */
  ensureSubscribed(): void {
    if (this.stopped || this.subscription !== undefined || this.subscribing) return;
    this.subscribing = true;
    void (async () => {
      let subscription: SubscriptionLike;
      try {
        subscription = await this.options.server.subscribe({ kind: "session", sessionId: this.options.sessionId });
      } catch (error) {
        this.subscribing = false;
        this.fail(error);
        return;
      }
      this.subscribing = false;
      if (this.stopped) {
        await subscription.close().catch(() => undefined);
        return;
      }
      this.subscription = subscription;
      try {
        for await (const event of subscription) {
          if (this.stopped) break;
          // Every event (a message change, or the connection back) means: read again.
          if (event.event.kind !== "availability" || event.event.state === "available") void this.refresh();
        }
      } catch (error) {
        this.fail(error);
      } finally {
        if (this.subscription === subscription) this.subscription = undefined;
      }
    })();
  }

  /** Ends the subscription; later calls do nothing. */
  async stop(): Promise<void> {
    this.stopped = true;
    const subscription = this.subscription;
    this.subscription = undefined;
    await subscription?.close().catch(() => undefined);
  }

  private fail(error: unknown): void {
    this.lastError = error instanceof WorkflowClientError ? error : new WorkflowClientError("unavailable", "the pi-workflows server could not be reached");
    this.options.onUnavailable?.(this.lastError);
  }

  private async readOnce(): Promise<LoadedView | undefined> {
    try {
      for (let attempt = 0; attempt < COMPLETE_VIEW_ATTEMPTS; attempt++) {
        const answered = await this.options.server.sessionView({ sessionId: this.options.sessionId, coordinate: true });
        const run = await this.completeRun(answered.view.activeRun);
        if (run === null) continue; // the run moved on between pages: read again
        const loaded = loadedOf(answered.view, run, answered.connectionGeneration);
        if (this.stopped) return this.latest;
        this.latest = loaded;
        this.lastError = undefined;
        this.options.onView(loaded);
        return loaded;
      }
      this.fail(new WorkflowClientError("unavailable", "the workflow run kept changing while its view was read; it is read again on the next poll"));
    } catch (error) {
      this.fail(error);
    }
    return this.latest;
  }

  /** The run with every step and update page appended; null when a page came from another revision. */
  private async completeRun(run: RunView | undefined): Promise<RunView | undefined | null> {
    if (run === undefined) return undefined;
    const previous = this.latest?.run;
    if (previous !== undefined && previous.runId === run.runId && previous.revision === run.revision) return previous;
    for (const collection of ["steps", "updates"] as const) {
      const page = run[collection];
      let cursor = page.nextCursor;
      while (cursor !== undefined) {
        const next = await this.options.server.page(run.runId, { collection, revision: run.revision, limit: 1000, maxBytes: MAX_PAGE_BYTES, cursor });
        if (next.revision !== run.revision) return null;
        (page.items as unknown[]).push(...next.items);
        cursor = next.nextCursor;
      }
      if (page.items.length !== page.total) return null;
      delete page.nextCursor;
    }
    return run;
  }
}

function loadedOf(view: SessionView, run: RunView | undefined, connectionGeneration: number): LoadedView {
  return {
    sessionId: view.sessionId,
    revision: view.revision,
    run,
    messages: view.messages,
    messageCount: view.messageCount,
    nextEligibleMessageId: view.nextEligibleMessageId,
    coordinatorEpoch: view.coordinatorEpoch,
    connectionGeneration,
  };
}
