//! Time: the wake heap, lease renewal, startup recovery and the automatic
//! state-retention sweep.

pub mod recovery;
pub mod sweep;
pub mod wakes;
