//! The boxed graph: fixed-size node cards and routed edges, drawn from the
//! cached layout into the visible window only (so a 1,000-node graph costs
//! what is on screen, not what exists).

use std::collections::BTreeSet;

use ratatui::Frame;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::Span;
use ratatui::widgets::{Block, BorderType, Borders};

use super::text::{fit, fit_left, width};
use crate::app::{App, Density, Focus, Hit};
use crate::layout::Route;
use crate::model::{CardStatus, duration, type_glyph, type_word};
use crate::theme::Theme;

const N: u8 = 1;
const E: u8 = 2;
const S: u8 = 4;
const W: u8 = 8;

fn line_char(mask: u8) -> &'static str {
    match mask {
        m if m == N | S || m == N || m == S => "│",
        m if m == E | W || m == E || m == W => "─",
        m if m == S | E => "╭",
        m if m == S | W => "╮",
        m if m == N | E => "╰",
        m if m == N | W => "╯",
        m if m == N | S | E => "├",
        m if m == N | S | W => "┤",
        m if m == E | W | S => "┬",
        m if m == E | W | N => "┴",
        0 => " ",
        _ => "┼",
    }
}

/// The border characters of a card: (corners tl tr bl br, horizontal, vertical).
fn border_set(running: bool, selected: bool) -> [&'static str; 6] {
    if running {
        ["┏", "┓", "┗", "┛", "━", "┃"]
    } else if selected {
        ["╔", "╗", "╚", "╝", "═", "║"]
    } else {
        ["╭", "╮", "╰", "╯", "─", "│"]
    }
}

/// Writes `text` at `(x, y)` of the window, clipped to `clip`.
fn put(buf: &mut Buffer, clip: Rect, x: i32, y: i32, text: &str, style: Style) {
    if y < clip.y as i32 || y >= (clip.y + clip.height) as i32 {
        return;
    }
    let mut cx = x;
    for c in text.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0) as i32;
        if w == 0 {
            continue;
        }
        if cx >= clip.x as i32 && cx + w <= (clip.x + clip.width) as i32 {
            let cell = &mut buf[(cx as u16, y as u16)];
            cell.set_char(c);
            cell.set_style(style);
        }
        cx += w;
    }
}

struct Window {
    /// Screen rectangle of the graph window.
    rect: Rect,
    /// The layout cell at the window's top-left.
    origin: (i32, i32),
}

impl Window {
    fn to_screen(&self, (x, y): (i32, i32)) -> (i32, i32) {
        (
            x - self.origin.0 + self.rect.x as i32,
            y - self.origin.1 + self.rect.y as i32,
        )
    }

    fn contains_layout(&self, (x, y): (i32, i32)) -> bool {
        let (sx, sy) = self.to_screen((x, y));
        sx >= self.rect.x as i32
            && sx < (self.rect.x + self.rect.width) as i32
            && sy >= self.rect.y as i32
            && sy < (self.rect.y + self.rect.height) as i32
    }
}

/// Draws the graph pane.
pub(super) fn draw(frame: &mut Frame<'_>, app: &mut App, area: Rect) {
    let theme = app.theme;
    let focused = app.focus == Focus::Graph;
    let mut title = format!(
        " graph · {} · {} ",
        app.density.word(),
        if app.follow { "follow" } else { "free" }
    );
    // A definition that could not be fetched or read: the graph says so.
    if let Some(crate::app::ContentState::Failed(line)) = app
        .run
        .as_ref()
        .and_then(|run| run.content(run.view.as_ref()?.definition.digest.as_str()))
    {
        title.push_str(&format!("· {line} "));
    }
    if !app.replay.live {
        title.push_str(&format!(
            "· replay step {}/{} ",
            app.steps_shown(),
            app.run.as_ref().map_or(0, |r| r.model.steps.len())
        ));
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Rounded)
        .border_style(if focused {
            theme.accent()
        } else {
            theme.border()
        })
        .title(Span::styled(
            title,
            if focused {
                theme.accent()
            } else {
                theme.text()
            },
        ));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    app.hits.push((inner, Hit::Graph));
    let density = app.density;
    let follow_node = app.follow_node();
    let inspected = app.inspected_node();
    let steps_shown = app.steps_shown();
    let live = app.replay.live;
    let now = app.now_ms;
    let (follow, center_selected) = (app.follow, app.center_on_selected);
    let mut pan = app.pan;
    let Some(run) = app.run.as_mut() else { return };
    if run.view.is_none() {
        let text = run
            .missing
            .clone()
            .unwrap_or_else(|| "loading the run view…".into());
        put(
            frame.buffer_mut(),
            inner,
            inner.x as i32 + 1,
            inner.y as i32,
            &fit(&text, inner.width as usize),
            theme.dim(),
        );
        return;
    }
    let Some(layout) = run.layout(density).cloned() else {
        return;
    };
    let view = run.view.as_deref().expect("checked above");
    if view.nodes.is_empty() {
        put(
            frame.buffer_mut(),
            inner,
            inner.x as i32 + 1,
            inner.y as i32,
            "the run has no graph nodes yet",
            theme.dim(),
        );
        return;
    }
    // Where the window is.
    let (w, h) = (inner.width as i32, inner.height as i32);
    let centre_on = if center_selected {
        inspected.clone()
    } else if follow {
        follow_node.clone()
    } else {
        None
    };
    let centre_on = centre_on
        .and_then(|id| run.model.index.get(&id).copied())
        .and_then(|i| layout.centre(i));
    if let Some((cx, cy)) = centre_on {
        pan = (cx - w / 2, cy - h / 2);
    }
    let fit_x = layout.width <= w;
    let fit_y = layout.height <= h;
    pan.0 = if fit_x {
        (layout.width - w) / 2
    } else {
        pan.0.clamp(-w / 2, layout.width - w / 2)
    };
    pan.1 = if fit_y {
        0
    } else if centre_on.is_some() {
        // Following: no empty rows above the first layer or below the last.
        pan.1.clamp(0, layout.height - h)
    } else {
        pan.1.clamp(-h / 2, layout.height - h / 2)
    };
    let window = Window {
        rect: inner,
        origin: pan,
    };

    let ids: Vec<&str> = view.nodes.iter().map(|n| n.id.as_str()).collect();
    let taken: BTreeSet<(String, String)> = run.model.taken_edges(view, steps_shown);
    let is_taken =
        |route: &Route| taken.contains(&(ids[route.from].to_owned(), ids[route.to].to_owned()));

    // Edges: a direction mask and a style per visible cell.
    let mut masks = vec![0u8; (w * h).max(0) as usize];
    let mut hot = vec![false; masks.len()];
    let index = |(sx, sy): (i32, i32)| -> Option<usize> {
        let (lx, ly) = (sx - inner.x as i32, sy - inner.y as i32);
        (lx >= 0 && ly >= 0 && lx < w && ly < h).then(|| (ly * w + lx) as usize)
    };
    for route in &layout.routes {
        let taken_route = is_taken(route);
        let mut points = route.points.clone();
        // Attach the line to the card above its first point.
        if let Some(&(x, y)) = points.first() {
            points.insert(0, (x, y - 1));
        }
        for pair in points.windows(2) {
            let (a, b) = (window.to_screen(pair[0]), window.to_screen(pair[1]));
            let (left, right) = (inner.x as i32, (inner.x + inner.width) as i32 - 1);
            let (top, bottom) = (inner.y as i32, (inner.y + inner.height) as i32 - 1);
            if a.1 == b.1 {
                // Horizontal: only the cells inside the window.
                let (lo, hi) = (a.0.min(b.0), a.0.max(b.0));
                if a.1 < top || a.1 > bottom {
                    continue;
                }
                for x in lo.max(left)..=hi.min(right) {
                    if let Some(i) = index((x, a.1)) {
                        masks[i] |= if x > lo { W } else { 0 } | if x < hi { E } else { 0 };
                        hot[i] |= taken_route;
                    }
                }
            } else {
                let (lo, hi) = (a.1.min(b.1), a.1.max(b.1));
                if a.0 < left || a.0 > right {
                    continue;
                }
                for y in lo.max(top)..=hi.min(bottom) {
                    if let Some(i) = index((a.0, y)) {
                        masks[i] |= if y > lo { N } else { 0 } | if y < hi { S } else { 0 };
                        hot[i] |= taken_route;
                    }
                }
            }
        }
    }
    let buf = frame.buffer_mut();
    for (i, &mask) in masks.iter().enumerate() {
        if mask == 0 {
            continue;
        }
        let (sx, sy) = (inner.x as i32 + i as i32 % w, inner.y as i32 + i as i32 / w);
        let style = if hot[i] { theme.path() } else { theme.border() };
        put(buf, inner, sx, sy, line_char(mask), style);
    }
    for route in &layout.routes {
        if let Some(&end) = route.points.last()
            && window.contains_layout(end)
        {
            let (sx, sy) = window.to_screen(end);
            let style = if is_taken(route) {
                theme.path()
            } else {
                theme.border()
            };
            put(buf, inner, sx, sy, "▼", style);
        }
    }
    for label in &layout.labels {
        let (sx, sy) = window.to_screen((label.x, label.y));
        let taken_here = layout
            .routes
            .iter()
            .any(|r| r.points.last() == Some(&(label.x - 2, label.y)) && is_taken(r));
        let style = if taken_here {
            theme.path()
        } else {
            theme.dim()
        };
        put(
            buf,
            inner,
            sx,
            sy,
            &fit(&label.text, label.max_width.max(0) as usize),
            style,
        );
    }
    // The switch expression beside a switch's stem (when the definition
    // is known): `on $result.outcome`.
    if let Some(topology) = run.topology.as_ref() {
        for edge in &topology.edges {
            if let protocol::generated::types::TopologyEdge::Switch { from, on, .. } = edge
                && let Some(&i) = run.model.index.get(from.as_str())
            {
                let card = layout.cards[i];
                let x = card.x + layout.size.width / 2 + 2;
                let y = card.y + layout.size.height;
                let (sx, sy) = window.to_screen((x, y));
                put(
                    buf,
                    inner,
                    sx,
                    sy,
                    &fit(
                        &format!("on {}", on.as_str()),
                        (layout.size.width - 2) as usize,
                    ),
                    theme.dim().add_modifier(Modifier::ITALIC),
                );
            }
        }
    }

    // Cards.
    let size = layout.size;
    let mut hits = Vec::new();
    for card in &layout.cards {
        let (sx, sy) = window.to_screen((card.x, card.y));
        if sx + size.width <= inner.x as i32
            || sx >= (inner.x + inner.width) as i32
            || sy + size.height <= inner.y as i32
            || sy >= (inner.y + inner.height) as i32
        {
            continue;
        }
        let node = &view.nodes[card.node];
        let id = node.id.as_str();
        let facts = &run.model.nodes[card.node];
        let focus_here = live && run.model.focus_node(view) == Some(id);
        let status = if !live {
            CardStatus::Node(run.model.state_at(id, steps_shown))
        } else if focus_here {
            CardStatus::Display(view.display.status)
        } else {
            CardStatus::Node(node.state)
        };
        let replay_focus = !live && follow_node.as_deref() == Some(id);
        let selected = inspected.as_deref() == Some(id);
        let style = match status {
            CardStatus::Display(s) => theme.status(s),
            CardStatus::Node(s) => theme.node(s),
        };
        let border_style = if replay_focus || selected {
            theme.accent()
        } else {
            style
        };
        let has_out = layout.routes.iter().any(|r| r.from == card.node);
        let transition = run.topology.as_ref().and_then(|t| {
            t.nodes
                .iter()
                .find(|n| n.id.as_str() == id)
                .and_then(|n| n.include_transition)
        });
        let visits = if live {
            node.visits.get()
        } else {
            run.model.steps[..steps_shown.min(run.model.steps.len())]
                .iter()
                .filter(|s| s.node_id.as_str() == id)
                .count() as u64
        };
        draw_card(
            buf,
            inner,
            &theme,
            CardDraw {
                x: sx,
                y: sy,
                density,
                id,
                status,
                node_type: node.node_type,
                style,
                border_style,
                selected,
                replay_focus,
                visits,
                transition,
                attempt: facts.attempt,
                took: facts
                    .started_ms
                    .map(|start| duration(facts.finished_ms.unwrap_or(now).saturating_sub(start))),
                progress: facts.progress.clone(),
                has_out,
                size,
            },
        );
        let clip = |v: i32, lo: u16, len: u16| v.clamp(lo as i32, (lo + len) as i32) as u16;
        let x0 = clip(sx, inner.x, inner.width);
        let y0 = clip(sy, inner.y, inner.height);
        let x1 = clip(sx + size.width, inner.x, inner.width);
        let y1 = clip(sy + size.height, inner.y, inner.height);
        if x1 > x0 && y1 > y0 {
            hits.push((
                Rect {
                    x: x0,
                    y: y0,
                    width: x1 - x0,
                    height: y1 - y0,
                },
                Hit::Node(id.to_owned()),
            ));
        }
    }
    app.hits.extend(hits);
    app.pan = pan;
    app.center_on_selected = false;
}

struct CardDraw<'a> {
    x: i32,
    y: i32,
    density: Density,
    id: &'a str,
    status: CardStatus,
    node_type: protocol::generated::types::NodeType,
    style: Style,
    border_style: Style,
    selected: bool,
    replay_focus: bool,
    visits: u64,
    attempt: u64,
    took: Option<String>,
    progress: Option<crate::model::Progress>,
    has_out: bool,
    size: crate::layout::CardSize,
    /// An included workflow's entry or exit node.
    transition: Option<protocol::generated::types::IncludeTransition>,
}

/// The label of a node id: included nodes keep their mount path
/// (`child/work`); an include's exit node `child/__piw_exit_ready` reads
/// `child/exit ready`.
pub(crate) fn display_id(id: &str) -> String {
    match id.rsplit_once("/__piw_exit_") {
        Some((mount, exit)) => format!("{mount}/exit {exit}"),
        None => id.to_owned(),
    }
}

fn draw_card(buf: &mut Buffer, clip: Rect, theme: &Theme, card: CardDraw<'_>) {
    let CardDraw {
        x,
        y,
        density,
        id,
        status,
        node_type,
        style,
        border_style,
        selected,
        replay_focus,
        visits,
        attempt,
        took,
        progress,
        has_out,
        size,
        transition,
    } = card;
    let label = display_id(id);
    let id = label.as_str();
    let (w, h) = (size.width, size.height);
    let b = border_set(status.is_running(), selected && !status.is_running());
    let inner_w = (w - 2) as usize;
    // Clear the card's cells (edges never pass here; this keeps it solid).
    for row in 0..h {
        put(buf, clip, x, y + row, &" ".repeat(w as usize), theme.text());
    }
    let glyph = if replay_focus { "◆" } else { status.glyph() };
    let label_style = if replay_focus || selected {
        theme.accent()
    } else {
        theme.text().add_modifier(Modifier::BOLD)
    };
    match density {
        Density::Box => {
            let top_title = match transition {
                Some(protocol::generated::types::IncludeTransition::Entry) => {
                    format!(" ↘ include · {} ", type_word(node_type))
                }
                Some(protocol::generated::types::IncludeTransition::Exit) => {
                    format!(" ↗ exit · {} ", type_word(node_type))
                }
                None => format!(" {} {} ", type_glyph(node_type), type_word(node_type)),
            };
            let rest = inner_w.saturating_sub(width(&top_title) + 1);
            put(buf, clip, x, y, b[0], border_style);
            put(buf, clip, x + 1, y, b[4], border_style);
            put(buf, clip, x + 2, y, &top_title, border_style);
            put(
                buf,
                clip,
                x + 2 + width(&top_title) as i32,
                y,
                &b[4].repeat(rest),
                border_style,
            );
            put(buf, clip, x + w - 1, y, b[1], border_style);
            for row in 1..h - 1 {
                put(buf, clip, x, y + row, b[5], border_style);
                put(buf, clip, x + w - 1, y + row, b[5], border_style);
            }
            let bottom = b[4].repeat(inner_w);
            put(buf, clip, x, y + h - 1, b[2], border_style);
            put(buf, clip, x + 1, y + h - 1, &bottom, border_style);
            put(buf, clip, x + w - 1, y + h - 1, b[3], border_style);
            if has_out {
                let tee = if status.is_running() {
                    "┳"
                } else if selected {
                    "╦"
                } else {
                    "┬"
                };
                put(buf, clip, x + w / 2, y + h - 1, tee, border_style);
            }
            // Line 1: glyph and hierarchical id.
            put(buf, clip, x + 2, y + 1, glyph, style);
            put(
                buf,
                clip,
                x + 4,
                y + 1,
                &fit_left(id, inner_w - 4),
                label_style,
            );
            // Line 2: state, attempt, visits, time.
            let mut facts = vec![status.word().to_owned()];
            if attempt > 1 {
                facts.push(format!("try {attempt}"));
            }
            if visits > 1 {
                facts.push(format!("×{visits}"));
            }
            if let Some(took) = took {
                facts.push(took);
            }
            put(
                buf,
                clip,
                x + 2,
                y + 2,
                &fit(&facts.join(" · "), inner_w - 2),
                style,
            );
            // Line 3: progress.
            if let Some(progress) = progress {
                let count = progress
                    .count()
                    .or(progress.label.clone())
                    .or(progress.status.clone())
                    .unwrap_or_default();
                let bar_w = (inner_w as i32 - 3 - width(&count) as i32).clamp(0, 10) as usize;
                if let Some(fraction) = progress.fraction().filter(|_| bar_w >= 3) {
                    let filled = (fraction * bar_w as f64).round() as usize;
                    put(
                        buf,
                        clip,
                        x + 2,
                        y + 3,
                        &"█".repeat(filled),
                        theme.fg(theme.running),
                    );
                    put(
                        buf,
                        clip,
                        x + 2 + filled as i32,
                        y + 3,
                        &"░".repeat(bar_w - filled),
                        theme.dim(),
                    );
                    put(
                        buf,
                        clip,
                        x + 3 + bar_w as i32,
                        y + 3,
                        &fit(&count, inner_w - bar_w - 2),
                        theme.text(),
                    );
                } else {
                    put(
                        buf,
                        clip,
                        x + 2,
                        y + 3,
                        &fit(&count, inner_w - 2),
                        theme.text(),
                    );
                }
            }
        }
        Density::Compact => {
            put(buf, clip, x, y, b[0], border_style);
            put(buf, clip, x + 1, y, &b[4].repeat(inner_w), border_style);
            put(buf, clip, x + w - 1, y, b[1], border_style);
            put(buf, clip, x, y + 1, b[5], border_style);
            put(buf, clip, x + w - 1, y + 1, b[5], border_style);
            put(buf, clip, x, y + 2, b[2], border_style);
            put(buf, clip, x + 1, y + 2, &b[4].repeat(inner_w), border_style);
            put(buf, clip, x + w - 1, y + 2, b[3], border_style);
            if has_out {
                let tee = if status.is_running() {
                    "┳"
                } else if selected {
                    "╦"
                } else {
                    "┬"
                };
                put(buf, clip, x + w / 2, y + 2, tee, border_style);
            }
            let tail = if visits > 1 {
                format!("×{visits}")
            } else {
                String::new()
            };
            let id_w = inner_w.saturating_sub(4 + width(&tail) + usize::from(!tail.is_empty()));
            put(buf, clip, x + 1, y + 1, glyph, style);
            let glyph = match transition {
                Some(protocol::generated::types::IncludeTransition::Entry) => "↘",
                Some(protocol::generated::types::IncludeTransition::Exit) => "↗",
                None => type_glyph(node_type),
            };
            put(buf, clip, x + 3, y + 1, glyph, theme.dim());
            put(buf, clip, x + 5, y + 1, &fit_left(id, id_w), label_style);
            if !tail.is_empty() {
                put(
                    buf,
                    clip,
                    x + w - 1 - width(&tail) as i32,
                    y + 1,
                    &tail,
                    style,
                );
            }
        }
    }
}
