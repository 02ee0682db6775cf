//! Time: the wake heap, lease renewal and startup recovery.

pub mod recovery;
pub mod wakes;
