//! Controller file names: which files are controller modules, and the
//! controller name a file defines (CONTROLLERS, "Discovery").
//!
//! Invariants:
//! - One rule for every reader: the server's discovery
//!   (`server/src/controller_discovery.rs`) and the TypeScript
//!   `sdk-ts/src/controllers/discovery.ts`. A file is a controller module
//!   when its name is `<name><suffix>` with a suffix of
//!   [`CONTROLLER_SUFFIXES`] and `<name>` a valid controller name
//!   (`^[a-z][a-z0-9-]*$`, at most 64 bytes).
//! - The rule looks at the text only, never at the file system.

/// The controller module suffixes, in precedence order.
pub const CONTROLLER_SUFFIXES: [&str; 4] = [
    ".controller.ts",
    ".controller.js",
    ".controller.mts",
    ".controller.mjs",
];

/// Whether `name` is a controller name: `^[a-z][a-z0-9-]*$`, at most 64 bytes.
pub fn is_controller_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= 64
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The controller name of a file name and the precedence rank of its
/// suffix, or `None` when it is not a controller module.
pub fn split_controller_suffix(file_name: &str) -> Option<(&str, usize)> {
    CONTROLLER_SUFFIXES
        .iter()
        .enumerate()
        .find_map(|(rank, suffix)| {
            file_name
                .strip_suffix(suffix)
                .filter(|name| is_controller_name(name))
                .map(|name| (name, rank))
        })
}

/// The controller name a file defines (see [`split_controller_suffix`]).
pub fn controller_name_of(file_name: &str) -> Option<&str> {
    split_controller_suffix(file_name).map(|(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_controller_file_is_a_valid_name_and_a_controller_suffix() {
        assert_eq!(
            split_controller_suffix("pull-request.controller.ts"),
            Some(("pull-request", 0))
        );
        assert_eq!(
            split_controller_suffix("repos.controller.mjs"),
            Some(("repos", 3))
        );
        for not_one in [
            ".controller.ts",
            "Repos.controller.ts",
            "1repos.controller.ts",
            "repos_x.controller.ts",
            "repos.workflow.ts",
            "repos.ts",
        ] {
            assert_eq!(controller_name_of(not_one), None, "{not_one}");
        }
        assert!(is_controller_name(&"a".repeat(64)));
        assert!(!is_controller_name(&"a".repeat(65)));
    }
}
