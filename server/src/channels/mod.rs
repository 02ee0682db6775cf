//! Supervised channel adapters: one transport-only child per configured
//! Telegram profile (docs/CHANNELS.md).
//!
//! Invariants:
//! - At startup, every channel send or settlement edit a previous server
//!   left applying becomes ambiguous before any adapter starts (its adapter
//!   is gone; it is never sent again without an operator's recovery).
//! - The configuration is read at startup and at each `channel.reload`; a
//!   reload stops every adapter (their applying sends become ambiguous)
//!   and starts the profiles configured now. A profile that cannot run is
//!   `failed` with its diagnostic, and its decisions simply stay waiting.
//! - Stopping the server stops the adapters.

mod adapter;
mod render;

use crate::channel_config::{self, Loaded, Profile};
use crate::context::Context;
use crate::context::channels::{AdapterState, ProfileStatus};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::Notify;

/// Runs the channel adapters of `configured` (what [`configure`] read at
/// startup) until the server stops, reading the configuration again at
/// each reload.
pub async fn run(app: Arc<Context>, configured: BTreeMap<String, Result<Profile, String>>) {
    if let Ok(applying) = app.store.read(crate::store::channels::applying_sends).await {
        for (run_id, effect_type) in applying {
            if let Some(profile) = kernel::channel::profile_of(&effect_type) {
                adapter::lose(&app, run_id, profile.to_owned()).await;
            }
        }
    }
    let mut profiles = configured;
    loop {
        let mut running = Vec::new();
        for profile in profiles.into_values().flatten() {
            let stop = Arc::new(Notify::new());
            let task = tokio::spawn(adapter::supervise(app.clone(), profile, stop.clone()));
            running.push((stop, task));
        }
        tokio::select! {
            () = app.channels.reload.notified() => {}
            () = app.stop_requested.notified() => {}
        }
        for (stop, _) in &running {
            stop.notify_one();
        }
        for (_, task) in running {
            let _ = task.await;
        }
        if app.is_stopping() {
            return;
        }
        profiles = configure(&app);
    }
}

/// Reads the configuration and shows it in status (each usable profile
/// `stopped` until its adapter is ready, each broken one `failed` with its
/// diagnostic). The server calls it once before it reports ready, so
/// status never misses a configured profile.
pub fn configure(app: &Context) -> BTreeMap<String, Result<Profile, String>> {
    let Loaded {
        profiles,
        diagnostic,
    } = channel_config::load(&app.config.channels_dir());
    if let Some(diagnostic) = &diagnostic {
        crate::log::line(&format!("channels: {diagnostic}"));
    }
    let rows: BTreeMap<String, ProfileStatus> = profiles
        .iter()
        .map(|(name, profile)| {
            let row = match profile {
                Ok(_) => ProfileStatus {
                    state: AdapterState::Stopped,
                    diagnostic: None,
                    attempt_id: None,
                },
                Err(diagnostic) => {
                    crate::log::line(&format!("channels: {diagnostic}"));
                    ProfileStatus {
                        state: AdapterState::Failed,
                        diagnostic: Some(diagnostic.clone()),
                        attempt_id: None,
                    }
                }
            };
            (name.clone(), row)
        })
        .collect();
    app.channels.configure(rows, diagnostic);
    profiles
}
