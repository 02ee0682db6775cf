/**
 * Fuzz comparison of the TypeScript and Rust decoders: fast-check generates
 * inputs for every channel (fixture frames mutated byte by byte, fixture
 * values with one leaf replaced, random bytes, deep nesting around the
 * 64-level limit, non-canonical spellings of valid frames), both
 * implementations decide each one, and their verdict lines must be
 * identical: the same accept/reject, the same kind or error code, and the
 * same SHA-256 of the re-encoded bytes.
 *
 * Run by scripts/conformance.sh (after the corpus comparison), with
 * CONFORMANCE_RS naming the conformance-rs binary (`--decide` reads
 * `CHANNEL<TAB>HEX` lines and prints its verdicts). FUZZ_SEED replays a run
 * (its seed is printed); FUZZ_RUNS sets the inputs per generator.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import fc from "fast-check";

import { canonicalString } from "../src/protocol/index.js";
import { verdictLine } from "./verdicts.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const fixtures = path.resolve(here, "../../../protocol/fixtures/frames");
const seed = process.env.FUZZ_SEED === undefined ? Date.now() % 2 ** 31 : Number(process.env.FUZZ_SEED);
const runs = Number(process.env.FUZZ_RUNS ?? 1500);

const FRAME_CHANNELS = ["client", "runner", "server"];
const DOC_CHANNELS = ["launch", "run-view"];
const CHANNELS = [...FRAME_CHANNELS, ...DOC_CHANNELS, "canonical"];
const isFrameChannel = (channel: string): boolean => FRAME_CHANNELS.includes(channel);

type Case = { channel: string; bytes: Uint8Array };

/** Fixture inputs small enough to mutate, per corpus channel. */
function loadSeeds(): Map<string, Uint8Array[]> {
  const seeds = new Map<string, Uint8Array[]>();
  for (const channel of [...FRAME_CHANNELS, ...DOC_CHANNELS]) {
    const dir = path.join(fixtures, channel);
    const inputs = fs
      .readdirSync(dir)
      .filter((n) => n.endsWith(".in"))
      .sort()
      .map((n) => new Uint8Array(fs.readFileSync(path.join(dir, n))))
      .filter((b) => b.length <= 16384);
    seeds.set(channel, inputs);
  }
  return seeds;
}

/** The JSON value of a fixture input that parses (accepted or not). */
function valueOf(bytes: Uint8Array): unknown {
  const text = Buffer.from(bytes).toString("utf8").replace(/\n$/, "");
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** The canonical text of a value, or its JSON.stringify text when it has none (for example -0). */
function canonicalOr(value: unknown): string {
  try {
    return canonicalString(value);
  } catch {
    return JSON.stringify(value) ?? "null";
  }
}

const enc = (text: string): Uint8Array => new Uint8Array(Buffer.from(text, "utf8"));
const withNewline = (channel: string, text: string): Uint8Array =>
  enc(isFrameChannel(channel) ? `${text}\n` : text);

const INTERESTING = [0x22, 0x5c, 0x7b, 0x7d, 0x5b, 0x5d, 0x2c, 0x3a, 0x30, 0x2d, 0x2e, 0x65, 0x0a, 0x0d, 0x20, 0x80, 0xc3, 0xed, 0xff, 0x00];

/** Byte-level mutations of a fixture input. */
function mutated(seeds: Map<string, Uint8Array[]>): fc.Arbitrary<Case> {
  const mutation = fc.oneof(
    fc.record({ op: fc.constant("flip" as const), at: fc.nat(), bit: fc.integer({ min: 0, max: 7 }) }),
    fc.record({ op: fc.constant("insert" as const), at: fc.nat(), byte: fc.oneof(fc.constantFrom(...INTERESTING), fc.integer({ min: 0, max: 255 })) }),
    fc.record({ op: fc.constant("delete" as const), at: fc.nat(), len: fc.integer({ min: 1, max: 8 }) }),
    fc.record({ op: fc.constant("repeat" as const), at: fc.nat(), len: fc.integer({ min: 1, max: 16 }) }),
  );
  return fc
    .record({
      channel: fc.constantFrom(...FRAME_CHANNELS, ...DOC_CHANNELS),
      pick: fc.nat(),
      mutations: fc.array(mutation, { minLength: 1, maxLength: 4 }),
      asCanonical: fc.boolean(),
    })
    .map(({ channel, pick, mutations, asCanonical }) => {
      const list = seeds.get(channel)!;
      let bytes = Array.from(list[pick % list.length]!);
      for (const m of mutations) {
        const at = bytes.length === 0 ? 0 : m.at % bytes.length;
        if (m.op === "flip" && bytes.length > 0) {
          bytes[at] = bytes[at]! ^ (1 << m.bit);
        } else if (m.op === "insert") {
          bytes.splice(at, 0, m.byte);
        } else if (m.op === "delete") {
          bytes.splice(at, m.len);
        } else if (m.op === "repeat") {
          bytes.splice(at, 0, ...bytes.slice(at, at + m.len));
        }
      }
      if (asCanonical && isFrameChannel(channel)) {
        // The same text as a bare document, for the canonical-JSON check.
        bytes = bytes.filter((b) => b !== 0x0a);
        return { channel: "canonical", bytes: new Uint8Array(bytes) };
      }
      return { channel, bytes: new Uint8Array(bytes) };
    });
}

/** Replaces the `n`-th leaf (or a whole member) of a JSON value. */
function replaceLeaf(value: unknown, n: { left: number }, replacement: unknown, drop: boolean): unknown {
  if (Array.isArray(value)) {
    return value.map((v) => replaceLeaf(v, n, replacement, drop));
  }
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) {
      if (n.left-- === 0) {
        if (!drop) {
          out[k] = replacement;
        }
        continue;
      }
      out[k] = replaceLeaf(v, n, replacement, drop);
    }
    return out;
  }
  return value;
}

/** Valid fixture values with one member replaced by arbitrary JSON or dropped, re-canonicalized: schema-level differences. */
function schemaMutated(seeds: Map<string, Uint8Array[]>): fc.Arbitrary<Case> {
  const replacement = fc.oneof(
    fc.jsonValue({ maxDepth: 2 }),
    fc.constantFrom(null, "", 0, -1, 1.5, 2 ** 53, "x".repeat(600), {}, [], true, "sha256:" + "a".repeat(64)),
  );
  return fc
    .record({
      channel: fc.constantFrom(...FRAME_CHANNELS, ...DOC_CHANNELS),
      pick: fc.nat(),
      at: fc.nat({ max: 64 }),
      replacement,
      drop: fc.boolean(),
      extra: fc.option(fc.tuple(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 1 })), { freq: 5 }),
    })
    .map(({ channel, pick, at, replacement, drop, extra }) => {
      const list = seeds.get(channel)!;
      let value = valueOf(list[pick % list.length]!);
      value = replaceLeaf(value, { left: at }, replacement, drop);
      if (extra !== null && value !== null && typeof value === "object" && !Array.isArray(value)) {
        (value as Record<string, unknown>)[extra[0]] = extra[1];
      }
      return { channel, bytes: withNewline(channel, canonicalOr(value)) };
    });
}

/** Valid fixture values spelled non-canonically: whitespace, key order, number and string spellings, duplicate keys. */
function nonCanonical(seeds: Map<string, Uint8Array[]>): fc.Arbitrary<Case> {
  return fc
    .record({
      channel: fc.constantFrom(...FRAME_CHANNELS, ...DOC_CHANNELS),
      pick: fc.nat(),
      form: fc.constantFrom("indent", "reverse-keys", "float", "exponent", "escape", "duplicate", "bom", "trailing-space", "crlf"),
    })
    .map(({ channel, pick, form }) => {
      const list = seeds.get(channel)!;
      const value = valueOf(list[pick % list.length]!);
      const canonical = value === undefined ? "{}" : canonicalOr(value);
      let text: string;
      switch (form) {
        case "indent":
          text = JSON.stringify(value, null, 1) ?? "null";
          break;
        case "reverse-keys": {
          const reverse = (v: unknown): unknown =>
            Array.isArray(v)
              ? v.map(reverse)
              : v !== null && typeof v === "object"
                ? Object.fromEntries(Object.entries(v).reverse().map(([k, x]) => [k, reverse(x)]))
                : v;
          text = JSON.stringify(reverse(value)) ?? "null";
          break;
        }
        case "float":
          text = canonical.replace(/:(\d+)([,}])/, ":$1.0$2");
          break;
        case "exponent":
          text = canonical.replace(/:(\d+)([,}])/, ":$1e0$2");
          break;
        case "escape":
          text = canonical.replace(/"([a-z])/, (_m, c: string) => `"\\u00${c.charCodeAt(0).toString(16)}`);
          break;
        case "duplicate":
          text = canonical.replace(/^\{("[^"]*":("[^"]*"|[^,{}[\]]*)),/, "{$1,$1,");
          break;
        case "bom":
          text = `\ufeff${canonical}`;
          break;
        case "trailing-space":
          text = `${canonical} `;
          break;
        default:
          text = `${canonical}\r`;
      }
      return { channel, bytes: withNewline(channel, text) };
    });
}

/** Nesting around the limit, inside a valid envelope or bare, with brackets in strings. */
const deepNesting: fc.Arbitrary<Case> = fc
  .record({
    channel: fc.constantFrom(...CHANNELS),
    depth: fc.integer({ min: 58, max: 70 }),
    objects: fc.boolean(),
    bracketString: fc.boolean(),
    unclosed: fc.boolean(),
  })
  .map(({ channel, depth, objects, bracketString, unclosed }) => {
    const leaf = bracketString ? '"[[{{"' : "1";
    let inner = leaf;
    for (let i = 0; i < depth; i++) {
      inner = objects ? `{"a":${inner}}` : `[${inner}]`;
    }
    if (unclosed) {
      inner = inner.slice(0, -1);
    }
    const text =
      channel === "canonical"
        ? inner
        : `{"payload":${inner},"requestId":"r-1","type":"request","operation":"run.get","version":1}`;
    return { channel, bytes: withNewline(channel, text) };
  });

/** Random bytes and random JSON on every channel. */
const randomInput: fc.Arbitrary<Case> = fc.oneof(
  fc.record({ channel: fc.constantFrom(...CHANNELS), bytes: fc.uint8Array({ maxLength: 256 }) }),
  fc
    .record({ channel: fc.constantFrom(...CHANNELS), value: fc.jsonValue({ maxDepth: 4 }), canonical: fc.boolean() })
    .map(({ channel, value, canonical }) => ({
      channel,
      bytes: withNewline(channel, canonical ? canonicalOr(value) : JSON.stringify(value)),
    })),
);

function rustVerdicts(binary: string, cases: Case[]): string[] {
  const input = cases.map((c) => `${c.channel}\t${Buffer.from(c.bytes).toString("hex")}\n`).join("");
  const out = spawnSync(binary, ["--decide"], { input, maxBuffer: 1 << 28, encoding: "utf8" });
  assert.equal(out.status, 0, `conformance-rs --decide failed: ${out.stderr}`);
  const lines = out.stdout.split("\n");
  lines.pop();
  assert.equal(lines.length, cases.length, "one Rust verdict per input");
  return lines;
}

test(`the TypeScript and Rust decoders give the same verdicts on generated inputs (seed ${seed})`, () => {
  const binary = process.env.CONFORMANCE_RS;
  assert.ok(binary !== undefined && fs.existsSync(binary), "set CONFORMANCE_RS to the conformance-rs binary (scripts/conformance.sh does)");
  const seeds = loadSeeds();
  const generators: [string, fc.Arbitrary<Case>][] = [
    ["mutated fixtures", mutated(seeds)],
    ["schema-mutated fixtures", schemaMutated(seeds)],
    ["non-canonical spellings", nonCanonical(seeds)],
    ["deep nesting", deepNesting],
    ["random input", randomInput],
  ];
  const cases: Case[] = [];
  const from: string[] = [];
  generators.forEach(([name, arbitrary], i) => {
    for (const c of fc.sample(arbitrary, { seed: seed + i, numRuns: runs })) {
      cases.push(c);
      from.push(name);
    }
  });
  const ts = cases.map((c) => verdictLine(c.channel, c.bytes));
  const rust = rustVerdicts(binary, cases);
  const differ = cases.flatMap((c, i) =>
    ts[i] === rust[i] ? [] : [`${from[i]} ${c.channel} ${Buffer.from(c.bytes).toString("hex")}\n  ts:   ${ts[i]}\n  rust: ${rust[i]}`],
  );
  const accepted = ts.filter((v, i) => v.startsWith("accept") && v === rust[i]).length;
  console.log(`fuzz-parity: ${cases.length} inputs (seed ${seed}), ${accepted} accepted by both, ${differ.length} disagreements`);
  assert.deepEqual(differ.slice(0, 5), [], `${differ.length} inputs get different verdicts (FUZZ_SEED=${seed} replays)`);
});
