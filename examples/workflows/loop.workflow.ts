/**
 * A loop bounded by maxSteps: `tick` counts up and `check` loops back until
 * the count reaches `target`. Each round is two steps, so a target above 4
 * exceeds `maxSteps: 10` and the run fails instead of looping forever.
 */
import { compute, defineWorkflow } from "@pi-workflows/sdk";

export default defineWorkflow<{ target: number }>({
  name: "loop",
  source: import.meta.url,
  maxSteps: 10,
  input: (value) => {
    const target = (value as { target?: unknown } | null)?.target ?? 3;
    if (!Number.isInteger(target) || (target as number) < 1) throw new Error("target must be a positive integer");
    return { target: target as number };
  },
  startAt: "tick",
  nodes: {
    tick: compute({
      run: ({ outputs }) => ({ count: ((outputs.tick as { count: number } | undefined)?.count ?? 0) + 1 }),
    }),
    check: compute({
      run: ({ input, outputs }) => {
        const count = (outputs.tick as { count: number }).count;
        return { more: count < input.target, count };
      },
    }),
    done: compute({ run: ({ outputs }) => ({ count: (outputs.check as { count: number }).count }) }),
  },
  edges: [
    { from: "tick", to: "check" },
    { from: "check", switch: { on: "$.more", cases: { true: "tick", false: "done" } } },
  ],
});
