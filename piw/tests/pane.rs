//! piw in its pane: a clean exit on SIGTERM and SIGHUP that restores the
//! terminal (the alternate screen left, the cursor shown, mouse reporting
//! and raw mode off), and `piw --herdr-pane`, the Herdr plugin pane's
//! command, which labels its pane `piw · <runId>` (through the fake
//! `herdr` of scripts/fake-herdr.mjs) and shows that run. Real server,
//! real tmux. Needs `cargo build -p server` and tmux.

mod support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::live::{Server, Tmux, piw, wait_for};

/// The pid of the pane shell's one child (piw).
fn child_of(pid: &str) -> i32 {
    wait_for("piw to start in the pane", Duration::from_secs(10), || {
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    })
}

/// Runs piw on `run` in a shell that reports, after piw ends, how piw
/// ended and the tty's line discipline (`icanon`/`echo`, or `-icanon`/
/// `-echo` when raw mode was left on).
fn piw_in_shell(server: &Server, run: &str) -> Tmux {
    let script = format!(
        "'{}' {run}; echo \"piw-ended $?\"; echo \"tty: $(stty -a | tr ' ' '\\n' | grep -E '^-?(icanon|echo)$' | tr '\\n' ' ')\"; exec sleep 600",
        piw().display()
    );
    Tmux::start(
        server.dir.path(),
        &server.env(),
        &["sh", "-c", &script],
        100,
        30,
    )
}

fn signal_restores_the_terminal(signal: i32, name: &str) {
    let server = Server::started();
    let run = server.start("paused");
    let tmux = piw_in_shell(&server, &run);
    tmux.wait_screen("piw on the run", |s| {
        s.lines().next().is_some_and(|h| h.contains(&run))
    });
    // While piw runs: the alternate screen, no cursor, mouse reporting.
    assert_eq!(
        tmux.format("#{alternate_on} #{cursor_flag} #{mouse_any_flag}"),
        "1 0 1"
    );
    let pid = child_of(&tmux.format("#{pane_pid}"));
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let after = tmux.wait_screen(&format!("piw to end on SIG{name}"), |s| {
        s.contains("piw-ended") && s.contains("tty: ")
    });
    assert_eq!(
        tmux.format("#{alternate_on} #{cursor_flag} #{mouse_any_flag}"),
        "0 1 0",
        "the terminal modes after SIG{name}; the screen:\n{after}"
    );
    assert!(
        after.contains("tty: icanon echo"),
        "raw mode left on: {after}"
    );
    // piw ends with the signal's conventional status, 128 + the signal.
    assert!(
        after.contains(&format!("piw-ended {}", 128 + signal)),
        "{after}"
    );
    assert!(
        !after.contains("piw runs") && !after.contains("[p] pause"),
        "piw's drawing is gone: {after}"
    );
}

#[test]
fn sigterm_ends_piw_and_restores_the_terminal() {
    signal_restores_the_terminal(15, "TERM");
}

#[test]
fn sighup_ends_piw_and_restores_the_terminal() {
    signal_restores_the_terminal(1, "HUP");
}

/// The terminal goes away under piw (the tmux server is killed, as when a
/// terminal window is closed): piw ends within a bound instead of spinning
/// on the dead terminal (crossterm's input read retries a hung-up tty
/// forever, so the loop alone never sees the SIGHUP it flagged).
#[test]
fn piw_ends_when_its_terminal_goes_away() {
    let server = Server::started();
    let run = server.start("paused");
    let tmux = Tmux::start(
        server.dir.path(),
        &server.env(),
        &[&piw().to_string_lossy(), &run],
        100,
        30,
    );
    tmux.wait_screen("piw on the run", |s| {
        s.lines().next().is_some_and(|h| h.contains(&run))
    });
    let pid = tmux.format("#{pane_pid}");
    // A piw left spinning by a failure is killed, not left to the machine.
    struct KillOnDrop(String);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.0])
                .status();
        }
    }
    let _spinner = KillOnDrop(pid.clone());
    tmux.kill_server();
    wait_for(
        "piw to end after its terminal went away",
        Duration::from_secs(10),
        || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            // Gone, or a zombie nobody reaped yet.
            match stat {
                None => Some(()),
                Some(stat) => stat
                    .rsplit(')')
                    .next()?
                    .trim_start()
                    .starts_with('Z')
                    .then_some(()),
            }
        },
    );
}

/// A directory with the fake `herdr` (its calls are recorded next to it).
fn fake_herdr(dir: &Path) -> PathBuf {
    let bin = dir.join("herdr-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fake-herdr.mjs");
    std::os::unix::fs::symlink(script, bin.join("herdr")).unwrap();
    let state = serde_json::json!({"panes": [
        {"pane_id": "w1:p1", "tab_id": "w1:t1", "workspace_id": "w1", "label": "pi"},
        {"pane_id": "w1:p2", "tab_id": "w1:t1", "workspace_id": "w1", "label": "piw"}
    ], "plugin": null, "fail": [], "next": 3});
    std::fs::write(bin.join("herdr-state.json"), state.to_string()).unwrap();
    bin
}

fn herdr_calls(bin: &Path) -> Vec<Value> {
    std::fs::read_to_string(bin.join("herdr-calls.ndjson"))
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn the_herdr_pane_command_labels_its_pane_with_the_run_and_shows_that_run() {
    let server = Server::started();
    let other = server.start("linear");
    server.wait_status(&other, "completed");
    let run = server.start("paused");
    let bin = fake_herdr(server.dir.path());
    let mut env = server.env();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    env.extend([
        (OsString::from("PATH"), OsString::from(path)),
        (OsString::from("HERDR_PANE_ID"), OsString::from("w1:p2")),
        (OsString::from("PI_WORKFLOWS_RUN_ID"), OsString::from(&run)),
    ]);
    let piw = piw();
    let tmux = Tmux::start(
        server.dir.path(),
        &env,
        &[piw.to_str().unwrap(), "--herdr-pane"],
        100,
        30,
    );
    let screen = tmux.wait_screen("piw on the pane's run", |s| {
        s.lines().next().is_some_and(|h| h.contains(&run))
    });
    assert!(!screen.contains(&other), "only the pane's run: {screen}");
    let calls = herdr_calls(&bin);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0]["argv"],
        serde_json::json!(["pane", "rename", "w1:p2", format!("piw · {run}")])
    );
    tmux.keys(&["q"]);
    wait_for("piw to exit", Duration::from_secs(10), || {
        tmux.exited().then_some(())
    });
}

#[test]
fn the_herdr_pane_command_without_its_variables_is_one_line_and_renames_nothing() {
    let server = Server::started();
    let bin = fake_herdr(server.dir.path());
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (env, says) in [
        (
            vec![("HERDR_PANE_ID", "w1:p2")],
            "--herdr-pane needs PI_WORKFLOWS_RUN_ID set to a run id",
        ),
        (
            vec![
                ("HERDR_PANE_ID", "w1:p2"),
                ("PI_WORKFLOWS_RUN_ID", "../etc"),
            ],
            "--herdr-pane needs PI_WORKFLOWS_RUN_ID set to a run id",
        ),
        (
            vec![("PI_WORKFLOWS_RUN_ID", "run-1")],
            "--herdr-pane runs only in a Herdr pane",
        ),
        (
            vec![("PI_WORKFLOWS_RUN_ID", "run-1"), ("HERDR_PANE_ID", "w9:p9")],
            "herdr pane rename failed (herdr: no pane w9:p9); run `piw run-1` instead",
        ),
    ] {
        let output = std::process::Command::new(piw())
            .envs(server.env())
            .env("PATH", &path)
            .env_remove("PI_WORKFLOWS_RUN_ID")
            .env_remove("HERDR_PANE_ID")
            .envs(env.iter().copied())
            .arg("--herdr-pane")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(!output.status.success(), "{env:?}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("piw: ") && stderr.contains(says),
            "{env:?}: {stderr}"
        );
    }
    let renames: Vec<Value> = herdr_calls(&bin)
        .into_iter()
        .filter(|call| call["argv"][0] == "pane")
        .collect();
    assert_eq!(
        renames.len(),
        1,
        "only the pane that exists was tried: {renames:?}"
    );
}
