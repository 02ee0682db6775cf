/**
 * The bridge extension of a headless agent step: the only extension the
 * runner loads into its `pi --mode rpc` child (`pi.ts`).
 *
 * It registers one `workflow` tool with the two actions a step contract
 * names, `update` and `submit`, and sends them to the server as
 * `interaction.update` / `interaction.submit` with the exact request
 * contract of origin-session work: the request id (interaction), its
 * attempt, the runner's authority (generation and runner epoch) and the
 * tool call as the idempotency key, so a retried call adopts its receipt.
 * A submit waits for the durable validation outcome; its text tells the
 * model what to do next (reference §5.3), and its details (never sent to
 * the model) tell the runner that the step is accepted.
 *
 * It never starts a server, opens SQLite or loads workflow code.
 */
import { createHash } from "node:crypto";
import { WorkflowClient } from "../client/index.js";
import type { BridgeDetails, BridgeTarget } from "./pi.js";

/** The part of Pi's ExtensionAPI the bridge uses (Pi 1.x `registerTool`). */
interface BridgeApi {
  registerTool(tool: {
    name: string;
    label: string;
    description: string;
    parameters: Record<string, unknown>;
    execute: (toolCallId: string, params: Record<string, unknown>, signal?: AbortSignal) => Promise<ToolResult>;
  }): void;
}

interface ToolResult {
  content: { type: "text"; text: string }[];
  details: BridgeDetails;
}

/** The tool's parameters: one flat object, `action` an enum, the rest optional (provider compatibility, §5.3). */
const PARAMETERS = {
  type: "object",
  properties: {
    action: { type: "string", enum: ["update", "submit"], description: "update publishes progress; submit completes the step" },
    step: { type: "string", description: "the step id from the step contract" },
    attempt: { type: "string", description: "the attempt id from the step contract" },
    output: { description: "submit: your result" },
    update: {
      type: "object",
      description: "update: {type, key, data}",
      properties: { type: { type: "string" }, key: { type: "string" }, data: { type: "object" } },
    },
  },
  required: ["action"],
};

const DESCRIPTION =
  "Pi Workflows step tool. Use it only when a workflow step contract asks: `submit` completes the step with your output, `update` publishes a non-completing progress update.";

/** A protocol id derived from Pi's tool-call id (tool-call ids may hold characters the protocol ids do not). */
export function callKey(prefix: string, toolCallId: string): string {
  return `${prefix}-${createHash("sha256").update(toolCallId).digest("hex").slice(0, 40)}`;
}

function result(text: string, details: BridgeDetails): ToolResult {
  return { content: [{ type: "text", text }], details };
}

export default function bridge(pi: BridgeApi): void {
  const raw = process.env.PI_WORKFLOWS_BRIDGE;
  if (raw === undefined) throw new Error("the pi-workflows bridge needs PI_WORKFLOWS_BRIDGE (it is loaded only by the runner)");
  const target = JSON.parse(raw) as BridgeTarget;
  const client = new WorkflowClient({ autoStart: false, clientId: `bridge-${target.runnerEpoch}`.slice(0, 128) });
  const authority = { kind: "runner" as const, generation: target.generation, runnerEpoch: target.runnerEpoch };
  pi.registerTool({
    name: "workflow",
    label: "workflow",
    description: DESCRIPTION,
    parameters: PARAMETERS,
    async execute(toolCallId, params, signal) {
      const action = params.action === "update" ? "update" : "submit";
      const refused = (text: string): ToolResult => result(text, { bridge: "pi-workflows", action, outcome: "refused", attemptId: target.attemptId });
      if (params.action !== "update" && params.action !== "submit") {
        return refused(`Unknown action ${JSON.stringify(params.action)}: this workflow step takes only "update" and "submit".`);
      }
      if (params.step !== target.step) {
        return refused(`Wrong step id ${JSON.stringify(params.step)}; the pending step is ${JSON.stringify(target.step)}.`);
      }
      if (params.attempt !== target.attemptId) {
        return refused(`Stale attempt id ${JSON.stringify(params.attempt)}. Use the attempt id from the latest step contract.`);
      }
      try {
        if (action === "update") {
          const update = params.update as { type?: unknown; key?: unknown; data?: unknown } | undefined;
          await client.interactionUpdate(
            target.runId,
            {
              interactionId: target.interactionId,
              attemptId: target.attemptId,
              toolCallId: callKey("tc", toolCallId),
              authority,
              update: { type: update?.type, key: update?.key, data: update?.data } as never,
            },
            { idempotencyKey: callKey("update", toolCallId), ...(signal ? { signal } : {}) },
          );
          return result("Workflow update recorded. Continue the same step.", {
            bridge: "pi-workflows",
            action,
            outcome: "accepted",
            attemptId: target.attemptId,
          });
        }
        const submissionId = callKey("sub", toolCallId);
        const accepted = await client.interactionSubmit(
          target.runId,
          {
            interactionId: target.interactionId,
            attemptId: target.attemptId,
            submissionId,
            authority,
            output: (params.output === undefined ? null : params.output) as never,
          },
          { idempotencyKey: callKey("submit", toolCallId), ...(signal ? { signal } : {}) },
        );
        const receipt = accepted.receipt;
        if (receipt.outcome === "accepted") {
          return result(
            `Output accepted for step ${target.step}. If the workflow continues, the next step arrives as a new workflow message. End your turn now.`,
            { bridge: "pi-workflows", action, outcome: "accepted", attemptId: target.attemptId, submissionId, output: receipt.accepted?.output ?? null },
          );
        }
        return result(
          `Output rejected for step ${target.step}: ${receipt.error?.message ?? "the workflow's validate refused it"}. Correct the output and call the workflow tool again.`,
          { bridge: "pi-workflows", action, outcome: "rejected", attemptId: target.attemptId, submissionId },
        );
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        return refused(
          action === "update"
            ? `Workflow update rejected: ${message}. Correct the update and continue the same step.`
            : `The workflow could not take the submission for step ${target.step}: ${message}`,
        );
      }
    },
  });
}
