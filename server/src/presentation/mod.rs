//! Presentation: live subscriptions to run views, the run list and
//! origin-session views (`hub`), and the bounded reads clients page
//! through (`reads`). Reads committed presentation rows only; decides
//! nothing and writes nothing but the terminal-session clear.
//!
//! It takes the narrow [`Presentation`] context (the store and the
//! subscription hub), never the server context.

pub mod hub;
pub mod reads;

use crate::store::Store;

/// What presentation reads need: the store and the shared patch cache.
#[derive(Debug)]
pub struct Presentation {
    pub store: Store,
    pub hub: hub::Hub,
}
