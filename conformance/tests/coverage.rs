//! `conformance/COVERAGE.md` tells the truth about its own table.
//!
//! Invariants checked against the repository as it is:
//! - the summary counts and lists every row under the status the table gives
//!   it (the summary once drifted from the rows twice);
//! - every test the table names exists: a Rust `file.rs::name` has that `fn`,
//!   a TypeScript `file.ts::title` has a test with that title (a title cut
//!   with `…` matches by its prefix); `::name` names a test of the row's last
//!   named file;
//! - a row marked covered names at least one end-to-end test (a real server,
//!   real runners, real Pi or the real relay), never only kernel or model
//!   tests.
//!
//! Each check is shown to fire on a planted document in the tests below.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the conformance crate sits in the repository")
        .to_path_buf()
}

/// One row of the bullet table: number, status and the tests cell.
#[derive(Debug)]
struct Row {
    number: String,
    status: String,
    tests: String,
}

fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_start_matches('|')
        .trim_end_matches('|')
        .split('|')
        .map(|cell| cell.trim().to_owned())
        .collect()
}

/// The rows of the bullet table (`| # | seed bullet | status | tests |`).
fn rows(text: &str) -> Vec<Row> {
    text.lines()
        .filter(|line| line.starts_with("| "))
        .map(cells)
        .filter(|cells| cells.len() == 4)
        .filter(|cells| {
            let number = cells[0].trim_end_matches('b');
            !number.is_empty() && number.chars().all(|c| c.is_ascii_digit())
        })
        .map(|cells| Row {
            number: cells[0].clone(),
            status: cells[2].clone(),
            tests: cells[3].clone(),
        })
        .collect()
}

/// Expands a summary list such as `3b, 4, 25, 27–30` into row numbers.
fn expand(list: &str) -> BTreeSet<String> {
    let mut numbers = BTreeSet::new();
    for item in list
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        match item.split_once(['–', '-']) {
            Some((from, to)) => {
                let from: u32 = from.trim().parse().expect("a range starts with a number");
                let to: u32 = to.trim().parse().expect("a range ends with a number");
                numbers.extend((from..=to).map(|n| n.to_string()));
            }
            None => {
                numbers.insert(item.to_owned());
            }
        }
    }
    numbers
}

/// The summary table after `## Summary`: status → (count, rows).
fn summary(text: &str) -> BTreeMap<String, (usize, BTreeSet<String>)> {
    let Some((_, after)) = text.split_once("## Summary") else {
        return BTreeMap::new();
    };
    after
        .lines()
        .filter(|line| line.starts_with("| "))
        .map(cells)
        .filter(|cells| cells.len() == 3)
        .filter_map(|cells| {
            let count = cells[1].parse::<usize>().ok()?;
            let status = match cells[0].as_str() {
                "covered end to end" => "covered".to_owned(),
                "partly end to end" => "partly".to_owned(),
                "decision only (kernel / model)" => "decision only".to_owned(),
                other => other.to_owned(),
            };
            Some((status, (count, expand(&cells[2]))))
        })
        .collect()
}

fn summary_problems(text: &str) -> Vec<String> {
    let mut by_status: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in rows(text) {
        by_status.entry(row.status).or_default().insert(row.number);
    }
    let summary = summary(text);
    let mut problems = Vec::new();
    for (status, numbers) in &by_status {
        match summary.get(status) {
            None => problems.push(format!("the summary has no line for status `{status}`")),
            Some((count, listed)) => {
                if *count != numbers.len() {
                    problems.push(format!(
                        "summary says {count} rows are `{status}`, the table has {}",
                        numbers.len()
                    ));
                }
                if listed != numbers {
                    problems.push(format!(
                        "summary lists {listed:?} as `{status}`, the table has {numbers:?}"
                    ));
                }
            }
        }
    }
    for status in summary.keys() {
        if !by_status.contains_key(status) {
            problems.push(format!(
                "the summary lists status `{status}`, no row has it"
            ));
        }
    }
    problems
}

/// A test the tests cell names: its file and its name or title.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reference {
    file: String,
    name: String,
}

fn references(cell: &str) -> Vec<Reference> {
    let mut found = Vec::new();
    let mut current_file: Option<String> = None;
    for (index, token) in cell.split('`').enumerate() {
        if index % 2 == 0 {
            continue;
        }
        let Some((file, name)) = token.split_once("::") else {
            continue;
        };
        let file = if file.is_empty() {
            match &current_file {
                Some(file) => file.clone(),
                None => continue,
            }
        } else if file.ends_with(".rs") || file.ends_with(".ts") {
            current_file = Some(file.to_owned());
            file.to_owned()
        } else {
            // A Rust path such as `Output::BuildTerminalMessage`, not a test.
            continue;
        };
        found.push(Reference {
            file,
            name: name.to_owned(),
        });
    }
    found
}

fn reference_problem(root: &Path, reference: &Reference) -> Option<String> {
    let path = root.join(&reference.file);
    let Ok(source) = std::fs::read_to_string(&path) else {
        return Some(format!("{} does not exist", reference.file));
    };
    if reference.name == "*" {
        return None;
    }
    let name = reference.name.trim_end_matches('…').trim_end();
    let found = if reference.file.ends_with(".rs") {
        source.contains(&format!("fn {name}("))
    } else {
        let prefix = name.trim_end_matches(':').trim_end();
        source.contains(prefix) || source.contains(&prefix.replace('\'', "\\'"))
    };
    (!found).then(|| format!("{}::{} names no test", reference.file, reference.name))
}

/// Where a test runs the real thing: a server process, runner processes,
/// real Pi or the relay.
fn is_end_to_end(file: &str) -> bool {
    [
        "server/tests/",
        "piw/tests/",
        "sdk-ts/e2e/",
        "sdk-ts/e2e-pi/",
    ]
    .iter()
    .any(|prefix| file.starts_with(prefix))
        || [
            "sdk-ts/test/client-server.test.ts",
            "sdk-ts/test/parity.test.ts",
            // Inspects the package exactly as `npm pack` builds it.
            "sdk-ts/test/package.test.ts",
        ]
        .contains(&file)
}

fn row_problems(root: &Path, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for row in rows(text) {
        let named = references(&row.tests);
        for reference in &named {
            if let Some(problem) = reference_problem(root, reference) {
                problems.push(format!("row {}: {problem}", row.number));
            }
        }
        if row.status == "covered" && !named.iter().any(|r| is_end_to_end(&r.file)) {
            problems.push(format!(
                "row {} is covered but names no end-to-end test",
                row.number
            ));
        }
    }
    problems
}

fn coverage_text() -> String {
    std::fs::read_to_string(repository().join("conformance/COVERAGE.md"))
        .expect("conformance/COVERAGE.md is readable")
}

#[test]
fn the_summary_matches_the_table() {
    let text = coverage_text();
    assert!(rows(&text).len() >= 50, "the bullet table was read");
    let problems = summary_problems(&text);
    assert!(
        problems.is_empty(),
        "COVERAGE.md summary:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_named_test_exists_and_every_covered_row_names_an_end_to_end_test() {
    let problems = row_problems(&repository(), &coverage_text());
    assert!(
        problems.is_empty(),
        "COVERAGE.md rows:\n{}",
        problems.join("\n")
    );
}

const PLANTED: &str = "\
| # | seed bullet | status | tests |
|---|---|---|---|
| 1 | a | covered | `kernel/src/claim.rs::check_and_renew_extends_the_exact_claim` |
| 2 | b | partly | `server/tests/fencing.rs::no_such_test_here`, `::a_stalled_runner_whose_claim_expired_is_fenced_and_none_of_its_writes_commit` |
| 3 | c | covered | `sdk-ts/e2e-pi/recovery.test.ts::a notify node's notification reaches the session without a model turn` |

## Summary

| status | rows | which |
|---|---|---|
| covered end to end | 1 | 1 |
| partly end to end | 1 | 2 |
";

#[test]
fn the_summary_check_finds_a_planted_miscount() {
    let problems = summary_problems(PLANTED);
    assert_eq!(
        problems,
        vec![
            "summary says 1 rows are `covered`, the table has 2".to_owned(),
            "summary lists {\"1\"} as `covered`, the table has {\"1\", \"3\"}".to_owned(),
        ]
    );
}

#[test]
fn the_row_check_finds_a_missing_test_and_a_covered_row_without_an_end_to_end_test() {
    let problems = row_problems(&repository(), PLANTED);
    assert_eq!(
        problems,
        vec![
            "row 1 is covered but names no end-to-end test".to_owned(),
            "row 2: server/tests/fencing.rs::no_such_test_here names no test".to_owned(),
        ]
    );
}

#[test]
fn summary_ranges_expand() {
    let expanded = expand("3b, 4, 27–30");
    let expected: BTreeSet<String> = ["3b", "4", "27", "28", "29", "30"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(expanded, expected);
}
