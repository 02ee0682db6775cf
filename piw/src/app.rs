//! The state machine behind every screen: fed by source events, keys,
//! mouse events and clock ticks; emits source commands. Drawing is
//! [`crate::ui`]'s job, which reads this state and records what is where
//! (the hit map) for the mouse.
//!
//! Invariants:
//! - What a screen shows comes from the last documents the source
//!   delivered; a status, activity, control or reason is never computed
//!   here (see [`crate::model`] for the one presentation rule).
//! - A control is offered only while it is in the current view's
//!   `display.controls`, and only a confirmed dialog sends it, once, with
//!   the idempotency key created when that dialog opened.
//! - A protected decision is answered with exactly what its dialog showed:
//!   the decision id and request digest of the view the dialog opened on
//!   (never a later one), one of its typed choices, and text only for a
//!   choice that takes it. The server alone judges whether the decision
//!   still takes it; an answer dialog (a decision's or a checkpoint's) stays
//!   open until the server's outcome arrives, and a refusal leaves its
//!   choice and text in place, shows the server's line, and makes a new
//!   idempotency key for the next confirmation (a retry of the refused key
//!   would only get the stored refusal back).
//! - An explicitly requested run (`piw <runId>`) stays selected: run-list
//!   updates never replace it.
//! - Pages and contents of a run are dropped when another run is selected,
//!   and a page or content for another run is ignored.

use std::collections::{BTreeMap, HashMap};

use protocol::generated::types::{
    AmbiguousEffect, Control, DecisionView, DisplayStatus, PageCollection, RecoverAction,
    RunListRow, RunView, StepRecord, Topology,
};
use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::Rect;
use serde_json::Value;

use crate::eta::EtaTracker;
use crate::layout::{self, CardSize, GraphInput, Layout};
use crate::model::{RunModel, control_spec};
use crate::source::{Availability, Command, ControlRequest, SourceEvent};
use crate::theme::{THEMES, Theme};

/// Replay speeds.
pub const SPEEDS: [u64; 4] = [1, 2, 5, 10];
/// The time between two replayed steps at 1×.
pub const REPLAY_STEP_MS: u64 = 700;
/// Rows of the run list moved by PgUp/PgDn when no page size is known.
const DEFAULT_PAGE: usize = 10;
/// How long a notice stays in the footer.
const TOAST_MS: u64 = 6000;

/// Which screen is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    Runs,
    Run,
    /// Managed resources (`m` from the run list).
    Resources,
}

/// Which pane takes keys on the run screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Focus {
    Browser,
    Graph,
    Inspector,
}

/// Node card density.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Density {
    Box,
    Compact,
}

impl Density {
    pub fn card(self) -> CardSize {
        match self {
            Self::Box => CardSize {
                width: 26,
                height: 5,
            },
            Self::Compact => CardSize {
                width: 22,
                height: 3,
            },
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Self::Box => "box",
            Self::Compact => "compact",
        }
    }
}

/// The inspector's tabs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tab {
    Attempts,
    Output,
    Updates,
    Trace,
    Session,
    Info,
}

impl Tab {
    pub const ALL: [Tab; 6] = [
        Tab::Attempts,
        Tab::Output,
        Tab::Updates,
        Tab::Trace,
        Tab::Session,
        Tab::Info,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Self::Attempts => "Attempts",
            Self::Output => "Output",
            Self::Updates => "Updates",
            Self::Trace => "Trace",
            Self::Session => "Session",
            Self::Info => "Info",
        }
    }

    /// The page collection the tab shows, if any.
    pub fn collection(self) -> Option<PageCollection> {
        match self {
            Self::Trace => Some(PageCollection::Transitions),
            Self::Session => Some(PageCollection::SessionEvents),
            _ => None,
        }
    }
}

/// Where the replay cursor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replay {
    /// Following the latest step.
    pub live: bool,
    /// Steps shown (1..=len) when not live.
    pub shown: usize,
    pub playing: bool,
    /// Index into [`SPEEDS`].
    pub speed: usize,
    /// When the next step is due while playing.
    pub next_at_ms: u64,
}

impl Default for Replay {
    fn default() -> Self {
        Self {
            live: true,
            shown: 0,
            playing: false,
            speed: 0,
            next_at_ms: 0,
        }
    }
}

/// A confirmation dialog for one control.
#[derive(Clone, Debug, PartialEq)]
pub struct Dialog {
    pub run_id: String,
    pub control: Control,
    pub expected_revision: u64,
    /// Created when the dialog opened: one per user action.
    pub idempotency_key: String,
    /// The answer text (a checkpoint answer's JSON; a decision choice's
    /// text).
    pub input: String,
    /// The effect under review (`recoverEffect`): the first one the view
    /// lists when the dialog opened.
    pub effect: Option<AmbiguousEffect>,
    /// The reviewer's verdict on that effect, chosen in the dialog.
    pub action: Option<RecoverAction>,
    /// The protected decision answered (`humanAnswer`): the view's
    /// `decision` when the dialog opened, or after a refusal the one the
    /// view showed then. Its id and request digest are what is sent.
    pub decision: Option<DecisionView>,
    /// The chosen choice: an index into the decision's choices.
    pub choice: usize,
    /// Sent; the server's outcome has not arrived yet.
    pub sending: bool,
    /// Why the last confirmation was refused: bad JSON, or the server's
    /// outcome and line.
    pub error: Option<String>,
    /// What changed in the dialog after a refusal (it now shows the run's
    /// current decision).
    pub note: Option<String>,
}

impl Dialog {
    /// The chosen choice of a decision dialog.
    pub fn chosen(&self) -> Option<&protocol::generated::types::DecisionChoice> {
        self.decision.as_ref()?.choices.as_slice().get(self.choice)
    }

    /// Whether the dialog stays open until the server's outcome arrives:
    /// an answer's text must survive a refusal.
    pub fn waits_for_the_outcome(&self) -> bool {
        matches!(self.control, Control::Answer | Control::HumanAnswer)
    }
}

/// What is open above the screen.
#[derive(Clone, Debug, PartialEq)]
pub enum Overlay {
    Help,
    Confirm(Dialog),
    Themes { cursor: usize, before: Theme },
}

/// A page collection as piw holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PageState {
    pub revision: Option<u64>,
    pub items: Vec<Value>,
    pub next_cursor: Option<String>,
    pub loading: bool,
    pub error: Option<String>,
}

/// Referenced content as piw holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum ContentState {
    Loading,
    Ready(Vec<u8>),
    Failed(String),
}

/// Everything piw holds about the selected run.
#[derive(Debug)]
pub struct RunState {
    pub run_id: String,
    pub view: Option<Box<RunView>>,
    pub missing: Option<String>,
    /// Why the view held is stale (one line), until the next view arrives.
    pub stale: Option<String>,
    pub model: RunModel,
    pub topology: Option<Topology>,
    pub history: Option<(String, Vec<StepRecord>)>,
    pub contents: HashMap<String, ContentState>,
    pub pages: BTreeMap<String, PageState>,
    pub selected_node: Option<String>,
    pub eta: EtaTracker,
    layout_key: Option<LayoutKey>,
    layout: Option<Layout>,
}

/// What a layout depends on: node ids, edges (from, to, label), the
/// included-workflow path and the card size.
type LayoutKey = (
    Vec<String>,
    Vec<(String, String, Option<String>)>,
    Option<String>,
    CardSize,
);

impl RunState {
    fn new(run_id: &str) -> Self {
        Self {
            run_id: run_id.to_owned(),
            view: None,
            missing: None,
            stale: None,
            model: RunModel::default(),
            topology: None,
            history: None,
            contents: HashMap::new(),
            pages: BTreeMap::new(),
            selected_node: None,
            eta: EtaTracker::new(),
            layout_key: None,
            layout: None,
        }
    }

    /// The laid-out graph for `density` (recomputed only when the graph
    /// or the density changed).
    pub fn layout(&mut self, density: Density) -> Option<&Layout> {
        let view = self.view.as_ref()?;
        let start = self
            .topology
            .as_ref()
            .map(|t| t.start_at.to_string())
            .or_else(|| view.nodes.first().map(|n| n.id.to_string()));
        let key = (
            view.nodes
                .iter()
                .map(|n| n.id.to_string())
                .collect::<Vec<_>>(),
            view.edges
                .iter()
                .map(|e| {
                    (
                        e.from.to_string(),
                        e.to.to_string(),
                        e.label.as_ref().map(|l| l.to_string()),
                    )
                })
                .collect::<Vec<_>>(),
            start,
            density.card(),
        );
        if self.layout_key.as_ref() != Some(&key) || self.layout.is_none() {
            let input = GraphInput::from_ids(
                key.0.iter().map(String::as_str),
                key.1
                    .iter()
                    .map(|(f, t, l)| (f.as_str(), t.as_str(), l.as_deref())),
                key.2.as_deref(),
            );
            self.layout = Some(layout::layout(&input, density.card()));
            self.layout_key = Some(key);
        }
        self.layout.as_ref()
    }

    /// The page state of a collection.
    pub fn page(&self, collection: PageCollection) -> Option<&PageState> {
        self.pages.get(&collection.to_string())
    }

    /// The content state of a digest.
    pub fn content(&self, digest: &str) -> Option<&ContentState> {
        self.contents.get(digest)
    }
}

/// What a screen region is, for the mouse.
#[derive(Clone, Debug, PartialEq)]
pub enum Hit {
    RunRow(String),
    BrowserRow(String),
    /// A row of the resources screen: (controller, key).
    ResourceRow(crate::resources::ResourceId),
    Graph,
    Node(String),
    Tab(Tab),
    Inspector,
    /// The timeline bar: the region maps linearly onto steps 1..=total.
    Timeline {
        total: usize,
    },
    LiveButton,
    PlayButton,
    ControlButton(Control),
}

/// A drag in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Drag {
    column: u16,
    row: u16,
}

/// The graph title's line when the run's definition verified but is not a
/// topology piw can read.
pub const DEFINITION_UNREADABLE: &str =
    "definition unreadable: no switch labels (install matching pi-workflows and piw versions)";

/// The application state.
#[derive(Debug)]
pub struct App {
    pub theme: Theme,
    pub screen: Screen,
    pub focus: Focus,
    /// `piw <runId>`: this run stays selected.
    pub explicit_run: Option<String>,
    pub availability: Availability,
    pub rows: Vec<RunListRow>,
    pub rows_revision: Option<u64>,
    pub rows_loaded: bool,
    /// The run-list cursor, by run id (stable across updates).
    pub cursor: Option<String>,
    pub status_filter: Option<DisplayStatus>,
    pub workflow_filter: Option<String>,
    /// Rows per page, as last drawn.
    pub page_rows: usize,
    pub run: Option<RunState>,
    /// The resources screen's reads and selection.
    pub resources: crate::resources::Resources,
    pub density: Density,
    /// Whether the user chose the density (else it follows the height).
    pub density_chosen: bool,
    pub follow: bool,
    /// The top-left graph cell shown, as last drawn.
    pub pan: (i32, i32),
    pub tab: Tab,
    pub inspector_scroll: u16,
    /// The trace tab shows only the selected node's events.
    pub trace_node_only: bool,
    pub replay: Replay,
    /// Centre the selected node at the next draw (keyboard selection).
    pub center_on_selected: bool,
    pub browser: Option<bool>,
    pub overlay: Option<Overlay>,
    pub toast: Option<(String, u64)>,
    pub now_ms: u64,
    pub quit: bool,
    /// What the last draw put where.
    pub hits: Vec<(Rect, Hit)>,
    /// Who answers a protected decision from this piw (`{channel: piw,
    /// actorId}`): the local user, as for the CLI. Never drawn.
    pub actor_id: String,
    outbox: Vec<Command>,
    drag: Option<Drag>,
    key_counter: u64,
    key_prefix: String,
    last_click: Option<(u16, u16, u64)>,
}

impl App {
    /// A new app; `explicit_run` opens that run and keeps it selected.
    /// `key_prefix` makes idempotency keys unique to this process.
    pub fn new(theme: Theme, explicit_run: Option<String>, key_prefix: &str, now_ms: u64) -> Self {
        let mut app = Self {
            theme,
            screen: Screen::Runs,
            focus: Focus::Graph,
            explicit_run: explicit_run.clone(),
            availability: Availability::Connecting,
            rows: Vec::new(),
            rows_revision: None,
            rows_loaded: false,
            cursor: None,
            status_filter: None,
            workflow_filter: None,
            page_rows: DEFAULT_PAGE,
            run: None,
            resources: crate::resources::Resources::default(),
            density: Density::Box,
            density_chosen: false,
            follow: true,
            pan: (0, 0),
            tab: Tab::Attempts,
            inspector_scroll: 0,
            trace_node_only: false,
            replay: Replay::default(),
            center_on_selected: false,
            browser: None,
            overlay: None,
            toast: None,
            now_ms,
            quit: false,
            hits: Vec::new(),
            actor_id: pi_workflows_client::ids::local_actor(),
            outbox: vec![Command::WatchRuns],
            drag: None,
            key_counter: 0,
            key_prefix: key_prefix.to_owned(),
            last_click: None,
        };
        if let Some(run_id) = explicit_run {
            app.cursor = Some(run_id.clone());
            app.open_run(&run_id);
        }
        app
    }

    /// Commands to hand to the source, in order.
    pub fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.outbox)
    }

    /// The rows the filters let through.
    pub fn visible_rows(&self) -> Vec<&RunListRow> {
        self.rows
            .iter()
            .filter(|row| self.status_filter.is_none_or(|s| row.display.status == s))
            .filter(|row| {
                self.workflow_filter
                    .as_deref()
                    .is_none_or(|w| row.workflow_name.as_str() == w)
            })
            .collect()
    }

    /// The index of the cursor among the visible rows.
    pub fn cursor_index(&self) -> Option<usize> {
        let rows = self.visible_rows();
        let cursor = self.cursor.as_deref()?;
        rows.iter().position(|row| row.run_id.as_str() == cursor)
    }

    /// The selected run's view.
    pub fn view(&self) -> Option<&RunView> {
        self.run.as_ref()?.view.as_deref()
    }

    /// Steps shown by the graph: all when live, the replay cursor's count
    /// otherwise.
    pub fn steps_shown(&self) -> usize {
        let total = self.run.as_ref().map_or(0, |run| run.model.steps.len());
        if self.replay.live {
            total
        } else {
            self.replay.shown.min(total)
        }
    }

    /// Whether the run is still going (its display status is not terminal).
    pub fn run_active(&self) -> bool {
        self.view().is_some_and(|view| {
            !matches!(
                view.display.status,
                DisplayStatus::Completed
                    | DisplayStatus::Failed
                    | DisplayStatus::TimedOut
                    | DisplayStatus::Cancelled
            )
        })
    }

    /// The controls the current view allows, in the server's order.
    pub fn controls(&self) -> Vec<Control> {
        self.view()
            .map(|view| view.display.controls.as_slice().to_vec())
            .unwrap_or_default()
    }

    /// The node the inspector shows: the user's choice, else the node the
    /// server names, else the last step's node.
    pub fn inspected_node(&self) -> Option<String> {
        let run = self.run.as_ref()?;
        if let Some(node) = &run.selected_node {
            return Some(node.clone());
        }
        let view = run.view.as_deref()?;
        if !self.replay.live {
            let shown = self.steps_shown();
            return run
                .model
                .steps
                .get(shown.checked_sub(1)?)
                .map(|s| s.node_id.to_string());
        }
        run.model
            .focus_node(view)
            .map(str::to_owned)
            .or_else(|| run.model.steps.last().map(|s| s.node_id.to_string()))
    }

    /// The node follow mode centres.
    pub fn follow_node(&self) -> Option<String> {
        let run = self.run.as_ref()?;
        let view = run.view.as_deref()?;
        if !self.replay.live {
            let shown = self.steps_shown();
            return run
                .model
                .steps
                .get(shown.checked_sub(1)?)
                .map(|s| s.node_id.to_string());
        }
        run.model
            .focus_node(view)
            .map(str::to_owned)
            .or_else(|| run.model.steps.last().map(|s| s.node_id.to_string()))
    }

    fn toast(&mut self, message: impl Into<String>) {
        self.toast = Some((message.into(), self.now_ms + TOAST_MS));
    }

    fn next_key(&mut self) -> String {
        self.key_counter += 1;
        format!("{}-{}", self.key_prefix, self.key_counter)
    }

    // ----- source events -----

    /// Applies one source event.
    pub fn apply(&mut self, event: SourceEvent) {
        match event {
            SourceEvent::Availability(availability) => self.availability = availability,
            SourceEvent::RunList { revision, rows } => {
                self.availability = Availability::Available;
                self.rows = rows;
                self.rows_revision = Some(revision);
                self.rows_loaded = true;
                let keep = self.cursor.as_deref().is_some_and(|cursor| {
                    self.visible_rows()
                        .iter()
                        .any(|row| row.run_id.as_str() == cursor)
                });
                if !keep && self.explicit_run.is_none() {
                    self.cursor = self
                        .visible_rows()
                        .first()
                        .map(|row| row.run_id.to_string());
                }
            }
            SourceEvent::RunView(view) => self.apply_view(view),
            SourceEvent::RunMissing { run_id, line } => {
                if let Some(run) = self.run.as_mut().filter(|run| run.run_id == run_id) {
                    run.missing = Some(line);
                }
            }
            SourceEvent::RunViewStale { run_id, line } => {
                if let Some(run) = self.run.as_mut().filter(|run| run.run_id == run_id) {
                    run.stale = Some(line);
                }
            }
            SourceEvent::Page { run_id, page } => {
                let Some(run) = self.run.as_mut().filter(|run| run.run_id == run_id) else {
                    return;
                };
                let state = run.pages.entry(page.collection.to_string()).or_default();
                let revision = page.revision.get();
                if page.cursor.is_some() && state.revision == Some(revision) {
                    state.items.extend(page.items);
                } else {
                    state.items = page.items;
                }
                state.revision = Some(revision);
                state.next_cursor = page.next_cursor.map(|c| c.to_string());
                state.loading = false;
                state.error = None;
            }
            SourceEvent::PageFailed {
                run_id,
                collection,
                line,
            } => {
                if let Some(run) = self.run.as_mut().filter(|run| run.run_id == run_id) {
                    let state = run.pages.entry(collection.to_string()).or_default();
                    state.loading = false;
                    state.error = Some(line);
                }
            }
            SourceEvent::Content {
                run_id,
                reference,
                result,
            } => self.apply_content(&run_id, reference.digest.as_str(), result),
            SourceEvent::ControlResult {
                idempotency_key,
                control,
                outcome,
                line,
            } => {
                self.control_result(&idempotency_key, &outcome, &line);
                let label = control_spec(control).label;
                self.toast(format!("{label}: {outcome} · {line}"));
            }
            SourceEvent::ResourceList(result) => {
                let follow = self.resources.apply_list(result);
                self.outbox.extend(follow);
            }
            SourceEvent::Resource {
                controller,
                key,
                result,
            } => self.resources.apply_detail(controller, key, result),
        }
    }

    /// The outcome of a control an answer dialog still waits for: accepted
    /// or adopted closes it; anything else keeps its choice and text,
    /// shows the server's line, and readies a new key (an unsent one keeps
    /// its key: the server may have it, and the same key adopts).
    fn control_result(&mut self, idempotency_key: &str, outcome: &str, line: &str) {
        let Some(Overlay::Confirm(dialog)) = self.overlay.as_ref() else {
            return;
        };
        if !dialog.sending || dialog.idempotency_key != idempotency_key {
            return;
        }
        if matches!(outcome, "accepted" | "adopted") {
            self.overlay = None;
            return;
        }
        let run_id = dialog.run_id.clone();
        let current = self
            .view()
            .filter(|view| view.run_id.as_str() == run_id)
            .and_then(|view| view.decision.clone());
        let fresh_key = (outcome != "unsent").then(|| self.next_key());
        let Some(Overlay::Confirm(dialog)) = self.overlay.as_mut() else {
            return;
        };
        dialog.sending = false;
        dialog.note = None;
        match fresh_key {
            None => {
                dialog.error = Some(format!(
                    "not sent: {line}; Enter sends it again with the same key"
                ));
            }
            Some(key) => {
                dialog.idempotency_key = key;
                dialog.error = Some(format!("the server refused it ({outcome}): {line}"));
                // The run's view shows another decision now: the next
                // confirmation answers that one, with the same choice
                // (when it still has it) and the same text.
                if let (Some(current), Some(shown)) = (current, dialog.decision.as_ref())
                    && (current.decision_id != shown.decision_id
                        || current.request_digest != shown.request_digest)
                {
                    let chosen = dialog.chosen().map(|c| c.id.clone());
                    dialog.choice = chosen
                        .and_then(|id| current.choices.as_slice().iter().position(|c| c.id == id))
                        .unwrap_or(0);
                    dialog.decision = Some(current);
                    dialog.note = Some(
                        "the dialog now shows the run's current decision; your text is kept".into(),
                    );
                }
            }
        }
    }

    fn apply_view(&mut self, view: Box<RunView>) {
        let now = self.now_ms;
        let Some(run) = self
            .run
            .as_mut()
            .filter(|run| run.run_id == view.run_id.as_str())
        else {
            return;
        };
        self.availability = Availability::Available;
        run.missing = None;
        run.stale = None;
        for update in &view.updates.items {
            if update.type_.as_str() == "progress" {
                run.eta.observe(
                    &format!("progress/{}", update.key.as_str()),
                    &update.data,
                    now,
                );
            }
        }
        let history_complete = view.steps.next_cursor.is_none()
            && view.steps.items.len() as u64 == view.steps.total.get();
        let mut wanted = Vec::new();
        if run.topology.is_none() && run.content(view.definition.digest.as_str()).is_none() {
            wanted.push(view.definition.clone());
        }
        if !history_complete
            && run.history.as_ref().map(|h| h.0.as_str())
                != Some(view.graph_history.digest.as_str())
            && run.content(view.graph_history.digest.as_str()).is_none()
        {
            wanted.push(view.graph_history.clone());
        }
        if let Some(reason) = &view.display.reason_content
            && run.content(reason.digest.as_str()).is_none()
        {
            wanted.push(reason.clone());
        }
        let history = run
            .history
            .as_ref()
            .filter(|(digest, _)| history_complete || *digest == view.graph_history.digest.as_str())
            .map(|(_, steps)| steps.as_slice());
        run.model = RunModel::new(&view, history.filter(|_| !history_complete));
        let revision = view.revision.get();
        run.view = Some(view);
        for reference in wanted {
            run.contents
                .insert(reference.digest.to_string(), ContentState::Loading);
            self.outbox.push(Command::FetchContent {
                run_id: run.run_id.clone(),
                reference,
            });
        }
        if !self.replay.live {
            let total = run.model.steps.len();
            self.replay.shown = self.replay.shown.min(total);
        }
        // A page tab on screen follows the view's revision.
        if self.screen == Screen::Run
            && let Some(collection) = self.tab.collection()
        {
            let stale = run
                .page(collection)
                .is_none_or(|p| p.revision != Some(revision) && !p.loading);
            if stale {
                self.fetch_page(collection);
            }
        }
    }

    fn apply_content(&mut self, run_id: &str, digest: &str, result: Result<Vec<u8>, String>) {
        let Some(run) = self.run.as_mut().filter(|run| run.run_id == run_id) else {
            return;
        };
        let Some(view) = run.view.as_ref() else {
            return;
        };
        let state = match result {
            Ok(bytes) => {
                if digest == view.definition.digest.as_str() {
                    match serde_json::from_slice::<Topology>(&bytes) {
                        Ok(topology) => run.topology = Some(topology),
                        Err(_) => {
                            run.contents.insert(
                                digest.to_owned(),
                                ContentState::Failed(DEFINITION_UNREADABLE.into()),
                            );
                            return;
                        }
                    }
                }
                if digest == view.graph_history.digest.as_str() {
                    match serde_json::from_slice::<Vec<StepRecord>>(&bytes) {
                        Ok(steps) => {
                            run.history = Some((digest.to_owned(), steps));
                            let history = run.history.as_ref().map(|h| h.1.as_slice());
                            run.model = RunModel::new(view, history);
                        }
                        Err(_) => {
                            run.contents.insert(
                                digest.to_owned(),
                                ContentState::Failed("the graph history could not be read".into()),
                            );
                            return;
                        }
                    }
                }
                ContentState::Ready(bytes)
            }
            Err(line) => ContentState::Failed(line),
        };
        run.contents.insert(digest.to_owned(), state);
    }

    fn fetch_page(&mut self, collection: PageCollection) {
        let Some(run) = self.run.as_mut() else { return };
        let Some(revision) = run.view.as_ref().map(|v| v.revision.get()) else {
            return;
        };
        let state = run.pages.entry(collection.to_string()).or_default();
        state.loading = true;
        self.outbox.push(Command::FetchPage {
            run_id: run.run_id.clone(),
            collection,
            cursor: None,
            revision,
        });
    }

    /// Reads the next page of a collection (after the last one held).
    fn fetch_more(&mut self, collection: PageCollection) {
        let Some(run) = self.run.as_mut() else { return };
        let Some(state) = run.pages.get_mut(&collection.to_string()) else {
            return;
        };
        let (Some(cursor), Some(revision)) = (state.next_cursor.clone(), state.revision) else {
            return;
        };
        if state.loading {
            return;
        }
        state.loading = true;
        self.outbox.push(Command::FetchPage {
            run_id: run.run_id.clone(),
            collection,
            cursor: Some(cursor),
            revision,
        });
    }

    // ----- navigation -----

    /// Opens `run_id` on the run screen (watching it; the previous run's
    /// pages and contents are dropped).
    pub fn open_run(&mut self, run_id: &str) {
        if let Some(previous) = self.run.as_ref().filter(|run| run.run_id != run_id) {
            self.outbox.push(Command::UnwatchRun {
                run_id: previous.run_id.clone(),
            });
        }
        if self.run.as_ref().is_none_or(|run| run.run_id != run_id) {
            self.run = Some(RunState::new(run_id));
            self.outbox.push(Command::WatchRun {
                run_id: run_id.to_owned(),
            });
            self.replay = Replay::default();
            self.follow = true;
            self.inspector_scroll = 0;
        }
        self.screen = Screen::Run;
        if let Some(collection) = self.tab.collection() {
            self.fetch_page(collection);
        }
    }

    fn set_tab(&mut self, tab: Tab) {
        self.tab = tab;
        self.inspector_scroll = 0;
        if let Some(collection) = tab.collection() {
            let revision = self.view().map(|v| v.revision.get());
            let stale = self
                .run
                .as_ref()
                .and_then(|run| run.page(collection))
                .is_none_or(|p| p.revision != revision && !p.loading);
            if stale {
                self.fetch_page(collection);
            }
        }
    }

    fn move_cursor(&mut self, delta: isize) {
        let rows = self.visible_rows();
        if rows.is_empty() {
            return;
        }
        let at = self.cursor_index().unwrap_or(0) as isize;
        let next = (at + delta).clamp(0, rows.len() as isize - 1) as usize;
        self.cursor = Some(rows[next].run_id.to_string());
    }

    fn cycle_status_filter(&mut self) {
        const ORDER: [DisplayStatus; 9] = [
            DisplayStatus::Running,
            DisplayStatus::Waiting,
            DisplayStatus::Paused,
            DisplayStatus::Queued,
            DisplayStatus::Ambiguous,
            DisplayStatus::Failed,
            DisplayStatus::TimedOut,
            DisplayStatus::Cancelled,
            DisplayStatus::Completed,
        ];
        self.status_filter = match self.status_filter {
            None => Some(ORDER[0]),
            Some(s) => ORDER
                .iter()
                .position(|&o| o == s)
                .and_then(|i| ORDER.get(i + 1).copied()),
        };
        self.refilter();
    }

    fn cycle_workflow_filter(&mut self) {
        let mut names: Vec<String> = self
            .rows
            .iter()
            .map(|r| r.workflow_name.to_string())
            .collect();
        names.sort();
        names.dedup();
        self.workflow_filter = match &self.workflow_filter {
            None => names.first().cloned(),
            Some(current) => names
                .iter()
                .position(|n| n == current)
                .and_then(|i| names.get(i + 1).cloned()),
        };
        self.refilter();
    }

    fn refilter(&mut self) {
        if self.cursor_index().is_none() {
            self.cursor = self.visible_rows().first().map(|r| r.run_id.to_string());
        }
    }

    fn pan_by(&mut self, dx: i32, dy: i32) {
        self.follow = false;
        self.pan = (self.pan.0 + dx, self.pan.1 + dy);
    }

    fn select_node_step(&mut self, delta: isize) {
        let Some(run) = self.run.as_ref() else { return };
        let Some(view) = run.view.as_ref() else {
            return;
        };
        if view.nodes.is_empty() {
            return;
        }
        let current = self
            .inspected_node()
            .and_then(|id| run.model.index.get(&id).copied());
        let len = view.nodes.len() as isize;
        let next = match current {
            Some(i) => (i as isize + delta).rem_euclid(len),
            None => 0,
        } as usize;
        let id = view.nodes[next].id.to_string();
        if let Some(run) = self.run.as_mut() {
            run.selected_node = Some(id);
        }
        self.follow = false;
        self.center_on_selected = true;
        self.inspector_scroll = 0;
    }

    // ----- replay -----

    /// Moves the replay cursor to `shown` steps (detaching from live when
    /// it is behind the latest step).
    pub fn seek(&mut self, shown: usize) {
        let total = self.run.as_ref().map_or(0, |run| run.model.steps.len());
        if total == 0 {
            return;
        }
        let shown = shown.clamp(1, total);
        if shown >= total && self.replay.live {
            return;
        }
        self.replay.live = false;
        self.replay.shown = shown;
        self.replay.next_at_ms = self.now_ms + self.step_interval();
        if let Some(run) = self.run.as_mut() {
            run.selected_node = None;
        }
        self.follow = true;
    }

    /// Rejoins the live view.
    pub fn go_live(&mut self) {
        self.replay.live = true;
        self.replay.playing = false;
        self.follow = true;
        if let Some(run) = self.run.as_mut() {
            run.selected_node = None;
        }
    }

    fn step_interval(&self) -> u64 {
        REPLAY_STEP_MS / SPEEDS[self.replay.speed]
    }

    fn toggle_play(&mut self) {
        let total = self.run.as_ref().map_or(0, |run| run.model.steps.len());
        if total == 0 {
            return;
        }
        if self.replay.playing {
            self.replay.playing = false;
            return;
        }
        if self.replay.live || self.replay.shown >= total {
            // Play from the start.
            self.replay.live = false;
            self.replay.shown = 1;
        }
        self.replay.playing = true;
        self.replay.next_at_ms = self.now_ms + self.step_interval();
        if let Some(run) = self.run.as_mut() {
            run.selected_node = None;
        }
        self.follow = true;
    }

    /// Advances the clock: replay steps and notices.
    pub fn tick(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        if self
            .toast
            .as_ref()
            .is_some_and(|(_, until)| *until <= now_ms)
        {
            self.toast = None;
        }
        if self.screen == Screen::Resources {
            let due = self.resources.due(now_ms);
            self.outbox.extend(due);
        }
        if self.replay.playing && !self.replay.live {
            let total = self.run.as_ref().map_or(0, |run| run.model.steps.len());
            while self.replay.playing && self.replay.next_at_ms <= now_ms {
                if self.replay.shown >= total {
                    // The end of the history: rejoin live.
                    self.go_live();
                    break;
                }
                self.replay.shown += 1;
                self.replay.next_at_ms += self.step_interval();
            }
        }
    }

    // ----- controls -----

    fn open_control(&mut self, control: Control) {
        if !self.controls().contains(&control) {
            return;
        }
        let spec = control_spec(control);
        if spec.operation.is_none() {
            self.toast(format!("{}: {}", spec.label, spec.elsewhere));
            return;
        }
        let Some(view) = self.view() else { return };
        let effect = view
            .ambiguous_effects
            .as_ref()
            .and_then(|effects| effects.as_slice().first().cloned());
        if control == Control::RecoverEffect && effect.is_none() {
            self.toast(format!(
                "{}: the run's view lists no ambiguous effect; nothing was sent",
                spec.label
            ));
            return;
        }
        let decision = view.decision.clone();
        if control == Control::HumanAnswer && decision.is_none() {
            self.toast(format!(
                "{}: the run's view shows no decision; nothing was sent",
                spec.label
            ));
            return;
        }
        let dialog = Dialog {
            run_id: view.run_id.to_string(),
            control,
            expected_revision: view.revision.get(),
            idempotency_key: String::new(),
            input: String::new(),
            effect: effect.filter(|_| control == Control::RecoverEffect),
            action: None,
            decision: decision.filter(|_| control == Control::HumanAnswer),
            choice: 0,
            sending: false,
            error: None,
            note: None,
        };
        let key = self.next_key();
        self.overlay = Some(Overlay::Confirm(Dialog {
            idempotency_key: key,
            ..dialog
        }));
    }

    fn confirm(&mut self) {
        let Some(Overlay::Confirm(dialog)) = self.overlay.as_mut() else {
            return;
        };
        if dialog.sending {
            return;
        }
        // The control must still be allowed by the view on screen; a
        // decision's answer is bound to the decision it showed by its
        // request digest, so whether that one still takes it is the
        // server's to say.
        let allowed = dialog.control == Control::HumanAnswer
            || self
                .run
                .as_ref()
                .and_then(|run| run.view.as_ref())
                .is_some_and(|view| {
                    view.run_id.as_str() == dialog.run_id
                        && view.display.controls.as_slice().contains(&dialog.control)
                });
        if !allowed {
            let label = control_spec(dialog.control).label;
            self.overlay = None;
            self.toast(format!(
                "{label} is no longer allowed by the run's current view; nothing was sent"
            ));
            return;
        }
        let payload = match dialog.control {
            Control::Answer => match serde_json::from_str::<Value>(dialog.input.trim()) {
                Ok(answer) => serde_json::json!({ "answer": answer }),
                Err(_) => {
                    dialog.error = Some(
                        "the answer is not valid JSON; type JSON, e.g. {\"approved\": true}".into(),
                    );
                    return;
                }
            },
            Control::RecoverEffect => match (&dialog.effect, dialog.action) {
                (Some(effect), Some(action)) => {
                    serde_json::json!({ "effectId": effect.effect_id, "action": action })
                }
                // Nothing is sent until the reviewer says which way.
                _ => return,
            },
            Control::HumanAnswer => {
                let (Some(decision), Some(choice)) = (&dialog.decision, dialog.chosen()) else {
                    return;
                };
                // Text goes only with a choice that takes it, under its
                // input's name; the server checks its length.
                let input = match &choice.input {
                    Some(input) => serde_json::json!({ input.name.as_str(): dialog.input }),
                    None => Value::Null,
                };
                serde_json::json!({
                    "decisionId": decision.decision_id,
                    "requestDigest": decision.request_digest,
                    "choice": choice.id,
                    "input": input,
                    "source": { "channel": "piw", "actorId": self.actor_id },
                })
            }
            Control::Pause
            | Control::Resume
            | Control::Cancel
            | Control::Restart
            | Control::Activate
            | Control::Submit
            | Control::Update => serde_json::json!({}),
        };
        let spec = control_spec(dialog.control);
        let Some(operation) = spec.operation else {
            return;
        };
        let request = ControlRequest {
            run_id: dialog.run_id.clone(),
            control: dialog.control,
            operation,
            expected_revision: dialog.expected_revision,
            idempotency_key: dialog.idempotency_key.clone(),
            payload,
        };
        if dialog.waits_for_the_outcome() {
            dialog.sending = true;
            dialog.error = None;
            dialog.note = None;
        } else {
            self.overlay = None;
        }
        self.outbox.push(Command::Control(request));
        self.toast(format!("{}: sent, waiting for the server", spec.label));
    }

    // ----- input -----

    /// Handles one key.
    pub fn key(&mut self, key: KeyEvent) {
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if self.overlay.is_some() {
            self.overlay_key(key);
            return;
        }
        match key.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('?') => self.overlay = Some(Overlay::Help),
            KeyCode::Char(',') => {
                let cursor = THEMES
                    .iter()
                    .position(|t| t.name == self.theme.name)
                    .unwrap_or(0);
                self.overlay = Some(Overlay::Themes {
                    cursor,
                    before: self.theme,
                });
            }
            _ => match self.screen {
                Screen::Runs => self.runs_key(key),
                Screen::Run => self.run_key(key),
                Screen::Resources => self.resources_key(key),
            },
        }
    }

    fn overlay_key(&mut self, key: KeyEvent) {
        match self.overlay.as_mut() {
            Some(Overlay::Help) => {
                if matches!(
                    key.code,
                    KeyCode::Esc | KeyCode::Char('?' | 'q') | KeyCode::Enter
                ) {
                    self.overlay = None;
                }
            }
            Some(Overlay::Themes { cursor, before }) => match key.code {
                KeyCode::Up | KeyCode::Char('k') => {
                    *cursor = (*cursor + THEMES.len() - 1) % THEMES.len();
                    self.theme = THEMES[*cursor];
                }
                KeyCode::Down | KeyCode::Char('j') => {
                    *cursor = (*cursor + 1) % THEMES.len();
                    self.theme = THEMES[*cursor];
                }
                KeyCode::Enter => self.overlay = None,
                KeyCode::Esc | KeyCode::Char('q') => {
                    self.theme = *before;
                    self.overlay = None;
                }
                _ => {}
            },
            Some(Overlay::Confirm(dialog)) if dialog.control == Control::HumanAnswer => {
                let takes_text = dialog.chosen().is_some_and(|c| c.input.is_some());
                let choices = dialog
                    .decision
                    .as_ref()
                    .map_or(0, |d| d.choices.as_slice().len());
                match key.code {
                    KeyCode::Esc => self.overlay = None,
                    // Nothing changes under an answer on its way.
                    _ if dialog.sending => {}
                    KeyCode::Up => dialog.choice = dialog.choice.saturating_sub(1),
                    KeyCode::Down => {
                        dialog.choice = (dialog.choice + 1).min(choices.saturating_sub(1));
                    }
                    KeyCode::Enter => self.confirm(),
                    KeyCode::Backspace if takes_text => {
                        dialog.input.pop();
                        dialog.error = None;
                    }
                    KeyCode::Char(c) if takes_text => {
                        dialog.input.push(c);
                        dialog.error = None;
                    }
                    _ => {}
                }
            }
            Some(Overlay::Confirm(dialog)) => {
                let answer = dialog.control == Control::Answer;
                // An effect review is confirmed by its verdict: c or r.
                let review = dialog.control == Control::RecoverEffect;
                match key.code {
                    KeyCode::Esc => self.overlay = None,
                    _ if dialog.sending => {}
                    KeyCode::Char('n') if !answer => self.overlay = None,
                    KeyCode::Char(verdict @ ('c' | 'r')) if review => {
                        dialog.action = Some(if verdict == 'c' {
                            RecoverAction::Confirm
                        } else {
                            RecoverAction::Retry
                        });
                        self.confirm();
                    }
                    KeyCode::Enter if !review => self.confirm(),
                    KeyCode::Char('y') if !answer && !review => self.confirm(),
                    KeyCode::Backspace if answer => {
                        dialog.input.pop();
                        dialog.error = None;
                    }
                    KeyCode::Char(c) if answer => {
                        dialog.input.push(c);
                        dialog.error = None;
                    }
                    _ => {}
                }
            }
            None => {}
        }
    }

    fn runs_key(&mut self, key: KeyEvent) {
        let page = self.page_rows.max(1) as isize;
        match key.code {
            KeyCode::Up | KeyCode::Char('k') => self.move_cursor(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_cursor(1),
            KeyCode::PageUp => self.move_cursor(-page),
            KeyCode::PageDown => self.move_cursor(page),
            KeyCode::Home | KeyCode::Char('g') => self.move_cursor(isize::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.move_cursor(isize::MAX / 2),
            KeyCode::Char('s') => self.cycle_status_filter(),
            KeyCode::Char('w') => self.cycle_workflow_filter(),
            KeyCode::Char('c') => {
                self.status_filter = None;
                self.workflow_filter = None;
                self.refilter();
            }
            KeyCode::Enter | KeyCode::Right | KeyCode::Char('l') => {
                if let Some(id) = self
                    .cursor
                    .clone()
                    .filter(|_| self.cursor_index().is_some())
                {
                    self.open_run(&id);
                }
            }
            KeyCode::Esc if self.run.is_some() => self.screen = Screen::Run,
            KeyCode::Char('m') => self.open_resources(),
            _ => {}
        }
    }

    /// Shows the resources screen; its reads start at the next tick.
    pub fn open_resources(&mut self) {
        self.screen = Screen::Resources;
        self.resources.open();
    }

    fn resources_key(&mut self, key: KeyEvent) {
        let page = self.page_rows.max(1) as isize;
        let follow = match key.code {
            KeyCode::Up | KeyCode::Char('k') => self.resources.move_cursor(-1),
            KeyCode::Down | KeyCode::Char('j') => self.resources.move_cursor(1),
            KeyCode::PageUp => self.resources.move_cursor(-page),
            KeyCode::PageDown => self.resources.move_cursor(page),
            KeyCode::Home | KeyCode::Char('g') => self.resources.move_cursor(isize::MIN / 2),
            KeyCode::End | KeyCode::Char('G') => self.resources.move_cursor(isize::MAX / 2),
            KeyCode::Esc | KeyCode::Char('m') => {
                self.screen = Screen::Runs;
                Vec::new()
            }
            _ => Vec::new(),
        };
        self.outbox.extend(follow);
    }

    fn run_key(&mut self, key: KeyEvent) {
        let total = self.run.as_ref().map_or(0, |run| run.model.steps.len());
        // Controls first: their keys are reserved while offered.
        if let KeyCode::Char(c) = key.code
            && let Some(control) = self
                .controls()
                .into_iter()
                .find(|&control| control_spec(control).key == c)
        {
            self.open_control(control);
            return;
        }
        match key.code {
            KeyCode::Esc | KeyCode::Backspace => {
                self.screen = Screen::Runs;
                if let Some(run) = &self.run {
                    self.cursor = Some(run.run_id.clone());
                }
            }
            KeyCode::Tab => {
                let browser = self.browser.unwrap_or(false);
                self.focus = match self.focus {
                    Focus::Browser => Focus::Graph,
                    Focus::Graph => Focus::Inspector,
                    Focus::Inspector if browser => Focus::Browser,
                    Focus::Inspector => Focus::Graph,
                };
            }
            KeyCode::Char('b') => {
                let shown = self.browser.unwrap_or(false);
                self.browser = Some(!shown);
                if shown && self.focus == Focus::Browser {
                    self.focus = Focus::Graph;
                }
            }
            KeyCode::Char('[') => {
                let shown = if self.replay.live {
                    total
                } else {
                    self.replay.shown
                };
                self.replay.playing = false;
                self.seek(shown.saturating_sub(1).max(1));
            }
            KeyCode::Char(']') => {
                if !self.replay.live {
                    self.replay.playing = false;
                    if self.replay.shown >= total {
                        self.go_live();
                    } else {
                        self.seek(self.replay.shown + 1);
                    }
                }
            }
            KeyCode::Char('{') => self.replay.speed = self.replay.speed.saturating_sub(1),
            KeyCode::Char('}') => self.replay.speed = (self.replay.speed + 1).min(SPEEDS.len() - 1),
            KeyCode::Char(' ') => self.toggle_play(),
            KeyCode::Home | KeyCode::Char('g') => {
                self.replay.playing = false;
                self.seek(1);
            }
            KeyCode::End | KeyCode::Char('G' | 'L') => self.go_live(),
            KeyCode::Char('z' | '+' | '-') => {
                self.density = match self.density {
                    Density::Box => Density::Compact,
                    Density::Compact => Density::Box,
                };
                self.density_chosen = true;
            }
            KeyCode::Char('f') => self.follow = !self.follow,
            KeyCode::Char('0') => {
                self.pan = (0, 0);
                self.follow = true;
            }
            KeyCode::Char('t') => {
                let at = Tab::ALL.iter().position(|&t| t == self.tab).unwrap_or(0);
                self.set_tab(Tab::ALL[(at + 1) % Tab::ALL.len()]);
            }
            KeyCode::Char(c @ '1'..='6') => self.set_tab(Tab::ALL[c as usize - '1' as usize]),
            KeyCode::Char('n') => self.select_node_step(1),
            KeyCode::Char('N') => self.select_node_step(-1),
            KeyCode::Char('v') => self.trace_node_only = !self.trace_node_only,
            KeyCode::Enter => {
                if let Some(run) = self.run.as_mut() {
                    run.selected_node = None;
                }
                self.follow = true;
            }
            code => match self.focus {
                Focus::Graph => match code {
                    KeyCode::Left | KeyCode::Char('h') => self.pan_by(-4, 0),
                    KeyCode::Right | KeyCode::Char('l') => self.pan_by(4, 0),
                    KeyCode::Up | KeyCode::Char('k') => self.pan_by(0, -2),
                    KeyCode::Down | KeyCode::Char('j') => self.pan_by(0, 2),
                    KeyCode::PageUp => self.pan_by(0, -10),
                    KeyCode::PageDown => self.pan_by(0, 10),
                    _ => {}
                },
                Focus::Inspector => match code {
                    KeyCode::Up | KeyCode::Char('k') => self.scroll_inspector(-1),
                    KeyCode::Down | KeyCode::Char('j') => self.scroll_inspector(1),
                    KeyCode::PageUp => self.scroll_inspector(-10),
                    KeyCode::PageDown => self.scroll_inspector(10),
                    _ => {}
                },
                Focus::Browser => match code {
                    KeyCode::Up | KeyCode::Char('k') => self.move_cursor(-1),
                    KeyCode::Down | KeyCode::Char('j') => self.move_cursor(1),
                    KeyCode::Right | KeyCode::Char('l') => {
                        if let Some(id) = self.cursor.clone() {
                            self.open_run(&id);
                        }
                    }
                    _ => {}
                },
            },
        }
    }

    fn scroll_inspector(&mut self, delta: i32) {
        let next = (self.inspector_scroll as i32 + delta).max(0);
        self.inspector_scroll = next.min(u16::MAX as i32) as u16;
        if delta > 0
            && let Some(collection) = self.tab.collection()
        {
            self.fetch_more(collection);
        }
    }

    /// Handles one mouse event (positions are screen cells).
    pub fn mouse(&mut self, event: MouseEvent) {
        let (column, row) = (event.column, event.row);
        let hit = self.hit_at(column, row);
        match event.kind {
            MouseEventKind::Down(MouseButton::Left) => {
                if self.overlay.is_some() {
                    // A click outside an overlay closes help and pickers;
                    // a dialog needs its keys.
                    if matches!(self.overlay, Some(Overlay::Help)) {
                        self.overlay = None;
                    }
                    return;
                }
                let double = self.last_click.is_some_and(|(c, r, at)| {
                    c == column && r == row && self.now_ms.saturating_sub(at) < 400
                });
                self.last_click = Some((column, row, self.now_ms));
                match hit {
                    Some((_, Hit::RunRow(id))) => {
                        if self.cursor.as_deref() == Some(id.as_str()) || double {
                            self.open_run(&id);
                        } else {
                            self.cursor = Some(id);
                        }
                    }
                    Some((_, Hit::BrowserRow(id))) => {
                        self.cursor = Some(id.clone());
                        self.open_run(&id);
                    }
                    Some((_, Hit::ResourceRow(id))) => {
                        let to = self.resources.rows.as_ref().and_then(|rows| {
                            rows.iter().position(|row| {
                                row.controller.as_str() == id.0 && row.key.as_str() == id.1
                            })
                        });
                        if let (Some(to), Some(at)) = (to, self.resources.cursor_index()) {
                            let follow = self.resources.move_cursor(to as isize - at as isize);
                            self.outbox.extend(follow);
                        }
                    }
                    Some((_, Hit::Node(id))) => {
                        if let Some(run) = self.run.as_mut() {
                            run.selected_node = Some(id);
                        }
                        self.focus = Focus::Graph;
                        self.inspector_scroll = 0;
                        self.drag = Some(Drag { column, row });
                    }
                    Some((_, Hit::Graph)) => {
                        self.focus = Focus::Graph;
                        self.drag = Some(Drag { column, row });
                    }
                    Some((_, Hit::Tab(tab))) => {
                        self.focus = Focus::Inspector;
                        self.set_tab(tab);
                    }
                    Some((_, Hit::Inspector)) => self.focus = Focus::Inspector,
                    Some((rect, Hit::Timeline { total })) => {
                        self.replay.playing = false;
                        let offset = column.saturating_sub(rect.x) as usize;
                        let width = rect.width.max(1) as usize;
                        let shown = (offset * total) / width + 1;
                        if shown >= total {
                            self.go_live();
                        } else {
                            self.seek(shown);
                        }
                    }
                    Some((_, Hit::LiveButton)) => self.go_live(),
                    Some((_, Hit::PlayButton)) => self.toggle_play(),
                    Some((_, Hit::ControlButton(control))) => self.open_control(control),
                    None => {}
                }
            }
            MouseEventKind::Drag(MouseButton::Left) => {
                if let Some(drag) = self.drag {
                    let dx = drag.column as i32 - column as i32;
                    let dy = drag.row as i32 - row as i32;
                    if dx != 0 || dy != 0 {
                        self.pan_by(dx, dy);
                    }
                    self.drag = Some(Drag { column, row });
                }
            }
            MouseEventKind::Up(_) => self.drag = None,
            MouseEventKind::ScrollDown | MouseEventKind::ScrollUp => {
                let delta = if event.kind == MouseEventKind::ScrollDown {
                    1
                } else {
                    -1
                };
                match hit.map(|(_, hit)| hit) {
                    Some(Hit::RunRow(_) | Hit::BrowserRow(_)) => self.move_cursor(delta as isize),
                    _ if self.screen == Screen::Resources => {
                        let follow = self.resources.move_cursor(delta as isize);
                        self.outbox.extend(follow);
                    }
                    Some(Hit::Graph | Hit::Node(_)) => {
                        if event.modifiers.contains(KeyModifiers::SHIFT) {
                            self.pan_by(delta * 4, 0);
                        } else {
                            self.pan_by(0, delta * 2);
                        }
                    }
                    Some(Hit::Inspector | Hit::Tab(_)) => self.scroll_inspector(delta),
                    _ if self.screen == Screen::Runs => self.move_cursor(delta as isize),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// The innermost region under a cell (the last one drawn wins).
    pub fn hit_at(&self, column: u16, row: u16) -> Option<(Rect, Hit)> {
        self.hits
            .iter()
            .rev()
            .find(|(rect, _)| {
                column >= rect.x
                    && column < rect.x + rect.width
                    && row >= rect.y
                    && row < rect.y + rect.height
            })
            .cloned()
    }
}
