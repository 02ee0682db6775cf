// Compiles the protocol schemas into one ESM module of ajv standalone
// validators and prints it to stdout. Run by `cargo run -p codegen`, which
// adds the generated-file header and writes sdk-ts/src/generated/validators.ts.
// Usage: node scripts/compile-validators.mjs <protocol-dir>
import fs from "node:fs";
import path from "node:path";
import Ajv2020 from "ajv/dist/2020.js";
import standaloneCode from "ajv/dist/standalone/index.js";

const dir = process.argv[2];
if (!dir) {
  console.error("usage: compile-validators.mjs <protocol-dir>");
  process.exit(2);
}
const BASE = "https://pi-workflows.invalid/protocol/";
const files = ["common", "run-view", "client", "runner"];
const ajv = new Ajv2020({
  strict: true,
  strictTypes: true,
  strictRequired: false,
  allErrors: false,
  messages: false,
  inlineRefs: false,
  code: { source: true, esm: true, lines: false },
});
// client.v1's Operation lists its state-changing operations (codegen reads it).
ajv.addKeyword({ keyword: "x-stateChanging", schemaType: "array" });
for (const name of files) {
  const schema = JSON.parse(fs.readFileSync(path.join(dir, `${name}.v1.schema.json`), "utf8"));
  ajv.addSchema(schema);
}
const exports = {
  validateClientMessage: `${BASE}client.v1.schema.json`,
  validateRunnerMessage: `${BASE}runner.v1.schema.json#/$defs/RunnerMessage`,
  validateServerMessage: `${BASE}runner.v1.schema.json#/$defs/ServerMessage`,
  validateWorkerLaunch: `${BASE}runner.v1.schema.json#/$defs/WorkerLaunch`,
  validateRunState: `${BASE}runner.v1.schema.json#/$defs/RunState`,
  validateRunView: `${BASE}run-view.v1.schema.json`,
};
let code = standaloneCode(ajv, exports);
// ajv 8 standalone still emits `require()` for its runtime helpers even with
// esm: true; turn each into an ESM import of the CommonJS module.
const imports = [];
code = code.replace(/const (\w+) = require\("(ajv\/dist\/runtime\/\w+)"\)\.default;/g, (_m, name, mod) => {
  imports.push(`import ${name}_module from "${mod}.js";`);
  return `const ${name} = ${name}_module.default;`;
});
if (/require\(/.test(code)) {
  console.error("unexpected require() left in the standalone code");
  process.exit(1);
}
code = code.replace(/^"use strict";/, "");
process.stdout.write(imports.join("\n") + "\n" + code.trimStart());
