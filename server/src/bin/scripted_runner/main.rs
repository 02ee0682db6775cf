//! `pi-workflows-scripted-runner`: a runner used only by the server's
//! black-box tests. It speaks the real runner.v1 channel (`docs/PROTOCOL.md`)
//! and, instead of compiling and running a `.workflow.ts` file, follows a
//! JSON script.
//!
//! # The channel
//!
//! The first stdin line is the launch envelope (`WorkerLaunch`); every later
//! line is a server frame (`command`, `reply`, `content.chunk`). Every frame
//! the runner writes is `encode_runner(..)` on stdout, flushed at once.
//! Message ids are `<runnerEpoch>-m<counter>`; `runId`, `generation` and
//! `runnerEpoch` come from the launch; `expectedRevision` is omitted. What
//! the runner does is logged briefly to stderr.
//!
//! A command whose `state` is `{kind: reference}` and a reply that carries
//! `resultContent` are read with `content.read` in verified parts of at most
//! 512 KiB (`protocol::content::Assembler`); content that cannot be read is
//! one log line, `runner.exiting {reason: fatal}` and exit 2.
//!
//! The runner waits for the reply of `node.update`, `effect.reserve`,
//! `effect.settle`, `runner.progress`, `node.finished` and `node.failed`
//! (one per copy of a duplicated message). It does not wait after
//! `node.started` (a reply to it is skipped later), nor after
//! `runner.exiting`, `run.parked` and `resolve.*` (it exits, or after
//! `resolve.result` waits for its run's launch). A `claimLost`
//! reply to any message ends the runner (exit 3), see
//! `keepWritingAfterClaimLost`.
//!
//! # Modes
//!
//! - **resolve** (`resolve: {workflow, input}`): `workflow` is the path of
//!   a script file, absolute or relative to `projectPath`. A missing file is
//!   `resolve.failed {code: sourceNotFound}`; a script that does not parse
//!   is `compileFailed`; a topology that is not the protocol's `Topology` is
//!   `invalidDefinition`; `"rejectInput": true` is `invalidInput`;
//!   `"resolveDelayMs": N` waits N ms (after parsing) first. Otherwise
//!   it sends `resolve.result {workflowName, workflowSource: {root: {kind:
//!   file, path, hash: "sha256:<hex of the file bytes>"}, mounted: []},
//!   definitionDigest: "sha256:<hex of the topology's canonical JSON>",
//!   topology, input (as given), title?, awaitsRun: true}` and reads one
//!   more stdin line: a run launch, which it runs in this process exactly as
//!   run mode below (the source check included), or EOF, on which it exits
//!   0. `"resolveOnly": true` leaves `awaitsRun` out and exits 0 after the
//!   result, as after `resolve.failed`.
//! - **run**: it re-hashes `workflowSource.root.path` (and any mounted
//!   file); a missing or changed file is `run.parked {reason:
//!   workflowSourceChanged}` and exit 0, before any node. Otherwise it
//!   applies `startup`, sends `runner.ready {sourceVerified: true}` and waits:
//!   a `command` (or a reply whose `next` is `runNode`) runs that node; a
//!   reply whose `next` is `exit` sends `runner.exiting` with that reason
//!   and exits 0. After each `node.finished`/`node.failed` the reply's
//!   `next` decides the same way.
//! - **validate**: with a script `validate` entry (below), it re-hashes
//!   the saved source, sends `runner.ready`, waits for the `validate`
//!   command, then after `delayMs` sends `interaction.accepted {output:
//!   {"valid": true, "submissionId"}}` (or `interaction.rejected` with the
//!   `reject` message), waits for its reply, sends `runner.exiting
//!   {finished}` and exits 0. Without a `validate` entry it logs and exits
//!   2 without a verdict.
//!
//! # Script format
//!
//! ```json
//! {"workflowName": "linear", "title": "optional", "comment": "ignored",
//!  "topology": {"startAt": "a", "nodes": [...], "edges": [...], "mounts": []},
//!  "rejectInput": false, "resolveDelayMs": 0, "resolveOnly": false,
//!  "startup": {"exitBeforeReady": 3, "readyDelayMs": 0, "exitAfterReady": 3,
//!              "ignoreSigterm": false, "keepWritingAfterClaimLost": false},
//!  "nodes": {"a": [{"finish": {"x": 1}}], "b": [{"fail": "boom"}], "c": [{"stall": true}]},
//!  "validate": {"reject": "why", "delayMs": 0, "ignoreSigterm": false, "record": "validations.log"}}
//! ```
//!
//! `validate` (validate mode): `reject` rejects with that message (absent:
//! accept); `delayMs` waits before the verdict; `ignoreSigterm` as in
//! `startup`; `record` appends `started <submissionId> <pid>` when the
//! command arrives and `verdict <submissionId> <pid>` just before the verdict.
//!
//! Only `topology` is required (the kernel topology JSON, passed through).
//! `workflowName` defaults to the file stem. Unknown fields are errors.
//!
//! `startup` (run mode, after the source check): `exitBeforeReady: N` exits
//! with N before `runner.ready`; `failBeforeReady: "<message>"` reports
//! `run.finished` failed (class `sourceChanged`, as a runner whose workflow
//! no longer loads) before it, then exits 0; `readyDelayMs` waits before it;
//! `exitAfterReady: N` exits with N right after it; `ignoreSigterm` makes
//! SIGTERM do nothing (SIGKILL still kills); `keepWritingAfterClaimLost`
//! makes a runner that got a `claimLost` reply send `node.update` messages
//! (fresh ids, update type `fenced`) every 100 ms, 20 times, logging each
//! reply (or its absence after 500 ms), then exit 3. SIGSTOP/SIGCONT just
//! pause that loop. `recordState: "<file>"` writes the run state of the
//! command the runner received (canonical JSON) to that file.
//!
//! `nodes[nodeId]` is a list of behaviours indexed by the dispatch's
//! `visit` (visit 1 is index 0; beyond the end the last one repeats). A node
//! without an entry finishes with output `{"node": "<id>", "visit": N}`.
//!
//! An attempt dispatched with a committed deadline (`next.deadline: {kind:
//! committed}` of a reply to `node.finished`, `node.failed` or
//! `notification.requested`) starts at once: the server recorded its
//! deadline with the result and enforces it (its deadline wake); the runner
//! only logs it. Any other attempt (the `command`'s node, `next.deadline:
//! {kind: runnerResolves}`, or a `next` without `deadline`) begins with
//! `node.started {attemptId, deadlineAtMs?}`: the deadline is now + ms for a
//! `timeout` of kind `ms`, now + 15 min for `default`, none for `none`, and
//! for `dynamic` now + the `timeoutMs` of the behaviour (any behaviour of
//! the chain may carry `timeoutMs`; the outermost wins; none means no
//! deadline). Then the behaviour runs. Each
//! behaviour names exactly one action; wrappers take an optional `then`
//! (default: the default finish):
//!
//! | behaviour | what happens |
//! |---|---|
//! | `{"finish": <json>}` | `node.finished {output}` |
//! | `{"fail": "<message>", "outcome": "failed"\|"timed_out"\|"cancelled"}` | `node.failed {outcome, error: {code, message}}`; code `nodeFailed`, `timedOut` or `cancelled`; outcome defaults to `failed` |
//! | `{"sleepMs": N, "then": B}` | sleep, then B |
//! | `{"stall": true}` | block until killed |
//! | `{"awaitFile": "<path>", "then": B}` | wait until the file exists, then B |
//! | `{"ifFile": "<path>", "then": B, "else": C}` | B when the file exists, C otherwise (each defaults to the default finish) |
//! | `{"exit": N}` | exit with N at once (a crash mid-node) |
//! | `{"crashOnce": "<marker>", "then": B}` | no marker file: create it, exit 3; otherwise B |
//! | `{"update": {"type", "key", "data"}, "idempotencyKey"?: K, "then": B}` | `node.update {update, idempotencyKey}` (default key: `u-` + 16 hex of the digest of attempt id and update), its reply, then B |
//! | `{"effect": {"type", "request", "applyLog"?, "result"?, "receipt"?, "applyMs"?}, "crashWhileApplying"?: bool, "then": B}` | see below |
//! | `{"spawnChild": {"sleepSeconds": 1000, "newGroup": false}, "then": B}` | start `sleep N` (in its own process group when `newGroup`), `runner.progress {operation: process.register, pid, startIdentity}`, then B; the child is never reaped |
//! | `{"stderrBytes": N, "then": B}` | write N bytes of numbered 100-byte lines (`stderr line 00000000 xxx…`) to stderr, then B |
//! | `{"duplicate": true, "then": B}` | the next message B sends goes out twice with one message id (both replies are read and logged) |
//! | `{"contentRead": {"reference", "offset"?: 0, "length"?: 524288, "record": "<file>"}, "then": B}` | `content.read`; its chunk or refusing reply is appended to `record` as one JSON line (`{type: "content.chunk", offset, reference, bytes, final}` or `{type: "reply", outcome, error}`), then B |
//! | `{"interact": {"prompt": "<text>", "kind"?: "agent", "contract"?: <json>, "headless"?: B}}` | `interaction.requested {attemptId, kind, prompt: {kind: inline, text}, contract}`; an accepted reply's `next` (an exit, `waiting`) is followed; a refused one fails the node; a headless run's accepted reply has no `next` (the attempt stays active under the runner's claim while its Pi works): with `headless` the attempt goes on with B, without it the node fails |
//! | `{"protocolViolation": "schema"\|"revision"\|"attempt"\|"idempotency"}` | one message that fails that protocol check — a canonical frame that is not a runner message; `node.finished` with `expectedRevision` 2^53−1; `node.finished` for attempt `an-attempt-never-dispatched`; a `node.update` and then another payload under its message id — then block until killed |
//! | `{"notify": {"text": "<text>", "kind"?: "progress"\|"final"}}` | `notification.requested {attemptId, kind, content: {kind: inline, text}}`; the server records the node's result, so an accepted reply's `next` is followed (no `node.finished`); a refused one fails the node |
//!
//! An effect: `effect.reserve {effectType, requestDigest: sha256 of the
//! request's canonical JSON}`. A `rejected` reply fails the node with the
//! reply's error. If the reply's `result.state` is `applied` nothing is
//! applied (nor settled); `reserved`/`applying` "apply" by appending the line
//! `<effectId> <attemptNumber>` to `applyLog` (how tests count real
//! applications) and waiting `applyMs` (default 0: how long the application
//! takes), then exit 3 when `crashWhileApplying`, else `effect.settle
//! {effectId, state: applied, result}` (`result` defaults to
//! `{"applied":true}`; `"padSettleFrameTo": N` settles `{"pad": "x…"}`
//! instead, sized so the `effect.settle` frame is exactly N bytes); any
//! other state fails the node (`conflict`). With
//! `"receipt": true` the attempt's final message carries `action: {effectId,
//! state, result}`.
//!
//! `startIdentity` is the server's `ProcessIdentity` text form
//! (`<pid>:<start time>`, the start time being field 22 of
//! `/proc/<pid>/stat`). Relative paths (a `crashOnce` marker, an `applyLog`)
//! are resolved against the script's directory.
//!
//! # Exit codes
//!
//! 0 done (resolved, told to exit, parked); 2 a bad launch, script or
//! server answer; 3 a scripted crash or a lost claim; 4 the channel closed
//! while the runner needed it; any code a script names.

#![allow(clippy::print_stderr)]

mod channel;
mod resolve;
mod run;
mod script;
mod validate;

use protocol::generated::types::LaunchMode;
use sha2::{Digest as _, Sha256};

/// A bad launch, script or server answer.
pub(crate) const EXIT_PROTOCOL: i32 = 2;
/// A scripted crash or a lost claim.
pub(crate) const EXIT_CRASH: i32 = 3;
/// The channel closed while the runner needed it.
pub(crate) const EXIT_CHANNEL_CLOSED: i32 = 4;

/// Logs one line to stderr. A stderr nobody reads any more (the server
/// that copied it into the runner log died) is ignored, not a panic.
macro_rules! log {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "scripted-runner[{}]: {}",
            std::process::id(),
            format_args!($($arg)*)
        );
    }};
}
pub(crate) use log;

/// `sha256:<64 lowercase hex>` of `bytes`.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn main() {
    let mut stdin = channel::Stdin::new();
    let launch = match stdin.launch() {
        Ok(Some(launch)) => launch,
        Ok(None) => {
            log!("stdin closed before the launch envelope");
            std::process::exit(EXIT_PROTOCOL);
        }
        Err(e) => {
            log!("{e}");
            std::process::exit(EXIT_PROTOCOL);
        }
    };
    launched(&launch);
    match launch.mode {
        LaunchMode::Resolve => resolve::resolve(&launch, stdin),
        LaunchMode::Run => run::run(&launch, channel::Channel::open(&launch, Some(stdin))),
        LaunchMode::Validate => {
            validate::validate(&launch, channel::Channel::open(&launch, Some(stdin)))
        }
    }
}

/// Logs the launch this process got.
pub(crate) fn launched(launch: &protocol::WorkerLaunch) {
    log!(
        "launched: mode {}, run {}, generation {}, epoch {}",
        launch.mode,
        launch.run_id.as_str(),
        launch.generation,
        launch.runner_epoch.as_str()
    );
}
