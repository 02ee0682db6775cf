/**
 * Linear: three compute nodes in a row. The input parser normalizes
 * `{name?}`; each node reads the outputs of the nodes before it.
 */
import { compute, defineWorkflow } from "@pi-workflows/sdk";

interface Input {
  name: string;
}

export default defineWorkflow<Input>({
  name: "linear",
  source: import.meta.url,
  title: ({ input }) => `Greet ${input.name}`,
  input: (value) => {
    const name = (value as { name?: unknown } | null)?.name ?? "world";
    if (typeof name !== "string" || name === "") throw new Error("name must be a non-empty string");
    return { name };
  },
  startAt: "greet",
  nodes: {
    greet: compute({ run: ({ input }) => ({ text: `Hello, ${input.name}` }) }),
    shout: compute({
      run: ({ outputs }) => ({ text: `${(outputs.greet as { text: string }).text.toUpperCase()}!` }),
    }),
    summarize: compute({
      run: ({ outputs }) => ({
        greeting: (outputs.greet as { text: string }).text,
        shouted: (outputs.shout as { text: string }).text,
      }),
    }),
  },
  edges: [
    { from: "greet", to: "shout" },
    { from: "shout", to: "summarize" },
  ],
});
