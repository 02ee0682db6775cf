//! Validate mode: the validation child of a submission. It verifies the
//! source, sends `runner.ready`, waits for the `validate` command and sends
//! the verdict the script's `validate` entry names.

use std::io::Write as _;
use std::path::Path;
use std::thread;
use std::time::Duration;

use protocol::WorkerLaunch;
use serde_json::json;

use crate::channel::Channel;
use crate::script::Script;
use crate::{EXIT_PROTOCOL, log};

pub(crate) fn validate(launch: &WorkerLaunch, mut channel: Channel) -> ! {
    let (Some(source), Some(target)) = (&launch.workflow_source, &launch.validate) else {
        log!("validate mode without `workflowSource` or `validate`");
        std::process::exit(EXIT_PROTOCOL);
    };
    let (path, bytes) = match crate::run::verify(source) {
        Ok(verified) => verified,
        Err(why) => {
            log!("source changed ({why}); no verdict");
            std::process::exit(EXIT_PROTOCOL);
        }
    };
    let Some(spec) = Script::parse(&bytes)
        .ok()
        .and_then(|script| script.validate)
    else {
        log!("validate mode is not scripted");
        std::process::exit(EXIT_PROTOCOL);
    };
    if spec.ignore_sigterm {
        crate::run::ignore_sigterm();
    }
    let base = path.parent().unwrap_or(Path::new("/")).to_path_buf();
    let submission = target.submission_id.to_string();
    let record = |what: &str| {
        let Some(file) = &spec.record else { return };
        let line = format!("{what} {submission} {}\n", std::process::id());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(base.join(file))
            .and_then(|mut file| file.write_all(line.as_bytes()));
        if let Err(e) = written {
            log!("cannot record {what}: {e}");
            std::process::exit(EXIT_PROTOCOL);
        }
    };
    let ready = channel.send("runner.ready", json!({"sourceVerified": true}));
    let _ = channel.await_dispatch(&ready.id);
    record("started");
    if spec.delay_ms > 0 {
        log!("validating for {} ms", spec.delay_ms);
        thread::sleep(Duration::from_millis(spec.delay_ms));
    }
    record("verdict");
    let ids = json!({"interactionId": target.interaction_id, "submissionId": target.submission_id});
    let mut fields = ids.as_object().cloned().unwrap_or_default();
    let kind = match &spec.reject {
        Some(message) => {
            fields.insert(
                "error".into(),
                json!({"code": "validationFailed", "message": message}),
            );
            "interaction.rejected"
        }
        None => {
            fields.insert(
                "output".into(),
                json!({"valid": true, "submissionId": submission}),
            );
            "interaction.accepted"
        }
    };
    let reply = channel.request(kind, fields.into());
    log!("verdict {kind} answered {:?}", reply.outcome);
    channel.send("runner.exiting", json!({"reason": "finished"}));
    std::process::exit(0);
}
