// Compiles the protocol schemas into the ajv standalone validators of one
// channel, as a CommonJS module (the SDK requires it on first use, so a
// process loads only the validators of the channels it speaks), and prints
// it to stdout. Run by `cargo run -p codegen`, which adds the generated-file
// header and writes sdk-ts/src/generated/<channel>-validators.cts.
// Usage: node scripts/compile-validators.mjs <protocol-dir> <runner|controller|client>
import fs from "node:fs";
import path from "node:path";
import Ajv2020 from "ajv/dist/2020.js";
import standaloneCode from "ajv/dist/standalone/index.js";

const BASE = "https://pi-workflows.invalid/protocol/";
/** The validators of each channel: the runner channel (runner.v1), the controller.v1 channel (its $defs in runner.v1) and the client channel (client.v1 and the run view it carries). */
const CHANNELS = {
  runner: {
    validateRunnerMessage: `${BASE}runner.v1.schema.json#/$defs/RunnerMessage`,
    validateServerMessage: `${BASE}runner.v1.schema.json#/$defs/ServerMessage`,
    validateWorkerLaunch: `${BASE}runner.v1.schema.json#/$defs/WorkerLaunch`,
    validateRunState: `${BASE}runner.v1.schema.json#/$defs/RunState`,
  },
  controller: {
    validateControllerLaunch: `${BASE}runner.v1.schema.json#/$defs/ControllerLaunch`,
    validateControllerChildMessage: `${BASE}runner.v1.schema.json#/$defs/ControllerChildMessage`,
    validateControllerServerMessage: `${BASE}runner.v1.schema.json#/$defs/ControllerServerMessage`,
  },
  client: {
    validateClientMessage: `${BASE}client.v1.schema.json`,
    validateRunView: `${BASE}run-view.v1.schema.json`,
  },
};

const [dir, channel] = process.argv.slice(2);
if (!dir || !Object.hasOwn(CHANNELS, channel ?? "")) {
  console.error(`usage: compile-validators.mjs <protocol-dir> <${Object.keys(CHANNELS).join("|")}>`);
  process.exit(2);
}
// The runner also checks the result of an accepted reply against the types
// its message's x-replyResult names (codegen checks the names): one
// validate<Name> per named type.
const runnerSchema = JSON.parse(fs.readFileSync(path.join(dir, "runner.v1.schema.json"), "utf8"));
for (const variant of runnerSchema.$defs.RunnerMessage.oneOf) {
  for (const name of variant["x-replyResult"] ?? []) {
    CHANNELS.runner[`validate${name}`] = `${BASE}runner.v1.schema.json#/$defs/${name}`;
  }
}
const ajv = new Ajv2020({
  strict: true,
  strictTypes: true,
  strictRequired: false,
  allErrors: false,
  messages: false,
  inlineRefs: false,
  code: { source: true, esm: false, lines: false },
});
// client.v1's Operation lists its state-changing operations (codegen reads it).
ajv.addKeyword({ keyword: "x-stateChanging", schemaType: "array" });
// runner.v1's RunnerMessage variants name their reply result types.
ajv.addKeyword({ keyword: "x-replyResult", schemaType: "array" });
for (const name of ["common", "run-view", "client", "runner"]) {
  const schema = JSON.parse(fs.readFileSync(path.join(dir, `${name}.v1.schema.json`), "utf8"));
  ajv.addSchema(schema);
}
let code = standaloneCode(ajv, CHANNELS[channel]);
code = code.replace(/^"use strict";/, "");
if (!/^exports\.\w+ = /.test(code)) {
  console.error("unexpected start of the standalone code");
  process.exit(1);
}
// `export {}` makes the .cts file a module for TypeScript (its names stay
// local; tsc emits it as CommonJS); the CommonJS `exports` and `require` of
// the standalone code pass through unchanged.
process.stdout.write(`export {};\n${code}`);
