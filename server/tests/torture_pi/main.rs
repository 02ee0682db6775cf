//! Crash-point injection at scale, the Pi lane (issue 20, item 1): the
//! torture driver of `tests/torture/` (its module doc states the checks)
//! with `.workflow.ts` workflows on the TypeScript runner, each with a
//! compute step, a shell action that appends to an external apply log (a
//! non-idempotent managed effect of type `shell`), and in every other one
//! a headless agent step run by real Pi (`pi --mode rpc`) against the mock
//! model (`torture/workload.rs`, `torture/pi.rs`). Besides the scripted
//! lane's checks, after each trial: each shell action applied exactly once
//! per run and, when it was applying at the crash, `ambiguous` after the
//! restart (the operator confirms it when its line is in the log, retries
//! it otherwise); each agent step has exactly one accepted interaction and
//! submission, its node's output is the accepted one, and an interaction
//! accepted before the crash is the one that counts; no runner, shell
//! command or Pi of the trial is left.
//!
//! A test target of its own, not run by a plain `cargo test` (`test =
//! false` in `server/Cargo.toml`): it needs the built sdk-ts and
//! `scripts/install-pi.sh`, and fails (never skips) with one line saying
//! which to run when they are missing. `scripts/test-all.sh` runs it in its
//! real-Pi step: `cargo test -p server --test torture_pi`. CI mode:
//! `CI_TRIALS` trials of seed 20, two at a time; the long mode takes the
//! scripted lane's variables (`PI_WORKFLOWS_TORTURE_TRIALS`, `_SEED`,
//! `_FIRST`, `_PARALLEL`).

#[path = "../support/mod.rs"]
mod support;

#[path = "../torture/drive.rs"]
mod drive;
#[path = "../torture/pi.rs"]
mod pi;
#[path = "../torture/rng.rs"]
mod rng;
#[path = "../torture/trial.rs"]
mod trial;
#[path = "../torture/workload.rs"]
mod workload;

/// Trials of the CI mode: each crash point of the lane once, then a random
/// moment.
const CI_TRIALS: u64 = 10;
/// The CI mode's seed (fixed, so CI failures replay).
const CI_SEED: u64 = 20;

#[test]
fn torture_crash_points_with_shell_actions_and_real_pi() {
    let parts = pi::Parts::find().unwrap_or_else(|missing| panic!("{missing}"));
    drive::drive(
        workload::Lane::Pi,
        Some(parts),
        "torture_pi",
        CI_TRIALS,
        CI_SEED,
    );
}
