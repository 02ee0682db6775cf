/**
 * `/workflow-channel status | reload | recover confirm|retry <profile> <attemptId>`:
 * the server's supervised channel adapters (docs/CHANNELS.md) from Pi,
 * answered through `channel.status`, `channel.reload` and `channel.recover`.
 *
 * Invariants:
 * - Parsing is pure; a malformed command is one warning with the usage, and
 *   nothing is sent.
 * - Every answer is rendered from the server's receipt or its safe error:
 *   the server's status names no token, identity or path, and nothing here
 *   adds any.
 * - `recover retry` warns that a duplicate is possible, whatever the
 *   server answers; `confirm` records that the message did arrive.
 */
import type { CommandOutcome, RecoverAction, RequestPayloadByOperation, ResponseReceiptByOperation, SafeError } from "../generated/types.js";

/** The `/workflow-channel` usage. */
export const CHANNEL_USAGE =
  "Usage: /workflow-channel status | reload | recover confirm|retry <profile> <attemptId> (confirm: the message did arrive; retry: send or edit it again, a duplicate is possible)";

/** The warning every retry carries. */
export const CHANNEL_DUPLICATE_WARNING =
  "a duplicate is possible: if the earlier attempt reached Telegram, the chat may show the decision twice; answer only one of the two messages";

const NAME = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/** One parsed `/workflow-channel` command. */
export type ChannelCommand =
  | { kind: "status" }
  | { kind: "reload" }
  | { kind: "recover"; action: RecoverAction; profile: string; attemptId: string }
  | { kind: "error"; message: string };

/** Parses the arguments of `/workflow-channel`. */
export function parseChannelCommand(args: string): ChannelCommand {
  const words = args.trim().split(/\s+/).filter((word) => word !== "");
  const [verb, ...rest] = words;
  if (verb === undefined || (verb === "status" && rest.length === 0)) return { kind: "status" };
  if (verb === "reload" && rest.length === 0) return { kind: "reload" };
  if (verb === "recover") {
    const [action, profile, attemptId, ...extra] = rest;
    if ((action === "confirm" || action === "retry") && profile !== undefined && attemptId !== undefined && extra.length === 0) {
      if (!NAME.test(profile)) return { kind: "error", message: `Not a channel profile name: ${profile.slice(0, 40)}. ${CHANNEL_USAGE}` };
      if (!NAME.test(attemptId)) return { kind: "error", message: `Not a channel attempt id: ${attemptId.slice(0, 40)}. ${CHANNEL_USAGE}` };
      return { kind: "recover", action, profile, attemptId };
    }
  }
  return { kind: "error", message: CHANNEL_USAGE };
}

/** What the server answered, as `WorkflowClient.request` resolves it. */
export interface ChannelSettled<Op extends "channel.status" | "channel.reload" | "channel.recover"> {
  outcome: CommandOutcome;
  receipt?: ResponseReceiptByOperation[Op];
  error?: SafeError;
}

/** The one client call `/workflow-channel` makes (`WorkflowClient.request`). */
export interface ChannelServer {
  request<Op extends "channel.status" | "channel.reload" | "channel.recover">(
    operation: Op,
    spec: { payload: RequestPayloadByOperation[Op]; idempotent: boolean },
  ): Promise<ChannelSettled<Op>>;
}

/** A rendered answer. */
export interface ChannelReply {
  text: string;
  level: "info" | "warning" | "error";
}

function refusal(what: string, settled: { outcome: CommandOutcome; error?: SafeError }): ChannelReply {
  const why = settled.error?.message ?? `the server answered ${settled.outcome}`;
  return { text: `${what} was refused: ${why}`, level: "error" };
}

/** Runs one parsed command against the server and renders its answer. */
export async function runChannelCommand(server: ChannelServer, command: ChannelCommand): Promise<ChannelReply> {
  switch (command.kind) {
    case "error":
      return { text: command.message, level: "warning" };
    case "status": {
      const settled = await server.request("channel.status", { payload: {}, idempotent: false });
      if (settled.outcome !== "accepted" || settled.receipt === undefined) return refusal("channel status", settled);
      return renderChannelStatus(settled.receipt);
    }
    case "reload": {
      const settled = await server.request("channel.reload", { payload: {}, idempotent: true });
      if ((settled.outcome !== "accepted" && settled.outcome !== "adopted") || settled.receipt === undefined) return refusal("channel reload", settled);
      return { text: `Reloading ${settled.receipt.reloaded} channel profile(s); see /workflow-channel status.`, level: "info" };
    }
    case "recover": {
      const settled = await server.request("channel.recover", {
        payload: { profile: command.profile, attemptId: command.attemptId, action: command.action },
        idempotent: true,
      });
      const warning = command.action === "retry" ? ` Warning: ${CHANNEL_DUPLICATE_WARNING}.` : "";
      if ((settled.outcome !== "accepted" && settled.outcome !== "adopted") || settled.receipt === undefined) {
        const refused = refusal(`channel recover ${command.action}`, settled);
        return { text: `${refused.text}.${warning}`, level: "error" };
      }
      if (command.action === "confirm") {
        return { text: `Confirmed ${command.attemptId} of profile ${command.profile}: recorded as done (${settled.receipt.state}).`, level: "info" };
      }
      return { text: `Profile ${command.profile} will try it again as ${settled.receipt.attemptId}.${warning}`, level: "warning" };
    }
  }
}

/** The status receipt as lines: one per profile, and the configuration's diagnostic. */
export function renderChannelStatus(status: ResponseReceiptByOperation["channel.status"]): ChannelReply {
  const lines: string[] = [];
  if (status.diagnostic !== undefined) lines.push(`channels: ${status.diagnostic}`);
  if (status.channels.length === 0 && status.diagnostic === undefined) lines.push("No channel profiles are configured (docs/CHANNELS.md).");
  for (const row of status.channels) {
    let line = `${row.profile}: ${row.state}`;
    if (row.attemptId !== undefined) line += ` (last send ${row.attemptId})`;
    if (row.diagnostic !== undefined) line += ` — ${row.diagnostic}`;
    lines.push(line);
  }
  const troubled = status.diagnostic !== undefined || status.channels.some((row) => row.state === "failed");
  return { text: lines.join("\n"), level: troubled ? "warning" : "info" };
}

/** The documented Pi APIs `/workflow-channel` uses (typed here so that the unit build needs no Pi types). */
export interface ChannelHost {
  registerCommand(
    name: string,
    options: {
      description?: string;
      getArgumentCompletions?: (prefix: string) => { value: string; label: string }[] | null;
      handler: (args: string, ctx: { ui: { notify(message: string, level: "info" | "warning" | "error"): void } }) => Promise<void>;
    },
  ): void;
}

const VERBS = ["status", "reload", "recover confirm", "recover retry"] as const;

/** Registers `/workflow-channel` on `pi`; `server` is the session's client (undefined before `session_start`). */
export function registerWorkflowChannel(pi: ChannelHost, server: () => ChannelServer | undefined): void {
  pi.registerCommand("workflow-channel", {
    description: "Channel adapters (Telegram): /workflow-channel status | reload | recover confirm|retry <profile> <attemptId>",
    getArgumentCompletions: (prefix) => VERBS.filter((verb) => verb.startsWith(prefix)).map((verb) => ({ value: verb, label: verb })),
    handler: async (args, ctx) => {
      const command = parseChannelCommand(args);
      if (command.kind === "error") {
        ctx.ui.notify(command.message, "warning");
        return;
      }
      const client = server();
      if (client === undefined) {
        ctx.ui.notify(`pi-workflows is not ready in this session yet; try again. ${CHANNEL_USAGE}`, "warning");
        return;
      }
      let reply: ChannelReply;
      try {
        reply = await runChannelCommand(client, command);
      } catch (error) {
        reply = { text: `The pi-workflows server could not be reached: ${error instanceof Error ? error.message : String(error)}`, level: "error" };
      }
      ctx.ui.notify(reply.text, reply.level);
    },
  });
}
