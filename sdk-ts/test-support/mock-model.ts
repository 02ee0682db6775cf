/**
 * Test support: a mock OpenAI-compatible chat-completions server on
 * 127.0.0.1 (port 0) that real Pi talks to in the real-Pi tests.
 *
 * Invariants:
 * - Every POST `…/chat/completions` is answered by the first rule that
 *   matches it (rules are tried in order; a rule with `times` stops matching
 *   once used that often), and is recorded in `requests` with what the model
 *   was sent (messages, offered tools), which rule answered it, and how the
 *   answer ended. A request no rule matches gets HTTP 500 with a message that
 *   says so, and is recorded with `rule: null`: a missing rule never turns
 *   into a made-up reply.
 * - Replies stream as Server-Sent Events in the chat-completions chunk
 *   format (text deltas, tool-call deltas, a usage chunk, `[DONE]`), with an
 *   optional delay after every chunk so a test can interrupt a stream.
 * - When the client goes away before the reply is complete (Pi aborted),
 *   the request's outcome is `clientClosed`.
 */
import { EventEmitter } from "node:events";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** One tool call of a reply. `arguments` is sent as JSON (a string is sent as is). */
export interface MockToolCall {
  name: string;
  arguments: unknown;
  /** The tool-call id (default `call_mock_<n>`). */
  id?: string;
}

/** What the mock answers. Build these with `reply.*`. */
export type MockReply =
  | { kind: "text"; text: string; delayMs?: number; chunkChars?: number }
  | { kind: "toolCalls"; calls: MockToolCall[]; text?: string; delayMs?: number }
  | { kind: "httpError"; status: number; message: string }
  | { kind: "dropConnection"; text: string }
  /** Submits `output` for the conversation's newest step contract through the `workflow` tool (JSON-expressible, for rule files). */
  | { kind: "submitStep"; output: unknown };

export const reply = {
  /** Streams `text` in chunks of `chunkChars` (default 16), waiting `delayMs` after each. */
  text(text: string, options: { delayMs?: number; chunkChars?: number } = {}): MockReply {
    return { kind: "text", text, ...options };
  },
  /** One tool call with JSON arguments (finish reason `tool_calls`). */
  toolCall(name: string, args: unknown, options: { text?: string; delayMs?: number; id?: string } = {}): MockReply {
    const { id, ...rest } = options;
    return { kind: "toolCalls", calls: [{ name, arguments: args, ...(id ? { id } : {}) }], ...rest };
  },
  /** Several tool calls in one assistant message. */
  toolCalls(calls: MockToolCall[], options: { text?: string; delayMs?: number } = {}): MockReply {
    return { kind: "toolCalls", calls, ...options };
  },
  /** An HTTP error with an OpenAI-style error body. */
  httpError(status: number, message: string): MockReply {
    return { kind: "httpError", status, message };
  },
  /** Streams the start of `text`, then destroys the connection without finishing. */
  dropConnection(text: string): MockReply {
    return { kind: "dropConnection", text };
  },
};

/** A message of a request, reduced to what tests assert on. */
export interface MockMessage {
  role: string;
  /** The text content (string content, or the text parts joined). */
  text: string;
  /** For an assistant message: the tool calls it made. */
  toolCalls?: { id: string; name: string; arguments: string }[];
  /** For a tool result: the id of the call it answers. */
  toolCallId?: string;
}

/** How the mock's answer to a request ended. */
export type MockOutcome = "streaming" | "completed" | "clientClosed" | "httpError" | "dropped" | "noRule";

/** One received chat-completions request. */
export interface MockRequest {
  /** 0-based, in arrival order. */
  index: number;
  path: string;
  /** The JSON body as received. */
  body: Record<string, unknown>;
  messages: MockMessage[];
  /** The names of the offered tools. */
  tools: string[];
  /** The last user or tool message (what `when` and `lastRole` match on). */
  last: MockMessage | undefined;
  /** The name of the rule that answered (`rule#<index>` when unnamed), or null. */
  rule: string | null;
  outcome: MockOutcome;
}

/** A rule: every given matcher must hold; `reply` is the answer. */
export interface MockRule {
  /** A name for the request log (default `rule#<index>`). */
  name?: string;
  /** The text of the last user/tool message contains this string or matches this pattern. */
  when?: string | RegExp;
  /** The role of the last user/tool message: `user` or `tool` (a tool result). */
  lastRole?: "user" | "tool";
  /** The request offers a tool with this name. */
  withTool?: string;
  /** Any other condition on the request. */
  match?: (request: MockRequest) => boolean;
  /** Match at most this many times (then the rule is skipped). */
  times?: number;
  /** The answer, or a function of the request that returns it (e.g. to echo a step contract's attempt id). */
  reply: MockReply | ((request: MockRequest) => MockReply);
}

/** The step contract of a workflow agent prompt (reference §1.6): its workflow, step and attempt ids. */
export interface StepContract {
  workflow: string;
  step: string;
  attempt: string;
}

/** The newest step contract in the request's messages, or undefined. */
export function stepContract(request: MockRequest): StepContract | undefined {
  for (const message of [...request.messages].reverse()) {
    const match = /Workflow step contract \(workflow: (.+?), step: (.+?), attempt: (.+?)\)/.exec(message.text);
    if (match) return { workflow: match[1] as string, step: match[2] as string, attempt: match[3] as string };
  }
  return undefined;
}

/** A reply that submits `output` for the request's step contract through the `workflow` tool. */
export function submitStep(output: unknown): MockReply {
  return { kind: "submitStep", output };
}

/** The reply to send: a `submitStep` becomes its tool call (or a text saying there is no step contract). */
function resolveReply(answer: MockReply, request: MockRequest): Exclude<MockReply, { kind: "submitStep" }> {
  if (answer.kind !== "submitStep") return answer;
  const contract = stepContract(request);
  if (contract === undefined) return { kind: "text", text: "mock model: no step contract in this conversation" };
  return { kind: "toolCalls", calls: [{ name: "workflow", arguments: { action: "submit", step: contract.step, attempt: contract.attempt, output: answer.output } }] };
}

/** A queue: each reply answers exactly one request, in order, whatever it says. */
export function queue(...replies: MockReply[]): MockRule[] {
  return replies.map((r, i) => ({ name: `queue#${i}`, times: 1, reply: r }));
}

export interface MockModel {
  port: number;
  /** `http://127.0.0.1:<port>/v1`, the provider base URL for Pi's models.json. */
  baseUrl: string;
  /** Every chat-completions request so far (live array). */
  readonly requests: readonly MockRequest[];
  /** Replaces the rules (use counts start again). */
  setRules(rules: MockRule[]): void;
  /** Resolves the first request (past or future) for which `predicate` holds; rejects after `timeoutMs`. */
  waitForRequest(predicate: (request: MockRequest) => boolean, timeoutMs?: number, what?: string): Promise<MockRequest>;
  close(): Promise<void>;
}

export interface MockModelOptions {
  rules?: MockRule[];
  /** Called with each request once its outcome is known (the CLI logs with it). */
  onRequest?: (request: MockRequest) => void;
}

/** Starts the mock on 127.0.0.1, port 0. */
export async function startMockModel(options: MockModelOptions = {}): Promise<MockModel> {
  let rules: MockRule[] = options.rules ?? [];
  let uses = new Map<MockRule, number>();
  const requests: MockRequest[] = [];
  const changes = new EventEmitter();
  let callCounter = 0;

  const pick = (request: MockRequest): { rule: MockRule; name: string } | undefined => {
    for (const [index, rule] of rules.entries()) {
      if (rule.times !== undefined && (uses.get(rule) ?? 0) >= rule.times) continue;
      if (rule.lastRole !== undefined && request.last?.role !== rule.lastRole) continue;
      if (rule.when !== undefined) {
        const text = request.last?.text ?? "";
        if (typeof rule.when === "string" ? !text.includes(rule.when) : !rule.when.test(text)) continue;
      }
      if (rule.withTool !== undefined && !request.tools.includes(rule.withTool)) continue;
      if (rule.match !== undefined && !rule.match(request)) continue;
      uses.set(rule, (uses.get(rule) ?? 0) + 1);
      return { rule, name: rule.name ?? `rule#${index}` };
    }
    return undefined;
  };

  const finish = (request: MockRequest, outcome: MockOutcome): void => {
    if (request.outcome !== "streaming") return;
    request.outcome = outcome;
    options.onRequest?.(request);
    changes.emit("change");
  };

  const handleCompletion = async (req: IncomingMessage, res: ServerResponse, raw: string): Promise<void> => {
    let body: Record<string, unknown>;
    try {
      body = JSON.parse(raw) as Record<string, unknown>;
    } catch {
      sendError(res, 400, "mock model: the request body is not JSON");
      return;
    }
    const messages = Array.isArray(body.messages) ? body.messages.map(toMockMessage) : [];
    const tools = Array.isArray(body.tools)
      ? body.tools.map((t) => String((t as { function?: { name?: unknown } }).function?.name ?? ""))
      : [];
    const last = [...messages].reverse().find((m) => m.role === "user" || m.role === "tool");
    const request: MockRequest = {
      index: requests.length,
      path: req.url ?? "",
      body,
      messages,
      tools,
      last,
      rule: null,
      outcome: "streaming",
    };
    requests.push(request);
    changes.emit("change");

    const picked = pick(request);
    if (picked === undefined) {
      finish(request, "noRule");
      sendError(res, 500, `mock model: no rule matched request ${request.index} (last ${last?.role ?? "message"}: ${JSON.stringify((last?.text ?? "").slice(0, 200))})`);
      return;
    }
    request.rule = picked.name;
    const answer = resolveReply(typeof picked.rule.reply === "function" ? picked.rule.reply(request) : picked.rule.reply, request);
    if (answer.kind === "httpError") {
      finish(request, "httpError");
      sendError(res, answer.status, answer.message);
      return;
    }

    const model = typeof body.model === "string" ? body.model : "mock-model";
    const id = `chatcmpl-mock-${request.index}`;
    if (body.stream === false) {
      finish(request, "completed");
      sendWhole(res, id, model, answer, () => `call_mock_${++callCounter}`);
      return;
    }

    let closed = false;
    res.on("close", () => {
      closed = true;
      finish(request, "clientClosed");
    });
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
    const write = (delta: Record<string, unknown>, finishReason: string | null = null): void => {
      res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: now(), model, choices: [{ index: 0, delta, finish_reason: finishReason }] })}\n\n`);
    };
    const pause = async (ms: number | undefined): Promise<void> => {
      if (ms !== undefined && ms > 0) await new Promise((r) => setTimeout(r, ms));
    };

    write({ role: "assistant", content: "" });
    if (answer.kind === "dropConnection") {
      write({ content: answer.text.slice(0, Math.ceil(answer.text.length / 2)) });
      finish(request, "dropped");
      res.destroy();
      return;
    }
    const text = answer.text ?? "";
    const size = answer.kind === "text" ? (answer.chunkChars ?? 16) : 16;
    for (let at = 0; at < text.length; at += size) {
      if (closed) return;
      write({ content: text.slice(at, at + size) });
      await pause(answer.delayMs);
    }
    if (answer.kind === "toolCalls") {
      for (const [index, call] of answer.calls.entries()) {
        if (closed) return;
        const args = typeof call.arguments === "string" ? call.arguments : JSON.stringify(call.arguments);
        const callId = call.id ?? `call_mock_${++callCounter}`;
        write({ tool_calls: [{ index, id: callId, type: "function", function: { name: call.name, arguments: "" } }] });
        const half = Math.ceil(args.length / 2);
        write({ tool_calls: [{ index, function: { arguments: args.slice(0, half) } }] });
        await pause(answer.delayMs);
        if (closed) return;
        write({ tool_calls: [{ index, function: { arguments: args.slice(half) } }] });
      }
    }
    if (closed) return;
    write({}, answer.kind === "toolCalls" ? "tool_calls" : "stop");
    res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created: now(), model, choices: [], usage: USAGE })}\n\n`);
    // Recorded before the last bytes leave, so a client that saw the end finds the outcome.
    finish(request, "completed");
    res.write("data: [DONE]\n\n");
    res.end();
  };

  const server: Server = createServer((req, res) => {
    let raw = "";
    req.setEncoding("utf8");
    req.on("data", (chunk: string) => (raw += chunk));
    req.on("end", () => {
      const path = req.url ?? "";
      if (req.method === "POST" && /\/chat\/completions$/.test(path)) {
        handleCompletion(req, res, raw).catch((error: unknown) => {
          res.destroy(error instanceof Error ? error : new Error(String(error)));
        });
      } else if (req.method === "GET" && /\/models$/.test(path)) {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ object: "list", data: [{ id: "mock-model", object: "model", owned_by: "mock" }] }));
      } else {
        sendError(res, 404, `mock model: no route ${req.method} ${path}`);
      }
    });
  });
  await new Promise<void>((resolvePromise, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolvePromise());
  });
  const port = (server.address() as AddressInfo).port;

  return {
    port,
    baseUrl: `http://127.0.0.1:${port}/v1`,
    requests,
    setRules(next: MockRule[]): void {
      rules = next;
      uses = new Map();
    },
    waitForRequest(predicate, timeoutMs = 15_000, what = "a matching request"): Promise<MockRequest> {
      return new Promise((resolvePromise, reject) => {
        const check = (): boolean => {
          const hit = requests.find(predicate);
          if (hit === undefined) return false;
          clearTimeout(timer);
          changes.off("change", check);
          resolvePromise(hit);
          return true;
        };
        const timer = setTimeout(() => {
          changes.off("change", check);
          const seen = requests.map((r) => `#${r.index} ${r.rule ?? "no rule"} ${r.outcome}`).join("; ");
          reject(new Error(`mock model: timed out after ${timeoutMs} ms waiting for ${what}; requests: ${seen || "none"}`));
        }, timeoutMs);
        if (!check()) changes.on("change", check);
      });
    },
    close(): Promise<void> {
      return new Promise((resolvePromise) => {
        server.closeAllConnections();
        server.close(() => resolvePromise());
      });
    },
  };
}

const USAGE = { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 };
const now = (): number => Math.floor(Date.now() / 1000);

function sendError(res: ServerResponse, status: number, message: string): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify({ error: { message, type: "mock_error", code: status } }));
}

function sendWhole(res: ServerResponse, id: string, model: string, answer: MockReply, nextId: () => string): void {
  const message =
    answer.kind === "toolCalls"
      ? {
          role: "assistant",
          content: answer.text ?? null,
          tool_calls: answer.calls.map((call) => ({
            id: call.id ?? nextId(),
            type: "function",
            function: { name: call.name, arguments: typeof call.arguments === "string" ? call.arguments : JSON.stringify(call.arguments) },
          })),
        }
      : { role: "assistant", content: answer.kind === "text" || answer.kind === "dropConnection" ? answer.text : "" };
  res.writeHead(200, { "content-type": "application/json" });
  res.end(
    JSON.stringify({
      id,
      object: "chat.completion",
      created: now(),
      model,
      choices: [{ index: 0, message, finish_reason: answer.kind === "toolCalls" ? "tool_calls" : "stop" }],
      usage: USAGE,
    }),
  );
}

function toMockMessage(raw: unknown): MockMessage {
  const m = (raw ?? {}) as Record<string, unknown>;
  const content = m.content;
  const text =
    typeof content === "string"
      ? content
      : Array.isArray(content)
        ? content.map((part) => (typeof (part as { text?: unknown }).text === "string" ? (part as { text: string }).text : "")).join("")
        : "";
  const message: MockMessage = { role: String(m.role ?? ""), text };
  if (Array.isArray(m.tool_calls)) {
    message.toolCalls = m.tool_calls.map((c) => {
      const call = c as { id?: unknown; function?: { name?: unknown; arguments?: unknown } };
      return { id: String(call.id ?? ""), name: String(call.function?.name ?? ""), arguments: String(call.function?.arguments ?? "") };
    });
  }
  if (typeof m.tool_call_id === "string") message.toolCallId = m.tool_call_id;
  return message;
}
