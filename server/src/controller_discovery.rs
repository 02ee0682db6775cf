//! Controller discovery: the file a controller name resolves to
//! (CONTROLLERS, "Discovery"), the same rule as
//! `sdk-ts/src/controllers/discovery.ts`. `resource.apply` re-checks it in
//! its receipt transaction, so a spec is accepted only under the file
//! discovery names at that moment.
//!
//! Invariants:
//! - The directories are `<project>/.pi/controllers/` (when a project is
//!   given), then `<home>/.pi/agent/controllers/`; only their top-level
//!   entries count.
//! - An entry is the controller `<name>` when its file name is
//!   `<name><suffix>` (`protocol::controller_ref`) and it is a regular file
//!   after following symlinks.
//! - The first of a name wins: the project over the global directory, and
//!   in one directory the earlier suffix of `CONTROLLER_SUFFIXES`.
//! - Discovery reads directory entries only; it never loads a module.

use protocol::controller_ref::split_controller_suffix;
use std::path::{Path, PathBuf};

/// The file of the controller `name` seen from `project` (and `home`), if any.
pub fn find(project: Option<&Path>, home: Option<&Path>, name: &str) -> Option<PathBuf> {
    let project_dir = project.map(|project| project.join(".pi").join("controllers"));
    let home_dir = home.map(|home| home.join(".pi").join("agent").join("controllers"));
    project_dir
        .into_iter()
        .chain(home_dir)
        .find_map(|directory| scan(&directory, name))
}

/// The winner of `name` in one directory: the file with the earliest suffix.
fn scan(directory: &Path, name: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(directory).ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let file_name = entry.file_name().into_string().ok()?;
            let (found, rank) = split_controller_suffix(&file_name)?;
            let path = entry.path();
            (found == name && std::fs::metadata(&path).is_ok_and(|meta| meta.is_file()))
                .then_some((rank, path))
        })
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, path)| path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, b"").expect("write");
    }

    #[test]
    fn the_project_wins_over_home_and_the_earlier_suffix_wins_in_a_directory() {
        let root = tempfile::tempdir().expect("temp dir");
        let project = root.path().join("project");
        let home = root.path().join("home");
        let global = home.join(".pi/agent/controllers");
        let local = project.join(".pi/controllers");
        touch(&global.join("repos.controller.ts"));
        touch(&global.join("deploy.controller.js"));
        touch(&local.join("repos.controller.mjs"));
        touch(&local.join("repos.controller.js"));
        touch(&local.join("Bad.controller.ts"));
        std::fs::create_dir_all(local.join("dir.controller.ts")).expect("a directory");
        std::os::unix::fs::symlink(local.join("missing"), local.join("dangling.controller.ts"))
            .expect("symlink");
        assert_eq!(
            find(Some(&project), Some(&home), "repos"),
            Some(local.join("repos.controller.js"))
        );
        assert_eq!(
            find(Some(&project), Some(&home), "deploy"),
            Some(global.join("deploy.controller.js"))
        );
        assert_eq!(
            find(None, Some(&home), "repos"),
            Some(global.join("repos.controller.ts"))
        );
        for absent in ["Bad", "dir", "dangling", "none"] {
            assert_eq!(find(Some(&project), Some(&home), absent), None, "{absent}");
        }
    }
}
