/**
 * `@pi-workflows/sdk`: the workflow authoring API (`defineWorkflow`, node
 * constructors, edges, includes). The wire protocol is also exported alone as
 * `@pi-workflows/sdk/protocol`, and the runner as `@pi-workflows/sdk/runner`.
 */
export * from "./authoring/index.js";
export * as protocol from "./protocol/index.js";
