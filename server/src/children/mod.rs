//! Supervised child processes: run-mode runners, resolve-mode and
//! validate-mode children, and the admission that gives them slots.

pub mod admission;
pub mod controller;
pub mod controller_resolve;
pub mod resolver;
pub mod supervisor;
pub mod validator;
