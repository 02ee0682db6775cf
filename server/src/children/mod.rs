//! Supervised child processes: run-mode runners, resolve-mode and
//! validate-mode children, and the admission that gives them slots.

use std::path::Path;
use std::process::Stdio;
use tokio::process::Command;

pub mod admission;
pub mod controller;
pub mod controller_resolve;
pub mod resolver;
pub mod supervisor;
pub mod validator;

/// The command of a child program (a runner, resolver, validator or
/// controller child): `program args…` in a process group of its own, so
/// that the whole group can be killed; run in the project's directory when
/// it still exists, else in the server home; stdin and stdout piped (its
/// channel), stderr into its log. The caller sets `kill_on_drop` and spawns.
pub(crate) fn child_command(
    program: &str,
    args: &[String],
    project_path: &Path,
    home: &Path,
    stderr: impl Into<Stdio>,
) -> Command {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(if project_path.is_dir() {
            project_path
        } else {
            home
        })
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr);
    command
}
