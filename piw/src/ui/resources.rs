//! The resources screen: the `resource.list` rows (controller/key, Ready,
//! generation and observed generation, deleting, the last error) above the
//! selected resource's `resource.get` detail (conditions, queue, effects,
//! child workflow runs with their run ids, recent events).
//!
//! Only what the views already say is drawn: never the spec, the
//! controller's own status value or the status's workflow-run value.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Paragraph};

use protocol::generated::types::{
    DisplayStatus, ResourceChildWorkflowViewState, ResourceConditionViewStatus,
    ResourceEffectViewState, ResourceListRow, ResourceListRowReady, ResourceView,
};

use super::text::{fit, fit_middle, pad, single_line};
use super::{availability_line, footer, split_line};
use crate::app::{App, Hit};
use crate::model::age;
use crate::resources::{EMPTY_LINE, ready_cell};
use crate::theme::Theme;

/// Rows of the list at most (the detail takes the rest).
const LIST_ROWS_MAX: usize = 8;

fn ready_style(theme: Theme, ready: Option<ResourceListRowReady>) -> Style {
    match ready {
        Some(ResourceListRowReady::True) => theme.status(DisplayStatus::Completed),
        Some(ResourceListRowReady::False) => theme.status(DisplayStatus::Failed),
        Some(ResourceListRowReady::Unknown) | None => theme.status(DisplayStatus::Waiting),
    }
}

/// `gen G/O`: the generation and the one the last reconcile observed.
fn generations(row: &ResourceListRow) -> String {
    format!("{}/{}", row.generation.get(), row.observed_generation.get())
}

/// The resources screen.
pub(super) fn draw_resources(frame: &mut Frame<'_>, app: &mut App, area: Rect) {
    let theme = app.theme;
    let cells = area.width as usize;
    if area.height < 6 {
        return;
    }
    let rows: Vec<ResourceListRow> = app.resources.rows.clone().unwrap_or_default();
    let left = vec![
        Span::styled(" piw ", theme.accent()),
        Span::styled("resources ", theme.text().add_modifier(Modifier::BOLD)),
        Span::styled(format!("· {}", rows.len()), theme.text()),
    ];
    let right = match availability_line(app) {
        Some((_, style)) if app.availability != crate::source::Availability::Connecting => {
            vec![Span::styled("○ disconnected ", style)]
        }
        Some((line, style)) => vec![Span::styled(format!("{line} "), style)],
        None => vec![Span::styled("● live ", theme.path())],
    };
    frame.render_widget(
        Paragraph::new(split_line(left, right, cells)),
        Rect { height: 1, ..area },
    );
    let ready_w = 12;
    let gen_w = 9;
    let deleting_w = 9;
    let name_w = cells
        .saturating_sub(3 + ready_w + gen_w + deleting_w + 20)
        .clamp(12, 48);
    let error_w = cells.saturating_sub(3 + ready_w + name_w + 1 + gen_w + deleting_w);
    let header = format!(
        "   {}{} {}{}{}",
        pad("READY", ready_w),
        pad("RESOURCE", name_w),
        pad("GEN/OBS", gen_w),
        pad("", deleting_w),
        if error_w >= 8 { "LAST ERROR" } else { "" }
    );
    frame.render_widget(
        Paragraph::new(Line::styled(fit(&header, cells), theme.dim())),
        Rect {
            y: area.y + 1,
            height: 1,
            ..area
        },
    );
    let list_top = area.y + 2;
    let list_h = (area.height.saturating_sub(8) as usize / 3).clamp(1, LIST_ROWS_MAX);
    app.page_rows = list_h;
    let cursor = app.resources.cursor_index().unwrap_or(0);
    let first = (cursor / list_h) * list_h;
    let mut lines = Vec::new();
    if let Some(line) = &app.resources.list_error {
        lines.push(Line::styled(
            fit(&format!("   {}", single_line(line)), cells),
            theme.status(DisplayStatus::Failed),
        ));
    } else if app.resources.rows.is_none() {
        lines.push(Line::styled(
            fit("   loading resources…", cells),
            theme.dim(),
        ));
    } else if rows.is_empty() {
        lines.push(Line::styled(
            fit(&format!("   {EMPTY_LINE}"), cells),
            theme.dim(),
        ));
    }
    let room = list_h.saturating_sub(lines.len());
    let shown_from = lines.len();
    for (i, row) in rows.iter().enumerate().skip(first).take(room) {
        let selected = i == cursor;
        let name = format!("{}/{}", row.controller.as_str(), row.key.as_str());
        let mut spans = vec![
            Span::styled(if selected { " ▸ " } else { "   " }, theme.accent()),
            Span::styled(
                pad(ready_cell(row.ready), ready_w),
                ready_style(theme, row.ready),
            ),
            Span::styled(
                format!("{} ", pad(&fit_middle(&name, name_w), name_w)),
                theme.text().add_modifier(Modifier::BOLD),
            ),
            Span::styled(pad(&generations(row), gen_w), theme.text()),
            Span::styled(
                pad(if row.deleting { "deleting" } else { "" }, deleting_w),
                theme.status(DisplayStatus::Cancelled),
            ),
        ];
        if let Some(error) = row.last_error.as_deref()
            && error_w >= 8
        {
            spans.push(Span::styled(
                fit(
                    &format!(
                        "{} in a row: {}",
                        row.consecutive_errors.get(),
                        single_line(error)
                    ),
                    error_w,
                ),
                theme.status(DisplayStatus::Failed),
            ));
        }
        let mut line = Line::from(spans);
        if selected {
            line = line.style(theme.selected());
        }
        let y = list_top + (shown_from + i - first) as u16;
        lines.push(line);
        app.hits.push((
            Rect {
                x: area.x,
                y,
                width: area.width,
                height: 1,
            },
            Hit::ResourceRow((row.controller.to_string(), row.key.to_string())),
        ));
    }
    frame.render_widget(
        Paragraph::new(lines),
        Rect {
            x: area.x,
            y: list_top,
            width: area.width,
            height: list_h as u16,
        },
    );
    let detail = Rect {
        x: area.x,
        y: list_top + list_h as u16,
        width: area.width,
        height: area.height.saturating_sub(list_h as u16 + 3),
    };
    draw_detail(frame, app, detail);
    let pages = rows.len().div_ceil(list_h).max(1);
    let hints = format!(
        "page {}/{pages} · ↑↓ select · Esc/m runs · refreshed every second · ? help · q quit",
        first / list_h + 1
    );
    footer(
        frame,
        app,
        Rect {
            y: area.y + area.height - 1,
            height: 1,
            ..area
        },
        &hints,
    );
}

fn draw_detail(frame: &mut Frame<'_>, app: &App, area: Rect) {
    let theme = app.theme;
    let resources = &app.resources;
    let title = match &resources.cursor {
        Some((controller, key)) => format!(" {controller}/{key} "),
        None => " resource ".to_owned(),
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(theme.border())
        .title(Span::styled(title, theme.text()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let w = inner.width as usize;
    let mut lines: Vec<Line<'_>> = Vec::new();
    if let Some(line) = &resources.detail_error {
        lines.push(Line::styled(
            fit(&single_line(line), w),
            theme.status(DisplayStatus::Failed),
        ));
    }
    match (&resources.cursor, &resources.detail) {
        (None, _) => {}
        (Some(_), None) if resources.detail_error.is_none() => {
            lines.push(Line::styled("loading…", theme.dim()));
        }
        (Some(_), None) => {}
        (Some(_), Some(view)) => {
            for (text, style) in detail_lines(view, app.now_ms, theme) {
                lines.push(Line::styled(fit(&text, w), style));
            }
        }
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn condition_style(theme: Theme, status: ResourceConditionViewStatus) -> Style {
    match status {
        ResourceConditionViewStatus::True => theme.status(DisplayStatus::Completed),
        ResourceConditionViewStatus::False => theme.status(DisplayStatus::Failed),
        ResourceConditionViewStatus::Unknown => theme.status(DisplayStatus::Waiting),
    }
}

fn effect_style(theme: Theme, state: ResourceEffectViewState) -> Style {
    match state {
        ResourceEffectViewState::Applied => theme.status(DisplayStatus::Completed),
        ResourceEffectViewState::Pending => theme.status(DisplayStatus::Running),
        ResourceEffectViewState::Rejected => theme.status(DisplayStatus::Failed),
        ResourceEffectViewState::Indeterminate => theme.status(DisplayStatus::Ambiguous),
    }
}

fn child_style(theme: Theme, state: ResourceChildWorkflowViewState) -> Style {
    match state {
        ResourceChildWorkflowViewState::Running => theme.status(DisplayStatus::Running),
        ResourceChildWorkflowViewState::Waiting => theme.status(DisplayStatus::Waiting),
        ResourceChildWorkflowViewState::Succeeded => theme.status(DisplayStatus::Completed),
        ResourceChildWorkflowViewState::Failed => theme.status(DisplayStatus::Failed),
        ResourceChildWorkflowViewState::Interrupted => theme.status(DisplayStatus::Cancelled),
    }
}

/// When a queue row is next due, from now.
fn due_words(at_ms: u64, now_ms: u64) -> String {
    if at_ms <= now_ms {
        "due now".to_owned()
    } else {
        format!("due in {}s", (at_ms - now_ms).div_ceil(1000))
    }
}

/// The detail's lines, top to bottom: identity, deletion, conditions,
/// queue, effects, child runs, recent events (newest first).
fn detail_lines(view: &ResourceView, now_ms: u64, theme: Theme) -> Vec<(String, Style)> {
    let text = theme.text();
    let dim = theme.dim();
    let heading = theme.text().add_modifier(Modifier::BOLD);
    let mut lines = vec![(
        format!(
            "uid {} · version {} · generation {} (observed {}) · updated {}",
            view.uid.as_str(),
            view.resource_version.get(),
            view.generation.get(),
            view.status.observed_generation.get(),
            age(view.updated_at_ms.get(), now_ms)
        ),
        dim,
    )];
    if let Some(at) = view.deletion_requested_at_ms {
        let finalizers: Vec<&str> = view
            .finalizers
            .as_slice()
            .iter()
            .map(|f| f.as_str())
            .collect();
        let left = if finalizers.is_empty() {
            "no finalizers left".to_owned()
        } else {
            format!("finalizers left: {}", finalizers.join(", "))
        };
        lines.push((
            format!("deletion requested {} · {left}", age(at.get(), now_ms)),
            theme.status(DisplayStatus::Cancelled),
        ));
    }
    let conditions = view.status.conditions.as_slice();
    if conditions.is_empty() {
        lines.push(("conditions: none yet".to_owned(), heading));
    } else {
        lines.push(("conditions".to_owned(), heading));
    }
    for condition in conditions {
        let mut line = format!(
            "  {}={} ({}) since {}",
            condition.type_.as_str(),
            condition.status,
            condition.reason.as_str(),
            age(condition.last_transition_at_ms.get(), now_ms)
        );
        if let Some(message) = condition.message.as_deref() {
            line.push_str(&format!(": {}", single_line(message)));
        }
        lines.push((line, condition_style(theme, condition.status)));
    }
    match &view.queue {
        None => lines.push(("queue: none".to_owned(), heading)),
        Some(queue) => {
            let mut line = match queue.available_at_ms {
                Some(at) => format!("queue: {}", due_words(at.get(), now_ms)),
                None => "queue: idle".to_owned(),
            };
            line.push_str(&format!(" · enqueued {}×", queue.version.get()));
            if queue.claimed {
                line.push_str(" · reconciling");
            }
            let style = if let Some(error) = queue.last_error.as_deref() {
                line.push_str(&format!(
                    " · last error ({} in a row): {}",
                    queue.consecutive_errors.get(),
                    single_line(error)
                ));
                theme.status(DisplayStatus::Failed)
            } else {
                heading
            };
            lines.push((line, style));
        }
    }
    let effects = view.effects.as_slice();
    lines.push((
        if effects.is_empty() {
            "effects: none".to_owned()
        } else {
            "effects".to_owned()
        },
        heading,
    ));
    for effect in effects {
        let mut line = format!(
            "  {} {} {} · generation {} · {}",
            effect.key.as_str(),
            effect.kind.as_str(),
            effect.state,
            effect.generation.get(),
            age(
                effect.completed_at_ms.unwrap_or(effect.started_at_ms).get(),
                now_ms
            )
        );
        if let Some(error) = effect.error.as_deref() {
            line.push_str(&format!(": {}", single_line(error)));
        }
        lines.push((line, effect_style(theme, effect.state)));
    }
    let children = view.child_workflows.as_slice();
    lines.push((
        if children.is_empty() {
            "child runs: none".to_owned()
        } else {
            "child runs".to_owned()
        },
        heading,
    ));
    for child in children {
        lines.push((
            format!(
                "  {} · run {} · {} attempt {} ({})",
                child.state,
                child.run_id.as_str(),
                child.workflow.as_str(),
                child.attempt.get(),
                child.request_key.as_str(),
            ),
            child_style(theme, child.state),
        ));
    }
    let events = view.events.as_slice();
    lines.push((
        if events.is_empty() {
            "recent events: none".to_owned()
        } else {
            "recent events (newest first)".to_owned()
        },
        heading,
    ));
    for event in events.iter().rev() {
        let mut line = format!("  {} {}", age(event.at_ms.get(), now_ms), event.kind);
        if let Some(version) = event.resource_version {
            line.push_str(&format!(" (version {})", version.get()));
        }
        if let Some(detail) = event.detail.as_deref() {
            line.push_str(&format!(": {}", single_line(detail)));
        }
        lines.push((line, text));
    }
    lines
}
