//! Width-aware text helpers (display cells, not bytes or chars).

use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// The display width of `text`.
pub fn width(text: &str) -> usize {
    UnicodeWidthStr::width(text)
}

/// One line: control characters become spaces.
pub fn single_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `text` cut to `max` cells, ending in `…` when cut.
pub fn fit(text: &str, max: usize) -> String {
    if width(text) <= max {
        return text.to_owned();
    }
    if max == 0 {
        return String::new();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = c.width().unwrap_or(0);
        if used + w > max - 1 {
            break;
        }
        out.push(c);
        used += w;
    }
    out.push('…');
    out
}

/// `text` cut to `max` cells from the left, starting with `…` when cut
/// (keeps the end of a hierarchical id: `…/child/work`).
pub fn fit_left(text: &str, max: usize) -> String {
    if width(text) <= max {
        return text.to_owned();
    }
    if max == 0 {
        return String::new();
    }
    let mut kept: Vec<char> = Vec::new();
    let mut used = 0;
    for c in text.chars().rev() {
        let w = c.width().unwrap_or(0);
        if used + w > max - 1 {
            break;
        }
        kept.push(c);
        used += w;
    }
    let mut out = String::from("…");
    out.extend(kept.into_iter().rev());
    out
}

/// `text` cut in the middle to `max` cells (`20261201T…-8ce1550a`).
pub fn fit_middle(text: &str, max: usize) -> String {
    if width(text) <= max {
        return text.to_owned();
    }
    if max < 3 {
        return fit(text, max);
    }
    let head = (max - 1) / 2;
    let tail = max - 1 - head;
    let chars: Vec<char> = text.chars().collect();
    let start: String = chars.iter().take(head).collect();
    let end: String = chars[chars.len().saturating_sub(tail)..].iter().collect();
    format!("{start}…{end}")
}

/// `text` padded with spaces (or cut) to exactly `cells`.
pub fn pad(text: &str, cells: usize) -> String {
    let fitted = fit(text, cells);
    let w = width(&fitted);
    format!("{fitted}{}", " ".repeat(cells - w))
}

/// Wraps `text` into lines of at most `max` cells, at spaces where it can.
pub fn wrap(text: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let mut lines = Vec::new();
    for paragraph in text.split('\n') {
        let mut line = String::new();
        for word in paragraph.split(' ') {
            let candidate = if line.is_empty() {
                word.to_owned()
            } else {
                format!("{line} {word}")
            };
            if width(&candidate) <= max {
                line = candidate;
                continue;
            }
            if !line.is_empty() {
                lines.push(std::mem::take(&mut line));
            }
            let mut rest = word.to_owned();
            while width(&rest) > max {
                let mut head = String::new();
                let mut used = 0;
                for c in rest.chars() {
                    let w = c.width().unwrap_or(0);
                    if used + w > max {
                        break;
                    }
                    head.push(c);
                    used += w;
                }
                rest = rest[head.len()..].to_owned();
                lines.push(head);
            }
            line = rest;
        }
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitting_keeps_the_useful_end() {
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit_left("build/child/work", 10), "…hild/work");
        assert_eq!(fit_middle("20261201T123704Z-switch", 11), "20261…witch");
        assert_eq!(pad("ab", 4), "ab  ");
        assert_eq!(wrap("one two three", 7), ["one two", "three"]);
        assert_eq!(wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
    }
}
