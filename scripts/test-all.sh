#!/usr/bin/env bash
# Runs every test suite of the project: formatting and lints, the TypeScript
# SDK (install, build, typecheck, unit tests, and integration tests against
# the server binary, built just before them), codegen freshness, the Rust
# workspace (unit, property and integration tests), the TypeScript end-to-end
# tests (the real server binary with node runners), the real-Pi tests (Pi in
# rpc mode and in its TUI through tmux, against a mock model) and the torture
# driver's Pi lane (server/tests/torture_pi), both
# protocol conformance runners with the comparison of their verdicts (on the
# corpus and on fast-check inputs), and the bounded run of the coverage-guided
# fuzz targets (scripts/fuzz.sh ci).
# Works on a clean clone: it installs the npm dependencies from the lock file
# itself, and Pi with the Node 22 it needs (scripts/install-pi.sh). Exits
# non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step line says how long the suite has run so far (CI's limit is 30
# minutes on 2 cores), so the log shows where the time goes.
started_at=$SECONDS
step() { printf '\n==> [%ds] %s\n' "$((SECONDS - started_at))" "$*"; }
# A full disk fails the storage tests with "disk full" (the server says so):
# the free space is printed at the start and again on any failure, so a log
# tells a full machine from a defect.
free_space() { printf 'free space: %s\n' "$(df -h --output=avail,target . | tail -1)"; }
trap 'status=$?; ((status)) && free_space; exit $status' EXIT
free_space
# A clean clone gains nothing from incremental compilation, which more than
# doubles target/ (about 9 GiB of the debug tree here): keep the disk footprint small.
export CARGO_INCREMENTAL=0

step "test tools (strace for the checkpoint-kill test, piw's open trace and the real-Pi state-ownership trace, unshare for the full-disk tests, tmux for piw's and Pi's TUI tests)"
# server/tests/storage_faults.rs kills the server inside a checkpoint write
# with `strace -e inject` and mounts a small tmpfs inside `unshare -rm`;
# piw/tests/live.rs drives piw in tmux under strace; these tests fail (never
# skip) without the tools, so install them when missing.
missing=()
command -v strace >/dev/null || missing+=(strace)
command -v unshare >/dev/null || missing+=(util-linux)
command -v tmux >/dev/null || missing+=(tmux)
if ((${#missing[@]})); then
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
fi

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy (deny warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "sdk-ts: npm ci"
npm --prefix sdk-ts ci --no-audit --no-fund

step "codegen --check (generated Rust, TypeScript and validators are up to date)"
cargo run --quiet --locked -p codegen -- --check

step "sdk-ts: build (tsc, declarations)"
npm --prefix sdk-ts run build

step "cargo test --no-run (every Rust test binary, and the server binaries the sdk-ts integration tests drive)"
# One compile for both: `cargo test` builds the server's binaries (its
# integration tests need them) with the test profile into target/debug, so
# the sdk-ts tests drive those and the Rust test step below compiles nothing
# again (a separate `cargo build` would compile every dependency a second
# time, at the dev profile's other opt-level).
cargo test --workspace --exclude model --locked --no-run
target_dir="$(cargo metadata --format-version 1 --no-deps --locked |
  node -e 'let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () => console.log(JSON.parse(s).target_directory))')"

step "sdk-ts: tests (unit, and WorkflowClient against the real server)"
PI_WORKFLOWS_BIN="$target_dir/debug/pi-workflows" \
  PI_WORKFLOWS_SCRIPTED_RUNNER="$target_dir/debug/pi-workflows-scripted-runner" \
  npm --prefix sdk-ts test

step "Rust tests (piw's live, relay and snapshot tests among them)"
# The model checks run below in release mode, under their own time limit.
# piw's and the client's live tests drive the server binaries built above.
# cargo-nextest runs the tests of every binary side by side, four at a time:
# most of them wait on real servers and runners, so this step takes less
# than half of `cargo test`'s one-binary-at-a-time wall clock (134 s against
# 302 s here). The workspace has no doctests (its only fenced doc blocks are
# JSON). Without cargo-nextest it says so and runs `cargo test`.
if cargo nextest --version >/dev/null 2>&1; then
  PI_WORKFLOWS_BIN="$target_dir/debug/pi-workflows" \
    PI_WORKFLOWS_SCRIPTED_RUNNER="$target_dir/debug/pi-workflows-scripted-runner" \
    PI_WORKFLOWS_SCRIPTED_CONTROLLER="$target_dir/debug/pi-workflows-scripted-controller" \
    cargo nextest run --workspace --exclude model --locked --test-threads 4 --no-fail-fast
else
  echo "cargo-nextest is not installed: running cargo test (slower; cargo install cargo-nextest)"
  PI_WORKFLOWS_BIN="$target_dir/debug/pi-workflows" \
    PI_WORKFLOWS_SCRIPTED_RUNNER="$target_dir/debug/pi-workflows-scripted-runner" \
    PI_WORKFLOWS_SCRIPTED_CONTROLLER="$target_dir/debug/pi-workflows-scripted-controller" \
    cargo test --workspace --exclude model --locked
fi

step "real Pi: install Pi and Node 22 into .e2e/pi (scripts/install-pi.sh)"
# Before the end-to-end tests: they run the node runner on Node 22 too (type stripping).
scripts/install-pi.sh

step "sdk-ts: end-to-end tests (real server binary, node runners on Node 20 and Node 22)"
PI_WORKFLOWS_BIN="$target_dir/debug/pi-workflows" npm --prefix sdk-ts run test:e2e

step "sdk-ts: real-Pi tests (rpc mode and the TUI through tmux, against the mock model)"
PI_WORKFLOWS_BIN="$target_dir/debug/pi-workflows" npm --prefix sdk-ts run test:pi

step "torture, Pi lane: crash points with shell actions and headless agent steps (real Pi, the TypeScript runner; CI mode 10 trials)"
# Its own test target (test = false): it needs Pi and sdk-ts/build, which
# the two steps above installed and built (test:pi compiles the runner and
# the mock model into sdk-ts/build).
cargo test -p server --locked --test torture_pi

step "Model checks: build (release)"
cargo test --release -p model --locked --no-run

step "Model checks: tests (CI bounds, pinned state counts, planted bugs; limit 300 s)"
# The tests are the model binary's table as one test per model and per
# planted bug (a test checks that every registered one has its test), so the
# binary itself is not run again here: `cargo run --release -p model` prints
# the same checks as a table.
timeout 300 cargo test --release -p model --locked

step "protocol conformance: Rust and TypeScript runners, compared (corpus, then fast-check inputs)"
scripts/conformance.sh

step "fuzz: every libFuzzer target for 12 s on the committed corpus (scripts/fuzz.sh ci)"
scripts/fuzz.sh ci 12

printf '\nall suites passed in %ds\n' "$((SECONDS - started_at))"
