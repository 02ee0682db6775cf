#!/usr/bin/env node
/** The `pi-workflows-runner` executable: see `main.ts`. */
import { main } from "./main.js";

// stderr is a pipe the server copies into the runner log. When the server
// died, writing to it fails with EPIPE: the line is lost, but the runner
// must still stop its shells and exit as usual, not crash on the error.
process.stderr.on("error", () => undefined);

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`pi-workflows-runner: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exit(2);
  },
);
