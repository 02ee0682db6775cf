//! `piw`: the pi-workflows terminal viewer and controller, and `piw serve`,
//! its loopback WebSocket relay.
//!
//! piw shows exactly the server's documents (client.v1 and run-view.v1
//! from the `protocol` crate): every status, activity, allowed control and
//! reason on screen is the server's `display` object as given. It never
//! opens the server's database (the crate graph has no SQLite at all).
//!
//! Map: [`source`] is the one data boundary (events in, commands out);
//! [`layout`] places the graph; [`app`] is the state machine of the
//! screens, fed by source events and input ([`resources`] holds the
//! resources screen's reads); [`ui`] draws it; [`terminal`]
//! runs it on a real terminal; [`relay`] is `piw serve`; [`herdr`] is the
//! Herdr plugin pane's start (`piw --herdr-pane`).

pub mod app;
pub mod connect;
pub mod eta;
pub mod herdr;
pub mod layout;
pub mod live;
pub mod model;
pub mod relay;
pub mod resources;
pub mod source;
pub mod terminal;
pub mod theme;
pub mod ui;
