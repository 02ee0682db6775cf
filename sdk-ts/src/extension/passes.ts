/**
 * Coalesced passes: the coordinator's passes, the view source's reads, and the
 * turn reporter's and the session capture's flushes.
 *
 * Invariants:
 * - One pass at a time; any number of requests during a pass cause exactly
 *   one more pass, and every request resolves when a pass that started after
 *   it ended. A request is never lost: the running promise is cleared in the
 *   same step that ends the loop, so a later request starts a new one.
 * - Once `stopped()` holds, no further pass starts.
 */
export class CoalescedPasses {
  private running: Promise<void> | null = null;
  private again = false;

  constructor(
    private readonly pass: () => Promise<void>,
    private readonly stopped: () => boolean = () => false,
  ) {}

  /** Requests a pass. */
  request(): Promise<void> {
    this.again = true;
    if (this.running === null) this.running = this.loop();
    return this.running;
  }

  private async loop(): Promise<void> {
    // Asynchronous from the start: `running` is set before the first pass.
    await Promise.resolve();
    try {
      while (this.again && !this.stopped()) {
        this.again = false;
        await this.pass();
      }
    } finally {
      this.running = null;
    }
  }
}
