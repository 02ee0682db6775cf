//! `pi-workflows view <runId> [--once | --watch] [--json]`.
//!
//! `--once` shows the complete view at one revision: the bounded view plus
//! every page of its steps and updates (`WorkflowClient::complete_view_json`).
//!
//! Following subscribes to the run and applies the server's snapshots and
//! patches to one [`LiveView`]. The client keeps the subscription: a patch
//! that does not fit the last revision, or a lost connection, makes it
//! subscribe again from that revision (bounded by
//! `PI_WORKFLOWS_CLI_TIMEOUT_MS` for a server that went away). When the run
//! settled (a terminal display status with no activity left) it stops, or
//! moves on to the run that continues it after an answered checkpoint.

use super::render;
use super::{Exit, Failure, Outcome, Settings, connect, refused};
use pi_workflows_client::{Delivery, LiveView, WorkflowClient};
use protocol::generated::types::SubscriptionTarget;
use serde_json::Value;
use std::io::{IsTerminal, Write};

/// Shows `run_id` once, or follows it until it ends.
pub(super) async fn view(
    settings: &Settings,
    run_id: &str,
    follow: bool,
    json_output: bool,
) -> Outcome {
    let mut client = connect(settings).await?;
    if !follow {
        let view = client
            .complete_view_json(run_id)
            .await
            .map_err(|error| refused(error, Some(run_id)))?;
        if json_output {
            println!("{view}");
        } else {
            print!("{}", render::view_frame(&view, super::now_ms()));
        }
        return Ok(Exit::Ok);
    }
    let mut screen = Screen::new(json_output);
    let mut run_id = run_id.to_owned();
    loop {
        let view = follow_run(&mut client, &run_id, &mut screen).await?;
        match view["lineage"]["continuedBy"].as_str() {
            Some(next) if view["display"]["status"] == "completed" => {
                screen.note(&format!("run {run_id} continues as run {next}"));
                run_id = next.to_owned();
            }
            _ => return Ok(screen.finish(&view)),
        }
    }
}

/// Follows one run until it settled (terminal, nothing winding down);
/// returns that view.
async fn follow_run(
    client: &mut WorkflowClient,
    run_id: &str,
    screen: &mut Screen,
) -> Result<Value, Failure> {
    let target: SubscriptionTarget = serde_json::from_value(
        serde_json::json!({ "kind": "run", "runId": run_id }),
    )
    .map_err(|_| {
        Failure::new(
            Exit::NotFound,
            format!("no run {run_id}; list runs with `pi-workflows runs`"),
        )
    })?;
    let mut live = LiveView::new();
    let subscription = client
        .subscribe(&target, None)
        .await
        .map_err(|error| refused(error, Some(run_id)))?;
    loop {
        let event = match client
            .next_event()
            .await
            .map_err(|error| refused(error, Some(run_id)))?
        {
            Delivery::Event {
                subscription: from,
                event,
                ..
            } if from == subscription => event,
            Delivery::Event { .. } => continue,
            Delivery::Unavailable => {
                screen.note("lost the connection to the server; reconnecting…");
                continue;
            }
            Delivery::Available => continue,
        };
        if live.apply_event(&event).is_err() {
            // The client delivers patches on their base only; a view that
            // cannot take one is a protocol failure.
            return Err(Failure::new(
                Exit::Unavailable,
                "the server sent a view change that does not fit; run the command again",
            ));
        }
        let view = live.view().expect("an applied event leaves a view");
        screen.draw(view);
        if render::is_settled(view) {
            let view = view.clone();
            client
                .unsubscribe(subscription)
                .await
                .map_err(|error| refused(error, Some(run_id)))?;
            return Ok(view);
        }
    }
}

/// Where frames go: redrawn in place on a terminal, one status line per
/// change otherwise, or one JSON view per revision.
struct Screen {
    json: bool,
    terminal: bool,
    last_line: String,
    last_view: Option<Value>,
}

impl Screen {
    fn new(json: bool) -> Self {
        Self {
            json,
            terminal: !json && std::io::stdout().is_terminal(),
            last_line: String::new(),
            last_view: None,
        }
    }

    fn draw(&mut self, view: &Value) {
        let mut stdout = std::io::stdout().lock();
        if self.json {
            let _ = writeln!(stdout, "{view}");
        } else if self.terminal {
            // Home, clear below, frame.
            let frame = render::view_frame(view, super::now_ms());
            let _ = write!(stdout, "\x1b[H\x1b[J{frame}");
        } else {
            let line = render::status_line(view);
            if line != self.last_line {
                let revision = view["revision"].as_u64().unwrap_or(0);
                let _ = writeln!(stdout, "[{revision}] {line}");
                self.last_line = line;
            }
        }
        let _ = stdout.flush();
        self.last_view = Some(view.clone());
    }

    fn note(&mut self, message: &str) {
        if !self.json {
            eprintln!("pi-workflows: {message}");
        }
    }

    /// Prints the final frame (when it was not on screen) and picks the exit
    /// code from the terminal status.
    fn finish(&mut self, view: &Value) -> Exit {
        if !self.json && !self.terminal {
            print!("\n{}", render::view_frame(view, super::now_ms()));
        }
        match view["display"]["status"].as_str() {
            Some("completed") => Exit::Ok,
            _ => Exit::Refused,
        }
    }
}
