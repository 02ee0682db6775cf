/**
 * Every text the extension shows the user or the model. Where the reference
 * (pi-workflows-behaviour.md §5.2, §5.3, §5.7) gives a text, it is used as
 * given; the others say what happened and what to do next in one line.
 * No text carries a payload, a path, a token or a session id.
 */
import type { AmbiguousEffect, EffectRecoverReceipt, RunView, WorkflowSummary } from "../generated/types.js";
import { activeNodeOf, recoverableEffects } from "./widget.js";

/** A page of `list`: at most 50 workflows and 3,500 characters. */
export const LIST_PAGE_ITEMS = 50;
export const LIST_PAGE_CHARS = 3500;

/** The list text, cut to the character budget; `nextOffset` is where the next page starts. */
export function listText(workflows: readonly WorkflowSummary[], offset: number, total: number): { text: string; nextOffset: number | undefined } {
  if (total === 0) {
    return {
      text: "No workflows found. Put <name>.workflow.ts files in .pi/workflows/ of this project, or in ~/.pi/agent/workflows/ for every project.",
      nextOffset: undefined,
    };
  }
  const lines = [`Workflows (${offset + 1}-${offset + workflows.length} of ${total}):`];
  let used = lines[0]?.length ?? 0;
  let shown = 0;
  for (const workflow of workflows) {
    const line = `  ${workflow.name}${workflow.title !== undefined ? ` — ${workflow.title}` : ""} (${workflow.source})`;
    if (shown > 0 && used + line.length + 1 > LIST_PAGE_CHARS - 120) break;
    lines.push(line);
    used += line.length + 1;
    shown++;
  }
  if (shown < workflows.length) lines[0] = `Workflows (${offset + 1}-${offset + shown} of ${total}):`;
  const next = offset + shown < total ? offset + shown : undefined;
  if (next !== undefined) lines.push(`More: /workflow list ${next}`);
  lines.push("Start one with /workflow <name> [task]");
  return { text: lines.join("\n"), nextOffset: next };
}

export const startedText = (workflow: string, runId: string): string => `Workflow ${workflow} started (run ${runId}). Follow it live with: pi-workflows view ${runId}`;

export const queuedText = (workflow: string, runId: string): string => `Workflow ${workflow} queued (run ${runId}).`;

export const NO_RUN_TEXT = "No workflow is running.";

// ---- restart and follow-ups (DEFERRED_TURNS "Selected launch and restart") ---

export const restartQueuedText = (runId: string, newRunId: string, selected: boolean): string =>
  `Workflow run ${runId} restarted as run ${newRunId}; it starts after this turn ends.${selected ? " This was this turn's one workflow launch: end your turn now." : ""}`;

/** The model's restart was refused: the server's reason names the restart rule (cancelled, the limit of three, the same failure twice). */
export const restartRefusedText = (runId: string, reason: string): string => `Workflow run ${runId} cannot be restarted: ${reason}. Do not retry the restart.`;

/** Another launch from a decision turn that already selected one. */
export const launchRefusedText = (reason: string): string => `Not launched: ${reason}.`;

export const followUpQueuedText = (runId: string, followUpId: string): string =>
  `Follow-up ${followUpId} queued: it runs in this session after workflow run ${runId} completes (and is cancelled if it fails or is cancelled). Cancel it with /workflow then cancel ${followUpId}.`;

export const followUpCancelledText = (followUpId: string): string => `Follow-up ${followUpId} cancelled.`;

export const NO_RUN_TO_FOLLOW_TEXT = "No workflow run of this session to follow up; start one first.";

export const unavailableText = (message: string): string => `The pi-workflows server is unavailable (${message}); status shows again once it is back.`;

export const pausingText = (view: RunView): string =>
  `Pausing workflow ${view.workflowName} (run ${view.runId}): the current step finishes first. /workflow resume continues it.`;

export const resumedText = (view: RunView): string => `Workflow ${view.workflowName} resumed (run ${view.runId}).`;

export const cancelledText = (view: RunView): string => `Workflow ${view.workflowName} cancelled (run ${view.runId}).`;

export const clearedText = (view: RunView | undefined): string =>
  view === undefined ? "Cleared this session's finished workflow from view." : `Cleared the finished workflow ${view.workflowName} (run ${view.runId}) from this session's view.`;

export const notAllowedText = (view: RunView, action: string): string =>
  `Workflow ${view.workflowName} cannot ${action} now: it is ${view.display.status}${view.display.controls.length > 0 ? ` (allowed: ${view.display.controls.join(", ")})` : ""}.`;

export const NO_WAITING_RUN_TEXT = "No workflow run of this session is waiting for an answer.";

export const answeredText = (view: RunView, continuationRunId: string): string =>
  `Answered workflow ${view.workflowName}${view.display.waitingOn !== undefined ? ` at ${view.display.waitingOn}` : ""} (run ${view.runId}); it continues as run ${continuationRunId}.`;

export const HUMAN_ANSWER_TOOL_TEXT = "This checkpoint requires a verified human answer from Pi UI or a configured decision channel.";

// ---- step tool texts (reference §5.3) ---------------------------------------

export const NO_PENDING_STEP_TEXT = "No workflow step is awaiting output. Do not call the workflow tool outside an active workflow step.";

export const wrongStepText = (step: string, pending: string): string => `Wrong step id ${JSON.stringify(step)}; the pending step is ${JSON.stringify(pending)}.`;

export const staleAttemptText = (attempt: string): string => `Stale attempt id ${JSON.stringify(attempt)}. Use the attempt id from the latest step contract.`;

export const acceptedText = (step: string): string =>
  `Output accepted for step ${step}. If the workflow continues, the next step arrives as a new workflow message. End your turn now.`;

export const rejectedText = (step: string, reason: string): string => `Output rejected for step ${step}: ${reason}`;

export const updateRecordedText = (step: string, type: string, key: string, seq: number): string => `Update ${type}/${key} recorded for step ${step} (seq ${seq}). The step stays open.`;

export const stepControlUnavailableText = (step: string, what: "output" | "updates"): string =>
  `Workflow step ${step} is waiting, but this pi-workflows server does not accept step ${what} yet (interaction.${what === "output" ? "submit" : "update"} is unavailable). The step stays pending.`;

export const stepSourceUnknownText = (step: string): string =>
  `Workflow step ${step} is waiting, but the server's view does not name its interaction, so its ${"output"} cannot be sent; install matching pi-workflows packages.`;

export const serverRefusedStepText = (step: string, what: "output" | "update", message: string): string =>
  `The pi-workflows server did not take the ${what} of step ${step}: ${message} The step stays pending.`;

/** `/workflow status` and the tool's `status`. */
export function statusText(view: RunView | undefined, problem: string | undefined): string {
  if (view === undefined) return problem === undefined ? NO_RUN_TEXT : `${NO_RUN_TEXT} (${problem})`;
  const lines = [`Workflow ${view.workflowName}${view.title !== undefined ? ` — ${view.title}` : ""} [${view.display.status}] (run ${view.runId})`];
  const node = activeNodeOf(view);
  if (view.display.currentNode !== undefined) lines.push(`  current node: ${view.display.currentNode}`);
  else if (view.display.waitingOn !== undefined) lines.push(`  waiting on: ${view.display.waitingOn}`);
  else if (node !== undefined) lines.push(`  node: ${node}`);
  lines.push(`  steps: ${view.steps.total}; updates: ${view.updates.total}`);
  const updates = view.updates.items.slice(-5).map((update) => `${update.type}/${update.key}`);
  if (updates.length > 0) lines.push(`  latest updates: ${updates.join(", ")}`);
  lines.push(`  started: ${new Date(view.createdAtMs).toISOString()}${view.finishedAtMs !== undefined ? `; finished: ${new Date(view.finishedAtMs).toISOString()}` : ""}`);
  const reason = ambiguityText(view) ?? view.display.reason ?? view.display.reasonNotice ?? view.failure?.message;
  if (reason !== undefined) lines.push(`  reason: ${Array.from(reason).slice(0, 4000).join("")}`);
  lines.push(`  controls: ${view.display.controls.length > 0 ? view.display.controls.join(", ") : "none"}`);
  if (problem !== undefined) lines.push(`  note: ${problem}`);
  return lines.join("\n");
}

// ---- ambiguous effects (/workflow recover) -----------------------------------

const effectName = (effect: AmbiguousEffect): string => `${effect.effectType} at ${effect.nodeId}`;

/**
 * An ambiguous run's reason in Pi: the server's reason names the wire
 * operation (`effect.recover`); this one names the command a person runs.
 * Undefined when the view offers no effect to recover.
 */
export function ambiguityText(view: RunView): string | undefined {
  const { effects, canRetry } = recoverableEffects(view);
  if (effects.length === 0) return undefined;
  const which = effects.map((effect) => `${effectName(effect)}, attempt ${effect.attemptNumber}`).join("; ");
  const id = effects.length > 1 ? " <effectId>" : "";
  const subject = effects.length > 1 ? `External effects (${which}) may have applied without a receipt` : `An external effect (${which}) may have applied without a receipt`;
  return canRetry
    ? `${subject}; check the external system, then /workflow recover confirm${id} (it applied) or /workflow recover retry${id} (apply it again: a duplicate is possible).`
    : `${subject}; check the external system, then record what you saw with /workflow recover confirm${id} (the run ended, so it cannot retry).`;
}

export const recoverEffectNotAllowedText = (view: RunView): string => notAllowedText(view, "recover an effect");

export const nameTheEffectText = (view: RunView, ids: readonly string[]): string =>
  `Workflow ${view.workflowName} (run ${view.runId}) has ${ids.length} ambiguous effects (${ids.join(", ")}); name one: /workflow recover confirm|retry <effectId>`;

export const noSuchEffectText = (view: RunView, effectId: string, ids: readonly string[]): string =>
  `Workflow ${view.workflowName} (run ${view.runId}) has no ambiguous effect ${effectId} (ambiguous: ${ids.join(", ")}).`;

/** The result of `/workflow recover`; a retry carries the server's duplicate warning. */
export function recoveredText(view: RunView, effect: AmbiguousEffect, receipt: EffectRecoverReceipt): string {
  const what = `${effectName(effect)} (effect ${effect.effectId}) of workflow ${view.workflowName} (run ${view.runId})`;
  if (receipt.state === "applied") return `Confirmed effect ${what}: recorded as applied.`;
  const warning = receipt.warning !== undefined ? ` Warning: ${receipt.warning}` : "";
  return `Effect ${what} will be applied again as attempt ${receipt.attemptNumber}.${warning}`;
}
