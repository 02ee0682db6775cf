/**
 * `@pi-workflows/sdk/client`: `WorkflowClient`, the one TypeScript client of
 * the pi-workflows server (client.v1 over the user-only Unix socket).
 */
export {
  COMPLETE_VIEW_ATTEMPTS,
  MAX_PAGE_BYTES,
  STATE_CHANGING_OPERATIONS,
  WorkflowClient,
  accepted,
  defaultHome,
  sharedWorkflowClient,
  socketPathOf,
} from "./client.js";
export type {
  Accepted,
  CommandOptions,
  ConnectOptions,
  PagesSpec,
  RequestOptions,
  RequestSpec,
  Settled,
  SubscribeOptions,
  WorkflowClientOptions,
} from "./client.js";
export { ContentAssembler, MAX_CONTENT_CHUNK, digestOf } from "./content.js";
export { WorkflowClientError } from "./errors.js";
export type { WorkflowClientErrorDetails } from "./errors.js";
export { LiveRunView, LiveViewError, applyPatch } from "./live.js";
export { Subscription, judgeEvent } from "./subscription.js";
export type { EventVerdict, SubscriptionEvent } from "./subscription.js";
export { PACKAGE_VERSION, PROTOCOL_VERSION } from "./version.js";
