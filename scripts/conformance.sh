#!/usr/bin/env bash
# Runs both conformance runners over one corpus and asserts that they agree
# byte for byte: the same verdict, kind or error code, and SHA-256 of the
# re-encoded canonical bytes for every case (and both pass the corpus).
# Then the fuzz comparison (sdk-ts/tools/fuzz-parity.test.ts): fast-check
# generates inputs for every channel, and both decoders (conformance-rs
# --decide) must give identical verdicts; FUZZ_SEED replays a run and
# FUZZ_RUNS sets its size.
# Usage: scripts/conformance.sh [FIXTURES_DIR]   (default protocol/fixtures)
# Needs: sdk-ts/node_modules (npm ci) and a built TypeScript test tree
# (npm --prefix sdk-ts run pretest); builds conformance-rs itself (release).
set -euo pipefail
cd "$(dirname "$0")/.."
fixtures="${1:-protocol/fixtures}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

status=0
echo "--> conformance-rs"
cargo run --quiet --release --locked -p conformance --bin conformance-rs -- \
  --fixtures "$fixtures" --emit-verdicts "$out/rust.tsv" || status=1
echo "--> conformance-ts"
node sdk-ts/build/tools/conformance.js --fixtures "$fixtures" --emit-verdicts "$out/ts.tsv" || status=1

echo "--> comparing verdicts"
if ! diff -u "$out/rust.tsv" "$out/ts.tsv"; then
  echo "Rust and TypeScript disagree (see the diff above)"
  status=1
fi
rust_cases=$(wc -l < "$out/rust.tsv")
if [ "$status" -eq 0 ]; then
  echo "Rust and TypeScript agree on all $rust_cases cases"
fi

echo "--> fuzz comparison (fast-check inputs, both decoders)"
target_dir="$(cargo metadata --format-version 1 --no-deps --locked |
  node -e 'let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () => console.log(JSON.parse(s).target_directory))')"
CONFORMANCE_RS="$target_dir/release/conformance-rs" node --test sdk-ts/build/tools/fuzz-parity.test.js || status=1
exit "$status"
