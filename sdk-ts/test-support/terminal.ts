/**
 * Test support: the terminal workflow message in real-Pi tests. Every
 * interactive run that ends (the final leaf of its continuation chain) gets
 * one `pi-workflows-deferred-turn` message (the terminal decision card, which
 * claimed the run's turn intent) from the server, and it opens
 * one model turn; a test that completes, fails or cancels an interactive run
 * answers that turn with `terminalRule` and waits for it to settle before it
 * sends Pi anything else.
 */
import type { MockModel, MockRequest, MockRule } from "./mock-model.js";
import { reply } from "./mock-model.js";
import type { PiRpc } from "./pi.js";

/** The start of a terminal message's facts block (`kernel::terminal`). */
export const TERMINAL_FACTS = "Terminal facts (pi-workflows.terminal-facts.v1";

/** The custom type the extension sends a terminal message as. */
export const TERMINAL_TYPE = "pi-workflows-deferred-turn";

/** What the mock model answers a terminal message with. */
export const TERMINAL_REPLY = "Noted: the workflow ended.";

/** Answers a terminal message's model turn. */
export const terminalRule: MockRule = { name: "terminal", lastRole: "user", when: TERMINAL_FACTS, reply: reply.text(TERMINAL_REPLY) };

/** Model requests a terminal message opened (optionally: the one of `runId`). */
export function terminalTurns(requests: readonly MockRequest[], runId?: string): MockRequest[] {
  return requests.filter(
    (request) =>
      request.last?.role === "user" && request.last.text.includes(TERMINAL_FACTS) && (runId === undefined || request.last.text.includes(`"runId":${JSON.stringify(runId)}`)),
  );
}

/**
 * Waits until the terminal message of `runId` (undefined: of any run) opened
 * its model turn, the mock answered it, and Pi settled after it (records
 * from `since`).
 */
export async function terminalTurnSettled(pi: PiRpc, mock: MockModel, runId: string | undefined, since = 0, timeoutMs = 60_000): Promise<MockRequest> {
  const request = await mock.waitForRequest(
    (candidate) => terminalTurns([candidate], runId).length === 1 && candidate.outcome !== "streaming",
    timeoutMs,
    `the terminal message's model turn of run ${runId ?? "(any)"}`,
  );
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const last = pi.records
      .slice(since)
      .filter((record) => record.type === "agent_start" || record.type === "agent_settled")
      .at(-1);
    if (last?.type === "agent_settled") return request;
    if (Date.now() > deadline) {
      const types = pi.records.slice(-15).map((record) => record.type);
      throw new Error(`timed out waiting for Pi to settle after the terminal turn of run ${runId ?? "(any)"} [last records: ${types.join(", ")}]`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
