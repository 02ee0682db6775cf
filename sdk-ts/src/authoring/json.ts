/**
 * JSON rules for outputs: the JSON round trip every output must survive,
 * well-formed strings (canonical JSON, RFC 8785, cannot encode a lone UTF-16
 * surrogate, which the round trip keeps), and the tolerant parsing of string
 * agent outputs (reference §1.4). The wire's own limits (64 levels, 1 MiB a
 * frame) depend on the message carrying a value; the runner checks them on
 * the exact frame (`runner/channel.ts`).
 */
import { isDeepStrictEqual } from "node:util";

/** The most candidate positions the tolerant parser tries. */
export const MAX_JSON_SCANS = 64;

/** Throws unless `value` survives `JSON.parse(JSON.stringify(value))` unchanged. `undefined` is the caller's to map to `null`. */
export function assertJsonRoundTrip(value: unknown, what: string): void {
  let encoded: string | undefined;
  try {
    encoded = JSON.stringify(value);
  } catch (error) {
    throw new Error(`${what} cannot be encoded as JSON: ${error instanceof Error ? error.message : String(error)}`);
  }
  if (encoded === undefined || !isDeepStrictEqual(JSON.parse(encoded), value)) {
    throw new Error(
      `${what} does not survive a JSON round-trip. Use plain JSON values (no functions, dates, NaN, or undefined properties).`,
    );
  }
}

const LONE_SURROGATE = /\p{Cs}/u;

/** True when `text` holds a lone UTF-16 surrogate (a well-formed pair is one code point, not Cs). */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text);
}

/** Throws when a string or key of a JSON value holds a lone UTF-16 surrogate. */
export function assertWellFormedStrings(value: unknown, what: string): void {
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const node = stack.pop();
    if (typeof node === "string") {
      if (hasLoneSurrogate(node)) {
        throw new Error(`${what} holds a string with a lone UTF-16 surrogate, which canonical JSON (RFC 8785) cannot encode`);
      }
    } else if (Array.isArray(node)) {
      for (const item of node) stack.push(item);
    } else if (typeof node === "object" && node !== null) {
      for (const [key, child] of Object.entries(node)) stack.push(key, child);
    }
  }
}

/** `undefined` becomes `null`; then the round-trip and well-formed-string rules apply. */
export function normalizeOutput(value: unknown, what: string): unknown {
  const output = value === undefined ? null : value;
  assertJsonRoundTrip(output, what);
  assertWellFormedStrings(output, what);
  return output;
}

function balancedEnd(text: string, start: number): number {
  const open = text[start];
  const close = open === "{" ? "}" : "]";
  const stack: string[] = [close];
  let inString = false;
  for (let i = start + 1; i < text.length; i += 1) {
    const c = text[i];
    if (inString) {
      if (c === "\\") i += 1;
      else if (c === '"') inString = false;
      continue;
    }
    if (c === '"') inString = true;
    else if (c === "{") stack.push("}");
    else if (c === "[") stack.push("]");
    else if (c === "}" || c === "]") {
      if (stack.pop() !== c) return -1;
      if (stack.length === 0) return i;
    }
  }
  return -1;
}

/**
 * Parses a model's string output tolerantly: strict JSON, then a fenced
 * ```json block, then the first balanced `{…}`/`[…]` candidate that parses
 * (at most 64 candidates). Returns the raw string when nothing parses.
 */
export function parseTolerantJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    // next form
  }
  const fence = /```(?:json)?[ \t]*\r?\n([\s\S]*?)```/i.exec(text);
  if (fence?.[1] !== undefined) {
    try {
      return JSON.parse(fence[1]);
    } catch {
      // next form
    }
  }
  let scans = 0;
  for (let i = 0; i < text.length && scans < MAX_JSON_SCANS; i += 1) {
    const c = text[i];
    if (c !== "{" && c !== "[") continue;
    scans += 1;
    const end = balancedEnd(text, i);
    if (end < 0) continue;
    try {
      return JSON.parse(text.slice(i, end + 1));
    } catch {
      // next candidate
    }
  }
  return text;
}
