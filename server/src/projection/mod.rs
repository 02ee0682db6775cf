//! Pure projections of committed facts into wire documents.

pub mod run_view;
