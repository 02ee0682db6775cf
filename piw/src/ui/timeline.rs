//! The two-line replay timeline: play button and speed, the step bar (click
//! or drag to seek), and the Live button that rejoins.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::text::{fit, width};
use crate::app::{App, Hit, SPEEDS};
use crate::model::{clock, outcome_word};

pub(super) fn draw(frame: &mut Frame<'_>, app: &mut App, area: Rect) {
    let theme = app.theme;
    if area.height < 2 {
        return;
    }
    let total = app.run.as_ref().map_or(0, |run| run.model.steps.len());
    let shown = app.steps_shown();
    let play = if app.replay.playing { " ‖ " } else { " ▶ " };
    let speed = format!("{}× ", SPEEDS[app.replay.speed]);
    let live_label = if app.replay.live {
        " ● LIVE ".to_owned()
    } else if app.run_active() {
        " [L] Live ".to_owned()
    } else {
        " [L] Latest ".to_owned()
    };
    let left_w = width(play) + width(&speed) + 1;
    let right_w = width(&live_label) + 1;
    let bar_w = (area.width as usize).saturating_sub(left_w + right_w + 1);
    let mut spans = vec![
        Span::styled(play, theme.accent()),
        Span::styled(speed.clone(), theme.text()),
        Span::styled("│", theme.border()),
    ];
    let cursor_col = if total == 0 || bar_w == 0 {
        None
    } else {
        Some(((shown.max(1) - 1) * bar_w.saturating_sub(1)) / (total.max(2) - 1).max(1))
    };
    let mut bar = String::new();
    let mut bar_spans = Vec::new();
    for col in 0..bar_w {
        let (c, style) = match cursor_col {
            None => ("─", theme.border()),
            Some(at) if col < at => ("━", theme.path()),
            Some(at) if col == at => {
                if app.replay.live {
                    ("●", theme.path())
                } else {
                    ("◆", theme.accent())
                }
            }
            Some(_) => ("─", theme.border()),
        };
        bar.push_str(c);
        bar_spans.push(Span::styled(c, style));
    }
    spans.extend(bar_spans);
    spans.push(Span::styled("│", theme.border()));
    spans.push(Span::styled(
        live_label.clone(),
        if app.replay.live {
            theme.path()
        } else {
            theme.accent()
        },
    ));
    frame.render_widget(
        Paragraph::new(Line::from(spans)),
        Rect { height: 1, ..area },
    );
    app.hits.push((
        Rect {
            x: area.x,
            y: area.y,
            width: width(play) as u16,
            height: 1,
        },
        Hit::PlayButton,
    ));
    if bar_w > 0 && total > 0 {
        app.hits.push((
            Rect {
                x: area.x + left_w as u16,
                y: area.y,
                width: bar_w as u16,
                height: 1,
            },
            Hit::Timeline { total },
        ));
    }
    app.hits.push((
        Rect {
            x: area.x + (left_w + bar_w + 1) as u16,
            y: area.y,
            width: width(&live_label) as u16,
            height: 1,
        },
        Hit::LiveButton,
    ));
    // Second line: where the cursor is.
    let text = match app
        .run
        .as_ref()
        .and_then(|run| run.model.steps.get(shown.checked_sub(1)?))
    {
        Some(step) => {
            let outcome = step.outcome.map_or("unfinished", outcome_word);
            let attempt = step
                .attempts
                .iter()
                .map(|a| a.attempt_number.get())
                .max()
                .unwrap_or(1);
            let mode = if app.replay.live { "live" } else { "replay" };
            format!(
                " {mode} · step {shown}/{total} · {} · visit {} · try {attempt} · {} · {outcome}   [ ] step · space play · {{ }} speed",
                step.node_id.as_str(),
                step.visit.get(),
                clock(step.started_at_ms.get())
            )
        }
        None => " no steps yet".to_owned(),
    };
    frame.render_widget(
        Paragraph::new(Line::styled(fit(&text, area.width as usize), theme.dim())),
        Rect {
            y: area.y + 1,
            height: 1,
            ..area
        },
    );
}
