//! Runs the app on a real terminal (crossterm): raw mode, the alternate
//! screen and mouse capture for the app's lifetime, restored on every way
//! out (quit, error, panic).
//!
//! Invariants:
//! - The loop hands the app's commands to the source, applies the
//!   source's events, advances the clock, and redraws only when something
//!   changed (an event, a key, the mouse, a resize, or a clock second).
//! - A resize at any moment is one more redraw at the new size (ratatui
//!   resizes its buffers on draw).
//! - The terminal is restored exactly once ([`Restore`]'s drop, and the
//!   panic hook for a panic on this thread), also when piw is asked to end
//!   by a signal: SIGTERM, SIGHUP, SIGINT and SIGQUIT only raise a flag
//!   that the loop reads between input waits; it returns
//!   [`Ended::Signal`], and the caller ends the process with that signal's
//!   default action after the terminal was restored.
//! - piw never outlives its terminal: a watchdog thread ends the process
//!   (restoring what it can, with the signal's default action) when the
//!   loop has not ended [`SIGNAL_GRACE`] after an ending signal, or when
//!   the terminal hung up. The loop alone cannot: crossterm's input read
//!   retries a hung-up tty forever, inside `event::poll`, whatever its
//!   timeout, so a piw whose terminal window closed would spin.

use std::io::{self, Stdout};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{
    self, DisableMouseCapture, EnableMouseCapture, Event, KeyEventKind,
};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};

use crate::app::App;
use crate::source::Source;

/// How long one wait for input lasts (the source is read between waits).
const INPUT_WAIT: Duration = Duration::from_millis(25);
/// How often the clock redraws without any event (ages, ETA, notices).
const CLOCK: Duration = Duration::from_millis(500);
/// How long the loop has to end after an ending signal before the
/// watchdog ends the process.
const SIGNAL_GRACE: Duration = Duration::from_millis(750);
/// How often the watchdog looks at the signal flag and the terminal.
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// The wall clock in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// Restores the terminal when dropped.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        restore();
    }
}

fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(io::stdout(), DisableMouseCapture, LeaveAlternateScreen);
    let _ = execute!(io::stdout(), ratatui::crossterm::cursor::Show);
}

/// The signals that end piw with a restored terminal.
const ENDING_SIGNALS: [i32; 4] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGQUIT,
];

/// How the loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The user quit.
    Quit,
    /// This signal asked piw to end (see [`end_by`]).
    Signal(i32),
}

/// Ends the process the way `signal` does by default (after the terminal
/// was restored), so that a shell sees 128 + the signal.
pub fn end_by(signal: i32) -> ! {
    let _ = signal_hook::low_level::emulate_default_handler(signal);
    std::process::exit(128 + signal)
}

/// Whether the terminal on standard input hung up (or is no longer open).
fn terminal_gone() -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let stdin = io::stdin();
    let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::empty())];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0].revents().is_some_and(|events| {
            events.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL)
        }),
        Err(_) => false,
    }
}

/// Starts the watchdog (see the module invariants): it ends the process
/// when the loop is stuck after an ending signal, or the terminal hung up.
fn watch(signalled: Arc<AtomicUsize>) -> io::Result<()> {
    std::thread::Builder::new()
        .name("piw-watchdog".into())
        .spawn(move || {
            let mut since: Option<(i32, Instant)> = None;
            loop {
                std::thread::sleep(WATCH_EVERY);
                let signal = match signalled.load(Ordering::SeqCst) {
                    0 if terminal_gone() => signal_hook::consts::SIGHUP,
                    0 => continue,
                    signal => signal as i32,
                };
                let (signal, at) = *since.get_or_insert((signal, Instant::now()));
                if at.elapsed() >= SIGNAL_GRACE {
                    restore();
                    end_by(signal);
                }
            }
        })
        .map(drop)
}

/// Runs `app` with `source` until the user quits or an ending signal comes.
pub fn run(mut app: App, source: &mut dyn Source) -> io::Result<Ended> {
    let signalled = Arc::new(AtomicUsize::new(0));
    for signal in ENDING_SIGNALS {
        // Each handler stores its signal number (non-zero).
        signal_hook::flag::register_usize(signal, Arc::clone(&signalled), signal as usize)?;
    }
    watch(Arc::clone(&signalled))?;
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        previous(info);
    }));
    enable_raw_mode()?;
    let _restore = Restore;
    execute!(io::stdout(), EnterAlternateScreen, EnableMouseCapture)?;
    let mut terminal: Terminal<CrosstermBackend<Stdout>> =
        Terminal::new(CrosstermBackend::new(io::stdout()))?;
    terminal.clear()?;
    let mut dirty = true;
    let mut last_clock = Instant::now();
    loop {
        for command in app.take_commands() {
            source.send(command);
        }
        while let Some(event) = source.try_next() {
            app.apply(event);
            dirty = true;
        }
        if last_clock.elapsed() >= CLOCK || app.replay.playing {
            last_clock = Instant::now();
            dirty = true;
        }
        app.tick(now_ms());
        if app.quit {
            return Ok(Ended::Quit);
        }
        match signalled.load(Ordering::SeqCst) {
            0 => {}
            signal => return Ok(Ended::Signal(signal as i32)),
        }
        if dirty {
            terminal.draw(|frame| crate::ui::draw(frame, &mut app))?;
            dirty = false;
            // Drawing may ask for content or pages (a tab came into view).
            continue;
        }
        if event::poll(INPUT_WAIT)? {
            match event::read()? {
                Event::Key(key) if key.kind != KeyEventKind::Release => app.key(key),
                Event::Mouse(mouse) => app.mouse(mouse),
                Event::Resize(_, _) => terminal.autoresize()?,
                Event::Key(_) | Event::FocusGained | Event::FocusLost | Event::Paste(_) => {
                    continue;
                }
            }
            dirty = true;
        }
    }
}
