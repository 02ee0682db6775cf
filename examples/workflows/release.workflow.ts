/**
 * The README's main job: a release in five steps.
 *
 * - `plan` (compute) turns the task into a build plan;
 * - `build` (shell) runs a child process that reports progress lines, which
 *   become a live `progress` update;
 * - `review` includes `review.workflow.ts` and leaves through its
 *   `approved` or `rejected` exit;
 * - `approve` (checkpoint) waits for a person's answer;
 * - `publish` (compute) runs in the continuation the answer starts, with the
 *   answer as its input.
 */
import { checkpoint, compute, defineWorkflow, includeWorkflow, shell } from "@pi-workflows/sdk";
import review from "./review.workflow.ts";

const BUILD = `
const steps = Number(process.argv[1]);
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
(async () => {
  for (let done = 1; done <= steps; done++) {
    await pause(250);
    console.log(JSON.stringify({ done, steps }));
  }
  console.log("built");
})();
`;

export default defineWorkflow<{ task: string; steps: number }>({
  name: "release",
  source: import.meta.url,
  title: ({ input }) => `Release: ${input.task}`,
  input: (value) => {
    const raw = (value ?? {}) as { task?: unknown; steps?: unknown };
    return { task: String(raw.task ?? "ship the release notes"), steps: Number(raw.steps ?? 8) };
  },
  startAt: "plan",
  nodes: {
    plan: compute({ run: ({ input }) => ({ task: input.task, steps: input.steps }) }),
    build: shell({
      timeoutMs: 120_000,
      statusDetail: "building",
      exec: ({ outputs }) => ({
        command: process.execPath,
        args: ["-e", BUILD, String((outputs.plan as { steps: number }).steps)],
      }),
      updates: {
        parseLine: (line) => {
          if (!line.startsWith("{")) return null;
          const { done, steps } = JSON.parse(line) as { done: number; steps: number };
          return {
            type: "progress",
            key: "build",
            data: { status: done === steps ? "completed" : "running", completed: done, total: steps, unit: "steps" },
          };
        },
      },
      parse: (result) => ({ exitCode: result.exitCode, last: result.stdout.trim().split("\n").pop() }),
    }),
    approve: checkpoint({
      timeoutMs: () => 24 * 60 * 60 * 1000,
      run: ({ outputs }) => ({ question: "Publish this release?", review: outputs.review }),
    }),
    publish: compute({
      run: ({ input, outputs }) => ({
        published: (outputs.plan as { task: string }).task,
        approvedBy: (input as { approver?: string } | null)?.approver ?? "someone",
      }),
    }),
    revise: compute({ run: ({ outputs }) => ({ published: false, review: outputs.review }) }),
  },
  includes: {
    review: includeWorkflow(review, { input: ({ outputs }) => ({ text: (outputs.plan as { task: string }).task }) }),
  },
  edges: [
    { from: "plan", to: "build" },
    { from: "build", to: "review" },
    { from: "review.approved", to: "approve" },
    { from: "review.rejected", to: "revise" },
    { from: "approve", to: "publish" },
  ],
});
