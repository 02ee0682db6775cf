/**
 * The verdict of the TypeScript SDK on one input of one channel, as both
 * conformance runners print it (`accept<TAB>kind<TAB>sha256 of the
 * re-encoded bytes` or `reject<TAB>code`): used by conformance-ts over the
 * fixture corpus and by the fuzz comparison with conformance-rs
 * (`fuzz-parity.test.ts`). The channels are those of
 * protocol/fixtures/README.md plus `canonical` (parseCanonical alone).
 */
import { createHash } from "node:crypto";

import {
  FrameDecoder,
  SafeError,
  canonicalize,
  clientKind,
  decodeClientFrame,
  decodeLaunch,
  decodeRunView,
  decodeRunnerFrame,
  decodeServerFrame,
  encodeClient,
  encodeLaunch,
  encodeRunView,
  encodeRunner,
  encodeServer,
  parseCanonical,
} from "../src/protocol/index.js";

export type Outcome = { accept: true; kind: string; encoded: Uint8Array } | { accept: false; code: string };
type Decode = (bytes: Uint8Array) => { kind: string; encoded: Uint8Array };

export const sha256 = (b: Uint8Array): string => createHash("sha256").update(b).digest("hex");

function outcome(decode: Decode, bytes: Uint8Array): Outcome {
  try {
    const { kind, encoded } = decode(bytes);
    return { accept: true, kind, encoded };
  } catch (e) {
    if (e instanceof SafeError) {
      return { accept: false, code: e.code };
    }
    throw e;
  }
}

const decoders: Record<string, Decode> = {
  client: (b) => {
    const m = decodeClientFrame(b);
    return { kind: clientKind(m), encoded: encodeClient(m) };
  },
  runner: (b) => {
    const m = decodeRunnerFrame(b);
    return { kind: m.type, encoded: encodeRunner(m) };
  },
  server: (b) => {
    const m = decodeServerFrame(b);
    return { kind: m.type, encoded: encodeServer(m) };
  },
  launch: (b) => {
    const m = decodeLaunch(b);
    return { kind: `launch/${m.mode}`, encoded: encodeLaunch(m) };
  },
  "run-view": (b) => ({ kind: "run-view", encoded: encodeRunView(decodeRunView(b)) }),
  canonical: (b) => ({ kind: "canonical", encoded: canonicalize(parseCanonical(b)) }),
};

export function runCase(channel: string, input: Uint8Array): Outcome {
  const decode = decoders[channel];
  if (decode === undefined) {
    return { accept: false, code: `corpus error: unknown channel ${channel}` };
  }
  if (channel === "launch" || channel === "run-view" || channel === "canonical") {
    return outcome(decode, input);
  }
  const decoder = new FrameDecoder();
  const frames: Uint8Array[] = [];
  try {
    decoder.push(input);
    for (let f = decoder.nextFrame(); f !== null; f = decoder.nextFrame()) {
      frames.push(f);
    }
    decoder.finish();
  } catch (e) {
    if (e instanceof SafeError) {
      return { accept: false, code: e.code };
    }
    throw e;
  }
  if (frames.length !== 1) {
    return { accept: false, code: `corpus error: ${frames.length} frames in one case` };
  }
  return outcome(decode, frames[0]!);
}

/** The verdict line of `input` on `channel`. */
export function verdictLine(channel: string, input: Uint8Array): string {
  const got = runCase(channel, input);
  return got.accept ? `accept\t${got.kind}\t${sha256(got.encoded)}` : `reject\t${got.code}`;
}
