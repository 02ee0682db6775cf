//! `channel.status`, `channel.reload` and `channel.recover`: the channel
//! adapters as the operator sees and steers them (docs/CHANNELS.md).
//!
//! Invariants:
//! - Status shows each configured profile's state and one safe diagnostic;
//!   never a token, an identity or a path.
//! - `channel.recover` is `effect.recover` on the channel send or
//!   settlement edit its attempt id names, refused unless that attempt is
//!   the effect's current one and the effect belongs to the named profile;
//!   a retry reserves the next numbered attempt, which the profile's
//!   adapter sends (or edits) again.

use super::receipts::{Executed, command};
use super::request::Request;
use crate::context::Context;
use crate::context::channels::AdapterState;
use crate::projection::run_view::{OffSchema, to_wire};
use crate::store::{channels, runs};
use crate::wire::client::{receipt, response};
use kernel::channel::ChannelRejection;
use protocol::ErrorCode;
use protocol::generated::types::{
    ChannelRecoverPayload, ChannelRecoverReceipt, ChannelReloadReceipt, ChannelState,
    ChannelStatusReceipt, ChannelStatusRow,
};
use serde_json::Value;
use std::sync::Arc;

/// `channel.status`.
pub(super) fn status(app: &Arc<Context>, request: &Request) -> Value {
    let (profiles, diagnostic) = app.channels.snapshot();
    let built: Result<ChannelStatusReceipt, OffSchema> = (|| {
        let channels = profiles
            .into_iter()
            .map(|(profile, row)| {
                Ok(ChannelStatusRow {
                    profile: to_wire("profile", profile)?,
                    state: match row.state {
                        AdapterState::Running => ChannelState::Running,
                        AdapterState::Stopped => ChannelState::Stopped,
                        AdapterState::Failed => ChannelState::Failed,
                    },
                    attempt_id: row
                        .attempt_id
                        .map(|id| to_wire("attemptId", id))
                        .transpose()?,
                    diagnostic: row
                        .diagnostic
                        .map(|text| to_wire("diagnostic", text))
                        .transpose()?,
                })
            })
            .collect::<Result<Vec<_>, OffSchema>>()?;
        Ok(ChannelStatusReceipt {
            channels,
            diagnostic: diagnostic
                .map(|text| to_wire("diagnostic", text))
                .transpose()?,
        })
    })();
    match built {
        Ok(status) => response(
            &request.request_id,
            &request.operation,
            "accepted",
            None,
            Some(receipt(&status)),
            None,
        ),
        Err(_) => response(
            &request.request_id,
            &request.operation,
            "rejected",
            None,
            None,
            Some((
                ErrorCode::Internal,
                "a channel status does not fit its schema".into(),
            )),
        ),
    }
}

/// `channel.reload`: reads the configuration again and restarts every
/// adapter; the receipt counts the profiles configured now.
pub(super) async fn reload(app: &Arc<Context>, request: Request) -> Value {
    let app_for_job = app.clone();
    command(app, request, move |_, _| {
        app_for_job.channels.reload.notify_one();
        let configured = crate::channel_config::load(&app_for_job.config.channels_dir())
            .profiles
            .len();
        let reloaded = ChannelReloadReceipt {
            reloaded: to_wire("reloaded", configured)?,
        };
        Ok(Executed::done(&reloaded))
    })
    .await
}

/// `channel.recover`.
pub(super) async fn recover(
    app: &Arc<Context>,
    request: Request,
    payload: ChannelRecoverPayload,
) -> Value {
    let profile = payload.profile.to_string();
    let named = kernel::channel::parse_attempt_id(payload.attempt_id.as_str());
    command(app, request, move |connection, now_ms| {
        let Some((effect_id, number)) = named else {
            return Ok(Executed::rejected(&ChannelRejection::StaleAttempt));
        };
        let Some(run_id) = channels::run_of_effect(connection, &effect_id)? else {
            return Ok(Executed::rejected(&ChannelRejection::StaleAttempt));
        };
        let (Some(before), Some(send)) = (
            runs::load(connection, &run_id)?,
            runs::load_effect(connection, &run_id, &effect_id)?,
        ) else {
            return Ok(Executed::rejected(&ChannelRejection::StaleAttempt));
        };
        let of_profile = [
            kernel::channel::send_type(&profile),
            kernel::channel::settle_type(&profile),
        ];
        if !of_profile.contains(&send.key.effect_type) || send.attempt_number != number {
            return Ok(Executed::rejected(&ChannelRejection::StaleAttempt));
        }
        let recovered = match super::decisions::recover_in(
            connection,
            &before,
            &effect_id,
            payload.action,
            now_ms,
        )? {
            Ok(recovered) => recovered,
            Err(refused) => return Ok(refused),
        };
        let receipt = ChannelRecoverReceipt {
            attempt_id: to_wire(
                "attemptId",
                kernel::channel::attempt_id(&effect_id, recovered.effect.attempt_number),
            )?,
            state: to_wire("state", recovered.effect.state)?,
        };
        Ok(Executed::accepted(
            recovered.revision,
            &receipt,
            recovered.outputs,
        ))
    })
    .await
}
