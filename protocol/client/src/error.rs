//! Why a client call failed: a closed set of kinds, each displayed as one
//! line that says what happened and what to do next.
//!
//! Invariants:
//! - A message never carries a path, a payload, a token or a system error
//!   text; the server's own text appears only where it is a `SafeError`
//!   message (at most 512 characters, written for clients) or its refusal
//!   reason.
//! - `TimedOut` names what the client waited for, and for a state-changing
//!   request says that the server may still apply it.

use protocol::ErrorCode;
use protocol::content::ContentFailure;
use protocol::generated::types::CommandOutcome;
use std::time::Duration;

/// Why a client call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// No server is listening (and none was to be started).
    Unavailable,
    /// Starting a server on demand failed: the server's one-line reason.
    StartFailed(String),
    /// The server runs another package version.
    VersionMismatch(String),
    /// The server refused the connection (its reason, e.g. too many
    /// connections).
    ConnectionRefused(String),
    /// The server did not answer within the client's limit.
    TimedOut { waited_for: Waited, limit: Duration },
    /// The connection broke, and the bounded retries (if the request may be
    /// retried) did not get an answer either.
    Lost(String),
    /// The request is not valid before it is sent (its code:
    /// `schemaInvalid`, `frameTooLarge`, …).
    Invalid(ErrorCode),
    /// The server answered `rejected`.
    Refused { code: ErrorCode, message: String },
    /// The server answered `conflict` (an idempotency key reused for
    /// another command, or a revision that moved on).
    Conflict { code: ErrorCode, message: String },
    /// The server answered `notFound`.
    NotFound { code: ErrorCode, message: String },
    /// The server answered `claimLost`.
    ClaimLost { code: ErrorCode, message: String },
    /// The server answered `unavailable` (for example a full disk).
    ServerUnavailable { code: ErrorCode, message: String },
    /// Referenced content could not be read or failed verification.
    Content(ContentFailure),
    /// A complete view could not be read at one revision: the run kept
    /// changing on every attempt.
    KeptChanging,
    /// `next_event` was called without an open subscription.
    NothingSubscribed,
}

/// What a timed-out client waited for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    /// The server's hello after connecting.
    Hello,
    /// The response to a request of this operation; `state_changing` when
    /// it carried an idempotency key (it may still be applied).
    Response {
        operation: String,
        state_changing: bool,
    },
}

impl ClientError {
    /// Whether the server answered the request with a refusing outcome
    /// (rather than the client failing to get an answer).
    pub fn is_server_refusal(&self) -> bool {
        matches!(
            self,
            Self::Refused { .. }
                | Self::Conflict { .. }
                | Self::NotFound { .. }
                | Self::ClaimLost { .. }
                | Self::ServerUnavailable { .. }
        )
    }

    /// The error of a settled response whose outcome is not `accepted` or
    /// `adopted` (`None` for those two).
    pub fn of_outcome(
        outcome: CommandOutcome,
        code: Option<ErrorCode>,
        message: Option<String>,
    ) -> Option<Self> {
        let message = message.unwrap_or_else(|| format!("the server answered {outcome}"));
        let code = |default| code.unwrap_or(default);
        Some(match outcome {
            CommandOutcome::Accepted | CommandOutcome::Adopted => return None,
            CommandOutcome::Rejected => Self::Refused {
                code: code(ErrorCode::IllegalTransition),
                message,
            },
            CommandOutcome::Conflict => Self::Conflict {
                code: code(ErrorCode::Conflict),
                message,
            },
            CommandOutcome::NotFound => Self::NotFound {
                code: code(ErrorCode::NotFound),
                message,
            },
            CommandOutcome::ClaimLost => Self::ClaimLost {
                code: code(ErrorCode::ClaimLost),
                message,
            },
            CommandOutcome::Unavailable => Self::ServerUnavailable {
                code: code(ErrorCode::Unavailable),
                message,
            },
        })
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable => f.write_str(
                "the pi-workflows server is not running; start it with `pi-workflows server start`",
            ),
            Self::StartFailed(reason) => f.write_str(reason),
            Self::VersionMismatch(message) => f.write_str(message),
            Self::ConnectionRefused(reason) => write!(
                f,
                "the pi-workflows server refused the connection: {reason}"
            ),
            Self::TimedOut { waited_for, limit } => {
                let within = seconds(*limit);
                match waited_for {
                    Waited::Hello => write!(
                        f,
                        "the pi-workflows server accepted the connection but did not answer the hello within {within}; it may be overloaded or hung: retry later or restart it (PI_WORKFLOWS_CLI_TIMEOUT_MS sets this wait)"
                    ),
                    Waited::Response {
                        operation,
                        state_changing: false,
                    } => write!(
                        f,
                        "the pi-workflows server did not answer `{operation}` within {within}; retry later (PI_WORKFLOWS_CLI_TIMEOUT_MS sets this wait)"
                    ),
                    Waited::Response {
                        operation,
                        state_changing: true,
                    } => write!(
                        f,
                        "the pi-workflows server did not answer `{operation}` within {within}; it may still apply it, so check `pi-workflows runs` before you retry (PI_WORKFLOWS_CLI_TIMEOUT_MS sets this wait)"
                    ),
                }
            }
            Self::Lost(message) => write!(
                f,
                "lost the connection to the pi-workflows server ({message}); retry the command"
            ),
            Self::Invalid(code) => write!(
                f,
                "the request is not valid ({code}) and was not sent; fix the request"
            ),
            Self::Refused { message, .. }
            | Self::Conflict { message, .. }
            | Self::NotFound { message, .. }
            | Self::ClaimLost { message, .. }
            | Self::ServerUnavailable { message, .. } => f.write_str(message),
            Self::Content(failure) => write!(f, "{}; read the content again", failure.message()),
            Self::KeptChanging => {
                f.write_str("the run kept changing while its view was read; run the command again")
            }
            Self::NothingSubscribed => {
                f.write_str("no subscription is open, so no event can come; subscribe first")
            }
        }
    }
}

impl std::error::Error for ClientError {}

/// `1 s`, `1.5 s`.
fn seconds(limit: Duration) -> String {
    let millis = limit.as_millis();
    if millis.is_multiple_of(1000) {
        format!("{} s", millis / 1000)
    } else {
        format!("{} s", limit.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusing_outcome_is_its_own_kind_and_accepted_is_none() {
        let of = |outcome| ClientError::of_outcome(outcome, None, Some("m".into()));
        assert_eq!(of(CommandOutcome::Accepted), None);
        assert_eq!(of(CommandOutcome::Adopted), None);
        assert!(matches!(
            of(CommandOutcome::Conflict),
            Some(ClientError::Conflict { .. })
        ));
        assert!(matches!(
            of(CommandOutcome::NotFound),
            Some(ClientError::NotFound { .. })
        ));
        assert!(matches!(
            of(CommandOutcome::ClaimLost),
            Some(ClientError::ClaimLost { .. })
        ));
        assert!(matches!(
            of(CommandOutcome::Unavailable),
            Some(ClientError::ServerUnavailable { .. })
        ));
        assert_eq!(
            ClientError::of_outcome(
                CommandOutcome::Rejected,
                Some(ErrorCode::Terminal),
                Some("the run ended".into())
            ),
            Some(ClientError::Refused {
                code: ErrorCode::Terminal,
                message: "the run ended".into()
            })
        );
    }

    #[test]
    fn a_timeout_says_what_it_waited_for_and_whether_the_command_may_apply() {
        let limit = Duration::from_millis(1500);
        let hello = ClientError::TimedOut {
            waited_for: Waited::Hello,
            limit,
        };
        assert!(hello.to_string().contains("the hello within 1.5 s"));
        let command = ClientError::TimedOut {
            waited_for: Waited::Response {
                operation: "run.start".into(),
                state_changing: true,
            },
            limit: Duration::from_secs(60),
        };
        assert!(
            command
                .to_string()
                .contains("`run.start` within 60 s; it may still apply it")
        );
    }
}
