//! The server log: one line per event on stderr (`host/server.log` for a
//! server started in the background).
//!
//! Invariants:
//! - A line is written whole or not at all, and writing never panics: the
//!   log lives on the same disk as the state, and a full disk must not stop
//!   the server (`eprintln!` panics when stderr cannot be written).
//! - A line is bounded (`MAX_LINE_CHARS`) and carries no token, prompt,
//!   output, session id or path: callers pass safe text only.

use std::io::Write as _;

/// The longest line written (longer text is cut at a character boundary).
pub const MAX_LINE_CHARS: usize = 240;

/// Writes `pi-workflows: <text>` as one line on stderr; a failed write is
/// dropped.
pub fn line(text: &str) {
    let mut bounded: String = text
        .chars()
        .filter(|c| *c != '\n' && *c != '\r')
        .take(MAX_LINE_CHARS)
        .collect();
    bounded.insert_str(0, "pi-workflows: ");
    bounded.push('\n');
    let _ = std::io::stderr().lock().write_all(bounded.as_bytes());
}
