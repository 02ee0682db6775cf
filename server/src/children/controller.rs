//! Reconcile supervision: one controller child per claimed `resource_queue`
//! row (`controller.reconcile` on the private controller.v1 channel).
//!
//! Invariants:
//! - A pass starts only from a committed claim: [`admit`] claims the row
//!   (`kernel::reconcile::claim`, lease `reconcile::defaults::LEASE_MS`, the
//!   token kept only in memory and stored as its hash) and reads the
//!   resource in one transaction, registers the pass (it holds a slot of
//!   the shared capacity) and only then spawns the child.
//! - The child runs the `PI_WORKFLOWS_CONTROLLER_RUNNER` command in its own
//!   process group with its stderr in the runner logs. The server writes
//!   the launch, then one reply per child message, in order; every message
//!   is handled by `controller_api` (load facts, kernel, write, commit,
//!   reply).
//! - The claim is renewed every third of its lease while the child lives;
//!   a lost claim ends the pass (its group is killed, nothing more is
//!   written for it).
//! - The deadline: at the launch's `timeoutMs` plus a short grace the
//!   group is killed and the row finished as an error under the live claim
//!   (backoff). A child that exits, breaks the channel or sends an invalid
//!   message without `finished`/`failed` is a failed pass too. A pass the
//!   server stops itself (shutdown) is `Interrupted`: available again, no
//!   error counted.
//! - No member of the child's group outlives the pass: the group is killed
//!   after the last reply (after a short grace for its own exit).

use crate::context::Context;
use crate::context::reconciles::Pass;
use crate::process;
use crate::store::{Commit, resources};
use kernel::reconcile::{Finished, defaults};
use nix::sys::signal::Signal;
use protocol::generated::types::{ControllerChildMessage, ControllerLaunch};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;
use tokio_util::codec::{FramedRead, LinesCodec};

/// The longest channel line, in bytes.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// How long after its deadline a pass's group is killed.
pub const DEADLINE_GRACE: Duration = Duration::from_millis(500);

/// How long a child that got its last reply may take to exit.
const EXIT_GRACE: Duration = Duration::from_millis(2_000);

/// The claimable rows that may be admitted now (those without a pass in
/// flight here).
pub fn candidates(
    app: &Context,
    connection: &rusqlite::Connection,
    now_ms: u64,
) -> rusqlite::Result<Vec<resources::Claimable>> {
    let rows = resources::claimable(connection, now_ms, 64)?;
    Ok(rows
        .into_iter()
        .filter(|row| !app.reconciles.is_live(&row.uid))
        .collect())
}

/// Claims `uid`'s row and starts its pass. Returns whether it was admitted.
pub async fn admit(app: &Arc<Context>, uid: String) -> bool {
    let token_hash = crate::ids::sha256(&crate::ids::random_bytes::<32>());
    let timeout_ms = app.config.reconcile_timeout_ms;
    let home = app.config.home.to_string_lossy().into_owned();
    let claimed = crate::shell::transact(app, move |connection, now_ms| {
        let Some(resource) = resources::load_by_uid(connection, &uid)? else {
            return Ok(Commit::Discard((None, Vec::new())));
        };
        let Some(Ok(row)) =
            resources::claim(connection, &uid, token_hash, defaults::LEASE_MS, now_ms)?
        else {
            return Ok(Commit::Discard((None, Vec::new())));
        };
        let record = &resource.record;
        resources::append_event(
            connection,
            &resources::ResourceEvent::of(
                record,
                resources::ResourceEventKind::ReconcileStarted,
                now_ms,
            ),
        )?;
        let pass = Pass {
            uid: uid.clone(),
            controller: record.controller.clone(),
            key: record.key.clone(),
            generation: row.generation,
            token_hash,
            read_version: record.resource_version,
            resource_generation: record.generation,
            timeout_ms,
            effect_key: Default::default(),
            identity: Default::default(),
            interrupted: Default::default(),
        };
        let project_path = resource.project_path.clone().unwrap_or(home);
        let launch = launch_line(&resource, &project_path, row.generation, timeout_ms);
        Ok(Commit::Keep((
            Some((pass, launch, project_path)),
            Vec::new(),
        )))
    })
    .await;
    let Ok(Some((pass, launch, project_path))) = claimed else {
        return false;
    };
    let pass = Arc::new(pass);
    if !app.reconciles.register(pass.clone()) {
        return false;
    }
    tokio::spawn(supervise(app.clone(), pass, launch, project_path));
    true
}

/// The `controller.reconcile` launch line (`None`: the stored resource does
/// not fit the channel's schema; the pass fails).
fn launch_line(
    resource: &resources::StoredResource,
    project_path: &str,
    claim_generation: u64,
    timeout_ms: u64,
) -> Option<Vec<u8>> {
    use protocol::generated::constrained::{
        Count, DurationMs, Generation, ResourceConditions, ResourceFinalizers, Revision,
        TimestampMs,
    };
    use protocol::generated::types::{
        ControllerResource, ResourceCondition, ResourceConditionStatus, ResourceMetadata,
        ResourceStatusDocument,
    };
    let record = &resource.record;
    let conditions = record
        .status
        .conditions
        .iter()
        .map(|condition| {
            Some(ResourceCondition {
                last_transition_time: TimestampMs::new(condition.last_transition_at_ms)?,
                message: match &condition.message {
                    Some(message) => Some(message.parse().ok()?),
                    None => None,
                },
                observed_generation: Count::new(condition.observed_generation)?,
                reason: condition.reason.parse().ok()?,
                status: match condition.status {
                    kernel::resource::ConditionStatus::True => ResourceConditionStatus::True,
                    kernel::resource::ConditionStatus::False => ResourceConditionStatus::False,
                    kernel::resource::ConditionStatus::Unknown => ResourceConditionStatus::Unknown,
                },
                type_: condition.condition_type.parse().ok()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let finalizers = record
        .finalizers
        .iter()
        .map(|name| name.parse().ok())
        .collect::<Option<Vec<_>>>()?;
    let typed = ControllerLaunch::ControllerReconcile {
        claim_generation: Generation::new(claim_generation)?,
        controller: record.controller.parse().ok()?,
        controller_path: resource.controller_path.parse().ok()?,
        project_path: project_path.parse().ok()?,
        resource: ControllerResource {
            metadata: ResourceMetadata {
                controller: record.controller.parse().ok()?,
                deletion_timestamp: match record.deletion_requested_at_ms {
                    Some(at_ms) => Some(TimestampMs::new(at_ms)?),
                    None => None,
                },
                finalizers: ResourceFinalizers::new(finalizers).ok()?,
                generation: Revision::new(record.generation)?,
                key: record.key.parse().ok()?,
                resource_version: Revision::new(record.resource_version)?,
                uid: record.uid.parse().ok()?,
            },
            spec: record.spec.clone(),
            status: ResourceStatusDocument {
                conditions: ResourceConditions::new(conditions).ok()?,
                controller_status: record.status.controller_status.clone(),
                observed_generation: Count::new(record.status.observed_generation)?,
                workflow_run: record.status.workflow_run.clone().unwrap_or(Value::Null),
            },
        },
        source_digest: crate::ids::digest_text(&record.source_digest)
            .parse()
            .ok()?,
        timeout_ms: DurationMs::new(timeout_ms)?,
    };
    let mut line = protocol::canonicalize_typed(&typed).ok()?;
    if line.len() >= MAX_LINE_BYTES {
        return None;
    }
    line.push(b'\n');
    Some(line)
}

/// How a pass ended, as far as the row is concerned.
#[derive(Debug)]
enum Ending {
    /// `finished`/`failed` was handled (the row is finished), or the claim
    /// is lost: nothing more to write.
    Done,
    /// The pass failed without finishing itself: finish the row as an error.
    Failed(&'static str),
    /// The server stopped the pass.
    Interrupted,
}

async fn supervise(
    app: Arc<Context>,
    pass: Arc<Pass>,
    launch: Option<Vec<u8>>,
    project_path: String,
) {
    let ending = match launch {
        Some(launch) => run_pass(&app, &pass, launch, &project_path).await,
        None => {
            Ending::Failed("the resource does not fit a controller launch; apply a smaller spec")
        }
    };
    if let Some(identity) = pass.identity()
        && process::group_has_members(identity.pid)
    {
        process::signal_own_group(identity.pid, Signal::SIGKILL);
    }
    let finished = match ending {
        Ending::Done => None,
        Ending::Failed(error) => Some((
            Finished::Failed {
                error: error.into(),
                jitter_permille: crate::controller_api::jitter(),
            },
            resources::ResourceEventKind::ReconcileFailed,
            Some(error),
        )),
        Ending::Interrupted => Some((
            Finished::Interrupted,
            resources::ResourceEventKind::ReconcileRequeued,
            Some("the server stopped the pass"),
        )),
    };
    if let Some((finished, kind, detail)) = finished {
        crate::controller_api::finish_row(&app, &pass, finished, kind, detail).await;
    }
    app.reconciles.remove(&pass.uid);
    app.scheduler.notify();
}

async fn run_pass(
    app: &Arc<Context>,
    pass: &Arc<Pass>,
    launch: Vec<u8>,
    project_path: &str,
) -> Ending {
    let Some((program, args)) = app.config.controller_command.split_first() else {
        return Ending::Failed(
            "no controller program is configured; set PI_WORKFLOWS_CONTROLLER_RUNNER",
        );
    };
    let log_name = format!("reconcile-{}", crate::ids::random_hex::<8>());
    let Ok((stderr, log)) = app.runner_logs.open(&log_name) else {
        return Ending::Failed("cannot open the controller log");
    };
    let mut command = super::child_command(
        program,
        args,
        std::path::Path::new(project_path),
        &app.config.home,
        stderr,
    );
    command.kill_on_drop(false);
    let Ok(mut child) = command.spawn() else {
        return Ending::Failed(
            "cannot start the controller child; check PI_WORKFLOWS_CONTROLLER_RUNNER",
        );
    };
    drop(command);
    let _log = log.start();
    if let Some(identity) = child.id().and_then(process::identity) {
        *pass.identity.lock().expect("identity lock") = Some(identity);
    }
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.wait().await;
        return Ending::Failed("cannot talk to the controller child");
    };
    if stdin.write_all(&launch).await.is_err() || stdin.flush().await.is_err() {
        let _ = child.wait().await;
        return Ending::Failed("the controller child closed its input before its launch");
    }
    let mut lines = FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_LINE_BYTES));
    let deadline = tokio::time::sleep(Duration::from_millis(pass.timeout_ms) + DEADLINE_GRACE);
    tokio::pin!(deadline);
    let renew_every = Duration::from_millis(defaults::LEASE_MS / 3);
    let mut renewal =
        tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
    let mut expected_request = 1u64;
    let ending = loop {
        tokio::select! {
            line = lines.next() => {
                let message = match line {
                    Some(Ok(text)) => serde_json::from_str::<ControllerChildMessage>(&text).ok(),
                    Some(Err(_)) => break Ending::Failed("the controller child sent an invalid or over-long line"),
                    None => break Ending::Failed("the controller child exited without finishing its pass"),
                };
                let Some(message) = message else {
                    break Ending::Failed("the controller child sent an invalid message");
                };
                if crate::controller_api::request_id(&message) != expected_request {
                    break Ending::Failed("the controller child broke the request order");
                }
                expected_request += 1;
                let handled = crate::controller_api::handle(app, pass, message).await;
                let Ok(mut bytes) = protocol::canonicalize_typed(&handled.reply) else {
                    break Ending::Failed("a reply could not be encoded");
                };
                bytes.push(b'\n');
                let written = stdin.write_all(&bytes).await.is_ok() && stdin.flush().await.is_ok();
                match handled.end {
                    Some(crate::controller_api::End::Finished) => break Ending::Done,
                    Some(crate::controller_api::End::ClaimLost) => break Ending::Done,
                    Some(crate::controller_api::End::Failed(error)) => break Ending::Failed(error),
                    None if !written => break Ending::Failed("the controller child closed its input"),
                    None => {}
                }
            }
            () = &mut deadline => {
                if let Some(identity) = pass.identity() {
                    process::signal_group(&identity, Signal::SIGKILL);
                }
                break Ending::Failed("the reconcile passed its deadline and was stopped");
            }
            _ = renewal.tick() => {
                if !crate::controller_api::renew(app, pass).await {
                    break Ending::Done;
                }
            }
        }
    };
    // A pass the server stopped (its group killed) is interrupted, not failed.
    let ending = match ending {
        Ending::Failed(_) if pass.is_interrupted() => Ending::Interrupted,
        other => other,
    };
    drop(stdin);
    if matches!(ending, Ending::Done) {
        let _ = tokio::time::timeout(EXIT_GRACE, child.wait()).await;
    }
    if let Some(identity) = pass.identity() {
        process::signal_group(&identity, Signal::SIGKILL);
    }
    let _ = child.wait().await;
    ending
}

/// Stops every pass in flight (the server is shutting down): each is
/// finished `Interrupted` by its supervisor.
pub fn interrupt_all(app: &Arc<Context>) {
    for pass in app.reconciles.all() {
        pass.interrupted.store(true, Ordering::SeqCst);
        if let Some(identity) = pass.identity() {
            process::signal_group(&identity, Signal::SIGKILL);
        }
    }
}
