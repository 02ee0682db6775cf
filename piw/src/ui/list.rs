//! The run list (its own screen) and the run browser (beside the graph).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Paragraph};

use super::text::{fit, fit_middle, pad, single_line};
use super::{availability_line, footer, split_line};
use crate::app::{App, Focus, Hit};
use crate::model::{age, status_glyph, status_word};

fn status_cell(row: &protocol::generated::types::RunListRow) -> String {
    let status = row.display.status;
    format!("{} {}", status_glyph(status), status_word(status))
}

fn filter_words(app: &App) -> String {
    let status = app
        .status_filter
        .map_or("all".to_owned(), |s| status_word(s).to_owned());
    let workflow = app.workflow_filter.clone().unwrap_or_else(|| "all".into());
    format!("status: {status} · workflow: {workflow}")
}

/// The run-list screen.
pub(super) fn draw_runs(frame: &mut Frame<'_>, app: &mut App, area: Rect) {
    let theme = app.theme;
    let cells = area.width as usize;
    if area.height < 4 {
        return;
    }
    let visible: Vec<protocol::generated::types::RunListRow> =
        app.visible_rows().into_iter().cloned().collect();
    // Header.
    let left = vec![
        Span::styled(" piw ", theme.accent()),
        Span::styled("runs ", theme.text().add_modifier(Modifier::BOLD)),
        Span::styled(
            format!(
                "· {} of {} · {}",
                visible.len(),
                app.rows.len(),
                filter_words(app)
            ),
            theme.text(),
        ),
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
    // Columns: status, workflow, run, updated, title (as width allows).
    let status_w = 13;
    let updated_w = 9;
    let workflow_w = 16.min(cells.saturating_sub(40)).max(8);
    let fixed = 3 + status_w + 1 + workflow_w + 1 + updated_w + 1;
    let run_w = cells.saturating_sub(fixed + 1).clamp(10, 40);
    let title_w = cells.saturating_sub(fixed + run_w + 2);
    let header = format!(
        "   {}{} {} {}{}",
        pad("STATUS", status_w + 1),
        pad("WORKFLOW", workflow_w),
        pad("RUN", run_w),
        pad("UPDATED", updated_w + 1),
        if title_w >= 8 { "TITLE" } else { "" }
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
    let list_h = area.height.saturating_sub(5) as usize;
    app.page_rows = list_h.max(1);
    let cursor = app.cursor_index().unwrap_or(0);
    let page = cursor / app.page_rows;
    let pages = visible.len().div_ceil(app.page_rows).max(1);
    let first = page * app.page_rows;
    let mut lines = Vec::new();
    if visible.is_empty() {
        let text = if !app.rows_loaded {
            "   loading runs…".to_owned()
        } else if app.rows.is_empty() {
            "   No runs yet. Start one with `pi-workflows start <workflow>`.".to_owned()
        } else {
            format!(
                "   No runs match {} (c clears the filters).",
                filter_words(app)
            )
        };
        lines.push(Line::styled(fit(&text, cells), theme.dim()));
    }
    for (i, row) in visible.iter().enumerate().skip(first).take(app.page_rows) {
        let selected = i == cursor;
        let marker = if selected { " ▸ " } else { "   " };
        let status = row.display.status;
        let mut spans = vec![
            Span::styled(marker, theme.accent()),
            Span::styled(pad(&status_cell(row), status_w + 1), theme.status(status)),
            Span::styled(
                format!("{} ", pad(row.workflow_name.as_str(), workflow_w)),
                theme.text().add_modifier(Modifier::BOLD),
            ),
            Span::styled(
                format!("{} ", pad(&fit_middle(row.run_id.as_str(), run_w), run_w)),
                theme.dim(),
            ),
            Span::styled(
                pad(&age(row.updated_at_ms.get(), app.now_ms), updated_w + 1),
                theme.text(),
            ),
        ];
        if title_w >= 8
            && let Some(title) = &row.title
        {
            spans.push(Span::styled(
                fit(&single_line(title.as_str()), title_w),
                theme.text(),
            ));
        }
        let mut line = Line::from(spans);
        if selected {
            line = line.style(theme.selected());
        }
        lines.push(line);
        app.hits.push((
            Rect {
                x: area.x,
                y: list_top + (i - first) as u16,
                width: area.width,
                height: 1,
            },
            Hit::RunRow(row.run_id.to_string()),
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
    // The selected run in one line: where it is, what it allows, why.
    let detail_y = area.y + area.height - 3;
    frame.render_widget(
        Paragraph::new(Line::styled("─".repeat(cells), theme.border())),
        Rect {
            y: detail_y,
            height: 1,
            ..area
        },
    );
    if let Some(row) = visible.get(cursor) {
        let display = &row.display;
        let mut text = format!(
            " {} {}",
            status_glyph(display.status),
            status_word(display.status)
        );
        if let Some(node) = display.current_node.as_deref() {
            text.push_str(&format!(" at {}", node.as_str()));
        } else if let Some(node) = display.waiting_on.as_deref() {
            text.push_str(&format!(" on {}", node.as_str()));
        }
        text.push_str(&format!(" · {}", row.workflow_name.as_str()));
        let controls: Vec<String> = display
            .controls
            .as_slice()
            .iter()
            .map(|c| crate::model::control_spec(*c).label.to_owned())
            .collect();
        if !controls.is_empty() {
            text.push_str(&format!(" · allows {}", controls.join(", ")));
        }
        if let Some(reason) = display.reason.as_deref() {
            text.push_str(&format!(" · {}", single_line(reason.as_str())));
        }
        frame.render_widget(
            Paragraph::new(Line::styled(
                fit(&text, cells),
                theme.status(display.status),
            )),
            Rect {
                y: detail_y + 1,
                height: 1,
                ..area
            },
        );
    }
    let shown_from = if visible.is_empty() { 0 } else { first + 1 };
    let shown_to = (first + app.page_rows).min(visible.len());
    let hints = format!(
        "{shown_from}–{shown_to} of {} · page {}/{pages} · Enter open · m resources · s status · w workflow · c clear · ? help · q quit",
        visible.len(),
        page + 1
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

/// The run browser beside the graph.
pub(super) fn draw_browser(frame: &mut Frame<'_>, app: &mut App, area: Rect) {
    let theme = app.theme;
    let focused = app.focus == Focus::Browser;
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(if focused {
            theme.accent()
        } else {
            theme.border()
        })
        .title(Span::styled(
            " runs ",
            if focused {
                theme.accent()
            } else {
                theme.text()
            },
        ));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let open = app.run.as_ref().map(|r| r.run_id.clone());
    let visible: Vec<protocol::generated::types::RunListRow> =
        app.visible_rows().into_iter().cloned().collect();
    let rows = inner.height as usize;
    let cursor = app.cursor_index().unwrap_or(0);
    let first = (cursor / rows.max(1)) * rows.max(1);
    let w = inner.width as usize;
    let mut lines = Vec::new();
    for (i, row) in visible.iter().enumerate().skip(first).take(rows) {
        let is_open = open.as_deref() == Some(row.run_id.as_str());
        let status = row.display.status;
        let marker = if is_open { "▸" } else { " " };
        let when = age(row.updated_at_ms.get(), app.now_ms).replace(" ago", "");
        let name_w = w.saturating_sub(4 + when.len() + 1);
        let mut line = Line::from(vec![
            Span::styled(marker, theme.accent()),
            Span::styled(format!("{} ", status_glyph(status)), theme.status(status)),
            Span::styled(pad(row.workflow_name.as_str(), name_w), theme.text()),
            Span::styled(format!(" {when}"), theme.dim()),
        ]);
        if i == cursor && focused {
            line = line.style(theme.selected());
        } else if is_open {
            line = line.style(theme.text().add_modifier(Modifier::BOLD));
        }
        lines.push(line);
        app.hits.push((
            Rect {
                x: inner.x,
                y: inner.y + (i - first) as u16,
                width: inner.width,
                height: 1,
            },
            Hit::BrowserRow(row.run_id.to_string()),
        ));
    }
    if visible.is_empty() {
        lines.push(Line::styled(
            if app.rows_loaded {
                " no runs"
            } else {
                " loading…"
            },
            theme.dim(),
        ));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}
