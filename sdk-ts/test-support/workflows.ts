/**
 * Test support: workflow sources shared by the end-to-end suites.
 */

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
