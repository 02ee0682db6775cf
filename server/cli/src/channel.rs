//! `channel status | reload | recover confirm|retry PROFILE ATTEMPT`: the
//! supervised channel adapters (docs/CHANNELS.md).

use super::{Exit, Outcome, Settings, connect, refused};
use clap::Subcommand;
use pi_workflows_client::{CallOptions, ops};
use serde_json::json;

#[derive(Debug, Subcommand)]
pub(super) enum ChannelCommand {
    /// Each configured profile's adapter: running, stopped or failed, and why.
    Status {
        /// Print JSON (the channel.status receipt).
        #[arg(long)]
        json: bool,
    },
    /// Read the channel configuration again and restart the adapters.
    Reload,
    /// Review an interrupted (ambiguous) channel send or settlement edit:
    /// check Telegram first.
    #[command(subcommand)]
    Recover(RecoverCommand),
}

#[derive(Debug, Subcommand)]
pub(super) enum RecoverCommand {
    /// The message did arrive (or was edited): record it as applied.
    Confirm { profile: String, attempt_id: String },
    /// Send (or edit) it again as the next attempt (a duplicate message is
    /// possible).
    Retry { profile: String, attempt_id: String },
}

const DUPLICATE_WARNING: &str = "a duplicate is possible: if the earlier attempt reached Telegram, the chat will show the decision twice; answer only one of the two messages";

pub(super) async fn run(settings: &Settings, command: ChannelCommand) -> Outcome {
    let mut client = connect(settings).await?;
    match command {
        ChannelCommand::Status { json: json_output } => {
            let status = client
                .call_json::<ops::ChannelStatus>(None, json!({}), CallOptions::default())
                .await
                .map_err(|error| refused(error, None))?;
            let receipt = status.receipt;
            if json_output {
                println!("{}", serde_json::to_string(&receipt).unwrap_or_default());
                return Ok(Exit::Ok);
            }
            if let Some(diagnostic) = &receipt.diagnostic {
                println!("channels: {}", diagnostic.as_str());
            }
            if receipt.channels.is_empty() && receipt.diagnostic.is_none() {
                println!("No channel profiles are configured (docs/CHANNELS.md).");
            }
            for row in &receipt.channels {
                let state = serde_json::to_value(row.state).unwrap_or_default();
                let mut line = format!(
                    "{}: {}",
                    row.profile.as_str(),
                    state.as_str().unwrap_or("?")
                );
                if let Some(attempt) = &row.attempt_id {
                    line.push_str(&format!(" (last send {})", attempt.as_str()));
                }
                if let Some(diagnostic) = &row.diagnostic {
                    line.push_str(&format!(" — {}", diagnostic.as_str()));
                }
                println!("{line}");
            }
        }
        ChannelCommand::Reload => {
            let reloaded = client
                .call_json::<ops::ChannelReload>(None, json!({}), CallOptions::default())
                .await
                .map_err(|error| refused(error, None))?;
            println!(
                "reloading {} channel profile(s); see `pi-workflows channel status`",
                reloaded.receipt.reloaded.get()
            );
        }
        ChannelCommand::Recover(recover) => {
            let (action, profile, attempt_id) = match recover {
                RecoverCommand::Confirm {
                    profile,
                    attempt_id,
                } => ("confirm", profile, attempt_id),
                RecoverCommand::Retry {
                    profile,
                    attempt_id,
                } => ("retry", profile, attempt_id),
            };
            if action == "retry" {
                eprintln!("pi-workflows: warning: {DUPLICATE_WARNING}");
            }
            let recovered = client
                .call_json::<ops::ChannelRecover>(
                    None,
                    json!({"profile": profile, "attemptId": attempt_id, "action": action}),
                    CallOptions::default(),
                )
                .await
                .map_err(|error| refused(error, None))?;
            if action == "confirm" {
                println!("confirmed {attempt_id} of profile {profile}: recorded as done");
            } else {
                println!(
                    "profile {profile} will try it again as {}",
                    recovered.receipt.attempt_id.as_str()
                );
            }
        }
    }
    Ok(Exit::Ok)
}
