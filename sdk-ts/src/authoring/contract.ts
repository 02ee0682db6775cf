/**
 * The step contract appended to every agent prompt (reference §1.6). Models
 * and bundled skills depend on this text byte for byte: do not reword it.
 */

/** The expected-output line when a node declares none. */
export const DEFAULT_EXPECTED_OUTPUT = "a JSON object with your result";

/** `prompt` (trailing whitespace trimmed), a blank line, `---`, then the contract lines. */
export function appendStepContract(
  prompt: string,
  workflowName: string,
  nodeId: string,
  attemptId: string,
  expectedOutput: string | undefined,
): string {
  const step = JSON.stringify(nodeId);
  const attempt = JSON.stringify(attemptId);
  return [
    prompt.trimEnd(),
    "",
    "---",
    `Workflow step contract (workflow: ${workflowName}, step: ${nodeId}, attempt: ${attemptId})`,
    "",
    "While this step is active, you may publish non-completing updates with:",
    `{"action": "update", "step": ${step}, "attempt": ${attempt}, "update": {"type": "...", "key": "...", "data": {...}}}`,
    "Complete this step by calling the `workflow` tool exactly once with:",
    `{"action": "submit", "step": ${step}, "attempt": ${attempt}, "output": <your result>}`,
    `Expected output: ${expectedOutput ?? DEFAULT_EXPECTED_OUTPUT}`,
    "The step is complete only after the workflow tool accepts the output.",
    "If the tool reports a validation error, correct the output and call it again.",
  ].join("\n");
}
