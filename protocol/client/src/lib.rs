//! `pi-workflows-client`: the Rust client of the pi-workflows server, the
//! twin of the TypeScript `WorkflowClient` (docs/CLIENT.md, "Rust"). The
//! CLI, `piw` and the server's black-box tests use it.
//!
//! - [`WorkflowClient`]: one persistent connection, typed operations
//!   (`call::<ops::RunPause>(…)` returns the typed receipt), idempotency
//!   keys, retries after a dropped connection that adopt the stored
//!   receipt, subscriptions restored from their last revision, verified
//!   content and complete views, on-demand server start;
//! - [`Connection`]: one connection at the level of frames (no retries);
//! - [`LiveView`]: the live run-view fold (snapshot + patches);
//! - [`home`]: where the socket is (`PI_WORKFLOWS_HOME`), in one place;
//! - [`start`]: `pi-workflows server run --ready-line`, detached and bounded.
//!
//! Architecture invariant: this crate depends on `protocol` and never on
//! `server`, `kernel` or `rusqlite`, so nothing built on it can open the
//! state database (`server/tests/crate_graph.rs` checks the crate graph).

pub mod client;
pub mod connection;
pub mod error;
pub mod home;
pub mod ids;
pub mod live;
pub mod start;

pub use client::{
    Accepted, CallOptions, ClientOptions, Delivery, Settled, SubscriptionHandle, WorkflowClient,
};
pub use connection::{
    COMPLETE_VIEW_ATTEMPTS, Connection, MAX_PAGE_BYTES, PACKAGE_VERSION, RequestSpec, Response,
};
pub use error::{ClientError, Waited};
pub use home::Home;
pub use live::{LiveError, LiveView};
pub use protocol::content::ContentFailure;
pub use protocol::{ClientOperation, ops};
pub use start::StartCommand;
