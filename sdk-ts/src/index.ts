/** `@pi-workflows/sdk`. The wire protocol is also exported alone as `@pi-workflows/sdk/protocol`. */
export * as protocol from "./protocol/index.js";
