/**
 * `@pi-workflows/sdk/protocol`: the generated wire types and validators,
 * canonical JSON (RFC 8785), exact NDJSON framing and frame decoding.
 */
export * from "../generated/types.js";
export { MAX_DEPTH, canonicalString, canonicalize, checkDepth, isCanonical, parseCanonical } from "./canonical.js";
export { MAX_CONTENT_CHUNK, PartAssembler, digestOf } from "./content.js";
export type { ContentFail, ContentPart, PartRequest } from "./content.js";
export { SafeError } from "./errors.js";
export { FrameDecoder, MAX_FRAME_BYTES, frameContent, readFrames } from "./framing.js";
export {
  clientKind,
  decodeClientFrame,
  decodeControllerChildFrame,
  decodeControllerLaunch,
  decodeControllerServerFrame,
  decodeLaunch,
  decodeReplyResult,
  decodeRunState,
  decodeRunView,
  decodeRunnerFrame,
  decodeServerFrame,
  encodeClient,
  encodeControllerChild,
  encodeControllerLaunch,
  encodeControllerServer,
  encodeLaunch,
  encodeRunView,
  encodeRunner,
  encodeServer,
  validators,
} from "./messages.js";
export type { TypedRequest, TypedResponse, Validator } from "./messages.js";
