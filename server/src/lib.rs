//! The pi-workflows server and its command-line client: a thin I/O shell
//! around the kernel.
//!
//! Architecture invariants:
//! - Every handler loads facts, calls the kernel, writes and commits in one
//!   short transaction, and only then replies or acts. The shell never
//!   decides what the kernel decides.
//! - This is the only process that opens the live SQLite database.
//! - No token, token hash, prompt, output, session id or path appears in
//!   status output, logs or errors shown to clients.
// The server is being assembled module by module; this allowance goes away
// when `server run` wires every module.
#![allow(dead_code)]

pub mod clock;
pub mod config;
pub mod fault;
pub mod home;
pub mod ids;
pub mod process;
pub mod store;
