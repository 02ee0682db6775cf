/**
 * The widget and status line (reference §5.7), rendered only from the
 * server's run view: its `display` object (status, current node, waiting
 * node, reason) and its nodes, steps and updates.
 *
 * Invariants:
 * - Pure: lines are a function of the view, the current time (for running
 *   timings) and the scroll offset; nothing here reads workflow rows or
 *   infers a status the server did not send.
 * - At most `maxLines` lines (Pi cuts string widgets at 10): node rows are
 *   windowed around the active node (the display's current node, else its
 *   waiting node), and the scroll offset moves the window.
 * - While Herdr is available the widget names `Ctrl+Shift+R piw` on its
 *   last line (sharing the scroll hint's line when rows are hidden).
 * - Who must act is the view's `display.why` (the kernel's explainer), as
 *   one compact line, only when someone other than the run's own runner
 *   must act; the full explanation is `pi-workflows why <runId>`.
 */
import type { AmbiguousEffect, DisplayStatus, GraphNode, NodeState, NodeType, RunView, StepRecord, WhyActor, WhyState } from "../generated/types.js";

/** The widget and status keys. */
export const WIDGET_KEY = "pi-workflows";

/** Pi's cap for string-array widgets. */
export const STRING_WIDGET_LINES = 10;
/** The component widget's cap (the TUI does not cut components). */
export const COMPONENT_WIDGET_LINES = 16;
/** Rows one Shift+Up / Shift+Down moves. */
export const SCROLL_STEP = 3;

const MAX_PROGRESS_LINES = 4;
const MAX_DETAIL = 120;

const STATUS_GLYPHS: Readonly<Record<DisplayStatus, string>> = {
  queued: "◌",
  running: "◐",
  waiting: "⏸",
  paused: "⏸",
  completed: "✓",
  failed: "✗",
  timed_out: "✗",
  cancelled: "✗",
  ambiguous: "⚠",
};

const NODE_GLYPHS: Readonly<Record<NodeState, string>> = {
  pending: "·",
  running: "◐",
  waiting: "⏸",
  completed: "✓",
  failed: "✗",
  timed_out: "✗",
  cancelled: "✗",
};

/** Type glyphs. The view does not tell a shell action from a function action, so both are `$`. */
const TYPE_GLYPHS: Readonly<Record<NodeType, string>> = {
  agent: "●",
  compute: "ƒ",
  notify: "!",
  action: "$",
  checkpoint: "◆",
};

export interface WidgetRender {
  lines: string[];
  /** Node rows outside the window. */
  hiddenRows: number;
  /** The scroll offset actually used (clamped). */
  scroll: number;
}

/** `12s`, `3m 04s`, `1h 02m`, `<1s`. */
export function formatDuration(ms: number): string {
  if (ms < 1000) return "<1s";
  const seconds = Math.floor(ms / 1000);
  if (seconds < 60) return `${seconds}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes}m ${String(seconds % 60).padStart(2, "0")}s`;
  return `${Math.floor(minutes / 60)}h ${String(minutes % 60).padStart(2, "0")}m`;
}

function clip(text: string, max: number): string {
  const chars = Array.from(text.replace(/[\u0000-\u001f\u007f]/g, " "));
  return chars.length <= max ? chars.join("") : `${chars.slice(0, max - 1).join("")}…`;
}

/** The node the display names: its current node, else its waiting node. */
export function activeNodeOf(view: RunView): string | undefined {
  return view.display.currentNode ?? view.display.waitingOn;
}

/** The status line: `wf <name> [<status>] <node>`. */
export function statusLine(view: RunView): string {
  const node = activeNodeOf(view);
  return `wf ${view.workflowName} [${view.display.status}]${node !== undefined ? ` ${node}` : ""}`;
}

function header(view: RunView): string {
  const title = view.title !== undefined && view.title !== "" ? ` — ${clip(view.title, 80)}` : "";
  return `${STATUS_GLYPHS[view.display.status]} workflow ${view.workflowName}${title} [${view.display.status}]`;
}

function lastStepOf(steps: readonly StepRecord[], nodeId: string): StepRecord | undefined {
  for (let index = steps.length - 1; index >= 0; index--) {
    const step = steps[index];
    if (step?.nodeId === nodeId) return step;
  }
  return undefined;
}

function nodeRow(node: GraphNode, view: RunView, nowMs: number): string {
  const step = lastStepOf(view.steps.items, node.id);
  const parts = [`  ${NODE_GLYPHS[node.state]} ${TYPE_GLYPHS[node.nodeType]} ${node.id}`];
  if (node.visits > 1) parts.push(`×${node.visits}`);
  if (step !== undefined && node.state !== "pending") {
    const end = step.finishedAtMs ?? (node.state === "running" ? nowMs : undefined);
    if (end !== undefined) parts.push(formatDuration(Math.max(0, end - step.startedAtMs)));
  }
  if (step?.outcome !== undefined && step.outcome !== "ok") parts.push(`— ${step.outcome.replace("_", " ")}`);
  return clip(parts.join(" "), MAX_DETAIL + 40);
}

interface Progress {
  key: string;
  label: string | undefined;
  phase: string | undefined;
  status: string;
  completed: number | undefined;
  total: number | undefined;
  unit: string | undefined;
}

function progressOf(data: unknown, key: string): Progress | undefined {
  if (typeof data !== "object" || data === null || Array.isArray(data)) return undefined;
  const fields = data as Record<string, unknown>;
  if (typeof fields["status"] !== "string") return undefined;
  const text = (name: string): string | undefined => (typeof fields[name] === "string" ? (fields[name] as string) : undefined);
  const number = (name: string): number | undefined => (typeof fields[name] === "number" && Number.isFinite(fields[name]) ? (fields[name] as number) : undefined);
  return { key, label: text("label"), phase: text("phase"), status: fields["status"], completed: number("completed"), total: number("total"), unit: text("unit") };
}

function progressRank(progress: Progress): number {
  if (progress.key === "overall") return 0;
  if (progress.status === "failed" || progress.status === "blocked" || progress.status === "waiting") return 1;
  if (progress.status === "running") return 2;
  return 3;
}

function progressLine(progress: Progress): string {
  const name = progress.label ?? progress.key;
  const phase = progress.phase !== undefined ? ` (${progress.phase})` : "";
  let amount = "";
  if (progress.total !== undefined && progress.total > 0) {
    const done = progress.completed ?? 0;
    const percent = Math.floor((Math.min(done, progress.total) / progress.total) * 100);
    amount = ` ${done}/${progress.total}${progress.unit !== undefined ? ` ${progress.unit}` : ""} ${percent}%`;
  }
  return clip(`  ▸ ${name}${phase}:${amount} [${progress.status}]`, MAX_DETAIL + 40);
}

/** Up to 4 progress lines from the view's `progress` updates: overall first, then failed/blocked/waiting, then running. */
export function progressLines(view: RunView): string[] {
  const tracks: Progress[] = [];
  for (const update of view.updates.items) {
    if (update.type !== "progress") continue;
    const progress = progressOf(update.data, update.key);
    if (progress !== undefined) tracks.push(progress);
  }
  tracks.sort((a, b) => progressRank(a) - progressRank(b));
  return tracks.slice(0, MAX_PROGRESS_LINES).map(progressLine);
}

const TERMINAL_STATUSES: ReadonlySet<DisplayStatus> = new Set(["completed", "failed", "timed_out", "cancelled"]);

/**
 * The ambiguous effects a person can recover from Pi: the view's
 * `ambiguousEffects` while its controls offer `recoverEffect` (empty
 * otherwise). A run that ended can only confirm.
 */
export function recoverableEffects(view: RunView): { effects: readonly AmbiguousEffect[]; canRetry: boolean } {
  if (!view.display.controls.includes("recoverEffect")) return { effects: [], canRetry: false };
  return { effects: view.ambiguousEffects ?? [], canRetry: !TERMINAL_STATUSES.has(view.display.status) };
}

/** The widget's line for ambiguous effects: what may have applied and the `/workflow recover` command (the server's reason names the wire operation). */
function ambiguityLine(view: RunView): string | undefined {
  const { effects, canRetry } = recoverableEffects(view);
  const command = `/workflow recover ${canRetry ? "confirm|retry" : "confirm"}`;
  const [first] = effects;
  if (first === undefined) return undefined;
  if (effects.length === 1) return `  ⚠ ${first.effectType} at ${first.nodeId} may have applied: check it, then ${command}`;
  return `  ⚠ ${effects.length} effects may have applied (${effects.map((effect) => effect.effectId).join(", ")}): check them, then ${command} <effectId>`;
}

const ACTOR_WORDS: Readonly<Record<WhyActor, string>> = {
  nobody: "nobody",
  server: "the server",
  runner: "its runner",
  person: "a person",
  originSession: "this Pi session",
  operator: "an operator",
};

const STATE_WORDS: Readonly<Record<WhyState, string>> = {
  done: "done",
  running: "running",
  starting: "starting",
  recovering: "recovering",
  waitingForAnswer: "waiting for an answer",
  waitingForAgent: "waiting for the agent",
  validating: "validating a submission",
  ambiguous: "an effect is ambiguous",
  paused: "paused",
  parkedForReview: "parked for review",
  queued: "waiting for a runner slot",
  held: "held until this turn settles",
};

/**
 * The compact line of the view's `display.why`: who must act and why, when
 * someone other than the run's own runner must (the full text names
 * command-line commands; `pi-workflows why <runId>` shows it all).
 */
export function whyLine(view: RunView): string | undefined {
  const why = view.display.why;
  if (why === undefined || why.actor === "runner" || why.actor === "nobody") return undefined;
  return `  who acts: ${ACTOR_WORDS[why.actor]} · ${STATE_WORDS[why.state]} (pi-workflows why ${view.runId})`;
}

/**
 * The reason, then what must happen: the decision's or checkpoint's answer
 * line, or the ambiguity's recovery line; the who-acts line only when
 * neither of those already says who acts.
 */
function footerLines(view: RunView): string[] {
  const lines: string[] = [];
  const ambiguity = ambiguityLine(view);
  const reason = view.display.reason ?? view.display.reasonNotice ?? view.failure?.message;
  if (ambiguity !== undefined) lines.push(clip(ambiguity, MAX_DETAIL + 40));
  else if (reason !== undefined && reason !== "") lines.push(`  ${clip(reason, MAX_DETAIL)}`);
  const answer = answerLine(view);
  if (answer !== undefined) lines.push(clip(answer, MAX_DETAIL + 40));
  const why = whyLine(view);
  if (why !== undefined && ambiguity === undefined && answer === undefined) lines.unshift(clip(why, MAX_DETAIL + 40));
  return lines;
}

/** How a person answers the decision or checkpoint the run waits on, if it does. */
function answerLine(view: RunView): string | undefined {
  const waiting = view.display.waitingOn;
  const decision = view.decision;
  if (waiting !== undefined && decision !== undefined && view.display.controls.includes("humanAnswer")) {
    const choices = decision.choices.map((choice) => choice.id).join(", ");
    return `  waiting on decision: ${waiting} (${clip(decision.title, 40)}) — answer with /workflow answer <choice> [text] (choices: ${choices})`;
  }
  if (waiting !== undefined && view.nodes.find((node) => node.id === waiting)?.nodeType === "checkpoint" && view.display.controls.includes("answer")) {
    return `  waiting on checkpoint: ${waiting} — answer with /workflow answer <json>`;
  }
  return undefined;
}

/** The call to action for piw, shown while Herdr is available (reference §5.7). */
export const PIW_HINT = "Ctrl+Shift+R piw";

/**
 * The widget lines of `view` at `nowMs`, with the node window moved by
 * `scroll` rows. With `piwHint` (Herdr is available) the last line carries
 * {@link PIW_HINT}: after the scroll hint when rows are hidden, else alone.
 */
export function renderWidget(view: RunView, options: { nowMs: number; maxLines: number; scroll: number; piwHint?: boolean }): WidgetRender {
  const head = header(view);
  let progress = progressLines(view);
  const footer = footerLines(view);
  const nodes = view.nodes;
  const fixed = (): number => 1 + progress.length + footer.length;
  // Keep at least one node row (and its scroll hint) when space is short.
  while (progress.length > 0 && fixed() + Math.min(nodes.length, 2) > options.maxLines) progress = progress.slice(0, -1);
  let rows = Math.max(0, options.maxLines - fixed());
  const piwHint = options.piwHint === true;
  let hintLine = false;
  if (nodes.length > rows || piwHint) {
    hintLine = true;
    rows = Math.max(1, rows - 1);
  }
  const hint = nodes.length > rows;
  rows = Math.min(rows, nodes.length);
  const activeId = activeNodeOf(view);
  let active = activeId === undefined ? -1 : nodes.findIndex((node) => node.id === activeId);
  if (active < 0) {
    active = 0;
    nodes.forEach((node, index) => {
      if (node.state !== "pending") active = index;
    });
  }
  const maxStart = Math.max(0, nodes.length - rows);
  const follow = Math.min(maxStart, Math.max(0, active - Math.floor((rows - 1) / 2)));
  const start = Math.min(maxStart, Math.max(0, follow + options.scroll));
  const shown = nodes.slice(start, start + rows).map((node) => nodeRow(node, view, options.nowMs));
  const lines = [head, ...shown, ...progress, ...footer];
  const hiddenRows = nodes.length - shown.length;
  const piw = piwHint ? PIW_HINT : undefined;
  if (hint) {
    const scroll = `shift+↑/↓ scroll (${start > 0 ? `${start} above` : "top"}, ${nodes.length - start - shown.length > 0 ? `${nodes.length - start - shown.length} below` : "end"})`;
    lines.push(`  ${[scroll, piw].filter((part) => part !== undefined).join(" · ")}`);
  } else if (hintLine && piw !== undefined) {
    lines.push(`  ${piw}`);
  }
  return { lines: lines.slice(0, options.maxLines), hiddenRows, scroll: start - follow };
}
