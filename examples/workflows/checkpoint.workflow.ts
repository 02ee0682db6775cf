/**
 * A checkpoint: the run ends `waiting` at `review`; answering it starts one
 * continuation run whose input is the answer, and which follows the
 * checkpoint's edge to `publish` with the carried outputs.
 */
import { checkpoint, compute, defineWorkflow } from "@pi-workflows/sdk";

export default defineWorkflow({
  name: "checkpoint",
  source: import.meta.url,
  startAt: "draft",
  nodes: {
    draft: compute({ run: () => ({ text: "release notes v1" }) }),
    review: checkpoint({
      timeoutMs: () => 60_000,
      run: ({ outputs }) => ({ summary: "approve the draft?", draft: outputs.draft }),
    }),
    publish: compute({
      run: ({ input, outputs }) => ({
        published: (outputs.draft as { text: string }).text,
        approvedBy: (input as { approver?: string } | null)?.approver ?? "unknown",
      }),
    }),
  },
  edges: [
    { from: "draft", to: "review" },
    { from: "review", to: "publish" },
  ],
});
