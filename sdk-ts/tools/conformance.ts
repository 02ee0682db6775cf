/**
 * conformance-ts: runs the shared fixture corpus (layout in
 * protocol/fixtures/README.md) against the TypeScript SDK.
 *
 * Usage: node build/tools/conformance.js [--fixtures DIR] [--emit-verdicts FILE]
 * (DIR defaults to protocol/fixtures relative to the working directory).
 * Prints one line per failing case and a final "N passed, N failed"; exits
 * non-zero on any failure. --emit-verdicts writes the same verdict lines as
 * conformance-rs, so the two can be compared byte for byte.
 */
import fs from "node:fs";
import path from "node:path";

import { canonicalize } from "../src/protocol/index.js";
import { runCase, sha256 } from "./verdicts.js";

const ES6_100K_SHA256 = "22776e6d4b49fa294a0d0f349268e5c28808fe7e0cb2bcbe28f63894e494d4c7";
const JCS_FILES = ["arrays", "french", "structures", "unicode", "values", "weird"];

class Report {
  passed = 0;
  failed = 0;
  verdicts = "";
  record(name: string, failure: string | null, verdict: string): void {
    this.verdicts += `${name}\t${verdict}\n`;
    if (failure === null) {
      this.passed++;
    } else {
      this.failed++;
      console.log(`FAIL ${name}: ${failure}`);
    }
  }
}

const bytesEqual = (a: Uint8Array, b: Uint8Array): boolean => Buffer.from(a).equals(Buffer.from(b));

function frameCases(dir: string, report: Report): void {
  const framesDir = path.join(dir, "frames");
  const channels = fs
    .readdirSync(framesDir, { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .map((d) => d.name)
    .sort();
  for (const channel of channels) {
    const channelDir = path.join(framesDir, channel);
    const inputs = fs
      .readdirSync(channelDir)
      .filter((n) => n.endsWith(".in"))
      .sort();
    for (const file of inputs) {
      const name = file.slice(0, -".in".length);
      const caseName = `${channel}/${name}`;
      const input = fs.readFileSync(path.join(channelDir, file));
      const expect = JSON.parse(fs.readFileSync(path.join(channelDir, `${name}.expect.json`), "utf8")) as {
        verdict: string;
        kind?: string;
        error?: string;
      };
      const got = runCase(channel, new Uint8Array(input));
      if (got.accept) {
        const verdict = `accept\t${got.kind}\t${sha256(got.encoded)}`;
        if (expect.verdict !== "accept") {
          report.record(caseName, `accepted as ${got.kind}, expected reject "${expect.error}"`, verdict);
          continue;
        }
        const canonicalPath = path.join(channelDir, `${name}.canonical`);
        const canonical = fs.existsSync(canonicalPath) ? fs.readFileSync(canonicalPath) : Buffer.alloc(0);
        let failure: string | null = null;
        if (got.kind !== expect.kind) {
          failure = `kind ${got.kind}, expected ${expect.kind}`;
        } else if (!bytesEqual(got.encoded, canonical)) {
          failure = "re-encoded bytes differ from .canonical";
        }
        report.record(caseName, failure, verdict);
      } else {
        const verdict = `reject\t${got.code}`;
        if (expect.verdict !== "reject") {
          report.record(caseName, `rejected with ${got.code}, expected accept`, verdict);
        } else {
          report.record(caseName, got.code === expect.error ? null : `rejected with ${got.code}, expected ${expect.error}`, verdict);
        }
      }
    }
  }
}

function jcsCases(dir: string, report: Report): void {
  const jcs = path.join(dir, "jcs");
  for (const name of JCS_FILES) {
    const caseName = `jcs/${name}`;
    const input = fs.readFileSync(path.join(jcs, "input", `${name}.json`), "utf8");
    const output = fs.readFileSync(path.join(jcs, "output", `${name}.json`));
    const outhex = Buffer.from(fs.readFileSync(path.join(jcs, "outhex", `${name}.txt`), "utf8").split(/\s+/).filter(Boolean).join(""), "hex");
    let got: Uint8Array | null = null;
    let failure: string | null = null;
    try {
      got = canonicalize(JSON.parse(input));
    } catch {
      failure = "input does not canonicalize";
    }
    if (failure === null && !outhex.equals(output)) {
      failure = "output and outhex disagree";
    } else if (failure === null && got !== null && !bytesEqual(got, output)) {
      failure = "canonical bytes differ from output";
    }
    report.record(caseName, failure, `pass\t${got === null ? "" : sha256(got)}`);
  }
  const caseName = "jcs/es6-numbers-100k";
  const data = fs.readFileSync(path.join(jcs, "es6-numbers-100k.txt"));
  const digest = sha256(data);
  const view = new DataView(new ArrayBuffer(8));
  let lines = 0;
  let bad = 0;
  let firstBad: string | null = null;
  for (const line of data.toString("utf8").split("\n")) {
    if (line === "") {
      continue;
    }
    lines++;
    const comma = line.indexOf(",");
    const bits = line.slice(0, comma);
    const expected = line.slice(comma + 1);
    view.setBigUint64(0, BigInt(`0x${bits}`));
    let got: string;
    try {
      got = Buffer.from(canonicalize(view.getFloat64(0))).toString("utf8");
    } catch {
      got = "<error>";
    }
    if (comma < 0 || got !== expected) {
      bad++;
      firstBad ??= `${bits}: got ${got}, expected ${expected}`;
    }
  }
  let failure: string | null = null;
  if (digest !== ES6_100K_SHA256) {
    failure = `corpus SHA-256 ${digest}, expected ${ES6_100K_SHA256}`;
  } else if (lines !== 100_000 || bad !== 0) {
    failure = `${bad} of ${lines} lines wrong; first: ${firstBad ?? ""}`;
  }
  report.record(caseName, failure, `pass\t${lines}`);
}

function main(): number {
  let fixtures = "protocol/fixtures";
  let emit: string | null = null;
  const args = process.argv.slice(2);
  for (let i = 0; i < args.length; i += 2) {
    const value = args[i + 1];
    if (args[i] === "--fixtures" && value !== undefined) {
      fixtures = value;
    } else if (args[i] === "--emit-verdicts" && value !== undefined) {
      emit = value;
    } else {
      console.error("usage: conformance-ts [--fixtures DIR] [--emit-verdicts FILE]");
      return 2;
    }
  }
  const report = new Report();
  frameCases(fixtures, report);
  jcsCases(fixtures, report);
  if (emit !== null) {
    fs.writeFileSync(emit, report.verdicts);
  }
  console.log(`${report.passed} passed, ${report.failed} failed`);
  return report.failed === 0 ? 0 : 1;
}

process.exitCode = main();
