/**
 * An agent workflow: the `triage` agent step classifies an issue and submits
 * `{kind, summary}` through the step contract; `validate` refuses any other
 * kind, and the accepted kind routes the run to `file_bug` or `plan_feature`.
 * In a headless run (`pi-workflows start triage <issue text>`) the step runs
 * in the runner's own `pi --mode rpc` child with Pi's default model (or set
 * `model: { provider, model }` here).
 */
import { agent, compute, defineWorkflow } from "@pi-workflows/sdk";

export default defineWorkflow({
  name: "triage",
  source: import.meta.url,
  startAt: "triage",
  nodes: {
    triage: agent({
      prompt: ({ input }) => `Triage this issue: ${(input as { task?: string }).task ?? "(no text)"}\nSay whether it is a bug or a feature request, with a one-line summary.`,
      expectedOutput: '{ "kind": "bug" | "feature", "summary": string }',
      validate: (output) => {
        const { kind, summary } = (output ?? {}) as { kind?: unknown; summary?: unknown };
        if (kind !== "bug" && kind !== "feature") throw new Error(`kind must be "bug" or "feature", got ${JSON.stringify(kind)}`);
        if (typeof summary !== "string" || summary.trim() === "") throw new Error("summary must be a non-empty string");
        return { kind, summary: summary.trim() };
      },
    }),
    file_bug: compute({ run: ({ outputs }) => ({ filed: "bug", title: (outputs.triage as { summary: string }).summary }) }),
    plan_feature: compute({ run: ({ outputs }) => ({ planned: "feature", title: (outputs.triage as { summary: string }).summary }) }),
  },
  edges: [{ from: "triage", switch: { on: "$.kind", cases: { bug: "file_bug", feature: "plan_feature" } } }],
});
