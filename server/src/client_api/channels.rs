//! `channel.status`, `channel.reload` and `channel.recover`: the channel
//! adapters as the operator sees and steers them (docs/CHANNELS.md).
//!
//! Invariants:
//! - Status shows each configured profile's state and one safe diagnostic;
//!   never a token, an identity or a path.
//! - `channel.recover` is `effect.recover` on the channel send its attempt
//!   id names, refused unless that attempt is the send's current one and
//!   the send belongs to the named profile; a retry reserves the next
//!   numbered attempt, which the profile's adapter sends again.

use super::receipts::{Executed, command};
use super::request::Request;
use crate::context::Context;
use crate::context::channels::AdapterState;
use crate::projection::run_view::{OffSchema, to_wire};
use crate::store::blobs::{self, Blob};
use crate::store::{channels, runs};
use crate::wire::client::{receipt, response};
use kernel::channel::ChannelRejection;
use kernel::effect::RecoveryAction;
use kernel::output::Step;
use kernel::receipt::CommandOutcome;
use protocol::ErrorCode;
use protocol::generated::types::{
    ChannelRecoverPayload, ChannelRecoverReceipt, ChannelReloadReceipt, ChannelState,
    ChannelStatusReceipt, ChannelStatusRow, RecoverAction,
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
    let action = match payload.action {
        RecoverAction::Confirm => RecoveryAction::Confirm,
        RecoverAction::Retry => RecoveryAction::Retry,
    };
    let profile = payload.profile.to_string();
    let named = kernel::channel::parse_attempt_id(payload.attempt_id.as_str());
    let observed = Blob::json(&Value::Null);
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
        if send.key.effect_type != kernel::channel::send_type(&profile)
            || send.attempt_number != number
        {
            return Ok(Executed::rejected(&ChannelRejection::StaleAttempt));
        }
        let transition =
            match kernel::effect::recover(&before, &effect_id, action, observed.digest, now_ms) {
                Ok(transition) => transition,
                Err(rejection) => return Ok(Executed::rejected(&rejection)),
            };
        let Some(after) = transition
            .facts
            .effects
            .iter()
            .find(|effect| effect.effect_id == effect_id)
        else {
            return Ok(Executed::refused(
                CommandOutcome::Rejected,
                ErrorCode::Internal,
                "the recovered channel send is missing",
            ));
        };
        let recovered = ChannelRecoverReceipt {
            attempt_id: to_wire(
                "attemptId",
                kernel::channel::attempt_id(&effect_id, after.attempt_number),
            )?,
            state: to_wire("state", after.state)?,
        };
        blobs::put(connection, &observed, blobs::JSON, now_ms)?;
        let revision = transition.facts.run.revision;
        let outputs =
            crate::shell::write_step(connection, &before, Step::Apply(transition), &[], now_ms)?;
        Ok(Executed::accepted(revision, &recovered, outputs))
    })
    .await
}
