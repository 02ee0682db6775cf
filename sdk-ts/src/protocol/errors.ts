import type { ErrorCode, SafeError as WireSafeError } from "../generated/types.js";

/**
 * The one safe error of the protocol layer: a closed code and a static
 * message chosen by this module. It never carries text derived from the
 * frame (no parser or validator messages, field names or values).
 */
export class SafeError extends Error {
  readonly code: ErrorCode;

  constructor(code: ErrorCode, message: string) {
    super(message);
    this.name = "SafeError";
    this.code = code;
  }

  /** The wire form for a response or reply. */
  toWire(): WireSafeError {
    return { code: this.code, message: this.message };
  }
}

// The same codes and messages as the Rust crate (protocol/src/error.rs).
export const TOO_LARGE = (): SafeError => new SafeError("frameTooLarge", "frame exceeds 1 MiB including its newline");
export const UNTERMINATED = (): SafeError => new SafeError("malformedFrame", "frame does not end with a newline");
export const CARRIAGE_RETURN = (): SafeError => new SafeError("malformedFrame", "frame contains a carriage return");
export const EMBEDDED_NEWLINE = (): SafeError => new SafeError("malformedFrame", "frame contains more than one line");
export const TOO_DEEP = (): SafeError => new SafeError("nestingTooDeep", "frame nests deeper than 64 levels");
export const NON_CANONICAL = (): SafeError => new SafeError("nonCanonical", "frame is not canonical JSON (RFC 8785)");
export const SCHEMA_INVALID = (): SafeError => new SafeError("schemaInvalid", "frame does not match the protocol schema");
export const NOT_ENCODABLE = (): SafeError => new SafeError("internal", "value cannot be encoded as canonical JSON");
