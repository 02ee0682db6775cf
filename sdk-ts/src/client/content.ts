/**
 * Verified content hydration: a `ContentReference` is read in chunks of at
 * most 512 KiB (`view.content`) and the assembled bytes are checked against
 * the digest in the reference AND the digest every chunk response names.
 *
 * Invariants:
 * - Each chunk must echo the requested reference and offset, decode as
 *   strict base64, hold at most the requested length, and make progress.
 * - The assembled length must equal `reference.bytes`, and SHA-256 of the
 *   assembled bytes must equal `reference.digest` and every chunk's
 *   `digest`; any mismatch is one `digestMismatch` error. No unverified
 *   bytes are ever returned.
 */
import { createHash } from "node:crypto";

import type { ContentChunk, ContentReference, ViewContentPayload } from "../generated/types.js";
import { WorkflowClientError } from "./errors.js";

/** The largest chunk one `view.content` request asks for: 512 KiB. */
export const MAX_CONTENT_CHUNK = 512 * 1024;

const mismatch = (what: string): WorkflowClientError =>
  new WorkflowClientError("digestMismatch", `referenced content failed verification: ${what}; retry, and report it if it persists`);

/** `sha256:<hex>` of `bytes`. */
export function digestOf(bytes: Uint8Array): string {
  return "sha256:" + createHash("sha256").update(bytes).digest("hex");
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** Assembles and verifies one referenced value, chunk by chunk. */
export class ContentAssembler {
  readonly reference: ContentReference;
  private readonly parts: Uint8Array[] = [];
  private readonly digests = new Set<string>();
  private offset = 0;
  private done = false;

  constructor(reference: ContentReference) {
    this.reference = reference;
    if (reference.bytes === 0) this.done = true;
  }

  /** The next request payload, or null when every byte was received. */
  nextRequest(): ViewContentPayload | null {
    if (this.done) return null;
    return {
      reference: this.reference,
      offset: this.offset,
      length: Math.min(MAX_CONTENT_CHUNK, this.reference.bytes - this.offset),
    };
  }

  /** Accepts the chunk answering `nextRequest()`. Throws `digestMismatch` (or `contentUnavailable` for no progress). */
  accept(chunk: ContentChunk): void {
    const request = this.nextRequest();
    if (request === null) throw mismatch("more chunks than the reference holds");
    const ref = chunk.reference;
    if (ref.digest !== this.reference.digest || ref.bytes !== this.reference.bytes || ref.mediaType !== this.reference.mediaType) {
      throw mismatch("the server answered for another reference");
    }
    if (chunk.offset !== request.offset) throw mismatch("the chunk starts at another offset");
    if (!BASE64.test(chunk.data) || chunk.data.length % 4 !== 0) throw mismatch("the chunk is not base64");
    const bytes = Buffer.from(chunk.data, "base64");
    if (bytes.toString("base64") !== chunk.data) throw mismatch("the chunk is not canonical base64");
    if (bytes.length > request.length) throw mismatch("the chunk is longer than requested");
    this.digests.add(chunk.digest);
    this.parts.push(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length));
    this.offset += bytes.length;
    if (chunk.final) {
      if (this.offset !== this.reference.bytes) throw mismatch("the content is shorter than the reference says");
      this.done = true;
      return;
    }
    if (this.offset >= this.reference.bytes) throw mismatch("the server did not mark the last chunk final");
    if (bytes.length === 0) {
      throw new WorkflowClientError("contentUnavailable", "the server returned an empty chunk before the end of referenced content; retry");
    }
  }

  /** The verified bytes. Throws `digestMismatch` unless complete and matching both digests. */
  finish(): Uint8Array {
    if (!this.done) throw mismatch("the content is incomplete");
    const assembled = new Uint8Array(this.offset);
    let at = 0;
    for (const part of this.parts) {
      assembled.set(part, at);
      at += part.length;
    }
    const actual = digestOf(assembled);
    if (actual !== this.reference.digest) throw mismatch("the bytes do not match the reference digest");
    for (const digest of this.digests) {
      if (digest !== actual) throw mismatch("the bytes do not match the digest of a chunk response");
    }
    return assembled;
  }
}
