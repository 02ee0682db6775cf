//! Workflow discovery: which workflows a project can start by name
//! (docs/AUTHORING.md, "Where workflows are found"). The TypeScript runner,
//! which resolves the name `run.start` names, implements the same rule
//! (`sdk-ts/src/runner/discovery.ts`); both run the shared fixtures in
//! `protocol/fixtures/discovery/`.
//!
//! Invariants:
//! - The directories are `<project>/.pi/workflows/`, then
//!   `<home>/.pi/agent/workflows/`; only their top-level entries count.
//! - An entry is a workflow when its name is `<name><suffix>` with a
//!   non-empty `<name>` and a suffix of [`WORKFLOW_SUFFIXES`], and it is a
//!   regular file after following symlinks (a dangling link, a directory or a
//!   link to one is not).
//! - The first of a name wins: the project over the global directory, and in
//!   one directory the earlier suffix of [`WORKFLOW_SUFFIXES`].
//! - The list is each directory's winners in byte order of their names,
//!   project first.

use std::path::{Path, PathBuf};

use protocol::workflow_ref::split_suffix;
/// The suffixes and the name-vs-path rule are shared with the CLI
/// (`protocol::workflow_ref`).
pub use protocol::workflow_ref::{WORKFLOW_SUFFIXES, workflow_name_of};

/// Where a discovered workflow comes from (the `source` of `workflows.list`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Project,
    Global,
}

impl Origin {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Project => "project",
            Origin::Global => "global",
        }
    }
}

/// One discovered workflow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovered {
    pub name: String,
    pub origin: Origin,
    /// The entry's path in its directory (not resolved through symlinks).
    pub path: PathBuf,
}

/// Every workflow visible from `project_path` (and `home`, when known), first
/// of each name winning.
pub fn discover(project_path: &Path, home: Option<&Path>) -> Vec<Discovered> {
    let mut directories = vec![(project_path.join(".pi").join("workflows"), Origin::Project)];
    if let Some(home) = home {
        directories.push((
            home.join(".pi").join("agent").join("workflows"),
            Origin::Global,
        ));
    }
    let mut found: Vec<Discovered> = Vec::new();
    for (directory, origin) in directories {
        for candidate in scan(&directory, origin) {
            if !found.iter().any(|existing| existing.name == candidate.name) {
                found.push(candidate);
            }
        }
    }
    found
}

/// One directory's workflows: one per name (the earliest suffix), sorted by name.
fn scan(directory: &Path, origin: Origin) -> Vec<Discovered> {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return Vec::new();
    };
    // (name, suffix rank, path)
    let mut candidates: Vec<(String, usize, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let file_name = entry.file_name().into_string().ok()?;
            let (name, rank) = split_suffix(&file_name)?;
            let path = entry.path();
            // `metadata` follows symlinks: a link to a file counts, a dangling link does not.
            std::fs::metadata(&path)
                .is_ok_and(|metadata| metadata.is_file())
                .then(|| (name.to_owned(), rank, path))
        })
        .collect();
    candidates.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    candidates.dedup_by(|later, earlier| later.0 == earlier.0);
    candidates
        .into_iter()
        .map(|(name, _, path)| Discovered { name, origin, path })
        .collect()
}

#[cfg(test)]
mod tests {
    //! The shared fixtures `protocol/fixtures/discovery/cases.json`, which the
    //! TypeScript runner's tests run too (`sdk-ts/test/discovery.test.ts`).
    use super::*;
    use serde_json::Value;
    use std::path::Path;

    fn build(root: &Path, entries: &[Value]) {
        for entry in entries {
            let text = |key: &str| entry.get(key).and_then(Value::as_str).map(|p| root.join(p));
            if let Some(file) = text("file") {
                std::fs::create_dir_all(file.parent().expect("a parent")).expect("mkdir");
                std::fs::write(&file, b"").expect("write");
            } else if let Some(dir) = text("dir") {
                std::fs::create_dir_all(&dir).expect("mkdir");
            } else if let Some(link) = text("symlink") {
                let target = entry["target"].as_str().expect("a symlink target");
                std::fs::create_dir_all(link.parent().expect("a parent")).expect("mkdir");
                std::os::unix::fs::symlink(target, &link).expect("symlink");
            } else {
                panic!("an entry is a file, dir or symlink: {entry}");
            }
        }
    }

    /// `discover` as the fixtures write it: name, origin, path under the root.
    fn listed(root: &Path) -> Vec<Value> {
        discover(&root.join("project"), Some(&root.join("home")))
            .iter()
            .map(|found| {
                let relative = found.path.strip_prefix(root).expect("under the root");
                serde_json::json!({
                    "name": found.name,
                    "origin": found.origin.as_str(),
                    "path": relative.to_str().expect("UTF-8"),
                })
            })
            .collect()
    }

    #[test]
    fn discovery_follows_the_shared_fixtures() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/fixtures/discovery/cases.json");
        let fixtures: Value =
            serde_json::from_slice(&std::fs::read(&path).expect("the fixtures")).expect("JSON");
        let cases = fixtures["cases"].as_array().expect("cases");
        assert!(cases.len() >= 10, "every case is run");
        let mut failures = Vec::new();
        for case in cases {
            let name = case["case"].as_str().expect("a case name");
            let root = tempfile::tempdir().expect("a temp dir");
            build(root.path(), case["entries"].as_array().expect("entries"));
            let found = Value::Array(listed(root.path()));
            if found != case["expected"] {
                failures.push(format!(
                    "case {name:?}:\n  found    {found}\n  expected {}",
                    case["expected"]
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} cases differ:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn a_name_is_the_part_before_a_workflow_suffix() {
        assert_eq!(workflow_name_of("deploy.workflow.ts"), Some("deploy"));
        assert_eq!(workflow_name_of("a.b.workflow.mjs"), Some("a.b"));
        assert_eq!(workflow_name_of(".workflow.ts"), None);
        assert_eq!(workflow_name_of("deploy.ts"), None);
    }
}
