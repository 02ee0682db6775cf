//! `pi-workflows state verify | backup | prune`: state maintenance through
//! the server.
//!
//! Invariants:
//! - The CLI never opens the database: each command is one request to the
//!   server (started when it is not running), which reads and writes it.
//! - `backup` and `prune` send one fresh idempotency key per invocation;
//!   the client's automatic reconnect retry keeps it (with a new request
//!   id), so a retry after a lost connection adopts the stored receipt
//!   instead of running the work twice. A later invocation gets a new key.
//! - While a backup or prune runs, its progress (trees and bytes) is drawn
//!   as a bar on stderr when stderr is a terminal, and written as plain
//!   lines otherwise; stdout carries only the result. The command waits as
//!   long as the server reports progress: it gives up (exit 6) only when
//!   neither progress nor the answer came for `PI_WORKFLOWS_CLI_TIMEOUT_MS`.

use super::{Exit, Failure, Outcome, Settings, cli_client_id, connect};
use pi_workflows_client::{
    Accepted, CallOptions, ClientError, ClientOperation, Delivery, WorkflowClient, ops,
};
use protocol::generated::types::{
    ClientEvent, MaintenancePhase, StateBackupPayload, StateBackupReceipt, StatePrunePayload,
    StatePruneReceipt, StateVerifyPayload, StateVerifyReceipt, SubscriptionTarget,
};
use std::io::{IsTerminal as _, Write as _};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum StateCommand {
    /// Check the state database: SQLite's integrity check, the schema, the
    /// server's consistency checks and orphaned blobs.
    Verify {
        /// Verify this inactive database file (a backup; an absolute path)
        /// instead of the live state.
        path: Option<String>,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
    /// Write an online, verified backup of the state to a new file.
    Backup {
        /// The new backup file (an absolute path; an existing file is never
        /// replaced).
        path: String,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
    /// List the run trees that finished more than DAYS ago and hold nothing
    /// protected; with --apply, back up and then delete them.
    Prune {
        /// The age in days (default 30, the automatic retention period).
        #[arg(long, value_name = "DAYS")]
        older_than: Option<u64>,
        /// Delete them (after writing and verifying the backup).
        #[arg(long, requires = "backup")]
        apply: bool,
        /// The new backup file --apply writes first (an absolute path).
        #[arg(long, value_name = "PATH", requires = "apply")]
        backup: Option<String>,
        /// Print JSON (schema in docs/CLI.md).
        #[arg(long)]
        json: bool,
    },
}

/// Runs one state command.
pub(crate) async fn main(settings: &Settings, command: StateCommand) -> Outcome {
    match command {
        StateCommand::Verify { path, json } => verify(settings, path, json).await,
        StateCommand::Backup { path, json } => backup(settings, &path, json).await,
        StateCommand::Prune {
            older_than,
            apply,
            backup,
            json,
        } => prune(settings, older_than, apply, backup, json).await,
    }
}

/// `path` as the schema's absolute path, or a usage error.
fn absolute<T: std::str::FromStr>(path: &str, what: &str) -> Result<T, Failure> {
    if !std::path::Path::new(path).is_absolute() {
        return Err(Failure::new(
            Exit::Usage,
            format!("{what} takes an absolute path; give the full path, starting with /"),
        ));
    }
    path.parse()
        .map_err(|_| Failure::new(Exit::Usage, format!("{what}: the path is too long")))
}

/// The failure of a refused maintenance command: the server's message with
/// its exit code.
fn refused(error: ClientError) -> Failure {
    match error {
        ClientError::Refused { message, .. } | ClientError::Conflict { message, .. } => {
            Failure::new(Exit::Refused, message)
        }
        ClientError::NotFound { message, .. } => Failure::new(Exit::NotFound, message),
        ClientError::ServerUnavailable { message, .. } | ClientError::ClaimLost { message, .. } => {
            Failure::new(Exit::Unavailable, message)
        }
        other => Failure::from(other),
    }
}

// ---- verify ----------------------------------------------------------------------

async fn verify(settings: &Settings, path: Option<String>, json: bool) -> Outcome {
    let payload = StateVerifyPayload {
        path: path
            .as_deref()
            .map(|path| absolute(path, "state verify"))
            .transpose()?,
    };
    let mut client = connect(settings).await?;
    let accepted = client
        .call::<ops::StateVerify>(None, &payload, CallOptions::default())
        .await
        .map_err(refused)?;
    let receipt = accepted.receipt;
    if json {
        println!("{}", serde_json::to_string(&receipt).unwrap_or_default());
    } else {
        print!("{}", verify_report(&receipt, path.is_some()));
    }
    Ok(if receipt.ok { Exit::Ok } else { Exit::Refused })
}

/// The human report of a verification.
fn verify_report(receipt: &StateVerifyReceipt, inactive: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let what = if inactive { "the backup" } else { "the state" };
    let problems = receipt.problems.get();
    let _ = writeln!(
        out,
        "{what}: {}",
        if receipt.ok {
            "ok".to_owned()
        } else {
            format!("{problems} problem{}", plural(problems))
        }
    );
    let integrity: Vec<&str> = receipt
        .integrity
        .as_slice()
        .iter()
        .map(|l| l.as_str())
        .collect();
    let _ = writeln!(out, "  integrity check: {}", integrity.join("; "));
    let _ = writeln!(
        out,
        "  schema: {} ({})",
        if receipt.schema_matches {
            "matches this version"
        } else {
            "does not match this version"
        },
        receipt.ddl_digest.as_str()
    );
    if let Some(difference) = &receipt.schema_difference {
        let _ = writeln!(out, "    it {}", difference.as_str());
    }
    let _ = writeln!(
        out,
        "  foreign keys: {} dangling",
        receipt.foreign_key_violations.get()
    );
    let checks = receipt.checks.as_slice();
    let skipped = checks.iter().filter(|check| check.skipped).count();
    let violated: Vec<_> = checks
        .iter()
        .filter(|check| check.violations.get() > 0)
        .collect();
    let _ = writeln!(
        out,
        "  consistency checks: {} run, {} failed{}",
        checks.len() - skipped,
        violated.len(),
        if skipped > 0 {
            format!(", {skipped} skipped while runners are live")
        } else {
            String::new()
        }
    );
    for check in violated {
        let _ = writeln!(
            out,
            "    {}: {} row{}",
            check.check.as_str(),
            check.violations.get(),
            plural(check.violations.get())
        );
    }
    let _ = writeln!(out, "  orphaned blobs: {}", receipt.orphaned_blobs.get());
    out
}

fn plural(count: u64) -> &'static str {
    if count == 1 { "" } else { "s" }
}

// ---- backup and prune --------------------------------------------------------

async fn backup(settings: &Settings, path: &str, json: bool) -> Outcome {
    let payload = StateBackupPayload {
        destination: absolute(path, "state backup")?,
    };
    let accepted = with_progress::<ops::StateBackup>(settings, &payload, "state backup").await?;
    let receipt = accepted.receipt;
    if json {
        println!("{}", serde_json::to_string(&receipt).unwrap_or_default());
    } else {
        println!("{}", backed_up(&receipt));
    }
    Ok(Exit::Ok)
}

fn backed_up(receipt: &StateBackupReceipt) -> String {
    format!(
        "backed up the state to {} ({}, {}); it verified",
        receipt.destination.as_str(),
        size(receipt.bytes.get()),
        receipt.digest.as_str()
    )
}

async fn prune(
    settings: &Settings,
    older_than: Option<u64>,
    apply: bool,
    backup: Option<String>,
    json: bool,
) -> Outcome {
    let older_than_days = older_than
        .map(|days| {
            protocol::generated::constrained::OlderThanDays::new(days).ok_or_else(|| {
                Failure::new(
                    Exit::Usage,
                    "--older-than takes a number of days from 1 to 36500",
                )
            })
        })
        .transpose()?;
    let payload = StatePrunePayload {
        apply,
        backup: backup
            .as_deref()
            .map(|path| absolute(path, "state prune --backup"))
            .transpose()?,
        older_than_days,
    };
    let accepted = with_progress::<ops::StatePrune>(settings, &payload, "state prune").await?;
    let receipt = accepted.receipt;
    if json {
        println!("{}", serde_json::to_string(&receipt).unwrap_or_default());
    } else {
        print!("{}", prune_report(&receipt));
    }
    Ok(Exit::Ok)
}

/// The human report of a prune.
fn prune_report(receipt: &StatePruneReceipt) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if let Some(backup) = &receipt.backup {
        let _ = writeln!(out, "{}", backed_up(backup));
    }
    let trees = receipt.root_runs.get();
    let days = receipt.older_than_days.get();
    let verb = if receipt.applied {
        "deleted"
    } else {
        "would delete"
    };
    let _ = writeln!(
        out,
        "{verb} {trees} run tree{} ({} run{}, {} blob{}, {}) that finished more than {days} day{} ago",
        plural(trees),
        receipt.runs.get(),
        plural(receipt.runs.get()),
        receipt.blobs.get(),
        plural(receipt.blobs.get()),
        size(receipt.bytes.get()),
        plural(days),
    );
    let kept = receipt.kept.get();
    if kept > 0 {
        let _ = writeln!(
            out,
            "kept {kept} older tree{} that still hold{} protected work, a reference from another tree, or a younger run",
            plural(kept),
            if kept == 1 { "s" } else { "" }
        );
    }
    let listed = receipt.trees.as_slice();
    if !listed.is_empty() {
        let rows: Vec<Vec<String>> = listed
            .iter()
            .map(|tree| {
                vec![
                    tree.root_run_id.to_string(),
                    tree.workflow_name.to_string(),
                    crate::render::age(tree.finished_at_ms.get(), crate::now_ms()),
                    tree.runs.get().to_string(),
                    size(tree.bytes.get()),
                ]
            })
            .collect();
        out.push_str(&crate::render::table(
            &["ROOT RUN", "WORKFLOW", "FINISHED", "RUNS", "SIZE"],
            &rows,
        ));
        if (listed.len() as u64) < trees {
            let _ = writeln!(out, "… and {} more", trees - listed.len() as u64);
        }
    }
    if !receipt.applied && trees > 0 {
        let _ = writeln!(
            out,
            "delete them with `pi-workflows state prune --older-than {days} --apply --backup /absolute/new-backup.sqlite`"
        );
    }
    out
}

/// Bytes in B, KiB, MiB or GiB with one decimal.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Sends `payload` as one command with a fresh idempotency key and draws
/// the server's progress until the answer arrives.
async fn with_progress<Op: ClientOperation>(
    settings: &Settings,
    payload: &Op::Payload,
    label: &'static str,
) -> Result<Accepted<Op>, Failure> {
    let client_id = cli_client_id();
    let key = pi_workflows_client::ids::idempotency_key();
    // The hello is bounded as always; then progress bounds the wait
    // (below), not one answer limit.
    let mut client = WorkflowClient::new(settings.client_options(&client_id, true));
    client.connect().await?;
    client.set_answer_limit(None);
    let (sender, mut progress) = tokio::sync::mpsc::unbounded_channel();
    // A second connection follows the progress, subscribed before the
    // command is sent. Its client is polled in this task (it is not
    // `Send`), and the future below never completes.
    let mut watcher =
        WorkflowClient::new(settings.client_options(&format!("{client_id}-progress"), false));
    let subscribed = watcher
        .subscribe(&SubscriptionTarget::Maintenance, None)
        .await
        .is_ok();
    let watch_key = key.clone();
    let watch = async move {
        if !subscribed {
            return std::future::pending::<()>().await;
        }
        while let Ok(delivery) = watcher.next_event().await {
            if let Delivery::Event {
                event:
                    ClientEvent::MaintenanceProgress {
                        idempotency_key,
                        phase,
                        trees_done,
                        trees_total,
                        bytes_done,
                        bytes_total,
                        ..
                    },
                ..
            } = delivery
                && idempotency_key.as_str() == watch_key
            {
                let _ = sender.send(Step {
                    phase,
                    trees: (trees_done.get(), trees_total.get()),
                    bytes: (bytes_done.get(), bytes_total.get()),
                });
            }
        }
        std::future::pending::<()>().await
    };
    tokio::pin!(watch);
    let call = client.call::<Op>(
        None,
        payload,
        CallOptions {
            idempotency_key: Some(key),
            expected_revision: None,
        },
    );
    tokio::pin!(call);
    let mut bar = Bar::new(label, std::io::stderr().is_terminal());
    let mut done = false;
    let limit = settings.answer_limit;
    let mut deadline = tokio::time::Instant::now() + limit;
    let answer = loop {
        tokio::select! {
            answer = &mut call => break answer,
            () = &mut watch => {}
            Some(step) = progress.recv() => {
                deadline = tokio::time::Instant::now() + limit;
                done |= step.phase == MaintenancePhase::Done;
                bar.show(&step);
            }
            () = tokio::time::sleep_until(deadline) => {
                bar.clear();
                return Err(Failure::new(
                    Exit::TimedOut,
                    format!(
                        "the pi-workflows server did not answer `{}` nor report its progress within {} s; it may still finish it, so check before you retry (PI_WORKFLOWS_CLI_TIMEOUT_MS sets this wait)",
                        Op::OPERATION,
                        limit.as_secs()
                    ),
                ));
            }
        }
    };
    // The server publishes its last progress step before it answers (on
    // the other connection): show what is still on its way.
    if subscribed && !done {
        let grace = tokio::time::sleep(std::time::Duration::from_secs(2));
        tokio::pin!(grace);
        loop {
            tokio::select! {
                () = &mut watch => {}
                Some(step) = progress.recv() => {
                    if step.phase == MaintenancePhase::Done {
                        break;
                    }
                    bar.show(&step);
                }
                () = &mut grace => break,
            }
        }
    }
    bar.clear();
    answer.map_err(refused)
}

/// One progress report of the server.
#[derive(Clone, Copy, Debug)]
struct Step {
    phase: MaintenancePhase,
    trees: (u64, u64),
    bytes: (u64, u64),
}

/// Draws progress: a bar redrawn in place on a terminal, plain lines
/// otherwise (one per phase and per tenth done).
struct Bar {
    label: &'static str,
    terminal: bool,
    drawn: bool,
    /// The last phase and tenth a plain line was written for.
    last: Option<(MaintenancePhase, u64)>,
}

impl Bar {
    fn new(label: &'static str, terminal: bool) -> Self {
        Self {
            label,
            terminal,
            drawn: false,
            last: None,
        }
    }

    fn show(&mut self, step: &Step) {
        if step.phase == MaintenancePhase::Done {
            return;
        }
        let line = progress_line(step);
        let mut stderr = std::io::stderr().lock();
        if self.terminal {
            let fraction = fraction(step);
            let filled = (fraction * 24.0).round() as usize;
            let _ = write!(
                stderr,
                "\r\x1b[2K{}: [{}{}] {line}",
                self.label,
                "#".repeat(filled),
                "-".repeat(24 - filled.min(24))
            );
            let _ = stderr.flush();
            self.drawn = true;
            return;
        }
        let tenth = (fraction(step) * 10.0).floor() as u64;
        if self
            .last
            .is_some_and(|(phase, last)| phase == step.phase && last >= tenth)
        {
            return;
        }
        self.last = Some((step.phase, tenth));
        let _ = writeln!(stderr, "pi-workflows: {}: {line}", self.label);
    }

    /// Removes a drawn bar.
    fn clear(&mut self) {
        if self.drawn {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.drawn = false;
        }
    }
}

/// How much of the current phase is done (0 when its total is unknown).
fn fraction(step: &Step) -> f64 {
    let (done, total) = match step.phase {
        MaintenancePhase::Backup => step.bytes,
        MaintenancePhase::Select | MaintenancePhase::Delete | MaintenancePhase::Done => step.trees,
    };
    if total == 0 {
        0.0
    } else {
        (done as f64 / total as f64).clamp(0.0, 1.0)
    }
}

/// The words of one progress step.
fn progress_line(step: &Step) -> String {
    let (trees_done, trees_total) = step.trees;
    let (bytes_done, bytes_total) = step.bytes;
    let of = |total: u64, shown: String| {
        if total == 0 {
            shown
        } else {
            format!("{shown} of {}", size(total))
        }
    };
    match step.phase {
        MaintenancePhase::Select => {
            format!("selecting: {trees_done} of {trees_total} old run trees checked")
        }
        MaintenancePhase::Backup => format!("backing up: {}", of(bytes_total, size(bytes_done))),
        MaintenancePhase::Delete => format!(
            "deleting: {trees_done} of {trees_total} run trees, {}",
            of(bytes_total, size(bytes_done))
        ),
        MaintenancePhase::Done => "done".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 * 1024 * 1024), "3.0 MiB");
    }

    #[test]
    fn progress_lines_say_the_phase_and_its_totals() {
        let step = Step {
            phase: MaintenancePhase::Delete,
            trees: (12, 40),
            bytes: (2048, 4096),
        };
        assert_eq!(
            progress_line(&step),
            "deleting: 12 of 40 run trees, 2.0 KiB of 4.0 KiB"
        );
        assert!((fraction(&step) - 0.3).abs() < 1e-9);
        let backup = Step {
            phase: MaintenancePhase::Backup,
            trees: (0, 0),
            bytes: (0, 0),
        };
        assert_eq!(progress_line(&backup), "backing up: 0 B");
        assert_eq!(
            fraction(&backup),
            0.0,
            "an unknown total draws an empty bar"
        );
    }

    #[test]
    fn paths_must_be_absolute() {
        let relative: Result<protocol::generated::types::AbsolutePath, _> =
            absolute("backup.sqlite", "state backup");
        let failure = relative.unwrap_err();
        assert_eq!(failure.exit, Exit::Usage);
        assert!(
            failure.message.contains("absolute path"),
            "{}",
            failure.message
        );
        assert!(absolute::<protocol::generated::types::AbsolutePath>("/tmp/b.sqlite", "x").is_ok());
    }
}
