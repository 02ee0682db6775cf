//! Colour themes. A theme maps the roles piw draws (status colours, text,
//! borders, the accent) to colours; the glyphs never depend on the theme,
//! so every status reads the same in `monochrome`.

use ratatui::style::{Color, Modifier, Style};

use protocol::generated::types::{DisplayStatus, NodeState};

/// The colours of one theme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Theme {
    pub name: &'static str,
    pub text: Color,
    pub dim: Color,
    pub border: Color,
    pub panel: Color,
    /// Selection, replay focus, the active tab.
    pub accent: Color,
    /// The taken path.
    pub path: Color,
    pub running: Color,
    pub waiting: Color,
    pub paused: Color,
    pub failed: Color,
    pub timed_out: Color,
    pub completed: Color,
    pub cancelled: Color,
    pub ambiguous: Color,
    pub queued: Color,
    /// Draw with colours (false: modifiers only).
    pub colour: bool,
}

const fn rgb(hex: u32) -> Color {
    Color::Rgb((hex >> 16) as u8, (hex >> 8) as u8, hex as u8)
}

/// Every theme, the default first.
pub const THEMES: &[Theme] = &[
    Theme {
        name: "catppuccin-mocha",
        text: rgb(0xcdd6f4),
        dim: rgb(0x7f849c),
        border: rgb(0x585b70),
        panel: rgb(0x313244),
        accent: rgb(0xcba6f7),
        path: rgb(0x94e2d5),
        running: rgb(0x89b4fa),
        waiting: rgb(0xf9e2af),
        paused: rgb(0xfab387),
        failed: rgb(0xf38ba8),
        timed_out: rgb(0xeba0ac),
        completed: rgb(0xa6e3a1),
        cancelled: rgb(0x9399b2),
        ambiguous: rgb(0xfab387),
        queued: rgb(0xbac2de),
        colour: true,
    },
    Theme {
        name: "catppuccin-latte",
        text: rgb(0x4c4f69),
        dim: rgb(0x8c8fa1),
        border: rgb(0xacb0be),
        panel: rgb(0xccd0da),
        accent: rgb(0x8839ef),
        path: rgb(0x179299),
        running: rgb(0x1e66f5),
        waiting: rgb(0xdf8e1d),
        paused: rgb(0xfe640b),
        failed: rgb(0xd20f39),
        timed_out: rgb(0xe64553),
        completed: rgb(0x40a02b),
        cancelled: rgb(0x7c7f93),
        ambiguous: rgb(0xfe640b),
        queued: rgb(0x5c5f77),
        colour: true,
    },
    Theme {
        name: "gruvbox-dark",
        text: rgb(0xebdbb2),
        dim: rgb(0x928374),
        border: rgb(0x665c54),
        panel: rgb(0x3c3836),
        accent: rgb(0xd3869b),
        path: rgb(0x8ec07c),
        running: rgb(0x83a598),
        waiting: rgb(0xfabd2f),
        paused: rgb(0xfe8019),
        failed: rgb(0xfb4934),
        timed_out: rgb(0xcc241d),
        completed: rgb(0xb8bb26),
        cancelled: rgb(0xa89984),
        ambiguous: rgb(0xfe8019),
        queued: rgb(0xd5c4a1),
        colour: true,
    },
    Theme {
        name: "nord",
        text: rgb(0xeceff4),
        dim: rgb(0x7b88a1),
        border: rgb(0x4c566a),
        panel: rgb(0x3b4252),
        accent: rgb(0xb48ead),
        path: rgb(0x8fbcbb),
        running: rgb(0x81a1c1),
        waiting: rgb(0xebcb8b),
        paused: rgb(0xd08770),
        failed: rgb(0xbf616a),
        timed_out: rgb(0xbf616a),
        completed: rgb(0xa3be8c),
        cancelled: rgb(0x6d7a96),
        ambiguous: rgb(0xd08770),
        queued: rgb(0xd8dee9),
        colour: true,
    },
    Theme {
        name: "dracula",
        text: rgb(0xf8f8f2),
        dim: rgb(0x6272a4),
        border: rgb(0x44475a),
        panel: rgb(0x343746),
        accent: rgb(0xff79c6),
        path: rgb(0x8be9fd),
        running: rgb(0xbd93f9),
        waiting: rgb(0xf1fa8c),
        paused: rgb(0xffb86c),
        failed: rgb(0xff5555),
        timed_out: rgb(0xff6e6e),
        completed: rgb(0x50fa7b),
        cancelled: rgb(0x6272a4),
        ambiguous: rgb(0xffb86c),
        queued: rgb(0xe2e2dc),
        colour: true,
    },
    Theme {
        name: "solarized-dark",
        text: rgb(0x93a1a1),
        dim: rgb(0x586e75),
        border: rgb(0x4a6068),
        panel: rgb(0x073642),
        accent: rgb(0xd33682),
        path: rgb(0x2aa198),
        running: rgb(0x268bd2),
        waiting: rgb(0xb58900),
        paused: rgb(0xcb4b16),
        failed: rgb(0xdc322f),
        timed_out: rgb(0xdc322f),
        completed: rgb(0x859900),
        cancelled: rgb(0x657b83),
        ambiguous: rgb(0xcb4b16),
        queued: rgb(0xeee8d5),
        colour: true,
    },
    Theme {
        name: "tokyo-night",
        text: rgb(0xc0caf5),
        dim: rgb(0x565f89),
        border: rgb(0x414868),
        panel: rgb(0x24283b),
        accent: rgb(0xbb9af7),
        path: rgb(0x73daca),
        running: rgb(0x7aa2f7),
        waiting: rgb(0xe0af68),
        paused: rgb(0xff9e64),
        failed: rgb(0xf7768e),
        timed_out: rgb(0xdb4b4b),
        completed: rgb(0x9ece6a),
        cancelled: rgb(0x737aa2),
        ambiguous: rgb(0xff9e64),
        queued: rgb(0xa9b1d6),
        colour: true,
    },
    Theme {
        name: "monochrome",
        text: Color::Reset,
        dim: Color::Reset,
        border: Color::Reset,
        panel: Color::Reset,
        accent: Color::Reset,
        path: Color::Reset,
        running: Color::Reset,
        waiting: Color::Reset,
        paused: Color::Reset,
        failed: Color::Reset,
        timed_out: Color::Reset,
        completed: Color::Reset,
        cancelled: Color::Reset,
        ambiguous: Color::Reset,
        queued: Color::Reset,
        colour: false,
    },
];

impl Default for Theme {
    fn default() -> Self {
        THEMES[0]
    }
}

impl Theme {
    /// The theme called `name`.
    pub fn named(name: &str) -> Option<Theme> {
        THEMES.iter().copied().find(|theme| theme.name == name)
    }

    /// The names of every theme, one per line, the default marked.
    pub fn listing() -> String {
        THEMES
            .iter()
            .enumerate()
            .map(|(i, theme)| {
                if i == 0 {
                    format!("{} (default)\n", theme.name)
                } else {
                    format!("{}\n", theme.name)
                }
            })
            .collect()
    }

    /// A foreground style (plain in monochrome).
    pub fn fg(&self, colour: Color) -> Style {
        if self.colour {
            Style::default().fg(colour)
        } else {
            Style::default()
        }
    }

    pub fn text(&self) -> Style {
        self.fg(self.text)
    }

    pub fn dim(&self) -> Style {
        if self.colour {
            self.fg(self.dim)
        } else {
            Style::default().add_modifier(Modifier::DIM)
        }
    }

    pub fn border(&self) -> Style {
        self.fg(self.border)
    }

    /// Selection and focus.
    pub fn accent(&self) -> Style {
        self.fg(self.accent).add_modifier(Modifier::BOLD)
    }

    /// A highlighted bar (selected row, active tab).
    pub fn selected(&self) -> Style {
        if self.colour {
            Style::default()
                .bg(self.panel)
                .fg(self.accent)
                .add_modifier(Modifier::BOLD)
        } else {
            Style::default().add_modifier(Modifier::REVERSED)
        }
    }

    /// The taken path.
    pub fn path(&self) -> Style {
        self.fg(self.path).add_modifier(Modifier::BOLD)
    }

    /// The colour of a run's display status.
    pub fn status(&self, status: DisplayStatus) -> Style {
        let colour = match status {
            DisplayStatus::Queued => self.queued,
            DisplayStatus::Running => self.running,
            DisplayStatus::Waiting => self.waiting,
            DisplayStatus::Paused => self.paused,
            DisplayStatus::Completed => self.completed,
            DisplayStatus::Failed => self.failed,
            DisplayStatus::TimedOut => self.timed_out,
            DisplayStatus::Cancelled => self.cancelled,
            DisplayStatus::Ambiguous => self.ambiguous,
        };
        let style = self.fg(colour);
        match status {
            DisplayStatus::Running | DisplayStatus::Failed | DisplayStatus::Ambiguous => {
                style.add_modifier(Modifier::BOLD)
            }
            _ => style,
        }
    }

    /// The colour of a node's projected state.
    pub fn node(&self, state: NodeState) -> Style {
        match state {
            NodeState::Pending => self.dim(),
            NodeState::Running => self.status(DisplayStatus::Running),
            NodeState::Waiting => self.status(DisplayStatus::Waiting),
            NodeState::Completed => self.status(DisplayStatus::Completed),
            NodeState::Failed => self.status(DisplayStatus::Failed),
            NodeState::TimedOut => self.status(DisplayStatus::TimedOut),
            NodeState::Cancelled => self.status(DisplayStatus::Cancelled),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_the_default_comes_first() {
        let mut names: Vec<&str> = THEMES.iter().map(|theme| theme.name).collect();
        assert_eq!(Theme::default().name, "catppuccin-mocha");
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), THEMES.len());
        assert!(Theme::named("nord").is_some());
        assert!(Theme::named("no-such-theme").is_none());
        assert!(Theme::listing().starts_with("catppuccin-mocha (default)\n"));
    }
}
