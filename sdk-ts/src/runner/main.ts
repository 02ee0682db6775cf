/**
 * `pi-workflows-runner`: the child process the server supervises for one run
 * generation (or one source resolution).
 *
 * - resolve mode: discover the reference, hash the sources, compile (no node
 *   callback runs), normalize the input, answer `resolve.result` or
 *   `resolve.failed`. After `resolve.failed`, exit 0. A `resolve.result`
 *   says `awaitsRun`: the process keeps the compiled workflow and reads one
 *   more stdin line, the run launch of that run's first generation, and runs
 *   it as run mode does, except that nothing loads again: the saved sources
 *   must still verify and be the ones it compiled (otherwise the run parks
 *   `workflowSourceChanged`). EOF instead of a launch: exit 0.
 * - run mode: verify the saved root and mounted hashes before loading any
 *   module (a mismatch parks the run `workflowSourceChanged`, exit 0); load;
 *   re-check the complete source map and the definition digest; send
 *   `runner.ready`; read the command's run state (inline, or a verified
 *   content reference: an unreadable one is one log line, `runner.exiting
 *   fatal` and exit 2); run the attempts the server names, one at a time,
 *   until a reply says `exit`.
 *
 * - validate mode: verify and load like run mode, then run the node's
 *   `validate` on the provisional submission the `validate` command carries
 *   and report `interaction.accepted` or `interaction.rejected`, exit 0.
 *
 * SIGTERM (the server stopping the run), a `claimLost` reply or a closed
 * channel abort the running callback, stop every shell process group and end
 * the process without proposing anything more.
 *
 * Exit codes: 0 done; 2 a bad launch or a refused message; 3 claim lost;
 * 4 the channel closed; 143 stopped by a signal.
 */
import { appendFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import type { Readable, Writable } from "node:stream";
import { type CompiledWorkflow, type LoadedWorkflow, compileWorkflow, sha256Digest } from "../authoring/compile.js";
import { IncludeCycleError, WorkflowDefinitionError } from "../authoring/errors.js";
import { normalizeOutput } from "../authoring/json.js";
import type {
  ExitReason,
  ResolveFailureCode,
  SourceIdentity,
  WorkerLaunch,
  WorkflowSource,
  RunState as WireRunState,
} from "../generated/types.js";
import { defaultHome } from "../home.js";
import { canonicalString } from "../protocol/canonical.js";
import { ChannelClosedError, ContentReadError, FrameRefused, RunnerChannel, readLaunch, refusalReason } from "./channel.js";
import { BUILTIN_WORKFLOWS, WorkflowNotFoundError, resolveWorkflowRef } from "./discovery.js";
import { Executor, RESOLVE_BOUND_MS, safeMessage, withBound } from "./execute.js";
import { WorkflowLoadError, configureLoading, fileCompileHost, hashFile, loadSummary, loadWorkflowFile, rememberVerified } from "./loader.js";
import { liveGroups, signalGroup } from "./shell.js";
import { MAX_INPUT_DEPTH, RunState, stateDepthProblem } from "./state.js";
import type { FrameDecoder } from "../protocol/framing.js";
import { TransformCache } from "./transform-cache.js";
import { CodeCache } from "./code-cache.js";

export const EXIT_OK = 0;
export const EXIT_PROTOCOL = 2;
export const EXIT_CLAIM_LOST = 3;
export const EXIT_CHANNEL_CLOSED = 4;
export const EXIT_SIGNALLED = 143;

const WIRE_NODE_ID = /^[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,255}$/;

function log(line: string): void {
  process.stderr.write(`pi-workflows-runner[${process.pid}]: ${line}\n`);
}

/**
 * Start-up milestones, in ms since this process started (`performance.now()`):
 * the runner's modules evaluated (`main` called), the launch read, the
 * sources verified, the workflow loaded and compiled, the first answer sent.
 * `startupLine` logs them once, for the runner log and `npm run bench:runner`.
 */
const milestones: [string, number][] = [];

function milestone(name: string): void {
  milestones.push([name, performance.now()]);
}

/**
 * `start-up: node 21.3, modules 35.1, launch 1.0, ... (ready 80.2 ms after the process started)`: each phase's own duration.
 * A resolver handed its run adds `run launch` (how long it waited for it) and ends `ready 2.1 ms after its run launch`.
 */
function startupLine(end: string): string {
  milestone(end);
  const bootstrap = (performance as unknown as { nodeTiming?: { bootstrapComplete?: number } }).nodeTiming?.bootstrapComplete ?? 0;
  let previous = bootstrap;
  const phases = [`node ${bootstrap.toFixed(1)}`];
  let handed: number | undefined;
  for (const [name, at] of milestones) {
    phases.push(`${name} ${(at - previous).toFixed(1)}`);
    if (name === RUN_LAUNCH) handed = at;
    previous = at;
  }
  const since = handed === undefined ? "" : `, ${(previous - handed).toFixed(1)} ms after its run launch`;
  return `start-up: ${phases.join(", ")} (${end} ${previous.toFixed(1)} ms after the process started${since})`;
}

/** The milestone of a resolver's run launch. */
const RUN_LAUNCH = "run launch";

function journal(runId: string): (record: Record<string, unknown>) => void {
  const path = process.env.PI_WORKFLOWS_RUNNER_JOURNAL;
  if (!path) return () => undefined;
  return (record) => {
    try {
      appendFileSync(path, `${JSON.stringify({ runId, at: Date.now(), ...record })}\n`);
    } catch (error) {
      log(`journal: ${error instanceof Error ? error.message : String(error)}`);
    }
  };
}

/** Loads the root named by a source identity (a file or a built-in). */
async function loadRoot(identity: SourceIdentity): Promise<LoadedWorkflow> {
  if (identity.kind === "builtin") {
    const builtin = BUILTIN_WORKFLOWS.get(identity.id);
    if (!builtin) throw new WorkflowNotFoundError(`no built-in workflow ${identity.id}`);
    return { definition: builtin.definition, source: { kind: "builtin", id: builtin.id, revision: builtin.revision } };
  }
  const hash = await hashFile(identity.path);
  return { definition: await loadWorkflowFile(identity.path), source: { kind: "file", path: identity.path, hash } };
}

/** Re-reads every saved identity; returns the first mismatch, or null. `onVerified` receives the bytes of each file that matched. */
export async function verifySources(source: WorkflowSource, onVerified?: (path: string, bytes: Buffer) => void): Promise<string | null> {
  for (const identity of [source.root, ...source.mounted]) {
    if (identity.kind === "builtin") {
      const builtin = BUILTIN_WORKFLOWS.get(identity.id);
      if (!builtin || builtin.revision !== identity.revision) return `built-in ${identity.id} is not at revision ${identity.revision}`;
      continue;
    }
    let bytes: Buffer;
    try {
      bytes = await readFile(identity.path);
    } catch {
      return `${identity.path} is missing`;
    }
    if (sha256Digest(bytes) !== identity.hash) return `${identity.path} changed`;
    onVerified?.(identity.path, bytes);
  }
  return null;
}

function sameSource(a: WorkflowSource, b: WorkflowSource): boolean {
  return canonicalString(a) === canonicalString(b);
}

/** The first node id the wire cannot carry (protocol v1 NodeId), or null. */
export function unwireableNodeId(compiled: CompiledWorkflow): string | null {
  for (const node of compiled.topology.nodes) if (!WIRE_NODE_ID.test(node.id)) return node.id;
  return null;
}

interface Failure {
  code: ResolveFailureCode;
  message: string;
}

function classify(error: unknown): Failure {
  const message = error instanceof Error ? error.message : String(error);
  if (error instanceof WorkflowNotFoundError) return { code: "sourceNotFound", message };
  if (error instanceof WorkflowLoadError) return { code: "compileFailed", message };
  if (error instanceof IncludeCycleError || error instanceof WorkflowDefinitionError) return { code: "invalidDefinition", message };
  return { code: "compileFailed", message };
}

/**
 * Resolve mode: answers exactly one `resolve.result` or `resolve.failed`.
 * Returns the compiled workflow it answered with (the result says
 * `awaitsRun`: the caller waits for the run's launch), or null when it
 * answered `resolve.failed` or could not answer.
 */
export async function resolveMode(channel: RunnerChannel, launch: WorkerLaunch): Promise<CompiledWorkflow | null> {
  const target = launch.resolve;
  if (!target) {
    log("resolve mode without `resolve`");
    return null;
  }
  let failure: Failure | undefined;
  try {
    const ref = await resolveWorkflowRef(target.workflow, { projectPath: launch.projectPath });
    const root =
      ref.kind === "builtin"
        ? await loadRoot({ kind: "builtin", id: ref.builtin.id, revision: ref.builtin.revision })
        : await loadRoot({ kind: "file", path: ref.path, hash: "" });
    const compiled = await compileWorkflow(root, fileCompileHost(launch.projectPath));
    milestone("load+compile");
    log(loadSummary());
    const changed = await verifySources(compiled.source);
    if (changed !== null) {
      failure = { code: "sourceChanged", message: `the workflow source changed while it was compiled: ${changed}` };
    }
    const bad = unwireableNodeId(compiled);
    if (!failure && bad !== null) {
      failure = {
        code: "invalidDefinition",
        message: `compiled node id ${JSON.stringify(bad)} cannot travel on runner.v1: node ids are at most 256 characters of [A-Za-z0-9_.:/-]; shorten the include mount path or the node id`,
      };
    }
    let input: unknown;
    let title: string | undefined;
    if (!failure) {
      try {
        const raw = target.input === undefined ? null : target.input;
        input = normalizeOutput(compiled.definition.input ? compiled.definition.input(raw) : raw, "the normalized input");
        const tooDeep = stateDepthProblem(input, "the normalized input", MAX_INPUT_DEPTH, "command.state.value.input");
        if (tooDeep !== null) throw new Error(tooDeep);
      } catch (error) {
        failure = { code: "invalidInput", message: `invalid input: ${error instanceof Error ? error.message : String(error)}` };
      }
    }
    if (!failure) {
      const spec = compiled.definition.title;
      try {
        const value =
          typeof spec === "function"
            ? await withBound(Promise.resolve().then(() => spec({ input, workflowName: compiled.definition.name })), RESOLVE_BOUND_MS, "title()")
            : spec;
        if (value !== undefined && typeof value !== "string") throw new Error("title() must return a string");
        title = value?.slice(0, 512);
      } catch (error) {
        failure = { code: "invalidInput", message: `the run title could not be resolved: ${error instanceof Error ? error.message : String(error)}` };
      }
    }
    if (!failure) {
      const result = {
        workflowName: compiled.definition.name,
        workflowSource: compiled.source,
        definitionDigest: compiled.definitionDigest,
        topology: compiled.topology,
        input: input as never,
        ...(title !== undefined && title !== "" ? { title } : {}),
        awaitsRun: true as const,
      };
      const refused = channel.check("resolve.result", result);
      if (refused === null) {
        log(`resolved ${target.workflow} (${compiled.topology.nodes.length} nodes, ${compiled.definitionDigest})`);
        await channel.send("resolve.result", result);
        log(startupLine("resolved"));
        return compiled;
      }
      // The wire cannot carry the resolved run: say whether its input or its workflow is the cause.
      failure =
        channel.check("resolve.result", { ...result, input: null }) === null
          ? { code: "invalidInput", message: refusalReason(refused, "the normalized input", input) }
          : { code: "invalidDefinition", message: `the compiled workflow cannot be sent to the server: ${refused.message}` };
    }
  } catch (error) {
    log(loadSummary());
    failure = classify(error);
  }
  log(`resolve failed: ${failure.code}: ${failure.message}`);
  await channel.send("resolve.failed", { code: failure.code, message: safeMessage(failure.message) });
  return null;
}

/**
 * A resolver's wait for its run: the next stdin line is the run launch of
 * the run it resolved (returned), or EOF (null: the server did not hand it
 * a run, and the process exits 0). Nothing else is read meanwhile.
 */
async function awaitRunLaunch(input: Readable, decoder: FrameDecoder): Promise<WorkerLaunch | null> {
  try {
    const { launch } = await readLaunch(input, decoder);
    milestone(RUN_LAUNCH);
    return launch;
  } catch (error) {
    if (error instanceof ChannelClosedError) return null;
    throw error;
  }
}

/** The saved workflow, loaded only after its sources verify, and re-checked after loading. */
type Loaded =
  | { kind: "loaded"; compiled: CompiledWorkflow }
  | { kind: "changed"; when: "before" | "after"; detail: string }
  | { kind: "unloadable"; message: string };

async function loadVerified(saved: WorkflowSource, launch: WorkerLaunch): Promise<Loaded> {
  // The bytes verified here are the bytes the native loader runs.
  const changed = await verifySources(saved, rememberVerified);
  milestone("verify");
  if (changed !== null) return { kind: "changed", when: "before", detail: changed };
  let compiled: CompiledWorkflow;
  try {
    compiled = await compileWorkflow(await loadRoot(saved.root), fileCompileHost(launch.projectPath));
    milestone("load+compile");
    log(loadSummary());
  } catch (error) {
    log(loadSummary());
    return { kind: "unloadable", message: error instanceof Error ? error.message : String(error) };
  }
  const rechanged = await verifySources(saved);
  if (rechanged !== null || !sameSource(compiled.source, saved) || (launch.definitionDigest !== undefined && compiled.definitionDigest !== launch.definitionDigest)) {
    const detail = rechanged ?? (sameSource(compiled.source, saved) ? "the definition digest differs" : "the mounted sources differ");
    return { kind: "changed", when: "after", detail };
  }
  milestone("recheck");
  return { kind: "loaded", compiled };
}

/**
 * The workflow a resolver compiled, for the run it was handed: the saved
 * sources (the hashes the server stored from this very resolution) are read
 * and hashed again, and must be the sources and definition it compiled.
 * Nothing loads: the modules that ran at resolution were the bytes hashed
 * then (the native loader serves exactly those bytes; jiti's load was
 * bracketed by the hash before and the check after it).
 */
async function keepResolved(saved: WorkflowSource, launch: WorkerLaunch, compiled: CompiledWorkflow): Promise<Loaded> {
  const changed = await verifySources(saved);
  milestone("verify");
  if (changed !== null) return { kind: "changed", when: "before", detail: changed };
  if (!sameSource(compiled.source, saved) || (launch.definitionDigest !== undefined && compiled.definitionDigest !== launch.definitionDigest)) {
    const detail = sameSource(compiled.source, saved) ? "the definition digest differs" : "the run launch names other sources than the ones resolved";
    return { kind: "changed", when: "after", detail };
  }
  return { kind: "loaded", compiled };
}

/**
 * Validate mode: the only process that runs a node's `validate` on a
 * provisional submission. Verify and load like run mode, `runner.ready`,
 * read the `validate` command (the attempt, its run state, the submitted
 * output), then report exactly one `interaction.accepted` (with the
 * normalized output) or `interaction.rejected` (with the actionable error)
 * and exit. A changed source rejects the submission: no changed code runs.
 */
export async function validateMode(channel: RunnerChannel, launch: WorkerLaunch, stopSignal: AbortSignal): Promise<number> {
  const saved = launch.workflowSource;
  const target = launch.validate;
  if (!saved || !target) {
    log("validate mode without `workflowSource` and `validate`");
    return EXIT_PROTOCOL;
  }
  const ids = { interactionId: target.interactionId, submissionId: target.submissionId };
  const reject = async (code: "sourceChanged" | "validationFailed", message: string): Promise<number> => {
    await channel.request("interaction.rejected", { ...ids, error: { code, message: safeMessage(message) } });
    await channel.send("runner.exiting", { reason: "finished" });
    return EXIT_OK;
  };
  const loaded = await loadVerified(saved, launch);
  if (loaded.kind === "changed") {
    log(`source changed ${loaded.when} loading (${loaded.detail}); rejecting the submission`);
    return reject("sourceChanged", `the workflow source changed since the run started (${loaded.detail}); restore it, then submit again`);
  }
  if (loaded.kind === "unloadable") return reject("sourceChanged", `the workflow no longer loads: ${loaded.message}`);
  const dispatch = await channel.ready();
  if (dispatch.kind === "reply") {
    log(`runner.ready was answered ${dispatch.reply.outcome}${dispatch.reply.error ? ` (${dispatch.reply.error.code}: ${dispatch.reply.error.message})` : ""}`);
    await channel.send("runner.exiting", { reason: dispatch.reply.next?.kind === "exit" ? dispatch.reply.next.reason : "fatal" });
    return dispatch.reply.next?.kind === "exit" ? EXIT_OK : EXIT_PROTOCOL;
  }
  const command = dispatch.command;
  if (command.command !== "validate" || command.submission === undefined || command.node.attemptId !== target.attemptId || command.node.nodeId !== target.nodeId) {
    log(`validate mode got a ${command.command} command for ${command.node.nodeId}/${command.node.attemptId}`);
    await channel.send("runner.exiting", { reason: "fatal" });
    return EXIT_PROTOCOL;
  }
  const state = new RunState(await channel.runState(command.state));
  const executor = new Executor({
    channel,
    compiled: loaded.compiled,
    state,
    runId: launch.runId,
    projectPath: launch.projectPath,
    log,
    stopSignal,
    journal: journal(launch.runId),
  });
  const verdict = await executor.validateSubmission(command.node, command.submission.output);
  if (!verdict.accepted) {
    log(`submission ${target.submissionId} rejected`);
    return reject("validationFailed", verdict.message);
  }
  try {
    await channel.request("interaction.accepted", { ...ids, output: verdict.output as never });
  } catch (error) {
    if (!(error instanceof FrameRefused)) throw error;
    return reject("validationFailed", refusalReason(error, "the validated output", verdict.output));
  }
  log(`submission ${target.submissionId} accepted`);
  await channel.send("runner.exiting", { reason: "finished" });
  return EXIT_OK;
}

/**
 * Run mode: verify, load, ready, then run what the server names until it
 * says exit. `resolved`: the workflow this process compiled as the run's
 * resolver; it is verified again and kept instead of loaded (`keepResolved`).
 */
export async function runMode(channel: RunnerChannel, launch: WorkerLaunch, stopSignal: AbortSignal, resolved?: CompiledWorkflow): Promise<number> {
  const saved = launch.workflowSource;
  if (!saved) {
    log("run mode without `workflowSource`");
    return EXIT_PROTOCOL;
  }
  const record = journal(launch.runId);
  const loaded = resolved === undefined ? await loadVerified(saved, launch) : await keepResolved(saved, launch, resolved);
  if (loaded.kind === "changed") {
    log(`source changed ${loaded.when} loading (${loaded.detail}); parking`);
    record({ event: "parked", reason: "workflowSourceChanged", detail: loaded.detail });
    await channel.request("run.parked", { reason: "workflowSourceChanged" });
    return EXIT_OK;
  }
  if (loaded.kind === "unloadable") {
    log(`cannot load the verified workflow: ${loaded.message}`);
    await channel.request("run.finished", {
      outcome: "failed",
      error: { code: "sourceChanged", message: safeMessage(`the workflow no longer loads: ${loaded.message}`) },
      failureClass: "sourceChanged",
    });
    return EXIT_OK;
  }
  const compiled = loaded.compiled;
  const ready = channel.ready();
  log(startupLine("ready"));
  const dispatch = await ready;
  if (dispatch.kind === "reply") {
    const reply = dispatch.reply;
    if (reply.next?.kind === "exit") {
      await channel.send("runner.exiting", { reason: reply.next.reason });
      record({ event: "exit", reason: reply.next.reason });
      return EXIT_OK;
    }
    log(`runner.ready was answered ${reply.outcome}${reply.error ? ` (${reply.error.code}: ${reply.error.message})` : ""}`);
    return EXIT_PROTOCOL;
  }
  const command = dispatch.command;
  let wireState: WireRunState;
  try {
    wireState = await channel.runState(command.state);
  } catch (error) {
    if (!(error instanceof ContentReadError)) throw error;
    log(`the run state of the ${command.command} command could not be read: ${error.code}: ${error.message}`);
    record({ event: "stateUnreadable", code: error.code });
    await channel.send("runner.exiting", { reason: "fatal" });
    return EXIT_PROTOCOL;
  }
  const state = new RunState(wireState);
  record({ event: "command", command: command.command, node: command.node, state: { ...wireState, outputs: state.outputs } });
  const executor = new Executor({
    channel,
    compiled,
    state,
    runId: launch.runId,
    projectPath: launch.projectPath,
    log,
    stopSignal,
    journal: record,
  });
  let target = command.node;
  for (;;) {
    const after = await executor.run(target);
    const reply = after.reply;
    if (after.kind === "exit") {
      const reason: ExitReason = reply.next?.kind === "exit" ? reply.next.reason : "waiting";
      await channel.send("runner.exiting", { reason });
      record({ event: "exit", reason });
      return EXIT_OK;
    }
    if (reply.outcome !== "accepted" && reply.outcome !== "adopted") {
      log(`the result of ${target.nodeId} was answered ${reply.outcome}${reply.error ? ` (${reply.error.code}: ${reply.error.message})` : ""}`);
      await channel.send("runner.exiting", { reason: "fatal" });
      return EXIT_PROTOCOL;
    }
    const next = reply.next;
    if (!next) {
      log(`the reply to ${target.nodeId} carries no next instruction`);
      await channel.send("runner.exiting", { reason: "fatal" });
      return EXIT_PROTOCOL;
    }
    if (next.kind === "exit") {
      await channel.send("runner.exiting", { reason: next.reason });
      record({ event: "exit", reason: next.reason });
      return EXIT_OK;
    }
    // The reply carries the next dispatch and, for a static timeout, the deadline committed with this result.
    target = { nodeId: next.nodeId, attemptId: next.attemptId, visit: next.visit, ...(next.deadline ? { deadline: next.deadline } : {}) };
  }
}

/** Stops every live shell group: SIGTERM, then SIGKILL after `graceMs`. */
async function stopShells(graceMs: number): Promise<void> {
  const groups = [...liveGroups];
  if (groups.length === 0) return;
  for (const pid of groups) signalGroup(pid, "SIGTERM");
  await new Promise((resolve) => setTimeout(resolve, graceMs));
  for (const pid of groups) signalGroup(pid, "SIGKILL");
}

async function flush(output: Writable): Promise<void> {
  await new Promise<void>((resolve) => output.write("", () => resolve()));
}

/** Runs the runner on this process's stdio and returns its exit code. */
export async function main(input: Readable = process.stdin, output: Writable = process.stdout): Promise<number> {
  milestone("modules");
  const home = defaultHome();
  // Before the first frame, which needs them: the runner channel's validators, from their code cache.
  const code = CodeCache.loadValidators(TransformCache.open(home, "code"));
  milestone("validators");
  log(`runner validators: code cache ${code.use}`);
  let launch: WorkerLaunch;
  let decoder: FrameDecoder;
  try {
    ({ launch, decoder } = await readLaunch(input));
  } catch (error) {
    log(`launch envelope: ${error instanceof Error ? error.message : String(error)}`);
    return EXIT_PROTOCOL;
  }
  milestone("launch");
  const launched = (launch: WorkerLaunch): void =>
    log(`launched: mode ${launch.mode}, run ${launch.runId}, generation ${launch.generation}, epoch ${launch.runnerEpoch}`);
  launched(launch);
  // One short-lived process per run: Node's type stripping where it has it, and the user-only transform cache.
  configureLoading({ native: true, cache: TransformCache.open(home) });
  const stop = new AbortController();
  let halt: (code: number, why: string) => void = () => undefined;
  const stopped = new Promise<number>((resolve) => {
    halt = (code: number, why: string): void => {
      if (stop.signal.aborted) return;
      log(`stopping: ${why}`);
      const reason = new Error(why);
      reason.name = "RunnerStopped";
      stop.abort(reason);
      void stopShells(500).then(() => resolve(code));
    };
    process.once("SIGTERM", () => halt(EXIT_SIGNALLED, "SIGTERM"));
    process.once("SIGINT", () => halt(EXIT_SIGNALLED, "SIGINT"));
  });
  /** The channel of a run or validate launch: it reads the server's frames after the launch. */
  const open = (launch: WorkerLaunch): RunnerChannel => {
    const channel = new RunnerChannel(launch, input, output, decoder, log);
    channel.onClaimLost = () => halt(EXIT_CLAIM_LOST, "the claim is lost");
    channel.onClosed = (error) => halt(EXIT_CHANNEL_CLOSED, `channel closed: ${error.message}`);
    channel.start();
    return channel;
  };
  const work = (async (): Promise<number> => {
    try {
      switch (launch.mode) {
        case "resolve": {
          // The resolver only writes: stdin stays unread until it waits for its run's launch.
          const compiled = await resolveMode(new RunnerChannel(launch, input, output, decoder, log), launch);
          if (compiled === null) return launch.resolve ? EXIT_OK : EXIT_PROTOCOL;
          const run = await awaitRunLaunch(input, decoder);
          if (run === null) {
            log("no run launch followed the resolution (stdin closed): exiting");
            return EXIT_OK;
          }
          launched(run);
          if (run.mode !== "run") {
            log(`a resolver runs only its run's launch, not mode ${run.mode}`);
            return EXIT_PROTOCOL;
          }
          return await runMode(open(run), run, stop.signal, compiled);
        }
        case "run":
          return await runMode(open(launch), launch, stop.signal);
        case "validate":
          return await validateMode(open(launch), launch, stop.signal);
      }
    } catch (error) {
      if (stop.signal.aborted) return stopped;
      log(`fatal: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
      return EXIT_PROTOCOL;
    }
  })();
  const exit = await Promise.race([work, stopped]);
  await flush(output);
  // After the start answered: the entry then holds every validator this process compiled.
  const stored = code.store();
  if (stored !== null) log(`runner validators: code cache ${stored}`);
  return exit;
}
