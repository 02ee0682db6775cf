//! placeholder
pub mod generated;
