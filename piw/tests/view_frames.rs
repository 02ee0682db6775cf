//! A view frame piw cannot fold is never dropped silently: the live source
//! (the real server, its real socket, piw's [`LiveSource`]) tells the screen
//! that the view it holds is stale and asks the server for a fresh one.
//!
//! The frames are spoiled on their way from the server by a dialer that
//! forwards the socket's frames and rewrites chosen run-view patches (the
//! server never sends such a patch; a newer or broken server could).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pi_workflows_client::{ClientOptions, Dialer, Home};
use piw::live::LiveSource;
use piw::source::{Command, Source, SourceEvent};
use serde_json::{Value, json};
use support::live::{Server, wait_for};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// How a patch is spoiled.
#[derive(Clone, Copy)]
enum Spoil {
    /// The patch applies, but the document is no run view (an unknown
    /// display status).
    Unreadable,
    /// The patch names a path the view does not have.
    Unappliable,
}

/// A dialer to `server`'s socket that spoils the first `count` run-view
/// patches the server sends, the way `spoil` says; `spoiled` counts them.
fn spoiling_dialer(
    server: &Server,
    spoil: Spoil,
    count: usize,
    spoiled: Arc<AtomicUsize>,
) -> Dialer {
    let socket = server.socket();
    Dialer::new(move || {
        let socket = socket.clone();
        let spoiled = spoiled.clone();
        Box::pin(async move {
            let stream = tokio::net::UnixStream::connect(&socket)
                .await
                .map_err(|_| pi_workflows_client::ClientError::Unavailable)?;
            let (from_server, mut to_server) = stream.into_split();
            let (ours, theirs) = tokio::io::duplex(1 << 20);
            let (mut from_client, mut to_client) = tokio::io::split(theirs);
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
            });
            tokio::spawn(async move {
                let mut lines = BufReader::new(from_server).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut frame: Value = serde_json::from_str(&line).expect("a JSON frame");
                    if frame["event"]["kind"] == "runViewPatch"
                        && spoiled.load(Ordering::SeqCst) < count
                    {
                        spoiled.fetch_add(1, Ordering::SeqCst);
                        frame["event"]["ops"] = match spoil {
                            Spoil::Unreadable => json!([
                                {"op": "replace", "path": "/display/status", "value": "unheardOf"}
                            ]),
                            Spoil::Unappliable => json!([
                                {"op": "replace", "path": "/noSuchField/deeper", "value": 1}
                            ]),
                        };
                    }
                    let mut bytes = protocol::canonicalize(&frame).expect("canonical");
                    bytes.push(b'\n');
                    if to_client.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
            });
            let (read, write) = tokio::io::split(ours);
            let read: pi_workflows_client::TransportRead = Box::new(read);
            let write: pi_workflows_client::TransportWrite = Box::new(write);
            Ok((read, write))
        })
    })
}

fn source(server: &Server, dialer: Dialer) -> LiveSource {
    let mut options = ClientOptions::new(Home::at(server.home()));
    options.dialer = Some(dialer);
    LiveSource::start(options, None, || {})
}

/// The next event of `source` that `pick` keeps, waiting at most 20 s;
/// every event seen on the way is in the panic message.
fn next_event<T>(
    source: &mut LiveSource,
    what: &str,
    mut pick: impl FnMut(&SourceEvent) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match source.try_next() {
            Some(event) => {
                if let Some(found) = pick(&event) {
                    return found;
                }
                seen.push(format!("{event:.80?}"));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    panic!(
        "no {what} within 20 s; the source delivered {} other events:\n{}",
        seen.len(),
        seen.join("\n")
    );
}

fn view_status(event: &SourceEvent) -> Option<(String, u64)> {
    match event {
        SourceEvent::RunView(view) => Some((view.display.status.to_string(), view.revision.get())),
        _ => None,
    }
}

fn stale(event: &SourceEvent) -> Option<String> {
    match event {
        SourceEvent::RunViewStale { line, .. } => Some(line.clone()),
        _ => None,
    }
}

fn watch_running_run(server: &Server, source: &mut LiveSource) -> String {
    let run = server.start("paused");
    wait_for("the run at long", Duration::from_secs(30), || {
        let view = server.view(&run);
        (view["display"]["currentNode"] == "long").then_some(())
    });
    source.send(Command::WatchRun {
        run_id: run.clone(),
    });
    source.send(Command::WatchRuns);
    next_event(source, "the first run view", |e| {
        view_status(e).filter(|(status, _)| status == "running")
    });
    run
}

fn unreadable_or_unappliable_patch_marks_the_view_stale_and_resubscribes(spoil: Spoil, said: &str) {
    let server = Server::started();
    let spoiled = Arc::new(AtomicUsize::new(0));
    let mut source = source(&server, spoiling_dialer(&server, spoil, 1, spoiled.clone()));
    let run = watch_running_run(&server, &mut source);
    server.cli(&["pause", &run]);
    // The pause's patch is spoiled: the screen hears that its view is
    // stale (one line: what happened and that piw asks again) ...
    let line = next_event(&mut source, "a stale-view event", stale);
    assert_eq!(spoiled.load(Ordering::SeqCst), 1);
    assert!(!line.contains('\n'), "{line}");
    assert!(line.contains(said), "{line}");
    assert!(line.contains("asking for a fresh one"), "{line}");
    // ... and the fresh snapshot shows the paused run (no old view as live).
    next_event(&mut source, "the paused view from a fresh snapshot", |e| {
        view_status(e).filter(|(status, _)| status == "paused")
    });
}

#[test]
fn a_patch_whose_result_is_no_run_view_marks_the_view_stale_and_resubscribes() {
    unreadable_or_unappliable_patch_marks_the_view_stale_and_resubscribes(
        Spoil::Unreadable,
        "the server sent a view piw cannot read",
    );
}

#[test]
fn a_patch_that_does_not_apply_marks_the_view_stale_and_resubscribes() {
    unreadable_or_unappliable_patch_marks_the_view_stale_and_resubscribes(
        Spoil::Unappliable,
        "a view change did not apply",
    );
}
