//! The torture workload: 20 concurrent workflows of six kinds, their
//! scripts (drawn from the trial's random stream), and what each kind's
//! runs must have finished when everything is done.
//!
//! Every managed effect appends `<effectId> <attemptNumber>` to an external
//! apply log when it really applies: `keyed.log` stands for an external
//! system that deduplicates by the engine's effect key (an operator may
//! `effect.recover retry` an ambiguous one safely), `plain.log` for one that
//! does not (the operator looks at the log: `confirm` when it is there,
//! `retry` only when it is not).

use super::rng::Rng;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// How many workflows each trial runs at once.
pub(crate) const WORKFLOWS: usize = 20;

/// The apply log of effects whose external system deduplicates by key.
pub(crate) const KEYED_LOG: &str = "keyed.log";
/// The apply log of effects whose external system applies every request.
pub(crate) const PLAIN_LOG: &str = "plain.log";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `a → b → c` compute steps with an update and sleeps.
    Compute,
    /// `a` applies a `keyed` effect, then `b`.
    KeyedEffect,
    /// `a` applies a `plain` effect and publishes an update, then `b`.
    PlainEffect,
    /// `draft → review (checkpoint)`; answered with `checkpoint.answer`,
    /// the continuation runs `publish` (a `plain` effect).
    Checkpoint,
    /// `draft → gate (humanDecision)`; answered `approve` with
    /// `decision.answer`, the continuation runs `publish` (a `plain` effect).
    Decision,
    /// `a → b → c` where `b` fails until the workflow's marker exists; the
    /// driver creates it and sends `run.restart`, the new run completes.
    Restart,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Compute,
        Kind::KeyedEffect,
        Kind::PlainEffect,
        Kind::Checkpoint,
        Kind::Decision,
        Kind::Restart,
    ];

    pub(crate) fn of(index: usize) -> Self {
        Self::ALL[index % Self::ALL.len()]
    }

    /// The results (`node:outcome`) of the first run, and those of its
    /// follow-on run (a continuation holds its parent's results too; a
    /// restart starts afresh).
    pub(crate) fn results(self) -> (&'static [&'static str], &'static [&'static str]) {
        match self {
            Kind::Compute => (&["a:ok", "b:ok", "c:ok"], &[]),
            Kind::KeyedEffect | Kind::PlainEffect => (&["a:ok", "b:ok"], &[]),
            Kind::Checkpoint => (
                &["draft:ok", "review:ok"],
                &["draft:ok", "publish:ok", "review:ok"],
            ),
            Kind::Decision => (
                &["draft:ok", "gate:ok"],
                &["draft:ok", "gate:ok", "publish:ok"],
            ),
            Kind::Restart => (&["a:ok", "b:failed"], &["a:ok", "b:ok", "c:ok"]),
        }
    }

    /// Whether the workflow goes on in a second run.
    pub(crate) fn has_follow_on(self) -> bool {
        matches!(self, Kind::Checkpoint | Kind::Decision | Kind::Restart)
    }
}

fn node(id: &str, node_type: &str) -> Value {
    json!({"id": id, "nodeType": node_type, "timeout": {"kind": "default"}, "mountPath": []})
}

fn plain_edges(ids: &[&str]) -> Vec<Value> {
    ids.windows(2)
        .map(|pair| json!({"kind": "plain", "from": pair[0], "to": pair[1]}))
        .collect()
}

fn effect(effect_type: &str, log: &str, index: usize, apply_ms: u64, then: Value) -> Value {
    json!({"effect": {"type": effect_type, "request": {"workflow": index}, "applyLog": log,
                      "applyMs": apply_ms, "receipt": true},
           "then": then})
}

/// The marker whose existence lets a `Restart` workflow's `b` finish.
pub(crate) fn restart_marker(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("go-{index}"))
}

/// Writes workflow `index`'s script into `dir`, its sleeps and effect
/// durations drawn from `rng`.
pub(crate) fn write_script(dir: &Path, index: usize, rng: &mut Rng) -> PathBuf {
    let mut ms = |most: u64| rng.below(most + 1);
    let name = format!("torture-{index}");
    let script = match Kind::of(index) {
        Kind::Compute => json!({
            "workflowName": name,
            "topology": {"startAt": "a", "nodes": [node("a", "compute"), node("b", "compute"), node("c", "compute")],
                         "edges": plain_edges(&["a", "b", "c"]), "mounts": []},
            "nodes": {
                "a": [{"update": {"type": "progress", "key": "a", "data": {"at": "a"}},
                       "then": {"sleepMs": ms(60), "then": {"finish": {"a": index}}}}],
                "b": [{"sleepMs": ms(60)}],
            },
        }),
        Kind::KeyedEffect => json!({
            "workflowName": name,
            "topology": {"startAt": "a", "nodes": [node("a", "action"), node("b", "compute")],
                         "edges": plain_edges(&["a", "b"]), "mounts": []},
            "nodes": {"a": [effect("keyed", KEYED_LOG, index, ms(120), json!({"sleepMs": ms(30)}))]},
        }),
        Kind::PlainEffect => json!({
            "workflowName": name,
            "topology": {"startAt": "a", "nodes": [node("a", "action"), node("b", "compute")],
                         "edges": plain_edges(&["a", "b"]), "mounts": []},
            "nodes": {"a": [effect("plain", PLAIN_LOG, index, ms(120),
                                   json!({"update": {"type": "progress", "key": "sent", "data": {"sent": true}}}))]},
        }),
        Kind::Checkpoint => json!({
            "workflowName": name,
            "topology": {"startAt": "draft",
                         "nodes": [node("draft", "compute"), node("review", "checkpoint"), node("publish", "action")],
                         "edges": plain_edges(&["draft", "review", "publish"]), "mounts": []},
            "nodes": {
                "draft": [{"sleepMs": ms(40)}],
                "review": [{"finish": {"question": "Publish?"}}],
                "publish": [effect("plain", PLAIN_LOG, index, ms(80), json!({"finish": {"published": true}}))],
            },
        }),
        Kind::Decision => {
            let mut gate = node("gate", "checkpoint");
            gate["humanDecision"] = json!(true);
            json!({
                "workflowName": name,
                "topology": {"startAt": "draft",
                             "nodes": [node("draft", "compute"), gate, node("publish", "action"), node("rework", "action")],
                             "edges": [
                                 {"kind": "plain", "from": "draft", "to": "gate"},
                                 {"kind": "switch", "from": "gate", "on": "$.choice", "cases": {"approve": "publish", "revise": "rework"}},
                             ],
                             "mounts": []},
                "nodes": {
                    "draft": [{"sleepMs": ms(40)}],
                    "gate": [{"decide": {"title": "Publish?", "choices": [
                        {"id": "approve", "label": "Approve"},
                        {"id": "revise", "label": "Revise"},
                    ]}}],
                    "publish": [effect("plain", PLAIN_LOG, index, ms(80), json!({"finish": {"published": true}}))],
                },
            })
        }
        Kind::Restart => {
            let marker = restart_marker(dir, index);
            json!({
                "workflowName": name,
                "topology": {"startAt": "a", "nodes": [node("a", "compute"), node("b", "compute"), node("c", "compute")],
                             "edges": plain_edges(&["a", "b", "c"]), "mounts": []},
                "nodes": {
                    "a": [{"sleepMs": ms(40)}],
                    "b": [{"ifFile": marker, "then": {"finish": {"b": true}}, "else": {"fail": "not yet"}}],
                },
            })
        }
    };
    super::support::write_script(dir, &format!("{name}.json"), &script)
}
