//! Presentation: live subscriptions and the reads clients page through.

pub mod hub;
pub mod reads;
