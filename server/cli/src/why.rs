//! `pi-workflows why <runId> [--json]`: why a run is not progressing and
//! who must act (`run.why`).
//!
//! The server decides every word (`kernel::why`); the CLI prints the
//! receipt's `lines`, or with `--json` the whole receipt: the same content
//! as data (`protocol/run-view.v1.schema.json#/$defs/RunWhy`).

use super::{Exit, Outcome, Settings, connect, refused};

/// Prints the explanation of `run_id`.
pub(super) async fn why(settings: &Settings, run_id: &str, json_output: bool) -> Outcome {
    let mut client = connect(settings).await?;
    let why = client
        .run_why(run_id)
        .await
        .map_err(|error| refused(error, Some(run_id)))?;
    if json_output {
        println!(
            "{}",
            serde_json::to_string(&why).expect("a generated type serialises")
        );
    } else {
        for line in why.lines.as_slice() {
            println!("{}", line.as_str());
        }
    }
    Ok(Exit::Ok)
}
