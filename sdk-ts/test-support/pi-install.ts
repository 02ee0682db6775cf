/**
 * Where `scripts/install-pi.sh` installed Pi and the Node 22 it runs on
 * (`.e2e/pi/env`), or PI_E2E_NODE / PI_E2E_CLI. Apart from `pi.ts` so that
 * tests that only need Node 22 (the runner's type-stripping loader) do not
 * compile against Pi's types.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_DIR } from "./server.js";

/** Where the installed Pi and its Node 22 are. */
export interface PiInstall {
  node: string;
  cli: string;
  version: string;
}

const INSTALL_HINT = "run scripts/install-pi.sh (it installs Pi and Node 22 into .e2e/pi)";

/** PI_E2E_NODE / PI_E2E_CLI when set, otherwise `.e2e/pi/env` written by `scripts/install-pi.sh`. */
export function piInstall(): PiInstall {
  const envFile = join(REPO_DIR, ".e2e", "pi", "env");
  const fromFile: Record<string, string> = {};
  if (existsSync(envFile)) {
    for (const line of readFileSync(envFile, "utf8").split("\n")) {
      const at = line.indexOf("=");
      if (at > 0) fromFile[line.slice(0, at)] = line.slice(at + 1);
    }
  }
  const node = process.env.PI_E2E_NODE ?? fromFile.PI_E2E_NODE;
  const cli = process.env.PI_E2E_CLI ?? fromFile.PI_E2E_CLI;
  if (node === undefined || cli === undefined) throw new Error(`real Pi is not installed: ${INSTALL_HINT}`);
  for (const path of [node, cli]) {
    if (!existsSync(path)) throw new Error(`${path} does not exist: ${INSTALL_HINT}`);
  }
  return { node, cli, version: process.env.PI_E2E_VERSION ?? fromFile.PI_E2E_VERSION ?? "unknown" };
}
