//! The torture workloads: 20 concurrent workflows of six kinds for the
//! scripted runner (`Lane::Scripted`), or `PI_WORKFLOWS` of two kinds as
//! `.workflow.ts` files for the TypeScript runner with real Pi
//! (`Lane::Pi`); their scripts (drawn from the trial's random stream), and
//! what each kind's runs must have finished when everything is done.
//!
//! Every managed effect appends `<effectId> <attemptNumber>` to an external
//! apply log when it really applies: `keyed.log` stands for an external
//! system that deduplicates by the engine's effect key (an operator may
//! `effect.recover retry` an ambiguous one safely), `plain.log` for one that
//! does not (the operator looks at the log: `confirm` when it is there,
//! `retry` only when it is not).
//!
//! A shell action (`Lane::Pi`) is a managed effect of type `shell` without
//! an external key: its command appends a line to
//! `shell.log` (`<runId> <visit>`: its request is the same for every
//! attempt of one visit, as the effect key's fingerprint requires; non-idempotent, so the operator treats it like `plain`: a
//! line of the run there means `confirm`). Its agent step runs headless,
//! real Pi (`pi --mode rpc`) against the mock model, which submits
//! `{"verdict": "approve"}` for the step contract.

use super::rng::Rng;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Which runner a trial's workflows run on (each lane is its own test
/// binary, which constructs only its own).
#[allow(dead_code)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The Rust scripted runner, JSON scripts.
    Scripted,
    /// The TypeScript runner (`sdk-ts/build`), `.workflow.ts` files, shell
    /// actions and headless agent steps run by real Pi.
    Pi,
}

impl Lane {
    /// How many workflows each trial runs at once.
    pub(crate) fn workflows(self) -> usize {
        match self {
            Lane::Scripted => 20,
            Lane::Pi => PI_WORKFLOWS,
        }
    }

    /// The kind of workflow `index`.
    pub(crate) fn kind(self, index: usize) -> Kind {
        match self {
            Lane::Scripted => Kind::SCRIPTED[index % Kind::SCRIPTED.len()],
            Lane::Pi => Kind::PI[index % Kind::PI.len()],
        }
    }
}

/// How many workflows a trial of the Pi lane runs at once (each agent step
/// is a Pi process on Node 22: a handful keeps a trial within seconds on
/// two cores).
pub(crate) const PI_WORKFLOWS: usize = 6;

/// The apply log of shell actions.
pub(crate) const SHELL_LOG: &str = "shell.log";

/// The verdict the mock model submits for every agent step.
pub(crate) const VERDICT: &str = "approve";

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
    /// (Pi lane) `prepare` (compute) → `apply` (a shell action appending to
    /// `shell.log`) → `review` (a headless agent step, real Pi) → `ship`
    /// (compute reading the review's output).
    ShellAgent,
    /// (Pi lane) `prepare` → `apply` (the shell action) → `done`.
    Shell,
}

impl Kind {
    const SCRIPTED: [Kind; 6] = [
        Kind::Compute,
        Kind::KeyedEffect,
        Kind::PlainEffect,
        Kind::Checkpoint,
        Kind::Decision,
        Kind::Restart,
    ];
    const PI: [Kind; 2] = [Kind::ShellAgent, Kind::Shell];

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
            Kind::ShellAgent => (&["apply:ok", "prepare:ok", "review:ok", "ship:ok"], &[]),
            Kind::Shell => (&["apply:ok", "done:ok", "prepare:ok"], &[]),
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
/// durations drawn from `rng`. A Pi-lane workflow goes to the project
/// directory `dir/project/.pi/workflows/`, started by its name.
pub(crate) fn write_script(dir: &Path, lane: Lane, index: usize, rng: &mut Rng) -> PathBuf {
    let kind = lane.kind(index);
    if lane == Lane::Pi {
        return write_workflow_ts(dir, kind, index, rng);
    }
    let mut ms = |most: u64| rng.below(most + 1);
    let name = format!("torture-{index}");
    let script = match kind {
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
        Kind::ShellAgent | Kind::Shell => unreachable!("{kind:?} is a Pi-lane kind"),
    };
    super::support::write_script(dir, &format!("{name}.json"), &script)
}

/// The project directory of the Pi lane (its workflows in `.pi/workflows/`).
pub(crate) fn project_dir(dir: &Path) -> PathBuf {
    dir.join("project")
}

/// Writes a Pi-lane workflow `torture-<index>.workflow.ts`; returns the
/// name `run.start` takes.
fn write_workflow_ts(dir: &Path, kind: Kind, index: usize, rng: &mut Rng) -> PathBuf {
    let mut ms = |most: u64| rng.below(most + 1);
    let name = format!("torture-{index}");
    let log = serde_json::to_string(&dir.join(SHELL_LOG).to_string_lossy()).unwrap();
    let prepare_ms = ms(60);
    // The command appends its line first, then works on: a crash while it
    // runs leaves the effect applying with its line already written (the
    // operator confirms) or, killed before the append, without (retry).
    let apply_seconds = format!("{:.3}", ms(400) as f64 / 1000.0);
    let tail = match kind {
        Kind::ShellAgent => format!(
            r#"    review: agent({{
      prompt: "Review workflow {index}.",
      expectedOutput: '{{ "verdict": "{VERDICT}" }}',
      validate: (output) => {{
        if ((output as {{ verdict?: unknown }}).verdict !== "{VERDICT}") throw new Error("verdict must be {VERDICT}");
        return output;
      }},
    }}),
    ship: compute({{ run: ({{ outputs }}) => ({{ shipped: outputs.review }}) }}),
  }},
  edges: [{{ from: "prepare", to: "apply" }}, {{ from: "apply", to: "review" }}, {{ from: "review", to: "ship" }}],"#
        ),
        Kind::Shell => {
            r#"    done: compute({ run: ({ outputs }) => ({ applied: outputs.apply }) }),
  },
  edges: [{ from: "prepare", to: "apply" }, { from: "apply", to: "done" }],"#
                .to_owned()
        }
        _ => unreachable!("{kind:?} is a scripted-lane kind"),
    };
    let source = format!(
        r#"import {{ agent, compute, defineWorkflow, shell }} from "@pi-workflows/sdk";
export default defineWorkflow({{
  name: "{name}",
  startAt: "prepare",
  model: {{ provider: "mock", model: "mock-model" }},
  nodes: {{
    prepare: compute({{ run: async () => {{ await new Promise((resolve) => setTimeout(resolve, {prepare_ms})); return {{ workflow: {index} }}; }} }}),
    apply: shell({{
      exec: ({{ attempt }}) => ({{
        command: "/bin/sh",
        args: ["-c", 'printf "%s %s\\n" "$1" "$2" >> "$3"; sleep {apply_seconds}', "apply", attempt.runId, String(attempt.visit), {log}],
      }}),
      parse: (result) => ({{ exitCode: result.exitCode }}),
    }}),
{tail}
}});
"#
    );
    let workflows = project_dir(dir).join(".pi").join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(workflows.join(format!("{name}.workflow.ts")), source).unwrap();
    PathBuf::from(name)
}
