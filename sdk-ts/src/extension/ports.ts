/**
 * The two boundaries of the extension's logic, as narrow interfaces so that
 * every rule is unit-tested against fakes:
 * - `ServerPort`: the part of `WorkflowClient` the extension uses (the only
 *   way it talks to the server; it never opens SQLite);
 * - `PiPort`: the documented Pi APIs it uses (`pi.sendMessage`,
 *   `ctx.isIdle`, `ctx.hasPendingMessages`, `ctx.sessionManager.getBranch`,
 *   `ctx.abort`, `ctx.ui`).
 * `index.ts` binds both to the real objects.
 */
import type { Accepted, CommandOptions, ConnectOptions, RequestOptions, RequestSpec, Settled, SubscribeOptions } from "../client/client.js";
import type { SubscriptionEvent } from "../client/subscription.js";
import type {
  ContentReference,
  DecisionAnswerPayload,
  EffectRecoverPayload,
  InteractionSubmitPayload,
  InteractionUpdatePayload,
  JsonValue,
  Operation,
  ReportBranchPayload,
  RequestPayloadByOperation,
  ResponseReceiptByOperation,
  RunCancelPayload,
  RunRestartPayload,
  RunStartPayload,
  RunView,
  SessionEventsRecordPayload,
  SessionView,
  SubscriptionTarget,
  TurnReportPayload,
  ViewPage,
  ViewPagePayload,
} from "../generated/types.js";
import type { BranchEntryLike, Delivery } from "./messages.js";

/** A live subscription as the extension consumes it. */
export interface SubscriptionLike extends AsyncIterable<SubscriptionEvent> {
  close(): Promise<void>;
}

/** The `WorkflowClient` members the extension uses. */
export interface ServerPort {
  readonly connectionGeneration: number | undefined;
  onConnection(listener: (generation: number) => void): () => void;
  connect(options?: ConnectOptions): Promise<{ connectionGeneration: number }>;
  sessionView(payload: RequestPayloadByOperation["sessionView.get"], options?: RequestOptions): Promise<{ view: SessionView; connectionGeneration: number }>;
  sessionViewClearTerminal(sessionId: string, options?: CommandOptions): Promise<Accepted<"sessionView.clearTerminal">>;
  subscribe(target: SubscriptionTarget, options?: SubscribeOptions): Promise<SubscriptionLike>;
  page(runId: string, payload: ViewPagePayload, options?: RequestOptions): Promise<ViewPage>;
  readContent(reference: ContentReference, options?: RequestOptions & { runId?: string }): Promise<Uint8Array>;
  runView(runId: string, options?: RequestOptions): Promise<RunView>;
  workflowsList(payload: RequestPayloadByOperation["workflows.list"], options?: RequestOptions): Promise<ResponseReceiptByOperation["workflows.list"]>;
  runStart(payload: RunStartPayload, options?: CommandOptions): Promise<Accepted<"run.start">>;
  runPause(runId: string, options?: CommandOptions): Promise<Accepted<"run.pause">>;
  runResume(runId: string, options?: CommandOptions): Promise<Accepted<"run.resume">>;
  runCancel(runId: string, options?: CommandOptions, payload?: RunCancelPayload): Promise<Accepted<"run.cancel">>;
  runRestart(runId: string, options?: CommandOptions, payload?: RunRestartPayload): Promise<Accepted<"run.restart">>;
  followUpAdd(runId: string, prompt: string, options?: CommandOptions): Promise<Accepted<"followUp.add">>;
  followUpCancel(followUpId: string, options?: CommandOptions): Promise<Accepted<"followUp.cancel">>;
  checkpointAnswer(runId: string, answer: JsonValue, options?: CommandOptions): Promise<Accepted<"checkpoint.answer">>;
  decisionAnswer(runId: string, payload: DecisionAnswerPayload, options?: CommandOptions): Promise<Accepted<"decision.answer">>;
  effectRecover(runId: string, payload: EffectRecoverPayload, options?: CommandOptions): Promise<Accepted<"effect.recover">>;
  interactionSubmit(runId: string, payload: InteractionSubmitPayload, options?: CommandOptions): Promise<Accepted<"interaction.submit">>;
  interactionUpdate(runId: string, payload: InteractionUpdatePayload, options?: CommandOptions): Promise<Accepted<"interaction.update">>;
  reportBranch(payload: ReportBranchPayload, options?: RequestOptions): Promise<Settled<"workflowMessage.reportBranch">>;
  reportTurn(payload: TurnReportPayload, options?: RequestOptions): Promise<Settled<"workflowTurn.report">>;
  recordSessionEvents(payload: SessionEventsRecordPayload, options?: RequestOptions): Promise<Settled<"sessionEvents.record">>;
  request<Op extends Operation>(operation: Op, spec: RequestSpec<Op>): Promise<Settled<Op>>;
  close(): void;
}

/** The Pi session the coordinator and the turn reporter act on. */
export interface PiPort {
  isIdle(): boolean;
  hasPendingMessages(): boolean;
  /** `ctx.sessionManager.getBranch()`: the active branch, root first. */
  getBranch(): readonly BranchEntryLike[];
  /** `pi.sendMessage(message, {triggerTurn})`; synchronous, as Pi's is. */
  sendMessage(delivery: Delivery): void;
  /** `ctx.abort()`. */
  abort(): void;
}

/** The Pi UI the renderers use (`ctx.ui`). */
export interface UiPort {
  /** `"tui"`, `"rpc"`, `"json"` or `"print"` (`ctx.mode`). */
  readonly mode: string;
  notify(message: string, level: "info" | "warning" | "error"): void;
  setStatus(text: string | undefined): void;
  /** Lines for string-array widgets; the TUI binding draws them as a component. */
  setWidget(lines: readonly string[] | undefined): void;
}
