#!/usr/bin/env bash
# Runs both conformance runners over one corpus and asserts that they agree
# byte for byte: the same verdict, kind or error code, and SHA-256 of the
# re-encoded canonical bytes for every case (and both pass the corpus).
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
exit "$status"
