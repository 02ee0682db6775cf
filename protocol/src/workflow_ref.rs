//! How a `run.start` `workflow` argument is read: a path or a name.
//!
//! Invariants:
//! - One rule for every reader (the CLI, the server's discovery and the
//!   TypeScript runner's `isPathReference` in `sdk-ts/src/runner/discovery.ts`):
//!   an argument is a path when it contains `/` or `\`, or when it is a file
//!   name with a workflow suffix (`<name>.workflow.ts` …, `<name>`
//!   non-empty); anything else is a discovered workflow name.
//! - The rule looks at the text only, never at the file system, so the same
//!   argument means the same thing in every directory.

/// The workflow file suffixes, in precedence order.
pub const WORKFLOW_SUFFIXES: [&str; 4] = [
    ".workflow.ts",
    ".workflow.js",
    ".workflow.mts",
    ".workflow.mjs",
];

/// The workflow name of a file name and the precedence rank of its suffix:
/// its stem before a workflow suffix, or `None` when it has no suffix or
/// nothing before it.
pub fn split_suffix(file_name: &str) -> Option<(&str, usize)> {
    WORKFLOW_SUFFIXES
        .iter()
        .enumerate()
        .find_map(|(rank, suffix)| {
            file_name
                .strip_suffix(suffix)
                .filter(|name| !name.is_empty())
                .map(|name| (name, rank))
        })
}

/// The workflow name of a file name (see [`split_suffix`]).
pub fn workflow_name_of(file_name: &str) -> Option<&str> {
    split_suffix(file_name).map(|(name, _)| name)
}

/// Whether `argument` names a workflow file rather than a discovered name.
pub fn is_path_reference(argument: &str) -> bool {
    argument.contains('/') || argument.contains('\\') || workflow_name_of(argument).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_names_follow_the_runner_rule() {
        for path in [
            "./review",
            "dir/review",
            "/abs/x.workflow.ts",
            "dir\\review",
            "review.workflow.ts",
            "review.workflow.js",
            "review.workflow.mts",
            "a.b.workflow.mjs",
        ] {
            assert!(is_path_reference(path), "{path}");
        }
        for name in [
            "review",
            "review.ts",
            "review.js",
            ".workflow.ts",
            "deploy-v2",
            "a.b",
        ] {
            assert!(!is_path_reference(name), "{name}");
        }
    }

    #[test]
    fn the_name_is_the_stem_before_the_first_matching_suffix() {
        assert_eq!(split_suffix("deploy.workflow.ts"), Some(("deploy", 0)));
        assert_eq!(split_suffix("deploy.workflow.mjs"), Some(("deploy", 3)));
        assert_eq!(workflow_name_of(".workflow.ts"), None);
        assert_eq!(workflow_name_of("deploy.ts"), None);
    }
}
