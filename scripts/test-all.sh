#!/usr/bin/env bash
# Runs every test suite of the project: formatting and lints, the Rust
# workspace (unit, property and integration tests). Later suites are added
# here as their crates and packages land. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy (deny warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "Rust tests"
# The model checks run below in release mode, under their own time limit.
cargo test --workspace --exclude model --locked

step "Model checks: build (release)"
cargo build --release -p model --locked
cargo test --release -p model --locked --no-run

step "Model checks: table (CI bounds, pinned state counts, planted bugs; limit 300 s)"
timeout 300 cargo run --release -p model --locked --quiet

step "Model checks: tests (limit 300 s)"
timeout 300 cargo test --release -p model --locked

printf '\nall suites passed\n'
