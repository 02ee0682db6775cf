//! What a runner-message handler answers: the transition to write, the
//! reply's typed `result` and a follow-up write ([`Answer`]), or why the message
//! was refused ([`Refusal`], its code from the kernel's rejection). Shared
//! by the dispatcher (`runner_api`) and its sub-handlers, so none of them
//! depends on the dispatcher.

use kernel::output::Transition;
use kernel::reject::Coded;
use kernel::run::{Rejection, RunAggregate};
use kernel::runner::ProtocolCheck;
use rusqlite::Connection;

use crate::runner_api::reply::ReplyResult;

/// A write that follows the aggregate write of the same job (rows the
/// transition just created).
pub(crate) type Extra = Box<dyn FnOnce(&Connection) -> rusqlite::Result<()>>;
/// A message decision: the transition to write, the reply's `result`, and a
/// follow-up write.
pub(crate) type Answer =
    Result<(Option<Transition<RunAggregate>>, ReplyResult, Option<Extra>), Refusal>;

/// Why a runner message was refused: a closed wire code, a static message,
/// whether the runner lost its claim (then it must exit), and the protocol
/// check it failed, if any (then the run is parked `protocolRejected`).
#[derive(Debug)]
pub struct Refusal {
    pub code: protocol::ErrorCode,
    pub message: &'static str,
    pub claim_lost: bool,
    pub protocol: Option<ProtocolCheck>,
}

impl Refusal {
    /// A message whose payload the server cannot act on (`schemaInvalid`).
    pub(crate) fn invalid(message: &'static str) -> Self {
        Self {
            code: protocol::ErrorCode::SchemaInvalid,
            message,
            claim_lost: false,
            protocol: None,
        }
    }

    /// The refusal of any kernel rejection: its code, message and protocol
    /// check come from the kernel (`kernel::reject`).
    pub(crate) fn of<R: Coded>(rejection: &R) -> Self {
        Self {
            code: crate::wire::error_code(rejection.code()),
            message: rejection.message(),
            claim_lost: rejection.is_claim_loss(),
            protocol: rejection.protocol_check(),
        }
    }
}

impl From<Rejection> for Refusal {
    fn from(rejection: Rejection) -> Self {
        Self::of(&rejection)
    }
}
