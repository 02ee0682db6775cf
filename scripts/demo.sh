#!/usr/bin/env bash
# The product's main job on a fresh machine, in one command:
# builds the server and the TypeScript SDK, starts a server under a temporary
# PI_WORKFLOWS_HOME, runs examples/workflows/release.workflow.ts (compute, a
# shell action with live progress, an included review workflow and a
# checkpoint), shows it live, answers the checkpoint, follows the
# continuation to the end and stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

say "building the server (cargo) and the TypeScript SDK (npm)"
cargo build --locked -p server
npm --prefix sdk-ts ci --no-audit --no-fund --silent
npm --prefix sdk-ts run build --silent
piw="$repo/target/debug/pi-workflows"

workdir="$(mktemp -d "${TMPDIR:-/tmp}/pi-workflows-demo.XXXXXX")"
export PI_WORKFLOWS_HOME="$workdir/home"
export PI_WORKFLOWS_RUNNER="node $repo/sdk-ts/dist/runner/bin.js"
project="$workdir/project"
mkdir -p "$project/.pi/workflows"
cp examples/workflows/release.workflow.ts examples/workflows/review.workflow.ts "$project/.pi/workflows/"
cd "$project"
cleanup() {
  "$piw" server stop >/dev/null 2>&1 || true
  rm -rf "$workdir"
}
trap cleanup EXIT

say "pi-workflows server start (state in a temporary PI_WORKFLOWS_HOME)"
"$piw" server start

say "pi-workflows list"
"$piw" list

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
