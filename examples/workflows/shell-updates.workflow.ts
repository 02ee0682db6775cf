/**
 * A shell action with updates: the command prints one JSON progress line per
 * step; `updates.parseLine` turns each into a `progress` update, and `parse`
 * turns the captured stdout into the node's output.
 */
import { defineWorkflow, shell } from "@pi-workflows/sdk";

const SCRIPT = `
const total = Number(process.argv[1]);
for (let done = 1; done <= total; done++) {
  console.log(JSON.stringify({ done, total }));
}
console.log("finished");
`;

export default defineWorkflow<{ steps: number }>({
  name: "shell-updates",
  source: import.meta.url,
  input: (value) => ({ steps: Number((value as { steps?: unknown } | null)?.steps ?? 3) }),
  startAt: "count",
  nodes: {
    count: shell({
      timeoutMs: 60_000,
      statusDetail: "counting in a child process",
      exec: ({ input }) => ({ command: process.execPath, args: ["-e", SCRIPT, String(input.steps)] }),
      updates: {
        parseLine: (line) => {
          if (!line.startsWith("{")) return null;
          const { done, total } = JSON.parse(line) as { done: number; total: number };
          return {
            type: "progress",
            key: "overall",
            data: { status: done === total ? "completed" : "running", completed: done, total, unit: "steps" },
          };
        },
      },
      parse: (result) => ({
        lines: result.stdout.trim().split("\n").length,
        last: result.stdout.trim().split("\n").pop(),
        exitCode: result.exitCode,
      }),
    }),
  },
});
