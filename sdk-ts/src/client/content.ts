/**
 * Verified content hydration for the client: a `ContentReference` is read
 * with `view.content` in chunks of at most 512 KiB and assembled by the
 * protocol's `PartAssembler` (protocol/content.ts), which checks every
 * chunk and the assembled bytes against the reference digest AND the digest
 * every chunk response names. Failures are `WorkflowClientError`s:
 * `digestMismatch` for verification, `contentUnavailable` for no progress.
 */
import type { ContentChunk, ContentReference, ViewContentPayload } from "../generated/types.js";
import { PartAssembler } from "../protocol/content.js";
import { WorkflowClientError } from "./errors.js";

export { MAX_CONTENT_CHUNK, digestOf } from "../protocol/content.js";

const fail = (code: "digestMismatch" | "contentUnavailable", what: string): WorkflowClientError =>
  code === "digestMismatch"
    ? new WorkflowClientError("digestMismatch", `referenced content failed verification: ${what}; retry, and report it if it persists`)
    : new WorkflowClientError("contentUnavailable", `${what}; retry`);

/** Assembles and verifies one referenced value, chunk by chunk. */
export class ContentAssembler extends PartAssembler {
  constructor(reference: ContentReference) {
    super(reference, fail);
  }

  /** The next request payload, or null when every byte was received. */
  override nextRequest(): ViewContentPayload | null {
    return super.nextRequest();
  }

  /** Accepts the chunk answering `nextRequest()`. Throws `digestMismatch` (or `contentUnavailable` for no progress). */
  override accept(chunk: ContentChunk): void {
    super.accept(chunk);
  }
}
