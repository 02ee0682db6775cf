/**
 * A child workflow with two exits, `approved` and `rejected`. It is included
 * by `include.workflow.ts`; run alone it completes at `approve` or `reject`.
 */
import { compute, defineWorkflow } from "@pi-workflows/sdk";

export default defineWorkflow<{ text: string }>({
  name: "review",
  source: import.meta.url,
  contractId: "examples.review.v1",
  input: (value) => {
    const text = (value as { text?: unknown } | null)?.text;
    if (typeof text !== "string") throw new Error("text must be a string");
    return { text };
  },
  startAt: "check",
  nodes: {
    check: compute({ run: ({ input }) => ({ ok: !input.text.includes("TODO"), length: input.text.length }) }),
    approve: compute({ run: ({ input }) => ({ verdict: "approved", text: input.text }) }),
    reject: compute({ run: ({ input }) => ({ verdict: "rejected", reason: `"${input.text}" still has a TODO` }) }),
  },
  edges: [{ from: "check", switch: { on: "$.ok", cases: { true: "approve", false: "reject" } } }],
  exits: {
    approved: { from: "approve" },
    rejected: { from: "reject", validate: (output) => ({ ...(output as object), final: true }) },
  },
});
