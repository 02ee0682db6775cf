/** The workflow authoring API (`@pi-workflows/sdk`). */
export { defineWorkflow, includeWorkflow, isWorkflowDefinition, RESERVED_WORKFLOW_NAMES } from "./define.js";
export type { IncludeOptions } from "./define.js";
export {
  action,
  agent,
  checkpoint,
  choice,
  compute,
  decision,
  decisionEdge,
  defineHumanChoices,
  humanDecision,
  humanDecisionEdge,
  isWorkflowNode,
  notify,
  shell,
  textInput,
} from "./nodes.js";
export type { DecisionOptions } from "./nodes.js";
export { appendStepContract, DEFAULT_EXPECTED_OUTPUT } from "./contract.js";
export { compileWorkflow, sha256Digest, timeoutOf } from "./compile.js";
export type { CompileHost, CompiledMount, CompiledNode, CompiledWorkflow, LoadedWorkflow } from "./compile.js";
export { IncludeCycleError, WorkflowDefinitionError } from "./errors.js";
export { assertJsonRoundTrip, normalizeOutput, parseTolerantJson } from "./json.js";
export * from "./types.js";
