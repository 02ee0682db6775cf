//! The inspector: tabs for attempts, outputs and errors, updates with ETA,
//! trace events, the session transcript, and the run's facts. Whatever the
//! view or its pages do not carry is a clear "not recorded" line.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Paragraph};
use serde_json::Value;

use super::text::{fit, single_line, width, wrap};
use crate::app::{App, ContentState, Focus, Hit, RunState, Tab};
use crate::eta::Eta;
use crate::model::{
    Progress, clock, clock_ms, duration, number, outcome_word, status_word, type_word,
};
use crate::theme::Theme;

/// Draws the inspector pane.
pub(super) fn draw(frame: &mut Frame<'_>, app: &mut App, area: Rect) {
    let theme = app.theme;
    let focused = app.focus == Focus::Inspector;
    let node = app.inspected_node();
    let title = match &node {
        Some(node) => format!(" inspector · {node} "),
        None => " inspector ".to_owned(),
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(if focused {
            theme.accent()
        } else {
            theme.border()
        })
        .title(Span::styled(
            fit(&title, area.width.saturating_sub(4) as usize),
            if focused {
                theme.accent()
            } else {
                theme.text()
            },
        ));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height == 0 {
        return;
    }
    // Tabs.
    let mut spans = Vec::new();
    let mut x = inner.x;
    for (i, tab) in Tab::ALL.iter().enumerate() {
        let label = format!(" {} {} ", i + 1, tab.title());
        let w = width(&label) as u16;
        if x + w > inner.x + inner.width {
            break;
        }
        let style = if *tab == app.tab {
            theme.selected()
        } else {
            theme.dim()
        };
        app.hits.push((
            Rect {
                x,
                y: inner.y,
                width: w,
                height: 1,
            },
            Hit::Tab(*tab),
        ));
        spans.push(Span::styled(label, style));
        x += w;
    }
    frame.render_widget(
        Paragraph::new(Line::from(spans)),
        Rect { height: 1, ..inner },
    );
    let body = Rect {
        y: inner.y + 1,
        height: inner.height - 1,
        ..inner
    };
    app.hits.push((body, Hit::Inspector));
    let w = body.width.saturating_sub(1) as usize;
    let lines = match app.run.as_ref() {
        Some(run) if run.view.is_some() => match app.tab {
            Tab::Attempts => attempts(app, run, node.as_deref(), w),
            Tab::Output => output(app, run, node.as_deref(), w),
            Tab::Updates => updates(app, run, w),
            Tab::Trace => trace(app, run, node.as_deref(), w),
            Tab::Session => session(app, run, w),
            Tab::Info => info(app, run, w),
        },
        _ => vec![Line::styled(" no run view yet", theme.dim())],
    };
    let max_scroll = lines.len().saturating_sub(body.height as usize) as u16;
    app.inspector_scroll = app.inspector_scroll.min(max_scroll);
    frame.render_widget(
        Paragraph::new(lines).scroll((app.inspector_scroll, 0)),
        body,
    );
}

fn kv<'a>(theme: &Theme, key: &str, value: String, w: usize) -> Vec<Line<'a>> {
    let key_w = 11;
    wrap(&value, w.saturating_sub(key_w + 1))
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            Line::from(vec![
                Span::styled(
                    format!(" {:<key_w$}", if i == 0 { key } else { "" }),
                    theme.dim(),
                ),
                Span::styled(part, theme.text()),
            ])
        })
        .collect()
}

fn note<'a>(theme: &Theme, text: &str, w: usize) -> Vec<Line<'a>> {
    wrap(text, w.saturating_sub(1))
        .into_iter()
        .map(|part| Line::styled(format!(" {part}"), theme.dim()))
        .collect()
}

fn attempts<'a>(app: &App, run: &RunState, node: Option<&str>, w: usize) -> Vec<Line<'a>> {
    let theme = app.theme;
    let view = run.view.as_deref().expect("checked");
    let Some(node) = node else {
        return note(
            &theme,
            "select a node (n, or click it) to see its attempts",
            w,
        );
    };
    let mut lines = Vec::new();
    if let Some(graph_node) = view.nodes.iter().find(|n| n.id.as_str() == node) {
        lines.push(Line::from(vec![
            Span::styled(
                format!(" {node}"),
                theme.text().add_modifier(Modifier::BOLD),
            ),
            Span::styled(
                format!(
                    " · {} · visits {} · {}",
                    type_word(graph_node.node_type),
                    graph_node.visits.get(),
                    crate::model::node_word(graph_node.state)
                ),
                theme.dim(),
            ),
        ]));
    }
    let steps: Vec<_> = run
        .model
        .steps
        .iter()
        .filter(|s| s.node_id.as_str() == node)
        .collect();
    if steps.is_empty() {
        lines.extend(note(
            &theme,
            "no attempts yet: the run has not reached this node",
            w,
        ));
    }
    for step in steps {
        let took = step
            .finished_at_ms
            .map(|f| duration(f.get().saturating_sub(step.started_at_ms.get())))
            .unwrap_or_else(|| {
                format!(
                    "{} so far",
                    duration(app.now_ms.saturating_sub(step.started_at_ms.get()))
                )
            });
        let outcome = step.outcome.map_or("unfinished", outcome_word);
        lines.push(Line::from(vec![
            Span::styled(format!(" step {:<4}", step.seq.get()), theme.accent()),
            Span::styled(
                format!(
                    "visit {} · started {} · {took} · {outcome}",
                    step.visit.get(),
                    clock(step.started_at_ms.get())
                ),
                theme.text(),
            ),
        ]));
        for attempt in &step.attempts {
            let end = match attempt.finished_at_ms {
                Some(f) => format!(
                    "{} · {}",
                    duration(f.get().saturating_sub(attempt.started_at_ms.get())),
                    attempt.outcome.map_or("no outcome", outcome_word)
                ),
                None => "running".into(),
            };
            lines.push(Line::styled(
                fit(
                    &format!(
                        "   try {} · {} · {end}",
                        attempt.attempt_number.get(),
                        clock_ms(attempt.started_at_ms.get())
                    ),
                    w,
                ),
                theme.dim(),
            ));
        }
    }
    if !run.model.steps_complete {
        lines.extend(note(
            &theme,
            &format!(
                "showing the first {} of {} steps; reading the complete graph history…",
                run.model.steps.len(),
                view.steps.total.get()
            ),
            w,
        ));
    }
    lines
}

fn content_text(run: &RunState, digest: &str) -> Result<String, String> {
    match run.content(digest) {
        Some(ContentState::Ready(bytes)) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        Some(ContentState::Failed(line)) => Err(line.clone()),
        Some(ContentState::Loading) | None => Err("reading it from the server…".into()),
    }
}

fn output<'a>(app: &App, run: &RunState, node: Option<&str>, w: usize) -> Vec<Line<'a>> {
    let theme = app.theme;
    let view = run.view.as_deref().expect("checked");
    let mut lines = Vec::new();
    let status_style = theme.status(view.display.status);
    if let Some(failure) = &view.failure {
        lines.push(Line::styled(
            format!(" failure · {}", failure.class),
            status_style.add_modifier(Modifier::BOLD),
        ));
        for part in wrap(failure.message.as_str(), w.saturating_sub(3)) {
            lines.push(Line::styled(format!("   {part}"), status_style));
        }
    }
    if let Some(why) = &view.display.why {
        // The kernel's explainer (`display.why`): who must act and why;
        // `pi-workflows why <runId>` adds the claim, queue and commit.
        lines.push(Line::styled(
            format!(" why · {} acts · {}", why.actor, why.state),
            theme.dim(),
        ));
        for part in wrap(why.summary.as_str(), w.saturating_sub(3)) {
            lines.push(Line::styled(format!("   {part}"), theme.text()));
        }
    }
    if let Some(reason) = &view.display.reason {
        lines.push(Line::styled(" reason", theme.dim()));
        for part in wrap(reason.as_str(), w.saturating_sub(3)) {
            lines.push(Line::styled(format!("   {part}"), theme.text()));
        }
    }
    if let (Some(notice), Some(reference)) =
        (&view.display.reason_notice, &view.display.reason_content)
    {
        lines.push(Line::styled(
            format!(" reason · {}", notice.as_str()),
            theme.dim(),
        ));
        match content_text(run, reference.digest.as_str()) {
            Ok(text) => {
                lines.push(Line::styled(
                    format!(
                        "   verified {} ({} bytes)",
                        reference.digest.as_str(),
                        reference.bytes.get()
                    ),
                    theme.dim(),
                ));
                for part in wrap(&text, w.saturating_sub(3)) {
                    lines.push(Line::styled(format!("   {part}"), theme.text()));
                }
            }
            Err(line) => lines.extend(note(&theme, &format!("  {line}"), w)),
        }
    }
    if let Some(node) = node {
        let last = run
            .model
            .steps
            .iter()
            .rev()
            .find(|s| s.node_id.as_str() == node);
        let outcome = last
            .and_then(|s| s.outcome)
            .map_or("no outcome yet", outcome_word);
        lines.push(Line::styled(
            format!(" {node} · outcome {outcome}"),
            theme.text().add_modifier(Modifier::BOLD),
        ));
        lines.extend(note(&theme, "  output: not recorded in the run view (run-view.v1 carries no node outputs or attempt errors)", w));
    }
    if lines.is_empty() {
        lines.extend(note(
            &theme,
            "no failure and no reason recorded for this run",
            w,
        ));
    }
    lines
}

fn eta_text(eta: &Eta) -> String {
    match eta {
        Eta::Measured {
            remaining_ms,
            low_ms,
            high_ms,
            confidence,
        } => format!(
            "ETA {} ({}–{}, {} confidence)",
            duration(*remaining_ms),
            duration(*low_ms),
            duration(*high_ms),
            confidence.word()
        ),
        Eta::Source { remaining_ms } => {
            format!("ETA {} (the source's estimate)", duration(*remaining_ms))
        }
        Eta::Paused => "ETA paused while the track waits".into(),
        Eta::Done => "finished".into(),
        Eta::Unavailable(why) => format!("ETA unavailable: {why}"),
    }
}

fn updates<'a>(app: &App, run: &RunState, w: usize) -> Vec<Line<'a>> {
    let theme = app.theme;
    let view = run.view.as_deref().expect("checked");
    let items = &view.updates.items;
    if items.is_empty() {
        return note(&theme, "no updates recorded for this run", w);
    }
    let mut lines = vec![Line::styled(
        format!(
            " {} of {} current updates, newest first",
            items.len(),
            view.updates.total.get()
        ),
        theme.dim(),
    )];
    for update in items {
        let node = run
            .model
            .attempt_node
            .get(update.attempt_id.as_str())
            .cloned()
            .unwrap_or_else(|| "?".into());
        let head = format!(
            " {node} · {} {}",
            update.type_.as_str(),
            update.key.as_str()
        );
        if let Some(progress) =
            Progress::from_update(update.type_.as_str(), update.key.as_str(), &update.data)
        {
            let mut text = head;
            let bar_w = 12usize;
            let mut spans = Vec::new();
            if let Some(fraction) = progress.fraction() {
                let filled = (fraction * bar_w as f64).round() as usize;
                spans.push(Span::styled(
                    format!("{text}  "),
                    theme.text().add_modifier(Modifier::BOLD),
                ));
                spans.push(Span::styled("█".repeat(filled), theme.fg(theme.running)));
                spans.push(Span::styled("░".repeat(bar_w - filled), theme.dim()));
                text = String::new();
            }
            let mut facts = Vec::new();
            if let Some(count) = progress.count() {
                facts.push(count);
            }
            if let (Some(done), Some(total)) = (progress.completed, progress.total)
                && total > 0.0
            {
                facts.push(format!("{}%", number((done / total * 100.0).floor())));
            }
            if let Some(status) = &progress.status {
                facts.push(status.clone());
            }
            if let Some(label) = &progress.label {
                facts.push(label.clone());
            }
            if text.is_empty() {
                spans.push(Span::styled(
                    format!(" {}", facts.join(" · ")),
                    theme.text(),
                ));
                lines.push(Line::from(spans));
            } else {
                lines.push(Line::styled(
                    fit(&format!("{text} · {}", facts.join(" · ")), w),
                    theme.text(),
                ));
            }
            let eta = run.eta.estimate(
                &format!("progress/{}", update.key.as_str()),
                &update.data,
                app.now_ms,
            );
            lines.push(Line::styled(format!("   {}", eta_text(&eta)), theme.dim()));
        } else {
            let data = match &update.data {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            lines.push(Line::from(vec![
                Span::styled(head, theme.text().add_modifier(Modifier::BOLD)),
                Span::styled(
                    format!(
                        "  {}",
                        fit(&single_line(&data), w.saturating_sub(width(&node) + 20))
                    ),
                    theme.text(),
                ),
            ]));
        }
    }
    lines
}

fn page_lines<'a>(
    app: &App,
    run: &RunState,
    tab: Tab,
    w: usize,
) -> Result<Vec<Value>, Vec<Line<'a>>> {
    let theme = app.theme;
    let collection = tab.collection().expect("a page tab");
    match run.page(collection) {
        None => Err(note(&theme, "reading from the server…", w)),
        Some(page) if page.revision.is_none() && page.loading => {
            Err(note(&theme, "reading from the server…", w))
        }
        Some(page) => match &page.error {
            Some(line) => Err(note(&theme, line, w)),
            None => Ok(page.items.clone()),
        },
    }
}

fn short(value: &Value) -> String {
    match value {
        Value::String(s) if s.len() > 12 && s.contains('-') => format!("{}…", &s[..8.min(s.len())]),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn trace<'a>(app: &App, run: &RunState, node: Option<&str>, w: usize) -> Vec<Line<'a>> {
    let theme = app.theme;
    let items = match page_lines(app, run, Tab::Trace, w) {
        Ok(items) => items,
        Err(lines) => return lines,
    };
    let scoped: Vec<&Value> = items
        .iter()
        .filter(|item| {
            !app.trace_node_only
                || node.is_some_and(|n| item["payload"]["node_id"].as_str() == Some(n))
        })
        .collect();
    let scope = if app.trace_node_only {
        format!("events of {}", node.unwrap_or("no node"))
    } else {
        "all events".into()
    };
    let mut lines = vec![Line::styled(
        format!(" {scope} · {} shown · v switches", scoped.len()),
        theme.dim(),
    )];
    if scoped.is_empty() {
        lines.extend(note(&theme, "no trace events recorded", w));
    }
    for item in scoped {
        let kind = item["kind"].as_str().unwrap_or("?");
        let mut detail: Vec<String> = Vec::new();
        if let Some(payload) = item["payload"].as_object() {
            for (key, value) in payload {
                if key != "kind" {
                    detail.push(format!("{key} {}", short(value)));
                }
            }
        }
        lines.push(Line::from(vec![
            Span::styled(
                format!(" #{:<4}", item["seq"].as_u64().unwrap_or(0)),
                theme.accent(),
            ),
            Span::styled(
                format!("{} ", clock_ms(item["atMs"].as_u64().unwrap_or(0))),
                theme.dim(),
            ),
            Span::styled(
                format!("{kind} "),
                theme.text().add_modifier(Modifier::BOLD),
            ),
            Span::styled(
                fit(&detail.join(" · "), w.saturating_sub(width(kind) + 20)),
                theme.text(),
            ),
        ]));
    }
    if run
        .page(crate::app::Tab::Trace.collection().expect("trace"))
        .is_some_and(|p| p.next_cursor.is_some())
    {
        lines.extend(note(&theme, "more events: scroll down", w));
    }
    lines
}

fn session<'a>(app: &App, run: &RunState, w: usize) -> Vec<Line<'a>> {
    let theme = app.theme;
    let view = run.view.as_deref().expect("checked");
    let items = match page_lines(app, run, Tab::Session, w) {
        Ok(items) => items,
        Err(lines) => return lines,
    };
    if items.is_empty() {
        let why = match view.status.execution_mode {
            protocol::generated::types::ExecutionMode::Headless => {
                "no session transcript recorded: this is a headless run (no Pi session)"
            }
            protocol::generated::types::ExecutionMode::Interactive => {
                "no session transcript recorded for this run"
            }
        };
        return note(&theme, why, w);
    }
    let mut lines = Vec::new();
    for item in &items {
        let kind = item["type"].as_str().unwrap_or("event");
        let data = match &item["data"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        lines.push(Line::from(vec![
            Span::styled(
                format!(" #{:<4}", item["seq"].as_u64().unwrap_or(0)),
                theme.accent(),
            ),
            Span::styled(
                format!("{kind} "),
                theme.text().add_modifier(Modifier::BOLD),
            ),
            Span::styled(
                fit(&single_line(&data), w.saturating_sub(width(kind) + 8)),
                theme.text(),
            ),
        ]));
    }
    lines
}

fn info<'a>(app: &App, run: &RunState, w: usize) -> Vec<Line<'a>> {
    let theme = app.theme;
    let view = run.view.as_deref().expect("checked");
    let mut lines = Vec::new();
    lines.extend(kv(&theme, "run", view.run_id.to_string(), w));
    let title = view
        .title
        .as_ref()
        .map(|t| format!(" — {}", t.as_str()))
        .unwrap_or_default();
    lines.extend(kv(
        &theme,
        "workflow",
        format!("{}{title}", view.workflow_name.as_str()),
        w,
    ));
    lines.extend(kv(
        &theme,
        "display",
        format!(
            "{} · activity {} · controls {}",
            status_word(view.display.status),
            view.display.activity,
            {
                let controls: Vec<String> = view
                    .display
                    .controls
                    .as_slice()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                if controls.is_empty() {
                    "none".to_owned()
                } else {
                    controls.join(", ")
                }
            }
        ),
        w,
    ));
    let facts = &view.status;
    lines.extend(kv(
        &theme,
        "facts",
        format!(
            "run {} · queue {} · paused {} · {}",
            facts.run,
            facts.queue,
            if facts.paused { "yes" } else { "no" },
            facts.execution_mode
        ),
        w,
    ));
    let finished = view
        .finished_at_ms
        .map_or("—".to_owned(), |t| clock(t.get()));
    lines.extend(kv(
        &theme,
        "times",
        format!(
            "created {} · updated {} · finished {finished}",
            clock(view.created_at_ms.get()),
            clock(view.updated_at_ms.get())
        ),
        w,
    ));
    if let Some(lineage) = &view.lineage {
        let mut parts = Vec::new();
        if let Some(of) = &lineage.continuation_of {
            parts.push(format!(
                "continues {} after {}",
                of.run_id.as_str(),
                of.checkpoint.as_str()
            ));
        }
        if let Some(by) = &lineage.continued_by {
            parts.push(format!("continued as {}", by.as_str()));
        }
        if let Some(of) = &lineage.restart_of {
            parts.push(format!("restart of {}", of.as_str()));
        }
        lines.extend(kv(&theme, "lineage", parts.join(" · "), w));
    }
    let completeness = if run.model.steps_complete {
        "complete"
    } else {
        "partial: reading the graph history"
    };
    lines.extend(kv(
        &theme,
        "steps",
        format!(
            "{} of {} ({completeness})",
            run.model.steps.len(),
            view.steps.total.get()
        ),
        w,
    ));
    let reference = |r: &protocol::generated::types::ContentReference| -> String {
        let state = match run.content(r.digest.as_str()) {
            Some(ContentState::Ready(_)) => "verified".to_owned(),
            Some(ContentState::Loading) => "reading…".to_owned(),
            Some(ContentState::Failed(line)) => line.clone(),
            None => "not read (the view is complete inline)".to_owned(),
        };
        format!("{} · {} bytes · {state}", r.digest.as_str(), r.bytes.get())
    };
    lines.extend(kv(&theme, "definition", reference(&view.definition), w));
    lines.extend(kv(&theme, "history", reference(&view.graph_history), w));
    lines
}
