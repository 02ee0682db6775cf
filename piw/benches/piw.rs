//! piw's benchmarks (issue 17, item 6): figures, not timed tests. Each
//! figure is printed beside a baseline measured in the same run.
//!
//! Run: `cargo build -p server && cargo bench -p piw --bench piw`.
//!
//! (h) commit → redrawn frame, 1,000-node graph: a real server runs a
//!     1,000-node linear workflow of the scripted runner that stalls at its
//!     last node; piw's live source (the Rust client, the run's
//!     subscription) feeds an `App` drawn on a 200×60 TestBackend. Another
//!     client pauses and resumes the run; each figure is the time from
//!     sending the command (its commit follows) until the frame showing
//!     the new status is drawn. Beside it: parsing the same view (the
//!     CLI's `view --json` bytes) into the typed run view, and one redraw
//!     of that screen alone. Target: < 50 ms p99.
//! (i) memory with 10,000 runs listed: 10,000 rows (cloned from a real
//!     server row, run ids made unique) delivered as one run-list event,
//!     applied and drawn; resident-set growth and the rows' JSON size.
//! (j) frame render time at 200×60: the run list of 10,000 runs and the
//!     1,000-node run screen, p50/p99 of draws on a TestBackend.
#![allow(clippy::print_stdout, clippy::print_stderr, missing_docs)]

#[path = "../tests/support/live.rs"]
mod live;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use live::{Server, wait_for};
use pi_workflows_client::{
    CallOptions, ClientOptions, Delivery, Home, LiveView, WorkflowClient, ops,
};
use piw::app::App;
use piw::live::LiveSource;
use piw::source::{Source, SourceEvent};
use piw::theme::Theme;
use protocol::generated::types::{
    DisplayStatus, EmptyPayload, RunListRow, RunView, SubscriptionTarget,
};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use serde::Deserialize as _;
use serde_json::{Value, json};

const NODES: usize = 1000;
const PAIRS: usize = 50;
const SAMPLES: usize = 200;
const LISTED: usize = 10_000;

struct Stats {
    p50: f64,
    p99: f64,
    mean: f64,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Stats {
        p50: ms(at(0.5)),
        p99: ms(at(0.99)),
        mean: samples.iter().map(|d| ms(*d)).sum::<f64>() / samples.len() as f64,
    }
}

fn show(name: &str, s: &Stats) {
    println!(
        "{name:<58} p50 {:>8.3} ms  p99 {:>8.3} ms  mean {:>8.3} ms",
        s.p50, s.p99, s.mean
    );
}

/// Resident set size in KiB (`/proc/self/status`).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap()
}

fn script(dir: &std::path::Path) -> std::path::PathBuf {
    let id = |i: usize| format!("n{i:04}");
    let nodes: Vec<Value> = (1..=NODES)
        .map(|i| json!({ "id": id(i), "nodeType": "compute", "timeout": { "kind": if i == NODES { "none" } else { "default" } }, "mountPath": [] }))
        .collect();
    let edges: Vec<Value> = (1..NODES)
        .map(|i| json!({ "kind": "plain", "from": id(i), "to": id(i + 1) }))
        .collect();
    let script = json!({
        "workflowName": "thousand",
        "topology": { "startAt": id(1), "maxSteps": NODES + 10, "nodes": nodes, "edges": edges, "mounts": [] },
        "nodes": { id(NODES): [{ "stall": true }] },
    });
    let path = dir.join("thousand.json");
    std::fs::write(&path, serde_json::to_vec(&script).unwrap()).unwrap();
    path
}

fn draw(terminal: &mut Terminal<TestBackend>, app: &mut App) -> Duration {
    let start = Instant::now();
    terminal
        .draw(|frame| piw::ui::draw(frame, app))
        .expect("drawn");
    start.elapsed()
}

/// Hands the app's commands to the source and applies its events until
/// `done` holds; draws after each batch. Waits on the source's wake-ups.
fn pump(
    app: &mut App,
    source: &mut LiveSource,
    woken: &mpsc::Receiver<()>,
    terminal: &mut Terminal<TestBackend>,
    mut done: impl FnMut(&App) -> bool,
) -> Pumped {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for command in app.take_commands() {
            source.send(command);
        }
        let mut applied = false;
        let start = Instant::now();
        while let Some(event) = source.try_next() {
            app.apply(event);
            applied = true;
        }
        if applied {
            let applied_at = Instant::now();
            draw(terminal, app);
            BATCHES.with(|b| b.borrow_mut().push(start.elapsed()));
            if done(app) {
                return Pumped {
                    taken_at: start,
                    applied_at,
                    drawn_at: Instant::now(),
                };
            }
        }
        assert!(
            Instant::now() < deadline,
            "the source did not deliver in time"
        );
        let _ = woken.recv_timeout(Duration::from_millis(50));
    }
}

/// When the batch that satisfied `done` was taken from the source, applied
/// to the app, and drawn.
#[derive(Clone, Copy)]
struct Pumped {
    taken_at: Instant,
    applied_at: Instant,
    drawn_at: Instant,
}

thread_local! {
    /// piw's own time per batch of delivered events: apply + draw.
    static BATCHES: std::cell::RefCell<Vec<Duration>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn status(app: &App) -> Option<DisplayStatus> {
    app.view().map(|view| view.display.status)
}

fn main() {
    let server = Server::started();
    let path = script(server.dir.path());
    let out = server.cli(&["start", path.to_str().unwrap(), "--json"]);
    let run_id = serde_json::from_str::<Value>(&out).unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_owned();
    // The run list's row (a complete view cannot be read while the run
    // moves on at every step).
    wait_for(
        "the 1,000-node run to stall",
        Duration::from_secs(300),
        || {
            let runs: Value = serde_json::from_str(&server.cli(&["runs", "--json"])).ok()?;
            let row = runs["runs"]
                .as_array()?
                .iter()
                .find(|row| row["runId"] == run_id.as_str())?
                .clone();
            (row["display"]["currentNode"] == format!("n{NODES:04}").as_str()).then_some(())
        },
    );
    let view_bytes = serde_json::to_vec(&server.view(&run_id)).unwrap();
    println!(
        "piw benchmarks · {NODES}-node run {run_id} · view {} bytes · 200x60",
        view_bytes.len()
    );

    // The live source on the real server, as piw runs it.
    let (wake, woken) = mpsc::channel();
    let mut source = LiveSource::start(
        ClientOptions::new(Home::at(server.home())),
        None,
        move || {
            let _ = wake.send(());
        },
    );
    let mut app = App::new(Theme::default(), Some(run_id.clone()), "bench", 0);
    let mut terminal = Terminal::new(TestBackend::new(200, 60)).unwrap();
    pump(&mut app, &mut source, &woken, &mut terminal, |app| {
        app.run
            .as_ref()
            .is_some_and(|run| run.topology.is_some() && run.view.is_some())
    });

    // A raw subscriber of the same run on its own connection: when each
    // revision's event reaches a client off the socket (before any view is
    // folded or parsed), to split the end-to-end time into the server's part
    // and the client's.
    let (arrived, arrivals) = mpsc::channel::<(u64, Instant, Duration)>();
    let raw_home = server.home();
    let raw_run = run_id.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut client = WorkflowClient::new(ClientOptions::new(Home::at(raw_home)));
            client.connect().await.unwrap();
            let target = SubscriptionTarget::Run {
                run_id: raw_run.parse().unwrap(),
            };
            client.subscribe(&target, None).await.unwrap();
            // It also does what piw's source does with each event (fold it
            // into the live view, then type the view) and times that.
            let mut live = LiveView::new();
            while let Ok(delivery) = client.next_event().await {
                if let Delivery::Event {
                    revision, event, ..
                } = delivery
                {
                    let at = Instant::now();
                    live.apply_event(&event).unwrap();
                    let view = RunView::deserialize(live.view().unwrap()).unwrap();
                    std::hint::black_box(view);
                    if arrived.send((revision, at, at.elapsed())).is_err() {
                        return;
                    }
                }
            }
        });
    });

    // (h) commit → redrawn frame.
    let (order, orders) = mpsc::channel::<bool>();
    let (sent_at, sent) = mpsc::channel::<Instant>();
    let (answered_in, answers) = mpsc::channel::<Duration>();
    let commander_home = server.home();
    let commander_run = run_id.clone();
    let commander = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut client = WorkflowClient::new(ClientOptions::new(Home::at(commander_home)));
            client.connect().await.unwrap();
            while let Ok(pause) = orders.recv() {
                let start = Instant::now();
                sent_at.send(start).unwrap();
                let empty = EmptyPayload {};
                let run = Some(commander_run.as_str());
                if pause {
                    client
                        .call::<ops::RunPause>(run, &empty, CallOptions::default())
                        .await
                        .unwrap();
                } else {
                    client
                        .call::<ops::RunResume>(run, &empty, CallOptions::default())
                        .await
                        .unwrap();
                }
                answered_in.send(start.elapsed()).unwrap();
            }
        });
    });
    BATCHES.with(|b| b.borrow_mut().clear());
    let (mut paused_frame, mut running_frame) = (Vec::new(), Vec::new());
    let mut round_trips = Vec::new();
    let (mut server_part, mut client_part, mut apply_part, mut draw_part) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut fold_part = Vec::new();
    for i in 0..PAIRS * 2 {
        let pause = i % 2 == 0;
        order.send(pause).unwrap();
        let start = sent.recv().unwrap();
        let want = if pause {
            DisplayStatus::Paused
        } else {
            DisplayStatus::Running
        };
        let pumped = pump(&mut app, &mut source, &woken, &mut terminal, |app| {
            status(app) == Some(want)
        });
        if pause {
            &mut paused_frame
        } else {
            &mut running_frame
        }
        .push(pumped.drawn_at - start);
        round_trips.push(answers.recv().unwrap());
        // The stages of this sample: the revision piw shows, when the raw
        // subscriber got it off the socket.
        let shown: u64 = app.view().map_or(0, |view| view.revision.into());
        let raw_at = loop {
            let (revision, at, folded_in) = arrivals
                .recv_timeout(Duration::from_secs(60))
                .expect("the raw subscriber's event");
            fold_part.push(folded_in);
            if revision >= shown {
                break at;
            }
        };
        server_part.push(raw_at.saturating_duration_since(start));
        client_part.push(pumped.taken_at.saturating_duration_since(raw_at));
        apply_part.push(pumped.applied_at - pumped.taken_at);
        draw_part.push(pumped.drawn_at - pumped.applied_at);
    }
    drop(order);
    commander.join().unwrap();
    let parse: Vec<Duration> = (0..SAMPLES)
        .map(|_| {
            let start = Instant::now();
            let view: RunView = serde_json::from_slice(&view_bytes).unwrap();
            std::hint::black_box(view);
            start.elapsed()
        })
        .collect();
    let redraw: Vec<Duration> = (0..SAMPLES)
        .map(|_| draw(&mut terminal, &mut app))
        .collect();
    let batches = stats(BATCHES.with(|b| b.take()));
    let paused_frame = stats(paused_frame);
    let parse = stats(parse);
    println!("(h) commit -> redrawn frame, {NODES}-node graph ({PAIRS} pauses, {PAIRS} resumes)");
    show("  piw's part per delivered batch: apply + redraw", &batches);
    show(
        "  baseline: parse the same view (serde_json -> RunView)",
        &parse,
    );
    show(
        "  end to end: run.pause sent -> frame showing paused",
        &paused_frame,
    );
    show(
        "  end to end: run.resume sent -> frame showing running",
        &stats(running_frame),
    );
    show(
        "  the command's own round trip (server, to its response)",
        &stats(round_trips),
    );
    println!(
        "  where the end-to-end time goes (all {} controls):",
        PAIRS * 2
    );
    show(
        "    server: command sent -> its event off the socket",
        &stats(server_part),
    );
    show(
        "    client: event off the socket -> piw's source has the view",
        &stats(client_part),
    );
    show(
        "      of which the client's fold + typing of each event",
        &stats(fold_part),
    );
    show("    piw: apply the view to the app", &stats(apply_part));
    show("    piw: draw the frame", &stats(draw_part));
    show(
        "  one redraw of that screen, nothing new (j)",
        &stats(redraw),
    );
    println!(
        "  piw's part / parse: p50 {:.1}x p99 {:.1}x · target p99 < 50 ms: piw's part {}, pause end to end {}",
        batches.p50 / parse.p50,
        batches.p99 / parse.p99,
        if batches.p99 < 50.0 { "met" } else { "missed" },
        if paused_frame.p99 < 50.0 {
            "met"
        } else {
            "missed"
        },
    );

    // (i) memory with 10,000 runs listed, and (j) the list's draw.
    let row = serde_json::to_value(
        app.rows
            .iter()
            .find(|row| row.run_id.as_str() == run_id)
            .expect("the run's row"),
    )
    .unwrap();
    let before = rss_kib();
    let rows: Vec<RunListRow> = (0..LISTED)
        .map(|i| {
            let mut row = row.clone();
            row["runId"] = json!(format!("20261201T000000Z-bench-{i:08}"));
            serde_json::from_value(row).unwrap()
        })
        .collect();
    let json_bytes = serde_json::to_vec(&rows).unwrap().len();
    let mut list = App::new(Theme::default(), None, "bench-list", 0);
    list.apply(SourceEvent::RunList { revision: 1, rows });
    let mut list_terminal = Terminal::new(TestBackend::new(200, 60)).unwrap();
    let list_draws: Vec<Duration> = (0..SAMPLES)
        .map(|_| draw(&mut list_terminal, &mut list))
        .collect();
    let after = rss_kib();
    println!(
        "(i) {LISTED} runs listed: resident set +{} KiB (rows as JSON: {} KiB)",
        after.saturating_sub(before),
        json_bytes / 1024
    );
    show(
        "(j) draw the run list of 10,000 runs at 200x60",
        &stats(list_draws),
    );
    std::hint::black_box(&list);
}
