//! The client channel's outgoing side: response documents, frames that
//! always reach their receiver (an oversized one becomes its bounded
//! substitute), and the bounded queue of one connection.

use protocol::ErrorCode;
use protocol::generated::constrained::Revision;
use protocol::generated::types::{
    Availability, ClientEvent, ClientMessage, ClientSchemaId, CommandOutcome, JsonObject, SafeError,
};
use serde::Deserialize as _;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// A receipt of a generated receipt type, as the `receipt` of a response
/// ([`response`] refuses anything but an object).
pub fn receipt<T: serde::Serialize>(receipt: &T) -> Value {
    serde_json::to_value(receipt).unwrap_or(Value::Null)
}

/// A response frame as JSON, built as the generated
/// `ClientMessage::Response` (so every field has its schema type: the
/// operation and outcome are the schema's enums, the request id its
/// pattern, the error a `SafeError` of at most 512 characters). A value
/// that does not fit its type is a server bug: it is logged and answered
/// with nothing (`Value::Null`, which [`frame`] turns into an `internal`
/// error event), never sent off its schema.
pub fn response(
    request_id: &str,
    operation: &str,
    outcome: &str,
    revision: Option<u64>,
    receipt: Option<Value>,
    error: Option<(ErrorCode, String)>,
) -> Value {
    let typed = || -> Option<ClientMessage> {
        Some(ClientMessage::Response {
            error: match error {
                Some((code, message)) => Some(SafeError {
                    code,
                    message: message.chars().take(512).collect::<String>().parse().ok()?,
                }),
                None => None,
            },
            operation: operation.parse().ok()?,
            outcome: outcome.parse().ok()?,
            receipt: match receipt {
                Some(Value::Object(fields)) => Some(JsonObject(fields)),
                Some(_) => return None,
                None => None,
            },
            request_id: request_id.parse().ok()?,
            revision: match revision {
                Some(revision) => Some(Revision::new(revision)?),
                None => None,
            },
            schema: ClientSchemaId::PiWorkflowsClientV1,
        })
    };
    match typed().and_then(|message| serde_json::to_value(message).ok()) {
        Some(value) => value,
        None => {
            crate::log::line(&format!(
                "a {operation} response did not fit its schema type; answered with an error event"
            ));
            Value::Null
        }
    }
}

/// One frame on its way to the socket, with an optional drain notification.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) frame: Vec<u8>,
    pub(crate) written: Option<oneshot::Sender<()>>,
}

/// The bounded write side of one connection.
#[derive(Clone, Debug)]
pub struct Outbox {
    pub(crate) sender: mpsc::Sender<Outgoing>,
    /// This connection's process-local id (the coordinator epochs' owner).
    pub(crate) connection: kernel::ids::ConnectionId,
}

impl Outbox {
    /// The id of the connection this outbox writes to.
    pub fn connection_id(&self) -> &kernel::ids::ConnectionId {
        &self.connection
    }

    /// Queues a frame; waits while the connection's queue is full. Returns
    /// `false` when the connection is gone.
    pub async fn send(&self, frame: Vec<u8>) -> bool {
        self.sender
            .send(Outgoing {
                frame,
                written: None,
            })
            .await
            .is_ok()
    }

    /// Queues a frame and waits until it was written to the socket. Returns
    /// `false` when the connection closed first.
    pub async fn send_and_drain(&self, frame: Vec<u8>) -> bool {
        let (written, done) = oneshot::channel();
        if self
            .sender
            .send(Outgoing {
                frame,
                written: Some(written),
            })
            .await
            .is_err()
        {
            return false;
        }
        done.await.is_ok()
    }

    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// Encodes a client-channel message as a frame. Every page and view is
/// bounded to fit one; should a message still not fit, its receiver is told
/// so: a response becomes a `frameTooLarge` response to the same request
/// id, an event an `unavailable` availability event of the same
/// subscription. Nothing is dropped silently.
pub fn frame(value: &Value) -> Vec<u8> {
    if let Some(frame) = crate::wire::frames::client(value) {
        return frame;
    }
    match ClientMessage::deserialize(value) {
        Ok(ClientMessage::Response {
            request_id,
            operation,
            ..
        }) => {
            let substitute = || {
                Some(ClientMessage::Response {
                    error: Some(SafeError {
                        code: ErrorCode::FrameTooLarge,
                        message: "the response did not fit one 1 MiB frame; report this server bug"
                            .parse()
                            .ok()?,
                    }),
                    operation,
                    outcome: CommandOutcome::Unavailable,
                    receipt: None,
                    request_id,
                    revision: None,
                    schema: ClientSchemaId::PiWorkflowsClientV1,
                })
            };
            substitute()
                .as_ref()
                .and_then(crate::wire::frames::client_message)
                .unwrap_or_else(|| error_frame("internal", "the reply did not fit a frame"))
        }
        // `frames::event` substitutes an event that does not fit.
        Ok(ClientMessage::Event {
            event,
            revision,
            subscription_id,
            ..
        }) => crate::wire::frames::event(&subscription_id, revision.get(), event),
        Ok(ClientMessage::Hello { .. } | ClientMessage::Request { .. }) | Err(_) => {
            error_frame("internal", "the reply did not fit a frame")
        }
    }
}

/// The bounded error frame sent before a connection closes.
pub(crate) fn error_frame(code: &str, message: &str) -> Vec<u8> {
    let event = ClientEvent::Availability {
        reason: format!("{code}: {message}").parse().ok(),
        state: Availability::Unavailable,
    };
    match "connection".parse() {
        Ok(subscription_id) => crate::wire::frames::event(&subscription_id, 0, event),
        Err(_) => Vec::new(),
    }
}
