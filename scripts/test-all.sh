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
cargo test --workspace --locked

printf '\nall suites passed\n'
