/**
 * The mock model as a process, for scripts and demos:
 *   node build/test-support/mock-model-cli.js [--rules rules.json] [--log requests.jsonl]
 * prints `MOCK_MODEL_LISTENING <port>` once it listens on 127.0.0.1 (port 0),
 * answers by the rules in the JSON file (an array of `MockRule`s whose `when`
 * is a substring; without `--rules` every request gets the reply
 * "Mock reply."), appends one JSON line per finished request to `--log`, and
 * stops on SIGTERM or SIGINT.
 */
import { appendFileSync, readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { type MockRule, reply, startMockModel } from "./mock-model.js";

const { values } = parseArgs({ options: { rules: { type: "string" }, log: { type: "string" } } });
const rules: MockRule[] =
  values.rules !== undefined
    ? (JSON.parse(readFileSync(values.rules, "utf8")) as MockRule[])
    : [{ name: "default", reply: reply.text("Mock reply.") }];
const log = values.log;
const mock = await startMockModel({
  rules,
  ...(log !== undefined
    ? {
        onRequest: (request) =>
          appendFileSync(log, `${JSON.stringify({ index: request.index, rule: request.rule, outcome: request.outcome, tools: request.tools, messages: request.messages })}\n`),
      }
    : {}),
});
process.stdout.write(`MOCK_MODEL_LISTENING ${mock.port}\n`);
for (const signal of ["SIGTERM", "SIGINT"] as const) {
  process.on(signal, () => {
    void mock.close().then(() => process.exit(0));
  });
}
