/**
 * `/piw [placement]` and `Ctrl+Shift+R`: open or focus the `piw` viewer on
 * the exact run of the origin-session view (pi-workflows-behaviour.md §5.9).
 *
 * Invariants:
 * - The target is the run of the session's last complete view, given by the
 *   caller: this module never asks the server anything and derives no state.
 * - Inside Herdr (`HERDR_ENV=1`) an existing pane labelled
 *   `piw · <runId>` is focused; otherwise one plugin pane of
 *   {@link HERDR_PLUGIN_ID} is opened at the placement, and a placement
 *   that fails half-way closes what it opened (no empty pane, tab or
 *   workspace is left behind).
 * - Outside Herdr, or when Herdr, its plugin or `piw` is not usable, the
 *   answer is one bounded reason with the command to run instead.
 * - Every external command runs with a {@link COMMAND_TIMEOUT_MS} timeout
 *   and at most {@link MAX_JSON_CHARS} of JSON is parsed.
 */

/** The Herdr plugin `pi-workflows herdr sync` links (its manifest is server/cli/herdr-plugin.toml). */
export const HERDR_PLUGIN_ID = "osolmaz.pi-workflows";
/** The plugin's pane entrypoint (`[[panes]] id`). */
export const HERDR_PANE_ENTRYPOINT = "piw";
export const PIW_SHORTCUT = "ctrl+shift+r";
export const PIW_PLACEMENTS = ["right", "below", "left", "above", "tab", "workspace"] as const;
export type PiwPlacement = (typeof PIW_PLACEMENTS)[number];

export const COMMAND_TIMEOUT_MS = 5_000;
export const MAX_JSON_CHARS = 1_000_000;
const MAX_REASON_CHARS = 300;

/** What `pi.exec` returns. */
export interface ExecResult {
  stdout: string;
  stderr: string;
  code: number;
  killed: boolean;
}

/** `pi.exec(command, args, {timeout})`. */
export type ExecPort = (command: string, args: string[], options: { timeout: number }) => Promise<ExecResult>;

/** The run to show: from the origin-session view. */
export interface PiwTarget {
  runId: string;
  workflowName: string;
}

/** What the command tells the user. */
export interface PiwOutcome {
  level: "info" | "warning";
  message: string;
}

/** Whether Pi runs inside Herdr (`HERDR_ENV=1`): piw opens in a pane and the widget names Ctrl+Shift+R. */
export function herdrAvailable(env: NodeJS.ProcessEnv = process.env): boolean {
  return env["HERDR_ENV"] === "1";
}

/** The exact label of the pane that shows `runId`. */
export function piwPaneLabel(runId: string): string {
  return `piw · ${runId}`;
}

/** `/piw` arguments: empty (the caller asks or uses the default) or one placement. */
export function parsePiwArgs(args: string): { placement: PiwPlacement | undefined } | { error: string } {
  const words = args.trim().split(/\s+/u).filter((word) => word.length > 0);
  if (words.length === 0) return { placement: undefined };
  const placement = PIW_PLACEMENTS.find((candidate) => candidate === words[0]);
  if (words.length > 1 || placement === undefined) return { error: `Usage: /piw [${PIW_PLACEMENTS.join("|")}]` };
  return { placement };
}

class HerdrError extends Error {}

interface Pane {
  paneId: string;
  tabId: string;
  workspaceId: string;
  label: string | undefined;
}

/** Opens or focuses `piw` for one run, through Herdr when Pi runs inside it. */
export class PiwOpener {
  private readonly exec: ExecPort;
  private readonly env: NodeJS.ProcessEnv;
  private readonly opening = new Map<string, Promise<PiwOutcome>>();

  constructor(options: { exec: ExecPort; env?: NodeJS.ProcessEnv }) {
    this.exec = options.exec;
    this.env = options.env ?? process.env;
  }

  /** Whether Pi runs inside Herdr (the placement menu is offered only then). */
  get inHerdr(): boolean {
    return herdrAvailable(this.env);
  }

  /** Opens or focuses the viewer of `target` (one open per run at a time). */
  async open(target: PiwTarget | undefined, placement: PiwPlacement, cwd: string): Promise<PiwOutcome> {
    if (target === undefined) return { level: "warning", message: "No workflow run in this session to show in piw; start one with /workflow <name>, or run `piw` to browse every run." };
    const fallback = `run \`piw ${target.runId}\` in a terminal`;
    if (!this.inHerdr) return { level: "warning", message: `piw opens in a pane only inside Herdr (HERDR_ENV=1); ${fallback}.` };
    const pending = this.opening.get(target.runId);
    if (pending !== undefined) return await pending;
    const opening = this.openInHerdr(target, placement, cwd)
      .catch((error: unknown) => ({ level: "warning" as const, message: `${bounded(error instanceof Error ? error.message : String(error))}; ${fallback}.` }))
      .finally(() => this.opening.delete(target.runId));
    this.opening.set(target.runId, opening);
    return await opening;
  }

  private async openInHerdr(target: PiwTarget, placement: PiwPlacement, cwd: string): Promise<PiwOutcome> {
    const caller = paneOf(field(await this.json(["pane", "current", "--current"]), "result", "pane"), "herdr pane current");
    const plugins = field(await this.json(["plugin", "list", "--plugin", HERDR_PLUGIN_ID, "--json"]), "result", "plugins");
    const enabled = Array.isArray(plugins) && plugins.some((plugin) => isRecord(plugin) && plugin["plugin_id"] === HERDR_PLUGIN_ID && plugin["enabled"] === true);
    if (!enabled) throw new HerdrError(`the Herdr plugin ${HERDR_PLUGIN_ID} is not linked and enabled: run \`pi-workflows herdr sync\``);
    await this.run("piw", ["--version"], "piw is not installed (not on PATH): install it with `cargo install --path piw`");

    const label = piwPaneLabel(target.runId);
    const panes = field(await this.json(["api", "snapshot"]), "result", "snapshot", "panes");
    if (!Array.isArray(panes)) throw new HerdrError("herdr api snapshot returned no panes");
    const existing = panes.filter(isRecord).find((pane) => pane["label"] === label);
    if (existing !== undefined) {
      const pane = paneOf(existing, "herdr api snapshot");
      await this.run("herdr", ["plugin", "pane", "focus", pane.paneId]);
      return { level: "info", message: `Focused piw for run ${target.runId} (Herdr pane ${pane.paneId}).` };
    }

    const open = (where: string[]): Promise<Pane> =>
      this.json(["plugin", "pane", "open", "--plugin", HERDR_PLUGIN_ID, "--entrypoint", HERDR_PANE_ENTRYPOINT, "--env", `PI_WORKFLOWS_RUN_ID=${target.runId}`, ...where, "--focus"]).then((value) =>
        paneOf(field(value, "result", "plugin_pane", "pane"), "herdr plugin pane open"),
      );
    let opened: Pane;
    if (placement === "workspace") {
      const created = await this.json(["workspace", "create", "--cwd", cwd, "--label", `piw · ${compact(target.workflowName).slice(0, 60) || "workflow"}`, "--no-focus"]);
      const workspaceId = text(field(created, "result", "workspace", "workspace_id"), "herdr workspace create");
      const bootstrapTab = text(field(created, "result", "root_pane", "tab_id"), "herdr workspace create");
      try {
        opened = await open(["--placement", "tab", "--workspace", workspaceId]);
      } catch (error) {
        await this.run("herdr", ["workspace", "close", workspaceId]).catch(() => undefined);
        throw error;
      }
      await this.run("herdr", ["tab", "close", bootstrapTab]).catch(() => undefined);
    } else if (placement === "tab") {
      opened = await open(["--placement", "tab", "--workspace", caller.workspaceId]);
    } else {
      const direction = placement === "below" || placement === "above" ? "down" : "right";
      opened = await open(["--placement", "split", "--target-pane", caller.paneId, "--direction", direction]);
      if (placement === "left" || placement === "above") {
        try {
          await this.run("herdr", ["pane", "swap", "--source-pane", opened.paneId, "--target-pane", caller.paneId]);
        } catch (error) {
          await this.run("herdr", ["plugin", "pane", "close", opened.paneId]).catch(() => undefined);
          throw error;
        }
      }
    }
    return { level: "info", message: `Opened piw for run ${target.runId} (${placement}, Herdr pane ${opened.paneId}).` };
  }

  private async run(command: string, args: string[], missing?: string): Promise<string> {
    let result: ExecResult;
    try {
      result = await this.exec(command, args, { timeout: COMMAND_TIMEOUT_MS });
    } catch (error) {
      throw new HerdrError(missing ?? `${command} could not be run: ${error instanceof Error ? error.message : String(error)}`);
    }
    if (result.killed) throw new HerdrError(`${command} ${verb(args)} did not answer within ${COMMAND_TIMEOUT_MS / 1000} s`);
    if (result.code !== 0) {
      if (missing !== undefined) throw new HerdrError(missing);
      throw new HerdrError(`${command} ${verb(args)} failed: ${compact(result.stderr) || compact(result.stdout) || `exit ${result.code}`}`);
    }
    return result.stdout;
  }

  private async json(args: string[]): Promise<unknown> {
    const stdout = await this.run("herdr", args);
    if (stdout.length > MAX_JSON_CHARS) throw new HerdrError(`herdr ${verb(args)} returned more than ${MAX_JSON_CHARS} characters`);
    try {
      return JSON.parse(stdout) as unknown;
    } catch {
      throw new HerdrError(`herdr ${verb(args)} returned invalid JSON`);
    }
  }
}

/** The documented Pi context members `/piw` uses (`ExtensionContext`). */
export interface PiwContext {
  readonly cwd: string;
  readonly hasUI: boolean;
  readonly ui: {
    select(title: string, options: string[]): Promise<string | undefined>;
    notify(message: string, level: "info" | "warning" | "error"): void;
  };
}

/** The documented Pi APIs `/piw` uses (`ExtensionAPI`; typed here so that the unit build needs no Pi types). */
export interface PiwHost {
  exec(command: string, args: string[], options?: { timeout?: number }): Promise<ExecResult>;
  registerCommand(
    name: string,
    options: { description?: string; getArgumentCompletions?: (prefix: string) => { value: string; label: string }[] | null; handler: (args: string, ctx: PiwContext) => Promise<void> },
  ): void;
  registerShortcut(key: string, options: { description?: string; handler: (ctx: PiwContext) => Promise<void> | void }): void;
}

/**
 * Registers `/piw` and `Ctrl+Shift+R` on `pi`; `target` reads the run of the
 * session's last complete view.
 */
export function registerPiw(pi: PiwHost, target: () => PiwTarget | undefined): void {
  const opener = new PiwOpener({ exec: (command, args, options) => pi.exec(command, args, options) });
  const openFrom = async (ctx: PiwContext, placement: PiwPlacement | undefined): Promise<void> => {
    let chosen = placement;
    if (chosen === undefined && opener.inHerdr && ctx.hasUI && target() !== undefined) {
      const picked = await ctx.ui.select("Open piw", [...PIW_PLACEMENTS]);
      if (picked === undefined) return;
      chosen = PIW_PLACEMENTS.find((candidate) => candidate === picked);
    }
    const outcome = await opener.open(target(), chosen ?? "right", ctx.cwd);
    ctx.ui.notify(outcome.message, outcome.level);
  };
  pi.registerCommand("piw", {
    description: `Open or focus piw on this session's run: /piw [${PIW_PLACEMENTS.join("|")}] (a Herdr pane inside Herdr)`,
    getArgumentCompletions: (prefix) => PIW_PLACEMENTS.filter((placement) => placement.startsWith(prefix)).map((placement) => ({ value: placement, label: placement })),
    handler: async (args, ctx) => {
      const parsed = parsePiwArgs(args);
      if ("error" in parsed) {
        ctx.ui.notify(parsed.error, "warning");
        return;
      }
      await openFrom(ctx, parsed.placement);
    },
  });
  pi.registerShortcut(PIW_SHORTCUT, { description: "pi-workflows: open or focus piw on this session's run", handler: (ctx) => openFrom(ctx, undefined) });
}

/** The subcommand words of `args` (up to the first option), e.g. `plugin pane open`. */
function verb(args: string[]): string {
  const end = args.findIndex((arg) => arg.startsWith("--"));
  return args.slice(0, Math.min(end < 0 ? args.length : end, 3)).join(" ");
}

function field(value: unknown, ...path: string[]): unknown {
  let current = value;
  for (const key of path) current = isRecord(current) ? current[key] : undefined;
  return current;
}

function text(value: unknown, what: string): string {
  if (typeof value !== "string" || value.length === 0) throw new HerdrError(`${what} returned an unexpected answer`);
  return value;
}

function paneOf(value: unknown, what: string): Pane {
  return {
    paneId: text(field(value, "pane_id"), what),
    tabId: text(field(value, "tab_id"), what),
    workspaceId: text(field(value, "workspace_id"), what),
    label: typeof field(value, "label") === "string" ? (field(value, "label") as string) : undefined,
  };
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function compact(value: string): string {
  return value.replace(/\s+/gu, " ").trim();
}

function bounded(value: string): string {
  const line = compact(value);
  return line.length <= MAX_REASON_CHARS ? line : `${line.slice(0, MAX_REASON_CHARS - 1)}…`;
}
