//! `pi-workflows view <runId> [--once | --watch] [--json]`.
//!
//! `--once` shows the complete view at one revision: the bounded view plus
//! every page of its steps and updates (`Client::complete_view`).
//!
//! Following subscribes to the run and applies the server's snapshots and
//! patches to one [`LiveView`]; a patch that does not fit the view's
//! revision makes it resubscribe from that revision. When the run settled
//! (a terminal display status with no activity left) it stops, or moves on
//! to the run that continues it after an answered checkpoint.

use super::render;
use super::{Exit, Failure, Outcome, connect, refused};
use crate::client::{Client, CompleteView, RequestSpec};
use crate::config::Config;
use crate::live::LiveView;
use serde_json::{Value, json};
use std::io::{IsTerminal, Write};

/// Shows `run_id` once, or follows it until it ends.
pub(super) async fn view(
    config: &Config,
    run_id: &str,
    follow: bool,
    json_output: bool,
) -> Outcome {
    let mut client = connect(config).await?;
    if !follow {
        let view = match client.complete_view(run_id).await? {
            CompleteView::View(view) => view,
            CompleteView::Refused(response) => return Err(refused(&response, Some(run_id))),
            CompleteView::Moving => {
                return Err(Failure::new(
                    Exit::Unavailable,
                    format!(
                        "run {run_id} kept changing while its view was read; run the command again"
                    ),
                ));
            }
        };
        if json_output {
            println!("{view}");
        } else {
            print!("{}", render::view_frame(&view, crate::clock::now_ms()));
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
    client: &mut Client,
    run_id: &str,
    screen: &mut Screen,
) -> Result<Value, Failure> {
    let mut live = LiveView::new();
    let mut subscription = subscribe(client, run_id, None).await?;
    loop {
        let frame = client.next_event().await?;
        let subscription_id = frame["subscriptionId"].as_str().unwrap_or_default();
        if subscription_id == "connection" {
            let reason = frame["event"]["reason"].as_str().unwrap_or("closed");
            return Err(Failure::new(
                Exit::Unavailable,
                format!("the server ended the connection ({reason}); run the command again"),
            ));
        }
        if subscription_id != subscription {
            continue;
        }
        if live.apply(&frame["event"]).is_err() {
            // A patch for another revision: resume from what we hold.
            unsubscribe(client, &subscription).await?;
            subscription = subscribe(client, run_id, live.revision()).await?;
            continue;
        }
        let view = live.view().expect("an applied event leaves a view");
        screen.draw(view);
        if render::is_settled(view) {
            let view = view.clone();
            unsubscribe(client, &subscription).await?;
            return Ok(view);
        }
    }
}

async fn subscribe(
    client: &mut Client,
    run_id: &str,
    from: Option<u64>,
) -> Result<String, Failure> {
    let response = client
        .subscribe(json!({ "kind": "run", "runId": run_id }), from)
        .await?;
    if response.outcome != "accepted" {
        return Err(refused(&response, Some(run_id)));
    }
    Ok(response
        .receipt
        .as_ref()
        .and_then(|receipt| receipt["subscriptionId"].as_str())
        .unwrap_or_default()
        .to_owned())
}

async fn unsubscribe(client: &mut Client, subscription_id: &str) -> Result<(), Failure> {
    client
        .request(&RequestSpec::read(
            "unsubscribe",
            None,
            json!({ "subscriptionId": subscription_id }),
        ))
        .await?;
    Ok(())
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
            let frame = render::view_frame(view, crate::clock::now_ms());
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
            print!("\n{}", render::view_frame(view, crate::clock::now_ms()));
        }
        match view["display"]["status"].as_str() {
            Some("completed") => Exit::Ok,
            _ => Exit::Refused,
        }
    }
}
