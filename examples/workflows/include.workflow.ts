/**
 * An include with two exits: `draft` feeds the `review` child (mounted as
 * `review`); the parent leaves the mount through `review.approved` or
 * `review.rejected`. Child nodes compile to `review/check`, …; the mount's
 * entry is `review` and its exits `review/__piw_exit_approved`, ….
 */
import { compute, defineWorkflow, includeWorkflow } from "@pi-workflows/sdk";
import review from "./review.workflow.ts";

export default defineWorkflow<{ text: string }>({
  name: "include",
  source: import.meta.url,
  input: (value) => ({ text: String((value as { text?: unknown } | null)?.text ?? "ship it") }),
  startAt: "draft",
  nodes: {
    draft: compute({ run: ({ input }) => ({ text: input.text.trim() }) }),
    publish: compute({ run: ({ outputs }) => ({ published: true, review: outputs.review }) }),
    revise: compute({ run: ({ outputs }) => ({ published: false, review: outputs.review }) }),
  },
  includes: {
    review: includeWorkflow(review, { input: ({ outputs }) => ({ text: (outputs.draft as { text: string }).text }) }),
  },
  edges: [
    { from: "draft", to: "review" },
    { from: "review.approved", to: "publish" },
    { from: "review.rejected", to: "revise" },
  ],
});
