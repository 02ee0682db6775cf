//! `subscribe`: the response (with the subscription id) is written before
//! the subscription's first event.

use super::request::{Request, not_found, unavailable};
use crate::context::Context;
use crate::presentation::hub::{MAX_SUBSCRIPTIONS, NotStarted, Subscriptions, Target};
use crate::store::runs;
use crate::wire::client::Outbox;
use crate::wire::client::response;
use kernel::ids::{RunId, SessionId};
use protocol::ErrorCode;
use protocol::generated::types::{SubscribePayload, SubscribeReceipt, SubscriptionTarget};
use serde_json::Value;
use std::sync::Arc;

/// `subscribe`: the response (with the subscription id) is written before the
/// subscription's first event; `None` because the subscription task sends it.
pub(super) async fn subscribe(
    app: &Arc<Context>,
    request: &Request,
    payload: &SubscribePayload,
    outbox: &Outbox,
    subscriptions: &Subscriptions,
) -> Option<Value> {
    let target = match &payload.target {
        SubscriptionTarget::RunList => Target::RunList,
        SubscriptionTarget::Run { run_id } => Target::Run(RunId::new(run_id.to_string())),
        SubscriptionTarget::Session { session_id } => {
            Target::Session(SessionId::new(session_id.to_string()))
        }
        SubscriptionTarget::Maintenance => Target::Maintenance,
    };
    if let Target::Run(run_id) = &target {
        let run_id = run_id.clone();
        let exists = app
            .store
            .read(move |connection| Ok(runs::load(connection, &run_id)?.is_some()))
            .await;
        match exists {
            Ok(true) => {}
            Ok(false) => {
                return Some(not_found(
                    request,
                    "no run with this id; check `pi-workflows runs`",
                ));
            }
            Err(_) => return Some(unavailable(request)),
        }
    }
    let from = payload.from_revision.map(|revision| revision.get());
    let request_id = request.request_id.clone();
    let started = subscriptions.start(
        &app.presentation,
        outbox,
        target,
        from,
        move |subscription_id| {
            response(
                &request_id,
                "subscribe",
                "accepted",
                None,
                subscription_id
                    .parse()
                    .ok()
                    .map(|subscription_id| SubscribeReceipt { subscription_id })
                    .and_then(|receipt| serde_json::to_value(receipt).ok()),
                None,
            )
        },
    );
    match started {
        Ok(_) => None,
        Err(NotStarted::Full) => Some(response(
            &request.request_id,
            "subscribe",
            "rejected",
            None,
            None,
            Some((
                ErrorCode::RateLimited,
                format!(
                    "this connection already holds {MAX_SUBSCRIPTIONS} subscriptions; unsubscribe one first"
                ),
            )),
        )),
        // The connection is gone: nobody reads an answer.
        Err(NotStarted::Closed) => None,
    }
}
