#!/usr/bin/env node
/** The `pi-workflows-runner` executable: see `main.ts`. */
import { main } from "./main.js";

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    process.stderr.write(`pi-workflows-runner: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exit(2);
  },
);
