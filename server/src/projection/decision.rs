//! The words of a decision message: what the origin session shows a person
//! about a pending protected decision.
//!
//! Invariants:
//! - The text carries the request's title, presentation, choices and
//!   deadline, and how to answer; never its subject (the canonical value the
//!   workflow decides on), and nothing about who answers.
//! - It is plain text with LF line endings, rendered from the typed request
//!   alone, so a re-presented message (a branch change) reads the same.

use protocol::generated::types::{HumanDecisionRequest, PresentationBlock};
use std::fmt::Write as _;

/// The content of the decision message of `run_id`'s pending decision.
pub fn message_text(run_id: &str, request: &HumanDecisionRequest) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "Workflow run {run_id} waits for a human decision at {}: {}",
        request.node_id.as_str(),
        request.title.as_str()
    );
    let presentation = &request.presentation;
    if !presentation.summary.is_empty() {
        let _ = write!(text, "\n{}\n", presentation.summary.as_str());
    }
    for block in presentation.blocks.as_slice() {
        text.push('\n');
        match block {
            PresentationBlock::Paragraph { text: paragraph }
            | PresentationBlock::Preformatted { text: paragraph } => {
                let _ = writeln!(text, "{}", paragraph.as_str());
            }
            PresentationBlock::Section { title } => {
                let _ = writeln!(text, "## {}", title.as_str());
            }
            PresentationBlock::Bullets { items } => {
                for item in items.as_slice() {
                    let _ = writeln!(text, "- {}", item.as_str());
                }
            }
            PresentationBlock::Fields { items } => {
                for field in items.as_slice() {
                    let _ = writeln!(text, "{}: {}", field.label.as_str(), field.value.as_str());
                }
            }
        }
    }
    text.push_str("\nChoices:\n");
    for choice in request.choices.as_slice() {
        let _ = write!(text, "- {}: {}", choice.id.as_str(), choice.label.as_str());
        if let Some(input) = &choice.input {
            let _ = write!(
                text,
                " (with text: {}, {}-{} characters)",
                input.prompt.as_str(),
                input.min_length.get(),
                input.max_length.get()
            );
        }
        text.push('\n');
    }
    if let Some(expires_at) = &request.expires_at {
        let then = match &request.default_response {
            Some(default) => format!("{} is chosen", default.choice.as_str()),
            None => "the decision expires and the run times out".into(),
        };
        let _ = writeln!(
            text,
            "\nAnswer before {}; then {then}.",
            expires_at.as_str()
        );
    }
    let _ = write!(
        text,
        "\nAnswer with /workflow answer {run_id} <choice> [text] (or pi-workflows answer {run_id} <choice> [text]). Only a person answers this decision: the workflow tool cannot."
    );
    text
}
