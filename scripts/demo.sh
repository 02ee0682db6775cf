#!/usr/bin/env bash
# The product's main job on a fresh machine, in one command:
# builds the server and the TypeScript SDK, installs Pi and its Node 22
# (scripts/install-pi.sh, into .e2e/pi), starts the bundled mock model (a
# fresh machine has no provider credentials) and a server under a temporary
# PI_WORKFLOWS_HOME, then
#  1. runs examples/workflows/triage.workflow.ts headless: its agent step runs
#     in real Pi (`pi --mode rpc`), the workflow's validate rejects the
#     model's first submission, the model corrects it, and the accepted
#     structured output routes the run;
#  2. runs examples/workflows/release.workflow.ts (compute, a shell action
#     with live progress, an included review workflow and a checkpoint),
#     answers the checkpoint and follows the continuation to the end;
# and stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "building the server (cargo) and the TypeScript SDK (npm)"
cargo build --locked -p server
npm --prefix sdk-ts ci --no-audit --no-fund --silent
npm --prefix sdk-ts run build --silent
(cd sdk-ts && npx tsc -p tsconfig.test.json)
piw="$repo/target/debug/pi-workflows"

say "installing Pi and Node 22 into .e2e/pi (scripts/install-pi.sh; nothing to do when present)"
scripts/install-pi.sh

workdir="$(mktemp -d "${TMPDIR:-/tmp}/pi-workflows-demo.XXXXXX")"
export PI_WORKFLOWS_HOME="$workdir/home"
export PI_WORKFLOWS_RUNNER="node $repo/sdk-ts/dist/runner/bin.js"
project="$workdir/project"
mkdir -p "$project/.pi/workflows"
cp examples/workflows/release.workflow.ts examples/workflows/review.workflow.ts examples/workflows/triage.workflow.ts "$project/.pi/workflows/"

# The mock model: an OpenAI-compatible streaming server on 127.0.0.1, answering
# by examples/demo/mock-model-rules.json. Pi finds it through its own agent
# directory (models.json + settings.json), which the server's runners inherit.
mkfifo "$workdir/mock.out"
node sdk-ts/build/test-support/mock-model-cli.js --rules examples/demo/mock-model-rules.json --log "$workdir/mock-requests.jsonl" >"$workdir/mock.out" &
mock_pid=$!
read -r _ mock_port <"$workdir/mock.out"
export PI_CODING_AGENT_DIR="$workdir/pi-agent" PI_OFFLINE=1 PI_TELEMETRY=0 PI_SKIP_VERSION_CHECK=1
mkdir -p "$PI_CODING_AGENT_DIR"
cat >"$PI_CODING_AGENT_DIR/models.json" <<JSON
{"providers": {"mock": {"baseUrl": "http://127.0.0.1:$mock_port/v1", "api": "openai-completions", "apiKey": "mock-key",
  "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
  "models": [{"id": "mock-model", "name": "Mock Model", "contextWindow": 32000, "maxTokens": 1024}]}}}
JSON
echo '{"defaultProvider": "mock", "defaultModel": "mock-model", "quietStartup": true, "enableInstallTelemetry": false, "retry": {"enabled": false}}' >"$PI_CODING_AGENT_DIR/settings.json"

cd "$project"
cleanup() {
  "$piw" server stop >/dev/null 2>&1 || true
  kill "$mock_pid" 2>/dev/null || true
  rm -rf "$workdir"
}
trap cleanup EXIT

say "pi-workflows server start (state in a temporary PI_WORKFLOWS_HOME)"
"$piw" server start

say "pi-workflows list"
"$piw" list

say "pi-workflows start triage the login button does nothing (an agent step in real Pi, against the mock model)"
triage_id="$("$piw" start triage the login button does nothing --json | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).runId))')"
echo "started run $triage_id"
"$piw" view "$triage_id"
say "what the model saw after its first submission (the workflow's validate refused it)"
node -e '
  const lines = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => JSON.parse(l));
  const seen = new Set();
  for (const r of lines) for (const m of r.messages) if (m.role === "tool" && !seen.has(m.text)) { seen.add(m.text); console.log("  tool result: " + m.text); }
' "$workdir/mock-requests.jsonl"

say "pi-workflows start release ship the release notes"
run_id="$("$piw" start release ship the release notes --json | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).runId))')"
echo "started run $run_id"

say "pi-workflows view $run_id (live until the checkpoint asks for an answer)"
# Follow the run live; answer the checkpoint once it waits, then keep
# following the continuation the answer starts until the run ends.
(
  while [ "$("$piw" view "$run_id" --once --json | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).display.status))')" != "waiting" ]; do
    sleep 0.3
  done
  sleep 1.5
  "$piw" answer "$run_id" '{"approver": "the README"}' >/dev/null
) &
answerer=$!
"$piw" view "$run_id"
wait "$answerer"

say "pi-workflows runs"
"$piw" runs

say "pi-workflows server stop"
"$piw" server stop
