/**
 * Verified assembly of referenced content: a `ContentReference` is read in
 * parts of at most 512 KiB (`view.content` on the client channel,
 * `content.read` on the runner channel) and the assembled bytes are checked
 * against the digest in the reference and every digest a part names.
 *
 * Invariants:
 * - Each part must echo the requested reference and offset, decode as
 *   canonical base64, hold at most the requested length, and make progress.
 * - The assembled length must equal `reference.bytes`, and SHA-256 of the
 *   assembled bytes must equal `reference.digest` (and every part's
 *   `digest`, where the channel sends one); any mismatch is one error made
 *   by the reader's `fail`. No unverified bytes are ever returned.
 */
import { createHash } from "node:crypto";

import type { ContentReference } from "../generated/types.js";

/** The largest part one read asks for: 512 KiB. */
export const MAX_CONTENT_CHUNK = 512 * 1024;

/** `sha256:<hex>` of `bytes`. */
export function digestOf(bytes: Uint8Array): string {
  return "sha256:" + createHash("sha256").update(bytes).digest("hex");
}

/** One part as a server sent it. */
export interface ContentPart {
  reference: ContentReference;
  offset: number;
  data: string;
  final: boolean;
  /** The digest of the whole content, when the channel names it. */
  digest?: string;
}

/** The next part to ask for. */
export interface PartRequest {
  reference: ContentReference;
  offset: number;
  length: number;
}

/** How a reader turns a failure into its own error: `digestMismatch` (verification) or `contentUnavailable` (no progress). */
export type ContentFail = (code: "digestMismatch" | "contentUnavailable", what: string) => Error;

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** Assembles and verifies one referenced value, part by part. */
export class PartAssembler {
  readonly reference: ContentReference;
  private readonly parts: Uint8Array[] = [];
  private readonly digests = new Set<string>();
  private offset = 0;
  private done = false;

  constructor(
    reference: ContentReference,
    private readonly fail: ContentFail,
  ) {
    this.reference = reference;
    if (reference.bytes === 0) this.done = true;
  }

  /** The next part to ask for, or null when every byte was received. */
  nextRequest(): PartRequest | null {
    if (this.done) return null;
    return {
      reference: this.reference,
      offset: this.offset,
      length: Math.min(MAX_CONTENT_CHUNK, this.reference.bytes - this.offset),
    };
  }

  /** Accepts the part answering `nextRequest()`. */
  accept(part: ContentPart): void {
    const request = this.nextRequest();
    if (request === null) throw this.fail("digestMismatch", "more chunks than the reference holds");
    const ref = part.reference;
    if (ref.digest !== this.reference.digest || ref.bytes !== this.reference.bytes || ref.mediaType !== this.reference.mediaType) {
      throw this.fail("digestMismatch", "the server answered for another reference");
    }
    if (part.offset !== request.offset) throw this.fail("digestMismatch", "the chunk starts at another offset");
    if (!BASE64.test(part.data) || part.data.length % 4 !== 0) throw this.fail("digestMismatch", "the chunk is not base64");
    const bytes = Buffer.from(part.data, "base64");
    if (bytes.toString("base64") !== part.data) throw this.fail("digestMismatch", "the chunk is not canonical base64");
    if (bytes.length > request.length) throw this.fail("digestMismatch", "the chunk is longer than requested");
    if (part.digest !== undefined) this.digests.add(part.digest);
    this.parts.push(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length));
    this.offset += bytes.length;
    if (part.final) {
      if (this.offset !== this.reference.bytes) throw this.fail("digestMismatch", "the content is shorter than the reference says");
      this.done = true;
      return;
    }
    if (this.offset >= this.reference.bytes) throw this.fail("digestMismatch", "the server did not mark the last chunk final");
    if (bytes.length === 0) {
      throw this.fail("contentUnavailable", "the server returned an empty chunk before the end of referenced content");
    }
  }

  /** The verified bytes; throws unless complete and matching every digest. */
  finish(): Uint8Array {
    if (!this.done) throw this.fail("digestMismatch", "the content is incomplete");
    const assembled = new Uint8Array(this.offset);
    let at = 0;
    for (const part of this.parts) {
      assembled.set(part, at);
      at += part.length;
    }
    const actual = digestOf(assembled);
    if (actual !== this.reference.digest) throw this.fail("digestMismatch", "the bytes do not match the reference digest");
    for (const digest of this.digests) {
      if (digest !== actual) throw this.fail("digestMismatch", "the bytes do not match the digest of a chunk response");
    }
    return assembled;
  }
}
