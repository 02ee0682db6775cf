/**
 * Session delivery benchmark (a script, not a test): `npm --prefix sdk-ts run bench:session`.
 *
 * One real Pi in rpc mode with this package's extension, the real server,
 * the node runner and the mock model; in the same Pi session, alternately:
 * 1. A bare `pi.sendMessage()` round trip: `/bench-send` (a small extension
 *    beside ours) calls `pi.sendMessage()` at once; measured from the prompt
 *    to Pi's `message_end` of that custom message (client clock).
 * 2. A workflow of two agent steps, started with `/workflow`: from the
 *    `tool_execution_end` of the first step's accepted submission (the next
 *    step commits after it) to the `message_end` of the second step's
 *    message — commit to appearance, as an upper bound; and from the
 *    submission's `tool_execution_start` to the same message.
 * Prints medians of BENCH_REPEATS (default 5) after one warm-up, and the
 * ratios to the bare round trip.
 * Needs the server binary (PI_WORKFLOWS_BIN or `cargo build -p server`) and
 * scripts/install-pi.sh.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { reply, startMockModel, submitStep } from "../test-support/mock-model.js";
import { MOCK_MODEL_ID, MOCK_PROVIDER, PiSandbox, type PiRecord, type PiRpc } from "../test-support/pi.js";
import { SDK_DIR, TestServer, serverBinary } from "../test-support/server.js";
import { TERMINAL_FACTS, terminalTurnSettled } from "../test-support/terminal.js";

const REPEATS = Number(process.env.BENCH_REPEATS ?? 5);

const TWO_STEPS = `import { agent, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "two",
  startAt: "first",
  model: { provider: "${MOCK_PROVIDER}", model: "${MOCK_MODEL_ID}" },
  nodes: {
    first: agent({ prompt: "Say ok (first).", validate: (output) => output }),
    second: agent({ prompt: "Say ok (second).", validate: (output) => output }),
  },
  edges: [{ from: "first", to: "second" }],
});
`;

/** `/bench-send`: one `pi.sendMessage()` with no turn, nothing else. */
const BENCH_SEND = `export default function (pi: any) {
  pi.registerCommand("bench-send", { description: "bench", handler: async () => { pi.sendMessage({ customType: "bench-send", content: "bench", display: true, details: {} }, { triggerTurn: false }); } });
}
`;

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

const customEnd = (customType: string, test: (content: string) => boolean = () => true) => (record: PiRecord): boolean => {
  if (record.type !== "message_end") return false;
  const message = (record as { message?: { role?: string; customType?: string; content?: unknown } }).message;
  return message?.customType === customType && test(JSON.stringify(message.content ?? ""));
};

/** Waits for a record from `since`, resolving the client time it arrived. */
async function arrival(pi: PiRpc, predicate: (record: PiRecord) => boolean, since: number, what: string): Promise<number> {
  await pi.waitFor(predicate, { since, what, timeoutMs: 60_000 });
  return performance.now();
}

/** The run id in the notification `/workflow` answered with (records from `since`). */
function runIdOf(pi: PiRpc, since: number): string {
  for (const record of pi.records.slice(since)) {
    if (record.type !== "extension_ui_request" || record.method !== "notify") continue;
    const match = /\(run ([^)\s]+)\)/.exec((record as { message?: string }).message ?? "");
    if (match !== null) return match[1] as string;
  }
  throw new Error("no run id in the notifications of /workflow two");
}

const mock = await startMockModel({
  rules: [
    { name: "terminal", lastRole: "user", when: TERMINAL_FACTS, reply: reply.text("Noted.") },
    { name: "closing", lastRole: "tool", reply: reply.text("Done.") },
    { name: "submit", lastRole: "user", when: "Workflow step contract", reply: submitStep({ ok: true }) },
  ],
});
const sandbox = PiSandbox.create({ baseUrl: mock.baseUrl });
const server = await TestServer.start();
try {
  const project = server.project();
  writeFileSync(join(project, ".pi", "workflows", "two.workflow.ts"), TWO_STEPS);
  const benchSend = join(server.root, "bench-send.ts");
  writeFileSync(benchSend, BENCH_SEND);
  const env: Record<string, string> = { PI_WORKFLOWS_BIN: serverBinary() };
  for (const [key, value] of Object.entries(server.env)) if (key.startsWith("PI_WORKFLOWS_")) env[key] = value;
  const pi = await sandbox.spawnRpc({ extensions: [SDK_DIR, benchSend], cwd: project, env });

  const bare: number[] = [];
  const committed: number[] = [];
  const submitted: number[] = [];
  for (let i = 0; i <= REPEATS; i += 1) {
    let since = pi.mark();
    const sent = performance.now();
    await pi.prompt("/bench-send");
    const shown = await arrival(pi, customEnd("bench-send"), since, "the bench message");
    if (i > 0) bare.push(shown - sent);

    since = pi.mark();
    await pi.prompt("/workflow two");
    const submitStart = (record: PiRecord): boolean => record.type === "tool_execution_start" && (record as { toolName?: string }).toolName === "workflow";
    await pi.waitFor(submitStart, { since, what: "the first submission", timeoutMs: 60_000 });
    const submitAt = performance.now();
    const accepted = (record: PiRecord): boolean => record.type === "tool_execution_end" && (record as { toolName?: string }).toolName === "workflow";
    const acceptedAt = await arrival(pi, accepted, since, "the first submission's end");
    const second = await arrival(pi, customEnd("pi-workflows-agent-step", (content) => content.includes("step: second")), since, "the second step message");
    if (i > 0) {
      committed.push(second - acceptedAt);
      submitted.push(second - submitAt);
    }
    // The run completes; its terminal message's turn settles before the next round.
    await terminalTurnSettled(pi, mock, runIdOf(pi, since), since);
  }
  await pi.stop();
  const b = median(bare);
  const c = median(committed);
  const s = median(submitted);
  console.log(`bench:session (medians of ${REPEATS}, ms)`);
  console.log(`  bare pi.sendMessage() round trip        ${b.toFixed(1)}`);
  console.log(`  accepted submit → next step message     ${c.toFixed(1)}   ${(c / b).toFixed(2)}× bare`);
  console.log(`  submit call → next step message         ${s.toFixed(1)}   ${(s / b).toFixed(2)}× bare`);
} finally {
  await server.stop();
  await mock.close();
  sandbox.cleanup();
}
