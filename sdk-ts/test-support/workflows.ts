/**
 * Test support: workflow sources shared by the end-to-end suites.
 */
import { MOCK_MODEL_ID, MOCK_PROVIDER } from "./pi.js";

/** `review` submits a verdict that its validate checks; the verdict routes the run. */
export const REVIEW_WORKFLOW = `import { agent, compute, defineWorkflow } from "@pi-workflows/sdk";
export default defineWorkflow({
  name: "review",
  startAt: "review",
  model: { provider: "${MOCK_PROVIDER}", model: "${MOCK_MODEL_ID}" },
  nodes: {
    review: agent({
      prompt: ({ input }) => "Review the change: " + (input as { task?: string }).task,
      expectedOutput: '{ "verdict": "approve" | "reject", "reason": string }',
      validate: (output) => {
        const verdict = (output as { verdict?: unknown }).verdict;
        if (verdict !== "approve" && verdict !== "reject") throw new Error("verdict must be approve or reject, got " + JSON.stringify(verdict));
        return output;
      },
    }),
    ship: compute({ run: ({ outputs }) => ({ shipped: true, review: outputs.review }) }),
    rework: compute({ run: () => ({ shipped: false }) }),
  },
  edges: [{ from: "review", switch: { on: "$.verdict", cases: { approve: "ship", reject: "rework" } } }],
});
`;

/** A protected human decision: ship, or revise with a text; the continuation routes on the choice. */
export const RELEASE_GATE = `
import { choice, compute, defineHumanChoices, defineWorkflow, humanDecision, humanDecisionEdge, textInput } from "@pi-workflows/sdk";

const choices = defineHumanChoices({
  ship: choice({ label: "Ship it" }),
  revise: choice({ label: "Ask for changes", input: textInput({ name: "change", prompt: "What to change", maxLength: 200 }) }),
});

export default defineWorkflow({
  name: "release-gate",
  source: import.meta.url,
  startAt: "draft",
  nodes: {
    draft: compute({ run: () => ({ notes: "v1 notes" }) }),
    gate: humanDecision({
      audience: "release managers",
      choices,
      request: ({ outputs }) => ({
        title: "Publish the release?",
        subject: outputs.draft,
        presentation: { summary: "The release notes are drafted.", blocks: [{ kind: "paragraph", text: "Ship them or ask for changes." }] },
      }),
    }),
    shipped: compute({ run: ({ outputs }) => ({ shipped: (outputs.gate as { choice: string }).choice }) }),
    revised: compute({ run: ({ outputs }) => ({ revise: outputs.gate }) }),
  },
  edges: [
    { from: "draft", to: "gate" },
    humanDecisionEdge({ from: "gate", choices, cases: { ship: "shipped", revise: "revised" } }),
  ],
});
`;
