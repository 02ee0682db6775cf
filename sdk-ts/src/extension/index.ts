/**
 * `@pi-workflows/sdk/extension`: the Pi extension (load it with
 * `pi -e <sdk-ts dir>` or `pi install <sdk-ts dir>`; the package manifest
 * names `dist/extension/index.js`).
 *
 * This file only binds documented Pi APIs to the logic in `session.ts`:
 * `registerCommand`, `registerTool`, `registerShortcut`, `sendMessage`,
 * `ctx.ui.setWidget` / `setStatus` / `notify`, `ctx.isIdle`,
 * `ctx.hasPendingMessages`, `ctx.abort`, `ctx.sessionManager` and the
 * lifecycle events. The extension never opens SQLite and never runs workflow
 * code: every state change goes through `WorkflowClient` to the server.
 *
 * Invariants:
 * - Nothing starts in the factory (Pi may load it without a session): the
 *   client, the poll and the subscription start at `session_start` and stop
 *   at `session_shutdown`.
 * - The TUI gets a component widget (`ctx.mode === "tui"`); every other mode
 *   gets string lines (Pi caps them at 10).
 */
import type { ExtensionAPI, ExtensionContext } from "@earendil-works/pi-coding-agent";
import { truncateToWidth, wrapTextWithAnsi } from "@earendil-works/pi-tui";
import { WorkflowClient } from "../client/client.js";
import type { JsonValue } from "../generated/types.js";
import type { BranchEntryLike } from "./messages.js";
import type { PiPort, UiPort } from "./ports.js";
import { WorkflowSession } from "./session.js";
import { TOOL_DESCRIPTION, TOOL_NAME, WORKFLOW_TOOL_PARAMETERS } from "./tool.js";
import { RESERVED_WORDS, USAGE } from "./grammar.js";
import { WIDGET_KEY } from "./widget.js";
import { herdrAvailable, registerPiw } from "./piw.js";
import { registerWorkflowChannel } from "./channels.js";
import { registerController } from "./controllers.js";
import { DEFERRED_TURN_TYPE, deferredTurnCard } from "./deferred-turn.js";

export { WorkflowSession } from "./session.js";
export { WorkflowMessageCoordinator } from "./coordinator.js";
export { TurnReporter } from "./turns.js";
export { SessionViewSource } from "./view-source.js";
export { parseWorkflowCommand, RESERVED_WORDS } from "./grammar.js";
export { parseToolCall, WORKFLOW_TOOL_PARAMETERS } from "./tool.js";
export { renderWidget, statusLine } from "./widget.js";
export { PiwOpener, parsePiwArgs, piwPaneLabel } from "./piw.js";

/** A Pi value as plain JSON (undefined and functions dropped), for session capture. */
function json(value: unknown): JsonValue {
  try {
    return (JSON.parse(JSON.stringify(value ?? null)) as JsonValue) ?? null;
  } catch {
    return null;
  }
}

function piPort(pi: ExtensionAPI, ctx: ExtensionContext): PiPort {
  return {
    isIdle: () => ctx.isIdle(),
    hasPendingMessages: () => ctx.hasPendingMessages(),
    getBranch: () => ctx.sessionManager.getBranch() as unknown as readonly BranchEntryLike[],
    sendMessage: (delivery) =>
      pi.sendMessage(delivery.message, delivery.deliverAs === undefined ? { triggerTurn: delivery.triggerTurn } : { triggerTurn: delivery.triggerTurn, deliverAs: delivery.deliverAs }),
    abort: () => ctx.abort(),
  };
}

function uiPort(ctx: ExtensionContext): UiPort {
  return {
    mode: ctx.mode,
    notify: (message, level) => ctx.ui.notify(message, level),
    setStatus: (text) => ctx.ui.setStatus(WIDGET_KEY, text),
    setWidget: (lines) => {
      if (lines === undefined) {
        ctx.ui.setWidget(WIDGET_KEY, undefined);
        return;
      }
      const copy = [...lines];
      if (ctx.mode === "tui") {
        ctx.ui.setWidget(WIDGET_KEY, () => ({ render: (width: number) => copy.map((line) => truncateToWidth(line, Math.max(1, width))), invalidate: () => undefined }), {
          placement: "aboveEditor",
        });
      } else {
        ctx.ui.setWidget(WIDGET_KEY, copy);
      }
    },
  };
}

/** The extension factory. */
export default function piWorkflowsExtension(pi: ExtensionAPI): void {
  let session: WorkflowSession | undefined;
  let client: WorkflowClient | undefined;

  const current = (): WorkflowSession | undefined => session;

  pi.on("session_start", (_event, ctx) => {
    client = new WorkflowClient();
    session = new WorkflowSession({
      server: client,
      pi: piPort(pi, ctx),
      ui: uiPort(ctx),
      sessionId: ctx.sessionManager.getSessionId(),
      projectPath: ctx.cwd,
      getLeafId: () => ctx.sessionManager.getLeafId(),
      piwHint: herdrAvailable(),
    });
    // Recovery runs in the background: Pi's startup never waits for the server.
    void session.start();
  });

  pi.on("session_shutdown", async () => {
    const ending = session;
    const closing = client;
    session = undefined;
    client = undefined;
    await ending?.stop();
    closing?.close();
  });

  pi.on("agent_start", () => current()?.onAgentStart());
  pi.on("agent_end", (event) => current()?.onAgentEnd(event.messages));
  pi.on("agent_settled", (event) => current()?.onAgentSettled(event.aborted));

  // After an accepted submission, text the model still writes in that agent run is dropped:
  // the next workflow message is the visible continuation. Session capture records the message as kept.
  pi.on("message_end", (event) => {
    const message = event.message;
    const active = current();
    if (message.role !== "assistant" || active?.suppressesTail !== true) {
      active?.onPiEvent("message_finished", { role: message.role, message: json(message) });
      return undefined;
    }
    const kept = { ...message, content: message.content.filter((part) => part.type !== "text") };
    active.onPiEvent("message_finished", { role: message.role, message: json(kept) });
    return { message: kept };
  });
  // Session capture of a workflow turn (the session keeps only what the server accepts as workflow work).
  pi.on("message_start", (event) => current()?.onPiEvent("message_started", { role: event.message.role }));
  pi.on("tool_execution_start", (event) => current()?.onPiEvent("tool_execution_started", { toolCallId: event.toolCallId, toolName: event.toolName, args: json(event.args) }));
  pi.on("tool_execution_end", (event) =>
    current()?.onPiEvent("tool_execution_finished", {
      toolCallId: event.toolCallId,
      toolName: event.toolName,
      isError: event.isError,
      ...(event.durationMs !== undefined ? { durationMs: event.durationMs } : {}),
      result: json(event.result),
    }),
  );
  pi.on("turn_end", (event) =>
    current()?.onPiEvent("model_call_finished", { turnIndex: event.turnIndex, messageEntryId: event.messageEntryId, toolResultEntryIds: [...event.toolResultEntryIds] }),
  );

  pi.registerCommand("workflow", {
    description: "Run and control pi-workflows: /workflow [list] | <name> [task | --input-json <json>] | status | pause | resume | cancel | answer <json|text> | clear | then <prompt> | then cancel <id>",
    getArgumentCompletions: (prefix) =>
      RESERVED_WORDS.filter((word) => word.startsWith(prefix)).map((word) => ({ value: word, label: word })),
    handler: async (args, ctx) => {
      const active = current();
      if (active === undefined) {
        ctx.ui.notify(`pi-workflows is not ready in this session yet; try again. ${USAGE}`, "warning");
        return;
      }
      await active.command(args);
    },
  });

  pi.registerTool({
    name: TOOL_NAME,
    label: "Workflow",
    description: TOOL_DESCRIPTION,
    promptSnippet: "List, start, inspect and control pi-workflows runs; update or submit a workflow step when a step contract asks",
    parameters: WORKFLOW_TOOL_PARAMETERS,
    async execute(toolCallId, params, signal) {
      const active = current();
      if (active === undefined) {
        return { content: [{ type: "text", text: "pi-workflows is not ready in this session yet; try again." }], details: { action: "unknown" }, isError: true };
      }
      const outcome = await active.tool(toolCallId, params, signal);
      return { content: [{ type: "text", text: outcome.text }], details: outcome.details, isError: outcome.isError };
    },
  });

  // The terminal decision card: collapsed by default, the whole message when expanded (Ctrl+O).
  // Rendering only: a restored message draws the same card and sends nothing.
  pi.registerMessageRenderer(DEFERRED_TURN_TYPE, (message, options, theme) => {
    const style = { accent: (text: string) => theme.fg("accent", text), dim: (text: string) => theme.fg("dim", text), bold: (text: string) => theme.bold(text) };
    const lines = deferredTurnCard(message.details, message.content, options.expanded, style);
    return {
      render: (width: number) => {
        const room = Math.max(1, width);
        return options.expanded ? lines.flatMap((line) => wrapTextWithAnsi(line, room)) : lines.map((line) => truncateToWidth(line, room));
      },
      invalidate: () => undefined,
    };
  });
  pi.registerShortcut("shift+up", { description: "pi-workflows: scroll the workflow widget up", handler: () => current()?.scrollBy(-1) });
  pi.registerShortcut("shift+down", { description: "pi-workflows: scroll the workflow widget down", handler: () => current()?.scrollBy(1) });
  // `/workflow-channel status|reload|recover …`: the server's channel adapters.
  registerWorkflowChannel(pi, () => client);
  // `/controller list|get|apply|reconcile|delete …`: the server's managed resources (it loads no controller code).
  registerController(pi, () => client);
  // `/piw` and Ctrl+Shift+R open or focus piw on the run of this session's view.
  registerPiw(pi, () => {
    const run = current()?.view?.run;
    return run === undefined ? undefined : { runId: run.runId, workflowName: run.workflowName };
  });
}
