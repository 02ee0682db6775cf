//! TestBackend snapshots of every screen, at several sizes (80×24 and
//! 200×60 among them), from real server output (tests/fixtures, made by
//! tests/fixtures/generate.sh) validated with the protocol crate.
//! `PIW_UPDATE_SNAPSHOTS=1 cargo test -p piw --test snapshots` rewrites
//! them; review the files after that.

mod support;

use piw::source::{Availability, SourceEvent};
use ratatui::crossterm::event::KeyCode;
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
    snapshot("runs_filter_failed.80x24", &harness.render(80, 24));
    harness.keys("c");
    harness.keys("w");
    snapshot("runs_filter_workflow.80x24", &harness.render(80, 24));
    harness.keys("cssssssss");
    // timed out and cancelled have no run: an empty filtered list says so.
    snapshot("runs_filter_none.80x24", &harness.render(80, 24));
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
    snapshot("detail_pipeline_compact.200x60", &harness.render(200, 60));
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
    }
    let mut failed = run_harness("failed", "failed");
    failed.key(KeyCode::Char('2'));
    snapshot("tab_output_failed.120x40", &failed.render(120, 40));
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
    snapshot("confirm_answer.80x24", &answer.render(80, 24));
    answer.key(KeyCode::Enter);
    snapshot("confirm_answer_invalid.80x24", &answer.render(80, 24));
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
    snapshot("version_mismatch.80x24", &harness.render(80, 24));
    // A run on screen when the server goes away stays, labelled disconnected.
    let mut harness = run_harness("pipeline", "pipeline");
    harness.event(SourceEvent::Availability(Availability::Unavailable(
        "piw: the pi-workflows server is not running; start it with `pi-workflows server start`"
            .into(),
    )));
    snapshot("detail_disconnected.80x24", &harness.render(80, 24));
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
    let screen = harness.render(80, 24);
    snapshot("detail_stale.80x24", &screen);
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
