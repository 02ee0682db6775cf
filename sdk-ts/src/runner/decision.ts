/**
 * The request a human-decision checkpoint produces (reference §7.1): it is
 * the checkpoint's output while the run waits. Digests are `sha256` of
 * canonical JSON; the decision id binds run, node, attempt and request.
 */
import { hasControl, isRecord } from "../authoring/errors.js";
import type { HumanDecisionOptions, HumanDecisionOnTimeout, NodeContext, PresentationBlock } from "../authoring/types.js";
import { canonicalString } from "../protocol/canonical.js";
import { sha256Digest } from "../authoring/compile.js";

const MAX_BLOCKS = 256;
const MAX_ITEMS = 256;
const MAX_STRING = 16_000;
const MAX_TOTAL = 64_000;

function checkText(text: unknown, what: string, allowNewlines = true): string {
  if (typeof text !== "string") throw new Error(`${what} must be a string`);
  const normalized = text.replace(/\r\n?/g, "\n");
  if (normalized.length > MAX_STRING) throw new Error(`${what} is longer than ${MAX_STRING} characters`);
  const check = allowNewlines ? normalized.replace(/[\n\t]/g, "") : normalized;
  if (hasControl(check)) throw new Error(`${what} contains control characters`);
  return normalized;
}

function checkPresentation(value: unknown): { summary: string; blocks: PresentationBlock[] } {
  if (!isRecord(value) || !Array.isArray(value.blocks)) throw new Error("presentation must be {summary, blocks}");
  const keys = Object.keys(value).filter((key) => key !== "summary" && key !== "blocks");
  if (keys.length > 0) throw new Error(`presentation has unknown fields: ${keys.join(", ")}`);
  if (value.blocks.length > MAX_BLOCKS) throw new Error(`presentation has more than ${MAX_BLOCKS} blocks`);
  const summary = checkText(value.summary, "presentation.summary");
  let total = summary.length;
  const blocks = value.blocks.map((block: unknown, index): PresentationBlock => {
    const what = `presentation.blocks[${index}]`;
    if (!isRecord(block)) throw new Error(`${what} must be an object`);
    const allowed: Record<string, string[]> = {
      paragraph: ["kind", "text"],
      section: ["kind", "title"],
      bullets: ["kind", "items"],
      fields: ["kind", "items"],
      preformatted: ["kind", "text"],
    };
    const fields = allowed[String(block.kind)];
    if (!fields) throw new Error(`${what}.kind is unknown`);
    const unknown = Object.keys(block).filter((key) => !fields.includes(key));
    if (unknown.length > 0) throw new Error(`${what} has unknown fields: ${unknown.join(", ")}`);
    switch (block.kind) {
      case "paragraph":
      case "preformatted": {
        const text = checkText(block.text, `${what}.text`);
        total += text.length;
        return { kind: block.kind, text };
      }
      case "section": {
        const title = checkText(block.title, `${what}.title`, false);
        total += title.length;
        return { kind: "section", title };
      }
      case "bullets": {
        if (!Array.isArray(block.items) || block.items.length > MAX_ITEMS) throw new Error(`${what}.items must be a list of at most ${MAX_ITEMS}`);
        const items = block.items.map((item, i) => checkText(item, `${what}.items[${i}]`));
        total += items.reduce((sum, item) => sum + item.length, 0);
        return { kind: "bullets", items };
      }
      default: {
        if (!Array.isArray(block.items) || block.items.length > MAX_ITEMS) throw new Error(`${what}.items must be a list of at most ${MAX_ITEMS}`);
        const items = block.items.map((item: unknown, i) => {
          if (!isRecord(item)) throw new Error(`${what}.items[${i}] must be {label, value}`);
          const label = checkText(item.label, `${what}.items[${i}].label`, false);
          const itemValue = checkText(item.value, `${what}.items[${i}].value`);
          total += label.length + itemValue.length;
          return { label, value: itemValue };
        });
        return { kind: "fields", items };
      }
    }
  });
  if (total > MAX_TOTAL) throw new Error(`presentation is longer than ${MAX_TOTAL} characters`);
  return { summary, blocks };
}

/** Builds the `pi-workflows.human-decision-request.v1` a human-decision checkpoint outputs. */
export async function buildDecisionRequest(options: HumanDecisionOptions, ctx: NodeContext): Promise<Record<string, unknown>> {
  const spec = await options.request(ctx);
  if (!isRecord(spec)) throw new Error("request() must return {title, subject?, presentation?, revision?, expiresAt?}");
  const title = checkText(spec.title, "request title", false);
  if (title.trim() === "") throw new Error("request title must not be empty");
  if (spec.subject !== undefined && spec.presentation === undefined) throw new Error("a request with a subject needs a presentation");
  const presentation = spec.presentation === undefined ? { summary: title, blocks: [] } : checkPresentation(spec.presentation);
  const revision = spec.revision ?? 1;
  if (!Number.isInteger(revision) || revision < 1) throw new Error("request revision must be a positive integer");
  const audience = typeof options.audience === "function" ? await options.audience(ctx) : options.audience;
  if (typeof audience !== "string" || audience.trim() === "") throw new Error("audience must be a non-empty string");
  const timeout: HumanDecisionOnTimeout | undefined =
    typeof options.onTimeout === "function" ? await options.onTimeout(ctx) : options.onTimeout;
  if (timeout !== undefined && spec.expiresAt !== undefined) throw new Error("onTimeout cannot be combined with expiresAt");
  const createdAt = Date.now();
  const expiresAt = timeout !== undefined ? new Date(createdAt + timeout.afterMs).toISOString() : spec.expiresAt;
  const choices = options.choices.ids.map((id) => {
    const entry = options.choices.choices[id];
    return { id, label: entry?.label ?? id, ...(entry?.input ? { input: entry.input } : {}) };
  });
  if (timeout !== undefined) {
    const chosen = choices.find((candidate) => candidate.id === timeout.response.choice);
    if (!chosen) throw new Error("onTimeout.response.choice is not a choice");
  }
  const basis = {
    schema: "pi-workflows.human-decision-request.v1",
    runId: ctx.attempt.runId,
    nodeId: ctx.attempt.nodeId,
    attemptId: ctx.attempt.attemptId,
    audience,
    title,
    ...(spec.subject !== undefined ? { subject: spec.subject } : {}),
    presentation,
    choices,
    revision,
    ...(expiresAt !== undefined ? { expiresAt } : {}),
    ...(timeout !== undefined ? { defaultResponse: timeout.response } : {}),
  };
  const requestDigest = sha256Digest(canonicalString(basis));
  const decisionId = `decision-${sha256Digest(
    canonicalString({ runId: ctx.attempt.runId, nodeId: ctx.attempt.nodeId, attemptId: ctx.attempt.attemptId, requestDigest }),
  ).slice("sha256:".length, "sha256:".length + 40)}`;
  return {
    ...basis,
    decisionId,
    requestDigest,
    ...(spec.subject !== undefined ? { subjectDigest: sha256Digest(canonicalString(spec.subject)) } : {}),
    presentationDigest: sha256Digest(canonicalString(presentation)),
  };
}
