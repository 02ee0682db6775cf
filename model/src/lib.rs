//! Stateright models that drive the kernel's own transition functions.
//!
//! Each model's `next_state` calls the kernel (`kernel::claim`, `epoch`, `run`,
//! `effect`, `receipt`, `decision`, `execution`, `runner`, `scheduler`,
//! `session`, `interaction`); the model adds only the environment:
//! which actor acts, crashes that drop process memory but keep committed
//! facts, clock advances past expiry, lost, duplicated and reordered
//! deliveries, and retries with new request ids. Oracles judge each
//! transition from its pre-state; they never replace a kernel rule.
//!
//! Every model also runs with planted bugs ([`suite::mutations`]): wrappers in
//! this crate that drop exactly one kernel check. Each `always` property has a
//! mutation that the checker must catch, so no property is vacuous.
//!
//! The models: claims and fencing, effects, command receipts, human
//! decisions, the run lifecycle and its liveness, runner supervision with
//! real dispatch and routing (`supervision`), and workflow messages and
//! turns with two Pi processes per origin session (`messages`); see
//! `README.md`.

pub mod claims;
pub mod commands;
pub mod decisions;
pub mod effects;
pub mod harness;
pub mod lifecycle;
pub mod messages;
pub mod suite;
pub mod supervision;
pub mod world;
