//! A protected decision as an external channel shows it: plain text (no
//! markup) and one button label per choice.
//!
//! Invariants:
//! - Only the presentation is rendered: the title, the summary and blocks,
//!   a short fingerprint of the request digest, and the choice labels.
//!   The decision subject, the run's state and its ids never reach a
//!   channel.
//! - The text fits one Telegram message (4,096 characters): a longer
//!   presentation is cut at a character boundary and says so.
//! - A settled decision's text is the same presentation with one outcome
//!   line: the chosen choice's label and where it was answered, or that the
//!   decision was cancelled or expired. Never the text input of an answer,
//!   nor who answered.

use protocol::generated::types::{DecisionChannel, HumanDecisionRequest, PresentationBlock};

/// Telegram's limit for one message's text.
const MAX_TEXT: usize = 4096;
/// Telegram's limit for a button's label here.
const MAX_LABEL: usize = 64;
const CUT: &str = "\n… (cut: read the whole decision in Pi or with pi-workflows view)";

/// The rendered text and button labels of `request`.
pub(super) struct Rendered {
    pub(super) text: String,
    pub(super) buttons: Vec<String>,
}

/// How a decision ended, as its settled message states it.
pub(super) enum Outcome<'a> {
    /// A person's answer: the choice's label and the channel it came from
    /// (none when the stored source is missing).
    Answered {
        label: &'a str,
        channel: Option<DecisionChannel>,
    },
    /// The deadline's default answer.
    Defaulted {
        label: &'a str,
    },
    Cancelled,
    Expired,
}

impl Outcome<'_> {
    fn line(&self) -> String {
        match self {
            Self::Answered { label, channel } => {
                let from = match channel {
                    Some(DecisionChannel::Pi) => " (answered in Pi)",
                    Some(DecisionChannel::Cli) => " (answered from the command line)",
                    Some(DecisionChannel::Piw) => " (answered in piw)",
                    Some(DecisionChannel::Telegram) => " (answered in Telegram)",
                    None => "",
                };
                format!("Decided: {label}{from}")
            }
            Self::Defaulted { label } => format!("Decided by the deadline's default: {label}"),
            Self::Cancelled => "Cancelled: this decision no longer waits for an answer.".into(),
            Self::Expired => "Expired: no answer came before the deadline.".into(),
        }
    }
}

/// The settled text of `request`: its presentation and the outcome line
/// (the message keeps no buttons).
pub(super) fn render_settled(request: &HumanDecisionRequest, outcome: &Outcome<'_>) -> String {
    let label: String = outcome.line().chars().take(MAX_LABEL * 4).collect();
    render_with(request, &format!("\n\n{label}")).text
}

pub(super) fn render(request: &HumanDecisionRequest) -> Rendered {
    render_with(request, "")
}

/// The presentation with `outcome` (empty, or the settled outcome line)
/// before the footer.
fn render_with(request: &HumanDecisionRequest, outcome: &str) -> Rendered {
    let mut text = String::new();
    text.push_str(request.title.as_str());
    text.push_str("\n\n");
    text.push_str(request.presentation.summary.as_str());
    for block in request.presentation.blocks.as_slice() {
        text.push_str("\n\n");
        match block {
            PresentationBlock::Paragraph { text: paragraph } => text.push_str(paragraph),
            PresentationBlock::Section { title } => text.push_str(&title.to_uppercase()),
            PresentationBlock::Bullets { items } => {
                let lines: Vec<String> = items
                    .as_slice()
                    .iter()
                    .map(|item| format!("• {}", item.as_str()))
                    .collect();
                text.push_str(&lines.join("\n"));
            }
            PresentationBlock::Fields { items } => {
                let lines: Vec<String> = items
                    .as_slice()
                    .iter()
                    .map(|field| format!("{}: {}", field.label.as_str(), field.value.as_str()))
                    .collect();
                text.push_str(&lines.join("\n"));
            }
            PresentationBlock::Preformatted { text: preformatted } => text.push_str(preformatted),
        }
    }
    let digest = request.request_digest.as_str();
    let fingerprint = digest.strip_prefix("sha256:").unwrap_or(digest);
    let footer = format!(
        "{outcome}\n\nRequest {} (revision {})",
        fingerprint.chars().take(12).collect::<String>(),
        request.revision.get()
    );
    let room = MAX_TEXT - footer.chars().count();
    if text.chars().count() > room {
        let keep = room - CUT.chars().count();
        text = text.chars().take(keep).collect();
        text.push_str(CUT);
    }
    text.push_str(&footer);
    let buttons = request
        .choices
        .as_slice()
        .iter()
        .map(|choice| choice.label.chars().take(MAX_LABEL).collect())
        .collect();
    Rendered { text, buttons }
}

#[cfg(test)]
mod tests {
    use super::Outcome;
    use protocol::generated::types::DecisionChannel;

    /// Every answer source is named in the settled line, none left out.
    #[test]
    fn a_settled_answer_names_each_source() {
        let line = |channel| {
            Outcome::Answered {
                label: "Approve",
                channel,
            }
            .line()
        };
        assert_eq!(
            [
                Some(DecisionChannel::Pi),
                Some(DecisionChannel::Cli),
                Some(DecisionChannel::Piw),
                Some(DecisionChannel::Telegram),
                None,
            ]
            .map(line),
            [
                "Decided: Approve (answered in Pi)",
                "Decided: Approve (answered from the command line)",
                "Decided: Approve (answered in piw)",
                "Decided: Approve (answered in Telegram)",
                "Decided: Approve",
            ]
        );
    }
}
