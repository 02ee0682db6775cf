//! Drawing: a function of the [`App`] state onto a ratatui frame, which
//! also records the hit map the mouse uses. Nothing here changes what the
//! app holds except the view-dependent drawing facts (pan, page size,
//! hits, the density chosen for the height).

mod graph;
mod inspector;
mod list;
mod resources;
pub mod text;
mod timeline;

use ratatui::Frame;
use ratatui::layout::{Constraint, Direction, Layout as Split, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph};

use crate::app::{App, Density, Hit, Overlay, Screen};
use crate::model::{control_spec, status_glyph, status_word};
use crate::source::Availability;
use crate::theme::THEMES;
use text::{fit, fit_middle, width, wrap};

/// Terminal heights below this start in compact density.
const COMPACT_BELOW_ROWS: u16 = 30;
/// Terminal widths from this show the run browser beside the graph.
const BROWSER_FROM_COLUMNS: u16 = 120;

/// Draws the whole screen.
pub fn draw(frame: &mut Frame<'_>, app: &mut App) {
    app.hits.clear();
    let area = frame.area();
    if !app.density_chosen {
        app.density = if area.height < COMPACT_BELOW_ROWS {
            Density::Compact
        } else {
            Density::Box
        };
    }
    let nothing_yet = !app.rows_loaded && app.view().is_none();
    match (&app.availability, nothing_yet) {
        (Availability::Unavailable(line) | Availability::VersionMismatch(line), true) => {
            let line = line.clone();
            unavailable_screen(frame, app, area, &line);
        }
        _ => match app.screen {
            Screen::Runs => list::draw_runs(frame, app, area),
            Screen::Run => draw_run(frame, app, area),
            Screen::Resources => resources::draw_resources(frame, app, area),
        },
    }
    match app.overlay.clone() {
        Some(Overlay::Help) => help(frame, app, area),
        Some(Overlay::Confirm(dialog)) => confirm(frame, app, area, &dialog),
        Some(Overlay::Themes { cursor, .. }) => themes(frame, app, area, cursor),
        None => {}
    }
}

/// The one line of an unreachable or mismatched server, alone on screen.
fn unavailable_screen(frame: &mut Frame<'_>, app: &App, area: Rect, line: &str) {
    let theme = app.theme;
    let lines = wrap(line, area.width.saturating_sub(4) as usize);
    let top = area.height.saturating_sub(lines.len() as u16 + 2) / 2;
    let mut text = vec![Line::styled("piw", theme.accent()), Line::raw("")];
    text.extend(lines.into_iter().map(|l| {
        Line::styled(
            l,
            theme.status(protocol::generated::types::DisplayStatus::Failed),
        )
    }));
    let rect = Rect {
        x: area.x + 2,
        y: area.y + top,
        width: area.width.saturating_sub(4),
        height: area.height.saturating_sub(top),
    };
    frame.render_widget(Paragraph::new(text), rect);
}

/// The availability line, when the server is not current or the run view
/// on screen is stale.
pub(crate) fn availability_line(app: &App) -> Option<(String, Style)> {
    let theme = app.theme;
    if let Some(line) = stale_line(app) {
        return Some((
            format!("stale view · {line}"),
            theme.status(protocol::generated::types::DisplayStatus::Failed),
        ));
    }
    match &app.availability {
        Availability::Unavailable(line) | Availability::VersionMismatch(line) => Some((
            format!("disconnected · {line}"),
            theme.status(protocol::generated::types::DisplayStatus::Failed),
        )),
        Availability::Connecting => Some(("connecting…".into(), theme.dim())),
        Availability::Available => None,
    }
}

/// Why the run view on screen is stale, while it is.
fn stale_line(app: &App) -> Option<&str> {
    (app.screen == Screen::Run)
        .then_some(app.run.as_ref()?.stale.as_deref())
        .flatten()
}

/// The footer: a notice, the availability line, or key hints.
pub(crate) fn footer(frame: &mut Frame<'_>, app: &App, area: Rect, hints: &str) {
    let theme = app.theme;
    let (text, style) = if let Some((toast, _)) = &app.toast {
        (toast.clone(), theme.accent())
    } else if let Some(line) =
        availability_line(app).filter(|_| app.availability != Availability::Connecting)
    {
        line
    } else {
        (hints.to_owned(), theme.dim())
    };
    let text = fit(&format!(" {text}"), area.width as usize);
    frame.render_widget(Paragraph::new(Line::styled(text, style)), area);
}

/// Left and right parts of one line; the left is cut first.
pub(crate) fn split_line<'a>(left: Vec<Span<'a>>, right: Vec<Span<'a>>, cells: usize) -> Line<'a> {
    let right_w: usize = right.iter().map(|s| width(&s.content)).sum();
    let budget = cells.saturating_sub(right_w + 1);
    let mut used = 0;
    let mut spans = Vec::new();
    for span in left {
        let w = width(&span.content);
        if used + w <= budget {
            used += w;
            spans.push(span);
        } else {
            let room = budget.saturating_sub(used);
            if room > 0 {
                spans.push(Span::styled(fit(&span.content, room), span.style));
                used += room;
            }
            break;
        }
    }
    if right_w < cells {
        spans.push(Span::raw(" ".repeat(cells.saturating_sub(used + right_w))));
        spans.extend(right);
    }
    Line::from(spans)
}

fn draw_run(frame: &mut Frame<'_>, app: &mut App, area: Rect) {
    let rows = Split::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(6),
            Constraint::Length(2),
            Constraint::Length(1),
        ])
        .split(area);
    run_header(frame, app, rows[0]);
    controls_row(frame, app, rows[1]);
    let browser = app.browser.unwrap_or(area.width >= BROWSER_FROM_COLUMNS);
    let body = if browser {
        let cols = Split::default()
            .direction(Direction::Horizontal)
            .constraints([Constraint::Length(34), Constraint::Min(20)])
            .split(rows[2]);
        list::draw_browser(frame, app, cols[0]);
        cols[1]
    } else {
        rows[2]
    };
    let inspector_h = (body.height / 4)
        .clamp(7, 16)
        .min(body.height.saturating_sub(5));
    let main = Split::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Min(5), Constraint::Length(inspector_h)])
        .split(body);
    graph::draw(frame, app, main[0]);
    inspector::draw(frame, app, main[1]);
    timeline::draw(frame, app, rows[3]);
    footer(
        frame,
        app,
        rows[4],
        "? help · Tab focus · arrows pan · n node · z density · f follow · [ ] step · space play · Esc runs · q quit",
    );
}

fn run_header(frame: &mut Frame<'_>, app: &App, area: Rect) {
    let theme = app.theme;
    let cells = area.width as usize;
    let Some(run) = app.run.as_ref() else { return };
    let Some(view) = run.view.as_deref() else {
        let text = match &run.missing {
            Some(line) => line.clone(),
            None => format!("loading run {}…", run.run_id),
        };
        frame.render_widget(
            Paragraph::new(Line::from(vec![
                Span::styled(" piw ", theme.accent()),
                Span::styled(fit(&text, cells.saturating_sub(6)), theme.text()),
            ])),
            area,
        );
        return;
    };
    let status = view.display.status;
    let mut left = vec![
        Span::styled(" piw ", theme.accent()),
        Span::styled(
            format!("{} {} ", status_glyph(status), status_word(status)),
            theme.status(status),
        ),
    ];
    if let Some(node) = view.display.current_node.as_deref() {
        left.push(Span::styled(format!("at {} ", node.as_str()), theme.text()));
    } else if let Some(node) = view.display.waiting_on.as_deref() {
        left.push(Span::styled(format!("on {} ", node.as_str()), theme.text()));
    }
    left.push(Span::styled(
        format!("· {} ", view.workflow_name.as_str()),
        theme.text().add_modifier(Modifier::BOLD),
    ));
    if let Some(title) = &view.title {
        left.push(Span::styled(format!("— {} ", title.as_str()), theme.text()));
    }
    left.push(Span::styled(
        format!("· {}", view.run_id.as_str()),
        theme.dim(),
    ));
    let activity = match view.display.activity {
        protocol::generated::types::Activity::None => None,
        protocol::generated::types::Activity::Starting => Some("starting"),
        protocol::generated::types::Activity::Runner => Some("runner"),
        protocol::generated::types::Activity::ModelTurn => Some("model turn"),
        protocol::generated::types::Activity::Validating => Some("validating"),
    };
    let mut right = Vec::new();
    if let Some(activity) = activity {
        right.push(Span::styled(format!("{activity} · "), theme.text()));
    }
    right.push(Span::styled(
        format!("rev {} ", view.revision.get()),
        theme.dim(),
    ));
    let (mode, style) = match (&app.availability, app.replay.live) {
        (Availability::Unavailable(_) | Availability::VersionMismatch(_), _) => (
            "○ disconnected ",
            theme.status(protocol::generated::types::DisplayStatus::Failed),
        ),
        (_, true) if run.stale.is_some() => (
            "◌ stale ",
            theme.status(protocol::generated::types::DisplayStatus::Failed),
        ),
        (_, true) => ("● live ", theme.path()),
        (_, false) => ("◆ replay ", theme.accent()),
    };
    right.push(Span::styled(mode, style));
    frame.render_widget(Paragraph::new(split_line(left, right, cells)), area);
}

fn controls_row(frame: &mut Frame<'_>, app: &mut App, area: Rect) {
    let theme = app.theme;
    let Some(view) = app.view() else { return };
    let mut spans = vec![Span::styled(" ", theme.dim())];
    let mut x = area.x + 1;
    let mut hits = Vec::new();
    let controls = view.display.controls.as_slice().to_vec();
    if controls.is_empty() {
        spans.push(Span::styled("no controls", theme.dim()));
        x += 11;
    }
    for control in controls {
        let spec = control_spec(control);
        let label = format!("[{}] {}", spec.key, spec.label);
        let w = width(&label) as u16;
        let style = if spec.operation.is_some() {
            theme.accent()
        } else {
            theme.dim()
        };
        hits.push((
            Rect {
                x,
                y: area.y,
                width: w,
                height: 1,
            },
            Hit::ControlButton(control),
        ));
        spans.push(Span::styled(label, style));
        spans.push(Span::raw("  "));
        x += w + 2;
    }
    let reason = view
        .display
        .reason
        .as_deref()
        .map(|r| r.as_str().to_owned())
        .or_else(|| {
            view.display
                .reason_notice
                .as_deref()
                .map(|r| r.as_str().to_owned())
        });
    if let Some(reason) = reason {
        let room = (area.x + area.width).saturating_sub(x + 3) as usize;
        spans.push(Span::styled("· ", theme.dim()));
        spans.push(Span::styled(
            fit(&text::single_line(&reason), room),
            theme.status(view.display.status),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
    app.hits.extend(hits);
}

/// A centred rectangle of at most `w`×`h` cells.
fn centred(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}

fn overlay_block<'a>(app: &App, title: &'a str) -> Block<'a> {
    Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(app.theme.accent())
        .title(Span::styled(format!(" {title} "), app.theme.accent()))
}

/// The key and mouse reference.
pub const HELP: &[(&str, &str)] = &[
    ("q, Ctrl-C", "quit (the terminal is restored) · ? this help"),
    (",", "theme picker (↑↓ preview, Enter keep, Esc restore)"),
    ("Enter / Esc", "open the run · back to the run list"),
    ("s / w / c", "run list: filter by status / workflow / clear"),
    (
        "m",
        "run list ↔ resources: the list and the selected one's detail",
    ),
    (
        "↑↓ PgUp PgDn",
        "move, page (list) · pan (graph) · scroll (inspector)",
    ),
    (
        "Tab / b",
        "focus browser → graph → inspector / show the browser",
    ),
    ("arrows, hjkl", "pan the graph; 0 resets the pan"),
    ("f", "follow: centre the running or waiting node"),
    ("n / N", "select the next / previous node"),
    ("z, +, -", "box ↔ compact node cards"),
    ("t, 1-6", "inspector tabs; v: trace of all ↔ the node"),
    ("[ / ]", "previous / next step (replay)"),
    ("space", "play / pause the replay"),
    ("{ / }", "slower / faster (1×, 2×, 5×, 10×)"),
    ("Home, g", "replay from the first step"),
    ("End, G, L", "rejoin live"),
    ("p r x R", "pause resume cancel restart (when offered)"),
    (
        "a A o E",
        "answer, human answer, activate, recover effect (when offered)",
    ),
    (
        "mouse",
        "click rows, nodes, tabs, controls, timeline; drag pans",
    ),
];

fn help(frame: &mut Frame<'_>, app: &App, area: Rect) {
    let theme = app.theme;
    let key_w = HELP.iter().map(|(k, _)| width(k)).max().unwrap_or(0);
    let inner_w = area.width.saturating_sub(4).min(86) as usize;
    let mut lines: Vec<Line<'_>> = Vec::new();
    for (key, what) in HELP {
        let what_w = inner_w.saturating_sub(key_w + 3);
        for (i, part) in wrap(what, what_w.max(8)).into_iter().enumerate() {
            let key_text = if i == 0 { *key } else { "" };
            lines.push(Line::from(vec![
                Span::styled(format!(" {:<key_w$}  ", key_text), theme.accent()),
                Span::styled(part, theme.text()),
            ]));
        }
    }
    let rect = centred(area, inner_w as u16 + 2, lines.len() as u16 + 2);
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines).block(overlay_block(app, "piw · keys (Esc closes)")),
        rect,
    );
}

fn confirm(frame: &mut Frame<'_>, app: &App, area: Rect, dialog: &crate::app::Dialog) {
    if dialog.control == protocol::generated::types::Control::HumanAnswer {
        decision_dialog(frame, app, area, dialog);
        return;
    }
    let theme = app.theme;
    let spec = control_spec(dialog.control);
    let workflow = app
        .view()
        .map(|v| v.workflow_name.to_string())
        .unwrap_or_default();
    let inner_w = area.width.saturating_sub(6).min(64) as usize;
    let run = fit_middle(&dialog.run_id, inner_w.saturating_sub(4));
    let (question, consequence) = match dialog.control {
        protocol::generated::types::Control::Pause => (
            format!("Pause {workflow}?"),
            "The server stores the pause; resume it later with r.",
        ),
        protocol::generated::types::Control::Resume => (
            format!("Resume {workflow}?"),
            "The server schedules the run again.",
        ),
        protocol::generated::types::Control::Cancel => (
            format!("Cancel {workflow}?"),
            "The run stops for good; this cannot be undone.",
        ),
        protocol::generated::types::Control::Restart => (
            format!("Restart {workflow}?"),
            "The server starts a new run from the failed one.",
        ),
        protocol::generated::types::Control::Answer => (
            format!("Answer the checkpoint of {workflow}"),
            "The answer (JSON) becomes the input of the continuation run.",
        ),
        protocol::generated::types::Control::RecoverEffect => (
            format!("Review the ambiguous effect of {workflow}"),
            "It may have applied without a receipt: check the external system first. \
             c: it applied; the server records it and the run goes on without applying it again. \
             r: it did not; the server applies it again (a duplicate is possible).",
        ),
        protocol::generated::types::Control::Activate => (
            format!("Activate {workflow}?"),
            "The held run is queued; the server starts it when a slot is free.",
        ),
        protocol::generated::types::Control::HumanAnswer
        | protocol::generated::types::Control::Submit
        | protocol::generated::types::Control::Update => {
            (format!("{} {workflow}?", spec.label), "")
        }
    };
    let mut lines = vec![
        Line::styled(
            format!(" {question}"),
            theme.text().add_modifier(Modifier::BOLD),
        ),
        Line::styled(format!(" run {run}"), theme.dim()),
    ];
    if let Some(effect) = &dialog.effect {
        let line = format!(
            "{} at {} · attempt {} · {}",
            effect.effect_type.as_str(),
            effect.node_id.as_str(),
            effect.attempt_number.get(),
            effect.effect_id.as_str()
        );
        lines.push(Line::styled(
            format!(" {}", fit_middle(&line, inner_w.saturating_sub(2))),
            theme.text(),
        ));
    }
    for part in wrap(consequence, inner_w.saturating_sub(2)) {
        lines.push(Line::styled(format!(" {part}"), theme.text()));
    }
    lines.push(Line::raw(""));
    if dialog.control == protocol::generated::types::Control::Answer {
        let shown = text::fit_left(&dialog.input, inner_w.saturating_sub(6));
        lines.push(Line::from(vec![
            Span::styled(" > ", theme.accent()),
            Span::styled(format!("{shown}█"), theme.text()),
        ]));
        if let Some(error) = &dialog.error {
            for part in wrap(error, inner_w.saturating_sub(2)) {
                lines.push(Line::styled(
                    format!(" {part}"),
                    theme.status(protocol::generated::types::DisplayStatus::Failed),
                ));
            }
        }
        lines.push(Line::raw(""));
        lines.push(answer_hint(app, dialog, " Enter send · Esc keep waiting"));
    } else if dialog.effect.is_some() {
        lines.push(Line::styled(
            " [c] it applied · [r] apply it again · [n] keep as is",
            theme.accent(),
        ));
    } else {
        lines.push(Line::styled(
            format!(" [y] {} · [n] keep as is", spec.label),
            theme.accent(),
        ));
    }
    lines.push(Line::styled(
        format!(
            " revision {} · key {}",
            dialog.expected_revision,
            fit_middle(&dialog.idempotency_key, inner_w.saturating_sub(20))
        ),
        theme.dim(),
    ));
    let title = format!("{} · confirm", spec.label);
    let rect = centred(area, inner_w as u16 + 2, lines.len() as u16 + 2);
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines).block(overlay_block(app, &title)),
        rect,
    );
}

/// The last action line of an answer dialog: its keys, or that it waits
/// for the server's outcome.
fn answer_hint<'a>(app: &App, dialog: &crate::app::Dialog, keys: &'a str) -> Line<'a> {
    if dialog.sending {
        Line::styled(
            " sending… waiting for the server's outcome (Esc closes)",
            app.theme.dim(),
        )
    } else {
        Line::styled(keys, app.theme.accent())
    }
}

/// Summary lines a decision dialog shows at most.
const SUMMARY_LINES: usize = 4;

/// A protected decision's answer dialog: what the view's `decision` says
/// (title, summary, node, expiry), its typed choices with the chosen one
/// marked, the chosen choice's text field when it takes text, the server's
/// refusal, and the request digest and key the answer goes with.
fn decision_dialog(frame: &mut Frame<'_>, app: &App, area: Rect, dialog: &crate::app::Dialog) {
    use protocol::generated::types::DisplayStatus;
    let theme = app.theme;
    let Some(decision) = dialog.decision.as_ref() else {
        return;
    };
    let inner_w = area.width.saturating_sub(6).min(72) as usize;
    let room = inner_w.saturating_sub(2);
    let failed = theme.status(DisplayStatus::Failed);
    let mut lines = vec![
        Line::styled(
            format!(" {}", fit(decision.title.as_str(), room)),
            theme.text().add_modifier(Modifier::BOLD),
        ),
        Line::styled(
            format!(
                " run {}",
                fit_middle(&dialog.run_id, room.saturating_sub(4))
            ),
            theme.dim(),
        ),
    ];
    let summary = wrap(decision.summary.as_str(), room);
    let cut = summary.len() > SUMMARY_LINES;
    for (i, part) in summary.into_iter().take(SUMMARY_LINES).enumerate() {
        let part = if cut && i + 1 == SUMMARY_LINES {
            fit(&format!("{part} …"), room)
        } else {
            part
        };
        lines.push(Line::styled(format!(" {part}"), theme.text()));
    }
    let mut facts = format!("node {}", decision.node_id.as_str());
    if let Some(at) = decision.expires_at_ms.map(|at| at.get()) {
        let left = match at.checked_sub(app.now_ms).filter(|left| *left > 0) {
            Some(left) => format!("in {}", crate::model::duration(left)),
            None => "passed".to_owned(),
        };
        facts.push_str(&format!(
            " · expires {} UTC ({left})",
            crate::model::clock(at)
        ));
    }
    lines.push(Line::styled(format!(" {}", fit(&facts, room)), theme.dim()));
    // The view of the run no longer shows this decision (answered, paused,
    // another one): the server says whether it still takes this answer.
    let current = app
        .view()
        .filter(|view| view.run_id.as_str() == dialog.run_id)
        .and_then(|view| view.decision.as_ref());
    if current.is_none_or(|now| {
        now.decision_id != decision.decision_id || now.request_digest != decision.request_digest
    }) {
        for part in wrap(
            "the run's view no longer shows this decision as pending; the server decides whether it still takes this answer",
            room,
        ) {
            lines.push(Line::styled(format!(" {part}"), theme.accent()));
        }
    }
    lines.push(Line::raw(""));
    let label_w = room.saturating_sub(4);
    for (i, choice) in decision.choices.as_slice().iter().enumerate() {
        let chosen = i == dialog.choice;
        let mut entry = format!("{} ({})", choice.label.as_str(), choice.id.as_str());
        if choice.input.is_some() {
            entry.push_str(" · takes text");
        }
        if decision.default_choice.as_ref() == Some(&choice.id) {
            entry.push_str(" · default at expiry");
        }
        let (marker, style) = if chosen {
            ("▸ ", theme.selected())
        } else {
            ("  ", theme.text())
        };
        lines.push(Line::from(vec![
            Span::raw(" "),
            Span::styled(format!("{marker}{}", fit(&entry, label_w)), style),
        ]));
    }
    if let Some(input) = dialog.chosen().and_then(|choice| choice.input.as_ref()) {
        lines.push(Line::raw(""));
        let bounds = format!(
            " ({}–{} characters)",
            input.min_length.get(),
            input.max_length.get()
        );
        lines.push(Line::styled(
            format!(
                " {}",
                fit(&format!("{}{bounds}", input.prompt.as_str()), room)
            ),
            theme.text(),
        ));
        let shown = text::fit_left(&dialog.input, room.saturating_sub(4));
        lines.push(Line::from(vec![
            Span::styled(" > ", theme.accent()),
            Span::styled(format!("{shown}█"), theme.text()),
        ]));
    }
    for (message, style) in [
        (dialog.error.as_deref(), failed),
        (dialog.note.as_deref(), theme.accent()),
    ] {
        for part in message.map(|m| wrap(m, room)).unwrap_or_default() {
            lines.push(Line::styled(format!(" {part}"), style));
        }
    }
    lines.push(Line::raw(""));
    let takes_text = dialog.chosen().is_some_and(|choice| choice.input.is_some());
    lines.push(answer_hint(
        app,
        dialog,
        if takes_text {
            " ↑↓ choose · type the text · Enter send · Esc keep waiting"
        } else {
            " ↑↓ choose · Enter send · Esc keep waiting"
        },
    ));
    lines.push(Line::styled(
        format!(
            " request {} · key {}",
            fit_middle(decision.request_digest.as_str(), 22),
            fit_middle(&dialog.idempotency_key, room.saturating_sub(38))
        ),
        theme.dim(),
    ));
    let title = format!("{} · confirm", control_spec(dialog.control).label);
    let rect = centred(area, inner_w as u16 + 2, lines.len() as u16 + 2);
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines).block(overlay_block(app, &title)),
        rect,
    );
}

fn themes(frame: &mut Frame<'_>, app: &App, area: Rect, cursor: usize) {
    let theme = app.theme;
    let lines: Vec<Line<'_>> = THEMES
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let marker = if i == cursor { "▸ " } else { "  " };
            let style = if i == cursor {
                theme.selected()
            } else {
                theme.text()
            };
            Line::styled(format!(" {marker}{:<20}", t.name), style)
        })
        .collect();
    let rect = centred(area, 28, lines.len() as u16 + 2);
    frame.render_widget(Clear, rect);
    frame.render_widget(
        Paragraph::new(lines).block(overlay_block(app, "theme")),
        rect,
    );
}
