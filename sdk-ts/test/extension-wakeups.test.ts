/**
 * Lost wakeups: a request for another pass (the coordinator's `schedule`, the
 * view source's `refresh`) that arrives while a pass is finishing must cause
 * one more pass. Each test drives the module with a controllable fake of its
 * one dependency, lets the pass's last await resolve, and makes the request
 * `hops` microtasks later, for every hop count from 0 to 24, which covers the
 * whole end of a pass: the moment it checks for more requests and the moment
 * it lets a new pass start. No timer or poll helps: a request lost there is
 * never served.
 */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import type { Settled } from "../src/client/client.js";
import { WorkflowMessageCoordinator } from "../src/extension/coordinator.js";
import { SessionViewSource, type LoadedView } from "../src/extension/view-source.js";
import type { SessionView } from "../src/generated/types.js";
import { FakePi, FakeServer, settle } from "./extension-fakes.js";

const HOPS = 25;

/** Runs `action` after `hops` microtask hops. */
function afterHops(hops: number, action: () => void): void {
  if (hops === 0) action();
  else queueMicrotask(() => afterHops(hops - 1, action));
}

function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((done) => {
    resolve = done;
  });
  return { promise, resolve };
}

describe("no lost wakeup", () => {
  it("the coordinator: a view that arrives while its branch-report pass is finishing gets a pass (the eligible message is sent)", async () => {
    const lost: number[] = [];
    for (let hops = 0; hops < HOPS; hops++) {
      const server = new FakeServer();
      const pi = new FakePi();
      server.reconnect();
      server.addMessage("step", "Step text");
      // The branch report is answered when the test says so.
      const answer = deferred<void>();
      const report = server.reportBranch.bind(server);
      server.reportBranch = async (payload) => {
        const settled: Settled<"workflowMessage.reportBranch"> = await report(payload);
        await answer.promise;
        return settled;
      };
      const coordinator = new WorkflowMessageCoordinator({ server, pi, sessionId: "session-1", refresh: () => undefined, entryWait: { attempts: 5, delayMs: 1 } });
      // The first view grants the epoch but names no eligible message (the branch is not reported yet).
      const first = await loadedView(server);
      assert.equal(first.nextEligibleMessageId, undefined);
      coordinator.onView(first);
      await settle(2);
      assert.equal(server.ops("workflowMessage.reportBranch").length, 1, "the pass reports the branch");
      // The view read after the report names the step: it arrives `hops` microtasks after the report's answer.
      const second = await loadedView(server);
      assert.equal(second.nextEligibleMessageId, "msg-1");
      answer.resolve();
      afterHops(hops, () => coordinator.onView(second));
      await settle(40);
      if (pi.sent.length !== 1) lost.push(hops);
      coordinator.stop();
    }
    assert.deepEqual(lost, [], `the view was taken in but no pass acted on it when it arrived this many microtasks after the report's answer: ${lost.join(", ")}`);
  });

  it("the view source: a refresh requested while a read is finishing causes one more read", async () => {
    const lost: number[] = [];
    for (let hops = 0; hops < HOPS; hops++) {
      const server = new FakeServer();
      server.reconnect();
      let reads = 0;
      const answers: (() => void)[] = [];
      const read = server.sessionView.bind(server);
      server.sessionView = async (payload) => {
        reads++;
        const answered = await read(payload);
        await new Promise<void>((resolve) => answers.push(resolve));
        return answered;
      };
      const source = new SessionViewSource({ server, sessionId: "session-1", onView: () => undefined });
      void source.refresh();
      await settle(2);
      assert.equal(reads, 1);
      // A change (a subscription event) asks for a read `hops` microtasks after the first read's answer.
      answers.shift()?.();
      afterHops(hops, () => void source.refresh());
      await settle(20);
      for (const resolve of answers.splice(0)) resolve();
      await settle(20);
      if ((reads as number) !== 2) lost.push(hops);
      await source.stop();
    }
    assert.deepEqual(lost, [], `a refresh requested this many microtasks after the answer caused no read: ${lost.join(", ")}`);
  });
});

/** The session view the fake server gives now, as the view source would load it. */
async function loadedView(server: FakeServer): Promise<LoadedView> {
  const { view, connectionGeneration } = await server.sessionView({ sessionId: "session-1", coordinate: true } as never);
  const full = view as SessionView & { coordinatorEpoch?: number; nextEligibleMessageId?: string };
  return {
    sessionId: full.sessionId,
    revision: full.revision,
    run: full.activeRun,
    messages: full.messages,
    messageCount: full.messageCount,
    nextEligibleMessageId: full.nextEligibleMessageId,
    coordinatorEpoch: full.coordinatorEpoch,
    connectionGeneration,
  };
}
