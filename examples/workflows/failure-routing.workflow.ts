/**
 * Failure routing: a node that fails continues only through a switch on
 * `$result.outcome`; here a failed `fetch` routes to `recover`.
 */
import { compute, defineWorkflow } from "@pi-workflows/sdk";

export default defineWorkflow<{ fail: boolean }>({
  name: "failure-routing",
  source: import.meta.url,
  input: (value) => ({ fail: (value as { fail?: unknown } | null)?.fail !== false }),
  startAt: "fetch",
  nodes: {
    fetch: compute({
      run: ({ input }) => {
        if (input.fail) throw new Error("the upstream service is unavailable");
        return { data: "fresh" };
      },
    }),
    use: compute({ run: ({ outputs }) => ({ used: (outputs.fetch as { data: string }).data }) }),
    recover: compute({
      run: ({ results }) => ({ used: "cached", because: results.fetch?.error?.message ?? "unknown" }),
    }),
  },
  edges: [{ from: "fetch", switch: { on: "$result.outcome", cases: { ok: "use", failed: "recover" } } }],
});
