//! The pi-workflows kernel: every durable decision of the workflow server as a
//! pure, deterministic transition.
//!
//! Architecture invariants:
//! - The kernel never performs I/O, never reads a clock and never draws
//!   randomness. Time (`now_ms`), ids and token hashes are arguments.
//! - A transition takes the current durable facts, an input and `now_ms`, and
//!   returns either a [`output::Transition`] (the new facts plus the outputs
//!   the shell performs after committing) or a closed, typed rejection.
//!   Nothing changes on a rejection.
//! - The server, the model checker and the tests call these same functions;
//!   a rule is written once here and nowhere else.
//! - Panics are reserved for broken invariants; rejections are values.
#![no_std]

extern crate alloc;

pub mod attempt;
pub mod claim;
pub mod decision;
pub mod display;
pub mod effect;
pub mod epoch;
pub mod execution;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod ids;
pub mod interaction;
pub mod message;
pub mod output;
pub mod receipt;
pub mod retention;
pub mod routing;
pub mod run;
pub mod runner;
pub mod scheduler;
pub mod session;
pub mod topology;
pub mod updates;
