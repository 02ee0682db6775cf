//! `model`: checks every model, then every planted bug.
//!
//! ```text
//! model                      CI bounds, pinned state counts, all mutations
//! model --deep               larger bounds (also MODEL_DEEP=1); counts are printed, not pinned
//! model --model claims       one model (repeatable)
//! model --mutation NAME      one planted bug, with its counterexample
//! model --no-mutations       models only
//! model --list               names of models and mutations
//! ```
//!
//! Exits non-zero when a property fails, a pinned count changes, or a
//! planted bug is not caught.

use model::harness::{Mode, Report, Verdict};
use model::suite::{self, Mutation};
use std::process::ExitCode;
use std::time::Instant;

struct Options {
    mode: Mode,
    models: Vec<String>,
    mutations: Vec<String>,
    run_mutations: bool,
    list: bool,
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        mode: Mode::from_env(),
        models: Vec::new(),
        mutations: Vec::new(),
        run_mutations: true,
        list: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--deep" => options.mode = Mode::Deep,
            "--ci" => options.mode = Mode::Ci,
            "--model" => options
                .models
                .push(args.next().ok_or("--model needs a name")?),
            "--mutation" => options
                .mutations
                .push(args.next().ok_or("--mutation needs a name")?),
            "--no-mutations" => options.run_mutations = false,
            "--list" => options.list = true,
            other => return Err(format!("unknown argument {other:?} (see --list)")),
        }
    }
    Ok(options)
}

fn main() -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("model: {message}");
            return ExitCode::from(2);
        }
    };
    if options.list {
        for entry in suite::models() {
            println!("model    {}", entry.name);
        }
        for m in suite::mutations() {
            println!("mutation {:<36} ({}) breaks: {}", m.name, m.model, m.breaks);
        }
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    let mut failed = false;
    let only_mutations = !options.mutations.is_empty() && options.models.is_empty();
    let mut table = Vec::new();
    if !only_mutations {
        println!("== models ({:?} mode)", options.mode);
        for entry in suite::models() {
            if !options.models.is_empty() && !options.models.iter().any(|m| m == entry.name) {
                continue;
            }
            let report = entry.run(options.mode);
            print!("{report}");
            let mut ok = report.passed();
            if options.mode == Mode::Ci && report.unique_states != entry.ci_unique_states {
                println!(
                    "    PINNED COUNT CHANGED: expected {} unique states, explored {}",
                    entry.ci_unique_states, report.unique_states
                );
                ok = false;
            }
            failed |= !ok;
            table.push((report, ok));
        }
    }
    let mutations: Vec<Mutation> = suite::mutations()
        .into_iter()
        .filter(|m| {
            if options.mutations.is_empty() {
                options.run_mutations && options.models.is_empty()
            } else {
                options.mutations.iter().any(|name| name == m.name)
            }
        })
        .collect();
    if !options.mutations.is_empty() && mutations.len() != options.mutations.len() {
        eprintln!("model: unknown mutation name (see --list)");
        return ExitCode::from(2);
    }
    if !mutations.is_empty() {
        println!("\n== planted bugs (CI bounds; each must be caught)");
    }
    let mut caught = Vec::new();
    for mutation in &mutations {
        let report = mutation.run();
        let found = report.counterexample(mutation.breaks).map(<[String]>::len);
        match found {
            Some(steps) if steps > 0 => println!(
                "caught   {:<36} {:>7} states {:>6.2}s  breaks: {}",
                mutation.name, report.unique_states, report.seconds, mutation.breaks
            ),
            Some(_) | None => {
                failed = true;
                println!(
                    "MISSED   {:<36} breaks nothing it should: {}",
                    mutation.name, mutation.breaks
                );
            }
        }
        if !options.mutations.is_empty() {
            print_target(mutation, &report);
        }
        caught.push((mutation, report));
    }
    print_summary(&table, &caught);
    println!(
        "\ntotal {:.1}s — {}",
        started.elapsed().as_secs_f64(),
        if failed { "FAILED" } else { "all passed" }
    );
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn print_target(mutation: &Mutation, report: &Report) {
    println!("  dropped check: {}", mutation.dropped_check);
    for property in &report.properties {
        if property.name == mutation.breaks
            && let Verdict::Violated(steps) = &property.verdict
        {
            println!("  counterexample for \"{}\":", property.name);
            for step in steps {
                println!("    {step}");
            }
        }
    }
}

fn print_summary(table: &[(Report, bool)], caught: &[(&Mutation, Report)]) {
    if !table.is_empty() {
        println!("\n== summary");
        println!(
            "| model | unique states | max depth | seconds | always | sometimes | eventually | bounds |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---|");
        for (report, ok) in table {
            let count = |e: stateright::Expectation| {
                report
                    .properties
                    .iter()
                    .filter(|p| p.expectation == e)
                    .count()
            };
            println!(
                "| {}{} | {} | {} | {:.2} | {} | {} | {} | {} |",
                report.model,
                if *ok { "" } else { " (FAILED)" },
                report.unique_states,
                report.max_depth,
                report.seconds,
                count(stateright::Expectation::Always),
                count(stateright::Expectation::Sometimes),
                count(stateright::Expectation::Eventually),
                report.bounds
            );
        }
    }
    if !caught.is_empty() {
        println!("\n| mutation | model | breaks | counterexample inputs |");
        println!("|---|---|---|---:|");
        for (mutation, report) in caught {
            let length = report
                .counterexample(mutation.breaks)
                .map(|steps| {
                    steps
                        .iter()
                        .filter(|s| !s.trim_start().starts_with("=>"))
                        .count()
                        .to_string()
                })
                .unwrap_or_else(|| "MISSED".to_owned());
            println!(
                "| {} | {} | {} | {} |",
                mutation.name, mutation.model, mutation.breaks, length
            );
        }
    }
}
