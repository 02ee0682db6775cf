//! Human-readable tables and the run-view frame. Pure functions of the
//! server's documents: every status, reason and control shown comes from
//! the view's `display` object, never from a local interpretation.

use serde_json::Value;
use std::fmt::Write as _;

/// Nodes shown in one frame; the rest are summarized.
const FRAME_NODES: usize = 40;
/// Updates shown in one frame.
const FRAME_UPDATES: usize = 6;
/// Characters of one cell or update before it is cut.
const CELL_CHARS: usize = 72;

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or("")
}

fn cut(value: &str, limit: usize) -> String {
    let single_line: String = value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if single_line.chars().count() <= limit {
        return single_line;
    }
    let mut short: String = single_line.chars().take(limit.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// Formats rows as left-aligned columns under a header.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.chars().count()).collect();
    for row in rows {
        for (index, cell) in row.iter().enumerate() {
            widths[index] = widths[index].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut rendered = String::new();
        for (index, cell) in cells.iter().enumerate() {
            if index + 1 == cells.len() {
                rendered.push_str(cell);
            } else {
                let _ = write!(rendered, "{cell:<width$}  ", width = widths[index]);
            }
        }
        out.push_str(rendered.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// `list`: NAME and SOURCE.
pub(super) fn workflow_table(workflows: &[Value]) -> String {
    let rows: Vec<Vec<String>> = workflows
        .iter()
        .map(|workflow| {
            vec![
                cut(text(&workflow["name"]), CELL_CHARS),
                text(&workflow["source"]).to_owned(),
            ]
        })
        .collect();
    table(&["NAME", "SOURCE"], &rows)
}

/// `runs`: one row per run.
pub(super) fn run_table(rows: &[Value], now_ms: u64) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let mut status = status_word(&row["display"]);
            // The reason says what the run needs (a `queued` run parked for
            // review will not start on its own).
            if let Some(reason) = row["display"]["reason"].as_str() {
                let _ = write!(status, " · {}", cut(reason, 48));
            }
            vec![
                text(&row["runId"]).to_owned(),
                cut(text(&row["workflowName"]), 32),
                status,
                age(row["updatedAtMs"].as_u64().unwrap_or(now_ms), now_ms),
                cut(text(&row["title"]), 48),
            ]
        })
        .collect();
    table(&["RUN", "WORKFLOW", "STATUS", "UPDATED", "TITLE"], &rows)
}

/// The status with what it waits on or runs, e.g. `waiting on review`.
pub(super) fn status_word(display: &Value) -> String {
    let status = text(&display["status"]);
    if let Some(node) = display["waitingOn"].as_str() {
        return format!("{status} on {node}");
    }
    if let Some(node) = display["currentNode"].as_str() {
        return format!("{status} at {node}");
    }
    status.to_owned()
}

pub(crate) fn age(then_ms: u64, now_ms: u64) -> String {
    let seconds = now_ms.saturating_sub(then_ms) / 1000;
    match seconds {
        0..=59 => format!("{seconds}s ago"),
        60..=3599 => format!("{}m ago", seconds / 60),
        3600..=86_399 => format!("{}h ago", seconds / 3600),
        _ => format!("{}d ago", seconds / 86_400),
    }
}

fn duration(started_ms: u64, finished_ms: u64) -> String {
    let millis = finished_ms.saturating_sub(started_ms);
    if millis < 1000 {
        format!("{millis}ms")
    } else if millis < 60_000 {
        format!("{:.1}s", millis as f64 / 1000.0)
    } else {
        format!("{}m{}s", millis / 60_000, millis % 60_000 / 1000)
    }
}

fn node_mark(state: &str) -> &'static str {
    match state {
        "completed" => "✓",
        "running" => "▶",
        "waiting" => "?",
        "failed" | "timed_out" => "✗",
        "cancelled" => "-",
        _ => "·",
    }
}

/// One line that says where the run is, for logs and non-terminal output
/// (without the revision, so unchanged lines can be skipped).
pub(super) fn status_line(view: &Value) -> String {
    let display = &view["display"];
    let mut line = status_word(display);
    if let Some(update) = view["updates"]["items"]
        .as_array()
        .and_then(|items| items.first())
    {
        let _ = write!(line, " · {}", update_text(update));
    }
    if let Some(reason) = display["reason"].as_str() {
        let _ = write!(line, " · {}", cut(reason, CELL_CHARS));
    }
    // Who must act, when someone other than the run's own runner must.
    let why = &display["why"];
    if !matches!(why["actor"].as_str(), None | Some("runner" | "nobody")) {
        let _ = write!(line, " · why: {}", cut(text(&why["summary"]), CELL_CHARS));
    }
    line
}

/// One update in words: progress as `key done/total unit (status)`, any
/// other update as `type key: data`.
fn update_text(update: &Value) -> String {
    let data = &update["data"];
    if let (Some(done), Some(total)) = (data["completed"].as_u64(), data["total"].as_u64()) {
        let mut line = format!("{} {done}/{total}", text(&update["key"]));
        if let Some(unit) = data["unit"].as_str() {
            let _ = write!(line, " {unit}");
        }
        if let Some(status) = data["status"].as_str() {
            let _ = write!(line, " ({status})");
        }
        return cut(&line, CELL_CHARS);
    }
    let shown = match data {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    cut(
        &format!(
            "{} {}: {}",
            text(&update["type"]),
            text(&update["key"]),
            shown
        ),
        CELL_CHARS,
    )
}

/// The run-view frame `view` draws (and redraws in place when following).
pub(super) fn view_frame(view: &Value, now_ms: u64) -> String {
    let display = &view["display"];
    let mut out = String::new();
    let title = view["title"]
        .as_str()
        .map(|title| format!(" — {}", cut(title, 60)));
    let _ = writeln!(
        out,
        "{} · {}{}",
        text(&view["workflowName"]),
        text(&view["runId"]),
        title.unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "status    {} (revision {})",
        status_word(display),
        view["revision"].as_u64().unwrap_or(0)
    );
    if let Some(reason) = display["reason"].as_str() {
        let _ = writeln!(out, "reason    {}", cut(reason, 200));
    }
    if let Some(summary) = display["why"]["summary"].as_str() {
        let _ = writeln!(out, "why       {}", cut(summary, 512));
    }
    if let Some(notice) = display["reasonNotice"].as_object() {
        let _ = writeln!(
            out,
            "reason    {}",
            cut(
                notice.get("message").and_then(Value::as_str).unwrap_or(""),
                200
            )
        );
    }
    let controls: Vec<&str> = display["controls"]
        .as_array()
        .map(|controls| controls.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !controls.is_empty() {
        let _ = writeln!(out, "controls  {}", controls.join(", "));
    }
    if let Some(lineage) = view["lineage"].as_object() {
        if let Some(parent) = lineage.get("continuationOf") {
            let _ = writeln!(
                out,
                "continues {} after {}",
                text(&parent["runId"]),
                text(&parent["checkpoint"])
            );
        }
        if let Some(child) = lineage.get("continuedBy").and_then(Value::as_str) {
            let _ = writeln!(out, "continued as {child}");
        }
    }
    out.push('\n');
    let steps = view["steps"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .take(FRAME_NODES)
        .map(|node| {
            let id = text(&node["id"]);
            let last_step = steps.iter().rev().find(|step| text(&step["nodeId"]) == id);
            let took = last_step
                .and_then(|step| {
                    let started = step["startedAtMs"].as_u64()?;
                    Some(duration(
                        started,
                        step["finishedAtMs"].as_u64().unwrap_or(now_ms),
                    ))
                })
                .unwrap_or_default();
            let state = text(&node["state"]);
            vec![
                format!("{} {}", node_mark(state), cut(id, 40)),
                text(&node["nodeType"]).to_owned(),
                state.to_owned(),
                node["visits"].as_u64().unwrap_or(0).to_string(),
                took,
            ]
        })
        .collect();
    for line in table(&["  NODE", "TYPE", "STATE", "VISITS", "TIME"], &rows).lines() {
        let _ = writeln!(out, "{line}");
    }
    if nodes.len() > FRAME_NODES {
        let _ = writeln!(out, "  … {} more nodes", nodes.len() - FRAME_NODES);
    }
    let updates = view["updates"]["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !updates.is_empty() {
        let _ = writeln!(out, "\nupdates");
        for update in updates.iter().take(FRAME_UPDATES) {
            let _ = writeln!(out, "  {}", update_text(update));
        }
    }
    if let Some(failure) = view["failure"].as_object() {
        let _ = writeln!(
            out,
            "\nfailure   {}: {}",
            failure.get("class").and_then(Value::as_str).unwrap_or(""),
            cut(
                failure.get("message").and_then(Value::as_str).unwrap_or(""),
                200
            )
        );
    }
    if controls.contains(&"answer") {
        let _ = writeln!(
            out,
            "\nanswer with: pi-workflows answer {} '<json>'",
            text(&view["runId"])
        );
    }
    if let Some(decision) = view["decision"].as_object() {
        let _ = writeln!(
            out,
            "\ndecision  {}",
            cut(
                decision.get("title").and_then(Value::as_str).unwrap_or(""),
                200
            )
        );
        for choice in decision
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let takes_text = choice.get("input").is_some();
            let _ = writeln!(
                out,
                "  {}  {}{}",
                text(&choice["id"]),
                cut(choice["label"].as_str().unwrap_or(""), 120),
                if takes_text { " (with text)" } else { "" }
            );
        }
        if controls.contains(&"humanAnswer") {
            let _ = writeln!(
                out,
                "answer with: pi-workflows answer {} CHOICE [TEXT]",
                text(&view["runId"])
            );
        }
    }
    if let Some(effects) = view["ambiguousEffects"].as_array() {
        let _ = writeln!(out, "\nambiguous effects (check the external system first)");
        for effect in effects {
            let _ = writeln!(
                out,
                "  {}  {} at {} (attempt {})",
                text(&effect["effectId"]),
                text(&effect["effectType"]),
                text(&effect["nodeId"]),
                effect["attemptNumber"]
            );
        }
        if controls.contains(&"recoverEffect") {
            let _ = writeln!(
                out,
                "recover with: pi-workflows recover {} confirm|retry [--effect ID]",
                text(&view["runId"])
            );
        }
    }
    out
}

/// Whether the view's run ended: a terminal status and no runner or turn
/// still winding down (the run's last revision).
pub(super) fn is_settled(view: &Value) -> bool {
    matches!(
        view["display"]["status"].as_str(),
        Some("completed" | "failed" | "timed_out" | "cancelled")
    ) && view["display"]["activity"] == "none"
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_columns_and_trim_trailing_space() {
        let out = table(&["A", "BB"], &[vec!["long cell".into(), "x".into()]]);
        assert_eq!(out, "A          BB\nlong cell  x\n");
    }

    #[test]
    fn cells_are_single_line_and_bounded() {
        assert_eq!(cut("a\nb", 10), "a b");
        assert_eq!(cut("abcdef", 4), "abc…");
    }

    #[test]
    fn the_frame_shows_the_display_status_controls_and_answer_hint() {
        let view = json!({
            "runId": "r1", "workflowName": "review", "revision": 7,
            "display": { "status": "waiting", "waitingOn": "approve", "controls": ["answer", "cancel"],
                         "why": { "state": "waitingForAnswer", "actor": "person",
                                  "summary": "waiting for a person to answer the checkpoint" } },
            "nodes": [{ "id": "build", "nodeType": "shell", "state": "completed", "visits": 1 },
                      { "id": "approve", "nodeType": "checkpoint", "state": "waiting", "visits": 1 }],
            "steps": { "items": [{ "nodeId": "build", "startedAtMs": 1000, "finishedAtMs": 1250 }], "total": 1 },
            "updates": { "items": [{ "type": "progress", "key": "build", "data": "3/10" }], "total": 1 },
        });
        let frame = view_frame(&view, 5000);
        assert!(
            frame.contains("status    waiting on approve (revision 7)"),
            "{frame}"
        );
        assert!(frame.contains("controls  answer, cancel"), "{frame}");
        assert!(frame.contains("✓ build"), "{frame}");
        assert!(frame.contains("250ms"), "{frame}");
        assert!(frame.contains("progress build: 3/10"), "{frame}");
        assert!(frame.contains("pi-workflows answer r1 '<json>'"), "{frame}");
        assert!(
            frame.contains("why       waiting for a person to answer the checkpoint"),
            "{frame}"
        );
        assert_eq!(
            status_line(&view),
            "waiting on approve · progress build: 3/10 · why: waiting for a person to answer the checkpoint"
        );
        let progress = json!({ "type": "progress", "key": "build",
            "data": { "completed": 3, "total": 8, "unit": "steps", "status": "running" } });
        assert_eq!(update_text(&progress), "build 3/8 steps (running)");
    }
}
