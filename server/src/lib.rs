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
pub mod clock;
pub mod config;
pub mod coordinator;
pub mod discovery;
pub mod effects;
pub mod fault;
pub mod handlers;
pub mod home;
pub mod ids;
pub mod interactions;
pub mod log;
pub mod process;
pub mod reads;
pub mod recovery;
pub mod resolver;
pub mod runner_channel;
pub mod runner_logs;
pub mod scheduler;
pub mod serve;
pub mod shell;
pub mod socket;
pub mod status;
pub mod store;
pub mod submissions;
pub mod supervisor;
pub mod timers;
pub mod transfer;
pub mod updates;
pub mod validator;
pub mod view;
pub mod views;
pub mod wire;
