#!/usr/bin/env bash
# Coverage-guided fuzzing of the protocol decoders, canonical JSON and the
# kernel transitions (the targets in conformance/fuzz/fuzz_targets/, see
# conformance/fuzz/README.md).
#
# Usage:
#   scripts/fuzz.sh ci [SECONDS]          every target for SECONDS (default 12)
#                                         on the committed corpus; the
#                                         bounded mode scripts/test-all.sh runs
#   scripts/fuzz.sh run TARGET [SECONDS] [LIBFUZZER ARGS...]
#                                         one target (default 60 s), niced
#   scripts/fuzz.sh long SECONDS          every target for SECONDS, niced,
#                                         printing executions and coverage
#   scripts/fuzz.sh seed                  rebuild the committed corpus: seeds
#                                         derived from protocol/fixtures, then
#                                         merged (minimized) with what is there
#   scripts/fuzz.sh build                 only build the targets
#
# Build choice: this script drives the libFuzzer build directly with the
# instrumentation flags cargo-fuzz passes (`-Cpasses=sancov-module` and the
# sanitizer-coverage llvm-args, `--cfg fuzzing`, debug assertions and
# overflow checks from the crate's release profile, an explicit `--target`
# so build scripts and proc macros stay uninstrumented) instead of
# installing cargo-fuzz: nothing to build or cache from crates.io, and the
# same command works on a machine with only the stable toolchain. It builds
# without a sanitizer (cargo-fuzz's `-s none`): the fuzzed crates deny
# unsafe code, so AddressSanitizer would find nothing safe Rust can do and
# would halve the executions per second; without `-Zsanitizer` every flag is
# stable, so neither nightly nor RUSTC_BOOTSTRAP is needed. The crate keeps
# cargo-fuzz's layout, so `cargo fuzz run TARGET` (from conformance/) also
# works where cargo-fuzz is installed.
#
# A crash (panic, failed invariant) stops the target, libFuzzer prints the
# input and the script exits non-zero; the input is saved under
# conformance/fuzz/artifacts/TARGET/. Reproduce it with
#   target/fuzz/x86_64-unknown-linux-gnu/release/TARGET ARTIFACT
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
fuzz_dir="$root/conformance/fuzz"
corpus="$fuzz_dir/corpus"
targets=(client_frame runner_frame launch canonical kernel_ops)
host="$(rustc -vV | sed -n 's/^host: //p')"
export CARGO_TARGET_DIR="$root/target/fuzz"
bin_dir="$CARGO_TARGET_DIR/$host/release"
# The largest input libFuzzer makes: the decoders' interesting paths (depth,
# canonical form, schema) are all reachable well below this; the 1 MiB
# limits are covered by the fixture corpus itself.
max_len=16384

build() {
  echo "--> building the fuzz targets ($host, libFuzzer, sanitizer-coverage)"
  RUSTFLAGS="-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
--cfg fuzzing" \
    cargo build --quiet --release --locked --manifest-path "$fuzz_dir/Cargo.toml" --target "$host"
}

# run TARGET SECONDS [ARGS...]: fuzz on a scratch directory (where libFuzzer
# writes what it finds) plus the committed corpus (read only).
run() {
  local target="$1" seconds="$2"
  shift 2
  local scratch
  scratch="$(mktemp -d)"
  mkdir -p "$fuzz_dir/artifacts/$target" "$corpus/$target"
  local status=0
  "$bin_dir/$target" "$scratch" "$corpus/$target" \
    -max_total_time="$seconds" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$fuzz_dir/artifacts/$target/" "$@" \
    >"$scratch.log" 2>&1 || status=$?
  # The last status line and the final stats: executions, coverage, features.
  grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE)' "$scratch.log" | tail -1 | sed "s/^/$target: /"
  grep -E '^stat::number_of_executed_units' "$scratch.log" | sed "s/^/$target: /"
  if ((status != 0)); then
    echo "$target: FAILED (exit $status); libFuzzer's output:"
    tail -60 "$scratch.log"
  fi
  rm -rf "$scratch" "$scratch.log"
  return "$status"
}

seed() {
  local seeds
  seeds="$(mktemp -d)"
  local frames="$root/protocol/fixtures/frames"
  mkdir -p "$seeds"/{client_frame,runner_frame,launch,canonical,kernel_ops}
  copy() { # copy DEST FILES...: inputs small enough to mutate
    local dest="$1"
    shift
    local f
    for f in "$@"; do
      (($(stat -c %s "$f") <= max_len)) && cp "$f" "$seeds/$dest/$(basename "$(dirname "$f")")-$(basename "$f")"
    done
    return 0
  }
  copy client_frame "$frames"/client/*.in
  copy runner_frame "$frames"/runner/*.in "$frames"/server/*.in
  copy launch "$frames"/launch/*.in "$frames"/run-view/*.in
  copy canonical "$frames"/launch/*.in "$frames"/run-view/*.in \
    "$root"/protocol/fixtures/jcs/input/*.json "$root"/protocol/fixtures/jcs/output/*.json
  # Frame contents without their newline are canonical-JSON seeds too.
  local f
  for f in "$frames"/client/*.in "$frames"/runner/*.in; do
    (($(stat -c %s "$f") <= max_len)) && head -c -1 "$f" >"$seeds/canonical/frame-$(basename "$f")"
  done
  for target in "${targets[@]}"; do
    mkdir -p "$corpus/$target"
    "$bin_dir/$target" -merge=1 -max_len="$max_len" "$corpus/$target" "$seeds/$target" 2>&1 |
      grep -E 'MERGE-OUTER: [0-9]+ new files' | sed "s/^/$target: /" || true
  done
  rm -rf "$seeds"
  du -sb "$corpus"/* | sed "s/^/bytes: /"
}

mode="${1:-ci}"
case "$mode" in
build) build ;;
ci)
  seconds="${2:-12}"
  build
  status=0
  for target in "${targets[@]}"; do
    run "$target" "$seconds" || status=1
  done
  exit "$status"
  ;;
run)
  target="${2:?usage: scripts/fuzz.sh run TARGET [SECONDS] [LIBFUZZER ARGS...]}"
  seconds="${3:-60}"
  shift 3 || shift $#
  build
  nice -n 19 "$0" __run "$target" "$seconds" "$@"
  ;;
long)
  seconds="${2:?usage: scripts/fuzz.sh long SECONDS}"
  build
  status=0
  for target in "${targets[@]}"; do
    nice -n 19 "$0" __run "$target" "$seconds" || status=1
  done
  exit "$status"
  ;;
__run)
  shift
  run "$@"
  ;;
seed)
  build
  seed
  ;;
*)
  echo "usage: scripts/fuzz.sh ci|run|long|seed|build (see the comment at the top)" >&2
  exit 2
  ;;
esac
