/**
 * The state directory, as the server names it (`server/src/config.rs`):
 * `PI_WORKFLOWS_HOME`, else `~/.pi/agent/workflows`. The client finds the
 * server's socket there; the runner keeps its transform cache there.
 */
import { homedir } from "node:os";
import { join } from "node:path";

/** The default state directory: `PI_WORKFLOWS_HOME`, else `~/.pi/agent/workflows`. */
export function defaultHome(env: NodeJS.ProcessEnv = process.env): string {
  const home = env["PI_WORKFLOWS_HOME"];
  return home !== undefined && home !== "" ? home : join(homedir(), ".pi", "agent", "workflows");
}
