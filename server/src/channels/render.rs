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

use protocol::generated::types::{HumanDecisionRequest, PresentationBlock};

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

pub(super) fn render(request: &HumanDecisionRequest) -> Rendered {
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
        "\n\nRequest {} (revision {})",
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
