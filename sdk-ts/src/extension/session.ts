/**
 * `WorkflowSession`: the extension for one Pi session. It owns the view
 * source, the coordinator, the turn reporter and the widget state, and
 * carries out `/workflow` commands and `workflow` tool calls.
 *
 * Invariants:
 * - Every state change goes to the server through `ServerPort`; the session
 *   keeps only process-local state (the last view, the queued map, the
 *   buffered turns, the scroll offset, the tail-suppression flag).
 * - Recovery runs at `start()` (session_start), after every settled turn and
 *   once per `pollMs` while the session is open: connect if needed (one
 *   attempt at a time; only the first may start the server), subscribe if
 *   needed (one subscription), read the view, and let the coordinator act.
 * - The widget and status line show only the server's view; with no run in
 *   the view they are cleared (the server decides how long a finished run
 *   stays). A server that is unreachable is shown as `unavailable`, never as
 *   a cached run.
 * - A held model-started run is activated only while Pi is idle (after the
 *   starting turn settled, or when the session starts again).
 * - Once `stop()` (session_shutdown) began, nothing is sent, activated or
 *   reported as a new turn, not even by a pass already in flight (the
 *   coordinator's final send check reads its stop flag): a closing session
 *   cannot start another turn (DEFERRED_TURNS), and the shutdown asks the
 *   server for nothing that could end, pause or launch a run, so no turn
 *   intent comes from it.
 */
import { createHash } from "node:crypto";
import { WorkflowClientError } from "../client/errors.js";
import type { JsonValue, RecoverAction, RunView, StepRecord } from "../generated/types.js";
import { WorkflowMessageCoordinator } from "./coordinator.js";
import { type CapturedEventType, SessionCapture } from "./capture.js";
import { stepSourceOf } from "./messages.js";
import { decisionResponse, parseWorkflowCommand } from "./grammar.js";
import type { PiPort, ServerPort, UiPort } from "./ports.js";
import * as texts from "./texts.js";
import { type ToolCall, parseToolCall } from "./tool.js";
import { TurnReporter } from "./turns.js";
import { SessionViewSource, type LoadedView } from "./view-source.js";
import { COMPONENT_WIDGET_LINES, SCROLL_STEP, STRING_WIDGET_LINES, recoverableEffects, renderWidget, statusLine } from "./widget.js";

export interface WorkflowSessionOptions {
  server: ServerPort;
  pi: PiPort;
  ui: UiPort;
  sessionId: string;
  projectPath: string;
  /** `ctx.sessionManager.getLeafId()`. */
  getLeafId: () => string | null;
  now?: () => number;
  /** The recovery poll period (default 1 000 ms); 0 disables the timer (tests call `tick()`). */
  pollMs?: number;
  /** Entry wait after a send (tests shorten it). */
  entryWait?: { attempts: number; delayMs: number };
  /** Herdr is available: the widget names Ctrl+Shift+R piw. */
  piwHint?: boolean;
}

/** What a tool call returns to Pi. */
export interface ToolOutcome {
  text: string;
  details: Record<string, JsonValue>;
  isError: boolean;
}

const TERMINAL = new Set(["completed", "failed", "timed_out", "cancelled"]);

/** A stable idempotency key (and submission id) for a Pi tool call id, valid for the protocol's id pattern. */
export function keyOfToolCall(toolCallId: string, prefix = "tc"): string {
  return `${prefix}.${createHash("sha256").update(toolCallId).digest("hex").slice(0, 48)}`;
}

export class WorkflowSession {
  readonly source: SessionViewSource;
  readonly coordinator: WorkflowMessageCoordinator;
  readonly turns: TurnReporter;
  readonly capture: SessionCapture;
  private readonly options: WorkflowSessionOptions;
  private readonly now: () => number;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private scroll = 0;
  private seenSteps: number | undefined;
  private shown: "run" | "unavailable" | undefined;
  private tailSuppressed = false;
  private unsubscribeConnections: (() => void) | undefined;
  private activating = new Set<string>();

  constructor(options: WorkflowSessionOptions) {
    this.options = options;
    this.now = options.now ?? Date.now;
    this.source = new SessionViewSource({
      server: options.server,
      sessionId: options.sessionId,
      onView: (view) => this.onView(view),
      onUnavailable: (error) => this.onUnavailable(error),
    });
    this.coordinator = new WorkflowMessageCoordinator({
      server: options.server,
      pi: options.pi,
      sessionId: options.sessionId,
      refresh: () => void this.source.refresh(),
      ...(options.entryWait !== undefined ? { entryWait: options.entryWait } : {}),
    });
    this.capture = new SessionCapture({
      server: options.server,
      gate: this.coordinator,
      sessionId: options.sessionId,
      revisionOf: (runId) => (this.source.current?.run?.runId === runId ? this.source.current.run.revision : undefined),
    });
    this.turns = new TurnReporter({
      server: options.server,
      gate: this.coordinator,
      sessionId: options.sessionId,
      getBranch: () => options.pi.getBranch(),
      getLeafId: options.getLeafId,
      onActivity: () => void this.source.refresh(),
      onTurnStart: (turnId) => this.capture.beginTurn(turnId, { startLeaf: options.getLeafId() }),
      onOwnership: (turnId, runId) => this.capture.owned(turnId, runId),
    });
    this.coordinator.attachTurns(this.turns);
  }

  /** The last complete view. */
  get view(): LoadedView | undefined {
    return this.source.current;
  }

  /** Whether assistant text of this agent run is stripped (after an accepted submission). */
  get suppressesTail(): boolean {
    return this.tailSuppressed;
  }

  /** session_start: the first recovery (which may start the server) and the poll. */
  async start(): Promise<void> {
    this.unsubscribeConnections = this.options.server.onConnection(() => {
      // A new connection: a new coordinator epoch; read the view on it and report the branch again.
      void this.source.refresh();
    });
    const pollMs = this.options.pollMs ?? 1000;
    if (pollMs > 0) {
      this.timer = setInterval(() => void this.tick(), pollMs);
      this.timer.unref();
    }
    await this.recover(true);
  }

  /** session_shutdown. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    this.unsubscribeConnections?.();
    this.coordinator.stop();
    this.capture.stop();
    await this.source.stop();
  }

  /** One poll: connect (without starting a server), subscribe, read. */
  tick(): Promise<void> {
    return this.recover(false);
  }

  private async recover(mayStart: boolean): Promise<void> {
    if (this.stopped) return;
    if (!(await this.source.ensureConnected(mayStart))) return;
    this.source.ensureSubscribed();
    await this.source.refresh();
  }

  // ---- Pi events -------------------------------------------------------------

  onAgentStart(): void {
    this.tailSuppressed = false;
    this.turns.onAgentStart();
  }

  onAgentEnd(messages: readonly unknown[]): void {
    this.turns.onAgentEnd(messages);
  }

  onAgentSettled(aborted: boolean): void {
    this.turns.onAgentSettled(aborted);
    this.capture.endTurn(aborted);
    void this.recover(false);
  }

  /** A Pi event inside an agent run (message, tool, model call), for session capture. */
  onPiEvent(type: CapturedEventType, data: JsonValue): void {
    this.capture.event(type, data);
  }

  /** Shift+Up (-1) / Shift+Down (+1). */
  scrollBy(direction: -1 | 1): void {
    this.scroll += direction * SCROLL_STEP;
    this.render();
  }

  // ---- view ------------------------------------------------------------------

  private onView(view: LoadedView): void {
    if (this.stopped) return;
    this.coordinator.onView(view);
    void this.capture.flush();
    this.render();
    this.abortClosedWorkflowTurn(view);
    this.activateHeld(view);
  }

  private onUnavailable(error: WorkflowClientError): void {
    if (this.stopped || this.shown === undefined) return;
    this.shown = "unavailable";
    this.options.ui.setWidget([`⚠ pi-workflows server unavailable: ${Array.from(error.message).slice(0, 160).join("")}`]);
    this.options.ui.setStatus("wf [unavailable]");
  }

  /** Draws the widget and status line from the last view. */
  render(): void {
    if (this.stopped) return;
    const run = this.source.current?.run;
    if (run === undefined) {
      if (this.shown !== undefined) {
        this.options.ui.setWidget(undefined);
        this.options.ui.setStatus(undefined);
        this.shown = undefined;
      }
      return;
    }
    if (this.seenSteps !== run.steps.total) {
      // A new step: back to following the active node.
      this.seenSteps = run.steps.total;
      this.scroll = 0;
    }
    const maxLines = this.options.ui.mode === "tui" ? COMPONENT_WIDGET_LINES : STRING_WIDGET_LINES;
    const drawn = renderWidget(run, { nowMs: this.now(), maxLines, scroll: this.scroll, piwHint: this.options.piwHint === true });
    this.scroll = drawn.scroll;
    this.options.ui.setWidget(drawn.lines);
    this.options.ui.setStatus(statusLine(run));
    this.shown = "run";
  }

  /**
   * A workflow step turn whose step the server closed without its output
   * (the run ended, or the attempt is no longer the pending one: a timeout,
   * a cancellation, a lost claim) is stopped: the model cannot keep working
   * on a closed step. It is the extension's own abort, not a user's Escape.
   * A turn whose submission was accepted is never stopped: the runner's
   * continuation, even to the run's end, leaves it open until Pi ends it, so
   * its closing text and its capture finish normally.
   */
  private abortClosedWorkflowTurn(view: LoadedView): void {
    const turn = this.turns.activeWorkflowTurn();
    if (turn === undefined || turn.systemAborted || turn.stepAccepted || typeof turn.binding !== "object" || turn.binding.kind !== "step") return;
    if (this.options.pi.isIdle()) return;
    const run = view.run;
    const message = view.messages.find((candidate) => candidate.messageId === (turn.binding as { messageId: string }).messageId);
    const source = message !== undefined ? stepSourceOf(message) : undefined;
    const closed =
      run === undefined ||
      run.runId !== turn.binding.runId ||
      TERMINAL.has(run.display.status) ||
      (source !== undefined && pendingAttemptOf(run) !== undefined && pendingAttemptOf(run)?.attemptId !== source.attemptId);
    if (!closed) return;
    turn.systemAborted = true;
    this.turns.markSystemAbort();
    this.options.pi.abort();
  }

  /** Activates a held run the server offers to activate, while Pi is idle. */
  private activateHeld(view: LoadedView): void {
    const run = view.run;
    if (run === undefined || !run.display.controls.includes("activate") || this.activating.has(run.runId)) return;
    const { pi } = this.options;
    if (!pi.isIdle() || pi.hasPendingMessages()) return;
    this.activating.add(run.runId);
    void this.options.server
      .request("run.activate", { runId: run.runId, payload: {}, idempotent: `activate.${run.runId}` })
      .finally(() => {
        this.activating.delete(run.runId);
        void this.source.refresh();
      });
  }

  // ---- /workflow -------------------------------------------------------------

  /** Runs one `/workflow` command; its result is one notification. */
  async command(args: string): Promise<void> {
    const { ui } = this.options;
    const parsed = parseWorkflowCommand(args);
    try {
      const text = await this.commandText(parsed);
      ui.notify(text.text, text.level);
    } catch (error) {
      ui.notify(errorText(error), "error");
    }
    this.render();
  }

  private async commandText(command: ReturnType<typeof parseWorkflowCommand>): Promise<{ text: string; level: "info" | "warning" | "error" }> {
    const info = (text: string): { text: string; level: "info" } => ({ text, level: "info" });
    switch (command.kind) {
      case "error":
        return { text: command.message, level: "warning" };
      case "list":
        return info(await this.listText(command.offset));
      case "start": {
        const { server, sessionId, projectPath } = this.options;
        const started = await server.runStart({ workflow: command.workflow, input: command.input, executionMode: "interactive", projectPath, originSessionId: sessionId });
        await this.recover(true);
        return info(texts.startedText(command.workflow, started.receipt.runId));
      }
      case "status": {
        if (command.runId !== undefined) return info(texts.statusText(await this.options.server.runView(command.runId), undefined));
        const view = await this.freshView();
        // A view read before the server went away is not the current state.
        const down = this.source.unavailable;
        if (down !== undefined) return { text: texts.unavailableText(down.message), level: "warning" };
        return info(texts.statusText(view?.run, this.coordinator.currentProblem));
      }
      case "pause":
      case "resume":
        return this.control(command.kind);
      case "cancel":
        return this.cancel(undefined, undefined, "user");
      case "clear": {
        const run = (await this.freshView())?.run;
        await this.options.server.sessionViewClearTerminal(this.options.sessionId);
        await this.source.refresh();
        return info(texts.clearedText(run !== undefined && TERMINAL.has(run.display.status) ? run : undefined));
      }
      case "answer":
        return this.answer(command.runId, command.answer, undefined, true, command.text);
      case "recover":
        return this.recoverEffect(command.action, command.effectId);
      case "followUp":
        return this.followUp(command.prompt, undefined, undefined);
      case "cancelFollowUp":
        return this.cancelFollowUp(command.followUpId, undefined);
    }
  }

  /** Queues a follow-up of the named run, or of this session's run (active, or the finished one the view keeps). */
  private async followUp(prompt: string, runId: string | undefined, idempotencyKey: string | undefined): Promise<{ text: string; level: "info" | "warning"; runId?: string; followUpId?: string }> {
    const target = runId ?? (await this.freshView())?.run?.runId;
    if (target === undefined) return { text: texts.NO_RUN_TO_FOLLOW_TEXT, level: "warning" };
    const added = await this.options.server.followUpAdd(target, prompt, idempotencyKey !== undefined ? { idempotencyKey } : {});
    void this.source.refresh();
    return { text: texts.followUpQueuedText(target, added.receipt.followUpId), level: "info", runId: target, followUpId: added.receipt.followUpId };
  }

  private async cancelFollowUp(followUpId: string, idempotencyKey: string | undefined): Promise<{ text: string; level: "info" }> {
    await this.options.server.followUpCancel(followUpId, idempotencyKey !== undefined ? { idempotencyKey } : {});
    void this.source.refresh();
    return { text: texts.followUpCancelledText(followUpId), level: "info" };
  }

  private async listText(offset: number): Promise<string> {
    const page = await this.options.server.workflowsList({ projectPath: this.options.projectPath, offset, limit: texts.LIST_PAGE_ITEMS });
    return texts.listText(page.workflows, offset, page.total).text;
  }

  /** The view read now (a command acts on the server's current view, not a stale one). */
  private async freshView(): Promise<LoadedView | undefined> {
    await this.recover(true);
    return this.source.current;
  }

  private async control(kind: "pause" | "resume", idempotencyKey?: string): Promise<{ text: string; level: "info" | "warning" }> {
    const run = (await this.freshView())?.run;
    if (run === undefined || TERMINAL.has(run.display.status)) return { text: texts.NO_RUN_TEXT, level: "warning" };
    if (!run.display.controls.includes(kind)) return { text: texts.notAllowedText(run, kind), level: "warning" };
    const options = idempotencyKey !== undefined ? { idempotencyKey } : {};
    if (kind === "pause") await this.options.server.runPause(run.runId, options);
    else await this.options.server.runResume(run.runId, options);
    await this.source.refresh();
    return { text: kind === "pause" ? texts.pausingText(run) : texts.resumedText(run), level: "info" };
  }

  /**
   * Cancels `runId` (default: this session's run). `by`: "agent" when the
   * model cancels through the `workflow` tool, so the run's turn intent is
   * `agentCancelled`; "user" for `/workflow cancel` (cause `cancelled`).
   */
  private async cancel(runId: string | undefined, idempotencyKey: string | undefined, by: "agent" | "user"): Promise<{ text: string; level: "info" | "warning" }> {
    const { server, sessionId } = this.options;
    const options = idempotencyKey !== undefined ? { idempotencyKey } : {};
    const payload = { by } as const;
    if (runId !== undefined) {
      const view = await server.runView(runId);
      await server.runCancel(runId, options, payload);
      await this.source.refresh();
      return { text: texts.cancelledText(view), level: "info" };
    }
    const run = (await this.freshView())?.run;
    if (run !== undefined && !TERMINAL.has(run.display.status)) {
      if (!run.display.controls.includes("cancel")) return { text: texts.notAllowedText(run, "cancel"), level: "warning" };
      await server.runCancel(run.runId, options, payload);
      await this.source.refresh();
      return { text: texts.cancelledText(run), level: "info" };
    }
    if (run !== undefined) {
      await server.sessionViewClearTerminal(sessionId);
      await this.source.refresh();
      return { text: texts.clearedText(run), level: "info" };
    }
    return { text: texts.NO_RUN_TEXT, level: "warning" };
  }

  private async answer(runId: string | undefined, answer: JsonValue, idempotencyKey: string | undefined, human: boolean, text = ""): Promise<{ text: string; level: "info" | "warning" | "error" }> {
    const run = runId !== undefined ? await this.options.server.runView(runId) : (await this.freshView())?.run;
    if (run === undefined) return { text: texts.NO_WAITING_RUN_TEXT, level: "warning" };
    if (run.display.controls.includes("humanAnswer")) {
      return human ? this.answerDecision(run, answer, text) : { text: texts.HUMAN_ANSWER_TOOL_TEXT, level: "error" };
    }
    if (!run.display.controls.includes("answer")) return { text: runId === undefined ? texts.NO_WAITING_RUN_TEXT : texts.notAllowedText(run, "answer"), level: "warning" };
    const answered = await this.options.server.checkpointAnswer(run.runId, answer, idempotencyKey !== undefined ? { idempotencyKey } : {});
    await this.recover(true);
    return { text: texts.answeredText(run, answered.receipt.continuationRunId), level: "info" };
  }

  /**
   * `/workflow answer` on a protected decision: a person's answer, sent as
   * `decision.answer` with the request digest the view shows and the source
   * `{channel: pi, actorId: <this session>}`. The model's tool never comes
   * here (it gets `HUMAN_ANSWER_TOOL_TEXT`).
   */
  private async answerDecision(run: RunView, answer: JsonValue, text: string): Promise<{ text: string; level: "info" | "warning" | "error" }> {
    const decision = run.decision;
    if (decision === undefined) return { text: texts.NO_WAITING_RUN_TEXT, level: "warning" };
    const response = decisionResponse(decision.choices, answer, text);
    if ("error" in response) return { text: response.error, level: "warning" };
    const answered = await this.options.server.decisionAnswer(run.runId, {
      decisionId: decision.decisionId,
      requestDigest: decision.requestDigest,
      choice: response.choice,
      input: response.input,
      source: { channel: "pi", actorId: this.options.sessionId },
    });
    await this.recover(true);
    return { text: texts.answeredText(run, answered.receipt.continuationRunId), level: "info" };
  }

  /**
   * `/workflow recover confirm|retry [effectId]`: a person's review of an
   * ambiguous managed effect of this session's run, sent as `effect.recover`
   * only while the view offers `recoverEffect`. Without an id, the run's one
   * ambiguous effect. A retry is a warning: a duplicate is possible.
   */
  private async recoverEffect(action: RecoverAction, effectId: string | undefined): Promise<{ text: string; level: "info" | "warning" }> {
    const run = (await this.freshView())?.run;
    if (run === undefined) return { text: texts.NO_RUN_TEXT, level: "warning" };
    const { effects } = recoverableEffects(run);
    if (effects.length === 0) return { text: texts.recoverEffectNotAllowedText(run), level: "warning" };
    const ids = effects.map((effect) => effect.effectId);
    const effect = effectId !== undefined ? effects.find((candidate) => candidate.effectId === effectId) : effects.length === 1 ? effects[0] : undefined;
    if (effect === undefined) return { text: effectId !== undefined ? texts.noSuchEffectText(run, effectId, ids) : texts.nameTheEffectText(run, ids), level: "warning" };
    const recovered = await this.options.server.effectRecover(run.runId, { effectId: effect.effectId, action });
    await this.source.refresh();
    return { text: texts.recoveredText(run, effect, recovered.receipt), level: action === "retry" ? "warning" : "info" };
  }

  // ---- the workflow tool -----------------------------------------------------

  /** Runs one `workflow` tool call. */
  async tool(toolCallId: string, params: unknown, signal?: AbortSignal): Promise<ToolOutcome> {
    const parsed = parseToolCall(params);
    if (!parsed.ok) return { text: parsed.error, details: { action: actionOf(params) }, isError: true };
    const call = parsed.call;
    try {
      return await this.toolCall(call, toolCallId, signal);
    } catch (error) {
      return { text: errorText(error), details: { action: call.action }, isError: true };
    } finally {
      this.render();
    }
  }

  private async toolCall(call: ToolCall, toolCallId: string, signal: AbortSignal | undefined): Promise<ToolOutcome> {
    const key = keyOfToolCall(toolCallId);
    const ok = (text: string, details: Record<string, JsonValue> = {}): ToolOutcome => ({ text, details: { action: call.action, ...details }, isError: false });
    const fail = (text: string, details: Record<string, JsonValue> = {}): ToolOutcome => ({ text, details: { action: call.action, ...details }, isError: true });
    const settle = (result: { text: string; level: string }): ToolOutcome => (result.level === "info" ? ok(result.text) : fail(result.text));
    switch (call.action) {
      case "list":
        return ok(await this.listText(call.offset));
      case "start": {
        const { server, sessionId, projectPath } = this.options;
        const selectedLaunch = await this.selectedLaunch(key);
        const payload = { workflow: call.workflow, input: call.input, executionMode: "interactive", projectPath, originSessionId: sessionId, held: true, ...(selectedLaunch !== undefined ? { selectedLaunch } : {}) } as const;
        let started;
        try {
          started = await server.runStart(payload, { idempotencyKey: key });
        } catch (error) {
          if (selectedLaunch !== undefined && error instanceof WorkflowClientError && error.code === "conflict") return fail(texts.launchRefusedText(error.message));
          throw error;
        }
        void this.source.refresh();
        return ok(texts.queuedText(call.workflow, started.receipt.runId), { workflow: call.workflow, runId: started.receipt.runId, queued: true });
      }
      case "restart": {
        const selectedLaunch = await this.selectedLaunch(key);
        let restarted;
        try {
          restarted = await this.options.server.runRestart(call.runId, { idempotencyKey: key }, { held: true, ...(selectedLaunch !== undefined ? { selectedLaunch } : {}) });
        } catch (error) {
          if (error instanceof WorkflowClientError && error.code === "restartRefused") return fail(texts.restartRefusedText(call.runId, error.message), { runId: call.runId, refused: true });
          if (selectedLaunch !== undefined && error instanceof WorkflowClientError && error.code === "conflict") return fail(texts.launchRefusedText(error.message), { runId: call.runId });
          throw error;
        }
        void this.source.refresh();
        const newRunId = restarted.receipt.newRunId;
        return ok(texts.restartQueuedText(call.runId, newRunId, selectedLaunch !== undefined), { runId: call.runId, newRunId, queued: true });
      }
      case "followUp": {
        const added = await this.followUp(call.prompt, call.runId, key);
        if (added.followUpId === undefined) return fail(added.text);
        return ok(added.text, { runId: added.runId ?? null, followUpId: added.followUpId });
      }
      case "cancelFollowUp":
        return ok((await this.cancelFollowUp(call.followUpId, key)).text, { followUpId: call.followUpId });
      case "status": {
        if (call.runId !== undefined) return ok(texts.statusText(await this.options.server.runView(call.runId), undefined), { runId: call.runId });
        const run = (await this.freshView())?.run;
        return ok(texts.statusText(run, undefined), run !== undefined ? { runId: run.runId, status: run.display.status } : {});
      }
      case "pause":
      case "resume":
        return settle(await this.control(call.action, key));
      case "cancel":
        return settle(await this.cancel(call.runId, key, "agent"));
      case "answer":
        return settle(await this.answer(call.runId, call.input, key, false));
      case "update":
      case "submit":
        return this.stepCall(call, toolCallId, signal);
    }
  }

  /**
   * The selected launch of a tool call made in a terminal decision turn (the
   * turn a run's terminal message opened, DEFERRED_TURNS "Selected launch"):
   * the terminal message and the tool call's key, so the server reserves at
   * most one launch for that turn. Undefined in any other turn.
   */
  private async selectedLaunch(toolCallKey: string): Promise<{ messageId: string; toolCallId: string } | undefined> {
    const messageId = await this.turns.decisionMessage();
    return messageId === undefined ? undefined : { messageId, toolCallId: toolCallKey };
  }

  /** `update` and `submit`: only for the pending step of this session's run, as the server's view names it. */
  private async stepCall(call: Extract<ToolCall, { action: "update" | "submit" }>, toolCallId: string, signal: AbortSignal | undefined): Promise<ToolOutcome> {
    const fail = (text: string): ToolOutcome => ({ text, details: { action: call.action, step: call.step }, isError: true });
    const view = await this.freshView();
    const run = view?.run;
    const pending = run !== undefined ? pendingAttemptOf(run) : undefined;
    if (view === undefined || run === undefined || pending === undefined) return fail(texts.NO_PENDING_STEP_TEXT);
    if (call.step !== pending.nodeId) return fail(texts.wrongStepText(call.step, pending.nodeId));
    if (call.attempt !== pending.attemptId) return fail(texts.staleAttemptText(call.attempt));
    const control = call.action === "submit" ? "submit" : "update";
    if (!run.display.controls.includes(control)) return fail(texts.stepControlUnavailableText(pending.nodeId, call.action === "submit" ? "output" : "updates"));
    const source = view.messages
      .filter((message) => message.runId === run.runId)
      .map(stepSourceOf)
      .find((candidate) => candidate?.attemptId === pending.attemptId);
    if (source === undefined) return fail(texts.stepSourceUnknownText(pending.nodeId));
    if (view.coordinatorEpoch === undefined) {
      // Work of an interactive run is done under the session's coordinator epoch, which this connection does not hold.
      return fail(texts.serverRefusedStepText(pending.nodeId, call.action === "submit" ? "output" : "update", "this Pi session does not coordinate the run's messages (the server granted it no coordinator epoch)"));
    }
    const authority = { kind: "coordinator", sessionId: this.options.sessionId, coordinatorEpoch: view.coordinatorEpoch } as const;
    const key = keyOfToolCall(toolCallId);
    const { server } = this.options;
    try {
      if (call.action === "update") {
        const stored = await server.interactionUpdate(
          run.runId,
          { interactionId: source.interactionId, attemptId: source.attemptId, toolCallId: key, update: call.update, authority },
          { idempotencyKey: key, ...(signal !== undefined ? { signal } : {}) },
        );
        return { text: texts.updateRecordedText(pending.nodeId, call.update.type, call.update.key, stored.receipt.seq), details: { action: "update", step: pending.nodeId, updateId: stored.receipt.updateId }, isError: false };
      }
      const settled = await server.interactionSubmit(
        run.runId,
        { interactionId: source.interactionId, attemptId: source.attemptId, submissionId: keyOfToolCall(toolCallId, "sub"), output: call.output, authority },
        { idempotencyKey: key, ...(signal !== undefined ? { signal } : {}) },
      );
      if (settled.receipt.outcome === "accepted") {
        this.turns.markStepAccepted();
        this.tailSuppressed = true;
        void this.source.refresh();
        return { text: texts.acceptedText(pending.nodeId), details: { action: "submit", step: pending.nodeId, accepted: true }, isError: false };
      }
      return fail(texts.rejectedText(pending.nodeId, settled.receipt.error?.message ?? "the output does not match the step's expected output"));
    } catch (error) {
      return fail(texts.serverRefusedStepText(pending.nodeId, call.action === "submit" ? "output" : "update", errorText(error)));
    }
  }
}

/** The pending step of a run as its view names it: the display's waiting (or current) agent node and its unfinished attempt. */
export function pendingAttemptOf(run: RunView): { nodeId: string; attemptId: string } | undefined {
  if (run.display.status !== "waiting" && run.display.status !== "running") return undefined;
  const nodeId = run.display.waitingOn ?? run.display.currentNode;
  if (nodeId === undefined || run.nodes.find((node) => node.id === nodeId)?.nodeType !== "agent") return undefined;
  let step: StepRecord | undefined;
  for (const candidate of run.steps.items) if (candidate.nodeId === nodeId && candidate.finishedAtMs === undefined) step = candidate;
  const attempt = step?.attempts.filter((candidate) => candidate.finishedAtMs === undefined).at(-1);
  return attempt === undefined ? undefined : { nodeId, attemptId: attempt.attemptId };
}

function actionOf(params: unknown): string {
  const action = typeof params === "object" && params !== null ? (params as { action?: unknown }).action : undefined;
  return typeof action === "string" ? action.slice(0, 32) : "unknown";
}

/** A safe one-line text for an error (client errors carry only safe messages). */
export function errorText(error: unknown): string {
  if (error instanceof WorkflowClientError) return error.message;
  return "the workflow command failed unexpectedly; see `pi-workflows server status`";
}
