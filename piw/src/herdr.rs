//! `piw --herdr-pane`: the command of the Herdr plugin pane that `/piw`
//! opens (the manifest is server/cli/herdr-plugin.toml). Herdr starts it
//! with `HERDR_PANE_ID` and the `PI_WORKFLOWS_RUN_ID` the extension passed;
//! it labels its own pane `piw · <runId>` (the label `/piw` looks for to
//! focus the pane instead of opening another) and then views that run.
//!
//! Invariants:
//! - Both variables are checked before anything runs: the run id by the
//!   protocol's `RunId` pattern, the pane id as Herdr writes it.
//! - A pane that cannot be labelled is an error (one line), never an
//!   unlabelled viewer that `/piw` would open a second time.

use std::process::Command;
use std::str::FromStr as _;

/// The exact label of the pane that shows `run_id`.
pub fn pane_label(run_id: &str) -> String {
    format!("piw · {run_id}")
}

/// Checks the pane's variables (`lookup` reads the environment), labels
/// the pane with `herdr pane rename`, and returns the run to view.
pub fn label_pane(lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let run_id = lookup("PI_WORKFLOWS_RUN_ID")
        .filter(|run_id| protocol::generated::types::RunId::from_str(run_id).is_ok())
        .ok_or("--herdr-pane needs PI_WORKFLOWS_RUN_ID set to a run id (Herdr sets it when /piw opens the pane); run `piw RUN_ID` instead")?;
    let pane_id = lookup("HERDR_PANE_ID")
        .filter(|pane| {
            !pane.is_empty()
                && pane.len() <= 200
                && pane
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || b":._-".contains(&byte))
        })
        .ok_or("--herdr-pane runs only in a Herdr pane (HERDR_PANE_ID is missing or invalid); run `piw RUN_ID` instead")?;
    let output = Command::new("herdr")
        .args(["pane", "rename", &pane_id, &pane_label(&run_id)])
        .output()
        .map_err(|error| {
            format!(
                "cannot run herdr to label this pane ({}); run `piw {run_id}` instead",
                error.kind()
            )
        })?;
    if !output.status.success() {
        let reason = String::from_utf8_lossy(&output.stderr);
        let reason: String = reason.split_whitespace().collect::<Vec<_>>().join(" ");
        let reason: String = reason.chars().take(200).collect();
        return Err(format!(
            "herdr pane rename failed ({reason}); run `piw {run_id}` instead"
        ));
    }
    Ok(run_id)
}
