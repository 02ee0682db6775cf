//! The script: its JSON shape, parsing, and behaviour selection by visit.
//!
//! Parsing is strict (unknown fields are errors, a behaviour names exactly
//! one action) so a typo in a test script fails loudly at resolve time
//! (`compileFailed`) instead of silently running the default behaviour.

use std::collections::BTreeMap;
use std::path::PathBuf;

use protocol::generated::types::{NodeFailureOutcome, NodeUpdate, SafeMessage};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::{Value, json};

/// A whole script file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Script {
    /// `resolve.result.workflowName`; the file stem when absent.
    #[serde(default)]
    pub(crate) workflow_name: Option<String>,
    /// `resolve.result.title`, omitted when absent.
    #[serde(default)]
    pub(crate) title: Option<String>,
    /// Free text for the reader of the script; ignored.
    #[serde(default, rename = "comment")]
    _comment: Option<IgnoredAny>,
    /// The kernel topology, passed through to `resolve.result`.
    pub(crate) topology: Value,
    /// Resolve mode answers `resolve.failed {code: invalidInput}`.
    #[serde(default)]
    pub(crate) reject_input: bool,
    /// Resolve mode waits this long before it answers (a slow resolution).
    #[serde(default)]
    pub(crate) resolve_delay_ms: u64,
    /// Resolve mode exits after its `resolve.result` instead of awaiting the
    /// run (a runner that does not offer `awaitsRun`).
    #[serde(default)]
    pub(crate) resolve_only: bool,
    /// What happens before (and instead of) the first node.
    #[serde(default)]
    pub(crate) startup: Startup,
    /// Behaviours per node id, indexed by `visit - 1` (the last repeats).
    #[serde(default)]
    pub(crate) nodes: BTreeMap<String, Vec<Behaviour>>,
    /// Validate mode: the verdict on a submission (none: validate mode
    /// logs and exits 2 without a verdict).
    #[serde(default)]
    pub(crate) validate: Option<ValidateSpec>,
}

/// What a validate-mode child does with the submission it is given.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ValidateSpec {
    /// Reject the submission with this message (none: accept it).
    #[serde(default)]
    pub(crate) reject: Option<String>,
    /// Wait this long after the `validate` command before the verdict.
    #[serde(default)]
    pub(crate) delay_ms: u64,
    /// SIGTERM does nothing (SIGKILL still kills).
    #[serde(default)]
    pub(crate) ignore_sigterm: bool,
    /// Append `started <submissionId> <pid>` when the command arrives and
    /// `verdict <submissionId> <pid>` before the verdict is sent (relative
    /// to the script's directory).
    #[serde(default)]
    pub(crate) record: Option<PathBuf>,
}

/// Run-mode options applied after the source is verified.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Startup {
    /// Exit with this code before `runner.ready`.
    #[serde(default)]
    pub(crate) exit_before_ready: Option<i32>,
    /// Before `runner.ready`, report `run.finished` failed with this message
    /// (failure class `sourceChanged`, as a runner whose workflow no longer
    /// loads does), then exit 0.
    #[serde(default)]
    pub(crate) fail_before_ready: Option<String>,
    /// Wait this long before `runner.ready`.
    #[serde(default)]
    pub(crate) ready_delay_ms: u64,
    /// Exit with this code right after `runner.ready`.
    #[serde(default)]
    pub(crate) exit_after_ready: Option<i32>,
    /// SIGTERM does nothing (SIGKILL still kills).
    #[serde(default)]
    pub(crate) ignore_sigterm: bool,
    /// After a `claimLost` reply, keep writing `node.update` messages.
    #[serde(default)]
    pub(crate) keep_writing_after_claim_lost: bool,
    /// Write the run state of the command (canonical JSON) to this file.
    #[serde(default)]
    pub(crate) record_state: Option<PathBuf>,
}

/// One behaviour of a node visit: an action plus an optional dynamic
/// timeout.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(try_from = "RawBehaviour")]
pub(crate) struct Behaviour {
    pub(crate) action: Action,
    /// The deadline a `dynamic` node resolves (`timeoutMs` on any behaviour
    /// of the chain; the outermost wins).
    pub(crate) timeout_ms: Option<u64>,
}

/// What a behaviour does after `node.started`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    /// `node.finished` with this output (`None`: the default output).
    Finish(Option<Value>),
    /// `node.failed`.
    Fail {
        message: SafeMessage,
        outcome: NodeFailureOutcome,
    },
    /// Sleep, then `then`.
    Sleep { ms: u64, then: Box<Behaviour> },
    /// Block until killed.
    Stall,
    /// Wait until this file exists, then `then`.
    AwaitFile { path: PathBuf, then: Box<Behaviour> },
    /// `then` when this file exists, `otherwise` when it does not.
    IfFile {
        path: PathBuf,
        then: Box<Behaviour>,
        otherwise: Box<Behaviour>,
    },
    /// Exit with this code at once.
    Exit(i32),
    /// Exit 3 the first time (creating the marker), `then` afterwards.
    CrashOnce {
        marker: PathBuf,
        then: Box<Behaviour>,
    },
    /// `node.update`, its reply, then `then`.
    Update {
        update: NodeUpdate,
        idempotency_key: Option<String>,
        then: Box<Behaviour>,
    },
    /// `effect.reserve`, apply, `effect.settle`, then `then`.
    Effect {
        effect: EffectSpec,
        crash_while_applying: bool,
        then: Box<Behaviour>,
    },
    /// Start `sleep N`, register it with `runner.progress`, then `then`.
    SpawnChild {
        spawn: SpawnSpec,
        then: Box<Behaviour>,
    },
    /// Send the next message of `then` twice with one message id.
    Duplicate(Box<Behaviour>),
    /// Write this many bytes of numbered lines to stderr, then `then`.
    Stderr { bytes: u64, then: Box<Behaviour> },
    /// `interaction.requested`; the attempt then waits in the origin
    /// session and the runner follows the reply's `next` (an exit).
    Interact(InteractSpec),
    /// `notification.requested`; the server records the node's result and
    /// the runner follows the reply's `next`.
    Notify(NotifySpec),
    /// `node.finished` with a sealed human-decision request (a
    /// `humanDecision` checkpoint).
    Decide(Box<DecideSpec>),
    /// A message that fails one protocol check, then block until killed.
    ProtocolViolation(ProtocolViolation),
    /// `content.read`, its answer appended to a record file, then `then`.
    ContentRead {
        read: ContentReadSpec,
        then: Box<Behaviour>,
    },
}

/// Which protocol check the runner's message fails.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) enum ProtocolViolation {
    /// A frame that is canonical JSON but not a runner message.
    Schema,
    /// `node.finished` with an `expectedRevision` the run is not at.
    Revision,
    /// `node.finished` for an attempt the server did not dispatch.
    Attempt,
    /// A `node.update`, then another payload under its message id.
    Idempotency,
}

/// A notification of a notify node.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct NotifySpec {
    /// The notification text (sent inline).
    pub(crate) text: String,
    /// `progress` or `final` (default `progress`).
    #[serde(default = "default_notification_kind")]
    pub(crate) kind: String,
}

fn default_notification_kind() -> String {
    "progress".to_owned()
}

/// The human-decision request a `humanDecision` checkpoint finishes with:
/// its fields, sealed by `server::wire::decision::seal` for the attempt.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct DecideSpec {
    pub(crate) title: String,
    /// The presentation summary (default: the title).
    #[serde(default)]
    pub(crate) summary: Option<String>,
    /// The presentation blocks (default none).
    #[serde(default)]
    pub(crate) blocks: Vec<protocol::generated::types::PresentationBlock>,
    pub(crate) choices: Vec<protocol::generated::types::DecisionChoice>,
    #[serde(default)]
    pub(crate) subject: Option<protocol::generated::types::DecisionSubject>,
    /// `expiresAt` this long after the node runs.
    #[serde(default)]
    pub(crate) expires_in_ms: Option<u64>,
    /// The `onTimeout` default.
    #[serde(default)]
    pub(crate) default_response: Option<protocol::generated::types::DecisionResponse>,
    /// Break the request after sealing: `seal` (a field changed) or
    /// `binding` (another attempt named, sealed).
    #[serde(default)]
    pub(crate) tamper: Option<Tamper>,
}

/// How a scripted request is broken.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) enum Tamper {
    Seal,
    Binding,
}

/// One `content.read` and where its answer is recorded.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ContentReadSpec {
    /// The reference to read.
    pub(crate) reference: Value,
    #[serde(default)]
    pub(crate) offset: u64,
    #[serde(default = "default_read_length")]
    pub(crate) length: u64,
    /// Each answer is appended here as one JSON line: `{type, outcome?,
    /// error?, offset?, bytes?, final?}`.
    pub(crate) record: PathBuf,
}

const fn default_read_length() -> u64 {
    512 * 1024
}

/// An interactive request of the attempt.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct InteractSpec {
    /// `agent`, `checkpoint`, `decision` or `visibleResponse` (default `agent`).
    #[serde(default = "default_interaction_kind")]
    pub(crate) kind: String,
    /// The prompt text (sent inline).
    pub(crate) prompt: String,
    /// The output contract (any JSON; default `{}`).
    #[serde(default = "empty_object")]
    pub(crate) contract: Value,
    /// A headless run: its accepted reply carries no `next` (the attempt
    /// stays active under this runner's claim while its Pi works), and the
    /// attempt goes on with this behaviour (without it, such a reply fails
    /// the node).
    #[serde(default)]
    pub(crate) headless: Option<Box<Behaviour>>,
}

fn default_interaction_kind() -> String {
    "agent".to_owned()
}

fn empty_object() -> Value {
    json!({})
}

/// A managed effect to reserve, apply and settle.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct EffectSpec {
    /// `effect.reserve.effectType`.
    #[serde(rename = "type")]
    pub(crate) effect_type: String,
    /// The request; its canonical JSON digest is `requestDigest`.
    #[serde(default)]
    pub(crate) request: Value,
    /// Each real application appends `<effectId> <attemptNumber>\n` here.
    #[serde(default)]
    pub(crate) apply_log: Option<PathBuf>,
    /// `effect.settle.result` (default `{"applied":true}`).
    #[serde(default)]
    pub(crate) result: Option<Value>,
    /// Attach `action: {effectId, state, result}` to the attempt's
    /// `node.finished`/`node.failed`.
    #[serde(default)]
    pub(crate) receipt: bool,
    /// How long applying takes: the wait after the apply-log line, before
    /// `effect.settle` (or the `crashWhileApplying` exit).
    #[serde(default)]
    pub(crate) apply_ms: u64,
    /// Settle with `result: {"pad": "x…"}` sized so that the encoded
    /// `effect.settle` frame is exactly this many bytes (instead of `result`).
    #[serde(default)]
    pub(crate) pad_settle_frame_to: Option<usize>,
    /// Crash while applying only this attempt number of the effect (as
    /// `crashWhileApplying` does for every attempt): an ambiguous first
    /// attempt whose explicit retry then applies.
    #[serde(default)]
    pub(crate) crash_on_attempt: Option<u64>,
}

/// A child process to start and register.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SpawnSpec {
    #[serde(default = "default_sleep_seconds")]
    pub(crate) sleep_seconds: u64,
    /// Start the child in a process group of its own.
    #[serde(default)]
    pub(crate) new_group: bool,
}

const fn default_sleep_seconds() -> u64 {
    1000
}

/// The JSON form of a behaviour: every field optional, then checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBehaviour {
    #[serde(default, deserialize_with = "present")]
    finish: Option<Value>,
    #[serde(default)]
    fail: Option<SafeMessage>,
    #[serde(default)]
    outcome: Option<NodeFailureOutcome>,
    #[serde(default)]
    sleep_ms: Option<u64>,
    #[serde(default)]
    stall: Option<bool>,
    #[serde(default)]
    await_file: Option<PathBuf>,
    #[serde(default)]
    if_file: Option<PathBuf>,
    #[serde(default, rename = "else")]
    otherwise: Option<Box<Behaviour>>,
    #[serde(default)]
    exit: Option<i32>,
    #[serde(default)]
    crash_once: Option<PathBuf>,
    #[serde(default)]
    update: Option<NodeUpdate>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    effect: Option<EffectSpec>,
    #[serde(default)]
    crash_while_applying: Option<bool>,
    #[serde(default)]
    spawn_child: Option<SpawnSpec>,
    #[serde(default)]
    duplicate: Option<bool>,
    #[serde(default)]
    interact: Option<InteractSpec>,
    #[serde(default)]
    stderr_bytes: Option<u64>,
    notify: Option<NotifySpec>,
    #[serde(default)]
    decide: Option<Box<DecideSpec>>,
    #[serde(default)]
    protocol_violation: Option<ProtocolViolation>,
    content_read: Option<ContentReadSpec>,
    #[serde(default)]
    then: Option<Box<Behaviour>>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// Reads a present field as `Some` even when it is `null` (`{"finish":
/// null}` finishes with output `null`).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

impl TryFrom<RawBehaviour> for Behaviour {
    type Error = String;

    fn try_from(raw: RawBehaviour) -> Result<Self, String> {
        let named = [
            ("finish", raw.finish.is_some()),
            ("fail", raw.fail.is_some()),
            ("sleepMs", raw.sleep_ms.is_some()),
            ("stall", raw.stall.is_some()),
            ("awaitFile", raw.await_file.is_some()),
            ("ifFile", raw.if_file.is_some()),
            ("exit", raw.exit.is_some()),
            ("crashOnce", raw.crash_once.is_some()),
            ("update", raw.update.is_some()),
            ("effect", raw.effect.is_some()),
            ("spawnChild", raw.spawn_child.is_some()),
            ("duplicate", raw.duplicate.is_some()),
            ("interact", raw.interact.is_some()),
            ("stderrBytes", raw.stderr_bytes.is_some()),
            ("notify", raw.notify.is_some()),
            ("decide", raw.decide.is_some()),
            ("protocolViolation", raw.protocol_violation.is_some()),
            ("contentRead", raw.content_read.is_some()),
        ];
        let actions: Vec<&str> = named
            .iter()
            .filter(|(_, set)| *set)
            .map(|(name, _)| *name)
            .collect();
        let [action] = actions.as_slice() else {
            return Err(format!(
                "a behaviour names exactly one action, found {actions:?}"
            ));
        };
        let modifier = |name: &str, set: bool, owner: &str| {
            if set && *action != owner {
                Err(format!("`{name}` belongs to `{owner}`, not `{action}`"))
            } else {
                Ok(())
            }
        };
        modifier("outcome", raw.outcome.is_some(), "fail")?;
        modifier("else", raw.otherwise.is_some(), "ifFile")?;
        modifier("idempotencyKey", raw.idempotency_key.is_some(), "update")?;
        modifier(
            "crashWhileApplying",
            raw.crash_while_applying.is_some(),
            "effect",
        )?;
        let terminal = matches!(
            *action,
            "finish"
                | "fail"
                | "stall"
                | "exit"
                | "interact"
                | "notify"
                | "decide"
                | "protocolViolation"
        );
        if terminal && raw.then.is_some() {
            return Err(format!("`{action}` ends the attempt and takes no `then`"));
        }
        let then = raw.then.unwrap_or_else(|| Box::new(Self::default_finish()));
        let action = if let Some(output) = raw.finish {
            Action::Finish(Some(output))
        } else if let Some(message) = raw.fail {
            Action::Fail {
                message,
                outcome: raw.outcome.unwrap_or(NodeFailureOutcome::Failed),
            }
        } else if let Some(ms) = raw.sleep_ms {
            Action::Sleep { ms, then }
        } else if let Some(stall) = raw.stall {
            if !stall {
                return Err("`stall` must be true".to_string());
            }
            Action::Stall
        } else if let Some(path) = raw.await_file {
            Action::AwaitFile { path, then }
        } else if let Some(path) = raw.if_file {
            Action::IfFile {
                path,
                then,
                otherwise: raw
                    .otherwise
                    .unwrap_or_else(|| Box::new(Self::default_finish())),
            }
        } else if let Some(code) = raw.exit {
            Action::Exit(code)
        } else if let Some(marker) = raw.crash_once {
            Action::CrashOnce { marker, then }
        } else if let Some(update) = raw.update {
            Action::Update {
                update,
                idempotency_key: raw.idempotency_key,
                then,
            }
        } else if let Some(effect) = raw.effect {
            Action::Effect {
                effect,
                crash_while_applying: raw.crash_while_applying.unwrap_or(false),
                then,
            }
        } else if let Some(spawn) = raw.spawn_child {
            Action::SpawnChild { spawn, then }
        } else if let Some(interact) = raw.interact {
            Action::Interact(interact)
        } else if let Some(bytes) = raw.stderr_bytes {
            Action::Stderr { bytes, then }
        } else if let Some(notify) = raw.notify {
            Action::Notify(notify)
        } else if let Some(decide) = raw.decide {
            Action::Decide(decide)
        } else if let Some(violation) = raw.protocol_violation {
            Action::ProtocolViolation(violation)
        } else if let Some(read) = raw.content_read {
            Action::ContentRead { read, then }
        } else if raw.duplicate == Some(true) {
            Action::Duplicate(then)
        } else {
            return Err("`duplicate` must be true".to_string());
        };
        Ok(Self {
            action,
            timeout_ms: raw.timeout_ms,
        })
    }
}

impl Behaviour {
    /// What a node without an entry (or a wrapper without `then`) does:
    /// finish with `{"node": <id>, "visit": N}`.
    pub(crate) const fn default_finish() -> Self {
        Self {
            action: Action::Finish(None),
            timeout_ms: None,
        }
    }

    /// The dynamic timeout of the chain: the outermost `timeoutMs`.
    pub(crate) fn dynamic_timeout_ms(&self) -> Option<u64> {
        self.timeout_ms
            .or_else(|| self.then().and_then(Self::dynamic_timeout_ms))
    }

    fn then(&self) -> Option<&Self> {
        match &self.action {
            Action::Sleep { then, .. }
            | Action::AwaitFile { then, .. }
            | Action::IfFile { then, .. }
            | Action::CrashOnce { then, .. }
            | Action::Update { then, .. }
            | Action::Effect { then, .. }
            | Action::SpawnChild { then, .. }
            | Action::Stderr { then, .. }
            | Action::ContentRead { then, .. }
            | Action::Duplicate(then) => Some(then),
            Action::Finish(_)
            | Action::Fail { .. }
            | Action::Stall
            | Action::Exit(_)
            | Action::Interact(_)
            | Action::Notify(_)
            | Action::Decide(_)
            | Action::ProtocolViolation(_) => None,
        }
    }
}

/// The output of [`Action::Finish`] without an explicit value.
pub(crate) fn default_output(node_id: &str, visit: u64) -> Value {
    json!({"node": node_id, "visit": visit})
}

impl Script {
    /// Parses a script file's bytes.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    /// The behaviour of `node_id` on `visit` (1-based): the entry at
    /// `visit - 1`, the last entry beyond the end, the default finish when
    /// the node has no (or an empty) entry.
    pub(crate) fn behaviour(&self, node_id: &str, visit: u64) -> Behaviour {
        let Some(list) = self.nodes.get(node_id).filter(|list| !list.is_empty()) else {
            return Behaviour::default_finish();
        };
        let index = usize::try_from(visit.saturating_sub(1)).unwrap_or(usize::MAX);
        list[index.min(list.len() - 1)].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Script, String> {
        Script::parse(text.as_bytes())
    }

    fn behaviour(text: &str) -> Result<Behaviour, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    const TOPOLOGY: &str = r#"{"startAt":"a","nodes":[],"edges":[],"mounts":[]}"#;

    #[test]
    fn a_minimal_script_has_defaults() {
        let script = parse(&format!(r#"{{"topology":{TOPOLOGY}}}"#)).unwrap();
        assert_eq!(script.workflow_name, None);
        assert!(!script.reject_input);
        assert_eq!(script.startup, Startup::default());
        assert!(script.nodes.is_empty());
        assert_eq!(script.behaviour("a", 1), Behaviour::default_finish());
    }

    #[test]
    fn the_documented_example_parses() {
        let script = parse(&format!(
            r#"{{"workflowName":"linear","title":"optional","topology":{TOPOLOGY},
              "startup":{{"exitBeforeReady":3,"readyDelayMs":0,"ignoreSigterm":false,"keepWritingAfterClaimLost":false}},
              "nodes":{{"a":[{{"finish":{{"x":1}}}}],"b":[{{"fail":"boom"}}],"c":[{{"stall":true}}]}}}}"#
        ))
        .unwrap();
        assert_eq!(script.workflow_name.as_deref(), Some("linear"));
        assert_eq!(script.startup.exit_before_ready, Some(3));
        assert_eq!(
            script.behaviour("a", 1).action,
            Action::Finish(Some(json!({"x": 1})))
        );
        assert!(matches!(
            script.behaviour("b", 1).action,
            Action::Fail {
                outcome: NodeFailureOutcome::Failed,
                ..
            }
        ));
        assert_eq!(script.behaviour("c", 1).action, Action::Stall);
    }

    #[test]
    fn behaviours_are_selected_by_visit_and_the_last_repeats() {
        let script = parse(&format!(
            r#"{{"topology":{TOPOLOGY},"nodes":{{
                "a":[{{"finish":1}},{{"finish":2}},{{"finish":3}}],
                "empty":[]}}}}"#
        ))
        .unwrap();
        let output = |visit| match script.behaviour("a", visit).action {
            Action::Finish(Some(value)) => value,
            other => panic!("{other:?}"),
        };
        assert_eq!(output(1), json!(1));
        assert_eq!(output(2), json!(2));
        assert_eq!(output(3), json!(3));
        assert_eq!(output(4), json!(3));
        assert_eq!(output(u64::MAX), json!(3));
        // Visit 0 does not exist; it reads as the first entry.
        assert_eq!(output(0), json!(1));
        assert_eq!(script.behaviour("empty", 1), Behaviour::default_finish());
        assert_eq!(script.behaviour("unknown", 7), Behaviour::default_finish());
        assert_eq!(default_output("b", 2), json!({"node": "b", "visit": 2}));
    }

    #[test]
    fn finish_null_is_an_explicit_null_output() {
        assert_eq!(
            behaviour(r#"{"finish":null}"#).unwrap().action,
            Action::Finish(Some(Value::Null))
        );
    }

    #[test]
    fn wrappers_nest_and_default_to_the_default_finish() {
        let parsed = behaviour(
            r#"{"duplicate":true,"then":{"sleepMs":5,"timeoutMs":70,"then":{"crashOnce":"m","then":{"finish":{"ok":true}}}}}"#,
        )
        .unwrap();
        assert_eq!(parsed.dynamic_timeout_ms(), Some(70));
        let Action::Duplicate(sleep) = parsed.action else {
            panic!()
        };
        let Action::Sleep { ms: 5, then: crash } = sleep.action else {
            panic!()
        };
        assert!(matches!(crash.action, Action::CrashOnce { .. }));

        let update =
            behaviour(r#"{"update":{"type":"progress","key":"k","data":{"n":1}}}"#).unwrap();
        let Action::Update { then, .. } = update.action else {
            panic!()
        };
        assert_eq!(*then, Behaviour::default_finish());
    }

    #[test]
    fn interact_parses_with_defaults_and_takes_no_then() {
        let interact = behaviour(r#"{"interact":{"prompt":"Write it"}}"#).unwrap();
        assert_eq!(
            interact.action,
            Action::Interact(InteractSpec {
                kind: "agent".into(),
                prompt: "Write it".into(),
                contract: json!({}),
                headless: None,
            })
        );
        let headless =
            behaviour(r#"{"interact":{"prompt":"p","headless":{"stall":true}}}"#).unwrap();
        let Action::Interact(spec) = headless.action else {
            panic!("not an interact: {headless:?}");
        };
        assert_eq!(spec.headless.map(|then| then.action), Some(Action::Stall));
        assert!(behaviour(r#"{"interact":{"prompt":"p"},"then":{"finish":1}}"#).is_err());
        assert!(behaviour(r#"{"interact":{"prompt":"p","extra":1}}"#).is_err());
    }

    #[test]
    fn notify_parses_with_a_default_kind_and_takes_no_then() {
        let notify = behaviour(r#"{"notify":{"text":"Done"}}"#).unwrap();
        assert_eq!(
            notify.action,
            Action::Notify(NotifySpec {
                text: "Done".into(),
                kind: "progress".into(),
            })
        );
        assert!(behaviour(r#"{"notify":{"text":"t"},"then":{"finish":1}}"#).is_err());
        assert!(behaviour(r#"{"notify":{"text":"t","extra":1}}"#).is_err());
    }

    #[test]
    fn protocol_violations_parse_by_check_and_take_no_then() {
        for (text, check) in [
            ("schema", ProtocolViolation::Schema),
            ("revision", ProtocolViolation::Revision),
            ("attempt", ProtocolViolation::Attempt),
            ("idempotency", ProtocolViolation::Idempotency),
        ] {
            let parsed = behaviour(&format!(r#"{{"protocolViolation":"{text}"}}"#)).unwrap();
            assert_eq!(parsed.action, Action::ProtocolViolation(check));
        }
        assert!(behaviour(r#"{"protocolViolation":"other"}"#).is_err());
        assert!(behaviour(r#"{"protocolViolation":"schema","then":{"finish":1}}"#).is_err());
    }

    #[test]
    fn effect_and_spawn_fields_parse_with_defaults() {
        let effect = behaviour(
            r#"{"effect":{"type":"email.send","request":{"to":"x"},"applyLog":"/tmp/log"},"crashWhileApplying":true}"#,
        )
        .unwrap();
        let Action::Effect {
            effect,
            crash_while_applying: true,
            ..
        } = effect.action
        else {
            panic!()
        };
        assert_eq!(effect.effect_type, "email.send");
        assert_eq!(effect.apply_log, Some(PathBuf::from("/tmp/log")));
        assert!(!effect.receipt);
        assert_eq!(effect.apply_ms, 0);

        let spawn = behaviour(r#"{"spawnChild":{"newGroup":true}}"#).unwrap();
        assert!(matches!(
            spawn.action,
            Action::SpawnChild {
                spawn: SpawnSpec {
                    sleep_seconds: 1000,
                    new_group: true
                },
                ..
            }
        ));
    }

    #[test]
    fn fail_takes_an_outcome() {
        let parsed = behaviour(r#"{"fail":"too slow","outcome":"timed_out"}"#).unwrap();
        assert!(matches!(
            parsed.action,
            Action::Fail {
                outcome: NodeFailureOutcome::TimedOut,
                ..
            }
        ));
    }

    #[test]
    fn malformed_behaviours_are_rejected() {
        for text in [
            r#"{}"#,
            r#"{"finish":1,"fail":"x"}"#,
            r#"{"finsh":1}"#,
            r#"{"finish":1,"then":{"finish":2}}"#,
            r#"{"finish":1,"outcome":"failed"}"#,
            r#"{"fail":"x","outcome":"exploded"}"#,
            r#"{"stall":false}"#,
            r#"{"duplicate":false}"#,
            r#"{"update":{"type":"9bad","key":"k","data":1}}"#,
            r#"{"effect":{"type":"x","extra":1}}"#,
            r#"{"sleepMs":-1}"#,
        ] {
            assert!(behaviour(text).is_err(), "{text}");
        }
        let long = format!(r#"{{"fail":"{}"}}"#, "x".repeat(513));
        assert!(behaviour(&long).is_err());
    }

    #[test]
    fn malformed_scripts_are_rejected() {
        for text in [
            "",
            "not json",
            r#"{"nodes":{}}"#,
            &format!(r#"{{"topology":{TOPOLOGY},"startup":{{"ignoreSigterms":true}}}}"#),
            &format!(r#"{{"topology":{TOPOLOGY},"extra":1}}"#),
            &format!(r#"{{"topology":{TOPOLOGY},"nodes":{{"a":{{"finish":1}}}}}}"#),
        ] {
            assert!(parse(text).is_err(), "{text}");
        }
    }
}
