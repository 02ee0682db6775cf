/**
 * `@pi-workflows/sdk/runner`: the runner the server spawns (`pi-workflows-runner`),
 * plus workflow discovery and loading for tools that list or check workflows.
 */
export { main, resolveMode, runMode, verifySources, unwireableNodeId } from "./main.js";
export {
  BUILTIN_WORKFLOWS,
  WORKFLOW_SUFFIXES,
  WorkflowNotFoundError,
  discoverWorkflows,
  globalWorkflowDir,
  isPathReference,
  resolveWorkflowRef,
  workflowNameOf,
} from "./discovery.js";
export type { BuiltinWorkflow, DiscoveredWorkflow, ResolvedRef, WorkflowOrigin } from "./discovery.js";
export { WorkflowLoadError, fileCompileHost, hashFile, loadAndCompile, loadWorkflowFile } from "./loader.js";
export { DEFAULT_MAX_OUTPUT_CHARS, TRUNCATION_MARKER, describeCommand, resolveExecution, runShell } from "./shell.js";
export type { ResolvedExecution, ShellHooks, ShellOutcome } from "./shell.js";
export { DEFAULT_NODE_TIMEOUT_MS, acceptAgentOutput } from "./execute.js";
export { RunState } from "./state.js";
