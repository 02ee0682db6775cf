/**
 * The review the pull-request controller starts for each head
 * (`examples/controllers/pull-request.controller.ts`, through
 * `ctx.workflows.ensure`). Deterministic so it runs headless with no model:
 * it refuses a pull request whose title marks it work in progress (the run
 * fails, so the controller reports ReviewFailed) and approves any other. A
 * real review would put an `agent` step here.
 */
import { compute, defineWorkflow } from "@pi-workflows/sdk";

interface Input {
  repo: string;
  number: number;
  head: string;
  title: string;
}

export default defineWorkflow<Input>({
  name: "pr-review",
  source: import.meta.url,
  contractId: "examples.pr-review.v1",
  title: ({ input }) => `Review ${input.repo}#${input.number}`,
  input: (value) => {
    const { repo, number, head, title } = (value ?? {}) as Partial<Input>;
    if (typeof repo !== "string" || typeof number !== "number" || typeof head !== "string" || typeof title !== "string") {
      throw new Error("input must be {repo, number, head, title}");
    }
    return { repo, number, head, title };
  },
  startAt: "check",
  nodes: {
    check: compute({
      run: ({ input }) => {
        if (/\b(WIP|draft)\b/i.test(input.title)) throw new Error("the title marks the pull request as work in progress");
        return { verdict: "approved", head: input.head };
      },
    }),
  },
});
