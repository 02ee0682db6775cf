//! Shared helpers of piw's tests: fixtures (real server output, validated
//! with the protocol crate), an app fed by the fake source, TestBackend
//! rendering and plain-text snapshots.
#![allow(dead_code, unreachable_pub)]

pub mod live;

use std::path::{Path, PathBuf};

use piw::app::App;
use piw::source::{FakeSource, Source, SourceEvent};
use piw::theme::Theme;
use protocol::generated::types::{RunListRow, RunView, ViewPage};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use serde_json::{Value, json};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A run-view fixture (`<name>.view.json`), validated by the protocol
/// crate's run-view decoder (schema, canonical form, size).
pub fn view(name: &str) -> RunView {
    view_from_value(&read_json(&fixtures().join(format!("{name}.view.json"))))
}

/// Validates and types a run-view document.
pub fn view_from_value(value: &Value) -> RunView {
    let bytes = protocol::canonicalize(value).expect("canonical");
    protocol::decode_run_view(&bytes).unwrap_or_else(|e| panic!("not a valid run view: {e}"))
}

/// The run list fixture, validated as a client.v1 `runListSnapshot` event.
pub fn run_rows() -> Vec<RunListRow> {
    let rows = read_json(&fixtures().join("runs.json"))["runs"].clone();
    rows_from_value(rows)
}

/// Validates rows as one client.v1 event frame and types them.
pub fn rows_from_value(rows: Value) -> Vec<RunListRow> {
    let frame = json!({
        "schema": "pi-workflows.client.v1", "type": "event", "subscriptionId": "s1", "revision": 1,
        "event": { "kind": "runListSnapshot", "rows": rows.clone() },
    });
    let mut bytes = protocol::canonicalize(&frame).expect("canonical");
    bytes.push(b'\n');
    protocol::decode_client_frame(&bytes).unwrap_or_else(|e| panic!("not a valid run list: {e}"));
    serde_json::from_value(rows).expect("typed rows")
}

/// The canonical bytes of a fixture script's topology: the content the
/// server stores as the run's definition.
pub fn definition(script: &str) -> Vec<u8> {
    let script = read_json(&fixtures().join("scripts").join(format!("{script}.json")));
    protocol::canonicalize(&script["topology"]).expect("canonical topology")
}

/// The pipeline run's trace page, validated as a client.v1 response.
pub fn transitions_page() -> ViewPage {
    let page = read_json(&fixtures().join("pipeline.transitions.json"));
    let frame = json!({
        "schema": "pi-workflows.client.v1", "type": "response", "requestId": "r1",
        "operation": "view.page", "outcome": "accepted", "receipt": page.clone(),
    });
    let mut bytes = protocol::canonicalize(&frame).expect("canonical");
    bytes.push(b'\n');
    protocol::decode_client_frame(&bytes).unwrap_or_else(|e| panic!("not a valid page: {e}"));
    serde_json::from_value(page).expect("typed page")
}

/// An app and its fake source, pumped until quiet.
pub struct Harness {
    pub app: App,
    pub source: FakeSource,
}

impl Harness {
    pub fn new(explicit_run: Option<&str>, now_ms: u64) -> Self {
        let mut harness = Self {
            app: App::new(
                Theme::default(),
                explicit_run.map(str::to_owned),
                "test",
                now_ms,
            ),
            source: FakeSource::new(),
        };
        harness.pump();
        harness
    }

    /// Moves commands to the source and events to the app until neither has more.
    pub fn pump(&mut self) {
        for _ in 0..100 {
            let commands = self.app.take_commands();
            let had_commands = !commands.is_empty();
            for command in commands {
                self.source.send(command);
            }
            let mut had_events = false;
            while let Some(event) = self.source.try_next() {
                had_events = true;
                self.app.apply(event);
            }
            if !had_commands && !had_events {
                return;
            }
        }
        panic!("the app and the source never went quiet");
    }

    pub fn event(&mut self, event: SourceEvent) {
        self.source.push(event);
        self.pump();
    }

    pub fn key(&mut self, code: KeyCode) {
        self.app.key(KeyEvent::new(code, KeyModifiers::NONE));
        self.pump();
    }

    pub fn keys(&mut self, text: &str) {
        for c in text.chars() {
            self.key(KeyCode::Char(c));
        }
    }

    pub fn render(&mut self, width: u16, height: u16) -> String {
        render(&mut self.app, width, height)
    }
}

/// A harness showing one run fixture (its definition served by the fake).
pub fn run_harness(fixture: &str, script: &str) -> Harness {
    let view = view(fixture);
    let now = view.updated_at_ms.get() + 4_000;
    let mut harness = Harness::new(Some(view.run_id.as_str()), now);
    harness.source.contents.push(definition(script));
    harness.event(SourceEvent::RunList {
        revision: 1,
        rows: run_rows(),
    });
    harness.event(SourceEvent::RunView(Box::new(view)));
    harness
}

/// Draws the app on a TestBackend and returns the screen as text (one
/// line per row, trailing spaces trimmed).
pub fn render(app: &mut App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("a test terminal");
    terminal
        .draw(|frame| piw::ui::draw(frame, app))
        .expect("drawn");
    let buffer = terminal.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..buffer.area.height {
        let mut line = String::new();
        for x in 0..buffer.area.width {
            line.push_str(buffer[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Compares `screen` with `tests/snapshots/<name>.txt`; with
/// `PIW_UPDATE_SNAPSHOTS=1` it writes the file instead.
pub fn snapshot(name: &str, screen: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("PIW_UPDATE_SNAPSHOTS").is_some_and(|v| v == "1") {
        std::fs::write(&path, screen).expect("snapshot written");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!("no snapshot {}; run with PIW_UPDATE_SNAPSHOTS=1 to create it, then review it\n{screen}", path.display())
    });
    if expected != screen {
        panic!(
            "snapshot {name} differs (PIW_UPDATE_SNAPSHOTS=1 regenerates it)\n--- expected\n{expected}\n--- actual\n{screen}"
        );
    }
}

/// The resources fixture (tests/fixtures/resources.json, written by hand:
/// the server on this branch applies resources but does not reconcile
/// them yet, so it cannot make conditions, effects or child runs): a
/// `resource.list` answer and the `resource.get` view of each row, typed
/// by the protocol crate.
pub fn resources_fixture() -> (
    Vec<protocol::generated::types::ResourceListRow>,
    Vec<protocol::generated::types::ResourceView>,
) {
    let text = std::fs::read_to_string(fixtures().join("resources.json")).expect("fixture");
    let value: Value = serde_json::from_str(&text).expect("json");
    let list: protocol::generated::types::ResourceListView =
        serde_json::from_value(value["list"].clone()).expect("a resource list view");
    let views = serde_json::from_value(value["views"].clone()).expect("resource views");
    (list.resources.into_inner(), views)
}
