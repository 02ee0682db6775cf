//! The version-12 DDL of `pi-workflows-state` (see `schema.sql`).
//!
//! Invariant: the digest of this text is the schema identity; editing it is an
//! in-place alpha schema change that makes older databases incompatible.

/// The complete DDL, executed once when a new database is created.
pub(crate) const DDL: &str = include_str!("schema.sql");

/// The schema version this binary writes and accepts (with the DDL digest).
pub(crate) const VERSION: i64 = 12;
