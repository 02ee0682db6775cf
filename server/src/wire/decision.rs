//! Human-decision requests on the wire: the typed request a `humanDecision`
//! checkpoint outputs (runner.v1 `HumanDecisionRequest`), its seals, and the
//! plain facts the kernel decides with.
//!
//! Invariants:
//! - A request is read only as the generated `HumanDecisionRequest` (the
//!   schema's fields, no unknown ones); no field is read out of JSON by name.
//! - Every seal is recomputed from the typed values over canonical JSON
//!   (RFC 8785): `requestDigest` over every field but the four seals,
//!   `decisionId` over `{runId, nodeId, attemptId, requestDigest}`, and the
//!   subject and presentation digests over their values. [`seal`] is the one
//!   place that computes them; [`check`] accepts a request only when sealing
//!   its own fields again gives the same request.
//! - A request is bound to the attempt that finishes with it (run, node,
//!   attempt), its choice ids are unique, each text input's bounds are
//!   sane, and its `onTimeout` default is one of its choices, with the input
//!   that choice takes, and comes with an expiry.
//! - A response's digest is the SHA-256 of its canonical JSON, which is the
//!   digest of the blob it is stored as.

use kernel::decision::{Choice, Opening, Response, TextInput};
use protocol::generated::constrained::{DecisionChoices, DecisionRevision};
use protocol::generated::types::{
    AttemptId, ChoiceId, DecisionChoice, DecisionExpiry, DecisionId, DecisionPresentation,
    DecisionResponse, DecisionResponseInput, DecisionSubject, Digest, HumanDecisionRequest,
    HumanDecisionRequestAudience, HumanDecisionRequestSchemaId, HumanDecisionRequestTitle, NodeId,
    RunId,
};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// Everything a request says, without its seals: what [`seal`] hashes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestBasis {
    pub schema: HumanDecisionRequestSchemaId,
    pub run_id: RunId,
    pub node_id: NodeId,
    pub attempt_id: AttemptId,
    pub audience: HumanDecisionRequestAudience,
    pub title: HumanDecisionRequestTitle,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<DecisionSubject>,
    pub presentation: DecisionPresentation,
    pub choices: DecisionChoices,
    pub revision: DecisionRevision,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DecisionExpiry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_response: Option<DecisionResponse>,
}

/// The run binding the decision id is made of.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Binding<'a> {
    run_id: &'a RunId,
    node_id: &'a NodeId,
    attempt_id: &'a AttemptId,
    request_digest: &'a Digest,
}

/// Why a request was refused (the runner's message is refused with it and
/// the run parks `protocolRejected`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestProblem {
    /// The output is not a `HumanDecisionRequest`.
    Schema,
    /// It names another run, node or attempt than the one finishing.
    Binding,
    /// A seal does not match the request's fields.
    Seal,
    /// Two choices share an id, or an input's bounds are impossible.
    Choices,
    /// The `onTimeout` default is not a valid answer, or has no expiry.
    Default,
    /// The expiry is not a time this server can read.
    Expiry,
}

impl RequestProblem {
    /// A safe message naming what is wrong (no values).
    pub const fn message(self) -> &'static str {
        match self {
            Self::Schema => "the human decision request does not match its schema",
            Self::Binding => {
                "the human decision request names another run, node or attempt than the finishing one"
            }
            Self::Seal => "a seal of the human decision request does not match its fields",
            Self::Choices => {
                "the human decision request repeats a choice id or has impossible input bounds"
            }
            Self::Default => {
                "the human decision request's onTimeout default is not one of its choices with its input, or has no expiry"
            }
            Self::Expiry => "the human decision request's expiresAt is not a readable time",
        }
    }
}

/// A request that passed every check, and the decision it opens.
#[derive(Clone, Debug)]
pub struct Checked {
    pub request: HumanDecisionRequest,
    pub opening: Opening,
}

/// Seals `basis`: the request with its digests and decision id.
///
/// # Panics
/// Never on a basis of generated types: canonical JSON of them always
/// encodes, and a `sha256:` digest always fits the digest and id patterns.
pub fn seal(basis: RequestBasis) -> HumanDecisionRequest {
    let request_digest = digest_text(&sha256_of(&basis));
    let binding = Binding {
        run_id: &basis.run_id,
        node_id: &basis.node_id,
        attempt_id: &basis.attempt_id,
        request_digest: &request_digest,
    };
    let bound = hex::encode(sha256_of(&binding));
    let decision_id = DecisionId::try_from(format!("decision-{}", &bound[..40]))
        .expect("a decision id of 40 hex digits fits the pattern");
    let subject_digest = basis
        .subject
        .as_ref()
        .map(|subject| digest_text(&sha256_of(subject)));
    let presentation_digest = digest_text(&sha256_of(&basis.presentation));
    let RequestBasis {
        schema,
        run_id,
        node_id,
        attempt_id,
        audience,
        title,
        subject,
        presentation,
        choices,
        revision,
        expires_at,
        default_response,
    } = basis;
    HumanDecisionRequest {
        attempt_id,
        audience,
        choices,
        decision_id,
        default_response,
        expires_at,
        node_id,
        presentation,
        presentation_digest,
        request_digest,
        revision,
        run_id,
        schema,
        subject,
        subject_digest,
        title,
    }
}

/// The basis of a sealed request (its fields without the seals).
pub fn basis_of(request: &HumanDecisionRequest) -> RequestBasis {
    RequestBasis {
        schema: request.schema,
        run_id: request.run_id.clone(),
        node_id: request.node_id.clone(),
        attempt_id: request.attempt_id.clone(),
        audience: request.audience.clone(),
        title: request.title.clone(),
        subject: request.subject.clone(),
        presentation: request.presentation.clone(),
        choices: request.choices.clone(),
        revision: request.revision,
        expires_at: request.expires_at.clone(),
        default_response: request.default_response.clone(),
    }
}

/// Reads a stored checkpoint output as the request it is.
pub fn read(output: serde_json::Value) -> Option<HumanDecisionRequest> {
    serde_json::from_value(output).ok()
}

/// Checks the output of a finishing human-decision checkpoint (run, node and
/// attempt ids as the server knows them) and gives the decision it opens.
pub fn check(
    output: serde_json::Value,
    run_id: &str,
    node_id: &str,
    attempt_id: &str,
) -> Result<Checked, RequestProblem> {
    let request = read(output).ok_or(RequestProblem::Schema)?;
    let bound = request.run_id.as_str() == run_id
        && request.node_id.as_str() == node_id
        && request.attempt_id.as_str() == attempt_id;
    if !bound {
        return Err(RequestProblem::Binding);
    }
    if seal(basis_of(&request)) != request {
        return Err(RequestProblem::Seal);
    }
    let choices = choices(&request).ok_or(RequestProblem::Choices)?;
    let deadline_at_ms = request
        .expires_at
        .as_ref()
        .map(|expiry| expiry_ms(expiry).ok_or(RequestProblem::Expiry))
        .transpose()?;
    let default_answer_digest = match &request.default_response {
        None => None,
        Some(_) if deadline_at_ms.is_none() => return Err(RequestProblem::Default),
        Some(default) => {
            kernel::decision::check_response(&choices, &response(default))
                .map_err(|_| RequestProblem::Default)?;
            Some(answer_digest(default))
        }
    };
    let opening = Opening {
        decision_id: kernel::ids::DecisionId::new(request.decision_id.as_str()),
        request_digest: kernel::ids::Digest(sha256_array(request.request_digest.as_str())?),
        deadline_at_ms,
        default_answer_digest,
    };
    Ok(Checked { request, opening })
}

/// The typed choices as the kernel checks answers against them; `None` when
/// two share an id or an input's bounds are impossible.
pub fn choices(request: &HumanDecisionRequest) -> Option<Vec<Choice>> {
    let mut checked: Vec<Choice> = Vec::new();
    for choice in request.choices.as_slice() {
        if checked.iter().any(|known| known.id == choice.id.as_str()) {
            return None;
        }
        checked.push(kernel_choice(choice)?);
    }
    Some(checked)
}

fn kernel_choice(choice: &DecisionChoice) -> Option<Choice> {
    let input = match &choice.input {
        None => None,
        Some(input) => {
            let min_length = u32::try_from(input.min_length.get()).ok()?;
            let max_length = u32::try_from(input.max_length.get()).ok()?;
            if max_length == 0 || min_length > max_length {
                return None;
            }
            Some(TextInput {
                name: input.name.to_string(),
                min_length,
                max_length,
            })
        }
    };
    Some(Choice {
        id: choice.id.to_string(),
        input,
    })
}

/// A typed response as the kernel checks it. An input map with more than
/// one entry is given to the kernel as an input under no name it takes.
pub fn response(response: &DecisionResponse) -> Response {
    kernel_response(&response.choice, response.input.as_ref())
}

/// The kernel's view of a choice and its optional input.
pub fn kernel_response(choice: &ChoiceId, input: Option<&DecisionResponseInput>) -> Response {
    let input = input.map(|input| {
        let mut entries = input.iter();
        match (entries.next(), entries.next()) {
            (Some((name, text)), None) => (name.clone(), text.to_string()),
            _ => (String::new(), String::new()),
        }
    });
    Response {
        choice: choice.to_string(),
        input,
    }
}

/// The response a person gave, typed.
pub fn response_of(choice: ChoiceId, input: Option<DecisionResponseInput>) -> DecisionResponse {
    DecisionResponse { choice, input }
}

/// The canonical JSON value a response is stored as (the continuation's
/// checkpoint output).
pub fn response_value(response: &DecisionResponse) -> serde_json::Value {
    serde_json::to_value(response).unwrap_or(serde_json::Value::Null)
}

/// The digest of a response: the SHA-256 of its canonical JSON.
pub fn answer_digest(response: &DecisionResponse) -> kernel::ids::Digest {
    kernel::ids::Digest(sha256_of(response))
}

/// The request digest a client names, as the kernel compares it.
pub fn request_digest(digest: &Digest) -> Option<kernel::ids::Digest> {
    sha256_array(digest.as_str()).ok().map(kernel::ids::Digest)
}

/// `expiresAt` (`YYYY-MM-DDTHH:MM:SS.mmmZ`, the schema's pattern) in
/// milliseconds since the epoch; `None` for a date that does not exist.
pub fn expiry_ms(expiry: &DecisionExpiry) -> Option<u64> {
    let text = expiry.as_str();
    let number = |range: std::ops::Range<usize>| text.get(range)?.parse::<u64>().ok();
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second, milli) = (
        number(11..13)?,
        number(14..16)?,
        number(17..19)?,
        number(20..23)?,
    );
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let days_in_month = *month_days.get(usize::try_from(month).ok()?.checked_sub(1)?)?;
    if year < 1970 || day == 0 || day > days_in_month || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some((((days * 24 + hour) * 60 + minute) * 60 + second) * 1000 + milli)
}

/// `ms` as an `expiresAt` (the inverse of [`expiry_ms`]).
pub fn expiry_text(ms: u64) -> Option<DecisionExpiry> {
    DecisionExpiry::try_from(kernel::attempt::rfc3339(ms)).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date from 1970 on
/// (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

fn sha256_of<T: Serialize>(value: &T) -> [u8; 32] {
    // Generated types always encode; an encoding failure hashes nothing,
    // which no seal matches.
    let bytes = protocol::canonicalize_typed(value).unwrap_or_default();
    Sha256::digest(&bytes).into()
}

fn digest_text(bytes: &[u8; 32]) -> Digest {
    Digest::try_from(format!("sha256:{}", hex::encode(bytes)))
        .expect("a sha256 digest fits the digest pattern")
}

fn sha256_array(text: &str) -> Result<[u8; 32], RequestProblem> {
    let hex = text.strip_prefix("sha256:").ok_or(RequestProblem::Seal)?;
    let bytes = hex::decode(hex).map_err(|_| RequestProblem::Seal)?;
    bytes.try_into().map_err(|_| RequestProblem::Seal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_round_trips_the_kernel_format_and_refuses_impossible_dates() {
        for ms in [0, 951_782_400_000, 1_767_225_599_999, 4_102_444_800_123] {
            let text = expiry_text(ms).expect("a time after 1970");
            assert_eq!(expiry_ms(&text), Some(ms), "{}", text.as_str());
        }
        for bad in [
            "2026-02-29T00:00:00.000Z",
            "2026-13-01T00:00:00.000Z",
            "2026-01-01T24:00:00.000Z",
        ] {
            let text = DecisionExpiry::try_from(bad).expect("the pattern");
            assert_eq!(expiry_ms(&text), None, "{bad}");
        }
    }
}
