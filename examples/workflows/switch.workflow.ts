/**
 * Switch routing: `classify` outputs `{route}` and a switch edge on `$.route`
 * picks the next node.
 */
import { compute, defineWorkflow } from "@pi-workflows/sdk";

export default defineWorkflow<{ size: number }>({
  name: "switch",
  source: import.meta.url,
  input: (value) => {
    const size = (value as { size?: unknown } | null)?.size ?? 1;
    if (typeof size !== "number" || !Number.isFinite(size)) throw new Error("size must be a number");
    return { size };
  },
  startAt: "classify",
  nodes: {
    classify: compute({ run: ({ input }) => ({ route: input.size > 10 ? "large" : "small" }) }),
    small: compute({ run: ({ input }) => ({ handledBy: "small", size: input.size }) }),
    large: compute({ run: ({ input }) => ({ handledBy: "large", size: input.size }) }),
  },
  edges: [{ from: "classify", switch: { on: "$.route", cases: { small: "small", large: "large" } } }],
});
