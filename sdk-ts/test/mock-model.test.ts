/**
 * The mock model of the real-Pi tests (test-support/mock-model.ts), driven
 * over real HTTP: rule matching, streamed replies, errors, the request log,
 * client aborts, and the CLI.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { type MockModel, queue, reply, startMockModel } from "../test-support/mock-model.js";
import { SDK_DIR } from "../test-support/server.js";

interface Chunk {
  choices: { delta: { content?: string | null; tool_calls?: { index: number; id?: string; function: { name?: string; arguments?: string } }[] }; finish_reason: string | null }[];
  usage?: unknown;
}

const TOOLS = [{ type: "function", function: { name: "echo", description: "", parameters: {} } }];

function body(messages: unknown[], extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { model: "mock-model", stream: true, messages, ...extra };
}

/** POSTs a chat-completions request and folds the streamed chunks. */
async function complete(mock: MockModel, request: Record<string, unknown>) {
  const response = await fetch(`${mock.baseUrl}/chat/completions`, { method: "POST", body: JSON.stringify(request), headers: { "content-type": "application/json" } });
  const raw = await response.text();
  if (!response.ok) {
    const error = (JSON.parse(raw) as { error: { message: string } }).error.message;
    return { status: response.status, error, text: "", calls: [], finish: null, usage: undefined, chunks: 0 };
  }
  const events = raw.split("\n\n").filter((e) => e.startsWith("data: ")).map((e) => e.slice(6));
  assert.equal(events.at(-1), "[DONE]");
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e) as Chunk);
  let text = "";
  const calls: { id: string; name: string; arguments: string }[] = [];
  let finish: string | null = null;
  for (const chunk of chunks) {
    for (const choice of chunk.choices) {
      text += choice.delta.content ?? "";
      for (const call of choice.delta.tool_calls ?? []) {
        calls[call.index] ??= { id: "", name: "", arguments: "" };
        const into = calls[call.index] as { id: string; name: string; arguments: string };
        into.id += call.id ?? "";
        into.name += call.function.name ?? "";
        into.arguments += call.function.arguments ?? "";
      }
      finish = choice.finish_reason ?? finish;
    }
  }
  return { status: response.status, error: undefined, text, calls, finish, usage: chunks.at(-1)?.usage, chunks: chunks.length };
}

describe("mock model", () => {
  it("answers with the first matching rule: last user/tool text, role, offered tool, use count", async () => {
    const mock = await startMockModel({
      rules: [
        { name: "after-tool", lastRole: "tool", reply: reply.text("Tool done.") },
        { name: "once", when: /^first\b/, times: 1, reply: reply.text("First time.") },
        { name: "echo", when: "echo", withTool: "echo", reply: reply.toolCall("echo", { text: "hi" }) },
        { name: "fallback", reply: reply.text("Plain.") },
      ],
    });
    try {
      assert.equal((await complete(mock, body([{ role: "user", content: "first try" }]))).text, "First time.");
      assert.equal((await complete(mock, body([{ role: "user", content: "first try" }]))).text, "Plain.");
      assert.equal((await complete(mock, body([{ role: "user", content: "please echo" }]))).text, "Plain.");
      const call = await complete(mock, body([{ role: "system", content: "sys" }, { role: "user", content: [{ type: "text", text: "please echo" }] }], { tools: TOOLS }));
      assert.deepEqual([call.finish, call.calls.map((c) => [c.name, JSON.parse(c.arguments)])], ["tool_calls", [["echo", { text: "hi" }]]]);
      const toolId = call.calls[0]?.id as string;
      const after = await complete(
        mock,
        body([
          { role: "user", content: "please echo" },
          { role: "assistant", content: null, tool_calls: [{ id: toolId, type: "function", function: { name: "echo", arguments: '{"text":"hi"}' } }] },
          { role: "tool", tool_call_id: toolId, content: "ECHO:hi" },
        ]),
      );
      assert.deepEqual([after.text, after.finish], ["Tool done.", "stop"]);
      assert.deepEqual(mock.requests.map((r) => r.rule), ["once", "fallback", "fallback", "echo", "after-tool"]);
      assert.deepEqual(mock.requests.map((r) => r.outcome), ["completed", "completed", "completed", "completed", "completed"]);
      const last = mock.requests[4];
      assert.deepEqual(last?.last, { role: "tool", text: "ECHO:hi", toolCallId: toolId });
      assert.deepEqual(last?.messages[1]?.toolCalls, [{ id: toolId, name: "echo", arguments: '{"text":"hi"}' }]);
      assert.deepEqual(mock.requests[3]?.tools, ["echo"]);
      assert.equal(mock.requests[3]?.last?.text, "please echo");
    } finally {
      await mock.close();
    }
  });

  it("streams text in chunks with a usage chunk, serves a queue in order, and replaces rules", async () => {
    const mock = await startMockModel({ rules: queue(reply.text("abcdefghij", { chunkChars: 3 }), reply.toolCalls([{ name: "a", arguments: "{}", id: "c1" }, { name: "b", arguments: { x: 1 } }])) });
    try {
      const first = await complete(mock, body([{ role: "user", content: "x" }]));
      // role chunk + 4 text chunks + finish chunk + usage chunk
      assert.deepEqual([first.text, first.chunks, first.finish], ["abcdefghij", 7, "stop"]);
      assert.deepEqual(first.usage, { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 });
      const second = await complete(mock, body([{ role: "user", content: "x" }]));
      assert.deepEqual(second.calls.map((c) => [c.name, c.arguments]), [["a", "{}"], ["b", '{"x":1}']]);
      assert.equal(second.calls[0]?.id, "c1");
      assert.match(second.calls[1]?.id ?? "", /^call_mock_\d+$/);
      const third = await complete(mock, body([{ role: "user", content: "x" }]));
      assert.equal(third.status, 500);
      assert.match(third.error ?? "", /no rule matched request 2 \(last user: "x"\)/);
      assert.deepEqual([mock.requests[2]?.rule, mock.requests[2]?.outcome], [null, "noRule"]);

      mock.setRules([{ reply: reply.text("new rules") }]);
      assert.equal((await complete(mock, body([{ role: "user", content: "x" }]))).text, "new rules");
      assert.equal(mock.requests[3]?.rule, "rule#0");
    } finally {
      await mock.close();
    }
  });

  it("answers HTTP errors and non-streaming requests", async () => {
    const mock = await startMockModel({ rules: [{ when: "fail", reply: reply.httpError(429, "slow down") }, { reply: reply.text("whole") }] });
    try {
      const failed = await complete(mock, body([{ role: "user", content: "fail" }]));
      assert.deepEqual([failed.status, failed.error], [429, "slow down"]);
      const response = await fetch(`${mock.baseUrl}/chat/completions`, { method: "POST", body: JSON.stringify(body([{ role: "user", content: "ok" }], { stream: false })) });
      const json = (await response.json()) as { choices: { message: { content: string }; finish_reason: string }[] };
      assert.deepEqual([json.choices[0]?.message.content, json.choices[0]?.finish_reason], ["whole", "stop"]);
      assert.deepEqual(mock.requests.map((r) => r.outcome), ["httpError", "completed"]);
      assert.equal((await fetch(`${mock.baseUrl}/nothing`)).status, 404);
    } finally {
      await mock.close();
    }
  });

  it("records a client that goes away mid-stream as clientClosed, and a dropped connection as dropped", async () => {
    const mock = await startMockModel({ rules: [{ when: "drop", reply: reply.dropConnection("half of this") }, { reply: reply.text("x".repeat(100), { chunkChars: 1, delayMs: 20 }) }] });
    try {
      const abort = new AbortController();
      const response = await fetch(`${mock.baseUrl}/chat/completions`, { method: "POST", body: JSON.stringify(body([{ role: "user", content: "slow" }])), signal: abort.signal });
      const reader = (response.body as ReadableStream<Uint8Array>).getReader();
      await reader.read();
      abort.abort();
      const request = await mock.waitForRequest((r) => r.outcome !== "streaming", 5_000);
      assert.equal(request.outcome, "clientClosed");

      await assert.rejects(complete(mock, body([{ role: "user", content: "drop" }])));
      assert.equal((await mock.waitForRequest((r) => r.index === 1 && r.outcome !== "streaming", 5_000)).outcome, "dropped");
      await assert.rejects(mock.waitForRequest((r) => r.index === 2, 100, "a third request"), /timed out after 100 ms waiting for a third request; requests: #0 rule#1 clientClosed; #1 rule#0 dropped/);
    } finally {
      await mock.close();
    }
  });

  it("runs as a process: prints its port, answers by a JSON rules file, logs requests", async () => {
    const dir = mkdtempSync(join(tmpdir(), "mock-model-cli-"));
    writeFileSync(join(dir, "rules.json"), JSON.stringify([{ name: "hello", when: "hello", reply: { kind: "text", text: "Hello back." } }]));
    const child = spawn(process.execPath, [join(SDK_DIR, "build", "test-support", "mock-model-cli.js"), "--rules", join(dir, "rules.json"), "--log", join(dir, "log.jsonl")], { stdio: ["ignore", "pipe", "inherit"] });
    try {
      const port = await new Promise<number>((resolvePromise, reject) => {
        let out = "";
        child.stdout.on("data", (d: Buffer) => {
          out += String(d);
          const m = /MOCK_MODEL_LISTENING (\d+)\n/.exec(out);
          if (m) resolvePromise(Number(m[1]));
        });
        child.on("exit", (code) => reject(new Error(`mock-model-cli exited ${code}`)));
      });
      const answer = await complete({ baseUrl: `http://127.0.0.1:${port}/v1` } as MockModel, body([{ role: "user", content: "hello there" }]));
      assert.equal(answer.text, "Hello back.");
      const log = readFileSync(join(dir, "log.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
      assert.deepEqual(log.map((l) => [l.index, l.rule, l.outcome]), [[0, "hello", "completed"]]);
    } finally {
      child.kill("SIGTERM");
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
