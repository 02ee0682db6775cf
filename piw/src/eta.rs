//! Progress ETA, estimated from the progress updates piw observes.
//!
//! Update records carry no timestamp, so a sample is the time piw first
//! saw a progress value (its clock, passed in). The rules are the earlier
//! viewer's estimator:
//! - a new epoch starts on a change of phase, unit or total, when
//!   `completed` decreases, or when a terminal track becomes non-terminal;
//! - each interval's rate is the progress gained over the time elapsed;
//!   the window is the latest 8 usable intervals;
//! - the median rate gives the central ETA, the p25 and p75 rates its range;
//! - confidence: 1 interval low; 2–4 medium when IQR/median ≤ 0.5, else
//!   low; 5 or more high ≤ 0.25, medium ≤ 0.5, else low;
//! - a `sourceEstimatedFinishAt` wins and is labelled as the source's;
//! - `waiting` and `blocked` tracks pause the ETA; terminal tracks show none.

use std::collections::HashMap;

use serde_json::Value;

/// Intervals kept per track.
const WINDOW: usize = 8;

/// How sure an estimate is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confidence {
    Low,
    Medium,
    High,
}

impl Confidence {
    pub fn word(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }
}

/// What the ETA line says.
#[derive(Clone, Debug, PartialEq)]
pub enum Eta {
    /// Measured from observed progress.
    Measured {
        remaining_ms: u64,
        low_ms: u64,
        high_ms: u64,
        confidence: Confidence,
    },
    /// The update's own `sourceEstimatedFinishAt`.
    Source { remaining_ms: u64 },
    /// The track waits or is blocked.
    Paused,
    /// The track finished (no ETA).
    Done,
    /// No estimate, and why.
    Unavailable(&'static str),
}

#[derive(Clone, Debug, Default)]
struct Track {
    epoch: (Option<String>, Option<String>, Option<u64>),
    samples: Vec<(u64, f64)>,
    terminal: bool,
}

/// Samples per progress track (`type/key`).
#[derive(Clone, Debug, Default)]
pub struct EtaTracker {
    tracks: HashMap<String, Track>,
}

fn is_terminal(status: Option<&str>) -> bool {
    matches!(status, Some("completed" | "failed" | "cancelled"))
}

impl EtaTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one observation of a progress update's data at `now_ms`.
    pub fn observe(&mut self, key: &str, data: &Value, now_ms: u64) {
        let text = |name: &str| data.get(name).and_then(Value::as_str).map(str::to_owned);
        let epoch = (
            text("phase"),
            text("unit"),
            data.get("total").and_then(Value::as_f64).map(f64::to_bits),
        );
        let status = text("status");
        let terminal = is_terminal(status.as_deref());
        let Some(completed) = data.get("completed").and_then(Value::as_f64) else {
            return;
        };
        let track = self.tracks.entry(key.to_owned()).or_default();
        let restarted = track.terminal && !terminal;
        let went_back = track
            .samples
            .last()
            .is_some_and(|&(_, last)| completed < last);
        if track.epoch != epoch || restarted || went_back {
            track.samples.clear();
            track.epoch = epoch;
        }
        track.terminal = terminal;
        if track
            .samples
            .last()
            .is_none_or(|&(_, last)| completed > last)
        {
            track.samples.push((now_ms, completed));
            if track.samples.len() > WINDOW + 1 {
                track.samples.remove(0);
            }
        }
    }

    /// The ETA of a track given its current data.
    pub fn estimate(&self, key: &str, data: &Value, now_ms: u64) -> Eta {
        let status = data.get("status").and_then(Value::as_str);
        if is_terminal(status) {
            return Eta::Done;
        }
        if matches!(status, Some("waiting" | "blocked")) {
            return Eta::Paused;
        }
        if let Some(finish) = data
            .get("sourceEstimatedFinishAt")
            .and_then(Value::as_str)
            .and_then(rfc3339_ms)
        {
            return Eta::Source {
                remaining_ms: finish.saturating_sub(now_ms),
            };
        }
        let (Some(completed), Some(total)) = (
            data.get("completed").and_then(Value::as_f64),
            data.get("total").and_then(Value::as_f64),
        ) else {
            return Eta::Unavailable("the update has no completed and total");
        };
        let Some(track) = self.tracks.get(key) else {
            return Eta::Unavailable("no progress observed yet");
        };
        let mut rates: Vec<f64> = track
            .samples
            .windows(2)
            .filter_map(|w| {
                let (dt, dp) = (w[1].0.saturating_sub(w[0].0) as f64, w[1].1 - w[0].1);
                (dt > 0.0 && dp > 0.0).then_some(dp / dt)
            })
            .collect();
        if rates.is_empty() {
            return Eta::Unavailable("waiting for a second progress sample");
        }
        rates.sort_by(f64::total_cmp);
        let remaining = (total - completed).max(0.0);
        let median = quantile(&rates, 0.5);
        let (p25, p75) = (quantile(&rates, 0.25), quantile(&rates, 0.75));
        let spread = (p75 - p25) / median;
        let confidence = match rates.len() {
            1 => Confidence::Low,
            2..=4 if spread <= 0.5 => Confidence::Medium,
            2..=4 => Confidence::Low,
            _ if spread <= 0.25 => Confidence::High,
            _ if spread <= 0.5 => Confidence::Medium,
            _ => Confidence::Low,
        };
        let time = |rate: f64| (remaining / rate).round() as u64;
        Eta::Measured {
            remaining_ms: time(median),
            low_ms: time(p75),
            high_ms: time(p25),
            confidence,
        }
    }
}

/// Linear-interpolated quantile of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let at = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo as f64)
}

/// Milliseconds since the epoch of an RFC 3339 timestamp
/// (`2026-12-01T12:00:00Z`, fractional seconds and offsets allowed).
pub fn rfc3339_ms(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> { text.get(range)?.parse().ok() };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits: String = fraction.chars().take_while(char::is_ascii_digit).collect();
        let padded = format!("{digits:0<3}");
        millis = padded[..3].parse().ok()?;
        rest = &fraction[digits.len()..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 => {
            let sign = match &rest[..1] {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            sign * (rest[1..3].parse::<i64>().ok()? * 60 + rest[4..6].parse::<i64>().ok()?)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    u64::try_from(seconds * 1000 + millis).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn steady_progress_gives_a_confident_estimate() {
        let mut eta = EtaTracker::new();
        for i in 0..7u64 {
            let data =
                json!({"status": "running", "completed": i * 10, "total": 100, "unit": "files"});
            eta.observe("progress/files", &data, i * 1000);
        }
        let now = json!({"status": "running", "completed": 60, "total": 100, "unit": "files"});
        match eta.estimate("progress/files", &now, 6000) {
            Eta::Measured {
                remaining_ms,
                confidence,
                ..
            } => {
                assert_eq!(remaining_ms, 4000);
                assert_eq!(confidence, Confidence::High);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_new_total_starts_a_new_epoch() {
        let mut eta = EtaTracker::new();
        eta.observe("k", &json!({"completed": 1, "total": 10, "unit": "x"}), 0);
        eta.observe(
            "k",
            &json!({"completed": 2, "total": 10, "unit": "x"}),
            1000,
        );
        eta.observe(
            "k",
            &json!({"completed": 3, "total": 20, "unit": "x"}),
            2000,
        );
        assert_eq!(
            eta.estimate("k", &json!({"completed": 3, "total": 20}), 2000),
            Eta::Unavailable("waiting for a second progress sample")
        );
    }

    #[test]
    fn waiting_terminal_and_source_estimates_win() {
        let eta = EtaTracker::new();
        assert_eq!(
            eta.estimate("k", &json!({"status": "waiting"}), 0),
            Eta::Paused
        );
        assert_eq!(
            eta.estimate("k", &json!({"status": "completed"}), 0),
            Eta::Done
        );
        let finish =
            json!({"status": "running", "sourceEstimatedFinishAt": "1970-01-01T00:01:00Z"});
        assert_eq!(
            eta.estimate("k", &finish, 15_000),
            Eta::Source {
                remaining_ms: 45_000
            }
        );
    }

    #[test]
    fn rfc3339_handles_fractions_and_offsets() {
        assert_eq!(rfc3339_ms("1970-01-01T00:00:01.5Z"), Some(1500));
        assert_eq!(
            rfc3339_ms("2000-03-01T01:00:00+01:00"),
            Some(951_868_800_000)
        );
        assert_eq!(rfc3339_ms("not a time"), None);
    }
}
