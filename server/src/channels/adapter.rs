//! One Telegram profile's adapter under supervision: launch, the private
//! channel protocol, presenting pending decisions, reports, answers, and
//! restart after an exit.
//!
//! Invariants:
//! - Every adapter message passes `kernel::channel::check_header` (epoch,
//!   profile, growing sequence) before anything else reads it; a refused
//!   message changes nothing (an answer's press gets the refusal as its
//!   note).
//! - A send is reserved and moved to `applying` in a commit
//!   (`kernel::channel::present`) before the adapter is told to send it;
//!   its report is decided by `kernel::channel::report`. When the adapter
//!   exits, each of its sends still applying becomes ambiguous
//!   (`kernel::channel::on_adapter_lost`) and is never sent again without
//!   an operator's recovery.
//! - Once a presented decision is no longer pending, each delivered send
//!   is settled: the edit is reserved and moved to `applying` in a commit
//!   (`kernel::channel::settle`) before the adapter is told to edit the
//!   send's messages (`channel.settle`), and its report is decided by
//!   `kernel::channel::report` as the settlement's (a report never settles
//!   other work than its kind and profile name).
//! - An answer (a press, or the reply that gives the text of a choice that
//!   takes text) is a `decision.answer` with source `{telegram, user id}`
//!   and the key `telegram:<profile>:<event id>`, and counts only after
//!   `kernel::channel::check_identity` and, in the answer's own job,
//!   `kernel::channel::check_answer`.
//! - The adapter gets its credential on stdin at launch and an empty
//!   environment (not even the state directory's path); its stderr lines
//!   go to the server log (it never writes the token).
//! - A failed launch or an exit restarts the adapter after a backoff
//!   (0.2 s doubling to 5 s, back to 0.2 s after 10 s of running), each
//!   time with a new epoch.

use crate::channel_config::Profile;
use crate::context::Context;
use crate::context::channels::{AdapterState, ProfileStatus};
use crate::projection::run_view::to_wire;
use crate::shell;
use crate::store::blobs::{self, Blob};
use crate::store::{Commit, channels, decisions, runs};
use kernel::channel::{
    AdapterSession, ChannelRejection, ChannelWork, Header, Presented, SendOutcome, Settling,
};
use kernel::decision::{DecisionStatus, Provenance};
use kernel::ids::{EffectId, RunId};
use protocol::generated::constrained::{ChannelButtons, ChannelPollTimeout, TelegramIds};
use protocol::generated::types::{
    ChannelAdapterKind, ChannelAdapterMessage, ChannelLaunch, ChannelMessageRef,
    ChannelSendOutcome, ChannelServerMessage, DecisionAnswerPayload, DecisionChannel,
    DecisionResponse, DecisionSource, HumanDecisionRequest,
};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

/// The long-poll timeout the adapter asks the Bot API for.
const POLL_TIMEOUT_S: u64 = 20;
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const STEADY: Duration = Duration::from_secs(10);

/// Supervises `profile`'s adapter until `stop` is notified.
pub(super) async fn supervise(app: Arc<Context>, profile: Profile, stop: Arc<Notify>) {
    let mut backoff = BACKOFF_FIRST;
    loop {
        let epoch = app.channels.next_epoch(crate::clock::now_ms());
        let started = Instant::now();
        let stopped = match launch(&app, &profile, epoch).await {
            Ok((child, stdin)) => run(&app, &profile, epoch, child, stdin, &stop).await,
            Err(()) => {
                set(
                    &app,
                    &profile,
                    AdapterState::Failed,
                    Some("the adapter could not be started; check the installation"),
                );
                false
            }
        };
        lose_applying(&app, &profile.name).await;
        if stopped || app.is_stopping() {
            set(&app, &profile, AdapterState::Stopped, None);
            return;
        }
        if started.elapsed() >= STEADY {
            backoff = BACKOFF_FIRST;
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.notified() => {
                set(&app, &profile, AdapterState::Stopped, None);
                return;
            }
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn set(app: &Context, profile: &Profile, state: AdapterState, diagnostic: Option<&str>) {
    app.channels.set(
        &profile.name,
        ProfileStatus {
            state,
            diagnostic: diagnostic.map(|text| format!("profile {}: {text}", profile.name)),
            attempt_id: None,
        },
    );
}

/// Starts the adapter and writes its launch line.
async fn launch(app: &Context, profile: &Profile, epoch: u64) -> Result<(Child, ChildStdin), ()> {
    let ids = |ids: &[i64]| -> Result<TelegramIds, ()> {
        let ids = ids
            .iter()
            .map(|id| to_wire("telegramId", id.to_string()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ())?;
        TelegramIds::new(ids).map_err(|_| ())
    };
    let launch = ChannelLaunch {
        kind: "channel.launch".into(),
        epoch: to_wire("epoch", epoch).map_err(|_| ())?,
        profile: to_wire("profile", &profile.name).map_err(|_| ())?,
        api_base: to_wire("apiBase", &profile.api_base).map_err(|_| ())?,
        token: to_wire("token", &profile.token).map_err(|_| ())?,
        allowed_user_ids: ids(&profile.allowed_user_ids)?,
        allowed_chat_ids: ids(&profile.allowed_chat_ids)?,
        poll_timeout_s: ChannelPollTimeout::new(POLL_TIMEOUT_S).ok_or(())?,
    };
    let mut command = Command::new(&app.config.channel_adapter);
    // Nothing of the server's environment (the state directory above all):
    // the launch line is all the adapter gets, and a test's fault switch.
    command.env_clear();
    if let Ok(fault) = std::env::var("PI_WORKFLOWS_ADAPTER_FAULT") {
        command.env("PI_WORKFLOWS_ADAPTER_FAULT", fault);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|_| ())?;
    let mut stdin = child.stdin.take().ok_or(())?;
    let mut line = serde_json::to_string(&launch).map_err(|_| ())?;
    line.push('\n');
    stdin.write_all(line.as_bytes()).await.map_err(|_| ())?;
    if let Some(stderr) = child.stderr.take() {
        let name = profile.name.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                crate::log::line(&format!("channel {name}: {line}"));
            }
        });
    }
    Ok((child, stdin))
}

/// One adapter's life: its messages and the presenting ticks, until it
/// exits (`false`) or `stop` is notified (`true`, the adapter is killed).
async fn run(
    app: &Arc<Context>,
    profile: &Profile,
    epoch: u64,
    mut child: Child,
    mut stdin: ChildStdin,
    stop: &Notify,
) -> bool {
    let Some(stdout) = child.stdout.take() else {
        return false;
    };
    let mut lines = BufReader::new(stdout).lines();
    let mut session = AdapterSession::launched(profile.name.clone(), epoch);
    let mut ready = false;
    let mut tick = tokio::time::interval(Duration::from_millis(app.config.channel_poll_ms));
    loop {
        tokio::select! {
            () = stop.notified() => {
                let _ = child.kill().await;
                return true;
            }
            line = lines.next_line() => {
                let Ok(Some(line)) = line else { break };
                handle(app, profile, &mut session, &mut ready, &mut stdin, &line).await;
            }
            _ = tick.tick(), if ready => {
                present_pending(app, profile, &mut stdin).await;
                settle_decided(app, profile, &mut stdin).await;
            }
        }
    }
    let _ = child.wait().await;
    set(
        app,
        profile,
        AdapterState::Failed,
        Some("the adapter exited; restarting it"),
    );
    false
}

async fn send(stdin: &mut ChildStdin, message: &ChannelServerMessage) {
    if let Ok(mut line) = serde_json::to_string(message) {
        line.push('\n');
        // A closed stdin means the adapter exited: its exit is handled.
        let _ = stdin.write_all(line.as_bytes()).await;
    }
}

async fn handle(
    app: &Arc<Context>,
    profile: &Profile,
    session: &mut AdapterSession,
    ready: &mut bool,
    stdin: &mut ChildStdin,
    line: &str,
) {
    let Ok(message) = serde_json::from_str::<ChannelAdapterMessage>(line) else {
        crate::log::line(&format!(
            "channel {}: an adapter message off its schema was ignored",
            profile.name
        ));
        return;
    };
    let header = header_of(&message);
    match kernel::channel::check_header(session, &header) {
        Ok(next) => *session = next,
        Err(rejection) => {
            refuse(profile, stdin, &message, &rejection).await;
            return;
        }
    }
    match message.kind {
        ChannelAdapterKind::ChannelReady => {
            *ready = true;
            set(app, profile, AdapterState::Running, None);
        }
        ChannelAdapterKind::ChannelPresent => {
            report(app, profile, ChannelWork::Send, &header, &message).await;
        }
        ChannelAdapterKind::ChannelSettle => {
            report(app, profile, ChannelWork::Settle, &header, &message).await;
        }
        ChannelAdapterKind::ChannelAnswer => {
            let verdict = checked_answer(app, profile, &header, &message).await;
            // A press on a choice that takes text: the presser replies to
            // the decision message with it, which the adapter reports.
            let await_text = matches!(verdict, Err(Refusal::Channel(ChannelRejection::NeedsText)))
                && message.text.is_none();
            let (accepted, note) = match &verdict {
                Ok(()) => (true, "Recorded."),
                Err(refusal) => (false, refusal.note()),
            };
            reply(stdin, &header, &message, accepted, note, await_text).await;
        }
        ChannelAdapterKind::ChannelExiting => crate::log::line(&format!(
            "channel {}: the adapter is exiting: {}",
            profile.name,
            message
                .reason
                .as_ref()
                .map_or("no reason given", |reason| reason.as_str())
        )),
    }
}

/// The header fields of `message`.
fn header_of(message: &ChannelAdapterMessage) -> Header {
    Header {
        epoch: message.epoch.get(),
        profile: message.profile.as_str().to_owned(),
        sequence: message.sequence.get(),
        expected_revision: message.expected_revision.get(),
        attempt_id: message
            .attempt_id
            .as_ref()
            .map(|attempt| attempt.as_str().to_owned()),
    }
}

/// Logs a refused message; a refused press gets the refusal as its note.
async fn refuse(
    profile: &Profile,
    stdin: &mut ChildStdin,
    message: &ChannelAdapterMessage,
    rejection: &ChannelRejection,
) {
    let text = kernel::reject::Coded::message(rejection);
    crate::log::line(&format!(
        "channel {}: an adapter message was refused: {text}",
        profile.name
    ));
    if message.kind == ChannelAdapterKind::ChannelAnswer {
        reply(stdin, &header_of(message), message, false, text, false).await;
    }
}

async fn reply(
    stdin: &mut ChildStdin,
    header: &Header,
    message: &ChannelAdapterMessage,
    accepted: bool,
    note: &str,
    await_text: bool,
) {
    let (Some(attempt_id), Some(event_id)) = (header.attempt_id.as_ref(), &message.event_id) else {
        return;
    };
    let (Ok(attempt_id), Ok(expected_revision), Ok(note)) = (
        to_wire("attemptId", attempt_id),
        to_wire("expectedRevision", header.expected_revision),
        to_wire("note", note),
    ) else {
        return;
    };
    let verdict = ChannelServerMessage {
        kind: ChannelAdapterKind::ChannelAnswer,
        attempt_id,
        expected_revision,
        event_id: Some(event_id.clone()),
        accepted: Some(accepted),
        note: Some(note),
        buttons: None,
        text: None,
        messages: None,
        await_text: await_text.then_some(true),
    };
    send(stdin, &verdict).await;
}

/// Presents every pending decision of the profile's audiences that has no
/// send yet (or one reserved for its next attempt).
async fn present_pending(app: &Arc<Context>, profile: &Profile, stdin: &mut ChildStdin) {
    let effect_type = kernel::channel::send_type(&profile.name);
    let Ok(waiting) = app
        .store
        .read(move |connection| channels::awaiting_send(connection, &effect_type))
        .await
    else {
        return;
    };
    for run_id in waiting {
        present_one(app, profile, stdin, run_id).await;
    }
}

async fn present_one(app: &Arc<Context>, profile: &Profile, stdin: &mut ChildStdin, run_id: RunId) {
    let read_id = run_id.clone();
    let request = app
        .store
        .read(move |connection| match runs::load(connection, &read_id)? {
            Some(agg) => decisions::pending_request(connection, &agg),
            None => Ok(None),
        })
        .await;
    let Ok(Some(request)) = request else { return };
    if !profile
        .audiences
        .iter()
        .any(|audience| audience.as_str() == request.audience.as_str())
    {
        return;
    }
    let rendered = super::render::render(&request);
    let Some(message) = present_message(&rendered, &request) else {
        crate::log::line(&format!(
            "channel {}: a decision could not be rendered for the channel",
            profile.name
        ));
        return;
    };
    let fingerprint = crate::ids::sha256(
        serde_json::to_string(&(&rendered.text, &rendered.buttons))
            .unwrap_or_default()
            .as_bytes(),
    );
    let name = profile.name.clone();
    let presented = shell::transact(app, move |connection, now_ms| {
        let Some(before) = runs::load(connection, &run_id)? else {
            return Ok(Commit::Discard((None, Vec::new())));
        };
        let existing = match kernel::channel::send_key(&before, &name) {
            Some(key) => runs::load_effect(connection, &run_id, &key.effect_id())?,
            None => None,
        };
        match kernel::channel::present(&before, &name, fingerprint, existing.as_ref(), now_ms) {
            Ok(Presented::Send {
                transition,
                effect_id,
                attempt_number,
            }) => {
                let outputs =
                    shell::write_transition(connection, Some(&before), transition, &[], now_ms)?;
                Ok(Commit::Keep((Some((effect_id, attempt_number)), outputs)))
            }
            Ok(Presented::Settled { .. }) | Err(_) => Ok(Commit::Discard((None, Vec::new()))),
        }
    })
    .await;
    let Ok(Some((effect_id, attempt_number))) = presented else {
        return;
    };
    let attempt_id = kernel::channel::attempt_id(&effect_id, attempt_number);
    let Ok(wire_attempt) = to_wire("attemptId", &attempt_id) else {
        return;
    };
    app.channels.set(
        &profile.name,
        ProfileStatus {
            state: AdapterState::Running,
            diagnostic: None,
            attempt_id: Some(attempt_id),
        },
    );
    send(
        stdin,
        &ChannelServerMessage {
            attempt_id: wire_attempt,
            ..message
        },
    )
    .await;
}

/// The `channel.present` message of `rendered` (its attempt id is filled in
/// once the send is reserved).
fn present_message(
    rendered: &super::render::Rendered,
    request: &HumanDecisionRequest,
) -> Option<ChannelServerMessage> {
    let buttons = rendered
        .buttons
        .iter()
        .enumerate()
        .map(|(index, label)| {
            let label = if label.is_empty() {
                format!("Choice {}", index + 1)
            } else {
                label.clone()
            };
            to_wire("button", label).ok()
        })
        .collect::<Option<Vec<_>>>()?;
    Some(ChannelServerMessage {
        kind: ChannelAdapterKind::ChannelPresent,
        attempt_id: to_wire("attemptId", "pending").ok()?,
        expected_revision: to_wire("expectedRevision", request.revision.get()).ok()?,
        text: Some(to_wire("text", &rendered.text).ok()?),
        buttons: Some(ChannelButtons::new(buttons).ok()?),
        event_id: None,
        accepted: None,
        note: None,
        messages: None,
        await_text: None,
    })
}

/// A send's or a settlement's attempt report (`work`, by the message's
/// kind).
async fn report(
    app: &Arc<Context>,
    profile: &Profile,
    work: ChannelWork,
    header: &Header,
    message: &ChannelAdapterMessage,
) {
    let Some((effect_id, number)) = header
        .attempt_id
        .as_deref()
        .and_then(kernel::channel::parse_attempt_id)
    else {
        crate::log::line(&format!(
            "channel {}: a report named no attempt",
            profile.name
        ));
        return;
    };
    let outcome = match message.outcome {
        Some(ChannelSendOutcome::Delivered) => SendOutcome::Delivered,
        Some(ChannelSendOutcome::Refused) => SendOutcome::Refused {
            retryable: message.retryable == Some(true),
        },
        Some(ChannelSendOutcome::Unknown) | None => SendOutcome::Unknown,
    };
    // A send's result is where its messages landed; a settlement edits
    // those and keeps nothing of its own.
    let result = match work {
        ChannelWork::Send => {
            Blob::json(&serde_json::to_value(&message.messages).unwrap_or_default())
        }
        ChannelWork::Settle => Blob::json(&serde_json::Value::Null),
    };
    let name = profile.name.clone();
    let reported = shell::transact(app, move |connection, now_ms| {
        let Some(run_id) = channels::run_of_effect(connection, &effect_id)? else {
            return Ok(Commit::Discard((
                Err(ChannelRejection::StaleAttempt),
                Vec::new(),
            )));
        };
        let Some(before) = runs::load(connection, &run_id)? else {
            return Ok(Commit::Discard((
                Err(ChannelRejection::StaleAttempt),
                Vec::new(),
            )));
        };
        let reported = match kernel::channel::report(
            &before,
            &name,
            work,
            &effect_id,
            number,
            outcome,
            result.digest,
            now_ms,
        ) {
            Ok(reported) => reported,
            Err(rejection) => return Ok(Commit::Discard((Err(rejection), Vec::new()))),
        };
        let keeps_result = reported.transition.facts.effects.iter().any(|effect| {
            effect.effect_id == effect_id && effect.result_digest == Some(result.digest)
        });
        if keeps_result {
            blobs::put(connection, &result, blobs::JSON, now_ms)?;
        }
        let (attempt_number, attempt_state) = (reported.attempt_number, reported.attempt_state);
        let outputs =
            shell::write_transition(connection, Some(&before), reported.transition, &[], now_ms)?;
        channels::record_attempt(
            connection,
            &effect_id,
            attempt_number,
            attempt_state,
            now_ms,
        )?;
        Ok(Commit::Keep((Ok(()), outputs)))
    })
    .await;
    if let Ok(Err(rejection)) = reported {
        crate::log::line(&format!(
            "channel {}: a report was refused: {}",
            profile.name,
            kernel::reject::Coded::message(&rejection)
        ));
    }
}

/// Settles every delivered send of the profile whose decision is no longer
/// pending and has no settlement yet (or one reserved for its next
/// attempt).
async fn settle_decided(app: &Arc<Context>, profile: &Profile, stdin: &mut ChildStdin) {
    let send_type = kernel::channel::send_type(&profile.name);
    let settle_type = kernel::channel::settle_type(&profile.name);
    let Ok(decided) = app
        .store
        .read(move |connection| channels::awaiting_settle(connection, &send_type, &settle_type))
        .await
    else {
        return;
    };
    for (run_id, send_id) in decided {
        settle_one(app, profile, stdin, run_id, send_id).await;
    }
}

/// What a settlement edits and says: the send's messages, the settled text
/// and the request revision the messages showed.
struct Settlement {
    messages: Vec<ChannelMessageRef>,
    text: String,
    revision: u64,
}

/// Reads what the settlement of `send_id` edits and says.
fn settlement(
    connection: &rusqlite::Connection,
    run_id: &RunId,
    send_id: &EffectId,
) -> rusqlite::Result<Option<Settlement>> {
    let Some(send) = runs::load_effect(connection, run_id, send_id)? else {
        return Ok(None);
    };
    let messages: Vec<ChannelMessageRef> = match send.result_digest {
        Some(digest) => blobs::get(connection, &digest)?
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let node = &send.key.node_path;
    let (Some((decision, channel)), Some(request)) = (
        decisions::on_node(connection, run_id, node)?,
        decisions::request(connection, run_id, node)?,
    ) else {
        return Ok(None);
    };
    let chosen = decisions::response(connection, &decision)?
        .and_then(|value| serde_json::from_value::<DecisionResponse>(value).ok());
    let label = chosen
        .as_ref()
        .and_then(|response| {
            request
                .choices
                .as_slice()
                .iter()
                .find(|known| known.id.as_str() == response.choice.as_str())
        })
        .map_or("", |choice| choice.label.as_str());
    let outcome = match &decision.status {
        DecisionStatus::Pending => return Ok(None),
        DecisionStatus::Accepted {
            provenance: Provenance::Human,
            ..
        } => super::render::Outcome::Answered {
            label,
            // The stored source (its column admits only the wire's channels).
            channel: channel.as_deref().and_then(|text| text.parse().ok()),
        },
        DecisionStatus::Accepted {
            provenance: Provenance::Timeout,
            ..
        } => super::render::Outcome::Defaulted { label },
        DecisionStatus::Cancelled => super::render::Outcome::Cancelled,
        DecisionStatus::Expired => super::render::Outcome::Expired,
    };
    Ok(Some(Settlement {
        messages,
        text: super::render::render_settled(&request, &outcome),
        revision: request.revision.get(),
    }))
}

async fn settle_one(
    app: &Arc<Context>,
    profile: &Profile,
    stdin: &mut ChildStdin,
    run_id: RunId,
    send_id: EffectId,
) {
    let (read_run, read_send) = (run_id.clone(), send_id.clone());
    let read = app
        .store
        .read(move |connection| settlement(connection, &read_run, &read_send))
        .await;
    let Ok(Some(Settlement {
        messages,
        text,
        revision,
    })) = read
    else {
        return;
    };
    let fingerprint = crate::ids::sha256(
        serde_json::to_string(&(&text, &messages))
            .unwrap_or_default()
            .as_bytes(),
    );
    let count = messages.len();
    let name = profile.name.clone();
    let settling = shell::transact(app, move |connection, now_ms| {
        let (Some(before), Some(send)) = (
            runs::load(connection, &run_id)?,
            runs::load_effect(connection, &run_id, &send_id)?,
        ) else {
            return Ok(Commit::Discard((None, Vec::new())));
        };
        let key = kernel::channel::settle_key(&send, &name);
        let existing = runs::load_effect(connection, &run_id, &key.effect_id())?;
        match kernel::channel::settle(
            &before,
            &name,
            &send,
            count,
            fingerprint,
            existing.as_ref(),
            now_ms,
        ) {
            Ok(Settling::Edit {
                transition,
                effect_id,
                attempt_number,
            }) => {
                let outputs =
                    shell::write_transition(connection, Some(&before), transition, &[], now_ms)?;
                Ok(Commit::Keep((Some((effect_id, attempt_number)), outputs)))
            }
            Ok(Settling::NothingToEdit { transition }) => {
                let outputs =
                    shell::write_transition(connection, Some(&before), transition, &[], now_ms)?;
                Ok(Commit::Keep((None, outputs)))
            }
            Ok(Settling::Settled { .. }) | Err(_) => Ok(Commit::Discard((None, Vec::new()))),
        }
    })
    .await;
    let Ok(Some((effect_id, attempt_number))) = settling else {
        return;
    };
    let attempt_id = kernel::channel::attempt_id(&effect_id, attempt_number);
    let (Ok(wire_attempt), Ok(expected_revision), Ok(text), Ok(messages)) = (
        to_wire("attemptId", &attempt_id),
        to_wire("expectedRevision", revision),
        to_wire("text", &text),
        to_wire("messages", &messages),
    ) else {
        crate::log::line(&format!(
            "channel {}: a settlement could not be rendered for the channel",
            profile.name
        ));
        return;
    };
    send(
        stdin,
        &ChannelServerMessage {
            kind: ChannelAdapterKind::ChannelSettle,
            attempt_id: wire_attempt,
            expected_revision,
            text: Some(text),
            messages: Some(messages),
            buttons: None,
            event_id: None,
            accepted: None,
            note: None,
            await_text: None,
        },
    )
    .await;
}

/// What a press or reply that did not answer is told when the decision
/// refused it (decided already, the request changed, or the text does not
/// fit the choice).
const NOT_ACCEPTED: &str = "This did not answer the decision: it may be decided already, or the text does not fit the choice.";

enum Refusal {
    Channel(ChannelRejection),
    NotAccepted,
}

impl Refusal {
    /// The note the press (or reply) is answered with.
    fn note(&self) -> &'static str {
        match self {
            Self::Channel(rejection) => kernel::reject::Coded::message(rejection),
            Self::NotAccepted => NOT_ACCEPTED,
        }
    }
}

impl From<ChannelRejection> for Refusal {
    fn from(rejection: ChannelRejection) -> Self {
        Self::Channel(rejection)
    }
}

/// A press, or a reply with the text of a choice that takes text: who
/// answered, which attempt and choice; the answer itself.
async fn checked_answer(
    app: &Arc<Context>,
    profile: &Profile,
    header: &Header,
    message: &ChannelAdapterMessage,
) -> Result<(), Refusal> {
    let (Some(user), Some(chat), Some(index), Some(event_id)) = (
        message.user_id.as_ref(),
        message.chat_id.as_ref(),
        message.choice_index,
        message.event_id.as_ref(),
    ) else {
        return Err(ChannelRejection::StaleAttempt.into());
    };
    let parse = |id: &str| id.parse::<i64>().map_err(|_| ChannelRejection::NotAllowed);
    kernel::channel::check_identity(
        &profile.allowed_user_ids,
        &profile.allowed_chat_ids,
        parse(user.as_str())?,
        parse(chat.as_str())?,
    )?;
    let (effect_id, number) = header
        .attempt_id
        .as_deref()
        .and_then(kernel::channel::parse_attempt_id)
        .ok_or(ChannelRejection::StaleAttempt)?;
    let read_effect = effect_id.clone();
    let found = app
        .store
        .read(move |connection| {
            let Some(run_id) = channels::run_of_effect(connection, &read_effect)? else {
                return Ok(None);
            };
            let Some(agg) = runs::load(connection, &run_id)? else {
                return Ok(None);
            };
            let decision = agg.decision.clone();
            let request = decisions::pending_request(connection, &agg)?;
            Ok(decision.zip(request).map(|pair| (run_id, pair)))
        })
        .await
        .ok()
        .flatten();
    let Some((run_id, (decision, request))) = found else {
        return Err(ChannelRejection::NoPendingDecision.into());
    };
    let Some(choice) = request
        .choices
        .as_slice()
        .get(usize::from(index.get() as u8))
    else {
        return Err(ChannelRejection::StaleRevision.into());
    };
    // The text goes only into the answer, which the decision rules check
    // against the choice's input; it is never logged.
    let input = match (&choice.input, &message.text) {
        (Some(input), Some(text)) => {
            let entry = std::collections::BTreeMap::from([(input.name.to_string(), text.as_str())]);
            Some(to_wire("input", entry).map_err(|_| Refusal::NotAccepted)?)
        }
        (Some(_), None) => return Err(ChannelRejection::NeedsText.into()),
        (None, Some(_)) => return Err(Refusal::NotAccepted),
        (None, None) => None,
    };
    let payload = DecisionAnswerPayload {
        decision_id: to_wire("decisionId", decision.decision_id.as_str())
            .map_err(|_| ChannelRejection::NoPendingDecision)?,
        request_digest: request.request_digest.clone(),
        choice: choice.id.clone(),
        input,
        source: DecisionSource {
            channel: DecisionChannel::Telegram,
            actor_id: to_wire("actorId", user.as_str())
                .map_err(|_| ChannelRejection::NotAllowed)?,
        },
    };
    let name = profile.name.clone();
    let expected_revision = header.expected_revision;
    let refused = Arc::new(std::sync::Mutex::new(None));
    let refused_in_job = refused.clone();
    let check: crate::client_api::decisions::ChannelCheck =
        Box::new(move |connection, parent, stored| {
            let checked = match runs::load_effect(connection, &parent.run.run_id, &effect_id)? {
                Some(send) => kernel::channel::check_answer(
                    parent,
                    &name,
                    &send,
                    number,
                    expected_revision,
                    stored.revision.get(),
                ),
                None => Err(ChannelRejection::StaleAttempt),
            };
            if let (Err(rejection), Ok(mut slot)) = (&checked, refused_in_job.lock()) {
                *slot = Some(rejection.clone());
            }
            Ok(checked)
        });
    let accepted = crate::client_api::decisions::answer_from_channel(
        app,
        format!("channel:telegram:{}", profile.name),
        format!("telegram:{}:{}", profile.name, event_id.as_str()),
        run_id,
        payload,
        check,
    )
    .await;
    if accepted {
        return Ok(());
    }
    let rejection = refused.lock().ok().and_then(|mut slot| slot.take());
    Err(rejection.map_or(Refusal::NotAccepted, Refusal::Channel))
}

/// Each of the profile's sends and settlement edits still applying becomes
/// ambiguous.
pub(super) async fn lose_applying(app: &Arc<Context>, profile: &str) {
    let Ok(applying) = app.store.read(channels::applying_sends).await else {
        return;
    };
    let mut runs: Vec<RunId> = applying
        .into_iter()
        .filter(|(_, found)| kernel::channel::profile_of(found) == Some(profile))
        .map(|(run_id, _)| run_id)
        .collect();
    runs.dedup();
    for run_id in runs {
        lose(app, run_id, profile.to_owned()).await;
    }
}

/// `run_id`'s sends and settlement edits of `profile` still applying
/// become ambiguous.
pub(super) async fn lose(app: &Arc<Context>, run_id: RunId, profile: String) {
    let lost = shell::transact(app, move |connection, now_ms| {
        let Some(before) = runs::load(connection, &run_id)? else {
            return Ok(Commit::Discard(((), Vec::new())));
        };
        match kernel::channel::on_adapter_lost(&before, &profile, now_ms) {
            Some(transition) => {
                let outputs =
                    shell::write_transition(connection, Some(&before), transition, &[], now_ms)?;
                Ok(Commit::Keep(((), outputs)))
            }
            None => Ok(Commit::Discard(((), Vec::new()))),
        }
    })
    .await;
    if lost.is_err() {
        crate::log::line("channel: an interrupted send could not be marked ambiguous");
    }
}
