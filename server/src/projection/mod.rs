//! Pure projections of committed facts into wire documents.

pub mod decision;
pub mod run_view;
pub mod why;
