/**
 * Exact NDJSON framing, identical to the Rust crate:
 * - a frame is one canonical JSON text followed by exactly one "\n";
 * - a frame, including its "\n", is at most MAX_FRAME_BYTES (1 MiB);
 * - "\r" is never accepted;
 * - bytes left without a final "\n" at end of stream are an error;
 * - every error ends the connection: a FrameDecoder that failed throws the
 *   same error again and never yields another frame.
 */
import { CARRIAGE_RETURN, EMBEDDED_NEWLINE, SafeError, TOO_LARGE, UNTERMINATED } from "./errors.js";

/** The largest frame, including its newline: 1 MiB. */
export const MAX_FRAME_BYTES = 1_048_576;

const LF = 0x0a;
const CR = 0x0d;

/** Checks that `frame` is exactly one complete frame and returns its content. */
export function frameContent(frame: Uint8Array): Uint8Array {
  if (frame.length > MAX_FRAME_BYTES) {
    throw TOO_LARGE();
  }
  if (frame.length === 0 || frame[frame.length - 1] !== LF) {
    throw UNTERMINATED();
  }
  const content = frame.subarray(0, frame.length - 1);
  if (content.includes(LF)) {
    throw EMBEDDED_NEWLINE();
  }
  if (content.includes(CR)) {
    throw CARRIAGE_RETURN();
  }
  return content;
}

/** An incremental frame splitter for a byte stream. */
export class FrameDecoder {
  private buf: Uint8Array = new Uint8Array(0);
  private scanned = 0;
  private failed: SafeError | null = null;

  /** Appends bytes read from the stream. */
  push(bytes: Uint8Array): void {
    if (this.failed !== null || bytes.length === 0) {
      return;
    }
    const next = new Uint8Array(this.buf.length + bytes.length);
    next.set(this.buf, 0);
    next.set(bytes, this.buf.length);
    this.buf = next;
  }

  /** The next complete frame (content plus "\n"), or null when more bytes are needed. Throws the error that ends the connection. */
  nextFrame(): Uint8Array | null {
    if (this.failed !== null) {
      throw this.failed;
    }
    const limit = Math.min(this.buf.length, MAX_FRAME_BYTES);
    const start = Math.min(this.scanned, limit);
    const pos = this.buf.subarray(start, limit).indexOf(LF);
    if (pos < 0) {
      if (this.buf.length >= MAX_FRAME_BYTES) {
        throw this.fail(TOO_LARGE());
      }
      this.scanned = limit;
      return null;
    }
    const end = start + pos + 1;
    const frame = this.buf.slice(0, end);
    this.buf = this.buf.slice(end);
    this.scanned = 0;
    if (frame.includes(CR)) {
      throw this.fail(CARRIAGE_RETURN());
    }
    return frame;
  }

  /** Called at end of stream: bytes left without a final "\n" are an error. */
  finish(): void {
    if (this.failed !== null) {
      throw this.failed;
    }
    if (this.buf.length > 0) {
      throw this.fail(UNTERMINATED());
    }
  }

  private fail(e: SafeError): SafeError {
    this.failed = e;
    this.buf = new Uint8Array(0);
    return e;
  }
}

/** Yields the frames of a byte stream (for example a socket or child stdout); throws a SafeError that ends the connection. */
export async function* readFrames(source: AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
  const decoder = new FrameDecoder();
  for await (const chunk of source) {
    decoder.push(chunk);
    for (let frame = decoder.nextFrame(); frame !== null; frame = decoder.nextFrame()) {
      yield frame;
    }
  }
  decoder.finish();
}
