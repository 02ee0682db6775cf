//! The pi-workflows server: a thin I/O shell around the kernel. (The command
//! line is the `pi-workflows-cli` crate; the Rust client is
//! `pi-workflows-client`.)
//!
//! Architecture invariants:
//! - Every handler loads facts, calls the kernel, writes and commits in one
//!   short transaction, and only then replies or acts: `shell::apply` for
//!   wakes, recovery, admission, runner exits and shutdown, `shell::write_step`
//!   inside the receipt jobs of client commands and runner messages. The
//!   shell never decides what the kernel decides (a wait is the kernel's
//!   `Step::Defer`, never a rejection the shell turns into a wake).
//! - This is the only process that opens the live SQLite database.
//! - No token, token hash, prompt, output, session id or path appears in
//!   status output, logs or errors shown to clients.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub mod app;
pub mod attempt_follow_up;
pub mod channel_config;
pub mod channels;
pub mod children;
pub mod client_api;
pub mod clock;
pub mod config;
pub mod context;
pub mod continuation;
pub mod controller_api;
pub mod controller_discovery;
pub mod discovery;
pub mod fault;
pub mod home;
pub mod ids;
pub mod log;
pub mod presentation;
pub mod process;
pub mod projection;
pub mod runner_api;
pub mod runner_logs;
pub mod serve;
pub mod shell;
#[cfg(test)]
mod simulation;
pub mod store;
pub mod terminal_messages;
pub mod time;
pub mod turn_clocks;
pub mod wire;
