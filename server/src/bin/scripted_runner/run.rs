//! Run mode: verify the source, apply `startup`, then run the nodes the
//! server names until it says to exit.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::iter;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use protocol::WorkerLaunch;
use protocol::canonicalize;
use protocol::generated::types::{
    ApplyingState, EffectAdoption, EffectReservation, EffectState, NodeFailureOutcome, NodeUpdate,
    ReplyOutcome, SettleState, SourceIdentity, StartDeadline, TimeoutSpec, Topology,
    WorkflowSource,
};
use serde_json::{Value, json};

use base64::Engine as _;

use crate::channel::{Channel, Next, ReadAnswer, Reply};
use crate::script::{
    Action, Behaviour, DecideSpec, ProtocolViolation, Script, Startup, Tamper, default_output,
};
use crate::{EXIT_CRASH, EXIT_PROTOCOL, log, sha256_digest};

/// The engine's default node deadline (kernel `DEFAULT_NODE_TIMEOUT_MS`).
const DEFAULT_NODE_TIMEOUT_MS: u64 = 15 * 60 * 1_000;

pub(crate) fn run(launch: &WorkerLaunch, mut channel: Channel) -> ! {
    let Some(source) = &launch.workflow_source else {
        log!("run mode without `workflowSource`");
        std::process::exit(EXIT_PROTOCOL);
    };
    let (path, bytes) = match verify(source) {
        Ok(verified) => verified,
        Err(why) => {
            log!("source changed ({why}); parking");
            channel.send("run.parked", json!({"reason": "workflowSourceChanged"}));
            std::process::exit(0);
        }
    };
    let script = Script::parse(&bytes).unwrap_or_else(|e| {
        log!("script: {e}");
        fatal(&mut channel, "the workflow script does not parse")
    });
    let topology: Topology = serde_json::from_value(script.topology.clone()).unwrap_or_else(|e| {
        log!("topology: {e}");
        fatal(&mut channel, "the script's topology is not a topology")
    });
    let base = path.parent().unwrap_or(Path::new("/")).to_path_buf();
    apply_startup(&script.startup, &mut channel);
    let ready = channel.send("runner.ready", json!({"sourceVerified": true}));
    if let Some(code) = script.startup.exit_after_ready {
        log!("exitAfterReady: exiting with {code}");
        std::process::exit(code);
    }
    let mut next = channel.await_dispatch(&ready.id);
    if let (Some(path), Some(state)) = (&script.startup.record_state, &channel.state) {
        let path = base.join(path);
        let bytes = canonicalize(state).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, &bytes) {
            log!("cannot write {}: {e}", path.display());
            std::process::exit(EXIT_PROTOCOL);
        }
        log!("recorded the run state ({} bytes)", bytes.len());
    }
    loop {
        next = match next {
            Next::Exit(reason) => {
                channel.send("runner.exiting", json!({"reason": reason}));
                log!("exiting ({reason})");
                std::process::exit(0);
            }
            Next::Run {
                node_id,
                attempt_id,
                visit,
                deadline,
            } => {
                let mut attempt = Attempt {
                    node_id,
                    attempt_id,
                    visit,
                    deadline,
                    base: base.clone(),
                    receipt: None,
                };
                run_node(&mut channel, &script, &topology, &mut attempt)
            }
        };
    }
}

/// Re-hashes every file of the saved source identity; returns the root
/// script's path and bytes.
pub(crate) fn verify(source: &WorkflowSource) -> Result<(PathBuf, Vec<u8>), String> {
    let mut root = None;
    for identity in iter::once(&source.root).chain(&source.mounted) {
        let SourceIdentity::File { hash, path } = identity else {
            return Err("builtin sources are not scripted".to_string());
        };
        let bytes = std::fs::read(path.as_str()).map_err(|e| format!("{}: {e}", path.as_str()))?;
        if sha256_digest(&bytes) != hash.as_str() {
            return Err(format!("{}: hash differs", path.as_str()));
        }
        root.get_or_insert((PathBuf::from(path.as_str()), bytes));
    }
    root.ok_or_else(|| "no root source".to_string())
}

/// A runner-level failure after the source was verified: `run.finished`
/// and exit 2.
fn fatal(channel: &mut Channel, message: &str) -> ! {
    channel.send(
        "run.finished",
        json!({"outcome": "failed", "error": {"code": "internal", "message": message}}),
    );
    std::process::exit(EXIT_PROTOCOL);
}

fn apply_startup(startup: &Startup, channel: &mut Channel) {
    channel.keep_writing_after_claim_lost = startup.keep_writing_after_claim_lost;
    if startup.ignore_sigterm {
        ignore_sigterm();
    }
    if let Some(code) = startup.exit_before_ready {
        log!("exitBeforeReady: exiting with {code}");
        std::process::exit(code);
    }
    if let Some(message) = &startup.fail_before_ready {
        log!("failBeforeReady: run.finished failed");
        let _ = channel.request(
            "run.finished",
            json!({"outcome": "failed", "failureClass": "sourceChanged",
                   "error": {"code": "sourceChanged", "message": message}}),
        );
        std::process::exit(0);
    }
    if startup.ready_delay_ms > 0 {
        log!("waiting {} ms before runner.ready", startup.ready_delay_ms);
        thread::sleep(Duration::from_millis(startup.ready_delay_ms));
    }
}

/// Makes SIGTERM do nothing but log `SIGTERM received and ignored`
/// (SIGKILL still kills).
pub(crate) fn ignore_sigterm() {
    let received = Arc::new(AtomicBool::new(false));
    if let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&received))
    {
        log!("cannot ignore SIGTERM: {e}");
        std::process::exit(EXIT_PROTOCOL);
    }
    log!("ignoring SIGTERM");
    thread::spawn(move || {
        loop {
            thread::sleep(Duration::from_millis(20));
            if received.swap(false, Ordering::Relaxed) {
                log!("SIGTERM received and ignored");
            }
        }
    });
}

/// The attempt being run.
#[derive(Debug)]
struct Attempt {
    node_id: String,
    attempt_id: String,
    visit: u64,
    /// The deadline the dispatch carried (`None`: this runner resolves it).
    deadline: Option<StartDeadline>,
    /// The script's directory: relative paths are resolved against it.
    base: PathBuf,
    /// The effect receipt the final message carries (`"receipt": true`).
    receipt: Option<Value>,
}

/// How an attempt ends.
#[derive(Debug)]
enum End {
    Finished(Value),
    Failed {
        outcome: NodeFailureOutcome,
        error: Value,
    },
    /// The server settled the attempt itself (`interaction.requested` handed
    /// it to the origin session, or `notification.requested` recorded its
    /// result); the runner follows the reply's `next`.
    Handed(Next),
}

fn run_node(
    channel: &mut Channel,
    script: &Script,
    topology: &Topology,
    attempt: &mut Attempt,
) -> Next {
    channel.attempt_id = Some(attempt.attempt_id.clone());
    let behaviour = script.behaviour(&attempt.node_id, attempt.visit);
    log!(
        "running node {} visit {} ({})",
        attempt.node_id,
        attempt.visit,
        attempt.attempt_id
    );
    match &attempt.deadline {
        // The server committed the deadline with the dispatch and enforces
        // it with its deadline wake: nothing to report.
        Some(StartDeadline::Committed { deadline_at_ms }) => match deadline_at_ms {
            Some(at_ms) => log!("deadline committed at {at_ms}"),
            None => log!("no deadline (committed)"),
        },
        Some(StartDeadline::RunnerResolves) | None => {
            let mut started = json!({"attemptId": attempt.attempt_id});
            if let Some(deadline) = deadline_at(topology, &attempt.node_id, &behaviour) {
                started["deadlineAtMs"] = json!(deadline);
            }
            channel.send("node.started", started);
        }
    }
    let (kind, mut fields) = match perform(channel, &behaviour, attempt) {
        End::Finished(output) => (
            "node.finished",
            json!({"attemptId": attempt.attempt_id, "output": output}),
        ),
        End::Failed { outcome, error } => (
            "node.failed",
            json!({"attemptId": attempt.attempt_id, "outcome": outcome, "error": error}),
        ),
        End::Handed(next) => return next,
    };
    if let Some(receipt) = attempt.receipt.take() {
        fields["action"] = receipt;
    }
    let reply = channel.request(kind, fields);
    Channel::next_after(reply)
}

/// The sealed human-decision request of `spec` for this attempt.
fn decision_request(
    channel: &Channel,
    attempt: &Attempt,
    spec: &DecideSpec,
) -> Result<Value, String> {
    use protocol::generated::constrained::{DecisionChoices, DecisionRevision, PresentationBlocks};
    use protocol::generated::types::{DecisionPresentation, HumanDecisionRequestSchemaId};
    use server::wire::decision::{RequestBasis, expiry_text, seal};
    let run_id = channel.run_id().ok_or("the launch has no run id")?;
    let basis = RequestBasis {
        schema: HumanDecisionRequestSchemaId::PiWorkflowsHumanDecisionRequestV1,
        run_id: text("runId", run_id)?,
        node_id: text("nodeId", &attempt.node_id)?,
        attempt_id: match spec.tamper {
            Some(Tamper::Binding) => text("attemptId", "another-attempt")?,
            _ => text("attemptId", &attempt.attempt_id)?,
        },
        audience: text("audience", "operators")?,
        title: text("title", &spec.title)?,
        subject: spec.subject.clone(),
        presentation: DecisionPresentation {
            summary: text("summary", spec.summary.as_deref().unwrap_or(&spec.title))?,
            blocks: PresentationBlocks::new(spec.blocks.clone()).map_err(|e| e.to_string())?,
        },
        choices: DecisionChoices::new(spec.choices.clone()).map_err(|e| e.to_string())?,
        revision: DecisionRevision::new(1).ok_or("revision")?,
        expires_at: spec
            .expires_in_ms
            .map(|ms| expiry_text(now_ms().saturating_add(ms)).ok_or("decide.expiresInMs"))
            .transpose()?,
        default_response: spec.default_response.clone(),
    };
    let mut request = seal(basis);
    if spec.tamper == Some(Tamper::Seal) {
        request.title = text("title", "changed after sealing")?;
    }
    serde_json::to_value(&request).map_err(|error| error.to_string())
}

/// A generated string type from `value`, or which field did not fit.
fn text<'a, T: TryFrom<&'a str>>(field: &str, value: &'a str) -> Result<T, String> {
    T::try_from(value).map_err(|_| format!("decide.{field}"))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The resolved deadline `node.started` reports.
fn deadline_at(topology: &Topology, node_id: &str, behaviour: &Behaviour) -> Option<u64> {
    let node = topology
        .nodes
        .iter()
        .find(|node| node.id.as_str() == node_id);
    let ms = match node.map(|node| &node.timeout) {
        Some(TimeoutSpec::Ms(ms)) => Some(ms.get()),
        Some(TimeoutSpec::Default) => Some(DEFAULT_NODE_TIMEOUT_MS),
        Some(TimeoutSpec::None) => None,
        Some(TimeoutSpec::Dynamic) => behaviour.dynamic_timeout_ms(),
        None => {
            log!("node {node_id} is not in the topology; no deadline");
            None
        }
    };
    ms.map(|ms| now_ms().saturating_add(ms))
}

fn safe_error(code: &str, message: &str) -> Value {
    json!({"code": code, "message": message})
}

/// The error a refused reply carries, or a fallback.
fn reply_error(reply: &Reply, fallback: &str) -> Value {
    reply
        .error
        .as_ref()
        .map_or_else(|| safe_error("conflict", fallback), |error| json!(error))
}

fn perform(channel: &mut Channel, behaviour: &Behaviour, attempt: &mut Attempt) -> End {
    match &behaviour.action {
        Action::Finish(output) => End::Finished(
            output
                .clone()
                .unwrap_or_else(|| default_output(&attempt.node_id, attempt.visit)),
        ),
        Action::Fail { message, outcome } => {
            let code = match outcome {
                NodeFailureOutcome::Failed => "nodeFailed",
                NodeFailureOutcome::TimedOut => "timedOut",
                NodeFailureOutcome::Cancelled => "cancelled",
            };
            End::Failed {
                outcome: *outcome,
                error: json!({"code": code, "message": message}),
            }
        }
        Action::Sleep { ms, then } => {
            log!("sleeping {ms} ms");
            thread::sleep(Duration::from_millis(*ms));
            perform(channel, then, attempt)
        }
        Action::Stall => {
            log!("stalling until killed");
            loop {
                thread::park();
            }
        }
        Action::AwaitFile { path, then } => {
            let path = attempt.base.join(path);
            log!("waiting for {}", path.display());
            while !path.exists() {
                thread::sleep(Duration::from_millis(20));
            }
            perform(channel, then, attempt)
        }
        Action::IfFile {
            path,
            then,
            otherwise,
        } => {
            let path = attempt.base.join(path);
            if path.exists() {
                log!("{} exists", path.display());
                perform(channel, then, attempt)
            } else {
                log!("{} does not exist", path.display());
                perform(channel, otherwise, attempt)
            }
        }
        Action::Exit(code) => {
            log!("exiting with {code} mid-node");
            std::process::exit(*code);
        }
        Action::CrashOnce { marker, then } => {
            let marker = attempt.base.join(marker);
            if marker.exists() {
                log!("crashOnce marker exists; going on");
                return perform(channel, then, attempt);
            }
            if let Err(e) = std::fs::write(&marker, b"") {
                log!("cannot create {}: {e}", marker.display());
                std::process::exit(EXIT_PROTOCOL);
            }
            log!("crashOnce: marker created; crashing");
            std::process::exit(EXIT_CRASH);
        }
        Action::Update {
            update,
            idempotency_key,
            then,
        } => {
            let key = idempotency_key
                .clone()
                .unwrap_or_else(|| default_update_key(&attempt.attempt_id, update));
            channel.request(
                "node.update",
                json!({"attemptId": attempt.attempt_id, "update": update, "idempotencyKey": key}),
            );
            perform(channel, then, attempt)
        }
        Action::Effect {
            effect,
            crash_while_applying,
            then,
        } => {
            let request = canonicalize(&effect.request).unwrap_or_else(|e| {
                log!("effect request: {e}");
                std::process::exit(EXIT_PROTOCOL);
            });
            let reply = channel.request(
                "effect.reserve",
                json!({
                    "attemptId": attempt.attempt_id,
                    "effectType": effect.effect_type,
                    "requestDigest": sha256_digest(&request),
                }),
            );
            if reply.outcome == ReplyOutcome::Rejected {
                return End::Failed {
                    outcome: NodeFailureOutcome::Failed,
                    error: reply_error(&reply, "the effect reservation was refused"),
                };
            }
            let reservation = Reservation::of(&reply.result);
            let id = reservation.effect_id();
            let result = match reservation {
                Reservation::Adopt(EffectAdoption {
                    state: SettleState::Applied,
                    result,
                    ..
                }) => {
                    log!("effect {id} is already applied; not applying it again");
                    result
                }
                Reservation::Adopt(EffectAdoption {
                    state: SettleState::Rejected,
                    ..
                }) => {
                    log!("effect {id} is rejected; failing the node");
                    return End::Failed {
                        outcome: NodeFailureOutcome::Failed,
                        error: safe_error("conflict", "the effect cannot be applied"),
                    };
                }
                Reservation::Apply(EffectReservation {
                    attempt_number,
                    state: ApplyingState::Applying,
                    ..
                }) => {
                    let attempt_number = attempt_number.get();
                    if let Some(apply_log) = &effect.apply_log {
                        append_line(
                            &attempt.base.join(apply_log),
                            &format!("{id} {attempt_number}"),
                        );
                    }
                    if effect.apply_ms > 0 {
                        log!("applying effect {id} takes {} ms", effect.apply_ms);
                        thread::sleep(Duration::from_millis(effect.apply_ms));
                    }
                    log!("applied effect {id} (attempt {attempt_number})");
                    if *crash_while_applying || effect.crash_on_attempt == Some(attempt_number) {
                        log!("crashWhileApplying: crashing before effect.settle");
                        std::process::exit(EXIT_CRASH);
                    }
                    let result = match effect.pad_settle_frame_to {
                        Some(bytes) => channel.padded_settle_result(&id, bytes),
                        None => effect
                            .result
                            .clone()
                            .unwrap_or_else(|| json!({"applied": true})),
                    };
                    let settled = channel.request(
                        "effect.settle",
                        json!({"effectId": id, "state": "applied", "result": result}),
                    );
                    if settled.outcome == ReplyOutcome::Rejected {
                        return End::Failed {
                            outcome: NodeFailureOutcome::Failed,
                            error: reply_error(&settled, "the effect settlement was refused"),
                        };
                    }
                    result
                }
            };
            if effect.receipt {
                attempt.receipt =
                    Some(json!({"effectId": id, "state": EffectState::Applied, "result": result}));
            }
            perform(channel, then, attempt)
        }
        Action::SpawnChild { spawn, then } => {
            let mut command = Command::new("sleep");
            command
                .arg(spawn.sleep_seconds.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if spawn.new_group {
                command.process_group(0);
            }
            let pid = match command.spawn() {
                // The child is deliberately never waited for: reaping (and
                // killing) registered children is the server's job.
                Ok(child) => child.id(),
                Err(e) => {
                    log!("cannot spawn sleep: {e}");
                    std::process::exit(EXIT_PROTOCOL);
                }
            };
            let Some(identity) = server::process::identity(pid) else {
                log!("child {pid} has no /proc entry");
                std::process::exit(EXIT_PROTOCOL);
            };
            log!(
                "spawned sleep {} as {pid}{}",
                spawn.sleep_seconds,
                if spawn.new_group {
                    " in a new group"
                } else {
                    ""
                }
            );
            channel.request(
                "runner.progress",
                json!({"operation": "process.register", "pid": pid, "startIdentity": identity.encode()}),
            );
            perform(channel, then, attempt)
        }
        Action::Stderr { bytes, then } => {
            write_stderr(*bytes);
            perform(channel, then, attempt)
        }
        Action::Duplicate(then) => {
            channel.duplicate_next = true;
            perform(channel, then, attempt)
        }
        Action::Interact(spec) => {
            let reply = channel.request(
                "interaction.requested",
                json!({
                    "attemptId": attempt.attempt_id,
                    "kind": spec.kind,
                    "prompt": {"kind": "inline", "text": spec.prompt},
                    "contract": spec.contract,
                }),
            );
            if reply.outcome == ReplyOutcome::Accepted
                && reply.next.is_none()
                && let Some(headless) = &spec.headless
            {
                log!("the headless request is open; going on");
                return perform(channel, headless, attempt);
            }
            if reply.outcome == ReplyOutcome::Rejected || reply.next.is_none() {
                return End::Failed {
                    outcome: NodeFailureOutcome::Failed,
                    error: reply_error(&reply, "the interactive request was refused"),
                };
            }
            End::Handed(Channel::next_after(reply))
        }
        Action::Notify(spec) => {
            let reply = channel.request(
                "notification.requested",
                json!({
                    "attemptId": attempt.attempt_id,
                    "kind": spec.kind,
                    "content": {"kind": "inline", "text": spec.text},
                }),
            );
            if reply.outcome == ReplyOutcome::Rejected || reply.next.is_none() {
                return End::Failed {
                    outcome: NodeFailureOutcome::Failed,
                    error: reply_error(&reply, "the notification was refused"),
                };
            }
            End::Handed(Channel::next_after(reply))
        }
        Action::Decide(spec) => match decision_request(channel, attempt, spec) {
            Ok(request) => End::Finished(request),
            Err(problem) => End::Failed {
                outcome: NodeFailureOutcome::Failed,
                error: safe_error("nodeFailed", &problem),
            },
        },
        Action::ProtocolViolation(violation) => {
            let finished = json!({"attemptId": attempt.attempt_id, "output": {"violating": true}});
            match violation {
                ProtocolViolation::Schema => {
                    channel.send_raw(br#"{"note":"not a runner message","type":"node.finished"}"#)
                }
                ProtocolViolation::Revision => {
                    let mut fields = finished;
                    fields["expectedRevision"] = json!(9_007_199_254_740_991_u64);
                    channel.request("node.finished", fields);
                }
                ProtocolViolation::Attempt => {
                    let mut fields = finished;
                    fields["attemptId"] = json!("an-attempt-never-dispatched");
                    channel.request("node.finished", fields);
                }
                ProtocolViolation::Idempotency => {
                    let update = |n: u64| {
                        json!({"attemptId": attempt.attempt_id, "idempotencyKey": format!("u-{n}"),
                               "update": {"type": "progress", "key": "k", "data": {"n": n}}})
                    };
                    let id = channel.fresh_id();
                    channel.request_with_id("node.update", update(1), id.clone());
                    channel.request_with_id("node.update", update(2), id);
                }
            }
            log!("sent a message that fails the {violation:?} check; waiting to be stopped");
            loop {
                thread::park();
            }
        }
        Action::ContentRead { read, then } => {
            let answer = channel.read(json!({
                "reference": read.reference,
                "offset": read.offset,
                "length": read.length,
            }));
            let line = match answer {
                ReadAnswer::Chunk(chunk) => json!({
                    "type": "content.chunk",
                    "offset": chunk.offset,
                    "reference": chunk.reference,
                    "bytes": base64::engine::general_purpose::STANDARD
                        .decode(&chunk.data)
                        .map_or(0, |bytes| bytes.len()),
                    "final": chunk.last,
                }),
                ReadAnswer::Refused(reply) => json!({
                    "type": "reply",
                    "outcome": reply.outcome,
                    "error": reply.error,
                }),
            };
            append_line(&attempt.base.join(&read.record), &line.to_string());
            perform(channel, then, attempt)
        }
    }
}

/// The `effect.reserve` reply's `result`: one of the two types its
/// `x-replyResult` names (an adoption carries `result`, a reservation does
/// not, and neither takes the other's fields, so at most one reads).
#[derive(Debug)]
enum Reservation {
    Apply(EffectReservation),
    Adopt(EffectAdoption),
}

impl Reservation {
    /// Reads the result; anything else is a protocol error of the server.
    fn of(result: &Value) -> Self {
        if let Ok(adoption) = serde_json::from_value(result.clone()) {
            return Self::Adopt(adoption);
        }
        serde_json::from_value(result.clone())
            .map(Self::Apply)
            .unwrap_or_else(|e| {
                log!("effect.reserve result is neither an EffectReservation nor an EffectAdoption: {e}");
                std::process::exit(EXIT_PROTOCOL);
            })
    }

    fn effect_id(&self) -> String {
        match self {
            Self::Apply(reservation) => reservation.effect_id.to_string(),
            Self::Adopt(adoption) => adoption.effect_id.to_string(),
        }
    }
}

/// Appends one line to the apply log (tests count real applications).
fn append_line(path: &Path, line: &str) {
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        log!("cannot append to {}: {e}", path.display());
        std::process::exit(EXIT_PROTOCOL);
    }
}

/// A default `idempotencyKey`: stable for one attempt and update, new for
/// another attempt.
fn default_update_key(attempt_id: &str, update: &NodeUpdate) -> String {
    let update = canonicalize(&json!(update)).unwrap_or_default();
    let mut bytes = attempt_id.as_bytes().to_vec();
    bytes.push(b'\n');
    bytes.extend_from_slice(&update);
    let digest = sha256_digest(&bytes);
    let hex = digest.trim_start_matches("sha256:");
    format!("u-{}", &hex[..16])
}

/// Writes `bytes` bytes of numbered 100-byte lines (`stderr line 00000042 xxx…`)
/// to stderr; the last line may be shorter. A closed stderr ends the writing.
fn write_stderr(bytes: u64) {
    use std::io::Write as _;
    log!("writing {bytes} bytes to stderr");
    let mut stderr = std::io::stderr().lock();
    let mut written = 0u64;
    let mut line_number = 0u64;
    while written < bytes {
        let mut line = format!("stderr line {line_number:08} ").into_bytes();
        line.resize(99, b'x');
        line.push(b'\n');
        let take = usize::try_from((bytes - written).min(100)).unwrap_or(100);
        if stderr.write_all(&line[..take]).is_err() {
            return;
        }
        written += take as u64;
        line_number += 1;
    }
    let _ = stderr.flush();
}
