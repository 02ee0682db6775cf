//! `pi-workflows-scripted-controller`: a controller child used only by the
//! server's black-box tests. It speaks the real controller.v1 channel
//! (NDJSON on stdin/stdout, `protocol/runner.v1.schema.json` `$defs`:
//! `ControllerLaunch`, `ControllerChildMessage`, `ControllerServerMessage`)
//! and, instead of loading a `.controller.ts` module, follows a script
//! carried in the resource's spec.
//!
//! # The channel
//!
//! The first stdin line is the `ControllerLaunch`; every later line is a
//! `reply`. The child writes one message per line with `requestId` 1, 2, …
//! and waits for the reply of each before the next. What it does is logged
//! briefly to stderr (never the spec).
//!
//! # Modes
//!
//! - **resolve** (`controller.resolve`, see `resolve.rs`): it reads the
//!   file at `controllerPath` (any bytes: the script is the spec, not the
//!   file) and answers `resolved {exportName: "default", initialStatus,
//!   sourceDigest: "sha256:<hex of the file bytes>", timeoutMs?}`, then
//!   waits for the reply and exits 0. The spec's fields choose:
//!   - `initialStatus`: the status document (default `{}`);
//!   - `timeoutMs`: the controller's reconcile deadline;
//!   - `resolveFail: "<ResolveFailureCode>"`: answer `resolveFailed` with
//!     that code instead;
//!   - `resolveDelayMs: N`: wait N ms first (a deadline test sets it past
//!     the server's `PI_WORKFLOWS_READY_TIMEOUT_MS`);
//!   - `resolveExit: true`: exit 3 without answering;
//!   - `changeSourceAfterDigest: true`: append a line to the controller
//!     file after hashing it and before answering (the file changed between
//!     resolve and the server's commit);
//!   - `shadowAfterResolve: true`: create
//!     `<projectPath>/.pi/controllers/<controller>.controller.ts` before
//!     answering (discovery names another file at commit).
//! - **reconcile** (`controller.reconcile`): one pass following the
//!   spec's `reconcile` script (`reconcileDeleting` once deletion was
//!   requested); the steps are listed in `reconcile.rs`.

mod channel;
mod reconcile;
mod resolve;

use protocol::generated::types::ControllerLaunch;

/// The exit code of a protocol error (an unreadable launch or reply).
pub(crate) const EXIT_PROTOCOL: i32 = 2;

/// One line on stderr.
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("scripted-controller: {}", format_args!($($arg)*))
    };
}
pub(crate) use log;

fn main() {
    let mut channel = channel::Channel::new();
    let Some(line) = channel.read_line() else {
        log!("no launch on stdin");
        std::process::exit(EXIT_PROTOCOL);
    };
    let launch: ControllerLaunch = match serde_json::from_str(&line) {
        Ok(launch) => launch,
        Err(_) => {
            log!("the launch is not a ControllerLaunch");
            std::process::exit(EXIT_PROTOCOL);
        }
    };
    match launch {
        ControllerLaunch::ControllerResolve {
            controller,
            controller_path,
            project_path,
            spec,
        } => resolve::resolve(
            &mut channel,
            &controller,
            controller_path.as_str(),
            project_path.as_str(),
            &spec,
        ),
        ControllerLaunch::ControllerReconcile { .. } => reconcile::reconcile(&mut channel, &launch),
    }
}
