//! TestBackend snapshots of every screen, at several sizes (80×24 and
//! 200×60 among them), from real server output (tests/fixtures, made by
//! tests/fixtures/generate.sh) validated with the protocol crate.
//! `PIW_UPDATE_SNAPSHOTS=1 cargo test -p piw --test snapshots` rewrites
//! them; review the files after that.

mod support;

use piw::app::Tab;
use piw::source::{Availability, Command, ControlRequest, SourceEvent};
use protocol::generated::types::{
    Control, DecisionAnswerPayload, EffectRecoverPayload, RecoverAction,
};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyModifiers, MouseButton, MouseEvent, MouseEventKind};
use ratatui::style::{Modifier, Style};
use support::*;

const SMALL: (u16, u16) = (80, 24);
const LARGE: (u16, u16) = (200, 60);

fn both(name: &str, harness: &mut Harness) {
    for (w, h) in [SMALL, LARGE] {
        let screen = harness.render(w, h);
        snapshot(&format!("{name}.{w}x{h}"), &screen);
    }
}

fn runs_harness() -> Harness {
    let rows = run_rows();
    let now = rows.iter().map(|r| r.updated_at_ms.get()).max().unwrap() + 60_000;
    let mut harness = Harness::new(None, now);
    harness.event(SourceEvent::RunList { revision: 7, rows });
    harness
}

#[test]
fn run_list_empty() {
    let mut harness = Harness::new(None, 1_800_000_000_000);
    harness.event(SourceEvent::RunList {
        revision: 0,
        rows: Vec::new(),
    });
    both("runs_empty", &mut harness);
}

#[test]
fn run_list_one_page() {
    let mut harness = runs_harness();
    both("runs_page", &mut harness);
    // 120x16: the list is paged; the second page after PgDn.
    snapshot("runs_page1.120x16", &harness.render(120, 16));
    harness.key(KeyCode::PageDown);
    snapshot("runs_page2.120x16", &harness.render(120, 16));
}

#[test]
fn run_list_filtered_by_status_and_workflow() {
    let mut harness = runs_harness();
    // s cycles running, waiting, paused, queued, ambiguous, failed.
    harness.keys("ssssss");
    both("runs_filter_failed", &mut harness);
    harness.keys("c");
    harness.keys("w");
    both("runs_filter_workflow", &mut harness);
    harness.keys("cssssssss");
    // timed out and cancelled have no run: an empty filtered list says so.
    both("runs_filter_none", &mut harness);
}

#[test]
fn run_detail_linear() {
    both("detail_linear", &mut run_harness("linear", "linear"));
}

#[test]
fn run_detail_switch_with_labelled_edges() {
    both("detail_switch", &mut run_harness("switch", "switch"));
}

#[test]
fn run_detail_loop_through_the_gutter() {
    both("detail_loop", &mut run_harness("loop", "loop"));
}

#[test]
fn run_detail_included_workflow() {
    both("detail_include", &mut run_harness("include", "include"));
}

#[test]
fn run_detail_failed_with_reason() {
    both("detail_failed", &mut run_harness("failed", "failed"));
}

#[test]
fn run_detail_paused() {
    both("detail_paused", &mut run_harness("paused", "paused"));
}

#[test]
fn run_detail_ambiguous() {
    both(
        "detail_ambiguous",
        &mut run_harness("ambiguous", "ambiguous"),
    );
}

#[test]
fn run_detail_waiting_on_a_checkpoint() {
    both(
        "detail_checkpoint",
        &mut run_harness("checkpoint", "checkpoint"),
    );
}

#[test]
fn run_detail_live_pipeline() {
    let mut harness = run_harness("pipeline", "pipeline");
    both("detail_pipeline", &mut harness);
    harness.key(KeyCode::Char('z'));
    both("detail_pipeline_compact", &mut harness);
}

#[test]
fn inspector_tabs() {
    let mut harness = run_harness("pipeline", "pipeline");
    let run_id = harness.app.run.as_ref().unwrap().run_id.clone();
    harness.source.pages.push((run_id, transitions_page()));
    for (key, name) in [
        ('1', "attempts"),
        ('3', "updates"),
        ('4', "trace"),
        ('5', "session"),
        ('6', "info"),
    ] {
        harness.key(KeyCode::Char(key));
        snapshot(&format!("tab_{name}.120x40"), &harness.render(120, 40));
        both(&format!("tab_{name}"), &mut harness);
    }
    let mut failed = run_harness("failed", "failed");
    failed.key(KeyCode::Char('2'));
    snapshot("tab_output_failed.120x40", &failed.render(120, 40));
    both("tab_output_failed", &mut failed);
    let mut looped = run_harness("loop", "loop");
    looped.keys("n");
    snapshot("tab_attempts_loop.120x40", &looped.render(120, 40));
}

#[test]
fn replay_mid_way() {
    let mut harness = run_harness("pipeline", "pipeline");
    // Three steps back from the latest: step 2 of 5, detached from live.
    harness.keys("[[[");
    both("replay_step2", &mut harness);
}

#[test]
fn help_overlay() {
    let mut harness = run_harness("pipeline", "pipeline");
    harness.keys("?");
    both("help", &mut harness);
}

#[test]
fn control_confirmation_dialogs() {
    let mut harness = run_harness("pipeline", "pipeline");
    harness.keys("p");
    both("confirm_pause", &mut harness);
    let mut answer = run_harness("checkpoint", "checkpoint");
    answer.keys("a{\"publish\": tru");
    both("confirm_answer", &mut answer);
    answer.key(KeyCode::Enter);
    both("confirm_answer_invalid", &mut answer);
}

#[test]
fn an_ambiguous_effect_is_reviewed_in_a_dialog_and_sent_with_its_verdict() {
    let mut harness = run_harness("ambiguous", "ambiguous");
    let view = harness.app.view().unwrap().clone();
    let effect = view.ambiguous_effects.as_ref().unwrap().as_slice()[0].clone();
    harness.keys("E");
    both("confirm_recover_effect", &mut harness);
    let screen = harness.render(80, 24);
    assert!(
        screen.contains("payment at charge · attempt 1") && screen.contains("[c] it applied"),
        "{screen}"
    );
    // y and Enter say nothing about the effect: nothing is sent.
    harness.keys("y");
    harness.key(KeyCode::Enter);
    assert!(
        sent_controls(&harness).is_empty(),
        "{:?}",
        harness.source.sent
    );
    assert!(harness.render(80, 24).contains("recover effect · confirm"));
    // r: apply it again, with the dialog's key, the effect and the verdict.
    harness.keys("r");
    let [request] = sent_controls(&harness)
        .try_into()
        .expect("one control sent");
    assert_eq!(
        (request.operation, request.run_id.as_str(), request.control),
        (
            "effect.recover",
            view.run_id.as_str(),
            Control::RecoverEffect
        )
    );
    let payload: EffectRecoverPayload =
        serde_json::from_value(request.payload.clone()).expect("an effect.recover payload");
    assert_eq!(
        (payload.effect_id, payload.action),
        (effect.effect_id, RecoverAction::Retry)
    );
    assert!(!harness.render(80, 24).contains("recover effect · confirm"));
}

/// The controls piw sent, in order.
fn sent_controls(harness: &Harness) -> Vec<ControlRequest> {
    harness
        .source
        .sent
        .iter()
        .filter_map(|command| match command {
            Command::Control(request) => Some(request.clone()),
            _ => None,
        })
        .collect()
}

/// The request a control goes out as, checked whole against client.v1
/// by the protocol crate's frame decoder (schema, canonical form), and its
/// payload typed.
fn decision_answer(request: &ControlRequest) -> DecisionAnswerPayload {
    let frame = serde_json::json!({
        "schema": "pi-workflows.client.v1", "type": "request", "requestId": "r1",
        "clientId": "piw-test", "operation": request.operation, "runId": request.run_id,
        "idempotencyKey": request.idempotency_key, "payload": request.payload,
    });
    let mut bytes = protocol::canonicalize(&frame).expect("canonical");
    bytes.push(b'\n');
    protocol::decode_client_frame(&bytes)
        .unwrap_or_else(|e| panic!("not a valid decision.answer request: {e}"));
    serde_json::from_value(request.payload.clone()).expect("a decision.answer payload")
}

/// The outcome of a control as the live source tells it.
fn outcome(request: &ControlRequest, outcome: &str, line: &str) -> SourceEvent {
    SourceEvent::ControlResult {
        idempotency_key: request.idempotency_key.clone(),
        control: request.control,
        outcome: outcome.into(),
        line: line.into(),
    }
}

#[test]
fn a_protected_decision_is_answered_in_a_dialog_of_its_typed_choices() {
    let mut harness = run_harness("decision", "decision");
    let view = harness.app.view().unwrap().clone();
    let decision = view.decision.clone().expect("the run waits on a decision");
    assert!(harness.render(80, 24).contains("[A] human answer"));
    harness.keys("A");
    both("confirm_human_answer", &mut harness);
    let screen = harness.render(80, 24);
    for shown in [
        "human answer · confirm",
        "Publish release 1.4?",
        "▸ Publish it (approve)",
        "Ask for changes (revise) · takes text",
        "Hold the release (hold) · default at expiry",
    ] {
        assert!(screen.contains(shown), "{shown}: {screen}");
    }
    // The first choice takes no text: typing types nothing.
    harness.keys("xyz");
    assert!(!harness.render(80, 24).contains("> xyz"));
    // ↓ to revise: its prompt and a text field; the text survives moving
    // between choices.
    harness.key(KeyCode::Down);
    harness.keys("tighten the notes");
    both("confirm_human_answer_text", &mut harness);
    let screen = harness.render(80, 24);
    assert!(
        screen.contains("▸ Ask for changes")
            && screen.contains("What should change? (1–500")
            && screen.contains("> tighten the notes█"),
        "{screen}"
    );
    harness.key(KeyCode::Down);
    harness.key(KeyCode::Up);
    assert!(harness.render(80, 24).contains("> tighten the notes█"));
    assert!(sent_controls(&harness).is_empty());

    // Enter sends decision.answer: the decision and the request digest
    // shown, the choice, its text under its input's name, piw's source.
    harness.key(KeyCode::Enter);
    let [request] = sent_controls(&harness)
        .try_into()
        .expect("one control sent");
    assert_eq!(
        (request.operation, request.run_id.as_str(), request.control),
        (
            "decision.answer",
            view.run_id.as_str(),
            Control::HumanAnswer
        )
    );
    let payload = decision_answer(&request);
    assert_eq!(
        (
            &payload.decision_id,
            &payload.request_digest,
            payload.choice.as_str()
        ),
        (&decision.decision_id, &decision.request_digest, "revise")
    );
    assert_eq!(
        serde_json::to_value(&payload.input).unwrap(),
        serde_json::json!({"feedback": "tighten the notes"})
    );
    assert_eq!(
        serde_json::to_value(&payload.source).unwrap(),
        serde_json::json!({"channel": "piw", "actorId": harness.app.actor_id})
    );
    // It waits for the server: nothing more is sent meanwhile.
    assert!(
        harness
            .render(80, 24)
            .contains("sending… waiting for the server")
    );
    harness.key(KeyCode::Enter);
    harness.keys("more");
    assert_eq!(sent_controls(&harness).len(), 1);
    // Accepted: the dialog closes and the footer says so.
    harness.event(outcome(&request, "accepted", "the server is at revision 9"));
    assert!(harness.app.overlay.is_none());
    assert!(harness.render(80, 24).contains("human answer: accepted"));

    // A choice without text goes with a null input (and no typed text).
    let mut harness = run_harness("decision", "decision");
    harness.keys("A");
    harness.key(KeyCode::Down);
    harness.keys("kept aside");
    harness.key(KeyCode::Down);
    harness.key(KeyCode::Enter);
    let [request] = sent_controls(&harness)
        .try_into()
        .expect("one control sent");
    let payload = decision_answer(&request);
    assert_eq!((payload.choice.as_str(), payload.input), ("hold", None));
}

#[test]
fn a_refused_answer_keeps_its_choice_and_text_and_answers_the_decision_shown_next() {
    let mut harness = run_harness("decision", "decision");
    let shown = harness.app.view().unwrap().decision.clone().unwrap();
    harness.keys("A");
    harness.key(KeyCode::Down);
    harness.keys("tighten the notes");
    // Under the open dialog the run's decision changed: the view now shows
    // another request.
    let mut changed = serde_json::to_value(harness.app.view().unwrap()).unwrap();
    let digest = format!("sha256:{}", "ab".repeat(32));
    changed["revision"] = serde_json::json!(changed["revision"].as_u64().unwrap() + 1);
    changed["decision"]["requestDigest"] = serde_json::json!(digest);
    harness.event(SourceEvent::RunView(Box::new(view_from_value(&changed))));
    assert!(
        harness
            .render(80, 24)
            .contains("no longer shows this decision"),
        "{}",
        harness.render(80, 24)
    );
    // Enter sends what the dialog showed, not the newer request.
    harness.key(KeyCode::Enter);
    let [first] = sent_controls(&harness)
        .try_into()
        .expect("one control sent");
    assert_eq!(decision_answer(&first).request_digest, shown.request_digest);
    // The server refuses it (its line for a stale digest): the dialog stays
    // with the choice and the text, shows the refusal, and now shows the
    // decision the view shows.
    harness.event(outcome(
        &first,
        "rejected",
        "the decision's request changed since it was shown; read the run view again and answer the request it shows",
    ));
    both("confirm_human_answer_refused", &mut harness);
    let screen = harness.render(80, 24);
    assert!(
        screen.contains("the server refused it (rejected): the decision's request changed")
            && screen.contains("▸ Ask for changes")
            && screen.contains("> tighten the notes█")
            && screen.contains("now shows the run's current decision"),
        "{screen}"
    );
    // The next Enter answers the request on screen, under a new key.
    harness.key(KeyCode::Enter);
    let second = sent_controls(&harness).pop().unwrap();
    let payload = decision_answer(&second);
    assert_ne!(second.idempotency_key, first.idempotency_key);
    assert_eq!(
        (payload.request_digest.as_str(), payload.choice.as_str()),
        (digest.as_str(), "revise")
    );
    assert_eq!(
        serde_json::to_value(&payload.input).unwrap(),
        serde_json::json!({"feedback": "tighten the notes"})
    );
    // Not sent at all (the connection gave up): the same key goes again,
    // so a server that did take it adopts its receipt.
    harness.event(outcome(
        &second,
        "unsent",
        "the pi-workflows server is not running",
    ));
    assert!(harness.render(80, 24).contains("not sent:"));
    harness.key(KeyCode::Enter);
    let third = sent_controls(&harness).pop().unwrap();
    assert_eq!(third.idempotency_key, second.idempotency_key);
    assert_eq!(sent_controls(&harness).len(), 3);
}

#[test]
fn replay_plays_pauses_seeks_changes_speed_and_rejoins_live() {
    let mut harness = run_harness("pipeline", "pipeline");
    let total = harness.app.steps_shown();
    assert_eq!(total, 5);
    let footer = |h: &mut Harness| {
        let screen = h.render(120, 32);
        let lines: Vec<&str> = screen.lines().collect();
        lines[lines.len() - 4..].join("\n")
    };
    assert!(footer(&mut harness).contains("● LIVE"));
    // Seek: g to the first step, ] and [ one step each.
    harness.keys("g");
    assert_eq!(
        (harness.app.replay.live, harness.app.steps_shown()),
        (false, 1)
    );
    harness.keys("]]");
    harness.keys("[");
    assert_eq!(harness.app.steps_shown(), 2);
    let shown = footer(&mut harness);
    assert!(
        shown.contains("replay · step 2/5") && shown.contains("[L] Live"),
        "{shown}"
    );
    // Speeds: } up to 10× and no further, { back down to 2×.
    harness.keys("}}}}");
    assert!(footer(&mut harness).contains("10×"));
    harness.keys("{{");
    assert!(footer(&mut harness).contains("2×"));
    // Play at 2×: a step every 350 ms of the clock.
    let start = harness.app.now_ms;
    harness.keys(" ");
    assert!(harness.app.replay.playing && footer(&mut harness).contains("‖"));
    harness.app.tick(start + 349);
    assert_eq!(harness.app.steps_shown(), 2);
    harness.app.tick(start + 350);
    assert_eq!(harness.app.steps_shown(), 3);
    // Pause: the clock moves on, the step does not.
    harness.keys(" ");
    harness.app.tick(start + 5_000);
    assert_eq!(
        (harness.app.replay.playing, harness.app.steps_shown()),
        (false, 3)
    );
    assert!(footer(&mut harness).contains("replay · step 3/5"));
    // Play on to the end of the history: it rejoins live by itself.
    harness.keys(" ");
    harness.app.tick(start + 5_000 + 350 * 3);
    assert!(harness.app.replay.live && !harness.app.replay.playing);
    assert!(footer(&mut harness).contains("● LIVE"));
    // From live, [ leaves it; L (like End and G) rejoins.
    harness.keys("[");
    assert_eq!(
        (harness.app.replay.live, harness.app.steps_shown()),
        (false, 4)
    );
    harness.keys("L");
    assert!(harness.app.replay.live && footer(&mut harness).contains("live · step 5/5"));
}

#[test]
fn the_theme_picker_previews_and_esc_restores() {
    let mut harness = run_harness("pipeline", "pipeline");
    let before = harness.app.theme;
    harness.keys(",");
    both("themes", &mut harness);
    harness.key(KeyCode::Down);
    assert_ne!(harness.app.theme, before, "the cursor's theme is previewed");
    harness.key(KeyCode::Esc);
    assert_eq!(harness.app.theme, before);
    harness.keys(",");
    harness.key(KeyCode::Down);
    let chosen = harness.app.theme;
    harness.key(KeyCode::Enter);
    assert!(harness.app.overlay.is_none());
    assert_eq!(harness.app.theme, chosen);
}

#[test]
fn the_mouse_opens_a_run_picks_a_tab_and_a_control() {
    let mut harness = runs_harness();
    let screen = harness.render(120, 32);
    let rows = run_rows();
    // A click on a row moves the cursor there; a second click opens it.
    let target = &rows[1].run_id;
    let row = screen
        .lines()
        .position(|line| line.contains(target.as_str()))
        .unwrap() as u16;
    let watched = |h: &Harness| {
        h.source
            .sent
            .iter()
            .any(|c| matches!(c, Command::WatchRun { run_id } if run_id == target.as_str()))
    };
    harness.app.mouse(click(10, row));
    harness.pump();
    assert!(!watched(&harness));
    assert!(
        harness
            .render(120, 32)
            .lines()
            .nth(row as usize)
            .unwrap()
            .contains('▸')
    );
    harness.app.mouse(click(10, row));
    harness.pump();
    assert!(watched(&harness), "{:?}", harness.source.sent);
    // On a run screen: a click on a tab's label selects it; on a control
    // button opens its dialog.
    let mut harness = run_harness("pipeline", "pipeline");
    let screen = harness.render(120, 32);
    let (x, y) = at(&screen, "4 Trace");
    harness.app.mouse(click(x, y));
    harness.pump();
    assert_eq!(harness.app.tab, Tab::Trace);
    let screen = harness.render(120, 32);
    let (x, y) = at(&screen, "[p] pause");
    harness.app.mouse(click(x + 1, y));
    assert!(harness.render(120, 32).contains("pause · confirm"));
    assert!(
        harness
            .source
            .sent
            .iter()
            .all(|c| !matches!(c, Command::Control(_)))
    );
}

fn click(column: u16, row: u16) -> MouseEvent {
    MouseEvent {
        kind: MouseEventKind::Down(MouseButton::Left),
        column,
        row,
        modifiers: KeyModifiers::NONE,
    }
}

/// The cell (column, row) where `text` starts on a screen.
fn at(screen: &str, text: &str) -> (u16, u16) {
    screen
        .lines()
        .enumerate()
        .find_map(|(y, line)| {
            let byte = line.find(text)?;
            Some((line[..byte].chars().count() as u16, y as u16))
        })
        .unwrap_or_else(|| panic!("{text} on the screen: {screen}"))
}

#[test]
fn unavailable_and_version_mismatch_lines() {
    let mut harness = Harness::new(None, 0);
    harness.event(SourceEvent::Availability(Availability::Unavailable(
        "piw: the pi-workflows server is not running; start it with `pi-workflows server start` (or install pi-workflows)".into(),
    )));
    both("unavailable", &mut harness);
    let mut harness = Harness::new(None, 0);
    harness.event(SourceEvent::Availability(Availability::VersionMismatch(
        "piw: the pi-workflows server is version 0.2.0 but piw is 0.1.0; install matching pi-workflows packages".into(),
    )));
    both("version_mismatch", &mut harness);
    // A run on screen when the server goes away stays, labelled disconnected.
    let mut harness = run_harness("pipeline", "pipeline");
    harness.event(SourceEvent::Availability(Availability::Unavailable(
        "piw: the pi-workflows server is not running; start it with `pi-workflows server start`"
            .into(),
    )));
    both("detail_disconnected", &mut harness);
}

#[test]
fn a_stale_view_is_labelled_stale_with_its_line_until_a_fresh_view_arrives() {
    let mut harness = run_harness("pipeline", "pipeline");
    let run_id = harness.app.run.as_ref().unwrap().run_id.clone();
    let live = harness.render(80, 24);
    assert!(live.lines().next().unwrap().contains("● live"), "{live}");
    harness.event(SourceEvent::RunViewStale {
        run_id,
        line: "the server sent a view piw cannot read (revision 9); asking for a fresh one (if this repeats, install matching pi-workflows and piw versions)".into(),
    });
    both("detail_stale", &mut harness);
    let screen = harness.render(80, 24);
    let header = screen.lines().next().unwrap();
    assert!(
        header.contains("◌ stale") && !header.contains("● live"),
        "{screen}"
    );
    let footer = screen.lines().rev().find(|l| !l.is_empty()).unwrap();
    assert!(
        footer.contains("stale view · the server sent a view piw cannot read"),
        "{screen}"
    );
    // The fresh snapshot clears it.
    harness.event(SourceEvent::RunView(Box::new(view("pipeline"))));
    let again = harness.render(80, 24);
    assert!(again.lines().next().unwrap().contains("● live"), "{again}");
    assert!(!again.contains("stale"), "{again}");
}

#[test]
fn a_definition_that_is_no_topology_is_named_in_the_graph_title() {
    let junk = br#"{"not":"a topology"}"#.to_vec();
    let mut view = view("pipeline");
    view.definition = serde_json::from_value(serde_json::json!({
        "digest": protocol::content::digest_text(&junk), "mediaType": "application/json",
        "bytes": junk.len(),
    }))
    .unwrap();
    let mut harness = Harness::new(Some(view.run_id.as_str()), view.updated_at_ms.get() + 4_000);
    harness.source.contents.push(junk);
    harness.event(SourceEvent::RunView(Box::new(view)));
    let screen = harness.render(120, 32);
    let title = screen.lines().find(|l| l.contains("graph ·")).unwrap();
    assert!(
        title.contains("definition unreadable: no switch labels"),
        "{screen}"
    );
    // A definition that reads is not named.
    let mut good = run_harness("pipeline", "pipeline");
    assert!(!good.render(120, 32).contains("definition unreadable"));
}

/// The buffer of one frame (for styles).
fn frame(app: &mut piw::app::App, width: u16, height: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| piw::ui::draw(frame, app)).unwrap();
    terminal.backend().buffer().clone()
}

/// The style of the branch arrow `▼` just before `label` on the screen.
fn arrow_style(buffer: &Buffer, label: &str) -> Style {
    let screen = (0..buffer.area.height)
        .map(|y| {
            (0..buffer.area.width)
                .map(|x| buffer[(x, y)].symbol())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n");
    let (x, y) = at(&screen, &format!("▼ {label}"));
    buffer[(x, y)].style()
}

#[test]
fn the_taken_path_is_highlighted_as_of_the_step_shown() {
    let mut harness = run_harness("switch", "switch");
    let theme = harness.app.theme;
    let path =
        |style: Style| style.fg == theme.path().fg && style.add_modifier.contains(Modifier::BOLD);
    let border = |style: Style| style.fg == theme.border().fg;
    // fetch failed, so the run went fetch → recover: that branch is the path.
    let live = frame(&mut harness.app, 80, 24);
    assert!(
        path(arrow_style(&live, "failed")),
        "{:?}",
        arrow_style(&live, "failed")
    );
    assert!(border(arrow_style(&live, "ok")) && !path(arrow_style(&live, "ok")));
    // Replayed to step 1 (only fetch): no branch is taken yet.
    harness.keys("g");
    let first = frame(&mut harness.app, 80, 24);
    assert!(border(arrow_style(&first, "failed")) && !path(arrow_style(&first, "failed")));
}

#[test]
fn arrows_pan_the_graph_and_f_follows_again() {
    let mut harness = run_harness("pipeline", "pipeline");
    let title = |h: &mut Harness| {
        h.render(80, 24)
            .lines()
            .find(|l| l.contains("graph ·"))
            .unwrap()
            .to_owned()
    };
    let graph = |h: &mut Harness| {
        h.render(80, 24)
            .lines()
            .skip(3)
            .take(10)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(title(&mut harness).contains("follow"));
    let followed = graph(&mut harness);
    harness.key(KeyCode::Up);
    harness.key(KeyCode::Up);
    harness.key(KeyCode::Left);
    let panned = graph(&mut harness);
    assert_ne!(panned, followed);
    assert!(
        !title(&mut harness).contains("follow"),
        "{}",
        title(&mut harness)
    );
    // f centres the followed node again.
    harness.keys("f");
    assert!(title(&mut harness).contains("follow"));
    assert_eq!(graph(&mut harness), followed);
}

#[test]
fn the_help_names_the_key_of_every_control_piw_sends() {
    let all = [
        Control::Pause,
        Control::Resume,
        Control::Cancel,
        Control::Restart,
        Control::Answer,
        Control::Activate,
        Control::HumanAnswer,
        Control::RecoverEffect,
        Control::Submit,
        Control::Update,
    ];
    for control in all {
        let spec = piw::model::control_spec(control);
        if spec.operation.is_none() {
            continue;
        }
        let named = piw::ui::HELP.iter().any(|(keys, what)| {
            keys.split_whitespace()
                .any(|key| key == spec.key.to_string())
                && what.contains(spec.label)
        });
        assert!(named, "{} ({}) is not in the help", spec.label, spec.key);
    }
}

// ----- resources (`m` from the run list) -----

/// The fixture's clock: a few seconds after its newest update.
const RESOURCES_NOW: u64 = 1_796_129_450_000;

/// The run list, then `m`: the resources screen with the fake answering
/// `resource.list` with `rows` (absent: a failure) and `resource.get`
/// from `views`.
fn resources_harness(
    rows: Option<Vec<protocol::generated::types::ResourceListRow>>,
    views: Vec<protocol::generated::types::ResourceView>,
) -> Harness {
    let mut harness = Harness::new(None, RESOURCES_NOW);
    harness.event(SourceEvent::RunList {
        revision: 1,
        rows: Vec::new(),
    });
    harness.source.resources = rows;
    harness.source.resource_views = views;
    harness.keys("m");
    harness.app.tick(RESOURCES_NOW);
    harness.pump();
    harness
}

fn resource_reads(harness: &Harness) -> (usize, Vec<String>) {
    let lists = harness
        .source
        .sent
        .iter()
        .filter(|c| **c == Command::ListResources)
        .count();
    let gets = harness
        .source
        .sent
        .iter()
        .filter_map(|c| match c {
            Command::GetResource { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect();
    (lists, gets)
}

#[test]
fn resources_list_and_the_selected_resources_detail() {
    let (rows, views) = resources_fixture();
    let mut harness = resources_harness(Some(rows), views);
    both("resources_detail", &mut harness);
    harness.key(KeyCode::Down);
    both("resources_detail_second", &mut harness);
    harness.keys("j");
    snapshot("resources_deleting.200x60", &harness.render(200, 60));
    // The detail is the selected resource's, read once per selection.
    assert_eq!(
        resource_reads(&harness).1,
        ["octo/widgets#12", "octo/widgets#13", "staging"]
    );
    // Never the spec, the controller's status value or the status's run.
    for (w, h) in [SMALL, LARGE] {
        harness.keys("gg");
        for _ in 0..3 {
            let screen = harness.render(w, h);
            assert!(
                !screen.contains("SECRET") && !screen.contains("STATUS-RUN"),
                "{screen}"
            );
            harness.keys("j");
        }
    }
}

#[test]
fn resources_empty_says_how_to_apply_one() {
    let mut harness = resources_harness(Some(Vec::new()), Vec::new());
    both("resources_empty", &mut harness);
    let screen = harness.render(200, 60);
    assert!(
        screen.contains("pi-workflows apply <controller> <key> <spec.json>"),
        "{screen}"
    );
}

#[test]
fn resources_a_failed_read_is_one_line() {
    let mut harness = resources_harness(None, Vec::new());
    snapshot("resources_failed.80x24", &harness.render(80, 24));
}

#[test]
fn resources_are_read_again_every_second_while_shown() {
    let (rows, views) = resources_fixture();
    let first = rows[..1].to_vec();
    let mut harness = resources_harness(Some(first), views);
    assert_eq!(
        resource_reads(&harness),
        (1, vec!["octo/widgets#12".into()])
    );
    harness.app.tick(RESOURCES_NOW + 500);
    harness.pump();
    assert_eq!(resource_reads(&harness).0, 1, "not due before a second");
    // A resource applied meanwhile shows at the next read.
    harness.source.resources = Some(rows);
    assert!(!harness.render(200, 60).contains("preview-env/staging"));
    harness.app.tick(RESOURCES_NOW + 1_000);
    harness.pump();
    assert_eq!(
        resource_reads(&harness),
        (2, vec!["octo/widgets#12".into(), "octo/widgets#12".into()])
    );
    assert!(harness.render(200, 60).contains("preview-env/staging"));
    // Back on the run list nothing is read.
    harness.key(KeyCode::Esc);
    harness.app.tick(RESOURCES_NOW + 5_000);
    harness.pump();
    assert_eq!(resource_reads(&harness).0, 2);
}

#[test]
fn resources_a_clicked_row_is_selected_with_its_detail() {
    let (rows, views) = resources_fixture();
    let mut harness = resources_harness(Some(rows), views);
    harness.render(80, 24);
    // The third row (preview-env/staging) is on the list's third line.
    harness.app.mouse(click(10, 4));
    harness.pump();
    assert_eq!(resource_reads(&harness).1.last().unwrap(), "staging");
    let screen = harness.render(80, 24);
    assert!(
        screen.contains("╭ preview-env/staging")
            && screen.contains("finalizers left: preview-env/teardown"),
        "{screen}"
    );
}
