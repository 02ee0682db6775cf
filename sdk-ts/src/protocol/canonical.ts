/**
 * Canonical JSON (RFC 8785) and the "canonical on the wire" rule: a text is
 * accepted only when canonicalize(JSON.parse(text)) reproduces it exactly.
 * That one comparison rejects duplicate keys, 1.0, 1e2, -0, integers a
 * double cannot hold exactly, needless escapes, whitespace, a byte-order
 * mark and unsorted keys; `canonicalize` throws on lone surrogates and the
 * fatal UTF-8 decoder rejects invalid UTF-8.
 */
import canonicalizeJson from "canonicalize";

import type { JsonValue } from "../generated/types.js";
import { NON_CANONICAL, NOT_ENCODABLE, TOO_DEEP } from "./errors.js";

/** The deepest allowed nesting of arrays and objects (top-level object = 1). */
export const MAX_DEPTH = 64;

const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const encoder = new TextEncoder();

/** The canonical text of a JSON value. Throws `SafeError(internal)` for values JSON cannot hold. */
export function canonicalString(value: unknown): string {
  let text: string | undefined;
  try {
    text = canonicalizeJson(value);
  } catch {
    throw NOT_ENCODABLE();
  }
  if (text === undefined) {
    throw NOT_ENCODABLE();
  }
  return text;
}

/** The canonical UTF-8 bytes of a JSON value. */
export function canonicalize(value: unknown): Uint8Array {
  return encoder.encode(canonicalString(value));
}

/** Whether `bytes` is exactly the canonical form of the JSON it encodes. */
export function isCanonical(bytes: Uint8Array): boolean {
  try {
    parseCanonical(bytes);
    return true;
  } catch {
    return false;
  }
}

/** Parses `bytes`, requiring the nesting limit and exact canonical form. */
export function parseCanonical(bytes: Uint8Array): JsonValue {
  checkDepth(bytes);
  let text: string;
  let value: JsonValue;
  try {
    text = decoder.decode(bytes);
    value = JSON.parse(text) as JsonValue;
  } catch {
    throw NON_CANONICAL();
  }
  let canonical: string;
  try {
    canonical = canonicalString(value);
  } catch {
    // canonicalize rejects lone surrogates (String.prototype.isWellFormed).
    throw NON_CANONICAL();
  }
  // The decoder is fatal, so equal strings mean equal bytes.
  if (canonical !== text) {
    throw NON_CANONICAL();
  }
  return value;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/** Arrays and objects nested in a JSON value (a scalar is 0, `{}` is 1), as `nestingDepth` counts its text. */
export function jsonDepth(value: unknown): number {
  let deepest = 0;
  const stack: [unknown, number][] = [[value, 0]];
  for (let item = stack.pop(); item !== undefined; item = stack.pop()) {
    const [node, depth] = item;
    if (typeof node !== "object" || node === null) continue;
    const here = depth + 1;
    if (here > deepest) deepest = here;
    for (const child of Array.isArray(node) ? node : Object.values(node)) stack.push([child, here]);
  }
  return deepest;
}

/** The deepest nesting of arrays and objects in JSON text (a scalar is 0, `{}` is 1), counted as `checkDepth` counts it. */
export function nestingDepth(bytes: Uint8Array): number {
  let depth = 0;
  let deepest = 0;
  let inString = false;
  let escaped = false;
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i]!;
    if (inString) {
      if (escaped) {
        escaped = false;
      } else if (b === BACKSLASH) {
        escaped = true;
      } else if (b === QUOTE) {
        inString = false;
      }
      continue;
    }
    if (b === QUOTE) {
      inString = true;
    } else if (b === 0x7b || b === 0x5b) {
      depth++;
      if (depth > deepest) deepest = depth;
    } else if ((b === 0x7d || b === 0x5d) && depth > 0) {
      depth--;
    }
  }
  return deepest;
}

/**
 * Rejects text whose arrays and objects nest deeper than MAX_DEPTH: a byte
 * scan that skips string contents, run before the parser.
 */
export function checkDepth(bytes: Uint8Array): void {
  if (nestingDepth(bytes) > MAX_DEPTH) {
    throw TOO_DEEP();
  }
}
