//! The trial loop both lanes share: the mode from the environment
//! (`PI_WORKFLOWS_TORTURE_TRIALS`, `_SEED`, `_FIRST`, `_PARALLEL`), trials
//! run `parallel` at a time, each failure with the command that replays
//! it, and the summary line.

use super::pi;
use super::rng;
use super::trial;
use super::workload::Lane;
use std::time::Instant;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|text| {
        let text = text.trim();
        text.strip_prefix("0x")
            .map_or_else(|| text.parse(), |hex| u64::from_str_radix(hex, 16))
            .unwrap_or_else(|_| panic!("{name}={text} is not a number"))
    })
}

/// Runs the trials of `lane` (test target `target`): `ci_trials` of
/// `ci_seed` unless the environment asks for the long mode.
pub(crate) fn drive(
    lane: Lane,
    parts: Option<pi::Parts>,
    target: &str,
    ci_trials: u64,
    ci_seed: u64,
) {
    let trials = env_u64("PI_WORKFLOWS_TORTURE_TRIALS").unwrap_or(ci_trials);
    let seed = env_u64("PI_WORKFLOWS_TORTURE_SEED").unwrap_or(
        if std::env::var_os("PI_WORKFLOWS_TORTURE_TRIALS").is_some() {
            rng::Rng::for_trial(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64,
                0,
            )
            .next()
        } else {
            ci_seed
        },
    );
    let first = env_u64("PI_WORKFLOWS_TORTURE_FIRST").unwrap_or(0);
    let parallel = env_u64("PI_WORKFLOWS_TORTURE_PARALLEL").unwrap_or(2).max(1);
    eprintln!(
        "torture: {lane:?} lane, {trials} trial(s) from {first}, seed {seed:#x}, {parallel} at a time"
    );
    let parts = std::sync::Arc::new(parts);
    let target = target.to_owned();
    let started = Instant::now();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(first));
    let workers: Vec<_> = (0..parallel)
        .map(|_| {
            let next = next.clone();
            let parts = parts.clone();
            let target = target.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let mut outcomes = Vec::new();
                loop {
                    let trial = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if trial >= first + trials {
                        return outcomes;
                    }
                    let began = Instant::now();
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        runtime.block_on(trial::run(lane, parts.as_ref().as_ref(), seed, trial))
                    }));
                    let seconds = began.elapsed().as_secs_f64();
                    match result {
                        Ok(summary) => {
                            eprintln!("torture: trial {trial} ok in {seconds:.1} s: {summary}");
                            outcomes.push(Ok(summary));
                        }
                        Err(panic) => {
                            let message = panic
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                                .unwrap_or_default();
                            let failure = format!(
                                "trial {trial} of seed {seed:#x} ({}) failed after {seconds:.1} s: {message}\n  replay: PI_WORKFLOWS_TORTURE_SEED={seed:#x} PI_WORKFLOWS_TORTURE_FIRST={trial} PI_WORKFLOWS_TORTURE_TRIALS=1 cargo test -p server --test {target}",
                                trial::Crash::of(lane, seed, trial)
                            );
                            eprintln!("torture: {failure}");
                            outcomes.push(Err(failure));
                        }
                    }
                }
            })
        })
        .collect();
    let outcomes: Vec<Result<String, String>> = workers
        .into_iter()
        .flat_map(|worker| worker.join().unwrap())
        .collect();
    let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    let ambiguous: usize = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .filter(|summary| !summary.contains(" 0 ambiguous"))
        .count();
    let unreached = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .filter(|summary| summary.contains("unreached"))
        .count();
    eprintln!(
        "torture: {} trial(s), seed {seed:#x}, {:.1} s; {} failed; {ambiguous} left an effect ambiguous; {unreached} armed point(s) unreached (killed at the end of the workload instead)",
        outcomes.len(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "seed {seed:#x}: {} failed trial(s):\n{}",
        failures.len(),
        failures
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
