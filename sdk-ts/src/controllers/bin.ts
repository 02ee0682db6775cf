#!/usr/bin/env node
/** The `pi-workflows-controller` executable: see `child.ts`. */
import { main } from "./child.js";

// stderr is a pipe the server copies into the runner log; when the server died, a lost line must not crash the child.
process.stderr.on("error", () => undefined);

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`pi-workflows-controller: internal error: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exit(2);
  },
);
