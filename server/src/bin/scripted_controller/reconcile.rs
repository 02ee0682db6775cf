//! Reconcile mode: one pass under a claim, following the spec's
//! `reconcile` script.
//!
//! This is where reconcile scripts go (effects, child workflows, deadlines,
//! crashes): each step a message of `ControllerChildMessage`, each waiting
//! for its reply. None exists yet, so a pass answers `failed` (a failed
//! pass the server backs off) and exits 0.

use crate::channel::Channel;
use crate::log;
use protocol::generated::types::ControllerLaunch;
use serde_json::json;

pub(crate) fn reconcile(channel: &mut Channel, _launch: &ControllerLaunch) -> ! {
    log!("reconcile: no reconcile script support yet");
    channel.request(json!({
        "kind": "failed",
        "message": "the scripted controller has no reconcile script support yet",
    }));
    std::process::exit(0);
}
